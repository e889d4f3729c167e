//! Measures this machine's oneDNN GEMM rate, the roofline the encoder's benchmark reports against.

use std::time::{Duration, Instant};

use crate::bf16::to_bf16_vec;
use crate::engine::Engine;
use crate::error::{check, Result};
use crate::matmul::{MatMul, MatMulSpec};
use crate::memory::DataType;
use crate::sys;
use crate::threading::ThreadScope;

/// The problem both rates use: 2048 x 1024 x 1024 (4.3 GFLOP), large enough
/// that packing and threading overheads are small, small enough (20 MB) that
/// one measurement takes well under a second on two cores.
pub const RATE_SHAPE: (usize, usize, usize) = (2048, 1024, 1024);

/// `dnnl_sgemm` GFLOP/s on [`RATE_SHAPE`] with `threads` OpenMP threads:
/// best of several runs after a warm-up (a roofline, so the best, not the mean).
pub fn sgemm_rate(threads: usize) -> Result<f64> {
    let (m, k, n) = RATE_SHAPE;
    let a = pattern(m * k);
    let b = pattern(k * n);
    let mut c = vec![0f32; m * n];
    let _threads = ThreadScope::new(threads.max(1));
    let best = best_time(|| {
        // SAFETY: row-major A (m x k), B (k x n), C (m x n) with leading
        // dimensions k, n, n; all three buffers have exactly those sizes.
        check("dnnl_sgemm", unsafe {
            sys::dnnl_sgemm(
                b'N' as _,
                b'N' as _,
                m as i64,
                n as i64,
                k as i64,
                1.0,
                a.as_ptr(),
                k as i64,
                b.as_ptr(),
                n as i64,
                0.0,
                c.as_mut_ptr(),
                n as i64,
            )
        })
    })?;
    Ok(gflops(m, k, n, best))
}

/// GFLOP/s of this crate's [`MatMul`] (pre-packed weights, no post-ops) on
/// [`RATE_SHAPE`] for `data_type`, with `threads` threads: what the encoder's
/// layers can reach at best. For bf16 on a CPU without native bf16 this
/// measures oneDNN's fallback, which is slow.
pub fn matmul_rate(threads: usize, data_type: DataType) -> Result<f64> {
    let (m, k, n) = RATE_SHAPE;
    let engine = Engine::cpu()?;
    let spec = MatMulSpec {
        k,
        n,
        data_type,
        dst_type: DataType::F32,
        post_ops: vec![],
        threads: threads.max(1),
    };
    let mm = MatMul::new(&engine, spec, &pattern(n * k), None, m)?;
    let src = pattern(m * k);
    let mut dst = vec![0f32; m * n];
    let best = match data_type {
        DataType::F32 => best_time(|| mm.execute(&src, &mut dst, None))?,
        DataType::Bf16 => {
            let src = to_bf16_vec(&src);
            best_time(|| mm.execute(&src, &mut dst, None))?
        }
    };
    Ok(gflops(m, k, n, best))
}

fn gflops(m: usize, k: usize, n: usize, t: Duration) -> f64 {
    2.0 * (m * k * n) as f64 / t.as_secs_f64() / 1e9
}

/// Best wall time of `f` over at least 3 runs and 0.3 s, after one warm-up.
fn best_time(mut f: impl FnMut() -> Result<()>) -> Result<Duration> {
    f()?;
    let start = Instant::now();
    let mut best = Duration::MAX;
    let mut runs = 0;
    while runs < 3 || start.elapsed() < Duration::from_millis(300) {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed());
        runs += 1;
    }
    Ok(best)
}

/// Deterministic values in [-1, 1) so no denormals or infinities slow the kernel.
fn pattern(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 % 2000) as f32 / 1000.0) - 1.0)
        .collect()
}
