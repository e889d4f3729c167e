//! The CUDA device for the GPU path: cuBLAS SGEMMs and NVRTC-compiled kernels via cudarc.
//!
//! cudarc loads libcuda, libcublas and libnvrtc at run time
//! (`dynamic-loading`), so this module builds on every machine; [`probe`]
//! says whether this one has the libraries and a GPU, and `auto` only picks
//! CUDA when it does.
//!
//! Status: the model code above this device (layouts, launches, kernels)
//! is checked on the CPU against the fixtures by the emulated device in
//! `emulator/`; this module, the thin binding to the driver, cuBLAS and
//! NVRTC, is checked only on a GPU (`scripts/gpu-check.sh`: it ran on an
//! H200, 2026-12-04; the page-locked staging and its events, added since,
//! have not). The fixture tests (`tests/fixtures.rs`) include this backend
//! and skip it where [`probe`] fails.
//!
//! # Layout
//!
//! - `mod.rs` — `CudaDevice` and the `CudaBackend` on it.
//! - `context` — the probe, GPU 0's context, and building the device.
//! - `nvrtc` — the kernels compiled by NVRTC (or read from the cache).
//! - `device` — the `Device` implementation: copies, GEMMs, launches.
//! - `lt` — cuBLASLt GEMM plans and their algorithm timing.
//! - `staging` — page-locked staging buffers for the copies.

mod context;
mod device;
mod lt;
mod nvrtc;
mod staging;

use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaFunction, CudaStream};

pub use context::{device_name, memory_in_use_mib, probe, release_trial_device};
pub use lt::{fused_epilogue_report, gemm_tuning_report};
pub use nvrtc::kernels_report;

use super::{GemmMath, GpuBackend};
use crate::error::{EncodeError, Result};
use crate::model::StudentWeights;
use crate::profile::DeviceProfile;
use lt::Lt;
use staging::CudaStaging;

const NAME: &str = "cuda";

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
    /// In [`Kernel::ALL`](super::Kernel::ALL)'s order, so `kernels[k as usize]` is `k`.
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
