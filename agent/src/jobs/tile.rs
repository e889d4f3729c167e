//! Tile jobs: checkpoint, inputs, the encoder on a blocking thread, outputs uploaded.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_core::job::{FailureClass, TileJob};
use flotilla_core::protocol::{Complete, Fail, LeaseRef};
use tessera_encoder::{Encoder, OutputOptions, OutputWriter, TileReader};

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

/// Checkpoints kept on disk and loaded, the most recently used: a dataset's
/// checkpoint and the next one while an agent moves between datasets. A
/// TESSERA checkpoint is ~100 MB on disk and more loaded; agents used to
/// keep every one they had seen.
const CHECKPOINTS_KEPT: usize = 2;

/// Checkpoints on disk and loaded encoders, by the checkpoint's sha256: the
/// [`CHECKPOINTS_KEPT`] most recently used. One download and one load per
/// checkpoint at a time; a job waits only for the checkpoint it needs, so a
/// download that stalls holds up no job of another checkpoint.
pub struct TileCache {
    dir: PathBuf,
    setup: EncoderSetup,
    keep: usize,
    /// Never held across an await.
    state: std::sync::Mutex<CacheState>,
}

#[derive(Default)]
struct CacheState {
    /// Checkpoints on disk, least recently used first (at start, by their
    /// files' modification times).
    recent: Vec<String>,
    loaded: HashMap<String, Arc<Encoder>>,
    /// One lock per checkpoint being fetched or loaded, held while that is
    /// done: jobs needing the same checkpoint wait for the first.
    fetching: HashMap<String, Arc<tokio::sync::Mutex<()>>>,
}

impl TileCache {
    /// A cache in `dir`: checkpoints there from before are kept up to the
    /// bound, newest first; downloads a crash left half done are removed.
    pub fn new(dir: PathBuf, setup: EncoderSetup) -> Self {
        let cache = TileCache {
            dir,
            setup,
            keep: CHECKPOINTS_KEPT,
            state: Default::default(),
        };
        cache.scan();
        cache
    }

    pub fn setup(&self) -> &EncoderSetup {
        &self.setup
    }

    fn state(&self) -> std::sync::MutexGuard<'_, CacheState> {
        self.state
            .lock()
            .expect("checkpoint cache lock is never poisoned")
    }

    /// Lists the checkpoints on disk, removes `.part-*` files, and keeps
    /// the most recent up to the bound.
    fn scan(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut found: HashMap<String, std::time::SystemTime> = HashMap::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let (stem, ext) = name.split_once('.').unwrap_or((&name, ""));
            if ext.starts_with("part-") {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            if !valid_sha(stem) {
                continue;
            }
            let modified = entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            let t = found.entry(stem.to_string()).or_insert(modified);
            *t = (*t).max(modified);
        }
        let mut recent: Vec<(std::time::SystemTime, String)> =
            found.into_iter().map(|(sha, t)| (t, sha)).collect();
        recent.sort();
        let mut st = self.state();
        st.recent = recent.into_iter().map(|(_, sha)| sha).collect();
        self.evict(&mut st);
    }

    /// Marks `sha` the most recently used and evicts beyond the bound.
    fn touch(&self, sha: &str) {
        let mut st = self.state();
        st.recent.retain(|s| s != sha);
        st.recent.push(sha.to_string());
        self.evict(&mut st);
    }

    /// Drops the least recently used checkpoints beyond the bound: their
    /// files and loaded encoders (a job still running on one keeps it until
    /// it ends). One being fetched again is left alone.
    fn evict(&self, st: &mut CacheState) {
        let excess = st.recent.len().saturating_sub(self.keep);
        let victims: Vec<String> = st.recent[..excess]
            .iter()
            .filter(|sha| !st.fetching.contains_key(*sha))
            .cloned()
            .collect();
        for sha in victims {
            st.recent.retain(|s| *s != sha);
            st.loaded.remove(&sha);
            let raw = self.dir.join(&sha);
            for ext in ["pt", "safetensors"] {
                let _ = std::fs::remove_file(raw.with_extension(ext));
            }
            let _ = std::fs::remove_file(&raw);
            tracing::info!(checkpoint = %sha, "checkpoint evicted from the cache");
        }
    }

    /// The encoder for `sha`, downloading and loading it on first use:
    /// downloaded into the cache first, then loaded on a blocking thread.
    /// Only jobs for the same checkpoint wait for each other.
    async fn encoder(
        &self,
        api: &ServerApi,
        lease: LeaseRef,
        sha: &str,
    ) -> Result<Arc<Encoder>, StepError> {
        if !valid_sha(sha) {
            return Err((
                FailureClass::Fatal,
                format!("bad checkpoint sha256 {sha:?}"),
            ));
        }
        let loaded = self.state().loaded.get(sha).cloned();
        if let Some(e) = loaded {
            self.touch(sha);
            return Ok(e);
        }
        let lock = self
            .state()
            .fetching
            .entry(sha.to_string())
            .or_default()
            .clone();
        let result = {
            let _fetching = lock.lock().await;
            self.fetch_and_load(api, lease, sha).await
        };
        {
            let mut st = self.state();
            // The map's and ours: no other job waits on it.
            if Arc::strong_count(&lock) == 2 {
                st.fetching.remove(sha);
            }
        }
        if result.is_ok() {
            self.touch(sha);
        }
        result
    }

    /// [`TileCache::encoder`] under the checkpoint's own lock.
    async fn fetch_and_load(
        &self,
        api: &ServerApi,
        lease: LeaseRef,
        sha: &str,
    ) -> Result<Arc<Encoder>, StepError> {
        // Another job may have loaded it while this one waited.
        let loaded = self.state().loaded.get(sha).cloned();
        if let Some(e) = loaded {
            return Ok(e);
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
            Encoder::load(&named, setup.choice, setup.profile).map_err(|e| {
                // Useless to keep: the next job fetches it again.
                let _ = std::fs::remove_file(&named);
                let _ = std::fs::remove_file(&raw);
                (FailureClass::Fatal, format!("loading the checkpoint: {e}"))
            })
        })
        .await
        .map_err(|e| (FailureClass::Retryable, format!("loading panicked: {e}")))??;
        let enc = Arc::new(enc);
        self.state().loaded.insert(sha.to_string(), enc.clone());
        Ok(enc)
    }
}

