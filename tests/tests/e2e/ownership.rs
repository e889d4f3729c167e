//! Who may see and change what: a client reads and cancels only its own
//! jobs (admins all), secret environment values reach only the submitter
//! and admins (never the dashboard), only admins account jobs to another
//! submitter or write datasets, checkpoints and coverage, and a metrics
//! token reads `/metrics` and nothing else.

use flotilla_e2e::procs::server_on_shared;
use flotilla_e2e::scratch;
use flotilla_e2e::ui::Dashboard;
use serde_json::{json, Value};

async fn token(api: &flotilla_e2e::api::Api, role: &str, description: &str) -> String {
    let v = api
        .post(
            "/api/v1/tokens",
            json!({"role": role, "description": description}),
        )
        .await;
    v["token"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_see_their_own_jobs_and_secrets_stay_with_their_owner() {
    let dir = scratch("e2e-owner-");
    let server = server_on_shared(dir.path(), 5_000).await;
    let admin = server.api();
    let alice = admin.with_token(&token(&admin, "client", "alice").await);
    let bob = admin.with_token(&token(&admin, "client", "bob").await);
    let metrics = admin.with_token(&token(&admin, "metrics", "prometheus").await);

    // No agent: the job stays queued while we look at it.
    let id = alice
        .submit(json!({"kind": "command", "command": "true",
                       "env": {"PLAIN": "visible", "API_KEY": "hunter2"},
                       "secret_env": ["API_KEY"]}))
        .await;
    let path = format!("/api/v1/jobs/{id}");
    // The owner and admins see the job whole.
    for who in [&alice, &admin] {
        let v = who.get(&path).await;
        assert_eq!(v["spec"]["env"]["API_KEY"], "hunter2", "{v}");
    }
    // Another client neither reads, lists, follows nor cancels it.
    for (method, p) in [
        (reqwest::Method::GET, path.clone()),
        (reqwest::Method::GET, format!("{path}/log")),
        (reqwest::Method::POST, format!("{path}/cancel")),
    ] {
        let (status, v) = bob.raw(method.clone(), &p, None).await;
        assert_eq!(status, 403, "{method} {p}: {v}");
        assert!(!v.to_string().contains("hunter2"), "{v}");
    }
    let listed = |v: Value| {
        v["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|j| j["id"] == id.as_str())
    };
    assert!(
        !listed(bob.get("/api/v1/jobs").await),
        "bob lists only his own"
    );
    assert!(listed(alice.get("/api/v1/jobs").await));
    assert!(listed(admin.get("/api/v1/jobs").await));

    // The dashboard never shows a secret value, not even to an admin.
    let ui = Dashboard::login(&server).await;
    let page = ui.page(&format!("/ui/jobs/{id}")).await;
    assert!(page.contains("visible"), "the job page shows the spec");
    assert!(!page.contains("hunter2"), "no secret on the dashboard");

    // The overview, page and stream, lists a client's own jobs only; an
    // admin's lists every job.
    let short = &id.replace('-', "")[24..];
    for (who, sees) in [(&alice, true), (&bob, false)] {
        let ui = Dashboard::login_with(&server, &who.token).await;
        let page = ui.page("/ui").await;
        assert_eq!(page.contains(short), sees, "{}: {page}", who.token);
        let event = first_overview_event(&ui).await;
        assert_eq!(event.contains(short), sees, "{event}");
    }
    assert!(ui.page("/ui").await.contains(short));
    assert!(first_overview_event(&ui).await.contains(short));

    // Pipeline runs too: alice's is on her dashboard, not on bob's, whose
    // session gets the 404 page for it.
    let run = alice
        .post(
            "/api/v1/pipelines",
            json!({"name": "mine.pipeline",
                   "source": "host box = agent labels owner-test=1\nitems on box: echo a\nstage s on box: true\n"}),
        )
        .await;
    let run = run["id"].as_str().expect("a run id").to_string();
    for (who, sees) in [(&alice, true), (&bob, false)] {
        let ui = Dashboard::login_with(&server, &who.token).await;
        let list = ui.page("/ui/pipelines").await;
        assert_eq!(list.contains(&run), sees, "{list}");
        let (status, page) = ui.get(&format!("/ui/pipelines/{run}")).await;
        assert_eq!(status, if sees { 200 } else { 404 }, "{page}");
        let events = ui
            .request(reqwest::Method::GET, &format!("/ui/pipelines/{run}/events"))
            .send()
            .await
            .unwrap();
        assert_eq!(events.status(), if sees { 200 } else { 404 });
    }
    assert!(ui.page("/ui/pipelines").await.contains(&run));
    // Cancel from the run's page (browser review of 3877596, M2): bob's
    // session cannot, with his own form token; alice's can, and is taken
    // back to the page.
    let token_of = |html: &str| {
        let at = html.find("name=\"csrf\" value=\"").expect("a form token") + 19;
        html[at..at + html[at..].find('"').unwrap()].to_string()
    };
    let cancel = format!("/ui/pipelines/{run}/cancel");
    let bob_ui = Dashboard::login_with(&server, &bob.token).await;
    let bobs = bob
        .submit(json!({"kind": "command", "command": "sleep 60", "labels": {"nowhere": "1"}}))
        .await;
    let bobs_page = bob_ui.page(&format!("/ui/jobs/{bobs}")).await;
    // No agent could take it (none has registered here); its page says
    // so (browser review of 3877596, M5).
    assert!(
        bobs_page.contains("Waiting. No agent can take it: no agent has registered yet."),
        "{bobs_page}"
    );
    let bob_token = token_of(&bobs_page);
    let r = bob_ui
        .request(reqwest::Method::POST, &cancel)
        .form(&[("csrf", bob_token.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let alice_ui = Dashboard::login_with(&server, &alice.token).await;
    let page = alice_ui.page(&format!("/ui/pipelines/{run}")).await;
    assert!(page.contains("id=\"run-cancel\""), "{page}");
    let r = alice_ui
        .request(reqwest::Method::POST, &cancel)
        .form(&[("csrf", token_of(&page).as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(
        r.headers()["location"],
        format!("/ui/pipelines/{run}").as_str()
    );
    assert_eq!(
        alice.get(&format!("/api/v1/pipelines/{run}")).await["state"],
        "cancelled"
    );
    assert!(!alice_ui
        .page(&format!("/ui/pipelines/{run}"))
        .await
        .contains("id=\"run-cancel\""));
    // A client's overview offers no steering it cannot do, and the login
    // page no links to pages behind it (browser review of 3877596, B8).
    let overview = alice_ui.page("/ui").await;
    assert!(overview.contains("all agents →"), "{overview}");
    assert!(!overview.contains("pause, drain, resume"), "{overview}");
    let login = reqwest::get(format!("{}/ui/login", server.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(login.contains("type=\"password\""), "{login}");
    assert!(!login.contains("href=\"/ui/jobs\""), "{login}");

    // A secret must name a variable the job has.
    let (status, v) = alice
        .raw(
            reqwest::Method::POST,
            "/api/v1/jobs",
            Some(json!({"kind": "command", "command": "true", "secret_env": ["NOPE"]})),
        )
        .await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["detail"]["path"], "secret_env", "{v}");

    // Only an admin accounts a job to another submitter.
    let job_as = |who: &str| json!({"kind": "command", "command": "true", "submitter": who});
    let (status, v) = bob
        .raw(reqwest::Method::POST, "/api/v1/jobs", Some(job_as("alice")))
        .await;
    assert_eq!(status, 403, "{v}");
    let (status, v) = admin
        .raw(reqwest::Method::POST, "/api/v1/jobs", Some(job_as("alice")))
        .await;
    assert_eq!(status, 201, "{v}");

    // Datasets, checkpoints and coverage are admin writes.
    let (status, v) = bob
        .raw(
            reqwest::Method::POST,
            "/api/v1/datasets",
            Some(json!({"name": "evil", "input_prefix": "x"})),
        )
        .await;
    assert_eq!(status, 403, "{v}");
    for (method, p) in [
        (reqwest::Method::PUT, "/api/v1/datasets/evil/checkpoint"),
        (reqwest::Method::POST, "/api/v1/coverage/import"),
    ] {
        let (status, v) = bob.raw(method.clone(), p, None).await;
        assert_eq!(status, 403, "{method} {p}: {v}");
    }

    // A metrics token reads /metrics and nothing else.
    let (status, text) = metrics.raw(reqwest::Method::GET, "/metrics", None).await;
    assert_eq!(status, 200);
    assert!(text.as_str().unwrap().contains("flotilla_jobs{"), "{text}");
    for p in ["/api/v1/jobs", "/api/v1/agents"] {
        let (status, v) = metrics.raw(reqwest::Method::GET, p, None).await;
        assert_eq!(status, 403, "{p}: {v}");
    }
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let (status, _) = http
        .post(format!("{}/ui/login", server.url()))
        .form(&[("token", metrics.token.as_str())])
        .send()
        .await
        .map(|r| (r.status().as_u16(), ()))
        .unwrap();
    assert_eq!(
        status, 401,
        "a metrics token does not log in to the dashboard"
    );

    // The owner cancels its own job.
    let (status, v) = alice
        .raw(reqwest::Method::POST, &format!("{path}/cancel"), None)
        .await;
    assert_eq!(status, 200, "{v}");
}

/// The first overview the dashboard's stream pushes to `ui`'s session.
async fn first_overview_event(ui: &Dashboard) -> String {
    let mut r = ui
        .request(reqwest::Method::GET, "/ui/events")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut text = String::new();
    let whole = |t: &str| {
        t.find("event: overview")
            .is_some_and(|at| t[at..].contains("\n\n"))
    };
    while !whole(&text) {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), r.chunk())
            .await
            .expect("an overview within 10 s")
            .unwrap()
            .expect("the stream stays open");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    text
}

/// An agent token registers only with the labels and kinds an admin
/// allowed it: a token for a CPU box cannot claim `gpu=h100` and receive
/// GPU jobs with their environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_token_claims_only_what_an_admin_allowed() {
    let dir = scratch("e2e-agent-limits-");
    let server = server_on_shared(dir.path(), 5_000).await;
    let admin = server.api();
    let v = admin
        .post(
            "/api/v1/tokens",
            json!({"role": "agent", "agent_name": "cpu-box",
                   "allowed_labels": {"site": "lab"}, "allowed_kinds": ["command"]}),
        )
        .await;
    let agent = admin.agent_process(v["token"].as_str().unwrap());
    let health = serde_json::to_value(flotilla_core::health::HostHealth::default()).unwrap();
    let register = |labels: Value, kinds: Value| {
        json!({"name": "cpu-box", "instance": agent.instance(), "capacity": 1,
               "labels": labels, "kinds": kinds, "version": "t", "health": health})
    };
    for (labels, kinds, what) in [
        (json!({"gpu": "h100"}), json!(["command"]), "gpu=h100"),
        (
            json!({"site": "elsewhere"}),
            json!(["command"]),
            "site=elsewhere",
        ),
        (json!({"site": "lab"}), json!(["command", "tile"]), "tile"),
    ] {
        let (status, v) = agent
            .raw(
                reqwest::Method::POST,
                "/api/agent/v1/register",
                Some(register(labels, kinds)),
            )
            .await;
        assert_eq!(status, 403, "{what}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(what),
            "{v}"
        );
    }
    let (status, v) = agent
        .raw(
            reqwest::Method::POST,
            "/api/agent/v1/register",
            Some(register(json!({"site": "lab"}), json!(["command"]))),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    // Limits are for agent tokens only.
    let (status, v) = admin
        .raw(
            reqwest::Method::POST,
            "/api/v1/tokens",
            Some(json!({"role": "client", "allowed_kinds": ["command"]})),
        )
        .await;
    assert_eq!(status, 422, "{v}");
}
