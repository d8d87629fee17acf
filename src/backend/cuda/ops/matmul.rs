//! Matrix products on the device: the GEMV kernels (decode: batch-invariant, every
//! weight type read as stored), cuBLAS GEMM for prefill (with the activation
//! conversions and weight dequantization it needs), and the fused decode launches
//! (Q/K/V in one, gate/up/SwiGLU in one). Twins: `backend/cpu/ops/matmul.rs` (the CPU
//! op), `kernels/matmul.cu` (the kernels); tests: `matmul_*` in tests/cuda_kernels.rs.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::{self, CudaBlas};
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg,
    ValidAsZeroBits,
};
use half::f16;

use super::{check_weight, ew_cfg, launch_err, mul, need, to_i32, DevWeight, Ops};
use crate::backend::cuda::device::{driver_err, driver_msg, guarded};
use crate::backend::cuda::load::Modules;
use crate::error::Error;
use crate::quant::DType;
use crate::Result;

/// [`MatmulPath::Auto`] takes cuBLAS when `n_tokens` is larger than this (and cuBLAS
/// loaded); GEMV otherwise. Equal to the GEMV kernels' batch tile (8 vectors per weight read).
/// cbindgen:ignore
pub const GEMM_MIN_TOKENS: usize = 8;

/// Threads per block of the GEMV kernels: one warp per weight row, four rows a block.
pub(crate) const GEMV_THREADS: u32 = 128;

