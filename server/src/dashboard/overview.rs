//! `/ui`: job counts by state, the agents and the latest jobs, pushed anew
//! over server-sent events while the page is open. A client's session sees
//! its own jobs' counts and latest jobs (as the API shows it only those);
//! an admin's, every job.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use askama::Template;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use flotilla_core::api::{AgentView, JobView};
use flotilla_core::job::JobState;
use futures::Stream;

use super::{render, session, streams, to_login};
use crate::error::ApiResult;
use crate::queue::read;
use crate::state::AppState;

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
    /// Whether it is the panel every admin sees (a client's own shows no
    /// steering it cannot do).
    admin: bool,
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
        kinds: a
            .kinds
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        encoder,
        encoder_note,
        disk_full: a.disk_nearly_full,
    }
}

fn job_row(j: JobView) -> JobRow {
    let what = j.summary(120);
    JobRow {
        short_id: super::short_id(j.id),
        id: j.id.to_string(),
        state: j.state.as_str(),
        attempt: format!("{}/{}", j.attempt, j.max_attempts),
        agent: j.agent.unwrap_or_default(),
        submitter: j.submitter,
        created: super::utc(j.created_at),
        progress: j
            .progress
            .filter(|p| p.total > 0)
            .map(|p| 100.0 * p.done as f64 / p.total as f64),
        what,
    }
}

/// The panel for the jobs of `owner` (`None`: all jobs).
async fn overview_body(state: &AppState, owner: Option<uuid::Uuid>) -> ApiResult<String> {
    let counts = read::counts(&state.db, owner).await?;
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
    let jobs = read::list(&state.db, None, owner, 50)
        .await?
        .into_iter()
        .map(job_row)
        .collect();
    Ok(render(&OverviewBody {
        total,
        states,
        agents,
        jobs,
        admin: owner.is_none(),
    })?
    .0)
}

pub async fn page(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Response> {
    let Some(who) = session::who(&state, &headers).await? else {
        return Ok(to_login());
    };
    let body = overview_body(&state, who.own_only()).await?;
    Ok(render(&OverviewPage {
        body,
        show_logout: !state.settings.dashboard_open,
    })?
    .into_response())
}

/// Pushes the overview whenever it changed, looking every two seconds
/// while the page is open (the first look always sends, so a reconnect
/// catches up); the panel is rendered once per interval for every open tab
/// of one owner (all admins share one). The page patches what differs.
/// Ends when the session does (logout, expiry, its token revoked), within
/// [`session::RECHECK`].
pub async fn events(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let who = match session::who(&state, &headers).await {
        Ok(Some(who)) => who,
        Ok(None) => return StatusCode::UNAUTHORIZED.into_response(),
        Err(e) => return e.into_response(),
    };
    let owner = who.own_only();
    streams::answer(state, who, move |state, viewer| {
        overview_events(state, viewer, owner)
    })
}

/// The overview's events for `viewer`, whose lists are `owner`'s.
fn overview_events(
    state: AppState,
    viewer: session::Viewer,
    owner: Option<uuid::Uuid>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let checked = tokio::time::Instant::now();
    let sent: Option<Arc<String>> = None;
    futures::stream::unfold(
        (state, viewer, checked, sent),
        move |(state, viewer, mut checked, mut sent)| async move {
            loop {
                tokio::select! {
                    _ = state.shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
                if checked.elapsed() >= session::RECHECK {
                    if !viewer.still_allowed(&state).await {
                        return None;
                    }
                    checked = tokio::time::Instant::now();
                }
                let shared = state
                    .live_pages
                    .overview
                    .get(owner, || async {
                        overview_body(&state, owner).await.map(Arc::new)
                    })
                    .await;
                let event = match shared {
                    Ok(html) => {
                        if sent
                            .as_ref()
                            .is_some_and(|s| Arc::ptr_eq(s, &html) || **s == *html)
                        {
                            continue;
                        }
                        let event = Event::default()
                            .event("overview")
                            .data(html.replace('\r', ""));
                        sent = Some(html);
                        event
                    }
                    Err(_) => Event::default().comment("database unavailable"),
                };
                return Some((Ok::<_, Infallible>(event), (state, viewer, checked, sent)));
            }
        },
    )
}
