//! Reading jobs for the API and the dashboard: views with their attempts,
//! filtered lists a page at a time, counts (logs: [`super::logs`]).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_core::api::{AttemptView, JobView, OutputView, Progress};
use flotilla_core::job::{JobKind, JobSpec, JobState, TileJob};

use crate::error::column_error;
use sqlx::{PgPool, Postgres, QueryBuilder};
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
        attempts: None,
        retry_of: None,
        retried_as: None,
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

/// Job `id`'s state and attempt number: what its page's header shows that
/// moves while it runs, asked by the live page every half second (one
/// primary-key probe; [`get`] also joins and reads the outputs).
pub async fn stage(db: &PgPool, id: Uuid) -> Result<Option<(JobState, i32)>, sqlx::Error> {
    let row: Option<(String, i32)> =
        sqlx::query_as("SELECT state, attempt FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_optional(db)
            .await?;
    row.map(|(state, attempt)| {
        let state: JobState = state.parse().map_err(|e| column_error("state", e))?;
        Ok((state, attempt))
    })
    .transpose()
}

/// Job `id` with every attempt (`attempts` set) and its retry links: for
/// one job's page and `GET /api/v1/jobs/{id}`; [`get`] leaves them out.
pub async fn detail(db: &PgPool, id: Uuid) -> Result<Option<JobView>, sqlx::Error> {
    let Some(mut job) = get(db, id).await? else {
        return Ok(None);
    };
    job.attempts = Some(attempts(db, id).await?);
    (job.retry_of, job.retried_as) = sqlx::query_as(
        // LIMIT 1: one retry per job is the unique index's to keep, and a
        // page must not fail where it was left invalid by an interrupted
        // migration (the server warns of that at start).
        "SELECT j.retry_of, (SELECT r.id FROM jobs r WHERE r.retry_of = j.id LIMIT 1)
         FROM jobs j WHERE j.id = $1",
    )
    .bind(id)
    .fetch_optional(db)
    .await?
    .unwrap_or((None, None));
    Ok(Some(job))
}

/// The job that retries job `id`, if one does.
pub async fn retried_as(db: &PgPool, id: Uuid) -> Result<Option<Uuid>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM jobs WHERE retry_of = $1 LIMIT 1")
        .bind(id)
        .fetch_optional(db)
        .await
}

#[derive(sqlx::FromRow)]
struct AttemptRow {
    attempt: i32,
    agent: Option<String>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    duration_s: Option<f64>,
    outcome: Option<String>,
    exit_code: Option<i32>,
    message: Option<String>,
}

/// The attempts of job `id`, oldest first.
pub async fn attempts(db: &PgPool, id: Uuid) -> Result<Vec<AttemptView>, sqlx::Error> {
    let rows: Vec<AttemptRow> = sqlx::query_as(
        "SELECT t.attempt, a.name AS agent, t.started_at, t.finished_at,
                extract(epoch FROM t.finished_at - COALESCE(t.started_at, t.leased_at))::float8
                    AS duration_s,
                t.outcome, t.exit_code, t.message
         FROM job_attempts t LEFT JOIN agents a ON a.id = t.agent_id
         WHERE t.job_id = $1 ORDER BY t.attempt",
    )
    .bind(id)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| AttemptView {
            attempt: r.attempt.max(0) as u32,
            agent: r.agent,
            started_at: r.started_at,
            finished_at: r.finished_at,
            duration_s: r.duration_s,
            outcome: r.outcome,
            exit_code: r.exit_code,
            error: r.message,
        })
        .collect())
}

/// The newest jobs (in `state`, if given; of `owner`'s, if given): the
/// first page of [`page`].
pub async fn list(
    db: &PgPool,
    state: Option<JobState>,
    owner: Option<Uuid>,
    limit: i64,
) -> Result<Vec<JobView>, sqlx::Error> {
    let filter = JobFilter {
        state,
        owner,
        ..JobFilter::default()
    };
    Ok(page(db, &filter, None, limit).await?.jobs)
}

/// What a job list is narrowed to; the fields given are ANDed.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub state: Option<JobState>,
    pub kind: Option<JobKind>,
    /// The agent that runs or last ran the job, by id (callers look the
    /// name up with [`crate::agents::id_of`]: no such agent, no jobs).
    pub agent: Option<Uuid>,
    pub submitter: Option<String>,
    pub text: Option<JobText>,
    /// Only the jobs of this token (a client's lists).
    pub owner: Option<Uuid>,
}

impl JobFilter {
    /// Whether the list may have to walk many jobs it does not show: no
    /// index narrows kind, agent, submitter or text, so those are found by
    /// walking jobs newest first and filtering (an index can only keep
    /// the state or the owner apart).
    fn walks(&self) -> bool {
        self.kind.is_some()
            || self.agent.is_some()
            || self.submitter.is_some()
            || matches!(self.text, Some(JobText::Words { .. }))
    }
}

