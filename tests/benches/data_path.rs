//! Server CPU per GB moved between an agent and the S3 store, through the
//! server (`--presign-ttl-s 0`) against by presigned URLs (the default with
//! an S3 store), both ways: a tile's input downloaded (redirected to a
//! presigned GET) and a job's output uploaded (presigned multipart PUTs in
//! 64 MiB parts, the server opening, completing and checking the upload).
//! Against moto on loopback (from PyPI; `scripts/setup-debian.sh --test`
//! installs it): objects of DATA_PATH_MB MiB (default 256), two servers on
//! one database and store (one each way), agent processes driven by the
//! bench holding a tile job's and a command job's leases on both, moving
//! the object DATA_PATH_ROUNDS times (default 3) through each, alternately.
//! Prints the servers' CPU seconds per GB (from /proc) and the ratios.
//!
//! `cargo build --bins && cargo test -p flotilla-e2e --bench data_path --no-run`,
//! then run the built `target/debug/deps/data_path-*`.

use std::process::Stdio;
use std::time::{Duration, Instant};

use flotilla_e2e::driven::Driven;
use flotilla_e2e::procs::{free_addr, Server, ServerOpts};
use flotilla_e2e::{eventually, pg, scratch, tiles};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// CPU time (user + system) of a process so far, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the server runs");
    let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    let per_s: f64 = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0);
    ticks as f64 / per_s
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mib = env_or("DATA_PATH_MB", 256);
    let rounds = env_or("DATA_PATH_ROUNDS", 3);
    let dir = scratch("bench-data-path-");
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
        .expect("starting moto (scripts/setup-debian.sh --test installs it)");
    let endpoint = format!("http://{s3_addr}");
    let http = reqwest::Client::new();
    eventually("moto to answer", Duration::from_secs(60), || {
        let req = http.put(format!("{endpoint}/results")).send();
        async move { matches!(req.await, Ok(r) if r.status().is_success()) }
    })
    .await;

    let cluster = pg::shared().await;
    let db = pg::fresh_database(cluster).await;
    let opts = |presign_s: &str| ServerOpts {
        database_url: cluster.database_url(&db),
        store: "s3://results/bench".into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        lease_ttl_ms: 60_000,
        backoff_base_ms: 200,
        env: vec![
            ("AWS_ACCESS_KEY_ID".into(), "test".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), "test".into()),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_ENDPOINT_URL".into(), endpoint.clone()),
            ("AWS_ALLOW_HTTP".into(), "true".into()),
            ("FLOTILLA_PRESIGN_TTL_S".into(), presign_s.into()),
        ],
    };
    let (proxy_dir, presign_dir) = (dir.path().join("proxy"), dir.path().join("presign"));
    std::fs::create_dir_all(&proxy_dir).unwrap();
    std::fs::create_dir_all(&presign_dir).unwrap();
    let proxy = Server::start(&proxy_dir, opts("0")).await;
    let presign = Server::start(&presign_dir, opts("900")).await;

    // A dataset, a tile whose bands.npy is the big object, its job leased.
    let ckpt = tiles::synth_ckpt(dir.path(), tiles::TINY, 7);
    tiles::register_dataset(&proxy, "synth", &ckpt).await;
    let tile = "grid_0.05_52.05";
    let object = vec![7u8; mib << 20];
    let r = http
        .put(format!(
            "{endpoint}/results/bench/inputs/2024/{tile}/bands.npy"
        ))
        .body(object)
        .send()
        .await
        .unwrap();
    assert!(
        r.status().is_success(),
        "putting the object: {}",
        r.status()
    );
    let made = proxy
        .api()
        .post(
            "/api/v1/rois",
            json!({"name": "bench", "year": 2024, "dataset": "synth",
                   "bbox": [0.01, 52.01, 0.09, 52.09]}),
        )
        .await;
    assert_eq!(made["submitted"], 1, "{made}");
    let agent = Driven::register(&proxy, "bench-agent", &["tile"], Duration::from_secs(30)).await;
    let (job, lease) = agent.lease().await;

    // The same agent process (token, instance) against either server; the
    // client follows the redirect (reqwest's default client, headers and all;
    // the real agent fetches the store's URL with a client of its own).
    let fetch = |server: &Server| {
        let url = format!("{}/api/agent/v1/jobs/{job}/inputs/bands.npy", server.url());
        let req = agent
            .api
            .http
            .get(url)
            .bearer_auth(&agent.api.token)
            .header(
                flotilla_core::protocol::INSTANCE_HEADER,
                agent.api.instance(),
            )
            .header(flotilla_core::protocol::LEASE_HEADER, lease.as_str())
            .send();
        async move {
            let mut resp = req.await.unwrap();
            assert!(resp.status().is_success(), "{}", resp.status());
            let mut n = 0usize;
            while let Some(chunk) = resp.chunk().await.unwrap() {
                n += chunk.len();
            }
            n
        }
    };
    let mut totals = [(0f64, 0f64, 0usize); 2];
    for _ in 0..rounds {
        for (i, server) in [&proxy, &presign].into_iter().enumerate() {
            let cpu0 = cpu_seconds(server.pid());
            let t = Instant::now();
            let n = fetch(server).await;
            let wall = t.elapsed().as_secs_f64();
            let cpu = cpu_seconds(server.pid()) - cpu0;
            assert_eq!(n, mib << 20, "the whole object");
            totals[i].0 += cpu;
            totals[i].1 += wall;
            totals[i].2 += n;
        }
    }
    report(
        &format!(
            "tile input downloaded: {mib} MiB object, {rounds} rounds each way, moto on loopback"
        ),
        ["streamed through the server", "presigned redirect"],
        totals,
    );

    // A command job declaring one output, leased by another agent process
    // on both servers; the output uploaded again and again (each upload
    // replaces the last at the attempt's key and in its record).
    let uploader = Driven::register(
        &proxy,
        "bench-uploader",
        &["command"],
        Duration::from_secs(30),
    )
    .await;
    let id = proxy
        .api()
        .submit(json!({"kind": "command", "command": "true", "outputs": ["out.bin"]}))
        .await;
    let (job, lease) = uploader.lease().await;
    assert_eq!(job, id);
    let output = vec![5u8; mib << 20];
    // The agent hashes the file whole and per part before it uploads; done
    // once here, outside the measurement (it is the agent's CPU, not the
    // server's).
    let part_size = 64usize << 20;
    let sums = Sums {
        whole: hex::encode(Sha256::digest(&output)),
        parts: output
            .chunks(part_size)
            .map(|c| hex::encode(Sha256::digest(c)))
            .collect(),
    };
    let mut totals = [(0f64, 0f64, 0usize); 2];
    for _ in 0..rounds {
        for (i, server) in [&proxy, &presign].into_iter().enumerate() {
            let cpu0 = cpu_seconds(server.pid());
            let t = Instant::now();
            let size = if i == 0 {
                upload_streamed(&uploader, server, &job, &lease, &output).await
            } else {
                let held = (job.as_str(), lease.as_str());
                upload_presigned(&uploader, &http, server, held, &output, &sums).await
            };
            let wall = t.elapsed().as_secs_f64();
            let cpu = cpu_seconds(server.pid()) - cpu0;
            assert_eq!(size, output.len() as u64, "the whole output recorded");
            totals[i].0 += cpu;
            totals[i].1 += wall;
            totals[i].2 += output.len();
        }
    }
    report(
        &format!("job output uploaded: {mib} MiB file, {rounds} rounds each way, 64 MiB parts"),
        ["streamed through the server", "presigned multipart PUTs"],
        totals,
    );
    let _ = moto.kill().await;
}

