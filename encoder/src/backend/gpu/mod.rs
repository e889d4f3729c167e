//! The GPU path: the model's forward pass written once over a [`Device`].
//!
//! Every Linear is one SGEMM over the whole chunk, attention's two products
//! are strided batched SGEMMs (one per head, over all pixels of the chunk),
//! and the rest (the day-of-year encoding, bias and epilogues, LayerNorm,
//! softmax, attention pooling) are the small kernels in `kernels.cu`. Only
//! the inputs (bands and days) go to the device and only the pooled
//! features and embeddings come back.
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
//! Determinism: one stream, a fixed kernel and GEMM order, and reductions in
//! a fixed tree order per block, so the same chunk gives the same bits on the
//! same GPU and library versions; thread counts do not apply.

#[cfg(all(feature = "cuda", any(target_os = "linux", target_os = "windows")))]
pub mod cuda;
mod device;
#[cfg(test)]
mod emulator;

use std::sync::{Arc, Mutex};

pub(crate) use device::{Arg, Device, Gemm, GemmMath, Kernel, Launch, KERNELS};

use super::{Backend, SequenceBatch};
use crate::error::{EncodeError, Result};
use crate::model::{Backbone, LayerNorm, Linear, Modality, StudentWeights};

struct DeviceLinear<B> {
    in_dim: usize,
    out_dim: usize,
    /// (out, in) row-major, as in the checkpoint.
    weight: B,
    bias: B,
}

struct DeviceNorm<B> {
    dim: usize,
    affine: Option<(B, B)>,
    eps: f32,
}

struct DeviceLayer<B> {
    in_proj: DeviceLinear<B>,
    out_proj: DeviceLinear<B>,
    linear1: DeviceLinear<B>,
    linear2: DeviceLinear<B>,
    norm1: DeviceNorm<B>,
    norm2: DeviceNorm<B>,
}

struct DeviceBackbone<B> {
    d: usize,
    nhead: usize,
    ffn: usize,
    embed0: DeviceLinear<B>,
    embed2: DeviceLinear<B>,
    layers: Vec<DeviceLayer<B>>,
    pool_w: B,
    pool_b: f32,
}

/// The model's weights on a device, and the device; one caller at a time.
struct GpuModel<D: Device> {
    dev: D,
    s2: DeviceBackbone<D::Buf>,
    s1: DeviceBackbone<D::Buf>,
    fc1: DeviceLinear<D::Buf>,
    norm1: DeviceNorm<D::Buf>,
    fc2: DeviceLinear<D::Buf>,
    out_norm: DeviceNorm<D::Buf>,
}

/// A [`Backend`] on any [`Device`]; `name` is what errors and `--backend`
/// call it.
pub(crate) struct GpuBackend<D: Device> {
    name: &'static str,
    model: Mutex<(GpuModel<D>, Scratch<D::Buf>)>,
    d: usize,
    repr_dim: usize,
}

impl<D: Device> GpuBackend<D> {
    /// Upload the weights once.
    pub(crate) fn create(name: &'static str, dev: D, weights: Arc<StudentWeights>) -> Result<Self> {
        let ffn = weights.config.dim_feedforward;
        let model = GpuModel {
            s2: backbone(&dev, &weights.s2, ffn)?,
            s1: backbone(&dev, &weights.s1, ffn)?,
            fc1: linear(&dev, &weights.head.fc1)?,
            norm1: norm(&dev, &weights.head.norm1)?,
            fc2: linear(&dev, &weights.head.fc2)?,
            out_norm: norm(&dev, &weights.head.out_norm)?,
            dev,
        };
        Ok(GpuBackend {
            name,
            model: Mutex::new((model, Scratch::new())),
            d: weights.config.d_model(),
            repr_dim: weights.config.repr_dim,
        })
    }

    #[allow(clippy::type_complexity)]
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, (GpuModel<D>, Scratch<D::Buf>)>> {
        self.model
            .lock()
            .map_err(|_| EncodeError::backend(self.name, "a previous device call panicked"))
    }
}

fn linear<D: Device>(dev: &D, l: &Linear) -> Result<DeviceLinear<D::Buf>> {
    Ok(DeviceLinear {
        in_dim: l.in_dim,
        out_dim: l.out_dim,
        weight: dev.upload(&l.weight)?,
        bias: dev.upload(&l.bias)?,
    })
}

