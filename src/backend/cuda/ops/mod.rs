//! Device-level launchers for the CUDA runner: every op of the forward pass on
//! buffers that already live on the device (no uploads, no downloads, no
//! synchronisation). Each launcher checks its sizes against the buffers it is
//! given, launches on the stream it was made with, and maps launch errors to
//! `LLMRT_DEVICE`. Kernel faults surface at the runner's next synchronisation.
//!
//! Buffers may be larger than an op needs (the runner reuses scratch buffers);
//! an op touches only the prefix its sizes describe.
//!
//! One file per op family, each mirrored by the CPU backend's op and the kernel file
//! of the same name (`backend/cpu/ops/<op>.rs`, `kernels/<op>.cu`) and tested by the
//! `<op>_*` tests of tests/cuda_kernels.rs:
//! - [`norm`](self::norm): RMSNorm, in place, fused with the residual add.
//! - [`rope`](self::rope): RoPE on Q/K with K and V written into the paged [`KvPool`].
//! - [`attention`](self::attention): paged causal attention (one kernel, split-KV, tiled prefill).
//! - [`embed`](self::embed): embedding rows of any weight type to f32.
//! - [`elementwise`](self::elementwise): bias, residual add, SwiGLU, row gather, argmax.
//! - [`matmul`](self::matmul): GEMV kernels, cuBLAS GEMM and its conversions, fused decode GEMVs.
//!
//! This file holds what they share: [`Ops`] (the loaded kernels, cuBLAS, the fast-path
//! switches), the device types [`DevWeight`], [`AttnShape`], [`KvPool`], and the size
//! checks. Depends on `super::device` and `super::load` only.

use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, LaunchConfig};
use half::f16;

use super::device::{driver_err, driver_msg, guarded};
use super::load::{load_modules, KernelSource, Modules};
use crate::error::Error;
use crate::kv::BLOCK_POSITIONS;
use crate::quant::DType;
use crate::Result;

/// The entry points of one `kernels/<file>.cu` as a `Kernels` struct (one
/// `CudaFunction` field per kernel) with its `load`, so each op file lists its
/// kernels once: `kernel_set!("norm", { rmsnorm = "rmsnorm_f32", ... });`.
macro_rules! kernel_set {
    ($file:literal, { $($field:ident = $name:literal),* $(,)? }) => {
        /// The entry points of this op's kernels file.
        pub(super) struct Kernels {
            $($field: cudarc::driver::CudaFunction,)*
        }

        impl Kernels {
            pub(super) fn load(m: &crate::backend::cuda::load::Modules) -> crate::Result<Kernels> {
                Ok(Kernels { $($field: m.function($file, $name)?,)* })
            }
        }
    };
}

mod attention;
mod elementwise;
mod embed;
mod matmul;
mod norm;
mod rope;

pub use attention::{
    AttnArgs, AttnScores, ATTENTION_MAX_HEAD_DIM, PREFILL_TILE, SPLIT_LEN, SPLIT_MAX_GROUP, SPLIT_MAX_LEN,
};
pub(crate) use matmul::{dequantized_for_gemm, gemv_cfg};
pub use matmul::{MatmulPath, GEMM_MIN_TOKENS};
pub(crate) use norm::rmsnorm_launch;
pub use norm::RmsNorm;
pub use rope::{KvWrite, Qkv, Rope};

/// A weight matrix resident on the device in its stored type: `rows` rows of
/// `cols` elements, each row `dtype.row_bytes(cols)` bytes (ggml block layout for
/// the quantized types; little-endian F32/F16/BF16), rows contiguous.
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
        let total =
            be.checked_mul(self.n_blocks).ok_or_else(|| Error::invalid(format!("{what}: KV pool size overflows")))?;
        if self.data.len() < total {
            return Err(Error::internal(format!(
                "{what}: KV pool holds {} f16, {} blocks x {be} need {total}",
                self.data.len(),
                self.n_blocks
            )));
        }
        Ok(be)
    }

    /// The checks every op that reads or writes layer `layer` of the pool for heads of
    /// `shape` makes: `kv_dim` matches, `layer` exists, `data` holds every block. Returns
    /// `(q_dim, kv_dim)` of `shape`.
    fn check_layer(&self, op: &str, shape: AttnShape, layer: usize) -> Result<(usize, usize)> {
        let q_dim = mul(op, shape.n_heads, shape.head_dim)?;
        let kv_dim = mul(op, shape.n_kv_heads, shape.head_dim)?;
        if self.kv_dim != kv_dim {
            return Err(Error::invalid(format!(
                "{op}: KV pool kv_dim {} != n_kv_heads * head_dim = {kv_dim}",
                self.kv_dim
            )));
        }
        if layer >= self.n_layers {
            return Err(Error::invalid(format!("{op}: layer {layer} >= {} layers", self.n_layers)));
        }
        self.checked_block_elems(op)?;
        Ok((q_dim, kv_dim))
    }

    /// The pool's sizes as the kernels' ints: `(n_layers, layer, n_blocks)`.
    fn kernel_ints(&self, op: &str, layer: usize) -> Result<(i32, i32, i32)> {
        Ok((
            to_i32(op, "n_layers", self.n_layers)?,
            to_i32(op, "layer", layer)?,
            to_i32(op, "n_blocks", self.n_blocks)?,
        ))
    }
}

