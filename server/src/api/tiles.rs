//! `/api/v1/tiles/stats`: tiles per hour per agent.

use axum::extract::State;
use axum::Json;
use flotilla_core::api::tiles::AgentTileRate;

use crate::auth::ClientAuth;
use crate::error::ApiResult;
use crate::state::AppState;

/// Tiles per hour per agent over the last hour.
#[utoipa::path(
    get,
    path = "/api/v1/tiles/stats",
    tag = "rois",
    responses((status = 200, description = "One entry per agent", body = Vec<AgentTileRate>), super::openapi::Errors)
)]
pub async fn stats(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
) -> ApiResult<Json<Vec<AgentTileRate>>> {
    Ok(Json(crate::tiles::stats::rates(&state.db).await?))
}
