//! `/ui/rois` and `/ui/rois/{id}`: regions of interest, and one ROI's tiles
//! by state, progress, ETA, the agents' tile rates and a map of its tiles
//! (each linked to its job), kept live by patching from server-sent events.

mod map;

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Redirect, Response};
use flotilla_core::api::rois::{RoiState, TileCounts, TileState};
use flotilla_core::api::tiles::AgentTileRate;
use flotilla_core::grid::TileId;
use futures::Stream;
use serde::Deserialize;
use uuid::Uuid;

use super::shared::RoiPageState;
use super::{allowed, not_found_page, render, session, streams, to_login};
use crate::error::ApiResult;
use crate::extract::parse_id;
use crate::state::AppState;
use crate::tiles::progress::{self, Pace, Roi, TileOnMap};
use crate::tiles::stats;

/// The most tiles the map draws. A tile is ≈ 150 bytes of SVG, so 20,000
/// make a 3 MB page that browsers still lay out in well under a second;
/// a larger ROI shows its counts and says why there is no map.
pub const MAP_TILES: usize = 20_000;

/// ROIs on one page of the list.
const ROIS_PER_PAGE: u32 = 50;

/// How often a live page is brought up to date: tiles take seconds to
/// minutes, so a second's precision is not needed.
const REFRESH: Duration = Duration::from_secs(2);

/// The agents' chart: where bars start and their longest length (px).
const BAR_X: u32 = 170;
const BAR_MAX: u32 = 320;
const BAR_ROW: u32 = 26;

struct RoiRow {
    id: String,
    name: String,
    dataset: String,
    year: i32,
    submitter: String,
    state: &'static str,
    done: u64,
    total: u64,
    percent: u64,
    created: String,
}

fn roi_row(
    id: Uuid,
    name: String,
    dataset: String,
    year: i32,
    submitter: String,
    created: chrono::DateTime<chrono::Utc>,
    counts: &TileCounts,
) -> RoiRow {
    RoiRow {
        id: id.to_string(),
        name,
        dataset,
        year,
        submitter,
        state: counts.state().as_str(),
        done: counts.done,
        total: counts.total(),
        percent: percent(counts),
        created: super::utc(created),
    }
}

fn percent(counts: &TileCounts) -> u64 {
    (counts.done * 100).checked_div(counts.total()).unwrap_or(0)
}

#[derive(Template)]
#[template(path = "rois.html")]
struct ListPage {
    rois: Vec<RoiRow>,
    next: Option<String>,
    show_logout: bool,
}

#[derive(Deserialize)]
pub struct ListQuery {
    before: Option<Uuid>,
}

pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> ApiResult<Response> {
    if !allowed(&state, &headers).await {
        return Ok(to_login());
    }
    let page = progress::list(&state.db, q.before, None, ROIS_PER_PAGE).await?;
    let rois = page
        .rois
        .into_iter()
        .map(|r| {
            roi_row(
                r.id,
                r.name,
                r.dataset,
                r.year,
                r.submitter,
                r.created_at,
                &r.tiles,
            )
        })
        .collect();
    Ok(render(&ListPage {
        rois,
        next: page.next.map(|n| n.to_string()),
        show_logout: !state.settings.dashboard_open,
    })?
    .into_response())
}

struct Rect {
    x: u32,
    y: u32,
    state: &'static str,
    href: String,
    name: String,
}

struct MapView {
    width: u32,
    height: u32,
    side: u32,
    rects: Vec<Rect>,
    lines: Vec<map::Line>,
}

/// One agent's bar: measured tiles in the last hour, and what it sustains.
#[derive(serde::Serialize)]
struct AgentBar {
    agent: String,
    x: u32,
    y: u32,
    width: u32,
    value_x: u32,
    text: String,
}

