//! The OpenAPI document at `/api/v1/openapi.json`: served without a token,
//! it parses, lists every public `/api/v1` route with the bearer scheme,
//! and a schema-based fuzzer (schemathesis, from PyPI: installed by
//! `scripts/setup-debian.sh --test`) run against a real server with an
//! admin token, then a client token, finds no 5xx and no answer that
//! breaks its schema.

use std::process::Stdio;
use std::time::{Duration, Instant};

use flotilla_e2e::driven::Driven;
use flotilla_e2e::procs::server_on_shared;
use flotilla_e2e::scratch;
use serde_json::{json, Value};

/// Every operation the document must hold, and no other.
const OPERATIONS: &[(&str, &str)] = &[
    ("post", "/api/v1/jobs"),
    ("get", "/api/v1/jobs"),
    ("get", "/api/v1/jobs/{id}"),
    ("get", "/api/v1/jobs/{id}/log"),
    ("post", "/api/v1/jobs/{id}/cancel"),
    ("post", "/api/v1/jobs/{id}/retry"),
    ("get", "/api/v1/agents"),
    ("post", "/api/v1/agents/{name}/{action}"),
    ("get", "/api/v1/agents/{name}/health"),
    ("post", "/api/v1/tokens"),
    ("get", "/api/v1/tokens"),
    ("post", "/api/v1/tokens/{id}/revoke"),
    ("post", "/api/v1/revdeps"),
    ("get", "/api/v1/revdeps"),
    ("get", "/api/v1/revdeps/{id}"),
    ("post", "/api/v1/pipelines"),
    ("get", "/api/v1/pipelines"),
    ("get", "/api/v1/pipelines/{id}"),
    ("post", "/api/v1/pipelines/{id}/cancel"),
    ("post", "/api/v1/pipelines/{id}/items/{item}/cancel"),
    ("post", "/api/v1/rois"),
    ("get", "/api/v1/rois"),
    ("post", "/api/v1/rois/plan"),
    ("get", "/api/v1/rois/{id}"),
    ("get", "/api/v1/tiles/stats"),
    ("post", "/api/v1/datasets"),
    ("get", "/api/v1/datasets"),
    ("put", "/api/v1/datasets/{name}/checkpoint"),
    ("post", "/api/v1/coverage/import"),
    ("get", "/api/v1/alerts"),
    ("get", "/api/v1/openapi.json"),
];

/// Examples per operation and phase (schemathesis' `--max-examples`): on
/// the 2-core reference machine each of the two runs takes about 20 s.
const EXAMPLES: &str = "50";

/// A run longer than this is a failure (the fuzzer hung, or the server
/// stopped answering).
const FUZZ_LIMIT: Duration = Duration::from_secs(240);

/// The router's `/api/v1` routes, read from its source (one router lists
/// every route: `server/src/api/mod.rs`): (method, path) of each.
fn routed() -> Vec<(String, String)> {
    let src = include_str!("../../../server/src/api/mod.rs");
    // The router's own routes, not its unit tests' (made-up paths).
    let src = src.split("#[cfg(test)]").next().unwrap_or(src);
    let mut routes = Vec::new();
    for (at, _) in src.match_indices(".route(") {
        // The call runs to its closing parenthesis.
        let rest = &src[at + ".route(".len()..];
        let mut depth = 1;
        let end = rest
            .char_indices()
            .find_map(|(i, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                (depth == 0).then_some(i)
            })
            .expect("a closed .route( call");
        let call = &rest[..end];
        let path = call.split('"').nth(1).expect("a path literal");
        if !path.starts_with("/api/v1/") {
            continue;
        }
        for method in ["get", "post", "put", "patch", "delete"] {
            let used = call.match_indices(&format!("{method}(")).any(|(i, _)| {
                i == 0
                    || !call.as_bytes()[i - 1].is_ascii_alphanumeric()
                        && call.as_bytes()[i - 1] != b'_'
            });
            if used {
                routes.push((method.to_string(), path.to_string()));
            }
        }
    }
    routes.sort();
    routes
}

