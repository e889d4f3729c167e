//! A checkpoint's headers: format, config, and each tensor's dtype, shape and place.
//!
//! All of it is checked against the bytes present and the caps before any
//! tensor is read.
//!
//! Nothing here allocates in proportion to a size the file declares: the
//! headers read are capped (a safetensors header, a torch `data.pkl`) and
//! every tensor's extent is checked, with checked arithmetic, against the
//! bytes that hold it. [`CheckpointInfo::read_tensors`] then reads exactly
//! those extents.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::{ckpt_err, safetensors, torch, Param};
use crate::config::ModelConfig;
use crate::error::{EncodeError, Result};

/// Most elements a checkpoint may hold, all tensors together: about 6x the
/// published Large student (43,831,170 parameters), 1 GiB as f32.
pub const MAX_CHECKPOINT_ELEMENTS: usize = 1 << 28;
/// Most axes a tensor may have (the model's have at most 2).
pub const MAX_RANK: usize = 8;

/// The two on-disk formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Format {
    /// `.safetensors`, with the config as JSON in the metadata's `args`.
    SafeTensors,
    /// Upstream `torch.save({"args": ..., "model": state_dict})`: a zip
    /// holding `data.pkl` and one entry per storage.
    Torch,
}

impl Format {
    /// By extension; anything else is sniffed: a zip is torch, otherwise
    /// safetensors.
    pub fn sniff(path: &Path, first_bytes: &[u8]) -> Format {
        match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
            "safetensors" => Format::SafeTensors,
            "pt" | "pth" => Format::Torch,
            _ if first_bytes.starts_with(b"PK\x03\x04") => Format::Torch,
            _ => Format::SafeTensors,
        }
    }
}

/// Element types a checkpoint's tensors may have (all read as f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 => 4,
            DType::F64 => 8,
        }
    }

    /// Little-endian elements to f32.
    fn widen(self, bytes: &[u8], out: &mut Vec<f32>) {
        match self {
            DType::F32 => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            ),
            DType::F64 => out.extend(
                bytes
                    .chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().expect("chunks_exact(8)")) as f32),
            ),
            DType::F16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
            ),
            DType::BF16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            ),
        }
    }
}

/// Where a tensor's elements are: element `i` (multi-index `ix`) is at
/// byte `start + (offset + sum(ix * stride)) * dtype.size()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DataAt {
    pub start: u64,
    pub offset: usize,
    pub stride: Vec<usize>,
    /// Elements from `offset` to the last one addressed (0 for an empty tensor).
    pub span: usize,
}

/// One tensor as the header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMeta {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub(super) at: DataAt,
}

