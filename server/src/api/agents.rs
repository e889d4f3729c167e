//! `/api/v1/agents`: list; pause, drain, resume (admin).

use axum::extract::{Path, State};
use axum::Json;
use flotilla_core::api::{AgentList, SteerReply};

use crate::agents::{self, Steer};
use crate::auth::{AdminAuth, ClientAuth};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

pub async fn list(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
) -> ApiResult<Json<AgentList>> {
    Ok(Json(AgentList {
        agents: agents::list(&state.db, state.settings.heartbeat_interval).await?,
    }))
}

pub async fn steer(
    State(state): State<AppState>,
    AdminAuth(_): AdminAuth,
    Path((name, action)): Path<(String, String)>,
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
