//! Tile footprints in their UTM zone and the placement of several tiles in one zone grid.

use serde::{Deserialize, Serialize};

use super::tile::{TileId, UtmZone};
use super::tmerc::UTM_FALSE_NORTHING_SOUTH;

/// Pixel size of TESSERA embeddings, metres.
pub const PIXEL_M: f64 = 10.0;
/// Zone grids are padded to multiples of this many pixels on each axis.
pub const ZONE_GRID_BLOCK_PX: u32 = 4096;

/// A tile's footprint in its UTM zone: what `flotilla tiles info` prints, one
/// object a line.
///
/// `origin_e` is the lesser easting of the two west corners and `origin_n` the
/// greater northing of the two north corners, unsnapped; `width`/`height` are
/// the extents to the greatest easting of the east corners and the least
/// northing of the south corners, in 10 m pixels, rounded half to even
/// (Python's `round`, as geotessera computes them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TileInfo {
    pub tile: TileId,
    /// UTM zone, 1..=60.
    pub zone: u8,
    /// 326zz north of the equator, 327zz south (by the tile's centre).
    pub epsg: u32,
    /// Metres, in `epsg`.
    pub origin_e: f64,
    /// Metres, in `epsg` (southern tiles include the 10,000 km false northing).
    pub origin_n: f64,
    /// Pixels.
    pub width: u32,
    /// Pixels.
    pub height: u32,
}

/// Several tiles of one UTM zone in one raster: what `flotilla tiles place`
/// prints.
///
/// Coordinates are in the zone's northern EPSG (326zz) — southern tiles'
/// northings less 10,000,000 — so tiles on both sides of the equator share one
/// grid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ZoneGrid {
    pub zone: u8,
    /// West edge, metres: the least easting of any tile corner, floored to
    /// 10 m.
    pub origin_x: f64,
    /// North edge, metres (northern EPSG): the greatest northing of any tile
    /// corner projected to the northern EPSG, ceiled to 10 m.
    pub origin_y: f64,
    /// Columns: from `origin_x` to the greatest corner easting ceiled to
    /// 10 m, padded to a multiple of 4096.
    pub width_px: u32,
    /// Rows: from `origin_y` to the least corner northing floored to 10 m,
    /// padded to a multiple of 4096.
    pub height_px: u32,
    /// One entry per input tile, in input order.
    pub placed: Vec<Placement>,
}

/// Where one tile's raster sits in a [`ZoneGrid`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub tile: TileId,
    /// `floor((origin_y − origin_n) / 10)`.
    pub row: u32,
    /// `floor((origin_e − origin_x) / 10)`.
    pub col: u32,
    /// The tile's own width in pixels, as in [`TileInfo`].
    pub width: u32,
    /// The tile's own height in pixels, as in [`TileInfo`].
    pub height: u32,
}

/// Why tiles cannot share a zone grid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GridError {
    #[error("no tiles to place")]
    NoTiles,
    #[error("tiles lie in different UTM zones and cannot share one grid: {}", describe_zones(.zones))]
    MixedZones {
        /// Each zone with the input tiles that fall in it, zones ascending.
        zones: Vec<(u8, Vec<TileId>)>,
    },
}

