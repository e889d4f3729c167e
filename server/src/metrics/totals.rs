//! The running totals behind the counters and histograms that must only go
//! up: attempts by kind and outcome, the run time of succeeded attempts by
//! kind and agent, lease waits by kind. Triggers append one `metric_events`
//! row per lease and per attempt's end; a scrape folds them into
//! `metric_totals` and reads totals plus what is not folded yet
//! (migrations/20261204000001_metric_totals.sql says why not a window of
//! `job_attempts`, nor a count of all of it at every scrape).
//!
//! Cost per scrape: the fold reads and deletes the events since the last
//! scrape (one per lease and one per end), and the read is over
//! kinds × agents × buckets rows of totals: independent of how many
//! attempts the tables hold.

use std::collections::BTreeMap;

use sqlx::PgPool;

/// Upper bounds of the job-duration buckets, in seconds: from a command
/// that echoes a line (a tenth of a second, most of it process start-up) to
/// a day; a tile of the tiny test model takes about a second, a real tile
/// minutes, a revdeps shard up to hours. Changing them is safe: stored
/// buckets are folded into the next bound up when read.
pub const DURATION_BUCKETS: [f64; 19] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0,
    7200.0, 14400.0, 28800.0, 86400.0,
];

/// Upper bounds of the lease-wait buckets, in seconds: an idle fleet takes a
/// job within tens of milliseconds (the NOTIFY wake-up), a busy one after
/// minutes or hours.
pub const LEASE_WAIT_BUCKETS: [f64; 16] = [
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0,
    86400.0,
];

/// One histogram: a count per bucket of its bounds (not cumulative; the
/// last is the `+Inf` bucket) and the sum of the observations.
#[derive(Debug, Clone, PartialEq)]
pub struct Hist {
    pub counts: Vec<u64>,
    pub sum: f64,
}

impl Hist {
    pub fn empty(bounds: &[f64]) -> Hist {
        Hist {
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        }
    }

