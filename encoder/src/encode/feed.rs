//! Feeding the backend one window ([`Encoder::encode_window`]), chunks begun ahead of results.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;

use super::gather::ChunkTokens;
use super::pipeline::{OutputTx, OUTPUT_STOPPED};
use super::Encoder;
use crate::backend::{KeptRows, PendingBackbone, PendingHead, SequenceBatch};
use crate::error::{EncodeError, Result};
use crate::model::Modality;

impl Encoder {
    /// Encode one window (`win`: its pixels, all with data, and the slot a
    /// backend that keeps features keeps them in, if it does) from its chunks of
    /// tokens, as the gatherer sends them (`WindowDone` after the last), each
    /// buffer sent back on `spare` once used, pooling into `pooled` (each
    /// at least win.pixels x d; unused where the backend keeps features),
    /// leaving its head begun in `head` (`pixels`: the window's pixels),
    /// and returns the next window's pixels, if the tile has another. The
    /// window before's head, if still in `head`, is taken and handed to
    /// the sink's thread on `out` once this window's second chunk is begun.
    /// `carried` holds this window's first chunk if the window before
    /// began it, and gets the next window's first chunk (placed by
    /// `next_placed` from its number of pixels), begun before this
    /// window's head: a device then computes it while the host takes this
    /// window's last result and asks for the head, instead of idling from
    /// the last backbone to the next window.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn encode_window(
        &self,
        (win, pixels): (Placed, Vec<u32>),
        pooled: &mut [Vec<f32>; 2],
        (recv, spare): (&dyn Fn() -> Result<Gathered>, &SpareTx),
        (carried, head): (&mut Option<InFlight>, &mut Option<HeadInFlight>),
        next_placed: impl Fn(usize) -> Placed,
        out: &OutputTx,
        cancel: &AtomicBool,
        tokens_done: &mut dyn FnMut(usize),
    ) -> Result<Option<Vec<u32>>> {
        let d = self.config.d_model();
        let nw = win.pixels;
        let keeps = win.slot.is_some();
        // One chunk's backbone is begun before the last one's result is
        // taken, so a device finds the next chunk queued when it finishes
        // one (BACKBONES_IN_FLIGHT): the host hands over chunk i + 1 while
        // the device computes chunk i.
        let mut in_flight: Option<InFlight> = carried.take();
        let mut take = |f: InFlight, pooled: &mut [Vec<f32>; 2]| -> Result<()> {
            let n = f.members.len();
            let out = self.backend.backbone_end(f.pending)?;
            let want = if keeps { 0 } else { n * d };
            if out.len() != want {
                return Err(EncodeError::backend(
                    self.backend.name(),
                    format!(
                        "backbone returned {} values for {n} x {d} (want {want}: features {})",
                        out.len(),
                        if keeps { "kept" } else { "handed back" }
                    ),
                ));
            }
            if !keeps {
                let mi = f.modality as usize;
                for (k, &i) in f.members.iter().enumerate() {
                    let i = i as usize;
                    pooled[mi][i * d..(i + 1) * d].copy_from_slice(&out[k * d..(k + 1) * d]);
                }
            }
            tokens_done(n * f.len);
            Ok(())
        };
        let begin = |c: ChunkTokens, win: Placed| -> Result<InFlight> {
            let batch = SequenceBatch {
                n: c.members.len(),
                len: c.len,
                bands: c.modality.bands(),
                values: &c.values,
                doys: &c.doys,
            };
            let pending = if let Some(slot) = win.slot {
                let place = KeptRows {
                    slot,
                    pixels: win.pixels,
                    rows: &c.members,
                };
                self.backend
                    .backbone_begin_kept(c.modality, &batch, &place)?
            } else {
                self.backend.backbone_begin(c.modality, &batch)?
            };
            // Begun, the batch's buffers are free again; the gatherer may
            // have finished: then they just go.
            let _ = spare.send((c.values, c.doys));
            Ok(InFlight {
                pending,
                modality: c.modality,
                members: c.members,
                len: c.len,
            })
        };
        let name = self.backend.name();
        loop {
            if cancel.load(Ordering::Relaxed) {
                return Err(EncodeError::Cancelled);
            }
            let c = match recv()? {
                Gathered::Chunk(c) => c,
                Gathered::WindowDone => break,
                _ => return Err(out_of_order(name, "a window began inside another")),
            };
            if let Some(prev) = in_flight.replace(begin(c, win)?) {
                take(prev, pooled)?;
                // The window before's head was queued behind `prev`; the
                // chunk just begun keeps the device busy while the host
                // takes the head's result and places it.
                if let Some(h) = head.take() {
                    self.finish_head(h, out)?;
                }
            }
        }
        if let Some(h) = head.take() {
            self.finish_head(h, out)?;
        }
        if cancel.load(Ordering::Relaxed) {
            return Err(EncodeError::Cancelled);
        }
        // The next window, if the tile has one (the gatherer sends its
        // pixels, then its chunks, while this window's last is computed).
        let next = match recv()? {
            Gathered::Window(pixels) => Some(pixels),
            Gathered::TileDone => None,
            _ => return Err(out_of_order(name, "a chunk came outside its window")),
        };
        if let Some(pixels) = &next {
            // Every pixel of a window is in one chunk of each modality, so
            // a window starts with a chunk. It fills the other slot: this
            // window's head has yet to read this one.
            let Gathered::Chunk(c) = recv()? else {
                return Err(out_of_order(name, "a window of pixels came with no chunk"));
            };
            *carried = Some(begin(c, next_placed(pixels.len()))?);
        }
        if let Some(last) = in_flight.take() {
            take(last, pooled)?;
        }
        if cancel.load(Ordering::Relaxed) {
            return Err(EncodeError::Cancelled);
        }
        // The head in one call for the whole window, once a window rather
        // than once a chunk; where the backend keeps the features, begun
        // only: its result is taken once the next window's second chunk
        // is queued behind it (or at the tile's end), so a device computes
        // while the host waits for the result and places it.
        let pending = if let Some(slot) = win.slot {
            self.backend.head_kept_begin(slot, nw)?
        } else {
            let (s2, s1) = (&pooled[0][..nw * d], &pooled[1][..nw * d]);
            PendingHead::done(self.backend.head(s2, s1, nw)?)
        };
        *head = Some(HeadInFlight { pixels, pending });
        Ok(next)
    }

    /// Take a begun head's result and hand it to the sink's thread.
    pub(super) fn finish_head(&self, h: HeadInFlight, out: &OutputTx) -> Result<()> {
        let (r, nw) = (self.config.repr_dim, h.pixels.len());
        let values = self.backend.head_end(h.pending)?;
        if values.len() != nw * r {
            return Err(EncodeError::backend(
                self.backend.name(),
                format!("head returned {} values for {nw} x {r}", values.len()),
            ));
        }
        // Refused only once the sink has failed, which then says why.
        out.send((h.pixels, values))
            .map_err(|_| EncodeError::Invalid(OUTPUT_STOPPED.into()))
    }
}

