//! The agent's loops: lease while below capacity, heartbeat every lease, report each job once.
//!
//! Each job runs on its own task and is reported exactly once. Shutdown stops
//! leasing, stops the running jobs and hands them back as retryable, so
//! nothing waits for a lease to expire.
//!
//! # How long a report is retried
//!
//! A job's `start`, its log lines and its report are retried while the server
//! is unreachable or answers 5xx, each for at most the report budget
//! ([`AgentConfig::report_budget`], 10 minutes by default). A report that
//! still has not passed then is given up and the job's lease dropped: the
//! agent stops heartbeating it (a log that cannot be delivered stops the job
//! first), the lease expires at the server, and the reaper requeues the job.
//! Without a budget, a report the server fails every time (a store that
//! cannot copy, a handler that panics) kept the job `running` for ever while
//! heartbeats extended its lease. The budget outlasts a server restart: the
//! server gives every live lease one more TTL when it starts
//! (`grace_after_start`), so a result still counts after an outage shorter
//! than the budget.
//!
//! Once shutdown is requested, retrying stops sooner, when the lease has
//! certainly expired at the server: one lease TTL after the last answer that
//! extended it (the lease itself, or a heartbeat). Past that, a server that
//! is up has reaped the lease and would refuse the report, and one that is
//! down requeues the job itself; waiting longer would only keep the agent
//! from exiting. So a stopped agent exits within its kill grace plus one
//! lease TTL (plus a try in flight) even with the server down.

mod server;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_core::api::{AgentState, Progress};
use flotilla_core::health::HostHealth;
use flotilla_core::job::FailureClass;
use flotilla_core::protocol::{
    Fail, Heartbeat, HeldLease, LeaseAction, LeaseRef, LeasedJob, Register,
};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::backoff::Backoff;
use crate::health::HealthCollector;
use crate::jobs::{Execute, JobControl, Kinds};
use crate::server_api::{CallError, Delivery, JobCall, ServerApi};

pub use self::server::Server;

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
    /// Who jobs' processes run as and the environment they start from.
    pub run_as: crate::process::RunAs,
    /// Longest a job's start, log batch or report is retried before the
    /// lease is dropped (see the module documentation).
    pub report_budget: Duration,
    /// How many failed attempts' directories are kept for a look.
    pub keep_failed_dirs: usize,
    /// `--ssh-dir`: the keys and known hosts pipeline steps reach ssh
    /// hosts with; `None`: this agent reaches none (and does not carry
    /// [`flotilla_core::job::SSH_LABEL`], so it is given no such step).
    pub ssh_dir: Option<crate::jobs::step::SshDir>,
    /// The encoder profile file tile jobs run with (`--encoder-profile`, or
    /// `WORKDIR/encoder-profiles.toml` where present); `None`: the untuned
    /// defaults.
    pub encoder_profile: Option<PathBuf>,
}

impl AgentConfig {
    /// The labels to register: the configured ones, and
    /// [`flotilla_core::job::SSH_LABEL`] when ssh hosts are reachable
    /// (every step job on an ssh host requires it).
    pub fn registered_labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.labels.clone();
        if self.ssh_dir.is_some() {
            let (k, v) = flotilla_core::job::SSH_LABEL;
            labels.insert(k.to_string(), v.to_string());
        }
        labels
    }
}

/// [`AgentConfig::report_budget`] unless configured: long enough for a
/// server restart or a short network outage, short enough that a report the
/// server can never take frees its job within minutes.
pub const DEFAULT_REPORT_BUDGET: Duration = Duration::from_secs(600);

/// How often a full or paused agent looks at its state again without being
/// woken: the state may change at the server between heartbeats.
const IDLE_RECHECK: Duration = Duration::from_secs(2);

/// Back-off between refused lease requests: from 100 ms (a server that
/// restarts answers again within that) to 10 s (a misconfigured agent polls
/// six times a minute, not ten times a second).
const LEASE_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(10));

