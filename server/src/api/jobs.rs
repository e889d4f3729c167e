//! `/api/v1/jobs`: submit, show, list (filtered, a page at a time),
//! cancel, retry (the log: [`super::logs`]).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use chrono::{DateTime, Utc};
use flotilla_core::api::{CancelReply, Created, JobList, JobView, SubmitJob, TokenRole};
use flotilla_core::job::{check_name, JobKind, JobState};
use serde::Deserialize;
use uuid::Uuid;

use super::created;
use super::openapi::Errors;
use crate::auth::{Caller, ClientAuth};
use crate::error::{ApiError, ApiResult};
use crate::extract::{parse_id, JsonBody, PathParams, QueryParams};
use crate::queue::cancel::{self, Cancelled};
use crate::queue::read::{JobFilter, JobPage, JobText};
use crate::queue::submit::NewJob;
use crate::queue::valid::ValidJob;
use crate::queue::{classes, read, retry, submit};
use crate::state::AppState;

/// Queues a command job (tile, revdeps and step jobs are made by the
/// server for regions, runs and pipelines).
#[utoipa::path(
    post,
    path = "/api/v1/jobs",
    tag = "jobs",
    request_body = SubmitJob,
    responses(
        (status = 201, description = "Queued", body = Created),
        (status = 429, description = "The submitter has as many jobs waiting as one may (`--max-waiting-per-submitter`)", body = flotilla_core::api::ErrorBody),
        Errors
    )
)]
pub async fn submit(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    JsonBody(body): JsonBody<SubmitJob>,
) -> ApiResult<impl IntoResponse> {
    let job = new_job(ValidJob::try_from(body)?, &caller)?;
    // Before any database work: a client submitting past its cap, while
    // its last refusal is remembered, takes no pool connection.
    let cap = state.waiting_cap(caller.role);
    submit::recalled_refusal(cap, &job.submitter, 1)?;
    if let Some(refused) = classes::refusal(&state.db, &job).await? {
        return Err(refused.into());
    }
    let ids = submit::submit_within(&state.db, &[job], cap).await??;
    Ok(created(Created { id: ids[0] }))
}

/// The job to insert, owned by the caller and accounted to the caller's
/// submitter name. Only an admin may account it to another (fair share is
/// per submitter: a client naming itself anew for each job would get ahead
/// of everyone).
fn new_job(valid: ValidJob, caller: &Caller) -> Result<NewJob, ApiError> {
    let submitter = match valid.submitter {
        Some(s) if caller.role == TokenRole::Admin => s,
        Some(_) => {
            return Err(ApiError::Forbidden(
                "only an admin token may set `submitter`; leave it out and the job is \
                 accounted to this token"
                    .into(),
            ))
        }
        None => caller.submitter(),
    };
    Ok(NewJob {
        submitter,
        owner: Some(caller.token_id),
        ..valid.job
    })
}

