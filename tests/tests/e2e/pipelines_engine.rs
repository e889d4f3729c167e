//! The pipeline engine driven pass by pass, with no server and no agent:
//! the test ends the run's queued jobs itself between passes, as agents
//! would, some well and some not. A pass reads waiting items a page per
//! entry point at a time and stops reading an entry point at its first
//! item without room; it must move items exactly as a pass that tries
//! every waiting item ([`Reading::Every`]), pass after pass.

use std::collections::BTreeMap;

use flotilla_e2e::pipelines::seq;
use flotilla_server::coordinator::Parents;
use flotilla_server::pipelines;
use flotilla_server::pipelines::engine::{advance_reading, Reading};
use sqlx::PgPool;
use uuid::Uuid;

/// Every kind of entry point a pass reads: the start; inside a `limit`
/// between two stages (items waiting there hold the gate, and are read
/// apart from the others); after the limit into an `either` whose first
/// branch starts with a move (items waiting after it count against the
/// branch) and whose second is an `either` itself; and after it into a
/// last stage. 100 items: the start's first page of 64 fills.
const SOURCE: &str = "host a = agent pa
host b = agent pb
items on a: seq 1 100
stage s1 on a jobs 3 out /tmp/engine/s1/{id}: true
limit 2 {
    stage s2 on a jobs 2 out /tmp/engine/s2/{id}: true
    stage s3 on a jobs 1: true
}
either {
    move mx to b:/tmp/engine/x/{id}
    stage sx on b jobs 1: true
|
    either {
        stage sy on a jobs 1: true
    |
        stage sz on a jobs 1: true
    }
}
stage s5 on a jobs 4: true
";

const ITEMS: usize = 100;

/// Each stage's `jobs`.
const JOBS: [(&str, i64); 7] = [
    ("s1", 3),
    ("s2", 2),
    ("s3", 1),
    ("sx", 1),
    ("sy", 1),
    ("sz", 1),
    ("s5", 4),
];

/// Steps by index, as the plan numbers them (file order).
const S2: i32 = 1;
const MX: i32 = 3;

/// A run of `source`, listed with `items`.
async fn listed(db: &PgPool, name: &str, source: &str, items: &[String]) -> Uuid {
    flotilla_e2e::pipelines::listed_run(db, name, source.to_string(), "engine-test", items).await
}

async fn listed_run(db: &PgPool) -> Uuid {
    listed(db, "engine.pipeline", SOURCE, &seq(ITEMS)).await
}

/// Ends some of the run's queued jobs, as agents would: in pass `pass`,
/// those of items whose index + pass is not a multiple of 3, and an `s2`
/// job of an even item only every fourth pass (so items reach the either
/// out of list order), an `s3` job only every fifth pass (so items wait
/// for it inside the limit), an `sx` job every fourth and an `sy` job
/// every seventh (so items find the either's first branches full and take
/// the last); an `s2` job of every 13th item fails. Each ended job stores a sent tar, which a
/// move's send needs and the other steps ignore.
async fn end_some(db: &PgPool, run: Uuid, pass: i32) {
    sqlx::query(
        "UPDATE jobs j SET finished_at = now(),
             state = CASE WHEN j.spec->>'step' = 's2' AND i.idx % 13 = 5 THEN 'failed' ELSE 'succeeded' END,
             error = CASE WHEN j.spec->>'step' = 's2' AND i.idx % 13 = 5 THEN 'it broke' END
         FROM pipeline_items i
         WHERE i.run_id = $1 AND i.job_id = j.id AND j.state = 'queued' AND (i.idx + $2) % 3 <> 0
           AND NOT (j.spec->>'step' = 's2' AND i.idx % 2 = 0 AND $2 % 4 <> 0)
           AND NOT (j.spec->>'step' = 'sy' AND $2 % 7 <> 0)
           AND NOT (j.spec->>'step' = 'sx' AND $2 % 4 <> 0)
           AND NOT (j.spec->>'step' = 's3' AND $2 % 5 <> 0)",
    )
    .bind(run)
    .bind(pass)
    .execute(db)
    .await
    .expect("ending jobs");
    store_sent_tars(db, run).await;
}

/// Each ended job of the run stores a sent tar, which a move's send needs
/// and the other steps ignore.
async fn store_sent_tars(db: &PgPool, run: Uuid) {
    sqlx::query(
        "INSERT INTO job_outputs (job_id, attempt, name, key, size, sha256)
         SELECT id, attempt, 'move.tar', 'k/' || id, 10, 'ab' FROM jobs
         WHERE parent_id = $1 AND state = 'succeeded'
         ON CONFLICT DO NOTHING",
    )
    .bind(run)
    .execute(db)
    .await
    .expect("storing sent tars");
}

