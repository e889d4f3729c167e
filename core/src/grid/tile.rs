//! Tile identifiers: parsing and formatting `grid_{lon}_{lat}` names, cell bounds, UTM zone.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::tmerc::TransverseMercator;

/// Cell column of the westernmost tile (lon −180°).
pub const IX_MIN: i32 = -1800;
/// One past the easternmost cell column (lon +180°).
pub const IX_END: i32 = 1800;
/// Cell row of the southernmost tile (lat −90°).
pub const IY_MIN: i32 = -900;
/// One past the northernmost cell row (lat +90°).
pub const IY_END: i32 = 900;

/// One TESSERA tile: the 0.1° cell `[ix/10, (ix+1)/10) × [iy/10, (iy+1)/10)`
/// in degrees of longitude and latitude.
///
/// Held as integer cell indices, so it is exact, `Copy` and four bytes; its
/// name is `grid_{lon:.2f}_{lat:.2f}` of the cell's centre, formatted from the
/// integers (no float formatting, so names round-trip and never show `-0.00`).
/// Ordered by row (south to north), then column (west to east). Serialises
/// as its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TileId {
    // Field order gives the derived ordering: row first.
    iy: i16,
    ix: i16,
}

/// Why a tile name, cell or point is not a tile.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TileIdError {
    #[error("tile name {name:?} does not have the form grid_<lon>_<lat>, e.g. grid_0.15_52.05")]
    Form { name: String },
    #[error("tile name {name:?}: {axis} {text:?} is not a decimal with two places, e.g. -0.05")]
    Number {
        name: String,
        axis: &'static str,
        text: String,
    },
    #[error("tile name {name:?}: {axis} {text} is not a cell centre (centres end in 5 in the second decimal place, e.g. 0.05, 12.35)")]
    NotCentre {
        name: String,
        axis: &'static str,
        text: String,
    },
    #[error("{axis} {value} is outside the grid ({min} to {max})")]
    OutOfRange {
        axis: &'static str,
        value: f64,
        min: f64,
        max: f64,
    },
    #[error("{axis} {value} is not a finite number")]
    NotFinite { axis: &'static str, value: f64 },
}

/// A cell's edges in degrees.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    pub west: f64,
    pub south: f64,
    pub east: f64,
    pub north: f64,
}

/// A UTM zone and hemisphere: EPSG 326zz (north) or 327zz (south).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UtmZone {
    /// 1..=60.
    pub zone: u8,
    /// Southern hemisphere: EPSG 327zz with a 10,000 km false northing.
    pub south: bool,
}

impl UtmZone {
    /// The zone holding (lon, lat): `floor((lon+180)/6)+1` clamped to 1..=60,
    /// south when lat < 0. (Tile centres are never on the equator, so the
    /// equator's own hemisphere never matters for tiles.)
    pub fn of_point(lon: f64, lat: f64) -> Self {
        let zone = ((lon + 180.0) / 6.0).floor() + 1.0;
        UtmZone {
            // Clamped, so the cast cannot truncate.
            zone: zone.clamp(1.0, 60.0) as u8,
            south: lat < 0.0,
        }
    }

    /// EPSG code: 32600 + zone north, 32700 + zone south.
    pub fn epsg(&self) -> u32 {
        (if self.south { 32700 } else { 32600 }) + u32::from(self.zone)
    }

    /// The projection of this zone (southern zones with their false northing).
    pub fn projection(&self) -> TransverseMercator {
        TransverseMercator::utm(self.zone, self.south)
    }
}

impl TileId {
    /// The tile of cell column `ix` (lon ix/10 … (ix+1)/10) and row `iy`.
    pub fn from_cell(ix: i32, iy: i32) -> Result<Self, TileIdError> {
        if !(IX_MIN..IX_END).contains(&ix) {
            return Err(TileIdError::OutOfRange {
                axis: "cell column",
                value: f64::from(ix),
                min: f64::from(IX_MIN),
                max: f64::from(IX_END - 1),
            });
        }
        if !(IY_MIN..IY_END).contains(&iy) {
            return Err(TileIdError::OutOfRange {
                axis: "cell row",
                value: f64::from(iy),
                min: f64::from(IY_MIN),
                max: f64::from(IY_END - 1),
            });
        }
        // Range-checked above, so both fit an i16.
        Ok(TileId {
            ix: ix as i16,
            iy: iy as i16,
        })
    }

