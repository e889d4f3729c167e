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
    /// Every pixel without data, to be placed window by window as an
    /// encode's heads finish ([`EmbeddingSink`]); zeroed, not NaN-filled:
    /// a large zeroed allocation is mapped page by page as it is written
    /// (filling it first held up the first chunk, 13 ms of page faults for
    /// 256 x 256 px on the 2-core dev VM). [`TileEmbedding::fill_nodata`]
    /// gives the pixels left without data their NaN at the end.
    pub(crate) fn empty(height: usize, width: usize, dim: usize) -> TileEmbedding {
        TileEmbedding {
            height,
            width,
            dim,
            values: vec![0f32; height * width * dim],
            nodata: vec![true; height * width],
        }
    }

    /// NaN in every channel of every pixel without data.
    pub(crate) fn fill_nodata(&mut self) {
        let dim = self.dim;
        for (px, _) in self
            .values
            .chunks_exact_mut(dim)
            .zip(&self.nodata)
            .filter(|(_, &n)| n)
        {
            px.fill(f32::NAN);
        }
    }

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
    /// `NAME_scales.npy` (f32 (H,W)) into `dir`, as [`OutputWriter`] does:
    /// under temporary names, renamed into place only when all are written,
    /// so a failure leaves no output; streamed from `values` a pixel at a
    /// time (truncated and quantised on the way), with no second copy of
    /// the embedding.
    pub fn write_outputs(
        &self,
        dir: &Path,
        name: &str,
        opts: OutputOptions,
    ) -> Result<Vec<PathBuf>> {
        let mut w = OutputWriter::create(dir, name, opts, (self.height, self.width), self.dim)?;
        if self.nodata.len() != self.height * self.width
            || self.values.len() != self.nodata.len() * self.dim
        {
            return Err(EncodeError::Invalid(format!(
                "an embedding of {} x {} px holds {} pixels' flags and {} values of {} channels",
                self.height,
                self.width,
                self.nodata.len(),
                self.values.len(),
                self.dim
            )));
        }
        for (p, px) in self.values.chunks_exact(self.dim).enumerate() {
            if !self.nodata[p] {
                w.put_nodata(p)?;
                w.put_pixel(px)?;
            }
        }
        w.finish()
    }
}

/// Where an encode puts each window's embeddings once its head is done:
/// in memory ([`TileEmbedding`]) or into the output files as it goes
/// ([`OutputWriter`]). It runs on its own thread beside the encode, so a
/// device is not kept waiting while the host places or writes a window.
pub trait EmbeddingSink: Send {
    /// The embeddings of `pixels` (raster indices, ascending, each after
    /// every pixel of the windows before), `repr_dim` values each, in
    /// order. Pixels in no window have no data.
    fn window(&mut self, pixels: &[u32], values: &[f32]) -> Result<()>;

    /// The (height, width) of the tile this sink was made for, if it
    /// knows: an encode of another tile into it is refused before it
    /// begins.
    fn tile_size(&self) -> Option<(usize, usize)> {
        None
    }
}

impl EmbeddingSink for TileEmbedding {
    fn window(&mut self, pixels: &[u32], values: &[f32]) -> Result<()> {
        let r = self.dim;
        if values.len() != pixels.len() * r {
            return Err(EncodeError::Invalid(format!(
                "{} values for a window of {} px x {r} channels",
                values.len(),
                pixels.len()
            )));
        }
        for (&p, px) in pixels.iter().zip(values.chunks_exact(r)) {
            let p = p as usize;
            let Some(dst) = self.values.get_mut(p * r..(p + 1) * r) else {
                return Err(EncodeError::Invalid(format!(
                    "pixel {p} is outside the tile's {} px",
                    self.nodata.len()
                )));
            };
            dst.copy_from_slice(px);
            self.nodata[p] = false;
        }
        Ok(())
    }

    fn tile_size(&self) -> Option<(usize, usize)> {
        Some((self.height, self.width))
    }
}

