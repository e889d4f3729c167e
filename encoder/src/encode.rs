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
use std::sync::mpsc::Sender;
use std::sync::{Arc, OnceLock};

use crate::backend::{
    self, Backend, BackendChoice, KeptRows, PendingBackbone, PendingHead, SequenceBatch,
};
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::error::{EncodeError, Result};
use crate::model::{Modality, StudentWeights};
use crate::output::{EmbeddingSink, TileEmbedding};
use crate::profile::DeviceProfile;
use crate::sequence::{bin_len, Gatherer};
use crate::source::TileSource;
use crate::tile::TileInputs;
use crate::tile_reader::TileReader;

/// A loaded model bound to one backend and device profile. Load once, encode
/// many tiles; `encode_tile` takes `&self` and may be called from any thread.
pub struct Encoder {
    /// The model's sizes: all the encode loop reads of its weights (the
    /// backend holds what it computes with; see `Encoder::load`).
    config: ModelConfig,
    backend: Box<dyn Backend>,
    profile: DeviceProfile,
    window_pixels: usize,
    /// [`Encoder::load`]'s checkpoint read and backend build.
    load_times: Option<LoadTimes>,
}

/// Where [`Encoder::load`]'s time went, for the start-up line of an encode.
#[derive(Debug, Clone, Copy)]
pub struct LoadTimes {
    /// Reading the checkpoint into the model's weights.
    pub checkpoint: std::time::Duration,
    /// Building the backend: packing or uploading the weights, and on a
    /// GPU its context and kernels.
    pub backend: std::time::Duration,
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
        let started = std::time::Instant::now();
        let weights = StudentWeights::from_owned_checkpoint(Checkpoint::load(ckpt)?)?;
        let checkpoint = started.elapsed();
        let mut enc = Self::from_weights(Arc::new(weights), choice, profile)?;
        enc.load_times = Some(LoadTimes {
            checkpoint,
            backend: started.elapsed() - checkpoint,
        });
        Ok(enc)
    }

    /// How long [`Encoder::load`] took, by part; `None` for an encoder
    /// made otherwise.
    pub fn load_times(&self) -> Option<LoadTimes> {
        self.load_times
    }

    pub fn from_checkpoint(
        ckpt: &Checkpoint,
        choice: BackendChoice,
        profile: DeviceProfile,
    ) -> Result<Self> {
        let weights = Arc::new(StudentWeights::from_checkpoint(ckpt)?);
        Self::from_weights(weights, choice, profile)
    }

    fn from_weights(
        weights: Arc<StudentWeights>,
        choice: BackendChoice,
        profile: DeviceProfile,
    ) -> Result<Self> {
        let config = weights.config;
        // The backend gets the only `Arc` of the weights: those that pack
        // or copy them (cpu, onednn) let the f32 matrices go once built
        // (175 MB for the Large student), the others keep them.
        let backend = backend::create(choice, weights, &profile)?;
        Ok(Encoder {
            config,
            backend,
            profile,
            window_pixels: WINDOW_PIXELS,
            load_times: None,
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
            config: weights.config,
            backend,
            profile,
            window_pixels: WINDOW_PIXELS,
            load_times: None,
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
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
    /// each chunk once the whole tile is counted (which runs ahead of the
    /// encode), in pixels with data (weighted by the tokens they cost), and
    /// at the end; when `cancel` becomes true the call returns
    /// [`EncodeError::Cancelled`] at the next chunk boundary.
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
        let mut emb = TileEmbedding::empty(tile.height(), tile.width(), self.config.repr_dim);
        self.encode_into(tile, &mut emb, progress, cancel)?;
        emb.fill_nodata();
        Ok(emb)
    }

    /// Encode every pixel of `tile` (as [`Encoder::encode_tile`]), handing
    /// each window's embeddings to `sink` as its head is done, on a thread
    /// of their own: an [`OutputWriter`](crate::output::OutputWriter)
    /// writes the files while the encode goes on, and the embedding is
    /// never held whole. Pixels in no window have no data. On an error
    /// (the sink's own included) or a cancel, what the sink was given is
    /// incomplete.
    pub fn encode_into(
        &self,
        tile: &dyn TileSource,
        sink: &mut dyn EmbeddingSink,
        progress: &dyn Fn(usize, usize),
        cancel: &AtomicBool,
    ) -> Result<()> {
        let npix = tile.height() * tile.width();
        let size = (tile.height(), tile.width());
        if let Some((h, w)) = sink.tile_size().filter(|&s| s != size) {
            return Err(EncodeError::Invalid(format!(
                "an output made for a tile of {h} x {w} px given one of {} x {} px",
                size.0, size.1
            )));
        }
        // This encode's own window slots, where the backend keeps features.
        let kept = self.backend.kept_windows()?;
        let window = self.window_pixels.max(self.profile.chunk_pixels);
        let chunk = self.profile.chunk_pixels.max(1);

        // Progress is measured in tokens so long sequences weigh what they
        // cost, against the whole tile's pixels with data and tokens: known
        // once the counter has counted the tile's last range (it runs
        // ahead of everything else, so early on), reported from then on.
        let totals: OnceLock<(usize, usize)> = OnceLock::new();
        let report = |done_tokens: usize| {
            let Some(&(active, total_tokens)) = totals.get() else {
                return;
            };
            let done = if total_tokens == 0 {
                active
            } else {
                (active as u128 * done_tokens.min(total_tokens) as u128 / total_tokens as u128)
                    as usize
            };
            progress(done, active);
        };
        let mut done_tokens = 0usize;

        // Set when this thread leaves the scope (done, or on an error), so
        // the counter and the reader, which may be waiting on work that no
        // one will take, stop at once instead of finishing the tile.
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| -> Result<()> {
            let stop = &stop;
            let _stop_on_exit = StopOnDrop(stop);
            // Each window's embeddings go to the sink on its own thread
            // (at most OUTPUT_AHEAD waiting), so placing or writing them
            // never holds up handing the device its next chunk. The sink's
            // error, if it fails, is the encode's: a send that finds it
            // gone is answered with it below.
            let (out_tx, out_rx) = std::sync::mpsc::sync_channel::<HeadDone>(OUTPUT_AHEAD);
            let sink_thread = s.spawn(move || -> Result<()> {
                for (pixels, values) in out_rx {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    sink.window(&pixels, &values)?;
                }
                Ok(())
            });
            // Four stages, each on its own thread, joined by channels: the
            // counter counts the tile's observations range by range (a
            // small range first), the reader cuts the pixels with data into
            // windows as their counts arrive and reads each (at most
            // READ_AHEAD ahead), the gatherer turns each window into chunks
            // of tokens (at most GATHER_AHEAD ahead), and this thread runs
            // the backend on them. So a device waits neither for the whole
            // tile to be counted before its first chunk (it did: about 30 ms
            // of a 256 x 256 tile on 2 cores) nor for the host to read or
            // gather its next chunk, only to hand it over. A stage stops
            // when the next hangs up (an error or cancel here), on
            // `cancel`, or after sending its own error; the reader and the
            // gatherer say when the tile is done, so a stage that stopped
            // is never taken for the tile's end.
            let (count_tx, count_rx) = std::sync::mpsc::channel();
            let totals = &totals;
            s.spawn(move || {
                let (mut active, mut tokens) = (0usize, 0usize);
                for range in count_ranges(npix, first_window(window, chunk), window) {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let counted = if cancel.load(Ordering::Relaxed) {
                        Err(EncodeError::Cancelled)
                    } else {
                        tile.valid_counts(range.clone(), cancel).and_then(|c| {
                            // A source's short answer would leave pixels out
                            // of every window, silently: refused.
                            if c[0].len() == range.len() && c[1].len() == range.len() {
                                Ok(c)
                            } else {
                                Err(EncodeError::Invalid(format!(
                                    "the tile's source counted {} S2 and {} S1 values for \
                                     the {} pixels {}..{}",
                                    c[0].len(),
                                    c[1].len(),
                                    range.len(),
                                    range.start,
                                    range.end
                                )))
                            }
                        })
                    };
                    if let Ok(c) = &counted {
                        for (&s2, &s1) in c[0].iter().zip(&c[1]) {
                            if s2 > 0 || s1 > 0 {
                                active += 1;
                                tokens += bin_len(s2 as usize) + bin_len(s1 as usize);
                            }
                        }
                    }
                    let failed = counted.is_err();
                    if count_tx
                        .send(counted.map(|c| Some((range.start, c))))
                        .is_err()
                        || failed
                    {
                        return;
                    }
                }
                let _ = totals.set((active, tokens));
                // The tile's end, said: a counter that stopped (a panic)
                // only hangs up.
                let _ = count_tx.send(Ok(None));
            });
            let (win_tx, win_rx) = std::sync::mpsc::sync_channel(READ_AHEAD);
            s.spawn(move || {
                let mut cutter = WindowCutter::new(window, chunk);
                let mut counted_all = false;
                loop {
                    while !counted_all && !cutter.ready() {
                        match count_rx.recv() {
                            Ok(Ok(Some((start, counts)))) => cutter.add(start, &counts),
                            Ok(Ok(None)) => counted_all = true,
                            Ok(Err(e)) => {
                                let _ = win_tx.send(Err(e));
                                return;
                            }
                            Err(_) => return,
                        }
                    }
                    if cancel.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let Some(win) = cutter.take() else {
                        // Every pixel with data is in a window.
                        let _ = win_tx.send(Ok(None));
                        return;
                    };
                    let read = tile.window(&win.pixels).map(|part| Some((win, part)));
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
            s.spawn(move || loop {
                let (win, part) = match win_rx.recv() {
                    Ok(Ok(Some(read))) => read,
                    Ok(Ok(None)) => {
                        let _ = chunk_tx.send(Ok(Gathered::TileDone));
                        return;
                    }
                    Ok(Err(e)) => {
                        let _ = chunk_tx.send(Err(e));
                        return;
                    }
                    Err(_) => return,
                };
                let plans = plan_window(&win.counts, chunk);
                if chunk_tx.send(Ok(Gathered::Window(win.pixels))).is_err() {
                    return;
                }
                for plan in plans {
                    if cancel.load(Ordering::Relaxed) {
                        return;
                    }
                    let spare = spare_rx.try_recv().unwrap_or_default();
                    let tokens = gather_chunk(&part, plan, spare);
                    if chunk_tx.send(Ok(Gathered::Chunk(tokens))).is_err() {
                        return;
                    }
                }
                if chunk_tx.send(Ok(Gathered::WindowDone)).is_err() {
                    return;
                }
            });
            // Pooled features of one window per modality, reused window
            // after window (every pixel of a window is in exactly one chunk
            // of each modality, so nothing stale is ever read); none where
            // the backend keeps them.
            let d = self.config.d_model();
            let wmax = if kept.is_some() { 0 } else { window.min(npix) };
            let mut pooled = [vec![0f32; wmax * d], vec![0f32; wmax * d]];
            // Window number `wi`, of `pixels` pixels, as the backend sees it.
            let placed = |wi: usize, pixels: usize| Placed {
                slot: kept.as_ref().map(|k| k.slot(wi)),
                pixels,
            };
            let recv =
                || -> Result<Gathered> { chunk_rx.recv().map_err(|_| EncodeError::Cancelled)? };
            let encoded = (|| -> Result<()> {
                // The next window's first chunk, begun before this window's
                // head (see `encode_window`).
                let mut carried: Option<InFlight> = None;
                let mut this = match recv()? {
                    Gathered::Window(pixels) => Some(pixels),
                    Gathered::TileDone => None,
                    _ => {
                        return Err(out_of_order(
                            self.backend.name(),
                            "a chunk came before its window",
                        ))
                    }
                };
                // The window before's head, begun and not yet taken.
                let mut head: Option<HeadInFlight> = None;
                let mut wi = 0;
                while let Some(win) = this.take() {
                    this = self.encode_window(
                        (placed(wi, win.len()), win),
                        &mut pooled,
                        (&recv, &spare_tx),
                        (&mut carried, &mut head),
                        |pixels| placed(wi + 1, pixels),
                        &out_tx,
                        cancel,
                        &mut |t| {
                            done_tokens += t;
                            report(done_tokens);
                        },
                    )?;
                    wi += 1;
                }
                if let Some(h) = head.take() {
                    self.finish_head(h, &out_tx)?;
                }
                Ok(())
            })();
            // A failed encode's windows are of no use: the sink (and the
            // reader) stop now rather than write (and read) what is queued.
            if encoded.is_err() {
                stop.store(true, Ordering::Relaxed);
            }
            // The sink has every window once it has emptied the channel.
            drop(out_tx);
            let sunk = sink_thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            // A sink that failed hung up on the encode: its error is why,
            // unless the encode had failed on its own.
            match encoded {
                Err(EncodeError::Invalid(why)) if why == OUTPUT_STOPPED => {
                    sunk.and(Err(EncodeError::Invalid(why)))
                }
                Err(e) => Err(e),
                Ok(()) => sunk,
            }
        })?;
        // Every range was counted (the reader said the tile was done only
        // after the counter's last range), so the totals are known.
        if let Some(&(_, total_tokens)) = totals.get() {
            report(total_tokens);
        }
        Ok(())
    }

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
    fn encode_window(
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
    fn finish_head(&self, h: HeadInFlight, out: &OutputTx) -> Result<()> {
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

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A window's pixels and their embeddings, for the sink.
type HeadDone = (Vec<u32>, Vec<f32>);
type OutputTx = std::sync::mpsc::SyncSender<HeadDone>;

/// A send to the sink's thread found it gone: it failed, and its error is
/// the encode's.
const OUTPUT_STOPPED: &str = "the output stopped";

/// Windows' embeddings waiting for the sink (8 MB each for a 16,384-px
/// window of 128 f32): a slow disk holds the encode back after these.
const OUTPUT_AHEAD: usize = 2;

/// A window's head, begun: its pixels and the result to come.
struct HeadInFlight {
    pixels: Vec<u32>,
    pending: PendingHead,
}

/// The encode's own stages handed over out of order: a bug, reported as the
/// backend's error so the job fails rather than writes a wrong tile.
fn out_of_order(backend: &str, what: &str) -> EncodeError {
    EncodeError::backend(backend, format!("encode pipeline out of order: {what}"))
}

/// Pixels with data in the first window: `max(chunk, window / 4)`, at most
/// `window`; every later window has `window` (the last what is left). A
/// device idles from the start until the first window is read and its
/// first chunk gathered, and the host reads each later window while the
/// device computes the one before: so the first is small, and still takes
/// the device about as long as reading a whole window takes the host (on
/// the H200 a quarter window at 75,000 px/s is 55 ms). Windows regroup
/// pixels into chunks, so the bits may differ from other windows within
/// the tolerance `windowing_does_not_change_the_output` checks; they do not
/// depend on how the tile was counted.
fn first_window(window: usize, chunk: usize) -> usize {
    let window = window.max(1);
    chunk.max(window / 4).clamp(1, window)
}

/// The ranges of a tile's `npix` pixels the counter counts, in raster
/// order: `first` pixels (the first window's, if every one has data), then
/// ranges twice as long each time up to four windows (counted on several
/// threads where the source can), so the first window waits only for its
/// own count and the counter soon runs far ahead of the reader.
fn count_ranges(
    npix: usize,
    first: usize,
    window: usize,
) -> impl Iterator<Item = std::ops::Range<usize>> {
    let most = (4 * window).max(first).max(1);
    let mut len = first.clamp(1, most);
    let mut start = 0;
    std::iter::from_fn(move || {
        (start < npix).then(|| {
            let range = start..npix.min(start + len);
            start = range.end;
            len = (2 * len).min(most);
            range
        })
    })
}

/// Cuts a tile's pixels with data into windows (see [`first_window`]) as
/// the counts of its ranges arrive in raster order: the same windows
/// whatever the ranges.
struct WindowCutter {
    first: usize,
    window: usize,
    /// Windows taken so far.
    taken: usize,
    /// Pixels with data counted and not yet in a window, ascending, and
    /// their S2 and S1 counts.
    pixels: Vec<u32>,
    counts: [Vec<u16>; 2],
}

/// A window's pixels (ascending, raster order) and their counts.
struct CutWindow {
    pixels: Vec<u32>,
    counts: [Vec<u16>; 2],
}

impl WindowCutter {
    fn new(window: usize, chunk: usize) -> Self {
        WindowCutter {
            first: first_window(window, chunk),
            window: window.max(1),
            taken: 0,
            pixels: Vec::new(),
            counts: [Vec::new(), Vec::new()],
        }
    }

    /// Pixels with data the next window takes, if the tile has them.
    fn want(&self) -> usize {
        if self.taken == 0 {
            self.first
        } else {
            self.window
        }
    }

    /// Whether the next window is whole (more counts may still add to it
    /// until it is).
    fn ready(&self) -> bool {
        self.pixels.len() >= self.want()
    }

    /// The counts of pixels `start..start + counts[0].len()`: those with
    /// data join the queue.
    fn add(&mut self, start: usize, counts: &[Vec<u16>; 2]) {
        for (k, (&s2, &s1)) in counts[0].iter().zip(&counts[1]).enumerate() {
            if s2 > 0 || s1 > 0 {
                self.pixels.push((start + k) as u32);
                self.counts[0].push(s2);
                self.counts[1].push(s1);
            }
        }
    }

    /// The next window (whole, or the rest once the tile is counted);
    /// `None` once every pixel with data is in one.
    fn take(&mut self) -> Option<CutWindow> {
        if self.pixels.is_empty() {
            return None;
        }
        let n = self.want().min(self.pixels.len());
        self.taken += 1;
        let pixels = split_front(&mut self.pixels, n);
        let counts = [
            split_front(&mut self.counts[0], n),
            split_front(&mut self.counts[1], n),
        ];
        Some(CutWindow { pixels, counts })
    }
}

/// The first `n` elements of `v`, taken out of it.
fn split_front<T>(v: &mut Vec<T>, n: usize) -> Vec<T> {
    let rest = v.split_off(n);
    std::mem::replace(v, rest)
}

/// A window as the backend sees it: the slot its features are kept in
/// (where the backend keeps them: [`Backend::kept_windows`]) and its
/// number of pixels.
#[derive(Debug, Clone, Copy)]
struct Placed {
    slot: Option<usize>,
    pixels: usize,
}

/// What the gatherer sends this thread, in order: per window its pixels,
/// its chunks, then that it is done; after the last window, that the tile
/// is.
enum Gathered {
    Window(Vec<u32>),
    Chunk(ChunkTokens),
    WindowDone,
    TileDone,
}

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

/// The chunks of a window whose pixels have `counts` (S2, S1; one per
/// pixel, in window order): per modality (S2, then S1), its pixels grouped
/// by sequence length, each group cut into chunks of `chunk`.
fn plan_window(counts: &[Vec<u16>; 2], chunk: usize) -> Vec<ChunkPlan> {
    let mut plans = Vec::new();
    for (mi, m) in [Modality::S2, Modality::S1].into_iter().enumerate() {
        let mut by_len: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
        for (i, &c) in counts[mi].iter().enumerate() {
            by_len
                .entry(bin_len(c as usize))
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
        let counts = tile
            .valid_counts(0..tile.pixels(), &AtomicBool::new(false))
            .unwrap();
        let mut chunks = 0;
        for plan in plan_window(&counts, 1 << 20) {
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

    /// Counts of `n` pixels where about one in `gap` has no data (and
    /// the others a few observations of one modality or both).
    fn counts_with_gaps(n: usize, gap: usize, seed: u64) -> [Vec<u16>; 2] {
        let mut x = seed | 1;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut s2, mut s1) = (vec![0u16; n], vec![0u16; n]);
        for (a, b) in s2.iter_mut().zip(&mut s1) {
            let r = next();
            if gap == 0 || r % gap as u64 != 0 {
                *a = (r >> 8) as u16 % 40;
                *b = (r >> 24) as u16 % 30 + u16::from(*a == 0);
            }
        }
        [s2, s1]
    }

    /// The windows the cutter makes from counts arriving in `ranges`.
    fn cut(
        counts: &[Vec<u16>; 2],
        ranges: &[std::ops::Range<usize>],
        window: usize,
        chunk: usize,
    ) -> Vec<Vec<u32>> {
        let mut cutter = WindowCutter::new(window, chunk);
        let mut windows = Vec::new();
        for r in ranges {
            cutter.add(
                r.start,
                &[counts[0][r.clone()].to_vec(), counts[1][r.clone()].to_vec()],
            );
            while cutter.ready() {
                let w = cutter.take().unwrap();
                // Each window's counts are its own pixels'.
                for (k, &p) in w.pixels.iter().enumerate() {
                    assert_eq!(w.counts[0][k], counts[0][p as usize]);
                    assert_eq!(w.counts[1][k], counts[1][p as usize]);
                }
                windows.push(w.pixels);
            }
        }
        while let Some(w) = cutter.take() {
            windows.push(w.pixels);
        }
        windows
    }

    /// Whatever ranges the tile is counted in, the windows are the pixels
    /// with data in raster order, cut after `first_window` and then every
    /// `window` pixels: so how an encode counts never changes its output.
    #[test]
    fn windows_are_the_same_whatever_ranges_the_tile_is_counted_in() {
        for (n, gap, window, chunk) in [
            (0, 0, 16384, 1024),
            (5, 0, 16384, 1024),
            (65536, 0, 16384, 1024),
            (65537, 3, 16384, 4096),
            (100, 2, 13, 8),
            (40, 1, 16384, 16384),
            (9, 0, 1, 1),
            (3000, 5, 64, 16),
        ] {
            let counts = counts_with_gaps(n, gap, n as u64 + 7);
            let active: Vec<u32> = (0..n as u32)
                .filter(|&p| counts[0][p as usize] > 0 || counts[1][p as usize] > 0)
                .collect();
            let first = first_window(window, chunk);
            let mut want = Vec::new();
            let mut at = 0;
            while at < active.len() {
                let len = if at == 0 { first } else { window };
                let end = active.len().min(at + len);
                want.push(active[at..end].to_vec());
                at = end;
            }
            let whole: Vec<_> = std::iter::once(0..n).filter(|r| !r.is_empty()).collect();
            let singles: Vec<_> = (0..n).map(|p| p..p + 1).collect();
            let odd: Vec<_> = (0..n).step_by(37).map(|a| a..n.min(a + 37)).collect();
            for (how, ranges) in [
                (
                    "as the encoder counts",
                    count_ranges(n, first, window).collect::<Vec<_>>(),
                ),
                ("whole", whole),
                ("a pixel at a time", singles),
                ("37 at a time", odd),
            ] {
                assert_eq!(
                    cut(&counts, &ranges, window, chunk),
                    want,
                    "({n}, {window}, {chunk}) {how}"
                );
            }
        }
        // A quarter window first, where the chunk is smaller; then whole windows.
        assert_eq!(first_window(16384, 1024), 4096);
        assert_eq!(first_window(13, 8), 8);
        assert_eq!(first_window(16384, 16384), 16384);
    }

    /// The counter's ranges cover the tile once, in order, the first as
    /// long as the first window, then doubling up to four windows.
    #[test]
    fn count_ranges_cover_the_tile_once_growing_from_the_first_window() {
        for (n, first, window) in [
            (0, 4096, 16384),
            (1, 4096, 16384),
            (65536, 4096, 16384),
            (1_210_000, 4096, 16384),
            (50, 1, 1),
            (10, 0, 0),
        ] {
            let ranges: Vec<_> = count_ranges(n, first, window).collect();
            let mut at = 0;
            for r in &ranges {
                assert_eq!(r.start, at, "({n}, {first}, {window}): {ranges:?}");
                assert!(r.end > r.start && r.len() <= (4 * window).max(first).max(1));
                at = r.end;
            }
            assert_eq!(at, n);
        }
        let r: Vec<_> = count_ranges(1_000_000, 4096, 16384)
            .take(6)
            .map(|r| r.len())
            .collect();
        assert_eq!(r, [4096, 8192, 16384, 32768, 65536, 65536]);
    }

    /// A tile in memory that a test can make awkward: no pixel past the
    /// first `free` is counted until a window has been read (or 20 s have
    /// passed: `waited_out`, the encode waited for more than the first
    /// window's count before reading, which it must not); each range's
    /// count takes `delay`, comes one pixel `short` if asked, and says no
    /// pixel from `data_below` on has data; reading a window sets
    /// `cancel_after_read`; `ranges` counts the ranges asked.
    struct TestSource {
        tile: TileInputs,
        free: usize,
        delay: std::time::Duration,
        short: bool,
        data_below: usize,
        cancel_after_read: Option<&'static AtomicBool>,
        read: std::sync::Mutex<bool>,
        wake: std::sync::Condvar,
        waited_out: AtomicBool,
        ranges: std::sync::atomic::AtomicUsize,
    }

    impl TestSource {
        /// The tile as it is, nothing held back.
        fn new(tile: &TileInputs) -> Self {
            TestSource {
                tile: tile.clone(),
                free: usize::MAX,
                delay: std::time::Duration::ZERO,
                short: false,
                data_below: usize::MAX,
                cancel_after_read: None,
                read: std::sync::Mutex::new(false),
                wake: std::sync::Condvar::new(),
                waited_out: AtomicBool::new(false),
                ranges: Default::default(),
            }
        }
    }

    impl TileSource for TestSource {
        fn height(&self) -> usize {
            self.tile.height
        }
        fn width(&self) -> usize {
            self.tile.width
        }
        fn valid_counts(
            &self,
            pixels: std::ops::Range<usize>,
            cancel: &AtomicBool,
        ) -> Result<[Vec<u16>; 2]> {
            self.ranges.fetch_add(1, Ordering::Relaxed);
            if pixels.end > self.free {
                let read = self.read.lock().unwrap();
                let (read, timeout) = self
                    .wake
                    .wait_timeout_while(read, std::time::Duration::from_secs(20), |r| !*r)
                    .unwrap();
                if timeout.timed_out() && !*read {
                    self.waited_out.store(true, Ordering::Relaxed);
                }
            }
            std::thread::sleep(self.delay);
            let start = pixels.start;
            let mut c = self.tile.valid_counts(pixels, cancel)?;
            for m in &mut c {
                for (k, v) in m.iter_mut().enumerate() {
                    if start + k >= self.data_below {
                        *v = 0;
                    }
                }
            }
            if self.short {
                c[0].pop();
                c[1].pop();
            }
            Ok(c)
        }
        fn window(&self, pixels: &[u32]) -> Result<TileInputs> {
            *self.read.lock().unwrap() = true;
            self.wake.notify_all();
            if let Some(c) = self.cancel_after_read {
                c.store(true, Ordering::Relaxed);
            }
            self.tile.window(pixels)
        }
    }

    /// An encode reads (and so can compute) its first window before the
    /// rest of the tile is counted, with the same output bits and a
    /// progress that only rises, to every pixel with data; cancelled once
    /// reading began, it says so rather than return part of a tile.
    #[test]
    fn the_first_window_is_read_before_the_tile_is_counted_whole() {
        use crate::backend::BackendChoice;
        use crate::synth::random_checkpoint;
        let tile = TileInputs::synthetic(&SynthTile {
            height: 30,
            width: 41,
            s2_frames: 12,
            s1_asc_frames: 5,
            s1_desc_frames: 4,
            clear: 0.5,
            seed: 3,
        });
        let mut profile = DeviceProfile::untuned(BackendChoice::Cpu, "test".into());
        profile.chunk_pixels = 16;
        profile.threads = 1;
        let ckpt = random_checkpoint(&ModelConfig::small(), 2);
        let mut enc = Encoder::from_checkpoint(&ckpt, BackendChoice::Cpu, profile).unwrap();
        enc.set_window_pixels(64);
        let no = AtomicBool::new(false);
        let want = enc.encode_tile(&tile, &|_, _| {}, &no).unwrap();

        // The first window's pixels all have data here, so it needs only
        // the first range's count.
        let first = first_window(64, 16);
        assert!(want.nodata[..first].iter().all(|&n| !n));
        let held = TestSource {
            free: first,
            ..TestSource::new(&tile)
        };
        let seen = std::sync::Mutex::new(Vec::new());
        let got = enc
            .encode(
                &held,
                &|done, total| seen.lock().unwrap().push((done, total)),
                &no,
            )
            .unwrap();
        assert!(
            !held.waited_out.load(Ordering::Relaxed),
            "the whole tile was counted before the first window was read"
        );
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got.values), bits(&want.values));
        assert_eq!(got.nodata, want.nodata);
        let active = want.nodata.iter().filter(|&&n| !n).count();
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.last(), Some(&(active, active)), "{seen:?}");
        assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "{seen:?}");
        assert!(seen.iter().all(|&(d, t)| t == active && d <= t), "{seen:?}");

        static CANCEL: AtomicBool = AtomicBool::new(false);
        let held = TestSource {
            free: first,
            cancel_after_read: Some(&CANCEL),
            ..TestSource::new(&tile)
        };
        let err = enc.encode(&held, &|_, _| {}, &CANCEL).unwrap_err();
        assert!(matches!(err, EncodeError::Cancelled), "{err}");
    }

    /// Written as its windows are encoded, a tile's files hold the same
    /// bytes as the tile encoded into memory and written after, pixels
    /// without data included; a sink that fails stops the encode with its
    /// own error, and its files are not left behind.
    #[test]
    fn an_output_written_as_encoded_is_the_output_written_after() {
        use crate::backend::BackendChoice;
        use crate::output::{OutputOptions, OutputWriter};
        use crate::synth::random_checkpoint;
        let tile = TileInputs::synthetic(&SynthTile {
            height: 23,
            width: 19,
            s2_frames: 9,
            s1_asc_frames: 4,
            s1_desc_frames: 3,
            clear: 0.12,
            seed: 8,
        });
        let mut profile = DeviceProfile::untuned(BackendChoice::Cpu, "test".into());
        profile.chunk_pixels = 16;
        profile.threads = 1;
        let ckpt = random_checkpoint(&ModelConfig::small(), 4);
        let mut enc = Encoder::from_checkpoint(&ckpt, BackendChoice::Cpu, profile).unwrap();
        enc.set_window_pixels(48);
        let no = AtomicBool::new(false);
        let emb = enc.encode_tile(&tile, &|_, _| {}, &no).unwrap();
        let with_data = emb.nodata.iter().filter(|&&n| !n).count();
        // Several windows, with pixels without data between them.
        assert!(with_data > 3 * 48, "{with_data}");
        assert!(with_data < emb.nodata.len() - 20, "{with_data}");
        let r = enc.config().repr_dim;
        for opts in [
            OutputOptions {
                int8: false,
                dim: r,
            },
            OutputOptions {
                int8: true,
                dim: 64,
            },
        ] {
            let after = tempfile::tempdir().unwrap();
            let want = emb.write_outputs(after.path(), "t", opts).unwrap();
            let streamed = tempfile::tempdir().unwrap();
            let mut w = OutputWriter::create(streamed.path(), "t", opts, (23, 19), r).unwrap();
            enc.encode_into(&tile, &mut w, &|_, _| {}, &no).unwrap();
            let got = w.finish().unwrap();
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    std::fs::read(g).unwrap() == std::fs::read(w).unwrap(),
                    "{} differs ({opts:?})",
                    g.display()
                );
            }
        }

        /// Takes `ok` windows, then fails.
        struct Failing {
            ok: usize,
            seen: usize,
        }
        impl EmbeddingSink for Failing {
            fn window(&mut self, _: &[u32], _: &[f32]) -> Result<()> {
                self.seen += 1;
                if self.seen > self.ok {
                    return Err(EncodeError::Invalid("the test's disk is full".into()));
                }
                Ok(())
            }
        }
        let mut sink = Failing { ok: 1, seen: 0 };
        let err = enc
            .encode_into(&tile, &mut sink, &|_, _| {}, &no)
            .unwrap_err();
        assert!(err.to_string().contains("the test's disk is full"), "{err}");
        assert_eq!(sink.seen, 2, "windows went on to the sink after it failed");

        // A writer made for another tile is refused before the encode.
        let dir = tempfile::tempdir().unwrap();
        let opts = OutputOptions {
            int8: false,
            dim: r,
        };
        let mut w = OutputWriter::create(dir.path(), "t", opts, (19, 23), r).unwrap();
        let err = enc.encode_into(&tile, &mut w, &|_, _| {}, &no).unwrap_err();
        assert!(
            err.to_string()
                .contains("an output made for a tile of 19 x 23 px given one of 23 x 19"),
            "{err}"
        );
        drop(w);

        // A writer whose encode fails leaves nothing in its directory.
        let mut w = OutputWriter::create(
            dir.path(),
            "t",
            OutputOptions { int8: true, dim: r },
            (23, 19),
            r,
        )
        .unwrap();
        static CANCEL: AtomicBool = AtomicBool::new(false);
        let held = TestSource {
            cancel_after_read: Some(&CANCEL),
            ..TestSource::new(&tile)
        };
        let err = enc
            .encode_into(&held, &mut w, &|_, _| {}, &CANCEL)
            .unwrap_err();
        assert!(matches!(err, EncodeError::Cancelled), "{err}");
        drop(w);
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
    }

    /// A backend that keeps features and computes nothing, logging what
    /// the encode asks of it, in order: "begin" (a kept backbone), "head"
    /// (a head begun), "taken" (its result taken).
    struct Recorder {
        slots: Arc<crate::backend::SlotPool>,
        log: std::sync::Mutex<Vec<&'static str>>,
        d: usize,
        r: usize,
        /// Every backbone fails.
        fail: bool,
    }

    impl Backend for Recorder {
        fn name(&self) -> &'static str {
            "recorder"
        }
        fn backbone(&self, _: Modality, batch: &SequenceBatch<'_>) -> Result<Vec<f32>> {
            Ok(vec![0.0; batch.n * self.d])
        }
        fn head(&self, _: &[f32], _: &[f32], n: usize) -> Result<Vec<f32>> {
            Ok(vec![0.0; n * self.r])
        }
        fn kept_windows(&self) -> Result<Option<backend::KeptWindows>> {
            Ok(Some(self.slots.lease()))
        }
        fn backbone_begin_kept(
            &self,
            _: Modality,
            batch: &SequenceBatch<'_>,
            place: &KeptRows<'_>,
        ) -> Result<PendingBackbone> {
            place.check(self.name(), batch.n)?;
            if self.fail {
                return Err(EncodeError::backend(self.name(), "failed as asked"));
            }
            self.log.lock().unwrap().push("begin");
            Ok(PendingBackbone::done(Vec::new()))
        }
        fn head_kept_begin(&self, _: usize, n: usize) -> Result<PendingHead> {
            self.log.lock().unwrap().push("head");
            Ok(PendingHead::done(vec![1.0; n * self.r]))
        }
        fn head_end(&self, pending: PendingHead) -> Result<Vec<f32>> {
            self.log.lock().unwrap().push("taken");
            Ok(pending.into_parts().unwrap_or_default())
        }
    }

    /// Where the backend keeps features, a window's head is begun and its
    /// result taken only once the next window's second chunk is queued
    /// behind it (so a device is never idle while the host waits for a
    /// head and places its result), at most one head at a time; every
    /// pixel with data gets its head's values, the others NaN.
    #[test]
    fn a_heads_result_is_taken_after_the_next_windows_chunks_are_queued() {
        use crate::backend::BackendChoice;
        use crate::synth::random_checkpoint;
        let cfg = ModelConfig::small();
        let tile = TileInputs::synthetic(&SynthTile {
            height: 20,
            width: 23,
            s2_frames: 12,
            s1_asc_frames: 5,
            s1_desc_frames: 4,
            clear: 0.5,
            seed: 4,
        });
        let weights =
            Arc::new(StudentWeights::from_checkpoint(&random_checkpoint(&cfg, 1)).unwrap());
        let rec = Arc::new(Recorder {
            slots: Arc::default(),
            log: Default::default(),
            d: cfg.d_model(),
            r: cfg.repr_dim,
            fail: false,
        });
        let mut profile = DeviceProfile::untuned(BackendChoice::Cuda, "test".into());
        profile.chunk_pixels = 16;
        let mut enc = Encoder::with_backend(
            weights,
            Box::new(crate::bench::Shared(rec.clone())),
            profile,
        );
        enc.set_window_pixels(64);
        let emb = enc
            .encode_tile(&tile, &|_, _| {}, &AtomicBool::new(false))
            .unwrap();
        let log = rec.log.lock().unwrap().clone();
        let heads = log.iter().filter(|&&e| e == "head").count();
        // 460 px in windows of 16, then 64: several windows of several chunks.
        assert!(heads >= 5, "{log:?}");
        assert_eq!(
            log.iter().filter(|&&e| e == "taken").count(),
            heads,
            "{log:?}"
        );
        let mut open = false;
        for (i, e) in log.iter().enumerate() {
            match *e {
                "head" => {
                    assert!(!open, "two heads begun at once at {i}: {log:?}");
                    open = true;
                }
                "taken" => {
                    assert!(open, "a result taken with no head begun at {i}: {log:?}");
                    open = false;
                    // Not the tile's last head: the next window's first
                    // chunk (begun before the head) and its second are
                    // queued before the result is taken.
                    if log[i..].contains(&"head") {
                        let since = log[..i].iter().rev().take_while(|&&e| e != "head").count();
                        let begun = log[i - since..i].iter().filter(|&&e| e == "begin").count();
                        assert!(
                            begun >= 1,
                            "a head's result taken with nothing queued behind it, at {i}: {log:?}"
                        );
                        let before = log[..i - since - 1]
                            .iter()
                            .rev()
                            .take_while(|&&e| e == "begin")
                            .count();
                        assert!(
                            before >= 1,
                            "no chunk begun before the head at {i}: {log:?}"
                        );
                    }
                }
                _ => {}
            }
        }
        assert!(!open, "{log:?}");
        for (p, &nd) in emb.nodata.iter().enumerate() {
            let v = &emb.values[p * cfg.repr_dim..(p + 1) * cfg.repr_dim];
            if nd {
                assert!(v.iter().all(|x| x.is_nan()), "pixel {p}");
            } else {
                assert!(v.iter().all(|&x| x == 1.0), "pixel {p}");
            }
        }
        assert!(emb.nodata.iter().any(|&n| !n));
    }

    /// A source that counts a pixel short is refused (its pixels would
    /// otherwise be left out of every window and the tile returned as if
    /// whole); and once the backend fails, the counter stops at its next
    /// range instead of counting the rest of the tile.
    #[test]
    fn short_counts_are_refused_and_a_failed_encode_stops_counting() {
        let cfg = ModelConfig::small();
        let tile = TileInputs::synthetic(&SynthTile {
            height: 30,
            width: 41,
            s2_frames: 12,
            s1_asc_frames: 5,
            s1_desc_frames: 4,
            clear: 0.5,
            seed: 3,
        });
        let encoder = |fail: bool| {
            let weights = Arc::new(
                StudentWeights::from_checkpoint(&crate::synth::random_checkpoint(&cfg, 1)).unwrap(),
            );
            let rec = Recorder {
                slots: Arc::default(),
                log: Default::default(),
                d: cfg.d_model(),
                r: cfg.repr_dim,
                fail,
            };
            let mut profile =
                DeviceProfile::untuned(crate::backend::BackendChoice::Cuda, "test".into());
            profile.chunk_pixels = 16;
            let mut enc = Encoder::with_backend(weights, Box::new(rec), profile);
            // Windows of 16 px: the counter's ranges grow to 64 px, about
            // 20 of them for this tile's 1,230.
            enc.set_window_pixels(16);
            enc
        };
        let source = |delay_ms: u64, short: bool| TestSource {
            delay: std::time::Duration::from_millis(delay_ms),
            short,
            // Data in the first window only: the reader waits for counts
            // to fill a second, which the rest of the tile never does.
            data_below: 16,
            ..TestSource::new(&tile)
        };
        let no = AtomicBool::new(false);
        let all = count_ranges(tile.pixels(), first_window(16, 16), 16).count();
        assert!(all >= 15, "{all}");

        let short = source(0, true);
        let err = encoder(false).encode(&short, &|_, _| {}, &no).unwrap_err();
        assert!(
            matches!(&err, EncodeError::Invalid(m) if m.contains("counted 15 S2 and 15 S1 values for the 16 pixels 0..16")),
            "{err}"
        );

        let slow = source(30, false);
        let err = encoder(true).encode(&slow, &|_, _| {}, &no).unwrap_err();
        assert!(matches!(&err, EncodeError::Backend { .. }), "{err}");
        let counted = slow.ranges.load(Ordering::Relaxed);
        assert!(
            counted <= all / 2,
            "counted {counted} of {all} ranges after the backend failed"
        );
    }
}