fn schemathesis_available() -> bool {
    std::process::Command::new("schemathesis")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_keeps_to_its_openapi_document_under_a_fuzzer() {
    let dir = scratch("e2e-openapi-");
    let server = server_on_shared(dir.path(), 3_000).await;
    let url = format!("{}/api/v1/openapi.json", server.url());

    // Served without a token, as JSON.
    let r = reqwest::get(&url).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    let doc: Value = r.json().await.expect("the document is JSON");
    assert!(
        doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1")),
        "{}",
        doc["openapi"]
    );

    // Exactly the operations above, each tagged, every one but the
    // document itself under the bearer scheme with the error envelope.
    let mut listed = Vec::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("operations") {
            listed.push((method.clone(), path.clone()));
            assert!(op["tags"][0].is_string(), "{method} {path}: no tag");
            let ok = op["responses"]
                .as_object()
                .unwrap()
                .keys()
                .any(|s| s.starts_with('2'));
            assert!(ok, "{method} {path}: no success answer");
            if path == "/api/v1/openapi.json" {
                assert_eq!(op["security"], json!([{}]), "the document needs no token");
                continue;
            }
            assert!(
                op.get("security").is_none(),
                "{method} {path}: own security"
            );
            for status in ["401", "404", "422"] {
                let schema = &op["responses"][status]["content"]["application/json"]["schema"];
                assert_eq!(
                    schema["$ref"], "#/components/schemas/ErrorBody",
                    "{method} {path} {status}"
                );
            }
        }
    }
    listed.sort();
    let mut expected: Vec<(String, String)> = OPERATIONS
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    expected.sort();
    assert_eq!(listed, expected);
    assert_eq!(doc["security"], json!([{"bearer": []}]));
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"],
        json!({"type": "http", "scheme": "bearer"})
    );
    // Every schema referred to is defined.
    let text = doc.to_string();
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for (at, _) in text.match_indices("#/components/schemas/") {
        let name: String = text[at + 21..].chars().take_while(|c| *c != '"').collect();
        assert!(schemas.contains_key(&name), "no schema {name}");
    }

    // What the fuzzer found (a NUL byte in `after` answered 500: PostgreSQL
    // refuses it in text), and the same in every other place text reaches
    // the database unchecked: each a 400 in the JSON error shape now.
    let admin = server.api();
    let nul = [
        (reqwest::Method::GET, "/api/v1/agents?after=a%00b", None),
        (reqwest::Method::GET, "/api/v1/datasets?after=a%00b", None),
        (
            reqwest::Method::POST,
            "/api/v1/agents/a%00b/pause",
            Some(json!({})),
        ),
        (
            reqwest::Method::POST,
            "/api/v1/tokens",
            Some(json!({"role": "client", "description": "a\u{0}b"})),
        ),
        (
            reqwest::Method::POST,
            "/api/v1/coverage/import?dataset=a%00b",
            None,
        ),
    ];
    for (method, path, body) in nul {
        let (status, v) = admin.raw(method.clone(), path, body).await;
        assert!(
            (400..500).contains(&status),
            "{method} {path}: {status} {v}"
        );
        assert!(v["error"]["code"].is_string(), "{method} {path}: {v}");
    }

    if !schemathesis_available() {
        // CI installs it (scripts/setup-debian.sh --test); there its absence
        // is a failure, not a skip.
        assert!(
            std::env::var_os("CI").is_none(),
            "schemathesis is not installed; scripts/setup-debian.sh --test installs it"
        );
        eprintln!("SKIPPED the fuzzer: schemathesis is not installed");
        assert_eq!(routed(), expected, "routes in server/src/api/mod.rs");
        return;
    }

    // Something in every list, so that its answers' schemas are checked on
    // real rows: jobs (queued, no agent takes them), agents, a client
    // token, a dataset, a revdeps run.
    for i in 0..3 {
        admin
            .submit(json!({"kind": "command", "command": format!("echo {i}"),
                           "labels": {"zone": "nowhere"}, "outputs": ["out.txt"]}))
            .await;
    }
    let mut agents = Vec::new();
    for name in ["fuzz-a", "fuzz-b"] {
        agents.push(Driven::register(&server, name, &["command"], Duration::from_secs(10)).await);
    }
    // A client token: the fuzzer runs as the admin, then as a client
    // (whose lists are its own, and who is refused admin calls).
    let client = admin
        .post(
            "/api/v1/tokens",
            json!({"role": "client", "description": "fuzz"}),
        )
        .await["token"]
        .as_str()
        .expect("a client token")
        .to_string();
    admin
        .post(
            "/api/v1/datasets",
            json!({"name": "fuzz", "fetch_command": "true"}),
        )
        .await;
    admin
        .post(
            "/api/v1/revdeps",
            json!({"target": "dune.3.20.2", "compiler": "ocaml-base-compiler.4.14.2",
                   "repo": "/nonexistent"}),
        )
        .await;

    // Another seed, more examples or other checks, to look further by hand.
    let seed = std::env::var("FLOTILLA_FUZZ_SEED").unwrap_or_else(|_| "1".into());
    let examples = std::env::var("FLOTILLA_FUZZ_EXAMPLES").unwrap_or_else(|_| EXAMPLES.into());
    for (who, token) in [("admin", server.admin_token.as_str()), ("client", &client)] {
        fuzz(&url, who, token, &seed, &examples, dir.path()).await;
    }
    drop(agents);
    // And those are every route the router serves under /api/v1: a route
    // added without its `#[utoipa::path]` (and a place in `ApiDoc`) fails.
    // (Checked last, so that the fuzzer's report comes all the same.)
    assert_eq!(routed(), expected, "routes in server/src/api/mod.rs");
}