/// A sha256 as 64 hex digits: a checkpoint's name in the cache.
fn valid_sha(sha: &str) -> bool {
    sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit())
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
    // overhead benchmark compares `encode_s` with the whole job. Since the
    // outputs are written beside the encode, `encode_s` includes writing
    // them (all but their last sync and rename).
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
    if let Some(note) =
        tessera_encoder::backend::precision_note(cache.setup().choice, cache.setup().profile.dtype)
    {
        ctx.note(format!("warning: {note}")).await;
    }
    let work = {
        let cancel = cancel.clone();
        let (inputs, out, name) = (inputs.clone(), out.clone(), name.clone());
        let (progress, log) = (ctx.progress.clone(), ctx.log.clone());
        tokio::task::spawn_blocking(move || -> Result<(f64, Vec<PathBuf>), StepError> {
            // Opened and checked now, read a window at a time while encoding:
            // the inputs held at once are a few windows, not the tile.
            let tile = TileReader::open(&inputs)
                .map_err(|e| (FailureClass::Fatal, format!("reading inputs: {e}")))?;
            log.agent_blocking(format!(
                "encoding {}×{} = {} px ({} S2 and {} S1 frames) on backend {backend}",
                tile.width(),
                tile.height(),
                tile.pixels(),
                tile.s2_frames(),
                tile.s1_frames(),
            ));
            let report = |done: usize, total: usize| progress(done as u64, total as u64);
            let encoding = Instant::now();
            // Written as the windows are encoded (the embedding is never
            // held whole); into place, under the final names, once all are.
            let writing_failed = |e| (FailureClass::Retryable, format!("writing outputs: {e}"));
            let mut written = OutputWriter::create(
                &out,
                &name,
                OutputOptions {
                    int8: true,
                    dim: 128,
                },
                (tile.height(), tile.width()),
                encoder.config().repr_dim,
            )
            .map_err(|e| match e {
                e @ tessera_encoder::EncodeError::Io { .. } => writing_failed(e),
                // Another process writing this output, or a setting no
                // retry changes.
                e => (FailureClass::Fatal, format!("writing outputs: {e}")),
            })?;
            encoder
                .encode_into(&tile, &mut written, &report, &cancel)
                .map_err(|e| match e {
                    tessera_encoder::EncodeError::Cancelled => {
                        (FailureClass::Cancelled, "stopped".to_string())
                    }
                    // The output's own files (a full or failing disk).
                    tessera_encoder::EncodeError::Io { ref path, .. } if path.starts_with(&out) => {
                        writing_failed(e)
                    }
                    e => (FailureClass::Fatal, format!("encoding: {e}")),
                })?;
            let encode_s = encoding.elapsed().as_secs_f64();
            let files = written.finish().map_err(writing_failed)?;
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
        ctx.upload(&n, file)
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
        ctx.download(&format!("inputs/{file}"), &inputs.join(file))
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
    use crate::server_api::TransferLimits;
    use sha2::Digest;
    use tokio::io::AsyncReadExt;
    use uuid::Uuid;

    /// Writes a small random checkpoint into `dir` under its own sha256.
    fn checkpoint_in(dir: &Path, seed: u64) -> String {
        let tmp = dir.join(format!("seed-{seed}.tmp"));
        let ckpt = tessera_encoder::random_checkpoint(&tessera_encoder::ModelConfig::small(), seed);
        tessera_encoder::write_safetensors(&ckpt, &tmp).unwrap();
        let sha = hex::encode(sha2::Sha256::digest(std::fs::read(&tmp).unwrap()));
        std::fs::rename(&tmp, dir.join(&sha)).unwrap();
        sha
    }

    fn cache(dir: &Path) -> TileCache {
        TileCache::new(dir.to_path_buf(), EncoderSetup::detect(None).unwrap())
    }

    /// A server that reads each request and never answers; a client of it
    /// whose downloads stall for `stall`.
    async fn silent_server(stall: Duration) -> ServerApi {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let (mut conn, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let _ = conn.read(&mut [0u8; 4096]).await;
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                });
            }
        });
        ServerApi::new(&url, "token")
            .unwrap()
            .with_transfer_limits(TransferLimits {
                stall,
                ..TransferLimits::default()
            })
    }

    fn lease() -> LeaseRef {
        LeaseRef {
            job_id: Uuid::new_v4(),
            lease_token: Uuid::new_v4(),
        }
    }

    /// M11: the checkpoint download ran under the lock of every loaded
    /// encoder, so one download that stalled held up every tile job.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_checkpoint_download_holds_up_no_job_of_another_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let on_disk = checkpoint_in(dir.path(), 1);
        let cache = Arc::new(cache(dir.path()));
        let api = silent_server(Duration::from_secs(30)).await;
        let stalled = {
            let (cache, api) = (cache.clone(), api.clone());
            tokio::spawn(async move { cache.encoder(&api, lease(), &"a".repeat(64)).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let other = tokio::time::timeout(
            Duration::from_secs(20),
            cache.encoder(&api, lease(), &on_disk),
        )
        .await
        .expect("not held up by the stalled download");
        assert!(other.is_ok(), "{:?}", other.err());
        assert!(!stalled.is_finished(), "that one still downloads");
        stalled.abort();
    }

    #[tokio::test]
    async fn a_stalled_checkpoint_download_fails_the_job_for_a_retry() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache(dir.path());
        let api = silent_server(Duration::from_millis(500)).await;
        let Err((class, message)) = cache.encoder(&api, lease(), &"b".repeat(64)).await else {
            panic!("a stalled download fails")
        };
        assert_eq!(class, FailureClass::Retryable);
        assert!(message.contains("stalled"), "{message}");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "no part file left: {left:?}");
    }

    /// M10: every checkpoint an agent had seen stayed on disk and loaded.
    #[tokio::test]
    async fn only_the_most_recently_used_checkpoints_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache(dir.path());
        // Put there after the cache started (which keeps only two).
        let shas: Vec<String> = (1..=3)
            .map(|seed| checkpoint_in(dir.path(), seed))
            .collect();
        // Nothing to download: an unreachable server is never asked.
        let api = ServerApi::new("http://127.0.0.1:9", "token").unwrap();
        for sha in [&shas[0], &shas[1], &shas[0], &shas[2]] {
            cache.encoder(&api, lease(), sha).await.unwrap();
        }
        let st = cache.state();
        assert_eq!(st.recent, [shas[0].clone(), shas[2].clone()]);
        let mut loaded: Vec<_> = st.loaded.keys().cloned().collect();
        loaded.sort();
        let mut expected = vec![shas[0].clone(), shas[2].clone()];
        expected.sort();
        assert_eq!(loaded, expected);
        let mut files: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let mut expected: Vec<String> = [&shas[0], &shas[2]]
            .iter()
            .flat_map(|s| [s.to_string(), format!("{s}.safetensors")])
            .collect();
        expected.sort();
        assert_eq!(files, expected, "the least recently used one is gone");
    }

    #[test]
    fn at_start_part_files_go_and_the_newest_checkpoints_stay() {
        let dir = tempfile::tempdir().unwrap();
        let shas: Vec<String> = (0..4).map(|i| format!("{i}").repeat(64)).collect();
        for (i, sha) in shas.iter().enumerate() {
            let path = dir.path().join(sha);
            std::fs::write(&path, b"x").unwrap();
            let t = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000 + i as u64);
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        std::fs::write(
            dir.path().join(format!("{}.part-abc", "9".repeat(64))),
            b"x",
        )
        .unwrap();
        let cache = cache(dir.path());
        assert_eq!(cache.state().recent, shas[2..]);
        let mut files: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        assert_eq!(files, shas[2..]);
    }

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
