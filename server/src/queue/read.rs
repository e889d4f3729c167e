//! Reading jobs for the API and the dashboard: views, lists, counts (logs:
//! [`super::logs`]).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use flotilla_core::api::{JobView, OutputView, Progress};
use flotilla_core::job::{JobKind, JobSpec, JobState, TileJob};

use crate::error::column_error;
use sqlx::PgPool;
use uuid::Uuid;

#[derive(sqlx::FromRow)]
struct JobRow {
    id: Uuid,
    kind: String,
    state: String,
    attempt: i32,
    max_attempts: i32,
    agent: Option<String>,
    priority: i32,
    submitter: String,
    labels: serde_json::Value,
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    exit_code: Option<i32>,
    error: Option<String>,
    cancel_requested: bool,
    progress_done: Option<i64>,
    progress_total: Option<i64>,
    spec: serde_json::Value,
    result: Option<serde_json::Value>,
    unmatchable: Option<String>,
}

const SELECT_JOB: &str = "SELECT j.id, j.kind, j.state, j.attempt, j.max_attempts, a.name AS agent,
        j.priority, j.submitter, j.labels, j.created_at, j.started_at, j.finished_at,
        j.exit_code, j.error, j.cancel_requested, j.progress_done, j.progress_total, j.spec,
        j.result,
        CASE WHEN j.state IN ('queued', 'retrying') THEN c.unmatchable END AS unmatchable
 FROM jobs j LEFT JOIN agents a ON a.id = j.agent_id
      LEFT JOIN job_classes c ON c.id = j.class_id";

fn view(row: JobRow, outputs: Vec<OutputView>) -> Result<JobView, sqlx::Error> {
    let state: JobState = row.state.parse().map_err(|e| column_error("state", e))?;
    let kind: JobKind = row.kind.parse().map_err(|e| column_error("kind", e))?;
    let spec: JobSpec = serde_json::from_value(row.spec).map_err(|e| column_error("spec", e))?;
    let labels: BTreeMap<String, String> = serde_json::from_value(row.labels).unwrap_or_default();
    Ok(JobView {
        id: row.id,
        kind,
        state,
        attempt: row.attempt as u32,
        max_attempts: row.max_attempts as u32,
        agent: row.agent,
        priority: row.priority,
        submitter: row.submitter,
        labels,
        created_at: row.created_at,
        started_at: row.started_at,
        finished_at: row.finished_at,
        exit_code: row.exit_code,
        error: row.error,
        cancel_requested: row.cancel_requested,
        progress: progress_of(row.progress_done, row.progress_total),
        outputs,
        spec,
        result: row.result,
        unmatchable: row.unmatchable,
    })
}

/// A progress value from the database, if both parts are sane.
fn progress_of(done: Option<i64>, total: Option<i64>) -> Option<Progress> {
    match (done, total) {
        (Some(d), Some(t)) if d >= 0 && t >= 0 => Some(Progress {
            done: d as u64,
            total: t as u64,
        }),
        _ => None,
    }
}

/// The outputs of the attempt that succeeded (none before success).
async fn outputs(db: &PgPool, id: Uuid) -> Result<Vec<OutputView>, sqlx::Error> {
    let rows: Vec<(String, String, i64, String)> = sqlx::query_as(
        "SELECT o.name, o.key, o.size, o.sha256 FROM job_outputs o JOIN jobs j ON j.id = o.job_id
         WHERE o.job_id = $1 AND j.state = 'succeeded' AND o.attempt = j.attempt
         ORDER BY o.name",
    )
    .bind(id)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(name, key, size, sha256)| OutputView {
            name,
            key,
            size: size as u64,
            sha256,
        })
        .collect())
}

pub async fn get(db: &PgPool, id: Uuid) -> Result<Option<JobView>, sqlx::Error> {
    let row: Option<JobRow> = sqlx::query_as(&format!("{SELECT_JOB} WHERE j.id = $1"))
        .bind(id)
        .fetch_optional(db)
        .await?;
    match row {
        None => Ok(None),
        Some(row) => {
            let outs = outputs(db, id).await?;
            view(row, outs).map(Some)
        }
    }
}

/// Newest first, optionally of one state.
/// The newest jobs (in `state`, if given; of `owner`'s, if given).
pub async fn list(
    db: &PgPool,
    state: Option<JobState>,
    owner: Option<Uuid>,
    limit: i64,
) -> Result<Vec<JobView>, sqlx::Error> {
    let rows: Vec<JobRow> = sqlx::query_as(&format!(
        "{SELECT_JOB} WHERE ($1::text IS NULL OR j.state = $1)
                        AND ($3::uuid IS NULL OR j.owner_token = $3)
         ORDER BY j.created_at DESC, j.id LIMIT $2"
    ))
    .bind(state.map(|s| s.as_str()))
    .bind(limit)
    .bind(owner)
    .fetch_all(db)
    .await?;
    rows.into_iter().map(|r| view(r, Vec::new())).collect()
}

/// Who job `id` belongs to: `None` if there is no such job, `Some(None)`
/// if it belongs to no token (admins only).
pub async fn owner(db: &PgPool, id: Uuid) -> Result<Option<Option<Uuid>>, sqlx::Error> {
    sqlx::query_scalar("SELECT owner_token FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_optional(db)
        .await
}

/// Counts of jobs per state.
pub async fn counts(db: &PgPool) -> Result<Vec<(String, i64)>, sqlx::Error> {
    sqlx::query_as("SELECT state, count(*) FROM jobs GROUP BY state ORDER BY state")
        .fetch_all(db)
        .await
}

/// The spec of job `id` (`None`: no such job, or a spec this server
/// cannot read).
pub async fn spec(db: &PgPool, id: Uuid) -> Result<Option<JobSpec>, sqlx::Error> {
    let spec: Option<serde_json::Value> = sqlx::query_scalar("SELECT spec FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_optional(db)
        .await?;
    Ok(spec.and_then(|s| serde_json::from_value(s).ok()))
}

/// The spec of tile job `id` (`None`: no such job, or not a tile job).
pub async fn tile_spec(db: &PgPool, id: Uuid) -> Result<Option<TileJob>, sqlx::Error> {
    let spec: Option<serde_json::Value> =
        sqlx::query_scalar("SELECT spec FROM jobs WHERE id = $1 AND kind = 'tile'")
            .bind(id)
            .fetch_optional(db)
            .await?;
    Ok(match spec.map(serde_json::from_value) {
        Some(Ok(JobSpec::Tile(t))) => Some(t),
        _ => None,
    })
}
