//! # flotilla-agent
//!
//! Runs on a worker: registers with the server, leases jobs while below its
//! capacity, runs them, streams their logs, uploads their outputs and
//! reports each result once. Holds no job state the server does not also
//! have; a restart hands its old leases back.
//!
//! # Layout
//!
//! - [`runner`]: the loops (register, lease, heartbeat, run and report each
//!   job) over a [`runner::Server`] trait, so tests drive them with a fake
//!   server and a paused clock.
//! - [`jobs`]: how each job kind runs (`command`, `tile`, `revdeps`), the
//!   [`jobs::JobContext`] they share and the job log they write.
//! - [`process`]: every child process the agent starts: its own process
//!   group, output lines, timeout and cancellation of the whole tree.
//! - [`server_api`]: typed HTTP calls to the agent protocol, retried while
//!   the server is unreachable.
//! - [`backoff`]: the doubling, capped delay between retries.
//! - [`devices`]: what the agent computes on (CPU, encoder backend and
//!   profile), as registration reports it.
//! - [`health`]: the host health report sent with every heartbeat.

pub mod backoff;
pub mod devices;
pub mod health;
pub mod jobs;
pub mod process;
pub mod runner;
pub mod server_api;
