//! A simulated fleet (issue #15): 1,000 agents, each a lightweight client of
//! the real agent protocol with its own token, lease and complete no-op
//! jobs against 3 `flotilla serve` replicas on one PostgreSQL, while the
//! backlog of queued jobs grows from 10,000 to 100,000 to 1,000,000, a
//! quarter of it work nobody can take (a label no agent has, a kind no
//! agent runs, a cost above every agent's capacity), the rest command jobs
//! spread over four label pools that the agents are spread over too.
//!
//! At each backlog it measures, on the same database: the raw
//! claim-and-complete loop (64 tasks calling the queue module, no HTTP:
//! the limit, as the dispatch bench has it), then the fleet over HTTP.
//! Prints leases/s of each and their ratio, p50/p99 lease latency, and
//! PostgreSQL's CPU time per lease (all its processes, from /proc) and the
//! servers' — the figures that must stay flat as the backlog grows.
//!
//! `cargo build --bins && cargo test -p flotilla-e2e --bench fleet --no-run`,
//! then run the built `target/debug/deps/fleet-*` (or `cargo bench -p
//! flotilla-e2e --bench fleet` after `cargo build --release --bins`, with
//! `FLOTILLA_BIN_DIR=target/release`).
//! Env: FLEET_AGENTS (1000), FLEET_SERVERS (3), FLEET_BACKLOGS
//! (10000,100000,1000000), FLEET_LEASES (leases per measurement, 5000: at
//! the smallest backlog a measurement takes it from 10,000 to 5,000, and
//! the backlog is topped up to its level before each measurement).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
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
use sqlx::PgPool;
use uuid::Uuid;

/// The label pools agents and takeable jobs are spread over.
const POOLS: usize = 4;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn command_job(pool: usize) -> submit::NewJob {
    submit::NewJob {
        spec: serde_json::from_value(json!({"kind": "command", "command": "true"}))
            .expect("a no-op command job parses"),
        labels: BTreeMap::from([("pool".to_string(), format!("p{pool}"))]),
        priority: 0,
        max_attempts: 3,
        cost: 1,
        submitter: format!("team-{}", pool % 3),
        parent_id: None,
        child_index: None,
        owner: None,
    }
}

/// Job `i` of a backlog: every fourth one takeable by nobody, in three
/// ways; the others command jobs of pool `i % POOLS`.
fn backlog_job(i: usize) -> submit::NewJob {
    let mut job = command_job(i % POOLS);
    match i % 12 {
        3 => {
            job.labels.insert("gpu".into(), "h100".into());
        }
        7 => {
            job.spec = JobSpec::Tile(TileJob {
                dataset: "nowhere".into(),
                year: 2024,
                tile: TileId::from_cell((i % 3600) as i32 - 1800, ((i / 3600) % 800) as i32)
                    .expect("cells of the first rows north of the equator exist"),
                checkpoint_sha256: "0".repeat(64),
                fetch_command: None,
            });
        }
        11 => job.cost = 4,
        _ => {}
    }
    job
}

fn register(name: &str, pool: usize) -> Register {
    Register {
        name: name.into(),
        instance: Uuid::new_v4(),
        labels: BTreeMap::from([("pool".to_string(), format!("p{pool}"))]),
        capacity: 1,
        kinds: vec![JobKind::Command],
        version: "fleet-bench".into(),
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

/// CPU seconds (user + system) used so far by process `pid` and, with
/// `children`, every process whose parent it is (a PostgreSQL postmaster's
/// backends).
fn cpu_seconds(pid: u32, children: bool) -> f64 {
    let ticks = |stat: &str| -> Option<(u32, f64)> {
        // Fields after the command's closing parenthesis: state is 3rd,
        // ppid 4th, utime 14th and stime 15th of the whole line.
        let rest = stat.rsplit_once(')')?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ppid = f.get(1)?.parse().ok()?;
        let t = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
        Some((ppid, t))
    };
    let hz = 100.0; // USER_HZ on Linux
    let mut total = 0.0;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        if let Some((ppid, t)) = ticks(&stat) {
            if p == pid || (children && ppid == pid) {
                total += t / hz;
            }
        }
    }
    total
}

fn postmaster_pid() -> u32 {
    let file = flotilla_e2e::pg::shared_dir().join("pg/postmaster.pid");
    std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()))
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("postmaster.pid starts with the pid")
}

/// What one measurement saw.
struct Run {
    leases: usize,
    seconds: f64,
    latencies: Vec<Duration>,
    db_cpu: f64,
    server_cpu: f64,
}

impl Run {
    fn rate(&self) -> f64 {
        self.leases as f64 / self.seconds
    }
}

