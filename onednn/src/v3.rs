//! oneDNN 3.x, loaded at run time: [`MatMul3`], the matmul of [`MatMul`](crate::MatMul)
//! on a `libdnnl.so.3` where one is present.
//!
//! Why: Debian ships oneDNN 2.6, whose matmul does not use AMX unless told
//! to (`ONEDNN_MAX_CPU_ISA`), and then slowly (issue 16 measured 2.8 TFLOP/s
//! of bf16 on a 16-core Xeon with AMX). oneDNN 3.x dispatches to AMX by
//! default. The crate keeps linking 2.x at build time (what Debian has), and
//! this module opens a 3.x library at run time when there is one: the path
//! in `FLOTILLA_ONEDNN3` (a file; `0` or empty turns 3.x off), else
//! `libdnnl.so.3` wherever the dynamic loader finds it. PyPI's
//! `onednn-cpu-gomp` wheel (oneDNN 3.2, GNU OpenMP) has one that needs
//! nothing else (`scripts/test.sh` fetches it for the tests).
//!
//! The 3.x C API differs from 2.x's in what this crate uses: memory
//! descriptors are opaque handles (created, cloned and destroyed, not
//! structs filled in place), a matmul's primitive descriptor is created in
//! one call from them, eltwise post-ops lose their scale, and several enum
//! values moved (`dnnl_ba`, `dnnl_eltwise_relu`, the post-op argument base,
//! the ISA masks). So the declarations below are their own, taken from the
//! 3.x headers (`onednn-devel`), and only plain strided layouts and `any`
//! are asked for (no format tags, whose numbering 3.x changed).
//!
//! Both libraries live in one process (the 2.x one is linked), and they
//! export 182 symbols of the same names, C++ internals among them
//! (`dnnl::impl::glob_zero_md`, ...), so the 3.x library is opened with
//! `RTLD_DEEPBIND`: its references to its own symbols resolve inside it,
//! never to the 2.x copies. (Opened without it, 3.2 passed this crate's
//! tests too, apparently reaching its internals directly; nothing promises
//! that of every 3.x build.)
//!
//! Threading, scratchpads and primitives per M work as in `matmul.rs`: each
//! primitive runs with the spec's thread count (both libraries share
//! libgomp, so [`ThreadScope`] sets it for either), uses a user scratchpad
//! per thread, and one is created per distinct M.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::{Arc, OnceLock, RwLock};

use crate::batched::{check_buffers, layouts, Layouts};
use crate::error::{check, Error, Result};
use crate::matmul::{check_execute, check_len, validate_post_ops};
use crate::memory::{AlignedBuf, DataType, Element};
use crate::primitive::{with_scratchpad, PostOp};
use crate::threading::ThreadScope;
use crate::{BatchedMatMulSpec, MatMulSpec, Version};

type Status = c_int;
type Md = *mut c_void;
type Pd = *mut c_void;
type Prim = *mut c_void;
type Handle = *mut c_void;

// The 3.x values (oneapi/dnnl/dnnl_types.h of 3.x; checked against the
// headers of onednn-devel 2026.1, ABI-stable across 3.x).
const DNNL_F32: c_int = 3;
const DNNL_BF16: c_int = 2;
const DNNL_FORMAT_TAG_ANY: c_int = 1;
const DNNL_CPU: c_int = 1;
const DNNL_STREAM_DEFAULT_FLAGS: u32 = 1;
const DNNL_SCRATCHPAD_MODE_USER: c_int = 1;
const DNNL_ELTWISE_RELU: c_int = 0x20;
const DNNL_ELTWISE_LINEAR: c_int = 0x26;
const DNNL_BINARY_ADD: c_int = 0x1fff0;
const DNNL_QUERY_IMPL_INFO_STR: c_int = 8;
const DNNL_QUERY_WEIGHTS_MD: c_int = 131;
const DNNL_QUERY_SCRATCHPAD_MD: c_int = 136;
const DNNL_ARG_SRC: c_int = 1;
const DNNL_ARG_SRC_1: c_int = 2;
const DNNL_ARG_DST: c_int = 17;
const DNNL_ARG_WEIGHTS: c_int = 33;
const DNNL_ARG_BIAS: c_int = 41;
const DNNL_ARG_SCRATCHPAD: c_int = 80;
/// `DNNL_ARG_ATTR_MULTIPLE_POST_OP(idx)` is this times (idx + 1).
const DNNL_ARG_ATTR_MULTIPLE_POST_OP_BASE: c_int = 32768;
const ISA_AVX2: c_int = 0x7;
const ISA_AVX2_VNNI_2: c_int = 0x1f;
const ISA_AVX512_CORE: c_int = 0x27;
const ISA_AVX512_CORE_BF16: c_int = 0xe7;
const ISA_AVX512_CORE_AMX: c_int = 0xfef;
/// glibc's `RTLD_DEEPBIND` (bits/dlfcn.h).
const RTLD_DEEPBIND: c_int = 0x8;

#[repr(C)]
struct ExecArg {
    arg: c_int,
    memory: Handle,
}

