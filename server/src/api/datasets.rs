//! `/api/v1/datasets`: register a dataset, list them, upload a checkpoint.

use axum::body::Body;
use axum::extract::State;
use axum::Json;
use flotilla_core::api::datasets::{DatasetList, DatasetView, NewDataset, MAX_DATASET_PAGE};
use serde::Deserialize;

use crate::auth::{AdminAuth, ClientAuth};
use crate::error::{ApiError, ApiResult};
use crate::extract::{JsonBody, PathParams, QueryParams};
use crate::state::AppState;
use crate::tiles::datasets::{self, Dataset, ValidDataset};

/// Largest accepted checkpoint upload (the published model is ~100 MB).
pub const MAX_CHECKPOINT_BYTES: u64 = 4 << 30;

/// Registers a dataset, or changes where its inputs come from. Admin only.
#[utoipa::path(
    post,
    path = "/api/v1/datasets",
    tag = "datasets",
    request_body = NewDataset,
    responses((status = 201, description = "The dataset", body = DatasetView), super::openapi::Errors)
)]
pub async fn add(
    State(state): State<AppState>,
    AdminAuth(_): AdminAuth,
    JsonBody(body): JsonBody<NewDataset>,
) -> ApiResult<(axum::http::StatusCode, Json<DatasetView>)> {
    let d = datasets::upsert(&state.db, &ValidDataset::try_from(body)?).await?;
    Ok((axum::http::StatusCode::CREATED, Json(d.into())))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// The cursor: the `next` of the previous page (its last dataset's
    /// name; empty: from the first).
    #[param(max_length = 64)]
    after: Option<String>,
    /// Datasets per page, default 1000; a value outside 1 to 1000 is taken
    /// as the nearer end.
    limit: Option<u32>,
}

/// Datasets by name, a page at a time.
#[utoipa::path(
    get,
    path = "/api/v1/datasets",
    tag = "datasets",
    params(ListQuery),
    responses((status = 200, description = "A page of datasets", body = DatasetList), super::openapi::Errors)
)]
pub async fn list(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
    QueryParams(q): QueryParams<ListQuery>,
) -> ApiResult<Json<DatasetList>> {
    let limit = q
        .limit
        .unwrap_or(MAX_DATASET_PAGE)
        .clamp(1, MAX_DATASET_PAGE);
    let after = q.after.as_deref().filter(|a| !a.is_empty());
    if let Some(after) = after {
        if !crate::tiles::valid_dataset_name(after) {
            return Err(ApiError::BadRequest(format!(
                "`after` {after:?} is not a dataset name: pass the `next` of the previous page"
            )));
        }
    }
    let mut page = datasets::page(&state.db, after, i64::from(limit) + 1).await?;
    let next = super::next_page(&mut page, limit, |d| d.name.clone());
    Ok(Json(DatasetList {
        datasets: page.into_iter().map(DatasetView::from).collect(),
        next,
    }))
}

/// The dataset `name`, or a 404 that says how to register it.
pub(crate) async fn known(state: &AppState, name: &str) -> ApiResult<Dataset> {
    datasets::get(&state.db, name).await?.ok_or_else(|| {
        ApiError::NotFound(format!(
            "unknown dataset `{name}`; register it first with POST /api/v1/datasets"
        ))
    })
}

/// Takes a checkpoint (.safetensors or upstream .pt) into the store under
/// `datasets/{name}/checkpoint-{sha256}` and points the dataset at it. The
/// upload is spooled to a temporary file and dry-loaded in a child process
/// first (`tiles::checkpoint_check`): a file that is not a valid model is
/// refused with 422 naming the problem, and neither the store nor the
/// dataset changes. The dataset changes only once the object is complete.
#[utoipa::path(
    put,
    path = "/api/v1/datasets/{name}/checkpoint",
    tag = "datasets",
    params(("name" = String, Path, description = "The dataset's name")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream",
                 description = "The checkpoint file (.safetensors or .pt), at most 4 GiB"),
    responses(
        (status = 200, description = "The dataset, pointing at the checkpoint", body = DatasetView),
        (status = 413, description = "Over 4 GiB", body = flotilla_core::api::ErrorBody),
        super::openapi::Errors
    )
)]
pub async fn put_checkpoint(
    State(state): State<AppState>,
    AdminAuth(_): AdminAuth,
    PathParams(name): PathParams<String>,
    body: Body,
) -> ApiResult<Json<DatasetView>> {
    use crate::tiles::checkpoint_check::{self, CheckError};
    known(&state, &name).await?;
    let upload = crate::tiles::sandbox::spool(body, MAX_CHECKPOINT_BYTES, "flotilla-checkpoint-")
        .await
        .map_err(|e| super::agent_protocol::upload_error("checkpoint", e))?;
    if upload.size == 0 {
        return Err(ApiError::invalid("the checkpoint is empty"));
    }
    checkpoint_check::check(&upload)
        .await
        .map_err(|e| match e {
            CheckError::Refused(why) => ApiError::invalid(format!("not a valid checkpoint: {why}")),
            CheckError::Failed(e) => ApiError::Internal(e),
        })?;
    let key = format!("datasets/{name}/checkpoint-{}", upload.sha256);
    // Shared with other uploads, apart from the store's sweep
    // (`datasets::CHECKPOINTS_LOCK`), until the dataset points at it.
    let mut tx = state.db.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock_shared($1)")
        .bind(datasets::CHECKPOINTS_LOCK)
        .execute(&mut *tx)
        .await?;
    checkpoint_check::upload(
        state.store.as_ref(),
        &object_store::path::Path::from(key.as_str()),
        &upload,
    )
    .await
    .map_err(ApiError::Internal)?;
    datasets::set_checkpoint(&mut tx, &name, &key, &upload.sha256, upload.size).await?;
    tx.commit().await?;
    Ok(Json(known(&state, &name).await?.into()))
}
