//! What an agent does with a lease. Each call is guarded by job id, lease
//! token and agent id together (a [`LeaseKey`]): a call from an older
//! attempt, or about a job another agent holds, changes nothing and is
//! refused with a reason.

use std::time::Duration;

use flotilla_core::job::{FailureClass, JobKind, JobSpec, JobState, TileJob};
use flotilla_core::protocol::{Complete, HeldLease, LeaseAction, LeaseStatus};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::error::column_error;

/// One agent's lease on one job, as every lease-guarded call names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseKey {
    pub agent: Uuid,
    pub job: Uuid,
    /// The lease token of the attempt the call is about.
    pub token: Uuid,
}

/// How an attempt ended, as the finishing statement returns it: for the
/// caller to dispatch on by kind (a tile's results, a run to advance)
/// without reading the job again.
#[derive(Debug, Clone)]
pub struct AttemptEnd {
    pub attempt: i32,
    /// The job's state afterwards.
    pub state: JobState,
    pub kind: JobKind,
    /// A tile job's spec (only tile jobs need theirs at completion).
    pub tile: Option<TileJob>,
    /// The job that made it (a revdeps run, a pipeline run, an ROI).
    pub parent: Option<Uuid>,
}

/// The columns a finishing statement returns for [`AttemptEnd`].
type EndRow = (i32, String, String, Option<serde_json::Value>, Option<Uuid>);

/// The attempt a step job gets back for an interruption (its agent shut
/// down, restarted or went silent), as a select-list item `n` over `jobs`:
/// 1 where `condition` holds and it had fewer than
/// [`MAX_INTERRUPTIONS`](flotilla_core::job::limits::MAX_INTERRUPTIONS)
/// before, else 0. A step job has one attempt unless its stage says
/// `retries`: restarting an agent would otherwise fail a pipeline's items.
pub(crate) fn given_back(condition: &str) -> String {
    format!(
        "CASE WHEN jobs.kind = 'step' AND {condition}
              AND (SELECT count(*) FROM job_attempts x WHERE x.job_id = jobs.id
                     AND x.outcome IN ('interrupted', 'lease_expired')) < {}
         THEN 1 ELSE 0 END AS n",
        flotilla_core::job::limits::MAX_INTERRUPTIONS
    )
}

/// What the finishing `UPDATE jobs` returns: the spec only for tiles (a
/// revdeps shard's spec holds thousands of candidates).
const END_RETURNING: &str =
    "RETURNING id, attempt, state, kind, CASE WHEN kind = 'tile' THEN spec END AS tile_spec, parent_id";

fn attempt_end(row: EndRow) -> Result<AttemptEnd, sqlx::Error> {
    let (attempt, state, kind, spec, parent) = row;
    let tile = match spec.map(serde_json::from_value::<JobSpec>) {
        Some(Ok(JobSpec::Tile(t))) => Some(t),
        Some(Ok(_)) | None => None,
        Some(Err(e)) => return Err(column_error("spec", e)),
    };
    Ok(AttemptEnd {
        attempt,
        state: state.parse().map_err(|e| column_error("state", e))?,
        kind: kind.parse().map_err(|e| column_error("kind", e))?,
        tile,
        parent,
    })
}

/// Why a lease-guarded call changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum LeaseRefused {
    #[error("job {0} does not exist")]
    NoSuchJob(Uuid),
    #[error("job {0} is leased to another agent")]
    NotYours(Uuid),
    #[error("lease {token} of job {job} is stale: the job is {state} at attempt {attempt} now")]
    Stale {
        job: Uuid,
        token: Uuid,
        state: String,
        attempt: i32,
    },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// (agent_id, lease_token, state, attempt) of a job.
type LeaseRow = (Option<Uuid>, Option<Uuid>, String, i32);

/// Works out why a guarded statement touched no row.
async fn refusal(conn: &mut PgConnection, key: LeaseKey) -> LeaseRefused {
    let LeaseKey { agent, job, token } = key;
    let row: Result<Option<LeaseRow>, _> =
        sqlx::query_as("SELECT agent_id, lease_token, state, attempt FROM jobs WHERE id = $1")
            .bind(job)
            .fetch_optional(&mut *conn)
            .await;
    match row {
        Err(e) => LeaseRefused::Db(e),
        Ok(None) => LeaseRefused::NoSuchJob(job),
        Ok(Some((holder, current, state, attempt))) => {
            let held_by_other = matches!(state.as_str(), "leased" | "running")
                && holder.is_some_and(|h| h != agent);
            let ours_ever: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM job_attempts
                                WHERE job_id = $1 AND lease_token = $2 AND agent_id = $3)",
            )
            .bind(job)
            .bind(token)
            .bind(agent)
            .fetch_one(&mut *conn)
            .await
            .unwrap_or(false);
            // Never ours, and someone else's or not this token: not yours.
            // Ours once: a stale lease.
            if !ours_ever && (held_by_other || current != Some(token)) {
                LeaseRefused::NotYours(job)
            } else {
                LeaseRefused::Stale {
                    job,
                    token,
                    state,
                    attempt,
                }
            }
        }
    }
}

