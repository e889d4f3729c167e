//! The student's weights as typed structs, read from a checkpoint with the
//! upstream (PyTorch) names, plus the pieces of arithmetic every backend shares.

use crate::checkpoint::{Checkpoint, Vars};
use crate::config::{ModelConfig, S1_BANDS, S2_BANDS};
use crate::error::Result;

/// Which backbone a sequence goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Modality {
    S2,
    S1,
}

impl Modality {
    pub fn bands(self) -> usize {
        match self {
            Modality::S2 => S2_BANDS,
            Modality::S1 => S1_BANDS,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Modality::S2 => "s2",
            Modality::S1 => "s1",
        }
    }
}

/// `y = x W^T + b`, W stored (out, in) row-major as in PyTorch.
#[derive(Debug, Clone)]
pub struct Linear {
    pub in_dim: usize,
    pub out_dim: usize,
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
}

impl Linear {
    fn load(vb: &Vars, in_dim: usize, out_dim: usize) -> Result<Self> {
        Ok(Linear {
            in_dim,
            out_dim,
            weight: vb.get(&[out_dim, in_dim], "weight")?.data,
            bias: vb.get(&[out_dim], "bias")?.data,
        })
    }
    /// W^T, (in, out) row-major: the layout GEMM kernels want for `x W^T`.
    pub fn weight_t(&self) -> Vec<f32> {
        let mut t = vec![0.0; self.weight.len()];
        for o in 0..self.out_dim {
            for i in 0..self.in_dim {
                t[i * self.out_dim + o] = self.weight[o * self.in_dim + i];
            }
        }
        t
    }
}

/// LayerNorm over the last axis; `affine` is absent for the final norm.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    pub dim: usize,
    pub affine: Option<(Vec<f32>, Vec<f32>)>,
    pub eps: f32,
}

/// PyTorch's default LayerNorm epsilon.
pub const LN_EPS: f32 = 1e-5;

impl LayerNorm {
    fn load(vb: &Vars, dim: usize) -> Result<Self> {
        Ok(LayerNorm {
            dim,
            affine: Some((vb.get(&[dim], "weight")?.data, vb.get(&[dim], "bias")?.data)),
            eps: LN_EPS,
        })
    }

    /// Normalise each row of `x` (rows of `dim`) in place. Statistics are
    /// accumulated in f64 so the result does not depend on summation order.
    pub fn apply_rows(&self, x: &mut [f32]) {
        for row in x.chunks_exact_mut(self.dim) {
            let n = self.dim as f64;
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
            let var = row
                .iter()
                .map(|&v| {
                    let c = v as f64 - mean;
                    c * c
                })
                .sum::<f64>()
                / n;
            let inv = 1.0 / (var + self.eps as f64).sqrt();
            match &self.affine {
                Some((w, b)) => {
                    for ((v, w), b) in row.iter_mut().zip(w).zip(b) {
                        *v = ((*v as f64 - mean) * inv) as f32 * w + b;
                    }
                }
                None => {
                    for v in row.iter_mut() {
                        *v = ((*v as f64 - mean) * inv) as f32;
                    }
                }
            }
        }
    }
}

/// One PyTorch `TransformerEncoderLayer` (post-LN, ReLU FFN).
#[derive(Debug, Clone)]
pub struct EncoderLayer {
    /// Packed q, k, v projection: (3d, d).
    pub in_proj: Linear,
    pub out_proj: Linear,
    pub linear1: Linear,
    pub linear2: Linear,
    pub norm1: LayerNorm,
    pub norm2: LayerNorm,
}

/// One per-pixel transformer backbone.
#[derive(Debug, Clone)]
pub struct Backbone {
    pub bands: usize,
    pub d_model: usize,
    pub nhead: usize,
    /// `embedding.0` (bands → d), ReLU, `embedding.2` (d → d).
    pub embed0: Linear,
    pub embed2: Linear,
    pub layers: Vec<EncoderLayer>,
    /// `attn_pool.query`: d → 1 score per time step.
    pub pool: Linear,
}

