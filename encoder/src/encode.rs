//! Encoding a tile: group pixels by bin, gather chunks, run the backend,
//! assemble the per-pixel embeddings. Cancellation is checked between chunks.

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
use crate::tile::TileInputs;

/// A loaded model bound to one backend and device profile. Load once, encode
/// many tiles; `encode_tile` takes `&self` and may be called from any thread.
pub struct Encoder {
    weights: Arc<StudentWeights>,
    backend: Box<dyn Backend>,
    profile: DeviceProfile,
}

/// Pixels of one modality grouped by their sequence length.
struct Groups {
    modality: Modality,
    by_len: BTreeMap<usize, Vec<u32>>,
}

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
        })
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

    /// Encode every pixel of a tile. `progress(done, total)` is called after
    /// each chunk, in pixels (a pixel counts half done after one backbone);
    /// when `cancel` becomes true the call returns [`EncodeError::Cancelled`]
    /// at the next chunk boundary.
    pub fn encode_tile(
        &self,
        tile: &TileInputs,
        progress: &dyn Fn(usize, usize),
        cancel: &AtomicBool,
    ) -> Result<TileEmbedding> {
        let npix = tile.pixels();
        let d = self.weights.config.d_model();
        let r = self.weights.config.repr_dim;
        let mut counts = [vec![0u16; npix], vec![0u16; npix]];
        for (mi, m) in [Modality::S2, Modality::S1].into_iter().enumerate() {
            for (p, c) in counts[mi].iter_mut().enumerate() {
                *c = tile.valid_count(m, p).min(u16::MAX as usize) as u16;
            }
        }
        let nodata: Vec<bool> = (0..npix)
            .map(|p| counts[0][p] == 0 && counts[1][p] == 0)
            .collect();
        let active: Vec<u32> = (0..npix as u32).filter(|&p| !nodata[p as usize]).collect();
        let groups: Vec<Groups> = [Modality::S2, Modality::S1]
            .into_iter()
            .enumerate()
            .map(|(mi, m)| {
                let mut by_len: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
                for &p in &active {
                    by_len
                        .entry(bin_len(counts[mi][p as usize] as usize))
                        .or_default()
                        .push(p);
                }
                Groups {
                    modality: m,
                    by_len,
                }
            })
            .collect();

        // Progress is measured in tokens so long sequences weigh what they cost.
        let total_tokens: usize = groups
            .iter()
            .flat_map(|g| g.by_len.iter().map(|(len, px)| len * px.len()))
            .sum();
        let mut done_tokens = 0usize;
        let report = |done_tokens: usize| {
            let done = if total_tokens == 0 {
                active.len()
            } else {
                (active.len() as u128 * done_tokens as u128 / total_tokens as u128) as usize
            };
            progress(done, active.len());
        };

        let mut pooled = [vec![0f32; npix * d], vec![0f32; npix * d]];
        let chunk = self.profile.chunk_pixels.max(1);
        for (mi, g) in groups.iter().enumerate() {
            let bands = g.modality.bands();
            let mut gather = Gatherer::new(tile, g.modality);
            for (&len, pixels) in &g.by_len {
                for part in pixels.chunks(chunk) {
                    if cancel.load(Ordering::Relaxed) {
                        return Err(EncodeError::Cancelled);
                    }
                    let n = part.len();
                    let mut values = vec![0f32; n * len * bands];
                    let mut doys = vec![0f32; n * len];
                    for (i, &p) in part.iter().enumerate() {
                        gather.gather(
                            p as usize,
                            len,
                            &mut values[i * len * bands..(i + 1) * len * bands],
                            &mut doys[i * len..(i + 1) * len],
                        );
                    }
                    let batch = SequenceBatch {
                        n,
                        len,
                        bands,
                        values: &values,
                        doys: &doys,
                    };
                    let out = self.backend.backbone(g.modality, &batch)?;
                    if out.len() != n * d {
                        return Err(EncodeError::backend(
                            self.backend.name(),
                            format!("backbone returned {} values for {n} x {d}", out.len()),
                        ));
                    }
                    for (i, &p) in part.iter().enumerate() {
                        let p = p as usize;
                        pooled[mi][p * d..(p + 1) * d].copy_from_slice(&out[i * d..(i + 1) * d]);
                    }
                    done_tokens += n * len;
                    report(done_tokens);
                }
            }
        }

        let mut values = vec![f32::NAN; npix * r];
        for part in active.chunks(chunk) {
            if cancel.load(Ordering::Relaxed) {
                return Err(EncodeError::Cancelled);
            }
            let n = part.len();
            let mut a = vec![0f32; n * d];
            let mut b = vec![0f32; n * d];
            for (i, &p) in part.iter().enumerate() {
                let p = p as usize;
                a[i * d..(i + 1) * d].copy_from_slice(&pooled[0][p * d..(p + 1) * d]);
                b[i * d..(i + 1) * d].copy_from_slice(&pooled[1][p * d..(p + 1) * d]);
            }
            let out = self.backend.head(&a, &b, n)?;
            for (i, &p) in part.iter().enumerate() {
                let p = p as usize;
                values[p * r..(p + 1) * r].copy_from_slice(&out[i * r..(i + 1) * r]);
            }
        }
        report(total_tokens);
        Ok(TileEmbedding {
            height: tile.height,
            width: tile.width,
            dim: r,
            values,
            nodata,
        })
    }
}
