//! One engine pass against how many items wait: the same pipeline run
//! with few items (the peer) and with many, each advanced by
//! `pipelines::engine::advance` against its own database of the shared
//! cluster, with no server and no agent: between passes the bench ends
//! the run's queued step jobs itself (`succeeded`, in SQL), as agents
//! would, so every pass has items to move on and room to fill.
//!
//! The pipeline: `items: seq`, a stage of `jobs 4`, a `limit 2` around a
//! second stage, and an `either` of two stages of `jobs 2`. At the front
//! of a run almost every item waits for the first stage, which is what a
//! pass must not pay for: it prints the median and p90 of the first
//! PASS_COUNT passes for each size, and their ratio (large / small).
//!
//! After each size's passes, the run's view (`pipelines::read::get`, a
//! page of 100 rows, what its live page and `flotilla pipeline run --wait`
//! read) with every item through five steps: its median over 20 reads.
//!
//! Then what a completion's pass costs beside other open runs: PASS_RUNS
//! runs of 500 items, one of them busy, the others with their first
//! stage full and nothing ended; the busy run advanced by a pass of every
//! open run (`Parents::All`, as every completion's pass was before) and by
//! a pass of its own (`Parents::These`, as a completion's pass is now).
//!
//! `cargo test -p flotilla-e2e --bench pipeline_pass` (the test profile),
//! or `cargo bench -p flotilla-e2e --bench pipeline_pass` (release).
//! Env: PASS_ITEMS_SMALL (default 500), PASS_ITEMS_LARGE (default 50,000),
//! PASS_COUNT (default 200), PASS_RUNS (default 50).

use std::time::{Duration, Instant};

use flotilla_e2e::pipelines::seq;
use flotilla_server::coordinator::Parents;
use flotilla_server::pipelines::{self, engine};
use sqlx::PgPool;
use uuid::Uuid;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn source(items: usize) -> String {
    format!(
        "host a = agent pa
items on a: seq 1 {items}
stage s1 on a jobs 4: true
limit 2 {{
    stage s2 on a jobs 4: true
}}
either {{
    stage s3 on a jobs 2: true
|
    stage s4 on a jobs 2: true
}}
"
    )
}

/// A run of `items` items, listed: its listing job ended as an agent's
/// would have.
async fn listed_run(db: &PgPool, items: usize) -> Uuid {
    listed_run_named(db, items, &format!("pass-{items}.pipeline")).await
}

async fn listed_run_named(db: &PgPool, items: usize, name: &str) -> Uuid {
    // One open run per file: each run a file of its own.
    let source = format!("# {name}\n{}", source(items));
    flotilla_e2e::pipelines::listed_run(db, name, source, "bench", &seq(items)).await
}

/// Every queued job of the run ends well, as its agent would report.
async fn end_step_jobs(db: &PgPool, run: Uuid) -> u64 {
    sqlx::query(
        "UPDATE jobs SET state = 'succeeded', started_at = now(), finished_at = now()
         WHERE parent_id = $1 AND state = 'queued'",
    )
    .bind(run)
    .execute(db)
    .await
    .expect("ending step jobs")
    .rows_affected()
}

struct Passes {
    items: usize,
    times: Vec<Duration>,
    jobs: u64,
    /// The median read of the run's view, every item through every step.
    read: Duration,
}

