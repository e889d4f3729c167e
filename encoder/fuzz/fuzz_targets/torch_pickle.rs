//! Any bytes given as a `.pt`'s `data.pkl` give a tensor table or an error, never a panic. (The zip's CRC keeps `torch_pt` from mutating the pickle much; this reaches it directly.)
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tessera_encoder::checkpoint::torch::tensor_table(data);
});
