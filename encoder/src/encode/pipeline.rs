//! The encode's pipeline of threads ([`Encoder::encode_into`]): counter, reader, gatherer, sink.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use super::cutter::{count_ranges, first_window, WindowCutter};
use super::feed::{out_of_order, Gathered, HeadInFlight, InFlight, Placed};
use super::gather::{gather_chunk, plan_window, GATHER_AHEAD};
use super::{Encoder, READ_AHEAD};
use crate::error::{EncodeError, Result};
use crate::output::EmbeddingSink;
use crate::sequence::bin_len;
use crate::source::TileSource;

impl Encoder {
    /// Encode every pixel of `tile` (as [`Encoder::encode_tile`]), handing
    /// each window's embeddings to `sink` as its head is done, on a thread
    /// of their own: an [`OutputWriter`](crate::output::OutputWriter)
    /// writes the files while the encode goes on, and the embedding is
    /// never held whole. Pixels in no window have no data. On an error
    /// (the sink's own included) or a cancel, what the sink was given is
    /// incomplete.
    pub fn encode_into(
        &self,
        tile: &dyn TileSource,
        sink: &mut dyn EmbeddingSink,
        progress: &dyn Fn(usize, usize),
        cancel: &AtomicBool,
    ) -> Result<()> {
        let npix = tile.height() * tile.width();
        let size = (tile.height(), tile.width());
        if let Some((h, w)) = sink.tile_size().filter(|&s| s != size) {
            return Err(EncodeError::Invalid(format!(
                "an output made for a tile of {h} x {w} px given one of {} x {} px",
                size.0, size.1
            )));
        }
        // This encode's own window slots, where the backend keeps features.
        let kept = self.backend.kept_windows()?;
        let window = self.window_pixels.max(self.profile.chunk_pixels);
        let chunk = self.profile.chunk_pixels.max(1);

        // Progress is measured in tokens so long sequences weigh what they
        // cost, against the whole tile's pixels with data and tokens: known
        // once the counter has counted the tile's last range (it runs
        // ahead of everything else, so early on), reported from then on.
        let totals: OnceLock<(usize, usize)> = OnceLock::new();
        let report = |done_tokens: usize| {
            let Some(&(active, total_tokens)) = totals.get() else {
                return;
            };
            let done = if total_tokens == 0 {
                active
            } else {
                (active as u128 * done_tokens.min(total_tokens) as u128 / total_tokens as u128)
                    as usize
            };
            progress(done, active);
        };
        let mut done_tokens = 0usize;

        // Set when this thread leaves the scope (done, or on an error), so
        // the counter and the reader, which may be waiting on work that no
        // one will take, stop at once instead of finishing the tile.
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| -> Result<()> {
            let stop = &stop;
            let _stop_on_exit = StopOnDrop(stop);
            // Each window's embeddings go to the sink on its own thread
            // (at most OUTPUT_AHEAD waiting), so placing or writing them
            // never holds up handing the device its next chunk. The sink's
            // error, if it fails, is the encode's: a send that finds it
            // gone is answered with it below.
            let (out_tx, out_rx) = std::sync::mpsc::sync_channel::<HeadDone>(OUTPUT_AHEAD);
            let sink_thread = s.spawn(move || -> Result<()> {
                for (pixels, values) in out_rx {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    sink.window(&pixels, &values)?;
                }
                Ok(())
            });
            // Four stages, each on its own thread, joined by channels: the
            // counter counts the tile's observations range by range (a
            // small range first), the reader cuts the pixels with data into
            // windows as their counts arrive and reads each (at most
            // READ_AHEAD ahead), the gatherer turns each window into chunks
            // of tokens (at most GATHER_AHEAD ahead), and this thread runs
            // the backend on them. So a device waits neither for the whole
            // tile to be counted before its first chunk (it did: about 30 ms
            // of a 256 x 256 tile on 2 cores) nor for the host to read or
            // gather its next chunk, only to hand it over. A stage stops
            // when the next hangs up (an error or cancel here), on
            // `cancel`, or after sending its own error; the reader and the
            // gatherer say when the tile is done, so a stage that stopped
            // is never taken for the tile's end.
            let (count_tx, count_rx) = std::sync::mpsc::channel();
            let totals = &totals;
            s.spawn(move || {
                let (mut active, mut tokens) = (0usize, 0usize);
                for range in count_ranges(npix, first_window(window, chunk), window) {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let counted = if cancel.load(Ordering::Relaxed) {
                        Err(EncodeError::Cancelled)
                    } else {
                        tile.valid_counts(range.clone(), cancel).and_then(|c| {
                            // A source's short answer would leave pixels out
                            // of every window, silently: refused.
                            if c[0].len() == range.len() && c[1].len() == range.len() {
                                Ok(c)
                            } else {
                                Err(EncodeError::Invalid(format!(
                                    "the tile's source counted {} S2 and {} S1 values for \
                                     the {} pixels {}..{}",
                                    c[0].len(),
                                    c[1].len(),
                                    range.len(),
                                    range.start,
                                    range.end
                                )))
                            }
                        })
                    };
                    if let Ok(c) = &counted {
                        for (&s2, &s1) in c[0].iter().zip(&c[1]) {
                            if s2 > 0 || s1 > 0 {
                                active += 1;
                                tokens += bin_len(s2 as usize) + bin_len(s1 as usize);
                            }
                        }
                    }
                    let failed = counted.is_err();
                    if count_tx
                        .send(counted.map(|c| Some((range.start, c))))
                        .is_err()
                        || failed
                    {
                        return;
                    }
                }
                let _ = totals.set((active, tokens));
                // The tile's end, said: a counter that stopped (a panic)
                // only hangs up.
                let _ = count_tx.send(Ok(None));
            });
            let (win_tx, win_rx) = std::sync::mpsc::sync_channel(READ_AHEAD);
            s.spawn(move || {
                let mut cutter = WindowCutter::new(window, chunk);
                let mut counted_all = false;
                loop {
                    while !counted_all && !cutter.ready() {
                        match count_rx.recv() {
                            Ok(Ok(Some((start, counts)))) => cutter.add(start, &counts),
                            Ok(Ok(None)) => counted_all = true,
                            Ok(Err(e)) => {
                                let _ = win_tx.send(Err(e));
                                return;
                            }
                            Err(_) => return,
                        }
                    }
                    if cancel.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let Some(win) = cutter.take() else {
                        // Every pixel with data is in a window.
                        let _ = win_tx.send(Ok(None));
                        return;
                    };
                    let read = tile.window(&win.pixels).map(|part| Some((win, part)));
                    let failed = read.is_err();
                    if win_tx.send(read).is_err() || failed {
                        return;
                    }
                }
            });
            let (chunk_tx, chunk_rx) = std::sync::mpsc::sync_channel(GATHER_AHEAD);
            // Token buffers come back once used, so a steady encode
            // allocates none.
            let (spare_tx, spare_rx) = std::sync::mpsc::channel::<(Vec<f32>, Vec<f32>)>();
            s.spawn(move || loop {
                let (win, part) = match win_rx.recv() {
                    Ok(Ok(Some(read))) => read,
                    Ok(Ok(None)) => {
                        let _ = chunk_tx.send(Ok(Gathered::TileDone));
                        return;
                    }
                    Ok(Err(e)) => {
                        let _ = chunk_tx.send(Err(e));
                        return;
                    }
                    Err(_) => return,
                };
                let plans = plan_window(&win.counts, chunk);
                if chunk_tx.send(Ok(Gathered::Window(win.pixels))).is_err() {
                    return;
                }
                for plan in plans {
                    if cancel.load(Ordering::Relaxed) {
                        return;
                    }
                    let spare = spare_rx.try_recv().unwrap_or_default();
                    let tokens = gather_chunk(&part, plan, spare);
                    if chunk_tx.send(Ok(Gathered::Chunk(tokens))).is_err() {
                        return;
                    }
                }
                if chunk_tx.send(Ok(Gathered::WindowDone)).is_err() {
                    return;
                }
            });
            // Pooled features of one window per modality, reused window
            // after window (every pixel of a window is in exactly one chunk
            // of each modality, so nothing stale is ever read); none where
            // the backend keeps them.
            let d = self.config.d_model();
            let wmax = if kept.is_some() { 0 } else { window.min(npix) };
            let mut pooled = [vec![0f32; wmax * d], vec![0f32; wmax * d]];
            // Window number `wi`, of `pixels` pixels, as the backend sees it.
            let placed = |wi: usize, pixels: usize| Placed {
                slot: kept.as_ref().map(|k| k.slot(wi)),
                pixels,
            };
            let recv =
                || -> Result<Gathered> { chunk_rx.recv().map_err(|_| EncodeError::Cancelled)? };
            let encoded = (|| -> Result<()> {
                // The next window's first chunk, begun before this window's
                // head (see `encode_window`).
                let mut carried: Option<InFlight> = None;
                let mut this = match recv()? {
                    Gathered::Window(pixels) => Some(pixels),
                    Gathered::TileDone => None,
                    _ => {
                        return Err(out_of_order(
                            self.backend.name(),
                            "a chunk came before its window",
                        ))
                    }
                };
                // The window before's head, begun and not yet taken.
                let mut head: Option<HeadInFlight> = None;
                let mut wi = 0;
                while let Some(win) = this.take() {
                    this = self.encode_window(
                        (placed(wi, win.len()), win),
                        &mut pooled,
                        (&recv, &spare_tx),
                        (&mut carried, &mut head),
                        |pixels| placed(wi + 1, pixels),
                        &out_tx,
                        cancel,
                        &mut |t| {
                            done_tokens += t;
                            report(done_tokens);
                        },
                    )?;
                    wi += 1;
                }
                if let Some(h) = head.take() {
                    self.finish_head(h, &out_tx)?;
                }
                Ok(())
            })();
            // A failed encode's windows are of no use: the sink (and the
            // reader) stop now rather than write (and read) what is queued.
            if encoded.is_err() {
                stop.store(true, Ordering::Relaxed);
            }
            // The sink has every window once it has emptied the channel.
            drop(out_tx);
            let sunk = sink_thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            // A sink that failed hung up on the encode: its error is why,
            // unless the encode had failed on its own.
            match encoded {
                Err(EncodeError::Invalid(why)) if why == OUTPUT_STOPPED => {
                    sunk.and(Err(EncodeError::Invalid(why)))
                }
                Err(e) => Err(e),
                Ok(()) => sunk,
            }
        })?;
        // Every range was counted (the reader said the tile was done only
        // after the counter's last range), so the totals are known.
        if let Some(&(_, total_tokens)) = totals.get() {
            report(total_tokens);
        }
        Ok(())
    }
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A window's pixels and their embeddings, for the sink.
pub(super) type HeadDone = (Vec<u32>, Vec<f32>);
pub(super) type OutputTx = std::sync::mpsc::SyncSender<HeadDone>;

/// A send to the sink's thread found it gone: it failed, and its error is
/// the encode's.
pub(super) const OUTPUT_STOPPED: &str = "the output stopped";

/// Windows' embeddings waiting for the sink (8 MB each for a 16,384-px
/// window of 128 f32): a slow disk holds the encode back after these.
const OUTPUT_AHEAD: usize = 2;
