//! A checkpoint upload is spooled to a temporary file and dry-loaded by a child `flotilla __check-checkpoint` under memory and CPU limits before it reaches the store.
//!
//! Every tile agent loads the dataset's checkpoint, so one that aborts the
//! loader (a huge declared shape, a hostile pickle) would take down the
//! fleet. The encoder's own checks refuse such files with an error; the
//! child process is the second wall: if a parser bug still made the load
//! abort, overflow its stack or spin, the child dies (its address space and
//! CPU time are capped, its wall time watched) and the server answers 422.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::store::StreamError;

/// Exit code of a child that refused the checkpoint (its stdout says why).
const REFUSED: i32 = 3;
/// Address space for the child: its own ~100 MB plus the loaded tensors
/// (up to twice the file as f32 from f16) and one tensor's raw bytes.
const BASE_ADDRESS_SPACE: u64 = 1 << 30;
/// CPU seconds for the child: the published ~175 MB checkpoint loads in
/// about a second; a 4 GiB upload in well under a minute.
const MAX_CPU_SECONDS: u64 = 120;
/// Wall time before the child's process group is killed (it may be
/// waiting on a slow disk, so more than the CPU limit).
const MAX_WALL: Duration = Duration::from_secs(300);
/// Checks at a time: each may hold several times its file in memory.
static CHECKS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

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

/// Why a checkpoint was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// Not a valid model file: the message says why (an answer for the client).
    #[error("{0}")]
    Refused(String),
    /// The check itself could not run (for the log; the client gets a 500).
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

fn io_error(e: std::io::Error) -> StreamError {
    StreamError::Store(object_store::Error::Generic {
        store: "upload spool",
        source: Box::new(e),
    })
}

/// Write an HTTP body to a temporary file while hashing it; more than
/// `max_bytes` or a body cut off is an error and leaves nothing behind.
pub async fn spool(body: axum::body::Body, max_bytes: u64) -> Result<Spooled, StreamError> {
    use futures::StreamExt;
    let tmp = tempfile::Builder::new()
        .prefix("flotilla-checkpoint-")
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

/// Dry-load the spooled checkpoint in a child process; Ok if it loads.
pub async fn check(upload: &Spooled) -> Result<(), CheckError> {
    let _permit = CHECKS
        .acquire()
        .await
        .map_err(|e| anyhow::anyhow!("checkpoint checks closed: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| anyhow::anyhow!("finding flotilla: {e}"))?;
    let address_space = BASE_ADDRESS_SPACE.saturating_add(upload.size.saturating_mul(3));
    let mut child = tokio::process::Command::new(&exe)
        .arg("__check-checkpoint")
        .arg("--max-address-space")
        .arg(address_space.to_string())
        .arg("--max-cpu-seconds")
        .arg(MAX_CPU_SECONDS.to_string())
        .arg(upload.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| anyhow::anyhow!("starting {}: {e}", exe.display()))?;
    let (mut stdout, mut stderr) = (
        child.stdout.take().expect("stdout is piped"),
        child.stderr.take().expect("stderr is piped"),
    );
    let run = async {
        // Bounded reads: the child writes one line; a runaway one is cut.
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (mut o_lim, mut e_lim) = ((&mut stdout).take(64 << 10), (&mut stderr).take(64 << 10));
        let (o, e) = tokio::join!(o_lim.read_to_end(&mut out), e_lim.read_to_end(&mut err));
        o.and(e)?;
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, out, err))
    };
    let (status, out, err) = match tokio::time::timeout(MAX_WALL, run).await {
        Ok(r) => r.map_err(|e| anyhow::anyhow!("waiting for the checkpoint check: {e}"))?,
        Err(_) => {
            // kill_on_drop reaps the child; its group has nothing else.
            return Err(CheckError::Refused(format!(
                "loading it took longer than {} s",
                MAX_WALL.as_secs()
            )));
        }
    };
    let out = String::from_utf8_lossy(&out).trim().to_string();
    let err = String::from_utf8_lossy(&err).trim().to_string();
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => {
            tracing::info!(size = upload.size, "checkpoint check passed: {out}");
            Ok(())
        }
        (Some(REFUSED), _) => Err(CheckError::Refused(out)),
        (_, Some(sig)) => {
            tracing::warn!(signal = sig, stderr = %err, "the checkpoint check was killed");
            Err(CheckError::Refused(format!(
                "loading it killed the checker (signal {sig}: past its memory or CPU limit, or a loader bug)"
            )))
        }
        (code, _) => Err(CheckError::Failed(anyhow::anyhow!(
            "the checkpoint check exited with {code:?}: {err}"
        ))),
    }
}

/// Copy the spooled file to `key` in the store (multipart; aborted on error).
pub async fn upload(
    store: &dyn object_store::ObjectStore,
    key: &object_store::path::Path,
    upload: &Spooled,
) -> anyhow::Result<()> {
    let mut writer = object_store::WriteMultipart::new(store.put_multipart(key).await?);
    let mut file = tokio::fs::File::open(upload.path()).await?;
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let n = match file.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                let _ = writer.abort().await;
                return Err(e.into());
            }
        };
        writer.write(&buf[..n]);
    }
    writer.finish().await?;
    Ok(())
}

/// Arguments of the hidden `flotilla __check-checkpoint`.
#[derive(clap::Args)]
pub struct ChildArgs {
    /// Address-space limit (bytes) the child sets on itself first.
    #[arg(long)]
    max_address_space: u64,
    /// CPU-time limit (seconds) the child sets on itself first.
    #[arg(long)]
    max_cpu_seconds: u64,
    path: PathBuf,
}

/// The child: limit itself, then load the checkpoint as an agent would. Prints one line; the exit code is 0 (loaded),
/// [`REFUSED`] (not a valid checkpoint) or 1 (could not check).
pub fn child_main(a: &ChildArgs) -> i32 {
    use nix::sys::resource::{setrlimit, Resource};
    let limits = [
        (Resource::RLIMIT_AS, a.max_address_space),
        (Resource::RLIMIT_CPU, a.max_cpu_seconds),
    ];
    for (resource, limit) in limits {
        if let Err(e) = setrlimit(resource, limit, limit) {
            eprintln!("setting {resource:?}: {e}");
            return 1;
        }
    }
    // `load` validates the headers (sizes against the bytes present, the
    // model's tensor names and shapes) before it reads any tensor.
    match tessera_encoder::Checkpoint::load(&a.path) {
        Ok(c) => {
            let elements: usize = c.tensors.values().map(|t| t.data.len()).sum();
            println!(
                "{} tensors, {elements} elements, config {}",
                c.tensors.len(),
                c.config.to_json()
            );
            0
        }
        // An I/O error on our own temporary file is ours, not the client's.
        Err(tessera_encoder::EncodeError::Io { source, .. }) => {
            eprintln!("reading the spooled upload: {source}");
            1
        }
        // The path is a temporary file; the client knows its upload.
        Err(tessera_encoder::EncodeError::Checkpoint { reason, .. }) => {
            println!("{reason}");
            REFUSED
        }
        Err(e) => {
            println!("{e}");
            REFUSED
        }
    }
}
