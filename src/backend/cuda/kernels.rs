//! The kernels of `kernels/*.cu` loaded on one device, with safe wrappers that
//! upload, launch, download and check every driver call. These wrappers move whole
//! tensors per call: they are the smoke-test and reference path, not the decode loop.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{self, CompileOptions, Ptx};
use half::f16;

use super::device::{device_info, driver_err, driver_version, guarded, probe};
use super::embedded;
use super::reference::{Q8_0_BLOCK_BYTES, QK8_0};
use super::DeviceInfo;
use crate::error::{Error, Result};

/// Where the loaded kernels came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelSource {
    /// PTX compiled by nvcc at build time for `sm_<sm>`, JIT-compiled by the driver.
    EmbeddedPtx { sm: u32 },
    /// The embedded sources compiled by NVRTC at run time for `compute_<sm>`.
    Nvrtc { sm: u32 },
}

impl std::fmt::Display for KernelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelSource::EmbeddedPtx { sm } => write!(f, "embedded PTX sm_{sm}"),
            KernelSource::Nvrtc { sm } => write!(f, "NVRTC compute_{sm}"),
        }
    }
}

/// Threads per block of the gemv kernels: one warp per weight row, four rows a block.
const GEMV_THREADS: u32 = 128;

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
            let func = |module: &str, name: &str| -> Result<CudaFunction> {
                let m = modules
                    .get(module)
                    .ok_or_else(|| Error::internal(format!("kernel module {module} not embedded")))?;
                m.load_function(name).map_err(|e| driver_err(&format!("cuModuleGetFunction({name})"), e))
            };
            Ok(CudaKernels {
                rmsnorm_f32: func("norm", "rmsnorm_f32")?,
                gemv_f16_f32: func("gemv", "gemv_f16_f32")?,
                gemv_q8_0_f32: func("gemv", "gemv_q8_0_f32")?,
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
        if n == 0 {
            return Err(Error::invalid("rmsnorm_f32: n must be > 0"));
        }
        check_len("rmsnorm_f32: x", x.len(), rows, n)?;
        check_len("rmsnorm_f32: w", w.len(), 1, n)?;
        let (rows_i, n_i) = (to_i32("rows", rows)?, to_i32("n", n)?);
        if rows == 0 {
            return Ok(Vec::new());
        }
        // One block per row; enough threads for four elements each, 32..=1024.
        let threads = n.div_ceil(4).next_multiple_of(32).clamp(32, 1024) as u32;
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
        guarded("rmsnorm_f32", || {
            let x_d = self.upload("x", x)?;
            let w_d = self.upload("w", w)?;
            let mut y_d = self.upload_nan("y", rows * n)?;
            let mut b = self.stream.launch_builder(&self.rmsnorm_f32);
            b.arg(&x_d).arg(&w_d).arg(&mut y_d).arg(&rows_i).arg(&n_i).arg(&eps);
            // SAFETY: the argument list matches rmsnorm_f32's signature in kernels/norm.cu
            // (3 pointers, int, int, float); x and y hold rows*n f32 and w holds n, as
            // checked above; the grid has one block per row and the block size is a
            // multiple of 32 no larger than 1024, as the kernel requires.
            unsafe { b.launch(cfg) }.map_err(|e| driver_err("launching rmsnorm_f32", e))?;
            self.download("rmsnorm_f32", &y_d)
        })
    }

    /// `y[b][r] = sum_c W[r][c] * x[b][c]` with W `[rows][cols]` f16, x `[batch][cols]`,
    /// result `[batch][rows]`; see kernels/gemv.cu.
    pub fn gemv_f16(&self, w: &[f16], x: &[f32], rows: usize, cols: usize, batch: usize) -> Result<Vec<f32>> {
        check_len("gemv_f16: W", w.len(), rows, cols)?;
        check_len("gemv_f16: x", x.len(), batch, cols)?;
        self.gemv("gemv_f16_f32", &self.gemv_f16_f32, w, x, rows, cols, batch)
    }

    /// Like [`CudaKernels::gemv_f16`] with W as ggml Q8_0 blocks: `rows * cols/32`
    /// blocks of 34 bytes (f16 scale, 32 int8), `cols` a multiple of 32.
    pub fn gemv_q8_0(&self, w_bytes: &[u8], x: &[f32], rows: usize, cols: usize, batch: usize) -> Result<Vec<f32>> {
        if !cols.is_multiple_of(QK8_0) {
            return Err(Error::invalid(format!("gemv_q8_0: cols {cols} is not a multiple of {QK8_0}")));
        }
        check_len("gemv_q8_0: W bytes", w_bytes.len(), rows, cols / QK8_0 * Q8_0_BLOCK_BYTES)?;
        check_len("gemv_q8_0: x", x.len(), batch, cols)?;
        self.gemv("gemv_q8_0_f32", &self.gemv_q8_0_f32, w_bytes, x, rows, cols, batch)
    }

    #[allow(clippy::too_many_arguments)]
    fn gemv<W: DeviceRepr>(
        &self,
        name: &str,
        f: &CudaFunction,
        w: &[W],
        x: &[f32],
        rows: usize,
        cols: usize,
        batch: usize,
    ) -> Result<Vec<f32>> {
        let (rows_i, cols_i, batch_i) = (to_i32("rows", rows)?, to_i32("cols", cols)?, to_i32("batch", batch)?);
        to_i32("batch * rows", batch * rows)?;
        if rows == 0 || batch == 0 {
            return Ok(Vec::new());
        }
        if cols == 0 {
            return Ok(vec![0.0; batch * rows]);
        }
        let rows_per_block = GEMV_THREADS / 32;
        let cfg = LaunchConfig {
            grid_dim: ((rows as u32).div_ceil(rows_per_block), 1, 1),
            block_dim: (GEMV_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        guarded(name, || {
            let w_d = self.upload("W", w)?;
            let x_d = self.upload("x", x)?;
            let mut y_d = self.upload_nan("y", batch * rows)?;
            let mut b = self.stream.launch_builder(f);
            b.arg(&w_d).arg(&x_d).arg(&mut y_d).arg(&rows_i).arg(&cols_i).arg(&batch_i);
            // SAFETY: the argument list matches gemv_f16_f32 / gemv_q8_0_f32 in
            // kernels/gemv.cu (W, x, y pointers, then int rows, cols, batch); the callers
            // checked W holds rows*cols f16 or rows*cols/32 Q8_0 blocks (cols % 32 == 0),
            // x holds batch*cols f32 and y is allocated with batch*rows f32; the grid
            // covers every row at GEMV_THREADS/32 rows per block.
            unsafe { b.launch(cfg) }.map_err(|e| driver_err(&format!("launching {name}"), e))?;
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

/// Every kernel module on `ctx` for a device of compute capability `sm`: the embedded
/// PTX of the newest SM version the device runs (sm_90 on 9.x and later, sm_80 on
/// 8.x) unless `force_nvrtc`; when none fits, or the driver rejects it (e.g. PTX newer
/// than the driver), the embedded sources compiled with NVRTC. Call under `guarded`.
pub(crate) fn load_modules(
    ctx: &Arc<CudaContext>,
    sm: u32,
    force_nvrtc: bool,
) -> Result<(HashMap<&'static str, Arc<CudaModule>>, KernelSource)> {
    let embedded_sm = embedded::ptx_archs().into_iter().rev().find(|&e| e <= sm);
    match embedded_sm {
        Some(e) if !force_nvrtc => match load_embedded(ctx, e) {
            Ok(m) => Ok((m, KernelSource::EmbeddedPtx { sm: e })),
            Err(ptx_err) => {
                let m = load_nvrtc(ctx, sm).map_err(|err| {
                    Error::device(format!("{}; NVRTC fallback failed too: {}", ptx_err.message, err.message))
                })?;
                Ok((m, KernelSource::Nvrtc { sm }))
            }
        },
        _ => Ok((load_nvrtc(ctx, sm)?, KernelSource::Nvrtc { sm })),
    }
}

fn load_embedded(ctx: &Arc<CudaContext>, sm: u32) -> Result<HashMap<&'static str, Arc<CudaModule>>> {
    let mut modules = HashMap::new();
    for &(stem, ptx_sm, ptx) in embedded::PTX.iter().filter(|&&(_, s, _)| s == sm) {
        let m = ctx
            .load_module(Ptx::from_src(ptx))
            .map_err(|e| driver_err(&format!("cuModuleLoadData({stem}.cu, embedded PTX sm_{ptx_sm})"), e))?;
        modules.insert(stem, m);
    }
    Ok(modules)
}

fn load_nvrtc(ctx: &Arc<CudaContext>, sm: u32) -> Result<HashMap<&'static str, Arc<CudaModule>>> {
    let mut modules = HashMap::new();
    for (stem, ptx) in nvrtc_compile(sm)? {
        let m = ctx
            .load_module(Ptx::from_src(ptx))
            .map_err(|e| driver_err(&format!("cuModuleLoadData({stem}.cu, NVRTC compute_{sm})"), e))?;
        modules.insert(stem, m);
    }
    Ok(modules)
}

/// Compiles every embedded kernel source with NVRTC for `compute_<sm>`, returning
/// (file stem, PTX text). Needs no GPU, only libnvrtc (`LLMRT_UNSUPPORTED` when it
/// cannot be found) and cuda_fp16.h, searched in `LLMRT_CUDA_INCLUDE` (a PATH-style
/// list), `CUDA_HOME/include`, `CUDA_PATH/include`, `/usr/local/cuda/include` and the
/// repository's pip toolchain (scripts/install-nvcc.sh).
pub fn nvrtc_compile(sm: u32) -> Result<Vec<(&'static str, String)>> {
    // SAFETY: is_culib_present only tries to dlopen NVRTC's library names; it calls nothing.
    if !unsafe { nvrtc::sys::is_culib_present() } {
        return Err(Error::unsupported("no NVRTC library (libnvrtc.so not found)"));
    }
    let include_paths = nvrtc_include_paths();
    guarded("NVRTC", || {
        embedded::SOURCES
            .iter()
            .map(|&(stem, src)| {
                let opts = CompileOptions {
                    include_paths: include_paths.clone(),
                    options: vec![format!("--gpu-architecture=compute_{sm}"), "--std=c++17".into()],
                    name: Some(format!("{stem}.cu")),
                    ..Default::default()
                };
                let ptx = nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| nvrtc_err(stem, sm, e))?;
                Ok((stem, ptx.to_src()))
            })
            .collect()
    })
}

fn nvrtc_err(stem: &str, sm: u32, e: nvrtc::CompileError) -> Error {
    let detail = match e {
        nvrtc::CompileError::CompileError { nvrtc, options, log } => {
            format!("{nvrtc:?} with options {options:?}:\n{}", log.to_string_lossy())
        }
        other => format!("{other:?}"),
    };
    Error::device(format!("NVRTC compiling {stem}.cu for compute_{sm}: {detail}"))
}

/// Folders holding cuda_fp16.h, in the order of [`nvrtc_compile`]'s documentation.
fn nvrtc_include_paths() -> Vec<String> {
    let mut dirs: Vec<std::path::PathBuf> = Vec::new();
    if let Some(list) = std::env::var_os("LLMRT_CUDA_INCLUDE") {
        dirs.extend(std::env::split_paths(&list));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            dirs.push(Path::new(&home).join("include"));
        }
    }
    dirs.push("/usr/local/cuda/include".into());
    dirs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join(".cuda/nvidia/cu13/include"));
    let mut out: Vec<String> = Vec::new();
    for d in dirs {
        if d.join("cuda_fp16.h").is_file() {
            if let Some(s) = d.to_str().map(str::to_string).filter(|s| !out.contains(s)) {
                out.push(s);
            }
        }
    }
    out
}

fn check_len(what: &str, got: usize, a: usize, b: usize) -> Result<()> {
    let want = a.checked_mul(b).ok_or_else(|| Error::invalid(format!("{what}: size {a} x {b} overflows")))?;
    if got != want {
        return Err(Error::invalid(format!("{what}: {got} elements, expected {a} x {b} = {want}")));
    }
    Ok(())
}

fn to_i32(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::invalid(format!("{what} = {v} does not fit the kernels' int")))
}