#[repr(C)]
struct RawVersion {
    major: c_int,
    minor: c_int,
    patch: c_int,
    hash: *const c_char,
    cpu_runtime: u32,
    gpu_runtime: u32,
}

/// The 3.x entry points this module calls.
struct Fns {
    version: unsafe extern "C" fn() -> *const RawVersion,
    effective_isa: unsafe extern "C" fn() -> c_int,
    engine_create: unsafe extern "C" fn(*mut Handle, c_int, usize) -> Status,
    stream_create: unsafe extern "C" fn(*mut Handle, Handle, u32) -> Status,
    stream_wait: unsafe extern "C" fn(Handle) -> Status,
    stream_destroy: unsafe extern "C" fn(Handle) -> Status,
    md_create_with_strides:
        unsafe extern "C" fn(*mut Md, c_int, *const i64, c_int, *const i64) -> Status,
    md_create_with_tag: unsafe extern "C" fn(*mut Md, c_int, *const i64, c_int, c_int) -> Status,
    md_clone: unsafe extern "C" fn(*mut Md, Md) -> Status,
    md_destroy: unsafe extern "C" fn(Md) -> Status,
    md_get_size: unsafe extern "C" fn(Md) -> usize,
    md_equal: unsafe extern "C" fn(Md, Md) -> c_int,
    memory_create: unsafe extern "C" fn(*mut Handle, Md, Handle, *mut c_void) -> Status,
    memory_destroy: unsafe extern "C" fn(Handle) -> Status,
    attr_create: unsafe extern "C" fn(*mut Handle) -> Status,
    attr_destroy: unsafe extern "C" fn(Handle) -> Status,
    attr_set_scratchpad_mode: unsafe extern "C" fn(Handle, c_int) -> Status,
    attr_set_post_ops: unsafe extern "C" fn(Handle, Handle) -> Status,
    post_ops_create: unsafe extern "C" fn(*mut Handle) -> Status,
    post_ops_destroy: unsafe extern "C" fn(Handle) -> Status,
    post_ops_append_eltwise: unsafe extern "C" fn(Handle, c_int, f32, f32) -> Status,
    post_ops_append_binary: unsafe extern "C" fn(Handle, c_int, Md) -> Status,
    post_ops_append_sum: unsafe extern "C" fn(Handle, f32, i32, c_int) -> Status,
    matmul_pd_create: unsafe extern "C" fn(*mut Pd, Handle, Md, Md, Md, Md, Handle) -> Status,
    reorder_pd_create: unsafe extern "C" fn(*mut Pd, Md, Handle, Md, Handle, Handle) -> Status,
    pd_query: unsafe extern "C" fn(Pd, c_int, c_int, *mut c_void) -> Status,
    pd_query_md: unsafe extern "C" fn(Pd, c_int, c_int) -> Md,
    pd_destroy: unsafe extern "C" fn(Pd) -> Status,
    primitive_create: unsafe extern "C" fn(*mut Prim, Pd) -> Status,
    primitive_execute: unsafe extern "C" fn(Prim, Handle, c_int, *const ExecArg) -> Status,
    primitive_destroy: unsafe extern "C" fn(Prim) -> Status,
}

/// A loaded oneDNN 3.x and its CPU engine, for the whole process.
pub struct Runtime3 {
    f: Fns,
    engine: Handle,
    path: PathBuf,
    // Kept open for as long as the function pointers are used: the process.
    _lib: libloading::os::unix::Library,
}

// SAFETY: the engine is immutable after creation and documented as safe to
// share between threads; the function pointers are plain code addresses.
unsafe impl Send for Runtime3 {}
unsafe impl Sync for Runtime3 {}

static RUNTIME: OnceLock<std::result::Result<Runtime3, String>> = OnceLock::new();

/// The oneDNN 3.x of this process, loaded on first use, or `None` (see
/// [`unavailable_reason`]).
pub fn runtime() -> Option<&'static Runtime3> {
    RUNTIME.get_or_init(load).as_ref().ok()
}

/// Why no oneDNN 3.x is in use (`None` when one is).
pub fn unavailable_reason() -> Option<String> {
    RUNTIME.get_or_init(load).as_ref().err().cloned()
}

fn load() -> std::result::Result<Runtime3, String> {
    let wanted = std::env::var_os("FLOTILLA_ONEDNN3");
    let path = match &wanted {
        Some(p) if p.is_empty() || p == "0" => {
            return Err("turned off (FLOTILLA_ONEDNN3=0)".into());
        }
        Some(p) => PathBuf::from(p),
        None => PathBuf::from("libdnnl.so.3"),
    };
    let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL | RTLD_DEEPBIND;
    // SAFETY: loading a shared library runs its initialisers; oneDNN's only
    // set up its own globals. DEEPBIND keeps its symbols apart from the
    // linked 2.x's (see the module documentation).
    let lib = unsafe { libloading::os::unix::Library::open(Some(&path), flags) }.map_err(|e| {
        if wanted.is_some() {
            format!("FLOTILLA_ONEDNN3={}: {e}", path.display())
        } else {
            format!("no libdnnl.so.3 found ({e}); set FLOTILLA_ONEDNN3 to one")
        }
    })?;
    let f = bind(&lib).map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: a plain call returning a pointer to a static struct.
    let v = unsafe { &*(f.version)() };
    if v.major != 3 {
        return Err(format!(
            "{} is oneDNN {}.{}, not 3.x",
            path.display(),
            v.major,
            v.minor
        ));
    }
    let mut engine = ptr::null_mut();
    // SAFETY: out-pointer to a local; index 0 is the only CPU engine.
    let status = unsafe { (f.engine_create)(&mut engine, DNNL_CPU, 0) };
    if status != 0 {
        return Err(format!(
            "{}: dnnl_engine_create failed (status {status})",
            path.display()
        ));
    }
    Ok(Runtime3 {
        f,
        engine,
        path,
        _lib: lib,
    })
}

