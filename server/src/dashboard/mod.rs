//! The browser dashboard: server-rendered HTML (askama templates in
//! `web/templates`), kept live over server-sent events. It reads the same
//! tables as the API. A login (an API token kept in an HttpOnly cookie) is
//! required unless the operator turned it off for a local run.

use std::convert::Infallible;
use std::time::Duration;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use flotilla_core::api::{AgentView, JobView, TokenRole};
use flotilla_core::job::JobState;
use futures::Stream;
use serde::Deserialize;

use crate::error::{ApiError, ApiResult};
use crate::queue::read;
use crate::state::AppState;

const COOKIE: &str = "flotilla_session";

/// Whether the request may see the dashboard.
async fn allowed(state: &AppState, headers: &HeaderMap) -> bool {
    if state.settings.dashboard_open {
        return true;
    }
    let Some(token) = cookie(headers, COOKIE) else {
        return false;
    };
    matches!(
        crate::auth::lookup(state, &token).await,
        Ok(c) if matches!(c.role, TokenRole::Admin | TokenRole::Client)
    )
}

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
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
#[template(path = "login.html")]
struct LoginPage {
    error: Option<String>,
    show_logout: bool,
}

pub async fn login_page() -> ApiResult<Html<String>> {
    render(&LoginPage {
        error: None,
        show_logout: false,
    })
}

#[derive(Deserialize)]
pub struct LoginForm {
    token: String,
}

pub async fn login(
    State(state): State<AppState>,
    Form(form): Form<LoginForm>,
) -> ApiResult<Response> {
    let token = form.token.trim();
    let ok = !token.is_empty()
        && token.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && matches!(
            crate::auth::lookup(&state, token).await,
            Ok(c) if matches!(c.role, TokenRole::Admin | TokenRole::Client)
        );
    if !ok {
        let page = render(&LoginPage {
            error: Some("That token is not a valid admin or client token.".into()),
            show_logout: false,
        })?;
        return Ok((StatusCode::UNAUTHORIZED, page).into_response());
    }
    let cookie = format!("{COOKIE}={token}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=2592000");
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/ui")).into_response())
}

pub async fn logout() -> Response {
    let cookie = format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/ui/login")).into_response()
}

struct StateCount {
    name: &'static str,
    count: i64,
    percent: f64,
}

struct AgentRow {
    name: String,
    state: &'static str,
    online: bool,
    slots: String,
    slot_percent: f64,
    cpu: String,
    cores: u32,
    memory: String,
    disk: String,
    load: String,
    kinds: String,
    /// The tile encoder's backend, and why faster ones are not used.
    encoder: String,
    encoder_note: String,
    disk_full: bool,
}

struct JobRow {
    id: String,
    short_id: String,
    state: &'static str,
    attempt: String,
    agent: String,
    submitter: String,
    created: String,
    progress: Option<f64>,
    what: String,
}

