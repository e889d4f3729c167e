//! Where the encoder reads a tile from, a window of pixels at a time: [`TileSource`].
//!
//! Two sources: a tile already in memory ([`TileInputs`], what `bench` and
//! the tests use) and a tile's files ([`TileReader`](crate::tile_reader::TileReader),
//! what the CLI and the agent use), which reads only the window asked for.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{EncodeError, Result};
use crate::model::Modality;
use crate::tile::TileInputs;

/// A tile the encoder can take a window of pixels at a time. `Sync`: the
/// encoder reads the next window on another thread while it encodes this one.
pub trait TileSource: Sync {
    fn height(&self) -> usize;
    fn width(&self) -> usize;
    /// Valid S2 and S1 frames of every pixel (at most `u16::MAX`), as
    /// [`TileInputs::valid_count`] counts them.
    fn valid_counts(&self, cancel: &AtomicBool) -> Result<[Vec<u16>; 2]>;
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

    fn valid_counts(&self, cancel: &AtomicBool) -> Result<[Vec<u16>; 2]> {
        let mut counts = [vec![0u16; self.pixels()], vec![0u16; self.pixels()]];
        for (mi, m) in [Modality::S2, Modality::S1].into_iter().enumerate() {
            if cancel.load(Ordering::Relaxed) {
                return Err(EncodeError::Cancelled);
            }
            for (p, c) in counts[mi].iter_mut().enumerate() {
                *c = self.valid_count(m, p).min(u16::MAX as usize) as u16;
            }
        }
        Ok(counts)
    }

    fn window(&self, pixels: &[u32]) -> Result<TileInputs> {
        Ok(self.subset(pixels))
    }
}
