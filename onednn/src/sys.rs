//! Hand-written `extern "C"` declarations for the part of oneDNN 2.x this crate uses.
//!
//! From `dnnl.h` and `dnnl_types.h`.
//!
//! Every constant and struct layout here was checked against Debian bookworm's
//! libdnnl-dev 2.6.3 headers with a C program printing `sizeof`/`offsetof` and
//! the enum values (`dnnl_memory_desc_t` = 696 bytes, `dnnl_matmul_desc_t` =
//! 2800 bytes, both 8-aligned). oneDNN 3.x made memory descriptors opaque
//! handles, so these declarations are for 2.x only; `build.rs` refuses 3.x.
#![allow(non_camel_case_types, non_upper_case_globals, dead_code)]

use std::ffi::{c_char, c_int, c_void};

pub type dnnl_status_t = c_int;
pub type dnnl_data_type_t = c_int;
pub type dnnl_format_tag_t = c_int;
pub type dnnl_alg_kind_t = c_int;
pub type dnnl_query_t = c_int;
pub type dnnl_engine_kind_t = c_int;
pub type dnnl_scratchpad_mode_t = c_int;
pub type dnnl_cpu_isa_t = c_int;
pub type dnnl_dim_t = i64;

pub const DNNL_MAX_NDIMS: usize = 12;
pub type dnnl_dims_t = [dnnl_dim_t; DNNL_MAX_NDIMS];

// dnnl_status_t
pub const dnnl_success: dnnl_status_t = 0;
pub const dnnl_out_of_memory: dnnl_status_t = 1;
pub const dnnl_invalid_arguments: dnnl_status_t = 2;
pub const dnnl_unimplemented: dnnl_status_t = 3;
pub const dnnl_iterator_ends: dnnl_status_t = 4;
pub const dnnl_runtime_error: dnnl_status_t = 5;
pub const dnnl_not_required: dnnl_status_t = 6;

// dnnl_data_type_t
pub const dnnl_bf16: dnnl_data_type_t = 2;
pub const dnnl_f32: dnnl_data_type_t = 3;

// dnnl_format_kind_t (the `format_kind` field of a memory descriptor)
pub const dnnl_format_kind_undef: c_int = 0;
pub const dnnl_format_kind_any: c_int = 1;
pub const dnnl_blocked: c_int = 2;

// dnnl_format_tag_t
pub const dnnl_format_tag_undef: dnnl_format_tag_t = 0;
pub const dnnl_format_tag_any: dnnl_format_tag_t = 1;
pub const dnnl_ab: dnnl_format_tag_t = 3;
pub const dnnl_abc: dnnl_format_tag_t = 4;
pub const dnnl_ba: dnnl_format_tag_t = 22;

// dnnl_alg_kind_t
pub const dnnl_eltwise_relu: dnnl_alg_kind_t = 0x1f;
pub const dnnl_eltwise_linear: dnnl_alg_kind_t = 0x7f;
pub const dnnl_binary_add: dnnl_alg_kind_t = 0x1fff0;

// dnnl_query_t
pub const dnnl_query_impl_info_str: dnnl_query_t = 8;
pub const dnnl_query_src_md: dnnl_query_t = 129;
pub const dnnl_query_weights_md: dnnl_query_t = 131;
pub const dnnl_query_dst_md: dnnl_query_t = 133;
pub const dnnl_query_scratchpad_md: dnnl_query_t = 136;

pub const dnnl_cpu: dnnl_engine_kind_t = 1;
pub const dnnl_stream_default_flags: u32 = 1;

pub const dnnl_scratchpad_mode_library: dnnl_scratchpad_mode_t = 0;
pub const dnnl_scratchpad_mode_user: dnnl_scratchpad_mode_t = 1;

// dnnl_cpu_isa_t: bit masks, each ISA a superset of the bits of the ones it extends.
pub const dnnl_cpu_isa_avx2: dnnl_cpu_isa_t = 0x7;
pub const dnnl_cpu_isa_avx512_core: dnnl_cpu_isa_t = 0x27;
pub const dnnl_cpu_isa_avx512_core_bf16: dnnl_cpu_isa_t = 0xe7;
pub const dnnl_cpu_isa_avx512_core_amx: dnnl_cpu_isa_t = 0x3e7;

