//! `/api/agent/v1`: what agents call. Each handler resolves the agent from
//! its token, and every job call is guarded by the lease, so an agent can
//! only touch jobs it currently holds.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::Json;
use flotilla_core::api::{AgentState, OutputView};
use flotilla_core::job::check_output_path;
use flotilla_core::protocol::{
    Complete, Fail, Heartbeat, HeartbeatReply, LeaseRef, LeaseReply, LeaseRequest, LogBatch,
    Register, Registered,
};
use serde::Deserialize;
use uuid::Uuid;

use super::body::JsonBody;
use super::parse_id;
use super::tokens::valid_agent_name;
use crate::agents;
use crate::auth::AgentAuth;
use crate::error::{ApiError, ApiResult};
use crate::queue::claim;
use crate::queue::lease::{self, LeaseRefused};
use crate::state::AppState;

impl From<LeaseRefused> for ApiError {
    fn from(e: LeaseRefused) -> Self {
        match e {
            LeaseRefused::NoSuchJob(_) => ApiError::NotFound(e.to_string()),
            LeaseRefused::NotYours(_) => ApiError::Forbidden(e.to_string()),
            LeaseRefused::Stale { .. } => ApiError::StaleLease(e.to_string()),
            LeaseRefused::Invalid(m) => ApiError::invalid(m),
            LeaseRefused::Db(e) => e.into(),
        }
    }
}

/// The registered agent behind the token.
async fn agent_id(state: &AppState, name: &str) -> ApiResult<Uuid> {
    if let Some(id) = state.auth_cache.agent_id(name) {
        return Ok(id);
    }
    let id = agents::id_of(&state.db, name).await?.ok_or_else(|| {
        ApiError::Conflict(format!(
            "agent `{name}` is not registered; call register first"
        ))
    })?;
    state.auth_cache.remember_agent(name, id);
    Ok(id)
}

pub async fn register(
    State(state): State<AppState>,
    AgentAuth(_, name): AgentAuth,
    JsonBody(reg): JsonBody<Register>,
) -> ApiResult<Json<Registered>> {
    if reg.name != name {
        return Err(ApiError::Forbidden(format!(
            "this token is for agent `{name}`, not `{}`",
            reg.name
        )));
    }
    if !valid_agent_name(&reg.name) {
        return Err(ApiError::invalid("bad agent name"));
    }
    if reg.capacity == 0 || reg.capacity > 4096 {
        return Err(ApiError::invalid("`capacity` must be between 1 and 4096"));
    }
    let (agent_id, st) = agents::register(&state.db, &reg).await?;
    state.auth_cache.remember_agent(&reg.name, agent_id);
    let held_leases = agents::held_leases(&state.db, agent_id).await?;
    tracing::info!(agent = %reg.name, capacity = reg.capacity, kinds = ?reg.kinds, "agent registered");
    Ok(Json(Registered {
        agent_id,
        heartbeat_interval_ms: state.settings.heartbeat_interval.as_millis() as u64,
        state: st,
        held_leases,
    }))
}

/// Long poll: claims at once if a job fits, else waits for a NOTIFY (or the
/// fallback poll) until `wait_ms` runs out. The wake-up is armed *before*
/// each claim attempt, so a job submitted between the claim and the wait is
/// not missed.
pub async fn lease(
    State(state): State<AppState>,
    AgentAuth(_, name): AgentAuth,
    JsonBody(req): JsonBody<LeaseRequest>,
) -> ApiResult<Json<LeaseReply>> {
    let agent = agent_id(&state, &name).await?;
    let wait = Duration::from_millis(req.wait_ms).min(state.settings.max_lease_wait);
    let deadline = Instant::now() + wait;
    loop {
        let notified = state.job_signal.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(job) = claim::claim(&state.db, agent, state.settings.lease_ttl).await? {
            tracing::debug!(agent = %name, job = %job.job_id, attempt = job.attempt, "leased");
            return Ok(Json(LeaseReply { job: Some(job) }));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(Json(LeaseReply { job: None }));
        }
        let nap = (deadline - now).min(state.settings.lease_poll_interval);
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep(nap) => {}
            _ = state.shutdown.cancelled() => return Ok(Json(LeaseReply { job: None })),
        }
    }
}

pub async fn heartbeat(
    State(state): State<AppState>,
    AgentAuth(_, name): AgentAuth,
    JsonBody(hb): JsonBody<Heartbeat>,
) -> ApiResult<Json<HeartbeatReply>> {
    let agent = agent_id(&state, &name).await?;
    let leases = lease::heartbeat(&state.db, agent, &hb.leases, state.settings.lease_ttl).await?;
    let st = agents::touch(&state.db, agent, &hb.health).await?;
    if hb.health.disk_nearly_full() {
        tracing::warn!(agent = %name, free = hb.health.disk_free_bytes, "agent disk over 90% full");
    }
    Ok(Json(HeartbeatReply { state: st, leases }))
}

fn job_id(raw: &str) -> ApiResult<Uuid> {
    parse_id(raw)
}