impl TensorMeta {
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// What a checkpoint's headers say, every size checked against the file.
#[derive(Debug, Clone)]
pub struct CheckpointInfo {
    pub path: PathBuf,
    pub format: Format,
    pub config: ModelConfig,
    pub tensors: BTreeMap<String, TensorMeta>,
    /// Size of the file, in bytes.
    pub file_bytes: u64,
}

/// Read the headers of the checkpoint at `path` and check every tensor
/// against the bytes present and the caps; reads no tensor data.
pub fn inspect(path: &Path) -> Result<CheckpointInfo> {
    let mut f = std::fs::File::open(path).map_err(|e| EncodeError::io(path, e))?;
    inspect_reader(&mut f, path)
}

/// [`inspect`], then [`CheckpointInfo::check_model`].
pub fn validate(path: &Path) -> Result<CheckpointInfo> {
    let info = inspect(path)?;
    info.check_model()?;
    Ok(info)
}

/// [`inspect`] on any seekable source; `path` names it in errors and its
/// extension picks the format.
pub fn inspect_reader<R: Read + Seek>(r: &mut R, path: &Path) -> Result<CheckpointInfo> {
    let file_bytes = r
        .seek(SeekFrom::End(0))
        .map_err(|e| EncodeError::io(path, e))?;
    r.seek(SeekFrom::Start(0))
        .map_err(|e| EncodeError::io(path, e))?;
    let mut magic = [0u8; 4];
    let got = read_up_to(r, &mut magic).map_err(|e| EncodeError::io(path, e))?;
    let format = Format::sniff(path, &magic[..got]);
    let header = match format {
        Format::SafeTensors => safetensors::read_header(r, file_bytes),
        Format::Torch => torch::read_header(r, file_bytes),
    }
    .map_err(|reason| ckpt_err(path, reason))?;
    let config = ModelConfig::from_json(&header.args).map_err(|e| ckpt_err(path, e))?;
    let info = CheckpointInfo {
        path: path.to_path_buf(),
        format,
        config,
        tensors: header.tensors,
        file_bytes,
    };
    info.check_total()?;
    Ok(info)
}

/// What a format's header reader returns.
pub(super) struct Header {
    pub args: serde_json::Value,
    pub tensors: BTreeMap<String, TensorMeta>,
}

/// Fill `buf` as far as the source allows.
fn read_up_to<R: Read>(r: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Elements of `shape` and its byte size as `dtype`, each checked against
/// overflow and [`MAX_CHECKPOINT_ELEMENTS`]; the error names the tensor.
pub(super) fn tensor_size(
    name: &str,
    dtype: DType,
    shape: &[usize],
) -> std::result::Result<(usize, usize), String> {
    if shape.len() > MAX_RANK {
        return Err(format!(
            "tensor `{name}`: {} axes (at most {MAX_RANK})",
            shape.len()
        ));
    }
    let elements = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= MAX_CHECKPOINT_ELEMENTS)
        .ok_or_else(|| {
            format!(
                "tensor `{name}`: shape {shape:?} has more than {MAX_CHECKPOINT_ELEMENTS} elements"
            )
        })?;
    Ok((elements, elements * dtype.size()))
}

/// Where a tensor of `shape` and `stride`, `offset` elements into a storage
/// of `storage_elements` that starts at byte `start`, lies: checked that
/// every element it addresses is inside the storage.
pub(super) fn locate(
    name: &str,
    shape: &[usize],
    stride: Vec<usize>,
    offset: usize,
    start: u64,
    storage_elements: usize,
) -> std::result::Result<DataAt, String> {
    if stride.len() != shape.len() {
        return Err(format!(
            "tensor `{name}`: {} strides for {} axes",
            stride.len(),
            shape.len()
        ));
    }
    let span = if shape.contains(&0) {
        Some(0)
    } else {
        shape
            .iter()
            .zip(&stride)
            .try_fold(1usize, |a, (&d, &s)| (d - 1).checked_mul(s)?.checked_add(a))
    };
    let end = span.and_then(|span| offset.checked_add(span));
    match (span, end) {
        (Some(span), Some(end)) if end <= storage_elements => Ok(DataAt {
            start,
            offset,
            stride,
            span,
        }),
        _ => Err(format!(
            "tensor `{name}`: shape {shape:?} with strides {stride:?} from element {offset} \
             reaches past its storage of {storage_elements} elements"
        )),
    }
}

/// Row-major strides of `shape`, or None if they overflow.
pub(super) fn contiguous_strides(shape: &[usize]) -> Option<Vec<usize>> {
    let mut stride = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        stride[i] = stride[i + 1].checked_mul(shape[i + 1])?;
    }
    Some(stride)
}

impl CheckpointInfo {
    /// Elements of all tensors together.
    pub fn elements(&self) -> usize {
        self.tensors.values().map(TensorMeta::elements).sum()
    }

    /// Every tensor together within [`MAX_CHECKPOINT_ELEMENTS`], counting
    /// what will be read (a strided view reads its whole span).
    fn check_total(&self) -> Result<()> {
        let mut total = 0usize;
        for t in self.tensors.values() {
            total = total
                .checked_add(t.at.span.max(t.elements()))
                .filter(|&n| n <= MAX_CHECKPOINT_ELEMENTS)
                .ok_or_else(|| {
                    ckpt_err(
                        &self.path,
                        format!(
                            "tensors hold more than {MAX_CHECKPOINT_ELEMENTS} elements together"
                        ),
                    )
                })?;
        }
        Ok(())
    }

