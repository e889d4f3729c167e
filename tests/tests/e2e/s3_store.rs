//! Outputs go to a real S3-compatible server (moto's, from PyPI; Debian has
//! none) through `object_store`'s AWS client with a custom endpoint.

use std::process::Stdio;
use std::time::Duration;

use flotilla_core::job::JobState;
use flotilla_e2e::driven::Driven;
use flotilla_e2e::procs::{free_addr, Agent, Server, ServerOpts};
use flotilla_e2e::{eventually, pg, scratch, tiles};
use serde_json::json;
use sha2::{Digest, Sha256};

fn moto_available() -> bool {
    std::process::Command::new("python3")
        .args(["-c", "import moto.server"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_are_streamed_to_s3_with_size_and_sha256() {
    if !moto_available() {
        // CI installs moto (scripts/setup-debian.sh --test); there its
        // absence is a failure, not a skip.
        assert!(
            std::env::var_os("CI").is_none(),
            "moto[server] is not installed; scripts/setup-debian.sh --test installs it"
        );
        eprintln!("SKIPPED: moto[server] is not installed (run scripts/setup-debian.sh --test)");
        return;
    }
    let dir = scratch("e2e-s3-");
    let s3_addr = free_addr();
    let mut moto = tokio::process::Command::new("python3")
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &s3_addr.port().to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starting moto");
    let endpoint = format!("http://{s3_addr}");
    let http = reqwest::Client::new();
    eventually("moto to answer", Duration::from_secs(60), || {
        let req = http.put(format!("{endpoint}/results")).send();
        async move { matches!(req.await, Ok(r) if r.status().is_success()) }
    })
    .await;

    let cluster = pg::shared().await;
    let db = pg::fresh_database(cluster).await;
    let server = Server::start(
        dir.path(),
        ServerOpts {
            database_url: cluster.database_url(&db),
            store: "s3://results/fleet-a".into(),
            listen: "127.0.0.1:0".parse().unwrap(),
            lease_ttl_ms: 5_000,
            backoff_base_ms: 200,
            env: vec![
                ("AWS_ACCESS_KEY_ID".into(), "test".into()),
                ("AWS_SECRET_ACCESS_KEY".into(), "test".into()),
                ("AWS_REGION".into(), "us-east-1".into()),
                ("AWS_ENDPOINT_URL".into(), endpoint.clone()),
                ("AWS_ALLOW_HTTP".into(), "true".into()),
            ],
        },
    )
    .await;
    let api = server.api();
    let _agent = Agent::start(&server, "s3-agent", 1, &[]).await;
    // 3 MiB of pseudo-random bytes plus a small text file.
    let id = api
        .submit(json!({
            "kind": "command",
            "command": "mkdir -p out && head -c 3145728 /dev/urandom > out/blob.bin && echo hello > small.txt",
            "outputs": ["out/blob.bin", "small.txt"],
        }))
        .await;
    let job = api.wait_final(&id, Duration::from_secs(60)).await;
    assert_eq!(job.state, JobState::Succeeded, "{:?}", job.error);
    assert_eq!(job.outputs.len(), 2);
    for out in &job.outputs {
        let url = format!("{endpoint}/results/fleet-a/{}", out.key);
        let body = http.get(&url).send().await.unwrap();
        assert!(body.status().is_success(), "GET {url}: {}", body.status());
        let bytes = body.bytes().await.unwrap();
        assert_eq!(bytes.len() as u64, out.size, "{}", out.name);
        assert_eq!(
            hex::encode(Sha256::digest(&bytes)),
            out.sha256,
            "{}",
            out.name
        );
    }
    let small = job.outputs.iter().find(|o| o.name == "small.txt").unwrap();
    assert_eq!(small.size, 6);
    let blob = job
        .outputs
        .iter()
        .find(|o| o.name == "out/blob.bin")
        .unwrap();
    assert_eq!(blob.size, 3 << 20);

    // Tile inputs and the checkpoint come from S3 itself: the server checks
    // the lease and answers with a redirect to a presigned URL, which the
    // agent follows.
    let ckpt = tiles::synth_ckpt(dir.path(), tiles::TINY, 7);
    tiles::register_dataset(&server, "synth", &ckpt).await;
    let put_inputs = |tile: &'static str, seed: u64| {
        let (http, endpoint, server_dir) = (http.clone(), endpoint.clone(), &server);
        async move {
            let local = tiles::synth_inputs(server_dir, tile, 16, seed, &[]);
            for f in std::fs::read_dir(&local).unwrap() {
                let f = f.unwrap();
                let name = f.file_name().to_string_lossy().into_owned();
                let r = http
                    .put(format!(
                        "{endpoint}/results/fleet-a/inputs/2024/{tile}/{name}"
                    ))
                    .body(std::fs::read(f.path()).unwrap())
                    .send()
                    .await
                    .unwrap();
                assert!(r.status().is_success(), "PUT {name}: {}", r.status());
            }
            local
        }
    };
    put_inputs("grid_0.05_52.05", 1).await;
    let roi = |name: &str, lon: f64| {
        json!({"name": name, "year": 2024, "dataset": "synth",
               "bbox": [lon + 0.01, 52.01, lon + 0.09, 52.09]})
    };
    let made = api.post("/api/v1/rois", roi("s3-first", 0.0)).await;
    assert_eq!(made["submitted"], 1, "{made}");
    let done = tiles::wait_roi(
        &server,
        made["id"].as_str().unwrap(),
        Duration::from_secs(240),
        Duration::from_millis(200),
    )
    .await;
    assert_eq!(done["tiles"]["done"], 1, "encoded from S3 inputs: {done}");

    // The redirect itself, seen by an agent that does not follow it: a
    // presigned URL on the store's host, whose bytes are the object's.
    let (status, v) = api
        .raw(reqwest::Method::POST, "/api/v1/agents/s3-agent/pause", None)
        .await;
    assert!(status < 300, "{v}");
    let local = put_inputs("grid_0.15_52.05", 2).await;
    let made = api.post("/api/v1/rois", roi("s3-second", 0.1)).await;
    assert_eq!(made["submitted"], 1, "{made}");
    let driven = Driven::register(&server, "s3-driven", &["tile"], Duration::from_secs(5)).await;
    let (job, lease) = driven.lease().await;
    let no_follow = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for (what, local_file) in [
        (format!("inputs/bands.npy"), Some(local.join("bands.npy"))),
        ("checkpoint".to_string(), Some(ckpt.clone())),
        ("inputs/nope.npy".to_string(), None),
    ] {
        let r = no_follow
            .execute(
                driven
                    .request(
                        reqwest::Method::GET,
                        &format!("/api/agent/v1/jobs/{job}/{what}?lease={lease}"),
                    )
                    .build()
                    .unwrap(),
            )
            .await
            .unwrap();
        let Some(local_file) = local_file else {
            assert_eq!(r.status(), 404, "{what}");
            let body: serde_json::Value = r.json().await.unwrap();
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("nope.npy"),
                "{body}"
            );
            continue;
        };
        assert_eq!(r.status(), 307, "{what}");
        let to = r.headers()["location"].to_str().unwrap().to_string();
        assert!(
            to.starts_with(&endpoint),
            "{what} redirects to the store: {to}"
        );
        assert!(
            to.contains("X-Amz-Signature="),
            "{what}: a presigned URL: {to}"
        );
        let bytes = http.get(&to).send().await.unwrap().bytes().await.unwrap();
        assert_eq!(bytes.as_ref(), std::fs::read(local_file).unwrap(), "{what}");
    }
    // Without the lease, no redirect.
    let (status, _) = driven
        .api
        .raw(
            reqwest::Method::GET,
            &format!(
                "/api/agent/v1/jobs/{job}/checkpoint?lease={}",
                uuid::Uuid::new_v4()
            ),
            None,
        )
        .await;
    assert!((400..500).contains(&status), "a wrong lease: {status}");

    drop(server);
    let _ = moto.kill().await;
}
