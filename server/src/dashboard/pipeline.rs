//! `/ui/pipelines` and `/ui/pipelines/{id}`: pipeline runs, and one run's
//! item × step matrix (each cell linked to its job and log), kept live by
//! patching cells from server-sent events instead of redrawing the page.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use flotilla_core::api::pipelines::{PipelineSummary, PipelineView};
use futures::Stream;
use serde::Deserialize;
use uuid::Uuid;

use super::{csrf, not_found_page, render, session, streams, to_login};
use crate::error::{ApiError, ApiResult};
use crate::extract::parse_id;
use crate::pipelines::read;
use crate::state::AppState;

/// Rows (items) on one page of the matrix.
const ROWS_PER_PAGE: u32 = 500;

/// How often a live page is brought up to date.
const REFRESH: Duration = Duration::from_secs(1);

struct RunRow {
    id: String,
    name: String,
    state: &'static str,
    done: u64,
    active: u64,
    waiting: u64,
    failed: u64,
    items: String,
    percent: u64,
    created: String,
}

#[derive(Template)]
#[template(path = "pipelines.html")]
struct ListPage {
    runs: Vec<RunRow>,
    show_logout: bool,
}

fn run_row(s: PipelineSummary) -> RunRow {
    let total = s.items.unwrap_or(0);
    RunRow {
        id: s.id.to_string(),
        name: s.name,
        state: s.state.as_str(),
        done: s.counts.done,
        active: s.counts.active,
        waiting: s.counts.waiting,
        failed: s.counts.failed + s.counts.cancelled,
        items: s.items.map_or("?".into(), |n| n.to_string()),
        percent: (s.counts.done * 100).checked_div(total).unwrap_or(0),
        created: super::utc(s.created_at),
    }
}

/// `GET /ui/pipelines`: the runs a viewer may see (a client's session its
/// own, as the API has it).
pub async fn list(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Response> {
    let Some(who) = session::who(&state, &headers).await? else {
        return Ok(to_login());
    };
    let runs = read::list(&state.db, who.own_only(), None, 100).await?;
    Ok(render(&ListPage {
        runs: runs.into_iter().map(run_row).collect(),
        show_logout: !state.settings.dashboard_open,
    })?
    .into_response())
}

struct Column {
    name: String,
    kind: String,
    host: String,
    running: u64,
    succeeded: u64,
    failed: u64,
    mean: String,
}

struct Cell {
    state: String,
    href: String,
    title: String,
}

struct ItemLine {
    item: String,
    state: String,
    cells: Vec<Cell>,
    error: String,
}

#[derive(Template)]
#[template(path = "pipeline.html")]
struct RunPage {
    run: RunRow,
    error: String,
    final_state: bool,
    columns: Vec<Column>,
    gates: Vec<(u32, u64)>,
    rows: Vec<ItemLine>,
    after: String,
    next: Option<u64>,
    show_logout: bool,
    /// The session's form token, for Cancel.
    csrf: String,
}

#[derive(Deserialize)]
pub struct Page {
    after: Option<u64>,
}

fn cells(view: &PipelineView) -> Vec<ItemLine> {
    view.rows
        .iter()
        .map(|r| ItemLine {
            item: r.item.clone(),
            state: r.state.clone(),
            cells: view
                .steps
                .iter()
                .zip(&r.cells)
                .map(|(step, c)| match c {
                    Some(c) => Cell {
                        state: c.state.clone(),
                        href: c.job_id.map_or(String::new(), |j| format!("/ui/jobs/{j}")),
                        title: format!("{} {}: {}", r.item, step.name, c.state),
                    },
                    None => Cell {
                        state: "none".into(),
                        href: String::new(),
                        title: format!("{} {}: not there", r.item, step.name),
                    },
                })
                .collect(),
            error: r.error.clone().unwrap_or_default(),
        })
        .collect()
}

/// Run `id` (a path segment) if `who` may see it; another owner's run is as
/// absent as an unknown one, or an id that is none.
async fn visible_run(state: &AppState, who: &session::Who, id: &str) -> ApiResult<Option<Uuid>> {
    let Ok(id) = parse_id(id, "a pipeline run") else {
        return Ok(None);
    };
    let owner = read::owner(&state.db, id).await?;
    Ok(owner.is_some_and(|owner| who.may_see(owner)).then_some(id))
}

pub async fn page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<Page>,
) -> ApiResult<Response> {
    let Some(who) = session::who(&state, &headers).await? else {
        return Ok(to_login());
    };
    let Some(id) = visible_run(&state, &who, &id).await? else {
        return Ok(not_found_page());
    };
    let Some(view) = read::get(&state.db, id, q.after, ROWS_PER_PAGE).await? else {
        return Ok(not_found_page());
    };
    let rows = cells(&view);
    let columns = view
        .steps
        .iter()
        .map(|s| Column {
            name: s.name.clone(),
            kind: s.kind.clone(),
            host: s.host.clone(),
            running: s.running,
            succeeded: s.succeeded,
            failed: s.failed,
            mean: s.mean_s.map_or("-".into(), |m| format!("{m:.1} s")),
        })
        .collect();
    let gates = view.gates.iter().map(|g| (g.limit, g.inside)).collect();
    let final_state = view.summary.state.is_final();
    let error = view.summary.error.clone().unwrap_or_default();
    Ok(render(&RunPage {
        run: run_row(view.summary),
        error,
        final_state,
        columns,
        gates,
        rows,
        after: q.after.map_or(String::new(), |a| a.to_string()),
        next: view.next_after,
        show_logout: !state.settings.dashboard_open,
        csrf: who.csrf,
    })?
    .into_response())
}

