//! Batched matmul on runtime operands, for attention.
//!
//! Per pixel and head, Q.K^T and P.V, with optional strides so heads can be
//! read in place.

use std::ffi::c_void;

use crate::engine::{Engine, Stream};
use crate::error::{Error, Result};
use crate::matmul::{binary_arg, check_len, validate_post_ops};
use crate::memory::{row_major_strides, DataType, Element, MemoryDesc};
use crate::primitive::{Attr, PostOp, PostOps, Primitive, PrimitiveDesc};
use crate::sys;
use crate::threading::ThreadScope;

/// `dst[b..] (m x n, f32) = post_ops(src[b..] (m x k) . weights[b..] (k x n))`
/// for every index `b..` of the batch dims.
///
/// Strides are in elements, one per dim (batch dims first, then the two
/// matrix dims); `None` means dense row-major. For example Q.K^T over a
/// `[pixels, T, heads, d_head]` QKV buffer reads Q with dims
/// `[pixels, heads, T, d_head]` and strides `[T*3d, d_head, 3d, 1]`, and K^T
/// with dims `[pixels, heads, d_head, T]` and strides `[T*3d, d_head, 1, 3d]`.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchedMatMulSpec {
    /// Batch dims, e.g. `[pixels, heads]` (at most 10).
    pub batch: Vec<usize>,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub src_strides: Option<Vec<usize>>,
    pub weights_strides: Option<Vec<usize>>,
    pub dst_strides: Option<Vec<usize>>,
    /// Element type of src and weights; dst (and a `BinaryAdd` residual, dense row-major) are f32.
    pub data_type: DataType,
    pub post_ops: Vec<PostOp>,
    /// oneDNN threads per `execute` call. See `threading`.
    pub threads: usize,
}

/// A created batched matmul for one fixed shape. `Send + Sync`; execute from any thread.
pub struct BatchedMatMul {
    engine: Engine,
    spec: BatchedMatMulSpec,
    prim: Primitive,
    /// Elements each operand's strides reach: the minimum slice length.
    spans: [usize; 3],
}

impl BatchedMatMul {
    pub fn new(engine: &Engine, spec: BatchedMatMulSpec) -> Result<Self> {
        let Layouts {
            dims: [src_dims, wei_dims, dst_dims],
            strides: [src_st, wei_st, dst_st],
            spans,
        } = layouts(&spec)?;
        let src = MemoryDesc::strided(&src_dims, &src_st, spec.data_type)?;
        let weights = MemoryDesc::strided(&wei_dims, &wei_st, spec.data_type)?;
        let dst = MemoryDesc::strided(&dst_dims, &dst_st, DataType::F32)?;
        let residual_desc = MemoryDesc::row_major(&dst_dims, DataType::F32)?;
        let residual = spec
            .post_ops
            .contains(&PostOp::BinaryAdd)
            .then_some(residual_desc);

        let _threads = ThreadScope::new(spec.threads);
        let post_ops = PostOps::new(&spec.post_ops, &residual_desc)?;
        let attr = Attr::new(Some(&post_ops))?;
        let pd = PrimitiveDesc::matmul(engine, &src, &weights, None, &dst, &attr)?;
        let mut args = vec![
            (sys::DNNL_ARG_SRC, src),
            (sys::DNNL_ARG_WEIGHTS, weights),
            (sys::DNNL_ARG_DST, dst),
        ];
        if let Some(r) = residual {
            args.push((binary_arg(&spec.post_ops), r));
        }
        let prim = Primitive::new(&pd, engine, args)?;
        Ok(BatchedMatMul {
            engine: engine.clone(),
            spec,
            prim,
            spans,
        })
    }

    pub fn spec(&self) -> &BatchedMatMulSpec {
        &self.spec
    }

    /// The implementation oneDNN chose, e.g. "brg:avx2" or "ref:any" (slow: a sign the strides are unsupported).
    pub fn impl_name(&self) -> &str {
        &self.prim.impl_name
    }

    /// Runs the matmul on the caller's buffers in place. Each slice must be
    /// exactly as long as its strides reach (dense: the product of its dims).
    pub fn execute<T: Element>(
        &self,
        src: &[T],
        weights: &[T],
        dst: &mut [f32],
        residual: Option<&[f32]>,
    ) -> Result<()> {
        let _threads = ThreadScope::new(self.spec.threads);
        Stream::with_thread_local(&self.engine, |stream| {
            self.execute_on(stream, src, weights, dst, residual)
        })
    }

