//! Jobs by kind and state as the `jobs` table holds them at a scrape, with
//! the ready ones and how long the oldest of those has waited.

use std::collections::BTreeMap;

use sqlx::PgPool;

#[derive(Debug, Default)]
pub struct JobCounts {
    /// (kind, state) → jobs.
    pub by_state: BTreeMap<(String, String), i64>,
    /// kind → jobs queued or retrying whose `run_after` has come: what a
    /// fitting agent with room would take now (a retry still in its
    /// back-off is not ready).
    pub ready: BTreeMap<String, i64>,
    /// Seconds since the longest-waiting ready job became ready; 0 if none.
    pub oldest_ready_seconds: f64,
}

/// One sequential scan of `jobs`, as the dashboard's state counts make: its
/// cost grows with the table.
pub async fn read(db: &PgPool) -> Result<JobCounts, sqlx::Error> {
    let rows: Vec<(String, String, i64, i64, Option<f64>)> = sqlx::query_as(
        "SELECT kind, state, count(*),
                count(*) FILTER (WHERE state IN ('queued', 'retrying') AND run_after <= now()),
                extract(epoch FROM now() - min(run_after)
                    FILTER (WHERE state IN ('queued', 'retrying') AND run_after <= now()))::float8
         FROM jobs GROUP BY kind, state",
    )
    .fetch_all(db)
    .await?;
    let mut counts = JobCounts::default();
    for (kind, state, n, ready, waited) in rows {
        *counts.ready.entry(kind.clone()).or_default() += ready;
        counts.by_state.insert((kind, state), n);
        if let Some(w) = waited {
            counts.oldest_ready_seconds = counts.oldest_ready_seconds.max(w);
        }
    }
    Ok(counts)
}
