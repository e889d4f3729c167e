//! ROI planning and submission.
//!
//! Region → tiles → minus coverage and live tile jobs → one job per missing
//! tile, inserted in bulk in one transaction.

use std::collections::HashSet;

use flotilla_core::api::rois::{PlanCounts, RoiCreated, RoiRequest, MAX_ROI_TILES};
use flotilla_core::api::FieldError;
use flotilla_core::grid::TileId;
use flotilla_core::job::{JobSpec, TileJob};
use flotilla_core::roi::{Region, TileSet};
use sqlx::PgPool;
use uuid::Uuid;

use crate::queue::submit::{submit_in, within_waiting_cap, NewJob, WaitingCapExceeded};

/// Jobs per insert statement: a million tiles go in 20 round trips, each
/// small enough that its parameter arrays stay well under PostgreSQL's
/// 1 GB message limit.
pub const INSERT_BATCH: usize = 50_000;

/// A request whose region, year and name have been checked, and whose
/// tiles are within [`MAX_ROI_TILES`] unless it asked to exceed it (which
/// the handler allows admin tokens only).
#[derive(Debug, Clone)]
pub struct ValidRoi {
    pub name: String,
    pub year: i32,
    pub dataset: String,
    pub region: Region,
    /// The region's tiles.
    pub tiles: TileSet,
    /// The region as given, stored with the ROI.
    pub region_json: serde_json::Value,
    pub priority: i32,
}

