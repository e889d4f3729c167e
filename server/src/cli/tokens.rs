//! `flotilla tokens create|list|revoke`: API and agent tokens (admin only).

use clap::Subcommand;
use flotilla_core::api::{CreateToken, TokenCreated, TokenList, TokenRole, TokenView};

use super::http::Conn;

#[derive(Subcommand)]
pub enum TokensCommand {
    /// Make a token and print it (shown once; the server keeps a hash).
    Create {
        /// admin, client, agent, or metrics (reads /metrics only: for
        /// Prometheus).
        #[arg(long, default_value = "client", value_parser = parse_role)]
        role: TokenRole,
        /// For agent tokens: the agent name it may register as.
        #[arg(long)]
        agent: Option<String>,
        /// For agent tokens: a label (key=value) the agent may register
        /// with; repeatable. Without any, it may claim any labels.
        #[arg(long = "allow-label", value_parser = parse_label)]
        allow_labels: Vec<(String, String)>,
        /// For agent tokens: a job kind (command, tile, revdeps) the agent
        /// may run; repeatable. Without any, it may run every kind.
        #[arg(long = "allow-kind")]
        allow_kinds: Vec<flotilla_core::job::JobKind>,
        #[arg(long)]
        description: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// List tokens (id, role, agent, description, created, revoked); never their secrets.
    ///
    /// Newest first, a page at a time: the next page is the same command
    /// with `--before` the id it prints last (on stderr).
    List {
        /// Print JSON (`tokens` and the `next` cursor).
        #[arg(long)]
        json: bool,
        /// Only tokens older than this one (the previous page's last).
        #[arg(long)]
        before: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
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
        TokensCommand::List {
            json,
            before,
            limit,
            conn,
        } => {
            let list: TokenList = conn
                .client()?
                .get(&super::page_path(
                    "/api/v1/tokens",
                    limit,
                    before.as_deref(),
                ))
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(());
            }
            if let Some(next) = list.next {
                eprintln!("older tokens: --before {next}");
            }
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
            let t: TokenView = conn
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
            allow_labels,
            allow_kinds,
            description,
            conn,
        } => {
            let t: TokenCreated = conn
                .client()?
                .post(
                    "/api/v1/tokens",
                    &CreateToken {
                        role,
                        agent_name: agent,
                        description,
                        allowed_labels: (!allow_labels.is_empty())
                            .then(|| allow_labels.into_iter().collect()),
                        allowed_kinds: (!allow_kinds.is_empty()).then_some(allow_kinds),
                    },
                )
                .await?;
            println!("{}", t.token);
            Ok(())
        }
    }
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{s}` is not key=value"))
}

fn parse_role(s: &str) -> Result<TokenRole, String> {
    TokenRole::parse(s).ok_or_else(|| "must be admin, client, agent or metrics".to_string())
}
