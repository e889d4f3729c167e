//! Retention: finished jobs older than `--retention` leave the tables (with
//! their attempts, logs, outputs and tile links), archived first to the
//! object store as JSON lines, so that the queue's tables stay the size of
//! the recent past and nothing is lost.
//!
//! A pass takes the oldest finished jobs past the cut-off (the
//! `jobs_finished` index), a batch at a time, writes the batch to
//! `archive/jobs/{date}/{first}-{last}.jsonl`, then deletes exactly those
//! rows that are still finished. The order is what makes a crash safe: the
//! archive is complete (a multipart upload is visible only once finished)
//! before a row goes; a crash after the upload and before the delete
//! archives the batch again at the next pass, under the same name when the
//! batch is the same, so an archive reader keeps the last record of a job
//! id. A job that an open revdeps or pipeline run still reads (its
//! children, its plan, listing or probe jobs) stays until the run ends.
//!
//! Several servers: a pass holds a transaction-scoped advisory lock, so one
//! server archives at a time and the others skip that tick.
//!
//! Each line of an archive is one JSON object:
//! `{"job": {…every column of jobs…}, "attempts": [...], "outputs": [...]}`
//! for a job, then its logs as `{"logs": job_id, "lines": [{seq, attempt,
//! stream, line, at}, …]}` in pages of [`LOG_PAGE`] lines, in order.

use std::sync::Arc;
use std::time::Duration;

use object_store::{ObjectStore, WriteMultipart};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The advisory lock key of a retention pass (any constant no other part
/// of flotilla uses: "flotilla retention" read as bytes).
const LOCK_KEY: i64 = 0x666c_6f74_7265_7465;

/// Jobs archived and deleted per batch: each batch is one archive object
/// and one delete, short enough to keep the lock and the transaction brief.
pub const BATCH: i64 = 500;

/// Log lines per archive record (and per query).
const LOG_PAGE: i64 = 5_000;

/// When and how often finished jobs leave the tables.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// How long a finished job stays; `None` keeps every job.
    pub keep_for: Option<Duration>,
    /// How often a pass runs.
    pub interval: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            // A month of history for the dashboard and the API: drift
            // alerts look back a few hundred attempts, operators at last
            // week's failures.
            keep_for: Some(Duration::from_secs(30 * 24 * 3600)),
            interval: Duration::from_secs(300),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("writing the archive {key}: {source}")]
    Archive {
        key: String,
        #[source]
        source: object_store::Error,
    },
}

/// What one pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Jobs archived and deleted.
    pub jobs: u64,
    /// The archive objects written.
    pub archives: Vec<String>,
    /// Whether another server held the pass's lock (nothing was done).
    pub skipped: bool,
}

/// One pass: every job finished more than `keep_for` ago leaves, a batch
/// of [`BATCH`] at a time, each archived before it is deleted, until none
/// is left or `shutdown` fires.
pub async fn pass(
    db: &PgPool,
    store: &dyn ObjectStore,
    keep_for: Duration,
    shutdown: &CancellationToken,
) -> Result<PassReport, RetentionError> {
    let mut report = PassReport::default();
    // A batch once begun is finished (its upload completed or aborted):
    // shutdown is looked at between batches.
    while !shutdown.is_cancelled() {
        let mut tx = db.begin().await?;
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
            .bind(LOCK_KEY)
            .fetch_one(&mut *tx)
            .await?;
        if !locked {
            report.skipped = report.jobs == 0;
            return Ok(report);
        }
        let batch = due(&mut tx, keep_for).await?;
        if batch.is_empty() {
            tx.commit().await?;
            return Ok(report);
        }
        let key = archive(&mut tx, store, &batch).await?;
        let deleted = sqlx::query(
            "DELETE FROM jobs WHERE id = ANY($1)
             AND state IN ('succeeded', 'failed', 'cancelled')",
        )
        .bind(&batch)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        tracing::info!(jobs = deleted, archive = %key, "archived and removed finished jobs");
        report.jobs += deleted;
        report.archives.push(key);
        if (batch.len() as i64) < BATCH {
            break;
        }
    }
    Ok(report)
}

/// The next batch: finished before the cut-off, oldest first, locked
/// against a concurrent retry (a failed or cancelled job can be retried),
/// and read by no open run.
async fn due(tx: &mut sqlx::PgConnection, keep_for: Duration) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT j.id FROM jobs j
         WHERE j.state IN ('succeeded', 'failed', 'cancelled')
           AND j.finished_at < now() - $1 * interval '1 millisecond'
           AND NOT EXISTS (SELECT 1 FROM revdeps_runs r
                           WHERE r.state IN ('planning', 'solving')
                             AND (r.id = j.parent_id OR r.plan_job = j.id))
           AND NOT EXISTS (SELECT 1 FROM pipeline_runs p
                           WHERE p.state IN ('listing', 'probing', 'running')
                             AND (p.id = j.parent_id OR p.list_job = j.id
                                  OR j.id = ANY (p.probe_jobs)))
         ORDER BY j.finished_at
         LIMIT $2
         FOR UPDATE OF j SKIP LOCKED",
    )
    .bind(i64::try_from(keep_for.as_millis()).unwrap_or(i64::MAX))
    .bind(BATCH)
    .fetch_all(&mut *tx)
    .await
}

