//! Minimal `.npy` (format 1.0/2.0/3.0) reader and writer for the dtypes tiles use.

use std::io::Write;
use std::path::Path;

use crate::error::{EncodeError, Result};

/// Element types we read or write. `code` is numpy's `descr` without the byte-order mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    Bool,
    U8,
    I8,
    U16,
    I16,
    I32,
    I64,
    F32,
    F64,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::U16 | DType::I16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }
    /// numpy `descr` string (little-endian).
    pub fn descr(self) -> &'static str {
        match self {
            DType::Bool => "|b1",
            DType::U8 => "|u1",
            DType::I8 => "|i1",
            DType::U16 => "<u2",
            DType::I16 => "<i2",
            DType::I32 => "<i4",
            DType::I64 => "<i8",
            DType::F32 => "<f4",
            DType::F64 => "<f8",
        }
    }
    fn parse(descr: &str) -> Option<DType> {
        // Single-byte types may carry '|', '<' or '='; multi-byte ones must
        // be little-endian. (Not `split_at(1)`: the fuzzer found it panics
        // on an empty descr or a multi-byte first character.)
        let code = descr.strip_prefix(['<', '|', '='])?;
        Some(match code {
            "b1" => DType::Bool,
            "u1" => DType::U8,
            "i1" => DType::I8,
            "u2" => DType::U16,
            "i2" => DType::I16,
            "i4" => DType::I32,
            "i8" => DType::I64,
            "f4" => DType::F32,
            "f8" => DType::F64,
            _ => return None,
        })
    }
}

/// A C-ordered array as raw little-endian bytes.
#[derive(Debug, Clone)]
pub struct NpyArray {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl NpyArray {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Values widened to i64 (integer and bool dtypes only).
    pub fn to_i64(&self) -> Option<Vec<i64>> {
        let d = &self.data;
        Some(match self.dtype {
            DType::Bool | DType::U8 => d.iter().map(|&b| b as i64).collect(),
            DType::I8 => d.iter().map(|&b| b as i8 as i64).collect(),
            DType::U16 => d
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]) as i64)
                .collect(),
            DType::I16 => d
                .chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]) as i64)
                .collect(),
            DType::I32 => d
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
            DType::I64 => d
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("chunks_exact(8)")))
                .collect(),
            DType::F32 | DType::F64 => return None,
        })
    }
    /// Values as f32 (any dtype).
    pub fn to_f32(&self) -> Vec<f32> {
        match self.dtype {
            DType::F32 => self
                .data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::F64 => self
                .data
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("chunks_exact(8)")) as f32)
                .collect(),
            _ => self
                .to_i64()
                .expect("integer dtype")
                .into_iter()
                .map(|v| v as f32)
                .collect(),
        }
    }
}

/// Read a whole `.npy` file.
pub fn read(path: &Path) -> Result<NpyArray> {
    let bytes = std::fs::read(path).map_err(|e| EncodeError::io(path, e))?;
    parse(&bytes).map_err(|reason| EncodeError::Npy {
        path: path.to_path_buf(),
        reason,
    })
}

/// Parsed header of a `.npy` file.
#[derive(Debug, Clone)]
pub struct Header {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Byte offset of the data.
    pub data_start: usize,
}

impl Header {
    /// Bytes of data the shape and dtype call for. `parse_header` has
    /// already checked that this does not overflow.
    pub fn data_bytes(&self) -> usize {
        data_bytes(&self.shape, self.dtype).expect("parse_header checked the shape's byte count")
    }
}

/// Elements times item size, or None if that overflows `usize`.
fn data_bytes(shape: &[usize], dtype: DType) -> Option<usize> {
    shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
}

/// numpy's own `np.load` refuses headers over 10,000 bytes
/// (`max_header_size`); ours are under 128.
const MAX_HEADER_BYTES: usize = 10_000;

/// Length of the header block (magic .. end of header text) from the
/// first 12 bytes, or None if `prefix` is too short.
fn header_len(prefix: &[u8]) -> std::result::Result<usize, String> {
    if prefix.len() < 10 || &prefix[..6] != b"\x93NUMPY" {
        return Err("missing \\x93NUMPY magic".into());
    }
    let (start, len) = match prefix[6] {
        1 => (10, u16::from_le_bytes([prefix[8], prefix[9]]) as usize),
        2 | 3 if prefix.len() >= 12 => (
            12,
            u32::from_le_bytes([prefix[8], prefix[9], prefix[10], prefix[11]]) as usize,
        ),
        2 | 3 => return Err("truncated header".into()),
        v => return Err(format!("unsupported format version {v}")),
    };
    if len > MAX_HEADER_BYTES {
        return Err(format!(
            "header of {len} bytes (at most {MAX_HEADER_BYTES})"
        ));
    }
    Ok(start + len)
}

