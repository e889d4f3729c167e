//! `/ui/jobs/{id}`: one job — state, attempts, outputs to download, its
//! spec, cancel and retry — and its log, streamed over server-sent events
//! as it grows.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use askama::Template;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Redirect, Response};
use flotilla_core::api::AttemptView;
use flotilla_core::job::{JobSpec, JobState};
use futures::{Stream, TryStreamExt};
use serde::Deserialize;
use uuid::Uuid;

use super::session::Who;
use super::{csrf, render, session, streams, to_login};
use crate::error::{ApiError, ApiResult};
use crate::extract::parse_id;
use crate::queue::cancel::{self, Cancelled};
use crate::queue::{logs, read};
use crate::state::AppState;

/// The most log lines the page shows (its newest) and one live update
/// carries: a runaway log must not make a page of hundreds of megabytes.
const LOG_LINES_SHOWN: i64 = 2_000;

struct OutputRow {
    name: String,
    /// Its download address.
    href: String,
    key: String,
    size: u64,
    /// `size` as people read it: "1.8 MB".
    size_text: String,
    sha256: String,
}

/// A byte count in decimal units, three figures at most.
fn size_text(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["kB", "MB", "GB", "TB", "PB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64;
    let mut unit = "B";
    for u in UNITS {
        // 999.5 and up would print as 1000.
        if v < 999.5 {
            break;
        }
        v /= 1000.0;
        unit = u;
    }
    if v < 10.0 {
        format!("{v:.1} {unit}")
    } else {
        format!("{v:.0} {unit}")
    }
}

struct AttemptRow {
    attempt: u32,
    agent: String,
    started: String,
    finished: String,
    duration: String,
    outcome: String,
    exit_code: String,
    error: String,
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    id: String,
    state: &'static str,
    final_state: bool,
    kind: String,
    attempt: String,
    /// The attempt's number alone, for the live stream's `attempt`.
    attempt_no: u32,
    agent: String,
    exit_code: String,
    submitter: String,
    priority: i32,
    labels: String,
    created: String,
    started: String,
    finished: String,
    error: String,
    cancel_requested: bool,
    spec: String,
    attempts: Vec<AttemptRow>,
    outputs: Vec<OutputRow>,
    /// Whether the page offers Cancel (not final yet) and Retry (a failed
    /// or cancelled command job not retried yet).
    can_cancel: bool,
    can_retry: bool,
    /// The job this one retries, and the one that retries it.
    retry_of: Option<Uuid>,
    retried_as: Option<Uuid>,
    csrf: String,
    log: String,
    last_seq: i64,
    /// What made the job, to link: (what, href). `None` for a command job.
    part_of: Option<(String, String)>,
    /// A tile job's phases, from its result: "fetch 2.1 s · encode …".
    phases: String,
    /// Why a queued or retrying job waits, when something other than a
    /// free slot holds it; empty otherwise.
    waiting: String,
    show_logout: bool,
}

/// Why waiting job `id` waits, if not for a free slot: no registered agent
/// could take it (the class's reason), or every one that could is silent,
/// paused, draining or drained.
async fn why_waiting(state: &AppState, id: Uuid, unmatchable: Option<&str>) -> ApiResult<String> {
    if let Some(why) = unmatchable {
        return Ok(format!("No agent can take it: {why}."));
    }
    let (able, ready) =
        crate::agents::able_to_take(&state.db, id, state.settings.heartbeat_interval).await?;
    Ok(match (able, ready) {
        (0, _) => String::new(),
        (n, 0) => format!(
            "{n} registered agent{} could take it, but none is answering, active and with \
             disk room: start one, resume it on the agents page, or free its disk.",
            if n == 1 { "" } else { "s" }
        ),
        _ => String::new(),
    })
}

/// The run, region or pipeline a job was made for, as (text, link).
async fn part_of(
    state: &AppState,
    id: Uuid,
    spec: &JobSpec,
) -> ApiResult<Option<(String, String)>> {
    Ok(match spec {
        JobSpec::Command(_) => None,
        JobSpec::Tile(t) => crate::tiles::progress::roi_of_job(&state.db, id)
            .await?
            .map(|(roi, name)| {
                (
                    format!("ROI {name} (tile {})", t.tile),
                    format!("/ui/rois/{roi}"),
                )
            }),
        JobSpec::Step(_) => read::parent(&state.db, id).await?.map(|run| {
            (
                format!("pipeline run {run}"),
                format!("/ui/pipelines/{run}"),
            )
        }),
        JobSpec::Revdeps(_) => {
            let run = match read::parent(&state.db, id).await? {
                Some(run) => Some(run),
                None => crate::revdeps::read::run_of_plan_job(&state.db, id).await?,
            };
            run.map(|run| (format!("revdeps run {run}"), format!("/ui/revdeps/{run}")))
        }
    })
}

/// A tile job's phases as its agent reported them in the result.
fn phases(result: Option<&serde_json::Value>) -> String {
    let Some(result) = result else {
        return String::new();
    };
    [
        ("checkpoint", "checkpoint_s"),
        ("fetch", "fetch_s"),
        ("encode", "encode_s"),
        ("upload", "upload_s"),
    ]
    .iter()
    .filter_map(|(what, key)| result[key].as_f64().map(|s| format!("{what} {s:.1} s")))
    .collect::<Vec<_>>()
    .join(" · ")
}

fn attempt_row(a: AttemptView) -> AttemptRow {
    AttemptRow {
        attempt: a.attempt,
        agent: a.agent.unwrap_or_default(),
        started: a.started_at.map_or("-".into(), super::utc),
        finished: a.finished_at.map_or("-".into(), super::utc),
        duration: a
            .duration_s
            .map_or("running".into(), |d| format!("{d:.1} s")),
        outcome: a.outcome.unwrap_or_default(),
        exit_code: a.exit_code.map_or("-".into(), |c| c.to_string()),
        error: a.error.unwrap_or_default(),
    }
}

/// `name` as a path under `/ui/jobs/{id}/outputs/`: each `/`-separated
/// part percent-encoded but for the unreserved characters.
fn output_path(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The job `id` if `who` may see it: `404` if there is none, `Err(page)`
/// (a `403` page) if it is another token's and `who` is a client.
async fn visible(state: &AppState, who: &Who, id: Uuid) -> ApiResult<Result<(), Response>> {
    let owner = read::owner(&state.db, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no job {id}")))?;
    if who.may_see(owner) {
        Ok(Ok(()))
    } else {
        Ok(Err(csrf::refused(
            state,
            format!("Job {id} belongs to another token: a client sees only its own jobs."),
        )))
    }
}

pub async fn page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let Some(who) = session::who(&state, &headers).await? else {
        return Ok(to_login());
    };
    let id = parse_id(&id, "a job")?;
    if let Err(refused) = visible(&state, &who, id).await? {
        return Ok(refused);
    }
    let j = read::detail(&state.db, id)
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
    // As the live stream shows it (an event cannot carry a CR, which ends
    // an SSE line): the page read the same before and after its reload.
    log.retain(|c| c != '\r');
    let last_seq = rows.last().map_or(0, |r| r.seq);
    let part_of = part_of(&state, id, &j.spec).await?;
    let phases = match j.spec {
        JobSpec::Tile(_) => phases(j.result.as_ref()),
        _ => String::new(),
    };
    let waiting = match j.state {
        JobState::Queued | JobState::Retrying => {
            why_waiting(&state, id, j.unmatchable.as_deref()).await?
        }
        _ => String::new(),
    };
    Ok(render(&JobPage {
        id: id.to_string(),
        state: j.state.as_str(),
        final_state: j.state.is_final(),
        kind: j.kind.to_string(),
        attempt: format!("{}/{}", j.attempt, j.max_attempts),
        attempt_no: j.attempt,
        agent: j.agent.clone().unwrap_or_default(),
        exit_code: j.exit_code.map_or("-".into(), |c| c.to_string()),
        submitter: j.submitter.clone(),
        priority: j.priority,
        labels: j
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", "),
        created: super::utc(j.created_at),
        started: j.started_at.map_or("-".into(), super::utc),
        finished: j.finished_at.map_or("-".into(), super::utc),
        error: j.error.clone().unwrap_or_default(),
        cancel_requested: j.cancel_requested,
        // Secret values are for the submitter and admins, through the API.
        spec: serde_json::to_string_pretty(&j.spec.clone().redacted()).unwrap_or_default(),
        attempts: j
            .attempts
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(attempt_row)
            .collect(),
        outputs: j
            .outputs
            .into_iter()
            .map(|o| OutputRow {
                href: format!("/ui/jobs/{id}/outputs/{}", output_path(&o.name)),
                name: o.name,
                key: o.key,
                size: o.size,
                size_text: size_text(o.size),
                sha256: o.sha256,
            })
            .collect(),
        can_cancel: !j.state.is_final() && !j.cancel_requested,
        can_retry: matches!(j.state, JobState::Failed | JobState::Cancelled)
            && matches!(j.spec, JobSpec::Command(_))
            && j.retried_as.is_none(),
        retry_of: j.retry_of,
        retried_as: j.retried_as,
        csrf: who.csrf,
        log,
        last_seq,
        part_of,
        phases,
        waiting,
        show_logout: !state.settings.dashboard_open,
    })?
    .into_response())
}

#[derive(Deserialize)]
pub struct After {
    #[serde(default)]
    after: i64,
    /// The state and attempt the page shows: a stream that sees the job
    /// elsewhere says so (`changed`) and the page reloads.
    state: Option<JobState>,
    attempt: Option<i32>,
}

/// New log lines as they arrive; an `end` event once the job is final, a
/// `changed` one once its state or attempt is no longer the page's.
pub async fn log_stream(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<After>,
) -> ApiResult<Response> {
    let Some(who) = session::who(&state, &headers).await? else {
        return Ok(StatusCode::UNAUTHORIZED.into_response());
    };
    let id = parse_id(&id, "a job")?;
    if let Err(refused) = visible(&state, &who, id).await? {
        return Ok(refused);
    }
    // A reconnecting browser says where it was (the id of the last event
    // it got), which is later than the page's `after`.
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok())
        .map_or(q.after, |seen| seen.max(q.after));
    let prev = logs::attempt_before(&state.db, id, after).await?;
    let shown = q.state.zip(q.attempt);
    Ok(streams::answer(state, who, move |state, viewer| {
        log_events(state, viewer, id, after, prev, shown)
    }))
}

