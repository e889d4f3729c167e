//! The one place an attempt's end is recorded: an agent's `complete` or
//! `fail`. The finishing statement returns what it finished (kind, state,
//! a tile's spec), and the kind's own work is dispatched from here: a tile
//! job's results are published in the transaction that marks it succeeded;
//! a revdeps or pipeline step that ended for good wakes the coordinator for
//! its run ([`crate::coordinator`]), which advances at once instead of at
//! the next pass over every run.

use flotilla_core::job::{JobKind, JobState};
use flotilla_core::protocol::{Complete, Fail};

use crate::error::{ApiError, ApiResult};
use crate::queue::lease::{self, AttemptEnd, Failure, LeaseKey, LeaseRefused};
use crate::state::AppState;
use crate::tiles::finish::{self, FinishError};

impl From<FinishError> for ApiError {
    fn from(e: FinishError) -> Self {
        match e {
            FinishError::MissingOutput { .. } => ApiError::invalid(e.to_string()),
            FinishError::Copy { .. } => ApiError::Internal(e.into()),
            FinishError::Db(e) => e.into(),
        }
    }
}

/// Records a success, with the kind's own finishing in the same
/// transaction: nothing of it counts unless all of it does. A tile's
/// outputs are copied to their final keys first, on no connection
/// ([`finish`]'s module documentation).
///
/// Only a completion that lists outputs can be a tile's (an agent lists
/// both of its outputs), so only such a one reads the job ahead: the
/// others, most of them, cost the completing transaction alone. A tile
/// completion listing none would still be published, in the transaction.
pub async fn complete(state: &AppState, key: LeaseKey, c: &Complete) -> ApiResult<AttemptEnd> {
    let held = if c.outputs.is_empty() {
        None
    } else {
        lease::held_attempt(&state.db, key).await?
    };
    let published = match held {
        Some((attempt, Some(tile))) => {
            finish::publish(&state.db, state.store.as_ref(), key.job, attempt, &tile).await?
        }
        _ => None,
    };
    let mut tx = state.db.begin().await?;
    let ended = lease::complete_in(&mut tx, key, c).await?;
    if let Some(tile) = &ended.tile {
        let store = state.store.as_ref();
        finish::record_in(
            &mut tx,
            store,
            key.job,
            ended.attempt,
            tile,
            published.as_ref(),
        )
        .await?;
    }
    tx.commit().await?;
    after_end(state, &ended);
    Ok(ended)
}

/// Records a failed attempt (retried after a back-off while attempts
/// remain).
pub async fn fail(state: &AppState, key: LeaseKey, f: &Fail) -> Result<AttemptEnd, LeaseRefused> {
    let ended = lease::fail(
        &state.db,
        key,
        Failure {
            class: f.class,
            message: &f.message,
            exit_code: f.exit_code,
        },
        (state.settings.backoff_base, state.settings.backoff_max),
    )
    .await?;
    after_end(state, &ended);
    Ok(ended)
}

/// After the commit: a revdeps step that ended for good (a plan or a
/// shard) or a pipeline's step job may let its run advance. A tile's parent, its ROI, has nothing to
/// do: its progress is read from its children.
fn after_end(state: &AppState, ended: &AttemptEnd) {
    let run_may_advance =
        matches!(ended.kind, JobKind::Revdeps | JobKind::Step) && ended.state != JobState::Retrying;
    if let (true, Some(parent)) = (run_may_advance, ended.parent) {
        state.parents_signal.wake(parent);
    }
}