// DNNL_ARG_*
pub const DNNL_ARG_SRC: c_int = 1;
pub const DNNL_ARG_SRC_1: c_int = 2;
pub const DNNL_ARG_DST: c_int = 17;
pub const DNNL_ARG_WEIGHTS: c_int = 33;
pub const DNNL_ARG_BIAS: c_int = 41;
pub const DNNL_ARG_SCRATCHPAD: c_int = 80;
pub const DNNL_ARG_FROM: c_int = DNNL_ARG_SRC;
pub const DNNL_ARG_TO: c_int = DNNL_ARG_DST;
pub const DNNL_ARG_ATTR_MULTIPLE_POST_OP_BASE: c_int = 16384;

/// `DNNL_ARG_ATTR_MULTIPLE_POST_OP(idx)` from dnnl_types.h.
pub const fn dnnl_arg_attr_multiple_post_op(idx: c_int) -> c_int {
    DNNL_ARG_ATTR_MULTIPLE_POST_OP_BASE * (idx + 1)
}

/// `dnnl_blocking_desc_t`: strides of the outer blocks plus the inner blocks
/// (e.g. `inner_blks = [16, 64]`, `inner_idxs = [1, 0]` for a `BA16a64b`-style packing).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct dnnl_blocking_desc_t {
    pub strides: dnnl_dims_t,
    pub inner_nblks: c_int,
    pub inner_blks: dnnl_dims_t,
    pub inner_idxs: dnnl_dims_t,
}

/// `dnnl_memory_desc_t` of oneDNN 2.x: a plain struct, passed by pointer.
///
/// `format_desc` is a C union of the blocking, Winograd and RNN-packed
/// descriptors; the blocking one is the largest (296 bytes, as is the
/// RNN-packed one), so it stands for the whole union and is only meaningful
/// when `format_kind == dnnl_blocked`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct dnnl_memory_desc_t {
    pub ndims: c_int,
    pub dims: dnnl_dims_t,
    pub data_type: dnnl_data_type_t,
    pub padded_dims: dnnl_dims_t,
    pub padded_offsets: dnnl_dims_t,
    pub offset0: dnnl_dim_t,
    pub format_kind: c_int,
    pub format_desc: dnnl_blocking_desc_t,
    /// `dnnl_memory_extra_desc_t` (80 bytes): compensation flags, unused here.
    _extra: [u64; 10],
}

const _: () = assert!(std::mem::size_of::<dnnl_blocking_desc_t>() == 296);
const _: () = assert!(std::mem::size_of::<dnnl_memory_desc_t>() == 696);
const _: () = assert!(std::mem::align_of::<dnnl_memory_desc_t>() == 8);
const _: () = assert!(std::mem::offset_of!(dnnl_memory_desc_t, format_kind) == 312);
const _: () = assert!(std::mem::offset_of!(dnnl_memory_desc_t, format_desc) == 320);

impl dnnl_memory_desc_t {
    /// An all-zero descriptor: `format_kind_undef`, which as a bias descriptor means "no bias".
    pub const fn zeroed() -> Self {
        Self {
            ndims: 0,
            dims: [0; DNNL_MAX_NDIMS],
            data_type: 0,
            padded_dims: [0; DNNL_MAX_NDIMS],
            padded_offsets: [0; DNNL_MAX_NDIMS],
            offset0: 0,
            format_kind: 0,
            format_desc: dnnl_blocking_desc_t {
                strides: [0; DNNL_MAX_NDIMS],
                inner_nblks: 0,
                inner_blks: [0; DNNL_MAX_NDIMS],
                inner_idxs: [0; DNNL_MAX_NDIMS],
            },
            _extra: [0; 10],
        }
    }
}

/// `dnnl_matmul_desc_t`: only ever filled by `dnnl_matmul_desc_init` and passed back by pointer.
#[repr(C, align(8))]
pub struct dnnl_matmul_desc_t {
    _bytes: [u8; 2800],
}

