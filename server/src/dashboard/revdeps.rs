//! `/ui/revdeps` and `/ui/revdeps/{id}`: opam reverse-dependency runs, and
//! one run's state, plan and shard jobs, timings, answer (with a download)
//! and its difference from an earlier answer for the same target.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use flotilla_core::api::revdeps::{RunState, RunView};
use serde::Deserialize;
use uuid::Uuid;

use super::{allowed, not_found_page, render, to_login};
use crate::error::ApiResult;
use crate::extract::parse_id;
use crate::revdeps::{self, read};
use crate::state::AppState;

/// Runs on one page of the list.
const RUNS_PER_PAGE: u32 = 50;

/// Earlier runs offered for comparison on a run's page.
const EARLIER_RUNS: u32 = 20;

/// Packages of an answer listed on the page; the download has them all.
const ANSWER_LINES: usize = 2_000;

/// "1.2 s", "3 min 4 s": a duration in milliseconds, for people.
fn took(ms: u64) -> String {
    match ms {
        ms if ms < 1_000 => format!("{ms} ms"),
        ms if ms < 60_000 => format!("{:.1} s", ms as f64 / 1_000.0),
        ms => format!("{} min {} s", ms / 60_000, (ms % 60_000) / 1_000),
    }
}

/// Whether a run is still working (its page reloads itself).
fn open(state: RunState) -> bool {
    matches!(state, RunState::Planning | RunState::Solving)
}

struct RunRow {
    id: String,
    target: String,
    compiler: String,
    query: String,
    state: &'static str,
    shards: String,
    answer: String,
    submitter: String,
    created: String,
    took: String,
}

fn run_row(r: read::RunLine) -> RunRow {
    RunRow {
        id: r.id.to_string(),
        target: r.target,
        compiler: r.compiler,
        query: r.query,
        state: r.state.as_str(),
        shards: match r.shards {
            Some(n) => format!("{}/{n}", r.shards_done),
            None => "—".into(),
        },
        answer: match (r.answer_len, r.candidates) {
            (Some(n), _) => format!("{n} packages"),
            (None, Some(c)) => format!("{c} candidates"),
            (None, None) => "—".into(),
        },
        submitter: r.submitter,
        created: super::utc(r.created_at),
        took: r
            .finished_at
            .map(|f| took((f - r.created_at).num_milliseconds().max(0) as u64))
            .unwrap_or_default(),
    }
}

#[derive(Template)]
#[template(path = "revdeps_runs.html")]
struct ListPage {
    runs: Vec<RunRow>,
    next: Option<String>,
    show_logout: bool,
}

#[derive(Deserialize)]
pub struct ListQuery {
    before: Option<Uuid>,
}

/// `GET /ui/revdeps`: runs newest first, paged by cursor.
pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> ApiResult<Response> {
    if !allowed(&state, &headers).await {
        return Ok(to_login());
    }
    let page = read::list(&state.db, q.before, RUNS_PER_PAGE).await?;
    Ok(render(&ListPage {
        runs: page.runs.into_iter().map(run_row).collect(),
        next: page.next.map(|n| n.to_string()),
        show_logout: !state.settings.dashboard_open,
    })?
    .into_response())
}

struct StepRow {
    id: String,
    name: String,
    state: String,
    attempts: i32,
    agent: String,
    took: String,
}

/// The comparison shown on a run's page.
struct Comparison {
    against: String,
    against_created: String,
    added: Vec<String>,
    removed: Vec<String>,
}

