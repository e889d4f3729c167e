//! Measuring: this machine's sgemm rate (the peer every figure is compared
//! with), and an encoder's pixels/s and GFLOP/s on a tile.

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use crate::backend::BackendChoice;
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::encode::Encoder;
use crate::error::Result;
use crate::model::Modality;
use crate::profile::DeviceProfile;
use crate::sequence::bin_len;
use crate::tile::TileInputs;

/// Model FLOPs to encode `tile` (padding tokens included, as they are computed).
pub fn tile_flops(cfg: &ModelConfig, tile: &TileInputs) -> f64 {
    let d = cfg.d_model() as f64;
    let head = 2.0 * (2.0 * d * 4.0 * d + 4.0 * d * cfg.repr_dim as f64);
    let mut total = 0.0;
    for p in 0..tile.pixels() {
        let n2 = tile.valid_count(Modality::S2, p);
        let n1 = tile.valid_count(Modality::S1, p);
        if n2 == 0 && n1 == 0 {
            continue;
        }
        for (m, n) in [(Modality::S2, n2), (Modality::S1, n1)] {
            let len = bin_len(n);
            total += len as f64 * cfg.flops_per_token(m.bands(), len);
        }
        total += head;
    }
    total
}

/// GFLOP/s of `threads` threads that each build one step with `setup(t)`
/// and repeat it (at least once) for about `seconds`; a step is
/// `flops_per_step` FLOPs.
fn rate_on_threads<S, F>(threads: usize, seconds: f64, flops_per_step: f64, setup: S) -> f64
where
    S: Fn(usize) -> F + Sync,
    F: FnMut(),
{
    let start = Instant::now();
    let steps: usize = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads.max(1))
            .map(|t| {
                let setup = &setup;
                s.spawn(move || {
                    let mut step = setup(t);
                    let mut n = 0;
                    while n == 0 || start.elapsed().as_secs_f64() < seconds {
                        step();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("bench thread does not panic"))
            .sum()
    });
    steps as f64 * flops_per_step / start.elapsed().as_secs_f64() / 1e9
}

/// Sustained single-precision GEMM rate of `threads` threads, each running
/// its own single-threaded `gemm` of a transformer-FFN shape (512 x 640 x
/// 2560) for about `seconds`. GFLOP/s.
pub fn gemm_rate(threads: usize, seconds: f64) -> f64 {
    let (m, k, n) = (512usize, 640usize, 2560usize);
    rate_on_threads(threads, seconds, 2.0 * (m * k * n) as f64, |t| {
        let a: Vec<f32> = (0..m * k).map(|i| ((i + t) % 7) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect();
        let mut c = vec![0f32; m * n];
        move || {
            // SAFETY: a, b, c hold m*k, k*n, m*n elements, row-major.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    c.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr(),
                    1,
                    k as isize,
                    b.as_ptr(),
                    1,
                    n as isize,
                    0.0f32,
                    1.0f32,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
            std::hint::black_box(&c);
        }
    })
}

/// This machine's f32 FMA ceiling with `threads` threads (GFLOP/s): twelve
/// independent chains of 8-wide fused multiply-adds per thread, all in
/// registers, for about `seconds`. No GEMM can beat it; it says how much of
/// the chip the sgemm roofline already uses. `None` where the CPU has no
/// AVX2 and FMA (or is not x86-64).
pub fn fma_peak_rate(threads: usize, seconds: f64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return None;
        }
        const ITERS: u64 = 1 << 20;
        let flops = (ITERS * FMA_FLOPS_PER_ITER) as f64;
        Some(rate_on_threads(threads, seconds, flops, |_| {
            || {
                // SAFETY: AVX2 and FMA were detected above.
                std::hint::black_box(unsafe { fma_chains(ITERS) });
            }
        }))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (threads, seconds);
        None
    }
}

/// 12 chains x 8 lanes x 2 FLOPs.
#[cfg(target_arch = "x86_64")]
const FMA_FLOPS_PER_ITER: u64 = 12 * 8 * 2;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_chains(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    // Twelve chains cover the FMA latency (4-5 cycles) on two pipes.
    let mut acc = [_mm256_set1_ps(1.0); 12];
    let a = _mm256_set1_ps(0.999_999);
    let b = _mm256_set1_ps(1e-7);
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let mut lanes = [0f32; 8];
    let mut sum = _mm256_setzero_ps();
    for x in acc {
        sum = _mm256_add_ps(sum, x);
    }
    // SAFETY: lanes holds 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
    lanes.iter().sum()
}

