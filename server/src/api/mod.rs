//! The HTTP surface, listed in one router: the REST API under `/api/v1`,
//! the agent protocol under `/api/agent/v1`, `/healthz`, `/metrics` and the
//! dashboard under `/ui`.
//!
//! Each handler has one shape: state, caller, typed path and body (parsed
//! into a `Valid…` type before anything acts), a call into the module that
//! owns the tables, a typed reply from `flotilla_core::api`.
//!
//! - [`jobs`]: submit, show, list, cancel, retry.
//! - [`logs`]: a job's log, streamed whole or in pages.
//! - [`agents`]: list; pause, drain, resume.
//! - [`agent_health`]: an agent's health samples over time.
//! - [`alerts`]: the active alerts.
//! - [`tokens`]: make, list and revoke API and agent tokens.
//! - [`revdeps`]: opam reverse-dependency runs.
//! - [`rois`]: plan and submit regions of interest, follow them.
//! - [`tiles`]: tiles per hour per agent.
//! - [`datasets`]: datasets and their checkpoints.
//! - [`coverage`]: import a geotessera manifest.
//! - [`openapi`]: the OpenAPI document of `/api/v1`, from these handlers.
//! - [`agent_protocol`]: what agents call.
//! - [`tile_inputs`]: a tile job's checkpoint and inputs, for agents.
//! - [`output_uploads`]: outputs agents upload to an S3 store directly.

pub mod agent_health;
pub mod agent_protocol;
pub mod agents;
pub mod alerts;
pub mod coverage;
pub mod datasets;
pub mod jobs;
pub mod logs;
pub mod openapi;
pub mod output_uploads;
pub mod pipelines;
pub mod revdeps;
pub mod rois;
pub mod tile_inputs;
pub mod tiles;
pub mod tokens;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::Router;

