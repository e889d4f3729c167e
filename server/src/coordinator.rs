//! The one loop that advances parents when their children end (revdeps
//! runs and pipeline runs): a pass runs at once for the parents whose
//! child ended on this server, or that a request here changed
//! (`AppState::parents_signal`, woken by [`crate::completion`] and the
//! cancels), and a pass over every open parent at least every `interval`
//! for children that ended elsewhere: on another server, by the reaper.
//! Every pass is guarded by the parents' states in SQL, so any number of
//! servers may run this loop over one database: it is per-process and
//! harmless.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The parents a pass looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parents {
    /// Every open one.
    All,
    /// These, woken here. A pass of every open pipeline run per ended
    /// child cost each completion a pass of every other open run too.
    These(Vec<Uuid>),
}

/// Wake-ups for the coordinator: which parents, and one permit so that
/// a wake-up during a pass is not missed.
#[derive(Debug, Default)]
pub struct ParentWakeups {
    notify: Notify,
    woken: Mutex<BTreeSet<Uuid>>,
}

impl ParentWakeups {
    /// Parent `id` may advance: a pass looks at it at once.
    pub fn wake(&self, id: Uuid) {
        self.woken
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(id);
        self.notify.notify_one();
    }

    /// Parents to look at again in the next pass (no wake-up of their own:
    /// [`run`] looks at them after [`RETRY_AFTER`], since a pass at once
    /// would likely meet the same fault).
    fn keep(&self, again: Vec<Uuid>) {
        if again.is_empty() {
            return;
        }
        self.woken
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .extend(again);
    }

    fn take(&self) -> Vec<Uuid> {
        std::mem::take(
            &mut *self
                .woken
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
        .into_iter()
        .collect()
    }
}

/// How long after a pass the parents it could not advance (the database
/// failed a statement) are looked at again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Runs `pass` for the parents woken whenever `wake` is woken, and for
/// all of them at once and then at least every `interval` (woken or not),
/// until `shutdown`. The parents a pass returns (the database kept it
/// from advancing them) are looked at again by the next. A failed pass is
/// logged and retried at the next turn.
pub async fn run<F, Fut>(
    mut pass: F,
    wake: Arc<ParentWakeups>,
    interval: Duration,
    shutdown: CancellationToken,
) where
    F: FnMut(Parents) -> Fut,
    Fut: Future<Output = anyhow::Result<Vec<Uuid>>>,
{
    // A server that starts looks at every open parent first: children may
    // have ended while none ran.
    let mut next_all = Instant::now();
    // When parents a pass could not advance are looked at again.
    let mut retry_at: Option<Instant> = None;
    loop {
        let next = retry_at.map_or(next_all, |r| r.min(next_all));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            // `notify_one` keeps a permit when nobody waits, so a child that
            // ended during the previous pass is not missed.
            _ = wake.notify.notified() => {}
            _ = tokio::time::sleep_until(next) => {}
        }
        retry_at = None;
        // Every parent once an interval, however often wake-ups come.
        let parents = if Instant::now() >= next_all {
            next_all = Instant::now() + interval;
            wake.take();
            Parents::All
        } else {
            Parents::These(wake.take())
        };
        match pass(parents).await {
            Ok(again) if !again.is_empty() => {
                wake.keep(again);
                retry_at = Some(Instant::now() + RETRY_AFTER);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "coordinator pass failed; will retry"),
        }
    }
}

