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

#![allow(clippy::too_many_arguments)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublas::{self, CudaBlas};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig,
    PushKernelArg,
};
use half::f16;

use super::device::{driver_err, driver_msg, guarded};
use super::kernels::load_modules;
use super::KernelSource;
use crate::error::Error;
use crate::kv::BLOCK_POSITIONS;
use crate::quant::DType;
use crate::Result;

/// [`MatmulPath::Auto`] takes cuBLAS when `n_tokens` is larger than this (and cuBLAS
/// loaded); GEMV otherwise. Equal to the GEMV kernels' batch tile (8 vectors per weight read).
/// cbindgen:ignore
pub const GEMM_MIN_TOKENS: usize = 8;

/// Largest head_dim [`Ops::attention`] takes (`ATT_MAX_HD` in kernels/attention.cu).
/// cbindgen:ignore
pub const ATTENTION_MAX_HEAD_DIM: usize = 256;

/// Threads per block of the GEMV kernels: one warp per weight row, four rows a block.
const GEMV_THREADS: u32 = 128;
/// Threads per block of attention_f32 (`ATT_THREADS` in kernels/attention.cu; fixed).
const ATT_THREADS: u32 = 128;
/// Threads per block of the element-wise kernels and row kernels.
const EW_THREADS: u32 = 256;

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
        let elems = n_layers
            .checked_mul(2 * BLOCK_POSITIONS)
            .and_then(|v| v.checked_mul(kv_dim))
            .and_then(|v| v.checked_mul(n_blocks))
            .ok_or_else(|| {
                Error::out_of_memory(format!(
                    "KV pool: {n_blocks} blocks x {n_layers} layers x 2 x {BLOCK_POSITIONS} x {kv_dim} f16 overflows"
                ))
            })?;
        if elems == 0 {
            return Err(Error::invalid(format!(
                "KV pool: {n_blocks} blocks x {n_layers} layers x kv_dim {kv_dim} is empty"
            )));
        }
        let data = stream.alloc_zeros::<f16>(elems).map_err(|e| {
            Error::out_of_memory(format!(
                "KV pool: allocating {n_blocks} blocks x {n_layers} layers x 2 x {BLOCK_POSITIONS} x {kv_dim} f16 \
                 = {} bytes on the device failed: {}",
                elems * 2,
                driver_msg("cuMemAlloc", e)
            ))
        })?;
        Ok(KvPool { data, n_blocks, n_layers, kv_dim })
    }

    /// Checks that `data` holds `n_blocks` blocks and returns `block_elems()`.
    fn checked_block_elems(&self, what: &str) -> Result<usize> {
        let be = self
            .n_layers
            .checked_mul(2 * BLOCK_POSITIONS)
            .and_then(|v| v.checked_mul(self.kv_dim))
            .ok_or_else(|| Error::invalid(format!("{what}: KV block size overflows")))?;
        let total = be
            .checked_mul(self.n_blocks)
            .ok_or_else(|| Error::invalid(format!("{what}: KV pool size overflows")))?;
        if self.data.len() < total {
            return Err(Error::internal(format!(
                "{what}: KV pool holds {} f16, {} blocks x {be} need {total}",
                self.data.len(),
                self.n_blocks
            )));
        }
        Ok(be)
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

/// The fast paths of the CUDA runner, each with an environment switch so that one GPU
/// session can tell which part is broken: `LLMRT_CUDA_FAST=0` turns all of them off;
/// `LLMRT_CUDA_<NAME>=0` (or `=1`) turns one off (or on) whatever `LLMRT_CUDA_FAST` says.
/// Read once, when [`Ops`] is made; tests flip them with [`Ops::set_fast_paths`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastPaths {
    /// `LLMRT_CUDA_GEMV`: the fast GEMV kernels (more 16-byte loads in flight; quantized
    /// rows staged through shared memory) where the shape allows.
    pub gemv: bool,
    /// `LLMRT_CUDA_FUSED`: the residual add fused with the next RMSNorm.
    pub fused: bool,
    /// `LLMRT_CUDA_SPLITKV`: split-KV (flash-decoding) attention for decode steps.
    pub splitkv: bool,
    /// `LLMRT_CUDA_DECODE_GEMM`: decode steps of more than [`GEMM_MIN_TOKENS`] sequences
    /// take cuBLAS (weights read once for the batch, tensor cores) instead of the GEMV
    /// kernels; their logits then agree with single-sequence decodes to about 1e-3
    /// relative (activations rounded to f16/bf16), not bit for bit.
    pub decode_gemm: bool,
    /// `LLMRT_CUDA_PREFILL_ATTN`: tiled (flash-style) causal attention for prefill steps.
    pub prefill_attn: bool,
}

impl FastPaths {
    /// Every fast path on (`on`) or off.
    pub fn all(on: bool) -> FastPaths {
        FastPaths { gemv: on, fused: on, splitkv: on, decode_gemm: on, prefill_attn: on }
    }

    /// From the environment (see the type's doc).
    pub fn from_env() -> FastPaths {
        let flag = |name: &str| match std::env::var(name).ok().as_deref().map(str::trim) {
            Some("0") | Some("off") | Some("false") => Some(false),
            Some("1") | Some("on") | Some("true") => Some(true),
            _ => None,
        };
        let base = flag("LLMRT_CUDA_FAST").unwrap_or(true);
        FastPaths {
            gemv: flag("LLMRT_CUDA_GEMV").unwrap_or(base),
            fused: flag("LLMRT_CUDA_FUSED").unwrap_or(base),
            splitkv: flag("LLMRT_CUDA_SPLITKV").unwrap_or(base),
            decode_gemm: flag("LLMRT_CUDA_DECODE_GEMM").unwrap_or(base),
            prefill_attn: flag("LLMRT_CUDA_PREFILL_ATTN").unwrap_or(base),
        }
    }
}

/// Most query heads per KV head [`Ops::attention_split`] takes (`SPLIT_MAX_G`).
/// cbindgen:ignore
pub const SPLIT_MAX_GROUP: usize = 8;
/// Longest split of [`Ops::attention_split`] (`SPLIT_MAX_LEN`), positions.
/// cbindgen:ignore
pub const SPLIT_MAX_LEN: usize = 64;
/// The split length [`Ops::split_plan`] uses (fixed: batch invariance), positions.
/// cbindgen:ignore
pub const SPLIT_LEN: usize = 32;
/// Query tokens per tile of [`Ops::attention_prefill`] (`PF_BQ`).
/// cbindgen:ignore
pub const PREFILL_TILE: usize = 16;

/// Every kernel of kernels/*.cu loaded on one context, plus cuBLAS and the
/// scratch it needs.
pub struct Ops {
    stream: Arc<CudaStream>,
    source: KernelSource,
    k: Funcs,
    /// None when cuBLAS could not be loaded: every matmul takes the GEMV kernels.
    blas: Option<CudaBlas>,
    /// What matmul uses, in words (for [`Ops::describe`]).
    blas_note: String,
    /// Device scratch of the cuBLAS path, grown as needed, reused across calls (all
    /// work is ordered on `stream`, so reuse by the next call is safe).
    scratch: Mutex<Scratch>,
    /// Which fast paths are on.
    fast: FastPaths,
    _ctx: Arc<CudaContext>,
}

/// Scratch of the cuBLAS path: activations as f16/bf16 bits, and a quantized (or F32
/// in no case) weight dequantized to f16.
#[derive(Default)]
struct Scratch {
    act: Option<CudaSlice<u16>>,
    weight: Option<CudaSlice<f16>>,
}

/// Every kernel entry point of kernels/*.cu.
struct Funcs {
    embed_f32: CudaFunction,
    embed_f16: CudaFunction,
    embed_bf16: CudaFunction,
    embed_q8_0: CudaFunction,
    embed_q4_0: CudaFunction,
    rmsnorm: CudaFunction,
    rmsnorm_inplace: CudaFunction,
    gemv_f32: CudaFunction,
    gemv_f16: CudaFunction,
    gemv_bf16: CudaFunction,
    gemv_q8_0: CudaFunction,
    gemv_q4_0: CudaFunction,
    gemv_fast_f16: CudaFunction,
    gemv_fast_bf16: CudaFunction,
    gemv_fast_q8_0: CudaFunction,
    gemv_fast_q4_0: CudaFunction,
    add_rmsnorm: CudaFunction,
    attention_split: CudaFunction,
    attention_merge: CudaFunction,
    attention_prefill: CudaFunction,
    /// gemv3_fast_<type> and gemv_swiglu_fast_<type> for F16, BF16, Q8_0, Q4_0.
    gemv3: [CudaFunction; 4],
    gemv_swiglu: [CudaFunction; 4],
    add_bias: CudaFunction,
    add: CudaFunction,
    swiglu: CudaFunction,
    gather_rows: CudaFunction,
    convert_f32_f16: CudaFunction,
    convert_f32_bf16: CudaFunction,
    dequant_f32_f16: CudaFunction,
    dequant_bf16_f16: CudaFunction,
    dequant_q8_0_f16: CudaFunction,
    dequant_q4_0_f16: CudaFunction,
    argmax: CudaFunction,
    rope_kv_write: CudaFunction,
    attention: CudaFunction,
}

