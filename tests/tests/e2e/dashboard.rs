//! The dashboard needs a login, shows agents and jobs once logged in, and
//! `/metrics` exposes the queue to Prometheus.

use std::time::Duration;

use flotilla_core::job::JobState;
use flotilla_e2e::procs::{opts_on_shared, server_on_shared, Agent, Server};
use flotilla_e2e::scratch;
use flotilla_e2e::ui::Dashboard;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_requires_login_and_metrics_report_the_queue() {
    let dir = scratch("e2e-ui-");
    let server = server_on_shared(dir.path(), 5_000).await;
    let api = server.api();
    let _agent = Agent::start(&server, "ui-agent", 1, &[]).await;
    let id = api
        .submit(
            json!({"kind": "command", "command": "echo 'line <one>'; exit 3", "max_attempts": 1}),
        )
        .await;
    assert_eq!(
        api.wait_final(&id, Duration::from_secs(30)).await.state,
        JobState::Failed
    );

    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let url = server.url();
    // Without a session: sent to the login page.
    let r = http.get(format!("{url}/ui")).send().await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/ui/login");
    // A wrong token is refused.
    let r = http
        .post(format!("{url}/ui/login"))
        .form(&[("token", "flt_wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // A valid token posted from another site's form is refused, and no
    // session is opened: the login form carries no form token, so the
    // browser's word on where it came from is what stops login CSRF.
    for (header, value) in [
        ("sec-fetch-site", "cross-site"),
        ("origin", "https://evil.example"),
    ] {
        let r = http
            .post(format!("{url}/ui/login"))
            .header(header, value)
            .form(&[("token", server.admin_token.as_str())])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{header}: {value}");
        assert!(
            r.headers().get("set-cookie").is_none(),
            "{header}: a session opened"
        );
        let page = r.text().await.unwrap();
        assert!(page.contains("Refused: "), "{header}: {page}");
    }
    // A browser's own form on plain HTTP (no Sec-Fetch-Site there but on
    // localhost) sends its origin, which passes; it sends one only because
    // the pages' referrer policy keeps it for same-origin requests
    // (`no-referrer` makes it `null`, which the login must refuse).
    let r = http
        .post(format!("{url}/ui/login"))
        .header("origin", url.trim_end_matches('/'))
        .form(&[("token", server.admin_token.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "a same-origin login was refused");
    let login_page = http.get(format!("{url}/ui/login")).send().await.unwrap();
    assert_eq!(login_page.headers()["referrer-policy"], "same-origin");
    // The admin token logs in.
    let r = http
        .post(format!("{url}/ui/login"))
        .form(&[("token", server.admin_token.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert!(r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .contains("HttpOnly"));
    let page = http
        .get(format!("{url}/ui"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(html.contains("ui-agent"), "agent listed");
    // The agent's tile encoder backend, and (where it is not CUDA) why not.
    let backend = ["cuda", "onednn", "cpu"]
        .into_iter()
        .find(|b| html.contains(&format!(">{b}</td>")))
        .unwrap_or_else(|| panic!("no encoder backend shown: {html}"));
    if backend != "cuda" {
        assert!(
            html.contains("title=\"not used here: cuda: "),
            "why CUDA is not used: {html}"
        );
    }
    assert!(html.contains(&format!("/ui/jobs/{id}")), "job linked");
    assert!(html.contains("failed 1"), "state counts shown");
    let job_page = http
        .get(format!("{url}/ui/jobs/{id}"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        job_page.contains("line &#60;one&#62;") || job_page.contains("line &lt;one&gt;"),
        "log shown, escaped"
    );

    // Prometheus: needs a token, then reports counts from the tables.
    let r = http.get(format!("{url}/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let text = http
        .get(format!("{url}/metrics"))
        .bearer_auth(&server.admin_token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("flotilla_jobs{kind=\"command\",state=\"failed\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("flotilla_job_attempts_total{kind=\"command\",outcome=\"failed\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("flotilla_agent_up{agent=\"ui-agent\""),
        "{text}"
    );
}

/// The dashboard's cookie is a server-side session, not the API token:
/// Secure behind an HTTPS proxy (`--behind-tls-proxy`: tls.rs checks that
/// the proxy's header counts only then); logout and the revocation of the
/// token it was opened with each end its open live streams within 10 s, and
/// the cookie works no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_end_at_logout_and_revocation() {
    let dir = scratch("e2e-ui-session-");
    let mut opts = opts_on_shared(dir.path(), 5_000).await;
    opts.env
        .push(("FLOTILLA_BEHIND_TLS_PROXY".into(), "true".into()));
    let server = Server::start(dir.path(), opts).await;
    let api = server.api();
    let url = server.url();
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let client = api
        .post(
            "/api/v1/tokens",
            json!({"role": "client", "description": "viewer"}),
        )
        .await;
    let (client_id, client_token) = (
        client["id"].as_str().unwrap().to_string(),
        client["token"].as_str().unwrap().to_string(),
    );
    let login = |token: String, https: bool| {
        let http = http.clone();
        let url = url.clone();
        async move {
            let mut req = http
                .post(format!("{url}/ui/login"))
                .form(&[("token", token)]);
            if https {
                req = req.header("x-forwarded-proto", "https");
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 303);
            r.headers()["set-cookie"].to_str().unwrap().to_string()
        }
    };
    let admin_cookie = login(server.admin_token.clone(), true).await;
    assert!(admin_cookie.contains("; Secure"), "{admin_cookie}");
    assert!(
        !admin_cookie.contains(&server.admin_token),
        "the cookie is not the token"
    );
    let plain = login(server.admin_token.clone(), false).await;
    assert!(!plain.contains("Secure"), "{plain}");
    let client_cookie = login(client_token.clone(), false).await;
    let value = |c: &str| c.split(';').next().unwrap().to_string();
    let (admin_cookie, client_cookie) = (value(&admin_cookie), value(&client_cookie));

    // An open live stream, drained in the background; returns when the
    // server ends it.
    let stream = |cookie: String| {
        let http = http.clone();
        let url = url.clone();
        tokio::spawn(async move {
            let mut r = http
                .get(format!("{url}/ui/events"))
                .header("cookie", cookie)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            while let Ok(Some(_)) = r.chunk().await {}
        })
    };
    let ends_within = |task: tokio::task::JoinHandle<()>, what: &'static str| async move {
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap_or_else(|_| panic!("{what}: the stream is still open after 10 s"))
            .unwrap();
    };
    let still_in = |cookie: String| {
        let http = http.clone();
        let url = url.clone();
        async move {
            let r = http
                .get(format!("{url}/ui"))
                .header("cookie", cookie)
                .send()
                .await
                .unwrap();
            r.status() == 200
        }
    };

    // Revoking the client token ends its session's stream.
    let s = stream(client_cookie.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(still_in(client_cookie.clone()).await);
    let (status, v) = api
        .raw(
            reqwest::Method::POST,
            &format!("/api/v1/tokens/{client_id}/revoke"),
            None,
        )
        .await;
    assert!((200..300).contains(&status), "revoke: {status} {v}");
    ends_within(s, "revocation").await;
    assert!(
        !still_in(client_cookie).await,
        "a revoked token's session is over"
    );

    // Logout ends the admin session's stream.
    let s = stream(admin_cookie.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = http
        .post(format!("{url}/ui/logout"))
        .header("cookie", &admin_cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    ends_within(s, "logout").await;
    assert!(
        !still_in(admin_cookie).await,
        "a logged-out session is over"
    );
}

/// A job page learns that its job ended (the `end` event carries the final
/// state: browsers drop events with empty data), a reconnect does not get
/// the same lines again (`Last-Event-ID`), an unknown page under `/ui` is a
/// page, and every API error is in the JSON shape: a bad query string, a
/// method a path does not take, an unknown path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_pages_end_and_errors_keep_their_shape() {
    let dir = scratch("e2e-ui-shapes-");
    let server = server_on_shared(dir.path(), 5_000).await;
    let api = server.api();
    let _agent = Agent::start(&server, "shapes", 1, &[]).await;
    let id = api
        .submit(json!({"kind": "command", "command": "echo one; echo two"}))
        .await;
    assert_eq!(
        api.wait_final(&id, Duration::from_secs(30)).await.state,
        JobState::Succeeded
    );
    let ui = Dashboard::login(&server).await;
    let stream = |last_event_id: Option<String>| {
        let mut req = ui.request(
            reqwest::Method::GET,
            &format!("/ui/jobs/{id}/log/stream?after=0"),
        );
        async move {
            if let Some(seen) = last_event_id {
                req = req.header("last-event-id", seen);
            }
            let body = tokio::time::timeout(Duration::from_secs(20), async {
                req.send().await.unwrap().text().await.unwrap()
            })
            .await
            .expect("the stream of a finished job ends");
            body.replace("\r\n", "\n")
        }
    };
    let body = stream(None).await;
    assert!(body.contains("event: lines\n"), "{body}");
    assert!(body.contains("data: one\ndata: two\n"), "{body}");
    assert!(body.contains("event: end\ndata: succeeded\n"), "{body}");
    let seen = body
        .lines()
        .find_map(|l| l.strip_prefix("id: "))
        .expect("lines events carry an id")
        .to_string();
    let again = stream(Some(seen)).await;
    assert!(!again.contains("event: lines"), "{again}");
    assert!(again.contains("event: end\ndata: succeeded\n"), "{again}");

    // Blank lines reach the page as the log has them: the live text from
    // any line on is the log's text from there (before, a batch's trailing
    // blank lines were dropped, and a batch of one blank line was an event
    // with no data, which browsers never deliver).
    let blanks = api
        .submit(json!({"kind": "command", "command": "printf 'a\\n\\nb\\n\\n'"}))
        .await;
    assert_eq!(
        api.wait_final(&blanks, Duration::from_secs(30)).await.state,
        JobState::Succeeded
    );
    let page = |after: i64, limit: usize| {
        let path = format!("/api/v1/jobs/{blanks}/log?after={after}&limit={limit}");
        let req = api
            .http
            .get(format!("{}{path}", server.url()))
            .bearer_auth(&api.token);
        async move {
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200, "{path}");
            let next: i64 = r.headers()["flotilla-log-next"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            (next, r.text().await.unwrap())
        }
    };
    let (_, whole) = page(0, 100).await;
    assert_eq!(whole, "a\n\nb\n\n", "the log as stored");
    let mut after = 0;
    loop {
        let (_, rest) = page(after, 100).await;
        let body = ui
            .page(&format!("/ui/jobs/{blanks}/log/stream?after={after}"))
            .await;
        assert_eq!(
            delivered_lines(&body),
            rest,
            "the live log after line {after}"
        );
        let (next, _) = page(after, 1).await;
        if next == after {
            break;
        }
        after = next;
    }

    // A carriage return: the stream cannot carry one (it ends an SSE
    // line) and drops it; the page leaves it out too, so a log reads the
    // same live and after the page's reload (browser review of 3877596).
    let cr = api
        .submit(json!({"kind": "command", "command": "printf 'x\\r\\ny\\rz\\n'"}))
        .await;
    assert_eq!(
        api.wait_final(&cr, Duration::from_secs(30)).await.state,
        JobState::Succeeded
    );
    let live = delivered_lines(&ui.page(&format!("/ui/jobs/{cr}/log/stream?after=0")).await);
    assert_eq!(live, "x\nyz\n");
    let html = ui.page(&format!("/ui/jobs/{cr}")).await;
    assert!(html.contains(&format!(">{live}</pre>")), "{html}");

    // A page whose header is out of date (it showed the job queued, and
    // the agent has taken it) hears so (`changed`, its state and attempt
    // now) and its stream ends there, for the page to reload.
    let sleeper = api
        .submit(json!({"kind": "command", "command": "sleep 8"}))
        .await;
    let stream = |shown: &str| format!("/ui/jobs/{sleeper}/log/stream?after=0&{shown}");
    let (_, body) = tokio::time::timeout(
        Duration::from_secs(20),
        ui.get(&stream("state=queued&attempt=0")),
    )
    .await
    .expect("the stream of a page out of date ends");
    let body = body.replace("\r\n", "\n");
    assert!(
        body.contains("event: changed\ndata: leased 1\n")
            || body.contains("event: changed\ndata: running 1\n"),
        "{body}"
    );
    assert!(!body.contains("event: end"), "{body}");
    // The running job's page asks its stream against what it shows.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while api.job(&sleeper).await.state != JobState::Running {
        assert!(tokio::time::Instant::now() < deadline, "never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let page = ui.page(&format!("/ui/jobs/{sleeper}")).await;
    assert!(
        page.contains("log/stream?after=0&amp;state=running&amp;attempt=1\""),
        "{page}"
    );
    // `sleep` writes nothing: the page says so rather than showing an
    // empty box (job.js removes the note with the first line).
    assert!(
        page.contains("<p class=\"muted\" id=\"log-empty\">No output yet"),
        "{page}"
    );
    // A page that is up to date hears no `changed` while nothing changes.
    let quiet = tokio::time::timeout(
        Duration::from_secs(2),
        ui.get(&stream("state=running&attempt=1")),
    )
    .await;
    assert!(quiet.is_err(), "the stream ended: {quiet:?}");
    api.post(&format!("/api/v1/jobs/{sleeper}/cancel"), json!({}))
        .await;

    // Jobs of one minute are told apart on the overview: the link text is
    // the random tail of the id, not its time prefix.
    let other = api
        .submit(json!({"kind": "command", "command": "true"}))
        .await;
    let (_, overview) = ui.get("/ui").await;
    for job in [&id, &other] {
        let tail = &job.replace('-', "")[24..];
        assert!(
            overview.contains(&format!("/ui/jobs/{job}\">{tail}</a>")),
            "{job} shown as {tail}: {overview}"
        );
    }

    let r = ui
        .request(reqwest::Method::GET, "/ui/no/such/page")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(r.text().await.unwrap().contains("No such page"));

    for (method, path, status, code) in [
        (
            reqwest::Method::GET,
            "/api/v1/jobs?limit=lots",
            400,
            "bad_request",
        ),
        (
            reqwest::Method::DELETE,
            "/api/v1/jobs",
            405,
            "method_not_allowed",
        ),
        (reqwest::Method::GET, "/api/v1/nope", 404, "not_found"),
        // A path segment that is not UTF-8 once decoded.
        (reqwest::Method::GET, "/api/v1/jobs/%FF", 400, "bad_request"),
        (
            reqwest::Method::GET,
            "/api/v1/agents/%FF/health",
            400,
            "bad_request",
        ),
    ] {
        let (s, v) = api.raw(method.clone(), path, None).await;
        assert_eq!(s, status, "{method} {path}: {v}");
        assert_eq!(v["error"]["code"], code, "{method} {path}: {v}");
    }
}

/// What a browser's EventSource hands a page from the `lines` events of
/// an SSE body, concatenated: each event's `data:` lines joined by
/// newlines; an event whose data is empty is not delivered (the HTML
/// standard's "dispatch the event").
fn delivered_lines(body: &str) -> String {
    let body = body.replace("\r\n", "\n");
    let mut out = String::new();
    for block in body.split("\n\n") {
        let mut kind = "message";
        let mut data = String::new();
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                kind = v.strip_prefix(' ').unwrap_or(v);
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push_str(v.strip_prefix(' ').unwrap_or(v));
                data.push('\n');
            }
        }
        data.pop();
        if kind == "lines" && !data.is_empty() {
            out.push_str(&data);
        }
    }
    out
}

/// Transactions the server's database has committed or rolled back so far
/// (PostgreSQL's own count; backends report within about a second).
async fn transactions(db: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database
         WHERE datname = current_database()",
    )
    .fetch_one(db)
    .await
    .unwrap()
}

/// Opens the event stream at `path` as a tab would and drains it in the
/// background.
async fn open_stream(ui: &Dashboard, path: String) -> tokio::task::JoinHandle<()> {
    let r = ui
        .request(reqwest::Method::GET, &path)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{path}");
    tokio::spawn(async move {
        let mut r = r;
        while let Ok(Some(_)) = r.chunk().await {}
    })
}

/// The database's transactions per second while `tabs` tabs are open
/// (after a warm-up), over `window`. Each tab is what a browser keeps open
/// on the dashboard: the overview's stream, the alert banner's poll of
/// `/ui/alerts.json` every 5 s (as `web/static/alerts.js` does), and, when
/// `job` is given, that job page's log stream.
async fn rate_with_tabs(
    ui: &Dashboard,
    db: &sqlx::PgPool,
    tabs: usize,
    job: Option<&str>,
    window: Duration,
) -> f64 {
    let mut tasks = Vec::new();
    for _ in 0..tabs {
        tasks.push(open_stream(ui, "/ui/events".to_string()).await);
        if let Some(job) = job {
            let path = format!("/ui/jobs/{job}/log/stream?after=0");
            tasks.push(open_stream(ui, path).await);
        }
        let ui = ui.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let r = ui
                    .request(reqwest::Method::GET, "/ui/alerts.json")
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200, "the alert banner's poll");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = transactions(db).await;
    tokio::time::sleep(window).await;
    let after = transactions(db).await;
    for t in &tasks {
        assert!(!t.is_finished(), "a tab's stream or poll ended early");
    }
    for t in tasks {
        t.abort();
    }
    (after - before) as f64 / window.as_secs_f64()
}

/// 200 open tabs cost the database what one does: the overview's panel,
/// a job page's look for new lines and the banner's session check are
/// each made once per interval and shared, and one session's tabs share its
/// re-check (before, each tab ran its own queries every 2 s: about 200
/// times the transactions).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_tabs_cost_the_database_what_one_does() {
    let dir = scratch("e2e-ui-tabs-");
    let mut opts = opts_on_shared(dir.path(), 10_000).await;
    // 400 streams in one session: past the default caps, which are what
    // `live_streams_are_capped_per_token_and_in_all` tests.
    opts.env = vec![
        ("FLOTILLA_MAX_STREAMS_PER_TOKEN".into(), "0".into()),
        ("FLOTILLA_MAX_STREAMS".into(), "0".into()),
    ];
    let server = Server::start(dir.path(), opts).await;
    let ui = Dashboard::login(&server).await;
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&server.opts.database_url)
        .await
        .unwrap();
    let window = Duration::from_secs(10);
    let one = rate_with_tabs(&ui, &db, 1, None, window).await;
    let many = rate_with_tabs(&ui, &db, 200, None, window).await;
    println!("database transactions per second, overview tabs: 1 tab {one:.1}, 200 tabs {many:.1}");
    // The background (reaper, coordinator, this test's own reads) is a few
    // per second either way; unshared, 200 tabs add about 400 (the
    // overview) and 40 (the alert banners' session checks).
    assert!(
        many <= one * 1.5 + 3.0,
        "200 overview tabs: {many:.1} transactions/s, 1 tab: {one:.1}"
    );
    // The same with a job page open in every tab, on a job no agent takes
    // (its stream looks for new lines and for its end every 500 ms:
    // unshared, about 800 more per second).
    let job = server
        .api()
        .submit(json!({"kind": "command", "command": "true"}))
        .await;
    let one = rate_with_tabs(&ui, &db, 1, Some(&job), window).await;
    let many = rate_with_tabs(&ui, &db, 200, Some(&job), window).await;
    println!("database transactions per second, overview and job tabs: 1 tab {one:.1}, 200 tabs {many:.1}");
    assert!(
        many <= one * 1.5 + 3.0,
        "200 job tabs: {many:.1} transactions/s, 1 tab: {one:.1}"
    );
}

/// The dashboard's live streams are capped per login token (all its
/// sessions together) and in all (`--max-streams-per-token`,
/// `--max-streams`): past a cap a stream is refused with 429, Retry-After
/// and the setting to change; a stream that ends, or whose client goes,
/// gives its slot back; `/metrics` counts the open and the refused. Before
/// the caps any number opened (reliability review M5), and each held a
/// connection the agents share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_streams_are_capped_per_token_and_in_all() {
    let dir = scratch("e2e-ui-caps-");
    let mut opts = opts_on_shared(dir.path(), 10_000).await;
    opts.env = vec![
        ("FLOTILLA_MAX_STREAMS_PER_TOKEN".into(), "3".into()),
        ("FLOTILLA_MAX_STREAMS".into(), "5".into()),
    ];
    let server = Server::start(dir.path(), opts).await;
    let api = server.api();
    let _agent = Agent::start(&server, "caps", 1, &[]).await;
    let done = api
        .submit(json!({"kind": "command", "command": "echo hi"}))
        .await;
    assert_eq!(
        api.wait_final(&done, Duration::from_secs(30)).await.state,
        JobState::Succeeded
    );
    // Two sessions of the admin token, one of a client token.
    let a = Dashboard::login(&server).await;
    let a_again = Dashboard::login(&server).await;
    let client = api
        .post(
            "/api/v1/tokens",
            json!({"role": "client", "description": "c"}),
        )
        .await;
    let b = Dashboard::login_with(&server, client["token"].as_str().unwrap()).await;
    let refused = |ui: &Dashboard, path: &str| {
        let req = ui.request(reqwest::Method::GET, path);
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let retry = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_string());
            (status, retry, r.text().await.unwrap())
        }
    };

    // A finished job's log stream ends at once and gives its slot back.
    let (status, body) = a.get(&format!("/ui/jobs/{done}/log/stream?after=0")).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("event: end"), "{body}");

    // The token's sessions share its cap: a new login opens no more.
    let mut a_tabs = Vec::new();
    for ui in [&a, &a, &a_again] {
        a_tabs.push(open_stream(ui, "/ui/events".to_string()).await);
    }
    let (status, retry, body) = refused(&a_again, "/ui/events").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(retry.as_deref(), Some("30"));
    assert!(
        body.contains("this login already has 3 live views open")
            && body.contains("--max-streams-per-token"),
        "{body}"
    );
    // Every kind of stream counts: a job page's too.
    let (status, _, body) = refused(&a, &format!("/ui/jobs/{done}/log/stream?after=0")).await;
    assert_eq!(status, 429, "{body}");

    // Another token is not held by the first one's tabs, only by the total.
    let mut b_tabs = Vec::new();
    for _ in 0..2 {
        b_tabs.push(open_stream(&b, "/ui/events".to_string()).await);
    }
    let (status, _, body) = refused(&b, "/ui/events").await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body.contains("the server already has 5 live views open") && body.contains("--max-streams"),
        "{body}"
    );

    let text = api.metrics().await;
    assert!(text.contains("\nflotilla_dashboard_streams 5\n"), "{text}");
    assert!(
        text.contains("\nflotilla_dashboard_streams_refused_total 3\n"),
        "{text}"
    );

    // A tab closed: its slot is given back once the server notices (at the
    // next write, a keep-alive within 15 s).
    a_tabs.pop().unwrap().abort();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    loop {
        let r = b
            .request(reqwest::Method::GET, "/ui/events")
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            drop(r);
            break;
        }
        assert_eq!(r.status(), 429);
        assert!(
            tokio::time::Instant::now() < deadline,
            "a closed tab's slot was not given back within 40 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for t in a_tabs.into_iter().chain(b_tabs) {
        assert!(!t.is_finished(), "a stream under the caps ended early");
        t.abort();
    }
}

/// Every page carries the security headers (a CSP that allows no inline
/// script and no framing, nosniff) and no page has an inline script; the
/// scripts they load are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_carry_security_headers_and_no_inline_script() {
    let dir = scratch("e2e-ui-csp-");
    let server = server_on_shared(dir.path(), 10_000).await;
    let api = server.api();
    let job = api
        .submit(json!({"kind": "command", "command": "sleep 30"}))
        .await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let url = server.url();
    let ui = Dashboard::login(&server).await;
    for (path, status) in [
        ("/ui/login".to_string(), 200),
        ("/ui".to_string(), 200),
        (format!("/ui/jobs/{job}"), 200),
        ("/ui/pipelines".to_string(), 200),
        ("/ui/nowhere".to_string(), 404),
        // A handler's errors are pages under /ui, JSON under the API.
        ("/ui/jobs/not-an-id".to_string(), 400),
        ("/ui/rois/not-an-id".to_string(), 400),
        (format!("/ui/jobs/{}", uuid::Uuid::nil()), 404),
        ("/api/v1/jobs".to_string(), 200),
        ("/api/v1/jobs/not-an-id".to_string(), 400),
    ] {
        let r = ui
            .request(reqwest::Method::GET, &path)
            .bearer_auth(&server.admin_token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{path}");
        let h = r.headers();
        let csp = h["content-security-policy"].to_str().unwrap().to_string();
        assert!(csp.contains("script-src 'self'"), "{path}: {csp}");
        let script_src = csp
            .split(';')
            .map(str::trim)
            .find(|d| d.starts_with("script-src"))
            .unwrap_or_default();
        assert!(!script_src.contains("unsafe"), "{path}: {csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        // Nothing a session or token saw is kept by the browser or a cache.
        assert_eq!(h["cache-control"], "no-store", "{path}");
        let kind = h["content-type"].to_str().unwrap().to_string();
        let page = path.starts_with("/ui");
        assert!(
            kind.starts_with(if page {
                "text/html"
            } else {
                "application/json"
            }),
            "{path}: {kind}"
        );
        let body = r.text().await.unwrap();
        if path.ends_with("not-an-id") {
            let what = if path.contains("/rois/") {
                "an ROI"
            } else {
                "a job"
            };
            assert!(
                body.contains(&format!("is not {what} id (a UUID)")),
                "{path}: {body}"
            );
        }
        // An error page seen in a session can end it, as every page can.
        if page && status >= 400 {
            assert!(
                body.contains("<form method=\"post\" action=\"/ui/logout\">"),
                "{path}: no Log out on the error page: {body}"
            );
        }
        if path.ends_with(&uuid::Uuid::nil().to_string()) {
            assert!(
                body.contains(&format!("no job {}", uuid::Uuid::nil())),
                "{path}: {body}"
            );
        }
        for (i, _) in body.match_indices("<script") {
            let tag = &body[i..body[i..].find('>').map_or(body.len(), |e| i + e)];
            assert!(
                tag.contains("src=\"/ui/static/"),
                "{path}: inline script {tag}"
            );
        }
    }
    // Without a session there is nothing to log out of.
    let r = http.get(format!("{url}/ui/nowhere")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let body = r.text().await.unwrap();
    assert!(body.contains("<html"), "{body}");
    assert!(!body.contains("/ui/logout"), "{body}");
    // The job page loads its script, which is served.
    let (_, page) = ui.get(&format!("/ui/jobs/{job}")).await;
    assert!(page.contains("/ui/static/job.js"), "{page}");
    for script in ["job.js", "overview.js", "pipeline.js"] {
        let r = http
            .get(format!("{url}/ui/static/{script}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{script}");
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/javascript"));
    }
}
