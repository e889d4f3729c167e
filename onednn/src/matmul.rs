//! Linear layers as oneDNN matmuls (`MatMul`).
//!
//! Weights are packed once into the layout oneDNN picks, primitives are
//! cached per M, and they execute on caller buffers.
//!
//! Why a cache keyed by M rather than `DNNL_RUNTIME_DIM_VAL`: in oneDNN 2.x the
//! brgemm matmul (the implementation that uses blocked, pre-packed weights on
//! AVX-512 and AMX) refuses runtime dims (`brgemm_matmul_t::pd_t::init`
//! requires `!has_runtime_dims_or_strides()`), and it also sizes its blocking
//! by M at creation. A runtime M would therefore fall back to the sgemm-based
//! `gemm:jit`, which repacks the weights inside every call. The encoder uses
//! few distinct M values (pixels per block x a multiple-of-8 sequence length),
//! so one primitive per M is cheap: creating one for a new M took 0.15-0.2 ms
//! for a 640 x 2560 layer with residual and ReLU post-ops (gemm:jit, AVX2, this
//! dev box), against ~0.2 us for a cached one; it happens on the first call
//! with that M, or in [`MatMul::prepare`].
//!
//! On AVX2-only CPUs oneDNN 2.6 has no brgemm matmul: it picks `gemm:jit` for
//! any M and resolves `any` weights to plain k x n, so "packing" there is a
//! one-time transpose of PyTorch's n x k and the kernel still packs B per call.
//!
//! If a new M makes oneDNN choose a different weights layout, the weights are
//! reordered once more into it and that packed copy is shared by every M that
//! chose the same layout.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, RwLock};

use crate::engine::{Engine, Stream};
use crate::error::{Error, Result};
use crate::memory::{AlignedBuf, DataType, Element, MemoryDesc};
use crate::primitive::{reorder, Attr, PostOp, PostOps, Primitive, PrimitiveDesc};
use crate::sys;
use crate::threading::ThreadScope;

/// What a [`MatMul`] computes: `dst (M x n) = post_ops(src (M x k) . W^T + bias)`.
#[derive(Debug, Clone, PartialEq)]
pub struct MatMulSpec {
    /// Input features (columns of src; the `in` of PyTorch's `out x in` weight).
    pub k: usize,
    /// Output features (columns of dst; the `out` of the weight).
    pub n: usize,
    /// Element type of src and of the packed weights. The bias is always f32.
    pub data_type: DataType,
    /// Element type of dst: f32, or bf16 where the result only feeds
    /// another bf16 matmul (oneDNN rounds the f32 result, post-ops
    /// applied, to nearest even as it stores it: the bits a separate
    /// conversion gives, without writing and re-reading the f32). A
    /// `BinaryAdd` residual is f32 either way.
    pub dst_type: DataType,
    pub post_ops: Vec<PostOp>,
    /// oneDNN threads per `execute` call (1 for thread-per-block callers). See `threading`.
    pub threads: usize,
}

struct Packed {
    desc: MemoryDesc,
    buf: AlignedBuf,
}

/// One created primitive for one M, and the packed weights it reads.
struct Instance {
    prim: Primitive,
    weights: Arc<Packed>,
}

/// A linear layer on oneDNN: created once, executed many times, from any number of threads at once.
pub struct MatMul {
    engine: Engine,
    spec: MatMulSpec,
    bias: Option<Vec<f32>>,
    /// Distinct packed weight layouts; `[0]` is the one made at construction.
    packed: RwLock<Vec<Arc<Packed>>>,
    /// Primitives by M. Read-locked on every execute, write-locked only to add an M.
    instances: RwLock<HashMap<usize, Arc<Instance>>>,
}

impl MatMul {
    /// Packs `weight` (PyTorch layout: `n x k`, row-major, f32) into the layout
    /// oneDNN picks for `m_hint` rows on this CPU, converting to
    /// `spec.data_type`. `bias` has `n` elements.
    pub fn new(
        engine: &Engine,
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
        let matmul = MatMul {
            engine: engine.clone(),
            bias: bias.map(<[f32]>::to_vec),
            packed: RwLock::new(Vec::new()),
            instances: RwLock::new(HashMap::new()),
            spec,
        };
        let _threads = ThreadScope::new(matmul.spec.threads);
        let pd = matmul.primitive_desc(m_hint.max(1))?;
        let chosen = chosen_weights(&pd)?;
        // PyTorch's out x in row-major is the k x n matrix with layout `ba`.
        let user = MemoryDesc::strided(
            &[matmul.spec.k, matmul.spec.n],
            &[1, matmul.spec.k],
            DataType::F32,
        )?;
        let mut buf = AlignedBuf::zeroed(chosen.size_bytes());
        // SAFETY: `weight` holds k*n f32 (checked), `buf` holds chosen.size_bytes().
        unsafe {
            reorder(
                &matmul.engine,
                &user,
                weight.as_ptr().cast(),
                &chosen,
                buf.as_mut_ptr(),
            )
        }?;
        matmul
            .packed
            .write()
            .expect("packed-weights lock is never held across a panic")
            .push(Arc::new(Packed { desc: chosen, buf }));
        matmul.insert_instance(m_hint.max(1), &pd)?;
        Ok(matmul)
    }