impl Funcs {
    fn load(modules: &HashMap<&'static str, Arc<CudaModule>>) -> Result<Funcs> {
        let f = |module: &str, name: &str| -> Result<CudaFunction> {
            let m = modules
                .get(module)
                .ok_or_else(|| Error::internal(format!("kernel module {module}.cu not embedded")))?;
            m.load_function(name).map_err(|e| driver_err(&format!("cuModuleGetFunction({name})"), e))
        };
        Ok(Funcs {
            embed_f32: f("embed", "embed_f32_f32")?,
            embed_f16: f("embed", "embed_f16_f32")?,
            embed_bf16: f("embed", "embed_bf16_f32")?,
            embed_q8_0: f("embed", "embed_q8_0_f32")?,
            embed_q4_0: f("embed", "embed_q4_0_f32")?,
            rmsnorm: f("norm", "rmsnorm_f32")?,
            rmsnorm_inplace: f("norm", "rmsnorm_inplace_f32")?,
            gemv_f32: f("gemv", "gemv_f32_f32")?,
            gemv_f16: f("gemv", "gemv_f16_f32")?,
            gemv_bf16: f("gemv", "gemv_bf16_f32")?,
            gemv_q8_0: f("gemv", "gemv_q8_0_f32")?,
            gemv_q4_0: f("gemv", "gemv_q4_0_f32")?,
            gemv_fast_f16: f("gemv", "gemv_fast_f16_f32")?,
            gemv_fast_bf16: f("gemv", "gemv_fast_bf16_f32")?,
            gemv_fast_q8_0: f("gemv", "gemv_fast_q8_0_f32")?,
            gemv_fast_q4_0: f("gemv", "gemv_fast_q4_0_f32")?,
            add_rmsnorm: f("norm", "add_rmsnorm_f32")?,
            attention_split: f("attention", "attention_split_f32")?,
            attention_merge: f("attention", "attention_merge_f32")?,
            attention_prefill: f("attention", "attention_prefill_f32")?,
            gemv3: [
                f("gemv", "gemv3_fast_f16_f32")?,
                f("gemv", "gemv3_fast_bf16_f32")?,
                f("gemv", "gemv3_fast_q8_0_f32")?,
                f("gemv", "gemv3_fast_q4_0_f32")?,
            ],
            gemv_swiglu: [
                f("gemv", "gemv_swiglu_fast_f16_f32")?,
                f("gemv", "gemv_swiglu_fast_bf16_f32")?,
                f("gemv", "gemv_swiglu_fast_q8_0_f32")?,
                f("gemv", "gemv_swiglu_fast_q4_0_f32")?,
            ],
            add_bias: f("elementwise", "add_bias_f32")?,
            add: f("elementwise", "add_f32")?,
            swiglu: f("elementwise", "swiglu_f32")?,
            gather_rows: f("elementwise", "gather_rows_f32")?,
            convert_f32_f16: f("elementwise", "convert_f32_f16")?,
            convert_f32_bf16: f("elementwise", "convert_f32_bf16")?,
            dequant_f32_f16: f("elementwise", "dequant_f32_f16")?,
            dequant_bf16_f16: f("elementwise", "dequant_bf16_f16")?,
            dequant_q8_0_f16: f("elementwise", "dequant_q8_0_f16")?,
            dequant_q4_0_f16: f("elementwise", "dequant_q4_0_f16")?,
            argmax: f("elementwise", "argmax_f32")?,
            rope_kv_write: f("rope", "rope_kv_write_f32")?,
            attention: f("attention", "attention_f32")?,
        })
    }
}


impl Ops {
    /// Loads every kernel module on `ctx` for a device of compute capability `sm`
    /// (embedded PTX when one fits and the driver takes it, else NVRTC) and creates
    /// a cuBLAS handle on `stream`.
    ///
    /// cuBLAS is optional: when its library is missing or its handle cannot be made,
    /// `new` still succeeds, every matmul takes the GEMV kernels, and
    /// [`Ops::describe`] says why.
    pub fn new(ctx: &Arc<CudaContext>, stream: Arc<CudaStream>, sm: u32) -> Result<Ops> {
        let (source, k) = guarded("loading CUDA kernels", || {
            let (modules, source) = load_modules(ctx, sm, false)?;
            Ok((source, Funcs::load(&modules)?))
        })?;
        let (blas, blas_note) = create_blas(&stream);
        Ok(Ops {
            stream,
            source,
            k,
            blas,
            blas_note,
            scratch: Mutex::new(Scratch::default()),
            fast: FastPaths::from_env(),
            _ctx: ctx.clone(),
        })
    }

    /// Which fast paths are on.
    pub fn fast_paths(&self) -> FastPaths {
        self.fast
    }

    /// Turns fast paths on or off (tests compare both paths in one process).
    pub fn set_fast_paths(&mut self, fast: FastPaths) {
        self.fast = fast;
    }

    /// Where the kernels came from.
    pub fn source(&self) -> &KernelSource {
        &self.source
    }

    /// The stream every op launches on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// One line: where the kernels came from and which matmul paths are available
    /// (cuBLAS, or GEMV only and why).
    pub fn describe(&self) -> String {
        format!("kernels: {}; matmul: {}; fast paths: {:?}", self.source, self.blas_note, self.fast)
    }

    /// Whether cuBLAS loaded (else [`MatmulPath::Auto`] always takes GEMV).
    pub fn has_cublas(&self) -> bool {
        self.blas.is_some()
    }

    /// Grows the cuBLAS path's scratch now (e.g. before capturing a CUDA graph):
    /// `act_elems` activations (`n_tokens * cols` of the largest matmul) and
    /// `weight_elems` dequantized weight elements (`rows * cols` of the largest
    /// quantized or F32-to-F16 weight taken by cuBLAS). No-op without cuBLAS.
    pub fn reserve_scratch(&self, act_elems: usize, weight_elems: usize) -> Result<()> {
        if self.blas.is_none() {
            return Ok(());
        }
        let mut sc = self.scratch.lock().map_err(|_| Error::internal("Ops scratch mutex poisoned"))?;
        grow(&self.stream, &mut sc.act, act_elems, "activation scratch")?;
        grow(&self.stream, &mut sc.weight, weight_elems, "weight scratch")?;
        Ok(())
    }

    /// Bytes of the cuBLAS path's scratch now allocated.
    pub fn scratch_bytes(&self) -> u64 {
        match self.scratch.lock() {
            Ok(sc) => {
                (sc.act.as_ref().map_or(0, |a| a.len() * 2) + sc.weight.as_ref().map_or(0, |w| w.len() * 2)) as u64
            }
            Err(_) => 0,
        }
    }

