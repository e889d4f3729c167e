//! What the per-submitter waiting cap (`--max-waiting-per-submitter`, review
//! H7) costs a submission over HTTP, against its peer in the same run: the
//! same submissions by an admin token, which the cap exempts (no lock, no
//! probe, no count), to the same server process on the same database.
//!
//! 1. Far from the cap: a client token whose submitter already has
//!    SUBMIT_BACKLOG (default 100,000) jobs waiting, and an admin, each
//!    submit SUBMIT_JOBS (default 2,000) single no-op jobs from
//!    SUBMIT_CONCURRENCY (default 8) tasks, in alternating rounds of 250 so
//!    that neither gets a warmer server. The client's check is the span of
//!    its fair-share tags (two index probes) under its transaction lock.
//! 2. At the cap: the server restarted with the cap at SUBMIT_BACKLOG, so
//!    every client submission is refused with 429: from the server's memory
//!    of its last refusal (`CapRefusals`, a second), else after the
//!    submitter's lock and a count of its waiting jobs (stopping at cap +
//!    1); its latency against the admin's accepted submissions, alternating
//!    the same way. This is what a client that keeps submitting past its
//!    cap costs per request.
//!
//! `cargo bench -p flotilla-e2e --bench submit_cap` (builds the server in
//! the bench profile first: `cargo build --release --bins`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_core::api::TokenRole;
use flotilla_e2e::procs::{Server, ServerOpts};
use flotilla_server::queue::submit;
use flotilla_server::{auth, serve};
use serde_json::json;

const CLIENT: &str = "capped-client";
const ROUND: usize = 250;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// One token's submissions: their latencies, the wall time they took, and
/// how many got each status.
#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    wall: Duration,
    statuses: BTreeMap<u16, usize>,
}

impl Tally {
    fn rate(&self) -> f64 {
        self.latencies.len() as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    fn line(&mut self, who: &str) -> String {
        self.latencies.sort();
        // At the cap: the answers that waited on a count (the lock's queue
        // or the count itself), against those from a remembered refusal.
        let slow = self
            .latencies
            .iter()
            .filter(|l| **l > Duration::from_millis(50))
            .count();
        format!(
            "{who:<28} {:8.0} req/s  p50 {:>8.2?}  p99 {:>8.2?}  over 50 ms {slow}  statuses {:?}",
            self.rate(),
            percentile(&self.latencies, 0.5),
            percentile(&self.latencies, 0.99),
            self.statuses
        )
    }
}

/// `n` submissions of one no-op job each with `token`, from `concurrency`
/// tasks at once.
async fn round(
    http: &reqwest::Client,
    base: &Arc<String>,
    token: &Arc<String>,
    n: usize,
    concurrency: usize,
    tally: &mut Tally,
) {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let share = n / concurrency + usize::from(t < n % concurrency);
        let (http, base, token) = (http.clone(), base.clone(), token.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::with_capacity(share);
            for _ in 0..share {
                let t0 = Instant::now();
                let r = http
                    .post(format!("{base}/api/v1/jobs"))
                    .bearer_auth(token.as_str())
                    .json(&json!({"kind": "command", "command": "true"}))
                    .send()
                    .await
                    .expect("the server answers");
                let status = r.status().as_u16();
                let _ = r.bytes().await;
                out.push((t0.elapsed(), status));
            }
            out
        }));
    }
    for task in tasks {
        for (lat, status) in task.await.expect("a submitting task") {
            tally.latencies.push(lat);
            *tally.statuses.entry(status).or_default() += 1;
        }
    }
    tally.wall += start.elapsed();
}

/// The client and the admin submitting `n` jobs each, alternating rounds.
async fn alternate(
    server: &Server,
    client: &Arc<String>,
    n: usize,
    concurrency: usize,
) -> (Tally, Tally) {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()
        .expect("an HTTP client");
    let base = Arc::new(server.url());
    let admin = Arc::new(server.admin_token.clone());
    // Connections and the token caches warmed for both, untimed.
    let mut warm = Tally::default();
    round(&http, &base, client, concurrency, concurrency, &mut warm).await;
    round(&http, &base, &admin, concurrency, concurrency, &mut warm).await;
    let (mut c, mut a) = (Tally::default(), Tally::default());
    let mut done = 0;
    while done < n {
        let k = ROUND.min(n - done);
        round(&http, &base, client, k, concurrency, &mut c).await;
        round(&http, &base, &admin, k, concurrency, &mut a).await;
        done += k;
    }
    (c, a)
}

async fn start(dir: &std::path::Path, database_url: String, cap: Option<usize>) -> Server {
    let mut env = vec![];
    if let Some(cap) = cap {
        env.push((
            "FLOTILLA_MAX_WAITING_PER_SUBMITTER".to_string(),
            cap.to_string(),
        ));
    }
    Server::start(
        dir,
        ServerOpts {
            database_url,
            store: dir.join("store").to_string_lossy().into_owned(),
            listen: "127.0.0.1:0".parse().expect("an address"),
            lease_ttl_ms: 60_000,
            backoff_base_ms: 1000,
            env,
        },
    )
    .await
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let backlog = env_or("SUBMIT_BACKLOG", 100_000);
    let n = env_or("SUBMIT_JOBS", 2_000);
    let concurrency = env_or("SUBMIT_CONCURRENCY", 8).max(1);
    let pg = flotilla_e2e::pg::shared().await;
    let name = flotilla_e2e::pg::fresh_database(pg).await;
    let db = serve::connect(pg.connect_options(&name), Duration::from_secs(10))
        .await
        .expect("the bench database");
    serve::migrate(&db).await.expect("migrations");
    let t0 = Instant::now();
    for chunk in flotilla_e2e::noop_jobs(backlog, CLIENT).chunks(50_000) {
        submit::submit(&db, chunk).await.expect("the backlog");
    }
    // As a long-running server's autovacuum would have by now.
    sqlx::query("ANALYZE jobs")
        .execute(&db)
        .await
        .expect("ANALYZE");
    eprintln!("backlog of {backlog} queued in {:.1?}", t0.elapsed());
    let (_, client) = auth::create_token(&db, TokenRole::Client, None, Some(CLIENT))
        .await
        .expect("a client token");
    let client = Arc::new(client);

    let dir = flotilla_e2e::scratch("bench-submit-cap-");
    let far = {
        let server = start(dir.path(), pg.database_url(&name), None).await;
        alternate(&server, &client, n, concurrency).await
    };
    // The same database, the cap now at the client's backlog: every client
    // submission is past it.
    let at = {
        let server = start(dir.path(), pg.database_url(&name), Some(backlog)).await;
        alternate(&server, &client, n, concurrency).await
    };

    println!(
        "submission cost of the waiting cap: {n} single-job submissions per token and run, \
         {concurrency} at once, alternating rounds of {ROUND}"
    );
    report(
        &format!("1. far from the cap (client has {backlog} waiting and adds {n}; the server's default cap):"),
        "client (span check)",
        far,
    );
    report(
        &format!("2. at the cap (cap {backlog}; each client submission refused, 429):"),
        "client (refused)",
        at,
    );
}

/// One run's lines: the client's tally, the admin's, and their ratios.
fn report(title: &str, client: &str, (mut c, mut a): (Tally, Tally)) {
    println!("{title}");
    println!("   {}", c.line(client));
    println!("   {}", a.line("admin (exempt, the peer)"));
    println!(
        "   client / admin: rate {:.2}, p50 {:.2}",
        c.rate() / a.rate(),
        percentile(&c.latencies, 0.5).as_secs_f64() / percentile(&a.latencies, 0.5).as_secs_f64()
    );
}