/// Registers as `config.name`, hands back leases from before a restart, then
/// runs the loops until `shutdown`.
pub async fn run(
    api: ServerApi,
    config: AgentConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(config.workdir.join("jobs"))?;
    let mut health = HealthCollector::new(&config.workdir);
    let kinds = Kinds::detect(
        api.clone(),
        &config.workdir,
        config.kill_grace,
        config.run_as.clone(),
        config.keep_failed_dirs,
        config.ssh_dir.clone(),
        config.encoder_profile.as_deref(),
    );
    let host = health.collect();
    let reg = Register {
        name: config.name.clone(),
        instance: api.instance(),
        labels: config.registered_labels(),
        capacity: config.capacity,
        kinds: kinds.names(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        devices: crate::devices::registration(&host.cpu_model, kinds.encoder()),
        health: host,
    };
    // Another process under our name that is still online (typically this
    // agent before a crash, until its heartbeats are a lease TTL old) makes
    // the server refuse; keep asking until it has gone silent.
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(5));
    let registered = loop {
        match api.register(&reg, &shutdown).await {
            Ok(r) => break r,
            Err(CallError::ShuttingDown) => return Ok(()),
            Err(e) if e.name_in_use() => {
                tracing::warn!(name = %config.name, error = %e, "name in use; registering again shortly");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
            Err(e) => anyhow::bail!("registering as `{}`: {e}", config.name),
        }
    };
    tracing::info!(name = %config.name, capacity = config.capacity, state = ?registered.state,
                   orphans_failed = registered.orphans_failed, "registered");
    let loops = Loops::new(api, kinds, &config, registered.state);
    let interval = Duration::from_millis(registered.heartbeat_interval_ms.max(50));
    loops
        .run(move || health.collect(), interval, shutdown)
        .await;
    Ok(())
}

/// Why a running job is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    Cancelled,
    Lost,
    Shutdown,
    /// A delivery about the job ran out of budget: stop it and drop the
    /// lease without a report.
    Abandoned,
}

struct Running {
    lease: LeaseRef,
    cost: u32,
    progress: Option<Progress>,
    stop: CancellationToken,
    reason: Option<StopReason>,
    /// When the server last answered a call that extended the lease (the
    /// lease itself, then each heartbeat): the server set its expiry no
    /// later than this plus `ttl`.
    extended_at: Instant,
    ttl: Duration,
}

/// The loops' shared state, over the server `S` and what runs the jobs, `E`.
struct Loops<S, E> {
    server: S,
    exec: E,
    capacity: u32,
    lease_wait: Duration,
    report_budget: Duration,
    running: Mutex<HashMap<Uuid, Running>>,
    /// Signalled when a job ends (slots freed) or the state changes; the
    /// lease loop waits on it while full or not active.
    changed: Notify,
    state: Mutex<AgentState>,
}

impl<S: Server, E: Execute> Loops<S, E> {
    fn new(server: S, exec: E, config: &AgentConfig, state: AgentState) -> Arc<Self> {
        Arc::new(Loops {
            server,
            exec,
            capacity: config.capacity,
            lease_wait: config.lease_wait,
            report_budget: config.report_budget,
            running: Mutex::new(HashMap::new()),
            changed: Notify::new(),
            state: Mutex::new(state),
        })
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Running>> {
        self.running
            .lock()
            .expect("running-jobs lock is never poisoned")
    }

    fn used_slots(&self) -> u32 {
        self.running().values().map(|r| r.cost).sum()
    }

    /// Records a running job's progress; the next heartbeat carries it.
    fn set_progress(&self, job: Uuid, done: u64, total: u64) {
        if let Some(r) = self.running().get_mut(&job) {
            r.progress = Some(Progress { done, total });
        }
    }

    fn stop_job(&self, job: Uuid, reason: StopReason) {
        if let Some(r) = self.running().get_mut(&job) {
            r.reason.get_or_insert(reason);
            r.stop.cancel();
        }
    }

    /// Leases and runs jobs until `shutdown`, heartbeating every `interval`
    /// with `health`; then stops every running job and waits for each to
    /// report.
    async fn run(
        self: Arc<Self>,
        health: impl FnMut() -> HostHealth + Send + 'static,
        interval: Duration,
        shutdown: CancellationToken,
    ) {
        let jobs = TaskTracker::new();
        let hb_stop = CancellationToken::new();
        let heartbeat = tokio::spawn(self.clone().heartbeat_loop(
            health,
            interval,
            hb_stop.clone(),
        ));

        self.lease_loop(&jobs, &shutdown).await;

        let ids: Vec<Uuid> = self.running().keys().copied().collect();
        for id in ids {
            self.stop_job(id, StopReason::Shutdown);
        }
        jobs.close();
        jobs.wait().await;
        // Heartbeats go on until the last report: they keep the leases of
        // jobs still reporting alive.
        hb_stop.cancel();
        let _ = heartbeat.await;
    }

    async fn lease_loop(self: &Arc<Self>, jobs: &TaskTracker, shutdown: &CancellationToken) {
        let mut backoff = Backoff::new(LEASE_BACKOFF.0, LEASE_BACKOFF.1);
        loop {
            // Arm before checking so a slot freed in between is not missed.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let active =
                *self.state.lock().expect("state lock is never poisoned") == AgentState::Active;
            if !active || self.used_slots() >= self.capacity {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = changed => {}
                    _ = tokio::time::sleep(IDLE_RECHECK) => {}
                }
                continue;
            }
            let reply = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = self.server.lease(self.lease_wait, shutdown) => r,
            };
            match reply {
                Ok(r) => {
                    backoff.reset();
                    if let Some(job) = r.job {
                        self.start_job(jobs, job, shutdown);
                    }
                }
                Err(CallError::ShuttingDown) => return,
                Err(e) if e.superseded() => {
                    // The server has handed our leases back already; the
                    // jobs still running here are stopped on the way out.
                    tracing::error!(error = %e, "another process registered under this agent's name; stopping");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "lease request refused; backing off");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        }
    }

