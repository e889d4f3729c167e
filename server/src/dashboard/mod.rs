//! The browser dashboard: server-rendered HTML (askama templates in
//! `web/templates`), kept live over server-sent events. It reads the same
//! tables as the API. A login (a server-side session, its id in an
//! HttpOnly cookie) is required unless the operator turned it off for a
//! local run.
//!
//! - [`session`]: the login page, the session cookie, logout.
//! - [`overview`]: `/ui`, job counts, agents and recent jobs, pushed anew
//!   over SSE.
//! - [`jobs`]: `/ui/jobs`, every job, filtered and paged by cursor.
//! - [`job`]: `/ui/jobs/{id}`, one job with its attempts, outputs and log
//!   (streamed as it grows); cancel and retry.
//! - [`agents`]: `/ui/agents`, the fleet; pause, drain and resume.
//! - [`agent`]: `/ui/agents/{name}`, one agent and its health over time.
//! - [`chart`]: the SVG line charts the agent page draws.
//! - [`csrf`]: the token every form that changes something carries.
//! - [`pipeline`]: `/ui/pipelines`, runs, and a run's item × step matrix,
//!   its cells patched live from SSE.
//! - [`roi`]: `/ui/rois`, regions of interest, and an ROI's tile map,
//!   counts, ETA and the agents' rates, patched live from SSE.
//! - [`revdeps`]: `/ui/revdeps`, opam reverse-dependency runs, and a run's
//!   steps, answer (downloadable) and its difference from an earlier one.
//! - [`alerts`]: `/ui/alerts` and the JSON every page's alert banner
//!   polls.
//! - [`shared`]: live page data computed once per interval, whatever the
//!   number of open tabs.
//! - [`streams`]: the caps on live streams open at once, per session and
//!   in all.
//! - here: what every page shares (rendering, the login check).

pub mod agent;
pub mod agents;
pub mod alerts;
pub mod chart;
pub mod csrf;
pub mod job;
pub mod jobs;
pub mod overview;
pub mod pipeline;
pub mod revdeps;
pub mod roi;
pub mod session;
pub mod shared;
pub mod streams;

use askama::Template;
use axum::http::{header, HeaderMap};
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

/// The last 8 hex digits of a job id: its random tail, which tells apart
/// jobs made in the same minute (the front of a UUIDv7 is its time).
pub(crate) fn short_id(id: uuid::Uuid) -> String {
    let hex = id.simple().to_string();
    hex[hex.len() - 8..].to_string()
}

