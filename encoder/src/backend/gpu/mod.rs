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
//! Two devices implement [`Device`] (`device.rs`): `cuda.rs` (cuBLAS and
//! NVRTC through cudarc, the real thing) and, in this crate's tests,
//! `emulator.rs`, which runs the same kernel source on the CPU and emulates
//! cuBLAS's column-major SGEMM, so this file's layouts, launches and kernels
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

#[cfg(all(feature = "cuda", any(target_os = "linux", target_os = "windows")))]
pub mod cuda;
mod device;
#[cfg(test)]
mod emulator;
#[cfg(all(feature = "cuda", any(target_os = "linux", target_os = "windows")))]
pub mod kernel_cache;

use std::sync::{Arc, Mutex};

pub(crate) use device::{
    Arg, Device, Epilogue, Gemm, GemmMath, HalfGemmOut, Kernel, Launch, DOY_TABLE_DAYS, KERNELS,
};

use super::{
    Backend, KeptRows, KeptWindows, PendingBackbone, PendingHead, SequenceBatch, SlotPool,
};
use crate::error::{EncodeError, Result};
use crate::model::{Backbone, LayerNorm, Linear, Modality, StudentWeights};

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

/// A [`Backend`] on any [`Device`]; `name` is what errors and `--backend`
/// call it.
pub(crate) struct GpuBackend<D: Device> {
    name: &'static str,
    model: Mutex<(GpuModel<D>, Scratch<D>)>,
    d: usize,
    repr_dim: usize,
    /// [`MAX_ROWS`] (smaller in a test, to make parts).
    max_rows: usize,
    /// Whether the pooled features stay on the device for the head
    /// ([`Backend::kept_windows`]): unless `FLOTILLA_CUDA_HOST_FEATURES`
    /// is set.
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

/// `doy_encoding` of `doys` (m rows) into `out` (m, d), whole days inside
/// `table` (its own output for days 0 to [`DOY_TABLE_DAYS`] - 1) copied
/// from there.
fn doy_encoding<D: Device>(
    dev: &D,
    doys: &D::Buf,
    out: &mut D::Buf,
    m: usize,
    d: usize,
    table: Option<&D::Buf>,
) -> Result<()> {
    let launch = Launch::elements(m * (d / 2), "day-of-year encoding blocks")?;
    let mut args = [
        Arg::Out(out),
        Arg::In(doys),
        Arg::I32(int(m, "rows")?),
        Arg::I32(int(d, "d")?),
        table.map_or(Arg::Null, Arg::In),
        Arg::I32(int(DOY_TABLE_DAYS, "table days")?),
    ];
    dev.launch(Kernel::DoyEncoding, launch, &mut args)
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

/// A size as a kernel's `int`.
fn int(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| EncodeError::backend("gpu", format!("{what} {v} exceeds a kernel's int")))
}

/// `Gemm` of a Linear over `m` rows: `y (m, out) = x (m, in) · Wᵀ`, all
/// row-major. Column-major it is `yᵀ (out, m) = W · xᵀ`: W's row-major
/// storage is Wᵀ column-major (so `trans_a`, lda = in), x's is xᵀ (no
/// `trans_b`, ldb = in).
fn linear_gemm(in_dim: usize, out_dim: usize, m: usize) -> Gemm {
    Gemm {
        trans_a: true,
        trans_b: false,
        m: out_dim,
        n: m,
        k: in_dim,
        alpha: 1.0,
        lda: in_dim,
        ldb: in_dim,
        beta: 0.0,
        ldc: out_dim,
        batch: 1,
        stride_a: 0,
        stride_b: 0,
        stride_c: 0,
    }
}

/// Attention's two batched GEMMs for head `h` of `px` pixels' sequences of
/// `len` over the packed (px·len, 3d) `qkv`: the scores S (len × len per
/// pixel, row-major) = Q Kᵀ / √hd, then O (len × hd per pixel, row-major,
/// ld d) = P V. Column-major: Sᵀ = K Qᵀ (K's row-major storage, ld 3d, is
/// Kᵀ column-major, so `trans_a`; Q's is Qᵀ) and Oᵀ = Vᵀ Pᵀ (V's storage
/// is Vᵀ, P's is Pᵀ). Returns the GEMMs and the offsets of K, Q, V and O.
fn attention_gemms(
    px: usize,
    len: usize,
    d: usize,
    hd: usize,
    h: usize,
) -> ([Gemm; 2], [usize; 4]) {
    let d3 = 3 * d;
    let scores = Gemm {
        trans_a: true,
        trans_b: false,
        m: len,
        n: len,
        k: hd,
        alpha: 1.0 / (hd as f32).sqrt(),
        lda: d3,
        ldb: d3,
        beta: 0.0,
        ldc: len,
        batch: px,
        stride_a: len * d3,
        stride_b: len * d3,
        stride_c: len * len,
    };
    let out = Gemm {
        trans_a: false,
        trans_b: false,
        m: hd,
        n: len,
        k: len,
        alpha: 1.0,
        lda: d3,
        ldb: len,
        beta: 0.0,
        ldc: d,
        batch: px,
        stride_a: len * d3,
        stride_b: len * len,
        stride_c: len * d,
    };
    ([scores, out], [d + h * hd, h * hd, 2 * d + h * hd, h * hd])
}

/// A kernel argument on device `D`'s buffers.
type DevArg<'a, D> = Arg<'a, <D as Device>::Buf, <D as Device>::Half>;

/// The arguments of a kernel that takes (gamma, beta) or two nulls.
fn affine<D: Device>(n: &DeviceNorm<D>) -> (DevArg<'_, D>, DevArg<'_, D>) {
    match &n.affine {
        Some((g, b)) => (Arg::In(g), Arg::In(b)),
        None => (Arg::Null, Arg::Null),
    }
}

impl<D: Device> GpuModel<D> {
    /// `y (m, out) = epilogue(x (m, in) · Wᵀ + b)` on f32 buffers.
    fn linear(
        &self,
        l: &DeviceLinear<D>,
        x: &D::Buf,
        m: usize,
        y: &mut D::Buf,
        relu: bool,
        residual: Option<&D::Buf>,
    ) -> Result<()> {
        let g = linear_gemm(l.in_dim, l.out_dim, m);
        self.dev.gemm(&g, (&l.weight, 0), (x, 0), (&mut *y, 0))?;
        self.epilogue(y, Some(&l.bias), m, l.out_dim, relu, residual, None)
    }

