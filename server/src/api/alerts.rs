//! `GET /api/v1/alerts`: the active alerts ([`crate::alerts`]). Readable
//! with any token that may read `/metrics` (metrics, client or admin): an
//! alerting bridge holding Prometheus's read-only token may poll it.

use axum::extract::State;
use axum::Json;
use flotilla_core::api::alerts::AlertList;

use crate::auth::MetricsAuth;
use crate::error::ApiResult;
use crate::state::AppState;

/// The active alerts, critical first. Any token that may read `/metrics`.
#[utoipa::path(
    get,
    path = "/api/v1/alerts",
    tag = "alerts",
    responses((status = 200, description = "The active alerts", body = AlertList), super::openapi::Errors)
)]
pub async fn list(
    State(state): State<AppState>,
    MetricsAuth(_): MetricsAuth,
) -> ApiResult<Json<AlertList>> {
    Ok(Json(crate::alerts::current(&state).await?.as_ref().clone()))
}
