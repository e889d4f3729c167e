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
        let info = inspect_reader(&mut f, path)?;
        info.check_model()?;
        let tensors = info.read_tensors_from_file(&f)?;
        Ok(Checkpoint {
            path: path.to_path_buf(),
            config: info.config,
            tensors,
        })
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

    /// A view that copies each tensor it hands out; the checkpoint stays whole.
    pub fn vars(&self) -> Vars<'_> {
        Vars::over(self.config, Store::Borrowed(&self.tensors))
    }

    /// A view that hands each tensor out by moving it: loading a model this
    /// way holds each weight once, not twice (the Large student is 175 MB
    /// of f32; the copy was a fifth of the process's start-up).
    pub fn into_vars(self) -> Vars<'static> {
        Vars::over(self.config, Store::Owned(RefCell::new(self.tensors)))
    }
}

pub(crate) fn ckpt_err(path: &Path, reason: impl std::fmt::Display) -> EncodeError {
    EncodeError::Checkpoint {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Where a [`Vars`] takes its tensors from: a borrowed checkpoint (each
/// tensor copied out) or one it owns (each tensor moved out).
enum Store<'a> {
    Borrowed(&'a BTreeMap<String, Param>),
    Owned(RefCell<BTreeMap<String, Param>>),
}

/// Hierarchical view into a checkpoint: `vars.pp("s2_backbone").get(&[d, 10], "embedding.0.weight")`.
/// Every tensor fetched is recorded so [`Vars::finish`] can reject leftovers.
#[derive(Clone)]
pub struct Vars<'a> {
    config: ModelConfig,
    store: std::rc::Rc<Store<'a>>,
    used: std::rc::Rc<RefCell<BTreeSet<String>>>,
    prefix: String,
}

impl<'a> Vars<'a> {
    fn over(config: ModelConfig, store: Store<'a>) -> Self {
        Vars {
            config,
            store: std::rc::Rc::new(store),
            used: std::rc::Rc::new(RefCell::new(BTreeSet::new())),
            prefix: String::new(),
        }
    }

    /// Descend one level of the name hierarchy.
    pub fn pp(&self, name: impl std::fmt::Display) -> Vars<'a> {
        let prefix = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{}", self.prefix, name)
        };
        Vars {
            config: self.config,
            store: self.store.clone(),
            used: self.used.clone(),
            prefix,
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Fetch a tensor by name, checking its shape.
    pub fn get(&self, shape: &[usize], name: &str) -> Result<Param> {
        let full = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{}", self.prefix, name)
        };
        let missing = || EncodeError::tensor(&full, "missing from the checkpoint".to_string());
        let shaped = |p: &Param| {
            if p.shape == shape {
                Ok(())
            } else {
                Err(EncodeError::tensor(
                    &full,
                    format!("shape {:?}, expected {:?}", p.shape, shape),
                ))
            }
        };
        let p = match &*self.store {
            Store::Borrowed(tensors) => {
                let p = tensors.get(&full).ok_or_else(missing)?;
                shaped(p)?;
                p.clone()
            }
            Store::Owned(tensors) => {
                let mut tensors = tensors.borrow_mut();
                if self.used.borrow().contains(&full) {
                    // Moved out already: the model asked for it twice.
                    return Err(EncodeError::tensor(
                        &full,
                        "asked for twice while loading the model".to_string(),
                    ));
                }
                shaped(tensors.get(&full).ok_or_else(missing)?)?;
                tensors.remove(&full).ok_or_else(missing)?
            }
        };
        self.used.borrow_mut().insert(full);
        Ok(p)
    }

    /// Reject tensors the model did not ask for.
    pub fn finish(self) -> Result<()> {
        let used = self.used.borrow();
        let extra = match &*self.store {
            Store::Borrowed(tensors) => tensors.keys().find(|k| !used.contains(*k)).cloned(),
            // What is left was never asked for.
            Store::Owned(tensors) => tensors.borrow().keys().next().cloned(),
        };
        if let Some(extra) = extra {
            return Err(EncodeError::tensor(
                &extra,
                "unexpected tensor (not part of the model)",
            ));
        }
        Ok(())
    }
}