/// Every parent kind's pass, in turn. Revdeps runs are few and each pass
/// looks at all of them; the pipeline runs the database kept from
/// advancing are returned.
pub async fn advance_all(db: &sqlx::PgPool, parents: &Parents) -> anyhow::Result<Vec<Uuid>> {
    let revdeps = crate::revdeps::coordinator::advance(db).await;
    let pipelines = crate::pipelines::engine::advance(db, parents).await;
    revdeps.and(pipelines)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Starts the loop with a pass that counts its calls (and fails every
    /// other one) and keeps what each was for, on tokio's paused clock.
    fn start(interval: Duration) -> Loop {
        let passes = Arc::new(AtomicUsize::new(0));
        let wake = Arc::new(ParentWakeups::default());
        let shutdown = CancellationToken::new();
        let counted = passes.clone();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = seen.clone();
        let again = Arc::new(Mutex::new(Vec::new()));
        let given_back = again.clone();
        let task = tokio::spawn(run(
            move |parents| {
                kept.lock().unwrap().push(parents);
                let n = counted.fetch_add(1, Ordering::SeqCst);
                // `n % 2`, not `is_multiple_of` (Rust 1.87; we allow 1.85).
                #[allow(clippy::manual_is_multiple_of)]
                let even = n % 2 == 0;
                let back = std::mem::take(&mut *given_back.lock().unwrap());
                async move {
                    anyhow::ensure!(even, "pass {n} fails");
                    Ok(back)
                }
            },
            wake.clone(),
            interval,
            shutdown.clone(),
        ));
        Loop {
            passes,
            wake,
            shutdown,
            task,
            seen,
            again,
        }
    }

    /// A started loop: its passes' count, its wake-ups, its shutdown, its
    /// task, what each pass was for, and what the next pass that succeeds
    /// returns as not advanced.
    struct Loop {
        passes: Arc<AtomicUsize>,
        wake: Arc<ParentWakeups>,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<()>,
        seen: Arc<Mutex<Vec<Parents>>>,
        again: Arc<Mutex<Vec<Uuid>>>,
    }

    /// Lets the spawned loop run until it waits again.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn passes_run_once_per_interval_and_survive_errors() {
        let Loop {
            passes,
            shutdown,
            task,
            seen,
            ..
        } = start(Duration::from_secs(2));
        settle().await;
        assert_eq!(
            passes.load(Ordering::SeqCst),
            1,
            "a pass over every parent at start"
        );
        tokio::time::advance(Duration::from_millis(1999)).await;
        settle().await;
        assert_eq!(passes.load(Ordering::SeqCst), 1);
        for expected in 2..=5 {
            tokio::time::advance(Duration::from_secs(2)).await;
            settle().await;
            assert_eq!(
                passes.load(Ordering::SeqCst),
                expected,
                "one pass per interval, failed passes included"
            );
        }
        assert!(seen.lock().unwrap().iter().all(|p| *p == Parents::All));
        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_up_runs_a_pass_at_once_and_one_during_a_pass_is_kept() {
        let Loop {
            passes,
            wake,
            shutdown,
            task,
            seen,
            ..
        } = start(Duration::from_secs(3600));
        settle().await;
        assert_eq!(passes.load(Ordering::SeqCst), 1, "the pass at start");
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        wake.wake(a);
        settle().await;
        assert_eq!(
            passes.load(Ordering::SeqCst),
            2,
            "woken: no wait for the hour"
        );
        // The first of three wake-ups wakes the waiting loop; the two that
        // come before it waits again (as during a pass) are kept as one
        // permit: exactly one more pass, so nothing that ended is missed
        // and bursts do not pile up.
        wake.wake(b);
        wake.wake(c);
        wake.wake(b);
        settle().await;
        assert_eq!(passes.load(Ordering::SeqCst), 4);
        settle().await;
        assert_eq!(passes.load(Ordering::SeqCst), 4, "no pass without a reason");
        let seen = seen.lock().unwrap().clone();
        let mut bc = vec![b, c];
        bc.sort();
        // Each pass for the parents woken before it, each once.
        assert_eq!(seen[0], Parents::All);
        assert_eq!(seen[1], Parents::These(vec![a]));
        let later: Vec<Uuid> = seen[2..]
            .iter()
            .flat_map(|p| match p {
                Parents::These(ids) => ids.clone(),
                Parents::All => panic!("a pass of every parent within the hour: {seen:?}"),
            })
            .collect();
        assert_eq!(later, bc, "{seen:?}");
        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn every_parent_is_looked_at_each_interval_under_constant_wake_ups() {
        let Loop {
            wake,
            shutdown,
            task,
            seen,
            ..
        } = start(Duration::from_secs(2));
        settle().await;
        // A child ends here every 100 ms for 10 s: before, each wake-up
        // restarted the interval's sleep, and every pass was for all.
        for _ in 0..100 {
            wake.wake(Uuid::new_v4());
            settle().await;
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        settle().await;
        let seen = seen.lock().unwrap().clone();
        let all = seen.iter().filter(|p| **p == Parents::All).count();
        assert!(
            (4..=6).contains(&all),
            "{all} passes of every parent in 10 s"
        );
        assert!(seen.len() >= 90, "{} passes", seen.len());
        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn parents_a_pass_could_not_advance_are_looked_at_again() {
        let Loop {
            wake,
            shutdown,
            task,
            seen,
            again,
            ..
        } = start(Duration::from_secs(3600));
        settle().await;
        // The second pass fails (as every other one does); the third gives
        // `stuck` back, and no wake-up follows.
        let (first, woken, stuck) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        wake.wake(first);
        settle().await;
        again.lock().unwrap().push(stuck);
        wake.wake(woken);
        settle().await;
        assert_eq!(seen.lock().unwrap().len(), 3);
        tokio::time::advance(RETRY_AFTER / 2).await;
        settle().await;
        assert_eq!(seen.lock().unwrap().len(), 3, "not at once");
        tokio::time::advance(RETRY_AFTER).await;
        settle().await;
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen,
            [
                Parents::All,
                Parents::These(vec![first]),
                Parents::These(vec![woken]),
                Parents::These(vec![stuck])
            ]
        );
        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_the_loop_between_passes() {
        let Loop {
            passes,
            shutdown,
            task,
            ..
        } = start(Duration::from_secs(1));
        tokio::time::advance(Duration::from_millis(1500)).await;
        settle().await;
        shutdown.cancel();
        task.await.unwrap();
        let n = passes.load(Ordering::SeqCst);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(passes.load(Ordering::SeqCst), n, "no pass after shutdown");
    }
}
