//! Retention (issue #15, "Bounded tables"): finished jobs past `--retention`
//! leave the tables, archived first to the object store as JSON lines with
//! their attempts, outputs and every log line, secrets redacted; jobs that
//! an open run still reads stay; the counters of `/metrics` do not fall.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use flotilla_core::job::{CommandJob, JobSpec};
use flotilla_e2e::procs::{opts_on_shared, Agent, Server};
use flotilla_e2e::{eventually, scratch};
use flotilla_server::queue::{retention, submit};
use object_store::ObjectStore;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Every record of every archive under `store/archive/jobs`, in file order.
fn archived(store: &Path) -> Vec<Value> {
    let mut files = Vec::new();
    let root = store.join("archive/jobs");
    for day in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(day.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            files.push(f.path());
        }
    }
    files.sort();
    files
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).expect("each line is JSON"))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The sum of the samples in a `/metrics` text whose metric name starts
/// with `prefix` and ends with `suffix` (`_total`, `_count`).
fn counter(metrics: &str, prefix: &str, suffix: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            let name = l.split(['{', ' ']).next().unwrap_or("");
            name.starts_with(prefix) && name.ends_with(suffix)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_jobs_are_archived_then_removed() {
    let dir = scratch("e2e-retention-");
    let mut opts = opts_on_shared(dir.path(), 10_000).await;
    opts.env.push(("FLOTILLA_RETENTION".into(), "3s".into()));
    opts.env
        .push(("FLOTILLA_RETENTION_INTERVAL".into(), "300ms".into()));
    let store = std::path::PathBuf::from(&opts.store);
    let server = Server::start(dir.path(), opts).await;
    let api = server.api();
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&server.opts.database_url)
        .await
        .unwrap();
    let _agent = Agent::start(&server, "keeper", 2, &[]).await;

    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            api.submit(json!({
                "kind": "command",
                "command": format!("for n in 1 2 3; do echo job {i} line $n; done; echo \"$PASSWORD\" | wc -c"),
                "env": {"PASSWORD": "hunter2", "PLAIN": "visible"},
                "secret_env": ["PASSWORD"],
            }))
            .await,
        );
    }
    let failing = api
        .submit(
            json!({"kind": "command", "command": "echo about to fail; exit 3", "max_attempts": 2}),
        )
        .await;
    for id in ids.iter().chain([&failing]) {
        api.wait_final(id, Duration::from_secs(60)).await;
    }
    let metrics_before = api.metrics().await;
    // A job still running: not finished, so it stays whatever its age.
    let waiting = api
        .submit(json!({"kind": "command", "command": "sleep 60"}))
        .await;

    // Gone from the API and from every table once past the retention.
    for id in ids.iter().chain([&failing]) {
        eventually(
            &format!("job {id} to leave the tables"),
            Duration::from_secs(30),
            || async {
                api.raw(reqwest::Method::GET, &format!("/api/v1/jobs/{id}"), None)
                    .await
                    .0
                    == 404
            },
        )
        .await;
    }
    for table in ["job_attempts", "job_logs", "job_outputs"] {
        let left: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {table} WHERE job_id::text = ANY($1)"
        ))
        .bind(ids.iter().chain([&failing]).cloned().collect::<Vec<_>>())
        .fetch_one(&db)
        .await
        .unwrap();
        assert_eq!(left, 0, "rows of archived jobs left in {table}");
    }
    let (status, v) = api
        .raw(
            reqwest::Method::GET,
            &format!("/api/v1/jobs/{waiting}"),
            None,
        )
        .await;
    assert_eq!(status, 200, "an unfinished job stays: {v}");
    assert_ne!(v["state"], "succeeded", "{v}");

    // The archive holds each job once, whole: its row, its attempts and
    // every log line in order, with the secret's value redacted.
    let records = archived(&store);
    let mut jobs: HashMap<String, Value> = HashMap::new();
    let mut logs: HashMap<String, Vec<String>> = HashMap::new();
    for r in &records {
        if let Some(job) = r.get("job") {
            let id = job["id"].as_str().unwrap().to_string();
            assert!(
                jobs.insert(id.clone(), r.clone()).is_none(),
                "job {id} archived twice"
            );
        } else {
            let id = r["logs"]
                .as_str()
                .expect("a job or a logs record")
                .to_string();
            for l in r["lines"].as_array().unwrap() {
                logs.entry(id.clone())
                    .or_default()
                    .push(l["line"].as_str().unwrap().to_string());
            }
        }
    }
    assert_eq!(jobs.len(), 4, "{records:#?}");
    for (i, id) in ids.iter().enumerate() {
        let r = &jobs[id];
        assert_eq!(r["job"]["state"], "succeeded", "{r}");
        assert_eq!(r["attempts"].as_array().unwrap().len(), 1, "{r}");
        assert_eq!(r["attempts"][0]["outcome"], "succeeded", "{r}");
        let env = &r["job"]["spec"]["env"];
        assert_eq!(env["PASSWORD"], flotilla_core::job::REDACTED, "{r}");
        assert_eq!(env["PLAIN"], "visible", "{r}");
        let lines: Vec<String> = logs[id]
            .iter()
            .filter(|l| !l.starts_with("[flotilla]"))
            .cloned()
            .collect();
        assert_eq!(
            lines,
            vec![
                format!("job {i} line 1"),
                format!("job {i} line 2"),
                format!("job {i} line 3"),
                "8".to_string()
            ],
            "job {id}'s archived log"
        );
    }
    let r = &jobs[&failing];
    assert_eq!(r["job"]["state"], "failed", "{r}");
    assert_eq!(r["job"]["exit_code"], 3, "{r}");
    assert_eq!(r["attempts"].as_array().unwrap().len(), 2, "{r}");
    assert!(
        !records.iter().any(|r| r["job"]["id"] == waiting.as_str()),
        "the waiting job was archived"
    );

    // The counters of /metrics count what happened, not what is kept.
    let metrics_after = api.metrics().await;
    for (prefix, suffix) in [
        ("flotilla_job_attempts", "_total"),
        ("flotilla_job_lease_wait", "_count"),
    ] {
        let before = counter(&metrics_before, prefix, suffix);
        let after = counter(&metrics_after, prefix, suffix);
        assert!(before >= 5.0, "{prefix}*{suffix} before: {before}");
        assert!(
            after >= before,
            "{prefix}*{suffix} fell from {before} to {after}"
        );
    }
}

