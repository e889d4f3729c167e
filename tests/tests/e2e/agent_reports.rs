//! End-to-end tests of what the agent delivers to the server: every log line
//! whatever its length or bytes, and a prompt stop when the server is gone.

use std::time::{Duration, Instant};

use flotilla_core::job::JobState;
use flotilla_e2e::procs::{server_on_shared, Agent};
use flotilla_e2e::{eventually, scratch};
use serde_json::json;

/// H1: a job whose output makes log batches over the server's 1 MiB body
/// limit (3,000 lines of 3,000 bytes; lines of 60,000 control characters,
/// six bytes each in JSON; lines of quotes and backslashes) has every line
/// in its log. Batches were capped by count only, and the 413 for a 1.5 MB
/// batch dropped its 500 lines with a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_and_escape_heavy_log_lines_all_reach_the_log() {
    let dir = scratch("e2e-log-bytes-");
    let server = server_on_shared(dir.path(), 10_000).await;
    let api = server.api();
    let _agent = Agent::start(&server, "logger", 1, &[]).await;
    let command = r#"
        x=$(head -c 3000 /dev/zero | tr '\0' x)
        i=0; while [ $i -lt 3000 ]; do printf '%s\n' "$x"; i=$((i+1)); done
        j=0; while [ $j -lt 10 ]; do
          head -c 60000 /dev/zero | tr '\0' '\001'; echo
          head -c 30000 /dev/zero | tr '\0' '"'; head -c 30000 /dev/zero | tr '\0' '\\'; echo
          j=$((j+1))
        done"#;
    let id = api
        .submit(json!({"kind": "command", "command": command, "max_attempts": 1}))
        .await;
    let j = api.wait_final(&id, Duration::from_secs(180)).await;
    assert_eq!(j.state, JobState::Succeeded, "{:?}", j.error);

    let mut expected = vec!["x".repeat(3000); 3000];
    for _ in 0..10 {
        expected.push("\u{1}".repeat(60_000));
        expected.push(format!("{}{}", "\"".repeat(30_000), "\\".repeat(30_000)));
    }
    let (status, log) = api
        .raw(
            reqwest::Method::GET,
            &format!("/api/v1/jobs/{id}/log"),
            None,
        )
        .await;
    assert_eq!(status, 200);
    let log = log.as_str().expect("the log is text");
    let got: Vec<&str> = log.lines().collect();
    assert_eq!(got.len(), expected.len(), "every line, none lost");
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert!(
            g == e,
            "line {i} differs: {} bytes, expected {}",
            g.len(),
            e.len()
        );
    }
}

/// H3: SIGTERM with the server stopped: the agent stops its job (2 s kill
/// grace), gives up the report once the lease has certainly expired (a TTL
/// of 10 s after the last heartbeat) and exits, well within systemd's 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_stops_promptly_after_sigterm_while_the_server_is_down() {
    let dir = scratch("e2e-stop-server-down-");
    let mut server = server_on_shared(dir.path(), 10_000).await;
    let api = server.api();
    let mut agent = Agent::start(&server, "stopper", 1, &[]).await;
    let id = api
        .submit(json!({"kind": "command", "command": "echo started; sleep 600", "max_attempts": 3}))
        .await;
    eventually("the job to run", Duration::from_secs(60), || {
        let api = api.clone();
        let id = id.clone();
        async move { api.job(&id).await.state == JobState::Running }
    })
    .await;

    server.kill().await;
    let stopping = Instant::now();
    let status = agent.stop_within(Duration::from_secs(60)).await;
    let took = stopping.elapsed();
    let status = status.unwrap_or_else(|| panic!("the agent still runs 60 s after SIGTERM"));
    assert!(status.success(), "{status}");
    // Kill grace 2 s + lease TTL 10 s + a try in flight.
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

/// M10: a failed attempt's work directory was kept for ever, so a job
/// failing in a loop filled the agent's disk; now only the last few
/// (`--keep-failed-dirs`) stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_leave_only_the_last_few_work_directories() {
    let dir = scratch("e2e-failed-dirs-");
    let server = server_on_shared(dir.path(), 10_000).await;
    let api = server.api();
    let _agent = Agent::start(&server, "failer", 2, &["--keep-failed-dirs", "2"]).await;
    let mut ids = Vec::new();
    for i in 0..8 {
        let command = format!("echo {i} > mark; exit 3");
        ids.push(
            api.submit(json!({"kind": "command", "command": command, "max_attempts": 1}))
                .await,
        );
    }
    for id in &ids {
        let j = api.wait_final(id, Duration::from_secs(120)).await;
        assert_eq!(j.state, JobState::Failed, "{:?}", j.error);
    }
    let jobs = server.dir.join("agents").join("failer").join("jobs");
    let left: Vec<_> = std::fs::read_dir(&jobs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    for d in &left {
        assert!(
            d.join("mark").exists(),
            "a failed attempt's own files stay: {d:?}"
        );
    }
}
