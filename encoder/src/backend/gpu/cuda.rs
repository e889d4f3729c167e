//! The CUDA device for the GPU path: cuBLAS SGEMMs and NVRTC-compiled kernels via cudarc.
//!
//! cudarc loads libcuda, libcublas and libnvrtc at run time
//! (`dynamic-loading`), so this file builds on every machine; [`probe`]
//! says whether this one has the libraries and a GPU, and `auto` only picks
//! CUDA when it does.
//!
//! Status: the model code above this device (layouts, launches, kernels)
//! is checked on the CPU against the fixtures by the emulated device in
//! `emulator.rs`; this file, the thin binding to the driver, cuBLAS and
//! NVRTC, is checked only on a GPU (`scripts/gpu-check.sh`: it ran on an
//! H200, 2026-12-04; the page-locked staging and its events, added since,
//! have not). The fixture tests (`tests/fixtures.rs`) include this backend
//! and skip it where [`probe`] fails.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasMath_t, cublasOperation_t, cublasStatus_t,
    cudaDataType_t,
};
use cudarc::cublas::{CudaBlas, Gemm as _, GemmConfig, StridedBatchedConfig};
use cudarc::cublaslt::result as ltr;
use cudarc::cublaslt::sys as lt;
use cudarc::driver::{
    sys as drv, CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr,
    DevicePtrMut, LaunchConfig, PinnedHostSlice, PushKernelArg,
};
use cudarc::nvrtc::{CompileError, Ptx};

use super::device::HalfGemmOut;
use super::kernel_cache;
use super::{Arg, Device, Epilogue, Gemm, GemmMath, GpuBackend, Kernel, Launch, KERNELS};
use crate::error::{EncodeError, Result};
use crate::model::StudentWeights;
use crate::profile::DeviceProfile;

const NAME: &str = "cuda";

/// Why this machine cannot run the CUDA backend, or the number of GPUs.
/// Checked once per process, in order: the libraries load, the driver
/// reports a GPU, and a trial device builds on GPU 0 (context, cuBLAS
/// handle, kernels compiled by NVRTC and loaded). The last step keeps
/// `auto` from picking a GPU the backend would then fail on, such as one
/// whose driver is older than the NVRTC that compiled the kernels.
///
/// cudarc looks each library up by its plain and CUDA-12 names
/// (`libcublas.so`, `libcublas.so.12`, …; the bindings are CUDA 12.6's,
/// which CUDA 12 and 13 drivers both serve). A CUDA 13 toolkit installs
/// only `libcublas.so.13` and `libnvrtc.so.13` under those names, hence the
/// hint in the message.
pub fn probe() -> std::result::Result<usize, String> {
    static PROBE: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
    PROBE.get_or_init(probe_once).clone()
}

fn probe_once() -> std::result::Result<usize, String> {
    // SAFETY: only probes whether the shared libraries can be opened.
    let (driver, cublas, nvrtc) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
        )
    };
    if !driver {
        return Err(
            "the CUDA driver library (libcuda.so.1) did not load: no NVIDIA driver here".into(),
        );
    }
    let missing: Vec<&str> = [("libcublas", cublas), ("libnvrtc", nvrtc)]
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(name, _)| name)
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "{} did not load (looked for the plain .so name and .so.12/.11; a CUDA 13 \
             install has only .so.13: put a directory with links such as \
             libcublas.so -> libcublas.so.13 and libnvrtc.so -> libnvrtc.so.13 on \
             LD_LIBRARY_PATH)",
            missing.join(" and ")
        ));
    }
    let n = match CudaContext::device_count() {
        Ok(n) if n > 0 => n as usize,
        Ok(_) => return Err("the CUDA driver reports no GPU".into()),
        Err(e) => return Err(format!("the CUDA driver did not answer: {e:?}")),
    };
    // The trial device is kept for the first backend to take (`open`)
    // rather than dropped and built again: its cuBLAS and cuBLASLt handles,
    // workspace and loaded module are what that backend would make anew.
    let dev = CudaDevice::build()?;
    if !TRIAL_RELEASED.load(std::sync::atomic::Ordering::Relaxed) {
        if let Ok(mut spare) = SPARE.lock() {
            *spare = Some(dev);
        }
    }
    Ok(n)
}

/// The probe's device, untouched, until a backend takes it.
static SPARE: Mutex<Option<CudaDevice>> = Mutex::new(None);

/// Drops the probe's trial device if no backend took it: called where a
/// process builds a backend other than CUDA, which will never take it.
/// The primary context stays (the device name and memory reports use it).
pub fn release_trial_device() {
    TRIAL_RELEASED.store(true, std::sync::atomic::Ordering::Relaxed);
    let spare = SPARE.lock().ok().and_then(|mut s| s.take());
    drop(spare);
}

/// Set once a process has built a backend other than CUDA: a probe after
/// it (a device listing) keeps no trial device for a backend that may
/// never come.
static TRIAL_RELEASED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// GPU 0's primary context, held for the whole process: the device-name
/// lookup, the probe and every backend (a `tune` sweep builds one per
/// setting) share it instead of creating and tearing it down each time.
fn context() -> std::result::Result<Arc<CudaContext>, String> {
    static CTX: OnceLock<std::result::Result<Arc<CudaContext>, String>> = OnceLock::new();
    CTX.get_or_init(|| {
        let ctx = CudaContext::new(0).map_err(|e| format!("opening GPU 0: {e:?}"))?;
        // Everything runs on the context's one default stream, in order, so
        // cudarc's per-buffer events (two recorded per buffer per launch or
        // copy, to order uses across streams) would only cost time.
        // SAFETY: no buffer is ever used on a second stream.
        unsafe { ctx.disable_event_tracking() };
        Ok(ctx)
    })
    .clone()
}

/// The kernels as PTX, once per process: for `compute_80` where the GPU
/// has bf16 tensor cores (`attention_mma`'s `mma.sync` needs it; the driver
/// compiles the PTX on for the GPU's own architecture), else for NVRTC's
/// default architecture (`attention_mma` is then a stub the backend never
/// launches). NVRTC compiles them only when the on-disk cache
/// (`kernel_cache.rs`) has none for this source, architecture and NVRTC.
fn kernels_ptx(tensor_cores: bool) -> std::result::Result<Ptx, String> {
    static PTX: [OnceLock<std::result::Result<Ptx, String>>; 2] =
        [OnceLock::new(), OnceLock::new()];
    PTX[tensor_cores as usize]
        .get_or_init(|| {
            let arch = tensor_cores.then_some("compute_80");
            let nvrtc = nvrtc_version()?;
            let dir = kernel_cache::dir_from_env();
            let (ptx, origin) = kernel_cache::ptx_cached(
                dir.as_deref().map_err(Clone::clone),
                &[
                    KERNELS.as_bytes(),
                    arch.unwrap_or("default").as_bytes(),
                    nvrtc.as_bytes(),
                ],
                || compile_kernels(arch).map(|p| p.to_src()),
            )?;
            if let Ok(mut o) = KERNELS_ORIGIN.lock() {
                *o = Some(origin);
            }
            Ok(Ptx::from_src(ptx))
        })
        .clone()
}

/// How this process got its kernels (the last compiled or read).
static KERNELS_ORIGIN: Mutex<Option<kernel_cache::Origin>> = Mutex::new(None);