/// Refuses unless `caller` may read and cancel job `id`: an admin, or the
/// token the job belongs to. 404 if there is no such job.
pub(crate) async fn check_owner(state: &AppState, caller: &Caller, id: Uuid) -> ApiResult<()> {
    let owner = read::owner(&state.db, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no job {id}")))?;
    if caller.role == TokenRole::Admin || owner == Some(caller.token_id) {
        return Ok(());
    }
    Err(ApiError::Forbidden(format!(
        "job {id} belongs to another token; a client sees only its own jobs (admins all)"
    )))
}

/// A job with its attempts (the owner's or an admin's).
#[utoipa::path(
    get,
    path = "/api/v1/jobs/{id}",
    tag = "jobs",
    params(("id" = Uuid, Path, description = "The job's id")),
    responses((status = 200, description = "The job", body = JobView), Errors)
)]
pub async fn show(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<JobView>> {
    let id = parse_id(&id, "a job")?;
    check_owner(&state, &caller, id).await?;
    read::detail(&state.db, id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no job {id}")))
}

/// A list's query string, as the API and the dashboard's list page take
/// it; empty values count as absent (an HTML form sends every field).
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    #[param(value_type = Option<JobState>)]
    pub state: Option<String>,
    #[param(value_type = Option<JobKind>)]
    pub kind: Option<String>,
    /// An agent's name.
    pub agent: Option<String>,
    pub submitter: Option<String>,
    /// Text in the command, or the start or end of the job id.
    pub q: Option<String>,
    /// The cursor: the `next` of the previous page (its last job's id).
    #[param(value_type = Option<Uuid>)]
    pub before: Option<String>,
    /// Jobs per page, default 100; a value outside 1 to
    /// 10,000 is taken as the nearer end.
    pub limit: Option<i64>,
}

/// A list request, parsed: what to show, from where, how many.
pub struct ListRequest {
    /// `None` when nothing can match (an agent that never registered).
    pub filter: Option<JobFilter>,
    pub before: Option<(DateTime<Utc>, Uuid)>,
    pub limit: i64,
}

fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

impl ListQuery {
    /// Parses every parameter (`400` naming the wrong one), looks up the
    /// agent and the cursor; `owner` limits a client to its own jobs.
    pub async fn parse(
        &self,
        state: &AppState,
        owner: Option<Uuid>,
        default_limit: i64,
    ) -> ApiResult<ListRequest> {
        let bad = |name: &str, why: String| ApiError::BadRequest(format!("`{name}` {why}"));
        let mut filter = JobFilter {
            owner,
            ..JobFilter::default()
        };
        if let Some(s) = given(&self.state) {
            filter.state = Some(
                s.parse::<JobState>()
                    .map_err(|e| ApiError::BadRequest(e.to_string()))?,
            );
        }
        if let Some(k) = given(&self.kind) {
            filter.kind = Some(
                k.parse::<JobKind>()
                    .map_err(|e| ApiError::BadRequest(e.to_string()))?,
            );
        }
        if let Some(s) = given(&self.submitter) {
            check_name("submitter", s).map_err(|e| ApiError::BadRequest(e.message))?;
            filter.submitter = Some(s.to_string());
        }
        if let Some(q) = self.q.as_deref() {
            filter.text = JobText::parse(q).map_err(|why| bad("q", why))?;
        }
        let before = match given(&self.before) {
            None => None,
            Some(b) => {
                let id: Uuid = b.parse().map_err(|_| {
                    bad(
                        "before",
                        "is not a job id (the `next` of the previous page)".into(),
                    )
                })?;
                let at = read::cursor(&state.db, id)
                    .await?
                    .ok_or_else(|| bad("before", format!("names no job ({id})")))?;
                Some((at, id))
            }
        };
        let limit = self.limit.unwrap_or(default_limit).clamp(1, 10_000);
        let mut req = ListRequest {
            filter: Some(filter),
            before,
            limit,
        };
        if let Some(name) = given(&self.agent) {
            check_name("agent", name).map_err(|e| ApiError::BadRequest(e.message))?;
            match crate::agents::id_of(&state.db, name).await? {
                Some(id) => req.filter.as_mut().expect("set above").agent = Some(id),
                None => req.filter = None,
            }
        }
        Ok(req)
    }
}

impl ListRequest {
    /// The page asked for; a search cut short by [`read::WALK_TIMEOUT`]
    /// is a `422` that says how to narrow it.
    pub async fn run(&self, state: &AppState) -> ApiResult<JobPage> {
        let Some(filter) = &self.filter else {
            return Ok(JobPage {
                jobs: Vec::new(),
                next: None,
            });
        };
        read::page(&state.db, filter, self.before, self.limit)
            .await
            .map_err(|e| {
                if read::timed_out(&e) {
                    ApiError::invalid(format!(
                        "the list took longer than {} s to find its jobs: narrow it with a \
                         state, or page from an older job (`before`)",
                        read::WALK_TIMEOUT.as_secs()
                    ))
                } else {
                    e.into()
                }
            })
    }
}

/// The newest jobs matching the filters, a page at a time: all jobs for
/// an admin, a client's own otherwise.
#[utoipa::path(
    get,
    path = "/api/v1/jobs",
    tag = "jobs",
    params(ListQuery),
    responses((status = 200, description = "A page of jobs", body = JobList), Errors)
)]
pub async fn list(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    QueryParams(q): QueryParams<ListQuery>,
) -> ApiResult<Json<JobList>> {
    let page = q
        .parse(&state, own_only(&caller), 100)
        .await?
        .run(&state)
        .await?;
    Ok(Json(JobList {
        jobs: page.jobs,
        next: page.next,
    }))
}

