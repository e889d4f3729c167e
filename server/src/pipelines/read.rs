//! Pipeline runs as the API, CLI and dashboard show them: a list with
//! counts, and one run with its step columns and a page of its item ×
//! step matrix.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use flotilla_core::api::pipelines::{
    GateView, ItemCounts, ItemRow, PipelineState, PipelineSummary, PipelineView, StepCell,
    StepColumn,
};
use flotilla_core::pipeline::plan::{NodeStep, Plan};
use flotilla_core::pipeline::PipelineSpec;
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::column_error;

#[derive(sqlx::FromRow)]
struct RunRow {
    id: Uuid,
    name: String,
    state: String,
    items: Option<i32>,
    submitter: String,
    created_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    error: Option<String>,
}

const RUN_COLUMNS: &str =
    "r.id, r.name, r.state, r.items, r.submitter, r.created_at, r.finished_at, r.error";

/// Runs' items by state, from the totals the tables' triggers keep
/// (a count of every item was 15 ms a read at 50,000 items).
async fn counts(db: &PgPool, ids: &[Uuid]) -> sqlx::Result<HashMap<Uuid, ItemCounts>> {
    let rows: Vec<(Uuid, String, i64)> = sqlx::query_as(
        "SELECT run_id, state, n FROM pipeline_item_totals WHERE run_id = ANY ($1) AND n <> 0",
    )
    .bind(ids)
    .fetch_all(db)
    .await?;
    let mut out: HashMap<Uuid, ItemCounts> = HashMap::new();
    for (run, state, n) in rows {
        let c = out.entry(run).or_default();
        let n = n as u64;
        match state.as_str() {
            "waiting" => c.waiting = n,
            "active" => c.active = n,
            "done" => c.done = n,
            "failed" => c.failed = n,
            _ => c.cancelled = n,
        }
    }
    Ok(out)
}

fn summary(r: RunRow, counts: ItemCounts) -> Result<PipelineSummary, sqlx::Error> {
    Ok(PipelineSummary {
        id: r.id,
        state: PipelineState::parse(&r.state)
            .ok_or_else(|| column_error("state", format!("unknown state {}", r.state)))?,
        name: r.name,
        items: r.items.map(|n| n as u64),
        counts,
        submitter: r.submitter,
        created_at: r.created_at,
        finished_at: r.finished_at,
        error: r.error,
    })
}

/// The newest runs first, at most `limit`, before `before` (a run id from
/// the previous page) when given; only `owner`'s when given.
pub async fn list(
    db: &PgPool,
    owner: Option<Uuid>,
    before: Option<Uuid>,
    limit: u32,
) -> sqlx::Result<Vec<PipelineSummary>> {
    let rows: Vec<RunRow> = sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM pipeline_runs r
         WHERE ($1::uuid IS NULL OR r.owner_token = $1)
           AND ($2::uuid IS NULL OR (r.created_at, r.id) <
                (SELECT created_at, id FROM pipeline_runs WHERE id = $2))
         ORDER BY r.created_at DESC, r.id DESC LIMIT $3"
    ))
    .bind(owner)
    .bind(before)
    .bind(limit as i64)
    .fetch_all(db)
    .await?;
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let mut counts = counts(db, &ids).await?;
    rows.into_iter()
        .map(|r| {
            let c = counts.remove(&r.id).unwrap_or_default();
            summary(r, c)
        })
        .collect()
}

/// The token a run belongs to (`None`: admins only), if the run exists.
pub async fn owner(db: &PgPool, id: Uuid) -> sqlx::Result<Option<Option<Uuid>>> {
    sqlx::query_scalar("SELECT owner_token FROM pipeline_runs WHERE id = $1")
        .bind(id)
        .fetch_optional(db)
        .await
}

#[derive(sqlx::FromRow)]
struct CellRow {
    idx: i32,
    node: i32,
    state: String,
    job_id: Option<Uuid>,
}

