//! End-to-end tests of the orchestrator core: real PostgreSQL, real server
//! and agent processes over HTTP on loopback.

use std::time::Duration;

use flotilla_core::job::JobState;
use flotilla_e2e::procs::{server_on_shared, Agent};
use flotilla_e2e::{eventually, scratch};
use serde_json::json;

/// 500 command jobs across 3 agents all succeed, each exactly once: one
/// attempt, one succeeded attempt row, one line in its marker file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_jobs_across_three_agents_succeed_exactly_once() {
    let dir = scratch("e2e-500-");
    let server = server_on_shared(dir.path(), 10_000).await;
    let api = server.api();
    let marks = dir.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let mut agents = Vec::new();
    for i in 0..3 {
        agents.push(Agent::start(&server, &format!("agent-{i}"), 4, &[]).await);
    }
    let mut ids = Vec::new();
    for i in 0..500 {
        let id = api
            .submit(json!({
                "kind": "command",
                "command": format!("echo $FLOTILLA_JOB_ID >> {}/$FLOTILLA_JOB_ID; echo job {i}", marks.display()),
                "max_attempts": 3,
            }))
            .await;
        ids.push(id);
    }
    let mut by_agent = std::collections::BTreeMap::<String, usize>::new();
    for id in &ids {
        let j = api.wait_final(id, Duration::from_secs(300)).await;
        assert_eq!(j.state, JobState::Succeeded, "job {id}: {:?}", j.error);
        assert_eq!(j.attempt, 1, "job {id} needed {} attempts", j.attempt);
        *by_agent.entry(j.agent.clone().unwrap()).or_default() += 1;
        let mark = std::fs::read_to_string(marks.join(id)).unwrap();
        assert_eq!(
            mark.lines().count(),
            1,
            "job {id} ran {} times",
            mark.lines().count()
        );
    }
    assert_eq!(
        by_agent.len(),
        3,
        "all three agents took work: {by_agent:?}"
    );
    let log = api
        .raw(
            reqwest::Method::GET,
            &format!("/api/v1/jobs/{}/log", ids[7]),
            None,
        )
        .await;
    assert_eq!(log.1.as_str().unwrap().trim(), "job 7");
}

/// An agent killed with SIGKILL mid-job: its lease expires and the job
/// completes on another agent; a completion from the dead attempt's lease is
/// refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_agent_job_completes_elsewhere_and_late_completion_is_refused() {
    let dir = scratch("e2e-kill-agent-");
    let server = server_on_shared(dir.path(), 1_500).await;
    let api = server.api();

    // Part 1: a test-driven agent takes the job and then "dies" (stops
    // heartbeating), keeping its lease token for a late completion.
    let ghost_token = api.agent_token("ghost").await;
    let ghost = api.agent_process(&ghost_token);
    let health = serde_json::to_value(flotilla_core::health::HostHealth::default()).unwrap();
    ghost
        .post(
            "/api/agent/v1/register",
            json!({"name": "ghost", "instance": ghost.instance(), "capacity": 1, "kinds": ["command"], "version": "test", "health": health}),
        )
        .await;
    let id = api
        .submit(json!({"kind": "command", "command": "echo done", "max_attempts": 3}))
        .await;
    let leased = ghost
        .post("/api/agent/v1/lease", json!({"wait_ms": 5000}))
        .await;
    assert_eq!(leased["job"]["job_id"].as_str(), Some(id.as_str()));
    let ghost_lease = leased["job"]["lease_token"].as_str().unwrap().to_string();

    // Part 2: a real agent process killed with SIGKILL mid-job.
    let id2 = api
        .submit(json!({"kind": "command", "command": "sleep 4; echo slow", "max_attempts": 3}))
        .await;
    let mut doomed = Agent::start(&server, "doomed", 1, &[]).await;
    eventually(
        "the doomed agent to run the slow job",
        Duration::from_secs(30),
        || {
            let api = api.clone();
            let id2 = id2.clone();
            async move { api.job(&id2).await.state == JobState::Running }
        },
    )
    .await;
    doomed.kill().await;

    // A healthy agent picks both up after their leases expire.
    let _survivor = Agent::start(&server, "survivor", 2, &[]).await;
    for job in [&id, &id2] {
        let j = api.wait_final(job, Duration::from_secs(60)).await;
        assert_eq!(j.state, JobState::Succeeded);
        assert_eq!(j.agent.as_deref(), Some("survivor"));
        assert_eq!(j.attempt, 2, "the second attempt finished it");
    }

    // The ghost's late completion: refused as stale, and nothing changes.
    let (status, body) = ghost
        .raw(
            reqwest::Method::POST,
            &format!("/api/agent/v1/jobs/{id}/complete"),
            Some(json!({"lease_token": ghost_lease, "exit_code": 0})),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "stale_lease");
    let j = api.job(&id).await;
    assert_eq!(
        (j.state, j.attempt, j.agent.as_deref()),
        (JobState::Succeeded, 2, Some("survivor"))
    );
}

