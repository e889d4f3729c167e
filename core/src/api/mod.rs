//! The REST API under `/api/v1`: one module per resource with its request
//! and response bodies, plus what every resource shares (the error envelope,
//! the field error of a validation, ids, outputs, progress).
//!
//! - [`jobs`]: `/api/v1/jobs` — submit, show, list, cancel.
//! - [`logs`]: `/api/v1/jobs/{id}/log` — a job's log, whole or in pages.
//! - [`agents`]: `/api/v1/agents` — list; pause, drain, resume.
//! - [`tokens`]: `/api/v1/tokens` — make, list, revoke API tokens.
//! - [`rois`]: `/api/v1/rois` — regions of interest, their plans and
//!   progress.
//! - [`tiles`]: `/api/v1/tiles/stats` — tiles per hour per agent.
//! - [`revdeps`]: `/api/v1/revdeps` — opam reverse-dependency runs.
//! - [`pipelines`]: `/api/v1/pipelines` — pipeline runs and their item ×
//!   step matrix.
//! - [`datasets`]: `/api/v1/datasets` and `/api/v1/coverage/import`.
//! - [`alerts`]: `/api/v1/alerts` — what needs an operator now.

pub mod agents;
pub mod alerts;
pub mod datasets;
pub mod jobs;
pub mod logs;
pub mod pipelines;
pub mod revdeps;
pub mod rois;
pub mod tiles;
pub mod tokens;

pub use agents::*;
pub use jobs::*;
pub use tokens::*;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// `201` answer to a submission.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Created {
    pub id: Uuid,
}

/// One stored output of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OutputView {
    /// The path the job declared.
    pub name: String,
    /// Object-store key.
    pub key: String,
    pub size: u64,
    /// Lower-case hex.
    pub sha256: String,
}

/// Work done of work total, in the job's own unit (pixels for tiles).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Progress {
    pub done: u64,
    pub total: u64,
}

/// What is wrong with a request body: the field (a path such as
/// `outputs[2]` or `geojson`) and a message that names it. Every
/// `TryFrom<Request> for Valid…` in the server fails with this one shape;
/// the API answers it as `422 invalid` with `detail.path` = `field`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    /// `message` is shown as given; it should name the field.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }

    /// "`field` what": for messages that start with the field's name.
    pub fn at(field: impl Into<String>, what: impl std::fmt::Display) -> Self {
        let field = field.into();
        let message = format!("`{field}` {what}");
        FieldError { field, message }
    }
}

/// Body of every error answer: `{"error":{"code","message","detail"}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    pub error: ErrorInfo,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorInfo {
    /// Stable, machine-readable: `bad_request`, `unauthorized`, `not_found`,
    /// `conflict`, `stale_lease`, …
    pub code: String,
    /// What is wrong and, where it helps, what to do next.
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<serde_json::Value>,
}
