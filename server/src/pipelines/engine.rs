//! What happens when a pipeline run's jobs end. One pass per open run, in a
//! transaction that holds the run's row (`FOR UPDATE SKIP LOCKED`: another
//! server already advancing it makes this one move on, and a run woken here
//! that it moved on from is returned, to be looked at again), so any number
//! of servers may run [`advance`] at once and each change happens once:
//!
//! 1. a listing that ended becomes the run's items (or fails the run),
//!    and outputs a run of the same file left are looked for
//!    ([`resume`]): each item starts after the furthest that exists;
//! 2. an item whose job ended moves to its step's next job (a move's
//!    receive after its send, …), or finishes the step and waits for room
//!    in what follows, or fails;
//! 3. waiting items, in list order, enter the next step where it has room:
//!    the stage's `jobs`, every `limit` gate around it (counted from
//!    `pipeline_gates` under the same lock, so never above N), and for an
//!    `either` the first branch with room; a pass reads them a page at a
//!    time per entry point, and no further once one found no room, so its
//!    cost follows the room, not the run's length ([`Reading`]);
//! 4. a run whose items all ended is done (or failed, naming how many).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};

use flotilla_core::job::{StepItems, StepJob};
use flotilla_core::pipeline::items::check_ids;
use flotilla_core::pipeline::plan::{Entry, NodeStep, Plan};
use flotilla_core::pipeline::PipelineSpec;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::jobs::{phases, ItemPlace, RunJobs};
use super::resume;
use super::Location;
use crate::coordinator::Parents;
use crate::queue::submit::submit_in;

/// How many waiting items of one entry point a pass reads at a time. A
/// pass queues a few jobs (about 5 in the overhead bench); reading every
/// waiting item to find them cost 136 ms a pass at 50,000 items.
pub const WAITING_PAGE: i64 = 64;

/// One pass over the open runs of `parents`. A run that cannot be
/// advanced for a reason other than the database fails with the reason,
/// never blocking the others. Returns the runs the database kept from
/// advancing, to be looked at again.
pub async fn advance(db: &PgPool, parents: &Parents) -> anyhow::Result<Vec<Uuid>> {
    advance_reading(db, parents, Reading::Paged(WAITING_PAGE)).await
}

/// [`advance`], reading waiting items as `reading` says.
pub async fn advance_reading(
    db: &PgPool,
    parents: &Parents,
    reading: Reading,
) -> anyhow::Result<Vec<Uuid>> {
    let these = match parents {
        Parents::All => None,
        Parents::These(ids) if ids.is_empty() => return Ok(Vec::new()),
        Parents::These(ids) => Some(ids),
    };
    let runs: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM pipeline_runs
         WHERE state IN ('listing', 'probing', 'running') AND ($1::uuid[] IS NULL OR id = ANY ($1))
         ORDER BY created_at",
    )
    .bind(these)
    .fetch_all(db)
    .await?;
    let mut again = Vec::new();
    for run in runs {
        match advance_run(db, run, reading).await {
            Ok(true) => {}
            // Another server's pass holds it, and may have read its jobs
            // before the one that woke it here ended: looked at again.
            Ok(false) => {
                if these.is_some() {
                    again.push(run);
                }
            }
            Err(e) if e.downcast_ref::<sqlx::Error>().is_some() => {
                tracing::warn!(%run, error = %e, "advancing a pipeline run: will retry");
                again.push(run);
            }
            Err(e) => {
                tracing::warn!(%run, error = %e, "advancing a pipeline run: the run fails");
                let why = format!("{e:#}");
                if let Err(e) = super::close(db, run, super::Closing::Failed(&why)).await {
                    tracing::warn!(%run, error = %e, "failing a pipeline run: will retry");
                    again.push(run);
                }
            }
        }
    }
    Ok(again)
}

#[derive(sqlx::FromRow)]
struct RunRow {
    state: String,
    spec: serde_json::Value,
    list_job: Uuid,
    probe_jobs: Vec<Uuid>,
    priority: i32,
    submitter: String,
    owner_token: Option<Uuid>,
}

