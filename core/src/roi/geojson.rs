//! GeoJSON in, polygons out: walking Polygon, MultiPolygon, Feature and
//! FeatureCollection, and checking each ring and coordinate, with a JSON
//! path to every problem.

use serde_json::Value;

use super::{crossing, structure, Polygon, RoiError};

/// Walks a GeoJSON object, appending its polygons.
pub(super) fn collect(value: &Value, at: &str, out: &mut Vec<Polygon>) -> Result<(), RoiError> {
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

pub(super) fn check_coordinate(
    at: &str,
    axis: &'static str,
    value: f64,
    limit: f64,
) -> Result<(), RoiError> {
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
