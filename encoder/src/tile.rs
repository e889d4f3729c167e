//! Tile inputs in the geotessera layout: read, cross-check, write, per-pixel access.

use std::path::{Path, PathBuf};

use crate::error::{EncodeError, Result};
use crate::model::Modality;
use crate::npy::{self, DType};

/// One SAR orbit direction: (T,H,W,2) i16 VV/VH and a day of year per frame.
#[derive(Debug, Clone)]
pub struct SarPass {
    pub data: Vec<i16>,
    pub doys: Vec<i32>,
    /// Which direction's statistics standardise it.
    ascending: bool,
}

impl SarPass {
    /// A pass of one orbit direction, standardised with that direction's statistics.
    pub(crate) fn new(data: Vec<i16>, doys: Vec<i32>, ascending: bool) -> Self {
        SarPass {
            data,
            doys,
            ascending,
        }
    }

    pub fn frames(&self) -> usize {
        self.doys.len()
    }

    /// Whether it is the ascending pass (which statistics standardise it).
    pub(crate) fn is_ascending(&self) -> bool {
        self.ascending
    }

    /// The same pass with no pixel data (for [`TileInputs::subset`]).
    fn clone_without_data(&self) -> Self {
        SarPass {
            data: Vec::new(),
            doys: self.doys.clone(),
            ascending: self.ascending,
        }
    }
}

/// Everything the encoder reads for one tile.
#[derive(Debug, Clone)]
pub struct TileInputs {
    pub height: usize,
    pub width: usize,
    /// (T,H,W,10) u16, bands B04 B02 B03 B08 B8A B05 B06 B07 B11 B12.
    pub bands: Vec<u16>,
    /// (T,H,W), 1 = clear (any other value is not a valid observation).
    pub masks: Vec<u8>,
    pub doys: Vec<i32>,
    pub ascending: SarPass,
    /// Absent files read as a pass with no frames.
    pub descending: SarPass,
}