    /// Adds `n` observations summing to `sum` that were stored under bucket
    /// bound `le`: they go to the first of `bounds` at or above it.
    fn add(&mut self, bounds: &[f64], le: f64, n: u64, sum: f64) {
        let i = bounds.iter().position(|b| *b >= le).unwrap_or(bounds.len());
        self.counts[i] += n;
        self.sum += sum;
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// `(upper bound, count)` pairs, `+Inf` last, as the encoder takes them.
    pub fn buckets(&self, bounds: &[f64]) -> Vec<(f64, u64)> {
        bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(self.counts.iter().copied())
            .collect()
    }
}

/// Everything the totals say, keyed by their labels as stored.
#[derive(Debug, Default)]
pub struct Totals {
    /// (kind, outcome) → attempts that ended so.
    pub attempts: BTreeMap<(String, String), u64>,
    /// (kind, agent) → run time of its succeeded attempts.
    pub duration: BTreeMap<(String, String), Hist>,
    /// kind → seconds from ready to leased.
    pub lease_wait: BTreeMap<String, Hist>,
}

/// The events of `$source` (a table or CTE with kind, agent_id, outcome,
/// seconds) as totals rows; `$1`, `$2` are the duration and lease-wait
/// bounds. An observation goes to the first bound at or above it.
fn rows_of(source: &str) -> String {
    format!(
        "SELECT 'attempts' AS family, kind, '' AS agent, outcome, 'Infinity'::float8 AS le,
                count(*) AS n, 0::float8 AS sum_seconds
         FROM {source} WHERE outcome IS NOT NULL GROUP BY kind, outcome
         UNION ALL
         SELECT 'duration', e.kind, COALESCE(a.name, ''), '', b.le, count(*), sum(e.seconds)
         FROM {source} e LEFT JOIN agents a ON a.id = e.agent_id
         CROSS JOIN LATERAL (SELECT COALESCE(min(x), 'Infinity') AS le
                             FROM unnest($1::float8[]) x WHERE x >= e.seconds) b
         WHERE e.outcome = 'succeeded' AND e.seconds IS NOT NULL
         GROUP BY e.kind, a.name, b.le
         UNION ALL
         SELECT 'lease_wait', e.kind, '', '', b.le, count(*), sum(e.seconds)
         FROM {source} e
         CROSS JOIN LATERAL (SELECT COALESCE(min(x), 'Infinity') AS le
                             FROM unnest($2::float8[]) x WHERE x >= e.seconds) b
         WHERE e.outcome IS NULL
         GROUP BY e.kind, b.le"
    )
}

/// Folds the events recorded since the last fold into the totals and
/// deletes them, in one transaction. Skipped while another server is
/// folding (it takes them all; the read below counts what is left either
/// way).
pub async fn fold(db: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = db.begin().await?;
    let mine: bool =
        sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtext('flotilla-metric-totals'))")
            .fetch_one(&mut *tx)
            .await?;
    if !mine {
        return Ok(());
    }
    let sql = format!(
        "WITH moved AS (DELETE FROM metric_events RETURNING kind, agent_id, outcome, seconds)
         INSERT INTO metric_totals (family, kind, agent, outcome, le, n, sum_seconds)
         {}
         ON CONFLICT (family, kind, agent, outcome, le) DO UPDATE
         SET n = metric_totals.n + EXCLUDED.n,
             sum_seconds = metric_totals.sum_seconds + EXCLUDED.sum_seconds",
        rows_of("moved")
    );
    sqlx::query(&sql)
        .bind(&DURATION_BUCKETS[..])
        .bind(&LEASE_WAIT_BUCKETS[..])
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// The totals plus the events not folded yet, in one snapshot.
pub async fn read(db: &PgPool) -> Result<Totals, sqlx::Error> {
    let sql = format!(
        "SELECT family, kind, agent, outcome, le, sum(n)::bigint, sum(sum_seconds)::float8
         FROM (SELECT family, kind, agent, outcome, le, n, sum_seconds FROM metric_totals
               UNION ALL {}) t
         GROUP BY family, kind, agent, outcome, le",
        rows_of("metric_events")
    );
    let rows: Vec<(String, String, String, String, f64, i64, f64)> = sqlx::query_as(&sql)
        .bind(&DURATION_BUCKETS[..])
        .bind(&LEASE_WAIT_BUCKETS[..])
        .fetch_all(db)
        .await?;
    let mut totals = Totals::default();
    for (family, kind, agent, outcome, le, n, sum) in rows {
        let n = u64::try_from(n).unwrap_or(0);
        match family.as_str() {
            "attempts" => *totals.attempts.entry((kind, outcome)).or_default() += n,
            "duration" => totals
                .duration
                .entry((kind, agent))
                .or_insert_with(|| Hist::empty(&DURATION_BUCKETS))
                .add(&DURATION_BUCKETS, le, n, sum),
            "lease_wait" => totals
                .lease_wait
                .entry(kind)
                .or_insert_with(|| Hist::empty(&LEASE_WAIT_BUCKETS))
                .add(&LEASE_WAIT_BUCKETS, le, n, sum),
            _ => {} // a family a newer server writes
        }
    }
    Ok(totals)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_buckets_fold_into_the_next_bound_up() {
        let bounds = [1.0, 10.0];
        let mut h = Hist::empty(&bounds);
        h.add(&bounds, 1.0, 2, 1.5);
        h.add(&bounds, 5.0, 1, 4.0); // a bound no longer in use
        h.add(&bounds, f64::INFINITY, 3, 300.0);
        assert_eq!(h.counts, vec![2, 1, 3]);
        assert_eq!(h.count(), 6);
        assert_eq!(
            h.buckets(&bounds),
            vec![(1.0, 2), (10.0, 1), (f64::INFINITY, 3)]
        );
    }

    #[test]
    fn bounds_ascend() {
        for bounds in [&DURATION_BUCKETS[..], &LEASE_WAIT_BUCKETS[..]] {
            assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{bounds:?}");
        }
    }
}
