//! `flotilla-agent`: see `flotilla-agent --help`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use flotilla_agent::process::user::JobUser;
use flotilla_agent::process::RunAs;
use flotilla_agent::runner::{self, AgentConfig};
use flotilla_agent::server_api::ServerApi;

#[derive(Parser)]
#[command(
    name = "flotilla-agent",
    version,
    about = "Runs flotilla jobs on this machine",
    long_about = "Registers with a flotilla server, leases jobs while below its capacity, \
                  runs them and reports back. Make its token on the server with \
                  `flotilla tokens create --role agent --agent NAME` and give it in a file \
                  readable by the agent's user only (--token-file).\n\n\
                  Jobs start from an empty environment plus PATH, LANG, LC_*, TZ, TERM, \
                  HOME, USER, LOGNAME, SHELL (of the user they run as), the names given \
                  with --pass-env and their own variables. With --job-user (Linux, agent \
                  run as root) they run as that unprivileged user, which can read nothing \
                  of the agent's but the job's own directory.\n\n\
                  Pipeline steps on ssh hosts need --ssh-dir DIR: the agent logs in only \
                  with keys in DIR/keys (a pipeline names one with `key NAME`), only to \
                  hosts in DIR/known_hosts, and with no ssh settings but the DIR/ssh_config \
                  it writes (no ~/.ssh/config, no ssh-agent). Without it the agent takes \
                  no step on an ssh host."
)]
struct Args {
    /// Server URL, e.g. https://flotilla.example:8470; or several,
    /// comma-separated (replicas on one database, or the same server
    /// behind other addresses): the agent uses the first until it stops
    /// answering, then the next in turn.
    #[arg(long, env = "FLOTILLA_SERVER", value_delimiter = ',', required = true)]
    server: Vec<String>,
    /// CA certificate(s) (PEM) to trust for an https:// server besides the
    /// public ones: the server's own CA, or its self-signed certificate.
    #[arg(long, env = "FLOTILLA_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// File holding the agent token, readable by the agent's user only
    /// (the token is never taken from the command line or the environment,
    /// where a job could read it).
    #[arg(long, env = "FLOTILLA_AGENT_TOKEN_FILE")]
    token_file: PathBuf,
    /// Run jobs' processes as this unprivileged user (Linux; the agent must
    /// run as root). Their work directories are handed to it; nothing else
    /// of the agent's is readable by it.
    #[arg(long, env = "FLOTILLA_JOB_USER")]
    job_user: Option<String>,
    /// A variable of the agent's environment to pass on to every job
    /// (repeatable); jobs get no others beyond a short allowlist.
    #[arg(long = "pass-env", value_name = "NAME", value_parser = flotilla_agent::process::env::parse_pass_env)]
    pass_env: Vec<String>,
    /// This agent's name (the token is bound to it) [default: the host name].
    #[arg(long, env = "FLOTILLA_AGENT_NAME")]
    name: Option<String>,
    /// A label jobs can require, key=value (repeatable).
    #[arg(long = "label", value_parser = parse_kv)]
    labels: Vec<(String, String)>,
    /// Slots: the sum of running jobs' costs never exceeds this
    /// [default: the number of cores].
    #[arg(long)]
    capacity: Option<u32>,
    /// Where jobs run and temporary files go.
    #[arg(
        long,
        env = "FLOTILLA_AGENT_WORKDIR",
        default_value = "./flotilla-agent-work"
    )]
    workdir: PathBuf,
    /// Seconds between SIGTERM and SIGKILL when stopping a job.
    #[arg(long, default_value_t = 10)]
    kill_grace_s: u64,
    /// Seconds a job's report (or a batch of its log) is retried while the
    /// server is unreachable or failing; then the agent drops the job's
    /// lease and the server requeues it.
    #[arg(long, default_value_t = runner::DEFAULT_REPORT_BUDGET.as_secs())]
    report_budget_s: u64,
    /// How many failed attempts' work directories to keep for a look (the
    /// most recent); every other attempt's is removed when it ends.
    #[arg(long, default_value_t = flotilla_agent::jobs::workdirs::DEFAULT_KEEP_FAILED)]
    keep_failed_dirs: usize,
    /// Reach pipelines' ssh hosts with what this directory holds: private
    /// keys in DIR/keys (named by `key NAME`), host keys in
    /// DIR/known_hosts; the agent writes DIR/ssh_config, the only ssh
    /// settings it uses. Without it, no ssh host is reached.
    #[arg(long, env = "FLOTILLA_SSH_DIR", value_name = "DIR")]
    ssh_dir: Option<PathBuf>,
    /// Take a host's key the first time it is seen and add it to
    /// --ssh-dir's known_hosts, instead of refusing a host not there.
    #[arg(long, requires = "ssh_dir")]
    ssh_accept_new: bool,
    /// Tile jobs' encoder settings (chunk, block, threads, dtype per device),
    /// as `tessera-encode tune --out FILE` writes them on this machine
    /// [default: WORKDIR/encoder-profiles.toml where that exists, else the
    /// untuned defaults]. The profile in use is shown on the dashboard.
    #[arg(long, env = "FLOTILLA_ENCODER_PROFILE", value_name = "FILE")]
    encoder_profile: Option<PathBuf>,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("`{s}` is not key=value"))
}

