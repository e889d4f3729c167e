//! Encoding a tile: group pixels by bin, gather chunks, run the backend,
//! assemble the per-pixel embeddings. Cancellation is checked between chunks.
//!
//! Pixels are taken in windows, each read from the [`TileSource`] on a
//! read-ahead thread at most [`READ_AHEAD`] windows ahead of the backend, so
//! a tile read from its files ([`TileReader`]) never needs memory for its
//! inputs as a whole (issue 16, "Memory").
//!
//! # Layout
//!
//! - `mod.rs` — [`Encoder`]: loading, settings and the calls that encode a tile.
//! - `pipeline` — [`Encoder::encode_into`]: the counter, reader, gatherer and
//!   sink threads around the thread that runs the backend.
//! - `cutter` — a tile's pixels with data cut into windows as their counts arrive.
//! - `gather` — a window's chunks planned by sequence length and their tokens gathered.
//! - `feed` — one window's chunks and head through the backend, each begun
//!   before the last one's result is taken.

mod cutter;
mod feed;
mod gather;
mod pipeline;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::backend::{self, Backend, BackendChoice};
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::model::StudentWeights;
use crate::output::TileEmbedding;
use crate::profile::DeviceProfile;
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
    /// [`EncodeError::Cancelled`](crate::EncodeError::Cancelled) at the next
    /// chunk boundary.
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
}