/// oneDNN's `dnnl_sgemm` rate with `threads` threads (GFLOP/s, best of
/// several runs on `onednn::RATE_SHAPE`): the roofline every backend is
/// measured against (BENCHMARKS.md's target: at least 85 % of it). `None`
/// when the `onednn` feature is off.
pub fn dnnl_sgemm_rate(threads: usize) -> Result<Option<f64>> {
    #[cfg(all(feature = "onednn", target_os = "linux"))]
    {
        onednn::sgemm_rate(threads)
            .map(Some)
            .map_err(|e| crate::error::EncodeError::backend("onednn", e))
    }
    #[cfg(not(all(feature = "onednn", target_os = "linux")))]
    {
        let _ = threads;
        Ok(None)
    }
}

/// One backend's measured speed on one tile.
#[derive(Debug, Clone)]
pub struct BenchResult {
    pub backend: String,
    pub threads: usize,
    pub chunk_pixels: usize,
    pub block_pixels: usize,
    pub pixels: usize,
    pub seconds: f64,
    pub pixels_per_s: f64,
    pub gflops: f64,
}

/// Encode `tile` `reps` times (after one warm-up pass when `warmup`) and report the best pass.
pub fn bench_encoder(
    ckpt: &Checkpoint,
    choice: BackendChoice,
    profile: DeviceProfile,
    tile: &TileInputs,
    reps: usize,
    warmup: bool,
) -> Result<BenchResult> {
    let enc = Encoder::from_checkpoint(ckpt, choice, profile.clone())?;
    let flops = tile_flops(enc.config(), tile);
    let cancel = AtomicBool::new(false);
    if warmup {
        enc.encode_tile(tile, &|_, _| {}, &cancel)?;
    }
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        enc.encode_tile(tile, &|_, _| {}, &cancel)?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(BenchResult {
        backend: enc.backend_name().to_string(),
        threads: profile.threads,
        chunk_pixels: profile.chunk_pixels,
        block_pixels: profile.block_pixels,
        pixels: tile.pixels(),
        seconds: best,
        pixels_per_s: tile.pixels() as f64 / best,
        gflops: flops / best / 1e9,
    })
}

/// `/proc/loadavg`'s 1, 5 and 15 minute figures: benchmark numbers on a
/// shared machine mean little without them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// This process's peak resident set (`VmHWM` of `/proc/self/status`, KiB):
/// what an encode costs a shared box; `None` off Linux.
pub fn peak_resident_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `tune`'s chunk sizes on a CPU backend: a chunk only bounds memory there
/// (threads take blocks of it), so the sweep stays small.
pub const CPU_CHUNKS: &[usize] = &[32, 64, 128, 256, 512];

/// `tune`'s chunk sizes on a GPU: one GEMM per chunk, and the best differs by
/// card: 64 pixels on an L4 in the field, 1,024 on an A30, 4,096 on an H200
/// in f32 (issue 16).
pub const GPU_CHUNKS: &[usize] = &[64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384];

/// `chunks` in order without those that would time the same thing again: a
/// chunk of `pixels` or more holds the whole tile, so only the first such
/// size is kept.
pub fn distinct_chunks(chunks: &[usize], pixels: usize) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    let mut whole = false;
    for &c in chunks {
        let c = c.max(1);
        if out.contains(&c) || (whole && c >= pixels) {
            continue;
        }
        whole |= c >= pixels;
        out.push(c);
    }
    out
}

/// Sweep chunk and block sizes; returns every measurement, fastest first.
pub fn tune(
    ckpt: &Checkpoint,
    choice: BackendChoice,
    base: &DeviceProfile,
    tile: &TileInputs,
    chunks: &[usize],
    blocks: &[usize],
    on_result: &mut dyn FnMut(&BenchResult),
) -> Result<Vec<BenchResult>> {
    let mut results = Vec::new();
    for &chunk in chunks {
        for &block in blocks {
            if block > chunk {
                continue;
            }
            let p = DeviceProfile {
                chunk_pixels: chunk,
                block_pixels: block,
                ..base.clone()
            };
            let r = bench_encoder(ckpt, choice, p, tile, 1, false)?;
            on_result(&r);
            results.push(r);
        }
    }
    results.sort_by(|a, b| b.pixels_per_s.total_cmp(&a.pixels_per_s));
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpu_sweep_reaches_small_and_large_chunks() {
        // The best sizes seen in the field must be among those tried.
        for best in [64, 1024, 4096] {
            assert!(GPU_CHUNKS.contains(&best), "{best}");
        }
        assert_eq!(
            distinct_chunks(GPU_CHUNKS, 1000),
            vec![64, 128, 256, 512, 1024]
        );
        assert_eq!(distinct_chunks(&[8, 4, 8, 0], 16), vec![8, 4, 1]);
    }
}
