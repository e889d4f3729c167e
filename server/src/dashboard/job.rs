//! `/ui/jobs/{id}`: one job — state, attempt, outputs, its spec — and its
//! log, streamed over server-sent events as it grows.

use std::convert::Infallible;
use std::time::Duration;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Deserialize;

use super::{allowed, render, session, to_login};
use crate::error::{ApiError, ApiResult};
use crate::extract::parse_id;
use crate::queue::{logs, read};
use crate::state::AppState;

/// The most log lines the page shows (its newest) and one live update
/// carries: a runaway log must not make a page of hundreds of megabytes.
const LOG_LINES_SHOWN: i64 = 2_000;

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

pub async fn page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    if !allowed(&state, &headers).await {
        return Ok(to_login());
    }
    let id = parse_id(&id)?;
    let j = read::get(&state.db, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no job {id}")))?;
    let (rows, earlier) = logs::last(&state.db, id, LOG_LINES_SHOWN).await?;
    let mut log = String::new();
    if earlier {
        log.push_str(&format!(
            "[earlier lines not shown: this page shows the last {LOG_LINES_SHOWN}; \
             `flotilla jobs log {id}` prints them all]\n"
        ));
    }
    let prev = match rows.first() {
        Some(first) if earlier => logs::attempt_before(&state.db, id, first.seq - 1).await?,
        _ => None,
    };
    logs::render(&rows, prev, &mut log);
    let last_seq = rows.last().map_or(0, |r| r.seq);
    Ok(render(&JobPage {
        id: id.to_string(),
        state: j.state.as_str(),
        final_state: j.state.is_final(),
        kind: j.kind.to_string(),
        attempt: format!("{}/{}", j.attempt, j.max_attempts),
        agent: j.agent.clone().unwrap_or_default(),
        exit_code: j.exit_code.map_or("-".into(), |c| c.to_string()),
        created: j.created_at.to_rfc3339(),
        finished: j.finished_at.map_or("-".into(), |t| t.to_rfc3339()),
        error: j.error.clone().unwrap_or_default(),
        // Secret values are for the submitter and admins, through the API.
        spec: serde_json::to_string_pretty(&j.spec.clone().redacted()).unwrap_or_default(),
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
    let Some(viewer) = session::viewer(&state, &headers).await else {
        return Ok(StatusCode::UNAUTHORIZED.into_response());
    };
    let id = parse_id(&id)?;
    if read::get(&state.db, id).await?.is_none() {
        return Err(ApiError::NotFound(format!("no job {id}")));
    }
    // A reconnecting browser says where it was (the id of the last event
    // it got), which is later than the page's `after`.
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok())
        .map_or(q.after, |seen| seen.max(q.after));
    let prev = logs::attempt_before(&state.db, id, after).await?;
    let stream = log_events(state, viewer, id, after, prev);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// New log lines of job `id` after line `after`; ends once the job is
/// final, or when the viewer's session does (within [`session::RECHECK`]).
fn log_events(
    state: AppState,
    viewer: session::Viewer,
    id: uuid::Uuid,
    after: i64,
    prev: Option<i32>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let checked = tokio::time::Instant::now();
    futures::stream::unfold(
        (state, after, prev, false, checked),
        move |(state, after, prev, ended, mut checked)| {
            let viewer = viewer.clone();
            async move {
                if ended {
                    return None;
                }
                loop {
                    tokio::select! {
                        _ = state.shutdown.cancelled() => return None,
                        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    }
                    if checked.elapsed() >= session::RECHECK {
                        if !viewer.still_allowed(&state).await {
                            return None;
                        }
                        checked = tokio::time::Instant::now();
                    }
                    let Ok(rows) = logs::page(&state.db, id, after, LOG_LINES_SHOWN).await else {
                        continue;
                    };
                    if let Some(last) = rows.last().map(|r| r.seq) {
                        let mut text = String::new();
                        let prev = logs::render(&rows, prev, &mut text);
                        let data = text.trim_end_matches('\n').replace('\r', "");
                        // The id is the last line's sequence number: a
                        // browser that reconnects sends it back
                        // (`Last-Event-ID`) and gets only what follows.
                        return Some((
                            Ok(Event::default()
                                .event("lines")
                                .id(last.to_string())
                                .data(data)),
                            (state, last, prev, false, checked),
                        ));
                    }
                    let final_state = match read::get(&state.db, id).await {
                        Ok(Some(j)) if j.state.is_final() => Some(j.state),
                        _ => None,
                    };
                    if let Some(st) = final_state {
                        // With data: browsers do not deliver an event
                        // whose data is empty, so the page never learnt
                        // that its job ended.
                        return Some((
                            Ok(Event::default().event("end").data(st.as_str())),
                            (state, after, prev, true, checked),
                        ));
                    }
                }
            }
        },
    )
}
