//! # flotilla-server
//!
//! The server and the `flotilla` CLI. PostgreSQL is the only source of truth
//! for jobs; the server keeps nothing in memory that the database cannot
//! rebuild, so any number of instances may share one database.
//!
//! # Layout
//!
//! - [`serve`]: connects, migrates, and runs the HTTP server with its
//!   background tasks (reaper, NOTIFY listener, coordinator) until shutdown.
//! - [`connections`]: the accept loop: a cap on open connections, header,
//!   keep-alive and stalled-write timeouts, the TLS handshake.
//! - [`transport`]: plain HTTP, TLS served here or ended by a proxy: which
//!   an address allows, and the TLS acceptor.
//! - [`api`]: the router and its handlers, one module per resource.
//! - [`extract`]: the JSON body and id extractors the API and dashboard
//!   share.
//! - [`queue`]: the durable queue; owns the job tables (and the
//!   LISTEN/NOTIFY wake-ups of long-polling agents).
//! - [`completion`]: where an attempt's end is recorded and dispatched by
//!   job kind.
//! - [`coordinator`]: the loop that advances parents when their children
//!   end.
//! - [`agents`]: owns the `agents` table.
//! - [`agent_health`]: owns `agent_health_samples`, each agent's health
//!   reports over time.
//! - [`agent_work`]: one agent's finished attempts over a window (tiles per
//!   hour, durations per kind).
//! - [`alerts`]: what an operator must act on (a full disk, a lost agent, a
//!   stalled queue, job-time drift, open files near the limit), evaluated
//!   from the tables for the dashboard, the API and `/metrics`.
//! - [`revdeps`]: opam reverse-dependency runs: submit, read; the
//!   coordinator's shards and merge.
//! - [`pipelines`]: pipeline runs: submit, cancel, read; the engine that
//!   moves items through stages, moves, limit gates and either branches.
//! - [`tiles`]: TESSERA datasets, coverage, ROI planning, tile completion,
//!   tile statistics.
//! - [`auth`]: hashed API tokens and the caller extractors.
//! - [`state`]: what handlers share; queue timings.
//! - [`store`]: opens the object store from a URL or a directory.
//! - [`embedded_pg`]: the private PostgreSQL cluster of `flotilla up`.
//! - [`error`]: the API error type and its JSON envelope.
//! - [`dashboard`]: the browser dashboard (askama pages, SSE updates).
//! - [`metrics`]: Prometheus `/metrics`, computed from the tables.
//! - [`cli`]: the command line: `up`, `serve` and the client commands.

pub mod agent_health;
pub mod agent_work;
pub mod agents;
pub mod alerts;
pub mod api;
pub mod auth;
pub mod cli;
pub mod completion;
pub mod connections;
pub mod coordinator;
pub mod dashboard;
pub mod embedded_pg;
pub mod error;
pub mod extract;
pub mod metrics;
pub mod pipelines;
pub mod queue;
pub mod revdeps;
pub mod serve;
pub mod state;
pub mod store;
pub mod tiles;
pub mod transport;
