//! A thin, safe FFI over the system oneDNN 2.x (Debian's libdnnl).
//!
//! It serves the encoder's `onednn` backend.
//!
//! # Layout
//!
//! - `sys`: hand-written `extern "C"` declarations and constants, checked against the 2.6.3 headers.
//! - `error`: [`Error`] (a failed call with its [`Status`], or a caller mistake) and [`Result`].
//! - `engine`: the shared CPU [`Engine`] and per-thread [`Stream`]s.
//! - `memory`: [`DataType`], the [`Element`] types, [`MemoryDesc`] (row-major, strided, `any`).
//! - `bf16`: the [`Bf16`] element and f32 <-> bf16 conversion.
//! - `cpu_features`: [`bf16_supported`], oneDNN's [`effective_isa`] and [`version`].
//! - `threading`: per-thread oneDNN thread count ([`ThreadScope`]); why primitives pin it.
//! - `primitive`: owned primitive / descriptor / attribute / post-op handles, reorders, the per-thread scratchpad.
//! - `matmul`: [`MatMul`], a linear layer with weights packed once and primitives cached per M.
//! - `batched`: [`BatchedMatMul`], batched (optionally strided) matmul on runtime operands, for attention.
//! - `rate`: [`sgemm_rate`] and [`matmul_rate`], this machine's GEMM roofline.
//! - `v3`: oneDNN 3.x opened at run time where a `libdnnl.so.3` is found
//!   ([`v3::runtime`]), and [`v3::MatMul3`], the same matmul on it (AMX by
//!   default where the CPU has it; 2.x needs `ONEDNN_MAX_CPU_ISA`).
//!
//! # Threading
//!
//! Everything here is `Send + Sync` except [`Stream`] and [`ThreadScope`].
//! One [`MatMul`] may be executed from many threads at once: the primitive is
//! immutable, each thread gets its own stream (cached thread-locally) and its
//! own scratchpad (primitives use `scratchpad_mode_user`, so oneDNN's shared
//! library scratchpad is never touched), and the memory objects around the
//! caller's buffers are made per call. Each primitive runs with the thread
//! count in its spec, set on the calling thread through libgomp for the
//! duration of the call; thread-per-block callers use `threads: 1`, and then
//! oneDNN starts no OpenMP workers at all (tested in `tests/omp_threads.rs`).
//! Callers that use `threads > 1` from several threads at once get one
//! OpenMP team per calling thread; set `OMP_WAIT_POLICY=passive` then, or
//! idle team members spin and steal cores from the others.
//!
//! # bf16
//!
//! [`bf16_supported`] says whether this CPU runs bf16 natively (AMX or
//! AVX512-BF16, and libdnnl dispatches to it). Where it does not, oneDNN 2.6
//! has no bf16 matmul at all on AVX2 (`MatMul::new` returns
//! `Error::Dnnl { status: Unimplemented, .. }`), so callers should pick f32.
//!
//! # Using it optionally
//!
//! Building this crate needs libdnnl-dev (oneDNN 2.x); without it `build.rs`
//! stops with what to install. Crates that must build everywhere depend on it
//! behind a feature:
//!
//! ```toml
//! [dependencies]
//! onednn = { path = "../onednn", optional = true }
//! [features]
//! onednn = ["dep:onednn"]
//! ```

mod batched;
mod bf16;
mod cpu_features;
mod engine;
mod error;
mod matmul;
mod memory;
mod primitive;
mod rate;
mod sys;
mod threading;
#[cfg(target_os = "linux")]
pub mod v3;

pub use batched::{BatchedMatMul, BatchedMatMulSpec};
pub use bf16::{bf16_to_f32, f32_to_bf16, f32_to_bf16_into, to_bf16_vec, Bf16};
pub use cpu_features::{bf16_supported, effective_isa, version, CpuFeatures, Version};
pub use engine::{Engine, Stream};
pub use error::{Error, Result, Status};
pub use matmul::{MatMul, MatMulSpec};
pub use memory::{DataType, Element, MemoryDesc};
pub use primitive::PostOp;
pub use rate::{matmul_rate, sgemm_rate, RATE_SHAPE};
pub use threading::{max_threads, set_max_threads, ThreadScope};