/// New log lines of job `id` after line `after`; ends once the job is
/// final, once its state or attempt is no longer `shown` (the page's
/// header), or when the viewer's session does (within [`session::RECHECK`]).
fn log_events(
    state: AppState,
    viewer: session::Viewer,
    id: uuid::Uuid,
    after: i64,
    prev: Option<i32>,
    shown: Option<(JobState, i32)>,
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
                    let tick = state
                        .live_pages
                        .logs
                        .get((id, after), || next_tick(&state, id, after))
                        .await;
                    let Ok(tick) = tick else {
                        continue;
                    };
                    // The header is out of date (queued -> running, a
                    // retry, the next attempt): the page reloads, which
                    // shows the log up to now too. A final state waits
                    // for the last lines and `end`.
                    if let (Some(seen), Some(now)) = (shown, tick.stage) {
                        if seen != now && !now.0.is_final() {
                            return Some((
                                Ok(Event::default().event("changed").data(format!(
                                    "{} {}",
                                    now.0.as_str(),
                                    now.1
                                ))),
                                (state, after, prev, true, checked),
                            ));
                        }
                    }
                    let rows = &tick.rows;
                    if let Some(last) = rows.last().map(|r| r.seq) {
                        let mut text = String::new();
                        let prev = logs::render(rows, prev, &mut text);
                        // Each line ends in a newline, the last one too,
                        // which the event keeps: a trailing blank line is
                        // a line, and a batch of one blank line is data
                        // ("\n"), where an empty string would be an event
                        // browsers never deliver.
                        let data = text.replace('\r', "");
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
                    // No lines left: a final state read before them is
                    // the end.
                    if let Some((st, _)) = tick.stage.filter(|(s, _)| s.is_final()) {
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

/// What a job page's stream shows next after line `after`: the lines that
/// follow it and the job's state and attempt. Shared by every tab at that
/// position ([`super::shared::LivePages::logs`]). The state is read first:
/// lines read after it include every line written before it ended.
async fn next_tick(
    state: &AppState,
    id: uuid::Uuid,
    after: i64,
) -> Result<Arc<super::shared::LogTick>, sqlx::Error> {
    let stage = read::stage(&state.db, id).await?;
    let rows = logs::page(&state.db, id, after, LOG_LINES_SHOWN).await?;
    Ok(Arc::new(super::shared::LogTick { rows, stage }))
}

/// `POST /ui/jobs/{id}/cancel` (a form with the session's token): cancels
/// the job as `POST /api/v1/jobs/{id}/cancel` does, then back to its page.
pub async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let who = match csrf::check_post(&state, &headers, &body).await? {
        Ok(who) => who,
        Err(answer) => return Ok(answer),
    };
    let id = parse_id(&id, "a job")?;
    if let Err(refused) = visible(&state, &who, id).await? {
        return Ok(refused);
    }
    match cancel::cancel(&state.db, id).await? {
        Cancelled::NotFound => return Err(ApiError::NotFound(format!("no job {id}"))),
        Cancelled::Now => state.wake_parent_of(id).await,
        // Already over (the page was old): its page says how it ended.
        Cancelled::Requested | Cancelled::AlreadyFinal(_) => {}
    }
    tracing::info!(job = %id, "cancelled from the dashboard");
    Ok(Redirect::to(&format!("/ui/jobs/{id}")).into_response())
}

/// `POST /ui/jobs/{id}/retry` (a form with the session's token): queues a
/// failed or cancelled command job again as a new job, as
/// `POST /api/v1/jobs/{id}/retry` does, and shows the new job.
pub async fn retry(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let who = match csrf::check_post(&state, &headers, &body).await? {
        Ok(who) => who,
        Err(answer) => return Ok(answer),
    };
    let id = parse_id(&id, "a job")?;
    if let Err(refused) = visible(&state, &who, id).await? {
        return Ok(refused);
    }
    let (owner, submitter, cap) = who.submitting(&state);
    let new = match crate::queue::retry::requeue(&state.db, id, owner, submitter, cap).await {
        Ok(new) => new,
        // A second click, or another operator's: the retry there is.
        Err(crate::queue::retry::RetryError::AlreadyRetried { retry, .. }) => retry,
        Err(e) => return Err(e.into()),
    };
    Ok(Redirect::to(&format!("/ui/jobs/{new}")).into_response())
}

/// `GET /ui/jobs/{id}/outputs/{name}`: an output of the job's successful
/// attempt, streamed from the object store as a download.
pub async fn output(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, name)): Path<(String, String)>,
) -> ApiResult<Response> {
    let Some(who) = session::who(&state, &headers).await? else {
        return Ok(to_login());
    };
    let id = parse_id(&id, "a job")?;
    if let Err(refused) = visible(&state, &who, id).await? {
        return Ok(refused);
    }
    let job = read::get(&state.db, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no job {id}")))?;
    let Some(out) = job.outputs.into_iter().find(|o| o.name == name) else {
        return Ok(super::not_found_page());
    };
    let got = match state
        .store
        .get(&object_store::path::Path::from(out.key.as_str()))
        .await
    {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Ok(super::not_found_page()),
        Err(e) => return Err(ApiError::Internal(e.into())),
    };
    // The file's own name, with nothing that could end the header value.
    let file = name
        .rsplit('/')
        .next()
        .unwrap_or("output")
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' {
                c
            } else {
                '_'
            }
        })
        .collect::<String>();
    let len = got.meta.size;
    let body = Body::from_stream(got.into_stream().map_err(std::io::Error::other));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{file}\""),
            ),
            (header::CACHE_CONTROL, "private, no-store".to_string()),
        ],
        body,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_say_them() {
        for (n, text) in [
            (0, "0 B"),
            (999, "999 B"),
            (1_000, "1.0 kB"),
            (1_843_328, "1.8 MB"),
            (33_554_432, "34 MB"),
            (999_999_999, "1.0 GB"),
            (4_294_967_296, "4.3 GB"),
        ] {
            assert_eq!(size_text(n), text, "{n}");
        }
    }
}