    fn start_job(
        self: &Arc<Self>,
        jobs: &TaskTracker,
        job: LeasedJob,
        shutdown: &CancellationToken,
    ) {
        let stop = CancellationToken::new();
        self.running().insert(
            job.job_id,
            Running {
                lease: LeaseRef {
                    job_id: job.job_id,
                    lease_token: job.lease_token,
                },
                cost: job.cost,
                progress: None,
                stop: stop.clone(),
                reason: None,
                extended_at: Instant::now(),
                ttl: Duration::from_millis(job.lease_ttl_ms),
            },
        );
        tracing::info!(job = %job.job_id, attempt = job.attempt, kind = %job.spec.kind(), "running");
        let loops = self.clone();
        let shutdown = shutdown.clone();
        jobs.spawn(async move {
            let give_up = CancellationToken::new();
            let delivery = Delivery::new(give_up.clone(), loops.report_budget);
            let deadline = async {
                loops.report_deadline(job.job_id, &shutdown).await;
                give_up.cancel();
                // Stay in the race: the job finishes its report, which
                // now fails fast.
                std::future::pending::<()>().await;
            };
            let abandoned = async {
                delivery.abandoned().await;
                loops.stop_job(job.job_id, StopReason::Abandoned);
                // Stay in the race: the job stops, reporting nothing.
                std::future::pending::<()>().await;
            };
            tokio::select! {
                () = loops.execute(&job, stop, &delivery) => {}
                () = deadline => {}
                () = abandoned => {}
            }
            loops.running().remove(&job.job_id);
            loops.changed.notify_waiters();
        });
    }

    /// Returns when deliveries about `job` should stop being retried: never
    /// before `shutdown`; after it, once the lease has certainly expired at
    /// the server (see the module documentation).
    async fn report_deadline(&self, job: Uuid, shutdown: &CancellationToken) {
        shutdown.cancelled().await;
        loop {
            let expiry = match self.running().get(&job) {
                Some(r) => r.extended_at + r.ttl,
                None => return,
            };
            if Instant::now() >= expiry {
                return;
            }
            // A heartbeat may extend the lease meanwhile: look again.
            tokio::time::sleep_until(expiry).await;
        }
    }

