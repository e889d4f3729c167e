//! Datasets: a model checkpoint in the object store and where a tile's inputs come from.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// What `POST /api/v1/datasets` takes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewDataset {
    pub name: String,
    /// Inputs are the objects `{input_prefix}/{year}/{tile}/bands.npy` etc.
    #[serde(default)]
    pub input_prefix: Option<String>,
    /// Or a shell command the agent runs to fetch them (see
    /// `flotilla_core::job::TileJob::fetch_command`).
    #[serde(default)]
    pub fetch_command: Option<String>,
}

/// A dataset as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow)]
pub struct Dataset {
    pub name: String,
    pub checkpoint_key: Option<String>,
    pub checkpoint_sha256: Option<String>,
    pub checkpoint_size: Option<i64>,
    pub input_prefix: Option<String>,
    pub fetch_command: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// Says what is wrong with a dataset, or nothing.
pub fn validate(d: &NewDataset) -> Result<(), String> {
    if !super::valid_dataset_name(&d.name) {
        return Err(format!(
            "`name` {:?} is not a dataset name: 1 to 64 of A-Z a-z 0-9 _ . - (not starting with .)",
            d.name
        ));
    }
    match (&d.input_prefix, &d.fetch_command) {
        (None, None) => {
            return Err(
                "give `input_prefix` (inputs in the object store) or `fetch_command`".into(),
            )
        }
        (Some(p), _) => {
            let p = p.trim_matches('/');
            if p.is_empty() {
                return Err("`input_prefix` is empty".into());
            }
            flotilla_core::job::check_output_path(p)
                .map_err(|why| format!("`input_prefix` {why}"))?;
        }
        (None, Some(c)) if c.trim().is_empty() => return Err("`fetch_command` is empty".into()),
        _ => {}
    }
    Ok(())
}

/// Registers or updates a dataset (the checkpoint is kept).
pub async fn upsert(db: &PgPool, d: &NewDataset) -> Result<Dataset, sqlx::Error> {
    sqlx::query_as(
        "INSERT INTO datasets (name, input_prefix, fetch_command) VALUES ($1, $2, $3)
         ON CONFLICT (name) DO UPDATE SET input_prefix = EXCLUDED.input_prefix,
                                          fetch_command = EXCLUDED.fetch_command
         RETURNING *",
    )
    .bind(&d.name)
    .bind(d.input_prefix.as_deref().map(|p| p.trim_matches('/')))
    .bind(&d.fetch_command)
    .fetch_one(db)
    .await
}

pub async fn get(db: &PgPool, name: &str) -> Result<Option<Dataset>, sqlx::Error> {
    sqlx::query_as("SELECT * FROM datasets WHERE name = $1")
        .bind(name)
        .fetch_optional(db)
        .await
}

pub async fn list(db: &PgPool) -> Result<Vec<Dataset>, sqlx::Error> {
    sqlx::query_as("SELECT * FROM datasets ORDER BY name")
        .fetch_all(db)
        .await
}

/// Points the dataset at a stored checkpoint.
pub async fn set_checkpoint(
    db: &PgPool,
    name: &str,
    key: &str,
    sha256: &str,
    size: u64,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE datasets SET checkpoint_key = $2, checkpoint_sha256 = $3, checkpoint_size = $4
         WHERE name = $1",
    )
    .bind(name)
    .bind(key)
    .bind(sha256)
    .bind(size as i64)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}
