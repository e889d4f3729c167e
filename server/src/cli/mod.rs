//! The `flotilla` command line.
//!
//! - [`up`]: the zero-config default — private PostgreSQL, server, local
//!   agents and a local object store in one process tree.
//! - [`serve`]: the production server.
//! - [`http`]: the client of the commands below (server URL, token, calls).
//! - [`jobs`], [`agents`], [`tokens`], [`revdeps`], [`pipeline`], [`rois`], [`datasets`]
//!   (with `coverage`): one module per command group that talks to a
//!   server over the REST API.
//! - [`tiles`]: tile geometry, computed locally.

pub mod agents;
pub mod datasets;
pub mod http;
pub mod jobs;
pub mod pipeline;
pub mod revdeps;
pub mod rois;
pub mod serve;
pub mod tiles;
pub mod tokens;
pub mod up;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "flotilla",
    version,
    about = "A job orchestrator for a fleet of workers",
    long_about = "flotilla keeps every job in PostgreSQL and hands work to agents on the \
                  workers.\n\nStart here: `flotilla up` runs a server with a private \
                  PostgreSQL, a local agent and a local object store.\nThen, in another \
                  terminal: `flotilla jobs submit -- echo hello` and `flotilla jobs wait ID`."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run everything locally: private PostgreSQL in DIR/pg, the server,
    /// N local agents and an object store in DIR/store.
    Up(up::UpArgs),
    /// Run the server against an existing PostgreSQL and object store.
    Serve(serve::ServeArgs),
    /// Submit, inspect, follow and cancel jobs.
    #[command(subcommand)]
    Jobs(jobs::JobsCommand),
    /// List agents, or pause, drain and resume one.
    Agents(agents::AgentsArgs),
    /// Make, list and revoke API tokens (admin only).
    #[command(subcommand)]
    Tokens(tokens::TokensCommand),
    /// opam reverse dependencies of a release, computed on the agents.
    #[command(subcommand)]
    Revdeps(revdeps::RevdepsCommand),
    /// Multi-host pipelines: check a pipeline file, run it and follow it,
    /// status, cancel, list.
    #[command(subcommand)]
    Pipeline(pipeline::PipelineCommand),
    /// TESSERA tile geometry: footprints and zone-grid placement (local, no
    /// server needed).
    #[command(subcommand)]
    Tiles(tiles::TilesCommand),
    /// Regions of interest: plan, submit, follow.
    #[command(subcommand)]
    Roi(rois::RoiCommand),
    /// Datasets: a model checkpoint and where tile inputs come from.
    #[command(subcommand)]
    Datasets(datasets::DatasetsCommand),
    /// Which tiles exist: import a geotessera manifest.parquet.
    #[command(subcommand)]
    Coverage(datasets::CoverageCommand),
    /// Internal: dry-load an uploaded checkpoint under resource limits (the
    /// server runs this in a child process; see `tiles::checkpoint_check`).
    #[command(name = "__check-checkpoint", hide = true)]
    CheckCheckpoint(crate::tiles::sandbox::ChildArgs),
    /// Internal: read an uploaded coverage manifest under resource limits
    /// (the server runs this in a child process; see `tiles::manifest`).
    #[command(name = "__read-manifest", hide = true)]
    ReadManifest(crate::tiles::sandbox::ChildArgs),
}

pub fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Command::Tiles(cmd) = cli.command {
        return tiles::tiles(cmd);
    }
    // Before any runtime or thread exists: the child limits its own
    // address space, which every thread's stack would count against.
    if let Command::CheckCheckpoint(args) = &cli.command {
        std::process::exit(crate::tiles::checkpoint_check::child_main(args));
    }
    if let Command::ReadManifest(args) = &cli.command {
        std::process::exit(crate::tiles::manifest::child_main(args));
    }
    init_tracing();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        match cli.command {
            Command::Up(args) => up::run(args).await,
            Command::Serve(args) => serve::serve(args).await,
            Command::Jobs(cmd) => jobs::jobs(cmd).await,
            Command::Agents(args) => agents::agents(args).await,
            Command::Tokens(cmd) => tokens::tokens(cmd).await,
            Command::Revdeps(cmd) => revdeps::revdeps(cmd).await,
            Command::Pipeline(cmd) => pipeline::pipeline(cmd).await,
            Command::Tiles(cmd) => tiles::tiles(cmd),
            Command::Roi(cmd) => rois::roi(cmd).await,
            Command::Datasets(cmd) => datasets::datasets(cmd).await,
            Command::Coverage(cmd) => datasets::coverage(cmd).await,
            // Run above, before the runtime.
            Command::CheckCheckpoint(_) | Command::ReadManifest(_) => Ok(()),
        }
    })
}

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("FLOTILLA_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,tower_http=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal, not for a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Prints an API answer as indented JSON.
fn print_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// `path?limit=…&before=…`: one page of a list newest first, older than the
/// cursor `before` (what the previous page printed) when given.
fn page_path(path: &str, limit: u32, before: Option<&str>) -> String {
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    query.append_pair("limit", &limit.to_string());
    if let Some(before) = before {
        query.append_pair("before", before);
    }
    format!("{path}?{}", query.finish())
}
