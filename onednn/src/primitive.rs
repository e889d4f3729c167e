//! Owned oneDNN handles, reorders and the per-thread scratchpad.
//!
//! Primitive descriptors, primitives, attributes and post-op lists are
//! wrapped with Drop.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr;
use std::sync::Mutex;

use crate::engine::{Engine, Stream};
use crate::error::{check, Result};
use crate::memory::{AlignedBuf, MemoryDesc};
use crate::sys;

/// An operation applied to the matmul result before it is written, in order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PostOp {
    /// `x = max(x, 0)`.
    Relu,
    /// `x = alpha * x + beta` (e.g. the 1/sqrt(d_head) attention scale).
    Linear { alpha: f32, beta: f32 },
    /// `x = x + residual`, where `residual` is an f32 tensor shaped like dst,
    /// passed to `execute`. At most one per primitive in this crate.
    BinaryAdd,
    /// `x = x + dst_before`: accumulates into what the caller's dst already
    /// holds. Put it first: several oneDNN implementations accept it only there.
    Sum,
}

pub(crate) struct PostOps(sys::dnnl_post_ops_t);

impl PostOps {
    /// Builds the post-op list; `dst_desc` (plain f32, dst-shaped) describes a `BinaryAdd` operand.
    pub(crate) fn new(ops: &[PostOp], dst_desc: &MemoryDesc) -> Result<Self> {
        let mut raw = ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check("dnnl_post_ops_create", unsafe {
            sys::dnnl_post_ops_create(&mut raw)
        })?;
        let post_ops = PostOps(raw);
        for op in ops {
            // SAFETY: `raw` is live (owned by `post_ops`); descriptors are initialised.
            match *op {
                PostOp::Relu => check("dnnl_post_ops_append_eltwise(relu)", unsafe {
                    sys::dnnl_post_ops_append_eltwise(raw, 1.0, sys::dnnl_eltwise_relu, 0.0, 0.0)
                })?,
                PostOp::Linear { alpha, beta } => {
                    check("dnnl_post_ops_append_eltwise(linear)", unsafe {
                        sys::dnnl_post_ops_append_eltwise(
                            raw,
                            1.0,
                            sys::dnnl_eltwise_linear,
                            alpha,
                            beta,
                        )
                    })?
                }
                PostOp::BinaryAdd => check("dnnl_post_ops_append_binary(add)", unsafe {
                    sys::dnnl_post_ops_append_binary(raw, sys::dnnl_binary_add, &dst_desc.0)
                })?,
                PostOp::Sum => check("dnnl_post_ops_append_sum", unsafe {
                    sys::dnnl_post_ops_append_sum(raw, 1.0)
                })?,
            }
        }
        Ok(post_ops)
    }
}

impl Drop for PostOps {
    fn drop(&mut self) {
        // SAFETY: created by dnnl_post_ops_create; attributes copy it.
        unsafe { sys::dnnl_post_ops_destroy(self.0) };
    }
}

pub(crate) struct Attr(pub(crate) sys::dnnl_primitive_attr_t);

impl Attr {
    /// Attributes with a user-managed scratchpad (see [`with_scratchpad`]) and the given post-ops.
    pub(crate) fn new(post_ops: Option<&PostOps>) -> Result<Self> {
        let mut raw = ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check("dnnl_primitive_attr_create", unsafe {
            sys::dnnl_primitive_attr_create(&mut raw)
        })?;
        let attr = Attr(raw);
        // SAFETY: `raw` is live; the post-op list is copied into the attribute.
        check("dnnl_primitive_attr_set_scratchpad_mode", unsafe {
            sys::dnnl_primitive_attr_set_scratchpad_mode(raw, sys::dnnl_scratchpad_mode_user)
        })?;
        if let Some(p) = post_ops {
            check("dnnl_primitive_attr_set_post_ops", unsafe {
                sys::dnnl_primitive_attr_set_post_ops(raw, p.0)
            })?;
        }
        Ok(attr)
    }
}

impl Drop for Attr {
    fn drop(&mut self) {
        // SAFETY: created by dnnl_primitive_attr_create; primitive descriptors copy it.
        unsafe { sys::dnnl_primitive_attr_destroy(self.0) };
    }
}

