//! Resuming a pipeline file that ran before: once its items are listed,
//! one probe job per host asks which of the outputs the items would make
//! there exist already; each item then starts after the furthest of its
//! steps whose output exists, so no finished work is done again.
//!
//! Hosts of several agents (`agent labels …`) are not probed: which of
//! them holds an item's output is not known before it ran. An item
//! resumed inside a `limit` block takes its place there (its data is on
//! that host already), so the block counts it and lets no new item in
//! until it is under its N again.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use flotilla_core::job::{StepAction, StepJob, StepProbe};
use flotilla_core::pipeline::plan::{NodeStep, Plan};
use flotilla_core::pipeline::spec::HostTarget;
use flotilla_core::pipeline::template::Template;
use sqlx::PgConnection;
use uuid::Uuid;

use super::engine::{fail_run, kept_gates};
use super::jobs::{queued, ItemPlace, RunJobs};
use super::{placement, Location};
use crate::queue::submit::submit_in;

/// Attempts of a probe job.
const PROBE_ATTEMPTS: u32 = 3;

/// Where each step of `plan` would put `item`'s output, in file order
/// (`None` for a stage without `out`, or a path that names an output the
/// walk does not know), with the place (latest and stage outputs) the item
/// would have after each.
fn walk(plan: &Plan, item: &str) -> Vec<Option<(Location, ItemPlace)>> {
    let mut place = ItemPlace {
        item: item.to_string(),
        latest: None,
        outputs: BTreeMap::new(),
    };
    let expand = |t: &Template, place: &ItemPlace| {
        t.expand(
            |f| match f {
                flotilla_core::pipeline::template::Field::Id => Some(place.item.clone()),
                flotilla_core::pipeline::template::Field::In => {
                    place.latest.as_ref().map(|l| l.path.clone())
                }
                flotilla_core::pipeline::template::Field::StageOut(s) => {
                    place.outputs.get(s).map(|l| l.path.clone())
                }
                flotilla_core::pipeline::template::Field::Out => None,
            },
            false,
        )
        .ok()
    };
    plan.nodes
        .iter()
        .map(|node| {
            let path = match &node.step {
                NodeStep::Stage(s) => s.out.as_ref().and_then(|t| expand(t, &place)).map(|p| {
                    if p.len() > 1 {
                        p.trim_end_matches('/').to_string()
                    } else {
                        p
                    }
                }),
                NodeStep::Move(m) => expand(&m.path, &place),
            }?;
            let loc = Location {
                host: node.host.clone(),
                agent: None,
                path,
            };
            if matches!(node.step, NodeStep::Stage(_)) {
                place.outputs.insert(node.name.clone(), loc.clone());
            }
            place.latest = Some(loc.clone());
            Some((loc, place.clone()))
        })
        .collect()
}

/// Whether the outputs on `host` can be looked for: one agent or an ssh
/// host, not a set of agents.
fn probed(jobs: &RunJobs<'_>, host: &str) -> bool {
    !matches!(
        jobs.spec.hosts.get(host).map(|h| &h.target),
        Some(HostTarget::Labels { .. }) | None
    )
}

/// After the listing: queues one probe job per host that outputs would be
/// on and sets the run `probing` (`false`), or, with nothing to look for,
/// sets it `running` (`true`).
pub async fn look(
    tx: &mut PgConnection,
    jobs: &RunJobs<'_>,
    plan: &Plan,
    items: &[String],
) -> anyhow::Result<bool> {
    let mut by_host: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for item in items {
        for (loc, _) in walk(plan, item).into_iter().flatten() {
            if probed(jobs, &loc.host) {
                by_host.entry(loc.host).or_default().push(loc.path);
            }
        }
    }
    if by_host.is_empty() {
        sqlx::query("UPDATE pipeline_runs SET state = 'running' WHERE id = $1")
            .bind(jobs.id)
            .execute(&mut *tx)
            .await?;
        return Ok(true);
    }
    let new: Vec<_> = by_host
        .into_iter()
        .map(|(host, paths)| {
            let (step_host, labels) = placement(jobs.spec, &host, None);
            queued(
                jobs.priority,
                jobs.submitter,
                jobs.owner,
                StepJob {
                    run_id: jobs.id,
                    item: String::new(),
                    step: format!("resume on {host}"),
                    host: step_host,
                    action: StepAction::Probe { paths },
                    timeout_s: None,
                },
                labels,
                PROBE_ATTEMPTS,
            )
        })
        .collect();
    let ids = submit_in(&mut *tx, &new).await?;
    sqlx::query("UPDATE pipeline_runs SET state = 'probing', probe_jobs = $2 WHERE id = $1")
        .bind(jobs.id)
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    Ok(false)
}

