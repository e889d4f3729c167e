//! `/api/v1/agents`: list; pause, drain, resume (admin).

use axum::extract::State;
use axum::Json;
use flotilla_core::api::{AgentList, SteerReply};

use flotilla_core::api::MAX_AGENT_PAGE;
use flotilla_core::job::check_name;
use serde::Deserialize;

use crate::agents::{self, Steer};
use crate::auth::{AdminAuth, ClientAuth};
use crate::error::{ApiError, ApiResult};
use crate::extract::{PathParams, QueryParams};
use crate::state::AppState;

use super::openapi::Errors;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// The cursor: the `next` of the previous page (its last agent's name;
    /// empty: from the first).
    #[param(max_length = 200)]
    after: Option<String>,
    /// Agents per page, default 1000; a value outside 1 to
    /// 1000 is taken as the nearer end.
    limit: Option<u32>,
}

/// Agents by name, a page at a time.
#[utoipa::path(
    get,
    path = "/api/v1/agents",
    tag = "agents",
    params(ListQuery),
    responses((status = 200, description = "A page of agents", body = AgentList), Errors)
)]
pub async fn list(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
    QueryParams(q): QueryParams<ListQuery>,
) -> ApiResult<Json<AgentList>> {
    let limit = q.limit.unwrap_or(MAX_AGENT_PAGE).clamp(1, MAX_AGENT_PAGE);
    let after = q.after.as_deref().filter(|a| !a.is_empty());
    if let Some(after) = after {
        check_name("after", after).map_err(|e| ApiError::BadRequest(e.message))?;
    }
    let mut page = agents::page(
        &state.db,
        state.settings.heartbeat_interval,
        after,
        Some(i64::from(limit) + 1),
    )
    .await?;
    let next = super::next_page(&mut page, limit, |a| a.name.clone());
    Ok(Json(AgentList { agents: page, next }))
}

/// Pauses (no new jobs), drains (finish running jobs, then `drained`) or
/// resumes an agent. Admin only.
#[utoipa::path(
    post,
    path = "/api/v1/agents/{name}/{action}",
    tag = "agents",
    params(
        ("name" = String, Path, description = "The agent's name"),
        ("action" = String, Path, description = "What to do", pattern = "^(pause|drain|resume)$"),
    ),
    responses((status = 200, description = "The agent's new state", body = SteerReply), Errors)
)]
pub async fn steer(
    State(state): State<AppState>,
    AdminAuth(_): AdminAuth,
    PathParams((name, action)): PathParams<(String, String)>,
) -> ApiResult<Json<SteerReply>> {
    let steer = match action.as_str() {
        "pause" => Steer::Pause,
        "drain" => Steer::Drain,
        "resume" => Steer::Resume,
        other => {
            return Err(ApiError::NotFound(format!(
                "unknown agent action `{other}`: use pause, drain or resume"
            )))
        }
    };
    let new_state = agents::steer(&state.db, &name, steer)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no agent named `{name}`")))?;
    if matches!(steer, Steer::Resume) {
        state.job_signal.notify_waiters();
    }
    Ok(Json(SteerReply {
        name,
        state: new_state,
    }))
}
