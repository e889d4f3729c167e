//! Cursor pages on every list of the API (agents, tokens, revdeps runs,
//! pipeline runs, datasets; jobs and ROIs have their own tests): pages of 2 walk
//! every row once, in the list's order, and the last page says it is the
//! last; the CLI's listings print a table, or JSON with `--json`, with the
//! next page's cursor on stderr.

use std::time::Duration;

use flotilla_e2e::api::Api;
use flotilla_e2e::driven::Driven;
use flotilla_e2e::procs::{server_on_shared, Server};
use flotilla_e2e::scratch;
use serde_json::{json, Value};

const AGENTS: [&str; 5] = ["page-a", "page-b", "page-c", "page-d", "page-e"];

/// Walks `path` (a list answering `{key: [...], next}`) in pages of 2,
/// passing `next` as `cursor`: every row's `field`, in order.
async fn walk(api: &Api, path: &str, key: &str, cursor: &str, field: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let mut next: Option<String> = None;
    for _ in 0..100 {
        let q = match &next {
            Some(n) => format!("{path}?limit=2&{cursor}={n}"),
            None => format!("{path}?limit=2"),
        };
        let page = api.get(&q).await;
        let rows = page[key]
            .as_array()
            .unwrap_or_else(|| panic!("{q}: {page}"));
        assert!(rows.len() <= 2, "{q}: {page}");
        seen.extend(rows.iter().map(|r| r[field].as_str().unwrap().to_string()));
        match page["next"].as_str() {
            Some(n) => {
                assert_eq!(rows.len(), 2, "a page before the last is full: {page}");
                assert_eq!(rows[1][field], n, "next is the page's last row");
                next = Some(n.to_string());
            }
            None => {
                assert!(page["next"].is_null(), "{page}");
                return seen;
            }
        }
    }
    panic!("{path}: more than 100 pages");
}

/// Runs the CLI against `server` with the admin token: (stdout, stderr);
/// it must succeed.
async fn cli(server: &Server, args: &[&str]) -> (String, String) {
    server
        .cli(args)
        .await
        .unwrap_or_else(|e| panic!("flotilla {args:?}: {e}"))
}