/// `n` command jobs (children of `parent` when given), finished an hour ago.
async fn finished_jobs(db: &PgPool, n: usize, parent: Option<Uuid>) -> Vec<Uuid> {
    let jobs: Vec<submit::NewJob> = (0..n)
        .map(|_| submit::NewJob {
            spec: JobSpec::Command(CommandJob {
                command: "true".into(),
                secret_env: Default::default(),
                env: BTreeMap::new(),
                workdir: None,
                timeout_s: None,
                outputs: vec![],
            }),
            labels: BTreeMap::new(),
            priority: 0,
            max_attempts: 1,
            cost: 1,
            submitter: "retention".into(),
            parent_id: parent,
            child_index: None,
            owner: None,
        })
        .collect();
    let ids = submit::submit(db, &jobs).await.unwrap();
    // Finished as an agent would have left them, an hour back.
    sqlx::query(
        "UPDATE jobs SET state = 'succeeded', exit_code = 0,
                         finished_at = now() - interval '1 hour'
         WHERE id = ANY($1)",
    )
    .bind(&ids)
    .execute(db)
    .await
    .unwrap();
    ids
}

async fn left(db: &PgPool, ids: &[Uuid]) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE id = ANY($1)")
        .bind(ids)
        .fetch_one(db)
        .await
        .unwrap()
}

/// A pass through the queue module itself: batches of [`retention::BATCH`],
/// a job of an open pipeline run kept until the run ends, jobs finished
/// more recently than the retention kept, and a second server's pass
/// skipped while one holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_archives_in_batches_and_keeps_what_open_runs_read() {
    let db = flotilla_e2e::pg::migrated_database().await;
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let never = CancellationToken::new();
    let run = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO pipeline_runs (id, name, source, spec, list_job, submitter, state)
         VALUES ($1, 'open', '', '{}', $2, 'retention', 'running')",
    )
    .bind(run)
    .bind(Uuid::now_v7())
    .execute(&db)
    .await
    .unwrap();
    let of_run = finished_jobs(&db, 3, Some(run)).await;
    let old = finished_jobs(&db, retention::BATCH as usize + 200, None).await;

    // Another server's pass holds the lock: this one does nothing.
    let mut other = db.begin().await.unwrap();
    let _: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(0x666c_6f74_7265_7465_i64)
        .fetch_one(&mut *other)
        .await
        .unwrap();
    let report = retention::pass(&db, store.as_ref(), Duration::from_secs(60), &never)
        .await
        .unwrap();
    assert!(report.skipped && report.jobs == 0, "{report:?}");
    other.rollback().await.unwrap();

    // Finished two hours past a retention of three: kept.
    let report = retention::pass(&db, store.as_ref(), Duration::from_secs(3 * 3600), &never)
        .await
        .unwrap();
    assert_eq!(report.jobs, 0, "{report:?}");

    let report = retention::pass(&db, store.as_ref(), Duration::from_secs(60), &never)
        .await
        .unwrap();
    assert_eq!(report.jobs, old.len() as u64, "{report:?}");
    assert_eq!(report.archives.len(), 2, "two batches: {report:?}");
    assert_eq!(left(&db, &old).await, 0);
    assert_eq!(left(&db, &of_run).await, 3, "an open run's jobs stay");
    let mut archived_ids = Vec::new();
    for key in &report.archives {
        let bytes = store
            .get(&object_store::path::Path::from(key.as_str()))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        for line in std::str::from_utf8(&bytes).unwrap().lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            archived_ids.push(v["job"]["id"].as_str().unwrap().parse::<Uuid>().unwrap());
        }
    }
    archived_ids.sort();
    let mut want = old.clone();
    want.sort();
    assert_eq!(archived_ids, want, "each removed job archived once");

    // The run ends: its jobs go at the next pass.
    sqlx::query("UPDATE pipeline_runs SET state = 'done', finished_at = now() WHERE id = $1")
        .bind(run)
        .execute(&db)
        .await
        .unwrap();
    let report = retention::pass(&db, store.as_ref(), Duration::from_secs(60), &never)
        .await
        .unwrap();
    assert_eq!(report.jobs, 3, "{report:?}");
    assert_eq!(left(&db, &of_run).await, 0);
}
