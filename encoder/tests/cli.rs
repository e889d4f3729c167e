//! The `tessera-encode` subcommands end to end: synthetic inputs, a data
//! root with several tiles, and a tuning sweep that writes a profile.

use std::path::{Path, PathBuf};
use std::process::Command;

use tessera_encoder::npy;
use tessera_encoder::ProfileSet;

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-cli-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run(args: &[&str], extra: &[&Path]) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tessera-encode"));
    c.args(args);
    for p in extra {
        c.arg(p);
    }
    let o = c.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{args:?} failed: {text}");
    text
}

/// A checkpoint of the smallest model the subcommands take (latent 8, one
/// layer, two heads, FFN 16) at `out`.
fn synth_tiny_ckpt(out: &Path) {
    run(
        &[
            "synth-ckpt",
            "--latent-dim",
            "8",
            "--num-layers",
            "1",
            "--nhead",
            "2",
            "--dim-feedforward",
            "16",
            "--out",
        ],
        &[out],
    );
}

#[test]
fn synth_inputs_then_encode_a_data_root() {
    let d = scratch("root");
    let ckpt = d.join("ck.safetensors");
    synth_tiny_ckpt(&ckpt);
    for name in ["grid_0.05_0.05", "grid_0.15_0.05"] {
        let t = d.join("root/2024").join(name);
        run(
            &[
                "synth-tile",
                "--height",
                "3",
                "--width",
                "4",
                "--s2-frames",
                "10",
                "--out",
            ],
            &[&t],
        );
    }
    let out = d.join("out");
    let said = run(
        &["--backend", "cpu", "--int8", "--dim", "64", "--ckpt"],
        &[
            &ckpt,
            Path::new("--data-root"),
            &d.join("root"),
            Path::new("--out-dir"),
            &out,
        ],
    );
    // The start-up, by part, before the tiles.
    let ready = said
        .lines()
        .find(|l| l.starts_with("ready in "))
        .unwrap_or_else(|| panic!("no start-up line: {said}"));
    assert!(
        ready.contains("checkpoint read in") && ready.contains("cpu backend built in"),
        "{ready}"
    );
    for name in ["grid_0.05_0.05", "grid_0.15_0.05"] {
        let codes = npy::read(&out.join(format!("{name}.npy"))).unwrap();
        assert_eq!(codes.shape, vec![3, 4, 64]);
        let scales = npy::read(&out.join(format!("{name}_scales.npy"))).unwrap();
        assert_eq!(scales.shape, vec![3, 4]);
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn tune_writes_the_best_into_the_profile() {
    let d = scratch("tune");
    let profile = d.join("profiles.toml");
    let text = run(
        &[
            "tune",
            "--size",
            "small",
            "--pixels",
            "8",
            "--obs",
            "16",
            "--chunks",
            "4,8",
            "--blocks",
            "1,2",
            "--threads",
            "1",
            "--out",
        ],
        &[&profile],
    );
    assert!(text.contains("best:"), "{text}");
    let set = ProfileSet::load(&profile).unwrap();
    assert_eq!(set.profiles.len(), 1);
    let p = &set.profiles[0];
    assert!([4, 8].contains(&p.chunk_pixels) && [1, 2].contains(&p.block_pixels));
    // It tuned what `--backend auto` (and so the agent) runs here.
    let auto = tessera_encoder::BackendChoice::Auto.resolve();
    assert_eq!(p.backend, auto, "{text}");
    assert_eq!(p.device, tessera_encoder::backend::device_name(auto));
    assert_eq!(p.threads, 1, "{text}");
    // A second sweep, over thread counts too, updates the same entry
    // rather than adding one, and stores the thread count it chose.
    let text = run(
        &[
            "tune",
            "--size",
            "small",
            "--pixels",
            "8",
            "--obs",
            "16",
            "--chunks",
            "8",
            "--blocks",
            "2",
            "--threads",
            "1,2",
            "--profile",
        ],
        &[&profile],
    );
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.len() == 5 && w.iter().all(|x| x.parse::<f64>().is_ok()))
        .collect();
    let tried: Vec<&str> = rows.iter().map(|w| w[0]).collect();
    assert_eq!(tried, ["1", "2"], "one row per thread count: {text}");
    let set = ProfileSet::load(&profile).unwrap();
    assert_eq!(set.profiles.len(), 1);
    let best = text
        .lines()
        .find_map(|l| l.strip_prefix("best: "))
        .and_then(|l| l.split_once(" threads"))
        .map(|(t, _)| t.to_string())
        .unwrap_or_else(|| panic!("no best line: {text}"));
    assert_eq!(set.profiles[0].threads.to_string(), best, "{text}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn backends_says_what_runs_here_and_why_not() {
    let text = run(&["backends"], &[]);
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no line for {name}: {text}"))
            .to_string()
    };
    assert!(line("reference").contains("usable  device:"), "{text}");
    assert!(line("cpu").contains("usable  device:"), "{text}");
    let cuda = line("cuda");
    if tessera_encoder::backend::cuda_usable() {
        assert!(cuda.contains("usable  device:"), "{text}");
    } else {
        // The reason names what is missing.
        assert!(
            cuda.contains("not usable: ") && (cuda.contains("lib") || cuda.contains("GPU")),
            "{text}"
        );
    }
    let auto = tessera_encoder::BackendChoice::Auto.resolve();
    assert!(
        text.contains(&format!("auto ->    {}", auto.name())),
        "{text}"
    );
}

#[test]
fn bench_prints_a_ratio_against_gemm() {
    let text = run(
        &[
            "bench",
            "--size",
            "small",
            "--pixels",
            "4",
            "--obs",
            "16",
            "--threads",
            "1",
            "--backends",
            "cpu",
        ],
        &[],
    );
    assert!(text.contains("of gemm") && text.contains("cpu"), "{text}");
}

#[test]
fn ctrl_c_stops_without_output() {
    use std::io::BufRead;
    let d = scratch("sigint");
    let ckpt = d.join("ck.safetensors");
    run(
        &[
            "synth-ckpt",
            "--latent-dim",
            "16",
            "--num-layers",
            "2",
            "--nhead",
            "4",
            "--dim-feedforward",
            "128",
            "--out",
        ],
        &[&ckpt],
    );
    let tile = d.join("grid_1.05_1.05");
    run(
        &[
            "synth-tile",
            "--height",
            "48",
            "--width",
            "48",
            "--s2-frames",
            "64",
            "--clear",
            "1",
            "--out",
        ],
        &[&tile],
    );
    let out = d.join("out");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera-encode"))
        .args([
            "--backend",
            "cpu",
            "--threads",
            "1",
            "--batch-pixels",
            "8",
            "--int8",
            "--ckpt",
        ])
        .arg(&ckpt)
        .arg("--tile")
        .arg(&tile)
        .arg("--out-dir")
        .arg(&out)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    // The handler is installed before the first tile starts.
    for line in lines.by_ref() {
        if line.unwrap().starts_with("encoding ") {
            break;
        }
    }
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let rest: Vec<String> = lines.map_while(|l| l.ok()).collect();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{rest:?}");
    assert!(rest.iter().any(|l| l.contains("cancelled")), "{rest:?}");
    let left = std::fs::read_dir(&out).map(|r| r.count()).unwrap_or(0);
    assert_eq!(left, 0, "output written after Ctrl-C");
    std::fs::remove_dir_all(&d).unwrap();
}

/// bf16 asked of onednn where the oneDNN in use has no native bf16 matmul
/// (no AVX512-BF16 or AMX) computes in f32, and the encode says so rather
/// than letting a bf16 figure be read off an f32 run; where it has one,
/// nothing is said.
#[cfg(all(feature = "onednn", target_os = "linux"))]
#[test]
fn bf16_on_onednn_says_when_it_computes_in_f32() {
    let d = scratch("bf16-note");
    let ckpt = d.join("ck.safetensors");
    synth_tiny_ckpt(&ckpt);
    let tile = d.join("tile");
    run(
        &["synth-tile", "--height", "2", "--width", "2", "--out"],
        &[&tile],
    );
    let said = run(
        &["--backend", "onednn", "--dtype", "bf16", "--ckpt"],
        &[
            &ckpt,
            Path::new("--tile"),
            &tile,
            Path::new("--out-dir"),
            &d.join("out"),
        ],
    );
    let native = tessera_encoder::backend::onednn::bf16_supported();
    let warned = said
        .lines()
        .any(|l| l.starts_with("warning: bf16 asked") && l.contains("computing in f32"));
    assert_eq!(warned, !native, "native bf16: {native}; said: {said}");
    std::fs::remove_dir_all(&d).unwrap();
}
