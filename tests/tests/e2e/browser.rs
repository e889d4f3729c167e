//! The dashboard in a real browser: Debian's Chromium, headless, driven
//! through chromedriver (fantoccini) against a real server and a real agent
//! that ran real command and tile jobs. One server, one agent and one
//! browser serve every case, in order: log in through the form, the
//! overview updating without a reload, a job page that turns `succeeded` by
//! itself, cancel and drain from the pages, the ROI map's cells per state
//! against the API, no horizontal overflow at 390 px, keyboard reach, no
//! console error or CSP violation on any page, and a page whose live stream
//! the server refuses saying so. Every page is
//! screenshotted under `target/browser-screenshots/`.
//!
//! `readme_screenshots` (ignored; run it with `cargo test -p flotilla-e2e
//! --test e2e -- --ignored browser::readme_screenshots`) remakes the README's
//! pictures in `docs/screenshots/`.

#[path = "browser/chrome.rs"]
mod chrome;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chrome::{screenshot_dir, Browser, DESKTOP, PHONE};
use fantoccini::Locator;
use flotilla_e2e::procs::{opts_on_shared, Agent, Server};
use flotilla_e2e::{eventually, scratch, tiles};
use serde_json::{json, Value};

const AGENT: &str = "browser-agent";
const DATASET: &str = "synth";
const YEAR: i32 = 2024;

/// The server with one agent, a dataset and a first ROI under way, some
/// finished jobs, and a browser.
struct Fleet {
    _dir: tempfile::TempDir,
    server: Server,
    _agent: Agent,
    browser: Browser,
    /// The first ROI (6 tiles, one without inputs).
    roi: String,
    /// A job that wrote an output (its page has an outputs table).
    with_output: String,
}

async fn fleet(shots: PathBuf, env: &[(&str, &str)]) -> Fleet {
    let dir = scratch("e2e-browser-");
    let mut opts = opts_on_shared(dir.path(), 3_000).await;
    opts.env
        .extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let server = Server::start(dir.path(), opts).await;
    let browser = Browser::start(&server.url(), shots).await;
    let api = server.api();
    let ckpt = tiles::synth_ckpt(dir.path(), tiles::TINY, 11);
    tiles::register_dataset(&server, DATASET, &ckpt).await;
    // A 3 × 2 block at 0–0.3°E, 52.0–52.2°N; every tile has inputs but
    // the last, which fails.
    for (i, t) in [
        "grid_0.05_52.05",
        "grid_0.15_52.05",
        "grid_0.25_52.05",
        "grid_0.05_52.15",
        "grid_0.15_52.15",
    ]
    .iter()
    .enumerate()
    {
        tiles::synth_inputs(&server, t, 32, i as u64, &[YEAR]);
    }
    let agent = Agent::start(&server, AGENT, 2, &[]).await;
    let roi = api
        .post(
            "/api/v1/rois",
            json!({"name": "fens", "year": YEAR, "dataset": DATASET,
                   "bbox": [0.01, 52.01, 0.29, 52.19]}),
        )
        .await["id"]
        .as_str()
        .expect("an ROI id")
        .to_string();
    api.submit(json!({"kind": "command", "command": "echo hello from flotilla"}))
        .await;
    api.submit(
        json!({"kind": "command", "command": "echo about to fail; exit 3",
                      "max_attempts": 1}),
    )
    .await;
    let with_output = api
        .submit(json!({"kind": "command", "outputs": ["out/primes.txt"],
                       "command": "mkdir -p out && seq 2 100 | factor | awk 'NF == 2 {print $2}' > out/primes.txt"}))
        .await;
    Fleet {
        _dir: dir,
        server,
        _agent: agent,
        browser,
        roi,
        with_output,
    }
}

/// The API's state of job `id`.
async fn job_state(server: &Server, id: &str) -> String {
    server.api().job(id).await.state.to_string()
}

async fn wait_job_state(server: &Server, id: &str, state: &str) {
    eventually(
        &format!("job {id} to be {state}"),
        Duration::from_secs(60),
        || async move { job_state(server, id).await == state },
    )
    .await;
}

