//! The browser dashboard: server-rendered HTML (askama templates in
//! `web/templates`), kept live over server-sent events. It reads the same
//! tables as the API. A login (a server-side session, its id in an
//! HttpOnly cookie) is required unless the operator turned it off for a
//! local run.
//!
//! - [`session`]: the login page, the session cookie, logout.
//! - [`overview`]: `/ui`, job counts, agents and recent jobs, pushed anew
//!   over SSE.
//! - [`job`]: `/ui/jobs/{id}`, one job with its log, streamed as it grows.
//! - [`pipeline`]: `/ui/pipelines`, runs, and a run's item × step matrix,
//!   its cells patched live from SSE.
//! - [`shared`]: live page data computed once per interval, whatever the
//!   number of open tabs.
//! - here: what every page shares (rendering, the login check).

pub mod job;
pub mod overview;
pub mod pipeline;
pub mod session;
pub mod shared;

use askama::Template;
use axum::http::HeaderMap;
use axum::response::{Html, IntoResponse, Redirect, Response};

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Whether the request may see the dashboard.
async fn allowed(state: &AppState, headers: &HeaderMap) -> bool {
    session::viewer(state, headers).await.is_some()
}

fn render<T: Template>(t: &T) -> ApiResult<Html<String>> {
    t.render()
        .map(Html)
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("rendering a page: {e}")))
}

fn to_login() -> Response {
    Redirect::to("/ui/login").into_response()
}

#[derive(Template)]
#[template(path = "not_found.html")]
struct NotFoundPage {
    show_logout: bool,
}

/// `404` for an unknown page under `/ui`: a page, not the API's JSON.
pub fn not_found_page() -> Response {
    match (NotFoundPage { show_logout: false }).render() {
        Ok(html) => (axum::http::StatusCode::NOT_FOUND, Html(html)).into_response(),
        Err(e) => ApiError::Internal(anyhow::anyhow!("rendering a page: {e}")).into_response(),
    }
}

pub async fn root() -> Redirect {
    Redirect::to("/ui")
}
