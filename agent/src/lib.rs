//! # flotilla-agent
//!
//! Runs on a worker: registers with the server, leases jobs while below its
//! capacity, runs them, streams their logs, uploads their outputs and
//! reports each result once. Holds no job state the server does not also
//! have; a restart hands its old leases back.
//!
//! # Layout
//!
//! - [`runner`]: the lease loop, the heartbeat loop, running one job.
//! - [`server_api`]: typed calls to the agent protocol, retried while the
//!   server is unreachable.
//! - [`process`]: runs one shell command in its own process group, streams
//!   its output lines, enforces timeout and cancellation on the whole tree.
//! - [`health`]: the host health report sent with every heartbeat.
//! - [`revdeps_job`]: phase 1 and phase-2 shards of opam revdeps runs.
//! - [`tile_job`]: TESSERA tile jobs: checkpoint cache, inputs, encoder,
//!   outputs.

pub mod health;
pub mod process;
pub mod revdeps_job;
pub mod runner;
pub mod server_api;
pub mod tile_job;