fn norm<D: Device>(dev: &D, n: &LayerNorm) -> Result<DeviceNorm<D::Buf>> {
    Ok(DeviceNorm {
        dim: n.dim,
        affine: match &n.affine {
            Some((w, b)) => Some((dev.upload(w)?, dev.upload(b)?)),
            None => None,
        },
        eps: n.eps,
    })
}

fn backbone<D: Device>(dev: &D, b: &Backbone, ffn: usize) -> Result<DeviceBackbone<D::Buf>> {
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
            in_proj: linear(dev, &l.in_proj)?,
            out_proj: linear(dev, &l.out_proj)?,
            linear1: linear(dev, &l.linear1)?,
            linear2: linear(dev, &l.linear2)?,
            norm1: norm(dev, &l.norm1)?,
            norm2: norm(dev, &l.norm2)?,
        });
    }
    Ok(DeviceBackbone {
        d: b.d_model,
        nhead: b.nhead,
        ffn,
        embed0: linear(dev, &b.embed0)?,
        embed2: linear(dev, &b.embed2)?,
        layers,
        pool_w: dev.upload(&b.pool.weight)?,
        pool_b: b.pool.bias[0],
    })
}

/// A size as a kernel's `int`.
fn int(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| EncodeError::backend("gpu", format!("{what} {v} exceeds a kernel's int")))
}

impl<D: Device> GpuModel<D> {
    /// `y (m, out) = epilogue(x (m, in) · Wᵀ + b)`, all row-major. SGEMM
    /// computes the column-major `yᵀ (out, m) = W · xᵀ`: W's row-major
    /// storage is Wᵀ column-major (so `trans_a`, lda = in), x's is xᵀ
    /// (no `trans_b`, ldb = in).
    fn linear(
        &self,
        l: &DeviceLinear<D::Buf>,
        x: &D::Buf,
        m: usize,
        y: &mut D::Buf,
        relu: bool,
        residual: Option<&D::Buf>,
    ) -> Result<()> {
        self.gemm_linear(l, x, m, y)?;
        self.epilogue(y, Some(&l.bias), m, l.out_dim, relu, residual)
    }

    /// `y = x · Wᵀ`, the GEMM of [`GpuModel::linear`] without its bias.
    fn gemm_linear(
        &self,
        l: &DeviceLinear<D::Buf>,
        x: &D::Buf,
        m: usize,
        y: &mut D::Buf,
    ) -> Result<()> {
        let g = Gemm {
            trans_a: true,
            trans_b: false,
            m: l.out_dim,
            n: m,
            k: l.in_dim,
            alpha: 1.0,
            lda: l.in_dim,
            ldb: l.in_dim,
            beta: 0.0,
            ldc: l.out_dim,
            batch: 1,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
        };
        self.dev.gemm(&g, (&l.weight, 0), (x, 0), (&mut *y, 0))
    }

    /// In place on the (rows, cols) `y`: add `bias` (per column), then ReLU
    /// if asked, then add `residual` — one pass of `bias_epilogue`.
    fn epilogue(
        &self,
        y: &mut D::Buf,
        bias: Option<&D::Buf>,
        rows: usize,
        cols: usize,
        relu: bool,
        residual: Option<&D::Buf>,
    ) -> Result<()> {
        let launch = Launch::row_segments(rows, cols, "epilogue blocks")?;
        let mut args = [
            Arg::Out(y),
            bias.map_or(Arg::Null, Arg::In),
            residual.map_or(Arg::Null, Arg::In),
            Arg::I32(int(rows, "rows")?),
            Arg::I32(int(cols, "cols")?),
            Arg::I32(i32::from(relu)),
        ];
        self.dev.launch(Kernel::BiasEpilogue, launch, &mut args)
    }

    /// `y (m, out) = norm(x · Wᵀ + b + residual)`: the GEMM of
    /// [`GpuModel::linear`], then bias, residual and LayerNorm in one
    /// `residual_layer_norm` pass (the same bits as `linear` with the
    /// residual followed by `layer_norm`).
    fn linear_add_norm(
        &self,
        l: &DeviceLinear<D::Buf>,
        x: &D::Buf,
        m: usize,
        y: &mut D::Buf,
        residual: &D::Buf,
        n: &DeviceNorm<D::Buf>,
    ) -> Result<()> {
        self.gemm_linear(l, x, m, y)?;
        let launch = Launch::warp_rows(m, "rows")?;
        let (gamma, beta) = match &n.affine {
            Some((g, b)) => (Arg::In(g), Arg::In(b)),
            None => (Arg::Null, Arg::Null),
        };
        let mut args = [
            Arg::Out(y),
            Arg::In(&l.bias),
            Arg::In(residual),
            gamma,
            beta,
            Arg::I32(int(m, "rows")?),
            Arg::I32(int(n.dim, "dim")?),
            Arg::F32(n.eps),
        ];
        self.dev
            .launch(Kernel::ResidualLayerNorm, launch, &mut args)
    }

