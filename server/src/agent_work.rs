//! What one agent's succeeded attempts over a window say: tiles finished
//! per time bucket, and run-time percentiles per job kind. Read from
//! `job_attempts` (owned by [`crate::queue`]) through its per-agent index
//! on `leased_at` (`job_attempts_by_agent`), bounded to attempts leased at
//! most a day before the window: tile and revdeps attempts take minutes,
//! and the bound keeps the cost to this agent's recent attempts, not the
//! table (an attempt that ran longer than a day is left out).

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

/// Tiles `agent` finished in each of `buckets` equal intervals of
/// `bucket_secs` seconds that end now, oldest first.
pub async fn tiles_per_bucket(
    db: &PgPool,
    agent: Uuid,
    buckets: usize,
    bucket_secs: u32,
) -> Result<Vec<u64>, sqlx::Error> {
    let rows: Vec<(i64, i64)> = sqlx::query_as(
        "WITH w AS (SELECT now() - $2 * $3 * interval '1 second' AS start)
         SELECT floor(extract(epoch FROM a.finished_at - w.start) / $3)::bigint AS bucket,
                count(*)
         FROM w, job_attempts a JOIN jobs j ON j.id = a.job_id
         WHERE a.agent_id = $1 AND a.leased_at > w.start - interval '1 day'
           AND a.finished_at > w.start AND a.outcome = 'succeeded' AND j.kind = 'tile'
         GROUP BY 1",
    )
    .bind(agent)
    .bind(buckets as i64)
    .bind(f64::from(bucket_secs))
    .fetch_all(db)
    .await?;
    let mut counts = vec![0u64; buckets];
    for (bucket, n) in rows {
        // An attempt that finished in this very instant lands on `buckets`.
        let i = usize::try_from(bucket)
            .unwrap_or(0)
            .min(buckets.saturating_sub(1));
        if let Some(c) = counts.get_mut(i) {
            *c += u64::try_from(n).unwrap_or(0);
        }
    }
    Ok(counts)
}

/// Run times of one kind's succeeded attempts on an agent, in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct KindDurations {
    pub kind: String,
    pub attempts: u64,
    pub median: f64,
    pub p90: f64,
}

/// Median and 90th percentile of the run time (started to finished) of
/// `agent`'s attempts that succeeded after `since`, per kind.
pub async fn durations(
    db: &PgPool,
    agent: Uuid,
    since: DateTime<Utc>,
) -> Result<Vec<KindDurations>, sqlx::Error> {
    let rows: Vec<(String, i64, f64, f64)> = sqlx::query_as(
        "SELECT j.kind, count(*),
                percentile_cont(0.5) WITHIN GROUP (ORDER BY s.secs),
                percentile_cont(0.9) WITHIN GROUP (ORDER BY s.secs)
         FROM job_attempts a
         JOIN jobs j ON j.id = a.job_id
         CROSS JOIN LATERAL (
             SELECT extract(epoch FROM a.finished_at - a.started_at)::float8 AS secs) s
         WHERE a.agent_id = $1 AND a.leased_at > $2 - interval '1 day'
           AND a.finished_at > $2 AND a.outcome = 'succeeded' AND a.started_at IS NOT NULL
         GROUP BY j.kind ORDER BY j.kind",
    )
    .bind(agent)
    .bind(since)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(kind, n, median, p90)| KindDurations {
            kind,
            attempts: u64::try_from(n).unwrap_or(0),
            median,
            p90,
        })
        .collect())
}
