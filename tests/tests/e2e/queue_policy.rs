//! The claim's policy, against real PostgreSQL through the queue module
//! (no HTTP): priority, fair share between submitters, labels, capacity
//! and cost, kinds, back-off, the reaper's stale-lease guard, and that
//! work no agent can take neither slows the claim nor waits unexplained.

use std::collections::BTreeMap;
use std::time::Duration;

use flotilla_core::grid::TileId;
use flotilla_core::health::HostHealth;
use flotilla_core::job::{CommandJob, FailureClass, JobKind, JobSpec, JobState, TileJob};
use flotilla_core::protocol::{Complete, Register};
use flotilla_server::agents;
use flotilla_server::queue::{claim, classes, lease, read, reaper, submit};
use sqlx::PgPool;
use uuid::Uuid;

fn job(submitter: &str, priority: i32, labels: &[(&str, &str)], cost: u32) -> submit::NewJob {
    submit::NewJob {
        spec: JobSpec::Command(CommandJob {
            command: "true".into(),
            secret_env: Default::default(),
            env: BTreeMap::new(),
            workdir: None,
            timeout_s: None,
            outputs: vec![],
        }),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        priority,
        max_attempts: 2,
        cost,
        submitter: submitter.into(),
        parent_id: None,
        child_index: None,
        owner: None,
    }
}

