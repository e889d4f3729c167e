//! A geotessera `manifest.parquet` upload, into `coverage`.
//!
//! The upload is spooled to a temporary file (`sandbox::spool`) and read by
//! a child `flotilla __read-manifest` under an address-space and CPU limit:
//! a parquet page declares its own uncompressed size, which the reader
//! allocates and fills before it finds the data short, so a small hostile
//! file can ask for 2 GiB a column; in the server that was its memory, in
//! the child it is the child's death and a 422. The child writes the
//! manifest's tiles to a pipe as fixed-size records, and the server adds
//! them to `coverage` a batch at a time inside one transaction: it holds a
//! batch, never the manifest, and a manifest refused part way (a bad row,
//! the reader killed at its limit) commits nothing.

use std::time::Duration;

use flotilla_core::grid::TileId;
use parquet::file::reader::{ChunkReader, FileReader, SerializedFileReader};
use parquet::record::Field;
use sqlx::PgPool;
use tokio::io::{AsyncRead, AsyncReadExt, BufReader};

use super::coverage::{self, ManifestTile};
use super::sandbox::{self, ChildArgs, Ended, Limits, Spooled, REFUSED};

/// Largest accepted manifest (geotessera's is tens of MB). It goes to
/// disk, not memory.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 30;
/// The reader's address space: the executable (165 MB in a debug build)
/// and a few pages of five columns, with room to spare; far less than a
/// hostile page may declare (up to 2 GiB).
const ADDRESS_SPACE: u64 = 3 << 29;
/// CPU seconds for the reader: a manifest of ten million rows takes
/// seconds.
const MAX_CPU_SECONDS: u64 = 120;
/// Wall time before the reader's process group is killed and the import
/// rolled back (it waits on the database as the batches go in).
const MAX_WALL: Duration = Duration::from_secs(600);
/// Imports at a time: each holds a pool connection and a transaction.
static IMPORTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);
/// Tiles per insert statement.
const BATCH: usize = 50_000;

/// The pipe's records: a tile (TILE, then year, ix, iy as i32 and grid_size,
/// scales_size as i64, little-endian) and the end (END, then the rows read
/// as u64). A pipe that ends without END is a reader that died.
const TILE: u8 = b'T';
const END: u8 = b'E';
const TILE_BYTES: usize = 4 * 3 + 8 * 2;

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
    #[error("writing the tiles out: {0}")]
    Write(#[from] std::io::Error),
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

/// Reads a manifest, handing `each` every row whose `grid_size` and
/// `scales_size` are both > 0 (a tile exists only then), in file order.
/// Only the five columns are read. Returns the number of rows read.
pub fn read_manifest<R: ChunkReader + 'static>(
    file: R,
    mut each: impl FnMut(ManifestTile) -> Result<(), ManifestError>,
) -> Result<usize, ManifestError> {
    let reader = SerializedFileReader::new(file)?;
    let root = reader.metadata().file_metadata().schema();
    let mut fields = Vec::with_capacity(COLUMNS.len());
    for c in COLUMNS {
        let field = root
            .get_fields()
            .iter()
            .find(|f| f.name() == c)
            .ok_or(ManifestError::MissingColumn(c))?;
        fields.push(field.clone());
    }
    let projection = parquet::schema::types::Type::group_type_builder(root.name())
        .with_fields(fields)
        .build()?;
    let mut rows = 0usize;
    for (i, row) in reader.get_row_iter(Some(projection))?.enumerate() {
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
        each(ManifestTile {
            year: year as i32,
            tile,
            grid_size: grid as i64,
            scales_size: scales as i64,
        })?;
    }
    Ok(rows)
}

/// What an import recorded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Imported {
    /// Rows in the manifest.
    pub rows: u64,
    /// Rows that name an existing tile.
    pub tiles: u64,
    /// Coverage rows inserted or updated.
    pub recorded: u64,
}

/// Why a manifest was not imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// Not a valid manifest, or one the reader died on: the message says
    /// why (an answer for the client). Nothing was recorded.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    /// The reader could not run, or broke its protocol (ours; a 500).
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

/// Reads the spooled manifest in a child and records its tiles for
/// `dataset`, all or nothing.
pub async fn import(db: &PgPool, dataset: &str, upload: &Spooled) -> Result<Imported, ImportError> {
    let _permit = IMPORTS
        .acquire()
        .await
        .map_err(|e| anyhow::anyhow!("manifest imports closed: {e}"))?;
    let limits = Limits {
        address_space: ADDRESS_SPACE,
        cpu_seconds: MAX_CPU_SECONDS,
    };
    let mut child = sandbox::child("__read-manifest", limits, upload.path())?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let run = async {
        let errors = tokio::spawn(sandbox::read_bounded(stderr));
        let mut import = coverage::Import::begin(db, dataset).await?;
        let (tiles, rows) = match stream_tiles(stdout, &mut import).await {
            Ok(read) => read,
            Err(e) => {
                // The database or the pipe failed, not the manifest: stop
                // the reader (it may be blocked writing) and roll back.
                let _ = child.start_kill();
                return Err(e);
            }
        };
        let status = child
            .wait()
            .await
            .map_err(|e| anyhow::anyhow!("waiting for the manifest reader: {e}"))?;
        let said = errors
            .await
            .map_err(|e| anyhow::anyhow!("the reader's stderr: {e}"))?
            .unwrap_or_default();
        match sandbox::ended(status) {
            Ended::Read => {
                let rows = rows.ok_or_else(|| {
                    anyhow::anyhow!("the manifest reader exited 0 without its end record")
                })?;
                let recorded = import.commit().await?;
                Ok(Imported {
                    rows,
                    tiles,
                    recorded,
                })
            }
            // A transaction dropped unfinished is rolled back.
            Ended::Refused => Err(ImportError::Refused(said)),
            Ended::Killed(sig) => {
                tracing::warn!(signal = sig, stderr = %said, "the manifest reader was killed");
                Err(ImportError::Refused(format!(
                    "reading it killed the reader (signal {sig}: past its memory or CPU limit, \
                     or a parquet reader bug); a page may declare more than the reader's {} MiB",
                    ADDRESS_SPACE >> 20
                )))
            }
            Ended::Failed(code) => Err(ImportError::Failed(anyhow::anyhow!(
                "the manifest reader exited with {code:?}: {said}"
            ))),
        }
    };
    match tokio::time::timeout(MAX_WALL, run).await {
        Ok(done) => done,
        // kill_on_drop ends the child; the transaction rolls back.
        Err(_) => {
            tracing::warn!(
                dataset,
                "a manifest import ran past {} s and was stopped",
                MAX_WALL.as_secs()
            );
            Err(ImportError::Refused(format!(
                "reading and recording it took longer than {} s (the time may have gone to \
                 the database as well as to the file); nothing was recorded",
                MAX_WALL.as_secs()
            )))
        }
    }
}

