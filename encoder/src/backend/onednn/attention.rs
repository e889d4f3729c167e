//! Attention of a bf16 block on oneDNN's batched matmuls.
//!
//! The `gemm` crate's f32 attention (`block::attention_f32`) reads each head
//! in place and computes Q.K^T and P.V in f32 on the vector units; on the
//! 2-core AVX-512 machine it was ~40 % of the encoder's own time outside
//! oneDNN (150 of ~400 ms on a 128-px Large tile), and it cannot use AMX.
//! Here a block's Q, K and V are packed once per layer into dense
//! per-head bf16 tensors (the pass that converts them anyway), and both
//! products run as one batched bf16 matmul each over (pixel, head) with f32
//! accumulation: oneDNN's brgemm on AVX-512 bf16 or AMX (strided heads read
//! in place get only its slower `gemm:jit`). The scale is a post-op on the
//! f32 scores, the softmax is f32, its probabilities go to bf16 for P.V,
//! and P.V writes each head's output straight into its columns of the
//! (tokens, d) result. The GPU's bf16 attention (`attention_mma`) rounds the
//! same operands.
//!
//! Primitives are made per (pixels, sequence length, heads, head width) on
//! first use and shared by every thread.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use onednn::v3::{self, BatchedMatMul3};
use onednn::{BatchedMatMul, BatchedMatMulSpec, Bf16, DataType, Engine, PostOp};

use crate::backend::block::{softmax_in_place, AttentionKernel};
use crate::error::{EncodeError, Result};

/// A batched matmul on the linked 2.x or a 3.x opened at run time.
enum Bmm {
    V2(Box<BatchedMatMul>),
    V3(Box<BatchedMatMul3>),
}

impl Bmm {
    fn new(engine: &Engine, spec: BatchedMatMulSpec) -> onednn::Result<Self> {
        match v3::runtime() {
            Some(rt) => BatchedMatMul3::new(rt, spec).map(|m| Bmm::V3(Box::new(m))),
            None => BatchedMatMul::new(engine, spec).map(|m| Bmm::V2(Box::new(m))),
        }
    }

    fn execute(&self, src: &[Bf16], weights: &[Bf16], dst: &mut [f32]) -> onednn::Result<()> {
        match self {
            Bmm::V2(m) => m.execute(src, weights, dst, None),
            Bmm::V3(m) => m.execute(src, weights, dst, None),
        }
    }

    #[cfg(test)]
    fn impl_name(&self) -> &str {
        match self {
            Bmm::V2(m) => m.impl_name(),
            Bmm::V3(m) => m.impl_name(),
        }
    }
}

/// Q.K^T and P.V for one shape.
struct Products {
    scores: Bmm,
    values: Bmm,
}

/// (pixels, sequence length, heads, head width).
type Shape = (usize, usize, usize, usize);

pub(crate) struct OnednnAttention {
    engine: Engine,
    shapes: RwLock<HashMap<Shape, Arc<Products>>>,
}

/// One worker's packed operands, kept between blocks.
#[derive(Default)]
struct Buffers {
    q: Vec<Bf16>,
    k: Vec<Bf16>,
    v: Vec<Bf16>,
    scores: Vec<f32>,
    probs: Vec<Bf16>,
}

thread_local! {
    static BUFFERS: RefCell<Buffers> = RefCell::new(Buffers::default());
}

impl OnednnAttention {
    pub(crate) fn new(engine: &Engine) -> Self {
        OnednnAttention {
            engine: engine.clone(),
            shapes: RwLock::new(HashMap::new()),
        }
    }

    fn products(&self, shape: Shape) -> Result<Arc<Products>> {
        if let Some(p) = self
            .shapes
            .read()
            .expect("attention shapes lock is never held across a panic")
            .get(&shape)
        {
            return Ok(Arc::clone(p));
        }
        let (b, len, nh, dh) = shape;
        let d = nh * dh;
        let fail = |e| {
            EncodeError::backend(
                "onednn",
                format!("attention ({b} x {len} tokens, {nh} heads of {dh}): {e}"),
            )
        };
        // scores[p, h] = scale * Q[p, h] (len x dh) . K[p, h]^T, K read
        // transposed from its dense (len x dh) rows.
        let scores = Bmm::new(
            &self.engine,
            BatchedMatMulSpec {
                batch: vec![b, nh],
                m: len,
                k: dh,
                n: len,
                src_strides: None,
                weights_strides: Some(vec![nh * len * dh, len * dh, 1, dh]),
                dst_strides: None,
                data_type: DataType::Bf16,
                post_ops: vec![PostOp::Linear {
                    alpha: 1.0 / (dh as f32).sqrt(),
                    beta: 0.0,
                }],
                threads: 1,
            },
        )
        .map_err(fail)?;
        // out[p, t, h*dh..] = P[p, h] (len x len) . V[p, h] (len x dh).
        let values = Bmm::new(
            &self.engine,
            BatchedMatMulSpec {
                batch: vec![b, nh],
                m: len,
                k: len,
                n: dh,
                src_strides: None,
                weights_strides: None,
                dst_strides: Some(vec![len * d, dh, d, 1]),
                data_type: DataType::Bf16,
                post_ops: vec![],
                threads: 1,
            },
        )
        .map_err(fail)?;
        let p = Arc::new(Products { scores, values });
        let mut shapes = self
            .shapes
            .write()
            .expect("attention shapes lock is never held across a panic");
        Ok(Arc::clone(shapes.entry(shape).or_insert(p)))
    }

