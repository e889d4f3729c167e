//! What happens when a revdeps run's jobs end: when its plan succeeded, the
//! candidates are cut into shard jobs; when its last shard ended, their
//! answers are merged in shard order. Each change is guarded by the run's
//! state in one transaction, so any number of servers may run [`advance`]
//! at once and each change happens once.

use flotilla_core::api::revdeps::{RunState, RunTimings};
use flotilla_core::job::{
    RevdepsPlan, RevdepsQuery, RevdepsShardResult, RevdepsStep, RevdepsVariant,
};
use sqlx::PgPool;
use uuid::Uuid;

use super::RunSpec;
use crate::queue::submit::submit_in;

/// One pass over every open run: plans that ended get their shards (or the
/// run fails); runs whose shards all ended get merged. A run that cannot be
/// advanced is failed with the reason, never left to block the pass.
pub async fn advance(db: &PgPool) -> anyhow::Result<()> {
    let planned: Vec<(Uuid, String, Option<serde_json::Value>, Option<String>)> = sqlx::query_as(
        "SELECT r.id, j.state, j.result, j.error FROM revdeps_runs r JOIN jobs j ON j.id = r.plan_job
         WHERE r.state = 'planning' AND j.state IN ('succeeded', 'failed', 'cancelled')",
    )
    .fetch_all(db)
    .await?;
    for (run, state, result, error) in planned {
        if state != "succeeded" {
            fail(
                db,
                run,
                RunState::Planning,
                &format!("phase 1 {state}: {}", error.unwrap_or_default()),
            )
            .await?;
            continue;
        }
        let plan: RevdepsPlan = match result.map(serde_json::from_value) {
            Some(Ok(p)) => p,
            _ => {
                fail(
                    db,
                    run,
                    RunState::Planning,
                    "phase 1 returned no candidate list",
                )
                .await?;
                continue;
            }
        };
        if let Err(e) = make_shards(db, run, plan).await {
            give_up_unless_transient(db, run, RunState::Planning, "making shards", e).await?;
        }
    }
    let solving: Vec<(Uuid,)> = sqlx::query_as(
        "SELECT r.id FROM revdeps_runs r WHERE r.state = 'solving'
           AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.parent_id = r.id
                           AND j.state NOT IN ('succeeded', 'failed', 'cancelled'))",
    )
    .fetch_all(db)
    .await?;
    for (run,) in solving {
        if let Err(e) = merge(db, run).await {
            give_up_unless_transient(db, run, RunState::Solving, "merging shards", e).await?;
        }
    }
    Ok(())
}

/// A step of one run went wrong. A database error may pass: it is logged
/// and the next pass tries again. Anything else (a row or result that does
/// not parse) will not: the run fails with the reason, so it neither stays
/// open forever nor stops the pass from reaching the other runs.
async fn give_up_unless_transient(
    db: &PgPool,
    run: Uuid,
    from: RunState,
    step: &str,
    e: anyhow::Error,
) -> Result<(), sqlx::Error> {
    if e.downcast_ref::<sqlx::Error>().is_some() {
        tracing::warn!(%run, error = %e, "{step}: will retry");
        return Ok(());
    }
    tracing::warn!(%run, error = %e, "{step}: the run fails");
    fail(db, run, from, &format!("{step}: {e}")).await
}

async fn fail(db: &PgPool, run: Uuid, from: RunState, why: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE revdeps_runs SET state = 'failed', error = $3, finished_at = now()
         WHERE id = $1 AND state = $2",
    )
    .bind(run)
    .bind(from.as_str())
    .bind(why)
    .execute(db)
    .await?;
    Ok(())
}

/// A run's row as its shards need it.
#[derive(sqlx::FromRow)]
struct PlannedRun {
    target: String,
    repo: String,
    variant: serde_json::Value,
    query: String,
    shard_size: i32,
    priority: i32,
    submitter: String,
    /// The plan job's cost: each shard occupies as many slots.
    cost: i32,
    /// The plan job's owner: its shards belong to the same token.
    owner_token: Option<Uuid>,
}

