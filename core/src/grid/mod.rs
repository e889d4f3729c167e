//! TESSERA tile grid geometry: 0.1° tiles, their UTM footprints at 10 m, and their placement in one zone grid.
//!
//! The rules are geotessera 0.11.0's (the release with the floor fix for tile
//! placement), checked against its output in
//! `shared/fixtures/geometry/geotessera-0.11.0.jsonl` and, for every tile with
//! an edge on a central meridian or zone boundary, in
//! `core/tests/data/geotessera-0.11.0-edges.jsonl.gz`:
//!
//! - A tile is a 0.1° cell named by its centre, `grid_{lon:.2f}_{lat:.2f}`,
//!   centre = `floor(x·10)/10 + 0.05` ([`TileId`]).
//! - Its UTM zone is `floor((lon+180)/6)+1` of the centre, EPSG 326zz when the
//!   centre is north of the equator, 327zz south ([`UtmZone`]).
//! - Its footprint is its four corners, centre ± 0.05°, projected at 10 m
//!   ([`tile_info`]) by PROJ's UTM reproduced bit for bit ([`tmerc`]), since
//!   the pixel a corner falls in is the floor of PROJ's own number.
//! - Several tiles of one zone share one grid whose pixel offsets are floored,
//!   never rounded ([`place`]).

mod tile;
pub mod tmerc;
mod zone;

pub use tile::{Bounds, TileId, TileIdError, UtmZone, IX_END, IX_MIN, IY_END, IY_MIN};
pub use zone::{
    place, tile_info, GridError, Placement, TileInfo, ZoneGrid, PIXEL_M, ZONE_GRID_BLOCK_PX,
};
