//! `BatchedMatMul`: dense 3-D batches, and attention read in place.
//!
//! Attention reads Q, K and V from a QKV buffer through strides.

mod common;

use common::{data, max_abs_diff};
use onednn::{BatchedMatMul, BatchedMatMulSpec, DataType, Engine, PostOp};

/// `c[b] = a[b] (m x k) . w[b] (k x n)` with explicit element strides.
#[allow(clippy::too_many_arguments)]
fn reference(
    a: &[f32],
    a_st: [usize; 3],
    w: &[f32],
    w_st: [usize; 3],
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    let mut out = vec![0f32; batch * m * n];
    for b in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0f64;
                for p in 0..k {
                    acc += a[b * a_st[0] + i * a_st[1] + p * a_st[2]] as f64
                        * w[b * w_st[0] + p * w_st[1] + j * w_st[2]] as f64;
                }
                out[(b * m + i) * n + j] = acc as f32;
            }
        }
    }
    out
}

#[test]
fn dense_3d_batch_matches_reference() {
    let engine = Engine::cpu().unwrap();
    let (batch, m, k, n) = (7, 16, 24, 16);
    let a = data(batch * m * k, 1);
    let w = data(batch * k * n, 2);
    let bmm = BatchedMatMul::new(
        &engine,
        BatchedMatMulSpec {
            batch: vec![batch],
            m,
            k,
            n,
            src_strides: None,
            weights_strides: None,
            dst_strides: None,
            data_type: DataType::F32,
            post_ops: vec![],
            threads: 1,
        },
    )
    .unwrap();
    let mut got = vec![0f32; batch * m * n];
    bmm.execute(&a, &w, &mut got, None).unwrap();
    let want = reference(&a, [m * k, k, 1], &w, [k * n, n, 1], batch, m, k, n);
    let err = max_abs_diff(&got, &want);
    println!("impl {}, max abs err {err:e}", bmm.impl_name());
    assert!(err < 1e-4, "max abs error {err}");
}

#[test]
fn attention_scores_read_q_and_k_in_place() {
    // QKV linear output: [pixels, T, 3, heads, d_head] row-major, i.e. each
    // token's row is [q | k | v] of width 3d. Scores[p, h] = scale * Q_ph . K_ph^T.
    let engine = Engine::cpu().unwrap();
    let (pixels, t, heads, dh) = (3, 16, 4, 8);
    let d = heads * dh;
    let qkv = data(pixels * t * 3 * d, 5);
    let scale = 1.0 / (dh as f32).sqrt();
    let bmm = BatchedMatMul::new(
        &engine,
        BatchedMatMulSpec {
            batch: vec![pixels, heads],
            m: t,
            k: dh,
            n: t,
            // Q: dims [P, H, T, dh]
            src_strides: Some(vec![t * 3 * d, dh, 3 * d, 1]),
            // K^T: dims [P, H, dh, T], K starts at offset d (passed as a sub-slice).
            weights_strides: Some(vec![t * 3 * d, dh, 1, 3 * d]),
            dst_strides: None,
            data_type: DataType::F32,
            post_ops: vec![PostOp::Linear {
                alpha: scale,
                beta: 0.0,
            }],
            threads: 1,
        },
    )
    .unwrap();
    let mut got = vec![0f32; pixels * heads * t * t];
    bmm.execute(&qkv, &qkv[d..], &mut got, None).unwrap();

    let mut want = vec![0f32; pixels * heads * t * t];
    for p in 0..pixels {
        for h in 0..heads {
            for i in 0..t {
                for j in 0..t {
                    let mut acc = 0f64;
                    for c in 0..dh {
                        let q = qkv[(p * t + i) * 3 * d + h * dh + c];
                        let kk = qkv[(p * t + j) * 3 * d + d + h * dh + c];
                        acc += q as f64 * kk as f64;
                    }
                    want[((p * heads + h) * t + i) * t + j] = acc as f32 * scale;
                }
            }
        }
    }
    let err = max_abs_diff(&got, &want);
    println!("impl {}, max abs err {err:e}", bmm.impl_name());
    assert!(err < 1e-5, "max abs error {err}");
}

#[test]
fn attention_output_written_in_token_major_layout() {
    // out[p, t, h, :] = P[p, h] (T x T) . V[p, h] (T x dh), written straight
    // into a [pixels, T, d] buffer (dst strides), V read in place from QKV.
    let engine = Engine::cpu().unwrap();
    let (pixels, t, heads, dh) = (2, 8, 2, 4);
    let d = heads * dh;
    let probs = data(pixels * heads * t * t, 7);
    let qkv = data(pixels * t * 3 * d, 8);
    let bmm = BatchedMatMul::new(
        &engine,
        BatchedMatMulSpec {
            batch: vec![pixels, heads],
            m: t,
            k: t,
            n: dh,
            src_strides: None,
            weights_strides: Some(vec![t * 3 * d, dh, 3 * d, 1]),
            dst_strides: Some(vec![t * d, dh, d, 1]),
            data_type: DataType::F32,
            post_ops: vec![],
            threads: 1,
        },
    )
    .unwrap();
    let mut got = vec![0f32; pixels * t * d];
    bmm.execute(&probs, &qkv[2 * d..], &mut got, None).unwrap();
    let mut want = vec![0f32; pixels * t * d];
    for p in 0..pixels {
        for h in 0..heads {
            for i in 0..t {
                for c in 0..dh {
                    let mut acc = 0f64;
                    for j in 0..t {
                        acc += probs[((p * heads + h) * t + i) * t + j] as f64
                            * qkv[(p * t + j) * 3 * d + 2 * d + h * dh + c] as f64;
                    }
                    want[(p * t + i) * d + h * dh + c] = acc as f32;
                }
            }
        }
    }
    let err = max_abs_diff(&got, &want);
    println!("impl {}, max abs err {err:e}", bmm.impl_name());
    assert!(err < 1e-5, "max abs error {err}");
}
