//! `flotilla roi submit|plan|show|list`: regions of interest — which tiles are
//! missing, a job for each, and following them to the end.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use flotilla_core::api::rois::{PlanCounts, RoiCreated, RoiPage, RoiRequest, RoiView};
use flotilla_core::roi::parse_bbox;

use super::http::Conn;
use super::print_json;

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
    /// Allow more tiles than one ROI may cover (250,000); admin tokens only.
    #[arg(long)]
    exceed_tile_cap: bool,
}

impl RegionArgs {
    fn body(&self, dry_run: bool) -> anyhow::Result<RoiRequest> {
        let geojson = match &self.geojson {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let value: serde_json::Value = serde_json::from_str(&text)
                    .with_context(|| format!("{} is not JSON", path.display()))?;
                Some(value)
            }
            None => None,
        };
        let bbox = match &self.bbox {
            Some(b) => Some(parse_bbox(b).with_context(|| format!("--bbox {b:?}"))?),
            None => None,
        };
        Ok(RoiRequest {
            name: self.name.clone(),
            year: self.year,
            dataset: self.dataset.clone(),
            geojson,
            bbox,
            dry_run,
            priority: 0,
            exceed_tile_cap: self.exceed_tile_cap,
        })
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
        /// The ROI's id, or its name: the newest ROI of that name (names
        /// need not be unique; `roi list --name` lists them all).
        roi: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// ROIs newest first, a page at a time: the next page is the same
    /// command with `--before` the id it prints last (on stderr).
    List {
        /// Only ROIs older than this one (the previous page's last).
        #[arg(long)]
        before: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Only the ROIs of this name.
        #[arg(long)]
        name: Option<String>,
        /// Print JSON (`rois` and the `next` cursor).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
}

/// `GET /api/v1/rois` for a page, of one name where `name` is given.
fn list_path(limit: u32, before: Option<&str>, name: Option<&str>) -> String {
    let mut path = super::page_path("/api/v1/rois", limit, before);
    if let Some(name) = name {
        path.push('&');
        path.push_str(
            &url::form_urlencoded::Serializer::new(String::new())
                .append_pair("name", name)
                .finish(),
        );
    }
    path
}

/// The id of the newest ROI called `name`; says so on stderr where there
/// are several of that name.
async fn newest_named(c: &super::http::Client, name: &str) -> anyhow::Result<uuid::Uuid> {
    let page: RoiPage = c.get(&list_path(2, None, Some(name))).await?;
    let Some(newest) = page.rois.first() else {
        anyhow::bail!(
            "no ROI is named {name:?}, and it is not an ROI id (a UUID); \
             `flotilla roi list` shows the ROIs there are"
        );
    };
    if page.rois.len() > 1 {
        eprintln!(
            "several ROIs are named {name:?}; this is the newest, {} (submitted {}); \
             `flotilla roi list --name {name:?}` lists them all",
            newest.id,
            newest.created_at.format("%Y-%m-%d %H:%M:%S UTC")
        );
    }
    Ok(newest.id)
}

pub async fn roi(cmd: RoiCommand) -> anyhow::Result<()> {
    match cmd {
        RoiCommand::Plan { region, conn } => {
            let c = conn.client()?;
            let p: PlanCounts = c.post("/api/v1/rois/plan", &region.body(true)?).await?;
            println!(
                "total {}  present {}  in flight {}  missing {}",
                p.total, p.present, p.in_flight, p.missing
            );
        }
        RoiCommand::Submit { region, wait, conn } => {
            let c = conn.client()?;
            let made: RoiCreated = c.post("/api/v1/rois", &region.body(false)?).await?;
            print_json(&made)?;
            if wait {
                let mut last = String::new();
                loop {
                    let r: RoiView = c.get(&format!("/api/v1/rois/{}", made.id)).await?;
                    let line = r.progress_line();
                    if line != last {
                        eprintln!("{line}");
                        last = line;
                    }
                    if r.finished {
                        print_json(&r)?;
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        }
        RoiCommand::Show { roi, conn } => {
            let c = conn.client()?;
            let id = match uuid::Uuid::parse_str(&roi) {
                Ok(id) => id,
                Err(_) => newest_named(&c, &roi).await?,
            };
            let r: RoiView = c.get(&format!("/api/v1/rois/{id}")).await?;
            print_json(&r)?;
        }
        RoiCommand::List {
            before,
            limit,
            name,
            json,
            conn,
        } => {
            let page: RoiPage = conn
                .client()?
                .get(&list_path(limit, before.as_deref(), name.as_deref()))
                .await?;
            if json {
                return print_json(&page);
            }
            println!(
                "{:<36}  {:<10}  {:<20}  {:<12}  {:>4}  {:>15}  CREATED (UTC)",
                "ID", "STATE", "NAME", "DATASET", "YEAR", "TILES DONE"
            );
            for r in &page.rois {
                println!(
                    "{:<36}  {:<10}  {:<20}  {:<12}  {:>4}  {:>15}  {}",
                    r.id,
                    r.state.as_str(),
                    r.name,
                    r.dataset,
                    r.year,
                    format!("{}/{}", r.tiles.done, r.tiles.total()),
                    r.created_at.format("%Y-%m-%d %H:%M:%S")
                );
            }
            if let Some(next) = page.next {
                eprintln!("older ROIs: --before {next}");
            }
        }
    }
    Ok(())
}
