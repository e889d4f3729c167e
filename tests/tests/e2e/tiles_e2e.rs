//! Tiles end to end: a dataset with a tiny synthetic model, an ROI of a few tiles encoded by a real agent, outputs equal to `tessera-encode`'s, coverage import from a parquet manifest, re-submission, an agent killed mid-tile, and bad input.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use flotilla_e2e::procs::{server_on_shared, Agent, Server};
use flotilla_e2e::scratch;
use flotilla_e2e::tiles;
use serde_json::{json, Value};

const YEAR: i32 = 2024;
const DATASET: &str = "synth";

/// Synthetic inputs for `tile`, in the store for [`YEAR`].
fn synth_inputs(server: &Server, tile: &str, side: usize, seed: u64) -> PathBuf {
    tiles::synth_inputs(server, tile, side, seed, &[YEAR])
}

async fn register_dataset(server: &Server, ckpt: &Path) {
    tiles::register_dataset(server, DATASET, ckpt).await
}

/// (descr, shape) from a .npy header.
fn npy_header(bytes: &[u8]) -> (String, Vec<usize>) {
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + len]).unwrap();
    let descr = header.split("'descr':").nth(1).unwrap();
    let descr = descr.split('\'').nth(1).unwrap().to_string();
    let shape = header.split("'shape':").nth(1).unwrap();
    let shape = &shape[shape.find('(').unwrap() + 1..shape.find(')').unwrap()];
    let shape = shape
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().unwrap())
        .collect();
    (descr, shape)
}

async fn wait_roi(server: &Server, id: &str, timeout: Duration) -> Value {
    tiles::wait_roi(server, id, timeout, Duration::from_millis(200)).await
}

const TILES: [&str; 3] = ["grid_0.05_52.05", "grid_0.15_52.05", "grid_0.25_52.05"];

