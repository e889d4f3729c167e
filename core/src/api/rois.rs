//! `/api/v1/rois`: a region of interest for a year of a dataset — its plan
//! (which tiles are missing), its submission and its progress.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Tiles one ROI may cover unless an admin sets
/// [`RoiRequest::exceed_tile_cap`]. The bounding box of mainland China
/// (73–135°E, 18–54°N: about 223,000 0.1° tiles) fits, as do Brazil's
/// (≈156,000), the contiguous United States' (≈153,000) and Australia's
/// (≈139,000); Russia, Canada and the US with Alaska do not and are split.
/// One submission is one transaction: 250,000 jobs take ≈ 9 s to insert on
/// the 2-core reference machine (BENCHMARKS.md: 1,000,000 in 34 s), where a
/// whole-world bbox (6,480,000 tiles) would hold it for minutes.
pub const MAX_ROI_TILES: u64 = 250_000;

/// What `POST /api/v1/rois` and `POST /api/v1/rois/plan` take.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoiRequest {
    pub name: String,
    pub year: i32,
    pub dataset: String,
    /// A GeoJSON Polygon, MultiPolygon, Feature or FeatureCollection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub geojson: Option<serde_json::Value>,
    /// `[min_lon, min_lat, max_lon, max_lat]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bbox: Option<[f64; 4]>,
    /// Plan only: count, submit nothing.
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default)]
    pub priority: i32,
    /// Lets the region cover more than [`MAX_ROI_TILES`] tiles. Admin tokens
    /// only; a client token that sets it is refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exceed_tile_cap: bool,
}

/// How an ROI splits (`POST /api/v1/rois/plan`, and inside [`RoiCreated`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanCounts {
    /// Tiles whose cell meets the region.
    pub total: u64,
    /// Of those, embeddings that exist (fleet results and imports).
    pub present: u64,
    /// Not present, but a job for it is queued or running already.
    pub in_flight: u64,
    /// Neither: a new job each.
    pub missing: u64,
}

/// `201` answer to `POST /api/v1/rois`: what a submission made.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoiCreated {
    pub id: Uuid,
    #[serde(flatten)]
    pub counts: PlanCounts,
    /// Jobs added (= missing).
    pub submitted: u64,
    /// Milliseconds spent planning and inserting (for the benchmark).
    pub plan_ms: u64,
    pub insert_ms: u64,
}

/// `GET /api/v1/rois/{id}`: an ROI with its progress.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoiView {
    pub id: Uuid,
    pub name: String,
    pub dataset: String,
    pub year: i32,
    pub total: i64,
    pub present: i64,
    pub in_flight: i64,
    pub submitted: i64,
    pub created_at: DateTime<Utc>,
    /// This ROI's jobs by state.
    pub jobs: BTreeMap<String, i64>,
    /// Pixels encoded of the pixels known, over this ROI's running and
    /// finished jobs.
    pub pixels_done: i64,
    pub pixels_total: i64,
    /// Every job of this ROI has finished (succeeded, failed or cancelled).
    pub finished: bool,
}

impl RoiView {
    /// One line of progress: tiles by state, and pixels when agents have
    /// reported them (small tiles finish between two heartbeats).
    pub fn progress_line(&self) -> String {
        let count = |state: &str| self.jobs.get(state).copied().unwrap_or(0);
        let done = count("succeeded");
        let running = count("leased") + count("running");
        let waiting = count("queued") + count("retrying");
        let failed = count("failed") + count("cancelled");
        let total = self.submitted;
        let mut line = format!(
            "tiles {done}/{total} done, {running} running, {waiting} waiting, {failed} failed"
        );
        if self.pixels_total > 0 {
            line.push_str(&format!(
                "; pixels {}/{} ({:.0} %)",
                self.pixels_done,
                self.pixels_total,
                100.0 * self.pixels_done as f64 / self.pixels_total as f64
            ));
        }
        line
    }
}
