#![no_main]
//! See fuzz/src/harness.rs: `sentencepiece_model`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = llmrt_fuzz::harness::sentencepiece_model(data);
});
