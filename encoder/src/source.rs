//! Where the encoder reads a tile from, a window of pixels at a time: [`TileSource`].
//!
//! Two sources: a tile already in memory ([`TileInputs`], what `bench` and
//! the tests use) and a tile's files ([`TileReader`](crate::tile_reader::TileReader),
//! what the CLI and the agent use), which reads only the window asked for.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{EncodeError, Result};
use crate::model::Modality;
use crate::tile::TileInputs;

/// A tile the encoder can take a window of pixels at a time. `Sync`: the
/// encoder reads the next window on another thread while it encodes this one.
pub trait TileSource: Sync {
    fn height(&self) -> usize;
    fn width(&self) -> usize;
    /// Valid S2 and S1 frames (at most `u16::MAX`) of the pixels `pixels`
    /// (raster order, within the tile), as [`TileInputs::valid_count`]
    /// counts them: element `k` is pixel `pixels.start + k`. The encoder
    /// counts a tile range by range, ahead of the windows it reads, so a
    /// device's first chunk does not wait for the whole tile's count.
    fn valid_counts(&self, pixels: Range<usize>, cancel: &AtomicBool) -> Result<[Vec<u16>; 2]>;
    /// The pixels `pixels` (ascending, raster order) as a tile of one row:
    /// pixel `k` of the result is pixel `pixels[k]` of this tile.
    fn window(&self, pixels: &[u32]) -> Result<TileInputs>;
}

impl TileSource for TileInputs {
    fn height(&self) -> usize {
        self.height
    }

    fn width(&self) -> usize {
        self.width
    }

    fn valid_counts(&self, pixels: Range<usize>, cancel: &AtomicBool) -> Result<[Vec<u16>; 2]> {
        check_range(&pixels, self.pixels())?;
        let mut counts = [vec![0u16; pixels.len()], vec![0u16; pixels.len()]];
        for (mi, m) in [Modality::S2, Modality::S1].into_iter().enumerate() {
            if cancel.load(Ordering::Relaxed) {
                return Err(EncodeError::Cancelled);
            }
            for (c, p) in counts[mi].iter_mut().zip(pixels.clone()) {
                *c = self.valid_count(m, p).min(u16::MAX as usize) as u16;
            }
        }
        Ok(counts)
    }

    fn window(&self, pixels: &[u32]) -> Result<TileInputs> {
        Ok(self.subset(pixels))
    }
}

/// A range of pixels to count must lie in the tile (the encoder asks for
/// ranges it cut itself, so this is a bug's error, not an input's).
pub(crate) fn check_range(pixels: &Range<usize>, tile_pixels: usize) -> Result<()> {
    if pixels.start > pixels.end || pixels.end > tile_pixels {
        return Err(EncodeError::Invalid(format!(
            "pixels {}..{} counted in a tile of {tile_pixels}",
            pixels.start, pixels.end
        )));
    }
    Ok(())
}
