//! Client commands: they call the REST API of a running server.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use flotilla_core::api::{
    AgentList, CreateToken, Created, ErrorBody, JobList, JobView, SubmitJob, TokenCreated,
    TokenRole,
};
use flotilla_core::job::{CommandJob, JobSpec};
use serde::de::DeserializeOwned;

/// Where the server is and who we are. Defaults find a local `flotilla up`
/// started in the current directory.
#[derive(Args, Clone)]
pub struct Conn {
    /// Server URL [default: from ./flotilla-data/server.url, else
    /// http://127.0.0.1:8470]
    #[arg(long, env = "FLOTILLA_SERVER", global = true)]
    pub server: Option<String>,
    /// API token [default: the contents of --token-file]
    #[arg(long, env = "FLOTILLA_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the API token [default: ./flotilla-data/admin.token]
    #[arg(long, env = "FLOTILLA_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,
}

pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Conn {
    pub fn client(&self) -> anyhow::Result<Client> {
        let base = match &self.server {
            Some(s) => s.clone(),
            None => std::fs::read_to_string("flotilla-data/server.url")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "http://127.0.0.1:8470".to_string()),
        };
        let token = match (&self.token, &self.token_file) {
            (Some(t), _) => t.clone(),
            (None, Some(f)) => std::fs::read_to_string(f)
                .with_context(|| format!("reading token file {}", f.display()))?
                .trim()
                .to_string(),
            (None, None) => std::fs::read_to_string("flotilla-data/admin.token")
                .map(|s| s.trim().to_string())
                .map_err(|_| {
                    anyhow::anyhow!(
                        "no API token: pass --token or --token-file, set FLOTILLA_TOKEN, \
                         or run from the directory where `flotilla up` wrote flotilla-data/"
                    )
                })?,
        };
        Ok(Client {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()?,
            base: base.trim_end_matches('/').to_string(),
            token,
        })
    }
}

impl Client {
    async fn send<T: DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> anyhow::Result<T> {
        let resp =
            req.bearer_auth(&self.token).send().await.with_context(|| {
                format!("cannot reach the server at {}; is it running?", self.base)
            })?;
        let status = resp.status();
        let bytes = resp.bytes().await?;
        if !status.is_success() {
            match serde_json::from_slice::<ErrorBody>(&bytes) {
                Ok(e) => bail!("{} ({}): {}", status, e.error.code, e.error.message),
                Err(_) => bail!("{}: {}", status, String::from_utf8_lossy(&bytes)),
            }
        }
        serde_json::from_slice(&bytes).context("unexpected answer from the server")
    }