use crate::dashboard;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The whole surface. The agent calls that keep leases alive (register,
/// lease, heartbeat, start, log, complete, fail) get `state` with
/// `agent_db` as their pool (`serve::run` says why); an agent's downloads
/// and uploads, which a fleet may start by the hundred at once, use the
/// main pool with everything else.
pub fn router(state: AppState, agent_db: sqlx::PgPool) -> Router {
    let limit = state.settings.max_body_bytes;
    let dashboard_open = state.settings.dashboard_open;
    let agent_state = AppState {
        db: agent_db,
        ..state.clone()
    };
    let agent_calls = Router::new()
        .route("/api/agent/v1/register", post(agent_protocol::register))
        .route("/api/agent/v1/lease", post(agent_protocol::lease))
        .route("/api/agent/v1/heartbeat", post(agent_protocol::heartbeat))
        .route("/api/agent/v1/jobs/{id}/start", post(agent_protocol::start))
        .route("/api/agent/v1/jobs/{id}/log", post(agent_protocol::log))
        .route(
            "/api/agent/v1/jobs/{id}/complete",
            post(agent_protocol::complete),
        )
        .route("/api/agent/v1/jobs/{id}/fail", post(agent_protocol::fail))
        .with_state(agent_state);
    let routes = Router::new()
        .route("/healthz", get(healthz))
        .route("/api/v1/jobs", post(jobs::submit).get(jobs::list))
        .route("/api/v1/jobs/{id}", get(jobs::show))
        .route("/api/v1/jobs/{id}/log", get(logs::text))
        .route("/api/v1/jobs/{id}/cancel", post(jobs::cancel))
        .route("/api/v1/jobs/{id}/retry", post(jobs::retry))
        .route("/api/v1/agents", get(agents::list))
        .route("/api/v1/agents/{name}/{action}", post(agents::steer))
        .route("/api/v1/agents/{name}/health", get(agent_health::history))
        .route("/api/v1/alerts", get(alerts::list))
        .route("/api/v1/tokens", post(tokens::create).get(tokens::list))
        .route("/api/v1/tokens/{id}/revoke", post(tokens::revoke))
        .route("/api/v1/openapi.json", get(openapi::document))
        .route("/api/v1/revdeps", post(revdeps::submit).get(revdeps::list))
        .route("/api/v1/revdeps/{id}", get(revdeps::show))
        .route(
            "/api/v1/pipelines",
            post(pipelines::submit).get(pipelines::list),
        )
        .route("/api/v1/pipelines/{id}", get(pipelines::show))
        .route("/api/v1/pipelines/{id}/cancel", post(pipelines::cancel))
        .route(
            "/api/v1/pipelines/{id}/items/{item}/cancel",
            post(pipelines::cancel_item),
        )
        .route("/api/v1/rois", post(rois::submit).get(rois::list))
        .route("/api/v1/rois/plan", post(rois::plan))
        .route("/api/v1/rois/{id}", get(rois::show))
        .route("/api/v1/tiles/stats", get(tiles::stats))
        .route("/api/v1/datasets", post(datasets::add).get(datasets::list))
        .route(
            "/api/v1/datasets/{name}/checkpoint",
            put(datasets::put_checkpoint).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/api/v1/coverage/import",
            // Spooled to disk with its own limit (tiles::manifest).
            post(coverage::import).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/api/agent/v1/jobs/{id}/checkpoint",
            get(tile_inputs::checkpoint),
        )
        .route(
            "/api/agent/v1/jobs/{id}/inputs/{*file}",
            get(tile_inputs::input),
        )
        .route("/api/agent/v1/jobs/{id}/moved", get(tile_inputs::moved))
        .route(
            "/api/agent/v1/jobs/{id}/outputs/{*name}",
            // Outputs stream to the store; they may be far bigger than JSON.
            put(agent_protocol::upload_output).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/api/agent/v1/jobs/{id}/output-uploads/terms",
            post(output_uploads::terms),
        )
        .route(
            "/api/agent/v1/jobs/{id}/output-uploads",
            post(output_uploads::start),
        )
        .route(
            "/api/agent/v1/jobs/{id}/output-uploads/complete",
            post(output_uploads::complete),
        )
        .route(
            "/api/agent/v1/jobs/{id}/output-uploads/abort",
            post(output_uploads::abort),
        )
        .route("/metrics", get(crate::metrics::metrics))
        .route("/", get(dashboard::root))
        .route("/ui", get(dashboard::overview::page))
        .route("/ui/events", get(dashboard::overview::events))
        .route(
            "/ui/login",
            get(dashboard::session::login_page).post(dashboard::session::login),
        )
        .route("/ui/logout", post(dashboard::session::logout))
        .route("/ui/jobs", get(dashboard::jobs::list))
        .route("/ui/jobs/{id}", get(dashboard::job::page))
        .route("/ui/jobs/{id}/cancel", post(dashboard::job::cancel))
        .route("/ui/jobs/{id}/retry", post(dashboard::job::retry))
        .route("/ui/jobs/{id}/outputs/{*name}", get(dashboard::job::output))
        .route("/ui/agents", get(dashboard::agents::page))
        .route("/ui/agents/{name}", get(dashboard::agent::page))
        .route("/ui/agents/{name}/{action}", post(dashboard::agents::steer))
        .route("/ui/alerts", get(dashboard::alerts::page))
        .route("/ui/alerts.json", get(dashboard::alerts::json))
        .route("/ui/pipelines", get(dashboard::pipeline::list))
        .route("/ui/pipelines/{id}", get(dashboard::pipeline::page))
        .route(
            "/ui/pipelines/{id}/cancel",
            post(dashboard::pipeline::cancel),
        )
        .route(
            "/ui/pipelines/{id}/events",
            get(dashboard::pipeline::events),
        )
        .route("/ui/revdeps", get(dashboard::revdeps::list))
        .route("/ui/revdeps/{id}", get(dashboard::revdeps::page))
        .route(
            "/ui/revdeps/{id}/answer.txt",
            get(dashboard::revdeps::answer),
        )
        .route("/ui/rois", get(dashboard::roi::list))
        .route("/ui/rois/{id}", get(dashboard::roi::page))
        .route("/ui/rois/{id}/events", get(dashboard::roi::events))
        .route("/ui/rois/{id}/again", post(dashboard::roi::again))
        .route("/ui/rois/{id}/tiles/{tile}", get(dashboard::roi::tile))
        .route("/ui/static/{file}", get(dashboard::script))
        .route("/ui/jobs/{id}/log/stream", get(dashboard::job::log_stream))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .merge(agent_calls);
    answer_layers(routes, limit, dashboard_open)
}

/// What every answer passes through, outermost last: the body limit, the
/// panic catcher, a dashboard error as a page, the security headers, the
/// latency metric and the trace.
fn answer_layers(routes: Router, limit: usize, dashboard_open: bool) -> Router {
    routes
        .layer(DefaultBodyLimit::max(limit))
        // A handler that panics answers 500 instead of dropping the
        // connection, which an agent would take for an unreachable server
        // and retry forever: in the JSON error shape (a page under /ui),
        // with the security headers, as every other answer.
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            |_: Box<dyn std::any::Any + Send>| {
                axum::response::IntoResponse::into_response(ApiError::Internal(anyhow::anyhow!(
                    "a request handler panicked"
                )))
            },
        ))
        .layer(axum::middleware::from_fn_with_state(
            dashboard_open,
            dashboard::errors_as_pages,
        ))
        .layer(axum::middleware::map_response(dashboard::security_headers))
        // Latency by route template (metrics::http), outside the panic
        // catcher so that a panic counts as the 500 it answers.
        .layer(axum::middleware::from_fn_with_state(
            crate::metrics::HttpLatency::default(),
            crate::metrics::http::record,
        ))
        .layer(tower_http::trace::TraceLayer::new_for_http())
}

