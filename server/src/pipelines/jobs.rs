//! The job of one item at one step: where it runs, and its command or path
//! with the item's fields filled in.

use std::collections::BTreeMap;

use flotilla_core::job::{JobSpec, StepAction, StepJob, StepOut};
use flotilla_core::pipeline::plan::{Node, NodeStep};
use flotilla_core::pipeline::template::{Field, Fill, Template};
use flotilla_core::pipeline::PipelineSpec;
use uuid::Uuid;

use super::{host_is_a_set, placement, Location};
use crate::queue::submit::NewJob;

/// What every job of one run shares.
#[derive(Debug, Clone)]
pub struct RunJobs<'a> {
    pub id: Uuid,
    pub spec: &'a PipelineSpec,
    pub priority: i32,
    pub submitter: &'a str,
    pub owner: Option<Uuid>,
}

/// Where one item is: its id, its latest output and every stage output so
/// far.
#[derive(Debug, Clone)]
pub struct ItemPlace {
    pub item: String,
    pub latest: Option<Location>,
    pub outputs: BTreeMap<String, Location>,
}

/// Attempts of a move's jobs: a transfer that failed is worth retrying.
const MOVE_ATTEMPTS: u32 = 3;

/// `step` queued with the run's priority, submitter and owner.
pub fn queued(
    priority: i32,
    submitter: &str,
    owner: Option<Uuid>,
    step: StepJob,
    labels: BTreeMap<String, String>,
    max_attempts: u32,
) -> NewJob {
    let run = step.run_id;
    NewJob {
        spec: JobSpec::Step(step),
        labels,
        priority,
        max_attempts,
        cost: 1,
        submitter: submitter.to_string(),
        parent_id: Some(run),
        child_index: None,
        owner,
    }
}

/// A step's job for an item, and where the step's output will be.
pub struct StepWork {
    pub job: NewJob,
    /// A stage's `out` or a move's destination (its agent filled in once a
    /// job on a host of several agents has run).
    pub output: Option<Location>,
}

/// Why a step's job could not be made for an item (a field with no value:
/// `check` rules these out, so this is a bug or a changed file).
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("{field} has no value for item `{item}` at step `{step}`")]
    NoValue {
        field: Field,
        item: String,
        step: String,
    },
    #[error("step `{step}` needs the sent tar's size and sha256")]
    NothingSent { step: String },
}

/// `t` with `place`'s values; `{out}`, where `with_out`, is the shell
/// variable `FLOTILLA_OUT`, which the agent sets to the attempt's own
/// temporary path beside `out`.
fn expand(
    t: &Template,
    place: &ItemPlace,
    with_out: bool,
    shell: bool,
    step: &str,
) -> Result<String, StepError> {
    let text = |v: Option<String>| v.map(Fill::Text);
    t.fill(
        |f| match f {
            Field::Id => text(Some(place.item.clone())),
            Field::Out => with_out.then_some(Fill::Var("FLOTILLA_OUT")),
            Field::In => text(place.latest.as_ref().map(|l| l.path.clone())),
            Field::StageOut(s) => text(place.outputs.get(s).map(|l| l.path.clone())),
        },
        shell,
    )
    .map_err(|field| StepError::NoValue {
        field,
        item: place.item.clone(),
        step: step.to_string(),
    })
}

/// The prefix of the temporary paths beside `path` that a stage's
/// attempts write to (`PREFIX-JOB-ATTEMPT`, made by the agent).
fn temp_beside(path: &str) -> String {
    match path.rsplit_once('/') {
        Some((parent, base)) => format!("{parent}/.{base}.flotilla-part"),
        None => format!(".{path}.flotilla-part"),
    }
}