/// Parse the header at the start of `bytes`.
pub fn parse_header(bytes: &[u8]) -> std::result::Result<Header, String> {
    let end = header_len(bytes)?;
    let start = if bytes[6] == 1 { 10 } else { 12 };
    let header = bytes
        .get(start..end)
        .ok_or_else(|| "truncated header".to_string())?;
    let header = std::str::from_utf8(header).map_err(|_| "header is not text".to_string())?;
    let descr = dict_value(header, "descr").ok_or("header has no 'descr'")?;
    let descr = descr
        .trim_start()
        .strip_prefix(['\'', '"'])
        .and_then(|s| s.split(['\'', '"']).next())
        .ok_or("'descr' is not a string")?;
    let dtype = DType::parse(descr).ok_or_else(|| format!("unsupported dtype '{descr}'"))?;
    let fortran = dict_value(header, "fortran_order").ok_or("header has no 'fortran_order'")?;
    if fortran.trim().starts_with("True") {
        return Err("Fortran-ordered arrays are not supported".into());
    }
    let shape_s = dict_value(header, "shape").ok_or("header has no 'shape'")?;
    let shape_s = shape_s.trim();
    let inner = shape_s
        .strip_prefix('(')
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| format!("bad shape '{shape_s}'"))?;
    let mut shape = Vec::new();
    for part in inner.split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        shape.push(
            part.parse::<usize>()
                .map_err(|_| format!("bad shape entry '{part}'"))?,
        );
    }
    if data_bytes(&shape, dtype).is_none() {
        return Err(format!(
            "shape {shape:?} of {} overflows: more bytes than memory can address",
            dtype.descr()
        ));
    }
    Ok(Header {
        dtype,
        shape,
        data_start: end,
    })
}

fn check_body(h: &Header, body: usize) -> std::result::Result<(), String> {
    let want = h.data_bytes();
    if body < want {
        return Err(format!(
            "truncated: shape {:?} needs {want} data bytes, file has {body}",
            h.shape
        ));
    }
    if body > want {
        return Err(format!(
            "{} trailing bytes after the data of shape {:?}",
            body - want,
            h.shape
        ));
    }
    Ok(())
}

/// Parse `.npy` bytes; the error says what is wrong. The shape is checked
/// against the bytes present before anything is copied.
pub fn parse(bytes: &[u8]) -> std::result::Result<NpyArray, String> {
    let h = parse_header(bytes)?;
    let body = &bytes[h.data_start..];
    check_body(&h, body.len())?;
    Ok(NpyArray {
        dtype: h.dtype,
        shape: h.shape,
        data: body.to_vec(),
    })
}

/// Read a large array straight into typed elements, a block at a time, so
/// the raw bytes are never held alongside the result. `check` sees the
/// header first and may reject it; the shape must then match the bytes
/// present before the result is allocated. `conv` turns one element's
/// little-endian bytes into a `T`.
pub fn read_elements<T>(
    path: &Path,
    check: impl FnOnce(&Header) -> Result<()>,
    conv: impl Fn(&[u8]) -> T,
) -> Result<(Header, Vec<T>)> {
    let f = NpyFile::open(path, check)?;
    let size = f.header.dtype.size();
    let mut out = Vec::with_capacity(f.header.data_bytes() / size);
    let mut buf = vec![0u8; READ_PIECE_BYTES / size * size];
    let mut at = 0;
    while at < f.header.data_bytes() {
        let take = (f.header.data_bytes() - at).min(buf.len());
        f.read_at(at, &mut buf[..take])?;
        out.extend(buf[..take].chunks_exact(size).map(&conv));
        at += take;
    }
    Ok((f.header, out))
}

/// Bytes read per call when a file is read in pieces: large enough that
/// system calls cost nothing next to the copy, small enough to be no memory.
pub const READ_PIECE_BYTES: usize = 1 << 20;

/// Fill `buf` from `file` at byte `at`, without moving a shared cursor
/// (so threads may read one file at once).
#[cfg(unix)]
fn read_exact_at(file: &std::fs::File, buf: &mut [u8], at: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, at)
}