    /// [`GpuModel::linear`] on a bf16 `x` and the weights' bf16 copy, for a
    /// result wanted only in bf16, with no residual: bias and ReLU in the
    /// GEMM's epilogue where the device can,
    /// so the f32 product never reaches memory (on an H200 the separate
    /// pass took 43 % of a chunk's kernel time), and only otherwise through an
    /// f32 buffer of `wide` floats, taken from `scratch` into `y` the first
    /// time (so a device that fuses never holds it: 2.7 GB for a chunk of
    /// 4,096 px of the Large model).
    #[allow(clippy::too_many_arguments)]
    fn linear_half_lazy(
        &self,
        l: &DeviceLinear<D>,
        x: &D::Half,
        m: usize,
        relu: bool,
        half: &mut D::Half,
        y: &mut Option<D::Buf>,
        (scratch, wide): (&mut Scratch<D>, usize),
    ) -> Result<()> {
        let w = self.weight_half(l)?;
        let g = linear_gemm(l.in_dim, l.out_dim, m);
        let ep = Epilogue {
            bias: &l.bias,
            bias_half: l.bias_half.as_ref(),
            relu,
            residual: None,
        };
        if self
            .dev
            .gemm_half_bias(&g, (w, 0), (x, 0), &ep, HalfGemmOut::Bf16(&mut *half, 0))?
        {
            return Ok(());
        }
        let buf = match y {
            Some(buf) => buf,
            None => y.insert(scratch.take(&self.dev, Slot::Ff, wide)?),
        };
        self.dev
            .gemm_half(&g, (w, 0), (x, 0), HalfGemmOut::F32(&mut *buf, 0))?;
        let bias = Some(&l.bias);
        self.epilogue(buf, bias, m, l.out_dim, relu, None, Some((half, false)))
    }

    /// `y (m, out) = x · Wᵀ + b + residual` in f32 on a bf16 `x` (a
    /// sublayer's output with its residual, what LayerNorm then reads),
    /// bias and residual in the GEMM's epilogue where the device can: then
    /// `true`. Otherwise `y` is the product alone, and `false`: the caller's
    /// next kernel adds them.
    fn linear_half_residual(
        &self,
        l: &DeviceLinear<D>,
        x: &D::Half,
        m: usize,
        y: &mut D::Buf,
        residual: &D::Buf,
    ) -> Result<bool> {
        let w = self.weight_half(l)?;
        let g = linear_gemm(l.in_dim, l.out_dim, m);
        // The bias in f32 only: a bf16 bias would round what the residual
        // stream carries.
        let ep = Epilogue {
            bias: &l.bias,
            bias_half: None,
            relu: false,
            residual: Some(residual),
        };
        if self
            .dev
            .gemm_half_bias(&g, (w, 0), (x, 0), &ep, HalfGemmOut::F32(&mut *y, 0))?
        {
            return Ok(true);
        }
        self.dev
            .gemm_half(&g, (w, 0), (x, 0), HalfGemmOut::F32(&mut *y, 0))?;
        Ok(false)
    }

