//! TESSERA v2 pixel student: turn a tile of Sentinel-2 and Sentinel-1 time
//! series into per-pixel 128-d embeddings, on whatever device is at hand.
//!
//! # Layout
//!
//! - `config` — the model's sizes, parsed from the checkpoint's `args`.
//! - `checkpoint` — `.pt` / `.safetensors` loading and the hierarchical,
//!   shape-checked tensor lookup (`Vars`).
//! - `model` — typed weights with the upstream names, plus shared arithmetic
//!   (LayerNorm, day-of-year encoding).
//! - `tile` — tile inputs in the geotessera layout: read, cross-check, access.
//! - `sequence` — valid observations, bins, which frames fill a bin, and
//!   standardisation.
//! - `backend` — the `Backend` trait and its implementations: `reference`
//!   (candle), and the thread-per-block pass (`backend/block.rs`) over two
//!   GEMM kernels: `cpu` (pure Rust `gemm`) and `onednn` (pre-packed oneDNN
//!   matmuls with fused post-ops; the `onednn` feature, default, Linux
//!   only). `cuda` plugs in behind its feature.
//! - `encode` — `Encoder`: grouping pixels by bin, chunking, cancellation,
//!   progress.
//! - `output` — `TileEmbedding`, int8 quantisation, truncation, atomic writes.
//! - `profile` — per-device chunk/block/thread settings in a TOML file.
//! - `bench` — GEMM rate, pixels/s, GFLOP/s and the tuning sweep.
//! - `synth` — random-weight checkpoints and the RNG for synthetic tiles.
//! - `npy` — the `.npy` reader and writer.
//!
//! # Use
//!
//! ```no_run
//! use std::sync::atomic::AtomicBool;
//! use tessera_encoder::{BackendChoice, DeviceProfile, Encoder, OutputOptions, TileInputs};
//! # fn main() -> Result<(), tessera_encoder::EncodeError> {
//! let profile = DeviceProfile::resolve(None, "cpu")?;
//! let enc = Encoder::load("ckpt.pt".as_ref(), BackendChoice::Auto, profile)?;
//! let tile = TileInputs::read("grid_0.15_52.05".as_ref())?;
//! let emb = enc.encode_tile(&tile, &|done, total| eprintln!("{done}/{total}"), &AtomicBool::new(false))?;
//! emb.write_outputs("out".as_ref(), "grid_0.15_52.05", OutputOptions { int8: true, dim: 128 })?;
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
pub mod npy;
pub mod output;
pub mod profile;
pub mod sequence;
pub mod synth;
pub mod tile;

pub use backend::{Backend, BackendChoice, SequenceBatch};
pub use checkpoint::Checkpoint;
pub use config::ModelConfig;
pub use encode::Encoder;
pub use error::EncodeError;
pub use model::{Modality, StudentWeights};
pub use output::{OutputOptions, TileEmbedding};
pub use profile::{DeviceProfile, ProfileSet};
pub use synth::{random_checkpoint, write_safetensors};
pub use tile::{SynthTile, TileInputs};
