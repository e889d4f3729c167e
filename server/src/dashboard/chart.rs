//! Server-rendered SVG line charts over time: the scaling, ticks, gaps and
//! thinning as pure functions, and [`Chart`], what a template draws.
//!
//! Charts are drawn in a fixed [`VIEW_W`] × [`VIEW_H`] viewBox that the page
//! scales to its width, so one chart fits a 390 px phone and a desktop.
//! Values are plotted against wall-clock time in milliseconds.

use chrono::{DateTime, TimeZone, Utc};

/// The viewBox, in its own units.
pub const VIEW_W: f64 = 600.0;
pub const VIEW_H: f64 = 220.0;
/// The plot area inside it: room on the left for the y labels, below for
/// the times.
const LEFT: f64 = 56.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 28.0;

/// Most points one line draws: a day of 30 s samples (2,880) thinned to
/// one per 4 min, still finer than a 600-unit-wide chart can show.
pub const MAX_POINTS: usize = 360;

/// A point: (time in ms since the epoch, value).
pub type Point = (i64, f64);

/// The smallest of 1, 2, 2.5, 5 × 10ⁿ at or above `v`; 1 for nothing to
/// scale (zero, negative, not a number), so an idle series draws flat at 0.
pub fn nice_ceiling(v: f64) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return 1.0;
    }
    let magnitude = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|c| *c >= v * (1.0 - 1e-12))
        .unwrap_or(10.0 * magnitude)
}

/// Maps times and values into the plot area.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    pub t0: i64,
    pub t1: i64,
    pub y_max: f64,
}

impl Scale {
    /// The x of time `t`: `t0` at the left edge of the plot, `t1` at the
    /// right; times outside are clamped to the edges.
    pub fn x(&self, t: i64) -> f64 {
        let span = (self.t1 - self.t0).max(1) as f64;
        let f = ((t - self.t0) as f64 / span).clamp(0.0, 1.0);
        LEFT + f * (VIEW_W - LEFT - RIGHT)
    }

    /// The y of value `v`: 0 at the bottom of the plot, `y_max` at the top;
    /// values outside are clamped (a spike past the axis stays visible).
    pub fn y(&self, v: f64) -> f64 {
        let max = if self.y_max > 0.0 { self.y_max } else { 1.0 };
        let f = (v / max).clamp(0.0, 1.0);
        VIEW_H - BOTTOM - f * (VIEW_H - TOP - BOTTOM)
    }
}

/// At most `max` points: when there are more, consecutive groups of
/// ⌈n / max⌉ are averaged (time and value), so the line keeps its shape.
pub fn thin(points: &[Point], max: usize) -> Vec<Point> {
    if points.len() <= max || max == 0 {
        return points.to_vec();
    }
    let group = points.len().div_ceil(max);
    points
        .chunks(group)
        .map(|c| {
            let n = c.len() as f64;
            let t = c.iter().map(|p| p.0 as f64).sum::<f64>() / n;
            let v = c.iter().map(|p| p.1).sum::<f64>() / n;
            (t.round() as i64, v)
        })
        .collect()
}

/// The points cut into runs wherever two are more than `max_gap_ms` apart:
/// an agent that was down draws a gap, not a line across its silence.
pub fn split_at_gaps(points: &[Point], max_gap_ms: i64) -> Vec<Vec<Point>> {
    let mut runs: Vec<Vec<Point>> = Vec::new();
    for p in points {
        match runs.last_mut() {
            Some(run) if run.last().is_some_and(|q| p.0 - q.0 <= max_gap_ms) => run.push(*p),
            _ => runs.push(vec![*p]),
        }
    }
    runs
}

/// Multiples of `step_ms` within [t0, t1].
pub fn time_ticks(t0: i64, t1: i64, step_ms: i64) -> Vec<i64> {
    if step_ms <= 0 || t1 < t0 {
        return Vec::new();
    }
    let first = t0.div_euclid(step_ms) * step_ms
        + if t0.rem_euclid(step_ms) == 0 {
            0
        } else {
            step_ms
        };
    (0..)
        .map(|i| first + i * step_ms)
        .take_while(|t| *t <= t1)
        .collect()
}

