//! Pipeline engine overhead: N items through three no-op stages (`true`)
//! over two real agents, next to the same 3N no-op jobs submitted straight
//! to the queue over the API, each on its own fresh server and database of
//! the shared cluster. Prints each run's wall time and jobs/s, the overhead
//! per (item, stage) = (T_pipeline − T_direct) / 3N and the ratio
//! T_pipeline / T_direct, the server's (and agents', and its database
//! backends') CPU per job, and from the database the pipeline's hand-off:
//! how long after an item's job ended its next job was queued.
//!
//! Three runs, each on a fresh server with agents `pa` and `pb`:
//!
//! 1. direct, pinned (the peer of the ratio): 3N `true` jobs, 2N labelled
//!    for `pa` and N for `pb`, as the pipeline places them (s1 and s3 on
//!    `pa`, s2 on `pb`), all submitted at once by 16 concurrent clients.
//!    Bound: `pa`'s capacity for 2N jobs, `pb`'s for N.
//! 2. direct, free: the same without labels, either agent takes any job.
//!    Bound: both capacities for 3N jobs (a third faster at best).
//! 3. pipeline: `items on a: seq 1 N`, `s1 on a`, `s2 on b`, `s3 on a`, each
//!    `jobs J`. Bound: as run 1 (s1 and s3 share `pa`'s slots), and at most
//!    J items in each stage; with J ≥ capacity the stages are not the bound.
//!    Its time includes the listing job and the pipeline's fill and drain.
//!
//! Time runs from the first submission until everything is final, watched
//! every 200 ms (`/metrics` for the direct runs, `GET /api/v1/pipelines/ID
//! ?limit=1` for the pipeline), so each figure is ±0.2 s.
//!
//! On a small machine the server, agents, PostgreSQL and the jobs share the
//! CPUs and the runs are CPU-bound, so wall times move with whatever else
//! runs; CPU per job is the steadier figure. The direct runs' server CPU
//! includes their 3N HTTP submissions, which the engine makes in SQL, so
//! pipeline − direct understates the engine's own cost.
//!
//! Against the debug binaries the suite builds (`cargo build --bins`):
//! `cargo test -p flotilla-e2e --bench pipeline_overhead` runs this file's
//! `main` in the test profile, with `target/debug` as the binaries. Against
//! release binaries: `cargo build --release --bins`, then `cargo bench -p
//! flotilla-e2e --bench pipeline_overhead` (or either of the above with
//! `FLOTILLA_BIN_DIR=target/release`).
//! Env: PIPELINE_ITEMS (default 1000), PIPELINE_JOBS (each stage's `jobs`,
//! default 8), AGENT_CAPACITY (each agent's, default 8).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_e2e::procs::{Agent, Server, ServerOpts};
use serde_json::{json, Value};
use sqlx::PgPool;

/// How often a run's progress is read; the figures are ± this.
const WATCH: Duration = Duration::from_millis(200);
/// Clients submitting the direct run's jobs at once.
const SUBMITTERS: usize = 16;
/// A run that takes longer than this is reported and the bench stops.
const GIVE_UP: Duration = Duration::from_secs(3600);

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A server on a fresh database, agents `pa` and `pb`, and a pool on the
/// same database for reading figures after a run.
struct Fleet {
    // Before `server`: dropped (killed) first, so that they never see it
    // gone and log retries.
    agents: Vec<Agent>,
    server: Server,
    db: PgPool,
    database: String,
    _dir: tempfile::TempDir,
}

async fn fleet(capacity: u32) -> Fleet {
    let pg = flotilla_e2e::pg::shared().await;
    let dir = flotilla_e2e::scratch("bench-pipeline-");
    let database = flotilla_e2e::pg::fresh_database(pg).await;
    let server = Server::start(
        dir.path(),
        ServerOpts {
            database_url: pg.database_url(&database),
            store: dir.path().join("store").to_string_lossy().into_owned(),
            listen: "127.0.0.1:0".parse().expect("a valid address"),
            lease_ttl_ms: 60_000,
            backoff_base_ms: 1000,
            env: vec![],
        },
    )
    .await;
    let mut agents = Vec::new();
    for name in ["pa", "pb"] {
        agents.push(Agent::start(&server, name, capacity, &[]).await);
    }
    let api = server.api();
    flotilla_e2e::eventually("both agents to register", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            api.get("/api/v1/agents").await["agents"]
                .as_array()
                .is_some_and(|a| a.len() == 2)
        }
    })
    .await;
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(
            pg.connect_options(&database)
                .application_name("flotilla-bench"),
        )
        .await
        .expect("connecting to the bench database");
    Fleet {
        agents,
        server,
        db,
        database,
        _dir: dir,
    }
}

