//! Footprints and zone-grid placements agree with geotessera 0.11.0 to the pixel on every tile with an edge on a central meridian or zone boundary.
//!
//! The reference, `data/geotessera-0.11.0-edges.jsonl.gz`, was made by
//! `data/make_reference.py` with geotessera's own `project_tile`,
//! `_compute_zone_grid_from_landmask` and `_tile_pixel_offset` (see
//! `data/README.md`). Issue 10: on a central meridian PROJ's easting is
//! 500 km give or take 1e-10 m and the pixel is whichever side it fell.

use std::io::Read;
use std::sync::OnceLock;

use flate2::read::GzDecoder;
use flotilla_core::grid::{place, tile_info, TileId, ZoneGrid, PIXEL_M};
use serde_json::Value;

const REFERENCE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/geotessera-0.11.0-edges.jsonl.gz"
);

/// Where PROJ's elementary functions are the C library this test links too
/// (glibc on x86-64, where the reference was made), the port agrees to the
/// bit; elsewhere `sin`, `atan2`, … may differ in the last place.
const BIT_EXACT_PLATFORM: bool = cfg!(all(
    target_os = "linux",
    target_env = "gnu",
    target_arch = "x86_64"
));

struct Reference {
    columns: Vec<Value>,
    tiles: Vec<Value>,
    grids: Vec<Value>,
}

/// The reference, read once for all the tests here (15 MB of JSON).
fn reference() -> &'static Reference {
    static REFERENCE_DATA: OnceLock<Reference> = OnceLock::new();
    REFERENCE_DATA.get_or_init(read_reference)
}

fn read_reference() -> Reference {
    let file = std::fs::File::open(REFERENCE)
        .unwrap_or_else(|e| panic!("opening the reference {REFERENCE}: {e}"));
    let mut text = String::new();
    GzDecoder::new(file)
        .read_to_string(&mut text)
        .unwrap_or_else(|e| panic!("decompressing {REFERENCE}: {e}"));
    let mut r = Reference {
        columns: Vec::new(),
        tiles: Vec::new(),
        grids: Vec::new(),
    };
    for (i, line) in text.lines().enumerate() {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("reference line {}: {e}", i + 1));
        match v["type"].as_str() {
            Some("meta") => assert_eq!(v["geotessera"], "0.11.0", "{v}"),
            Some("column") => r.columns.push(v),
            Some("tile") => r.tiles.push(v),
            Some("zone_grid") => r.grids.push(v),
            _ => panic!("reference line {}: unknown record {v}", i + 1),
        }
    }
    r
}

fn ints(v: &Value, key: &str) -> Vec<i64> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("column record lacks list {key}"))
        .iter()
        .map(|x| x.as_i64().expect("integers"))
        .collect()
}

fn int(v: &Value, key: &str) -> i64 {
    v[key]
        .as_i64()
        .unwrap_or_else(|| panic!("record lacks integer {key}: {v}"))
}

/// Undoes `first_differences` in make_reference.py: running sums.
fn running_sums(d: &[i64]) -> Vec<i64> {
    d.iter()
        .scan(0i64, |acc, x| {
            *acc += x;
            Some(*acc)
        })
        .collect()
}

fn pixel(m: f64) -> i64 {
    (m / PIXEL_M).floor() as i64
}

fn tile(name: &str) -> TileId {
    name.parse()
        .unwrap_or_else(|e| panic!("reference tile {name}: {e}"))
}

