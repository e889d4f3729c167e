//! `/api/v1/coverage/import`: the tiles of a geotessera `manifest.parquet`
//! recorded as present.

use axum::body::Body;
use axum::extract::State;
use axum::Json;
use flotilla_core::api::datasets::CoverageImported;
use serde::Deserialize;

use crate::auth::AdminAuth;
use crate::error::{ApiError, ApiResult};
use crate::extract::QueryParams;
use crate::state::AppState;
use crate::tiles::manifest::{self, ImportError, MAX_MANIFEST_BYTES};

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ImportQuery {
    /// The dataset the tiles are of.
    dataset: String,
}

/// Records the tiles of a geotessera `manifest.parquet` (the body) as
/// present for `?dataset=`. The body is spooled to disk and read in a child
/// process under memory and CPU limits (`tiles::manifest`); a manifest that
/// is refused, or that the reader dies on, records nothing.
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
    body: Body,
) -> ApiResult<Json<CoverageImported>> {
    super::datasets::known(&state, &q.dataset).await?;
    let upload = crate::tiles::sandbox::spool(body, MAX_MANIFEST_BYTES, "flotilla-manifest-")
        .await
        .map_err(|e| super::agent_protocol::upload_error("manifest", e))?;
    let done = manifest::import(&state.db, &q.dataset, &upload)
        .await
        .map_err(|e| match e {
            ImportError::Refused(why) => ApiError::invalid(format!("manifest: {why}")),
            ImportError::Db(e) => e.into(),
            ImportError::Failed(e) => ApiError::Internal(e),
        })?;
    tracing::info!(dataset = %q.dataset, rows = done.rows, tiles = done.tiles,
                   recorded = done.recorded, "coverage imported");
    Ok(Json(CoverageImported {
        dataset: q.dataset,
        rows: done.rows,
        tiles: done.tiles,
        recorded: done.recorded,
    }))
}
