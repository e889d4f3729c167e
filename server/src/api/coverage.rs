//! `/api/v1/coverage/import`: the tiles of a geotessera `manifest.parquet`
//! recorded as present.

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use flotilla_core::api::datasets::CoverageImported;
use serde::Deserialize;

use crate::auth::AdminAuth;
use crate::error::{ApiError, ApiResult};
use crate::extract::QueryParams;
use crate::state::AppState;
use crate::tiles::coverage;

/// Largest accepted manifest (geotessera's is tens of MB).
pub const MAX_MANIFEST_BYTES: usize = 1 << 30;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ImportQuery {
    /// The dataset the tiles are of.
    dataset: String,
}

/// Records the tiles of a geotessera `manifest.parquet` (the body) as
/// present for `?dataset=`.
#[utoipa::path(
    post,
    path = "/api/v1/coverage/import",
    tag = "datasets",
    params(ImportQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream",
                 description = "A geotessera manifest.parquet, at most 1 GiB"),
    responses(
        (status = 200, description = "What the import recorded", body = CoverageImported),
        (status = 413, description = "Over 1 GiB", body = flotilla_core::api::ErrorBody),
        super::openapi::Errors
    )
)]
pub async fn import(
    State(state): State<AppState>,
    AdminAuth(_): AdminAuth,
    QueryParams(q): QueryParams<ImportQuery>,
    body: Bytes,
) -> ApiResult<Json<CoverageImported>> {
    super::datasets::known(&state, &q.dataset).await?;
    let (tiles, rows) = tokio::task::spawn_blocking(move || coverage::read_manifest(body))
        .await
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("manifest reader panicked: {e}")))?
        .map_err(|e| ApiError::invalid(format!("manifest: {e}")))?;
    let recorded = coverage::import(&state.db, &q.dataset, &tiles).await?;
    tracing::info!(dataset = %q.dataset, rows, tiles = tiles.len(), recorded, "coverage imported");
    Ok(Json(CoverageImported {
        dataset: q.dataset,
        rows: rows as u64,
        tiles: tiles.len() as u64,
        recorded,
    }))
}
