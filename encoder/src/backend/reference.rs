//! The yardstick backend: the model written plainly with candle tensors on
//! the CPU, one op per line, the way the PyTorch module reads.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor, D};

use super::{Backend, SequenceBatch};
use crate::error::{EncodeError, Result};
use crate::model::{self, Backbone, LayerNorm, Linear, Modality, StudentWeights};

struct TLinear {
    w: Tensor,
    b: Tensor,
}

struct TNorm {
    affine: Option<(Tensor, Tensor)>,
    eps: f64,
}

struct TLayer {
    in_proj: TLinear,
    out_proj: TLinear,
    linear1: TLinear,
    linear2: TLinear,
    norm1: TNorm,
    norm2: TNorm,
}

struct TBackbone {
    d: usize,
    nhead: usize,
    embed0: TLinear,
    embed2: TLinear,
    layers: Vec<TLayer>,
    pool: TLinear,
    doy: model::DoyEncoding,
}

/// candle on the CPU.
pub struct ReferenceBackend {
    s2: TBackbone,
    s1: TBackbone,
    fc1: TLinear,
    norm1: TNorm,
    fc2: TLinear,
    out_norm: TNorm,
    weights: Arc<StudentWeights>,
    /// candle's CPU matmul splits work over the rayon pool it runs in; a
    /// pool of the profile's size makes `threads` mean what it says.
    pool: rayon::ThreadPool,
}

fn err(e: candle_core::Error) -> EncodeError {
    EncodeError::backend("reference", e)
}

fn lin(l: &Linear) -> candle_core::Result<TLinear> {
    Ok(TLinear {
        w: Tensor::from_slice(&l.weight, (l.out_dim, l.in_dim), &Device::Cpu)?,
        b: Tensor::from_slice(&l.bias, l.out_dim, &Device::Cpu)?,
    })
}

fn norm(n: &LayerNorm) -> candle_core::Result<TNorm> {
    Ok(TNorm {
        affine: match &n.affine {
            Some((w, b)) => Some((
                Tensor::from_slice(w, n.dim, &Device::Cpu)?,
                Tensor::from_slice(b, n.dim, &Device::Cpu)?,
            )),
            None => None,
        },
        eps: n.eps as f64,
    })
}

fn backbone(b: &Backbone) -> candle_core::Result<TBackbone> {
    Ok(TBackbone {
        d: b.d_model,
        nhead: b.nhead,
        embed0: lin(&b.embed0)?,
        embed2: lin(&b.embed2)?,
        layers: b
            .layers
            .iter()
            .map(|l| {
                Ok(TLayer {
                    in_proj: lin(&l.in_proj)?,
                    out_proj: lin(&l.out_proj)?,
                    linear1: lin(&l.linear1)?,
                    linear2: lin(&l.linear2)?,
                    norm1: norm(&l.norm1)?,
                    norm2: norm(&l.norm2)?,
                })
            })
            .collect::<candle_core::Result<_>>()?,
        pool: lin(&b.pool)?,
        doy: model::DoyEncoding::new(b.d_model),
    })
}

impl TLinear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.matmul(&self.w.t()?)?.broadcast_add(&self.b)
    }
}

impl TNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let xc = x.broadcast_sub(&mean)?;
        let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
        let y = xc.broadcast_div(&(var + self.eps)?.sqrt()?)?;
        match &self.affine {
            Some((w, b)) => y.broadcast_mul(w)?.broadcast_add(b),
            None => Ok(y),
        }
    }
}

fn softmax_last(x: &Tensor) -> candle_core::Result<Tensor> {
    let m = x.max_keepdim(D::Minus1)?;
    let e = x.broadcast_sub(&m)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

impl TBackbone {
    fn forward(&self, batch: &SequenceBatch<'_>) -> candle_core::Result<Tensor> {
        let (n, len, d, nh) = (batch.n, batch.len, self.d, self.nhead);
        let hd = d / nh;
        let x = Tensor::from_slice(batch.values, (n * len, batch.bands), &Device::Cpu)?;
        let mut pe = vec![0f32; n * len * d];
        for (row, &doy) in pe.chunks_exact_mut(d).zip(batch.doys) {
            self.doy.encode(doy, row);
        }
        let pe = Tensor::from_vec(pe, (n * len, d), &Device::Cpu)?;
        let mut h = (self.embed2.forward(&self.embed0.forward(&x)?.relu()?)? + pe)?;
        let scale = 1.0 / (hd as f64).sqrt();
        for l in &self.layers {
            let qkv = l.in_proj.forward(&h)?;
            let heads = |i: usize| -> candle_core::Result<Tensor> {
                qkv.narrow(1, i * d, d)?
                    .reshape((n, len, nh, hd))?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
            let s = (q.matmul(&k.t()?.contiguous()?)? * scale)?;
            let o = softmax_last(&s)?.matmul(&v)?;
            let o = o.transpose(1, 2)?.contiguous()?.reshape((n * len, d))?;
            h = l.norm1.forward(&(h + l.out_proj.forward(&o)?)?)?;
            let f = l.linear2.forward(&l.linear1.forward(&h)?.relu()?)?;
            h = l.norm2.forward(&(h + f)?)?;
        }
        let scores = self.pool.forward(&h)?.reshape((n, len))?;
        let w = softmax_last(&scores)?.unsqueeze(2)?;
        h.reshape((n, len, d))?.broadcast_mul(&w)?.sum(1)
    }
}

impl ReferenceBackend {
    pub fn new(weights: Arc<StudentWeights>, threads: usize) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("tessera-reference-{i}"))
            .build()
            .map_err(|e| EncodeError::backend("reference", e))?;
        let h = &weights.head;
        Ok(ReferenceBackend {
            s2: backbone(&weights.s2).map_err(err)?,
            s1: backbone(&weights.s1).map_err(err)?,
            fc1: lin(&h.fc1).map_err(err)?,
            norm1: norm(&h.norm1).map_err(err)?,
            fc2: lin(&h.fc2).map_err(err)?,
            out_norm: norm(&h.out_norm).map_err(err)?,
            weights,
            pool,
        })
    }
}

fn to_vec(t: Tensor) -> candle_core::Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

impl Backend for ReferenceBackend {
    fn name(&self) -> &'static str {
        "reference"
    }

    fn backbone(&self, modality: Modality, batch: &SequenceBatch<'_>) -> Result<Vec<f32>> {
        let b = match modality {
            Modality::S2 => &self.s2,
            Modality::S1 => &self.s1,
        };
        self.pool
            .install(|| b.forward(batch).and_then(to_vec))
            .map_err(err)
    }

    fn head(&self, s2: &[f32], s1: &[f32], n: usize) -> Result<Vec<f32>> {
        let d = self.weights.config.d_model();
        let run = || -> candle_core::Result<Vec<f32>> {
            let a = Tensor::from_slice(s2, (n, d), &Device::Cpu)?;
            let b = Tensor::from_slice(s1, (n, d), &Device::Cpu)?;
            let z = Tensor::cat(&[&a, &b], 1)?;
            let z = self.norm1.forward(&self.fc1.forward(&z)?)?.relu()?;
            to_vec(self.out_norm.forward(&self.fc2.forward(&z)?)?)
        };
        self.pool.install(run).map_err(err)
    }
}