    /// `out[t][:] = row ids[t] of table`, dequantized to f32, for `t < n`.
    /// `table`: `[vocab][hidden]` of any supported type. Ids are trusted (checked on the host).
    ///
    /// (An id >= `table.rows` gives a NaN row on the device, never an out-of-bounds read.)
    pub fn embed(&self, table: &DevWeight, ids: &CudaSlice<u32>, n: usize, out: &mut CudaSlice<f32>) -> Result<()> {
        const OP: &str = "embed";
        check_weight(OP, table)?;
        let (vocab, hidden) = (table.rows, table.cols);
        need(OP, "ids", ids.len(), n)?;
        need(OP, "out", out.len(), mul(OP, n, hidden)?)?;
        let (n_i, hidden_i, vocab_i) = (to_i32(OP, "n", n)?, to_i32(OP, "hidden", hidden)?, to_i32(OP, "vocab", vocab)?);
        if n == 0 || hidden == 0 {
            return Ok(());
        }
        let f = match table.dtype {
            DType::F32 => &self.k.embed_f32,
            DType::F16 => &self.k.embed_f16,
            DType::BF16 => &self.k.embed_bf16,
            DType::Q8_0 => &self.k.embed_q8_0,
            DType::Q4_0 => &self.k.embed_q4_0,
        };
        let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (EW_THREADS, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(f);
        b.arg(&table.data).arg(ids).arg(out).arg(&n_i).arg(&hidden_i).arg(&vocab_i);
        // SAFETY: the arguments match embed_<type>_f32 in kernels/embed.cu (table, ids, out
        // pointers, then int n, hidden, vocab); check_weight verified the table holds
        // vocab rows of row_bytes(hidden) bytes (hidden % 32 == 0 for Q8_0/Q4_0), ids
        // holds >= n ids and out >= n*hidden f32; ids >= vocab are caught in the kernel;
        // the grid has one block per id.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
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
        const OP: &str = "rmsnorm";
        let (cfg, rows_i, n_i) = match rmsnorm_launch(OP, rows, n)? {
            Some(v) => v,
            None => return Ok(()),
        };
        need(OP, "x", x.len(), mul(OP, rows, n)?)?;
        need(OP, "y", y.len(), rows * n)?;
        need(OP, "w", w.len(), n)?;
        let mut b = self.stream.launch_builder(&self.k.rmsnorm);
        b.arg(x).arg(w).arg(y).arg(&rows_i).arg(&n_i).arg(&eps);
        // SAFETY: the arguments match rmsnorm_f32 in kernels/norm.cu (x, w, y pointers, then
        // int rows, int n, float eps); x and y hold >= rows*n f32 and w >= n, checked above;
        // x and y are distinct buffers (Rust borrows); one block per row, block size a
        // multiple of 32 in 32..=1024 as the kernel requires.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// [`Self::rmsnorm`] in place (per-head Q/K norm: `rows = tokens * heads`, `n = head_dim`).
    pub fn rmsnorm_inplace(&self, x: &mut CudaSlice<f32>, w: &CudaSlice<f32>, rows: usize, n: usize, eps: f32) -> Result<()> {
        const OP: &str = "rmsnorm_inplace";
        let (cfg, rows_i, n_i) = match rmsnorm_launch(OP, rows, n)? {
            Some(v) => v,
            None => return Ok(()),
        };
        need(OP, "x", x.len(), mul(OP, rows, n)?)?;
        need(OP, "w", w.len(), n)?;
        let mut b = self.stream.launch_builder(&self.k.rmsnorm_inplace);
        b.arg(x).arg(w).arg(&rows_i).arg(&n_i).arg(&eps);
        // SAFETY: the arguments match rmsnorm_inplace_f32 in kernels/norm.cu (x, w pointers,
        // then int rows, int n, float eps); x holds >= rows*n f32 and w >= n, checked above;
        // one block per row, block size a multiple of 32 in 32..=1024.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// The residual add fused with the next norm: `x[r] += d[r]`, then
    /// `y[r] = rmsnorm(x[r]) * w` for `r < rows`, rows of `n`. Bit-identical to
    /// [`Self::add`] then [`Self::rmsnorm`].
    pub fn add_rmsnorm(
        &self,
        x: &mut CudaSlice<f32>,
        d: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        rows: usize,
        n: usize,
        eps: f32,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        const OP: &str = "add_rmsnorm";
        let (cfg, rows_i, n_i) = match rmsnorm_launch(OP, rows, n)? {
            Some(v) => v,
            None => return Ok(()),
        };
        let total = mul(OP, rows, n)?;
        need(OP, "x", x.len(), total)?;
        need(OP, "d", d.len(), total)?;
        need(OP, "y", y.len(), total)?;
        need(OP, "w", w.len(), n)?;
        let mut b = self.stream.launch_builder(&self.k.add_rmsnorm);
        b.arg(x).arg(d).arg(w).arg(y).arg(&rows_i).arg(&n_i).arg(&eps);
        // SAFETY: the arguments match add_rmsnorm_f32 in kernels/norm.cu (x, d, w, y pointers,
        // then int rows, int n, float eps); x, d and y hold >= rows*n f32 and w >= n, checked
        // above; x, d and y are distinct buffers (Rust borrows: x and y are &mut); one block
        // per row, block size a multiple of 32 in 32..=1024 as the kernel requires.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// `y[t][r] = dot(W[r], x[t])` for `t < n_tokens`, `r < w.rows`: x is
    /// `[n_tokens][w.cols]`, y is `[n_tokens][w.rows]`, f32.
    ///
    /// Paths: [`MatmulPath::Gemv`], or `Auto` with `n_tokens <= GEMM_MIN_TOKENS` or
    /// without cuBLAS: the GEMV kernels (f32 accumulation, fixed reduction order per
    /// output: batch-invariant bit for bit). `Auto` with more tokens: cuBLAS
    /// `cublasGemmEx` with f32 output and f32 compute (`CUBLAS_COMPUTE_32F`, no TF32):
    /// F32 weights with f32 activations (an SGEMM); F16 weights with the activations
    /// rounded to f16 in a scratch buffer; BF16 weights with the activations rounded to
    /// bf16; Q8_0/Q4_0 weights dequantized to f16 into a scratch buffer (every call) and
    /// multiplied like F16. The f16/bf16 paths therefore differ from GEMV by the rounding
    /// of the activations (about 1e-3 relative for f16, 4e-3 for bf16); activations
    /// beyond f16's range (65504) would overflow on the f16 path.
    pub fn matmul(
        &self,
        w: &DevWeight,
        x: &CudaSlice<f32>,
        n_tokens: usize,
        y: &mut CudaSlice<f32>,
        path: MatmulPath,
    ) -> Result<()> {
        const OP: &str = "matmul";
        check_weight(OP, w)?;
        let (rows, cols) = (w.rows, w.cols);
        let x_elems = mul(OP, n_tokens, cols)?;
        let y_elems = mul(OP, n_tokens, rows)?;
        need(OP, "x", x.len(), x_elems)?;
        need(OP, "y", y.len(), y_elems)?;
        let (rows_i, cols_i, n_i) =
            (to_i32(OP, "rows", rows)?, to_i32(OP, "cols", cols)?, to_i32(OP, "n_tokens", n_tokens)?);
        to_i32(OP, "n_tokens * cols", x_elems)?;
        to_i32(OP, "n_tokens * rows", y_elems)?;
        if n_tokens == 0 || rows == 0 {
            return Ok(());
        }
        if cols == 0 {
            let mut view = y.slice_mut(0..y_elems);
            return self.stream.memset_zeros(&mut view).map_err(|e| driver_err("matmul: cuMemsetD8Async(y)", e));
        }
        match &self.blas {
            Some(blas) if path == MatmulPath::Auto && n_tokens > GEMM_MIN_TOKENS => {
                self.gemm(blas, w, x, n_tokens, y, rows_i, cols_i, n_i)
            }
            _ => self.gemv(w, x, y, rows_i, cols_i, n_i),
        }
    }

    /// Index of the fused GEMV kernels for weights of `dtype` with `cols` columns, when
    /// the `gemv` and `fused` fast paths are on and the shape allows.
    fn fused_kind(&self, dtype: DType, cols: usize) -> Option<usize> {
        if !(self.fast.gemv && self.fast.fused) {
            return None;
        }
        match dtype {
            DType::F16 if cols.is_multiple_of(8) => Some(0),
            DType::BF16 if cols.is_multiple_of(8) => Some(1),
            DType::Q8_0 if cols.is_multiple_of(256) => Some(2),
            DType::Q4_0 if cols.is_multiple_of(256) => Some(3),
            _ => None,
        }
    }

    /// Three GEMV products of one `x` in one launch (Q, K, V of decode): `ys[s] =
    /// W_s x` as [`Self::matmul`] with [`MatmulPath::Gemv`] computes them, bit for bit.
    /// Returns `Ok(false)` without launching when the fused kernels do not apply (fast
    /// paths off, mixed types or column counts, a shape the fast kernels do not take);
    /// the caller then runs three [`Self::matmul`]s.
    pub fn matmul3(
        &self,
        w: [&DevWeight; 3],
        x: &CudaSlice<f32>,
        n_tokens: usize,
        ys: [&mut CudaSlice<f32>; 3],
    ) -> Result<bool> {
        const OP: &str = "matmul3";
        let cols = w[0].cols;
        if w.iter().any(|m| m.dtype != w[0].dtype || m.cols != cols) || n_tokens == 0 || cols == 0 {
            return Ok(false);
        }
        let Some(kind) = self.fused_kind(w[0].dtype, cols) else { return Ok(false) };
        let mut rows = [0i32; 3];
        for (i, m) in w.iter().enumerate() {
            check_weight(OP, m)?;
            need(OP, "y", ys[i].len(), mul(OP, n_tokens, m.rows)?)?;
            to_i32(OP, "n_tokens * rows", n_tokens * m.rows)?;
            rows[i] = to_i32(OP, "rows", m.rows)?;
        }
        let x_elems = mul(OP, n_tokens, cols)?;
        need(OP, "x", x.len(), x_elems)?;
        to_i32(OP, "n_tokens * cols", x_elems)?;
        let total = w.iter().map(|m| m.rows).sum::<usize>();
        let (cols_i, n_i) = (to_i32(OP, "cols", cols)?, to_i32(OP, "n_tokens", n_tokens)?);
        to_i32(OP, "rows", total)?;
        if total == 0 {
            return Ok(true);
        }
        let cfg = LaunchConfig {
            grid_dim: ((total as u32).div_ceil(GEMV_THREADS / 32), 1, 1),
            block_dim: (GEMV_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let [y0, y1, y2] = ys;
        let mut b = self.stream.launch_builder(&self.k.gemv3[kind]);
        b.arg(&w[0].data)
            .arg(&w[1].data)
            .arg(&w[2].data)
            .arg(x)
            .arg(y0)
            .arg(y1)
            .arg(y2)
            .arg(&rows[0])
            .arg(&rows[1])
            .arg(&rows[2])
            .arg(&cols_i)
            .arg(&n_i);
        // SAFETY: the arguments match gemv3_fast_<type>_f32 in kernels/gemv.cu (W0, W1, W2, x,
        // y0, y1, y2 pointers, then int r0, r1, r2, cols, batch); each W_s holds rows_s rows of
        // row_bytes(cols) (check_weight) of the one dtype the kernel reads, x >= n*cols f32,
        // y_s >= n*rows_s f32 (checked above), the y_s are distinct buffers (three &mut);
        // the fast kernels' shape condition holds (fused_kind); the grid covers the stacked
        // rows at 4 rows (warps) per block of 128 threads.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err("gemv3_fast", e))?;
        Ok(true)
    }

    /// Gate, up and SwiGLU of decode in one launch: `y = silu(W_gate x) * (W_up x)`,
    /// bit-identical to two [`Self::matmul`]s on the GEMV path and [`Self::swiglu`].
    /// `Ok(false)` without launching when the fused kernel does not apply (as
    /// [`Self::matmul3`]).
    pub fn matmul_swiglu(
        &self,
        w_gate: &DevWeight,
        w_up: &DevWeight,
        x: &CudaSlice<f32>,
        n_tokens: usize,
        y: &mut CudaSlice<f32>,
    ) -> Result<bool> {
        const OP: &str = "matmul_swiglu";
        let (rows, cols) = (w_gate.rows, w_gate.cols);
        if w_up.dtype != w_gate.dtype || w_up.cols != cols || w_up.rows != rows || n_tokens == 0 || cols == 0 {
            return Ok(false);
        }
        let Some(kind) = self.fused_kind(w_gate.dtype, cols) else { return Ok(false) };
        check_weight(OP, w_gate)?;
        check_weight(OP, w_up)?;
        let x_elems = mul(OP, n_tokens, cols)?;
        let y_elems = mul(OP, n_tokens, rows)?;
        need(OP, "x", x.len(), x_elems)?;
        need(OP, "y", y.len(), y_elems)?;
        let (rows_i, cols_i, n_i) =
            (to_i32(OP, "rows", rows)?, to_i32(OP, "cols", cols)?, to_i32(OP, "n_tokens", n_tokens)?);
        to_i32(OP, "n_tokens * cols", x_elems)?;
        to_i32(OP, "n_tokens * rows", y_elems)?;
        if rows == 0 {
            return Ok(true);
        }
        let cfg = LaunchConfig {
            grid_dim: ((rows as u32).div_ceil(GEMV_THREADS / 32), 1, 1),
            block_dim: (GEMV_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.k.gemv_swiglu[kind]);
        b.arg(&w_gate.data).arg(&w_up.data).arg(x).arg(y).arg(&rows_i).arg(&cols_i).arg(&n_i);
        // SAFETY: the arguments match gemv_swiglu_fast_<type>_f32 in kernels/gemv.cu (Wg, Wu,
        // x, y pointers, then int rows, cols, batch); both weights hold rows rows of
        // row_bytes(cols) of the dtype the kernel reads (check_weight, same dtype and shape),
        // x >= n*cols f32 and y >= n*rows f32 (checked above), y distinct from x (&mut); the
        // fast kernels' shape condition holds (fused_kind); grid ceil(rows/4), block 128.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err("gemv_swiglu_fast", e))?;
        Ok(true)
    }

    fn gemv(&self, w: &DevWeight, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: i32, cols: i32, n: i32) -> Result<()> {
        // The fast kernels' shape conditions: 16-byte chunks of 8 halves; quantized rows
        // starting 16-byte aligned (cols % 256 == 0: a multiple of 8 blocks).
        let fast = self.fast.gemv
            && match w.dtype {
                DType::F16 | DType::BF16 => cols % 8 == 0,
                DType::Q8_0 | DType::Q4_0 => cols % 256 == 0,
                DType::F32 => false,
            };
        let (f, name) = match (w.dtype, fast) {
            (DType::F16, true) => (&self.k.gemv_fast_f16, "gemv_fast_f16_f32"),
            (DType::BF16, true) => (&self.k.gemv_fast_bf16, "gemv_fast_bf16_f32"),
            (DType::Q8_0, true) => (&self.k.gemv_fast_q8_0, "gemv_fast_q8_0_f32"),
            (DType::Q4_0, true) => (&self.k.gemv_fast_q4_0, "gemv_fast_q4_0_f32"),
            (DType::F32, _) => (&self.k.gemv_f32, "gemv_f32_f32"),
            (DType::F16, false) => (&self.k.gemv_f16, "gemv_f16_f32"),
            (DType::BF16, false) => (&self.k.gemv_bf16, "gemv_bf16_f32"),
            (DType::Q8_0, false) => (&self.k.gemv_q8_0, "gemv_q8_0_f32"),
            (DType::Q4_0, false) => (&self.k.gemv_q4_0, "gemv_q4_0_f32"),
        };
        let rows_per_block = GEMV_THREADS / 32;
        let cfg = LaunchConfig {
            grid_dim: ((rows as u32).div_ceil(rows_per_block), 1, 1),
            block_dim: (GEMV_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&w.data).arg(x).arg(y).arg(&rows).arg(&cols).arg(&n);
        // SAFETY: the arguments match gemv_<type>_f32 and gemv_fast_<type>_f32 in
        // kernels/gemv.cu (W, x, y pointers, then int rows, cols, batch); matmul checked W
        // holds rows rows of row_bytes(cols) (cols % 32 == 0 for Q8_0/Q4_0), x >= n*cols
        // f32, y >= n*rows f32, all sizes positive and within i32; the fast kernels' shape
        // conditions were checked above (cols % 8 for F16/BF16, cols % 256 for Q8_0/Q4_0,
        // device buffers 256-byte aligned); the grid covers every row at 4 rows (warps)
        // per block of 128 threads, as every GEMV kernel (and the fast quantized kernels'
        // per-warp shared stage) requires.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(name, e))?;
        Ok(())
    }

    fn gemm(
        &self,
        blas: &CudaBlas,
        w: &DevWeight,
        x: &CudaSlice<f32>,
        n_tokens: usize,
        y: &mut CudaSlice<f32>,
        rows: i32,
        cols: i32,
        n: i32,
    ) -> Result<()> {
        use cublas::sys::{cublasComputeType_t, cublasOperation_t, cudaDataType};
        const OP: &str = "matmul (cuBLAS)";
        let x_elems = n_tokens * w.cols;
        let w_elems = mul(OP, w.rows, w.cols)?;
        let mut sc = self.scratch.lock().map_err(|_| Error::internal("Ops scratch mutex poisoned"))?;
        let sc = &mut *sc;
        // Activations in the weight's GEMM type, into the scratch (f32 weights: x as is).
        let half_type = match w.dtype {
            DType::F32 => None,
            DType::BF16 => Some(cudaDataType::CUDA_R_16BF),
            DType::F16 | DType::Q8_0 | DType::Q4_0 => Some(cudaDataType::CUDA_R_16F),
        };
        if let Some(t) = half_type {
            let act = grow(&self.stream, &mut sc.act, x_elems, "activation scratch")?;
            let f = if t == cudaDataType::CUDA_R_16BF { &self.k.convert_f32_bf16 } else { &self.k.convert_f32_f16 };
            let n_i = to_i32(OP, "n_tokens * cols", x_elems)?;
            let mut b = self.stream.launch_builder(f);
            b.arg(x).arg(act).arg(&n_i);
            // SAFETY: the arguments match convert_f32_f16 / convert_f32_bf16 in
            // kernels/elementwise.cu (x, y pointers, int n); x holds >= n f32 (checked by
            // matmul) and the scratch was grown to >= n 16-bit elements just above; the
            // kernel's grid-stride loop covers n with any grid.
            unsafe { b.launch(ew_cfg(x_elems)) }.map_err(|e| launch_err("convert activations", e))?;
        }
        // Quantized weights dequantized to f16 into the weight scratch.
        if matches!(w.dtype, DType::Q8_0 | DType::Q4_0) {
            let ws = grow(&self.stream, &mut sc.weight, w_elems, "weight scratch")?;
            self.dequant_launch(w, ws)?;
        }
        let (a_type, b_type) = match w.dtype {
            DType::F32 => (cudaDataType::CUDA_R_32F, cudaDataType::CUDA_R_32F),
            DType::BF16 => (cudaDataType::CUDA_R_16BF, cudaDataType::CUDA_R_16BF),
            _ => (cudaDataType::CUDA_R_16F, cudaDataType::CUDA_R_16F),
        };
        let alpha = 1.0f32;
        let beta = 0.0f32;
        let stream = &self.stream;
        // Device pointers (the guards keep cudarc's event bookkeeping until after the call).
        let (a_ptr, _ga) = match w.dtype {
            DType::Q8_0 | DType::Q4_0 => {
                sc.weight.as_ref().ok_or_else(|| Error::internal("weight scratch missing"))?.device_ptr(stream)
            }
            _ => w.data.device_ptr(stream),
        };
        let (b_ptr, _gb) = match w.dtype {
            DType::F32 => x.device_ptr(stream),
            _ => sc.act.as_ref().ok_or_else(|| Error::internal("activation scratch missing"))?.device_ptr(stream),
        };
        let (c_ptr, _gc) = y.device_ptr_mut(stream);
        // Column-major view: W (row-major [rows][cols]) is a cols x rows column-major
        // matrix, used transposed (m = rows, k = cols, lda = cols); x ([n][cols]) is
        // cols x n column-major (ldb = cols); y ([n][rows]) is rows x n column-major (ldc = rows).
        // SAFETY: A holds rows*cols elements of a_type (the weight, checked by check_weight,
        // or the scratch grown to rows*cols f16), B holds n*cols elements of b_type (x
        // checked by matmul, or the scratch grown to n*cols), C holds >= n*rows f32 (checked
        // by matmul); m, n, k, lda, ldb, ldc fit i32 (checked); alpha and beta are host
        // f32 (pointer mode host, compute type 32F); the handle's stream is `stream`.
        unsafe {
            cublas::result::gemm_ex(
                *blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                rows,
                n,
                cols,
                (&alpha as *const f32).cast::<c_void>(),
                a_ptr as *const c_void,
                a_type,
                cols,
                b_ptr as *const c_void,
                b_type,
                cols,
                (&beta as *const f32).cast::<c_void>(),
                c_ptr as *mut c_void,
                cudaDataType::CUDA_R_32F,
                rows,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublas::sys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
            )
        }
        .map_err(|e| Error::device(format!("{OP}: cublasGemmEx({} {rows}x{cols}, {n} tokens): {e:?}", w.dtype)))
    }

    /// Dequantizes `w` (F32, BF16, Q8_0 or Q4_0) to f16 into `out` (`[rows][cols]`,
    /// rounded to nearest); the cuBLAS path uses this for quantized weights.
    pub fn dequantize_to_f16(&self, w: &DevWeight, out: &mut CudaSlice<f16>) -> Result<()> {
        const OP: &str = "dequantize_to_f16";
        check_weight(OP, w)?;
        need(OP, "out", out.len(), mul(OP, w.rows, w.cols)?)?;
        self.dequant_launch(w, out)
    }

    /// Launches dequant_<type>_f16 on a weight already checked by `check_weight`, into
    /// `out` that holds >= rows*cols f16.
    fn dequant_launch(&self, w: &DevWeight, out: &mut CudaSlice<f16>) -> Result<()> {
        const OP: &str = "dequantize_to_f16";
        let total = mul(OP, w.rows, w.cols)?;
        if out.len() < total {
            return Err(Error::internal(format!("{OP}: out holds {} f16, needs {total}", out.len())));
        }
        let (rows_i, cols_i) = (to_i32(OP, "rows", w.rows)?, to_i32(OP, "cols", w.cols)?);
        if total == 0 {
            return Ok(());
        }
        let f = match w.dtype {
            DType::F32 => &self.k.dequant_f32_f16,
            DType::BF16 => &self.k.dequant_bf16_f16,
            DType::Q8_0 => &self.k.dequant_q8_0_f16,
            DType::Q4_0 => &self.k.dequant_q4_0_f16,
            DType::F16 => return Err(Error::invalid(format!("{OP}: {} is F16 already", w.name))),
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&w.data).arg(out).arg(&rows_i).arg(&cols_i);
        // SAFETY: the arguments match dequant_<type>_f16 in kernels/elementwise.cu (W, out
        // pointers, int rows, int cols); W holds rows rows of row_bytes(cols) bytes
        // (check_weight; cols % 32 == 0 for Q8_0/Q4_0), out holds >= rows*cols f16 (checked
        // above); the grid-stride loop (64-bit index) covers rows*cols with any grid.
        unsafe { b.launch(ew_cfg(total)) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// `x[r][i] += b[i]` for `r < rows`, `i < n`.
    pub fn add_bias(&self, x: &mut CudaSlice<f32>, b: &CudaSlice<f32>, rows: usize, n: usize) -> Result<()> {
        const OP: &str = "add_bias";
        let total = mul(OP, rows, n)?;
        need(OP, "x", x.len(), total)?;
        need(OP, "b", b.len(), n)?;
        let (rows_i, n_i) = (to_i32(OP, "rows", rows)?, to_i32(OP, "n", n)?);
        if total == 0 {
            return Ok(());
        }
        let mut lb = self.stream.launch_builder(&self.k.add_bias);
        lb.arg(x).arg(b).arg(&rows_i).arg(&n_i);
        // SAFETY: the arguments match add_bias_f32 in kernels/elementwise.cu (x, b pointers,
        // int rows, int n); x holds >= rows*n f32 and b >= n (n > 0 since rows*n > 0), checked
        // above; the grid-stride loop (64-bit index) covers rows*n with any grid.
        unsafe { lb.launch(ew_cfg(total)) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// `x[i] += y[i]` for `i < n`.
    pub fn add(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>, n: usize) -> Result<()> {
        const OP: &str = "add";
        need(OP, "x", x.len(), n)?;
        need(OP, "y", y.len(), n)?;
        let n_i = to_i32(OP, "n", n)?;
        if n == 0 {
            return Ok(());
        }
        let mut b = self.stream.launch_builder(&self.k.add);
        b.arg(x).arg(y).arg(&n_i);
        // SAFETY: the arguments match add_f32 in kernels/elementwise.cu (x, y pointers,
        // int n); both hold >= n f32 (checked above); grid-stride loop over n.
        unsafe { b.launch(ew_cfg(n)) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// `g[i] = silu(g[i]) * u[i]` for `i < n`.
    pub fn swiglu(&self, g: &mut CudaSlice<f32>, u: &CudaSlice<f32>, n: usize) -> Result<()> {
        const OP: &str = "swiglu";
        need(OP, "g", g.len(), n)?;
        need(OP, "u", u.len(), n)?;
        let n_i = to_i32(OP, "n", n)?;
        if n == 0 {
            return Ok(());
        }
        let mut b = self.stream.launch_builder(&self.k.swiglu);
        b.arg(g).arg(u).arg(&n_i);
        // SAFETY: the arguments match swiglu_f32 in kernels/elementwise.cu (g, u pointers,
        // int n); both hold >= n f32 (checked above); grid-stride loop over n.
        unsafe { b.launch(ew_cfg(n)) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// RoPE on `q` (`[n_tokens][n_heads * head_dim]`) and `k` (`[n_tokens][n_kv_heads *
    /// head_dim]`) in place, with `cos`/`sin` (`[n_tokens][head_dim / 2]`, computed on the
    /// host), pairs (i, i + hd/2) when `neox` else (2i, 2i+1); then K (rotated) and V
    /// (`[n_tokens][n_kv_heads * head_dim]`) of token t are stored as f16 into `kv` at
    /// layer `layer`, slot id `slots[t]`.
    ///
    /// Slot ids must be distinct within a call. (A slot id whose block is >= `kv.n_blocks`
    /// is not written: a device-side guard, the host checks slots.) The rotation uses
    /// unfused f32 products, bit-for-bit the CPU backend's `ops::rope`.
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
        const OP: &str = "rope_kv_write";
        let AttnShape { n_heads, n_kv_heads, head_dim } = shape;
        if head_dim == 0 || head_dim % 2 != 0 || n_heads == 0 || n_kv_heads == 0 {
            return Err(Error::invalid(format!("{OP}: bad shape {shape:?} (head_dim must be even and > 0)")));
        }
        let q_dim = mul(OP, n_heads, head_dim)?;
        let kv_dim = mul(OP, n_kv_heads, head_dim)?;
        if kv.kv_dim != kv_dim {
            return Err(Error::invalid(format!("{OP}: KV pool kv_dim {} != n_kv_heads * head_dim = {kv_dim}", kv.kv_dim)));
        }
        if layer >= kv.n_layers {
            return Err(Error::invalid(format!("{OP}: layer {layer} >= {} layers", kv.n_layers)));
        }
        kv.checked_block_elems(OP)?;
        need(OP, "q", q.len(), mul(OP, n_tokens, q_dim)?)?;
        need(OP, "k", k.len(), mul(OP, n_tokens, kv_dim)?)?;
        need(OP, "v", v.len(), n_tokens * kv_dim)?;
        need(OP, "cos", cos.len(), mul(OP, n_tokens, head_dim / 2)?)?;
        need(OP, "sin", sin.len(), n_tokens * (head_dim / 2))?;
        need(OP, "slots", slots.len(), n_tokens)?;
        to_i32(OP, "n_tokens * n_heads * head_dim", n_tokens * q_dim)?;
        let n_t = to_i32(OP, "n_tokens", n_tokens)?;
        let nh = to_i32(OP, "n_heads", n_heads)?;
        let nkv = to_i32(OP, "n_kv_heads", n_kv_heads)?;
        let hd = to_i32(OP, "head_dim", head_dim)?;
        to_i32(OP, "kv_dim", kv_dim)?;
        let neox_i: i32 = neox.into();
        let n_layers = to_i32(OP, "n_layers", kv.n_layers)?;
        let layer_i = to_i32(OP, "layer", layer)?;
        let n_blocks = to_i32(OP, "n_blocks", kv.n_blocks)?;
        if n_tokens == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig { grid_dim: (n_tokens as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(&self.k.rope_kv_write);
        b.arg(q)
            .arg(k)
            .arg(v)
            .arg(cos)
            .arg(sin)
            .arg(slots)
            .arg(&mut kv.data)
            .arg(&n_t)
            .arg(&nh)
            .arg(&nkv)
            .arg(&hd)
            .arg(&neox_i)
            .arg(&n_layers)
            .arg(&layer_i)
            .arg(&n_blocks);
        // SAFETY: the arguments match rope_kv_write_f32 in kernels/rope.cu (q, k, v, cos, sin,
        // slots, kv pointers, then int n_tokens, n_heads, n_kv_heads, head_dim, neox,
        // n_layers, layer, n_blocks); q, k, v, cos, sin, slots hold what n_tokens tokens need
        // (checked above), the pool holds n_blocks blocks of n_layers*2*16*kv_dim f16 with
        // kv_dim = n_kv_heads*head_dim and layer < n_layers (checked); slot ids whose block
        // is >= n_blocks are skipped by the kernel; head_dim is even; one block per token.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// Causal attention over the pages: for token t of sequence `seq[t]` at position
    /// `pos[t]`, each query head h attends over positions `0..=pos[t]` of KV head
    /// `h / (n_heads / n_kv_heads)` in layer `layer`, reading position p from block
    /// `block_tables[seq[t] * max_blocks + p / 16]`, slot `p % 16`; scale
    /// `1 / sqrt(head_dim)`, softmax in f32. `q`, `out`: `[n_tokens][n_heads * head_dim]`.
    ///
    /// Needs `head_dim <= ATTENTION_MAX_HEAD_DIM` (256) and `n_heads % n_kv_heads == 0`.
    /// The number of sequences is taken as `block_tables.len() / max_blocks`; a token
    /// whose seq, position or block id is out of range gets a NaN row on the device
    /// (never an out-of-bounds read; the host checks these).
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
        const OP: &str = "attention";
        let AttnShape { n_heads, n_kv_heads, head_dim } = shape;
        if head_dim == 0 || head_dim > ATTENTION_MAX_HEAD_DIM || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(Error::invalid(format!(
                "{OP}: bad shape {shape:?} (0 < head_dim <= {ATTENTION_MAX_HEAD_DIM}, n_heads a multiple of n_kv_heads)"
            )));
        }
        if n_heads > 65535 {
            return Err(Error::invalid(format!("{OP}: n_heads {n_heads} > 65535 (grid y)")));
        }
        let q_dim = mul(OP, n_heads, head_dim)?;
        let kv_dim = mul(OP, n_kv_heads, head_dim)?;
        if kv.kv_dim != kv_dim {
            return Err(Error::invalid(format!("{OP}: KV pool kv_dim {} != n_kv_heads * head_dim = {kv_dim}", kv.kv_dim)));
        }
        if layer >= kv.n_layers {
            return Err(Error::invalid(format!("{OP}: layer {layer} >= {} layers", kv.n_layers)));
        }
        kv.checked_block_elems(OP)?;
        if max_blocks == 0 {
            return Err(Error::invalid(format!("{OP}: max_blocks must be > 0")));
        }
        let out_elems = mul(OP, n_tokens, q_dim)?;
        need(OP, "q", q.len(), out_elems)?;
        need(OP, "out", out.len(), out_elems)?;
        need(OP, "seq", seq.len(), n_tokens)?;
        need(OP, "pos", pos.len(), n_tokens)?;
        need(OP, "block_tables", block_tables.len(), max_blocks)?;
        let n_seqs = block_tables.len() / max_blocks;
        to_i32(OP, "n_tokens * q_dim", out_elems)?;
        to_i32(OP, "max_blocks * 16", mul(OP, max_blocks, BLOCK_POSITIONS)?)?;
        let n_t = to_i32(OP, "n_tokens", n_tokens)?;
        let nh = to_i32(OP, "n_heads", n_heads)?;
        let nkv = to_i32(OP, "n_kv_heads", n_kv_heads)?;
        let hd = to_i32(OP, "head_dim", head_dim)?;
        to_i32(OP, "kv_dim", kv_dim)?;
        let n_layers = to_i32(OP, "n_layers", kv.n_layers)?;
        let layer_i = to_i32(OP, "layer", layer)?;
        let n_blocks = to_i32(OP, "n_blocks", kv.n_blocks)?;
        let max_blocks_i = to_i32(OP, "max_blocks", max_blocks)?;
        let n_seqs_i = i32::try_from(n_seqs).unwrap_or(i32::MAX);
        let scale = 1.0f32 / (head_dim as f32).sqrt();
        if n_tokens == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (n_tokens as u32, n_heads as u32, 1),
            block_dim: (ATT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.k.attention);
        b.arg(q)
            .arg(&kv.data)
            .arg(seq)
            .arg(pos)
            .arg(block_tables)
            .arg(out)
            .arg(&n_t)
            .arg(&nh)
            .arg(&nkv)
            .arg(&hd)
            .arg(&n_layers)
            .arg(&layer_i)
            .arg(&n_blocks)
            .arg(&max_blocks_i)
            .arg(&n_seqs_i)
            .arg(&scale);
        // SAFETY: the arguments match attention_f32 in kernels/attention.cu (q, kv, seq, pos,
        // block_tables, out pointers, then int n_tokens, n_heads, n_kv_heads, head_dim,
        // n_layers, layer, n_blocks, max_blocks, n_seqs, float scale); q and out hold
        // n_tokens*n_heads*head_dim f32, seq and pos n_tokens ids, block_tables n_seqs rows
        // of max_blocks, the pool n_blocks blocks with kv_dim = n_kv_heads*head_dim and
        // layer < n_layers (all checked above); head_dim <= 256 (the kernel's shared q) and
        // n_heads % n_kv_heads == 0; the kernel turns out-of-range seq/pos/block ids into NaN
        // rows without reading them; grid (n_tokens, n_heads <= 65535), block ATT_THREADS.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// The split of a split-KV attention step over `max_blocks` blocks of positions:
    /// `(n_splits, SPLIT_LEN)`. The split length is fixed, so a sequence's positions fall
    /// into the same splits whatever the batch and the other sequences' lengths; splits
    /// past a sequence's end are empty and add exactly nothing in the merge. So a
    /// sequence's attention is bit-identical alone or in a batch, as with the one-kernel
    /// attention. (`n_tokens`, `n_kv_heads`: the grid is `n_tokens x n_kv_heads x
    /// n_splits` blocks; 32 positions per split gives a 512-position batch-1 decode of an
    /// 8-KV-head model 128 blocks.)
    pub fn split_plan(&self, n_tokens: usize, n_kv_heads: usize, max_blocks: usize) -> (usize, usize) {
        let _ = (n_tokens, n_kv_heads);
        let max_pos = max_blocks.max(1) * BLOCK_POSITIONS;
        (max_pos.div_ceil(SPLIT_LEN), SPLIT_LEN)
    }

    /// Elements of the split-KV scratch for `n_tokens` tokens: (`part_o`, `part_ml`).
    pub fn split_scratch_len(n_tokens: usize, shape: AttnShape, n_splits: usize) -> (usize, usize) {
        let rows = n_tokens * shape.n_heads * n_splits;
        (rows * shape.head_dim, rows * 2)
    }

    /// [`Self::attention`] as split-KV (flash-decoding): each (token, KV head, split of
    /// `split.1` positions) computes the partial softmax of every query head of the group
    /// over its positions into `part_o` / `part_ml` (sized by [`Self::split_scratch_len`]),
    /// and a merge kernel combines the splits with the safe rescale into `out`. Same
    /// result as [`Self::attention`] within f32 rounding (scores computed the same way).
    ///
    /// Needs `n_heads / n_kv_heads <= SPLIT_MAX_GROUP` (8) besides what
    /// [`Self::attention`] needs, and `split` from [`Self::split_plan`] (or any split
    /// length that is a multiple of 16 up to 64 with `n_splits * len >= max_blocks * 16`).
    pub fn attention_split(
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
        split: (usize, usize),
        part_o: &mut CudaSlice<f32>,
        part_ml: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        const OP: &str = "attention_split";
        let AttnShape { n_heads, n_kv_heads, head_dim } = shape;
        if head_dim == 0 || head_dim > ATTENTION_MAX_HEAD_DIM || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(Error::invalid(format!(
                "{OP}: bad shape {shape:?} (0 < head_dim <= {ATTENTION_MAX_HEAD_DIM}, n_heads a multiple of n_kv_heads)"
            )));
        }
        if n_heads / n_kv_heads > SPLIT_MAX_GROUP {
            return Err(Error::invalid(format!(
                "{OP}: {} query heads per KV head, at most {SPLIT_MAX_GROUP}",
                n_heads / n_kv_heads
            )));
        }
        let (n_splits, split_len) = split;
        if split_len == 0 || split_len % BLOCK_POSITIONS != 0 || split_len > SPLIT_MAX_LEN {
            return Err(Error::invalid(format!("{OP}: split length {split_len} (a multiple of 16, at most {SPLIT_MAX_LEN})")));
        }
        if max_blocks == 0 || n_splits.checked_mul(split_len).is_none_or(|v| v < max_blocks * BLOCK_POSITIONS) {
            return Err(Error::invalid(format!(
                "{OP}: {n_splits} splits of {split_len} do not cover {max_blocks} blocks of positions"
            )));
        }
        if n_splits > 65535 || n_kv_heads > 65535 || n_heads > 65535 {
            return Err(Error::invalid(format!("{OP}: {n_splits} splits / {n_heads} heads exceed the grid (65535)")));
        }
        let q_dim = mul(OP, n_heads, head_dim)?;
        let kv_dim = mul(OP, n_kv_heads, head_dim)?;
        if kv.kv_dim != kv_dim {
            return Err(Error::invalid(format!("{OP}: KV pool kv_dim {} != n_kv_heads * head_dim = {kv_dim}", kv.kv_dim)));
        }
        if layer >= kv.n_layers {
            return Err(Error::invalid(format!("{OP}: layer {layer} >= {} layers", kv.n_layers)));
        }
        kv.checked_block_elems(OP)?;
        let out_elems = mul(OP, n_tokens, q_dim)?;
        need(OP, "q", q.len(), out_elems)?;
        need(OP, "out", out.len(), out_elems)?;
        need(OP, "seq", seq.len(), n_tokens)?;
        need(OP, "pos", pos.len(), n_tokens)?;
        need(OP, "block_tables", block_tables.len(), max_blocks)?;
        let parts = mul(OP, mul(OP, n_tokens, n_heads)?, n_splits)?;
        need(OP, "part_o", part_o.len(), mul(OP, parts, head_dim)?)?;
        need(OP, "part_ml", part_ml.len(), mul(OP, parts, 2)?)?;
        to_i32(OP, "n_tokens * n_heads * n_splits * head_dim", parts * head_dim)?;
        let n_seqs = block_tables.len() / max_blocks;
        to_i32(OP, "n_tokens * q_dim", out_elems)?;
        to_i32(OP, "max_blocks * 16", mul(OP, max_blocks, BLOCK_POSITIONS)?)?;
        let n_t = to_i32(OP, "n_tokens", n_tokens)?;
        let nh = to_i32(OP, "n_heads", n_heads)?;
        let nkv = to_i32(OP, "n_kv_heads", n_kv_heads)?;
        let hd = to_i32(OP, "head_dim", head_dim)?;
        let n_layers = to_i32(OP, "n_layers", kv.n_layers)?;
        let layer_i = to_i32(OP, "layer", layer)?;
        let n_blocks = to_i32(OP, "n_blocks", kv.n_blocks)?;
        let max_blocks_i = to_i32(OP, "max_blocks", max_blocks)?;
        let n_seqs_i = i32::try_from(n_seqs).unwrap_or(i32::MAX);
        let ns = to_i32(OP, "n_splits", n_splits)?;
        let sl = to_i32(OP, "split_len", split_len)?;
        let scale = 1.0f32 / (head_dim as f32).sqrt();
        if n_tokens == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (n_tokens as u32, n_kv_heads as u32, n_splits as u32),
            block_dim: (ATT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.k.attention_split);
        b.arg(q)
            .arg(&kv.data)
            .arg(seq)
            .arg(pos)
            .arg(block_tables)
            .arg(&mut *part_o)
            .arg(&mut *part_ml)
            .arg(&n_t)
            .arg(&nh)
            .arg(&nkv)
            .arg(&hd)
            .arg(&n_layers)
            .arg(&layer_i)
            .arg(&n_blocks)
            .arg(&max_blocks_i)
            .arg(&n_seqs_i)
            .arg(&ns)
            .arg(&sl)
            .arg(&scale);
        // SAFETY: the arguments match attention_split_f32 in kernels/attention.cu (q, kv, seq,
        // pos, block_tables, part_o, part_ml pointers, then int n_tokens, n_heads, n_kv_heads,
        // head_dim, n_layers, layer, n_blocks, max_blocks, n_seqs, n_splits, split_len, float
        // scale); q holds n_tokens*q_dim f32, seq/pos n_tokens ids, block_tables n_seqs rows of
        // max_blocks, the pool n_blocks blocks of kv_dim = n_kv_heads*head_dim with layer <
        // n_layers, part_o/part_ml n_tokens*n_heads*n_splits*(head_dim | 2) f32 (all checked
        // above); head_dim <= 256, group <= 8, split_len a multiple of 16 <= 64 and the splits
        // cover max_blocks*16 positions (checked); out-of-range seq/pos/block ids give NaN
        // rows without being read; grid (n_tokens, n_kv_heads, n_splits), block 128 = SPLIT_THREADS.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;

        let cfg = LaunchConfig {
            grid_dim: (n_tokens as u32, n_heads as u32, 1),
            block_dim: (ATT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.k.attention_merge);
        b.arg(&*part_o).arg(&*part_ml).arg(out).arg(&n_t).arg(&nh).arg(&hd).arg(&ns);
        // SAFETY: the arguments match attention_merge_f32 in kernels/attention.cu (part_o,
        // part_ml, out pointers, then int n_tokens, n_heads, head_dim, n_splits); part_o and
        // part_ml hold n_tokens*n_heads*n_splits*(head_dim | 2) f32 and out n_tokens*q_dim
        // (checked above); grid (n_tokens, n_heads <= 65535), threads loop over head dims.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err("attention_merge", e))?;
        Ok(())
    }

    /// Whether [`Self::attention_prefill`] takes `shape` (head_dim a multiple of 8, at most 256).
    pub fn prefill_attention_fits(shape: AttnShape) -> bool {
        shape.head_dim > 0 && shape.head_dim.is_multiple_of(8) && shape.head_dim <= ATTENTION_MAX_HEAD_DIM
    }

    /// [`Self::attention`] for prefill, tiled: `tiles` (`[n_tiles][2]`: first token,
    /// count <= [`PREFILL_TILE`]) cover the tokens, each tile a run of one sequence's
    /// tokens at consecutive positions; a block per (tile, query head) walks the
    /// sequence's KV blocks with K/V staged in shared memory and an online softmax per
    /// query row (no score matrix). Same result as [`Self::attention`] within f32 rounding.
    pub fn attention_prefill(
        &self,
        q: &CudaSlice<f32>,
        kv: &KvPool,
        layer: usize,
        seq: &CudaSlice<u32>,
        pos: &CudaSlice<u32>,
        block_tables: &CudaSlice<u32>,
        tiles: &CudaSlice<u32>,
        n_tiles: usize,
        max_blocks: usize,
        n_tokens: usize,
        shape: AttnShape,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        const OP: &str = "attention_prefill";
        let AttnShape { n_heads, n_kv_heads, head_dim } = shape;
        if !Self::prefill_attention_fits(shape) || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(Error::invalid(format!(
                "{OP}: bad shape {shape:?} (head_dim a multiple of 8 up to {ATTENTION_MAX_HEAD_DIM}, n_heads a multiple of n_kv_heads)"
            )));
        }
        if n_heads > 65535 {
            return Err(Error::invalid(format!("{OP}: n_heads {n_heads} > 65535 (grid y)")));
        }
        let q_dim = mul(OP, n_heads, head_dim)?;
        let kv_dim = mul(OP, n_kv_heads, head_dim)?;
        if kv.kv_dim != kv_dim {
            return Err(Error::invalid(format!("{OP}: KV pool kv_dim {} != n_kv_heads * head_dim = {kv_dim}", kv.kv_dim)));
        }
        if layer >= kv.n_layers {
            return Err(Error::invalid(format!("{OP}: layer {layer} >= {} layers", kv.n_layers)));
        }
        kv.checked_block_elems(OP)?;
        if max_blocks == 0 {
            return Err(Error::invalid(format!("{OP}: max_blocks must be > 0")));
        }
        let out_elems = mul(OP, n_tokens, q_dim)?;
        need(OP, "q", q.len(), out_elems)?;
        need(OP, "out", out.len(), out_elems)?;
        need(OP, "seq", seq.len(), n_tokens)?;
        need(OP, "pos", pos.len(), n_tokens)?;
        need(OP, "block_tables", block_tables.len(), max_blocks)?;
        need(OP, "tiles", tiles.len(), mul(OP, n_tiles, 2)?)?;
        let n_seqs = block_tables.len() / max_blocks;
        to_i32(OP, "n_tokens * q_dim", out_elems)?;
        to_i32(OP, "max_blocks * 16", mul(OP, max_blocks, BLOCK_POSITIONS)?)?;
        let n_ti = to_i32(OP, "n_tiles", n_tiles)?;
        let n_t = to_i32(OP, "n_tokens", n_tokens)?;
        let nh = to_i32(OP, "n_heads", n_heads)?;
        let nkv = to_i32(OP, "n_kv_heads", n_kv_heads)?;
        let hd = to_i32(OP, "head_dim", head_dim)?;
        to_i32(OP, "kv_dim", kv_dim)?;
        let n_layers = to_i32(OP, "n_layers", kv.n_layers)?;
        let layer_i = to_i32(OP, "layer", layer)?;
        let n_blocks = to_i32(OP, "n_blocks", kv.n_blocks)?;
        let max_blocks_i = to_i32(OP, "max_blocks", max_blocks)?;
        let n_seqs_i = i32::try_from(n_seqs).unwrap_or(i32::MAX);
        let scale = 1.0f32 / (head_dim as f32).sqrt();
        if n_tiles == 0 || n_tokens == 0 {
            return Ok(());
        }
        if n_tiles > i32::MAX as usize / 2 {
            return Err(Error::invalid(format!("{OP}: {n_tiles} tiles")));
        }
        let cfg = LaunchConfig {
            grid_dim: (n_tiles as u32, n_heads as u32, 1),
            block_dim: ((PREFILL_TILE * 8) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.k.attention_prefill);
        b.arg(q)
            .arg(&kv.data)
            .arg(seq)
            .arg(pos)
            .arg(block_tables)
            .arg(tiles)
            .arg(out)
            .arg(&n_ti)
            .arg(&n_t)
            .arg(&nh)
            .arg(&nkv)
            .arg(&hd)
            .arg(&n_layers)
            .arg(&layer_i)
            .arg(&n_blocks)
            .arg(&max_blocks_i)
            .arg(&n_seqs_i)
            .arg(&scale);
        // SAFETY: the arguments match attention_prefill_f32 in kernels/attention.cu (q, kv, seq,
        // pos, block_tables, tiles, out pointers, then int n_tiles, n_tokens, n_heads,
        // n_kv_heads, head_dim, n_layers, layer, n_blocks, max_blocks, n_seqs, float scale);
        // q and out hold n_tokens*q_dim f32, seq/pos n_tokens ids, tiles n_tiles pairs,
        // block_tables n_seqs rows of max_blocks, the pool n_blocks blocks of kv_dim with
        // layer < n_layers (all checked above); head_dim % 8 == 0 and <= 256 (16-byte K/V
        // loads, the kernel's shared rows); the kernel refuses tiles outside n_tokens or
        // longer than 16 and out-of-range seq/pos/block ids (NaN rows, nothing read); grid
        // (n_tiles, n_heads <= 65535), block 128 = PF_THREADS.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// `out[i][:] = x[idx[i]][:]` for `i < n_idx`, rows of `width`.
    ///
    /// (An index >= `x.len() / width` gives a NaN row on the device: a guard.)
    pub fn gather_rows(
        &self,
        x: &CudaSlice<f32>,
        idx: &CudaSlice<u32>,
        n_idx: usize,
        width: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        const OP: &str = "gather_rows";
        need(OP, "idx", idx.len(), n_idx)?;
        need(OP, "out", out.len(), mul(OP, n_idx, width)?)?;
        let (n_i, width_i) = (to_i32(OP, "n_idx", n_idx)?, to_i32(OP, "width", width)?);
        if n_idx == 0 || width == 0 {
            return Ok(());
        }
        let x_rows = i32::try_from(x.len() / width).unwrap_or(i32::MAX);
        let cfg = LaunchConfig { grid_dim: (n_idx as u32, 1, 1), block_dim: (EW_THREADS, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(&self.k.gather_rows);
        b.arg(x).arg(idx).arg(out).arg(&n_i).arg(&width_i).arg(&x_rows);
        // SAFETY: the arguments match gather_rows_f32 in kernels/elementwise.cu (x, idx, out
        // pointers, int n_idx, width, x_rows); x holds x_rows full rows (x_rows = len/width,
        // rows at or past it are refused by the kernel), idx >= n_idx and out >= n_idx*width
        // (checked above); one block per index.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// `out[r]` = index of the largest value of row r of `logits` (`[rows][vocab]`),
    /// the first one on ties (as the CPU backend), for `r < rows`.
    ///
    /// (NaN never wins; a row with nothing above -inf gives 0.)
    pub fn argmax(&self, logits: &CudaSlice<f32>, rows: usize, vocab: usize, out: &mut CudaSlice<u32>) -> Result<()> {
        const OP: &str = "argmax";
        if vocab == 0 && rows > 0 {
            return Err(Error::invalid(format!("{OP}: vocab must be > 0")));
        }
        need(OP, "logits", logits.len(), mul(OP, rows, vocab)?)?;
        need(OP, "out", out.len(), rows)?;
        let (rows_i, vocab_i) = (to_i32(OP, "rows", rows)?, to_i32(OP, "vocab", vocab)?);
        if rows == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (512, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(&self.k.argmax);
        b.arg(logits).arg(out).arg(&rows_i).arg(&vocab_i);
        // SAFETY: the arguments match argmax_f32 in kernels/elementwise.cu (logits, out
        // pointers, int rows, int vocab); logits holds >= rows*vocab f32 and out >= rows u32
        // (checked above); one block per row of 512 threads (a multiple of 32, <= 1024).
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// Copies block `src` of `kv` onto block `dst` (every layer, K and V).
    pub fn copy_block(&self, kv: &mut KvPool, src: u32, dst: u32) -> Result<()> {
        const OP: &str = "copy_block";
        let be = kv.checked_block_elems(OP)?;
        let (s, d) = (src as usize, dst as usize);
        if s >= kv.n_blocks || d >= kv.n_blocks {
            return Err(Error::invalid(format!("{OP}: block {src} -> {dst} outside the pool of {} blocks", kv.n_blocks)));
        }
        if s == d {
            return Ok(());
        }
        // Two disjoint views of the one buffer: split at the later block.
        let r = if s < d {
            let (lo, mut hi) = kv.data.split_at_mut(d * be);
            let from = lo.slice(s * be..(s + 1) * be);
            let mut to = hi.slice_mut(0..be);
            self.stream.memcpy_dtod(&from, &mut to)
        } else {
            let (mut lo, hi) = kv.data.split_at_mut(s * be);
            let from = hi.slice(0..be);
            let mut to = lo.slice_mut(d * be..(d + 1) * be);
            self.stream.memcpy_dtod(&from, &mut to)
        };
        r.map_err(|e| driver_err(&format!("{OP}: cuMemcpyDtoDAsync(block {src} -> {dst}, {} bytes)", be * 2), e))
    }
}

/// cuBLAS on `stream`, or None and why. Never panics: the library is looked for first,
/// and the handle is created under `guarded`.
fn create_blas(stream: &Arc<CudaStream>) -> (Option<CudaBlas>, String) {
    // SAFETY: is_culib_present only tries to dlopen cuBLAS's library names; it calls nothing.
    if !unsafe { cublas::sys::is_culib_present() } {
        return (None, "GEMV kernels only (cuBLAS library not found: libcublas.so)".into());
    }
    let made = guarded("creating the cuBLAS handle", || {
        CudaBlas::new(stream.clone()).map_err(|e| Error::device(format!("cublasCreate: {e:?}")))
    });
    match made {
        Ok(b) => (Some(b), format!("cuBLAS GemmEx for batches > {GEMM_MIN_TOKENS} tokens, GEMV kernels otherwise")),
        Err(e) => (None, format!("GEMV kernels only (cuBLAS unavailable: {})", e.message)),
    }
}

/// The scratch buffer grown to at least `elems` (a fresh allocation when smaller; the
/// old one is freed in stream order).
fn grow<'a, T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    slot: &'a mut Option<CudaSlice<T>>,
    elems: usize,
    what: &str,
) -> Result<&'a mut CudaSlice<T>> {
    let fits = slot.as_ref().is_some_and(|s| s.len() >= elems.max(1));
    if !fits {
        *slot = None;
        let s = stream.alloc_zeros::<T>(elems.max(1)).map_err(|e| {
            Error::out_of_memory(format!(
                "matmul {what}: allocating {} bytes: {}",
                elems * std::mem::size_of::<T>(),
                driver_msg("cuMemAlloc", e)
            ))
        })?;
        *slot = Some(s);
    }
    slot.as_mut().ok_or_else(|| Error::internal("scratch vanished"))
}

/// Launch shape of the rmsnorm kernels (one block per row, enough threads for four
/// elements each, 32..=1024), with rows and n as i32; None when there are no rows.
fn rmsnorm_launch(op: &str, rows: usize, n: usize) -> Result<Option<(LaunchConfig, i32, i32)>> {
    if n == 0 {
        return Err(Error::invalid(format!("{op}: n must be > 0")));
    }
    let (rows_i, n_i) = (to_i32(op, "rows", rows)?, to_i32(op, "n", n)?);
    mul(op, rows, n)?;
    if rows == 0 {
        return Ok(None);
    }
    let threads = n.div_ceil(4).next_multiple_of(32).clamp(32, 1024) as u32;
    let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
    Ok(Some((cfg, rows_i, n_i)))
}

/// Grid-stride launch shape of the element-wise kernels for `total` elements.
fn ew_cfg(total: usize) -> LaunchConfig {
    let blocks = total.div_ceil(EW_THREADS as usize).clamp(1, 65535) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (EW_THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// A weight's buffer holds `rows` rows of `dtype.row_bytes(cols)` bytes.
fn check_weight(op: &str, w: &DevWeight) -> Result<()> {
    let row_bytes = w.dtype.row_bytes(w.cols).ok_or_else(|| {
        Error::invalid(format!(
            "{op}: {} ({}) has {} columns, not a multiple of {}",
            w.name,
            w.dtype,
            w.cols,
            w.dtype.block_elems()
        ))
    })?;
    let bytes = mul(op, w.rows, row_bytes)?;
    if w.data.len() < bytes {
        return Err(Error::internal(format!(
            "{op}: {} ({} [{} x {}]) holds {} bytes on the device, needs {bytes}",
            w.name,
            w.dtype,
            w.rows,
            w.cols,
            w.data.len()
        )));
    }
    Ok(())
}

/// `buf` (holding `got` elements) is at least `want` elements long.
fn need(op: &str, what: &str, got: usize, want: usize) -> Result<()> {
    if got < want {
        return Err(Error::invalid(format!("{op}: {what} holds {got} elements, the op needs {want}")));
    }
    Ok(())
}

fn mul(op: &str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| Error::invalid(format!("{op}: size {a} x {b} overflows")))
}

fn to_i32(op: &str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::invalid(format!("{op}: {what} = {v} does not fit the kernels' int")))
}

fn launch_err(kernel: &str, e: cudarc::driver::DriverError) -> Error {
    driver_err(&format!("launching {kernel}"), e)
}
