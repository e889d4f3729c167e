//! The `agents` table: registration, health, operator state
//! (active/paused/draining/drained), and the list the API and dashboard show.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use flotilla_core::api::{AgentState, AgentView};
use flotilla_core::health::HostHealth;
use flotilla_core::protocol::{LeaseRef, Register};
use sqlx::PgPool;
use uuid::Uuid;

/// Registers (or re-registers) an agent by name, making `reg.instance` the
/// process that may call for it. Operator state survives re-registration: a
/// paused agent that restarts stays paused.
pub async fn register<'e, E: sqlx::PgExecutor<'e>>(
    db: E,
    reg: &Register,
) -> Result<(Uuid, AgentState), sqlx::Error> {
    let (id, state): (Uuid, String) = sqlx::query_as(
        "INSERT INTO agents (id, name, labels, kinds, capacity, version, devices, health,
                             last_seen_at, instance, disk_full_since)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now(), $9, CASE WHEN $10 THEN now() END)
         ON CONFLICT (name) DO UPDATE SET
             labels = EXCLUDED.labels, kinds = EXCLUDED.kinds, capacity = EXCLUDED.capacity,
             version = EXCLUDED.version, devices = EXCLUDED.devices, health = EXCLUDED.health,
             last_seen_at = now(), registered_at = now(), instance = EXCLUDED.instance,
             disk_full_since = CASE WHEN $10
                                    THEN COALESCE(agents.disk_full_since, now()) END
         RETURNING id, state",
    )
    .bind(Uuid::new_v4())
    .bind(&reg.name)
    .bind(serde_json::to_value(with_name_label(reg)).expect("labels serialise"))
    .bind(reg.kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>())
    .bind(reg.capacity as i32)
    .bind(&reg.version)
    .bind(serde_json::to_value(&reg.devices).expect("devices serialise"))
    .bind(serde_json::to_value(&reg.health).expect("health serialises"))
    .bind(reg.instance)
    .bind(reg.health.disk_nearly_full())
    .fetch_one(db)
    .await?;
    Ok((id, parse_state(&state)))
}

/// The labels an agent registers with, plus its name under
/// [`flotilla_core::job::AGENT_NAME_LABEL`] (whatever it sent there), so
/// that a job can be pinned to it by label.
fn with_name_label(reg: &Register) -> BTreeMap<String, String> {
    let mut labels = reg.labels.clone();
    labels.insert(
        flotilla_core::job::AGENT_NAME_LABEL.to_string(),
        reg.name.clone(),
    );
    labels
}

/// What a registration did.
#[derive(Debug)]
pub struct Registration {
    pub agent: Uuid,
    pub state: AgentState,
    /// Leases an earlier process under this name still held: the caller
    /// fails them (that process is gone, or it would have been refused).
    pub orphans: Vec<LeaseRef>,
}

#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// Another process registered under this name and is still calling.
    #[error(
        "agent `{name}` is already running as another process (its last call was {seen_ms} ms \
         ago); two processes may not share a name. Stop the other one, give this one another \
         name, or wait until the other has been silent for the lease TTL"
    )]
    NameInUse { name: String, seen_ms: i64 },
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Registers `reg` unless another process holds the name and was seen
/// within `online_within` (the lease TTL: a process silent that long has
/// lost its leases anyway). A process that re-registers (same instance)
/// keeps its leases; a new one takes over and gets the old one's leases
/// back as orphans, in one transaction, so two registrations racing for a
/// name cannot both win.
pub async fn register_instance(
    db: &PgPool,
    reg: &Register,
    online_within: Duration,
) -> Result<Registration, RegisterError> {
    let mut tx = db.begin().await?;
    let current: Option<(Uuid, Option<Uuid>, Option<i64>)> = sqlx::query_as(
        "SELECT id, instance,
                (extract(epoch FROM now() - last_seen_at) * 1000)::bigint
         FROM agents WHERE name = $1 FOR UPDATE",
    )
    .bind(&reg.name)
    .fetch_optional(&mut *tx)
    .await?;
    let taking_over = match current {
        Some((_, Some(instance), Some(seen_ms))) if instance != reg.instance => {
            if seen_ms < online_within.as_millis() as i64 {
                return Err(RegisterError::NameInUse {
                    name: reg.name.clone(),
                    seen_ms,
                });
            }
            true
        }
        Some((_, Some(instance), _)) => instance != reg.instance,
        // Registered by a version without instances, or never seen: any
        // lease it holds is an orphan.
        Some(_) => true,
        None => false,
    };
    let (agent, state) = register(&mut *tx, reg).await?;
    let orphans = if taking_over {
        held_leases(&mut *tx, agent).await?
    } else {
        Vec::new()
    };
    tx.commit().await?;
    Ok(Registration {
        agent,
        state,
        orphans,
    })
}

