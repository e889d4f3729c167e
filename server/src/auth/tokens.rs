//! The `api_tokens` table: random secrets shown once, stored as sha256
//! hashes; made, listed, revoked.

use flotilla_core::api::{TokenRole, TokenView};
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

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
    let role = TokenRole::parse(&role)
        .ok_or_else(|| crate::error::column_error("role", format!("unknown role `{role}`")))?;
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

/// Tokens newest first, older than token `before` when given (an unknown
/// `before` gives an empty page), at most `limit`; with the cursor of the
/// next page when there may be one.
pub async fn token_page(
    db: &PgPool,
    before: Option<Uuid>,
    limit: u32,
) -> Result<(Vec<TokenView>, Option<Uuid>), sqlx::Error> {
    let rows: Vec<TokenRow> = sqlx::query_as(
        "SELECT id, role, agent_name, description, created_at, revoked_at
         FROM api_tokens
         WHERE $1::uuid IS NULL
            OR (created_at, id) < (SELECT c.created_at, c.id FROM api_tokens c WHERE c.id = $1)
         ORDER BY created_at DESC, id DESC LIMIT $2",
    )
    .bind(before)
    .bind(i64::from(limit) + 1)
    .fetch_all(db)
    .await?;
    let more = rows.len() > limit as usize;
    let tokens = rows
        .into_iter()
        .take(limit as usize)
        .map(token_view)
        .collect::<Result<Vec<_>, _>>()?;
    let next = if more {
        tokens.last().map(|t| t.id)
    } else {
        None
    };
    Ok((tokens, next))
}

/// Revokes token `id` (again is a no-op); `None` if there is no such token.
/// The caller must also [`super::AuthCache::forget_tokens`].
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

/// What an agent token may claim at registration (`None`: anything).
#[derive(Debug, Clone, Default)]
pub struct AgentLimits {
    pub labels: Option<std::collections::BTreeMap<String, String>>,
    pub kinds: Option<Vec<flotilla_core::job::JobKind>>,
}

impl AgentLimits {
    /// Why `labels` and `kinds` may not be claimed with this token, if not.
    pub fn refusal(
        &self,
        labels: &std::collections::BTreeMap<String, String>,
        kinds: &[flotilla_core::job::JobKind],
    ) -> Option<String> {
        if let Some(allowed) = &self.labels {
            if let Some((k, v)) = labels.iter().find(|(k, v)| allowed.get(*k) != Some(*v)) {
                return Some(format!(
                    "this agent token may not claim the label `{k}={v}`; an admin allows labels \
                     with `flotilla tokens create --role agent --allow-label KEY=VALUE`"
                ));
            }
        }
        if let Some(allowed) = &self.kinds {
            if let Some(k) = kinds.iter().find(|k| !allowed.contains(k)) {
                return Some(format!(
                    "this agent token may not run `{k}` jobs; an admin allows kinds with \
                     `flotilla tokens create --role agent --allow-kind KIND`"
                ));
            }
        }
        None
    }
}

/// Records what agent token `id` may claim.
pub async fn set_agent_limits(
    db: &PgPool,
    id: Uuid,
    limits: &AgentLimits,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE api_tokens SET allowed_labels = $2, allowed_kinds = $3 WHERE id = $1")
        .bind(id)
        .bind(
            limits
                .labels
                .as_ref()
                .map(|l| serde_json::to_value(l).expect("labels serialise")),
        )
        .bind(
            limits
                .kinds
                .as_ref()
                .map(|k| k.iter().map(|k| k.as_str()).collect::<Vec<_>>()),
        )
        .execute(db)
        .await?;
    Ok(())
}

/// What agent token `id` may claim.
pub async fn agent_limits(db: &PgPool, id: Uuid) -> Result<AgentLimits, sqlx::Error> {
    let row: Option<(Option<serde_json::Value>, Option<Vec<String>>)> =
        sqlx::query_as("SELECT allowed_labels, allowed_kinds FROM api_tokens WHERE id = $1")
            .bind(id)
            .fetch_optional(db)
            .await?;
    let Some((labels, kinds)) = row else {
        return Ok(AgentLimits::default());
    };
    Ok(AgentLimits {
        // Written by set_agent_limits only; a value that does not parse
        // allows nothing rather than everything.
        labels: labels.map(|l| serde_json::from_value(l).unwrap_or_default()),
        kinds: kinds.map(|k| k.iter().filter_map(|k| k.parse().ok()).collect()),
    })
}
