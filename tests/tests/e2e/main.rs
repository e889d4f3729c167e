//! The end-to-end suite, one test binary: real PostgreSQL, object stores,
//! sshd, Chromium and Prometheus, with the real `flotilla` and
//! `flotilla-agent` binaries as child processes. One module per area; run one
//! with `cargo test -p flotilla-e2e --test e2e -- MODULE::`.
//!
//! One binary rather than one per file: each test binary links the server
//! and every dependency (about 450 MB each with full debug info, 33 of them
//! filled 15 GB and a CI machine's disk); one links once, and its tests share
//! one PostgreSQL cluster. The chaos run stays a binary of its own
//! (`tests/tests/chaos`): it sets process-wide state and must not share its
//! two cores with other tests' timing.

mod agent_page;
mod agent_reports;
mod alerts;
mod browser;
mod core_queue;
mod crash;
mod dashboard;
mod deploy;
mod hostile_clients;
mod job_credentials;
mod job_logs;
mod jobs_pages;
mod layout;
mod list_pages;
mod openapi;
mod ownership;
mod pipelines;
mod pipelines_edges;
mod pipelines_engine;
mod pipelines_ssh;
mod prometheus;
mod queue_policy;
mod replicas;
mod retention;
mod revdeps_coordinator;
mod revdeps_job;
mod roi_pages;
mod s3_store;
mod submissions;
mod tile_publish;
mod tiles_bench;
mod tiles_e2e;
mod tiles_geometry;
mod tls;
mod up_tiles;