/// CPU time (user + system) of a process so far, in clock ticks, from
/// `/proc/PID/stat`; `None` once it has gone.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: count from the last.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of proc(5); `rest` starts at field 3.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn ticks_per_s() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// CPU used so far by the server, the agents (themselves, not the jobs
/// they ran) and the PostgreSQL backends serving the run's database
/// (other than this bench's own), by process.
struct CpuSample {
    server: u64,
    agents: u64,
    backends: HashMap<u32, u64>,
}

impl Fleet {
    async fn cpu(&self) -> CpuSample {
        let pids: Vec<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()
               AND application_name NOT LIKE 'flotilla-bench%'",
        )
        .bind(&self.database)
        .fetch_all(&self.db)
        .await
        .expect("listing the database's backends");
        CpuSample {
            server: cpu_ticks(self.server.pid()).unwrap_or(0),
            agents: self
                .agents
                .iter()
                .filter_map(|a| cpu_ticks(a.pid() as u32))
                .sum(),
            backends: pids
                .into_iter()
                .filter_map(|p| Some((p as u32, cpu_ticks(p as u32)?)))
                .collect(),
        }
    }

    /// CPU ms from `before` to now: server, agents, database backends.
    /// A backend that closed in between is missed (the server's pool keeps
    /// its connections for minutes); one that opened counts from its start.
    async fn cpu_since(&self, before: &CpuSample) -> (f64, f64, f64) {
        let now = self.cpu().await;
        let ms = 1000.0 / ticks_per_s();
        let backends: u64 = now
            .backends
            .iter()
            .map(|(p, t)| t.saturating_sub(before.backends.get(p).copied().unwrap_or(0)))
            .sum();
        (
            now.server.saturating_sub(before.server) as f64 * ms,
            now.agents.saturating_sub(before.agents) as f64 * ms,
            backends as f64 * ms,
        )
    }
}

/// What one run measured.
struct Figures {
    label: &'static str,
    bound: String,
    jobs: usize,
    wall_s: f64,
    /// Server, agents, database backends: CPU ms over the run.
    cpu_ms: (f64, f64, f64),
    /// More lines to print under it.
    notes: Vec<String>,
}

impl Figures {
    fn print(&self) {
        let per = |ms: f64| ms / self.jobs as f64;
        println!(
            "  {:<15} {:>6} jobs  {:>8.2} s  {:>7.1} jobs/s  CPU ms/job: server {:>5.2}, \
             agents {:>5.2}, db {:>5.2}",
            self.label,
            self.jobs,
            self.wall_s,
            self.jobs as f64 / self.wall_s,
            per(self.cpu_ms.0),
            per(self.cpu_ms.1),
            per(self.cpu_ms.2),
        );
        println!("  {:<15} bound: {}", "", self.bound);
        for note in &self.notes {
            println!("  {:<15} {note}", "");
        }
    }
}

/// `flotilla_jobs{kind="command",state=S}` from a `/metrics` scrape.
fn command_jobs(metrics: &str) -> HashMap<String, u64> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("flotilla_jobs{kind=\"command\",state=\""))
        .filter_map(|l| {
            let (state, n) = l.split_once("\"} ")?;
            Some((state.to_string(), n.trim().parse().ok()?))
        })
        .collect()
}