async fn make_shards(db: &PgPool, run: Uuid, plan: RevdepsPlan) -> anyhow::Result<()> {
    let mut tx = db.begin().await?;
    let row: Option<PlannedRun> = sqlx::query_as(
        "SELECT r.target, r.repo, r.variant, r.query, r.shard_size, r.priority, r.submitter,
                j.cost, j.owner_token
         FROM revdeps_runs r JOIN jobs j ON j.id = r.plan_job
         WHERE r.id = $1 AND r.state = 'planning' FOR UPDATE OF r",
    )
    .bind(run)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        return Ok(());
    };
    let spec = RunSpec {
        target: row.target,
        repo: row.repo,
        variant: serde_json::from_value::<RevdepsVariant>(row.variant)?,
        query: row.query.parse::<RevdepsQuery>()?,
        priority: row.priority,
        cost: row.cost as u32,
        submitter: row.submitter,
        owner: row.owner_token,
    };
    let shards: Vec<_> = plan
        .candidates
        .chunks(row.shard_size.max(1) as usize)
        .enumerate()
        .map(|(i, chunk)| {
            spec.job(
                run,
                RevdepsStep::Solve {
                    shard: i as u32,
                    candidates: chunk.to_vec(),
                },
            )
        })
        .collect();
    submit_in(&mut tx, &shards).await?;
    let timings = serde_json::to_value(RunTimings {
        load_ms: Some(plan.load_ms),
        phase1_ms: Some(plan.phase1_ms),
        ..RunTimings::default()
    })?;
    let next = if shards.is_empty() {
        RunState::Done
    } else {
        RunState::Solving
    };
    sqlx::query(
        "UPDATE revdeps_runs SET state = $2, candidates = $3, shards = $4, timings = $5,
             result = CASE WHEN $2 = 'done' THEN '[]'::jsonb END,
             finished_at = CASE WHEN $2 = 'done' THEN now() END
         WHERE id = $1",
    )
    .bind(run)
    .bind(next.as_str())
    .bind(plan.candidates.len() as i32)
    .bind(shards.len() as i32)
    .bind(timings)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    tracing::info!(%run, candidates = plan.candidates.len(), shards = shards.len(), "revdeps run planned");
    Ok(())
}

/// One shard job as the merge reads it, in shard order.
#[derive(sqlx::FromRow)]
struct ShardRow {
    shard: Option<i32>,
    state: String,
    result: Option<serde_json::Value>,
    error: Option<String>,
}

async fn merge(db: &PgPool, run: Uuid) -> anyhow::Result<()> {
    // Shards made before migration 5 (or by an older server) carry their
    // index only in their spec.
    let shards: Vec<ShardRow> = sqlx::query_as(
        "SELECT COALESCE(child_index, (spec -> 'step' -> 'solve' ->> 'shard')::integer) AS shard,
                state, result, error
         FROM jobs WHERE parent_id = $1 ORDER BY shard",
    )
    .bind(run)
    .fetch_all(db)
    .await?;
    if let Some(s) = shards.iter().find(|s| s.state != "succeeded") {
        return Ok(fail(
            db,
            run,
            RunState::Solving,
            &format!(
                "a phase-2 shard {}: {}",
                s.state,
                s.error.clone().unwrap_or_default()
            ),
        )
        .await?);
    }
    // Candidates were given to shards in the answer's order, and each shard
    // answers in the order it was given: concatenating by shard index keeps it.
    let mut parts: Vec<RevdepsShardResult> = Vec::with_capacity(shards.len());
    for s in shards {
        let shard = s
            .shard
            .ok_or_else(|| anyhow::anyhow!("run {run} has a child that is not a solve step"))?;
        let r: RevdepsShardResult = serde_json::from_value(
            s.result
                .ok_or_else(|| anyhow::anyhow!("shard {shard} of {run} has no result"))?,
        )?;
        parts.push(r);
    }
    let phase2_ms_sum: u64 = parts.iter().map(|r| r.phase2_ms).sum();
    let phase2_ms_max: u64 = parts.iter().map(|r| r.phase2_ms).max().unwrap_or(0);
    let mut lines: Vec<String> = parts.into_iter().flat_map(|r| r.found).collect();
    let query: String = sqlx::query_scalar("SELECT query FROM revdeps_runs WHERE id = $1")
        .bind(run)
        .fetch_one(db)
        .await?;
    if query.parse::<RevdepsQuery>()? == RevdepsQuery::Union {
        lines.sort();
        lines.dedup();
    }
    sqlx::query(
        "UPDATE revdeps_runs SET state = 'done', result = $2, finished_at = now(),
             timings = COALESCE(timings, '{}'::jsonb) || jsonb_build_object(
                 'phase2_ms_sum', $3::bigint, 'phase2_ms_max', $4::bigint,
                 'wall_ms', (EXTRACT(EPOCH FROM now() - created_at) * 1000)::bigint)
         WHERE id = $1 AND state = 'solving'",
    )
    .bind(run)
    .bind(serde_json::to_value(&lines)?)
    .bind(phase2_ms_sum as i64)
    .bind(phase2_ms_max as i64)
    .execute(db)
    .await?;
    tracing::info!(%run, found = lines.len(), "revdeps run done");
    Ok(())
}
