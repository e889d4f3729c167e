//! What the GPU path needs from a device: SGEMM, kernel launches and the kernels' source.
//!
//! [`Device`] is the interface `gpu/` runs the model over; `cuda/`
//! implements it on a GPU and, in tests, `emulator/` on the CPU. Both
//! compile the same [`KERNELS`] (`kernels.cu`).

use crate::error::{EncodeError, Result};
use crate::profile::Dtype;

/// Threads per block of the row kernels (LayerNorm, softmax, pooling): a
/// multiple of the 32-thread warp.
pub(crate) const ROW_THREADS: u32 = 256;

/// Rows per block of the warp-per-row kernels (LayerNorm, softmax): one
/// warp of 32 threads each.
pub(crate) const ROWS_PER_BLOCK: usize = ROW_THREADS as usize / 32;

/// Values a lane of `softmax_rows` holds in registers (its
/// `SOFTMAX_PER_LANE`).
const SOFTMAX_PER_LANE: usize = 8;

/// Query rows per block of `attention_mma` (its `ATT_ROWS`): 16 per warp.
const ATTENTION_ROWS: usize = 64;

/// Keys `attention_mma` holds in shared memory at a time (its `ATT_KEYS`).
const ATTENTION_KEYS: usize = 32;

/// The widest head `attention_mma` takes (its `ATT_MAX_HD`): its registers
/// hold 16 rows of a head's output, and shared memory (under the 48 KiB a
/// launch gets without opting in) Q, K and V padded to 16; the published
/// models' heads are 160 wide (Large: d 640, 4 heads).
pub(crate) const ATTENTION_MAX_HEAD: usize = 160;

/// Days of year the day-of-year table holds (0 to 366): every day a tile's
/// frames carry; `doy_encoding` computes any other.
pub(crate) const DOY_TABLE_DAYS: usize = 367;

/// Threads per block of the element-wise kernels (epilogue, day-of-year
/// encoding): 256 can always launch, whatever registers the compiler gives
/// the double-precision `sincos` (1024 would fail past 64 per thread).
const ELEMENT_THREADS: u32 = 256;

/// Rows per block of `bias_epilogue` (its `EPILOGUE_ROWS`).
const EPILOGUE_ROWS: usize = 8;

/// The kernels besides the GEMMs, compiled by NVRTC on a GPU. NVRTC has no
/// standard headers: only CUDA's built-in device functions are available
/// (no `INFINITY`, no `<cmath>`), which the emulator's build enforces.
/// Reductions run in a fixed order (a warp's butterfly shuffles, pooling's
/// loops), so the same launch gives the same bits.
pub(crate) const KERNELS: &str = include_str!("kernels.cu");

/// The kernels of [`KERNELS`], by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    F32ToBf16,
    BiasEpilogue,
    DoyEncoding,
    LayerNorm,
    ResidualLayerNorm,
    SoftmaxRows,
    AttentionPool,
    AttentionMma,
}

// `Kernel::ALL` lists the kernels in declaration order: `k as usize` is
// `k`'s place in it.
const _: () = {
    let mut i = 0;
    while i < Kernel::ALL.len() {
        assert!(Kernel::ALL[i] as usize == i);
        i += 1;
    }
};

impl Kernel {
    pub(crate) const ALL: [Kernel; 8] = [
        Kernel::F32ToBf16,
        Kernel::BiasEpilogue,
        Kernel::DoyEncoding,
        Kernel::LayerNorm,
        Kernel::ResidualLayerNorm,
        Kernel::SoftmaxRows,
        Kernel::AttentionPool,
        Kernel::AttentionMma,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kernel::F32ToBf16 => "f32_to_bf16",
            Kernel::BiasEpilogue => "bias_epilogue",
            Kernel::DoyEncoding => "doy_encoding",
            Kernel::LayerNorm => "layer_norm",
            Kernel::ResidualLayerNorm => "residual_layer_norm",
            Kernel::SoftmaxRows => "softmax_rows",
            Kernel::AttentionPool => "attention_pool",
            Kernel::AttentionMma => "attention_mma",
        }
    }
}

