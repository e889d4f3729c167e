//! Coverage: which (dataset, year, tile) embeddings exist.
//!
//! Rows come from an imported geotessera `manifest.parquet` or are recorded
//! when the fleet finishes a tile.

use bytes::Bytes;
use flotilla_core::grid::TileId;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use sqlx::PgPool;

/// Rows per insert statement.
const BATCH: usize = 50_000;

/// One manifest row that names an existing tile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ManifestTile {
    pub year: i32,
    pub tile: TileId,
    pub grid_size: i64,
    pub scales_size: i64,
}

/// Why a manifest cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("not a readable parquet file: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("the manifest has no column `{0}` (geotessera's manifest.parquet has year, lon, lat, grid_size, scales_size)")]
    MissingColumn(&'static str),
    #[error("row {row}: column `{column}` is {value}, not a number")]
    NotNumber {
        row: usize,
        column: &'static str,
        value: String,
    },
    #[error("row {row}: {problem}")]
    BadTile { row: usize, problem: String },
}

const COLUMNS: [&str; 5] = ["year", "lon", "lat", "grid_size", "scales_size"];

fn number(field: &Field) -> Option<f64> {
    Some(match field {
        Field::Byte(v) => *v as f64,
        Field::Short(v) => *v as f64,
        Field::Int(v) => *v as f64,
        Field::Long(v) => *v as f64,
        Field::UByte(v) => *v as f64,
        Field::UShort(v) => *v as f64,
        Field::UInt(v) => *v as f64,
        Field::ULong(v) => *v as f64,
        Field::Float(v) => *v as f64,
        Field::Double(v) => *v,
        _ => return None,
    })
}

/// Reads a manifest: every row whose `grid_size` and `scales_size` are both
/// > 0 (a tile exists only then). Returns those and the number of rows read.
pub fn read_manifest(bytes: Bytes) -> Result<(Vec<ManifestTile>, usize), ManifestError> {
    let reader = SerializedFileReader::new(bytes)?;
    let schema = reader.metadata().file_metadata().schema_descr_ptr();
    let names: Vec<String> = schema
        .columns()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    for c in COLUMNS {
        if !names.iter().any(|n| n == c) {
            return Err(ManifestError::MissingColumn(c));
        }
    }
    let mut tiles = Vec::new();
    let mut rows = 0usize;
    for (i, row) in reader.get_row_iter(None)?.enumerate() {
        let row = row?;
        rows += 1;
        let mut vals = [f64::NAN; 5];
        for (name, field) in row.get_column_iter() {
            if let Some(k) = COLUMNS.iter().position(|c| c == name) {
                if matches!(field, Field::Null) {
                    continue;
                }
                vals[k] = number(field).ok_or_else(|| ManifestError::NotNumber {
                    row: i,
                    column: COLUMNS[k],
                    value: field.to_string(),
                })?;
            }
        }
        let [year, lon, lat, grid, scales] = vals;
        // Nulls and zeros: the tile is not there.
        if !(grid > 0.0 && scales > 0.0) {
            continue;
        }
        if !(year.is_finite()
            && year.fract() == 0.0
            && (i32::MIN as f64..=i32::MAX as f64).contains(&year))
        {
            return Err(ManifestError::BadTile {
                row: i,
                problem: format!("year {year} is not a whole number"),
            });
        }
        let tile = TileId::from_point(lon, lat).map_err(|e| ManifestError::BadTile {
            row: i,
            problem: e.to_string(),
        })?;
        tiles.push(ManifestTile {
            year: year as i32,
            tile,
            grid_size: grid as i64,
            scales_size: scales as i64,
        });
    }
    Ok((tiles, rows))
}

/// Records imported tiles for `dataset`, in one transaction.
pub async fn import(
    db: &PgPool,
    dataset: &str,
    tiles: &[ManifestTile],
) -> Result<u64, sqlx::Error> {
    let mut tx = db.begin().await?;
    let mut recorded = 0;
    for chunk in tiles.chunks(BATCH) {
        let years: Vec<i32> = chunk.iter().map(|t| t.year).collect();
        let iys: Vec<i32> = chunk.iter().map(|t| t.tile.iy()).collect();
        let ixs: Vec<i32> = chunk.iter().map(|t| t.tile.ix()).collect();
        let grid: Vec<i64> = chunk.iter().map(|t| t.grid_size).collect();
        let scales: Vec<i64> = chunk.iter().map(|t| t.scales_size).collect();
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
        .bind(dataset)
        .bind(&years)
        .bind(&iys)
        .bind(&ixs)
        .bind(&grid)
        .bind(&scales)
        .execute(&mut *tx)
        .await?;
        recorded += done.rows_affected();
    }
    tx.commit().await?;
    Ok(recorded)
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
