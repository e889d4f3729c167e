//! Job logs at volume: an attempt's stored log is capped (head and tail
//! kept, the cut marked), `/log` streams the whole log or answers pages,
//! and `flotilla jobs log` prints exactly what the API holds.

use std::time::Duration;

use flotilla_core::api::logs::{LOG_MORE_HEADER, LOG_NEXT_HEADER};
use flotilla_core::job::JobState;
use flotilla_e2e::procs::{opts_on_shared, Agent, Server, ServerOpts};
use flotilla_e2e::{binary, scratch};
use serde_json::json;

const CAP: u64 = 256 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_log_is_capped_and_read_in_pages() {
    let dir = scratch("e2e-logs-");
    let server = Server::start(
        dir.path(),
        ServerOpts {
            env: vec![("FLOTILLA_LOG_CAP_BYTES".into(), CAP.to_string())],
            ..opts_on_shared(dir.path(), 5_000).await
        },
    )
    .await;
    let api = server.api();
    let _agent = Agent::start(&server, "chatty", 1, &[]).await;

    // About 8 MB: 8,000 lines of 999 bytes between a first and a last line.
    let id = api
        .submit(json!({
            "kind": "command",
            "command": "echo first line; head -c 7992000 /dev/zero | tr '\\0' x | fold -w 999; echo; echo last line",
            "max_attempts": 1,
        }))
        .await;
    let j = api.wait_final(&id, Duration::from_secs(120)).await;
    assert_eq!(j.state, JobState::Succeeded, "{j:?}");

    // The whole log, streamed: the head and the tail, the cut marked, and
    // no more than the cap of line text.
    let (status, whole) = api
        .raw(
            reqwest::Method::GET,
            &format!("/api/v1/jobs/{id}/log"),
            None,
        )
        .await;
    assert_eq!(status, 200);
    let whole = whole.as_str().unwrap().to_string();
    let lines: Vec<&str> = whole.lines().collect();
    assert_eq!(lines.first(), Some(&"first line"));
    assert_eq!(lines.last(), Some(&"last line"));
    let marker = lines
        .iter()
        .find(|l| l.starts_with("[flotilla] ") && l.contains("cut here"))
        .unwrap_or_else(|| panic!("no cut marker among {} lines", lines.len()));
    let text_bytes: usize = lines
        .iter()
        .filter(|l| !l.starts_with("[flotilla] "))
        .map(|l| l.len())
        .sum();
    assert!(
        text_bytes as u64 <= CAP,
        "{text_bytes} bytes of log kept, cap {CAP}"
    );
    assert!(
        text_bytes as u64 > CAP / 2,
        "head and tail both kept: {text_bytes} bytes"
    );
    let cut: u64 = marker
        .trim_start_matches("[flotilla] ")
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("the marker counts the lines cut");
    let kept_x = lines.iter().filter(|l| l.starts_with('x')).count() as u64;
    assert_eq!(
        kept_x + cut,
        8_000,
        "every line kept or counted as cut: {marker}"
    );

    // Pages of 100 lines, following the next position, give the same text;
    // a full page says there is more, the last one does not.
    let mut after = 0i64;
    let mut paged = String::new();
    let mut pages = 0;
    loop {
        let resp = api
            .http
            .get(format!(
                "{}/api/v1/jobs/{id}/log?after={after}&limit=100",
                api.base
            ))
            .bearer_auth(&api.token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let next: i64 = resp.headers()[LOG_NEXT_HEADER]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let more = resp.headers()[LOG_MORE_HEADER].to_str().unwrap() == "true";
        let text = resp.text().await.unwrap();
        pages += 1;
        if more {
            assert_eq!(text.lines().count(), 100, "a full page");
            assert!(next > after);
        }
        paged.push_str(&text);
        after = next;
        if !more {
            break;
        }
    }
    assert_eq!(paged, whole, "pages add up to the whole log");
    assert!(pages > 2, "{pages} pages");
    // A follower past the end gets nothing new, and the same position.
    let resp = api
        .http
        .get(format!("{}/api/v1/jobs/{id}/log?after={after}", api.base))
        .bearer_auth(&api.token)
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.headers()[LOG_NEXT_HEADER].to_str().unwrap(),
        after.to_string()
    );
    assert_eq!(resp.text().await.unwrap(), "");

    // The CLI prints what the API holds, page by page.
    let out = tokio::process::Command::new(binary("flotilla"))
        .args([
            "jobs", "log", &id, "--server", &api.base, "--token", &api.token,
        ])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), whole);
    let out = tokio::process::Command::new(binary("flotilla"))
        .args([
            "jobs", "log", "--follow", &id, "--server", &api.base, "--token", &api.token,
        ])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), whole);

    // An unknown job's log is a 404, not an empty page.
    let (status, _) = api
        .raw(
            reqwest::Method::GET,
            "/api/v1/jobs/00000000-0000-0000-0000-000000000000/log",
            None,
        )
        .await;
    assert_eq!(status, 404);
}

/// A log batch the agent sends again because its answer was lost (a
/// timeout, a 5xx, a server restart) is stored once: the agent numbers its
/// batches per attempt and the server keeps the highest it stored (each
/// line was stored as often as it came). An agent that does not number
/// them (batch 0) has every batch stored, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_batch_sent_again_is_stored_once() {
    let dir = scratch("e2e-logs-again-");
    let server = flotilla_e2e::procs::server_on_shared(dir.path(), 30_000).await;
    let agent = flotilla_e2e::driven::Driven::register(
        &server,
        "resender",
        &["command"],
        Duration::from_secs(10),
    )
    .await;
    let id = server
        .api()
        .submit(json!({"kind": "command", "command": "true", "max_attempts": 1}))
        .await;
    let (job, lease) = agent.lease().await;
    assert_eq!(job, id);
    for (batch, line) in [
        (1, "one"),
        (1, "one"),
        (2, "two"),
        (1, "one"),
        (2, "two"),
        (3, "three"),
        (0, "unnumbered"),
        (0, "unnumbered"),
    ] {
        agent
            .api
            .post(
                &format!("/api/agent/v1/jobs/{job}/log"),
                json!({"lease_token": lease, "batch": batch,
                       "lines": [{"stream": "stdout", "line": line}]}),
            )
            .await;
    }
    let (status, text) = server
        .api()
        .raw(
            reqwest::Method::GET,
            &format!("/api/v1/jobs/{id}/log?after=0&limit=100"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{text}");
    let text = text.as_str().expect("the log as text").to_string();
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        ["one", "two", "three", "unnumbered", "unnumbered"],
        "{text}"
    );
}
