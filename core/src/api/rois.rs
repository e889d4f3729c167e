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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RoiRequest {
    pub name: String,
    pub year: i32,
    pub dataset: String,
    /// A GeoJSON Polygon, MultiPolygon, Feature or FeatureCollection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub geojson: Option<serde_json::Value>,
    /// `[min_lon, min_lat, max_lon, max_lat]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<Vec<f64>>, min_items = 4, max_items = 4)
    )]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    /// What its tile jobs were queued with (0 for an ROI from before
    /// 2026-12-08 whose jobs are no longer kept).
    #[serde(default)]
    pub priority: i32,
    /// This ROI's jobs by state.
    pub jobs: BTreeMap<String, i64>,
    /// Pixels encoded of the pixels known, over this ROI's running and
    /// finished jobs.
    pub pixels_done: i64,
    pub pixels_total: i64,
    /// Every job of this ROI has finished (succeeded, failed or cancelled).
    pub finished: bool,
    /// Its tiles now, by state ([`TileState`]): what the ROI page's map
    /// shows, jobs of earlier ROIs over the same tiles and coverage
    /// included.
    #[serde(default)]
    pub tiles: TileCounts,
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

/// Where one tile of an ROI stands, as the ROI page's map colours it.
///
/// A tile is `done` when its embedding exists (coverage: the fleet's
/// result or an import), whoever made it; otherwise it takes the state of
/// the job that makes it (`tile_jobs`, which may belong to an earlier ROI
/// over the same tiles); with neither it is `missing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TileState {
    Missing,
    Queued,
    Running,
    Done,
    Failed,
}

impl TileState {
    pub const ALL: [TileState; 5] = [
        TileState::Missing,
        TileState::Queued,
        TileState::Running,
        TileState::Done,
        TileState::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TileState::Missing => "missing",
            TileState::Queued => "queued",
            TileState::Running => "running",
            TileState::Done => "done",
            TileState::Failed => "failed",
        }
    }

    /// One letter per state, the live map's compact form (`m q r d f`).
    pub fn letter(self) -> char {
        match self {
            TileState::Missing => 'm',
            TileState::Queued => 'q',
            TileState::Running => 'r',
            TileState::Done => 'd',
            TileState::Failed => 'f',
        }
    }

    /// A tile whose embedding does not exist yet, by its job's state:
    /// waiting (queued, or retrying after a failed attempt) is queued, held
    /// by an agent (leased, running) is running, failed and cancelled are
    /// failed. A succeeded job without coverage cannot be seen (the
    /// completion records both in one transaction); it counts as done.
    pub fn of_job(state: crate::job::JobState) -> TileState {
        use crate::job::JobState as J;
        match state {
            J::Queued | J::Retrying => TileState::Queued,
            J::Leased | J::Running => TileState::Running,
            J::Succeeded => TileState::Done,
            J::Failed | J::Cancelled => TileState::Failed,
        }
    }
}

/// An ROI's tiles by [`TileState`]; they add up to its tiles.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TileCounts {
    pub missing: u64,
    pub queued: u64,
    pub running: u64,
    pub done: u64,
    pub failed: u64,
}

impl TileCounts {
    pub fn get(&self, state: TileState) -> u64 {
        match state {
            TileState::Missing => self.missing,
            TileState::Queued => self.queued,
            TileState::Running => self.running,
            TileState::Done => self.done,
            TileState::Failed => self.failed,
        }
    }

    pub fn add(&mut self, state: TileState, n: u64) {
        let slot = match state {
            TileState::Missing => &mut self.missing,
            TileState::Queued => &mut self.queued,
            TileState::Running => &mut self.running,
            TileState::Done => &mut self.done,
            TileState::Failed => &mut self.failed,
        };
        *slot += n;
    }

    pub fn total(&self) -> u64 {
        self.missing + self.queued + self.running + self.done + self.failed
    }

    /// The ROI's state from its tiles: anything held by an agent is
    /// running, else anything waiting is queued; with nothing left to do,
    /// done if every tile is, else failed if a tile failed, else incomplete
    /// (tiles without a job: submit the ROI again).
    pub fn state(&self) -> RoiState {
        if self.running > 0 {
            RoiState::Running
        } else if self.queued > 0 {
            RoiState::Queued
        } else if self.done == self.total() {
            RoiState::Done
        } else if self.failed > 0 {
            RoiState::Failed
        } else {
            RoiState::Incomplete
        }
    }
}

/// An ROI's state, from its [`TileCounts`] ([`TileCounts::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum RoiState {
    Queued,
    Running,
    Done,
    Failed,
    Incomplete,
}

impl RoiState {
    pub fn as_str(self) -> &'static str {
        match self {
            RoiState::Queued => "queued",
            RoiState::Running => "running",
            RoiState::Done => "done",
            RoiState::Failed => "failed",
            RoiState::Incomplete => "incomplete",
        }
    }
}

/// One ROI in `GET /api/v1/rois`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RoiSummary {
    pub id: Uuid,
    pub name: String,
    pub dataset: String,
    pub year: i32,
    pub submitter: String,
    pub created_at: DateTime<Utc>,
    /// Its tiles now, by state ([`TileState`]).
    pub tiles: TileCounts,
    pub state: RoiState,
}

/// Most ROIs one page of `GET /api/v1/rois` holds (`limit`'s ceiling).
pub const MAX_ROI_PAGE: u32 = 200;

/// `GET /api/v1/rois?before=ID&limit=N`: ROIs newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RoiPage {
    pub rois: Vec<RoiSummary>,
    /// Pass as `before` for the next (older) page; `null` on the last.
    pub next: Option<Uuid>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobState;

    #[test]
    fn tiles_take_their_jobs_states() {
        let of = |s| TileState::of_job(s).as_str();
        assert_eq!(of(JobState::Queued), "queued");
        assert_eq!(of(JobState::Retrying), "queued");
        assert_eq!(of(JobState::Leased), "running");
        assert_eq!(of(JobState::Running), "running");
        assert_eq!(of(JobState::Succeeded), "done");
        assert_eq!(of(JobState::Failed), "failed");
        assert_eq!(of(JobState::Cancelled), "failed");
    }

    #[test]
    fn an_roi_is_as_busy_as_its_busiest_tile() {
        let mut c = TileCounts::default();
        c.add(TileState::Done, 3);
        assert_eq!(c.state(), RoiState::Done);
        c.add(TileState::Missing, 1);
        assert_eq!(c.state(), RoiState::Incomplete);
        c.add(TileState::Failed, 1);
        assert_eq!(c.state(), RoiState::Failed);
        c.add(TileState::Queued, 1);
        assert_eq!(c.state(), RoiState::Queued);
        c.add(TileState::Running, 1);
        assert_eq!(c.state(), RoiState::Running);
        assert_eq!(c.total(), 7);
        assert_eq!(
            serde_json::to_value(c).unwrap(),
            serde_json::json!({"missing": 1, "queued": 1, "running": 1, "done": 3, "failed": 1})
        );
    }
}