/// Prints CPU and wall time per GB each way, and the CPU ratio.
fn report(title: &str, names: [&str; 2], totals: [(f64, f64, usize); 2]) {
    let gb = |n: usize| n as f64 / 1e9;
    println!("data path benchmark, {title}");
    for (name, (cpu, wall, n)) in names.iter().zip(totals) {
        println!(
            "  {name:<28} server CPU {:7.3} s per GB   wall {:6.2} s per GB",
            cpu / gb(n),
            wall / gb(n)
        );
    }
    println!(
        "  server CPU per GB, presigned / streamed: {:.3}",
        (totals[1].0 / gb(totals[1].2)) / (totals[0].0 / gb(totals[0].2))
    );
}

/// An output's sha256, whole and per 64 MiB part, in hex.
struct Sums {
    whole: String,
    parts: Vec<String>,
}

/// A request of `agent`'s process to `server`.
fn agent_request(
    agent: &Driven,
    server: &Server,
    method: reqwest::Method,
    path: &str,
) -> reqwest::RequestBuilder {
    agent
        .api
        .http
        .request(method, format!("{}{path}", server.url()))
        .bearer_auth(&agent.api.token)
        .header(
            flotilla_core::protocol::INSTANCE_HEADER,
            agent.api.instance(),
        )
}

