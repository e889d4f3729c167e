//! Device profiles: how to cut work for one device, stored per device name in TOML.
//!
//! A profile holds pixels per GEMM chunk, pixels per thread block, threads
//! and dtype; `tessera-encode tune` writes them. This file is data only: the
//! constructors for this machine (`DeviceProfile::default_for`, `resolve`)
//! are in `backend/mod.rs`, which names the device (CPU model or GPU).
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

use crate::backend::choice::BackendChoice;
use crate::error::{EncodeError, Result};

/// The element type a backend's GEMMs compute in (a profile's `dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// Exact f32: every backend; the fixtures' tolerances hold.
    F32,
    /// onednn, where the CPU has AMX or AVX-512 bf16 (f32 elsewhere); cuda:
    /// bf16 tensor cores for the GEMMs (inputs rounded to bf16, f32
    /// accumulation), everything else in f32.
    Bf16,
    /// cuda: TF32 tensor cores, several times the f32 rate, less exact.
    Tf32,
}

impl Dtype {
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::Tf32 => "tf32",
        }
    }

    /// The error a backend gives for a dtype outside the `supported` ones.
    pub(crate) fn unsupported(self, backend: &str, supported: &[Dtype]) -> EncodeError {
        let names: Vec<&str> = supported.iter().map(|d| d.name()).collect();
        let which = match names.as_slice() {
            [one] => format!("{one} only"),
            more => more.join(" or "),
        };
        EncodeError::backend(
            backend,
            format!("dtype `{self}` is not supported ({which})"),
        )
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceProfile {
    /// CPU model string (`/proc/cpuinfo` "model name") or GPU name.
    pub device: String,
    /// Backend these numbers were measured for (never `auto`).
    pub backend: BackendChoice,
    /// Pixels gathered and handed to the backend per call (bounds memory;
    /// sets the GEMM batch on batched backends).
    pub chunk_pixels: usize,
    /// Pixels one thread carries through all layers at once.
    pub block_pixels: usize,
    pub threads: usize,
    /// `f32` unless the profile opts into `bf16` (onednn) or `tf32` (cuda).
    pub dtype: Dtype,
}

impl DeviceProfile {
    /// Untuned starting point for `backend` on `device`.
    pub fn untuned(backend: BackendChoice, device: String) -> Self {
        let (chunk, block) = match backend {
            // candle batches a whole chunk: keep it small enough that
            // (chunk x 256 tokens x FFN) activations fit in memory.
            BackendChoice::Reference => (32, 32),
            // One GEMM over the whole chunk: a GPU wants tens of thousands
            // of rows (1024 pixels x 64 observations); 1024 pixels at 256
            // observations take ~7 GB of activations with the Large model
            // (smaller cards: tune, or a smaller chunk). Blocks do not apply.
            BackendChoice::Cuda => (1024, 1),
            // Blocks of 8 pixels (512 tokens at 64 observations) measured
            // fastest for the Large model on a 2-core AMD EPYC (`tune`,
            // 1 thread: 2 -> 4.0, 8 -> 4.4, 32 -> 2.7 pixels/s).
            BackendChoice::Auto | BackendChoice::Cpu | BackendChoice::Onednn => (256, 8),
        };
        DeviceProfile {
            device,
            backend,
            chunk_pixels: chunk,
            block_pixels: block,
            threads: available_threads(),
            dtype: Dtype::F32,
        }
    }

    /// The profile stored in `file` for `device` and `backend`, or the
    /// untuned one. `DeviceProfile::resolve` calls this with the device
    /// this machine has (`backend/mod.rs` names it).
    pub fn stored_or_untuned(
        file: Option<&Path>,
        backend: BackendChoice,
        device: String,
    ) -> Result<Self> {
        if let Some(path) = file {
            if path.exists() {
                let set = ProfileSet::load(path)?;
                if let Some(p) = set.find(&device, backend) {
                    return Ok(p.clone());
                }
            }
        }
        Ok(Self::untuned(backend, device))
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
            if p.backend == BackendChoice::Auto {
                return Err(EncodeError::Profile {
                    path: path.to_path_buf(),
                    reason: format!(
                        "profile for `{}`: backend `auto` is not a backend (name the one measured)",
                        p.device
                    ),
                });
            }
        }
        Ok(set)
    }

    pub fn find(&self, device: &str, backend: BackendChoice) -> Option<&DeviceProfile> {
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

/// The threads this process may use (a profile's default `threads`).
pub fn available_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// The physical cores under the logical CPUs this process may run on
/// (`Cpus_allowed_list` of `/proc/self/status`; all of them where that is
/// not readable): a core's hardware threads share one `core_cpus_list` in
/// `/sys` (older kernels call it `thread_siblings_list`). `None` where the
/// topology is not readable (off Linux). `tune` tries this many threads too
/// where it is fewer than [`available_threads`]: two threads on a core
/// share its AMX unit and its FMA ports.
pub fn physical_cores() -> Option<usize> {
    let allowed = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .and_then(|list| cpu_list(list.trim()))
        });
    physical_cores_in(Path::new("/sys/devices/system/cpu"), allowed.as_deref())
}

