//! `/api/v1/datasets`: register a dataset and upload its checkpoint; `/api/v1/coverage/import`: record the tiles of a geotessera `manifest.parquet`.

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::Json;
use futures::StreamExt;
use object_store::WriteMultipart;
use serde::Deserialize;
use sha2::{Digest, Sha256};

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
    let upload = state
        .store
        .put_multipart(&staging_path)
        .await
        .map_err(|e| ApiError::Internal(e.into()))?;
    let mut writer = WriteMultipart::new(upload);
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                let _ = writer.abort().await;
                return Err(ApiError::BadRequest(format!(
                    "checkpoint upload was cut off after {size} bytes: {e}"
                )));
            }
        };
        size += chunk.len() as u64;
        if size > MAX_CHECKPOINT_BYTES {
            let _ = writer.abort().await;
            return Err(ApiError::PayloadTooLarge(format!(
                "a checkpoint may be at most {MAX_CHECKPOINT_BYTES} bytes"
            )));
        }
        hasher.update(&chunk);
        writer.write(&chunk);
    }
    if size == 0 {
        let _ = writer.abort().await;
        return Err(ApiError::invalid("the checkpoint is empty"));
    }
    writer
        .finish()
        .await
        .map_err(|e| ApiError::Internal(e.into()))?;
    let sha = hex::encode(hasher.finalize());
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
