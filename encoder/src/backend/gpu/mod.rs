//! The GPU path: the model's forward pass written once over a [`Device`].
//!
//! Every Linear is one SGEMM over the whole chunk, attention's two products
//! are strided batched SGEMMs (one per head, over all pixels of the chunk)
//! with `softmax_rows` between them, and the rest (the day-of-year
//! encoding, bias and epilogues, LayerNorm, attention pooling) are the
//! small kernels in `kernels.cu`. In bf16 on a GPU with tensor cores
//! (sm_80 on), attention is one kernel instead, `attention_mma`, whose
//! scores stay in registers (`FLOTILLA_CUDA_GEMM_ATTENTION` keeps the
//! GEMMs, to compare). Only
//! the inputs (bands and days) go to the device and only the embeddings
//! come back: each window's pooled features stay in a device buffer the
//! head reads (`Backend::kept_windows`; `FLOTILLA_CUDA_HOST_FEATURES`
//! brings them back per chunk and takes them up again for the head).
//!
//! Two devices implement [`Device`] (`device.rs`): `cuda/` (cuBLAS and
//! NVRTC through cudarc, the real thing) and, in this crate's tests,
//! `emulator/`, which runs the same kernel source on the CPU and emulates
//! cuBLAS's column-major SGEMM, so this module's layouts, launches and kernels
//! are checked against the fixtures on machines without a GPU.
//!
//! Layout conventions: every activation is row-major (rows = tokens), and
//! SGEMM (column-major) sees a row-major (r × c) matrix as its transpose.
//!
//! Precision: with `dtype = "bf16"` the backbones keep bf16 copies of their
//! weights and of every activation a GEMM reads (written by the kernel that
//! produces it, rounded to nearest even), and run their GEMMs on bf16 with
//! f32 accumulation; the residual stream, LayerNorm, softmax's sums and
//! pooling stay f32. That is the same arithmetic as f32 GEMMs whose inputs
//! are rounded to bf16 as they are read (the emulator checks the two give
//! the same bits), with half the bytes read by each GEMM. The head's few
//! GEMMs run on f32 buffers with the device's math.
//!
//! Determinism: one stream, a fixed kernel and GEMM order, and reductions in
//! a fixed tree order per block, so the same chunk gives the same bits on the
//! same GPU and library versions; thread counts do not apply. One exception:
//! the bf16 GEMMs with fused epilogues (cuBLASLt) run the algorithm that
//! timed fastest for their shape in this process, and the heuristic's own
//! pick unless another is clearly (5 %) faster, so two processes agree but
//! for a candidate that times at that edge; `FLOTILLA_CUDA_NO_GEMM_TUNING`
//! keeps the heuristic's pick, and so the same bits every run.
//!
//! # Layout
//!
//! - `mod.rs` — [`GpuBackend`] and the model's weights on a device: their
//!   types and their upload (with bf16 copies and the day-of-year table).
//! - `backend` — `Backend` on a `GpuBackend`: chunks queued and collected,
//!   kept windows and their heads.
//! - `forward` — the backbone and head passes, queued behind tickets.
//! - `ops` — a pass's steps as GEMMs and kernel launches.
//! - `scratch` — the device buffers kept from chunk to chunk.
//! - `device` — the [`Device`] interface and its kernels (`kernels.cu`);
//!   `cuda/` its real implementation, `emulator` the tests' CPU one;
//!   `kernel_cache` the on-disk cache of NVRTC's output.

mod backend;
#[cfg(all(feature = "cuda", any(target_os = "linux", target_os = "windows")))]
pub mod cuda;
mod device;
#[cfg(test)]
mod emulator;
mod forward;
#[cfg(all(feature = "cuda", any(target_os = "linux", target_os = "windows")))]
pub mod kernel_cache;
mod ops;
mod scratch;

use std::sync::{Arc, Mutex};

pub(crate) use device::{
    Arg, Device, Epilogue, Gemm, GemmMath, HalfGemmOut, Kernel, Launch, DOY_TABLE_DAYS, KERNELS,
};