/// Writes `batch` (ids in the order read) to a new archive object; returns
/// its key. Nothing is visible at the key unless the whole batch was
/// written.
async fn archive(
    tx: &mut sqlx::PgConnection,
    store: &dyn ObjectStore,
    batch: &[Uuid],
) -> Result<String, RetentionError> {
    let (first, last) = (batch[0], batch[batch.len() - 1]);
    let key = format!(
        "archive/jobs/{}/{}-{}.jsonl",
        chrono::Utc::now().format("%Y-%m-%d"),
        first.simple(),
        last.simple()
    );
    let path = object_store::path::Path::from(key.as_str());
    let store_error = |source| RetentionError::Archive {
        key: key.clone(),
        source,
    };
    let upload = store.put_multipart(&path).await.map_err(store_error)?;
    let mut out = WriteMultipart::new(upload);
    let written = write_batch(tx, &mut out, batch).await;
    match written {
        Ok(()) => {
            out.finish().await.map_err(store_error)?;
            Ok(key)
        }
        Err(e) => {
            let _ = out.abort().await;
            Err(e.into())
        }
    }
}

async fn write_batch(
    tx: &mut sqlx::PgConnection,
    out: &mut WriteMultipart,
    batch: &[Uuid],
) -> Result<(), sqlx::Error> {
    let records: Vec<(Uuid, sqlx::types::Json<serde_json::Value>)> = sqlx::query_as(
        "SELECT j.id, jsonb_build_object(
             'job', to_jsonb(j),
             'attempts', COALESCE((SELECT jsonb_agg(to_jsonb(a) ORDER BY a.attempt)
                                   FROM job_attempts a WHERE a.job_id = j.id), '[]'),
             'outputs', COALESCE((SELECT jsonb_agg(to_jsonb(o) ORDER BY o.attempt, o.name)
                                  FROM job_outputs o WHERE o.job_id = j.id), '[]'))
         FROM unnest($1::uuid[]) WITH ORDINALITY AS b(id, n)
         JOIN jobs j ON j.id = b.id
         ORDER BY b.n",
    )
    .bind(batch)
    .fetch_all(&mut *tx)
    .await?;
    for (id, sqlx::types::Json(mut record)) in records {
        redact_secrets(&mut record);
        out.write(record.to_string().as_bytes());
        out.write(b"\n");
        let mut after = -1i64;
        loop {
            let page: Option<(i64, String)> = sqlx::query_as(
                "SELECT max(seq), jsonb_build_object('logs', $1::uuid, 'lines',
                            jsonb_agg(jsonb_build_object('seq', seq, 'attempt', attempt,
                                                         'stream', stream, 'line', line,
                                                         'at', at) ORDER BY seq))::text
                 FROM (SELECT * FROM job_logs WHERE job_id = $1 AND seq > $2
                       ORDER BY seq LIMIT $3) l
                 HAVING count(*) > 0",
            )
            .bind(id)
            .bind(after)
            .bind(LOG_PAGE)
            .fetch_optional(&mut *tx)
            .await?;
            let Some((last, lines)) = page else { break };
            out.write(lines.as_bytes());
            out.write(b"\n");
            after = last;
        }
    }
    Ok(())
}

/// Replaces the values of a command job's secret variables with
/// [`flotilla_core::job::REDACTED`]: the archive outlives the job, and what
/// was secret while it ran stays so.
fn redact_secrets(record: &mut serde_json::Value) {
    let spec = &mut record["job"]["spec"];
    let names: Vec<String> = spec["secret_env"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if let Some(env) = spec.get_mut("env").and_then(|e| e.as_object_mut()) {
        for name in names {
            if let Some(v) = env.get_mut(&name) {
                *v = serde_json::Value::from(flotilla_core::job::REDACTED);
            }
        }
    }
}

/// Runs a [`pass`] every `retention.interval` until `shutdown`; does
/// nothing when `retention.keep_for` is `None`. Errors are logged and the
/// next tick tries again (a batch that failed was neither deleted nor, by
/// its name, half written).
pub async fn run(
    db: PgPool,
    store: Arc<dyn ObjectStore>,
    retention: Retention,
    shutdown: CancellationToken,
) {
    let Some(keep_for) = retention.keep_for else {
        return;
    };
    let mut tick = tokio::time::interval(retention.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = pass(&db, store.as_ref(), keep_for, &shutdown).await {
            tracing::warn!(error = %e, "retention pass failed; will retry");
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// A secret variable's value does not reach the archive; the others,
    /// and the names, do.
    #[test]
    fn secrets_are_redacted_in_the_archive() {
        let mut record = json!({"job": {"spec": {
            "kind": "command", "command": "deploy",
            "env": {"TOKEN": "hunter2", "REGION": "eu"},
            "secret_env": ["TOKEN", "ABSENT"]}}});
        super::redact_secrets(&mut record);
        let env = &record["job"]["spec"]["env"];
        assert_eq!(env["TOKEN"], flotilla_core::job::REDACTED);
        assert_eq!(env["REGION"], "eu");
        assert!(env.get("ABSENT").is_none());
        // A job without secrets (or not a command) is left as it was.
        let mut tile = json!({"job": {"spec": {"kind": "tile", "tile": "grid_0.05_52.05"}}});
        let before = tile.clone();
        super::redact_secrets(&mut tile);
        assert_eq!(tile, before);
    }
}
