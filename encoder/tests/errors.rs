//! Bad inputs and bad checkpoints: the error names the file or tensor, and
//! the CLI writes no output.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;

use tessera_encoder::checkpoint::Checkpoint;
use tessera_encoder::npy::{self, DType};
use tessera_encoder::{
    random_checkpoint, write_safetensors, BackendChoice, DeviceProfile, EncodeError, Encoder,
    ModelConfig, StudentWeights, SynthTile, TileInputs,
};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/encoder");

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-err-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn copy_tile(dst: &Path) {
    let src = Path::new(FIXTURES).join("small/tile");
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
}

/// Run the CLI on a tile; returns (success, stderr, files in out dir).
fn cli(ckpt: &Path, tile: &Path, out: &Path) -> (bool, String, usize) {
    cli_with(&["--backend", "cpu", "--int8"], ckpt, tile, out)
}

/// [`cli`] with `options` instead of `--backend cpu --int8`.
fn cli_with(options: &[&str], ckpt: &Path, tile: &Path, out: &Path) -> (bool, String, usize) {
    let o = Command::new(env!("CARGO_BIN_EXE_tessera-encode"))
        .args(options)
        .arg("--ckpt")
        .arg(ckpt)
        .arg("--tile")
        .arg(tile)
        .arg("--out-dir")
        .arg(out)
        .output()
        .unwrap();
    let n = std::fs::read_dir(out).map(|r| r.count()).unwrap_or(0);
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
        n,
    )
}

