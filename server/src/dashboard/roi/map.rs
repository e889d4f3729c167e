//! The ROI page's tile map as geometry: where each 0.1° cell is drawn, in
//! pixels with north up, and a lon/lat graticule whose lines are far enough
//! apart for their labels.

use flotilla_core::grid::TileId;
use flotilla_core::roi::TileSet;

/// Largest drawing, in pixels: fits the page's 1300 px column with room.
const MAX_WIDTH: u32 = 900;
const MAX_HEIGHT: u32 = 640;
/// A cell is drawn at least this big (a map wider than [`MAX_WIDTH`] then
/// scrolls) and at most this big (a three-tile ROI is not a poster).
const MIN_CELL: u32 = 2;
const MAX_CELL: u32 = 40;
/// Graticule lines are at least this far apart, so that labels like
/// `-179.9°W` (≈ 50 px at 11 px type) on every other line do not collide.
const MIN_LINE_GAP: u32 = 40;
/// Line spacings in cells (0.1°): 0.1°, 0.2°, 0.5°, 1°, 2°, 5°, 10°, …
const STEPS: [i32; 11] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000];
/// Room for the latitude labels on the left and longitude labels below.
const LEFT: u32 = 64;
const TOP: u32 = 10;
const RIGHT: u32 = 30;
const BOTTOM: u32 = 24;

/// How the ROI's bounding cells map to pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Westmost column and northmost row of cells.
    ix0: i32,
    iy_top: i32,
    cols: u32,
    rows: u32,
    /// Pixels per cell.
    pub cell: u32,
    /// Graticule spacing in cells.
    step: i32,
    pub width: u32,
    pub height: u32,
}

/// A graticule line and its label.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub x1: u32,
    pub y1: u32,
    pub x2: u32,
    pub y2: u32,
    /// Where the label goes and how it is anchored (`middle` below a
    /// meridian, `end` left of a parallel).
    pub label_x: u32,
    pub label_y: u32,
    pub anchor: &'static str,
    pub label: String,
}

impl Layout {
    /// The layout of `tiles`' bounding box; `None` for no tiles.
    pub fn of(tiles: &TileSet) -> Option<Layout> {
        let rows = tiles.rows();
        let (first, last) = (rows.first()?, rows.last()?);
        let ix0 = rows
            .iter()
            .filter_map(|r| r.spans.first())
            .map(|s| s.0)
            .min()?;
        let ix_end = rows
            .iter()
            .filter_map(|r| r.spans.last())
            .map(|s| s.1)
            .max()?;
        let cols = (ix_end - ix0) as u32;
        let n_rows = (last.iy - first.iy + 1) as u32;
        let cell = (MAX_WIDTH / cols)
            .min(MAX_HEIGHT / n_rows)
            .clamp(MIN_CELL, MAX_CELL);
        let step = STEPS
            .into_iter()
            .find(|s| *s as u32 * cell >= MIN_LINE_GAP)
            .unwrap_or(STEPS[STEPS.len() - 1]);
        Some(Layout {
            ix0,
            iy_top: last.iy,
            cols,
            rows: n_rows,
            cell,
            step,
            width: LEFT + cols * cell + RIGHT,
            height: TOP + n_rows * cell + BOTTOM,
        })
    }

    /// The top-left corner of a tile's square.
    pub fn corner(&self, tile: TileId) -> (u32, u32) {
        (
            LEFT + (tile.ix() - self.ix0) as u32 * self.cell,
            TOP + (self.iy_top - tile.iy()) as u32 * self.cell,
        )
    }

    /// The side of a tile's square: a pixel short of the cell when cells
    /// are big enough to show the gap.
    pub fn side(&self) -> u32 {
        if self.cell >= 6 {
            self.cell - 1
        } else {
            self.cell
        }
    }

    /// The meridians then the parallels at multiples of the step that lie
    /// within the map (its edges included), each labelled in degrees.
    pub fn graticule(&self) -> Vec<Line> {
        let (bottom, right) = (TOP + self.rows * self.cell, LEFT + self.cols * self.cell);
        let mut lines = Vec::new();
        let ix_end = self.ix0 + self.cols as i32;
        let mut k = first_multiple(self.ix0, self.step);
        while k <= ix_end {
            let x = LEFT + (k - self.ix0) as u32 * self.cell;
            lines.push(Line {
                x1: x,
                y1: TOP,
                x2: x,
                y2: bottom,
                label_x: x,
                label_y: bottom + 15,
                anchor: "middle",
                label: degrees(k, self.step, 'E', 'W'),
            });
            k += self.step;
        }
        // Parallels: row iy's south edge is latitude iy/10.
        let iy_south = self.iy_top + 1 - self.rows as i32;
        let mut k = first_multiple(iy_south, self.step);
        while k <= self.iy_top + 1 {
            let y = TOP + (self.iy_top + 1 - k) as u32 * self.cell;
            lines.push(Line {
                x1: LEFT,
                y1: y,
                x2: right,
                y2: y,
                label_x: LEFT - 6,
                label_y: y + 4,
                anchor: "end",
                label: degrees(k, self.step, 'N', 'S'),
            });
            k += self.step;
        }
        lines
    }
}