fn describe_zones(zones: &[(u8, Vec<TileId>)]) -> String {
    zones
        .iter()
        .map(|(zone, tiles)| {
            let names: Vec<String> = tiles.iter().map(TileId::to_string).collect();
            format!("zone {zone} ({})", names.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A tile's corners as geotessera computes them: its centre ± 0.05°, in
/// floating point (`lon - 0.05`, not the cell edge `ix / 10`, which can differ
/// from it in the last bit; PROJ then sees the same input as geotessera).
fn corners(tile: &TileId) -> [(f64, f64); 4] {
    const HALF: f64 = 0.05;
    let (lon, lat) = tile.centre();
    let (west, east) = (lon - HALF, lon + HALF);
    let (south, north) = (lat - HALF, lat + HALF);
    [(west, north), (east, north), (west, south), (east, south)]
}

/// A tile's footprint: its four corners projected to the UTM zone of its
/// centre (see [`TileInfo`] for which corners give which number), as
/// geotessera's `project_tile`.
pub fn tile_info(tile: &TileId) -> TileInfo {
    let utm = tile.utm_zone();
    let proj = utm.projection();
    let [ul, ur, ll, lr] = corners(tile).map(|(lon, lat)| proj.forward(lon, lat));
    let origin_e = ul.0.min(ll.0);
    let origin_n = ul.1.max(ur.1);
    let max_e = ur.0.max(lr.0);
    let min_n = ll.1.min(lr.1);
    TileInfo {
        tile: *tile,
        zone: utm.zone,
        epsg: utm.epsg(),
        origin_e,
        origin_n,
        width: pixels(max_e - origin_e),
        height: pixels(origin_n - min_n),
    }
}

/// A positive extent in metres as whole pixels, rounded half to even like
/// Python's `round`. A tile is at most ~1,130 px on a side, so the cast is
/// exact.
fn pixels(extent_m: f64) -> u32 {
    (extent_m / PIXEL_M).round_ties_even().max(0.0) as u32
}

/// Pads a pixel count up to a whole number of 4096-pixel blocks (at least one).
fn pad_to_block(px: u32) -> u32 {
    px.div_ceil(ZONE_GRID_BLOCK_PX).max(1) * ZONE_GRID_BLOCK_PX
}

/// Places tiles of one UTM zone in one grid (see [`ZoneGrid`]).
///
/// Offsets are floored, never rounded: two neighbours' fractional offsets can
/// straddle .5 (grid_-79.35_-0.55 at column 0.354, width 1113, and
/// grid_-79.25_-0.55 at 1113.508), and rounding the second to 1114 would open
/// a one-pixel seam between them; floor puts it at 1113, abutting.
///
/// Errors when `tiles` is empty or spans more than one zone (naming the tiles
/// in each zone). Repeated tiles are placed once per occurrence.
pub fn place(tiles: &[TileId]) -> Result<ZoneGrid, GridError> {
    let infos: Vec<TileInfo> = tiles.iter().map(tile_info).collect();
    let zone = infos.first().ok_or(GridError::NoTiles)?.zone;
    if infos.iter().any(|info| info.zone != zone) {
        let mut zones: Vec<(u8, Vec<TileId>)> = Vec::new();
        for info in &infos {
            match zones.iter_mut().find(|(z, _)| *z == info.zone) {
                Some((_, members)) => members.push(info.tile),
                None => zones.push((info.zone, vec![info.tile])),
            }
        }
        zones.sort_by_key(|(z, _)| *z);
        return Err(GridError::MixedZones { zones });
    }

    // The grid's extent is geotessera's `_compute_zone_grid_from_landmask`:
    // every corner projected straight to the zone's northern EPSG (for a
    // southern tile that is not bit for bit its 327zz northing less 10,000
    // km), the edges snapped outwards to 10 m and the size padded.
    let proj = UtmZone { zone, south: false }.projection();
    let (mut min_x, mut max_x) = (f64::INFINITY, f64::NEG_INFINITY);
    let (mut min_y, mut max_y) = (f64::INFINITY, f64::NEG_INFINITY);
    for (lon, lat) in infos.iter().flat_map(|info| corners(&info.tile)) {
        let (x, y) = proj.forward(lon, lat);
        min_x = min_x.min(x);
        max_x = max_x.max(x);
        min_y = min_y.min(y);
        max_y = max_y.max(y);
    }
    let origin_x = (min_x / PIXEL_M).floor() * PIXEL_M;
    let origin_y = (max_y / PIXEL_M).ceil() * PIXEL_M;
    let extent_right = (max_x / PIXEL_M).ceil() * PIXEL_M;
    let extent_bottom = (min_y / PIXEL_M).floor() * PIXEL_M;

    // Each tile by its own footprint (`_tile_pixel_offset`): a southern
    // tile's northing less the false northing.
    let north = |info: &TileInfo| {
        if info.tile.utm_zone().south {
            info.origin_n - UTM_FALSE_NORTHING_SOUTH
        } else {
            info.origin_n
        }
    };
    let placed: Vec<Placement> = infos
        .iter()
        .map(|info| Placement {
            tile: info.tile,
            // Both differences are ≥ 0 by the choice of origin (a tile's
            // footprint corners are among the grid's), and a zone is under
            // 10⁶ px across, so the casts are exact.
            row: ((origin_y - north(info)) / PIXEL_M).floor() as u32,
            col: ((info.origin_e - origin_x) / PIXEL_M).floor() as u32,
            width: info.width,
            height: info.height,
        })
        .collect();
    Ok(ZoneGrid {
        zone,
        origin_x,
        origin_y,
        width_px: pad_to_block(pixels(extent_right - origin_x)),
        height_px: pad_to_block(pixels(origin_y - extent_bottom)),
        placed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tile(name: &str) -> TileId {
        name.parse().expect("test tile names are valid")
    }

    #[test]
    fn mixed_zones_name_the_tiles() {
        let err = place(&[
            tile("grid_5.95_1.05"),
            tile("grid_6.05_1.05"),
            tile("grid_5.85_1.05"),
        ])
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "tiles lie in different UTM zones and cannot share one grid: \
             zone 31 (grid_5.95_1.05, grid_5.85_1.05); zone 32 (grid_6.05_1.05)"
        );
        assert_eq!(place(&[]).unwrap_err(), GridError::NoTiles);
    }

    #[test]
    fn padding() {
        assert_eq!(pad_to_block(0), 4096);
        assert_eq!(pad_to_block(4096), 4096);
        assert_eq!(pad_to_block(4097), 8192);
    }

    #[test]
    fn equator_straddling_grid_is_continuous() {
        let grid = place(&[tile("grid_3.05_0.05"), tile("grid_3.05_-0.05")]).unwrap();
        let (n, s) = (&grid.placed[0], &grid.placed[1]);
        assert_eq!(n.row, 0);
        // The southern tile starts where the northern one ends (±1 px of
        // rounding in the heights).
        assert!(
            (i64::from(s.row) - i64::from(n.height)).abs() <= 1,
            "{grid:?}"
        );
    }
}
