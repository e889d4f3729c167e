//! Checkpoint loading (`.pt` torch zip pickle or `.safetensors`) and a
//! VarBuilder-like hierarchical lookup with shape checks.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use candle_core::pickle;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{EncodeError, Result};

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
    /// else is sniffed: a zip is torch, otherwise safetensors).
    pub fn load(path: &Path) -> Result<Self> {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        let is_zip = || -> Result<bool> {
            let mut f = std::fs::File::open(path).map_err(|e| EncodeError::io(path, e))?;
            let mut magic = [0u8; 4];
            Ok(f.read_exact(&mut magic).is_ok() && &magic == b"PK\x03\x04")
        };
        match ext {
            "safetensors" => load_safetensors(path),
            "pt" | "pth" => load_torch(path),
            _ if is_zip()? => load_torch(path),
            _ => load_safetensors(path),
        }
    }

    pub fn vars(&self) -> Vars<'_> {
        Vars {
            store: self,
            used: std::rc::Rc::new(RefCell::new(BTreeSet::new())),
            prefix: String::new(),
        }
    }
}

fn ckpt_err(path: &Path, reason: impl std::fmt::Display) -> EncodeError {
    EncodeError::Checkpoint {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn load_safetensors(path: &Path) -> Result<Checkpoint> {
    use safetensors::{Dtype, SafeTensors};
    let bytes = std::fs::read(path).map_err(|e| EncodeError::io(path, e))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| ckpt_err(path, e))?;
    let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| ckpt_err(path, e))?;
    let args = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("args"))
        .ok_or_else(|| ckpt_err(path, "no `args` in the safetensors metadata"))?;
    let args: Value = serde_json::from_str(args)
        .map_err(|e| ckpt_err(path, format!("metadata `args` is not JSON: {e}")))?;
    let config = ModelConfig::from_json(&args).map_err(|e| ckpt_err(path, e))?;
    let mut tensors = BTreeMap::new();
    for (name, view) in st.tensors() {
        let data = view.data();
        let data: Vec<f32> = match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 | Dtype::BF16 | Dtype::F64 => {
                let dt = match view.dtype() {
                    Dtype::F16 => candle_core::DType::F16,
                    Dtype::BF16 => candle_core::DType::BF16,
                    _ => candle_core::DType::F64,
                };
                let t = candle_core::Tensor::from_raw_buffer(
                    data,
                    dt,
                    view.shape(),
                    &candle_core::Device::Cpu,
                )
                .and_then(|t| t.to_dtype(candle_core::DType::F32))
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(|e| EncodeError::tensor(&name, e.to_string()))?;
                t
            }
            other => {
                return Err(EncodeError::tensor(
                    &name,
                    format!("unsupported dtype {other:?}"),
                ))
            }
        };
        tensors.insert(
            name,
            Param {
                shape: view.shape().to_vec(),
                data,
            },
        );
    }
    Ok(Checkpoint {
        path: path.to_path_buf(),
        config,
        tensors,
    })
}

fn load_torch(path: &Path) -> Result<Checkpoint> {
    let args = read_torch_args(path)?;
    let config = ModelConfig::from_json(&args).map_err(|e| ckpt_err(path, e))?;
    let pth = pickle::PthTensors::new(path, Some("model")).map_err(|e| ckpt_err(path, e))?;
    let mut tensors = BTreeMap::new();
    let names: Vec<String> = pth.tensor_infos().keys().cloned().collect();
    for name in names {
        let t = pth
            .get(&name)
            .map_err(|e| EncodeError::tensor(&name, e.to_string()))?
            .ok_or_else(|| EncodeError::tensor(&name, "listed but unreadable"))?;
        let shape = t.dims().to_vec();
        let data = t
            .to_dtype(candle_core::DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| EncodeError::tensor(&name, e.to_string()))?;
        tensors.insert(name, Param { shape, data });
    }
    Ok(Checkpoint {
        path: path.to_path_buf(),
        config,
        tensors,
    })
}

/// The `args` entry of the pickled `{"args": ..., "model": ...}` dict, as JSON.
fn read_torch_args(path: &Path) -> Result<Value> {
    let f = std::fs::File::open(path).map_err(|e| EncodeError::io(path, e))?;
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(f))
        .map_err(|e| ckpt_err(path, format!("not a torch zip checkpoint: {e}")))?;
    let pkl = zip
        .file_names()
        .find(|n| n.ends_with("data.pkl"))
        .map(str::to_string)
        .ok_or_else(|| ckpt_err(path, "no data.pkl in the zip"))?;
    let reader = zip.by_name(&pkl).map_err(|e| ckpt_err(path, e))?;
    let mut reader = std::io::BufReader::new(reader);
    let mut stack = pickle::Stack::empty();
    stack
        .read_loop(&mut reader)
        .map_err(|e| ckpt_err(path, format!("data.pkl: {e}")))?;
    let obj = stack
        .finalize()
        .map_err(|e| ckpt_err(path, format!("data.pkl: {e}")))?;
    let pickle::Object::Dict(entries) = obj else {
        return Err(ckpt_err(path, "top level is not a dict of {args, model}"));
    };
    let args = entries
        .into_iter()
        .find(|(k, _)| *k == pickle::Object::Unicode("args".into()))
        .map(|(_, v)| v)
        .ok_or_else(|| ckpt_err(path, "no `args` entry"))?;
    pickle_to_json(args).map_err(|e| ckpt_err(path, format!("`args`: {e}")))
}

fn pickle_to_json(o: pickle::Object) -> std::result::Result<Value, String> {
    use pickle::Object as O;
    Ok(match o {
        O::Int(i) => Value::from(i),
        O::Long(i) => Value::from(i),
        O::Float(f) => Value::from(f),
        O::Bool(b) => Value::from(b),
        O::Unicode(s) => Value::from(s),
        O::None => Value::Null,
        O::List(v) | O::Tuple(v) => Value::Array(
            v.into_iter()
                .map(pickle_to_json)
                .collect::<std::result::Result<_, _>>()?,
        ),
        O::Dict(kv) => {
            let mut m = serde_json::Map::new();
            for (k, v) in kv {
                let O::Unicode(k) = k else {
                    return Err(format!("non-string key {k:?}"));
                };
                // Options upstream may store as objects we do not need.
                m.insert(k, pickle_to_json(v).unwrap_or(Value::Null));
            }
            Value::Object(m)
        }
        other => return Err(format!("unsupported value {other:?}")),
    })
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
