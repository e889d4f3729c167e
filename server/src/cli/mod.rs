//! The `flotilla` command line.
//!
//! - [`up`]: the zero-config default — private PostgreSQL, server, local
//!   agents and a local object store in one process tree.
//! - `serve` (here): the production server.
//! - [`client`]: commands that talk to a server over the REST API.

pub mod client;
pub mod roi;
pub mod tiles;
pub mod up;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use flotilla_core::api::TokenRole;
use sqlx::postgres::PgConnectOptions;

use crate::state::Settings;

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
    Serve(ServeArgs),
    /// Submit, inspect, follow and cancel jobs.
    #[command(subcommand)]
    Jobs(client::JobsCommand),
    /// List agents, or pause, drain and resume one.
    Agents(client::AgentsArgs),
    /// Make, list and revoke API tokens (admin only).
    #[command(subcommand)]
    Tokens(client::TokensCommand),
    /// opam reverse dependencies of a release, computed on the agents.
    #[command(subcommand)]
    Revdeps(client::RevdepsCommand),
    /// TESSERA tile geometry: footprints and zone-grid placement (local, no
    /// server needed).
    #[command(subcommand)]
    Tiles(tiles::TilesCommand),
    /// Regions of interest: plan, submit, follow.
    #[command(subcommand)]
    Roi(roi::RoiCommand),
    /// Datasets: a model checkpoint and where tile inputs come from.
    #[command(subcommand)]
    Datasets(roi::DatasetsCommand),
    /// Which tiles exist: import a geotessera manifest.parquet.
    #[command(subcommand)]
    Coverage(roi::CoverageCommand),
}

#[derive(clap::Args)]
pub struct ServeArgs {
    /// PostgreSQL URL, e.g. postgres://flotilla@db/flotilla (a Unix socket:
    /// postgres://user@localhost/db?host=/run/postgresql).
    #[arg(long, env = "FLOTILLA_DATABASE_URL")]
    pub database_url: String,
    /// Object store: a directory, file:///dir, or s3://bucket/prefix (with
    /// the usual AWS_* variables; AWS_ENDPOINT_URL for S3-compatible
    /// services).
    #[arg(long, env = "FLOTILLA_STORE")]
    pub store: String,
    /// Address to listen on; port 0 picks a free one (printed at start).
    #[arg(long, env = "FLOTILLA_LISTEN", default_value = "127.0.0.1:8470")]
    pub listen: SocketAddr,
    /// File holding the admin token; made (mode 0600) with a fresh token if
    /// it does not exist.
    #[arg(long, env = "FLOTILLA_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// How long a lease lives without a heartbeat, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub lease_ttl_ms: u64,
    /// Base of the retry back-off, in milliseconds (doubles per attempt).
    #[arg(long, default_value_t = 2_000)]
    pub backoff_base_ms: u64,
    /// Serve the dashboard (/ui) without a login. Only for a machine whose
    /// listening address nobody else can reach.
    #[arg(long)]
    pub no_dashboard_login: bool,
}

pub fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Command::Tiles(cmd) = cli.command {
        return tiles::tiles(cmd);
    }
    init_tracing();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        match cli.command {
            Command::Up(args) => up::run(args).await,
            Command::Serve(args) => serve(args).await,
            Command::Jobs(cmd) => client::jobs(cmd).await,
            Command::Agents(args) => client::agents(args).await,
            Command::Tokens(cmd) => client::tokens(cmd).await,
            Command::Revdeps(cmd) => client::revdeps(cmd).await,
            Command::Tiles(cmd) => tiles::tiles(cmd),
            Command::Roi(cmd) => roi::roi(cmd).await,
            Command::Datasets(cmd) => roi::datasets(cmd).await,
            Command::Coverage(cmd) => roi::coverage(cmd).await,
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

impl ServeArgs {
    pub fn settings(&self) -> Settings {
        let mut s = Settings::with_lease_ttl(Duration::from_millis(self.lease_ttl_ms.max(100)));
        s.backoff_base = Duration::from_millis(self.backoff_base_ms);
        s.dashboard_open = self.no_dashboard_login;
        s
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let opts: PgConnectOptions = args
        .database_url
        .parse()
        .context("parsing --database-url")?;
    let db = crate::serve::connect(opts, Duration::from_secs(60)).await?;
    crate::serve::migrate(&db).await?;
    if let Some(path) = &args.admin_token_file {
        let token = read_or_make_token(path)?;
        crate::auth::ensure_token(&db, &token, TokenRole::Admin, None, "admin").await?;
    }
    let store = crate::store::open(&args.store)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    println!("flotilla: listening on http://{addr}");
    let shutdown = crate::serve::shutdown_on_signals();
    crate::serve::run(listener, db, store, args.settings(), shutdown).await
}

/// Reads a token file, or writes a fresh token to it with mode 0600.
pub fn read_or_make_token(path: &std::path::Path) -> anyhow::Result<String> {
    if path.exists() {
        let t = std::fs::read_to_string(path)
            .with_context(|| format!("reading token file {}", path.display()))?;
        let t = t.trim().to_string();
        anyhow::ensure!(!t.is_empty(), "token file {} is empty", path.display());
        return Ok(t);
    }
    let token = crate::auth::new_secret();
    write_private(path, &token)?;
    Ok(token)
}

/// Writes `text` to `path` readable by the owner only, via a temporary file
/// renamed into place.
pub fn write_private(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}
