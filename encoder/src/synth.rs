//! Synthetic inputs for demos, tests and benchmarks: random checkpoints and tiles.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use crate::checkpoint::{Checkpoint, Param};
use crate::config::{ModelConfig, S1_BANDS, S2_BANDS};
use crate::error::{EncodeError, Result};
use crate::tile::{SarPass, TileInputs};

/// splitmix64: tiny, seedable, good enough for random weights and tiles.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn uniform(&mut self, a: f64) -> f32 {
        ((self.next_f64() * 2.0 - 1.0) * a) as f32
    }
}

/// A checkpoint with random weights (PyTorch-like init: U(±1/sqrt(fan_in))
/// for Linear, 1 ± 0.1 / ±0.1 for LayerNorm).
pub fn random_checkpoint(cfg: &ModelConfig, seed: u64) -> Checkpoint {
    let mut rng = Rng::new(seed);
    let mut tensors = BTreeMap::new();
    for (name, shape) in cfg.tensor_shapes() {
        let n: usize = shape.iter().product();
        let is_norm = name.contains("norm") || name.starts_with("dim_reducer.1.");
        let data: Vec<f32> = if is_norm {
            let base = if name.ends_with("weight") { 1.0 } else { 0.0 };
            (0..n).map(|_| base + rng.uniform(0.1)).collect()
        } else {
            // fan_in: the weight's second axis; biases share their weight's.
            let fan_in = tensor_fan_in(cfg, &name);
            let a = 1.0 / (fan_in as f64).sqrt();
            (0..n).map(|_| rng.uniform(a)).collect()
        };
        tensors.insert(name, Param { shape, data });
    }
    Checkpoint {
        path: "<synthetic>".into(),
        config: *cfg,
        tensors,
    }
}

fn tensor_fan_in(cfg: &ModelConfig, name: &str) -> usize {
    let d = cfg.d_model();
    if name.contains("embedding.0") {
        if name.starts_with("s2") {
            S2_BANDS
        } else {
            S1_BANDS
        }
    } else if name.contains("linear2") {
        cfg.dim_feedforward
    } else if name.starts_with("dim_reducer.0") {
        2 * d
    } else if name.starts_with("dim_reducer.4") {
        4 * d
    } else {
        d
    }
}

/// Write a checkpoint as `.safetensors` with `args` JSON in the metadata.
pub fn write_safetensors(ckpt: &Checkpoint, path: &Path) -> Result<()> {
    use safetensors::tensor::{Dtype, TensorView};
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = ckpt
        .tensors
        .iter()
        .map(|(k, p)| {
            (
                k.clone(),
                p.shape.clone(),
                p.data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            )
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(k, s, b)| {
            TensorView::new(Dtype::F32, s.clone(), b)
                .map(|v| (k.clone(), v))
                .map_err(|e| EncodeError::tensor(k, e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta: HashMap<String, String> =
        [("args".to_string(), ckpt.config.to_json().to_string())].into();
    let tmp = path.with_extension("safetensors.tmp");
    safetensors::tensor::serialize_to_file(views, Some(meta), &tmp).map_err(|e| {
        EncodeError::Checkpoint {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }
    })?;
    std::fs::rename(&tmp, path).map_err(|e| EncodeError::io(path, e))
}

/// Sizes of a synthetic tile.
#[derive(Debug, Clone)]
pub struct SynthTile {
    pub height: usize,
    pub width: usize,
    pub s2_frames: usize,
    pub s1_asc_frames: usize,
    pub s1_desc_frames: usize,
    /// Probability that a frame is a valid observation.
    pub clear: f64,
    pub seed: u64,
}

impl TileInputs {
    /// A random tile for demos and benchmarks. Each S2 frame is clear with
    /// probability `clear`; each SAR frame is present with probability `clear`.
    pub fn synthetic(spec: &SynthTile) -> Self {
        let mut rng = Rng::new(spec.seed);
        let (h, w) = (spec.height, spec.width);
        let hw = h * w;
        let doys_for = |rng: &mut Rng, t: usize| -> Vec<i32> {
            let mut d: Vec<i32> = (0..t)
                .map(|_| 1 + (rng.next_f64() * 365.0) as i32)
                .collect();
            d.sort_unstable();
            d
        };
        let bands = (0..spec.s2_frames * hw * 10)
            .map(|_| (rng.next_f64() * 6000.0) as u16)
            .collect();
        let masks = (0..spec.s2_frames * hw)
            .map(|_| u8::from(rng.next_f64() < spec.clear))
            .collect();
        let doys = doys_for(&mut rng, spec.s2_frames);
        let mut sar = |t: usize, asc: bool| {
            let mut data = vec![0i16; t * hw * 2];
            for px in data.chunks_exact_mut(2) {
                if rng.next_f64() < spec.clear {
                    px[0] = 1 + (rng.next_f64() * 12000.0) as i16;
                    px[1] = 1 + (rng.next_f64() * 8000.0) as i16;
                }
            }
            SarPass::new(data, doys_for(&mut rng, t), asc)
        };
        let ascending = sar(spec.s1_asc_frames, true);
        let descending = sar(spec.s1_desc_frames, false);
        TileInputs {
            height: h,
            width: w,
            bands,
            masks,
            doys,
            ascending,
            descending,
        }
    }
}