/// Outputs of an earlier run of the file looked for: none.
async fn end_probes(db: &PgPool, run: Uuid) {
    sqlx::query(
        "UPDATE jobs SET state = 'succeeded', finished_at = now(), result = '{\"exist\": []}'
         WHERE id = ANY (SELECT unnest(probe_jobs) FROM pipeline_runs WHERE id = $1)",
    )
    .bind(run)
    .execute(db)
    .await
    .expect("ending the probes");
}

/// Where each item is after a pass: (index, state, step it is in, step it
/// finished, phase).
type Snapshot = Vec<(i32, String, Option<i32>, Option<i32>, i16)>;

async fn snapshot(db: &PgPool, run: Uuid) -> Snapshot {
    sqlx::query_as(
        "SELECT idx, state, node, at, phase FROM pipeline_items WHERE run_id = $1 ORDER BY idx",
    )
    .bind(run)
    .fetch_all(db)
    .await
    .expect("reading the items")
}

/// Never more items in a step than its `jobs`, nor inside the limit than 2.
async fn assert_room_kept(db: &PgPool, run: Uuid, pass: usize) {
    let busy: Vec<(String, i64)> = sqlx::query_as(
        "SELECT j.spec->>'step', count(*) FROM pipeline_items i JOIN jobs j ON j.id = i.job_id
         WHERE i.run_id = $1 AND i.state = 'active' GROUP BY 1",
    )
    .bind(run)
    .fetch_all(db)
    .await
    .expect("counting busy steps");
    let busy: BTreeMap<String, i64> = busy.into_iter().collect();
    for (step, jobs) in JOBS {
        let n = busy.get(step).copied().unwrap_or(0);
        assert!(
            n <= jobs,
            "pass {pass}: {n} items in {step}, which has jobs {jobs}"
        );
    }
    let inside: i64 = sqlx::query_scalar("SELECT count(*) FROM pipeline_gates WHERE run_id = $1")
        .bind(run)
        .fetch_one(db)
        .await
        .expect("counting the gate");
    assert!(inside <= 2, "pass {pass}: {inside} items inside `limit 2`");
    // The either's first branch has room for one item from its move to the
    // end of its stage, waiting after the move included.
    let branch: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pipeline_items i LEFT JOIN jobs j ON j.id = i.job_id
         WHERE i.run_id = $1
           AND ((i.state = 'active' AND j.spec->>'step' IN ('mx', 'sx'))
                OR (i.state = 'waiting' AND i.at = $2))",
    )
    .bind(run)
    .bind(MX)
    .fetch_one(db)
    .await
    .expect("counting the branch");
    assert!(
        branch <= 1,
        "pass {pass}: {branch} items in the branch of mx and sx"
    );
}

/// The pass after which item `50` (index 49) is cancelled, wherever it is.
const CANCEL_AT: usize = 40;

/// More than a run of [`ITEMS`] items takes here.
const PASSES: usize = 2_000;

/// The totals the tables' triggers keep are what counting every item and
/// cell says: items by state, cells by (step, state) with how many have
/// an end and their mean seconds.
async fn assert_totals_kept(db: &PgPool, run: Uuid, pass: usize) {
    type Items = Vec<(String, i64)>;
    let kept: Items = sqlx::query_as(
        "SELECT state, n FROM pipeline_item_totals WHERE run_id = $1 AND n <> 0 ORDER BY state",
    )
    .bind(run)
    .fetch_all(db)
    .await
    .expect("reading item totals");
    let counted: Items = sqlx::query_as(
        "SELECT state, count(*) FROM pipeline_items WHERE run_id = $1 GROUP BY state ORDER BY state",
    )
    .bind(run)
    .fetch_all(db)
    .await
    .expect("counting items");
    assert_eq!(kept, counted, "pass {pass}: items by state");
    type Cells = Vec<(i32, String, i64, i64, f64)>;
    let kept: Cells = sqlx::query_as(
        "SELECT node, state, n, timed, CASE WHEN timed > 0 THEN seconds / timed ELSE 0 END
         FROM pipeline_step_totals WHERE run_id = $1 AND n <> 0 ORDER BY node, state",
    )
    .bind(run)
    .fetch_all(db)
    .await
    .expect("reading cell totals");
    let counted: Cells = sqlx::query_as(
        "SELECT node, state, count(*), count(finished_at),
                COALESCE(avg(EXTRACT(EPOCH FROM finished_at - started_at))::float8, 0)
         FROM pipeline_steps WHERE run_id = $1 GROUP BY node, state ORDER BY node, state",
    )
    .bind(run)
    .fetch_all(db)
    .await
    .expect("counting cells");
    assert_eq!(
        kept.len(),
        counted.len(),
        "pass {pass}: {kept:?} against {counted:?}"
    );
    for (k, c) in kept.iter().zip(&counted) {
        assert_eq!((k.0, &k.1, k.2, k.3), (c.0, &c.1, c.2, c.3), "pass {pass}");
        assert!(
            (k.4 - c.4).abs() < 1e-6,
            "pass {pass}: mean {} against {}",
            k.4,
            c.4
        );
    }
}

