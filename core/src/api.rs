//! The REST API under `/api/v1`: request and response bodies, and the error
//! envelope every 4xx/5xx carries.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::health::HostHealth;
use crate::job::{JobSpec, JobState};

/// `POST /api/v1/jobs`. The spec's fields sit at the top level beside these,
/// tagged by `kind`:
/// `{"kind":"command","command":"…","labels":{…},"priority":0,
///   "max_attempts":3,"timeout_s":600,"outputs":["path",…]}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmitJob {
    #[serde(flatten)]
    pub spec: JobSpec,
    /// Labels an agent must carry (each key with this exact value).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Higher runs first. Within one priority, submitters share fairly.
    #[serde(default)]
    pub priority: i32,
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Slots of an agent's capacity this job occupies.
    #[serde(default = "default_cost")]
    pub cost: u32,
    /// Who the job is accounted to for fair share; defaults to the token's
    /// name.
    #[serde(default)]
    pub submitter: Option<String>,
}

pub fn default_max_attempts() -> u32 {
    3
}
pub fn default_cost() -> u32 {
    1
}

/// `201` answer to a submission.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Created {
    pub id: Uuid,
}

/// One stored output of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputView {
    /// The path the job declared.
    pub name: String,
    /// Object-store key.
    pub key: String,
    pub size: u64,
    /// Lower-case hex.
    pub sha256: String,
}

/// `GET /api/v1/jobs/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobView {
    pub id: Uuid,
    pub kind: String,
    pub state: JobState,
    /// Attempts started so far (0 before the first lease).
    pub attempt: u32,
    pub max_attempts: u32,
    /// Name of the agent running (or that last ran) the job.
    pub agent: Option<String>,
    pub priority: i32,
    pub submitter: String,
    pub labels: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    pub cancel_requested: bool,
    pub progress: Option<Progress>,
    pub outputs: Vec<OutputView>,
    pub spec: serde_json::Value,
    /// What the agent reported with its success, if anything (a tile job:
    /// seconds spent on the checkpoint, fetching, encoding and uploading).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
}

/// Work done of work total, in the job's own unit (pixels for tiles).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub done: u64,
    pub total: u64,
}

/// `GET /api/v1/jobs?state=…&limit=…`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobList {
    pub jobs: Vec<JobView>,
}

/// Lifecycle of an agent as the operator sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentState {
    /// Takes work.
    Active,
    /// Takes no new work until resumed; running work goes on.
    Paused,
    /// Finishes running work, takes no new; becomes `drained` when idle.
    Draining,
    /// Drained and idle: safe to stop.
    Drained,
}

impl AgentState {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentState::Active => "active",
            AgentState::Paused => "paused",
            AgentState::Draining => "draining",
            AgentState::Drained => "drained",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [
            AgentState::Active,
            AgentState::Paused,
            AgentState::Draining,
            AgentState::Drained,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
    }
}

/// One entry of `GET /api/v1/agents`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentView {
    pub name: String,
    pub state: AgentState,
    /// Seen within the last few heartbeat intervals.
    pub online: bool,
    pub labels: BTreeMap<String, String>,
    pub kinds: Vec<String>,
    pub capacity: u32,
    /// Slots in use by leased and running jobs.
    pub slots_in_use: u32,
    pub running_jobs: u32,
    pub registered_at: DateTime<Utc>,
    pub last_seen_at: Option<DateTime<Utc>>,
    pub health: Option<HostHealth>,
    /// The work-directory disk is over 90 % full.
    pub disk_nearly_full: bool,
    pub devices: serde_json::Value,
}

impl AgentView {
    /// The tile encoder's backend, as the agent registered it under
    /// `devices.encoder` (`None`: the agent runs no tile jobs).
    pub fn encoder_backend(&self) -> Option<&str> {
        self.devices["encoder"]["backend"].as_str()
    }

    /// Why the agent does not use each faster encoder backend, as it
    /// registered them: `(backend, reason)`.
    pub fn encoder_unavailable(&self) -> Vec<(&str, &str)> {
        self.devices["encoder"]["unavailable"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(b, why)| (b.as_str(), why.as_str().unwrap_or("?")))
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentList {
    pub agents: Vec<AgentView>,
}

/// `POST /api/v1/tokens`: make an API token. Only an admin may.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreateToken {
    pub role: TokenRole,
    /// For `agent` tokens: the agent name the token may register as.
    #[serde(default)]
    pub agent_name: Option<String>,
    /// A note for the operator ("ci", "alice's laptop").
    #[serde(default)]
    pub description: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenRole {
    /// Everything, including making tokens and steering agents.
    Admin,
    /// Submits and reads jobs.
    Client,
    /// Speaks the agent protocol as one named agent.
    Agent,
}

impl TokenRole {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenRole::Admin => "admin",
            TokenRole::Client => "client",
            TokenRole::Agent => "agent",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "admin" => Some(TokenRole::Admin),
            "client" => Some(TokenRole::Client),
            "agent" => Some(TokenRole::Agent),
            _ => None,
        }
    }
}

/// The secret is shown once, here; the server keeps only its hash.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenCreated {
    pub id: Uuid,
    pub token: String,
}

/// One token as `GET /api/v1/tokens` lists it: never its secret.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenView {
    pub id: Uuid,
    pub role: TokenRole,
    pub agent_name: Option<String>,
    pub description: Option<String>,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// `GET /api/v1/tokens`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenList {
    pub tokens: Vec<TokenView>,
}

/// Body of every error answer: `{"error":{"code","message","detail"}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorInfo,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// Stable, machine-readable: `bad_request`, `unauthorized`, `not_found`,
    /// `conflict`, `stale_lease`, …
    pub code: String,
    /// What is wrong and, where it helps, what to do next.
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<serde_json::Value>,
}
