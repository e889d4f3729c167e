//! Cancelling a job: at once if it has not started, else by a request the
//! agent sees on its next heartbeat.

use flotilla_core::job::JobState;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// The one statement that cancels: a job that has not started ends
/// `cancelled` now, a running one is asked to stop (its agent sees
/// `cancel_requested` at its next heartbeat). `$WHERE` picks the jobs.
macro_rules! cancel_where {
    ($where:literal) => {
        concat!(
            "UPDATE jobs SET cancel_requested = true,
                 state = CASE WHEN state IN ('queued', 'retrying') THEN 'cancelled' ELSE state END,
                 finished_at = CASE WHEN state IN ('queued', 'retrying') THEN now() ELSE finished_at END
             WHERE ",
            $where,
            " AND state NOT IN ('succeeded', 'failed', 'cancelled')
             RETURNING state"
        )
    };
}

/// What a cancel did.
#[derive(Debug, PartialEq, Eq)]
pub enum Cancelled {
    /// It had not started: cancelled now.
    Now,
    /// It is running: the agent is told on its next heartbeat.
    Requested,
    /// It had already finished in this state.
    AlreadyFinal(JobState),
    NotFound,
}

pub async fn cancel(db: &PgPool, id: Uuid) -> Result<Cancelled, sqlx::Error> {
    if let Some(done) = cancel_in(&mut *db.acquire().await?, id).await? {
        return Ok(done);
    }
    let state: Option<String> = sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_optional(db)
        .await?;
    Ok(match state.and_then(|s| s.parse().ok()) {
        Some(s) => Cancelled::AlreadyFinal(s),
        None => Cancelled::NotFound,
    })
}

/// Cancels, inside the caller's transaction, every job of pipeline run
/// `run` that has not ended (its step jobs and its listing), so that they
/// end with the run's own change or not at all: a crash between the two
/// could otherwise leave a closed run's jobs to run. How many were
/// cancelled now or asked to stop.
pub async fn cancel_run_jobs(conn: &mut PgConnection, run: Uuid) -> Result<u64, sqlx::Error> {
    // Locked in id order first, as a heartbeat locks its jobs: updated in
    // scan order, two of a run's jobs held by one agent's heartbeat could
    // deadlock with the cancel.
    let rows: Vec<String> = sqlx::query_scalar(cancel_where!(
        "id IN (SELECT id FROM jobs
                WHERE (parent_id = $1 OR id = (SELECT list_job FROM pipeline_runs WHERE id = $1))
                  AND state NOT IN ('succeeded', 'failed', 'cancelled')
                ORDER BY id FOR UPDATE)"
    ))
    .bind(run)
    .fetch_all(conn)
    .await?;
    Ok(rows.len() as u64)
}

/// [`cancel`] of one job on the caller's connection (its transaction, if
/// any): `Now` or `Requested`, or `None` if it had already ended or is not
/// there.
pub async fn cancel_in(
    conn: &mut PgConnection,
    id: Uuid,
) -> Result<Option<Cancelled>, sqlx::Error> {
    let state: Option<String> = sqlx::query_scalar(cancel_where!("id = $1"))
        .bind(id)
        .fetch_optional(conn)
        .await?;
    Ok(state.map(|s| {
        if s == "cancelled" {
            Cancelled::Now
        } else {
            Cancelled::Requested
        }
    }))
}
