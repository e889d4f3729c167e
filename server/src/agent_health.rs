//! The `agent_health_samples` table: each agent's heartbeat reports over
//! time, at most one per sample interval, kept for a window.
//!
//! A heartbeat writes with one statement ([`record`]) that inserts only if
//! the agent's latest sample is older than the interval, and, when it did
//! insert, deletes that agent's samples older than the window. Both walk
//! the table's primary key (agent, time), so the cost does not grow with
//! the fleet or the window (measured in `tests/tests/e2e/agent_page.rs`). Many
//! server instances may take one agent's heartbeats; the check is in SQL,
//! so they still keep one sample per interval (two racing inserts at the
//! same instant are resolved by the key).

use chrono::{DateTime, Utc};
use flotilla_core::api::HealthSample;
use flotilla_core::health::HostHealth;
use sqlx::PgPool;
use uuid::Uuid;

use crate::state::HealthSampling;

/// Keeps `health` as `agent`'s sample if its last one is at least
/// `sampling.interval` old; then drops its samples older than
/// `sampling.window`. Returns whether a sample was kept.
pub async fn record(
    db: &PgPool,
    agent: Uuid,
    health: &HostHealth,
    sampling: HealthSampling,
) -> Result<bool, sqlx::Error> {
    let kept: i64 = sqlx::query_scalar(
        "WITH kept AS (
             INSERT INTO agent_health_samples
                 (agent_id, at, cpu_busy, memory_used_bytes, memory_total_bytes, disk_used,
                  open_fds, max_fds, load_1m, process_cpu_seconds, process_resident_bytes)
             SELECT $1, now(), $2, $3, $4, $5, $6, $7, $8, $9, $10
             WHERE NOT EXISTS (
                 SELECT 1 FROM agent_health_samples
                 WHERE agent_id = $1 AND at > now() - $11 * interval '1 millisecond')
             ON CONFLICT DO NOTHING
             RETURNING at),
         old AS (
             DELETE FROM agent_health_samples
             WHERE agent_id = $1 AND at < now() - $12 * interval '1 millisecond'
               AND EXISTS (SELECT 1 FROM kept))
         SELECT count(*) FROM kept",
    )
    .bind(agent)
    .bind(health.cpu_busy.map(|f| f as f32))
    .bind(to_i64(
        health
            .memory_total_bytes
            .saturating_sub(health.memory_available_bytes),
    ))
    .bind(to_i64(health.memory_total_bytes))
    .bind(health.disk_used_fraction().map(|f| f as f32))
    .bind(health.open_fds.map(to_i64))
    .bind(health.max_fds.map(to_i64))
    .bind(health.load_1m.map(|l| l as f32))
    .bind(health.process_cpu_seconds)
    .bind(health.process_resident_bytes.map(to_i64))
    .bind(millis(sampling.interval))
    .bind(millis(sampling.window))
    .fetch_one(db)
    .await?;
    Ok(kept > 0)
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

#[derive(sqlx::FromRow)]
struct SampleRow {
    at: DateTime<Utc>,
    cpu_busy: Option<f32>,
    memory_used_bytes: i64,
    memory_total_bytes: i64,
    disk_used: Option<f32>,
    open_fds: Option<i64>,
    max_fds: Option<i64>,
    load_1m: Option<f32>,
    process_cpu_seconds: Option<f64>,
    process_resident_bytes: Option<i64>,
}

impl From<SampleRow> for HealthSample {
    fn from(r: SampleRow) -> Self {
        HealthSample {
            at: r.at,
            cpu_busy: r.cpu_busy.map(f64::from),
            memory_used_bytes: to_u64(r.memory_used_bytes),
            memory_total_bytes: to_u64(r.memory_total_bytes),
            disk_used: r.disk_used.map(f64::from),
            open_fds: r.open_fds.map(to_u64),
            max_fds: r.max_fds.map(to_u64),
            load_1m: r.load_1m.map(f64::from),
            process_cpu_seconds: r.process_cpu_seconds,
            process_resident_bytes: r.process_resident_bytes.map(to_u64),
        }
    }
}

/// `agent`'s samples taken after `since`, oldest first, at most `limit`.
pub async fn since(
    db: &PgPool,
    agent: Uuid,
    since: DateTime<Utc>,
    limit: u32,
) -> Result<Vec<HealthSample>, sqlx::Error> {
    let rows: Vec<SampleRow> = sqlx::query_as(
        "SELECT at, cpu_busy, memory_used_bytes, memory_total_bytes, disk_used, open_fds,
                max_fds, load_1m, process_cpu_seconds, process_resident_bytes
         FROM agent_health_samples
         WHERE agent_id = $1 AND at > $2
         ORDER BY at LIMIT $3",
    )
    .bind(agent)
    .bind(since)
    .bind(i64::from(limit))
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(HealthSample::from).collect())
}

/// `agent`'s newest `limit` samples taken after `since`, oldest first (a
/// chart's window: if the window holds more, its start is cut, not its end).
pub async fn newest(
    db: &PgPool,
    agent: Uuid,
    since: DateTime<Utc>,
    limit: u32,
) -> Result<Vec<HealthSample>, sqlx::Error> {
    let rows: Vec<SampleRow> = sqlx::query_as(
        "SELECT * FROM (
             SELECT at, cpu_busy, memory_used_bytes, memory_total_bytes, disk_used, open_fds,
                    max_fds, load_1m, process_cpu_seconds, process_resident_bytes
             FROM agent_health_samples
             WHERE agent_id = $1 AND at > $2
             ORDER BY at DESC LIMIT $3) newest
         ORDER BY at",
    )
    .bind(agent)
    .bind(since)
    .bind(i64::from(limit))
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(HealthSample::from).collect())
}
