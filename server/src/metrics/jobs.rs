//! Jobs by kind and state as the `jobs` table holds them at a scrape, with
//! the ready ones and how long the oldest of those has waited, by kind.
//! Jobs of a class no registered agent could take (`job_classes.
//! unmatchable`) are counted apart: no agent is coming for them, so as
//! ready work they would hold the oldest wait up for ever and hide how long
//! takeable work waits.

use std::collections::BTreeMap;

use sqlx::PgPool;

#[derive(Debug, Default)]
pub struct JobCounts {
    /// (kind, state) → jobs.
    pub by_state: BTreeMap<(String, String), i64>,
    /// kind → jobs queued or retrying whose `run_after` has come and that
    /// some registered agent could take: what a fitting agent with room
    /// would take now (a retry still in its back-off is not ready).
    pub ready: BTreeMap<String, i64>,
    /// kind → seconds since the longest-waiting of those became ready
    /// (kinds with none are absent).
    pub oldest_ready_seconds: BTreeMap<String, f64>,
    /// kind → jobs queued or retrying that no registered agent could take
    /// (no agent offers the kind, the labels or the slots).
    pub unmatchable: BTreeMap<String, i64>,
}

/// One sequential scan of `jobs`, as the dashboard's state counts make: its
/// cost grows with the table.
pub async fn read(db: &PgPool) -> Result<JobCounts, sqlx::Error> {
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT j.kind, j.state, count(*),
                count(*) FILTER (WHERE ready AND c.unmatchable IS NULL),
                extract(epoch FROM now() - min(j.run_after)
                    FILTER (WHERE ready AND c.unmatchable IS NULL))::float8,
                count(*) FILTER (WHERE waiting AND c.unmatchable IS NOT NULL)
         FROM jobs j
         CROSS JOIN LATERAL (SELECT j.state IN ('queued', 'retrying') AS waiting) w
         CROSS JOIN LATERAL (SELECT waiting AND j.run_after <= now() AS ready) r
         LEFT JOIN job_classes c ON c.id = j.class_id
         GROUP BY j.kind, j.state",
    )
    .fetch_all(db)
    .await?;
    let mut counts = JobCounts::default();
    for (kind, state, n, ready, waited, unmatchable) in rows {
        *counts.ready.entry(kind.clone()).or_default() += ready;
        *counts.unmatchable.entry(kind.clone()).or_default() += unmatchable;
        if let Some(w) = waited {
            let oldest = counts.oldest_ready_seconds.entry(kind.clone()).or_default();
            *oldest = oldest.max(w);
        }
        counts.by_state.insert((kind, state), n);
    }
    Ok(counts)
}

/// kind, state, jobs, ready and takeable, the oldest of those's wait,
/// waiting and unmatchable.
type Row = (String, String, i64, i64, Option<f64>, i64);
