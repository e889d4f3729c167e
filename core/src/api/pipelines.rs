//! `/api/v1/pipelines`: a pipeline run as clients submit it, and its state:
//! counts per item state and the item × step matrix.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// `POST /api/v1/pipelines`: the pipeline file's text; the server parses
/// and checks it (a mistake is a 422 whose message has the file, line and
/// column of each) before it queues anything.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubmitPipeline {
    /// The file's name, for messages and lists.
    pub name: String,
    pub source: String,
    #[serde(default)]
    pub priority: i32,
}

/// The most a pipeline file may be.
pub const MAX_PIPELINE_BYTES: usize = 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum PipelineState {
    /// Its items command is running.
    Listing,
    /// Looking on its hosts for outputs a run of the same file left, to
    /// resume each item after the furthest.
    Probing,
    Running,
    /// Every item went through every step.
    Done,
    /// The listing failed, or an item failed (the others went on).
    Failed,
    Cancelled,
}

impl PipelineState {
    pub fn as_str(self) -> &'static str {
        match self {
            PipelineState::Listing => "listing",
            PipelineState::Probing => "probing",
            PipelineState::Running => "running",
            PipelineState::Done => "done",
            PipelineState::Failed => "failed",
            PipelineState::Cancelled => "cancelled",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            PipelineState::Done | PipelineState::Failed | PipelineState::Cancelled
        )
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            PipelineState::Listing,
            PipelineState::Probing,
            PipelineState::Running,
            PipelineState::Done,
            PipelineState::Failed,
            PipelineState::Cancelled,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }
}

/// Items by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ItemCounts {
    pub waiting: u64,
    pub active: u64,
    pub done: u64,
    pub failed: u64,
    pub cancelled: u64,
}

/// A run in a list.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PipelineSummary {
    pub id: Uuid,
    pub name: String,
    pub state: PipelineState,
    /// How many items the listing gave (none yet while listing).
    pub items: Option<u64>,
    pub counts: ItemCounts,
    pub submitter: String,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
}

/// `GET /api/v1/pipelines?before=ID&limit=N`: runs newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PipelineList {
    pub runs: Vec<PipelineSummary>,
    /// Pass as `before` for the next (older) page: this page's last run.
    /// `null` on the last page.
    pub next: Option<Uuid>,
}

/// Most runs one page of `GET /api/v1/pipelines` holds.
pub const MAX_PIPELINE_PAGE: u32 = 1000;

/// A step (stage or move) as a column of the matrix.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepColumn {
    pub name: String,
    /// `stage` or `move`.
    pub kind: String,
    pub host: String,
    /// Items in it now, done, failed.
    pub running: u64,
    pub succeeded: u64,
    pub failed: u64,
    /// Mean seconds of the items that finished it.
    pub mean_s: Option<f64>,
}

/// One cell: an item at a step.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepCell {
    /// `running`, `succeeded`, `failed` or `cancelled`.
    pub state: String,
    /// The step's current (or last) job.
    pub job_id: Option<Uuid>,
}

/// One row: an item and its cells (`None` where it has not been, or took
/// another branch).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ItemRow {
    pub item: String,
    /// `waiting`, `active`, `done`, `failed` or `cancelled`.
    pub state: String,
    pub cells: Vec<Option<StepCell>>,
    pub error: Option<String>,
}

/// `GET /api/v1/pipelines/{id}`: the run, its columns and a page of rows
/// (`?after=INDEX&limit=N`, items in list order).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PipelineView {
    #[serde(flatten)]
    pub summary: PipelineSummary,
    pub list_job: Uuid,
    pub steps: Vec<StepColumn>,
    /// Each `limit` block's N and how many items are inside it now.
    pub gates: Vec<GateView>,
    pub rows: Vec<ItemRow>,
    /// The index to pass as `after` for the next page, when there is one.
    pub next_after: Option<u64>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GateView {
    pub limit: u32,
    pub inside: u64,
}
