//! An encode's memory is bounded by its windows, not by the tile (issue 16,
//! "Memory"), and reading by windows changes no output bit.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;

use tessera_encoder::{BackendChoice, DeviceProfile, Encoder, TileInputs, TileReader};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/encoder");

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-mem-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn cli(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_tessera-encode"))
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{args:?}: {err}");
    err
}

/// A synthetic tile at `out`: `(height, width)` pixels, `(S2, S1
/// ascending, S1 descending)` frames, `clear` the probability that a frame
/// is a valid observation.
fn synth_tile(
    out: &Path,
    (height, width): (usize, usize),
    frames: (usize, usize, usize),
    clear: &str,
) {
    cli(&[
        "synth-tile",
        "--out",
        out.to_str().unwrap(),
        "--height",
        &height.to_string(),
        "--width",
        &width.to_string(),
        "--s2-frames",
        &frames.0.to_string(),
        "--s1-asc-frames",
        &frames.1.to_string(),
        "--s1-desc-frames",
        &frames.2.to_string(),
        "--clear",
        clear,
    ]);
}

/// Bytes of `.npy` in `dir`.
fn input_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

/// Encode `tile` with the CLI; its peak resident memory in MiB, as it reports it.
fn peak_mib(ckpt: &Path, tile: &Path, out: &Path) -> u64 {
    let err = cli(&[
        "--backend",
        "cpu",
        "--threads",
        "1",
        "--int8",
        // Small windows, so that the tall tile is many of them (the
        // default, 16,384 pixels, would hold it whole with read-ahead).
        "--window-pixels",
        "1024",
        "--ckpt",
        ckpt.to_str().unwrap(),
        "--tile",
        tile.to_str().unwrap(),
        "--out-dir",
        out.to_str().unwrap(),
    ]);
    err.lines()
        .find_map(|l| l.strip_prefix("peak resident memory: "))
        .and_then(|l| l.strip_suffix(" MiB"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no peak memory line: {err}"))
}

/// The same encode on a tile 8x as tall grows the peak resident memory by
/// neither the inputs (2,500 bytes a pixel here) nor the embedding (128 f32
/// a pixel), only by per-pixel counts and scales: reading the tile whole,
/// as before issue 16, grew it by at least the inputs, and holding the
/// embedding until it was written (before the output was written as the
/// windows finish) by the embedding, 29 MiB here.
#[cfg(target_os = "linux")]
#[test]
fn peak_memory_does_not_grow_with_the_tiles_inputs() {
    let d = scratch("rss");
    let ckpt = d.join("tiny.safetensors");
    // The smallest model there is: the time goes to reading, not computing.
    cli(&[
        "synth-ckpt",
        "--out",
        ckpt.to_str().unwrap(),
        "--latent-dim",
        "8",
        "--num-layers",
        "1",
        "--nhead",
        "4",
        "--dim-feedforward",
        "16",
    ]);
    let mut peaks = Vec::new();
    for (name, height) in [("short", 32), ("tall", 256)] {
        let tile = d.join(name);
        synth_tile(&tile, (height, 256), (100, 50, 50), "0.05");
        let inputs = input_bytes(&tile);
        let peak = peak_mib(&ckpt, &tile, &d.join(format!("out-{name}")));
        eprintln!(
            "{name}: {:.1} MiB of inputs, peak {peak} MiB",
            inputs as f64 / 1048576.0
        );
        peaks.push((inputs, peak));
    }
    let input_growth = (peaks[1].0 - peaks[0].0) / (1 << 20);
    let peak_growth = peaks[1].1.saturating_sub(peaks[0].1);
    // 136 MiB of inputs more, and 224 x 256 more pixels: 28 MiB more of
    // embedding (512 bytes a pixel) and 1.2 of counts, flags and scales
    // (about 21 bytes a pixel). Half the embedding's growth is room
    // enough for the allocator, and below holding either whole.
    let embedding_growth = (224 * 256 * 512) >> 20;
    assert!(
        peak_growth * 2 < embedding_growth && peak_growth * 2 < input_growth,
        "peak grew by {peak_growth} MiB for {input_growth} MiB more inputs and \
         {embedding_growth} MiB more embedding: {peaks:?}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// Loading a model holds its f32 matrices about once: read straight into
/// their buffers, moved (not copied) out of the checkpoint, and each one let
/// go as its kernel is built. Before, a Large checkpoint (167 MiB of f32)
/// peaked at 353 MiB on the cpu backend: read, copied into the model, and
/// copied again into the kernels. A 1-pixel tile, so the load is the peak.
#[cfg(target_os = "linux")]
#[test]
fn loading_a_model_holds_its_weights_about_once() {
    let d = scratch("load");
    let ckpt = d.join("large.safetensors");
    cli(&["synth-ckpt", "--out", ckpt.to_str().unwrap()]);
    let tile = d.join("one");
    synth_tile(&tile, (1, 1), (8, 4, 4), "1.0");
    let weights = std::fs::metadata(&ckpt).unwrap().len() >> 20;
    let peak = peak_mib(&ckpt, &tile, &d.join("out"));
    eprintln!("{weights} MiB of weights, peak {peak} MiB");
    // Once, plus the process and one layer's copy; twice is the old way.
    assert!(
        peak * 4 < weights * 6,
        "loading {weights} MiB of weights peaked at {peak} MiB"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// Windows read from the files, ahead of the backend, give the same bits as
/// the tile read whole, window boundaries and all.
#[test]
fn reading_by_windows_changes_no_bit() {
    let dir = Path::new(FIXTURES).join("small");
    let profile = DeviceProfile {
        threads: 2,
        chunk_pixels: 8,
        block_pixels: 4,
        ..DeviceProfile::default_for(BackendChoice::Cpu)
    };
    let mut enc =
        Encoder::load(&dir.join("ckpt.safetensors"), BackendChoice::Cpu, profile).unwrap();
    enc.set_window_pixels(13);
    let cancel = AtomicBool::new(false);
    let whole = TileInputs::read(&dir.join("tile")).unwrap();
    let a = enc.encode_tile(&whole, &|_, _| {}, &cancel).unwrap();
    let files = TileReader::open(&dir.join("tile")).unwrap();
    let b = enc.encode_files(&files, &|_, _| {}, &cancel).unwrap();
    assert_eq!(a.nodata, b.nodata);
    assert_eq!(a.values.len(), b.values.len());
    for (x, y) in a.values.iter().zip(&b.values) {
        assert_eq!(x.to_bits(), y.to_bits());
    }
    // And the whole-tile read is the files' contents.
    let again = files.read_all().unwrap();
    assert_eq!((again.bands, again.masks), (whole.bands, whole.masks));
}

/// A file cut short after the tile was opened (a fetch still writing, a
/// full disk) fails the encode naming the file, when its window is read.
#[test]
fn an_input_truncated_while_encoding_names_the_file() {
    let d = scratch("trunc");
    let src = Path::new(FIXTURES).join("small/tile");
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.join(e.file_name())).unwrap();
    }
    let files = TileReader::open(&d).unwrap();
    let bands = d.join("bands.npy");
    let len = std::fs::metadata(&bands).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&bands)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let enc = Encoder::load(
        &Path::new(FIXTURES).join("small/ckpt.safetensors"),
        BackendChoice::Cpu,
        DeviceProfile::default_for(BackendChoice::Cpu),
    )
    .unwrap();
    let err = enc
        .encode_files(&files, &|_, _| {}, &AtomicBool::new(false))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bands.npy") && err.contains("truncated"),
        "{err}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}
