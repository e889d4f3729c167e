//! `/api/v1/tokens`: API and agent tokens (admin only); secrets are shown
//! once, at creation.

use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// `POST /api/v1/tokens`: make an API token. Only an admin may.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateToken {
    pub role: TokenRole,
    /// For `agent` tokens: the agent name the token may register as.
    #[serde(default)]
    pub agent_name: Option<String>,
    /// A note for the operator ("ci", "alice's laptop").
    #[serde(default)]
    pub description: Option<String>,
    /// For `agent` tokens: the only labels the agent may register with
    /// (each `key=value` it claims must be one of these; `None`: any). An
    /// agent claiming `gpu=h100` would otherwise get GPU jobs and their
    /// environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_labels: Option<BTreeMap<String, String>>,
    /// For `agent` tokens: the only job kinds the agent may run (`None`:
    /// any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_kinds: Option<Vec<crate::job::JobKind>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum TokenRole {
    /// Everything, including making tokens and steering agents.
    Admin,
    /// Submits and reads jobs.
    Client,
    /// Speaks the agent protocol as one named agent.
    Agent,
    /// Reads `/metrics` and nothing else (for Prometheus).
    Metrics,
}

impl TokenRole {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenRole::Admin => "admin",
            TokenRole::Client => "client",
            TokenRole::Agent => "agent",
            TokenRole::Metrics => "metrics",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "admin" => Some(TokenRole::Admin),
            "client" => Some(TokenRole::Client),
            "agent" => Some(TokenRole::Agent),
            "metrics" => Some(TokenRole::Metrics),
            _ => None,
        }
    }
}

/// The secret is shown once, here; the server keeps only its hash.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenCreated {
    pub id: Uuid,
    pub token: String,
}

/// One token as `GET /api/v1/tokens` lists it: never its secret.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenView {
    pub id: Uuid,
    pub role: TokenRole,
    pub agent_name: Option<String>,
    pub description: Option<String>,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// `GET /api/v1/tokens?before=ID&limit=N`: newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenList {
    pub tokens: Vec<TokenView>,
    /// Pass as `before` for the next (older) page: this page's last token.
    /// `null` on the last page.
    #[serde(default)]
    pub next: Option<Uuid>,
}

/// Most tokens one page of `GET /api/v1/tokens` holds.
pub const MAX_TOKEN_PAGE: u32 = 1000;