    fn weight_half<'w>(&self, l: &'w DeviceLinear<D>) -> Result<&'w D::Half> {
        l.weight_half
            .as_ref()
            .ok_or_else(|| EncodeError::backend("gpu", "bf16 weights were not uploaded"))
    }

    /// In place on the (rows, cols) `y`: add `bias` (per column), then ReLU
    /// if asked, then add `residual` — one pass of `bias_epilogue`; with
    /// `half`, the result also (or, `half.1` false, only) in bf16 there.
    #[allow(clippy::too_many_arguments)]
    fn epilogue(
        &self,
        y: &mut D::Buf,
        bias: Option<&D::Buf>,
        rows: usize,
        cols: usize,
        relu: bool,
        residual: Option<&D::Buf>,
        half: Option<(&mut D::Half, bool)>,
    ) -> Result<()> {
        let launch = Launch::row_segments(rows, cols, "epilogue blocks")?;
        let (half, keep) = match half {
            Some((h, keep)) => (Arg::HalfOut(h), keep),
            None => (Arg::Null, true),
        };
        let mut args = [
            Arg::Out(y),
            bias.map_or(Arg::Null, Arg::In),
            residual.map_or(Arg::Null, Arg::In),
            half,
            Arg::I32(int(rows, "rows")?),
            Arg::I32(int(cols, "cols")?),
            Arg::I32(i32::from(relu)),
            Arg::I32(i32::from(keep)),
        ];
        self.dev.launch(Kernel::BiasEpilogue, launch, &mut args)
    }

    /// `y = norm(y + b + residual)` in place on the (m, dim) `y` (a GEMM's
    /// output), in one `residual_layer_norm` launch (the same bits as the
    /// epilogue with the residual followed by `layer_norm`); `added` is
    /// (b, residual), or `None` where the GEMM added them; with `half`,
    /// also in bf16 there.
    fn add_norm(
        &self,
        added: Option<(&D::Buf, &D::Buf)>,
        y: &mut D::Buf,
        m: usize,
        n: &DeviceNorm<D>,
        half: Option<&mut D::Half>,
    ) -> Result<()> {
        let launch = Launch::warp_rows(m, "rows")?;
        let (gamma, beta) = affine(n);
        let (bias, residual) = match added {
            Some((b, r)) => (Arg::In(b), Arg::In(r)),
            None => (Arg::Null, Arg::Null),
        };
        let mut args = [
            Arg::Out(y),
            bias,
            residual,
            gamma,
            beta,
            half.map_or(Arg::Null, Arg::HalfOut),
            Arg::I32(int(m, "rows")?),
            Arg::I32(int(n.dim, "dim")?),
            Arg::F32(n.eps),
        ];
        self.dev
            .launch(Kernel::ResidualLayerNorm, launch, &mut args)
    }

    fn layer_norm(&self, n: &DeviceNorm<D>, x: &mut D::Buf, rows: usize) -> Result<()> {
        let launch = Launch::warp_rows(rows, "rows")?;
        let (gamma, beta) = affine(n);
        let mut args = [
            Arg::Out(x),
            gamma,
            beta,
            Arg::I32(int(rows, "rows")?),
            Arg::I32(int(n.dim, "dim")?),
            Arg::F32(n.eps),
        ];
        self.dev.launch(Kernel::LayerNorm, launch, &mut args)
    }

    /// The first `n` values of `x` rounded to bf16 into `half`.
    fn to_bf16(&self, x: &D::Buf, half: &mut D::Half, n: usize) -> Result<()> {
        let mut args = [Arg::In(x), Arg::HalfOut(half), Arg::I32(int(n, "values")?)];
        self.dev.launch(
            Kernel::F32ToBf16,
            Launch::elements(n, "conversion blocks")?,
            &mut args,
        )
    }

    /// Softmax of the `rows` score rows of `len`, in place, or into `half`
    /// in bf16.
    fn softmax(
        &self,
        scores: &mut D::Buf,
        half: Option<&mut D::Half>,
        rows: usize,
        len: usize,
    ) -> Result<()> {
        let (launch, group) = Launch::softmax_rows(rows, len, "score rows")?;
        let mut args = [
            Arg::Out(scores),
            half.map_or(Arg::Null, Arg::HalfOut),
            Arg::I32(int(rows, "score rows")?),
            Arg::I32(int(len, "len")?),
            Arg::I32(group as i32),
        ];
        self.dev.launch(Kernel::SoftmaxRows, launch, &mut args)
    }

    /// Multi-head self-attention of `px` pixels' sequences of `len` over the
    /// packed (px·len, 3d) `qkv`, into (px·len, d) `attn`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        qkv: &D::Buf,
        attn: &mut D::Buf,
        scores: &mut D::Buf,
        px: usize,
        len: usize,
        d: usize,
        nhead: usize,
    ) -> Result<()> {
        let hd = d / nhead;
        for h in 0..nhead {
            let ([sg, og], [k, q, v, o]) = attention_gemms(px, len, d, hd, h);
            self.dev.gemm(&sg, (qkv, k), (qkv, q), (&mut *scores, 0))?;
            self.softmax(scores, None, px * len, len)?;
            self.dev
                .gemm(&og, (qkv, v), (&*scores, 0), (&mut *attn, o))?;
        }
        Ok(())
    }

    /// `attention_mma`'s launch for these shapes, where the device has
    /// tensor cores, the head fits the kernel and
    /// `FLOTILLA_CUDA_GEMM_ATTENTION` is not set; `None`: the batched GEMMs.
    fn attention_mma_launch(
        &self,
        px: usize,
        len: usize,
        d: usize,
        nhead: usize,
    ) -> Result<Option<Launch>> {
        static GEMM_ATTENTION: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let forced = *GEMM_ATTENTION
            .get_or_init(|| std::env::var_os("FLOTILLA_CUDA_GEMM_ATTENTION").is_some());
        if forced || !self.dev.tensor_cores() || nhead == 0 {
            return Ok(None);
        }
        Launch::attention_mma(px, len, nhead, d / nhead)
    }

    /// [`GpuModel::attention`] on bf16: `qkv` in bf16, `attn` written in
    /// bf16, the way `way` says.
    #[allow(clippy::too_many_arguments)]
    fn attention_half(
        &self,
        qkv: &D::Half,
        attn: &mut D::Half,
        way: &mut HalfAttention<D>,
        px: usize,
        len: usize,
        d: usize,
        nhead: usize,
    ) -> Result<()> {
        let launch = match way {
            HalfAttention::Mma(launch) => *launch,
            HalfAttention::Gemms { scores, probs } => {
                return self.attention_half_gemms(qkv, attn, scores, probs, px, len, d, nhead)
            }
        };
        if D::half_len(qkv) < px * len * 3 * d || D::half_len(attn) < px * len * d {
            return Err(EncodeError::backend(
                "gpu",
                format!("attention of {px} x {len} tokens at width {d}: buffers too short"),
            ));
        }
        let mut args = [
            Arg::HalfIn(qkv),
            Arg::HalfOut(attn),
            Arg::I32(int(len, "len")?),
            Arg::I32(int(d, "d_model")?),
            Arg::I32(int(nhead, "heads")?),
            Arg::F32(1.0 / ((d / nhead) as f32).sqrt()),
        ];
        self.dev.launch(Kernel::AttentionMma, launch, &mut args)
    }

    /// [`GpuModel::attention_half`] on the batched GEMMs.
    #[allow(clippy::too_many_arguments)]
    fn attention_half_gemms(
        &self,
        qkv: &D::Half,
        attn: &mut D::Half,
        scores: &mut D::Buf,
        probs: &mut D::Half,
        px: usize,
        len: usize,
        d: usize,
        nhead: usize,
    ) -> Result<()> {
        let hd = d / nhead;
        for h in 0..nhead {
            let ([sg, og], [k, q, v, o]) = attention_gemms(px, len, d, hd, h);
            self.dev
                .gemm_half(&sg, (qkv, k), (qkv, q), HalfGemmOut::F32(&mut *scores, 0))?;
            self.softmax(scores, Some(&mut *probs), px * len, len)?;
            self.dev.gemm_half(
                &og,
                (qkv, v),
                (&*probs, 0),
                HalfGemmOut::Bf16(&mut *attn, o),
            )?;
        }
        Ok(())
    }

    /// The day-of-year encoding of `doys` (m rows) into `pe` (m, bb.d),
    /// whole days from the backbone's table.
    fn doy_encoding(
        &self,
        bb: &DeviceBackbone<D>,
        doys: &D::Buf,
        pe: &mut D::Buf,
        m: usize,
    ) -> Result<()> {
        doy_encoding(&self.dev, doys, pe, m, bb.d, Some(&bb.doy_table))
    }

    /// Attention pooling of `px` pixels' (len, d) rows of `h` into `to`.
    fn pool(
        &self,
        bb: &DeviceBackbone<D>,
        h: &D::Buf,
        to: PoolTo<'_, D>,
        px: usize,
        len: usize,
    ) -> Result<()> {
        let weights_bytes = u32::try_from(len * 4)
            .map_err(|_| EncodeError::backend("gpu", format!("sequence of {len}")))?;
        let launch = Launch::rows(px, "pixels", weights_bytes)?;
        let d = bb.d;
        let (out, rows, ld, col) = match to {
            PoolTo::Rows(out) if D::len(out) >= px * d => (out, None, d, 0),
            // Every row is below the window's size (`KeptRows::check`), and
            // its buffer holds that many rows of 2d floats (`pool_out`).
            PoolTo::Window { out, rows, col } if D::len(rows) >= px && col + d <= 2 * d => {
                (out, Some(rows), 2 * d, col)
            }
            _ => {
                return Err(EncodeError::backend(
                    "gpu",
                    format!("pooling {px} pixels: a buffer too short, or a column past 2 x {d}"),
                ))
            }
        };
        let mut args = [
            Arg::In(h),
            Arg::In(&bb.pool_w),
            Arg::F32(bb.pool_b),
            Arg::Out(out),
            rows.map_or(Arg::Null, Arg::In),
            Arg::I32(int(ld, "pooled row")?),
            Arg::I32(int(col, "pooled column")?),
            Arg::I32(int(len, "len")?),
            Arg::I32(int(d, "d")?),
        ];
        self.dev.launch(Kernel::AttentionPool, launch, &mut args)
    }

    /// Pool the pass's output `h` (`px` pixels of `len` tokens) and queue
    /// what the host waits for: the pooled features' download, or where
    /// they are kept (`keep`), written into their window's rows, only a
    /// marker. `uploads` are the pass's staged copies, kept with the
    /// ticket until it is done.
    #[allow(clippy::too_many_arguments)]
    fn pool_out(
        &self,
        bb: &DeviceBackbone<D>,
        h: &D::Buf,
        px: usize,
        len: usize,
        keep: Option<Keep<'_>>,
        scratch: &mut Scratch<D>,
        mut uploads: Vec<D::Staging>,
    ) -> Result<DeviceTicket<D>> {
        let (dev, d) = (&self.dev, bb.d);
        let Some(keep) = keep else {
            let mut pooled = scratch.take(dev, Slot::Pooled, px * d)?;
            self.pool(bb, h, PoolTo::Rows(&mut pooled), px, len)?;
            let download = dev.download_begin(&pooled, px * d)?;
            scratch.give(Slot::Pooled, pooled);
            return Ok(DeviceTicket {
                uploads,
                download,
                floats: px * d,
            });
        };
        let place = keep.place;
        let kept = scratch.window(place.slot);
        if kept.filled == [0, 0] {
            kept.pixels = place.pixels;
        } else if kept.pixels != place.pixels {
            // Growing its buffer now would lose the rows kept so far.
            return Err(EncodeError::backend(
                "gpu",
                format!(
                    "a chunk of a window of {} pixels in slot {} of a window of {}",
                    place.pixels, place.slot, kept.pixels
                ),
            ));
        }
        // Grown (on the window's first chunk only, as just checked) to the
        // window's rows of S2 then S1 features.
        let mut window = Scratch::fit(dev, kept.buf.take(), place.pixels * 2 * d)?;
        let mut rows = scratch.take(dev, Slot::Rows, px)?;
        // The rows go up as their 32 bits (`attention_pool` reads ints):
        // moved, never computed with, so no float rule touches them.
        uploads.push(dev.upload_staged_with(px, &mut rows, &mut |staging| {
            for (v, &r) in staging.iter_mut().zip(place.rows) {
                *v = f32::from_bits(r);
            }
        })?);
        let to = PoolTo::Window {
            out: &mut window,
            rows: &rows,
            col: keep.modality * d,
        };
        self.pool(bb, h, to, px, len)?;
        let kept = scratch.window(place.slot);
        kept.buf = Some(window);
        kept.filled[keep.modality] += px;
        scratch.give(Slot::Rows, rows);
        Ok(DeviceTicket {
            uploads,
            download: dev.marker()?,
            floats: 0,
        })
    }

    /// Queue one backbone pass over `batch` (at most [`MAX_ROWS`] tokens)
    /// on the device: the inputs' copies, the pass, and the copy of its
    /// pooled features to the host (or, `keep`, their place in a window
    /// on the device), which the returned ticket waits for. The batch's
    /// buffers may be reused once this returns.
    fn backbone(
        &self,
        bb: &DeviceBackbone<D>,
        batch: &SequenceBatch<'_>,
        keep: Option<Keep<'_>>,
        scratch: &mut Scratch<D>,
    ) -> Result<DeviceTicket<D>> {
        if self.half {
            return self.backbone_half(bb, batch, keep, scratch);
        }
        let (px, len, d) = (batch.n, batch.len, bb.d);
        let m = px * len;
        let dev = &self.dev;
        let mut values = scratch.take(dev, Slot::Values, batch.values.len())?;
        let mut uploads = vec![dev.upload_staged(batch.values, &mut values)?];
        // The day-of-year encoding on the device: on the host it would cost
        // px·len·d/2 sin/cos and a copy as large as the activations per
        // chunk, more than the chunk's GEMMs on a GPU.
        let mut doys = scratch.take(dev, Slot::Doys, batch.doys.len())?;
        uploads.push(dev.upload_staged(batch.doys, &mut doys)?);
        let mut t = scratch.take(dev, Slot::T, m * d)?;
        let mut h = scratch.take(dev, Slot::H, m * d)?;
        let mut qkv = scratch.take(dev, Slot::Qkv, m * 3 * d)?;
        let mut attn = scratch.take(dev, Slot::Attn, m * d)?;
        let mut ff = scratch.take(dev, Slot::Ff, m * bb.ffn)?;
        let mut scores = scratch.take(dev, Slot::Scores, px * len * len)?;
        // The encoding lives in `attn` until the first attention needs it.
        self.doy_encoding(bb, &doys, &mut attn, m)?;
        self.linear(&bb.embed0, &values, m, &mut t, true, None)?;
        self.linear(&bb.embed2, &t, m, &mut h, false, Some(&attn))?;
        for l in &bb.layers {
            self.linear(&l.in_proj, &h, m, &mut qkv, false, None)?;
            self.attention(&qkv, &mut attn, &mut scores, px, len, d, bb.nhead)?;
            let g = linear_gemm(l.out_proj.in_dim, l.out_proj.out_dim, m);
            dev.gemm(&g, (&l.out_proj.weight, 0), (&attn, 0), (&mut t, 0))?;
            self.add_norm(Some((&l.out_proj.bias, &h)), &mut t, m, &l.norm1, None)?;
            std::mem::swap(&mut t, &mut h);
            self.linear(&l.linear1, &h, m, &mut ff, true, None)?;
            let g = linear_gemm(l.linear2.in_dim, l.linear2.out_dim, m);
            dev.gemm(&g, (&l.linear2.weight, 0), (&ff, 0), (&mut t, 0))?;
            self.add_norm(Some((&l.linear2.bias, &h)), &mut t, m, &l.norm2, None)?;
            std::mem::swap(&mut t, &mut h);
        }
        let ticket = self.pool_out(bb, &h, px, len, keep, scratch, uploads)?;
        // `t` and `h` were swapped an even number of times per layer, so
        // each goes back to its own slot either way; sizes are what count.
        for (slot, buf) in [
            (Slot::Values, values),
            (Slot::Doys, doys),
            (Slot::T, t),
            (Slot::H, h),
            (Slot::Qkv, qkv),
            (Slot::Attn, attn),
            (Slot::Ff, ff),
            (Slot::Scores, scores),
        ] {
            scratch.give(slot, buf);
        }
        Ok(ticket)
    }

    /// [`GpuModel::backbone`] on bf16 copies: every GEMM reads bf16 (the
    /// weights' copies, and activations written in bf16 by the kernel that
    /// made them) and accumulates in f32; the residual stream `h`, the
    /// LayerNorms, the softmax's sums and the pooling are f32.
    fn backbone_half(
        &self,
        bb: &DeviceBackbone<D>,
        batch: &SequenceBatch<'_>,
        keep: Option<Keep<'_>>,
        scratch: &mut Scratch<D>,
    ) -> Result<DeviceTicket<D>> {
        let (px, len, d) = (batch.n, batch.len, bb.d);
        let m = px * len;
        let dev = &self.dev;
        // The bands go up as they are and are rounded to bf16 there: a
        // conversion on the host would hold up the device (this thread
        // feeds it).
        let n = batch.values.len();
        let mut values_f32 = scratch.take(dev, Slot::Values, n)?;
        let mut uploads = vec![dev.upload_staged(batch.values, &mut values_f32)?];
        let mut values = scratch.take_half(dev, HalfSlot::Values, n)?;
        self.to_bf16(&values_f32, &mut values, n)?;
        let mut doys = scratch.take(dev, Slot::Doys, batch.doys.len())?;
        uploads.push(dev.upload_staged(batch.doys, &mut doys)?);
        let mut t = scratch.take(dev, Slot::T, m * d)?;
        let mut h = scratch.take(dev, Slot::H, m * d)?;
        let mut pe = scratch.take(dev, Slot::Attn, m * d)?;
        // GEMM outputs wider than d (qkv, the FFN) share one f32 buffer,
        // taken only if a GEMM's bias and ReLU are not fused.
        let wide = m * (3 * d).max(bb.ffn);
        let mut y: Option<D::Buf> = None;
        // The scores go through memory only for attention on GEMMs.
        let mut attention = match self.attention_mma_launch(px, len, d, bb.nhead)? {
            Some(launch) => HalfAttention::Mma(launch),
            None => HalfAttention::Gemms {
                scores: scratch.take(dev, Slot::Scores, px * len * len)?,
                probs: scratch.take_half(dev, HalfSlot::Probs, px * len * len)?,
            },
        };
        let mut t_h = scratch.take_half(dev, HalfSlot::T, m * d)?;
        let mut h_h = scratch.take_half(dev, HalfSlot::H, m * d)?;
        let mut qkv_h = scratch.take_half(dev, HalfSlot::Qkv, m * 3 * d)?;
        let mut attn_h = scratch.take_half(dev, HalfSlot::Attn, m * d)?;
        let mut ff_h = scratch.take_half(dev, HalfSlot::Ff, m * bb.ffn)?;
        self.doy_encoding(bb, &doys, &mut pe, m)?;
        self.linear_half_lazy(
            &bb.embed0,
            &values,
            m,
            true,
            &mut t_h,
            &mut y,
            (scratch, wide),
        )?;
        // The residual stream starts here: f32 in `h`, bf16 in `h_h`.
        if self.linear_half_residual(&bb.embed2, &t_h, m, &mut h, &pe)? {
            self.to_bf16(&h, &mut h_h, m * d)?;
        } else {
            self.epilogue(
                &mut h,
                Some(&bb.embed2.bias),
                m,
                d,
                false,
                Some(&pe),
                Some((&mut h_h, true)),
            )?;
        }
        for l in &bb.layers {
            self.linear_half_lazy(
                &l.in_proj,
                &h_h,
                m,
                false,
                &mut qkv_h,
                &mut y,
                (scratch, wide),
            )?;
            self.attention_half(&qkv_h, &mut attn_h, &mut attention, px, len, d, bb.nhead)?;
            let fused = self.linear_half_residual(&l.out_proj, &attn_h, m, &mut t, &h)?;
            let added = (!fused).then_some((&l.out_proj.bias, &h));
            self.add_norm(added, &mut t, m, &l.norm1, Some(&mut h_h))?;
            std::mem::swap(&mut t, &mut h);
            self.linear_half_lazy(
                &l.linear1,
                &h_h,
                m,
                true,
                &mut ff_h,
                &mut y,
                (scratch, wide),
            )?;
            let fused = self.linear_half_residual(&l.linear2, &ff_h, m, &mut t, &h)?;
            let added = (!fused).then_some((&l.linear2.bias, &h));
            self.add_norm(added, &mut t, m, &l.norm2, Some(&mut h_h))?;
            std::mem::swap(&mut t, &mut h);
        }
        let ticket = self.pool_out(bb, &h, px, len, keep, scratch, uploads)?;
        for (slot, buf) in [
            (Slot::Values, values_f32),
            (Slot::Doys, doys),
            (Slot::T, t),
            (Slot::H, h),
            (Slot::Attn, pe),
        ] {
            scratch.give(slot, buf);
        }
        if let Some(y) = y {
            scratch.give(Slot::Ff, y);
        }
        if let HalfAttention::Gemms { scores, probs } = attention {
            scratch.give(Slot::Scores, scores);
            scratch.give_half(HalfSlot::Probs, probs);
        }
        for (slot, buf) in [
            (HalfSlot::Values, values),
            (HalfSlot::T, t_h),
            (HalfSlot::H, h_h),
            (HalfSlot::Qkv, qkv_h),
            (HalfSlot::Attn, attn_h),
            (HalfSlot::Ff, ff_h),
        ] {
            scratch.give_half(slot, buf);
        }
        Ok(ticket)
    }

    /// The head on `n` pixels' pooled features from the host (each
    /// (n, d)), taken up for it.
    fn head(
        &self,
        s2: &[f32],
        s1: &[f32],
        n: usize,
        d: usize,
        scratch: &mut Scratch<D>,
    ) -> Result<Vec<f32>> {
        let dev = &self.dev;
        let mut zd = scratch.take(dev, Slot::Values, n * 2 * d)?;
        // Each pixel's (S2, S1) features side by side, assembled straight
        // into page-locked memory: a window's (84 MB for the Large model)
        // cross once on the host and at the bus's rate.
        let staged = dev.upload_staged_with(n * 2 * d, &mut zd, &mut |z| {
            super::interleave_features(z, s2, s1, d)
        })?;
        let result = self.head_on(&zd, n, scratch)?;
        // The head's download waited for the stream, the upload with it
        // (on an error the staging is dropped, which waits for its copy).
        dev.release(staged);
        scratch.give(Slot::Values, zd);
        Ok(result)
    }

    /// The head on the first `n` rows of `z`, each a pixel's S2 then S1
    /// features (2d floats); waits for its result.
    fn head_on(&self, z: &D::Buf, n: usize, scratch: &mut Scratch<D>) -> Result<Vec<f32>> {
        let ticket = self.head_on_begin(z, n, scratch)?;
        D::download_wait(&ticket.download)?;
        self.dev.download_end(ticket.download, ticket.floats)
    }

    /// [`GpuModel::head_on`] queued, with the copy of its result to the host:
    /// the ticket says when it is there. Its buffers go back to the
    /// scratch at once; work queued later on the stream reuses them only
    /// after the head and its copy.
    fn head_on_begin(
        &self,
        z: &D::Buf,
        n: usize,
        scratch: &mut Scratch<D>,
    ) -> Result<DeviceTicket<D>> {
        let dev = &self.dev;
        let mut y = scratch.take(dev, Slot::T, n * self.fc1.out_dim)?;
        self.linear(&self.fc1, z, n, &mut y, false, None)?;
        self.layer_norm(&self.norm1, &mut y, n)?;
        // ReLU after the norm.
        self.epilogue(&mut y, None, n, self.fc1.out_dim, true, None, None)?;
        let mut out = scratch.take(dev, Slot::H, n * self.fc2.out_dim)?;
        self.linear(&self.fc2, &y, n, &mut out, false, None)?;
        self.layer_norm(&self.out_norm, &mut out, n)?;
        let floats = n * self.fc2.out_dim;
        let download = dev.download_begin(&out, floats)?;
        scratch.give(Slot::T, y);
        scratch.give(Slot::H, out);
        Ok(DeviceTicket {
            uploads: Vec::new(),
            download,
            floats,
        })
    }
}

