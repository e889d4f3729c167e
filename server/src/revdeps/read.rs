//! Reading runs for lists and comparisons: the runs newest first by
//! cursor, a run's step jobs, and the earlier runs of the same target.

use chrono::{DateTime, Utc};
use flotilla_core::api::revdeps::RunState;
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::column_error;

/// One line of the runs list.
#[derive(Debug, Clone)]
pub struct RunLine {
    pub id: Uuid,
    pub target: String,
    pub compiler: String,
    pub query: String,
    pub state: RunState,
    pub candidates: Option<i32>,
    pub shards: Option<i32>,
    pub shards_done: i64,
    /// Packages in the answer, once done.
    pub answer_len: Option<i64>,
    pub submitter: String,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// A page of runs and the cursor of the next (older) one.
#[derive(Debug)]
pub struct RunsPage {
    pub runs: Vec<RunLine>,
    /// The last run shown, when there may be older ones.
    pub next: Option<Uuid>,
}

#[derive(sqlx::FromRow)]
struct LineRow {
    id: Uuid,
    target: String,
    compiler: Option<String>,
    query: String,
    state: String,
    candidates: Option<i32>,
    shards: Option<i32>,
    shards_done: i64,
    answer_len: Option<i32>,
    submitter: String,
    created_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
}

/// Runs newest first, `limit` of them, older than the run `before` when
/// given (an unknown `before` gives an empty page). Reads through
/// `revdeps_runs_newest`, so a page costs the same at any depth.
pub async fn list(db: &PgPool, before: Option<Uuid>, limit: u32) -> Result<RunsPage, sqlx::Error> {
    let rows: Vec<LineRow> = sqlx::query_as(
        "SELECT r.id, r.target, r.variant->>'compiler' AS compiler, r.query, r.state,
                r.candidates, r.shards,
                (SELECT count(*) FROM jobs j
                  WHERE j.parent_id = r.id AND j.state = 'succeeded') AS shards_done,
                CASE WHEN jsonb_typeof(r.result) = 'array'
                     THEN jsonb_array_length(r.result) END AS answer_len,
                r.submitter, r.created_at, r.finished_at
         FROM revdeps_runs r
         WHERE $1::uuid IS NULL
            OR (r.created_at, r.id) < (SELECT c.created_at, c.id FROM revdeps_runs c
                                       WHERE c.id = $1)
         ORDER BY r.created_at DESC, r.id DESC
         LIMIT $2",
    )
    .bind(before)
    .bind(i64::from(limit) + 1)
    .fetch_all(db)
    .await?;
    let more = rows.len() > limit as usize;
    let mut runs = Vec::with_capacity(rows.len().min(limit as usize));
    for r in rows.into_iter().take(limit as usize) {
        runs.push(RunLine {
            id: r.id,
            target: r.target,
            compiler: r.compiler.unwrap_or_default(),
            query: r.query,
            state: r.state.parse().map_err(|e| column_error("state", e))?,
            candidates: r.candidates,
            shards: r.shards,
            shards_done: r.shards_done,
            answer_len: r.answer_len.map(i64::from),
            submitter: r.submitter,
            created_at: r.created_at,
            finished_at: r.finished_at,
        });
    }
    let next = if more {
        runs.last().map(|r| r.id)
    } else {
        None
    };
    Ok(RunsPage { runs, next })
}

/// One step job of a run: the plan (phase 1) or a shard (phase 2).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StepLine {
    pub id: Uuid,
    /// `None` for the plan job; the shard's number otherwise.
    pub shard: Option<i32>,
    pub state: String,
    pub attempts: i32,
    pub agent: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// The run whose plan job (phase 1) is `job`, if any. The shards name
/// their run as their parent; the plan job does not. Runs are few: no
/// index on `plan_job`.
pub async fn run_of_plan_job(db: &PgPool, job: Uuid) -> Result<Option<Uuid>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM revdeps_runs WHERE plan_job = $1")
        .bind(job)
        .fetch_optional(db)
        .await
}

/// The run's plan job then its shards in order.
pub async fn steps(db: &PgPool, run: Uuid, plan_job: Uuid) -> Result<Vec<StepLine>, sqlx::Error> {
    sqlx::query_as(
        "SELECT j.id, j.child_index AS shard, j.state, j.attempt AS attempts,
                a.name AS agent, j.started_at, j.finished_at
         FROM jobs j LEFT JOIN agents a ON a.id = j.agent_id
         WHERE j.id = $2 OR j.parent_id = $1
         ORDER BY j.child_index NULLS FIRST",
    )
    .bind(run)
    .bind(plan_job)
    .fetch_all(db)
    .await
}

/// Earlier runs of `target` that have an answer, newest first (at most
/// `limit`), as (id, when, compiler, query): what a run's answer can be
/// compared with.
pub async fn earlier_answers(
    db: &PgPool,
    target: &str,
    run: Uuid,
    limit: u32,
) -> Result<Vec<(Uuid, DateTime<Utc>, String, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT e.id, e.created_at, COALESCE(e.variant->>'compiler', ''), e.query
         FROM revdeps_runs e
         WHERE e.target = $1 AND e.state = 'done' AND e.id <> $2
           AND e.created_at <= (SELECT created_at FROM revdeps_runs WHERE id = $2)
         ORDER BY e.created_at DESC
         LIMIT $3",
    )
    .bind(target)
    .bind(run)
    .bind(i64::from(limit))
    .fetch_all(db)
    .await
}

/// What changed between an earlier answer and a later one: packages only
/// in the later (added) and only in the earlier (removed), each sorted.
pub fn diff(earlier: &[String], later: &[String]) -> (Vec<String>, Vec<String>) {
    use std::collections::BTreeSet;
    let e: BTreeSet<&String> = earlier.iter().collect();
    let l: BTreeSet<&String> = later.iter().collect();
    let added = l.difference(&e).map(|s| s.to_string()).collect();
    let removed = e.difference(&l).map(|s| s.to_string()).collect();
    (added, removed)
}

#[cfg(test)]
mod tests {
    use super::diff;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn diff_names_added_and_removed_packages() {
        let (added, removed) = diff(&v(&["a.1", "b.1", "c.2"]), &v(&["c.2", "d.1", "a.1"]));
        assert_eq!(added, v(&["d.1"]));
        assert_eq!(removed, v(&["b.1"]));
        let (added, removed) = diff(&v(&["x.1"]), &v(&["x.1"]));
        assert!(added.is_empty() && removed.is_empty());
    }
}