/// A window's head, begun: its pixels and the result to come.
pub(super) struct HeadInFlight {
    pixels: Vec<u32>,
    pending: PendingHead,
}

/// The encode's own stages handed over out of order: a bug, reported as the
/// backend's error so the job fails rather than writes a wrong tile.
pub(super) fn out_of_order(backend: &str, what: &str) -> EncodeError {
    EncodeError::backend(backend, format!("encode pipeline out of order: {what}"))
}

/// A window as the backend sees it: the slot its features are kept in
/// (where the backend keeps them:
/// [`Backend::kept_windows`](crate::backend::Backend::kept_windows)) and
/// its number of pixels.
#[derive(Debug, Clone, Copy)]
pub(super) struct Placed {
    pub(super) slot: Option<usize>,
    pub(super) pixels: usize,
}

/// What the gatherer sends this thread, in order: per window its pixels,
/// its chunks, then that it is done; after the last window, that the tile
/// is.
pub(super) enum Gathered {
    Window(Vec<u32>),
    Chunk(ChunkTokens),
    WindowDone,
    TileDone,
}

/// Token buffers going back to the gatherer once used.
type SpareTx = Sender<(Vec<f32>, Vec<f32>)>;

/// A chunk whose backbone is begun: what taking its result needs.
pub(super) struct InFlight {
    pending: PendingBackbone,
    modality: Modality,
    /// The chunk's pixels, as positions in their window.
    members: Vec<u32>,
    /// Its sequence length.
    len: usize,
}
