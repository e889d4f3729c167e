//! `flotilla up`: the zero-config default. One process tree holds a private
//! PostgreSQL cluster (DIR/pg, socket in DIR/run), the server, N local
//! agents (child processes) and a local object store (DIR/store). Ctrl-C or
//! SIGTERM stops the agents, then the server, then PostgreSQL; the next
//! start reuses all of it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use flotilla_core::api::TokenRole;

use crate::embedded_pg::EmbeddedPostgres;

#[derive(clap::Args)]
pub struct UpArgs {
    /// Where everything lives.
    #[arg(long, default_value = "./flotilla-data")]
    pub data: PathBuf,
    /// Address to serve on; port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:8470")]
    pub listen: SocketAddr,
    /// Local agents to start.
    #[arg(long, default_value_t = 1)]
    pub agents: u32,
    /// Slots per local agent [default: the number of cores].
    #[arg(long)]
    pub capacity: Option<u32>,
    /// How long a lease lives without a heartbeat, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub lease_ttl_ms: u64,
    /// Serve the dashboard without a login (it listens on loopback by
    /// default; never combine with a public --listen).
    #[arg(long)]
    pub no_dashboard_login: bool,
}

const DATABASE: &str = "flotilla";

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    let shutdown = crate::serve::shutdown_on_signals();
    std::fs::create_dir_all(&args.data)
        .with_context(|| format!("creating {}", args.data.display()))?;
    let data = args.data.canonicalize()?;
    let pg = EmbeddedPostgres::start(&data).await?;
    let result = run_with_pg(&args, &data, &pg, shutdown).await;
    if let Err(e) = pg.stop().await {
        tracing::error!(error = %e, "stopping PostgreSQL");
    }
    result
}

async fn run_with_pg(
    args: &UpArgs,
    data: &Path,
    pg: &EmbeddedPostgres,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    pg.ensure_database(DATABASE)
        .await
        .context("creating the flotilla database")?;
    let db = crate::serve::connect(pg.connect_options(DATABASE), Duration::from_secs(30)).await?;
    crate::serve::migrate(&db).await?;

    let admin_file = data.join("admin.token");
    let admin = super::serve::read_or_make_token(&admin_file)?;
    crate::auth::ensure_token(&db, &admin, TokenRole::Admin, None, "admin").await?;

    let store = crate::store::open(&data.join("store").to_string_lossy())?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| {
            format!(
                "binding {} (is another flotilla running? try --listen 127.0.0.1:0)",
                args.listen
            )
        })?;
    let addr = listener.local_addr()?;
    let url = format!("http://{addr}");
    super::serve::write_private(&data.join("server.url"), &url)?;

    let mut settings =
        crate::state::Settings::with_lease_ttl(Duration::from_millis(args.lease_ttl_ms.max(100)));
    settings.dashboard_open = args.no_dashboard_login;
    let server = tokio::spawn(crate::serve::run(
        listener,
        db.clone(),
        store,
        settings,
        shutdown.clone(),
    ));

    let mut agents = Vec::new();
    for i in 1..=args.agents {
        let name = format!("local-{i}");
        let token_file = data.join("agents").join(format!("{name}.token"));
        let token = super::serve::read_or_make_token(&token_file)?;
        crate::auth::ensure_token(&db, &token, TokenRole::Agent, Some(&name), &name).await?;
        agents.push(spawn_agent(&url, &name, &token_file, data, args.capacity)?);
    }

    println!("flotilla is up at {url}");
    println!("  dashboard:   {url}/ui (log in with the admin token)");
    println!("  admin token: {}", admin_file.display());
    println!("  database:    {}", pg.database_url(DATABASE));
    println!("  results:     {}", data.join("store").display());
    println!("  agents:      {} local", args.agents);
    println!("Try: flotilla jobs submit --wait -- echo hello   (Ctrl-C here stops everything)");

    shutdown.cancelled().await;
    for agent in &agents {
        if let Some(pid) = agent.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
    for mut agent in agents {
        if tokio::time::timeout(Duration::from_secs(20), agent.wait())
            .await
            .is_err()
        {
            let _ = agent.kill().await;
        }
    }
    server.await.context("server task")??;
    Ok(())
}

/// The `flotilla-agent` binary: beside ours (cargo and packages put them
/// together), else on PATH.
pub fn agent_binary() -> PathBuf {
    let exe_name = format!("flotilla-agent{}", std::env::consts::EXE_SUFFIX);
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(&exe_name)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(exe_name))
}

fn spawn_agent(
    url: &str,
    name: &str,
    token_file: &Path,
    data: &Path,
    capacity: Option<u32>,
) -> anyhow::Result<tokio::process::Child> {
    let bin = agent_binary();
    let mut cmd = tokio::process::Command::new(&bin);
    cmd.arg("--server")
        .arg(url)
        .arg("--token-file")
        .arg(token_file)
        .arg("--name")
        .arg(name)
        .arg("--workdir")
        .arg(data.join("work").join(name))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if let Some(c) = capacity {
        cmd.arg("--capacity").arg(c.to_string());
    }
    cmd.spawn().with_context(|| {
        format!(
            "starting the local agent {} (build it with `cargo build --release`)",
            bin.display()
        )
    })
}
