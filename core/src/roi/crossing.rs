//! Edge crossings within one polygon, found through a bucket grid, and
//! which ring a point lies in.

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
    let bucket_of =
        |x: f64, axis: usize| -> usize { (((x - lo[axis]) * scale[axis]) as usize).min(side - 1) };
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
