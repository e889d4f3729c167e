//! oneDNN 3.x opened at run time (`onednn::v3`) next to the linked 2.x.
//!
//! Needs a `libdnnl.so.3`: `scripts/test.sh` fetches oneDNN 3.2 (PyPI's
//! `onednn-cpu-gomp`), names it in `FLOTILLA_ONEDNN3_TEST` (which these
//! tests hand to `onednn::v3` as `FLOTILLA_ONEDNN3`, so the rest of the
//! suite keeps the linked 2.x) and sets `FLOTILLA_REQUIRE_ONEDNN3`, which
//! makes its absence a failure; without that variable a machine with no
//! 3.x skips these tests, saying so.

mod common;

use common::{data, linear, max_abs_diff};
use onednn::v3::{self, BatchedMatMul3, MatMul3};
use onednn::{BatchedMatMul, BatchedMatMulSpec, DataType, Engine, MatMul, MatMulSpec, PostOp};

fn runtime() -> Option<&'static v3::Runtime3> {
    static SETUP: std::sync::Once = std::sync::Once::new();
    // Before the first look-up, and once: every test comes through here.
    SETUP.call_once(|| {
        if let Some(p) = std::env::var_os("FLOTILLA_ONEDNN3_TEST") {
            std::env::set_var("FLOTILLA_ONEDNN3", p);
        }
    });
    match v3::runtime() {
        Some(rt) => Some(rt),
        None => {
            let why = v3::unavailable_reason().unwrap_or_default();
            assert!(
                std::env::var_os("FLOTILLA_REQUIRE_ONEDNN3").is_none(),
                "FLOTILLA_REQUIRE_ONEDNN3 is set but oneDNN 3.x did not load: {why}"
            );
            eprintln!("oneDNN 3.x not loaded ({why}): skipped");
            None
        }
    }
}

#[test]
fn loads_as_3x_beside_the_linked_2x() {
    let Some(rt) = runtime() else { return };
    let v = rt.version();
    assert_eq!(v.major, 3, "{v:?}");
    // The linked library is still 2.x, untouched by the 3.x one's symbols.
    assert_eq!(onednn::version().major, 2);
    eprintln!(
        "oneDNN {}.{}.{} from {}, ISA {}",
        v.major,
        v.minor,
        v.patch,
        rt.path().display(),
        rt.effective_isa()
    );
}

#[test]
fn matmul3_matches_the_reference_and_2x_for_every_post_op() {
    let Some(rt) = runtime() else { return };
    let engine = Engine::cpu().unwrap();
    let (k, n) = (48, 80);
    let w = data(n * k, 1);
    let bias = data(n, 2);
    for post_ops in [
        vec![],
        vec![PostOp::Relu],
        vec![PostOp::BinaryAdd],
        vec![PostOp::Linear {
            alpha: 0.5,
            beta: -1.0,
        }],
    ] {
        let spec = MatMulSpec {
            k,
            n,
            data_type: DataType::F32,
            dst_type: DataType::F32,
            post_ops: post_ops.clone(),
            threads: 1,
        };
        let mm3 = MatMul3::new(rt, spec.clone(), &w, Some(&bias), 64).unwrap();
        let mm2 = MatMul::new(&engine, spec, &w, Some(&bias), 64).unwrap();
        // Several M, one of them new after construction (a second primitive).
        for m in [64, 7, 130] {
            let x = data(m * k, 3 + m as u64);
            let res = data(m * n, 4);
            let residual = post_ops.contains(&PostOp::BinaryAdd).then_some(&res[..]);
            let mut want = linear(&x, &w, Some(&bias), m, k, n);
            for (i, v) in want.iter_mut().enumerate() {
                for op in &post_ops {
                    *v = match op {
                        PostOp::Relu => v.max(0.0),
                        PostOp::BinaryAdd => *v + res[i],
                        PostOp::Linear { alpha, beta } => alpha * *v + beta,
                        PostOp::Sum => unreachable!(),
                    };
                }
            }
            let mut got3 = vec![f32::NAN; m * n];
            mm3.execute(&x, &mut got3, residual).unwrap();
            let mut got2 = vec![f32::NAN; m * n];
            mm2.execute(&x, &mut got2, residual).unwrap();
            let d = max_abs_diff(&got3, &want);
            assert!(
                d <= 1e-4,
                "{post_ops:?} m {m}: 3.x off the reference by {d}"
            );
            let d = max_abs_diff(&got3, &got2);
            assert!(d <= 1e-4, "{post_ops:?} m {m}: 3.x and 2.x differ by {d}");
        }
        let name = mm3.prepare(64).unwrap();
        eprintln!("{post_ops:?}: {name}");
        assert!(!name.starts_with("ref"), "{post_ops:?}: 3.x chose {name}");
    }
}

