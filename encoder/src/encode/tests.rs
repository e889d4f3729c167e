//! Tests of the encode as a whole: its threads, windows, sink and backend together.

use std::sync::atomic::Ordering;

use super::cutter::{count_ranges, first_window};
use super::*;
use crate::backend::{KeptRows, PendingBackbone, PendingHead, SequenceBatch};
use crate::error::EncodeError;
use crate::model::Modality;
use crate::output::EmbeddingSink;
use crate::synth::SynthTile;

/// A tile in memory that a test can make awkward: no pixel past the
/// first `free` is counted until a window has been read (or 20 s have
/// passed: `waited_out`, the encode waited for more than the first
/// window's count before reading, which it must not); each range's
/// count takes `delay`, comes one pixel `short` if asked, and says no
/// pixel from `data_below` on has data; reading a window sets
/// `cancel_after_read`; `ranges` counts the ranges asked.
struct TestSource {
    tile: TileInputs,
    free: usize,
    delay: std::time::Duration,
    short: bool,
    data_below: usize,
    cancel_after_read: Option<&'static AtomicBool>,
    read: std::sync::Mutex<bool>,
    wake: std::sync::Condvar,
    waited_out: AtomicBool,
    ranges: std::sync::atomic::AtomicUsize,
}

impl TestSource {
    /// The tile as it is, nothing held back.
    fn new(tile: &TileInputs) -> Self {
        TestSource {
            tile: tile.clone(),
            free: usize::MAX,
            delay: std::time::Duration::ZERO,
            short: false,
            data_below: usize::MAX,
            cancel_after_read: None,
            read: std::sync::Mutex::new(false),
            wake: std::sync::Condvar::new(),
            waited_out: AtomicBool::new(false),
            ranges: Default::default(),
        }
    }
}

impl TileSource for TestSource {
    fn height(&self) -> usize {
        self.tile.height
    }
    fn width(&self) -> usize {
        self.tile.width
    }
    fn valid_counts(
        &self,
        pixels: std::ops::Range<usize>,
        cancel: &AtomicBool,
    ) -> Result<[Vec<u16>; 2]> {
        self.ranges.fetch_add(1, Ordering::Relaxed);
        if pixels.end > self.free {
            let read = self.read.lock().unwrap();
            let (read, timeout) = self
                .wake
                .wait_timeout_while(read, std::time::Duration::from_secs(20), |r| !*r)
                .unwrap();
            if timeout.timed_out() && !*read {
                self.waited_out.store(true, Ordering::Relaxed);
            }
        }
        std::thread::sleep(self.delay);
        let start = pixels.start;
        let mut c = self.tile.valid_counts(pixels, cancel)?;
        for m in &mut c {
            for (k, v) in m.iter_mut().enumerate() {
                if start + k >= self.data_below {
                    *v = 0;
                }
            }
        }
        if self.short {
            c[0].pop();
            c[1].pop();
        }
        Ok(c)
    }
    fn window(&self, pixels: &[u32]) -> Result<TileInputs> {
        *self.read.lock().unwrap() = true;
        self.wake.notify_all();
        if let Some(c) = self.cancel_after_read {
            c.store(true, Ordering::Relaxed);
        }
        self.tile.window(pixels)
    }
}

