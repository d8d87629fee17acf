#![no_main]
//! See fuzz/src/harness.rs: `chat_template` (arbitrary template source rendered
//! over fixed messages by src/chat/template.rs).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = llmrt_fuzz::harness::chat_template(data);
});
