//! Tile footprints and zone grids agree with geotessera 0.11.0's (PROJ's) on every fixture record.

use flotilla_core::grid::{place, tile_info, TileId, ZoneGrid};
use serde_json::Value;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/fixtures/geometry/geotessera-0.11.0.jsonl"
);

/// PROJ agreement asked of coordinates: one millimetre.
const COORD_TOL_M: f64 = 1e-3;

fn records() -> Vec<Value> {
    let text = std::fs::read_to_string(FIXTURE)
        .unwrap_or_else(|e| panic!("reading the geometry fixture {FIXTURE}: {e}"));
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("fixture line {}: {e}", i + 1))
        })
        .collect()
}

fn tile(name: &str) -> TileId {
    name.parse()
        .unwrap_or_else(|e| panic!("fixture tile {name}: {e}"))
}

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("fixture record lacks number {key}: {v}"))
}

fn int(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("fixture record lacks integer {key}: {v}"))
}

#[test]
fn every_tile_footprint_matches() {
    let mut worst = (0.0f64, String::new());
    let mut count = 0;
    for rec in records().iter().filter(|r| r["type"] == "tile") {
        let name = rec["tile"].as_str().expect("tile record has a name");
        let t = tile(name);
        assert_eq!(t.to_string(), name, "name round-trips");
        let info = tile_info(&t);
        assert_eq!(u64::from(info.zone), int(rec, "zone"), "{name} zone");
        assert_eq!(u64::from(info.epsg), int(rec, "epsg"), "{name} epsg");
        assert_eq!(u64::from(info.width), int(rec, "width"), "{name} width");
        assert_eq!(u64::from(info.height), int(rec, "height"), "{name} height");
        for (key, ours) in [("origin_e", info.origin_e), ("origin_n", info.origin_n)] {
            let err = (ours - num(rec, key)).abs();
            assert!(
                err < COORD_TOL_M,
                "{name} {key}: ours {ours}, fixture {}, off by {err} m",
                num(rec, key)
            );
            if err > worst.0 {
                worst = (err, format!("{name} {key}"));
            }
        }
        // The serialised form is the CLI's `tiles info` line: the same keys.
        let ours: Value = serde_json::to_value(&info).expect("TileInfo serialises");
        let mut keys: Vec<&String> = ours.as_object().expect("an object").keys().collect();
        let mut theirs: Vec<&String> = rec
            .as_object()
            .expect("an object")
            .keys()
            .filter(|k| *k != "type")
            .collect();
        keys.sort();
        theirs.sort();
        assert_eq!(keys, theirs);
        count += 1;
    }
    assert_eq!(count, 300);
    println!(
        "{count} tiles agree; worst coordinate difference {:.3e} m ({})",
        worst.0, worst.1
    );
}

#[test]
fn every_zone_grid_matches() {
    let mut count = 0;
    for rec in records().iter().filter(|r| r["type"] == "zone_grid") {
        let tiles: Vec<TileId> = rec["tiles"]
            .as_array()
            .expect("zone_grid lists tiles")
            .iter()
            .map(|v| tile(v.as_str().expect("tile names are strings")))
            .collect();
        let grid = place(&tiles).unwrap_or_else(|e| panic!("placing {tiles:?}: {e}"));
        let expected: ZoneGrid = serde_json::from_value(serde_json::Value::Object(
            rec.as_object()
                .expect("an object")
                .iter()
                .filter(|(k, _)| *k != "type" && *k != "tiles")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ))
        .expect("the fixture's zone_grid parses as ZoneGrid, so the field names agree");
        assert_eq!(grid.zone, expected.zone);
        assert!(
            (grid.origin_x - expected.origin_x).abs() < COORD_TOL_M,
            "{grid:?}"
        );
        assert!(
            (grid.origin_y - expected.origin_y).abs() < COORD_TOL_M,
            "{grid:?}"
        );
        assert_eq!(
            (grid.width_px, grid.height_px),
            (expected.width_px, expected.height_px)
        );
        assert_eq!(grid.placed, expected.placed, "zone {}", grid.zone);
        count += 1;
    }
    assert_eq!(count, 4);
}

/// The two tiles of the geotessera seam bug, in a grid of their own.
fn seam_pair() -> (ZoneGrid, [f64; 2]) {
    let tiles = [tile("grid_-79.35_-0.55"), tile("grid_-79.25_-0.55")];
    let grid = place(&tiles).expect("both tiles are in zone 17");
    let fractional = tiles.map(|t| (tile_info(&t).origin_e - grid.origin_x) / 10.0);
    (grid, fractional)
}

#[test]
fn seam_pair_abuts() {
    let (grid, fractional) = seam_pair();
    println!("fractional columns {fractional:?}");
    assert!((fractional[0] - 0.354).abs() < 5e-4, "{fractional:?}");
    assert!((fractional[1] - 1113.508).abs() < 5e-4, "{fractional:?}");
    let [west, east] = [&grid.placed[0], &grid.placed[1]];
    assert_eq!((west.col, west.width), (0, 1113));
    assert_eq!((east.col, east.width), (1113, 1114));
    assert_eq!(west.col + west.width, east.col, "the pair abuts");
    assert_eq!(west.row, east.row);
}

#[test]
fn rounding_would_have_opened_the_seam() {
    let (grid, fractional) = seam_pair();
    let rounded = fractional.map(f64::round);
    assert_eq!(rounded, [0.0, 1114.0]);
    let west_end = rounded[0] + f64::from(grid.placed[0].width);
    assert_eq!(rounded[1] - west_end, 1.0, "round leaves a one-pixel gap");
}

#[test]
fn zone_grid_serialises_with_the_cli_keys() {
    let (grid, _) = seam_pair();
    let v = serde_json::to_value(&grid).expect("ZoneGrid serialises");
    let mut keys: Vec<&str> = v
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "height_px",
            "origin_x",
            "origin_y",
            "placed",
            "width_px",
            "zone"
        ]
    );
    let mut keys: Vec<&str> = v["placed"][0]
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(keys, ["col", "height", "row", "tile", "width"]);
    assert_eq!(v["placed"][0]["tile"], "grid_-79.35_-0.55");
}