/// An encode reads (and so can compute) its first window before the
/// rest of the tile is counted, with the same output bits and a
/// progress that only rises, to every pixel with data; cancelled once
/// reading began, it says so rather than return part of a tile.
#[test]
fn the_first_window_is_read_before_the_tile_is_counted_whole() {
    use crate::backend::BackendChoice;
    use crate::synth::random_checkpoint;
    let tile = TileInputs::synthetic(&SynthTile {
        height: 30,
        width: 41,
        s2_frames: 12,
        s1_asc_frames: 5,
        s1_desc_frames: 4,
        clear: 0.5,
        seed: 3,
    });
    let mut profile = DeviceProfile::untuned(BackendChoice::Cpu, "test".into());
    profile.chunk_pixels = 16;
    profile.threads = 1;
    let ckpt = random_checkpoint(&ModelConfig::small(), 2);
    let mut enc = Encoder::from_checkpoint(&ckpt, BackendChoice::Cpu, profile).unwrap();
    enc.set_window_pixels(64);
    let no = AtomicBool::new(false);
    let want = enc.encode_tile(&tile, &|_, _| {}, &no).unwrap();

    // The first window's pixels all have data here, so it needs only
    // the first range's count.
    let first = first_window(64, 16);
    assert!(want.nodata[..first].iter().all(|&n| !n));
    let held = TestSource {
        free: first,
        ..TestSource::new(&tile)
    };
    let seen = std::sync::Mutex::new(Vec::new());
    let got = enc
        .encode(
            &held,
            &|done, total| seen.lock().unwrap().push((done, total)),
            &no,
        )
        .unwrap();
    assert!(
        !held.waited_out.load(Ordering::Relaxed),
        "the whole tile was counted before the first window was read"
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got.values), bits(&want.values));
    assert_eq!(got.nodata, want.nodata);
    let active = want.nodata.iter().filter(|&&n| !n).count();
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.last(), Some(&(active, active)), "{seen:?}");
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "{seen:?}");
    assert!(seen.iter().all(|&(d, t)| t == active && d <= t), "{seen:?}");

    static CANCEL: AtomicBool = AtomicBool::new(false);
    let held = TestSource {
        free: first,
        cancel_after_read: Some(&CANCEL),
        ..TestSource::new(&tile)
    };
    let err = enc.encode(&held, &|_, _| {}, &CANCEL).unwrap_err();
    assert!(matches!(err, EncodeError::Cancelled), "{err}");
}

/// Written as its windows are encoded, a tile's files hold the same
/// bytes as the tile encoded into memory and written after, pixels
/// without data included; a sink that fails stops the encode with its
/// own error, and its files are not left behind.
#[test]
fn an_output_written_as_encoded_is_the_output_written_after() {
    use crate::backend::BackendChoice;
    use crate::output::{OutputOptions, OutputWriter};
    use crate::synth::random_checkpoint;
    let tile = TileInputs::synthetic(&SynthTile {
        height: 23,
        width: 19,
        s2_frames: 9,
        s1_asc_frames: 4,
        s1_desc_frames: 3,
        clear: 0.12,
        seed: 8,
    });
    let mut profile = DeviceProfile::untuned(BackendChoice::Cpu, "test".into());
    profile.chunk_pixels = 16;
    profile.threads = 1;
    let ckpt = random_checkpoint(&ModelConfig::small(), 4);
    let mut enc = Encoder::from_checkpoint(&ckpt, BackendChoice::Cpu, profile).unwrap();
    enc.set_window_pixels(48);
    let no = AtomicBool::new(false);
    let emb = enc.encode_tile(&tile, &|_, _| {}, &no).unwrap();
    let with_data = emb.nodata.iter().filter(|&&n| !n).count();
    // Several windows, with pixels without data between them.
    assert!(with_data > 3 * 48, "{with_data}");
    assert!(with_data < emb.nodata.len() - 20, "{with_data}");
    let r = enc.config().repr_dim;
    for opts in [
        OutputOptions {
            int8: false,
            dim: r,
        },
        OutputOptions {
            int8: true,
            dim: 64,
        },
    ] {
        let after = tempfile::tempdir().unwrap();
        let want = emb.write_outputs(after.path(), "t", opts).unwrap();
        let streamed = tempfile::tempdir().unwrap();
        let mut w = OutputWriter::create(streamed.path(), "t", opts, (23, 19), r).unwrap();
        enc.encode_into(&tile, &mut w, &|_, _| {}, &no).unwrap();
        let got = w.finish().unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!(
                std::fs::read(g).unwrap() == std::fs::read(w).unwrap(),
                "{} differs ({opts:?})",
                g.display()
            );
        }
    }

    /// Takes `ok` windows, then fails.
    struct Failing {
        ok: usize,
        seen: usize,
    }
    impl EmbeddingSink for Failing {
        fn window(&mut self, _: &[u32], _: &[f32]) -> Result<()> {
            self.seen += 1;
            if self.seen > self.ok {
                return Err(EncodeError::Invalid("the test's disk is full".into()));
            }
            Ok(())
        }
    }
    let mut sink = Failing { ok: 1, seen: 0 };
    let err = enc
        .encode_into(&tile, &mut sink, &|_, _| {}, &no)
        .unwrap_err();
    assert!(err.to_string().contains("the test's disk is full"), "{err}");
    assert_eq!(sink.seen, 2, "windows went on to the sink after it failed");

    // A writer made for another tile is refused before the encode.
    let dir = tempfile::tempdir().unwrap();
    let opts = OutputOptions {
        int8: false,
        dim: r,
    };
    let mut w = OutputWriter::create(dir.path(), "t", opts, (19, 23), r).unwrap();
    let err = enc.encode_into(&tile, &mut w, &|_, _| {}, &no).unwrap_err();
    assert!(
        err.to_string()
            .contains("an output made for a tile of 19 x 23 px given one of 23 x 19"),
        "{err}"
    );
    drop(w);

    // A writer whose encode fails leaves nothing in its directory.
    let mut w = OutputWriter::create(
        dir.path(),
        "t",
        OutputOptions { int8: true, dim: r },
        (23, 19),
        r,
    )
    .unwrap();
    static CANCEL: AtomicBool = AtomicBool::new(false);
    let held = TestSource {
        cancel_after_read: Some(&CANCEL),
        ..TestSource::new(&tile)
    };
    let err = enc
        .encode_into(&held, &mut w, &|_, _| {}, &CANCEL)
        .unwrap_err();
    assert!(matches!(err, EncodeError::Cancelled), "{err}");
    drop(w);
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
}

