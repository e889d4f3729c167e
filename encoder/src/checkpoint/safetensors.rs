//! The `.safetensors` header, checked against the file's size.
//!
//! Its length, its JSON, and each tensor's dtype, shape and data offsets.
//!
//! The `safetensors` crate checks the same things (a header of at most
//! 100 MB, shape products with `checked_mul`, offsets that tile the data
//! exactly) but only on the whole file in memory; this reads the header
//! alone, with a smaller cap, and names the tensor at fault.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};

use serde::Deserialize;
use serde_json::Value;

use super::inspect::{locate, tensor_size, DType, Header, TensorMeta};

/// Largest header read: the Large student's is about 12 KB (one entry of
/// ~100 bytes per tensor); 1,000x that.
pub const MAX_HEADER_BYTES: u64 = 16 << 20;

#[derive(Deserialize)]
struct Entry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

pub(super) fn read_header<R: Read + Seek>(r: &mut R, file_bytes: u64) -> Result<Header, String> {
    let io = |e: std::io::Error| format!("reading the header: {e}");
    r.seek(SeekFrom::Start(0)).map_err(io)?;
    if file_bytes < 8 {
        return Err(format!(
            "{file_bytes} bytes: too short for a safetensors header"
        ));
    }
    let mut n = [0u8; 8];
    r.read_exact(&mut n).map_err(io)?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER_BYTES || n > file_bytes - 8 {
        return Err(format!(
            "header length {n} bytes, but the file holds {} after it (at most {MAX_HEADER_BYTES})",
            file_bytes - 8
        ));
    }
    let mut text = vec![0u8; n as usize];
    r.read_exact(&mut text).map_err(io)?;
    let json: serde_json::Map<String, Value> =
        serde_json::from_slice(&text).map_err(|e| format!("header is not a JSON object: {e}"))?;
    let data_start = 8 + n;
    let data_bytes = file_bytes - data_start;

    let mut args = None;
    let mut entries = Vec::new();
    for (name, v) in json {
        if name == "__metadata__" {
            let meta: BTreeMap<String, String> = serde_json::from_value(v)
                .map_err(|e| format!("`__metadata__` is not a map of strings: {e}"))?;
            if let Some(a) = meta.get("args") {
                args = Some(
                    serde_json::from_str::<Value>(a)
                        .map_err(|e| format!("metadata `args` is not JSON: {e}"))?,
                );
            }
            continue;
        }
        let e: Entry = serde_json::from_value(v).map_err(|e| format!("tensor `{name}`: {e}"))?;
        entries.push((name, e));
    }
    let args = args.ok_or("no `args` in the safetensors metadata")?;

    // The data must be tiled exactly, in offset order, as the crate requires.
    entries.sort_by_key(|(_, e)| e.data_offsets);
    let mut next = 0u64;
    let mut tensors = BTreeMap::new();
    for (name, e) in entries {
        let dtype = match e.dtype.as_str() {
            "F32" => DType::F32,
            "F64" => DType::F64,
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            other => {
                return Err(format!(
                    "tensor `{name}`: dtype {other} (the encoder reads F32, F64, F16 and BF16)"
                ))
            }
        };
        let shape = e
            .shape
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<Vec<usize>, _>>()
            .map_err(|_| format!("tensor `{name}`: shape {:?} does not fit here", e.shape))?;
        let (elements, bytes) = tensor_size(&name, dtype, &shape)?;
        let (begin, end) = e.data_offsets;
        if begin != next || end < begin || end > data_bytes {
            return Err(format!(
                "tensor `{name}`: data at [{begin}, {end}) of {data_bytes} data bytes \
                 (expected to start at {next})"
            ));
        }
        if end - begin != bytes as u64 {
            return Err(format!(
                "tensor `{name}`: shape {shape:?} of {} needs {bytes} bytes, its data_offsets hold {}",
                e.dtype,
                end - begin
            ));
        }
        next = end;
        let stride = super::inspect::contiguous_strides(&shape)
            .ok_or_else(|| format!("tensor `{name}`: strides of {shape:?} overflow"))?;
        let at = locate(&name, &shape, stride, 0, data_start + begin, elements)?;
        tensors.insert(name, TensorMeta { dtype, shape, at });
    }
    if next != data_bytes {
        return Err(format!(
            "the tensors cover {next} of the {data_bytes} data bytes"
        ));
    }
    Ok(Header { args, tensors })
}
