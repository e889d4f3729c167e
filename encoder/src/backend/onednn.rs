//! The oneDNN backend: pre-packed matmuls with fused post-ops, thread per block.
//!
//! Each Linear is a `onednn::MatMul` whose weights are packed once at load
//! into the layout oneDNN picks for this chip, with ReLU and residual adds
//! fused as post-ops; scheduled one thread per block of pixels (`block.rs`),
//! each GEMM single-threaded.
//!
//! Layers and their post-ops: embedding.0 → ReLU; embedding.2 → + day-of-year
//! encoding (a `BinaryAdd`, the same add the cpu backend does after its GEMM);
//! self_attn.out_proj → + residual; linear1 → ReLU; linear2 → + residual;
//! in_proj and the head's Linears → none. Attention, LayerNorm, softmax and
//! pooling are the shared code in `block.rs` (attention on the `gemm` crate,
//! reading heads in place by strides).
//!
//! Primitives are cached per M inside each `MatMul` (M = block pixels × a
//! multiple-of-8 sequence length, so few distinct values); each is created on
//! the first block of that M, which the same bits follow whichever thread
//! runs it: every primitive runs with `threads: 1`, so oneDNN's reduction
//! order depends only on M, never on how many blocks run at once.
//!
//! dtype: `f32` always works. `bf16` (profile `dtype = "bf16"`) packs the
//! weights as bf16 and converts each block's input before the GEMM, but only
//! where [`bf16_supported`] (AMX or AVX512-BF16); elsewhere oneDNN has no
//! usable bf16 matmul, so the backend falls back to f32.
//!
//! Which oneDNN: a 3.x opened at run time where one is found
//! (`onednn::v3`: `FLOTILLA_ONEDNN3`, else `libdnnl.so.3` on the loader's
//! path), else the linked 2.x. 3.x uses AMX by default; Debian's 2.6 stops
//! at `avx512_core_bf16` unless `ONEDNN_MAX_CPU_ISA` says otherwise.

use std::cell::RefCell;
use std::sync::Arc;

use onednn::v3::{self, MatMul3};
use onednn::{Bf16, DataType, Element, Engine, MatMul, MatMulSpec, PostOp};

use super::block::{apply_epilogue, BlockBackend, Epilogue, Fused, LinearKernel};
use super::{Backend, SequenceBatch};
use crate::error::{EncodeError, Result};
use crate::model::{Linear, Modality, StudentWeights};
use crate::profile::{DeviceProfile, Dtype};

/// Sequence length the weights are first packed for (`m_hint`): the bins of
/// the published stores are mostly 32-128 observations. On AVX2 oneDNN picks
/// the same plain layout for every M; on AVX-512/AMX a different M that
/// picks another layout gets one more packed copy (see `onednn::matmul`).
const HINT_LEN: usize = 64;

/// A Linear's matmul on the linked oneDNN 2.x, or on a 3.x opened at run
/// time (`onednn::v3`, AMX by default where the CPU has it).
enum Mm {
    V2(MatMul),
    V3(MatMul3),
}

impl Mm {
    fn spec(&self) -> &MatMulSpec {
        match self {
            Mm::V2(m) => m.spec(),
            Mm::V3(m) => m.spec(),
        }
    }

    fn execute<T: Element>(
        &self,
        src: &[T],
        dst: &mut [f32],
        residual: Option<&[f32]>,
    ) -> onednn::Result<()> {
        match self {
            Mm::V2(m) => m.execute(src, dst, residual),
            Mm::V3(m) => m.execute(src, dst, residual),
        }
    }

    #[cfg(test)]
    fn prepare(&self, m: usize) -> onednn::Result<String> {
        match self {
            Mm::V2(mm) => mm.prepare(m),
            Mm::V3(mm) => mm.prepare(m),
        }
    }
}

/// Whether the oneDNN in use here runs bf16 natively: the 3.x one if
/// loaded, else the linked 2.x.
pub fn bf16_supported() -> bool {
    match v3::runtime() {
        Some(rt) => rt.bf16_supported(),
        None => onednn::bf16_supported(),
    }
}

/// Which oneDNN the backend computes with and the ISA it dispatches to, for
/// `tessera-encode backends` and the agent's registration.
pub fn describe() -> String {
    match v3::runtime() {
        Some(rt) => {
            let v = rt.version();
            format!(
                "oneDNN {}.{}.{} ({}), ISA {}",
                v.major,
                v.minor,
                v.patch,
                rt.path().display(),
                rt.effective_isa()
            )
        }
        None => {
            let v = onednn::version();
            format!(
                "oneDNN {}.{}.{}, ISA {}",
                v.major,
                v.minor,
                v.patch,
                onednn::effective_isa()
            )
        }
    }
}

/// One Linear on oneDNN, with its epilogue fused.
pub(crate) struct DnnlLinear {
    name: String,
    fused: Fused,
    mm: Mm,
}

thread_local! {
    /// Each worker thread's bf16 copy of its current GEMM input (bf16 only).
    static BF16_SRC: RefCell<Vec<Bf16>> = const { RefCell::new(Vec::new()) };
}

impl DnnlLinear {
    fn new(
        engine: &Engine,
        name: &str,
        l: &Linear,
        fused: Fused,
        data_type: DataType,
        m_hint: usize,
    ) -> Result<Self> {
        let post_ops = match fused {
            Fused::None => vec![],
            Fused::Relu => vec![PostOp::Relu],
            Fused::Add => vec![PostOp::BinaryAdd],
        };
        let spec = MatMulSpec {
            k: l.in_dim,
            n: l.out_dim,
            data_type,
            post_ops,
            threads: 1,
        };
        let mm = match v3::runtime() {
            Some(rt) => MatMul3::new(rt, spec, &l.weight, Some(&l.bias), m_hint).map(Mm::V3),
            None => MatMul::new(engine, spec, &l.weight, Some(&l.bias), m_hint).map(Mm::V2),
        }
        .map_err(|e| EncodeError::backend("onednn", format!("`{name}`: {e}")))?;
        Ok(DnnlLinear {
            name: name.to_string(),
            fused,
            mm,
        })
    }

