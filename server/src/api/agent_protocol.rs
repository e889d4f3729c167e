//! `/api/agent/v1`: what agents call. Each handler resolves the agent from
//! its token, and every job call is guarded by the lease, so an agent can
//! only touch jobs it currently holds.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::extract::State;
use axum::http::request::Parts;
use axum::Json;
use flotilla_core::api::OutputView;
use flotilla_core::job::check_output_path;
use flotilla_core::job::FailureClass;
use flotilla_core::protocol::{
    Ack, Complete, Ended, Fail, Heartbeat, HeartbeatReply, LeaseRef, LeaseReply, LeaseRequest,
    LogBatch, Register, Registered, INSTANCE_HEADER, LEASE_HEADER, MAX_FAIL_MESSAGE_BYTES,
};
use flotilla_core::text::truncate_on_char_boundary;
use uuid::Uuid;

use super::tokens::valid_agent_name;
use crate::agents;
use crate::auth::AgentAuth;
use crate::error::{ApiError, ApiResult};
use crate::extract::{parse_id, JsonBody, PathParams};
use crate::queue::claim;
use crate::queue::lease::{self, LeaseKey, LeaseRefused};
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

/// The agent process making a call after `register`: an agent token, and
/// in [`INSTANCE_HEADER`] the instance of the agent's latest registration.
/// Any other process under the name gets `409 superseded`.
pub struct AgentProcess {
    pub name: String,
    pub id: Uuid,
    /// The token it called with.
    pub token_id: Uuid,
}

impl FromRequestParts<AppState> for AgentProcess {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let AgentAuth(caller, name) = AgentAuth::from_request_parts(parts, state).await?;
        let instance = parts
            .headers
            .get(INSTANCE_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| Uuid::parse_str(v).ok())
            .ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "missing or malformed `{INSTANCE_HEADER}` header: this agent is older than \
                     the server; upgrade it"
                ))
            })?;
        let id = agent_id(state, &name).await?;
        if !state
            .agent_instances
            .is_current(&state.db, id, instance)
            .await?
        {
            return Err(ApiError::Superseded(format!(
                "another process registered as agent `{name}` after this one; this process \
                 must stop (its leases were handed back)"
            )));
        }
        Ok(AgentProcess {
            name,
            id,
            token_id: caller.token_id,
        })
    }
}

/// The lease token of a download or an output upload, from
/// [`LEASE_HEADER`]. A token in the query string (`?lease=`, what agents
/// sent before the header) is refused: proxies and access logs keep URLs.
pub struct LeaseHeader(pub Uuid);

impl<S: Send + Sync> FromRequestParts<S> for LeaseHeader {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        match parts.headers.get(LEASE_HEADER) {
            Some(v) => v
                .to_str()
                .ok()
                .and_then(|v| Uuid::parse_str(v.trim()).ok())
                .map(LeaseHeader)
                .ok_or_else(|| {
                    ApiError::BadRequest(format!("`{LEASE_HEADER}` is not a lease token (a UUID)"))
                }),
            None => {
                let in_query = parts
                    .uri
                    .query()
                    .is_some_and(|q| q.split('&').any(|kv| kv.starts_with("lease=")));
                Err(ApiError::BadRequest(if in_query {
                    format!(
                        "send the lease token in the `{LEASE_HEADER}` header, not the query \
                         string (where proxies and access logs keep it): this agent is older \
                         than the server; upgrade it"
                    )
                } else {
                    format!("missing `{LEASE_HEADER}` header: the lease token this call is for")
                }))
            }
        }
    }
}

/// A registration without the fields every agent of this server's
/// protocol sends (the process's `instance`, since agents could be
/// superseded) comes from an agent older than the server: say so and what
/// to do, not only which field is missing.
fn older_agent(e: ApiError) -> ApiError {
    match e {
        ApiError::Invalid { message, .. } if message.contains("missing field `instance`") => {
            ApiError::invalid(format!(
                "this agent is older than the server (flotilla {}): its registration has no \
                 `instance`; upgrade flotilla-agent on its host (servers first, then agents)",
                env!("CARGO_PKG_VERSION")
            ))
        }
        e => e,
    }
}

