//! Tiles a region covers, checked against brute force: fine-grid point sampling and exact clipped area per cell.

use std::collections::BTreeSet;
use std::time::Instant;

use flotilla_core::grid::TileId;
use flotilla_core::roi::Region;
use serde_json::json;

type Ring = Vec<[f64; 2]>;

/// Even–odd point in polygon over all rings (lon/lat degrees).
fn inside(p: [f64; 2], rings: &[Ring]) -> bool {
    let mut inside = false;
    for ring in rings {
        for w in ring.windows(2) {
            let (a, b) = (w[0], w[1]);
            if (a[1] > p[1]) != (b[1] > p[1]) {
                let x = a[0] + (p[1] - a[1]) * (b[0] - a[0]) / (b[1] - a[1]);
                if p[0] < x {
                    inside = !inside;
                }
            }
        }
    }
    inside
}

/// Area of `ring` clipped to the rectangle (Sutherland–Hodgman; exact for a
/// convex clip window, concave subject allowed).
fn clipped_area(ring: &Ring, [x0, y0, x1, y1]: [f64; 4]) -> f64 {
    let mut poly: Vec<[f64; 2]> = ring[..ring.len() - 1].to_vec();
    // Each half-plane as (axis, bound, keep-greater).
    for (axis, bound, keep_ge) in [(0, x0, true), (0, x1, false), (1, y0, true), (1, y1, false)] {
        let keep = |p: &[f64; 2]| {
            if keep_ge {
                p[axis] >= bound
            } else {
                p[axis] <= bound
            }
        };
        let mut out = Vec::new();
        for i in 0..poly.len() {
            let (a, b) = (poly[i], poly[(i + 1) % poly.len()]);
            let (ka, kb) = (keep(&a), keep(&b));
            if ka {
                out.push(a);
            }
            if ka != kb {
                let t = (bound - a[axis]) / (b[axis] - a[axis]);
                let mut p = [a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1])];
                p[axis] = bound;
                out.push(p);
            }
        }
        poly = out;
        if poly.is_empty() {
            return 0.0;
        }
    }
    let mut twice = 0.0;
    for i in 0..poly.len() {
        let (a, b) = (poly[i], poly[(i + 1) % poly.len()]);
        twice += a[0] * b[1] - b[0] * a[1];
    }
    (twice / 2.0).abs()
}

/// Cells over each polygon's bounding box ± 1, as (ix, iy), ascending.
fn candidate_cells(polygons: &[Vec<Ring>]) -> Vec<(i32, i32)> {
    let mut cells = BTreeSet::new();
    for rings in polygons {
        let (mut lo, mut hi) = ([f64::INFINITY; 2], [f64::NEG_INFINITY; 2]);
        for p in rings.iter().flatten() {
            for a in 0..2 {
                lo[a] = lo[a].min(p[a]);
                hi[a] = hi[a].max(p[a]);
            }
        }
        for iy in (lo[1] * 10.0).floor() as i32 - 1..=(hi[1] * 10.0).ceil() as i32 {
            for ix in (lo[0] * 10.0).floor() as i32 - 1..=(hi[0] * 10.0).ceil() as i32 {
                cells.insert((ix, iy));
            }
        }
    }
    cells.into_iter().collect()
}

/// Cells with a sample point inside, sampling `per_side`² points per cell
/// strictly inside it.
fn by_sampling(polygons: &[Vec<Ring>], per_side: u32) -> BTreeSet<(i32, i32)> {
    candidate_cells(polygons)
        .into_iter()
        .filter(|&(ix, iy)| {
            (0..per_side).any(|i| {
                (0..per_side).any(|j| {
                    let p = [
                        (f64::from(ix) + (f64::from(i) + 0.5) / f64::from(per_side)) / 10.0,
                        (f64::from(iy) + (f64::from(j) + 0.5) / f64::from(per_side)) / 10.0,
                    ];
                    polygons.iter().any(|rings| inside(p, rings))
                })
            })
        })
        .collect()
}

