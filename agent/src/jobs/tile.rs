//! Tile jobs: checkpoint, inputs, the encoder on a blocking thread, outputs uploaded.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_core::job::{FailureClass, TileJob};
use flotilla_core::protocol::{Complete, Fail, LeaseRef};
use tessera_encoder::{Encoder, OutputOptions, TileInputs};

use crate::devices::EncoderSetup;
use crate::process::{CommandSpec, Outcome};
use crate::server_api::{CallError, ServerApi};

use super::JobContext;

/// How long a dataset's fetch command may run. A 0.1° tile's `bands.npy`
/// alone is up to ~1.5 GB (60 frames × 1100 × 1100 px × 10 bands × u16):
/// an hour allows for a source that delivers under 1 MB/s.
const FETCH_TIMEOUT: Duration = Duration::from_secs(3600);

/// What a failed step says: how the attempt fails, and why.
type StepError = (FailureClass, String);

/// Checkpoints on disk and loaded encoders, by the checkpoint's sha256.
/// One download per checkpoint per agent; one load per checkpoint while
/// the agent runs.
pub struct TileCache {
    dir: PathBuf,
    setup: EncoderSetup,
    encoders: tokio::sync::Mutex<HashMap<String, Arc<Encoder>>>,
}

impl TileCache {
    pub fn new(dir: PathBuf, setup: EncoderSetup) -> Self {
        TileCache {
            dir,
            setup,
            encoders: Default::default(),
        }
    }

    pub fn setup(&self) -> &EncoderSetup {
        &self.setup
    }

    /// The encoder for `sha`, downloading and loading it on first use. The
    /// lock is held across the download so two jobs do not fetch it twice;
    /// file work and loading run on a blocking thread.
    async fn encoder(
        &self,
        api: &ServerApi,
        lease: LeaseRef,
        sha: &str,
    ) -> Result<Arc<Encoder>, StepError> {
        let mut encoders = self.encoders.lock().await;
        if let Some(e) = encoders.get(sha) {
            return Ok(e.clone());
        }
        let valid_sha = sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit());
        if !valid_sha {
            return Err((
                FailureClass::Fatal,
                format!("bad checkpoint sha256 {sha:?}"),
            ));
        }
        tokio::fs::create_dir_all(&self.dir).await.map_err(|e| {
            (
                FailureClass::Retryable,
                format!("making {}: {e}", self.dir.display()),
            )
        })?;
        let raw = self.dir.join(sha);
        if !tokio::fs::try_exists(&raw).await.unwrap_or(false) {
            let (_, got) = api
                .download(lease, "checkpoint", &raw)
                .await
                .map_err(|e| (class_of(&e), format!("fetching the checkpoint: {e}")))?;
            if got != sha {
                let _ = tokio::fs::remove_file(&raw).await;
                return Err((
                    FailureClass::Retryable,
                    format!("the checkpoint's sha256 is {got}, expected {sha}"),
                ));
            }
        }
        let setup = self.setup.clone();
        let enc = tokio::task::spawn_blocking(move || -> Result<Encoder, StepError> {
            let named = raw.with_extension(checkpoint_extension(&raw));
            if !named.exists() {
                std::fs::hard_link(&raw, &named)
                    .or_else(|_| std::fs::copy(&raw, &named).map(|_| ()))
                    .map_err(|e| (FailureClass::Retryable, format!("caching checkpoint: {e}")))?;
            }
            Encoder::load(&named, setup.choice, setup.profile)
                .map_err(|e| (FailureClass::Fatal, format!("loading the checkpoint: {e}")))
        })
        .await
        .map_err(|e| (FailureClass::Retryable, format!("loading panicked: {e}")))??;
        let enc = Arc::new(enc);
        encoders.insert(sha.to_string(), enc.clone());
        Ok(enc)
    }
}

/// The extension the encoder needs to tell the checkpoint's format: upstream
/// `.pt` is a zip (it starts with "PK"); anything else is safetensors. Reads
/// two bytes, not the file.
fn checkpoint_extension(path: &Path) -> &'static str {
    let mut magic = [0u8; 2];
    let is_zip = std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| &magic == b"PK");
    if is_zip {
        "pt"
    } else {
        "safetensors"
    }
}

/// How a refused download fails the attempt: at once when the server says
/// the thing is not there or the request is wrong, else for a retry.
fn class_of(e: &CallError) -> FailureClass {
    if e.is_permanent() {
        FailureClass::Fatal
    } else {
        FailureClass::Retryable
    }
}