/// A backend that keeps features and computes nothing, logging what
/// the encode asks of it, in order: "begin" (a kept backbone), "head"
/// (a head begun), "taken" (its result taken).
struct Recorder {
    slots: Arc<crate::backend::SlotPool>,
    log: std::sync::Mutex<Vec<&'static str>>,
    d: usize,
    r: usize,
    /// Every backbone fails.
    fail: bool,
}

impl Backend for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }
    fn backbone(&self, _: Modality, batch: &SequenceBatch<'_>) -> Result<Vec<f32>> {
        Ok(vec![0.0; batch.n * self.d])
    }
    fn head(&self, _: &[f32], _: &[f32], n: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; n * self.r])
    }
    fn kept_windows(&self) -> Result<Option<backend::KeptWindows>> {
        Ok(Some(self.slots.lease()))
    }
    fn backbone_begin_kept(
        &self,
        _: Modality,
        batch: &SequenceBatch<'_>,
        place: &KeptRows<'_>,
    ) -> Result<PendingBackbone> {
        place.check(self.name(), batch.n)?;
        if self.fail {
            return Err(EncodeError::backend(self.name(), "failed as asked"));
        }
        self.log.lock().unwrap().push("begin");
        Ok(PendingBackbone::done(Vec::new()))
    }
    fn head_kept_begin(&self, _: usize, n: usize) -> Result<PendingHead> {
        self.log.lock().unwrap().push("head");
        Ok(PendingHead::done(vec![1.0; n * self.r]))
    }
    fn head_end(&self, pending: PendingHead) -> Result<Vec<f32>> {
        self.log.lock().unwrap().push("taken");
        Ok(pending.into_parts().unwrap_or_default())
    }
}

