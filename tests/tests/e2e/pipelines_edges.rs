//! Pipelines at their edges: an `either` whose branches start with a move
//! still spreads items by the branches' first stages; a second open run of
//! the same file is refused; the server checks a listing's ids itself, and
//! takes a listing larger than other agent reports; a run cancelled as its
//! server dies is closed with its jobs or not at all; restarting an agent
//! does not fail the items it was running; a failed probe ends the run with
//! its items; a run advances as its own jobs end, with no pass over every
//! open run to find them.

use std::time::Duration;

use flotilla_e2e::driven::Driven;
use flotilla_e2e::procs::{opts_on_shared, server_on_shared, Agent, Server};
use flotilla_e2e::scratch;
use serde_json::{json, Value};

/// Runs pipeline file `source` as `name`: the run's id.
async fn run_file(api: &flotilla_e2e::api::Api, name: &str, source: &str) -> String {
    api.post("/api/v1/pipelines", json!({"name": name, "source": source}))
        .await["id"]
        .as_str()
        .expect("a run id")
        .to_string()
}

/// Leases the next job as driven `agent` and completes it with `result`
/// (a listing's `{"items"}`, a probe's `{"exist"}`), which must be taken.
async fn complete_next(agent: &Driven, result: Value) {
    let (job, lease) = agent.lease().await;
    let (status, v) = agent
        .api
        .raw(
            reqwest::Method::POST,
            &format!("/api/agent/v1/jobs/{job}/complete"),
            Some(json!({"lease_token": lease, "exit_code": 0, "result": result})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
}

async fn finished(api: &flotilla_e2e::api::Api, run: &str) -> Value {
    let started = std::time::Instant::now();
    loop {
        let v = api.get(&format!("/api/v1/pipelines/{run}")).await;
        if ["done", "failed", "cancelled"].contains(&v["state"].as_str().unwrap_or("")) {
            return v;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "run {run} did not end in 120 s: {v:#}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Two branches that each move the item to their host and then run a
/// stage of `jobs 1` there (their commands quote `{in}` and `{out}` in each
/// way, which the fields must survive): items go to whichever branch's stage has room,
/// so both take a fair share (before, a branch starting with a move always
/// had room, and every item went to the first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_either_of_moves_spreads_items_by_its_stages() {
    let dir = scratch("e2e-pipeline-either-");
    let d = dir.path().display().to_string();
    let server = server_on_shared(dir.path(), 10_000).await;
    let _a = Agent::start(&server, "either-a", 4, &[]).await;
    let _b = Agent::start(&server, "either-b", 4, &[]).await;
    let api = server.api();
    let source = format!(
        "host a = agent either-a
host x = agent either-b
host y = agent either-b
items on a: seq 1 10
stage one on a jobs 4 out {d}/one/{{id}}: echo {{id}} > {{out}}
either {{
    move mx to x:{d}/x-in/{{id}}
    stage sx on x jobs 1 out {d}/x-out/{{id}}: sleep 0.5; cp \"{{in}}\" '{{out}}'
|
    move my to y:{d}/y-in/{{id}}
    stage sy on y jobs 1 out {d}/y-out/{{id}}: sleep 0.5; cp '{{in}}' \"{{out}}\"
}}
"
    );
    let run = run_file(&api, "either.pipeline", &source).await;
    let view = finished(&api, &run).await;
    assert_eq!(view["state"], "done", "{view:#}");
    let count = |sub: &str| std::fs::read_dir(dir.path().join(sub)).map_or(0, |rd| rd.count());
    let (x, y) = (count("x-out"), count("y-out"));
    assert_eq!(x + y, 10);
    assert!(x >= 3 && y >= 3, "branch x took {x} items, branch y {y}");
}

/// A second run of a file whose first run is still open would write the
/// same outputs: it is refused with 409 naming the open run, and accepted
/// once that run ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_open_run_of_the_same_file_is_refused() {
    let dir = scratch("e2e-pipeline-twice-");
    let d = dir.path().display().to_string();
    let server = server_on_shared(dir.path(), 10_000).await;
    let _a = Agent::start(&server, "twice-a", 2, &[]).await;
    let api = server.api();
    let source =
        format!("host a = agent twice-a\nitems on a: seq 1 2\nstage s on a out {d}/s/{{id}}: sleep 30; echo > {{out}}\n");
    let body = json!({"name": "twice.pipeline", "source": source});
    let first = api.post("/api/v1/pipelines", body.clone()).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, v) = api
        .raw(
            reqwest::Method::POST,
            "/api/v1/pipelines",
            Some(body.clone()),
        )
        .await;
    assert_eq!(status, 409, "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(&first), "{message}");
    api.post(&format!("/api/v1/pipelines/{first}/cancel"), json!({}))
        .await;
    assert_eq!(finished(&api, &first).await["state"], "cancelled");
    let (status, v) = api
        .raw(reqwest::Method::POST, "/api/v1/pipelines", Some(body))
        .await;
    assert_eq!(status, 201, "{v}");

    // Review of 3877596, F9: the check and the insert were two
    // transactions, so submissions at the same moment could all find none
    // open. Eight at once: one run.
    let source = format!(
        "host a = agent twice-a\nitems on a: seq 1 2\nstage t on a out {d}/t/{{id}}: sleep 30; echo > {{out}}\n"
    );
    let body = json!({"name": "race.pipeline", "source": source});
    let mut posts = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (api, body) = (api.clone(), body.clone());
        posts.spawn(async move {
            api.raw(reqwest::Method::POST, "/api/v1/pipelines", Some(body))
                .await
        });
    }
    let answers = posts.join_all().await;
    let mut statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    statuses.sort();
    assert_eq!(
        statuses,
        [201, 409, 409, 409, 409, 409, 409, 409],
        "{answers:?}"
    );
}

/// Review of 3877596, F7 and F2. An id that would leave its directory,
/// reported by an agent that skipped the agent's own check, fails the run
/// naming it before any stage job is made. A listing of 1.2 MB (over the
/// 1 MiB every other agent call is held to) is taken: before, the
/// completion was refused with 413 and the run failed three lease expiries
/// later, "the agent stopped heartbeating".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_checks_a_listing_and_takes_a_large_one() {
    let dir = scratch("e2e-pipeline-listing-");
    let d = dir.path().display().to_string();
    let server = server_on_shared(dir.path(), 10_000).await;
    let agent = Driven::register(&server, "lister", &["step"], Duration::from_secs(10)).await;
    let api = server.api();
    let list_with = |stage: &str, items: Value| {
        let source = format!(
            "host a = agent lister\nitems on a: ls\nstage {stage} on a out {d}/{stage}/{{id}}: true\n"
        );
        let (api, agent) = (&api, &agent);
        let name = format!("{stage}.pipeline");
        async move {
            let run = run_file(api, &name, &source).await;
            complete_next(agent, json!({ "items": items })).await;
            run
        }
    };

    let run = list_with("escape", json!(["a", "../x"])).await;
    let view = finished(&api, &run).await;
    assert_eq!(view["state"], "failed", "{view:#}");
    let error = view["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("../x") && error.contains("not an item id"),
        "{error}"
    );
    let steps = api.get("/api/v1/jobs?kind=step&limit=100").await;
    assert_eq!(
        steps["jobs"].as_array().map(Vec::len),
        Some(1),
        "only the listing ran: {steps:#}"
    );

    let ids: Vec<String> = (0..5_000).map(|i| format!("{i:0>240}")).collect();
    assert!(serde_json::to_vec(&ids).unwrap().len() > 1 << 20);
    let run = list_with("large", json!(ids)).await;
    let started = std::time::Instant::now();
    loop {
        let v = api.get(&format!("/api/v1/pipelines/{run}?limit=1")).await;
        if v["items"] == 5_000 {
            break;
        }
        assert!(
            ["listing", "running"].contains(&v["state"].as_str().unwrap_or("")),
            "{v:#}"
        );
        assert!(started.elapsed() < Duration::from_secs(60), "{v:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Review of 3877596, F11: a cursor past any index is an empty page
    // (it wrapped to index 1, or to 0, before).
    for after in ["4294967296", "18446744073709551615", "2147483647"] {
        let v = api
            .get(&format!("/api/v1/pipelines/{run}?after={after}&limit=2"))
            .await;
        assert_eq!(v["rows"], json!([]), "after={after}: {v:#}");
    }
    api.post(&format!("/api/v1/pipelines/{run}/cancel"), json!({}))
        .await;
    assert_eq!(finished(&api, &run).await["state"], "cancelled");
}

/// Review of 3877596, F1. Cancelling a run recorded it closed in one
/// transaction and cancelled its jobs one by one after: a server killed
/// between the two left a cancelled run whose jobs were still queued, to be
/// run (a `consume` deleting its input) with nothing to stop them. One of
/// the run's jobs is held locked from outside, so the cancel waits on it,
/// and the server is killed there: the database must then hold the run and
/// its jobs as they were, or both closed; a second cancel closes both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cancelled_as_its_server_dies_is_closed_with_its_jobs_or_not_at_all() {
    let dir = scratch("e2e-pipeline-cancel-kill-");
    let d = dir.path().display().to_string();
    let mut server = server_on_shared(dir.path(), 10_000).await;
    let agent = Driven::register(&server, "idle", &["step"], Duration::from_secs(10)).await;
    let api = server.api();
    let source = format!(
        "host a = agent idle\nitems on a: ls\nstage s on a jobs 3 out {d}/s/{{id}}: true\n"
    );
    let run = run_file(&api, "kill.pipeline", &source).await;
    complete_next(&agent, json!({"items": ["1", "2", "3"]})).await;
    // The probe for outputs an earlier run left: none.
    complete_next(&agent, json!({"exist": []})).await;
    let db = sqlx::PgPool::connect(&server.opts.database_url)
        .await
        .unwrap();
    let run_id: uuid::Uuid = run.parse().unwrap();
    let queued = || {
        sqlx::query_scalar::<_, uuid::Uuid>(
            "SELECT id FROM jobs WHERE parent_id = $1 AND state = 'queued' ORDER BY id",
        )
        .bind(run_id)
        .fetch_all(&db)
    };
    flotilla_e2e::eventually(
        "the run's three stage jobs",
        Duration::from_secs(30),
        || {
            let q = queued();
            async move { q.await.unwrap().len() == 3 }
        },
    )
    .await;
    let jobs = queued().await.unwrap();

    let mut hold = db.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE")
        .bind(jobs[1])
        .execute(&mut *hold)
        .await
        .unwrap();
    let cancelling = tokio::spawn({
        let api = api.clone();
        let run = run.clone();
        // Its answer never comes: the server is killed under it.
        async move {
            let _ = api
                .http
                .post(format!("{}/api/v1/pipelines/{run}/cancel", api.base))
                .bearer_auth(&api.token)
                .json(&json!({}))
                .send()
                .await;
        }
    });
    flotilla_e2e::eventually(
        "the cancel to wait on the held job",
        Duration::from_secs(30),
        || {
            let q = sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE '%cancel_requested%'",
            )
            .fetch_one(&db);
            async move { q.await.unwrap() > 0 }
        },
    )
    .await;
    server.kill().await;
    cancelling.abort();
    hold.rollback().await.unwrap();
    // The killed server's transaction ends once its statement can go on
    // and finds no client: wait for its backend to go.
    flotilla_e2e::eventually(
        "the killed server's cancel to end",
        Duration::from_secs(30),
        || {
            let q = sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%cancel_requested%'
               AND pid <> pg_backend_pid() AND state <> 'idle'",
            )
            .fetch_one(&db);
            async move { q.await.unwrap() == 0 }
        },
    )
    .await;
    let state: String = sqlx::query_scalar("SELECT state FROM pipeline_runs WHERE id = $1")
        .bind(run_id)
        .fetch_one(&db)
        .await
        .unwrap();
    let left = queued().await.unwrap().len();
    assert!(
        (state == "running" && left == 3) || (state == "cancelled" && left == 0),
        "run {state} with {left} of its jobs still queued"
    );

    server.restart().await;
    let api = server.api();
    let (status, v) = api
        .raw(
            reqwest::Method::POST,
            &format!("/api/v1/pipelines/{run}/cancel"),
            Some(json!({})),
        )
        .await;
    assert!(status == 200 || status == 202, "{status} {v}");
    assert_eq!(finished(&api, &run).await["state"], "cancelled");
    assert_eq!(queued().await.unwrap().len(), 0);
}