use super::SlotPool;
use crate::error::{EncodeError, Result};
use crate::model::{Backbone, LayerNorm, Linear, StudentWeights};
use ops::doy_encoding;
use scratch::Scratch;

struct DeviceLinear<D: Device> {
    in_dim: usize,
    out_dim: usize,
    /// (out, in) row-major, as in the checkpoint.
    weight: D::Buf,
    /// The same in bf16, for the bf16 backbones.
    weight_half: Option<D::Half>,
    bias: D::Buf,
    /// The bias in bf16 (bf16 backbones), for a fused GEMM epilogue that
    /// takes no f32 bias.
    bias_half: Option<D::Half>,
}

struct DeviceNorm<D: Device> {
    dim: usize,
    affine: Option<(D::Buf, D::Buf)>,
    eps: f32,
}

struct DeviceLayer<D: Device> {
    in_proj: DeviceLinear<D>,
    out_proj: DeviceLinear<D>,
    linear1: DeviceLinear<D>,
    linear2: DeviceLinear<D>,
    norm1: DeviceNorm<D>,
    norm2: DeviceNorm<D>,
}

struct DeviceBackbone<D: Device> {
    d: usize,
    nhead: usize,
    ffn: usize,
    embed0: DeviceLinear<D>,
    embed2: DeviceLinear<D>,
    layers: Vec<DeviceLayer<D>>,
    pool_w: D::Buf,
    pool_b: f32,
    /// The day-of-year encoding of days 0 to 366 at width `d` (`doy_table`).
    doy_table: D::Buf,
}

/// The model's weights on a device, and the device; one caller at a time.
struct GpuModel<D: Device> {
    dev: D,
    /// The backbones run on bf16 copies (profile dtype bf16).
    half: bool,
    s2: DeviceBackbone<D>,
    s1: DeviceBackbone<D>,
    fc1: DeviceLinear<D>,
    norm1: DeviceNorm<D>,
    fc2: DeviceLinear<D>,
    out_norm: DeviceNorm<D>,
}

/// A [`Backend`](super::Backend) on any [`Device`]; `name` is what errors and `--backend`
/// call it.
pub(crate) struct GpuBackend<D: Device> {
    name: &'static str,
    model: Mutex<(GpuModel<D>, Scratch<D>)>,
    d: usize,
    repr_dim: usize,
    /// [`MAX_ROWS`] (smaller in a test, to make parts).
    max_rows: usize,
    /// Whether the pooled features stay on the device for the head
    /// ([`Backend::kept_windows`](super::Backend::kept_windows)): unless
    /// `FLOTILLA_CUDA_HOST_FEATURES` is set.
    keep_features: bool,
    /// The window slots encodes lease.
    slots: Arc<SlotPool>,
}

impl<D: Device> GpuBackend<D> {
    /// Upload the weights once (and their bf16 copies when the device
    /// computes in bf16).
    pub(crate) fn create(name: &'static str, dev: D, weights: Arc<StudentWeights>) -> Result<Self> {
        let half = dev.math() == GemmMath::Bf16;
        Self::create_with(name, dev, weights, half)
    }

    /// [`GpuBackend::create`], the backbones on bf16 copies or not as
    /// `half` says (the tests compare the two ways of computing bf16).
    pub(crate) fn create_with(
        name: &'static str,
        dev: D,
        weights: Arc<StudentWeights>,
        half: bool,
    ) -> Result<Self> {
        let ffn = weights.config.dim_feedforward;
        let model = GpuModel {
            half,
            s2: backbone(&dev, &weights.s2, ffn, half)?,
            s1: backbone(&dev, &weights.s1, ffn, half)?,
            fc1: linear(&dev, &weights.head.fc1, false)?,
            norm1: norm(&dev, &weights.head.norm1)?,
            fc2: linear(&dev, &weights.head.fc2, false)?,
            out_norm: norm(&dev, &weights.head.out_norm)?,
            dev,
        };
        Ok(GpuBackend {
            name,
            model: Mutex::new((model, Scratch::new())),
            d: weights.config.d_model(),
            repr_dim: weights.config.repr_dim,
            max_rows: MAX_ROWS,
            keep_features: !super::features_on_host(),
            slots: Arc::new(SlotPool::default()),
        })
    }

