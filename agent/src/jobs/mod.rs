//! How each kind of job runs, and the [`JobContext`] every kind shares.
//!
//! [`Kinds`] is what the loops in [`crate::runner`] call: it gives the job a
//! context (identity, stop token, progress, log, scratch directory) and
//! dispatches on the kind, the one place that knows every kind.
//!
//! - [`command`]: a shell command with declared outputs.
//! - [`tile`]: a TESSERA tile: checkpoint cache, inputs, encoder, outputs.
//! - [`revdeps`]: phase 1 or a phase-2 shard of an opam revdeps run.
//! - [`step`]: one job of a pipeline run, here or on an ssh host.
//! - [`log`]: the job's log, batched to the server.
//! - [`outputs`]: a job's output opened without following its links (the
//!   agent may be root and the job not).
//! - [`workdirs`]: attempts' scratch directories, removed after them but
//!   for the last few failed ones.

pub mod command;
pub mod log;
pub mod outputs;
pub mod revdeps;
pub mod step;
pub mod tile;
pub mod workdirs;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use flotilla_core::job::{FailureClass, JobKind, JobSpec};
use flotilla_core::protocol::{Complete, Fail, LeaseRef, LeasedJob};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::devices::EncoderSetup;
use crate::process::{self, CommandSpec, Outcome, ProcessError, RunAs};
use crate::server_api::{Delivery, ServerApi};

use self::log::JobLog;

/// Progress sink: units done of total (pixels for a tile job).
pub type ProgressFn = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// What the loops hand a job besides the job itself.
pub struct JobControl {
    /// Fires when the job must stop: cancelled, lease lost, or shutdown.
    pub stop: CancellationToken,
    /// How long deliveries to the server (log lines) are retried, and how
    /// to say one ran out of budget; see [`crate::runner`].
    pub delivery: Delivery,
    /// Where progress goes; the next heartbeat carries it.
    pub progress: ProgressFn,
}

/// Runs one leased job to the report it should make: [`Kinds`] in the agent,
/// a fake in the loops' tests.
pub trait Execute: Send + Sync + 'static {
    fn execute(
        &self,
        job: &LeasedJob,
        control: JobControl,
    ) -> impl Future<Output = Result<Complete, Fail>> + Send;
}

/// The job kinds this agent runs and what they keep between jobs.
pub struct Kinds {
    api: ServerApi,
    /// Attempts' scratch directories, `WORKDIR/jobs/{id}-{attempt}`.
    workdirs: workdirs::WorkDirs,
    kill_grace: Duration,
    /// Who jobs' processes run as and what environment they start from.
    run_as: RunAs,
    repos: Arc<revdeps::RepoCache>,
    /// Master connections to the ssh hosts of pipeline steps, one per host
    /// (none without `--ssh-dir`).
    ssh: step::SshSessions,
    /// Checkpoints and loaded encoders for tile jobs; `None` when no encoder
    /// backend could be set up here (the agent then does not offer the
    /// `tile` kind).
    tiles: Option<Arc<tile::TileCache>>,
}

impl Kinds {
    /// Sets up every kind this host can run, their processes run as
    /// `run_as`, the last `keep_failed` failed attempts' directories kept,
    /// ssh hosts reached with what `ssh_dir` holds (none without it).
    /// Tile jobs need an encoder backend, with its profile from
    /// `encoder_profile` (see `devices::profile_file`) where that has one
    /// for this device.
    pub fn detect(
        api: ServerApi,
        workdir: &Path,
        kill_grace: Duration,
        run_as: RunAs,
        keep_failed: usize,
        ssh_dir: Option<step::SshDir>,
        encoder_profile: Option<&Path>,
    ) -> Self {
        let tiles = match EncoderSetup::detect(encoder_profile) {
            Ok(setup) => Some(Arc::new(tile::TileCache::new(
                workdir.join("cache").join("checkpoints"),
                setup,
            ))),
            Err(e) => {
                tracing::warn!(error = %e, "no encoder here; not taking tile jobs");
                None
            }
        };
        Kinds {
            api,
            workdirs: workdirs::WorkDirs::new(
                workdir.join("jobs"),
                workdir.join("agent-side"),
                keep_failed,
            ),
            kill_grace,
            run_as,
            repos: Arc::new(revdeps::RepoCache::default()),
            ssh: step::SshSessions::new(&workdir.join("ssh"), ssh_dir),
            tiles,
        }
    }

    /// The kinds to register.
    pub fn names(&self) -> Vec<JobKind> {
        let mut kinds = vec![JobKind::Command, JobKind::Revdeps];
        if step::SUPPORTED {
            kinds.push(JobKind::Step);
        }
        if self.tiles.is_some() {
            kinds.push(JobKind::Tile);
        }
        kinds
    }

    /// The encoder tile jobs run on, if this agent takes them.
    pub fn encoder(&self) -> Option<&EncoderSetup> {
        self.tiles.as_deref().map(tile::TileCache::setup)
    }
}