/// The cursor the CLI printed on stderr after `flag`.
fn cursor(stderr: &str, flag: &str) -> String {
    stderr
        .split(flag)
        .nth(1)
        .unwrap_or_else(|| panic!("no {flag} in {stderr:?}"))
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_list_pages_by_cursor_and_every_listing_prints_json() {
    let dir = scratch("e2e-list-pages-");
    let server = server_on_shared(dir.path(), 3_000).await;
    let admin = server.api();
    // Registered in a shuffled order: the list is by name all the same.
    let mut agents = Vec::new();
    for i in [3, 0, 4, 1, 2] {
        agents.push(
            Driven::register(
                &server,
                AGENTS[i],
                &["command", "step"],
                Duration::from_secs(10),
            )
            .await,
        );
    }
    for i in 0..3 {
        admin
            .post(
                "/api/v1/revdeps",
                json!({"target": format!("pkg.{i}"), "compiler": "ocaml-base-compiler.4.14.2",
                       "repo": "/nonexistent"}),
            )
            .await;
    }
    let d = dir.path().display();
    for i in 0..3 {
        let source = format!("host a = agent page-a\nitems on a: seq 1 2\nstage s{i} on a out {d}/s{i}/{{id}}: true\n");
        admin
            .post(
                "/api/v1/pipelines",
                json!({"name": format!("p{i}.pipeline"), "source": source}),
            )
            .await;
    }

    // Agents by name, after the cursor.
    let names = walk(&admin, "/api/v1/agents", "agents", "after", "name").await;
    assert_eq!(names, AGENTS);
    // Datasets too (review L15: the list was whole), registered shuffled.
    for name in ["ds-c", "ds-a", "ds-e", "ds-b", "ds-d"] {
        admin
            .post(
                "/api/v1/datasets",
                json!({"name": name, "fetch_command": "true"}),
            )
            .await;
    }
    let names = walk(&admin, "/api/v1/datasets", "datasets", "after", "name").await;
    assert_eq!(names, ["ds-a", "ds-b", "ds-c", "ds-d", "ds-e"]);
    // Tokens (the admin's, one per agent) newest first; the whole list
    // in one page is the same.
    let tokens = walk(&admin, "/api/v1/tokens", "tokens", "before", "id").await;
    assert_eq!(tokens.len(), 1 + AGENTS.len());
    let whole = admin.get("/api/v1/tokens?limit=1000").await;
    let whole: Vec<&str> = whole["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(tokens, whole);
    for (key, path) in [("runs", "/api/v1/revdeps"), ("runs", "/api/v1/pipelines")] {
        let ids = walk(&admin, path, key, "before", "id").await;
        assert_eq!(ids.len(), 3, "{path}");
        let whole = admin.get(&format!("{path}?limit=1000")).await;
        let whole: Vec<&str> = whole[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, whole, "{path}: newest first, each once");
    }
    // A cursor that is not one is a 400 in the JSON error shape.
    for bad in [
        "/api/v1/tokens?before=x",
        "/api/v1/revdeps?before=x",
        "/api/v1/pipelines?before=x",
        "/api/v1/agents?limit=-1",
        "/api/v1/datasets?after=..%2Fx",
    ] {
        let (status, v) = admin.raw(reqwest::Method::GET, bad, None).await;
        assert_eq!(status, 400, "{bad}: {v}");
        assert_eq!(v["error"]["code"], "bad_request", "{bad}: {v}");
    }

    // The CLI: tables with a header, the next cursor on stderr, JSON that
    // parses with --json.
    let (table, stderr) = cli(&server, &["agents", "--limit", "2"]).await;
    assert!(table.starts_with("NAME "), "{table}");
    assert_eq!(table.lines().count(), 3, "{table}");
    let after = cursor(&stderr, "--after ");
    assert_eq!(after, "page-b");
    let (rest, _) = cli(&server, &["agents", "--json", "--after", &after]).await;
    let rest: Value = serde_json::from_str(&rest).expect("agents --json");
    assert_eq!(rest["agents"].as_array().unwrap().len(), 3, "{rest}");
    assert!(rest["next"].is_null());

    let (table, stderr) = cli(&server, &["tokens", "list", "--limit", "2"]).await;
    assert_eq!(table.lines().count(), 3, "{table}");
    let before = cursor(&stderr, "--before ");
    assert_eq!(before, tokens[1]);
    let (rest, _) = cli(&server, &["tokens", "list", "--json", "--before", &before]).await;
    let rest: Value = serde_json::from_str(&rest).expect("tokens list --json");
    assert_eq!(rest["tokens"].as_array().unwrap().len(), tokens.len() - 2);

    for listing in [["revdeps", "list"], ["pipeline", "list"]] {
        let (table, stderr) = cli(&server, &[listing[0], listing[1], "--limit", "2"]).await;
        assert!(table.starts_with("ID "), "{listing:?}: {table}");
        assert_eq!(table.lines().count(), 3, "{listing:?}: {table}");
        let before = cursor(&stderr, "--before ");
        let (rest, _) = cli(
            &server,
            &[listing[0], listing[1], "--json", "--before", &before],
        )
        .await;
        let rest: Value = serde_json::from_str(&rest).expect("--json");
        assert_eq!(
            rest["runs"].as_array().unwrap().len(),
            1,
            "{listing:?}: {rest}"
        );
    }

    // An empty list (ROIs) still prints its header, or JSON; datasets are by name.
    let (table, _) = cli(&server, &["roi", "list"]).await;
    assert_eq!(table.lines().count(), 1, "{table}");
    let (json_out, _) = cli(&server, &["roi", "list", "--json"]).await;
    let page: Value = serde_json::from_str(&json_out).expect("roi list --json");
    assert_eq!(page, json!({"rois": [], "next": null}));
    admin
        .post(
            "/api/v1/datasets",
            json!({"name": "demo", "fetch_command": "true"}),
        )
        .await;
    let (table, _) = cli(&server, &["datasets", "list"]).await;
    assert!(table.starts_with("NAME "), "{table}");
    assert!(
        table.lines().nth(1).is_some_and(|l| l.starts_with("demo ")),
        "{table}"
    );
    let (json_out, quiet) = cli(&server, &["datasets", "list", "--json"]).await;
    let list: Value = serde_json::from_str(&json_out).expect("datasets list --json");
    assert_eq!(list["datasets"][0]["name"], "demo", "{list}");
    assert_eq!(list["datasets"].as_array().unwrap().len(), 6, "{list}");
    let (table, stderr) = cli(&server, &["datasets", "list", "--limit", "2"]).await;
    assert_eq!(table.lines().count(), 3, "{table}");
    assert_eq!(cursor(&stderr, "--after "), "ds-a");
    let (rest, _) = cli(&server, &["datasets", "list", "--json", "--after", "ds-a"]).await;
    let rest: Value = serde_json::from_str(&rest).expect("datasets list --json --after");
    assert_eq!(rest["datasets"].as_array().unwrap().len(), 4, "{rest}");
    assert!(rest["next"].is_null(), "{rest}");
    // A revdeps run for another host, with its missing system packages
    // from a file, as the run records them.
    let missing = server.dir.join("alpine-missing.txt");
    std::fs::write(
        &missing,
        "# apk cannot provide\ngmp-dev\n\nlibev-dev # a comment\n",
    )
    .unwrap();
    let (id, _) = cli(
        &server,
        &[
            "revdeps",
            "submit",
            "a.1",
            "--repo",
            "/nowhere",
            "--compiler",
            "c.1",
            "--os-family",
            "alpine",
            "--os-distribution",
            "alpine",
            "--os-version",
            "3.20",
            "--missing-depexts",
            missing.to_str().unwrap(),
        ],
    )
    .await;
    let run = server
        .api()
        .get(&format!("/api/v1/revdeps/{}", id.trim()))
        .await;
    assert_eq!(run["variant"]["os_distribution"], "alpine", "{run}");
    assert_eq!(run["variant"]["os_version"], "3.20", "{run}");
    assert_eq!(run["variant"]["arch"], "x86_64", "{run}");
    assert_eq!(
        run["variant"]["missing_depexts"],
        json!(["gmp-dev", "libev-dev"]),
        "{run}"
    );
    let ui = flotilla_e2e::ui::Dashboard::login(&server).await;
    let page = ui.page(&format!("/ui/revdeps/{}", id.trim())).await;
    assert!(page.contains("gmp-dev, libev-dev"), "{page}");
    // Review L2: a token on the command line is in every user's `ps`; the
    // CLI says so (and not when it came from FLOTILLA_TOKEN, as above).
    assert!(!quiet.contains("process list"), "{quiet}");
    let out = tokio::process::Command::new(flotilla_e2e::binary("flotilla"))
        .args(["datasets", "list", "--server", &server.url()])
        .args(["--token", &server.admin_token])
        .env_remove("FLOTILLA_TOKEN")
        .env("FLOTILLA_LOG", "warn")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("visible to every user") && stderr.contains("--token-file"),
        "{stderr}"
    );
    drop(agents);
}
