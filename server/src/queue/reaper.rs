//! The reaper: jobs whose lease expired (their agent died, hung or lost the
//! network) go back to the queue after a back-off, or fail once out of
//! attempts. It is SQL, not memory, so any number of server instances can
//! run it at once.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// One pass. Returns the jobs re-queued or failed, with their new state.
pub async fn reap_once(
    db: &PgPool,
    backoff: (Duration, Duration),
) -> Result<Vec<(Uuid, String)>, sqlx::Error> {
    // An expired lease is an interruption: a step job gets the attempt
    // back (`lease::given_back`).
    sqlx::query_as(&format!(
        "WITH expired AS (
             SELECT id, {} FROM jobs
             WHERE state IN ('leased', 'running') AND lease_expires_at < now()
             FOR UPDATE SKIP LOCKED),
         j AS (
             UPDATE jobs SET
                 max_attempts = max_attempts
                                + CASE WHEN cancel_requested THEN 0 ELSE expired.n END,
                 state = CASE WHEN cancel_requested THEN 'cancelled'
                              WHEN attempt < max_attempts + expired.n THEN 'retrying'
                              ELSE 'failed' END,
                 run_after = now() + flotilla_backoff(attempt, $1, $2),
                 finished_at = CASE WHEN cancel_requested OR attempt >= max_attempts + expired.n
                                    THEN now() END,
                 lease_token = NULL, lease_expires_at = NULL,
                 error = 'lease expired: the agent stopped heartbeating'
             FROM expired WHERE jobs.id = expired.id
             RETURNING jobs.id, jobs.attempt, jobs.state),
         a AS (
             UPDATE job_attempts SET finished_at = now(), outcome = 'lease_expired'
             FROM j WHERE job_attempts.job_id = j.id AND job_attempts.attempt = j.attempt)
         SELECT id, state FROM j",
        super::lease::given_back("true")
    ))
    .bind(backoff.0.as_millis() as i64)
    .bind(backoff.1.as_millis() as i64)
    .fetch_all(db)
    .await
}

/// Runs [`reap_once`] every `interval` until `shutdown`. Database errors are
/// logged and retried on the next tick.
///
/// While the database is down no heartbeat gets through either, so leases
/// run out only because nobody could take their heartbeats: after a failed
/// pass, the first thing done once the database answers again is the same
/// grace as at start-up ([`grace_after_start`]), before anything is reaped.
/// Every server's reaper does this (they all lost the database), so no
/// server reaps a lease its agent kept alive through the outage.
pub async fn run(
    db: PgPool,
    interval: Duration,
    lease_ttl: Duration,
    backoff: (Duration, Duration),
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut database_was_down = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if database_was_down {
            match grace_after_start(&db, lease_ttl).await {
                Ok(extended) => {
                    database_was_down = false;
                    tracing::info!(
                        leases = extended,
                        "the database answers again; gave live leases a grace period"
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, "database still unavailable");
                    continue;
                }
            }
        }
        match reap_once(&db, backoff).await {
            Ok(reaped) => {
                for (id, state) in reaped {
                    tracing::warn!(job = %id, %state, "lease expired");
                }
            }
            Err(e) => {
                database_was_down = true;
                tracing::warn!(error = %e, "reaper pass failed; will retry");
            }
        }
    }
}

/// At server start: leases may have run out only because no server was up
/// to take heartbeats. Give every live lease one more TTL so that agents
/// that kept working can report, instead of their work being redone.
pub async fn grace_after_start(db: &PgPool, lease_ttl: Duration) -> Result<u64, sqlx::Error> {
    let r = sqlx::query(
        "UPDATE jobs SET lease_expires_at = GREATEST(lease_expires_at,
                                                     now() + $1 * interval '1 millisecond')
         WHERE state IN ('leased', 'running')",
    )
    .bind(lease_ttl.as_millis() as i64)
    .execute(db)
    .await?;
    Ok(r.rows_affected())
}
