//! The invariants a chaos run is held to, checked over each job's attempts and marker lines against the fault log.

use chrono::{DateTime, Duration as Span, Utc};
use flotilla_core::api::{AttemptView, JobView};
use flotilla_core::job::JobState;

/// What the driver did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    KillServer,
    KillAgent,
    RestartPostgres,
    Partition,
}

/// One fault: from `at` until `end` (the restart, the heal).
#[derive(Debug, Clone)]
pub struct Fault {
    pub kind: FaultKind,
    /// The server's or agent's name; `postgres` for the database.
    pub target: String,
    pub at: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.kind {
            FaultKind::KillServer => "server SIGKILLed",
            FaultKind::KillAgent => "agent SIGKILLed",
            FaultKind::RestartPostgres => "PostgreSQL restarted",
            FaultKind::Partition => "agent partitioned",
        };
        write!(
            f,
            "{what}: {} at {} for {:.1} s",
            self.target,
            self.at.format("%H:%M:%S%.3f"),
            (self.end - self.at).num_milliseconds() as f64 / 1000.0
        )
    }
}

/// A job at the end: where its view left it, its attempts, and its marker
/// lines.
pub struct Ended {
    pub id: String,
    pub state: JobState,
    /// The job's own attempt number: the accepted one once it succeeded.
    pub attempt: u32,
    pub error: Option<String>,
    pub attempts: Vec<AttemptView>,
    /// One attempt number per run that reached its end, in write order.
    pub marks: Vec<u32>,
    /// The outputs the job lists: (name, object key, the object's text as
    /// the store holds it, `None` if it is not there).
    pub outputs: Vec<(String, String, Option<String>)>,
}

/// The output every chaos job declares: the attempt number that wrote it.
pub const OUTPUT: &str = "attempt.txt";

impl Ended {
    /// `read` gives an object's text by key (`None`: not in the store).
    pub fn new(view: JobView, marks: Vec<u32>, read: impl Fn(&str) -> Option<String>) -> Ended {
        Ended {
            id: view.id.to_string(),
            state: view.state,
            attempt: view.attempt,
            error: view.error,
            attempts: view.attempts.unwrap_or_default(),
            marks,
            outputs: view
                .outputs
                .into_iter()
                .map(|o| {
                    let text = read(&o.key);
                    (o.name, o.key, text)
                })
                .collect(),
        }
    }
}

/// What the check found.
#[derive(Default)]
pub struct Findings {
    /// Invariants broken: the run fails if any.
    pub violations: Vec<String>,
    /// Each attempt that did not stand, with the fault that explains it.
    pub reruns: Vec<String>,
    /// Runs of a killed agent's job that finished after the job's next
    /// attempt had (the orphaned process outlived its agent).
    pub late_orphans: Vec<String>,
}

/// Slack between a fault's timestamp (the driver's clock) and the server's
/// record of the attempt's end: the same host clock, but the reaper, the
/// restart and the handback each take their time.
const SLACK_S: i64 = 2;

/// The fault that explains why `a` (not the job's last attempt) did not
/// stand: its agent was killed or partitioned while it held the lease; or,
/// for an attempt that never started, the lease's answer was lost with a
/// server or the database while it was being given.
fn explain<'f>(a: &AttemptView, faults: &'f [Fault], ttl: Span) -> Option<&'f Fault> {
    let end = a.finished_at?;
    let from = a.started_at.unwrap_or(end - ttl * 4 - Span::seconds(30)) - Span::seconds(SLACK_S);
    let to = end + Span::seconds(SLACK_S);
    let agent = a.agent.as_deref();
    // The latest that fits: the one nearest the attempt's end.
    let of_agent = faults
        .iter()
        .filter(|f| {
            matches!(f.kind, FaultKind::KillAgent | FaultKind::Partition)
                && Some(f.target.as_str()) == agent
                && f.at >= from
                && f.at <= to
        })
        .max_by_key(|f| f.at);
    if of_agent.is_some() || a.started_at.is_some() {
        return of_agent;
    }
    faults
        .iter()
        .filter(|f| {
            matches!(f.kind, FaultKind::KillServer | FaultKind::RestartPostgres)
                && f.at >= from
                && f.at <= to
        })
        .max_by_key(|f| f.at)
}

