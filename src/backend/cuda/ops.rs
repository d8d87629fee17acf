//! Device-level launchers for the CUDA runner: every op of the forward pass on
//! buffers that already live on the device (no uploads, no downloads, no
//! synchronisation). Each launcher checks its sizes against the buffers it is
//! given, launches on the stream it was made with, and maps launch errors to
//! `LLMRT_DEVICE`. Kernel faults surface at the runner's next synchronisation.
//!
//! Buffers may be larger than an op needs (the runner reuses scratch buffers);
//! an op touches only the prefix its sizes describe.
//!
//! INTERFACE CONTRACT between the kernels (kernels/*.cu + this file) and the
//! runner (runner.rs). Signatures are fixed; bodies are filled by the kernels work.

#![allow(unused_variables, clippy::too_many_arguments)]

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use half::f16;

use super::KernelSource;
use crate::kv::BLOCK_POSITIONS;
use crate::quant::DType;
use crate::Result;

/// A weight matrix resident on the device in its stored type: `rows` rows of
/// `cols` elements, each row `dtype.row_bytes(cols)` bytes (ggml block layout for
/// Q8_0/Q4_0; little-endian F32/F16/BF16), rows contiguous.
pub struct DevWeight {
    pub name: String,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub data: CudaSlice<u8>,
}

/// Head layout of attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// The paged KV pool on the device, f16. Block `b` holds `BLOCK_POSITIONS`
/// positions of every layer, laid out `[layer][K=0|V=1][slot][kv_dim]`, at element
/// offset `b * block_elems()`. Position `p` of a cache with block table `bt` lives
/// in block `bt[p / 16]`, slot `p % 16`; a "slot id" is `block * 16 + slot`.
pub struct KvPool {
    pub data: CudaSlice<f16>,
    pub n_blocks: usize,
    pub n_layers: usize,
    pub kv_dim: usize,
}

impl KvPool {
    /// Elements of one block.
    pub fn block_elems(&self) -> usize {
        self.n_layers * 2 * BLOCK_POSITIONS * self.kv_dim
    }

    /// Allocates `n_blocks` blocks on `stream` (`LLMRT_OUT_OF_MEMORY` with the sizes on failure).
    pub fn new(stream: &Arc<CudaStream>, n_blocks: usize, n_layers: usize, kv_dim: usize) -> Result<KvPool> {
        todo!()
    }
}

/// Which matrix-product path [`Ops::matmul`] may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulPath {
    /// Always the GEMV kernels (decode: every output's reduction order is fixed, so a
    /// sequence's result does not depend on the batch it is in).
    Gemv,
    /// cuBLAS when `n_tokens` is large enough to pay (prefill); GEMV otherwise.
    Auto,
}

/// Every kernel of kernels/*.cu loaded on one context, plus cuBLAS and the
/// scratch it needs.
pub struct Ops {
    // filled by the kernels work
}

impl Ops {
    /// Loads every kernel module on `ctx` for a device of compute capability `sm`
    /// (embedded PTX when one fits and the driver takes it, else NVRTC) and creates
    /// a cuBLAS handle on `stream`.
    pub fn new(ctx: &Arc<CudaContext>, stream: Arc<CudaStream>, sm: u32) -> Result<Ops> {
        todo!()
    }

    /// Where the kernels came from.
    pub fn source(&self) -> &KernelSource {
        todo!()
    }

