//! The upstream `.pt` header, checked against the zip that holds it.
//!
//! The zip's `data.pkl` (parsed by our bounded `pickle`), the `args` and
//! each tensor's storage entry.
//!
//! `torch.save` writes a zip whose entries are all stored uncompressed
//! (PyTorch's `PyTorchStreamWriter`, so that a loader can mmap them):
//! `ARCHIVE/data.pkl` pickles `{"args": dict, "model": state_dict}`, and
//! each tensor is `_rebuild_tensor_v2(storage, offset, size, stride, ...)`
//! over a storage `(“storage”, torch.FloatStorage, key, location, numel)`
//! whose bytes are the entry `ARCHIVE/data/KEY`. We require every entry we
//! read to be stored, so each tensor's extent is checked against bytes
//! that are in the file.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Seek};

use super::inspect::{locate, tensor_size, DType, Header, TensorMeta, MAX_RANK};
use super::pickle::{self, Id, Obj, Pickle};

/// Largest `data.pkl` read: the Large student's is about 25 KB (the small
/// fixture's, 2 layers, is 12,471 bytes); 40x that.
pub const MAX_PICKLE_BYTES: u64 = 1 << 20;

/// One entry of the zip: where its (stored) bytes are and how many.
#[derive(Clone, Copy)]
struct Entry {
    start: u64,
    size: u64,
}

/// The stored entry `name` (its data start and size), checked to lie in
/// the file.
fn entry<R: Read + Seek>(
    zip: &mut zip::ZipArchive<R>,
    name: &str,
    file_bytes: u64,
) -> Result<Entry, String> {
    let e = zip
        .by_name(name)
        .map_err(|e| format!("zip entry `{name}`: {e}"))?;
    if e.encrypted() || e.compression() != zip::CompressionMethod::Stored {
        return Err(format!(
            "zip entry `{name}` is {:?}{}; torch.save stores entries uncompressed",
            e.compression(),
            if e.encrypted() { ", encrypted" } else { "" }
        ));
    }
    let start = e
        .data_start()
        .ok_or_else(|| format!("zip entry `{name}`: no data offset"))?;
    let size = e.size();
    if e.compressed_size() != size || start.checked_add(size).is_none_or(|end| end > file_bytes) {
        return Err(format!(
            "zip entry `{name}`: {size} bytes at {start}, past the end of the {file_bytes}-byte file"
        ));
    }
    Ok(Entry { start, size })
}

pub(super) fn read_header<R: Read + Seek>(r: &mut R, file_bytes: u64) -> Result<Header, String> {
    r.rewind().map_err(|e| e.to_string())?;
    let mut zip =
        zip::ZipArchive::new(r).map_err(|e| format!("not a torch zip checkpoint: {e}"))?;
    let pkls: Vec<String> = zip
        .file_names()
        .filter(|n| n.ends_with("data.pkl"))
        .take(2)
        .map(str::to_string)
        .collect();
    let pkl = match pkls.as_slice() {
        [] => return Err("no data.pkl in the zip".into()),
        [one] => one.clone(),
        [a, b, ..] => return Err(format!("two pickles in the zip: `{a}` and `{b}`")),
    };
    let prefix = pkl.strip_suffix("data.pkl").unwrap_or_default().to_string();

    let byteorder = format!("{prefix}byteorder");
    if zip.index_for_name(&byteorder).is_some() {
        let e = entry(&mut zip, &byteorder, file_bytes)?;
        let mut order = Vec::new();
        zip.by_name(&byteorder)
            .map_err(|e| e.to_string())?
            .take(16)
            .read_to_end(&mut order)
            .map_err(|e| format!("{byteorder}: {e}"))?;
        if e.size > 16 || order != b"little" {
            return Err(format!(
                "{byteorder} is `{}`; only little-endian checkpoints are read",
                String::from_utf8_lossy(&order)
            ));
        }
    }

    let e = entry(&mut zip, &pkl, file_bytes)?;
    if e.size > MAX_PICKLE_BYTES {
        return Err(format!(
            "{pkl} is {} bytes (at most {MAX_PICKLE_BYTES})",
            e.size
        ));
    }
    let mut bytes = Vec::with_capacity(e.size as usize);
    zip.by_name(&pkl)
        .map_err(|e| e.to_string())?
        .take(e.size)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{pkl}: {e}"))?;
    let table = tensor_table(&bytes).map_err(|e| format!("{pkl}: {e}"))?;

    let mut entries: HashMap<String, Entry> = HashMap::new();
    let mut tensors = BTreeMap::new();
    for t in table.tensors {
        let storage = format!("{prefix}data/{}", t.storage_key);
        let e = match entries.get(&storage) {
            Some(e) => *e,
            None => {
                let e = entry(&mut zip, &storage, file_bytes)
                    .map_err(|e| format!("tensor `{}`: {e}", t.name))?;
                entries.insert(storage.clone(), e);
                e
            }
        };
        let bytes = t.storage_elements.checked_mul(t.dtype.size() as u64);
        if bytes != Some(e.size) {
            return Err(format!(
                "tensor `{}`: storage `{}` declares {} elements of {:?}, its entry holds {} bytes",
                t.name, t.storage_key, t.storage_elements, t.dtype, e.size
            ));
        }
        // Fits: the entry is in the file, whose size is a u64 byte count.
        let storage_elements = usize::try_from(t.storage_elements)
            .map_err(|_| format!("tensor `{}`: storage too large to address here", t.name))?;
        tensor_size(&t.name, t.dtype, &t.shape)?;
        let at = locate(
            &t.name,
            &t.shape,
            t.stride,
            t.offset,
            e.start,
            storage_elements,
        )?;
        if tensors.contains_key(&t.name) {
            return Err(format!("tensor `{}` appears twice", t.name));
        }
        tensors.insert(
            t.name,
            TensorMeta {
                dtype: t.dtype,
                shape: t.shape,
                at,
            },
        );
    }
    Ok(Header {
        args: table.args,
        tensors,
    })
}

