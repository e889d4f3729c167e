//! Golden-vector tests against the upstream reference implementation's
//! output (shared/fixtures/encoder), for every backend this build can run.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use tessera_encoder::{golden, npy};
use tessera_encoder::{
    BackendChoice, DeviceProfile, Encoder, OutputOptions, TileEmbedding, TileInputs,
};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/encoder");

fn case(name: &str) -> PathBuf {
    let p = Path::new(FIXTURES).join(name);
    assert!(p.is_dir(), "fixture {} is missing", p.display());
    p
}

fn profile(backend: BackendChoice, threads: usize, chunk: usize, block: usize) -> DeviceProfile {
    DeviceProfile {
        threads,
        chunk_pixels: chunk,
        block_pixels: block,
        ..DeviceProfile::default_for(backend)
    }
}

fn encode(
    ckpt: &Path,
    tile: &TileInputs,
    backend: BackendChoice,
    p: DeviceProfile,
) -> TileEmbedding {
    let enc = Encoder::load(ckpt, backend, p).expect("fixture checkpoint loads");
    enc.encode_tile(tile, &|_, _| {}, &AtomicBool::new(false))
        .expect("fixture tile encodes")
}

fn check_against_upstream(name: &str, backend: BackendChoice) {
    let dir = case(name);
    let tile = TileInputs::read(&dir.join("tile")).unwrap();
    let emb = encode(
        &dir.join("ckpt.safetensors"),
        &tile,
        backend,
        profile(backend, 2, 16, 4),
    );
    let report = golden::compare(&dir, &emb)
        .and_then(|r| r.meets_thresholds().map(|()| r))
        .unwrap_or_else(|e| panic!("{name}/{backend:?}: {e}"));
    eprintln!("{name}/{backend:?}: {report:?}");
}

#[test]
fn small_matches_upstream() {
    for b in BackendChoice::available() {
        check_against_upstream("small", b);
    }
}

#[test]
fn long_matches_upstream() {
    for b in BackendChoice::available() {
        check_against_upstream("long", b);
    }
}

#[test]
fn pt_and_safetensors_give_identical_output() {
    let dir = case("small");
    let tile = TileInputs::read(&dir.join("tile")).unwrap();
    for b in BackendChoice::available() {
        let a = encode(&dir.join("ckpt.pt"), &tile, b, profile(b, 1, 64, 4));
        let s = encode(
            &dir.join("ckpt.safetensors"),
            &tile,
            b,
            profile(b, 1, 64, 4),
        );
        let bits = |e: &TileEmbedding| e.values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&s), "{b:?}");
    }
}

/// The thread-per-block backends this build has: cpu, and onednn when compiled in.
fn block_backends() -> Vec<BackendChoice> {
    BackendChoice::available()
        .into_iter()
        .filter(|b| matches!(b, BackendChoice::Cpu | BackendChoice::Onednn))
        .collect()
}

#[test]
fn byte_identical_across_runs_and_thread_counts() {
    let dir = case("small");
    let tile = TileInputs::read(&dir.join("tile")).unwrap();
    let ckpt = dir.join("ckpt.safetensors");
    for b in block_backends() {
        let out = |threads: usize, tag: &str| -> Vec<u8> {
            let emb = encode(&ckpt, &tile, b, profile(b, threads, 32, 4));
            let d = std::env::temp_dir().join(format!(
                "tessera-det-{}-{}-{tag}",
                std::process::id(),
                b.name()
            ));
            emb.write_outputs(
                &d,
                "t",
                OutputOptions {
                    int8: false,
                    dim: 128,
                },
            )
            .unwrap();
            let bytes = std::fs::read(d.join("t.npy")).unwrap();
            std::fs::remove_dir_all(&d).unwrap();
            bytes
        };
        let first = out(1, "a");
        assert_eq!(first, out(1, "b"), "{b:?}: two runs differ");
        assert_eq!(first, out(2, "c"), "{b:?}: 1 vs 2 threads differ");
        assert_eq!(first, out(3, "d"), "{b:?}: 1 vs 3 threads differ");
    }

    let r = BackendChoice::Reference;
    let bits = |threads: usize| {
        encode(&ckpt, &tile, r, profile(r, threads, 32, 32))
            .values
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(1), bits(2), "reference: 1 vs 2 threads differ");
}

