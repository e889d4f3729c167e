//! Measuring: this machine's sgemm rate (the peer every figure is compared
//! with), and an encoder's pixels/s and GFLOP/s on a tile.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use crate::backend::{
    Backend, BackendChoice, KeptRows, KeptWindows, PendingBackbone, PendingHead, SequenceBatch,
    SlotPool,
};
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::encode::Encoder;
use crate::error::{EncodeError, Result};
use crate::model::{Modality, StudentWeights};
use crate::output::{OutputOptions, OutputWriter};
use crate::profile::DeviceProfile;
use crate::sequence::bin_len;
use crate::synth::random_checkpoint;
use crate::tile::TileInputs;
use crate::tile_reader::TileReader;

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
        // SAFETY: AVX2 and FMA were detected above.
        Some(unsafe { chains_rate(threads, seconds, 1 << 20, FMA_FLOPS_PER_ITER, fma_chains) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (threads, seconds);
        None
    }
}

/// GFLOP/s of `chains` (register-only arithmetic chains, `flops_per_iter`
/// FLOPs an iteration) run for `iters` iterations a call on `threads`
/// threads for about `seconds`: the ceilings above.
///
/// # Safety
/// The CPU must have the features `chains` is compiled for.
#[cfg(target_arch = "x86_64")]
unsafe fn chains_rate(
    threads: usize,
    seconds: f64,
    iters: u64,
    flops_per_iter: u64,
    chains: unsafe fn(u64) -> f32,
) -> f64 {
    let flops = (iters * flops_per_iter) as f64;
    rate_on_threads(threads, seconds, flops, |_| {
        move || {
            // SAFETY: the caller vouches for the features.
            std::hint::black_box(unsafe { chains(iters) });
        }
    })
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

/// This machine's bf16 dot-product ceiling with `threads` threads
/// (GFLOP/s, f32 accumulation): twelve independent chains of 512-bit
/// `vdpbf16ps` per thread (16 lanes, each two bf16 products summed into
/// f32: 64 FLOPs an instruction), all in registers. What a bf16 GEMM on
/// AVX512-BF16 (oneDNN's `avx512_core_bf16`) cannot beat; AMX's tile
/// instructions are not counted. `None` where the CPU has no AVX512-BF16.
pub fn bf16_dot_peak_rate(threads: usize, seconds: f64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")) {
            return None;
        }
        // SAFETY: AVX-512F and AVX512-BF16 were detected above.
        Some(unsafe {
            chains_rate(
                threads,
                seconds,
                1 << 19,
                BF16_DOT_FLOPS_PER_ITER,
                bf16_dot_chains,
            )
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (threads, seconds);
        None
    }
}

/// 12 chains x 16 lanes x 2 products x 2 FLOPs.
#[cfg(target_arch = "x86_64")]
const BF16_DOT_FLOPS_PER_ITER: u64 = 12 * 16 * 2 * 2;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn bf16_dot_chains(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    // Twelve chains cover `vdpbf16ps`'s latency (about 6 cycles) on two
    // pipes. Products of 1e-3 keep the sums finite for any `iters`.
    let mut acc = [_mm512_set1_ps(1.0); 12];
    let a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3), _mm512_set1_ps(1e-3));
    let b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3), _mm512_set1_ps(1e-3));
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm512_dpbf16_ps(*x, a, b);
        }
    }
    let mut sum = _mm512_setzero_ps();
    for x in acc {
        sum = _mm512_add_ps(sum, x);
    }
    _mm512_reduce_add_ps(sum)
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

