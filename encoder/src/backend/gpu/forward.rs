//! The backbone and head passes on the device, each queued behind a ticket the host waits on.

use super::ops::{int, linear_gemm, HalfAttention};
use super::scratch::{HalfSlot, Scratch, Slot};
use super::{Arg, Device, DeviceBackbone, GpuModel, Kernel, Launch};
use crate::backend::{KeptRows, SequenceBatch};
use crate::error::{EncodeError, Result};

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
pub(super) struct Keep<'a> {
    pub(super) place: &'a KeptRows<'a>,
    pub(super) modality: usize,
}

/// A backbone queued on the device ([`GpuModel::backbone`]): the staging
/// its inputs were copied from (kept until the copy is known done) and the
/// download of its `floats` pooled features.
pub(super) struct DeviceTicket<D: Device> {
    pub(super) uploads: Vec<D::Staging>,
    pub(super) download: D::Staging,
    pub(super) floats: usize,
}

impl<D: Device> GpuModel<D> {
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

    /// Queue one backbone pass over `batch` (at most [`MAX_ROWS`](super::MAX_ROWS) tokens)
    /// on the device: the inputs' copies, the pass, and the copy of its
    /// pooled features to the host (or, `keep`, their place in a window
    /// on the device), which the returned ticket waits for. The batch's
    /// buffers may be reused once this returns.
    pub(super) fn backbone(
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
    pub(super) fn head(
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
            crate::backend::interleave_features(z, s2, s1, d)
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
    pub(super) fn head_on_begin(
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