/// A label on an axis: where (x for the time axis, y for values) and what.
#[derive(Debug, Clone)]
pub struct Tick {
    pub at: String,
    pub label: String,
}

/// One drawn run of one series.
#[derive(Debug, Clone)]
pub struct Line {
    /// The series' key (`cpu`, `limit`, …), for styling and for tests.
    pub series: &'static str,
    /// `x,y x,y …` in viewBox units.
    pub points: String,
    /// The values drawn, in the chart's unit (`data-values`, for scripts
    /// and tests that read the chart back).
    pub values: String,
    /// A run of one point, which a polyline does not show: where to draw
    /// it as a dot instead (x, y in viewBox units).
    pub dot: Option<(String, String)>,
}

/// A series to draw: its key, its name in the legend, its points.
pub struct Series {
    pub key: &'static str,
    pub name: String,
    pub points: Vec<Point>,
    /// A level (a limit, a capacity) drawn across the window from its two
    /// ends: one line, never cut at gaps as samples are.
    pub level: bool,
}

/// What a chart's template draws.
#[derive(Debug, Clone)]
pub struct Chart {
    /// The element id (`chart-ID`) and the prefix of its title's ids.
    pub id: &'static str,
    pub title: String,
    /// The y axis's label, with its unit.
    pub y_label: String,
    /// The text alternative: what the lines show, in words.
    pub desc: String,
    pub y_ticks: Vec<Tick>,
    pub x_ticks: Vec<Tick>,
    pub lines: Vec<Line>,
    /// (series key, name) for the legend.
    pub legend: Vec<(&'static str, String)>,
    /// Said under the chart (a limit off the scale, no data).
    pub note: String,
    /// The plot area's corners, for the axes.
    pub x_left: f64,
    pub x_right: f64,
    pub y_top: f64,
    pub y_bottom: f64,
}

/// How to draw one chart.
pub struct Spec<'a> {
    pub id: &'static str,
    pub title: &'a str,
    pub y_label: &'a str,
    /// The top of the y axis; `None`: [`nice_ceiling`] of the largest value.
    pub y_max: Option<f64>,
    /// Formats a value for the ticks and the description.
    pub format: &'a dyn Fn(f64) -> String,
    /// The window drawn, in ms since the epoch.
    pub t0: i64,
    pub t1: i64,
    /// Between time ticks, in ms.
    pub tick_ms: i64,
    /// Points further apart than this (before thinning) are not joined.
    pub max_gap_ms: i64,
}

fn fmt_xy(x: f64, y: f64) -> String {
    format!("{x:.1},{y:.1}")
}

fn clock(t: i64) -> String {
    Utc.timestamp_millis_opt(t)
        .single()
        .map_or_else(String::new, |d: DateTime<Utc>| {
            d.format("%H:%M").to_string()
        })
}

