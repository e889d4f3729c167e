//! `flotilla tiles info|place`: tile geometry as JSON, computed locally.
//!
//! Footprints and zone-grid placement come from `flotilla_core::grid`; no
//! server is needed.

use std::io::Write;

use anyhow::Context;
use clap::Subcommand;
use flotilla_core::grid::{place, tile_info, TileId};

#[derive(Subcommand)]
pub enum TilesCommand {
    /// Each tile's UTM footprint at 10 m, one JSON object a line:
    /// {"tile","zone","epsg","origin_e","origin_n","width","height"}.
    Info {
        /// Tile names, e.g. grid_0.15_52.05.
        #[arg(required = true)]
        tiles: Vec<String>,
    },
    /// Tiles of one UTM zone placed in one zone grid, as one JSON object:
    /// {"zone","origin_x","origin_y","width_px","height_px",
    /// "placed":[{"tile","row","col","width","height"}…]}.
    Place {
        /// Tile names, all in one UTM zone.
        #[arg(required = true)]
        tiles: Vec<String>,
    },
}

fn parse_tiles(names: &[String]) -> anyhow::Result<Vec<TileId>> {
    names
        .iter()
        .map(|n| n.parse::<TileId>().map_err(anyhow::Error::from))
        .collect()
}

pub fn tiles(cmd: TilesCommand) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match cmd {
        TilesCommand::Info { tiles } => {
            for tile in parse_tiles(&tiles)? {
                serde_json::to_writer(&mut out, &tile_info(&tile))?;
                out.write_all(b"\n")?;
            }
        }
        TilesCommand::Place { tiles } => {
            let grid = place(&parse_tiles(&tiles)?)?;
            serde_json::to_writer(&mut out, &grid)?;
            out.write_all(b"\n")?;
        }
    }
    out.flush().context("writing to stdout")
}
