//! `MatMul` (packed weights, bias, post-ops) against a naive Rust reference.

mod common;

use common::{data, linear, max_abs_diff, relu};
use onednn::{DataType, Engine, Error, MatMul, MatMulSpec, PostOp};

fn spec(k: usize, n: usize, post_ops: Vec<PostOp>) -> MatMulSpec {
    MatMulSpec {
        k,
        n,
        data_type: DataType::F32,
        dst_type: DataType::F32,
        post_ops,
        threads: 1,
    }
}

#[test]
fn bias_and_relu_match_reference_for_several_m() {
    let engine = Engine::cpu().unwrap();
    let (k, n) = (64, 48);
    let w = data(n * k, 1);
    let b = data(n, 2);
    let mm = MatMul::new(&engine, spec(k, n, vec![PostOp::Relu]), &w, Some(&b), 64).unwrap();
    // 64 is the hint; 37 and 256 create primitives on first use.
    for m in [64, 37, 1, 256] {
        let x = data(m * k, 3 + m as u64);
        let mut got = vec![f32::NAN; m * n];
        mm.execute(&x, &mut got, None).unwrap();
        let mut want = linear(&x, &w, Some(&b), m, k, n);
        relu(&mut want);
        let err = max_abs_diff(&got, &want);
        println!(
            "m {m}: impl {}, max abs err {err:e}",
            mm.prepare(m).unwrap()
        );
        assert!(err < 1e-4, "m {m}: max abs error {err}");
    }
    println!(
        "weights packed as {:?}; {} packed layout(s)",
        mm.weights_layout(),
        mm.packed_layouts()
    );
}

#[test]
fn encoder_sized_layer_matches_reference() {
    // d = 640 -> FFN 2560, M = 2 pixels x 24 tokens (small so the naive
    // reference stays quick in an unoptimised test build).
    let engine = Engine::cpu().unwrap();
    let (m, k, n) = (48, 640, 2560);
    let w = data(n * k, 10);
    let b = data(n, 11);
    let x = data(m * k, 12);
    let mm = MatMul::new(&engine, spec(k, n, vec![PostOp::Relu]), &w, Some(&b), m).unwrap();
    let mut got = vec![0f32; m * n];
    mm.execute(&x, &mut got, None).unwrap();
    let mut want = linear(&x, &w, Some(&b), m, k, n);
    relu(&mut want);
    let err = max_abs_diff(&got, &want);
    println!(
        "impl {}, weights {:?}, max abs err {err:e}",
        mm.prepare(m).unwrap(),
        mm.weights_layout()
    );
    assert!(err < 1e-3, "max abs error {err}");
}

#[test]
fn binary_add_residual_then_relu() {
    let engine = Engine::cpu().unwrap();
    let (m, k, n) = (40, 32, 24);
    let w = data(n * k, 20);
    let b = data(n, 21);
    let x = data(m * k, 22);
    let r = data(m * n, 23);
    let mm = MatMul::new(
        &engine,
        spec(k, n, vec![PostOp::BinaryAdd, PostOp::Relu]),
        &w,
        Some(&b),
        m,
    )
    .unwrap();
    let mut got = vec![0f32; m * n];
    mm.execute(&x, &mut got, Some(&r)).unwrap();
    let mut want = linear(&x, &w, Some(&b), m, k, n);
    for (y, r) in want.iter_mut().zip(&r) {
        *y += r;
    }
    relu(&mut want);
    let err = max_abs_diff(&got, &want);
    assert!(err < 1e-4, "max abs error {err}");
}

#[test]
fn sum_post_op_accumulates_into_dst() {
    let engine = Engine::cpu().unwrap();
    let (m, k, n) = (16, 24, 8);
    let w = data(n * k, 30);
    let x = data(m * k, 31);
    let r = data(m * n, 32);
    let mm = MatMul::new(&engine, spec(k, n, vec![PostOp::Sum]), &w, None, m).unwrap();
    let mut got = r.clone();
    mm.execute(&x, &mut got, None).unwrap();
    let mut want = linear(&x, &w, None, m, k, n);
    for (y, r) in want.iter_mut().zip(&r) {
        *y += r;
    }
    let err = max_abs_diff(&got, &want);
    assert!(err < 1e-4, "max abs error {err}");
}

#[test]
fn caller_mistakes_are_errors_not_crashes() {
    let engine = Engine::cpu().unwrap();
    let (k, n) = (8, 4);
    let w = data(n * k, 40);
    assert!(matches!(
        MatMul::new(&engine, spec(k, n, vec![]), &w[..5], None, 4),
        Err(Error::Length { .. })
    ));
    let mm = MatMul::new(&engine, spec(k, n, vec![PostOp::BinaryAdd]), &w, None, 4).unwrap();
    let x = data(4 * k, 41);
    let mut dst = vec![0f32; 4 * n];
    // Missing residual.
    assert!(matches!(
        mm.execute(&x, &mut dst, None),
        Err(Error::Invalid { .. })
    ));
    // src not a whole number of rows; dst too short.
    let r = vec![0f32; 4 * n];
    assert!(matches!(
        mm.execute(&x[..7], &mut dst, Some(&r)),
        Err(Error::Invalid { .. })
    ));
    assert!(matches!(
        mm.execute(&x, &mut dst[..3], Some(&r)),
        Err(Error::Length { .. })
    ));
    // bf16 src into an f32 primitive.
    let xb = onednn::to_bf16_vec(&x);
    assert!(matches!(
        mm.execute(&xb, &mut dst, Some(&r)),
        Err(Error::DataType { .. })
    ));
    // Empty batch is a no-op.
    mm.execute::<f32, f32>(&[], &mut [], Some(&[])).unwrap();
}

#[test]
fn primitives_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<MatMul>();
    assert_send_sync::<onednn::BatchedMatMul>();
    assert_send_sync::<Engine>();
}