/// Every entry point, or the first missing one.
fn bind(lib: &libloading::os::unix::Library) -> std::result::Result<Fns, libloading::Error> {
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: each symbol has the C signature of its field, from the
            // 3.x headers; the library outlives the copies (Runtime3 owns it).
            unsafe { *lib.get(concat!($name, "\0").as_bytes())? }
        };
    }
    Ok(Fns {
        version: sym!("dnnl_version"),
        effective_isa: sym!("dnnl_get_effective_cpu_isa"),
        engine_create: sym!("dnnl_engine_create"),
        stream_create: sym!("dnnl_stream_create"),
        stream_wait: sym!("dnnl_stream_wait"),
        stream_destroy: sym!("dnnl_stream_destroy"),
        md_create_with_strides: sym!("dnnl_memory_desc_create_with_strides"),
        md_create_with_tag: sym!("dnnl_memory_desc_create_with_tag"),
        md_clone: sym!("dnnl_memory_desc_clone"),
        md_destroy: sym!("dnnl_memory_desc_destroy"),
        md_get_size: sym!("dnnl_memory_desc_get_size"),
        md_equal: sym!("dnnl_memory_desc_equal"),
        memory_create: sym!("dnnl_memory_create"),
        memory_destroy: sym!("dnnl_memory_destroy"),
        attr_create: sym!("dnnl_primitive_attr_create"),
        attr_destroy: sym!("dnnl_primitive_attr_destroy"),
        attr_set_scratchpad_mode: sym!("dnnl_primitive_attr_set_scratchpad_mode"),
        attr_set_post_ops: sym!("dnnl_primitive_attr_set_post_ops"),
        post_ops_create: sym!("dnnl_post_ops_create"),
        post_ops_destroy: sym!("dnnl_post_ops_destroy"),
        post_ops_append_eltwise: sym!("dnnl_post_ops_append_eltwise"),
        post_ops_append_binary: sym!("dnnl_post_ops_append_binary"),
        post_ops_append_sum: sym!("dnnl_post_ops_append_sum"),
        matmul_pd_create: sym!("dnnl_matmul_primitive_desc_create"),
        reorder_pd_create: sym!("dnnl_reorder_primitive_desc_create"),
        pd_query: sym!("dnnl_primitive_desc_query"),
        pd_query_md: sym!("dnnl_primitive_desc_query_md"),
        pd_destroy: sym!("dnnl_primitive_desc_destroy"),
        primitive_create: sym!("dnnl_primitive_create"),
        primitive_execute: sym!("dnnl_primitive_execute"),
        primitive_destroy: sym!("dnnl_primitive_destroy"),
    })
}

impl Runtime3 {
    /// The file it was loaded from (as given to the loader).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> Version {
        // SAFETY: a pointer to a static struct inside the library.
        let v = unsafe { &*(self.f.version)() };
        Version {
            major: v.major,
            minor: v.minor,
            patch: v.patch,
            cpu_runtime: v.cpu_runtime,
        }
    }

    /// The widest ISA its kernels dispatch to here, by name.
    pub fn effective_isa(&self) -> &'static str {
        // SAFETY: a plain query.
        let isa = unsafe { (self.f.effective_isa)() };
        let has = |mask: c_int| isa & mask == mask;
        if has(ISA_AVX512_CORE_AMX) {
            "avx512_core_amx"
        } else if has(ISA_AVX512_CORE_BF16) {
            "avx512_core_bf16"
        } else if has(ISA_AVX512_CORE) {
            "avx512_core"
        } else if has(ISA_AVX2_VNNI_2) {
            "avx2_vnni_2"
        } else if has(ISA_AVX2) {
            "avx2"
        } else {
            "pre-avx2"
        }
    }

    /// Whether it runs bf16 matmuls natively here (AMX, AVX512-BF16 or
    /// AVX2-VNNI-2; oneDNN 3.x has no bf16 matmul below those).
    pub fn bf16_supported(&self) -> bool {
        matches!(
            self.effective_isa(),
            "avx512_core_amx" | "avx512_core_bf16" | "avx2_vnni_2"
        )
    }

    fn check(&self, call: &'static str, status: Status) -> Result<()> {
        check(call, status)
    }
}

/// An owned 3.x memory descriptor.
struct Desc {
    rt: &'static Runtime3,
    raw: Md,
}