pub(crate) struct PrimitiveDesc(pub(crate) sys::dnnl_primitive_desc_t);

impl PrimitiveDesc {
    pub(crate) fn matmul(
        engine: &Engine,
        src: &MemoryDesc,
        weights: &MemoryDesc,
        bias: Option<&MemoryDesc>,
        dst: &MemoryDesc,
        attr: &Attr,
    ) -> Result<Self> {
        let mut op = sys::dnnl_matmul_desc_t::zeroed();
        let no_bias = sys::dnnl_memory_desc_t::zeroed();
        let bias_raw = bias.map_or(&no_bias as *const _, |b| &b.0 as *const _);
        // SAFETY: all descriptors are initialised (or zeroed = "no bias"); out-pointer to a local.
        check("dnnl_matmul_desc_init", unsafe {
            sys::dnnl_matmul_desc_init(&mut op, &src.0, &weights.0, bias_raw, &dst.0)
        })?;
        let mut raw = ptr::null_mut();
        // SAFETY: `op` was initialised above; attr and engine are live.
        check("dnnl_primitive_desc_create(matmul)", unsafe {
            sys::dnnl_primitive_desc_create(
                &mut raw,
                &op as *const sys::dnnl_matmul_desc_t as *const c_void,
                attr.0,
                engine.raw(),
                ptr::null(),
            )
        })?;
        Ok(PrimitiveDesc(raw))
    }

    pub(crate) fn reorder(
        engine: &Engine,
        from: &MemoryDesc,
        to: &MemoryDesc,
        attr: &Attr,
    ) -> Result<Self> {
        let mut raw = ptr::null_mut();
        // SAFETY: descriptors initialised; engine and attr live; out-pointer to a local.
        check("dnnl_reorder_primitive_desc_create", unsafe {
            sys::dnnl_reorder_primitive_desc_create(
                &mut raw,
                &from.0,
                engine.raw(),
                &to.0,
                engine.raw(),
                attr.0,
            )
        })?;
        Ok(PrimitiveDesc(raw))
    }

    pub(crate) fn query_md(&self, what: sys::dnnl_query_t) -> Option<MemoryDesc> {
        // SAFETY: `self.0` is live.
        unsafe { MemoryDesc::query(self.0, what) }
    }

    /// The implementation oneDNN picked, e.g. "brg:avx512_core_amx", "gemm:jit", "ref:any".
    pub(crate) fn impl_name(&self) -> String {
        let mut name: *const c_char = ptr::null();
        // SAFETY: impl_info_str writes a `const char *` owned by the descriptor.
        let status = unsafe {
            sys::dnnl_primitive_desc_query(
                self.0,
                sys::dnnl_query_impl_info_str,
                0,
                &mut name as *mut _ as *mut c_void,
            )
        };
        if status != sys::dnnl_success || name.is_null() {
            return "?".to_owned();
        }
        // SAFETY: non-null NUL-terminated string owned by the live descriptor.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    pub(crate) fn scratchpad_bytes(&self) -> usize {
        self.query_md(sys::dnnl_query_scratchpad_md)
            .map_or(0, |md| md.size_bytes())
    }
}

impl Drop for PrimitiveDesc {
    fn drop(&mut self) {
        // SAFETY: created by a dnnl_*primitive_desc_create call; primitives keep their own copy.
        unsafe { sys::dnnl_primitive_desc_destroy(self.0) };
    }
}

/// Execute arguments a primitive takes besides the scratchpad (src, weights, bias, dst, a post-op operand).
const MAX_ARGS: usize = 7;

/// A created primitive plus what executing it needs: its arguments'
/// descriptors (in the order `execute` receives their buffers) and a pool of
/// memory objects for them.
pub(crate) struct Primitive {
    raw: sys::dnnl_primitive_t,
    args: Vec<(c_int, MemoryDesc)>,
    scratchpad: Option<MemoryDesc>,
    pub(crate) impl_name: String,
    /// Memory objects for one execution each. A call takes a set (or makes
    /// one) and puts it back, so concurrent calls never share a memory object,
    /// and a steady state creates none: creating five per call cost ~3 us,
    /// more than a small GEMM's worth of work (measured with examples/execute_cost).
    pool: Mutex<Vec<MemorySet>>,
    /// Last, so it is dropped after the pooled memory objects that refer to it.
    engine: Engine,
}