async fn agent_state(server: &Server) -> String {
    let v = server.api().get("/api/v1/agents").await;
    v["agents"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["name"] == AGENT))
        .and_then(|a| a["state"].as_str())
        .unwrap_or_else(|| panic!("no agent {AGENT}: {v}"))
        .to_string()
}

/// Case 1: The login form: a labelled input, a wrong token refused, the admin
/// token typed in leads to the overview.
async fn log_in(f: &Fleet) {
    let b = &f.browser;
    b.open("/ui").await;
    assert_eq!(b.path().await, "/ui/login", "no session: the login page");
    let label = b
        .js("const i = document.querySelector('input[name=token]'); \
             return i.labels.length ? i.labels[0].textContent.trim() : ''")
        .await;
    assert!(
        label.as_str().is_some_and(|l| !l.is_empty()),
        "the token input has no <label>: {label}"
    );
    b.shot("login").await;
    // The login page at a phone's width, as case 7 checks the others.
    b.resize(PHONE).await;
    let v = b
        .js("return [document.documentElement.scrollWidth, window.innerWidth]")
        .await;
    assert!(
        v[0].as_u64() <= v[1].as_u64(),
        "the login page at 390 px: {v}"
    );
    b.shot("login-390").await;
    b.resize(DESKTOP).await;
    let input = b
        .client
        .find(Locator::Css("input[name=token]"))
        .await
        .expect("the token input");
    input.send_keys("flt_wrong").await.expect("typing");
    b.click("form[action='/ui/login'] button").await;
    b.wait_js("the refusal", "return !!document.querySelector('.warn')")
        .await;
    // A refused login answers 401, which the console reports as a failed
    // load: that one is expected.
    let errors = b.console_errors("wrong token").await;
    assert!(
        errors.iter().all(|e| e.contains("401")),
        "console errors: {errors:#?}"
    );
    let input = b
        .client
        .find(Locator::Css("input[name=token]"))
        .await
        .expect("the token input");
    input
        .send_keys(&f.server.admin_token)
        .await
        .expect("typing the token");
    b.click("form[action='/ui/login'] button").await;
    b.wait_js(
        "the overview after login",
        "return location.pathname === '/ui' && !!document.getElementById('live')",
    )
    .await;
    b.assert_clean_console("login").await;
}

/// Case 2: The overview shows a job submitted after it was opened, without a
/// navigation (a marker set on `window` survives), and a selection made
/// before the update is still there after it.
async fn overview_is_live(f: &Fleet) {
    let b = &f.browser;
    b.open("/ui").await;
    b.js("window.flotillaMarker = 'kept'").await;
    let heading = b.text("#live h2").await;
    let before: u64 = heading
        .trim_start_matches("Jobs (")
        .trim_end_matches(')')
        .parse()
        .unwrap_or_else(|e| panic!("the jobs heading {heading:?}: {e}"));
    // An operator selects an agent's name to copy it: the updates that
    // follow must not take the selection away (a page that replaced its
    // panel at every update did).
    let selected = b
        .js(
            "const a = document.querySelector('#live tr[id^=\"agent-\"] td a'); \
             if (!a) return ''; \
             const r = document.createRange(); r.selectNodeContents(a); \
             const s = getSelection(); s.removeAllRanges(); s.addRange(r); \
             return s.toString()",
        )
        .await;
    assert_eq!(
        selected, AGENT,
        "selecting the agent's name on the overview"
    );
    let id = f
        .server
        .api()
        .submit(json!({"kind": "command", "command": "echo submitted while watched"}))
        .await;
    let tail = &id[id.len() - 8..];
    b.wait_js(
        "the new job on the overview",
        &format!(
            "const l = document.getElementById('live'); \
             return l.textContent.includes('{tail}') && \
                    l.querySelector('h2').textContent.trim() === 'Jobs ({})'",
            before + 1
        ),
    )
    .await;
    assert_eq!(
        b.js("return window.flotillaMarker").await,
        "kept",
        "the overview reloaded instead of updating"
    );
    assert_eq!(
        b.js("return getSelection().toString()").await,
        AGENT,
        "the update took away the text the operator had selected"
    );
    b.assert_clean_console("overview").await;
}

