//! The API error type: maps to a status and the JSON error body. 5xx bodies
//! say nothing internal; the detail goes to the log.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use flotilla_core::api::{ErrorBody, ErrorInfo, FieldError};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    /// A body that parsed but whose values are wrong; `detail` says where.
    #[error("{message}")]
    Invalid {
        message: String,
        detail: Option<serde_json::Value>,
    },
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// A call about a job from an attempt that is no longer current.
    #[error("{0}")]
    StaleLease(String),
    /// An agent call from a process that a later registration under the
    /// same name replaced; the process should stop.
    #[error("{0}")]
    Superseded(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    /// The caller has as much work waiting as one submitter may.
    #[error("{0}")]
    TooManyWaiting(String),
    /// The caller's login, or the server, has as many dashboard live
    /// streams open as it may (`Retry-After` goes with it).
    #[error("{0}")]
    TooManyStreams(String),
    #[error("database unavailable")]
    Unavailable(#[source] sqlx::Error),
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::Invalid {
            message: message.into(),
            detail: None,
        }
    }

    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::Invalid { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid"),
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::StaleLease(_) => (StatusCode::CONFLICT, "stale_lease"),
            ApiError::Superseded(_) => (StatusCode::CONFLICT, "superseded"),
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::TooManyWaiting(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_waiting"),
            ApiError::TooManyStreams(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_streams"),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

/// A request body whose values are wrong: `422 invalid`, with the field's
/// path in `detail.path`.
impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> Self {
        ApiError::Invalid {
            detail: Some(serde_json::json!({ "path": e.field })),
            message: e.message,
        }
    }
}

/// PostgreSQL's "character not in repertoire" (22021) and "untranslatable
/// character" (22P05): text it cannot store, a NUL byte above all. Such
/// text can only have come from the request (a query parameter, a path
/// segment or a field that no check looked at), so it is the caller's
/// mistake, not the server's.
const UNSTORABLE_TEXT: [&str; 2] = ["22021", "22P05"];

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_) => ApiError::Unavailable(e),
            sqlx::Error::Database(db)
                if db
                    .code()
                    .is_some_and(|c| UNSTORABLE_TEXT.contains(&c.as_ref())) =>
            {
                tracing::info!(error = %e, "request text refused by the database");
                ApiError::BadRequest(
                    "the request holds text that cannot be stored (a NUL byte or an invalid \
                     character) in a parameter, path segment or field"
                        .into(),
                )
            }
            _ => ApiError::Internal(e.into()),
        }
    }
}

impl From<crate::queue::submit::WaitingCapExceeded> for ApiError {
    fn from(e: crate::queue::submit::WaitingCapExceeded) -> Self {
        ApiError::TooManyWaiting(e.to_string())
    }
}

impl From<crate::queue::retry::RetryError> for ApiError {
    fn from(e: crate::queue::retry::RetryError) -> Self {
        use crate::queue::retry::RetryError;
        match e {
            RetryError::NotFound(_) => ApiError::NotFound(e.to_string()),
            RetryError::NotEnded { .. } => ApiError::Conflict(e.to_string()),
            RetryError::AlreadyRetried { .. } => ApiError::Conflict(e.to_string()),
            RetryError::NotCommand { .. } => FieldError::new("kind", e.to_string()).into(),
            RetryError::Invalid(field) => field.into(),
            RetryError::Capped(over) => over.into(),
            RetryError::Db(db) => db.into(),
        }
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        ApiError::Internal(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let (message, detail) = match &self {
            ApiError::Internal(e) => {
                tracing::error!(error = ?e, "internal error");
                ("internal error; see the server log".to_string(), None)
            }
            ApiError::Unavailable(e) => {
                tracing::warn!(error = %e, "database unavailable");
                (
                    "the database is unavailable; retry shortly".to_string(),
                    None,
                )
            }
            ApiError::Invalid { message, detail } => (message.clone(), detail.clone()),
            other => (other.to_string(), None),
        };
        let body = ErrorBody {
            error: ErrorInfo {
                code: code.to_string(),
                message,
                detail,
            },
        };
        if matches!(self, ApiError::TooManyStreams(_)) {
            // A tab closing frees a slot; a reload soon after may pass.
            let retry = [(axum::http::header::RETRY_AFTER, "30")];
            return (status, retry, Json(body)).into_response();
        }
        (status, Json(body)).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// The error for a stored value that does not parse into its type (a
/// state, a kind, a spec): the column's name and why.
pub fn column_error(
    column: &str,
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> sqlx::Error {
    sqlx::Error::ColumnDecode {
        index: column.into(),
        source: e.into(),
    }
}
