//! `/api/v1/alerts`: what needs an operator now, as the server evaluates
//! it from the tables (the dashboard's banner and `/metrics`'
//! `flotilla_alert` show the same list).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Which condition an alert is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum AlertName {
    /// An agent's work-directory disk is over 90 % full; the server leases
    /// it no new work until it reports room again.
    DiskFull,
    /// An agent that should be working stopped heartbeating.
    AgentLost,
    /// Ready work that an online, active agent with free slots could take,
    /// and that agent leased nothing for the stall window.
    QueueStalled,
    /// An agent's recent median run time for a kind is well above its own
    /// earlier median.
    JobTimeDrift,
    /// A process (an agent, or this server) uses most of its open-file
    /// limit.
    OpenFiles,
}

impl AlertName {
    pub const ALL: [AlertName; 5] = [
        AlertName::DiskFull,
        AlertName::AgentLost,
        AlertName::QueueStalled,
        AlertName::JobTimeDrift,
        AlertName::OpenFiles,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AlertName::DiskFull => "disk_full",
            AlertName::AgentLost => "agent_lost",
            AlertName::QueueStalled => "queue_stalled",
            AlertName::JobTimeDrift => "job_time_drift",
            AlertName::OpenFiles => "open_files",
        }
    }
}

/// How soon someone should look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Severity {
    /// Work is slowed or one agent is out; look today.
    Warning,
    /// Work has stopped somewhere; look now.
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// One active alert.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AlertView {
    pub alert: AlertName,
    pub severity: Severity,
    /// What it is about: an agent's name, `agent/kind` for a drift, or
    /// `server` for this server process.
    pub subject: String,
    /// What is wrong and what to do next, in a sentence or two.
    pub message: String,
    /// Since when the condition holds, where the tables say.
    pub since: Option<DateTime<Utc>>,
}

/// `GET /api/v1/alerts`: the active alerts, critical first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AlertList {
    pub alerts: Vec<AlertView>,
    /// When the server evaluated them (it does at most once per its
    /// `--alert-interval-ms`, however many ask).
    pub evaluated_at: DateTime<Utc>,
}