/// Runs one tile job to its report; its scratch directory is removed
/// whatever the outcome.
pub async fn run(ctx: &JobContext, cache: &TileCache, spec: &TileJob) -> Result<Complete, Fail> {
    let result = run_in(ctx, cache, spec).await;
    let _ = tokio::fs::remove_dir_all(&ctx.job_dir).await;
    result.map_err(|(class, message)| ctx.fail(class, message))
}

async fn run_in(
    ctx: &JobContext,
    cache: &TileCache,
    spec: &TileJob,
) -> Result<Complete, StepError> {
    let retry = |what: &str, e: std::io::Error| (FailureClass::Retryable, format!("{what}: {e}"));
    let stopped = || (FailureClass::Cancelled, "stopped".to_string());
    let inputs = ctx.job_dir.join("inputs");
    let out = ctx.job_dir.join("out");
    for dir in [&inputs, &out] {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| retry("making the work directory", e))?;
    }

    // Where the time goes, reported in the job's result: the tile-job
    // overhead benchmark compares `encode_s` with the whole job.
    let phase = Instant::now();
    let encoder = tokio::select! {
        _ = ctx.stop.cancelled() => return Err(stopped()),
        e = cache.encoder(&ctx.api, ctx.lease, &spec.checkpoint_sha256) => e?,
    };
    let checkpoint_s = phase.elapsed().as_secs_f64();
    ctx.note(format!(
        "checkpoint {} ready in {checkpoint_s:.2}s",
        spec.checkpoint_sha256
    ))
    .await;
    let phase = Instant::now();

    match &spec.fetch_command {
        // Stops with the job by itself, ending its process tree gracefully.
        Some(cmd) => fetch_by_command(ctx, cmd, spec, &inputs).await?,
        None => tokio::select! {
            _ = ctx.stop.cancelled() => return Err(stopped()),
            r = download_inputs(ctx, &inputs) => r?,
        },
    }
    let fetch_s = phase.elapsed().as_secs_f64();
    ctx.note(format!("inputs fetched in {fetch_s:.2}s")).await;

    let cancel = Arc::new(AtomicBool::new(false));
    let name = spec.tile.name();
    let backend = cache.setup().choice.name();
    let work = {
        let cancel = cancel.clone();
        let (inputs, out, name) = (inputs.clone(), out.clone(), name.clone());
        let (progress, log) = (ctx.progress.clone(), ctx.log.clone());
        tokio::task::spawn_blocking(move || -> Result<(f64, Vec<PathBuf>), StepError> {
            let tile = TileInputs::read(&inputs)
                .map_err(|e| (FailureClass::Fatal, format!("reading inputs: {e}")))?;
            log.agent_blocking(format!(
                "encoding {}×{} = {} px ({} S2 and {} S1 frames) on backend {backend}",
                tile.width,
                tile.height,
                tile.pixels(),
                tile.s2_frames(),
                tile.s1_frames(),
            ));
            let report = |done: usize, total: usize| progress(done as u64, total as u64);
            let encoding = Instant::now();
            let emb = encoder
                .encode_tile(&tile, &report, &cancel)
                .map_err(|e| match e {
                    tessera_encoder::EncodeError::Cancelled => {
                        (FailureClass::Cancelled, "stopped".to_string())
                    }
                    e => (FailureClass::Fatal, format!("encoding: {e}")),
                })?;
            let encode_s = encoding.elapsed().as_secs_f64();
            let files = emb
                .write_outputs(
                    &out,
                    &name,
                    OutputOptions {
                        int8: true,
                        dim: 128,
                    },
                )
                .map_err(|e| (FailureClass::Retryable, format!("writing outputs: {e}")))?;
            Ok((encode_s, files))
        })
    };
    tokio::pin!(work);
    let encoded = tokio::select! {
        r = &mut work => r,
        _ = ctx.stop.cancelled() => {
            // The encoder checks the flag between pixel windows.
            cancel.store(true, Ordering::Relaxed);
            let _ = work.await;
            return Err(stopped());
        }
    };
    let (encode_s, files) = encoded.map_err(|e| {
        (
            FailureClass::Retryable,
            format!("the encoder panicked: {e}"),
        )
    })??;
    ctx.note(format!("encoded in {encode_s:.2}s")).await;
    let phase = Instant::now();

    // Uploaded under the names the encoder wrote them as.
    let mut names = Vec::with_capacity(files.len());
    for file in &files {
        let n = file
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| {
                (
                    FailureClass::Fatal,
                    format!("the encoder wrote an unnamed output {}", file.display()),
                )
            })?
            .to_string();
        ctx.api
            .upload(ctx.lease, &n, file)
            .await
            .map_err(|e| (FailureClass::Retryable, format!("uploading {n}: {e}")))?;
        names.push(n);
    }
    let upload_s = phase.elapsed().as_secs_f64();
    ctx.note(format!(
        "uploaded {} in {upload_s:.2}s; checkpoint {checkpoint_s:.2}s, fetch {fetch_s:.2}s, \
         encode {encode_s:.2}s",
        names.join(", ")
    ))
    .await;
    Ok(ctx.complete(
        None,
        names,
        Some(serde_json::json!({
            "checkpoint_s": checkpoint_s,
            "fetch_s": fetch_s,
            "encode_s": encode_s,
            "upload_s": upload_s,
        })),
    ))
}

