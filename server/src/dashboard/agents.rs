//! `/ui/agents`: the fleet, each agent's last heartbeat marked when it
//! stopped answering, with pause, drain and resume forms for admins.

use askama::Template;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::Utc;
use flotilla_core::api::{AgentState, AgentView};

use super::{csrf, render, session, to_login};
use crate::agents::{self, Steer};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

struct AgentLine {
    name: String,
    state: &'static str,
    /// Silent for three heartbeat intervals (what `online` means).
    stale: bool,
    /// "not answering since …" for a stale agent, empty otherwise.
    silence: String,
    seen: String,
    /// Why the server leases it no new jobs (a full disk), empty if it does
    /// or if its state already says so.
    refused: String,
    slots: String,
    running: u32,
    cpu: String,
    cores: u32,
    memory: String,
    disk: String,
    kinds: String,
    labels: String,
    /// The actions that would change its state.
    actions: Vec<&'static str>,
}

#[derive(Template)]
#[template(path = "agents.html")]
struct AgentsPage {
    agents: Vec<AgentLine>,
    admin: bool,
    csrf: String,
    show_logout: bool,
}

/// How long ago `secs` seconds was, roughly.
pub(super) fn ago(secs: i64) -> String {
    match secs.max(0) {
        s if s < 120 => format!("{s} s ago"),
        s if s < 7_200 => format!("{} min ago", s / 60),
        s if s < 172_800 => format!("{} h ago", s / 3_600),
        s => format!("{} days ago", s / 86_400),
    }
}

fn line(a: AgentView) -> AgentLine {
    let now = Utc::now();
    let seen = a.last_seen_at.map_or("never".to_string(), |t| {
        format!("{} ({})", super::utc(t), ago((now - t).num_seconds()))
    });
    let silence = if a.online {
        String::new()
    } else {
        match a.last_seen_at {
            Some(_) => format!("not answering since {seen}"),
            None => "not answering: never heard from since it registered".to_string(),
        }
    };
    let h = a.health.clone().unwrap_or_default();
    let gib = |b: u64| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64);
    AgentLine {
        actions: match a.state {
            AgentState::Active => vec!["pause", "drain"],
            AgentState::Paused => vec!["resume", "drain"],
            AgentState::Draining | AgentState::Drained => vec!["resume", "pause"],
        },
        state: a.state.as_str(),
        stale: !a.online,
        silence,
        refused: match a.state {
            AgentState::Active => a.lease_refused.clone().unwrap_or_default(),
            _ => String::new(),
        },
        seen,
        slots: format!("{}/{}", a.slots_in_use, a.capacity),
        running: a.running_jobs,
        cpu: h.cpu_model.clone(),
        cores: h.cores,
        memory: gib(h.memory_available_bytes),
        disk: gib(h.disk_free_bytes),
        kinds: a
            .kinds
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        labels: a
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", "),
        name: a.name,
    }
}

pub async fn page(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Response> {
    let Some(who) = session::who(&state, &headers).await? else {
        return Ok(to_login());
    };
    let agents = agents::list(&state.db, state.settings.heartbeat_interval)
        .await?
        .into_iter()
        .map(line)
        .collect();
    Ok(render(&AgentsPage {
        agents,
        admin: who.is_admin(),
        csrf: who.csrf,
        show_logout: !state.settings.dashboard_open,
    })?
    .into_response())
}

/// `POST /ui/agents/{name}/{pause,drain,resume}` (a form with the
/// session's token; admins only): steers the agent as
/// `POST /api/v1/agents/{name}/{action}` does, then back to the page
/// (the agent's own with `?to=agent`).
pub async fn steer(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((name, action)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> ApiResult<Response> {
    let who = match csrf::check_post(&state, &headers, &body).await? {
        Ok(who) => who,
        Err(answer) => return Ok(answer),
    };
    if !who.is_admin() {
        return Ok(csrf::refused(
            &state,
            "Only an admin may pause, drain or resume agents.",
        ));
    }
    let steer = match action.as_str() {
        "pause" => Steer::Pause,
        "drain" => Steer::Drain,
        "resume" => Steer::Resume,
        _ => return Ok(super::not_found_page()),
    };
    agents::steer(&state.db, &name, steer)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no agent named `{name}`")))?;
    if matches!(steer, Steer::Resume) {
        state.job_signal.notify_waiters();
    }
    tracing::info!(agent = %name, action = %action, "agent steered from the dashboard");
    if query.as_deref() == Some("to=agent") {
        // A registered name (steer found it): letters, digits, `-_.` only.
        return Ok(Redirect::to(&format!("/ui/agents/{name}")).into_response());
    }
    Ok(Redirect::to("/ui/agents").into_response())
}
