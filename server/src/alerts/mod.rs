//! Alerts: the conditions an operator must act on, evaluated from the
//! tables (so every server replica sharing the database computes the same
//! list, but for the one about its own open files), at most once per
//! [`AlertSettings::interval`] per process however many dashboard tabs,
//! API clients and scrapes ask ([`Latest`]).
//!
//! - [`health`]: `disk_full` (an agent's work-directory disk over 90 %;
//!   the claim leases it nothing meanwhile) and `open_files` (an agent's or
//!   this server's open descriptors near the limit), from health reports.
//! - [`lost`]: `agent_lost`, an agent that should be working stopped
//!   heartbeating.
//! - [`stalled`]: `queue_stalled`, ready work an idle agent could take and
//!   no lease for the stall window.
//! - [`drift`]: `job_time_drift`, an agent's recent median run time for a
//!   kind well above its own earlier median.
//! - [`export`]: the list as Prometheus series for `/metrics`.
//!
//! Shown at the top of every dashboard page (`web/static/alerts.js` polls
//! `/ui/alerts.json`), on `/ui/alerts`, and at `GET /api/v1/alerts`.

pub mod drift;
pub mod export;
pub mod health;
pub mod lost;
pub mod stalled;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use flotilla_core::api::alerts::{AlertList, AlertView};
use sqlx::PgPool;
use tokio::time::Instant;

use crate::state::Settings;

/// When the rules fire. Defaults suit a fleet; tests shorten them.
#[derive(Debug, Clone)]
pub struct AlertSettings {
    /// How long an evaluated list is reused: the dashboard polls every 5 s
    /// and Prometheus scrapes every 15 s, so a fresh list per poll.
    pub interval: Duration,
    /// `queue_stalled`: how long an agent that could take ready work may
    /// lease nothing. Ten minutes: far above a lease poll (1 s) and a
    /// retry's back-off, so only a stuck agent or server trips it.
    pub stall_after: Duration,
    /// `job_time_drift`: the agent's last this many succeeded attempts of a
    /// kind are its recent ones…
    pub drift_recent: usize,
    /// …compared with at least this many earlier ones…
    pub drift_history: usize,
    /// …and their median over this many times the earlier median fires.
    pub drift_factor: f64,
    /// `open_files`: open descriptors over this fraction of the limit.
    pub open_files_fraction: f64,
}

impl Default for AlertSettings {
    fn default() -> Self {
        AlertSettings {
            interval: Duration::from_secs(5),
            stall_after: Duration::from_secs(600),
            // Ten jobs' median shrugs off one or two slow ones; twenty
            // earlier ones make a history worth comparing with.
            drift_recent: 10,
            drift_history: 20,
            drift_factor: 2.0,
            open_files_fraction: 0.8,
        }
    }
}

/// The `flotilla serve` flags of [`AlertSettings`].
#[derive(Debug, Clone, clap::Args)]
pub struct AlertArgs {
    /// Reuse an evaluation of the alerts for this many milliseconds,
    /// whoever asks (dashboard tabs, API, scrapes).
    #[arg(long, env = "FLOTILLA_ALERT_INTERVAL_MS", default_value_t = 5_000)]
    pub alert_interval_ms: u64,
    /// queue_stalled: an agent that could take ready work and leased
    /// nothing for this many milliseconds.
    #[arg(long, env = "FLOTILLA_ALERT_STALL_AFTER_MS", default_value_t = 600_000)]
    pub alert_stall_after_ms: u64,
    /// job_time_drift: how many of an agent's latest succeeded jobs of a
    /// kind are its recent ones.
    #[arg(long, env = "FLOTILLA_ALERT_DRIFT_RECENT", default_value_t = 10)]
    pub alert_drift_recent: usize,
    /// job_time_drift: the fewest earlier jobs to compare them with.
    #[arg(long, env = "FLOTILLA_ALERT_DRIFT_HISTORY", default_value_t = 20)]
    pub alert_drift_history: usize,
    /// job_time_drift: fires when the recent median is over this many
    /// times the earlier one.
    #[arg(long, env = "FLOTILLA_ALERT_DRIFT_FACTOR", default_value_t = 2.0)]
    pub alert_drift_factor: f64,
    /// open_files: fires when a process has more than this fraction of its
    /// open-file limit open.
    #[arg(
        long,
        env = "FLOTILLA_ALERT_OPEN_FILES_FRACTION",
        default_value_t = 0.8
    )]
    pub alert_open_files_fraction: f64,
}

impl AlertArgs {
    pub fn settings(&self) -> AlertSettings {
        AlertSettings {
            interval: Duration::from_millis(self.alert_interval_ms),
            stall_after: Duration::from_millis(self.alert_stall_after_ms),
            drift_recent: self.alert_drift_recent.max(1),
            drift_history: self.alert_drift_history.max(1),
            drift_factor: self.alert_drift_factor.max(1.0),
            open_files_fraction: self.alert_open_files_fraction.clamp(0.0, 1.0),
        }
    }
}

/// Evaluates every rule now: critical first, then by alert and subject.
pub async fn evaluate(db: &PgPool, settings: &Settings) -> Result<Vec<AlertView>, sqlx::Error> {
    let a = &settings.alerts;
    let agents = crate::agents::list(db, settings.heartbeat_interval).await?;
    let server = crate::metrics::process::Process::read();
    let mut alerts = health::disk_full(db, &agents).await?;
    alerts.extend(lost::lost(&agents));
    alerts.extend(stalled::stalled(db, settings.heartbeat_interval * 3, a.stall_after).await?);
    alerts.extend(drift::drift(db, settings.heartbeat_interval * 3, a).await?);
    alerts.extend(health::open_files(
        &agents,
        &server,
        std::process::id(),
        a.open_files_fraction,
    ));
    alerts.sort_by(|x, y| {
        (y.severity.cmp(&x.severity))
            .then(x.alert.cmp(&y.alert))
            .then(x.subject.cmp(&y.subject))
    });
    Ok(alerts)
}

/// The last evaluated list, shared by everyone who asks within
/// [`AlertSettings::interval`]: whoever finds it stale evaluates while the
/// others wait for that result (one lock), so 200 open tabs cost the
/// database what one does.
#[derive(Default)]
pub struct Latest {
    held: tokio::sync::Mutex<Option<(Instant, Arc<AlertList>)>>,
}

impl Latest {
    /// The current list: the one evaluated less than an interval ago, or a
    /// fresh one. An error is not kept.
    pub async fn get(
        &self,
        db: &PgPool,
        settings: &Settings,
    ) -> Result<Arc<AlertList>, sqlx::Error> {
        let mut held = self.held.lock().await;
        if let Some((at, list)) = held.as_ref() {
            if at.elapsed() < settings.alerts.interval {
                return Ok(list.clone());
            }
        }
        let list = Arc::new(AlertList {
            alerts: evaluate(db, settings).await?,
            evaluated_at: Utc::now(),
        });
        *held = Some((Instant::now(), list.clone()));
        Ok(list)
    }
}

/// The current alerts of `state`'s server.
pub async fn current(state: &crate::state::AppState) -> Result<Arc<AlertList>, sqlx::Error> {
    state
        .live_pages
        .alerts
        .get(&state.db, &state.settings)
        .await
}

/// `n` seconds as a person reads a duration.
pub(crate) fn seconds(n: f64) -> String {
    if n < 10.0 {
        format!("{n:.2} s")
    } else if n < 120.0 {
        format!("{n:.0} s")
    } else if n < 7200.0 {
        format!("{:.0} min", n / 60.0)
    } else {
        format!("{:.1} h", n / 3600.0)
    }
}