    /// Runs one job and reports its end exactly once.
    async fn execute(
        self: &Arc<Self>,
        job: &LeasedJob,
        stop: CancellationToken,
        delivery: &Delivery,
    ) {
        let lease = LeaseRef {
            job_id: job.job_id,
            lease_token: job.lease_token,
        };
        let call = |call| async move {
            delivery
                .retry(|stop| async move { self.server.job_call(job.job_id, call, &stop).await })
                .await
        };
        if let Err(e) = call(JobCall::Start(&lease)).await {
            tracing::warn!(job = %job.job_id, error = %e, "start refused; dropping the lease");
            return;
        }
        let progress: crate::jobs::ProgressFn = {
            let loops = self.clone();
            let id = job.job_id;
            Arc::new(move |done, total| loops.set_progress(id, done, total))
        };
        let control = JobControl {
            stop,
            delivery: delivery.clone(),
            progress,
        };
        let result = self.exec.execute(job, control).await;
        let reason = self.running().get(&job.job_id).and_then(|r| r.reason);
        let report = match (result, reason) {
            (_, Some(StopReason::Lost)) => {
                tracing::warn!(job = %job.job_id, "lease lost; stopped without reporting");
                return;
            }
            (_, Some(StopReason::Abandoned)) => {
                tracing::warn!(job = %job.job_id, "stopped without reporting; dropping the lease");
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
                class: FailureClass::Interrupted,
                message: "the agent shut down while running this job".into(),
                exit_code: None,
            }),
            (r, None) => r,
        };
        // A job that ends between two heartbeats has told the server
        // nothing of its progress: the report carries the last.
        let report = report.map(|mut c| {
            if c.progress.is_none() {
                c.progress = self.running().get(&job.job_id).and_then(|r| r.progress);
            }
            c
        });
        let report_call = match &report {
            Ok(c) => JobCall::Complete(c),
            Err(f) => JobCall::Fail(f),
        };
        let mut answer = call(report_call).await;
        // A completion the server will never take (too large) is reported
        // as the job's failure, saying why, rather than left for the lease
        // to expire, which the server would take for an agent that stopped
        // and run again, to the same end. (A 422, an output not uploaded
        // say, keeps the old way: the attempt is retried after the lease.)
        if let (
            Ok(_),
            Err(CallError::Refused {
                status: 413,
                message,
                ..
            }),
        ) = (&report, &answer)
        {
            tracing::warn!(job = %job.job_id, %message, "the server refused the report; reporting a failure");
            let fail = Fail::new(
                lease.lease_token,
                FailureClass::Fatal,
                format!("the server refused this job's report: {message}"),
            );
            answer = call(JobCall::Fail(&fail)).await;
        }
        match answer {
            Ok(()) => tracing::info!(job = %job.job_id, ok = report.is_ok(), "reported"),
            Err(e) if e.lease_gone() => {
                tracing::warn!(job = %job.job_id, error = %e, "report refused: the lease is no longer ours")
            }
            Err(CallError::ShuttingDown) => tracing::error!(
                job = %job.job_id,
                "gave up reporting: shutting down, and the lease has expired at the server"
            ),
            Err(e @ CallError::OutOfBudget(_)) => tracing::error!(
                job = %job.job_id, error = %e,
                "gave up reporting; dropping the lease, so the server requeues the job once it expires"
            ),
            Err(e) => tracing::error!(job = %job.job_id, error = %e, "could not report"),
        }
    }

    async fn heartbeat_loop(
        self: Arc<Self>,
        mut health: impl FnMut() -> HostHealth + Send,
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
            let leases: Vec<HeldLease> = self
                .running()
                .values()
                .map(|r| HeldLease {
                    job_id: r.lease.job_id,
                    lease_token: r.lease.lease_token,
                    progress: r.progress,
                })
                .collect();
            let hb = Heartbeat {
                health: health(),
                leases,
            };
            match self.server.heartbeat(&hb).await {
                Ok(reply) => {
                    let answered = Instant::now();
                    let changed = {
                        let mut st = self.state.lock().expect("state lock is never poisoned");
                        let changed = *st != reply.state;
                        *st = reply.state;
                        changed
                    };
                    if changed {
                        tracing::info!(state = ?reply.state, "agent state changed");
                        self.changed.notify_waiters();
                    }
                    for l in reply.leases {
                        match l.action {
                            LeaseAction::Continue => self.extended(l.job_id, answered),
                            // A lease to cancel is extended too: the job
                            // still has to stop and report.
                            LeaseAction::Cancel => {
                                self.extended(l.job_id, answered);
                                self.stop_job(l.job_id, StopReason::Cancelled)
                            }
                            LeaseAction::Lost => self.stop_job(l.job_id, StopReason::Lost),
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
            }
        }
    }

    fn extended(&self, job: Uuid, at: Instant) {
        if let Some(r) = self.running().get_mut(&job) {
            r.extended_at = at;
        }
    }
}
