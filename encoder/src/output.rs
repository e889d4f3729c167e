//! A tile's embedding, its int8 quantisation, Matryoshka truncation, and
//! writing the published output files atomically.

use std::path::{Path, PathBuf};

use crate::error::{EncodeError, Result};
use crate::npy::{self, DType};

/// Per-pixel embeddings of one tile, (H, W, dim) f32. Pixels with no valid
/// observation in either modality are NaN and flagged in `nodata`.
#[derive(Debug, Clone)]
pub struct TileEmbedding {
    pub height: usize,
    pub width: usize,
    pub dim: usize,
    pub values: Vec<f32>,
    pub nodata: Vec<bool>,
}

/// What to write.
#[derive(Debug, Clone, Copy)]
pub struct OutputOptions {
    /// int8 codes plus per-pixel scales (the published format) instead of f32.
    pub int8: bool,
    /// Keep only the first `dim` channels (Matryoshka truncation; no
    /// renormalisation: the int8 scale is computed on the kept channels).
    pub dim: usize,
}

/// Symmetric int8 quantisation of one pixel, as upstream `quantize`:
/// scale = max(max|x|, 1e-12) / 127, code = round_half_even(x / scale)
/// clamped to ±127, arithmetic in f32.
pub fn quantize_pixel(x: &[f32], codes: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = amax.max(1e-12) / 127.0;
    for (c, v) in codes.iter_mut().zip(x) {
        *c = (v / scale).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    scale
}

impl TileEmbedding {
    /// The first `dim` channels of every pixel.
    pub fn truncated(&self, dim: usize) -> Result<TileEmbedding> {
        if dim == 0 || dim > self.dim {
            return Err(EncodeError::Invalid(format!(
                "--dim {dim}: must be between 1 and {}",
                self.dim
            )));
        }
        let values = self
            .values
            .chunks_exact(self.dim)
            .flat_map(|px| px[..dim].iter().copied())
            .collect();
        Ok(TileEmbedding {
            dim,
            values,
            ..self.clone()
        })
    }

    /// int8 codes (H, W, dim) and scales (H, W). No-data pixels get code 0
    /// and scale +inf.
    pub fn quantize(&self) -> (Vec<i8>, Vec<f32>) {
        let mut codes = vec![0i8; self.values.len()];
        let mut scales = vec![f32::INFINITY; self.nodata.len()];
        for (p, (px, c)) in self
            .values
            .chunks_exact(self.dim)
            .zip(codes.chunks_exact_mut(self.dim))
            .enumerate()
        {
            if !self.nodata[p] {
                scales[p] = quantize_pixel(px, c);
            }
        }
        (codes, scales)
    }

    /// Write `NAME.npy` (f32 (H,W,dim), or int8 with `int8`) and, for int8,
    /// `NAME_scales.npy` (f32 (H,W)) into `dir`. Each file is written under a
    /// temporary name and renamed into place only when all are written, so a
    /// failure leaves no output.
    pub fn write_outputs(
        &self,
        dir: &Path,
        name: &str,
        opts: OutputOptions,
    ) -> Result<Vec<PathBuf>> {
        let emb = if opts.dim == self.dim {
            self.clone()
        } else {
            self.truncated(opts.dim)?
        };
        std::fs::create_dir_all(dir).map_err(|e| EncodeError::io(dir, e))?;
        let shape = [emb.height, emb.width, emb.dim];
        let mut files: Vec<(PathBuf, Vec<u8>)> = Vec::new();
        if opts.int8 {
            let (codes, scales) = emb.quantize();
            let cb: Vec<u8> = codes.iter().map(|&c| c as u8).collect();
            files.push((
                dir.join(format!("{name}.npy")),
                npy::to_bytes(DType::I8, &shape, &cb),
            ));
            files.push((
                dir.join(format!("{name}_scales.npy")),
                npy::to_bytes(DType::F32, &shape[..2], &npy::f32_bytes(&scales)),
            ));
        } else {
            files.push((
                dir.join(format!("{name}.npy")),
                npy::to_bytes(DType::F32, &shape, &npy::f32_bytes(&emb.values)),
            ));
        }
        write_all_atomically(&files)?;
        Ok(files.into_iter().map(|(p, _)| p).collect())
    }
}

fn tmp_name(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(format!(".tmp-{}", std::process::id()));
    PathBuf::from(s)
}

/// Write every file to a temporary name, then rename them all into place;
/// on any error remove the temporaries.
fn write_all_atomically(files: &[(PathBuf, Vec<u8>)]) -> Result<()> {
    use std::io::Write;
    let mut written = Vec::new();
    let result = (|| {
        for (path, bytes) in files {
            let tmp = tmp_name(path);
            written.push(tmp.clone());
            let mut f = std::fs::File::create(&tmp).map_err(|e| EncodeError::io(&tmp, e))?;
            f.write_all(bytes)
                .and_then(|_| f.sync_all())
                .map_err(|e| EncodeError::io(&tmp, e))?;
        }
        for (path, _) in files {
            let tmp = tmp_name(path);
            std::fs::rename(&tmp, path).map_err(|e| EncodeError::io(path, e))?;
        }
        Ok(())
    })();
    if result.is_err() {
        for t in written {
            let _ = std::fs::remove_file(t);
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantize_rounds_half_to_even() {
        let x = [127.0f32, 0.5, 1.5, -2.5, -127.0];
        let mut c = [0i8; 5];
        let s = quantize_pixel(&x, &mut c);
        assert_eq!(s, 1.0);
        assert_eq!(c, [127, 0, 2, -2, -127]);
    }
}