/// Which process of each agent may call: the instance of its last
/// registration. Cached per server for [`crate::auth::CACHE_TTL`]; a
/// mismatch is always re-read from the database, so a takeover through
/// another server is seen at once by the new process and within the TTL by
/// the old one (whose leases the takeover already failed, so the fence on
/// lease tokens holds in the meantime).
#[derive(Default)]
pub struct Instances {
    current: std::sync::Mutex<HashMap<Uuid, (Uuid, Instant)>>,
}

impl Instances {
    /// Whether `instance` is the process that may call for `agent`.
    pub async fn is_current(
        &self,
        db: &PgPool,
        agent: Uuid,
        instance: Uuid,
    ) -> Result<bool, sqlx::Error> {
        let cached = self
            .current
            .lock()
            .expect("instance cache lock is never poisoned")
            .get(&agent)
            .filter(|(_, at)| at.elapsed() < crate::auth::CACHE_TTL)
            .map(|(i, _)| *i);
        if cached == Some(instance) {
            return Ok(true);
        }
        let current: Option<Uuid> = sqlx::query_scalar("SELECT instance FROM agents WHERE id = $1")
            .bind(agent)
            .fetch_optional(db)
            .await?
            .flatten();
        if let Some(current) = current {
            self.remember(agent, current);
        }
        Ok(current == Some(instance))
    }

    pub fn remember(&self, agent: Uuid, instance: Uuid) {
        let mut map = self
            .current
            .lock()
            .expect("instance cache lock is never poisoned");
        // Agents are few (a fleet, not a crowd); the bound only guards
        // against a bug growing it.
        if map.len() >= 100_000 {
            map.clear();
        }
        map.insert(agent, (instance, Instant::now()));
    }
}

fn parse_state(s: &str) -> AgentState {
    AgentState::parse(s).unwrap_or(AgentState::Paused)
}

/// The agent id behind a name, if registered.
pub async fn id_of(db: &PgPool, name: &str) -> Result<Option<Uuid>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM agents WHERE name = $1")
        .bind(name)
        .fetch_optional(db)
        .await
}

/// The agent id behind a name and the version it registered, if
/// registered (the agent page).
pub async fn id_and_version(
    db: &PgPool,
    name: &str,
) -> Result<Option<(Uuid, String)>, sqlx::Error> {
    sqlx::query_as("SELECT id, version FROM agents WHERE name = $1")
        .bind(name)
        .fetch_optional(db)
        .await
}

/// Leases the server thinks the agent holds.
async fn held_leases<'e, E: sqlx::PgExecutor<'e>>(
    db: E,
    agent: Uuid,
) -> Result<Vec<LeaseRef>, sqlx::Error> {
    let rows: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "SELECT id, lease_token FROM jobs WHERE agent_id = $1 AND state IN ('leased', 'running')",
    )
    .bind(agent)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(job_id, lease_token)| LeaseRef {
            job_id,
            lease_token,
        })
        .collect())
}