    /// The tensors are exactly those the model of `config` reads, with the
    /// shapes it expects; the error names the first that is not.
    pub fn check_model(&self) -> Result<()> {
        let expected = self.config.tensor_shapes();
        for (name, shape) in &expected {
            match self.tensors.get(name) {
                None => {
                    return Err(ckpt_err(
                        &self.path,
                        format!("tensor `{name}`: missing from the checkpoint"),
                    ))
                }
                Some(t) if &t.shape != shape => {
                    return Err(ckpt_err(
                        &self.path,
                        format!(
                            "tensor `{name}`: shape {:?}, expected {shape:?} for {:?}",
                            t.shape, self.config
                        ),
                    ))
                }
                Some(_) => {}
            }
        }
        if let Some(extra) = self
            .tensors
            .keys()
            .find(|k| !expected.iter().any(|(n, _)| n == *k))
        {
            return Err(ckpt_err(
                &self.path,
                format!("tensor `{extra}`: unexpected (not part of the model)"),
            ));
        }
        Ok(())
    }

    /// Read every tensor as f32 from `r` (the source inspected). Each read
    /// is the extent the header check already bounded.
    pub fn read_tensors<R: Read + Seek>(&self, r: &mut R) -> Result<BTreeMap<String, Param>> {
        let mut out = BTreeMap::new();
        for (name, t) in &self.tensors {
            let data = read_tensor(r, t)
                .map_err(|e| ckpt_err(&self.path, format!("tensor `{name}`: {e}")))?;
            out.insert(
                name.clone(),
                Param {
                    shape: t.shape.clone(),
                    data,
                },
            );
        }
        Ok(out)
    }

    /// [`CheckpointInfo::read_tensors`] from a file, the tensors read at
    /// their offsets on several threads at once: each read's copy out of
    /// the page cache and the faults on its fresh pages are most of the
    /// work, and they go as fast as the cores doing them (the Large
    /// student's 175 MB: 0.11 s on one thread of a 2-core Zen 4).
    pub fn read_tensors_from_file(&self, f: &std::fs::File) -> Result<BTreeMap<String, Param>> {
        use rayon::prelude::*;
        let tensors: Vec<(&String, &TensorMeta)> = self.tensors.iter().collect();
        tensors
            .into_par_iter()
            .map(|(name, t)| {
                let data = read_tensor_with(t, |buf, at| read_exact_at(f, buf, at))
                    .map_err(|e| ckpt_err(&self.path, format!("tensor `{name}`: {e}")))?;
                Ok((
                    name.clone(),
                    Param {
                        shape: t.shape.clone(),
                        data,
                    },
                ))
            })
            .collect()
    }
}

