//! `flotilla up`: the zero-config default. One process tree holds a private
//! PostgreSQL cluster (DIR/pg, socket in DIR/run), the server, N local
//! agents (child processes) and a local object store (DIR/store). Ctrl-C or
//! SIGTERM stops the agents, then the server, then PostgreSQL; the next
//! start reuses all of it.
//!
//! # What jobs can reach
//!
//! Started as root, the local agents run jobs as an unprivileged job user
//! (`flotilla-job`, made if missing, or `--job-user`). DIR is 0711: the job
//! user passes through it to its own work directory under `DIR/work` and
//! can list or read nothing else: `admin.token`, `server.url`, `agents/`
//! (agent token files), `secrets/` (the PostgreSQL passwords), `ssh/` (the
//! agents' `--ssh-dir`: keys for ssh hosts, their known_hosts) and `store/`
//! are root's and private, `pg/` and `run/` (the socket) are `postgres`'s
//! and private. Started as an ordinary user, jobs run as that user and can
//! read all of it; `up` says so once at start.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use flotilla_core::api::TokenRole;

use crate::embedded_pg::account::Account;
use crate::embedded_pg::EmbeddedPostgres;
use crate::transport::{ExposureError, Transport};

#[derive(clap::Args)]
pub struct UpArgs {
    /// Where everything lives.
    #[arg(long, default_value = "./flotilla-data")]
    pub data: PathBuf,
    /// Address to serve on (plain HTTP); port 0 picks a free one. One other
    /// machines can reach needs --behind-tls-proxy (or `flotilla serve`
    /// with TLS).
    #[arg(long, default_value = "127.0.0.1:8470")]
    pub listen: SocketAddr,
    /// A proxy in front terminates TLS and only it reaches --listen (see
    /// `flotilla serve --help`).
    #[arg(long, env = "FLOTILLA_BEHIND_TLS_PROXY")]
    pub behind_tls_proxy: bool,
    /// Local agents to start.
    #[arg(long, default_value_t = 1)]
    pub agents: u32,
    /// Slots per local agent [default: the number of cores].
    #[arg(long)]
    pub capacity: Option<u32>,
    /// How long a lease lives without a heartbeat, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub lease_ttl_ms: u64,
    /// Serve the dashboard without a login (refused on a --listen other
    /// than loopback).
    #[arg(long)]
    pub no_dashboard_login: bool,
    /// The unprivileged user local agents run jobs as; only when started as
    /// root [default as root: flotilla-job, made if missing].
    #[arg(long)]
    pub job_user: Option<String>,
}

impl UpArgs {
    /// `up` serves plain HTTP: on loopback, or behind a TLS proxy.
    fn transport(&self) -> Result<Transport, ExposureError> {
        crate::transport::transport_for(
            self.listen,
            false,
            self.behind_tls_proxy,
            self.no_dashboard_login,
        )
    }
}

const DATABASE: &str = "flotilla";

/// The job user `up` makes when started as root without --job-user.
const DEFAULT_JOB_USER: &str = "flotilla-job";

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    args.transport()?;
    let shutdown = crate::serve::shutdown_on_signals();
    std::fs::create_dir_all(&args.data)
        .with_context(|| format!("creating {}", args.data.display()))?;
    let data = args.data.canonicalize()?;
    let job_user = job_user(&args, &data)?;
    let pg = EmbeddedPostgres::start(&data).await?;
    let result = run_with_pg(&args, &data, &pg, job_user.as_ref(), shutdown).await;
    if let Err(e) = pg.stop().await {
        tracing::error!(error = %e, "stopping PostgreSQL");
    }
    result
}

/// Who local agents run jobs as: as root, the job user (made if it is the
/// default and missing), with DIR passable but not listable and its work
/// directory reachable; otherwise nobody else, which is said once.
fn job_user(args: &UpArgs, data: &Path) -> anyhow::Result<Option<Account>> {
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::geteuid().is_root() {
        anyhow::ensure!(
            args.job_user.is_none(),
            "--job-user needs `flotilla up` to run as root (it switches to that user for each job)"
        );
        let me = nix::unistd::User::from_uid(nix::unistd::geteuid())
            .ok()
            .flatten()
            .map_or_else(|| format!("uid {}", nix::unistd::geteuid()), |u| u.name);
        // Other local users, at least, are kept out.
        std::fs::set_permissions(data, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("setting the mode of {}", data.display()))?;
        eprintln!(
            "flotilla up: jobs run as `{me}`, with all of that user's rights: they can read \
             {} (the admin token, agent tokens, database passwords) and use the database. \
             To isolate them, start `flotilla up` as root (jobs then run as the unprivileged \
             user `{DEFAULT_JOB_USER}`), or run agents as root with --job-user USER.",
            data.display()
        );
        return Ok(None);
    }
    let name = args.job_user.as_deref().unwrap_or(DEFAULT_JOB_USER);
    let user = match Account::lookup(name)? {
        Some(u) => u,
        None if args.job_user.is_none() => make_job_user(name)?,
        None => anyhow::bail!(
            "--job-user {name}: no such user (make one, e.g. `useradd --system --no-create-home \
             --shell /usr/sbin/nologin {name}`)"
        ),
    };
    anyhow::ensure!(
        user.uid != 0,
        "--job-user {name} is root; name an unprivileged user"
    );
    std::fs::set_permissions(data, std::fs::Permissions::from_mode(0o711))
        .with_context(|| format!("setting the mode of {}", data.display()))?;
    let work = data.join("work");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o711))
        .with_context(|| format!("setting the mode of {}", work.display()))?;
    if let Some((blocker, mode)) = user.first_closed(&work)? {
        anyhow::bail!(
            "jobs run as `{name}`, which cannot reach {}: {} (mode {mode:03o}) does not let it \
             pass. flotilla does not open up directories it did not make; choose a data \
             directory under one that others may enter (e.g. --data /var/lib/flotilla), or \
             allow it yourself (`chmod o+x {}`)",
            work.display(),
            blocker.display(),
            blocker.display()
        );
    }
    tracing::info!(
        user = name,
        uid = user.uid,
        "local agents run jobs as the job user"
    );
    Ok(Some(user))
}