    #[allow(clippy::type_complexity)]
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, (GpuModel<D>, Scratch<D>)>> {
        self.model
            .lock()
            .map_err(|_| EncodeError::backend(self.name, "a previous device call panicked"))
    }
}

fn linear<D: Device>(dev: &D, l: &Linear, half: bool) -> Result<DeviceLinear<D>> {
    Ok(DeviceLinear {
        in_dim: l.in_dim,
        out_dim: l.out_dim,
        weight: dev.upload(&l.weight)?,
        weight_half: if half {
            // On every core: the Large student's 44 M weights take tens of
            // milliseconds of start-up on one.
            use rayon::prelude::*;
            let bits: Vec<u16> = l.weight.par_iter().map(|&w| device::bf16_bits(w)).collect();
            Some(dev.upload_half(&bits)?)
        } else {
            None
        },
        bias: dev.upload(&l.bias)?,
        bias_half: if half {
            let bits: Vec<u16> = l.bias.iter().map(|&b| device::bf16_bits(b)).collect();
            Some(dev.upload_half(&bits)?)
        } else {
            None
        },
    })
}

fn norm<D: Device>(dev: &D, n: &LayerNorm) -> Result<DeviceNorm<D>> {
    Ok(DeviceNorm {
        dim: n.dim,
        affine: match &n.affine {
            Some((w, b)) => Some((dev.upload(w)?, dev.upload(b)?)),
            None => None,
        },
        eps: n.eps,
    })
}

fn backbone<D: Device>(dev: &D, b: &Backbone, ffn: usize, half: bool) -> Result<DeviceBackbone<D>> {
    if !b.d_model.is_multiple_of(2) {
        return Err(EncodeError::backend(
            "gpu",
            format!(
                "d_model {} is odd; the day-of-year encoding needs pairs",
                b.d_model
            ),
        ));
    }
    let mut layers = Vec::with_capacity(b.layers.len());
    for l in &b.layers {
        layers.push(DeviceLayer {
            in_proj: linear(dev, &l.in_proj, half)?,
            out_proj: linear(dev, &l.out_proj, half)?,
            linear1: linear(dev, &l.linear1, half)?,
            linear2: linear(dev, &l.linear2, half)?,
            norm1: norm(dev, &l.norm1)?,
            norm2: norm(dev, &l.norm2)?,
        });
    }
    Ok(DeviceBackbone {
        d: b.d_model,
        nhead: b.nhead,
        ffn,
        embed0: linear(dev, &b.embed0, half)?,
        embed2: linear(dev, &b.embed2, half)?,
        layers,
        pool_w: dev.upload(&b.pool.weight)?,
        pool_b: b.pool.bias[0],
        doy_table: doy_table(dev, b.d_model)?,
    })
}

/// The day-of-year encoding of every day 0 to [`DOY_TABLE_DAYS`] - 1 at
/// width `d`, computed by the kernel itself (so a copy from it has the bits
/// the kernel would compute).
fn doy_table<D: Device>(dev: &D, d: usize) -> Result<D::Buf> {
    let days: Vec<f32> = (0..DOY_TABLE_DAYS).map(|i| i as f32).collect();
    let days = dev.upload(&days)?;
    let mut table = dev.alloc(DOY_TABLE_DAYS * d)?;
    doy_encoding(dev, &days, &mut table, DOY_TABLE_DAYS, d, None)?;
    Ok(table)
}

/// Tokens (pixels x sequence length) one backbone pass takes at most; a
/// chunk with more is run in parts (a pixel's result does not depend on
/// the others in its pass, though cuBLAS may pick another algorithm for
/// another size). 2^19 is 8,192 px of 64 tokens, above the best chunk an
/// H200 showed in f32 (4,096 px), and keeps every buffer's element count
/// (at most 2^19 x the FFN's width) far inside a kernel's and cuBLAS's int.
pub(crate) const MAX_ROWS: usize = 1 << 19;