/// The owner a client's lists are limited to (`None` for an admin: all).
fn own_only(caller: &Caller) -> Option<Uuid> {
    (caller.role != TokenRole::Admin).then_some(caller.token_id)
}

/// Queues failed or cancelled job `id` again as a new job (`201 {id}`):
/// the same spec, labels, priority, cost and attempts, owned by the
/// caller and accounted to it. The owner of the job or an admin; once per
/// job (the job's view then names its retry, `retried_as`).
#[utoipa::path(
    post,
    path = "/api/v1/jobs/{id}/retry",
    tag = "jobs",
    params(("id" = Uuid, Path, description = "The failed or cancelled job")),
    responses(
        (status = 201, description = "The new job's id", body = Created),
        (status = 409, description = "The job has not failed or been cancelled, or was retried already (a job is retried once; the message names its retry)", body = flotilla_core::api::ErrorBody),
        (status = 429, description = "The submitter has as many jobs waiting as one may (`--max-waiting-per-submitter`)", body = flotilla_core::api::ErrorBody),
        Errors
    )
)]
pub async fn retry(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    PathParams(id): PathParams<String>,
) -> ApiResult<impl IntoResponse> {
    let id = parse_id(&id, "a job")?;
    let cap = state.waiting_cap(caller.role);
    submit::recalled_refusal(cap, &caller.submitter(), 1)?;
    check_owner(&state, &caller, id).await?;
    let new = retry::requeue(
        &state.db,
        id,
        Some(caller.token_id),
        caller.submitter(),
        cap,
    )
    .await?;
    Ok(created(Created { id: new }))
}

/// Cancels a job: at once if no agent holds it, else at its agent's next
/// heartbeat.
#[utoipa::path(
    post,
    path = "/api/v1/jobs/{id}/cancel",
    tag = "jobs",
    params(("id" = Uuid, Path, description = "The job's id")),
    responses(
        (status = 200, description = "Cancelled", body = CancelReply),
        (status = 202, description = "The agent was asked to stop it (a job that finishes first keeps its result)", body = CancelReply),
        (status = 409, description = "The job already finished", body = flotilla_core::api::ErrorBody),
        Errors
    )
)]
pub async fn cancel(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    PathParams(id): PathParams<String>,
) -> ApiResult<impl IntoResponse> {
    let id = parse_id(&id, "a job")?;
    check_owner(&state, &caller, id).await?;
    let (status, msg) = match cancel::cancel(&state.db, id).await? {
        Cancelled::Now => {
            // Room made by the caller itself: its next submission here is
            // counted, not answered from a refusal it remembers.
            state.cap_refusals.forget(&caller.submitter());
            state.wake_parent_of(id).await;
            (StatusCode::OK, "cancelled".to_string())
        }
        Cancelled::Requested => (
            StatusCode::ACCEPTED,
            "cancel requested; the agent stops the job at its next heartbeat (a job that \
             finishes before then keeps its result: it may still end succeeded)"
                .to_string(),
        ),
        Cancelled::AlreadyFinal(s) => {
            return Err(ApiError::Conflict(format!(
                "job {id} already finished: {s}"
            )))
        }
        Cancelled::NotFound => return Err(ApiError::NotFound(format!("no job {id}"))),
    };
    Ok((status, Json(CancelReply { id, status: msg })))
}