/// The least multiple of `step` at or above `v`.
fn first_multiple(v: i32, step: i32) -> i32 {
    v.div_euclid(step) * step + if v.rem_euclid(step) == 0 { 0 } else { step }
}

/// `tenths` of a degree written with a hemisphere: one decimal unless the
/// lines are whole degrees apart (`0.1°E`, `52°N`, `3.5°W`, `0°`).
fn degrees(tenths: i32, step: i32, plus: char, minus: char) -> String {
    let abs = tenths.unsigned_abs();
    let number = if step % 10 == 0 {
        format!("{}", abs / 10)
    } else {
        format!("{}.{}", abs / 10, abs % 10)
    };
    match tenths.signum() {
        1 => format!("{number}°{plus}"),
        -1 => format!("{number}°{minus}"),
        _ => format!("{number}°"),
    }
}

#[cfg(test)]
mod tests {
    use flotilla_core::roi::Region;

    use super::*;

    fn bbox(w: f64, s: f64, e: f64, n: f64) -> TileSet {
        Region::from_bbox(w, s, e, n).unwrap().tiles()
    }

    #[test]
    fn a_few_tiles_are_big_with_a_line_every_tenth() {
        // Three tiles in a row at 52.0–52.1°N, 0–0.3°E.
        let l = Layout::of(&bbox(0.01, 52.01, 0.29, 52.09)).unwrap();
        assert_eq!((l.cols, l.rows, l.cell, l.step), (3, 1, MAX_CELL, 1));
        let first = TileId::from_cell(0, 520).unwrap();
        let last = TileId::from_cell(2, 520).unwrap();
        assert_eq!(l.corner(first), (LEFT, TOP));
        assert_eq!(l.corner(last), (LEFT + 80, TOP));
        let labels: Vec<String> = l.graticule().into_iter().map(|g| g.label).collect();
        assert_eq!(
            labels,
            ["0.0°", "0.1°E", "0.2°E", "0.3°E", "52.0°N", "52.1°N"]
        );
    }

    #[test]
    fn north_is_up_and_west_is_left() {
        let l = Layout::of(&bbox(-0.2, -0.2, 0.2, 0.2)).unwrap();
        let sw = TileId::from_point(-0.15, -0.15).unwrap();
        let ne = TileId::from_point(0.15, 0.15).unwrap();
        let (sw, ne) = (l.corner(sw), l.corner(ne));
        assert!(sw.0 < ne.0 && sw.1 > ne.1, "{sw:?} {ne:?}");
        let labels: Vec<String> = l.graticule().into_iter().map(|g| g.label).collect();
        assert!(labels.contains(&"0.2°W".to_string()), "{labels:?}");
        assert!(labels.contains(&"0.2°S".to_string()), "{labels:?}");
    }

    #[test]
    fn big_regions_get_coarser_lines_that_stay_apart() {
        // 14° × 14°: 140 × 140 tiles (19,600) at 4 px a cell.
        let l = Layout::of(&bbox(10.0, 40.0, 24.0, 54.0)).unwrap();
        assert_eq!(l.cell, 4);
        assert_eq!(l.step, 10);
        let lines = l.graticule();
        assert_eq!(lines.len(), 15 + 15);
        assert_eq!(lines[0].label, "10°E");
        assert_eq!(lines[15].label, "40°N");
        for pair in lines[..15].windows(2) {
            assert!(pair[1].x1 - pair[0].x1 >= MIN_LINE_GAP);
        }
        assert!(l.width <= LEFT + MAX_WIDTH + RIGHT);
    }

    #[test]
    fn multiples_round_up() {
        assert_eq!(first_multiple(-7, 5), -5);
        assert_eq!(first_multiple(-10, 5), -10);
        assert_eq!(first_multiple(3, 2), 4);
        assert_eq!(degrees(-1799, 1, 'E', 'W'), "179.9°W");
        assert_eq!(degrees(520, 10, 'N', 'S'), "52°N");
    }
}