// SAFETY: a memory descriptor is immutable once created; oneDNN only reads it.
unsafe impl Send for Desc {}
unsafe impl Sync for Desc {}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by this module, destroyed once.
        unsafe { (self.rt.f.md_destroy)(self.raw) };
    }
}

fn data_type(t: DataType) -> c_int {
    match t {
        DataType::F32 => DNNL_F32,
        DataType::Bf16 => DNNL_BF16,
    }
}

impl Desc {
    /// A 2-D matrix of `dims` with element strides `strides`.
    fn strided(
        rt: &'static Runtime3,
        dims: [usize; 2],
        strides: [usize; 2],
        t: DataType,
    ) -> Result<Self> {
        Self::strided_nd(rt, &dims, &strides, t)
    }

    /// A tensor of `dims` with element strides `strides` (as many).
    fn strided_nd(
        rt: &'static Runtime3,
        dims: &[usize],
        strides: &[usize],
        t: DataType,
    ) -> Result<Self> {
        if dims.len() != strides.len() {
            return Err(Error::Invalid {
                what: "memory descriptor",
                why: format!("{} strides for {} dims", strides.len(), dims.len()),
            });
        }
        let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let strides: Vec<i64> = strides.iter().map(|&s| s as i64).collect();
        let mut raw = ptr::null_mut();
        // SAFETY: out-pointer to a local; as many dims as strides.
        rt.check("dnnl_memory_desc_create_with_strides", unsafe {
            (rt.f.md_create_with_strides)(
                &mut raw,
                dims.len() as c_int,
                dims.as_ptr(),
                data_type(t),
                strides.as_ptr(),
            )
        })?;
        Ok(Desc { rt, raw })
    }

    /// Row-major `rows x cols`.
    fn row_major(rt: &'static Runtime3, rows: usize, cols: usize, t: DataType) -> Result<Self> {
        Self::strided(rt, [rows, cols], [cols, 1], t)
    }

    /// `dims` in whatever layout the primitive picks.
    fn any(rt: &'static Runtime3, dims: [usize; 2], t: DataType) -> Result<Self> {
        let dims = dims.map(|d| d as i64);
        let mut raw = ptr::null_mut();
        // SAFETY: out-pointer to a local; two dims.
        rt.check("dnnl_memory_desc_create_with_tag", unsafe {
            (rt.f.md_create_with_tag)(
                &mut raw,
                2,
                dims.as_ptr(),
                data_type(t),
                DNNL_FORMAT_TAG_ANY,
            )
        })?;
        Ok(Desc { rt, raw })
    }

    /// An owned copy of a descriptor a primitive descriptor holds.
    fn clone_of(rt: &'static Runtime3, md: Md) -> Result<Self> {
        let mut raw = ptr::null_mut();
        // SAFETY: `md` is alive (its primitive descriptor is); out-pointer to a local.
        rt.check("dnnl_memory_desc_clone", unsafe {
            (rt.f.md_clone)(&mut raw, md)
        })?;
        Ok(Desc { rt, raw })
    }

    fn size_bytes(&self) -> usize {
        // SAFETY: a live descriptor.
        unsafe { (self.rt.f.md_get_size)(self.raw) }
    }
}

impl PartialEq for Desc {
    fn eq(&self, other: &Self) -> bool {
        // SAFETY: both alive.
        unsafe { (self.rt.f.md_equal)(self.raw, other.raw) != 0 }
    }
}

/// An owned 3.x primitive descriptor.
struct PrimDesc {
    rt: &'static Runtime3,
    raw: Pd,
}

impl Drop for PrimDesc {
    fn drop(&mut self) {
        // SAFETY: created by this module, destroyed once.
        unsafe { (self.rt.f.pd_destroy)(self.raw) };
    }
}

impl PrimDesc {
    /// A matmul's primitive descriptor for `[src, weights, dst]`, with an
    /// optional bias, under `attr`'s post-ops.
    fn matmul(
        rt: &'static Runtime3,
        [src, weights, dst]: [&Desc; 3],
        bias: Option<&Desc>,
        attr: &Attr,
    ) -> Result<Self> {
        let mut raw = ptr::null_mut();
        // SAFETY: live descriptors, engine and attribute; out-pointer to a local.
        rt.check("dnnl_matmul_primitive_desc_create", unsafe {
            (rt.f.matmul_pd_create)(
                &mut raw,
                rt.engine,
                src.raw,
                weights.raw,
                bias.map_or(ptr::null_mut(), |b| b.raw),
                dst.raw,
                attr.raw,
            )
        })?;
        Ok(PrimDesc { rt, raw })
    }

    /// The descriptor `what` refers to (`None` when the primitive has none, as
    /// a zero-size scratchpad).
    fn query_md(&self, what: c_int) -> Result<Option<Desc>> {
        // SAFETY: a live primitive descriptor; the result belongs to it.
        let md = unsafe { (self.rt.f.pd_query_md)(self.raw, what, 0) };
        if md.is_null() {
            return Ok(None);
        }
        let d = Desc::clone_of(self.rt, md)?;
        Ok((d.size_bytes() > 0).then_some(d))
    }

