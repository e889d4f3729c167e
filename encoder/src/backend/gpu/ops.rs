//! A pass's steps as GEMMs and kernel launches: Linear, LayerNorm, softmax, attention, day of year.

use super::scratch::{Scratch, Slot};
use super::{
    Arg, Device, DeviceBackbone, DeviceLinear, DeviceNorm, Epilogue, Gemm, GpuModel, HalfGemmOut,
    Kernel, Launch, DOY_TABLE_DAYS,
};
use crate::error::{EncodeError, Result};

/// `doy_encoding` of `doys` (m rows) into `out` (m, d), whole days inside
/// `table` (its own output for days 0 to [`DOY_TABLE_DAYS`] - 1) copied
/// from there.
pub(super) fn doy_encoding<D: Device>(
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

/// A size as a kernel's `int`.
pub(super) fn int(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| EncodeError::backend("gpu", format!("{what} {v} exceeds a kernel's int")))
}

/// `Gemm` of a Linear over `m` rows: `y (m, out) = x (m, in) · Wᵀ`, all
/// row-major. Column-major it is `yᵀ (out, m) = W · xᵀ`: W's row-major
/// storage is Wᵀ column-major (so `trans_a`, lda = in), x's is xᵀ (no
/// `trans_b`, ldb = in).
pub(super) fn linear_gemm(in_dim: usize, out_dim: usize, m: usize) -> Gemm {
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

/// How a bf16 backbone computes attention: `attention_mma` with this
/// launch, or the batched GEMMs and `softmax_rows` through these buffers.
pub(super) enum HalfAttention<D: Device> {
    Mma(Launch),
    Gemms { scores: D::Buf, probs: D::Half },
}

impl<D: Device> GpuModel<D> {
    /// `y (m, out) = epilogue(x (m, in) · Wᵀ + b)` on f32 buffers.
    pub(super) fn linear(
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
    pub(super) fn linear_half_lazy(
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
    pub(super) fn linear_half_residual(
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
    pub(super) fn epilogue(
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
    pub(super) fn add_norm(
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

    pub(super) fn layer_norm(&self, n: &DeviceNorm<D>, x: &mut D::Buf, rows: usize) -> Result<()> {
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
    pub(super) fn to_bf16(&self, x: &D::Buf, half: &mut D::Half, n: usize) -> Result<()> {
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
    pub(super) fn attention(
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
    pub(super) fn attention_mma_launch(
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
    pub(super) fn attention_half(
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
    pub(super) fn doy_encoding(
        &self,
        bb: &DeviceBackbone<D>,
        doys: &D::Buf,
        pe: &mut D::Buf,
        m: usize,
    ) -> Result<()> {
        doy_encoding(&self.dev, doys, pe, m, bb.d, Some(&bb.doy_table))
    }
}
