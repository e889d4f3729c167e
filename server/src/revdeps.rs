//! opam reverse-dependency runs: owns `revdeps_runs`. A run is one plan job
//! (phase 1 on an agent) and then shard jobs (phase 2 on slices of the
//! candidates, on whichever agents are free); the coordinator, a SQL loop
//! any server instance may run, makes the shards when the plan succeeds and
//! merges their results when the last shard ends.

use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_core::job::{
    JobSpec, RevdepsJob, RevdepsPlan, RevdepsShardResult, RevdepsStep, RevdepsVariant,
};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::queue::submit::{submit_in, NewJob};

/// A run as clients submit it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRevdeps {
    /// `name.version`, e.g. `dune.3.20.2`.
    pub target: String,
    /// The invariant compiler, `name.version`.
    pub compiler: String,
    /// The opam repository on the agents' hosts, `PATH[:REV]`.
    pub repo: String,
    #[serde(default = "d_arch")]
    pub arch: String,
    #[serde(default = "d_os")]
    pub os: String,
    #[serde(default = "d_debian")]
    pub os_family: String,
    #[serde(default = "d_debian")]
    pub os_distribution: String,
    #[serde(default = "d_os_version")]
    pub os_version: String,
    #[serde(default = "d_opam_version")]
    pub opam_version: String,
    #[serde(default = "d_query")]
    pub query: String,
    /// Candidates per phase-2 shard: above this many, phase 2 is split into
    /// shards that run as separate jobs.
    #[serde(default = "d_shard_size")]
    pub shard_size: u32,
    #[serde(default)]
    pub priority: i32,
    /// Slots each step occupies on an agent (phase 2 uses that many threads).
    #[serde(default = "d_cost")]
    pub cost: u32,
}

fn d_arch() -> String {
    "x86_64".into()
}
fn d_os() -> String {
    "linux".into()
}
fn d_debian() -> String {
    "debian".into()
}
fn d_os_version() -> String {
    "12".into()
}
fn d_opam_version() -> String {
    "2.1.2".into()
}
fn d_query() -> String {
    "union".into()
}
fn d_shard_size() -> u32 {
    4000
}
fn d_cost() -> u32 {
    1
}

/// What is wrong with a submission, naming the field.
pub fn validate(s: &SubmitRevdeps) -> Result<(), String> {
    let nv = |field: &str, v: &str| -> Result<(), String> {
        match v.split_once('.') {
            Some((n, ver))
                if !n.is_empty() && !ver.is_empty() && !v.contains(char::is_whitespace) =>
            {
                Ok(())
            }
            _ => Err(format!("`{field}` must be name.version, got {v:?}")),
        }
    };
    nv("target", &s.target)?;
    nv("compiler", &s.compiler)?;
    if s.repo.trim().is_empty() {
        return Err("`repo` is empty: give the repository path on the agents, PATH[:REV]".into());
    }
    if !["union", "depopts", "recursive", "with-test-depopts"].contains(&s.query.as_str()) {
        return Err(format!(
            "`query` must be union, depopts, recursive or with-test-depopts, got {:?}",
            s.query
        ));
    }
    if s.shard_size == 0 {
        return Err("`shard_size` must be at least 1".into());
    }
    if s.cost == 0 || s.cost > 1024 {
        return Err("`cost` must be between 1 and 1024".into());
    }
    Ok(())
}

fn job(
    run_id: Uuid,
    s: &SubmitRevdeps,
    variant: &RevdepsVariant,
    step: RevdepsStep,
    submitter: &str,
    parent: Option<Uuid>,
) -> NewJob {
    NewJob {
        spec: JobSpec::Revdeps(RevdepsJob {
            run_id,
            repo: s.repo.clone(),
            target: s.target.clone(),
            variant: variant.clone(),
            query: s.query.clone(),
            step,
        }),
        labels: Default::default(),
        priority: s.priority,
        max_attempts: 3,
        cost: s.cost,
        submitter: submitter.to_string(),
        parent_id: parent,
    }
}

