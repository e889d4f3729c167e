//! `flotilla pipeline check|run|status|cancel|list`: pipeline runs.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Subcommand;
use flotilla_core::api::pipelines::{PipelineList, PipelineState, PipelineView, SubmitPipeline};
use flotilla_core::api::{CancelReply, Created};
use flotilla_core::pipeline::plan::Plan;

use super::http::{Client, Conn};

#[derive(Subcommand)]
pub enum PipelineCommand {
    /// Parse and check a pipeline file; contacts no server and no host.
    /// Each mistake is printed as FILE:LINE:COLUMN: message.
    Check { file: PathBuf },
    /// Check FILE, start a run of it and follow it (items × steps, counts,
    /// rate) until it ends; Ctrl-C stops following, not the run.
    Run {
        file: PathBuf,
        /// Print the run's id and return at once.
        #[arg(long)]
        detach: bool,
        #[arg(long, default_value_t = 0)]
        priority: i32,
        #[command(flatten)]
        conn: Conn,
    },
    /// A run's state: per step, items running, done and failed; with
    /// --items, each item's row.
    Status {
        id: String,
        /// Each item and the state of each of its steps.
        #[arg(long)]
        items: bool,
        /// The whole view as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Cancel a run (or one item of it with --item): its items stop, and
    /// their running jobs' process trees are killed, on ssh hosts too.
    Cancel {
        id: String,
        /// Only this item; the others go on.
        #[arg(long)]
        item: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// The newest runs, a page at a time: the next page is the same
    /// command with `--before` the id it prints last (on stderr).
    List {
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Only runs older than this one (the previous page's last).
        #[arg(long)]
        before: Option<String>,
        /// Print JSON (`runs` and the `next` cursor).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
}

pub async fn pipeline(cmd: PipelineCommand) -> anyhow::Result<()> {
    match cmd {
        PipelineCommand::Check { file } => {
            let (name, text) = read(&file)?;
            let spec = load(&name, &text)?;
            let plan = Plan::new(&spec);
            println!(
                "{name}: ok: {} hosts, {} steps ({}), {} limit gates",
                spec.hosts.len(),
                plan.nodes.len(),
                plan.nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>()
                    .join(" → "),
                plan.gates.len()
            );
            Ok(())
        }
        PipelineCommand::Run {
            file,
            detach,
            priority,
            conn,
        } => {
            let (name, source) = read(&file)?;
            load(&name, &source)?;
            let client = conn.client()?;
            let created: Created = client
                .post(
                    "/api/v1/pipelines",
                    &SubmitPipeline {
                        name,
                        source,
                        priority,
                    },
                )
                .await?;
            if detach {
                println!("{}", created.id);
                return Ok(());
            }
            eprintln!(
                "run {} (Ctrl-C stops following; `flotilla pipeline cancel {}` stops the run)",
                created.id, created.id
            );
            follow(&client, &created.id.to_string()).await
        }
        PipelineCommand::Status {
            id,
            items,
            json,
            conn,
        } => {
            let client = conn.client()?;
            let limit = if items || json { 10_000 } else { 1 };
            let view: PipelineView = client
                .get(&format!("/api/v1/pipelines/{id}?limit={limit}"))
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&view)?);
                return Ok(());
            }
            print!("{}", status_text(&view));
            if items {
                for row in &view.rows {
                    let cells: Vec<String> = view
                        .steps
                        .iter()
                        .zip(&row.cells)
                        .map(|(s, c)| {
                            format!(
                                "{}={}",
                                s.name,
                                c.as_ref().map_or("-", |c| c.state.as_str())
                            )
                        })
                        .collect();
                    println!(
                        "  {:<24} {:<9} {}{}",
                        row.item,
                        row.state,
                        cells.join(" "),
                        row.error
                            .as_ref()
                            .map(|e| format!("  ({e})"))
                            .unwrap_or_default()
                    );
                }
            }
            Ok(())
        }
        PipelineCommand::Cancel { id, item, conn } => {
            let path = match &item {
                Some(item) => format!("/api/v1/pipelines/{id}/items/{}/cancel", url_segment(item)),
                None => format!("/api/v1/pipelines/{id}/cancel"),
            };
            let reply: CancelReply = conn.client()?.post(&path, &()).await?;
            println!("{}: {}", reply.id, reply.status);
            Ok(())
        }
        PipelineCommand::List {
            limit,
            before,
            json,
            conn,
        } => {
            let list: PipelineList = conn
                .client()?
                .get(&super::page_path(
                    "/api/v1/pipelines",
                    limit,
                    before.as_deref(),
                ))
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(());
            }
            if let Some(next) = list.next {
                eprintln!("older runs: --before {next}");
            }
            println!(
                "{:<36}  {:<9} {:<24} {:<22} CREATED (UTC)",
                "ID", "STATE", "NAME", "ITEMS"
            );
            for r in list.runs {
                let items = format!(
                    "{}/{} done, {} failed",
                    r.counts.done,
                    r.items.map_or("?".into(), |n| n.to_string()),
                    r.counts.failed + r.counts.cancelled
                );
                println!(
                    "{:<36}  {:<9} {:<24} {:<22} {}",
                    r.id,
                    r.state.as_str(),
                    r.name,
                    items,
                    r.created_at.format("%Y-%m-%d %H:%M:%S")
                );
            }
            Ok(())
        }
    }
}

