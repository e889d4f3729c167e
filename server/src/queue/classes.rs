//! Job classes: the kind, labels and cost a job needs from an agent, one row
//! per distinct combination, and whether any registered agent could take it.
//!
//! The claim enumerates the takeable classes the claiming agent can take and
//! reads the head of each from `jobs_ready_by_class`, so ready jobs the
//! agent cannot take (other kinds, labels it lacks, a cost above its free
//! slots) cost it nothing, however many there are. The SQL (class creation
//! under a shared advisory lock; a trigger on `agents` that rechecks every
//! class under an exclusive one when an agent joins or changes its offer)
//! is in the migration `20261202021500_job_classes.sql`.

use std::collections::BTreeMap;

use flotilla_core::api::FieldError;
use sqlx::PgPool;

use super::submit::NewJob;

/// The class id of each of `jobs`, in order, making classes that are new.
/// One round trip for any number of jobs.
pub async fn class_ids(
    conn: &mut sqlx::PgConnection,
    jobs: &[NewJob],
) -> Result<Vec<i64>, sqlx::Error> {
    // jobs → distinct (kind, labels, cost); the labels are a BTreeMap, so
    // equal sets compare equal here and in jsonb.
    let mut distinct: BTreeMap<(&str, &BTreeMap<String, String>, u32), usize> = BTreeMap::new();
    let slot: Vec<usize> = jobs
        .iter()
        .map(|j| {
            let n = distinct.len();
            *distinct
                .entry((j.spec.kind().as_str(), &j.labels, j.cost))
                .or_insert(n)
        })
        .collect();
    let mut kinds = vec![""; distinct.len()];
    let mut labels = vec![serde_json::Value::Null; distinct.len()];
    let mut costs = vec![0i32; distinct.len()];
    for ((kind, l, cost), i) in &distinct {
        kinds[*i] = kind;
        labels[*i] = serde_json::to_value(l).expect("labels serialise to JSON");
        costs[*i] = *cost as i32;
    }
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT flotilla_job_class(k, l, c)
         FROM unnest($1::text[], $2::jsonb[], $3::int[]) WITH ORDINALITY AS t(k, l, c, n)
         ORDER BY n",
    )
    .bind(&kinds)
    .bind(&labels)
    .bind(&costs)
    .fetch_all(&mut *conn)
    .await?;
    Ok(slot.into_iter().map(|i| ids[i]).collect())
}

/// Why no registered agent could ever take `job`, naming the field (`kind`,
/// `labels` or `cost`), for a submission to refuse; `None` if one could, or
/// if no agent has registered yet (a new fleet takes work before its
/// agents come; such jobs are flagged in their view instead).
pub async fn refusal(db: &PgPool, job: &NewJob) -> Result<Option<FieldError>, sqlx::Error> {
    let why: Option<Vec<Option<String>>> =
        sqlx::query_scalar("SELECT flotilla_why_unmatchable($1, $2, $3)")
            .bind(job.spec.kind().as_str())
            .bind(serde_json::to_value(&job.labels).expect("labels serialise to JSON"))
            .bind(job.cost as i32)
            .fetch_one(db)
            .await?;
    Ok(match why.as_deref() {
        Some([Some(field), Some(message)]) => Some(FieldError::at(
            field.as_str(),
            format_args!(
                "cannot be met: {message}. Register an agent that can take the job \
                 first, or check `{field}` for a typo"
            ),
        )),
        _ => None,
    })
}
