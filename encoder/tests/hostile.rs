//! Hostile model and tile files: each is refused with an error that names the
//! file and the problem, never a panic or an abort. A failed allocation
//! aborts the process, so every checkpoint case runs `tessera-encode` as a
//! child under a 2 GiB address-space limit (`ulimit -v`) and checks that it
//! exited with a status, not a signal.

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use tessera_encoder::npy;
use tessera_encoder::TileInputs;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/encoder");

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-hostile-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn copy_tile(dst: &Path) {
    let src = Path::new(FIXTURES).join("small/tile");
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
}

/// A `.npy` header claiming `shape` (u16), followed by `body`.
fn npy_claiming(shape: &str, body: &[u8]) -> Vec<u8> {
    let mut header = format!("{{'descr': '<u2', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(body);
    out
}

#[test]
fn npy_shape_overflowing_usize_is_an_error() {
    // 2^32 * 2^32 * 10 * 2 bytes wraps to 0 in release, so the empty body
    // "matched"; in debug the multiplication panicked.
    let bytes = npy_claiming("(1, 4294967296, 4294967296, 10)", b"");
    let err = npy::parse(&bytes).unwrap_err();
    assert!(err.contains("overflow"), "{err}");

    let d = scratch("npy-overflow");
    copy_tile(&d);
    std::fs::write(d.join("bands.npy"), &bytes).unwrap();
    let err = TileInputs::read(&d).unwrap_err().to_string();
    assert!(
        err.contains("bands.npy") && err.contains("overflow"),
        "{err}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn npy_tile_dimensions_over_the_caps_are_refused_before_reading() {
    for (shape, says) in [
        ("(1, 5000, 1, 10)", "height"),
        ("(1, 1, 5000, 10)", "width"),
        ("(5000, 1, 1, 10)", "frames"),
    ] {
        let n: usize = shape
            .trim_matches(['(', ')'])
            .split(',')
            .map(|s| s.trim().parse::<usize>().unwrap())
            .product();
        let bytes = npy_claiming(shape, &vec![0u8; n * 2]);
        let d = scratch("npy-cap");
        copy_tile(&d);
        std::fs::write(d.join("bands.npy"), &bytes).unwrap();
        let err = TileInputs::read(&d).unwrap_err().to_string();
        assert!(
            err.contains("bands.npy") && err.contains(says) && err.contains("at most"),
            "{shape}: {err}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
    // A body shorter than the shape says is refused without reading it.
    let bytes = npy_claiming("(3, 4, 5, 10)", &[0u8; 10]);
    let err = npy::parse(&bytes).unwrap_err();
    assert!(err.contains("truncated"), "{err}");
}

/// Pickle protocol 2, written by hand: just the opcodes `torch.save` uses.
struct Pickle(Vec<u8>);

impl Pickle {
    fn new() -> Self {
        Pickle(vec![0x80, 2])
    }
    fn op(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.0.push(b'X');
        self.0.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.op(s.as_bytes())
    }
    fn int(&mut self, v: u64) -> &mut Self {
        if v <= i32::MAX as u64 {
            self.0.push(b'J');
            self.op(&(v as i32).to_le_bytes())
        } else {
            self.op(&[0x8a, 8]).op(&v.to_le_bytes())
        }
    }
    fn global(&mut self, module: &str, name: &str) -> &mut Self {
        self.op(format!("c{module}\n{name}\n").as_bytes())
    }
    fn tuple(&mut self, v: &[u64]) -> &mut Self {
        self.op(b"(");
        for &x in v {
            self.int(x);
        }
        self.op(b"t")
    }
    /// `{"args": {small model}, "model": OrderedDict(...)`, leaving the
    /// model dict open for tensors; [`Pickle::end`] closes both.
    fn checkpoint_start() -> Self {
        let mut p = Pickle::new();
        p.op(b"}(").str("args").op(b"}(");
        for (k, v) in [
            ("latent_dim", 16),
            ("num_layers", 2),
            ("nhead", 4),
            ("dim_feedforward", 128),
        ] {
            p.str(k).int(v);
        }
        p.op(b"u").str("model");
        p.global("collections", "OrderedDict").op(b")R(");
        p
    }
    /// One `_rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())`.
    fn tensor(&mut self, name: &str, key: &str, numel: u64, shape: &[u64]) -> &mut Self {
        let mut stride = vec![1u64; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            stride[i] = stride[i + 1].wrapping_mul(shape[i + 1]);
        }
        self.str(name).global("torch._utils", "_rebuild_tensor_v2");
        self.op(b"((")
            .str("storage")
            .global("torch", "FloatStorage");
        self.str(key).str("cpu").int(numel).op(b"tQ");
        self.int(0).tuple(shape).tuple(&stride).op(&[0x89]);
        self.global("collections", "OrderedDict")
            .op(b")Rt")
            .op(b"R")
    }
    fn end(&mut self) -> Vec<u8> {
        self.op(b"uu.");
        self.0.clone()
    }
}

/// A torch zip (every entry stored, as `torch.save` writes it).
fn torch_zip(path: &Path, pickle: &[u8], storages: &[(&str, Vec<u8>)]) {
    let f = std::fs::File::create(path).unwrap();
    let mut z = zip::ZipWriter::new(f);
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    z.start_file("ckpt/data.pkl", opts).unwrap();
    z.write_all(pickle).unwrap();
    for (key, data) in storages {
        z.start_file(format!("ckpt/data/{key}"), opts).unwrap();
        z.write_all(data).unwrap();
    }
    z.finish().unwrap();
}

/// Runs an encoding of the fixture tile with `ckpt`, then `tessera-encode
/// inspect`, each under `ulimit -v` 2 GiB; both must fail with an exit status
/// (not a signal) and an error naming the file and containing `says`.
fn refused_without_abort(ckpt: &Path, says: &str) {
    let d = ckpt.parent().unwrap();
    let tile = d.join("tile");
    if !tile.exists() {
        copy_tile(&tile);
    }
    let exe = env!("CARGO_BIN_EXE_tessera-encode");
    let out = d.join("out");
    let runs: [Vec<&std::ffi::OsStr>; 2] = [
        vec![
            "--backend".as_ref(),
            "cpu".as_ref(),
            "--ckpt".as_ref(),
            ckpt.as_os_str(),
            "--tile".as_ref(),
            tile.as_os_str(),
            "--out-dir".as_ref(),
            out.as_os_str(),
        ],
        vec!["inspect".as_ref(), "--ckpt".as_ref(), ckpt.as_os_str()],
    ];
    for args in runs {
        let o = Command::new("sh")
            .arg("-c")
            .arg("ulimit -v 2097152 && exec \"$@\"")
            .arg("sh")
            .arg(exe)
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.signal().is_none(),
            "{args:?}: killed by signal {:?}: {stderr}",
            o.status.signal()
        );
        assert!(!o.status.success(), "{args:?} accepted {}", ckpt.display());
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
        let name = ckpt.file_name().unwrap().to_str().unwrap();
        assert!(
            stderr.contains(name) && stderr.contains(says),
            "{args:?}: error does not name {name} and `{says}`: {stderr}"
        );
    }
}

#[test]
fn pt_tensor_shape_larger_than_its_storage_is_refused() {
    let d = scratch("pt-huge-shape");
    // A 2^40-element tensor over a 4-byte storage: candle allocated 4 TiB.
    let pkl = Pickle::checkpoint_start()
        .tensor("dim_reducer.4.bias", "0", 1, &[1 << 20, 1 << 20])
        .end();
    let path = d.join("huge.pt");
    torch_zip(&path, &pkl, &[("0", vec![0u8; 4])]);
    refused_without_abort(&path, "dim_reducer.4.bias");
    // The storage claims 2^31 - 1 elements, its zip entry holds 4 bytes.
    let pkl = Pickle::checkpoint_start()
        .tensor("dim_reducer.4.bias", "0", (1 << 31) - 1, &[(1 << 31) - 1])
        .end();
    let path = d.join("lying-storage.pt");
    torch_zip(&path, &pkl, &[("0", vec![0u8; 4])]);
    refused_without_abort(&path, "dim_reducer.4.bias");
    // A shape whose product overflows usize.
    let pkl = Pickle::checkpoint_start()
        .tensor("dim_reducer.4.bias", "0", 1, &[1 << 30, 1 << 30, 1 << 30])
        .end();
    let path = d.join("overflow.pt");
    torch_zip(&path, &pkl, &[("0", vec![0u8; 4])]);
    refused_without_abort(&path, "dim_reducer.4.bias");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn pt_pickle_lengths_past_the_end_are_refused() {
    let d = scratch("pt-pickle");
    // BINUNICODE declaring 4 GiB: candle allocated it before reading.
    let mut p = Pickle::checkpoint_start();
    p.op(b"X").op(&0xffff_fff0u32.to_le_bytes());
    let path = d.join("long-string.pt");
    torch_zip(&path, &p.0, &[]);
    refused_without_abort(&path, "data.pkl");

    // 500,000 nested 1-tuples as `args`: candle's recursive drop and our old
    // JSON conversion overflowed the stack.
    let mut p = Pickle::new();
    p.op(b"}(").str("args").op(b"N");
    p.op(&vec![0x85u8; 500_000]);
    p.str("model").op(b"}u.");
    let path = d.join("deep.pt");
    torch_zip(&path, &p.0, &[]);
    refused_without_abort(&path, "data.pkl");

    // LONG1 with 200 bytes: candle shifted an i64 by up to 1,592 bits.
    let mut p = Pickle::checkpoint_start();
    p.op(&[0x8a, 200]).op(&[0xff; 200]);
    let path = d.join("long1.pt");
    torch_zip(&path, &p.0, &[]);
    refused_without_abort(&path, "data.pkl");

    // `_rebuild_tensor_v2` with no arguments: candle's `args.remove(3)` panicked.
    let mut p = Pickle::checkpoint_start();
    p.str("dim_reducer.4.bias")
        .global("torch._utils", "_rebuild_tensor_v2")
        .op(b")R");
    let pkl = p.end();
    let path = d.join("no-args.pt");
    torch_zip(&path, &pkl, &[]);
    refused_without_abort(&path, "dim_reducer.4.bias");
    std::fs::remove_dir_all(&d).unwrap();
}

/// A safetensors file: `header` JSON, then `body`.
fn safetensors(path: &Path, header: &str, body: &[u8]) {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(body);
    std::fs::write(path, out).unwrap();
}

#[test]
fn safetensors_shapes_and_offsets_past_the_file_are_refused() {
    let d = scratch("st");
    let args = r#""__metadata__": {"args": "{\"latent_dim\": 16, \"num_layers\": 2, \"nhead\": 4, \"dim_feedforward\": 128}"}"#;
    let cases = [
        (
            "huge-shape",
            format!(
                r#"{{{args}, "dim_reducer.4.bias": {{"dtype": "F32", "shape": [1099511627776], "data_offsets": [0, 4398046511104]}}}}"#
            ),
            "dim_reducer.4.bias",
        ),
        (
            "overflow",
            format!(
                r#"{{{args}, "dim_reducer.4.bias": {{"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 4]}}}}"#
            ),
            "dim_reducer.4.bias",
        ),
        (
            "offsets-past-end",
            format!(
                r#"{{{args}, "dim_reducer.4.bias": {{"dtype": "F32", "shape": [1], "data_offsets": [4000000000, 4000000004]}}}}"#
            ),
            "dim_reducer.4.bias",
        ),
    ];
    for (tag, header, says) in cases {
        let path = d.join(format!("{tag}.safetensors"));
        safetensors(&path, &header, &[0u8; 4]);
        refused_without_abort(&path, says);
    }
    // A header length of 2^63: past the file.
    let path = d.join("header-len.safetensors");
    std::fs::write(&path, (1u64 << 63).to_le_bytes()).unwrap();
    refused_without_abort(&path, "header");
    std::fs::remove_dir_all(&d).unwrap();
}