/// Records a run and queues its plan job, in one transaction.
pub async fn submit(db: &PgPool, s: &SubmitRevdeps, submitter: &str) -> Result<Uuid, sqlx::Error> {
    let run_id = Uuid::new_v4();
    let variant = RevdepsVariant {
        compiler: s.compiler.clone(),
        arch: s.arch.clone(),
        os: s.os.clone(),
        os_family: s.os_family.clone(),
        os_distribution: s.os_distribution.clone(),
        os_version: s.os_version.clone(),
        opam_version: s.opam_version.clone(),
    };
    let mut tx = db.begin().await?;
    let plan = submit_in(
        &mut tx,
        &[job(run_id, s, &variant, RevdepsStep::Plan, submitter, None)],
    )
    .await?[0];
    sqlx::query(
        "INSERT INTO revdeps_runs (id, target, repo, variant, query, shard_size, priority,
                                   submitter, plan_job)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(run_id)
    .bind(&s.target)
    .bind(&s.repo)
    .bind(serde_json::to_value(&variant).expect("variant serialises"))
    .bind(&s.query)
    .bind(s.shard_size as i32)
    .bind(s.priority)
    .bind(submitter)
    .bind(plan)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(run_id)
}

/// `GET /api/v1/revdeps/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunView {
    pub id: Uuid,
    pub state: String,
    pub target: String,
    pub repo: String,
    pub query: String,
    pub variant: serde_json::Value,
    pub plan_job: Uuid,
    pub candidates: Option<i32>,
    pub shards: Option<i32>,
    pub shards_done: i64,
    pub result: Option<Vec<String>>,
    pub timings: Option<serde_json::Value>,
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

type RunRow = (
    Uuid,
    String,
    String,
    String,
    String,
    serde_json::Value,
    Uuid,
    Option<i32>,
    Option<i32>,
    Option<serde_json::Value>,
    Option<serde_json::Value>,
    Option<String>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
);

pub async fn get(db: &PgPool, id: Uuid) -> Result<Option<RunView>, sqlx::Error> {
    let row: Option<RunRow> = sqlx::query_as(
        "SELECT id, state, target, repo, query, variant, plan_job, candidates, shards, result,
                timings, error, created_at, finished_at
         FROM revdeps_runs WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(db)
    .await?;
    let Some(r) = row else { return Ok(None) };
    let shards_done: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE parent_id = $1 AND state = 'succeeded'",
    )
    .bind(id)
    .fetch_one(db)
    .await?;
    Ok(Some(RunView {
        id: r.0,
        state: r.1,
        target: r.2,
        repo: r.3,
        query: r.4,
        variant: r.5,
        plan_job: r.6,
        candidates: r.7,
        shards: r.8,
        shards_done,
        result: r.9.and_then(|v| serde_json::from_value(v).ok()),
        timings: r.10,
        error: r.11,
        created_at: r.12,
        finished_at: r.13,
    }))
}

/// One pass of the coordinator: plans that finished get their shards; runs
/// whose shards all finished get merged. Each change is guarded by the
/// run's state in one transaction, so concurrent servers do it once.
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
                "planning",
                &format!("phase 1 {state}: {}", error.unwrap_or_default()),
            )
            .await?;
            continue;
        }
        let plan: RevdepsPlan = match result.map(serde_json::from_value) {
            Some(Ok(p)) => p,
            _ => {
                fail(db, run, "planning", "phase 1 returned no candidate list").await?;
                continue;
            }
        };
        make_shards(db, run, plan).await?;
    }
    let solving: Vec<(Uuid,)> = sqlx::query_as(
        "SELECT r.id FROM revdeps_runs r WHERE r.state = 'solving'
           AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.parent_id = r.id
                           AND j.state NOT IN ('succeeded', 'failed', 'cancelled'))",
    )
    .fetch_all(db)
    .await?;
    for (run,) in solving {
        merge(db, run).await?;
    }
    Ok(())
}

async fn fail(db: &PgPool, run: Uuid, from: &str, why: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE revdeps_runs SET state = 'failed', error = $3, finished_at = now()
         WHERE id = $1 AND state = $2",
    )
    .bind(run)
    .bind(from)
    .bind(why)
    .execute(db)
    .await?;
    Ok(())
}