impl Execute for Kinds {
    async fn execute(&self, job: &LeasedJob, control: JobControl) -> Result<Complete, Fail> {
        let lease = LeaseRef {
            job_id: job.job_id,
            lease_token: job.lease_token,
        };
        let (log, forwarder) = JobLog::start(self.api.clone(), lease, control.delivery);
        let job_dir = self.workdirs.for_attempt(job.job_id, job.attempt);
        let ctx = JobContext {
            api: self.api.clone(),
            lease,
            attempt: job.attempt,
            cost: job.cost,
            stop: control.stop,
            progress: control.progress,
            log,
            job_dir: job_dir.clone(),
            agent_dir: self
                .workdirs
                .agent_side_for_attempt(job.job_id, job.attempt),
            kill_grace: self.kill_grace,
            run_as: self.run_as.clone(),
        };
        let result = match &job.spec {
            JobSpec::Command(cmd) => command::run(&ctx, cmd).await,
            JobSpec::Revdeps(spec) => revdeps::run(&ctx, &self.repos, spec).await,
            JobSpec::Tile(spec) => match &self.tiles {
                Some(cache) => tile::run(&ctx, cache, spec).await,
                None => Err(ctx.fail(FailureClass::Retryable, "this agent has no encoder")),
            },
            JobSpec::Step(spec) => step::run(&ctx, &self.ssh, spec).await,
        };
        // The log reaches the server before the report does.
        drop(ctx);
        forwarder.finish().await;
        self.workdirs.finished(&job_dir, result.is_ok()).await;
        result
    }
}

/// How long an output's upload (or an input's download) is tried again
/// while no server answers: as
/// long as the agent retries its reports (`runner`'s default budget), so an
/// outage the report would outlast does not fail the attempt first.
pub const UPLOAD_RETRY_BUDGET: Duration = Duration::from_secs(600);

/// One attempt of one job, as every kind sees it.
pub struct JobContext {
    pub api: ServerApi,
    pub lease: LeaseRef,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// Slots the job holds (a revdeps step uses as many threads).
    pub cost: u32,
    /// Fires when the job must stop.
    pub stop: CancellationToken,
    pub progress: ProgressFn,
    pub log: JobLog,
    /// This attempt's scratch directory, `WORKDIR/jobs/{id}-{attempt}`;
    /// made by the kind that needs it.
    pub job_dir: PathBuf,
    /// This attempt's agent-side directory,
    /// `WORKDIR/agent-side/{id}-{attempt}`: for the files the agent itself
    /// writes and reads for the job, where the job's user can plant no
    /// link (made 0700 by the kind that needs it; removed with the attempt).
    pub agent_dir: PathBuf,
    /// Between SIGTERM and SIGKILL when a process of the job is stopped.
    pub kill_grace: Duration,
    /// Who the job's processes run as; directories they write are handed
    /// to that user with [`RunAs::give_dir`].
    pub run_as: RunAs,
}

impl JobContext {
    pub fn job_id(&self) -> Uuid {
        self.lease.job_id
    }

    /// Uploads the output `name` from `file`, tried again while no server
    /// answers, for as long as the attempt lasts (at most
    /// [`UPLOAD_RETRY_BUDGET`]).
    pub async fn upload(
        &self,
        name: &str,
        file: &Path,
    ) -> Result<flotilla_core::api::OutputView, crate::server_api::CallError> {
        self.api
            .upload_retrying(self.lease, name, file, &self.stop, UPLOAD_RETRY_BUDGET)
            .await
    }

    /// Downloads `path` (under the job, lease-checked) into `dest`, tried
    /// again while no server answers, as [`JobContext::upload`]; returns
    /// its size and sha256.
    pub async fn download(
        &self,
        path: &str,
        dest: &Path,
    ) -> Result<(u64, String), crate::server_api::CallError> {
        crate::server_api::while_unreachable(&self.stop, UPLOAD_RETRY_BUDGET, path, || {
            self.api.download(self.lease, path, dest)
        })
        .await
    }

    /// The report of a failed attempt.
    pub fn fail(&self, class: FailureClass, message: impl Into<String>) -> Fail {
        Fail::new(self.lease.lease_token, class, message)
    }

    /// The report of a successful attempt.
    pub fn complete(
        &self,
        exit_code: Option<i32>,
        outputs: Vec<String>,
        result: Option<serde_json::Value>,
    ) -> Complete {
        Complete {
            lease_token: self.lease.lease_token,
            exit_code,
            outputs,
            result,
            // The runner adds the last progress the job reported.
            progress: None,
        }
    }

    /// Writes a line of the agent's own into the job's log.
    pub async fn note(&self, text: impl Into<String>) {
        self.log.agent(text).await;
    }

    /// Runs `spec` under [`process::run`], stopped by the job's stop token,
    /// its output lines going to the job's log.
    pub async fn run_process(&self, spec: &CommandSpec) -> Result<Outcome, ProcessError> {
        let (tx, mut rx) = mpsc::channel::<process::LogLine>(256);
        let relay = async {
            while let Some(line) = rx.recv().await {
                self.log.line(line.into()).await;
            }
        };
        // `run` drops its sender when it returns, which ends the relay.
        let (outcome, ()) = tokio::join!(process::run(spec, tx, self.stop.clone()), relay);
        outcome
    }
}
