//! `/api/v1/tiles/stats`: tiles per hour per agent.

use serde::{Deserialize, Serialize};

/// One entry of `GET /api/v1/tiles/stats`: tiles per hour of one agent over
/// the last hour, with the mean job time.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentTileRate {
    pub agent: String,
    pub tiles_last_hour: i64,
    /// Tiles per hour at the mean job time of the last hour, times the
    /// agent's slots: what it sustains while busy.
    pub tiles_per_hour: f64,
    pub mean_seconds: f64,
    pub tiles_total: i64,
}
