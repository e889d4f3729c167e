//! No mutation of a real model or tile file makes a reader panic: the
//! fixture's `.npy` files, `.safetensors`, `.pt` zip and its `data.pkl`,
//! with bytes flipped, numbers and lengths enlarged, cut short and spliced.
//! A deterministic stand-in for the cargo-fuzz targets in `fuzz/` that runs
//! in the normal suite (the fuzzers' own findings are regression-tested next
//! to the code they broke).

use std::io::Cursor;
use std::path::Path;

use tessera_encoder::checkpoint::{inspect_reader, torch, Checkpoint};
use tessera_encoder::npy;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/encoder");

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Bytes a mutation may write: lengths and counts at their extremes, and
/// the characters the headers are made of.
const TOKENS: &[&[u8]] = &[
    &[0xff, 0xff, 0xff, 0xff],
    &[0xff, 0xff, 0xff, 0x7f],
    &[0, 0, 0, 0x80],
    &[0x8a, 0xff],
    b"X\xff\xff\xff\xff",
    b"18446744073709551615",
    b"4294967296",
    b"-1",
    b"(",
    b")",
    b",",
    b"'",
    b"\"",
    b"[",
    b"]",
    b"{",
    b"}",
    b"\x85",
    b"\xc3\xa9",
];

/// One random mutation of `src`, confined to `range` (bytes outside it are kept).
fn mutate(rng: &mut Rng, src: &[u8], range: std::ops::Range<usize>) -> Vec<u8> {
    let mut b = src.to_vec();
    let at = range.start + rng.below(range.len());
    match rng.below(5) {
        0 => {
            for _ in 0..1 + rng.below(8) {
                let i = range.start + rng.below(range.len());
                b[i] ^= 1 << rng.below(8);
            }
        }
        1 => {
            let t = TOKENS[rng.below(TOKENS.len())];
            let end = (at + t.len()).min(b.len());
            b[at..end].copy_from_slice(&t[..end - at]);
        }
        2 => {
            let t = TOKENS[rng.below(TOKENS.len())];
            b.splice(at..at, t.iter().copied());
        }
        3 => {
            let n = 1 + rng.below(16);
            b.drain(at..(at + n).min(b.len()));
        }
        _ => b.truncate(at),
    }
    b
}

#[test]
fn mutated_npy_files_are_errors_or_arrays() {
    let mut rng = Rng(0x006e_7079);
    let dir = Path::new(FIXTURES).join("small/tile");
    for name in ["bands.npy", "doys.npy", "masks.npy", "sar_ascending.npy"] {
        let src = std::fs::read(dir.join(name)).unwrap();
        let header = 128.min(src.len());
        for _ in 0..300 {
            let b = mutate(&mut rng, &src, 0..header);
            if let Ok(a) = npy::parse(&b) {
                assert!(a.data.len() <= b.len());
            }
        }
    }
}

#[test]
fn mutated_safetensors_headers_are_errors_or_checkpoints() {
    let mut rng = Rng(0x5afe);
    let src = std::fs::read(Path::new(FIXTURES).join("small/ckpt.safetensors")).unwrap();
    let header = 8 + u64::from_le_bytes(src[..8].try_into().unwrap()) as usize;
    let path = Path::new("mutated.safetensors");
    for _ in 0..400 {
        let b = mutate(&mut rng, &src, 0..header);
        if inspect_reader(&mut Cursor::new(&b), path).is_ok() {
            let _ = Checkpoint::from_reader(&mut Cursor::new(&b), path);
        }
    }
}

#[test]
fn mutated_torch_pickles_and_zips_are_errors_or_checkpoints() {
    let mut rng = Rng(0x0070_6b6c);
    let src = std::fs::read(Path::new(FIXTURES).join("small/ckpt.pt")).unwrap();
    let mut zip = zip::ZipArchive::new(Cursor::new(&src)).unwrap();
    let pkl = {
        use std::io::Read;
        let mut f = zip.by_name("ckpt/data.pkl").unwrap();
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        v
    };
    for _ in 0..1500 {
        let b = mutate(&mut rng, &pkl, 0..pkl.len());
        let _ = torch::tensor_table(&b);
    }
    // The zip around it: local headers, storages and the central directory
    // (a change inside data.pkl itself only fails its CRC).
    let path = Path::new("mutated.pt");
    let tail = src.len() - 8192;
    for _ in 0..150 {
        let range = if rng.below(2) == 0 {
            0..64
        } else {
            tail..src.len()
        };
        let b = mutate(&mut rng, &src, range);
        if inspect_reader(&mut Cursor::new(&b), path).is_ok() {
            let _ = Checkpoint::from_reader(&mut Cursor::new(&b), path);
        }
    }
}