/// A tile's output files written as its windows are encoded, so the
/// tile's end does not wait for the whole file to be written (the write
/// of a 256 x 256 f32 tile, 33 MB and its fsync, took 30-40 ms on the dev
/// VM: 4 % of the tile at 75,000 px/s) and the embedding is never held
/// whole (620 MB of f32 for a 1,100 x 1,100 tile). The same bytes as
/// [`TileEmbedding::write_outputs`], under temporary names
/// (`NAME.npy.partial`, locked while written) until
/// [`OutputWriter::finish`] renames them into place; dropped unfinished
/// (an encode that failed or was cancelled), it removes them. A process
/// killed while writing leaves its `.partial`, which the next writer of
/// the same output reuses (the lock died with the process); one that
/// finds it locked is refused: another process is writing that output.
pub struct OutputWriter {
    npix: usize,
    /// Channels of each pixel handed in; `opts.dim` of them are written.
    repr_dim: usize,
    opts: OutputOptions,
    /// Pixels written so far, in raster order.
    next: usize,
    /// The main file (`NAME.npy`), being written under its temporary name
    /// and locked; taken (closed) before the renames, which Windows
    /// refuses for an open file.
    main: Option<std::fs::File>,
    main_tmp: PathBuf,
    /// Bytes not yet handed to the file.
    buf: Vec<u8>,
    /// int8 only: each pixel's scale, written to `NAME_scales.npy` at the
    /// end (4 bytes a pixel, 4.8 MB for 1,100 x 1,100 px).
    scales: Option<Vec<f32>>,
    codes: Vec<i8>,
    /// A pixel without data, as written: `dim` NaNs, or `dim` zero codes.
    nodata_px: Vec<u8>,
    /// (temporary, final) for every file, in the order they are written.
    paths: Vec<(PathBuf, PathBuf)>,
    height_width: (usize, usize),
    finished: bool,
}

/// Bytes gathered before they go to the file.
const WRITE_BUF: usize = 1 << 20;

impl OutputWriter {
    /// Open `NAME.npy` (and, for int8, plan `NAME_scales.npy`) in `dir`
    /// under temporary names, for a tile of (height, width) pixels whose
    /// embeddings have `repr_dim` channels.
    pub fn create(
        dir: &Path,
        name: &str,
        opts: OutputOptions,
        (height, width): (usize, usize),
        repr_dim: usize,
    ) -> Result<OutputWriter> {
        let dim = opts.dim;
        if dim == 0 || dim > repr_dim {
            return Err(EncodeError::Invalid(format!(
                "--dim {dim}: must be between 1 and {repr_dim}"
            )));
        }
        std::fs::create_dir_all(dir).map_err(|e| EncodeError::io(dir, e))?;
        let main = dir.join(format!("{name}.npy"));
        let mut paths = vec![(partial_name(&main), main)];
        if opts.int8 {
            let scales = dir.join(format!("{name}_scales.npy"));
            paths.push((partial_name(&scales), scales));
        }
        let tmp = paths[0].0.clone();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&tmp)
            .map_err(|e| EncodeError::io(&tmp, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(EncodeError::Invalid(format!(
                    "{}: another process is writing this output now; wait for it, or give \
                     another --out-dir",
                    tmp.display()
                )))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(EncodeError::io(&tmp, e)),
        }
        // Locked: whatever a killed writer left is ours to overwrite.
        file.set_len(0).map_err(|e| EncodeError::io(&tmp, e))?;
        let npix = height * width;
        let dtype = if opts.int8 { DType::I8 } else { DType::F32 };
        let mut w = OutputWriter {
            npix,
            repr_dim,
            opts,
            next: 0,
            main: Some(file),
            main_tmp: tmp,
            buf: npy::header_bytes(dtype, &[height, width, dim]),
            scales: opts.int8.then(|| vec![f32::INFINITY; npix]),
            codes: vec![0; dim],
            nodata_px: if opts.int8 {
                vec![0; dim]
            } else {
                npy::f32_bytes(&vec![f32::NAN; dim])
            },
            paths,
            height_width: (height, width),
            finished: false,
        };
        w.buf.reserve(WRITE_BUF);
        Ok(w)
    }

    /// Every pixel from the last written up to `upto` (not included) has
    /// no data: NaN, or int8 code 0 (its scale stays +inf).
    fn put_nodata(&mut self, upto: usize) -> Result<()> {
        while self.next < upto {
            self.buf.extend_from_slice(&self.nodata_px);
            self.next += 1;
            self.spill()?;
        }
        Ok(())
    }