/// The raw loop: 64 tasks claim and complete on `db` until `leases` are
/// done, as agents of every pool.
async fn direct(db: &PgPool, agents: &[Uuid], leases: usize, postmaster: u32) -> Run {
    let budget = Arc::new(AtomicI64::new(leases as i64));
    let cpu0 = cpu_seconds(postmaster, true);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for &agent in agents {
        let db = db.clone();
        let budget = budget.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while budget.fetch_sub(1, Ordering::Relaxed) > 0 {
                let t = Instant::now();
                let Some(job) = claim::claim(&db, agent, Duration::from_secs(600))
                    .await
                    .expect("claiming")
                else {
                    break;
                };
                lat.push(t.elapsed());
                lease::complete(
                    &db,
                    lease::LeaseKey {
                        agent,
                        job: job.job_id,
                        token: job.lease_token,
                    },
                    &Complete {
                        lease_token: job.lease_token,
                        exit_code: Some(0),
                        outputs: vec![],
                        result: None,
                        progress: None,
                    },
                )
                .await
                .expect("completing");
            }
            lat
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("a direct task"));
    }
    let seconds = start.elapsed().as_secs_f64();
    latencies.sort();
    Run {
        leases: latencies.len(),
        seconds,
        latencies,
        db_cpu: cpu_seconds(postmaster, true) - cpu0,
        server_cpu: 0.0,
    }
}

/// One simulated agent: its server, token and instance.
struct SimAgent {
    base: Arc<String>,
    token: String,
    instance: String,
}

/// The fleet over HTTP until `leases` are done.
async fn fleet(
    http: &reqwest::Client,
    agents: &[Arc<SimAgent>],
    leases: usize,
    postmaster: u32,
    servers: &[u32],
) -> Run {
    let budget = Arc::new(AtomicI64::new(leases as i64));
    let cpu0 = cpu_seconds(postmaster, true);
    let srv0: f64 = servers.iter().map(|&p| cpu_seconds(p, false)).sum();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for a in agents {
        let a = a.clone();
        let http = http.clone();
        let budget = budget.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while budget.fetch_sub(1, Ordering::Relaxed) > 0 {
                let t = Instant::now();
                let r = http
                    .post(format!("{}/api/agent/v1/lease", a.base))
                    .bearer_auth(&a.token)
                    .header(INSTANCE_HEADER, &a.instance)
                    .json(&json!({"wait_ms": 0}))
                    .send()
                    .await
                    .expect("lease reaches a server");
                assert!(r.status().is_success(), "lease: {}", r.status());
                let v: serde_json::Value = r.json().await.expect("a lease answer");
                if v["job"].is_null() {
                    // Nothing of this agent's pool left: give the budget back.
                    budget.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                lat.push(t.elapsed());
                let id = v["job"]["job_id"].as_str().expect("a job id").to_string();
                let r = http
                    .post(format!("{}/api/agent/v1/jobs/{id}/complete", a.base))
                    .bearer_auth(&a.token)
                    .header(INSTANCE_HEADER, &a.instance)
                    .json(&json!({"lease_token": v["job"]["lease_token"], "exit_code": 0}))
                    .send()
                    .await
                    .expect("complete reaches a server");
                assert!(r.status().is_success(), "complete: {}", r.status());
            }
            lat
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("an agent task"));
    }
    let seconds = start.elapsed().as_secs_f64();
    latencies.sort();
    Run {
        leases: latencies.len(),
        seconds,
        latencies,
        db_cpu: cpu_seconds(postmaster, true) - cpu0,
        server_cpu: servers.iter().map(|&p| cpu_seconds(p, false)).sum::<f64>() - srv0,
    }
}

