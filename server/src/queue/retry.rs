//! A failed or cancelled command job queued again as a new job: the same
//! spec, labels, priority, cost and attempts, checked again against
//! today's limits, the agents that could take it and the submitter's
//! waiting cap. The API's `POST /api/v1/jobs/{id}/retry` and the
//! dashboard's Retry button both come here; each has checked the caller.

use flotilla_core::api::{FieldError, SubmitJob};
use flotilla_core::job::{JobKind, JobSpec, JobState};
use sqlx::PgPool;
use uuid::Uuid;

use super::submit::{self, NewJob, WaitingCap, WaitingCapExceeded};
use super::valid::ValidJob;
use super::{classes, read};

/// Why a job was not retried.
#[derive(Debug, thiserror::Error)]
pub enum RetryError {
    #[error("no job {0}")]
    NotFound(Uuid),
    #[error("job {id} is {state}: only a failed or cancelled job is retried")]
    NotEnded { id: Uuid, state: JobState },
    /// A tile, revdeps or pipeline job belongs to the region, run or
    /// pipeline that made it, which would not see a copy made beside it.
    #[error("only command jobs are retried one by one; for a {kind} job, {how}")]
    NotCommand { kind: JobKind, how: &'static str },
    /// The job no longer passes today's checks, or no registered agent
    /// could take it.
    #[error(transparent)]
    Invalid(FieldError),
    #[error(transparent)]
    Capped(WaitingCapExceeded),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Queues job `id` again as a new job owned by `owner` and accounted to
/// `submitter`, within `cap` waiting jobs of that submitter; the new id.
pub async fn requeue(
    db: &PgPool,
    id: Uuid,
    owner: Option<Uuid>,
    submitter: String,
    cap: Option<WaitingCap<'_>>,
) -> Result<Uuid, RetryError> {
    let src = read::retry_source(db, id)
        .await?
        .ok_or(RetryError::NotFound(id))?;
    if !matches!(src.state, JobState::Failed | JobState::Cancelled) {
        return Err(RetryError::NotEnded {
            id,
            state: src.state,
        });
    }
    let again = match &src.spec {
        JobSpec::Command(_) => None,
        JobSpec::Tile(_) => {
            Some("submit its region again (POST /api/v1/rois): only missing tiles are redone")
        }
        JobSpec::Revdeps(_) => Some("submit the run again (POST /api/v1/revdeps)"),
        JobSpec::Step(_) => Some("run the pipeline again: it resumes after the outputs that exist"),
    };
    if let Some(how) = again {
        return Err(RetryError::NotCommand {
            kind: src.spec.kind(),
            how,
        });
    }
    // Checked again: the limits may have changed since it was submitted.
    let valid = ValidJob::try_from(SubmitJob {
        spec: src.spec,
        labels: src.labels,
        priority: src.priority,
        max_attempts: src.max_attempts,
        cost: src.cost,
        submitter: None,
    })
    .map_err(RetryError::Invalid)?;
    let job = NewJob {
        submitter,
        owner,
        ..valid.job
    };
    if let Some(refused) = classes::refusal(db, &job).await? {
        return Err(RetryError::Invalid(refused));
    }
    let ids = submit::submit_within(db, &[job], cap)
        .await?
        .map_err(RetryError::Capped)?;
    tracing::info!(job = %id, retry = %ids[0], "job retried");
    Ok(ids[0])
}