    /// The next pixel's embedding (`repr_dim` values; the first `dim`
    /// written, quantised for int8).
    fn put_pixel(&mut self, px: &[f32]) -> Result<()> {
        let kept = &px[..self.opts.dim];
        if let Some(scales) = &mut self.scales {
            scales[self.next] = quantize_pixel(kept, &mut self.codes);
            self.buf.extend(self.codes.iter().map(|&c| c as u8));
        } else {
            for v in kept {
                self.buf.extend_from_slice(&v.to_le_bytes());
            }
        }
        self.next += 1;
        self.spill()
    }

    /// Hand the gathered bytes to the file once there are enough of them.
    fn spill(&mut self) -> Result<()> {
        if self.buf.len() >= WRITE_BUF {
            self.flush()?;
        }
        Ok(())
    }

    /// The main file, open until the renames.
    fn file(&mut self) -> Result<&mut std::fs::File> {
        let tmp = &self.main_tmp;
        self.main
            .as_mut()
            .ok_or_else(|| EncodeError::Invalid(format!("{}: already closed", tmp.display())))
    }

    fn flush(&mut self) -> Result<()> {
        let buf = std::mem::take(&mut self.buf);
        let written = self.file()?.write_all(&buf);
        written.map_err(|e| EncodeError::io(&self.main_tmp, e))?;
        self.buf = buf;
        self.buf.clear();
        Ok(())
    }

    fn sync(&mut self, all: bool) -> Result<()> {
        let file = self.file()?;
        let synced = if all {
            file.sync_all()
        } else {
            file.sync_data()
        };
        synced.map_err(|e| EncodeError::io(&self.main_tmp, e))
    }

    /// Every pixel not yet written has no data; write the scales (int8),
    /// sync every file and rename each into place. The files' final paths.
    /// After an encode into this writer, every window is already written
    /// and synced: what is left is the pixels after the last window, the
    /// scales, the syncs and the renames.
    pub fn finish(mut self) -> Result<Vec<PathBuf>> {
        self.put_nodata(self.npix)?;
        self.flush()?;
        self.sync(true)?;
        if let (Some(scales), Some((tmp, _))) = (&self.scales, self.paths.get(1)) {
            let (h, w) = self.height_width;
            let mut f = std::fs::File::create(tmp).map_err(|e| EncodeError::io(tmp, e))?;
            f.write_all(&npy::header_bytes(DType::F32, &[h, w]))
                .and_then(|_| f.write_all(&npy::f32_bytes(scales)))
                .and_then(|_| f.sync_all())
                .map_err(|e| EncodeError::io(tmp, e))?;
        }
        // Windows renames no open file: closed (and unlocked) first there.
        // Elsewhere the lock is held until `NAME.npy` is in place, so that
        // a second writer of this output cannot take the `.partial` over
        // (and empty it) between the close and the rename.
        #[cfg(windows)]
        {
            self.main = None;
        }
        // `NAME.npy` is the commit record: renamed last, and with int8 an
        // older one goes first, so that a crash between the renames leaves
        // no output (the job is redone) rather than new scales beside old
        // codes.
        let (main, others) = self
            .paths
            .split_first()
            .expect("the main file is always planned");
        if !others.is_empty() {
            match std::fs::remove_file(&main.1) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(EncodeError::io(&main.1, e)),
            }
        }
        for (tmp, path) in others.iter().chain([main]) {
            std::fs::rename(tmp, path).map_err(|e| EncodeError::io(path, e))?;
        }
        self.main = None;
        self.finished = true;
        sync_dir(&main.1);
        Ok(self.paths.iter().map(|(_, p)| p.clone()).collect())
    }
}

impl EmbeddingSink for OutputWriter {
    /// Writes the window's pixels (and those without data before them),
    /// then syncs what is written (the encode goes on meanwhile), so that
    /// [`OutputWriter::finish`]'s sync has little left to wait for.
    fn window(&mut self, pixels: &[u32], values: &[f32]) -> Result<()> {
        let r = self.repr_dim;
        if values.len() != pixels.len() * r {
            return Err(EncodeError::Invalid(format!(
                "{} values for a window of {} px x {r} channels",
                values.len(),
                pixels.len()
            )));
        }
        for (&p, px) in pixels.iter().zip(values.chunks_exact(r)) {
            let p = p as usize;
            if p < self.next || p >= self.npix {
                return Err(EncodeError::Invalid(format!(
                    "pixel {p} handed to the output after pixel {} (of {} px)",
                    self.next, self.npix
                )));
            }
            self.put_nodata(p)?;
            self.put_pixel(px)?;
        }
        self.flush()?;
        self.sync(false)
    }

