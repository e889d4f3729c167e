//! `/api/v1/jobs`: submit, show, list, log, cancel.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use flotilla_core::api::{Created, JobList, JobView, SubmitJob};
use flotilla_core::job::{check_output_path, limits, JobSpec, JobState};
use serde::Deserialize;

use super::body::JsonBody;
use super::{created, parse_id};
use crate::auth::{Caller, ClientAuth};
use crate::error::{ApiError, ApiResult};
use crate::queue::read::Cancelled;
use crate::queue::submit::NewJob;
use crate::queue::{read, submit};
use crate::state::AppState;

pub async fn submit(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    JsonBody(body): JsonBody<SubmitJob>,
) -> ApiResult<impl IntoResponse> {
    let job = validate(body, &caller)?;
    let ids = submit::submit(&state.db, &[job]).await?;
    Ok(created(Created { id: ids[0] }))
}

fn invalid(field: &str, what: impl std::fmt::Display) -> ApiError {
    ApiError::Invalid {
        message: format!("`{field}` {what}"),
        detail: Some(serde_json::json!({ "path": field })),
    }
}

/// Turns a submission into a job to insert, or says which field is wrong.
pub fn validate(body: SubmitJob, caller: &Caller) -> ApiResult<NewJob> {
    match &body.spec {
        JobSpec::Revdeps(_) => {
            return Err(ApiError::invalid(
                "revdeps jobs are made by the server: submit a run with POST /api/v1/revdeps",
            ))
        }
        JobSpec::Tile(_) => {
            return Err(ApiError::invalid(
                "tile jobs are made by the server: submit a region with POST /api/v1/rois",
            ))
        }
        JobSpec::Command(c) => {
            if c.command.trim().is_empty() {
                return Err(invalid("command", "is empty"));
            }
            if c.command.len() > limits::MAX_COMMAND_BYTES {
                return Err(invalid(
                    "command",
                    format_args!("is longer than {} bytes", limits::MAX_COMMAND_BYTES),
                ));
            }
            if c.command.contains('\0') {
                return Err(invalid("command", "contains a NUL byte"));
            }
            if let Some(t) = c.timeout_s {
                if t == 0 || t > limits::MAX_TIMEOUT_S {
                    return Err(invalid(
                        "timeout_s",
                        format_args!("must be between 1 and {}", limits::MAX_TIMEOUT_S),
                    ));
                }
            }
            if c.outputs.len() > limits::MAX_OUTPUTS {
                return Err(invalid(
                    "outputs",
                    format_args!("lists more than {} files", limits::MAX_OUTPUTS),
                ));
            }
            for (i, o) in c.outputs.iter().enumerate() {
                check_output_path(o).map_err(|why| invalid(&format!("outputs[{i}]"), why))?;
            }
            for k in c.env.keys() {
                if k.is_empty() || k.contains('=') || k.contains('\0') {
                    return Err(invalid(
                        "env",
                        format_args!("has a bad variable name {k:?}"),
                    ));
                }
            }
        }
    }
    if !(1..=limits::MAX_ATTEMPTS).contains(&body.max_attempts) {
        return Err(invalid(
            "max_attempts",
            format_args!("must be between 1 and {}", limits::MAX_ATTEMPTS),
        ));
    }
    if !limits::PRIORITY_RANGE.contains(&body.priority) {
        return Err(invalid("priority", "must be between -1000 and 1000"));
    }
    if body.cost == 0 || body.cost > 1024 {
        return Err(invalid("cost", "must be between 1 and 1024 slots"));
    }
    if body.labels.len() > limits::MAX_LABELS || body.labels.keys().any(|k| k.is_empty()) {
        return Err(invalid("labels", "must be at most 64 non-empty keys"));
    }
    let submitter = match body.submitter {
        Some(s) if s.trim().is_empty() || s.len() > 200 => {
            return Err(invalid("submitter", "must be 1 to 200 characters"))
        }
        Some(s) => s,
        None => caller.submitter(),
    };
    Ok(NewJob {
        spec: body.spec,
        labels: body.labels,
        priority: body.priority,
        max_attempts: body.max_attempts,
        cost: body.cost,
        submitter,
        parent_id: None,
    })
}

pub async fn show(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
    Path(id): Path<String>,
) -> ApiResult<Json<JobView>> {
    let id = parse_id(&id)?;
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

pub async fn list(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
    Query(q): Query<ListQuery>,
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
        jobs: read::list(&state.db, st, limit).await?,
    }))
}

pub async fn log(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let id = parse_id(&id)?;
    if read::get(&state.db, id).await?.is_none() {
        return Err(ApiError::NotFound(format!("no job {id}")));
    }
    let (text, _) = read::log_text(&state.db, id, 0).await?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        text,
    ))
}

pub async fn cancel(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let id = parse_id(&id)?;
    let (status, msg) = match read::cancel(&state.db, id).await? {
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
    Ok((status, Json(serde_json::json!({ "id": id, "status": msg }))))
}
