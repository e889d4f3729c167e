//! Per-pixel observation sequences: the bin a pixel falls in and which frames fill it.
//!
//! Which frames are valid and their standardised values come from the tile
//! (`TileInputs::valid_frames`, and `normalise.rs`'s tables of standardised readings).
//!
//! Matched against the upstream fixtures: the S2 and the S1 bins are computed
//! separately; valid frames keep file order (S1: every ascending frame, then
//! every descending one, not re-sorted by day); repeats are appended after them.

use crate::config::MAX_SEQ_LEN;
use crate::model::Modality;
use crate::normalise::{lookup, s1_table, s2_table};
use crate::tile::TileInputs;

/// Sequence length for `n` valid observations: the smallest multiple of 8
/// that holds them, at most [`MAX_SEQ_LEN`]; a modality with none is one
/// all-zero token.
pub fn bin_len(n: usize) -> usize {
    if n == 0 {
        1
    } else {
        n.div_ceil(8).saturating_mul(8).min(MAX_SEQ_LEN)
    }
}

/// Positions (into the pixel's valid frames, `0..n`) that fill a bin of
/// `bin` tokens. `n >= bin`: `linspace(0, n-1, bin)` truncated, computed the
/// way numpy does (`i * step`). Otherwise all of `0..n`, then `bin - n`
/// repeats: the middle of each of `array_split(0..n, r)`'s groups when
/// `r <= n`, else `i mod n`.
pub fn fill_positions(n: usize, bin: usize, out: &mut Vec<usize>) {
    out.clear();
    if n == 0 {
        return;
    }
    if n >= bin {
        if bin == 1 {
            out.push(0);
            return;
        }
        let step = (n - 1) as f64 / (bin - 1) as f64;
        out.extend((0..bin).map(|i| {
            if i == bin - 1 {
                n - 1
            } else {
                (i as f64 * step) as usize
            }
        }));
        return;
    }
    out.extend(0..n);
    let r = bin - n;
    if r <= n {
        // numpy.array_split: the first n % r groups have one element more.
        let (q, rem) = (n / r, n % r);
        let mut start = 0;
        for g in 0..r {
            let len = q + usize::from(g < rem);
            out.push(start + len / 2);
            start += len;
        }
    } else {
        out.extend((0..r).map(|i| i % n));
    }
}

/// Fills token buffers for one modality of one tile. Holds scratch space so
/// a chunk of pixels is gathered without allocating per pixel.
pub struct Gatherer<'t> {
    tile: &'t TileInputs,
    modality: Modality,
    valid: Vec<usize>,
    pos: Vec<usize>,
}

impl<'t> Gatherer<'t> {
    pub fn new(tile: &'t TileInputs, modality: Modality) -> Self {
        Gatherer {
            tile,
            modality,
            valid: Vec::new(),
            pos: Vec::new(),
        }
    }

    /// Write pixel `p`'s `len` tokens (standardised bands) into `values`
    /// (len × bands) and their days of year into `doys` (len).
    pub fn gather(&mut self, p: usize, len: usize, values: &mut [f32], doys: &mut [f32]) {
        let bands = self.modality.bands();
        debug_assert_eq!(values.len(), len * bands);
        self.tile.valid_frames(self.modality, p, &mut self.valid);
        let n = self.valid.len();
        if n == 0 {
            values.fill(0.0);
            doys.fill(0.0);
            return;
        }
        fill_positions(n, len, &mut self.pos);
        let tile = self.tile;
        let hw = tile.pixels();
        let tokens = values.chunks_exact_mut(bands).zip(doys.iter_mut());
        // One loop per modality, the table looked up once: this is the
        // host's busiest loop in an encode (a token per valid frame kept).
        match self.modality {
            Modality::S2 => {
                let table = s2_table();
                for ((out, day), &i) in tokens.zip(&self.pos) {
                    let frame = self.valid[i];
                    let at = (frame * hw + p) * 10;
                    for (k, (o, &v)) in out.iter_mut().zip(&tile.bands[at..at + 10]).enumerate() {
                        *o = lookup(table, k, v);
                    }
                    *day = tile.doys[frame] as f32;
                }
            }
            Modality::S1 => {
                let na = tile.ascending.frames();
                for ((out, day), &i) in tokens.zip(&self.pos) {
                    let frame = self.valid[i];
                    let (pass, t) = if frame < na {
                        (&tile.ascending, frame)
                    } else {
                        (&tile.descending, frame - na)
                    };
                    let table = s1_table(pass.is_ascending());
                    let at = (t * hw + p) * 2;
                    for (k, (o, &v)) in out.iter_mut().zip(&pass.data[at..at + 2]).enumerate() {
                        *o = lookup(table, k, v as u16);
                    }
                    *day = pass.doys[t] as f32;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins() {
        assert_eq!(bin_len(0), 1);
        assert_eq!(bin_len(1), 8);
        assert_eq!(bin_len(8), 8);
        assert_eq!(bin_len(9), 16);
        assert_eq!(bin_len(255), 256);
        assert_eq!(bin_len(290), 256);
    }

    #[test]
    fn fill_matches_numpy() {
        let mut v = Vec::new();
        // n=5, bin=8: r=3 <= 5, array_split(0..5, 3) = [0,1],[2,3],[4] -> 1,3,4
        fill_positions(5, 8, &mut v);
        assert_eq!(v, vec![0, 1, 2, 3, 4, 1, 3, 4]);
        // n=3, bin=8: r=5 > 3 -> 0,1,2,0,1
        fill_positions(3, 8, &mut v);
        assert_eq!(v, vec![0, 1, 2, 0, 1, 2, 0, 1]);
        // n=10, bin=4: linspace(0,9,4) = 0,3,6,9
        fill_positions(10, 4, &mut v);
        assert_eq!(v, vec![0, 3, 6, 9]);
        fill_positions(290, 256, &mut v);
        assert_eq!(v.len(), 256);
        assert_eq!(v[255], 289);
        assert!(v.windows(2).all(|w| w[0] < w[1]));
    }
}
