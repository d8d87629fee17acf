#![no_main]
//! See fuzz/src/harness.rs: `tokenizer_gguf`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = llmrt_fuzz::harness::tokenizer_gguf(data);
});
