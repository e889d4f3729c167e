//! Untrusted uploads the server must parse (a checkpoint, a coverage
//! manifest) are spooled to a temporary file and read by a child
//! `flotilla __…` that caps its own address space and CPU time first.
//!
//! The readers refuse malformed files with an error; the child is the
//! second wall: if a parser still aborted, overflowed its stack, allocated
//! what a hostile header declared or spun, the child dies and the server
//! answers 422, instead of the server itself going down.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::store::StreamError;

/// Exit code of a child that refused its file (it says why).
pub const REFUSED: i32 = 3;

/// An upload on local disk (deleted on drop), with its size and SHA-256.
pub struct Spooled {
    file: tempfile::TempPath,
    pub size: u64,
    pub sha256: String,
}

impl Spooled {
    pub fn path(&self) -> &Path {
        &self.file
    }
}

fn io_error(e: std::io::Error) -> StreamError {
    StreamError::Store(object_store::Error::Generic {
        store: "upload spool",
        source: Box::new(e),
    })
}

/// Write an HTTP body to a temporary file named `prefix…` while hashing it;
/// more than `max_bytes` or a body cut off is an error and leaves nothing
/// behind.
pub async fn spool(
    body: axum::body::Body,
    max_bytes: u64,
    prefix: &str,
) -> Result<Spooled, StreamError> {
    use futures::StreamExt;
    let tmp = tempfile::Builder::new()
        .prefix(prefix)
        .tempfile()
        .map_err(io_error)?;
    let (file, path) = tmp.into_parts();
    let mut file = tokio::io::BufWriter::new(tokio::fs::File::from_std(file));
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| StreamError::CutOff {
            after: size,
            reason: e.to_string(),
        })?;
        size += chunk.len() as u64;
        if size > max_bytes {
            return Err(StreamError::TooLarge { limit: max_bytes });
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(io_error)?;
    }
    file.flush().await.map_err(io_error)?;
    Ok(Spooled {
        file: path,
        size,
        sha256: hex::encode(hasher.finalize()),
    })
}

/// What a child may use.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes of address space (the executable's own mapping included).
    pub address_space: u64,
    pub cpu_seconds: u64,
}

/// What every hidden child subcommand takes (see [`child`]): the limits it
/// sets on itself, and the spooled file.
#[derive(clap::Args, Debug)]
pub struct ChildArgs {
    /// Address-space limit (bytes) the child sets on itself first.
    #[arg(long)]
    max_address_space: u64,
    /// CPU-time limit (seconds) the child sets on itself first.
    #[arg(long)]
    max_cpu_seconds: u64,
    pub path: PathBuf,
}

impl ChildArgs {
    /// Caps this process. Call it before any thread exists: every thread's
    /// stack counts against the address space.
    pub fn apply(&self) -> Result<(), String> {
        use nix::sys::resource::{setrlimit, Resource};
        let limits = [
            (Resource::RLIMIT_AS, self.max_address_space),
            (Resource::RLIMIT_CPU, self.max_cpu_seconds),
            // A child that dies at its limits leaves no core file per
            // hostile upload.
            (Resource::RLIMIT_CORE, 0),
        ];
        for (resource, limit) in limits {
            setrlimit(resource, limit, limit).map_err(|e| format!("setting {resource:?}: {e}"))?;
        }
        Ok(())
    }
}

/// `flotilla <subcommand> --max-address-space … --max-cpu-seconds … file`,
/// in a process group of its own, killed if dropped; stdout and stderr
/// piped, stdin closed; none of the server's environment (its database URL
/// and store keys are no business of a parser of hostile files) but the
/// library path.
pub fn child(
    subcommand: &str,
    limits: Limits,
    file: &Path,
) -> anyhow::Result<tokio::process::Child> {
    let exe = std::env::current_exe().map_err(|e| anyhow::anyhow!("finding flotilla: {e}"))?;
    let mut cmd = tokio::process::Command::new(&exe);
    cmd.env_clear();
    if let Some(path) = std::env::var_os("LD_LIBRARY_PATH") {
        cmd.env("LD_LIBRARY_PATH", path);
    }
    cmd.arg(subcommand)
        .arg("--max-address-space")
        .arg(limits.address_space.to_string())
        .arg("--max-cpu-seconds")
        .arg(limits.cpu_seconds.to_string())
        .arg(file)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| anyhow::anyhow!("starting {} {subcommand}: {e}", exe.display()))
}

/// The first 64 KiB of a child's pipe (it writes a line; a runaway one is
/// cut), read to its end: the rest is drained and dropped, so a child
/// writing more is never left blocked on a full pipe.
pub async fn read_bounded(mut pipe: impl AsyncRead + Unpin) -> std::io::Result<String> {
    let mut out = Vec::new();
    (&mut pipe).take(64 << 10).read_to_end(&mut out).await?;
    tokio::io::copy(&mut pipe, &mut tokio::io::sink()).await?;
    Ok(String::from_utf8_lossy(&out).trim().to_string())
}

/// How a child ended.
#[derive(Debug, PartialEq)]
pub enum Ended {
    /// Exit 0: it read the file.
    Read,
    /// Exit [`REFUSED`]: the file is not valid (the child said why).
    Refused,
    /// Killed by a signal: past its memory or CPU limit, or a reader bug
    /// that aborted (for the client: the file is refused).
    Killed(i32),
    /// Any other exit: the check itself failed (ours, not the client's).
    Failed(Option<i32>),
}

pub fn ended(status: ExitStatus) -> Ended {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => Ended::Read,
        (Some(REFUSED), _) => Ended::Refused,
        (_, Some(sig)) => Ended::Killed(sig),
        (code, _) => Ended::Failed(code),
    }
}
