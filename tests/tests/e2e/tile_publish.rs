//! A tile job's outputs are copied to their final keys in the store with no
//! database connection held. On S3 a copy of a large object takes seconds;
//! a completion that held its transaction (and the job row's lock) across
//! the copies tied up one of the agents' pool connections per completing
//! tile, and with a few at once the heartbeats and leases that keep the
//! fleet's work alive waited behind them.

use std::time::Duration;

use flotilla_e2e::driven::Driven;
use flotilla_e2e::procs::{Agent, Server, ServerOpts};
use flotilla_e2e::s3::{CopyGate, Moto};
use flotilla_e2e::{pg, scratch, tiles};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tile_is_published_while_the_agents_pool_serves_others() {
    let Some(moto) = Moto::start("results").await else {
        return;
    };
    let mut gate = CopyGate::start(moto.addr).await;
    let dir = scratch("e2e-tile-publish-");
    let cluster = pg::shared().await;
    let db_name = pg::fresh_database(cluster).await;
    let mut env = Moto::server_env(&gate.endpoint);
    // One connection for every agent call: a completion holding it across
    // the copy would stop the bystander's heartbeat below.
    env.push(("FLOTILLA_AGENT_POOL_SIZE".into(), "1".into()));
    let server = Server::start(
        dir.path(),
        ServerOpts {
            database_url: cluster.database_url(&db_name),
            store: "s3://results/fleet".into(),
            listen: "127.0.0.1:0".parse().unwrap(),
            lease_ttl_ms: 60_000,
            backoff_base_ms: 200,
            env,
        },
    )
    .await;
    let api = server.api();
    let ckpt = tiles::synth_ckpt(dir.path(), tiles::TINY, 5);
    tiles::register_dataset(&server, "synth", &ckpt).await;
    let tile = "grid_0.05_52.05";
    let local = tiles::synth_inputs(&server, tile, 16, 3, &[]);
    moto.put_files(&format!("results/fleet/inputs/2024/{tile}"), &local)
        .await;
    let http = reqwest::Client::new();
    let bystander =
        Driven::register(&server, "bystander", &["command"], Duration::from_secs(15)).await;

    gate.close();
    let _tiler = Agent::start(&server, "tiler", 1, &[]).await;
    let made = api
        .post(
            "/api/v1/rois",
            json!({"name": "held", "year": 2024, "dataset": "synth",
                   "bbox": [0.01, 52.01, 0.09, 52.09]}),
        )
        .await;
    assert_eq!(made["submitted"], 1, "{made}");
    let roi = made["id"].as_str().unwrap().to_string();
    tokio::time::timeout(Duration::from_secs(180), gate.copy_held(0))
        .await
        .expect("the tile's outputs to be copied to their final keys");

    // The copy is held. Another agent's heartbeat is answered, on the one
    // connection of the agents' pool, and no server connection has sat in
    // a transaction for a second (the completing one would have since the
    // copy began).
    bystander
        .heartbeat()
        .await
        .expect("a heartbeat answered while a tile's copy is held");
    let db = sqlx::PgPool::connect(&server.opts.database_url)
        .await
        .unwrap();
    let waiting: Vec<String> = sqlx::query_scalar(
        "SELECT query FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND state LIKE 'idle in transaction%'
           AND xact_start < now() - interval '1 second'",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    assert!(
        waiting.is_empty(),
        "connections in a transaction while the store copies: {waiting:?}"
    );
    // Not recorded yet: nothing says the tile is done before it is there.
    let view = api.get(&format!("/api/v1/rois/{roi}")).await;
    assert_eq!(view["tiles"]["done"], 0, "{view}");

    gate.open();
    let done = tiles::wait_roi(
        &server,
        &roi,
        Duration::from_secs(120),
        Duration::from_millis(200),
    )
    .await;
    assert_eq!(done["tiles"]["done"], 1, "{done}");
    // Both outputs are at their final keys, the sizes coverage recorded.
    let recorded: (i64, i64) =
        sqlx::query_as("SELECT grid_size, scales_size FROM coverage WHERE dataset = 'synth'")
            .fetch_one(&db)
            .await
            .unwrap();
    let listing = http
        .get(format!(
            "{}/results?list-type=2&prefix=fleet/synth/2024/{tile}/",
            moto.endpoint
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let sizes: Vec<i64> = listing
        .split("<Size>")
        .skip(1)
        .filter_map(|s| s.split('<').next()?.parse().ok())
        .collect();
    assert_eq!(sizes.len(), 2, "{listing}");
    assert_eq!(
        sizes.iter().sum::<i64>(),
        recorded.0 + recorded.1,
        "{listing}"
    );
}
