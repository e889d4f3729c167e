//! A tile's input files, checked when opened, then read a window of pixels at a time.
//!
//! A real tile is 1,100 × 1,100 px with a few hundred frames: gigabytes of
//! `.npy` (issue 16: 2.9 GB held 4.0 GB resident when read whole). The
//! encoder needs one window of pixels at a time, so [`TileReader`] checks
//! every header, shape and size when it opens the files, keeps only the
//! days of year, and reads a window's pixels by position when asked
//! ([`TileSource::window`]): an encode's memory is then bounded by the
//! window and the read-ahead depth, not by the tile.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{EncodeError, Result};
use crate::npy::{DType, Header, NpyFile, READ_PIECE_BYTES};
use crate::source::{check_range, TileSource};
use crate::tile::{as_tile_err, check_dims, check_header, tile_err, SarPass, TileInputs};

const DOY_DTYPES: &[DType] = &[DType::I16, DType::U16, DType::I32, DType::I64, DType::U8];

/// One SAR orbit direction's files: (T,H,W,2) i16 VV/VH and its days of year.
#[derive(Debug)]
struct SarFiles {
    data: NpyFile,
    doys: Vec<i32>,
}

/// A tile directory in the geotessera layout, opened and cross-checked.
#[derive(Debug)]
pub struct TileReader {
    dir: PathBuf,
    height: usize,
    width: usize,
    /// (T,H,W,10) u16.
    bands: NpyFile,
    /// (T,H,W) u8 or bool.
    masks: NpyFile,
    doys: Vec<i32>,
    /// Absent files: a pass with no frames.
    ascending: Option<SarFiles>,
    descending: Option<SarFiles>,
}

/// Open a big (T, H, W, ...) array, its dtype, axes and the caps checked
/// before anything else is read.
fn open_checked(path: &Path, dtype: DType, ndim: usize) -> Result<NpyFile> {
    let check = |h: &Header| {
        check_header(path, h.dtype, &h.shape, &[dtype], ndim)?;
        check_dims(path, &h.shape)
    };
    NpyFile::open(path, check).map_err(as_tile_err)
}

fn read_doys(path: &Path, frames: usize, data_file: &str) -> Result<Vec<i32>> {
    let a = crate::npy::read(path).map_err(as_tile_err)?;
    check_header(path, a.dtype, &a.shape, DOY_DTYPES, 1)?;
    if a.shape[0] != frames {
        return Err(tile_err(
            path,
            format!(
                "{} days of year, but {data_file} has {frames} frames",
                a.shape[0]
            ),
        ));
    }
    Ok(a.to_i64()
        .expect("integer dtype checked above")
        .into_iter()
        .map(|v| v as i32)
        .collect())
}

fn open_sar(dir: &Path, name: &str, hw: (usize, usize)) -> Result<Option<SarFiles>> {
    let data_path = dir.join(format!("{name}.npy"));
    let doy_path = dir.join(format!("{name}_doy.npy"));
    match (data_path.exists(), doy_path.exists()) {
        (false, false) => return Ok(None),
        (true, false) => return Err(tile_err(&doy_path, "missing, but its data file exists")),
        (false, true) => return Err(tile_err(&data_path, "missing, but its _doy file exists")),
        _ => {}
    }
    let data = open_checked(&data_path, DType::I16, 4)?;
    let shape = &data.header.shape;
    if (shape[1], shape[2]) != hw || shape[3] != 2 {
        return Err(tile_err(
            &data_path,
            format!(
                "shape {:?}, expected (T, {}, {}, 2) to match bands.npy",
                shape, hw.0, hw.1
            ),
        ));
    }
    let doys = read_doys(&doy_path, shape[0], &format!("{name}.npy"))?;
    Ok(Some(SarFiles { data, doys }))
}

fn u16_le(c: &[u8]) -> u16 {
    u16::from_le_bytes([c[0], c[1]])
}

fn i16_le(c: &[u8]) -> i16 {
    i16::from_le_bytes([c[0], c[1]])
}

