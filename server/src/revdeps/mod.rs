//! opam reverse-dependency runs: owns `revdeps_runs`. A run is one plan job
//! (phase 1 on an agent) and then shard jobs (phase 2 on slices of the
//! candidates, on whichever agents are free).
//!
//! - here: a submission checked ([`ValidRevdeps`]), recorded with its plan
//!   job, and a run read back ([`get`]).
//! - [`coordinator`]: what happens when a run's jobs end: shards made when
//!   the plan succeeds, results merged when the last shard ends.
//! - [`read`]: runs newest first by cursor, a run's step jobs, earlier runs
//!   of the same target and the difference of two answers.

pub mod coordinator;
pub mod read;

use chrono::{DateTime, Utc};
use flotilla_core::api::revdeps::{RunTimings, RunView, SubmitRevdeps};
use flotilla_core::api::FieldError;
use flotilla_core::job::{
    check_text, limits, JobSpec, RevdepsJob, RevdepsQuery, RevdepsStep, RevdepsVariant,
};
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::column_error;
use crate::queue::submit::{submit_in, within_waiting_cap, NewJob, WaitingCapExceeded};

/// Most names in a run's `missing_depexts` (opam-repository asks for a few
/// thousand system packages in all).
const MAX_MISSING_DEPEXTS: usize = 10_000;

/// What every job of one run shares: the question and how its steps are
/// queued. Made from a submission, and again from the run's row when its
/// shards are made.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub target: String,
    pub repo: String,
    pub variant: RevdepsVariant,
    pub query: RevdepsQuery,
    pub priority: i32,
    /// Slots each step occupies on an agent.
    pub cost: u32,
    pub submitter: String,
    /// The token the run's jobs belong to.
    pub owner: Option<Uuid>,
}

impl RunSpec {
    /// Step `step` of run `run_id` as a job to queue; shards are children of
    /// the run, at their index.
    fn job(&self, run_id: Uuid, step: RevdepsStep) -> NewJob {
        let child_index = match &step {
            RevdepsStep::Plan => None,
            RevdepsStep::Solve { shard, .. } => Some(*shard as i32),
        };
        NewJob {
            spec: JobSpec::Revdeps(RevdepsJob {
                run_id,
                repo: self.repo.clone(),
                target: self.target.clone(),
                variant: self.variant.clone(),
                query: self.query,
                step,
            }),
            labels: Default::default(),
            priority: self.priority,
            max_attempts: 3,
            cost: self.cost,
            submitter: self.submitter.clone(),
            parent_id: child_index.map(|_| run_id),
            child_index,
            owner: self.owner,
        }
    }
}

/// A submission whose fields have been checked.
#[derive(Debug, Clone)]
pub struct ValidRevdeps {
    /// Everything but the submitter, which comes from the caller.
    pub spec: RunSpec,
    pub shard_size: u32,
}

impl TryFrom<SubmitRevdeps> for ValidRevdeps {
    type Error = FieldError;

