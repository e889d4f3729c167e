//! `/api/v1/datasets`: a model checkpoint in the object store and where a
//! tile's inputs come from; `/api/v1/coverage/import`: which tiles exist.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What `POST /api/v1/datasets` takes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NewDataset {
    pub name: String,
    /// Inputs are the objects `{input_prefix}/{year}/{tile}/bands.npy` etc.
    #[serde(default)]
    pub input_prefix: Option<String>,
    /// Or a shell command the agent runs to fetch them (see
    /// [`crate::job::TileJob::fetch_command`]).
    #[serde(default)]
    pub fetch_command: Option<String>,
}

/// A dataset as the API shows it (`GET /api/v1/datasets`, and the answer to
/// registering one or uploading its checkpoint).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DatasetView {
    pub name: String,
    pub checkpoint_key: Option<String>,
    pub checkpoint_sha256: Option<String>,
    pub checkpoint_size: Option<i64>,
    pub input_prefix: Option<String>,
    pub fetch_command: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// `GET /api/v1/datasets`: a page of datasets by name.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DatasetList {
    pub datasets: Vec<DatasetView>,
    /// The cursor for the next page, to pass as `after`: this page's last
    /// dataset's name. `null` on the last page.
    #[serde(default)]
    pub next: Option<String>,
}

/// Most datasets one page of `GET /api/v1/datasets` holds (`limit`'s ceiling
/// and default).
pub const MAX_DATASET_PAGE: u32 = 1000;

/// `POST /api/v1/coverage/import?dataset=` (the body is a geotessera
/// `manifest.parquet`): what the import did.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CoverageImported {
    pub dataset: String,
    /// Rows in the manifest.
    pub rows: u64,
    /// Rows naming an existing tile (both sizes > 0).
    pub tiles: u64,
    /// Of those, coverage rows written (new or updated imports; a fleet
    /// result is never replaced by an import).
    pub recorded: u64,
}