/// Where the backend keeps features, a window's head is begun and its
/// result taken only once the next window's second chunk is queued
/// behind it (so a device is never idle while the host waits for a
/// head and places its result), at most one head at a time; every
/// pixel with data gets its head's values, the others NaN.
#[test]
fn a_heads_result_is_taken_after_the_next_windows_chunks_are_queued() {
    use crate::backend::BackendChoice;
    use crate::synth::random_checkpoint;
    let cfg = ModelConfig::small();
    let tile = TileInputs::synthetic(&SynthTile {
        height: 20,
        width: 23,
        s2_frames: 12,
        s1_asc_frames: 5,
        s1_desc_frames: 4,
        clear: 0.5,
        seed: 4,
    });
    let weights = Arc::new(StudentWeights::from_checkpoint(&random_checkpoint(&cfg, 1)).unwrap());
    let rec = Arc::new(Recorder {
        slots: Arc::default(),
        log: Default::default(),
        d: cfg.d_model(),
        r: cfg.repr_dim,
        fail: false,
    });
    let mut profile = DeviceProfile::untuned(BackendChoice::Cuda, "test".into());
    profile.chunk_pixels = 16;
    let mut enc = Encoder::with_backend(
        weights,
        Box::new(crate::bench::Shared(rec.clone())),
        profile,
    );
    enc.set_window_pixels(64);
    let emb = enc
        .encode_tile(&tile, &|_, _| {}, &AtomicBool::new(false))
        .unwrap();
    let log = rec.log.lock().unwrap().clone();
    let heads = log.iter().filter(|&&e| e == "head").count();
    // 460 px in windows of 16, then 64: several windows of several chunks.
    assert!(heads >= 5, "{log:?}");
    assert_eq!(
        log.iter().filter(|&&e| e == "taken").count(),
        heads,
        "{log:?}"
    );
    let mut open = false;
    for (i, e) in log.iter().enumerate() {
        match *e {
            "head" => {
                assert!(!open, "two heads begun at once at {i}: {log:?}");
                open = true;
            }
            "taken" => {
                assert!(open, "a result taken with no head begun at {i}: {log:?}");
                open = false;
                // Not the tile's last head: the next window's first
                // chunk (begun before the head) and its second are
                // queued before the result is taken.
                if log[i..].contains(&"head") {
                    let since = log[..i].iter().rev().take_while(|&&e| e != "head").count();
                    let begun = log[i - since..i].iter().filter(|&&e| e == "begin").count();
                    assert!(
                        begun >= 1,
                        "a head's result taken with nothing queued behind it, at {i}: {log:?}"
                    );
                    let before = log[..i - since - 1]
                        .iter()
                        .rev()
                        .take_while(|&&e| e == "begin")
                        .count();
                    assert!(
                        before >= 1,
                        "no chunk begun before the head at {i}: {log:?}"
                    );
                }
            }
            _ => {}
        }
    }
    assert!(!open, "{log:?}");
    for (p, &nd) in emb.nodata.iter().enumerate() {
        let v = &emb.values[p * cfg.repr_dim..(p + 1) * cfg.repr_dim];
        if nd {
            assert!(v.iter().all(|x| x.is_nan()), "pixel {p}");
        } else {
            assert!(v.iter().all(|&x| x == 1.0), "pixel {p}");
        }
    }
    assert!(emb.nodata.iter().any(|&n| !n));
}

/// A source that counts a pixel short is refused (its pixels would
/// otherwise be left out of every window and the tile returned as if
/// whole); and once the backend fails, the counter stops at its next
/// range instead of counting the rest of the tile.
#[test]
fn short_counts_are_refused_and_a_failed_encode_stops_counting() {
    let cfg = ModelConfig::small();
    let tile = TileInputs::synthetic(&SynthTile {
        height: 30,
        width: 41,
        s2_frames: 12,
        s1_asc_frames: 5,
        s1_desc_frames: 4,
        clear: 0.5,
        seed: 3,
    });
    let encoder = |fail: bool| {
        let weights = Arc::new(
            StudentWeights::from_checkpoint(&crate::synth::random_checkpoint(&cfg, 1)).unwrap(),
        );
        let rec = Recorder {
            slots: Arc::default(),
            log: Default::default(),
            d: cfg.d_model(),
            r: cfg.repr_dim,
            fail,
        };
        let mut profile =
            DeviceProfile::untuned(crate::backend::BackendChoice::Cuda, "test".into());
        profile.chunk_pixels = 16;
        let mut enc = Encoder::with_backend(weights, Box::new(rec), profile);
        // Windows of 16 px: the counter's ranges grow to 64 px, about
        // 20 of them for this tile's 1,230.
        enc.set_window_pixels(16);
        enc
    };
    let source = |delay_ms: u64, short: bool| TestSource {
        delay: std::time::Duration::from_millis(delay_ms),
        short,
        // Data in the first window only: the reader waits for counts
        // to fill a second, which the rest of the tile never does.
        data_below: 16,
        ..TestSource::new(&tile)
    };
    let no = AtomicBool::new(false);
    let all = count_ranges(tile.pixels(), first_window(16, 16), 16).count();
    assert!(all >= 15, "{all}");

    let short = source(0, true);
    let err = encoder(false).encode(&short, &|_, _| {}, &no).unwrap_err();
    assert!(
        matches!(&err, EncodeError::Invalid(m) if m.contains("counted 15 S2 and 15 S1 values for the 16 pixels 0..16")),
        "{err}"
    );

    let slow = source(30, false);
    let err = encoder(true).encode(&slow, &|_, _| {}, &no).unwrap_err();
    assert!(matches!(&err, EncodeError::Backend { .. }), "{err}");
    let counted = slow.ranges.load(Ordering::Relaxed);
    assert!(
        counted <= all / 2,
        "counted {counted} of {all} ranges after the backend failed"
    );
}