/// Where this process's kernels came from (the NVRTC cache, or compiled in
/// how long), once a device was built: for `tessera-encode backends` and
/// the encode's report.
pub fn kernels_report() -> Option<String> {
    KERNELS_ORIGIN
        .lock()
        .ok()?
        .as_ref()
        .map(|o| format!("CUDA kernels {o}"))
}

/// NVRTC's version, part of the kernel cache's key (another NVRTC may
/// write other PTX, or PTX an older driver cannot load).
fn nvrtc_version() -> std::result::Result<String, String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-pointers to locals; the caller has checked that
    // libnvrtc loads (probe), as compiling needs anyway.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if status != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("asking NVRTC's version: {status:?}"));
    }
    Ok(format!("NVRTC {major}.{minor}"))
}

/// [`compile_cubin`] once per process (the probe and every backend a
/// `tune` sweep builds load it; GPU 0's architecture does not change).
fn kernels_cubin(major: i32, minor: i32) -> std::result::Result<Vec<u8>, String> {
    static CUBIN: OnceLock<std::result::Result<Vec<u8>, String>> = OnceLock::new();
    CUBIN.get_or_init(|| compile_cubin(major, minor)).clone()
}

/// The kernels as machine code (a CUBIN) for compute capability
/// `major.minor`, for a driver that refuses NVRTC's PTX.
fn compile_cubin(major: i32, minor: i32) -> std::result::Result<Vec<u8>, String> {
    let src = std::ffi::CString::new(KERNELS).map_err(|_| "a NUL in the kernels' source")?;
    let prog = cudarc::nvrtc::result::create_program(&src, None)
        .map_err(|e| format!("NVRTC: creating a program: {e:?}"))?;
    let arch = format!("--gpu-architecture=sm_{major}{minor}");
    // SAFETY: `prog` is live until destroyed at the end, and every pointer
    // handed to NVRTC points at memory that outlives the call.
    let built = unsafe {
        match cudarc::nvrtc::result::compile_program(prog, &[arch.as_str()]) {
            Err(e) => {
                let log: String = cudarc::nvrtc::result::get_program_log(prog)
                    .map(|l| {
                        l.iter()
                            .map(|&c| c as u8 as char)
                            .filter(|&c| c != '\0')
                            .collect()
                    })
                    .unwrap_or_default();
                Err(format!(
                    "NVRTC refused the kernels for sm_{major}{minor} ({e:?}):\n{log}"
                ))
            }
            Ok(()) => {
                let mut size = 0usize;
                let sized = cudarc::nvrtc::sys::nvrtcGetCUBINSize(prog, &mut size);
                let mut cubin = vec![0u8; size];
                let got = if sized == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
                    cudarc::nvrtc::sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast())
                } else {
                    sized
                };
                match got {
                    cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS if size > 0 => Ok(cubin),
                    status => Err(format!("NVRTC gave no machine code ({status:?})")),
                }
            }
        }
    };
    // SAFETY: not used after this.
    let _ = unsafe { cudarc::nvrtc::result::destroy_program(prog) };
    built
}

fn compile_kernels(arch: Option<&'static str>) -> std::result::Result<Ptx, String> {
    let opts = cudarc::nvrtc::CompileOptions {
        arch,
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(KERNELS, opts).map_err(|e| match e {
        CompileError::CompileError { log, .. } => {
            format!("NVRTC refused the kernels:\n{}", log.to_string_lossy())
        }
        other => format!("NVRTC: {other:?}"),
    })
}

/// Whether GEMMs with bias and ReLU fused run here, for `tessera-encode
/// backends`: cuBLASLt's answer for a bf16 Linear of the Large model (640
/// in, 1,920 out, 262,144 rows) with an f32 bias and with a bf16 one.
pub fn fused_epilogue_report() -> String {
    if let Err(why) = probe() {
        return format!("no GPU: {why}");
    }
    let dev = match CudaDevice::build() {
        Ok(dev) => dev,
        Err(why) => return why,
    };
    let Some(lt) = &dev.lt else {
        return "unfused: no cuBLASLt (libcublasLt did not load, or FLOTILLA_CUDA_UNFUSED is set): \
                bias and ReLU run as kernels"
            .into();
    };
    let bias = match dev.alloc(2048) {
        Ok(b) => b,
        Err(e) => return e.to_string(),
    };
    let (ptr, _r) = bias.device_ptr(&dev.stream);
    let key = LtKey {
        trans_a: true,
        trans_b: false,
        m: 1920,
        n: 262_144,
        k: 640,
        lda: 640,
        ldb: 640,
        ldc: 1920,
        out_bf16: true,
        relu: false,
        bias_bf16: false,
        residual: false,
    };
    let answer = |key: &LtKey| match lt.plan(key, ptr) {
        Ok(_) => "yes".to_string(),
        Err(status) => format!("no ({status:?})"),
    };
    format!(
        "cuBLASLt bias epilogue, bf16 out: f32 bias {}; bf16 bias {}",
        answer(&key),
        answer(&LtKey {
            bias_bf16: true,
            ..key
        })
    )
}

/// GPU 0's memory in use and its total, in MiB (the driver's total minus
/// free: this process's context, cuBLAS workspaces, weights and chunk
/// buffers, and any other process's), for the encode's report.
pub fn memory_in_use_mib() -> Option<(usize, usize)> {
    if probe().is_err() {
        return None;
    }
    let (free, total) = context().ok()?.mem_get_info().ok()?;
    Some(((total - free.min(total)) >> 20, total >> 20))
}

/// The name of GPU 0, for device profiles.
pub fn device_name() -> Option<String> {
    if probe().is_err() {
        return None;
    }
    context().ok()?.name().ok()
}

fn err(what: &str, e: impl std::fmt::Debug) -> EncodeError {
    EncodeError::backend(NAME, format!("{what}: {e:?}"))
}

/// The GPU backend on GPU 0.
pub(crate) type CudaBackend = GpuBackend<CudaDevice>;

impl CudaBackend {
    /// On GPU 0, with the GEMM precision of `profile.dtype` (f32, tf32 or
    /// bf16).
    pub fn new(weights: Arc<StudentWeights>, profile: &DeviceProfile) -> Result<Self> {
        let math = GemmMath::from_dtype(profile.dtype);
        GpuBackend::create(NAME, CudaDevice::open(math)?, weights)
    }
}

/// GPU 0: one stream, its cuBLAS handle and the compiled kernels.
pub(crate) struct CudaDevice {
    stream: Arc<CudaStream>,
    /// Dropped by [`CudaDevice`]'s own `Drop` (cudarc's panics if
    /// `cublasDestroy` fails, as it may after a sticky CUDA error).
    blas: std::mem::ManuallyDrop<CudaBlas>,
    /// In [`Kernel::ALL`]'s order, so `kernels[k as usize]` is `k`.
    kernels: Vec<CudaFunction>,
    /// How every GEMM computes.
    math: GemmMath,
    /// Compute capability 8.0 or later, and the kernels compiled for it.
    tensor_cores: bool,
    /// cuBLASLt, for GEMMs with bias and ReLU in their epilogue; `None`
    /// where libcublasLt did not load (the kernels do that work instead).
    lt: Option<Lt>,
    /// Page-locked host buffers whose copies are done, for the next ones.
    staging: Mutex<Vec<CudaStaging>>,
}

/// Page-locked host memory a copy runs from or into while the host goes
/// on (a copy from pageable memory holds the host until it is over, and
/// the GPU idles meanwhile between chunks), and the event recorded after
/// that copy on the stream.
pub(crate) struct CudaStaging {
    host: PinnedHostSlice<f32>,
    done: CudaEvent,
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // SAFETY: taken once, here, and not used again.
        let blas = unsafe { std::mem::ManuallyDrop::take(&mut self.blas) };
        // cudarc unwraps `cublasDestroy`'s status. After a sticky CUDA
        // error (a kernel's illegal address, say) that can fail, and its
        // panic would hide the error being reported, or abort a process
        // already unwinding. Caught, the panic hook's line still says it
        // failed; the handle is lost either way.
        if std::thread::panicking() {
            std::mem::forget(blas);
        } else {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(blas)));
        }
    }
}