    fn impl_name(&self) -> String {
        let mut s: *const c_char = ptr::null();
        // SAFETY: the query writes a pointer to a string the pd owns.
        let status = unsafe {
            (self.rt.f.pd_query)(
                self.raw,
                DNNL_QUERY_IMPL_INFO_STR,
                0,
                (&mut s) as *mut _ as *mut c_void,
            )
        };
        if status != 0 || s.is_null() {
            return "unknown".into();
        }
        // SAFETY: a NUL-terminated string owned by the live pd.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}

/// A user-scratchpad attribute with `post_ops` (3.x), owned.
struct Attr {
    rt: &'static Runtime3,
    raw: Handle,
    post_ops: Handle,
}

impl Drop for Attr {
    fn drop(&mut self) {
        // SAFETY: created by this module, destroyed once; the attr copied
        // the post-ops when they were set.
        unsafe {
            (self.rt.f.attr_destroy)(self.raw);
            if !self.post_ops.is_null() {
                (self.rt.f.post_ops_destroy)(self.post_ops);
            }
        }
    }
}

impl Attr {
    fn new(rt: &'static Runtime3, post_ops: &[PostOp], dst: &Desc) -> Result<Self> {
        let mut attr = Attr {
            rt,
            raw: ptr::null_mut(),
            post_ops: ptr::null_mut(),
        };
        // SAFETY (all calls below): out-pointers to fields of `attr`, live handles.
        rt.check("dnnl_primitive_attr_create", unsafe {
            (rt.f.attr_create)(&mut attr.raw)
        })?;
        rt.check("dnnl_primitive_attr_set_scratchpad_mode", unsafe {
            (rt.f.attr_set_scratchpad_mode)(attr.raw, DNNL_SCRATCHPAD_MODE_USER)
        })?;
        if !post_ops.is_empty() {
            rt.check("dnnl_post_ops_create", unsafe {
                (rt.f.post_ops_create)(&mut attr.post_ops)
            })?;
            for op in post_ops {
                let status = match op {
                    PostOp::Relu => unsafe {
                        (rt.f.post_ops_append_eltwise)(attr.post_ops, DNNL_ELTWISE_RELU, 0.0, 0.0)
                    },
                    PostOp::Linear { alpha, beta } => unsafe {
                        (rt.f.post_ops_append_eltwise)(
                            attr.post_ops,
                            DNNL_ELTWISE_LINEAR,
                            *alpha,
                            *beta,
                        )
                    },
                    // The residual has dst's shape and layout, in f32.
                    PostOp::BinaryAdd => unsafe {
                        (rt.f.post_ops_append_binary)(attr.post_ops, DNNL_BINARY_ADD, dst.raw)
                    },
                    // Scale 1, no zero point, dst's own data type (undef = 0).
                    PostOp::Sum => unsafe { (rt.f.post_ops_append_sum)(attr.post_ops, 1.0, 0, 0) },
                };
                rt.check("dnnl_post_ops_append", status)?;
            }
            rt.check("dnnl_primitive_attr_set_post_ops", unsafe {
                (rt.f.attr_set_post_ops)(attr.raw, attr.post_ops)
            })?;
        }
        Ok(attr)
    }
}

/// A created 3.x primitive.
struct Primitive {
    rt: &'static Runtime3,
    raw: Prim,
    impl_name: String,
    scratchpad: Option<Desc>,
}

// SAFETY: a primitive is immutable after creation and oneDNN documents
// executing one from several threads at once (each with its own stream) as
// safe; the only shared mutable state, the library scratchpad, is off
// (`scratchpad_mode_user`, a per-thread scratchpad).
unsafe impl Send for Primitive {}
unsafe impl Sync for Primitive {}

impl Drop for Primitive {
    fn drop(&mut self) {
        // SAFETY: created by this module, destroyed once.
        unsafe { (self.rt.f.primitive_destroy)(self.raw) };
    }
}

impl Primitive {
    fn new(pd: &PrimDesc) -> Result<Self> {
        let rt = pd.rt;
        let mut raw = ptr::null_mut();
        // SAFETY: a live pd; out-pointer to a local.
        rt.check("dnnl_primitive_create", unsafe {
            (rt.f.primitive_create)(&mut raw, pd.raw)
        })?;
        Ok(Primitive {
            rt,
            raw,
            impl_name: pd.impl_name(),
            scratchpad: pd.query_md(DNNL_QUERY_SCRATCHPAD_MD)?,
        })
    }

    /// Run on this thread's stream with `args` (index, descriptor, buffer)
    /// and this thread's scratchpad.
    ///
    /// # Safety
    /// Each buffer holds at least its descriptor's size in bytes, stays
    /// valid for the call, and only destination buffers are written.
    unsafe fn execute(&self, args: &[(c_int, &Desc, *mut c_void)]) -> Result<()> {
        let rt = self.rt;
        let run = |scratch: Option<*mut c_void>| -> Result<()> {
            let mut mems: Vec<Memory> = Vec::with_capacity(args.len() + 1);
            let sp = self.scratchpad.as_ref().zip(scratch);
            for (i, (arg, desc, buf)) in args
                .iter()
                .map(|(a, d, b)| (*a, *d, *b))
                .chain(sp.map(|(d, b)| (DNNL_ARG_SCRATCHPAD, d, b)))
                .enumerate()
            {
                let _ = i;
                mems.push(Memory::new(rt, desc, buf, arg)?);
            }
            let exec: Vec<ExecArg> = mems
                .iter()
                .map(|m| ExecArg {
                    arg: m.arg,
                    memory: m.raw,
                })
                .collect();
            with_stream(rt, |stream| {
                // SAFETY: the memories wrap buffers the caller vouched for.
                rt.check("dnnl_primitive_execute", unsafe {
                    (rt.f.primitive_execute)(self.raw, stream, exec.len() as c_int, exec.as_ptr())
                })?;
                // SAFETY: this thread's stream.
                rt.check("dnnl_stream_wait", unsafe { (rt.f.stream_wait)(stream) })
            })
        };
        match &self.scratchpad {
            None => run(None),
            Some(d) => with_scratchpad(d.size_bytes(), |s| run(Some(s))),
        }
    }
}

/// A memory object around a caller's buffer, for one execution.
struct Memory {
    rt: &'static Runtime3,
    raw: Handle,
    arg: c_int,
}

impl Memory {
    fn new(rt: &'static Runtime3, desc: &Desc, buf: *mut c_void, arg: c_int) -> Result<Self> {
        let mut raw = ptr::null_mut();
        // SAFETY: a live descriptor and engine; the buffer is the caller's.
        rt.check("dnnl_memory_create", unsafe {
            (rt.f.memory_create)(&mut raw, desc.raw, rt.engine, buf)
        })?;
        Ok(Memory { rt, raw, arg })
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: created above, destroyed once; the buffer is not freed by it.
        unsafe { (self.rt.f.memory_destroy)(self.raw) };
    }
}

/// Runs `f` with this thread's 3.x stream, created on first use and kept
/// until the thread exits.
fn with_stream<R>(rt: &'static Runtime3, f: impl FnOnce(Handle) -> Result<R>) -> Result<R> {
    struct Stream(&'static Runtime3, Handle);
    impl Drop for Stream {
        fn drop(&mut self) {
            // SAFETY: created below, destroyed once, on its own thread.
            unsafe { (self.0.f.stream_destroy)(self.1) };
        }
    }
    thread_local! {
        static STREAM: std::cell::RefCell<Option<Stream>> = const { std::cell::RefCell::new(None) };
    }
    STREAM.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            let mut raw = ptr::null_mut();
            // SAFETY: out-pointer to a local; the engine lives for the process.
            rt.check("dnnl_stream_create", unsafe {
                (rt.f.stream_create)(&mut raw, rt.engine, DNNL_STREAM_DEFAULT_FLAGS)
            })?;
            *slot = Some(Stream(rt, raw));
        }
        let stream = slot.as_ref().map(|s| s.1).expect("set just above");
        drop(slot);
        f(stream)
    })
}

