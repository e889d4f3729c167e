//! The onednn backend on oneDNN 3.x (opened at run time, `onednn::v3`)
//! against the upstream fixtures, f32, as `fixtures.rs` checks 2.x.
//!
//! Needs a `libdnnl.so.3` named by `FLOTILLA_ONEDNN3_TEST` (set by
//! `scripts/test.sh`, with `FLOTILLA_REQUIRE_ONEDNN3`, which makes its
//! absence a failure); this binary alone hands it to the backend as
//! `FLOTILLA_ONEDNN3`, so the rest of the suite keeps the linked 2.x.
#![cfg(all(feature = "onednn", target_os = "linux"))]

use std::path::Path;
use std::sync::atomic::AtomicBool;

use tessera_encoder::backend::isa;
use tessera_encoder::{golden, BackendChoice, DeviceProfile, Dtype, Encoder, TileInputs};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/encoder");

/// Whether oneDNN 3.x is in use in this process (after pointing the backend at it).
fn on_3x() -> bool {
    static SETUP: std::sync::Once = std::sync::Once::new();
    SETUP.call_once(|| {
        if let Some(p) = std::env::var_os("FLOTILLA_ONEDNN3_TEST") {
            std::env::set_var("FLOTILLA_ONEDNN3", p);
        }
    });
    let what = isa(BackendChoice::Onednn);
    if what.starts_with("oneDNN 3.") {
        return true;
    }
    assert!(
        std::env::var_os("FLOTILLA_REQUIRE_ONEDNN3").is_none(),
        "FLOTILLA_REQUIRE_ONEDNN3 is set but the onednn backend runs {what}"
    );
    eprintln!("no oneDNN 3.x here ({what}): skipped");
    false
}

/// Encode fixture `name` on the onednn backend in `dtype` and compare with upstream.
fn report(name: &str, dtype: Dtype) -> golden::GoldenReport {
    let dir = Path::new(FIXTURES).join(name);
    let tile = TileInputs::read(&dir.join("tile")).unwrap();
    let profile = DeviceProfile {
        threads: 2,
        chunk_pixels: 16,
        block_pixels: 4,
        dtype,
        ..DeviceProfile::default_for(BackendChoice::Onednn)
    };
    let enc = Encoder::load(
        &dir.join("ckpt.safetensors"),
        BackendChoice::Onednn,
        profile,
    )
    .unwrap();
    let emb = enc
        .encode_tile(&tile, &|_, _| {}, &AtomicBool::new(false))
        .unwrap();
    let r = golden::compare(&dir, &emb).unwrap_or_else(|e| panic!("{name} on oneDNN 3.x: {e}"));
    eprintln!("{name} {dtype:?} on oneDNN 3.x: {r:?}");
    r
}

#[test]
fn fixtures_match_upstream_on_onednn_3() {
    if !on_3x() {
        return;
    }
    eprintln!("{}", isa(BackendChoice::Onednn));
    for name in ["small", "long"] {
        report(name, Dtype::F32)
            .meets_thresholds()
            .unwrap_or_else(|e| panic!("{name} on oneDNN 3.x: {e}"));
    }
}

/// bf16 on oneDNN 3.x where it has AMX or AVX512-BF16 here: issue 16's
/// fidelity rule (worst cosine >= 0.9999 against upstream f32).
#[test]
fn bf16_on_onednn_3_meets_the_fidelity_rule_where_it_runs() {
    if !on_3x() {
        return;
    }
    if !tessera_encoder::backend::onednn::bf16_supported() {
        eprintln!("{}: no bf16 here, skipped", isa(BackendChoice::Onednn));
        return;
    }
    for name in ["small", "long"] {
        let r = report(name, Dtype::Bf16);
        assert!(r.worst_cosine >= 0.9999, "{name}: {r:?}");
    }
}