#[test]
fn matmul3_refuses_what_matmul_refuses() {
    let Some(rt) = runtime() else { return };
    let spec = MatMulSpec {
        k: 4,
        n: 3,
        data_type: DataType::F32,
        dst_type: DataType::F32,
        post_ops: vec![PostOp::BinaryAdd],
        threads: 1,
    };
    let w = data(12, 5);
    assert!(MatMul3::new(rt, spec.clone(), &w[..11], None, 2).is_err());
    let mm = MatMul3::new(rt, spec, &w, None, 2).unwrap();
    let mut out = vec![0f32; 6];
    // A ragged source, and a missing residual, are errors, not calls.
    let e = mm
        .execute(&data(7, 6), &mut out, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("whole number of rows"), "{e}");
    let e = mm
        .execute(&data(8, 6), &mut out, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("residual"), "{e}");
    mm.execute(&data(8, 6), &mut out, Some(&data(6, 7)))
        .unwrap();
}

#[test]
fn bf16_runs_where_3x_says_the_cpu_has_it() {
    let Some(rt) = runtime() else { return };
    let (k, n, m) = (64, 32, 16);
    let w = data(n * k, 8);
    let spec = MatMulSpec {
        k,
        n,
        data_type: DataType::Bf16,
        dst_type: DataType::F32,
        post_ops: vec![],
        threads: 1,
    };
    let made = MatMul3::new(rt, spec, &w, None, m);
    if !rt.bf16_supported() {
        eprintln!(
            "no bf16 on this CPU ({}): 3.x may refuse it",
            rt.effective_isa()
        );
        return;
    }
    let mm = made.unwrap();
    let x = data(m * k, 9);
    let xb = onednn::to_bf16_vec(&x);
    let mut out = vec![0f32; m * n];
    mm.execute(&xb, &mut out, None).unwrap();
    let want = linear(&x, &w, None, m, k, n);
    let d = max_abs_diff(&out, &want);
    assert!(d <= 0.1, "bf16 off the f32 reference by {d}");
    eprintln!("bf16: {}", mm.prepare(m).unwrap());
}

/// As the 2.x test: a bf16 dst is the f32 dst's result rounded to nearest even.
#[test]
fn bf16_dst_is_the_f32_result_rounded_on_3x() {
    let Some(rt) = runtime() else { return };
    if !rt.bf16_supported() {
        eprintln!("no bf16 on this CPU ({}): skipped", rt.effective_isa());
        return;
    }
    let (m, k, n) = (128, 640, 320);
    let (w, b, x, r) = (data(n * k, 1), data(n, 2), data(m * k, 3), data(m * n, 4));
    let xb = onednn::to_bf16_vec(&x);
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
            MatMul3::new(rt, spec, &w, Some(&b), m).unwrap()
        };
        let (wide, narrow) = (make(DataType::F32), make(DataType::Bf16));
        let residual = post_ops.contains(&PostOp::BinaryAdd).then_some(&r[..]);
        let mut f = vec![0f32; m * n];
        wide.execute(&xb, &mut f, residual).unwrap();
        let mut h = vec![onednn::Bf16(0); m * n];
        narrow.execute(&xb, &mut h, residual).unwrap();
        let want = onednn::to_bf16_vec(&f);
        let differ = h.iter().zip(&want).filter(|(a, b)| a != b).count();
        eprintln!(
            "{post_ops:?}: {} ({differ} of {} differ)",
            narrow.prepare(m).unwrap(),
            m * n
        );
        assert_eq!(differ, 0, "{post_ops:?}");
    }
}

