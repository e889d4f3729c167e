//! Each alert is raised by making its condition real, against one real
//! server and real agents, and seen where an operator looks: the API
//! (`/api/v1/alerts`), the dashboard's JSON (`/ui/alerts.json`, what every
//! page's banner shows) and page (`/ui/alerts`), and `/metrics`
//! (`flotilla_alert`).
//!
//! - disk_full: a 4 MiB tmpfs mounted as an agent's work directory and
//!   filled; the agent gets no lease while a job for it waits, and the
//!   reason is in the agents API, `flotilla agents` and `/ui/agents`; freed,
//!   it leases again. Needs root (to mount); skipped, saying so, otherwise.
//! - agent_lost: a real agent SIGKILLed; drained, the alert ends.
//! - queue_stalled: an agent process driven by the test that heartbeats but
//!   never asks for work while a job only it may take waits.
//! - job_time_drift: a real agent runs fast jobs, then slow ones of the
//!   same kind.
//! - open_files: a real agent started with a low soft open-file limit,
//!   holding inherited descriptors (as a leak would) over half of it.
//!
//! And nothing else: every alert seen along the way is one of these.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_e2e::driven::{heartbeat_loop, Driven};
use flotilla_e2e::procs::{opts_on_shared, write_private, Agent, Server};
use flotilla_e2e::ui::Dashboard;
use flotilla_e2e::{binary, eventually, scratch};
use serde_json::{json, Value};

/// The shortened settings: heartbeats every second (a 3 s lease TTL), so
/// an agent is silent after 3 s; a stall after 3 s; drift over 3 recent
/// jobs against at least 5 earlier ones; open files over half the limit
/// (so that the agent given a low limit keeps room to work).
const LEASE_TTL_MS: u64 = 3_000;
const SETTINGS: [(&str, &str); 5] = [
    ("FLOTILLA_ALERT_OPEN_FILES_FRACTION", "0.5"),
    ("FLOTILLA_ALERT_INTERVAL_MS", "300"),
    ("FLOTILLA_ALERT_STALL_AFTER_MS", "3000"),
    ("FLOTILLA_ALERT_DRIFT_RECENT", "3"),
    ("FLOTILLA_ALERT_DRIFT_HISTORY", "5"),
];

/// Where the test looks, and every (alert, subject) it saw there.
struct Views {
    server: Server,
    /// Requests without a session (a bearer token or none).
    http: reqwest::Client,
    ui: Dashboard,
    seen: Mutex<BTreeSet<(String, String)>>,
}

