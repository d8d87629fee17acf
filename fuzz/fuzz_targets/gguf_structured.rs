#![no_main]
//! Structure-aware: a valid tiny model (fuzz/src/tiny.rs) with structured edits
//! (fuzz/src/structured.rs), loaded through the full Model path from memory and,
//! when it loads, stepped (fuzz/src/harness.rs `model`).
//!
//! With LLMRT_FUZZ_DUMP=<file> set, the edited GGUF is written there first: run
//! the target binary on a crash input to get the GGUF for tests/fuzz_regressions/.
use libfuzzer_sys::fuzz_target;
use llmrt_fuzz::structured::Plan;

fuzz_target!(|plan: Plan| {
    let bytes = plan.bytes();
    if let Some(p) = std::env::var_os("LLMRT_FUZZ_DUMP") {
        std::fs::write(p, &bytes).expect("LLMRT_FUZZ_DUMP");
    }
    let _ = llmrt_fuzz::harness::model(bytes);
});
