//! `/api/v1/agents`: agents as the operator sees them, and steering them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::health::HostHealth;
use crate::job::JobKind;

/// Lifecycle of an agent as the operator sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentView {
    pub name: String,
    pub state: AgentState,
    /// Seen within the last few heartbeat intervals.
    pub online: bool,
    pub labels: BTreeMap<String, String>,
    pub kinds: Vec<JobKind>,
    pub capacity: u32,
    /// Slots in use by leased and running jobs.
    pub slots_in_use: u32,
    pub running_jobs: u32,
    pub registered_at: DateTime<Utc>,
    pub last_seen_at: Option<DateTime<Utc>>,
    /// The version of `flotilla-agent` it registered with (empty: one
    /// from before agents said).
    #[serde(default)]
    pub version: String,
    pub health: Option<HostHealth>,
    /// The work-directory disk is over 90 % full.
    pub disk_nearly_full: bool,
    /// Why the server hands this agent no new jobs, when it does not: its
    /// disk is over 90 % full (cleared by the first heartbeat that reports
    /// room again), or an operator paused or drained it. `None`: it leases.
    #[serde(default)]
    pub lease_refused: Option<String>,
    pub devices: Devices,
}

impl AgentView {
    /// The tile encoder's backend, as the agent registered it (`None`: the
    /// agent runs no tile jobs).
    pub fn encoder_backend(&self) -> Option<&str> {
        self.devices.encoder.as_ref().map(|e| e.backend.as_str())
    }

    /// Why the agent does not use each faster encoder backend, as it
    /// registered them: `(backend, reason)`.
    pub fn encoder_unavailable(&self) -> Vec<(&str, &str)> {
        self.devices
            .encoder
            .iter()
            .flat_map(|e| e.unavailable.iter())
            .map(|(b, why)| (b.as_str(), why.as_str()))
            .collect()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentList {
    pub agents: Vec<AgentView>,
    /// The cursor for the next page, to pass as `after`: this page's last
    /// agent's name. `null` on the last page.
    #[serde(default)]
    pub next: Option<String>,
}

/// Most agents one page of `GET /api/v1/agents` holds (`limit`'s ceiling
/// and default: a whole fleet of a few hundred in one call).
pub const MAX_AGENT_PAGE: u32 = 1000;

/// `POST /api/v1/agents/{name}/{pause|drain|resume}`: the agent's new state.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SteerReply {
    pub name: String,
    pub state: AgentState,
}

/// What an agent computes on, as it registers it (`devices`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Devices {
    /// The CPU model.
    #[serde(default)]
    pub cpu: Option<String>,
    /// The tile encoder in use; `None` when the agent runs no tile jobs.
    #[serde(default)]
    pub encoder: Option<EncoderInfo>,
}

/// The tile encoder an agent runs, and why it does not run a faster one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EncoderInfo {
    /// The backend in use (`cuda`, `onednn`, `cpu`, `reference`).
    pub backend: String,
    /// Its device profile.
    #[serde(default)]
    pub profile: Option<EncoderProfile>,
    /// Each faster backend that is not used, and why (say, a GPU box whose
    /// agent cannot load cuBLAS): backend name → reason.
    #[serde(default)]
    pub unavailable: BTreeMap<String, String>,
}

/// The encoder's device profile as the operator sees it (the encoder's own
/// `DeviceProfile` serialises to this shape; core does not depend on the
/// encoder).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EncoderProfile {
    /// CPU model or GPU name the profile was measured on.
    pub device: String,
    pub backend: String,
    pub chunk_pixels: usize,
    pub block_pixels: usize,
    pub threads: usize,
    pub dtype: String,
    /// The profile file the agent read (its `--encoder-profile`, or the
    /// default `WORKDIR/encoder-profiles.toml` where that exists); `None`:
    /// none.
    #[serde(default)]
    pub file: Option<String>,
    /// These settings are the file's entry for this device and backend, as
    /// `tessera-encode tune` wrote it; `false`: the built-in untuned ones (no
    /// file, no entry for this device there, or an agent too old to say).
    #[serde(default)]
    pub tuned: bool,
    /// What computes, as `tessera-encode backends` says it: which oneDNN
    /// (the linked 2.x, or a 3.x found at run time) and the ISA it
    /// dispatches to, or the GPU; `None` from an agent too old to say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library: Option<String>,
}

impl EncoderProfile {
    /// One line for the operator: what runs, with which settings, and
    /// whether they were tuned on this device or are the defaults.
    pub fn summary(&self) -> String {
        let origin = match (&self.file, self.tuned) {
            (Some(f), true) => format!("tuned, from {f}"),
            (Some(f), false) => format!("untuned defaults ({f} has no entry for this device)"),
            (None, _) => "untuned defaults (no profile file)".to_string(),
        };
        let library = self
            .library
            .as_ref()
            .map_or(String::new(), |l| format!("; {l}"));
        format!(
            "{} on {}: chunk {} px, block {} px, {} threads, {}; {origin}{library}",
            self.backend,
            self.device,
            self.chunk_pixels,
            self.block_pixels,
            self.threads,
            self.dtype
        )
    }
}

/// One kept health sample of an agent: its heartbeat's report, at most one
/// per the server's sample interval (`GET /api/v1/agents/{name}/health`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HealthSample {
    pub at: DateTime<Utc>,
    /// Host CPU busy fraction (0–1), over all cores.
    pub cpu_busy: Option<f64>,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    /// Fraction (0–1) of the work directory's file system in use.
    pub disk_used: Option<f64>,
    /// The agent process's open descriptors, and its limit on them.
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub load_1m: Option<f64>,
    /// The agent process's CPU seconds since it started.
    pub process_cpu_seconds: Option<f64>,
    pub process_resident_bytes: Option<u64>,
}

/// `GET /api/v1/agents/{name}/health?since=…&limit=…`: an agent's samples
/// after `since`, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HealthHistory {
    pub agent: String,
    /// The server keeps at most one sample per this many milliseconds.
    pub sample_interval_ms: u64,
    pub samples: Vec<HealthSample>,
    /// Set when there are more: pass it as `since` for the next page.
    pub next_since: Option<DateTime<Utc>>,
}
