//! Every region validation error, with where it points.

use std::time::Instant;

use flotilla_core::roi::{Region, RoiError};
use serde_json::{json, Value};

fn err(v: Value) -> RoiError {
    Region::from_geojson(&v).expect_err("the region is invalid")
}

fn square() -> Value {
    json!([[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]])
}

#[test]
fn json_and_structure() {
    assert!(matches!(
        Region::from_geojson_str("{\"type\":"),
        Err(RoiError::Json(_))
    ));
    let e = err(json!([1, 2]));
    assert_eq!(e.to_string(), "$: expected a GeoJSON object");
    let e = err(json!({"coordinates": []}));
    assert_eq!(e.to_string(), "$: missing \"type\"");
    let e = err(json!({"type": "Polygon"}));
    assert_eq!(e.to_string(), "$: Polygon has no \"coordinates\"");
    let e = err(json!({"type": "Polygon", "coordinates": [[[0, 0], [1, "a"], [1, 1], [0, 0]]]}));
    assert_eq!(
        e.to_string(),
        "$.coordinates[0][1]: expected a position [longitude, latitude]"
    );
    let e = err(json!({"type": "MultiPolygon", "coordinates": [[square()], 7]}));
    assert_eq!(
        e.to_string(),
        "$.coordinates[1]: expected an array of linear rings"
    );
    let e = err(json!({"type": "Feature", "geometry": null, "properties": {}}));
    assert_eq!(e.to_string(), "$.geometry: feature has no geometry (null)");
    let e = err(
        json!({"type": "FeatureCollection", "features": [{"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [square()]}}, {"type": "Polygon"}]}),
    );
    assert_eq!(e.to_string(), "$.features[1]: expected a Feature");
}

#[test]
fn unsupported_types() {
    let e = err(
        json!({"type": "FeatureCollection", "features": [{"type": "Feature", "geometry": {"type": "LineString", "coordinates": [[0, 0], [1, 1]]}}]}),
    );
    assert_eq!(
        e,
        RoiError::UnsupportedType {
            at: "$.features[0].geometry".into(),
            kind: "LineString".into()
        }
    );
    assert!(e.to_string().contains("expected Polygon or MultiPolygon"));
    assert!(matches!(
        err(json!({"type": "GeometryCollection", "geometries": []})),
        RoiError::UnsupportedType { .. }
    ));
}

#[test]
fn empty() {
    assert_eq!(
        err(json!({"type": "FeatureCollection", "features": []})),
        RoiError::Empty { at: "$".into() }
    );
    assert_eq!(
        err(json!({"type": "MultiPolygon", "coordinates": []})),
        RoiError::Empty { at: "$".into() }
    );
    assert_eq!(
        err(json!({"type": "MultiPolygon", "coordinates": [[square()], []]})),
        RoiError::EmptyPolygon {
            at: "$.coordinates[1]".into()
        }
    );
}

#[test]
fn short_and_open_rings() {
    assert_eq!(
        err(
            json!({"type": "Polygon", "coordinates": [square(), [[0.2, 0.2], [0.3, 0.3], [0.2, 0.2]]]})
        ),
        RoiError::RingTooShort {
            at: "$.coordinates[1]".into(),
            count: 3
        }
    );
    let e = err(json!({"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1]]]}));
    assert_eq!(
        e,
        RoiError::RingNotClosed {
            at: "$.coordinates[0]".into(),
            first: [0.0, 0.0],
            last: [0.0, 1.0]
        }
    );
    assert!(e.to_string().contains("not closed"));
}

#[test]
fn coordinates_out_of_range() {
    let e = err(json!({"type": "Polygon", "coordinates": [[[0, 0], [181, 0], [1, 1], [0, 0]]]}));
    assert_eq!(
        e.to_string(),
        "$.coordinates[0][1]: longitude 181 is outside [-180, 180]"
    );
    let e = err(json!({"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, -90.5], [0, 0]]]}));
    assert_eq!(
        e.to_string(),
        "$.coordinates[0][2]: latitude -90.5 is outside [-90, 90]"
    );
    // JSON has no NaN; non-finite values come in through a bbox.
    let e = Region::from_bbox(0.0, f64::NAN, 1.0, 1.0).unwrap_err();
    assert_eq!(e.to_string(), "bbox: min_lat NaN is not a finite number");
    let e = Region::from_bbox(0.0, 0.0, f64::INFINITY, 1.0).unwrap_err();
    assert!(matches!(
        e,
        RoiError::NotFinite {
            axis: "max_lon",
            ..
        }
    ));
}

#[test]
fn zero_area() {
    assert_eq!(
        err(json!({"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [2, 2], [0, 0]]]})),
        RoiError::ZeroArea {
            at: "$.coordinates[0]".into()
        }
    );
    assert_eq!(
        err(
            json!({"type": "Polygon", "coordinates": [square(), [[0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]]})
        ),
        RoiError::ZeroArea {
            at: "$.coordinates[1]".into()
        }
    );
    assert_eq!(
        Region::from_bbox(1.0, 0.0, 1.0, 2.0).unwrap_err(),
        RoiError::ZeroArea { at: "bbox".into() }
    );
}

#[test]
fn bbox_inverted() {
    let e = Region::from_bbox(170.0, 0.0, -170.0, 1.0).unwrap_err();
    assert_eq!(
        e,
        RoiError::BboxInverted {
            axis: "lon",
            min: 170.0,
            max: -170.0
        }
    );
    assert!(e.to_string().contains("antimeridian"), "{e}");
    let e = Region::from_bbox(0.0, 2.0, 1.0, 1.0).unwrap_err();
    assert_eq!(e.to_string(), "bbox: min_lat 2 is greater than max_lat 1");
}

#[test]
fn bbox_text() {
    let r = Region::from_bbox_str(" -0.3, 10 ,0.2,10.1").unwrap();
    assert_eq!(r.tiles().len(), 5);
    let e = Region::from_bbox_str("1,2,3").unwrap_err();
    assert_eq!(
        e.to_string(),
        "bbox: \"1,2,3\": expected four numbers min_lon,min_lat,max_lon,max_lat"
    );
    assert!(matches!(
        Region::from_bbox_str("1,2,x,4"),
        Err(RoiError::Structure { .. })
    ));
    assert!(matches!(
        Region::from_bbox_str("1,2,0,4"),
        Err(RoiError::BboxInverted { axis: "lon", .. })
    ));
}

#[test]
fn antimeridian() {
    let e = err(
        json!({"type": "Polygon", "coordinates": [[[179, 0], [-179, 0], [-179, 1], [179, 1], [179, 0]]]}),
    );
    assert_eq!(
        e,
        RoiError::SpansAntimeridian {
            at: "$.coordinates".into(),
            span: 358.0
        }
    );
    // Cut in two it is fine, and covers 10 + 10 columns.
    let r = Region::from_geojson(&json!({"type": "MultiPolygon", "coordinates": [
        [[[179, 0], [180, 0], [180, 1], [179, 1], [179, 0]]],
        [[[-180, 0], [-179, 0], [-179, 1], [-180, 1], [-180, 0]]]
    ]}))
    .unwrap();
    assert_eq!(r.tiles().len(), 200);
}

#[test]
fn self_intersection() {
    // A bow tie (zero signed area, yet not collinear): edge 0 (0,0)→(1,1)
    // crosses edge 2 (0,1)→(1,0) at (0.5, 0.5).
    let e =
        err(json!({"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [0, 1], [1, 0], [0, 0]]]}));
    let RoiError::SelfIntersection {
        ref at,
        ring_a,
        edge_a,
        ring_b,
        edge_b,
        how,
        point,
    } = e
    else {
        panic!("{e:?}");
    };
    assert_eq!(
        (at.as_str(), ring_a, edge_a, ring_b, edge_b, how),
        ("$.coordinates", 0, 0, 0, 2, "crosses")
    );
    assert_eq!(point, [0.5, 0.5]);
    assert_eq!(
        e.to_string(),
        "$.coordinates: ring 0 edge 0 (positions 0→1) crosses ring 0 edge 2 (positions 2→3) near (0.5, 0.5)"
    );

    // A hole crossing its shell.
    let e = err(
        json!({"type": "MultiPolygon", "coordinates": [[square()], [square(), [[0.5, 0.5], [1.5, 0.5], [1.5, 0.7], [0.5, 0.5]]]]}),
    );
    assert!(
        matches!(e, RoiError::SelfIntersection { ref at, ring_a: 0, ring_b: 1, how: "crosses", .. } if at == "$.coordinates[1]"),
        "{e:?}"
    );

    // Collinear overlap: the ring doubles back along its own edge.
    let e = err(
        json!({"type": "Polygon", "coordinates": [[[0, 0], [2, 0], [2, 1], [1, 1], [1, 0], [3, 0], [3, -1], [0, -1], [0, 0]]]}),
    );
    assert!(
        matches!(
            e,
            RoiError::SelfIntersection {
                how: "overlaps",
                ..
            }
        ),
        "{e:?}"
    );

    // Touching at a point is allowed: two squares of one ring meeting at a corner.
    Region::from_geojson(&json!({"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [2, 1], [2, 2], [1, 2], [1, 1], [0, 1], [0, 0]]]}))
        .expect("rings may touch at points");
}

#[test]
fn hole_outside_shell() {
    let e = err(
        json!({"type": "Polygon", "coordinates": [square(), [[2, 2], [3, 2], [3, 3], [2, 2]]]}),
    );
    assert_eq!(
        e,
        RoiError::HoleOutsideShell {
            at: "$.coordinates".into(),
            ring: 1
        }
    );
}

/// A ring of 50,000 vertices with one crossing near the end is found fast.
#[test]
fn big_ring_crossing_check_is_fast() {
    let n = 50_000u32;
    let mut ring: Vec<[f64; 2]> = (0..n)
        .map(|k| {
            let a = f64::from(k) * std::f64::consts::TAU / f64::from(n);
            let r = 20.0 + 0.2 * (a * 400.0).sin();
            [r * a.cos(), r * a.sin()]
        })
        .collect();
    ring.push(ring[0]);
    let valid = json!({"type": "Polygon", "coordinates": [ring.clone()]});
    let start = Instant::now();
    Region::from_geojson(&valid).expect("a wobbly circle is simple");
    let valid_time = start.elapsed();

    // Swap two neighbouring vertices: the ring now crosses itself there.
    let k = 49_000;
    ring.swap(k, k + 1);
    let invalid = json!({"type": "Polygon", "coordinates": [ring]});
    let start = Instant::now();
    let e = err(invalid);
    let invalid_time = start.elapsed();
    let RoiError::SelfIntersection { edge_a, edge_b, .. } = e else {
        panic!("{e:?}")
    };
    assert_eq!((edge_a, edge_b), (k - 1, k + 1));
    println!(
        "50,000-vertex ring: valid checked in {valid_time:?}, crossing found in {invalid_time:?}"
    );
    assert!(valid_time.as_secs_f64() < 5.0);
}
