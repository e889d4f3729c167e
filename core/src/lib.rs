//! # flotilla-core
//!
//! The contract between the flotilla server, its agents and the CLI. Nothing
//! here does I/O; every type is plain data with serde, documented like a
//! schema, so that the server and the agent depend on this crate and never on
//! each other.
//!
//! # Layout
//!
//! - [`job`]: job kinds and their specs as clients submit them, job states.
//! - [`protocol`]: the agent protocol under `/api/agent/v1` — register,
//!   lease, heartbeat, log, complete, fail — request and reply bodies.
//! - [`api`]: the REST API under `/api/v1` — request/response bodies and the
//!   error envelope.
//! - [`health`]: the host health report an agent sends with each heartbeat.
//! - [`grid`]: TESSERA tile grid geometry — tile ids, UTM projection, zone
//!   grids.
//! - [`pipeline`]: the pipeline file format, its checks and the plan the
//!   server walks.
//! - [`roi`]: regions of interest (GeoJSON or a bbox) and the tiles they cover.
//! - [`text`]: cutting text to a byte limit on a character boundary.
//! - [`tls`]: what a client says when it cannot reach the server (the
//!   causes, and what to do about a TLS failure).

pub mod api;
pub mod grid;
pub mod health;
pub mod job;
pub mod pipeline;
pub mod protocol;
pub mod roi;
pub mod text;
pub mod tls;
