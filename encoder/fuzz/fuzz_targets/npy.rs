//! Any bytes given to the `.npy` reader give an array or an error, never a panic or an allocation past the bytes given.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = tessera_encoder::npy::parse(data) {
        assert!(a.data.len() <= data.len());
        let _ = a.to_i64();
    }
});
