//! The agent protocol under `/api/agent/v1`, authenticated with a per-agent
//! token (`Authorization: Bearer …`). An agent may only touch jobs it holds a
//! current lease on; every call about a job carries the lease token of the
//! attempt, and the server refuses one from an older attempt (`409
//! stale_lease`), so a job is recorded done once.
//!
//! - `POST register` [`Register`] → [`Registered`]: says who the agent is
//!   and what it can run; repeated at every agent start. Each agent process
//!   picks a random [`Register::instance`] and sends it in the
//!   [`INSTANCE_HEADER`] of every later call: the server answers only the
//!   process that registered last (`409 superseded` to any other), refuses a
//!   second process under a name whose first is still online (`409
//!   conflict`), and, when a new process takes over from one that went
//!   silent, fails that one's leases itself so the jobs retry at once. A
//!   lease is thus bound to the process that took it; no call returns lease
//!   tokens to anyone but that process.
//! - `POST lease` [`LeaseRequest`] → [`LeaseReply`]: long poll; waits up to
//!   `wait_ms` for a job that fits.
//! - `POST heartbeat` [`Heartbeat`] → [`HeartbeatReply`]: extends every lease
//!   the agent still holds, carries health and progress; the reply says which
//!   leases to cancel and which are gone.
//! - `POST jobs/{id}/start` [`LeaseRef`] → [`Ack`]: the process is running.
//! - `POST jobs/{id}/log` [`LogBatch`] → [`Ack`]: lines of output.
//! - `PUT jobs/{id}/outputs/{name}?lease=…` (raw body): one output file,
//!   streamed to the object store; answers [`crate::api::OutputView`].
//! - `GET jobs/{id}/checkpoint?lease=…`: a tile job's model checkpoint.
//! - `GET jobs/{id}/inputs/{file}?lease=…`: one of a tile job's input
//!   files ([`crate::job::TileJob::INPUT_FILES`]).
//! - `POST jobs/{id}/complete` [`Complete`] → [`Ended`], `POST
//!   jobs/{id}/fail` [`Fail`] → [`Ended`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::api::{AgentState, Devices, Progress};
use crate::health::HostHealth;
use crate::job::{FailureClass, JobKind, JobSpec, JobState};

/// The header that carries [`Register::instance`] on every agent call after
/// `register`.
pub const INSTANCE_HEADER: &str = "flotilla-agent-instance";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Register {
    pub name: String,
    /// Random per agent process (a restart picks a new one).
    pub instance: Uuid,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Slots; a job occupies `cost` of them.
    pub capacity: u32,
    /// Job kinds this agent can run.
    pub kinds: Vec<JobKind>,
    pub version: String,
    pub health: HostHealth,
    /// What the agent computes on (CPU model) and the tile encoder it uses.
    #[serde(default)]
    pub devices: Devices,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Registered {
    pub agent_id: Uuid,
    /// How often to heartbeat; a lease lives for a few of these.
    pub heartbeat_interval_ms: u64,
    pub state: AgentState,
    /// Leases of an earlier process under this name that the server failed
    /// at this registration (they retry elsewhere at once).
    pub orphans_failed: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseRequest {
    /// How long to wait for a job before answering `job: null`.
    pub wait_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseReply {
    pub job: Option<LeasedJob>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeasedJob {
    pub job_id: Uuid,
    /// 1 for the first attempt.
    pub attempt: u32,
    pub lease_token: Uuid,
    pub lease_ttl_ms: u64,
    pub cost: u32,
    pub spec: JobSpec,
}

/// Names one attempt of one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRef {
    pub job_id: Uuid,
    pub lease_token: Uuid,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Heartbeat {
    pub health: HostHealth,
    pub leases: Vec<HeldLease>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeldLease {
    pub job_id: Uuid,
    pub lease_token: Uuid,
    #[serde(default)]
    pub progress: Option<Progress>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeartbeatReply {
    pub state: AgentState,
    pub leases: Vec<LeaseStatus>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseStatus {
    pub job_id: Uuid,
    pub action: LeaseAction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseAction {
    /// Extended; carry on.
    Continue,
    /// Cancel requested: stop the job, then report `fail` with class
    /// `cancelled`.
    Cancel,
    /// The lease is no longer this agent's (expired and re-queued, or the
    /// job was finished elsewhere): stop and report nothing.
    Lost,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogBatch {
    pub lease_token: Uuid,
    pub lines: Vec<LogLine>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogLine {
    pub stream: LogStream,
    pub line: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogStream {
    Stdout,
    Stderr,
    /// Lines the agent itself writes about the job.
    Agent,
}

impl LogStream {
    pub fn as_str(self) -> &'static str {
        match self {
            LogStream::Stdout => "stdout",
            LogStream::Stderr => "stderr",
            LogStream::Agent => "agent",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Complete {
    pub lease_token: Uuid,
    pub exit_code: Option<i32>,
    /// Names of outputs uploaded for this attempt; the server checks each
    /// was stored under this lease.
    #[serde(default)]
    pub outputs: Vec<String>,
    /// Kind-specific result (e.g. a revdeps shard's list), stored with the
    /// job.
    #[serde(default)]
    pub result: Option<serde_json::Value>,
}

/// The longest failure message the server keeps; longer ones are cut (on a
/// character boundary) by the agent before sending and again by the server.
pub const MAX_FAIL_MESSAGE_BYTES: usize = 4096;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fail {
    pub lease_token: Uuid,
    pub class: FailureClass,
    pub message: String,
    #[serde(default)]
    pub exit_code: Option<i32>,
}

/// The answer to `start` and `log`: accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    pub ok: bool,
}

/// The answer to `complete` and `fail`: the job's state afterwards
/// (`succeeded`; after a failure `retrying`, `failed` or `cancelled`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ended {
    pub state: JobState,
}

/// Paths of the agent protocol, relative to the server's base URL.
pub mod paths {
    pub const REGISTER: &str = "/api/agent/v1/register";
    pub const LEASE: &str = "/api/agent/v1/lease";
    pub const HEARTBEAT: &str = "/api/agent/v1/heartbeat";
    pub fn job(id: uuid::Uuid, action: &str) -> String {
        format!("/api/agent/v1/jobs/{id}/{action}")
    }
}
