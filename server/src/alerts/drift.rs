//! `job_time_drift`: an online agent whose median run time (started to
//! finished, succeeded attempts) of its last [`AlertSettings::drift_recent`]
//! jobs of a kind is over [`AlertSettings::drift_factor`] times the median
//! of its earlier ones (at least [`AlertSettings::drift_history`] of them).
//! Against its own history, not the fleet's: agents differ by an order of
//! magnitude, and what matters is one that slowly degrades (one did when
//! it ran out of vnodes).
//!
//! Cost: per online agent, its newest [`LOOKBACK`] attempts through
//! `job_attempts_by_agent` and their jobs' kinds by primary key.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_core::api::alerts::{AlertName, AlertView, Severity};
use sqlx::PgPool;

use super::AlertSettings;

/// Attempts read per agent, newest first: enough history for a median that
/// one odd job does not move, little enough to read every interval.
pub const LOOKBACK: usize = 200;

/// `$1`: the online window in milliseconds, `$2`: attempts per agent.
const RECENT_SQL: &str = "
    SELECT a.name, j.kind,
           extract(epoch FROM t.finished_at - t.started_at)::float8, t.finished_at
    FROM agents a
    CROSS JOIN LATERAL (
        SELECT t.job_id, t.started_at, t.finished_at, t.leased_at FROM job_attempts t
        WHERE t.agent_id = a.id AND t.outcome = 'succeeded'
          AND t.started_at IS NOT NULL AND t.finished_at IS NOT NULL
        ORDER BY t.leased_at DESC
        LIMIT $2
    ) t
    JOIN jobs j ON j.id = t.job_id
    WHERE a.last_seen_at > now() - $1 * interval '1 millisecond'
    ORDER BY a.name, j.kind, t.leased_at DESC";

/// (agent, kind, seconds, finished at): one row of [`RECENT_SQL`].
type Run = (String, String, f64, DateTime<Utc>);
/// One run's seconds and when it finished.
type Timed = (f64, DateTime<Utc>);

pub async fn drift(
    db: &PgPool,
    online_within: Duration,
    settings: &AlertSettings,
) -> Result<Vec<AlertView>, sqlx::Error> {
    let rows: Vec<Run> = sqlx::query_as(RECENT_SQL)
        .bind(online_within.as_millis() as i64)
        .bind(LOOKBACK.max(settings.drift_recent + settings.drift_history) as i64)
        .fetch_all(db)
        .await?;
    // (agent, kind) → (seconds, finished at), newest first.
    let mut runs: BTreeMap<(String, String), Vec<Timed>> = BTreeMap::new();
    for (agent, kind, secs, at) in rows {
        runs.entry((agent, kind)).or_default().push((secs, at));
    }
    Ok(runs
        .into_iter()
        .filter_map(|((agent, kind), newest_first)| {
            judge(&newest_first, settings).map(|d| d.alert(&agent, &kind))
        })
        .collect())
}

/// What [`judge`] found.
#[derive(Debug, PartialEq)]
pub struct Drift {
    pub recent_median: f64,
    pub earlier_median: f64,
    pub recent: usize,
    pub earlier: usize,
    /// When the oldest of the recent runs finished.
    pub since: DateTime<Utc>,
}

impl Drift {
    fn alert(&self, agent: &str, kind: &str) -> AlertView {
        AlertView {
            alert: AlertName::JobTimeDrift,
            severity: Severity::Warning,
            subject: format!("{agent}/{kind}"),
            message: format!(
                "Agent {agent}'s last {} {kind} jobs took a median of {}, {:.1} times its \
                 earlier median of {} (over {} jobs). Is its disk, CPU or GPU degrading, or \
                 its host shared or short of resources? Compare it with other agents; drain \
                 it if it keeps slowing.",
                self.recent,
                super::seconds(self.recent_median),
                self.recent_median / self.earlier_median,
                super::seconds(self.earlier_median),
                self.earlier,
            ),
            since: Some(self.since),
        }
    }
}

/// `runs`: (seconds, finished at), newest first.
pub fn judge(runs: &[(f64, DateTime<Utc>)], s: &AlertSettings) -> Option<Drift> {
    if s.drift_recent == 0 || runs.len() < s.drift_recent + s.drift_history.max(1) {
        return None;
    }
    let (recent, earlier) = runs.split_at(s.drift_recent);
    let recent_median = median(recent.iter().map(|r| r.0))?;
    let earlier_median = median(earlier.iter().map(|r| r.0))?;
    // A history of instant jobs (0 s as measured) is not a base to
    // multiply: 10 ms is below what start-up noise decides.
    if recent_median <= s.drift_factor * earlier_median.max(0.01) {
        return None;
    }
    Some(Drift {
        recent_median,
        earlier_median,
        recent: recent.len(),
        earlier: earlier.len(),
        since: recent.last()?.1,
    })
}

fn median(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = xs.collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> AlertSettings {
        AlertSettings {
            drift_recent: 3,
            drift_history: 4,
            ..AlertSettings::default()
        }
    }

    fn runs(newest_first: &[f64]) -> Vec<(f64, DateTime<Utc>)> {
        newest_first.iter().map(|s| (*s, Utc::now())).collect()
    }

    #[test]
    fn a_slower_recent_median_drifts() {
        let d = judge(&runs(&[1.0, 1.1, 0.9, 0.05, 0.06, 0.05, 0.07]), &settings())
            .expect("recent 1.0 s against 0.055 s drifts");
        assert_eq!((d.recent, d.earlier), (3, 4));
        assert!((d.recent_median - 1.0).abs() < 1e-9);
        assert!((d.earlier_median - 0.055).abs() < 1e-9);
    }

    #[test]
    fn steady_short_or_noisy_runs_do_not() {
        let s = settings();
        assert_eq!(judge(&runs(&[1.0, 1.0, 1.0, 0.9, 1.0, 1.1, 1.0]), &s), None);
        // Too little history.
        assert_eq!(judge(&runs(&[9.0, 9.0, 9.0, 1.0, 1.0, 1.0]), &s), None);
        // One slow job among the recent ones does not move the median.
        assert_eq!(judge(&runs(&[9.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]), &s), None);
    }
}
