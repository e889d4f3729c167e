//! Regions of interest (GeoJSON polygons or a bbox) and the TESSERA tiles they cover.
//!
//! # What is covered
//!
//! A tile is covered when the interior of its 0.1° cell meets the interior of
//! the region — the two overlap with positive area. A region that only
//! touches a cell along its edge or at a corner does not cover it, so the bbox
//! (0, 0, 1, 1) covers exactly 10 × 10 tiles. Coordinates are treated as
//! planar longitude/latitude (as GeoJSON's RFC 7946 does); edges are straight
//! lines in degrees.
//!
//! # How
//!
//! Coordinates are scaled to cell units (`lon·10`, `lat·10`, exact for
//! decimal multiples of 0.1°, so cell edges are integers). Each row of cells is
//! swept in sub-bands between consecutive vertex latitudes; within a sub-band
//! no vertex lies, the edges crossing it keep their order, and pairing them
//! even–odd gives the region's extent, whose union over the sub-band is an
//! interval bounded by the edges' ends. The cells each interval meets are
//! recorded as column spans. Work is proportional to vertices plus rows plus
//! spans, never to the number of tiles, and the result ([`TileSet`]) stores
//! spans, not tiles: a 100° × 100° box (a million tiles) is 1,000 spans.
//!
//! # Validation
//!
//! [`Region::from_geojson`] accepts a Polygon, MultiPolygon, Feature or
//! FeatureCollection of those and names where a problem is as a JSON path
//! (`$.features[2].geometry.coordinates[0][17]`): structure, unsupported
//! types, rings with under four positions or not closed, non-finite or
//! out-of-range coordinates, polygons with no rings or rings of zero area,
//! rings whose edges cross or overlap (their own or another ring's of the same
//! polygon; found with a bucket grid, so tens of thousands of vertices check
//! in milliseconds), holes outside their shell. Rings may touch at single
//! points; winding order is not enforced; polygons of a MultiPolygon may
//! overlap (the region is their union).
//!
//! # Antimeridian
//!
//! A polygon spanning more than 180° of longitude is rejected: RFC 7946
//! (§3.1.9) asks that geometries crossing the antimeridian be cut in two, and
//! an uncut one reads as a polygon going the long way round the globe. Cut it
//! at ±180° into a MultiPolygon. A bbox must have `min_lon ≤ max_lon` for the
//! same reason; a bbox may span up to 360°.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::grid::{TileId, IX_END, IX_MIN, IY_END, IY_MIN};

/// A region: one or more polygons, each an exterior ring and its holes, in
/// degrees. Only [`Region::from_geojson`] and [`Region::from_bbox`] make one,
/// so every `Region` has passed validation.
#[derive(Debug, Clone, PartialEq)]
pub struct Region {
    polygons: Vec<Polygon>,
}

/// One polygon: `rings[0]` is the exterior, the rest are holes. Each ring is
/// closed (its last position repeats its first) and positions are
/// `[lon, lat]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Polygon {
    rings: Vec<Vec<[f64; 2]>>,
}

impl Polygon {
    /// Rings as given: exterior first, then holes; each closed.
    pub fn rings(&self) -> &[Vec<[f64; 2]>] {
        &self.rings
    }
}

