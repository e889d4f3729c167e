//! [`Backend`] for [`GpuBackend`]: chunks queued in parts and collected; kept windows' heads.

use super::forward::{DeviceTicket, Keep};
use super::{Device, GpuBackend};
use crate::backend::{Backend, KeptRows, KeptWindows, PendingBackbone, PendingHead, SequenceBatch};
use crate::error::{EncodeError, Result};
use crate::model::Modality;

impl<D: Device> GpuBackend<D> {
    /// Queue `batch` (at most [`MAX_ROWS`](super::MAX_ROWS) tokens) on the device, its
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
