//! The durable job queue, hand-written on SQL. This module owns the `jobs`,
//! `job_classes`, `job_attempts`, `job_logs` and `job_outputs` tables: no
//! other module writes them.
//!
//! Every transition is one statement guarded by the current state (and, for
//! agents, the lease token and agent id), so a crash between any two leaves
//! a state the next start continues from, and a call from a stale attempt
//! changes nothing.
//!
//! - [`valid`]: a submitted command job checked field by field.
//! - [`submit`]: insert jobs in one transaction, with fair-share tags.
//! - [`retry`]: a failed or cancelled command job queued again as a new job.
//! - [`classes`]: the (kind, labels, cost) classes the claim reads by, and
//!   whether any registered agent could take each.
//! - [`wakeup`]: NOTIFY on submit, and the LISTEN that wakes long-polling
//!   agents on every server.
//! - [`claim`]: the `FOR UPDATE SKIP LOCKED` claim that also sets the lease.
//! - [`lease`]: what an agent does with a lease ([`lease::LeaseKey`]):
//!   start, heartbeat, log, output, complete, fail.
//! - [`reaper`]: re-queues jobs whose lease expired, with back-off.
//! - [`cancel`]: cancel a job, at once or at the agent's next heartbeat.
//! - [`read`]: job views, lists and counts for the API and dashboard.
//! - [`logs`]: job logs, capped per attempt (head and tail kept), read in
//!   pages.
//! - [`retention`]: finished jobs past `--retention` archived to the object
//!   store as JSON lines, then deleted.

pub mod cancel;
pub mod claim;
pub mod classes;
pub mod lease;
pub mod logs;
pub mod read;
pub mod reaper;
pub mod retention;
pub mod retry;
pub mod submit;
pub mod valid;
pub mod wakeup;