/// Launch shape of every GEMV kernel for `rows` weight rows: a warp per row,
/// `GEMV_THREADS / 32` rows per block.
pub(crate) fn gemv_cfg(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((rows as u32).div_ceil(GEMV_THREADS / 32), 1, 1),
        block_dim: (GEMV_THREADS, 1, 1),
        shared_mem_bytes: 0,
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

/// A kernel and its name (for errors).
type Named = (CudaFunction, String);

/// The weight types with kernels of their own beyond F32, in the order of every per-type
/// kernel array, with the tag their kernels are named by (`gemv_<tag>_f32`,
/// `embed_<tag>_f32`, `dequant_<tag>_f16`). The first [`FAST_TYPES`] also have the fast
/// and fused GEMV kernels.
pub(super) const KERNEL_TYPES: [(DType, &str); 14] = [
    (DType::F16, "f16"),
    (DType::BF16, "bf16"),
    (DType::Q8_0, "q8_0"),
    (DType::Q4_0, "q4_0"),
    (DType::Q4_1, "q4_1"),
    (DType::Q5_0, "q5_0"),
    (DType::Q5_1, "q5_1"),
    (DType::IQ4_NL, "iq4_nl"),
    (DType::Q2_K, "q2_k"),
    (DType::Q3_K, "q3_k"),
    (DType::Q4_K, "q4_k"),
    (DType::Q5_K, "q5_k"),
    (DType::Q6_K, "q6_k"),
    (DType::IQ4_XS, "iq4_xs"),
];

/// How many of [`KERNEL_TYPES`] (the first) have fast and fused GEMV kernels.
const FAST_TYPES: usize = 4;

/// `prefix_<tag>_suffix` of every type of `types`, loaded from kernels/matmul.cu.
fn per_type(m: &Modules, types: &[(DType, &str)], prefix: &str, suffix: &str) -> Result<Vec<Named>> {
    types
        .iter()
        .map(|(_, t)| {
            let name = format!("{prefix}_{t}_{suffix}");
            Ok((m.function("matmul", &name)?, name))
        })
        .collect()
}

/// The entry points of kernels/matmul.cu. The per-type vectors are indexed as
/// [`KERNEL_TYPES`] (see `type_index`), the fast ones by its first [`FAST_TYPES`].
pub(super) struct Kernels {
    gemv_f32: Named,
    /// gemv_<type>_f32.
    gemv: Vec<Named>,
    /// gemv_fast_<type>_f32.
    gemv_fast: Vec<Named>,
    /// gemv3_fast_<type>_f32.
    gemv3: Vec<Named>,
    /// gemv_swiglu_fast_<type>_f32.
    gemv_swiglu: Vec<Named>,
    convert_f32_f16: CudaFunction,
    convert_f32_bf16: CudaFunction,
    dequant_f32_f16: CudaFunction,
    /// dequant_<type>_f16 of KERNEL_TYPES[1..] (F16 needs none).
    dequant: Vec<Named>,
}

impl Kernels {
    pub(super) fn load(m: &Modules) -> Result<Kernels> {
        let f = |name: &str| m.function("matmul", name);
        let fast = &KERNEL_TYPES[..FAST_TYPES];
        Ok(Kernels {
            gemv_f32: (f("gemv_f32_f32")?, "gemv_f32_f32".into()),
            gemv: per_type(m, &KERNEL_TYPES, "gemv", "f32")?,
            gemv_fast: per_type(m, fast, "gemv_fast", "f32")?,
            gemv3: per_type(m, fast, "gemv3_fast", "f32")?,
            gemv_swiglu: per_type(m, fast, "gemv_swiglu_fast", "f32")?,
            convert_f32_f16: f("convert_f32_f16")?,
            convert_f32_bf16: f("convert_f32_bf16")?,
            dequant_f32_f16: f("dequant_f32_f16")?,
            dequant: per_type(m, &KERNEL_TYPES[1..], "dequant", "f16")?,
        })
    }
}

/// Index of `dtype` in [`KERNEL_TYPES`] and the per-type kernel vectors (None for F32,
/// which has only the plain GEMV).
pub(super) fn type_index(dtype: DType) -> Option<usize> {
    KERNEL_TYPES.iter().position(|&(d, _)| d == dtype)
}

/// Whether the cuBLAS path dequantizes weights of `dtype` to f16 first (every quantized type).
pub(crate) fn dequantized_for_gemm(dtype: DType) -> bool {
    !matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// Index of the fast GEMV kernels for weights of `dtype` with `cols` columns when their
/// shape conditions hold: 16-byte chunks of 8 halves (F16/BF16: cols % 8 == 0);
/// quantized rows starting 16-byte aligned (Q8_0/Q4_0: cols % 256 == 0, a multiple of 8
/// blocks). None for F32 and the group-quantized types (plain kernels only).
fn fast_kind(dtype: DType, cols: usize) -> Option<usize> {
    let fits = match dtype {
        DType::F16 | DType::BF16 => cols.is_multiple_of(8),
        DType::Q8_0 | DType::Q4_0 => cols.is_multiple_of(256),
        _ => false,
    };
    type_index(dtype).filter(|&i| fits && i < FAST_TYPES)
}

/// Scratch of the cuBLAS path: activations as f16/bf16 bits, and a quantized weight
/// dequantized to f16.
#[derive(Default)]
pub(super) struct Scratch {
    act: Option<CudaSlice<u16>>,
    weight: Option<CudaSlice<f16>>,
}

/// A GEMV/GEMM problem as the kernels' ints: `rows x cols` weights, `n` vectors.
#[derive(Clone, Copy)]
struct Dims {
    rows: i32,
    cols: i32,
    n: i32,
}

/// cuBLAS on `stream`, or None and why. Never panics: the library is looked for first,
/// and the handle is created under `guarded`.
pub(super) fn create_blas(stream: &Arc<CudaStream>) -> (Option<CudaBlas>, String) {
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
fn grow<'a, T: DeviceRepr + ValidAsZeroBits>(
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

impl Ops {
    /// Whether cuBLAS loaded (else [`MatmulPath::Auto`] always takes GEMV).
    pub fn has_cublas(&self) -> bool {
        self.blas.is_some()
    }

    /// Grows the cuBLAS path's scratch now (e.g. before capturing a CUDA graph):
    /// `act_elems` activations (`n_tokens * cols` of the largest matmul) and
    /// `weight_elems` dequantized weight elements (`rows * cols` of the largest
    /// quantized weight taken by cuBLAS). No-op without cuBLAS.
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

    /// `y[t][r] = dot(W[r], x[t])` for `t < n_tokens`, `r < w.rows`: x is
    /// `[n_tokens][w.cols]`, y is `[n_tokens][w.rows]`, f32.
    ///
    /// Paths: [`MatmulPath::Gemv`], or `Auto` with `n_tokens <= GEMM_MIN_TOKENS` or
    /// without cuBLAS: the GEMV kernels (f32 accumulation, fixed reduction order per
    /// output: batch-invariant bit for bit). `Auto` with more tokens: cuBLAS
    /// `cublasGemmEx` with f32 output and f32 compute (`CUBLAS_COMPUTE_32F`, no TF32):
    /// F32 weights with f32 activations (an SGEMM); F16 weights with the activations
    /// rounded to f16 in a scratch buffer; BF16 weights with the activations rounded to
    /// bf16; quantized weights (Q8_0, Q4_0, the group-quantized types) dequantized to f16
    /// into a scratch buffer (every call) and
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
        let dims = Dims {
            rows: to_i32(OP, "rows", rows)?,
            cols: to_i32(OP, "cols", cols)?,
            n: to_i32(OP, "n_tokens", n_tokens)?,
        };
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
            Some(blas) if path == MatmulPath::Auto && n_tokens > GEMM_MIN_TOKENS => self.gemm(blas, w, x, y, dims),
            _ => self.gemv(w, x, y, dims),
        }
    }

    /// Index of the fused GEMV kernels for weights of `dtype` with `cols` columns, when
    /// the type's fast GEMV switch and `fused` are on and the shape allows.
    fn fused_kind(&self, dtype: DType, cols: usize) -> Option<usize> {
        self.fast_gemv_kind(dtype, cols).filter(|_| self.fast.fused)
    }

    /// Index of the fast GEMV kernels for weights of `dtype` with `cols` columns when
    /// their switch is on (`gemv` for F16/BF16, the opt-in `gemv_quant` for Q8_0/Q4_0)
    /// and the shape allows.
    fn fast_gemv_kind(&self, dtype: DType, cols: usize) -> Option<usize> {
        let on = match dtype {
            DType::Q8_0 | DType::Q4_0 => self.fast.gemv_quant,
            _ => self.fast.gemv,
        };
        fast_kind(dtype, cols).filter(|_| on)
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
        let [y0, y1, y2] = ys;
        let mut b = self.stream.launch_builder(&self.k.matmul.gemv3[kind].0);
        b.arg(&w[0].data).arg(&w[1].data).arg(&w[2].data).arg(x).arg(y0).arg(y1).arg(y2);
        b.arg(&rows[0]).arg(&rows[1]).arg(&rows[2]).arg(&cols_i).arg(&n_i);
        // SAFETY: the arguments match gemv3_fast_<type>_f32 in kernels/matmul.cu (W0, W1, W2,
        // x, y0, y1, y2 pointers, then int r0, r1, r2, cols, batch); each W_s holds rows_s rows
        // of row_bytes(cols) (check_weight) of the one dtype the kernel reads, x >= n*cols f32,
        // y_s >= n*rows_s f32 (checked above), the y_s are distinct buffers (three &mut); the
        // fast kernels' shape condition holds (fused_kind); the grid covers the stacked rows
        // at 4 rows (warps) per block of 128 threads (gemv_cfg).
        unsafe { b.launch(gemv_cfg(total)) }.map_err(|e| launch_err("gemv3_fast", e))?;
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
        let mut b = self.stream.launch_builder(&self.k.matmul.gemv_swiglu[kind].0);
        b.arg(&w_gate.data).arg(&w_up.data).arg(x).arg(y).arg(&rows_i).arg(&cols_i).arg(&n_i);
        // SAFETY: the arguments match gemv_swiglu_fast_<type>_f32 in kernels/matmul.cu (Wg,
        // Wu, x, y pointers, then int rows, cols, batch); both weights hold rows rows of
        // row_bytes(cols) of the dtype the kernel reads (check_weight, same dtype and shape),
        // x >= n*cols f32 and y >= n*rows f32 (checked above), y distinct from x (&mut); the
        // fast kernels' shape condition holds (fused_kind); grid ceil(rows/4), block 128.
        unsafe { b.launch(gemv_cfg(rows)) }.map_err(|e| launch_err("gemv_swiglu_fast", e))?;
        Ok(true)
    }

    fn gemv(&self, w: &DevWeight, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, d: Dims) -> Result<()> {
        let k = &self.k.matmul;
        let (f, name) = match (type_index(w.dtype), self.fast_gemv_kind(w.dtype, w.cols)) {
            (_, Some(i)) => &k.gemv_fast[i],
            (Some(i), None) => &k.gemv[i],
            (None, None) => &k.gemv_f32,
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&w.data).arg(x).arg(y).arg(&d.rows).arg(&d.cols).arg(&d.n);
        // SAFETY: the arguments match gemv_<type>_f32 and gemv_fast_<type>_f32 in
        // kernels/matmul.cu (W, x, y pointers, then int rows, cols, batch); matmul checked W
        // holds rows rows of row_bytes(cols) (cols a multiple of the block for quantized
        // types, as the kernel of w.dtype, picked by type_index, reads them), x >= n*cols
        // f32, y >= n*rows f32, all sizes positive and within i32; the fast kernels' shape
        // conditions hold (fast_kind: cols % 8 for F16/BF16, cols % 256 for Q8_0/Q4_0,
        // device buffers 256-byte aligned); the grid covers every row at 4 rows (warps)
        // per block of 128 threads (gemv_cfg), as every GEMV kernel (and the fast quantized
        // kernels' per-warp shared stage) requires.
        unsafe { b.launch(gemv_cfg(d.rows as usize)) }.map_err(|e| launch_err(name, e))?;
        Ok(())
    }

    fn gemm(&self, blas: &CudaBlas, w: &DevWeight, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, d: Dims) -> Result<()> {
        use cublas::sys::{cublasComputeType_t, cublasOperation_t, cudaDataType};
        const OP: &str = "matmul (cuBLAS)";
        let Dims { rows, cols, n } = d;
        let x_elems = n as usize * w.cols;
        let w_elems = mul(OP, w.rows, w.cols)?;
        let mut sc = self.scratch.lock().map_err(|_| Error::internal("Ops scratch mutex poisoned"))?;
        let sc = &mut *sc;
        // Activations in the weight's GEMM type, into the scratch (f32 weights: x as is).
        let half_type = match w.dtype {
            DType::F32 => None,
            DType::BF16 => Some(cudaDataType::CUDA_R_16BF),
            _ => Some(cudaDataType::CUDA_R_16F),
        };
        let k = &self.k.matmul;
        if let Some(t) = half_type {
            let act = grow(&self.stream, &mut sc.act, x_elems, "activation scratch")?;
            let f = if t == cudaDataType::CUDA_R_16BF { &k.convert_f32_bf16 } else { &k.convert_f32_f16 };
            let n_i = to_i32(OP, "n_tokens * cols", x_elems)?;
            let mut b = self.stream.launch_builder(f);
            b.arg(x).arg(act).arg(&n_i);
            // SAFETY: the arguments match convert_f32_f16 / convert_f32_bf16 in
            // kernels/matmul.cu (x, y pointers, int n); x holds >= n f32 (checked by matmul)
            // and the scratch was grown to >= n 16-bit elements just above; the kernel's
            // grid-stride loop covers n with any grid.
            unsafe { b.launch(ew_cfg(x_elems)) }.map_err(|e| launch_err("convert activations", e))?;
        }
        // Quantized weights dequantized to f16 into the weight scratch.
        if dequantized_for_gemm(w.dtype) {
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
        let (a_ptr, _ga) = if dequantized_for_gemm(w.dtype) {
            sc.weight.as_ref().ok_or_else(|| Error::internal("weight scratch missing"))?.device_ptr(stream)
        } else {
            w.data.device_ptr(stream)
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

    /// Dequantizes `w` (any type but F16) to f16 into `out` (`[rows][cols]`,
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
        let k = &self.k.matmul;
        let f = match (w.dtype, type_index(w.dtype)) {
            (DType::F32, _) => &k.dequant_f32_f16,
            (DType::F16, _) => return Err(Error::invalid(format!("{OP}: {} is F16 already", w.name))),
            (_, Some(i)) => &k.dequant[i - 1].0,
            (dt, None) => return Err(Error::internal(format!("{OP}: no dequantization kernel for {dt} ({})", w.name))),
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&w.data).arg(out).arg(&rows_i).arg(&cols_i);
        // SAFETY: the arguments match dequant_<type>_f16 in kernels/matmul.cu (W, out
        // pointers, int rows, int cols); W holds rows rows of row_bytes(cols) bytes
        // (check_weight; cols a multiple of the block for quantized types), out holds >= rows*cols f16 (checked
        // above); the grid-stride loop (64-bit index) covers rows*cols with any grid.
        unsafe { b.launch(ew_cfg(total)) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }
}