/// Fill `buf` from `file` at byte `at` (Windows: `seek_read` may return
/// fewer bytes than asked, so loop as `read_exact` does).
#[cfg(windows)]
fn read_exact_at(file: &std::fs::File, mut buf: &mut [u8], mut at: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_read(buf, at) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                at += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// An open `.npy` file whose header is parsed and whose size matches its
/// shape, read by position: a tile's inputs are read a window of pixels at a
/// time rather than whole (issue 16, "Memory"). Errors name the file.
#[derive(Debug)]
pub struct NpyFile {
    path: std::path::PathBuf,
    /// Read by position (`pread` on Unix, `ReadFile` at an offset on
    /// Windows; its cursor moves, but nothing reads from the cursor): an
    /// encode's counting threads and its window reader read the same file
    /// at once.
    file: std::fs::File,
    pub header: Header,
}

impl NpyFile {
    /// Open `path` and parse its header; `check` sees the header first and
    /// may reject it, then the data must be exactly the bytes present.
    pub fn open(path: &Path, check: impl FnOnce(&Header) -> Result<()>) -> Result<Self> {
        use std::io::Read;
        let npy_err = |reason: String| EncodeError::Npy {
            path: path.to_path_buf(),
            reason,
        };
        let mut f = std::fs::File::open(path).map_err(|e| EncodeError::io(path, e))?;
        let file_len = f.metadata().map_err(|e| EncodeError::io(path, e))?.len();
        let file_len = usize::try_from(file_len)
            .map_err(|_| npy_err(format!("{file_len} bytes: too large to read here")))?;
        let mut prefix = vec![0u8; 12.min(file_len)];
        f.read_exact(&mut prefix)
            .map_err(|e| EncodeError::io(path, e))?;
        let end = header_len(&prefix).map_err(npy_err)?;
        if end > file_len {
            return Err(npy_err("truncated header".into()));
        }
        let mut head = prefix;
        head.resize(end, 0);
        f.read_exact(&mut head[12.min(end)..])
            .map_err(|e| EncodeError::io(path, e))?;
        let h = parse_header(&head).map_err(npy_err)?;
        check(&h)?;
        check_body(&h, file_len - h.data_start).map_err(npy_err)?;
        Ok(NpyFile {
            path: path.to_path_buf(),
            file: f,
            header: h,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Fill `buf` with the data bytes from `offset` (counted from the start
    /// of the data). A file cut short since it was opened is an error naming
    /// it.
    pub fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        let end = offset.checked_add(buf.len());
        if end.is_none_or(|e| e > self.header.data_bytes()) {
            return Err(EncodeError::Npy {
                path: self.path.clone(),
                reason: format!(
                    "read of {} bytes at {offset} is past the data's {} bytes",
                    buf.len(),
                    self.header.data_bytes()
                ),
            });
        }
        let at = (self.header.data_start + offset) as u64;
        read_exact_at(&self.file, buf, at).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => EncodeError::Npy {
                path: self.path.clone(),
                reason: format!(
                    "truncated while being read: shape {:?} needs {} data bytes",
                    self.header.shape,
                    self.header.data_bytes()
                ),
            },
            _ => EncodeError::io(&self.path, e),
        })
    }
}

/// The text after `'key':` up to the next top-level comma (or the tuple for shape).
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let pat1 = format!("'{key}':");
    let pat2 = format!("\"{key}\":");
    let i = header
        .find(&pat1)
        .map(|i| i + pat1.len())
        .or_else(|| header.find(&pat2).map(|i| i + pat2.len()))?;
    Some(&header[i..])
}

/// Serialise an array (format 1.0, header padded to 64 bytes).
pub fn to_bytes(dtype: DType, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let mut out = header_bytes(dtype, shape);
    out.extend_from_slice(data);
    out
}

/// The format 1.0 header (magic to the padded header text) of an array of
/// `dtype` and `shape`, for writers that stream the data after it.
pub fn header_bytes(dtype: DType, shape: &[usize]) -> Vec<u8> {
    let shape_s = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
        dtype.descr(),
        shape_s
    );
    let total = 10 + header.len() + 1;
    let pad = (64 - total % 64) % 64;
    header.push_str(&" ".repeat(pad));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out
}

/// Write an array to `path` (not atomically; callers rename).
pub fn write(path: &Path, dtype: DType, shape: &[usize], data: &[u8]) -> Result<()> {
    let mut f = std::fs::File::create(path).map_err(|e| EncodeError::io(path, e))?;
    f.write_all(&to_bytes(dtype, shape, data))
        .and_then(|_| f.sync_all())
        .map_err(|e| EncodeError::io(path, e))
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let data: Vec<u8> = f32_bytes(&[1.0, -2.5, 3.0, 4.0, 5.0, 6.0]);
        let b = to_bytes(DType::F32, &[2, 3], &data);
        assert_eq!((b.len() - 24) % 64, 0, "header padded to 64 bytes");
        let a = parse(&b).unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.to_f32(), vec![1.0, -2.5, 3.0, 4.0, 5.0, 6.0]);
        let b1 = to_bytes(DType::I32, &[3], &[0u8; 12]);
        assert_eq!(parse(&b1).unwrap().shape, vec![3]);
    }

    #[test]
    fn huge_headers_and_overflowing_shapes_are_errors() {
        let mut b = to_bytes(DType::U8, &[1], &[0]);
        b[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
        let err = parse(&b).unwrap_err();
        assert!(err.contains("at most"), "{err}");
        for descr in ["", "é4", ">f4"] {
            let b = to_bytes(DType::U8, &[1], &[0]);
            let text = String::from_utf8_lossy(&b[10..]).replace("|u1", descr);
            let mut b = b[..10].to_vec();
            b[8..10].copy_from_slice(&(text.len() as u16).to_le_bytes());
            b.extend_from_slice(text.as_bytes());
            b.push(0);
            let err = parse(&b).unwrap_err();
            assert!(err.contains("unsupported dtype"), "{descr:?}: {err}");
        }
        let b = to_bytes(DType::F64, &[usize::MAX / 4, 2], &[]);
        let err = parse(&b).unwrap_err();
        assert!(err.contains("overflows"), "{err}");
    }

    #[test]
    fn truncated_is_an_error() {
        let b = to_bytes(DType::F32, &[2, 3], &[0u8; 24]);
        let err = parse(&b[..b.len() - 1]).unwrap_err();
        assert!(err.contains("truncated"), "{err}");
    }
}
