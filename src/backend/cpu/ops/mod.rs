//! The ops the forward pass calls, one file per op family, each named as its CUDA
//! twin (`backend/cuda/ops/<op>.rs`, `kernels/<op>.cu`) and tested in its own file
//! (tests named `<op>_*`): `embed`, `norm`, `matmul`, `rope`, `attention`,
//! `elementwise`. Reductions have a fixed order that depends only on the operand
//! lengths, never on the batch or the thread count, so a sequence's results are
//! the same alone or batched. The CPU ops are the reference the CUDA ops are
//! tested against.
//!
//! Depends on the kernels below it (`isa`, `simd`, `qpack`, `fpack`), on `pool`
//! and on `crate::quant`; `forward` (the step) is their only caller in the backend.

pub(crate) mod attention;
pub(crate) mod elementwise;
pub(crate) mod embed;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod rope;

// The old path of the RoPE rotation, still used by `backend/cuda/reference.rs`.
pub(crate) use rope::rope;