/// How a device's SGEMMs compute, fixed when the device is opened. `F32` is
/// exact f32 (the fixtures' tolerances hold); `Tf32` lets tensor cores
/// round each input to TF32 (10 mantissa bits, f32 accumulation), several
/// times the f32 rate on Ampere and later, at a precision the emulated GPU
/// measures (profile `dtype = "tf32"`); `Bf16` rounds each input to
/// bfloat16 (7 mantissa bits) for bf16 tensor cores, again with f32
/// accumulation and f32 in and out, so the residual stream, LayerNorm,
/// softmax and pooling stay f32 (profile `dtype = "bf16"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GemmMath {
    F32,
    Tf32,
    Bf16,
}

impl GemmMath {
    /// The profile's `dtype` for a GPU backend: every one has a GEMM math.
    pub(crate) fn from_dtype(dtype: Dtype) -> Self {
        match dtype {
            Dtype::F32 => GemmMath::F32,
            Dtype::Tf32 => GemmMath::Tf32,
            Dtype::Bf16 => GemmMath::Bf16,
        }
    }
}

/// A column-major SGEMM, cuBLAS's `cublasSgemmStridedBatched` contract:
/// for each of `batch` problems, `C = alpha · op(A) · op(B) + beta · C` with
/// op(A) m × k, op(B) k × n, C m × n; `trans_*` transposes; the p-th
/// problem's matrices start `p · stride_*` floats after the first's. When
/// beta is 0, C is not read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gemm {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: f32,
    pub lda: usize,
    pub ldb: usize,
    pub beta: f32,
    pub ldc: usize,
    pub batch: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
}

impl Gemm {
    /// Check the leading dimensions as cuBLAS does, and that every problem's
    /// matrices lie inside buffers of `a`, `b` and `c` floats (counted from
    /// the matrices' start); a GPU would read or write past them silently.
    pub(crate) fn check(&self, a: usize, b: usize, c: usize) -> Result<()> {
        let extent = |rows: usize, cols: usize, ld: usize, stride: usize| {
            if rows == 0 || cols == 0 || self.batch == 0 {
                0
            } else {
                (self.batch - 1) * stride + (cols - 1) * ld + rows
            }
        };
        let (a_rows, a_cols) = if self.trans_a {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        };
        let (b_rows, b_cols) = if self.trans_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        let fail = |what: String| {
            Err(EncodeError::backend(
                "gpu",
                format!("SGEMM {self:?}: {what}"),
            ))
        };
        for (name, ld, rows) in [
            ("lda", self.lda, a_rows),
            ("ldb", self.ldb, b_rows),
            ("ldc", self.ldc, self.m),
        ] {
            if ld < rows.max(1) {
                return fail(format!("{name} {ld} is below {}", rows.max(1)));
            }
        }
        for (name, need, have) in [
            ("A", extent(a_rows, a_cols, self.lda, self.stride_a), a),
            ("B", extent(b_rows, b_cols, self.ldb, self.stride_b), b),
            ("C", extent(self.m, self.n, self.ldc, self.stride_c), c),
        ] {
            if need > have {
                return fail(format!("{name} needs {need} floats, its buffer has {have}"));
            }
        }
        Ok(())
    }
}

/// A one-dimensional launch: `grid` blocks of `block` threads, with
/// `shared_bytes` of dynamic shared memory per block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Launch {
    pub grid: u32,
    pub block: u32,
    pub shared_bytes: u32,
}

impl Launch {
    /// One thread per element of `n`, in blocks of [`ELEMENT_THREADS`];
    /// `blocks` names them in the error if there are too many.
    pub(crate) fn elements(n: usize, blocks: &str) -> Result<Self> {
        Ok(Launch {
            grid: grid(n.div_ceil(ELEMENT_THREADS as usize), blocks)?,
            block: ELEMENT_THREADS,
            shared_bytes: 0,
        })
    }

