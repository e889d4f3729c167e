//! Pipelines end to end on real agents: items through stages, a move, a
//! limit gate and an either, across a SIGKILL of the server; bad files
//! refused before anything runs. (The ssh hosts and the OCR example are in
//! `pipelines_ssh.rs`.)

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flotilla_e2e::procs::{server_on_shared, Agent};
use flotilla_e2e::scratch;
use flotilla_e2e::ui::Dashboard;
use serde_json::{json, Value};

/// Reads every marker file under `marks`: (step, item) → runs recorded.
fn runs(marks: &Path) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(marks).unwrap() {
        let e = e.unwrap();
        let text = std::fs::read_to_string(e.path()).unwrap();
        out.insert(
            e.file_name().to_string_lossy().into_owned(),
            text.lines().count(),
        );
    }
    out
}

/// Entries of `dir` that are not hidden (a move's or stage's temporary
/// names start with a dot), or 0 when it does not exist yet.
fn visible(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.filter_map(Result::ok)
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .count() as u64
    })
}

/// 24 items through `one` on agent pa, then, inside `limit 2`, a move to
/// host b (the agents labelled pool=b: pb) and `two` there (which consumes the moved copy), then an
/// either of a fast and a slow branch. The server is SIGKILLed mid-run and
/// restarted. Sampled every 100 ms: never more than 2 items inside the
/// limit (by the engine's gate count and by the moved copies on disk).
/// At the end: every (item, step) ran once, the fast branch took more
/// items, no temporary output is left, the results are where they should
/// be and the moved and consumed copies are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_pass_every_step_once_within_limits_across_a_server_kill() {
    let dir = scratch("e2e-pipeline-");
    let d = dir.path().display().to_string();
    let mut server = server_on_shared(dir.path(), 4_000).await;
    server.opts.listen = server.addr;
    let _pa = Agent::start(&server, "pa", 4, &[]).await;
    let _pb = Agent::start(&server, "pb", 4, &["--label", "pool=b"]).await;
    let api = server.api();
    flotilla_e2e::eventually("both agents to register", Duration::from_secs(30), || {
        let api = api.clone();
        async move {
            api.get("/api/v1/agents").await["agents"]
                .as_array()
                .is_some_and(|a| a.len() == 2)
        }
    })
    .await;
    std::fs::create_dir_all(dir.path().join("marks")).unwrap();
    let source = format!(
        "# a test pipeline
host a = agent pa
host b = agent labels pool=b
items on a: seq 1 24
stage one on a jobs 3 out {d}/one/{{id}}: sleep 0.3; echo x >> {d}/marks/one.{{id}}; \\
    echo one-{{id}} > {{out}}
limit 2 {{
    move m to b:{d}/moved/{{id}}
    stage two on b jobs 4 out {d}/two/{{id}}/ consume: sleep 0.4; echo x >> {d}/marks/two.{{id}}; cp {{in}} {{out}}/copy
}}
either {{
    stage fast on b jobs 2 out {d}/fast/{{id}}: echo x >> {d}/marks/fast.{{id}}; cat {{two.out}}/copy > {{out}}
|
    stage slow on b jobs 1 out {d}/slow/{{id}}: sleep 1.5; echo x >> {d}/marks/slow.{{id}}; cat {{two.out}}/copy > {{out}}
}}
"
    );
    let run = api
        .post(
            "/api/v1/pipelines",
            json!({"name": "test.pipeline", "source": source}),
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();

    // Sample the gate and the moved copies every 100 ms through the run.
    let stop = Arc::new(AtomicBool::new(false));
    let most_inside = Arc::new(AtomicU64::new(0));
    let most_moved = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, most_inside, most_moved) =
            (stop.clone(), most_inside.clone(), most_moved.clone());
        let moved = dir.path().join("moved");
        // Its own client: the server is down for a while, and `Api`
        // panics on a refused connection.
        let url = format!("{}/api/v1/pipelines/{run}?limit=1", server.url());
        let token = server.admin_token.clone();
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            while !stop.load(Ordering::Relaxed) {
                most_moved.fetch_max(visible(&moved), Ordering::Relaxed);
                if let Ok(resp) = http.get(&url).bearer_auth(&token).send().await {
                    if let Ok(v) = resp.json::<Value>().await {
                        let inside = v["gates"][0]["inside"].as_u64().unwrap_or(0);
                        most_inside.fetch_max(inside, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    flotilla_e2e::eventually("a few items past `two`", Duration::from_secs(120), || {
        let api = api.clone();
        let run = run.clone();
        async move {
            let v = api.get(&format!("/api/v1/pipelines/{run}?limit=1")).await;
            v["steps"][2]["succeeded"].as_u64().unwrap_or(0) >= 3
        }
    })
    .await;
    server.kill().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.restart().await;
    let api = server.api();

    let started = std::time::Instant::now();
    let view: Value = loop {
        let (status, v) = api
            .raw(
                reqwest::Method::GET,
                &format!("/api/v1/pipelines/{run}"),
                None,
            )
            .await;
        if status == 200
            && ["done", "failed", "cancelled"].contains(&v["state"].as_str().unwrap_or(""))
        {
            break v;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the run did not end in 300 s: {v:#}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    stop.store(true, Ordering::Relaxed);
    sampler.await.unwrap();
    assert_eq!(view["state"], "done", "{view:#}");
    assert_eq!(view["counts"]["done"], 24, "{view:#}");
    let inside = most_inside.load(Ordering::Relaxed);
    let moved = most_moved.load(Ordering::Relaxed);
    assert!(
        (1..=2).contains(&inside),
        "the limit held {inside} items at once"
    );
    assert!(
        moved <= 2,
        "{moved} moved copies were on disk at once (limit 2)"
    );

    let marks = runs(&dir.path().join("marks"));
    for i in 1..=24 {
        for step in ["one", "two"] {
            assert_eq!(
                marks.get(&format!("{step}.{i}")),
                Some(&1),
                "{step} of item {i}: {marks:?}"
            );
        }
        let branches = marks.get(&format!("fast.{i}")).copied().unwrap_or(0)
            + marks.get(&format!("slow.{i}")).copied().unwrap_or(0);
        assert_eq!(
            branches, 1,
            "item {i} went through {branches} branches: {marks:?}"
        );
        let result = dir
            .path()
            .join(if marks.contains_key(&format!("fast.{i}")) {
                "fast"
            } else {
                "slow"
            })
            .join(i.to_string());
        assert_eq!(
            std::fs::read_to_string(&result).unwrap(),
            format!("one-{i}\n"),
            "{}",
            result.display()
        );
    }
    let fast = (1..=24)
        .filter(|i| marks.contains_key(&format!("fast.{i}")))
        .count();
    assert!(fast > 24 - fast, "the fast branch took {fast} of 24 items");
    // The source of each move was removed, and `two` consumed each copy.
    assert_eq!(
        visible(&dir.path().join("one")),
        0,
        "sources of the move left behind"
    );
    assert_eq!(
        visible(&dir.path().join("moved")),
        0,
        "consumed copies left behind"
    );
    for sub in ["one", "moved", "two", "fast", "slow"] {
        if let Ok(rd) = std::fs::read_dir(dir.path().join(sub)) {
            let left: Vec<_> = rd
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains("flotilla"))
                .collect();
            assert!(left.is_empty(), "temporary outputs left in {sub}: {left:?}");
        }
    }
    // The matrix: every item has a cell per step it went through.
    let rows = view["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 24);
    for r in rows {
        let cells = r["cells"].as_array().unwrap();
        assert_eq!(cells[0]["state"], "succeeded", "{r}");
        assert_eq!(cells[2]["state"], "succeeded", "{r}");
        assert!(
            cells[3].is_null() != cells[4].is_null(),
            "one branch only: {r}"
        );
    }
}

/// Mistakes in a pipeline file are refused with their line and column,
/// before any job is queued; the CLI's check says the same without a
/// server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_pipeline_files_name_line_and_column_and_queue_nothing() {
    let dir = scratch("e2e-pipeline-bad-");
    let server = server_on_shared(dir.path(), 10_000).await;
    let _pa = Agent::start(&server, "bad-a", 1, &[]).await;
    let api = server.api();
    flotilla_e2e::eventually("the agent to register", Duration::from_secs(30), || {
        let api = api.clone();
        async move {
            api.get("/api/v1/agents").await["agents"]
                .as_array()
                .is_some_and(|a| a.len() == 1)
        }
    })
    .await;
    let head = "host a = agent bad-a\nitems on a: seq 1 3\n";
    let cases: &[(&str, String, u32, &str)] = &[
        (
            "unknown host",
            format!("{head}stage s on nowhere out /tmp/x/{{id}}: true\n"),
            3,
            "nowhere",
        ),
        (
            "unknown field",
            format!("{head}stage s on a out /tmp/x/{{id}}: echo {{nope}}\n"),
            3,
            "{nope}",
        ),
        (
            "move with nothing to move",
            format!("{head}move m to a:/tmp/y/{{id}}\nstage s on a: true\n"),
            3,
            "nothing to move",
        ),
        (
            "consume on the first stage",
            format!("{head}stage s on a consume: true\n"),
            3,
            "consume",
        ),
        (
            "unclosed limit",
            format!("{head}limit 2 {{\nstage s on a: true\n"),
            3,
            "{",
        ),
        (
            "agent never registered",
            "host a = agent ghost\nitems on a: seq 1 3\nstage s on a: true\n".to_string(),
            1,
            "ghost",
        ),
        (
            "ssh key as a path",
            format!("host k = ssh://u@h key ~/.ssh/id_ed25519\n{head}stage s on a: true\n"),
            1,
            "--ssh-dir/keys/",
        ),
    ];
    for (what, source, line, needle) in cases {
        let (status, v) = api
            .raw(
                reqwest::Method::POST,
                "/api/v1/pipelines",
                Some(json!({"name": "bad.pipeline", "source": source})),
            )
            .await;
        assert_eq!(status, 422, "{what}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("bad.pipeline:{line}:")),
            "{what}: no line {line} in {message}"
        );
        assert!(
            message.contains(needle),
            "{what}: `{needle}` not in {message}"
        );
        let first = &v["error"]["detail"]["errors"][0];
        assert_eq!(first["line"], *line, "{what}: {v}");
        assert!(first["column"].as_u64().unwrap_or(0) >= 1, "{what}: {v}");
    }
    // Nothing was queued, no run recorded.
    let jobs = api.get("/api/v1/jobs?limit=100").await;
    assert_eq!(jobs["jobs"].as_array().map(Vec::len), Some(0), "{jobs}");
    assert_eq!(
        api.get("/api/v1/pipelines").await["runs"]
            .as_array()
            .map(Vec::len),
        Some(0)
    );

    // The CLI checks locally, without a server: exit 1 and file:line:col.
    let file = dir.path().join("bad.pipeline");
    std::fs::write(&file, &cases[0].1).unwrap();
    let out = std::process::Command::new(flotilla_e2e::binary("flotilla"))
        .args(["pipeline", "check"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "check passed a bad file: {stderr}");
    assert!(
        stderr.contains(&format!("{}:3:", file.display())),
        "{stderr}"
    );
    std::fs::write(
        &file,
        format!("{head}stage s on a out /tmp/x/{{id}}: true\n"),
    )
    .unwrap();
    let out = std::process::Command::new(flotilla_e2e::binary("flotilla"))
        .args(["pipeline", "check"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Polls run `run` until it is final; returns its view (every row).
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

/// A file run again resumes each item after the furthest step whose output
/// exists: after a first run, the last stage's outputs of items 1–3 are
/// removed (as if it had been stopped there); the second run runs that
/// stage for items 1–3 only, and nothing else (the first stage's output
/// was consumed, but the second's is there, so the first never runs again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_of_a_file_resumes_after_the_furthest_output() {
    let dir = scratch("e2e-pipeline-resume-");
    let d = dir.path().display().to_string();
    let server = server_on_shared(dir.path(), 10_000).await;
    let _a = Agent::start(&server, "resume-a", 4, &[]).await;
    let api = server.api();
    std::fs::create_dir_all(dir.path().join("marks")).unwrap();
    let source = format!(
        "host a = agent resume-a
items on a: seq 1 6
stage one on a jobs 2 out {d}/one/{{id}}: echo x >> {d}/marks/one.{{id}}; echo {{id}} > {{out}}
stage two on a jobs 2 out {d}/two/{{id}} consume: echo x >> {d}/marks/two.{{id}}; cat {{in}} > {{out}}
stage three on a jobs 2 out {d}/three/{{id}}: echo x >> {d}/marks/three.{{id}}; cat {{in}} > {{out}}
"
    );
    let submit = |api: flotilla_e2e::api::Api, source: String| async move {
        api.post(
            "/api/v1/pipelines",
            json!({"name": "resume.pipeline", "source": source}),
        )
        .await["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let first = submit(api.clone(), source.clone()).await;
    assert_eq!(finished(&api, &first).await["state"], "done");
    for i in 1..=3 {
        std::fs::remove_file(dir.path().join(format!("three/{i}"))).unwrap();
    }
    let second = submit(api.clone(), source).await;
    let view = finished(&api, &second).await;
    assert_eq!(view["state"], "done", "{view:#}");
    let marks = runs(&dir.path().join("marks"));
    for i in 1..=6 {
        assert_eq!(marks.get(&format!("one.{i}")), Some(&1), "{marks:?}");
        assert_eq!(marks.get(&format!("two.{i}")), Some(&1), "{marks:?}");
        let three = if i <= 3 { 2 } else { 1 };
        assert_eq!(marks.get(&format!("three.{i}")), Some(&three), "{marks:?}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join(format!("three/{i}"))).unwrap(),
            format!("{i}\n")
        );
    }
    // The matrix shows where each item resumed: items 4–6 at `three`,
    // items 1–3 at `two`, then through `three`.
    let rows = view["rows"].as_array().unwrap();
    for (i, row) in rows.iter().enumerate() {
        let cells = row["cells"].as_array().unwrap();
        assert!(cells[0].is_null(), "{row}");
        if i < 3 {
            assert_eq!(cells[1]["state"], "succeeded", "{row}");
            assert!(cells[1]["job_id"].is_null(), "{row}");
            assert!(cells[2]["job_id"].is_string(), "{row}");
        } else {
            assert!(cells[1].is_null(), "{row}");
            assert!(cells[2]["job_id"].is_null(), "{row}");
        }
    }

    // The dashboard's pages: the run in the list, its matrix with each cell
    // linked to its job, and its event stream (state, then end).
    let ui = Dashboard::login(&server).await;
    let list = ui.page("/ui/pipelines").await;
    assert!(list.contains(&format!("/ui/pipelines/{second}")), "{list}");
    let matrix = ui.page(&format!("/ui/pipelines/{second}")).await;
    let job = rows[0]["cells"][2]["job_id"].as_str().unwrap();
    assert!(
        matrix.contains(&format!(
            "id=\"cell-0-2\" class=\"cell s-succeeded\" href=\"/ui/jobs/{job}\""
        )),
        "{matrix}"
    );
    assert!(!matrix.contains("<script>"), "inline script on the page");
    // The step job's page links back to its run.
    let step = ui.page(&format!("/ui/jobs/{job}")).await;
    assert!(
        step.contains(&format!(
            "<a href=\"/ui/pipelines/{second}\">pipeline run {second}</a>"
        )),
        "{step}"
    );
    let events = ui.page(&format!("/ui/pipelines/{second}/events")).await;
    let state = events.find("event: state").expect("a state event");
    let end = events.find("event: end").expect("an end event");
    assert!(state < end, "{events}");
}
