//! The claim's policy, against real PostgreSQL through the queue module
//! (no HTTP): priority, fair share between submitters, labels, capacity
//! and cost, kinds, back-off, and the reaper's stale-lease guard.

use std::collections::BTreeMap;
use std::time::Duration;

use flotilla_core::health::HostHealth;
use flotilla_core::job::{CommandJob, FailureClass, JobKind, JobSpec, JobState};
use flotilla_core::protocol::{Complete, Register};
use flotilla_server::queue::{claim, lease, reaper, submit};
use flotilla_server::{agents, serve};
use sqlx::PgPool;
use uuid::Uuid;

async fn fresh_db() -> PgPool {
    let pg = flotilla_e2e::pg::shared().await;
    let name = flotilla_e2e::pg::fresh_database(pg).await;
    let db = serve::connect(pg.connect_options(&name), Duration::from_secs(10))
        .await
        .unwrap();
    serve::migrate(&db).await.unwrap();
    db
}

fn job(submitter: &str, priority: i32, labels: &[(&str, &str)], cost: u32) -> submit::NewJob {
    submit::NewJob {
        spec: JobSpec::Command(CommandJob {
            command: "true".into(),
            env: BTreeMap::new(),
            workdir: None,
            timeout_s: None,
            outputs: vec![],
        }),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        priority,
        max_attempts: 2,
        cost,
        submitter: submitter.into(),
        parent_id: None,
        child_index: None,
    }
}

async fn agent(db: &PgPool, name: &str, capacity: u32, labels: &[(&str, &str)]) -> Uuid {
    agents::register(
        db,
        &Register {
            name: name.into(),
            instance: Uuid::new_v4(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            capacity,
            kinds: vec![JobKind::Command],
            version: "t".into(),
            health: HostHealth::default(),
            devices: Default::default(),
        },
    )
    .await
    .unwrap()
    .0
}

const TTL: Duration = Duration::from_secs(60);

/// A plain success report for the lease `token`.
fn done(token: Uuid) -> Complete {
    Complete {
        lease_token: token,
        exit_code: Some(0),
        outputs: vec![],
        result: None,
    }
}

async fn submitter_of(db: &PgPool, id: Uuid) -> String {
    sqlx::query_scalar("SELECT submitter FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_one(db)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_small_submitter_is_not_starved_by_a_big_one() {
    let db = fresh_db().await;
    let big: Vec<_> = (0..10_000).map(|_| job("big", 0, &[], 1)).collect();
    submit::submit(&db, &big).await.unwrap();
    let small: Vec<_> = (0..10).map(|_| job("small", 0, &[], 1)).collect();
    submit::submit(&db, &small).await.unwrap();
    let a = agent(&db, "worker", 1000, &[]).await;
    let mut small_done = 0;
    for n in 0..20 {
        let j = claim::claim(&db, a, TTL)
            .await
            .unwrap()
            .expect("work available");
        if submitter_of(&db, j.job_id).await == "small" {
            small_done += 1;
        }
        let _ = n;
    }
    assert_eq!(
        small_done, 10,
        "all of the small submitter's jobs ran within 20 claims"
    );
}

#[tokio::test]
async fn priority_first_then_labels_then_cost() {
    let db = fresh_db().await;
    let low = submit::submit(&db, &[job("s", 0, &[], 1)]).await.unwrap()[0];
    let high = submit::submit(&db, &[job("s", 10, &[], 1)]).await.unwrap()[0];
    let gpu = submit::submit(&db, &[job("s", 100, &[("gpu", "h100")], 1)])
        .await
        .unwrap()[0];
    let heavy = submit::submit(&db, &[job("s", 50, &[], 4)]).await.unwrap()[0];

    let cpu_agent = agent(&db, "cpu", 2, &[("os", "linux")]).await;
    // The gpu job needs a label cpu lacks; the heavy one does not fit in 2
    // slots; so priority order gives `high`, then `low`.
    assert_eq!(
        claim::claim(&db, cpu_agent, TTL)
            .await
            .unwrap()
            .unwrap()
            .job_id,
        high
    );
    assert_eq!(
        claim::claim(&db, cpu_agent, TTL)
            .await
            .unwrap()
            .unwrap()
            .job_id,
        low
    );
    assert!(
        claim::claim(&db, cpu_agent, TTL).await.unwrap().is_none(),
        "capacity 2 is full"
    );

    let gpu_agent = agent(&db, "gpu", 8, &[("gpu", "h100"), ("os", "linux")]).await;
    assert_eq!(
        claim::claim(&db, gpu_agent, TTL)
            .await
            .unwrap()
            .unwrap()
            .job_id,
        gpu
    );
    let j = claim::claim(&db, gpu_agent, TTL).await.unwrap().unwrap();
    assert_eq!((j.job_id, j.cost), (heavy, 4));
}

#[tokio::test]
async fn failed_attempts_back_off_and_stale_leases_are_refused() {
    let db = fresh_db().await;
    let id = submit::submit(&db, &[job("s", 0, &[], 1)]).await.unwrap()[0];
    let a = agent(&db, "a", 1, &[]).await;
    let first = claim::claim(&db, a, TTL).await.unwrap().unwrap();
    let key = |token| lease::LeaseKey {
        agent: a,
        job: id,
        token,
    };
    let ended = lease::fail(
        &db,
        key(first.lease_token),
        lease::Failure {
            class: FailureClass::Retryable,
            message: "exit 1",
            exit_code: Some(1),
        },
        (Duration::from_secs(3600), Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    assert_eq!(ended.state, JobState::Retrying);
    assert!(
        claim::claim(&db, a, TTL).await.unwrap().is_none(),
        "the back-off holds the job back"
    );
    sqlx::query("UPDATE jobs SET run_after = now() WHERE id = $1")
        .bind(id)
        .execute(&db)
        .await
        .unwrap();
    let second = claim::claim(&db, a, Duration::from_millis(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.attempt, 2);
    // The first attempt's lease can no longer complete the job.
    let err = lease::complete(&db, key(first.lease_token), &done(first.lease_token))
        .await
        .unwrap_err();
    assert!(matches!(err, lease::LeaseRefused::Stale { .. }), "{err}");
    // The second lease expires; it was the last attempt, so the job fails.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let reaped = reaper::reap_once(&db, (Duration::from_millis(1), Duration::from_millis(1)))
        .await
        .unwrap();
    assert_eq!(reaped, vec![(id, "failed".to_string())]);
    let err = lease::complete(&db, key(second.lease_token), &done(second.lease_token))
        .await
        .unwrap_err();
    assert!(matches!(err, lease::LeaseRefused::Stale { .. }), "{err}");
    let outcomes: Vec<String> =
        sqlx::query_scalar("SELECT outcome FROM job_attempts WHERE job_id = $1 ORDER BY attempt")
            .bind(id)
            .fetch_all(&db)
            .await
            .unwrap();
    assert_eq!(outcomes, ["failed", "lease_expired"]);
}

#[tokio::test]
async fn agents_only_get_kinds_they_run() {
    let db = fresh_db().await;
    submit::submit(&db, &[job("s", 0, &[], 1)]).await.unwrap();
    let a = agents::register(
        &db,
        &Register {
            name: "tiles-only".into(),
            instance: Uuid::new_v4(),
            labels: BTreeMap::new(),
            capacity: 4,
            kinds: vec![JobKind::Tile],
            version: "t".into(),
            health: HostHealth::default(),
            devices: Default::default(),
        },
    )
    .await
    .unwrap()
    .0;
    assert!(claim::claim(&db, a, TTL).await.unwrap().is_none());
}
