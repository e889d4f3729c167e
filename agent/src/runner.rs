//! The agent's loops: register, then lease while below capacity, run each
//! job on its own task, heartbeat every lease, report each result exactly
//! once. Shutdown stops leasing, stops the running jobs and hands them back
//! as retryable, so nothing waits for a lease to expire.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_core::api::{AgentState, Progress};
use flotilla_core::job::{CommandJob, FailureClass, JobSpec};
use flotilla_core::protocol::{
    Complete, Fail, Heartbeat, HeldLease, LeaseAction, LeaseRef, LeasedJob, LogBatch, LogLine,
    LogStream, Register,
};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::health::HealthCollector;
use crate::process::{self, CommandSpec, Outcome};
use crate::server_api::{CallError, ServerApi};

/// How the agent was configured.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub capacity: u32,
    pub workdir: PathBuf,
    pub kill_grace: Duration,
    /// Longest a lease request waits at the server.
    pub lease_wait: Duration,
}

/// Why a running job is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    Cancelled,
    Lost,
    Shutdown,
}

struct Running {
    lease: LeaseRef,
    cost: u32,
    progress: Option<Progress>,
    stop: CancellationToken,
    reason: Option<StopReason>,
}

/// What the loops share.
struct Shared {
    api: ServerApi,
    config: AgentConfig,
    running: Mutex<HashMap<Uuid, Running>>,
    /// Signalled when a job ends (slots freed) or the state changes.
    changed: Notify,
    state: Mutex<AgentState>,
    repos: Arc<crate::revdeps_job::RepoCache>,
    /// Checkpoints and loaded encoders for tile jobs; `None` when no
    /// encoder backend could be set up here (the agent then does not offer
    /// the `tile` kind).
    tiles: Option<Arc<crate::tile_job::TileCache>>,
}

impl Shared {
    fn used_slots(&self) -> u32 {
        self.running
            .lock()
            .expect("running-jobs lock is never poisoned")
            .values()
            .map(|r| r.cost)
            .sum()
    }

    /// Records a running job's progress; the next heartbeat carries it.
    fn set_progress(&self, job: Uuid, done: u64, total: u64) {
        if let Some(r) = self
            .running
            .lock()
            .expect("running-jobs lock is never poisoned")
            .get_mut(&job)
        {
            r.progress = Some(Progress { done, total });
        }
    }

    fn stop_job(&self, job: Uuid, reason: StopReason) {
        let mut running = self
            .running
            .lock()
            .expect("running-jobs lock is never poisoned");
        if let Some(r) = running.get_mut(&job) {
            r.reason.get_or_insert(reason);
            r.stop.cancel();
        }
    }
}

/// Runs the agent until `shutdown`.
pub async fn run(
    api: ServerApi,
    config: AgentConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(config.workdir.join("jobs"))?;
    let mut health = HealthCollector::new(&config.workdir);
    let profile_file = std::env::var_os("FLOTILLA_ENCODER_PROFILE").map(PathBuf::from);
    let tiles = match crate::tile_job::EncoderSetup::detect(profile_file.as_deref()) {
        Ok(setup) => Some(Arc::new(crate::tile_job::TileCache::new(
            config.workdir.join("cache").join("checkpoints"),
            setup,
        ))),
        Err(e) => {
            tracing::warn!(error = %e, "no encoder here; not taking tile jobs");
            None
        }
    };
    let mut kinds = vec!["command".to_string(), "revdeps".to_string()];
    if tiles.is_some() {
        kinds.push("tile".to_string());
    }
    let reg = Register {
        name: config.name.clone(),
        labels: config.labels.clone(),
        capacity: config.capacity,
        kinds,
        version: env!("CARGO_PKG_VERSION").to_string(),
        health: health.collect(),
        devices: serde_json::json!({
            "cpu": health.collect().cpu_model,
            "encoder": tiles.as_ref().map(|t| t.setup().describe()),
        }),
    };
    let registered = match api.register(&reg, &shutdown).await {
        Ok(r) => r,
        Err(CallError::ShuttingDown) => return Ok(()),
        Err(e) => anyhow::bail!("registering as `{}`: {e}", config.name),
    };
    tracing::info!(name = %config.name, capacity = config.capacity, state = ?registered.state, "registered");
    let shared = Arc::new(Shared {
        api,
        config,
        running: Mutex::new(HashMap::new()),
        changed: Notify::new(),
        state: Mutex::new(registered.state),
        repos: Arc::new(crate::revdeps_job::RepoCache::default()),
        tiles,
    });
    // Leases from before a restart belong to processes that died with us:
    // hand them back now rather than after they expire.
    for orphan in registered.held_leases {
        let f = Fail {
            lease_token: orphan.lease_token,
            class: FailureClass::Retryable,
            message: "the agent restarted while running this job".into(),
            exit_code: None,
        };
        if let Err(e) = shared.api.fail(orphan.job_id, &f, &shutdown).await {
            tracing::warn!(job = %orphan.job_id, error = %e, "could not hand back an orphaned lease");
        }
    }

    let jobs = TaskTracker::new();
    let hb_stop = CancellationToken::new();
    let heartbeat = tokio::spawn(heartbeat_loop(
        shared.clone(),
        health,
        Duration::from_millis(registered.heartbeat_interval_ms.max(50)),
        hb_stop.clone(),
    ));

    lease_loop(&shared, &jobs, &shutdown).await;

    // Shutdown: stop every running job and wait for each to report.
    let ids: Vec<Uuid> = shared
        .running
        .lock()
        .expect("running-jobs lock is never poisoned")
        .keys()
        .copied()
        .collect();
    for id in ids {
        shared.stop_job(id, StopReason::Shutdown);
    }
    jobs.close();
    jobs.wait().await;
    hb_stop.cancel();
    let _ = heartbeat.await;
    Ok(())
}

