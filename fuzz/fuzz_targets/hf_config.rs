#![no_main]
//! See fuzz/src/harness.rs: `hf_config`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = llmrt_fuzz::harness::hf_config(data);
});
