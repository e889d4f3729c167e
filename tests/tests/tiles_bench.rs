//! ROI planning and bulk insert at 1,000, 100,000 and 1,000,000 tiles (ignored by default: `cargo test -p flotilla-e2e --test tiles_bench -- --ignored --nocapture`). Prints timings; never decides pass or fail on them.

use std::time::{Duration, Instant};

use flotilla_e2e::procs::server_on_shared;
use flotilla_e2e::scratch;
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
    let (s, v) = api
        .raw(
            reqwest::Method::POST,
            "/api/v1/datasets",
            Some(json!({ "name": "bench", "input_prefix": "inputs" })),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let resp = api
        .http
        .put(format!("{}/api/v1/datasets/bench/checkpoint", api.base))
        .bearer_auth(&api.token)
        .body(vec![1u8; 64])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    // (tiles, bbox): cells are 0.1°, so w×h degrees hold 100·w·h tiles.
    let cases = [
        (1_000u64, [0.0, 0.0, 10.0, 1.0]),
        (100_000, [-50.0, 10.0, 50.0, 20.0]),
        (1_000_000, [-50.0, -50.0, 50.0, 50.0]),
    ];
    for (year, (n, bbox)) in (2020..).zip(cases) {
        let body =
            json!({ "name": format!("bench-{n}"), "year": year, "dataset": "bench", "bbox": bbox });
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