/// Every pass's snapshot until the run ends, and how it ended.
async fn history(reading: Reading) -> (Vec<Snapshot>, String, Option<String>) {
    let db = flotilla_e2e::pg::migrated_database().await;
    let run = listed_run(&db).await;
    let mut passes = Vec::new();
    for pass in 0..PASSES {
        advance_reading(&db, &Parents::All, reading)
            .await
            .expect("a pass");
        assert_room_kept(&db, run, pass).await;
        if reading == Reading::Every {
            // The same statements run whatever the reading: once is enough.
            assert_totals_kept(&db, run, pass).await;
        }
        passes.push(snapshot(&db, run).await);
        let (state, error): (String, Option<String>) =
            sqlx::query_as("SELECT state, error FROM pipeline_runs WHERE id = $1")
                .bind(run)
                .fetch_one(&db)
                .await
                .expect("reading the run");
        if state == "probing" {
            end_probes(&db, run).await;
            continue;
        }
        if state != "running" {
            db.close().await;
            return (passes, state, error);
        }
        end_some(&db, run, pass as i32).await;
        if pass == CANCEL_AT {
            pipelines::cancel_item(&db, run, "50")
                .await
                .expect("cancelling item 50");
        }
    }
    panic!("{reading:?}: the run had not ended after {PASSES} passes");
}

#[tokio::test]
async fn a_paged_pass_moves_items_as_one_that_reads_them_all() {
    let (every, state, error) = history(Reading::Every).await;
    // The run went through every step: 8 of its 100 items failed in s2
    // (every 13th, from the 6th), and one was cancelled.
    assert_eq!(state, "failed");
    assert_eq!(
        error.as_deref(),
        Some("8 of 100 items failed and 1 were cancelled")
    );
    let last = every.last().expect("a pass");
    let done = last.iter().filter(|r| r.1 == "done").count();
    assert_eq!(done, 91, "{last:?}");
    assert_eq!(last[49].1, "cancelled", "{:?}", last[49]);
    // Items were in every step, and waited inside the limit holding it.
    let took: BTreeMap<Option<i32>, usize> =
        every.iter().flatten().fold(BTreeMap::new(), |mut m, r| {
            if r.1 == "active" {
                *m.entry(r.2).or_default() += 1;
            }
            m
        });
    assert_eq!(took.len(), 8, "steps items were seen in: {took:?}");
    let holding = every
        .iter()
        .filter(|pass| pass.iter().any(|r| r.1 == "waiting" && r.3 == Some(S2)))
        .count();
    assert!(holding > 0, "no item ever waited inside the limit");
    for page in [1, 2, 5, 64] {
        let (paged, paged_state, _) = history(Reading::Paged(page)).await;
        assert_eq!(paged_state, state, "Paged({page})");
        for (pass, (a, b)) in every.iter().zip(&paged).enumerate() {
            let differ: Vec<_> = a.iter().zip(b).filter(|(x, y)| x != y).collect();
            assert!(
                differ.is_empty(),
                "Paged({page}) differs from Every after pass {pass}, (every, paged): {differ:?}"
            );
        }
        assert_eq!(paged.len(), every.len(), "Paged({page}): passes to the end");
    }
}

