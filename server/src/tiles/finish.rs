//! A tile job's completion, inside the transaction that marks it succeeded.
//!
//! Its two outputs are copied to `{dataset}/{year}/grid_X_Y/` and its
//! coverage is recorded.
//!
//! Order: the job row is updated (locked) first, then the objects are copied
//! from the attempt's own keys, then coverage is written, then the
//! transaction commits. An attempt's objects are complete before they are
//! recorded (multipart upload), a copy is atomic in the store, and nothing
//! says a tile is done until the commit. If the server dies after a copy and
//! before the commit, the job is still running; its retry copies again over
//! the same keys.

use flotilla_core::job::TileJob;
use object_store::path::Path as StorePath;
use object_store::ObjectStore;
use sqlx::PgConnection;
use uuid::Uuid;

/// Why a tile job's success could not be recorded; the caller rolls back.
#[derive(Debug, thiserror::Error)]
pub enum FinishError {
    /// The agent completed without uploading one of the two outputs.
    #[error("tile job output `{name}` was not uploaded for attempt {attempt}")]
    MissingOutput { name: String, attempt: i32 },
    #[error("copying {from} to {to}: {source}")]
    Copy {
        from: String,
        to: String,
        #[source]
        source: object_store::Error,
    },
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Publishes tile job `job`'s outputs of `attempt` (just marked succeeded
/// in `tx`) and records its coverage, in `tx` (see the module
/// documentation).
pub async fn finish_in(
    tx: &mut PgConnection,
    store: &dyn ObjectStore,
    job: Uuid,
    attempt: i32,
    tile: &TileJob,
) -> Result<(), FinishError> {
    let names = tile.tile.output_names();
    let stored: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT name, key, size FROM job_outputs WHERE job_id = $1 AND attempt = $2",
    )
    .bind(job)
    .bind(attempt)
    .fetch_all(&mut *tx)
    .await?;
    let prefix = super::final_prefix(&tile.dataset, tile.year, &tile.tile);
    let mut sizes = [0i64; 2];
    for (i, name) in names.iter().enumerate() {
        let Some((_, key, size)) = stored.iter().find(|(n, _, _)| n == name) else {
            return Err(FinishError::MissingOutput {
                name: name.clone(),
                attempt,
            });
        };
        sizes[i] = *size;
        let to = format!("{prefix}/{name}");
        store
            .copy(
                &StorePath::from(key.as_str()),
                &StorePath::from(to.as_str()),
            )
            .await
            .map_err(|source| FinishError::Copy {
                from: key.clone(),
                to,
                source,
            })?;
    }
    super::coverage::record_fleet(
        tx,
        &tile.dataset,
        tile.year,
        tile.tile,
        sizes[0],
        sizes[1],
        job,
    )
    .await?;
    Ok(())
}