/// Cancelling a running job kills the whole process tree, grandchildren
/// included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_kills_grandchildren() {
    let dir = scratch("e2e-cancel-");
    let server = server_on_shared(dir.path(), 3_000).await;
    let api = server.api();
    let _agent = Agent::start(&server, "canceller", 1, &[]).await;
    let pidfile = dir.path().join("grandchild.pid");
    let id = api
        .submit(json!({
            "kind": "command",
            "command": format!("sh -c 'sleep 300 & echo $! > {0}.tmp; mv {0}.tmp {0}; wait'; echo never", pidfile.display()),
        }))
        .await;
    eventually("the grandchild to start", Duration::from_secs(30), || {
        let p = pidfile.clone();
        async move { p.exists() }
    })
    .await;
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        process_alive(pid),
        "grandchild {pid} runs before the cancel"
    );
    let (status, body) = api
        .raw(
            reqwest::Method::POST,
            &format!("/api/v1/jobs/{id}/cancel"),
            None,
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let j = api.wait_final(&id, Duration::from_secs(30)).await;
    assert_eq!(j.state, JobState::Cancelled);
    eventually(
        "the grandchild to be gone",
        Duration::from_secs(10),
        || async move { !process_alive(pid) },
    )
    .await;
}

fn process_alive(pid: i32) -> bool {
    // A zombie still has a /proc entry; look at its state.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Bad input gets the right 4xx with a message, and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_changes_nothing() {
    let dir = scratch("e2e-bad-");
    let server = server_on_shared(dir.path(), 3_000).await;
    let api = server.api();
    let url = server.url();
    let http = reqwest::Client::new();
    let post_raw = |body: Vec<u8>, token: Option<&str>| {
        let mut req = http
            .post(format!("{url}/api/v1/jobs"))
            .header("content-type", "application/json")
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let v: serde_json::Value = r.json().await.unwrap();
            (status, v)
        }
    };
    let admin = server.admin_token.clone();
    // (what, body, token, expected status, words the error must contain)
    type Case<'a> = (&'a str, Vec<u8>, Option<&'a str>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (
            "malformed JSON",
            b"{\"kind\": \"command\", ".to_vec(),
            Some(&admin),
            400,
            "malformed JSON",
        ),
        (
            "unknown kind",
            br#"{"kind":"teleport","command":"x"}"#.to_vec(),
            Some(&admin),
            422,
            "unknown variant `teleport`",
        ),
        (
            "missing field",
            br#"{"kind":"command"}"#.to_vec(),
            Some(&admin),
            422,
            "missing field `command`",
        ),
        (
            "empty command",
            br#"{"kind":"command","command":"  "}"#.to_vec(),
            Some(&admin),
            422,
            "`command` is empty",
        ),
        (
            "bad output path",
            br#"{"kind":"command","command":"x","outputs":["../etc"]}"#.to_vec(),
            Some(&admin),
            422,
            "outputs[0]",
        ),
        (
            "zero attempts",
            br#"{"kind":"command","command":"x","max_attempts":0}"#.to_vec(),
            Some(&admin),
            422,
            "max_attempts",
        ),
        (
            // Once accepted: the agent's "cannot make work directory …"
            // then ran past every message limit.
            "oversize workdir",
            format!(
                r#"{{"kind":"command","command":"x","workdir":"{}"}}"#,
                "€".repeat(2000)
            )
            .into_bytes(),
            Some(&admin),
            422,
            "`workdir` is longer than 1024 bytes",
        ),
        (
            "oversize body",
            format!(
                r#"{{"kind":"command","command":"{}"}}"#,
                "x".repeat(2 << 20)
            )
            .into_bytes(),
            Some(&admin),
            413,
            "larger than",
        ),
        (
            "missing token",
            br#"{"kind":"command","command":"x"}"#.to_vec(),
            None,
            401,
            "Authorization",
        ),
        (
            "bad token",
            br#"{"kind":"command","command":"x"}"#.to_vec(),
            Some("flt_nope"),
            401,
            "unknown or revoked token",
        ),
    ];
    for (what, body, token, want, needle) in cases {
        let (status, v) = post_raw(body, token).await;
        assert_eq!(status, want, "{what}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(needle),
            "{what}: message {msg:?} lacks {needle:?}"
        );
        assert!(v["error"]["code"].is_string(), "{what}: no code in {v}");
    }
    // Agent tokens cannot use the client API.
    let agent_token = api.agent_token("a1").await;
    let (status, _) = post_raw(
        br#"{"kind":"command","command":"x"}"#.to_vec(),
        Some(&agent_token),
    )
    .await;
    assert_eq!(status, 403);
    // Nothing was written.
    let list = api.get("/api/v1/jobs").await;
    assert_eq!(
        list["jobs"].as_array().unwrap().len(),
        0,
        "no job was created: {list}"
    );

    // Another agent's lease: a1 takes a job; a2 may not touch it.
    let health = serde_json::to_value(flotilla_core::health::HostHealth::default()).unwrap();
    let a1 = api.agent_process(&agent_token);
    let a2 = api.agent_process(&api.agent_token("a2").await);
    for (a, n) in [(&a1, "a1"), (&a2, "a2")] {
        a.post(
            "/api/agent/v1/register",
            json!({"name": n, "instance": a.instance(), "capacity": 1, "kinds": ["command"], "version": "t", "health": health}),
        )
        .await;
    }
    // A token registers only as its own agent.
    let (status, _) = a2
        .raw(
            reqwest::Method::POST,
            "/api/agent/v1/register",
            Some(json!({"name": "a1", "instance": a2.instance(), "capacity": 1, "kinds": ["command"], "version": "t", "health": health})),
        )
        .await;
    assert_eq!(status, 403);
    let id = api
        .submit(json!({"kind": "command", "command": "true", "outputs": ["out.txt"]}))
        .await;
    let leased = a1
        .post("/api/agent/v1/lease", json!({"wait_ms": 5000}))
        .await;
    let token = leased["job"]["lease_token"].as_str().unwrap().to_string();
    for action in ["complete", "start", "log", "fail"] {
        let body = match action {
            "start" => json!({"job_id": id, "lease_token": token}),
            "log" => json!({"lease_token": token, "lines": [{"stream": "stdout", "line": "evil"}]}),
            "fail" => json!({"lease_token": token, "class": "fatal", "message": "evil"}),
            _ => json!({"lease_token": token, "exit_code": 0}),
        };
        let (status, v) = a2
            .raw(
                reqwest::Method::POST,
                &format!("/api/agent/v1/jobs/{id}/{action}"),
                Some(body),
            )
            .await;
        assert_eq!(status, 403, "{action} by another agent: {v}");
    }
    // Its heartbeat naming a1's lease is told the lease is not its own
    // (and so does not keep it alive).
    let beat = a2
        .post(
            "/api/agent/v1/heartbeat",
            json!({"health": health, "leases": [{"job_id": id, "lease_token": token}]}),
        )
        .await;
    assert_eq!(beat["leases"][0]["action"], "lost", "{beat}");
    // Nor may it upload a1's declared output; and a1 itself may not write
    // outside the job's outputs through the name in the URL.
    let put = |who: &flotilla_e2e::api::Api, name: &str| {
        let req = who
            .http
            .put(format!(
                "{}/api/agent/v1/jobs/{id}/outputs/{name}",
                server.url()
            ))
            .bearer_auth(&who.token)
            .header(flotilla_core::protocol::INSTANCE_HEADER, who.instance())
            .header(flotilla_core::protocol::LEASE_HEADER, &token)
            .body("evil");
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (status, text) = put(&a2, "out.txt").await;
    assert_eq!(status, 403, "another agent's upload: {text}");
    // Refused by the name's own check (before the declared outputs are
    // even read), which says what is wrong with it.
    for (name, why) in [
        ("..%2f..%2fescaped.txt", "has a `..` component"),
        ("out.txt%2f..%2f..%2fescaped.txt", "has a `..` component"),
        ("%2fetc%2fescaped", "must be a relative path"),
    ] {
        let (status, text) = put(&a1, name).await;
        assert_eq!(status, 422, "{name}: {text}");
        assert!(
            text.contains("output name `") && text.contains(why),
            "{name}: {text}"
        );
    }
    let written = flotilla_e2e::files_under(&server.dir, |_| true);
    assert!(
        written
            .iter()
            .all(|p| !p.to_string_lossy().contains("escaped")),
        "{written:?}"
    );
    let j = api.job(&id).await;
    assert_eq!(j.state, JobState::Leased, "still a1's");
    assert!(
        j.outputs.is_empty(),
        "no output was recorded: {:?}",
        j.outputs
    );
    let log = api
        .raw(
            reqwest::Method::GET,
            &format!("/api/v1/jobs/{id}/log"),
            None,
        )
        .await;
    assert_eq!(log.1.as_str().unwrap(), "", "no log line was written");

    // A failure message longer than the server keeps, cut inside a
    // multi-byte character at 4 KiB: the server cuts it on a character
    // boundary and records the failure (once it panicked, the agent retried
    // the report forever and the job stayed running).
    let (status, v) = a1
        .raw(
            reqwest::Method::POST,
            &format!("/api/agent/v1/jobs/{id}/fail"),
            Some(json!({"lease_token": token, "class": "fatal", "message": "€".repeat(2000)})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let j = api.job(&id).await;
    assert_eq!(j.state, JobState::Failed, "{j:?}");
    let error = j.error.unwrap_or_default();
    assert_eq!(error.len(), 4095, "cut at the last boundary before 4096");
    assert!(error.chars().all(|c| c == '€'));

    // A completion sent again (its answer lost) is refused and records
    // nothing twice: one attempt, succeeded once.
    let id = api
        .submit(json!({"kind": "command", "command": "true"}))
        .await;
    let leased = a1
        .post("/api/agent/v1/lease", json!({"wait_ms": 5000}))
        .await;
    assert_eq!(leased["job"]["job_id"], id.as_str(), "{leased}");
    let token = leased["job"]["lease_token"].as_str().unwrap().to_string();
    let path = format!("/api/agent/v1/jobs/{id}/complete");
    let complete = || {
        a1.raw(
            reqwest::Method::POST,
            &path,
            Some(json!({"lease_token": token, "exit_code": 0})),
        )
    };
    let (status, v) = complete().await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = complete().await;
    assert_eq!(status, 409, "the same completion again: {v}");
    let j = api.job(&id).await;
    assert_eq!(j.state, JobState::Succeeded, "{j:?}");
    assert_eq!(j.attempt, 1, "{j:?}");
    assert_eq!(j.attempts.as_ref().map(Vec::len), Some(1), "{j:?}");
}

/// A lease belongs to the agent process that took it: `register` hands no
/// lease tokens to anyone; a second process under the same name is refused
/// while the first is online and can neither report for nor fail the first
/// one's lease; once the first has been silent for a lease TTL the second
/// takes over, the server hands the orphaned lease back itself, and the
/// first process is refused as superseded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_bound_to_the_agent_process_that_took_it() {
    let dir = scratch("e2e-instance-");
    let server = server_on_shared(dir.path(), 1_500).await;
    let api = server.api();
    let token = api.agent_token("twin").await;
    let health = serde_json::to_value(flotilla_core::health::HostHealth::default()).unwrap();
    let register = |p: &flotilla_e2e::api::Api| {
        json!({"name": "twin", "instance": p.instance(), "capacity": 1, "kinds": ["command"],
               "version": "t", "health": health})
    };
    let first = api.agent_process(&token);
    let second = api.agent_process(&token);
    // An agent from before processes had an `instance` is told to
    // upgrade, not only which field it lacks.
    let mut old = register(&first);
    old.as_object_mut().unwrap().remove("instance");
    let (status, v) = first
        .raw(reqwest::Method::POST, "/api/agent/v1/register", Some(old))
        .await;
    assert_eq!(status, 422, "{v}");
    let said = v["error"]["message"].as_str().unwrap();
    assert!(
        said.contains("this agent is older than the server")
            && said.contains("upgrade flotilla-agent"),
        "{said}"
    );
    first.post("/api/agent/v1/register", register(&first)).await;
    let id = api
        .submit(json!({"kind": "command", "command": "true", "max_attempts": 3}))
        .await;
    let leased = first
        .post("/api/agent/v1/lease", json!({"wait_ms": 5000}))
        .await;
    let lease = leased["job"]["lease_token"].as_str().unwrap().to_string();

    // The second process: refused while the first is online, and nothing
    // it sends about the first one's lease is accepted.
    let (status, v) = second
        .raw(
            reqwest::Method::POST,
            "/api/agent/v1/register",
            Some(register(&second)),
        )
        .await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "conflict", "{v}");
    assert!(!v.to_string().contains(&lease), "no lease token in {v}");
    for (action, body) in [
        ("complete", json!({"lease_token": lease, "exit_code": 0})),
        (
            "fail",
            json!({"lease_token": lease, "class": "fatal", "message": "x"}),
        ),
        (
            "log",
            json!({"lease_token": lease, "lines": [{"stream": "stdout", "line": "evil"}]}),
        ),
    ] {
        let (status, v) = second
            .raw(
                reqwest::Method::POST,
                &format!("/api/agent/v1/jobs/{id}/{action}"),
                Some(body),
            )
            .await;
        assert_eq!(status, 409, "{action} from the second process: {v}");
        assert_eq!(v["error"]["code"], "superseded", "{v}");
    }
    let (status, _) = second
        .raw(
            reqwest::Method::POST,
            "/api/agent/v1/heartbeat",
            Some(json!({"leases": [], "health": health})),
        )
        .await;
    assert_eq!(status, 409);
    assert_eq!(
        api.job(&id).await.state,
        JobState::Leased,
        "still the first's"
    );

    // The first re-registers (same process): it keeps its lease, and the
    // answer carries no lease token.
    let v = first.post("/api/agent/v1/register", register(&first)).await;
    assert_eq!(v["orphans_failed"], 0, "{v}");
    assert!(!v.to_string().contains(&lease), "no lease token in {v}");
    assert_eq!(api.job(&id).await.state, JobState::Leased);

    // The first goes silent for a lease TTL: the second takes over and the
    // server hands the orphaned lease back at once.
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let v = second
        .post("/api/agent/v1/register", register(&second))
        .await;
    assert!(!v.to_string().contains(&lease), "no lease token in {v}");
    let j = api.job(&id).await;
    assert!(
        matches!(
            j.state,
            JobState::Retrying | JobState::Queued | JobState::Leased
        ),
        "handed back (or already taken again by the reaper's path): {j:?}"
    );
    let (status, v) = first
        .raw(
            reqwest::Method::POST,
            &format!("/api/agent/v1/jobs/{id}/complete"),
            Some(json!({"lease_token": lease, "exit_code": 0})),
        )
        .await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "superseded", "{v}");
    assert_ne!(api.job(&id).await.state, JobState::Succeeded);
}

