#![no_main]
//! See fuzz/src/harness.rs: `tokenizer_json`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = llmrt_fuzz::harness::tokenizer_json(data);
});
