//! llmrt: an LLM inference runtime with a C ABI.
//!
//! Layers (see docs/ARCHITECTURE.md): `ffi` (the C boundary) over the safe core
//! (`Model`, caches, steps) over `model` (what a model is), `format` (where it
//! comes from), `quant` (tensor types), `kv` (paged KV bookkeeping) and
//! `backend` (the compute seam: `backend::cpu`, and `backend::cuda` for devices).

pub mod backend;
pub mod error;
pub mod format;
pub mod quant;

pub use error::{Error, Result, Status};