async fn lease_loop(shared: &Arc<Shared>, jobs: &TaskTracker, shutdown: &CancellationToken) {
    let mut backoff = Duration::from_millis(100);
    loop {
        // Arm before checking so a slot freed in between is not missed.
        let changed = shared.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let active =
            *shared.state.lock().expect("state lock is never poisoned") == AgentState::Active;
        if !active || shared.used_slots() >= shared.config.capacity {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = changed => {}
                // The state may change at the server between heartbeats.
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
            continue;
        }
        let reply = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = shared.api.lease(shared.config.lease_wait, shutdown) => r,
        };
        match reply {
            Ok(r) => {
                backoff = Duration::from_millis(100);
                if let Some(job) = r.job {
                    start_job(shared, jobs, job, shutdown);
                }
            }
            Err(CallError::ShuttingDown) => return,
            Err(e) => {
                tracing::warn!(error = %e, "lease request refused; backing off");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

fn start_job(
    shared: &Arc<Shared>,
    jobs: &TaskTracker,
    job: LeasedJob,
    shutdown: &CancellationToken,
) {
    let lease = LeaseRef {
        job_id: job.job_id,
        lease_token: job.lease_token,
    };
    let stop = CancellationToken::new();
    shared
        .running
        .lock()
        .expect("running-jobs lock is never poisoned")
        .insert(
            job.job_id,
            Running {
                lease,
                cost: job.cost,
                progress: None,
                stop: stop.clone(),
                reason: None,
            },
        );
    tracing::info!(job = %job.job_id, attempt = job.attempt, kind = job.spec.kind(), "running");
    let shared = shared.clone();
    // Reporting must outlive a shutdown request: it has its own token that
    // only fires if the report cannot be delivered for a long time.
    let report_stop = shutdown.child_token();
    jobs.spawn(async move {
        execute(&shared, &job, lease, stop, &report_stop).await;
        shared
            .running
            .lock()
            .expect("running-jobs lock is never poisoned")
            .remove(&job.job_id);
        shared.changed.notify_waiters();
    });
}

/// Runs one job and reports its end exactly once.
async fn execute(
    shared: &Arc<Shared>,
    job: &LeasedJob,
    lease: LeaseRef,
    stop: CancellationToken,
    report_stop: &CancellationToken,
) {
    // The report must be delivered even while shutting down; give it a
    // bounded time of its own.
    let never = CancellationToken::new();
    let _ = report_stop;
    if let Err(e) = shared.api.start(lease, &never).await {
        tracing::warn!(job = %job.job_id, error = %e, "start refused; dropping the lease");
        return;
    }
    let result = match &job.spec {
        JobSpec::Command(cmd) => run_command(shared, job, lease, cmd, stop).await,
        JobSpec::Revdeps(r) => run_revdeps(shared, job, lease, r, stop).await,
        JobSpec::Tile(t) => run_tile(shared, job, lease, t, stop).await,
    };
    let reason = shared
        .running
        .lock()
        .expect("running-jobs lock is never poisoned")
        .get(&job.job_id)
        .and_then(|r| r.reason);
    let report = match (result, reason) {
        (_, Some(StopReason::Lost)) => {
            tracing::warn!(job = %job.job_id, "lease lost; stopped without reporting");
            return;
        }
        (_, Some(StopReason::Cancelled)) => Err(Fail {
            lease_token: lease.lease_token,
            class: FailureClass::Cancelled,
            message: "cancelled".into(),
            exit_code: None,
        }),
        (_, Some(StopReason::Shutdown)) => Err(Fail {
            lease_token: lease.lease_token,
            class: FailureClass::Retryable,
            message: "the agent shut down while running this job".into(),
            exit_code: None,
        }),
        (r, None) => r,
    };
    let sent = match &report {
        Ok(c) => shared.api.complete(job.job_id, c, &never).await,
        Err(f) => shared.api.fail(job.job_id, f, &never).await,
    };
    match sent {
        Ok(v) => tracing::info!(job = %job.job_id, result = %v, "reported"),
        Err(e) if e.lease_gone() => {
            tracing::warn!(job = %job.job_id, error = %e, "report refused: the lease is no longer ours")
        }
        Err(e) => tracing::error!(job = %job.job_id, error = %e, "could not report"),
    }
}

/// Runs a command job: process, log forwarding, outputs.
async fn run_command(
    shared: &Arc<Shared>,
    job: &LeasedJob,
    lease: LeaseRef,
    cmd: &CommandJob,
    stop: CancellationToken,
) -> Result<Complete, Fail> {
    let fail = |class, message: String, exit_code| Fail {
        lease_token: lease.lease_token,
        class,
        message,
        exit_code,
    };
    let job_dir = shared
        .config
        .workdir
        .join("jobs")
        .join(format!("{}-{}", job.job_id, job.attempt));
    let workdir = match &cmd.workdir {
        Some(w) if std::path::Path::new(w).is_absolute() => PathBuf::from(w),
        Some(w) => job_dir.join(w),
        None => job_dir.clone(),
    };
    if let Err(e) = std::fs::create_dir_all(&workdir) {
        return Err(fail(
            FailureClass::Retryable,
            format!("cannot make work directory {}: {e}", workdir.display()),
            None,
        ));
    }
    let mut env = cmd.env.clone();
    env.insert("FLOTILLA_JOB_ID".into(), job.job_id.to_string());
    env.insert("FLOTILLA_ATTEMPT".into(), job.attempt.to_string());
    let spec = CommandSpec {
        command: cmd.command.clone(),
        env,
        workdir: workdir.clone(),
        timeout: cmd.timeout_s.map(Duration::from_secs),
        kill_grace: shared.config.kill_grace,
    };
    let (tx, rx) = mpsc::channel(1024);
    let forward = tokio::spawn(forward_logs(shared.api.clone(), job.job_id, lease, rx));
    let outcome = process::run(&spec, tx, stop).await;
    // All lines are delivered before run returns and the sender is dropped;
    // wait until they reached the server.
    let _ = forward.await;
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => return Err(fail(FailureClass::Fatal, e.to_string(), None)),
    };
    let result = match outcome {
        Outcome::Exited { code: 0 } => {
            let mut uploaded = Vec::new();
            for name in &cmd.outputs {
                let path = workdir.join(name);
                match shared.api.upload(lease, name, &path).await {
                    Ok(view) => {
                        tracing::info!(job = %job.job_id, %name, size = view.size, "output stored");
                        uploaded.push(name.clone());
                    }
                    Err(e) => {
                        let class = match &e {
                            CallError::Refused { code, .. } if code == "missing_output" => {
                                FailureClass::Fatal
                            }
                            _ => FailureClass::Retryable,
                        };
                        return Err(fail(class, format!("output `{name}`: {e}"), Some(0)));
                    }
                }
            }
            Ok(Complete {
                lease_token: lease.lease_token,
                exit_code: Some(0),
                outputs: uploaded,
                result: None,
            })
        }
        Outcome::Exited { code } => Err(fail(
            FailureClass::Retryable,
            format!("command exited with code {code}"),
            Some(code),
        )),
        Outcome::Signalled { signal } => Err(fail(
            FailureClass::Retryable,
            format!("command was killed by signal {signal}"),
            None,
        )),
        Outcome::TimedOut => Err(fail(
            FailureClass::TimedOut,
            format!(
                "command ran past its timeout of {}s",
                cmd.timeout_s.unwrap_or(0)
            ),
            None,
        )),
        Outcome::Cancelled => Err(fail(FailureClass::Cancelled, "stopped".into(), None)),
    };
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&job_dir);
    }
    result
}

