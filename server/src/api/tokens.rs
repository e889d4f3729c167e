//! `/api/v1/tokens`: an admin makes, lists and revokes tokens.

use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use flotilla_core::api::{
    CreateToken, TokenCreated, TokenList, TokenRole, TokenView, MAX_TOKEN_PAGE,
};
use serde::Deserialize;

use super::created;
use super::openapi::Errors;
use crate::auth::{self, AdminAuth};
use crate::error::{ApiError, ApiResult};
use crate::extract::{JsonBody, PathParams, QueryParams};
use crate::state::AppState;

/// Makes a token; its secret is in the answer, once. Admin only.
#[utoipa::path(
    post,
    path = "/api/v1/tokens",
    tag = "tokens",
    request_body = CreateToken,
    responses((status = 201, description = "The token and its secret", body = TokenCreated), Errors)
)]
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
        (TokenRole::Admin | TokenRole::Client | TokenRole::Metrics, Some(_)) => {
            return Err(ApiError::invalid("`agent_name` is only for agent tokens"))
        }
        _ => {}
    }
    let limits = auth::tokens::AgentLimits {
        labels: body.allowed_labels.clone(),
        kinds: body.allowed_kinds.clone(),
    };
    let limited = limits.labels.is_some() || limits.kinds.is_some();
    if limited && body.role != TokenRole::Agent {
        return Err(ApiError::invalid(
            "`allowed_labels` and `allowed_kinds` are only for agent tokens",
        ));
    }
    let (id, token) = auth::create_token(
        &state.db,
        body.role,
        body.agent_name.as_deref(),
        body.description.as_deref(),
    )
    .await?;
    if limited {
        auth::tokens::set_agent_limits(&state.db, id, &limits).await?;
    }
    Ok(created(TokenCreated { id, token }))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// The cursor: the `next` of the previous page (its last token's id).
    before: Option<uuid::Uuid>,
    /// Tokens per page, default 100; a value outside 1 to
    /// 1000 is taken as the nearer end.
    limit: Option<u32>,
}

/// Tokens newest first, a page at a time; never their secrets. Admin only.
#[utoipa::path(
    get,
    path = "/api/v1/tokens",
    tag = "tokens",
    params(ListQuery),
    responses((status = 200, description = "A page of tokens", body = TokenList), Errors)
)]
pub async fn list(
    State(state): State<AppState>,
    AdminAuth(_): AdminAuth,
    QueryParams(q): QueryParams<ListQuery>,
) -> ApiResult<Json<TokenList>> {
    let limit = q.limit.unwrap_or(100).clamp(1, MAX_TOKEN_PAGE);
    let (tokens, next) = auth::token_page(&state.db, q.before, limit).await?;
    Ok(Json(TokenList { tokens, next }))
}

/// Revokes a token: it stops working on this server at once (on other
/// servers sharing the database within `auth::CACHE_TTL`).
#[utoipa::path(
    post,
    path = "/api/v1/tokens/{id}/revoke",
    tag = "tokens",
    params(("id" = uuid::Uuid, Path, description = "The token's id")),
    responses((status = 200, description = "The token, revoked", body = TokenView), Errors)
)]
pub async fn revoke(
    State(state): State<AppState>,
    AdminAuth(caller): AdminAuth,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<TokenView>> {
    let id: uuid::Uuid = id
        .parse()
        .map_err(|_| ApiError::BadRequest(format!("`{id}` is not a token id (a UUID)")))?;
    let revoked = auth::revoke_token(&state.db, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no token {id}")))?;
    state.auth_cache.forget_tokens();
    tracing::info!(token = %id, by = %caller.token_id, "token revoked");
    Ok(Json(revoked))
}

pub fn valid_agent_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}
