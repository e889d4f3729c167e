//! `/api/v1/pipelines`: run a pipeline file, list runs, read one run's item
//! × step matrix, cancel a run. A client sees and cancels its own runs,
//! admins all.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use flotilla_core::api::pipelines::{
    PipelineList, PipelineView, SubmitPipeline, MAX_PIPELINE_PAGE,
};
use flotilla_core::api::{CancelReply, Created};
use serde::Deserialize;
use uuid::Uuid;

use super::created;
use super::openapi::Errors;
use crate::auth::{Caller, ClientAuth};
use crate::error::{ApiError, ApiResult};
use crate::extract::{parse_id, JsonBody, PathParams, QueryParams};
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

/// Runs a pipeline file: parsed and checked first (a mistake is a 422 with
/// each error's line and column in `detail.errors`).
#[utoipa::path(
    post,
    path = "/api/v1/pipelines",
    tag = "pipelines",
    request_body = SubmitPipeline,
    responses(
        (status = 201, description = "The run's id", body = Created),
        (status = 409, description = "A run of the same file is still open", body = flotilla_core::api::ErrorBody),
        (status = 429, description = "The submitter has as many jobs waiting as one may (`--max-waiting-per-submitter`)", body = flotilla_core::api::ErrorBody),
        Errors
    )
)]
pub async fn submit(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    JsonBody(body): JsonBody<SubmitPipeline>,
) -> ApiResult<impl IntoResponse> {
    let run = ValidPipeline::try_from(body)?;
    // A pipeline queues its first job: a remembered refusal answers before
    // any database work.
    let cap = state.waiting_cap(caller.role);
    crate::queue::submit::recalled_refusal(cap, &caller.submitter(), 1)?;
    if let Some(errors) = pipelines::unknown_agents(&state.db, &run).await? {
        return Err(Refused::File(errors).into());
    }
    let id = match pipelines::submit(
        &state.db,
        run,
        &caller.submitter(),
        Some(caller.token_id),
        cap,
    )
    .await?
    {
        Ok(id) => id,
        Err(pipelines::NotSubmitted::WaitingCap(over)) => return Err(over.into()),
        Err(pipelines::NotSubmitted::OpenRun(open)) => {
            return Err(ApiError::Conflict(format!(
                "run {open} of this same file is still open; two runs would write the same \
                 outputs. Follow it (`flotilla pipeline status {open}`) or cancel it first \
                 (`flotilla pipeline cancel {open}`); a new run after it resumes where it stopped"
            )))
        }
    };
    state.parents_signal.wake(id);
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

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// The cursor: the `next` of the previous page (its last run's id).
    before: Option<Uuid>,
    /// Runs per page, default 100; a value outside 1 to
    /// 1000 is taken as the nearer end.
    limit: Option<u32>,
}

/// Runs newest first, a page at a time: a client's own, all for an admin.
#[utoipa::path(
    get,
    path = "/api/v1/pipelines",
    tag = "pipelines",
    params(ListQuery),
    responses((status = 200, description = "A page of runs", body = PipelineList), Errors)
)]
pub async fn list(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    QueryParams(q): QueryParams<ListQuery>,
) -> ApiResult<Json<PipelineList>> {
    let own = (caller.role != TokenRole::Admin).then_some(caller.token_id);
    let limit = q.limit.unwrap_or(100).clamp(1, MAX_PIPELINE_PAGE);
    // One more than asked: whether there is a next page.
    let mut runs = read::list(&state.db, own, q.before, limit + 1).await?;
    let next = super::next_page(&mut runs, limit, |r| r.id);
    Ok(Json(PipelineList { runs, next }))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ShowQuery {
    /// The index of the last item of the previous page (its `next_after`).
    after: Option<u64>,
    /// Items per page, default 1000; a value outside 1 to
    /// 10,000 is taken as the nearer end.
    limit: Option<u32>,
}

/// A run with its step columns, gates and a page of item rows.
#[utoipa::path(
    get,
    path = "/api/v1/pipelines/{id}",
    tag = "pipelines",
    params(("id" = Uuid, Path, description = "The run's id"), ShowQuery),
    responses((status = 200, description = "The run", body = PipelineView), Errors)
)]
pub async fn show(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    PathParams(id): PathParams<String>,
    QueryParams(q): QueryParams<ShowQuery>,
) -> ApiResult<Json<PipelineView>> {
    let id = parse_id(&id, "a pipeline run")?;
    check_owner(&state, &caller, id).await?;
    let limit = q.limit.unwrap_or(1000).clamp(1, 10_000);
    read::get(&state.db, id, q.after, limit)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no pipeline run {id}")))
}

/// Cancels a run: its items, gates and open jobs.
#[utoipa::path(
    post,
    path = "/api/v1/pipelines/{id}/cancel",
    tag = "pipelines",
    params(("id" = Uuid, Path, description = "The run's id")),
    responses(
        (status = 202, description = "Cancelled; running jobs stop at their next heartbeat", body = CancelReply),
        (status = 409, description = "The run already finished", body = flotilla_core::api::ErrorBody),
        Errors
    )
)]
pub async fn cancel(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    PathParams(id): PathParams<String>,
) -> ApiResult<impl IntoResponse> {
    let id = parse_id(&id, "a pipeline run")?;
    check_owner(&state, &caller, id).await?;
    let done = pipelines::cancel(&state.db, id).await?;
    state.parents_signal.wake(id);
    cancel_reply(id, done, None)
}

/// `POST /api/v1/pipelines/{id}/items/{item}/cancel`: one item.
#[utoipa::path(
    post,
    path = "/api/v1/pipelines/{id}/items/{item}/cancel",
    tag = "pipelines",
    params(
        ("id" = Uuid, Path, description = "The run's id"),
        ("item" = String, Path, description = "The item's id"),
    ),
    responses(
        (status = 202, description = "Cancelled; its running job stops at its next heartbeat", body = CancelReply),
        (status = 409, description = "The item already finished", body = flotilla_core::api::ErrorBody),
        Errors
    )
)]
pub async fn cancel_item(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    PathParams((id, item)): PathParams<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    let id = parse_id(&id, "a pipeline run")?;
    check_owner(&state, &caller, id).await?;
    let done = pipelines::cancel_item(&state.db, id, &item).await?;
    state.parents_signal.wake(id);
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