/// Advances run `run` in one transaction holding its row: `false` when
/// another server's pass holds it (this one does not wait behind it: a
/// server stopped mid-pass would hold every other's loop up).
async fn advance_run(db: &PgPool, run: Uuid, reading: Reading) -> anyhow::Result<bool> {
    let mut tx = db.begin().await?;
    let row: Option<RunRow> = sqlx::query_as(
        "SELECT state, spec, list_job, probe_jobs, priority, submitter, owner_token
         FROM pipeline_runs
         WHERE id = $1 AND state IN ('listing', 'probing', 'running') FOR UPDATE SKIP LOCKED",
    )
    .bind(run)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        // Held by another pass, or no longer open (ended meanwhile).
        let open: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pipeline_runs
                            WHERE id = $1 AND state IN ('listing', 'probing', 'running'))",
        )
        .bind(run)
        .fetch_one(&mut *tx)
        .await?;
        return Ok(!open);
    };
    let spec: PipelineSpec = serde_json::from_value(row.spec)
        .map_err(|e| anyhow::anyhow!("the stored pipeline does not parse: {e}"))?;
    let jobs = RunJobs {
        id: run,
        spec: &spec,
        priority: row.priority,
        submitter: &row.submitter,
        owner: row.owner_token,
    };
    let plan = Plan::new(&spec);
    let mut listed = 0;
    let running = match row.state.as_str() {
        "listing" => match list(&mut tx, run, row.list_job).await? {
            Some(items) => {
                record_items(&mut tx, run, &items).await?;
                listed = items.len();
                resume::look(&mut tx, &jobs, &plan, &items).await?
            }
            None => false,
        },
        "probing" => resume::resume(&mut tx, &jobs, &plan, &row.probe_jobs).await?,
        _ => true,
    };
    if running {
        ended(&mut tx, &jobs, &plan).await?;
        enter(&mut tx, &jobs, &plan, reading).await?;
        finish(&mut tx, run).await?;
    }
    tx.commit().await?;
    if listed >= ANALYZE_ITEMS {
        analyse_items(db);
    }
    Ok(true)
}

/// Whether this process is analysing `pipeline_items` now.
static ANALYSING: AtomicBool = AtomicBool::new(false);

/// Brings the items' statistics up to date after a long listing. Until
/// autovacuum sees the new rows (a minute or so), the planner takes the
/// run's items for a few and every pass scanned them all (51 ms a pass at
/// 50,000 items against 12 ms analysed). Not in the run's transaction (it
/// analyses the whole table, and would hold its lock with the run's), nor
/// in the coordinator's loop; one at a time in a process (one more while
/// one runs would wait for its lock, holding a connection, to read what
/// that one reads).
fn analyse_items(db: &PgPool) {
    if ANALYSING.swap(true, Ordering::AcqRel) {
        return;
    }
    let db = db.clone();
    tokio::spawn(async move {
        if let Err(e) = sqlx::query("ANALYZE pipeline_items").execute(&db).await {
            tracing::warn!(error = %e, "analysing pipeline_items after a long listing");
        }
        ANALYSING.store(false, Ordering::Release);
    });
}

/// A listing that ended well: its items; `None` while it has not ended,
/// or when it failed (and the run with it).
async fn list(
    tx: &mut PgConnection,
    run: Uuid,
    list_job: Uuid,
) -> anyhow::Result<Option<Vec<String>>> {
    let (state, result, error): (String, Option<serde_json::Value>, Option<String>) =
        sqlx::query_as("SELECT state, result, error FROM jobs WHERE id = $1")
            .bind(list_job)
            .fetch_one(&mut *tx)
            .await?;
    let why = match state.as_str() {
        "succeeded" => match result.map(serde_json::from_value::<StepItems>) {
            Some(Ok(items)) => {
                // Checked again here, not only by the agent that listed
                // them: an id goes into paths on every host of the run.
                let mut seen = BTreeSet::new();
                match check_ids(&items.items) {
                    Err(why) => why,
                    Ok(()) => match items.items.iter().find(|i| !seen.insert(i.as_str())) {
                        Some(dup) => format!("the items command listed `{dup}` twice"),
                        None => return Ok(Some(items.items)),
                    },
                }
            }
            _ => "the items command's job returned no item list".to_string(),
        },
        "failed" | "cancelled" => format!(
            "listing the items {state}: {}",
            error.unwrap_or_else(|| "no reason given".into())
        ),
        _ => return Ok(None),
    };
    fail_run(tx, run, &why).await?;
    Ok(None)
}

/// Ends run `run` failed with `why`.
pub(super) async fn fail_run(tx: &mut PgConnection, run: Uuid, why: &str) -> sqlx::Result<()> {
    // With its items, gates and open jobs (a failed probe's siblings, say),
    // not the run's row alone.
    super::end_run(tx, run, "failed", why).await.map(|_| ())
}

/// A listing of this many items or more has the items' statistics
/// brought up to date once it is recorded.
const ANALYZE_ITEMS: usize = 5_000;