/// What `data.pkl` says, before the zip is consulted.
#[derive(Debug)]
pub struct TensorTable {
    pub args: serde_json::Value,
    pub tensors: Vec<TensorRecord>,
}

/// One `_rebuild_tensor_v2` call, unchecked against the zip.
#[derive(Debug)]
pub struct TensorRecord {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub stride: Vec<usize>,
    pub offset: usize,
    pub storage_key: String,
    pub storage_elements: u64,
}

/// Parse a `data.pkl` into the `args` and the state_dict's tensor records.
/// Public for the fuzz target (`encoder/fuzz`).
pub fn tensor_table(bytes: &[u8]) -> Result<TensorTable, String> {
    let p = pickle::parse(bytes)?;
    if p.dict(p.root).is_none() {
        return Err(format!(
            "top level is a {}, not a dict of {{args, model}}",
            pickle::kind(p.get(p.root))
        ));
    }
    let args = p.dict_get(p.root, "args").ok_or("no `args` entry")?;
    let args = pickle::to_json(&p, args).map_err(|e| format!("`args`: {e}"))?;
    let model = p.dict_get(p.root, "model").ok_or("no `model` entry")?;
    let entries = p
        .dict(model)
        .ok_or_else(|| format!("`model` is a {}, not a dict", pickle::kind(p.get(model))))?;
    let mut tensors = Vec::with_capacity(entries.len());
    for &(k, v) in entries {
        let name = p
            .str(k)
            .ok_or("a `model` key that is not a string")?
            .to_string();
        let rec = rebuild(&p, v, &name, 0).map_err(|e| format!("tensor `{name}`: {e}"))?;
        tensors.push(rec);
    }
    Ok(TensorTable { args, tensors })
}

/// A global's (module, name), if `id` is one.
fn global(p: &Pickle, id: Id) -> Option<(&str, &str)> {
    match p.get(id) {
        Obj::Global { module, name } => Some((module, name)),
        _ => None,
    }
}

/// The items of the tuple `id`.
fn tuple<'a>(p: &'a Pickle, id: Id, what: &str) -> Result<&'a [Id], String> {
    match p.get(id) {
        Obj::Tuple(items) => Ok(items),
        other => Err(format!("{what} is a {}, not a tuple", pickle::kind(other))),
    }
}

fn uint(p: &Pickle, id: Id, what: &str) -> Result<u64, String> {
    p.uint(id).ok_or_else(|| {
        format!(
            "{what} is a {}, not a non-negative int",
            pickle::kind(p.get(id))
        )
    })
}

