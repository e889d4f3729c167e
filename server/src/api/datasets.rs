//! `/api/v1/datasets`: register a dataset, list them, upload a checkpoint.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::Json;
use flotilla_core::api::datasets::{DatasetView, NewDataset};

use crate::auth::ClientAuth;
use crate::error::{ApiError, ApiResult};
use crate::extract::JsonBody;
use crate::state::AppState;
use crate::tiles::datasets::{self, Dataset, ValidDataset};

/// Largest accepted checkpoint upload (the published model is ~100 MB).
pub const MAX_CHECKPOINT_BYTES: u64 = 4 << 30;

pub async fn add(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
    JsonBody(body): JsonBody<NewDataset>,
) -> ApiResult<(axum::http::StatusCode, Json<DatasetView>)> {
    let d = datasets::upsert(&state.db, &ValidDataset::try_from(body)?).await?;
    Ok((axum::http::StatusCode::CREATED, Json(d.into())))
}

pub async fn list(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
) -> ApiResult<Json<Vec<DatasetView>>> {
    let list = datasets::list(&state.db).await?;
    Ok(Json(list.into_iter().map(DatasetView::from).collect()))
}

/// The dataset `name`, or a 404 that says how to register it.
pub(crate) async fn known(state: &AppState, name: &str) -> ApiResult<Dataset> {
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
) -> ApiResult<Json<DatasetView>> {
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
    Ok(Json(known(&state, &name).await?.into()))
}
