//! Any bytes thrown at the opam file parser give a value or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(src) = std::str::from_utf8(data) {
        let _ = opam_revdeps::parser::parse_file(src);
        let _ = opam_revdeps::package::OpamData::parse("fuzz/opam", src);
    }
});