/// 3N `true` jobs straight to the queue by [`SUBMITTERS`] clients at once;
/// `pinned` labels them for the agent the pipeline's stage would use.
async fn direct(n: usize, capacity: u32, pinned: bool) -> Figures {
    let fleet = fleet(capacity).await;
    let api = fleet.server.api();
    let total = 3 * n;
    let before = fleet.cpu().await;
    let start = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut submitters = Vec::new();
    for _ in 0..SUBMITTERS {
        let (api, next) = (api.clone(), next.clone());
        submitters.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return;
                }
                // Item by item, stage by stage, as the pipeline's items go.
                let mut body = json!({"kind": "command", "command": "true"});
                if pinned {
                    let agent = if i % 3 == 1 { "pb" } else { "pa" };
                    body["labels"] = json!({ flotilla_core::job::AGENT_NAME_LABEL: agent });
                }
                api.submit(body).await;
            }
        }));
    }
    for s in submitters {
        s.await.expect("a submitter finished");
    }
    let submitted_s = start.elapsed().as_secs_f64();
    let url = format!("{}/metrics", fleet.server.url());
    loop {
        let text = api
            .http
            .get(&url)
            .bearer_auth(&api.token)
            .send()
            .await
            .expect("/metrics answers")
            .text()
            .await
            .expect("reading /metrics");
        let by = command_jobs(&text);
        let ended: u64 = ["succeeded", "failed", "cancelled"]
            .iter()
            .map(|s| by.get(*s).copied().unwrap_or(0))
            .sum();
        if ended as usize >= total {
            assert_eq!(
                by.get("succeeded").copied().unwrap_or(0) as usize,
                total,
                "every no-op job succeeded: {by:?}"
            );
            break;
        }
        assert!(
            start.elapsed() < GIVE_UP,
            "the direct run did not end in {GIVE_UP:?}: {by:?}"
        );
        tokio::time::sleep(WATCH).await;
    }
    let wall_s = start.elapsed().as_secs_f64();
    let cpu_ms = fleet.cpu_since(&before).await;
    eprintln!("  (direct, pinned={pinned}: all {total} submitted after {submitted_s:.2} s)");
    Figures {
        label: if pinned {
            "direct, pinned"
        } else {
            "direct, free"
        },
        bound: if pinned {
            format!(
                "{} jobs on pa, {n} on pb, {capacity} slots each; submitted by {SUBMITTERS} \
                 clients in {submitted_s:.2} s",
                2 * n
            )
        } else {
            format!(
                "{total} jobs on either agent, {} slots; submitted by {SUBMITTERS} clients in \
                 {submitted_s:.2} s",
                2 * capacity
            )
        },
        jobs: total,
        wall_s,
        cpu_ms,
        notes: vec![],
    }
}

