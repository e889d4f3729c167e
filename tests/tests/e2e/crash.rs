//! Crashes: the server killed with SIGKILL mid-run, PostgreSQL restarted
//! under a running server. Nothing is lost, nothing runs to completion twice.

use std::time::Duration;

use flotilla_core::job::JobState;
use flotilla_e2e::procs::{free_addr, server_on_shared, Agent, Server, ServerOpts};
use flotilla_e2e::scratch;
use flotilla_server::embedded_pg::EmbeddedPostgres;
use serde_json::json;

fn marker_job(marks: &std::path::Path, sleep: &str) -> serde_json::Value {
    json!({
        "kind": "command",
        "command": format!("sleep {sleep}; echo $FLOTILLA_ATTEMPT >> {}/$FLOTILLA_JOB_ID", marks.display()),
        "max_attempts": 5,
    })
}

/// The server is SIGKILLed while agents run jobs and restarted on the same
/// address: every job reaches a final state, succeeded, and each ran to
/// completion once (one line in its marker file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_and_restarted_loses_nothing_and_repeats_nothing() {
    let dir = scratch("e2e-kill-server-");
    let mut server = server_on_shared(dir.path(), 4_000).await;
    // Restart on the same address so agents find it again.
    let opts = ServerOpts {
        listen: server.addr,
        ..server.opts.clone()
    };
    server.opts = opts;
    let api = server.api();
    let marks = dir.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let _a = Agent::start(&server, "crash-a", 3, &[]).await;
    let _b = Agent::start(&server, "crash-b", 3, &[]).await;
    let mut ids = Vec::new();
    for _ in 0..40 {
        ids.push(api.submit(marker_job(&marks, "0.4")).await);
    }
    // Let some finish and some be in flight, then crash.
    flotilla_e2e::eventually("a few jobs to finish", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            api.get("/api/v1/jobs?state=succeeded&limit=1000").await["jobs"]
                .as_array()
                .is_some_and(|a| a.len() >= 5)
        }
    })
    .await;
    server.kill().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.restart().await;
    let api = server.api();
    for _ in 0..10 {
        ids.push(api.submit(marker_job(&marks, "0.1")).await);
    }
    for id in &ids {
        let j = api.wait_final(id, Duration::from_secs(180)).await;
        assert_eq!(j.state, JobState::Succeeded, "job {id}: {:?}", j.error);
        let runs = std::fs::read_to_string(marks.join(id)).unwrap();
        assert_eq!(
            runs.lines().count(),
            1,
            "job {id} ran to completion {} times",
            runs.lines().count()
        );
    }
}