/// A text search, parsed from the `q` of a list.
#[derive(Debug, Clone, PartialEq)]
pub enum JobText {
    /// A whole job id: that job only.
    Id(Uuid),
    /// Text in the command (case-insensitive); when it could be part of a
    /// job id (hex digits and `-`), also the start or end of the id, so
    /// the 8 digits a page shows find their job.
    Words { text: String, id_part: bool },
}

/// The longest `q` a list takes.
pub const MAX_TEXT_BYTES: usize = 200;

impl JobText {
    /// `None` for an empty search; an error (what is wrong) for one too
    /// long or with a control character.
    pub fn parse(q: &str) -> Result<Option<JobText>, String> {
        let q = q.trim();
        if q.is_empty() {
            return Ok(None);
        }
        if q.len() > MAX_TEXT_BYTES {
            return Err(format!("is longer than {MAX_TEXT_BYTES} bytes"));
        }
        if q.chars().any(char::is_control) {
            return Err("contains a control character".into());
        }
        if let Ok(id) = q.parse::<Uuid>() {
            return Ok(Some(JobText::Id(id)));
        }
        Ok(Some(JobText::Words {
            id_part: q.chars().all(|c| c.is_ascii_hexdigit() || c == '-'),
            text: q.to_string(),
        }))
    }
}

/// `text` as a literal inside a LIKE pattern (backslash is the escape).
fn like_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '\\' | '%' | '_') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// One page of a list, and the cursor for the next.
#[derive(Debug)]
pub struct JobPage {
    pub jobs: Vec<JobView>,
    /// The last job of this page when older ones match too.
    pub next: Option<Uuid>,
}

/// Longest a list that walks jobs (see [`JobFilter::walks`]) may take:
/// a search that matches nothing walks every job, about 1.6 million a
/// second here (300,000 in 184 ms), so this covers some 8 million jobs
/// before it is cut short and the caller is asked to narrow it.
pub const WALK_TIMEOUT: Duration = Duration::from_secs(5);

/// The list query: jobs matching `filter`, older than `before` (the
/// cursor: the created time and id of the previous page's last job),
/// newest first, `limit` of them. Only the filters given are in the SQL,
/// so each combination gets a plan of its own (a generic plan for
/// `$1 IS NULL OR state = $1` uses no index). Newest first is the index
/// `jobs_newest_first` walked from its start or from the cursor; one
/// state is `jobs_by_state_created`, one owner `jobs_owner`. With
/// `explain`, prefixed by `EXPLAIN (ANALYZE, FORMAT JSON)`: public so a
/// test can check the plan.
pub fn page_query<'a>(
    explain: bool,
    filter: &'a JobFilter,
    before: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> QueryBuilder<'a, Postgres> {
    let mut q = QueryBuilder::new(if explain {
        "EXPLAIN (ANALYZE, FORMAT JSON) "
    } else {
        ""
    });
    q.push(SELECT_JOB).push(" WHERE true");
    if let Some(s) = filter.state {
        q.push(" AND j.state = ").push_bind(s.as_str());
    }
    if let Some(k) = filter.kind {
        q.push(" AND j.kind = ").push_bind(k.as_str());
    }
    if let Some(a) = filter.agent {
        q.push(" AND j.agent_id = ").push_bind(a);
    }
    if let Some(s) = &filter.submitter {
        q.push(" AND j.submitter = ").push_bind(s.as_str());
    }
    if let Some(o) = filter.owner {
        q.push(" AND j.owner_token = ").push_bind(o);
    }
    match &filter.text {
        None => {}
        Some(JobText::Id(id)) => {
            q.push(" AND j.id = ").push_bind(*id);
        }
        Some(JobText::Words { text, id_part }) => {
            q.push(" AND (j.spec->>'command' ILIKE ")
                .push_bind(format!("%{}%", like_literal(text)));
            if *id_part {
                let hex = text.to_ascii_lowercase();
                q.push(" OR j.id::text LIKE ")
                    .push_bind(format!("{hex}%"))
                    .push(" OR j.id::text LIKE ")
                    .push_bind(format!("%{hex}"));
            }
            q.push(")");
        }
    }
    if let Some((at, id)) = before {
        q.push(" AND (j.created_at, j.id) < (")
            .push_bind(at)
            .push(", ")
            .push_bind(id)
            .push(")");
    }
    q.push(" ORDER BY j.created_at DESC, j.id DESC LIMIT ")
        .push_bind(limit);
    q
}

/// Where a page that follows job `id` starts: its created time (`None`:
/// no such job).
pub async fn cursor(db: &PgPool, id: Uuid) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar("SELECT created_at FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_optional(db)
        .await
}