/// The greatest fraction of the cell one polygon covers.
fn covered_fraction(polygons: &[Vec<Ring>], (ix, iy): (i32, i32)) -> f64 {
    let cell = [
        f64::from(ix) / 10.0,
        f64::from(iy) / 10.0,
        f64::from(ix + 1) / 10.0,
        f64::from(iy + 1) / 10.0,
    ];
    polygons
        .iter()
        .map(|rings| {
            let shell = clipped_area(&rings[0], cell);
            let holes: f64 = rings[1..].iter().map(|h| clipped_area(h, cell)).sum();
            (shell - holes) * 100.0
        })
        .fold(0.0, f64::max)
}

/// Cells whose intersection with some polygon has positive area.
fn by_clipping(polygons: &[Vec<Ring>]) -> BTreeSet<(i32, i32)> {
    candidate_cells(polygons)
        .into_iter()
        .filter(|&cell| covered_fraction(polygons, cell) > 1e-10)
        .collect()
}

fn tiles(region: &Region) -> BTreeSet<(i32, i32)> {
    let set = region.tiles();
    let list: Vec<TileId> = set.iter().collect();
    assert_eq!(list.len(), set.len());
    assert!(
        list.windows(2).all(|w| w[0] < w[1]),
        "row-major order, no repeats"
    );
    for t in &list {
        assert!(set.contains(*t));
    }
    list.iter().map(|t| (t.ix(), t.iy())).collect()
}

/// Checks the region's tiles against both brute forces and returns them.
fn check(region: &Region, per_side: u32) -> BTreeSet<(i32, i32)> {
    let polygons: Vec<Vec<Ring>> = region
        .polygons()
        .iter()
        .map(|p| p.rings().to_vec())
        .collect();
    let ours = tiles(region);
    let exact = by_clipping(&polygons);
    assert_eq!(ours, exact, "scanline vs clipped area");
    // Sampling can only miss cells, and only where the region covers a
    // sliver narrower than the sample spacing.
    let sampled = by_sampling(&polygons, per_side);
    assert!(
        sampled.is_subset(&ours),
        "sampling found cells the scanline missed"
    );
    let slivers: Vec<(i32, i32)> = ours.difference(&sampled).copied().collect();
    for &cell in &slivers {
        let fraction = covered_fraction(&polygons, cell);
        assert!(
            fraction < 2.0 / f64::from(per_side),
            "cell {cell:?} is {fraction} covered, yet no sample of {per_side}² fell inside"
        );
    }
    if !slivers.is_empty() {
        println!(
            "{} sliver cells below the sampling resolution",
            slivers.len()
        );
    }
    // `contains` agrees on every candidate, inside and out.
    let set = region.tiles();
    for (ix, iy) in candidate_cells(&polygons) {
        if let Ok(t) = TileId::from_cell(ix, iy) {
            assert_eq!(set.contains(t), ours.contains(&(ix, iy)));
        }
    }
    ours
}

fn polygon(rings: &[&[[f64; 2]]]) -> serde_json::Value {
    json!({"type": "Polygon", "coordinates": rings})
}

#[test]
fn triangle() {
    let r = Region::from_geojson(&polygon(&[&[
        [0.03, 0.02],
        [0.87, 0.11],
        [0.41, 0.77],
        [0.03, 0.02],
    ]]))
    .unwrap();
    let tiles = check(&r, 64);
    assert!(tiles.contains(&(0, 0)) && tiles.contains(&(8, 1)) && tiles.contains(&(4, 7)));
    assert!(!tiles.contains(&(8, 7)));
    println!("triangle: {} tiles", tiles.len());
}

