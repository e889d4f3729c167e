//! The server survives hostile clients (issue #12, H5): clients that connect
//! and say nothing, send half a request, hang up early, reset mid-response
//! or stop reading, and floods of bad tokens, cost it no descriptor once its
//! timeouts have passed and never hold up an agent's heartbeats.
//!
//! Run alone: `cargo test -p flotilla-e2e --test e2e -- hostile_clients::
//! --nocapture` prints the figures recorded in BENCHMARKS.md.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_e2e::driven::{beats_between, heartbeat_loop, percentiles, Driven};
use flotilla_e2e::procs::{Server, ServerOpts};
use flotilla_e2e::ui::Dashboard;
use flotilla_e2e::{fds, pg, scratch, tiles};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Clients of each kind.
const PER_KIND: usize = 300;
/// The server's header-read, stalled-write and stalled-body timeouts here
/// (30, 60 and 60 s by default), short so the test takes seconds.
const TIMEOUT_MS: u64 = 2_000;
/// A lease lives this long without a heartbeat (a fifth of the default);
/// heartbeats go every quarter second, so the leases are lost only if the
/// server leaves heartbeats unanswered for seconds.
const LEASE_TTL: Duration = Duration::from_secs(6);
const HEARTBEAT_EVERY: Duration = Duration::from_millis(250);

