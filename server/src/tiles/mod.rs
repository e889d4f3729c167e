//! TESSERA tiles on the server.
//!
//! Owns the `datasets`, `coverage`, `rois` and `tile_jobs` tables.
//!
//! - [`datasets`]: register a dataset (checkpoint in the store, where inputs
//!   come from).
//! - [`checkpoint_check`]: an uploaded checkpoint is dry-loaded in a child
//!   process under memory and CPU limits before it reaches the store.
//! - [`coverage`]: which embeddings exist — the fleet's results and imported
//!   geotessera manifests (`manifest.parquet`).
//! - [`manifest`]: a manifest upload read in a child process and streamed
//!   into `coverage` in one transaction.
//! - [`sandbox`]: the spool file and the resource-limited child that
//!   untrusted uploads are parsed in.
//! - [`plan`]: region → tiles → minus coverage and live jobs → missing; the
//!   bulk insert of one job per missing tile.
//! - [`finish`]: a tile job's completion: copy its outputs to
//!   `{dataset}/{year}/grid_X_Y/` and record coverage in the completion's
//!   transaction.
//! - [`stats`]: tiles per hour per agent.
//! - [`progress`]: where submitted ROIs stand: each tile's state, counts,
//!   the pace of the last hour, the ROI list.

pub mod checkpoint_check;
pub mod coverage;
pub mod datasets;
pub mod finish;
pub mod manifest;
pub mod plan;
pub mod progress;
pub mod sandbox;
pub mod stats;

use flotilla_core::api::FieldError;

/// Years a tile may be encoded for: Sentinel-2 data starts in mid-2015.
pub const YEARS: std::ops::RangeInclusive<i32> = 2015..=2100;

/// Where a finished tile's outputs live in the store.
pub fn final_prefix(dataset: &str, year: i32, tile: &flotilla_core::grid::TileId) -> String {
    format!("{dataset}/{year}/{}", tile.name())
}

/// A dataset name: 1–64 of `A-Za-z0-9_.-`, not starting with `.`; it is a
/// path component of every result key.
pub fn valid_dataset_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Checks a year against [`YEARS`], naming the problem.
pub fn check_year(year: i32) -> Result<(), FieldError> {
    if YEARS.contains(&year) {
        Ok(())
    } else {
        Err(FieldError::new(
            "year",
            format!(
                "`year` {year} is out of range: TESSERA years run from {} to {}",
                YEARS.start(),
                YEARS.end()
            ),
        ))
    }
}