/// Tokens (pixels x sequence length) one backbone pass takes at most; a
/// chunk with more is run in parts (a pixel's result does not depend on
/// the others in its pass, though cuBLAS may pick another algorithm for
/// another size). 2^19 is 8,192 px of 64 tokens, above the best chunk an
/// H200 showed in f32 (4,096 px), and keeps every buffer's element count
/// (at most 2^19 x the FFN's width) far inside a kernel's and cuBLAS's int.
pub(crate) const MAX_ROWS: usize = 1 << 19;

/// How a bf16 backbone computes attention: `attention_mma` with this
/// launch, or the batched GEMMs and `softmax_rows` through these buffers.
enum HalfAttention<D: Device> {
    Mma(Launch),
    Gemms { scores: D::Buf, probs: D::Half },
}

/// The f32 device buffers a chunk works in, by role.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Values,
    Doys,
    T,
    H,
    Qkv,
    Attn,
    Ff,
    Scores,
    Pooled,
    /// A kept pass's pixels' rows in their window (32-bit ints).
    Rows,
}

const SLOTS: usize = Slot::Rows as usize + 1;

/// Where `attention_pool` writes: (pixels, d) rows of their own, or the
/// pixels' `rows` of a window (rows of S2 then S1 features, 2d floats),
/// from column `col`.
enum PoolTo<'a, D: Device> {
    Rows(&'a mut D::Buf),
    Window {
        out: &'a mut D::Buf,
        rows: &'a D::Buf,
        col: usize,
    },
}

