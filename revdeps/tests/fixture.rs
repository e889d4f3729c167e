//! Shared fixture for the integration tests: one git repository made from the
//! opam-repository archive in `shared/fixtures/opam`, loaded once per process.

#![allow(dead_code)]

use opam_revdeps::{Repository, Source};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/opam");

pub fn fixtures() -> PathBuf {
    PathBuf::from(FIXTURES)
}

fn run(dir: &Path, cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("running {cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const ARCHIVE: &str = "opam-repository-97014be.tar.gz";

/// A one-commit git repository holding the fixture archive. Made once and
/// kept in cargo's scratch folder for tests (`target/tmp`), so test
/// processes share it and nothing is left in /tmp: each process that finds
/// it missing builds its own copy beside it and renames that into place,
/// so a half-made repository is never seen.
pub fn git_repo() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "opam-revdeps-fixture-{}",
            ARCHIVE.trim_end_matches(".tar.gz")
        ));
        if dir.join(".git").is_dir() {
            return dir;
        }
        let building = dir.with_extension(format!("building-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&building);
        std::fs::create_dir_all(&building).expect("scratch dir");
        let archive = fixtures().join(ARCHIVE);
        run(
            &building,
            "tar",
            &["xzf", archive.to_str().expect("utf-8 path")],
        );
        run(&building, "git", &["init", "-q"]);
        run(&building, "git", &["add", "-A"]);
        run(
            &building,
            "git",
            &[
                "-c",
                "user.name=fixture",
                "-c",
                "user.email=fixture@example.invalid",
                "commit",
                "-q",
                "-m",
                "fixture",
            ],
        );
        if std::fs::rename(&building, &dir).is_err() {
            // Another process got there first; use theirs.
            let _ = std::fs::remove_dir_all(&building);
            assert!(
                dir.join(".git").is_dir(),
                "{} is not a git repository",
                dir.display()
            );
        }
        dir
    })
}

/// The fixture repository, read from the git object database (not the checkout).
pub fn repo() -> &'static Repository {
    static REPO: OnceLock<Repository> = OnceLock::new();
    REPO.get_or_init(|| {
        let spec = format!("{}:HEAD", git_repo().display());
        Repository::load(&Source::parse(&spec)).expect("fixture repository loads")
    })
}

/// Lines of a reference answer.
pub fn reference(compiler: &str, target: &str, file: &str) -> Vec<String> {
    let p = fixtures()
        .join("reference")
        .join(compiler)
        .join(target)
        .join(file);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .map(str::to_string)
        .collect()
}

/// Lines of a reference answer kept in this repository (`tests/reference`,
/// made with opam 2.1.2 by `tests/reference/make.sh`).
pub fn local_reference(compiler: &str, target: &str, file: &str) -> Vec<String> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/reference")
        .join(compiler)
        .join(target)
        .join(file);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .map(str::to_string)
        .collect()
}
