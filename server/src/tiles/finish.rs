//! A tile job's completion: its two outputs are copied to
//! `{dataset}/{year}/grid_X_Y/` and its coverage is recorded.
//!
//! Order: while the lease is current, the objects are copied from the
//! attempt's own keys ([`publish`]) with no database connection held (a
//! copy of a large object takes seconds on S3, and the agents' calls share
//! a small pool); then one transaction marks the job succeeded (checking
//! the lease again, under the row's lock), writes coverage ([`record_in`])
//! and commits, copying there only what was not published ahead. An
//! attempt's objects are complete before they are recorded
//! (multipart upload), a copy is atomic in the store, and nothing says a
//! tile is done until the commit. If the server dies after a copy and
//! before the commit, the job is still running; the agent's retried report
//! or the job's next attempt copies again over the same keys. A lease that
//! lapses between the copy and the commit is refused there, and the
//! attempt that does commit copies its own outputs before it records
//! anything; only a copy that outlasts the whole lease (which the agent's
//! heartbeats renew meanwhile) could land after it, and then its bytes are
//! the same tile encoded from the same inputs and model.

use flotilla_core::job::TileJob;
use object_store::path::Path as StorePath;
use object_store::ObjectStore;
use sqlx::{PgConnection, PgPool};
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

/// An attempt's two outputs as they were copied to their final keys
/// ((name, key, size), in [`TileJob`]'s output order), for [`record_in`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub attempt: i32,
    outputs: [(String, String, i64); 2],
}

/// Copies tile job `job`'s outputs of `attempt` to the tile's final keys.
/// Reads which were uploaded on a connection it gives back at once, then
/// copies with none held: a copy of a large object takes seconds on S3.
/// `Ok(None)` if an output is not uploaded (the completion then refuses,
/// naming it).
///
/// An agent's report retried while the first is still copying (its call
/// timed out) copies again: the same bytes to the same keys, and only one
/// of the two completions commits.
pub async fn publish(
    db: &PgPool,
    store: &dyn ObjectStore,
    job: Uuid,
    attempt: i32,
    tile: &TileJob,
) -> Result<Option<Published>, FinishError> {
    let stored = uploaded(db, job, attempt).await?;
    let Ok(outputs) = outputs_of(tile, attempt, &stored) else {
        return Ok(None);
    };
    copy_all(store, tile, &outputs).await?;
    Ok(Some(Published { attempt, outputs }))
}

/// Records the coverage of tile job `job` (its `attempt` just marked
/// succeeded in `tx`) from the outputs the attempt holds, read again in
/// `tx`. Those already copied by [`publish`] (`ahead`) are not copied
/// again; any others (none published ahead, or the attempt's uploads
/// changed since) are copied here, in the transaction.
pub async fn record_in(
    tx: &mut PgConnection,
    store: &dyn ObjectStore,
    job: Uuid,
    attempt: i32,
    tile: &TileJob,
    ahead: Option<&Published>,
) -> Result<(), FinishError> {
    let stored = uploaded(&mut *tx, job, attempt).await?;
    let outputs = outputs_of(tile, attempt, &stored)?;
    let copied = ahead.is_some_and(|p| p.attempt == attempt && p.outputs == outputs);
    if !copied {
        copy_all(store, tile, &outputs).await?;
    }
    super::coverage::record_fleet(
        tx,
        &tile.dataset,
        tile.year,
        tile.tile,
        outputs[0].2,
        outputs[1].2,
        job,
    )
    .await?;
    Ok(())
}

/// (name, key, size) of each output attempt `attempt` of `job` uploaded.
async fn uploaded<'c, E>(
    db: E,
    job: Uuid,
    attempt: i32,
) -> Result<Vec<(String, String, i64)>, sqlx::Error>
where
    E: sqlx::PgExecutor<'c>,
{
    sqlx::query_as("SELECT name, key, size FROM job_outputs WHERE job_id = $1 AND attempt = $2")
        .bind(job)
        .bind(attempt)
        .fetch_all(db)
        .await
}

/// The tile's two outputs among `stored`, in [`TileJob`]'s order.
fn outputs_of(
    tile: &TileJob,
    attempt: i32,
    stored: &[(String, String, i64)],
) -> Result<[(String, String, i64); 2], FinishError> {
    let names = tile.tile.output_names();
    let find = |name: &String| {
        stored
            .iter()
            .find(|(n, _, _)| n == name)
            .cloned()
            .ok_or_else(|| FinishError::MissingOutput {
                name: name.clone(),
                attempt,
            })
    };
    Ok([find(&names[0])?, find(&names[1])?])
}

/// Copies each output from its attempt's key to the tile's final key.
async fn copy_all(
    store: &dyn ObjectStore,
    tile: &TileJob,
    found: &[(String, String, i64); 2],
) -> Result<(), FinishError> {
    let prefix = super::final_prefix(&tile.dataset, tile.year, &tile.tile);
    for (name, key, _) in found {
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
    Ok(())
}