async fn record_items(tx: &mut PgConnection, run: Uuid, items: &[String]) -> sqlx::Result<()> {
    let idx: Vec<i32> = (0..items.len() as i32).collect();
    sqlx::query(
        "INSERT INTO pipeline_items (run_id, idx, item)
         SELECT $1, * FROM unnest($2::int[], $3::text[])",
    )
    .bind(run)
    .bind(&idx)
    .bind(items)
    .execute(&mut *tx)
    .await?;
    sqlx::query("UPDATE pipeline_runs SET items = $2 WHERE id = $1")
        .bind(run)
        .bind(items.len() as i32)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

#[derive(sqlx::FromRow)]
struct EndedRow {
    idx: i32,
    item: String,
    node: i32,
    phase: i16,
    job_id: Uuid,
    latest: Option<serde_json::Value>,
    outputs: serde_json::Value,
    job_state: String,
    job_error: Option<String>,
    agent: Option<String>,
    step_output: Option<serde_json::Value>,
}

fn place(
    item: String,
    latest: Option<serde_json::Value>,
    outputs: serde_json::Value,
) -> anyhow::Result<ItemPlace> {
    Ok(ItemPlace {
        item,
        latest: latest.map(serde_json::from_value).transpose()?,
        outputs: serde_json::from_value(outputs)?,
    })
}

/// Items whose job ended: on to the step's next job, out of the step, or
/// failed.
async fn ended(tx: &mut PgConnection, jobs: &RunJobs<'_>, plan: &Plan) -> anyhow::Result<()> {
    let rows: Vec<EndedRow> = sqlx::query_as(
        "SELECT i.idx, i.item, i.node, i.phase, i.job_id, i.latest, i.outputs,
                j.state AS job_state, j.error AS job_error, a.name AS agent, s.output AS step_output
         FROM pipeline_items i
         JOIN jobs j ON j.id = i.job_id
         LEFT JOIN agents a ON a.id = j.agent_id
         LEFT JOIN pipeline_steps s ON s.run_id = i.run_id AND s.idx = i.idx AND s.node = i.node
         WHERE i.run_id = $1 AND i.state = 'active'
           AND j.state IN ('succeeded', 'failed', 'cancelled')
         ORDER BY i.idx",
    )
    .bind(jobs.id)
    .fetch_all(&mut *tx)
    .await?;
    for r in rows {
        let Some(node) = plan.nodes.get(r.node as usize) else {
            anyhow::bail!(
                "item {} is at step {}, which the pipeline does not have",
                r.item,
                r.node
            );
        };
        if r.job_state != "succeeded" {
            let why = format!(
                "{} {}: {}",
                node.name,
                r.job_state,
                r.job_error.unwrap_or_default()
            );
            let item_state = if r.job_state == "cancelled" {
                "cancelled"
            } else {
                "failed"
            };
            sqlx::query(
                "UPDATE pipeline_items SET state = $3, error = $4, job_id = NULL
                 WHERE run_id = $1 AND idx = $2",
            )
            .bind(jobs.id)
            .bind(r.idx)
            .bind(item_state)
            .bind(why)
            .execute(&mut *tx)
            .await?;
            set_step(tx, jobs.id, r.idx, r.node, item_state, None).await?;
            sqlx::query("DELETE FROM pipeline_gates WHERE run_id = $1 AND idx = $2")
                .bind(jobs.id)
                .bind(r.idx)
                .execute(&mut *tx)
                .await?;
            continue;
        }
        let (idx, node_index) = (r.idx, r.node);
        match advance_item(tx, jobs, plan, node, r).await {
            Ok(()) => {}
            Err(e) if e.downcast_ref::<sqlx::Error>().is_some() => return Err(e),
            // Something of this item only (a send that stored no tar, a
            // path with no value): it fails, the others go on.
            Err(e) => fail_item(tx, jobs.id, idx, node_index, &format!("{e:#}")).await?,
        }
    }
    Ok(())
}

/// Item `r`'s job succeeded: on to its step's next job (a move's receive
/// after its send, …), or out of the step to wait for room in the next.
async fn advance_item(
    tx: &mut PgConnection,
    jobs: &RunJobs<'_>,
    plan: &Plan,
    node: &flotilla_core::pipeline::plan::Node,
    r: EndedRow,
) -> anyhow::Result<()> {
    let mut place = place(r.item, r.latest, r.outputs)?;
    let on_a_set = |host: &str| super::host_is_a_set(jobs.spec, host);
    let next_phase = r.phase + 1;
    if next_phase < phases(node) {
        // A move: send → receive (with what was sent) → remove.
        let sent = if r.phase == 0 {
            let row: Option<(i64, String)> = sqlx::query_as(
                "SELECT o.size, o.sha256 FROM job_outputs o JOIN jobs j ON j.id = o.job_id
                 WHERE o.job_id = $1 AND o.attempt = j.attempt AND o.name = $2",
            )
            .bind(r.job_id)
            .bind(StepJob::SENT_OUTPUT)
            .fetch_optional(&mut *tx)
            .await?;
            let (size, sha) = row.ok_or_else(|| {
                anyhow::anyhow!(
                    "move {} of item {}: the send stored no tar",
                    node.name,
                    place.item
                )
            })?;
            Some((size as u64, sha))
        } else {
            None
        };
        let work = jobs.step(&place, node, next_phase, sent)?;
        if r.phase == 1 {
            // It arrived: where, on which agent of a set.
            let mut dest = work.output.clone().expect("a move has a destination");
            if on_a_set(&dest.host) {
                dest.agent = r.agent.clone();
            }
            sqlx::query(
                "UPDATE pipeline_steps SET output = $4 WHERE run_id = $1 AND idx = $2 AND node = $3",
            )
            .bind(jobs.id)
            .bind(r.idx)
            .bind(r.node)
            .bind(serde_json::to_value(&dest)?)
            .execute(&mut *tx)
            .await?;
        }
        let id = submit_in(&mut *tx, &[work.job]).await?[0];
        sqlx::query(
            "UPDATE pipeline_items SET phase = $3, job_id = $4 WHERE run_id = $1 AND idx = $2",
        )
        .bind(jobs.id)
        .bind(r.idx)
        .bind(next_phase)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE pipeline_steps SET job_id = $4 WHERE run_id = $1 AND idx = $2 AND node = $3",
        )
        .bind(jobs.id)
        .bind(r.idx)
        .bind(r.node)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        return Ok(());
    }
    // The step is done: its output becomes the item's latest.
    let output: Option<Location> = match &node.step {
        NodeStep::Stage(_) => jobs.step(&place, node, 0, None)?.output.map(|mut o| {
            if on_a_set(&o.host) {
                o.agent = r.agent.clone();
            }
            o
        }),
        NodeStep::Move(_) => r.step_output.map(serde_json::from_value).transpose()?,
    };
    if let Some(o) = &output {
        if matches!(node.step, NodeStep::Stage(_)) {
            place.outputs.insert(node.name.clone(), o.clone());
        }
        place.latest = Some(o.clone());
    }
    set_step(tx, jobs.id, r.idx, r.node, "succeeded", output.as_ref()).await?;
    // Gates that no step after this one is inside are left now, not
    // when the item enters the next step (it may wait for room there).
    let keep: Vec<i32> = kept_gates(plan, node.index)
        .into_iter()
        .map(|g| g as i32)
        .collect();
    sqlx::query("DELETE FROM pipeline_gates WHERE run_id = $1 AND idx = $2 AND gate <> ALL ($3)")
        .bind(jobs.id)
        .bind(r.idx)
        .bind(&keep)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "UPDATE pipeline_items SET state = 'waiting', at = node, node = NULL, phase = 0,
             job_id = NULL, latest = $3, outputs = $4
         WHERE run_id = $1 AND idx = $2",
    )
    .bind(jobs.id)
    .bind(r.idx)
    .bind(
        place
            .latest
            .as_ref()
            .map(serde_json::to_value)
            .transpose()?,
    )
    .bind(serde_json::to_value(&place.outputs)?)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Fails item `idx` at node `node` with `why`: its cell and the item
