//! A tile job's completion: its two outputs are copied to `{dataset}/{year}/grid_X_Y/` and its coverage recorded in the transaction that marks it succeeded, so a partial upload never looks finished.
//!
//! Order: the job row is updated (locked) first, then the objects are copied
//! from the attempt's own keys, then coverage is written, then the
//! transaction commits. An attempt's objects are complete before they are
//! recorded (multipart upload), a copy is atomic in the store, and nothing
//! says a tile is done until the commit. If the server dies after a copy and
//! before the commit, the job is still running; its retry copies again over
//! the same keys.

use flotilla_core::job::{JobSpec, TileJob};
use flotilla_core::protocol::Complete;
use object_store::path::Path as StorePath;
use uuid::Uuid;

use crate::error::ApiError;
use crate::queue::lease::{self, LeaseRefused};
use crate::state::AppState;

/// The tile spec of a job, if it is a tile job.
pub async fn tile_spec(db: &sqlx::PgPool, job: Uuid) -> Result<Option<TileJob>, sqlx::Error> {
    let spec: Option<(String, serde_json::Value)> =
        sqlx::query_as("SELECT kind, spec FROM jobs WHERE id = $1")
            .bind(job)
            .fetch_optional(db)
            .await?;
    Ok(match spec {
        Some((kind, spec)) if kind == "tile" => match serde_json::from_value(spec) {
            Ok(JobSpec::Tile(t)) => Some(t),
            _ => None,
        },
        _ => None,
    })
}

/// Completes a tile job (see the module documentation).
pub async fn complete(
    state: &AppState,
    agent: Uuid,
    job: Uuid,
    c: &Complete,
    tile: &TileJob,
) -> Result<(), ApiError> {
    let names = super::output_names(&tile.tile);
    let mut outputs = c.outputs.clone();
    for n in &names {
        if !outputs.contains(n) {
            outputs.push(n.clone());
        }
    }
    let mut tx = state.db.begin().await?;
    let attempt = lease::complete_in(
        &state.db,
        &mut tx,
        agent,
        job,
        c.lease_token,
        c.exit_code,
        &outputs,
        c.result.as_ref(),
    )
    .await
    .map_err(ApiError::from)?;
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
            return Err(LeaseRefused::Invalid(format!(
                "tile job output `{name}` was not uploaded for attempt {attempt}"
            ))
            .into());
        };
        sizes[i] = *size;
        let to = format!("{prefix}/{name}");
        state
            .store
            .copy(
                &StorePath::from(key.as_str()),
                &StorePath::from(to.as_str()),
            )
            .await
            .map_err(|e| ApiError::Internal(anyhow::anyhow!("copying {key} to {to}: {e}")))?;
    }
    super::coverage::record_fleet(
        &mut tx,
        &tile.dataset,
        tile.year,
        tile.tile,
        sizes[0],
        sizes[1],
        job,
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Tiles per hour per agent over the last hour, with the mean job time.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AgentTileRate {
    pub agent: String,
    pub tiles_last_hour: i64,
    /// Tiles per hour at the mean job time of the last hour, times the
    /// agent's slots: what it sustains while busy.
    pub tiles_per_hour: f64,
    pub mean_seconds: f64,
    pub tiles_total: i64,
}

pub async fn rates(db: &sqlx::PgPool) -> Result<Vec<AgentTileRate>, sqlx::Error> {
    let rows: Vec<(String, i64, Option<f64>, i64, i32)> = sqlx::query_as(
        "SELECT a.name,
                count(*) FILTER (WHERE j.finished_at > now() - interval '1 hour'),
                avg(extract(epoch FROM j.finished_at - j.started_at)::float8)
                    FILTER (WHERE j.finished_at > now() - interval '1 hour'),
                count(*),
                a.capacity
         FROM jobs j JOIN agents a ON a.id = j.agent_id
         WHERE j.kind = 'tile' AND j.state = 'succeeded'
         GROUP BY a.name, a.capacity ORDER BY a.name",
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(agent, last_hour, mean, total, capacity)| {
            let mean = mean.unwrap_or(0.0);
            AgentTileRate {
                agent,
                tiles_last_hour: last_hour,
                tiles_per_hour: if mean > 0.0 {
                    3600.0 / mean * capacity.max(1) as f64
                } else {
                    0.0
                },
                mean_seconds: mean,
                tiles_total: total,
            }
        })
        .collect())
}
