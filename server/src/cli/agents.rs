//! `flotilla agents [list|pause|drain|resume]`: the fleet, and steering it.

use clap::{Args, Subcommand};
use flotilla_core::api::{AgentList, SteerReply};

use super::http::Conn;

#[derive(Args)]
pub struct AgentsArgs {
    #[command(subcommand)]
    action: Option<AgentAction>,
    /// Print the list as JSON (`flotilla agents --json`).
    #[arg(long)]
    json: bool,
    /// Only agents whose names sort after this one (the previous page's
    /// last, printed on stderr).
    #[arg(long)]
    after: Option<String>,
    /// Agents per page (at most 1000).
    #[arg(long, default_value_t = 1000)]
    limit: u32,
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
            let mut query = url::form_urlencoded::Serializer::new(String::new());
            query.append_pair("limit", &args.limit.to_string());
            if let Some(after) = &args.after {
                query.append_pair("after", after);
            }
            let list: AgentList = client
                .get(&format!("/api/v1/agents?{}", query.finish()))
                .await?;
            if json || args.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(());
            }
            // On stderr, so stdout stays the table.
            if let Some(next) = &list.next {
                eprintln!("more agents: --after {next}");
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
                    notes(&a).join("; ")
                );
            }
            return Ok(());
        }
        AgentAction::Pause { name } => (name, "pause"),
        AgentAction::Drain { name } => (name, "drain"),
        AgentAction::Resume { name } => (name, "resume"),
    };
    let reply: SteerReply = client
        .post(
            &format!("/api/v1/agents/{name}/{action}"),
            &serde_json::json!({}),
        )
        .await?;
    println!("{}: {}", reply.name, reply.state.as_str());
    Ok(())
}

/// What an operator should notice about an agent: silent for three
/// heartbeats (`online` false), a nearly full disk.
fn notes(a: &flotilla_core::api::AgentView) -> Vec<String> {
    let mut notes = Vec::new();
    if !a.online {
        notes.push(match a.last_seen_at {
            Some(t) => format!("NOT ANSWERING since {} UTC", t.format("%Y-%m-%d %H:%M:%S")),
            None => "NOT ANSWERING (never heard from)".to_string(),
        });
    }
    if a.disk_nearly_full {
        notes.push("DISK OVER 90% FULL".to_string());
    }
    // Paused, draining and drained say so in STATE; this is the rest.
    if let (flotilla_core::api::AgentState::Active, Some(why)) = (a.state, &a.lease_refused) {
        notes.push(format!("NOT LEASING: {why}"));
    }
    notes
}