pub async fn start(
    State(state): State<AppState>,
    AgentAuth(_, name): AgentAuth,
    Path(id): Path<String>,
    JsonBody(lr): JsonBody<LeaseRef>,
) -> ApiResult<Json<serde_json::Value>> {
    let id = job_id(&id)?;
    if lr.job_id != id {
        return Err(ApiError::invalid("`job_id` does not match the path"));
    }
    let agent = agent_id(&state, &name).await?;
    lease::start(&state.db, agent, id, lr.lease_token).await?;
    Ok(Json(serde_json::json!({ "ok": true })))
}

pub async fn log(
    State(state): State<AppState>,
    AgentAuth(_, name): AgentAuth,
    Path(id): Path<String>,
    JsonBody(batch): JsonBody<LogBatch>,
) -> ApiResult<Json<serde_json::Value>> {
    let id = job_id(&id)?;
    if batch.lines.len() > 10_000 {
        return Err(ApiError::invalid("at most 10,000 lines per batch"));
    }
    let agent = agent_id(&state, &name).await?;
    lease::append_log(&state.db, agent, id, batch.lease_token, &batch.lines).await?;
    Ok(Json(serde_json::json!({ "ok": true })))
}

pub async fn complete(
    State(state): State<AppState>,
    AgentAuth(_, name): AgentAuth,
    Path(id): Path<String>,
    JsonBody(c): JsonBody<Complete>,
) -> ApiResult<Json<serde_json::Value>> {
    let id = job_id(&id)?;
    let agent = agent_id(&state, &name).await?;
    if let Some(tile) = crate::tiles::finish::tile_spec(&state.db, id).await? {
        crate::tiles::finish::complete(&state, agent, id, &c, &tile).await?;
        tracing::info!(agent = %name, job = %id, tile = %tile.tile, "tile job succeeded");
        return Ok(Json(serde_json::json!({ "state": "succeeded" })));
    }
    lease::complete(
        &state.db,
        agent,
        id,
        c.lease_token,
        c.exit_code,
        &c.outputs,
        c.result.as_ref(),
    )
    .await?;
    tracing::info!(agent = %name, job = %id, "job succeeded");
    Ok(Json(serde_json::json!({ "state": "succeeded" })))
}

pub async fn fail(
    State(state): State<AppState>,
    AgentAuth(_, name): AgentAuth,
    Path(id): Path<String>,
    JsonBody(f): JsonBody<Fail>,
) -> ApiResult<Json<serde_json::Value>> {
    let id = job_id(&id)?;
    let agent = agent_id(&state, &name).await?;
    let mut message = f.message;
    message.truncate(4096);
    let new_state = lease::fail(
        &state.db,
        agent,
        id,
        f.lease_token,
        f.class,
        &message,
        f.exit_code,
        (state.settings.backoff_base, state.settings.backoff_max),
    )
    .await?;
    tracing::info!(agent = %name, job = %id, state = %new_state, %message, "attempt failed");
    Ok(Json(serde_json::json!({ "state": new_state })))
}

#[derive(Deserialize)]
pub struct UploadQuery {
    lease: Uuid,
}

/// Streams one output into the object store under
/// `jobs/{job}/{attempt}/{name}`, hashing as it goes. The object becomes
/// visible only when the upload completes (multipart), and is listed with
/// the job only once the attempt succeeds, so a partial upload never looks
/// finished.
pub async fn upload_output(
    State(state): State<AppState>,
    AgentAuth(_, agent_name): AgentAuth,
    Path((id, name)): Path<(String, String)>,
    Query(q): Query<UploadQuery>,
    body: Body,
) -> ApiResult<Json<OutputView>> {
    let id = job_id(&id)?;
    check_output_path(&name)
        .map_err(|why| ApiError::invalid(format!("output name `{name}` {why}")))?;
    let agent = agent_id(&state, &agent_name).await?;
    let attempt = lease::current_attempt(&state.db, agent, id, q.lease).await?;
    let key = format!("jobs/{id}/{attempt}/{name}");
    let path = object_store::path::Path::from(key.as_str());
    let (size, sha256) =
        crate::store::stream_body(state.store.as_ref(), &path, body, MAX_OUTPUT_BYTES)
            .await
            .map_err(|e| upload_error(&format!("output `{name}`"), e))?;
    lease::record_output(&state.db, id, attempt, &name, &key, size, &sha256).await?;
    Ok(Json(OutputView {
        name,
        key,
        size,
        sha256,
    }))
}

/// The largest output one job may upload (a tile's int8 embedding is about
/// 160 MB; this leaves room for command jobs' archives).
pub const MAX_OUTPUT_BYTES: u64 = 64 << 30;

/// The API error for a streamed upload that did not complete.
pub fn upload_error(what: &str, e: crate::store::StreamError) -> ApiError {
    use crate::store::StreamError;
    match e {
        StreamError::CutOff { .. } => ApiError::BadRequest(format!("{what}: {e}")),
        StreamError::TooLarge { .. } => ApiError::PayloadTooLarge(format!("{what}: {e}")),
        StreamError::Store(e) => ApiError::Internal(e.into()),
    }
}

/// Whether an agent in this state should be given work.
pub fn takes_work(state: AgentState) -> bool {
    state == AgentState::Active
}