#[test]
fn cli_writes_output_for_a_good_tile() {
    let d = scratch("good");
    let tile = d.join("grid_0.15_52.05");
    copy_tile(&tile);
    let ckpt = Path::new(FIXTURES).join("small/ckpt.pt");
    let (ok, err, n) = cli(&ckpt, &tile, &d.join("out"));
    assert!(ok, "{err}");
    assert_eq!(n, 2);
    assert!(d.join("out/grid_0.15_52.05.npy").exists());
    assert!(d.join("out/grid_0.15_52.05_scales.npy").exists());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_dtype_the_backend_cannot_run_is_refused_before_any_output() {
    let d = scratch("dtype");
    let tile = d.join("grid_0.15_52.05");
    copy_tile(&tile);
    let ckpt = Path::new(FIXTURES).join("small/ckpt.pt");
    for (backend, dtype, says) in [
        ("cpu", "tf32", "f32 only"),
        ("reference", "bf16", "f32 only"),
    ] {
        let out = d.join(format!("out-{backend}"));
        let options = ["--backend", backend, "--dtype", dtype];
        let (ok, err, n) = cli_with(&options, &ckpt, &tile, &out);
        assert!(!ok, "{backend} ran dtype {dtype}");
        assert!(
            err.contains(&format!("`{dtype}`")) && err.contains(says),
            "{backend}: {err}"
        );
        assert_eq!(n, 0, "{backend}: no output");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn truncated_and_mismatched_inputs_name_the_file_and_write_nothing() {
    let ckpt = Path::new(FIXTURES).join("small/ckpt.safetensors");
    type Damage = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Damage)> = vec![
        (
            "bands.npy",
            Box::new(|t: &Path| {
                let p = t.join("bands.npy");
                let b = std::fs::read(&p).unwrap();
                std::fs::write(&p, &b[..b.len() - 100]).unwrap();
            }),
        ),
        (
            "masks.npy",
            Box::new(|t: &Path| {
                npy::write(
                    &t.join("masks.npy"),
                    DType::U8,
                    &[29, 12, 10],
                    &vec![1u8; 29 * 120],
                )
                .unwrap();
            }),
        ),
        (
            "sar_ascending.npy",
            Box::new(|t: &Path| {
                npy::write(
                    &t.join("sar_ascending.npy"),
                    DType::F32,
                    &[20, 12, 10, 2],
                    &vec![0u8; 20 * 240 * 4],
                )
                .unwrap();
            }),
        ),
        (
            "sar_descending_doy.npy",
            Box::new(|t: &Path| {
                npy::write(
                    &t.join("sar_descending_doy.npy"),
                    DType::I32,
                    &[3],
                    &[0u8; 12],
                )
                .unwrap();
            }),
        ),
        (
            "doys.npy",
            Box::new(|t: &Path| std::fs::remove_file(t.join("doys.npy")).unwrap()),
        ),
    ];
    for (i, (file, damage)) in cases.iter().enumerate() {
        let d = scratch(&format!("bad{i}"));
        let tile = d.join("tile");
        copy_tile(&tile);
        damage(&tile);
        let err = TileInputs::read(&tile).unwrap_err().to_string();
        assert!(
            err.contains(file),
            "error for {file} does not name it: {err}"
        );
        let (ok, stderr, n) = cli(&ckpt, &tile, &d.join("out"));
        assert!(!ok, "CLI accepted a bad {file}");
        assert!(
            stderr.contains(file),
            "CLI error does not name {file}: {stderr}"
        );
        assert_eq!(n, 0, "output written despite a bad {file}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}

#[test]
fn absent_descending_pass_means_no_observations() {
    let d = scratch("nodesc");
    let tile = d.join("tile");
    copy_tile(&tile);
    std::fs::remove_file(tile.join("sar_descending.npy")).unwrap();
    std::fs::remove_file(tile.join("sar_descending_doy.npy")).unwrap();
    let t = TileInputs::read(&tile).unwrap();
    assert_eq!(t.descending.frames(), 0);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bad_checkpoints_name_the_tensor() {
    let cfg = ModelConfig::small();
    let good = random_checkpoint(&cfg, 3);
    let p = DeviceProfile::default_for(BackendChoice::Cpu);
    // Both ways of loading (tensors copied out of a borrowed checkpoint, or
    // moved out of an owned one, as `Encoder::load` does) refuse alike.
    let load = |c: &Checkpoint| {
        let borrowed = Encoder::from_checkpoint(c, BackendChoice::Cpu, p.clone()).err();
        let owned = StudentWeights::from_owned_checkpoint(c.clone()).err();
        assert_eq!(
            borrowed.as_ref().map(ToString::to_string),
            owned.as_ref().map(ToString::to_string)
        );
        borrowed
    };
    assert!(load(&good).is_none());

    let mut missing = good.clone();
    missing
        .tensors
        .remove("s1_backbone.transformer_encoder.layers.0.linear2.bias");
    let e = load(&missing).unwrap().to_string();
    assert!(
        e.contains("s1_backbone.transformer_encoder.layers.0.linear2.bias")
            && e.contains("missing"),
        "{e}"
    );

    let mut shaped = good.clone();
    shaped
        .tensors
        .get_mut("dim_reducer.4.weight")
        .unwrap()
        .shape = vec![64, 32];
    let e = load(&shaped).unwrap().to_string();
    assert!(
        e.contains("dim_reducer.4.weight") && e.contains("shape"),
        "{e}"
    );

    let mut extra = good.clone();
    let t = extra.tensors["dim_reducer.1.bias"].clone();
    extra.tensors.insert("s2_backbone.bogus.weight".into(), t);
    let e = load(&extra).unwrap().to_string();
    assert!(e.contains("s2_backbone.bogus.weight"), "{e}");

    // Through a file and the CLI: no output written.
    let d = scratch("ckpt");
    let path = d.join("bad.safetensors");
    write_safetensors(&missing, &path).unwrap();
    let tile = d.join("tile");
    copy_tile(&tile);
    let (ok, stderr, n) = cli(&path, &tile, &d.join("out"));
    assert!(!ok);
    assert!(stderr.contains("linear2.bias"), "{stderr}");
    assert_eq!(n, 0);
    std::fs::write(&path, b"not a checkpoint").unwrap();
    let e = Checkpoint::load(&path).unwrap_err().to_string();
    assert!(e.contains("bad.safetensors"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn synthetic_checkpoint_round_trips_and_cancel_stops() {
    let cfg = ModelConfig::small();
    let d = scratch("synth");
    let path = d.join("ck.safetensors");
    write_safetensors(&random_checkpoint(&cfg, 5), &path).unwrap();
    let ck = Checkpoint::load(&path).unwrap();
    assert_eq!(ck.config, cfg);
    let tile = TileInputs::synthetic(&SynthTile {
        height: 4,
        width: 5,
        s2_frames: 12,
        s1_asc_frames: 5,
        s1_desc_frames: 4,
        clear: 0.6,
        seed: 9,
    });
    tile.write(&d.join("t")).unwrap();
    let back = TileInputs::read(&d.join("t")).unwrap();
    assert_eq!(back.bands, tile.bands);
    let reference = Encoder::from_checkpoint(
        &ck,
        BackendChoice::Reference,
        DeviceProfile::default_for(BackendChoice::Reference),
    )
    .unwrap();
    let b = reference
        .encode_tile(&tile, &|_, _| {}, &AtomicBool::new(false))
        .unwrap();
    // Loaded from the file, the tensors moved out of the checkpoint rather
    // than copied: the same bits.
    let from_file = Encoder::load(
        &path,
        BackendChoice::Reference,
        DeviceProfile::default_for(BackendChoice::Reference),
    )
    .unwrap()
    .encode_tile(&tile, &|_, _| {}, &AtomicBool::new(false))
    .unwrap();
    assert_eq!(from_file.values.len(), b.values.len());
    assert!(from_file
        .values
        .iter()
        .zip(&b.values)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
    for choice in BackendChoice::available() {
        let p = DeviceProfile::default_for(choice);
        let enc = Encoder::from_checkpoint(&ck, choice, p).unwrap();
        let a = enc
            .encode_tile(&tile, &|_, _| {}, &AtomicBool::new(false))
            .unwrap();
        for (x, y) in a.values.iter().zip(&b.values) {
            assert!(
                (x - y).abs() < 1e-4 || (x.is_nan() && y.is_nan()),
                "{choice:?}: {x} vs {y}"
            );
        }
        let err = enc
            .encode_tile(&tile, &|_, _| {}, &AtomicBool::new(true))
            .unwrap_err();
        assert!(matches!(err, EncodeError::Cancelled), "{choice:?}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}