impl dnnl_matmul_desc_t {
    pub const fn zeroed() -> Self {
        Self { _bytes: [0; 2800] }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dnnl_exec_arg_t {
    pub arg: c_int,
    pub memory: dnnl_memory_t,
}

#[repr(C)]
pub struct dnnl_version_t {
    pub major: c_int,
    pub minor: c_int,
    pub patch: c_int,
    pub hash: *const c_char,
    pub cpu_runtime: u32,
    pub gpu_runtime: u32,
}

#[repr(C)]
pub struct dnnl_engine {
    _private: [u8; 0],
}
#[repr(C)]
pub struct dnnl_stream {
    _private: [u8; 0],
}
#[repr(C)]
pub struct dnnl_memory {
    _private: [u8; 0],
}
#[repr(C)]
pub struct dnnl_primitive_desc {
    _private: [u8; 0],
}
#[repr(C)]
pub struct dnnl_primitive {
    _private: [u8; 0],
}
#[repr(C)]
pub struct dnnl_primitive_attr {
    _private: [u8; 0],
}
#[repr(C)]
pub struct dnnl_post_ops {
    _private: [u8; 0],
}

pub type dnnl_engine_t = *mut dnnl_engine;
pub type dnnl_stream_t = *mut dnnl_stream;
pub type dnnl_memory_t = *mut dnnl_memory;
pub type dnnl_primitive_desc_t = *mut dnnl_primitive_desc;
pub type const_dnnl_primitive_desc_t = *const dnnl_primitive_desc;
pub type dnnl_primitive_t = *mut dnnl_primitive;
pub type const_dnnl_primitive_t = *const dnnl_primitive;
pub type dnnl_primitive_attr_t = *mut dnnl_primitive_attr;
pub type const_dnnl_primitive_attr_t = *const dnnl_primitive_attr;
pub type dnnl_post_ops_t = *mut dnnl_post_ops;
pub type const_dnnl_post_ops_t = *const dnnl_post_ops;
/// `const_dnnl_op_desc_t` is `const void *` in 2.x.
pub type const_dnnl_op_desc_t = *const c_void;

// Linked by build.rs (`cargo:rustc-link-lib=dylib=dnnl`).
extern "C" {
    pub fn dnnl_version() -> *const dnnl_version_t;
    pub fn dnnl_get_effective_cpu_isa() -> dnnl_cpu_isa_t;

    pub fn dnnl_engine_create(
        engine: *mut dnnl_engine_t,
        kind: dnnl_engine_kind_t,
        index: usize,
    ) -> dnnl_status_t;
    pub fn dnnl_engine_destroy(engine: dnnl_engine_t) -> dnnl_status_t;

    pub fn dnnl_stream_create(
        stream: *mut dnnl_stream_t,
        engine: dnnl_engine_t,
        flags: u32,
    ) -> dnnl_status_t;
    pub fn dnnl_stream_wait(stream: dnnl_stream_t) -> dnnl_status_t;
    pub fn dnnl_stream_destroy(stream: dnnl_stream_t) -> dnnl_status_t;

    pub fn dnnl_memory_desc_init_by_tag(
        memory_desc: *mut dnnl_memory_desc_t,
        ndims: c_int,
        dims: *const dnnl_dim_t,
        data_type: dnnl_data_type_t,
        tag: dnnl_format_tag_t,
    ) -> dnnl_status_t;
    pub fn dnnl_memory_desc_init_by_strides(
        memory_desc: *mut dnnl_memory_desc_t,
        ndims: c_int,
        dims: *const dnnl_dim_t,
        data_type: dnnl_data_type_t,
        strides: *const dnnl_dim_t,
    ) -> dnnl_status_t;
    pub fn dnnl_memory_desc_equal(
        lhs: *const dnnl_memory_desc_t,
        rhs: *const dnnl_memory_desc_t,
    ) -> c_int;
    pub fn dnnl_memory_desc_get_size(memory_desc: *const dnnl_memory_desc_t) -> usize;

    pub fn dnnl_memory_create(
        memory: *mut dnnl_memory_t,
        memory_desc: *const dnnl_memory_desc_t,
        engine: dnnl_engine_t,
        handle: *mut c_void,
    ) -> dnnl_status_t;
    pub fn dnnl_memory_set_data_handle_v2(
        memory: dnnl_memory_t,
        handle: *mut c_void,
        stream: dnnl_stream_t,
    ) -> dnnl_status_t;
    pub fn dnnl_memory_destroy(memory: dnnl_memory_t) -> dnnl_status_t;

    pub fn dnnl_primitive_attr_create(attr: *mut dnnl_primitive_attr_t) -> dnnl_status_t;
    pub fn dnnl_primitive_attr_destroy(attr: dnnl_primitive_attr_t) -> dnnl_status_t;
    pub fn dnnl_primitive_attr_set_scratchpad_mode(
        attr: dnnl_primitive_attr_t,
        mode: dnnl_scratchpad_mode_t,
    ) -> dnnl_status_t;
    pub fn dnnl_primitive_attr_set_post_ops(
        attr: dnnl_primitive_attr_t,
        post_ops: const_dnnl_post_ops_t,
    ) -> dnnl_status_t;

    pub fn dnnl_post_ops_create(post_ops: *mut dnnl_post_ops_t) -> dnnl_status_t;
    pub fn dnnl_post_ops_destroy(post_ops: dnnl_post_ops_t) -> dnnl_status_t;
    pub fn dnnl_post_ops_append_sum(post_ops: dnnl_post_ops_t, scale: f32) -> dnnl_status_t;
    pub fn dnnl_post_ops_append_eltwise(
        post_ops: dnnl_post_ops_t,
        scale: f32,
        alg_kind: dnnl_alg_kind_t,
        alpha: f32,
        beta: f32,
    ) -> dnnl_status_t;
    pub fn dnnl_post_ops_append_binary(
        post_ops: dnnl_post_ops_t,
        alg_kind: dnnl_alg_kind_t,
        src1_desc: *const dnnl_memory_desc_t,
    ) -> dnnl_status_t;

    pub fn dnnl_matmul_desc_init(
        matmul_desc: *mut dnnl_matmul_desc_t,
        src_desc: *const dnnl_memory_desc_t,
        weights_desc: *const dnnl_memory_desc_t,
        bias_desc: *const dnnl_memory_desc_t,
        dst_desc: *const dnnl_memory_desc_t,
    ) -> dnnl_status_t;

    pub fn dnnl_primitive_desc_create(
        primitive_desc: *mut dnnl_primitive_desc_t,
        op_desc: const_dnnl_op_desc_t,
        attr: const_dnnl_primitive_attr_t,
        engine: dnnl_engine_t,
        hint_forward_primitive_desc: const_dnnl_primitive_desc_t,
    ) -> dnnl_status_t;
    pub fn dnnl_reorder_primitive_desc_create(
        reorder_primitive_desc: *mut dnnl_primitive_desc_t,
        src_desc: *const dnnl_memory_desc_t,
        src_engine: dnnl_engine_t,
        dst_desc: *const dnnl_memory_desc_t,
        dst_engine: dnnl_engine_t,
        attr: const_dnnl_primitive_attr_t,
    ) -> dnnl_status_t;
    pub fn dnnl_primitive_desc_destroy(primitive_desc: dnnl_primitive_desc_t) -> dnnl_status_t;
    pub fn dnnl_primitive_desc_query(
        primitive_desc: const_dnnl_primitive_desc_t,
        what: dnnl_query_t,
        index: c_int,
        result: *mut c_void,
    ) -> dnnl_status_t;
    pub fn dnnl_primitive_desc_query_md(
        primitive_desc: const_dnnl_primitive_desc_t,
        what: dnnl_query_t,
        index: c_int,
    ) -> *const dnnl_memory_desc_t;

    pub fn dnnl_primitive_create(
        primitive: *mut dnnl_primitive_t,
        primitive_desc: const_dnnl_primitive_desc_t,
    ) -> dnnl_status_t;
    pub fn dnnl_primitive_execute(
        primitive: const_dnnl_primitive_t,
        stream: dnnl_stream_t,
        nargs: c_int,
        args: *const dnnl_exec_arg_t,
    ) -> dnnl_status_t;
    pub fn dnnl_primitive_destroy(primitive: dnnl_primitive_t) -> dnnl_status_t;

    pub fn dnnl_sgemm(
        transa: c_char,
        transb: c_char,
        m: dnnl_dim_t,
        n: dnnl_dim_t,
        k: dnnl_dim_t,
        alpha: f32,
        a: *const f32,
        lda: dnnl_dim_t,
        b: *const f32,
        ldb: dnnl_dim_t,
        beta: f32,
        c: *mut f32,
        ldc: dnnl_dim_t,
    ) -> dnnl_status_t;
}

// The OpenMP runtime libdnnl was built against (Debian: libgomp). Only
// linked (by build.rs) when it found `DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP`.
#[cfg(dnnl_omp)]
extern "C" {
    pub fn omp_set_num_threads(n: c_int);
    pub fn omp_get_max_threads() -> c_int;
}