/// failed, its gates left.
async fn fail_item(
    tx: &mut PgConnection,
    run: Uuid,
    idx: i32,
    node: i32,
    why: &str,
) -> anyhow::Result<()> {
    tracing::warn!(%run, idx, why, "a pipeline item fails");
    sqlx::query(
        "UPDATE pipeline_items SET state = 'failed', error = $3, job_id = NULL
         WHERE run_id = $1 AND idx = $2",
    )
    .bind(run)
    .bind(idx)
    .bind(why)
    .execute(&mut *tx)
    .await?;
    set_step(tx, run, idx, node, "failed", None).await?;
    sqlx::query("DELETE FROM pipeline_gates WHERE run_id = $1 AND idx = $2")
        .bind(run)
        .bind(idx)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The gates an item that finished `node` stays inside: those of every
/// step it may enter next (none when it is done).
pub(super) fn kept_gates(plan: &Plan, node: usize) -> BTreeSet<usize> {
    plan.candidates(&plan.next[node])
        .into_iter()
        .map(|c| plan.nodes[c].gates.iter().copied().collect::<BTreeSet<_>>())
        .reduce(|a, b| a.intersection(&b).copied().collect())
        .unwrap_or_default()
}

async fn set_step(
    tx: &mut PgConnection,
    run: Uuid,
    idx: i32,
    node: i32,
    state: &str,
    output: Option<&Location>,
) -> anyhow::Result<()> {
    sqlx::query(
        "UPDATE pipeline_steps SET state = $4, finished_at = now(), output = COALESCE($5, output)
         WHERE run_id = $1 AND idx = $2 AND node = $3",
    )
    .bind(run)
    .bind(idx)
    .bind(node)
    .bind(state)
    .bind(output.map(serde_json::to_value).transpose()?)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

#[derive(sqlx::FromRow)]
struct WaitingRow {
    idx: i32,
    item: String,
    at: Option<i32>,
    latest: Option<serde_json::Value>,
    outputs: serde_json::Value,
    gates: Vec<i32>,
}

/// Room at each node and gate, as counted at the start of the pass and
/// updated as items enter.
struct Room<'p> {
    plan: &'p Plan,
    /// Items in each node's job now.
    at_node: Vec<u32>,
    /// Items that finished each node and wait for the next.
    waiting_at: Vec<u32>,
    in_gate: Vec<u32>,
}

/// A branch's lead: the nodes from its entry `i` up to and including its
/// first stage (moves before it carry the item there), and that stage's
/// `jobs`; `None` when no stage follows before the branch ends.
fn lead(plan: &Plan, i: usize) -> Option<(Vec<usize>, usize, u32)> {
    let mut nodes = vec![i];
    let mut k = i;
    loop {
        if let Some(jobs) = plan.nodes[k].concurrency() {
            return Some((nodes, k, jobs));
        }
        match plan.next[k] {
            Entry::Node(n) => {
                nodes.push(n);
                k = n;
            }
            _ => return None,
        }
    }
}

impl Room<'_> {
    /// Whether an item holding `held` may enter `node`.
    fn fits(&self, node: usize, held: &BTreeSet<usize>) -> bool {
        let n = &self.plan.nodes[node];
        n.concurrency().is_none_or(|c| self.at_node[node] < c)
            && n.gates
                .iter()
                .all(|g| held.contains(g) || self.in_gate[*g] < self.plan.gates[*g])
    }

    /// Whether an either's branch has room: fewer items between its entry
    /// and its first stage (in a move on the way, or waiting after it)
    /// than that stage's `jobs`. Without this, a branch that starts with
    /// a move always had room, and every item took the first branch.
    fn branch_has_room(&self, branch: &Entry) -> bool {
        let Entry::Node(i) = branch else {
            return true;
        };
        let Some((nodes, stage, jobs)) = lead(self.plan, *i) else {
            return true;
        };
        let inside: u32 = nodes
            .iter()
            .map(|&k| self.at_node[k] + if k == stage { 0 } else { self.waiting_at[k] })
            .sum();
        inside < jobs
    }

    /// The node `entry` leads to that has room: an either's first branch
    /// (in file order) with room.
    fn choose(&self, entry: &Entry, held: &BTreeSet<usize>) -> Option<usize> {
        match entry {
            Entry::Node(i) => self.fits(*i, held).then_some(*i),
            Entry::Either(branches) => branches
                .iter()
                .filter(|b| self.branch_has_room(b))
                .find_map(|b| self.choose(b, held)),
            Entry::Done => None,
        }
    }
}