/// Adds the pipe's tiles to `import` a batch at a time. Returns the tiles
/// read and the rows the reader counted (None when the pipe ended before
/// the end record: a reader that died, which the exit status explains).
async fn stream_tiles(
    pipe: impl AsyncRead + Unpin,
    import: &mut coverage::Import<'_>,
) -> Result<(u64, Option<u64>), ImportError> {
    let mut pipe = BufReader::with_capacity(1 << 16, pipe);
    let mut batch = Vec::with_capacity(BATCH);
    let mut tiles = 0u64;
    let mut record = [0u8; TILE_BYTES];
    let rows = loop {
        let tag = match pipe.read_u8().await {
            Ok(tag) => tag,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break None,
            Err(e) => return Err(anyhow::anyhow!("reading the manifest reader: {e}").into()),
        };
        match tag {
            TILE => {
                if pipe.read_exact(&mut record).await.is_err() {
                    break None;
                }
                batch.push(decode_tile(&record)?);
                tiles += 1;
                if batch.len() == BATCH {
                    import.add(&batch).await?;
                    batch.clear();
                }
            }
            END => match pipe.read_u64_le().await {
                Ok(rows) => break Some(rows),
                Err(_) => break None,
            },
            other => {
                return Err(anyhow::anyhow!("the manifest reader wrote record type {other}").into())
            }
        }
    };
    if rows.is_some() && !batch.is_empty() {
        import.add(&batch).await?;
    }
    Ok((tiles, rows))
}

fn encode_tile(t: &ManifestTile) -> [u8; TILE_BYTES] {
    let mut out = [0u8; TILE_BYTES];
    out[0..4].copy_from_slice(&t.year.to_le_bytes());
    out[4..8].copy_from_slice(&t.tile.ix().to_le_bytes());
    out[8..12].copy_from_slice(&t.tile.iy().to_le_bytes());
    out[12..20].copy_from_slice(&t.grid_size.to_le_bytes());
    out[20..28].copy_from_slice(&t.scales_size.to_le_bytes());
    out
}

fn decode_tile(b: &[u8; TILE_BYTES]) -> anyhow::Result<ManifestTile> {
    let i32_at = |k: usize| i32::from_le_bytes([b[k], b[k + 1], b[k + 2], b[k + 3]]);
    let i64_at = |k: usize| {
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[k..k + 8]);
        i64::from_le_bytes(v)
    };
    let tile = TileId::from_cell(i32_at(4), i32_at(8))
        .map_err(|e| anyhow::anyhow!("the manifest reader wrote a tile off the grid: {e}"))?;
    Ok(ManifestTile {
        year: i32_at(0),
        tile,
        grid_size: i64_at(12),
        scales_size: i64_at(20),
    })
}

/// The hidden `flotilla __read-manifest`: limit itself, then write the
/// manifest's tiles to stdout as records. The exit code is 0 (read; the end record written), [`REFUSED`]
/// (not a valid manifest; stderr says why) or 1 (could not read).
pub fn child_main(a: &ChildArgs) -> i32 {
    use std::io::Write;
    if let Err(e) = a.apply() {
        eprintln!("{e}");
        return 1;
    }
    let file = match std::fs::File::open(&a.path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("opening the spooled upload: {e}");
            return 1;
        }
    };
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let read = read_manifest(file, |t| {
        out.write_all(&[TILE])?;
        out.write_all(&encode_tile(&t))?;
        Ok(())
    });
    match read {
        Ok(rows) => {
            let end = out
                .write_all(&[END])
                .and_then(|()| out.write_all(&(rows as u64).to_le_bytes()))
                .and_then(|()| out.flush());
            match end {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("writing the tiles out: {e}");
                    1
                }
            }
        }
        // The server went away (or its pipe did): not the manifest's fault.
        Err(ManifestError::Write(e)) => {
            eprintln!("writing the tiles out: {e}");
            1
        }
        Err(e) => {
            eprintln!("{e}");
            REFUSED
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_records_round_trip() {
        let t = ManifestTile {
            year: 2024,
            tile: TileId::from_point(-3.05, 40.05).unwrap(),
            grid_size: 1_000_000_000_000,
            scales_size: 7,
        };
        assert_eq!(decode_tile(&encode_tile(&t)).unwrap(), t);
        // A record naming a cell off the grid is the reader's bug, not a tile.
        let mut bad = encode_tile(&t);
        bad[4..8].copy_from_slice(&i32::MAX.to_le_bytes());
        assert!(decode_tile(&bad).is_err());
    }
}
