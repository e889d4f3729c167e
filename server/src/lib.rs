//! # flotilla-server
//!
//! The server and the `flotilla` CLI. PostgreSQL is the only source of truth
//! for jobs; the server keeps nothing in memory that the database cannot
//! rebuild, so any number of instances may share one database.
//!
//! # Layout
//!
//! - [`serve`]: connects, migrates, and runs the HTTP server with its
//!   background tasks (reaper, NOTIFY listener) until shutdown.
//! - [`api`]: the router and its handlers, one module per resource.
//! - [`queue`]: the durable queue; owns the job tables.
//! - [`agents`]: owns the `agents` table.
//! - [`revdeps`]: opam reverse-dependency runs: plan, shards, merge.
//! - [`tiles`]: TESSERA datasets, coverage, ROI planning, tile completion.
//! - [`auth`]: hashed API tokens and the caller extractors.
//! - [`signal`]: LISTEN/NOTIFY wake-ups for long-polling agents.
//! - [`state`]: what handlers share; queue timings.
//! - [`store`]: opens the object store from a URL or a directory.
//! - [`embedded_pg`]: the private PostgreSQL cluster of `flotilla up`.
//! - [`error`]: the API error type and its JSON envelope.
//! - [`dashboard`]: the browser dashboard (askama pages, SSE updates).
//! - [`metrics`]: Prometheus `/metrics`, computed from the tables.
//! - [`cli`]: the command line: `up`, `serve` and the client commands.

pub mod agents;
pub mod api;
pub mod auth;
pub mod cli;
pub mod dashboard;
pub mod embedded_pg;
pub mod error;
pub mod metrics;
pub mod queue;
pub mod revdeps;
pub mod serve;
pub mod signal;
pub mod state;
pub mod store;
pub mod tiles;