/// An agent may upload only the outputs a job declares, and may not
/// complete it without them, whatever its `complete` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_outputs_are_the_only_ones_and_are_required() {
    let dir = scratch("e2e-declared-");
    let server = server_on_shared(dir.path(), 5_000).await;
    let api = server.api();
    let agent = api.agent_process(&api.agent_token("uploader").await);
    let health = serde_json::to_value(flotilla_core::health::HostHealth::default()).unwrap();
    agent
        .post(
            "/api/agent/v1/register",
            json!({"name": "uploader", "instance": agent.instance(), "capacity": 1,
                   "kinds": ["command"], "version": "t", "health": health}),
        )
        .await;
    let id = api
        .submit(json!({"kind": "command", "command": "true", "outputs": ["out.txt"]}))
        .await;
    let leased = agent
        .post("/api/agent/v1/lease", json!({"wait_ms": 5000}))
        .await;
    let lease = leased["job"]["lease_token"].as_str().unwrap().to_string();
    let upload = |name: &str| {
        let agent = agent.clone();
        let url = format!("{}/api/agent/v1/jobs/{id}/outputs/{name}", agent.base);
        let lease = lease.clone();
        async move {
            let r = agent
                .http
                .put(url)
                .bearer_auth(&agent.token)
                .header(flotilla_core::protocol::INSTANCE_HEADER, agent.instance())
                .header(flotilla_core::protocol::LEASE_HEADER, lease)
                .body("data")
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    // The lease token in the query string, where proxies and access logs
    // keep URLs, is refused with what to do instead.
    let r = agent
        .http
        .put(format!(
            "{}/api/agent/v1/jobs/{id}/outputs/out.txt?lease={lease}",
            agent.base
        ))
        .bearer_auth(&agent.token)
        .header(flotilla_core::protocol::INSTANCE_HEADER, agent.instance())
        .body("data")
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body = r.text().await.unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("flotilla-lease") && body.contains("query string"),
        "{body}"
    );
    let (status, body) = upload("extra.bin").await;
    assert_eq!(status, 422, "an undeclared output: {body}");
    assert!(body.contains("out.txt"), "{body}");
    let (status, v) = agent
        .raw(
            reqwest::Method::POST,
            &format!("/api/agent/v1/jobs/{id}/complete"),
            Some(json!({"lease_token": lease, "exit_code": 0, "outputs": []})),
        )
        .await;
    assert_eq!(status, 422, "completed without its declared output: {v}");
    assert!(v.to_string().contains("out.txt"), "{v}");
    assert_eq!(api.job(&id).await.state, JobState::Leased);
    let (status, body) = upload("out.txt").await;
    assert_eq!(status, 200, "{body}");
    let (status, v) = agent
        .raw(
            reqwest::Method::POST,
            &format!("/api/agent/v1/jobs/{id}/complete"),
            Some(json!({"lease_token": lease, "exit_code": 0, "outputs": []})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let j = api.job(&id).await;
    assert_eq!(j.state, JobState::Succeeded);
    assert_eq!(j.outputs.len(), 1);
    assert_eq!(j.outputs[0].name, "out.txt");
}

/// Pause, drain and resume steer which agent takes work, and survive a
/// server restart (they live in PostgreSQL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_drain_resume_are_persisted() {
    let dir = scratch("e2e-steer-");
    let mut server = server_on_shared(dir.path(), 3_000).await;
    let api = server.api();
    let _agent = Agent::start(&server, "steered", 2, &[]).await;
    eventually("the agent to register", Duration::from_secs(30), || {
        let api = api.clone();
        async move {
            api.get("/api/v1/agents").await["agents"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
        }
    })
    .await;
    let v = api.post("/api/v1/agents/steered/pause", json!({})).await;
    assert_eq!(v["state"], "paused");
    server.kill().await;
    server.restart().await;
    let api = server.api();
    let agents = api.get("/api/v1/agents").await;
    assert_eq!(agents["agents"][0]["state"], "paused", "{agents}");
    let id = api
        .submit(json!({"kind": "command", "command": "true"}))
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        api.job(&id).await.state,
        JobState::Queued,
        "a paused agent takes nothing"
    );
    api.post("/api/v1/agents/steered/resume", json!({})).await;
    assert_eq!(
        api.wait_final(&id, Duration::from_secs(30)).await.state,
        JobState::Succeeded
    );
    let v = api.post("/api/v1/agents/steered/drain", json!({})).await;
    assert_eq!(v["state"], "drained", "an idle agent drains at once");
    let (status, _) = api
        .raw(
            reqwest::Method::POST,
            "/api/v1/agents/steered/explode",
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 404);
    let id = api
        .submit(json!({"kind": "command", "command": "true"}))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        api.job(&id).await.state,
        JobState::Queued,
        "a drained agent takes nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_tokens_stop_working_at_once() {
    let dir = scratch("e2e-revoke-");
    let server = server_on_shared(dir.path(), 3_000).await;
    let admin = server.api();
    let made = admin
        .post(
            "/api/v1/tokens",
            json!({ "role": "client", "description": "ci bot" }),
        )
        .await;
    let client = flotilla_e2e::api::Api {
        token: made["token"].as_str().unwrap().to_string(),
        ..admin.clone()
    };
    // Used once, so it sits in the server's token cache.
    let (s, v) = client.raw(reqwest::Method::GET, "/api/v1/jobs", None).await;
    assert_eq!(s, 200, "{v}");
    // Listed without its secret; a client may not list or revoke.
    let list = admin.get("/api/v1/tokens").await;
    let listed = list["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == made["id"])
        .unwrap_or_else(|| panic!("new token not listed: {list}"));
    assert_eq!(listed["description"], "ci bot");
    assert!(!list.to_string().contains(made["token"].as_str().unwrap()));
    let (s, _) = client
        .raw(reqwest::Method::GET, "/api/v1/tokens", None)
        .await;
    assert_eq!(s, 403);
    let id = made["id"].as_str().unwrap();
    let (s, _) = client
        .raw(
            reqwest::Method::POST,
            &format!("/api/v1/tokens/{id}/revoke"),
            Some(json!({})),
        )
        .await;
    assert_eq!(s, 403);

    let revoked = admin
        .post(&format!("/api/v1/tokens/{id}/revoke"), json!({}))
        .await;
    assert!(revoked["revoked_at"].is_string(), "{revoked}");
    // Refused at once, not after the cache's lifetime.
    let (s, v) = client.raw(reqwest::Method::GET, "/api/v1/jobs", None).await;
    assert_eq!(s, 401, "{v}");
    assert!(v.to_string().contains("revoked"), "{v}");
    // The admin's own token still works; an unknown id is a 404.
    let (s, v) = admin
        .raw(
            reqwest::Method::POST,
            &format!("/api/v1/tokens/{}/revoke", uuid::Uuid::new_v4()),
            Some(json!({})),
        )
        .await;
    assert_eq!(s, 404, "{v}");
}