/// Waiting items, in list order, into the step after theirs where it has
/// room; items with nothing after are done.
///
/// Items are read by entry point (the step they finished, or none), since
/// the items of one entry point compete for the same room: once one of
/// them finds none, none after it in the list can find any in this pass
/// (room only shrinks as items enter), so the pass reads no more of them.
/// The exception is an item inside a `limit` that enters a step outside
/// it: the gate has room again, and every entry point is read on from
/// that item. Items inside a gate are few (no more than the gates' N) and
/// read whole, merged into list order with the others.
async fn enter(
    tx: &mut PgConnection,
    jobs: &RunJobs<'_>,
    plan: &Plan,
    reading: Reading,
) -> anyhow::Result<()> {
    let mut room = Room {
        plan,
        at_node: vec![0; plan.nodes.len()],
        waiting_at: vec![0; plan.nodes.len()],
        in_gate: vec![0; plan.gates.len()],
    };
    let busy: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT node, count(*) FROM pipeline_items WHERE run_id = $1 AND state = 'active'
         GROUP BY node",
    )
    .bind(jobs.id)
    .fetch_all(&mut *tx)
    .await?;
    for (node, n) in busy {
        if let Some(c) = room.at_node.get_mut(node as usize) {
            *c = n as u32;
        }
    }
    let inside: Vec<(i32, i64)> =
        sqlx::query_as("SELECT gate, count(*) FROM pipeline_gates WHERE run_id = $1 GROUP BY gate")
            .bind(jobs.id)
            .fetch_all(&mut *tx)
            .await?;
    for (gate, n) in inside {
        if let Some(c) = room.in_gate.get_mut(gate as usize) {
            *c = n as u32;
        }
    }
    done(tx, jobs.id, plan).await?;
    // Items waiting on the way into an either's branch count against its
    // room; they are few (a branch lets in no more than its stage's jobs).
    let leads = lead_nodes(plan);
    let waiting_at: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT COALESCE(at, -1), count(*) FROM pipeline_items
         WHERE run_id = $1 AND state = 'waiting' AND COALESCE(at, -1) = ANY ($2)
         GROUP BY 1",
    )
    .bind(jobs.id)
    .bind(&leads)
    .fetch_all(&mut *tx)
    .await?;
    for (at, n) in waiting_at {
        if let Some(c) = room.waiting_at.get_mut(at as usize) {
            *c = n as u32;
        }
    }
    let mut holders: VecDeque<WaitingRow> = sqlx::query_as::<_, WaitingRow>(
        "SELECT i.idx, i.item, i.at, i.latest, i.outputs, array_agg(g.gate) AS gates
         FROM pipeline_items i
         JOIN pipeline_gates g ON g.run_id = i.run_id AND g.idx = i.idx
         WHERE i.run_id = $1 AND i.state = 'waiting'
         GROUP BY i.run_id, i.idx ORDER BY i.idx",
    )
    .bind(jobs.id)
    .fetch_all(&mut *tx)
    .await?
    .into();
    let held_by: Vec<i32> = holders.iter().map(|h| h.idx).collect();
    // Entry points that have waiting items, as stored in `at` (-1: none
    // yet): a skip scan of the index, a probe per entry point in use
    // rather than one per step of the file.
    let points: Vec<i32> = sqlx::query_scalar(
        "WITH RECURSIVE p(at) AS (
             (SELECT COALESCE(at, -1) FROM pipeline_items
              WHERE run_id = $1 AND state = 'waiting' ORDER BY COALESCE(at, -1) LIMIT 1)
             UNION ALL
             SELECT (SELECT COALESCE(i.at, -1) FROM pipeline_items i
                     WHERE i.run_id = $1 AND i.state = 'waiting' AND COALESCE(i.at, -1) > p.at
                     ORDER BY COALESCE(i.at, -1) LIMIT 1)
             FROM p WHERE p.at IS NOT NULL)
         SELECT at FROM p WHERE at IS NOT NULL",
    )
    .bind(jobs.id)
    .fetch_all(&mut *tx)
    .await?;
    if let Some(stray) = points
        .iter()
        .find(|&&at| at < -1 || at >= plan.nodes.len() as i32)
    {
        anyhow::bail!("an item finished step {stray}, which the pipeline does not have");
    }
    let page = match reading {
        Reading::Paged(n) => Some(n.max(1)),
        Reading::Every => None,
    };
    let mut batch = Entering::default();
    // Items of these entry points found no room: none after them will.
    let mut full: BTreeSet<i32> = BTreeSet::new();
    // Items after this index (and outside gates) are not read yet.
    let mut read_up_to = -1;
    'reading: loop {
        let open: Vec<i32> = points
            .iter()
            .filter(|p| !full.contains(p))
            .copied()
            .collect();
        let rows: Vec<WaitingRow> = if open.is_empty() {
            Vec::new()
        } else {
            sqlx::query_as(
                "SELECT w.idx, w.item, w.at, w.latest, w.outputs, '{}'::int[] AS gates
                 FROM unnest($2::int[]) AS p(at)
                 CROSS JOIN LATERAL (
                     SELECT i.idx, i.item, i.at, i.latest, i.outputs FROM pipeline_items i
                     WHERE i.run_id = $1 AND i.state = 'waiting' AND COALESCE(i.at, -1) = p.at
                       AND i.idx > $3 AND i.idx <> ALL ($4)
                     ORDER BY i.idx LIMIT $5
                 ) w
                 ORDER BY w.idx",
            )
            .bind(jobs.id)
            .bind(&open)
            .bind(read_up_to)
            .bind(&held_by)
            .bind(page)
            .fetch_all(&mut *tx)
            .await?
        };
        // An entry point that filled its page may have more items after
        // it: the pass goes no further in the list than the first such
        // page's last item before reading again.
        let bound = page.and_then(|page| {
            let mut per_point: BTreeMap<Option<i32>, (i64, i32)> = BTreeMap::new();
            for r in &rows {
                let e = per_point.entry(r.at).or_insert((0, r.idx));
                e.0 += 1;
                e.1 = e.1.max(r.idx);
            }
            per_point
                .values()
                .filter(|(n, _)| *n >= page)
                .map(|(_, last)| *last)
                .min()
        });
        let mut rows = rows
            .into_iter()
            .filter(|r| bound.is_none_or(|b| r.idx <= b))
            .peekable();
        loop {
            let holder_first = match (holders.front(), rows.peek()) {
                (Some(h), Some(r)) => h.idx < r.idx,
                (Some(h), None) => bound.is_none_or(|b| h.idx <= b),
                (None, _) => false,
            };
            if holder_first {
                let Some(h) = holders.pop_front() else {
                    break;
                };
                let idx = h.idx;
                let tried = try_enter(tx, jobs, plan, &mut room, &mut batch, h).await?;
                if tried == Tried::EnteredLeavingAGate && !full.is_empty() {
                    // Room in a gate again: every entry point is read on
                    // from this item. (Not reached with today's gates: an
                    // item keeps only the gates every next step is inside,
                    // `kept_gates`; kept so that paging never changes what
                    // a pass does if that changes.)
                    full.clear();
                    read_up_to = idx;
                    continue 'reading;
                }
                continue;
            }
            let Some(r) = rows.next() else {
                break;
            };
            let point = r.at.unwrap_or(-1);
            if full.contains(&point) {
                continue;
            }
            let tried = try_enter(tx, jobs, plan, &mut room, &mut batch, r).await?;
            if tried == Tried::NoRoom && page.is_some() {
                full.insert(point);
            }
        }
        match bound {
            Some(b) => read_up_to = b,
            None => break,
        }
    }
    batch.record(tx, jobs.id).await
}