/// Runs schemathesis against the document at `url` with `token` (`who`
/// says whose): every operation, `examples` cases per operation and phase;
/// fails on a 5xx or an answer that breaks its schema.
async fn fuzz(
    url: &str,
    who: &str,
    token: &str,
    seed: &str,
    examples: &str,
    dir: &std::path::Path,
) {
    let started = Instant::now();
    let run = tokio::process::Command::new("schemathesis")
        .args([
            "run",
            url,
            "--header",
            &format!("Authorization: Bearer {token}"),
            "--checks",
            &std::env::var("FLOTILLA_FUZZ_CHECKS")
                .unwrap_or_else(|_| "not_a_server_error,response_schema_conformance".into()),
            // The stateful phase would chain calls (revoke the token it
            // made, …); the others fuzz each operation on its own.
            "--phases",
            "examples,coverage,fuzzing",
            "--max-examples",
            examples,
            "--seed",
            seed,
            // One worker: CPython 3.11's parser is not safe to use from two
            // threads at once (hypothesis compiles as it generates), and
            // fails with "AST constructor recursion depth mismatch".
            "--workers",
            "1",
            "--request-timeout",
            "20",
            "--no-shrink",
            "--suppress-health-check",
            "all",
        ])
        .env("NO_COLOR", "1")
        // Its example database (.hypothesis) and cache go with the scratch
        // directory, not into the source tree.
        .current_dir(dir)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(FUZZ_LIMIT, run)
        .await
        .unwrap_or_else(|_| panic!("schemathesis ran past {FUZZ_LIMIT:?}"))
        .expect("running schemathesis");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    eprintln!(
        "schemathesis as {who} (seed {seed}) took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        out.status.success(),
        "schemathesis as {who} found problems (seed {seed}); its report is above"
    );
    // It did test every operation (a schema it could not load would test
    // none and still exit 0) but the document's own, which it leaves out
    // as the URL it loaded the schema from.
    let tested = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("Tested: "))
        .and_then(|n| n.trim().parse::<usize>().ok());
    assert_eq!(
        tested,
        Some(OPERATIONS.len() - 1),
        "operations tested as {who}"
    );
}