#[test]
fn int8_output_files_follow_the_published_format() {
    let dir = case("small");
    let tile = TileInputs::read(&dir.join("tile")).unwrap();
    let emb = encode(
        &dir.join("ckpt.safetensors"),
        &tile,
        BackendChoice::Cpu,
        profile(BackendChoice::Cpu, 2, 64, 4),
    );
    let out = std::env::temp_dir().join(format!("tessera-int8-{}", std::process::id()));
    emb.write_outputs(
        &out,
        "grid_x",
        OutputOptions {
            int8: true,
            dim: 32,
        },
    )
    .unwrap();
    let codes = npy::read(&out.join("grid_x.npy")).unwrap();
    let scales = npy::read(&out.join("grid_x_scales.npy")).unwrap();
    assert_eq!(codes.dtype, npy::DType::I8);
    assert_eq!(codes.shape, vec![12, 10, 32]);
    assert_eq!(scales.shape, vec![12, 10]);
    assert_eq!(scales.to_f32()[0], f32::INFINITY, "pixel (0,0) has no data");
    let names: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "no temporary files left: {names:?}");
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
/// Windows regroup pixels into different blocks, so bits may differ (GEMM
/// blocking depends on the block's row count) but values must agree.
fn windowing_does_not_change_the_output() {
    let dir = case("small");
    let tile = TileInputs::read(&dir.join("tile")).unwrap();
    for b in block_backends() {
        windowing_case(&dir, &tile, b);
    }
}

fn windowing_case(dir: &Path, tile: &TileInputs, b: BackendChoice) {
    let whole = encode(&dir.join("ckpt.safetensors"), tile, b, profile(b, 2, 8, 4));
    let mut enc = Encoder::load(&dir.join("ckpt.safetensors"), b, profile(b, 2, 8, 4)).unwrap();
    enc.set_window_pixels(13);
    let windows = enc
        .encode_tile(tile, &|_, _| {}, &AtomicBool::new(false))
        .unwrap();
    for (x, y) in whole.values.iter().zip(&windows.values) {
        assert!(
            (x - y).abs() <= 1e-5 || (x.is_nan() && y.is_nan()),
            "{b:?}: {x} vs {y}"
        );
    }
}

/// The CUDA backend runs the fixture tests above wherever a GPU answers
/// (`BackendChoice::available()` lists it then). Without one, asking for it
/// is a clear error, not a crash, and `auto` falls back to a CPU backend.
#[test]
fn cuda_is_used_where_a_gpu_answers_and_refused_clearly_elsewhere() {
    let dir = case("small");
    let usable = tessera_encoder::backend::cuda_usable();
    assert_eq!(
        BackendChoice::available().contains(&BackendChoice::Cuda),
        usable
    );
    if usable {
        assert_eq!(BackendChoice::Auto.resolve(), BackendChoice::Cuda);
        return; // small_matches_upstream and long_matches_upstream cover it.
    }
    eprintln!("no usable GPU here: the CUDA backend's numerical tests are skipped");
    assert_ne!(BackendChoice::Auto.resolve(), BackendChoice::Cuda);
    let err = match Encoder::load(
        &dir.join("ckpt.safetensors"),
        BackendChoice::Cuda,
        profile(BackendChoice::Cuda, 1, 16, 4),
    ) {
        Ok(_) => panic!("the CUDA backend loaded without a usable GPU"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("cuda") && (err.contains("GPU") || err.contains("not available")),
        "{err}"
    );
}

/// The backends that run bf16 natively here: cuda where a GPU answers,
/// onednn where its oneDNN has AMX or AVX512-BF16.
fn bf16_backends() -> Vec<BackendChoice> {
    let mut out = Vec::new();
    if tessera_encoder::backend::cuda_usable() {
        out.push(BackendChoice::Cuda);
    }
    #[cfg(all(feature = "onednn", target_os = "linux"))]
    if tessera_encoder::backend::onednn::bf16_supported() {
        out.push(BackendChoice::Onednn);
    }
    out
}

/// Issue 16's fidelity rule for bf16: against upstream's f32, the worst
/// pixel's cosine is at least 0.9999, wherever a backend runs bf16; the
/// int8 code differences are reported. (The emulated GPU's bf16 is checked
/// in the library's tests, on every machine.)
#[test]
fn bf16_meets_the_fidelity_rule_where_it_runs() {
    let backends = bf16_backends();
    if backends.is_empty() {
        eprintln!("no backend runs bf16 natively here: skipped");
        return;
    }
    for b in backends {
        for name in ["small", "long"] {
            let dir = case(name);
            let tile = TileInputs::read(&dir.join("tile")).unwrap();
            let p = DeviceProfile {
                dtype: tessera_encoder::Dtype::Bf16,
                ..profile(b, 2, 16, 4)
            };
            let emb = encode(&dir.join("ckpt.safetensors"), &tile, b, p);
            let r = golden::compare(&dir, &emb).unwrap_or_else(|e| panic!("{name}/{b:?}: {e}"));
            eprintln!(
                "{name}/{b:?} bf16: worst cosine {:.7}, int8 codes {:.1} % equal, {:.1} % within one, largest difference {}",
                r.worst_cosine,
                100.0 * r.int8_equal,
                100.0 * r.int8_within_one,
                r.int8_max_diff
            );
            assert!(r.worst_cosine >= 0.9999, "{name}/{b:?} bf16: {r:?}");
        }
    }
}