/// How a pass reads a run's waiting items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Up to this many of each entry point at a time, in list order, and
    /// no more of one once an item of it found no room.
    Paged(i64),
    /// Every waiting item, each tried: how a pass read them before they
    /// were paged, kept as what the tests hold `Paged` to.
    Every,
}

/// What became of a waiting item a pass tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tried {
    NoRoom,
    Entered,
    /// Entered a step outside a gate it was inside: the gate has room.
    EnteredLeavingAGate,
    /// Its job could not be made: it failed.
    Failed,
}

/// What a pass's entering items change, written together at its end.
#[derive(Default)]
struct Entering {
    items: Vec<(i32, usize)>,
    new_jobs: Vec<crate::queue::submit::NewJob>,
    leave: Vec<(i32, i32)>,
    join: Vec<(i32, i32)>,
}

/// Item `w` into the step after its own if one has room.
async fn try_enter(
    tx: &mut PgConnection,
    jobs: &RunJobs<'_>,
    plan: &Plan,
    room: &mut Room<'_>,
    batch: &mut Entering,
    w: WaitingRow,
) -> anyhow::Result<Tried> {
    let entry = match w.at {
        None => &plan.first,
        Some(a) => plan.next.get(a as usize).ok_or_else(|| {
            anyhow::anyhow!(
                "item {} finished step {a}, which the pipeline does not have",
                w.item
            )
        })?,
    };
    let held: BTreeSet<usize> = w.gates.iter().map(|g| *g as usize).collect();
    let Some(node) = room.choose(entry, &held) else {
        return Ok(Tried::NoRoom);
    };
    // The job first: an item whose job cannot be made fails alone.
    let job = place(w.item, w.latest, w.outputs)
        .and_then(|place| Ok(jobs.step(&place, &plan.nodes[node], 0, None)?.job));
    let job = match job {
        Ok(job) => job,
        Err(e) => {
            fail_item(tx, jobs.id, w.idx, node as i32, &format!("{e:#}")).await?;
            return Ok(Tried::Failed);
        }
    };
    let wanted: BTreeSet<usize> = plan.nodes[node].gates.iter().copied().collect();
    let mut left = false;
    for g in held.difference(&wanted) {
        room.in_gate[*g] = room.in_gate[*g].saturating_sub(1);
        batch.leave.push((w.idx, *g as i32));
        left = true;
    }
    for g in wanted.difference(&held) {
        room.in_gate[*g] += 1;
        batch.join.push((w.idx, *g as i32));
    }
    room.at_node[node] += 1;
    if let Some(c) = w.at.and_then(|a| room.waiting_at.get_mut(a as usize)) {
        *c = c.saturating_sub(1);
    }
    batch.new_jobs.push(job);
    batch.items.push((w.idx, node));
    Ok(if left {
        Tried::EnteredLeavingAGate
    } else {
        Tried::Entered
    })
}