/// Fill `buf` from `f` at byte `at`, leaving the file's position alone
/// (so threads may share the file).
fn read_exact_at(f: &std::fs::File, buf: &mut [u8], at: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(f, buf, at)
    }
    #[cfg(windows)]
    {
        let mut done = 0;
        while done < buf.len() {
            match std::os::windows::fs::FileExt::seek_read(f, &mut buf[done..], at + done as u64) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

fn read_tensor<R: Read + Seek>(r: &mut R, t: &TensorMeta) -> std::io::Result<Vec<f32>> {
    read_tensor_with(t, |buf, at| {
        r.seek(SeekFrom::Start(at))?;
        r.read_exact(buf)
    })
}

/// One tensor as row-major f32, its bytes taken by `read_at(buf, offset)`
/// (one call, for the tensor's whole extent).
fn read_tensor_with(
    t: &TensorMeta,
    mut read_at: impl FnMut(&mut [u8], u64) -> std::io::Result<()>,
) -> std::io::Result<Vec<f32>> {
    let size = t.dtype.size();
    // Both products were bounded when the header was checked.
    let first = t.at.start + (t.at.offset * size) as u64;
    let n = t.elements();
    let contiguous = Some(&t.at.stride) == contiguous_strides(&t.shape).as_ref();
    if t.dtype == DType::F32 && contiguous {
        // Read straight into the f32s: every checkpoint we publish is f32,
        // and reading into bytes, then widening into a second buffer, was
        // a third of the process's start-up (page faults on both, and the
        // copy) for the Large student's 175 MB.
        let mut out = vec![0f32; n];
        read_at(bytemuck::cast_slice_mut(&mut out), first)?;
        if cfg!(target_endian = "big") {
            for x in &mut out {
                *x = f32::from_bits(u32::from_le(x.to_bits()));
            }
        }
        return Ok(out);
    }
    let mut raw = vec![0u8; t.at.span * size];
    read_at(&mut raw, first)?;
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return Ok(out);
    }
    if contiguous {
        t.dtype.widen(&raw[..n * size], &mut out);
        return Ok(out);
    }
    // A strided view: walk the multi-index in row-major order.
    let mut ix = vec![0usize; t.shape.len()];
    for _ in 0..n {
        let at: usize = ix.iter().zip(&t.at.stride).map(|(i, s)| i * s).sum();
        t.dtype.widen(&raw[at * size..(at + 1) * size], &mut out);
        for axis in (0..ix.len()).rev() {
            ix[axis] += 1;
            if ix[axis] < t.shape[axis] {
                break;
            }
            ix[axis] = 0;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_and_half_precision_tensors_read_as_row_major_f32() {
        // Storage [0, 1, 2, 3, 4, 5] as f16; the tensor is its (2, 3)
        // transpose viewed as (3, 2) with strides (1, 3), one element in.
        let storage: Vec<u8> = (0..7)
            .flat_map(|v| half::f16::from_f32(v as f32).to_le_bytes())
            .collect();
        let mut src = std::io::Cursor::new([vec![9u8; 5], storage].concat());
        let at = locate("t", &[3, 2], vec![1, 3], 1, 5, 7).unwrap();
        assert_eq!(at.span, 6);
        let t = TensorMeta {
            dtype: DType::F16,
            shape: vec![3, 2],
            at,
        };
        assert_eq!(
            read_tensor(&mut src, &t).unwrap(),
            vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
        );
        assert!(locate("t", &[3, 2], vec![1, 3], 2, 5, 7).is_err());
        assert!(locate("t", &[3, 2], vec![usize::MAX, 3], 0, 5, 7).is_err());
        assert_eq!(locate("t", &[0, 2], vec![2, 1], 7, 5, 7).unwrap().span, 0);
    }

    #[test]
    fn a_file_read_on_threads_gives_what_a_reader_gives() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/encoder/small");
        for name in ["ckpt.pt", "ckpt.safetensors"] {
            let path = dir.join(name);
            let info = validate(&path).unwrap();
            let f = std::fs::File::open(&path).unwrap();
            let on_threads = info.read_tensors_from_file(&f).unwrap();
            let in_order = info
                .read_tensors(&mut std::fs::File::open(&path).unwrap())
                .unwrap();
            assert_eq!(on_threads.len(), info.tensors.len(), "{name}");
            for (k, p) in &in_order {
                let q = &on_threads[k];
                assert_eq!(p.shape, q.shape, "{name} {k}");
                assert!(
                    p.data
                        .iter()
                        .map(|x| x.to_bits())
                        .eq(q.data.iter().map(|x| x.to_bits())),
                    "{name} {k}: other values"
                );
            }
        }
        // A file shorter than its header says: an error naming the tensor.
        let path = dir.join("ckpt.safetensors");
        let info = validate(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let short = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(short.path(), &bytes[..bytes.len() - 100]).unwrap();
        let err = info
            .read_tensors_from_file(&std::fs::File::open(short.path()).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("tensor `"), "{err}");
    }

    #[test]
    fn both_fixture_formats_inspect_alike() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/encoder/small");
        let pt = validate(&dir.join("ckpt.pt")).unwrap();
        let st = validate(&dir.join("ckpt.safetensors")).unwrap();
        assert_eq!((pt.format, st.format), (Format::Torch, Format::SafeTensors));
        assert_eq!(pt.config, st.config);
        let shapes = |i: &CheckpointInfo| -> Vec<(String, Vec<usize>)> {
            i.tensors
                .iter()
                .map(|(k, t)| (k.clone(), t.shape.clone()))
                .collect()
        };
        assert_eq!(shapes(&pt), shapes(&st));
        assert_eq!(pt.elements(), pt.config.param_count());
    }
}
