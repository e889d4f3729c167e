//! A tile's embedding, its int8 quantisation, Matryoshka truncation, and
//! writing the published output files atomically.

use std::io::Write;
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
    /// failure leaves no output. The files are streamed from `values` a
    /// pixel at a time (truncated and quantised on the way): writing takes
    /// no second copy of the embedding.
    pub fn write_outputs(
        &self,
        dir: &Path,
        name: &str,
        opts: OutputOptions,
    ) -> Result<Vec<PathBuf>> {
        let dim = opts.dim;
        if dim == 0 || dim > self.dim {
            return Err(EncodeError::Invalid(format!(
                "--dim {dim}: must be between 1 and {}",
                self.dim
            )));
        }
        std::fs::create_dir_all(dir).map_err(|e| EncodeError::io(dir, e))?;
        let shape = [self.height, self.width, dim];
        let pixels = || self.values.chunks_exact(self.dim).map(|px| &px[..dim]);
        let main = dir.join(format!("{name}.npy"));
        if opts.int8 {
            // Filled while the codes are written, written after them.
            let scales = std::cell::RefCell::new(vec![f32::INFINITY; self.nodata.len()]);
            let write_codes = |w: &mut dyn Write| -> std::io::Result<()> {
                let mut scales = scales.borrow_mut();
                let (mut codes, mut bytes) = (vec![0i8; dim], vec![0u8; dim]);
                w.write_all(&npy::header_bytes(DType::I8, &shape))?;
                for (p, px) in pixels().enumerate() {
                    if self.nodata[p] {
                        codes.fill(0);
                    } else {
                        scales[p] = quantize_pixel(px, &mut codes);
                    }
                    for (b, &c) in bytes.iter_mut().zip(&codes) {
                        *b = c as u8;
                    }
                    w.write_all(&bytes)?;
                }
                Ok(())
            };
            let write_scales = |w: &mut dyn Write| -> std::io::Result<()> {
                w.write_all(&npy::header_bytes(DType::F32, &shape[..2]))?;
                w.write_all(&npy::f32_bytes(&scales.borrow()))
            };
            let scales_path = dir.join(format!("{name}_scales.npy"));
            write_all_atomically(&mut [
                (main.clone(), Box::new(write_codes) as FileWriter<'_>),
                (scales_path.clone(), Box::new(write_scales)),
            ])?;
            Ok(vec![main, scales_path])
        } else {
            let write_values = |w: &mut dyn Write| -> std::io::Result<()> {
                w.write_all(&npy::header_bytes(DType::F32, &shape))?;
                for px in pixels() {
                    w.write_all(&npy::f32_bytes(px))?;
                }
                Ok(())
            };
            write_all_atomically(&mut [(main.clone(), Box::new(write_values) as FileWriter<'_>)])?;
            Ok(vec![main])
        }
    }
}

fn tmp_name(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(format!(".tmp-{}", std::process::id()));
    PathBuf::from(s)
}

/// Writes one file's bytes, in order, to what it is given.
type FileWriter<'a> = Box<dyn FnMut(&mut dyn Write) -> std::io::Result<()> + 'a>;

/// Write every file (buffered) to a temporary name, then rename them all
/// into place; on any error remove the temporaries.
fn write_all_atomically(files: &mut [(PathBuf, FileWriter<'_>)]) -> Result<()> {
    let mut written = Vec::new();
    let result = (|| {
        for (path, write) in files.iter_mut() {
            let tmp = tmp_name(path);
            written.push(tmp.clone());
            let f = std::fs::File::create(&tmp).map_err(|e| EncodeError::io(&tmp, e))?;
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            write(&mut w)
                .and_then(|_| w.into_inner().map_err(|e| e.into_error()))
                .and_then(|f| f.sync_all())
                .map_err(|e| EncodeError::io(&tmp, e))?;
        }
        for (path, _) in files.iter() {
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