    fn fail(&self, e: onednn::Error) -> EncodeError {
        EncodeError::backend("onednn", format!("`{}`: {e}", self.name))
    }
}

impl LinearKernel for DnnlLinear {
    fn forward(&self, x: &[f32], m: usize, out: &mut [f32], epilogue: Epilogue<'_>) -> Result<()> {
        let (k, n) = (self.mm.spec().k, self.mm.spec().n);
        let (x, out) = (&x[..m * k], &mut out[..m * n]);
        // The post-ops are fixed at creation; a call with another epilogue
        // (none in this crate) still gets the right answer, unfused.
        let fused_here = epilogue.kind() == self.fused;
        let residual = match epilogue {
            Epilogue::Add(r) if fused_here => Some(&r[..m * n]),
            _ => None,
        };
        if !fused_here && self.fused != Fused::None {
            return Err(EncodeError::backend(
                "onednn",
                format!(
                    "`{}` was built with {:?} fused but called with {:?}",
                    self.name,
                    self.fused,
                    epilogue.kind()
                ),
            ));
        }
        match self.mm.spec().data_type {
            DataType::F32 => self.mm.execute(x, out, residual),
            DataType::Bf16 => BF16_SRC.with(|buf| {
                let mut buf = buf.borrow_mut();
                onednn::f32_to_bf16_into(x, &mut buf);
                self.mm.execute(&buf[..], out, residual)
            }),
        }
        .map_err(|e| self.fail(e))?;
        if !fused_here {
            apply_epilogue(out, epilogue);
        }
        Ok(())
    }
}

/// The oneDNN backend.
pub struct OnednnBackend {
    inner: BlockBackend<DnnlLinear>,
    data_type: DataType,
}

impl OnednnBackend {
    pub fn new(weights: Arc<StudentWeights>, profile: &DeviceProfile) -> Result<Self> {
        let data_type = match profile.dtype {
            Dtype::F32 => DataType::F32,
            Dtype::Bf16 if bf16_supported() => DataType::Bf16,
            // No native bf16 here: oneDNN would refuse or emulate it.
            Dtype::Bf16 => DataType::F32,
            other => return Err(other.unsupported("onednn", &[Dtype::F32, Dtype::Bf16])),
        };
        let engine = Engine::cpu().map_err(|e| EncodeError::backend("onednn", e))?;
        let block = profile.block_pixels.max(1);
        let inner = BlockBackend::new("onednn", weights, profile, &mut |name, l, fused| {
            // The head runs on one row per pixel; backbones on HINT_LEN per pixel.
            let rows = if name.starts_with("dim_reducer") {
                block
            } else {
                block * HINT_LEN
            };
            DnnlLinear::new(&engine, name, l, fused, data_type, rows)
        })?;
        Ok(OnednnBackend { inner, data_type })
    }

    /// The element type the GEMMs run in (bf16 only where the profile asks and the CPU has it).
    pub fn data_type(&self) -> DataType {
        self.data_type
    }
}

impl Backend for OnednnBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn backbone(&self, modality: Modality, batch: &SequenceBatch<'_>) -> Result<Vec<f32>> {
        self.inner.backbone(modality, batch)
    }
    fn head(&self, s2: &[f32], s1: &[f32], n: usize) -> Result<Vec<f32>> {
        self.inner.head(s2, s1, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// oneDNN's `ref:any` matmul (what it falls back to when a post-op or
    /// layout is unsupported) is tens of times slower; every fused layer must
    /// get an optimised kernel, and match the unfused arithmetic.
    #[test]
    fn fused_layers_get_an_optimised_kernel_and_match_unfused() {
        let engine = Engine::cpu().expect("oneDNN CPU engine");
        let (k, n, m) = (24, 40, 16);
        let l = Linear {
            in_dim: k,
            out_dim: n,
            weight: (0..n * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 100.0)
                .collect(),
            bias: (0..n).map(|i| i as f32 / 10.0 - 2.0).collect(),
        };
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0)
            .collect();
        let res: Vec<f32> = (0..m * n).map(|i| (i % 11) as f32 - 5.0).collect();
        let mut plain = vec![0f32; m * n];
        for r in 0..m {
            for c in 0..n {
                let mut acc = l.bias[c] as f64;
                for p in 0..k {
                    acc += x[r * k + p] as f64 * l.weight[c * k + p] as f64;
                }
                plain[r * n + c] = acc as f32;
            }
        }
        for (fused, epilogue) in [
            (Fused::None, Epilogue::None),
            (Fused::Relu, Epilogue::Relu),
            (Fused::Add, Epilogue::Add(&res)),
        ] {
            let lin = DnnlLinear::new(&engine, "test", &l, fused, DataType::F32, m).unwrap();
            let name = lin.mm.prepare(m).unwrap();
            eprintln!("{fused:?}: {name}");
            assert!(!name.starts_with("ref"), "{fused:?}: oneDNN chose {name}");
            let mut out = vec![0f32; m * n];
            lin.forward(&x, m, &mut out, epilogue).unwrap();
            let mut want = plain.clone();
            apply_epilogue(&mut want, epilogue);
            for (a, b) in out.iter().zip(&want) {
                assert!((a - b).abs() <= 1e-4, "{fused:?}: {a} vs {b}");
            }
        }
    }
}