fn main() -> std::process::ExitCode {
    match real_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flotilla-agent: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main() -> anyhow::Result<()> {
    // A token in the environment is readable by every process of the same
    // user through /proc/PID/environ; refuse it rather than ignore it.
    if std::env::var_os("FLOTILLA_AGENT_TOKEN").is_some() {
        anyhow::bail!(
            "FLOTILLA_AGENT_TOKEN is no longer read: a token in the environment (or on the \
             command line) is readable by jobs through /proc. Put the token in a file readable \
             only by the agent's user (chmod 600), pass it with --token-file PATH (or \
             FLOTILLA_AGENT_TOKEN_FILE=PATH), and unset FLOTILLA_AGENT_TOKEN"
        );
    }
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLOTILLA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal, not for a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let token = read_token(&args.token_file)?;
    let name = match args.name {
        Some(n) => n,
        None => sysinfo::System::host_name().context("no --name and no host name")?,
    };
    let capacity = args
        .capacity
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
    anyhow::ensure!(capacity >= 1, "--capacity must be at least 1");
    let run_as = match &args.job_user {
        Some(user) => RunAs::job_user(JobUser::lookup(user)?, &args.pass_env),
        None => RunAs::agent_user(&args.pass_env),
    };
    let workdir = prepare_workdir(&args.workdir, &run_as)?;
    let ssh_dir = match &args.ssh_dir {
        Some(dir) => Some(
            flotilla_agent::jobs::step::SshDir::prepare(dir, args.ssh_accept_new)
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        ),
        None => None,
    };
    let encoder_profile =
        flotilla_agent::devices::profile_file(args.encoder_profile.as_deref(), &workdir)?;
    let config = AgentConfig {
        name,
        labels: args.labels.into_iter().collect::<BTreeMap<_, _>>(),
        capacity,
        workdir,
        kill_grace: Duration::from_secs(args.kill_grace_s),
        lease_wait: Duration::from_secs(20),
        run_as,
        report_budget: Duration::from_secs(args.report_budget_s),
        keep_failed_dirs: args.keep_failed_dirs,
        ssh_dir,
        encoder_profile,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let roots = match &args.ca_file {
            Some(path) => read_ca_file(path)?,
            None => Vec::new(),
        };
        let api = ServerApi::trusting_any(&args.server, &token, roots)?;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let s = shutdown.clone();
        tokio::spawn(async move {
            #[cfg(unix)]
            {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .expect("installing a SIGTERM handler succeeds at start-up");
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            #[cfg(not(unix))]
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("stopping: running jobs are handed back");
            s.cancel();
        });
        runner::run(api, config, shutdown).await
    })
}

/// The certificates of `--ca-file`.
fn read_ca_file(path: &Path) -> anyhow::Result<Vec<reqwest::Certificate>> {
    let pem =
        std::fs::read(path).with_context(|| format!("reading --ca-file {}", path.display()))?;
    let roots = reqwest::Certificate::from_pem_bundle(&pem)
        .with_context(|| format!("reading the certificates in --ca-file {}", path.display()))?;
    anyhow::ensure!(
        !roots.is_empty(),
        "--ca-file {} holds no certificate (a PEM `BEGIN CERTIFICATE` block)",
        path.display()
    );
    Ok(roots)
}

/// Reads the token file, warning when others than its owner may read it.
fn read_token(path: &Path) -> anyhow::Result<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)
            .with_context(|| format!("reading token file {}", path.display()))?;
        if meta.mode() & 0o077 != 0 {
            tracing::warn!(
                file = %path.display(),
                mode = format!("{:03o}", meta.mode() & 0o777),
                "the token file is readable by its group or others; `chmod 600` it",
            );
        }
    }
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("reading token file {}", path.display()))?
        .trim()
        .to_string();
    anyhow::ensure!(
        !token.is_empty(),
        "token file {} is empty (make a token on the server with \
         `flotilla tokens create --role agent --agent NAME`)",
        path.display()
    );
    Ok(token)
}

/// Makes the work directory. With a job user, it and its `jobs/` are
/// 0711 and the agent's: the job user may pass through to its own job's
/// directory (0700, its own) but list or read nothing else; the parents must
/// let it pass too, which is checked here rather than at the first job.
fn prepare_workdir(dir: &Path, run_as: &RunAs) -> anyhow::Result<PathBuf> {
    let jobs = dir.join("jobs");
    std::fs::create_dir_all(&jobs)
        .with_context(|| format!("creating work directory {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    #[cfg(unix)]
    if let Some(user) = &run_as.user {
        use std::os::unix::fs::PermissionsExt;
        for d in [dir.clone(), dir.join("jobs")] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o711))
                .with_context(|| format!("setting the mode of {}", d.display()))?;
        }
        user.check_reachable(&dir.join("jobs"))?;
        tracing::info!(
            user = user.name(),
            uid = user.uid(),
            "jobs run as the job user"
        );
    }
    #[cfg(not(unix))]
    let _ = run_as;
    Ok(dir)
}
