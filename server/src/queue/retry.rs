//! A failed or cancelled command job queued again as a new job: the same
//! spec, labels, priority, cost and attempts, checked again against
//! today's limits, the agents that could take it and the submitter's
//! waiting cap. A job is retried once: the new job records which it
//! retries (`jobs.retry_of`, unique), and a second retry names the first.
//! The API's `POST /api/v1/jobs/{id}/retry` and the dashboard's Retry
//! button both come here; each has checked the caller.

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
    /// Its work is queued again already: a second retry would do it twice.
    #[error(
        "job {id} was retried already, as job {retry}: follow that one, and retry it if it fails too"
    )]
    AlreadyRetried { id: Uuid, retry: Uuid },
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
    if let Some(retry) = read::retried_as(db, id).await? {
        return Err(RetryError::AlreadyRetried { id, retry });
    }
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
    let mut tx = db.begin().await?;
    if let Err(over) = submit::within_waiting_cap(&mut tx, &job.submitter, 1, cap).await? {
        return Err(RetryError::Capped(over));
    }
    let new = submit::submit_in(&mut tx, &[job]).await?[0];
    // With the new job or not at all: of two retries at once, the one that
    // commits second finds the first here (`jobs_retried_once`).
    let linked = sqlx::query("UPDATE jobs SET retry_of = $2 WHERE id = $1")
        .bind(new)
        .bind(id)
        .execute(&mut *tx)
        .await;
    match linked {
        Err(sqlx::Error::Database(e)) if e.constraint() == Some("jobs_retried_once") => {
            drop(tx);
            let retry = read::retried_as(db, id).await?.unwrap_or(new);
            return Err(RetryError::AlreadyRetried { id, retry });
        }
        linked => linked?,
    };
    tx.commit().await?;
    tracing::info!(job = %id, retry = %new, "job retried");
    Ok(new)
}
