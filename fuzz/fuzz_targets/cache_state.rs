#![no_main]
//! See fuzz/src/harness.rs: `cache_state` (a mode byte, then a saved cache state
//! loaded into the tiny model).
//!
//! With LLMRT_FUZZ_DUMP=<dir> set, the seeds (`harness::state_seeds`, valid states of
//! the tiny model) are written there once: `python3 fuzz/make_corpus.py --dump`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static DUMP: std::sync::Once = std::sync::Once::new();
    DUMP.call_once(|| {
        if let Some(dir) = std::env::var_os("LLMRT_FUZZ_DUMP") {
            let dir = std::path::PathBuf::from(dir);
            std::fs::create_dir_all(&dir).expect("LLMRT_FUZZ_DUMP");
            for (name, bytes) in llmrt_fuzz::harness::state_seeds() {
                std::fs::write(dir.join(name), bytes).expect("LLMRT_FUZZ_DUMP");
            }
        }
    });
    let _ = llmrt_fuzz::harness::cache_state(data);
});
