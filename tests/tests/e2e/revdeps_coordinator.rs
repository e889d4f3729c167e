//! The revdeps coordinator against a real PostgreSQL, with step results
//! written as an agent would (some of them malformed): one bad run fails
//! with the reason and the others still finish.

use flotilla_core::api::revdeps::{RunState, SubmitRevdeps};
use flotilla_server::revdeps::{self, coordinator, ValidRevdeps};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

async fn run(db: &PgPool, target: &str) -> Uuid {
    let body = SubmitRevdeps::new(target.into(), "5.3.0".into(), "/nowhere".into());
    revdeps::submit(db, ValidRevdeps::try_from(body).unwrap(), "t", None, None)
        .await
        .unwrap()
        .expect("no waiting cap")
}

/// Ends a job as an agent's `complete` would leave it, with `result`.
async fn succeed(db: &PgPool, job: Uuid, result: serde_json::Value) {
    sqlx::query(
        "UPDATE jobs SET state = 'succeeded', result = $2, finished_at = now() WHERE id = $1",
    )
    .bind(job)
    .bind(result)
    .execute(db)
    .await
    .unwrap();
}

async fn plan_job(db: &PgPool, run: Uuid) -> Uuid {
    sqlx::query_scalar("SELECT plan_job FROM revdeps_runs WHERE id = $1")
        .bind(run)
        .fetch_one(db)
        .await
        .unwrap()
}

async fn shards(db: &PgPool, run: Uuid) -> Vec<Uuid> {
    sqlx::query_scalar("SELECT id FROM jobs WHERE parent_id = $1 ORDER BY child_index")
        .bind(run)
        .fetch_all(db)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_malformed_step_result_fails_its_run_and_the_others_finish() {
    let db = flotilla_e2e::pg::migrated_database().await;
    let plan = |pkg: &str| json!({"candidates": [{"pkg": pkg, "queries": 1}], "load_ms": 1, "phase1_ms": 1});
    // A: its plan is not a plan. B: its shard's answer is not an answer.
    // C: well-formed throughout.
    let (a, b, c) = (
        run(&db, "a.1").await,
        run(&db, "b.1").await,
        run(&db, "c.1").await,
    );
    succeed(&db, plan_job(&db, a).await, json!({"candidates": "nope"})).await;
    succeed(&db, plan_job(&db, b).await, plan("x.1")).await;
    succeed(&db, plan_job(&db, c).await, plan("y.1")).await;
    coordinator::advance(&db).await.unwrap();
    assert_eq!(shards(&db, b).await.len(), 1);
    assert_eq!(shards(&db, c).await.len(), 1);
    succeed(&db, shards(&db, b).await[0], json!({})).await;
    succeed(
        &db,
        shards(&db, c).await[0],
        json!({"found": ["y.1"], "load_ms": 1, "phase2_ms": 1}),
    )
    .await;
    coordinator::advance(&db).await.unwrap();

    let a = revdeps::get(&db, a).await.unwrap().unwrap();
    assert_eq!(a.state, RunState::Failed, "{a:?}");
    assert!(
        a.error.as_deref().unwrap_or("").contains("phase 1"),
        "{a:?}"
    );
    let b = revdeps::get(&db, b).await.unwrap().unwrap();
    assert_eq!(b.state, RunState::Failed, "{b:?}");
    assert!(
        b.error.as_deref().unwrap_or("").contains("merging"),
        "{b:?}"
    );
    let c = revdeps::get(&db, c).await.unwrap().unwrap();
    assert_eq!(c.state, RunState::Done, "{c:?}");
    assert_eq!(c.result, Some(vec!["y.1".to_string()]), "{c:?}");
}
