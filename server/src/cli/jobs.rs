//! `flotilla jobs submit|show|list|log|cancel|retry|wait`: command jobs.

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
    /// List jobs, newest first, a page at a time: every filter given must
    /// match. The next page: the same command with `--before` the id it
    /// prints last (on stderr).
    List {
        /// Only jobs in this state (queued, running, succeeded, failed, …).
        #[arg(long)]
        state: Option<String>,
        /// Only jobs of this kind (command, tile, revdeps, step).
        #[arg(long)]
        kind: Option<String>,
        /// Only jobs this agent runs or last ran.
        #[arg(long)]
        agent: Option<String>,
        /// Only jobs accounted to this submitter.
        #[arg(long)]
        submitter: Option<String>,
        /// Only jobs whose command contains this text (any case), or whose
        /// id starts or ends with it.
        #[arg(long)]
        text: Option<String>,
        /// Only jobs older than this one (the previous page's last job).
        #[arg(long)]
        before: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Print the answer as JSON (`jobs` and the `next` cursor).
        #[arg(long)]
        json: bool,
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
    /// Queue a failed or cancelled command job again, as a new job (its
    /// id is printed).
    Retry {
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
        JobsCommand::List {
            state,
            kind,
            agent,
            submitter,
            text,
            before,
            limit,
            json,
            conn,
        } => {
            let mut query = url::form_urlencoded::Serializer::new(String::new());
            query.append_pair("limit", &limit.to_string());
            for (name, value) in [
                ("state", state),
                ("kind", kind),
                ("agent", agent),
                ("submitter", submitter),
                ("q", text),
                ("before", before),
            ] {
                if let Some(v) = value {
                    query.append_pair(name, &v);
                }
            }
            let list: JobList = conn
                .client()?
                .get(&format!("/api/v1/jobs?{}", query.finish()))
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(());
            }
            println!(
                "{:<36}  {:<9}  {:<7}  {:>7}  {:<12}  {:<19}  WHAT",
                "ID", "STATE", "KIND", "ATTEMPT", "AGENT", "CREATED (UTC)"
            );
            for j in &list.jobs {
                println!(
                    "{:<36}  {:<9}  {:<7}  {:>3}/{:<3}  {:<12}  {:<19}  {}",
                    j.id,
                    j.state,
                    j.kind,
                    j.attempt,
                    j.max_attempts,
                    j.agent.as_deref().unwrap_or_default(),
                    j.created_at.format("%Y-%m-%d %H:%M:%S"),
                    j.summary(60)
                );
            }
            // On stderr, so stdout stays the table.
            if let Some(next) = list.next {
                eprintln!("older jobs: --before {next}");
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
        JobsCommand::Retry { id, conn } => {
            let created: Created = conn
                .client()?
                .post(&format!("/api/v1/jobs/{id}/retry"), &serde_json::json!({}))
                .await?;
            println!("{}", created.id);
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