/// `useradd --system` with no home and no login shell.
fn make_job_user(name: &str) -> anyhow::Result<Account> {
    tracing::info!(user = name, "making the job user");
    let out = std::process::Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ])
        .stdin(Stdio::null())
        .output()
        .context("running useradd to make the job user")?;
    // Another `up` may have made it at the same moment (useradd exits 9).
    if let Some(user) = Account::lookup(name)? {
        return Ok(user);
    }
    anyhow::bail!(
        "could not make the job user `{name}` (useradd {}: {}); make it yourself or pass \
         --job-user USER",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )
}

/// Keeps `path` (a directory) to its owner: 0700.
fn private_dir(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("setting the mode of {}", path.display()))
}

async fn run_with_pg(
    args: &UpArgs,
    data: &Path,
    pg: &EmbeddedPostgres,
    job_user: Option<&Account>,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    pg.ensure_database(DATABASE)
        .await
        .context("creating the flotilla database")?;
    let opts = crate::serve::with_statement_timeout(
        pg.connect_options(DATABASE),
        crate::serve::DEFAULT_STATEMENT_TIMEOUT,
    );
    let db = crate::serve::connect(opts, Duration::from_secs(30)).await?;
    crate::serve::migrate(&db).await?;

    let admin_file = data.join("admin.token");
    let admin = super::serve::read_or_make_token(&admin_file)?;
    crate::auth::ensure_token(&db, &admin, TokenRole::Admin, None, "admin").await?;

    private_dir(&data.join("store"))?;
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
    settings.sweep.local_root = Some(data.join("store"));
    settings.transport = args.transport()?;
    let server = tokio::spawn(crate::serve::run(
        listener,
        db.clone(),
        store,
        settings,
        None,
        shutdown.clone(),
    ));

    let mut agents = Vec::new();
    private_dir(&data.join("agents"))?;
    // The local agents' --ssh-dir: keys a pipeline's ssh hosts name
    // (`key NAME`) go in DIR/ssh/keys, their host keys in DIR/ssh/known_hosts.
    private_dir(&data.join("ssh"))?;
    private_dir(&data.join("ssh").join("keys"))?;
    for i in 1..=args.agents {
        let name = format!("local-{i}");
        let token_file = data.join("agents").join(format!("{name}.token"));
        let token = super::serve::read_or_make_token(&token_file)?;
        crate::auth::ensure_token(&db, &token, TokenRole::Agent, Some(&name), &name).await?;
        agents.push(spawn_agent(
            &url,
            &name,
            &token_file,
            data,
            args.capacity,
            job_user,
        )?);
    }

    println!("flotilla is up at {url}");
    println!("  dashboard:   {url}/ui (log in with the admin token)");
    println!("  admin token: {}", admin_file.display());
    println!(
        "  database:    {} (password in {})",
        pg.display_url(DATABASE),
        pg.password_file(crate::embedded_pg::auth::OWNER).display()
    );
    println!("  results:     {}", data.join("store").display());
    match job_user {
        Some(u) => println!(
            "  agents:      {} local, jobs run as {}",
            args.agents, u.name
        ),
        None => println!("  agents:      {} local", args.agents),
    }
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
    job_user: Option<&Account>,
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
        .arg("--ssh-dir")
        .arg(data.join("ssh"))
        // The agent refuses a token in its environment.
        .env_remove("FLOTILLA_AGENT_TOKEN")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if let Some(c) = capacity {
        cmd.arg("--capacity").arg(c.to_string());
    }
    if let Some(u) = job_user {
        cmd.arg("--job-user").arg(&u.name);
    }
    cmd.spawn().with_context(|| {
        format!(
            "starting the local agent {} (build it with `cargo build --release`)",
            bin.display()
        )
    })
}
