//! What a client may submit (issue #12, "Submissions"; review H7, L11, L14):
//! every string and list bounded, no NUL reaching PostgreSQL (a 422 naming
//! the field, not a 500), an ROI capped in tiles unless an admin lifts the
//! cap, and jobs no registered agent could ever take refused once agents
//! exist (flagged while none has registered). Real server over HTTP.

use flotilla_e2e::procs::server_on_shared;
use flotilla_e2e::scratch;
use serde_json::{json, Value};
use std::time::Duration;

async fn client_token(api: &flotilla_e2e::api::Api) -> String {
    let made = api
        .post(
            "/api/v1/tokens",
            json!({"role": "client", "description": "client"}),
        )
        .await;
    made["token"].as_str().expect("a token").to_string()
}

/// Asserts a 422 whose `detail.path` is `field`; returns the message.
fn invalid(answer: (u16, Value), field: &str) -> String {
    let (status, body) = answer;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["detail"]["path"], field, "{body}");
    body["error"]["message"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_string_and_list_of_a_submission_is_bounded() {
    let dir = scratch("e2e-submissions-");
    let server = server_on_shared(dir.path(), 10_000).await;
    let api = server.api();
    let post = |path: &'static str, body: Value| {
        let api = api.clone();
        async move { api.raw(reqwest::Method::POST, path, Some(body)).await }
    };
    let cmd = |extra: Value| {
        let mut body = json!({"kind": "command", "command": "true"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    // L11: NUL reached jsonb and answered 500.
    let m = invalid(
        post("/api/v1/jobs", cmd(json!({"env": {"A": "x\u{0}y"}}))).await,
        "env.A",
    );
    assert!(m.contains("NUL"), "{m}");
    invalid(
        post("/api/v1/jobs", cmd(json!({"labels": {"os": "li\u{0}nux"}}))).await,
        "labels.os",
    );
    invalid(
        post("/api/v1/jobs", cmd(json!({"submitter": "a\u{0}b"}))).await,
        "submitter",
    );
    // Sizes that were accepted before.
    let many: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("k{i}"), json!("v"))).collect();
    invalid(
        post("/api/v1/jobs", cmd(json!({"labels": many}))).await,
        "labels",
    );
    invalid(
        post(
            "/api/v1/jobs",
            cmd(json!({"labels": {"os": "x".repeat(257)}})),
        )
        .await,
        "labels.os",
    );
    let env: serde_json::Map<String, Value> =
        (0..257).map(|i| (format!("V{i}"), json!("1"))).collect();
    invalid(post("/api/v1/jobs", cmd(json!({"env": env}))).await, "env");
    invalid(
        post(
            "/api/v1/jobs",
            cmd(json!({"env": {"BIG": "x".repeat(40_000)}})),
        )
        .await,
        "env.BIG",
    );
    // Revdeps host variables and ROI names and regions reach text and jsonb
    // columns too.
    invalid(
        post(
            "/api/v1/revdeps",
            json!({"target": "a.1", "compiler": "c.1", "repo": "/r", "os": "lin\u{0}ux"}),
        )
        .await,
        "os",
    );
    invalid(
        post(
            "/api/v1/revdeps",
            json!({"target": "a.1", "compiler": "c.1", "repo": "/r", "arch": "x".repeat(300)}),
        )
        .await,
        "arch",
    );
    // A host's list of missing system packages: names, boundedly many.
    let m = invalid(
        post(
            "/api/v1/revdeps",
            json!({"target": "a.1", "compiler": "c.1", "repo": "/r", "os_distribution": "alpine",
                   "missing_depexts": ["gmp-dev", "lib ssl"]}),
        )
        .await,
        "missing_depexts[1]",
    );
    assert!(m.contains("not a system package name"), "{m}");
    let many: Vec<String> = (0..10_001).map(|i| format!("p{i}")).collect();
    invalid(
        post(
            "/api/v1/revdeps",
            json!({"target": "a.1", "compiler": "c.1", "repo": "/r", "missing_depexts": many}),
        )
        .await,
        "missing_depexts",
    );
    let square = json!({"type": "Polygon", "coordinates": [[[0, 0], [0.5, 0], [0.5, 0.5], [0, 0.5], [0, 0]]]});
    let feature = json!({"type": "Feature", "properties": {"note": "a\u{0}b"}, "geometry": square});
    invalid(
        post(
            "/api/v1/rois/plan",
            json!({"name": "r", "year": 2024, "dataset": "d", "geojson": feature}),
        )
        .await,
        "geojson",
    );
    invalid(
        post(
            "/api/v1/rois/plan",
            json!({"name": "r\u{0}", "year": 2024, "dataset": "d", "bbox": [0, 0, 1, 1]}),
        )
        .await,
        "name",
    );
}

/// H7: a whole-world bbox (6,480,000 tiles) made one job per tile in one
/// transaction; now a client gets 422 with the count, the cap and what to
/// do, may not lift the cap itself, and an admin may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_world_roi_needs_an_admin_override() {
    let dir = scratch("e2e-roi-cap-");
    let server = server_on_shared(dir.path(), 10_000).await;
    let admin = server.api();
    // Planning needs the dataset, not its model.
    admin
        .post(
            "/api/v1/datasets",
            json!({"name": "world", "input_prefix": "inputs"}),
        )
        .await;
    let client = admin.with_token(&client_token(&admin).await);
    let world = json!({"name": "world", "year": 2024, "dataset": "world",
                       "bbox": [-180, -90, 180, 90]});

    let m = invalid(
        client
            .raw(reqwest::Method::POST, "/api/v1/rois", Some(world.clone()))
            .await,
        "bbox",
    );
    assert!(
        m.contains("6480000 tiles") && m.contains("at most 250000") && m.contains("Split"),
        "{m}"
    );
    let jobs: Vec<Value> = admin.get("/api/v1/jobs").await["jobs"]
        .as_array()
        .unwrap()
        .clone();
    assert!(jobs.is_empty(), "nothing was queued");

    let mut lifted = world.clone();
    lifted["exceed_tile_cap"] = json!(true);
    let (status, body) = client
        .raw(
            reqwest::Method::POST,
            "/api/v1/rois/plan",
            Some(lifted.clone()),
        )
        .await;
    assert_eq!(status, 403, "{body}");

    // An admin may (planned only here: inserting 6.48 M jobs is the
    // benchmark's business, not a test's).
    let planned = admin.post("/api/v1/rois/plan", lifted).await;
    assert_eq!(planned["total"], 6_480_000, "{planned}");
    // Under the cap a client needs nothing.
    let small = json!({"name": "small", "year": 2024, "dataset": "world",
                       "bbox": [0, 0, 1, 1], "dry_run": true});
    let planned = client.post("/api/v1/rois", small).await;
    assert_eq!(planned["total"], 100, "{planned}");
}