    fn tile_size(&self) -> Option<(usize, usize)> {
        Some(self.height_width)
    }
}

impl Drop for OutputWriter {
    fn drop(&mut self) {
        if !self.finished {
            // Closed first, as for the renames.
            self.main = None;
            for (tmp, _) in &self.paths {
                let _ = std::fs::remove_file(tmp);
            }
        }
    }
}

/// Sync the directory holding `file`, so that its renames survive a power
/// cut (Unix; elsewhere a rename is as durable as the file system makes
/// it). Best effort: the output is complete and in place by now, and some
/// file systems (FUSE, network mounts) refuse a directory's fsync, or a
/// directory may not be readable, which must not fail an encode whose
/// files are written.
fn sync_dir(file: &Path) {
    #[cfg(unix)]
    if let Some(dir) = file.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    #[cfg(not(unix))]
    let _ = file;
}

fn partial_name(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".partial");
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 5 x 7 embedding of 6 channels whose first, last and some middle
    /// pixels have no data.
    fn gappy() -> TileEmbedding {
        let (h, w, d) = (5, 7, 6);
        let mut emb = TileEmbedding::empty(h, w, d);
        for p in 0..h * w {
            if p != 0 && p != h * w - 1 && p % 4 != 2 {
                emb.nodata[p] = false;
                for (c, v) in emb.values[p * d..(p + 1) * d].iter_mut().enumerate() {
                    *v = (p as f32 * 0.37 + c as f32).sin() * 3.0;
                }
            }
        }
        emb.fill_nodata();
        emb
    }

    /// The bytes each file must hold, built here from the npy writer and
    /// `quantize`, not from `OutputWriter`.
    fn expected(emb: &TileEmbedding, opts: OutputOptions) -> Vec<Vec<u8>> {
        let t = emb.truncated(opts.dim).unwrap();
        let shape = [t.height, t.width, t.dim];
        if opts.int8 {
            let (codes, scales) = t.quantize();
            let codes: Vec<u8> = codes.iter().map(|&c| c as u8).collect();
            vec![
                npy::to_bytes(DType::I8, &shape, &codes),
                npy::to_bytes(DType::F32, &shape[..2], &npy::f32_bytes(&scales)),
            ]
        } else {
            vec![npy::to_bytes(
                DType::F32,
                &shape,
                &npy::f32_bytes(&t.values),
            )]
        }
    }

    #[test]
    fn written_as_windows_arrive_or_after_the_files_are_the_same() {
        let emb = gappy();
        let with_data: Vec<u32> = (0..emb.nodata.len() as u32)
            .filter(|&p| !emb.nodata[p as usize])
            .collect();
        for opts in [
            OutputOptions {
                int8: false,
                dim: 6,
            },
            OutputOptions {
                int8: false,
                dim: 4,
            },
            OutputOptions { int8: true, dim: 6 },
            OutputOptions { int8: true, dim: 3 },
        ] {
            let want = expected(&emb, opts);
            let after = tempfile::tempdir().unwrap();
            let files = emb.write_outputs(after.path(), "t", opts).unwrap();
            let read = |files: &[PathBuf]| -> Vec<Vec<u8>> {
                files.iter().map(|f| std::fs::read(f).unwrap()).collect()
            };
            assert!(read(&files) == want, "written after, {opts:?}");

            // Windows of 5, 9 and the rest of the pixels with data.
            let streamed = tempfile::tempdir().unwrap();
            let mut w = OutputWriter::create(streamed.path(), "t", opts, (5, 7), 6).unwrap();
            for win in [&with_data[..5], &with_data[5..14], &with_data[14..]] {
                let values: Vec<f32> = win
                    .iter()
                    .flat_map(|&p| emb.values[p as usize * 6..(p as usize + 1) * 6].to_vec())
                    .collect();
                w.window(win, &values).unwrap();
            }
            // Nothing in place before the finish.
            assert!(files
                .iter()
                .all(|f| !streamed.path().join(f.file_name().unwrap()).exists()));
            let files = w.finish().unwrap();
            assert!(read(&files) == want, "written as encoded, {opts:?}");
            let left: Vec<_> = std::fs::read_dir(streamed.path()).unwrap().collect();
            assert_eq!(left.len(), files.len(), "temporaries left: {left:?}");
        }
    }

    #[test]
    fn an_unfinished_or_misfed_writer_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let opts = OutputOptions { int8: true, dim: 2 };
        let mut w = OutputWriter::create(dir.path(), "t", opts, (2, 3), 2).unwrap();
        w.window(&[1, 4], &[1.0, 2.0, 3.0, 4.0]).unwrap();
        // A pixel before one already written, or outside the tile.
        let err = w.window(&[3], &[0.0, 0.0]).unwrap_err().to_string();
        assert!(
            err.contains("pixel 3 handed to the output after pixel 5"),
            "{err}"
        );
        let err = w.window(&[6], &[0.0, 0.0]).unwrap_err().to_string();
        assert!(err.contains("pixel 6"), "{err}");
        let err = w.window(&[5], &[0.0]).unwrap_err().to_string();
        assert!(
            err.contains("1 values for a window of 1 px x 2 channels"),
            "{err}"
        );
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_some());
        drop(w);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");

        // A writer killed mid-tile leaves its partial file, unlocked: the
        // next writer of that output takes it over.
        std::fs::write(dir.path().join("t.npy.partial"), vec![7u8; 1000]).unwrap();
        let opts = OutputOptions {
            int8: false,
            dim: 2,
        };
        let w = OutputWriter::create(dir.path(), "t", opts, (1, 2), 2).unwrap();
        // While it writes, a second writer of the same output is refused.
        let err = OutputWriter::create(dir.path(), "t", opts, (1, 2), 2)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("another process is writing this output"),
            "{err}"
        );
        let files = w.finish().unwrap();
        let nan = npy::f32_bytes(&[f32::NAN; 4]);
        assert_eq!(
            std::fs::read(&files[0]).unwrap(),
            npy::to_bytes(DType::F32, &[1, 2, 2], &nan)
        );
        std::fs::remove_file(&files[0]).unwrap();
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());

        let err = OutputWriter::create(
            dir.path(),
            "t",
            OutputOptions {
                int8: false,
                dim: 3,
            },
            (2, 3),
            2,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("--dim 3: must be between 1 and 2"), "{err}");
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
    }

    #[test]
    fn int8_codes_are_never_in_place_beside_scales_of_another_encode() {
        let dir = tempfile::tempdir().unwrap();
        let opts = OutputOptions { int8: true, dim: 2 };
        let write = |value: f32| {
            let mut w = OutputWriter::create(dir.path(), "t", opts, (1, 2), 2).unwrap();
            w.window(&[0, 1], &[value, 1.0, value, 2.0]).unwrap();
            w.finish()
        };
        let files = write(4.0).unwrap();
        assert_eq!(files.len(), 2);
        // A second encode of the same output whose scales cannot be put in
        // place (here a folder is in their way): its codes must not be
        // either, and the first encode's codes must not stay beside
        // whatever scales are there. No output is what a rerun redoes.
        std::fs::remove_file(&files[1]).unwrap();
        std::fs::create_dir_all(files[1].join("in-the-way")).unwrap();
        let err = write(8.0).unwrap_err().to_string();
        assert!(err.contains("t_scales.npy"), "{err}");
        assert!(
            !files[0].exists(),
            "t.npy is in place beside no scales of its own"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from("t_scales.npy")],
            "temporaries left"
        );
        // Cleared, the next encode puts both in place.
        std::fs::remove_dir_all(&files[1]).unwrap();
        let again = write(8.0).unwrap();
        assert!(again.iter().all(|f| f.is_file()));
    }

    #[test]
    fn quantize_rounds_half_to_even() {
        let x = [127.0f32, 0.5, 1.5, -2.5, -127.0];
        let mut c = [0i8; 5];
        let s = quantize_pixel(&x, &mut c);
        assert_eq!(s, 1.0);
        assert_eq!(c, [127, 0, 2, -2, -127]);
    }
}