/// Up to `limit` jobs matching `filter`, newest first, older than job
/// `before` (from [`cursor`]). A list that walks (see
/// [`JobFilter::walks`]) is cut short after [`WALK_TIMEOUT`]
/// ([`timed_out`] says so).
pub async fn page(
    db: &PgPool,
    filter: &JobFilter,
    before: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> Result<JobPage, sqlx::Error> {
    let limit = limit.max(1);
    // One more than asked: whether there is a next page.
    let mut query = page_query(false, filter, before, limit + 1);
    let mut rows: Vec<JobRow> = if filter.walks() {
        let mut tx = db.begin().await?;
        sqlx::query(&format!(
            "SET LOCAL statement_timeout = {}",
            WALK_TIMEOUT.as_millis()
        ))
        .execute(&mut *tx)
        .await?;
        let rows = query.build_query_as().fetch_all(&mut *tx).await?;
        tx.commit().await?;
        rows
    } else {
        query.build_query_as().fetch_all(db).await?
    };
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next = if more {
        rows.last().map(|r| r.id)
    } else {
        None
    };
    let jobs = rows
        .into_iter()
        .map(|r| view(r, Vec::new()))
        .collect::<Result<_, _>>()?;
    Ok(JobPage { jobs, next })
}

/// Whether `e` is a list cut short by [`WALK_TIMEOUT`].
pub fn timed_out(e: &sqlx::Error) -> bool {
    // 57014: query_canceled, what statement_timeout raises.
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == "57014")
}

/// What a retry copies from job `id`: its state (only failed and
/// cancelled jobs are retried) and what it was submitted with.
#[derive(Debug)]
pub struct RetrySource {
    pub state: JobState,
    pub spec: JobSpec,
    pub labels: BTreeMap<String, String>,
    pub priority: i32,
    pub cost: u32,
    pub max_attempts: u32,
}

/// [`RetrySource`] of job `id` (`None`: no such job).
pub async fn retry_source(db: &PgPool, id: Uuid) -> Result<Option<RetrySource>, sqlx::Error> {
    type Row = (String, serde_json::Value, serde_json::Value, i32, i32, i32);
    let row: Option<Row> = sqlx::query_as(
        "SELECT state, spec, labels, priority, cost, max_attempts FROM jobs WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(db)
    .await?;
    let Some((state, spec, labels, priority, cost, max_attempts)) = row else {
        return Ok(None);
    };
    Ok(Some(RetrySource {
        state: state.parse().map_err(|e| column_error("state", e))?,
        spec: serde_json::from_value(spec).map_err(|e| column_error("spec", e))?,
        labels: serde_json::from_value(labels).map_err(|e| column_error("labels", e))?,
        priority,
        cost: cost.max(1) as u32,
        max_attempts: max_attempts.max(1) as u32,
    }))
}

/// The run job `id` is part of (`jobs.parent_id`: a pipeline run for a
/// step job, a revdeps run for a shard), if any.
pub async fn parent(db: &PgPool, id: Uuid) -> Result<Option<Uuid>, sqlx::Error> {
    let parent: Option<Option<Uuid>> =
        sqlx::query_scalar("SELECT parent_id FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_optional(db)
            .await?;
    Ok(parent.flatten())
}

/// Who job `id` belongs to: `None` if there is no such job, `Some(None)`
/// if it belongs to no token (admins only).
pub async fn owner(db: &PgPool, id: Uuid) -> Result<Option<Option<Uuid>>, sqlx::Error> {
    sqlx::query_scalar("SELECT owner_token FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_optional(db)
        .await
}

/// Counts of jobs per state: all jobs, or `owner`'s (through
/// `jobs_owner`).
pub async fn counts(db: &PgPool, owner: Option<Uuid>) -> Result<Vec<(String, i64)>, sqlx::Error> {
    match owner {
        None => {
            sqlx::query_as("SELECT state, count(*) FROM jobs GROUP BY state ORDER BY state")
                .fetch_all(db)
                .await
        }
        Some(o) => {
            sqlx::query_as(
                "SELECT state, count(*) FROM jobs WHERE owner_token = $1
                 GROUP BY state ORDER BY state",
            )
            .bind(o)
            .fetch_all(db)
            .await
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn searches_parse_into_ids_and_words() {
        assert_eq!(JobText::parse("  ").unwrap(), None);
        let id = Uuid::now_v7();
        assert_eq!(
            JobText::parse(&id.to_string()).unwrap(),
            Some(JobText::Id(id))
        );
        assert_eq!(
            JobText::parse("1a2B3c4d").unwrap(),
            Some(JobText::Words {
                text: "1a2B3c4d".into(),
                id_part: true
            })
        );
        assert_eq!(
            JobText::parse(" make test ").unwrap(),
            Some(JobText::Words {
                text: "make test".into(),
                id_part: false
            })
        );
        assert!(JobText::parse(&"x".repeat(MAX_TEXT_BYTES + 1)).is_err());
        assert!(JobText::parse("a\nb").is_err());
    }

    #[test]
    fn like_patterns_take_wildcards_literally() {
        assert_eq!(like_literal(r"100%_done\"), r"100\%\_done\\");
        assert_eq!(like_literal("plain"), "plain");
    }
}