/// PostgreSQL restarted under a running server: the server reconnects and
/// carries on; jobs submitted before and after all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_under_running_server() {
    let dir = scratch("e2e-pg-restart-");
    // Its own cluster: restarting the shared one would disturb other tests.
    let pg = EmbeddedPostgres::start(&dir.path().join("pgc"))
        .await
        .unwrap();
    pg.ensure_database("flotilla").await.unwrap();
    let server = Server::start(
        dir.path(),
        ServerOpts {
            database_url: pg.database_url("flotilla"),
            store: dir.path().join("store").to_string_lossy().into_owned(),
            listen: free_addr(),
            lease_ttl_ms: 5_000,
            backoff_base_ms: 200,
            env: Vec::new(),
        },
    )
    .await;
    let api = server.api();
    let _agent = Agent::start(&server, "pg-restart", 2, &[]).await;
    let marks = dir.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.push(api.submit(marker_job(&marks, "0.3")).await);
    }
    pg.restart().await.unwrap();
    server.wait_healthy(Duration::from_secs(60)).await;
    for _ in 0..10 {
        // The first calls after the restart may meet dead pooled
        // connections; the API answers 503 then, and the client retries.
        let mut tries = 0;
        loop {
            let (status, v) = api
                .raw(
                    reqwest::Method::POST,
                    "/api/v1/jobs",
                    Some(marker_job(&marks, "0.1")),
                )
                .await;
            if status == 201 {
                ids.push(v["id"].as_str().unwrap().to_string());
                break;
            }
            tries += 1;
            assert!(
                tries < 20 && status == 503,
                "submit after restart: {status} {v}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    for id in &ids {
        let j = api.wait_final(id, Duration::from_secs(120)).await;
        assert_eq!(j.state, JobState::Succeeded, "job {id}: {:?}", j.error);
        let runs = std::fs::read_to_string(marks.join(id)).unwrap();
        assert_eq!(
            runs.lines().count(),
            1,
            "job {id} ran {} times",
            runs.lines().count()
        );
    }
    drop(server);
    pg.stop_now().await.unwrap();
}

/// PostgreSQL down for longer than the lease TTL while jobs run: nobody
/// could take the agents' heartbeats, so once the database answers again
/// the live leases get a grace period before the reaper looks at them, and
/// each job finishes in its first attempt (before the fix every one was
/// re-queued and run again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_outage_longer_than_the_lease_ttl_loses_no_running_job() {
    let dir = scratch("e2e-pg-outage-");
    let cluster = dir.path().join("pgc");
    let pg = EmbeddedPostgres::start(&cluster).await.unwrap();
    pg.ensure_database("flotilla").await.unwrap();
    let server = Server::start(
        dir.path(),
        ServerOpts {
            database_url: pg.database_url("flotilla"),
            store: dir.path().join("store").to_string_lossy().into_owned(),
            listen: free_addr(),
            lease_ttl_ms: 2_000,
            backoff_base_ms: 200,
            env: Vec::new(),
        },
    )
    .await;
    let api = server.api();
    let _agent = Agent::start(&server, "outage", 2, &[]).await;
    let marks = dir.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let ids = [
        api.submit(marker_job(&marks, "10")).await,
        api.submit(marker_job(&marks, "10")).await,
    ];
    flotilla_e2e::eventually("both jobs to run", Duration::from_secs(30), || {
        let api = api.clone();
        let ids = ids.clone();
        async move {
            for id in &ids {
                if api.job(id).await.state != JobState::Running {
                    return false;
                }
            }
            true
        }
    })
    .await;
    pg.stop_now().await.unwrap();
    // Three lease TTLs without the database.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let pg = EmbeddedPostgres::start(&cluster).await.unwrap();
    server.wait_healthy(Duration::from_secs(60)).await;
    for id in &ids {
        let j = api.wait_final(id, Duration::from_secs(60)).await;
        assert_eq!(j.state, JobState::Succeeded, "job {id}: {:?}", j.error);
        assert_eq!(j.attempt, 1, "job {id} was run again: {:?}", j.error);
        let runs = std::fs::read_to_string(marks.join(id)).unwrap();
        assert_eq!(runs.lines().collect::<Vec<_>>(), ["1"], "job {id}");
    }
    drop(server);
    pg.stop_now().await.unwrap();
}

/// A lease whose answer was lost with its server (SIGKILLed after the claim
/// committed) is answered again to the agent's retry of the same request
/// once a server is back, instead of the job sitting leased until its
/// lease runs out and costing an attempt (reliability review L6; the
/// pipelines test lost an item this way with its steps' single attempt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_answer_lost_with_its_server_is_answered_again() {
    let dir = scratch("e2e-lost-lease-");
    let mut server = server_on_shared(dir.path(), 10_000).await;
    server.opts = ServerOpts {
        listen: server.addr,
        ..server.opts.clone()
    };
    let agent = flotilla_e2e::driven::Driven::register(
        &server,
        "retrier",
        &["command"],
        Duration::from_secs(10),
    )
    .await;
    let id = server
        .api()
        .submit(json!({"kind": "command", "command": "true", "max_attempts": 1}))
        .await;
    let request = uuid::Uuid::new_v4().to_string();
    let ask = |request: String| json!({"wait_ms": 5_000, "request": request});
    // The first try: the job is leased (the agent, say, never read this).
    let first = agent
        .api
        .post("/api/agent/v1/lease", ask(request.clone()))
        .await;
    assert_eq!(first["job"]["job_id"], id.as_str(), "{first}");
    server.kill().await;
    server.restart().await;
    let agent_api = agent.api.reconnected();
    let again = agent_api.post("/api/agent/v1/lease", ask(request)).await;
    assert_eq!(again["job"]["job_id"], id.as_str(), "{again}");
    assert_eq!(
        again["job"]["lease_token"], first["job"]["lease_token"],
        "{again}"
    );
    assert_eq!(again["job"]["attempt"], 1, "{again}");
    // A new request finds nothing more to lease.
    let other = agent_api
        .post(
            "/api/agent/v1/lease",
            json!({"wait_ms": 0, "request": uuid::Uuid::new_v4().to_string()}),
        )
        .await;
    assert!(other["job"].is_null(), "{other}");
}
