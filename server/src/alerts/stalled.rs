//! `queue_stalled`: an online, active agent with free slots (and room on
//! its disk) that could take ready work — a takeable job class of a kind
//! it runs, labels it carries and a cost within its free slots, whose head
//! is ready — and has leased nothing for the stall window, while that work
//! has been ready as long. One alert per agent.
//!
//! A busy fleet with a backlog does not trip it: its agents lease all the
//! time. An agent whose lease loop hangs, or a server that stopped handing
//! out work, does.
//!
//! Cost: per online agent, its free slots (`jobs_active_by_agent`), its
//! last lease (`job_attempts_by_agent`, one index entry) and, per takeable
//! class it matches, the class's head (`jobs_ready_by_class`, as the claim
//! reads it): independent of how many jobs and attempts the tables hold.

use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_core::api::alerts::{AlertName, AlertView, Severity};
use sqlx::PgPool;

/// `$1`: the online window, `$2`: the stall window, both in milliseconds.
const STALLED_SQL: &str = "
    WITH idle AS (
        SELECT a.id, a.name, a.labels, a.kinds, a.capacity,
               a.capacity - COALESCE((SELECT sum(cost) FROM jobs
                                      WHERE agent_id = a.id
                                        AND state IN ('leased', 'running')), 0) AS free,
               GREATEST(a.registered_at,
                        (SELECT t.leased_at FROM job_attempts t WHERE t.agent_id = a.id
                         ORDER BY t.leased_at DESC LIMIT 1)) AS idle_since
        FROM agents a
        WHERE a.state = 'active' AND a.disk_full_since IS NULL
          AND a.last_seen_at > now() - $1 * interval '1 millisecond'
    )
    SELECT idle.name, idle.free::bigint, idle.capacity::bigint, idle.idle_since,
           w.kind, w.ready_since
    FROM idle
    CROSS JOIN LATERAL (
        SELECT c.kind, head.run_after AS ready_since
        FROM job_classes c
        CROSS JOIN LATERAL (
            SELECT j.run_after FROM jobs j
            WHERE j.class_id = c.id AND j.state IN ('queued', 'retrying')
              AND j.run_after <= now()
            ORDER BY j.priority DESC, j.share_seq, j.created_at
            LIMIT 1
        ) head
        WHERE c.unmatchable IS NULL AND c.kind = ANY (idle.kinds)
          AND idle.labels @> c.labels AND c.cost <= idle.free
        ORDER BY head.run_after
        LIMIT 1
    ) w
    WHERE idle.free > 0
      AND idle.idle_since < now() - $2 * interval '1 millisecond'
      AND w.ready_since < now() - $2 * interval '1 millisecond'
    ORDER BY idle.name";

type Row = (String, i64, i64, DateTime<Utc>, String, DateTime<Utc>);

pub async fn stalled(
    db: &PgPool,
    online_within: Duration,
    stall_after: Duration,
) -> Result<Vec<AlertView>, sqlx::Error> {
    let rows: Vec<Row> = sqlx::query_as(STALLED_SQL)
        .bind(online_within.as_millis() as i64)
        .bind(stall_after.as_millis() as i64)
        .fetch_all(db)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(name, free, capacity, idle_since, kind, ready_since)| {
            let since = idle_since.max(ready_since);
            AlertView {
                alert: AlertName::QueueStalled,
                severity: Severity::Critical,
                message: format!(
                    "Agent {name} has {free} of {capacity} slots free and could take ready \
                     {kind} jobs (waiting since {} UTC), but has leased nothing since {} UTC. \
                     Look at its log: is its lease loop stuck, or can it not reach the \
                     server? Restarting the agent hands its work on.",
                    ready_since.format("%Y-%m-%d %H:%M:%S"),
                    idle_since.format("%Y-%m-%d %H:%M:%S"),
                ),
                subject: name,
                since: Some(since),
            }
        })
        .collect())
}