/// Case 3: A job page opened while the job runs turns `succeeded` by itself,
/// with its whole log once.
async fn job_page_follows_the_job(f: &Fleet) -> String {
    let b = &f.browser;
    let id = f
        .server
        .api()
        .submit(json!({"kind": "command",
                       "command": "for i in 1 2 3 4; do echo tick-$i; sleep 1; done"}))
        .await;
    wait_job_state(&f.server, &id, "running").await;
    b.open(&format!("/ui/jobs/{id}")).await;
    assert_eq!(b.text("h2 .state").await, "running");
    b.shot("job-running").await;
    b.wait_js(
        "the job page to say succeeded",
        "const s = document.querySelector('h2 .state'); \
         return !!s && s.textContent.trim() === 'succeeded'",
    )
    .await;
    assert_eq!(job_state(&f.server, &id).await, "succeeded");
    let log = b.text("#log").await;
    for i in 1..=4 {
        assert_eq!(
            log.matches(&format!("tick-{i}")).count(),
            1,
            "each line once: {log:?}"
        );
    }
    b.assert_clean_console("job page").await;
    id
}

/// Case 4: Cancel from a running job's page.
async fn cancel_from_the_page(f: &Fleet) -> String {
    let b = &f.browser;
    let id = f
        .server
        .api()
        .submit(json!({"kind": "command", "command": "sleep 300"}))
        .await;
    wait_job_state(&f.server, &id, "running").await;
    b.open(&format!("/ui/jobs/{id}")).await;
    b.click("form[action$='/cancel'] button").await;
    wait_job_state(&f.server, &id, "cancelled").await;
    b.wait_js(
        "the job page to say cancelled",
        "const s = document.querySelector('h2 .state'); \
         return !!s && s.textContent.trim() === 'cancelled'",
    )
    .await;
    b.assert_clean_console("cancel").await;
    id
}

/// Case 5: Drain the agent from `/ui/agents`.
async fn drain_from_the_page(f: &Fleet) {
    let b = &f.browser;
    b.open("/ui/agents").await;
    b.shot("agents-active").await;
    b.click(&format!("#agent-{AGENT} form[action$='/drain'] button"))
        .await;
    // The form posts, then the page comes back: the API follows the click.
    eventually(
        "the API to say draining or drained",
        Duration::from_secs(10),
        || async {
            let now = agent_state(&f.server).await;
            now == "draining" || now == "drained"
        },
    )
    .await;
    eventually(
        "the agent to be drained",
        Duration::from_secs(30),
        || async { agent_state(&f.server).await == "drained" },
    )
    .await;
    b.open("/ui/agents").await;
    assert_eq!(
        b.text(&format!("#agent-{AGENT} .agent-state")).await,
        "drained"
    );
    b.assert_clean_console("drain").await;
}