/// A backend that computes nothing: zeros of the shapes the model's would
/// return. An encode through it costs what the host side of a real encode
/// costs (reading the files, counting observations, gathering and
/// standardising tokens, handing chunks over, assembling the embedding), so
/// [`host_rate`] can say whether the host keeps up with a device: a GPU
/// waits for whatever part of it is not overlapped with its work.
///
/// With `device_px_per_s`, a simulated device that needs as long as one
/// encoding that many pixels a second would for each backbone's pixels
/// (half per backbone), queued as a GPU queues them: a begun backbone
/// starts when the device finishes the one before (or at once if it is
/// idle), and its end waits until it is done. The host's work then shows
/// as the device time it costs, which is what overlapping it with the
/// device is for.
struct HostOnly {
    d: usize,
    repr_dim: usize,
    device_px_per_s: Option<f64>,
    /// When the first chunk arrived: before it a device would sit idle.
    first_chunk: std::sync::Mutex<Option<Instant>>,
    /// When the simulated device finishes what it has been given.
    busy_until: std::sync::Mutex<Option<Instant>>,
    /// Where `head` assembles its inputs.
    head_staging: std::sync::Mutex<Vec<f32>>,
    /// Whether the pooled features stay on the simulated device, as the
    /// GPU backend keeps them ([`Backend::kept_windows`]; both follow
    /// `FLOTILLA_CUDA_HOST_FEATURES`).
    keep_features: bool,
    slots: Arc<SlotPool>,
}

impl HostOnly {
    /// Give the simulated device work of `seconds(its px/s rate)`, queued
    /// after what it has (or started at `now` if it is idle); returns when
    /// it will be done. Without a simulated device: `now`.
    fn queue(&self, now: Instant, seconds: impl FnOnce(f64) -> f64) -> Instant {
        match (self.device_px_per_s, self.busy_until.lock()) {
            (Some(rate), Ok(mut busy)) => {
                let start = busy.map_or(now, |b| b.max(now));
                let end = start + std::time::Duration::from_secs_f64(seconds(rate));
                *busy = Some(end);
                end
            }
            _ => now,
        }
    }

    /// A backbone on the simulated device, bringing back `floats` features.
    fn begin(&self, batch: &SequenceBatch<'_>, floats: usize) -> Result<PendingBackbone> {
        batch.check(self.name())?;
        let now = Instant::now();
        if let Ok(mut first) = self.first_chunk.lock() {
            first.get_or_insert(now);
        }
        let done = self.queue(now, |rate| batch.n as f64 / rate / 2.0);
        Ok(PendingBackbone::on_device(Box::new((
            done,
            vec![0f32; floats],
        ))))
    }
}

impl Backend for HostOnly {
    fn name(&self) -> &'static str {
        "host-only"
    }

    fn backbone(&self, m: Modality, batch: &SequenceBatch<'_>) -> Result<Vec<f32>> {
        let pending = self.backbone_begin(m, batch)?;
        self.backbone_end(pending)
    }

    fn backbone_begin(&self, _: Modality, batch: &SequenceBatch<'_>) -> Result<PendingBackbone> {
        self.begin(batch, batch.n * self.d)
    }

    fn kept_windows(&self) -> Result<Option<KeptWindows>> {
        Ok(self.keep_features.then(|| self.slots.lease()))
    }

    fn backbone_begin_kept(
        &self,
        _: Modality,
        batch: &SequenceBatch<'_>,
        place: &KeptRows<'_>,
    ) -> Result<PendingBackbone> {
        place.check(self.name(), batch.n)?;
        // The features stay on the device: none come back.
        self.begin(batch, 0)
    }

    /// A GPU's head on features it kept, queued: only the result comes
    /// down, at [`HEAD_LINK_BYTES_PER_S`], after what the device was given
    /// before; it is there once that is done.
    fn head_kept_begin(&self, _slot: usize, n: usize) -> Result<PendingHead> {
        let bytes = n * self.repr_dim * 4;
        let done = self.queue(Instant::now(), |_| bytes as f64 / HEAD_LINK_BYTES_PER_S);
        Ok(PendingHead::on_device(Box::new((
            done,
            vec![0f32; n * self.repr_dim],
        ))))
    }

    fn head_end(&self, pending: PendingHead) -> Result<Vec<f32>> {
        // The same ticket as a backbone's: wait until `done`.
        self.backbone_end(pending)
    }

    fn backbone_end(&self, pending: PendingBackbone) -> Result<Vec<f32>> {
        let ticket = pending
            .into_parts()
            .err()
            .and_then(|t| t.downcast::<(Instant, Vec<f32>)>().ok())
            .ok_or_else(|| EncodeError::backend(self.name(), "not a backbone begun here"))?;
        let (done, features) = *ticket;
        std::thread::sleep(done.saturating_duration_since(Instant::now()));
        Ok(features)
    }

    /// What a GPU's head costs around it: the host assembles each pixel's
    /// (S2, S1) features side by side (real work here, as there) and, with
    /// a simulated device, the device copies them up and the result down
    /// at [`HEAD_LINK_BYTES_PER_S`], after what it was given before, while
    /// the caller waits (the head's compute, 0.14 % of a pixel's, is left
    /// out).
    fn head(&self, s2: &[f32], s1: &[f32], n: usize) -> Result<Vec<f32>> {
        let d = self.d;
        // Kept from call to call, as a GPU keeps its page-locked staging.
        let mut z = self
            .head_staging
            .lock()
            .map_err(|_| EncodeError::backend(self.name(), "a head panicked"))?;
        z.resize(n * 2 * d, 0.0);
        crate::backend::interleave_features(&mut z, s2, s1, d);
        std::hint::black_box(&*z);
        let bytes = (z.len() + n * self.repr_dim) * 4;
        let done = self.queue(Instant::now(), |_| bytes as f64 / HEAD_LINK_BYTES_PER_S);
        std::thread::sleep(done.saturating_duration_since(Instant::now()));
        Ok(vec![0.0; n * self.repr_dim])
    }
}

