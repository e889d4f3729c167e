//! `flotilla-agent`: see `flotilla-agent --help`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use flotilla_agent::runner::{self, AgentConfig};
use flotilla_agent::server_api::ServerApi;

#[derive(Parser)]
#[command(
    name = "flotilla-agent",
    version,
    about = "Runs flotilla jobs on this machine",
    long_about = "Registers with a flotilla server, leases jobs while below its capacity, \
                  runs them and reports back. Make its token on the server with \
                  `flotilla tokens create --role agent --agent NAME`."
)]
struct Args {
    /// Server URL, e.g. http://flotilla.example:8470
    #[arg(long, env = "FLOTILLA_SERVER")]
    server: String,
    /// Agent token.
    #[arg(
        long,
        env = "FLOTILLA_AGENT_TOKEN",
        hide_env_values = true,
        conflicts_with = "token_file"
    )]
    token: Option<String>,
    /// File holding the agent token.
    #[arg(long, env = "FLOTILLA_AGENT_TOKEN_FILE")]
    token_file: Option<PathBuf>,
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
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLOTILLA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal, not for a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let token = match (&args.token, &args.token_file) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading token file {}", f.display()))?
            .trim()
            .to_string(),
        (None, None) => anyhow::bail!(
            "no agent token: pass --token or --token-file (make one on the server with \
             `flotilla tokens create --role agent --agent NAME`)"
        ),
    };
    let name = match args.name {
        Some(n) => n,
        None => sysinfo::System::host_name().context("no --name and no host name")?,
    };
    let capacity = args
        .capacity
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
    anyhow::ensure!(capacity >= 1, "--capacity must be at least 1");
    std::fs::create_dir_all(&args.workdir)
        .with_context(|| format!("creating work directory {}", args.workdir.display()))?;
    let workdir = args.workdir.canonicalize()?;
    let config = AgentConfig {
        name,
        labels: args.labels.into_iter().collect::<BTreeMap<_, _>>(),
        capacity,
        workdir,
        kill_grace: Duration::from_secs(args.kill_grace_s),
        lease_wait: Duration::from_secs(20),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let api = ServerApi::new(&args.server, &token)?;
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