    fn try_from(s: SubmitRevdeps) -> Result<Self, FieldError> {
        let name_version = |field: &str, v: &str| -> Result<(), FieldError> {
            if v.len() > limits::MAX_NAME_VERSION_BYTES {
                return Err(FieldError::at(
                    field,
                    format_args!("is longer than {} bytes", limits::MAX_NAME_VERSION_BYTES),
                ));
            }
            match v.split_once('.') {
                Some((n, ver))
                    if !n.is_empty() && !ver.is_empty() && !v.contains(char::is_whitespace) =>
                {
                    Ok(())
                }
                _ => Err(FieldError::at(
                    field,
                    format_args!("must be name.version, got {v:?}"),
                )),
            }
        };
        name_version("target", &s.target)?;
        name_version("compiler", &s.compiler)?;
        check_text("target", &s.target, "", limits::MAX_NAME_VERSION_BYTES)?;
        check_text("compiler", &s.compiler, "", limits::MAX_NAME_VERSION_BYTES)?;
        check_text("repo", &s.repo, "", limits::MAX_PATH_BYTES)?;
        // The host variables opam filters on: short words.
        for (field, v) in [
            ("arch", &s.arch),
            ("os", &s.os),
            ("os_family", &s.os_family),
            ("os_distribution", &s.os_distribution),
            ("os_version", &s.os_version),
            ("opam_version", &s.opam_version),
        ] {
            check_text(field, v, "", limits::MAX_NAME_VERSION_BYTES)?;
        }
        if let Some(names) = &s.missing_depexts {
            if names.len() > MAX_MISSING_DEPEXTS {
                return Err(FieldError::at(
                    "missing_depexts",
                    format_args!("has {} names; at most {MAX_MISSING_DEPEXTS}", names.len()),
                ));
            }
            for (i, name) in names.iter().enumerate() {
                let field = format!("missing_depexts[{i}]");
                check_text(&field, name, "", limits::MAX_NAME_VERSION_BYTES)?;
                if name.trim().is_empty() || name.contains(char::is_whitespace) {
                    return Err(FieldError::at(
                        &field,
                        format_args!("{name:?} is not a system package name"),
                    ));
                }
            }
        }
        if s.repo.trim().is_empty() {
            return Err(FieldError::at(
                "repo",
                "is empty: give the repository path on the agents, PATH[:REV]",
            ));
        }
        if s.shard_size == 0 {
            return Err(FieldError::at("shard_size", "must be at least 1"));
        }
        if s.cost == 0 || s.cost > 1024 {
            return Err(FieldError::at("cost", "must be between 1 and 1024"));
        }
        Ok(ValidRevdeps {
            spec: RunSpec {
                variant: s.variant(),
                target: s.target,
                repo: s.repo,
                query: s.query,
                priority: s.priority,
                cost: s.cost,
                submitter: String::new(),
                owner: None,
            },
            shard_size: s.shard_size,
        })
    }
}

/// Records a run and queues its plan job, in one transaction.
/// Its jobs are accounted to `submitter` and belong to the token `owner`.
pub async fn submit(
    db: &PgPool,
    run: ValidRevdeps,
    submitter: &str,
    owner: Option<Uuid>,
    waiting_cap: Option<crate::queue::submit::WaitingCap<'_>>,
) -> Result<Result<Uuid, WaitingCapExceeded>, sqlx::Error> {
    let run_id = Uuid::new_v4();
    let spec = RunSpec {
        submitter: submitter.to_string(),
        owner,
        ..run.spec
    };
    let mut tx = db.begin().await?;
    if let Err(over) = within_waiting_cap(&mut tx, submitter, 1, waiting_cap).await? {
        return Ok(Err(over));
    }
    let plan = submit_in(&mut tx, &[spec.job(run_id, RevdepsStep::Plan)]).await?[0];
    sqlx::query(
        "INSERT INTO revdeps_runs (id, target, repo, variant, query, shard_size, priority,
                                   submitter, plan_job)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(run_id)
    .bind(&spec.target)
    .bind(&spec.repo)
    .bind(serde_json::to_value(&spec.variant).expect("variant serialises"))
    .bind(spec.query.as_str())
    .bind(run.shard_size as i32)
    .bind(spec.priority)
    .bind(submitter)
    .bind(plan)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Ok(run_id))
}

#[derive(sqlx::FromRow)]
struct RunRow {
    id: Uuid,
    state: String,
    target: String,
    repo: String,
    query: String,
    variant: serde_json::Value,
    plan_job: Uuid,
    candidates: Option<i32>,
    shards: Option<i32>,
    result: Option<serde_json::Value>,
    timings: Option<serde_json::Value>,
    error: Option<String>,
    created_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
}

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
        id: r.id,
        state: r.state.parse().map_err(|e| column_error("state", e))?,
        target: r.target,
        repo: r.repo,
        query: r.query.parse().map_err(|e| column_error("query", e))?,
        variant: serde_json::from_value(r.variant).map_err(|e| column_error("variant", e))?,
        plan_job: r.plan_job,
        candidates: r.candidates,
        shards: r.shards,
        shards_done,
        result: r.result.and_then(|v| serde_json::from_value(v).ok()),
        timings: r
            .timings
            .map(serde_json::from_value::<RunTimings>)
            .transpose()
            .map_err(|e| column_error("timings", e))?,
        error: r.error,
        created_at: r.created_at,
        finished_at: r.finished_at,
    }))
}