/// [`refusal`] on a connection of the pool.
pub(crate) async fn refused(db: &PgPool, key: LeaseKey) -> LeaseRefused {
    match db.acquire().await {
        Ok(mut conn) => refusal(&mut conn, key).await,
        Err(e) => LeaseRefused::Db(e),
    }
}

/// The job's process is running.
pub async fn start(db: &PgPool, key: LeaseKey) -> Result<(), LeaseRefused> {
    let done = sqlx::query(
        "WITH j AS (
             UPDATE jobs SET state = 'running', started_at = COALESCE(started_at, now())
             WHERE id = $1 AND lease_token = $2 AND agent_id = $3 AND state IN ('leased', 'running')
             RETURNING id, attempt)
         UPDATE job_attempts a SET started_at = now() FROM j
         WHERE a.job_id = j.id AND a.attempt = j.attempt",
    )
    .bind(key.job)
    .bind(key.token)
    .bind(key.agent)
    .execute(db)
    .await?;
    if done.rows_affected() == 0 {
        return Err(refused(db, key).await);
    }
    Ok(())
}

/// The largest progress count kept: 2^40, a million times a real-size
/// tile's pixels; sums over the largest ROI (250,000 tiles) stay far
/// inside `bigint`, which an agent's `u64::MAX` per tile would not.
const MAX_PROGRESS: u64 = 1 << 40;

/// A progress count an agent sent, as its column keeps it (at most
/// [`MAX_PROGRESS`]).
fn progress_count(n: u64) -> i64 {
    n.min(MAX_PROGRESS) as i64
}

/// Extends every lease the agent still holds and reports what to do with
/// each: carry on, cancel, or drop it (lost).
pub async fn heartbeat(
    db: &PgPool,
    agent: Uuid,
    leases: &[HeldLease],
    lease_ttl: Duration,
) -> Result<Vec<LeaseStatus>, sqlx::Error> {
    let ids: Vec<Uuid> = leases.iter().map(|l| l.job_id).collect();
    let tokens: Vec<Uuid> = leases.iter().map(|l| l.lease_token).collect();
    let done: Vec<Option<i64>> = leases
        .iter()
        .map(|l| l.progress.map(|p| progress_count(p.done)))
        .collect();
    let total: Vec<Option<i64>> = leases
        .iter()
        .map(|l| l.progress.map(|p| progress_count(p.total)))
        .collect();
    // The rows are locked in id order first: two heartbeats of one agent
    // about the same leases (a retry racing the next beat) would otherwise
    // lock them in whatever order each join produced and could deadlock.
    let extended: Vec<(Uuid, bool)> = sqlx::query_as(
        "WITH h AS (SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::bigint[], $4::bigint[])
                        AS h(id, token, done, total)),
              locked AS (SELECT j.id FROM jobs j JOIN h ON j.id = h.id
                         WHERE j.lease_token = h.token AND j.agent_id = $6
                           AND j.state IN ('leased', 'running')
                         ORDER BY j.id FOR UPDATE OF j)
         UPDATE jobs j
         SET lease_expires_at = now() + $5 * interval '1 millisecond',
             progress_done = COALESCE(h.done, j.progress_done),
             progress_total = COALESCE(h.total, j.progress_total)
         FROM h, locked
         WHERE j.id = locked.id AND h.id = j.id AND j.lease_token = h.token
         RETURNING j.id, j.cancel_requested",
    )
    .bind(&ids)
    .bind(&tokens)
    .bind(&done)
    .bind(&total)
    .bind(lease_ttl.as_millis() as i64)
    .bind(agent)
    .fetch_all(db)
    .await?;
    Ok(leases
        .iter()
        .map(|l| {
            let action = match extended.iter().find(|(id, _)| *id == l.job_id) {
                Some((_, true)) => LeaseAction::Cancel,
                Some((_, false)) => LeaseAction::Continue,
                None => LeaseAction::Lost,
            };
            LeaseStatus {
                job_id: l.job_id,
                action,
            }
        })
        .collect())
}

/// The attempt number if `token` is the current lease of `job` held by
/// `agent`.
pub async fn current_attempt(db: &PgPool, key: LeaseKey) -> Result<i32, LeaseRefused> {
    let mut conn = db.acquire().await?;
    current_attempt_on(&mut conn, key).await
}

