//! Encoding a tile: group pixels by bin, gather chunks, run the backend,
//! assemble the per-pixel embeddings. Cancellation is checked between chunks.
//!
//! Pixels are taken in windows, each read from the [`TileSource`] on a
//! read-ahead thread at most [`READ_AHEAD`] windows ahead of the backend, so
//! a tile read from its files ([`TileReader`]) never needs memory for its
//! inputs as a whole (issue 16, "Memory").

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use crate::backend::{self, Backend, BackendChoice, KeptRows, PendingBackbone, SequenceBatch};
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::error::{EncodeError, Result};
use crate::model::{Modality, StudentWeights};
use crate::output::TileEmbedding;
use crate::profile::DeviceProfile;
use crate::sequence::{bin_len, Gatherer};
use crate::source::TileSource;
use crate::tile::TileInputs;
use crate::tile_reader::TileReader;

/// A loaded model bound to one backend and device profile. Load once, encode
/// many tiles; `encode_tile` takes `&self` and may be called from any thread.
pub struct Encoder {
    weights: Arc<StudentWeights>,
    backend: Box<dyn Backend>,
    profile: DeviceProfile,
    window_pixels: usize,
}

// The agent shares one Encoder between threads.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Encoder>();
};

/// Pixels with data encoded per window; bounds the pooled features held at
/// once (16384 x 2 x d floats: 84 MB for the Large model) and the inputs
/// read at once (16384 x 2,500 bytes, 41 MB, for 100 S2 and 100 S1 frames).
pub const WINDOW_PIXELS: usize = 16384;

/// Windows read ahead of the one being encoded: enough that reading (page
/// cache or disk) overlaps the compute; each costs one window of inputs.
pub const READ_AHEAD: usize = 2;

impl Encoder {
    /// Load a `.pt` or `.safetensors` checkpoint and build the backend.
    pub fn load(ckpt: &Path, choice: BackendChoice, profile: DeviceProfile) -> Result<Self> {
        Self::from_checkpoint(&Checkpoint::load(ckpt)?, choice, profile)
    }

    pub fn from_checkpoint(
        ckpt: &Checkpoint,
        choice: BackendChoice,
        profile: DeviceProfile,
    ) -> Result<Self> {
        let weights = Arc::new(StudentWeights::from_checkpoint(ckpt)?);
        let backend = backend::create(choice, weights.clone(), &profile)?;
        Ok(Encoder {
            weights,
            backend,
            profile,
            window_pixels: WINDOW_PIXELS,
        })
    }