// SAFETY: oneDNN CPU primitives are immutable after creation and may be
// executed concurrently from several threads, each with its own stream and
// memory objects (the pool hands each call its own). The one piece of shared
// mutable state oneDNN would use, the library-managed scratchpad, is disabled:
// every primitive here uses `scratchpad_mode_user` and gets a per-thread
// scratchpad (`with_scratchpad`).
unsafe impl Send for Primitive {}
unsafe impl Sync for Primitive {}

impl Primitive {
    /// `args` lists the execute arguments (index and descriptor) other than the scratchpad.
    pub(crate) fn new(
        pd: &PrimitiveDesc,
        engine: &Engine,
        args: Vec<(c_int, MemoryDesc)>,
    ) -> Result<Self> {
        assert!(
            args.len() <= MAX_ARGS,
            "a primitive here takes at most {MAX_ARGS} arguments"
        );
        let mut raw = ptr::null_mut();
        // SAFETY: `pd` is live; out-pointer to a local.
        check("dnnl_primitive_create", unsafe {
            sys::dnnl_primitive_create(&mut raw, pd.0)
        })?;
        let scratchpad_bytes = pd.scratchpad_bytes();
        Ok(Primitive {
            raw,
            engine: engine.clone(),
            args,
            scratchpad: (scratchpad_bytes > 0)
                .then(|| pd.query_md(sys::dnnl_query_scratchpad_md))
                .flatten(),
            impl_name: pd.impl_name(),
            pool: Mutex::new(Vec::new()),
        })
    }

    /// Runs the primitive on `stream` with `buffers[i]` as the buffer of the
    /// i-th argument given to [`Primitive::new`].
    ///
    /// # Safety
    /// Each buffer must hold at least its descriptor's `size_bytes()`, stay
    /// valid for the call, and not be written by anyone else during it. Only
    /// the dst argument is written; the others must merely be readable.
    pub(crate) unsafe fn execute(&self, stream: &Stream, buffers: &[*mut c_void]) -> Result<()> {
        assert_eq!(buffers.len(), self.args.len(), "one buffer per argument");
        let taken = self
            .pool
            .lock()
            .expect("memory pool lock is never held across a panic")
            .pop();
        let mut set = taken.unwrap_or_default();
        let result = match &self.scratchpad {
            None => self.run(stream, &mut set, buffers, None),
            Some(md) => with_scratchpad(md.size_bytes(), |scratch| {
                self.run(stream, &mut set, buffers, Some(scratch))
            }),
        };
        self.pool
            .lock()
            .expect("memory pool lock is never held across a panic")
            .push(set);
        result
    }

    fn run(
        &self,
        stream: &Stream,
        set: &mut MemorySet,
        buffers: &[*mut c_void],
        scratch: Option<*mut c_void>,
    ) -> Result<()> {
        let descs = self
            .args
            .iter()
            .map(|(_, md)| md)
            .chain(self.scratchpad.as_ref());
        let ptrs = buffers.iter().copied().chain(scratch);
        let mut exec = [sys::dnnl_exec_arg_t {
            arg: 0,
            memory: ptr::null_mut(),
        }; MAX_ARGS + 1];
        let mut n = 0;
        for (i, (md, p)) in descs.zip(ptrs).enumerate() {
            // SAFETY: the caller of `execute` vouches for the buffers; the
            // scratchpad is this thread's, sized by `with_scratchpad`.
            let memory = unsafe { set.bind(i, &self.engine, stream, md, p) }?;
            let arg = self
                .args
                .get(i)
                .map_or(sys::DNNL_ARG_SCRATCHPAD, |(a, _)| *a);
            exec[n] = sys::dnnl_exec_arg_t { arg, memory };
            n += 1;
        }
        // SAFETY: every memory in `exec` is bound to a buffer valid for this call;
        // the stream is this thread's and the primitive is live.
        check("dnnl_primitive_execute", unsafe {
            sys::dnnl_primitive_execute(self.raw, stream.raw(), n as c_int, exec.as_ptr())
        })
    }
}