/// Review of 3877596, F6. A stage has one attempt unless it says `retries`,
/// and an agent stopped or killed under it used that attempt up: restarting
/// an agent for an upgrade failed every item it ran, and the run. An
/// interruption now gives a step job its attempt back (up to three times).
/// The agent is stopped gracefully mid-stage, started again, then killed
/// mid-stage and started again: the run ends done, each output in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_an_agent_does_not_fail_the_items_it_ran() {
    let dir = scratch("e2e-pipeline-agent-restart-");
    let d = dir.path().display().to_string();
    let server = server_on_shared(dir.path(), 3_000).await;
    let mut agent = Agent::start(&server, "restart-a", 4, &[]).await;
    let api = server.api();
    let source = format!(
        "host a = agent restart-a\nitems on a: seq 1 2\n\
         stage s on a jobs 2 out {d}/s/{{id}}: sleep 3; echo {{id}} > {{out}}\n"
    );
    let run = run_file(&api, "restart.pipeline", &source).await;
    let stage_jobs_running = || {
        let api = api.clone();
        async move {
            let v = api
                .get("/api/v1/jobs?kind=step&state=running&limit=10")
                .await;
            v["jobs"]
                .as_array()
                .is_some_and(|j| j.iter().filter(|j| j["spec"]["step"] == "s").count() == 2)
        }
    };
    for stop in ["terminate", "kill"] {
        flotilla_e2e::eventually(
            "both items in stage s",
            Duration::from_secs(60),
            stage_jobs_running,
        )
        .await;
        match stop {
            "terminate" => agent.terminate().await,
            _ => agent.kill().await,
        }
        agent = Agent::start(&server, "restart-a", 4, &[]).await;
    }
    let view = finished(&api, &run).await;
    assert_eq!(view["state"], "done", "{view:#}");
    for id in ["1", "2"] {
        let out = std::fs::read_to_string(dir.path().join("s").join(id)).unwrap();
        assert_eq!(out.trim(), id);
    }
}