async fn make_shards(db: &PgPool, run: Uuid, plan: RevdepsPlan) -> anyhow::Result<()> {
    let mut tx = db.begin().await?;
    let row: Option<(String, String, serde_json::Value, String, i32, i32, String)> =
        sqlx::query_as(
            "SELECT target, repo, variant, query, shard_size, priority, submitter FROM revdeps_runs
         WHERE id = $1 AND state = 'planning' FOR UPDATE",
        )
        .bind(run)
        .fetch_optional(&mut *tx)
        .await?;
    let Some((target, repo, variant, query, shard_size, priority, submitter)) = row else {
        return Ok(());
    };
    let variant: RevdepsVariant = serde_json::from_value(variant)?;
    let cost: i32 = sqlx::query_scalar(
        "SELECT j.cost FROM jobs j JOIN revdeps_runs r ON r.plan_job = j.id WHERE r.id = $1",
    )
    .bind(run)
    .fetch_one(&mut *tx)
    .await?;
    let s = SubmitRevdeps {
        target,
        compiler: variant.compiler.clone(),
        repo,
        arch: variant.arch.clone(),
        os: variant.os.clone(),
        os_family: variant.os_family.clone(),
        os_distribution: variant.os_distribution.clone(),
        os_version: variant.os_version.clone(),
        opam_version: variant.opam_version.clone(),
        query,
        shard_size: shard_size as u32,
        priority,
        cost: cost as u32,
    };
    let shards: Vec<NewJob> = plan
        .candidates
        .chunks(shard_size.max(1) as usize)
        .enumerate()
        .map(|(i, chunk)| {
            job(
                run,
                &s,
                &variant,
                RevdepsStep::Solve {
                    shard: i as u32,
                    candidates: chunk.to_vec(),
                },
                &submitter,
                Some(run),
            )
        })
        .collect();
    submit_in(&mut tx, &shards).await?;
    let timings = serde_json::json!({"load_ms": plan.load_ms, "phase1_ms": plan.phase1_ms});
    let next = if shards.is_empty() { "done" } else { "solving" };
    sqlx::query(
        "UPDATE revdeps_runs SET state = $2, candidates = $3, shards = $4, timings = $5,
             result = CASE WHEN $2 = 'done' THEN '[]'::jsonb END,
             finished_at = CASE WHEN $2 = 'done' THEN now() END
         WHERE id = $1",
    )
    .bind(run)
    .bind(next)
    .bind(plan.candidates.len() as i32)
    .bind(shards.len() as i32)
    .bind(timings)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    tracing::info!(%run, candidates = plan.candidates.len(), shards = shards.len(), "revdeps run planned");
    Ok(())
}

async fn merge(db: &PgPool, run: Uuid) -> anyhow::Result<()> {
    let shards: Vec<(
        String,
        Option<serde_json::Value>,
        serde_json::Value,
        Option<String>,
    )> = sqlx::query_as("SELECT state, result, spec, error FROM jobs WHERE parent_id = $1")
        .bind(run)
        .fetch_all(db)
        .await?;
    if let Some((state, _, _, err)) = shards.iter().find(|s| s.0 != "succeeded") {
        return Ok(fail(
            db,
            run,
            "solving",
            &format!(
                "a phase-2 shard {state}: {}",
                err.clone().unwrap_or_default()
            ),
        )
        .await?);
    }
    // Candidates were given to shards in the answer's order, and each shard
    // answers in the order it was given: concatenating by shard index keeps it.
    let mut parts: Vec<(u32, RevdepsShardResult)> = Vec::new();
    for (_, result, spec, _) in shards {
        let shard = match serde_json::from_value::<JobSpec>(spec)? {
            JobSpec::Revdeps(RevdepsJob {
                step: RevdepsStep::Solve { shard, .. },
                ..
            }) => shard,
            _ => anyhow::bail!("run {run} has a child that is not a solve step"),
        };
        let r: RevdepsShardResult = serde_json::from_value(
            result.ok_or_else(|| anyhow::anyhow!("shard {shard} of {run} has no result"))?,
        )?;
        parts.push((shard, r));
    }
    parts.sort_by_key(|(i, _)| *i);
    let phase2_ms_sum: u64 = parts.iter().map(|(_, r)| r.phase2_ms).sum();
    let phase2_ms_max: u64 = parts.iter().map(|(_, r)| r.phase2_ms).max().unwrap_or(0);
    let mut lines: Vec<String> = parts.into_iter().flat_map(|(_, r)| r.found).collect();
    let query: String = sqlx::query_scalar("SELECT query FROM revdeps_runs WHERE id = $1")
        .bind(run)
        .fetch_one(db)
        .await?;
    if query == "union" {
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

/// Runs [`advance`] every `interval` until `shutdown`.
pub async fn coordinate(db: PgPool, interval: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        if let Err(e) = advance(&db).await {
            tracing::warn!(error = %e, "revdeps coordinator pass failed; will retry");
        }
    }
}