pub(crate) fn tile_err(path: &Path, reason: impl Into<String>) -> EncodeError {
    EncodeError::Tile {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// An `.npy` reader's error, reported as a bad tile input (same file, same reason).
pub(crate) fn as_tile_err(e: EncodeError) -> EncodeError {
    match e {
        EncodeError::Npy { path, reason } => EncodeError::Tile { path, reason },
        EncodeError::Io { path, source } => EncodeError::Tile {
            path,
            reason: source.to_string(),
        },
        other => other,
    }
}

/// The array in `path` has one of `dtypes` and `ndim` axes.
pub(crate) fn check_header(
    path: &Path,
    dtype: DType,
    shape: &[usize],
    dtypes: &[DType],
    ndim: usize,
) -> Result<()> {
    if !dtypes.contains(&dtype) {
        return Err(tile_err(
            path,
            format!(
                "dtype {}, expected {}",
                dtype.descr(),
                dtypes
                    .iter()
                    .map(|d| d.descr())
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        ));
    }
    if shape.len() != ndim {
        return Err(tile_err(
            path,
            format!("shape {shape:?} has {} axes, expected {ndim}", shape.len()),
        ));
    }
    Ok(())
}

/// Largest tile side accepted, in pixels: a geotessera tile is 0.1° square,
/// about 1,100 × 1,100 px at 10 m; 4x that leaves room for other grids.
pub const MAX_TILE_SIDE: usize = 4_400;
/// Most frames accepted per modality: a year of Sentinel-2 (two satellites,
/// a 5-day revisit, overlapping orbits) is a few hundred; 4x the encoder's
/// longest sequence (`MAX_SEQ_LEN`, 256).
pub const MAX_FRAMES: usize = 4 * crate::config::MAX_SEQ_LEN;

/// A (T, H, W, ...) array's frames and sides are within the caps, so that
/// no index arithmetic on them can overflow and a header cannot ask for
/// more than a real tile holds.
pub(crate) fn check_dims(path: &Path, shape: &[usize]) -> Result<()> {
    for (axis, what, value, cap) in [
        (0, "frames", shape[0], MAX_FRAMES),
        (1, "height", shape[1], MAX_TILE_SIDE),
        (2, "width", shape[2], MAX_TILE_SIDE),
    ] {
        if value > cap {
            return Err(tile_err(
                path,
                format!("shape {shape:?}: {what} (axis {axis}) is {value}, at most {cap}"),
            ));
        }
    }
    Ok(())
}

impl TileInputs {
    /// Read and cross-check a whole tile directory into memory. Any error
    /// names the file. The encoder reads by windows instead
    /// ([`TileReader`](crate::tile_reader::TileReader)).
    pub fn read(dir: &Path) -> Result<Self> {
        crate::tile_reader::TileReader::open(dir)?.read_all()
    }

    /// The pixels `pixels` (each below [`TileInputs::pixels`]) as a tile of
    /// one row: pixel `k` of the result is pixel `pixels[k]` of this one.
    pub fn subset(&self, pixels: &[u32]) -> TileInputs {
        let hw = self.pixels();
        fn pick<T: Copy>(data: &[T], hw: usize, per: usize, pixels: &[u32]) -> Vec<T> {
            let frames = data.len() / (hw * per).max(1);
            let mut out = Vec::with_capacity(frames * pixels.len() * per);
            for t in 0..frames {
                for &p in pixels {
                    let i = (t * hw + p as usize) * per;
                    out.extend_from_slice(&data[i..i + per]);
                }
            }
            out
        }
        let pass = |p: &SarPass| SarPass {
            data: pick(&p.data, hw, 2, pixels),
            ..p.clone_without_data()
        };
        TileInputs {
            height: 1,
            width: pixels.len(),
            bands: pick(&self.bands, hw, 10, pixels),
            masks: pick(&self.masks, hw, 1, pixels),
            doys: self.doys.clone(),
            ascending: pass(&self.ascending),
            descending: pass(&self.descending),
        }
    }

    /// Write the tile in the same layout (both SAR passes always written).
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| EncodeError::io(dir, e))?;
        let (h, w) = (self.height, self.width);
        let t = self.doys.len();
        let u16b: Vec<u8> = self.bands.iter().flat_map(|v| v.to_le_bytes()).collect();
        npy::write(&dir.join("bands.npy"), DType::U16, &[t, h, w, 10], &u16b)?;
        npy::write(&dir.join("masks.npy"), DType::U8, &[t, h, w], &self.masks)?;
        let i32b = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        npy::write(&dir.join("doys.npy"), DType::I32, &[t], &i32b(&self.doys))?;
        for (name, p) in [
            ("sar_ascending", &self.ascending),
            ("sar_descending", &self.descending),
        ] {
            let b: Vec<u8> = p.data.iter().flat_map(|v| v.to_le_bytes()).collect();
            npy::write(
                &dir.join(format!("{name}.npy")),
                DType::I16,
                &[p.frames(), h, w, 2],
                &b,
            )?;
            npy::write(
                &dir.join(format!("{name}_doy.npy")),
                DType::I32,
                &[p.frames()],
                &i32b(&p.doys),
            )?;
        }
        Ok(())
    }

    pub fn pixels(&self) -> usize {
        self.height * self.width
    }

    pub fn s2_frames(&self) -> usize {
        self.doys.len()
    }

    pub fn s1_frames(&self) -> usize {
        self.ascending.frames() + self.descending.frames()
    }

    /// Frames of `modality` valid at pixel `p`, in file order (S1: ascending
    /// frames, then descending). S2: mask == 1; S1: VV or VH non-zero.
    pub fn valid_frames(&self, modality: Modality, p: usize, out: &mut Vec<usize>) {
        out.clear();
        let hw = self.pixels();
        match modality {
            Modality::S2 => {
                out.extend((0..self.s2_frames()).filter(|&t| self.masks[t * hw + p] == 1));
            }
            Modality::S1 => {
                let na = self.ascending.frames();
                for (base, pass) in [(0, &self.ascending), (na, &self.descending)] {
                    out.extend((0..pass.frames()).filter_map(|t| {
                        let i = (t * hw + p) * 2;
                        (pass.data[i] != 0 || pass.data[i + 1] != 0).then_some(base + t)
                    }));
                }
            }
        }
    }

    /// Number of valid frames of `modality` at pixel `p`.
    pub fn valid_count(&self, modality: Modality, p: usize) -> usize {
        let hw = self.pixels();
        match modality {
            Modality::S2 => (0..self.s2_frames())
                .filter(|&t| self.masks[t * hw + p] == 1)
                .count(),
            Modality::S1 => [&self.ascending, &self.descending]
                .iter()
                .map(|pass| {
                    (0..pass.frames())
                        .filter(|&t| {
                            let i = (t * hw + p) * 2;
                            pass.data[i] != 0 || pass.data[i + 1] != 0
                        })
                        .count()
                })
                .sum(),
        }
    }
}

/// Every directory under `root` (recursively) that holds a `bands.npy`, sorted.
pub fn find_tiles(root: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let rd = std::fs::read_dir(&dir).map_err(|e| EncodeError::io(&dir, e))?;
        for entry in rd {
            let entry = entry.map_err(|e| EncodeError::io(&dir, e))?;
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            }
        }
        if dir.join("bands.npy").is_file() {
            found.push(dir);
        }
    }
    found.sort();
    Ok(found)
}
