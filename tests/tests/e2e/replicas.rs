//! Several servers on one database: an agent given every server's URL
//! works through whichever answers, and a rolling upgrade (each server
//! stopped and started again in turn while agents run jobs) fails no job
//! and runs none to completion twice; an index an interrupted migration
//! left invalid is found.

use std::time::{Duration, Instant};

use flotilla_core::job::JobState;
use flotilla_e2e::procs::{opts_on_shared, Agent, Server, ServerOpts};
use flotilla_e2e::scratch;
use serde_json::json;

fn marker_job(marks: &std::path::Path) -> serde_json::Value {
    json!({
        "kind": "command",
        "command": format!("sleep 0.3; echo $FLOTILLA_ATTEMPT >> {}/$FLOTILLA_JOB_ID", marks.display()),
    })
}

/// Stops a server as an upgrade would (SIGTERM), waits until it no longer
/// answers, and reaps it; [`Server::restart`] starts it again on the same
/// address.
async fn stop(server: &mut Server) -> Duration {
    let started = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signalling the server");
    let http = reqwest::Client::new();
    let health = format!("{}/healthz", server.url());
    while http.get(&health).send().await.is_ok() && started.elapsed() < Duration::from_secs(40) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stopped = started.elapsed();
    server.kill().await;
    stopped
}

/// Jobs `agent` finished, by the API of `server`.
async fn done_by(server: &Server, agent: &str) -> usize {
    server
        .api()
        .get(&format!(
            "/api/v1/jobs?state=succeeded&agent={agent}&limit=1000"
        ))
        .await["jobs"]
        .as_array()
        .map_or(0, Vec::len)
}

/// Succeeded jobs, by the API of `server`.
async fn succeeded(server: &Server) -> usize {
    server
        .api()
        .get("/api/v1/jobs?state=succeeded&limit=1000")
        .await["jobs"]
        .as_array()
        .map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_upgrade_of_two_replicas_fails_no_job() {
    let dir = scratch("e2e-replicas-");
    let opts = opts_on_shared(dir.path(), 4_000).await;
    let fixed = |o: &ServerOpts| ServerOpts {
        listen: flotilla_e2e::procs::free_addr(),
        ..o.clone()
    };
    // Two replicas on one database and one store, each with a directory
    // (and admin token) of its own.
    let a_dir = dir.path().join("a");
    let b_dir = dir.path().join("b");
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::create_dir_all(&b_dir).unwrap();
    let mut a = Server::start(&a_dir, fixed(&opts)).await;
    let mut b = Server::start(&b_dir, fixed(&opts)).await;
    let marks = dir.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    // Each agent knows both servers, one starting at each.
    let _x = Agent::start(&a, "replica-x", 3, &["--server", &b.url()]).await;
    let _y = Agent::start(&b, "replica-y", 3, &["--server", &a.url()]).await;

    let mut ids = Vec::new();
    for i in 0..60 {
        // Submissions alternate between the replicas.
        let api = if i % 2 == 0 { a.api() } else { b.api() };
        ids.push(api.submit(marker_job(&marks)).await);
    }
    flotilla_e2e::eventually("a few jobs to finish", Duration::from_secs(60), || {
        let a = &a;
        async move { succeeded(a).await >= 6 }
    })
    .await;
    // Upgrade A while B serves, then B while A serves, with jobs running.
    // While one is down, the agent that started on it finishes jobs
    // through the other: it moved on rather than waiting.
    let stop_a = stop(&mut a).await;
    for _ in 0..10 {
        ids.push(b.api().submit(marker_job(&marks)).await);
    }
    let x_before = done_by(&b, "replica-x").await;
    flotilla_e2e::eventually(
        "replica-x to work through B while A is down",
        Duration::from_secs(60),
        || {
            let b = &b;
            async move { done_by(b, "replica-x").await >= x_before + 3 }
        },
    )
    .await;
    a.restart().await;
    let stop_b = stop(&mut b).await;
    for _ in 0..10 {
        ids.push(a.api().submit(marker_job(&marks)).await);
    }
    let y_before = done_by(&a, "replica-y").await;
    flotilla_e2e::eventually(
        "replica-y to work through A while B is down",
        Duration::from_secs(60),
        || {
            let a = &a;
            async move { done_by(a, "replica-y").await >= y_before + 3 }
        },
    )
    .await;
    b.restart().await;
    eprintln!("replicas: A stopped in {stop_a:?}, B in {stop_b:?}");

    let api = a.api();
    let mut rerun = Vec::new();
    for id in &ids {
        let j = api.wait_final(id, Duration::from_secs(180)).await;
        assert_eq!(j.state, JobState::Succeeded, "job {id}: {:?}", j.error);
        let runs = std::fs::read_to_string(marks.join(id)).unwrap();
        assert_eq!(
            runs.lines().count(),
            1,
            "job {id} ran to completion {runs:?}"
        );
        if runs.trim() != "1" {
            rerun.push((id.clone(), runs.trim().to_string()));
        }
    }
    // A graceful stop hands back nothing an agent holds: no job needed a
    // second attempt.
    assert!(
        rerun.is_empty(),
        "jobs that needed another attempt: {rerun:?}"
    );
    // Both agents worked throughout and are still registered and online.
    let agents = api.get("/api/v1/agents").await;
    let agents = agents["agents"]
        .as_array()
        .or(agents.as_array())
        .cloned()
        .unwrap_or_default();
    for name in ["replica-x", "replica-y"] {
        let agent = agents
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("{name} listed"));
        assert_eq!(agent["online"], true, "{agent}");
    }
}