    pub fn spec(&self) -> &MatMulSpec {
        &self.spec
    }

    /// Creates the primitive for `m` rows now (instead of on the first `execute`)
    /// and returns the implementation oneDNN chose for it, e.g. "brg:avx512_core_amx".
    pub fn prepare(&self, m: usize) -> Result<String> {
        Ok(self.instance(m)?.prim.impl_name.clone())
    }

    /// The layout the weights were packed into at construction (Debug-print it to see the blocking).
    pub fn weights_layout(&self) -> MemoryDesc {
        self.packed
            .read()
            .expect("packed-weights lock is never held across a panic")[0]
            .desc
    }

    /// How many differently packed copies of the weights exist (1 unless some M chose another layout).
    pub fn packed_layouts(&self) -> usize {
        self.packed
            .read()
            .expect("packed-weights lock is never held across a panic")
            .len()
    }

    /// `dst = post_ops(src . W^T + bias)`, with M = `src.len() / k`; dst's
    /// element type is the spec's `dst_type`.
    ///
    /// `residual` (M x n, f32) is required exactly when the post-ops include
    /// `BinaryAdd`. With `Sum`, dst's current contents are added. No buffer is
    /// copied: oneDNN reads and writes the slices in place. Safe to call from
    /// many threads at once; each uses its own stream and scratchpad.
    pub fn execute<T: Element, D: Element>(
        &self,
        src: &[T],
        dst: &mut [D],
        residual: Option<&[f32]>,
    ) -> Result<()> {
        let _threads = ThreadScope::new(self.spec.threads);
        Stream::with_thread_local(&self.engine, |stream| {
            self.execute_on(stream, src, dst, residual)
        })
    }

    /// As [`MatMul::execute`], on a stream the caller owns.
    pub fn execute_on<T: Element, D: Element>(
        &self,
        stream: &Stream,
        src: &[T],
        dst: &mut [D],
        residual: Option<&[f32]>,
    ) -> Result<()> {
        if stream.engine().raw() != self.engine.raw() {
            return Err(Error::Invalid {
                what: "matmul stream",
                why: "the stream belongs to another engine than the primitive".into(),
            });
        }
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
        // Same order as the argument list built in `insert_instance`.
        let mut buffers = vec![
            src.as_ptr() as *mut c_void,
            inst.weights.buf.as_ptr() as *mut c_void,
            dst.as_mut_ptr().cast(),
        ];
        if let Some(b) = &self.bias {
            buffers.push(b.as_ptr() as *mut c_void);
        }
        if let Some(r) = residual {
            buffers.push(r.as_ptr() as *mut c_void);
        }
        // SAFETY: src, dst and residual were length-checked against M above and
        // the weights and bias buffers belong to `self`/`inst`; all outlive the
        // call. oneDNN only writes dst, which is exclusively borrowed.
        unsafe { inst.prim.execute(stream, &buffers) }
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

    fn primitive_desc(&self, m: usize) -> Result<PrimitiveDesc> {
        let s = &self.spec;
        let src = MemoryDesc::row_major(&[m, s.k], s.data_type)?;
        let weights = MemoryDesc::any(&[s.k, s.n], s.data_type)?;
        let bias = self
            .bias
            .as_ref()
            .map(|_| MemoryDesc::row_major(&[1, s.n], DataType::F32))
            .transpose()?;
        let dst = MemoryDesc::row_major(&[m, s.n], s.dst_type)?;
        let residual = MemoryDesc::row_major(&[m, s.n], DataType::F32)?;
        let post_ops = PostOps::new(&s.post_ops, &residual)?;
        let attr = Attr::new(Some(&post_ops))?;
        PrimitiveDesc::matmul(&self.engine, &src, &weights, bias.as_ref(), &dst, &attr)
    }

    /// Creates the primitive for `pd` (made for `m` rows), packing the weights
    /// again only if it chose a layout no earlier M chose.
    fn insert_instance(&self, m: usize, pd: &PrimitiveDesc) -> Result<Arc<Instance>> {
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
                    unsafe {
                        reorder(
                            &self.engine,
                            &first.desc,
                            first.buf.as_ptr(),
                            &chosen,
                            buf.as_mut_ptr(),
                        )
                    }?;
                    let p = Arc::new(Packed { desc: chosen, buf });
                    packed.push(Arc::clone(&p));
                    p
                }
            }
        };
        let s = &self.spec;
        let dst = MemoryDesc::row_major(&[m, s.n], s.dst_type)?;
        let residual = MemoryDesc::row_major(&[m, s.n], DataType::F32)?;
        let mut args = vec![
            (
                sys::DNNL_ARG_SRC,
                MemoryDesc::row_major(&[m, s.k], s.data_type)?,
            ),
            (sys::DNNL_ARG_WEIGHTS, weights.desc),
            (sys::DNNL_ARG_DST, dst),
        ];
        if self.bias.is_some() {
            args.push((
                sys::DNNL_ARG_BIAS,
                MemoryDesc::row_major(&[1, s.n], DataType::F32)?,
            ));
        }
        if s.post_ops.contains(&PostOp::BinaryAdd) {
            args.push((binary_arg(&s.post_ops), residual));
        }
        let inst = Arc::new(Instance {
            prim: Primitive::new(pd, &self.engine, args)?,
            weights,
        });
        let mut instances = self
            .instances
            .write()
            .expect("instance lock is never held across a panic");
        // Another thread may have created the same M meanwhile; keep the first.
        Ok(Arc::clone(instances.entry(m).or_insert(inst)))
    }
}

