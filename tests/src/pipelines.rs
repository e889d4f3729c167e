//! Pipeline runs made straight through the server's module, for tests and
//! benches that drive the engine pass by pass without agents.

use flotilla_core::api::pipelines::SubmitPipeline;
use flotilla_server::pipelines::{self, ValidPipeline};
use sqlx::PgPool;
use uuid::Uuid;

/// Submits pipeline file `source` as `name` by `submitter`, and ends its
/// listing job as an agent's would have, with `items`: the run's id.
pub async fn listed_run(
    db: &PgPool,
    name: &str,
    source: String,
    submitter: &str,
    items: &[String],
) -> Uuid {
    let valid = ValidPipeline::try_from(SubmitPipeline {
        name: name.to_string(),
        source,
        priority: 0,
    })
    .unwrap_or_else(|_| panic!("pipeline {name} does not check"));
    let run = pipelines::submit(db, valid, submitter, None, None)
        .await
        .expect("submitting")
        .unwrap_or_else(|e| panic!("not submitted: {e:?}"));
    sqlx::query(
        "UPDATE jobs SET state = 'succeeded', finished_at = now(), result = $2
         WHERE id = (SELECT list_job FROM pipeline_runs WHERE id = $1)",
    )
    .bind(run)
    .bind(serde_json::json!({ "items": items }))
    .execute(db)
    .await
    .expect("ending the listing");
    run
}

/// Items `1` to `n`, as `seq 1 n` lists them.
pub fn seq(n: usize) -> Vec<String> {
    (1..=n).map(|i| i.to_string()).collect()
}