async fn passes(items: usize, count: usize) -> Passes {
    let db = flotilla_e2e::pg::migrated_database().await;
    let run = listed_run(&db, items).await;
    // The first pass records the items; it is not one of those timed.
    engine::advance(&db, &Parents::All)
        .await
        .expect("the listing pass");
    let mut times = Vec::with_capacity(count);
    let mut jobs = 0;
    for _ in 0..count {
        jobs += end_step_jobs(&db, run).await;
        let t = Instant::now();
        engine::advance(&db, &Parents::All).await.expect("a pass");
        times.push(t.elapsed());
    }
    // The run's view, as its live page and `--wait` read it, with every
    // item through all five steps (cells written as the engine would,
    // so its totals are kept).
    sqlx::query(
        "INSERT INTO pipeline_steps (run_id, idx, node, state, started_at, finished_at)
         SELECT $1, i.idx, n, 'succeeded', now() - interval '2 s', now()
         FROM pipeline_items i, generate_series(0, 4) n WHERE i.run_id = $1
         ON CONFLICT DO NOTHING",
    )
    .bind(run)
    .execute(&db)
    .await
    .expect("filling the cells");
    sqlx::query("ANALYZE")
        .execute(&db)
        .await
        .expect("analysing");
    let mut reads = Vec::with_capacity(20);
    for _ in 0..20 {
        let t = Instant::now();
        pipelines::read::get(&db, run, None, 100)
            .await
            .expect("reading the run");
        reads.push(t.elapsed());
    }
    reads.sort();
    db.close().await;
    Passes {
        items,
        times,
        jobs,
        read: quantile(&reads, 0.5),
    }
}

/// The median pass that advances the busy one of `runs` open runs, by
/// `parents` (`None`: that run alone).
async fn among_runs(runs: usize, count: usize, all: bool) -> Duration {
    let db = flotilla_e2e::pg::migrated_database().await;
    let mut ids = Vec::new();
    for r in 0..runs {
        ids.push(listed_run_named(&db, 500, &format!("run-{r}.pipeline")).await);
    }
    // Every run listed, its first stage filled: the idle ones stay so.
    engine::advance(&db, &Parents::All)
        .await
        .expect("the listing pass");
    engine::advance(&db, &Parents::All)
        .await
        .expect("the first pass");
    let busy = ids[0];
    let parents = if all {
        Parents::All
    } else {
        Parents::These(vec![busy])
    };
    let mut times = Vec::with_capacity(count);
    for _ in 0..count {
        end_step_jobs(&db, busy).await;
        let t = Instant::now();
        engine::advance(&db, &parents).await.expect("a pass");
        times.push(t.elapsed());
    }
    db.close().await;
    times.sort();
    quantile(&times, 0.5)
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let small = env_or("PASS_ITEMS_SMALL", 500);
    let large = env_or("PASS_ITEMS_LARGE", 50_000);
    let count = env_or("PASS_COUNT", 200).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut medians = Vec::new();
    let mut reads = Vec::new();
    for items in [small, large] {
        let p = rt.block_on(passes(items, count));
        let mut sorted = p.times.clone();
        sorted.sort();
        let median = quantile(&sorted, 0.5);
        println!(
            "{:>7} items: {} passes, {} step jobs ended; pass median {:.2} ms, p90 {:.2} ms, max {:.2} ms",
            p.items,
            p.times.len(),
            p.jobs,
            median.as_secs_f64() * 1e3,
            quantile(&sorted, 0.9).as_secs_f64() * 1e3,
            sorted[sorted.len() - 1].as_secs_f64() * 1e3,
        );
        medians.push(median);
        println!(
            "{:>7} items: the run's view, 5 steps done each, median {:.2} ms",
            p.items,
            p.read.as_secs_f64() * 1e3
        );
        reads.push(p.read);
    }
    println!(
        "view median, {large} items / {small} items: {:.2}",
        reads[1].as_secs_f64() / reads[0].as_secs_f64()
    );
    println!(
        "pass median, {large} items / {small} items: {:.2}",
        medians[1].as_secs_f64() / medians[0].as_secs_f64()
    );
    let runs = env_or("PASS_RUNS", 50).max(1);
    let count = count.min(100);
    let all = rt.block_on(among_runs(runs, count, true));
    let own = rt.block_on(among_runs(runs, count, false));
    println!(
        "{runs} open runs, one busy, {count} passes: every run's pass median {:.2} ms, its own {:.2} ms; ratio {:.2}",
        all.as_secs_f64() * 1e3,
        own.as_secs_f64() * 1e3,
        all.as_secs_f64() / own.as_secs_f64()
    );
}
