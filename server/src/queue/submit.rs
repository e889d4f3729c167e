//! Inserting jobs: validation has happened at the edge; here they go in, in
//! one transaction, each with its fair-share tag.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use flotilla_core::job::JobSpec;
use sqlx::PgPool;
use uuid::Uuid;

use super::wakeup::notify_jobs;

/// A validated job ready to insert.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub spec: JobSpec,
    pub labels: std::collections::BTreeMap<String, String>,
    pub priority: i32,
    pub max_attempts: u32,
    pub cost: u32,
    pub submitter: String,
    /// The run or ROI this job belongs to.
    pub parent_id: Option<Uuid>,
    /// Its place among its parent's children (a revdeps shard's index), so
    /// a parent reads its children in order without parsing their specs.
    pub child_index: Option<i32>,
    /// The token it belongs to: its submitter's, or the one whose ROI or
    /// revdeps run made it (`None`: admins only).
    pub owner: Option<Uuid>,
}

/// The ready jobs of submitter `$1`, as a range of `jobs_ready_by_submitter`
/// (every tag of `$1`, which is what `submitter = $1` says) rather than an
/// equality. With the equality, PostgreSQL drops `submitter` from an
/// `ORDER BY submitter, share_seq` as constant, and a generic plan (what a
/// prepared statement runs on after its fifth execution, planned for no
/// submitter in particular) then walks `jobs_ready_share` from one end,
/// filtering on the submitter: a small submitter behind a big one's 100,000
/// waiting jobs paid 145 ms a submission, a scan of the other's backlog. A
/// range is an index condition of `jobs_ready_by_submitter` alone, so every
/// plan reads the first entry of it (`queue_policy.rs` checks both plans).
macro_rules! ready_of_submitter {
    () => {
        "(submitter, share_seq) >= ($1, -9223372036854775808)
         AND (submitter, share_seq) <= ($1, 9223372036854775807)
         AND state IN ('queued', 'retrying')"
    };
}

/// The first fair-share tag for new jobs of submitter `$1`: max(its last
/// ready tag + 1, the smallest ready tag of anyone). Public so a test can
/// `EXPLAIN` it.
pub const SHARE_BASE_SQL: &str = concat!(
    "SELECT GREATEST(
         COALESCE((SELECT share_seq + 1 FROM jobs WHERE ",
    ready_of_submitter!(),
    "         ORDER BY submitter DESC, share_seq DESC LIMIT 1), 0),
         COALESCE((SELECT share_seq FROM jobs
                   WHERE state IN ('queued', 'retrying')
                   ORDER BY share_seq LIMIT 1), 0))"
);

/// Inserts `jobs` (all of one submitter) in one transaction and wakes the
/// agents. Returns their ids in order.
///
/// Fair share is start-time fair queuing: a submitter's new jobs get tags
/// `base, base+1, …` with `base` = max(its last ready tag + 1, the smallest
/// ready tag of anyone). The claim orders by (priority, tag), so a
/// submitter with 10 jobs interleaves with one that has 10,000 queued
/// instead of waiting behind them. Both ends are the first entry of an
/// index (`jobs_ready_by_submitter`, `jobs_ready_share`), so a submission
/// does not read the backlog.
///
/// Each job also gets its class ([`super::classes`]), which the claim
/// reads instead of filtering ready jobs one by one.
pub async fn submit(db: &PgPool, jobs: &[NewJob]) -> Result<Vec<Uuid>, sqlx::Error> {
    let mut tx = db.begin().await?;
    let ids = submit_in(&mut tx, jobs).await?;
    tx.commit().await?;
    Ok(ids)
}

/// A submission that would leave its submitter more jobs waiting than the
/// server allows one submitter (`--max-waiting-per-submitter`): a client
/// that queues without end would grow the tables and every count over them.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "submitter `{submitter}` has {waiting} jobs waiting to run and this adds {adding}; at most \
     {cap} may wait at once for one submitter. Let some run, or cancel some, and submit again \
     (an admin token is not limited)"
)]
pub struct WaitingCapExceeded {
    pub submitter: String,
    pub waiting: WaitingCount,
    pub adding: u64,
    pub cap: u64,
}

/// How many jobs wait, as far as the count went (it stops past the cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitingCount {
    Exactly(u64),
    /// More than this many.
    Over(u64),
}

