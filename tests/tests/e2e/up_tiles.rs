//! The embedded default end to end: `flotilla up` (its own PostgreSQL cluster, the local object store, one local agent) encodes an ROI of a few tiles submitted with the CLI; the outputs load in numpy as int8 (H,W,128) and f32 (H,W) and equal what `tessera-encode` writes for the same inputs.

use std::process::Command;
use std::time::{Duration, Instant};

use flotilla_e2e::up::{run, Up};
use flotilla_e2e::{binary, scratch, tiles};

const TILES: [&str; 2] = ["grid_0.05_52.05", "grid_0.15_52.05"];

#[test]
fn an_roi_on_flotilla_up_is_encoded_and_loads_in_numpy() {
    let dir = scratch("e2e-up-");
    let up = Up::start(dir.path(), 2);
    let (data, url) = (up.data.clone(), up.url.clone());

    // A tiny model and inputs written into the local store under the dataset's prefix.
    let ckpt = tiles::synth_ckpt(dir.path(), tiles::TINY, 3);
    for (seed, tile) in TILES.iter().enumerate() {
        let inputs = data.join("store/inputs/2024").join(tile);
        tiles::tessera(&[
            "synth-tile",
            "--out",
            inputs.to_str().unwrap(),
            "--height",
            "30",
            "--width",
            "20",
            "--s2-frames",
            "16",
            "--s1-asc-frames",
            "8",
            "--s1-desc-frames",
            "8",
            "--seed",
            &seed.to_string(),
        ]);
    }

    // The operator's commands, against the server `up` started.
    let flotilla = binary("flotilla");
    let token_file = data.join("admin.token");
    let conn = [
        "--server",
        url.as_str(),
        "--token-file",
        token_file.to_str().unwrap(),
    ];
    // The local agent is listed (once it has registered) with the encoder
    // backend it tiles with.
    let mut args = vec!["agents"];
    args.extend(conn);
    let listed = |out: &str| {
        out.contains("ENCODER")
            && ["cuda", "onednn", "cpu"]
                .iter()
                .any(|b| out.contains(&format!(" {b} ")))
    };
    let started = Instant::now();
    let mut agents = run(&flotilla, &args);
    while !listed(&agents) && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(250));
        agents = run(&flotilla, &args);
    }
    assert!(listed(&agents), "{agents}");
    let mut args = vec!["datasets", "add", "demo", "--ckpt", ckpt.to_str().unwrap()];
    args.extend(["--inputs", "inputs"]);
    args.extend(conn);
    run(&flotilla, &args);
    let mut args = vec!["roi", "plan", "--name", "two", "--year", "2024"];
    args.extend(["--dataset", "demo", "--bbox", "0.01,52.01,0.19,52.09"]);
    args.extend(conn);
    let plan = run(&flotilla, &args);
    assert!(
        plan.contains("total 2") && plan.contains("missing 2"),
        "{plan}"
    );
    let mut args = vec!["roi", "submit", "--name", "two", "--year", "2024", "--wait"];
    args.extend(["--dataset", "demo", "--bbox", "0.01,52.01,0.19,52.09"]);
    args.extend(conn);
    let done = run(&flotilla, &args);
    assert!(done.contains("\"succeeded\": 2"), "{done}");

    let expected = dir.path().join("expected");
    for tile in TILES {
        tiles::encode_int8(&ckpt, &data.join("store/inputs/2024").join(tile), &expected);
        let stored = data.join("store/demo/2024").join(tile);
        tiles::assert_same_outputs(&stored, &expected, tile);
        // numpy itself reads them (setup-debian.sh --test installs it).
        let script = format!(
            "import numpy as np\n\
             e = np.load('{0}/{1}.npy'); s = np.load('{0}/{1}_scales.npy')\n\
             print(e.dtype, e.shape, s.dtype, s.shape)",
            stored.display(),
            tile
        );
        let out = Command::new("python3")
            .args(["-c", &script])
            .output()
            .expect("running python3");
        assert!(
            out.status.success(),
            "numpy could not load the outputs (is numpy installed? `pip install numpy`): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "int8 (30, 20, 128) float32 (30, 20)"
        );
    }
}
