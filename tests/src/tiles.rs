//! Set-up shared by the tile tests and benches: `tessera-encode` runs, random
//! models and tiles, inputs placed in a server's local store, datasets.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use crate::procs::Server;

/// Runs `tessera-encode ARGS`, panicking with its stderr if it fails.
pub fn tessera(args: &[&str]) {
    let out = Command::new(crate::binary("tessera-encode"))
        .args(args)
        .output()
        .expect("running tessera-encode");
    assert!(
        out.status.success(),
        "tessera-encode {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Sizes of a random model.
#[derive(Debug, Clone, Copy)]
pub struct ModelSize {
    pub latent_dim: usize,
    pub num_layers: usize,
    pub dim_feedforward: usize,
}

/// A tiny model: tiles of a few thousand pixels take well under a second.
pub const TINY: ModelSize = ModelSize {
    latent_dim: 16,
    num_layers: 1,
    dim_feedforward: 64,
};

/// A model big enough that a 200×200 tile takes seconds (progress moves).
pub const SLOW: ModelSize = ModelSize {
    latent_dim: 64,
    num_layers: 2,
    dim_feedforward: 512,
};

/// Writes a random checkpoint of `size` (4 heads) to `dir/ckpt.safetensors`.
pub fn synth_ckpt(dir: &Path, size: ModelSize, seed: u64) -> PathBuf {
    let ckpt = dir.join("ckpt.safetensors");
    tessera(&[
        "synth-ckpt",
        "--out",
        ckpt.to_str().expect("scratch paths are UTF-8"),
        "--latent-dim",
        &size.latent_dim.to_string(),
        "--num-layers",
        &size.num_layers.to_string(),
        "--nhead",
        "4",
        "--dim-feedforward",
        &size.dim_feedforward.to_string(),
        "--seed",
        &seed.to_string(),
    ]);
    ckpt
}

/// Synthetic inputs for `tile` (side × side pixels, 24 S2 and 12 + 12 S1
/// frames) in `server.dir/tiles/TILE` for `tessera-encode`, and copied into
/// the server's local store under `inputs/YEAR/TILE/` for each of `years`
/// (the dataset input prefix `inputs`). Returns the local directory.
pub fn synth_inputs(server: &Server, tile: &str, side: usize, seed: u64, years: &[i32]) -> PathBuf {
    let dir = server.dir.join("tiles").join(tile);
    let side = side.to_string();
    tessera(&[
        "synth-tile",
        "--out",
        dir.to_str().expect("scratch paths are UTF-8"),
        "--height",
        &side,
        "--width",
        &side,
        "--s2-frames",
        "24",
        "--s1-asc-frames",
        "12",
        "--s1-desc-frames",
        "12",
        "--seed",
        &seed.to_string(),
    ]);
    for year in years {
        let in_store = server
            .dir
            .join("store/inputs")
            .join(year.to_string())
            .join(tile);
        std::fs::create_dir_all(&in_store).expect("making the input prefix");
        for f in std::fs::read_dir(&dir).expect("reading the tile") {
            let f = f.expect("reading the tile");
            std::fs::copy(f.path(), in_store.join(f.file_name())).expect("copying an input");
        }
    }
    dir
}

/// Registers dataset `name` (inputs under the store prefix `inputs`) and
/// uploads `ckpt` as its model.
pub async fn register_dataset(server: &Server, name: &str, ckpt: &Path) {
    let api = server.api();
    let (s, v) = api
        .raw(
            reqwest::Method::POST,
            "/api/v1/datasets",
            Some(json!({ "name": name, "input_prefix": "inputs" })),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let (status, text) = api
        .put_bytes(
            &format!("/api/v1/datasets/{name}/checkpoint"),
            std::fs::read(ckpt).expect("reading the checkpoint"),
        )
        .await;
    assert_eq!(status, 200, "{text}");
}

/// Encodes the tile directory `inputs` with bare `tessera-encode --int8`
/// into `out_dir` (`NAME.npy`, `NAME_scales.npy`, NAME = the directory's name).
pub fn encode_int8(ckpt: &Path, inputs: &Path, out_dir: &Path) {
    let path = |p: &Path| p.to_str().expect("scratch paths are UTF-8").to_string();
    tessera(&[
        "--ckpt",
        &path(ckpt),
        "--tile",
        &path(inputs),
        "--out-dir",
        &path(out_dir),
        "--int8",
    ]);
}

/// `stored/TILE.npy` and `stored/TILE_scales.npy` are byte-equal to the
/// files of the same names in `expected` (what `tessera-encode` wrote).
pub fn assert_same_outputs(stored: &Path, expected: &Path, tile: &str) {
    for name in [format!("{tile}.npy"), format!("{tile}_scales.npy")] {
        let got = std::fs::read(stored.join(&name))
            .unwrap_or_else(|e| panic!("reading the stored {name}: {e}"));
        let want = std::fs::read(expected.join(&name))
            .unwrap_or_else(|e| panic!("reading tessera-encode's {name}: {e}"));
        assert!(got == want, "{name}: differs from tessera-encode's");
    }
}

/// Polls `GET /api/v1/rois/{id}` every `poll` until every job of the ROI
/// has finished; returns that view. Panics after `timeout`.
pub async fn wait_roi(
    server: &Server,
    id: &str,
    timeout: std::time::Duration,
    poll: std::time::Duration,
) -> serde_json::Value {
    let api = server.api();
    let start = std::time::Instant::now();
    loop {
        let v = api.get(&format!("/api/v1/rois/{id}")).await;
        if v["finished"] == json!(true) {
            return v;
        }
        assert!(start.elapsed() < timeout, "ROI not finished: {v}");
        tokio::time::sleep(poll).await;
    }
}