/// A problem with a region, with where it is. `at` is a JSON path into the
/// input (`$` is the document; `bbox` for a bbox).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RoiError {
    #[error("invalid JSON: {0}")]
    Json(String),
    #[error("{at}: {problem}")]
    Structure { at: String, problem: String },
    #[error("{at}: unsupported GeoJSON type {kind:?}; expected Polygon or MultiPolygon, or a Feature or FeatureCollection of them")]
    UnsupportedType { at: String, kind: String },
    #[error("{at}: the region has no polygons")]
    Empty { at: String },
    #[error("{at}: polygon has no rings")]
    EmptyPolygon { at: String },
    #[error("{at}: ring has {count} positions; a linear ring needs at least 4 (3 corners and the first repeated)")]
    RingTooShort { at: String, count: usize },
    #[error(
        "{at}: ring is not closed: its first position {first:?} differs from its last {last:?}"
    )]
    RingNotClosed {
        at: String,
        first: [f64; 2],
        last: [f64; 2],
    },
    #[error("{at}: {axis} {value} is not a finite number")]
    NotFinite {
        at: String,
        axis: &'static str,
        value: f64,
    },
    #[error("{at}: {axis} {value} is outside [{min}, {max}]")]
    OutOfRange {
        at: String,
        axis: &'static str,
        value: f64,
        min: f64,
        max: f64,
    },
    #[error("{at}: ring has zero area (its positions are collinear)")]
    ZeroArea { at: String },
    #[error("{at}: ring {ring_a} edge {edge_a} (positions {edge_a}→{}) {how} ring {ring_b} edge {edge_b} (positions {edge_b}→{}) near ({}, {})", edge_a + 1, edge_b + 1, point[0], point[1])]
    SelfIntersection {
        /// The polygon.
        at: String,
        ring_a: usize,
        edge_a: usize,
        ring_b: usize,
        edge_b: usize,
        /// "crosses" or "overlaps".
        how: &'static str,
        /// Where, [lon, lat].
        point: [f64; 2],
    },
    #[error("{at}: hole {ring} lies outside the polygon's exterior ring")]
    HoleOutsideShell { at: String, ring: usize },
    #[error("{at}: polygon spans {span}° of longitude; a polygon crossing the antimeridian must be cut at ±180° into a MultiPolygon (RFC 7946 §3.1.9)")]
    SpansAntimeridian { at: String, span: f64 },
    #[error("bbox: min_{axis} {min} is greater than max_{axis} {max}{}", if *.axis == "lon" { "; a bbox across the antimeridian must be given as two" } else { "" })]
    BboxInverted {
        axis: &'static str,
        min: f64,
        max: f64,
    },
}

fn structure(at: &str, problem: impl Into<String>) -> RoiError {
    RoiError::Structure {
        at: at.to_owned(),
        problem: problem.into(),
    }
}

/// The four numbers of a bbox written `min_lon,min_lat,max_lon,max_lat`
/// (spaces around them allowed), not yet checked as a region.
pub fn parse_bbox(text: &str) -> Result<[f64; 4], RoiError> {
    let numbers: Vec<f64> = text
        .split(',')
        .map(|part| part.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|e| structure("bbox", format!("{text:?}: {e}")))?;
    let [min_lon, min_lat, max_lon, max_lat] = numbers[..] else {
        return Err(structure(
            "bbox",
            format!("{text:?}: expected four numbers min_lon,min_lat,max_lon,max_lat"),
        ));
    };
    Ok([min_lon, min_lat, max_lon, max_lat])
}

impl Region {
    /// Parses GeoJSON text (see [`Region::from_geojson`]).
    pub fn from_geojson_str(text: &str) -> Result<Region, RoiError> {
        let value: Value = serde_json::from_str(text).map_err(|e| RoiError::Json(e.to_string()))?;
        Region::from_geojson(&value)
    }

    /// A region from a GeoJSON Polygon, MultiPolygon, Feature (with one of
    /// those as geometry) or FeatureCollection of such Features, validated
    /// as the module documentation lists.
    pub fn from_geojson(value: &Value) -> Result<Region, RoiError> {
        let mut polygons = Vec::new();
        collect(value, "$", &mut polygons)?;
        if polygons.is_empty() {
            return Err(RoiError::Empty { at: "$".into() });
        }
        Ok(Region { polygons })
    }

    /// A region from a bbox in degrees; each min must not exceed its max and
    /// the box must have area.
    pub fn from_bbox(
        min_lon: f64,
        min_lat: f64,
        max_lon: f64,
        max_lat: f64,
    ) -> Result<Region, RoiError> {
        for (axis, value, limit) in [
            ("min_lon", min_lon, 180.0),
            ("min_lat", min_lat, 90.0),
            ("max_lon", max_lon, 180.0),
            ("max_lat", max_lat, 90.0),
        ] {
            check_coordinate("bbox", axis, value, limit)?;
        }
        for (axis, min, max) in [("lon", min_lon, max_lon), ("lat", min_lat, max_lat)] {
            if min > max {
                return Err(RoiError::BboxInverted { axis, min, max });
            }
        }
        if min_lon == max_lon || min_lat == max_lat {
            return Err(RoiError::ZeroArea { at: "bbox".into() });
        }
        let ring = vec![
            [min_lon, min_lat],
            [max_lon, min_lat],
            [max_lon, max_lat],
            [min_lon, max_lat],
            [min_lon, min_lat],
        ];
        Ok(Region {
            polygons: vec![Polygon { rings: vec![ring] }],
        })
    }