/// Adds jobs until `db` holds `target` queued ones; returns how many now.
async fn grow_backlog(db: &PgPool, target: usize, made: &mut usize) -> i64 {
    let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'queued'")
        .fetch_one(db)
        .await
        .expect("counting the backlog");
    let missing = target.saturating_sub(queued as usize);
    let start = Instant::now();
    let mut batch = Vec::with_capacity(50_000);
    for _ in 0..missing {
        batch.push(backlog_job(*made));
        *made += 1;
        if batch.len() == 50_000 {
            submit::submit(db, &batch).await.expect("submitting");
            batch.clear();
        }
    }
    if !batch.is_empty() {
        submit::submit(db, &batch).await.expect("submitting");
    }
    // As a long-running server's autovacuum would have by now.
    sqlx::query("VACUUM ANALYZE jobs")
        .execute(db)
        .await
        .expect("analyzing");
    println!(
        "fleet: backlog grown by {missing} to {target} in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    queued + missing as i64
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let n_agents: usize = env_or("FLEET_AGENTS", 1000);
    let n_servers: usize = env_or("FLEET_SERVERS", 3);
    let leases: usize = env_or("FLEET_LEASES", 5_000);
    let backlogs: Vec<usize> = std::env::var("FLEET_BACKLOGS")
        .unwrap_or_else(|_| "10000,100000,1000000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("FLEET_BACKLOGS: numbers"))
        .collect();
    flotilla_e2e::fds::raise_open_files_limit();
    let pg = flotilla_e2e::pg::shared().await;
    let postmaster = postmaster_pid();
    let name = flotilla_e2e::pg::fresh_database(pg).await;
    let db = serve::connect_sized(pg.connect_options(&name), Duration::from_secs(10), 70)
        .await
        .expect("connecting");
    serve::migrate(&db).await.expect("migrating");

    // The replicas, each with a pool sized so that three fit the
    // cluster's 200 connections beside this bench's own.
    let dir = flotilla_e2e::scratch("bench-fleet-");
    let store = dir.path().join("store").to_string_lossy().into_owned();
    let mut servers = Vec::new();
    for i in 0..n_servers {
        let sdir = dir.path().join(format!("server-{i}"));
        std::fs::create_dir_all(&sdir).expect("a server dir");
        servers.push(
            Server::start(
                &sdir,
                ServerOpts {
                    database_url: pg.database_url(&name),
                    store: store.clone(),
                    listen: "127.0.0.1:0".parse().expect("an address"),
                    lease_ttl_ms: 600_000,
                    backoff_base_ms: 1000,
                    env: vec![
                        ("FLOTILLA_DB_POOL_SIZE".into(), "12".into()),
                        ("FLOTILLA_AGENT_POOL_SIZE".into(), "16".into()),
                    ],
                },
            )
            .await,
        );
    }
    let server_pids: Vec<u32> = servers.iter().map(|s| s.pid()).collect();

    // 64 direct claimers and the fleet's agents, spread over the pools.
    let mut direct_agents = Vec::new();
    for i in 0..64 {
        direct_agents.push(
            agents::register(&db, &register(&format!("direct-{i}"), i % POOLS))
                .await
                .expect("registering")
                .0,
        );
    }
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(n_agents)
        .build()
        .expect("an HTTP client");
    let mut fleet_agents = Vec::new();
    let start = Instant::now();
    for i in 0..n_agents {
        let name = format!("sim-{i:04}");
        let reg = register(&name, i % POOLS);
        let (_, token) =
            auth::create_token(&db, flotilla_core::api::TokenRole::Agent, Some(&name), None)
                .await
                .expect("an agent token");
        let base = Arc::new(servers[i % n_servers].url());
        let r = http
            .post(format!("{base}/api/agent/v1/register"))
            .bearer_auth(&token)
            .json(&reg)
            .send()
            .await
            .expect("register reaches a server");
        assert!(r.status().is_success(), "register: {}", r.status());
        fleet_agents.push(Arc::new(SimAgent {
            base,
            token,
            instance: reg.instance.to_string(),
        }));
    }
    println!(
        "fleet: {n_agents} agents registered with {n_servers} servers in {:.1} s",
        start.elapsed().as_secs_f64()
    );

    let mut made = 0usize;
    let mut rows = Vec::new();
    for &target in &backlogs {
        // Each measurement takes `leases` jobs out of the backlog: it is
        // topped up to its level before each.
        let queued = grow_backlog(&db, target, &mut made).await;
        let d = direct(&db, &direct_agents, leases, postmaster).await;
        grow_backlog(&db, target, &mut made).await;
        let f = fleet(&http, &fleet_agents, leases, postmaster, &server_pids).await;
        println!(
            "fleet: backlog {queued}: direct {:.0} leases/s, fleet {:.0} leases/s (ratio {:.2}), \
             lease p50 {:.1?} p99 {:.1?}, PostgreSQL CPU per lease {:.2} ms direct / {:.2} ms fleet, \
             servers' CPU per lease {:.2} ms",
            d.rate(),
            f.rate(),
            f.rate() / d.rate(),
            percentile(&f.latencies, 0.5),
            percentile(&f.latencies, 0.99),
            1000.0 * d.db_cpu / d.leases as f64,
            1000.0 * f.db_cpu / f.leases as f64,
            1000.0 * f.server_cpu / f.leases as f64,
        );
        rows.push((queued, d, f));
    }
    println!(
        "\nfleet benchmark: {n_agents} agents, {n_servers} servers, {leases} leases per measurement"
    );
    println!("| backlog (queued at the start) | direct leases/s | fleet leases/s | fleet / direct | lease p50 | lease p99 | PG CPU/lease direct | PG CPU/lease fleet | servers CPU/lease |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (queued, d, f) in &rows {
        println!(
            "| {queued} | {:.0} | {:.0} | {:.2} | {:.1?} | {:.1?} | {:.2} ms | {:.2} ms | {:.2} ms |",
            d.rate(),
            f.rate(),
            f.rate() / d.rate(),
            percentile(&f.latencies, 0.5),
            percentile(&f.latencies, 0.99),
            1000.0 * d.db_cpu / d.leases as f64,
            1000.0 * f.db_cpu / f.leases as f64,
            1000.0 * f.server_cpu / f.leases as f64,
        );
    }
    let succeeded: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'succeeded'")
        .fetch_one(&db)
        .await
        .expect("counting");
    let leased: usize = rows.iter().map(|(_, d, f)| d.leases + f.leases).sum();
    assert_eq!(succeeded as usize, leased, "every lease completed once");
}
