//! `/api/v1/jobs`: a submission, a job as clients see it (with its
//! attempts), lists a page at a time, and the answer to a cancel.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{OutputView, Progress};
use crate::job::{JobKind, JobSpec, JobState};

/// `POST /api/v1/jobs`. The spec's fields sit at the top level beside these,
/// tagged by `kind`:
/// `{"kind":"command","command":"…","labels":{…},"priority":0,
///   "max_attempts":3,"timeout_s":600,"outputs":["path",…]}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

/// `GET /api/v1/jobs/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobView {
    pub id: Uuid,
    pub kind: JobKind,
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
    pub spec: JobSpec,
    /// What the agent reported with its success, if anything (a tile job:
    /// seconds spent on the checkpoint, fetching, encoding and uploading).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// While the job waits: why no registered agent could take it (no agent
    /// runs its kind, none carries its labels, or its cost is above every
    /// such agent's capacity). Absent when one could; kept current as agents
    /// register, so it goes away when one that can take it joins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmatchable: Option<String>,
    /// Every attempt, oldest first: in `GET /api/v1/jobs/{id}`, absent
    /// from lists (one more query per job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<Vec<AttemptView>>,
    /// The job this one retries (`POST /api/v1/jobs/{id}/retry`): in
    /// `GET /api/v1/jobs/{id}`, absent from lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_of: Option<Uuid>,
    /// The job that retries this one (a job is retried once): in
    /// `GET /api/v1/jobs/{id}`, absent from lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retried_as: Option<Uuid>,
}

/// One attempt of a job: which agent, when, how it ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptView {
    /// 1 for the first.
    pub attempt: u32,
    pub agent: Option<String>,
    /// When the agent started it (`None`: leased, never started).
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Seconds from its start (its lease, if it never started) to its end;
    /// `None` while it runs.
    pub duration_s: Option<f64>,
    /// succeeded, failed, timed_out, cancelled or lease_expired; `None`
    /// while it runs.
    pub outcome: Option<String>,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
}

impl JobView {
    /// What the job does, in one line for tables: a command job's command,
    /// a tile job's tile and year, a revdeps step's target; at most `width`
    /// characters.
    pub fn summary(&self, width: usize) -> String {
        let text = match &self.spec {
            JobSpec::Command(c) => c.command.clone(),
            JobSpec::Tile(t) => format!("tile {} {} ({})", t.tile, t.year, t.dataset),
            JobSpec::Revdeps(r) => match &r.step {
                crate::job::RevdepsStep::Plan => format!("revdeps plan {}", r.target),
                crate::job::RevdepsStep::Solve { shard, .. } => {
                    format!("revdeps solve {} shard {shard}", r.target)
                }
            },
            JobSpec::Step(s) if s.item.is_empty() => format!("pipeline {}", s.step),
            JobSpec::Step(s) => format!("pipeline {} {}", s.step, s.item),
        };
        text.chars().take(width).collect()
    }
}

/// `POST /api/v1/jobs/{id}/cancel`: what the cancel did.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CancelReply {
    pub id: Uuid,
    /// `cancelled`, or that the agent was asked to stop the job.
    pub status: String,
}

/// `GET /api/v1/jobs?state=&kind=&agent=&submitter=&q=&before=&limit=`:
/// newest first, every filter ANDed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobList {
    pub jobs: Vec<JobView>,
    /// The cursor for the next (older) page, to pass as `before` with the
    /// same filters: the last job of this page. `null` on the last page.
    #[serde(default)]
    pub next: Option<Uuid>,
}
