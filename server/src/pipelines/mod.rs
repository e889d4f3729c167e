//! Pipeline runs: owns `pipeline_runs`, `pipeline_items`, `pipeline_steps`
//! and `pipeline_gates`. A run is its checked pipeline file, the job that
//! lists its items and, per item, the step it is at; stage and move jobs
//! are ordinary queue jobs whose parent is the run.
//!
//! - here: a submission parsed and checked, recorded with its listing job;
//!   a cancel; where a step's job runs ([`placement`]).
//! - [`engine`]: what happens when a run's jobs end: items listed, items
//!   moved on through stages, moves, limit gates and either branches.
//! - [`jobs`]: the job of one item at one step, its commands expanded.
//! - [`resume`]: outputs a run of the same file left, looked for on the
//!   hosts, so each item starts after the furthest that exists.
//! - [`read`]: runs as the API and dashboard show them.

pub mod engine;
pub mod jobs;
pub mod read;
pub mod resume;

use std::collections::BTreeMap;

use flotilla_core::api::pipelines::{SubmitPipeline, MAX_PIPELINE_BYTES};
use flotilla_core::api::FieldError;
use flotilla_core::job::{check_text, limits, StepAction, StepHost, AGENT_NAME_LABEL, SSH_LABEL};
use flotilla_core::pipeline::spec::HostTarget;
use flotilla_core::pipeline::{self, PipelineSpec};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::queue::cancel;
use crate::queue::submit::{submit_in, within_waiting_cap, WaitingCapExceeded};

/// A submission whose file parsed and passed its checks.
#[derive(Debug, Clone)]
pub struct ValidPipeline {
    pub name: String,
    pub source: String,
    pub spec: PipelineSpec,
    pub priority: i32,
}

/// Why a submission was refused: a field, or the file's own mistakes.
#[derive(Debug)]
pub enum Refused {
    Field(FieldError),
    /// Every mistake, each with its file, line and column.
    File(pipeline::PipelineErrors),
}

impl TryFrom<SubmitPipeline> for ValidPipeline {
    type Error = Refused;

    fn try_from(s: SubmitPipeline) -> Result<Self, Refused> {
        check_text("name", &s.name, "", limits::MAX_NAME_BYTES).map_err(Refused::Field)?;
        if s.name.trim().is_empty() {
            return Err(Refused::Field(FieldError::at(
                "name",
                "is empty: give the file's name",
            )));
        }
        if s.source.len() > MAX_PIPELINE_BYTES {
            return Err(Refused::Field(FieldError::at(
                "source",
                format_args!("is longer than {MAX_PIPELINE_BYTES} bytes"),
            )));
        }
        if !limits::PRIORITY_RANGE.contains(&s.priority) {
            return Err(Refused::Field(FieldError::at(
                "priority",
                format_args!(
                    "must be between {} and {}",
                    limits::PRIORITY_RANGE.start(),
                    limits::PRIORITY_RANGE.end()
                ),
            )));
        }
        let spec = pipeline::load(&s.name, &s.source).map_err(Refused::File)?;
        Ok(ValidPipeline {
            name: s.name,
            source: s.source,
            spec,
            priority: s.priority,
        })
    }
}

/// Where an output is: a host of the pipeline, the agent it is on when the
/// host is a set of agents (or an agent), and its path there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Location {
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    pub path: String,
}

/// How a job for `host` is queued: where its commands run and the labels
/// that take it to the right agent. `pin` is the agent an item's output is
/// on, which a host of several agents (labels) must keep to.
pub fn placement(
    spec: &PipelineSpec,
    host: &str,
    pin: Option<&str>,
) -> (StepHost, BTreeMap<String, String>) {
    let mut labels = BTreeMap::new();
    // `check` made sure every host a step names is declared.
    let Some(decl) = spec.hosts.get(host) else {
        return (StepHost::Local, labels);
    };
    match &decl.target {
        HostTarget::Agent { name } => {
            labels.insert(AGENT_NAME_LABEL.to_string(), name.clone());
            (StepHost::Local, labels)
        }
        HostTarget::Labels { labels: wanted } => {
            labels.extend(wanted.clone());
            if let Some(agent) = pin {
                labels.insert(AGENT_NAME_LABEL.to_string(), agent.to_string());
            }
            (StepHost::Local, labels)
        }
        HostTarget::Ssh(target) => {
            labels.insert(SSH_LABEL.0.to_string(), SSH_LABEL.1.to_string());
            if let Some(via) = &target.via {
                labels.insert(AGENT_NAME_LABEL.to_string(), via.clone());
            }
            (StepHost::Ssh(target.clone()), labels)
        }
    }
}

/// Whether outputs on `host` are on one particular agent, which later steps
/// there must keep to (a host of several agents).
pub fn host_is_a_set(spec: &PipelineSpec, host: &str) -> bool {
    matches!(
        spec.hosts.get(host).map(|h| &h.target),
        Some(HostTarget::Labels { .. })
    )
}