    /// A bbox written `min_lon,min_lat,max_lon,max_lat` (as on a command
    /// line; spaces around the numbers are allowed).
    pub fn from_bbox_str(text: &str) -> Result<Region, RoiError> {
        let [min_lon, min_lat, max_lon, max_lat] = parse_bbox(text)?;
        Region::from_bbox(min_lon, min_lat, max_lon, max_lat)
    }

    /// The polygons, in input order.
    pub fn polygons(&self) -> &[Polygon] {
        &self.polygons
    }

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

/// Walks a GeoJSON object, appending its polygons.
fn collect(value: &Value, at: &str, out: &mut Vec<Polygon>) -> Result<(), RoiError> {
    let object = value
        .as_object()
        .ok_or_else(|| structure(at, "expected a GeoJSON object"))?;
    let kind = object
        .get("type")
        .ok_or_else(|| structure(at, "missing \"type\""))?
        .as_str()
        .ok_or_else(|| structure(&format!("{at}.type"), "expected a string"))?;
    let member = |name: &str| {
        object
            .get(name)
            .ok_or_else(|| structure(at, format!("{kind} has no \"{name}\"")))
    };
    match kind {
        "FeatureCollection" => {
            let features = member("features")?
                .as_array()
                .ok_or_else(|| structure(&format!("{at}.features"), "expected an array"))?;
            for (i, feature) in features.iter().enumerate() {
                let here = format!("{at}.features[{i}]");
                if feature.get("type").and_then(Value::as_str) != Some("Feature") {
                    return Err(structure(&here, "expected a Feature"));
                }
                collect(feature, &here, out)?;
            }
            Ok(())
        }
        "Feature" => {
            let geometry = member("geometry")?;
            let here = format!("{at}.geometry");
            if geometry.is_null() {
                return Err(structure(&here, "feature has no geometry (null)"));
            }
            collect(geometry, &here, out)
        }
        "Polygon" => {
            let here = format!("{at}.coordinates");
            out.push(polygon(member("coordinates")?, &here)?);
            Ok(())
        }
        "MultiPolygon" => {
            let here = format!("{at}.coordinates");
            let polygons = member("coordinates")?
                .as_array()
                .ok_or_else(|| structure(&here, "expected an array of polygons"))?;
            for (i, p) in polygons.iter().enumerate() {
                out.push(polygon(p, &format!("{here}[{i}]"))?);
            }
            Ok(())
        }
        other => Err(RoiError::UnsupportedType {
            at: at.to_owned(),
            kind: other.to_owned(),
        }),
    }
}

fn check_coordinate(at: &str, axis: &'static str, value: f64, limit: f64) -> Result<(), RoiError> {
    if !value.is_finite() {
        return Err(RoiError::NotFinite {
            at: at.to_owned(),
            axis,
            value,
        });
    }
    if value.abs() > limit {
        return Err(RoiError::OutOfRange {
            at: at.to_owned(),
            axis,
            value,
            min: -limit,
            max: limit,
        });
    }
    Ok(())
}

/// Parses and validates one polygon's coordinates (an array of rings).
fn polygon(value: &Value, at: &str) -> Result<Polygon, RoiError> {
    let rings_json = value
        .as_array()
        .ok_or_else(|| structure(at, "expected an array of linear rings"))?;
    if rings_json.is_empty() {
        return Err(RoiError::EmptyPolygon { at: at.to_owned() });
    }
    let mut rings = Vec::with_capacity(rings_json.len());
    for (r, ring_json) in rings_json.iter().enumerate() {
        rings.push(ring(ring_json, &format!("{at}[{r}]"))?);
    }
    let polygon = Polygon { rings };
    let (west, east) = polygon.rings[0]
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(w, e), p| {
            (w.min(p[0]), e.max(p[0]))
        });
    if east - west > 180.0 {
        return Err(RoiError::SpansAntimeridian {
            at: at.to_owned(),
            span: east - west,
        });
    }
    crossing::check(&polygon, at)?;
    for (r, hole) in polygon.rings.iter().enumerate().skip(1) {
        // Rings do not cross (checked above), so any hole vertex off the
        // shell's boundary tells which side the whole hole is on.
        let outside = hole
            .iter()
            .find_map(|&p| crossing::point_in_ring(p, &polygon.rings[0]))
            .is_some_and(|inside| !inside);
        if outside {
            return Err(RoiError::HoleOutsideShell {
                at: at.to_owned(),
                ring: r,
            });
        }
    }
    Ok(polygon)
}

