//! `/api/v1/jobs`: submit, show, list, cancel (the log: [`super::logs`]).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use flotilla_core::api::{
    CancelReply, Created, FieldError, JobList, JobView, SubmitJob, TokenRole,
};
use flotilla_core::job::{
    check_env, check_labels, check_name, check_output_path, limits, JobSpec, JobState,
};
use serde::Deserialize;
use uuid::Uuid;

use super::created;
use crate::auth::{Caller, ClientAuth};
use crate::error::{ApiError, ApiResult};
use crate::extract::{parse_id, JsonBody, QueryParams};
use crate::queue::cancel::{self, Cancelled};
use crate::queue::submit::NewJob;
use crate::queue::{classes, read, submit};
use crate::state::AppState;

pub async fn submit(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    JsonBody(body): JsonBody<SubmitJob>,
) -> ApiResult<impl IntoResponse> {
    let job = ValidJob::try_from(body)?.into_new_job(&caller)?;
    if let Some(refused) = classes::refusal(&state.db, &job).await? {
        return Err(refused.into());
    }
    let ids = submit::submit(&state.db, &[job]).await?;
    Ok(created(Created { id: ids[0] }))
}

/// A submission whose fields have been checked; the submitter still
/// defaults to the caller.
pub struct ValidJob {
    job: NewJob,
    submitter: Option<String>,
}

impl ValidJob {
    /// The job to insert, owned by the caller and accounted to the
    /// caller's submitter name. Only an admin may account it to another
    /// (fair share is per submitter: a client naming itself anew for each
    /// job would get ahead of everyone).
    pub fn into_new_job(self, caller: &Caller) -> Result<NewJob, ApiError> {
        let submitter = match self.submitter {
            Some(s) if caller.role == TokenRole::Admin => s,
            Some(_) => {
                return Err(ApiError::Forbidden(
                    "only an admin token may set `submitter`; leave it out and the job is \
                     accounted to this token"
                        .into(),
                ))
            }
            None => caller.submitter(),
        };
        Ok(NewJob {
            submitter,
            owner: Some(caller.token_id),
            ..self.job
        })
    }
}

impl TryFrom<SubmitJob> for ValidJob {
    type Error = FieldError;

    /// Checks every field of a submission, naming the first that is wrong.
    fn try_from(body: SubmitJob) -> Result<Self, FieldError> {
        match &body.spec {
            JobSpec::Revdeps(_) => {
                return Err(FieldError::new(
                    "kind",
                    "revdeps jobs are made by the server: submit a run with POST /api/v1/revdeps",
                ))
            }
            JobSpec::Tile(_) => {
                return Err(FieldError::new(
                    "kind",
                    "tile jobs are made by the server: submit a region with POST /api/v1/rois",
                ))
            }
            JobSpec::Step(_) => {
                return Err(FieldError::new(
                    "kind",
                    "step jobs are made by the server: run a pipeline with POST /api/v1/pipelines",
                ))
            }
            JobSpec::Command(c) => {
                if c.command.trim().is_empty() {
                    return Err(FieldError::at("command", "is empty"));
                }
                if c.command.len() > limits::MAX_COMMAND_BYTES {
                    return Err(FieldError::at(
                        "command",
                        format_args!("is longer than {} bytes", limits::MAX_COMMAND_BYTES),
                    ));
                }
                if c.command.contains('\0') {
                    return Err(FieldError::at("command", "contains a NUL byte"));
                }
                if let Some(w) = &c.workdir {
                    if w.len() > limits::MAX_PATH_BYTES {
                        return Err(FieldError::at(
                            "workdir",
                            format_args!("is longer than {} bytes", limits::MAX_PATH_BYTES),
                        ));
                    }
                    if w.contains('\0') {
                        return Err(FieldError::at("workdir", "contains a NUL byte"));
                    }
                }
                if let Some(t) = c.timeout_s {
                    if t == 0 || t > limits::MAX_TIMEOUT_S {
                        return Err(FieldError::at(
                            "timeout_s",
                            format_args!("must be between 1 and {}", limits::MAX_TIMEOUT_S),
                        ));
                    }
                }
                if c.outputs.len() > limits::MAX_OUTPUTS {
                    return Err(FieldError::at(
                        "outputs",
                        format_args!("lists more than {} files", limits::MAX_OUTPUTS),
                    ));
                }
                for (i, o) in c.outputs.iter().enumerate() {
                    check_output_path(o)
                        .map_err(|why| FieldError::at(format!("outputs[{i}]"), why))?;
                }
                check_env(&c.env)?;
                if let Some(name) = c.secret_env.iter().find(|n| !c.env.contains_key(*n)) {
                    return Err(FieldError::at(
                        "secret_env",
                        format_args!("names `{name}`, which is not in `env`"),
                    ));
                }
            }
        }
        if !(1..=limits::MAX_ATTEMPTS).contains(&body.max_attempts) {
            return Err(FieldError::at(
                "max_attempts",
                format_args!("must be between 1 and {}", limits::MAX_ATTEMPTS),
            ));
        }
        if !limits::PRIORITY_RANGE.contains(&body.priority) {
            return Err(FieldError::at("priority", "must be between -1000 and 1000"));
        }
        if body.cost == 0 || body.cost > limits::MAX_COST {
            return Err(FieldError::at(
                "cost",
                format_args!("must be between 1 and {} slots", limits::MAX_COST),
            ));
        }
        check_labels(&body.labels)?;
        if let Some(s) = &body.submitter {
            check_name("submitter", s)?;
        }
        Ok(ValidJob {
            submitter: body.submitter,
            job: NewJob {
                spec: body.spec,
                labels: body.labels,
                priority: body.priority,
                max_attempts: body.max_attempts,
                cost: body.cost,
                submitter: String::new(),
                parent_id: None,
                child_index: None,
                owner: None,
            },
        })
    }
}

