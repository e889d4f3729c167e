//! The tiles a region covers: a sweep of each row of cells in sub-bands
//! between vertex latitudes, kept as column spans per row ([`TileSet`]).

use std::collections::BTreeMap;

use super::{Polygon, Region};
use crate::grid::{TileId, IX_END, IX_MIN, IY_END, IY_MIN};

/// Tiles as column spans per row: compact (a span per row of a convex
/// region) and ordered by row (south to north), then column (west to east),
/// which is [`TileId`]'s order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TileSet {
    rows: Vec<TileRow>,
}

/// The covered cells of one row of tiles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TileRow {
    /// Cell row: latitudes `iy/10 … (iy+1)/10`.
    pub iy: i32,
    /// Half-open cell-column ranges `(start, end)`, ascending, disjoint and
    /// not adjacent; column `ix` spans longitudes `ix/10 … (ix+1)/10`.
    pub spans: Vec<(i32, i32)>,
}

impl TileSet {
    /// Rows with at least one tile, ascending.
    pub fn rows(&self) -> &[TileRow] {
        &self.rows
    }

    /// Number of tiles.
    pub fn len(&self) -> usize {
        self.rows
            .iter()
            .flat_map(|r| &r.spans)
            .map(|&(a, b)| (b - a) as usize)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Whether `tile` is in the set.
    pub fn contains(&self, tile: TileId) -> bool {
        let Ok(row) = self.rows.binary_search_by_key(&tile.iy(), |r| r.iy) else {
            return false;
        };
        let spans = &self.rows[row].spans;
        let ix = tile.ix();
        // The first span ending after ix is the only one that can hold it.
        let at = spans.partition_point(|&(_, end)| end <= ix);
        spans.get(at).is_some_and(|&(start, _)| start <= ix)
    }

    /// The tiles in order, collected (allocated once, at [`TileSet::len`]).
    pub fn to_vec(&self) -> Vec<TileId> {
        let mut tiles = Vec::with_capacity(self.len());
        tiles.extend(self.iter());
        tiles
    }

    /// The tiles in order (row, then column).
    pub fn iter(&self) -> impl Iterator<Item = TileId> + '_ {
        self.rows.iter().flat_map(|row| {
            row.spans.iter().flat_map(move |&(a, b)| {
                (a..b).map(move |ix| {
                    TileId::from_cell(ix, row.iy)
                        .expect("spans are clamped to the grid when they are built")
                })
            })
        })
    }
}

/// Sorts and merges overlapping or adjacent half-open spans.
fn merge(mut spans: Vec<(i32, i32)>) -> Vec<(i32, i32)> {
    spans.sort_unstable();
    let mut out: Vec<(i32, i32)> = Vec::with_capacity(spans.len());
    for (a, b) in spans {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// A non-horizontal edge in cell units, oriented upwards.
#[derive(Debug, Clone, Copy)]
struct Edge {
    v0: f64,
    v1: f64,
    u0: f64,
    u1: f64,
}

impl Edge {
    /// Column coordinate at row coordinate `v`, clamped to the edge's ends.
    fn u_at(&self, v: f64) -> f64 {
        if v <= self.v0 {
            self.u0
        } else if v >= self.v1 {
            self.u1
        } else {
            self.u0 + (self.u1 - self.u0) * ((v - self.v0) / (self.v1 - self.v0))
        }
    }
}

/// Adds the spans of cells `polygon` covers to `rows`, row by row in
/// sub-bands between vertex latitudes (see the module documentation).
fn sweep(polygon: &Polygon, rows: &mut BTreeMap<i32, Vec<(i32, i32)>>) {
    let mut edges: Vec<Edge> = Vec::new();
    let mut breaks: Vec<f64> = Vec::new();
    for ring in &polygon.rings {
        for pair in ring.windows(2) {
            let (a, b) = (
                [pair[0][0] * 10.0, pair[0][1] * 10.0],
                [pair[1][0] * 10.0, pair[1][1] * 10.0],
            );
            breaks.push(a[1]);
            if a[1] == b[1] {
                // Horizontal edges bound sub-bands whose intervals already
                // reach their ends.
                continue;
            }
            let (lo, hi) = if a[1] < b[1] { (a, b) } else { (b, a) };
            edges.push(Edge {
                v0: lo[1],
                v1: hi[1],
                u0: lo[0],
                u1: hi[0],
            });
        }
    }
    if edges.is_empty() {
        return;
    }
    edges.sort_unstable_by(|a, b| a.v0.total_cmp(&b.v0));
    breaks.sort_unstable_by(f64::total_cmp);
    breaks.dedup();
    let (vmin, vmax) = (breaks[0], breaks[breaks.len() - 1]);
    let first_row = (vmin.floor() as i32).max(IY_MIN);
    let last_row = (vmax.ceil() as i32).min(IY_END); // exclusive

    let mut next_edge = 0; // edges[..next_edge] have entered the sweep
    let mut next_break = 0; // breaks[..next_break] are ≤ the sweep line
    let mut active: Vec<Edge> = Vec::new();
    let mut crossing: Vec<(f64, f64)> = Vec::new(); // (u at ya, u at yb)
    for iy in first_row..last_row {
        let (row_lo, row_hi) = (f64::from(iy), f64::from(iy + 1));
        let mut spans: Vec<(i32, i32)> = Vec::new();
        let mut ya = row_lo;
        while ya < row_hi {
            while next_break < breaks.len() && breaks[next_break] <= ya {
                next_break += 1;
            }
            let yb = breaks.get(next_break).map_or(row_hi, |&b| b.min(row_hi));
            while next_edge < edges.len() && edges[next_edge].v0 <= ya {
                active.push(edges[next_edge]);
                next_edge += 1;
            }
            active.retain(|e| e.v1 > ya);
            // No vertex lies strictly inside (ya, yb), so the active edges all
            // span it and do not cross there: their order at mid-band is
            // their order throughout.
            crossing.clear();
            crossing.extend(active.iter().map(|e| (e.u_at(ya), e.u_at(yb))));
            crossing.sort_unstable_by(|a, b| (a.0 + a.1).total_cmp(&(b.0 + b.1)));
            for pair in crossing.chunks_exact(2) {
                let (left, right) = (pair[0], pair[1]);
                if right.0 <= left.0 && right.1 <= left.1 {
                    continue; // zero width throughout: a spike, not area
                }
                let lo = left.0.min(left.1);
                let hi = right.0.max(right.1);
                // Open (lo, hi) meets open cell (ix, ix+1) iff lo < ix+1 and
                // hi > ix.
                let start = (lo.floor() as i32).max(IX_MIN);
                let end = (hi.ceil() as i32).min(IX_END);
                if start < end {
                    spans.push((start, end));
                }
            }
            ya = yb;
        }
        if !spans.is_empty() {
            rows.entry(iy).or_default().extend(spans);
        }
    }
}

impl Region {
    /// Every tile whose cell's interior meets the region's interior.
    pub fn tiles(&self) -> TileSet {
        let mut rows: BTreeMap<i32, Vec<(i32, i32)>> = BTreeMap::new();
        for polygon in &self.polygons {
            sweep(polygon, &mut rows);
        }
        TileSet {
            rows: rows
                .into_iter()
                .filter_map(|(iy, spans)| {
                    let spans = merge(spans);
                    (!spans.is_empty()).then_some(TileRow { iy, spans })
                })
                .collect(),
        }
    }
}