impl Drop for CudaStaging {
    fn drop(&mut self) {
        // The copy must be over before the memory is freed: the pinned
        // slice's own drop does not know of it (event tracking is off).
        let _ = self.done.synchronize();
    }
}

/// A copy of `n` floats into a device buffer of `len` fits, else the error.
fn check_upload(n: usize, len: usize) -> Result<()> {
    if n > len {
        return Err(EncodeError::backend(
            NAME,
            format!("copying {n} floats into a buffer of {len}"),
        ));
    }
    Ok(())
}

/// A read of `n` floats from a device buffer of `len` fits, else the error.
fn check_download(n: usize, len: usize) -> Result<()> {
    if n > len {
        return Err(EncodeError::backend(
            NAME,
            format!("reading {n} floats of a buffer of {len}"),
        ));
    }
    Ok(())
}

/// Staging buffers kept for reuse: two chunks in flight use up to four
/// each (bands, days, and the features' download, or the rows of features
/// kept on the device and a marker), with room to spare so a chunk of
/// another size finds one that fits rather than allocating page-locked
/// memory (slow) while the device waits.
const STAGING_KEPT: usize = 12;

impl CudaDevice {
    /// The fastest of `candidates` for `key`'s GEMM, each called by `run`
    /// once untimed and [`LT_TIMED_RUNS`] times between two events on the
    /// stream (a candidate that fails is passed over); `None` if none ran
    /// or the events failed. Reports to [`TUNING`].
    fn fastest(
        &self,
        key: &LtKey,
        candidates: &[lt::cublasLtMatmulAlgo_t],
        run: &dyn Fn(&lt::cublasLtMatmulAlgo_t) -> std::result::Result<(), lt::cublasStatus_t>,
    ) -> Option<lt::cublasLtMatmulAlgo_t> {
        let ctx = self.stream.context();
        let timing = Some(drv::CUevent_flags::CU_EVENT_DEFAULT);
        let (start, end) = (ctx.new_event(timing).ok()?, ctx.new_event(timing).ok()?);
        let mut times = Vec::with_capacity(candidates.len());
        for (i, algo) in candidates.iter().enumerate() {
            if run(algo).is_err() {
                continue;
            }
            start.record(&self.stream).ok()?;
            let ran = (0..LT_TIMED_RUNS).all(|_| run(algo).is_ok());
            end.record(&self.stream).ok()?;
            let ms = start.elapsed_ms(&end).ok()?;
            if ran {
                times.push((i, ms / LT_TIMED_RUNS as f32));
            }
        }
        let &(mut best, mut best_ms) = times.iter().min_by(|x, y| x.1.total_cmp(&y.1))?;
        let first_ms = times.iter().find(|(i, _)| *i == 0).map(|&(_, ms)| ms);
        // Another than the heuristic's pick only for a clear gain: which of
        // two algorithms within timing noise wins would change from run to
        // run, and with it the bits (another summation order).
        if let Some(f) = first_ms.filter(|&f| best_ms > f * LT_CLEAR_GAIN) {
            (best, best_ms) = (0, f);
        }
        let first = first_ms.map_or("failed".to_string(), |ms| format!("{ms:.3} ms"));
        if let Ok(mut t) = TUNING.lock() {
            t.push(format!(
                "cuBLASLt {}x{}x{}{}{}: heuristic's first {first}, kept candidate {} of {} at \
                 {best_ms:.3} ms ({:.0} TFLOP/s)",
                key.m,
                key.n,
                key.k,
                if key.relu { " relu" } else { "" },
                if key.residual { " +residual" } else { "" },
                best + 1,
                candidates.len(),
                2.0 * key.m as f64 * key.n as f64 * key.k as f64 / (best_ms as f64 * 1e9),
            ));
        }
        Some(candidates[best])
    }

    /// A staging buffer whose first `n` floats `copy` queues a copy from or
    /// into, with the event recorded after that copy.
    fn staged(&self, n: usize, copy: impl FnOnce(&mut [f32]) -> Result<()>) -> Result<CudaStaging> {
        let mut staging = self.take_staging(n)?;
        let pinned = staging
            .host
            .as_mut_slice()
            .map_err(|e| err("reaching page-locked memory", e))?;
        copy(&mut pinned[..n])?;
        staging
            .done
            .record(&self.stream)
            .map_err(|e| err("recording a CUDA event", e))?;
        Ok(staging)
    }

