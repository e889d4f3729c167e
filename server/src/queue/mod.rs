//! The durable job queue, hand-written on SQL. This module owns the `jobs`,
//! `job_attempts`, `job_logs` and `job_outputs` tables: no other module
//! writes them.
//!
//! Every transition is one statement guarded by the current state (and, for
//! agents, the lease token and agent id), so a crash between any two leaves
//! a state the next start continues from, and a call from a stale attempt
//! changes nothing.
//!
//! - [`submit`]: insert jobs in one transaction, with fair-share tags, and
//!   NOTIFY waiting agents.
//! - [`claim`]: the `FOR UPDATE SKIP LOCKED` claim that also sets the lease.
//! - [`lease`]: what an agent does with a lease: start, heartbeat, log,
//!   output, complete, fail.
//! - [`reaper`]: re-queues jobs whose lease expired, with back-off.
//! - [`read`]: job views, lists and logs for the API; cancel.

pub mod claim;
pub mod lease;
pub mod read;
pub mod reaper;
pub mod submit;

/// The NOTIFY channel that wakes long-polling agents on every server.
pub const JOBS_CHANNEL: &str = "flotilla_jobs";

/// SQL list of the states in which a job holds a lease.
pub const ACTIVE: &str = "('leased', 'running')";
/// SQL list of the states in which a job waits to be claimed.
pub const READY: &str = "('queued', 'retrying')";