/// The two tests here load the machine on purpose; run one at a time even
/// when the harness runs tests in parallel.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A server with short HTTP timeouts (and `env`) on a fresh database; its
/// database URL.
async fn start_server(dir: &Path, env: &[(&str, &str)]) -> (Server, String) {
    let pg = pg::shared().await;
    let db = pg::fresh_database(pg).await;
    let database_url = pg.database_url(&db);
    let t = TIMEOUT_MS.to_string();
    let server = Server::start(
        dir,
        ServerOpts {
            database_url: database_url.clone(),
            store: dir.join("store").to_string_lossy().into_owned(),
            listen: "127.0.0.1:0".parse().expect("valid address"),
            lease_ttl_ms: LEASE_TTL.as_millis() as u64,
            backoff_base_ms: 200,
            env: vec![
                ("FLOTILLA_HEADER_READ_TIMEOUT_MS".into(), t.clone()),
                ("FLOTILLA_SEND_STALL_TIMEOUT_MS".into(), t.clone()),
                ("FLOTILLA_BODY_STALL_TIMEOUT_MS".into(), t),
                // 300 slow readers of one session's log stream: past the
                // stream caps (tested by
                // dashboard::live_streams_are_capped_per_token_and_in_all);
                // here the send-stall timeout must close them.
                ("FLOTILLA_MAX_STREAMS_PER_TOKEN".into(), "0".into()),
                ("FLOTILLA_MAX_STREAMS".into(), "0".into()),
            ]
            .into_iter()
            .chain(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .collect(),
        },
    )
    .await;
    (server, database_url)
}

/// Reads until the server closes the connection (or resets it); true if it
/// did within `within`.
async fn closed_by_server(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// A connection whose receive buffer is tiny, so that a response the client
/// does not read fills it at once.
async fn connect_small_window(addr: std::net::SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.set_recv_buffer_size(4096)?;
    s.connect(addr).await
}

/// The hostile clients, [`PER_KIND`] of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// (a) Connects and says nothing.
    Idle,
    /// (b) Sends half the headers, then nothing.
    HalfHeaders,
    /// (c) Sends part of a request (headers, or the headers and part of the
    /// body), then FIN.
    EarlyFin,
    /// (d) Starts the large download, reads a little, then resets.
    Reset,
    /// (e) Asks for the job's log stream and never reads.
    SlowLogReader,
    /// (e) Asks for the large download and never reads.
    SlowDownload,
}

impl Kind {
    const ALL: [Kind; 6] = [
        Kind::Idle,
        Kind::HalfHeaders,
        Kind::EarlyFin,
        Kind::Reset,
        Kind::SlowLogReader,
        Kind::SlowDownload,
    ];

    /// Whether the server must close this client's connection by itself,
    /// seen from the client (slow readers do not read, so cannot tell).
    fn watched(self) -> bool {
        matches!(self, Kind::Idle | Kind::HalfHeaders | Kind::EarlyFin)
    }
}

/// The two requests the attack repeats, raw.
struct Requests {
    download: String,
    log_stream: String,
}

/// Per kind of client: how many the server closed on its own; how many
/// clients could not even connect or send.
#[derive(Default)]
struct Tally {
    closed: Mutex<std::collections::BTreeMap<Kind, usize>>,
    refused: AtomicUsize,
}

/// Client `i` of `kind`. It keeps its socket until `hold` is notified, so
/// that what closes on the server's side closed because of the server.
async fn hostile_client(
    kind: Kind,
    i: usize,
    addr: std::net::SocketAddr,
    requests: Arc<Requests>,
    tally: Arc<Tally>,
    hold: Arc<tokio::sync::Notify>,
) {
    let held = hold.notified();
    let connected = match kind {
        Kind::SlowLogReader | Kind::SlowDownload => connect_small_window(addr).await,
        _ => TcpStream::connect(addr).await,
    };
    let Ok(mut s) = connected else {
        tally.refused.fetch_add(1, Ordering::SeqCst);
        return;
    };
    let sent = match kind {
        Kind::Idle => Ok(()),
        Kind::HalfHeaders => {
            s.write_all(b"GET /api/v1/jobs HTTP/1.1\r\nHost: x\r\nAuthor")
                .await
        }
        Kind::EarlyFin => {
            let part: &[u8] = if i % 2 == 1 {
                b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Le"
            } else {
                b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                  Content-Length: 1000\r\n\r\n{\"kind\":"
            };
            match s.write_all(part).await {
                Ok(()) => s.shutdown().await,
                Err(e) => Err(e),
            }
        }
        Kind::Reset => {
            let sent = s.write_all(requests.download.as_bytes()).await;
            let (mut got, mut buf) = (0, vec![0u8; 16 << 10]);
            while sent.is_ok() && got < 64 << 10 {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
            let _ = s.set_zero_linger();
            return;
        }
        Kind::SlowLogReader => s.write_all(requests.log_stream.as_bytes()).await,
        Kind::SlowDownload => s.write_all(requests.download.as_bytes()).await,
    };
    if sent.is_err() {
        tally.refused.fetch_add(1, Ordering::SeqCst);
        return;
    }
    if kind.watched() && closed_by_server(&mut s, Duration::from_millis(6 * TIMEOUT_MS)).await {
        *tally.closed.lock().unwrap().entry(kind).or_default() += 1;
    }
    held.await;
}

/// A request with a fresh random token: on the client API or, every
/// other one, the agent protocol.
fn bad_token_request(http: &reqwest::Client, base: &str, n: usize) -> reqwest::RequestBuilder {
    let req = if n % 2 == 1 {
        http.get(format!("{base}/api/v1/jobs"))
    } else {
        http.post(format!("{base}/api/agent/v1/heartbeat"))
            .json(&json!({"leases": []}))
    };
    req.bearer_auth(format!("flt_{}", uuid::Uuid::new_v4().simple()))
}

/// (f) Bad-token requests one after another while `running`; how each was
/// answered (a status, or `error`).
async fn flood_client(
    http: reqwest::Client,
    base: String,
    i: usize,
    running: Arc<AtomicBool>,
) -> std::collections::BTreeMap<String, usize> {
    let mut answers = std::collections::BTreeMap::new();
    let mut n = i;
    while running.load(Ordering::SeqCst) {
        let answer = match bad_token_request(&http, &base, n).send().await {
            Ok(r) => r.status().as_u16().to_string(),
            Err(_) => "error".to_string(),
        };
        *answers.entry(answer).or_default() += 1;
        n += 1;
    }
    answers
}

/// What the driven agent holds during the attack.
struct Held {
    /// A command job with a 600 KB log: the log stream's.
    log_job: String,
    log_lease: String,
    /// A tile job whose input `big.bin` (64 MiB) is the large download.
    tile_job: String,
    tile_lease: String,
}

async fn hold_two_leases(server: &Server, agent: &Driven, dir: &Path) -> Held {
    let api = server.api();
    let log_job = api
        .submit(json!({"kind": "command", "command": "true", "max_attempts": 1}))
        .await;
    let (_, log_lease) = agent.lease().await;
    let line = "x".repeat(999);
    for _ in 0..6 {
        let lines: Vec<Value> = (0..100)
            .map(|_| json!({"stream": "stdout", "line": line}))
            .collect();
        agent
            .api
            .post(
                &format!("/api/agent/v1/jobs/{log_job}/log"),
                json!({"lease_token": log_lease, "lines": lines}),
            )
            .await;
    }
    let ckpt = tiles::synth_ckpt(dir, tiles::TINY, 1);
    tiles::register_dataset(server, "synth", &ckpt).await;
    let made = api
        .post(
            "/api/v1/rois",
            json!({"name": "one", "year": 2024, "dataset": "synth",
                   "bbox": [0.01, 52.01, 0.09, 52.09]}),
        )
        .await;
    assert_eq!(made["submitted"], 1, "{made}");
    let (tile_job, tile_lease) = agent.lease().await;
    let inputs = dir.join("store/inputs/2024/grid_0.05_52.05");
    std::fs::create_dir_all(&inputs).expect("making the input prefix");
    std::fs::write(inputs.join("big.bin"), vec![7u8; 64 << 20]).expect("writing the big input");
    Held {
        log_job,
        log_lease,
        tile_job,
        tile_lease,
    }
}

/// A dashboard session's cookie (`name=value`), checked on `job`'s log
/// stream.
async fn dashboard_session(server: &Server, job: &str) -> String {
    let ui = Dashboard::login(server).await;
    let stream = ui
        .request(
            reqwest::Method::GET,
            &format!("/ui/jobs/{job}/log/stream?after=0"),
        )
        .send()
        .await
        .expect("opening the log stream");
    assert_eq!(stream.status(), 200, "the session opens the log stream");
    ui.cookie().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_clients_leave_no_descriptors_and_heartbeats_go_on() {
    let _alone = ONE_AT_A_TIME.lock().await;
    fds::raise_open_files_limit();
    let dir = scratch("e2e-hostile-");
    let (server, _) = start_server(dir.path(), &[]).await;
    let api = server.api();
    let addr = server.addr;
    let pid = server.pid();

    // An agent driven by the test holds two leases: a command job with a
    // 600 KB log (the log stream's slow readers) and a tile job whose
    // 64 MiB input file is the large download.
    let agent =
        Arc::new(Driven::register(&server, "steady", &["command", "tile"], LEASE_TTL).await);
    let began = Instant::now();
    let stop_beats = Arc::new(AtomicBool::new(false));
    let beats = heartbeat_loop(agent.clone(), HEARTBEAT_EVERY, stop_beats.clone());
    let held = hold_two_leases(&server, &agent, dir.path()).await;
    let cookie = dashboard_session(&server, &held.log_job).await;
    let requests = Arc::new(Requests {
        download: format!(
            "GET /api/agent/v1/jobs/{}/inputs/big.bin HTTP/1.1\r\n\
             Host: x\r\nAuthorization: Bearer {}\r\n{}: {}\r\n{}: {}\r\n\r\n",
            held.tile_job,
            agent.api.token,
            flotilla_core::protocol::INSTANCE_HEADER,
            agent.api.instance(),
            flotilla_core::protocol::LEASE_HEADER,
            held.tile_lease,
        ),
        log_stream: format!(
            "GET /ui/jobs/{}/log/stream?after=0 HTTP/1.1\r\nHost: x\r\n\
             Cookie: {cookie}\r\nAccept: text/event-stream\r\n\r\n",
            held.log_job
        ),
    });

    // Warm both pools to their size, so that connections the pools open
    // during the attack (and keep) are not counted as leaks. (Another agent
    // heartbeats: concurrent heartbeats for the same leases are not what an
    // agent sends.)
    let warm_agent = Arc::new(Driven::register(&server, "warm", &["command"], LEASE_TTL).await);
    let warm: Vec<_> = (0..200)
        .map(|i| {
            let api = api.clone();
            let agent = warm_agent.clone();
            tokio::spawn(async move {
                if i % 2 == 0 {
                    api.get("/api/v1/jobs?limit=1").await;
                } else {
                    let _ = agent.heartbeat().await;
                }
            })
        })
        .collect();
    for w in warm {
        w.await.expect("warm-up request");
    }
    // The warm-up's keep-alive connections close after the header timeout;
    // the heartbeats meanwhile are the quiet peer of those under attack.
    let quiet = Instant::now();
    tokio::time::sleep(Duration::from_millis(TIMEOUT_MS + 1_000)).await;
    let baseline = fds::open(pid);
    let baseline_http = fds::tcp_connections(pid, addr.port());

    // The attack.
    let attack = Instant::now();
    let tally = Arc::new(Tally::default());
    let hold = Arc::new(tokio::sync::Notify::new());
    let mut clients = Vec::new();
    for i in 0..PER_KIND {
        for kind in Kind::ALL {
            clients.push(tokio::spawn(hostile_client(
                kind,
                i,
                addr,
                requests.clone(),
                tally.clone(),
                hold.clone(),
            )));
        }
        // A burst, not a single instant: all 1,800 at once would only test
        // the kernel's accept queue (and this test's two cores).
        tokio::task::yield_now().await;
    }
    // (f) bad tokens, as fast as 300 clients can send them.
    let flooding = Arc::new(AtomicBool::new(true));
    let flood_http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("an HTTP client");
    let flood: Vec<_> = (0..PER_KIND)
        .map(|i| {
            tokio::spawn(flood_client(
                flood_http.clone(),
                server.url(),
                i,
                flooding.clone(),
            ))
        })
        .collect();

    // Watch the descriptors while the attack lasts: the flood for three
    // timeouts, then the log job ends (so streams that got all their data
    // end too) and the flood stops.
    let mut peak = baseline;
    let mut peak_http = baseline_http;
    let flood_for = Duration::from_millis(3 * TIMEOUT_MS);
    while attack.elapsed() < flood_for {
        peak = peak.max(fds::open(pid));
        peak_http = peak_http.max(fds::tcp_connections(pid, addr.port()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    flooding.store(false, Ordering::SeqCst);
    let mut answers = std::collections::BTreeMap::<String, usize>::new();
    for f in flood {
        for (answer, n) in f.await.expect("a flood client") {
            *answers.entry(answer).or_default() += n;
        }
    }
    agent
        .leases
        .lock()
        .unwrap()
        .retain(|(j, _)| *j != held.log_job);
    let ended = agent
        .api
        .raw(
            reqwest::Method::POST,
            &format!("/api/agent/v1/jobs/{}/complete", held.log_job),
            Some(json!({"lease_token": held.log_lease, "exit_code": 0})),
        )
        .await;

    // Once the timeouts have passed, the server holds about what it held
    // before (clients still hold their ends).
    let settle = Instant::now();
    let (mut after, mut after_http) = (fds::open(pid), fds::tcp_connections(pid, addr.port()));
    while after > baseline + 10 && settle.elapsed() < Duration::from_millis(10 * TIMEOUT_MS) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        peak = peak.max(fds::open(pid));
        (after, after_http) = (fds::open(pid), fds::tcp_connections(pid, addr.port()));
    }
    let settled_in = settle.elapsed();
    stop_beats.store(true, Ordering::SeqCst);
    let beats = beats.await.expect("the heartbeat loop");
    hold.notify_waiters();
    for c in clients {
        c.await.expect("a hostile client");
    }

    let end = Instant::now();
    let (latencies, failures) = beats_between(&beats, attack, end);
    let (_, all_failures) = beats_between(&beats, began, end);
    let (p50, p99, max) = percentiles(&latencies);
    let (quiet_latencies, _) = beats_between(&beats, quiet, attack);
    let (quiet_p50, quiet_p99, _) = percentiles(&quiet_latencies);
    println!(
        "hostile clients: {PER_KIND} each of {:?} and a bad-token flood; \
         timeouts {TIMEOUT_MS} ms\n\
         server fds: baseline {baseline}, peak {peak}, after {after} \
         (settled {settled_in:.1?} after the attack ended)\n\
         HTTP connections: baseline {baseline_http}, peak {peak_http}, after {after_http}\n\
         closed by the server: {:?} of {PER_KIND} each; {} clients could not connect\n\
         bad-token flood answers: {answers:?}\n\
         heartbeats during the attack: {} ok, {} failed; latency p50 {p50:.1?}, \
         p99 {p99:.1?}, max {max:.1?} (before it: p50 {quiet_p50:.1?}, p99 {quiet_p99:.1?}; \
         ratio p50 {:.1}, p99 {:.1}); failed heartbeats: {all_failures:?}",
        Kind::ALL,
        tally.closed.lock().unwrap(),
        tally.refused.load(Ordering::SeqCst),
        latencies.len(),
        failures.len(),
        p50.as_secs_f64() / quiet_p50.as_secs_f64(),
        p99.as_secs_f64() / quiet_p99.as_secs_f64(),
    );
    assert!(
        all_failures.is_empty(),
        "heartbeats failed: {all_failures:?}"
    );
    assert!(
        after <= baseline + 10,
        "the server holds {after} descriptors after the attack, {baseline} before \
         ({after_http} HTTP connections, {baseline_http} before)"
    );
    assert_eq!(
        tally.closed.lock().unwrap().values().sum::<usize>(),
        3 * PER_KIND,
        "the server closes idle, half-sent and half-closed connections itself"
    );
    assert!(
        answers.keys().all(|a| a == "401"),
        "every bad token gets 401: {answers:?}"
    );
    assert_eq!(
        ended,
        (200, json!({"state": "succeeded"})),
        "the log job succeeded at its first attempt"
    );
    let (s, v) = agent
        .api
        .raw(
            reqwest::Method::POST,
            &format!("/api/agent/v1/jobs/{}/fail", held.tile_job),
            Some(json!({"lease_token": held.tile_lease, "class": "fatal", "message": "done"})),
        )
        .await;
    assert_eq!(s, 200, "the tile job's lease held to the end: {v}");
}

/// 2,000 concurrent requests with distinct bad tokens, while every token
/// lookup is stuck behind a lock (a slow database, at its worst): they hold
/// at most the unknown-token gate's few connections, not the pool, and an
/// agent's heartbeats go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_token_flood_does_not_empty_the_pool() {
    let _alone = ONE_AT_A_TIME.lock().await;
    fds::raise_open_files_limit();
    let dir = scratch("e2e-bad-tokens-");
    let (server, database_url) = start_server(dir.path(), &[]).await;
    let agent = Arc::new(Driven::register(&server, "steady", &["command"], LEASE_TTL).await);
    let stop_beats = Arc::new(AtomicBool::new(false));
    let beats = heartbeat_loop(agent.clone(), HEARTBEAT_EVERY, stop_beats.clone());

    let db = sqlx::PgPool::connect(&database_url)
        .await
        .expect("connecting to the test database");
    let mut lock = db.begin().await.expect("a transaction");
    sqlx::query("LOCK TABLE api_tokens IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .expect("locking api_tokens");

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("an HTTP client");
    let flood: Vec<_> = (0..2_000)
        .map(|i| {
            let http = http.clone();
            let base = server.url();
            tokio::spawn(async move {
                match bad_token_request(&http, &base, i).send().await {
                    Ok(r) => r.status().as_u16(),
                    Err(_) => 0,
                }
            })
        })
        .collect();

    // While the lock holds, count the server's token lookups waiting on it.
    let mut most_waiting = 0i64;
    let locked = Instant::now();
    while locked.elapsed() < Duration::from_secs(4) {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'
               AND query LIKE '%api_tokens%'",
        )
        .fetch_one(&db)
        .await
        .expect("reading pg_stat_activity");
        most_waiting = most_waiting.max(n);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lock.rollback().await.expect("releasing the lock");
    let mut answers = std::collections::BTreeMap::<u16, usize>::new();
    for f in flood {
        *answers
            .entry(f.await.expect("a flood request"))
            .or_default() += 1;
    }
    stop_beats.store(true, Ordering::SeqCst);
    let beats = beats.await.expect("the heartbeat loop");
    let (latencies, failures) = beats_between(&beats, locked, Instant::now());
    let (p50, p99, max) = percentiles(&latencies);
    println!(
        "bad-token flood: 2000 distinct tokens with lookups stuck 4 s; \
         at most {most_waiting} lookups waited on the database at once; answers {answers:?}; \
         heartbeats {} ok, {} failed, latency p50 {p50:.1?}, p99 {p99:.1?}, max {max:.1?}",
        latencies.len(),
        failures.len()
    );
    assert!(
        most_waiting <= flotilla_server::auth::cache::UNKNOWN_LOOKUPS as i64,
        "{most_waiting} bad-token lookups held pool connections at once"
    );
    assert!(failures.is_empty(), "heartbeats failed: {failures:?}");
    assert!(max < LEASE_TTL / 2, "a heartbeat took {max:?}");
    assert_eq!(
        answers.get(&401),
        Some(&2_000),
        "every bad token gets 401: {answers:?}"
    );
}

/// At the connection cap the server stops accepting: a client past it waits
/// in the listen backlog and is served once a connection closes (here idle
/// ones, at the header timeout); it is never accepted and dropped, and the
/// server never holds more than the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_cap_clients_wait_their_turn() {
    let _alone = ONE_AT_A_TIME.lock().await;
    const CAP: usize = 20;
    let dir = scratch("e2e-cap-");
    let cap = CAP.to_string();
    let (server, _) = start_server(dir.path(), &[("FLOTILLA_MAX_CONNECTIONS", &cap)]).await;
    let (pid, port) = (server.pid(), server.addr.port());
    flotilla_e2e::eventually(
        "the harness's own connections to close",
        Duration::from_secs(10),
        || async { fds::tcp_connections(pid, port) == 0 },
    )
    .await;
    let mut idle = Vec::new();
    for _ in 0..CAP {
        idle.push(
            TcpStream::connect(server.addr)
                .await
                .expect("connecting below the cap"),
        );
    }
    flotilla_e2e::eventually(
        "the idle clients to be accepted",
        Duration::from_secs(5),
        || async { fds::tcp_connections(pid, port) == CAP },
    )
    .await;

    let start = Instant::now();
    let url = format!("{}/healthz", server.url());
    let late = tokio::spawn(async move { reqwest::get(url).await.map(|r| r.status()) });
    let mut most = 0;
    while !late.is_finished() {
        most = most.max(fds::tcp_connections(pid, port));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let waited = start.elapsed();
    let status = late
        .await
        .expect("the late client")
        .expect("served, not dropped");
    println!("connection cap {CAP}: the next client waited {waited:.1?}; at most {most} open");
    assert_eq!(status, 200);
    assert!(most <= CAP, "{most} connections open under a cap of {CAP}");
    assert!(
        waited >= Duration::from_millis(TIMEOUT_MS / 2),
        "served after {waited:?}: accepted past the cap"
    );
}