impl Drop for Primitive {
    fn drop(&mut self) {
        // SAFETY: created by dnnl_primitive_create.
        unsafe { sys::dnnl_primitive_destroy(self.raw) };
    }
}

/// Memory objects for one execution of one primitive, with the buffer each is bound to.
#[derive(Default)]
struct MemorySet {
    slots: Vec<(sys::dnnl_memory_t, *mut c_void)>,
}

// SAFETY: a set is used by one call at a time (it is out of the pool meanwhile).
unsafe impl Send for MemorySet {}

impl MemorySet {
    /// The memory object for argument `i`, bound to `buffer`. A new object is
    /// created around the buffer; an existing one is rebound only if the
    /// buffer moved, so constant arguments (packed weights, bias) are never
    /// rebound (rebinding zero-fills padding, which would write to shared weights).
    ///
    /// # Safety
    /// `buffer` must hold `md.size_bytes()` bytes valid for the coming execute.
    unsafe fn bind(
        &mut self,
        i: usize,
        engine: &Engine,
        stream: &Stream,
        md: &MemoryDesc,
        buffer: *mut c_void,
    ) -> Result<sys::dnnl_memory_t> {
        if let Some((memory, bound)) = self.slots.get_mut(i) {
            if *bound != buffer {
                check("dnnl_memory_set_data_handle_v2", unsafe {
                    sys::dnnl_memory_set_data_handle_v2(*memory, buffer, stream.raw())
                })?;
                *bound = buffer;
            }
            return Ok(*memory);
        }
        debug_assert_eq!(i, self.slots.len(), "arguments are bound in order");
        let mut memory = ptr::null_mut();
        check("dnnl_memory_create", unsafe {
            sys::dnnl_memory_create(&mut memory, &md.0, engine.raw(), buffer)
        })?;
        self.slots.push((memory, buffer));
        Ok(memory)
    }
}

impl Drop for MemorySet {
    fn drop(&mut self) {
        for (memory, _) in &self.slots {
            // SAFETY: created by dnnl_memory_create around a user buffer; this frees only the object.
            unsafe { sys::dnnl_memory_destroy(*memory) };
        }
    }
}

/// Runs `f` with this thread's scratchpad, grown to at least `bytes`.
///
/// One buffer per thread, reused by every primitive the thread executes: a
/// primitive needs its scratchpad only during `execute`, and a thread runs one
/// primitive at a time.
pub(crate) fn with_scratchpad<R>(
    bytes: usize,
    f: impl FnOnce(*mut c_void) -> Result<R>,
) -> Result<R> {
    thread_local! {
        static SCRATCH: RefCell<AlignedBuf> = RefCell::new(AlignedBuf::zeroed(0));
    }
    SCRATCH.with(|cell| {
        // A nested call (not something this crate does) gets its own buffer
        // rather than aliasing the outer one.
        match cell.try_borrow_mut() {
            Ok(mut buf) => {
                if buf.len() < bytes {
                    *buf = AlignedBuf::zeroed(bytes);
                }
                f(buf.as_mut_ptr())
            }
            Err(_) => f(AlignedBuf::zeroed(bytes).as_mut_ptr()),
        }
    })
}

/// Copies (converting layout and data type) from `from` to `to` with a reorder primitive.
///
/// # Safety
/// `src` must hold `from.size_bytes()` readable bytes and `dst` `to.size_bytes()` writable bytes.
pub(crate) unsafe fn reorder(
    engine: &Engine,
    from: &MemoryDesc,
    src: *const c_void,
    to: &MemoryDesc,
    dst: *mut c_void,
) -> Result<()> {
    let attr = Attr::new(None)?;
    let pd = PrimitiveDesc::reorder(engine, from, to, &attr)?;
    let prim = Primitive::new(
        &pd,
        engine,
        vec![(sys::DNNL_ARG_FROM, *from), (sys::DNNL_ARG_TO, *to)],
    )?;
    Stream::with_thread_local(engine, |stream| {
        // SAFETY: the caller vouches for both buffers.
        unsafe { prim.execute(stream, &[src as *mut c_void, dst]) }?;
        stream.wait()
    })
}