/// The host-device link the simulated device's head copies cross: 25 GB/s,
/// what page-locked copies reach over PCIe 4.0 x16 (an H200's Gen5 link
/// allows about twice that; the model is the conservative one).
const HEAD_LINK_BYTES_PER_S: f64 = 25e9;

/// The host side of encoding one tile from its files, against reading them.
#[derive(Debug, Clone)]
pub struct HostRate {
    /// Pixels with data.
    pub pixels: usize,
    /// Bytes of the tile's `.npy` files.
    pub bytes: u64,
    /// Best of the reps: read every file once, front to back (the floor of
    /// any encode that must see every byte; from the page cache after the
    /// first pass).
    pub read_s: f64,
    /// Best of the reps: the encode with [`HostOnly`] as its backend.
    pub encode_s: f64,
    /// CPU time (user + system) of the best rep's encode, every thread.
    pub cpu_s: f64,
    /// The best rep's time from opening the files to the first chunk handed
    /// to the backend (counting the first window's valid observations,
    /// reading and gathering it): time a device waits at the start.
    pub first_chunk_s: f64,
    /// With an output to write ([`HostRateOutput`]), `encode_s` is the
    /// encode writing its files as it goes ([`OutputWriter`]) up to their
    /// rename, and this the peer: best of the reps of encoding into memory,
    /// then writing the files ([`TileEmbedding::write_outputs`]), as
    /// before, the two alternating in one process.
    ///
    /// [`TileEmbedding::write_outputs`]: crate::output::TileEmbedding::write_outputs
    pub written_after_s: Option<f64>,
    /// With an output: of `encode_s`, the best rep's time from the encode's
    /// end to the files' rename ([`OutputWriter::finish`]: the pixels after
    /// the last window, the scales, the last syncs; every window is written
    /// by then).
    pub finish_s: f64,
    /// With an output: the process's peak resident memory (KiB) after its
    /// first encode, the streamed one, before the peer ran.
    pub streamed_peak_kib: Option<u64>,
}

/// Where [`host_rate`] writes the encode's output, and how.
pub struct HostRateOutput<'a> {
    pub dir: &'a std::path::Path,
    pub opts: OutputOptions,
}

impl HostRate {
    pub fn pixels_per_s(&self) -> f64 {
        self.pixels as f64 / self.encode_s
    }
}