/// The file's mistakes about this fleet: a host that names an agent (or an
/// ssh host's `via`) no agent has registered as. Every step would wait
/// forever for it, so it is refused like a syntax error, with its line.
/// A fleet where no agent has registered yet takes the run (its agents may
/// be starting, as under `flotilla up`), as the queue does for jobs.
pub async fn unknown_agents(
    db: &PgPool,
    run: &ValidPipeline,
) -> Result<Option<pipeline::PipelineErrors>, sqlx::Error> {
    let named: Vec<(&str, &pipeline::spec::HostDecl)> = run
        .spec
        .hosts
        .values()
        .filter_map(|h| match &h.target {
            HostTarget::Agent { name } => Some((name.as_str(), h)),
            HostTarget::Ssh(t) => t.via.as_deref().map(|v| (v, h)),
            HostTarget::Labels { .. } => None,
        })
        .collect();
    if named.is_empty() {
        return Ok(None);
    }
    let names: Vec<&str> = named.iter().map(|(n, _)| *n).collect();
    // One statement, so one snapshot: asked in two, an agent registering
    // between them made a fleet that had none yet refuse the agent's own
    // name as never registered.
    let (known, any): (Vec<String>, bool) = sqlx::query_as(
        "SELECT COALESCE((SELECT array_agg(name) FROM agents WHERE name = ANY ($1)), '{}'),
                EXISTS (SELECT 1 FROM agents)",
    )
    .bind(&names)
    .fetch_one(db)
    .await?;
    if known.is_empty() && !any {
        return Ok(None);
    }
    let mut errors: Vec<pipeline::PipelineError> = named
        .into_iter()
        .filter(|(n, _)| !known.iter().any(|k| k == n))
        .map(|(n, h)| pipeline::PipelineError {
            file: run.name.clone(),
            span: h.span,
            message: format!(
                "host `{}` names agent `{n}`, which has never registered with this server \
                 (`flotilla agents` lists those that have)",
                h.name
            ),
            line_text: run
                .source
                .lines()
                .nth(h.span.line.saturating_sub(1) as usize)
                .unwrap_or_default()
                .to_string(),
        })
        .collect();
    errors.sort_by_key(|e| e.span);
    Ok((!errors.is_empty()).then_some(pipeline::PipelineErrors(errors)))
}

/// An open run of the same file (the same text), which a new run would
/// race: the same outputs, the same temporary paths.
async fn open_run_of(tx: &mut PgConnection, source: &str) -> Result<Option<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM pipeline_runs
         WHERE state IN ('listing', 'probing', 'running') AND source = $1
         ORDER BY created_at LIMIT 1",
    )
    .bind(source)
    .fetch_optional(tx)
    .await
}

/// Why [`submit`] recorded no run.
#[derive(Debug)]
pub enum NotSubmitted {
    WaitingCap(WaitingCapExceeded),
    /// A run of the same file is still open (its id).
    OpenRun(Uuid),
}

/// Records a run and queues its listing job, in one transaction, unless a
/// run of the same file is open. Its jobs are accounted to `submitter` and
/// belong to the token `owner`.
pub async fn submit(
    db: &PgPool,
    run: ValidPipeline,
    submitter: &str,
    owner: Option<Uuid>,
    waiting_cap: Option<crate::queue::submit::WaitingCap<'_>>,
) -> Result<Result<Uuid, NotSubmitted>, sqlx::Error> {
    let run_id = Uuid::new_v4();
    let (host, labels) = placement(&run.spec, &run.spec.items.host, None);
    let list = jobs::queued(
        run.priority,
        submitter,
        owner,
        flotilla_core::job::StepJob {
            run_id,
            item: String::new(),
            step: "items".into(),
            host,
            action: StepAction::List {
                command: run.spec.items.command.clone(),
            },
            timeout_s: None,
        },
        labels,
        3,
    );
    let mut tx = db.begin().await?;
    // Submissions of one file, to any server, one at a time, each seeing
    // the run the last recorded: two at once both found none open and both
    // ran, each clearing the other's temporary outputs.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('flotilla-pipeline-source:' || md5($1)))")
        .bind(&run.source)
        .execute(&mut *tx)
        .await?;
    if let Some(open) = open_run_of(&mut tx, &run.source).await? {
        return Ok(Err(NotSubmitted::OpenRun(open)));
    }
    if let Err(over) = within_waiting_cap(&mut tx, submitter, 1, waiting_cap).await? {
        return Ok(Err(NotSubmitted::WaitingCap(over)));
    }
    let list_job = submit_in(&mut tx, &[list]).await?[0];
    sqlx::query(
        "INSERT INTO pipeline_runs (id, name, source, spec, list_job, priority, submitter,
                                    owner_token)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(run_id)
    .bind(&run.name)
    .bind(&run.source)
    .bind(serde_json::to_value(&run.spec).expect("a pipeline spec serialises"))
    .bind(list_job)
    .bind(run.priority)
    .bind(submitter)
    .bind(owner)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Ok(run_id))
}

