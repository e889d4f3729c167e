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

mod attention;

use onednn::v3::{self, MatMul3};
use onednn::{Bf16, DataType, Element, Engine, MatMul, MatMulSpec, PostOp};

use super::block::{
    apply_epilogue, AttentionKernel, BlockBackend, Epilogue, Feeds, Fused, LinearKernel,
};
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

    fn execute<T: Element, D: Element>(
        &self,
        src: &[T],
        dst: &mut [D],
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
    /// Each worker thread's bf16 intermediate of a pair of Linears (the
    /// FFN's 2,560-wide hidden layer, the embedding's first layer), written
    /// by the first GEMM and read by the second (bf16 only).
    static BF16_MID: RefCell<Vec<Bf16>> = const { RefCell::new(Vec::new()) };
}

impl DnnlLinear {
    /// `dst_type` bf16 (with `data_type` bf16) only for a layer that feeds
    /// the next Linear alone ([`Feeds::NextLinear`]): it is then called
    /// through `forward_pair`, and `forward` refuses it.
    fn new(
        engine: &Engine,
        name: &str,
        l: &Linear,
        (fused, dst_type): (Fused, DataType),
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
            dst_type,
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

impl DnnlLinear {
    /// The residual to hand oneDNN for `epilogue`, and whether the
    /// epilogue is left to apply afterwards (not fused at creation).
    fn fused_residual<'a>(
        &self,
        m: usize,
        epilogue: Epilogue<'a>,
    ) -> Result<(Option<&'a [f32]>, bool)> {
        let n = self.mm.spec().n;
        // The post-ops are fixed at creation; a call with another epilogue
        // (none in this crate) still gets the right answer, unfused.
        let fused_here = epilogue.kind() == self.fused;
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
        let residual = match epilogue {
            Epilogue::Add(r) if fused_here => Some(&r[..m * n]),
            _ => None,
        };
        Ok((residual, !fused_here))
    }

    /// `out = x W^T + b` with the fused post-ops, from an f32 `x` (converted
    /// to bf16 first in a bf16 backend).
    fn run<D: Element>(&self, x: &[f32], out: &mut [D], residual: Option<&[f32]>) -> Result<()> {
        match self.mm.spec().data_type {
            DataType::F32 => self.mm.execute(x, out, residual),
            DataType::Bf16 => BF16_SRC.with(|buf| {
                let mut buf = buf.borrow_mut();
                onednn::f32_to_bf16_into(x, &mut buf);
                self.mm.execute(&buf[..], out, residual)
            }),
        }
        .map_err(|e| self.fail(e))
    }

    /// Whether this layer hands its output on in bf16 (`forward_pair` only).
    fn bf16_out(&self) -> bool {
        self.mm.spec().dst_type == DataType::Bf16
    }
}

impl LinearKernel for DnnlLinear {
    fn forward(&self, x: &[f32], m: usize, out: &mut [f32], epilogue: Epilogue<'_>) -> Result<()> {
        if self.bf16_out() {
            return Err(EncodeError::backend(
                "onednn",
                format!(
                    "`{}` writes bf16 for the next layer: call it as a pair",
                    self.name
                ),
            ));
        }
        let (k, n) = (self.mm.spec().k, self.mm.spec().n);
        let (residual, unfused) = self.fused_residual(m, epilogue)?;
        let out = &mut out[..m * n];
        self.run(&x[..m * k], out, residual)?;
        if unfused {
            apply_epilogue(out, epilogue);
        }
        Ok(())
    }

    /// In bf16 the first layer's result goes straight to the second in bf16:
    /// oneDNN rounds it as it stores it, the bits the separate conversion
    /// gave, without writing the f32 (for linear1, 2,560 floats a token),
    /// reading it back and converting it.
    fn forward_pair(
        first: &Self,
        second: &Self,
        x: &[f32],
        m: usize,
        mid: &mut [f32],
        out: &mut [f32],
        (e1, e2): (Epilogue<'_>, Epilogue<'_>),
    ) -> Result<()> {
        if !first.bf16_out() {
            first.forward(x, m, mid, e1)?;
            return second.forward(mid, m, out, e2);
        }
        let (k, n1, n2) = (first.mm.spec().k, first.mm.spec().n, second.mm.spec().n);
        let (r1, unfused1) = first.fused_residual(m, e1)?;
        if unfused1 {
            return Err(EncodeError::backend(
                "onednn",
                format!(
                    "`{}` writes bf16 and cannot apply {:?} after its GEMM",
                    first.name,
                    e1.kind()
                ),
            ));
        }
        let (r2, unfused2) = second.fused_residual(m, e2)?;
        let out = &mut out[..m * n2];
        BF16_MID.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.resize(m * n1, Bf16(0));
            first.run(&x[..m * k], &mut buf[..], r1)?;
            second
                .mm
                .execute(&buf[..], out, r2)
                .map_err(|e| second.fail(e))
        })?;
        if unfused2 {
            apply_epilogue(out, e2);
        }
        Ok(())
    }
}

