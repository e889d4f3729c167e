//! Tile jobs: fetch the checkpoint (cached by sha256) and the tile's inputs, encode on a blocking thread with this agent's device profile, upload `grid_X_Y.npy` and `grid_X_Y_scales.npy`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use flotilla_core::job::{FailureClass, TileJob};
use flotilla_core::protocol::{Complete, Fail, LeaseRef, LeasedJob};
use tessera_encoder::{BackendChoice, DeviceProfile, Encoder, OutputOptions, TileInputs};
use tokio_util::sync::CancellationToken;

use crate::server_api::{CallError, ServerApi};

/// The input files of a tile in the geotessera preprocessing layout.
pub const INPUT_FILES: [&str; 7] = [
    "bands.npy",
    "masks.npy",
    "doys.npy",
    "sar_ascending.npy",
    "sar_ascending_doy.npy",
    "sar_descending.npy",
    "sar_descending_doy.npy",
];

/// The encoder this agent runs: backend and device profile, chosen once at
/// start (what the agent advertises at registration).
#[derive(Debug, Clone)]
pub struct EncoderSetup {
    pub choice: BackendChoice,
    pub profile: DeviceProfile,
}

impl EncoderSetup {
    /// The fastest backend compiled in, with its profile from `profile_file`
    /// (as written by `tessera-encode tune`) or the built-in default.
    pub fn detect(profile_file: Option<&Path>) -> anyhow::Result<Self> {
        let choice = BackendChoice::Auto.resolve();
        let profile = DeviceProfile::resolve(profile_file, choice.name())?;
        Ok(EncoderSetup { choice, profile })
    }

    /// What registration reports under `devices.encoder`: the backend in
    /// use, its profile, and why each faster backend is not used (say, a GPU
    /// box whose agent cannot load cuBLAS), for the operator to see.
    pub fn describe(&self) -> serde_json::Value {
        let unavailable: serde_json::Map<String, serde_json::Value> =
            [BackendChoice::Cuda, BackendChoice::Onednn]
                .into_iter()
                .filter_map(|b| {
                    tessera_encoder::backend::unavailable_reason(b)
                        .map(|why| (b.name().to_string(), serde_json::Value::String(why)))
                })
                .collect();
        serde_json::json!({
            "backend": self.choice.name(),
            "profile": serde_json::to_value(&self.profile).unwrap_or(serde_json::Value::Null),
            "unavailable": unavailable,
        })
    }
}

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
    /// lock is held across the download so two jobs do not fetch it twice.
    async fn encoder(
        &self,
        api: &ServerApi,
        lease: LeaseRef,
        sha: &str,
    ) -> Result<Arc<Encoder>, (FailureClass, String)> {
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
        std::fs::create_dir_all(&self.dir).map_err(|e| {
            (
                FailureClass::Retryable,
                format!("making {}: {e}", self.dir.display()),
            )
        })?;
        let raw = self.dir.join(sha);
        if !raw.is_file() {
            let (_, got) = api
                .download(lease, "checkpoint", &raw)
                .await
                .map_err(|e| (class_of(&e), format!("fetching the checkpoint: {e}")))?;
            if got != sha {
                let _ = std::fs::remove_file(&raw);
                return Err((
                    FailureClass::Retryable,
                    format!("the checkpoint's sha256 is {got}, expected {sha}"),
                ));
            }
        }
        // The encoder tells formats apart by extension: upstream .pt is a
        // zip ("PK"), anything else is safetensors.
        let is_zip = std::fs::read(&raw)
            .map(|b| b.starts_with(b"PK"))
            .unwrap_or(false);
        let named = raw.with_extension(if is_zip { "pt" } else { "safetensors" });
        if !named.exists() {
            std::fs::hard_link(&raw, &named)
                .or_else(|_| std::fs::copy(&raw, &named).map(|_| ()))
                .map_err(|e| (FailureClass::Retryable, format!("caching checkpoint: {e}")))?;
        }
        let setup = self.setup.clone();
        let enc =
            tokio::task::spawn_blocking(move || Encoder::load(&named, setup.choice, setup.profile))
                .await
                .map_err(|e| (FailureClass::Retryable, format!("loading panicked: {e}")))?
                .map_err(|e| (FailureClass::Fatal, format!("loading the checkpoint: {e}")))?;
        let enc = Arc::new(enc);
        encoders.insert(sha.to_string(), enc.clone());
        Ok(enc)
    }
}

fn class_of(e: &CallError) -> FailureClass {
    match e {
        CallError::Refused { status: 404, .. } | CallError::Refused { status: 422, .. } => {
            FailureClass::Fatal
        }
        _ => FailureClass::Retryable,
    }
}

/// Progress sink: pixels done of total.
pub type ProgressFn = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// Runs one tile job to its report.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    api: &ServerApi,
    cache: &TileCache,
    workdir: &Path,
    job: &LeasedJob,
    lease: LeaseRef,
    spec: &TileJob,
    stop: CancellationToken,
    progress: ProgressFn,
) -> Result<Complete, Fail> {
    let fail = |(class, message): (FailureClass, String)| Fail {
        lease_token: lease.lease_token,
        class,
        message,
        exit_code: None,
    };
    let job_dir = workdir
        .join("jobs")
        .join(format!("{}-{}", job.job_id, job.attempt));
    let result = run_in(api, cache, &job_dir, lease, spec, stop, progress).await;
    let _ = std::fs::remove_dir_all(&job_dir);
    result.map_err(fail)
}