fn usizes(p: &Pickle, id: Id, what: &str) -> Result<Vec<usize>, String> {
    let items = tuple(p, id, what)?;
    if items.len() > MAX_RANK {
        return Err(format!(
            "{what} has {} axes (at most {MAX_RANK})",
            items.len()
        ));
    }
    items
        .iter()
        .map(|&i| usize::try_from(uint(p, i, what)?).map_err(|_| format!("{what}: too large")))
        .collect()
}

/// The tensor that the value `id` rebuilds: `_rebuild_tensor_v2(...)`,
/// possibly wrapped in `_rebuild_parameter` or `_rebuild_from_type_v2`.
fn rebuild(p: &Pickle, id: Id, name: &str, depth: usize) -> Result<TensorRecord, String> {
    let (callable, args) = match p.get(id) {
        Obj::Reduce { callable, args } if depth < 4 => (*callable, *args),
        other => return Err(format!("a {}, not a tensor", pickle::kind(other))),
    };
    let args = tuple(p, args, "the rebuild arguments")?;
    match global(p, callable) {
        Some(("torch._utils", "_rebuild_parameter")) => {
            let data = *args.first().ok_or("_rebuild_parameter without data")?;
            rebuild(p, data, name, depth + 1)
        }
        // _rebuild_from_type_v2(func, type, args, state): func(*args).
        Some(("torch._tensor", "_rebuild_from_type_v2")) => {
            let (&func, &inner) = match args {
                [func, _, inner, ..] => (func, inner),
                _ => return Err("_rebuild_from_type_v2 with fewer than 3 arguments".into()),
            };
            let inner = tuple(p, inner, "the inner arguments")?;
            match global(p, func) {
                Some(("torch._utils", "_rebuild_tensor_v2")) => rebuild_tensor_v2(p, inner, name),
                _ => Err("_rebuild_from_type_v2 of something but _rebuild_tensor_v2".into()),
            }
        }
        Some(("torch._utils", "_rebuild_tensor_v2")) => rebuild_tensor_v2(p, args, name),
        Some((m, n)) => Err(format!("rebuilt by {m}.{n}, not a tensor")),
        None => Err("a call of something that is not a global".into()),
    }
}

/// `_rebuild_tensor_v2(storage, storage_offset, size, stride, ...)`.
fn rebuild_tensor_v2(p: &Pickle, args: &[Id], name: &str) -> Result<TensorRecord, String> {
    let [storage, offset, size, stride, ..] = *args else {
        return Err(format!(
            "_rebuild_tensor_v2 with {} arguments (at least 4)",
            args.len()
        ));
    };
    let storage = match p.get(storage) {
        Obj::PersId(t) => tuple(p, *t, "the storage record")?,
        other => return Err(format!("storage is a {}", pickle::kind(other))),
    };
    // ("storage", torch.XStorage, key, location, numel)
    let [tag, class, key, _location, numel, ..] = *storage else {
        return Err(format!(
            "storage record with {} fields (5 expected)",
            storage.len()
        ));
    };
    if p.str(tag) != Some("storage") {
        return Err("storage record not tagged `storage`".into());
    }
    let dtype = match global(p, class) {
        Some(("torch", "FloatStorage")) => DType::F32,
        Some(("torch", "DoubleStorage")) => DType::F64,
        Some(("torch", "HalfStorage")) => DType::F16,
        Some(("torch", "BFloat16Storage")) => DType::BF16,
        Some((m, n)) => {
            return Err(format!(
                "storage type {m}.{n} (not a float the encoder reads)"
            ))
        }
        None => return Err("storage type is not a class".into()),
    };
    let storage_key = p
        .str(key)
        .filter(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        .ok_or("storage key is not a plain name")?
        .to_string();
    Ok(TensorRecord {
        name: name.to_string(),
        dtype,
        shape: usizes(p, size, "size")?,
        stride: usizes(p, stride, "stride")?,
        offset: usize::try_from(uint(p, offset, "storage offset")?)
            .map_err(|_| "storage offset too large".to_string())?,
        storage_key,
        storage_elements: uint(p, numel, "storage size")?,
    })
}
