//! Where submitted ROIs stand: each tile's state from `coverage` and
//! `tile_jobs`, counted or per tile, the pace of the last hour, and the
//! list of ROIs newest first.
//!
//! An ROI's tiles are its stored region's cover, computed again (the sweep
//! is proportional to spans, not tiles). They are asked of the database as
//! column spans per row, so a count of 250,000 tiles ships one row per
//! state, not one per tile.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_core::api::rois::{RoiPage, RoiSummary, RoiView, TileCounts, TileState};
use flotilla_core::grid::TileId;
use flotilla_core::job::JobState;
use flotilla_core::roi::{Region, TileSet};
use sqlx::PgPool;
use uuid::Uuid;

/// A submitted ROI and its tiles.
#[derive(Debug, Clone)]
pub struct Roi {
    pub id: Uuid,
    pub name: String,
    pub dataset: String,
    pub year: i32,
    pub submitter: String,
    pub created_at: DateTime<Utc>,
    pub tiles: TileSet,
    /// The region as it was given (`{"geojson": …}` or `{"bbox": […]}`).
    pub region: serde_json::Value,
    /// What its tile jobs were queued with.
    pub priority: i32,
}

/// One tile as the map shows it: its state and the job to open, if any
/// (the job that made it, or the one making it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileOnMap {
    pub tile: TileId,
    pub state: TileState,
    pub job: Option<Uuid>,
}

/// Tiles of an ROI finished by the fleet in the last hour, or since the ROI
/// was submitted if that is less than an hour ago.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pace {
    pub done: u64,
    pub window: Duration,
}

impl Pace {
    /// Tiles per hour over the window; `None` before any finished.
    pub fn per_hour(&self) -> Option<f64> {
        let hours = self.window.as_secs_f64() / 3600.0;
        (self.done > 0 && hours > 0.0).then(|| self.done as f64 / hours)
    }

    /// Time until the queued and running tiles are done at this pace;
    /// `Some(ZERO)` with nothing left to do, `None` when no tile finished
    /// in the window to measure a pace by.
    pub fn eta(&self, counts: &TileCounts) -> Option<Duration> {
        let left = counts.queued + counts.running;
        if left == 0 {
            return Some(Duration::ZERO);
        }
        let per_hour = self.per_hour()?;
        Some(Duration::from_secs_f64(left as f64 / per_hour * 3600.0))
    }
}

#[derive(sqlx::FromRow)]
struct RoiRow {
    id: Uuid,
    name: String,
    dataset: String,
    year: i32,
    submitter: String,
    created_at: DateTime<Utc>,
    region: serde_json::Value,
    priority: i32,
}

const ROI_COLUMNS: &str = "id, name, dataset, year, submitter, created_at, region, priority";

/// A stored region that no longer parses is a row that does not decode:
/// it was checked when it was submitted.
fn bad_row(problem: String) -> sqlx::Error {
    sqlx::Error::Decode(problem.into())
}

/// The tiles of a stored region (`{"geojson": …}` or `{"bbox": [w, s, e, n]}`).
fn region_tiles(region: &serde_json::Value) -> Result<TileSet, sqlx::Error> {
    let parsed = if let Some(g) = region.get("geojson") {
        Region::from_geojson(g)
    } else if let Some(b) = region.get("bbox") {
        let b: [f64; 4] = serde_json::from_value(b.clone())
            .map_err(|e| bad_row(format!("a stored ROI's bbox: {e}")))?;
        Region::from_bbox(b[0], b[1], b[2], b[3])
    } else {
        return Err(bad_row(
            "a stored ROI's region has neither geojson nor bbox".into(),
        ));
    };
    parsed
        .map(|r| r.tiles())
        .map_err(|e| bad_row(format!("a stored ROI's region: {e}")))
}

impl TryFrom<RoiRow> for Roi {
    type Error = sqlx::Error;
    fn try_from(r: RoiRow) -> Result<Roi, sqlx::Error> {
        Ok(Roi {
            tiles: region_tiles(&r.region)?,
            region: r.region,
            id: r.id,
            name: r.name,
            dataset: r.dataset,
            year: r.year,
            submitter: r.submitter,
            created_at: r.created_at,
            priority: r.priority,
        })
    }
}