/// Whether any string or key in `v` holds a NUL, which jsonb refuses.
fn has_nul(v: &serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

impl TryFrom<RoiRequest> for ValidRoi {
    type Error = FieldError;

    /// Parses the region and checks the rest (not whether the dataset exists).
    fn try_from(req: RoiRequest) -> Result<Self, FieldError> {
        flotilla_core::job::check_name("name", &req.name)?;
        super::check_year(req.year)?;
        if !super::valid_dataset_name(&req.dataset) {
            return Err(FieldError::new(
                "dataset",
                format!("`dataset` {:?} is not a dataset name", req.dataset),
            ));
        }
        if !flotilla_core::job::limits::PRIORITY_RANGE.contains(&req.priority) {
            return Err(FieldError::new(
                "priority",
                "`priority` must be in -1000..=1000",
            ));
        }
        let (region, region_json) = match (req.geojson, req.bbox) {
            (Some(_), Some(_)) => {
                return Err(FieldError::new("geojson", "give `geojson` or `bbox`, not both"))
            }
            (None, None) => {
                return Err(FieldError::new(
                    "geojson",
                    "give the region as `geojson` (Polygon or MultiPolygon) or `bbox` [min_lon, min_lat, max_lon, max_lat]",
                ))
            }
            (Some(g), None) => {
                if has_nul(&g) {
                    return Err(FieldError::at("geojson", "contains a NUL character"));
                }
                let region = Region::from_geojson(&g)
                    .map_err(|e| FieldError::new("geojson", format!("`geojson`: {e}")))?;
                (region, serde_json::json!({ "geojson": g }))
            }
            (None, Some([w, s, e, n])) => {
                let region = Region::from_bbox(w, s, e, n)
                    .map_err(|e| FieldError::new("bbox", format!("`bbox`: {e}")))?;
                (region, serde_json::json!({ "bbox": [w, s, e, n] }))
            }
        };
        let tiles = region.tiles();
        let count = tiles.len() as u64;
        if count > MAX_ROI_TILES && !req.exceed_tile_cap {
            let field = if req.bbox.is_some() {
                "bbox"
            } else {
                "geojson"
            };
            return Err(FieldError::at(
                field,
                format_args!(
                    "covers {count} tiles; one ROI may cover at most {MAX_ROI_TILES}. Split \
                     the region into ROIs of at most {MAX_ROI_TILES} tiles each, or have an \
                     admin submit it with `exceed_tile_cap: true` \
                     (`flotilla roi submit --exceed-tile-cap`)"
                ),
            ));
        }
        Ok(ValidRoi {
            name: req.name,
            year: req.year,
            dataset: req.dataset,
            region,
            tiles,
            region_json,
            priority: req.priority,
        })
    }
}

/// The tiles to make and the counts.
#[derive(Debug, Clone)]
pub struct Plan {
    pub counts: PlanCounts,
    pub missing: Vec<TileId>,
}

/// Plans `tiles` of (dataset, year) against what the database knows, in the
/// caller's transaction (so a submission sees what it inserts against).
pub async fn plan_in(
    conn: &mut sqlx::PgConnection,
    dataset: &str,
    year: i32,
    tiles: &TileSet,
) -> Result<Plan, sqlx::Error> {
    let total = tiles.len() as u64;
    let (Some(first), Some(last)) = (tiles.rows().first(), tiles.rows().last()) else {
        return Ok(Plan {
            counts: PlanCounts::default(),
            missing: Vec::new(),
        });
    };
    let rows = (first.iy, last.iy);
    let present: HashSet<TileId> = tiles_in_rows(
        &mut *conn,
        "SELECT iy, ix FROM coverage WHERE dataset = $1 AND year = $2 AND iy BETWEEN $3 AND $4",
        (dataset, year, rows),
    )
    .await?
    .filter(|t| tiles.contains(*t))
    .collect();
    let in_flight: HashSet<TileId> = tiles_in_rows(
        &mut *conn,
        "SELECT t.iy, t.ix FROM tile_jobs t JOIN jobs j ON j.id = t.job_id
         WHERE t.dataset = $1 AND t.year = $2 AND t.iy BETWEEN $3 AND $4
           AND j.state NOT IN ('failed', 'cancelled')",
        (dataset, year, rows),
    )
    .await?
    .filter(|t| tiles.contains(*t) && !present.contains(t))
    .collect();
    let mut missing = Vec::with_capacity(tiles.len() - present.len() - in_flight.len());
    missing.extend(
        tiles
            .iter()
            .filter(|t| !present.contains(t) && !in_flight.contains(t)),
    );
    Ok(Plan {
        counts: PlanCounts {
            total,
            present: present.len() as u64,
            in_flight: in_flight.len() as u64,
            missing: missing.len() as u64,
        },
        missing,
    })
}

/// Plans without submitting.
pub async fn plan(db: &PgPool, roi: &ValidRoi) -> Result<PlanCounts, sqlx::Error> {
    let mut conn = db.acquire().await?;
    Ok(plan_in(&mut conn, &roi.dataset, roi.year, &roi.tiles)
        .await?
        .counts)
}

/// Plans and inserts one job per missing tile, the ROI row and the tile →
/// job rows, in one transaction. Submissions of the same (dataset, year)
/// are serialised by an advisory lock, so two at once cannot both find a
/// tile missing and add it twice.
pub async fn submit(
    db: &PgPool,
    roi: &ValidRoi,
    checkpoint_sha256: &str,
    fetch_command: Option<&str>,
    submitter: &str,
    owner: Option<Uuid>,
    waiting_cap: Option<crate::queue::submit::WaitingCap<'_>>,
) -> Result<Result<RoiCreated, WaitingCapExceeded>, sqlx::Error> {
    let started = std::time::Instant::now();
    let mut tx = db.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('flotilla-tiles:' || $1 || ':' || $2))")
        .bind(&roi.dataset)
        .bind(roi.year.to_string())
        .execute(&mut *tx)
        .await?;
    let plan = plan_in(&mut tx, &roi.dataset, roi.year, &roi.tiles).await?;
    if let Err(over) =
        within_waiting_cap(&mut tx, submitter, plan.counts.missing, waiting_cap).await?
    {
        return Ok(Err(over));
    }
    let plan_ms = started.elapsed().as_millis() as u64;
    let inserting = std::time::Instant::now();
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO rois (id, name, dataset, year, region, total, present, in_flight, submitted,
                           submitter, priority)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(id)
    .bind(&roi.name)
    .bind(&roi.dataset)
    .bind(roi.year)
    .bind(&roi.region_json)
    .bind(plan.counts.total as i64)
    .bind(plan.counts.present as i64)
    .bind(plan.counts.in_flight as i64)
    .bind(plan.counts.missing as i64)
    .bind(submitter)
    .bind(roi.priority)
    .execute(&mut *tx)
    .await?;
    for chunk in plan.missing.chunks(INSERT_BATCH) {
        let jobs: Vec<NewJob> = chunk
            .iter()
            .map(|tile| NewJob {
                spec: JobSpec::Tile(TileJob {
                    dataset: roi.dataset.clone(),
                    year: roi.year,
                    tile: *tile,
                    checkpoint_sha256: checkpoint_sha256.to_string(),
                    fetch_command: fetch_command.map(str::to_string),
                }),
                labels: Default::default(),
                priority: roi.priority,
                max_attempts: 3,
                cost: 1,
                submitter: submitter.to_string(),
                parent_id: Some(id),
                child_index: None,
                owner,
            })
            .collect();
        let ids = submit_in(&mut tx, &jobs).await?;
        let iys: Vec<i32> = chunk.iter().map(|t| t.iy()).collect();
        let ixs: Vec<i32> = chunk.iter().map(|t| t.ix()).collect();
        sqlx::query(
            "INSERT INTO tile_jobs (dataset, year, iy, ix, job_id, roi_id)
             SELECT $1, $2, t.iy, t.ix, t.job, $6
             FROM unnest($3::int[], $4::int[], $5::uuid[]) AS t(iy, ix, job)
             ON CONFLICT (dataset, year, iy, ix)
             DO UPDATE SET job_id = EXCLUDED.job_id, roi_id = EXCLUDED.roi_id",
        )
        .bind(&roi.dataset)
        .bind(roi.year)
        .bind(&iys)
        .bind(&ixs)
        .bind(&ids)
        .bind(id)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(Ok(RoiCreated {
        id,
        counts: plan.counts,
        submitted: plan.counts.missing,
        plan_ms,
        insert_ms: inserting.elapsed().as_millis() as u64,
    }))
}

/// The tiles `sql` returns as (iy, ix) for a dataset, a year and a band
/// of grid rows (`$1` to `$4`).
async fn tiles_in_rows(
    conn: &mut sqlx::PgConnection,
    sql: &'static str,
    (dataset, year, (lo, hi)): (&str, i32, (i32, i32)),
) -> Result<impl Iterator<Item = TileId>, sqlx::Error> {
    let cells: Vec<(i32, i32)> = sqlx::query_as(sql)
        .bind(dataset)
        .bind(year)
        .bind(lo)
        .bind(hi)
        .fetch_all(conn)
        .await?;
    Ok(cells
        .into_iter()
        .filter_map(|(iy, ix)| TileId::from_cell(ix, iy).ok()))
}
