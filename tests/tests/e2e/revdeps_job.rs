//! The revdeps job kind: a dune-sized target (dune.3.20.2 on 4.14.2, about
//! 13,000 results) split over 3 agents gives the same list as one
//! `opam-revdeps` process on the same repository.

use std::time::Duration;

use flotilla_e2e::procs::{server_on_shared, Agent, Server};
use flotilla_e2e::ui::Dashboard;
use flotilla_e2e::{binary, scratch};
use serde_json::json;

fn fixture_tarball() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures/opam/opam-repository-97014be.tar.gz")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dune_split_over_three_agents_matches_one_process() {
    let dir = scratch("e2e-revdeps-");
    let repo = dir.path().join("opam-repository");
    std::fs::create_dir_all(&repo).unwrap();
    let status = std::process::Command::new("tar")
        .arg("xzf")
        .arg(fixture_tarball())
        .arg("-C")
        .arg(&repo)
        .status()
        .expect("running tar");
    assert!(status.success(), "extracting the opam-repository fixture");

    // One process.
    let out = std::process::Command::new(binary("opam-revdeps"))
        .args([
            "--repo",
            repo.to_str().unwrap(),
            "--compiler",
            "ocaml-base-compiler.4.14.2",
        ])
        .arg("dune.3.20.2")
        .output()
        .expect("running opam-revdeps");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let single: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert!(
        single.len() > 10_000,
        "dune-sized: {} results",
        single.len()
    );

    // The fleet: plan on one agent, phase 2 in shards on three.
    let server = server_on_shared(dir.path(), 20_000).await;
    let api = server.api();
    let _agents: Vec<Agent> = futures_agents(&server).await;
    let v = api
        .post(
            "/api/v1/revdeps",
            json!({
                "target": "dune.3.20.2",
                "compiler": "ocaml-base-compiler.4.14.2",
                "repo": repo.to_str().unwrap(),
                "shard_size": 1500,
            }),
        )
        .await;
    let id = v["id"].as_str().unwrap().to_string();
    let start = std::time::Instant::now();
    let run = loop {
        let run = api.get(&format!("/api/v1/revdeps/{id}")).await;
        match run["state"].as_str().unwrap() {
            "done" => break run,
            "failed" => panic!("run failed: {run}"),
            _ => {}
        }
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "run still {run}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let fleet: Vec<String> = serde_json::from_value(run["result"].clone()).unwrap();
    assert_eq!(fleet.len(), single.len());
    assert_eq!(fleet, single, "the fleet's answer is the single process's");
    let shards = run["shards"].as_i64().unwrap();
    assert!(shards >= 3, "split into {shards} shards");
    // Shards ran on more than one agent.
    let jobs = api.get("/api/v1/jobs?state=succeeded&limit=1000").await;
    let agents: std::collections::BTreeSet<String> = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["kind"] == "revdeps")
        .filter_map(|j| j["agent"].as_str().map(str::to_string))
        .collect();
    assert!(agents.len() >= 2, "shards spread over agents: {agents:?}");
    eprintln!("revdeps run timings: {}", run["timings"]);

    dashboard_pages(&server, &id, &fleet, shards).await;

    // Bad input names the field.
    let (status, body) = api
        .raw(
            reqwest::Method::POST,
            "/api/v1/revdeps",
            Some(json!({"target": "dune", "compiler": "ocaml-base-compiler.4.14.2", "repo": "/x"})),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`target`"));
    // Unbounded names once made messages no limit held (a `fail` report
    // panicked on them): each is bounded, and the field named.
    for (field, body) in [
        (
            "target",
            json!({"target": format!("dune.{}", "€".repeat(100)),
                   "compiler": "ocaml-base-compiler.4.14.2", "repo": "/x"}),
        ),
        (
            "repo",
            json!({"target": "dune.3.20.2", "compiler": "ocaml-base-compiler.4.14.2",
                   "repo": "€".repeat(400)}),
        ),
    ] {
        let (status, v) = api
            .raw(reqwest::Method::POST, "/api/v1/revdeps", Some(body))
            .await;
        assert_eq!(status, 422, "{v}");
        assert_eq!(v["error"]["detail"]["path"], field, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("is longer than"),
            "{v}"
        );
    }
}

async fn futures_agents(server: &flotilla_e2e::procs::Server) -> Vec<Agent> {
    let mut v = Vec::new();
    for i in 0..3 {
        v.push(Agent::start(server, &format!("opam-{i}"), 1, &[]).await);
    }
    v
}