/// An item waiting after a step the file does not have (a database edited
/// by hand, a stored file changed) fails its run, naming the step, rather
/// than waiting unread for ever. The totals of the run's items and cells
/// are kept as it ends, and as it is deleted.
#[tokio::test]
async fn an_item_after_a_step_the_file_lacks_fails_its_run() {
    let db = flotilla_e2e::pg::migrated_database().await;
    let run = listed_run(&db).await;
    advance_reading(&db, &Parents::All, Reading::Every)
        .await
        .expect("the listing pass");
    end_probes(&db, run).await;
    advance_reading(&db, &Parents::All, Reading::Every)
        .await
        .expect("the probes' pass");
    let moved = sqlx::query(
        "UPDATE pipeline_items SET at = 99 WHERE run_id = $1 AND idx = 70 AND state = 'waiting'",
    )
    .bind(run)
    .execute(&db)
    .await
    .expect("moving an item")
    .rows_affected();
    assert_eq!(moved, 1, "item 70 waits at the start");
    advance_reading(&db, &Parents::These(vec![run]), Reading::Paged(64))
        .await
        .expect("a pass");
    let (state, error): (String, Option<String>) =
        sqlx::query_as("SELECT state, error FROM pipeline_runs WHERE id = $1")
            .bind(run)
            .fetch_one(&db)
            .await
            .expect("reading the run");
    assert_eq!(state, "failed");
    assert!(
        error
            .as_deref()
            .is_some_and(|e| e.contains("finished step 99, which the pipeline does not have")),
        "{error:?}"
    );
    // Ended by `end_run`, every item and cell at once: totals still kept.
    assert_totals_kept(&db, run, 3).await;
    // A run deleted by hand takes its totals to nothing.
    sqlx::query("DELETE FROM pipeline_runs WHERE id = $1")
        .bind(run)
        .execute(&db)
        .await
        .expect("deleting the run");
    assert_totals_kept(&db, run, 4).await;
    db.close().await;
}

/// An item waiting after the move that opens an either's branch counts
/// against the branch's room: an item earlier in the list, reaching the
/// either in the same pass, goes to the next branch, not into the move
/// (where it would make two items in a branch of `jobs 1`).
#[tokio::test]
async fn an_item_waiting_inside_a_branch_keeps_its_room() {
    const THREE: &str = "host a = agent pa
host b = agent pb
items on a: seq 1 3
stage s1 on a jobs 3 out /tmp/lead/s1/{id}: true
either {
    move mx to b:/tmp/lead/x/{id}
    stage sx on b jobs 1: true
|
    stage sy on a jobs 1: true
}
";
    let (s1, mx, sx, sy) = (0, 1, 2, 3);
    let db = flotilla_e2e::pg::migrated_database().await;
    let run = listed(&db, "lead.pipeline", THREE, &seq(3)).await;
    let pass = || advance_reading(&db, &Parents::All, Reading::Paged(64));
    pass().await.expect("the listing pass");
    end_probes(&db, run).await;
    pass().await.expect("the probes' pass");
    // Ends the queued job of item `idx` (a sent tar stored with it).
    let end = |idx: i32| {
        let db = db.clone();
        async move {
            let ended = sqlx::query(
                "UPDATE jobs j SET state = 'succeeded', finished_at = now()
                 FROM pipeline_items i
                 WHERE i.run_id = $1 AND i.idx = $2 AND i.job_id = j.id AND j.state = 'queued'",
            )
            .bind(run)
            .bind(idx)
            .execute(&db)
            .await
            .expect("ending a job")
            .rows_affected();
            assert_eq!(ended, 1, "item {idx} had a queued job");
            store_sent_tars(&db, run).await;
        }
    };
    let at = |snap: &Snapshot, idx: usize| (snap[idx].1.clone(), snap[idx].2, snap[idx].4);
    let snap = snapshot(&db, run).await;
    assert!(
        (0..3).all(|i| at(&snap, i) == ("active".into(), Some(s1), 0)),
        "{snap:?}"
    );
    // The third item goes first: through s1, into the move's send,
    // receive and remove.
    end(2).await;
    pass().await.expect("a pass");
    assert_eq!(
        at(&snapshot(&db, run).await, 2),
        ("active".into(), Some(mx), 0)
    );
    for phase in [1, 2] {
        end(2).await;
        pass().await.expect("a pass");
        assert_eq!(
            at(&snapshot(&db, run).await, 2),
            ("active".into(), Some(mx), phase)
        );
    }
    // Its move ends as the first item's s1 does: in that pass the first
    // item, earlier in the list, finds the branch taken by the third
    // (waiting after its move) and takes the other branch.
    end(2).await;
    end(0).await;
    pass().await.expect("a pass");
    let snap = snapshot(&db, run).await;
    assert_eq!(at(&snap, 0), ("active".into(), Some(sy), 0), "{snap:?}");
    assert_eq!(at(&snap, 2), ("active".into(), Some(sx), 0), "{snap:?}");
    db.close().await;
}