    /// An encoder over a backend built elsewhere (the tests' emulated GPU,
    /// `bench`'s host-only backend).
    pub(crate) fn with_backend(
        weights: Arc<StudentWeights>,
        backend: Box<dyn Backend>,
        profile: DeviceProfile,
    ) -> Self {
        Encoder {
            weights,
            backend,
            profile,
            window_pixels: WINDOW_PIXELS,
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.weights.config
    }

    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    pub fn profile(&self) -> &DeviceProfile {
        &self.profile
    }

    /// Pixels encoded per window (default [`WINDOW_PIXELS`]); smaller bounds
    /// memory further. Never below one chunk.
    pub fn set_window_pixels(&mut self, n: usize) {
        self.window_pixels = n.max(1);
    }

    /// Encode every pixel of a tile. `progress(done, total)` is called after
    /// each chunk, in pixels with data (weighted by the tokens they cost);
    /// when `cancel` becomes true the call returns [`EncodeError::Cancelled`]
    /// at the next chunk boundary.
    ///
    /// Pixels are taken in windows of [`WINDOW_PIXELS`] (or one chunk, if
    /// larger) so pooled features never need memory for a whole tile; inside
    /// a window each modality is grouped by bin and cut into chunks.
    pub fn encode_tile(
        &self,
        tile: &TileInputs,
        progress: &dyn Fn(usize, usize),
        cancel: &AtomicBool,
    ) -> Result<TileEmbedding> {
        self.encode(tile, progress, cancel)
    }

    /// [`Encoder::encode_tile`] for a tile read from its files a window at a
    /// time: the inputs held at once are (1 + [`READ_AHEAD`]) windows, not
    /// the tile; the output bytes are the same.
    pub fn encode_files(
        &self,
        tile: &TileReader,
        progress: &dyn Fn(usize, usize),
        cancel: &AtomicBool,
    ) -> Result<TileEmbedding> {
        self.encode(tile, progress, cancel)
    }

    /// Encode every pixel of `tile`, whichever the source (see
    /// [`Encoder::encode_tile`]).
    pub fn encode(
        &self,
        tile: &dyn TileSource,
        progress: &dyn Fn(usize, usize),
        cancel: &AtomicBool,
    ) -> Result<TileEmbedding> {
        let npix = tile.height() * tile.width();
        let r = self.weights.config.repr_dim;
        let counts = tile.valid_counts(cancel)?;
        // This encode's own window slots, where the backend keeps features.
        let kept = self.backend.kept_windows()?;
        let nodata: Vec<bool> = (0..npix)
            .map(|p| counts[0][p] == 0 && counts[1][p] == 0)
            .collect();
        let active: Vec<u32> = (0..npix as u32).filter(|&p| !nodata[p as usize]).collect();

        // Progress is measured in tokens so long sequences weigh what they cost.
        let tokens = |p: u32| {
            bin_len(counts[0][p as usize] as usize) + bin_len(counts[1][p as usize] as usize)
        };
        let total_tokens: usize = active.iter().map(|&p| tokens(p)).sum();
        let mut done_tokens = 0usize;
        let report = |done_tokens: usize| {
            let done = if total_tokens == 0 {
                active.len()
            } else {
                (active.len() as u128 * done_tokens as u128 / total_tokens as u128) as usize
            };
            progress(done, active.len());
        };

        let mut values = vec![f32::NAN; npix * r];
        let window = self.window_pixels.max(self.profile.chunk_pixels);
        let chunk = self.profile.chunk_pixels.max(1);
        let bounds = window_bounds(active.len(), window, chunk);
        std::thread::scope(|s| -> Result<()> {
            // Three stages, each on its own thread, joined by bounded
            // channels: the reader reads windows (at most READ_AHEAD
            // ahead), the gatherer turns each into chunks of tokens (at
            // most GATHER_AHEAD ahead), and this thread runs the backend on
            // them. So a device never waits for the host to read or gather
            // its next chunk, only to hand it over. A stage stops when the
            // next hangs up (an error or cancel here), on `cancel`, or after
            // sending its own error.
            let (win_tx, win_rx) = std::sync::mpsc::sync_channel(READ_AHEAD);
            let (bounds, active) = (&bounds, &active);
            let windows = bounds.iter().map(move |&(a, b)| &active[a..b]);
            s.spawn(move || {
                for win in windows {
                    if cancel.load(Ordering::Relaxed) {
                        return;
                    }
                    let read = tile.window(win);
                    let failed = read.is_err();
                    if win_tx.send(read).is_err() || failed {
                        return;
                    }
                }
            });
            let (chunk_tx, chunk_rx) = std::sync::mpsc::sync_channel(GATHER_AHEAD);
            // Token buffers come back once used, so a steady encode
            // allocates none.
            let (spare_tx, spare_rx) = std::sync::mpsc::channel::<(Vec<f32>, Vec<f32>)>();
            let counts = &counts;
            let windows = bounds.iter().map(move |&(a, b)| &active[a..b]);
            s.spawn(move || {
                for win in windows {
                    let part = match win_rx.recv() {
                        Ok(Ok(part)) => part,
                        Ok(Err(e)) => {
                            let _ = chunk_tx.send(Err(e));
                            return;
                        }
                        Err(_) => return,
                    };
                    for plan in plan_window(win, counts, chunk) {
                        if cancel.load(Ordering::Relaxed) {
                            return;
                        }
                        let spare = spare_rx.try_recv().unwrap_or_default();
                        let tokens = gather_chunk(&part, plan, spare);
                        if chunk_tx.send(Ok(Some(tokens))).is_err() {
                            return;
                        }
                    }
                    // The window's last chunk.
                    if chunk_tx.send(Ok(None)).is_err() {
                        return;
                    }
                }
            });
            // Pooled features of one window per modality, reused window
            // after window (every pixel of a window is in exactly one chunk
            // of each modality, so nothing stale is ever read); none where
            // the backend keeps them.
            let d = self.weights.config.d_model();
            let wmax = if kept.is_some() {
                0
            } else {
                window.min(active.len())
            };
            let mut pooled = [vec![0f32; wmax * d], vec![0f32; wmax * d]];
            // Window `wi`, of pixels `a..b` of `active`, as the backend
            // sees it.
            let placed = |wi: usize, (a, b): (usize, usize)| Placed {
                slot: kept.as_ref().map(|k| k.slot(wi)),
                pixels: b - a,
            };
            // The next window's first chunk, begun before this window's
            // head (see `encode_window`).
            let mut carried: Option<InFlight> = None;
            for (wi, &(a, b)) in bounds.iter().enumerate() {
                let win = &active[a..b];
                let out = self.encode_window(
                    placed(wi, (a, b)),
                    &mut pooled,
                    (&chunk_rx, &spare_tx),
                    &mut carried,
                    bounds.get(wi + 1).map(|&next| placed(wi + 1, next)),
                    cancel,
                    &mut |t| {
                        done_tokens += t;
                        report(done_tokens);
                    },
                )?;
                for (i, &p) in win.iter().enumerate() {
                    let p = p as usize;
                    values[p * r..(p + 1) * r].copy_from_slice(&out[i * r..(i + 1) * r]);
                }
            }
            Ok(())
        })?;
        report(total_tokens);
        Ok(TileEmbedding {
            height: tile.height(),
            width: tile.width(),
            dim: r,
            values,
            nodata,
        })
    }

    /// Encode one window (`win`: its pixels, all with data, and the slot a
    /// backend that keeps features keeps them in, if it does) from its chunks of
    /// tokens, as the gatherer sends them (`None` after the last), each
    /// buffer sent back on `spare` once used, pooling into `pooled` (each
    /// at least win.pixels x d; unused where the backend keeps features):
    /// returns (win.pixels, repr_dim). `carried` holds this window's first
    /// chunk if the window before began it, and gets the next window's
    /// first chunk, begun before this window's head when a `next` window
    /// follows: a device then computes it while the host
    /// takes this window's last result and asks for the head, instead of
    /// idling from the last backbone to the next window.
    #[allow(clippy::too_many_arguments)]
    fn encode_window(
        &self,
        win: Placed,
        pooled: &mut [Vec<f32>; 2],
        (chunks, spare): (&ChunkRx, &SpareTx),
        carried: &mut Option<InFlight>,
        next: Option<Placed>,
        cancel: &AtomicBool,
        tokens_done: &mut dyn FnMut(usize),
    ) -> Result<Vec<f32>> {
        let d = self.weights.config.d_model();
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
        // The gatherer only stops early on an error (sent first) or on
        // `cancel`.
        let recv = || chunks.recv().map_err(|_| EncodeError::Cancelled)?;
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
        loop {
            if cancel.load(Ordering::Relaxed) {
                return Err(EncodeError::Cancelled);
            }
            let Some(c) = recv()? else {
                break;
            };
            if let Some(prev) = in_flight.replace(begin(c, win)?) {
                take(prev, pooled)?;
            }
        }
        if let Some(next) = next.filter(|_| !cancel.load(Ordering::Relaxed)) {
            // Every pixel of a window is in one chunk of each modality, so
            // a window after this one starts with a chunk. It fills the
            // other slot: this window's head has yet to read this one.
            let Some(c) = recv()? else {
                return Err(EncodeError::backend(
                    self.backend.name(),
                    "a window of pixels came with no chunk",
                ));
            };
            *carried = Some(begin(c, next)?);
        }
        if let Some(last) = in_flight.take() {
            take(last, pooled)?;
        }
        if cancel.load(Ordering::Relaxed) {
            return Err(EncodeError::Cancelled);
        }
        // The head in one call for the whole window: on a GPU each call is
        // a round trip the device idles through (the result waited for),
        // once a window rather than once a chunk.
        let r = self.weights.config.repr_dim;
        let out = if let Some(slot) = win.slot {
            self.backend.head_kept(slot, nw)?
        } else {
            let (s2, s1) = (&pooled[0][..nw * d], &pooled[1][..nw * d]);
            self.backend.head(s2, s1, nw)?
        };
        if out.len() != nw * r {
            return Err(EncodeError::backend(
                self.backend.name(),
                format!("head returned {} values for {nw} x {r}", out.len()),
            ));
        }
        Ok(out)
    }
}

/// Where the windows of `n` pixels with data begin and end: the first of
/// `max(chunk, window / 4)` pixels (at most `window`), the rest of `window`.
/// A device idles from the start until the first window is read and its
/// first chunk gathered, and the host reads each later window while the
/// device computes the one before: so the first is small, and still
/// takes the device about as long as reading a whole window takes the
/// host (on the H200 a quarter window at 75,000 px/s is 55 ms). Windows
/// regroup pixels into chunks, so the bits may differ from other windows
/// within the tolerance `windowing_does_not_change_the_output` checks.
fn window_bounds(n: usize, window: usize, chunk: usize) -> Vec<(usize, usize)> {
    let window = window.max(1);
    let first = chunk.max(window / 4).clamp(1, window);
    let mut bounds = Vec::with_capacity(n.div_ceil(window) + 1);
    let mut start = 0;
    while start < n {
        let len = if start == 0 { first } else { window };
        let end = n.min(start + len);
        bounds.push((start, end));
        start = end;
    }
    bounds
}

/// A window as the backend sees it: the slot its features are kept in
/// (where the backend keeps them: [`Backend::kept_windows`]) and its
/// number of pixels.
#[derive(Debug, Clone, Copy)]
struct Placed {
    slot: Option<usize>,
    pixels: usize,
}

/// Gathered chunks as the gatherer sends them (`None` after a window's last).
type ChunkRx = Receiver<Result<Option<ChunkTokens>>>;

/// Token buffers going back to the gatherer once used.
type SpareTx = Sender<(Vec<f32>, Vec<f32>)>;

/// A chunk whose backbone is begun: what taking its result needs.
struct InFlight {
    pending: PendingBackbone,
    modality: Modality,
    /// The chunk's pixels, as positions in their window.
    members: Vec<u32>,
    /// Its sequence length.
    len: usize,
}

/// Chunks of tokens the gatherer sends ahead of the backend.
const GATHER_AHEAD: usize = 2;

/// One chunk of a window to gather: pixels (positions in the window) of
/// one modality whose sequences have `len` tokens.
struct ChunkPlan {
    modality: Modality,
    len: usize,
    members: Vec<u32>,
}

/// A gathered chunk: `members`' tokens, (n, len, bands) standardised
/// values and (n, len) days of year.
struct ChunkTokens {
    modality: Modality,
    len: usize,
    members: Vec<u32>,
    values: Vec<f32>,
    doys: Vec<f32>,
}

/// The chunks of the window `win`: per modality (S2, then S1), its pixels
/// grouped by sequence length, each group cut into chunks of `chunk`.
fn plan_window(win: &[u32], counts: &[Vec<u16>; 2], chunk: usize) -> Vec<ChunkPlan> {
    let mut plans = Vec::new();
    for (mi, m) in [Modality::S2, Modality::S1].into_iter().enumerate() {
        let mut by_len: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
        for (i, &p) in win.iter().enumerate() {
            by_len
                .entry(bin_len(counts[mi][p as usize] as usize))
                .or_default()
                .push(i as u32);
        }
        for (len, members) in by_len {
            plans.extend(members.chunks(chunk).map(|part| ChunkPlan {
                modality: m,
                len,
                members: part.to_vec(),
            }));
        }
    }
    plans
}

/// Pixels each gathering thread takes at least: below this a chunk is
/// gathered on one thread (a CPU backend's chunks, tens to hundreds of
/// pixels, always are: its cores are busy computing).
const GATHER_PIXELS_PER_THREAD: usize = 1024;

/// Threads that gather one chunk: enough that a GPU's chunks of thousands
/// of pixels are ready before it wants them (one thread gathered about
/// 65,000 px/s on the 2-core dev VM, below what an H200 should encode),
/// leaving a core each to the reader and the thread feeding the device.
fn gather_threads(pixels: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (pixels / GATHER_PIXELS_PER_THREAD).clamp(1, cores.saturating_sub(2).clamp(1, 8))
}

/// Gather `plan`'s tokens from the window `part` into `spare`'s buffers
/// (resized; their old contents are overwritten), on [`gather_threads`]
/// threads, each filling its own pixels' part of the buffers.
fn gather_chunk(part: &TileInputs, plan: ChunkPlan, spare: (Vec<f32>, Vec<f32>)) -> ChunkTokens {
    let threads = gather_threads(plan.members.len());
    gather_chunk_on(part, plan, spare, threads)
}

/// [`gather_chunk`] on `threads` threads.
fn gather_chunk_on(
    part: &TileInputs,
    plan: ChunkPlan,
    spare: (Vec<f32>, Vec<f32>),
    threads: usize,
) -> ChunkTokens {
    let (mut values, mut doys) = spare;
    let bands = plan.modality.bands();
    let (n, len) = (plan.members.len(), plan.len);
    values.resize(n * len * bands, 0.0);
    doys.resize(n * len, 0.0);
    let gather = |members: &[u32], values: &mut [f32], doys: &mut [f32]| {
        let mut g = Gatherer::new(part, plan.modality);
        let tokens = values
            .chunks_exact_mut(len * bands)
            .zip(doys.chunks_exact_mut(len));
        for (&i, (v, d)) in members.iter().zip(tokens) {
            g.gather(i as usize, len, v, d);
        }
    };
    if threads <= 1 {
        gather(&plan.members, &mut values, &mut doys);
    } else {
        let per = n.div_ceil(threads);
        std::thread::scope(|s| {
            let parts = plan
                .members
                .chunks(per)
                .zip(values.chunks_mut(per * len * bands))
                .zip(doys.chunks_mut(per * len));
            for ((members, v), d) in parts {
                s.spawn(move || gather(members, v, d));
            }
        });
    }
    ChunkTokens {
        modality: plan.modality,
        len,
        members: plan.members,
        values,
        doys,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::SynthTile;

    #[test]
    fn a_chunk_gathered_on_several_threads_is_the_chunk_gathered_on_one() {
        let tile = TileInputs::synthetic(&SynthTile {
            height: 7,
            width: 45,
            s2_frames: 40,
            s1_asc_frames: 12,
            s1_desc_frames: 9,
            clear: 0.6,
            seed: 5,
        });
        let counts = tile.valid_counts(&AtomicBool::new(false)).unwrap();
        let all: Vec<u32> = (0..tile.pixels() as u32).collect();
        let mut chunks = 0;
        for plan in plan_window(&all, &counts, 1 << 20) {
            let copy = |p: &ChunkPlan| ChunkPlan {
                modality: p.modality,
                len: p.len,
                members: p.members.clone(),
            };
            let one = gather_chunk_on(&tile, copy(&plan), Default::default(), 1);
            // Spare buffers with stale contents must not show through.
            let stale = (vec![f32::NAN; 7], vec![1.0; 99999]);
            let three = gather_chunk_on(&tile, copy(&plan), stale, 3);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&one.values),
                bits(&three.values),
                "{:?} len {}",
                plan.modality,
                plan.len
            );
            assert_eq!(bits(&one.doys), bits(&three.doys));
            assert_eq!(
                one.values.len(),
                plan.members.len() * plan.len * plan.modality.bands()
            );
            assert!(one.values.iter().all(|v| v.is_finite()));
            chunks += 1;
        }
        // Both modalities, several bins each.
        assert!(chunks >= 4, "{chunks}");
    }

    #[test]
    fn windows_cover_every_pixel_once_and_the_first_is_short() {
        for (n, window, chunk) in [
            (0, 16384, 1024),
            (5, 16384, 1024),
            (65536, 16384, 1024),
            (65537, 16384, 4096),
            (100, 13, 8),
            (40, 16384, 16384),
            (9, 1, 1),
        ] {
            let b = window_bounds(n, window, chunk);
            let mut next = 0;
            for &(a, e) in &b {
                assert_eq!(a, next, "({n}, {window}, {chunk}): {b:?}");
                assert!(
                    a < e && e - a <= window.max(1),
                    "({n}, {window}, {chunk}): {b:?}"
                );
                next = e;
            }
            assert_eq!(next, n, "({n}, {window}, {chunk}): {b:?}");
        }
        // A quarter window first, where the chunk is smaller; then whole windows.
        let b = window_bounds(65536, 16384, 1024);
        assert_eq!(b[0], (0, 4096));
        assert_eq!(b[1], (4096, 4096 + 16384));
        assert_eq!(window_bounds(100, 13, 8)[0], (0, 8));
    }
}