pub async fn register(
    State(state): State<AppState>,
    AgentAuth(caller, name): AgentAuth,
    body: Result<JsonBody<Register>, ApiError>,
) -> ApiResult<Json<Registered>> {
    let JsonBody(reg) = body.map_err(older_agent)?;
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
    // What an admin allowed this token to claim: labels and kinds decide
    // which jobs (and their environments) reach the agent.
    let limits = crate::auth::tokens::agent_limits(&state.db, caller.token_id).await?;
    if let Some(why) = limits.refusal(&reg.labels, &reg.kinds) {
        return Err(ApiError::Forbidden(why));
    }
    let registration = agents::register_instance(&state.db, &reg, state.settings.lease_ttl)
        .await
        .map_err(|e| match e {
            agents::RegisterError::NameInUse { .. } => ApiError::Conflict(e.to_string()),
            agents::RegisterError::Db(e) => e.into(),
        })?;
    let agent_id = registration.agent;
    state.auth_cache.remember_agent(&reg.name, agent_id);
    state.agent_instances.remember(agent_id, reg.instance);
    // The leases of the process this one replaced: that process is gone
    // (silent for a lease TTL, or this agent before a restart), so its jobs
    // retry now rather than at expiry.
    let mut orphans_failed = 0;
    for orphan in &registration.orphans {
        let key = LeaseKey {
            agent: agent_id,
            job: orphan.job_id,
            token: orphan.lease_token,
        };
        let f = Fail {
            lease_token: orphan.lease_token,
            class: FailureClass::Interrupted,
            message: format!("agent `{name}` restarted while running this job"),
            exit_code: None,
        };
        match crate::completion::fail(&state, key, &f).await {
            Ok(_) => orphans_failed += 1,
            // Ended meanwhile (reaped, cancelled): nothing to hand back.
            Err(LeaseRefused::Stale { .. } | LeaseRefused::NoSuchJob(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    tracing::info!(agent = %reg.name, capacity = reg.capacity, kinds = ?reg.kinds,
                   orphans_failed, "agent registered");
    Ok(Json(Registered {
        agent_id,
        heartbeat_interval_ms: state.settings.heartbeat_interval.as_millis() as u64,
        state: registration.state,
        orphans_failed,
    }))
}

/// Long poll: claims at once if a job fits, else waits for a NOTIFY (or the
/// fallback poll) until `wait_ms` runs out. The wake-up is armed *before*
/// each claim attempt, so a job submitted between the claim and the wait is
/// not missed.
pub async fn lease(
    State(state): State<AppState>,
    AgentProcess {
        name,
        id: agent,
        token_id,
    }: AgentProcess,
    JsonBody(req): JsonBody<LeaseRequest>,
) -> ApiResult<Json<LeaseReply>> {
    let wait = Duration::from_millis(req.wait_ms).min(state.settings.max_lease_wait);
    let deadline = Instant::now() + wait;
    let ttl = state.settings.lease_ttl;
    if let Some(request) = req.request {
        // A retry of a request whose answer was lost: the same lease again.
        if let Some(job) = claim::already_leased(&state.db, agent, request, ttl).await? {
            tracing::info!(agent = %name, job = %job.job_id, attempt = job.attempt,
                           "lease request retried; answered its lease again");
            return Ok(Json(LeaseReply { job: Some(job) }));
        }
    }
    loop {
        let notified = state.job_signal.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Each try checks the token again: it may be revoked while this
        // request waits.
        if let Some(job) =
            claim::claim_for(&state.db, agent, ttl, req.request, Some(token_id)).await?
        {
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
    AgentProcess {
        name, id: agent, ..
    }: AgentProcess,
    JsonBody(hb): JsonBody<Heartbeat>,
) -> ApiResult<Json<HeartbeatReply>> {
    let leases = lease::heartbeat(&state.db, agent, &hb.leases, state.settings.lease_ttl).await?;
    let (st, disk_freed) = agents::touch(&state.db, agent, &hb.health).await?;
    if disk_freed {
        // Its lease request may be waiting: the claim refused it until now.
        state.job_signal.notify_waiters();
    }
    // History for the agent page; losing a sample must not cost the lease.
    if let Err(e) =
        crate::agent_health::record(&state.db, agent, &hb.health, state.settings.health_samples)
            .await
    {
        tracing::warn!(agent = %name, error = %e, "keeping a health sample");
    }
    if hb.health.disk_nearly_full() {
        tracing::warn!(agent = %name, free = hb.health.disk_free_bytes, "agent disk over 90% full");
    }
    Ok(Json(HeartbeatReply { state: st, leases }))
}

/// The lease a job call is about: the job in the path, the caller's agent,
/// the token in the body.
fn lease_key(agent: &AgentProcess, id: &str, token: Uuid) -> ApiResult<LeaseKey> {
    Ok(LeaseKey {
        job: parse_id(id, "a job")?,
        agent: agent.id,
        token,
    })
}

pub async fn start(
    State(state): State<AppState>,
    agent: AgentProcess,
    PathParams(id): PathParams<String>,
    JsonBody(lr): JsonBody<LeaseRef>,
) -> ApiResult<Json<Ack>> {
    let key = lease_key(&agent, &id, lr.lease_token)?;
    if lr.job_id != key.job {
        return Err(ApiError::invalid("`job_id` does not match the path"));
    }
    lease::start(&state.db, key).await?;
    Ok(Json(Ack { ok: true }))
}

pub async fn log(
    State(state): State<AppState>,
    agent: AgentProcess,
    PathParams(id): PathParams<String>,
    JsonBody(batch): JsonBody<LogBatch>,
) -> ApiResult<Json<Ack>> {
    if batch.lines.len() > 10_000 {
        return Err(ApiError::invalid("at most 10,000 lines per batch"));
    }
    let key = lease_key(&agent, &id, batch.lease_token)?;
    crate::queue::logs::append(
        &state.db,
        key,
        batch.batch,
        &batch.lines,
        state.settings.log_cap_bytes,
    )
    .await?;
    Ok(Json(Ack { ok: true }))
}

pub async fn complete(
    State(state): State<AppState>,
    agent: AgentProcess,
    PathParams(id): PathParams<String>,
    JsonBody(c): JsonBody<Complete, { flotilla_core::protocol::MAX_COMPLETE_BYTES }>,
) -> ApiResult<Json<Ended>> {
    let key = lease_key(&agent, &id, c.lease_token)?;
    let ended = crate::completion::complete(&state, key, &c).await?;
    match &ended.tile {
        Some(tile) => {
            tracing::info!(agent = %agent.name, job = %key.job, tile = %tile.tile, "tile job succeeded")
        }
        None => {
            tracing::info!(agent = %agent.name, job = %key.job, kind = %ended.kind, "job succeeded")
        }
    }
    Ok(Json(Ended { state: ended.state }))
}

pub async fn fail(
    State(state): State<AppState>,
    agent: AgentProcess,
    PathParams(id): PathParams<String>,
    JsonBody(mut f): JsonBody<Fail>,
) -> ApiResult<Json<Ended>> {
    let key = lease_key(&agent, &id, f.lease_token)?;
    truncate_on_char_boundary(&mut f.message, MAX_FAIL_MESSAGE_BYTES);
    let ended = crate::completion::fail(&state, key, &f).await?;
    tracing::info!(agent = %agent.name, job = %key.job, state = %ended.state, message = %f.message,
                   "attempt failed");
    Ok(Json(Ended { state: ended.state }))
}

/// Streams one output into the object store under
/// `jobs/{job}/{attempt}/{name}`, hashing as it goes. The object becomes
/// visible only when the upload completes (multipart), and is listed with
/// the job only once the attempt succeeds, so a partial upload never looks
/// finished.
pub async fn upload_output(
    State(state): State<AppState>,
    agent: AgentProcess,
    PathParams((id, name)): PathParams<(String, String)>,
    LeaseHeader(lease): LeaseHeader,
    body: Body,
) -> ApiResult<Json<OutputView>> {
    let out = declared_output(&state, &agent, &id, lease, &name).await?;
    let path = object_store::path::Path::from(out.key.as_str());
    let (size, sha256) =
        crate::store::stream_body(state.store.as_ref(), &path, body, MAX_OUTPUT_BYTES)
            .await
            .map_err(|e| upload_error(&format!("output `{name}`"), e))?;
    lease::record_output(
        &state.db,
        out.job,
        out.attempt,
        &name,
        &out.key,
        size,
        &sha256,
    )
    .await?;
    Ok(Json(OutputView {
        name,
        key: out.key,
        size,
        sha256,
    }))
}

/// An output the caller may upload now: of a job it holds the current
/// lease of, one that job declares.
pub struct DeclaredOutput {
    pub job: Uuid,
    pub attempt: i32,
    /// Where it goes in the store: `jobs/{job}/{attempt}/{name}`.
    pub key: String,
}

/// Checks that `agent` holds the current lease `token` of job `id` and
/// that `name` is an output that job declares: an agent cannot add
/// objects to a job, nor write to one it does not hold.
pub async fn declared_output(
    state: &AppState,
    agent: &AgentProcess,
    id: &str,
    token: Uuid,
    name: &str,
) -> ApiResult<DeclaredOutput> {
    check_output_path(name)
        .map_err(|why| ApiError::invalid(format!("output name `{name}` {why}")))?;
    let lease = lease_key(agent, id, token)?;
    let id = lease.job;
    let attempt = lease::current_attempt(&state.db, lease).await?;
    let declared = crate::queue::read::spec(&state.db, id)
        .await?
        .map(|s| s.declared_outputs())
        .unwrap_or_default();
    if !declared.iter().any(|d| d == name) {
        return Err(ApiError::invalid(format!(
            "output `{name}` is not one job {id} declares ({})",
            if declared.is_empty() {
                "it declares none".to_string()
            } else {
                declared.join(", ")
            }
        )));
    }
    Ok(DeclaredOutput {
        job: id,
        attempt,
        key: format!("jobs/{id}/{attempt}/{name}"),
    })
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
