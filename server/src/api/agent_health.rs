//! `GET /api/v1/agents/{name}/health?since=…&limit=…`: an agent's kept
//! health samples, oldest first, paged by time.

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use flotilla_core::api::HealthHistory;
use serde::Deserialize;

use crate::agent_health;
use crate::agents;
use crate::auth::ClientAuth;
use crate::error::{ApiError, ApiResult};
use crate::extract::{PathParams, QueryParams};
use crate::state::AppState;

use super::openapi::Errors;

/// Most samples one answer holds: a week at 60 s, a third of one at the
/// default 30 s; `next_since` pages on.
pub const MAX_SAMPLES: u32 = 10_000;

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HealthQuery {
    /// RFC 3339; samples strictly after it. Default: an hour ago.
    #[param(format = DateTime)]
    pub since: Option<String>,
    /// Samples per answer, 1 to 10,000 (the default); others are refused.
    #[param(minimum = 1, maximum = 10000)]
    pub limit: Option<i64>,
}

impl HealthQuery {
    fn parse(&self) -> ApiResult<(DateTime<Utc>, u32)> {
        let since = match self
            .since
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            None => Utc::now() - chrono::Duration::hours(1),
            Some(s) => DateTime::parse_from_rfc3339(s)
                .map_err(|e| {
                    ApiError::BadRequest(format!(
                        "`since` must be an RFC 3339 time such as 2026-12-01T09:00:00Z: {e}"
                    ))
                })?
                .with_timezone(&Utc),
        };
        let limit = match self.limit {
            None => MAX_SAMPLES,
            Some(n) if (1..=i64::from(MAX_SAMPLES)).contains(&n) => n as u32,
            Some(n) => {
                return Err(ApiError::BadRequest(format!(
                    "`limit` must be 1 to {MAX_SAMPLES}, not {n}"
                )))
            }
        };
        Ok((since, limit))
    }
}

/// An agent's kept health samples (at most one per the server's sample
/// interval, a week kept), oldest first; `next_since` pages on.
#[utoipa::path(
    get,
    path = "/api/v1/agents/{name}/health",
    tag = "agents",
    params(("name" = String, Path, description = "The agent's name"), HealthQuery),
    responses((status = 200, description = "The agent's samples", body = HealthHistory), Errors)
)]
pub async fn history(
    State(state): State<AppState>,
    ClientAuth(_): ClientAuth,
    PathParams(name): PathParams<String>,
    QueryParams(q): QueryParams<HealthQuery>,
) -> ApiResult<Json<HealthHistory>> {
    let (since, limit) = q.parse()?;
    let agent = agents::id_of(&state.db, &name)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no agent named `{name}`")))?;
    // One more than asked says whether there is a next page.
    let mut samples = agent_health::since(&state.db, agent, since, limit + 1).await?;
    let next_since = super::next_page(&mut samples, limit, |s| s.at);
    Ok(Json(HealthHistory {
        agent: name,
        sample_interval_ms: u64::try_from(state.settings.health_samples.interval.as_millis())
            .unwrap_or(u64::MAX),
        samples,
        next_since,
    }))
}
