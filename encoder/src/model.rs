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
    /// accumulated in f64, in eight fixed lanes: the result does not depend
    /// on the thread or block a row is computed in, and the loops vectorise
    /// (the bf16 encoder spent a sixth of its time outside the GEMMs here,
    /// in a scalar f64 sum LLVM may not reorder).
    pub fn apply_rows(&self, x: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512 F (checked just above).
                return unsafe { self.apply_rows_avx512(x) };
            }
            if is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above).
                return unsafe { self.apply_rows_avx2(x) };
            }
        }
        self.apply_rows_portable(x)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn apply_rows_avx512(&self, x: &mut [f32]) {
        self.apply_rows_portable(x)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn apply_rows_avx2(&self, x: &mut [f32]) {
        self.apply_rows_portable(x)
    }

    #[inline(always)]
    fn apply_rows_portable(&self, x: &mut [f32]) {
        let n = self.dim as f64;
        for row in x.chunks_exact_mut(self.dim) {
            let mean = lane_sum(row, |v| v as f64) / n;
            let var = lane_sum(row, |v| {
                let c = v as f64 - mean;
                c * c
            }) / n;
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

/// `f(v)` summed over `row` in eight lanes (element i into lane i mod 8,
/// each lane in order), then the lanes in order, then the tail: a fixed
/// order, so the same bits wherever it runs.
#[inline(always)]
fn lane_sum(row: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    const LANES: usize = 8;
    let mut acc = [0f64; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    acc.iter().sum::<f64>() + tail.iter().map(|&v| f(v)).sum::<f64>()
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
        Self::from_vars(ckpt.vars())
    }

    /// [`StudentWeights::from_checkpoint`], moving the tensors out of
    /// `ckpt` instead of copying them: the weights are held once.
    pub fn from_owned_checkpoint(ckpt: Checkpoint) -> Result<Self> {
        Self::from_vars(ckpt.into_vars())
    }

    fn from_vars(vb: Vars<'_>) -> Result<Self> {
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
    /// The encoding of whole days 0 to [`DOY_TABLE_DAYS`] - 1, row by row,
    /// computed once by the same arithmetic as [`DoyEncoding::compute`]:
    /// the double-precision sin and cos of each value were a sixth of a
    /// CPU encode's time outside the GEMMs (a tile's days are whole).
    table: Vec<f32>,
}

/// Whole days the CPU table holds: 0 to 366.
pub const DOY_TABLE_DAYS: usize = 367;

impl DoyEncoding {
    pub fn new(d: usize) -> Self {
        let ln = (10000.0f64).ln();
        let mut enc = DoyEncoding {
            freqs: (0..d / 2)
                .map(|i| (-ln * (2 * i) as f64 / d as f64).exp())
                .collect(),
            table: vec![0.0; DOY_TABLE_DAYS * d],
        };
        let mut table = std::mem::take(&mut enc.table);
        for (day, row) in table.chunks_exact_mut(d.max(1)).enumerate() {
            enc.compute(day as f32, row);
        }
        enc.table = table;
        enc
    }

    /// Write the encoding of `doy` into `out` (length d): from the table for
    /// a whole day in it, else computed (the same bits either way).
    pub fn encode(&self, doy: f32, out: &mut [f32]) {
        let d = out.len();
        // Not -0.0: its sine is -0.0, the table's +0.0.
        let whole = doy.is_sign_positive() && doy < DOY_TABLE_DAYS as f32 && doy.fract() == 0.0;
        match self.table.get(doy as usize * d..(doy as usize + 1) * d) {
            Some(row) if whole && d == 2 * self.freqs.len() => out.copy_from_slice(row),
            _ => self.compute(doy, out),
        }
    }

    fn compute(&self, doy: f32, out: &mut [f32]) {
        for (pair, f) in out.chunks_exact_mut(2).zip(&self.freqs) {
            let (s, c) = (doy as f64 * f).sin_cos();
            pair[0] = s as f32;
            pair[1] = c as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table gives the computed bits for every whole day it holds, and
    /// days outside it (fractional, negative, past 366, NaN) are computed.
    #[test]
    fn doy_table_matches_the_computed_encoding() {
        let d = 640;
        let enc = DoyEncoding::new(d);
        let days = (0..DOY_TABLE_DAYS as i32 + 3).map(|d| d as f32).chain([
            -1.0,
            -0.0,
            0.5,
            365.25,
            1e6,
            f32::NAN,
        ]);
        for day in days {
            let (mut got, mut want) = (vec![7.0f32; d], vec![7.0f32; d]);
            enc.encode(day, &mut got);
            enc.compute(day, &mut want);
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "day {day}");
        }
        // A day in the table, so the lookup is what ran: not all zeros.
        let mut row = vec![0f32; d];
        enc.encode(200.0, &mut row);
        assert!(row.iter().any(|&v| v != 0.0 && v != 1.0));
    }

    /// LayerNorm in lanes agrees with a plain f64 two-pass normalisation to
    /// f32 rounding, on rows whose length is not a multiple of the lanes.
    #[test]
    fn layer_norm_matches_plain_f64() {
        for dim in [5, 8, 13, 640] {
            let ln = LayerNorm {
                dim,
                affine: Some((
                    (0..dim).map(|i| 0.5 + i as f32 / dim as f32).collect(),
                    (0..dim).map(|i| i as f32 * 0.01 - 0.2).collect(),
                )),
                eps: LN_EPS,
            };
            let x: Vec<f32> = (0..3 * dim)
                .map(|i| ((i * 7919 % 211) as f32 - 100.0) * 0.37 + 1e3)
                .collect();
            let mut got = x.clone();
            ln.apply_rows(&mut got);
            for (r, row) in x.chunks_exact(dim).enumerate() {
                let n = dim as f64;
                let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
                let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
                let inv = 1.0 / (var + LN_EPS as f64).sqrt();
                let (w, b) = ln.affine.as_ref().unwrap();
                for c in 0..dim {
                    let want = ((row[c] as f64 - mean) * inv) as f32 * w[c] + b[c];
                    let g = got[r * dim + c];
                    assert!(
                        (g - want).abs() <= 1e-6 * want.abs().max(1.0),
                        "dim {dim} row {r} col {c}: {g} vs {want}"
                    );
                }
            }
        }
    }
}
