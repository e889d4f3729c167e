//! The interface every compute backend implements, and how one is chosen.
//!
//! A backend runs the two pieces of the model that carry the FLOPs: a
//! backbone over a batch of pixels that share one sequence length, and the
//! head over pooled features. Grouping, gathering and output are shared
//! (`encode.rs`), so a new backend (`onednn.rs`, `cuda.rs` behind the cargo
//! features of those names) only implements [`Backend`] and adds itself to
//! [`create`]. The GPU path is written once in `gpu.rs` over a small device
//! interface; `cuda.rs` is its real device, and the tests' emulated device
//! (`gpu_emulator.rs`) runs the same path on the CPU.

mod block;
pub mod cpu;
#[cfg(all(feature = "cuda", any(target_os = "linux", target_os = "windows")))]
pub mod cuda;
#[cfg(any(
    test,
    all(feature = "cuda", any(target_os = "linux", target_os = "windows"))
))]
mod gpu;
#[cfg(test)]
mod gpu_emulator;
#[cfg(all(feature = "onednn", target_os = "linux"))]
pub mod onednn;
pub mod reference;

use std::sync::Arc;

use crate::error::{EncodeError, Result};
use crate::model::{Modality, StudentWeights};
use crate::profile::DeviceProfile;

/// `n` pixels' sequences of one length, ready for a backbone.
#[derive(Debug, Clone, Copy)]
pub struct SequenceBatch<'a> {
    pub n: usize,
    pub len: usize,
    pub bands: usize,
    /// (n, len, bands) standardised band values.
    pub values: &'a [f32],
    /// (n, len) raw days of year.
    pub doys: &'a [f32],
}

impl SequenceBatch<'_> {
    /// The value and day arrays hold exactly n × len (× bands) entries.
    pub fn check(&self, backend: &str) -> Result<()> {
        if self.values.len() != self.n * self.len * self.bands
            || self.doys.len() != self.n * self.len
        {
            return Err(EncodeError::backend(
                backend,
                format!(
                    "batch of {} x {} x {} has {} values and {} days",
                    self.n,
                    self.len,
                    self.bands,
                    self.values.len(),
                    self.doys.len()
                ),
            ));
        }
        Ok(())
    }
}

/// A compute backend. Implementations must be deterministic: the same batch
/// gives the same bits whatever the thread count, so the reduction order may
/// depend on the profile's block size but never on the number of threads.
pub trait Backend: Send + Sync {
    /// Short name (`reference`, `cpu`, ...).
    fn name(&self) -> &'static str;
    /// Run one backbone: returns (n, d_model) pooled features.
    fn backbone(&self, modality: Modality, batch: &SequenceBatch<'_>) -> Result<Vec<f32>>;
    /// Run the head on `n` pixels' pooled S2 and S1 features (each (n, d)):
    /// returns (n, repr_dim).
    fn head(&self, s2: &[f32], s1: &[f32], n: usize) -> Result<Vec<f32>>;
}

/// Which backend the caller asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendChoice {
    /// The fastest one compiled in and usable here: cuda, then onednn, then cpu.
    Auto,
    Reference,
    Cpu,
    Onednn,
    Cuda,
}

impl BackendChoice {
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "auto" => BackendChoice::Auto,
            "reference" => BackendChoice::Reference,
            "cpu" => BackendChoice::Cpu,
            "onednn" => BackendChoice::Onednn,
            "cuda" => BackendChoice::Cuda,
            other => {
                return Err(EncodeError::Invalid(format!(
                    "unknown backend `{other}` (auto, reference, cpu, onednn, cuda)"
                )))
            }
        })
    }

    /// The concrete backend `Auto` resolves to in this build on this machine.
    pub fn resolve(self) -> BackendChoice {
        match self {
            BackendChoice::Auto => [BackendChoice::Cuda, BackendChoice::Onednn]
                .into_iter()
                .find(|&b| unavailable_reason(b).is_none())
                .unwrap_or(BackendChoice::Cpu),
            c => c,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Reference => "reference",
            BackendChoice::Cpu => "cpu",
            BackendChoice::Onednn => "onednn",
            BackendChoice::Cuda => "cuda",
        }
    }

    /// Every backend but `Auto`.
    pub const CONCRETE: [BackendChoice; 4] = [
        BackendChoice::Reference,
        BackendChoice::Cpu,
        BackendChoice::Onednn,
        BackendChoice::Cuda,
    ];

    /// Backends this build can run on this machine.
    pub fn available() -> Vec<BackendChoice> {
        Self::CONCRETE
            .into_iter()
            .filter(|&b| unavailable_reason(b).is_none())
            .collect()
    }
}