/// `BatchedMatMul3` gives 2.x's `BatchedMatMul` results on attention's
/// shapes: scaled Q.K^T read in place through strides, and P.V written
/// into a token-major layout; bad buffers are refused as 2.x refuses them.
#[test]
fn batched_matmul3_matches_2x_on_attention_shapes() {
    let Some(rt) = runtime() else { return };
    let engine = Engine::cpu().unwrap();
    let (pixels, t, heads, dh) = (3, 16, 4, 8);
    let d = heads * dh;
    let qkv = data(pixels * t * 3 * d, 5);
    let probs = data(pixels * heads * t * t, 6);
    let scores_spec = BatchedMatMulSpec {
        batch: vec![pixels, heads],
        m: t,
        k: dh,
        n: t,
        src_strides: Some(vec![t * 3 * d, dh, 3 * d, 1]),
        weights_strides: Some(vec![t * 3 * d, dh, 1, 3 * d]),
        dst_strides: None,
        data_type: DataType::F32,
        post_ops: vec![PostOp::Linear {
            alpha: 0.25,
            beta: 0.0,
        }],
        threads: 1,
    };
    let values_spec = BatchedMatMulSpec {
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
    };
    for (spec, src, weights, out_len) in [
        (scores_spec, &qkv[..], &qkv[d..], pixels * heads * t * t),
        (values_spec, &probs[..], &qkv[2 * d..], pixels * t * d),
    ] {
        let two = BatchedMatMul::new(&engine, spec.clone()).unwrap();
        let three = BatchedMatMul3::new(rt, spec).unwrap();
        let (mut want, mut got) = (vec![0f32; out_len], vec![0f32; out_len]);
        two.execute(src, weights, &mut want, None).unwrap();
        three.execute(src, weights, &mut got, None).unwrap();
        let d = max_abs_diff(&got, &want);
        eprintln!(
            "3.x {} vs 2.x {}: {d:e}",
            three.impl_name(),
            two.impl_name()
        );
        assert!(d <= 1e-5, "3.x off 2.x by {d}");
        assert!(three
            .execute(src, weights, &mut got[..out_len - 1], None)
            .is_err());
        let bf: Vec<onednn::Bf16> = onednn::to_bf16_vec(src);
        assert!(three.execute(&bf, &bf, &mut got, None).is_err());
    }
}

/// A `BinaryAdd` residual on a batched matmul whose dst is strided
/// (token-major, as attention's P.V writes): the residual is dense f32 of
/// dst's dims, added element for element; one of the wrong length, a
/// missing one and one the post-ops do not take are refused. On 2.x, and
/// on 3.x where it loads.
#[test]
fn batched_residual_is_dense_of_dst_dims_on_2x_and_3x() {
    let engine = Engine::cpu().unwrap();
    let (pixels, heads, t, dh) = (2, 3, 5, 4);
    let d = heads * dh;
    let spec = |post_ops| BatchedMatMulSpec {
        batch: vec![pixels, heads],
        m: t,
        k: t,
        n: dh,
        src_strides: None,
        weights_strides: None,
        dst_strides: Some(vec![t * d, dh, d, 1]),
        data_type: DataType::F32,
        post_ops,
        threads: 1,
    };
    let src = data(pixels * heads * t * t, 7);
    let weights = data(pixels * heads * t * dh, 8);
    let res = data(pixels * heads * t * dh, 9);
    let out_len = pixels * t * d;
    type Exec<'a> = Box<dyn Fn(&mut [f32], Option<&[f32]>) -> onednn::Result<()> + 'a>;
    let (plain2, add2) = (
        BatchedMatMul::new(&engine, spec(vec![])).unwrap(),
        BatchedMatMul::new(&engine, spec(vec![PostOp::BinaryAdd])).unwrap(),
    );
    let threes = runtime().map(|rt| {
        (
            BatchedMatMul3::new(rt, spec(vec![])).unwrap(),
            BatchedMatMul3::new(rt, spec(vec![PostOp::BinaryAdd])).unwrap(),
        )
    });
    let mut runs: Vec<(&str, Exec, Exec)> = Vec::new();
    runs.push((
        "2.x",
        Box::new(|dst, r| plain2.execute(&src, &weights, dst, r)),
        Box::new(|dst, r| add2.execute(&src, &weights, dst, r)),
    ));
    if let Some((plain3, add3)) = &threes {
        runs.push((
            "3.x",
            Box::new(|dst, r| plain3.execute(&src, &weights, dst, r)),
            Box::new(|dst, r| add3.execute(&src, &weights, dst, r)),
        ));
    }
    for (version, plain, add) in &runs {
        let mut want = vec![0f32; out_len];
        plain(&mut want, None).unwrap();
        let mut got = vec![0f32; out_len];
        add(&mut got, Some(&res)).unwrap();
        for p in 0..pixels {
            for h in 0..heads {
                for i in 0..t {
                    for j in 0..dh {
                        let at = p * t * d + i * d + h * dh + j;
                        let r = res[((p * heads + h) * t + i) * dh + j];
                        assert!(
                            (got[at] - (want[at] + r)).abs() <= 1e-5,
                            "{version}: ({p}, {h}, {i}, {j}): {} != {} + {r}",
                            got[at],
                            want[at]
                        );
                    }
                }
            }
        }
        let short = add(&mut got, Some(&res[..res.len() - 1])).unwrap_err();
        assert!(short.to_string().contains("residual"), "{version}: {short}");
        let missing = add(&mut got, None).unwrap_err();
        assert!(
            missing.to_string().contains("BinaryAdd"),
            "{version}: {missing}"
        );
        let unasked = plain(&mut got, Some(&res)).unwrap_err();
        assert!(
            unasked.to_string().contains("BinaryAdd"),
            "{version}: {unasked}"
        );
    }
}
