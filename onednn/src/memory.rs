//! Memory descriptors, element types and memory objects.
//!
//! Descriptors give shape, data type and layout; memory objects wrap caller
//! or crate-owned buffers.

use std::ffi::c_void;

use crate::bf16::Bf16;
use crate::error::{check, Error, Result};
use crate::sys;

/// Element types this crate moves through oneDNN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    F32,
    Bf16,
}

impl DataType {
    pub(crate) fn raw(self) -> sys::dnnl_data_type_t {
        match self {
            DataType::F32 => sys::dnnl_f32,
            DataType::Bf16 => sys::dnnl_bf16,
        }
    }

    pub fn size(self) -> usize {
        match self {
            DataType::F32 => 4,
            DataType::Bf16 => 2,
        }
    }
}

/// A Rust element type with a oneDNN data type: `f32` or [`Bf16`].
pub trait Element: Copy + Send + Sync + 'static {
    const DATA_TYPE: DataType;
}

impl Element for f32 {
    const DATA_TYPE: DataType = DataType::F32;
}

impl Element for Bf16 {
    const DATA_TYPE: DataType = DataType::Bf16;
}

/// A oneDNN memory descriptor: dims, data type and layout (plain, strided,
/// `any`, or whatever blocked layout a primitive chose).
#[derive(Clone, Copy)]
pub struct MemoryDesc(pub(crate) sys::dnnl_memory_desc_t);

impl MemoryDesc {
    /// Dense row-major (`ab`, `abc`, ...: last dim contiguous).
    pub fn row_major(dims: &[usize], data_type: DataType) -> Result<Self> {
        let strides = row_major_strides(dims);
        Self::strided(dims, &strides, data_type)
    }

    /// Explicit strides, in elements, one per dim.
    pub fn strided(dims: &[usize], strides: &[usize], data_type: DataType) -> Result<Self> {
        if dims.len() != strides.len() || dims.is_empty() || dims.len() > sys::DNNL_MAX_NDIMS {
            return Err(Error::Invalid {
                what: "memory descriptor",
                why: format!("dims {dims:?} and strides {strides:?}"),
            });
        }
        let d = to_dims(dims)?;
        let s = to_dims(strides)?;
        let mut md = sys::dnnl_memory_desc_t::zeroed();
        // SAFETY: out-pointer to a local; dims/strides arrays hold DNNL_MAX_NDIMS entries.
        check("dnnl_memory_desc_init_by_strides", unsafe {
            sys::dnnl_memory_desc_init_by_strides(
                &mut md,
                dims.len() as i32,
                d.as_ptr(),
                data_type.raw(),
                s.as_ptr(),
            )
        })?;
        Ok(MemoryDesc(md))
    }

    /// `format_tag::any`: let the primitive that receives this descriptor pick the layout.
    pub fn any(dims: &[usize], data_type: DataType) -> Result<Self> {
        Self::by_tag(dims, data_type, sys::dnnl_format_tag_any)
    }

    fn by_tag(dims: &[usize], data_type: DataType, tag: sys::dnnl_format_tag_t) -> Result<Self> {
        if dims.is_empty() || dims.len() > sys::DNNL_MAX_NDIMS {
            return Err(Error::Invalid {
                what: "memory descriptor",
                why: format!("dims {dims:?}"),
            });
        }
        let d = to_dims(dims)?;
        let mut md = sys::dnnl_memory_desc_t::zeroed();
        // SAFETY: out-pointer to a local; dims array holds DNNL_MAX_NDIMS entries.
        check("dnnl_memory_desc_init_by_tag", unsafe {
            sys::dnnl_memory_desc_init_by_tag(
                &mut md,
                dims.len() as i32,
                d.as_ptr(),
                data_type.raw(),
                tag,
            )
        })?;
        Ok(MemoryDesc(md))
    }

    /// The descriptor a primitive descriptor reports for `what` (e.g. its chosen weights layout).
    ///
    /// # Safety
    /// `pd` must be a live primitive descriptor.
    pub(crate) unsafe fn query(
        pd: sys::const_dnnl_primitive_desc_t,
        what: sys::dnnl_query_t,
    ) -> Option<Self> {
        let md = sys::dnnl_primitive_desc_query_md(pd, what, 0);
        (!md.is_null() && (*md).ndims > 0).then(|| MemoryDesc(*md))
    }

    pub fn dims(&self) -> Vec<usize> {
        self.0.dims[..self.0.ndims as usize]
            .iter()
            .map(|&d| d as usize)
            .collect()
    }

