//! Prometheus against a real server: Debian's `prometheus` scrapes it with a
//! metrics token and the shipped alert rules while a real agent runs command
//! jobs (one failing) and a tile, and what its HTTP API reads back equals
//! what flotilla's API says; `promtool` passes the shipped rules (and their
//! unit tests) and scrape config; every metric the Grafana dashboard and the
//! rules name is one the server exports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use flotilla_core::job::{JobKind, JobState};
use flotilla_e2e::procs::{free_addr, server_on_shared, write_private, Agent, Server};
use flotilla_e2e::{eventually, scratch, tiles};
use serde_json::{json, Value};

const PROMETHEUS: &str = "/usr/bin/prometheus";
const PROMTOOL: &str = "/usr/bin/promtool";

/// A binary of Debian's `prometheus` package, or a failure naming it.
fn tool(path: &str) -> PathBuf {
    assert!(
        Path::new(path).is_file(),
        "{path} is missing: install Debian's `prometheus` package (it brings promtool too; \
         scripts/setup-debian.sh --test does)"
    );
    PathBuf::from(path)
}

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file)
}

/// Runs promtool with `args` in `dir`, failing with its output.
fn promtool(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new(tool(PROMTOOL))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running promtool");
    assert!(
        out.status.success(),
        "promtool {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A Prometheus on a free loopback port, scraping `server` every second
/// with `token`, evaluating the shipped rules every second; killed when
/// dropped.
struct Prometheus {
    url: String,
    http: reqwest::Client,
    log: PathBuf,
    _child: tokio::process::Child,
}

impl Prometheus {
    async fn start(dir: &Path, server: &Server, token: &str) -> Prometheus {
        let token_file = dir.join("prometheus.token");
        write_private(&token_file, token);
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {rules}\n\
                 scrape_configs:\n  - job_name: flotilla\n\
                 \x20   authorization:\n      type: Bearer\n      credentials_file: {token}\n\
                 \x20   static_configs:\n      - targets: [\"{target}\"]\n",
                rules = deploy("prometheus/alerts.yml").display(),
                token = token_file.display(),
                target = server.addr,
            ),
        )
        .expect("writing the Prometheus config");
        let addr = free_addr();
        let log = dir.join("prometheus.log");
        let child = tokio::process::Command::new(tool(PROMETHEUS))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("creating the Prometheus log"))
            .kill_on_drop(true)
            .spawn()
            .expect("starting prometheus");
        let prometheus = Prometheus {
            url: format!("http://{addr}"),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("an HTTP client"),
            log,
            _child: child,
        };
        let ready = format!("{}/-/ready", prometheus.url);
        let http = prometheus.http.clone();
        eventually("Prometheus to be ready", Duration::from_secs(60), || {
            let req = http.get(&ready).send();
            async move { matches!(req.await, Ok(r) if r.status().is_success()) }
        })
        .await;
        prometheus
    }

    /// `GET /api/v1/query`: the result, or the error Prometheus gave.
    async fn try_query(&self, q: &str) -> Result<Value, String> {
        let r = self
            .http
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", q)])
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let v: Value = r.json().await.map_err(|e| e.to_string())?;
        if v["status"] != "success" {
            return Err(format!("{q}: {v}"));
        }
        Ok(v["data"]["result"].clone())
    }

    /// An instant vector: each series' labels (without `__name__`) and value.
    async fn vector(&self, q: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        let result = self.try_query(q).await.unwrap_or_else(|e| self.fail(&e));
        result
            .as_array()
            .unwrap_or_else(|| self.fail(&format!("{q}: not a vector: {result}")))
            .iter()
            .map(|s| {
                let mut labels: BTreeMap<String, String> =
                    serde_json::from_value(s["metric"].clone()).expect("labels are strings");
                labels.remove("__name__");
                let v = s["value"][1].as_str().expect("a sample value");
                (labels, v.parse().expect("a number"))
            })
            .collect()
    }

    /// The one value of `q`, if it has exactly one series.
    async fn one(&self, q: &str) -> Option<f64> {
        match self.vector(q).await.as_slice() {
            [(_, v)] => Some(*v),
            _ => None,
        }
    }

    /// Waits until the single value of `q` satisfies `ok`.
    async fn until(&self, q: &str, ok: impl Fn(f64) -> bool) {
        let start = std::time::Instant::now();
        loop {
            let v = self.one(q).await;
            if v.is_some_and(&ok) {
                return;
            }
            if start.elapsed() > Duration::from_secs(60) {
                self.fail(&format!("{q} is {v:?} after 60 s"));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    fn fail(&self, what: &str) -> ! {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: String = log
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        panic!("{what}\n--- prometheus log (tail) ---\n{tail}");
    }
}

/// The API's count of jobs per (kind, state): what `flotilla_jobs` must say.
async fn api_job_counts(server: &Server) -> BTreeMap<(String, String), f64> {
    let api = server.api();
    let mut counts = BTreeMap::new();
    for kind in JobKind::ALL {
        for state in JobState::ALL {
            let list = api
                .get(&format!("/api/v1/jobs?kind={kind}&state={state}&limit=500"))
                .await;
            let n = list["jobs"].as_array().expect("a job list").len();
            counts.insert((kind.to_string(), state.to_string()), n as f64);
        }
    }
    counts
}

async fn metrics_token(server: &Server) -> String {
    let made = server
        .api()
        .post(
            "/api/v1/tokens",
            json!({"role": "metrics", "description": "prometheus"}),
        )
        .await;
    made["token"].as_str().expect("a token").to_string()
}

const TILE: &str = "grid_0.05_52.05";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_reads_what_the_api_says() {
    let dir = scratch("e2e-prometheus-");
    let server = server_on_shared(dir.path(), 5_000).await;
    let api = server.api();
    let token = metrics_token(&server).await;
    let (status, _) = api
        .with_token(&token)
        .raw(reqwest::Method::GET, "/api/v1/jobs", None)
        .await;
    assert_eq!(status, 403, "a metrics token reads /metrics only");

    // One tile of the tiny model, beside the command jobs.
    let ckpt = tiles::synth_ckpt(dir.path(), tiles::TINY, 7);
    tiles::register_dataset(&server, "synth", &ckpt).await;
    tiles::synth_inputs(&server, TILE, 40, 1, &[2024]);

    let prometheus = Prometheus::start(dir.path(), &server, &token).await;
    prometheus.until("up{job=\"flotilla\"}", |v| v == 1.0).await;

    let _agent = Agent::start(&server, "prom-agent", 2, &[]).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            api.submit(json!({"kind": "command", "command": "sleep 0.3", "max_attempts": 1}))
                .await,
        );
    }
    ids.push(
        api.submit(json!({"kind": "command", "command": "exit 3", "max_attempts": 1}))
            .await,
    );
    let roi = api
        .post(
            "/api/v1/rois",
            json!({"name": "one", "year": 2024, "dataset": "synth",
                   "bbox": [0.01, 52.01, 0.09, 52.09]}),
        )
        .await;
    assert_eq!(roi["submitted"], 1, "{roi}");
    for id in &ids {
        assert!(api
            .wait_final(id, Duration::from_secs(60))
            .await
            .state
            .is_final());
    }
    let roi_id = roi["id"].as_str().expect("an ROI id");
    let done = tiles::wait_roi(
        &server,
        roi_id,
        Duration::from_secs(120),
        Duration::from_millis(200),
    )
    .await;
    assert_eq!(done["jobs"]["succeeded"], 1, "{done}");

    // Jobs by state: every kind × state, zeros included, as the API counts.
    let expected = api_job_counts(&server).await;
    assert_eq!(expected[&("command".into(), "succeeded".into())], 3.0);
    assert_eq!(expected[&("command".into(), "failed".into())], 1.0);
    let start = std::time::Instant::now();
    loop {
        let seen: BTreeMap<(String, String), f64> = prometheus
            .vector("flotilla_jobs")
            .await
            .into_iter()
            .map(|(l, v)| ((l["kind"].clone(), l["state"].clone()), v))
            .collect();
        if seen == expected {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            prometheus.fail(&format!(
                "flotilla_jobs in Prometheus {seen:?}\n != the API's {expected:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Tiles done, as GET /api/v1/tiles/stats counts them.
    let stats = api.get("/api/v1/tiles/stats").await;
    let api_tiles = stats
        .as_array()
        .and_then(|a| a.iter().find(|r| r["agent"] == "prom-agent"))
        .map_or(0, |r| r["tiles_total"].as_i64().expect("tiles_total"));
    assert_eq!(api_tiles, 1, "{stats}");
    prometheus
        .until(
            "flotilla_agent_tiles_done_total{agent=\"prom-agent\"}",
            |v| v == api_tiles as f64,
        )
        .await;
    prometheus
        .until(
            "flotilla_agent_tiles_last_hour{agent=\"prom-agent\"}",
            |v| v == 1.0,
        )
        .await;
    // Tiles per hour as the API computes it (slots over the mean tile
    // time), positive once a tile is done; within 1 % of the API's, which
    // is read a moment apart.
    let per_hour = stats
        .as_array()
        .and_then(|a| a.iter().find(|r| r["agent"] == "prom-agent"))
        .and_then(|r| r["tiles_per_hour"].as_f64())
        .unwrap_or_else(|| panic!("no tiles_per_hour for prom-agent: {stats}"));
    assert!(per_hour > 0.0, "{stats}");
    prometheus
        .until("flotilla_agent_tiles_per_hour{agent=\"prom-agent\"}", |v| {
            (v - per_hour).abs() <= per_hour * 0.01
        })
        .await;

    // Attempts by kind and outcome, all combinations, zeros included; none
    // "in progress" among the counters (that is its own gauge).
    let attempts: BTreeMap<(String, String), f64> = prometheus
        .vector("flotilla_job_attempts_total")
        .await
        .into_iter()
        .map(|(l, v)| ((l["kind"].clone(), l["outcome"].clone()), v))
        .collect();
    assert_eq!(attempts.len(), JobKind::ALL.len() * 6, "{attempts:?}");
    for ((kind, outcome), v) in &attempts {
        let want = match (kind.as_str(), outcome.as_str()) {
            ("command", "succeeded") => 3.0,
            ("command", "failed") | ("tile", "succeeded") => 1.0,
            _ => 0.0,
        };
        assert_eq!(*v, want, "{kind} {outcome}: {attempts:?}");
    }
    assert_eq!(
        prometheus
            .one("sum(flotilla_job_attempts_in_progress)")
            .await,
        Some(0.0)
    );

    // Histograms: run time of the three succeeded commands on this agent
    // (each slept 0.3 s), and one lease wait per attempt.
    assert_eq!(
        prometheus
            .one("flotilla_job_duration_seconds_count{kind=\"command\",agent=\"prom-agent\"}")
            .await,
        Some(3.0)
    );
    let median = prometheus
        .one("histogram_quantile(0.5, flotilla_job_duration_seconds_bucket{kind=\"command\"})")
        .await
        .expect("a median");
    assert!(median > 0.25 && median < 10.0, "median run time {median}");
    assert_eq!(
        prometheus
            .one("sum(flotilla_job_lease_wait_seconds_count)")
            .await,
        Some(5.0)
    );

    // HTTP latency, labelled by route template, never by a job's path.
    prometheus
        .until(
            "sum(flotilla_http_request_duration_seconds_count{route=\"/api/v1/jobs/{id}\",method=\"GET\",code=\"200\"})",
            |v| v > 0.0,
        )
        .await;
    let routes: BTreeSet<String> = prometheus
        .vector("group by (route) (flotilla_http_request_duration_seconds_count)")
        .await
        .into_iter()
        .map(|(l, _)| l["route"].clone())
        .collect();
    assert!(routes.contains("/api/agent/v1/heartbeat"), "{routes:?}");
    for id in &ids {
        assert!(
            routes.iter().all(|r| !r.contains(id.as_str())),
            "a raw path as a route label: {routes:?}"
        );
    }

    // The agent's process, through its heartbeats; the server's own.
    for (q, min) in [
        ("flotilla_agent_process_open_fds{agent=\"prom-agent\"}", 3.0),
        ("flotilla_agent_process_max_fds{agent=\"prom-agent\"}", 64.0),
        (
            "flotilla_agent_process_resident_memory_bytes{agent=\"prom-agent\"}",
            1e6,
        ),
        (
            "flotilla_agent_process_cpu_seconds_total{agent=\"prom-agent\"}",
            0.0,
        ),
        ("process_open_fds{job=\"flotilla\"}", 3.0),
        ("process_max_fds{job=\"flotilla\"}", 64.0),
        ("process_resident_memory_bytes{job=\"flotilla\"}", 1e6),
        ("process_cpu_seconds_total{job=\"flotilla\"}", 0.0),
        ("time() - process_start_time_seconds{job=\"flotilla\"}", 0.0),
    ] {
        prometheus.until(q, |v| v > min && v < 1e12).await;
    }

    // What runs where: the server's build and each agent's version and
    // encoder, as info series (value 1, the facts in the labels).
    let build = prometheus
        .vector("flotilla_build_info{job=\"flotilla\"}")
        .await;
    assert_eq!(build.len(), 1, "{build:?}");
    assert_eq!(
        build[0].0["version"],
        env!("CARGO_PKG_VERSION"),
        "{build:?}"
    );
    assert_eq!(
        build[0].0["schema"],
        flotilla_server::serve::schema_version().to_string(),
        "{build:?}"
    );
    assert_eq!(build[0].1, 1.0);
    let info = prometheus
        .vector("flotilla_agent_info{agent=\"prom-agent\"}")
        .await;
    assert_eq!(info.len(), 1, "{info:?}");
    assert_eq!(info[0].0["version"], env!("CARGO_PKG_VERSION"), "{info:?}");
    let listed = api.get("/api/v1/agents").await;
    let listed = listed["agents"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["name"] == "prom-agent"))
        .cloned()
        .unwrap_or_else(|| panic!("prom-agent in {listed}"));
    assert_eq!(listed["version"], env!("CARGO_PKG_VERSION"), "{listed}");
    assert_eq!(
        info[0].0.get("encoder").map_or("", String::as_str),
        listed["devices"]["encoder"]["backend"]
            .as_str()
            .unwrap_or(""),
        "{info:?} {listed}"
    );

    // Pausing the agent changes its state gauge, not its series.
    api.post("/api/v1/agents/prom-agent/pause", json!({})).await;
    prometheus
        .until(
            "flotilla_agent_state{agent=\"prom-agent\",state=\"paused\"}",
            |v| v == 1.0,
        )
        .await;
    for name in ["flotilla_agent_up", "flotilla_agent_slots_in_use"] {
        let series = prometheus
            .try_query(&format!("{name}{{agent=\"prom-agent\"}}[10m]"))
            .await
            .unwrap_or_else(|e| prometheus.fail(&e));
        let series = series.as_array().expect("a matrix");
        assert_eq!(
            series.len(),
            1,
            "{name}: one series before and after the pause: {series:?}"
        );
        let labels: BTreeSet<&str> = series[0]["metric"]
            .as_object()
            .expect("labels")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            labels,
            BTreeSet::from(["__name__", "agent", "instance", "job"])
        );
    }

    // Counters never went down over the run.
    for (labels, resets) in prometheus
        .vector("resets(flotilla_job_attempts_total[10m])")
        .await
    {
        assert_eq!(resets, 0.0, "{labels:?} went down");
    }

    // The shipped rules evaluate against the real series without error.
    let rules = prometheus
        .http
        .get(format!("{}/api/v1/rules", prometheus.url));
    let rules: Value = rules
        .send()
        .await
        .expect("GET /api/v1/rules")
        .json()
        .await
        .expect("rules as JSON");
    let rules: Vec<&Value> = rules["data"]["groups"]
        .as_array()
        .expect("rule groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .collect();
    assert!(rules.len() >= 7, "{rules:?}");
    for rule in rules {
        assert_eq!(rule["health"], "ok", "{rule}");
    }

    // Every panel of the Grafana dashboard is a query Prometheus accepts,
    // and answers with data from this fleet.
    for (title, expr) in dashboard_exprs() {
        let result = prometheus
            .try_query(&expr)
            .await
            .unwrap_or_else(|e| prometheus.fail(&format!("panel {title:?}: {e}")));
        assert!(
            result.as_array().is_some_and(|r| !r.is_empty()),
            "panel {title:?}: {expr} has no data"
        );
    }
}

/// The shipped rules and their unit tests pass promtool, and so does the
/// shipped scrape config: as shipped for its syntax, and whole (its rule
/// files read) with the token file it names pointed at one that exists.
#[test]
fn promtool_passes_the_shipped_rules_and_config() {
    let shipped = deploy("prometheus");
    promtool(&shipped, &["check", "rules", "alerts.yml"]);
    promtool(&shipped, &["test", "rules", "alerts_test.yml"]);
    promtool(
        &shipped,
        &["check", "config", "--syntax-only", "flotilla.yml"],
    );

    let dir = scratch("e2e-promtool-");
    let token = dir.path().join("flotilla.token");
    write_private(&token, "flt_example");
    let config = std::fs::read_to_string(shipped.join("flotilla.yml")).expect("the config");
    let named = "/etc/prometheus/flotilla.token";
    assert!(config.contains(named), "the config names {named}");
    std::fs::write(
        dir.path().join("flotilla.yml"),
        config.replace(named, &token.display().to_string()),
    )
    .expect("writing the config");
    std::fs::copy(shipped.join("alerts.yml"), dir.path().join("alerts.yml"))
        .expect("copying the rules");
    promtool(dir.path(), &["check", "config", "flotilla.yml"]);
}

/// Every metric the dashboard's panels and the alert rules name is one
/// the server exports: renaming a metric without them fails here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_rules_name_only_exported_metrics() {
    let dir = scratch("e2e-prom-names-");
    let server = server_on_shared(dir.path(), 5_000).await;
    let api = server.api();
    let _agent = Agent::start(&server, "names-agent", 1, &[]).await;
    // A finished job, so that every family has samples.
    let id = api
        .submit(json!({"kind": "command", "command": "true", "max_attempts": 1}))
        .await;
    api.wait_final(&id, Duration::from_secs(30)).await;
    let token = metrics_token(&server).await;
    let text = reqwest::Client::new()
        .get(format!("{}/metrics", server.url()))
        .bearer_auth(&token)
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("the exposition");
    let exported: BTreeSet<String> = text
        .lines()
        .filter_map(|l| match l.strip_prefix("# TYPE ") {
            Some(t) => t.split(' ').next(),
            None if l.starts_with('#') => None,
            None => l.split(['{', ' ']).next(),
        })
        .map(str::to_owned)
        .collect();
    assert!(
        exported.contains("flotilla_job_duration_seconds_bucket"),
        "{text}"
    );

    let dashboard = dashboard_exprs();
    assert!(dashboard.len() >= 10);
    let rules = std::fs::read_to_string(deploy("prometheus/alerts.yml")).expect("the rules");
    let rules: String = rules
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let mut named = BTreeSet::new();
    for text in dashboard
        .iter()
        .map(|(_, e)| e.as_str())
        .chain([rules.as_str()])
    {
        named.extend(metric_names(text));
    }
    assert!(named.len() >= 15, "{named:?}");
    let missing: Vec<&String> = named.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "named by the dashboard or the rules but not exported: {missing:?}"
    );
}

/// (panel title, expression) of every query of the Grafana dashboard,
/// which must be a dashboard Grafana 10+ loads.
fn dashboard_exprs() -> Vec<(String, String)> {
    let path = deploy("grafana/flotilla.json");
    let text = std::fs::read_to_string(&path).expect("the dashboard");
    let d: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert!(
        d["schemaVersion"].as_i64().is_some_and(|v| v >= 36),
        "schemaVersion"
    );
    assert!(d["uid"].is_string() && d["title"].is_string());
    let mut exprs = Vec::new();
    let panels = d["panels"].as_array().expect("panels");
    for p in panels.iter().filter(|p| p["type"] != "row") {
        let title = p["title"].as_str().expect("a panel title").to_string();
        let targets = p["targets"].as_array().expect("a panel's targets");
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for t in targets {
            let expr = t["expr"].as_str().expect("a target's expr");
            exprs.push((title.clone(), expr.to_string()));
        }
    }
    exprs
}

/// The flotilla and process metric names in a PromQL text (recorded
/// series, which hold a `:`, are not exported and are left out).
fn metric_names(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| (t.starts_with("flotilla_") || t.starts_with("process_")) && !t.contains(':'))
        .map(str::to_owned)
        .collect()
}
