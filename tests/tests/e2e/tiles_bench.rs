//! ROI planning and bulk insert at 1,000, 100,000 and 1,000,000 tiles (ignored by default: `cargo test -p flotilla-e2e --test e2e -- --ignored --nocapture tiles_bench::`). Prints timings; never decides pass or fail on them.

use std::time::{Duration, Instant};

use flotilla_e2e::procs::server_on_shared;
use flotilla_e2e::scratch;
use flotilla_e2e::tiles;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn roi_plan_and_insert_times() {
    let dir = scratch("e2e-tiles-bench-");
    let server = server_on_shared(dir.path(), 30_000).await;
    let api = flotilla_e2e::api::Api {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(1800))
            .build()
            .unwrap(),
        ..server.api()
    };
    // Planning never reads the model: 64 bytes stand in for one.
    let ckpt = dir.path().join("ckpt.bin");
    std::fs::write(&ckpt, [1u8; 64]).unwrap();
    tiles::register_dataset(&server, "bench", &ckpt).await;
    // (tiles, bbox): cells are 0.1°, so w×h degrees hold 100·w·h tiles.
    let cases = [
        (1_000u64, [0.0, 0.0, 10.0, 1.0]),
        (100_000, [-50.0, 10.0, 50.0, 20.0]),
        (1_000_000, [-50.0, -50.0, 50.0, 50.0]),
    ];
    for (year, (n, bbox)) in (2020..).zip(cases) {
        // 1,000,000 tiles is over one ROI's cap; the bench's token is an admin's.
        let body = json!({ "name": format!("bench-{n}"), "year": year, "dataset": "bench",
                           "bbox": bbox, "exceed_tile_cap": true });
        let t = Instant::now();
        let plan = api.post("/api/v1/rois/plan", body.clone()).await;
        let plan_wall = t.elapsed();
        assert_eq!(plan["total"], n, "{plan}");
        let t = Instant::now();
        let made = api.post("/api/v1/rois", body).await;
        let submit_wall = t.elapsed();
        assert_eq!(made["submitted"], n, "{made}");
        println!(
            "ROI of {n:>9} tiles: plan request {:>8.1} ms; submit request {:>9.1} ms \
             (server: plan {} ms, insert {} ms)",
            plan_wall.as_secs_f64() * 1e3,
            submit_wall.as_secs_f64() * 1e3,
            made["plan_ms"],
            made["insert_ms"],
        );
    }
}

/// One 200×200-pixel tile: wall time of bare `tessera-encode` against the
/// same tile as a job (submit to finished, and the job's own started→finished).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn tile_job_overhead_against_bare_tessera_encode() {
    let dir = scratch("e2e-tiles-overhead-");
    let server = server_on_shared(dir.path(), 10_000).await;
    let api = server.api();
    let ckpt = tiles::synth_ckpt(dir.path(), tiles::SLOW, 0);
    let tile = "grid_0.05_52.05";
    // The same inputs under two years: two rounds, each a bare run then a
    // job, so that a slow minute of the machine shows up as a round apart.
    let local = tiles::synth_inputs(&server, tile, 200, 0, &[2024, 2025]);
    tiles::register_dataset(&server, "oh", &ckpt).await;
    let _agent = flotilla_e2e::procs::Agent::start(&server, "oh-a", 1, &[]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    for year in [2024, 2025] {
        let out = dir.path().join(format!("bare-{year}"));
        let t = Instant::now();
        tiles::encode_int8(&ckpt, &local, &out);
        let bare = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let made = api
            .post(
                "/api/v1/rois",
                json!({ "name": "oh", "year": year, "dataset": "oh",
                        "bbox": [0.01, 52.01, 0.09, 52.09] }),
            )
            .await;
        assert_eq!(made["submitted"], 1, "{made}");
        let id = made["id"].as_str().unwrap();
        // Polled every 20 ms: the poll is part of the measured wall time.
        let v = tiles::wait_roi(
            &server,
            id,
            Duration::from_secs(1800),
            Duration::from_millis(20),
        )
        .await;
        assert_eq!(v["jobs"]["succeeded"], 1, "{v}");
        let job_wall = t.elapsed().as_secs_f64();
        let jobs = api.get("/api/v1/jobs?limit=1").await;
        let j = api
            .get(&format!(
                "/api/v1/jobs/{}",
                jobs["jobs"][0]["id"].as_str().unwrap()
            ))
            .await;
        let started =
            chrono::DateTime::parse_from_rfc3339(j["started_at"].as_str().unwrap()).unwrap();
        let finished =
            chrono::DateTime::parse_from_rfc3339(j["finished_at"].as_str().unwrap()).unwrap();
        let on_agent = (finished - started).num_milliseconds() as f64 / 1e3;
        // The agent's own split of the job: the encoder's time is the same
        // work bare tessera-encode does, measured in the same minute as the
        // rest of the job, so (job − encode) / encode is the overhead even
        // when the machine's speed moves between runs.
        let r = &j["result"];
        let encode_s = r["encode_s"]
            .as_f64()
            .unwrap_or_else(|| panic!("no encode_s: {j}"));
        println!(
            "year {year}: bare tessera-encode {bare:.2} s; tile job submit→finished {job_wall:.2} s \
             (leased→finished {on_agent:.2} s; agent: checkpoint {:.2} s, fetch {:.2} s, \
             encode {encode_s:.2} s, upload {:.2} s); overhead (submit→finished − encode) / \
             encode = {:+.2} %; job / bare = {:+.1} %",
            r["checkpoint_s"].as_f64().unwrap_or(f64::NAN),
            r["fetch_s"].as_f64().unwrap_or(f64::NAN),
            r["upload_s"].as_f64().unwrap_or(f64::NAN),
            (job_wall - encode_s) / encode_s * 100.0,
            (job_wall / bare - 1.0) * 100.0,
        );
    }
}