/// The pixels `pixels` (ascending, each below `hw`) of every frame of `f`,
/// whose frames are `hw` pixels of `per` elements: (frames, n, per)
/// elements converted by `conv`. Reads each frame's span of the window in
/// pieces of at most [`READ_PIECE_BYTES`], skipping gaps of a piece or more,
/// so the bytes read over a tile's windows are at most the file once.
fn gather<T>(
    f: &NpyFile,
    hw: usize,
    per: usize,
    pixels: &[u32],
    conv: impl Fn(&[u8]) -> T,
) -> Result<Vec<T>> {
    debug_assert!(pixels.windows(2).all(|w| w[0] < w[1]));
    debug_assert!(pixels.last().is_none_or(|&p| (p as usize) < hw));
    let es = f.header.dtype.size();
    let pb = per * es;
    let frames = f.header.shape[0];
    let piece_px = (READ_PIECE_BYTES / pb).max(1);
    let mut out = Vec::with_capacity(frames * pixels.len() * per);
    let mut buf = Vec::new();
    for t in 0..frames {
        let mut i = 0;
        while i < pixels.len() {
            let a = pixels[i] as usize;
            let j = i + pixels[i..].partition_point(|&p| (p as usize) < a + piece_px);
            let b = pixels[j - 1] as usize + 1;
            buf.resize((b - a) * pb, 0);
            f.read_at((t * hw + a) * pb, &mut buf)?;
            for &p in &pixels[i..j] {
                let o = (p as usize - a) * pb;
                out.extend(buf[o..o + pb].chunks_exact(es).map(&conv));
            }
            i = j;
        }
    }
    Ok(out)
}

/// Threads [`count_where`] counts on, at most (one range of pixels each).
const COUNT_THREADS: usize = 8;

/// Pixels a counting thread takes at least: fewer are not worth a thread.
const COUNT_MIN_PIXELS: usize = 16_384;

/// Add one to `counts[k]` for each frame of `f` (frames of `hw` pixels of
/// `pb` bytes) where `valid` holds for pixel `start + k`'s bytes. The
/// pixels are split in ranges over up to [`COUNT_THREADS`] threads, each
/// reading its range a frame at a time (positional reads: the threads do
/// not wait for each other). The first error, in range order, is returned;
/// [`EncodeError::Cancelled`] between frames once `cancel` is set.
fn count_where(
    f: &NpyFile,
    hw: usize,
    pb: usize,
    start: usize,
    cancel: &AtomicBool,
    counts: &mut [u16],
    valid: impl Fn(&[u8]) -> bool + Sync,
) -> Result<()> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, COUNT_THREADS);
    let per = counts.len().div_ceil(threads).max(COUNT_MIN_PIXELS);
    count_in_ranges(f, hw, pb, start, cancel, counts, &valid, per)
}

