//! No input makes the opam parser panic: random bytes and real opam files of
//! the fixture, mutated (bytes flipped, operators and brackets inserted,
//! cut short, spliced). A stand-in for the cargo-fuzz target in `fuzz/`
//! that runs in the normal suite. Malformed files are reported with file and
//! line and skipped, never abort loading.

mod fixture;

use opam_revdeps::package::OpamData;
use opam_revdeps::parser::parse_file;
use opam_revdeps::Repository;

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

const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"(",
    b")",
    b"\"",
    b"\"\"\"",
    b"&",
    b"|",
    b"!",
    b"?",
    b"=",
    b"!=",
    b"<=",
    b">",
    b":",
    b"+=",
    b"(*",
    b"*)",
    b"#",
    b"\\",
    b"%{",
    b"}%",
    b"\n",
    b" ",
    b"-1",
    b"99999999999999999999",
    b"true",
    b"x:y",
];

fn mutate(rng: &mut Rng, src: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = src.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(6) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 => {
                let t = TOKENS[rng.below(TOKENS.len())];
                v.splice(at..at, t.iter().copied());
            }
            2 => v.truncate(at),
            3 if !other.is_empty() => {
                let from = rng.below(other.len());
                let len = rng.below(200).min(other.len() - from);
                v.splice(at..at, other[from..from + len].iter().copied());
            }
            4 => {
                let n = rng.below(300);
                let t = TOKENS[rng.below(6)];
                for _ in 0..n {
                    v.splice(at..at, t.iter().copied());
                }
            }
            _ => {
                let end = (at + rng.below(50)).min(v.len());
                v.drain(at..end);
            }
        }
    }
    v
}

fn sample_files() -> Vec<Vec<u8>> {
    let repo = fixture::git_repo();
    let mut files = Vec::new();
    for name in [
        "coq",
        "dune",
        "frama-c",
        "zenon",
        "ocaml-base-compiler",
        "conf-gtksourceview",
        "mirage-runtime",
        "why3-coq",
        "ocamlfind",
        "0install",
    ] {
        let dir = repo.join("packages").join(name);
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten().take(6) {
                if let Ok(b) = std::fs::read(e.path().join("opam")) {
                    files.push(b);
                }
            }
        }
    }
    assert!(files.len() > 20, "fixture files found");
    files
}

#[test]
fn mutated_real_files_never_panic() {
    let files = sample_files();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut rejected = 0usize;
    for round in 0..4000 {
        let a = &files[rng.below(files.len())];
        let b = &files[rng.below(files.len())];
        let m = mutate(&mut rng, a, b);
        let s = String::from_utf8_lossy(&m);
        if parse_file(&s).is_err() {
            rejected += 1;
        }
        let _ = OpamData::parse(&format!("mutant/{round}/opam"), &s);
    }
    assert!(
        rejected > 100,
        "mutations do hit the error paths ({rejected})"
    );
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(42);
    let alphabet: Vec<u8> = TOKENS
        .concat()
        .into_iter()
        .chain(b"abcdefghij0123456789_-+.~ \n\t\"".iter().copied())
        .collect();
    for _ in 0..4000 {
        let n = rng.below(400);
        let bytes: Vec<u8> = (0..n)
            .map(|_| alphabet[rng.below(alphabet.len())])
            .collect();
        let s = String::from_utf8_lossy(&bytes);
        let _ = parse_file(&s);
        let _ = OpamData::parse("random/opam", &s);
    }
    // Deep nesting is an error, not a stack overflow.
    for open in ["[", "(", "{", "!", "a {"] {
        let s = format!("x: {}", open.repeat(200_000));
        assert!(parse_file(&s).is_err());
    }
}

#[test]
fn malformed_file_is_reported_and_skipped() {
    let good = b"opam-version: \"2.0\"\ndepends: [\"ocaml\"]\n".to_vec();
    let bad = b"opam-version: \"2.0\"\ndepends: [\n  \"ocaml\" {>= }\n]\n".to_vec();
    let unterminated = b"opam-version: \"2.0\"\nsynopsis: \"oops\n".to_vec();
    let repo = Repository::from_files(vec![
        ("packages/a/a.1/opam".into(), good.clone()),
        ("packages/b/b.1/opam".into(), bad),
        ("packages/c/c.1/opam".into(), unterminated),
        ("packages/d/d.2/opam".into(), vec![0xff, 0xfe]),
        ("packages/e/e.1/opam".into(), good),
    ]);
    let names: Vec<String> = (0..repo.packages.len() as u32)
        .map(|p| repo.display(p))
        .collect();
    assert_eq!(names, vec!["a.1", "e.1"]);
    let errors: Vec<String> = repo.errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("packages/b/b.1/opam:3:")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("packages/c/c.1/opam:2:")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.starts_with("packages/d/d.2/opam")),
        "{errors:?}"
    );
}