/// An ROI with its tiles, if there is one by that id.
pub async fn get(db: &PgPool, id: Uuid) -> Result<Option<Roi>, sqlx::Error> {
    let row: Option<RoiRow> =
        sqlx::query_as(&format!("SELECT {ROI_COLUMNS} FROM rois WHERE id = $1"))
            .bind(id)
            .fetch_optional(db)
            .await?;
    row.map(Roi::try_from).transpose()
}

/// An ROI with its submission's counts and its jobs by state (the tiles
/// by state are [`counts`]'s).
pub async fn view(db: &PgPool, id: Uuid) -> Result<Option<RoiView>, sqlx::Error> {
    #[derive(sqlx::FromRow)]
    struct Row {
        id: Uuid,
        name: String,
        dataset: String,
        year: i32,
        total: i64,
        present: i64,
        in_flight: i64,
        submitted: i64,
        created_at: chrono::DateTime<chrono::Utc>,
        priority: i32,
    }
    let row: Option<Row> = sqlx::query_as(
        "SELECT id, name, dataset, year, total, present, in_flight, submitted, created_at, priority
         FROM rois WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(db)
    .await?;
    let Some(roi) = row else {
        return Ok(None);
    };
    let states: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT state, count(*), COALESCE(sum(progress_done), 0)::bigint,
                COALESCE(sum(progress_total), 0)::bigint
         FROM jobs WHERE parent_id = $1 GROUP BY state",
    )
    .bind(roi.id)
    .fetch_all(db)
    .await?;
    let finished = states
        .iter()
        .all(|(s, ..)| matches!(s.as_str(), "succeeded" | "failed" | "cancelled"));
    Ok(Some(RoiView {
        id: roi.id,
        name: roi.name,
        dataset: roi.dataset,
        year: roi.year,
        total: roi.total,
        present: roi.present,
        in_flight: roi.in_flight,
        submitted: roi.submitted,
        created_at: roi.created_at,
        priority: roi.priority,
        pixels_done: states.iter().map(|s| s.2).sum(),
        pixels_total: states.iter().map(|s| s.3).sum(),
        jobs: states.into_iter().map(|(s, n, _, _)| (s, n)).collect(),
        finished,
        // Counted from the region's tiles by `progress::counts`.
        tiles: Default::default(),
    }))
}

/// The tiles as three arrays (row, first column, column past the last),
/// one entry per span: how the queries below take them.
fn spans(tiles: &TileSet) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for row in tiles.rows() {
        for &(start, end) in &row.spans {
            out.0.push(row.iy);
            out.1.push(start);
            out.2.push(end);
        }
    }
    out
}

/// The spans as a relation `r(iy, lo, hi)` from parameters $3–$5.
const SPANS: &str = "r AS (SELECT * FROM unnest($3::int[], $4::int[], $5::int[]) AS r(iy, lo, hi))";