/// 200 once the server can reach PostgreSQL.
async fn healthz(State(state): State<AppState>) -> ApiResult<&'static str> {
    sqlx::query("SELECT 1").execute(&state.db).await?;
    Ok("ok")
}

/// An unknown path: the JSON error under the API, a page under `/ui`.
async fn not_found(uri: axum::http::Uri) -> axum::response::Response {
    use axum::response::IntoResponse;
    if uri.path() == "/ui" || uri.path().starts_with("/ui/") {
        return dashboard::not_found_page().into_response();
    }
    ApiError::NotFound(format!(
        "no such route `{}`; the API lives under /api/v1",
        uri.path()
    ))
    .into_response()
}

/// A known path called with a method it does not take: `405` in the JSON
/// error shape (axum answers with an empty body).
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("`{}` does not take {method}", uri.path()))
}

/// A list read with one row more than `limit` asked for: cut to `limit`,
/// and the next page's cursor (`key` of its last row) if there was more.
pub(crate) fn next_page<T, K>(
    rows: &mut Vec<T>,
    limit: u32,
    key: impl FnOnce(&T) -> K,
) -> Option<K> {
    if rows.len() <= limit as usize {
        return None;
    }
    rows.truncate(limit as usize);
    rows.last().map(key)
}

pub(crate) fn created<T: serde::Serialize>(body: T) -> (StatusCode, axum::Json<T>) {
    (StatusCode::CREATED, axum::Json(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic is a 500 in the error shape every other answer has (a page
    /// under /ui), with the security headers; a dashboard handler's error
    /// is a page naming the problem, the API's stays JSON.
    #[tokio::test]
    async fn errors_and_panics_keep_the_answers_shape_and_headers() {
        async fn boom() -> &'static str {
            panic!("a handler's bug (this test's)")
        }
        async fn bad() -> ApiError {
            ApiError::BadRequest("`x` is not a job id (a UUID)".into())
        }
        let routes = Router::new()
            .route("/api/v1/boom", get(boom))
            .route("/ui/boom", get(boom))
            .route("/api/v1/bad", get(bad))
            .route("/ui/bad", get(bad))
            .route("/ui/alerts.json", get(bad));
        let app = answer_layers(routes, 1024, false);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let http = reqwest::Client::new();
        for (path, status, page, says) in [
            (
                "/api/v1/boom",
                500,
                false,
                "internal error; see the server log",
            ),
            ("/ui/boom", 500, true, "500 Internal Server Error"),
            ("/api/v1/bad", 400, false, "is not a job id (a UUID)"),
            ("/ui/bad", 400, true, "is not a job id (a UUID)"),
            // A script reads it: JSON, whatever its path.
            ("/ui/alerts.json", 400, false, "is not a job id (a UUID)"),
        ] {
            let r = http
                .get(format!("http://{addr}{path}"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), status, "{path}");
            let h = r.headers();
            assert_eq!(h["cache-control"], "no-store", "{path}");
            assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
            assert!(h.contains_key("content-security-policy"), "{path}");
            let kind = h["content-type"].to_str().unwrap().to_string();
            let want = if page {
                "text/html"
            } else {
                "application/json"
            };
            assert!(kind.starts_with(want), "{path}: {kind}");
            let body = r.text().await.unwrap();
            assert!(body.contains(says), "{path}: {body}");
        }
    }

    /// An error page offers "Log out" to a browser with a session cookie,
    /// unless the dashboard is open to all (it has no sessions to end).
    #[tokio::test]
    async fn error_pages_offer_log_out_only_where_there_is_a_session() {
        async fn bad() -> ApiError {
            ApiError::NotFound("no job 0".into())
        }
        for (open, cookie, offered) in [
            (false, true, true),
            (false, false, false),
            (true, true, false),
        ] {
            let routes = Router::new().route("/ui/bad", get(bad));
            let app = answer_layers(routes, 1024, open);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, app).await });
            let mut request = reqwest::Client::new().get(format!("http://{addr}/ui/bad"));
            if cookie {
                request = request.header("cookie", "flotilla_session=abc");
            }
            let body = request.send().await.unwrap().text().await.unwrap();
            assert!(body.contains("no job 0"), "{body}");
            assert_eq!(
                body.contains("action=\"/ui/logout\""),
                offered,
                "open {open}, cookie {cookie}: {body}"
            );
        }
    }
}