impl RunJobs<'_> {
    fn job(
        &self,
        place: &ItemPlace,
        node: &Node,
        (host, pin): (&str, Option<&str>),
        action: StepAction,
        timeout_s: Option<u64>,
        attempts: u32,
    ) -> NewJob {
        let (step_host, labels) = placement(self.spec, host, pin);
        queued(
            self.priority,
            self.submitter,
            self.owner,
            StepJob {
                run_id: self.id,
                item: place.item.clone(),
                step: node.name.clone(),
                host: step_host,
                action,
                timeout_s,
            },
            labels,
            attempts,
        )
    }

    /// The agent an item's latest output is on, if a job on `host` must
    /// keep to it.
    fn pin<'p>(&self, place: &'p ItemPlace, host: &str) -> Option<&'p str> {
        place
            .latest
            .as_ref()
            .filter(|l| l.host == host && host_is_a_set(self.spec, host))
            .and_then(|l| l.agent.as_deref())
    }

    /// The job of `node` for `place`, at `phase` (a move's: 0 send, 1
    /// receive with what the send uploaded, 2 remove the source).
    pub fn step(
        &self,
        place: &ItemPlace,
        node: &Node,
        phase: i16,
        sent: Option<(u64, String)>,
    ) -> Result<StepWork, StepError> {
        match &node.step {
            NodeStep::Stage(stage) => {
                let out = match &stage.out {
                    Some(t) => {
                        let path = expand(t, place, false, false, &node.name)?;
                        let dir = path.ends_with('/') && path.len() > 1;
                        let path = if dir {
                            path.trim_end_matches('/').to_string()
                        } else {
                            path
                        };
                        Some(StepOut {
                            temp: temp_beside(&path),
                            path,
                            dir,
                        })
                    }
                    None => None,
                };
                // `{out}` is `$FLOTILLA_OUT`, quoted as its place needs.
                let command = expand(&stage.command, place, out.is_some(), true, &node.name)?;
                let consume = if stage.consume {
                    place.latest.as_ref().map(|l| l.path.clone())
                } else {
                    None
                };
                let output = out.as_ref().map(|o| Location {
                    host: node.host.clone(),
                    agent: None,
                    path: o.path.clone(),
                });
                let pin = self.pin(place, &node.host);
                Ok(StepWork {
                    job: self.job(
                        place,
                        node,
                        (&node.host, pin),
                        StepAction::Run {
                            command,
                            out,
                            consume,
                        },
                        stage.timeout_s,
                        stage.retries + 1,
                    ),
                    output,
                })
            }
            NodeStep::Move(m) => {
                let Some(source) = place.latest.as_ref() else {
                    return Err(StepError::NoValue {
                        field: Field::In,
                        item: place.item.clone(),
                        step: node.name.clone(),
                    });
                };
                let dest = expand(&m.path, place, false, false, &node.name)?;
                let output = Some(Location {
                    host: m.host.clone(),
                    agent: None,
                    path: dest.clone(),
                });
                let source_pin = self.pin(place, &source.host);
                let job = match phase {
                    0 => self.job(
                        place,
                        node,
                        (&source.host, source_pin),
                        StepAction::Send {
                            path: source.path.clone(),
                        },
                        None,
                        MOVE_ATTEMPTS,
                    ),
                    1 => {
                        let (size, sha256) = sent.ok_or_else(|| StepError::NothingSent {
                            step: node.name.clone(),
                        })?;
                        self.job(
                            place,
                            node,
                            (&m.host, None),
                            StepAction::Receive {
                                size,
                                sha256,
                                path: dest,
                            },
                            None,
                            MOVE_ATTEMPTS,
                        )
                    }
                    _ => self.job(
                        place,
                        node,
                        (&source.host, source_pin),
                        StepAction::Remove {
                            path: source.path.clone(),
                        },
                        None,
                        MOVE_ATTEMPTS,
                    ),
                };
                Ok(StepWork { job, output })
            }
        }
    }
}

/// Jobs a node runs in turn for one item: a stage one, a move three (send,
/// receive, remove the source).
pub fn phases(node: &Node) -> i16 {
    match node.step {
        NodeStep::Stage(_) => 1,
        NodeStep::Move(_) => 3,
    }
}