async fn run_in(
    api: &ServerApi,
    cache: &TileCache,
    job_dir: &Path,
    lease: LeaseRef,
    spec: &TileJob,
    stop: CancellationToken,
    progress: ProgressFn,
) -> Result<Complete, (FailureClass, String)> {
    let retry = |what: &str, e: std::io::Error| (FailureClass::Retryable, format!("{what}: {e}"));
    let inputs = job_dir.join("inputs");
    let out = job_dir.join("out");
    std::fs::create_dir_all(&inputs).map_err(|e| retry("making the work directory", e))?;
    std::fs::create_dir_all(&out).map_err(|e| retry("making the work directory", e))?;

    // Where the time goes, reported in the job's result: the tile-job
    // overhead benchmark compares `encode_s` with the whole job.
    let phase = std::time::Instant::now();
    let encoder = tokio::select! {
        _ = stop.cancelled() => return Err((FailureClass::Cancelled, "stopped".into())),
        e = cache.encoder(api, lease, &spec.checkpoint_sha256) => e?,
    };
    let checkpoint_s = phase.elapsed().as_secs_f64();
    let phase = std::time::Instant::now();

    let fetched = async {
        match &spec.fetch_command {
            Some(cmd) => fetch_by_command(cmd, spec, &inputs).await,
            None => {
                for file in INPUT_FILES {
                    api.download(lease, &format!("inputs/{file}"), &inputs.join(file))
                        .await
                        .map_err(|e| (class_of(&e), format!("fetching input {file}: {e}")))?;
                }
                Ok(())
            }
        }
    };
    tokio::select! {
        _ = stop.cancelled() => return Err((FailureClass::Cancelled, "stopped".into())),
        r = fetched => r?,
    }
    let fetch_s = phase.elapsed().as_secs_f64();

    let cancel = Arc::new(AtomicBool::new(false));
    let name = spec.tile.name();
    let work = {
        let cancel = cancel.clone();
        let (inputs, out, name) = (inputs.clone(), out.clone(), name.clone());
        tokio::task::spawn_blocking(move || -> Result<f64, (FailureClass, String)> {
            let tile = TileInputs::read(&inputs)
                .map_err(|e| (FailureClass::Fatal, format!("reading inputs: {e}")))?;
            let report = |done: usize, total: usize| progress(done as u64, total as u64);
            let encoding = std::time::Instant::now();
            let emb = encoder
                .encode_tile(&tile, &report, &cancel)
                .map_err(|e| match e {
                    tessera_encoder::EncodeError::Cancelled => {
                        (FailureClass::Cancelled, "stopped".to_string())
                    }
                    e => (FailureClass::Fatal, format!("encoding: {e}")),
                })?;
            let encode_s = encoding.elapsed().as_secs_f64();
            emb.write_outputs(
                &out,
                &name,
                OutputOptions {
                    int8: true,
                    dim: 128,
                },
            )
            .map_err(|e| (FailureClass::Retryable, format!("writing outputs: {e}")))?;
            Ok(encode_s)
        })
    };
    tokio::pin!(work);
    let encoded = tokio::select! {
        r = &mut work => r,
        _ = stop.cancelled() => {
            // The encoder checks the flag between pixel windows.
            cancel.store(true, Ordering::Relaxed);
            let _ = work.await;
            return Err((FailureClass::Cancelled, "stopped".into()));
        }
    };
    let encode_s = encoded.map_err(|e| {
        (
            FailureClass::Retryable,
            format!("the encoder panicked: {e}"),
        )
    })??;
    let phase = std::time::Instant::now();

    let names = [format!("{name}.npy"), format!("{name}_scales.npy")];
    for n in &names {
        api.upload(lease, n, &out.join(n))
            .await
            .map_err(|e| (FailureClass::Retryable, format!("uploading {n}: {e}")))?;
    }
    Ok(Complete {
        lease_token: lease.lease_token,
        exit_code: None,
        outputs: names.to_vec(),
        result: Some(serde_json::json!({
            "checkpoint_s": checkpoint_s,
            "fetch_s": fetch_s,
            "encode_s": encode_s,
            "upload_s": phase.elapsed().as_secs_f64(),
        })),
    })
}

/// Runs the dataset's fetch command with `FLOTILLA_OUT` (the inputs
/// directory), `FLOTILLA_TILE` and `FLOTILLA_YEAR`.
async fn fetch_by_command(
    cmd: &str,
    spec: &TileJob,
    inputs: &Path,
) -> Result<(), (FailureClass, String)> {
    let status = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .env("FLOTILLA_OUT", inputs)
        .env("FLOTILLA_TILE", spec.tile.name())
        .env("FLOTILLA_YEAR", spec.year.to_string())
        .env("FLOTILLA_DATASET", &spec.dataset)
        .kill_on_drop(true)
        .status()
        .await
        .map_err(|e| {
            (
                FailureClass::Retryable,
                format!("running the fetch command: {e}"),
            )
        })?;
    if !status.success() {
        return Err((
            FailureClass::Retryable,
            format!("the fetch command failed: {status}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_says_why_faster_backends_are_not_used() {
        let setup = EncoderSetup::detect(None).unwrap();
        let d = setup.describe();
        assert_eq!(d["backend"], setup.choice.name());
        let unavailable = d["unavailable"].as_object().expect("an object");
        let cuda = unavailable.get("cuda").and_then(|v| v.as_str());
        if tessera_encoder::backend::cuda_usable() {
            assert!(cuda.is_none(), "{d}");
        } else {
            assert!(cuda.is_some_and(|why| !why.is_empty()), "{d}");
        }
    }
}
