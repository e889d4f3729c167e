//! bf16 src and weights, f32 dst, against an f64 reference on the bf16-rounded inputs.
//!
//! Where the CPU has no native bf16 (`bf16_supported()` false) oneDNN may still
//! run bf16 on a fallback implementation; the test then checks that path for
//! correctness only, at a small size, and says so. If oneDNN has no bf16
//! matmul at all here, the test skips itself saying so.

mod common;

use common::{data, linear, max_abs_diff, relu};
use onednn::{
    bf16_supported, to_bf16_vec, Bf16, DataType, Engine, Error, MatMul, MatMulSpec, PostOp, Status,
};

fn round_trip(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| Bf16::from_f32(x).to_f32()).collect()
}

#[test]
fn bf16_matmul_within_bf16_tolerance() {
    let native = bf16_supported();
    let (m, k, n) = if native {
        (192, 640, 256)
    } else {
        (24, 64, 32)
    };
    println!(
        "isa {}, cpu features {:?}, bf16 native: {native}",
        onednn::effective_isa(),
        onednn::CpuFeatures::detect()
    );
    let engine = Engine::cpu().unwrap();
    let w = data(n * k, 1);
    let b = data(n, 2);
    let x = data(m * k, 3);
    let r = data(m * n, 4);
    let spec = MatMulSpec {
        k,
        n,
        data_type: DataType::Bf16,
        dst_type: DataType::F32,
        post_ops: vec![PostOp::BinaryAdd, PostOp::Relu],
        threads: 1,
    };
    let mm = match MatMul::new(&engine, spec, &w, Some(&b), m) {
        Ok(mm) => mm,
        Err(Error::Dnnl {
            status: Status::Unimplemented,
            call,
        }) if !native => {
            println!("SKIP: no native bf16 on this CPU and oneDNN has no bf16 matmul fallback ({call} unimplemented)");
            return;
        }
        Err(e) => panic!("bf16 matmul creation failed: {e}"),
    };
    let impl_name = mm.prepare(m).unwrap();
    if !native {
        println!(
            "bf16 not native here: checking oneDNN's fallback ({impl_name}) for correctness only"
        );
    }
    let xb = to_bf16_vec(&x);
    let mut got = vec![0f32; m * n];
    mm.execute(&xb, &mut got, Some(&r)).unwrap();

    // Exact products of the bf16-rounded operands, accumulated in f64: what an
    // f32-accumulating bf16 kernel approximates to within f32 rounding.
    let mut want = linear(&round_trip(&x), &round_trip(&w), Some(&b), m, k, n);
    for (y, r) in want.iter_mut().zip(&r) {
        *y += r;
    }
    relu(&mut want);
    let err_rounded = max_abs_diff(&got, &want);
    // Against full-precision inputs: bounded by bf16's 2^-8 relative rounding
    // of each operand, |x|,|w| < 1, summed over k.
    let mut exact = linear(&x, &w, Some(&b), m, k, n);
    for (y, r) in exact.iter_mut().zip(&r) {
        *y += r;
    }
    relu(&mut exact);
    let err_exact = max_abs_diff(&got, &exact);
    println!("impl {impl_name}: max abs err vs bf16-rounded reference {err_rounded:e}, vs f32 reference {err_exact:e}");
    assert!(
        err_rounded < 1e-3,
        "bf16 matmul differs from the bf16-rounded reference by {err_rounded}"
    );
    let bound = 2.0 * k as f32 / 256.0;
    assert!(
        err_exact < bound.min(0.25),
        "bf16 matmul differs from the f32 reference by {err_exact}"
    );
}

#[test]
fn wrong_element_type_is_rejected() {
    let engine = Engine::cpu().unwrap();
    let spec = MatMulSpec {
        k: 8,
        n: 8,
        data_type: DataType::Bf16,
        dst_type: DataType::F32,
        post_ops: vec![],
        threads: 1,
    };
    match MatMul::new(&engine, spec, &data(64, 1), None, 8) {
        Ok(mm) => {
            let mut dst = vec![0f32; 64];
            assert!(matches!(
                mm.execute(&data(64, 2), &mut dst, None),
                Err(Error::DataType { .. })
            ));
        }
        Err(e) => println!("SKIP: no bf16 matmul here ({e})"),
    }
}

/// A bf16 dst holds exactly the f32 dst's result rounded to nearest even
/// (post-ops applied first), for each post-op the encoder uses, at a shape
/// like its FFN; a dst of the other type is refused.
#[test]
fn bf16_dst_is_the_f32_result_rounded() {
    if !bf16_supported() {
        println!("SKIP: no native bf16 on this CPU");
        return;
    }
    let engine = Engine::cpu().unwrap();
    let (m, k, n) = (128, 640, 320);
    let (w, b, x, r) = (data(n * k, 1), data(n, 2), data(m * k, 3), data(m * n, 4));
    let xb = to_bf16_vec(&x);
    for post_ops in [vec![], vec![PostOp::Relu], vec![PostOp::BinaryAdd]] {
        let make = |dst_type| {
            let spec = MatMulSpec {
                k,
                n,
                data_type: DataType::Bf16,
                dst_type,
                post_ops: post_ops.clone(),
                threads: 1,
            };
            MatMul::new(&engine, spec, &w, Some(&b), m).unwrap()
        };
        let (wide, narrow) = (make(DataType::F32), make(DataType::Bf16));
        let residual = post_ops.contains(&PostOp::BinaryAdd).then_some(&r[..]);
        let mut f = vec![0f32; m * n];
        wide.execute(&xb, &mut f, residual).unwrap();
        let mut h = vec![Bf16(0); m * n];
        narrow.execute(&xb, &mut h, residual).unwrap();
        let want = to_bf16_vec(&f);
        let differ = h.iter().zip(&want).filter(|(a, b)| a != b).count();
        println!(
            "{post_ops:?}: {} ({differ} of {} differ)",
            narrow.prepare(m).unwrap(),
            m * n
        );
        assert_eq!(differ, 0, "{post_ops:?}");
        assert!(matches!(
            narrow.execute(&xb, &mut f, residual),
            Err(Error::DataType {
                what: "matmul dst",
                ..
            })
        ));
    }
}