/// Lays out `series` by `spec`.
pub fn build(spec: &Spec<'_>, series: Vec<Series>) -> Chart {
    let largest = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let y_max = spec.y_max.unwrap_or_else(|| nice_ceiling(largest));
    let scale = Scale {
        t0: spec.t0,
        t1: spec.t1,
        y_max,
    };
    let y_ticks = (0..=4)
        .map(|i| {
            let v = y_max * f64::from(i) / 4.0;
            Tick {
                at: format!("{:.1}", scale.y(v)),
                label: (spec.format)(v),
            }
        })
        .collect();
    let x_ticks = time_ticks(spec.t0, spec.t1, spec.tick_ms)
        .into_iter()
        .map(|t| Tick {
            at: format!("{:.1}", scale.x(t)),
            label: clock(t),
        })
        .collect();
    let mut lines = Vec::new();
    let mut said = Vec::new();
    for s in &series {
        let thinned = thin(&s.points, MAX_POINTS);
        // Thinning widens the spacing by its group size; so does the gap.
        let group = s.points.len().div_ceil(MAX_POINTS).max(1) as i64;
        let runs = if s.level {
            vec![thinned]
        } else {
            split_at_gaps(&thinned, spec.max_gap_ms.saturating_mul(group))
        };
        for run in runs {
            lines.push(Line {
                series: s.key,
                points: run
                    .iter()
                    .map(|p| fmt_xy(scale.x(p.0), scale.y(p.1)))
                    .collect::<Vec<_>>()
                    .join(" "),
                values: run
                    .iter()
                    .map(|p| format!("{:.3}", p.1))
                    .collect::<Vec<_>>()
                    .join(" "),
                dot: match run.as_slice() {
                    [p] => Some((
                        format!("{:.1}", scale.x(p.0)),
                        format!("{:.1}", scale.y(p.1)),
                    )),
                    _ => None,
                },
            });
        }
        said.push(describe(&s.name, &s.points, spec.format));
    }
    let desc = if series.iter().all(|s| s.points.is_empty()) {
        "No samples in this window.".to_string()
    } else {
        said.join(" ")
    };
    Chart {
        id: spec.id,
        title: spec.title.to_string(),
        y_label: spec.y_label.to_string(),
        desc,
        y_ticks,
        x_ticks,
        lines,
        legend: series.iter().map(|s| (s.key, s.name.clone())).collect(),
        note: String::new(),
        x_left: LEFT,
        x_right: VIEW_W - RIGHT,
        y_top: TOP,
        y_bottom: VIEW_H - BOTTOM,
    }
}