    /// One warp per row (`rows` of them, named `what`), [`ROWS_PER_BLOCK`]
    /// rows to a block of [`ROW_THREADS`]; no shared memory.
    pub(crate) fn warp_rows(rows: usize, what: &str) -> Result<Self> {
        Ok(Launch {
            grid: grid(rows.div_ceil(ROWS_PER_BLOCK), what)?,
            block: ROW_THREADS,
            shared_bytes: 0,
        })
    }

    /// `softmax_rows`'s launch for `rows` rows of `cols`: each row a group
    /// of lanes, the fewest (a power of two, at most a warp) that hold a
    /// row in [`SOFTMAX_PER_LANE`] values each, [`ROW_THREADS`] / group
    /// rows to a block. Returns the launch and the group (the kernel's
    /// last argument).
    pub(crate) fn softmax_rows(rows: usize, cols: usize, what: &str) -> Result<(Self, u32)> {
        let group = cols
            .div_ceil(SOFTMAX_PER_LANE)
            .next_power_of_two()
            .clamp(1, 32);
        let per_block = ROW_THREADS as usize / group;
        Ok((
            Launch {
                grid: grid(rows.div_ceil(per_block), what)?,
                block: ROW_THREADS,
                shared_bytes: 0,
            },
            group as u32,
        ))
    }

    /// `attention_mma`'s launch for `pixels` pixels' sequences of `len`
    /// and `nhead` heads of `hd`: a block of [`ATTENTION_ROWS`] / 16 warps
    /// per (pixel, head, [`ATTENTION_ROWS`] query rows), with in shared
    /// memory the block's Q rows and [`ATTENTION_KEYS`] keys' K (rows of
    /// the head padded to 16, plus 8) and V (transposed: a row of
    /// [`ATTENTION_KEYS`] + 8 per padded head dimension). `None` where the
    /// kernel does not apply (a head wider than [`ATTENTION_MAX_HEAD`]).
    pub(crate) fn attention_mma(
        pixels: usize,
        len: usize,
        nhead: usize,
        hd: usize,
    ) -> Result<Option<Self>> {
        if hd == 0 || hd > ATTENTION_MAX_HEAD || len == 0 {
            return Ok(None);
        }
        let padded = hd.div_ceil(16) * 16;
        let shared_values =
            (ATTENTION_ROWS + ATTENTION_KEYS) * (padded + 8) + padded * (ATTENTION_KEYS + 8);
        let blocks = pixels
            .checked_mul(nhead)
            .and_then(|b| b.checked_mul(len.div_ceil(ATTENTION_ROWS)))
            .ok_or_else(|| {
                EncodeError::backend("gpu", format!("{pixels} x {nhead} attention blocks"))
            })?;
        Ok(Some(Launch {
            grid: grid(blocks, "attention blocks")?,
            block: (ATTENTION_ROWS / 16 * 32) as u32,
            shared_bytes: (2 * shared_values) as u32,
        }))
    }

    /// Blocks of [`ELEMENT_THREADS`] covering each group of
    /// [`EPILOGUE_ROWS`] of `rows` rows of `cols` in `ceil(cols /
    /// ELEMENT_THREADS)` segments (`bias_epilogue`).
    pub(crate) fn row_segments(rows: usize, cols: usize, what: &str) -> Result<Self> {
        let segments = cols.div_ceil(ELEMENT_THREADS as usize);
        let blocks = rows
            .div_ceil(EPILOGUE_ROWS)
            .checked_mul(segments)
            .ok_or_else(|| EncodeError::backend("gpu", format!("{rows} x {segments} {what}")))?;
        Ok(Launch {
            grid: grid(blocks, what)?,
            block: ELEMENT_THREADS,
            shared_bytes: 0,
        })
    }

    /// One block of [`ROW_THREADS`] per row (`rows` of them, named `what`),
    /// each with `shared_bytes` of shared memory.
    pub(crate) fn rows(rows: usize, what: &str, shared_bytes: u32) -> Result<Self> {
        Ok(Launch {
            grid: grid(rows, what)?,
            block: ROW_THREADS,
            shared_bytes,
        })
    }
}

