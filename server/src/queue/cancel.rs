//! Cancelling a job: at once if it has not started, else by a request the
//! agent sees on its next heartbeat.

use flotilla_core::job::JobState;
use sqlx::PgPool;
use uuid::Uuid;

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
    let row: Option<(String,)> = sqlx::query_as(
        "UPDATE jobs SET cancel_requested = true,
             state = CASE WHEN state IN ('queued', 'retrying') THEN 'cancelled' ELSE state END,
             finished_at = CASE WHEN state IN ('queued', 'retrying') THEN now() ELSE finished_at END
         WHERE id = $1 AND state NOT IN ('succeeded', 'failed', 'cancelled')
         RETURNING state",
    )
    .bind(id)
    .fetch_optional(db)
    .await?;
    if let Some((state,)) = row {
        return Ok(if state == "cancelled" {
            Cancelled::Now
        } else {
            Cancelled::Requested
        });
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