impl std::fmt::Display for WaitingCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitingCount::Exactly(n) => write!(f, "{n}"),
            WaitingCount::Over(n) => write!(f, "more than {n}"),
        }
    }
}

/// An upper bound on the jobs of `submitter` waiting to run: the span of
/// their fair-share tags, which a submitter's submissions number one after
/// another (see [`SHARE_BASE_SQL`]), so that the span exceeds the count only
/// by the jobs taken or cancelled from its middle. Two probes of
/// `jobs_ready_by_submitter`, whatever the backlog. (Two submissions of one
/// submitter at once could take the same tags, and the span would then
/// fall short of the count: capped submissions hold the submitter's lock,
/// [`within_waiting_cap`], so only an admin's submission for another
/// submitter, uncapped, can overlap one.) Public so a test can `EXPLAIN` it.
pub const WAITING_SPAN_SQL: &str = concat!(
    "SELECT COALESCE(
         (SELECT share_seq FROM jobs WHERE ",
    ready_of_submitter!(),
    "          ORDER BY submitter DESC, share_seq DESC LIMIT 1)
         - (SELECT share_seq FROM jobs WHERE ",
    ready_of_submitter!(),
    "          ORDER BY submitter, share_seq LIMIT 1) + 1, 0)"
);

/// Jobs of `submitter` waiting to run (queued or retrying), counted up to
/// `$2`: the count reads `jobs_ready_by_submitter` and stops there (a
/// fifth of a second at a million on a 2-core machine). Public so a test
/// can `EXPLAIN` it.
pub const WAITING_SQL: &str = concat!(
    "SELECT count(*) FROM (SELECT 1 FROM jobs WHERE ",
    ready_of_submitter!(),
    " ORDER BY submitter, share_seq LIMIT $2) AS waiting"
);

/// How long a refusal of the waiting cap is remembered (see [`CapRefusals`]).
pub const REFUSAL_MEMORY: Duration = Duration::from_secs(1);

/// Most submitters whose refusals are remembered at once; past it, the
/// expired ones go, and if none has, all of them (a refusal forgotten only
/// costs the next submission its count).
const REFUSALS_MAX: usize = 10_000;

/// The waiting cap's recent refusals, per submitter, in this server
/// process. A refused submission holds the submitter's lock while it counts
/// (0.2 s at a million waiting), so a client that keeps submitting past its
/// cap, several requests at once, would keep as many pool connections
/// waiting on that lock, one count after another. Within
/// [`REFUSAL_MEMORY`] of a refusal, a submission that the last count also
/// refuses is refused at once, with no lock and no count; after it, the
/// database is asked again. Jobs that left the queue meanwhile make room
/// at most that much later.
pub struct CapRefusals {
    memory: Duration,
    by_submitter: Mutex<HashMap<String, (Instant, WaitingCapExceeded)>>,
}

impl Default for CapRefusals {
    fn default() -> Self {
        CapRefusals::remembering(REFUSAL_MEMORY)
    }
}

impl CapRefusals {
    /// Refusals kept for `memory` (the server keeps [`REFUSAL_MEMORY`]).
    pub fn remembering(memory: Duration) -> Self {
        CapRefusals {
            memory,
            by_submitter: Mutex::default(),
        }
    }

    /// The refusal of `adding` more jobs for `submitter` under `cap` that
    /// the last count, if recent, already says.
    fn recalled(&self, submitter: &str, adding: u64, cap: u64) -> Option<WaitingCapExceeded> {
        let map = self.map();
        let (at, over) = map.get(submitter)?;
        if at.elapsed() > self.memory || over.cap != cap {
            return None;
        }
        let waiting = match over.waiting {
            WaitingCount::Exactly(n) => n,
            WaitingCount::Over(n) => n.saturating_add(1),
        };
        (waiting.saturating_add(adding) > cap).then(|| WaitingCapExceeded {
            adding,
            ..over.clone()
        })
    }

    /// `over`, as counted at `counted_at`.
    fn remember(&self, over: &WaitingCapExceeded, counted_at: Instant) {
        let mut map = self.map();
        if map.len() >= REFUSALS_MAX && !map.contains_key(&over.submitter) {
            let memory = self.memory;
            map.retain(|_, (at, _)| at.elapsed() <= memory);
            if map.len() >= REFUSALS_MAX {
                map.clear();
            }
        }
        map.insert(over.submitter.clone(), (counted_at, over.clone()));
    }

    /// Forgets `submitter`'s refusal: it has just made room itself (a
    /// cancel through this server), so its next submission counts.
    pub fn forget(&self, submitter: &str) {
        self.map().remove(submitter);
    }

    /// The map, even if a thread panicked holding it (each entry is
    /// written whole, so what is there is sound).
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, WaitingCapExceeded)>> {
        self.by_submitter
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The waiting cap a submission is held to: at most `limit` jobs of one
/// submitter waiting, with the server's recent refusals.
#[derive(Clone, Copy)]
pub struct WaitingCap<'a> {
    pub limit: u64,
    pub refusals: &'a CapRefusals,
}

impl WaitingCap<'_> {
    /// The refusal of `adding` more jobs of `submitter` that this server's
    /// last count already gives, if it is recent ([`CapRefusals`]). A
    /// handler asks this before any database work, so a client that keeps
    /// submitting past its cap takes no pool connection while its refusal
    /// is remembered; [`within_waiting_cap`] asks again in the transaction.
    pub fn recalled(&self, submitter: &str, adding: u64) -> Result<(), WaitingCapExceeded> {
        match adding {
            0 => Ok(()),
            _ => self
                .refusals
                .recalled(submitter, adding, self.limit)
                .map_or(Ok(()), Err),
        }
    }
}

/// [`WaitingCap::recalled`] where there may be no cap.
pub fn recalled_refusal(
    cap: Option<WaitingCap<'_>>,
    submitter: &str,
    adding: u64,
) -> Result<(), WaitingCapExceeded> {
    cap.map_or(Ok(()), |cap| cap.recalled(submitter, adding))
}

/// Ok if `adding` more jobs of `submitter` keep it within `cap` waiting
/// (`None`: no cap), in `conn`'s transaction. A refusal recalled from the
/// last second answers first ([`CapRefusals`]). Otherwise it takes the
/// submitter's transaction lock, so that one submitter's capped
/// submissions go in one at a time: each sees the last one's jobs, and
/// their fair-share tags do not overlap. The tags' span answers at once
/// when the submitter is clearly under the cap; only near it are the jobs
/// counted.
pub async fn within_waiting_cap(
    conn: &mut sqlx::PgConnection,
    submitter: &str,
    adding: u64,
    cap: Option<WaitingCap<'_>>,
) -> Result<Result<(), WaitingCapExceeded>, sqlx::Error> {
    let Some(memory) = cap else {
        return Ok(Ok(()));
    };
    let (cap, refusals) = (memory.limit, memory.refusals);
    if adding == 0 {
        return Ok(Ok(()));
    }
    if let Err(over) = memory.recalled(submitter, adding) {
        return Ok(Err(over));
    }
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('flotilla-submitter:' || $1))")
        .bind(submitter)
        .execute(&mut *conn)
        .await?;
    // Asked again behind the lock: the submissions that waited on it while
    // another counted and refused take that answer instead of counting too.
    if let Err(over) = memory.recalled(submitter, adding) {
        return Ok(Err(over));
    }
    let span: i64 = sqlx::query_scalar(WAITING_SPAN_SQL)
        .bind(submitter)
        .fetch_one(&mut *conn)
        .await?;
    if (span.max(0) as u64).saturating_add(adding) <= cap {
        return Ok(Ok(()));
    }
    let upto = i64::try_from(cap.saturating_add(1)).unwrap_or(i64::MAX);
    let counted_at = Instant::now();
    let waiting: i64 = sqlx::query_scalar(WAITING_SQL)
        .bind(submitter)
        .bind(upto)
        .fetch_one(&mut *conn)
        .await?;
    let waiting = waiting.max(0) as u64;
    if waiting.saturating_add(adding) > cap {
        let over = WaitingCapExceeded {
            submitter: submitter.to_string(),
            waiting: if waiting > cap {
                WaitingCount::Over(cap)
            } else {
                WaitingCount::Exactly(waiting)
            },
            adding,
            cap,
        };
        refusals.remember(&over, counted_at);
        return Ok(Err(over));
    }
    Ok(Ok(()))
}

