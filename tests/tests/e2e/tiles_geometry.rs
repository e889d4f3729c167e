//! `flotilla tiles info|place` against geotessera 0.11.0: the shared fixture (integers exactly, coordinates to 1 mm), the seam pair abuts, and central-meridian tiles land in PROJ's pixel.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn fixture() -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures/geometry/geotessera-0.11.0.jsonl");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("fixture lines are JSON"))
        .collect()
}

fn flotilla(args: &[&str]) -> String {
    let out = Command::new(flotilla_e2e::binary("flotilla"))
        .args(args)
        .output()
        .expect("running flotilla");
    assert!(
        out.status.success(),
        "flotilla {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("flotilla prints UTF-8")
}

fn close(a: &Value, b: &Value, what: &str) {
    let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
    assert!((a - b).abs() <= 1e-3, "{what}: {a} vs {b}");
}

#[test]
fn tiles_info_matches_geotessera() {
    let expected: Vec<Value> = fixture()
        .into_iter()
        .filter(|v| v["type"] == "tile")
        .collect();
    assert!(expected.len() >= 300);
    let mut args = vec!["tiles", "info"];
    args.extend(expected.iter().map(|v| v["tile"].as_str().unwrap()));
    let out = flotilla(&args);
    let got: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect();
    assert_eq!(got.len(), expected.len());
    for (g, e) in got.iter().zip(&expected) {
        let tile = e["tile"].as_str().unwrap();
        let keys: Vec<&String> = g.as_object().unwrap().keys().collect();
        assert_eq!(
            keys.len(),
            7,
            "{tile}: fields {keys:?} (contract: tile zone epsg origin_e origin_n width height)"
        );
        for k in ["tile", "zone", "epsg", "width", "height"] {
            assert_eq!(g[k], e[k], "{tile}: {k}");
        }
        close(&g["origin_e"], &e["origin_e"], &format!("{tile} origin_e"));
        close(&g["origin_n"], &e["origin_n"], &format!("{tile} origin_n"));
    }
}

fn check_grid(got: &Value, e: &Value) {
    for k in ["zone", "width_px", "height_px", "placed"] {
        assert_eq!(got[k], e[k], "{k} of {}", e["tiles"]);
    }
    close(&got["origin_x"], &e["origin_x"], "origin_x");
    close(&got["origin_y"], &e["origin_y"], "origin_y");
}

#[test]
fn tiles_place_matches_geotessera_and_the_seam_pair_abuts() {
    let grids: Vec<Value> = fixture()
        .into_iter()
        .filter(|v| v["type"] == "zone_grid")
        .collect();
    assert!(!grids.is_empty());
    for e in &grids {
        let mut args = vec!["tiles", "place"];
        args.extend(
            e["tiles"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap()),
        );
        let got: Value = serde_json::from_str(flotilla(&args).trim()).expect("one JSON object");
        check_grid(&got, e);
    }

    let got: Value = serde_json::from_str(
        flotilla(&["tiles", "place", "grid_-79.35_-0.55", "grid_-79.25_-0.55"]).trim(),
    )
    .unwrap();
    let placed = got["placed"].as_array().unwrap();
    let (a, b) = (&placed[0], &placed[1]);
    assert_eq!(a["col"], 0);
    assert_eq!(a["width"], 1113);
    assert_eq!(
        b["col"], 1113,
        "floor, not round: the second tile abuts the first"
    );
    assert_eq!(
        a["col"].as_u64().unwrap() + a["width"].as_u64().unwrap(),
        b["col"].as_u64().unwrap()
    );
}

/// geotessera 0.11.0's zone grid over the 25 tiles of issue 10,
/// `grid_92.65..93.05_-73.75..-73.35` (from
/// `core/tests/data/geotessera-0.11.0-edges.jsonl.gz`): origin (487170,
/// −8133940), 4096 × 8192 px, and each tile's (row, col, width, height).
const ISSUE_10_PLACED: [(&str, u64, u64, u64, u64); 25] = [
    ("grid_92.65_-73.75", 4465, 29, 319, 1117),
    ("grid_92.65_-73.65", 3349, 22, 321, 1117),
    ("grid_92.65_-73.55", 2234, 14, 323, 1117),
    ("grid_92.65_-73.45", 1118, 7, 324, 1117),
    ("grid_92.65_-73.35", 3, 0, 326, 1117),
    ("grid_92.75_-73.75", 4463, 343, 317, 1117),
    ("grid_92.75_-73.65", 3348, 337, 319, 1117),
    ("grid_92.75_-73.55", 2232, 331, 321, 1117),
    ("grid_92.75_-73.45", 1117, 326, 323, 1117),
    ("grid_92.75_-73.35", 1, 320, 324, 1117),
    ("grid_92.85_-73.75", 4463, 656, 315, 1116),
    ("grid_92.85_-73.65", 3347, 652, 317, 1116),
    ("grid_92.85_-73.55", 2232, 648, 319, 1116),
    ("grid_92.85_-73.45", 1116, 645, 321, 1116),
    ("grid_92.85_-73.35", 0, 641, 323, 1116),
    ("grid_92.95_-73.75", 4462, 969, 313, 1116),
    ("grid_92.95_-73.65", 3347, 967, 315, 1116),
    ("grid_92.95_-73.55", 2231, 965, 317, 1116),
    ("grid_92.95_-73.45", 1116, 964, 319, 1116),
    ("grid_92.95_-73.35", 0, 962, 321, 1116),
    ("grid_93.05_-73.75", 4462, 1282, 313, 1116),
    ("grid_93.05_-73.65", 3347, 1282, 315, 1116),
    ("grid_93.05_-73.55", 2231, 1282, 317, 1116),
    ("grid_93.05_-73.45", 1116, 1282, 319, 1116),
    ("grid_93.05_-73.35", 0, 1282, 321, 1116),
];

/// The five tiles of column lon 93.05 start on zone 46's central meridian,
/// where PROJ's easting is 499999.9999999996 m: pixel 49,999, column 1282 of
/// the grid — not 500000 m exactly and column 1283 (issue 10).
#[test]
fn tiles_on_a_central_meridian_land_in_proj_s_pixel() {
    let mut args = vec!["tiles", "place"];
    args.extend(ISSUE_10_PLACED.iter().map(|p| p.0));
    let got: Value = serde_json::from_str(flotilla(&args).trim()).expect("one JSON object");
    assert_eq!(got["zone"], 46);
    close(&got["origin_x"], &Value::from(487_170.0), "origin_x");
    close(&got["origin_y"], &Value::from(-8_133_940.0), "origin_y");
    assert_eq!(
        (got["width_px"].as_u64(), got["height_px"].as_u64()),
        (Some(4096), Some(8192))
    );
    let placed = got["placed"].as_array().unwrap();
    assert_eq!(placed.len(), ISSUE_10_PLACED.len());
    for (g, (tile, row, col, width, height)) in placed.iter().zip(ISSUE_10_PLACED) {
        assert_eq!(g["tile"], tile);
        assert_eq!(
            [&g["row"], &g["col"], &g["width"], &g["height"]].map(|v| v.as_u64().unwrap()),
            [row, col, width, height],
            "{tile}"
        );
    }

    let column: Vec<&str> = ISSUE_10_PLACED[20..].iter().map(|p| p.0).collect();
    let mut args = vec!["tiles", "info"];
    args.extend(&column);
    for line in flotilla(&args).lines() {
        let info: Value = serde_json::from_str(line).expect("one JSON object a line");
        let e = info["origin_e"].as_f64().unwrap();
        assert!(e < 500_000.0 && 500_000.0 - e < 1e-8, "{info}");
        assert_eq!((e / 10.0).floor(), 49_999.0, "{info}");
    }
}

#[test]
fn tiles_info_rejects_a_bad_name() {
    let out = Command::new(flotilla_e2e::binary("flotilla"))
        .args(["tiles", "info", "grid_0.10_52.05"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("grid_0.10_52.05"), "{err}");
}