/// A kernel argument, in the kernel signature's order: `B` is the device's
/// f32 buffer, `H` its bf16 one.
pub(crate) enum Arg<'a, B, H> {
    /// A buffer the kernel reads.
    In(&'a B),
    /// A buffer the kernel writes.
    Out(&'a mut B),
    /// A bf16 buffer the kernel reads (`const unsigned short*`).
    HalfIn(&'a H),
    /// A bf16 buffer the kernel writes (`unsigned short*`).
    HalfOut(&'a mut H),
    /// A null pointer (an absent optional buffer).
    Null,
    I32(i32),
    F32(f32),
}

/// Where a bf16 GEMM ([`Device::gemm_half`]) writes C: f32, or rounded to
/// bf16 (nearest, ties to even) from the f32 accumulator; with the offset
/// of C's start in the buffer.
pub(crate) enum HalfGemmOut<'a, B, H> {
    F32(&'a mut B, usize),
    Bf16(&'a mut H, usize),
}

/// What a fused GEMM ([`Device::gemm_half_bias`]) does to its f32 product
/// before storing it: add `bias`, then ReLU if `relu`, then add `residual`.
/// `bias_half` is the same bias in bf16, for a device whose library takes
/// no f32 bias with a bf16 C (it then adds the bias as rounded to bf16).
pub(crate) struct Epilogue<'a, B, H> {
    pub bias: &'a B,
    pub bias_half: Option<&'a H>,
    pub relu: bool,
    pub residual: Option<&'a B>,
}

/// What the GPU path needs from a device: buffers of f32 and of bf16, GEMMs
/// and kernel launches, all on one in-order stream.
pub(crate) trait Device: Sized {
    type Buf;
    /// bf16 values, as their 16 bits.
    type Half;
    /// Host memory a copy runs from or into while the host goes on
    /// ([`Device::upload_staged`], [`Device::download_begin`]).
    type Staging: Send + 'static;
    /// How its f32 GEMMs compute (fixed when it was opened).
    fn math(&self) -> GemmMath;
    /// Make the device current on the calling thread. CUDA frees buffers on
    /// the current context, and cudarc's drop does not bind it, so a buffer
    /// dropped on a thread without it would leak (the emulator: nothing).
    fn bind(&self) -> Result<()>;
    /// A new buffer holding `host`.
    fn upload(&self, host: &[f32]) -> Result<Self::Buf>;
    /// A buffer of `n` floats whose contents are whatever the device had
    /// there (NaN in the emulator).
    fn alloc(&self, n: usize) -> Result<Self::Buf>;
    /// Copy `host` into the start of `buf` (at least as long, else an
    /// error) after the work queued before, through host staging memory
    /// (page-locked on a GPU, so the copy needs no host thread): returns
    /// once `host` may be reused, the staging to keep until the copy is
    /// known done (a later download on the stream has been waited for),
    /// then to hand back with [`Device::release`].
    fn upload_staged(&self, host: &[f32], buf: &mut Self::Buf) -> Result<Self::Staging> {
        self.upload_staged_with(host.len(), buf, &mut |staging| {
            staging.copy_from_slice(host)
        })
    }
    /// [`Device::upload_staged`] of `n` floats that `fill` writes straight
    /// into the staging memory (so data assembled for the device is not
    /// first assembled elsewhere and copied).
    fn upload_staged_with(
        &self,
        n: usize,
        buf: &mut Self::Buf,
        fill: &mut dyn FnMut(&mut [f32]),
    ) -> Result<Self::Staging>;
    /// Begin copying the first `n` floats of `buf` into host staging
    /// memory, after the work queued before; [`Device::download_wait`] and
    /// [`Device::download_end`] take them from there.
    fn download_begin(&self, buf: &Self::Buf, n: usize) -> Result<Self::Staging>;
    /// Wait (without the device: no lock need be held) until
    /// `staging`'s download has arrived.
    fn download_wait(staging: &Self::Staging) -> Result<()>;
    /// The `n` floats a [`Device::download_begin`] brought, after
    /// [`Device::download_wait`]; the staging goes back to the device.
    fn download_end(&self, staging: Self::Staging, n: usize) -> Result<Vec<f32>>;
    /// Take back staging memory whose copy is done, for later copies.
    fn release(&self, staging: Self::Staging);
    /// Staging with nothing copied whose [`Device::download_wait`] returns
    /// once the work queued before it is done ([`Device::download_end`] of
    /// 0 floats takes it back): how a pass whose results stay on the
    /// device is known finished.
    fn marker(&self) -> Result<Self::Staging>;
    /// How many floats `buf` holds.
    fn len(buf: &Self::Buf) -> usize;
    /// A new bf16 buffer holding `host` (bf16 bits).
    fn upload_half(&self, host: &[u16]) -> Result<Self::Half>;
    /// A bf16 buffer of `n` values, contents undefined (NaN in the emulator).
    fn alloc_half(&self, n: usize) -> Result<Self::Half>;
    /// How many bf16 values `buf` holds.
    fn half_len(buf: &Self::Half) -> usize;
    /// `g` over A, B and C starting `a.1`, `b.1`, `c.1` floats into their
    /// buffers.
    ///
    /// # Safety
    /// `g.check` passed for these buffers and offsets (what [`Device::gemm`]
    /// does first): nothing checks again.
    unsafe fn gemm_unchecked(
        &self,
        g: &Gemm,
        a: (&Self::Buf, usize),
        b: (&Self::Buf, usize),
        c: (&mut Self::Buf, usize),
    ) -> Result<()>;
    /// [`Device::gemm_unchecked`] after [`Gemm::check`].
    fn gemm(
        &self,
        g: &Gemm,
        a: (&Self::Buf, usize),
        b: (&Self::Buf, usize),
        c: (&mut Self::Buf, usize),
    ) -> Result<()> {
        let rest = |buf: &Self::Buf, off: usize| Self::len(buf).saturating_sub(off);
        g.check(rest(a.0, a.1), rest(b.0, b.1), rest(&*c.0, c.1))?;
        // SAFETY: checked just above.
        unsafe { self.gemm_unchecked(g, a, b, c) }
    }
    /// `g` with A and B in bf16 and f32 accumulation (`g.alpha`, `g.beta`
    /// in f32), C as `c` says; the device's [`GemmMath`] does not apply.
    ///
    /// # Safety
    /// As [`Device::gemm_unchecked`]: [`Device::gemm_half`] checked it.
    unsafe fn gemm_half_unchecked(
        &self,
        g: &Gemm,
        a: (&Self::Half, usize),
        b: (&Self::Half, usize),
        c: HalfGemmOut<'_, Self::Buf, Self::Half>,
    ) -> Result<()>;
    /// [`Gemm::check`] for bf16 A and B from their offsets, and C as `c`
    /// says (f32 or bf16).
    fn check_half(
        g: &Gemm,
        a: (&Self::Half, usize),
        b: (&Self::Half, usize),
        c: &HalfGemmOut<'_, Self::Buf, Self::Half>,
    ) -> Result<()> {
        let rest = |n: usize, off: usize| n.saturating_sub(off);
        let c_rest = match c {
            HalfGemmOut::F32(buf, off) => rest(Self::len(buf), *off),
            HalfGemmOut::Bf16(buf, off) => rest(Self::half_len(buf), *off),
        };
        g.check(
            rest(Self::half_len(a.0), a.1),
            rest(Self::half_len(b.0), b.1),
            c_rest,
        )
    }
    /// [`Device::gemm_half_unchecked`] after [`Gemm::check`].
    fn gemm_half(
        &self,
        g: &Gemm,
        a: (&Self::Half, usize),
        b: (&Self::Half, usize),
        c: HalfGemmOut<'_, Self::Buf, Self::Half>,
    ) -> Result<()> {
        Self::check_half(g, a, b, &c)?;
        // SAFETY: checked just above.
        unsafe { self.gemm_half_unchecked(g, a, b, c) }
    }
    /// One bf16 problem of [`Device::gemm_half`] (`batch` 1, `beta` 0) with
    /// `ep` in its epilogue: the bias (f32, one per row of the column-major
    /// C: per output feature of a Linear) added to the f32 product, then
    /// ReLU if asked, then the residual (f32, C's layout) added, before C
    /// is stored (rounded once to bf16 for [`HalfGemmOut::Bf16`]): what
    /// `bias_epilogue` does after the GEMM, in the GEMM's own epilogue, so
    /// the f32 product never goes through memory. `Ok(false)`: this device
    /// cannot here (no cuBLASLt, or no algorithm for this shape); the
    /// caller then runs the GEMM and the kernel. A GPU library may add the
    /// residual before the bias (cuBLASLt: `(A·B + C) + bias`), a rounding
    /// apart from the kernel's order; one whose ReLU would come after the
    /// residual (cuBLASLt's) declines ReLU with a residual.
    ///
    /// # Safety
    /// [`Device::gemm_half_bias`] checked it.
    unsafe fn gemm_half_bias_unchecked(
        &self,
        g: &Gemm,
        a: (&Self::Half, usize),
        b: (&Self::Half, usize),
        ep: &Epilogue<'_, Self::Buf, Self::Half>,
        c: HalfGemmOut<'_, Self::Buf, Self::Half>,
    ) -> Result<bool>;
    /// [`Device::gemm_half_bias_unchecked`] after [`Gemm::check`], the
    /// bias's length, and the residual's (C's extent, and C in f32).
    fn gemm_half_bias(
        &self,
        g: &Gemm,
        a: (&Self::Half, usize),
        b: (&Self::Half, usize),
        ep: &Epilogue<'_, Self::Buf, Self::Half>,
        c: HalfGemmOut<'_, Self::Buf, Self::Half>,
    ) -> Result<bool> {
        let c_extent = if g.n == 0 { 0 } else { (g.n - 1) * g.ldc + g.m };
        let residual_fits = match (ep.residual, &c) {
            (None, _) => true,
            (Some(r), HalfGemmOut::F32(_, 0)) => Self::len(r) >= c_extent,
            (Some(_), _) => false,
        };
        if g.batch != 1
            || g.beta != 0.0
            || Self::len(ep.bias) < g.m
            || ep.bias_half.is_some_and(|h| Self::half_len(h) < g.m)
            || !residual_fits
        {
            return Err(EncodeError::backend(
                "gpu",
                format!(
                    "fused GEMM {g:?}: one problem with beta 0, a bias of m floats (it has {}) \
                     and a residual only with an f32 C at offset 0 holding C's extent",
                    Self::len(ep.bias)
                ),
            ));
        }
        Self::check_half(g, a, b, &c)?;
        // SAFETY: checked just above.
        unsafe { self.gemm_half_bias_unchecked(g, a, b, ep, c) }
    }
    /// Whether bf16 tensor-core instructions (`mma.sync` m16n8k16, sm_80
    /// and later) run here, so `attention_mma` may be launched.
    fn tensor_cores(&self) -> bool;
    fn launch(
        &self,
        kernel: Kernel,
        launch: Launch,
        args: &mut [Arg<'_, Self::Buf, Self::Half>],
    ) -> Result<()>;
}

/// `x` rounded to bfloat16 (8 bits of significand) to nearest, ties to
/// even, as its 16 bits; NaN stays a (quiet) NaN. What the kernels'
/// `to_bf16` and cuBLAS's conversions do.
pub(crate) fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// The f32 a bf16's bits stand for (exact).
#[cfg(test)]
pub(crate) fn bf16_value(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Blocks of a launch as CUDA takes them (below 2³¹); `what` names them in the error.
fn grid(blocks: usize, what: &str) -> Result<u32> {
    u32::try_from(blocks)
        .ok()
        .filter(|&g| g < 1 << 31)
        .ok_or_else(|| EncodeError::backend("gpu", format!("{blocks} {what} exceed one launch")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_dtype_picks_the_gemm_math() {
        assert_eq!(GemmMath::from_dtype(Dtype::F32), GemmMath::F32);
        assert_eq!(GemmMath::from_dtype(Dtype::Tf32), GemmMath::Tf32);
        assert_eq!(GemmMath::from_dtype(Dtype::Bf16), GemmMath::Bf16);
    }
}
