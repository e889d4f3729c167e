//! The claim: one statement that picks the best job for an agent with
//! `FOR UPDATE SKIP LOCKED`, sets the lease and records the attempt.

use std::time::Duration;

use flotilla_core::job::JobSpec;
use flotilla_core::protocol::LeasedJob;
use sqlx::PgPool;
use uuid::Uuid;

/// The claim statement: `$1` the agent, `$2` the new lease token, `$3` the
/// lease TTL in milliseconds, `$4` the agent's request id (or NULL), kept
/// with the attempt for [`already_leased`], `$5` the id of the token the
/// agent asked with (or NULL): no job is leased once it is revoked, so a
/// lease request that waits (up to 30 s) does not hand a job to an agent
/// whose token was revoked meanwhile (reliability review L1). Public so a
/// test can `EXPLAIN` it.
///
/// It reads job classes, not jobs: of the classes some agent can take
/// (`unmatchable IS NULL`), those this agent can (a kind it runs, labels it
/// carries, a cost within its free slots); then the head of each class in
/// claim order from `jobs_ready_by_class`, locked with `SKIP LOCKED`; then
/// the best head. An agent whose disk is nearly full (`disk_full_since`,
/// kept by its heartbeats in `agents.rs`) takes nothing: one more column of
/// the one row `me` reads already. Its cost grows with the classes this
/// agent can take, not with the ready jobs it cannot (the dispatch bench
/// runs with 100,000 of those ahead; BENCHMARKS.md has the figure). Each head
/// not chosen stays locked until the statement ends, so a concurrent claim
/// takes the next job of that class instead.
pub const CLAIM_SQL: &str = "WITH me AS (
         SELECT a.id, a.labels, a.kinds,
                a.capacity - COALESCE((SELECT sum(cost) FROM jobs
                                       WHERE agent_id = a.id
                                         AND state IN ('leased', 'running')), 0) AS free
         FROM agents a
         WHERE a.id = $1 AND a.state = 'active' AND a.disk_full_since IS NULL
           AND ($5::uuid IS NULL
                OR EXISTS (SELECT 1 FROM api_tokens t WHERE t.id = $5 AND t.revoked_at IS NULL))
     ),
     pick AS (
         SELECT head.id
         FROM me
         JOIN job_classes c
           ON c.unmatchable IS NULL AND c.kind = ANY (me.kinds)
          AND me.labels @> c.labels AND c.cost <= me.free
         CROSS JOIN LATERAL (
             SELECT j.id, j.priority, j.share_seq, j.created_at FROM jobs j
             WHERE j.class_id = c.id AND j.state IN ('queued', 'retrying')
               AND j.run_after <= now()
             ORDER BY j.priority DESC, j.share_seq, j.created_at
             LIMIT 1
             FOR UPDATE OF j SKIP LOCKED
         ) head
         ORDER BY head.priority DESC, head.share_seq, head.created_at
         LIMIT 1
     ),
     leased AS (
         UPDATE jobs j
         SET state = 'leased', agent_id = $1, lease_token = $2,
             lease_expires_at = now() + $3 * interval '1 millisecond',
             attempt = j.attempt + 1, error = NULL
         FROM pick WHERE j.id = pick.id
         RETURNING j.id, j.attempt, j.spec, j.cost
     ),
     attempt AS (
         INSERT INTO job_attempts (job_id, attempt, agent_id, lease_token, lease_request)
         SELECT id, attempt, $1, $2, $4 FROM leased
     )
     SELECT id, attempt, spec, cost FROM leased";

/// Claims the best job for `agent_id`, if any fits: a kind it runs, labels it
/// carries, a cost within its free slots, the agent active and its disk not
/// nearly full. Order:
/// priority, then the fair-share tag, then age.
pub async fn claim(
    db: &PgPool,
    agent_id: Uuid,
    lease_ttl: Duration,
) -> Result<Option<LeasedJob>, sqlx::Error> {
    claim_for(db, agent_id, lease_ttl, None, None).await
}

/// [`claim`] for the agent's lease request `request`, kept with the
/// attempt so that a retry of the same request finds it
/// ([`already_leased`]), and only while the token `token` it asked with is
/// not revoked.
pub async fn claim_for(
    db: &PgPool,
    agent_id: Uuid,
    lease_ttl: Duration,
    request: Option<Uuid>,
    token: Option<Uuid>,
) -> Result<Option<LeasedJob>, sqlx::Error> {
    let lease_token = Uuid::new_v4();
    let row: Option<(Uuid, i32, serde_json::Value, i32)> = sqlx::query_as(CLAIM_SQL)
        .bind(agent_id)
        .bind(lease_token)
        .bind(lease_ttl.as_millis() as i64)
        .bind(request)
        .bind(token)
        .fetch_optional(db)
        .await?;
    leased_job(row, lease_token, lease_ttl)
}

/// The lease that the agent's request `request` already got, still held
/// and not yet started, with its expiry pushed to a full TTL from now; or
/// `None`. The answer to the first try of a lease request can be lost (the
/// server killed after the claim committed, the connection cut): the
/// agent's retry of the same request then gets the same job instead of a
/// second one, and the first does not sit leased until its lease runs out
/// and costs an attempt (reliability review L6).
pub async fn already_leased(
    db: &PgPool,
    agent_id: Uuid,
    request: Uuid,
    lease_ttl: Duration,
) -> Result<Option<LeasedJob>, sqlx::Error> {
    let row: Option<(Uuid, i32, serde_json::Value, i32, Uuid)> = sqlx::query_as(
        "UPDATE jobs j
         SET lease_expires_at = GREATEST(j.lease_expires_at,
                                         now() + $3 * interval '1 millisecond')
         FROM job_attempts a
         WHERE a.agent_id = $1 AND a.lease_request = $2
           AND j.id = a.job_id AND j.attempt = a.attempt
           AND j.state = 'leased' AND j.agent_id = $1 AND j.lease_token = a.lease_token
         RETURNING j.id, j.attempt, j.spec, j.cost, j.lease_token",
    )
    .bind(agent_id)
    .bind(request)
    .bind(lease_ttl.as_millis() as i64)
    .fetch_optional(db)
    .await?;
    match row {
        Some((id, attempt, spec, cost, token)) => {
            leased_job(Some((id, attempt, spec, cost)), token, lease_ttl)
        }
        None => Ok(None),
    }
}

fn leased_job(
    row: Option<(Uuid, i32, serde_json::Value, i32)>,
    lease_token: Uuid,
    lease_ttl: Duration,
) -> Result<Option<LeasedJob>, sqlx::Error> {
    let Some((job_id, attempt, spec, cost)) = row else {
        return Ok(None);
    };
    let spec: JobSpec =
        serde_json::from_value(spec).map_err(|e| crate::error::column_error("spec", e))?;
    Ok(Some(LeasedJob {
        job_id,
        attempt: attempt as u32,
        lease_token,
        lease_ttl_ms: lease_ttl.as_millis() as u64,
        cost: cost as u32,
        spec,
    }))
}
