//! `/api/v1/revdeps`: submit an opam reverse-dependency run, read its state
//! and result.

use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use flotilla_core::api::revdeps::{RunList, RunSummary, RunView, SubmitRevdeps, MAX_RUN_PAGE};
use flotilla_core::api::Created;
use serde::Deserialize;

use super::created;
use super::openapi::Errors;
use crate::auth::ClientAuth;
use crate::error::{ApiError, ApiResult};
use crate::extract::{parse_id, JsonBody, PathParams, QueryParams};
use crate::revdeps::{self, ValidRevdeps};
use crate::state::AppState;

/// Starts a run: phase 1 (the plan) is queued at once.
#[utoipa::path(
    post,
    path = "/api/v1/revdeps",
    tag = "revdeps",
    request_body = SubmitRevdeps,
    responses(
        (status = 201, description = "The run's id", body = Created),
        (status = 429, description = "The submitter has as many jobs waiting as one may (`--max-waiting-per-submitter`)", body = flotilla_core::api::ErrorBody),
        Errors
    )
)]
pub async fn submit(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    JsonBody(body): JsonBody<SubmitRevdeps>,
) -> ApiResult<impl IntoResponse> {
    let run = ValidRevdeps::try_from(body)?;
    let cap = state.waiting_cap(caller.role);
    // Its first job: a remembered refusal answers before any database work.
    crate::queue::submit::recalled_refusal(cap, &caller.submitter(), 1)?;
    let id = revdeps::submit(
        &state.db,
        run,
        &caller.submitter(),
        Some(caller.token_id),
        cap,
    )
    .await??;
    Ok(created(Created { id }))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// The cursor: the `next` of the previous page (its last run's id).
    before: Option<uuid::Uuid>,
    /// Runs per page, default 50; a value outside 1 to
    /// 200 is taken as the nearer end.
    limit: Option<u32>,
}

/// Runs newest first, a page at a time.
#[utoipa::path(
    get,
    path = "/api/v1/revdeps",
    tag = "revdeps",
    params(ListQuery),
    responses((status = 200, description = "A page of runs", body = RunList), Errors)
)]
pub async fn list(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
    QueryParams(q): QueryParams<ListQuery>,
) -> ApiResult<Json<RunList>> {
    let limit = q.limit.unwrap_or(50).clamp(1, MAX_RUN_PAGE);
    let page = revdeps::read::list(&state.db, q.before, limit).await?;
    let runs = page
        .runs
        .into_iter()
        .map(|r| RunSummary {
            id: r.id,
            state: r.state,
            target: r.target,
            compiler: r.compiler,
            query: r.query,
            candidates: r.candidates,
            shards: r.shards,
            shards_done: r.shards_done,
            answer_len: r.answer_len,
            submitter: r.submitter,
            created_at: r.created_at,
            finished_at: r.finished_at,
        })
        .collect();
    Ok(Json(RunList {
        runs,
        next: page.next,
    }))
}

/// A run: its state, progress, timings and, once done, its answer.
#[utoipa::path(
    get,
    path = "/api/v1/revdeps/{id}",
    tag = "revdeps",
    params(("id" = uuid::Uuid, Path, description = "The run's id")),
    responses((status = 200, description = "The run", body = RunView), Errors)
)]
pub async fn show(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<RunView>> {
    let id = parse_id(&id, "a revdeps run")?;
    revdeps::get(&state.db, id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no revdeps run {id}")))
}
