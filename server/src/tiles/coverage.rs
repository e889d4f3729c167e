//! Coverage: which (dataset, year, tile) embeddings exist.
//!
//! Rows come from an imported geotessera `manifest.parquet` (`manifest`
//! reads it, [`Import`] records it) or are recorded when the fleet finishes
//! a tile.

use flotilla_core::grid::TileId;
use sqlx::PgPool;

/// One manifest row that names an existing tile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ManifestTile {
    pub year: i32,
    pub tile: TileId,
    pub grid_size: i64,
    pub scales_size: i64,
}

/// An import of manifest tiles: one transaction, added to a batch at a
/// time, nothing visible until [`Import::commit`] (dropped unfinished, it
/// rolls back).
pub struct Import<'a> {
    tx: sqlx::Transaction<'a, sqlx::Postgres>,
    dataset: String,
    recorded: u64,
}

impl<'a> Import<'a> {
    /// Begins an import into `dataset`, after any other import into it has
    /// ended: two at once over the same tiles would upsert them in their own
    /// orders and could deadlock each other.
    pub async fn begin(db: &'a PgPool, dataset: &str) -> Result<Import<'a>, sqlx::Error> {
        let mut tx = db.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('flotilla-coverage-import:' || $1))")
            .bind(dataset)
            .execute(&mut *tx)
            .await?;
        Ok(Import {
            tx,
            dataset: dataset.to_string(),
            recorded: 0,
        })
    }

    /// Records `tiles` as present (a tile the fleet made stays the
    /// fleet's; a tile listed twice is recorded once).
    pub async fn add(&mut self, tiles: &[ManifestTile]) -> Result<(), sqlx::Error> {
        let years: Vec<i32> = tiles.iter().map(|t| t.year).collect();
        let iys: Vec<i32> = tiles.iter().map(|t| t.tile.iy()).collect();
        let ixs: Vec<i32> = tiles.iter().map(|t| t.tile.ix()).collect();
        let grid: Vec<i64> = tiles.iter().map(|t| t.grid_size).collect();
        let scales: Vec<i64> = tiles.iter().map(|t| t.scales_size).collect();
        let done = sqlx::query(
            "INSERT INTO coverage (dataset, year, iy, ix, source, grid_size, scales_size)
             SELECT DISTINCT ON (y, iy, ix) $1, y, iy, ix, 'import', g, s
             FROM unnest($2::int[], $3::int[], $4::int[], $5::bigint[], $6::bigint[])
                  AS t(y, iy, ix, g, s)
             ON CONFLICT (dataset, year, iy, ix) DO UPDATE
                 SET grid_size = EXCLUDED.grid_size, scales_size = EXCLUDED.scales_size,
                     recorded_at = now()
                 WHERE coverage.source = 'import'",
        )
        .bind(&self.dataset)
        .bind(&years)
        .bind(&iys)
        .bind(&ixs)
        .bind(&grid)
        .bind(&scales)
        .execute(&mut *self.tx)
        .await?;
        self.recorded += done.rows_affected();
        Ok(())
    }

    /// Commits; returns the coverage rows inserted or updated.
    pub async fn commit(self) -> Result<u64, sqlx::Error> {
        self.tx.commit().await?;
        Ok(self.recorded)
    }
}

/// Records a tile the fleet produced, inside the completion's transaction.
pub async fn record_fleet(
    conn: &mut sqlx::PgConnection,
    dataset: &str,
    year: i32,
    tile: TileId,
    grid_size: i64,
    scales_size: i64,
    job: uuid::Uuid,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO coverage (dataset, year, iy, ix, source, grid_size, scales_size, job_id)
         VALUES ($1, $2, $3, $4, 'fleet', $5, $6, $7)
         ON CONFLICT (dataset, year, iy, ix) DO UPDATE
             SET source = 'fleet', grid_size = EXCLUDED.grid_size,
                 scales_size = EXCLUDED.scales_size, job_id = EXCLUDED.job_id,
                 recorded_at = now()",
    )
    .bind(dataset)
    .bind(year)
    .bind(tile.iy())
    .bind(tile.ix())
    .bind(grid_size)
    .bind(scales_size)
    .bind(job)
    .execute(conn)
    .await?;
    Ok(())
}