    /// The stream every op launches on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        todo!()
    }

    /// `out[t][:] = row ids[t] of table`, dequantized to f32, for `t < n`.
    /// `table`: `[vocab][hidden]` of any supported type. Ids are trusted (checked on the host).
    pub fn embed(&self, table: &DevWeight, ids: &CudaSlice<u32>, n: usize, out: &mut CudaSlice<f32>) -> Result<()> {
        todo!()
    }

    /// `y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w` for `r < rows`, rows of `n`.
    pub fn rmsnorm(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        rows: usize,
        n: usize,
        eps: f32,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        todo!()
    }

    /// [`Self::rmsnorm`] in place (per-head Q/K norm: `rows = tokens * heads`, `n = head_dim`).
    pub fn rmsnorm_inplace(&self, x: &mut CudaSlice<f32>, w: &CudaSlice<f32>, rows: usize, n: usize, eps: f32) -> Result<()> {
        todo!()
    }

    /// `y[t][r] = dot(W[r], x[t])` for `t < n_tokens`, `r < w.rows`: x is
    /// `[n_tokens][w.cols]`, y is `[n_tokens][w.rows]`, f32.
    pub fn matmul(
        &self,
        w: &DevWeight,
        x: &CudaSlice<f32>,
        n_tokens: usize,
        y: &mut CudaSlice<f32>,
        path: MatmulPath,
    ) -> Result<()> {
        todo!()
    }

    /// `x[r][i] += b[i]` for `r < rows`, `i < n`.
    pub fn add_bias(&self, x: &mut CudaSlice<f32>, b: &CudaSlice<f32>, rows: usize, n: usize) -> Result<()> {
        todo!()
    }

    /// `x[i] += y[i]` for `i < n`.
    pub fn add(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>, n: usize) -> Result<()> {
        todo!()
    }

    /// `g[i] = silu(g[i]) * u[i]` for `i < n`.
    pub fn swiglu(&self, g: &mut CudaSlice<f32>, u: &CudaSlice<f32>, n: usize) -> Result<()> {
        todo!()
    }

    /// RoPE on `q` (`[n_tokens][n_heads * head_dim]`) and `k` (`[n_tokens][n_kv_heads *
    /// head_dim]`) in place, with `cos`/`sin` (`[n_tokens][head_dim / 2]`, computed on the
    /// host), pairs (i, i + hd/2) when `neox` else (2i, 2i+1); then K (rotated) and V
    /// (`[n_tokens][n_kv_heads * head_dim]`) of token t are stored as f16 into `kv` at
    /// layer `layer`, slot id `slots[t]`.
    pub fn rope_kv_write(
        &self,
        q: &mut CudaSlice<f32>,
        k: &mut CudaSlice<f32>,
        v: &CudaSlice<f32>,
        cos: &CudaSlice<f32>,
        sin: &CudaSlice<f32>,
        slots: &CudaSlice<u32>,
        n_tokens: usize,
        shape: AttnShape,
        neox: bool,
        kv: &mut KvPool,
        layer: usize,
    ) -> Result<()> {
        todo!()
    }

    /// Causal attention over the pages: for token t of sequence `seq[t]` at position
    /// `pos[t]`, each query head h attends over positions `0..=pos[t]` of KV head
    /// `h / (n_heads / n_kv_heads)` in layer `layer`, reading position p from block
    /// `block_tables[seq[t] * max_blocks + p / 16]`, slot `p % 16`; scale
    /// `1 / sqrt(head_dim)`, softmax in f32. `q`, `out`: `[n_tokens][n_heads * head_dim]`.
    pub fn attention(
        &self,
        q: &CudaSlice<f32>,
        kv: &KvPool,
        layer: usize,
        seq: &CudaSlice<u32>,
        pos: &CudaSlice<u32>,
        block_tables: &CudaSlice<u32>,
        max_blocks: usize,
        n_tokens: usize,
        shape: AttnShape,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        todo!()
    }

    /// `out[i][:] = x[idx[i]][:]` for `i < n_idx`, rows of `width`.
    pub fn gather_rows(
        &self,
        x: &CudaSlice<f32>,
        idx: &CudaSlice<u32>,
        n_idx: usize,
        width: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        todo!()
    }

    /// `out[r]` = index of the largest value of row r of `logits` (`[rows][vocab]`),
    /// the first one on ties (as the CPU backend), for `r < rows`.
    pub fn argmax(&self, logits: &CudaSlice<f32>, rows: usize, vocab: usize, out: &mut CudaSlice<u32>) -> Result<()> {
        todo!()
    }

    /// Copies block `src` of `kv` onto block `dst` (every layer, K and V).
    pub fn copy_block(&self, kv: &mut KvPool, src: u32, dst: u32) -> Result<()> {
        todo!()
    }
}
