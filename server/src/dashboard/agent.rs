//! `/ui/agents/{name}`: one agent — what it registered, its last heartbeat,
//! its health over the last hour or day as SVG charts, tiles per hour and
//! job durations — with pause, drain and resume forms for admins.

use std::time::Duration;

use askama::Template;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use flotilla_core::api::{AgentState, AgentView, HealthSample};

use super::chart::{self, Chart, Point, Series, Spec};
use super::{render, session, to_login};
use crate::agent_work::{self, KindDurations};
use crate::error::ApiResult;
use crate::state::AppState;
use crate::{agent_health, agents};

/// The windows the page draws.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Window {
    Hour,
    Day,
}

impl Window {
    /// From the query string: `window=day`, else the last hour.
    fn parse(query: Option<&str>) -> Window {
        let day = query.is_some_and(|q| q.split('&').any(|kv| kv == "window=day"));
        if day {
            Window::Day
        } else {
            Window::Hour
        }
    }

    fn span(self) -> Duration {
        match self {
            Window::Hour => Duration::from_secs(3600),
            Window::Day => Duration::from_secs(24 * 3600),
        }
    }

    /// Between time ticks: 7 ticks an hour, 7 a day.
    fn tick_ms(self) -> i64 {
        match self {
            Window::Hour => 10 * 60_000,
            Window::Day => 4 * 3_600_000,
        }
    }

    /// Tiles are counted per bucket: 12 of 5 min an hour, 24 of 1 h a day.
    fn tile_buckets(self) -> (usize, u32) {
        match self {
            Window::Hour => (12, 300),
            Window::Day => (24, 3600),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Window::Hour => "hour",
            Window::Day => "day",
        }
    }
}

/// The most samples a page reads: a day at the default 30 s interval is
/// 2,880; a shorter interval shows the newest this many.
const MAX_SAMPLES: u32 = 20_000;

/// One job kind's durations, formatted.
struct DurationLine {
    kind: String,
    attempts: u64,
    median: String,
    p90: String,
}

#[derive(Template)]
#[template(path = "agent.html")]
struct AgentPage {
    name: String,
    state: &'static str,
    online: bool,
    /// "not answering since …" when it stopped; empty while it answers.
    silence: String,
    seen: String,
    registered: String,
    version: String,
    slots: String,
    running: u32,
    kinds: String,
    labels: Vec<(String, String)>,
    host: String,
    cpu: String,
    /// The tile encoder's backend as registered ("none" without one).
    encoder_backend: String,
    /// Why each faster backend is not used.
    encoder_unavailable: Vec<(String, String)>,
    /// The encoder's device profile, in words — the spot the encoder
    /// profile (a later change to the registration) fills; empty when the
    /// agent sent none.
    encoder_profile: String,
    /// Why the agent gets no new jobs, if it does not (its state).
    refused: String,
    window: &'static str,
    window_other: &'static str,
    sample_interval: String,
    samples: usize,
    charts: Vec<Chart>,
    durations: Vec<DurationLine>,
    admin: bool,
    csrf: String,
    actions: Vec<&'static str>,
    show_logout: bool,
}

fn when(t: DateTime<Utc>) -> String {
    let ago = super::agents::ago((Utc::now() - t).num_seconds());
    format!("{} ({ago})", super::utc(t))
}

