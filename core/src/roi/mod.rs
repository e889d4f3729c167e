//! Regions of interest (GeoJSON polygons or a bbox) and the TESSERA tiles they cover.
//!
//! Here: [`Region`], [`Polygon`], [`RoiError`] and the bbox parsers;
//! `geojson.rs` walks and checks GeoJSON; `crossing.rs` finds crossing
//! edges and holes outside their shell; `cover.rs` is the sweep and
//! [`TileSet`].
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

use serde_json::Value;

mod cover;
mod crossing;
mod geojson;

pub use cover::{TileRow, TileSet};

use geojson::{check_coordinate, collect};

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
}
