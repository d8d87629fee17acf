//! llmrt: an LLM inference runtime with a C ABI.
//!
//! Layers (see docs/ARCHITECTURE.md): `ffi` (the C boundary) over the safe core
//! (`runtime`: `Model`, caches, steps) over `model` (what a model is), `format`
//! (where it comes from), `quant` (tensor types), `kv` (paged KV bookkeeping) and
//! `backend` (the compute seam: `backend::cpu`, and `backend::cuda` for devices).

pub mod backend;
pub mod error;
pub mod ffi;
pub mod format;
pub mod kv;
pub mod model;
pub mod quant;
pub mod runtime;
pub mod sample;
pub mod tokenizer;
pub mod util;

pub use error::{Error, Result, Status};
pub use runtime::{BackendKind, LoadOptions, Model, ModelInfo};