impl Backbone {
    fn load(vb: &Vars, cfg: &ModelConfig, bands: usize) -> Result<Self> {
        let d = cfg.d_model();
        let f = cfg.dim_feedforward;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let l = vb.pp("transformer_encoder.layers").pp(i);
            let attn = l.pp("self_attn");
            layers.push(EncoderLayer {
                in_proj: Linear {
                    in_dim: d,
                    out_dim: 3 * d,
                    weight: attn.get(&[3 * d, d], "in_proj_weight")?.data,
                    bias: attn.get(&[3 * d], "in_proj_bias")?.data,
                },
                out_proj: Linear::load(&attn.pp("out_proj"), d, d)?,
                linear1: Linear::load(&l.pp("linear1"), d, f)?,
                linear2: Linear::load(&l.pp("linear2"), f, d)?,
                norm1: LayerNorm::load(&l.pp("norm1"), d)?,
                norm2: LayerNorm::load(&l.pp("norm2"), d)?,
            });
        }
        Ok(Backbone {
            bands,
            d_model: d,
            nhead: cfg.nhead,
            embed0: Linear::load(&vb.pp("embedding.0"), bands, d)?,
            embed2: Linear::load(&vb.pp("embedding.2"), d, d)?,
            layers,
            pool: Linear::load(&vb.pp("attn_pool.query"), d, 1)?,
        })
    }
}

/// `dim_reducer`: Linear(2d → 4d), LayerNorm, ReLU, Linear(4d → repr), then a
/// LayerNorm without affine parameters.
#[derive(Debug, Clone)]
pub struct Head {
    pub fc1: Linear,
    pub norm1: LayerNorm,
    pub fc2: Linear,
    pub out_norm: LayerNorm,
}

/// All weights of a pixel student.
#[derive(Debug, Clone)]
pub struct StudentWeights {
    pub config: ModelConfig,
    pub s2: Backbone,
    pub s1: Backbone,
    pub head: Head,
}

impl StudentWeights {
    /// Build from a checkpoint; missing, mis-shaped or extra tensors are an
    /// error naming the tensor.
    pub fn from_checkpoint(ckpt: &Checkpoint) -> Result<Self> {
        let vb = ckpt.vars();
        let cfg = *vb.config();
        let d = cfg.d_model();
        let r = vb.pp("dim_reducer");
        let w = StudentWeights {
            config: cfg,
            s2: Backbone::load(&vb.pp("s2_backbone"), &cfg, S2_BANDS)?,
            s1: Backbone::load(&vb.pp("s1_backbone"), &cfg, S1_BANDS)?,
            head: Head {
                fc1: Linear::load(&r.pp(0), 2 * d, 4 * d)?,
                norm1: LayerNorm::load(&r.pp(1), 4 * d)?,
                fc2: Linear::load(&r.pp(4), 4 * d, cfg.repr_dim)?,
                out_norm: LayerNorm {
                    dim: cfg.repr_dim,
                    affine: None,
                    eps: LN_EPS,
                },
            },
        };
        vb.finish()?;
        Ok(w)
    }

    pub fn backbone(&self, m: Modality) -> &Backbone {
        match m {
            Modality::S2 => &self.s2,
            Modality::S1 => &self.s1,
        }
    }
}

/// Sinusoidal encoding of a raw day of year: sin on even channels, cos on
/// odd, frequency `exp(-ln(10000) * 2i / d)`. Computed in f64 and rounded
/// once, so every backend adds the same values.
#[derive(Debug, Clone)]
pub struct DoyEncoding {
    freqs: Vec<f64>,
}

impl DoyEncoding {
    pub fn new(d: usize) -> Self {
        let ln = (10000.0f64).ln();
        DoyEncoding {
            freqs: (0..d / 2)
                .map(|i| (-ln * (2 * i) as f64 / d as f64).exp())
                .collect(),
        }
    }

    /// Write the encoding of `doy` into `out` (length d).
    pub fn encode(&self, doy: f32, out: &mut [f32]) {
        for (pair, f) in out.chunks_exact_mut(2).zip(&self.freqs) {
            let (s, c) = (doy as f64 * f).sin_cos();
            pair[0] = s as f32;
            pair[1] = c as f32;
        }
    }
}