    /// The tile containing (lon, lat) in degrees: cell `floor(x·10)`, as
    /// geotessera computes it. Longitude 180 is the same meridian as −180 and
    /// maps there; latitude 90 (the pole) belongs to the northernmost row.
    pub fn from_point(lon: f64, lat: f64) -> Result<Self, TileIdError> {
        for (axis, value, limit) in [("longitude", lon, 180.0), ("latitude", lat, 90.0)] {
            if !value.is_finite() {
                return Err(TileIdError::NotFinite { axis, value });
            }
            if value.abs() > limit {
                return Err(TileIdError::OutOfRange {
                    axis,
                    value,
                    min: -limit,
                    max: limit,
                });
            }
        }
        // |lon·10| ≤ 1800, so the casts are exact.
        let mut ix = (lon * 10.0).floor() as i32;
        if ix == IX_END {
            ix = IX_MIN;
        }
        let iy = ((lat * 10.0).floor() as i32).min(IY_END - 1);
        TileId::from_cell(ix, iy)
    }

    /// Cell column: the tile spans longitudes `ix/10 … (ix+1)/10`.
    pub fn ix(&self) -> i32 {
        i32::from(self.ix)
    }

    /// Cell row: the tile spans latitudes `iy/10 … (iy+1)/10`.
    pub fn iy(&self) -> i32 {
        i32::from(self.iy)
    }

    /// The centre (lon, lat) in degrees.
    pub fn centre(&self) -> (f64, f64) {
        (
            f64::from(self.ix() * 10 + 5) / 100.0,
            f64::from(self.iy() * 10 + 5) / 100.0,
        )
    }

    /// The cell's edges in degrees. `ix/10` is the nearest double to the
    /// decimal edge, so these agree with a point's `floor(x·10)`.
    pub fn bounds(&self) -> Bounds {
        Bounds {
            west: f64::from(self.ix()) / 10.0,
            south: f64::from(self.iy()) / 10.0,
            east: f64::from(self.ix() + 1) / 10.0,
            north: f64::from(self.iy() + 1) / 10.0,
        }
    }

    /// The UTM zone of the tile's centre, which its footprint is projected to.
    pub fn utm_zone(&self) -> UtmZone {
        let (lon, lat) = self.centre();
        UtmZone::of_point(lon, lat)
    }

    /// The name, `grid_{lon:.2f}_{lat:.2f}` of the centre.
    pub fn name(&self) -> String {
        self.to_string()
    }

    /// The two objects a tile's embedding is published as (geotessera's
    /// layout): `grid_X_Y.npy`, int8 (H,W,128), and `grid_X_Y_scales.npy`,
    /// f32 (H,W). The encoder writes them, the agent uploads them and the
    /// server copies them to their final keys under these names.
    pub fn output_names(&self) -> [String; 2] {
        let name = self.name();
        [format!("{name}.npy"), format!("{name}_scales.npy")]
    }
}

/// Writes `hundredths / 100` with two decimals, e.g. -5 → `-0.05`.
fn write_hundredths(f: &mut fmt::Formatter<'_>, hundredths: i32) -> fmt::Result {
    let sign = if hundredths < 0 { "-" } else { "" };
    let abs = hundredths.unsigned_abs();
    write!(f, "{sign}{}.{:02}", abs / 100, abs % 100)
}

impl fmt::Display for TileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("grid_")?;
        write_hundredths(f, self.ix() * 10 + 5)?;
        f.write_str("_")?;
        write_hundredths(f, self.iy() * 10 + 5)
    }
}

/// Parses a two-decimal number such as `-0.05` or `12.35` into hundredths,
/// without going through a float.
fn parse_hundredths(text: &str) -> Option<i32> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (int, frac) = digits.split_once('.')?;
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(int) || frac.len() != 2 || !all_digits(frac) || int.len() > 3 {
        return None;
    }
    let value = int.parse::<i32>().ok()? * 100 + frac.parse::<i32>().ok()?;
    Some(if negative { -value } else { value })
}

impl FromStr for TileId {
    type Err = TileIdError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        let form = || TileIdError::Form {
            name: name.to_owned(),
        };
        let rest = name.strip_prefix("grid_").ok_or_else(form)?;
        // The longitude may be negative, so split after its decimals: the
        // separator is the first '_' (numbers hold none).
        let (lon_text, lat_text) = rest.split_once('_').ok_or_else(form)?;
        let mut cell = [0i32; 2];
        for (slot, (axis, text)) in cell
            .iter_mut()
            .zip([("longitude", lon_text), ("latitude", lat_text)])
        {
            let hundredths = parse_hundredths(text).ok_or_else(|| TileIdError::Number {
                name: name.to_owned(),
                axis,
                text: text.to_owned(),
            })?;
            // A centre is (10·i + 5) hundredths; −0.05 is −5 = 10·(−1) + 5.
            if (hundredths - 5).rem_euclid(10) != 0 {
                return Err(TileIdError::NotCentre {
                    name: name.to_owned(),
                    axis,
                    text: text.to_owned(),
                });
            }
            *slot = (hundredths - 5).div_euclid(10);
        }
        let [ix, iy] = cell;
        TileId::from_cell(ix, iy).map_err(|_| {
            let (lon, lat) = (
                f64::from(ix * 10 + 5) / 100.0,
                f64::from(iy * 10 + 5) / 100.0,
            );
            if (IX_MIN..IX_END).contains(&ix) {
                TileIdError::OutOfRange {
                    axis: "latitude",
                    value: lat,
                    min: -89.95,
                    max: 89.95,
                }
            } else {
                TileIdError::OutOfRange {
                    axis: "longitude",
                    value: lon,
                    min: -179.95,
                    max: 179.95,
                }
            }
        })
    }
}