/// A kept pass's place: its pixels' rows in a window, and its modality
/// (0 for S2, whose features start at column 0; 1 for S1, at d).
#[derive(Clone, Copy)]
struct Keep<'a> {
    place: &'a KeptRows<'a>,
    modality: usize,
}

/// One window slot's features on the device ([`KeptRows`]): its buffer,
/// the window's size, and how many pixels' S2 and S1 features its chunks
/// have written since the slot's last head (so a head reads only a window
/// whose every pixel has both, and a window's buffer is never replaced
/// once a chunk has written to it).
struct KeptWindow<D: Device> {
    buf: Option<D::Buf>,
    pixels: usize,
    filled: [usize; 2],
}

/// The bf16 device buffers of a bf16 chunk, by role.
#[derive(Debug, Clone, Copy)]
enum HalfSlot {
    Values,
    T,
    H,
    Qkv,
    Attn,
    Ff,
    Probs,
}

const HALF_SLOTS: usize = HalfSlot::Probs as usize + 1;

/// Device buffers kept from chunk to chunk, each grown to the largest size
/// asked of it, so a chunk allocates and frees nothing on the device (a
/// free can wait for the GPU, and a fresh buffer had to be zeroed). Every
/// buffer is written before it is read within a chunk, so what an earlier
/// chunk left in it never matters; the emulator fills new buffers with NaN
/// to show it.
///
/// The kept windows' features are the exception: a window's chunks fill
/// its slot's rows and the head reads them, so its buffer must not be
/// replaced within a window. It is grown, if at all, to the window's size
/// on the window's first chunk (every chunk of a window names the same
/// size, [`KeptRows`], which [`KeptWindow`]'s count checks), so it never is.
struct Scratch<D: Device> {
    slots: [Option<D::Buf>; SLOTS],
    halves: [Option<D::Half>; HALF_SLOTS],
    windows: Vec<KeptWindow<D>>,
}