/// `s` as one URL path segment (item ids may hold spaces, `%`, `?`, `#`).
fn url_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn read(file: &Path) -> anyhow::Result<(String, String)> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the pipeline file {}", file.display()))?;
    Ok((file.display().to_string(), text))
}

fn load(name: &str, text: &str) -> anyhow::Result<flotilla_core::pipeline::PipelineSpec> {
    flotilla_core::pipeline::load(name, text).map_err(|errors| {
        let n = errors.0.len();
        anyhow::anyhow!(
            "{errors}\n{n} mistake{} in {name}; nothing was started",
            if n == 1 { "" } else { "s" }
        )
    })
}

/// A run's state in a few lines: its items, then each step's counts.
fn status_text(v: &PipelineView) -> String {
    let s = &v.summary;
    let mut out = format!(
        "{} {} ({}): {} items, {} done, {} active, {} waiting, {} failed\n",
        s.id,
        s.name,
        s.state.as_str(),
        s.items.map_or("?".into(), |n| n.to_string()),
        s.counts.done,
        s.counts.active,
        s.counts.waiting,
        s.counts.failed + s.counts.cancelled
    );
    for step in &v.steps {
        out.push_str(&format!(
            "  {:<6} {:<20} on {:<14} {:>6} running {:>6} done {:>6} failed{}\n",
            step.kind,
            step.name,
            step.host,
            step.running,
            step.succeeded,
            step.failed,
            step.mean_s
                .map(|m| format!("  {m:.1}s each"))
                .unwrap_or_default()
        ));
    }
    for (i, g) in v.gates.iter().enumerate() {
        out.push_str(&format!("  limit #{i}: {}/{} inside\n", g.inside, g.limit));
    }
    if let Some(e) = &s.error {
        out.push_str(&format!("  error: {e}\n"));
    }
    out
}

/// Follows run `id` until it ends: a progress bar in a terminal, a line
/// when something changed (at most every 5 s) otherwise.
async fn follow(client: &Client, id: &str) -> anyhow::Result<()> {
    let tty = std::io::stderr().is_terminal();
    let bar = tty.then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} items {msg}",
            )
            .expect("the progress template is valid"),
        );
        b.enable_steady_tick(Duration::from_millis(200));
        b
    });
    let started = Instant::now();
    let mut last_line = String::new();
    let mut last_print = Instant::now() - Duration::from_secs(60);
    loop {
        let v: PipelineView = client
            .get(&format!("/api/v1/pipelines/{id}?limit=1"))
            .await?;
        let s = &v.summary;
        let done = s.counts.done + s.counts.failed + s.counts.cancelled;
        let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-3);
        let steps: Vec<String> = v
            .steps
            .iter()
            .map(|st| format!("{} {}✓ {}▶", st.name, st.succeeded, st.running))
            .collect();
        let line = format!(
            "{}: {}/{} items done, {} failed; {} ({rate:.2} items/s)",
            s.state.as_str(),
            s.counts.done,
            s.items.map_or("?".into(), |n| n.to_string()),
            s.counts.failed + s.counts.cancelled,
            steps.join(", ")
        );
        match &bar {
            Some(b) => {
                b.set_length(s.items.unwrap_or(0));
                b.set_position(done);
                b.set_message(format!("{} | {rate:.2}/s", steps.join(" ")));
            }
            None => {
                if line != last_line && last_print.elapsed() >= Duration::from_secs(5)
                    || s.state.is_final()
                {
                    eprintln!("{line}");
                    last_line = line;
                    last_print = Instant::now();
                }
            }
        }
        if s.state.is_final() {
            if let Some(b) = &bar {
                b.finish_and_clear();
            }
            print!("{}", status_text(&v));
            return match s.state {
                PipelineState::Done => Ok(()),
                _ => bail!(
                    "run {} {}: {}",
                    s.id,
                    s.state.as_str(),
                    s.error.clone().unwrap_or_default()
                ),
            };
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
}
