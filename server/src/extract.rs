//! Request extraction shared by the API and the dashboard: [`JsonBody`]
//! (axum's `Json`, but every rejection is an [`ApiError`] in the JSON
//! envelope, naming the line and column of a syntax error and the field of a
//! type error), [`QueryParams`] and [`PathParams`] (the same for query
//! strings and path segments) and [`parse_id`] for id path segments.

use axum::extract::{FromRequest, Request};
use futures::StreamExt;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;

/// `MAX`, where not 0, is the body's limit in bytes in place of the
/// server's `max_body_bytes` (an agent's completion, which may carry a
/// pipeline's listing: [`flotilla_core::protocol::MAX_COMPLETE_BYTES`]).
pub struct JsonBody<T, const MAX: usize = 0>(pub T);

impl<T: DeserializeOwned, const MAX: usize> FromRequest<AppState> for JsonBody<T, MAX> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let is_json = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json") || v.ends_with("+json"));
        let limit = match MAX {
            0 => state.settings.max_body_bytes,
            max => max.max(state.settings.max_body_bytes),
        };
        let bytes = read_limited(req, limit).await?;
        if !is_json {
            return Err(ApiError::BadRequest(
                "send the body as JSON with `Content-Type: application/json`".into(),
            ));
        }
        parse(&bytes).map(JsonBody)
    }
}

/// axum's `Query`, but a query string that does not parse is a `400` in the
/// JSON envelope saying which parameter and why (axum answers plain text).
pub struct QueryParams<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> axum::extract::FromRequestParts<S>
    for QueryParams<T>
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| QueryParams(q.0))
            .map_err(|e| ApiError::BadRequest(format!("bad query string: {}", e.body_text())))
    }
}

/// axum's `Path`, but a segment that cannot be taken (not UTF-8 once
/// percent-decoded, say `%FF`) is a `400` in the JSON envelope, not axum's
/// plain text.
pub struct PathParams<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> axum::extract::FromRequestParts<S>
    for PathParams<T>
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| PathParams(p.0))
            .map_err(|e| ApiError::BadRequest(format!("bad path: {}", e.body_text())))
    }
}

/// Parses a UUID path segment naming `what` ("a job", "an ROI", "a pipeline
/// run", ...) with a message that says which.
pub fn parse_id(raw: &str, what: &str) -> Result<uuid::Uuid, ApiError> {
    raw.parse()
        .map_err(|_| ApiError::BadRequest(format!("`{raw}` is not {what} id (a UUID)")))
}

/// Parses JSON with an error that says where and what.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize(de) {
        Ok(v) => Ok(v),
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let at = format!("line {} column {}", inner.line(), inner.column());
            Err(match inner.classify() {
                serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                    ApiError::BadRequest(format!("malformed JSON at {at}: {inner}"))
                }
                _ => {
                    let field = if path == "." {
                        String::new()
                    } else {
                        format!(" at `{path}`")
                    };
                    ApiError::Invalid {
                        message: format!("invalid request{field}: {inner}"),
                        detail: Some(serde_json::json!({ "path": path })),
                    }
                }
            })
        }
    }
}

/// How much of an oversize body we read and throw away before answering
/// 413. Answering while the client is still sending makes most clients see
/// a reset connection instead of our message; past this, we do close.
const DRAIN_LIMIT: usize = 64 << 20;

/// Reads the body up to `limit` bytes; an oversize body is drained (up to
/// [`DRAIN_LIMIT`]) so the client reads the 413 that names the limit.
async fn read_limited(req: Request, limit: usize) -> Result<Vec<u8>, ApiError> {
    let mut stream = req.into_body().into_data_stream();
    let mut buf = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|_| ApiError::BadRequest("could not read the request body".into()))?;
        seen += chunk.len();
        if seen <= limit {
            buf.extend_from_slice(&chunk);
        } else if seen > DRAIN_LIMIT {
            break;
        }
    }
    if seen > limit {
        return Err(ApiError::PayloadTooLarge(format!(
            "request body is larger than {limit} bytes"
        )));
    }
    Ok(buf)
}
