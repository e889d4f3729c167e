//! Comparing an encoding with the upstream reference outputs of a fixture tile.
//!
//! The outputs are kept next to the tile (`expected/emb_f32.npy`,
//! `nodata.npy`, `tile.npy`, `tile_scales.npy`, as in
//! `shared/fixtures/encoder`); the thresholds are the acceptance figures of
//! `shared/fixtures/README.md`. The fixture tests of every backend use it,
//! the emulated GPU's included.

use std::path::Path;

use crate::npy;
use crate::output::TileEmbedding;

/// How close an encoding came to the reference.
#[derive(Debug, Clone, Copy)]
pub struct GoldenReport {
    /// Lowest per-pixel cosine similarity over pixels with data.
    pub worst_cosine: f64,
    /// Largest absolute difference of any f32 value.
    pub max_abs_error: f32,
    /// Fraction of int8 codes equal to the reference's.
    pub int8_equal: f64,
    /// Fraction of int8 codes within one of the reference's.
    pub int8_within_one: f64,
    /// Largest difference of an int8 code from the reference's.
    pub int8_max_diff: u8,
    /// Largest relative difference of a pixel's int8 scale.
    pub scale_max_rel: f32,
}

impl GoldenReport {
    /// The fixtures' acceptance thresholds (`shared/fixtures/README.md`):
    /// cosine ≥ 0.99999, max abs error ≤ 1e-4, int8 codes within ±1 and
    /// ≥ 99 % equal (and scales within 1e-4).
    pub fn meets_thresholds(&self) -> Result<(), String> {
        if self.int8_max_diff > 1 {
            return Err(format!("an int8 code is {} away", self.int8_max_diff));
        }
        if self.scale_max_rel >= 1e-4 {
            return Err(format!(
                "an int8 scale is {} off (relative)",
                self.scale_max_rel
            ));
        }
        if self.worst_cosine < 0.99999 {
            return Err(format!("cosine {} < 0.99999", self.worst_cosine));
        }
        if self.max_abs_error > 1e-4 {
            return Err(format!("max abs error {} > 1e-4", self.max_abs_error));
        }
        if self.int8_equal < 0.99 {
            return Err(format!("only {} of int8 codes equal", self.int8_equal));
        }
        Ok(())
    }
}

fn read(dir: &Path, name: &str) -> Result<npy::NpyArray, String> {
    npy::read(&dir.join(name)).map_err(|e| format!("{name}: {e}"))
}

/// Compare `emb` with the reference in `fixture/expected`. Errors on what
/// no precision excuses: another shape, a different no-data mask, a no-data
/// pixel that is not NaN (f32) or not code 0 with scale +inf (int8).
pub fn compare(fixture: &Path, emb: &TileEmbedding) -> Result<GoldenReport, String> {
    let dir = fixture.join("expected");
    let expected = read(&dir, "emb_f32.npy")?.to_f32();
    let nodata: Vec<bool> = read(&dir, "nodata.npy")?
        .data
        .iter()
        .map(|&b| b != 0)
        .collect();
    if emb.values.len() != expected.len() {
        return Err(format!(
            "{} values, the reference has {}",
            emb.values.len(),
            expected.len()
        ));
    }
    if emb.nodata != nodata {
        return Err("the no-data pixels differ".into());
    }
    let r = emb.dim;
    let (mut worst_cosine, mut max_abs_error) = (1.0f64, 0.0f32);
    for (p, (a, b)) in emb.values.chunks(r).zip(expected.chunks(r)).enumerate() {
        if nodata[p] {
            if !a.iter().all(|v| v.is_nan()) {
                return Err(format!("no-data pixel {p} is not NaN"));
            }
            continue;
        }
        let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
        let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        worst_cosine = worst_cosine.min(dot / (na * nb));
        for (x, y) in a.iter().zip(b) {
            max_abs_error = max_abs_error.max((x - y).abs());
        }
    }

    let (codes, scales) = emb.quantize();
    let exp_codes = read(&dir, "tile.npy")?;
    if exp_codes.dtype != npy::DType::I8 {
        return Err("tile.npy is not int8".into());
    }
    let exp_scales = read(&dir, "tile_scales.npy")?.to_f32();
    let (mut equal, mut within_one, mut total) = (0usize, 0usize, 0usize);
    let (mut int8_max_diff, mut scale_max_rel) = (0u8, 0f32);
    for (p, (c, e)) in codes.chunks(r).zip(exp_codes.data.chunks(r)).enumerate() {
        if nodata[p] {
            if !c.iter().all(|&v| v == 0) || scales[p] != f32::INFINITY {
                return Err(format!("no-data pixel {p} is not code 0 with scale inf"));
            }
            continue;
        }
        scale_max_rel = scale_max_rel.max((scales[p] - exp_scales[p]).abs() / exp_scales[p]);
        for (&a, &b) in c.iter().zip(e) {
            let b = b as i8;
            int8_max_diff = int8_max_diff.max((a as i32 - b as i32).unsigned_abs().min(255) as u8);
            equal += usize::from(a == b);
            within_one += usize::from((a as i32 - b as i32).abs() <= 1);
            total += 1;
        }
    }
    Ok(GoldenReport {
        worst_cosine,
        max_abs_error,
        int8_equal: equal as f64 / total.max(1) as f64,
        int8_within_one: within_one as f64 / total.max(1) as f64,
        int8_max_diff,
        scale_max_rel,
    })
}
