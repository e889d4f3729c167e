//! Setting up GPU 0: the probe, the process's one context, and building a `CudaDevice`.

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::sys::{cublasMath_t, cublasStatus_t};
use cudarc::cublas::CudaBlas;
use cudarc::driver::CudaContext;
use cudarc::nvrtc::Ptx;

use super::lt::Lt;
use super::nvrtc::{kernels_cubin, kernels_ptx, KERNELS_ORIGIN};
use super::{err, CudaDevice, NAME};
use crate::backend::gpu::{kernel_cache, GemmMath, Kernel};
use crate::error::{EncodeError, Result};

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

impl CudaDevice {
    /// The device, its cuBLAS handle set to `math` for every GEMM.
    pub(super) fn open(math: GemmMath) -> Result<Self> {
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
    pub(super) fn build() -> std::result::Result<Self, String> {
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