/// Case 6: An ROI page's map: as many cells per state, counted in the DOM, as
/// the API counts. Returns the counts.
async fn map_matches_the_api(f: &Fleet, roi: &str) -> Value {
    let b = &f.browser;
    b.open(&format!("/ui/rois/{roi}")).await;
    let api = f.server.api();
    let start = Instant::now();
    loop {
        let view = api.get(&format!("/api/v1/rois/{roi}")).await;
        let dom = b
            .js("const n = {}; \
                 for (const s of ['missing', 'queued', 'running', 'done', 'failed']) \
                   n[s] = document.querySelectorAll('#tilemap rect.t-' + s).length; \
                 n.all = document.querySelectorAll('#tilemap rect').length; \
                 return n")
            .await;
        let total: i64 = ["missing", "queued", "running", "done", "failed"]
            .iter()
            .map(|s| view["tiles"][s].as_i64().unwrap_or(-1))
            .sum();
        let same = ["missing", "queued", "running", "done", "failed"]
            .iter()
            .all(|s| dom[s] == view["tiles"][s])
            && dom["all"] == total;
        if same {
            b.assert_clean_console("ROI map").await;
            return view["tiles"].clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the map's cells {dom} against the API's {}",
            view["tiles"]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Case 7: At 390 px no page is wider than the window (wide tables scroll in
/// their own box). Screenshots each as `NAME-390`.
async fn fits_a_phone(f: &Fleet, pages: &[(&str, String)]) {
    let b = &f.browser;
    b.resize(PHONE).await;
    let mut wide = Vec::new();
    for (name, path) in pages {
        b.open(path).await;
        let v = b
            .js("return [document.documentElement.scrollWidth, window.innerWidth]")
            .await;
        let (scroll, inner) = (v[0].as_u64().unwrap_or(0), v[1].as_u64().unwrap_or(0));
        assert!(
            (300..=PHONE.0 as u64).contains(&inner),
            "the window is {inner} px wide, not a phone's"
        );
        if scroll > inner {
            wide.push(format!("{name} ({path}): {scroll} px in {inner}"));
        }
        b.shot(&format!("{name}-390")).await;
        b.assert_clean_console(&format!("{name} at 390 px")).await;
    }
    b.resize(DESKTOP).await;
    assert!(wide.is_empty(), "pages wider than a phone: {wide:#?}");
}

/// Case 8: Tab walks the header's links in order, then Log out (nothing before
/// them, nothing skipped); on a waiting job's page it reaches Cancel, on
/// the agents page the steer buttons.
async fn keyboard_reaches_the_controls(f: &Fleet, waiting_job: &str) {
    let b = &f.browser;
    b.open("/ui").await;
    // The header's controls in document order: the nav links, Log out.
    let header = b
        .js(
            "return Array.from(document.querySelectorAll('header a, header button')) \
               .map(e => e.tagName + ' ' + (e.getAttribute('href') || e.textContent.trim()))",
        )
        .await;
    let header: Vec<String> = serde_json::from_value(header).expect("a list of strings");
    assert!(
        header.len() >= 6,
        "the header's links and Log out: {header:?}"
    );
    assert_eq!(header[0], "A /ui");
    assert_eq!(header[header.len() - 1], "BUTTON Log out");
    let stops = b.tab_stops(header.len()).await;
    assert_eq!(stops, header, "the overview's first tab stops");
    // Past the header (its links and Log out), Cancel comes within a few.
    b.open(&format!("/ui/jobs/{waiting_job}")).await;
    // The fleet's one agent is drained: the page says why the job waits
    // (browser review of 3877596, M5).
    let why = b.text("#waiting-why").await;
    assert!(
        why.contains(
            "1 registered agent could take it, but none is answering, active and with disk room"
        ),
        "{why}"
    );
    let stops = b.tab_stops(header.len() + 4).await;
    assert!(
        stops.iter().any(|s| s == "BUTTON Cancel"),
        "Tab does not reach Cancel: {stops:?}"
    );
    b.open("/ui/agents").await;
    let stops = b.tab_stops(header.len() + 10).await;
    assert!(
        stops.iter().any(|s| s == "BUTTON resume"),
        "Tab does not reach the drained agent's resume: {stops:?}"
    );
    b.assert_clean_console("keyboard").await;
}

/// Case 10: a page whose live stream the server refuses (this login
/// already holds `--max-streams-per-token` streams, here opened by a
/// script with the browser's cookie) keeps what it shows and says its live
/// updates stopped; once those streams close, pages are live again.
async fn a_refused_stream_says_so(f: &Fleet, job: &str) {
    let b = &f.browser;
    let cookie = b
        .client
        .get_named_cookie("flotilla_session")
        .await
        .expect("the browser's session cookie");
    let cookie = format!("flotilla_session={}", cookie.value());
    let http = reqwest::Client::new();
    let url = format!("{}/ui/events", f.server.url());
    let mut held = Vec::new();
    loop {
        let r = http
            .get(&url)
            .header("cookie", &cookie)
            .send()
            .await
            .expect("the stream answers");
        if r.status() == 429 {
            break;
        }
        assert_eq!(r.status(), 200, "opening a stream");
        held.push(r);
        assert!(
            held.len() <= 32,
            "the session's 33rd stream was not refused"
        );
    }
    b.open(&format!("/ui/jobs/{job}")).await;
    b.wait_js(
        "the note that live updates stopped",
        "const p = document.getElementById('live-stopped'); \
         return !!p && p.textContent.startsWith('Live updates stopped')",
    )
    .await;
    assert!(
        !b.text("h1, h2").await.is_empty(),
        "the refused page still shows the job"
    );
    b.shot("live-stopped").await;
    let errors = b.console_errors("refused stream").await;
    assert!(
        !errors.is_empty() && errors.iter().all(|e| e.contains("429")),
        "console errors: {errors:#?}"
    );
    drop(held);
    let (http, url, cookie) = (&http, &url, &cookie);
    eventually(
        "the closed streams' slots given back",
        Duration::from_secs(30),
        move || async move {
            http.get(url)
                .header("cookie", cookie)
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
        },
    )
    .await;
    b.open(&format!("/ui/jobs/{job}")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        b.js("return !!document.getElementById('live-stopped')")
            .await,
        false,
        "a page opened under the cap says its updates stopped"
    );
    b.assert_clean_console("live again").await;
}

/// The server's count of open dashboard streams.
async fn streams_open(server: &Server) -> u64 {
    let text = server.api().metrics().await;
    text.lines()
        .find_map(|l| l.strip_prefix("flotilla_dashboard_streams "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no flotilla_dashboard_streams in {text}"))
}

/// A script that makes the page hidden or shown, as switching tabs does.
fn visibility(hidden: bool) -> String {
    format!(
        "Object.defineProperty(document, 'hidden', {{value: {hidden}, configurable: true}}); \
         document.dispatchEvent(new Event('visibilitychange')); return true"
    )
}

/// Case 11: a hidden tab gives its stream back (a browser holds six
/// connections to a server over HTTP/1.1, and every live tab held one, so
/// the seventh page hung), and shown again goes on from the last line it
/// had: every line of the job's log once, none lost while it was hidden.
async fn a_hidden_tab_gives_its_stream_back(f: &Fleet) {
    let b = &f.browser;
    f.server
        .api()
        .post(&format!("/api/v1/agents/{AGENT}/resume"), json!({}))
        .await;
    let id = f
        .server
        .api()
        .submit(json!({"kind": "command",
                       "command": "for i in $(seq 1 80); do echo line-$i; sleep 0.5; done"}))
        .await;
    wait_job_state(&f.server, &id, "running").await;
    b.open(&format!("/ui/jobs/{id}")).await;
    b.wait_js(
        "the first lines",
        "return document.getElementById('log').textContent.includes('line-2')",
    )
    .await;
    let server = &f.server;
    eventually(
        "the page's one stream",
        Duration::from_secs(15),
        move || async move { streams_open(server).await == 1 },
    )
    .await;
    b.js(&visibility(true)).await;
    eventually(
        "the hidden tab's stream closed",
        Duration::from_secs(12),
        move || async move { streams_open(server).await == 0 },
    )
    .await;
    let before = b.text("#log").await.lines().count();
    tokio::time::sleep(Duration::from_secs(2)).await;
    b.js(&visibility(false)).await;
    b.wait_js(
        "lines written while hidden, and after",
        &format!(
            "return document.getElementById('log').textContent.trim().split('\\n').length > {}",
            before + 6
        ),
    )
    .await;
    assert_eq!(
        streams_open(server).await,
        1,
        "shown, the page streams again"
    );
    let log = b.text("#log").await;
    let lines: Vec<&str> = log.lines().filter(|l| l.starts_with("line-")).collect();
    let want: Vec<String> = (1..=lines.len()).map(|i| format!("line-{i}")).collect();
    assert_eq!(lines, want, "each line once, in order: {log:?}");
    assert_eq!(
        job_state(&f.server, &id).await,
        "running",
        "the job outlived the check"
    );
    b.assert_clean_console("hidden and shown").await;
}

/// Case 12: an ROI page opened before any agent finished a tile (here: its
/// bars taken away, as such a page is rendered) draws an agent's bar when
/// the stream brings one, instead of "No agent has finished a tile yet"
/// beside tiles done. The stream is renewed by hiding and showing the tab,
/// whose first event carries the bars.
async fn roi_bars_appear_live(f: &Fleet) {
    let b = &f.browser;
    b.open(&format!("/ui/rois/{}", f.roi)).await;
    let bar = format!("#agents-chart g[data-agent='{AGENT}']");
    b.wait_js(
        "the agent's bar",
        &format!("return !!document.querySelector(\"{bar}\")"),
    )
    .await;
    b.js(
        "document.querySelectorAll('#agents-chart g').forEach((g) => g.remove()); \
          document.getElementById('agents-box').hidden = true; \
          document.getElementById('agents-none').hidden = false; return true",
    )
    .await;
    b.js(&visibility(true)).await;
    let server = &f.server;
    eventually(
        "the hidden ROI page's stream closed",
        Duration::from_secs(12),
        move || async move { streams_open(server).await == 0 },
    )
    .await;
    b.js(&visibility(false)).await;
    b.wait_js(
        "the bar drawn from the stream",
        &format!(
            "const g = document.querySelector(\"{bar}\"); \
             return !!g && !document.getElementById('agents-box').hidden \
               && document.getElementById('agents-none').hidden \
               && g.querySelector('.bar-value').textContent.includes('tile')"
        ),
    )
    .await;
    b.shot("roi-bars-live").await;
    b.assert_clean_console("ROI bars").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_in_chromium() {
    let started = Instant::now();
    let f = fleet(screenshot_dir(), &[]).await;
    let step = |n: &str| {
        println!(
            "browser: {n} ok at {:.1} s",
            started.elapsed().as_secs_f64()
        )
    };
    log_in(&f).await;
    step("1 login");
    overview_is_live(&f).await;
    f.browser.shot("overview").await;
    step("2 overview live");
    let done = job_page_follows_the_job(&f).await;
    f.browser.shot("job").await;
    step("3 job page turns succeeded");
    let cancelled = cancel_from_the_page(&f).await;
    step("4 cancel");
    tiles::wait_roi(
        &f.server,
        &f.roi,
        Duration::from_secs(120),
        Duration::from_millis(200),
    )
    .await;
    drain_from_the_page(&f).await;
    f.browser.shot("agents").await;
    step("5 drain");

    let first = map_matches_the_api(&f, &f.roi).await;
    assert_eq!(first["done"], 5, "{first}");
    assert_eq!(first["failed"], 1, "{first}");
    // A second ROI over the first and three tiles more, submitted to a
    // drained fleet: the first's done cells, and queued ones (the three new
    // tiles and the failed one again).
    let second = f
        .server
        .api()
        .post(
            "/api/v1/rois",
            json!({"name": "fens-north", "year": YEAR, "dataset": DATASET,
                   "bbox": [0.01, 52.01, 0.29, 52.29]}),
        )
        .await["id"]
        .as_str()
        .expect("an ROI id")
        .to_string();
    let counts = map_matches_the_api(&f, &second).await;
    f.browser.shot("roi-map").await;
    assert_eq!(counts["done"], 5, "{counts}");
    assert!(counts["queued"].as_i64() >= Some(3), "{counts}");
    f.browser.open("/ui/rois").await;
    f.browser.shot("rois").await;
    step("6 ROI map");

    let pages = vec![
        ("overview", "/ui".to_string()),
        ("jobs", "/ui/jobs".to_string()),
        ("job", format!("/ui/jobs/{done}")),
        ("job-outputs", format!("/ui/jobs/{}", f.with_output)),
        ("job-cancelled", format!("/ui/jobs/{cancelled}")),
        ("agents", "/ui/agents".to_string()),
        ("rois", "/ui/rois".to_string()),
        ("roi-map", format!("/ui/rois/{second}")),
        ("pipelines", "/ui/pipelines".to_string()),
        ("revdeps", "/ui/revdeps".to_string()),
        ("agent", format!("/ui/agents/{AGENT}")),
        ("alerts", "/ui/alerts".to_string()),
    ];
    for (name, path) in &pages {
        f.browser.open(path).await;
        f.browser.shot(name).await;
        f.browser.assert_clean_console(name).await;
    }
    fits_a_phone(&f, &pages).await;
    step("7 390 px");
    // The fleet is drained: a new job waits, and its page offers Cancel.
    let waiting = f
        .server
        .api()
        .submit(json!({"kind": "command", "command": "sleep 300"}))
        .await;
    keyboard_reaches_the_controls(&f, &waiting).await;
    step("8 keyboard, 9 console");
    a_refused_stream_says_so(&f, &waiting).await;
    step("10 a refused stream says so");
    a_hidden_tab_gives_its_stream_back(&f).await;
    step("11 a hidden tab gives its stream back");
    roi_bars_appear_live(&f).await;
    step("12 ROI bars drawn live");
    println!(
        "browser: screenshots in {} ({:.1} s in all)",
        f.browser.shots.display(),
        started.elapsed().as_secs_f64()
    );
}

/// The README's pictures, at a desktop size, after realistic work: jobs
/// done, failed and running (one printing a log), an agent paused with
/// work in hand, and an ROI partly done. Written to `docs/screenshots/`,
/// made smaller with `pngquant` when it is installed. Ignored: run it on
/// purpose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "remakes docs/screenshots; run with --ignored readme_screenshots"]
async fn readme_screenshots() {
    // A health sample per heartbeat (1 s here), so that the agent page's
    // charts have a line to show by the time of its picture.
    let f = fleet(
        screenshot_dir().join("readme"),
        &[("FLOTILLA_HEALTH_SAMPLE_INTERVAL_MS", "1000")],
    )
    .await;
    let started = Instant::now();
    let api = f.server.api();
    log_in(&f).await;
    for t in ["grid_0.05_52.25", "grid_0.15_52.25", "grid_0.25_52.25"] {
        tiles::synth_inputs(&f.server, t, 32, 7, &[YEAR]);
    }
    let north = api
        .post(
            "/api/v1/rois",
            json!({"name": "fens-north", "year": YEAR, "dataset": DATASET,
                   "bbox": [0.01, 52.21, 0.29, 52.29]}),
        )
        .await["id"]
        .as_str()
        .expect("an ROI id")
        .to_string();
    for roi in [&f.roi, &north] {
        tiles::wait_roi(
            &f.server,
            roi,
            Duration::from_secs(120),
            Duration::from_millis(200),
        )
        .await;
    }
    for cmd in [
        "make -C docs html",
        "python3 train.py --epochs 3",
        "echo ok",
    ] {
        api.submit(json!({"kind": "command", "command": format!("echo '$ {cmd}'; sleep 1")}))
            .await;
    }
    let ticking = api
        .submit(json!({"kind": "command", "command":
            "for i in $(seq 1 120); do echo \"epoch $i/120: loss $((1000 / i))e-3\"; sleep 1; done"}))
        .await;
    api.submit(json!({"kind": "command", "command": "sleep 600"}))
        .await;
    wait_job_state(&f.server, &ticking, "running").await;
    // Paused with two jobs running: the next ROI's new tiles wait.
    api.post(&format!("/api/v1/agents/{AGENT}/pause"), json!({}))
        .await;
    let wide = api
        .post(
            "/api/v1/rois",
            json!({"name": "fenland", "year": YEAR, "dataset": DATASET,
                   "bbox": [0.01, 52.01, 0.59, 52.39]}),
        )
        .await["id"]
        .as_str()
        .expect("an ROI id")
        .to_string();
    tokio::time::sleep(Duration::from_secs(8)).await;
    // Two minutes of samples: a short line at the charts' right end.
    if let Some(left) = Duration::from_secs(120).checked_sub(started.elapsed()) {
        tokio::time::sleep(left).await;
    }
    let b = &f.browser;
    b.resize(DESKTOP).await;
    let agent = format!("/ui/agents/{AGENT}");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/screenshots");
    std::fs::create_dir_all(&out).expect("making docs/screenshots");
    // Tall enough for the job page's log and the agent page's charts.
    for (name, path, height) in [
        ("overview", "/ui".to_string(), 800),
        ("job", format!("/ui/jobs/{ticking}"), 1350),
        ("roi-map", format!("/ui/rois/{wide}"), 800),
        ("agent", agent, 1100),
    ] {
        b.resize((DESKTOP.0, height)).await;
        b.open(&path).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let shot = b.shot(name).await;
        let dest = out.join(format!("{name}.png"));
        std::fs::copy(&shot, &dest).expect("copying a screenshot");
        // Best effort: 256 colours are plenty for a flat page.
        let _ = std::process::Command::new("pngquant")
            .args([
                "--force",
                "--skip-if-larger",
                "--ext",
                ".png",
                "--speed",
                "1",
            ])
            .arg(&dest)
            .status();
        let size = std::fs::metadata(&dest).expect("the screenshot").len();
        println!("browser: {} ({} KB)", dest.display(), size / 1024);
    }
}
