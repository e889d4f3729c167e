//! `flotilla jobs submit|show|list|log|cancel|wait`: command jobs.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::{Args, Subcommand};
use flotilla_core::api::{CancelReply, Created, JobList, JobView, SubmitJob};
use flotilla_core::job::{CommandJob, JobSpec};

use super::http::{Client, Conn};

#[derive(Subcommand)]
pub enum JobsCommand {
    /// Submit a shell command: `flotilla jobs submit -- make -j8 test`.
    Submit(SubmitArgs),
    /// Show one job as JSON.
    Show {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// List recent jobs.
    List {
        /// Only jobs in this state (queued, running, succeeded, …).
        #[arg(long)]
        state: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[command(flatten)]
        conn: Conn,
    },
    /// Print a job's log; with --follow, keep printing until it ends.
    Log {
        id: String,
        #[arg(long, short)]
        follow: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Cancel a job (a running one is stopped at the agent's next heartbeat).
    Cancel {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Wait until a job ends; exits non-zero unless it succeeded.
    Wait {
        id: String,
        /// Give up after this many seconds.
        #[arg(long)]
        timeout: Option<u64>,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Args)]
pub struct SubmitArgs {
    /// Labels an agent must carry, as key=value (repeatable).
    #[arg(long = "label", value_parser = parse_kv)]
    labels: Vec<(String, String)>,
    /// Environment variables for the command, as KEY=VALUE (repeatable).
    #[arg(long = "env", value_parser = parse_kv)]
    env: Vec<(String, String)>,
    /// NAME=VALUE: an environment variable whose value is secret (shown
    /// only to this token and admins, never on the dashboard); repeatable.
    #[arg(long = "secret-env", value_parser = parse_kv)]
    secret_env: Vec<(String, String)>,
    #[arg(long, default_value_t = 0)]
    priority: i32,
    #[arg(long, default_value_t = 3)]
    max_attempts: u32,
    /// Seconds before the command is stopped.
    #[arg(long)]
    timeout: Option<u64>,
    /// A file the command produces, uploaded on success (repeatable).
    #[arg(long = "output")]
    outputs: Vec<String>,
    /// Working directory on the agent.
    #[arg(long)]
    workdir: Option<String>,
    /// Slots of agent capacity the job occupies.
    #[arg(long, default_value_t = 1)]
    cost: u32,
    /// Wait for the job and print its log.
    #[arg(long)]
    wait: bool,
    #[command(flatten)]
    conn: Conn,
    /// The command (after `--`); joined with spaces and run by `sh -c`.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))
}

pub async fn jobs(cmd: JobsCommand) -> anyhow::Result<()> {
    match cmd {
        JobsCommand::Submit(a) => {
            let client = a.conn.client()?;
            let body = SubmitJob {
                spec: JobSpec::Command(CommandJob {
                    command: a.command.join(" "),
                    secret_env: a.secret_env.iter().map(|(k, _)| k.clone()).collect(),
                    env: a.env.into_iter().chain(a.secret_env).collect(),
                    workdir: a.workdir,
                    timeout_s: a.timeout,
                    outputs: a.outputs,
                }),
                labels: a.labels.into_iter().collect::<BTreeMap<_, _>>(),
                priority: a.priority,
                max_attempts: a.max_attempts,
                cost: a.cost,
                submitter: None,
            };
            let created: Created = client.post("/api/v1/jobs", &body).await?;
            println!("{}", created.id);
            if a.wait {
                let id = created.id.to_string();
                follow_log(&client, &id).await?;
                return finish(wait(&client, &id, None).await?);
            }
            Ok(())
        }
        JobsCommand::Show { id, conn } => {
            let job: JobView = conn.client()?.get(&format!("/api/v1/jobs/{id}")).await?;
            println!("{}", serde_json::to_string_pretty(&job)?);
            Ok(())
        }
        JobsCommand::List { state, limit, conn } => {
            let mut path = format!("/api/v1/jobs?limit={limit}");
            if let Some(s) = state {
                path.push_str(&format!("&state={s}"));
            }
            let list: JobList = conn.client()?.get(&path).await?;
            println!(
                "{:<36}  {:<9}  {:>7}  {:<12}  COMMAND",
                "ID", "STATE", "ATTEMPT", "AGENT"
            );
            for j in list.jobs {
                let what = j.summary(60);
                println!(
                    "{:<36}  {:<9}  {:>3}/{:<3}  {:<12}  {}",
                    j.id,
                    j.state,
                    j.attempt,
                    j.max_attempts,
                    j.agent.unwrap_or_default(),
                    what
                );
            }
            Ok(())
        }
        JobsCommand::Log { id, follow, conn } => {
            let client = conn.client()?;
            if follow {
                follow_log(&client, &id).await
            } else {
                print_log(&client, &id).await.map(|_| ())
            }
        }
        JobsCommand::Cancel { id, conn } => {
            let reply: CancelReply = conn
                .client()?
                .post(&format!("/api/v1/jobs/{id}/cancel"), &serde_json::json!({}))
                .await?;
            println!("{}", reply.status);
            Ok(())
        }
        JobsCommand::Wait { id, timeout, conn } => {
            let client = conn.client()?;
            finish(wait(&client, &id, timeout.map(Duration::from_secs)).await?)
        }
    }
}

fn finish(job: JobView) -> anyhow::Result<()> {
    eprintln!(
        "job {} {} (attempt {}, exit code {})",
        job.id,
        job.state,
        job.attempt,
        job.exit_code.map_or("-".to_string(), |c| c.to_string())
    );
    if job.state != flotilla_core::job::JobState::Succeeded {
        bail!(
            "job {} ended {}{}",
            job.id,
            job.state,
            job.error.map(|e| format!(": {e}")).unwrap_or_default()
        );
    }
    Ok(())
}

async fn wait(client: &Client, id: &str, timeout: Option<Duration>) -> anyhow::Result<JobView> {
    let start = Instant::now();
    loop {
        let job: JobView = client.get(&format!("/api/v1/jobs/{id}")).await?;
        if job.state.is_final() {
            return Ok(job);
        }
        if timeout.is_some_and(|t| start.elapsed() > t) {
            bail!(
                "job {id} is still {} after {:?}",
                job.state,
                start.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Prints the log from the start, a page at a time; returns where it
/// stopped.
async fn print_log(client: &Client, id: &str) -> anyhow::Result<i64> {
    print_log_after(client, id, 0).await
}

async fn print_log_after(client: &Client, id: &str, mut after: i64) -> anyhow::Result<i64> {
    use std::io::Write;
    loop {
        let (text, next, more) = client.log_page(id, after).await?;
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())?;
        out.flush()?;
        after = next;
        if !more {
            return Ok(after);
        }
    }
}

/// Prints the log as it grows until the job ends, fetching only the lines
/// it has not printed.
async fn follow_log(client: &Client, id: &str) -> anyhow::Result<()> {
    let mut after = 0;
    loop {
        // The state first: lines written before the job ended are then all
        // in the pages read after it.
        let job: JobView = client.get(&format!("/api/v1/jobs/{id}")).await?;
        after = print_log_after(client, id, after).await?;
        if job.state.is_final() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