/// Downloads [`TileJob::INPUT_FILES`] from the server (the dataset's input prefix).
async fn download_inputs(ctx: &JobContext, inputs: &Path) -> Result<(), StepError> {
    ctx.note(format!(
        "downloading {} input files from the server",
        TileJob::INPUT_FILES.len()
    ))
    .await;
    for file in TileJob::INPUT_FILES {
        ctx.api
            .download(ctx.lease, &format!("inputs/{file}"), &inputs.join(file))
            .await
            .map_err(|e| (class_of(&e), format!("fetching input {file}: {e}")))?;
    }
    Ok(())
}

/// Runs the dataset's fetch command as a supervised process (its own group,
/// [`FETCH_TIMEOUT`], stopped with the job, its lines in the job's log), in
/// the inputs directory, as the job's user, from the same scrubbed
/// environment as a command job plus `FLOTILLA_OUT` (the inputs directory),
/// `FLOTILLA_TILE`, `FLOTILLA_YEAR` and `FLOTILLA_DATASET`. With a job user,
/// only the inputs directory is handed to it: the rest of the job's
/// directory (where the encoder, as root, writes) stays the agent's.
async fn fetch_by_command(
    ctx: &JobContext,
    cmd: &str,
    spec: &TileJob,
    inputs: &Path,
) -> Result<(), StepError> {
    ctx.note(format!("fetching inputs with command: {cmd}"))
        .await;
    ctx.run_as.give_dir(inputs).map_err(|e| {
        (
            FailureClass::Retryable,
            format!("handing the inputs directory to the job user: {e}"),
        )
    })?;
    let env = BTreeMap::from([
        ("FLOTILLA_OUT".to_string(), inputs.display().to_string()),
        ("FLOTILLA_TILE".to_string(), spec.tile.name()),
        ("FLOTILLA_YEAR".to_string(), spec.year.to_string()),
        ("FLOTILLA_DATASET".to_string(), spec.dataset.clone()),
    ]);
    let process = CommandSpec {
        command: cmd.to_string(),
        env,
        run_as: ctx.run_as.clone(),
        workdir: inputs.to_path_buf(),
        timeout: Some(FETCH_TIMEOUT),
        kill_grace: ctx.kill_grace,
    };
    let outcome = ctx.run_process(&process).await.map_err(|e| {
        (
            FailureClass::Retryable,
            format!("running the fetch command: {e}"),
        )
    })?;
    match outcome {
        o if o.success() => Ok(()),
        Outcome::Exited { code } => Err((
            FailureClass::Retryable,
            format!("the fetch command failed: exit status: {code}"),
        )),
        Outcome::Signalled { signal } => Err((
            FailureClass::Retryable,
            format!("the fetch command failed: killed by signal {signal}"),
        )),
        Outcome::TimedOut => Err((
            FailureClass::TimedOut,
            format!("the fetch command ran past {}s", FETCH_TIMEOUT.as_secs()),
        )),
        Outcome::Cancelled => Err((FailureClass::Cancelled, "stopped".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_format_is_told_by_its_first_two_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let zip = dir.path().join("a");
        std::fs::write(&zip, b"PK\x03\x04rest of a zip").unwrap();
        let other = dir.path().join("b");
        std::fs::write(&other, b"{\"safetensors\": 1}").unwrap();
        let short = dir.path().join("c");
        std::fs::write(&short, b"P").unwrap();
        assert_eq!(checkpoint_extension(&zip), "pt");
        assert_eq!(checkpoint_extension(&other), "safetensors");
        assert_eq!(checkpoint_extension(&short), "safetensors");
        assert_eq!(
            checkpoint_extension(&dir.path().join("missing")),
            "safetensors"
        );
    }
}
