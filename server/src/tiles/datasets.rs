//! Datasets: a checkpoint and where tile inputs come from; owns `datasets`.

use flotilla_core::api::datasets::{DatasetView, NewDataset};
use flotilla_core::api::FieldError;
use sqlx::PgPool;

/// A row of `datasets`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Dataset {
    pub name: String,
    pub checkpoint_key: Option<String>,
    pub checkpoint_sha256: Option<String>,
    pub checkpoint_size: Option<i64>,
    pub input_prefix: Option<String>,
    pub fetch_command: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

impl From<Dataset> for DatasetView {
    fn from(d: Dataset) -> Self {
        DatasetView {
            name: d.name,
            checkpoint_key: d.checkpoint_key,
            checkpoint_sha256: d.checkpoint_sha256,
            checkpoint_size: d.checkpoint_size,
            input_prefix: d.input_prefix,
            fetch_command: d.fetch_command,
            created_at: d.created_at,
        }
    }
}

/// A dataset registration whose fields have been checked.
#[derive(Debug, Clone)]
pub struct ValidDataset {
    pub name: String,
    pub input_prefix: Option<String>,
    pub fetch_command: Option<String>,
}

impl TryFrom<NewDataset> for ValidDataset {
    type Error = FieldError;

    fn try_from(d: NewDataset) -> Result<Self, FieldError> {
        if !super::valid_dataset_name(&d.name) {
            return Err(FieldError::new(
                "name",
                format!(
                    "`name` {:?} is not a dataset name: 1 to 64 of A-Z a-z 0-9 _ . - \
                     (not starting with .)",
                    d.name
                ),
            ));
        }
        let input_prefix = match (&d.input_prefix, &d.fetch_command) {
            (None, None) => {
                return Err(FieldError::new(
                    "input_prefix",
                    "give `input_prefix` (inputs in the object store) or `fetch_command`",
                ))
            }
            (Some(p), _) => {
                let p = p.trim_matches('/');
                if p.is_empty() {
                    return Err(FieldError::at("input_prefix", "is empty"));
                }
                flotilla_core::job::check_output_path(p)
                    .map_err(|why| FieldError::at("input_prefix", why))?;
                Some(p.to_string())
            }
            (None, Some(c)) if c.trim().is_empty() => {
                return Err(FieldError::at("fetch_command", "is empty"))
            }
            (None, Some(_)) => None,
        };
        Ok(ValidDataset {
            name: d.name,
            input_prefix,
            fetch_command: d.fetch_command,
        })
    }
}

/// Registers or updates a dataset (the checkpoint is kept).
pub async fn upsert(db: &PgPool, d: &ValidDataset) -> Result<Dataset, sqlx::Error> {
    sqlx::query_as(
        "INSERT INTO datasets (name, input_prefix, fetch_command) VALUES ($1, $2, $3)
         ON CONFLICT (name) DO UPDATE SET input_prefix = EXCLUDED.input_prefix,
                                          fetch_command = EXCLUDED.fetch_command
         RETURNING *",
    )
    .bind(&d.name)
    .bind(&d.input_prefix)
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

/// Up to `limit` datasets by name, from the first after `after`.
pub async fn page(
    db: &PgPool,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<Dataset>, sqlx::Error> {
    sqlx::query_as(
        "SELECT * FROM datasets WHERE $1::text IS NULL OR name > $1 ORDER BY name LIMIT $2",
    )
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// The advisory lock between checkpoint uploads and the store's sweep: an
/// upload holds it shared from writing its object until the dataset points
/// at it (committed), the sweep's checkpoint pass alone, so the sweep never
/// takes the datasets' keys while an upload is between the two (a checkpoint
/// uploaded again, same key, rewritten after the sweep listed it, would
/// otherwise go with the dataset pointing at it). "flotilla checkpoints"
/// as bytes.
pub const CHECKPOINTS_LOCK: i64 = 0x666c_6f74_636b_7074;

/// The checkpoint keys the datasets point at (what `store::sweep` keeps).
pub async fn checkpoint_keys(
    conn: &mut sqlx::PgConnection,
) -> Result<std::collections::HashSet<String>, sqlx::Error> {
    let keys: Vec<String> =
        sqlx::query_scalar("SELECT checkpoint_key FROM datasets WHERE checkpoint_key IS NOT NULL")
            .fetch_all(conn)
            .await?;
    Ok(keys.into_iter().collect())
}

/// Points the dataset at a stored checkpoint.
pub async fn set_checkpoint(
    conn: &mut sqlx::PgConnection,
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
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}
