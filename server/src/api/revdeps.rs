//! `/api/v1/revdeps`: submit an opam reverse-dependency run, read its state
//! and result.

use axum::extract::{Path, State};
use axum::response::IntoResponse;
use axum::Json;
use flotilla_core::api::revdeps::{RunView, SubmitRevdeps};
use flotilla_core::api::Created;

use super::created;
use crate::auth::ClientAuth;
use crate::error::{ApiError, ApiResult};
use crate::extract::{parse_id, JsonBody};
use crate::revdeps::{self, ValidRevdeps};
use crate::state::AppState;

pub async fn submit(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    JsonBody(body): JsonBody<SubmitRevdeps>,
) -> ApiResult<impl IntoResponse> {
    let run = ValidRevdeps::try_from(body)?;
    let id = revdeps::submit(&state.db, run, &caller.submitter(), Some(caller.token_id)).await?;
    Ok(created(Created { id }))
}

pub async fn show(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
    Path(id): Path<String>,
) -> ApiResult<Json<RunView>> {
    let id = parse_id(&id)?;
    revdeps::get(&state.db, id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no revdeps run {id}")))
}
