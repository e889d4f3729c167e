//! `/api/v1/pipelines`: run a pipeline file, list runs, read one run's item
//! × step matrix, cancel a run. A client sees and cancels its own runs,
//! admins all.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use flotilla_core::api::pipelines::{PipelineSummary, PipelineView, SubmitPipeline};
use flotilla_core::api::{CancelReply, Created};
use serde::Deserialize;
use uuid::Uuid;

use super::created;
use crate::auth::{Caller, ClientAuth};
use crate::error::{ApiError, ApiResult};
use crate::extract::{parse_id, JsonBody, QueryParams};
use crate::pipelines::{self, read, Refused, RunCancel, ValidPipeline};
use crate::state::AppState;
use flotilla_core::api::TokenRole;

impl From<Refused> for ApiError {
    fn from(r: Refused) -> Self {
        match r {
            Refused::Field(e) => e.into(),
            Refused::File(errors) => ApiError::Invalid {
                message: errors.to_string(),
                detail: Some(serde_json::json!({
                    "path": "source",
                    "errors": errors.0.iter().map(|e| serde_json::json!({
                        "line": e.span.line,
                        "column": e.span.col,
                        "message": e.message,
                    })).collect::<Vec<_>>(),
                })),
            },
        }
    }
}

pub async fn submit(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    JsonBody(body): JsonBody<SubmitPipeline>,
) -> ApiResult<impl IntoResponse> {
    let run = ValidPipeline::try_from(body)?;
    if let Some(errors) = pipelines::unknown_agents(&state.db, &run).await? {
        return Err(Refused::File(errors).into());
    }
    if let Some(open) = pipelines::open_run_of(&state.db, &run.source).await? {
        return Err(ApiError::Conflict(format!(
            "run {open} of this same file is still open; two runs would write the same outputs. \
             Follow it (`flotilla pipeline status {open}`) or cancel it first \
             (`flotilla pipeline cancel {open}`); a new run after it resumes where it stopped"
        )));
    }
    let id = pipelines::submit(&state.db, run, &caller.submitter(), Some(caller.token_id)).await?;
    state.parents_signal.notify_one();
    Ok(created(Created { id }))
}

/// Refuses unless `caller` may see run `id`; 404 if there is none.
async fn check_owner(state: &AppState, caller: &Caller, id: Uuid) -> ApiResult<()> {
    let owner = read::owner(&state.db, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no pipeline run {id}")))?;
    if caller.role == TokenRole::Admin || owner == Some(caller.token_id) {
        return Ok(());
    }
    Err(ApiError::Forbidden(format!(
        "pipeline run {id} belongs to another token; a client sees only its own runs (admins all)"
    )))
}

#[derive(Deserialize)]
pub struct ListQuery {
    /// The last run of the previous page.
    before: Option<Uuid>,
    limit: Option<u32>,
}

pub async fn list(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    QueryParams(q): QueryParams<ListQuery>,
) -> ApiResult<Json<Vec<PipelineSummary>>> {
    let own = (caller.role != TokenRole::Admin).then_some(caller.token_id);
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    Ok(Json(read::list(&state.db, own, q.before, limit).await?))
}

#[derive(Deserialize)]
pub struct ShowQuery {
    /// The index of the last item of the previous page.
    after: Option<u64>,
    limit: Option<u32>,
}

pub async fn show(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<ShowQuery>,
) -> ApiResult<Json<PipelineView>> {
    let id = parse_id(&id)?;
    check_owner(&state, &caller, id).await?;
    let limit = q.limit.unwrap_or(1000).clamp(1, 10_000);
    read::get(&state.db, id, q.after, limit)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no pipeline run {id}")))
}

pub async fn cancel(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let id = parse_id(&id)?;
    check_owner(&state, &caller, id).await?;
    let done = pipelines::cancel(&state.db, id).await?;
    state.parents_signal.notify_one();
    cancel_reply(id, done, None)
}

/// `POST /api/v1/pipelines/{id}/items/{item}/cancel`: one item.
pub async fn cancel_item(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    Path((id, item)): Path<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    let id = parse_id(&id)?;
    check_owner(&state, &caller, id).await?;
    let done = pipelines::cancel_item(&state.db, id, &item).await?;
    state.parents_signal.notify_one();
    cancel_reply(id, done, Some(&item))
}

fn cancel_reply(
    id: Uuid,
    done: RunCancel,
    item: Option<&str>,
) -> ApiResult<(StatusCode, Json<CancelReply>)> {
    let what = match item {
        Some(item) => format!("item `{item}` of pipeline run {id}"),
        None => format!("pipeline run {id}"),
    };
    match done {
        RunCancel::Cancelled { jobs } => Ok((
            StatusCode::ACCEPTED,
            Json(CancelReply {
                id,
                status: format!(
                    "cancelled; {jobs} jobs told to stop (running ones stop at their agent's next heartbeat)"
                ),
            }),
        )),
        RunCancel::AlreadyFinal(s) => Err(ApiError::Conflict(format!(
            "{what} already finished: {s}"
        ))),
        RunCancel::NotFound => Err(ApiError::NotFound(format!("no {what}"))),
    }
}