/// Refuses unless `caller` may read and cancel job `id`: an admin, or the
/// token the job belongs to. 404 if there is no such job.
pub(crate) async fn check_owner(state: &AppState, caller: &Caller, id: Uuid) -> ApiResult<()> {
    let owner = read::owner(&state.db, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no job {id}")))?;
    if caller.role == TokenRole::Admin || owner == Some(caller.token_id) {
        return Ok(());
    }
    Err(ApiError::Forbidden(format!(
        "job {id} belongs to another token; a client sees only its own jobs (admins all)"
    )))
}

pub async fn show(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    Path(id): Path<String>,
) -> ApiResult<Json<JobView>> {
    let id = parse_id(&id)?;
    check_owner(&state, &caller, id).await?;
    read::get(&state.db, id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no job {id}")))
}

#[derive(Deserialize)]
pub struct ListQuery {
    state: Option<String>,
    limit: Option<i64>,
}

/// The newest jobs: all of them for an admin, a client's own otherwise.
pub async fn list(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    QueryParams(q): QueryParams<ListQuery>,
) -> ApiResult<Json<JobList>> {
    let st = match q.state.as_deref() {
        None | Some("") => None,
        Some(s) => Some(
            s.parse::<JobState>()
                .map_err(|e| ApiError::BadRequest(e.to_string()))?,
        ),
    };
    let limit = q.limit.unwrap_or(100).clamp(1, 10_000);
    Ok(Json(JobList {
        jobs: read::list(&state.db, st, own_only(&caller), limit).await?,
    }))
}

/// The owner a client's lists are limited to (`None` for an admin: all).
fn own_only(caller: &Caller) -> Option<Uuid> {
    (caller.role != TokenRole::Admin).then_some(caller.token_id)
}

pub async fn cancel(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let id = parse_id(&id)?;
    check_owner(&state, &caller, id).await?;
    let (status, msg) = match cancel::cancel(&state.db, id).await? {
        Cancelled::Now => (StatusCode::OK, "cancelled".to_string()),
        Cancelled::Requested => (
            StatusCode::ACCEPTED,
            "cancel requested; the agent stops the job at its next heartbeat".to_string(),
        ),
        Cancelled::AlreadyFinal(s) => {
            return Err(ApiError::Conflict(format!(
                "job {id} already finished: {s}"
            )))
        }
        Cancelled::NotFound => return Err(ApiError::NotFound(format!("no job {id}"))),
    };
    Ok((status, Json(CancelReply { id, status: msg })))
}