    /// A staging buffer of at least `n` floats: a kept one, or a new one
    /// (rounded up to a power of two, so chunks of other sizes reuse it).
    fn take_staging(&self, n: usize) -> Result<CudaStaging> {
        if let Ok(mut kept) = self.staging.lock() {
            // A marker (n = 0) takes only a marker's own one float: a
            // larger buffer held just for its event could leave a chunk's
            // copy to allocate page-locked memory (slow) meanwhile.
            let fit = kept
                .iter()
                .enumerate()
                .filter(|(_, s)| s.host.len() >= n && (n > 0 || s.host.len() == 1))
                .min_by_key(|(_, s)| s.host.len())
                .map(|(i, _)| i);
            if let Some(i) = fit {
                return Ok(kept.swap_remove(i));
            }
        }
        let ctx = self.stream.context();
        // SAFETY: what is copied in is written first, what is copied out is
        // read only after its copy's event; flags 0: cached (the host reads
        // downloads back), not write-combined.
        let host = unsafe { ctx.alloc_pinned_with_flags::<f32>(n.max(1).next_power_of_two(), 0) }
            .map_err(|e| err("allocating page-locked host memory", e))?;
        let done = ctx
            .new_event(Some(drv::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(|e| err("creating a CUDA event", e))?;
        Ok(CudaStaging { host, done })
    }
}

impl CudaDevice {
    /// The device, its cuBLAS handle set to `math` for every GEMM.
    fn open(math: GemmMath) -> Result<Self> {
        probe().map_err(|why| EncodeError::backend(NAME, format!("no usable GPU: {why}")))?;
        let spare = SPARE.lock().ok().and_then(|mut s| s.take());
        let mut dev = match spare {
            Some(dev) => dev,
            None => Self::build().map_err(|e| EncodeError::backend(NAME, e))?,
        };
        dev.math = math;
        let mode = match math {
            // bf16 is asked for per GEMM, by its compute type.
            GemmMath::F32 | GemmMath::Bf16 => cublasMath_t::CUBLAS_DEFAULT_MATH,
            GemmMath::Tf32 => cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH,
        };
        // SAFETY: a live handle; setting its math mode has no other effect.
        let status = unsafe { cudarc::cublas::sys::cublasSetMathMode(*dev.blas.handle(), mode) };
        if status != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(err("setting the cuBLAS math mode", status));
        }
        Ok(dev)
    }

    /// The stream, cuBLAS handle and loaded kernels on GPU 0 (no probe).
    fn build() -> std::result::Result<Self, String> {
        let ctx = context()?;
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| format!("creating the cuBLAS handle: {e:?}"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| format!("asking the GPU's compute capability: {e:?}"))?;
        let tensor_cores = major >= 8;
        let module = match ctx.load_module(kernels_ptx(tensor_cores)?) {
            Ok(module) => module,
            // PTX from an NVRTC newer than the driver (a later minor
            // version: pip's nvidia-cuda-nvrtc beside an older driver)
            // carries an ISA version the driver refuses; machine code for
            // this GPU from the same NVRTC loads, by CUDA's minor version
            // compatibility. Built then, not cached: only this case needs it.
            Err(ptx_refused) => {
                let cubin = kernels_cubin(major, minor).map_err(|e| {
                    format!("loading the kernels' PTX: {ptx_refused:?}; as machine code: {e}")
                })?;
                let module = ctx.load_module(Ptx::from_binary(cubin)).map_err(|e| {
                    format!(
                        "loading the kernels: the PTX refused ({ptx_refused:?}), and the \
                         machine code for sm_{major}{minor} too ({e:?}); is the driver \
                         older than NVRTC's major version?"
                    )
                })?;
                if let Ok(mut o) = KERNELS_ORIGIN.lock() {
                    *o = Some(kernel_cache::Origin::MachineCode(format!(
                        "sm_{major}{minor}, the driver refused NVRTC's PTX ({ptx_refused:?})"
                    )));
                }
                module
            }
        };
        let kernels = Kernel::ALL
            .iter()
            .map(|k| {
                module
                    .load_function(k.name())
                    .map_err(|e| format!("kernel {}: {e:?}", k.name()))
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        // Without cuBLASLt the GEMMs run unfused: slower, the same results.
        let lt = Lt::new(&stream).ok();
        Ok(CudaDevice {
            stream,
            blas: std::mem::ManuallyDrop::new(blas),
            kernels,
            math: GemmMath::F32,
            tensor_cores,
            lt,
            staging: Mutex::new(Vec::new()),
        })
    }
}

/// cuBLASLt's handle, its workspace, and a plan per GEMM shape.
///
/// Written on cudarc's raw cuBLASLt calls rather than its `Matmul` trait,
/// which takes one element type for A, B, C and the bias: here A and B are
/// bf16, C bf16 or f32, and the bias stays f32 (rounding it to bf16 would
/// change the bits against `bias_epilogue`).
struct Lt {
    handle: lt::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    /// By shape; `None`: cuBLASLt has no algorithm for it (asked once).
    plans: Mutex<HashMap<LtKey, Option<LtPlan>>>,
    /// The algorithm timing kept, by shape class ([`LtKey::class`]): a
    /// chunk of another size in the class (a window's last, say) takes it
    /// if cuBLASLt accepts it for its shape, instead of timing again (each
    /// timing waits for the GPU, draining the chunks queued ahead).
    timed: Mutex<HashMap<LtKey, lt::cublasLtMatmulAlgo_t>>,
}

impl LtKey {
    /// Shapes that share a timed algorithm: the same but for `n` (a
    /// chunk's rows), which is rounded up to a power of two.
    fn class(&self) -> LtKey {
        LtKey {
            n: self.n.next_power_of_two(),
            ..*self
        }
    }
}

// SAFETY: the handle and the plans' descriptors are host objects used
// under the model's lock (one caller at a time) and the plans' mutex.
unsafe impl Send for Lt {}
unsafe impl Sync for Lt {}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct LtKey {
    trans_a: bool,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    ldb: usize,
    ldc: usize,
    out_bf16: bool,
    relu: bool,
    /// The bias in bf16 (else f32).
    bias_bf16: bool,
    /// C (beta 1) is a residual added to the product, D another buffer.
    residual: bool,
}

/// A matmul descriptor with its epilogue, the three layouts and the
/// algorithm for them: cuBLASLt's heuristic's first, until the first call
/// times its candidates and keeps the fastest.
struct LtPlan {
    desc: lt::cublasLtMatmulDesc_t,
    a: lt::cublasLtMatrixLayout_t,
    b: lt::cublasLtMatrixLayout_t,
    c: lt::cublasLtMatrixLayout_t,
    algo: lt::cublasLtMatmulAlgo_t,
    /// The heuristic's candidates, best first by its estimate, still to be
    /// timed (empty once timed, or with one candidate or tuning off).
    candidates: Vec<lt::cublasLtMatmulAlgo_t>,
    /// The heuristic's own first pick where `algo` is another (its class's
    /// timed algorithm, or a timed candidate): tried once before a call
    /// the algorithm is refused for sends the shape unfused.
    fallback: Option<lt::cublasLtMatmulAlgo_t>,
}

/// Candidates asked of cuBLASLt's heuristic per GEMM shape. Its first pick
/// ran the Large model's GEMMs at about 550 TFLOP/s on an H200 where
/// cuBLAS reaches 660-760 at these shapes; timing a few on the real
/// buffers, once per shape, is how PyTorch's TunableOp closes such gaps.
const LT_CANDIDATES: usize = 8;

/// Timed calls per candidate (after one untimed).
const LT_TIMED_RUNS: usize = 3;

/// A candidate replaces the heuristic's pick only below this share of its
/// time.
const LT_CLEAR_GAIN: f32 = 0.95;

/// What the timing of each shape's candidates found, for the encode's
/// report ([`gemm_tuning_report`]).
static TUNING: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// One line per GEMM shape whose cuBLASLt candidates were timed in this
/// process: the heuristic's first pick's time and the one kept.
pub fn gemm_tuning_report() -> Vec<String> {
    TUNING.lock().map(|t| t.clone()).unwrap_or_default()
}

impl Drop for LtPlan {
    fn drop(&mut self) {
        // SAFETY: created by `Lt::plan`, destroyed once, here.
        unsafe {
            let _ = ltr::destroy_matrix_layout(self.a);
            let _ = ltr::destroy_matrix_layout(self.b);
            let _ = ltr::destroy_matrix_layout(self.c);
            let _ = ltr::destroy_matmul_desc(self.desc);
        }
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        if let Ok(mut plans) = self.plans.lock() {
            plans.clear();
        }
        // SAFETY: created in `Lt::new`, destroyed once, here.
        let _ = unsafe { ltr::destroy_handle(self.handle) };
    }
}

/// Hopper wants 32 MiB of workspace for its best cuBLASLt kernels.
const LT_WORKSPACE: usize = 32 << 20;

impl Lt {
    fn new(stream: &Arc<CudaStream>) -> std::result::Result<Self, String> {
        // An operator's way back to the unfused path, should a cuBLASLt
        // version misbehave.
        if std::env::var_os("FLOTILLA_CUDA_UNFUSED").is_some() {
            return Err("FLOTILLA_CUDA_UNFUSED is set".into());
        }
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { lt::is_culib_present() } {
            return Err("libcublasLt did not load".into());
        }
        let handle = ltr::create_handle().map_err(|e| format!("cublasLtCreate: {e:?}"))?;
        // SAFETY: a workspace cuBLASLt may overwrite as it likes.
        let workspace = unsafe { stream.alloc::<u8>(LT_WORKSPACE) }
            .map_err(|e| format!("cuBLASLt workspace: {e:?}"))?;
        Ok(Lt {
            handle,
            workspace,
            plans: Mutex::new(HashMap::new()),
            timed: Mutex::new(HashMap::new()),
        })
    }

    /// Descriptor, layouts and algorithm for `key`, the bias at `bias`
    /// (the heuristic sees its alignment); `Err` when cuBLASLt has none.
    fn plan(&self, key: &LtKey, bias: u64) -> std::result::Result<LtPlan, lt::cublasStatus_t> {
        let status = |e: ltr::CublasError| e.0;
        let bf16 = lt::cudaDataType_t::CUDA_R_16BF;
        let f32t = lt::cudaDataType_t::CUDA_R_32F;
        let dims = |trans: bool, rows: usize, cols: usize| {
            if trans {
                (cols as u64, rows as u64)
            } else {
                (rows as u64, cols as u64)
            }
        };
        let (ar, ac) = dims(key.trans_a, key.m, key.k);
        let (br, bc) = dims(key.trans_b, key.k, key.n);
        let desc = ltr::create_matmul_desc(lt::cublasComputeType_t::CUBLAS_COMPUTE_32F, f32t)
            .map_err(status)?;
        let mut plan = LtPlan {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            c: std::ptr::null_mut(),
            algo: lt::cublasLtMatmulAlgo_t { data: [0; 8] },
            candidates: Vec::new(),
            fallback: None,
        };
        plan.a = ltr::create_matrix_layout(bf16, ar, ac, key.lda as i64).map_err(status)?;
        plan.b = ltr::create_matrix_layout(bf16, br, bc, key.ldb as i64).map_err(status)?;
        let out = if key.out_bf16 { bf16 } else { f32t };
        plan.c = ltr::create_matrix_layout(out, key.m as u64, key.n as u64, key.ldc as i64)
            .map_err(status)?;
        let epilogue = if key.relu {
            lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS
        } else {
            lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS
        };
        // cublasOperation_t: 0 = N, 1 = T.
        let op = |t: bool| i32::from(t);
        // SAFETY: each attribute gets a value of its documented type and size.
        unsafe {
            set_attr(
                plan.desc,
                Attr::CUBLASLT_MATMUL_DESC_TRANSA,
                &op(key.trans_a),
            )?;
            set_attr(
                plan.desc,
                Attr::CUBLASLT_MATMUL_DESC_TRANSB,
                &op(key.trans_b),
            )?;
            set_attr(plan.desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue)?;
            let bias_type = if key.bias_bf16 { bf16 } else { f32t };
            set_attr(
                plan.desc,
                Attr::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                &bias_type,
            )?;
            set_attr(plan.desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)?;
        }
        let pref = ltr::create_matmul_pref().map_err(status)?;
        // SAFETY: as above; the preference is destroyed right after.
        let found = unsafe {
            let size = LT_WORKSPACE;
            ltr::set_matmul_pref_attribute(
                pref,
                lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&size) as *const usize as *const _,
                std::mem::size_of::<usize>(),
            )
            .map_err(status)
            .and_then(|()| {
                // SAFETY: all-zero bits are a valid (empty) result, and
                // cuBLASLt writes at most LT_CANDIDATES of them.
                let mut results =
                    vec![std::mem::zeroed::<lt::cublasLtMatmulHeuristicResult_t>(); LT_CANDIDATES];
                let mut count: std::ffi::c_int = 0;
                let code = lt::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    plan.desc,
                    plan.a,
                    plan.b,
                    plan.c,
                    plan.c,
                    pref,
                    LT_CANDIDATES as std::ffi::c_int,
                    results.as_mut_ptr(),
                    &mut count,
                );
                if code != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                    return Err(code);
                }
                results.truncate(usize::try_from(count).unwrap_or(0));
                Ok(results)
            })
        };
        // SAFETY: created above, not used again.
        let _ = unsafe { ltr::destroy_matmul_pref(pref) };
        let algos: Vec<_> = found?
            .into_iter()
            .filter(|r| r.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .map(|r| r.algo)
            .collect();
        let Some(first) = algos.first() else {
            return Err(lt::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED);
        };
        plan.algo = *first;
        // An operator's way to the heuristic's pick alone.
        if algos.len() < 2 || std::env::var_os("FLOTILLA_CUDA_NO_GEMM_TUNING").is_some() {
            return Ok(plan);
        }
        let timed = self
            .timed
            .lock()
            .ok()
            .and_then(|t| t.get(&key.class()).copied());
        match timed {
            // Timed for its class: that algorithm, if it suits this shape
            // (else the heuristic's first; no second timing).
            Some(algo) => {
                // SAFETY: an all-zero result is valid for cuBLASLt to fill.
                let mut result =
                    unsafe { std::mem::zeroed::<lt::cublasLtMatmulHeuristicResult_t>() };
                // SAFETY: live descriptors; `algo` came from the heuristic
                // for a shape of this class.
                let ok = unsafe {
                    lt::cublasLtMatmulAlgoCheck(
                        self.handle,
                        plan.desc,
                        plan.a,
                        plan.b,
                        plan.c,
                        plan.c,
                        &algo,
                        &mut result,
                    )
                };
                if ok == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                    && result.workspaceSize <= LT_WORKSPACE
                    && algo.data != first.data
                {
                    plan.fallback = Some(*first);
                    plan.algo = algo;
                }
            }
            None => plan.candidates = algos,
        }
        Ok(plan)
    }
}

type Attr = lt::cublasLtMatmulDescAttributes_t;

/// Set one attribute of a matmul descriptor to `value`.
///
/// # Safety
/// `T` is the attribute's documented type.
unsafe fn set_attr<T>(
    desc: lt::cublasLtMatmulDesc_t,
    attr: Attr,
    value: &T,
) -> std::result::Result<(), lt::cublasStatus_t> {
    // SAFETY: the caller's; the value is read during the call only.
    unsafe {
        ltr::set_matmul_desc_attribute(
            desc,
            attr,
            value as *const T as *const _,
            std::mem::size_of::<T>(),
        )
    }
    .map_err(|e| e.0)
}

impl CudaDevice {
    /// `cublasGemmStridedBatchedEx` of `g` (its sizes in `cfg`) on raw
    /// device pointers of the given data types, computing as `compute`
    /// says (f32 accumulation in every use here).
    ///
    /// # Safety
    /// Every problem's A, B and C lie in memory the pointers own, of their
    /// types (what [`Device::gemm`] and [`Device::gemm_half`] check).
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_ex(
        &self,
        g: &Gemm,
        cfg: &GemmConfig<f32>,
        a: (u64, cudaDataType_t),
        b: (u64, cudaDataType_t),
        c: (u64, cudaDataType_t),
        compute: cublasComputeType_t,
    ) -> Result<()> {
        // SAFETY: the handle is live and bound to this stream; the pointers
        // are the caller's; alpha and beta outlive the call, which only
        // enqueues work that reads them at once.
        let status = unsafe {
            cudarc::cublas::sys::cublasGemmStridedBatchedEx(
                *self.blas.handle(),
                cfg.transa,
                cfg.transb,
                cfg.m,
                cfg.n,
                cfg.k,
                (&cfg.alpha) as *const f32 as *const _,
                a.0 as *const _,
                a.1,
                cfg.lda,
                g.stride_a as i64,
                b.0 as *const _,
                b.1,
                cfg.ldb,
                g.stride_b as i64,
                (&cfg.beta) as *const f32 as *const _,
                c.0 as *mut _,
                c.1,
                cfg.ldc,
                g.stride_c as i64,
                int(g.batch)?,
                compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if status != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(err("cublasGemmStridedBatchedEx", status));
        }
        Ok(())
    }

    /// `g`'s sizes as cuBLAS takes them.
    fn config(g: &Gemm) -> Result<GemmConfig<f32>> {
        Ok(GemmConfig {
            transa: op(g.trans_a),
            transb: op(g.trans_b),
            m: int(g.m)?,
            n: int(g.n)?,
            k: int(g.k)?,
            alpha: g.alpha,
            lda: int(g.lda)?,
            ldb: int(g.ldb)?,
            beta: g.beta,
            ldc: int(g.ldc)?,
        })
    }
}

fn int(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| EncodeError::backend(NAME, format!("SGEMM size {v} exceeds i32")))
}

fn op(trans: bool) -> cublasOperation_t {
    if trans {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

/// A null device pointer, for an absent optional buffer.
static NULL: u64 = 0;

impl Device for CudaDevice {
    type Staging = CudaStaging;
    type Buf = CudaSlice<f32>;
    type Half = CudaSlice<u16>;

    fn math(&self) -> GemmMath {
        self.math
    }

    /// cuBLAS and frees use the calling thread's current context; the
    /// copies and launches bind it themselves, but a GEMM or a free may
    /// come first on a thread.
    fn bind(&self) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| err("binding the GPU context", e))
    }

    fn upload(&self, host: &[f32]) -> Result<Self::Buf> {
        self.stream
            .clone_htod(host)
            .map_err(|e| err("copying to the GPU", e))
    }

    fn alloc(&self, n: usize) -> Result<Self::Buf> {
        // SAFETY: the GPU path writes every buffer before it reads it
        // (`Scratch`), which the emulator checks by filling new ones with NaN.
        unsafe { self.stream.alloc::<f32>(n) }.map_err(|e| err("allocating GPU memory", e))
    }

    fn len(buf: &Self::Buf) -> usize {
        buf.len()
    }

    fn upload_staged_with(
        &self,
        n: usize,
        buf: &mut Self::Buf,
        fill: &mut dyn FnMut(&mut [f32]),
    ) -> Result<CudaStaging> {
        check_upload(n, buf.len())?;
        self.staged(n, |pinned| {
            fill(pinned);
            self.stream
                .memcpy_htod(&*pinned, &mut buf.slice_mut(..n))
                .map_err(|e| err("copying to the GPU", e))
        })
    }

    fn download_begin(&self, buf: &Self::Buf, n: usize) -> Result<CudaStaging> {
        check_download(n, buf.len())?;
        self.staged(n, |pinned| {
            self.stream
                .memcpy_dtoh(&buf.slice(..n), pinned)
                .map_err(|e| err("copying from the GPU", e))
        })
    }

    fn download_wait(staging: &CudaStaging) -> Result<()> {
        staging
            .done
            .synchronize()
            .map_err(|e| err("waiting for the GPU", e))
    }

    fn download_end(&self, staging: CudaStaging, n: usize) -> Result<Vec<f32>> {
        Self::download_wait(&staging)?;
        let out = staging
            .host
            .as_slice()
            .map_err(|e| err("reaching page-locked memory", e))?
            .get(..n)
            .map(<[f32]>::to_vec)
            .ok_or_else(|| {
                EncodeError::backend(
                    NAME,
                    format!("taking {n} floats of a download of {}", staging.host.len()),
                )
            })?;
        self.release(staging);
        Ok(out)
    }

    fn marker(&self) -> Result<CudaStaging> {
        // The event alone, recorded after what was queued.
        self.staged(0, |_| Ok(()))
    }

    fn release(&self, staging: CudaStaging) {
        if let Ok(mut kept) = self.staging.lock() {
            if kept.len() < STAGING_KEPT {
                kept.push(staging);
            }
        }
    }

    unsafe fn gemm_unchecked(
        &self,
        g: &Gemm,
        a: (&Self::Buf, usize),
        b: (&Self::Buf, usize),
        c: (&mut Self::Buf, usize),
    ) -> Result<()> {
        self.bind()?;
        let cfg = Self::config(g)?;
        let (av, bv) = (a.0.slice(a.1..), b.0.slice(b.1..));
        let mut cv = c.0.slice_mut(c.1..);
        if self.math == GemmMath::Bf16 {
            // f32 matrices in and out, bf16 tensor-core products:
            // CUBLAS_COMPUTE_32F_FAST_16BF rounds A and B to bf16 as it
            // reads them and accumulates in f32 (the head's few GEMMs; the
            // backbones keep bf16 copies and use gemm_half).
            let f = cudaDataType_t::CUDA_R_32F;
            let (ap, _ra) = av.device_ptr(&self.stream);
            let (bp, _rb) = bv.device_ptr(&self.stream);
            let (cp, _rc) = cv.device_ptr_mut(&self.stream);
            // SAFETY: the caller checked every problem inside the views.
            return unsafe {
                self.gemm_ex(
                    g,
                    &cfg,
                    (ap, f),
                    (bp, f),
                    (cp, f),
                    cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_16BF,
                )
            };
        }
        // SAFETY: the caller checked every problem's A, B and C inside the
        // views (`Device::gemm`).
        let r = unsafe {
            if g.batch == 1 {
                self.blas.gemm(cfg, &av, &bv, &mut cv)
            } else {
                let cfg = StridedBatchedConfig {
                    gemm: cfg,
                    batch_size: int(g.batch)?,
                    stride_a: g.stride_a as i64,
                    stride_b: g.stride_b as i64,
                    stride_c: g.stride_c as i64,
                };
                self.blas.gemm_strided_batched(cfg, &av, &bv, &mut cv)
            }
        };
        r.map_err(|e| err("sgemm", e))
    }

    unsafe fn gemm_half_unchecked(
        &self,
        g: &Gemm,
        a: (&Self::Half, usize),
        b: (&Self::Half, usize),
        c: HalfGemmOut<'_, Self::Buf, Self::Half>,
    ) -> Result<()> {
        self.bind()?;
        let cfg = Self::config(g)?;
        let h = cudaDataType_t::CUDA_R_16BF;
        let (av, bv) = (a.0.slice(a.1..), b.0.slice(b.1..));
        let (ap, _ra) = av.device_ptr(&self.stream);
        let (bp, _rb) = bv.device_ptr(&self.stream);
        let compute = cublasComputeType_t::CUBLAS_COMPUTE_32F;
        match c {
            HalfGemmOut::F32(buf, off) => {
                let mut cv = buf.slice_mut(off..);
                let (cp, _rc) = cv.device_ptr_mut(&self.stream);
                let f = cudaDataType_t::CUDA_R_32F;
                // SAFETY: `Device::gemm_half` checked every problem inside the views.
                unsafe { self.gemm_ex(g, &cfg, (ap, h), (bp, h), (cp, f), compute) }
            }
            HalfGemmOut::Bf16(buf, off) => {
                let mut cv = buf.slice_mut(off..);
                let (cp, _rc) = cv.device_ptr_mut(&self.stream);
                // SAFETY: as above.
                unsafe { self.gemm_ex(g, &cfg, (ap, h), (bp, h), (cp, h), compute) }
            }
        }
    }

    unsafe fn gemm_half_bias_unchecked(
        &self,
        g: &Gemm,
        a: (&Self::Half, usize),
        b: (&Self::Half, usize),
        ep: &Epilogue<'_, Self::Buf, Self::Half>,
        c: HalfGemmOut<'_, Self::Buf, Self::Half>,
    ) -> Result<bool> {
        let Some(lt) = &self.lt else {
            return Ok(false);
        };
        // cuBLASLt's epilogue is relu(A·B + C + bias): with a residual in
        // C, not the bias-ReLU-then-residual asked for.
        if ep.relu && ep.residual.is_some() {
            return Ok(false);
        }
        self.bind()?;
        let key = LtKey {
            trans_a: g.trans_a,
            trans_b: g.trans_b,
            m: g.m,
            n: g.n,
            k: g.k,
            lda: g.lda,
            ldb: g.ldb,
            ldc: g.ldc,
            out_bf16: matches!(c, HalfGemmOut::Bf16(..)),
            relu: ep.relu,
            bias_bf16: false,
            residual: ep.residual.is_some(),
        };
        let mut plans = lt
            .plans
            .lock()
            .map_err(|_| err("cuBLASLt plans", "a previous call panicked"))?;
        // The f32 bias if cuBLASLt takes it with this C, else the bf16 copy.
        let biases = [
            (key, Some(ep.bias.device_ptr(&self.stream).0)),
            (
                LtKey {
                    bias_bf16: true,
                    ..key
                },
                ep.bias_half.map(|h| h.device_ptr(&self.stream).0),
            ),
        ];
        let mut chosen = None;
        for (key, ptr) in biases {
            let Some(ptr) = ptr else { continue };
            // No algorithm for a shape: asked once, then unfused or the next bias.
            let plan = plans.entry(key).or_insert_with(|| lt.plan(&key, ptr).ok());
            if plan.is_some() {
                chosen = Some((key, ptr));
                break;
            }
        }
        let Some((key, biasp)) = chosen else {
            return Ok(false);
        };
        let Some(plan) = plans.get_mut(&key).and_then(Option::as_mut) else {
            return Ok(false);
        };
        let (av, bv) = (a.0.slice(a.1..), b.0.slice(b.1..));
        let (ap, _ra) = av.device_ptr(&self.stream);
        let (bp, _rb) = bv.device_ptr(&self.stream);
        // The stream orders every use (event tracking is off), so only the
        // address is kept.
        let dp = match c {
            HalfGemmOut::F32(buf, off) => buf.slice_mut(off..).device_ptr_mut(&self.stream).0,
            HalfGemmOut::Bf16(buf, off) => buf.slice_mut(off..).device_ptr_mut(&self.stream).0,
        };
        // With a residual, C is it (beta 1) and D the output; else C is D,
        // unread (beta 0).
        let (cp, beta) = match ep.residual {
            Some(r) => (r.device_ptr(&self.stream).0, 1f32),
            None => (dp, 0f32),
        };
        let (wp, _rw) = lt.workspace.device_ptr(&self.stream);
        let alpha = g.alpha;
        let (desc, la, lb, lc) = (plan.desc, plan.a, plan.b, plan.c);
        // SAFETY: the caller checked A, B, C (and the residual) inside the
        // views and the bias's length; the plan was made for this shape;
        // alpha and beta are read during the call, which only enqueues the
        // work; a candidate only writes D, which the kept one rewrites.
        let run = |algo: &lt::cublasLtMatmulAlgo_t| unsafe {
            set_attr(desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &biasp)?;
            ltr::matmul(
                lt.handle,
                desc,
                (&alpha) as *const f32 as *const _,
                (&beta) as *const f32 as *const _,
                ap as *const _,
                la,
                bp as *const _,
                lb,
                cp as *const _,
                lc,
                dp as *mut _,
                lc,
                algo,
                wp as *mut _,
                LT_WORKSPACE,
                self.stream.cu_stream() as *mut _,
            )
            .map_err(|e| e.0)
        };
        let timing = !plan.candidates.is_empty();
        if timing {
            let candidates = std::mem::take(&mut plan.candidates);
            if let Some(best) = self.fastest(&key, &candidates, &run) {
                if best.data != plan.algo.data {
                    plan.fallback = Some(plan.algo);
                }
                plan.algo = best;
            }
        }
        use lt::cublasStatus_t as S;
        // What a call may refuse an algorithm for (it then enqueued
        // nothing); any other failure is no algorithm's fault.
        let refusal = |status: S| {
            matches!(
                status,
                S::CUBLAS_STATUS_NOT_SUPPORTED
                    | S::CUBLAS_STATUS_INVALID_VALUE
                    | S::CUBLAS_STATUS_ARCH_MISMATCH
            )
        };
        let mut called = run(&plan.algo);
        if let (Err(status), Some(first)) = (called, plan.fallback) {
            if refusal(status) {
                // The timed algorithm refused where the heuristic's own pick
                // may not be: that, from now on, before unfused.
                plan.fallback = None;
                plan.algo = first;
                called = run(&plan.algo);
                if let Ok(mut t) = TUNING.lock() {
                    t.push(format!(
                        "cuBLASLt {}x{}x{}: the timed algorithm refused ({status:?}); the heuristic's \
                         first {}",
                        key.m,
                        key.n,
                        key.k,
                        if called.is_ok() { "from now on" } else { "refused too" },
                    ));
                }
            }
        }
        if let Err(status) = called {
            // The heuristic offered this plan but the call refused it (or
            // every timed candidate failed): this shape runs unfused from
            // now on, the bf16 bias's plan tried first, rather than the
            // encode failing. A refused call enqueued nothing, so D is as
            // the caller left it. Any other failure (a dead context after
            // a kernel's fault, say) is the error it is.
            if !refusal(status) {
                return Err(err("cublasLtMatmul", status));
            }
            plans.insert(key, None);
            if let Ok(mut t) = TUNING.lock() {
                t.push(format!(
                    "cuBLASLt {}x{}x{}{}{}: the call failed ({status:?}); unfused from now on",
                    key.m,
                    key.n,
                    key.k,
                    if key.relu { " relu" } else { "" },
                    if key.residual { " +residual" } else { "" },
                ));
            }
            return Ok(false);
        }
        if timing {
            if let Ok(mut timed) = lt.timed.lock() {
                timed.insert(key.class(), plan.algo);
            }
        }
        Ok(true)
    }

    fn upload_half(&self, host: &[u16]) -> Result<Self::Half> {
        self.stream
            .clone_htod(host)
            .map_err(|e| err("copying to the GPU", e))
    }

    fn alloc_half(&self, n: usize) -> Result<Self::Half> {
        // SAFETY: as `alloc`: written before read.
        unsafe { self.stream.alloc::<u16>(n) }.map_err(|e| err("allocating GPU memory", e))
    }

    fn half_len(buf: &Self::Half) -> usize {
        buf.len()
    }

    fn tensor_cores(&self) -> bool {
        self.tensor_cores
    }

    fn launch(
        &self,
        kernel: Kernel,
        launch: Launch,
        args: &mut [Arg<'_, Self::Buf, Self::Half>],
    ) -> Result<()> {
        let mut b = self.stream.launch_builder(&self.kernels[kernel as usize]);
        for a in args.iter_mut() {
            match a {
                Arg::In(buf) => b.arg(*buf),
                Arg::Out(buf) => b.arg(&mut **buf),
                Arg::HalfOut(buf) => b.arg(&mut **buf),
                Arg::HalfIn(buf) => b.arg(*buf),
                Arg::Null => b.arg(&NULL),
                Arg::I32(v) => b.arg(&*v),
                Arg::F32(v) => b.arg(&*v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: (launch.grid, 1, 1),
            block_dim: (launch.block, 1, 1),
            shared_mem_bytes: launch.shared_bytes,
        };
        // SAFETY: the callers in gpu/mod.rs pass the kernel's arguments in its
        // signature's order and types (the emulator checks both), and size
        // the grid and shared memory as each kernel's comment says.
        unsafe { b.launch(cfg) }.map_err(|e| err(kernel.name(), e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVRTC needs no GPU, so the kernels are compiled by the real NVRTC
    /// wherever libnvrtc loads: `scripts/test.sh` fetches CUDA 12.6's from
    /// PyPI, puts it on `LD_LIBRARY_PATH` and sets `FLOTILLA_REQUIRE_NVRTC`,
    /// which makes its absence a failure. Every kernel must come out as a
    /// PTX entry under its plain name, which is what `load_function` asks for.
    /// The PTX's kernels as (name, body up to the next kernel or function).
    fn ptx_entries(src: &str) -> impl Iterator<Item = (&str, &str)> {
        src.split("\n.")
            .filter_map(|part| {
                let part = part.strip_prefix("visible .").unwrap_or(part);
                part.strip_prefix("entry ")
            })
            .filter_map(|entry| Some((entry.split('(').next()?, entry)))
    }

    #[test]
    fn kernels_compile_with_nvrtc() {
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            assert!(
                std::env::var_os("FLOTILLA_REQUIRE_NVRTC").is_none(),
                "FLOTILLA_REQUIRE_NVRTC is set but libnvrtc did not load"
            );
            eprintln!("libnvrtc did not load: kernel compilation not checked");
            return;
        }
        // NVRTC's default architecture (GPUs before sm_80: `attention_mma`
        // a stub) and compute_80 (tensor cores), as `kernels_ptx` compiles.
        for arch in [None, Some("compute_80")] {
            let ptx = compile_kernels(arch)
                .unwrap_or_else(|e| panic!("{arch:?}: NVRTC refuses the kernels: {e}"));
            let src = ptx.to_src();
            for k in Kernel::ALL {
                assert!(
                    src.contains(&format!(".entry {}(", k.name())),
                    "{arch:?}: no PTX entry {}",
                    k.name()
                );
            }
            // Arrays the compiler could not keep in registers (an index
            // it cannot resolve) would go to local memory, slow on a GPU.
            // Allowed: `doy_encoding`'s (the quadrant double `sincos`
            // returns through memory; its slow path for huge arguments is
            // a function of its own, which no day reaches).
            let local: Vec<&str> = ptx_entries(&src)
                .filter(|(name, body)| *name != "doy_encoding" && body.contains(".local"))
                .map(|(name, _)| name)
                .collect();
            assert!(
                local.is_empty(),
                "{arch:?}: kernels using local memory: {local:?}"
            );
            let mma = ptx_entries(&src).any(|(name, body)| {
                name == "attention_mma"
                    && body.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
            });
            assert_eq!(mma, arch.is_some(), "{arch:?}: mma.sync in the PTX: {mma}");
        }
        // Through the on-disk cache as `kernels_ptx` goes: compiled once,
        // then the same PTX read back, in a fraction of the time.
        let cache = tempfile::tempdir().expect("a temporary directory");
        let version = nvrtc_version().expect("NVRTC's version");
        let parts: &[&[u8]] = &[KERNELS.as_bytes(), b"compute_80", version.as_bytes()];
        let through_cache = || {
            let started = std::time::Instant::now();
            let (ptx, origin) = kernel_cache::ptx_cached(Ok(cache.path()), parts, || {
                compile_kernels(Some("compute_80")).map(|p| p.to_src())
            })
            .expect("compute_80 compiles");
            (ptx, origin, started.elapsed())
        };
        let (compiled, first, t_compiled) = through_cache();
        let (cached, second, t_cached) = through_cache();
        assert!(
            matches!(first, kernel_cache::Origin::Compiled { stored: Ok(_), .. }),
            "{first}"
        );
        assert!(
            matches!(second, kernel_cache::Origin::Cached(_)),
            "{second}"
        );
        assert_eq!(compiled, cached, "the cache gave back other PTX");
        eprintln!("{version}, compute_80: compiled in {t_compiled:?}, read from the cache in {t_cached:?}");
        // And on to an H100/H200's machine code, where ptxas says what each
        // kernel needs: `attention_mma` keeps its running output in
        // registers, and spilling them would undo the point of it.
        let src = std::ffi::CString::new(KERNELS).expect("no NUL in the kernels");
        let prog = cudarc::nvrtc::result::create_program(&src, None).expect("an NVRTC program");
        // SAFETY: prog is a live program; the options are plain strings.
        let compiled = unsafe {
            cudarc::nvrtc::result::compile_program(
                prog,
                &["--gpu-architecture=sm_90", "--ptxas-options=-v"],
            )
        };
        // SAFETY: as above; the log is read once compilation has returned.
        let log = unsafe { cudarc::nvrtc::result::get_program_log(prog) }.expect("NVRTC's log");
        // SAFETY: prog is not used after this.
        let _ = unsafe { cudarc::nvrtc::result::destroy_program(prog) };
        let log: String = log
            .iter()
            .map(|&c| c as u8 as char)
            .filter(|&c| c != '\0')
            .collect();
        assert!(compiled.is_ok(), "sm_90: {compiled:?}\n{log}");
        let mma = log
            .split("Compiling entry function 'attention_mma'")
            .nth(1)
            .and_then(|rest| rest.split("Compiling entry function").next())
            .unwrap_or_else(|| panic!("ptxas said nothing of attention_mma:\n{log}"));
        eprintln!("attention_mma on sm_90:{mma}");
        assert!(
            mma.contains(" 0 bytes spill stores"),
            "attention_mma spills:{mma}"
        );
        // The machine code a driver that refuses the PTX gets instead: an
        // ELF image naming every kernel (and a GPU NVRTC does not know is
        // an error that says so, not an empty image).
        let cubin = kernels_cubin(9, 0).expect("sm_90 machine code");
        assert_eq!(kernels_cubin(9, 0), Ok(cubin.clone()), "not kept");
        assert_eq!(&cubin[..4], b"\x7fELF", "not an ELF image");
        for k in Kernel::ALL {
            assert!(
                cubin
                    .windows(k.name().len())
                    .any(|w| w == k.name().as_bytes()),
                "no {} in the machine code",
                k.name()
            );
        }
        let refused = compile_cubin(1, 0).expect_err("sm_10 is no GPU NVRTC builds for");
        assert!(refused.contains("sm_10"), "{refused}");
    }
}