/// Batches output lines to the server: up to 500 lines or 200 ms.
async fn forward_logs(
    api: ServerApi,
    job: Uuid,
    lease: LeaseRef,
    mut rx: mpsc::Receiver<process::LogLine>,
) {
    let never = CancellationToken::new();
    let mut batch = Vec::new();
    loop {
        let deadline = tokio::time::sleep(Duration::from_millis(200));
        tokio::pin!(deadline);
        let mut closed = false;
        loop {
            tokio::select! {
                line = rx.recv() => match line {
                    Some(l) => {
                        batch.push(LogLine {
                            stream: match l.stream {
                                process::Stream::Stdout => LogStream::Stdout,
                                process::Stream::Stderr => LogStream::Stderr,
                            },
                            line: l.line,
                        });
                        if batch.len() >= 500 { break; }
                    }
                    None => { closed = true; break; }
                },
                _ = &mut deadline => break,
            }
        }
        if !batch.is_empty() {
            let b = LogBatch {
                lease_token: lease.lease_token,
                lines: std::mem::take(&mut batch),
            };
            if let Err(e) = api.log(job, &b, &never).await {
                if e.lease_gone() {
                    // Keep draining so the process is never blocked.
                    while rx.recv().await.is_some() {}
                    return;
                }
                tracing::warn!(%job, error = %e, "log lines lost");
            }
        }
        if closed {
            return;
        }
    }
}

