//! llmrt: an LLM inference runtime with a C ABI.
//!
//! Layers (see docs/ARCHITECTURE.md): `ffi` (the C boundary) over the safe core
//! (`runtime`: `Model`, caches, steps) over `model` (what a model is), `format`
//! (where it comes from), `quant` (tensor types), `kv` (paged KV bookkeeping) and
//! `backend` (the compute seam: `backend::cpu`, and `backend::cuda` for devices).

/// The compute seam. Public only for the CUDA kernel test binaries and
/// `llmrt-bench` (device launchers); not a stable API.
#[doc(hidden)]
pub mod abort;
pub mod backend;
pub mod chat;
pub mod error;
pub mod ffi;
pub mod format;
pub mod generate;
pub mod grammar;
pub mod kv;
pub mod model;
pub mod perplexity;
pub mod quant;
pub mod runtime;
pub mod sample;
pub mod tokenizer;
pub mod util;

pub use error::{Error, Result, Status};

/// What `llmrt-bench` measures the CPU with beyond the public API: the huge-page
/// host memory the CPU kernels stream weights from (for its bandwidth probe), and
/// which CPU kernel set runs. Not a stable API.
#[doc(hidden)]
pub mod bench {
    pub use crate::backend::cpu::groups::HostBuf;
    pub use crate::backend::cpu::peak::Peak;

    /// The CPU kernel set this process runs (`scalar`, `avx2`, `avx512-vnni`, `neon`).
    pub fn cpu_kernels() -> &'static str {
        crate::backend::cpu::simd::isa().name()
    }

    /// This thread's arithmetic ceilings with the kernel set this process runs over
    /// `iters` loop trips (see `backend::cpu::peak`); None where the kernel set has
    /// no probe.
    pub fn cpu_peak(iters: usize) -> Option<crate::backend::cpu::peak::Peak> {
        crate::backend::cpu::peak::peak(crate::backend::cpu::simd::isa(), iters)
    }
}
pub use runtime::{BackendKind, LoadOptions, Model, ModelInfo, Pooling};