/// Parses and validates one linear ring.
fn ring(value: &Value, at: &str) -> Result<Vec<[f64; 2]>, RoiError> {
    let positions = value
        .as_array()
        .ok_or_else(|| structure(at, "expected an array of positions"))?;
    let mut ring = Vec::with_capacity(positions.len());
    for (k, position) in positions.iter().enumerate() {
        let numbers = position.as_array().filter(|a| a.len() >= 2);
        let lon_lat = numbers.and_then(|a| Some([a[0].as_f64()?, a[1].as_f64()?]));
        let Some([lon, lat]) = lon_lat else {
            return Err(structure(
                &format!("{at}[{k}]"),
                "expected a position [longitude, latitude]",
            ));
        };
        // The path is formatted only for a bad position: rings run to tens
        // of thousands.
        if !(lon.abs() <= 180.0 && lat.abs() <= 90.0) {
            let here = format!("{at}[{k}]");
            check_coordinate(&here, "longitude", lon, 180.0)?;
            check_coordinate(&here, "latitude", lat, 90.0)?;
        }
        ring.push([lon, lat]);
    }
    if ring.len() < 4 {
        return Err(RoiError::RingTooShort {
            at: at.to_owned(),
            count: ring.len(),
        });
    }
    let (first, last) = (ring[0], ring[ring.len() - 1]);
    if first != last {
        return Err(RoiError::RingNotClosed {
            at: at.to_owned(),
            first,
            last,
        });
    }
    // Collinear positions enclose nothing. (A ring that is not collinear
    // yet has zero signed area, like a symmetric bow tie, crosses itself and
    // is reported as that.)
    let collinear = match ring.iter().find(|p| **p != first) {
        None => true,
        Some(&q) => ring.iter().all(|&p| {
            (q[0] - first[0]) * (p[1] - first[1]) - (q[1] - first[1]) * (p[0] - first[0]) == 0.0
        }),
    };
    if collinear {
        return Err(RoiError::ZeroArea { at: at.to_owned() });
    }
    Ok(ring)
}

/// Edge crossings within one polygon, found through a bucket grid.
mod crossing {
    use super::{Polygon, RoiError};

    /// One edge: ring, index of its first position, and its ends.
    #[derive(Clone, Copy)]
    struct Segment {
        ring: usize,
        edge: usize,
        a: [f64; 2],
        b: [f64; 2],
    }

    /// Rings of fewer edges than this are checked pair by pair.
    const BRUTE_FORCE_EDGES: usize = 64;

    /// Errors if two edges of `polygon` (of one ring or of two) cross or
    /// overlap along a length. Edges may touch at points.
    ///
    /// Edges go into a √n × √n grid of buckets over the polygon's bounding
    /// box by their own bounding boxes; only edges sharing a bucket are
    /// compared, so a country outline of tens of thousands of short edges
    /// costs a few comparisons per edge.
    pub(super) fn check(polygon: &Polygon, at: &str) -> Result<(), RoiError> {
        let mut segments = Vec::new();
        let (mut lo, mut hi) = ([f64::INFINITY; 2], [f64::NEG_INFINITY; 2]);
        for (ring, positions) in polygon.rings().iter().enumerate() {
            for (edge, w) in positions.windows(2).enumerate() {
                if w[0] == w[1] {
                    continue; // a repeated position: no edge
                }
                for axis in 0..2 {
                    lo[axis] = lo[axis].min(w[0][axis]).min(w[1][axis]);
                    hi[axis] = hi[axis].max(w[0][axis]).max(w[1][axis]);
                }
                segments.push(Segment {
                    ring,
                    edge,
                    a: w[0],
                    b: w[1],
                });
            }
        }
        let n = segments.len();
        if n < BRUTE_FORCE_EDGES {
            for i in 0..n {
                for j in i + 1..n {
                    compare(&segments[i], &segments[j], at)?;
                }
            }
            return Ok(());
        }
        // n ≥ 64, so side ≥ 8; the casts below are of values in [0, side).
        let side = (n as f64).sqrt().ceil() as usize;
        let scale = [0, 1].map(|axis| {
            let extent = hi[axis] - lo[axis];
            if extent > 0.0 {
                side as f64 / extent
            } else {
                0.0
            }
        });
        let bucket_of = |x: f64, axis: usize| -> usize {
            (((x - lo[axis]) * scale[axis]) as usize).min(side - 1)
        };
        let mut buckets: Vec<Vec<u32>> = vec![Vec::new(); side * side];
        for (i, s) in segments.iter().enumerate() {
            let (x0, x1) = (
                bucket_of(s.a[0].min(s.b[0]), 0),
                bucket_of(s.a[0].max(s.b[0]), 0),
            );
            let (y0, y1) = (
                bucket_of(s.a[1].min(s.b[1]), 1),
                bucket_of(s.a[1].max(s.b[1]), 1),
            );
            for y in y0..=y1 {
                for x in x0..=x1 {
                    buckets[y * side + x].push(i as u32);
                }
            }
        }
        for bucket in &buckets {
            for (k, &i) in bucket.iter().enumerate() {
                for &j in &bucket[k + 1..] {
                    compare(&segments[i as usize], &segments[j as usize], at)?;
                }
            }
        }
        Ok(())
    }

