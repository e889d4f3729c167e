//! The loops against a fake server and fake jobs, on tokio's paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_core::api::AgentState;
use flotilla_core::health::HostHealth;
use flotilla_core::job::FailureClass;
use flotilla_core::protocol::{
    Complete, Fail, Heartbeat, HeartbeatReply, LeaseAction, LeaseReply, LeaseStatus, LeasedJob,
};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{AgentConfig, Loops, Server};
use crate::jobs::{Execute, JobControl};
use crate::server_api::{CallError, JobCall};

const TTL: Duration = Duration::from_secs(30);
const INTERVAL: Duration = Duration::from_secs(1);
const BUDGET: Duration = Duration::from_secs(600);

/// What the fake answers a lease request.
#[derive(Clone, Copy)]
enum LeaseAnswer {
    /// A new job of cost 1 for each of the next `n` requests, then none.
    Jobs(usize),
    /// `403 forbidden` every time.
    Refused,
}

/// What the fake answers a heartbeat.
#[derive(Clone, Copy, PartialEq)]
enum HeartbeatAnswer {
    /// Every lease with this action.
    All(LeaseAction),
    /// Unreachable.
    Unreachable,
}

struct FakeState {
    lease: LeaseAnswer,
    heartbeat: HeartbeatAnswer,
    /// Reports (complete/fail) fail as if the server were unreachable or
    /// answered 500 every time: `ServerApi` retries those until the
    /// caller's stop token fires.
    reports_fail: bool,
    lease_calls: Vec<Instant>,
    heartbeats: Vec<(Instant, Heartbeat)>,
    /// (when it ended, job, action, the fail class)
    job_calls: Vec<(Instant, Uuid, &'static str, Option<FailureClass>)>,
}

struct FakeServer(Mutex<FakeState>);

impl FakeServer {
    fn new(lease: LeaseAnswer, heartbeat: HeartbeatAnswer) -> Arc<Self> {
        Arc::new(FakeServer(Mutex::new(FakeState {
            lease,
            heartbeat,
            reports_fail: false,
            lease_calls: vec![],
            heartbeats: vec![],
            job_calls: vec![],
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.0.lock().unwrap()
    }
}

fn job(cost: u32) -> LeasedJob {
    LeasedJob {
        job_id: Uuid::new_v4(),
        attempt: 1,
        lease_token: Uuid::new_v4(),
        lease_ttl_ms: TTL.as_millis() as u64,
        cost,
        spec: serde_json::from_value(serde_json::json!({"kind": "command", "command": "true"}))
            .unwrap(),
    }
}

impl Server for Arc<FakeServer> {
    async fn lease(&self, wait: Duration, _: &CancellationToken) -> Result<LeaseReply, CallError> {
        let answer = {
            let mut st = self.state();
            st.lease_calls.push(Instant::now());
            match st.lease {
                LeaseAnswer::Jobs(0) => None,
                LeaseAnswer::Jobs(n) => {
                    st.lease = LeaseAnswer::Jobs(n - 1);
                    Some(Ok(job(1)))
                }
                LeaseAnswer::Refused => Some(Err(())),
            }
        };
        match answer {
            Some(Ok(job)) => Ok(LeaseReply { job: Some(job) }),
            Some(Err(())) => Err(CallError::Refused {
                status: 403,
                code: "forbidden".into(),
                message: "no".into(),
            }),
            // The long poll runs out.
            None => {
                tokio::time::sleep(wait).await;
                Ok(LeaseReply { job: None })
            }
        }
    }

    async fn heartbeat(&self, hb: &Heartbeat) -> Result<HeartbeatReply, CallError> {
        let mut st = self.state();
        st.heartbeats.push((Instant::now(), hb.clone()));
        match st.heartbeat {
            HeartbeatAnswer::Unreachable => Err(CallError::Unreachable("down".into())),
            HeartbeatAnswer::All(action) => Ok(HeartbeatReply {
                state: AgentState::Active,
                leases: hb
                    .leases
                    .iter()
                    .map(|l| LeaseStatus {
                        job_id: l.job_id,
                        action,
                    })
                    .collect(),
            }),
        }
    }

    async fn job_call(
        &self,
        job: Uuid,
        call: JobCall<'_>,
        stop: &CancellationToken,
    ) -> Result<(), CallError> {
        let (action, class) = match call {
            JobCall::Start(_) => ("start", None),
            JobCall::Log(_) => ("log", None),
            JobCall::Complete(_) => ("complete", None),
            JobCall::Fail(f) => ("fail", Some(f.class)),
        };
        let report = matches!(call, JobCall::Complete(_) | JobCall::Fail(_));
        let result = if report && self.state().reports_fail {
            stop.cancelled().await;
            Err(CallError::ShuttingDown)
        } else {
            Ok(())
        };
        self.state()
            .job_calls
            .push((Instant::now(), job, action, class));
        result
    }
}

/// Jobs that run until stopped, or until a permit of `finish` lets one end
/// with success.
struct FakeJobs {
    finish: Semaphore,
    /// Each job's log runs out of its delivery budget at once.
    logs_fail: std::sync::atomic::AtomicBool,
}

impl FakeJobs {
    fn new(finished: usize) -> Arc<Self> {
        Arc::new(FakeJobs {
            finish: Semaphore::new(finished),
            logs_fail: false.into(),
        })
    }
}

impl Execute for Arc<FakeJobs> {
    async fn execute(&self, job: &LeasedJob, control: JobControl) -> Result<Complete, Fail> {
        if self.logs_fail.load(std::sync::atomic::Ordering::Relaxed) {
            control.delivery.abandon();
        }
        tokio::select! {
            _ = control.stop.cancelled() => Err(Fail {
                lease_token: job.lease_token,
                class: FailureClass::Cancelled,
                message: "stopped".into(),
                exit_code: None,
            }),
            permit = self.finish.acquire() => {
                permit.expect("the semaphore is never closed").forget();
                Ok(Complete {
                    lease_token: job.lease_token,
                    exit_code: Some(0),
                    outputs: vec![],
                    result: None,
                    progress: None,
                })
            }
        }
    }
}

type FakeLoops = Loops<Arc<FakeServer>, Arc<FakeJobs>>;

fn loops(capacity: u32, server: &Arc<FakeServer>, jobs: &Arc<FakeJobs>) -> Arc<FakeLoops> {
    let config = AgentConfig {
        name: "fake".into(),
        labels: Default::default(),
        capacity,
        workdir: "/nonexistent".into(),
        kill_grace: Duration::from_secs(1),
        lease_wait: Duration::from_secs(20),
        run_as: crate::process::RunAs::agent_user(&[]),
        report_budget: BUDGET,
        keep_failed_dirs: 0,
        ssh_dir: None,
        encoder_profile: None,
    };
    Loops::new(server.clone(), jobs.clone(), &config, AgentState::Active)
}

/// Starts the loops; the token shuts them down.
fn start(loops: &Arc<FakeLoops>) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(
        loops
            .clone()
            .run(HostHealth::default, INTERVAL, shutdown.clone()),
    );
    (shutdown, task)
}

fn running_ids(loops: &FakeLoops) -> Vec<Uuid> {
    loops.running().keys().copied().collect()
}

#[tokio::test(start_paused = true)]
async fn heartbeats_go_at_the_interval_and_extend_the_leases() {
    let server = FakeServer::new(
        LeaseAnswer::Jobs(1),
        HeartbeatAnswer::All(LeaseAction::Continue),
    );
    let loops = loops(1, &server, &FakeJobs::new(0));
    let t0 = Instant::now();
    let (_shutdown, _task) = start(&loops);
    tokio::time::sleep(Duration::from_millis(3500)).await;

    let st = server.state();
    let at: Vec<Duration> = st.heartbeats.iter().map(|(t, _)| *t - t0).collect();
    assert_eq!(
        at,
        [0, 1000, 2000, 3000].map(Duration::from_millis),
        "one heartbeat at start, then one per interval"
    );
    let [id] = running_ids(&loops)[..] else {
        panic!("one job runs")
    };
    for (_, hb) in &st.heartbeats[1..] {
        assert_eq!(
            hb.leases.iter().map(|l| l.job_id).collect::<Vec<_>>(),
            [id],
            "every heartbeat carries the lease"
        );
    }
    let extended = loops.running()[&id].extended_at - t0;
    assert_eq!(
        extended,
        Duration::from_secs(3),
        "the last answer extended it"
    );
}

#[tokio::test(start_paused = true)]
async fn failed_heartbeats_do_not_extend_leases() {
    let server = FakeServer::new(LeaseAnswer::Jobs(1), HeartbeatAnswer::Unreachable);
    let loops = loops(1, &server, &FakeJobs::new(0));
    let t0 = Instant::now();
    let (_shutdown, _task) = start(&loops);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(
        server.state().heartbeats.len(),
        4,
        "still sent every interval"
    );
    let id = running_ids(&loops)[0];
    assert_eq!(
        loops.running()[&id].extended_at,
        t0,
        "only the lease itself"
    );
}

#[tokio::test(start_paused = true)]
async fn lease_back_off_doubles_and_is_capped() {
    let server = FakeServer::new(LeaseAnswer::Refused, HeartbeatAnswer::Unreachable);
    let loops = loops(1, &server, &FakeJobs::new(0));
    let (_shutdown, _task) = start(&loops);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let calls = server.state().lease_calls.clone();
    let gaps: Vec<u128> = calls
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis())
        .collect();
    assert_eq!(
        gaps[..9],
        [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000],
        "{gaps:?}"
    );
    assert!(gaps.iter().all(|&g| g <= 10_000), "{gaps:?}");
}

#[tokio::test(start_paused = true)]
async fn a_success_resets_the_lease_back_off() {
    let server = FakeServer::new(LeaseAnswer::Refused, HeartbeatAnswer::Unreachable);
    let loops = loops(1, &server, &FakeJobs::new(0));
    let (_shutdown, _task) = start(&loops);
    // Refused at 0, 0.1, 0.3, 0.7 s; then the server gives one job, and
    // refuses again once it is done.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    server.state().lease = LeaseAnswer::Jobs(0);
    tokio::time::sleep(Duration::from_secs(30)).await;
    server.state().lease = LeaseAnswer::Refused;
    let before = server.state().lease_calls.len();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let calls = server.state().lease_calls.clone();
    let gaps: Vec<u128> = calls[before - 1..]
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis())
        .collect();
    assert_eq!(gaps[1..4], [100, 200, 400], "{gaps:?}");
}

#[tokio::test(start_paused = true)]
async fn the_lease_loop_does_not_lease_beyond_capacity() {
    let server = FakeServer::new(
        LeaseAnswer::Jobs(100),
        HeartbeatAnswer::All(LeaseAction::Continue),
    );
    let jobs = FakeJobs::new(0);
    let loops = loops(2, &server, &jobs);
    let (_shutdown, _task) = start(&loops);
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(server.state().lease_calls.len(), 2, "no request while full");
    assert_eq!(loops.used_slots(), 2);

    // One job ends: its slot is taken again at once, and only that one.
    jobs.finish.add_permits(1);
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(server.state().lease_calls.len(), 3);
    assert_eq!(running_ids(&loops).len(), 2);
    let completed = server
        .state()
        .job_calls
        .iter()
        .filter(|c| c.2 == "complete")
        .count();
    assert_eq!(completed, 1);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_from_the_heartbeat_stops_the_job_and_reports_cancelled() {
    let server = FakeServer::new(
        LeaseAnswer::Jobs(1),
        HeartbeatAnswer::All(LeaseAction::Continue),
    );
    let loops = loops(1, &server, &FakeJobs::new(0));
    let t0 = Instant::now();
    let (_shutdown, _task) = start(&loops);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let id = running_ids(&loops)[0];
    server.state().heartbeat = HeartbeatAnswer::All(LeaseAction::Cancel);
    tokio::time::sleep(Duration::from_secs(1)).await;

    assert!(running_ids(&loops).is_empty(), "the job ended");
    let st = server.state();
    let calls: Vec<_> = st
        .job_calls
        .iter()
        .map(|(at, job, action, class)| (*at - t0, *job, *action, *class))
        .collect();
    assert_eq!(
        calls,
        [
            (Duration::ZERO, id, "start", None),
            (
                Duration::from_secs(3),
                id,
                "fail",
                Some(FailureClass::Cancelled)
            ),
        ],
        "stopped at the heartbeat at 3 s and reported as cancelled"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_stops_the_job_without_a_report() {
    let server = FakeServer::new(
        LeaseAnswer::Jobs(1),
        HeartbeatAnswer::All(LeaseAction::Lost),
    );
    let loops = loops(1, &server, &FakeJobs::new(0));
    let (_shutdown, _task) = start(&loops);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(running_ids(&loops).is_empty(), "the job ended");
    let actions: Vec<_> = server.state().job_calls.iter().map(|c| c.2).collect();
    assert_eq!(actions, ["start"]);
}

#[tokio::test(start_paused = true)]
async fn a_report_the_server_always_fails_is_given_up_after_the_budget_and_the_lease_dropped() {
    let server = FakeServer::new(
        LeaseAnswer::Jobs(2),
        HeartbeatAnswer::All(LeaseAction::Continue),
    );
    server.state().reports_fail = true;
    let loops = loops(1, &server, &FakeJobs::new(1));
    let t0 = Instant::now();
    let (_shutdown, _task) = start(&loops);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let [first] = running_ids(&loops)[..] else {
        panic!("one job runs")
    };

    // The job ended at once; its report has been retried for almost the
    // budget, and its lease is still heartbeated meanwhile.
    tokio::time::sleep(BUDGET - Duration::from_secs(1)).await;
    assert_eq!(running_ids(&loops), [first], "still reporting");
    {
        let st = server.state();
        let (_, last) = st.heartbeats.last().unwrap();
        assert_eq!(
            last.leases.iter().map(|l| l.job_id).collect::<Vec<_>>(),
            [first]
        );
        assert_eq!(st.lease_calls.len(), 1, "full: no other lease taken");
    }

    // At the budget the report is given up and the lease dropped: no
    // heartbeat carries it any more (it expires at the server, whose reaper
    // requeues the job), and the slot takes the next job.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let st = server.state();
    let complete = st.job_calls.iter().find(|c| c.2 == "complete").unwrap();
    assert_eq!((complete.0 - t0, complete.1), (BUDGET, first));
    let [second] = running_ids(&loops)[..] else {
        panic!("the next job runs: {:?}", running_ids(&loops))
    };
    assert_ne!(second, first);
    assert_eq!(st.lease_calls.len(), 2);
    let (at, last) = st.heartbeats.last().unwrap();
    assert!(*at - t0 > BUDGET);
    assert!(
        last.leases.iter().all(|l| l.job_id != first),
        "the given-up lease is no longer heartbeated"
    );
}

#[tokio::test(start_paused = true)]
async fn a_log_that_runs_out_of_budget_stops_the_job_and_drops_the_lease_without_a_report() {
    let server = FakeServer::new(
        LeaseAnswer::Jobs(1),
        HeartbeatAnswer::All(LeaseAction::Continue),
    );
    let jobs = FakeJobs::new(0);
    jobs.logs_fail
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let loops = loops(1, &server, &jobs);
    let (_shutdown, _task) = start(&loops);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(running_ids(&loops).is_empty(), "the job was stopped");
    let actions: Vec<_> = server.state().job_calls.iter().map(|c| c.2).collect();
    assert_eq!(actions, ["start"], "no report");
    let st = server.state();
    let (_, last) = st.heartbeats.last().unwrap();
    assert!(last.leases.is_empty(), "the lease is no longer heartbeated");
}

#[tokio::test(start_paused = true)]
async fn reports_to_an_unreachable_server_are_retried_for_the_budget_then_shutdown_is_prompt() {
    let server = FakeServer::new(LeaseAnswer::Jobs(1), HeartbeatAnswer::Unreachable);
    server.state().reports_fail = true;
    let loops = loops(1, &server, &FakeJobs::new(1));
    let t0 = Instant::now();
    let (shutdown, task) = start(&loops);
    // The lease expired long ago as far as a server that stayed up goes;
    // but one that restarts gives it another TTL, so the report goes on
    // within the budget.
    tokio::time::sleep(BUDGET / 2).await;
    assert_eq!(running_ids(&loops).len(), 1, "still reporting");
    assert!(
        !server.state().job_calls.iter().any(|c| c.2 == "complete"),
        "the report has not ended"
    );

    // Shut down: the lease is past its TTL, so the report is given up now.
    shutdown.cancel();
    task.await.unwrap();
    let st = server.state();
    let complete = st.job_calls.iter().find(|c| c.2 == "complete").unwrap();
    assert_eq!(complete.0 - t0, BUDGET / 2);
}

#[tokio::test(start_paused = true)]
async fn after_shutdown_reports_are_retried_until_the_lease_has_certainly_expired() {
    let server = FakeServer::new(
        LeaseAnswer::Jobs(1),
        HeartbeatAnswer::All(LeaseAction::Continue),
    );
    server.state().reports_fail = true;
    let loops = loops(1, &server, &FakeJobs::new(1));
    let t0 = Instant::now();
    let (shutdown, task) = start(&loops);
    tokio::time::sleep(Duration::from_secs(5)).await;
    shutdown.cancel();
    // Heartbeats still reach the server and extend the lease: the report
    // goes on being retried.
    tokio::time::sleep(Duration::from_millis(100_500)).await;
    assert!(!task.is_finished(), "the lease is alive; still reporting");
    // The server becomes unreachable after the heartbeat at 105 s.
    server.state().heartbeat = HeartbeatAnswer::Unreachable;
    task.await.unwrap();
    let st = server.state();
    let complete = st.job_calls.iter().find(|c| c.2 == "complete").unwrap();
    assert_eq!(
        complete.0 - t0,
        Duration::from_secs(105) + TTL,
        "one TTL after the last extension"
    );
}

/// Review C1: only an agent with `--ssh-dir` carries the label every ssh
/// step job requires.
#[cfg(unix)]
#[test]
fn only_an_agent_with_an_ssh_dir_registers_the_ssh_label() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = AgentConfig {
        name: "a".into(),
        labels: [("gpu".to_string(), "h200".to_string())].into(),
        capacity: 1,
        workdir: dir.path().into(),
        kill_grace: Duration::from_secs(1),
        lease_wait: Duration::from_secs(20),
        run_as: crate::process::RunAs::agent_user(&[]),
        report_budget: BUDGET,
        keep_failed_dirs: 0,
        ssh_dir: None,
        encoder_profile: None,
    };
    let (k, v) = flotilla_core::job::SSH_LABEL;
    assert_eq!(config.registered_labels(), config.labels);
    config.ssh_dir =
        Some(crate::jobs::step::SshDir::prepare(&dir.path().join("ssh"), false).unwrap());
    let labels = config.registered_labels();
    assert_eq!(labels.get(k).map(String::as_str), Some(v));
    assert_eq!(labels.get("gpu").map(String::as_str), Some("h200"));
}
