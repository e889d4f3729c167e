//! How many threads a oneDNN call made from this thread uses, and why primitives pin that number.
//!
//! Debian's libdnnl is built with `DNNL_CPU_RUNTIME = DNNL_RUNTIME_OMP` and
//! links libgomp (see `ldd libdnnl.so.2`). With OpenMP, oneDNN sizes each
//! parallel region by `omp_get_max_threads()` of the *calling* thread, and
//! libgomp keeps that number per thread: `omp_set_num_threads(n)` on a plain
//! std thread gives that thread its own copy of the ICVs and changes nothing
//! for other threads. Its `parallel(nthr, f)` calls `f` directly, with no
//! OpenMP region, when `nthr == 1`. So for thread-per-block encoding, each
//! worker sets 1 thread and runs its own GEMMs on its own core.
//!
//! Several implementations (the brgemm matmul in particular) also read the
//! thread count when the primitive is *created* (`dnnl_get_max_threads()` in
//! their configuration step): they split the work and size per-thread
//! scratchpad buffers by it, so running one with more threads than it was
//! created for may index past those buffers, and with fewer leaves part of
//! the split to run serially. So the
//! primitives in this crate carry a thread count: they are created and
//! executed inside a [`ThreadScope`] of that count, whichever thread calls them.
//!
//! With a non-OpenMP build (sequential, TBB, threadpool) these functions do
//! nothing and [`max_threads`] reports 1; the threadpool runtime's
//! `dnnl_threadpool_interop_*` API is not bound because Debian does not build it.

/// The number of threads oneDNN calls from this thread will use.
pub fn max_threads() -> usize {
    #[cfg(dnnl_omp)]
    {
        // SAFETY: plain libgomp query of this thread's ICV.
        unsafe { crate::sys::omp_get_max_threads() }.max(1) as usize
    }
    #[cfg(not(dnnl_omp))]
    {
        1
    }
}

/// Sets the number of threads oneDNN calls *from this thread* use, until changed again.
pub fn set_max_threads(n: usize) {
    #[cfg(dnnl_omp)]
    {
        let n = n.clamp(1, i32::MAX as usize) as i32;
        // SAFETY: plain libgomp setter of this thread's ICV.
        unsafe { crate::sys::omp_set_num_threads(n) };
    }
    #[cfg(not(dnnl_omp))]
    {
        let _ = n;
    }
}

/// Sets this thread's oneDNN thread count for its lifetime and restores the
/// previous count on drop. `!Send`: it must be dropped on the thread it changed.
pub struct ThreadScope {
    previous: usize,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl ThreadScope {
    pub fn new(threads: usize) -> Self {
        let previous = max_threads();
        if previous != threads {
            set_max_threads(threads);
        }
        ThreadScope {
            previous,
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for ThreadScope {
    fn drop(&mut self) {
        if max_threads() != self.previous {
            set_max_threads(self.previous);
        }
    }
}
