//! Dispatch throughput: 64 simulated agents over HTTP leasing and completing
//! no-op jobs against the real server process, next to the same claim and
//! complete run directly against the same PostgreSQL without HTTP (the
//! limit). Prints jobs/s, p50/p99 lease latency and the ratio. Then the
//! HTTP run again with 100,000 ready jobs no agent can take queued ahead at
//! priority 1000, and the ratio of its p99 lease latency to the first's.
//!
//! `cargo bench -p flotilla-e2e --bench dispatch` (builds the server in the
//! bench profile first: `cargo build --release --bins`).
//! Env: DISPATCH_JOBS (default 5000), DISPATCH_AGENTS (default 64),
//! DISPATCH_UNMATCHABLE (default 100000; 0 skips that run), DISPATCH_BARE_FIRST
//! (the direct run without metric triggers before the one with them).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_core::grid::TileId;
use flotilla_core::health::HostHealth;
use flotilla_core::job::{JobKind, JobSpec, TileJob};
use flotilla_core::protocol::{Complete, Register, INSTANCE_HEADER};
use flotilla_e2e::procs::{Server, ServerOpts};
use flotilla_server::queue::{claim, lease, submit};
use flotilla_server::{agents, auth, serve};
use serde_json::json;
use uuid::Uuid;

fn noop_jobs(n: usize) -> Vec<submit::NewJob> {
    flotilla_e2e::noop_jobs(n, "bench")
}

/// A plain success report for the lease `token`.
fn done(token: uuid::Uuid) -> Complete {
    Complete {
        lease_token: token,
        exit_code: Some(0),
        outputs: vec![],
        result: None,
        progress: None,
    }
}

fn register(name: &str) -> Register {
    Register {
        name: name.into(),
        instance: Uuid::new_v4(),
        labels: BTreeMap::new(),
        capacity: 1,
        kinds: vec![JobKind::Command],
        version: "bench".into(),
        health: HostHealth::default(),
        devices: Default::default(),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let n_jobs: usize = std::env::var("DISPATCH_JOBS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5000);
    let n_agents: usize = std::env::var("DISPATCH_AGENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let n_unmatchable: usize = std::env::var("DISPATCH_UNMATCHABLE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let pg = flotilla_e2e::pg::shared().await;

    // The limit: claim + complete straight on the pool, with the metric
    // triggers as shipped and then without them (their cost per lease).
    // DISPATCH_BARE_FIRST=1 runs the one without triggers first, to see
    // what the order (a warmer cluster for the second) does to the ratio.
    let ((direct_rate, direct_lat), (bare_rate, bare_lat)) =
        if std::env::var_os("DISPATCH_BARE_FIRST").is_some() {
            let bare = direct(pg, n_jobs, n_agents, false).await;
            (direct(pg, n_jobs, n_agents, true).await, bare)
        } else {
            let with = direct(pg, n_jobs, n_agents, true).await;
            (with, direct(pg, n_jobs, n_agents, false).await)
        };

    // Over HTTP against the real server process, then the same again with
    // unmatchable work queued ahead of it.
    let (http_rate, http_lat) = over_http(pg, n_jobs, n_agents, 0).await;
    let ahead = if n_unmatchable > 0 {
        Some(over_http(pg, n_jobs, n_agents, n_unmatchable).await)
    } else {
        None
    };

    println!("dispatch benchmark: {n_jobs} no-op jobs, {n_agents} agents, capacity 1 each");
    println!(
        "  direct SQL (limit): {direct_rate:8.0} jobs/s  claim p50 {:>7.2?} p99 {:>7.2?}",
        percentile(&direct_lat, 0.5),
        percentile(&direct_lat, 0.99)
    );
    println!(
        "  direct SQL, no metric triggers: {bare_rate:8.0} jobs/s  claim p50 {:>7.2?} p99 {:>7.2?}",
        percentile(&bare_lat, 0.5),
        percentile(&bare_lat, 0.99)
    );
    println!(
        "  metric triggers: direct rate with / without {:.2}",
        direct_rate / bare_rate
    );
    println!(
        "  HTTP (server):      {http_rate:8.0} jobs/s  lease p50 {:>7.2?} p99 {:>7.2?}",
        percentile(&http_lat, 0.5),
        percentile(&http_lat, 0.99)
    );
    println!(
        "  ratio HTTP / direct: {:.2} (target >= 0.5)",
        http_rate / direct_rate
    );
    if let Some((rate, lat)) = ahead {
        println!(
            "  HTTP, {n_unmatchable} unmatchable priority-1000 jobs ahead: {rate:8.0} jobs/s  \
             lease p50 {:>7.2?} p99 {:>7.2?}",
            percentile(&lat, 0.5),
            percentile(&lat, 0.99)
        );
        println!(
            "  p99 lease latency with / without them: {:.2} (target <= 2)",
            percentile(&lat, 0.99).as_secs_f64() / percentile(&http_lat, 0.99).as_secs_f64()
        );
    }
}

/// `n_jobs` claimed and completed by `n_agents` tasks straight on a fresh
/// database (no HTTP, no server): the limit the server is measured
/// against. `metric_triggers: false` disables the metric triggers first.
async fn direct(
    pg: &flotilla_server::embedded_pg::EmbeddedPostgres,
    n_jobs: usize,
    n_agents: usize,
    metric_triggers: bool,
) -> (f64, Vec<Duration>) {
    let name = flotilla_e2e::pg::fresh_database(pg).await;
    let db = serve::connect(pg.connect_options(&name), Duration::from_secs(10))
        .await
        .unwrap();
    serve::migrate(&db).await.unwrap();
    if !metric_triggers {
        // The three triggers of migration 20261204000001 (metric_events
        // rows per lease and per attempt's end); nothing else on
        // job_attempts is a user trigger.
        sqlx::query("ALTER TABLE job_attempts DISABLE TRIGGER USER")
            .execute(&db)
            .await
            .unwrap();
    }
    submit::submit(&db, &noop_jobs(n_jobs)).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..n_agents {
        ids.push(
            agents::register(&db, &register(&format!("direct-{i}")))
                .await
                .unwrap()
                .0,
        );
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for agent in ids {
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let t = Instant::now();
                let Some(job) = claim::claim(&db, agent, Duration::from_secs(60))
                    .await
                    .unwrap()
                else {
                    return lat;
                };
                lat.push(t.elapsed());
                lease::complete(
                    &db,
                    lease::LeaseKey {
                        agent,
                        job: job.job_id,
                        token: job.lease_token,
                    },
                    &done(job.lease_token),
                )
                .await
                .unwrap();
            }
        }));
    }
    let mut direct_lat = Vec::new();
    for t in tasks {
        direct_lat.extend(t.await.unwrap());
    }
    let direct_s = start.elapsed().as_secs_f64();
    direct_lat.sort();
    (n_jobs as f64 / direct_s, direct_lat)
}