/// Time the host side of encoding the tile in `dir` (opened as the CLI and
/// the agent open it, [`TileReader`]) with `profile`'s chunks, for a model
/// of `cfg`, against reading its files: best of `reps` each, reading first.
/// With `device_px_per_s`, a simulated device of that rate (see
/// [`HostOnly`]): the encode's rate against it says how much of the
/// device's time the host's share costs.
pub fn host_rate(
    dir: &std::path::Path,
    cfg: &ModelConfig,
    profile: DeviceProfile,
    window_pixels: usize,
    reps: usize,
    device_px_per_s: Option<f64>,
    output: Option<&HostRateOutput<'_>>,
) -> Result<HostRate> {
    let weights = Arc::new(StudentWeights::from_checkpoint(&random_checkpoint(cfg, 1))?);
    let backend = Arc::new(HostOnly {
        d: cfg.d_model(),
        repr_dim: cfg.repr_dim,
        device_px_per_s,
        first_chunk: std::sync::Mutex::new(None),
        busy_until: std::sync::Mutex::new(None),
        head_staging: std::sync::Mutex::new(Vec::new()),
        keep_features: !crate::backend::features_on_host(),
        slots: Arc::new(SlotPool::default()),
    });
    let mut enc = Encoder::with_backend(weights, Box::new(Shared(backend.clone())), profile);
    enc.set_window_pixels(window_pixels);
    let cancel = AtomicBool::new(false);
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| EncodeError::io(dir, e))? {
        let path = entry.map_err(|e| EncodeError::io(dir, e))?.path();
        if path.extension().is_some_and(|x| x == "npy") {
            files.push(path);
        }
    }
    let (mut read_s, mut encode_s, mut bytes, mut pixels) = (f64::INFINITY, f64::INFINITY, 0, 0);
    let (mut cpu_s, mut first_chunk_s) = (0.0, 0.0);
    let (mut written_after_s, mut finish_s, mut streamed_peak_kib) = (f64::INFINITY, 0.0, None);
    let mut buf = vec![0u8; 1 << 20];
    for rep in 0..reps.max(1) {
        let t = Instant::now();
        bytes = 0;
        for f in &files {
            let mut file = std::fs::File::open(f).map_err(|e| EncodeError::io(f, e))?;
            loop {
                let n =
                    std::io::Read::read(&mut file, &mut buf).map_err(|e| EncodeError::io(f, e))?;
                if n == 0 {
                    break;
                }
                bytes += n as u64;
            }
        }
        read_s = read_s.min(t.elapsed().as_secs_f64());
        let streamed = |reader: &TileReader| -> Result<(usize, f64)> {
            let Some(out) = output else {
                let emb = enc.encode_files(reader, &|_, _| {}, &cancel)?;
                return Ok((emb.nodata.iter().filter(|&&n| !n).count(), 0.0));
            };
            let size = (reader.height(), reader.width());
            let mut w = OutputWriter::create(out.dir, "host-rate", out.opts, size, cfg.repr_dim)?;
            let counted = std::sync::atomic::AtomicUsize::new(0);
            enc.encode_into(
                reader,
                &mut w,
                &|_, total| counted.store(total, std::sync::atomic::Ordering::Relaxed),
                &cancel,
            )?;
            let t = Instant::now();
            w.finish()?;
            Ok((counted.into_inner(), t.elapsed().as_secs_f64()))
        };
        // The peer first on odd reps, so neither always runs on a warmer
        // page cache.
        if let (Some(out), true) = (output, rep % 2 == 1) {
            written_after_s = written_after_s.min(written_after(&enc, dir, out, &cancel)?);
        }
        if let Ok(mut first) = backend.first_chunk.lock() {
            *first = None;
        }
        let t = Instant::now();
        let cpu = process_cpu_s();
        let reader = TileReader::open(dir)?;
        let (with_data, finished_in) = streamed(&reader)?;
        let took = t.elapsed().as_secs_f64();
        if rep == 0 && output.is_some() {
            streamed_peak_kib = peak_resident_kib();
        }
        if took < encode_s {
            encode_s = took;
            finish_s = finished_in;
            cpu_s = process_cpu_s() - cpu;
            first_chunk_s = backend
                .first_chunk
                .lock()
                .ok()
                .and_then(|f| *f)
                .map_or(0.0, |f| (f - t).as_secs_f64());
        }
        pixels = with_data;
        if let (Some(out), true) = (output, rep % 2 == 0) {
            written_after_s = written_after_s.min(written_after(&enc, dir, out, &cancel)?);
        }
    }
    Ok(HostRate {
        pixels,
        bytes,
        read_s,
        encode_s,
        cpu_s,
        first_chunk_s,
        written_after_s: output.map(|_| written_after_s),
        finish_s,
        streamed_peak_kib,
    })
}