    fn layer_norm(&self, n: &DeviceNorm<D::Buf>, x: &mut D::Buf, rows: usize) -> Result<()> {
        let launch = Launch::warp_rows(rows, "rows")?;
        let (gamma, beta) = match &n.affine {
            Some((g, b)) => (Arg::In(g), Arg::In(b)),
            None => (Arg::Null, Arg::Null),
        };
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
        let d3 = 3 * d;
        for h in 0..nhead {
            // Scores S (len × len, row-major) = Q Kᵀ / √hd. Column-major:
            // Sᵀ = K Qᵀ; K's row-major storage (ld 3d) is Kᵀ column-major,
            // so trans_a; Q's is Qᵀ, no trans_b.
            let g = Gemm {
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
            self.dev
                .gemm(&g, (qkv, d + h * hd), (qkv, h * hd), (&mut *scores, 0))?;
            let launch = Launch::warp_rows(px * len, "score rows")?;
            let mut args = [
                Arg::Out(&mut *scores),
                Arg::I32(int(px * len, "score rows")?),
                Arg::I32(int(len, "len")?),
            ];
            self.dev.launch(Kernel::SoftmaxRows, launch, &mut args)?;
            // O (len × hd, row-major, ld d) = P V. Column-major: Oᵀ = Vᵀ Pᵀ;
            // V's storage (ld 3d) is Vᵀ (no trans_a), P's is Pᵀ (no trans_b).
            let g = Gemm {
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
            self.dev.gemm(
                &g,
                (qkv, 2 * d + h * hd),
                (&*scores, 0),
                (&mut *attn, h * hd),
            )?;
        }
        Ok(())
    }

    fn backbone(
        &self,
        bb: &DeviceBackbone<D::Buf>,
        batch: &SequenceBatch<'_>,
        scratch: &mut Scratch<D::Buf>,
    ) -> Result<Vec<f32>> {
        let (px, len, d) = (batch.n, batch.len, bb.d);
        let m = px * len;
        let dev = &self.dev;
        let mut values = scratch.take(dev, Slot::Values, batch.values.len())?;
        dev.upload_into(batch.values, &mut values)?;
        // The day-of-year encoding on the device: on the host it would cost
        // px·len·d/2 sin/cos and a copy as large as the activations per
        // chunk, more than the chunk's GEMMs on a GPU.
        let mut doys = scratch.take(dev, Slot::Doys, batch.doys.len())?;
        dev.upload_into(batch.doys, &mut doys)?;
        let mut t = scratch.take(dev, Slot::T, m * d)?;
        let mut h = scratch.take(dev, Slot::H, m * d)?;
        let mut qkv = scratch.take(dev, Slot::Qkv, m * 3 * d)?;
        let mut attn = scratch.take(dev, Slot::Attn, m * d)?;
        let mut ff = scratch.take(dev, Slot::Ff, m * bb.ffn)?;
        let mut scores = scratch.take(dev, Slot::Scores, px * len * len)?;
        let mut pooled = scratch.take(dev, Slot::Pooled, px * d)?;
        // The encoding lives in `attn` until the first attention needs it.
        let pe = &mut attn;
        let launch = Launch::elements(m * (d / 2), "day-of-year encoding blocks")?;
        let mut args = [
            Arg::Out(pe),
            Arg::In(&doys),
            Arg::I32(int(m, "rows")?),
            Arg::I32(int(d, "d")?),
        ];
        dev.launch(Kernel::DoyEncoding, launch, &mut args)?;
        self.linear(&bb.embed0, &values, m, &mut t, true, None)?;
        self.linear(&bb.embed2, &t, m, &mut h, false, Some(&attn))?;
        for l in &bb.layers {
            self.linear(&l.in_proj, &h, m, &mut qkv, false, None)?;
            self.attention(&qkv, &mut attn, &mut scores, px, len, d, bb.nhead)?;
            self.linear_add_norm(&l.out_proj, &attn, m, &mut t, &h, &l.norm1)?;
            std::mem::swap(&mut t, &mut h);
            self.linear(&l.linear1, &h, m, &mut ff, true, None)?;
            self.linear_add_norm(&l.linear2, &ff, m, &mut t, &h, &l.norm2)?;
            std::mem::swap(&mut t, &mut h);
        }
        let weights_bytes = u32::try_from(len * 4)
            .map_err(|_| EncodeError::backend("gpu", format!("sequence of {len}")))?;
        let launch = Launch::rows(px, "pixels", weights_bytes)?;
        let mut args = [
            Arg::In(&h),
            Arg::In(&bb.pool_w),
            Arg::F32(bb.pool_b),
            Arg::Out(&mut pooled),
            Arg::I32(int(len, "len")?),
            Arg::I32(int(d, "d")?),
        ];
        dev.launch(Kernel::AttentionPool, launch, &mut args)?;
        let out = dev.download_prefix(&pooled, px * d)?;
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
            (Slot::Pooled, pooled),
        ] {
            scratch.give(slot, buf);
        }
        Ok(out)
    }

    fn head(
        &self,
        s2: &[f32],
        s1: &[f32],
        n: usize,
        d: usize,
        scratch: &mut Scratch<D::Buf>,
    ) -> Result<Vec<f32>> {
        let mut z = vec![0f32; n * 2 * d];
        for (i, row) in z.chunks_exact_mut(2 * d).enumerate() {
            row[..d].copy_from_slice(&s2[i * d..(i + 1) * d]);
            row[d..].copy_from_slice(&s1[i * d..(i + 1) * d]);
        }
        let dev = &self.dev;
        let mut zd = scratch.take(dev, Slot::Values, z.len())?;
        dev.upload_into(&z, &mut zd)?;
        let mut y = scratch.take(dev, Slot::T, n * self.fc1.out_dim)?;
        self.linear(&self.fc1, &zd, n, &mut y, false, None)?;
        self.layer_norm(&self.norm1, &mut y, n)?;
        // ReLU after the norm.
        self.epilogue(&mut y, None, n, self.fc1.out_dim, true, None)?;
        let mut out = scratch.take(dev, Slot::H, n * self.fc2.out_dim)?;
        self.linear(&self.fc2, &y, n, &mut out, false, None)?;
        self.layer_norm(&self.out_norm, &mut out, n)?;
        let result = dev.download_prefix(&out, n * self.fc2.out_dim)?;
        scratch.give(Slot::Values, zd);
        scratch.give(Slot::T, y);
        scratch.give(Slot::H, out);
        Ok(result)
    }
}

/// The device buffers a chunk works in, by role.
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
}