/// Ready jobs no agent of the bench can take, at priority 1000 so that they
/// sort ahead of every no-op job: half carry a label nobody has, half are a
/// kind nobody runs (the bench's agents run command jobs only).
fn unmatchable_jobs(n: usize) -> Vec<submit::NewJob> {
    (0..n)
        .map(|i| {
            let mut job = noop_jobs(1).remove(0);
            job.priority = 1000;
            job.submitter = "hostile".into();
            if i % 2 == 0 {
                job.labels.insert("nope".into(), "1".into());
            } else {
                job.spec = JobSpec::Tile(TileJob {
                    dataset: "nowhere".into(),
                    year: 2024,
                    tile: TileId::from_cell((i % 3600) as i32 - 1800, (i / 3600) as i32)
                        .expect("cells of the first rows north of the equator exist"),
                    checkpoint_sha256: "0".repeat(64),
                    fetch_command: None,
                });
            }
            job
        })
        .collect()
}

/// `n_agents` agents lease and complete `n_jobs` no-op jobs over HTTP from a
/// fresh server on a fresh database, with `unmatchable` jobs queued ahead.
/// Returns jobs/s and the lease latencies, sorted.
async fn over_http(
    pg: &flotilla_server::embedded_pg::EmbeddedPostgres,
    n_jobs: usize,
    n_agents: usize,
    unmatchable: usize,
) -> (f64, Vec<Duration>) {
    let dir = flotilla_e2e::scratch("bench-dispatch-");
    let name = flotilla_e2e::pg::fresh_database(pg).await;
    let server = Server::start(
        dir.path(),
        ServerOpts {
            database_url: pg.database_url(&name),
            store: dir.path().join("store").to_string_lossy().into_owned(),
            listen: "127.0.0.1:0".parse().unwrap(),
            lease_ttl_ms: 60_000,
            backoff_base_ms: 1000,
            env: vec![],
        },
    )
    .await;
    let db2 = serve::connect(pg.connect_options(&name), Duration::from_secs(10))
        .await
        .unwrap();
    for chunk in unmatchable_jobs(unmatchable).chunks(50_000) {
        submit::submit(&db2, chunk).await.unwrap();
    }
    submit::submit(&db2, &noop_jobs(n_jobs)).await.unwrap();
    // As a long-running server's autovacuum would have by now.
    sqlx::query("ANALYZE jobs").execute(&db2).await.unwrap();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(n_agents)
        .build()
        .unwrap();
    let base = Arc::new(server.url());
    let mut tokens = Vec::new();
    for i in 0..n_agents {
        let name = format!("http-{i}");
        let reg = register(&name);
        let (_, token) = auth::create_token(
            &db2,
            flotilla_core::api::TokenRole::Agent,
            Some(&name),
            None,
        )
        .await
        .unwrap();
        let r = http
            .post(format!("{base}/api/agent/v1/register"))
            .bearer_auth(&token)
            .json(&reg)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "register: {}", r.status());
        tokens.push((token, reg.instance.to_string()));
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (token, instance) in tokens {
        let http = http.clone();
        let base = base.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let t = Instant::now();
                let v: serde_json::Value = http
                    .post(format!("{base}/api/agent/v1/lease"))
                    .bearer_auth(&token)
                    .header(INSTANCE_HEADER, &instance)
                    .json(&json!({"wait_ms": 0}))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                if v["job"].is_null() {
                    return lat;
                }
                lat.push(t.elapsed());
                let id = v["job"]["job_id"].as_str().unwrap().to_string();
                let r = http
                    .post(format!("{base}/api/agent/v1/jobs/{id}/complete"))
                    .bearer_auth(&token)
                    .header(INSTANCE_HEADER, &instance)
                    .json(&json!({"lease_token": v["job"]["lease_token"], "exit_code": 0}))
                    .send()
                    .await
                    .unwrap();
                assert!(r.status().is_success(), "complete: {}", r.status());
            }
        }));
    }
    let mut http_lat = Vec::new();
    for t in tasks {
        http_lat.extend(t.await.unwrap());
    }
    let http_s = start.elapsed().as_secs_f64();
    let http_rate = n_jobs as f64 / http_s;
    http_lat.sort();
    let done: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'succeeded'")
        .fetch_one(&db2)
        .await
        .unwrap();
    assert_eq!(done as usize, n_jobs, "every job completed once");
    (http_rate, http_lat)
}