/// A POST of the agent protocol that must succeed; its answer.
async fn agent_post(agent: &Driven, server: &Server, path: &str, body: Value) -> Value {
    let r = agent_request(agent, server, reqwest::Method::POST, path)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let v: Value = r.json().await.unwrap();
    assert!(status.is_success(), "POST {path}: {status} {v}");
    v
}

/// The output streamed through `server` (`PUT …/outputs/out.bin`): the
/// size it recorded.
async fn upload_streamed(
    agent: &Driven,
    server: &Server,
    job: &str,
    lease: &str,
    output: &[u8],
) -> u64 {
    let r = agent_request(
        agent,
        server,
        reqwest::Method::PUT,
        &format!("/api/agent/v1/jobs/{job}/outputs/out.bin"),
    )
    .header(flotilla_core::protocol::LEASE_HEADER, lease)
    .body(output.to_vec())
    .send()
    .await
    .unwrap();
    let status = r.status();
    let v: Value = r.json().await.unwrap();
    assert!(status.is_success(), "PUT: {status} {v}");
    v["size"].as_u64().unwrap()
}

/// The output uploaded as the agent does where `server` presigns: terms,
/// the upload opened, each part PUT to its URL, completed. The size the
/// server recorded.
async fn upload_presigned(
    agent: &Driven,
    http: &reqwest::Client,
    server: &Server,
    (job, lease): (&str, &str),
    output: &[u8],
    sums: &Sums,
) -> u64 {
    let base = format!("/api/agent/v1/jobs/{job}/output-uploads");
    let terms = agent_post(
        agent,
        server,
        &format!("{base}/terms"),
        json!({"lease_token": lease, "name": "out.bin", "size": output.len()}),
    )
    .await;
    let part_size = terms["part_size"]
        .as_u64()
        .expect("the presigning server offers a direct upload");
    assert_eq!(part_size, 64 << 20, "the default part size");
    let up = agent_post(
        agent,
        server,
        &base,
        json!({"lease_token": lease, "name": "out.bin", "size": output.len(),
               "sha256": sums.whole, "part_size": part_size, "part_sha256": sums.parts}),
    )
    .await;
    let mut parts = Vec::new();
    for ((part, bytes), sha256) in up["parts"]
        .as_array()
        .unwrap()
        .iter()
        .zip(output.chunks(part_size as usize))
        .zip(&sums.parts)
    {
        let mut put = http.put(part["url"].as_str().unwrap()).body(bytes.to_vec());
        for (k, v) in part["headers"].as_object().unwrap() {
            put = put.header(k, v.as_str().unwrap());
        }
        let r = put.send().await.unwrap();
        assert!(r.status().is_success(), "part PUT: {}", r.status());
        let etag = r.headers()["etag"].to_str().unwrap().to_string();
        parts.push(json!({"number": part["number"], "etag": etag, "sha256": sha256}));
    }
    let done = agent_post(
        agent,
        server,
        &format!("{base}/complete"),
        json!({"lease_token": lease, "name": "out.bin", "upload_id": up["upload_id"],
               "size": output.len(), "sha256": sums.whole, "parts": parts}),
    )
    .await;
    done["size"].as_u64().unwrap()
}