/// What a cancel found.
#[derive(Debug, PartialEq, Eq)]
pub enum RunCancel {
    /// Its open items are cancelled and their jobs told to stop.
    Cancelled {
        jobs: usize,
    },
    AlreadyFinal(String),
    NotFound,
}

/// Cancels item `item` of run `id`: it ends `cancelled`, leaves its gates,
/// and its job, if one is running, is stopped (its whole process tree, over
/// ssh too). The other items go on.
pub async fn cancel_item(db: &PgPool, id: Uuid, item: &str) -> Result<RunCancel, sqlx::Error> {
    let mut tx = db.begin().await?;
    let run: Option<String> =
        sqlx::query_scalar("SELECT state FROM pipeline_runs WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
    if run.is_none() {
        return Ok(RunCancel::NotFound);
    }
    let row: Option<(i32, String, Option<Uuid>)> = sqlx::query_as(
        "SELECT idx, state, job_id FROM pipeline_items WHERE run_id = $1 AND item = $2",
    )
    .bind(id)
    .bind(item)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((idx, state, job)) = row else {
        return Ok(RunCancel::NotFound);
    };
    if !matches!(state.as_str(), "waiting" | "active") {
        return Ok(RunCancel::AlreadyFinal(state));
    }
    sqlx::query(
        "UPDATE pipeline_items SET state = 'cancelled', error = 'cancelled', job_id = NULL
         WHERE run_id = $1 AND idx = $2",
    )
    .bind(id)
    .bind(idx)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE pipeline_steps SET state = 'cancelled', finished_at = now()
         WHERE run_id = $1 AND idx = $2 AND state = 'running'",
    )
    .bind(id)
    .bind(idx)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM pipeline_gates WHERE run_id = $1 AND idx = $2")
        .bind(id)
        .bind(idx)
        .execute(&mut *tx)
        .await?;
    let mut jobs = 0;
    if let Some(job) = job {
        if cancel::cancel_in(&mut tx, job).await?.is_some() {
            jobs = 1;
        }
    }
    tx.commit().await?;
    Ok(RunCancel::Cancelled { jobs })
}

/// Cancels run `id`: its open items end `cancelled`, their gates are freed,
/// and every job of it that has not ended is cancelled (a running one is
/// stopped by its agent, its whole process tree, over ssh too).
pub async fn cancel(db: &PgPool, id: Uuid) -> Result<RunCancel, sqlx::Error> {
    close(db, id, Closing::Cancelled).await
}

/// How a run is ended from outside its normal course.
#[derive(Debug, Clone, Copy)]
pub enum Closing<'a> {
    /// By its owner or an admin.
    Cancelled,
    /// By the engine, which could not advance it (the reason).
    Failed(&'a str),
}

/// Ends run `id` in the state `how` says: its open items with it, its gates
/// freed, and every job of it that has not ended cancelled (a running one
/// is stopped by its agent, its whole process tree, over ssh too), so
/// nothing of a closed run goes on running.
pub async fn close(db: &PgPool, id: Uuid, how: Closing<'_>) -> Result<RunCancel, sqlx::Error> {
    let (state, why) = match how {
        Closing::Cancelled => ("cancelled", "cancelled"),
        Closing::Failed(why) => ("failed", why),
    };
    let mut tx = db.begin().await?;
    let now: Option<String> =
        sqlx::query_scalar("SELECT state FROM pipeline_runs WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
    match now.as_deref() {
        None => return Ok(RunCancel::NotFound),
        Some(s @ ("done" | "failed" | "cancelled")) => {
            return Ok(RunCancel::AlreadyFinal(s.to_string()))
        }
        Some(_) => {}
    }
    let jobs = end_run(&mut tx, id, state, why).await? as usize;
    tx.commit().await?;
    Ok(RunCancel::Cancelled { jobs })
}

/// Ends run `id` as `state` ("failed" or "cancelled") with `why`, inside
/// the caller's transaction, which holds the run's row: its open items and
/// running steps with it, its gates freed, and every job of it that has not
/// ended cancelled in the same transaction (a run recorded closed with its
/// jobs still queued, a crash between two transactions, would have them
/// run). How many jobs were cancelled or asked to stop.
pub(super) async fn end_run(
    tx: &mut PgConnection,
    id: Uuid,
    state: &str,
    why: &str,
) -> Result<u64, sqlx::Error> {
    sqlx::query(
        "UPDATE pipeline_runs SET state = $2, finished_at = now(), error = $3 WHERE id = $1",
    )
    .bind(id)
    .bind(state)
    .bind(why)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE pipeline_items SET state = $2, error = COALESCE(error, $3)
         WHERE run_id = $1 AND state IN ('waiting', 'active')",
    )
    .bind(id)
    .bind(state)
    .bind(why)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE pipeline_steps SET state = $2, finished_at = now()
         WHERE run_id = $1 AND state = 'running'",
    )
    .bind(id)
    .bind(state)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM pipeline_gates WHERE run_id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    cancel::cancel_run_jobs(tx, id).await
}