/// The attempt `key` holds and, for a tile job, its spec, if the lease is
/// current: read without a lock, ahead of completing, so that a tile's
/// outputs can be published before the completing transaction takes the
/// row (`crate::completion`). `None`: not current (the completion itself
/// says why).
pub async fn held_attempt(
    db: &PgPool,
    key: LeaseKey,
) -> Result<Option<(i32, Option<TileJob>)>, sqlx::Error> {
    let row: Option<EndRow> = sqlx::query_as(
        "SELECT attempt, state, kind, CASE WHEN kind = 'tile' THEN spec END AS tile_spec, parent_id
         FROM jobs WHERE id = $1 AND lease_token = $2 AND agent_id = $3
           AND state IN ('leased', 'running')",
    )
    .bind(key.job)
    .bind(key.token)
    .bind(key.agent)
    .fetch_optional(db)
    .await?;
    Ok(match row {
        Some(row) => {
            let held = attempt_end(row)?;
            Some((held.attempt, held.tile))
        }
        None => None,
    })
}

/// [`current_attempt`] on the caller's connection (or transaction).
async fn current_attempt_on(conn: &mut PgConnection, key: LeaseKey) -> Result<i32, LeaseRefused> {
    let attempt: Option<i32> = sqlx::query_scalar(
        "SELECT attempt FROM jobs WHERE id = $1 AND lease_token = $2 AND agent_id = $3
           AND state IN ('leased', 'running')",
    )
    .bind(key.job)
    .bind(key.token)
    .bind(key.agent)
    .fetch_optional(&mut *conn)
    .await?;
    match attempt {
        Some(a) => Ok(a),
        None => Err(refusal(conn, key).await),
    }
}

/// Records an object stored for an attempt (after the upload finished).
pub async fn record_output(
    db: &PgPool,
    job: Uuid,
    attempt: i32,
    name: &str,
    key: &str,
    size: u64,
    sha256: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO job_outputs (job_id, attempt, name, key, size, sha256)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (job_id, attempt, name)
         DO UPDATE SET key = EXCLUDED.key, size = EXCLUDED.size, sha256 = EXCLUDED.sha256,
                       stored_at = now()",
    )
    .bind(job)
    .bind(attempt)
    .bind(name)
    .bind(key)
    .bind(size as i64)
    .bind(sha256)
    .execute(db)
    .await?;
    Ok(())
}

/// Forgets the output `name` of an attempt: a direct upload that did not
/// check out replaced, then lost, the object an earlier upload of it had
/// stored, so that record no longer holds and the attempt must upload the
/// output again before it can complete.
pub async fn forget_output(
    db: &PgPool,
    job: Uuid,
    attempt: i32,
    name: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM job_outputs WHERE job_id = $1 AND attempt = $2 AND name = $3")
        .bind(job)
        .bind(attempt)
        .bind(name)
        .execute(db)
        .await?;
    Ok(())
}

/// Marks the job succeeded if `key` is still its lease and every output
/// named, and every output a command job's spec declares, was stored under
/// this attempt, in the caller's transaction: one
/// statement, so a crash leaves either the lease or the success, never half
/// of each. Work that must appear together with the success (a tile's
/// results at their final keys and its coverage) goes in the same
/// transaction; the job row stays locked until the caller commits, and
/// nothing counts until then.
pub async fn complete_in(
    tx: &mut PgConnection,
    key: LeaseKey,
    c: &Complete,
) -> Result<AttemptEnd, LeaseRefused> {
    let row: Option<EndRow> = sqlx::query_as(&format!(
        "WITH j AS (
             UPDATE jobs SET state = 'succeeded', finished_at = now(), exit_code = $4,
                             result = $5, lease_token = NULL, lease_expires_at = NULL,
                             error = NULL,
                             progress_done = COALESCE($7, progress_total, progress_done),
                             progress_total = COALESCE($7, progress_total)
             WHERE id = $1 AND lease_token = $2 AND agent_id = $3
               AND state IN ('leased', 'running')
               AND NOT EXISTS (
                   SELECT 1 FROM (SELECT unnest($6::text[])
                                  UNION
                                  SELECT jsonb_array_elements_text(
                                             COALESCE(jobs.spec->'outputs', '[]'::jsonb))
                                 ) AS o(name)
                   WHERE NOT EXISTS (SELECT 1 FROM job_outputs jo
                                     WHERE jo.job_id = $1 AND jo.attempt = jobs.attempt
                                       AND jo.name = o.name))
             {END_RETURNING}),
         a AS (
             UPDATE job_attempts a SET finished_at = now(), outcome = 'succeeded', exit_code = $4
             FROM j WHERE a.job_id = j.id AND a.attempt = j.attempt)
         SELECT attempt, state, kind, tile_spec, parent_id FROM j"
    ))
    .bind(key.job)
    .bind(key.token)
    .bind(key.agent)
    .bind(c.exit_code)
    .bind(c.result.as_ref())
    .bind(&c.outputs)
    .bind(c.progress.map(|p| progress_count(p.total)))
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(row) = row {
        return Ok(attempt_end(row)?);
    }
    // Nothing changed: either the lease is not current, or an output is
    // missing.
    let attempt = current_attempt_on(tx, key).await?;
    let stored: Vec<String> =
        sqlx::query_scalar("SELECT name FROM job_outputs WHERE job_id = $1 AND attempt = $2")
            .bind(key.job)
            .bind(attempt)
            .fetch_all(&mut *tx)
            .await?;
    let declared: Vec<String> = sqlx::query_scalar(
        "SELECT jsonb_array_elements_text(COALESCE(spec->'outputs', '[]'::jsonb))
         FROM jobs WHERE id = $1",
    )
    .bind(key.job)
    .fetch_all(&mut *tx)
    .await?;
    let missing = c
        .outputs
        .iter()
        .chain(&declared)
        .find(|o| !stored.contains(o))
        .cloned()
        .unwrap_or_default();
    Err(LeaseRefused::Invalid(format!(
        "output `{missing}` was not uploaded for attempt {attempt}; upload it before completing"
    )))
}