async fn agent(db: &PgPool, name: &str, capacity: u32, labels: &[(&str, &str)]) -> Uuid {
    agents::register(
        db,
        &Register {
            name: name.into(),
            instance: Uuid::new_v4(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            capacity,
            kinds: vec![JobKind::Command],
            version: "t".into(),
            health: HostHealth::default(),
            devices: Default::default(),
        },
    )
    .await
    .unwrap()
    .0
}

const TTL: Duration = Duration::from_secs(60);

/// A plain success report for the lease `token`.
fn done(token: Uuid) -> Complete {
    Complete {
        lease_token: token,
        exit_code: Some(0),
        outputs: vec![],
        result: None,
        progress: None,
    }
}

async fn submitter_of(db: &PgPool, id: Uuid) -> String {
    sqlx::query_scalar("SELECT submitter FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_one(db)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_small_submitter_is_not_starved_by_a_big_one() {
    let db = flotilla_e2e::pg::migrated_database().await;
    let big: Vec<_> = (0..10_000).map(|_| job("big", 0, &[], 1)).collect();
    submit::submit(&db, &big).await.unwrap();
    let small: Vec<_> = (0..10).map(|_| job("small", 0, &[], 1)).collect();
    submit::submit(&db, &small).await.unwrap();
    let a = agent(&db, "worker", 1000, &[]).await;
    let mut small_done = 0;
    for n in 0..20 {
        let j = claim::claim(&db, a, TTL)
            .await
            .unwrap()
            .expect("work available");
        if submitter_of(&db, j.job_id).await == "small" {
            small_done += 1;
        }
        let _ = n;
    }
    assert_eq!(
        small_done, 10,
        "all of the small submitter's jobs ran within 20 claims"
    );
}

#[tokio::test]
async fn priority_first_then_labels_then_cost() {
    let db = flotilla_e2e::pg::migrated_database().await;
    let low = submit::submit(&db, &[job("s", 0, &[], 1)]).await.unwrap()[0];
    let high = submit::submit(&db, &[job("s", 10, &[], 1)]).await.unwrap()[0];
    let gpu = submit::submit(&db, &[job("s", 100, &[("gpu", "h100")], 1)])
        .await
        .unwrap()[0];
    let heavy = submit::submit(&db, &[job("s", 50, &[], 4)]).await.unwrap()[0];

    let cpu_agent = agent(&db, "cpu", 2, &[("os", "linux")]).await;
    // The gpu job needs a label cpu lacks; the heavy one does not fit in 2
    // slots; so priority order gives `high`, then `low`.
    assert_eq!(
        claim::claim(&db, cpu_agent, TTL)
            .await
            .unwrap()
            .unwrap()
            .job_id,
        high
    );
    assert_eq!(
        claim::claim(&db, cpu_agent, TTL)
            .await
            .unwrap()
            .unwrap()
            .job_id,
        low
    );
    assert!(
        claim::claim(&db, cpu_agent, TTL).await.unwrap().is_none(),
        "capacity 2 is full"
    );

    let gpu_agent = agent(&db, "gpu", 8, &[("gpu", "h100"), ("os", "linux")]).await;
    assert_eq!(
        claim::claim(&db, gpu_agent, TTL)
            .await
            .unwrap()
            .unwrap()
            .job_id,
        gpu
    );
    let j = claim::claim(&db, gpu_agent, TTL).await.unwrap().unwrap();
    assert_eq!((j.job_id, j.cost), (heavy, 4));
}

#[tokio::test]
async fn failed_attempts_back_off_and_stale_leases_are_refused() {
    let db = flotilla_e2e::pg::migrated_database().await;
    let id = submit::submit(&db, &[job("s", 0, &[], 1)]).await.unwrap()[0];
    let a = agent(&db, "a", 1, &[]).await;
    let first = claim::claim(&db, a, TTL).await.unwrap().unwrap();
    let key = |token| lease::LeaseKey {
        agent: a,
        job: id,
        token,
    };
    let ended = lease::fail(
        &db,
        key(first.lease_token),
        lease::Failure {
            class: FailureClass::Retryable,
            message: "exit 1",
            exit_code: Some(1),
        },
        (Duration::from_secs(3600), Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    assert_eq!(ended.state, JobState::Retrying);
    assert!(
        claim::claim(&db, a, TTL).await.unwrap().is_none(),
        "the back-off holds the job back"
    );
    sqlx::query("UPDATE jobs SET run_after = now() WHERE id = $1")
        .bind(id)
        .execute(&db)
        .await
        .unwrap();
    let second = claim::claim(&db, a, Duration::from_millis(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.attempt, 2);
    // The first attempt's lease can no longer complete the job.
    let err = lease::complete(&db, key(first.lease_token), &done(first.lease_token))
        .await
        .unwrap_err();
    assert!(matches!(err, lease::LeaseRefused::Stale { .. }), "{err}");
    // The second lease expires; it was the last attempt, so the job fails.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let reaped = reaper::reap_once(&db, (Duration::from_millis(1), Duration::from_millis(1)))
        .await
        .unwrap();
    assert_eq!(reaped, vec![(id, "failed".to_string())]);
    let err = lease::complete(&db, key(second.lease_token), &done(second.lease_token))
        .await
        .unwrap_err();
    assert!(matches!(err, lease::LeaseRefused::Stale { .. }), "{err}");
    let outcomes: Vec<String> =
        sqlx::query_scalar("SELECT outcome FROM job_attempts WHERE job_id = $1 ORDER BY attempt")
            .bind(id)
            .fetch_all(&db)
            .await
            .unwrap();
    assert_eq!(outcomes, ["failed", "lease_expired"]);
}

#[tokio::test]
async fn agents_only_get_kinds_they_run() {
    let db = flotilla_e2e::pg::migrated_database().await;
    submit::submit(&db, &[job("s", 0, &[], 1)]).await.unwrap();
    let a = agents::register(
        &db,
        &Register {
            name: "tiles-only".into(),
            instance: Uuid::new_v4(),
            labels: BTreeMap::new(),
            capacity: 4,
            kinds: vec![JobKind::Tile],
            version: "t".into(),
            health: HostHealth::default(),
            devices: Default::default(),
        },
    )
    .await
    .unwrap()
    .0;
    assert!(claim::claim(&db, a, TTL).await.unwrap().is_none());
}

/// Rows a statement's plan examined, from `EXPLAIN (ANALYZE, FORMAT JSON)`:
/// every node's output rows (times its loops) plus the rows its filters
/// removed. Run in a transaction that is rolled back, so a claim explained
/// leases nothing. Deterministic, unlike a time.
type Explain<'q> =
    sqlx::query::QueryScalar<'q, sqlx::Postgres, serde_json::Value, sqlx::postgres::PgArguments>;

async fn rows_examined(
    db: &PgPool,
    sql: &str,
    bind: impl for<'q> FnOnce(Explain<'q>) -> Explain<'q>,
) -> (f64, String) {
    let mut tx = db.begin().await.unwrap();
    let explain = format!("EXPLAIN (ANALYZE, FORMAT JSON) {sql}");
    let plan = bind(sqlx::query_scalar(&explain))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let rows = walk_rows(&plan[0]["Plan"]);
    (rows, serde_json::to_string_pretty(&plan).unwrap())
}

/// [`rows_examined`] of `sql` on its generic plan: prepared with parameter
/// `types`, planned for no values in particular (`plan_cache_mode =
/// force_generic_plan`), run with `args` (SQL literals).
async fn rows_examined_generic(db: &PgPool, sql: &str, types: &str, args: &str) -> (f64, String) {
    let mut tx = db.begin().await.unwrap();
    sqlx::raw_sql("SET LOCAL plan_cache_mode = force_generic_plan")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::raw_sql(&format!("PREPARE examined({types}) AS {sql}"))
        .execute(&mut *tx)
        .await
        .unwrap();
    let plan: serde_json::Value = sqlx::query_scalar(&format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE examined({args})"
    ))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    // A prepared statement outlives the transaction: gone before the
    // connection goes back to the pool.
    sqlx::raw_sql("DEALLOCATE examined")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    (
        walk_rows(&plan[0]["Plan"]),
        serde_json::to_string_pretty(&plan).unwrap(),
    )
}

/// Rows a plan node and those under it read: returned, and removed by a filter.
fn walk_rows(node: &serde_json::Value) -> f64 {
    let n = |k: &str| node[k].as_f64().unwrap_or(0.0);
    let own = n("Actual Rows") * n("Actual Loops").max(1.0)
        + n("Rows Removed by Filter")
        + n("Rows Removed by Join Filter")
        + n("Rows Removed by Index Recheck");
    own + node["Plans"]
        .as_array()
        .map_or(0.0, |plans| plans.iter().map(walk_rows).sum())
}

fn tile_job(priority: i32) -> submit::NewJob {
    submit::NewJob {
        spec: JobSpec::Tile(TileJob {
            dataset: "d".into(),
            year: 2024,
            tile: TileId::from_cell(0, 0).unwrap(),
            checkpoint_sha256: "0".repeat(64),
            fetch_command: None,
        }),
        ..job("evil", priority, &[], 1)
    }
}

/// H7: ready jobs the claiming agent cannot take cost its claim nothing.
/// 20,000 of them wait ahead at priority 1000 — labels nobody has, labels
/// only another agent has, a cost above every capacity, a kind nobody runs
/// — and the claim's plan examines a few dozen rows. Before job classes it
/// walked the ready index and filtered all 20,000 (the same count read
/// 20,000+ then).
#[tokio::test]
async fn the_claim_does_not_scan_ready_jobs_the_agent_cannot_take() {
    let db = flotilla_e2e::pg::migrated_database().await;
    let cpu = agent(&db, "cpu", 4, &[("os", "linux")]).await;
    agent(&db, "gpu", 4, &[("gpu", "h100")]).await;
    let mut ahead = Vec::new();
    for _ in 0..5_000 {
        ahead.push(job("evil", 1000, &[("nope", "1")], 1));
        ahead.push(job("evil", 1000, &[("gpu", "h100")], 1));
        ahead.push(job("evil", 1000, &[], 64));
        ahead.push(tile_job(1000));
    }
    submit::submit(&db, &ahead).await.unwrap();
    let good = submit::submit(&db, &[job("good", 0, &[], 1), job("good", 0, &[], 1)])
        .await
        .unwrap();

    let (rows, plan) = rows_examined(&db, claim::CLAIM_SQL, |q| {
        q.bind(cpu)
            .bind(Uuid::new_v4())
            .bind(60_000i64)
            .bind(None::<Uuid>)
            .bind(None::<Uuid>)
    })
    .await;
    assert!(
        rows < 100.0,
        "the claim examined {rows} rows with 20,000 untakeable jobs ahead:\n{plan}"
    );
    let j = claim::claim(&db, cpu, TTL).await.unwrap().unwrap();
    assert_eq!(j.job_id, good[0]);
}

/// The fair-share base read at every submission, and the waiting cap's
/// span and count, are the first entries of indexes, not a scan of the
/// ready backlog (20,000 jobs of another submitter here; before, the
/// smallest ready tag was a `min()` over all of them), on the plan a
/// parameterised query gets and on the generic plan a prepared statement
/// runs on after its fifth execution. The generic plan of `submitter =
/// $1` walked `jobs_ready_share` filtering on the submitter: a small
/// submitter whose tags lie below a big one's backlog paid a scan of it
/// (145 ms a submission at 100,000; `cargo bench --bench submit_cap`).
#[tokio::test]
async fn the_fair_share_base_does_not_scan_the_backlog() {
    let db = flotilla_e2e::pg::migrated_database().await;
    // The small submitter's one tag is the lowest; the big backlog's run
    // from it to 20,000 (a scan from the top meets all of them first).
    submit::submit(&db, &[job("small", 0, &[], 1)])
        .await
        .unwrap();
    let backlog: Vec<_> = (0..20_000).map(|_| job("big", 0, &[], 1)).collect();
    submit::submit(&db, &backlog).await.unwrap();
    sqlx::query("ANALYZE jobs").execute(&db).await.unwrap();
    let queries = [
        (
            "the fair-share base",
            submit::SHARE_BASE_SQL,
            "text",
            "'small'",
        ),
        (
            "the waiting span",
            submit::WAITING_SPAN_SQL,
            "text",
            "'small'",
        ),
        (
            "the waiting count",
            submit::WAITING_SQL,
            "text, bigint",
            "'small', 1000001",
        ),
    ];
    for (what, sql, types, args) in queries {
        let (rows, plan) = if types == "text" {
            rows_examined(&db, sql, |q| q.bind("small")).await
        } else {
            rows_examined(&db, sql, |q| q.bind("small").bind(1_000_001i64)).await
        };
        assert!(
            rows < 100.0,
            "{what} examined {rows} rows over a 20,000-job backlog:\n{plan}"
        );
        let (rows, plan) = rows_examined_generic(&db, sql, types, args).await;
        assert!(
            rows < 100.0,
            "{what} on a generic plan examined {rows} rows over a 20,000-job backlog:\n{plan}"
        );
    }
    // And they still say what they said: small's one job, its tag the lowest.
    let span: i64 = sqlx::query_scalar(submit::WAITING_SPAN_SQL)
        .bind("small")
        .fetch_one(&db)
        .await
        .unwrap();
    let count: i64 = sqlx::query_scalar(submit::WAITING_SQL)
        .bind("big")
        .bind(1_000_001i64)
        .fetch_one(&db)
        .await
        .unwrap();
    let base: i64 = sqlx::query_scalar(submit::SHARE_BASE_SQL)
        .bind("small")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!((span, count, base), (1, 20_000, 1));
}

/// H7: a refusal of the waiting cap is remembered for a moment, so a
/// client that keeps submitting past its cap is answered without the
/// submitter's lock or a count each time; another submitter is not
/// affected, and once the memory has passed the database is asked again.
#[tokio::test]
async fn a_refusal_of_the_waiting_cap_is_remembered_for_a_moment() {
    use submit::{CapRefusals, WaitingCap, WaitingCount};
    let db = flotilla_e2e::pg::migrated_database().await;
    // Long enough that nothing here outlives it.
    let memory = CapRefusals::remembering(Duration::from_secs(3600));
    let cap = Some(WaitingCap {
        limit: 3,
        refusals: &memory,
    });
    let one = |who: &str| vec![job(who, 0, &[], 1)];
    for _ in 0..3 {
        submit::submit_within(&db, &one("m"), cap)
            .await
            .unwrap()
            .unwrap();
    }
    let over = submit::submit_within(&db, &one("m"), cap)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(over.waiting, WaitingCount::Exactly(3));
    // Room made in the database: the memory still refuses, saying what the
    // count said, and adds no job.
    sqlx::query("DELETE FROM jobs WHERE submitter = 'm'")
        .execute(&db)
        .await
        .unwrap();
    let recalled = submit::submit_within(&db, &one("m"), cap)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(
        (recalled.waiting, recalled.adding),
        (WaitingCount::Exactly(3), 1)
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(left, 0);
    // Another submitter, and the same one under another cap, ask the database.
    submit::submit_within(&db, &one("n"), cap)
        .await
        .unwrap()
        .unwrap();
    // (A cap the remembered count would also refuse: only the cap's
    // difference sends it to the database.)
    let wider = Some(WaitingCap {
        limit: 2,
        refusals: &memory,
    });
    submit::submit_within(&db, &one("m"), wider)
        .await
        .unwrap()
        .unwrap();
    // m has 1 job waiting now, room under 3, but the memory at cap 3
    // still refuses; forgotten (its submitter cancelled through this
    // server), the database is asked again.
    assert!(submit::submit_within(&db, &one("m"), cap)
        .await
        .unwrap()
        .is_err());
    memory.forget("m");
    submit::submit_within(&db, &one("m"), cap)
        .await
        .unwrap()
        .unwrap();
    // A memory that has passed: the database again, which has room.
    let passed = CapRefusals::remembering(Duration::ZERO);
    let cap0 = Some(WaitingCap {
        limit: 3,
        refusals: &passed,
    });
    for _ in 0..2 {
        submit::submit_within(&db, &one("p"), cap0)
            .await
            .unwrap()
            .unwrap();
    }
    assert!(submit::submit_within(&db, &one("p"), cap0)
        .await
        .unwrap()
        .is_ok());
    assert!(submit::submit_within(&db, &one("p"), cap0)
        .await
        .unwrap()
        .is_err());
    sqlx::query("DELETE FROM jobs WHERE submitter = 'p'")
        .execute(&db)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    submit::submit_within(&db, &one("p"), cap0)
        .await
        .unwrap()
        .unwrap();
}

/// Jobs that no registered agent could take say why in their view (a fleet
/// with no agents yet takes work; the API refuses such submissions once
/// agents exist), and stop saying it, and get claimed, once an agent that
/// can take them registers.
#[tokio::test]
async fn unmatchable_jobs_are_flagged_until_an_agent_can_take_them() {
    let db = flotilla_e2e::pg::migrated_database().await;
    let gpu_job = submit::submit(&db, &[job("s", 0, &[("gpu", "h100")], 1)])
        .await
        .unwrap()[0];
    let heavy = submit::submit(&db, &[job("s", 0, &[], 8)]).await.unwrap()[0];
    let tile = submit::submit(&db, &[tile_job(0)]).await.unwrap()[0];
    let why = |id| {
        let db = db.clone();
        async move { read::get(&db, id).await.unwrap().unwrap().unmatchable }
    };
    assert_eq!(
        why(gpu_job).await.as_deref(),
        Some("no agent has registered yet")
    );

    let cpu = agent(&db, "cpu", 4, &[("os", "linux")]).await;
    let said = why(gpu_job).await.unwrap();
    assert!(
        said.contains(r#"carries the labels {"gpu": "h100"}"#),
        "{said}"
    );
    let said = why(heavy).await.unwrap();
    assert!(
        said.contains("cost 8") && said.contains("largest is 4"),
        "{said}"
    );
    let said = why(tile).await.unwrap();
    assert!(said.contains("runs tile jobs"), "{said}");
    assert!(claim::claim(&db, cpu, TTL).await.unwrap().is_none());
    let refused = classes::refusal(&db, &job("s", 0, &[("gpu", "h100")], 1))
        .await
        .unwrap()
        .expect("refused once agents exist");
    assert_eq!(refused.field, "labels");

    let gpu = agent(&db, "gpu", 8, &[("gpu", "h100")]).await;
    assert_eq!(why(gpu_job).await, None);
    assert_eq!(why(heavy).await, None);
    assert!(why(tile).await.is_some(), "still no agent runs tile jobs");
    assert!(classes::refusal(&db, &job("s", 0, &[("gpu", "h100")], 1))
        .await
        .unwrap()
        .is_none());
    let first = claim::claim(&db, gpu, TTL).await.unwrap().unwrap();
    let second = claim::claim(&db, gpu, TTL).await.unwrap();
    assert_eq!(first.job_id, gpu_job);
    assert!(second.is_none(), "8 slots: one used, the heavy job needs 8");
}

/// A lease request retried after its answer was lost (reliability review
/// L6): the same request id gets the same lease again, its expiry renewed,
/// instead of a second job; another agent's or a new request's does not;
/// once the job started it is the agent's, and the request is over.
#[tokio::test]
async fn a_retried_lease_request_gets_its_lease_again() {
    let db = flotilla_e2e::pg::migrated_database().await;
    let a = agent(&db, "a", 4, &[]).await;
    let b = agent(&db, "b", 4, &[]).await;
    let jobs = submit::submit(&db, &[job("s", 0, &[], 1), job("s", 0, &[], 1)])
        .await
        .unwrap();
    let request = Uuid::new_v4();
    let first = claim::claim_for(&db, a, TTL, Some(request), None)
        .await
        .unwrap()
        .expect("a job for the first try");
    assert_eq!(first.job_id, jobs[0]);
    let again = claim::already_leased(&db, a, request, TTL)
        .await
        .unwrap()
        .expect("the retry finds the lease");
    assert_eq!(
        (again.job_id, again.lease_token, again.attempt),
        (first.job_id, first.lease_token, first.attempt)
    );
    assert!(claim::already_leased(&db, b, request, TTL)
        .await
        .unwrap()
        .is_none());
    assert!(claim::already_leased(&db, a, Uuid::new_v4(), TTL)
        .await
        .unwrap()
        .is_none());
    let other = claim::claim_for(&db, a, TTL, Some(Uuid::new_v4()), None)
        .await
        .unwrap()
        .expect("a new request leases the next job");
    assert_eq!(other.job_id, jobs[1]);
    lease::start(
        &db,
        lease::LeaseKey {
            agent: a,
            job: first.job_id,
            token: first.lease_token,
        },
    )
    .await
    .unwrap();
    assert!(
        claim::already_leased(&db, a, request, TTL)
            .await
            .unwrap()
            .is_none(),
        "a started job is not answered again"
    );
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM job_attempts")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(attempts, 2, "one attempt per job, none burnt by the retry");
}

/// A lease request that waits (up to 30 s) checks its token at every try:
/// once the token is revoked, no job is leased to it, while a job ready
/// meanwhile still goes to an agent whose token stands (review L1: the
/// long poll handed a job to a token revoked while it waited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_leases_nothing() {
    use flotilla_core::api::tokens::TokenRole;
    use flotilla_server::auth::tokens;
    let db = flotilla_e2e::pg::migrated_database().await;
    let a = agent(&db, "a", 4, &[]).await;
    tokens::ensure_token(
        &db,
        "flt_test_agent_a",
        TokenRole::Agent,
        Some("a"),
        "a's token",
    )
    .await
    .unwrap();
    let token: Uuid = sqlx::query_scalar("SELECT id FROM api_tokens WHERE agent_name = 'a'")
        .fetch_one(&db)
        .await
        .unwrap();
    let jobs = submit::submit(&db, &[job("s", 0, &[], 1), job("s", 0, &[], 1)])
        .await
        .unwrap();
    let first = claim::claim_for(&db, a, TTL, None, Some(token))
        .await
        .unwrap()
        .expect("a standing token leases");
    assert_eq!(first.job_id, jobs[0]);
    tokens::revoke_token(&db, token)
        .await
        .unwrap()
        .expect("the token exists");
    assert!(
        claim::claim_for(&db, a, TTL, None, Some(token))
            .await
            .unwrap()
            .is_none(),
        "a revoked token leased a job"
    );
    // The job is still there for whoever may take it.
    let other = claim::claim_for(&db, a, TTL, None, None)
        .await
        .unwrap()
        .expect("the job stayed ready");
    assert_eq!(other.job_id, jobs[1]);
}
