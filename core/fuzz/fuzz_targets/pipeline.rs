//! Any UTF-8 thrown at the pipeline loader gives a spec or errors, never a
//! panic; a spec it gives makes a plan, and errors print.
#![no_main]

use flotilla_core::pipeline::{load, Plan};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        match load("fuzz.pipeline", text) {
            Ok(spec) => {
                let _ = Plan::new(&spec);
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
});
