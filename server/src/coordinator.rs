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

    fn take(&self) -> BTreeSet<Uuid> {
        std::mem::take(
            &mut *self
                .woken
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }
}

/// How long after a pass the parents it could not advance (another
/// server held one, or the database failed a statement) are looked at
/// again; doubled while they still cannot be, up to the interval.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Parents to look at again, apart from those woken: a pass for a
/// completion does not pay for them (a statement that times out on one
/// would have held every pass up).
struct Retries {
    parents: BTreeSet<Uuid>,
    at: Option<Instant>,
    after: Duration,
}

impl Retries {
    fn add(&mut self, parents: impl IntoIterator<Item = Uuid>, now: Instant) {
        self.parents.extend(parents);
        if !self.parents.is_empty() && self.at.is_none() {
            self.at = Some(now + self.after);
        }
    }

    fn due(&self, now: Instant) -> bool {
        self.at.is_some_and(|at| now >= at)
    }
}

/// Runs `pass` for the parents woken whenever `wake` is woken, and for
/// all of them at once and then at least every `interval` (woken or not),
/// until `shutdown`. The parents a pass returns (it could not advance
/// them) and those of a pass that failed are looked at again after
/// [`RETRY_AFTER`], and again, twice as long after each time they still
/// cannot be (up to `interval`); so are the parents woken when a pass of
/// every parent came instead (it passes over one that another server
/// holds).
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
    let mut retries = Retries {
        parents: BTreeSet::new(),
        at: None,
        after: RETRY_AFTER,
    };
    loop {
        let next = retries.at.map_or(next_all, |r| r.min(next_all));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            // `notify_one` keeps a permit when nobody waits, so a child that
            // ended during the previous pass is not missed.
            _ = wake.notify.notified() => {}
            _ = tokio::time::sleep_until(next) => {}
        }
        let now = Instant::now();
        let retrying = retries.due(now);
        // Every parent once an interval, however often wake-ups come.
        let parents = if now >= next_all {
            next_all = now + interval;
            // Every parent is looked at now; those woken once more soon.
            retries.parents.clear();
            retries.at = None;
            retries.add(wake.take(), now);
            Parents::All
        } else {
            let mut these = wake.take();
            if retrying {
                these.append(&mut retries.parents);
                retries.at = None;
            }
            Parents::These(these.into_iter().collect())
        };
        let again = match pass(parents.clone()).await {
            Ok(again) => again,
            Err(e) => {
                tracing::warn!(error = %e, "coordinator pass failed; will retry");
                match parents {
                    Parents::All => {
                        next_all = Instant::now() + retries.after;
                        Vec::new()
                    }
                    Parents::These(ids) => ids,
                }
            }
        };
        if retrying {
            retries.after = if again.is_empty() {
                RETRY_AFTER
            } else {
                (retries.after * 2).min(interval.max(RETRY_AFTER))
            };
        }
        retries.add(again, Instant::now());
    }
}

