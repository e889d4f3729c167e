//! A stand-in GPU for tests on machines without one: the GPU path run on the CPU.
//!
//! This crate's CI has no GPU. The emulator runs the GPU path (`gpu/`) — the same
//! layouts, SGEMM calls, launches and kernel source as the CUDA device — on
//! the CPU, so the GPU path is checked against the fixtures everywhere. It is a mock of the GPU, and says so:
//! it cannot find a bug in `cuda/`'s binding to cudarc, in NVRTC itself or
//! in a real GPU's timing; those need a GPU run.
//!
//! - **SGEMM** follows cuBLAS's column-major `cublasSgemmStridedBatched`
//!   contract (see [`Gemm`](super::Gemm)), with its leading-dimension rules, and refuses
//!   a matrix that would run past its buffer.
//! - **Kernels**: [`KERNELS`](super::KERNELS) is compiled by the system C++ compiler as
//!   C++20, each kernel a coroutine per GPU thread: `__syncthreads()`
//!   suspends the thread, and a block's threads are resumed in turn until
//!   all have finished, so shared memory and barriers behave as on a GPU
//!   (threads that disagree about a barrier are reported). The prelude
//!   declares only the CUDA built-ins the kernels use, and no standard
//!   header comes before the kernels, so a name NVRTC would not know (such
//!   as `INFINITY`) fails here too. Each launch checks the kernel's
//!   argument count and types (pointer, int, float) against its signature,
//!   the block size and shared memory against CUDA's limits, and that no
//!   kernel wrote past a buffer or its shared memory (canaries); shared
//!   memory starts as NaN, as good as the garbage a GPU leaves there.
//!
//! # Layout
//!
//! - `mod.rs` — [`EmulatedDevice`] and its memory: buffers followed by canaries.
//! - `compile` — the kernel source as C++20 coroutines (the prelude and the
//!   launcher with its checks), compiled by g++ and loaded.
//! - `device` — the `Device` implementation: copies, cuBLAS's SGEMM contract, launches.
//! - `tests` — the GPU backend on the emulated device: the fixtures against
//!   upstream, precision, kept features, encodes at once.
//! - `kernel_tests` — `kernels.cu`'s kernels against the same arithmetic on the host.

mod compile;
mod device;
#[cfg(test)]
mod kernel_tests;
#[cfg(test)]
mod tests;

use super::GemmMath;
use crate::error::EncodeError;
use compile::{kernels, Kernels};

const NAME: &str = "gpu-emulator";

/// Floats after every buffer, set to [`CANARY_BITS`] and checked after each
/// launch.
const CANARY: usize = 64;
const CANARY_BITS: u32 = 0x7fc0_dead;

/// A buffer in host memory, followed by [`CANARY`] floats.
pub(crate) struct EmuBuf {
    data: Vec<f32>,
}

/// A bf16 buffer in host memory (16-bit values), followed by [`CANARY`]
/// halves of [`HALF_CANARY`].
pub(crate) struct EmuHalf {
    data: Vec<u16>,
}

/// A bf16 NaN nothing computes.
const HALF_CANARY: u16 = 0x7fde;

impl EmuHalf {
    fn new(mut data: Vec<u16>) -> Self {
        data.extend(std::iter::repeat_n(HALF_CANARY, CANARY));
        EmuHalf { data }
    }
    fn len(&self) -> usize {
        self.data.len() - CANARY
    }
    fn canary_intact(&self) -> bool {
        self.data[self.len()..].iter().all(|&v| v == HALF_CANARY)
    }
}

impl EmuBuf {
    fn new(mut data: Vec<f32>) -> Self {
        data.extend(std::iter::repeat_n(f32::from_bits(CANARY_BITS), CANARY));
        EmuBuf { data }
    }
    fn len(&self) -> usize {
        self.data.len() - CANARY
    }
    fn canary_intact(&self) -> bool {
        self.data[self.len()..]
            .iter()
            .all(|v| v.to_bits() == CANARY_BITS)
    }
}

fn err(msg: impl Into<String>) -> EncodeError {
    EncodeError::backend(NAME, msg.into())
}

/// The emulated GPU, its GEMMs computing as `math` says.
pub(crate) struct EmulatedDevice {
    kernels: &'static Kernels,
    math: GemmMath,
    /// Whether `gemm_half_bias` fuses (as cuBLASLt does) or declines (as
    /// a GPU without an algorithm for the shape does).
    fuse_bias: bool,
    /// Whether it offers `mma.sync` (as sm_80 and later do), so the bf16
    /// backbones take `attention_mma`.
    tensor_cores: bool,
}

impl EmulatedDevice {
    pub(crate) fn new(math: GemmMath) -> Self {
        EmulatedDevice {
            kernels: kernels(),
            math,
            fuse_bias: true,
            tensor_cores: true,
        }
    }

    /// The same device, without tensor cores (a GPU before sm_80): bf16
    /// attention runs on the batched GEMMs and `softmax_rows`.
    pub(crate) fn without_tensor_cores(mut self) -> Self {
        self.tensor_cores = false;
        self
    }

    /// The same device, declining every fused GEMM (the caller's fallback).
    pub(crate) fn without_fused_bias(mut self) -> Self {
        self.fuse_bias = false;
        self
    }
}

/// Host staging memory: what a download brought (an upload's is empty: the
/// emulator copies at once).
pub(crate) struct EmuStaging {
    data: Vec<f32>,
}