fn job_state(text: &str) -> Result<TileState, sqlx::Error> {
    text.parse::<JobState>()
        .map(TileState::of_job)
        .map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

/// The ROI's tiles by state, counted by the database.
pub async fn counts(db: &PgPool, roi: &Roi) -> Result<TileCounts, sqlx::Error> {
    let (iys, los, his) = spans(&roi.tiles);
    let rows: Vec<(String, i64)> = sqlx::query_as(&format!(
        "WITH {SPANS},
         covered AS (
             SELECT count(*) AS n FROM r JOIN coverage c
                 ON c.dataset = $1 AND c.year = $2 AND c.iy = r.iy
                AND c.ix >= r.lo AND c.ix < r.hi),
         jobs AS (
             SELECT j.state, count(*) AS n FROM r JOIN tile_jobs t
                 ON t.dataset = $1 AND t.year = $2 AND t.iy = r.iy
                AND t.ix >= r.lo AND t.ix < r.hi
             JOIN jobs j ON j.id = t.job_id
             WHERE NOT EXISTS (SELECT 1 FROM coverage c WHERE c.dataset = $1
                               AND c.year = $2 AND c.iy = t.iy AND c.ix = t.ix)
             GROUP BY j.state)
         SELECT 'covered', n FROM covered UNION ALL SELECT state, n FROM jobs"
    ))
    .bind(&roi.dataset)
    .bind(roi.year)
    .bind(&iys)
    .bind(&los)
    .bind(&his)
    .fetch_all(db)
    .await?;
    let mut counts = TileCounts::default();
    for (state, n) in rows {
        let state = match state.as_str() {
            "covered" => TileState::Done,
            s => job_state(s)?,
        };
        counts.add(state, n.max(0) as u64);
    }
    let known = counts.total();
    counts.missing = (roi.tiles.len() as u64).saturating_sub(known);
    Ok(counts)
}

/// Every tile of the ROI in [`TileSet`] order with its state and job.
/// Ships a row or two per tile: for maps, which are capped.
pub async fn states(db: &PgPool, roi: &Roi) -> Result<Vec<TileOnMap>, sqlx::Error> {
    let (iys, los, his) = spans(&roi.tiles);
    // (iy, ix, job, job state: NULL for a coverage row)
    let rows: Vec<(i32, i32, Option<Uuid>, Option<String>)> = sqlx::query_as(&format!(
        "WITH {SPANS}
         SELECT c.iy, c.ix, c.job_id, NULL::text FROM r JOIN coverage c
             ON c.dataset = $1 AND c.year = $2 AND c.iy = r.iy
            AND c.ix >= r.lo AND c.ix < r.hi
         UNION ALL
         SELECT t.iy, t.ix, t.job_id, j.state FROM r JOIN tile_jobs t
             ON t.dataset = $1 AND t.year = $2 AND t.iy = r.iy
            AND t.ix >= r.lo AND t.ix < r.hi
         JOIN jobs j ON j.id = t.job_id"
    ))
    .bind(&roi.dataset)
    .bind(roi.year)
    .bind(&iys)
    .bind(&los)
    .bind(&his)
    .fetch_all(db)
    .await?;
    // (covered with its job, the tile job and its state)
    type Known = (Option<Option<Uuid>>, Option<(Uuid, TileState)>);
    let mut known: HashMap<(i32, i32), Known> = HashMap::with_capacity(rows.len());
    for (iy, ix, job, state) in rows {
        let entry = known.entry((iy, ix)).or_default();
        match (state, job) {
            (None, job) => entry.0 = Some(job),
            (Some(s), Some(job)) => entry.1 = Some((job, job_state(&s)?)),
            (Some(_), None) => {}
        }
    }
    Ok(roi
        .tiles
        .iter()
        .map(|tile| {
            let (state, job) = match known.get(&(tile.iy(), tile.ix())) {
                // Done: link the job that made it; an imported tile has
                // none, unless a job of ours made it too.
                Some((Some(made_by), tile_job)) => (
                    TileState::Done,
                    made_by.or(tile_job.and_then(|(j, s)| (s == TileState::Done).then_some(j))),
                ),
                Some((None, Some((job, state)))) => (*state, Some(*job)),
                _ => (TileState::Missing, None),
            };
            TileOnMap { tile, state, job }
        })
        .collect())
}

/// Counts of tiles as [`states`] gave them.
pub fn count(tiles: &[TileOnMap]) -> TileCounts {
    let mut counts = TileCounts::default();
    for t in tiles {
        counts.add(t.state, 1);
    }
    counts
}

/// The ROI's tiles the fleet finished in the last hour (or since the ROI
/// was submitted, if later), by the database's clock.
pub async fn pace(db: &PgPool, roi: &Roi) -> Result<Pace, sqlx::Error> {
    let (iys, los, his) = spans(&roi.tiles);
    let (done, window_s): (i64, f64) = sqlx::query_as(&format!(
        "WITH {SPANS}, since AS (SELECT greatest(now() - interval '1 hour', $6) AS t)
         SELECT (SELECT count(*) FROM r JOIN coverage c
                     ON c.dataset = $1 AND c.year = $2 AND c.iy = r.iy
                    AND c.ix >= r.lo AND c.ix < r.hi
                  WHERE c.source = 'fleet' AND c.recorded_at > (SELECT t FROM since)),
                extract(epoch FROM now() - (SELECT t FROM since))::float8"
    ))
    .bind(&roi.dataset)
    .bind(roi.year)
    .bind(&iys)
    .bind(&los)
    .bind(&his)
    .bind(roi.created_at)
    .fetch_one(db)
    .await?;
    Ok(Pace {
        done: done.max(0) as u64,
        window: Duration::from_secs_f64(window_s.max(0.0)),
    })
}

/// The ROI whose submission made tile job `job` (id and name): a tile
/// job's parent is its ROI.
pub async fn roi_of_job(db: &PgPool, job: Uuid) -> Result<Option<(Uuid, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT r.id, r.name FROM jobs j JOIN rois r ON r.id = j.parent_id
         WHERE j.id = $1",
    )
    .bind(job)
    .fetch_optional(db)
    .await
}

