//! A checkpoint upload's dry-load in a child process, before it reaches the store.
//!
//! The upload is spooled to a temporary file and loaded by a child
//! `flotilla __check-checkpoint` under memory and CPU limits (`sandbox`).
//!
//! Every tile agent loads the dataset's checkpoint, so one that aborts the
//! loader (a huge declared shape, a hostile pickle) would take down the
//! fleet. The encoder's own checks refuse such files with an error; the
//! child process is the second wall: if a parser bug still made the load
//! abort, overflow its stack or spin, the child dies (its address space and
//! CPU time are capped, its wall time watched) and the server answers 422.

use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::sandbox::{self, ChildArgs, Ended, Limits, Spooled, REFUSED};

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

/// Dry-load the spooled checkpoint in a child process; Ok if it loads.
pub async fn check(upload: &Spooled) -> Result<(), CheckError> {
    let _permit = CHECKS
        .acquire()
        .await
        .map_err(|e| anyhow::anyhow!("checkpoint checks closed: {e}"))?;
    let limits = Limits {
        address_space: BASE_ADDRESS_SPACE.saturating_add(upload.size.saturating_mul(3)),
        cpu_seconds: MAX_CPU_SECONDS,
    };
    let mut child = sandbox::child("__check-checkpoint", limits, upload.path())?;
    let (mut stdout, mut stderr) = (
        child.stdout.take().expect("stdout is piped"),
        child.stderr.take().expect("stderr is piped"),
    );
    let run = async {
        let (o, e) = tokio::join!(
            sandbox::read_bounded(&mut stdout),
            sandbox::read_bounded(&mut stderr)
        );
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, o?, e?))
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
    match sandbox::ended(status) {
        Ended::Read => {
            tracing::info!(size = upload.size, "checkpoint check passed: {out}");
            Ok(())
        }
        Ended::Refused => Err(CheckError::Refused(out)),
        Ended::Killed(sig) => {
            tracing::warn!(signal = sig, stderr = %err, "the checkpoint check was killed");
            Err(CheckError::Refused(format!(
                "loading it killed the checker (signal {sig}: past its memory or CPU limit, or a loader bug)"
            )))
        }
        Ended::Failed(code) => Err(CheckError::Failed(anyhow::anyhow!(
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

/// The hidden `flotilla __check-checkpoint`: limit itself, then load the
/// checkpoint as an agent would. Prints one line; the exit code is 0 (loaded),
/// [`REFUSED`] (not a valid checkpoint) or 1 (could not check).
pub fn child_main(a: &ChildArgs) -> i32 {
    if let Err(e) = a.apply() {
        eprintln!("{e}");
        return 1;
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