/// The dashboard's revdeps pages show the run as the API does: in the runs
/// list, its plan and every shard as steps, the answer (and a download
/// that is the answer), and the difference from an earlier answer of the
/// same target.
async fn dashboard_pages(server: &Server, id: &str, answer: &[String], shards: i64) {
    let ui = Dashboard::login(server).await;
    let list = ui.page("/ui/revdeps").await;
    assert!(list.contains(&format!("/ui/revdeps/{id}")), "{list}");
    assert!(
        list.contains(&format!("{} packages", answer.len())),
        "{list}"
    );

    let page = ui.page(&format!("/ui/revdeps/{id}")).await;
    assert!(page.contains(&format!("Answer: {} packages", answer.len())));
    let steps = page
        .split("<table id=\"steps\">")
        .nth(1)
        .expect("a steps table");
    let steps = steps.split("</table>").next().unwrap();
    assert_eq!(steps.matches(">shard ").count() as i64, shards, "{steps}");
    assert_eq!(steps.matches(">plan<").count(), 1, "{steps}");
    assert_eq!(steps.matches("s-succeeded").count() as i64, shards + 1);
    // The plan job's page and a shard's link back to the run.
    let step_jobs: Vec<&str> = steps
        .split("href=\"/ui/jobs/")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .collect();
    assert_eq!(step_jobs.len() as i64, shards + 1, "{steps}");
    for job in [step_jobs[0], step_jobs[step_jobs.len() - 1]] {
        let job_page = ui.page(&format!("/ui/jobs/{job}")).await;
        assert!(
            job_page.contains(&format!(
                "<a href=\"/ui/revdeps/{id}\">revdeps run {id}</a>"
            )),
            "{job}: {job_page}"
        );
    }
    assert!(
        page.contains("No earlier run of dune.3.20.2"),
        "nothing to compare yet"
    );

    let (status, text) = ui.get(&format!("/ui/revdeps/{id}/answer.txt")).await;
    assert_eq!(status, 200);
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        answer,
        "the download is the answer"
    );

    // An earlier answer of the same target with two packages fewer and one
    // that is not in the answer, written as the coordinator writes one.
    let db = sqlx::PgPool::connect(&server.opts.database_url)
        .await
        .unwrap();
    let earlier = uuid::Uuid::new_v4();
    let mut old: Vec<String> = answer[2..].to_vec();
    old.push("gone-package.1.0".to_string());
    sqlx::query(
        "INSERT INTO revdeps_runs (id, target, repo, variant, query, state, shard_size,
                                   submitter, plan_job, result, created_at, finished_at)
         SELECT $1, target, repo, variant, query, 'done', shard_size, submitter, plan_job,
                $3, created_at - interval '1 day', finished_at - interval '1 day'
         FROM revdeps_runs WHERE id = $2",
    )
    .bind(earlier)
    .bind(uuid::Uuid::parse_str(id).unwrap())
    .bind(serde_json::to_value(&old).unwrap())
    .execute(&db)
    .await
    .unwrap();
    let page = ui.page(&format!("/ui/revdeps/{id}")).await;
    assert!(page.contains(&format!("/ui/revdeps/{earlier}")), "{page}");
    assert!(
        page.contains("<span id=\"added-count\">2</span> added"),
        "{page}"
    );
    assert!(page.contains("<span id=\"removed-count\">1</span> removed"));
    assert!(page.contains(&format!("+ {}", answer[0])));
    assert!(page.contains("- gone-package.1.0"));
    // The earlier run has none before it; the list has both, newest first.
    let page = ui.page(&format!("/ui/revdeps/{earlier}")).await;
    assert!(page.contains("No earlier run of dune.3.20.2"));
    let list = ui.page("/ui/revdeps").await;
    let (a, b) = (
        list.find(&format!("/ui/revdeps/{id}")).unwrap(),
        list.find(&format!("/ui/revdeps/{earlier}")).unwrap(),
    );
    assert!(a < b, "newest first");
    // Unknown runs get the dashboard's 404 page, not JSON.
    let (status, body) = ui
        .get(&format!("/ui/revdeps/{}", uuid::Uuid::new_v4()))
        .await;
    assert_eq!(status, 404);
    assert!(body.contains("<html"), "{body}");
}
