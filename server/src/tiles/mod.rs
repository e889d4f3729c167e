//! TESSERA tiles on the server: datasets, coverage, ROI planning and submission, tile completion. Owns the `datasets`, `coverage`, `rois` and `tile_jobs` tables.
//!
//! - [`datasets`]: register a dataset (checkpoint in the store, where inputs
//!   come from).
//! - [`coverage`]: which embeddings exist — the fleet's results and imported
//!   geotessera manifests (`manifest.parquet`).
//! - [`plan`]: region → tiles → minus coverage and live jobs → missing; the
//!   bulk insert of one job per missing tile.
//! - [`finish`]: a tile job's completion: copy its outputs to
//!   `{dataset}/{year}/grid_X_Y/` and record coverage in the completion's
//!   transaction.

pub mod coverage;
pub mod datasets;
pub mod finish;
pub mod plan;

/// Years a tile may be encoded for: Sentinel-2 data starts in mid-2015.
pub const YEARS: std::ops::RangeInclusive<i32> = 2015..=2100;

/// The output objects of a tile job, as the agent uploads them.
pub fn output_names(tile: &flotilla_core::grid::TileId) -> [String; 2] {
    let name = tile.name();
    [format!("{name}.npy"), format!("{name}_scales.npy")]
}

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
pub fn check_year(year: i32) -> Result<(), String> {
    if YEARS.contains(&year) {
        Ok(())
    } else {
        Err(format!(
            "`year` {year} is out of range: TESSERA years run from {} to {}",
            YEARS.start(),
            YEARS.end()
        ))
    }
}
