//! API tokens: random secrets shown once, stored as sha256 hashes in
//! `api_tokens`; extractors that turn `Authorization: Bearer …` into a
//! caller with a role.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use flotilla_core::api::{TokenRole, TokenView};
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::ApiError;
use crate::state::AppState;

/// Tokens carry 256 random bits, so one unsalted sha256 is enough: there is
/// no dictionary to attack, and a lookup stays one index probe.
pub fn hash_token(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// A fresh secret: `flt_` and 64 hex digits.
pub fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    format!("flt_{}", hex::encode(bytes))
}

/// Stores a new token and returns its id and secret.
pub async fn create_token(
    db: &PgPool,
    role: TokenRole,
    agent_name: Option<&str>,
    description: Option<&str>,
) -> Result<(Uuid, String), sqlx::Error> {
    let secret = new_secret();
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO api_tokens (id, token_hash, role, agent_name, description)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(id)
    .bind(hash_token(&secret))
    .bind(role.as_str())
    .bind(agent_name)
    .bind(description)
    .execute(db)
    .await?;
    Ok((id, secret))
}

type TokenRow = (
    Uuid,
    String,
    Option<String>,
    Option<String>,
    chrono::DateTime<chrono::Utc>,
    Option<chrono::DateTime<chrono::Utc>>,
);

fn token_view(row: TokenRow) -> Result<TokenView, sqlx::Error> {
    let (id, role, agent_name, description, created_at, revoked_at) = row;
    let role = TokenRole::parse(&role).ok_or_else(|| sqlx::Error::ColumnDecode {
        index: "role".into(),
        source: format!("unknown role `{role}`").into(),
    })?;
    Ok(TokenView {
        id,
        role,
        agent_name,
        description,
        created_at,
        revoked_at,
    })
}

/// Every token, newest first (hashes and secrets are never shown).
pub async fn list_tokens(db: &PgPool) -> Result<Vec<TokenView>, sqlx::Error> {
    let rows: Vec<TokenRow> = sqlx::query_as(
        "SELECT id, role, agent_name, description, created_at, revoked_at
         FROM api_tokens ORDER BY created_at DESC",
    )
    .fetch_all(db)
    .await?;
    rows.into_iter().map(token_view).collect()
}

/// Revokes token `id` (again is a no-op); `None` if there is no such token.
/// The caller must also [`AuthCache::forget_tokens`].
pub async fn revoke_token(db: &PgPool, id: Uuid) -> Result<Option<TokenView>, sqlx::Error> {
    let row: Option<TokenRow> = sqlx::query_as(
        "UPDATE api_tokens SET revoked_at = COALESCE(revoked_at, now()) WHERE id = $1
         RETURNING id, role, agent_name, description, created_at, revoked_at",
    )
    .bind(id)
    .fetch_optional(db)
    .await?;
    row.map(token_view).transpose()
}

/// Makes sure `secret` is a valid token of `role` (used for the admin token
/// that `flotilla up` and `flotilla serve --admin-token-file` keep on disk).
pub async fn ensure_token(
    db: &PgPool,
    secret: &str,
    role: TokenRole,
    agent_name: Option<&str>,
    description: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO api_tokens (id, token_hash, role, agent_name, description)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (token_hash) DO NOTHING",
    )
    .bind(Uuid::new_v4())
    .bind(hash_token(secret))
    .bind(role.as_str())
    .bind(agent_name)
    .bind(description)
    .execute(db)
    .await?;
    Ok(())
}

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

/// Recently seen tokens and agent ids, so that the hot agent calls (lease,
/// complete) do not pay two extra queries each. Rebuilt from the database on
/// a miss; an entry lives [`CACHE_TTL`]. A revocation empties this server's
/// token cache at once; on other servers sharing the database a revoked
/// token keeps working for at most [`CACHE_TTL`].
#[derive(Default)]
pub struct AuthCache {
    tokens: std::sync::Mutex<HashMap<Vec<u8>, (Caller, Instant)>>,
    agents: std::sync::Mutex<HashMap<String, Uuid>>,
}

pub const CACHE_TTL: Duration = Duration::from_secs(10);
/// Past this many entries the token cache is cleared rather than grown.
const CACHE_MAX: usize = 10_000;

impl AuthCache {
    fn get(&self, hash: &[u8]) -> Option<Caller> {
        let map = self
            .tokens
            .lock()
            .expect("auth cache lock is never poisoned");
        map.get(hash)
            .filter(|(_, at)| at.elapsed() < CACHE_TTL)
            .map(|(c, _)| c.clone())
    }

    fn put(&self, hash: Vec<u8>, caller: Caller) {
        let mut map = self
            .tokens
            .lock()
            .expect("auth cache lock is never poisoned");
        if map.len() >= CACHE_MAX {
            map.clear();
        }
        map.insert(hash, (caller, Instant::now()));
    }

    /// Drops every cached token (after a revocation).
    pub fn forget_tokens(&self) {
        self.tokens
            .lock()
            .expect("auth cache lock is never poisoned")
            .clear();
    }

    /// The id of a registered agent (agents are never deleted, and a name
    /// keeps its id across re-registration).
    pub fn agent_id(&self, name: &str) -> Option<Uuid> {
        self.agents
            .lock()
            .expect("auth cache lock is never poisoned")
            .get(name)
            .copied()
    }

    pub fn remember_agent(&self, name: &str, id: Uuid) {
        self.agents
            .lock()
            .expect("auth cache lock is never poisoned")
            .insert(name.to_string(), id);
    }
}

pub(crate) async fn lookup(state: &AppState, token: &str) -> Result<Caller, ApiError> {
    let hash = hash_token(token);
    if let Some(c) = state.auth_cache.get(&hash) {
        return Ok(c);
    }
    let row: Option<(Uuid, String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT id, role, agent_name, description FROM api_tokens
         WHERE token_hash = $1 AND revoked_at IS NULL",
    )
    .bind(&hash)
    .fetch_optional(&state.db)
    .await?;
    let (token_id, role, agent_name, description) =
        row.ok_or_else(|| ApiError::Unauthorized("unknown or revoked token".into()))?;
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

/// Any valid admin or client token (agents may not use the client API).
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
