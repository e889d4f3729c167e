//! The CPU engine and its streams.
//!
//! The engine is shared by every primitive and thread; streams are one per
//! thread, cached thread-locally.

use std::cell::RefCell;
use std::ptr;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};

use crate::error::{check, Result};
use crate::sys;

struct EngineHandle(sys::dnnl_engine_t);

// SAFETY: a oneDNN engine is immutable after creation and documented as safe
// to share between threads (primitives and streams only read it).
unsafe impl Send for EngineHandle {}
unsafe impl Sync for EngineHandle {}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        // SAFETY: created by dnnl_engine_create; every stream, memory and
        // primitive holds an `Engine` clone, so none outlives this.
        unsafe { sys::dnnl_engine_destroy(self.0) };
    }
}

/// A oneDNN CPU engine. Cheap to clone (reference counted); `Send + Sync`.
#[derive(Clone)]
pub struct Engine(Arc<EngineHandle>);

impl Engine {
    /// Creates a new CPU engine. Most callers want [`Engine::cpu`], the shared one.
    pub fn new_cpu() -> Result<Self> {
        let mut raw = ptr::null_mut();
        // SAFETY: out-pointer to a local; index 0 is the only CPU engine.
        check("dnnl_engine_create", unsafe {
            sys::dnnl_engine_create(&mut raw, sys::dnnl_cpu, 0)
        })?;
        Ok(Engine(Arc::new(EngineHandle(raw))))
    }

    /// The process-wide CPU engine, created on first use.
    pub fn cpu() -> Result<Self> {
        static SHARED: OnceLock<Engine> = OnceLock::new();
        if let Some(engine) = SHARED.get() {
            return Ok(engine.clone());
        }
        let engine = Engine::new_cpu()?;
        // A racing thread may have won; either engine is fine, keep the stored one.
        Ok(SHARED.get_or_init(|| engine).clone())
    }

    pub(crate) fn raw(&self) -> sys::dnnl_engine_t {
        self.0 .0
    }

    fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Engine").field(&self.0 .0).finish()
    }
}

/// An in-order oneDNN stream on an engine.
///
/// Streams are not thread-safe in oneDNN, so a `Stream` is `Send` but not
/// `Sync`: give each thread its own. [`Stream::with_thread_local`] does that
/// for callers that don't want to carry one around.
pub struct Stream {
    raw: sys::dnnl_stream_t,
    // Keeps the engine alive for as long as the stream refers to it.
    engine: Engine,
}

// SAFETY: a stream may be used from any one thread at a time; `!Sync` (from the
// raw pointer, restated by not implementing Sync) prevents concurrent use.
unsafe impl Send for Stream {}

impl Stream {
    pub fn new(engine: &Engine) -> Result<Self> {
        let mut raw = ptr::null_mut();
        // SAFETY: out-pointer to a local; the engine is alive.
        check("dnnl_stream_create", unsafe {
            sys::dnnl_stream_create(&mut raw, engine.raw(), sys::dnnl_stream_default_flags)
        })?;
        Ok(Stream {
            raw,
            engine: engine.clone(),
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Waits until everything submitted to this stream has finished. On a CPU
    /// engine with the OpenMP runtime, execution is already synchronous.
    pub fn wait(&self) -> Result<()> {
        // SAFETY: valid stream, used from the owning thread.
        check("dnnl_stream_wait", unsafe {
            sys::dnnl_stream_wait(self.raw)
        })
    }

    pub(crate) fn raw(&self) -> sys::dnnl_stream_t {
        self.raw
    }

    /// Runs `f` with this thread's cached stream for `engine`, creating it on
    /// first use. The cache lives until the thread exits.
    pub fn with_thread_local<R>(
        engine: &Engine,
        f: impl FnOnce(&Stream) -> Result<R>,
    ) -> Result<R> {
        thread_local! {
            // Keyed by engine identity; an `Rc` so the borrow of the cache
            // ends before `f` runs (which may itself need a stream).
            static STREAMS: RefCell<Vec<(usize, Rc<Stream>)>> = const { RefCell::new(Vec::new()) };
        }
        let id = engine.id();
        let stream = STREAMS.with(|cell| -> Result<Rc<Stream>> {
            let mut streams = cell.borrow_mut();
            if let Some((_, s)) = streams.iter().find(|(k, _)| *k == id) {
                return Ok(Rc::clone(s));
            }
            let s = Rc::new(Stream::new(engine)?);
            streams.push((id, Rc::clone(&s)));
            Ok(s)
        })?;
        f(&stream)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created by dnnl_stream_create; the engine outlives it (field order).
        unsafe { sys::dnnl_stream_destroy(self.raw) };
    }
}