    /// Twice the signed area of (a, b, c): > 0 when c is left of a→b.
    fn orient(a: [f64; 2], b: [f64; 2], c: [f64; 2]) -> f64 {
        (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])
    }

    fn compare(s: &Segment, t: &Segment, at: &str) -> Result<(), RoiError> {
        let (s, t) = if (s.ring, s.edge) <= (t.ring, t.edge) {
            (s, t)
        } else {
            (t, s)
        };
        let d1 = orient(t.a, t.b, s.a);
        let d2 = orient(t.a, t.b, s.b);
        let d3 = orient(s.a, s.b, t.a);
        let d4 = orient(s.a, s.b, t.b);
        let error = |how, point| RoiError::SelfIntersection {
            at: at.to_owned(),
            ring_a: s.ring,
            edge_a: s.edge,
            ring_b: t.ring,
            edge_b: t.edge,
            how,
            point,
        };
        if d1 * d2 < 0.0 && d3 * d4 < 0.0 {
            let f = d1 / (d1 - d2);
            let point = [
                s.a[0] + f * (s.b[0] - s.a[0]),
                s.a[1] + f * (s.b[1] - s.a[1]),
            ];
            return Err(error("crosses", point));
        }
        if d1 == 0.0 && d2 == 0.0 {
            // Collinear: compare along the longer axis of s.
            let axis = usize::from((s.b[1] - s.a[1]).abs() > (s.b[0] - s.a[0]).abs());
            let (s0, s1) = (s.a[axis].min(s.b[axis]), s.a[axis].max(s.b[axis]));
            let (t0, t1) = (t.a[axis].min(t.b[axis]), t.a[axis].max(t.b[axis]));
            let (o0, o1) = (s0.max(t0), s1.min(t1));
            if o0 < o1 {
                // The overlap's start is an end of s or of t.
                let point = [s.a, s.b, t.a, t.b]
                    .into_iter()
                    .find(|p| p[axis] == o0)
                    .unwrap_or(s.a);
                return Err(error("overlaps", point));
            }
        }
        Ok(())
    }

    /// Whether `p` is inside `ring` (even–odd), or `None` when it lies on
    /// the ring's boundary.
    pub(super) fn point_in_ring(p: [f64; 2], ring: &[[f64; 2]]) -> Option<bool> {
        let mut inside = false;
        for w in ring.windows(2) {
            let (a, b) = (w[0], w[1]);
            let o = orient(a, b, p);
            if o == 0.0
                && p[0] >= a[0].min(b[0])
                && p[0] <= a[0].max(b[0])
                && p[1] >= a[1].min(b[1])
                && p[1] <= a[1].max(b[1])
            {
                return None;
            }
            if (a[1] > p[1]) != (b[1] > p[1]) {
                // Crossing of the ray towards +lon: p is left of the upward edge.
                let upward = b[1] > a[1];
                if (o > 0.0) == upward {
                    inside = !inside;
                }
            }
        }
        Some(inside)
    }
}