    pub fn data_type(&self) -> Option<DataType> {
        match self.0.data_type {
            sys::dnnl_f32 => Some(DataType::F32),
            sys::dnnl_bf16 => Some(DataType::Bf16),
            _ => None,
        }
    }

    /// Whether the layout is still `any` (not yet chosen by a primitive).
    pub fn is_any(&self) -> bool {
        self.0.format_kind == sys::dnnl_format_kind_any
    }

    /// Bytes a buffer in this layout needs (including any padding of blocked layouts).
    pub fn size_bytes(&self) -> usize {
        // SAFETY: pointer to an initialised descriptor.
        unsafe { sys::dnnl_memory_desc_get_size(&self.0) }
    }
}

impl PartialEq for MemoryDesc {
    fn eq(&self, other: &Self) -> bool {
        // SAFETY: pointers to initialised descriptors.
        unsafe { sys::dnnl_memory_desc_equal(&self.0, &other.0) != 0 }
    }
}

impl std::fmt::Debug for MemoryDesc {
    /// Dims, type and layout, e.g. `[640, 2560] F32 strides [2560, 1]` or
    /// `... strides [..] blocks [16a, 64b]` for a packed layout.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} {:?}", self.dims(), self.data_type())?;
        match self.0.format_kind {
            sys::dnnl_format_kind_any => write!(f, " any"),
            sys::dnnl_blocked => {
                let b = &self.0.format_desc;
                let n = self.0.ndims as usize;
                write!(f, " strides {:?}", &b.strides[..n])?;
                let nblks = (b.inner_nblks.max(0) as usize).min(sys::DNNL_MAX_NDIMS);
                if nblks > 0 {
                    let blocks: Vec<String> = (0..nblks)
                        .map(|i| {
                            format!(
                                "{}{}",
                                b.inner_blks[i],
                                (b'a' + b.inner_idxs[i] as u8) as char
                            )
                        })
                        .collect();
                    write!(f, " blocks [{}]", blocks.join(", "))?;
                }
                Ok(())
            }
            other => write!(f, " format_kind {other}"),
        }
    }
}

pub(crate) fn row_major_strides(dims: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    strides
}

fn to_dims(values: &[usize]) -> Result<sys::dnnl_dims_t> {
    let mut out = [0i64; sys::DNNL_MAX_NDIMS];
    for (o, &v) in out.iter_mut().zip(values) {
        *o = i64::try_from(v).map_err(|_| Error::Invalid {
            what: "dimension",
            why: format!("{v} does not fit in i64"),
        })?;
    }
    Ok(out)
}

/// A 64-byte-aligned, zero-initialised byte buffer (packed weights, scratchpads).
pub(crate) struct AlignedBuf {
    chunks: Vec<Chunk>,
    len: usize,
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Chunk([u8; 64]);

impl AlignedBuf {
    pub(crate) fn zeroed(len: usize) -> Self {
        AlignedBuf {
            chunks: vec![Chunk([0; 64]); len.div_ceil(64)],
            len,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn as_ptr(&self) -> *const c_void {
        self.chunks.as_ptr().cast()
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut c_void {
        self.chunks.as_mut_ptr().cast()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_descriptor_matches_explicit_strides() {
        let a = MemoryDesc::row_major(&[4, 3, 2], DataType::F32).unwrap();
        let b = MemoryDesc::strided(&[4, 3, 2], &[6, 2, 1], DataType::F32).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.size_bytes(), 4 * 3 * 2 * 4);
        assert_eq!(a.dims(), vec![4, 3, 2]);
        assert_eq!(a.data_type(), Some(DataType::F32));
        assert!(!a.is_any());
        assert_eq!(format!("{a:?}"), "[4, 3, 2] Some(F32) strides [6, 2, 1]");
    }

    #[test]
    fn transposed_and_any_descriptors() {
        let t = MemoryDesc::strided(&[3, 5], &[1, 3], DataType::Bf16).unwrap();
        assert_ne!(t, MemoryDesc::row_major(&[3, 5], DataType::Bf16).unwrap());
        assert_eq!(t.size_bytes(), 3 * 5 * 2);
        let any = MemoryDesc::any(&[3, 5], DataType::F32).unwrap();
        assert!(any.is_any());
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(MemoryDesc::strided(&[2, 2], &[1], DataType::F32).is_err());
        assert!(MemoryDesc::row_major(&[], DataType::F32).is_err());
        assert!(MemoryDesc::row_major(&[1; 13], DataType::F32).is_err());
    }

    #[test]
    fn aligned_buffer_is_aligned() {
        let b = AlignedBuf::zeroed(100);
        assert_eq!(b.as_ptr() as usize % 64, 0);
        assert_eq!(b.len(), 100);
    }
}
