//! Device buffers kept from chunk to chunk by role, so a chunk allocates nothing on the device.

use super::Device;
use crate::error::Result;

/// The f32 device buffers a chunk works in, by role.
#[derive(Debug, Clone, Copy)]
pub(super) enum Slot {
    Values,
    Doys,
    T,
    H,
    Qkv,
    Attn,
    Ff,
    Scores,
    Pooled,
    /// A kept pass's pixels' rows in their window (32-bit ints).
    Rows,
}

const SLOTS: usize = Slot::Rows as usize + 1;

/// The bf16 device buffers of a bf16 chunk, by role.
#[derive(Debug, Clone, Copy)]
pub(super) enum HalfSlot {
    Values,
    T,
    H,
    Qkv,
    Attn,
    Ff,
    Probs,
}

const HALF_SLOTS: usize = HalfSlot::Probs as usize + 1;

/// One window slot's features on the device
/// ([`KeptRows`](crate::backend::KeptRows)): its buffer,
/// the window's size, and how many pixels' S2 and S1 features its chunks
/// have written since the slot's last head (so a head reads only a window
/// whose every pixel has both, and a window's buffer is never replaced
/// once a chunk has written to it).
pub(super) struct KeptWindow<D: Device> {
    pub(super) buf: Option<D::Buf>,
    pub(super) pixels: usize,
    pub(super) filled: [usize; 2],
}

/// Device buffers kept from chunk to chunk, each grown to the largest size
/// asked of it, so a chunk allocates and frees nothing on the device (a
/// free can wait for the GPU, and a fresh buffer had to be zeroed). Every
/// buffer is written before it is read within a chunk, so what an earlier
/// chunk left in it never matters; the emulator fills new buffers with NaN
/// to show it.
///
/// The kept windows' features are the exception: a window's chunks fill
/// its slot's rows and the head reads them, so its buffer must not be
/// replaced within a window. It is grown, if at all, to the window's size
/// on the window's first chunk (every chunk of a window names the same
/// size, [`KeptRows`](crate::backend::KeptRows), which [`KeptWindow`]'s
/// count checks), so it never is.
pub(super) struct Scratch<D: Device> {
    slots: [Option<D::Buf>; SLOTS],
    halves: [Option<D::Half>; HALF_SLOTS],
    windows: Vec<KeptWindow<D>>,
}

impl<D: Device> Scratch<D> {
    pub(super) fn new() -> Self {
        Scratch {
            slots: std::array::from_fn(|_| None),
            halves: std::array::from_fn(|_| None),
            windows: Vec::new(),
        }
    }

    /// Window slot `slot` (the slots an encode leases are numbered from
    /// 0, so this grows by a slot or two).
    pub(super) fn window(&mut self, slot: usize) -> &mut KeptWindow<D> {
        if self.windows.len() <= slot {
            self.windows.resize_with(slot + 1, || KeptWindow {
                buf: None,
                pixels: 0,
                filled: [0, 0],
            });
        }
        &mut self.windows[slot]
    }

    /// The buffer of `slot` if it holds `n` floats, else a new one of `n`.
    pub(super) fn take(&mut self, dev: &D, slot: Slot, n: usize) -> Result<D::Buf> {
        Self::fit(dev, self.slots[slot as usize].take(), n)
    }

    /// `buf` if it holds `n` floats, else a new buffer of `n`.
    pub(super) fn fit(dev: &D, buf: Option<D::Buf>, n: usize) -> Result<D::Buf> {
        match buf {
            Some(b) if D::len(&b) >= n => Ok(b),
            old => {
                // Free the small one first: the new one may need its room
                // (on the device's context, which a free needs current).
                dev.bind()?;
                drop(old);
                dev.alloc(n)
            }
        }
    }

    pub(super) fn give(&mut self, slot: Slot, buf: D::Buf) {
        self.slots[slot as usize] = Some(buf);
    }

    /// [`Scratch::take`] for bf16 buffers.
    pub(super) fn take_half(&mut self, dev: &D, slot: HalfSlot, n: usize) -> Result<D::Half> {
        match self.halves[slot as usize].take() {
            Some(b) if D::half_len(&b) >= n => Ok(b),
            old => {
                dev.bind()?;
                drop(old);
                dev.alloc_half(n)
            }
        }
    }

    pub(super) fn give_half(&mut self, slot: HalfSlot, buf: D::Half) {
        self.halves[slot as usize] = Some(buf);
    }
}
