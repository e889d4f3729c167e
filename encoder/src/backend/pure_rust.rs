//! The pure-Rust backend (`--backend cpu`): `gemm`-crate sgemm, thread per block.
//!
//! Weights stay in PyTorch's layout, the bias is folded into the accumulator
//! and ReLU / residual are applied after, one thread per block of pixels
//! (`block.rs`). The fallback where oneDNN is unavailable.

use std::sync::Arc;

use gemm::Parallelism;

use super::block::{apply_epilogue, BlockBackend, Epilogue, LinearKernel};
use super::Backend;
use crate::error::Result;
use crate::model::{Linear, StudentWeights};
use crate::profile::{DeviceProfile, Dtype};

/// A Linear with W kept as PyTorch stores it, (out, in) row-major, read by
/// the GEMM as W^T through strides.
pub(crate) struct PLinear {
    k: usize,
    n: usize,
    wt: Vec<f32>,
    bias: Vec<f32>,
}

impl PLinear {
    fn new(l: &Linear) -> Self {
        PLinear {
            k: l.in_dim,
            n: l.out_dim,
            wt: l.weight.clone(),
            bias: l.bias.clone(),
        }
    }
}

impl LinearKernel for PLinear {
    /// `out (m, n) = x (m, k) W^T + b`, then the epilogue.
    fn forward(&self, x: &[f32], m: usize, out: &mut [f32], epilogue: Epilogue<'_>) -> Result<()> {
        let (k, n) = (self.k, self.n);
        assert!(x.len() >= m * k && out.len() >= m * n);
        let out = &mut out[..m * n];
        for row in out.chunks_exact_mut(n) {
            row.copy_from_slice(&self.bias);
        }
        // SAFETY: the slices hold m*k, k*n and m*n elements at the strides given.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                out.as_mut_ptr(),
                1,
                n as isize,
                true,
                x.as_ptr(),
                1,
                k as isize,
                self.wt.as_ptr(),
                k as isize,
                1,
                1.0f32,
                1.0f32,
                false,
                false,
                false,
                Parallelism::None,
            );
        }
        apply_epilogue(out, epilogue);
        Ok(())
    }
}

/// The pure-Rust backend, named `cpu` on the command line and in profiles.
pub struct CpuBackend(BlockBackend<PLinear>);

impl CpuBackend {
    pub fn new(weights: Arc<StudentWeights>, profile: &DeviceProfile) -> Result<Self> {
        if profile.dtype != Dtype::F32 {
            return Err(profile.dtype.unsupported("cpu", &[Dtype::F32]));
        }
        Ok(CpuBackend(BlockBackend::new(
            "cpu",
            weights,
            profile,
            &|_, l, _, _| Ok(PLinear::new(l)),
            None,
        )?))
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn backbone(
        &self,
        modality: crate::model::Modality,
        batch: &super::SequenceBatch<'_>,
    ) -> Result<Vec<f32>> {
        self.0.backbone(modality, batch)
    }
    fn head(&self, s2: &[f32], s1: &[f32], n: usize) -> Result<Vec<f32>> {
        self.0.head(s2, s1, n)
    }
}
