//! `flotilla datasets add|list` and `flotilla coverage import`: what tiles
//! are encoded with, and which tiles exist already.

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use flotilla_core::api::datasets::{CoverageImported, DatasetList, DatasetView, NewDataset};

use super::http::Conn;
use super::print_json;

#[derive(Subcommand)]
pub enum DatasetsCommand {
    /// Register a dataset: its checkpoint (uploaded to the object store) and
    /// where tile inputs come from.
    Add {
        name: String,
        /// The model checkpoint (.safetensors or upstream .pt).
        #[arg(long)]
        ckpt: PathBuf,
        /// Inputs are objects PREFIX/YEAR/TILE/{bands,masks,…}.npy in the store.
        #[arg(long, required_unless_present = "fetch_command")]
        inputs: Option<String>,
        /// Or a shell command the agent runs to write a tile's inputs into
        /// $FLOTILLA_OUT (given $FLOTILLA_TILE, $FLOTILLA_YEAR).
        #[arg(long)]
        fetch_command: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// List datasets: a table, or JSON with --json.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Only datasets whose names sort after this one (the previous
        /// page's last, printed on stderr).
        #[arg(long)]
        after: Option<String>,
        /// Datasets per page (at most 1000).
        #[arg(long, default_value_t = 1000)]
        limit: u32,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Subcommand)]
pub enum CoverageCommand {
    /// Record the tiles of a geotessera manifest.parquet as present.
    Import {
        file: PathBuf,
        #[arg(long)]
        dataset: String,
        #[command(flatten)]
        conn: Conn,
    },
}

pub async fn datasets(cmd: DatasetsCommand) -> anyhow::Result<()> {
    match cmd {
        DatasetsCommand::Add {
            name,
            ckpt,
            inputs,
            fetch_command,
            conn,
        } => {
            let c = conn.client()?;
            let bytes =
                std::fs::read(&ckpt).with_context(|| format!("reading {}", ckpt.display()))?;
            let _: DatasetView = c
                .post(
                    "/api/v1/datasets",
                    &NewDataset {
                        name: name.clone(),
                        input_prefix: inputs,
                        fetch_command,
                    },
                )
                .await?;
            let v: DatasetView = c
                .send_bytes(
                    reqwest::Method::PUT,
                    &format!("/api/v1/datasets/{name}/checkpoint"),
                    bytes,
                    "application/octet-stream",
                )
                .await?;
            print_json(&v)?;
        }
        DatasetsCommand::List {
            json,
            after,
            limit,
            conn,
        } => {
            let mut query = url::form_urlencoded::Serializer::new(String::new());
            query.append_pair("limit", &limit.to_string());
            if let Some(after) = &after {
                query.append_pair("after", after);
            }
            let list: DatasetList = conn
                .client()?
                .get(&format!("/api/v1/datasets?{}", query.finish()))
                .await?;
            if json {
                return print_json(&list);
            }
            // On stderr, so stdout stays the table.
            if let Some(next) = &list.next {
                eprintln!("more datasets: --after {next}");
            }
            println!(
                "{:<20}  {:<12}  {:>10}  {:<19}  INPUTS",
                "NAME", "CHECKPOINT", "SIZE (MB)", "CREATED (UTC)"
            );
            for d in list.datasets {
                let sha = d.checkpoint_sha256.as_deref().unwrap_or("-");
                let inputs = match (&d.input_prefix, &d.fetch_command) {
                    (Some(p), _) => format!("store: {p}"),
                    (None, Some(c)) => format!("command: {c}"),
                    (None, None) => "-".to_string(),
                };
                println!(
                    "{:<20}  {:<12}  {:>10}  {:<19}  {}",
                    d.name,
                    sha.chars().take(12).collect::<String>(),
                    d.checkpoint_size
                        .map_or("-".to_string(), |s| format!("{:.1}", s as f64 / 1e6)),
                    d.created_at.format("%Y-%m-%d %H:%M:%S"),
                    inputs
                );
            }
        }
    }
    Ok(())
}

pub async fn coverage(cmd: CoverageCommand) -> anyhow::Result<()> {
    match cmd {
        CoverageCommand::Import {
            file,
            dataset,
            conn,
        } => {
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let v: CoverageImported = conn
                .client()?
                .send_bytes(
                    reqwest::Method::POST,
                    &format!("/api/v1/coverage/import?dataset={dataset}"),
                    bytes,
                    "application/vnd.apache.parquet",
                )
                .await?;
            print_json(&v)?;
        }
    }
    Ok(())
}
