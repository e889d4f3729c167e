//! Live page data computed at most once per interval per page, however
//! many open tabs ask for it: the overview every tab pushes, a pipeline
//! run's matrix, an ROI's map, a job's new log lines, whether a session is
//! still valid. With 200 tabs open the
//! database sees the same queries per second as with one (a test in
//! `tests/tests/e2e/dashboard.rs` measures it). Per server process: each
//! replica computes its own, which is harmless.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// One key's latest value and when it was computed; its own lock, so
/// that while one stream computes it the others wait for that result
/// instead of computing it again.
type Slot<V> = Arc<tokio::sync::Mutex<Option<(Instant, V)>>>;

/// Values by key, each recomputed when older than `max_age`.
pub struct Shared<K, V> {
    max_age: Duration,
    slots: Mutex<HashMap<K, (Instant, Slot<V>)>>,
}

/// Keys not asked for in this long are dropped (a closed run's page).
const FORGET_AFTER: Duration = Duration::from_secs(120);

impl<K: Hash + Eq + Clone, V: Clone> Shared<K, V> {
    pub fn new(max_age: Duration) -> Self {
        Shared {
            max_age,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// The value for `key`: the one computed less than `max_age` ago, or
    /// `compute`'s (once, whoever else is waiting). An error is not kept.
    pub async fn get<E, F, Fut>(&self, key: K, compute: F) -> Result<V, E>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<V, E>>,
    {
        let slot = {
            let now = Instant::now();
            let mut slots = self.slots.lock().expect("the slots lock is never poisoned");
            slots.retain(|_, (used, _)| now.duration_since(*used) < FORGET_AFTER);
            let entry = slots
                .entry(key)
                .or_insert_with(|| (now, Arc::new(tokio::sync::Mutex::new(None))));
            entry.0 = now;
            entry.1.clone()
        };
        let mut held = slot.lock().await;
        if let Some((at, v)) = held.as_ref() {
            if at.elapsed() < self.max_age {
                return Ok(v.clone());
            }
        }
        let v = compute().await?;
        *held = Some((Instant::now(), v.clone()));
        Ok(v)
    }
}

impl<K: Hash + Eq, V: Clone> Shared<K, V> {
    /// The value for `key` if one younger than `max_age` is kept and no
    /// one is computing it; never computes, never adds a key (so a caller
    /// with made-up keys cannot grow the map).
    pub fn fresh(&self, key: &K) -> Option<V> {
        self.look(key).flatten()
    }

    /// Whether a value for `key` was asked for lately (kept, however old).
    pub fn known(&self, key: &K) -> bool {
        self.slots
            .lock()
            .expect("the slots lock is never poisoned")
            .contains_key(key)
    }

    /// `None`: no such key; `Some(None)`: kept but too old, or being
    /// computed; `Some(Some(v))`: a young value.
    fn look(&self, key: &K) -> Option<Option<V>> {
        let slot = {
            let mut slots = self.slots.lock().expect("the slots lock is never poisoned");
            let entry = slots.get_mut(key)?;
            entry.0 = Instant::now();
            entry.1.clone()
        };
        let Ok(held) = slot.try_lock() else {
            return Some(None);
        };
        Some(
            held.as_ref()
                .filter(|(at, _)| at.elapsed() < self.max_age)
                .map(|(_, v)| v.clone()),
        )
    }
}

/// A pipeline run's page: the run and the item its rows start after.
pub type RunPage = (uuid::Uuid, Option<u64>);

/// A run page's state: whether the run is final, and the JSON the page's
/// script patches itself from.
pub type RunPageState = (bool, Arc<String>);

/// An ROI page's state: the JSON every event carries (counts, progress,
/// ETA, the agents' bars) and the map's tiles, a letter each in map order
/// (`None` for an ROI too big for a map).
pub type RoiPageState = Arc<(String, Option<String>)>;

/// A job page's next look at its job: the log lines after a position (at
/// most a page of them) and the job's state and attempt, read before them
/// (`None`: no such job any more); with no lines and a final state, the
/// job has ended.
#[derive(Debug, Default)]
pub struct LogTick {
    pub rows: Vec<crate::queue::logs::LogRow>,
    pub stage: Option<(flotilla_core::job::JobState, i32)>,
}

/// What the dashboard's live streams share.
pub struct LivePages {
    /// The overview's panel, rendered, by owner (`None`: every job, for
    /// admins).
    pub overview: Shared<Option<uuid::Uuid>, Arc<String>>,
    /// A pipeline run's page state (JSON), by run and page.
    pub pipelines: Shared<RunPage, Option<RunPageState>>,
    /// Whether a session (by the hash of its id) is still valid.
    pub sessions: Shared<Vec<u8>, bool>,
    /// An ROI page's state, by ROI.
    pub rois: Shared<uuid::Uuid, Option<RoiPageState>>,
    /// A job page's log stream, by job and the line it has shown: the
    /// tabs following one job ask for the same position and share a look.
    pub logs: Shared<(uuid::Uuid, i64), Arc<LogTick>>,
    /// The active alerts, for every page's banner, the API and `/metrics`
    /// (evaluated once per `--alert-interval-ms`).
    pub alerts: crate::alerts::Latest,
    /// The live streams open now, under `--max-streams` and
    /// `--max-streams-per-token` ([`super::streams`]).
    pub streams: Arc<super::streams::OpenStreams>,
}

impl LivePages {
    /// Shared for a little less than the streams' own intervals, so each
    /// stream's tick finds a value from this interval or makes it.
    pub fn new() -> Self {
        LivePages {
            overview: Shared::new(Duration::from_millis(1900)),
            pipelines: Shared::new(Duration::from_millis(900)),
            sessions: Shared::new(Duration::from_millis(4900)),
            rois: Shared::new(Duration::from_millis(1900)),
            logs: Shared::new(Duration::from_millis(450)),
            alerts: crate::alerts::Latest::default(),
            streams: Arc::default(),
        }
    }
}

impl Default for LivePages {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// 100 callers at once compute once; after `max_age` once more.
    #[tokio::test(start_paused = true)]
    async fn many_callers_compute_once_per_interval() {
        let shared = Arc::new(Shared::<(), usize>::new(Duration::from_secs(2)));
        let computed = Arc::new(AtomicUsize::new(0));
        let call = |shared: Arc<Shared<(), usize>>, computed: Arc<AtomicUsize>| async move {
            shared
                .get((), || async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, ()>(computed.fetch_add(1, Ordering::SeqCst))
                })
                .await
        };
        let tasks: Vec<_> = (0..100)
            .map(|_| tokio::spawn(call(shared.clone(), computed.clone())))
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap(), Ok(0));
        }
        assert_eq!(computed.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(call(shared.clone(), computed.clone()).await, Ok(1));
        assert_eq!(computed.load(Ordering::SeqCst), 2);
    }

    /// `fresh` answers a kept value while it is young, nothing after, and
    /// never keeps a key it was asked for.
    #[tokio::test(start_paused = true)]
    async fn fresh_reads_without_computing_or_adding() {
        let shared = Shared::<u8, bool>::new(Duration::from_secs(2));
        assert_eq!(shared.fresh(&1), None);
        assert_eq!(shared.slots.lock().unwrap().len(), 0, "asking adds no key");
        shared.get(1, || async { Ok::<_, ()>(true) }).await.unwrap();
        assert_eq!(shared.fresh(&1), Some(true));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(shared.fresh(&1), None, "too old");
        assert!(shared.known(&1) && !shared.known(&2));
    }
}