#[derive(Template)]
#[template(path = "revdeps_run.html")]
struct RunPage {
    id: String,
    target: String,
    state: &'static str,
    open: bool,
    repo: String,
    query: String,
    variant: Vec<(&'static str, String)>,
    candidates: String,
    shards: String,
    percent: u64,
    timings: Vec<(&'static str, String)>,
    error: Option<String>,
    created: String,
    finished: String,
    steps: Vec<StepRow>,
    answer_len: Option<usize>,
    answer: Vec<String>,
    answer_cut: bool,
    earlier: Vec<(String, String)>,
    comparison: Option<Comparison>,
    show_logout: bool,
}

#[derive(Deserialize)]
pub struct RunQuery {
    /// The earlier run to compare the answer with; the newest earlier
    /// answer of the same target when absent.
    against: Option<Uuid>,
}

fn variant_lines(v: &RunView) -> Vec<(&'static str, String)> {
    let v = &v.variant;
    vec![
        ("compiler", v.compiler.clone()),
        ("arch", v.arch.clone()),
        ("os", v.os.clone()),
        ("os-family", v.os_family.clone()),
        ("os-distribution", v.os_distribution.clone()),
        ("os-version", v.os_version.clone()),
        ("opam-version", v.opam_version.clone()),
        ("missing depexts", missing_depexts_line(v)),
    ]
}

/// What the run took the host to lack: its own list (the first few names
/// and a count), the bundled Debian 12 list, or none.
fn missing_depexts_line(v: &flotilla_core::job::RevdepsVariant) -> String {
    match &v.missing_depexts {
        Some(names) if names.is_empty() => "none (given)".into(),
        Some(names) if names.len() <= 5 => names.join(", "),
        Some(names) => format!("{}, … ({} in all)", names[..5].join(", "), names.len()),
        None if v.is_debian_12() => "Debian 12's (bundled)".into(),
        None => "none: every system package taken as available".into(),
    }
}

fn timing_lines(v: &RunView) -> Vec<(&'static str, String)> {
    let Some(t) = &v.timings else {
        return Vec::new();
    };
    [
        ("reading the repository", t.load_ms),
        ("phase 1 (plan)", t.phase1_ms),
        ("phase 2, all shards", t.phase2_ms_sum),
        ("phase 2, longest shard", t.phase2_ms_max),
        ("submission to answer", t.wall_ms),
    ]
    .into_iter()
    .filter_map(|(name, ms)| ms.map(|ms| (name, took(ms))))
    .collect()
}

/// `GET /ui/revdeps/{id}`.
pub async fn page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<RunQuery>,
) -> ApiResult<Response> {
    if !allowed(&state, &headers).await {
        return Ok(to_login());
    }
    let Ok(id) = parse_id(&id, "a revdeps run") else {
        return Ok(not_found_page());
    };
    let Some(run) = revdeps::get(&state.db, id).await? else {
        return Ok(not_found_page());
    };
    let steps = read::steps(&state.db, run.id, run.plan_job)
        .await?
        .into_iter()
        .map(|s| StepRow {
            id: s.id.to_string(),
            name: match s.shard {
                Some(n) => format!("shard {n}"),
                None => "plan".into(),
            },
            state: s.state,
            attempts: s.attempts,
            agent: s.agent.unwrap_or_default(),
            took: match (s.started_at, s.finished_at) {
                (Some(a), Some(b)) => took((b - a).num_milliseconds().max(0) as u64),
                _ => String::new(),
            },
        })
        .collect();
    let earlier = read::earlier_answers(&state.db, &run.target, run.id, EARLIER_RUNS).await?;
    let comparison = match (&run.result, q.against.or(earlier.first().map(|e| e.0))) {
        (Some(answer), Some(other)) => match revdeps::get(&state.db, other).await? {
            Some(o) if o.target == run.target => o.result.as_ref().map(|old| {
                let (added, removed) = read::diff(old, answer);
                Comparison {
                    against: o.id.to_string(),
                    against_created: super::utc(o.created_at),
                    added,
                    removed,
                }
            }),
            _ => None,
        },
        _ => None,
    };
    let percent = match run.shards {
        Some(n) if n > 0 => (run.shards_done.max(0) as u64 * 100) / n as u64,
        _ if run.state == RunState::Done => 100,
        _ => 0,
    };
    let answer_len = run.result.as_ref().map(Vec::len);
    let answer: Vec<String> = run
        .result
        .iter()
        .flatten()
        .take(ANSWER_LINES)
        .cloned()
        .collect();
    Ok(render(&RunPage {
        id: run.id.to_string(),
        target: run.target.clone(),
        state: run.state.as_str(),
        open: open(run.state),
        repo: run.repo.clone(),
        query: run.query.as_str().to_string(),
        variant: variant_lines(&run),
        candidates: run.candidates.map_or("—".into(), |c| c.to_string()),
        shards: run
            .shards
            .map_or("—".into(), |n| format!("{}/{n} done", run.shards_done)),
        percent,
        timings: timing_lines(&run),
        error: run.error.clone(),
        created: super::utc(run.created_at),
        finished: run.finished_at.map(super::utc).unwrap_or_default(),
        steps,
        answer_cut: answer_len.is_some_and(|n| n > answer.len()),
        answer_len,
        answer,
        // Runs on other compilers or queries look alike by time alone.
        earlier: earlier
            .into_iter()
            .map(|(id, at, compiler, query)| {
                (
                    id.to_string(),
                    format!("{} · {compiler} · {query}", super::utc(at)),
                )
            })
            .collect(),
        comparison,
        show_logout: !state.settings.dashboard_open,
    })?
    .into_response())
}

/// `GET /ui/revdeps/{id}/answer.txt`: the answer, `name.version` a line.
pub async fn answer(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    if !allowed(&state, &headers).await {
        return Ok(to_login());
    }
    let Ok(id) = parse_id(&id, "a revdeps run") else {
        return Ok(not_found_page());
    };
    let Some(RunView {
        result: Some(answer),
        target,
        ..
    }) = revdeps::get(&state.db, id).await?
    else {
        return Ok(not_found_page());
    };
    let mut text = answer.join("\n");
    text.push('\n');
    let file = format!(
        "attachment; filename=\"revdeps-{}.txt\"",
        target.replace(
            |c: char| !c.is_ascii_alphanumeric() && c != '.' && c != '-',
            "_"
        )
    );
    Ok((
        [
            (
                header::CONTENT_TYPE,
                "text/plain; charset=utf-8".to_string(),
            ),
            (header::CONTENT_DISPOSITION, file),
        ],
        text,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::took;

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(took(250), "250 ms");
        assert_eq!(took(1_250), "1.2 s");
        assert_eq!(took(184_000), "3 min 4 s");
    }
}
