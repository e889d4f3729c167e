//! `flotilla tiles info|place` against geotessera 0.11.0's geometry fixture: integers exactly, coordinates to 1 mm, and the seam pair abuts.

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