/// Checks every job: final and succeeded; its last attempt succeeded and
/// wrote exactly one marker line (the recorded result is the accepted
/// attempt's); no attempt wrote two; every other attempt, and every other
/// marker line, is explained by a fault of its agent.
pub fn check(jobs: &[Ended], faults: &[Fault], ttl: Span) -> Findings {
    let mut out = Findings::default();
    for job in jobs {
        let v = job;
        let id = &v.id;
        if v.state != JobState::Succeeded {
            out.violations.push(format!(
                "job {id} ended {} (attempt {}): {:?}",
                v.state, v.attempt, v.error
            ));
            continue;
        }
        let attempts = &v.attempts;
        let last = attempts.iter().max_by_key(|a| a.attempt);
        match last {
            Some(l) if l.attempt == v.attempt && l.outcome.as_deref() == Some("succeeded") => {}
            _ => out.violations.push(format!(
                "job {id}: job says attempt {}, its last attempt is {:?}",
                v.attempt,
                last.map(|l| (l.attempt, l.outcome.clone()))
            )),
        }
        // No output of a refused lease is visible: the job lists exactly
        // its accepted attempt's output, written by that attempt.
        let want_key = format!("jobs/{id}/{}/{OUTPUT}", v.attempt);
        let want_text = v.attempt.to_string();
        match job.outputs.as_slice() {
            [(name, key, Some(text))]
                if name == OUTPUT && *key == want_key && text.trim() == want_text => {}
            other => out.violations.push(format!(
                "job {id}: accepted attempt {}, but it lists the outputs {other:?}",
                v.attempt
            )),
        }
        let accepted = job.marks.iter().filter(|&&m| m == v.attempt).count();
        if accepted != 1 {
            out.violations.push(format!(
                "job {id}: its accepted attempt {} wrote {accepted} marker lines (marks {:?})",
                v.attempt, job.marks
            ));
        }
        for (i, m) in job.marks.iter().enumerate() {
            if job.marks[..i].contains(m) && *m != v.attempt {
                out.violations.push(format!(
                    "job {id}: attempt {m} ran to its end twice (marks {:?})",
                    job.marks
                ));
            }
        }
        for a in attempts.iter().filter(|a| a.attempt != v.attempt) {
            let ran = job.marks.contains(&a.attempt);
            match explain(a, faults, ttl) {
                Some(f) => out.reruns.push(format!(
                    "job {id} attempt {} on {} ({}, {}): {f}",
                    a.attempt,
                    a.agent.as_deref().unwrap_or("-"),
                    a.outcome.as_deref().unwrap_or("open"),
                    match (ran, a.started_at) {
                        (true, _) => "ran to its end, result refused",
                        (false, Some(_)) => "stopped before its end",
                        (false, None) => "leased, never started",
                    },
                )),
                None => out.violations.push(format!(
                    "job {id} attempt {} on {} ({}, started {:?}, ended {:?}, marker: {ran}) \
                     did not stand and no fault of its agent explains it",
                    a.attempt,
                    a.agent.as_deref().unwrap_or("-"),
                    a.outcome.as_deref().unwrap_or("open"),
                    a.started_at,
                    a.finished_at
                )),
            }
        }
        // A marker line of an attempt the server never gave out.
        for m in &job.marks {
            if !attempts.iter().any(|a| a.attempt == *m) {
                out.violations.push(format!(
                    "job {id}: marker of attempt {m}, which the server does not list"
                ));
            }
        }
        // The accepted attempt's line should be the last one; a line after
        // it may only come from a killed agent's orphaned process.
        if let Some(pos) = job.marks.iter().rposition(|&m| m == v.attempt) {
            for later in &job.marks[pos + 1..] {
                let a = attempts.iter().find(|a| a.attempt == *later);
                let killed = a
                    .and_then(|a| explain(a, faults, ttl))
                    .filter(|f| f.kind == FaultKind::KillAgent);
                match killed {
                    Some(f) => out.late_orphans.push(format!("job {id} attempt {later}: {f}")),
                    None => out.violations.push(format!(
                        "job {id}: attempt {later}'s marker was written after the accepted attempt {}'s, \
                         and its agent was not killed (marks {:?})",
                        v.attempt, job.marks
                    )),
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).expect("a valid time")
    }

    fn attempt(n: u32, agent: &str, from: i64, to: i64, outcome: &str) -> AttemptView {
        AttemptView {
            attempt: n,
            agent: Some(agent.into()),
            started_at: Some(at(from)),
            finished_at: Some(at(to)),
            duration_s: Some((to - from) as f64),
            outcome: Some(outcome.into()),
            exit_code: None,
            error: None,
        }
    }

    fn job(attempts: Vec<AttemptView>, marks: Vec<u32>) -> Ended {
        let attempt = attempts.len() as u32;
        Ended {
            id: "j".into(),
            state: JobState::Succeeded,
            attempt,
            error: None,
            attempts,
            marks,
            outputs: vec![(
                OUTPUT.into(),
                format!("jobs/j/{attempt}/{OUTPUT}"),
                Some(format!("{attempt}\n")),
            )],
        }
    }

    fn partition(agent: &str, s: i64) -> Fault {
        Fault {
            kind: FaultKind::Partition,
            target: agent.into(),
            at: at(s),
            end: at(s + 9),
        }
    }

    const TTL: Span = Span::seconds(3);

    #[test]
    fn a_rerun_after_its_agent_was_cut_off_is_listed_not_failed() {
        let j = job(
            vec![
                attempt(1, "a", 0, 5, "lease_expired"),
                attempt(2, "b", 6, 7, "succeeded"),
            ],
            vec![1, 2],
        );
        let f = check(&[j], &[partition("a", 1)], TTL);
        assert!(f.violations.is_empty(), "{:?}", f.violations);
        assert_eq!(f.reruns.len(), 1);
    }

    #[test]
    fn a_rerun_nothing_explains_is_a_violation() {
        let j = job(
            vec![
                attempt(1, "a", 0, 5, "lease_expired"),
                attempt(2, "b", 6, 7, "succeeded"),
            ],
            vec![1, 2],
        );
        // The other agent's partition, and this one's long before.
        let f = check(&[j], &[partition("b", 1), partition("a", -60)], TTL);
        assert_eq!(f.violations.len(), 1, "{:?}", f.violations);
    }

    #[test]
    fn the_accepted_attempt_run_twice_or_not_at_all_is_a_violation() {
        let twice = job(vec![attempt(1, "a", 0, 1, "succeeded")], vec![1, 1]);
        let never = job(vec![attempt(1, "a", 0, 1, "succeeded")], vec![]);
        let f = check(&[twice, never], &[], TTL);
        assert_eq!(f.violations.len(), 2, "{:?}", f.violations);
    }

    #[test]
    fn a_marker_after_the_accepted_one_needs_a_killed_agent() {
        let attempts = vec![
            attempt(1, "a", 0, 5, "lease_expired"),
            attempt(2, "b", 6, 7, "succeeded"),
        ];
        let cut = check(
            &[job(attempts.clone(), vec![2, 1])],
            &[partition("a", 1)],
            TTL,
        );
        assert_eq!(cut.violations.len(), 1, "{:?}", cut.violations);
        let kill = Fault {
            kind: FaultKind::KillAgent,
            ..partition("a", 1)
        };
        let killed = check(&[job(attempts, vec![2, 1])], &[kill], TTL);
        assert!(killed.violations.is_empty(), "{:?}", killed.violations);
        assert_eq!(killed.late_orphans.len(), 1);
    }

    /// The output a refused attempt uploaded, listed in place of the
    /// accepted one's (or the accepted one's missing, or written by
    /// another attempt), is a violation.
    #[test]
    fn an_output_not_of_the_accepted_attempt_is_a_violation() {
        let attempts = vec![
            attempt(1, "a", 0, 5, "lease_expired"),
            attempt(2, "b", 6, 7, "succeeded"),
        ];
        let faults = [partition("a", 1)];
        let good = job(attempts.clone(), vec![1, 2]);
        assert!(check(&[good], &faults, TTL).violations.is_empty());
        let mut refused = job(attempts.clone(), vec![1, 2]);
        refused.outputs = vec![(
            OUTPUT.into(),
            format!("jobs/j/1/{OUTPUT}"),
            Some("1\n".into()),
        )];
        let mut missing = job(attempts.clone(), vec![1, 2]);
        missing.outputs[0].2 = None;
        let mut overwritten = job(attempts.clone(), vec![1, 2]);
        overwritten.outputs[0].2 = Some("1\n".into());
        let mut none = job(attempts, vec![1, 2]);
        none.outputs.clear();
        for (what, j) in [
            ("refused", refused),
            ("missing", missing),
            ("overwritten", overwritten),
            ("none", none),
        ] {
            assert_eq!(check(&[j], &faults, TTL).violations.len(), 1, "{what}");
        }
    }

    #[test]
    fn a_job_not_succeeded_is_a_violation() {
        let mut j = job(vec![attempt(1, "a", 0, 1, "failed")], vec![]);
        j.state = JobState::Failed;
        assert_eq!(check(&[j], &[], TTL).violations.len(), 1);
    }
}