/// `FLOTILLA_ONEDNN_F32_ATTENTION=1`: a bf16 backend keeps attention in f32
/// on the `gemm` crate, as before oneDNN's batched bf16 attention.
fn f32_attention_asked() -> bool {
    std::env::var_os("FLOTILLA_ONEDNN_F32_ATTENTION").is_some_and(|v| v == "1")
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
        // bf16 attention on oneDNN's batched matmuls, unless asked to keep
        // the f32 one on the `gemm` crate (`FLOTILLA_ONEDNN_F32_ATTENTION=1`,
        // to compare).
        let attention: Option<Box<dyn AttentionKernel>> = (data_type == DataType::Bf16
            && !f32_attention_asked())
        .then(|| Box::new(attention::OnednnAttention::new(&engine)) as _);
        let make = &|name: &str, l: &Linear, fused, feeds| {
            // The head runs on one row per pixel; backbones on HINT_LEN per pixel.
            let rows = if name.starts_with("dim_reducer") {
                block
            } else {
                block * HINT_LEN
            };
            let dst_type = match (data_type, feeds) {
                (DataType::Bf16, Feeds::NextLinear) => DataType::Bf16,
                _ => DataType::F32,
            };
            DnnlLinear::new(&engine, name, l, (fused, dst_type), data_type, rows)
        };
        let inner = BlockBackend::new("onednn", weights, profile, make, attention)?;
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
            let lin = DnnlLinear::new(
                &engine,
                "test",
                &l,
                (fused, DataType::F32),
                DataType::F32,
                m,
            )
            .unwrap();
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

    /// A pair whose first layer writes bf16 gives the bits of the same pair
    /// with an f32 intermediate converted separately (ReLU into a residual
    /// add, as linear1 into linear2), and the bf16-writing layer refuses to
    /// be called alone.
    #[test]
    fn bf16_pair_gives_the_bits_of_the_f32_intermediate() {
        if !bf16_supported() {
            eprintln!("SKIP: no native bf16 here");
            return;
        }
        let engine = Engine::cpu().expect("oneDNN CPU engine");
        let (k, n1, n2, m) = (64, 96, 64, 48);
        let layer = |i: usize, o: usize, seed: usize| Linear {
            in_dim: i,
            out_dim: o,
            weight: (0..o * i)
                .map(|j| (((j + seed) * 37 % 101) as f32 - 50.0) / 100.0)
                .collect(),
            bias: (0..o).map(|j| (j % 7) as f32 / 10.0 - 0.3).collect(),
        };
        let (l1, l2) = (layer(k, n1, 1), layer(n1, n2, 2));
        let make = |l: &Linear, fused, dst| {
            DnnlLinear::new(&engine, "test", l, (fused, dst), DataType::Bf16, m).unwrap()
        };
        let first_f32 = make(&l1, Fused::Relu, DataType::F32);
        let first_bf16 = make(&l1, Fused::Relu, DataType::Bf16);
        let second = make(&l2, Fused::Add, DataType::F32);
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0)
            .collect();
        let res: Vec<f32> = (0..m * n2).map(|i| (i % 11) as f32 - 5.0).collect();
        let epilogues = (Epilogue::Relu, Epilogue::Add(&res));
        let (mut mid, mut want, mut got) =
            (vec![0f32; m * n1], vec![0f32; m * n2], vec![0f32; m * n2]);
        DnnlLinear::forward_pair(&first_f32, &second, &x, m, &mut mid, &mut want, epilogues)
            .unwrap();
        mid.fill(f32::NAN);
        DnnlLinear::forward_pair(&first_bf16, &second, &x, m, &mut mid, &mut got, epilogues)
            .unwrap();
        assert!(
            mid.iter().all(|v| v.is_nan()),
            "the bf16 pair wrote the f32 intermediate"
        );
        let differ = got
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differ, 0, "{differ} of {} outputs differ", m * n2);
        assert!(first_bf16.forward(&x, m, &mut mid, Epilogue::Relu).is_err());
    }

    /// Once its matmuls have packed the weights, the backend holds no
    /// reference to the f32 ones: an encoder loaded from a file frees them
    /// (175 MB for the Large student).
    #[test]
    fn the_backend_lets_the_f32_weights_go_once_packed() {
        let cfg = crate::config::ModelConfig::small();
        let weights = Arc::new(
            StudentWeights::from_checkpoint(&crate::synth::random_checkpoint(&cfg, 1)).unwrap(),
        );
        let profile = DeviceProfile::default_for(crate::backend::BackendChoice::Onednn);
        let backend = OnednnBackend::new(Arc::clone(&weights), &profile).unwrap();
        assert_eq!(Arc::strong_count(&weights), 1);
        drop(backend);
    }
}