/// A moment as every page shows it: to the second, in UTC, saying so.
pub(crate) fn utc(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

fn to_login() -> Response {
    Redirect::to("/ui/login").into_response()
}

#[derive(Template)]
#[template(path = "not_found.html")]
struct NotFoundPage {
    show_logout: bool,
}

/// Marks the dashboard's `404`, which [`errors_as_pages`] renders: it sees
/// the request, so it knows whether to offer "Log out".
#[derive(Clone, Copy)]
struct NotFound;

/// `404` for an unknown page under `/ui`: a page, not the API's JSON
/// (rendered on its way out by [`errors_as_pages`]).
pub fn not_found_page() -> Response {
    let mut response = axum::http::StatusCode::NOT_FOUND.into_response();
    response.extensions_mut().insert(NotFound);
    response
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    status: String,
    message: String,
    show_logout: bool,
}

/// Whether `path` is one of the dashboard's pages (or a form's target)
/// rather than what its scripts read: `/ui/alerts.json` answers JSON to
/// `alerts.js`, and the scripts themselves are no page.
fn is_page(path: &str) -> bool {
    (path == "/ui" || path.starts_with("/ui/"))
        && !path.starts_with("/ui/static/")
        && path != "/ui/alerts.json"
}

/// An error a dashboard handler returned in the API's JSON shape (a
/// malformed id, no such job, a retry past the waiting cap, the database
/// down) becomes a page saying the same, with the same status: a browser
/// showed the raw JSON. Other headers (`Retry-After`) are kept; answers that
/// are not JSON (the event streams' bare `401`, pages) pass as they are.
/// The dashboard's own `404` ([`not_found_page`]) is rendered here too.
/// Either page offers "Log out" where the browser sent a session cookie
/// (and the dashboard is not open to all).
pub async fn errors_as_pages(
    axum::extract::State(dashboard_open): axum::extract::State<bool>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let page = is_page(request.uri().path());
    // An open dashboard has no sessions to end (a cookie left from before
    // it was opened ends nothing either).
    let logged_in = !dashboard_open && session::carries_session(request.headers());
    let response = next.run(request).await;
    if response.extensions().get::<NotFound>().is_some() {
        let (parts, _) = response.into_parts();
        return match render(&NotFoundPage {
            show_logout: logged_in,
        }) {
            Ok(html) => (parts, html).into_response(),
            Err(e) => e.into_response(),
        };
    }
    let status = response.status();
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !page || !json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // The API's error bodies are a message and a little detail; past this
    // the message is not worth waiting for.
    let message = match axum::body::to_bytes(body, 64 * 1024).await {
        Ok(bytes) => serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string)),
        Err(_) => None,
    };
    let page = ErrorPage {
        status: format!(
            "{} {}",
            status.as_u16(),
            status.canonical_reason().unwrap_or("error")
        ),
        message: message.unwrap_or_else(|| "The server could not answer this page.".into()),
        show_logout: logged_in,
    };
    match render(&page) {
        Ok(html) => {
            parts.headers.remove(header::CONTENT_TYPE);
            parts.headers.remove(header::CONTENT_LENGTH);
            (parts, html).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// The pages' scripts, served from the binary: pages carry no inline
/// script, so the Content-Security-Policy can forbid it.
const SCRIPTS: &[(&str, &str)] = &[
    ("alerts.js", include_str!("../../../web/static/alerts.js")),
    ("job.js", include_str!("../../../web/static/job.js")),
    (
        "overview.js",
        include_str!("../../../web/static/overview.js"),
    ),
    (
        "pipeline.js",
        include_str!("../../../web/static/pipeline.js"),
    ),
    ("roi.js", include_str!("../../../web/static/roi.js")),
    ("live.js", include_str!("../../../web/static/live.js")),
];

/// `GET /ui/static/{file}`: one of [`SCRIPTS`].
pub async fn script(axum::extract::Path(file): axum::extract::Path<String>) -> Response {
    match SCRIPTS.iter().find(|(name, _)| *name == file) {
        Some((_, text)) => (
            [
                (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            *text,
        )
            .into_response(),
        None => not_found_page(),
    }
}

/// The policy every response carries: scripts from this server only (no
/// inline script, no eval), styles from it or inline (the pages' own
/// `<style>`), no framing by other sites, no plugins, forms posting here.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self' 'unsafe-inline'; img-src 'self' data:; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Adds the security headers to a response: the CSP, no MIME sniffing,
/// no framing (for browsers without frame-ancestors), no referrer to other
/// sites, and `Cache-Control: no-store` where the handler set none: every
/// page and API answer here is one token's or session's view, which a
/// browser's history (Back after logging out) or a shared cache must not
/// keep (the scripts set their own `no-cache`). `same-origin` rather than `no-referrer`: under `no-referrer` a
/// browser sends `Origin: null` even with a form posted to its own origin,
/// and where it sends no `Sec-Fetch-Site` (plain HTTP to a host other than
/// localhost, older Safari) the login's check against cross-site posts
/// (`csrf::cross_site`) could not tell that form from another site's.
pub async fn security_headers(mut response: Response) -> Response {
    let h = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        if !h.contains_key(&name) {
            h.insert(name, axum::http::HeaderValue::from_static(value));
        }
    }
    response
}

pub async fn root() -> Redirect {
    Redirect::to("/ui")
}
