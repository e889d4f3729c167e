//! `/api/v1/rois`: plan and submit a region of interest for a year of a
//! dataset, list ROIs, and follow one's progress.

use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;

use flotilla_core::api::rois::{
    PlanCounts, RoiCreated, RoiPage, RoiRequest, RoiView, MAX_ROI_PAGE,
};
use flotilla_core::api::TokenRole;

use super::created;
use super::openapi::Errors;
use crate::auth::{Caller, ClientAuth};
use crate::error::{ApiError, ApiResult};
use crate::extract::{parse_id, JsonBody, PathParams, QueryParams};
use crate::state::AppState;
use crate::tiles::datasets::{self, Dataset};
use crate::tiles::plan::{self, ValidRoi};
use crate::tiles::progress;

async fn dataset(state: &AppState, name: &str) -> ApiResult<Dataset> {
    datasets::get(&state.db, name)
        .await?
        .ok_or_else(|| ApiError::Invalid {
            message: format!(
                "unknown dataset `{name}`; register it with POST /api/v1/datasets \
             (`flotilla datasets add`)"
            ),
            detail: Some(serde_json::json!({ "path": "dataset" })),
        })
}

/// The request checked, its tile cap lifted only for an admin.
fn valid(caller: &Caller, body: RoiRequest) -> ApiResult<ValidRoi> {
    if body.exceed_tile_cap && caller.role != TokenRole::Admin {
        return Err(ApiError::Forbidden(
            "`exceed_tile_cap` needs an admin token; split the region into smaller ROIs instead"
                .into(),
        ));
    }
    Ok(ValidRoi::try_from(body)?)
}

/// Counts only: total, present, in flight, missing.
#[utoipa::path(
    post,
    path = "/api/v1/rois/plan",
    tag = "rois",
    request_body = RoiRequest,
    responses((status = 200, description = "How the region splits", body = PlanCounts), Errors)
)]
pub async fn plan(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    JsonBody(body): JsonBody<RoiRequest>,
) -> ApiResult<Json<PlanCounts>> {
    let roi = valid(&caller, body)?;
    dataset(&state, &roi.dataset).await?;
    Ok(Json(plan::plan(&state.db, &roi).await?))
}

/// Plans and submits (or only plans, with `dry_run`).
#[utoipa::path(
    post,
    path = "/api/v1/rois",
    tag = "rois",
    request_body = RoiRequest,
    responses(
        (status = 201, description = "Submitted: a job per missing tile", body = RoiCreated),
        (status = 200, description = "`dry_run`: the plan only", body = PlanCounts),
        (status = 409, description = "The dataset has no checkpoint yet", body = flotilla_core::api::ErrorBody),
        (status = 429, description = "The submitter has as many jobs waiting as one may (`--max-waiting-per-submitter`)", body = flotilla_core::api::ErrorBody),
        Errors
    )
)]
pub async fn submit(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    JsonBody(body): JsonBody<RoiRequest>,
) -> ApiResult<axum::response::Response> {
    let dry_run = body.dry_run;
    let roi = valid(&caller, body)?;
    if dry_run {
        dataset(&state, &roi.dataset).await?;
        return Ok(Json(plan::plan(&state.db, &roi).await?).into_response());
    }
    let made = submit_valid(
        &state,
        &roi,
        &caller.submitter(),
        Some(caller.token_id),
        state.waiting_cap(caller.role),
    )
    .await?;
    Ok(created(made).into_response())
}

/// Submits a checked ROI: a job per missing tile. Shared with the
/// dashboard's "submit again".
pub(crate) async fn submit_valid(
    state: &AppState,
    roi: &ValidRoi,
    submitter: &str,
    owner: Option<uuid::Uuid>,
    cap: Option<crate::queue::submit::WaitingCap<'_>>,
) -> ApiResult<RoiCreated> {
    let ds = dataset(state, &roi.dataset).await?;
    let Some(sha) = ds.checkpoint_sha256.as_deref() else {
        return Err(ApiError::Conflict(format!(
            "dataset `{}` has no checkpoint yet; upload one with \
             PUT /api/v1/datasets/{}/checkpoint",
            ds.name, ds.name
        )));
    };
    let made = plan::submit(
        &state.db,
        roi,
        sha,
        ds.fetch_command.as_deref(),
        submitter,
        owner,
        cap,
    )
    .await??;
    tracing::info!(roi = %made.id, name = %roi.name, total = made.counts.total,
                   missing = made.counts.missing, plan_ms = made.plan_ms,
                   insert_ms = made.insert_ms, "ROI submitted");
    Ok(made)
}

/// An ROI with its jobs and tiles by state.
#[utoipa::path(
    get,
    path = "/api/v1/rois/{id}",
    tag = "rois",
    params(("id" = uuid::Uuid, Path, description = "The ROI's id")),
    responses((status = 200, description = "The ROI", body = RoiView), Errors)
)]
pub async fn show(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<RoiView>> {
    let id = parse_id(&id, "an ROI")?;
    let no_roi = || ApiError::NotFound(format!("no ROI {id}"));
    let mut view = progress::view(&state.db, id).await?.ok_or_else(no_roi)?;
    let roi = progress::get(&state.db, id).await?.ok_or_else(no_roi)?;
    view.tiles = progress::counts(&state.db, &roi).await?;
    Ok(Json(view))
}

#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// The last ROI of the previous page (its `next`).
    before: Option<uuid::Uuid>,
    /// ROIs per page, default 50; a value outside 1 to
    /// 200 is taken as the nearer end.
    limit: Option<u32>,
    /// Only the ROIs of this name (names are not unique: a region
    /// submitted again under its name is another ROI).
    name: Option<String>,
}

/// ROIs newest first (or those of one name), with their tiles by state;
/// `next` is the cursor of the following page.
#[utoipa::path(
    get,
    path = "/api/v1/rois",
    tag = "rois",
    params(ListQuery),
    responses((status = 200, description = "A page of ROIs", body = RoiPage), Errors)
)]
pub async fn list(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
    QueryParams(q): QueryParams<ListQuery>,
) -> ApiResult<Json<RoiPage>> {
    let limit = q.limit.unwrap_or(50).clamp(1, MAX_ROI_PAGE);
    let page = progress::list(&state.db, q.before, q.name.as_deref(), limit).await?;
    Ok(Json(page))
}