/// Every connection the server makes has a statement timeout (a statement
/// running past it fails with `query_canceled`), and the migrations, which
/// may rightly run longer, are not held to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_have_a_statement_timeout_that_migrations_do_not() {
    use flotilla_server::serve;
    let pg = flotilla_e2e::pg::shared().await;
    let db = flotilla_e2e::pg::fresh_database(pg).await;
    let opts: sqlx::postgres::PgConnectOptions = pg.database_url(&db).parse().unwrap();
    // 1 ms: shorter than many a migration's statements.
    let opts = serve::with_statement_timeout(opts, Duration::from_millis(1));
    let pool = serve::connect_sized(opts, Duration::from_secs(10), 2)
        .await
        .unwrap();
    serve::migrate(&pool)
        .await
        .expect("migrations are not held to the limit");
    // Both connections of the pool, the one that migrated included, are.
    let mut c1 = pool.acquire().await.unwrap();
    let mut c2 = pool.acquire().await.unwrap();
    for conn in [&mut c1, &mut c2] {
        let err = sqlx::query("SELECT pg_sleep(1)")
            .execute(&mut **conn)
            .await
            .expect_err("a statement past the limit is cancelled");
        let code = err
            .as_database_error()
            .and_then(|e| e.code())
            .unwrap_or_default();
        assert_eq!(code, "57014", "{err}");
        let limit: String = sqlx::query_scalar("SHOW statement_timeout")
            .fetch_one(&mut **conn)
            .await
            .unwrap();
        assert_eq!(limit, "1ms");
    }
}

/// A `CREATE INDEX CONCURRENTLY` that fails leaves its index behind,
/// invalid, and a migration's `IF NOT EXISTS` would then take it for
/// built: the server looks for such indexes after migrating (and names
/// each in an error with how to rebuild it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_left_invalid_by_an_interrupted_build_is_found() {
    let db = flotilla_e2e::pg::migrated_database().await;
    assert_eq!(
        flotilla_server::serve::invalid_indexes(&db).await.unwrap(),
        Vec::<String>::new(),
        "every index the migrations build is valid"
    );
    // A unique index over a column holding one value twice: the build
    // fails once its table is scanned, its index left behind.
    for sql in [
        "CREATE TABLE twice (v integer)",
        "INSERT INTO twice VALUES (1), (1)",
    ] {
        sqlx::query(sql).execute(&db).await.unwrap();
    }
    let built = sqlx::query("CREATE UNIQUE INDEX CONCURRENTLY half_built ON twice (v)")
        .execute(&db)
        .await;
    assert!(built.is_err(), "{built:?}");
    assert_eq!(
        flotilla_server::serve::invalid_indexes(&db).await.unwrap(),
        ["half_built"]
    );
    db.close().await;
}