#[test]
fn square_with_holes() {
    // Unit-degree square: 100 cells. One hole mid-cell (0.25..0.75 removes
    // the 4×4 cells 3..7 wholly inside), one on cell edges elsewhere would
    // overlap, so a second polygon carries the edge-aligned case.
    let shell: &[[f64; 2]] = &[[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [0.0, 0.0]];
    let hole: &[[f64; 2]] = &[
        [0.25, 0.25],
        [0.25, 0.75],
        [0.75, 0.75],
        [0.75, 0.25],
        [0.25, 0.25],
    ];
    let r = Region::from_geojson(&polygon(&[shell, hole])).unwrap();
    assert_eq!(check(&r, 32).len(), 100 - 16);

    let shell: &[[f64; 2]] = &[[2.0, 0.0], [3.0, 0.0], [3.0, 1.0], [2.0, 1.0], [2.0, 0.0]];
    let hole: &[[f64; 2]] = &[[2.2, 0.2], [2.5, 0.2], [2.5, 0.5], [2.2, 0.5], [2.2, 0.2]];
    let r = Region::from_geojson(&polygon(&[shell, hole])).unwrap();
    assert_eq!(check(&r, 32).len(), 100 - 9);
}

#[test]
fn concave_multipolygon_with_overlap() {
    let star: Vec<[f64; 2]> = (0..=14)
        .map(|k| {
            let angle = f64::from(k % 14) * std::f64::consts::TAU / 14.0;
            let radius = if k % 2 == 0 { 0.93 } else { 0.31 };
            [-3.0 + radius * angle.cos(), 45.0 + radius * angle.sin()]
        })
        .collect();
    let l_shape = [
        [-2.5, 44.6],
        [-1.7, 44.6],
        [-1.7, 44.83],
        [-2.28, 44.83],
        [-2.28, 45.37],
        [-2.5, 45.37],
        [-2.5, 44.6],
    ];
    let r = Region::from_geojson(&json!({
        "type": "MultiPolygon",
        "coordinates": [[star], [l_shape]]
    }))
    .unwrap();
    let tiles = check(&r, 64);
    println!("star ∪ L: {} tiles", tiles.len());
}

#[test]
fn feature_collection_southern_western() {
    let r = Region::from_geojson(&json!({
        "type": "FeatureCollection",
        "features": [
            {"type": "Feature", "properties": {}, "geometry": {"type": "Polygon", "coordinates": [[[-179.99, -89.99], [-179.52, -89.97], [-179.7, -89.43], [-179.99, -89.99]]]}},
            {"type": "Feature", "properties": null, "geometry": {"type": "Polygon", "coordinates": [[[179.61, 89.3], [180.0, 89.3], [180.0, 90.0], [179.61, 89.3]]]}}
        ]
    }))
    .unwrap();
    let tiles = check(&r, 64);
    assert!(tiles.contains(&(-1800, -900)) && tiles.contains(&(1799, 899)));
}

#[test]
fn bbox() {
    let r = Region::from_bbox(-0.35, -0.25, 0.4, 0.1).unwrap();
    // Columns −4..4 (the half cells at −0.35 count), rows −3..1.
    assert_eq!(check(&r, 16).len(), 8 * 4);
    // Edges on cell edges cover exactly the cells inside.
    let r = Region::from_bbox(10.0, 20.0, 11.0, 20.3).unwrap();
    let tiles = check(&r, 16);
    assert_eq!(tiles.len(), 10 * 3);
    assert_eq!(tiles.first(), Some(&(100, 200)));
    assert_eq!(tiles.last(), Some(&(109, 202)));
    // A box inside one cell is that cell.
    let r = Region::from_bbox(0.01, 0.01, 0.02, 0.02).unwrap();
    assert_eq!(check(&r, 16).into_iter().collect::<Vec<_>>(), [(0, 0)]);
}

/// Deterministic pseudo-random numbers in [0, 1) (a 64-bit LCG; good enough
/// to shape test polygons).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Star-shaped (so simple) polygons with random radii, some vertices on
/// cell edges and corners.
#[test]
fn random_star_polygons() {
    let mut rng = Lcg(42);
    for case in 0..40 {
        let n = 3 + (rng.next() * 25.0) as usize;
        let (cx, cy) = (rng.next() * 20.0 - 10.0, rng.next() * 20.0 - 10.0);
        let mut angles: Vec<f64> = (0..n).map(|_| rng.next() * std::f64::consts::TAU).collect();
        angles.sort_by(f64::total_cmp);
        let mut ring: Vec<[f64; 2]> = angles
            .iter()
            .map(|a| {
                let r = 0.05 + rng.next() * 0.6;
                let mut p = [cx + r * a.cos(), cy + r * a.sin()];
                if case % 3 == 0 {
                    // Snap to the 0.1° lattice: vertices on cell corners.
                    p = p.map(|x| (x * 10.0).round() / 10.0);
                }
                p
            })
            .collect();
        ring.dedup();
        ring.push(ring[0]);
        let Ok(region) = Region::from_geojson(&polygon(&[&ring])) else {
            continue; // snapping can make a degenerate ring
        };
        check(&region, 24);
    }
}

#[test]
fn text_input() {
    let r = Region::from_geojson_str(
        r#"{"type":"Feature","geometry":{"type":"Polygon","coordinates":[[[0,0],[0.3,0],[0.3,0.2],[0,0.2],[0,0]]]},"properties":{}}"#,
    )
    .unwrap();
    let names: Vec<String> = r.tiles().iter().map(|t| t.to_string()).collect();
    assert_eq!(
        names,
        [
            "grid_0.05_0.05",
            "grid_0.15_0.05",
            "grid_0.25_0.05",
            "grid_0.05_0.15",
            "grid_0.15_0.15",
            "grid_0.25_0.15"
        ]
    );
}

#[test]
fn a_million_tiles() {
    let start = Instant::now();
    let region = Region::from_bbox(-50.0, -50.0, 50.0, 50.0).unwrap();
    let set = region.tiles();
    let enumerate = start.elapsed();
    assert_eq!(set.len(), 1_000_000);
    let start = Instant::now();
    let all = set.to_vec();
    let listed = start.elapsed();
    assert_eq!(all.len(), 1_000_000);
    assert_eq!(all[0].to_string(), "grid_-49.95_-49.95");
    assert_eq!(all[999_999].to_string(), "grid_49.95_49.95");
    println!("100°×100° bbox: 1,000,000 tiles enumerated in {enumerate:?} ({} spans), listed in {listed:?}", set.rows().len());
    assert!(enumerate.as_secs_f64() < 2.0);

    // The whole globe.
    let start = Instant::now();
    let set = Region::from_bbox(-180.0, -90.0, 180.0, 90.0)
        .unwrap()
        .tiles();
    assert_eq!(set.len(), 3600 * 1800);
    println!("globe: {} tiles in {:?}", set.len(), start.elapsed());
}

#[test]
fn a_country_sized_polygon() {
    // A wobbly disc of radius ~56° (a million cells) with 20,000 vertices.
    let n = 20_000;
    let ring: Vec<[f64; 2]> = (0..=n)
        .map(|k| {
            let a = f64::from(k % n) * std::f64::consts::TAU / f64::from(n);
            let r = 56.0 + 0.3 * (a * 37.0).sin() + 0.05 * (a * 911.0).sin();
            [r * a.cos(), r * a.sin()]
        })
        .collect();
    let json = polygon(&[&ring]);
    let start = Instant::now();
    let region = Region::from_geojson(&json).unwrap();
    let parse = start.elapsed();
    let start = Instant::now();
    let set = region.tiles();
    let enumerate = start.elapsed();
    // Shoelace area in cells bounds the count from below; the boundary adds
    // at most the cells it crosses.
    let twice: f64 = ring
        .windows(2)
        .map(|w| w[0][0] * w[1][1] - w[1][0] * w[0][1])
        .sum();
    let area_cells = twice / 2.0 * 100.0;
    let perimeter_cells: f64 = ring
        .windows(2)
        .map(|w| ((w[1][0] - w[0][0]).abs() + (w[1][1] - w[0][1]).abs()) * 10.0)
        .sum();
    let count = set.len() as f64;
    println!(
        "20,000-vertex polygon: {} tiles (area {area_cells:.0} cells, boundary ≤ {perimeter_cells:.0}); parse+validate {parse:?}, enumerate {enumerate:?}",
        set.len()
    );
    assert!(count >= area_cells && count <= area_cells + perimeter_cells + 4.0);
    assert!(count > 980_000.0);
    // Spot-check rows against sampling at cell centres away from the edge.
    let rings = vec![ring];
    for t in set.iter().step_by(997) {
        let (lon, lat) = t.centre();
        let r = lon.hypot(lat);
        if r < 55.0 {
            assert!(inside([lon, lat], &rings));
        }
    }
    assert!(enumerate.as_secs_f64() < 2.0);
}
