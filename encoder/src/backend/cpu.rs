//! The fast pure-Rust CPU path: pre-transposed weights, `gemm` sgemm with the
//! bias folded into the accumulator and ReLU fused after, and one thread per
//! block of pixels carrying that block through every layer so its
//! activations stay in cache. The fallback where oneDNN is unavailable.
//!
//! Determinism: a batch is cut into blocks of `block_pixels` whatever the
//! thread count, each block is computed by one thread with single-threaded
//! GEMMs, and threads only decide who computes which block. So the bits do
//! not depend on the number of threads.

use std::sync::Arc;

use gemm::Parallelism;

use super::{Backend, SequenceBatch};
use crate::error::{EncodeError, Result};
use crate::model::{self, Backbone, LayerNorm, Linear, Modality, StudentWeights};
use crate::profile::DeviceProfile;

/// A Linear with W kept as PyTorch stores it, (out, in) row-major, read by
/// the GEMM as W^T through strides.
struct PLinear {
    k: usize,
    n: usize,
    wt: Vec<f32>,
    bias: Vec<f32>,
}

impl PLinear {
    fn new(l: &Linear) -> Self {
        PLinear {
            k: l.in_dim,
            n: l.out_dim,
            wt: l.weight.clone(),
            bias: l.bias.clone(),
        }
    }

    /// `out (m, n) = x (m, k) W^T + b`, then ReLU if asked.
    fn forward(&self, x: &[f32], m: usize, out: &mut [f32], relu: bool) {
        let (k, n) = (self.k, self.n);
        debug_assert!(x.len() >= m * k && out.len() >= m * n);
        for row in out[..m * n].chunks_exact_mut(n) {
            row.copy_from_slice(&self.bias);
        }
        // SAFETY: the slices hold m*k, k*n and m*n elements at the strides given.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                out.as_mut_ptr(),
                1,
                n as isize,
                true,
                x.as_ptr(),
                1,
                k as isize,
                self.wt.as_ptr(),
                k as isize,
                1,
                1.0f32,
                1.0f32,
                false,
                false,
                false,
                Parallelism::None,
            );
        }
        if relu {
            for v in &mut out[..m * n] {
                *v = v.max(0.0);
            }
        }
    }
}

struct PLayer {
    in_proj: PLinear,
    out_proj: PLinear,
    linear1: PLinear,
    linear2: PLinear,
    norm1: LayerNorm,
    norm2: LayerNorm,
}

struct PBackbone {
    d: usize,
    nhead: usize,
    ffn: usize,
    embed0: PLinear,
    embed2: PLinear,
    layers: Vec<PLayer>,
    pool_w: Vec<f32>,
    pool_b: f32,
    doy: model::DoyEncoding,
}

impl PBackbone {
    fn new(b: &Backbone, ffn: usize) -> Self {
        PBackbone {
            d: b.d_model,
            nhead: b.nhead,
            ffn,
            embed0: PLinear::new(&b.embed0),
            embed2: PLinear::new(&b.embed2),
            layers: b
                .layers
                .iter()
                .map(|l| PLayer {
                    in_proj: PLinear::new(&l.in_proj),
                    out_proj: PLinear::new(&l.out_proj),
                    linear1: PLinear::new(&l.linear1),
                    linear2: PLinear::new(&l.linear2),
                    norm1: l.norm1.clone(),
                    norm2: l.norm2.clone(),
                })
                .collect(),
            pool_w: b.pool.weight.clone(),
            pool_b: b.pool.bias[0],
            doy: model::DoyEncoding::new(b.d_model),
        }
    }
}

/// Per-thread activations for one block of `rows` tokens.
struct Workspace {
    h: Vec<f32>,
    t: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    ff: Vec<f32>,
    scores: Vec<f32>,
    pe: Vec<f32>,
}

impl Workspace {
    fn new(rows: usize, len: usize, d: usize, ffn: usize) -> Self {
        Workspace {
            h: vec![0.0; rows * d],
            t: vec![0.0; rows * d],
            qkv: vec![0.0; rows * 3 * d],
            attn: vec![0.0; rows * d],
            ff: vec![0.0; rows * ffn],
            scores: vec![0.0; len * len],
            pe: vec![0.0; d],
        }
    }
}