/// Run `id` with items after index `after` (all from the start when
/// `None`), at most `limit` of them.
pub async fn get(
    db: &PgPool,
    id: Uuid,
    after: Option<u64>,
    limit: u32,
) -> sqlx::Result<Option<PipelineView>> {
    let row: Option<(RunRow, serde_json::Value, Uuid)> = {
        let r: Option<RunRow> = sqlx::query_as(&format!(
            "SELECT {RUN_COLUMNS} FROM pipeline_runs r WHERE r.id = $1"
        ))
        .bind(id)
        .fetch_optional(db)
        .await?;
        match r {
            None => None,
            Some(r) => {
                let (spec, list_job): (serde_json::Value, Uuid) =
                    sqlx::query_as("SELECT spec, list_job FROM pipeline_runs WHERE id = $1")
                        .bind(id)
                        .fetch_one(db)
                        .await?;
                Some((r, spec, list_job))
            }
        }
    };
    let Some((run, spec, list_job)) = row else {
        return Ok(None);
    };
    let spec: PipelineSpec = serde_json::from_value(spec).map_err(|e| column_error("spec", e))?;
    let plan = Plan::new(&spec);
    let counts = counts(db, &[id]).await?.remove(&id).unwrap_or_default();
    // From the totals the cells' trigger keeps: a GROUP BY over every cell
    // was 51 ms a read at 50,000 items x 5 steps.
    let stats: Vec<(i32, String, i64, Option<f64>)> = sqlx::query_as(
        "SELECT node, state, n, CASE WHEN timed > 0 THEN seconds / timed END
         FROM pipeline_step_totals WHERE run_id = $1 AND n <> 0",
    )
    .bind(id)
    .fetch_all(db)
    .await?;
    let mut steps: Vec<StepColumn> = plan
        .nodes
        .iter()
        .map(|n| StepColumn {
            name: n.name.clone(),
            kind: match n.step {
                NodeStep::Stage(_) => "stage".into(),
                NodeStep::Move(_) => "move".into(),
            },
            host: n.host.clone(),
            running: 0,
            succeeded: 0,
            failed: 0,
            mean_s: None,
        })
        .collect();
    for (node, state, n, mean) in stats {
        let Some(col) = steps.get_mut(node as usize) else {
            continue;
        };
        match state.as_str() {
            "running" => col.running = n as u64,
            "succeeded" => {
                col.succeeded = n as u64;
                col.mean_s = mean;
            }
            _ => col.failed += n as u64,
        }
    }
    let inside: Vec<(i32, i64)> =
        sqlx::query_as("SELECT gate, count(*) FROM pipeline_gates WHERE run_id = $1 GROUP BY gate")
            .bind(id)
            .fetch_all(db)
            .await?;
    let inside: HashMap<i32, i64> = inside.into_iter().collect();
    let gates = plan
        .gates
        .iter()
        .enumerate()
        .map(|(g, n)| GateView {
            limit: *n,
            inside: inside.get(&(g as i32)).copied().unwrap_or(0) as u64,
        })
        .collect();
    // Past the last possible index (a run has at most a million items):
    // an empty page, not an overflow or a wrap to a small index.
    let start = after.map_or(0, |a| a.saturating_add(1).min(i32::MAX as u64) as i32);
    let items: Vec<(i32, String, String, Option<String>)> = sqlx::query_as(
        "SELECT idx, item, state, error FROM pipeline_items WHERE run_id = $1 AND idx >= $2
         ORDER BY idx LIMIT $3",
    )
    .bind(id)
    .bind(start)
    .bind(limit as i64 + 1)
    .fetch_all(db)
    .await?;
    let more = items.len() > limit as usize;
    let items = &items[..items.len().min(limit as usize)];
    let (lo, hi) = match (items.first(), items.last()) {
        (Some(f), Some(l)) => (f.0, l.0),
        _ => (0, -1),
    };
    let cells: Vec<CellRow> = sqlx::query_as(
        "SELECT idx, node, state, job_id FROM pipeline_steps
         WHERE run_id = $1 AND idx BETWEEN $2 AND $3",
    )
    .bind(id)
    .bind(lo)
    .bind(hi)
    .fetch_all(db)
    .await?;
    let mut by_item: HashMap<i32, Vec<Option<StepCell>>> = HashMap::new();
    for c in cells {
        let row = by_item
            .entry(c.idx)
            .or_insert_with(|| vec![None; plan.nodes.len()]);
        if let Some(slot) = row.get_mut(c.node as usize) {
            *slot = Some(StepCell {
                state: c.state,
                job_id: c.job_id,
            });
        }
    }
    let rows = items
        .iter()
        .map(|(idx, item, state, error)| ItemRow {
            item: item.clone(),
            state: state.clone(),
            cells: by_item
                .remove(idx)
                .unwrap_or_else(|| vec![None; plan.nodes.len()]),
            error: error.clone(),
        })
        .collect();
    let next_after = if more { Some(hi as u64) } else { None };
    Ok(Some(PipelineView {
        summary: summary(run, counts)?,
        list_job,
        steps,
        gates,
        rows,
        next_after,
    }))
}

/// The object key of the tar that the send of receiving job `job`'s move
/// stored: the same run, item and step, its attempt that succeeded.
pub async fn sent_tar(db: &PgPool, job: Uuid) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar(
        "SELECT o.key FROM jobs r
         JOIN jobs s ON s.parent_id = r.parent_id AND s.kind = 'step' AND s.state = 'succeeded'
                    AND s.spec->>'item' = r.spec->>'item' AND s.spec->>'step' = r.spec->>'step'
                    AND s.spec->'action'->>'type' = 'send'
         JOIN job_outputs o ON o.job_id = s.id AND o.attempt = s.attempt AND o.name = $2
         WHERE r.id = $1 AND r.kind = 'step' AND r.spec->'action'->>'type' = 'receive'
         ORDER BY s.finished_at DESC LIMIT 1",
    )
    .bind(job)
    .bind(flotilla_core::job::StepJob::SENT_OUTPUT)
    .fetch_optional(db)
    .await
}
