//! Who is calling: `Authorization: Bearer …` turned into a [`Caller`] with a
//! role, by the extractors [`ClientAuth`], [`AdminAuth`], [`AgentAuth`] and
//! [`MetricsAuth`].
//!
//! - [`tokens`]: the `api_tokens` table (hashed secrets).
//! - [`cache`]: recently seen tokens (valid and refused) and agent ids, per
//!   process; the gate on lookups of never-seen tokens.

pub mod cache;
pub mod tokens;

use cache::Cached;
pub use cache::{AuthCache, CACHE_TTL};
pub use tokens::{
    create_token, ensure_token, hash_token, list_tokens, new_secret, revoke_token, token_page,
};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use flotilla_core::api::TokenRole;
use uuid::Uuid;

use crate::error::ApiError;
use crate::state::AppState;

/// Whoever made the request, by their token.
#[derive(Debug, Clone)]
pub struct Caller {
    pub token_id: Uuid,
    pub role: TokenRole,
    pub agent_name: Option<String>,
    pub description: Option<String>,
}

impl Caller {
    /// The name jobs are accounted to for fair share.
    pub fn submitter(&self) -> String {
        self.description
            .clone()
            .unwrap_or_else(|| format!("token-{}", &self.token_id.simple().to_string()[..8]))
    }
}

fn bearer(parts: &Parts) -> Result<&str, ApiError> {
    let value = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)
        .ok_or_else(|| {
            ApiError::Unauthorized(
                "missing Authorization header; send `Authorization: Bearer TOKEN` \
                 (flotilla up writes the admin token to DATA_DIR/admin.token)"
                    .into(),
            )
        })?;
    let value = value
        .to_str()
        .map_err(|_| ApiError::Unauthorized("Authorization header is not ASCII".into()))?;
    value
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::Unauthorized("Authorization must be `Bearer TOKEN`".into()))
}

/// The caller behind `token`: from the cache, else from the database. A
/// never-seen token waits its turn at the cache's unknown-token gate, so a
/// flood of random tokens holds only a few pool connections.
pub(crate) async fn lookup(state: &AppState, token: &str) -> Result<Caller, ApiError> {
    let refused = || ApiError::Unauthorized("unknown or revoked token".into());
    let hash = hash_token(token);
    let _turn = match state.auth_cache.get(&hash) {
        Cached::Valid(c) => return Ok(c),
        Cached::Refused => return Err(refused()),
        Cached::Stale => None,
        Cached::Unknown => {
            let turn = state.auth_cache.unknown_lookup().await;
            // The same token may have been looked up while this one waited.
            match state.auth_cache.get(&hash) {
                Cached::Valid(c) => return Ok(c),
                Cached::Refused => return Err(refused()),
                Cached::Stale | Cached::Unknown => Some(turn),
            }
        }
    };
    let row: Option<(Uuid, String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT id, role, agent_name, description FROM api_tokens
         WHERE token_hash = $1 AND revoked_at IS NULL",
    )
    .bind(&hash)
    .fetch_optional(&state.db)
    .await?;
    let Some((token_id, role, agent_name, description)) = row else {
        state.auth_cache.refuse(hash);
        return Err(refused());
    };
    let role = TokenRole::parse(&role)
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("bad role {role} in api_tokens")))?;
    let caller = Caller {
        token_id,
        role,
        agent_name,
        description,
    };
    state.auth_cache.put(hash, caller.clone());
    Ok(caller)
}

/// Any valid admin or client token (agent and metrics tokens may not use the
/// client API).
pub struct ClientAuth(pub Caller);
/// An admin token.
pub struct AdminAuth(pub Caller);
/// An agent token; `.0.agent_name` is the agent it speaks for.
pub struct AgentAuth(pub Caller, pub String);

impl FromRequestParts<AppState> for ClientAuth {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let caller = lookup(state, bearer(parts)?).await?;
        match caller.role {
            TokenRole::Admin | TokenRole::Client => Ok(ClientAuth(caller)),
            TokenRole::Agent => Err(ApiError::Forbidden(
                "agent tokens may only use /api/agent/v1".into(),
            )),
            TokenRole::Metrics => Err(ApiError::Forbidden(
                "metrics tokens may only read /metrics".into(),
            )),
        }
    }
}

/// Who may read `/metrics`: a metrics token (what Prometheus should use),
/// or an admin or client token.
pub struct MetricsAuth(pub Caller);

impl FromRequestParts<AppState> for MetricsAuth {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let caller = lookup(state, bearer(parts)?).await?;
        match caller.role {
            TokenRole::Admin | TokenRole::Client | TokenRole::Metrics => Ok(MetricsAuth(caller)),
            TokenRole::Agent => Err(ApiError::Forbidden(
                "agent tokens may only use /api/agent/v1".into(),
            )),
        }
    }
}

impl FromRequestParts<AppState> for AdminAuth {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let caller = lookup(state, bearer(parts)?).await?;
        match caller.role {
            TokenRole::Admin => Ok(AdminAuth(caller)),
            _ => Err(ApiError::Forbidden("this needs an admin token".into())),
        }
    }
}

impl FromRequestParts<AppState> for AgentAuth {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let caller = lookup(state, bearer(parts)?).await?;
        match (caller.role, caller.agent_name.clone()) {
            (TokenRole::Agent, Some(name)) => Ok(AgentAuth(caller, name)),
            _ => Err(ApiError::Forbidden(
                "the agent protocol needs an agent token (flotilla tokens create --agent NAME)"
                    .into(),
            )),
        }
    }
}