/// L14: a job whose labels, kind or cost no registered agent has waited
/// forever without a word. With no agent registered yet it is taken and
/// its view says why it waits; once agents exist such a submission is
/// refused with the field and the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_no_registered_agent_could_take_is_flagged_or_refused() {
    let dir = scratch("e2e-unmatchable-");
    let server = server_on_shared(dir.path(), 10_000).await;
    let api = server.api();
    let gpu_job = json!({"kind": "command", "command": "true", "labels": {"gpu": "h100"}});
    let early = api.submit(gpu_job.clone()).await;
    assert_eq!(
        api.job(&early).await.unmatchable.as_deref(),
        Some("no agent has registered yet")
    );

    let token = api.agent_token("cpu").await;
    let agent = api.agent_process(&token);
    agent
        .post(
            "/api/agent/v1/register",
            json!({"name": "cpu", "instance": agent.instance(), "capacity": 2,
                   "labels": {"os": "linux"}, "kinds": ["command"], "version": "test",
                   "health": serde_json::to_value(flotilla_core::health::HostHealth::default()).unwrap()}),
        )
        .await;
    let said = api.job(&early).await.unmatchable.unwrap();
    assert!(
        said.contains(r#"carries the labels {"gpu": "h100"}"#),
        "{said}"
    );
    // In /metrics such a job is waiting but not ready work: no agent is
    // coming for it, so it would hold the oldest wait up for ever.
    let metric = |name: &'static str| {
        let api = api.clone();
        async move {
            let text = api.metrics().await;
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} in\n{text}"));
            line[name.len() + 1..].parse::<f64>().unwrap()
        }
    };
    assert_eq!(
        metric("flotilla_jobs_unmatchable{kind=\"command\"}").await,
        1.0
    );
    assert_eq!(metric("flotilla_jobs_ready{kind=\"command\"}").await, 0.0);
    assert_eq!(
        metric("flotilla_queue_oldest_ready_seconds{kind=\"command\"}").await,
        0.0
    );

    let post = |body: Value| {
        let api = api.clone();
        async move {
            api.raw(reqwest::Method::POST, "/api/v1/jobs", Some(body))
                .await
        }
    };
    let m = invalid(post(gpu_job).await, "labels");
    assert!(m.contains("gpu") && m.contains("Register an agent"), "{m}");
    let m = invalid(
        post(json!({"kind": "command", "command": "true", "cost": 4})).await,
        "cost",
    );
    assert!(m.contains("largest is 2"), "{m}");
    // What the agent can take goes in, unflagged.
    let submitted = std::time::Instant::now();
    let fine = api
        .submit(json!({"kind": "command", "command": "true", "labels": {"os": "linux"}, "cost": 2}))
        .await;
    assert_eq!(api.job(&fine).await.unmatchable, None);
    // It is ready work, and the oldest wait is its own, not the flagged
    // job's (older by the agent's registration and the refusals above).
    assert_eq!(metric("flotilla_jobs_ready{kind=\"command\"}").await, 1.0);
    let oldest = metric("flotilla_queue_oldest_ready_seconds{kind=\"command\"}").await;
    assert!(
        oldest > 0.0 && oldest <= submitted.elapsed().as_secs_f64() + 0.05,
        "oldest ready {oldest} s, {:?} since the takeable job",
        submitted.elapsed()
    );
    assert_eq!(
        metric("flotilla_jobs_unmatchable{kind=\"command\"}").await,
        1.0
    );
    assert_eq!(
        metric("flotilla_queue_oldest_ready_seconds{kind=\"tile\"}").await,
        0.0
    );
}

