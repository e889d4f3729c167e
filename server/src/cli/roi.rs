//! `flotilla roi submit|plan|show`, `flotilla datasets add|list` and `flotilla coverage import`: the tile commands that talk to a server.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::client::Conn;

#[derive(Args, Clone)]
pub struct RegionArgs {
    /// A name for the ROI.
    #[arg(long)]
    name: String,
    /// The year to encode.
    #[arg(long)]
    year: i32,
    /// The dataset (model and inputs), as registered with `flotilla datasets add`.
    #[arg(long)]
    dataset: String,
    /// GeoJSON file: a Polygon, MultiPolygon, Feature or FeatureCollection.
    #[arg(long, conflicts_with = "bbox", required_unless_present = "bbox")]
    geojson: Option<PathBuf>,
    /// min_lon,min_lat,max_lon,max_lat in degrees.
    #[arg(long, allow_hyphen_values = true)]
    bbox: Option<String>,
}

impl RegionArgs {
    fn body(&self, dry_run: bool) -> anyhow::Result<Value> {
        let mut body = json!({
            "name": self.name, "year": self.year, "dataset": self.dataset, "dry_run": dry_run,
        });
        if let Some(path) = &self.geojson {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let value: Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", path.display()))?;
            body["geojson"] = value;
        }
        if let Some(b) = &self.bbox {
            let nums: Vec<f64> = b
                .split(',')
                .map(|p| p.trim().parse::<f64>())
                .collect::<Result<_, _>>()
                .with_context(|| {
                    format!("--bbox {b:?}: expected min_lon,min_lat,max_lon,max_lat")
                })?;
            anyhow::ensure!(
                nums.len() == 4,
                "--bbox {b:?}: expected four numbers min_lon,min_lat,max_lon,max_lat"
            );
            body["bbox"] = json!(nums);
        }
        Ok(body)
    }
}

#[derive(Subcommand)]
pub enum RoiCommand {
    /// Submit a job for every tile of the region that is not encoded yet.
    Submit {
        #[command(flatten)]
        region: RegionArgs,
        /// Wait until every tile is done, printing progress.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Count total / present / in flight / missing tiles without submitting.
    Plan {
        #[command(flatten)]
        region: RegionArgs,
        #[command(flatten)]
        conn: Conn,
    },
    /// An ROI's progress as JSON.
    Show {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

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
    /// List datasets as JSON.
    List {
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

fn print(v: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// One line of an ROI's progress: tiles by state, and pixels when agents
/// have reported them (small tiles finish between two heartbeats).
fn roi_progress(r: &Value) -> String {
    let count = |state: &str| r["jobs"][state].as_i64().unwrap_or(0);
    let done = count("succeeded");
    let running = count("leased") + count("running");
    let waiting = count("queued") + count("retrying");
    let failed = count("failed") + count("cancelled");
    let total = r["submitted"]
        .as_i64()
        .unwrap_or(done + running + waiting + failed);
    let mut line =
        format!("tiles {done}/{total} done, {running} running, {waiting} waiting, {failed} failed");
    if let (Some(p), Some(t)) = (r["pixels_done"].as_i64(), r["pixels_total"].as_i64()) {
        if t > 0 {
            line.push_str(&format!(
                "; pixels {p}/{t} ({:.0} %)",
                100.0 * p as f64 / t as f64
            ));
        }
    }
    line
}

pub async fn roi(cmd: RoiCommand) -> anyhow::Result<()> {
    match cmd {
        RoiCommand::Plan { region, conn } => {
            let c = conn.client()?;
            let v: Value = c.post("/api/v1/rois/plan", &region.body(true)?).await?;
            println!(
                "total {}  present {}  in flight {}  missing {}",
                v["total"], v["present"], v["in_flight"], v["missing"]
            );
        }
        RoiCommand::Submit { region, wait, conn } => {
            let c = conn.client()?;
            let v: Value = c.post("/api/v1/rois", &region.body(false)?).await?;
            print(&v)?;
            if wait {
                let id = v["id"].as_str().context("the server gave no ROI id")?;
                let mut last = String::new();
                loop {
                    let r: Value = c.get(&format!("/api/v1/rois/{id}")).await?;
                    let line = roi_progress(&r);
                    if line != last {
                        eprintln!("{line}");
                        last = line;
                    }
                    if r["finished"] == json!(true) {
                        print(&r)?;
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        }
        RoiCommand::Show { id, conn } => {
            let v: Value = conn.client()?.get(&format!("/api/v1/rois/{id}")).await?;
            print(&v)?;
        }
    }
    Ok(())
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
            let _: Value = c
                .post(
                    "/api/v1/datasets",
                    &json!({ "name": name, "input_prefix": inputs, "fetch_command": fetch_command }),
                )
                .await?;
            let v: Value = c
                .send_bytes(
                    reqwest::Method::PUT,
                    &format!("/api/v1/datasets/{name}/checkpoint"),
                    bytes,
                    "application/octet-stream",
                )
                .await?;
            print(&v)?;
        }
        DatasetsCommand::List { conn } => {
            let v: Value = conn.client()?.get("/api/v1/datasets").await?;
            print(&v)?;
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
            let v: Value = conn
                .client()?
                .send_bytes(
                    reqwest::Method::POST,
                    &format!("/api/v1/coverage/import?dataset={dataset}"),
                    bytes,
                    "application/vnd.apache.parquet",
                )
                .await?;
            print(&v)?;
        }
    }
    Ok(())
}