impl Entering {
    async fn record(self, tx: &mut PgConnection, run: Uuid) -> anyhow::Result<()> {
        if !self.leave.is_empty() {
            let (idx, gate): (Vec<i32>, Vec<i32>) = self.leave.into_iter().unzip();
            sqlx::query(
                "DELETE FROM pipeline_gates g USING unnest($2::int[], $3::int[]) AS x(idx, gate)
                 WHERE g.run_id = $1 AND g.idx = x.idx AND g.gate = x.gate",
            )
            .bind(run)
            .bind(&idx)
            .bind(&gate)
            .execute(&mut *tx)
            .await?;
        }
        if !self.join.is_empty() {
            let (idx, gate): (Vec<i32>, Vec<i32>) = self.join.into_iter().unzip();
            sqlx::query(
                "INSERT INTO pipeline_gates (run_id, gate, idx)
                 SELECT $1, x.gate, x.idx FROM unnest($2::int[], $3::int[]) AS x(idx, gate)",
            )
            .bind(run)
            .bind(&idx)
            .bind(&gate)
            .execute(&mut *tx)
            .await?;
        }
        if self.items.is_empty() {
            return Ok(());
        }
        let ids = submit_in(&mut *tx, &self.new_jobs).await?;
        let idx: Vec<i32> = self.items.iter().map(|e| e.0).collect();
        let node: Vec<i32> = self.items.iter().map(|e| e.1 as i32).collect();
        sqlx::query(
            "UPDATE pipeline_items i SET state = 'active', node = x.node, phase = 0, job_id = x.job
             FROM unnest($2::int[], $3::int[], $4::uuid[]) AS x(idx, node, job)
             WHERE i.run_id = $1 AND i.idx = x.idx",
        )
        .bind(run)
        .bind(&idx)
        .bind(&node)
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
        // A step entered again (a resumed item) starts its cell afresh.
        sqlx::query(
            "INSERT INTO pipeline_steps (run_id, idx, node, job_id)
             SELECT $1, x.idx, x.node, x.job FROM unnest($2::int[], $3::int[], $4::uuid[]) AS x(idx, node, job)
             ON CONFLICT (run_id, idx, node) DO UPDATE SET state = 'running', job_id = EXCLUDED.job_id,
                 output = NULL, started_at = now(), finished_at = NULL",
        )
        .bind(run)
        .bind(&idx)
        .bind(&node)
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
        Ok(())
    }
}