/// [`submit`] of one submitter's `jobs` if they keep it within `cap`
/// waiting jobs ([`within_waiting_cap`]).
pub async fn submit_within(
    db: &PgPool,
    jobs: &[NewJob],
    cap: Option<WaitingCap<'_>>,
) -> Result<Result<Vec<Uuid>, WaitingCapExceeded>, sqlx::Error> {
    let mut tx = db.begin().await?;
    if let Some(first) = jobs.first() {
        if let Err(over) =
            within_waiting_cap(&mut tx, &first.submitter, jobs.len() as u64, cap).await?
        {
            return Ok(Err(over));
        }
    }
    let ids = submit_in(&mut tx, jobs).await?;
    tx.commit().await?;
    Ok(Ok(ids))
}

/// [`submit`] inside the caller's transaction (the wake-up goes out when it
/// commits), for work that must appear together with other changes.
pub async fn submit_in(
    tx: &mut sqlx::PgConnection,
    jobs: &[NewJob],
) -> Result<Vec<Uuid>, sqlx::Error> {
    let mut ids = Vec::with_capacity(jobs.len());
    if jobs.is_empty() {
        return Ok(ids);
    }
    let mut by_submitter: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
    for (i, job) in jobs.iter().enumerate() {
        by_submitter.entry(&job.submitter).or_default().push(i);
    }
    let mut tags = vec![0i64; jobs.len()];
    for (submitter, idx) in by_submitter {
        let base: i64 = sqlx::query_scalar(SHARE_BASE_SQL)
            .bind(submitter)
            .fetch_one(&mut *tx)
            .await?;
        for (k, i) in idx.into_iter().enumerate() {
            tags[i] = base + k as i64;
        }
    }
    let classes = super::classes::class_ids(&mut *tx, jobs).await?;
    // Bulk insert through unnest: one round trip for any number of jobs.
    let mut id_col = Vec::with_capacity(jobs.len());
    let mut kind_col = Vec::with_capacity(jobs.len());
    let mut spec_col = Vec::with_capacity(jobs.len());
    let mut prio_col = Vec::with_capacity(jobs.len());
    let mut label_col = Vec::with_capacity(jobs.len());
    let mut cost_col = Vec::with_capacity(jobs.len());
    let mut sub_col = Vec::with_capacity(jobs.len());
    let mut max_col = Vec::with_capacity(jobs.len());
    let mut parent_col = Vec::with_capacity(jobs.len());
    let mut index_col = Vec::with_capacity(jobs.len());
    let mut owner_col = Vec::with_capacity(jobs.len());
    for job in jobs {
        // Time-ordered ids: the primary key and tile_jobs' job index grow at
        // their right edge instead of splitting random pages (1M random v4
        // keys cost 4 s more to index than ordered ones on a 2-core machine).
        let id = Uuid::now_v7();
        ids.push(id);
        id_col.push(id);
        kind_col.push(job.spec.kind().as_str());
        spec_col.push(serde_json::to_value(&job.spec).expect("JobSpec serialises to JSON"));
        prio_col.push(job.priority);
        label_col.push(serde_json::to_value(&job.labels).expect("labels serialise to JSON"));
        cost_col.push(job.cost as i32);
        sub_col.push(job.submitter.clone());
        max_col.push(job.max_attempts as i32);
        parent_col.push(job.parent_id);
        index_col.push(job.child_index);
        owner_col.push(job.owner);
    }
    sqlx::query(
        "INSERT INTO jobs (id, kind, spec, priority, labels, cost, submitter, share_seq,
                           max_attempts, parent_id, child_index, class_id, owner_token)
         SELECT * FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::int[], $5::jsonb[],
                              $6::int[], $7::text[], $8::bigint[], $9::int[], $10::uuid[],
                              $11::int[], $12::bigint[], $13::uuid[])",
    )
    .bind(&id_col)
    .bind(&kind_col)
    .bind(&spec_col)
    .bind(&prio_col)
    .bind(&label_col)
    .bind(&cost_col)
    .bind(&sub_col)
    .bind(&tags)
    .bind(&max_col)
    .bind(&parent_col)
    .bind(&index_col)
    .bind(&classes)
    .bind(&owner_col)
    .execute(&mut *tx)
    .await?;
    notify_jobs(&mut *tx).await?;
    Ok(ids)
}
