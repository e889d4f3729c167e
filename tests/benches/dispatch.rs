//! Dispatch throughput: 64 simulated agents over HTTP leasing and completing
//! no-op jobs against the real server process, next to the same claim and
//! complete run directly against the same PostgreSQL without HTTP (the
//! limit). Prints jobs/s, p50/p99 lease latency and the ratio.
//!
//! `cargo bench -p flotilla-e2e --bench dispatch` (builds the server in the
//! bench profile first: `cargo build --release --bins`).
//! Env: DISPATCH_JOBS (default 5000), DISPATCH_AGENTS (default 64).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_core::health::HostHealth;
use flotilla_core::job::{CommandJob, JobKind, JobSpec};
use flotilla_core::protocol::{Complete, Register, INSTANCE_HEADER};
use flotilla_e2e::procs::{Server, ServerOpts};
use flotilla_server::queue::{claim, lease, submit};
use flotilla_server::{agents, auth, serve};
use serde_json::json;
use uuid::Uuid;

fn noop_jobs(n: usize) -> Vec<submit::NewJob> {
    (0..n)
        .map(|_| submit::NewJob {
            spec: JobSpec::Command(CommandJob {
                command: "true".into(),
                secret_env: Default::default(),
                env: BTreeMap::new(),
                workdir: None,
                timeout_s: None,
                outputs: vec![],
            }),
            labels: BTreeMap::new(),
            priority: 0,
            max_attempts: 3,
            cost: 1,
            submitter: "bench".into(),
            parent_id: None,
            child_index: None,
            owner: None,
        })
        .collect()
}

/// A plain success report for the lease `token`.
fn done(token: uuid::Uuid) -> Complete {
    Complete {
        lease_token: token,
        exit_code: Some(0),
        outputs: vec![],
        result: None,
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
    let pg = flotilla_e2e::pg::shared().await;

    // The limit: claim + complete straight on the pool.
    let name = flotilla_e2e::pg::fresh_database(pg).await;
    let db = serve::connect(pg.connect_options(&name), Duration::from_secs(10))
        .await
        .unwrap();
    serve::migrate(&db).await.unwrap();
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
    let direct_rate = n_jobs as f64 / direct_s;
    direct_lat.sort();

    // Over HTTP against the real server process.
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
    submit::submit(&db2, &noop_jobs(n_jobs)).await.unwrap();
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

    println!("dispatch benchmark: {n_jobs} no-op jobs, {n_agents} agents, capacity 1 each");
    println!(
        "  direct SQL (limit): {direct_rate:8.0} jobs/s  claim p50 {:>7.2?} p99 {:>7.2?}",
        percentile(&direct_lat, 0.5),
        percentile(&direct_lat, 0.99)
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
}