fn seconds(s: f64) -> String {
    match s {
        s if s < 1.0 => format!("{:.0} ms", s * 1000.0),
        s if s < 120.0 => format!("{s:.1} s"),
        s if s < 7200.0 => format!("{:.1} min", s / 60.0),
        s => format!("{:.1} h", s / 3600.0),
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub async fn page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> ApiResult<Response> {
    let Some(who) = session::who(&state, &headers).await? else {
        return Ok(to_login());
    };
    let Some((id, version)) = agents::id_and_version(&state.db, &name).await? else {
        return Ok(super::not_found_page());
    };
    let Some(view) = agents::list(&state.db, state.settings.heartbeat_interval)
        .await?
        .into_iter()
        .find(|a| a.name == name)
    else {
        return Ok(super::not_found_page());
    };
    let window = Window::parse(query.as_deref());
    let now = Utc::now();
    let start = now - chrono::Duration::milliseconds(millis(window.span()));
    let samples = agent_health::newest(&state.db, id, start, MAX_SAMPLES).await?;
    let (buckets, bucket_secs) = window.tile_buckets();
    let tiles = agent_work::tiles_per_bucket(&state.db, id, buckets, bucket_secs).await?;
    let durations = agent_work::durations(&state.db, id, start).await?;
    let sampling = state.settings.health_samples;
    // Samples further apart than three intervals (or heartbeats, if those
    // are rarer) mean the agent was silent: the lines break there.
    let max_gap = 3 * millis(sampling.interval.max(state.settings.heartbeat_interval)) + 1000;
    let frame = Frame {
        t0: start.timestamp_millis(),
        t1: now.timestamp_millis(),
        tick_ms: window.tick_ms(),
        max_gap,
    };
    let charts = vec![
        cpu_chart(&frame, &samples),
        memory_chart(&frame, &samples),
        disk_chart(&frame, &samples),
        fds_chart(&frame, &samples),
        load_chart(&frame, &samples, view.health.as_ref().map(|h| h.cores)),
        tiles_chart(&frame, &tiles, bucket_secs),
    ];
    Ok(render(&AgentPage {
        window: window.name(),
        window_other: match window {
            Window::Hour => "day",
            Window::Day => "hour",
        },
        sample_interval: seconds(sampling.interval.as_secs_f64()),
        samples: samples.len(),
        charts,
        durations: durations.into_iter().map(duration_line).collect(),
        admin: who.is_admin(),
        csrf: who.csrf,
        show_logout: !state.settings.dashboard_open,
        version,
        ..facts(view)
    })?
    .into_response())
}

fn duration_line(d: KindDurations) -> DurationLine {
    DurationLine {
        kind: d.kind,
        attempts: d.attempts,
        median: seconds(d.median),
        p90: seconds(d.p90),
    }
}

/// The page's fields that come from the agent's registration and last
/// heartbeat; the rest are left empty for [`page`] to fill.
fn facts(a: AgentView) -> AgentPage {
    let seen = a.last_seen_at.map_or("never".to_string(), when);
    let silence = match (a.online, a.last_seen_at) {
        (true, _) => String::new(),
        (false, Some(_)) => format!("not answering since {seen}"),
        (false, None) => "not answering: never heard from since it registered".to_string(),
    };
    let encoder = a.devices.encoder.as_ref();
    let h = a.health.clone().unwrap_or_default();
    AgentPage {
        state: a.state.as_str(),
        online: a.online,
        silence,
        seen,
        registered: when(a.registered_at),
        version: String::new(),
        slots: format!("{}/{}", a.slots_in_use, a.capacity),
        running: a.running_jobs,
        kinds: a
            .kinds
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        labels: a.labels.clone().into_iter().collect(),
        host: {
            // sysinfo's long version often names the system again ("linux",
            // "Linux (Debian GNU/Linux 12)"): then it says it alone.
            let version = h.os_version.as_deref().unwrap_or("");
            let os = if version.to_lowercase().starts_with(&h.os.to_lowercase()) {
                version.to_string()
            } else {
                format!("{} {version}", h.os)
            };
            format!("{} ({}), {} cores", os.trim(), h.arch, h.cores)
        },
        cpu: a.devices.cpu.clone().unwrap_or_else(|| h.cpu_model.clone()),
        encoder_backend: encoder.map_or("none (runs no tile jobs)".to_string(), |e| {
            e.backend.clone()
        }),
        encoder_unavailable: encoder
            .map(|e| e.unavailable.clone().into_iter().collect())
            .unwrap_or_default(),
        encoder_profile: encoder
            .and_then(|e| e.profile.as_ref())
            // Settings, and whether tuned here (which file) or the defaults.
            .map(|p| p.summary())
            .unwrap_or_default(),
        refused: match a.state {
            AgentState::Active => String::new(),
            AgentState::Paused => "paused: takes no new jobs until resumed".into(),
            AgentState::Draining => "draining: finishes its jobs, takes no new ones".into(),
            AgentState::Drained => "drained: takes no new jobs until resumed".into(),
        },
        actions: match a.state {
            AgentState::Active => vec!["pause", "drain"],
            AgentState::Paused => vec!["resume", "drain"],
            AgentState::Draining | AgentState::Drained => vec!["resume", "pause"],
        },
        name: a.name,
        window: "hour",
        window_other: "day",
        sample_interval: String::new(),
        samples: 0,
        charts: Vec::new(),
        durations: Vec::new(),
        admin: false,
        csrf: String::new(),
        show_logout: true,
    }
}

/// The time frame every chart of a page shares.
struct Frame {
    t0: i64,
    t1: i64,
    tick_ms: i64,
    max_gap: i64,
}

impl Frame {
    fn spec<'a>(
        &self,
        id: &'static str,
        title: &'a str,
        y_label: &'a str,
        y_max: Option<f64>,
        format: &'a dyn Fn(f64) -> String,
    ) -> Spec<'a> {
        Spec {
            id,
            title,
            y_label,
            y_max,
            format,
            t0: self.t0,
            t1: self.t1,
            tick_ms: self.tick_ms,
            max_gap_ms: self.max_gap,
        }
    }

    /// A horizontal reference line across the frame.
    fn level(&self, key: &'static str, name: String, v: f64) -> Series {
        Series {
            key,
            name,
            points: vec![(self.t0, v), (self.t1, v)],
            level: true,
        }
    }
}