/// Copy `src` (laid out as `from`) into `dst` (laid out as `to`), converting
/// layout and data type.
///
/// # Safety
/// `src` holds `from.size_bytes()` bytes and `dst` `to.size_bytes()`.
unsafe fn reorder(from: &Desc, src: *const c_void, to: &Desc, dst: *mut c_void) -> Result<()> {
    let rt = from.rt;
    let mut raw = ptr::null_mut();
    // SAFETY: live descriptors and engine; no attributes.
    rt.check("dnnl_reorder_primitive_desc_create", unsafe {
        (rt.f.reorder_pd_create)(
            &mut raw,
            from.raw,
            rt.engine,
            to.raw,
            rt.engine,
            ptr::null_mut(),
        )
    })?;
    let pd = PrimDesc { rt, raw };
    let prim = Primitive::new(&pd)?;
    // SAFETY: as the caller promises; the reorder only writes `dst`.
    unsafe {
        prim.execute(&[
            (DNNL_ARG_SRC, from, src.cast_mut()),
            (DNNL_ARG_DST, to, dst),
        ])
    }
}

struct Packed {
    desc: Desc,
    buf: AlignedBuf,
}

struct Instance {
    prim: Primitive,
    weights: Arc<Packed>,
}

/// [`MatMul`](crate::MatMul) on oneDNN 3.x: the same spec, packing and
/// per-M primitives, the same `execute`.
pub struct MatMul3 {
    rt: &'static Runtime3,
    spec: MatMulSpec,
    bias: Option<Vec<f32>>,
    packed: RwLock<Vec<Arc<Packed>>>,
    instances: RwLock<HashMap<usize, Arc<Instance>>>,
}

