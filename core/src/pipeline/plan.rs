//! A checked pipeline as the engine walks it: its stages and moves numbered
//! in file order ("nodes"), the limit gates around each, and what comes
//! after each node.

use super::spec::{Move, PipelineSpec, Stage, Step};

/// A step that runs jobs.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeStep {
    Stage(Stage),
    Move(Move),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Its place in file order; the column of the item × stage matrix.
    pub index: usize,
    pub name: String,
    /// The host it runs on (a move: its destination).
    pub host: String,
    pub step: NodeStep,
    /// The `limit` blocks around it, outermost first (indices into
    /// [`Plan::gates`]).
    pub gates: Vec<usize>,
}

impl Node {
    /// Items at this node at once: a stage's `jobs`; a move, unbounded
    /// (the gates around it still hold).
    pub fn concurrency(&self) -> Option<u32> {
        match &self.step {
            NodeStep::Stage(s) => Some(s.jobs),
            NodeStep::Move(_) => None,
        }
    }
}

/// Where an item goes next.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Node(usize),
    /// The first branch, in file order, with room. Shared: the last node
    /// of every branch of an `either` leads to what follows it, which may
    /// be another `either`; copied, its branches cost B1 x B2 entries (six
    /// million from a 60 KB file), shared, one list.
    Either(std::sync::Arc<[Entry]>),
    Done,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub nodes: Vec<Node>,
    /// Each `limit` block's N, in file order.
    pub gates: Vec<u32>,
    /// Where an item starts.
    pub first: Entry,
    /// Where an item goes after each node.
    pub next: Vec<Entry>,
}

impl Plan {
    pub fn new(spec: &PipelineSpec) -> Plan {
        let mut plan = Plan {
            nodes: Vec::new(),
            gates: Vec::new(),
            first: Entry::Done,
            next: Vec::new(),
        };
        number(&spec.steps, &mut Vec::new(), &mut plan);
        plan.next = vec![Entry::Done; plan.nodes.len()];
        let mut counter = 0;
        plan.first = link(&spec.steps, Entry::Done, &mut counter, &mut plan.next);
        plan
    }

    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The nodes `entry` may lead to first, in branch order.
    pub fn candidates(&self, entry: &Entry) -> Vec<usize> {
        let mut out = Vec::new();
        fn walk(e: &Entry, out: &mut Vec<usize>) {
            match e {
                Entry::Node(i) => out.push(*i),
                Entry::Either(bs) => bs.iter().for_each(|b| walk(b, out)),
                Entry::Done => {}
            }
        }
        walk(entry, &mut out);
        out
    }
}

/// Numbers nodes and gates in file order (pre-order).
fn number(steps: &[Step], gates: &mut Vec<usize>, plan: &mut Plan) {
    for step in steps {
        match step {
            Step::Stage(s) => plan.nodes.push(Node {
                index: plan.nodes.len(),
                name: s.name.clone(),
                host: s.host.clone(),
                step: NodeStep::Stage(s.clone()),
                gates: gates.clone(),
            }),
            Step::Move(m) => plan.nodes.push(Node {
                index: plan.nodes.len(),
                name: m.name.clone(),
                host: m.host.clone(),
                step: NodeStep::Move(m.clone()),
                gates: gates.clone(),
            }),
            Step::Limit { n, steps, .. } => {
                gates.push(plan.gates.len());
                plan.gates.push(*n);
                number(steps, gates, plan);
                gates.pop();
            }
            Step::Either { branches, .. } => {
                for b in branches {
                    number(b, gates, plan);
                }
            }
        }
    }
}

/// Sets `next` for the nodes of `steps` (numbered from `*counter` in file
/// order) when `after` follows them, and returns their entry.
fn link(steps: &[Step], after: Entry, counter: &mut usize, next: &mut [Entry]) -> Entry {
    // Number in file order first, so the indices match `number`.
    enum Piece {
        Node(usize),
        Seq(Vec<Step>, usize),
        Either(Vec<(Vec<Step>, usize)>),
    }
    fn count(steps: &[Step]) -> usize {
        steps
            .iter()
            .map(|s| match s {
                Step::Stage(_) | Step::Move(_) => 1,
                Step::Limit { steps, .. } => count(steps),
                Step::Either { branches, .. } => branches.iter().map(|b| count(b)).sum(),
            })
            .sum()
    }
    let mut pieces = Vec::new();
    for step in steps {
        match step {
            Step::Stage(_) | Step::Move(_) => {
                pieces.push(Piece::Node(*counter));
                *counter += 1;
            }
            Step::Limit { steps, .. } => {
                pieces.push(Piece::Seq(steps.clone(), *counter));
                *counter += count(steps);
            }
            Step::Either { branches, .. } => {
                let mut bs = Vec::new();
                for b in branches {
                    bs.push((b.clone(), *counter));
                    *counter += count(b);
                }
                pieces.push(Piece::Either(bs));
            }
        }
    }
    let mut entry = after;
    for piece in pieces.into_iter().rev() {
        entry = match piece {
            Piece::Node(i) => {
                next[i] = entry;
                Entry::Node(i)
            }
            Piece::Seq(steps, start) => {
                let mut c = start;
                link(&steps, entry, &mut c, next)
            }
            Piece::Either(bs) => Entry::Either(
                bs.into_iter()
                    .map(|(b, start)| {
                        let mut c = start;
                        link(&b, entry.clone(), &mut c, next)
                    })
                    .collect::<Vec<_>>()
                    .into(),
            ),
        };
    }
    entry
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two `either`s of 64 branches in a row: every last node of the first
    /// leads to one shared list of the second's 64 entries, not a copy each
    /// (review of 3877596, F5: 2,500 x 2,500 copies from a 60 KB file).
    #[test]
    fn what_follows_an_either_is_shared_not_copied() {
        let either = |tag: &str| {
            let branches: Vec<String> = (0..64)
                .map(|i| format!("stage {tag}{i} on h: x\n"))
                .collect();
            format!("either {{\n{}}}\n", branches.join("|\n"))
        };
        let text = format!(
            "host h = agent a1\nitems on h: ls\n{}{}",
            either("a"),
            either("b")
        );
        let spec = crate::pipeline::load("t", &text).unwrap();
        let plan = Plan::new(&spec);
        let shared: Vec<&std::sync::Arc<[Entry]>> = plan.next[..64]
            .iter()
            .map(|e| match e {
                Entry::Either(bs) => bs,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(shared[0].len(), 64);
        assert!(shared.iter().all(|b| std::sync::Arc::ptr_eq(b, shared[0])));
        assert_eq!(plan.candidates(&plan.first).len(), 64);
    }
}
