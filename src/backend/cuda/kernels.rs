//! Three kernels of `kernels/*.cu` (rmsnorm_f32, gemv_f16_f32, gemv_q8_0_f32) loaded on
//! one device, with safe wrappers that upload, launch, download and check every driver
//! call. These wrappers move whole tensors per call: they are the smoke tests' path
//! (tests/cuda_smoke.rs: embedded PTX and NVRTC both), not the decode loop, which uses
//! [`super::ops::Ops`]. Launch shapes come from `ops` (one description per kernel).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, PushKernelArg};
use half::f16;

use super::device::{device_info, driver_err, driver_version, guarded, probe};
use super::load::{load_modules, KernelSource};
use super::ops::{gemv_cfg, launch_err, rmsnorm_launch, to_i32};
use super::DeviceInfo;
use crate::error::{Error, Result};
use crate::quant::DType;

/// A context on one device with the kernels loaded.
pub struct CudaKernels {
    info: DeviceInfo,
    source: KernelSource,
    stream: Arc<CudaStream>,
    rmsnorm_f32: CudaFunction,
    gemv_f16_f32: CudaFunction,
    gemv_q8_0_f32: CudaFunction,
    // The context outlives the functions and buffers made from it (cudarc's Arcs keep it alive anyway).
    _ctx: Arc<CudaContext>,
}

impl CudaKernels {
    /// Opens device `ordinal` and loads the embedded PTX of the newest SM version the
    /// device runs (sm_90 on 9.x and later, sm_80 on 8.x); when none fits, or the
    /// driver rejects it (e.g. PTX newer than the driver), compiles the embedded
    /// sources with NVRTC instead.
    pub fn new(ordinal: usize) -> Result<CudaKernels> {
        Self::open(ordinal, false)
    }

    /// Like [`CudaKernels::new`] but always compiles the sources with NVRTC.
    pub fn with_nvrtc(ordinal: usize) -> Result<CudaKernels> {
        Self::open(ordinal, true)
    }

    fn open(ordinal: usize, force_nvrtc: bool) -> Result<CudaKernels> {
        probe()?; // library present, cuInit done, at least one device
        guarded("opening CUDA device", || {
            let info = device_info(ordinal, driver_version()?)?;
            let ctx = CudaContext::new(ordinal)
                .map_err(|e| driver_err(&format!("cuDevicePrimaryCtxRetain(cuda:{ordinal})"), e))?;
            let (modules, source) = load_modules(&ctx, info.sm(), force_nvrtc)?;
            Ok(CudaKernels {
                rmsnorm_f32: modules.function("norm", "rmsnorm_f32")?,
                gemv_f16_f32: modules.function("matmul", "gemv_f16_f32")?,
                gemv_q8_0_f32: modules.function("matmul", "gemv_q8_0_f32")?,
                stream: ctx.default_stream(),
                info,
                source,
                _ctx: ctx,
            })
        })
    }

    /// The device these kernels run on.
    pub fn device(&self) -> &DeviceInfo {
        &self.info
    }

    /// Embedded PTX or NVRTC, and for which SM.
    pub fn source(&self) -> &KernelSource {
        &self.source
    }

    /// RMS norm of each row of `x` (`[rows][n]`), scaled by `w` (`[n]`); see kernels/norm.cu.
    pub fn rmsnorm_f32(&self, x: &[f32], w: &[f32], rows: usize, n: usize, eps: f32) -> Result<Vec<f32>> {
        const OP: &str = "rmsnorm_f32";
        let launch = rmsnorm_launch(OP, rows, n)?;
        check_len("rmsnorm_f32: x", x.len(), rows, n)?;
        check_len("rmsnorm_f32: w", w.len(), 1, n)?;
        let Some((cfg, rows_i, n_i)) = launch else { return Ok(Vec::new()) };
        guarded(OP, || {
            let x_d = self.upload("x", x)?;
            let w_d = self.upload("w", w)?;
            let mut y_d = self.upload_nan("y", rows * n)?;
            let mut b = self.stream.launch_builder(&self.rmsnorm_f32);
            b.arg(&x_d).arg(&w_d).arg(&mut y_d).arg(&rows_i).arg(&n_i).arg(&eps);
            // SAFETY: the argument list matches rmsnorm_f32's signature in kernels/norm.cu
            // (3 pointers, int, int, float); x and y hold rows*n f32 and w holds n, as
            // checked above; the grid has one block per row and the block size is a
            // multiple of 32 no larger than 1024 (rmsnorm_launch), as the kernel requires.
            unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;
            self.download(OP, &y_d)
        })
    }

