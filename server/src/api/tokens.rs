//! `/api/v1/tokens`: an admin makes client, admin and agent tokens.

use axum::extract::State;
use axum::response::IntoResponse;
use flotilla_core::api::{CreateToken, TokenCreated, TokenRole};

use super::body::JsonBody;
use super::created;
use crate::auth::{self, AdminAuth};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

pub async fn create(
    State(state): State<AppState>,
    AdminAuth(_): AdminAuth,
    JsonBody(body): JsonBody<CreateToken>,
) -> ApiResult<impl IntoResponse> {
    match (body.role, body.agent_name.as_deref()) {
        (TokenRole::Agent, None) => {
            return Err(ApiError::invalid("an agent token needs `agent_name`"))
        }
        (TokenRole::Agent, Some(n)) if !valid_agent_name(n) => {
            return Err(ApiError::invalid(
                "`agent_name` must be 1-64 characters of letters, digits, `-`, `_`, `.`",
            ))
        }
        (TokenRole::Admin | TokenRole::Client, Some(_)) => {
            return Err(ApiError::invalid("`agent_name` is only for agent tokens"))
        }
        _ => {}
    }
    let (id, token) = auth::create_token(
        &state.db,
        body.role,
        body.agent_name.as_deref(),
        body.description.as_deref(),
    )
    .await?;
    Ok(created(TokenCreated { id, token }))
}

pub fn valid_agent_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}
