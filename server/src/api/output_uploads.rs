//! `POST /api/agent/v1/jobs/{id}/output-uploads…`: an output the agent
//! uploads to an S3 store itself, lease-checked as `PUT …/outputs/{name}`
//! is; the server only opens the multipart upload, signs a URL per part,
//! and records the output once the store holds what was declared
//! ([`crate::store::direct_upload`] says what is checked). Nothing is kept
//! here between the calls, so any replica answers each.

use axum::extract::State;
use axum::Json;
use flotilla_core::api::OutputView;
use flotilla_core::protocol::{
    Ack, OutputUpload, OutputUploadAbort, OutputUploadAsk, OutputUploadComplete, OutputUploadStart,
    OutputUploadTerms, PartUrl,
};

use super::agent_protocol::{declared_output, AgentProcess, DeclaredOutput, MAX_OUTPUT_BYTES};
use crate::error::{ApiError, ApiResult};
use crate::extract::{JsonBody, PathParams};
use crate::queue::lease;
use crate::state::AppState;
use crate::store::direct_upload::{part_count, UploadError};
use crate::store::Presigner;

/// The longest upload id or ETag taken back from an agent (S3's are tens
/// of characters; this only bounds what is passed on).
const MAX_TOKEN_CHARS: usize = 1024;

/// Whether the output may go straight to the store, and in what parts.
pub async fn terms(
    State(state): State<AppState>,
    agent: AgentProcess,
    PathParams(id): PathParams<String>,
    JsonBody(ask): JsonBody<OutputUploadAsk>,
) -> ApiResult<Json<OutputUploadTerms>> {
    declared_output(&state, &agent, &id, ask.lease_token, &ask.name).await?;
    within_limit(&ask.name, ask.size)?;
    let part_size = state
        .settings
        .presigner
        .as_ref()
        .and_then(|p| p.part_size_for(ask.size));
    Ok(Json(OutputUploadTerms { part_size }))
}

/// Opens the multipart upload and signs its parts' URLs.
pub async fn start(
    State(state): State<AppState>,
    agent: AgentProcess,
    PathParams(id): PathParams<String>,
    JsonBody(s): JsonBody<OutputUploadStart>,
) -> ApiResult<Json<OutputUpload>> {
    let out = declared_output(&state, &agent, &id, s.lease_token, &s.name).await?;
    within_limit(&s.name, s.size)?;
    let presigner = presigner(&state)?;
    let part_size = presigner.part_size_for(s.size).ok_or_else(|| {
        ApiError::BadRequest(format!(
            "output `{}`: this server takes it only through PUT …/outputs/{{name}}",
            s.name
        ))
    })?;
    if s.part_size != part_size {
        return Err(ApiError::invalid(format!(
            "output `{}`: parts of {} bytes, but this server's are {part_size} for {} bytes; \
             ask for the terms again",
            s.name, s.part_size, s.size
        )));
    }
    sha256_of(&s.name, "`sha256`", &s.sha256)?;
    let want = part_count(s.size, part_size);
    if s.part_sha256.len() as u64 != want {
        return Err(ApiError::invalid(format!(
            "output `{}`: {} part sha256s for {want} parts of {part_size} bytes",
            s.name,
            s.part_sha256.len()
        )));
    }
    let sums = s
        .part_sha256
        .iter()
        .enumerate()
        .map(|(i, h)| sha256_of(&s.name, &format!("part {}'s sha256", i + 1), h))
        .collect::<ApiResult<Vec<_>>>()?;
    let open = presigner
        .open_upload(&out.key, s.size, &sums)
        .await
        .map_err(|e| ApiError::Internal(e.into()))?;
    tracing::debug!(agent = %agent.name, job = %out.job, name = %s.name, size = s.size,
                    parts = sums.len(), "direct upload opened");
    Ok(Json(OutputUpload {
        upload_id: open.upload_id,
        part_size,
        parts: open
            .parts
            .into_iter()
            .zip(1..)
            .map(|((url, checksum), number)| PartUrl {
                number,
                url: url.to_string(),
                headers: [("x-amz-checksum-sha256".to_string(), checksum)].into(),
            })
            .collect(),
        expires_in_s: open.valid_for.as_secs(),
    }))
}