/// Records a heartbeat's health; moves a draining agent with no work left
/// to drained. Returns the agent's state. A disk over
/// [`flotilla_core::health::DISK_FULL_FRACTION`] full sets
/// `disk_full_since` (kept from the first such report), which stops the
/// claim from leasing to the agent; a report with room clears it, and then
/// the second value is true: the caller wakes the agent's waiting lease
/// request rather than leave it to the next poll.
pub async fn touch(
    db: &PgPool,
    agent: Uuid,
    health: &HostHealth,
) -> Result<(AgentState, bool), sqlx::Error> {
    let (state, disk_freed): (String, bool) = sqlx::query_as(
        "UPDATE agents a SET health = $2, last_seen_at = now(),
             disk_full_since = CASE WHEN $3 THEN COALESCE(a.disk_full_since, now()) END,
             state = CASE WHEN a.state = 'draining' AND NOT EXISTS (
                               SELECT 1 FROM jobs WHERE agent_id = $1
                                 AND state IN ('leased', 'running'))
                          THEN 'drained' ELSE a.state END
         FROM (SELECT disk_full_since FROM agents WHERE id = $1) old
         WHERE a.id = $1
         RETURNING a.state, old.disk_full_since IS NOT NULL AND NOT $3",
    )
    .bind(agent)
    .bind(serde_json::to_value(health).expect("health serialises"))
    .bind(health.disk_nearly_full())
    .fetch_one(db)
    .await?;
    Ok((parse_state(&state), disk_freed))
}

pub async fn state_of(db: &PgPool, agent: Uuid) -> Result<AgentState, sqlx::Error> {
    let s: String = sqlx::query_scalar("SELECT state FROM agents WHERE id = $1")
        .bind(agent)
        .fetch_one(db)
        .await?;
    Ok(parse_state(&s))
}

/// What the operator asked for.
#[derive(Debug, Clone, Copy)]
pub enum Steer {
    Pause,
    Drain,
    Resume,
}

/// Sets the operator state; `None` if no such agent.
pub async fn steer(
    db: &PgPool,
    name: &str,
    steer: Steer,
) -> Result<Option<AgentState>, sqlx::Error> {
    let sql = match steer {
        Steer::Pause => "UPDATE agents SET state = 'paused' WHERE name = $1 RETURNING state",
        Steer::Resume => "UPDATE agents SET state = 'active' WHERE name = $1 RETURNING state",
        Steer::Drain => {
            "UPDATE agents a SET state = CASE WHEN EXISTS (
                     SELECT 1 FROM jobs WHERE agent_id = a.id AND state IN ('leased', 'running'))
                 THEN 'draining' ELSE 'drained' END
             WHERE name = $1 RETURNING state"
        }
    };
    let s: Option<String> = sqlx::query_scalar(sql)
        .bind(name)
        .fetch_optional(db)
        .await?;
    Ok(s.as_deref().map(parse_state))
}

#[derive(sqlx::FromRow)]
struct AgentRow {
    name: String,
    state: String,
    labels: serde_json::Value,
    kinds: Vec<String>,
    capacity: i32,
    registered_at: DateTime<Utc>,
    last_seen_at: Option<DateTime<Utc>>,
    version: String,
    health: Option<serde_json::Value>,
    devices: serde_json::Value,
    slots: i64,
    running: i64,
    online: bool,
    disk_full_since: Option<DateTime<Utc>>,
}

/// The registered agents that could take job `job` (its kind, labels and
/// cost), and how many of those are answering, active and with disk room
/// (those the claim offers work to): why a waiting job waits, for its page.
pub async fn able_to_take(
    db: &PgPool,
    job: Uuid,
    heartbeat: Duration,
) -> Result<(i64, i64), sqlx::Error> {
    sqlx::query_as(
        "SELECT count(a.id),
                count(a.id) FILTER (WHERE a.state = 'active' AND a.disk_full_since IS NULL
                                      AND a.last_seen_at > now() - $2 * interval '1 millisecond')
         FROM jobs j
         JOIN agents a ON j.kind = ANY (a.kinds) AND a.labels @> j.labels
                      AND a.capacity >= j.cost
         WHERE j.id = $1",
    )
    .bind(job)
    .bind((heartbeat.as_millis() * 3) as i64)
    .fetch_one(db)
    .await
}

