//! Device profiles: how to cut work for one device (pixels per GEMM chunk,
//! pixels per thread block, threads, dtype), stored per device name in a
//! TOML file and written by `tessera-encode tune`.
//!
//! ```toml
//! [[profile]]
//! device = "AMD EPYC 7B13"      # CPU model string or GPU name
//! backend = "cpu"
//! chunk_pixels = 256
//! block_pixels = 8
//! threads = 2
//! dtype = "f32"
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{EncodeError, Result};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceProfile {
    /// CPU model string (`/proc/cpuinfo` "model name") or GPU name.
    pub device: String,
    /// Backend these numbers were measured for.
    pub backend: String,
    /// Pixels gathered and handed to the backend per call (bounds memory;
    /// sets the GEMM batch on batched backends).
    pub chunk_pixels: usize,
    /// Pixels one thread carries through all layers at once.
    pub block_pixels: usize,
    pub threads: usize,
    /// `f32` everywhere today; `bf16` for backends that support it.
    pub dtype: String,
}

impl DeviceProfile {
    /// Untuned starting point for a backend on this machine.
    pub fn default_for(backend: &str) -> Self {
        let (chunk, block) = match backend {
            // candle batches a whole chunk: keep it small enough that
            // (chunk x 256 tokens x FFN) activations fit in memory.
            "reference" => (32, 32),
            // One GEMM over the whole chunk: a GPU wants tens of thousands
            // of rows (1024 pixels x 64 observations); 1024 pixels at 256
            // observations take ~7 GB of activations with the Large model
            // (smaller cards: tune, or a smaller chunk). Blocks do not apply.
            "cuda" => (1024, 1),
            // Blocks of 8 pixels (512 tokens at 64 observations) measured
            // fastest for the Large model on a 2-core AMD EPYC (`tune`,
            // 1 thread: 2 -> 4.0, 8 -> 4.4, 32 -> 2.7 pixels/s).
            _ => (256, 8),
        };
        DeviceProfile {
            device: device_name(backend),
            backend: backend.to_string(),
            chunk_pixels: chunk,
            block_pixels: block,
            threads: available_threads(),
            dtype: "f32".into(),
        }
    }

    /// The stored profile for this device and backend, or the default.
    pub fn resolve(file: Option<&Path>, backend: &str) -> Result<Self> {
        let device = device_name(backend);
        if let Some(path) = file {
            if path.exists() {
                let set = ProfileSet::load(path)?;
                if let Some(p) = set.find(&device, backend) {
                    return Ok(p.clone());
                }
            }
        }
        Ok(Self::default_for(backend))
    }
}

/// All profiles of one file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProfileSet {
    #[serde(default, rename = "profile")]
    pub profiles: Vec<DeviceProfile>,
}

impl ProfileSet {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| EncodeError::io(path, e))?;
        let set: ProfileSet = toml::from_str(&text).map_err(|e| EncodeError::Profile {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        for p in &set.profiles {
            if p.chunk_pixels == 0 || p.block_pixels == 0 || p.threads == 0 {
                return Err(EncodeError::Profile {
                    path: path.to_path_buf(),
                    reason: format!("profile for `{}` ({}) has a zero size", p.device, p.backend),
                });
            }
        }
        Ok(set)
    }

    pub fn find(&self, device: &str, backend: &str) -> Option<&DeviceProfile> {
        self.profiles
            .iter()
            .find(|p| p.device == device && p.backend == backend)
    }

    /// Replace the entry for the same device and backend, or add one.
    pub fn upsert(&mut self, p: DeviceProfile) {
        match self
            .profiles
            .iter_mut()
            .find(|q| q.device == p.device && q.backend == p.backend)
        {
            Some(q) => *q = p,
            None => self.profiles.push(p),
        }
    }

    /// Write atomically (temp file, then rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        let text = toml::to_string_pretty(self).map_err(|e| EncodeError::Profile {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let tmp = path.with_extension("toml.tmp");
        std::fs::write(&tmp, text).map_err(|e| EncodeError::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| EncodeError::io(path, e))
    }
}

/// The name profiles are keyed by: the CPU model for CPU backends.
pub fn device_name(backend: &str) -> String {
    #[cfg(all(feature = "cuda", any(target_os = "linux", target_os = "windows")))]
    if backend == "cuda" {
        if let Some(gpu) = crate::backend::cuda::device_name() {
            return gpu;
        }
    }
    let _ = backend;
    cpu_model().unwrap_or_else(|| format!("{} cpu", std::env::consts::ARCH))
}

fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

pub fn available_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_round_trip_and_upsert() {
        let mut set = ProfileSet::default();
        let mut p = DeviceProfile::default_for("cpu");
        set.upsert(p.clone());
        p.chunk_pixels = 999;
        set.upsert(p.clone());
        assert_eq!(set.profiles.len(), 1);
        let text = toml::to_string_pretty(&set).unwrap();
        let back: ProfileSet = toml::from_str(&text).unwrap();
        assert_eq!(back.find(&p.device, "cpu").unwrap().chunk_pixels, 999);
    }
}
