//! Chaos run: server replicas, agents and PostgreSQL killed and restarted, and an agent partitioned past its lease, while jobs flow; then the invariants.
//!
//! Three `flotilla serve` replicas on one database (a private cluster, since
//! the run restarts it), four `flotilla-agent`s each given every server's
//! URL, one of them in its own network namespace behind a veth pair. Command
//! jobs append `$FLOTILLA_ATTEMPT` to `MARKS/$FLOTILLA_JOB_ID` when they run
//! to their end, and write it to their one declared output. Meanwhile a driver, every few seconds, SIGKILLs a random
//! server (restarted on the same address) or agent (restarted under the same
//! name), restarts PostgreSQL every ~30 s, and cuts the namespaced agent off
//! (nft drops every packet across the pair) for three lease TTLs.
//!
//! The servers serve TLS on the host end of the veth pair (a certificate for
//! that address from a CA made here): it is not loopback, and a server
//! refuses plain HTTP there; TLS is what a real fleet across hosts runs,
//! so the run takes no `--behind-tls-proxy` shortcut.
//!
//! At the end, [`check::check`]: every job final and succeeded, none run to
//! its end twice in one attempt, the accepted attempt's marker present once,
//! the only output listed the accepted attempt's own (no output of a
//! refused lease visible), every attempt that did not stand explained by a fault of its agent (each
//! listed with the fault), and every agent online again.
//!
//! `FLOTILLA_CHAOS_SECS` sets how long the faults go on (100 s by default;
//! `scripts/chaos.sh` runs a long one). Needs root (`ip netns`) and `nft`.

mod check;
mod fleet;
mod netns;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use flotilla_core::api::JobView;
use flotilla_e2e::api::Api;
use flotilla_e2e::procs::{Server, ServerOpts};
use flotilla_e2e::scratch;
use flotilla_server::embedded_pg::EmbeddedPostgres;
use rand::Rng;
use serde_json::{json, Value};

use check::{Fault, FaultKind};
use fleet::ChaosAgent;

/// Short enough that a partition of three TTLs fits a short run many times.
const LEASE_TTL_MS: u64 = 3_000;
const SERVERS: usize = 3;
/// Agents in the root namespace; one more runs in the partitionable one.
const PLAIN_AGENTS: usize = 3;
const PARTITIONED_AGENT: &str = "chaos-ns";
/// PostgreSQL is restarted at most this often.
const PG_EVERY: Duration = Duration::from_secs(30);