/// The CPUs of a kernel CPU list such as "0-3,8,10-11"; `None` if malformed.
fn cpu_list(list: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (first, last): (usize, usize) = match part.split_once('-') {
            Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
            None => {
                let c = part.parse().ok()?;
                (c, c)
            }
        };
        if last < first || last - first > 1 << 16 {
            return None;
        }
        cpus.extend(first..=last);
    }
    Some(cpus)
}

fn physical_cores_in(cpu_dir: &Path, allowed: Option<&[usize]>) -> Option<usize> {
    let mut cores = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(cpu_dir).ok()? {
        let entry = entry.ok()?;
        let name = entry.file_name();
        let Some(index) = name
            .to_str()
            .and_then(|n| n.strip_prefix("cpu"))
            .and_then(|i| i.parse::<usize>().ok())
        else {
            continue;
        };
        if allowed.is_some_and(|a| !a.contains(&index)) {
            continue;
        }
        let topology = entry.path().join("topology");
        let siblings = std::fs::read_to_string(topology.join("core_cpus_list"))
            .or_else(|_| std::fs::read_to_string(topology.join("thread_siblings_list")))
            .ok()?;
        cores.insert(siblings.trim().to_string());
    }
    (!cores.is_empty()).then_some(cores.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn physical_cores_count_each_cores_threads_once() {
        let dir = tempfile::tempdir().unwrap();
        // Two cores with two threads each, and files that are not CPUs.
        for (cpu, list) in [(0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3")] {
            let topology = dir.path().join(format!("cpu{cpu}/topology"));
            std::fs::create_dir_all(&topology).unwrap();
            std::fs::write(topology.join("core_cpus_list"), format!("{list}\n")).unwrap();
        }
        std::fs::create_dir_all(dir.path().join("cpufreq")).unwrap();
        std::fs::write(dir.path().join("online"), "0-3\n").unwrap();
        assert_eq!(physical_cores_in(dir.path(), None), Some(2));
        // An older kernel's name for the same list.
        let old = dir.path().join("cpu4/topology");
        std::fs::create_dir_all(&old).unwrap();
        std::fs::write(old.join("thread_siblings_list"), "4\n").unwrap();
        assert_eq!(physical_cores_in(dir.path(), None), Some(3));
        // A CPU without either list: unknown, not a guess.
        std::fs::create_dir_all(dir.path().join("cpu5/topology")).unwrap();
        assert_eq!(physical_cores_in(dir.path(), None), None);
        assert_eq!(physical_cores_in(&dir.path().join("missing"), None), None);
        // Only the CPUs this process may run on count: 0 and 2 are one core.
        assert_eq!(physical_cores_in(dir.path(), Some(&[0, 2])), Some(1));
        assert_eq!(physical_cores_in(dir.path(), Some(&[0, 1, 4])), Some(3));
    }

    #[test]
    fn cpu_lists_read_as_the_kernel_writes_them() {
        assert_eq!(cpu_list("0-3,8,10-11"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(cpu_list("5"), Some(vec![5]));
        assert_eq!(cpu_list(""), Some(vec![]));
        for bad in ["a", "3-1", "0-", "1,,x"] {
            assert_eq!(cpu_list(bad), None, "{bad}");
        }
    }

    #[test]
    fn toml_round_trip_and_upsert() {
        let mut set = ProfileSet::default();
        let mut p = DeviceProfile::untuned(BackendChoice::Cpu, "test cpu".into());
        set.upsert(p.clone());
        p.chunk_pixels = 999;
        set.upsert(p.clone());
        assert_eq!(set.profiles.len(), 1);
        let text = toml::to_string_pretty(&set).unwrap();
        assert!(
            text.contains("backend = \"cpu\"") && text.contains("dtype = \"f32\""),
            "{text}"
        );
        let back: ProfileSet = toml::from_str(&text).unwrap();
        assert_eq!(
            back.find(&p.device, BackendChoice::Cpu)
                .unwrap()
                .chunk_pixels,
            999
        );
    }

    #[test]
    fn a_bad_backend_or_dtype_names_the_file_and_the_field() {
        let dir = std::env::temp_dir().join(format!("tessera-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let entry = |backend: &str, dtype: &str| {
            format!(
                "[[profile]]\ndevice = \"x\"\nbackend = \"{backend}\"\nchunk_pixels = 1\n\
                 block_pixels = 1\nthreads = 1\ndtype = \"{dtype}\"\n"
            )
        };
        for (name, text, says) in [
            ("dtype.toml", entry("cpu", "f16"), "dtype"),
            ("backend.toml", entry("gpu", "f32"), "backend"),
            ("auto.toml", entry("auto", "f32"), "`auto`"),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            let e = ProfileSet::load(&path).unwrap_err().to_string();
            assert!(e.contains(name) && e.contains(says), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