#[derive(Template)]
#[template(path = "roi.html")]
struct RoiPage {
    roi: RoiRow,
    /// What its tile jobs were queued with (and Submit again queues with).
    priority: i32,
    counts: Vec<(&'static str, u64)>,
    eta: String,
    pace: String,
    map: Option<MapView>,
    map_note: String,
    agents: Vec<AgentBar>,
    chart_height: u32,
    show_logout: bool,
    /// Some tiles are missing or failed: "submit again" is offered.
    again: bool,
    csrf: String,
}

/// Bars scaled to the busiest agent of the last hour.
fn agent_bars(rates: &[AgentTileRate]) -> Vec<AgentBar> {
    let most = rates
        .iter()
        .map(|r| r.tiles_last_hour)
        .max()
        .unwrap_or(0)
        .max(1);
    rates
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let width = (r.tiles_last_hour.max(0) as u64 * u64::from(BAR_MAX) / most as u64) as u32;
            let mut text = format!("{} tiles in the last hour", r.tiles_last_hour);
            if r.tiles_per_hour > 0.0 {
                let _ = write!(text, " (sustains {:.0}/h while busy)", r.tiles_per_hour);
            }
            AgentBar {
                agent: r.agent.clone(),
                x: BAR_X,
                y: i as u32 * BAR_ROW,
                width,
                value_x: BAR_X + width + 6,
                text,
            }
        })
        .collect()
}

/// A duration as an operator reads it: `40 s`, `25 min`, `3 h 20 min`,
/// `2 d 4 h`; under a second, `second` (as in "in the last second").
fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => "second".into(),
        1..90 => format!("{s} s"),
        90..5_400 => format!("{} min", (s + 30) / 60),
        5_400..172_800 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

fn eta_text(counts: &TileCounts, pace: &Pace) -> String {
    match pace.eta(counts) {
        Some(Duration::ZERO) => match counts.state() {
            RoiState::Done => "done".into(),
            _ => "nothing queued or running".into(),
        },
        Some(d) => format!("about {}", human(d.max(Duration::from_secs(1)))),
        None => "unknown until one of its tiles finishes".into(),
    }
}

fn pace_text(pace: &Pace) -> String {
    let window = human(pace.window);
    match pace.per_hour() {
        Some(rate) if rate >= 100.0 => {
            format!("{} tiles in the last {window} ({rate:.0}/h)", pace.done)
        }
        Some(rate) => format!("{} tiles in the last {window} ({rate:.1}/h)", pace.done),
        None => format!("no tile in the last {window}"),
    }
}

/// The part of the page every live event carries, as JSON.
fn head(counts: &TileCounts, pace: &Pace, rates: &[AgentTileRate]) -> serde_json::Value {
    serde_json::json!({
        "state": counts.state().as_str(),
        "counts": counts,
        "total": counts.total(),
        "percent": percent(counts),
        "eta": eta_text(counts, pace),
        "pace": pace_text(pace),
        "agents": agent_bars(rates),
    })
}

fn map_view(roi: &Roi, tiles: &[TileOnMap]) -> Option<MapView> {
    let layout = map::Layout::of(&roi.tiles)?;
    let rects = tiles
        .iter()
        .map(|t| {
            let (x, y) = layout.corner(t.tile);
            Rect {
                x,
                y,
                state: t.state.as_str(),
                href: t.job.map_or(String::new(), |j| format!("/ui/jobs/{j}")),
                name: t.tile.name(),
            }
        })
        .collect();
    Some(MapView {
        width: layout.width,
        height: layout.height,
        side: layout.side(),
        rects,
        lines: layout.graticule(),
    })
}

pub async fn page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let Some(who) = session::who(&state, &headers).await? else {
        return Ok(to_login());
    };
    let id = parse_id(&id, "an ROI")?;
    let Some(roi) = progress::get(&state.db, id).await? else {
        return Ok(not_found_page());
    };
    let n = roi.tiles.len();
    let (counts, map, map_note) = if n <= MAP_TILES {
        let tiles = progress::states(&state.db, &roi).await?;
        (
            progress::count(&tiles),
            map_view(&roi, &tiles),
            String::new(),
        )
    } else {
        let note = format!(
            "This ROI has {n} tiles; the map draws at most {MAP_TILES}, so it is not drawn. \
             The counts above are exact."
        );
        (progress::counts(&state.db, &roi).await?, None, note)
    };
    let pace = progress::pace(&state.db, &roi).await?;
    let agents = agent_bars(&stats::rates(&state.db).await?);
    let eta = eta_text(&counts, &pace);
    let pace = pace_text(&pace);
    let again = counts.get(TileState::Missing) + counts.get(TileState::Failed) > 0;
    Ok(render(&RoiPage {
        priority: roi.priority,
        again,
        csrf: who.csrf,
        counts: TileState::ALL
            .iter()
            .map(|s| (s.as_str(), counts.get(*s)))
            .collect(),
        roi: roi_row(
            roi.id,
            roi.name,
            roi.dataset,
            roi.year,
            roi.submitter,
            roi.created_at,
            &counts,
        ),
        eta,
        pace,
        map,
        map_note,
        chart_height: (agents.len() as u32 * BAR_ROW).max(BAR_ROW),
        agents,
        show_logout: !state.settings.dashboard_open,
    })?
    .into_response())
}