/// Review of 3877596, F10: a run whose look for earlier outputs failed
/// ended failed with its items still `waiting` and its other probes left
/// to run; it now ends as a closed run does, items and jobs with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_probe_ends_the_run_with_its_items() {
    let dir = scratch("e2e-pipeline-probe-fails-");
    let d = dir.path().display().to_string();
    let server = server_on_shared(dir.path(), 10_000).await;
    let agent = Driven::register(&server, "prober", &["step"], Duration::from_secs(10)).await;
    let api = server.api();
    let source =
        format!("host a = agent prober\nitems on a: ls\nstage s on a out {d}/s/{{id}}: true\n");
    let run = run_file(&api, "probe.pipeline", &source).await;
    complete_next(&agent, json!({"items": ["1", "2"]})).await;
    let (probe, lease) = agent.lease().await;
    let (status, v) = agent
        .api
        .raw(
            reqwest::Method::POST,
            &format!("/api/agent/v1/jobs/{probe}/fail"),
            Some(json!({"lease_token": lease, "class": "fatal", "message": "host unreachable"})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let view = finished(&api, &run).await;
    assert_eq!(view["state"], "failed", "{view:#}");
    assert!(
        view["error"]
            .as_str()
            .unwrap_or_default()
            .contains("host unreachable"),
        "{view:#}"
    );
    assert_eq!(view["counts"]["waiting"], 0, "{view:#}");
    assert_eq!(view["counts"]["failed"], 2, "{view:#}");
}

/// With the pass over every open run an hour apart, a run still goes from
/// its listing through both stages to done: each of its jobs that ends on
/// this server wakes a pass for its run (by the job's parent) at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_advances_as_its_jobs_end_with_no_pass_over_every_run() {
    let dir = scratch("e2e-pipeline-woken-");
    let mut opts = opts_on_shared(dir.path(), 10_000).await;
    opts.env
        .push(("FLOTILLA_COORDINATOR_INTERVAL".into(), "1h".into()));
    let server = Server::start(dir.path(), opts).await;
    let _a = Agent::start(&server, "woken-a", 2, &[]).await;
    let api = server.api();
    let source = "host a = agent woken-a
items on a: seq 1 4
stage one on a jobs 2: true
stage two on a jobs 1: true
";
    let run = run_file(&api, "woken.pipeline", source).await;
    let view = finished(&api, &run).await;
    assert_eq!(view["state"], "done", "{view:#}");
    assert_eq!(view["counts"]["done"], 4, "{view:#}");
}
