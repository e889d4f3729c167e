//! What this agent computes on (CPU, encoder), as registration reports it.

use std::path::Path;

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
    pub fn describe(&self) -> serde_json::Value {
        let unavailable: serde_json::Map<String, serde_json::Value> =
            [BackendChoice::Cuda, BackendChoice::Onednn]
                .into_iter()
                .filter_map(|b| {
                    tessera_encoder::backend::unavailable_reason(b)
                        .map(|why| (b.name().to_string(), serde_json::Value::String(why)))
                })
                .collect();
        serde_json::json!({
            "backend": self.choice.name(),
            "profile": serde_json::to_value(&self.profile).unwrap_or(serde_json::Value::Null),
            "unavailable": unavailable,
        })
    }
}

/// `Register.devices`: the CPU model and, when this agent takes tile jobs,
/// its encoder.
pub fn registration(cpu_model: &str, encoder: Option<&EncoderSetup>) -> serde_json::Value {
    serde_json::json!({
        "cpu": cpu_model,
        "encoder": encoder.map(EncoderSetup::describe),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_says_why_faster_backends_are_not_used() {
        let setup = EncoderSetup::detect(None).unwrap();
        let d = setup.describe();
        assert_eq!(d["backend"], setup.choice.name());
        let unavailable = d["unavailable"].as_object().expect("an object");
        let cuda = unavailable.get("cuda").and_then(|v| v.as_str());
        if tessera_encoder::backend::cuda_usable() {
            assert!(cuda.is_none(), "{d}");
        } else {
            assert!(cuda.is_some_and(|why| !why.is_empty()), "{d}");
        }
    }
}
