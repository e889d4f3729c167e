//! `/api/v1/datasets`: register a dataset and upload its checkpoint; `/api/v1/coverage/import`: record the tiles of a geotessera `manifest.parquet`.

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::Json;
use serde::Deserialize;

use super::body::JsonBody;
use crate::auth::ClientAuth;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::tiles::coverage::{self, Imported};
use crate::tiles::datasets::{self, Dataset, NewDataset};

/// Largest accepted checkpoint upload (the published model is ~100 MB).
pub const MAX_CHECKPOINT_BYTES: u64 = 4 << 30;
/// Largest accepted manifest (geotessera's is tens of MB).
pub const MAX_MANIFEST_BYTES: usize = 1 << 30;

pub async fn add(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
    JsonBody(body): JsonBody<NewDataset>,
) -> ApiResult<(axum::http::StatusCode, Json<Dataset>)> {
    datasets::validate(&body).map_err(ApiError::invalid)?;
    let d = datasets::upsert(&state.db, &body).await?;
    Ok((axum::http::StatusCode::CREATED, Json(d)))
}

pub async fn list(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
) -> ApiResult<Json<Vec<Dataset>>> {
    Ok(Json(datasets::list(&state.db).await?))
}

async fn known(state: &AppState, name: &str) -> ApiResult<Dataset> {
    datasets::get(&state.db, name).await?.ok_or_else(|| {
        ApiError::NotFound(format!(
            "unknown dataset `{name}`; register it first with POST /api/v1/datasets"
        ))
    })
}

/// Streams a checkpoint (.safetensors or upstream .pt) into the store under
/// `datasets/{name}/checkpoint-{sha256}` and points the dataset at it. The
/// dataset changes only once the object is complete.
pub async fn put_checkpoint(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
    Path(name): Path<String>,
    body: Body,
) -> ApiResult<Json<Dataset>> {
    known(&state, &name).await?;
    let staging = format!("datasets/{name}/upload-{}", uuid::Uuid::new_v4());
    let staging_path = object_store::path::Path::from(staging.as_str());
    let (size, sha) = crate::store::stream_body(
        state.store.as_ref(),
        &staging_path,
        body,
        MAX_CHECKPOINT_BYTES,
    )
    .await
    .map_err(|e| super::agent_protocol::upload_error("checkpoint", e))?;
    if size == 0 {
        let _ = state.store.delete(&staging_path).await;
        return Err(ApiError::invalid("the checkpoint is empty"));
    }
    let key = format!("datasets/{name}/checkpoint-{sha}");
    state
        .store
        .rename(&staging_path, &object_store::path::Path::from(key.as_str()))
        .await
        .map_err(|e| ApiError::Internal(e.into()))?;
    datasets::set_checkpoint(&state.db, &name, &key, &sha, size).await?;
    Ok(Json(known(&state, &name).await?))
}

#[derive(Deserialize)]
pub struct ImportQuery {
    dataset: String,
}

/// Records the tiles of a geotessera `manifest.parquet` (the body) as
/// present for `?dataset=`.
pub async fn import_coverage(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
    Query(q): Query<ImportQuery>,
    body: Bytes,
) -> ApiResult<Json<Imported>> {
    known(&state, &q.dataset).await?;
    let (tiles, rows) = tokio::task::spawn_blocking(move || coverage::read_manifest(body))
        .await
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("manifest reader panicked: {e}")))?
        .map_err(|e| ApiError::invalid(format!("manifest: {e}")))?;
    let recorded = coverage::import(&state.db, &q.dataset, &tiles).await?;
    tracing::info!(dataset = %q.dataset, rows, tiles = tiles.len(), recorded, "coverage imported");
    Ok(Json(Imported {
        dataset: q.dataset,
        rows: rows as u64,
        tiles: tiles.len() as u64,
        recorded,
    }))
}
