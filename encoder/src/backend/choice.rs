//! The names of the backends, as `--backend` and a profile's `backend` spell them.
//!
//! Parsed once at the edge (clap for the CLI, serde for a profile file, or
//! [`str::parse`] for a caller holding a name); what `Auto` resolves to and
//! which backends run here are in `backend/mod.rs`, which probes for them.

use serde::{Deserialize, Serialize};

use crate::error::EncodeError;

/// Which backend the caller asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// The fastest one compiled in and usable here: cuda, then onednn, then cpu.
    Auto,
    /// candle, the yardstick.
    Reference,
    /// Pure Rust, the `gemm` crate (`backend/pure_rust.rs`).
    Cpu,
    /// oneDNN matmuls (the `onednn` feature, Linux).
    Onednn,
    /// cuBLAS and NVRTC kernels on GPU 0 (the `cuda` feature).
    Cuda,
}

impl BackendChoice {
    /// Every backend but `Auto`.
    pub const CONCRETE: [BackendChoice; 4] = [
        BackendChoice::Reference,
        BackendChoice::Cpu,
        BackendChoice::Onednn,
        BackendChoice::Cuda,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Reference => "reference",
            BackendChoice::Cpu => "cpu",
            BackendChoice::Onednn => "onednn",
            BackendChoice::Cuda => "cuda",
        }
    }
}

impl std::fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BackendChoice {
    type Err = EncodeError;

    fn from_str(s: &str) -> Result<Self, EncodeError> {
        [BackendChoice::Auto]
            .into_iter()
            .chain(BackendChoice::CONCRETE)
            .find(|b| b.name() == s)
            .ok_or_else(|| {
                EncodeError::Invalid(format!(
                    "unknown backend `{s}` (auto, reference, cpu, onednn, cuda)"
                ))
            })
    }
}

/// A backend's name, for callers that hold one (`DeviceProfile::resolve`).
impl TryFrom<&str> for BackendChoice {
    type Error = EncodeError;

    fn try_from(s: &str) -> Result<Self, EncodeError> {
        s.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for b in [BackendChoice::Auto]
            .into_iter()
            .chain(BackendChoice::CONCRETE)
        {
            assert_eq!(b.name().parse::<BackendChoice>().unwrap(), b);
            let v = clap::ValueEnum::to_possible_value(&b).expect("every backend is a value");
            assert_eq!(v.get_name(), b.name());
        }
        let e = "gpu".parse::<BackendChoice>().unwrap_err().to_string();
        assert!(e.contains("unknown backend `gpu`"), "{e}");
    }
}