    /// The implementations oneDNN chose for a shape (tests, `--verbose`).
    #[cfg(test)]
    pub(crate) fn impl_names(&self, shape: Shape) -> Result<(String, String)> {
        let p = self.products(shape)?;
        Ok((p.scores.impl_name().into(), p.values.impl_name().into()))
    }
}

impl AttentionKernel for OnednnAttention {
    fn attend(
        &self,
        qkv: &[f32],
        attn: &mut [f32],
        b: usize,
        len: usize,
        d: usize,
        nh: usize,
    ) -> Result<()> {
        let dh = d / nh;
        let products = self.products((b, len, nh, dh))?;
        let (tokens, per_head) = (b * len, b * nh * len * dh);
        let (qkv, attn) = (&qkv[..tokens * 3 * d], &mut attn[..tokens * d]);
        BUFFERS.with(|cell| {
            let mut bufs = cell.borrow_mut();
            let Buffers {
                q,
                k,
                v,
                scores,
                probs,
            } = &mut *bufs;
            for buf in [&mut *q, &mut *k, &mut *v] {
                buf.resize(per_head, Bf16(0));
            }
            scores.resize(b * nh * len * len, 0.0);
            probs.resize(b * nh * len * len, Bf16(0));
            // Each token's (q | k | v) row into the heads' dense (len x dh) tensors, in bf16.
            for (token, row) in qkv.chunks_exact(3 * d).enumerate() {
                let (p, t) = (token / len, token % len);
                for (part, dst) in [&mut *q, &mut *k, &mut *v].into_iter().enumerate() {
                    for h in 0..nh {
                        let from = &row[part * d + h * dh..][..dh];
                        let at = ((p * nh + h) * len + t) * dh;
                        onednn::f32_to_bf16(from, &mut dst[at..at + dh]);
                    }
                }
            }
            let fail = |e| EncodeError::backend("onednn", format!("attention: {e}"));
            products.scores.execute(q, k, scores).map_err(fail)?;
            for row in scores.chunks_exact_mut(len) {
                softmax_in_place(row);
            }
            onednn::f32_to_bf16(scores, probs);
            products.values.execute(probs, v, attn).map_err(fail)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::block::attention_f32;

    /// Against the f32 attention on the `gemm` crate: within bf16's
    /// rounding of Q, K, V and the probabilities, on the Large model's
    /// head width and on ragged shapes; and an optimised oneDNN kernel for
    /// both products (its `ref` fallback is tens of times slower).
    #[test]
    fn matches_f32_attention_within_bf16_rounding() {
        if !crate::backend::onednn::bf16_supported() {
            eprintln!("SKIP: no native bf16 here");
            return;
        }
        let engine = Engine::cpu().expect("oneDNN CPU engine");
        let att = OnednnAttention::new(&engine);
        for (b, len, nh, dh) in [(8, 64, 4, 160), (3, 24, 4, 160), (2, 40, 2, 8)] {
            let d = nh * dh;
            let qkv: Vec<f32> = (0..b * len * 3 * d)
                .map(|i| ((i * 7919 % 211) as f32 - 105.0) / 60.0)
                .collect();
            let mut want = vec![0f32; b * len * d];
            let mut scores = vec![0f32; len * len];
            attention_f32(&qkv, &mut want, &mut scores, b, len, d, nh);
            let mut got = vec![f32::NAN; b * len * d];
            att.attend(&qkv, &mut got, b, len, d, nh).unwrap();
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = got
                .iter()
                .zip(&want)
                .map(|(g, w)| (g - w).abs())
                .fold(0f32, f32::max);
            let (s, v) = att.impl_names((b, len, nh, dh)).unwrap();
            eprintln!("{b} x {len}, {nh} x {dh}: worst {worst:e} of {scale}; {s} / {v}");
            assert!(
                worst <= 0.02 * scale,
                "{b} x {len}, {nh} x {dh}: {worst} of {scale}"
            );
            for name in [&s, &v] {
                assert!(!name.starts_with("ref"), "oneDNN chose {name}");
            }
        }
    }
}