#[test]
fn every_edge_column_tile_lands_in_geotessera_s_pixel() {
    let reference = reference();
    let (mut tiles, mut below_meridian) = (0, 0);
    for col in &reference.columns {
        let (ix, iy0) = (int(col, "ix"), int(col, "iy0"));
        let e_mm = running_sums(&running_sums(&ints(col, "origin_e_mm_dd")));
        let n_mm = running_sums(&running_sums(&ints(col, "origin_n_mm_dd")));
        let e_px = running_sums(&ints(col, "e_px_d"));
        let n_px = running_sums(&ints(col, "n_px_d"));
        let (widths, heights) = (ints(col, "width"), ints(col, "height"));
        for k in 0..widths.len() {
            let t = TileId::from_cell(ix as i32, iy0 as i32 + k as i32)
                .expect("reference cells are in the grid");
            let info = tile_info(&t);
            let at = || format!("{t} (column ix {ix})");
            assert_eq!(i64::from(info.zone), int(col, "zone"), "{}", at());
            assert_eq!(i64::from(info.epsg), int(col, "epsg"), "{}", at());
            assert_eq!(i64::from(info.width), widths[k], "{} width", at());
            assert_eq!(i64::from(info.height), heights[k], "{} height", at());
            assert_eq!(
                pixel(info.origin_e),
                e_px[k],
                "{} origin_e {:?}",
                at(),
                info.origin_e
            );
            assert_eq!(
                pixel(info.origin_n),
                n_px[k],
                "{} origin_n {:?}",
                at(),
                info.origin_n
            );
            for (what, ours, mm) in [
                ("origin_e", info.origin_e, e_mm[k]),
                ("origin_n", info.origin_n, n_mm[k]),
            ] {
                // The reference keeps whole millimetres, rounded.
                let off = (ours * 1000.0 - mm as f64).abs();
                assert!(off <= 0.5 + 1e-6, "{} {what}: {ours} vs {mm} mm", at());
            }
            if info.origin_e < 500_000.0 && e_px[k] == 49_999 {
                below_meridian += 1;
            }
            tiles += 1;
        }
    }
    // 60 central meridians and 60 zone boundaries, a column each side, every
    // latitude.
    assert_eq!(tiles, 240 * 1800);
    // The exposed case: a west edge on the meridian whose easting PROJ puts a
    // hair below 500 km, so the tile starts in pixel 49,999.
    assert!(below_meridian > 0);
    println!(
        "{tiles} edge-column tiles agree; {below_meridian} start a hair west of a central meridian"
    );
}

#[test]
fn random_tiles_agree_to_the_bit() {
    let reference = reference();
    let mut bit_identical = 0;
    for rec in &reference.tiles {
        let name = rec["tile"].as_str().expect("tile records have a name");
        let info = tile_info(&tile(name));
        let theirs: flotilla_core::grid::TileInfo = serde_json::from_value(rec.clone())
            .unwrap_or_else(|e| panic!("{name}: the record parses as TileInfo: {e}"));
        assert_eq!(
            (info.zone, info.epsg, info.width, info.height),
            (theirs.zone, theirs.epsg, theirs.width, theirs.height),
            "{name}"
        );
        assert_eq!(pixel(info.origin_e), pixel(theirs.origin_e), "{name}");
        assert_eq!(pixel(info.origin_n), pixel(theirs.origin_n), "{name}");
        let same = info.origin_e == theirs.origin_e && info.origin_n == theirs.origin_n;
        if BIT_EXACT_PLATFORM {
            assert!(same, "{name}: ours {info:?}, geotessera {theirs:?}");
        } else {
            assert!((info.origin_e - theirs.origin_e).abs() < 1e-6, "{name}");
            assert!((info.origin_n - theirs.origin_n).abs() < 1e-6, "{name}");
        }
        bit_identical += usize::from(same);
    }
    assert_eq!(reference.tiles.len(), 20_000);
    println!(
        "{} random tiles, {bit_identical} bit-identical",
        reference.tiles.len()
    );
}

#[test]
fn every_zone_grid_places_its_tiles_where_geotessera_does() {
    let reference = reference();
    for rec in &reference.grids {
        let tiles: Vec<TileId> = rec["tiles"]
            .as_array()
            .expect("zone_grid lists tiles")
            .iter()
            .map(|v| tile(v.as_str().expect("tile names are strings")))
            .collect();
        let ours = place(&tiles).unwrap_or_else(|e| panic!("placing {tiles:?}: {e}"));
        let mut theirs = rec.clone();
        let obj = theirs.as_object_mut().expect("an object");
        obj.remove("type");
        obj.remove("tiles");
        let theirs: ZoneGrid = serde_json::from_value(theirs)
            .expect("the reference's zone_grid parses as ZoneGrid, so the field names agree");
        // Origins are whole multiples of 10 m, so equal exactly.
        assert_eq!(ours, theirs, "{}", rec["tiles"]);
    }
    assert!(reference.grids.len() > 1000, "{}", reference.grids.len());
}

#[test]
fn issue_10_column_lands_at_1282() {
    let tiles: Vec<TileId> = (926..931)
        .flat_map(|ix| (-738..-733).map(move |iy| (ix, iy)))
        .map(|(ix, iy)| TileId::from_cell(ix, iy).expect("in the grid"))
        .collect();
    assert_eq!(tiles[0].name(), "grid_92.65_-73.75");
    let grid = place(&tiles).expect("all in zone 46");
    assert_eq!(grid.origin_x, 487_170.0);
    for p in &grid.placed {
        if p.tile.name().starts_with("grid_93.05_") {
            assert_eq!(p.col, 1282, "{p:?}");
        }
    }
}