#[derive(Template)]
#[template(path = "overview_body.html")]
struct OverviewBody {
    total: i64,
    states: Vec<StateCount>,
    agents: Vec<AgentRow>,
    jobs: Vec<JobRow>,
}

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage {
    body: String,
    show_logout: bool,
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn agent_row(a: AgentView) -> AgentRow {
    let encoder = a.encoder_backend().unwrap_or("-").to_string();
    let encoder_note = a
        .encoder_unavailable()
        .iter()
        .map(|(b, why)| format!("{b}: {why}"))
        .collect::<Vec<_>>()
        .join("; ");
    let h = a.health.unwrap_or_default();
    AgentRow {
        slot_percent: if a.capacity == 0 {
            0.0
        } else {
            100.0 * a.slots_in_use as f64 / a.capacity as f64
        },
        slots: format!("{}/{}", a.slots_in_use, a.capacity),
        name: a.name,
        state: a.state.as_str(),
        online: a.online,
        cpu: h.cpu_model.clone(),
        cores: h.cores,
        memory: gib(h.memory_available_bytes),
        disk: gib(h.disk_free_bytes),
        load: h.load_1m.map_or("-".into(), |l| format!("{l:.2}")),
        kinds: a.kinds.join(", "),
        encoder,
        encoder_note,
        disk_full: a.disk_nearly_full,
    }
}

fn job_row(j: JobView) -> JobRow {
    let what = j
        .spec
        .get("command")
        .and_then(|c| c.as_str())
        .map(|c| c.chars().take(120).collect())
        .unwrap_or_else(|| j.kind.clone());
    JobRow {
        short_id: j.id.simple().to_string()[..8].to_string(),
        id: j.id.to_string(),
        state: j.state.as_str(),
        attempt: format!("{}/{}", j.attempt, j.max_attempts),
        agent: j.agent.unwrap_or_default(),
        submitter: j.submitter,
        created: j.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
        progress: j
            .progress
            .filter(|p| p.total > 0)
            .map(|p| 100.0 * p.done as f64 / p.total as f64),
        what,
    }
}

async fn overview_body(state: &AppState) -> ApiResult<String> {
    let counts = read::counts(&state.db).await?;
    let total: i64 = counts.iter().map(|(_, n)| n).sum();
    let states = JobState::ALL
        .iter()
        .map(|s| {
            let count = counts
                .iter()
                .find(|(name, _)| name == s.as_str())
                .map_or(0, |(_, n)| *n);
            StateCount {
                name: s.as_str(),
                count,
                percent: if total == 0 {
                    0.0
                } else {
                    100.0 * count as f64 / total as f64
                },
            }
        })
        .collect();
    let agents = crate::agents::list(&state.db, state.settings.heartbeat_interval)
        .await?
        .into_iter()
        .map(agent_row)
        .collect();
    let jobs = read::list(&state.db, None, 50)
        .await?
        .into_iter()
        .map(job_row)
        .collect();
    Ok(render(&OverviewBody {
        total,
        states,
        agents,
        jobs,
    })?
    .0)
}

pub async fn overview(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Response> {
    if !allowed(&state, &headers).await {
        return Ok(to_login());
    }
    let body = overview_body(&state).await?;
    Ok(render(&OverviewPage {
        body,
        show_logout: !state.settings.dashboard_open,
    })?
    .into_response())
}

/// Pushes a fresh overview every two seconds while the page is open.
pub async fn events(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if !allowed(&state, &headers).await {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let stream = futures::stream::unfold(state, |state| async move {
        tokio::select! {
            _ = state.shutdown.cancelled() => return None,
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
        let event = match overview_body(&state).await {
            Ok(html) => Event::default()
                .event("overview")
                .data(html.replace('\r', "")),
            Err(_) => Event::default().comment("database unavailable"),
        };
        Some((Ok::<_, Infallible>(event), state))
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

struct OutputRow {
    name: String,
    key: String,
    size: u64,
    sha256: String,
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    id: String,
    state: &'static str,
    final_state: bool,
    kind: String,
    attempt: String,
    agent: String,
    exit_code: String,
    created: String,
    finished: String,
    error: String,
    spec: String,
    outputs: Vec<OutputRow>,
    log: String,
    last_seq: i64,
    show_logout: bool,
}

pub async fn job(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    if !allowed(&state, &headers).await {
        return Ok(to_login());
    }
    let id = crate::api::parse_id(&id)?;
    let j = read::get(&state.db, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no job {id}")))?;
    let (log, last_seq) = read::log_text(&state.db, id, 0).await?;
    Ok(render(&JobPage {
        id: id.to_string(),
        state: j.state.as_str(),
        final_state: j.state.is_final(),
        kind: j.kind.clone(),
        attempt: format!("{}/{}", j.attempt, j.max_attempts),
        agent: j.agent.clone().unwrap_or_default(),
        exit_code: j.exit_code.map_or("-".into(), |c| c.to_string()),
        created: j.created_at.to_rfc3339(),
        finished: j.finished_at.map_or("-".into(), |t| t.to_rfc3339()),
        error: j.error.clone().unwrap_or_default(),
        spec: serde_json::to_string_pretty(&j.spec).unwrap_or_default(),
        outputs: j
            .outputs
            .into_iter()
            .map(|o| OutputRow {
                name: o.name,
                key: o.key,
                size: o.size,
                sha256: o.sha256,
            })
            .collect(),
        log,
        last_seq,
        show_logout: !state.settings.dashboard_open,
    })?
    .into_response())
}

#[derive(Deserialize)]
pub struct After {
    #[serde(default)]
    after: i64,
}

/// New log lines as they arrive; an `end` event once the job is final.
pub async fn log_stream(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<After>,
) -> ApiResult<Response> {
    if !allowed(&state, &headers).await {
        return Ok(StatusCode::UNAUTHORIZED.into_response());
    }
    let id = crate::api::parse_id(&id)?;
    let stream = log_events(state, id, q.after);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

fn log_events(
    state: AppState,
    id: uuid::Uuid,
    after: i64,
) -> impl Stream<Item = Result<Event, Infallible>> {
    futures::stream::unfold(
        (state, after, false),
        move |(state, after, ended)| async move {
            if ended {
                return None;
            }
            loop {
                tokio::select! {
                    _ = state.shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
                let Ok((text, last)) = read::log_text(&state.db, id, after).await else {
                    continue;
                };
                if !text.is_empty() {
                    let data = text.trim_end_matches('\n').replace('\r', "");
                    return Some((
                        Ok(Event::default().event("lines").data(data)),
                        (state, last, false),
                    ));
                }
                let done =
                    matches!(read::get(&state.db, id).await, Ok(Some(j)) if j.state.is_final());
                if done {
                    return Some((
                        Ok(Event::default().event("end").data("")),
                        (state, after, true),
                    ));
                }
            }
        },
    )
}

pub async fn root() -> Redirect {
    Redirect::to("/ui")
}
