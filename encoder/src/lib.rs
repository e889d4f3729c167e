//! TESSERA v2 pixel student: a tile's S2 and S1 time series to per-pixel embeddings.
//!
//! Turns a tile of Sentinel-2 and Sentinel-1 time series into per-pixel
//! 128-d embeddings, on whatever device is at hand.
//!
//! # Layout
//!
//! - `config` — the model's sizes, parsed from the checkpoint's `args`
//!   (`ModelConfig::large()` and `small()` for synthetic checkpoints).
//! - `checkpoint` — `.pt` / `.safetensors` loading and the hierarchical,
//!   shape-checked tensor lookup (`Vars`); `checkpoint::inspect` and
//!   `validate`, the header-only check (sizes against the bytes present,
//!   caps, the model's tensor names and shapes) that runs before any
//!   tensor is read; the bounded pickle reader for `.pt`.
//! - `model` — typed weights with the upstream names, plus shared arithmetic
//!   (LayerNorm, day-of-year encoding).
//! - `npy` — the `.npy` reader and writer; `NpyFile`, read by position.
//! - `tile` — tile inputs in memory in the geotessera layout: cross-checks
//!   (dimensions capped before any data), write, per-pixel access (valid
//!   frames, standardised tokens), a window's subset.
//! - `tile_reader` — `TileReader`: a tile's files opened and checked, then
//!   read a window of pixels at a time by position (memory bounded by the
//!   window, not the tile).
//! - `source` — `TileSource`, what the encoder reads windows from: a tile
//!   in memory or a `TileReader`.
//! - `normalise` — upstream's per-band means and stds, and `standardise`.
//! - `sequence` — a pixel's bin length and which frames fill it; gathers a
//!   chunk's sequences for a backend.
//! - `backend` — the `Backend` trait, `BackendChoice` (`backend/choice.rs`),
//!   which backends run here and the device name profiles are keyed by
//!   (`backend/mod.rs`), and the implementations: `reference` (candle); the
//!   thread-per-block pass (`block.rs`) over `pure_rust.rs` (the `cpu`
//!   backend, the `gemm` crate) or `onednn.rs` (pre-packed oneDNN matmuls;
//!   the `onednn` feature, Linux only); the GPU path in `backend/gpu/`
//!   (`mod.rs` the weights on the device, `forward.rs` and `ops.rs` the
//!   forward pass, `device.rs` the device interface, `kernels.cu`, `cuda/`
//!   behind the `cuda` feature, the tests' `emulator/`).
//! - `encode` — `Encoder` (`encode/mod.rs`): windows read ahead on their own
//!   thread (`pipeline.rs`), cut as the tile is counted (`cutter.rs`),
//!   grouped by bin and chunked (`gather.rs`), fed to the backend
//!   (`feed.rs`); cancellation, progress.
//! - `output` — `TileEmbedding`, int8 quantisation, truncation; `OutputWriter`,
//!   the output files written atomically as an encode's windows finish
//!   (`EmbeddingSink`, where an encode puts each window).
//! - `profile` — `DeviceProfile` and `Dtype`: per-device chunk/block/thread
//!   settings in a TOML file (data only; `backend` names the device).
//! - `bench` — GEMM rate, pixels/s, GFLOP/s and the tuning sweep.
//! - `synth` — random-weight checkpoints, `SynthTile` / `TileInputs::synthetic`
//!   random tiles, and their RNG.
//! - `golden` — comparing an encoding with a fixture's upstream outputs.
//! - `error` — `EncodeError`, naming the file, tensor or setting at fault.
//!
//! # Use
//!
//! ```no_run
//! use std::sync::atomic::AtomicBool;
//! use tessera_encoder::{BackendChoice, DeviceProfile, Encoder, OutputOptions, OutputWriter, TileReader};
//! # fn main() -> Result<(), tessera_encoder::EncodeError> {
//! let profile = DeviceProfile::resolve(None, BackendChoice::Cpu)?;
//! let enc = Encoder::load("ckpt.pt".as_ref(), BackendChoice::Auto, profile)?;
//! let tile = TileReader::open("grid_0.15_52.05".as_ref())?;
//! let opts = OutputOptions { int8: true, dim: 128 };
//! let size = (tile.height(), tile.width());
//! let mut out = OutputWriter::create("out".as_ref(), "grid_0.15_52.05", opts, size, enc.config().repr_dim)?;
//! enc.encode_into(&tile, &mut out, &|done, total| eprintln!("{done}/{total}"), &AtomicBool::new(false))?;
//! out.finish()?;
//! # Ok(()) }
//! ```

pub mod backend;
pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod encode;
pub mod error;
pub mod golden;
pub mod model;
pub mod normalise;
pub mod npy;
pub mod output;
pub mod profile;
pub mod sequence;
pub mod source;
pub mod synth;
pub mod tile;
pub mod tile_reader;

pub use backend::{Backend, BackendChoice, SequenceBatch};
pub use checkpoint::Checkpoint;
pub use config::ModelConfig;
pub use encode::{Encoder, LoadTimes};
pub use error::EncodeError;
pub use model::{Modality, StudentWeights};
pub use output::{EmbeddingSink, OutputOptions, OutputWriter, TileEmbedding};
pub use profile::{DeviceProfile, Dtype, ProfileSet};
pub use source::TileSource;
pub use synth::{random_checkpoint, write_safetensors, SynthTile};
pub use tile::TileInputs;
pub use tile_reader::TileReader;