async fn heartbeat_loop(
    shared: Arc<Shared>,
    mut health: HealthCollector,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let leases: Vec<HeldLease> = shared
            .running
            .lock()
            .expect("running-jobs lock is never poisoned")
            .values()
            .map(|r| HeldLease {
                job_id: r.lease.job_id,
                lease_token: r.lease.lease_token,
                progress: r.progress,
            })
            .collect();
        let hb = Heartbeat {
            health: health.collect(),
            leases,
        };
        match shared.api.heartbeat(&hb).await {
            Ok(reply) => {
                let changed = {
                    let mut st = shared.state.lock().expect("state lock is never poisoned");
                    let changed = *st != reply.state;
                    *st = reply.state;
                    changed
                };
                if changed {
                    tracing::info!(state = ?reply.state, "agent state changed");
                    shared.changed.notify_waiters();
                }
                for l in reply.leases {
                    match l.action {
                        LeaseAction::Continue => {}
                        LeaseAction::Cancel => shared.stop_job(l.job_id, StopReason::Cancelled),
                        LeaseAction::Lost => shared.stop_job(l.job_id, StopReason::Lost),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
        }
    }
}

/// Runs a revdeps step on a blocking thread. The solver cannot be
/// interrupted: on cancel the result is dropped when it arrives.
async fn run_revdeps(
    shared: &Arc<Shared>,
    job: &LeasedJob,
    lease: LeaseRef,
    spec: &flotilla_core::job::RevdepsJob,
    stop: CancellationToken,
) -> Result<Complete, Fail> {
    let repos = shared.repos.clone();
    let spec = spec.clone();
    let threads = job.cost as usize;
    let work = tokio::task::spawn_blocking(move || crate::revdeps_job::run(&repos, &spec, threads));
    let fail = |class, message: String| Fail {
        lease_token: lease.lease_token,
        class,
        message,
        exit_code: None,
    };
    tokio::select! {
        _ = stop.cancelled() => Err(fail(FailureClass::Cancelled, "stopped".into())),
        r = work => match r {
            Ok(Ok(result)) => Ok(Complete {
                lease_token: lease.lease_token,
                exit_code: None,
                outputs: vec![],
                result: Some(result),
            }),
            Ok(Err(message)) => Err(fail(FailureClass::Fatal, message)),
            Err(e) => Err(fail(FailureClass::Retryable, format!("the revdeps step panicked: {e}"))),
        }
    }
}

/// Runs a tile job with the encoder (see [`crate::tile_job`]); progress in
/// pixels rides on heartbeats.
async fn run_tile(
    shared: &Arc<Shared>,
    job: &LeasedJob,
    lease: LeaseRef,
    spec: &flotilla_core::job::TileJob,
    stop: CancellationToken,
) -> Result<Complete, Fail> {
    let Some(cache) = shared.tiles.clone() else {
        return Err(Fail {
            lease_token: lease.lease_token,
            class: FailureClass::Retryable,
            message: "this agent has no encoder".into(),
            exit_code: None,
        });
    };
    let progress: crate::tile_job::ProgressFn = {
        let shared = shared.clone();
        let id = job.job_id;
        Arc::new(move |done, total| shared.set_progress(id, done, total))
    };
    crate::tile_job::run(
        &shared.api,
        &cache,
        &shared.config.workdir,
        job,
        lease,
        spec,
        stop,
        progress,
    )
    .await
}