/// Once every probe job ended: each item placed after its furthest step
/// whose output exists, and the run `running` (`true`). `false` while a
/// probe runs, or when one failed (the run fails: starting over could
/// repeat finished work).
pub async fn resume(
    tx: &mut PgConnection,
    jobs: &RunJobs<'_>,
    plan: &Plan,
    probe_jobs: &[Uuid],
) -> anyhow::Result<bool> {
    let rows: Vec<(
        serde_json::Value,
        String,
        Option<serde_json::Value>,
        Option<String>,
    )> = sqlx::query_as("SELECT spec, state, result, error FROM jobs WHERE id = ANY ($1)")
        .bind(probe_jobs)
        .fetch_all(&mut *tx)
        .await?;
    let mut exist: HashMap<String, BTreeSet<String>> = HashMap::new();
    for (spec, state, result, error) in rows {
        let step = spec["step"].as_str().unwrap_or("resume").to_string();
        match state.as_str() {
            "succeeded" => {
                let found: StepProbe = serde_json::from_value(result.unwrap_or_default())
                    .map_err(|e| anyhow::anyhow!("{step}: the probe's result: {e}"))?;
                let host = step.strip_prefix("resume on ").unwrap_or(&step).to_string();
                exist.entry(host).or_default().extend(found.exist);
            }
            "failed" | "cancelled" => {
                let why = format!(
                    "looking for outputs a run of this file left ({step}) {state}: {}",
                    error.unwrap_or_default()
                );
                fail_run(tx, jobs.id, &why).await?;
                return Ok(false);
            }
            _ => return Ok(false),
        }
    }
    let items: Vec<(i32, String)> =
        // Waiting ones only: an item cancelled while the probes ran stays
        // cancelled, and takes no gate it could never leave.
        sqlx::query_as(
            "SELECT idx, item FROM pipeline_items WHERE run_id = $1 AND state = 'waiting'
             ORDER BY idx",
        )
            .bind(jobs.id)
            .fetch_all(&mut *tx)
            .await?;
    let mut resumed = 0usize;
    for (idx, item) in items {
        let furthest = walk(plan, &item)
            .into_iter()
            .enumerate()
            .filter_map(|(k, w)| w.map(|w| (k, w)))
            .rfind(|(_, (loc, _))| {
                exist
                    .get(&loc.host)
                    .is_some_and(|paths| paths.contains(&loc.path))
            });
        let Some((k, (loc, place))) = furthest else {
            continue;
        };
        resumed += 1;
        sqlx::query(
            "UPDATE pipeline_items SET at = $3, latest = $4, outputs = $5
             WHERE run_id = $1 AND idx = $2",
        )
        .bind(jobs.id)
        .bind(idx)
        .bind(k as i32)
        .bind(serde_json::to_value(&loc)?)
        .bind(serde_json::to_value(&place.outputs)?)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO pipeline_steps (run_id, idx, node, state, output, finished_at)
             VALUES ($1, $2, $3, 'succeeded', $4, now())",
        )
        .bind(jobs.id)
        .bind(idx)
        .bind(k as i32)
        .bind(serde_json::to_value(&loc)?)
        .execute(&mut *tx)
        .await?;
        let gates: Vec<i32> = kept_gates(plan, k).into_iter().map(|g| g as i32).collect();
        sqlx::query(
            "INSERT INTO pipeline_gates (run_id, gate, idx) SELECT $1, g, $2 FROM unnest($3::int[]) g",
        )
        .bind(jobs.id)
        .bind(idx)
        .bind(&gates)
        .execute(&mut *tx)
        .await?;
    }
    tracing::info!(run = %jobs.id, resumed, "pipeline run resumes items after their existing outputs");
    sqlx::query("UPDATE pipeline_runs SET state = 'running' WHERE id = $1")
        .bind(jobs.id)
        .execute(&mut *tx)
        .await?;
    Ok(true)
}