/// The fast paths of the CUDA runner, each with an environment switch so that one GPU
/// session can tell which part is broken: `LLMRT_CUDA_FAST=0` turns all of them off;
/// `LLMRT_CUDA_<NAME>=0` (or `=1`) turns one off (or on) whatever `LLMRT_CUDA_FAST` says.
/// Read once, when [`Ops`] is made; tests flip them with [`Ops::set_fast_paths`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastPaths {
    /// `LLMRT_CUDA_GEMV`: the fast F16/BF16 GEMV kernels (more 16-byte loads in flight)
    /// where the shape allows.
    pub gemv: bool,
    /// `LLMRT_CUDA_GEMV_QUANT`: the fast Q8_0/Q4_0 GEMV kernels (rows staged through
    /// shared memory) and, with `fused`, their fused decode launches. **Off unless set
    /// to 1** (`LLMRT_CUDA_FAST` does not turn it on): each lane reads its own 128 bytes
    /// of the activations, so one 16-byte load touches 32 cache lines; until a GPU has
    /// measured them, the plain Q8_0/Q4_0 kernels (4 lanes a block, a warp's loads
    /// contiguous) are the default.
    pub gemv_quant: bool,
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

/// An on/off environment switch: `Some(false)` for 0/off/false, `Some(true)` for
/// 1/on/true, `None` when unset or anything else.
pub(crate) fn env_flag(name: &str) -> Option<bool> {
    match std::env::var(name).ok().as_deref().map(str::trim) {
        Some("0") | Some("off") | Some("false") => Some(false),
        Some("1") | Some("on") | Some("true") => Some(true),
        _ => None,
    }
}

impl FastPaths {
    /// Every fast path on (`on`, the opt-in `gemv_quant` included) or off.
    pub fn all(on: bool) -> FastPaths {
        FastPaths { gemv: on, gemv_quant: on, fused: on, splitkv: on, decode_gemm: on, prefill_attn: on }
    }

    /// From the environment (see the type's doc; `gemv_quant` is opt-in).
    pub fn from_env() -> FastPaths {
        let base = env_flag("LLMRT_CUDA_FAST").unwrap_or(true);
        FastPaths {
            gemv: env_flag("LLMRT_CUDA_GEMV").unwrap_or(base),
            gemv_quant: env_flag("LLMRT_CUDA_GEMV_QUANT").unwrap_or(false),
            fused: env_flag("LLMRT_CUDA_FUSED").unwrap_or(base),
            splitkv: env_flag("LLMRT_CUDA_SPLITKV").unwrap_or(base),
            decode_gemm: env_flag("LLMRT_CUDA_DECODE_GEMM").unwrap_or(base),
            prefill_attn: env_flag("LLMRT_CUDA_PREFILL_ATTN").unwrap_or(base),
        }
    }
}

/// Every kernel of kernels/*.cu loaded on one context, plus cuBLAS and the
/// scratch it needs.
pub struct Ops {
    stream: Arc<CudaStream>,
    source: KernelSource,
    k: Kernels,
    /// None when cuBLAS could not be loaded: every matmul takes the GEMV kernels.
    blas: Option<CudaBlas>,
    /// What matmul uses, in words (for [`Ops::describe`]).
    blas_note: String,
    /// Device scratch of the cuBLAS path, grown as needed, reused across calls (all
    /// work is ordered on `stream`, so reuse by the next call is safe).
    scratch: Mutex<matmul::Scratch>,
    /// Which fast paths are on.
    fast: FastPaths,
    _ctx: Arc<CudaContext>,
}

/// Every kernel entry point of kernels/*.cu, by op family (file).
struct Kernels {
    norm: norm::Kernels,
    rope: rope::Kernels,
    attention: attention::Kernels,
    embed: embed::Kernels,
    elementwise: elementwise::Kernels,
    matmul: matmul::Kernels,
}

impl Kernels {
    fn load(m: &Modules) -> Result<Kernels> {
        Ok(Kernels {
            norm: norm::Kernels::load(m)?,
            rope: rope::Kernels::load(m)?,
            attention: attention::Kernels::load(m)?,
            embed: embed::Kernels::load(m)?,
            elementwise: elementwise::Kernels::load(m)?,
            matmul: matmul::Kernels::load(m)?,
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
            Ok((source, Kernels::load(&modules)?))
        })?;
        let (blas, blas_note) = matmul::create_blas(&stream);
        Ok(Ops {
            stream,
            source,
            k,
            blas,
            blas_note,
            scratch: Mutex::new(matmul::Scratch::default()),
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

    /// Copies block `src` of `kv` onto block `dst` (every layer, K and V).
    pub fn copy_block(&self, kv: &mut KvPool, src: u32, dst: u32) -> Result<()> {
        const OP: &str = "copy_block";
        let be = kv.checked_block_elems(OP)?;
        let (s, d) = (src as usize, dst as usize);
        if s >= kv.n_blocks || d >= kv.n_blocks {
            return Err(Error::invalid(format!(
                "{OP}: block {src} -> {dst} outside the pool of {} blocks",
                kv.n_blocks
            )));
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

/// One block per row of `threads` threads.
fn rows_cfg(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

/// Threads per block of the element-wise kernels and row kernels.
const EW_THREADS: u32 = 256;

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

/// `a * b`, or `LLMRT_INVALID_ARGUMENT` naming `op` when it overflows.
pub(crate) fn mul(op: &str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| Error::invalid(format!("{op}: size {a} x {b} overflows")))
}

/// `v` as the kernels' `int`, or `LLMRT_INVALID_ARGUMENT` naming `op` and `what`.
pub(crate) fn to_i32(op: &str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::invalid(format!("{op}: {what} = {v} does not fit the kernels' int")))
}

/// A failed launch of `kernel` as an `LLMRT_DEVICE` error.
pub(crate) fn launch_err(kernel: &str, e: cudarc::driver::DriverError) -> Error {
    driver_err(&format!("launching {kernel}"), e)
}