fn roi(name: &str, bbox: [f64; 4]) -> Value {
    json!({ "name": name, "year": YEAR, "dataset": DATASET, "bbox": bbox })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_roi_is_encoded_and_equals_tessera_encode() {
    let dir = scratch("e2e-tiles-");
    let server = server_on_shared(dir.path(), 5_000).await;
    let api = server.api();
    let ckpt = tiles::synth_ckpt(dir.path(), tiles::TINY, 7);
    register_dataset(&server, &ckpt).await;
    let mut local = Vec::new();
    for (i, t) in TILES.iter().enumerate() {
        local.push(synth_inputs(&server, t, 40, i as u64));
    }
    let bbox = [0.01, 52.01, 0.29, 52.09];
    let plan = api.post("/api/v1/rois/plan", roi("three", bbox)).await;
    assert_eq!(plan["total"], 3, "{plan}");
    assert_eq!(plan["missing"], 3, "{plan}");

    let made = api.post("/api/v1/rois", roi("three", bbox)).await;
    assert_eq!(made["submitted"], 3, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    // Re-submitting while the jobs are queued adds none.
    let again = api.post("/api/v1/rois", roi("three again", bbox)).await;
    assert_eq!(again["submitted"], 0, "{again}");
    assert_eq!(again["in_flight"], 3, "{again}");

    let _agent = Agent::start(&server, "tiles-a", 2, &[]).await;
    let done = wait_roi(&server, &id, Duration::from_secs(240)).await;
    assert_eq!(done["jobs"]["succeeded"], 3, "{done}");
    // Tiles this small finish between heartbeats: the pixels come with
    // each completion (before, a finished ROI said 0 of 0). The kill test
    // below watches them move.
    assert_eq!(done["pixels_total"], 3 * 40 * 40, "{done}");
    assert_eq!(done["pixels_done"], done["pixels_total"], "{done}");

    let expected = dir.path().join("expected");
    for (t, inputs) in TILES.iter().zip(&local) {
        tiles::encode_int8(&ckpt, inputs, &expected);
        let stored = server
            .dir
            .join("store")
            .join(DATASET)
            .join(YEAR.to_string())
            .join(t);
        let grid = std::fs::read(stored.join(format!("{t}.npy"))).unwrap();
        let scales = std::fs::read(stored.join(format!("{t}_scales.npy"))).unwrap();
        assert_eq!(
            npy_header(&grid),
            ("|i1".to_string(), vec![40, 40, 128]),
            "{t}"
        );
        assert_eq!(
            npy_header(&scales),
            ("<f4".to_string(), vec![40, 40]),
            "{t}"
        );
        tiles::assert_same_outputs(&stored, &expected, t);
    }

    // Each succeeded tile job lists its two outputs, with the sizes stored.
    let jobs = api.get("/api/v1/jobs?state=succeeded&limit=100").await;
    let tile_jobs: Vec<&Value> = jobs["jobs"]
        .as_array()
        .unwrap_or_else(|| panic!("no job list: {jobs}"))
        .iter()
        .filter(|j| j["kind"] == "tile")
        .collect();
    assert_eq!(tile_jobs.len(), 3, "{jobs}");
    for j in tile_jobs {
        let view = api
            .get(&format!("/api/v1/jobs/{}", j["id"].as_str().unwrap()))
            .await;
        let tile = view["spec"]["tile"].as_str().unwrap().to_string();
        // The agent's split of the job's time rides on its result.
        for phase in ["checkpoint_s", "fetch_s", "encode_s", "upload_s"] {
            assert!(view["result"][phase].as_f64().is_some(), "{phase}: {view}");
        }
        let outputs = view["outputs"].as_array().unwrap();
        let names: Vec<&str> = outputs
            .iter()
            .map(|o| o["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [format!("{tile}.npy"), format!("{tile}_scales.npy")],
            "{view}"
        );
        for o in outputs {
            let stored = server
                .dir
                .join("store")
                .join(DATASET)
                .join(YEAR.to_string())
                .join(&tile)
                .join(o["name"].as_str().unwrap());
            assert_eq!(
                o["size"].as_u64().unwrap(),
                std::fs::metadata(&stored).unwrap().len(),
                "{view}"
            );
        }
    }

    // A dataset whose inputs come from a fetch command on the agent.
    let fetch_tile = "grid_0.35_52.05";
    let fetch_src = synth_inputs(&server, fetch_tile, 24, 9);
    let fetch_cmd = format!(
        "cp \"{}\"/*.npy \"$FLOTILLA_OUT\"/ && test \"$FLOTILLA_TILE\" = {fetch_tile} \
         && test \"$FLOTILLA_YEAR\" = {YEAR}",
        fetch_src.display()
    );
    let (s, v) = api
        .raw(
            reqwest::Method::POST,
            "/api/v1/datasets",
            Some(json!({ "name": "synth-fetch", "fetch_command": fetch_cmd })),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let (status, text) = api
        .put_bytes(
            "/api/v1/datasets/synth-fetch/checkpoint",
            std::fs::read(&ckpt).unwrap(),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    let fetched = api
        .post(
            "/api/v1/rois",
            json!({ "name": "fetched", "year": YEAR, "dataset": "synth-fetch",
                    "bbox": [0.31, 52.01, 0.39, 52.09] }),
        )
        .await;
    assert_eq!(fetched["submitted"], 1, "{fetched}");
    let done = wait_roi(
        &server,
        fetched["id"].as_str().unwrap(),
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(done["jobs"]["succeeded"], 1, "{done}");
    tiles::encode_int8(&ckpt, &fetch_src, &expected);
    let stored = server
        .dir
        .join("store/synth-fetch")
        .join(YEAR.to_string())
        .join(fetch_tile);
    tiles::assert_same_outputs(&stored, &expected, fetch_tile);
    // The agent's own lines (stream `agent`) reach the tile job's log.
    let jobs = api.get("/api/v1/jobs?limit=1000").await;
    let fetch_job = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["spec"]["tile"] == fetch_tile)
        .unwrap_or_else(|| panic!("no job for {fetch_tile}: {jobs}"));
    let (status, log) = api
        .raw(
            reqwest::Method::GET,
            &format!("/api/v1/jobs/{}/log", fetch_job["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(status, 200, "{log}");
    let log = log.as_str().unwrap_or_default();
    assert!(
        log.contains("[agent] fetching inputs with command"),
        "the agent's lines are missing from the log:\n{log}"
    );

    // Done tiles are present: a re-submission adds nothing.
    let again = api.post("/api/v1/rois", roi("three, later", bbox)).await;
    assert_eq!(again["present"], 3, "{again}");
    assert_eq!(again["submitted"], 0, "{again}");

    // The agent advertised its encoder, and the server reports its rate.
    let agents = api.get("/api/v1/agents").await;
    assert!(agents.to_string().contains("\"encoder\""), "{agents}");
    let stats = api.get("/api/v1/tiles/stats").await;
    assert_eq!(stats[0]["agent"], "tiles-a", "{stats}");
    assert_eq!(stats[0]["tiles_total"], 4, "{stats}");
    assert!(
        stats[0]["tiles_per_hour"].as_f64().unwrap() > 0.0,
        "{stats}"
    );
}

/// `POST /api/v1/coverage/import?dataset=DATASET` of `body`: the status
/// and the answer's text.
async fn import_manifest(
    api: &flotilla_e2e::api::Api,
    body: impl Into<reqwest::Body>,
) -> (u16, String) {
    let r = api
        .http
        .post(format!(
            "{}/api/v1/coverage/import?dataset={DATASET}",
            api.base
        ))
        .bearer_auth(&api.token)
        .body(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// A manifest in geotessera's columns.
fn manifest(rows: &[(i32, f64, f64, i64, i64)]) -> Vec<u8> {
    manifest_with(rows, parquet::file::properties::WriterProperties::builder())
}

/// A manifest whose first page (the `year` column's) declares an
/// uncompressed size of 2 GiB - 1 over a few hundred bytes of snappy data:
/// the parquet reader allocates and zero-fills what a page declares before
/// it finds the data short, which in the server itself was 2 GiB a column.
/// The varint grows by k bytes, so the page's data gives up its last k
/// (the header's compressed size says so) and every offset after it holds.
fn hostile_manifest(dir: &std::path::Path) -> Vec<u8> {
    use parquet::basic::Compression;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let rows: Vec<_> = (0..1000)
        .map(|k| (YEAR, 10.05 + (k % 10) as f64 / 10.0, 10.05, 1000, 10))
        .collect();
    let props = parquet::file::properties::WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_dictionary_enabled(false);
    let mut buf = manifest_with(&rows, props);
    let path = dir.join("hostile-manifest.parquet");
    std::fs::write(&path, &buf).unwrap();
    let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
    let year = reader.metadata().row_group(0).column(0);
    assert_eq!(
        year.data_page_offset(),
        4,
        "one data page, first in the file"
    );
    let page_end = 4 + year.compressed_size() as usize;
    fn varint(b: &[u8]) -> (u64, usize) {
        let (mut v, mut n) = (0u64, 0);
        loop {
            v |= u64::from(b[n] & 0x7f) << (7 * n);
            n += 1;
            if b[n - 1] & 0x80 == 0 {
                return (v, n);
            }
        }
    }
    fn encode(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
        out
    }
    let zigzag = |v: i64| ((v << 1) ^ (v >> 63)) as u64;
    // PageHeader, thrift compact: field 1 type = DATA_PAGE (0x15 0x00),
    // field 2 uncompressed_page_size, field 3 compressed_page_size.
    assert_eq!(buf[4..7], [0x15, 0x00, 0x15], "a data page header");
    let (_, u_len) = varint(&buf[7..]);
    assert_eq!(buf[7 + u_len], 0x15);
    let (c_zz, c_len) = varint(&buf[8 + u_len..]);
    let huge = encode(zigzag(i64::from(i32::MAX)));
    let grown = huge.len() - u_len;
    let c = (c_zz >> 1) as i64 - grown as i64;
    let c_new = encode(zigzag(c));
    assert_eq!(c_new.len(), c_len, "the compressed size keeps its width");
    let mut out = buf[..7].to_vec();
    out.extend_from_slice(&huge);
    out.push(0x15);
    out.extend_from_slice(&c_new);
    out.extend_from_slice(&buf[8 + u_len + c_len..page_end - grown]);
    out.extend_from_slice(&buf[page_end..]);
    assert_eq!(out.len(), buf.len());
    buf.clear();
    out
}

/// A manifest in geotessera's columns, written with `props`.
fn manifest_with(
    rows: &[(i32, f64, f64, i64, i64)],
    props: parquet::file::properties::WriterPropertiesBuilder,
) -> Vec<u8> {
    use parquet::data_type::{DoubleType, Int32Type, Int64Type};
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;
    let schema = Arc::new(
        parse_message_type(
            "message manifest { REQUIRED INT32 year; REQUIRED DOUBLE lon; REQUIRED DOUBLE lat;
             REQUIRED INT64 grid_size; REQUIRED INT64 scales_size; }",
        )
        .unwrap(),
    );
    let mut buf = Vec::new();
    let mut w = SerializedFileWriter::new(&mut buf, schema, Arc::new(props.build())).unwrap();
    let mut rg = w.next_row_group().unwrap();
    let mut i = 0;
    while let Some(mut col) = rg.next_column().unwrap() {
        match i {
            0 => {
                let v: Vec<i32> = rows.iter().map(|r| r.0).collect();
                col.typed::<Int32Type>()
                    .write_batch(&v, None, None)
                    .unwrap();
            }
            1 | 2 => {
                let v: Vec<f64> = rows
                    .iter()
                    .map(|r| if i == 1 { r.1 } else { r.2 })
                    .collect();
                col.typed::<DoubleType>()
                    .write_batch(&v, None, None)
                    .unwrap();
            }
            _ => {
                let v: Vec<i64> = rows
                    .iter()
                    .map(|r| if i == 3 { r.3 } else { r.4 })
                    .collect();
                col.typed::<Int64Type>()
                    .write_batch(&v, None, None)
                    .unwrap();
            }
        }
        col.close().unwrap();
        i += 1;
    }
    rg.close().unwrap();
    w.close().unwrap();
    buf
}

/// The args of a small model, as the tensor names below expect.
const HOSTILE_ARGS: [(&str, u8); 4] = [
    ("latent_dim", 16),
    ("num_layers", 2),
    ("nhead", 4),
    ("dim_feedforward", 128),
];

/// A .safetensors whose one tensor claims 2^40 f32s; its body is 4 bytes.
fn hostile_safetensors() -> Vec<u8> {
    let args: Value = HOSTILE_ARGS
        .iter()
        .map(|&(k, v)| (k.to_string(), json!(v)))
        .collect();
    let header = json!({
        "__metadata__": { "args": args.to_string() },
        "dim_reducer.4.bias": {
            "dtype": "F32", "shape": [1u64 << 40], "data_offsets": [0, 4u64 << 40]
        }
    })
    .to_string();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&[0; 4]);
    out
}

/// An upstream-format .pt (a stored zip: `ckpt/data.pkl` and one storage)
/// whose one tensor is (2^20, 2^20) f32s over a 1-element, 4-byte storage.
fn hostile_pt() -> Vec<u8> {
    let mut p = vec![0x80, 2, b'}', b'('];
    let s = |p: &mut Vec<u8>, v: &str| {
        p.push(b'X');
        p.extend_from_slice(&(v.len() as u32).to_le_bytes());
        p.extend_from_slice(v.as_bytes());
    };
    let int = |p: &mut Vec<u8>, v: u32| {
        p.push(b'J');
        p.extend_from_slice(&v.to_le_bytes());
    };
    s(&mut p, "args");
    p.extend_from_slice(b"}(");
    for (k, v) in HOSTILE_ARGS {
        s(&mut p, k);
        int(&mut p, v.into());
    }
    p.push(b'u');
    s(&mut p, "model");
    p.extend_from_slice(b"ccollections\nOrderedDict\n)R(");
    s(&mut p, "dim_reducer.4.bias");
    p.extend_from_slice(b"ctorch._utils\n_rebuild_tensor_v2\n((");
    s(&mut p, "storage");
    p.extend_from_slice(b"ctorch\nFloatStorage\n");
    s(&mut p, "0");
    s(&mut p, "cpu");
    int(&mut p, 1);
    p.extend_from_slice(b"tQ");
    int(&mut p, 0);
    for dims in [[1 << 20, 1 << 20], [1 << 20, 1]] {
        p.push(b'(');
        for d in dims {
            int(&mut p, d);
        }
        p.push(b't');
    }
    p.extend_from_slice(b"\x89ccollections\nOrderedDict\n)RtRuu.");
    stored_zip(&[("ckpt/data.pkl", &p), ("ckpt/data/0", &[0; 4])])
}

/// A zip with every entry stored, as `torch.save` writes it.
fn stored_zip(entries: &[(&str, &[u8])]) -> Vec<u8> {
    fn crc32(data: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in data {
            c ^= b as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0xEDB8_8320
                } else {
                    c >> 1
                };
            }
        }
        !c
    }
    let (mut out, mut dir) = (Vec::new(), Vec::new());
    for (name, data) in entries {
        let offset = out.len() as u32;
        let fixed = |v: &mut Vec<u8>| {
            // version 20, no flags, stored, zero time and date
            for x in [20u16, 0, 0, 0, 0] {
                v.extend_from_slice(&x.to_le_bytes());
            }
            for x in [crc32(data), data.len() as u32, data.len() as u32] {
                v.extend_from_slice(&x.to_le_bytes());
            }
            v.extend_from_slice(&(name.len() as u16).to_le_bytes());
            v.extend_from_slice(&0u16.to_le_bytes());
        };
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        fixed(&mut out);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        dir.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        dir.extend_from_slice(&20u16.to_le_bytes());
        fixed(&mut dir);
        // comment length, disk, internal and external attributes
        dir.extend_from_slice(&[0; 10]);
        dir.extend_from_slice(&offset.to_le_bytes());
        dir.extend_from_slice(name.as_bytes());
    }
    let dir_at = out.len() as u32;
    out.extend_from_slice(&dir);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    let n = entries.len() as u16;
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&(dir.len() as u32).to_le_bytes());
    out.extend_from_slice(&dir_at.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coverage_import_and_bad_input() {
    let dir = scratch("e2e-tiles-cov-");
    let server = server_on_shared(dir.path(), 5_000).await;
    let api = server.api();
    let ckpt = tiles::synth_ckpt(dir.path(), tiles::TINY, 7);

    // Unknown dataset, before it exists.
    let (s, v) = api
        .raw(
            reqwest::Method::POST,
            "/api/v1/rois",
            Some(roi("x", [10.0, 10.0, 10.5, 10.5])),
        )
        .await;
    assert!((400..500).contains(&s), "{s} {v}");
    assert!(v.to_string().contains("unknown dataset"), "{v}");

    register_dataset(&server, &ckpt).await;
    // An empty checkpoint upload is refused and changes nothing.
    let before = api.get("/api/v1/datasets").await;
    let checkpoint = format!("/api/v1/datasets/{DATASET}/checkpoint");
    let (status, text) = api.put_bytes(&checkpoint, Vec::new()).await;
    assert_eq!(status, 422, "{text}");
    assert!(text.contains("empty"), "{text}");
    assert_eq!(api.get("/api/v1/datasets").await, before);
    // Hostile checkpoints (each declares a 2^40-element tensor over 4 bytes,
    // which an agent's loader once tried to allocate) are refused with 422
    // naming the tensor, and change nothing.
    for (what, bytes) in [("safetensors", hostile_safetensors()), ("pt", hostile_pt())] {
        let (status, text) = api.put_bytes(&checkpoint, bytes).await;
        assert_eq!(status, 422, "{what}: {text}");
        assert!(
            text.contains("not a valid checkpoint") && text.contains("dim_reducer.4.bias"),
            "{what}: {text}"
        );
        assert_eq!(api.get("/api/v1/datasets").await, before, "{what}");
    }
    let staged: Vec<_> = std::fs::read_dir(server.dir.join("store/datasets").join(DATASET))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        staged.iter().all(|n| n.starts_with("checkpoint-")),
        "a refused upload left {staged:?}"
    );
    // A 1°×1° box: 100 tiles. The manifest says 30 of them exist in 2024
    // (one listed twice), 5 more only in another year, 5 more with size 0.
    let mut rows = Vec::new();
    for k in 0..30 {
        let (ix, iy) = (100 + k % 10, 100 + k / 10);
        rows.push((
            YEAR,
            ix as f64 / 10.0 + 0.05,
            iy as f64 / 10.0 + 0.05,
            1000,
            10,
        ));
    }
    rows.push(rows[0]);
    for k in 0..5 {
        rows.push((2023, 10.05 + k as f64 / 10.0, 10.55, 1000, 10));
        rows.push((YEAR, 10.05 + k as f64 / 10.0, 10.65, 0, 10));
    }
    // And one outside the box.
    rows.push((YEAR, -3.05, 40.05, 1000, 10));
    let (status, text) = import_manifest(&api, manifest(&rows)).await;
    assert_eq!(status, 200, "{text}");
    let imported: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(imported["rows"], rows.len(), "{imported}");
    assert_eq!(imported["tiles"], rows.len() - 5, "{imported}");

    let bbox = [10.0, 10.0, 11.0, 11.0];
    let plan = api.post("/api/v1/rois/plan", roi("box", bbox)).await;
    assert_eq!(plan["total"], 100, "{plan}");
    assert_eq!(plan["present"], 30, "{plan}");
    assert_eq!(plan["missing"], 70, "{plan}");
    let made = api.post("/api/v1/rois", roi("box", bbox)).await;
    assert_eq!(made["submitted"], 70, "{made}");
    let again = api.post("/api/v1/rois", roi("box", bbox)).await;
    assert_eq!(again["submitted"], 0, "{again}");
    assert_eq!(again["in_flight"], 70, "{again}");
    let jobs = api.get("/api/v1/jobs?limit=1000").await;
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 70);

    // A manifest that is not parquet.
    let (status, text) = import_manifest(&api, "year,lon,lat\n").await;
    assert_eq!(status, 422, "{text}");

    // A page declaring 2 GiB: the reader (a child process under a memory
    // limit) dies, the server answers 422 and stays up.
    let (status, text) = import_manifest(&api, hostile_manifest(dir.path())).await;
    assert_eq!(status, 422, "{text}");
    assert!(text.contains("killed the reader"), "{text}");
    // 60,001 rows whose last is off the map: refused, naming the row, and
    // the first batch (50,000 tiles, written before the bad row was read)
    // rolled back with the rest.
    let mut rows: Vec<_> = (0..60_000)
        .map(|k| {
            let (ix, iy) = (k % 300, k / 300);
            (
                YEAR,
                20.05 + ix as f64 / 10.0,
                20.05 + iy as f64 / 10.0,
                1000,
                10,
            )
        })
        .collect();
    rows.push((YEAR, 1000.0, 20.05, 1000, 10));
    let (status, text) = import_manifest(&api, manifest(&rows)).await;
    assert_eq!(status, 422, "{text}");
    assert!(text.contains("row 60000"), "{text}");
    let plan = api
        .post("/api/v1/rois/plan", roi("after", [20.0, 20.0, 21.0, 21.0]))
        .await;
    assert_eq!(
        plan["present"], 0,
        "a refused manifest recorded tiles: {plan}"
    );
    // The same rows without the bad one go in whole.
    rows.pop();
    let (status, text) = import_manifest(&api, manifest(&rows)).await;
    assert_eq!(status, 200, "{text}");
    let imported: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(imported["tiles"], 60_000, "{imported}");
    let plan = api
        .post("/api/v1/rois/plan", roi("after", [20.0, 20.0, 21.0, 21.0]))
        .await;
    assert_eq!(plan["present"], 100, "{plan}");
    // The same tiles twice at once, one manifest in the other's order:
    // each would hold the first batch's rows the other wants next; both go
    // in, one after the other.
    let reversed: Vec<_> = rows.iter().rev().copied().collect();
    let (a, b) = tokio::join!(
        import_manifest(&api, manifest(&rows)),
        import_manifest(&api, manifest(&reversed))
    );
    assert_eq!(a.0, 200, "{}", a.1);
    assert_eq!(b.0, 200, "{}", b.1);

    // Bad regions and years, each a 4xx naming the problem.
    let cases = [
        (
            json!({"name": "g", "year": YEAR, "dataset": DATASET, "geojson": {"type": "Polygon"}}),
            "coordinates",
        ),
        (
            json!({"name": "g", "year": YEAR, "dataset": DATASET, "geojson": {"type": "Point", "coordinates": [0, 0]}}),
            "unsupported GeoJSON type",
        ),
        (
            json!({"name": "bowtie", "year": YEAR, "dataset": DATASET, "geojson": {"type": "Polygon",
                "coordinates": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]}}),
            "crosses",
        ),
        (
            json!({"name": "empty", "year": YEAR, "dataset": DATASET, "geojson": {"type": "Polygon", "coordinates": []}}),
            "no rings",
        ),
        (
            json!({"name": "empty", "year": YEAR, "dataset": DATASET, "geojson": {"type": "MultiPolygon", "coordinates": []}}),
            "no polygons",
        ),
        (
            json!({"name": "y", "year": 1990, "dataset": DATASET, "bbox": bbox}),
            "year",
        ),
        (
            json!({"name": "d", "year": YEAR, "dataset": "nope", "bbox": bbox}),
            "unknown dataset `nope`",
        ),
        (
            json!({"name": "b", "year": YEAR, "dataset": DATASET, "bbox": [1, 1, 0, 2]}),
            "min_lon",
        ),
    ];
    for (body, needle) in cases {
        let (s, v) = api
            .raw(reqwest::Method::POST, "/api/v1/rois", Some(body.clone()))
            .await;
        assert!((400..500).contains(&s), "{body}: {s} {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(needle),
            "{body}: message {msg:?} lacks {needle:?}"
        );
    }
    // Nothing was added by the bad ones.
    let jobs = api.get("/api/v1/jobs?limit=1000").await;
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 70);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_tile_leaves_no_half_result_and_the_tile_is_redone() {
    let dir = scratch("e2e-tiles-kill-");
    let server = server_on_shared(dir.path(), 2_000).await;
    let api = server.api();
    let (job, tile) = one_big_tile(&server, dir.path()).await;

    let mut a = Agent::start(&server, "doomed", 1, &[]).await;
    // Kill it once it is part way through the pixels.
    wait_part_way(&server, &job).await;
    a.kill().await;
    let final_dir = server
        .dir
        .join("store")
        .join(DATASET)
        .join(YEAR.to_string())
        .join(tile);
    assert!(
        !final_dir.exists(),
        "nothing may sit at the final key of an unfinished tile"
    );

    let _b = Agent::start(&server, "rescuer", 1, &[]).await;
    let j = api.wait_final(&job, Duration::from_secs(240)).await;
    assert_eq!(j.state, flotilla_core::job::JobState::Succeeded);
    assert_eq!(j.agent.as_deref(), Some("rescuer"));
    assert!(j.attempt >= 2);
    let grid = std::fs::read(final_dir.join(format!("{tile}.npy"))).unwrap();
    assert_eq!(npy_header(&grid).1, vec![200, 200, 128]);
    let (_, shape) = npy_header(&grid);
    let header_len = grid.len() - shape.iter().product::<usize>();
    assert!(header_len < 256, "the stored object is whole");
}

/// A model and a 200×200 tile big enough that encoding takes seconds, and
/// an ROI of that one tile: (its job, the tile).
async fn one_big_tile(server: &Server, dir: &Path) -> (String, &'static str) {
    let api = server.api();
    let ckpt = tiles::synth_ckpt(dir, tiles::SLOW, 0);
    register_dataset(server, &ckpt).await;
    let tile = "grid_0.05_52.05";
    synth_inputs(server, tile, 200, 3);
    let made = api
        .post("/api/v1/rois", roi("one", [0.01, 52.01, 0.09, 52.09]))
        .await;
    assert_eq!(made["submitted"], 1, "{made}");
    let jobs = api.get("/api/v1/jobs?limit=10").await;
    (jobs["jobs"][0]["id"].as_str().unwrap().to_string(), tile)
}

/// Waits until the job's heartbeats report some pixels done, not all.
async fn wait_part_way(server: &Server, job: &str) {
    let api = server.api();
    let start = std::time::Instant::now();
    loop {
        let j = api.get(&format!("/api/v1/jobs/{job}")).await;
        if j["progress"]["done"].as_u64().unwrap_or(0) > 0 {
            assert!(j["state"] != "succeeded", "the tile finished already: {j}");
            return;
        }
        assert!(j["state"] != "succeeded", "the tile finished already: {j}");
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no progress: {j}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_the_encoder_mid_tile() {
    let dir = scratch("e2e-tiles-cancel-");
    let server = server_on_shared(dir.path(), 5_000).await;
    let api = server.api();
    let (job, tile) = one_big_tile(&server, dir.path()).await;
    // One slot: while the tile is encoding, nothing else can run here.
    let _a = Agent::start(&server, "busy", 1, &[]).await;
    wait_part_way(&server, &job).await;
    let (status, v) = api
        .raw(
            reqwest::Method::POST,
            &format!("/api/v1/jobs/{job}/cancel"),
            None,
        )
        .await;
    assert!(status == 200 || status == 202, "{status} {v}");
    let cancelled_at = std::time::Instant::now();
    let j = api.wait_final(&job, Duration::from_secs(60)).await;
    assert_eq!(j.state, flotilla_core::job::JobState::Cancelled, "{j:?}");
    let p = j.progress.expect("progress was reported");
    assert!(p.done < p.total, "the tile ran to the end: {p:?}");
    // The slot is free again: a quick job gets it at once, so the encoder
    // stopped rather than finishing the tile in the background.
    let quick = api
        .post(
            "/api/v1/jobs",
            serde_json::json!({ "kind": "command", "command": "true" }),
        )
        .await;
    let q = api
        .wait_final(quick["id"].as_str().unwrap(), Duration::from_secs(30))
        .await;
    assert_eq!(q.state, flotilla_core::job::JobState::Succeeded);
    assert_eq!(q.agent.as_deref(), Some("busy"));
    println!(
        "cancel → final and a new job done in {:.1} s",
        cancelled_at.elapsed().as_secs_f64()
    );
    let final_dir = server
        .dir
        .join("store")
        .join(DATASET)
        .join(YEAR.to_string())
        .join(tile);
    assert!(!final_dir.exists(), "a cancelled tile left output behind");
}
