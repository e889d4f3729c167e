//! What this agent computes on (CPU, encoder), as registration reports it.

use std::path::Path;

use flotilla_core::api::{Devices, EncoderInfo, EncoderProfile};
use tessera_encoder::{BackendChoice, DeviceProfile};

/// The encoder this agent runs: backend and device profile, chosen once at
/// start (what the agent advertises at registration).
#[derive(Debug, Clone)]
pub struct EncoderSetup {
    pub choice: BackendChoice,
    pub profile: DeviceProfile,
}

impl EncoderSetup {
    /// The fastest backend compiled in, with its profile from `profile_file`
    /// (as written by `tessera-encode tune`) or the built-in default.
    pub fn detect(profile_file: Option<&Path>) -> anyhow::Result<Self> {
        let choice = BackendChoice::Auto.resolve();
        let profile = DeviceProfile::resolve(profile_file, choice.name())?;
        Ok(EncoderSetup { choice, profile })
    }

    /// What registration reports under `devices.encoder`: the backend in
    /// use, its profile, and why each faster backend is not used (say, a GPU
    /// box whose agent cannot load cuBLAS), for the operator to see.
    pub fn describe(&self) -> EncoderInfo {
        let unavailable = [BackendChoice::Cuda, BackendChoice::Onednn]
            .into_iter()
            .filter_map(|b| {
                tessera_encoder::backend::unavailable_reason(b)
                    .map(|why| (b.name().to_string(), why))
            })
            .collect();
        let p = &self.profile;
        EncoderInfo {
            backend: self.choice.name().to_string(),
            profile: Some(EncoderProfile {
                device: p.device.clone(),
                backend: p.backend.name().to_string(),
                chunk_pixels: p.chunk_pixels,
                block_pixels: p.block_pixels,
                threads: p.threads,
                dtype: p.dtype.name().to_string(),
            }),
            unavailable,
        }
    }
}

/// `Register.devices`: the CPU model and, when this agent takes tile jobs,
/// its encoder.
pub fn registration(cpu_model: &str, encoder: Option<&EncoderSetup>) -> Devices {
    Devices {
        cpu: Some(cpu_model.to_string()),
        encoder: encoder.map(EncoderSetup::describe),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_says_why_faster_backends_are_not_used() {
        let setup = EncoderSetup::detect(None).unwrap();
        let d = setup.describe();
        assert_eq!(d.backend, setup.choice.name());
        let cuda = d.unavailable.get("cuda");
        if tessera_encoder::backend::cuda_usable() {
            assert!(cuda.is_none(), "{d:?}");
        } else {
            assert!(cuda.is_some_and(|why| !why.is_empty()), "{d:?}");
        }
    }
}