/// [`count_where`] in ranges of `per` pixels, a thread each.
#[allow(clippy::too_many_arguments)]
fn count_in_ranges(
    f: &NpyFile,
    hw: usize,
    pb: usize,
    start: usize,
    cancel: &AtomicBool,
    counts: &mut [u16],
    valid: &(impl Fn(&[u8]) -> bool + Sync),
    per: usize,
) -> Result<()> {
    debug_assert!(start + counts.len() <= hw, "pixels past the frame's end");
    let per = per.max(1);
    if counts.len() <= per {
        return count_range(f, hw, pb, start, counts, cancel, valid);
    }
    std::thread::scope(|s| {
        let jobs: Vec<_> = counts
            .chunks_mut(per)
            .enumerate()
            .map(|(i, c)| {
                s.spawn(move || count_range(f, hw, pb, start + i * per, c, cancel, valid))
            })
            .collect();
        let mut first = Ok(());
        for job in jobs {
            let r = job
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
}

/// [`count_where`] for the pixels `start..start + counts.len()`.
fn count_range(
    f: &NpyFile,
    hw: usize,
    pb: usize,
    start: usize,
    counts: &mut [u16],
    cancel: &AtomicBool,
    valid: &(impl Fn(&[u8]) -> bool + Sync),
) -> Result<()> {
    let n_px = counts.len();
    let piece_px = (READ_PIECE_BYTES / pb).clamp(1, n_px.max(1));
    let mut buf = vec![0u8; piece_px * pb];
    for t in 0..f.header.shape[0] {
        if cancel.load(Ordering::Relaxed) {
            return Err(EncodeError::Cancelled);
        }
        let mut a = 0;
        while a < n_px {
            let n = piece_px.min(n_px - a);
            f.read_at((t * hw + start + a) * pb, &mut buf[..n * pb])?;
            for (c, px) in counts[a..a + n]
                .iter_mut()
                .zip(buf[..n * pb].chunks_exact(pb))
            {
                *c = c.saturating_add(u16::from(valid(px)));
            }
            a += n;
        }
    }
    Ok(())
}

impl TileReader {
    /// Open and cross-check a tile directory: every header, shape and file
    /// size, and the days of year; no pixel is read yet. Any error names
    /// the file.
    pub fn open(dir: &Path) -> Result<Self> {
        let bands_path = dir.join("bands.npy");
        let bands = open_checked(&bands_path, DType::U16, 4)?;
        let bshape = bands.header.shape.clone();
        if bshape[3] != 10 {
            return Err(tile_err(
                &bands_path,
                format!("shape {bshape:?}: last axis must be the 10 S2 bands"),
            ));
        }
        let (t, h, w) = (bshape[0], bshape[1], bshape[2]);
        let masks_path = dir.join("masks.npy");
        let masks = NpyFile::open(&masks_path, |hd| {
            check_header(
                &masks_path,
                hd.dtype,
                &hd.shape,
                &[DType::U8, DType::Bool],
                3,
            )?;
            if hd.shape != [t, h, w] {
                return Err(tile_err(
                    &masks_path,
                    format!("shape {:?}, but bands.npy is {bshape:?}", hd.shape),
                ));
            }
            Ok(())
        })
        .map_err(as_tile_err)?;
        let doys = read_doys(&dir.join("doys.npy"), t, "bands.npy")?;
        let ascending = open_sar(dir, "sar_ascending", (h, w))?;
        let descending = open_sar(dir, "sar_descending", (h, w))?;
        Ok(TileReader {
            dir: dir.to_path_buf(),
            height: h,
            width: w,
            bands,
            masks,
            doys,
            ascending,
            descending,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn height(&self) -> usize {
        self.height
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn pixels(&self) -> usize {
        self.height * self.width
    }

    pub fn s2_frames(&self) -> usize {
        self.doys.len()
    }

    pub fn s1_frames(&self) -> usize {
        [&self.ascending, &self.descending]
            .iter()
            .map(|p| p.as_ref().map_or(0, |p| p.doys.len()))
            .sum()
    }

    /// Bytes of pixel data in the files (headers aside).
    pub fn data_bytes(&self) -> usize {
        [&self.ascending, &self.descending]
            .iter()
            .flat_map(|p| p.iter())
            .map(|p| p.data.header.data_bytes())
            .sum::<usize>()
            + self.bands.header.data_bytes()
            + self.masks.header.data_bytes()
    }

    /// The whole tile in memory (what [`TileInputs::read`] returns).
    pub fn read_all(&self) -> Result<TileInputs> {
        let all: Vec<u32> = (0..self.pixels() as u32).collect();
        let mut t = self.window(&all)?;
        (t.height, t.width) = (self.height, self.width);
        Ok(t)
    }

    fn sar_window(&self, pass: &Option<SarFiles>, pixels: &[u32], asc: bool) -> Result<SarPass> {
        Ok(match pass {
            None => SarPass::new(Vec::new(), Vec::new(), asc),
            Some(p) => SarPass::new(
                gather(&p.data, self.pixels(), 2, pixels, i16_le).map_err(as_tile_err)?,
                p.doys.clone(),
                asc,
            ),
        })
    }
}

impl TileSource for TileReader {
    fn height(&self) -> usize {
        self.height
    }

    fn width(&self) -> usize {
        self.width
    }

    /// One pass over the range's part of the masks and the SAR files, a
    /// piece at a time (the bands are not read).
    fn valid_counts(&self, pixels: Range<usize>, cancel: &AtomicBool) -> Result<[Vec<u16>; 2]> {
        let hw = self.pixels();
        check_range(&pixels, hw)?;
        let (n, at) = (pixels.len(), pixels.start);
        let (mut s2, mut s1) = (vec![0u16; n], vec![0u16; n]);
        count_where(&self.masks, hw, 1, at, cancel, &mut s2, |m| m[0] == 1).map_err(as_tile_err)?;
        for pass in [&self.ascending, &self.descending].into_iter().flatten() {
            count_where(&pass.data, hw, 4, at, cancel, &mut s1, |vv_vh| {
                vv_vh != [0, 0, 0, 0]
            })
            .map_err(as_tile_err)?;
        }
        Ok([s2, s1])
    }

    fn window(&self, pixels: &[u32]) -> Result<TileInputs> {
        let hw = self.pixels();
        Ok(TileInputs {
            height: 1,
            width: pixels.len(),
            bands: gather(&self.bands, hw, 10, pixels, u16_le).map_err(as_tile_err)?,
            masks: gather(&self.masks, hw, 1, pixels, |c| c[0]).map_err(as_tile_err)?,
            doys: self.doys.clone(),
            ascending: self.sar_window(&self.ascending, pixels, true)?,
            descending: self.sar_window(&self.descending, pixels, false)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::SynthTile;

    /// Counted in ranges on several threads (ranges far smaller than the
    /// encoder's, so the test needs no large tile), the counts are those of
    /// the tile in memory, a range ending inside a read piece or not, and
    /// so are the counts of any part of the tile, in its own place.
    #[test]
    fn counts_in_parallel_ranges_are_the_tiles_counts() {
        let tile = TileInputs::synthetic(&SynthTile {
            height: 61,
            width: 53,
            s2_frames: 9,
            s1_asc_frames: 5,
            s1_desc_frames: 4,
            clear: 0.6,
            seed: 11,
        });
        let dir = std::env::temp_dir().join(format!("flotilla-count-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        tile.write(&dir).unwrap();
        let reader = TileReader::open(&dir).unwrap();
        let cancel = AtomicBool::new(false);
        let hw = reader.pixels();
        let want = tile.valid_counts(0..hw, &cancel).unwrap();
        assert_eq!(reader.valid_counts(0..hw, &cancel).unwrap(), want);
        for range in [0..1, 5..6, 7..1000, 1000..hw, hw - 1..hw, hw..hw, 0..hw] {
            let part = [
                want[0][range.clone()].to_vec(),
                want[1][range.clone()].to_vec(),
            ];
            assert_eq!(tile.valid_counts(range.clone(), &cancel).unwrap(), part);
            assert_eq!(
                reader.valid_counts(range.clone(), &cancel).unwrap(),
                part,
                "{range:?}"
            );
        }
        for (start, per) in [
            (0, 1),
            (0, 7),
            (0, 1000),
            (0, hw - 1),
            (0, hw),
            (0, hw + 5),
            (3, 7),
            (999, 64),
        ] {
            let mut s2 = vec![0u16; hw - start];
            count_in_ranges(
                &reader.masks,
                hw,
                1,
                start,
                &cancel,
                &mut s2,
                &|m: &[u8]| m[0] == 1,
                per,
            )
            .unwrap();
            assert_eq!(s2, want[0][start..], "S2 from {start} in ranges of {per}");
            let mut s1 = vec![0u16; hw - start];
            for pass in [&reader.ascending, &reader.descending]
                .into_iter()
                .flatten()
            {
                let valid = |b: &[u8]| b != [0, 0, 0, 0];
                count_in_ranges(&pass.data, hw, 4, start, &cancel, &mut s1, &valid, per).unwrap();
            }
            assert_eq!(s1, want[1][start..], "S1 from {start} in ranges of {per}");
        }
        assert!(want[0].iter().any(|&c| c > 0) && want[1].iter().any(|&c| c > 0));
        // A range past the tile is refused by both sources.
        for bad in [hw..hw + 1, 5..hw + 3] {
            assert!(matches!(
                tile.valid_counts(bad.clone(), &cancel),
                Err(EncodeError::Invalid(_))
            ));
            assert!(matches!(
                reader.valid_counts(bad, &cancel),
                Err(EncodeError::Invalid(_))
            ));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