/// `POST /ui/rois/{id}/again` (a form with the session's token): submits
/// the ROI's region again, as `flotilla roi submit` with the same name,
/// dataset, year and region would, which queues a job for each of its
/// tiles that is missing or failed; then the new ROI's page.
pub async fn again(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let who = match super::csrf::check_post(&state, &headers, &body).await? {
        Ok(who) => who,
        Err(answer) => return Ok(answer),
    };
    let id = parse_id(&id, "an ROI")?;
    let Some(roi) = progress::get(&state.db, id).await? else {
        return Ok(not_found_page());
    };
    let request = flotilla_core::api::rois::RoiRequest {
        name: roi.name,
        year: roi.year,
        dataset: roi.dataset,
        geojson: roi.region.get("geojson").cloned(),
        bbox: roi
            .region
            .get("bbox")
            .and_then(|b| serde_json::from_value(b.clone()).ok()),
        dry_run: false,
        // Its missing tiles at the priority its tiles were queued with.
        priority: roi.priority,
        // The region was accepted once; past the tile cap only for an admin.
        exceed_tile_cap: who.is_admin(),
    };
    let valid = crate::tiles::plan::ValidRoi::try_from(request)?;
    let (owner, submitter, cap) = who.submitting(&state);
    let made = crate::api::rois::submit_valid(&state, &valid, &submitter, owner, cap).await?;
    tracing::info!(roi = %made.id, from = %id, "ROI submitted again from the dashboard");
    Ok(Redirect::to(&format!("/ui/rois/{}", made.id)).into_response())
}

/// `/ui/rois/{id}/tiles/{tile}`: to the job of one tile of the ROI (the
/// live map links here once a tile's job may have changed).
pub async fn tile(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, tile)): Path<(String, String)>,
) -> ApiResult<Response> {
    if !allowed(&state, &headers).await {
        return Ok(to_login());
    }
    let id = parse_id(&id, "an ROI")?;
    let Ok(tile) = tile.parse::<TileId>() else {
        return Ok(not_found_page());
    };
    let Some(roi) = progress::get(&state.db, id).await? else {
        return Ok(not_found_page());
    };
    if !roi.tiles.contains(tile) {
        return Ok(not_found_page());
    }
    Ok(match progress::tile_job(&state.db, &roi, tile).await? {
        Some(job) => Redirect::to(&format!("/ui/jobs/{job}")).into_response(),
        None => not_found_page(),
    })
}

/// `state` events whenever the page changed: the counts, progress, ETA and
/// agents' bars, and the map's tiles as letters (`m q r d f`, in map
/// order): all of them in a stream's first event, then the changed ones
/// as `[index, letter]`. Ends when the viewer's session does.
pub async fn events(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    // Who, not only whether: the stream caps count by login token.
    let Some(who) = session::who(&state, &headers).await? else {
        return Ok(StatusCode::UNAUTHORIZED.into_response());
    };
    let id = parse_id(&id, "an ROI")?;
    if progress::get(&state.db, id).await?.is_none() {
        return Ok(not_found_page());
    }
    Ok(streams::answer(state, who, move |state, viewer| {
        roi_events(state, viewer, id)
    }))
}