/// [`host_rate`]'s peer when writing: the tile encoded into memory, then
/// its files written (the way before [`OutputWriter`]). Seconds.
fn written_after(
    enc: &Encoder,
    dir: &std::path::Path,
    out: &HostRateOutput<'_>,
    cancel: &AtomicBool,
) -> Result<f64> {
    let t = Instant::now();
    let reader = TileReader::open(dir)?;
    let emb = enc.encode_files(&reader, &|_, _| {}, cancel)?;
    emb.write_outputs(out.dir, "host-rate-after", out.opts)?;
    Ok(t.elapsed().as_secs_f64())
}

/// A backend shared with the caller (who reads what it recorded).
pub(crate) struct Shared<B>(pub(crate) Arc<B>);

impl<B: Backend> Backend for Shared<B> {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn backbone(&self, m: Modality, batch: &SequenceBatch<'_>) -> Result<Vec<f32>> {
        self.0.backbone(m, batch)
    }
    fn backbone_begin(&self, m: Modality, batch: &SequenceBatch<'_>) -> Result<PendingBackbone> {
        self.0.backbone_begin(m, batch)
    }
    fn backbone_end(&self, pending: PendingBackbone) -> Result<Vec<f32>> {
        self.0.backbone_end(pending)
    }
    fn head(&self, s2: &[f32], s1: &[f32], n: usize) -> Result<Vec<f32>> {
        self.0.head(s2, s1, n)
    }
    fn kept_windows(&self) -> Result<Option<KeptWindows>> {
        self.0.kept_windows()
    }
    fn backbone_begin_kept(
        &self,
        m: Modality,
        batch: &SequenceBatch<'_>,
        place: &KeptRows<'_>,
    ) -> Result<PendingBackbone> {
        self.0.backbone_begin_kept(m, batch, place)
    }
    fn head_kept_begin(&self, slot: usize, n: usize) -> Result<PendingHead> {
        self.0.head_kept_begin(slot, n)
    }
    fn head_end(&self, pending: PendingHead) -> Result<Vec<f32>> {
        self.0.head_end(pending)
    }
}

/// This process's CPU time so far, user and system, every thread
/// (`/proc/self/stat`; 0 where it cannot be read).
fn process_cpu_s() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command (which is in parentheses and may hold spaces):
    // utime and stime are the 12th and 13th.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // In USER_HZ ticks, which the kernel's ABI fixes at 100 a second on
    // x86 and arm64 whatever its own tick rate.
    (ticks(11) + ticks(12)) / 100.0
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

/// What `tune` sweeps: every combination of these is timed once.
pub struct TuneSweep<'a> {
    pub threads: &'a [usize],
    pub chunks: &'a [usize],
    pub blocks: &'a [usize],
}

/// The thread counts `tune` tries on a CPU backend: the profile's, and the
/// physical cores where there are fewer (two hardware threads on a core
/// share its AMX unit, so one a core with larger blocks may be faster: to
/// be measured, not assumed). Fewest first, each once.
pub fn cpu_thread_counts(profile_threads: usize, physical_cores: Option<usize>) -> Vec<usize> {
    let mut counts = vec![profile_threads.max(1)];
    if let Some(p) = physical_cores.filter(|&p| p > 0 && p < profile_threads) {
        counts.insert(0, p);
    }
    counts
}