impl<D: Device> Scratch<D> {
    fn new() -> Self {
        Scratch {
            slots: std::array::from_fn(|_| None),
            halves: std::array::from_fn(|_| None),
            windows: Vec::new(),
        }
    }

    /// Window slot `slot` (the slots an encode leases are numbered from
    /// 0, so this grows by a slot or two).
    fn window(&mut self, slot: usize) -> &mut KeptWindow<D> {
        if self.windows.len() <= slot {
            self.windows.resize_with(slot + 1, || KeptWindow {
                buf: None,
                pixels: 0,
                filled: [0, 0],
            });
        }
        &mut self.windows[slot]
    }

    /// The buffer of `slot` if it holds `n` floats, else a new one of `n`.
    fn take(&mut self, dev: &D, slot: Slot, n: usize) -> Result<D::Buf> {
        Self::fit(dev, self.slots[slot as usize].take(), n)
    }

    /// `buf` if it holds `n` floats, else a new buffer of `n`.
    fn fit(dev: &D, buf: Option<D::Buf>, n: usize) -> Result<D::Buf> {
        match buf {
            Some(b) if D::len(&b) >= n => Ok(b),
            old => {
                // Free the small one first: the new one may need its room
                // (on the device's context, which a free needs current).
                dev.bind()?;
                drop(old);
                dev.alloc(n)
            }
        }
    }