/// Every agent, by name. Online = seen within three heartbeat intervals.
pub async fn list(db: &PgPool, heartbeat: Duration) -> Result<Vec<AgentView>, sqlx::Error> {
    page(db, heartbeat, None, None).await
}

/// Agents by name whose names come after `after`, at most `limit` (all
/// when `None`).
pub async fn page(
    db: &PgPool,
    heartbeat: Duration,
    after: Option<&str>,
    limit: Option<i64>,
) -> Result<Vec<AgentView>, sqlx::Error> {
    let rows: Vec<AgentRow> = sqlx::query_as(
        "SELECT a.name, a.state, a.labels, a.kinds, a.capacity, a.registered_at, a.last_seen_at,
                a.version, a.health, a.devices,
                COALESCE(sum(j.cost), 0)::bigint AS slots, count(j.id) AS running,
                COALESCE(a.last_seen_at > now() - $1 * interval '1 millisecond', false) AS online,
                a.disk_full_since
         FROM agents a
         LEFT JOIN jobs j ON j.agent_id = a.id AND j.state IN ('leased', 'running')
         WHERE $2::text IS NULL OR a.name > $2
         GROUP BY a.id ORDER BY a.name LIMIT $3",
    )
    .bind((heartbeat.as_millis() * 3) as i64)
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let health: Option<HostHealth> = r.health.and_then(|h| serde_json::from_value(h).ok());
            let state = parse_state(&r.state);
            AgentView {
                disk_nearly_full: health.as_ref().is_some_and(|h| h.disk_nearly_full()),
                lease_refused: lease_refused(state, r.disk_full_since, health.as_ref()),
                name: r.name,
                state,
                online: r.online,
                labels: {
                    let mut labels = serde_json::from_value::<BTreeMap<String, String>>(r.labels)
                        .unwrap_or_default();
                    labels.remove(flotilla_core::job::AGENT_NAME_LABEL);
                    labels
                },
                // A kind this server does not know is of no use to it.
                kinds: r.kinds.iter().filter_map(|k| k.parse().ok()).collect(),
                capacity: r.capacity as u32,
                slots_in_use: r.slots as u32,
                running_jobs: r.running as u32,
                registered_at: r.registered_at,
                last_seen_at: r.last_seen_at,
                version: r.version,
                health,
                devices: serde_json::from_value(r.devices).unwrap_or_default(),
            }
        })
        .collect())
}

/// Why the claim gives an agent no new jobs, if it does not: its operator
/// state, or a full disk (`disk_full_since`, what the claim checks).
fn lease_refused(
    state: AgentState,
    disk_full_since: Option<DateTime<Utc>>,
    health: Option<&HostHealth>,
) -> Option<String> {
    if let Some(since) = disk_full_since {
        let free = health.map_or(String::new(), |h| {
            format!(
                " ({:.1} MiB free of {:.1} MiB)",
                h.disk_free_bytes as f64 / (1u64 << 20) as f64,
                h.disk_total_bytes as f64 / (1u64 << 20) as f64
            )
        });
        return Some(format!(
            "its work-directory disk is over {:.0} % full{free} since {} UTC: no new jobs \
             until a heartbeat reports room again",
            flotilla_core::health::DISK_FULL_FRACTION * 100.0,
            since.format("%Y-%m-%d %H:%M:%S")
        ));
    }
    match state {
        AgentState::Active => None,
        AgentState::Paused => Some("paused by an operator: no new jobs until resumed".into()),
        AgentState::Draining => {
            Some("draining: finishes its running jobs and takes no new ones".into())
        }
        AgentState::Drained => Some("drained by an operator: no new jobs until resumed".into()),
    }
}