/// Milliseconds at fractions `ps` of `v` (sorted here), and the mean.
fn spread(mut v: Vec<f64>, ps: &[f64]) -> (Vec<f64>, f64) {
    if v.is_empty() {
        return (vec![f64::NAN; ps.len()], f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    let at = ps
        .iter()
        .map(|p| v[((v.len() - 1) as f64 * p).round() as usize])
        .collect();
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    (at, mean)
}

/// The pipeline run; also prints its hand-off figures from the database.
async fn pipeline(n: usize, jobs: usize, capacity: u32) -> Figures {
    let fleet = fleet(capacity).await;
    let api = fleet.server.api();
    let source = format!(
        "# pipeline_overhead bench: no-op stages over two agents
host a = agent pa
host b = agent pb
items on a: seq 1 {n}
stage s1 on a jobs {jobs}: true
stage s2 on b jobs {jobs}: true
stage s3 on a jobs {jobs}: true
"
    );
    let before = fleet.cpu().await;
    let start = Instant::now();
    let run = api
        .post(
            "/api/v1/pipelines",
            json!({"name": "overhead.pipeline", "source": source}),
        )
        .await["id"]
        .as_str()
        .expect("a submitted run has an id")
        .to_string();
    let mut said = Instant::now();
    let view: Value = loop {
        let v = api.get(&format!("/api/v1/pipelines/{run}?limit=1")).await;
        if v["state"] != "listing" && v["state"] != "running" {
            break v;
        }
        if said.elapsed() > Duration::from_secs(10) {
            said = Instant::now();
            let done: Vec<u64> = v["steps"]
                .as_array()
                .map(|s| s.iter().filter_map(|c| c["succeeded"].as_u64()).collect())
                .unwrap_or_default();
            eprintln!(
                "  (pipeline at {:.0} s: steps succeeded {done:?})",
                start.elapsed().as_secs_f64()
            );
        }
        assert!(
            start.elapsed() < GIVE_UP,
            "the pipeline did not end in {GIVE_UP:?}: {v:#}"
        );
        tokio::time::sleep(WATCH).await;
    };
    let wall_s = start.elapsed().as_secs_f64();
    let cpu_ms = fleet.cpu_since(&before).await;
    assert_eq!(view["state"], "done", "{view:#}");
    assert_eq!(view["counts"]["done"].as_u64(), Some(n as u64), "{view:#}");

    // Hand-off: an item's job ended → its next job queued (the `created_at`
    // of a job the engine queues is its pass's transaction start) and →
    // that job started on its agent.
    let run_id: uuid::Uuid = run.parse().expect("run ids are uuids");
    let gaps: Vec<(i32, f64, f64)> = sqlx::query_as(
        "SELECT sp.node,
                EXTRACT(EPOCH FROM jn.created_at - jp.finished_at)::float8 * 1000,
                EXTRACT(EPOCH FROM jn.started_at - jp.finished_at)::float8 * 1000
         FROM pipeline_steps sp
         JOIN pipeline_steps sn ON sn.run_id = sp.run_id AND sn.idx = sp.idx
                               AND sn.node = sp.node + 1
         JOIN jobs jp ON jp.id = sp.job_id
         JOIN jobs jn ON jn.id = sn.job_id
         WHERE sp.run_id = $1",
    )
    .bind(run_id)
    .fetch_all(&fleet.db)
    .await
    .expect("reading the hand-offs");
    // Each pass queues its jobs in one transaction: one `created_at`.
    let (step_jobs, passes): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT created_at) FROM jobs WHERE parent_id = $1",
    )
    .bind(run_id)
    .fetch_one(&fleet.db)
    .await
    .expect("counting the run's jobs");
    let server_s: Option<f64> = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM finished_at - created_at)::float8 FROM pipeline_runs
         WHERE id = $1",
    )
    .bind(run_id)
    .fetch_one(&fleet.db)
    .await
    .expect("reading the run's times");
    let ps = [0.5, 0.9, 0.99];
    let mut notes = vec![format!(
        "{step_jobs} jobs (with the listing) queued by {passes} engine passes; the run took \
         {:.2} s by the server's clock",
        server_s.unwrap_or(f64::NAN)
    )];
    // Nodes are numbered in file order: s1 0, s2 1, s3 2.
    for (node, what) in [
        (0, "s1 → s2 (onto pb, s2's alone)"),
        (1, "s2 → s3 (onto pa, shared with s1)"),
    ] {
        let (queued, started): (Vec<f64>, Vec<f64>) = gaps
            .iter()
            .filter(|g| g.0 == node)
            .map(|g| (g.1, g.2))
            .unzip();
        let (q, qm) = spread(queued, &ps);
        let (s, sm) = spread(started, &ps);
        notes.push(format!(
            "hand-off {what}: job ended → next queued p50 {:.0} p90 {:.0} p99 {:.0} mean \
             {qm:.0} ms; → next started p50 {:.0} p90 {:.0} p99 {:.0} mean {sm:.0} ms",
            q[0], q[1], q[2], s[0], s[1], s[2],
        ));
    }
    Figures {
        label: "pipeline",
        bound: format!(
            "s1, s3 on pa ({} jobs), s2 on pb ({n}), {capacity} slots each, at most {jobs} \
             items a stage; plus the listing job",
            2 * n,
        ),
        notes,
        jobs: 3 * n,
        wall_s,
        cpu_ms,
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let n = env_or("PIPELINE_ITEMS", 1000);
    let jobs = env_or("PIPELINE_JOBS", 8);
    let capacity = env_or("AGENT_CAPACITY", 8) as u32;
    eprintln!(
        "pipeline_overhead: binaries from {}",
        flotilla_e2e::bin_dir().display()
    );
    let pinned = direct(n, capacity, true).await;
    let free = direct(n, capacity, false).await;
    let piped = pipeline(n, jobs, capacity).await;

    println!(
        "pipeline overhead: {n} items × 3 no-op stages = {} jobs, agents pa and pb of \
         capacity {capacity}, stage jobs {jobs}",
        3 * n
    );
    pinned.print();
    free.print();
    piped.print();
    let per = |peer: &Figures| (piped.wall_s - peer.wall_s) * 1000.0 / (3 * n) as f64;
    println!(
        "  overhead per (item, stage): {:.2} ms against direct, pinned (the peer); {:.2} ms \
         against direct, free",
        per(&pinned),
        per(&free)
    );
    println!(
        "  ratio T_pipeline / T_direct: {:.2} (pinned), {:.2} (free)",
        piped.wall_s / pinned.wall_s,
        piped.wall_s / free.wall_s
    );
    println!(
        "  server CPU per job: pipeline {:.2} ms, direct, pinned {:.2} ms (with its HTTP \
         submissions): {:.2} ms more per (item, stage)",
        piped.cpu_ms.0 / piped.jobs as f64,
        pinned.cpu_ms.0 / pinned.jobs as f64,
        (piped.cpu_ms.0 - pinned.cpu_ms.0) / (3 * n) as f64
    );
}