fn softmax_in_place(row: &mut [f32]) {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut s = 0.0f32;
    for v in row.iter_mut() {
        *v = (*v - m).exp();
        s += *v;
    }
    let inv = 1.0 / s;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

impl PBackbone {
    /// Carry `b` pixels (sequences of `len`) through the whole backbone;
    /// writes (b, d) pooled features to `out`.
    fn block(
        &self,
        b: usize,
        len: usize,
        values: &[f32],
        doys: &[f32],
        ws: &mut Workspace,
        out: &mut [f32],
    ) {
        let (d, nh) = (self.d, self.nhead);
        let hd = d / nh;
        let m = b * len;
        let scale = 1.0 / (hd as f32).sqrt();
        self.embed0.forward(values, m, &mut ws.t, true);
        self.embed2.forward(&ws.t, m, &mut ws.h, false);
        for (row, &doy) in ws.h[..m * d].chunks_exact_mut(d).zip(doys) {
            self.doy.encode(doy, &mut ws.pe);
            for (v, p) in row.iter_mut().zip(&ws.pe) {
                *v += p;
            }
        }
        let d3 = 3 * d;
        for l in &self.layers {
            l.in_proj.forward(&ws.h, m, &mut ws.qkv, false);
            for p in 0..b {
                let base = p * len * d3;
                for j in 0..nh {
                    let q = ws.qkv[base + j * hd..].as_ptr();
                    let k = ws.qkv[base + d + j * hd..].as_ptr();
                    let v = ws.qkv[base + 2 * d + j * hd..].as_ptr();
                    // SAFETY: q, k, v address len rows of hd at stride 3d
                    // inside qkv; scores is len x len; the attn slice holds
                    // len rows of hd at stride d.
                    unsafe {
                        gemm::gemm(
                            len,
                            len,
                            hd,
                            ws.scores.as_mut_ptr(),
                            1,
                            len as isize,
                            false,
                            q,
                            1,
                            d3 as isize,
                            k,
                            d3 as isize,
                            1,
                            0.0f32,
                            scale,
                            false,
                            false,
                            false,
                            Parallelism::None,
                        );
                    }
                    for row in ws.scores.chunks_exact_mut(len) {
                        softmax_in_place(row);
                    }
                    let o = ws.attn[p * len * d + j * hd..].as_mut_ptr();
                    unsafe {
                        gemm::gemm(
                            len,
                            hd,
                            len,
                            o,
                            1,
                            d as isize,
                            false,
                            ws.scores.as_ptr(),
                            1,
                            len as isize,
                            v,
                            1,
                            d3 as isize,
                            0.0f32,
                            1.0f32,
                            false,
                            false,
                            false,
                            Parallelism::None,
                        );
                    }
                }
            }
            l.out_proj.forward(&ws.attn, m, &mut ws.t, false);
            for (t, h) in ws.t[..m * d].iter_mut().zip(&ws.h) {
                *t += h;
            }
            l.norm1.apply_rows(&mut ws.t[..m * d]);
            std::mem::swap(&mut ws.t, &mut ws.h);
            l.linear1.forward(&ws.h, m, &mut ws.ff, true);
            l.linear2.forward(&ws.ff, m, &mut ws.t, false);
            for (t, h) in ws.t[..m * d].iter_mut().zip(&ws.h) {
                *t += h;
            }
            l.norm2.apply_rows(&mut ws.t[..m * d]);
            std::mem::swap(&mut ws.t, &mut ws.h);
        }
        // Attention pooling over time.
        let mut w = vec![0f32; len];
        for p in 0..b {
            let hp = &ws.h[p * len * d..(p + 1) * len * d];
            for (t, row) in hp.chunks_exact(d).enumerate() {
                w[t] = row
                    .iter()
                    .zip(&self.pool_w)
                    .map(|(a, b)| a * b)
                    .sum::<f32>()
                    + self.pool_b;
            }
            softmax_in_place(&mut w);
            let o = &mut out[p * d..(p + 1) * d];
            o.fill(0.0);
            for (t, row) in hp.chunks_exact(d).enumerate() {
                for (o, h) in o.iter_mut().zip(row) {
                    *o += w[t] * h;
                }
            }
        }
    }
}

/// The pure-Rust CPU backend.
pub struct CpuBackend {
    weights: Arc<StudentWeights>,
    s2: PBackbone,
    s1: PBackbone,
    fc1: PLinear,
    fc2: PLinear,
    threads: usize,
    block_pixels: usize,
}

impl CpuBackend {
    pub fn new(weights: Arc<StudentWeights>, profile: &DeviceProfile) -> Result<Self> {
        if profile.dtype != "f32" {
            return Err(EncodeError::backend(
                "cpu",
                format!("dtype `{}` is not supported (f32 only)", profile.dtype),
            ));
        }
        let ffn = weights.config.dim_feedforward;
        Ok(CpuBackend {
            s2: PBackbone::new(&weights.s2, ffn),
            s1: PBackbone::new(&weights.s1, ffn),
            fc1: PLinear::new(&weights.head.fc1),
            fc2: PLinear::new(&weights.head.fc2),
            threads: profile.threads.max(1),
            block_pixels: profile.block_pixels.max(1),
            weights,
        })
    }

    /// Run `work(first_pixel, pixels, out_block)` over blocks of
    /// `block_pixels`, `out` holding `width` values per pixel. Blocks go to
    /// threads round-robin; the blocks themselves never depend on the thread
    /// count.
    fn for_blocks<F>(&self, width: usize, out: &mut [f32], work: F)
    where
        F: Fn(usize, usize, &mut [f32]) + Sync,
    {
        let bp = self.block_pixels;
        let blocks: Vec<(usize, &mut [f32])> = out
            .chunks_mut(bp * width)
            .enumerate()
            .map(|(i, o)| (i * bp, o))
            .collect();
        let threads = self.threads.min(blocks.len()).max(1);
        if threads == 1 {
            for (start, o) in blocks {
                work(start, o.len() / width, o);
            }
            return;
        }
        let mut per_thread: Vec<Vec<(usize, &mut [f32])>> =
            (0..threads).map(|_| Vec::new()).collect();
        for (i, blk) in blocks.into_iter().enumerate() {
            per_thread[i % threads].push(blk);
        }
        std::thread::scope(|s| {
            for mine in per_thread {
                let work = &work;
                s.spawn(move || {
                    for (start, o) in mine {
                        work(start, o.len() / width, o);
                    }
                });
            }
        });
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn backbone(&self, modality: Modality, batch: &SequenceBatch<'_>) -> Result<Vec<f32>> {
        let bb = match modality {
            Modality::S2 => &self.s2,
            Modality::S1 => &self.s1,
        };
        let (len, bands, d) = (batch.len, batch.bands, bb.d);
        let mut out = vec![0f32; batch.n * d];
        let rows = self.block_pixels.min(batch.n) * len;
        self.for_blocks(d, &mut out, |start, b, o| {
            // Each block allocates its own workspace: the cost is noise next
            // to the GEMMs, and it keeps threads from sharing cache lines.
            let mut ws = Workspace::new(rows, len, d, bb.ffn);
            let v = &batch.values[start * len * bands..(start + b) * len * bands];
            let doys = &batch.doys[start * len..(start + b) * len];
            bb.block(b, len, v, doys, &mut ws, o);
        });
        Ok(out)
    }

    fn head(&self, s2: &[f32], s1: &[f32], n: usize) -> Result<Vec<f32>> {
        let d = self.weights.config.d_model();
        let r = self.weights.config.repr_dim;
        let h = &self.weights.head;
        let mut out = vec![0f32; n * r];
        self.for_blocks(r, &mut out, |start, b, o| {
            let mut z = vec![0f32; b * 2 * d];
            for i in 0..b {
                let p = start + i;
                z[i * 2 * d..i * 2 * d + d].copy_from_slice(&s2[p * d..(p + 1) * d]);
                z[i * 2 * d + d..(i + 1) * 2 * d].copy_from_slice(&s1[p * d..(p + 1) * d]);
            }
            let mut y = vec![0f32; b * 4 * d];
            self.fc1.forward(&z, b, &mut y, false);
            h.norm1.apply_rows(&mut y);
            for v in &mut y {
                *v = v.max(0.0);
            }
            self.fc2.forward(&y, b, o, false);
            h.out_norm.apply_rows(o);
        });
        Ok(out)
    }
}
