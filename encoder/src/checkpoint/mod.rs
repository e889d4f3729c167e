//! Checkpoints: loading (`.pt` torch zip pickle or `.safetensors`) after a
//! header-only check, and a VarBuilder-like hierarchical lookup with shape
//! checks.
//!
//! - `inspect` — [`inspect()`] and [`validate()`]: format, config, every
//!   tensor's dtype and shape, checked against the bytes present and the
//!   caps without reading a tensor.
//! - `safetensors` and `torch` — each format's header reader.
//! - `pickle` — the bounded pickle reader `torch` uses.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::config::ModelConfig;
use crate::error::{EncodeError, Result};

mod inspect;
pub mod pickle;
mod safetensors;
pub mod torch;

pub use inspect::{
    inspect, inspect_reader, validate, CheckpointInfo, DType, Format, TensorMeta,
    MAX_CHECKPOINT_ELEMENTS, MAX_RANK,
};

/// One named tensor, f32, row-major.
#[derive(Debug, Clone)]
pub struct Param {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// All tensors of a checkpoint plus its parsed config.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub path: PathBuf,
    pub config: ModelConfig,
    pub tensors: BTreeMap<String, Param>,
}

impl Checkpoint {
    /// Load a `.pt` or `.safetensors` file (chosen by extension; anything
    /// else is sniffed: a zip is torch, otherwise safetensors). The headers
    /// are [`validate`]d first (sizes against the bytes present, the
    /// model's tensor names and shapes), so what is then read is bounded by
    /// the file and the caps.
    pub fn load(path: &Path) -> Result<Self> {
        let mut f = std::fs::File::open(path).map_err(|e| EncodeError::io(path, e))?;
        Self::from_reader(&mut f, path)
    }

    /// [`Checkpoint::load`] from any seekable source; `path` names it in
    /// errors and its extension picks the format.
    pub fn from_reader<R: std::io::Read + std::io::Seek>(r: &mut R, path: &Path) -> Result<Self> {
        let info = inspect_reader(r, path)?;
        info.check_model()?;
        let tensors = info.read_tensors(r)?;
        Ok(Checkpoint {
            path: path.to_path_buf(),
            config: info.config,
            tensors,
        })
    }

    pub fn vars(&self) -> Vars<'_> {
        Vars {
            store: self,
            used: std::rc::Rc::new(RefCell::new(BTreeSet::new())),
            prefix: String::new(),
        }
    }
}

pub(crate) fn ckpt_err(path: &Path, reason: impl std::fmt::Display) -> EncodeError {
    EncodeError::Checkpoint {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Hierarchical view into a checkpoint: `vars.pp("s2_backbone").get(&[d, 10], "embedding.0.weight")`.
/// Every tensor fetched is recorded so [`Vars::finish`] can reject leftovers.
#[derive(Clone)]
pub struct Vars<'a> {
    store: &'a Checkpoint,
    used: std::rc::Rc<RefCell<BTreeSet<String>>>,
    prefix: String,
}

impl<'a> Vars<'a> {
    /// Descend one level of the name hierarchy.
    pub fn pp(&self, name: impl std::fmt::Display) -> Vars<'a> {
        let prefix = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{}", self.prefix, name)
        };
        Vars {
            store: self.store,
            used: self.used.clone(),
            prefix,
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.store.config
    }

    /// Fetch a tensor by name, checking its shape.
    pub fn get(&self, shape: &[usize], name: &str) -> Result<Param> {
        let full = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{}", self.prefix, name)
        };
        let p =
            self.store.tensors.get(&full).ok_or_else(|| {
                EncodeError::tensor(&full, "missing from the checkpoint".to_string())
            })?;
        if p.shape != shape {
            return Err(EncodeError::tensor(
                &full,
                format!("shape {:?}, expected {:?}", p.shape, shape),
            ));
        }
        self.used.borrow_mut().insert(full);
        Ok(p.clone())
    }

    /// Reject tensors the model did not ask for.
    pub fn finish(self) -> Result<()> {
        let used = self.used.borrow();
        if let Some(extra) = self.store.tensors.keys().find(|k| !used.contains(*k)) {
            return Err(EncodeError::tensor(
                extra,
                "unexpected tensor (not part of the model)",
            ));
        }
        Ok(())
    }
}
