//! What a tile job reads, lease-guarded.
//!
//! - `GET /api/agent/v1/jobs/{id}/checkpoint`: the dataset's checkpoint.
//! - `GET …/jobs/{id}/inputs/{file}`: the object
//!   `{input_prefix}/{year}/{tile}/{file}`.
//! - `GET …/jobs/{id}/moved`: what a pipeline move sent, for the job that
//!   receives it.
//!
//! Each takes the lease token in the `flotilla-lease` header
//! (`agent_protocol::LeaseHeader`).
//!
//! With an S3 store each answers with a redirect to a presigned
//! URL, so the bytes go from the store to the agent, not through here.

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt;
use uuid::Uuid;

use super::agent_protocol::{AgentProcess, LeaseHeader};
use crate::error::{ApiError, ApiResult};
use crate::extract::{parse_id, PathParams};
use crate::queue::lease::{self, LeaseKey};
use crate::queue::read;
use crate::state::AppState;
use crate::tiles::datasets;

/// The tile job `id` if `agent` holds its current lease.
async fn held_tile(
    state: &AppState,
    agent: &AgentProcess,
    id: &str,
    token: Uuid,
) -> ApiResult<(flotilla_core::job::TileJob, datasets::Dataset)> {
    let id = parse_id(id, "a job")?;
    lease::current_attempt(
        &state.db,
        LeaseKey {
            agent: agent.id,
            job: id,
            token,
        },
    )
    .await?;
    let tile = read::tile_spec(&state.db, id)
        .await?
        .ok_or_else(|| ApiError::invalid(format!("job {id} is not a tile job")))?;
    let ds = datasets::get(&state.db, &tile.dataset)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("dataset `{}` is gone", tile.dataset)))?;
    Ok((tile, ds))
}

/// The object `key`: streamed through the server, or, where the store is
/// S3 and presigning is on, a `307` to a URL of the object that expires
/// (the agent's client follows it, without the server's token, and checks
/// size and sha256 as it would otherwise). The object is looked up first
/// either way, so a missing one is this API's 404, not the store's.
async fn stream(state: &AppState, key: &str) -> ApiResult<Response> {
    let path = object_store::path::Path::from(key);
    if let Some(presigner) = &state.settings.presigner {
        return match state.store.head(&path).await {
            Ok(_) => {
                let url = presigner
                    .get_url(key)
                    .await
                    .map_err(|e| ApiError::Internal(e.into()))?;
                Ok((
                    axum::http::StatusCode::TEMPORARY_REDIRECT,
                    [(axum::http::header::LOCATION, url.to_string())],
                )
                    .into_response())
            }
            Err(object_store::Error::NotFound { .. }) => Err(ApiError::NotFound(format!(
                "no object `{key}` in the store"
            ))),
            Err(e) => Err(ApiError::Internal(e.into())),
        };
    }
    match state.store.get(&path).await {
        Ok(got) => {
            let len = got.meta.size;
            let body = Body::from_stream(got.into_stream().map_err(std::io::Error::other));
            Ok((
                [(axum::http::header::CONTENT_LENGTH, len.to_string())],
                body,
            )
                .into_response())
        }
        Err(object_store::Error::NotFound { .. }) => Err(ApiError::NotFound(format!(
            "no object `{key}` in the store"
        ))),
        Err(e) => Err(ApiError::Internal(e.into())),
    }
}

pub async fn checkpoint(
    State(state): State<AppState>,
    agent: AgentProcess,
    PathParams(id): PathParams<String>,
    LeaseHeader(lease): LeaseHeader,
) -> ApiResult<Response> {
    let (_, ds) = held_tile(&state, &agent, &id, lease).await?;
    let key = ds
        .checkpoint_key
        .ok_or_else(|| ApiError::NotFound(format!("dataset `{}` has no checkpoint", ds.name)))?;
    stream(&state, &key).await
}

pub async fn input(
    State(state): State<AppState>,
    agent: AgentProcess,
    PathParams((id, file)): PathParams<(String, String)>,
    LeaseHeader(lease): LeaseHeader,
) -> ApiResult<Response> {
    flotilla_core::job::check_output_path(&file)
        .map_err(|why| ApiError::invalid(format!("input name `{file}` {why}")))?;
    let (tile, ds) = held_tile(&state, &agent, &id, lease).await?;
    let prefix = ds.input_prefix.ok_or_else(|| {
        ApiError::NotFound(format!(
            "dataset `{}` has no input prefix (its inputs come from a fetch command)",
            ds.name
        ))
    })?;
    let key = format!("{prefix}/{}/{}/{file}", tile.year, tile.tile.name());
    stream(&state, &key).await
}

/// `GET /api/agent/v1/jobs/{id}/moved`: for a pipeline move's
/// receiving job, the tar its sending job uploaded (the last one that
/// succeeded for the same run, item and step).
pub async fn moved(
    State(state): State<AppState>,
    agent: AgentProcess,
    PathParams(id): PathParams<String>,
    LeaseHeader(lease): LeaseHeader,
) -> ApiResult<Response> {
    let id = parse_id(&id, "a job")?;
    lease::current_attempt(
        &state.db,
        LeaseKey {
            agent: agent.id,
            job: id,
            token: lease,
        },
    )
    .await?;
    let key = crate::pipelines::read::sent_tar(&state.db, id)
        .await?
        .ok_or_else(|| {
            ApiError::NotFound(format!(
                "job {id} is not a pipeline move's receive, or its send stored nothing"
            ))
        })?;
    stream(&state, &key).await
}