/// Completes the upload and records the output if the store holds what
/// was declared; otherwise nothing is recorded and nothing is left.
pub async fn complete(
    State(state): State<AppState>,
    agent: AgentProcess,
    PathParams(id): PathParams<String>,
    JsonBody(c): JsonBody<OutputUploadComplete>,
) -> ApiResult<Json<OutputView>> {
    let out = declared_output(&state, &agent, &id, c.lease_token, &c.name).await?;
    let presigner = presigner(&state)?;
    token(&c.name, "`upload_id`", &c.upload_id)?;
    let parts = match completed_parts(&c) {
        Ok(p) => p,
        Err(e) => {
            // A call that cannot complete the upload ends it.
            abort_logged(presigner, &out, &c.upload_id).await;
            return Err(e);
        }
    };
    if let Err(e) = presigner
        .complete_upload(&out.key, &c.upload_id, &parts, c.size)
        .await
    {
        tracing::warn!(agent = %agent.name, job = %out.job, name = %c.name, error = %e,
                       "direct upload not recorded");
        // The key may have held an earlier upload of this output, which
        // the failed one replaced: its record no longer holds.
        lease::forget_output(&state.db, out.job, out.attempt, &c.name).await?;
        return Err(match e {
            UploadError::Mismatch(_) => ApiError::invalid(format!("output `{}`: {e}", c.name)),
            UploadError::Store(e) => ApiError::Internal(e.into()),
            UploadError::Head(_) => ApiError::Internal(e.into()),
        });
    }
    lease::record_output(
        &state.db,
        out.job,
        out.attempt,
        &c.name,
        &out.key,
        c.size,
        &c.sha256,
    )
    .await?;
    Ok(Json(OutputView {
        name: c.name,
        key: out.key,
        size: c.size,
        sha256: c.sha256,
    }))
}

/// The agent gives the upload up: the store drops its parts.
pub async fn abort(
    State(state): State<AppState>,
    agent: AgentProcess,
    PathParams(id): PathParams<String>,
    JsonBody(a): JsonBody<OutputUploadAbort>,
) -> ApiResult<Json<Ack>> {
    let out = declared_output(&state, &agent, &id, a.lease_token, &a.name).await?;
    let presigner = presigner(&state)?;
    token(&a.name, "`upload_id`", &a.upload_id)?;
    match presigner.abort_upload(&out.key, &a.upload_id).await {
        // Gone already: completed, or aborted by a complete call that
        // failed.
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(Json(Ack { ok: true })),
        Err(e) => Err(ApiError::Internal(e.into())),
    }
}

fn presigner(state: &AppState) -> ApiResult<&Presigner> {
    // Not 409, which an agent takes for its lease being gone.
    state.settings.presigner.as_deref().ok_or_else(|| {
        ApiError::BadRequest(
            "this server takes outputs only through PUT …/outputs/{name} (its store is not S3, \
             or presigning is off)"
                .into(),
        )
    })
}

fn within_limit(name: &str, size: u64) -> ApiResult<()> {
    if size > MAX_OUTPUT_BYTES {
        return Err(ApiError::PayloadTooLarge(format!(
            "output `{name}`: {size} bytes is over the limit of {MAX_OUTPUT_BYTES}"
        )));
    }
    Ok(())
}

/// The parts of a complete call, each sha256 parsed, numbered 1 to n.
fn completed_parts(c: &OutputUploadComplete) -> ApiResult<Vec<([u8; 32], String)>> {
    within_limit(&c.name, c.size)?;
    sha256_of(&c.name, "`sha256`", &c.sha256)?;
    if c.parts.is_empty() {
        return Err(ApiError::invalid(format!("output `{}`: no parts", c.name)));
    }
    c.parts
        .iter()
        .zip(1u32..)
        .map(|(p, n)| {
            if p.number != n {
                return Err(ApiError::invalid(format!(
                    "output `{}`: part {} where part {n} belongs; list every part in order",
                    c.name, p.number
                )));
            }
            token(&c.name, &format!("part {n}'s ETag"), &p.etag)?;
            let sum = sha256_of(&c.name, &format!("part {n}'s sha256"), &p.sha256)?;
            Ok((sum, p.etag.clone()))
        })
        .collect()
}

/// A sha256 in lower-case hex.
fn sha256_of(name: &str, what: &str, hex_sum: &str) -> ApiResult<[u8; 32]> {
    let bad = || {
        ApiError::invalid(format!(
            "output `{name}`: {what} is not a sha256 in lower-case hex"
        ))
    };
    if hex_sum.len() != 64 || hex_sum.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(bad());
    }
    let mut sum = [0u8; 32];
    hex::decode_to_slice(hex_sum, &mut sum).map_err(|_| bad())?;
    Ok(sum)
}

/// An id or ETag from the store, handed back by the agent: printable and
/// bounded, since it goes into the store's query and XML.
fn token(name: &str, what: &str, v: &str) -> ApiResult<()> {
    if v.is_empty() || v.len() > MAX_TOKEN_CHARS || v.chars().any(|c| c.is_control()) {
        return Err(ApiError::invalid(format!(
            "output `{name}`: {what} is empty, too long or not printable"
        )));
    }
    Ok(())
}

async fn abort_logged(presigner: &Presigner, out: &DeclaredOutput, upload_id: &str) {
    if let Err(e) = presigner.abort_upload(&out.key, upload_id).await {
        tracing::warn!(key = %out.key, %upload_id, error = %e, "aborting a multipart upload");
    }
}