/// Items that finished a last step are done, and leave their gates.
async fn done(tx: &mut PgConnection, run: Uuid, plan: &Plan) -> anyhow::Result<()> {
    let last: Vec<i32> = std::iter::once((-1, &plan.first))
        .chain(plan.next.iter().enumerate().map(|(i, e)| (i as i32, e)))
        .filter(|(_, e)| **e == Entry::Done)
        .map(|(at, _)| at)
        .collect();
    let done: Vec<i32> = sqlx::query_scalar(
        "UPDATE pipeline_items SET state = 'done'
         WHERE run_id = $1 AND state = 'waiting' AND COALESCE(at, -1) = ANY ($2)
         RETURNING idx",
    )
    .bind(run)
    .bind(&last)
    .fetch_all(&mut *tx)
    .await?;
    if !done.is_empty() {
        sqlx::query("DELETE FROM pipeline_gates WHERE run_id = $1 AND idx = ANY ($2)")
            .bind(run)
            .bind(&done)
            .execute(&mut *tx)
            .await?;
    }
    Ok(())
}

/// The nodes whose waiting items count against an either's branch: each
/// branch's lead but its stage ([`Room::branch_has_room`]).
fn lead_nodes(plan: &Plan) -> Vec<i32> {
    /// `seen`: the eithers walked already, by address. One either is
    /// what every branch before it leads to (`Entry::Either` is shared);
    /// walked from each, a file of nested eithers of 48 branches cost
    /// 88 ms a pass (measured in a review of aea1660).
    fn walk(plan: &Plan, e: &Entry, seen: &mut BTreeSet<usize>, out: &mut BTreeSet<i32>) {
        let Entry::Either(branches) = e else {
            return;
        };
        if !seen.insert(branches.as_ptr() as usize) {
            return;
        }
        for b in branches.iter() {
            match b {
                Entry::Node(i) => {
                    if let Some((nodes, stage, _)) = lead(plan, *i) {
                        out.extend(nodes.into_iter().filter(|k| *k != stage).map(|k| k as i32));
                    }
                }
                nested => walk(plan, nested, seen, out),
            }
        }
    }
    let (mut seen, mut out) = (BTreeSet::new(), BTreeSet::new());
    for e in std::iter::once(&plan.first).chain(plan.next.iter()) {
        walk(plan, e, &mut seen, &mut out);
    }
    out.into_iter().collect()
}

/// A run with no open item left ends: done, or failed naming how many
/// items did not make it.
async fn finish(tx: &mut PgConnection, run: Uuid) -> anyhow::Result<()> {
    // Found by the first open item, not by counting them all every pass.
    let open: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pipeline_items
                        WHERE run_id = $1 AND state IN ('waiting', 'active'))",
    )
    .bind(run)
    .fetch_one(&mut *tx)
    .await?;
    if open {
        return Ok(());
    }
    let counts: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state, count(*) FROM pipeline_items WHERE run_id = $1 GROUP BY state",
    )
    .bind(run)
    .fetch_all(&mut *tx)
    .await?;
    let by: HashMap<String, i64> = counts.into_iter().collect();
    let failed = by.get("failed").copied().unwrap_or(0);
    let cancelled = by.get("cancelled").copied().unwrap_or(0);
    let total: i64 = by.values().sum();
    let (state, error) = match (failed, cancelled) {
        (0, 0) => ("done", None),
        (f, 0) => ("failed", Some(format!("{f} of {total} items failed"))),
        (0, c) => (
            "failed",
            Some(format!("{c} of {total} items were cancelled")),
        ),
        (f, c) => (
            "failed",
            Some(format!(
                "{f} of {total} items failed and {c} were cancelled"
            )),
        ),
    };
    sqlx::query(
        "UPDATE pipeline_runs SET state = $2, error = $3, finished_at = now()
         WHERE id = $1 AND state = 'running'",
    )
    .bind(run)
    .bind(state)
    .bind(error)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nodes_counted_against_a_branch_are_its_moves_before_its_stage() {
        let spec = flotilla_core::pipeline::load(
            "leads.pipeline",
            "host a = agent pa
host b = agent pb
items on a: seq 1 3
stage s1 on a jobs 3 out /tmp/e/s1/{id}: true
either {
    move mx to b:/tmp/e/x/{id}
    move mz to a:/tmp/e/z/{id}
    stage sx on a jobs 1: true
|
    stage sy on a jobs 2: true
|
    either {
        move mw to b:/tmp/e/w/{id}
        stage sw on b jobs 1: true
    |
        stage sv on b jobs 1: true
    }
}
stage fin on a jobs 1 out /tmp/e/fin/{id}: true
move back to b:/tmp/e/back/{id}
",
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        let plan = Plan::new(&spec);
        let index = |name: &str| plan.node(name).map(|n| n.index as i32);
        let want: Vec<i32> = ["mx", "mz", "mw"].iter().filter_map(|n| index(n)).collect();
        assert_eq!(want.len(), 3);
        // Not `back`: a move after the either, in no branch's lead.
        assert_eq!(lead_nodes(&plan), want);
    }
}
