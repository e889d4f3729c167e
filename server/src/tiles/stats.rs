//! Tiles per hour per agent, from the tile jobs that succeeded.

use flotilla_core::api::tiles::AgentTileRate;

/// Tiles per hour per agent over the last hour, with the mean job time.
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