    fn give(&mut self, slot: Slot, buf: D::Buf) {
        self.slots[slot as usize] = Some(buf);
    }

    /// [`Scratch::take`] for bf16 buffers.
    fn take_half(&mut self, dev: &D, slot: HalfSlot, n: usize) -> Result<D::Half> {
        match self.halves[slot as usize].take() {
            Some(b) if D::half_len(&b) >= n => Ok(b),
            old => {
                dev.bind()?;
                drop(old);
                dev.alloc_half(n)
            }
        }
    }

    fn give_half(&mut self, slot: HalfSlot, buf: D::Half) {
        self.halves[slot as usize] = Some(buf);
    }
}

/// A backbone queued on the device ([`GpuModel::backbone`]): the staging
/// its inputs were copied from (kept until the copy is known done) and the
/// download of its `floats` pooled features.
struct DeviceTicket<D: Device> {
    uploads: Vec<D::Staging>,
    download: D::Staging,
    floats: usize,
}

impl<D: Device> GpuBackend<D> {
    /// Queue `batch` (at most [`MAX_ROWS`] tokens) on the device, its
    /// pooled features for the host or kept at `place`.
    fn enqueue(
        &self,
        modality: Modality,
        batch: &SequenceBatch<'_>,
        place: Option<&KeptRows<'_>>,
    ) -> Result<DeviceTicket<D>> {
        let mut guard = self.lock()?;
        let (model, scratch) = &mut *guard;
        model.dev.bind()?;
        let bb = match modality {
            Modality::S2 => &model.s2,
            Modality::S1 => &model.s1,
        };
        let keep = place.map(|place| Keep {
            place,
            modality: modality as usize,
        });
        model.backbone(bb, batch, keep, scratch)
    }

