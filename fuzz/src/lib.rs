//! Shared code of llmrt's fuzz targets: the harness bodies (also replayed by the
//! main crate's `tests/fuzz_regressions.rs`), the tiny model, the structured edits.
pub mod harness;
pub mod structured;
pub mod tiny;