const SLOTS: usize = Slot::Pooled as usize + 1;

/// Device buffers kept from chunk to chunk, each grown to the largest size
/// asked of it, so a chunk allocates and frees nothing on the device (a
/// free can wait for the GPU, and a fresh buffer had to be zeroed). Every
/// buffer is written before it is read within a chunk, so what an earlier
/// chunk left in it never matters; the emulator fills new buffers with NaN
/// to show it.
struct Scratch<B> {
    slots: [Option<B>; SLOTS],
}

impl<B> Scratch<B> {
    fn new() -> Self {
        Scratch {
            slots: std::array::from_fn(|_| None),
        }
    }

    /// The buffer of `slot` if it holds `n` floats, else a new one of `n`.
    fn take<D: Device<Buf = B>>(&mut self, dev: &D, slot: Slot, n: usize) -> Result<B> {
        match self.slots[slot as usize].take() {
            Some(b) if D::len(&b) >= n => Ok(b),
            old => {
                // Free the small one first: the new one may need its room.
                drop(old);
                dev.alloc(n)
            }
        }
    }

    fn give(&mut self, slot: Slot, buf: B) {
        self.slots[slot as usize] = Some(buf);
    }
}

impl<D: Device + Send> Backend for GpuBackend<D>
where
    D::Buf: Send,
{
    fn name(&self) -> &'static str {
        self.name
    }

    fn backbone(&self, modality: Modality, batch: &SequenceBatch<'_>) -> Result<Vec<f32>> {
        batch.check(self.name)?;
        let mut guard = self.lock()?;
        let (model, scratch) = &mut *guard;
        let bb = match modality {
            Modality::S2 => &model.s2,
            Modality::S1 => &model.s1,
        };
        model.backbone(bb, batch, scratch)
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
        let out = model.head(s2, s1, n, d, scratch)?;
        debug_assert_eq!(out.len(), n * self.repr_dim);
        Ok(out)
    }
}
