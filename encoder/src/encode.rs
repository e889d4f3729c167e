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
use std::sync::Arc;

use crate::backend::{self, Backend, BackendChoice, SequenceBatch};
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

    /// An encoder over a backend built elsewhere (the tests' emulated GPU).
    #[cfg(test)]
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
        std::thread::scope(|s| -> Result<()> {
            // Bounded: the reader blocks once READ_AHEAD windows wait, and
            // stops when this side hangs up (an error) or on `cancel`.
            let (tx, rx) = std::sync::mpsc::sync_channel(READ_AHEAD);
            let windows = active.chunks(window);
            s.spawn(move || {
                for win in windows {
                    if cancel.load(Ordering::Relaxed) {
                        return;
                    }
                    let read = tile.window(win);
                    let failed = read.is_err();
                    if tx.send(read).is_err() || failed {
                        return;
                    }
                }
            });
            for win in active.chunks(window) {
                // The reader only stops early on an error (sent first) or
                // on `cancel`.
                let part = rx.recv().map_err(|_| EncodeError::Cancelled)??;
                let out = self.encode_window(&part, win, &counts, cancel, &mut |t| {
                    done_tokens += t;
                    report(done_tokens);
                })?;
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

    /// Encode the pixels `win` (all with data), read into `part` (pixel `i`
    /// of `part` is pixel `win[i]` of the tile): returns (win.len(), repr_dim).
    fn encode_window(
        &self,
        part: &TileInputs,
        win: &[u32],
        counts: &[Vec<u16>; 2],
        cancel: &AtomicBool,
        tokens_done: &mut dyn FnMut(usize),
    ) -> Result<Vec<f32>> {
        let d = self.weights.config.d_model();
        let nw = win.len();
        let chunk = self.profile.chunk_pixels.max(1);
        let mut pooled = [vec![0f32; nw * d], vec![0f32; nw * d]];
        for (mi, m) in [Modality::S2, Modality::S1].into_iter().enumerate() {
            // Window positions grouped by sequence length.
            let mut by_len: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
            for (i, &p) in win.iter().enumerate() {
                by_len
                    .entry(bin_len(counts[mi][p as usize] as usize))
                    .or_default()
                    .push(i as u32);
            }
            let bands = m.bands();
            let mut gather = Gatherer::new(part, m);
            for (&len, members) in &by_len {
                for part in members.chunks(chunk) {
                    if cancel.load(Ordering::Relaxed) {
                        return Err(EncodeError::Cancelled);
                    }
                    let n = part.len();
                    let mut values = vec![0f32; n * len * bands];
                    let mut doys = vec![0f32; n * len];
                    for (k, &i) in part.iter().enumerate() {
                        gather.gather(
                            i as usize,
                            len,
                            &mut values[k * len * bands..(k + 1) * len * bands],
                            &mut doys[k * len..(k + 1) * len],
                        );
                    }
                    let batch = SequenceBatch {
                        n,
                        len,
                        bands,
                        values: &values,
                        doys: &doys,
                    };
                    let out = self.backend.backbone(m, &batch)?;
                    if out.len() != n * d {
                        return Err(EncodeError::backend(
                            self.backend.name(),
                            format!("backbone returned {} values for {n} x {d}", out.len()),
                        ));
                    }
                    for (k, &i) in part.iter().enumerate() {
                        let i = i as usize;
                        pooled[mi][i * d..(i + 1) * d].copy_from_slice(&out[k * d..(k + 1) * d]);
                    }
                    tokens_done(n * len);
                }
            }
        }
        if cancel.load(Ordering::Relaxed) {
            return Err(EncodeError::Cancelled);
        }
        let r = self.weights.config.repr_dim;
        let mut out = Vec::with_capacity(nw * r);
        for (a, b) in pooled[0].chunks(chunk * d).zip(pooled[1].chunks(chunk * d)) {
            let n = a.len() / d;
            let y = self.backend.head(a, b, n)?;
            if y.len() != n * r {
                return Err(EncodeError::backend(
                    self.backend.name(),
                    format!("head returned {} values for {n} x {r}", y.len()),
                ));
            }
            out.extend_from_slice(&y);
        }
        Ok(out)
    }
}
