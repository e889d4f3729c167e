//! Outputs go to a real S3-compatible server (moto's, from PyPI; Debian has
//! none): from the agent straight to the store, in parts to presigned URLs
//! the server signs, the server recording them only once the store holds
//! what was declared; tile inputs come back by redirects to presigned URLs.

use std::time::Duration;

use flotilla_core::job::JobState;
use flotilla_e2e::driven::Driven;
use flotilla_e2e::procs::{Agent, Server, ServerOpts};
use flotilla_e2e::s3::Moto;
use flotilla_e2e::{pg, scratch, tiles};
use serde_json::json;
use sha2::{Digest, Sha256};

/// How many `method` requests to the route template `route` the server has
/// answered, from its own latency histograms on /metrics. (Not the bytes
/// its process read, /proc/PID/io's `rchar`: that counts read(2), not the
/// recv(2) sockets are read with, and stays flat even when an output is
/// streamed through.)
async fn route_calls(server: &Server, method: &str, route: &str) -> u64 {
    let text = server.api().metrics().await;
    let labels = format!("method=\"{method}\",route=\"{route}\"");
    text.lines()
        .filter(|l| l.starts_with("flotilla_http_request_duration_seconds_count{"))
        .filter(|l| l.contains(&labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_go_to_s3_directly_with_size_and_sha256() {
    let Some(moto) = Moto::start("results").await else {
        return;
    };
    let dir = scratch("e2e-s3-");
    let endpoint = moto.endpoint.clone();
    let http = reqwest::Client::new();

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
            env: Moto::server_env(&endpoint)
                .into_iter()
                // S3's smallest parts, so that 12 MB is three of them.
                .chain([("FLOTILLA_OUTPUT_PART_MIB".into(), "5".into())])
                .collect(),
        },
    )
    .await;
    let api = server.api();
    let _agent = Agent::start(&server, "s3-agent", 1, &[]).await;
    // 12 MB of random bytes (two 5 MiB parts and a shorter last one) plus
    // a small text file (one part).
    let blob: Vec<u8> = (0..12_000_000).map(|_| rand::random::<u8>()).collect();
    let blob_file = dir.path().join("blob.bin");
    std::fs::write(&blob_file, &blob).unwrap();
    const STREAMED: &str = "/api/agent/v1/jobs/{id}/outputs/{*name}";
    const COMPLETED: &str = "/api/agent/v1/jobs/{id}/output-uploads/complete";
    let id = api
        .submit(json!({
            "kind": "command",
            "command": format!(
                "mkdir -p out && cp {} out/blob.bin && echo hello > small.txt",
                blob_file.display()
            ),
            "outputs": ["out/blob.bin", "small.txt"],
        }))
        .await;
    let job = api.wait_final(&id, Duration::from_secs(60)).await;
    assert_eq!(job.state, JobState::Succeeded, "{:?}", job.error);
    // Not through the server: no output was PUT to it, both were
    // completed as direct uploads.
    assert_eq!(
        route_calls(&server, "PUT", STREAMED).await,
        0,
        "outputs streamed through the server"
    );
    assert_eq!(route_calls(&server, "POST", COMPLETED).await, 2);
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
    let stored = job
        .outputs
        .iter()
        .find(|o| o.name == "out/blob.bin")
        .unwrap();
    assert_eq!(stored.size, blob.len() as u64);
    assert_eq!(stored.sha256, hex::encode(Sha256::digest(&blob)));
    let url = format!("{endpoint}/results/fleet-a/{}", stored.key);
    let held = http.get(&url).send().await.unwrap().bytes().await.unwrap();
    assert!(held.as_ref() == blob.as_slice(), "the object is the file");

    // Tile inputs and the checkpoint come from S3 itself: the server checks
    // the lease and answers with a redirect to a presigned URL, which the
    // agent follows.
    let ckpt = tiles::synth_ckpt(dir.path(), tiles::TINY, 7);
    tiles::register_dataset(&server, "synth", &ckpt).await;
    let put_inputs = |tile: &'static str, seed: u64| {
        let (moto, server_dir) = (&moto, &server);
        async move {
            let local = tiles::synth_inputs(server_dir, tile, 16, seed, &[]);
            let prefix = format!("results/fleet-a/inputs/2024/{tile}");
            moto.put_files(&prefix, &local).await;
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
        (
            "inputs/bands.npy".to_string(),
            Some(local.join("bands.npy")),
        ),
        ("checkpoint".to_string(), Some(ckpt.clone())),
        ("inputs/nope.npy".to_string(), None),
    ] {
        let r = no_follow
            .execute(
                driven
                    .request(
                        reqwest::Method::GET,
                        &format!("/api/agent/v1/jobs/{job}/{what}"),
                    )
                    .header(flotilla_core::protocol::LEASE_HEADER, lease.to_string())
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
    let r = no_follow
        .execute(
            driven
                .request(
                    reqwest::Method::GET,
                    &format!("/api/agent/v1/jobs/{job}/checkpoint"),
                )
                .header(
                    flotilla_core::protocol::LEASE_HEADER,
                    uuid::Uuid::new_v4().to_string(),
                )
                .build()
                .unwrap(),
        )
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert!((400..500).contains(&status), "a wrong lease: {status}");

    direct_uploads_record_only_what_the_store_holds(&server, &endpoint, &http).await;

    drop(server);
    drop(moto);
}

/// `POST /api/agent/v1/jobs/{job}/output-uploads{what}` as `agent`.
async fn direct_call(
    agent: &Driven,
    job: &str,
    what: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let r = agent
        .request(
            reqwest::Method::POST,
            &format!("/api/agent/v1/jobs/{job}/output-uploads{what}"),
        )
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// The start of an upload of `declared` as `part.bin`, in one part.
fn start_of(lease: &str, declared: &[u8]) -> serde_json::Value {
    json!({"lease_token": lease, "name": "part.bin", "size": declared.len(),
           "sha256": sha(declared), "part_size": 5 << 20, "part_sha256": [sha(declared)]})
}

/// Opens an upload of `declared` as `part.bin`, PUTs `bytes` to its one
/// part's URL, and completes it as `size` bytes: the part PUT's status and
/// the complete call's answer.
async fn upload_one_part(
    agent: &Driven,
    http: &reqwest::Client,
    (job, lease): (&str, &str),
    declared: &[u8],
    bytes: Vec<u8>,
    size: u64,
) -> (u16, (u16, serde_json::Value)) {
    let (s, up) = direct_call(agent, job, "", start_of(lease, declared)).await;
    assert_eq!(s, 200, "{up}");
    let part = &up["parts"][0];
    let url = part["url"].as_str().unwrap();
    assert!(url.contains("X-Amz-Signature="), "a presigned URL: {url}");
    let mut put = http.put(url).body(bytes);
    for (k, v) in part["headers"].as_object().unwrap() {
        put = put.header(k, v.as_str().unwrap());
    }
    let r = put.send().await.unwrap();
    let etag = r
        .headers()
        .get("etag")
        .map(|e| e.to_str().unwrap().to_string());
    let put_status = r.status().as_u16();
    let done = direct_call(
        agent,
        job,
        "/complete",
        json!({"lease_token": lease, "name": "part.bin", "upload_id": up["upload_id"],
               "size": size, "sha256": sha(declared),
               "parts": [{"number": 1, "etag": etag.unwrap_or_default(),
                          "sha256": sha(declared)}]}),
    )
    .await;
    (put_status, done)
}

/// The direct upload calls driven by hand: a wrong lease gets no URLs; an
/// upload is recorded only if the object the store assembled has the size
/// and part sha256s declared, else it is deleted and nothing (not even an
/// earlier upload's record) stays; no multipart upload is left open.
async fn direct_uploads_record_only_what_the_store_holds(
    server: &Server,
    endpoint: &str,
    http: &reqwest::Client,
) {
    let id = server
        .api()
        .submit(json!({"kind": "command", "command": "true", "outputs": ["part.bin"]}))
        .await;
    let agent = Driven::register(server, "s3-direct", &["command"], Duration::from_secs(5)).await;
    let (job, lease) = agent.lease().await;
    assert_eq!(job, id);
    let right: Vec<u8> = (0..1000u32).map(|i| (i % 256) as u8).collect();
    let wrong: Vec<u8> = right.iter().map(|b| b ^ 1).collect();

    // A wrong lease gets neither terms nor URLs; an undeclared output none.
    let stranger = uuid::Uuid::new_v4().to_string();
    let (s, v) = direct_call(
        &agent,
        &job,
        "/terms",
        json!({"lease_token": stranger, "name": "part.bin", "size": 1000}),
    )
    .await;
    assert!((400..500).contains(&s), "terms on a wrong lease: {s} {v}");
    let (s, v) = direct_call(&agent, &job, "", start_of(&stranger, &right)).await;
    assert!(
        (400..500).contains(&s) && v.get("parts").is_none(),
        "{s} {v}"
    );
    let (s, v) = direct_call(
        &agent,
        &job,
        "/terms",
        json!({"lease_token": lease, "name": "other.bin", "size": 1000}),
    )
    .await;
    assert_eq!(s, 422, "an undeclared output: {v}");
    let (s, v) = direct_call(
        &agent,
        &job,
        "/terms",
        json!({"lease_token": lease, "name": "part.bin", "size": 1000}),
    )
    .await;
    assert_eq!((s, &v["part_size"]), (200, &json!(5 << 20)), "{v}");

    let db = sqlx::PgPool::connect(&server.opts.database_url)
        .await
        .unwrap();
    let job_id = uuid::Uuid::parse_str(&job).unwrap();
    let recorded = || {
        sqlx::query_as::<_, (i64, String)>("SELECT size, sha256 FROM job_outputs WHERE job_id = $1")
            .bind(job_id)
            .fetch_all(&db)
    };
    let object = format!("{endpoint}/results/fleet-a/jobs/{job}/1/part.bin");
    let object_status = || {
        let get = http.get(&object).send();
        async move { get.await.unwrap().status().as_u16() }
    };
    let held = (job.as_str(), lease.as_str());

    let (put, (s, v)) = upload_one_part(&agent, http, held, &right, right.clone(), 1000).await;
    assert_eq!((put, s), (200, 200), "a right upload: {v}");
    assert_eq!(recorded().await.unwrap(), vec![(1000, sha(&right))]);
    let stored = http
        .get(&object)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(stored.as_ref(), right.as_slice());

    // Other bytes than declared. AWS refuses the part (400 BadDigest: its
    // sha256 is signed into the URL); moto 5 takes it, and the store's
    // checksum of what it holds gives it away at completion. Either way
    // the object goes, and the earlier upload's record with it.
    let (put, (s, v)) = upload_one_part(&agent, http, held, &right, wrong, 1000).await;
    if put == 200 {
        assert_eq!(s, 422, "wrong bytes completed: {v}");
        let why = v["error"]["message"].as_str().unwrap();
        assert!(why.contains("sha256"), "{why}");
    } else {
        assert_eq!(put, 400, "the store refused the part");
        assert!((400..600).contains(&s), "{s} {v}");
    }
    assert_eq!(object_status().await, 404, "no object left");
    assert_eq!(recorded().await.unwrap(), vec![], "nothing recorded");

    // The right bytes, declared one byte longer.
    let (put, (s, v)) = upload_one_part(&agent, http, held, &right, right.clone(), 1001).await;
    assert_eq!((put, s), (200, 422), "a wrong size: {v}");
    let why = v["error"]["message"].as_str().unwrap();
    assert!(why.contains("1000 bytes, not the 1001"), "{why}");
    assert_eq!(object_status().await, 404, "no object left");
    assert_eq!(recorded().await.unwrap(), vec![], "nothing recorded");

    // An upload given up; then none is left open in the bucket, this
    // job's or the real agent's.
    let (s, up) = direct_call(&agent, &job, "", start_of(&lease, &right)).await;
    assert_eq!(s, 200, "{up}");
    let (s, v) = direct_call(
        &agent,
        &job,
        "/abort",
        json!({"lease_token": lease, "name": "part.bin", "upload_id": up["upload_id"]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let open = http
        .get(format!("{endpoint}/results?uploads"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!open.contains("<Upload>"), "uploads left open: {open}");
}
