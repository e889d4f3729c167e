//! Page-locked staging buffers for copies to and from the GPU, kept for reuse.

use cudarc::driver::{sys as drv, CudaEvent, PinnedHostSlice};

use super::{err, CudaDevice, NAME};
use crate::error::{EncodeError, Result};

/// Page-locked host memory a copy runs from or into while the host goes
/// on (a copy from pageable memory holds the host until it is over, and
/// the GPU idles meanwhile between chunks), and the event recorded after
/// that copy on the stream.
pub(crate) struct CudaStaging {
    pub(super) host: PinnedHostSlice<f32>,
    pub(super) done: CudaEvent,
}

impl Drop for CudaStaging {
    fn drop(&mut self) {
        // The copy must be over before the memory is freed: the pinned
        // slice's own drop does not know of it (event tracking is off).
        let _ = self.done.synchronize();
    }
}

/// A copy of `n` floats into a device buffer of `len` fits, else the error.
pub(super) fn check_upload(n: usize, len: usize) -> Result<()> {
    if n > len {
        return Err(EncodeError::backend(
            NAME,
            format!("copying {n} floats into a buffer of {len}"),
        ));
    }
    Ok(())
}

/// A read of `n` floats from a device buffer of `len` fits, else the error.
pub(super) fn check_download(n: usize, len: usize) -> Result<()> {
    if n > len {
        return Err(EncodeError::backend(
            NAME,
            format!("reading {n} floats of a buffer of {len}"),
        ));
    }
    Ok(())
}

/// Staging buffers kept for reuse: two chunks in flight use up to four
/// each (bands, days, and the features' download, or the rows of features
/// kept on the device and a marker), with room to spare so a chunk of
/// another size finds one that fits rather than allocating page-locked
/// memory (slow) while the device waits.
pub(super) const STAGING_KEPT: usize = 12;

impl CudaDevice {
    /// A staging buffer whose first `n` floats `copy` queues a copy from or
    /// into, with the event recorded after that copy.
    pub(super) fn staged(
        &self,
        n: usize,
        copy: impl FnOnce(&mut [f32]) -> Result<()>,
    ) -> Result<CudaStaging> {
        let mut staging = self.take_staging(n)?;
        let pinned = staging
            .host
            .as_mut_slice()
            .map_err(|e| err("reaching page-locked memory", e))?;
        copy(&mut pinned[..n])?;
        staging
            .done
            .record(&self.stream)
            .map_err(|e| err("recording a CUDA event", e))?;
        Ok(staging)
    }

    /// A staging buffer of at least `n` floats: a kept one, or a new one
    /// (rounded up to a power of two, so chunks of other sizes reuse it).
    fn take_staging(&self, n: usize) -> Result<CudaStaging> {
        if let Ok(mut kept) = self.staging.lock() {
            // A marker (n = 0) takes only a marker's own one float: a
            // larger buffer held just for its event could leave a chunk's
            // copy to allocate page-locked memory (slow) meanwhile.
            let fit = kept
                .iter()
                .enumerate()
                .filter(|(_, s)| s.host.len() >= n && (n > 0 || s.host.len() == 1))
                .min_by_key(|(_, s)| s.host.len())
                .map(|(i, _)| i);
            if let Some(i) = fit {
                return Ok(kept.swap_remove(i));
            }
        }
        let ctx = self.stream.context();
        // SAFETY: what is copied in is written first, what is copied out is
        // read only after its copy's event; flags 0: cached (the host reads
        // downloads back), not write-combined.
        let host = unsafe { ctx.alloc_pinned_with_flags::<f32>(n.max(1).next_power_of_two(), 0) }
            .map_err(|e| err("allocating page-locked host memory", e))?;
        let done = ctx
            .new_event(Some(drv::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(|e| err("creating a CUDA event", e))?;
        Ok(CudaStaging { host, done })
    }
}