/// An ROI page's live state, computed once per interval for all its tabs;
/// `None` if the ROI is gone.
async fn page_state(state: &AppState, id: Uuid) -> ApiResult<Option<RoiPageState>> {
    let Some(roi) = progress::get(&state.db, id).await? else {
        return Ok(None);
    };
    let (counts, letters) = if roi.tiles.len() <= MAP_TILES {
        let tiles = progress::states(&state.db, &roi).await?;
        let letters = tiles.iter().map(|t| t.state.letter()).collect::<String>();
        (progress::count(&tiles), Some(letters))
    } else {
        (progress::counts(&state.db, &roi).await?, None)
    };
    let pace = progress::pace(&state.db, &roi).await?;
    let rates = stats::rates(&state.db).await?;
    Ok(Some(Arc::new((
        head(&counts, &pace, &rates).to_string(),
        letters,
    ))))
}

/// The map's part of an event: every tile when the stream has sent none,
/// else those that changed since (`None`: nothing did).
fn tiles_json(sent: Option<&str>, now: Option<&str>) -> Option<serde_json::Value> {
    let now = now?;
    let Some(sent) = sent.filter(|s| s.len() == now.len()) else {
        return Some(serde_json::json!({ "all": now }));
    };
    let changed: Vec<serde_json::Value> = sent
        .chars()
        .zip(now.chars())
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, (_, b))| serde_json::json!([i, b.to_string()]))
        .collect();
    (!changed.is_empty()).then(|| serde_json::json!({ "changed": changed }))
}

fn roi_events(
    state: AppState,
    viewer: session::Viewer,
    id: Uuid,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let checked = tokio::time::Instant::now();
    // (state, the last state sent, when the session was last checked)
    let start: (AppState, Option<RoiPageState>, tokio::time::Instant) = (state, None, checked);
    futures::stream::unfold(start, move |(state, sent, mut checked)| {
        let viewer = viewer.clone();
        async move {
            // The first state goes out at once: the page was rendered
            // moments ago, but its tiles may have moved since.
            let mut wait = sent.is_some();
            loop {
                if wait {
                    tokio::select! {
                        _ = state.shutdown.cancelled() => return None,
                        _ = tokio::time::sleep(REFRESH) => {}
                    }
                }
                wait = true;
                if checked.elapsed() >= session::RECHECK {
                    if !viewer.still_allowed(&state).await {
                        return None;
                    }
                    checked = tokio::time::Instant::now();
                }
                let shared = state
                    .live_pages
                    .rois
                    .get(id, || page_state(&state, id))
                    .await;
                let Ok(Some(now)) = shared else {
                    continue;
                };
                if sent.as_ref().is_some_and(|s| Arc::ptr_eq(s, &now)) {
                    continue;
                }
                let old = sent.as_deref();
                let head_changed = old.is_none_or(|o| o.0 != now.0);
                let tiles = tiles_json(old.and_then(|o| o.1.as_deref()), now.1.as_deref());
                if !head_changed && tiles.is_none() {
                    continue;
                }
                let data = format!(
                    "{{\"head\":{},\"tiles\":{}}}",
                    now.0,
                    tiles.unwrap_or(serde_json::Value::Null)
                );
                return Some((
                    Ok(Event::default().event("state").data(data)),
                    (state, Some(now), checked),
                ));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_event_sends_every_tile_then_only_changes() {
        assert_eq!(
            tiles_json(None, Some("mqd")),
            Some(serde_json::json!({ "all": "mqd" }))
        );
        assert_eq!(tiles_json(Some("mqd"), Some("mqd")), None);
        assert_eq!(
            tiles_json(Some("mqd"), Some("mrd")),
            Some(serde_json::json!({ "changed": [[1, "r"]] }))
        );
        assert_eq!(tiles_json(None, None), None);
    }

    #[test]
    fn durations_read_as_an_operator_would() {
        assert_eq!(human(Duration::from_millis(450)), "second");
        assert_eq!(human(Duration::from_secs(40)), "40 s");
        assert_eq!(human(Duration::from_secs(25 * 60)), "25 min");
        assert_eq!(human(Duration::from_secs(3 * 3600 + 20 * 60)), "3 h 20 min");
        assert_eq!(human(Duration::from_secs(52 * 3600)), "2 d 4 h");
    }
}