/// H7: one submitter may have only so many jobs waiting
/// (`--max-waiting-per-submitter`); past it a job, a retry, an ROI, a
/// revdeps run or a pipeline is refused with 429 saying how many wait and changes nothing, an admin is
/// not limited, and jobs leaving the queue make room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitter_may_have_only_so_many_jobs_waiting() {
    let dir = scratch("e2e-waiting-cap-");
    let mut opts = flotilla_e2e::procs::opts_on_shared(dir.path(), 10_000).await;
    opts.env
        .push(("FLOTILLA_MAX_WAITING_PER_SUBMITTER".into(), "5".into()));
    let database_url = opts.database_url.clone();
    let server = flotilla_e2e::procs::Server::start(dir.path(), opts).await;
    let admin = server.api();
    let client = admin.with_token(&client_token(&admin).await);
    let job = json!({"kind": "command", "command": "true"});
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(client.submit(job.clone()).await);
    }
    let refused = |(status, body): (u16, Value), what: &str| {
        assert_eq!(status, 429, "{what}: {body}");
        let m = body["error"]["message"].as_str().unwrap().to_string();
        assert!(
            m.contains("has 5 jobs waiting") && m.contains("at most 5"),
            "{what}: {m}"
        );
    };
    refused(
        client
            .raw(reqwest::Method::POST, "/api/v1/jobs", Some(job.clone()))
            .await,
        "a sixth job",
    );
    // While a refusal is remembered (a second), the next one is answered
    // before any database work: it comes at once even with the agents
    // table locked, which the check of who could take a job reads. Each
    // try first submits a refused job (counted again, and so remembered
    // afresh, once the memory has run out); a try whose second job reaches
    // the server after the memory ran out waits on the lock, so three.
    let db = sqlx::PgPool::connect(&database_url).await.unwrap();
    let mut answered = None;
    for _ in 0..3 {
        refused(
            client
                .raw(reqwest::Method::POST, "/api/v1/jobs", Some(job.clone()))
                .await,
            "a job past the cap",
        );
        let mut lock = db.begin().await.unwrap();
        sqlx::query("LOCK TABLE agents IN ACCESS EXCLUSIVE MODE")
            .execute(&mut *lock)
            .await
            .unwrap();
        let attempt = tokio::time::timeout(
            Duration::from_millis(900),
            client.raw(reqwest::Method::POST, "/api/v1/jobs", Some(job.clone())),
        )
        .await;
        lock.rollback().await.unwrap();
        if let Ok(reply) = attempt {
            answered = Some(reply);
            break;
        }
    }
    refused(
        answered.expect("a remembered refusal waited on the database three times"),
        "a job past the cap, the agents table locked",
    );
    // An ROI of 100 missing tiles: refused whole, no ROI and no tile job.
    let ckpt = flotilla_e2e::tiles::synth_ckpt(dir.path(), flotilla_e2e::tiles::TINY, 3);
    flotilla_e2e::tiles::register_dataset(&server, "capped", &ckpt).await;
    let roi = json!({"name": "r", "year": 2024, "dataset": "capped", "bbox": [0, 0, 1, 1]});
    refused(
        client
            .raw(reqwest::Method::POST, "/api/v1/rois", Some(roi))
            .await,
        "an ROI",
    );
    assert_eq!(admin.get("/api/v1/rois").await["rois"], json!([]));
    // A revdeps run and a pipeline each queue a first job: refused too.
    refused(
        client
            .raw(
                reqwest::Method::POST,
                "/api/v1/revdeps",
                Some(json!({"target": "a.1", "compiler": "c.1", "repo": "/nowhere"})),
            )
            .await,
        "a revdeps run",
    );
    let source =
        "host a = agent capped-a\nitems on a: seq 1 2\nstage s on a out /tmp/{id}: echo > {out}\n";
    refused(
        client
            .raw(
                reqwest::Method::POST,
                "/api/v1/pipelines",
                Some(json!({"name": "capped.pipeline", "source": source})),
            )
            .await,
        "a pipeline",
    );
    assert_eq!(admin.get("/api/v1/revdeps").await["runs"], json!([]));
    let all = admin.get("/api/v1/jobs?limit=100").await;
    assert_eq!(all["jobs"].as_array().unwrap().len(), 5, "{all}");
    // An admin is not limited.
    admin.submit(job.clone()).await;
    // A cancelled job leaves the queue: room for one more, not for the
    // cancelled one's retry on top. (The middle one: the span of the
    // submitter's fair-share tags still says 5, the count says 4.) The
    // server remembers its last refusal for a moment (queue_policy.rs),
    // but not past the submitter's own cancel.
    client
        .post(&format!("/api/v1/jobs/{}/cancel", ids[2]), json!({}))
        .await;
    client.submit(job.clone()).await;
    refused(
        client
            .raw(
                reqwest::Method::POST,
                &format!("/api/v1/jobs/{}/retry", ids[2]),
                Some(json!({})),
            )
            .await,
        "a retry",
    );
}