    /// As [`BatchedMatMul::execute`], on a stream the caller owns.
    pub fn execute_on<T: Element>(
        &self,
        stream: &Stream,
        src: &[T],
        weights: &[T],
        dst: &mut [f32],
        residual: Option<&[f32]>,
    ) -> Result<()> {
        if stream.engine().raw() != self.engine.raw() {
            return Err(Error::Invalid {
                what: "batched matmul stream",
                why: "the stream belongs to another engine than the primitive".into(),
            });
        }
        check_buffers(
            &self.spec,
            self.spans,
            T::DATA_TYPE,
            (src.len(), weights.len(), dst.len()),
            residual,
        )?;
        let _threads = ThreadScope::new(self.spec.threads);
        let mut buffers = vec![
            src.as_ptr() as *mut c_void,
            weights.as_ptr() as *mut c_void,
            dst.as_mut_ptr().cast(),
        ];
        if let Some(r) = residual {
            buffers.push(r.as_ptr() as *mut c_void);
        }
        // SAFETY: each slice reaches at least as far as its descriptor's strides
        // (checked above) and outlives the call; src, weights and residual are
        // only read, dst is exclusively borrowed.
        unsafe { self.prim.execute(stream, &buffers) }
    }
}

/// Each operand's dims and element strides (src, weights, dst) and the
/// elements they reach, from a validated spec: the same for oneDNN 2.x and 3.x.
pub(crate) struct Layouts {
    pub dims: [Vec<usize>; 3],
    pub strides: [Vec<usize>; 3],
    pub spans: [usize; 3],
}

pub(crate) fn layouts(spec: &BatchedMatMulSpec) -> Result<Layouts> {
    validate_post_ops(&spec.post_ops)?;
    let all_positive = spec
        .batch
        .iter()
        .chain([&spec.m, &spec.k, &spec.n, &spec.threads])
        .all(|&d| d > 0);
    if !all_positive || spec.batch.len() + 2 > sys::DNNL_MAX_NDIMS {
        return Err(Error::Invalid {
            what: "batched matmul spec",
            why: format!(
                "batch {:?}, m {}, k {}, n {}, threads {}",
                spec.batch, spec.m, spec.k, spec.n, spec.threads
            ),
        });
    }
    let dims = |r: usize, c: usize| spec.batch.iter().copied().chain([r, c]).collect::<Vec<_>>();
    let dims = [
        dims(spec.m, spec.k),
        dims(spec.k, spec.n),
        dims(spec.m, spec.n),
    ];
    let given = [&spec.src_strides, &spec.weights_strides, &spec.dst_strides];
    let mut strides: [Vec<usize>; 3] = Default::default();
    for ((st, given), dims) in strides.iter_mut().zip(given).zip(&dims) {
        *st = given.clone().unwrap_or_else(|| row_major_strides(dims));
        if st.len() != dims.len() {
            return Err(Error::Invalid {
                what: "batched matmul strides",
                why: format!("{} strides for {} dims", st.len(), dims.len()),
            });
        }
    }
    let spans = [0, 1, 2].map(|i| span(&dims[i], &strides[i]));
    Ok(Layouts {
        dims,
        strides,
        spans,
    })
}

/// Checks an execute's buffers: the element type, each slice reaching as
/// far as its strides do (longer is fine: Q read in place out of a QKV
/// buffer), and a residual exactly when the post-ops take one.
pub(crate) fn check_buffers(
    spec: &BatchedMatMulSpec,
    spans: [usize; 3],
    data_type: DataType,
    (src, weights, dst): (usize, usize, usize),
    residual: Option<&[f32]>,
) -> Result<()> {
    if data_type != spec.data_type {
        return Err(Error::DataType {
            what: "batched matmul src/weights",
            expected: spec.data_type,
            got: data_type,
        });
    }
    check_at_least("batched matmul src", spans[0], src)?;
    check_at_least("batched matmul weights", spans[1], weights)?;
    check_at_least("batched matmul dst", spans[2], dst)?;
    // The residual is dense f32 of dst's dims, whatever dst's strides.
    let residual_len = spec
        .post_ops
        .contains(&PostOp::BinaryAdd)
        .then(|| spec.batch.iter().product::<usize>() * spec.m * spec.n);
    match (residual_len, residual) {
        (Some(n), Some(r)) => check_len("batched matmul residual", n, r.len()),
        (None, None) => Ok(()),
        _ => Err(Error::Invalid {
            what: "batched matmul residual",
            why: format!(
                "a residual must be given exactly when the post-ops include BinaryAdd ({:?})",
                spec.post_ops
            ),
        }),
    }
}

/// 1 + the largest element offset the strides reach.
fn span(dims: &[usize], strides: &[usize]) -> usize {
    1 + dims
        .iter()
        .zip(strides)
        .map(|(&d, &s)| (d - 1) * s)
        .sum::<usize>()
}

fn check_at_least(what: &'static str, needed: usize, got: usize) -> Result<()> {
    if got >= needed {
        Ok(())
    } else {
        Err(Error::Length {
            what,
            expected: needed,
            got,
        })
    }
}