/// Checks an `execute`'s buffers against `spec` (the source's and dst's
/// element types; the source's length, a whole number of rows; dst's
/// length; a residual exactly when a `BinaryAdd` post-op wants one, of
/// dst's length) and returns M.
pub(crate) fn check_execute(
    spec: &MatMulSpec,
    (src_type, dst_type): (DataType, DataType),
    src_len: usize,
    dst_len: usize,
    residual: Option<&[f32]>,
) -> Result<usize> {
    if src_type != spec.data_type {
        return Err(Error::DataType {
            what: "matmul src",
            expected: spec.data_type,
            got: src_type,
        });
    }
    if dst_type != spec.dst_type {
        return Err(Error::DataType {
            what: "matmul dst",
            expected: spec.dst_type,
            got: dst_type,
        });
    }
    if !src_len.is_multiple_of(spec.k) {
        return Err(Error::Invalid {
            what: "matmul src",
            why: format!(
                "{src_len} elements is not a whole number of rows of k = {}",
                spec.k
            ),
        });
    }
    let m = src_len / spec.k;
    check_len("matmul dst (M x n)", m * spec.n, dst_len)?;
    let wants_residual = spec.post_ops.contains(&PostOp::BinaryAdd);
    match residual {
        Some(r) if wants_residual => check_len("matmul residual (M x n)", m * spec.n, r.len())?,
        None if !wants_residual => {}
        _ => {
            return Err(Error::Invalid {
                what: "matmul residual",
                why: format!(
                    "a residual must be given exactly when the post-ops include BinaryAdd ({:?})",
                    spec.post_ops
                ),
            })
        }
    }
    Ok(m)
}

/// The weights layout oneDNN chose for `pd` (the packed layout the weights
/// are reordered into).
fn chosen_weights(pd: &PrimitiveDesc) -> Result<MemoryDesc> {
    pd.query_md(sys::dnnl_query_weights_md)
        .ok_or(Error::Invalid {
            what: "matmul",
            why: "oneDNN reported no weights descriptor".into(),
        })
}

/// The execute-argument index of the (single) binary post-op's second operand.
pub(crate) fn binary_arg(post_ops: &[PostOp]) -> i32 {
    let idx = post_ops
        .iter()
        .position(|op| *op == PostOp::BinaryAdd)
        .expect("binary_arg is only called when a BinaryAdd post-op exists");
    sys::dnnl_arg_attr_multiple_post_op(idx as i32) | sys::DNNL_ARG_SRC_1
}

pub(crate) fn validate_post_ops(post_ops: &[PostOp]) -> Result<()> {
    let count = |want: PostOp| post_ops.iter().filter(|op| **op == want).count();
    if count(PostOp::BinaryAdd) > 1 || count(PostOp::Sum) > 1 {
        return Err(Error::Invalid {
            what: "post-ops",
            why: format!("at most one BinaryAdd and one Sum are supported, got {post_ops:?}"),
        });
    }
    Ok(())
}

pub(crate) fn check_len(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::Length {
            what,
            expected,
            got,
        })
    }
}