/// Every parent kind's pass, in turn. Revdeps runs are few and each pass
/// looks at all of them; the pipeline runs the pass could not advance are
/// returned (a failed revdeps pass is logged, not let drop them).
pub async fn advance_all(db: &sqlx::PgPool, parents: &Parents) -> anyhow::Result<Vec<Uuid>> {
    if let Err(e) = crate::revdeps::coordinator::advance(db).await {
        tracing::warn!(error = %e, "revdeps coordinator pass failed; will retry");
    }
    crate::pipelines::engine::advance(db, parents).await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A started loop, on tokio's paused clock, with a pass that records
    /// what each was for, fails while `fail` is above 0 (counting it
    /// down), and returns `again` (emptying it).
    struct Loop {
        wake: Arc<ParentWakeups>,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<()>,
        seen: Arc<Mutex<Vec<Parents>>>,
        again: Arc<Mutex<Vec<Uuid>>>,
        fail: Arc<AtomicUsize>,
    }

    impl Loop {
        fn start(interval: Duration) -> Loop {
            let wake = Arc::new(ParentWakeups::default());
            let shutdown = CancellationToken::new();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let again = Arc::new(Mutex::new(Vec::new()));
            let fail = Arc::new(AtomicUsize::new(0));
            let (kept, given_back, failing) = (seen.clone(), again.clone(), fail.clone());
            let task = tokio::spawn(run(
                move |parents| {
                    kept.lock().unwrap().push(parents);
                    let fails = failing
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                    let back = std::mem::take(&mut *given_back.lock().unwrap());
                    async move {
                        anyhow::ensure!(!fails, "this pass fails");
                        Ok(back)
                    }
                },
                wake.clone(),
                interval,
                shutdown.clone(),
            ));
            Loop {
                wake,
                shutdown,
                task,
                seen,
                again,
                fail,
            }
        }

        fn seen(&self) -> Vec<Parents> {
            self.seen.lock().unwrap().clone()
        }

        async fn stop(self) {
            self.shutdown.cancel();
            self.task.await.unwrap();
        }
    }

    /// Lets the spawned loop run until it waits again.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    async fn after(d: Duration) {
        tokio::time::advance(d).await;
        settle().await;
    }

    #[tokio::test(start_paused = true)]
    async fn every_parent_at_start_and_once_an_interval() {
        let l = Loop::start(Duration::from_secs(2));
        settle().await;
        assert_eq!(
            l.seen(),
            [Parents::All],
            "a pass over every parent at start"
        );
        after(Duration::from_millis(1999)).await;
        assert_eq!(l.seen().len(), 1);
        for expected in 2..=5 {
            after(Duration::from_secs(2)).await;
            assert_eq!(l.seen().len(), expected, "one pass per interval");
        }
        assert!(l.seen().iter().all(|p| *p == Parents::All));
        l.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_pass_over_every_parent_is_tried_again_soon() {
        let l = Loop::start(Duration::from_secs(3600));
        l.fail.store(1, Ordering::SeqCst);
        settle().await;
        assert_eq!(l.seen().len(), 1);
        after(RETRY_AFTER).await;
        assert_eq!(l.seen(), [Parents::All, Parents::All], "not an hour later");
        after(RETRY_AFTER * 10).await;
        assert_eq!(l.seen().len(), 2, "then the interval's");
        l.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_up_runs_a_pass_at_once_and_one_during_a_pass_is_kept() {
        let l = Loop::start(Duration::from_secs(3600));
        settle().await;
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        l.wake.wake(a);
        settle().await;
        assert_eq!(l.seen().len(), 2, "woken: no wait for the hour");
        // The first of three wake-ups wakes the waiting loop; the two that
        // come before it waits again (as during a pass) are kept as one
        // permit: exactly one more pass, so nothing that ended is missed
        // and bursts do not pile up.
        l.wake.wake(b);
        l.wake.wake(c);
        l.wake.wake(b);
        settle().await;
        assert_eq!(l.seen().len(), 4);
        after(Duration::from_secs(60)).await;
        assert_eq!(l.seen().len(), 4, "no pass without a reason");
        let seen = l.seen();
        // Each pass for the parents woken before it, each once.
        assert_eq!(seen[..2], [Parents::All, Parents::These(vec![a])]);
        let later: Vec<Uuid> = seen[2..]
            .iter()
            .flat_map(|p| match p {
                Parents::These(ids) => ids.clone(),
                Parents::All => panic!("a pass of every parent within the hour: {seen:?}"),
            })
            .collect();
        let mut bc = vec![b, c];
        bc.sort();
        assert_eq!(later, bc, "{seen:?}");
        l.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn every_parent_is_looked_at_each_interval_under_constant_wake_ups() {
        let l = Loop::start(Duration::from_secs(2));
        settle().await;
        // A child ends here every 100 ms for 10 s: before, each wake-up
        // restarted the interval's sleep, and every pass was for all.
        for _ in 0..100 {
            l.wake.wake(Uuid::new_v4());
            after(Duration::from_millis(100)).await;
        }
        let seen = l.seen();
        let all = seen.iter().filter(|p| **p == Parents::All).count();
        assert!(
            (5..=7).contains(&all),
            "{all} passes of every parent in 10 s"
        );
        assert!(seen.len() >= 90, "{} passes", seen.len());
        l.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn parents_a_pass_could_not_advance_are_looked_at_again_later_and_later() {
        let l = Loop::start(Duration::from_secs(3600));
        settle().await;
        let (woken, stuck, other) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        // The pass for `woken` could not advance `stuck`.
        l.again.lock().unwrap().push(stuck);
        l.wake.wake(woken);
        settle().await;
        // A completion's pass meanwhile does not take it on.
        after(RETRY_AFTER / 2).await;
        l.wake.wake(other);
        settle().await;
        assert_eq!(
            l.seen()[1..],
            [Parents::These(vec![woken]), Parents::These(vec![other])]
        );
        // A second after: `stuck` alone, which still cannot be advanced.
        l.again.lock().unwrap().push(stuck);
        after(RETRY_AFTER / 2).await;
        assert_eq!(l.seen().len(), 4);
        assert_eq!(l.seen()[3], Parents::These(vec![stuck]));
        // Then two seconds after that, not one.
        after(RETRY_AFTER).await;
        assert_eq!(l.seen().len(), 4, "not a second later");
        after(RETRY_AFTER).await;
        assert_eq!(l.seen().len(), 5);
        assert_eq!(l.seen()[4], Parents::These(vec![stuck]));
        // Advanced: no more.
        after(RETRY_AFTER * 60).await;
        assert_eq!(l.seen().len(), 5);
        l.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_pass_keeps_its_parents() {
        let l = Loop::start(Duration::from_secs(3600));
        settle().await;
        let woken = Uuid::new_v4();
        l.fail.store(1, Ordering::SeqCst);
        l.wake.wake(woken);
        settle().await;
        after(RETRY_AFTER).await;
        assert_eq!(
            l.seen(),
            [
                Parents::All,
                Parents::These(vec![woken]),
                Parents::These(vec![woken])
            ]
        );
        l.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_the_loop_between_passes() {
        let l = Loop::start(Duration::from_secs(1));
        after(Duration::from_millis(1500)).await;
        l.shutdown.cancel();
        let n = l.seen().len();
        after(Duration::from_secs(10)).await;
        assert_eq!(l.seen().len(), n, "no pass after shutdown");
        l.task.await.unwrap();
    }
}