/// [`complete_in`] on a connection of its own: the one statement commits
/// by itself (for callers with nothing to add to the success).
pub async fn complete(
    db: &PgPool,
    key: LeaseKey,
    c: &Complete,
) -> Result<AttemptEnd, LeaseRefused> {
    let mut conn = db.acquire().await?;
    complete_in(&mut conn, key, c).await
}

/// What an agent reports about a failed attempt.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    pub class: FailureClass,
    pub message: &'a str,
    pub exit_code: Option<i32>,
}

/// Ends the attempt as failed. Retryable failures (and timeouts) queue the
/// job again after a back-off while attempts remain; a cancel request wins
/// over everything.
pub async fn fail(
    db: &PgPool,
    key: LeaseKey,
    failure: Failure<'_>,
    backoff: (Duration, Duration),
) -> Result<AttemptEnd, LeaseRefused> {
    let (retryable, outcome) = match failure.class {
        FailureClass::Retryable => (true, "failed"),
        FailureClass::TimedOut => (true, "timed_out"),
        FailureClass::Interrupted => (true, "interrupted"),
        FailureClass::Fatal => (false, "failed"),
        FailureClass::Cancelled => (false, "cancelled"),
    };
    let cancelled = failure.class == FailureClass::Cancelled;
    let interrupted = failure.class == FailureClass::Interrupted;
    let row: Option<EndRow> = sqlx::query_as(&format!(
        "WITH back AS (SELECT {} FROM jobs WHERE id = $1),
         j AS (
             UPDATE jobs SET
                 max_attempts = max_attempts
                                + CASE WHEN cancel_requested OR $6 THEN 0 ELSE back.n END,
                 state = CASE WHEN cancel_requested OR $6 THEN 'cancelled'
                              WHEN $4 AND attempt < max_attempts + back.n THEN 'retrying'
                              ELSE 'failed' END,
                 run_after = now() + flotilla_backoff(attempt, $7, $8),
                 finished_at = CASE WHEN NOT ($4 AND attempt < max_attempts + back.n)
                                         OR cancel_requested OR $6 THEN now() END,
                 lease_token = NULL, lease_expires_at = NULL,
                 exit_code = $9, error = $5
             FROM back
             WHERE id = $1 AND lease_token = $2 AND agent_id = $3 AND state IN ('leased', 'running')
             {END_RETURNING}),
         a AS (
             UPDATE job_attempts a SET finished_at = now(), outcome = $10, exit_code = $9,
                                       message = $5
             FROM j WHERE a.job_id = j.id AND a.attempt = j.attempt)
         SELECT attempt, state, kind, tile_spec, parent_id FROM j",
        given_back("$11::boolean")
    ))
    .bind(key.job)
    .bind(key.token)
    .bind(key.agent)
    .bind(retryable)
    .bind(failure.message)
    .bind(cancelled)
    .bind(backoff.0.as_millis() as i64)
    .bind(backoff.1.as_millis() as i64)
    .bind(failure.exit_code)
    .bind(outcome)
    .bind(interrupted)
    .fetch_optional(db)
    .await?;
    match row {
        Some(row) => Ok(attempt_end(row)?),
        None => Err(refused(db, key).await),
    }
}
