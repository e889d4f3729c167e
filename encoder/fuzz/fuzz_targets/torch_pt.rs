//! Any bytes read as an upstream `.pt` checkpoint (zip, pickle, storages) give a checkpoint or an error: never a panic, never an allocation past the caps.
#![no_main]

use std::io::Cursor;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tessera_encoder::checkpoint::{inspect_reader, Checkpoint};

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.pt");
    if inspect_reader(&mut Cursor::new(data), path).is_ok() {
        let _ = Checkpoint::from_reader(&mut Cursor::new(data), path);
    }
});
