//! What this agent computes on (CPU, encoder), as registration reports it.

use std::path::{Path, PathBuf};

use anyhow::Context;
use flotilla_core::api::{Devices, EncoderInfo, EncoderProfile};
use tessera_encoder::{BackendChoice, DeviceProfile, ProfileSet};

/// The encoder profile file an agent reads unless `--encoder-profile` names
/// one: `WORKDIR/encoder-profiles.toml`, where `tessera-encode tune --out`
/// writes it. Absent, the agent runs with the untuned defaults.
pub const DEFAULT_PROFILE_FILE: &str = "encoder-profiles.toml";

/// The profile file to read: `explicit` (`--encoder-profile` or
/// `FLOTILLA_ENCODER_PROFILE`), which must exist, else the default in
/// `workdir` if it exists; `None`: no file, the untuned defaults. A file
/// that is there is parsed now, so a bad one stops the agent at start
/// rather than leaving it without tile jobs.
pub fn profile_file(explicit: Option<&Path>, workdir: &Path) -> anyhow::Result<Option<PathBuf>> {
    let path = match explicit {
        Some(p) if !p.exists() => anyhow::bail!(
            "--encoder-profile {}: no such file. Make it on this machine with \
             `tessera-encode tune --out {}` (it measures the backend the agent runs), \
             or leave the option out to run with the untuned defaults",
            p.display(),
            p.display()
        ),
        Some(p) => p.to_path_buf(),
        None => {
            let p = workdir.join(DEFAULT_PROFILE_FILE);
            if !p.exists() {
                return Ok(None);
            }
            p
        }
    };
    ProfileSet::load(&path)
        .with_context(|| format!("reading encoder profile {}", path.display()))?;
    Ok(Some(path))
}

/// The encoder this agent runs: backend and device profile, chosen once at
/// start (what the agent advertises at registration).
#[derive(Debug, Clone)]
pub struct EncoderSetup {
    pub choice: BackendChoice,
    pub profile: DeviceProfile,
    /// The profile file read, if any.
    pub profile_file: Option<PathBuf>,
    /// `profile` is the file's entry for this device and backend (else the
    /// untuned default).
    pub tuned: bool,
}

impl EncoderSetup {
    /// The fastest backend usable here (what `tessera-encode tune` measures
    /// by default), with its profile from `profile_file` when that holds an
    /// entry for this device, else the built-in default.
    pub fn detect(profile_file: Option<&Path>) -> anyhow::Result<Self> {
        let choice = BackendChoice::Auto.resolve();
        let device = tessera_encoder::backend::device_name(choice);
        let stored = match profile_file {
            Some(path) => ProfileSet::load(path)?.find(&device, choice).cloned(),
            None => None,
        };
        let tuned = stored.is_some();
        if let (Some(path), false) = (profile_file, tuned) {
            tracing::warn!(
                file = %path.display(),
                device = %device,
                backend = %choice,
                "the encoder profile file has no entry for this device and backend; \
                 running untuned (make one with `tessera-encode tune --out FILE`)"
            );
        }
        let profile = stored.unwrap_or_else(|| DeviceProfile::untuned(choice, device));
        Ok(EncoderSetup {
            choice,
            profile,
            profile_file: profile_file.map(Path::to_path_buf),
            tuned,
        })
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
                file: self.profile_file.as_ref().map(|f| f.display().to_string()),
                tuned: self.tuned,
                library: Some(tessera_encoder::backend::isa(self.choice)),
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

    #[test]
    fn the_profile_in_use_and_where_it_came_from_are_registered() {
        let dir = tempfile::tempdir().unwrap();
        // No file: the untuned defaults, and registration says so.
        assert_eq!(profile_file(None, dir.path()).unwrap(), None);
        let d = EncoderSetup::detect(None).unwrap().describe();
        let p = d.profile.as_ref().unwrap();
        assert!(!p.tuned && p.file.is_none(), "{p:?}");

        // An explicit file that is missing is an error saying how to make it.
        let named = dir.path().join("mine.toml");
        let e = profile_file(Some(&named), dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tessera-encode tune --out") && e.contains("mine.toml"),
            "{e}"
        );
        // One sentence, not a source line's indentation carried into it.
        assert!(!e.contains("  "), "{e}");

        // The default path, once `tune` has written this device's entry there.
        let default = dir.path().join(DEFAULT_PROFILE_FILE);
        let choice = BackendChoice::Auto.resolve();
        let mut tuned = DeviceProfile::default_for(choice);
        tuned.chunk_pixels = 64;
        let mut set = ProfileSet::default();
        set.upsert(tuned);
        set.save(&default).unwrap();
        let found = profile_file(None, dir.path()).unwrap();
        assert_eq!(found.as_deref(), Some(default.as_path()));
        let setup = EncoderSetup::detect(found.as_deref()).unwrap();
        let p = setup.describe().profile.unwrap();
        assert!(p.tuned && p.chunk_pixels == 64, "{p:?}");
        assert_eq!(p.file.as_deref(), Some(default.to_str().unwrap()));
        assert!(p.summary().contains("tuned, from"), "{}", p.summary());
        // And what computes: oneDNN's version and ISA, or the GPU, or the
        // vector ISA of the pure-Rust backends.
        let library = p.library.clone().unwrap();
        assert_eq!(library, tessera_encoder::backend::isa(choice));
        assert!(p.summary().ends_with(&library), "{}", p.summary());

        // A file with no entry for this device: untuned, and it says so.
        ProfileSet::default().save(&named).unwrap();
        let p = EncoderSetup::detect(Some(&named))
            .unwrap()
            .describe()
            .profile
            .unwrap();
        assert!(
            !p.tuned && p.summary().contains("no entry"),
            "{}",
            p.summary()
        );
        // A file that does not parse stops the agent at start.
        std::fs::write(&named, "not toml [").unwrap();
        assert!(profile_file(Some(&named), dir.path()).is_err());
    }
}
