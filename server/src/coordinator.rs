//! The one loop that advances parents when their children end (revdeps
//! runs and pipeline runs): a pass runs at once when a child
//! ended on this server (`AppState::parents_signal`, woken by
//! [`crate::completion`]), and every `interval` for children that ended
//! elsewhere — on another server, by the reaper, or by a cancel. Every pass
//! is guarded by the parents' states in SQL, so any number of servers may
//! run this loop over one database: it is per-process and harmless.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Runs `pass` whenever `wake` is notified and at least every `interval`,
/// until `shutdown`. A failed pass is logged and retried at the next turn.
pub async fn run<F, Fut>(
    mut pass: F,
    wake: Arc<Notify>,
    interval: Duration,
    shutdown: CancellationToken,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            // `notify_one` keeps a permit when nobody waits, so a child that
            // ended during the previous pass is not missed.
            _ = wake.notified() => {}
            _ = tokio::time::sleep(interval) => {}
        }
        if let Err(e) = pass().await {
            tracing::warn!(error = %e, "coordinator pass failed; will retry");
        }
    }
}

/// Every parent kind's pass, in turn.
pub async fn advance_all(db: &sqlx::PgPool) -> anyhow::Result<()> {
    let revdeps = crate::revdeps::coordinator::advance(db).await;
    let pipelines = crate::pipelines::engine::advance(db).await;
    revdeps.and(pipelines)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Starts the loop with a pass that counts its calls (and fails every
    /// other one), on tokio's paused clock.
    fn start(
        interval: Duration,
    ) -> (
        Arc<AtomicUsize>,
        Arc<Notify>,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let passes = Arc::new(AtomicUsize::new(0));
        let wake = Arc::new(Notify::new());
        let shutdown = CancellationToken::new();
        let counted = passes.clone();
        let task = tokio::spawn(run(
            move || {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                // `n % 2`, not `is_multiple_of` (Rust 1.87; we allow 1.85).
                #[allow(clippy::manual_is_multiple_of)]
                let even = n % 2 == 0;
                async move {
                    anyhow::ensure!(even, "pass {n} fails");
                    Ok(())
                }
            },
            wake.clone(),
            interval,
            shutdown.clone(),
        ));
        (passes, wake, shutdown, task)
    }

    /// Lets the spawned loop run until it waits again.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn passes_run_once_per_interval_and_survive_errors() {
        let (passes, _wake, shutdown, task) = start(Duration::from_secs(2));
        settle().await;
        assert_eq!(
            passes.load(Ordering::SeqCst),
            0,
            "no pass before the first interval"
        );
        tokio::time::advance(Duration::from_millis(1999)).await;
        settle().await;
        assert_eq!(passes.load(Ordering::SeqCst), 0);
        for expected in 1..=4 {
            tokio::time::advance(Duration::from_secs(2)).await;
            settle().await;
            assert_eq!(
                passes.load(Ordering::SeqCst),
                expected,
                "one pass per interval, failed passes included"
            );
        }
        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_up_runs_a_pass_at_once_and_one_during_a_pass_is_kept() {
        let (passes, wake, shutdown, task) = start(Duration::from_secs(3600));
        settle().await;
        wake.notify_one();
        settle().await;
        assert_eq!(
            passes.load(Ordering::SeqCst),
            1,
            "woken: no wait for the hour"
        );
        // The first of three wake-ups wakes the waiting loop; the two that
        // come before it waits again (as during a pass) are kept as one
        // permit: exactly one more pass, so nothing that ended is missed
        // and bursts do not pile up.
        wake.notify_one();
        wake.notify_one();
        wake.notify_one();
        settle().await;
        assert_eq!(passes.load(Ordering::SeqCst), 3);
        settle().await;
        assert_eq!(passes.load(Ordering::SeqCst), 3, "no pass without a reason");
        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_the_loop_between_passes() {
        let (passes, _wake, shutdown, task) = start(Duration::from_secs(1));
        tokio::time::advance(Duration::from_millis(1500)).await;
        settle().await;
        shutdown.cancel();
        task.await.unwrap();
        let n = passes.load(Ordering::SeqCst);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(passes.load(Ordering::SeqCst), n, "no pass after shutdown");
    }
}