/// A series in words: its samples, low, high and latest value.
fn describe(name: &str, points: &[Point], format: &dyn Fn(f64) -> String) -> String {
    let Some(last) = points.last() else {
        return format!("{name}: no samples.");
    };
    let (lo, hi) = points
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
            (lo.min(p.1), hi.max(p.1))
        });
    format!(
        "{name}: {} samples, low {}, high {}, latest {} at {} UTC.",
        points.len(),
        format(lo),
        format(hi),
        format(last.1),
        clock(last.0)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_ceiling_rounds_up_to_one_two_two_and_a_half_five() {
        let cases = [
            (0.0, 1.0),
            (-3.0, 1.0),
            (f64::NAN, 1.0),
            (0.7, 1.0),
            (1.0, 1.0),
            (1.01, 2.0),
            (2.2, 2.5),
            (3.0, 5.0),
            (7.0, 10.0),
            (10.0, 10.0),
            (130.0, 200.0),
            (0.031, 0.05),
            (1024.0, 2000.0),
        ];
        for (v, want) in cases {
            let got = nice_ceiling(v);
            assert!(
                (got - want).abs() < 1e-9,
                "nice_ceiling({v}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn scale_maps_the_window_onto_the_plot_area_and_clamps() {
        let s = Scale {
            t0: 1_000,
            t1: 2_000,
            y_max: 50.0,
        };
        assert_eq!(s.x(1_000), LEFT);
        assert_eq!(s.x(2_000), VIEW_W - RIGHT);
        assert_eq!(s.x(1_500), LEFT + (VIEW_W - LEFT - RIGHT) / 2.0);
        assert_eq!(s.x(0), LEFT, "before the window: the left edge");
        assert_eq!(s.y(0.0), VIEW_H - BOTTOM);
        assert_eq!(s.y(50.0), TOP);
        assert_eq!(s.y(25.0), TOP + (VIEW_H - TOP - BOTTOM) / 2.0);
        assert_eq!(s.y(500.0), TOP, "a spike stays on the chart");
        let flat = Scale { y_max: 0.0, ..s };
        assert_eq!(
            flat.y(0.0),
            VIEW_H - BOTTOM,
            "a zero axis does not divide by 0"
        );
    }

    #[test]
    fn thinning_averages_groups_and_keeps_short_series() {
        let pts: Vec<Point> = (0..10).map(|i| (i * 10, i as f64)).collect();
        assert_eq!(thin(&pts, 10), pts);
        let t = thin(&pts, 5);
        assert_eq!(
            t,
            vec![(5, 0.5), (25, 2.5), (45, 4.5), (65, 6.5), (85, 8.5)]
        );
        let t = thin(&pts, 4); // groups of 3: 3 + 3 + 3 + 1
        assert_eq!(t.len(), 4);
        assert_eq!(t[3], (90, 9.0));
        let many: Vec<Point> = (0..2_880).map(|i| (i, 1.0)).collect();
        assert!(thin(&many, MAX_POINTS).len() <= MAX_POINTS);
    }

    #[test]
    fn gaps_longer_than_allowed_split_the_line() {
        let pts = [(0, 1.0), (10, 1.0), (20, 1.0), (100, 1.0), (110, 1.0)];
        let runs = split_at_gaps(&pts, 30);
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].len(), 3);
        assert_eq!(runs[1].len(), 2);
        assert_eq!(split_at_gaps(&pts, 80).len(), 1);
        assert!(split_at_gaps(&[], 10).is_empty());
    }

    #[test]
    fn time_ticks_fall_on_multiples_inside_the_window() {
        assert_eq!(time_ticks(5, 35, 10), vec![10, 20, 30]);
        assert_eq!(time_ticks(10, 30, 10), vec![10, 20, 30]);
        assert_eq!(time_ticks(-15, 5, 10), vec![-10, 0]);
        assert!(time_ticks(0, 10, 0).is_empty());
    }

    #[test]
    fn a_chart_has_one_point_per_sample_and_says_what_it_shows() {
        let pct = |v: f64| format!("{v:.0} %");
        let spec = Spec {
            id: "cpu",
            title: "CPU",
            y_label: "busy, %",
            y_max: Some(100.0),
            format: &pct,
            t0: 0,
            t1: 3_600_000,
            tick_ms: 600_000,
            max_gap_ms: 90_000,
        };
        let points: Vec<Point> = (0..5).map(|i| (i * 30_000, 20.0 * i as f64)).collect();
        let c = build(
            &spec,
            vec![Series {
                key: "cpu",
                name: "busy".into(),
                points,
                level: false,
            }],
        );
        assert_eq!(c.lines.len(), 1);
        assert_eq!(c.lines[0].points.split(' ').count(), 5);
        assert_eq!(c.lines[0].points.split(' ').next(), Some("56.0,192.0"));
        assert_eq!(c.x_ticks.len(), 7, "0, 10, … 60 min");
        assert_eq!(c.y_ticks.len(), 5);
        assert_eq!(c.y_ticks[4].label, "100 %");
        assert!(
            c.desc
                .contains("5 samples, low 0 %, high 80 %, latest 80 %"),
            "{}",
            c.desc
        );
        assert!(
            c.lines[0].dot.is_none(),
            "a line of five is drawn as a line"
        );
        // A lone sample (an agent just registered, or one between gaps) is
        // drawn as a dot where it falls.
        let lone = build(
            &spec,
            vec![Series {
                key: "cpu",
                name: "busy".into(),
                points: vec![(0, 0.0)],
                level: false,
            }],
        );
        assert_eq!(
            lone.lines[0].dot,
            Some(("56.0".to_string(), "192.0".to_string()))
        );
        // A level across the window (an hour, far past the 90 s gap) is
        // one line from end to end, not two dots.
        let limit = build(
            &spec,
            vec![Series {
                key: "limit",
                name: "limit".into(),
                points: vec![(0, 90.0), (3_600_000, 90.0)],
                level: true,
            }],
        );
        assert_eq!(limit.lines.len(), 1);
        assert_eq!(limit.lines[0].points.split(' ').count(), 2);
        assert!(limit.lines[0].dot.is_none());
        let empty = build(&spec, vec![]);
        assert!(empty.lines.is_empty());
        assert_eq!(empty.desc, "No samples in this window.");
    }
}