/// `POST /ui/pipelines/{id}/cancel` (a form with the session's token):
/// cancels the run as `POST /api/v1/pipelines/{id}/cancel` does (its open
/// items, and every job of it that has not ended), then back to its page.
pub async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let who = match csrf::check_post(&state, &headers, &body).await? {
        Ok(who) => who,
        Err(answer) => return Ok(answer),
    };
    let Some(id) = visible_run(&state, &who, &id).await? else {
        return Ok(not_found_page());
    };
    match crate::pipelines::cancel(&state.db, id).await? {
        crate::pipelines::RunCancel::NotFound => return Ok(not_found_page()),
        // Already over (the page was old): its page says how it ended.
        crate::pipelines::RunCancel::Cancelled { .. }
        | crate::pipelines::RunCancel::AlreadyFinal(_) => {}
    }
    // As the API's cancel: the engine looks at the run now.
    state.parents_signal.wake(id);
    tracing::info!(run = %id, "pipeline run cancelled from the dashboard");
    Ok(axum::response::Redirect::to(&format!("/ui/pipelines/{id}")).into_response())
}

/// `state` events (JSON: counts, columns, this page's cells) whenever
/// something changed, and an `end` event once the run is final; ends too
/// when the viewer's session does.
pub async fn events(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<Page>,
) -> ApiResult<Response> {
    let Some(who) = session::who(&state, &headers).await? else {
        return Ok(StatusCode::UNAUTHORIZED.into_response());
    };
    let id = parse_id(&id, "a pipeline run")?;
    if !read::owner(&state.db, id)
        .await?
        .is_some_and(|owner| who.may_see(owner))
    {
        return Err(ApiError::NotFound(format!("no pipeline run {id}")));
    }
    Ok(streams::answer(state, who, move |state, viewer| {
        run_events(state, viewer, id, q.after)
    }))
}

/// A run page's live state as JSON (counts, columns, this page's cells)
/// and whether the run is final; `None` if the run is gone.
async fn page_state(
    state: &AppState,
    id: Uuid,
    after: Option<u64>,
) -> Result<Option<(bool, Arc<String>)>, sqlx::Error> {
    let Some(view) = read::get(&state.db, id, after, ROWS_PER_PAGE).await? else {
        return Ok(None);
    };
    let data = serde_json::json!({
        "state": view.summary.state.as_str(),
        "final": view.summary.state.is_final(),
        "counts": view.summary.counts,
        "items": view.summary.items,
        "steps": view.steps,
        "gates": view.gates,
        "rows": view.rows.iter().map(|r| serde_json::json!({
            "state": r.state,
            "cells": r.cells.iter().map(|c| c.as_ref().map(|c| {
                serde_json::json!([c.state, c.job_id])
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    Ok(Some((
        view.summary.state.is_final(),
        Arc::new(data.to_string()),
    )))
}

fn run_events(
    state: AppState,
    viewer: session::Viewer,
    id: Uuid,
    after: Option<u64>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let checked = tokio::time::Instant::now();
    futures::stream::unfold(
        (state, String::new(), false, checked),
        move |(state, last, ended, mut checked)| {
            let viewer = viewer.clone();
            async move {
                if ended {
                    return None;
                }
                loop {
                    tokio::select! {
                        _ = state.shutdown.cancelled() => return None,
                        _ = tokio::time::sleep(REFRESH) => {}
                    }
                    if checked.elapsed() >= session::RECHECK {
                        if !viewer.still_allowed(&state).await {
                            return None;
                        }
                        checked = tokio::time::Instant::now();
                    }
                    let shared = state
                        .live_pages
                        .pipelines
                        .get((id, after), || page_state(&state, id, after))
                        .await;
                    let Ok(Some((final_state, data))) = shared else {
                        continue;
                    };
                    let data = data.to_string();
                    if data != last {
                        return Some((
                            Ok(Event::default().event("state").data(data.clone())),
                            // The end event follows on the next turn.
                            (state, data, false, checked),
                        ));
                    }
                    if final_state {
                        return Some((
                            Ok(Event::default().event("end").data("final")),
                            (state, last, true, checked),
                        ));
                    }
                }
            }
        },
    )
}
