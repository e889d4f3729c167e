//! `flotilla revdeps submit|show|list`: opam reverse-dependency runs.

use std::time::Duration;

use anyhow::{bail, Context};
use clap::Subcommand;
use flotilla_core::api::revdeps::{RunList, RunState, RunView, SubmitRevdeps};
use flotilla_core::api::Created;
use flotilla_core::job::RevdepsQuery;

use super::http::Conn;

#[derive(Subcommand)]
pub enum RevdepsCommand {
    /// Which opam packages depend on TARGET and are coinstallable with it on
    /// COMPILER: phase 1 on one agent, phase 2 sharded over free agents.
    Submit {
        /// `name.version`, e.g. dune.3.20.2.
        target: String,
        /// The opam repository on the agents, PATH[:REV].
        #[arg(long)]
        repo: String,
        /// The invariant compiler, e.g. ocaml-base-compiler.4.14.2.
        #[arg(long)]
        compiler: String,
        /// union, depopts, recursive or with-test-depopts.
        #[arg(long, default_value = "union", value_parser = parse_query)]
        query: RevdepsQuery,
        /// Candidates per phase-2 shard.
        #[arg(long, default_value_t = 4000)]
        shard_size: u32,
        #[command(flatten)]
        // Boxed: seven flags would make this variant many times the others.
        host: Box<HostArgs>,
        /// Wait and print the answer, one `name.version` a line.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Show a run (state, progress, timings) as JSON.
    Show {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Runs newest first, a page at a time: the next page is the same
    /// command with `--before` the id it prints last (on stderr).
    List {
        /// Only runs older than this one (the previous page's last).
        #[arg(long)]
        before: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Print JSON (`runs` and the `next` cursor).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
}

/// The host the question is asked on: opam's host variables (each
/// defaulting to the Debian 12 x86_64 host, opam 2.1.2) and the system
/// packages it cannot provide.
#[derive(clap::Args)]
pub struct HostArgs {
    /// opam's `arch` [default: x86_64].
    #[arg(long)]
    arch: Option<String>,
    /// opam's `os` [default: linux].
    #[arg(long)]
    os: Option<String>,
    /// opam's `os-family` [default: debian].
    #[arg(long)]
    os_family: Option<String>,
    /// opam's `os-distribution` [default: debian].
    #[arg(long)]
    os_distribution: Option<String>,
    /// opam's `os-version` [default: 12].
    #[arg(long)]
    os_version: Option<String>,
    /// opam's `opam-version` [default: 2.1.2].
    #[arg(long)]
    opam_version: Option<String>,
    /// System packages the host cannot provide, one a line, `#` comments
    /// (`opam-revdeps --list-host-depexts` lists those to check) [default:
    /// the bundled list on Debian 12, none on another host].
    #[arg(long, value_name = "FILE")]
    missing_depexts: Option<std::path::PathBuf>,
}

impl HostArgs {
    fn apply(self, mut body: SubmitRevdeps) -> anyhow::Result<SubmitRevdeps> {
        for (given, field) in [
            (self.arch, &mut body.arch),
            (self.os, &mut body.os),
            (self.os_family, &mut body.os_family),
            (self.os_distribution, &mut body.os_distribution),
            (self.os_version, &mut body.os_version),
            (self.opam_version, &mut body.opam_version),
        ] {
            if let Some(v) = given {
                *field = v;
            }
        }
        if let Some(file) = self.missing_depexts {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading --missing-depexts {}", file.display()))?;
            body.missing_depexts = Some(
                text.lines()
                    .map(|l| l.split('#').next().unwrap_or("").trim())
                    .filter(|l| !l.is_empty())
                    .map(str::to_string)
                    .collect(),
            );
        }
        Ok(body)
    }
}

pub async fn revdeps(cmd: RevdepsCommand) -> anyhow::Result<()> {
    match cmd {
        RevdepsCommand::Submit {
            target,
            repo,
            compiler,
            query,
            shard_size,
            host,
            wait,
            conn,
        } => {
            let client = conn.client()?;
            let body = host.apply(SubmitRevdeps {
                query,
                shard_size,
                ..SubmitRevdeps::new(target, compiler, repo)
            })?;
            let created: Created = client.post("/api/v1/revdeps", &body).await?;
            if !wait {
                println!("{}", created.id);
                return Ok(());
            }
            eprintln!("run {}", created.id);
            loop {
                let run: RunView = client
                    .get(&format!("/api/v1/revdeps/{}", created.id))
                    .await?;
                match run.state {
                    RunState::Done => {
                        for line in run.result.unwrap_or_default() {
                            println!("{line}");
                        }
                        eprintln!(
                            "timings: {}",
                            serde_json::to_string(&run.timings.unwrap_or_default())?
                        );
                        return Ok(());
                    }
                    RunState::Failed => {
                        bail!("run failed: {}", run.error.unwrap_or_default())
                    }
                    RunState::Planning | RunState::Solving => {
                        let shown = |n: Option<i32>| n.map_or("?".to_string(), |n| n.to_string());
                        eprint!(
                            "\r{}: {} candidates, {}/{} shards done   ",
                            run.state.as_str(),
                            shown(run.candidates),
                            run.shards_done,
                            shown(run.shards)
                        );
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        }
        RevdepsCommand::Show { id, conn } => {
            let run: RunView = conn.client()?.get(&format!("/api/v1/revdeps/{id}")).await?;
            println!("{}", serde_json::to_string_pretty(&run)?);
            Ok(())
        }
        RevdepsCommand::List {
            before,
            limit,
            json,
            conn,
        } => {
            let list: RunList = conn
                .client()?
                .get(&super::page_path(
                    "/api/v1/revdeps",
                    limit,
                    before.as_deref(),
                ))
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(());
            }
            println!(
                "{:<36}  {:<8}  {:<28}  {:<17}  {:>9}  {:>6}  CREATED (UTC)",
                "ID", "STATE", "TARGET", "QUERY", "SHARDS", "ANSWER"
            );
            let shown = |n: Option<i64>| n.map_or("-".to_string(), |n| n.to_string());
            for r in &list.runs {
                println!(
                    "{:<36}  {:<8}  {:<28}  {:<17}  {:>9}  {:>6}  {}",
                    r.id,
                    r.state.as_str(),
                    r.target,
                    r.query,
                    format!("{}/{}", r.shards_done, shown(r.shards.map(i64::from))),
                    shown(r.answer_len),
                    r.created_at.format("%Y-%m-%d %H:%M:%S")
                );
            }
            if let Some(next) = list.next {
                eprintln!("older runs: --before {next}");
            }
            Ok(())
        }
    }
}

fn parse_query(s: &str) -> Result<RevdepsQuery, String> {
    s.parse()
        .map_err(|e: flotilla_core::job::UnknownRevdepsQuery| e.to_string())
}