impl MatMul3 {
    /// As [`MatMul::new`](crate::MatMul::new), on `rt`.
    pub fn new(
        rt: &'static Runtime3,
        spec: MatMulSpec,
        weight: &[f32],
        bias: Option<&[f32]>,
        m_hint: usize,
    ) -> Result<Self> {
        validate_post_ops(&spec.post_ops)?;
        if spec.k == 0 || spec.n == 0 || spec.threads == 0 {
            return Err(Error::Invalid {
                what: "matmul spec",
                why: format!(
                    "k = {}, n = {}, threads = {} must all be positive",
                    spec.k, spec.n, spec.threads
                ),
            });
        }
        check_len("weight (n x k)", spec.n * spec.k, weight.len())?;
        if let Some(b) = bias {
            check_len("bias", spec.n, b.len())?;
        }
        let mm = MatMul3 {
            rt,
            bias: bias.map(<[f32]>::to_vec),
            packed: RwLock::new(Vec::new()),
            instances: RwLock::new(HashMap::new()),
            spec,
        };
        let _threads = ThreadScope::new(mm.spec.threads);
        let pd = mm.primitive_desc(m_hint.max(1))?;
        let chosen = chosen_weights(&pd)?;
        // PyTorch's out x in row-major is the k x n matrix with strides (1, k).
        let user = Desc::strided(rt, [mm.spec.k, mm.spec.n], [1, mm.spec.k], DataType::F32)?;
        let mut buf = AlignedBuf::zeroed(chosen.size_bytes());
        // SAFETY: `weight` holds k*n f32 (checked), `buf` the chosen size.
        unsafe { reorder(&user, weight.as_ptr().cast(), &chosen, buf.as_mut_ptr()) }?;
        mm.packed
            .write()
            .expect("packed-weights lock is never held across a panic")
            .push(Arc::new(Packed { desc: chosen, buf }));
        mm.insert_instance(m_hint.max(1), &pd)?;
        Ok(mm)
    }

    pub fn spec(&self) -> &MatMulSpec {
        &self.spec
    }

    /// Creates the primitive for `m` rows now and returns the
    /// implementation oneDNN chose, e.g. "brg_matmul:avx512_core_amx".
    pub fn prepare(&self, m: usize) -> Result<String> {
        Ok(self.instance(m)?.prim.impl_name.clone())
    }

    /// As [`MatMul::execute`](crate::MatMul::execute).
    pub fn execute<T: Element, D: Element>(
        &self,
        src: &[T],
        dst: &mut [D],
        residual: Option<&[f32]>,
    ) -> Result<()> {
        let m = check_execute(
            &self.spec,
            (T::DATA_TYPE, D::DATA_TYPE),
            src.len(),
            dst.len(),
            residual,
        )?;
        if m == 0 {
            return Ok(());
        }
        let _threads = ThreadScope::new(self.spec.threads);
        let inst = self.instance(m)?;
        let s = &self.spec;
        let rt = self.rt;
        let src_md = Desc::row_major(rt, m, s.k, s.data_type)?;
        let dst_md = Desc::row_major(rt, m, s.n, s.dst_type)?;
        let residual_md = Desc::row_major(rt, m, s.n, DataType::F32)?;
        let bias_md = Desc::row_major(rt, 1, s.n, DataType::F32)?;
        let mut args: Vec<(c_int, &Desc, *mut c_void)> = vec![
            (DNNL_ARG_SRC, &src_md, src.as_ptr() as *mut c_void),
            (
                DNNL_ARG_WEIGHTS,
                &inst.weights.desc,
                inst.weights.buf.as_ptr() as *mut c_void,
            ),
            (DNNL_ARG_DST, &dst_md, dst.as_mut_ptr().cast()),
        ];
        if let Some(b) = &self.bias {
            args.push((DNNL_ARG_BIAS, &bias_md, b.as_ptr() as *mut c_void));
        }
        if let Some(r) = residual {
            args.push((
                binary_arg(&s.post_ops),
                &residual_md,
                r.as_ptr() as *mut c_void,
            ));
        }
        // SAFETY: src, dst and residual were length-checked against M, the
        // weights and bias belong to self/inst; oneDNN only writes dst.
        unsafe { inst.prim.execute(&args) }
    }

    fn instance(&self, m: usize) -> Result<Arc<Instance>> {
        if let Some(inst) = self
            .instances
            .read()
            .expect("instance lock is never held across a panic")
            .get(&m)
        {
            return Ok(Arc::clone(inst));
        }
        let _threads = ThreadScope::new(self.spec.threads);
        let pd = self.primitive_desc(m)?;
        self.insert_instance(m, &pd)
    }

    fn primitive_desc(&self, m: usize) -> Result<PrimDesc> {
        let (s, rt) = (&self.spec, self.rt);
        let src = Desc::row_major(rt, m, s.k, s.data_type)?;
        let weights = Desc::any(rt, [s.k, s.n], s.data_type)?;
        let bias = self
            .bias
            .as_ref()
            .map(|_| Desc::row_major(rt, 1, s.n, DataType::F32))
            .transpose()?;
        let dst = Desc::row_major(rt, m, s.n, s.dst_type)?;
        let residual = Desc::row_major(rt, m, s.n, DataType::F32)?;
        let attr = Attr::new(rt, &s.post_ops, &residual)?;
        PrimDesc::matmul(rt, [&src, &weights, &dst], bias.as_ref(), &attr)
    }