/// Sweep thread counts, chunk and block sizes; returns every measurement,
/// fastest first.
pub fn tune(
    ckpt: &Checkpoint,
    choice: BackendChoice,
    base: &DeviceProfile,
    tile: &TileInputs,
    sweep: &TuneSweep,
    on_result: &mut dyn FnMut(&BenchResult),
) -> Result<Vec<BenchResult>> {
    let mut results = Vec::new();
    for &threads in sweep.threads {
        for &chunk in sweep.chunks {
            for &block in sweep.blocks {
                if block > chunk {
                    continue;
                }
                let p = DeviceProfile {
                    threads: threads.max(1),
                    chunk_pixels: chunk,
                    block_pixels: block,
                    ..base.clone()
                };
                // A GPU's first pass builds its GEMM plans and times
                // cuBLASLt's candidates per shape: one untimed pass first,
                // so the sweep compares steady rates (a CPU's first-pass
                // costs are small next to its encode, and its sweep long
                // already).
                let warmup = choice.resolve() == BackendChoice::Cuda;
                let r = bench_encoder(ckpt, choice, p, tile, 1, warmup)?;
                on_result(&r);
                results.push(r);
            }
        }
    }
    results.sort_by(|a, b| b.pixels_per_s.total_cmp(&a.pixels_per_s));
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulated_device_queues_backbones_as_a_gpu_does() {
        // 40 px at 800 px/s, half per backbone: 25 ms each. Two begun at
        // once run one after the other: the first ends no sooner than 25
        // ms after the begins, the second no sooner than 50 (sleeps never
        // end early, so these bounds cannot flake).
        let dev = HostOnly {
            d: 3,
            repr_dim: 2,
            device_px_per_s: Some(800.0),
            first_chunk: std::sync::Mutex::new(None),
            busy_until: std::sync::Mutex::new(None),
            head_staging: std::sync::Mutex::new(Vec::new()),
            keep_features: true,
            slots: Arc::new(SlotPool::default()),
        };
        let (values, doys) = (vec![0f32; 40 * 2 * 4], vec![0f32; 40 * 2]);
        let batch = SequenceBatch {
            n: 40,
            len: 2,
            bands: 4,
            values: &values,
            doys: &doys,
        };
        let t0 = Instant::now();
        let a = dev.backbone_begin(Modality::S2, &batch).unwrap();
        let b = dev.backbone_begin(Modality::S1, &batch).unwrap();
        assert_eq!(dev.backbone_end(a).unwrap(), vec![0f32; 40 * 3]);
        assert!(t0.elapsed().as_millis() >= 25);
        assert_eq!(dev.backbone_end(b).unwrap().len(), 40 * 3);
        assert!(t0.elapsed().as_millis() >= 50);
        let e = dev
            .backbone_end(PendingBackbone::done(vec![1.0]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a backbone begun here"), "{e}");
        // Kept, the features stay on the device: none come back, and a
        // pixel's row must lie in its window.
        let rows: Vec<u32> = (0..40).collect();
        let place = KeptRows {
            slot: 1,
            pixels: 40,
            rows: &rows,
        };
        let kept = dev
            .backbone_begin_kept(Modality::S2, &batch, &place)
            .unwrap();
        assert!(dev.backbone_end(kept).unwrap().is_empty());
        let outside = KeptRows {
            pixels: 39,
            ..place
        };
        let e = dev
            .backbone_begin_kept(Modality::S2, &batch, &outside)
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 39 of a window of 39 pixels"), "{e}");
        assert_eq!(dev.head_kept(1, 40).unwrap().len(), 40 * 2);
        // host-rate hands the encoder the simulated device through
        // `Shared`: it must keep features there too.
        assert!(Shared(Arc::new(dev)).kept_windows().unwrap().is_some());
    }

    #[test]
    fn cpu_threads_add_the_physical_cores_only_where_fewer() {
        // 16 logical CPUs on 8 cores: both, fewest first.
        assert_eq!(cpu_thread_counts(16, Some(8)), vec![8, 16]);
        // One thread a core, unknown topology, or a profile already at or
        // below the cores: the profile's alone.
        assert_eq!(cpu_thread_counts(2, Some(2)), vec![2]);
        assert_eq!(cpu_thread_counts(16, None), vec![16]);
        assert_eq!(cpu_thread_counts(4, Some(8)), vec![4]);
        assert_eq!(cpu_thread_counts(0, Some(0)), vec![1]);
    }

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

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_bf16_ceiling_runs_the_dot_products_it_counts() {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")) {
            assert!(bf16_dot_peak_rate(1, 0.01).is_none());
            eprintln!("no AVX512-BF16 here: only the refusal is checked");
            return;
        }
        // Each chain starts at 1 and gains 2 x b x b an iteration (b = 1e-3
        // in bf16) in each of 16 lanes: the sum says every product ran.
        let b = half::bf16::from_f32(1e-3).to_f32() as f64;
        let want = 12.0 * 16.0 * (1.0 + 1000.0 * 2.0 * b * b);
        // SAFETY: the features were detected above.
        let got = unsafe { bf16_dot_chains(1000) } as f64;
        assert!((got - want).abs() < 1e-3 * want, "{got} vs {want}");
        let rate = bf16_dot_peak_rate(1, 0.05).unwrap();
        assert!(rate.is_finite() && rate > 0.0, "{rate}");
    }
}
