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
//! - `PUT jobs/{id}/outputs/{name}` (lease token in `flotilla-lease`) (raw body): one output file,
//!   streamed to the object store; answers [`crate::api::OutputView`].
//! - Or, where the store is S3 and the server presigns, the output goes
//!   from the agent to the store without passing through the server:
//!   `POST jobs/{id}/output-uploads/terms` [`OutputUploadAsk`] →
//!   [`OutputUploadTerms`] (the part size, or none: use the `PUT` above);
//!   `POST jobs/{id}/output-uploads` [`OutputUploadStart`] →
//!   [`OutputUpload`] (a multipart upload and one presigned URL per part,
//!   each part's sha256 signed into its URL); the agent `PUT`s each part to
//!   its URL, without the server's token; then `POST
//!   jobs/{id}/output-uploads/complete` [`OutputUploadComplete`] →
//!   [`crate::api::OutputView`], which completes the upload and records the
//!   output only if the store holds what was declared, or `POST
//!   jobs/{id}/output-uploads/abort` [`OutputUploadAbort`] → [`Ack`]. The
//!   server remembers nothing between these calls: the store holds the
//!   upload, and each call carries what the server checks.
//! - `GET jobs/{id}/checkpoint` (lease token in `flotilla-lease`): a tile job's model checkpoint.
//! - `GET jobs/{id}/inputs/{file}` (the same): one of a tile job's input
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

/// The header that carries the lease token on the agent's downloads (a tile
/// job's checkpoint and inputs, a pipeline move's tar) and output uploads:
/// in the query string it would land in proxies' and access logs. The
/// server refuses `?lease=` (what agents older than this header sent) with
/// a 400 saying to upgrade.
pub const LEASE_HEADER: &str = "flotilla-lease";

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
    /// An id the agent picks for this request and sends again with every
    /// retry of it: a server that already leased a job for it answers that
    /// lease again (the first answer may have been lost, with a server
    /// killed mid-reply) instead of leasing another while the first one's
    /// lease runs out unused. Absent from older agents: each try may lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<uuid::Uuid>,
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
    /// The batch's number within its attempt, from 1 and rising; a retry of
    /// a batch (its answer lost) carries the same number, and the server
    /// stores a number it has already taken only once. 0 (an agent from
    /// before numbering): stored every time it comes.
    #[serde(default)]
    pub batch: u64,
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
    /// The job's last progress report (pixels for a tile): a job that ends
    /// between two heartbeats would otherwise leave none. Older agents
    /// send none.
    #[serde(default)]
    pub progress: Option<Progress>,
}

/// The largest completion report the server takes: a pipeline's listing or
/// probe carries its whole list in `result` (at most
/// [`crate::pipeline::items::MAX_LIST_JSON_BYTES`] of it). Every other
/// agent call is held to the server's `max_body_bytes` (1 MiB).
pub const MAX_COMPLETE_BYTES: usize = 32 << 20;

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

impl Fail {
    /// The report of a failed attempt of lease `lease_token`, its message
    /// cut to [`MAX_FAIL_MESSAGE_BYTES`] on a character boundary.
    pub fn new(lease_token: Uuid, class: FailureClass, message: impl Into<String>) -> Fail {
        let mut message = message.into();
        crate::text::truncate_on_char_boundary(&mut message, MAX_FAIL_MESSAGE_BYTES);
        Fail {
            lease_token,
            class,
            message,
            exit_code: None,
        }
    }
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

/// `POST jobs/{id}/output-uploads/terms`: may this output go straight to
/// the store, and in parts of what size? Lease-checked as the upload
/// itself is (the name must be one the job declares, `size` within the
/// server's limit), so a refusal comes before the agent reads the file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OutputUploadAsk {
    pub lease_token: Uuid,
    /// The output's declared path.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputUploadTerms {
    /// The size of every part but the last, in bytes; `None`: the server
    /// takes this output only through `PUT jobs/{id}/outputs/{name}` (a
    /// local store, presigning off, or an empty file).
    pub part_size: Option<u64>,
}

/// `POST jobs/{id}/output-uploads`: starts a direct upload of one output.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OutputUploadStart {
    pub lease_token: Uuid,
    pub name: String,
    pub size: u64,
    /// Of the whole file, lower-case hex, as the agent computed it.
    pub sha256: String,
    /// As [`OutputUploadTerms::part_size`] said.
    pub part_size: u64,
    /// Of each part in order (lower-case hex): `ceil(size / part_size)`
    /// of them.
    pub part_sha256: Vec<String>,
}

/// A direct upload the store holds open: `PUT` each part to its URL.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OutputUpload {
    /// The store's id of the multipart upload.
    pub upload_id: String,
    pub part_size: u64,
    /// In order, one per part.
    pub parts: Vec<PartUrl>,
    /// How long the URLs stay valid, in seconds.
    pub expires_in_s: u64,
}

/// Where one part goes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartUrl {
    /// From 1.
    pub number: u32,
    /// A presigned `PUT` URL of the store.
    pub url: String,
    /// Headers to send with the part exactly as given: they are signed
    /// into the URL (the part's `x-amz-checksum-sha256`, so that the store
    /// refuses bytes whose sha256 is not the one declared).
    pub headers: BTreeMap<String, String>,
}

/// `POST jobs/{id}/output-uploads/complete`: every part was stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OutputUploadComplete {
    pub lease_token: Uuid,
    pub name: String,
    pub upload_id: String,
    /// What [`OutputUploadStart`] declared: the server records the output
    /// only if the store holds `size` bytes whose parts have these sha256s.
    pub size: u64,
    pub sha256: String,
    /// Every part, numbered 1 to n in order.
    pub parts: Vec<UploadedPart>,
}

/// One part as the store took it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UploadedPart {
    pub number: u32,
    /// The `ETag` the store answered the part's `PUT` with.
    pub etag: String,
    /// The part's sha256, lower-case hex, as declared at the start.
    pub sha256: String,
}

/// `POST jobs/{id}/output-uploads/abort`: the agent gives up on an upload;
/// the store drops its parts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OutputUploadAbort {
    pub lease_token: Uuid,
    pub name: String,
    pub upload_id: String,
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