/// One value per sample that has it.
fn series(
    samples: &[HealthSample],
    key: &'static str,
    name: &str,
    value: impl Fn(&HealthSample) -> Option<f64>,
) -> Series {
    Series {
        key,
        name: name.to_string(),
        points: samples
            .iter()
            .filter_map(|s| value(s).map(|v| (s.at.timestamp_millis(), v)))
            .collect(),
        level: false,
    }
}

fn percent(v: f64) -> String {
    format!("{v:.0} %")
}

fn gib(v: f64) -> String {
    if v >= 10.0 || v == 0.0 {
        format!("{v:.0} GiB")
    } else {
        format!("{v:.1} GiB")
    }
}

fn count(v: f64) -> String {
    if v >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn cpu_chart(f: &Frame, samples: &[HealthSample]) -> Chart {
    chart::build(
        &f.spec(
            "cpu",
            "Host CPU",
            "busy, % of all cores",
            Some(100.0),
            &percent,
        ),
        vec![series(samples, "cpu", "CPU busy", |s| {
            s.cpu_busy.map(|b| b * 100.0)
        })],
    )
}

fn memory_chart(f: &Frame, samples: &[HealthSample]) -> Chart {
    const GIB: f64 = (1u64 << 30) as f64;
    let total = samples
        .iter()
        .map(|s| s.memory_total_bytes as f64 / GIB)
        .fold(0.0, f64::max);
    chart::build(
        &f.spec(
            "memory",
            "Memory",
            "GiB",
            Some(chart::nice_ceiling(total)),
            &gib,
        ),
        vec![
            series(samples, "used", "host memory used", |s| {
                Some(s.memory_used_bytes as f64 / GIB)
            }),
            series(samples, "total", "host memory total", |s| {
                Some(s.memory_total_bytes as f64 / GIB)
            }),
            series(samples, "agent", "agent process resident", |s| {
                s.process_resident_bytes.map(|b| b as f64 / GIB)
            }),
        ],
    )
}

fn disk_chart(f: &Frame, samples: &[HealthSample]) -> Chart {
    let full = flotilla_core::health::DISK_FULL_FRACTION * 100.0;
    chart::build(
        &f.spec(
            "disk",
            "Work-directory disk",
            "used, %",
            Some(100.0),
            &percent,
        ),
        vec![
            series(samples, "disk", "disk used", |s| {
                s.disk_used.map(|d| d * 100.0)
            }),
            f.level("threshold", format!("no new jobs above {full:.0} %"), full),
        ],
    )
}

/// The open-files chart scales to the open count; the limit is drawn when
/// it is within 4× of the most open, else named in the note (a limit of a
/// million would flatten a leak from 50 to 500 into the axis).
fn fds_chart(f: &Frame, samples: &[HealthSample]) -> Chart {
    let open = series(samples, "fds", "open files", |s| {
        s.open_fds.map(|n| n as f64)
    });
    let most = open.points.iter().map(|p| p.1).fold(0.0, f64::max);
    let limit = samples
        .iter()
        .rev()
        .find_map(|s| s.max_fds)
        .map(|n| n as f64);
    let mut lines = vec![open];
    let mut note = String::new();
    match limit {
        Some(l) if l <= 4.0 * most.max(1.0) => {
            lines.push(series(samples, "limit", "open-files limit", |s| {
                s.max_fds.map(|n| n as f64)
            }));
        }
        Some(l) => note = format!("The open-files limit, {l:.0}, is off the scale."),
        None => note = "The agent does not report its open-files limit.".to_string(),
    }
    let mut c = chart::build(
        &f.spec("fds", "Agent open files", "descriptors", None, &count),
        lines,
    );
    c.note = note;
    c
}

fn load_chart(f: &Frame, samples: &[HealthSample], cores: Option<u32>) -> Chart {
    let mut lines = vec![series(samples, "load", "load, 1 min", |s| s.load_1m)];
    if let Some(c) = cores.filter(|c| *c > 0) {
        lines.push(f.level("cores", format!("{c} cores"), f64::from(c)));
    }
    chart::build(
        &f.spec(
            "load",
            "Load average",
            "runnable tasks, 1 min",
            None,
            &count,
        ),
        lines,
    )
}

/// Tiles per hour, from the tiles finished in each bucket (plotted at the
/// bucket's middle).
fn tiles_chart(f: &Frame, tiles: &[u64], bucket_secs: u32) -> Chart {
    let width = (f.t1 - f.t0) / tiles.len().max(1) as i64;
    let per_hour = 3600.0 / f64::from(bucket_secs.max(1));
    let points: Vec<Point> = tiles
        .iter()
        .enumerate()
        .map(|(i, n)| (f.t0 + width * i as i64 + width / 2, *n as f64 * per_hour))
        .collect();
    let spec = Spec {
        // Buckets are adjacent: never a gap.
        max_gap_ms: 2 * width,
        ..f.spec("tiles", "Tiles per hour", "tiles / hour", None, &count)
    };
    chart::build(
        &spec,
        vec![Series {
            key: "tiles",
            name: "tiles finished".to_string(),
            points,
            level: false,
        }],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_comes_from_the_query() {
        assert_eq!(Window::parse(None), Window::Hour);
        assert_eq!(Window::parse(Some("window=day")), Window::Day);
        assert_eq!(Window::parse(Some("x=1&window=day")), Window::Day);
        assert_eq!(Window::parse(Some("window=week")), Window::Hour);
    }

    #[test]
    fn tiles_are_plotted_per_hour_at_bucket_middles() {
        let f = Frame {
            t0: 0,
            t1: 3_600_000,
            tick_ms: 600_000,
            max_gap: 1,
        };
        let c = tiles_chart(&f, &[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3], 300);
        assert_eq!(c.lines.len(), 1, "adjacent buckets make one line");
        assert_eq!(c.lines[0].points.split(' ').count(), 12);
        // 3 tiles in 5 min is 36 an hour: the axis tops out at 50.
        assert_eq!(c.y_ticks[4].label, "50");
        assert!(c.desc.contains("high 36"), "{}", c.desc);
    }
}