    /// [`Backend::backbone_begin`], or with `place` its kept form.
    fn begin(
        &self,
        modality: Modality,
        batch: &SequenceBatch<'_>,
        place: Option<&KeptRows<'_>>,
    ) -> Result<PendingBackbone>
    where
        D: 'static,
    {
        batch.check(self.name)?;
        if let Some(place) = place {
            place.check(self.name, batch.n)?;
            if place.slot >= self.slots.issued() {
                return Err(EncodeError::backend(
                    self.name,
                    format!("window slot {} was never leased", place.slot),
                ));
            }
        }
        // At most MAX_ROWS tokens per pass, so device memory is bounded by
        // that, not by a chunk of long sequences (16,384 px of 256 tokens
        // would want 136 GB in bf16; MAX_ROWS about 16 GB).
        let per = (self.max_rows / batch.len.max(1)).max(1);
        if batch.n <= per {
            let ticket = self.enqueue(modality, batch, place)?;
            return Ok(PendingBackbone::on_device(Box::new(ticket)));
        }
        // Such a chunk runs in parts, one after another.
        let mut out = Vec::with_capacity(if place.is_some() { 0 } else { batch.n * self.d });
        for start in (0..batch.n).step_by(per) {
            let n = per.min(batch.n - start);
            let part = SequenceBatch {
                n,
                len: batch.len,
                bands: batch.bands,
                values: &batch.values
                    [start * batch.len * batch.bands..(start + n) * batch.len * batch.bands],
                doys: &batch.doys[start * batch.len..(start + n) * batch.len],
            };
            let part_place = place.map(|p| KeptRows {
                rows: &p.rows[start..start + n],
                ..*p
            });
            let ticket = self.enqueue(modality, &part, part_place.as_ref())?;
            out.extend(self.collect(ticket)?);
        }
        Ok(PendingBackbone::done(out))
    }

    /// The pooled features of a queued backbone, once on the host: waits
    /// without the lock, so another thread may queue work meanwhile.
    fn collect(&self, ticket: DeviceTicket<D>) -> Result<Vec<f32>> {
        D::download_wait(&ticket.download)?;
        let guard = self.lock()?;
        let dev = &guard.0.dev;
        dev.bind()?;
        let out = dev.download_end(ticket.download, ticket.floats)?;
        // The download came after the uploads on the one stream.
        for staging in ticket.uploads {
            dev.release(staging);
        }
        Ok(out)
    }
}

impl<D: Device + Send + 'static> Backend for GpuBackend<D>
where
    D::Buf: Send,
    D::Half: Send,
{
    fn name(&self) -> &'static str {
        self.name
    }

    fn backbone(&self, modality: Modality, batch: &SequenceBatch<'_>) -> Result<Vec<f32>> {
        let pending = self.backbone_begin(modality, batch)?;
        self.backbone_end(pending)
    }

    fn backbone_begin(
        &self,
        modality: Modality,
        batch: &SequenceBatch<'_>,
    ) -> Result<PendingBackbone> {
        self.begin(modality, batch, None)
    }

    fn backbone_end(&self, pending: PendingBackbone) -> Result<Vec<f32>> {
        match pending.into_parts() {
            Ok(done) => Ok(done),
            Err(ticket) => match ticket.downcast::<DeviceTicket<D>>() {
                Ok(ticket) => self.collect(*ticket),
                Err(_) => Err(EncodeError::backend(
                    self.name,
                    "a backbone begun by another backend was handed here",
                )),
            },
        }
    }

    fn head(&self, s2: &[f32], s1: &[f32], n: usize) -> Result<Vec<f32>> {
        let d = self.d;
        if s2.len() != n * d || s1.len() != n * d {
            return Err(EncodeError::backend(
                self.name,
                format!(
                    "head of {n} pixels got {} and {} features (want {} each)",
                    s2.len(),
                    s1.len(),
                    n * d
                ),
            ));
        }
        let mut guard = self.lock()?;
        let (model, scratch) = &mut *guard;
        model.dev.bind()?;
        let out = model.head(s2, s1, n, d, scratch)?;
        debug_assert_eq!(out.len(), n * self.repr_dim);
        Ok(out)
    }

    fn kept_windows(&self) -> Result<Option<KeptWindows>> {
        if !self.keep_features {
            return Ok(None);
        }
        let lease = self.slots.lease();
        // Whatever an encode that stopped part-way left in them is gone.
        let mut guard = self.lock()?;
        for slot in lease.slots() {
            guard.1.window(slot).filled = [0, 0];
        }
        Ok(Some(lease))
    }

    fn backbone_begin_kept(
        &self,
        modality: Modality,
        batch: &SequenceBatch<'_>,
        place: &KeptRows<'_>,
    ) -> Result<PendingBackbone> {
        self.begin(modality, batch, Some(place))
    }

    /// The head queued after the window's last chunk, and its result's
    /// copy back: the caller begins the next window's chunks behind it
    /// before it waits ([`Backend::head_end`]), so the device does not
    /// idle while the host takes the result and places it.
    fn head_kept_begin(&self, slot: usize, n: usize) -> Result<PendingHead> {
        let mut guard = self.lock()?;
        let (model, scratch) = &mut *guard;
        model.dev.bind()?;
        let kept = scratch.window(slot);
        if kept.pixels != n || kept.filled != [n, n] {
            return Err(EncodeError::backend(
                self.name,
                format!(
                    "a head of {n} pixels on window slot {slot}, whose chunks kept {} S2 and \
                     {} S1 features of a window of {}",
                    kept.filled[0], kept.filled[1], kept.pixels
                ),
            ));
        }
        // Taken out of the scratch while the head borrows the rest of it;
        // read once: the slot's next window starts afresh (its chunks are
        // queued after this head on the one stream).
        kept.filled = [0, 0];
        let Some(z) = kept.buf.take() else {
            return Err(EncodeError::backend(
                self.name,
                "a kept window without a buffer",
            ));
        };
        let ticket = model.head_on_begin(&z, n, scratch);
        scratch.window(slot).buf = Some(z);
        Ok(PendingHead::on_device(Box::new(ticket?)))
    }

    fn head_end(&self, pending: PendingHead) -> Result<Vec<f32>> {
        // A head's ticket is a backbone's: a download to wait for.
        self.backbone_end(pending)
    }
}