/// `(status, body)`, or `None` when the server did not answer.
async fn try_call(
    api: &Api,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> Option<(u16, Value)> {
    let mut req = api
        .http
        .request(method, format!("{}{path}", api.base))
        .bearer_auth(&api.token)
        .timeout(Duration::from_secs(15));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.ok()?;
    let status = resp.status().as_u16();
    let text = resp.text().await.ok()?;
    Some((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

/// GET through any replica that answers 2xx, for up to `limit`.
async fn get_any(apis: &[Api], path: &str, limit: Duration) -> Value {
    let start = Instant::now();
    loop {
        for api in apis {
            if let Some((s, v)) = try_call(api, reqwest::Method::GET, path, None).await {
                if (200..300).contains(&s) {
                    return v;
                }
            }
        }
        assert!(
            start.elapsed() < limit,
            "no replica answered GET {path} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A marker job: mostly sub-second; one in ten runs 3 s, so that kills and
/// partitions find jobs in flight.
fn marker_job(marks: &std::path::Path, rng: &mut impl Rng) -> Value {
    let sleep = if rng.gen_ratio(1, 10) {
        "3".to_string()
    } else {
        format!("0.{}", rng.gen_range(1..=9))
    };
    json!({
        "kind": "command",
        "command": format!(
            "sleep {sleep}; echo $FLOTILLA_ATTEMPT >> {}/$FLOTILLA_JOB_ID; echo $FLOTILLA_ATTEMPT > {}",
            marks.display(),
            check::OUTPUT
        ),
        // Uploaded after the command, before the report: a refused
        // attempt's may reach the store but must never be listed.
        "outputs": [check::OUTPUT],
        // Enough that the faults cannot exhaust a job's attempts.
        "max_attempts": 20,
    })
}

/// Submits a job every ~300 ms through the replicas in turn (the next one
/// when one does not answer) until `stop`; the ids it was answered.
async fn submit_until(
    apis: Vec<Api>,
    marks: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    ids: Arc<Mutex<Vec<String>>>,
) {
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let body = marker_job(&marks, &mut rand::thread_rng());
        'submit: loop {
            for i in 0..apis.len() {
                let api = &apis[(n + i) % apis.len()];
                if let Some((201, v)) = try_call(
                    api,
                    reqwest::Method::POST,
                    "/api/v1/jobs",
                    Some(body.clone()),
                )
                .await
                {
                    let id = v["id"].as_str().expect("submit answers an id").to_string();
                    ids.lock().expect("ids lock").push(id);
                    break 'submit;
                }
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        n += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Everything the driver acts on.
struct Fleet {
    pg: EmbeddedPostgres,
    servers: Vec<Server>,
    agents: Vec<ChaosAgent>,
    net: netns::Netns,
    faults: Vec<Fault>,
    started: Instant,
}

impl Fleet {
    fn log(&self, f: &Fault) {
        eprintln!("chaos +{:6.1}s {f}", self.started.elapsed().as_secs_f64());
    }

    async fn kill_server(&mut self, i: usize, down: Duration) {
        let at = Utc::now();
        self.servers[i].kill().await;
        tokio::time::sleep(down).await;
        self.servers[i].restart().await;
        let f = Fault {
            kind: FaultKind::KillServer,
            target: format!("server-{i}"),
            at,
            end: Utc::now(),
        };
        self.log(&f);
        self.faults.push(f);
    }

    async fn kill_agent(&mut self, i: usize, down: Duration) {
        let at = Utc::now();
        self.agents[i].kill().await;
        tokio::time::sleep(down).await;
        self.agents[i].spawn();
        let f = Fault {
            kind: FaultKind::KillAgent,
            target: self.agents[i].name.clone(),
            at,
            end: Utc::now(),
        };
        self.log(&f);
        self.faults.push(f);
    }

    async fn restart_pg(&mut self) {
        let at = Utc::now();
        self.pg.restart().await.expect("restarting PostgreSQL");
        let f = Fault {
            kind: FaultKind::RestartPostgres,
            target: "postgres".into(),
            at,
            end: Utc::now(),
        };
        self.log(&f);
        self.faults.push(f);
    }

    fn partition(&mut self) -> chrono::DateTime<Utc> {
        let at = Utc::now();
        self.net.partition();
        eprintln!(
            "chaos +{:6.1}s partitioning {PARTITIONED_AGENT}",
            self.started.elapsed().as_secs_f64()
        );
        at
    }

    fn heal(&mut self, at: chrono::DateTime<Utc>) {
        self.net.heal();
        let f = Fault {
            kind: FaultKind::Partition,
            target: PARTITIONED_AGENT.into(),
            at,
            end: Utc::now(),
        };
        self.log(&f);
        self.faults.push(f);
    }

    /// Agents that exited by themselves (never expected): restarted, and
    /// reported as a violation.
    fn exited_agents(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for a in &mut self.agents {
            if let Some(status) = a.exited() {
                out.push(format!("agent {} exited by itself ({status})", a.name));
                a.spawn();
            }
        }
        out
    }
}

/// Hard links to the binaries as they are now, under `dir/bin`, which the
/// harness then starts (`FLOTILLA_BIN_DIR`): a restart late in a long run
/// starts the same build as the first start, even if `target/debug` was
/// rebuilt meanwhile (a newer build's migrations would stop an older
/// replica from starting).
fn pin_binaries(dir: &std::path::Path) {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for name in ["flotilla", "flotilla-agent"] {
        let built = flotilla_e2e::binary(name);
        if std::fs::hard_link(&built, bin.join(name)).is_err() {
            std::fs::copy(&built, bin.join(name)).expect("copying a binary");
        }
    }
    // Before any process starts; no other test in this binary reads it.
    std::env::set_var("FLOTILLA_BIN_DIR", &bin);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_loses_no_job_and_runs_none_twice() {
    let secs: u64 = std::env::var("FLOTILLA_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let dir = scratch("e2e-chaos-");
    pin_binaries(dir.path());
    let ttl = Duration::from_millis(LEASE_TTL_MS);
    let net = netns::Netns::make();
    let pki = fleet::make_pki(&dir.path().join("pki"), net.host_ip);
    let pg = EmbeddedPostgres::start(&dir.path().join("pgc"))
        .await
        .expect("starting the run's PostgreSQL");
    pg.ensure_database("flotilla")
        .await
        .expect("creating its database");
    let marks = dir.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    // Jobs may run as an unprivileged user.
    std::fs::set_permissions(&marks, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();

    let mut servers = Vec::new();
    for i in 0..SERVERS {
        let sdir = dir.path().join(format!("server-{i}"));
        std::fs::create_dir_all(&sdir).unwrap();
        let opts = ServerOpts {
            database_url: pg.database_url("flotilla"),
            store: dir.path().join("store").to_string_lossy().into_owned(),
            listen: fleet::free_addr_on(net.host_ip),
            lease_ttl_ms: LEASE_TTL_MS,
            backoff_base_ms: 200,
            // Kills and restarts make warnings by the hundred, and each
            // 503 while PostgreSQL restarts an error line from tower_http.
            env: vec![("FLOTILLA_LOG".into(), "error,tower_http=off".into())],
        };
        servers.push(Server::start_tls(&sdir, opts, pki.clone()).await);
    }
    let urls: Vec<String> = servers.iter().map(Server::url).collect();
    let apis: Vec<Api> = servers.iter().map(Server::api).collect();
    let mut agents = Vec::new();
    for i in 0..=PLAIN_AGENTS {
        // Each starts at a different replica.
        let mut order = urls.clone();
        order.rotate_left(i % SERVERS);
        let (name, ns) = if i == PLAIN_AGENTS {
            (PARTITIONED_AGENT.to_string(), Some(net.name.clone()))
        } else {
            (format!("chaos-{i}"), None)
        };
        agents.push(ChaosAgent::start(dir.path(), &servers[0], &order, &name, ns).await);
    }
    let mut fleet = Fleet {
        pg,
        servers,
        agents,
        net,
        faults: Vec::new(),
        started: Instant::now(),
    };

    let stop = Arc::new(AtomicBool::new(false));
    let ids = Arc::new(Mutex::new(Vec::new()));
    let submitter = tokio::spawn(submit_until(
        apis.clone(),
        marks.clone(),
        stop.clone(),
        ids.clone(),
    ));

    // The driver: one fault every 2-4 s; the first ticks make sure each kind
    // happens in a short run.
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut violations = Vec::new();
    let mut partition: Option<(chrono::DateTime<Utc>, Instant)> = None;
    let mut last_pg = Instant::now();
    let mut last_heal = Instant::now() - Duration::from_secs(60);
    let mut tick = 0u32;
    while Instant::now() < deadline {
        let pause = Duration::from_millis(rand::thread_rng().gen_range(2_000..4_000));
        tokio::time::sleep(pause).await;
        violations.extend(fleet.exited_agents());
        tick += 1;
        if let Some((at, since)) = partition {
            // Three TTLs: the servers have reaped its leases by then.
            if since.elapsed() >= ttl * 3 {
                fleet.heal(at);
                last_heal = Instant::now();
                partition = None;
            }
        }
        let (choice, down) = {
            let mut rng = rand::thread_rng();
            let choice = match tick {
                _ if last_pg.elapsed() >= PG_EVERY + Duration::from_secs(10) => 2,
                1 => 3,
                2 => 0,
                3 => 1,
                _ => rng.gen_range(0..4),
            };
            (choice, Duration::from_millis(rng.gen_range(500..2_000)))
        };
        match choice {
            3 if partition.is_none() && last_heal.elapsed() >= ttl * 3 => {
                partition = Some((fleet.partition(), Instant::now()));
            }
            2 if last_pg.elapsed() >= PG_EVERY => {
                fleet.restart_pg().await;
                last_pg = Instant::now();
            }
            0 | 2 => {
                let i = rand::thread_rng().gen_range(0..SERVERS);
                fleet.kill_server(i, down).await;
            }
            _ => {
                // Not the partitioned agent while it is cut off: its
                // partition is the fault under test then.
                let candidates: Vec<usize> = (0..fleet.agents.len())
                    .filter(|&i| partition.is_none() || fleet.agents[i].netns.is_none())
                    .collect();
                let i = candidates[rand::thread_rng().gen_range(0..candidates.len())];
                fleet.kill_agent(i, down).await;
            }
        }
    }
    if let Some((at, _)) = partition {
        fleet.heal(at);
    }
    stop.store(true, Ordering::Relaxed);
    submitter.await.expect("the submitter ends");
    let chaos_for = fleet.started.elapsed();
    eprintln!("chaos: faults stopped after {chaos_for:?}; waiting for every job to end");

    // Every job final: none left queued, leased, running or retrying (this
    // covers a job whose submit answer was lost too).
    let settle = Instant::now();
    let limit = Duration::from_secs(300);
    loop {
        let mut open = 0;
        for state in ["queued", "leased", "running", "retrying"] {
            let v = get_any(
                &apis,
                &format!("/api/v1/jobs?state={state}&limit=1000"),
                limit,
            )
            .await;
            open += v["jobs"].as_array().map_or(0, Vec::len);
        }
        if open == 0 {
            break;
        }
        violations.extend(fleet.exited_agents());
        assert!(
            settle.elapsed() < limit,
            "{open} jobs still not final {limit:?} after the chaos stopped"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let settled_in = settle.elapsed();

    // Jobs: those submitted, and any whose answer was lost but that ran.
    let mut all: BTreeSet<String> = ids.lock().expect("ids lock").iter().cloned().collect();
    let submitted = all.len();
    for e in std::fs::read_dir(&marks).unwrap() {
        all.insert(e.unwrap().file_name().to_string_lossy().into_owned());
    }
    let store = dir.path().join("store");
    let mut ended = Vec::new();
    for id in &all {
        let view: JobView =
            serde_json::from_value(get_any(&apis, &format!("/api/v1/jobs/{id}"), limit).await)
                .expect("job view parses");
        let marks = std::fs::read_to_string(marks.join(id))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                l.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("job {id}: marker line {l:?}"))
            })
            .collect();
        ended.push(check::Ended::new(view, marks, |key| {
            std::fs::read_to_string(store.join(key)).ok()
        }));
    }
    let mut findings = check::check(
        &ended,
        &fleet.faults,
        chrono::Duration::from_std(ttl).unwrap(),
    );
    findings.violations.extend(violations);

    // Every agent, each restarted as often as the driver chose, is back.
    let names: Vec<String> = fleet.agents.iter().map(|a| a.name.clone()).collect();
    let rejoin = Instant::now();
    let offline = loop {
        let v = get_any(&apis, "/api/v1/agents", limit).await;
        let list = v["agents"]
            .as_array()
            .or(v.as_array())
            .cloned()
            .unwrap_or_default();
        let offline: Vec<String> = names
            .iter()
            .filter(|n| {
                !list
                    .iter()
                    .any(|a| a["name"] == n.as_str() && a["online"] == true)
            })
            .cloned()
            .collect();
        if offline.is_empty() || rejoin.elapsed() > Duration::from_secs(60) {
            break offline;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    for name in &offline {
        findings
            .violations
            .push(format!("agent {name} is not online at the end"));
    }

    let count = |k: FaultKind| fleet.faults.iter().filter(|f| f.kind == k).count();
    eprintln!("\n==== chaos summary ====");
    eprintln!("faults for {chaos_for:.0?}; every job final {settled_in:.0?} later");
    eprintln!(
        "jobs: {} ({} submitted, {} found only by their markers), {} succeeded",
        ended.len(),
        submitted,
        ended.len() - submitted,
        ended
            .iter()
            .filter(|e| e.state == flotilla_core::job::JobState::Succeeded)
            .count()
    );
    eprintln!(
        "faults: {} server kills, {} agent kills, {} PostgreSQL restarts, {} partitions",
        count(FaultKind::KillServer),
        count(FaultKind::KillAgent),
        count(FaultKind::RestartPostgres),
        count(FaultKind::Partition)
    );
    for a in &fleet.agents {
        eprintln!("agent {}: started {} times", a.name, a.starts);
    }
    eprintln!("attempts that did not stand: {}", findings.reruns.len());
    for r in &findings.reruns {
        eprintln!("  {r}");
    }
    eprintln!(
        "orphaned runs that ended after the accepted attempt: {}",
        findings.late_orphans.len()
    );
    for r in &findings.late_orphans {
        eprintln!("  {r}");
    }
    eprintln!("violations: {}", findings.violations.len());
    for v in &findings.violations {
        eprintln!("  {v}");
    }
    eprintln!("==== end of summary ====\n");
    // Agents and servers first (killed on drop), then the database, before
    // the verdict. (A run that panics earlier leaves its PostgreSQL to stop
    // itself: it shuts down within a minute of its data directory, in the
    // scratch directory, going away.)
    let Fleet {
        pg,
        servers,
        agents,
        net,
        faults,
        ..
    } = fleet;
    drop(agents);
    drop(servers);
    drop(net);
    pg.stop_now().await.expect("stopping the run's PostgreSQL");
    let count = |k: FaultKind| faults.iter().filter(|f| f.kind == k).count();
    assert!(
        count(FaultKind::Partition) > 0
            && count(FaultKind::KillAgent) > 0
            && count(FaultKind::KillServer) > 0
            // Forced once PG_EVERY + 10 s have passed.
            && (count(FaultKind::RestartPostgres) > 0 || secs < 60),
        "every kind of fault happened"
    );
    assert!(
        findings.violations.is_empty(),
        "{} invariants broken (see the summary)",
        findings.violations.len()
    );
}
