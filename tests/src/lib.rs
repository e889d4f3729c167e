//! # flotilla-e2e
//!
//! Harness for the end-to-end tests: a real PostgreSQL cluster (made the way
//! `flotilla up` makes its own), the real `flotilla` server and
//! `flotilla-agent` binaries as child processes on loopback port 0 (or a
//! fixed free port when a test restarts the server), and the HTTP API.
//!
//! The binaries must be built first (`cargo build --bins`; `.ci/run` does).
//!
//! # Layout
//!
//! - [`pg`]: the shared cluster (one per test process, reused across runs
//!   under `target/e2e-pg`) and fresh databases per test.
//! - [`procs`]: server and agent processes.
//! - [`api`]: a small client for the REST API.
//! - [`tiles`]: random models, tiles and datasets for the tile tests.
//! - [`driven`]: an agent process driven by the test, timing heartbeats.
//! - [`fds`]: a process's open descriptors, from /proc.
//! - [`s3`]: a real S3-compatible server (moto), and a proxy that holds
//!   its copies.
//! - [`ui`]: a logged-in dashboard client.
//! - [`pipelines`]: pipeline runs made through the server's module.
//! - [`up`]: `flotilla up` as a child process, and the CLI against it.

pub mod api;
pub mod driven;
pub mod fds;
pub mod pg;
pub mod pipelines;
pub mod procs;
pub mod s3;
pub mod sshd;
pub mod tiles;
pub mod ui;
pub mod up;

use std::path::{Path, PathBuf};

/// The directory holding the built binaries: `FLOTILLA_BIN_DIR` when set
/// (benchmarks point it at `target/release`), else `target/debug`, found
/// from this test executable (`target/debug/deps/NAME-HASH`).
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FLOTILLA_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("the test knows its own path");
    let deps = exe
        .parent()
        .expect("test executables live in target/*/deps");
    deps.parent().expect("deps has a parent").to_path_buf()
}

/// Path of a workspace binary; panics with what to do if it is not built.
pub fn binary(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.is_file(),
        "{} is not built; run `cargo build --bins` before the end-to-end tests",
        p.display()
    );
    p
}

/// Every file under `dir`, however deep, sorted; folders for which
/// `enter` says no are passed by (and unreadable ones too).
pub fn files_under(dir: &Path, enter: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                if enter(&p) {
                    todo.push(p);
                }
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A scratch directory that PostgreSQL's unprivileged user can traverse.
pub fn scratch(prefix: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(std::env::temp_dir())
        .expect("making a temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod temp dir");
    dir
}

/// Waits until `cond` holds, polling; panics with `what` after `timeout`.
pub async fn eventually<F, Fut>(what: &str, timeout: std::time::Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while !cond().await {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// `n` no-op command jobs (`true`) of `submitter`, ready to insert with
/// `flotilla_server::queue::submit::submit` (the benches' queued work).
pub fn noop_jobs(n: usize, submitter: &str) -> Vec<flotilla_server::queue::submit::NewJob> {
    (0..n)
        .map(|_| flotilla_server::queue::submit::NewJob {
            spec: serde_json::from_value(serde_json::json!({"kind": "command", "command": "true"}))
                .expect("a no-op command job parses"),
            labels: std::collections::BTreeMap::new(),
            priority: 0,
            max_attempts: 3,
            cost: 1,
            submitter: submitter.into(),
            parent_id: None,
            child_index: None,
            owner: None,
        })
        .collect()
}