/// The job to open for one tile of the ROI: the one that made it, or the
/// one making it.
pub async fn tile_job(db: &PgPool, roi: &Roi, tile: TileId) -> Result<Option<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT COALESCE(
             (SELECT job_id FROM coverage
               WHERE dataset = $1 AND year = $2 AND iy = $3 AND ix = $4),
             (SELECT job_id FROM tile_jobs
               WHERE dataset = $1 AND year = $2 AND iy = $3 AND ix = $4))",
    )
    .bind(&roi.dataset)
    .bind(roi.year)
    .bind(tile.iy())
    .bind(tile.ix())
    .fetch_one(db)
    .await
}

/// ROIs newest first, `limit` of them after `before` (the last id of the
/// previous page; an id that is no ROI gives an empty page), only those
/// called `name` where one is given (names are not unique), each with its
/// tiles counted.
pub async fn list(
    db: &PgPool,
    before: Option<Uuid>,
    name: Option<&str>,
    limit: u32,
) -> Result<RoiPage, sqlx::Error> {
    // Two statements, not `$3 IS NULL OR name = $3`: a prepared statement's
    // generic plan could not use `rois_by_name` for the latter.
    let of_name = if name.is_some() { "AND name = $3" } else { "" };
    // One more than asked: whether there is a next page.
    let sql = format!(
        "SELECT {ROI_COLUMNS} FROM rois
         WHERE ($1::uuid IS NULL
                OR (created_at, id) < (SELECT created_at, id FROM rois WHERE id = $1))
           {of_name}
         ORDER BY created_at DESC, id DESC LIMIT $2"
    );
    let mut query = sqlx::query_as::<_, RoiRow>(&sql)
        .bind(before)
        .bind(i64::from(limit) + 1);
    if let Some(name) = name {
        query = query.bind(name);
    }
    let mut rows = query.fetch_all(db).await?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let mut rois = Vec::with_capacity(rows.len());
    for row in rows {
        let roi = Roi::try_from(row)?;
        let tiles = counts(db, &roi).await?;
        rois.push(RoiSummary {
            id: roi.id,
            name: roi.name,
            dataset: roi.dataset,
            year: roi.year,
            submitter: roi.submitter,
            created_at: roi.created_at,
            state: tiles.state(),
            tiles,
        });
    }
    let next = if more {
        rois.last().map(|r| r.id)
    } else {
        None
    };
    Ok(RoiPage { rois, next })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_regions_give_their_tiles() {
        let bbox = serde_json::json!({ "bbox": [0.01, 52.01, 0.29, 52.09] });
        assert_eq!(region_tiles(&bbox).unwrap().len(), 3);
        let poly = serde_json::json!({ "geojson": { "type": "Polygon",
            "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]]] } });
        assert_eq!(region_tiles(&poly).unwrap().len(), 100);
        assert!(region_tiles(&serde_json::json!({ "point": [0, 0] })).is_err());
        let (iys, los, his) = spans(&region_tiles(&poly).unwrap());
        assert_eq!(iys, (0..10).collect::<Vec<_>>());
        assert!(los.iter().all(|&x| x == 0) && his.iter().all(|&x| x == 10));
    }

    #[test]
    fn eta_is_what_is_left_at_the_pace_of_the_window() {
        let counts = TileCounts {
            queued: 90,
            running: 10,
            done: 50,
            ..TileCounts::default()
        };
        // 50 tiles in half an hour: 100 per hour, so 100 left take an hour.
        let pace = Pace {
            done: 50,
            window: Duration::from_secs(1800),
        };
        assert_eq!(pace.per_hour(), Some(100.0));
        assert_eq!(pace.eta(&counts), Some(Duration::from_secs(3600)));
        let idle = Pace {
            done: 0,
            window: Duration::from_secs(3600),
        };
        assert_eq!(idle.eta(&counts), None);
        let finished = TileCounts {
            done: 5,
            failed: 1,
            ..TileCounts::default()
        };
        assert_eq!(idle.eta(&finished), Some(Duration::ZERO));
    }
}