impl Views {
    async fn new(server: Server) -> Views {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(30))
            .build()
            .expect("an HTTP client");
        let ui = Dashboard::login(&server).await;
        Views {
            server,
            http,
            ui,
            seen: Mutex::new(BTreeSet::new()),
        }
    }

    fn note(&self, list: &[Value]) {
        let mut seen = self.seen.lock().unwrap();
        for a in list {
            seen.insert((
                a["alert"].as_str().unwrap_or("?").to_string(),
                a["subject"].as_str().unwrap_or("?").to_string(),
            ));
        }
    }

    /// `GET /api/v1/alerts`.
    async fn api(&self) -> Vec<Value> {
        let v = self.server.api().get("/api/v1/alerts").await;
        let list = v["alerts"].as_array().expect("alerts").clone();
        self.note(&list);
        list
    }

    /// `GET /ui/alerts.json` with the session.
    async fn ui(&self) -> Vec<Value> {
        let r = self
            .ui
            .request(reqwest::Method::GET, "/ui/alerts.json")
            .send()
            .await
            .expect("alerts.json");
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.expect("JSON");
        let list = v["alerts"].as_array().expect("alerts").clone();
        self.note(&list);
        list
    }

    async fn text(&self, path: &str, cookie: bool) -> String {
        let req = if cookie {
            self.ui.request(reqwest::Method::GET, path)
        } else {
            self.http
                .get(format!("{}{path}", self.server.url()))
                .bearer_auth(&self.server.admin_token)
        };
        let r = req.send().await.expect("a page");
        assert_eq!(r.status(), 200, "{path}");
        r.text().await.expect("text")
    }

    /// Whether `/metrics` has `flotilla_alert{alert=…,subject=…} 1`.
    async fn in_metrics(&self, alert: &str, subject: &str) -> bool {
        let text = self.text("/metrics", false).await;
        text.lines().any(|l| {
            l.starts_with("flotilla_alert{")
                && l.contains(&format!("alert=\"{alert}\""))
                && l.contains(&format!("subject=\"{subject}\""))
                && l.ends_with(" 1")
        })
    }

    /// The alert, once the API, the dashboard's JSON and page, and
    /// `/metrics` all show it.
    async fn shown(&self, alert: &str, subject: &str, within: Duration) -> Value {
        let found = Mutex::new(None);
        eventually(&format!("{alert} for {subject}"), within, || async {
            let api = self.api().await;
            let Some(a) = api
                .iter()
                .find(|a| a["alert"] == alert && a["subject"] == subject)
            else {
                return false;
            };
            *found.lock().unwrap() = Some(a.clone());
            true
        })
        .await;
        eventually(
            &format!("{alert} for {subject} on every view"),
            Duration::from_secs(5),
            || async {
                let ui = self.ui().await;
                ui.iter()
                    .any(|a| a["alert"] == alert && a["subject"] == subject)
                    && self.in_metrics(alert, subject).await
                    && self.text("/ui/alerts", true).await.contains(subject)
            },
        )
        .await;
        let a = found.into_inner().unwrap().expect("found");
        let message = a["message"].as_str().unwrap_or_default();
        assert!(message.len() > 40, "a sentence that says what to do: {a}");
        assert!(a["since"].is_string(), "since when: {a}");
        a
    }

    async fn gone(&self, alert: &str, subject: &str, within: Duration) {
        eventually(&format!("{alert} for {subject} to end"), within, || async {
            !self
                .api()
                .await
                .iter()
                .any(|a| a["alert"] == alert && a["subject"] == subject)
                && !self.in_metrics(alert, subject).await
        })
        .await;
    }

    async fn has(&self, alert: &str, subject: &str) -> bool {
        self.api()
            .await
            .iter()
            .any(|a| a["alert"] == alert && a["subject"] == subject)
    }

    async fn agent(&self, name: &str) -> Value {
        let v = self.server.api().get("/api/v1/agents").await;
        v["agents"]
            .as_array()
            .expect("agents")
            .iter()
            .find(|a| a["name"] == name)
            .cloned()
            .unwrap_or(Value::Null)
    }

    async fn online(&self, name: &str) {
        eventually(
            &format!("{name} online"),
            Duration::from_secs(30),
            || async { self.agent(name).await["online"] == true },
        )
        .await;
    }

    /// Drains an idle agent before it is stopped, as an operator retiring
    /// it would: a drained agent that goes silent is not lost.
    async fn retire(&self, name: &str) {
        let v = self
            .server
            .api()
            .post(&format!("/api/v1/agents/{name}/drain"), json!({}))
            .await;
        assert_eq!(v["state"], "drained", "{v}");
    }

    /// Submits `command` for `agent` alone (pinned by its name label).
    async fn submit_for(&self, agent: &str, command: &str) -> String {
        self.server
            .api()
            .submit(json!({"kind": "command", "command": command,
                           "labels": {"flotilla.agent": agent}}))
            .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_alert_is_raised_by_making_its_condition_real() {
    let started = Instant::now();
    let dir = scratch("alerts");
    let mut opts = opts_on_shared(dir.path(), LEASE_TTL_MS).await;
    opts.env = SETTINGS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let views = Views::new(Server::start(dir.path(), opts).await).await;
    assert!(views.api().await.is_empty(), "a fresh fleet has no alerts");
    // Every page carries the banner and its script (no inline script);
    // the JSON needs a session and refuses in the API's error shape.
    let overview = views.text("/ui", true).await;
    assert!(overview.contains(r#"<div id="alerts" role="status""#));
    assert!(overview.contains(r#"<script src="/ui/static/alerts.js""#));
    assert!(views
        .text("/ui/static/alerts.js", true)
        .await
        .contains("/ui/alerts.json"));
    let r = views
        .http
        .get(format!("{}/ui/alerts.json", views.server.url()))
        .send()
        .await
        .expect("alerts.json");
    assert_eq!(r.status(), 401);
    let body: Value = r.json().await.expect("a JSON error");
    assert_eq!(body["error"]["code"], "unauthorized", "{body}");
    assert!(views.text("/ui/alerts", true).await.contains("No alerts"));

    tokio::join!(
        disk_full(&views),
        agent_lost(&views),
        queue_stalled(&views),
        job_time_drift(&views),
        open_files(&views),
    );

    let allowed: BTreeSet<(String, String)> = [
        ("disk_full", "disk-a"),
        ("agent_lost", "lost-a"),
        ("queue_stalled", "stall-a"),
        // Its heartbeats stop at the end, holding the lease it took.
        ("agent_lost", "stall-a"),
        ("job_time_drift", "drift-a/command"),
        ("open_files", "fds-a"),
    ]
    .iter()
    .map(|(a, s)| (a.to_string(), s.to_string()))
    .collect();
    let seen = views.seen.lock().unwrap().clone();
    let unexpected: Vec<_> = seen.difference(&allowed).collect();
    assert!(
        unexpected.is_empty(),
        "alerts without their condition: {unexpected:?}"
    );
    eprintln!("alerts: all five in {:?}", started.elapsed());
}

/// Unmounts a tmpfs when dropped (a failed test leaves no mount behind).
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Mounts a 4 MiB tmpfs at `dir`, or says why not.
fn mount_tmpfs(dir: &Path) -> Result<Mounted, String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("not root: mounting a tmpfs needs root".into());
    }
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let out = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(dir)
        .output()
        .map_err(|e| format!("running mount: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mount -t tmpfs failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(Mounted(dir.to_path_buf()))
}

async fn disk_full(v: &Views) {
    let name = "disk-a";
    let work = v.server.dir.join("agents").join(name);
    let _mounted = match mount_tmpfs(&work) {
        Ok(m) => m,
        Err(why) => {
            eprintln!("alerts: skipping disk_full ({why})");
            return;
        }
    };
    let mut agent = Agent::start(&v.server, name, 2, &[]).await;
    v.online(name).await;
    let first = v.submit_for(name, "echo room").await;
    let done = v
        .server
        .api()
        .wait_final(&first, Duration::from_secs(20))
        .await;
    assert_eq!(done.state.as_str(), "succeeded");
    assert!(!v.has("disk_full", name).await);

    // 3.8 of 4 MiB: 95 % used.
    let fill = work.join("fill");
    std::fs::write(&fill, vec![7u8; 3_900 * 1024]).expect("filling the tmpfs");
    let alert = v.shown("disk_full", name, Duration::from_secs(15)).await;
    assert!(
        alert["message"].as_str().unwrap().contains("no new jobs"),
        "{alert}"
    );
    let refused = v.agent(name).await["lease_refused"].clone();
    assert!(
        refused.as_str().is_some_and(|r| r.contains("disk")),
        "the agents API says why it gets no work: {refused}"
    );
    let waiting = v.submit_for(name, "echo after").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let job = v.server.api().job(&waiting).await;
    assert_eq!(
        job.state.as_str(),
        "queued",
        "no lease to an agent whose disk is full"
    );
    let agents_page = v.text("/ui/agents", true).await;
    assert!(
        agents_page.contains("not leasing:"),
        "/ui/agents says why it takes no work"
    );
    let cli = tokio::process::Command::new(binary("flotilla"))
        .args(["agents", "--server", &v.server.url(), "--token-file"])
        .arg(v.server.dir.join("admin.token"))
        .stdin(Stdio::null())
        .output()
        .await
        .expect("running flotilla agents");
    let listing = String::from_utf8_lossy(&cli.stdout);
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with(name) && l.contains("NOT LEASING")),
        "`flotilla agents` says why: {listing}"
    );

    std::fs::remove_file(&fill).expect("freeing the tmpfs");
    let job = v
        .server
        .api()
        .wait_final(&waiting, Duration::from_secs(15))
        .await;
    assert_eq!(job.state.as_str(), "succeeded", "it leases again");
    v.gone("disk_full", name, Duration::from_secs(10)).await;
    assert!(v.agent(name).await["lease_refused"].is_null());
    v.retire(name).await;
    agent.terminate().await;
}

async fn agent_lost(v: &Views) {
    let name = "lost-a";
    let mut agent = Agent::start(&v.server, name, 1, &[]).await;
    v.online(name).await;
    assert!(!v.has("agent_lost", name).await);
    agent.kill().await;
    let alert = v.shown("agent_lost", name, Duration::from_secs(20)).await;
    assert_eq!(alert["severity"], "critical");
    // An operator who retires it drains it: no longer lost.
    v.retire(name).await;
    v.gone("agent_lost", name, Duration::from_secs(10)).await;
}

async fn queue_stalled(v: &Views) {
    let name = "stall-a";
    let driven =
        Arc::new(Driven::register(&v.server, name, &["command"], Duration::from_secs(10)).await);
    let stop = Arc::new(AtomicBool::new(false));
    let beats = heartbeat_loop(driven.clone(), Duration::from_millis(500), stop.clone());
    let job = v.submit_for(name, "echo stuck").await;
    // Not before the window (3 s) has passed.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!v.has("queue_stalled", name).await);
    let alert = v
        .shown("queue_stalled", name, Duration::from_secs(15))
        .await;
    assert!(
        alert["message"]
            .as_str()
            .unwrap()
            .contains("leased nothing"),
        "{alert}"
    );
    // It takes the job: the stall is over.
    let (leased, _) = driven.lease().await;
    assert_eq!(leased, job);
    v.gone("queue_stalled", name, Duration::from_secs(10)).await;
    stop.store(true, Ordering::SeqCst);
    let beats = beats.await.expect("heartbeats");
    assert!(beats.iter().all(|(_, b)| b.is_ok()), "{beats:?}");
}

async fn job_time_drift(v: &Views) {
    let name = "drift-a";
    let mut agent = Agent::start(&v.server, name, 3, &[]).await;
    v.online(name).await;
    let subject = format!("{name}/command");
    // A history of 6 steady jobs, then 3 recent ones like it: no drift.
    for batch in [6, 3] {
        let jobs = futures_of(v, name, STEADY_JOB, batch).await;
        for j in jobs {
            let done = v.server.api().wait_final(&j, Duration::from_secs(20)).await;
            assert_eq!(done.state.as_str(), "succeeded");
        }
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let drifted: Vec<Value> = v
        .api()
        .await
        .into_iter()
        .filter(|a| a["alert"] == "job_time_drift" && a["subject"] == subject.as_str())
        .collect();
    assert!(drifted.is_empty(), "steady jobs do not drift: {drifted:?}");
    // Then 3 that take 4 times as long.
    for j in futures_of(v, name, SLOW_JOB, 3).await {
        let done = v.server.api().wait_final(&j, Duration::from_secs(20)).await;
        assert_eq!(done.state.as_str(), "succeeded");
    }
    let alert = v
        .shown("job_time_drift", &subject, Duration::from_secs(10))
        .await;
    assert!(
        alert["message"].as_str().unwrap().contains("median"),
        "{alert}"
    );
    v.retire(name).await;
    agent.terminate().await;
}

/// The jobs of `job_time_drift`: steady ones, then ones 4 times as long,
/// against the default factor of 2. A job's time is what the server
/// records, from the agent's start report to its completion, so it carries
/// the agent's spawning and reporting as well as the command: on a loaded
/// 2-core machine a `sleep 0.05` measured from 0.056 to 0.245 s, and three
/// such jobs' median doubled with nothing about the jobs changed. With
/// 1 s jobs a false drift needs over a second of extra overhead on two of
/// the three recent ones, and a missed one an earlier median over 2 s.
const STEADY_JOB: &str = "sleep 1";
const SLOW_JOB: &str = "sleep 4";

/// Submits `n` copies of `command` for `agent`, one after another so that
/// their leases keep that order.
async fn futures_of(v: &Views, agent: &str, command: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(v.submit_for(agent, command).await);
    }
    ids
}

/// The soft open-file limit of the agent in `open_files`, and how many
/// descriptors it is started holding (copies of its stdin, as a leak would
/// hold them). An idle agent holds 10 to 13 of its own (measured: 0–2,
/// its epoll and eventfd, one or two pooled connections to the server,
/// and whatever the test process lets it inherit), and how many depends on
/// the machine and the moment, so its own would sit on half of a limit set
/// just above them; with the held ones it has 26 to 29 open, well over
/// half of 40, with 11 to spare.
const LOW_NOFILE: u64 = 40;
const HELD_FDS: u64 = 16;

async fn open_files(v: &Views) {
    let name = "fds-a";
    let mut agent = start_with_nofile(&v.server, name, LOW_NOFILE, HELD_FDS).await;
    v.online(name).await;
    eprintln!(
        "alerts: {name} reports {} of {} open files",
        v.agent(name).await["health"]["open_fds"],
        v.agent(name).await["health"]["max_fds"]
    );
    let alert = v.shown("open_files", name, Duration::from_secs(15)).await;
    let health = v.agent(name).await["health"].clone();
    assert_eq!(health["max_fds"], LOW_NOFILE, "{health}");
    assert!(
        health["open_fds"]
            .as_u64()
            .is_some_and(|n| n > HELD_FDS + 2),
        "the held descriptors are counted with its own: {health}"
    );
    assert!(
        alert["message"].as_str().unwrap().contains("open files"),
        "{alert}"
    );
    v.retire(name).await;
    let _ = agent.kill().await;
}

/// `flotilla-agent` for `name` with its soft `RLIMIT_NOFILE` set to `soft`
/// before it starts (as `ulimit -n` would), holding `held` more copies of
/// its stdin from the start.
async fn start_with_nofile(
    server: &Server,
    name: &str,
    soft: u64,
    held: u64,
) -> tokio::process::Child {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let token = server.api().agent_token(name).await;
    let agents = server.dir.join("agents");
    let workdir = agents.join(name);
    std::fs::create_dir_all(&workdir).expect("agent workdir");
    let token_file = agents.join(format!("{name}.token"));
    write_private(&token_file, &token);
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let mut cmd = tokio::process::Command::new(binary("flotilla-agent"));
    cmd.arg("--server")
        .arg(server.url())
        .arg("--token-file")
        .arg(&token_file)
        .arg("--name")
        .arg(name)
        .arg("--capacity")
        .arg("1")
        .arg("--workdir")
        .arg(&workdir)
        .env("FLOTILLA_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    // SAFETY: dup and setrlimit are async-signal-safe; nothing else runs
    // between fork and exec. A dup is not close-on-exec, so the agent
    // keeps them.
    unsafe {
        cmd.pre_exec(move || {
            for _ in 0..held {
                nix::unistd::dup(0)?;
            }
            setrlimit(Resource::RLIMIT_NOFILE, soft, hard).map_err(std::io::Error::from)
        });
    }
    cmd.spawn().expect("spawning flotilla-agent")
}