impl Serialize for TileId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TileId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_everywhere() {
        for ix in IX_MIN..IX_END {
            for iy in [IY_MIN, -1, 0, IY_END - 1] {
                let tile = TileId::from_cell(ix, iy).unwrap();
                let back: TileId = tile.name().parse().unwrap();
                assert_eq!(back, tile);
                let (lon, lat) = tile.centre();
                assert_eq!(tile.name(), format!("grid_{lon:.2}_{lat:.2}"));
                assert_eq!(TileId::from_point(lon, lat).unwrap(), tile);
            }
        }
    }

    #[test]
    fn negative_near_zero_has_its_sign() {
        let tile = TileId::from_point(-0.01, -0.0).unwrap();
        assert_eq!(tile.name(), "grid_-0.05_0.05");
        let tile = TileId::from_point(0.0, -1e-9).unwrap();
        assert_eq!(tile.name(), "grid_0.05_-0.05");
        assert_eq!(tile.bounds().south, -0.1);
        assert_eq!(tile.bounds().north, 0.0);
        assert!(tile.bounds().north.is_sign_positive());
        let parsed: TileId = "grid_-0.05_-0.05".parse().unwrap();
        assert_eq!((parsed.ix(), parsed.iy()), (-1, -1));
    }

    #[test]
    fn point_on_an_edge_belongs_to_the_cell_east_and_north() {
        let tile = TileId::from_point(0.3, 0.7).unwrap();
        assert_eq!(tile.name(), "grid_0.35_0.75");
        assert_eq!(
            TileId::from_point(180.0, 90.0).unwrap().name(),
            "grid_-179.95_89.95"
        );
    }

    #[test]
    fn bad_names_say_why() {
        let err = |s: &str| s.parse::<TileId>().unwrap_err();
        assert!(matches!(err("tile_0.05_0.05"), TileIdError::Form { .. }));
        assert!(matches!(err("grid_0.05"), TileIdError::Form { .. }));
        assert!(matches!(
            err("grid_0.05_0.1"),
            TileIdError::Number {
                axis: "latitude",
                ..
            }
        ));
        assert!(matches!(
            err("grid_+0.05_0.15"),
            TileIdError::Number {
                axis: "longitude",
                ..
            }
        ));
        assert!(matches!(
            err("grid_0.10_0.15"),
            TileIdError::NotCentre {
                axis: "longitude",
                ..
            }
        ));
        assert!(matches!(
            err("grid_0.05_90.05"),
            TileIdError::OutOfRange {
                axis: "latitude",
                ..
            }
        ));
        assert!(matches!(
            err("grid_180.05_0.05"),
            TileIdError::OutOfRange {
                axis: "longitude",
                ..
            }
        ));
        assert!(matches!(
            err("grid_-0.05_0.05_x"),
            TileIdError::Number { .. }
        ));
        let msg = err("grid_0.10_0.15").to_string();
        assert!(
            msg.contains("grid_0.10_0.15") && msg.contains("centre"),
            "{msg}"
        );
        assert!(matches!(
            TileId::from_point(f64::NAN, 0.0),
            Err(TileIdError::NotFinite { .. })
        ));
        assert!(matches!(
            TileId::from_point(0.0, 90.5),
            Err(TileIdError::OutOfRange { .. })
        ));
    }

    #[test]
    fn zones_and_epsg() {
        let z = |name: &str| name.parse::<TileId>().unwrap().utm_zone();
        assert_eq!(z("grid_-179.95_10.05").epsg(), 32601);
        assert_eq!(z("grid_179.95_-10.05").epsg(), 32760);
        assert_eq!(z("grid_-0.05_0.05").epsg(), 32630);
        assert_eq!(z("grid_0.05_-0.05").epsg(), 32731);
    }

    #[test]
    fn serialises_as_name() {
        let tile: TileId = "grid_-79.35_-0.55".parse().unwrap();
        let json = serde_json::to_string(&tile).unwrap();
        assert_eq!(json, "\"grid_-79.35_-0.55\"");
        assert_eq!(serde_json::from_str::<TileId>(&json).unwrap(), tile);
    }
}