    /// `y[b][r] = sum_c W[r][c] * x[b][c]` with W `[rows][cols]` f16, x `[batch][cols]`,
    /// result `[batch][rows]`; see kernels/matmul.cu.
    pub fn gemv_f16(&self, w: &[f16], x: &[f32], rows: usize, cols: usize, batch: usize) -> Result<Vec<f32>> {
        check_len("gemv_f16: W", w.len(), rows, cols)?;
        check_len("gemv_f16: x", x.len(), batch, cols)?;
        self.gemv(("gemv_f16_f32", &self.gemv_f16_f32), w, x, rows, cols, batch)
    }

    /// Like [`CudaKernels::gemv_f16`] with W as ggml Q8_0 blocks: `rows * cols/32`
    /// blocks of 34 bytes (f16 scale, 32 int8), `cols` a multiple of 32.
    pub fn gemv_q8_0(&self, w_bytes: &[u8], x: &[f32], rows: usize, cols: usize, batch: usize) -> Result<Vec<f32>> {
        let (qk, block_bytes) = (DType::Q8_0.block_elems(), DType::Q8_0.block_bytes());
        if !cols.is_multiple_of(qk) {
            return Err(Error::invalid(format!("gemv_q8_0: cols {cols} is not a multiple of {qk}")));
        }
        check_len("gemv_q8_0: W bytes", w_bytes.len(), rows, cols / qk * block_bytes)?;
        check_len("gemv_q8_0: x", x.len(), batch, cols)?;
        self.gemv(("gemv_q8_0_f32", &self.gemv_q8_0_f32), w_bytes, x, rows, cols, batch)
    }

    /// Launches the GEMV kernel `k` (name, function) on uploaded copies of `w` and `x`.
    fn gemv<W: DeviceRepr>(
        &self,
        k: (&str, &CudaFunction),
        w: &[W],
        x: &[f32],
        rows: usize,
        cols: usize,
        batch: usize,
    ) -> Result<Vec<f32>> {
        let (name, f) = k;
        let (rows_i, cols_i, batch_i) =
            (to_i32(name, "rows", rows)?, to_i32(name, "cols", cols)?, to_i32(name, "batch", batch)?);
        to_i32(name, "batch * rows", batch * rows)?;
        if rows == 0 || batch == 0 {
            return Ok(Vec::new());
        }
        if cols == 0 {
            return Ok(vec![0.0; batch * rows]);
        }
        guarded(name, || {
            let w_d = self.upload("W", w)?;
            let x_d = self.upload("x", x)?;
            let mut y_d = self.upload_nan("y", batch * rows)?;
            let mut b = self.stream.launch_builder(f);
            b.arg(&w_d).arg(&x_d).arg(&mut y_d).arg(&rows_i).arg(&cols_i).arg(&batch_i);
            // SAFETY: the argument list matches gemv_f16_f32 / gemv_q8_0_f32 in
            // kernels/matmul.cu (W, x, y pointers, then int rows, cols, batch); the callers
            // checked W holds rows*cols f16 or rows*cols/32 Q8_0 blocks (cols % 32 == 0),
            // x holds batch*cols f32 and y is allocated with batch*rows f32; the grid
            // covers every row at GEMV_THREADS/32 rows per block (gemv_cfg).
            unsafe { b.launch(gemv_cfg(rows)) }.map_err(|e| launch_err(name, e))?;
            self.download(name, &y_d)
        })
    }

    fn upload<T: DeviceRepr>(&self, what: &str, host: &[T]) -> Result<CudaSlice<T>> {
        self.stream
            .clone_htod(host)
            .map_err(|e| driver_err(&format!("uploading {what} ({} bytes)", std::mem::size_of_val(host)), e))
    }

    /// An output buffer filled with NaN, so an element a kernel fails to write shows up.
    fn upload_nan(&self, what: &str, len: usize) -> Result<CudaSlice<f32>> {
        self.upload(what, &vec![f32::NAN; len])
    }

    /// Waits for the kernel (its faults surface here), then copies `y` back.
    fn download(&self, kernel: &str, y: &CudaSlice<f32>) -> Result<Vec<f32>> {
        self.stream.synchronize().map_err(|e| driver_err(&format!("running {kernel}"), e))?;
        let out = self.stream.clone_dtoh(y).map_err(|e| driver_err(&format!("downloading {kernel} output"), e))?;
        self.stream.synchronize().map_err(|e| driver_err(&format!("downloading {kernel} output"), e))?;
        Ok(out)
    }
}

/// `got` elements where `a x b` are wanted (exactly).
fn check_len(what: &str, got: usize, a: usize, b: usize) -> Result<()> {
    let want = a.checked_mul(b).ok_or_else(|| Error::invalid(format!("{what}: size {a} x {b} overflows")))?;
    if got != want {
        return Err(Error::invalid(format!("{what}: {got} elements, expected {a} x {b} = {want}")));
    }
    Ok(())
}