    fn insert_instance(&self, m: usize, pd: &PrimDesc) -> Result<Arc<Instance>> {
        let chosen = chosen_weights(pd)?;
        let weights = {
            let mut packed = self
                .packed
                .write()
                .expect("packed-weights lock is never held across a panic");
            match packed.iter().find(|p| p.desc == chosen) {
                Some(p) => Arc::clone(p),
                None => {
                    let first = packed
                        .first()
                        .expect("the constructor packs the first layout");
                    let mut buf = AlignedBuf::zeroed(chosen.size_bytes());
                    // SAFETY: both buffers are sized by their descriptors.
                    unsafe { reorder(&first.desc, first.buf.as_ptr(), &chosen, buf.as_mut_ptr()) }?;
                    let p = Arc::new(Packed { desc: chosen, buf });
                    packed.push(Arc::clone(&p));
                    p
                }
            }
        };
        let inst = Arc::new(Instance {
            prim: Primitive::new(pd)?,
            weights,
        });
        let mut instances = self
            .instances
            .write()
            .expect("instance lock is never held across a panic");
        Ok(Arc::clone(instances.entry(m).or_insert(inst)))
    }
}

fn chosen_weights(pd: &PrimDesc) -> Result<Desc> {
    pd.query_md(DNNL_QUERY_WEIGHTS_MD)?.ok_or(Error::Invalid {
        what: "matmul",
        why: "oneDNN reported no weights descriptor".into(),
    })
}

/// The execute-argument index of the (single) binary post-op's operand, in 3.x's numbering.
fn binary_arg(post_ops: &[PostOp]) -> c_int {
    let idx = post_ops
        .iter()
        .position(|op| *op == PostOp::BinaryAdd)
        .expect("binary_arg is only called when a BinaryAdd post-op exists");
    (DNNL_ARG_ATTR_MULTIPLE_POST_OP_BASE * (idx as c_int + 1)) | DNNL_ARG_SRC_1
}

/// [`BatchedMatMul`](crate::BatchedMatMul) on oneDNN 3.x: the same spec,
/// strides and checks, the same `execute` (attention's Q.K^T and P.V,
/// which 3.x runs on AMX where the CPU has it).
pub struct BatchedMatMul3 {
    spec: BatchedMatMulSpec,
    prim: Primitive,
    src: Desc,
    weights: Desc,
    dst: Desc,
    residual: Option<Desc>,
    spans: [usize; 3],
}

impl BatchedMatMul3 {
    pub fn new(rt: &'static Runtime3, spec: BatchedMatMulSpec) -> Result<Self> {
        let Layouts {
            dims,
            strides,
            spans,
        } = layouts(&spec)?;
        let src = Desc::strided_nd(rt, &dims[0], &strides[0], spec.data_type)?;
        let weights = Desc::strided_nd(rt, &dims[1], &strides[1], spec.data_type)?;
        let dst = Desc::strided_nd(rt, &dims[2], &strides[2], DataType::F32)?;
        let dense = crate::memory::row_major_strides(&dims[2]);
        let residual = Desc::strided_nd(rt, &dims[2], &dense, DataType::F32)?;
        let _threads = ThreadScope::new(spec.threads);
        let attr = Attr::new(rt, &spec.post_ops, &residual)?;
        let pd = PrimDesc::matmul(rt, [&src, &weights, &dst], None, &attr)?;
        let prim = Primitive::new(&pd)?;
        let residual = spec
            .post_ops
            .contains(&PostOp::BinaryAdd)
            .then_some(residual);
        Ok(BatchedMatMul3 {
            spec,
            prim,
            src,
            weights,
            dst,
            residual,
            spans,
        })
    }

    pub fn spec(&self) -> &BatchedMatMulSpec {
        &self.spec
    }

    /// The implementation oneDNN chose, e.g. "brg_matmul:avx512_core_amx".
    pub fn impl_name(&self) -> &str {
        &self.prim.impl_name
    }

    /// As [`BatchedMatMul::execute`](crate::BatchedMatMul::execute).
    pub fn execute<T: Element>(
        &self,
        src: &[T],
        weights: &[T],
        dst: &mut [f32],
        residual: Option<&[f32]>,
    ) -> Result<()> {
        check_buffers(
            &self.spec,
            self.spans,
            T::DATA_TYPE,
            (src.len(), weights.len(), dst.len()),
            residual,
        )?;
        let _threads = ThreadScope::new(self.spec.threads);
        let mut args: Vec<(c_int, &Desc, *mut c_void)> = vec![
            (DNNL_ARG_SRC, &self.src, src.as_ptr() as *mut c_void),
            (
                DNNL_ARG_WEIGHTS,
                &self.weights,
                weights.as_ptr() as *mut c_void,
            ),
            (DNNL_ARG_DST, &self.dst, dst.as_mut_ptr().cast()),
        ];
        if let (Some(d), Some(r)) = (&self.residual, residual) {
            args.push((
                binary_arg(&self.spec.post_ops),
                d,
                r.as_ptr() as *mut c_void,
            ));
        }
        // SAFETY: each slice reaches as far as its descriptor's strides
        // (checked above) and outlives the call; only dst is written.
        unsafe { self.prim.execute(&args) }
    }
}