/// The CUDA backend is compiled in and this machine has a GPU it can use
/// (checked once per process, see `cuda::probe`).
pub fn cuda_usable() -> bool {
    unavailable_reason(BackendChoice::Cuda).is_none()
}

/// Why this build or machine cannot run `choice` (`None`: it can). For
/// CUDA, the library or driver that is missing.
pub fn unavailable_reason(choice: BackendChoice) -> Option<String> {
    match choice {
        BackendChoice::Auto | BackendChoice::Reference | BackendChoice::Cpu => None,
        BackendChoice::Onednn => (!cfg!(all(feature = "onednn", target_os = "linux")))
            .then(|| not_built(choice).to_string()),
        BackendChoice::Cuda => {
            #[cfg(all(feature = "cuda", any(target_os = "linux", target_os = "windows")))]
            {
                cuda::probe().err()
            }
            #[cfg(not(all(feature = "cuda", any(target_os = "linux", target_os = "windows"))))]
            {
                Some(not_built(choice).to_string())
            }
        }
    }
}

/// Build the chosen backend over shared weights.
pub fn create(
    choice: BackendChoice,
    weights: Arc<StudentWeights>,
    profile: &DeviceProfile,
) -> Result<Box<dyn Backend>> {
    match choice.resolve() {
        BackendChoice::Reference => {
            if profile.dtype != "f32" {
                return Err(EncodeError::backend(
                    "reference",
                    format!("dtype `{}` is not supported (f32 only)", profile.dtype),
                ));
            }
            Ok(Box::new(reference::ReferenceBackend::new(
                weights,
                profile.threads,
            )?))
        }
        BackendChoice::Cpu => Ok(Box::new(cpu::CpuBackend::new(weights, profile)?)),
        #[cfg(all(feature = "onednn", target_os = "linux"))]
        BackendChoice::Onednn => Ok(Box::new(onednn::OnednnBackend::new(weights, profile)?)),
        #[cfg(not(all(feature = "onednn", target_os = "linux")))]
        BackendChoice::Onednn => Err(not_built(BackendChoice::Onednn)),
        #[cfg(all(feature = "cuda", any(target_os = "linux", target_os = "windows")))]
        BackendChoice::Cuda => Ok(Box::new(cuda::CudaBackend::new(weights, profile)?)),
        #[cfg(not(all(feature = "cuda", any(target_os = "linux", target_os = "windows"))))]
        BackendChoice::Cuda => Err(not_built(BackendChoice::Cuda)),
        BackendChoice::Auto => unreachable!("resolve() never returns Auto"),
    }
}

fn not_built(c: BackendChoice) -> EncodeError {
    EncodeError::backend(
        c.name(),
        format!(
            "not available in this build (enable the `{}` cargo feature)",
            c.name()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_prefers_cuda_then_onednn() {
        let want = if cuda_usable() {
            BackendChoice::Cuda
        } else if cfg!(all(feature = "onednn", target_os = "linux")) {
            BackendChoice::Onednn
        } else {
            BackendChoice::Cpu
        };
        assert_eq!(BackendChoice::Auto.resolve(), want);
        assert!(BackendChoice::available().contains(&want));
    }
}