    async fn text(&self, path: &str) -> anyhow::Result<String> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await?;
        let status = resp.status();
        let text = resp.text().await?;
        if !status.is_success() {
            bail!("{status}: {text}");
        }
        Ok(text)
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    /// Sends a raw body (a checkpoint, a manifest) with `method`.
    pub async fn send_bytes<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Vec<u8>,
        content_type: &str,
    ) -> anyhow::Result<T> {
        self.send(
            self.http
                .request(method, format!("{}{path}", self.base))
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(body),
        )
        .await
    }

    pub async fn post<B: serde::Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        self.send(self.http.post(format!("{}{path}", self.base)).json(body))
            .await
    }
}

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
                    env: a.env.into_iter().collect(),
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
                let what = j
                    .spec
                    .get("command")
                    .and_then(|c| c.as_str())
                    .unwrap_or(&j.kind)
                    .chars()
                    .take(60)
                    .collect::<String>();
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
                print!("{}", client.text(&format!("/api/v1/jobs/{id}/log")).await?);
                Ok(())
            }
        }
        JobsCommand::Cancel { id, conn } => {
            let v: serde_json::Value = conn
                .client()?
                .post(&format!("/api/v1/jobs/{id}/cancel"), &serde_json::json!({}))
                .await?;
            println!("{}", v["status"].as_str().unwrap_or("cancelled"));
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

/// Prints the log as it grows until the job ends.
async fn follow_log(client: &Client, id: &str) -> anyhow::Result<()> {
    let mut printed = 0usize;
    loop {
        let job: JobView = client.get(&format!("/api/v1/jobs/{id}")).await?;
        let text = client.text(&format!("/api/v1/jobs/{id}/log")).await?;
        if text.len() > printed {
            print!("{}", &text[printed..]);
            printed = text.len();
        }
        if job.state.is_final() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[derive(Args)]
pub struct AgentsArgs {
    #[command(subcommand)]
    action: Option<AgentAction>,
    #[command(flatten)]
    conn: Conn,
}

#[derive(Subcommand)]
enum AgentAction {
    /// List agents (the default).
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Take no new jobs until resumed.
    Pause { name: String },
    /// Finish running jobs, take no new; `drained` when idle.
    Drain { name: String },
    /// Take jobs again.
    Resume { name: String },
}

pub async fn agents(args: AgentsArgs) -> anyhow::Result<()> {
    let client = args.conn.client()?;
    let (name, action) = match args.action.unwrap_or(AgentAction::List { json: false }) {
        AgentAction::List { json } => {
            let list: AgentList = client.get("/api/v1/agents").await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(());
            }
            println!(
                "{:<16} {:<9} {:<7} {:>5} {:<24} {:>6} {:>9} {:<8}  NOTES",
                "NAME", "STATE", "ONLINE", "SLOTS", "CPU", "CORES", "DISK FREE", "ENCODER"
            );
            for a in list.agents {
                let (cpu, cores, disk) =
                    a.health
                        .as_ref()
                        .map_or(("?".to_string(), 0, "?".to_string()), |h| {
                            (
                                h.cpu_model.chars().take(24).collect(),
                                h.cores,
                                format!("{:.1}G", h.disk_free_bytes as f64 / 1e9),
                            )
                        });
                // The tile encoder's backend (`-`: the agent runs no tiles);
                // `--json` has why faster backends are not used.
                let encoder = a.encoder_backend().unwrap_or("-");
                println!(
                    "{:<16} {:<9} {:<7} {:>2}/{:<2} {:<24} {:>6} {:>9} {:<8}  {}",
                    a.name,
                    a.state.as_str(),
                    if a.online { "yes" } else { "no" },
                    a.slots_in_use,
                    a.capacity,
                    cpu,
                    cores,
                    disk,
                    encoder,
                    if a.disk_nearly_full {
                        "DISK OVER 90% FULL"
                    } else {
                        ""
                    }
                );
            }
            return Ok(());
        }
        AgentAction::Pause { name } => (name, "pause"),
        AgentAction::Drain { name } => (name, "drain"),
        AgentAction::Resume { name } => (name, "resume"),
    };
    let v: serde_json::Value = client
        .post(
            &format!("/api/v1/agents/{name}/{action}"),
            &serde_json::json!({}),
        )
        .await?;
    println!("{name}: {}", v["state"].as_str().unwrap_or("?"));
    Ok(())
}

#[derive(Subcommand)]
pub enum TokensCommand {
    /// Make a token and print it (shown once; the server keeps a hash).
    Create {
        /// admin, client or agent.
        #[arg(long, default_value = "client")]
        role: String,
        /// For agent tokens: the agent name it may register as.
        #[arg(long)]
        agent: Option<String>,
        #[arg(long)]
        description: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// List tokens (id, role, agent, description, created, revoked); never their secrets.
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// Revoke a token by id: it stops working at once.
    Revoke {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

pub async fn tokens(cmd: TokensCommand) -> anyhow::Result<()> {
    match cmd {
        TokensCommand::List { conn } => {
            let list: flotilla_core::api::TokenList = conn.client()?.get("/api/v1/tokens").await?;
            println!(
                "{:<36}  {:<6}  {:<16}  {:<20}  {:<20}  DESCRIPTION",
                "ID", "ROLE", "AGENT", "CREATED", "REVOKED"
            );
            for t in list.tokens {
                println!(
                    "{:<36}  {:<6}  {:<16}  {:<20}  {:<20}  {}",
                    t.id,
                    t.role.as_str(),
                    t.agent_name.as_deref().unwrap_or("-"),
                    t.created_at.format("%Y-%m-%d %H:%M:%S"),
                    t.revoked_at
                        .map(|r| r.format("%Y-%m-%d %H:%M:%S").to_string())
                        .unwrap_or_else(|| "-".into()),
                    t.description.as_deref().unwrap_or("")
                );
            }
            Ok(())
        }
        TokensCommand::Revoke { id, conn } => {
            let t: flotilla_core::api::TokenView = conn
                .client()?
                .post(
                    &format!("/api/v1/tokens/{id}/revoke"),
                    &serde_json::json!({}),
                )
                .await?;
            println!("revoked {} ({})", t.id, t.role.as_str());
            Ok(())
        }
        TokensCommand::Create {
            role,
            agent,
            description,
            conn,
        } => {
            let role = TokenRole::parse(&role)
                .ok_or_else(|| anyhow::anyhow!("--role must be admin, client or agent"))?;
            let t: TokenCreated = conn
                .client()?
                .post(
                    "/api/v1/tokens",
                    &CreateToken {
                        role,
                        agent_name: agent,
                        description,
                    },
                )
                .await?;
            println!("{}", t.token);
            Ok(())
        }
    }
}

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
        #[arg(long, default_value = "union")]
        query: String,
        /// Candidates per phase-2 shard.
        #[arg(long, default_value_t = 4000)]
        shard_size: u32,
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
}

pub async fn revdeps(cmd: RevdepsCommand) -> anyhow::Result<()> {
    match cmd {
        RevdepsCommand::Submit {
            target,
            repo,
            compiler,
            query,
            shard_size,
            wait,
            conn,
        } => {
            let client = conn.client()?;
            let created: Created = client
                .post(
                    "/api/v1/revdeps",
                    &serde_json::json!({
                        "target": target, "repo": repo, "compiler": compiler,
                        "query": query, "shard_size": shard_size,
                    }),
                )
                .await?;
            if !wait {
                println!("{}", created.id);
                return Ok(());
            }
            eprintln!("run {}", created.id);
            loop {
                let run: serde_json::Value = client
                    .get(&format!("/api/v1/revdeps/{}", created.id))
                    .await?;
                match run["state"].as_str() {
                    Some("done") => {
                        for line in run["result"].as_array().into_iter().flatten() {
                            println!("{}", line.as_str().unwrap_or_default());
                        }
                        eprintln!("timings: {}", run["timings"]);
                        return Ok(());
                    }
                    Some("failed") => bail!("run failed: {}", run["error"]),
                    _ => {
                        eprint!(
                            "\r{}: {} candidates, {}/{} shards done   ",
                            run["state"].as_str().unwrap_or("?"),
                            run["candidates"],
                            run["shards_done"],
                            run["shards"]
                        );
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        }
        RevdepsCommand::Show { id, conn } => {
            let run: serde_json::Value =
                conn.client()?.get(&format!("/api/v1/revdeps/{id}")).await?;
            println!("{}", serde_json::to_string_pretty(&run)?);
            Ok(())
        }
    }
}
