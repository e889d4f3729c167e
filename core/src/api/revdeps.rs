//! `/api/v1/revdeps`: an opam reverse-dependency run as clients submit it,
//! and its state, progress and answer.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::job::{RevdepsQuery, RevdepsVariant};

/// `POST /api/v1/revdeps`. The host variables default to the Debian 12
/// host of [`RevdepsVariant::debian_12`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubmitRevdeps {
    /// `name.version`, e.g. `dune.3.20.2`.
    pub target: String,
    /// The invariant compiler, `name.version`.
    pub compiler: String,
    /// The opam repository on the agents' hosts, `PATH[:REV]`.
    pub repo: String,
    #[serde(default = "defaults::arch")]
    pub arch: String,
    #[serde(default = "defaults::os")]
    pub os: String,
    #[serde(default = "defaults::os_family")]
    pub os_family: String,
    #[serde(default = "defaults::os_distribution")]
    pub os_distribution: String,
    #[serde(default = "defaults::os_version")]
    pub os_version: String,
    #[serde(default = "defaults::opam_version")]
    pub opam_version: String,
    /// System packages the host's package manager cannot provide (at most
    /// 10,000 names; `opam-revdeps --list-host-depexts` lists the ones the
    /// repository asks for, to check on the host). Absent: the bundled
    /// list for a Debian 12 host, none for another (every system package
    /// taken as available, and the run's steps say so in their logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing_depexts: Option<Vec<String>>,
    #[serde(default)]
    pub query: RevdepsQuery,
    /// Candidates per phase-2 shard: above this many, phase 2 is split into
    /// shards that run as separate jobs.
    #[serde(default = "defaults::shard_size")]
    pub shard_size: u32,
    #[serde(default)]
    pub priority: i32,
    /// Slots each step occupies on an agent (phase 2 uses that many threads).
    #[serde(default = "defaults::cost")]
    pub cost: u32,
}

impl SubmitRevdeps {
    /// A submission with every default: the union query on a Debian 12 host.
    pub fn new(target: String, compiler: String, repo: String) -> Self {
        let v = RevdepsVariant::debian_12(compiler);
        SubmitRevdeps {
            target,
            compiler: v.compiler,
            repo,
            arch: v.arch,
            os: v.os,
            os_family: v.os_family,
            os_distribution: v.os_distribution,
            os_version: v.os_version,
            opam_version: v.opam_version,
            missing_depexts: None,
            query: RevdepsQuery::default(),
            shard_size: defaults::shard_size(),
            priority: 0,
            cost: defaults::cost(),
        }
    }

    /// The switch the question is asked in.
    pub fn variant(&self) -> RevdepsVariant {
        RevdepsVariant {
            compiler: self.compiler.clone(),
            arch: self.arch.clone(),
            os: self.os.clone(),
            os_family: self.os_family.clone(),
            os_distribution: self.os_distribution.clone(),
            os_version: self.os_version.clone(),
            opam_version: self.opam_version.clone(),
            missing_depexts: self.missing_depexts.clone(),
        }
    }
}

/// serde defaults, each taken from [`RevdepsVariant::debian_12`] so the
/// host defaults are written once.
mod defaults {
    use crate::job::RevdepsVariant;

    fn host() -> RevdepsVariant {
        RevdepsVariant::debian_12(String::new())
    }
    pub fn arch() -> String {
        host().arch
    }
    pub fn os() -> String {
        host().os
    }
    pub fn os_family() -> String {
        host().os_family
    }
    pub fn os_distribution() -> String {
        host().os_distribution
    }
    pub fn os_version() -> String {
        host().os_version
    }
    pub fn opam_version() -> String {
        host().opam_version
    }
    pub fn shard_size() -> u32 {
        4000
    }
    pub fn cost() -> u32 {
        1
    }
}

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum RunState {
    /// Phase 1 (the plan job) has not finished.
    Planning,
    /// Phase 2's shards are running.
    Solving,
    /// The answer is in `result`.
    Done,
    /// A step failed; `error` says which and why.
    Failed,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Planning => "planning",
            RunState::Solving => "solving",
            RunState::Done => "done",
            RunState::Failed => "failed",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown run state `{0}`")]
pub struct UnknownRunState(pub String);

impl std::str::FromStr for RunState {
    type Err = UnknownRunState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            RunState::Planning,
            RunState::Solving,
            RunState::Done,
            RunState::Failed,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
        .ok_or_else(|| UnknownRunState(s.to_string()))
    }
}

/// Where a run's time went, in milliseconds (each known once its phase
/// ended).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunTimings {
    /// Reading the repository, in phase 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase1_ms: Option<u64>,
    /// Phase 2 over all shards, and its longest shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase2_ms_sum: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase2_ms_max: Option<u64>,
    /// Submission to answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_ms: Option<u64>,
}

/// `GET /api/v1/revdeps/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunView {
    pub id: Uuid,
    pub state: RunState,
    pub target: String,
    pub repo: String,
    pub query: RevdepsQuery,
    pub variant: RevdepsVariant,
    pub plan_job: Uuid,
    /// Candidates phase 1 found (once planned).
    pub candidates: Option<i32>,
    pub shards: Option<i32>,
    pub shards_done: i64,
    /// The answer, `name.version` a line, once done.
    pub result: Option<Vec<String>>,
    pub timings: Option<RunTimings>,
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// One run in `GET /api/v1/revdeps`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunSummary {
    pub id: Uuid,
    pub state: RunState,
    /// `name.version`.
    pub target: String,
    /// The variant's compiler, `name.version`.
    pub compiler: String,
    /// The query (`union`, `depopts`, `recursive`, `with-test-depopts`).
    pub query: String,
    pub candidates: Option<i32>,
    pub shards: Option<i32>,
    pub shards_done: i64,
    /// Packages in the answer, once done.
    pub answer_len: Option<i64>,
    pub submitter: String,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// `GET /api/v1/revdeps?before=ID&limit=N`: runs newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunList {
    pub runs: Vec<RunSummary>,
    /// Pass as `before` for the next (older) page: this page's last run.
    /// `null` on the last page.
    pub next: Option<Uuid>,
}

/// Most runs one page of `GET /api/v1/revdeps` holds.
pub const MAX_RUN_PAGE: u32 = 200;
