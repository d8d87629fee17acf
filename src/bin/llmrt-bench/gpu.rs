//! The device ceilings: copy bandwidth and cuBLAS bf16 GEMM rate, with cudarc directly.

use cudarc::cublas::{self, CudaBlas};
use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};
use llmrt::util::XorShift;
use llmrt::{Error, Result};
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

fn derr(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::device(format!("{what}: {e:?}"))
}

/// The ceilings measured on device 0.
pub(crate) struct Ceilings {
    /// Copy GB/s counting bytes read and written (`--d2d`).
    pub(crate) bw: Option<f64>,
    /// cuBLAS bf16 GEMM TFLOP/s (`--gemm N`), None when cuBLAS did not load or run.
    pub(crate) tf: Option<f64>,
    /// With `--gemm`: `cuBLAS: <path of the libcublas loaded>` or `cuBLAS: not loaded
    /// (<reason>)` (or the GEMM's failure): the ceiling is optional, the run goes on.
    pub(crate) cublas: Option<String>,
}

/// The ceilings on device 0. Fails only for the device itself (no driver or device, an
/// allocation or copy that fails); cuBLAS missing or failing leaves `tf` None and says
/// why in `cublas`.
pub(crate) fn ceilings(d2d: bool, gemm_n: usize) -> Result<Ceilings> {
    llmrt::backend::cuda::probe()?;
    let ctx = CudaContext::new(0).map_err(|e| derr("cuDevicePrimaryCtxRetain(cuda:0)", e))?;
    let stream = ctx.default_stream();
    let mut bw = None;
    if d2d {
        let n = 4usize << 30;
        let src = stream.alloc_zeros::<u8>(n).map_err(|e| derr("cuMemAlloc 4 GiB", e))?;
        let mut dst = stream.alloc_zeros::<u8>(n).map_err(|e| derr("cuMemAlloc 4 GiB", e))?;
        let mut best = 0f64;
        for i in 0..12 {
            stream.synchronize().map_err(|e| derr("sync", e))?;
            let t0 = Instant::now();
            stream.memcpy_dtod(&src, &mut dst).map_err(|e| derr("cuMemcpyDtoDAsync", e))?;
            stream.synchronize().map_err(|e| derr("sync", e))?;
            let dt = t0.elapsed().as_secs_f64();
            if i >= 2 {
                best = best.max(2.0 * n as f64 / dt / 1e9);
            }
        }
        bw = Some(best);
    }
    let mut tf = None;
    let mut note = None;
    if gemm_n > 0 {
        match gemm_tflops(&stream, gemm_n) {
            Ok((t, path)) => {
                tf = Some(t);
                note = Some(format!("cuBLAS: {path}"));
            }
            Err(why) => note = Some(why),
        }
    }
    Ok(Ceilings { bw, tf, cublas: note })
}

/// The files of the process's mapped libraries whose name starts with `libcublas`
/// (from /proc/self/maps), joined with ", "; "path unknown" where there is none.
fn loaded_cublas() -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut paths: Vec<&str> = Vec::new();
    for p in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
        let name = p.rsplit('/').next().unwrap_or(p);
        if name.starts_with("libcublas") && !paths.contains(&p) {
            paths.push(p);
        }
    }
    if paths.is_empty() {
        "path unknown (no libcublas in /proc/self/maps)".into()
    } else {
        paths.join(", ")
    }
}

/// The bf16 GEMM rate of cuBLAS on `stream` and the library files loaded, or the line
/// that says why there is none (`cuBLAS: not loaded (...)`, or the failing call).
fn gemm_tflops(stream: &Arc<CudaStream>, n: usize) -> std::result::Result<(f64, String), String> {
    // SAFETY: is_culib_present only tries to dlopen cuBLAS; it calls nothing.
    if !unsafe { cublas::sys::is_culib_present() } {
        return Err("cuBLAS: not loaded (no libcublas.so found by the dynamic loader)".into());
    }
    // cudarc panics when a symbol is missing from the library it found.
    let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| CudaBlas::new(stream.clone())));
    let blas = match made {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Err(format!("cuBLAS: not loaded (cublasCreate: {e:?})")),
        Err(_) => return Err("cuBLAS: not loaded (the library lacks an entry point cudarc needs)".into()),
    };
    let path = loaded_cublas();
    let fail = |e: Error| format!("cuBLAS: loaded ({path}), but the GEMM ceiling failed: {}", e.message);
    let run = || -> Result<f64> {
        let mut r = XorShift::new(0x2545_F491);
        let host: Vec<u16> = (0..n * n).map(|_| half::bf16::from_f32(r.uniform(-0.5, 0.5)).to_bits()).collect();
        let a = stream.clone_htod(&host).map_err(|e| derr("upload A", e))?;
        let b = stream.clone_htod(&host).map_err(|e| derr("upload B", e))?;
        let mut c = stream.alloc_zeros::<u16>(n * n).map_err(|e| derr("alloc C", e))?;
        let ni = i32::try_from(n).map_err(|_| Error::invalid(format!("--gemm {n} does not fit i32")))?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let mut time = |reps: usize| -> Result<f64> {
            stream.synchronize().map_err(|e| derr("sync", e))?;
            let t0 = Instant::now();
            for _ in 0..reps {
                let (ap, _ga) = a.device_ptr(stream);
                let (bp, _gb) = b.device_ptr(stream);
                let (cp, _gc) = c.device_ptr_mut(stream);
                use cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
                // SAFETY: A, B, C each hold n*n bf16 on this context (allocated above); m = n =
                // k = ld = n fit i32; alpha/beta are host f32 (pointer mode host, compute 32F);
                // the handle's stream is `stream`, where the buffers were made.
                unsafe {
                    cublas::result::gemm_ex(
                        *blas.handle(),
                        cublasOperation_t::CUBLAS_OP_N,
                        cublasOperation_t::CUBLAS_OP_N,
                        ni,
                        ni,
                        ni,
                        (&alpha as *const f32).cast::<c_void>(),
                        ap as *const c_void,
                        cudaDataType::CUDA_R_16BF,
                        ni,
                        bp as *const c_void,
                        cudaDataType::CUDA_R_16BF,
                        ni,
                        (&beta as *const f32).cast::<c_void>(),
                        cp as *mut c_void,
                        cudaDataType::CUDA_R_16BF,
                        ni,
                        cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                }
                .map_err(|e| derr("cublasGemmEx bf16", e))?;
            }
            stream.synchronize().map_err(|e| derr("sync after GEMM", e))?;
            Ok(t0.elapsed().as_secs_f64())
        };
        time(3)?;
        let dt = time(10)?;
        Ok(10.0 * 2.0 * (n as f64).powi(3) / dt / 1e12)
    };
    match run() {
        Ok(t) => Ok((t, path)),
        Err(e) => Err(fail(e)),
    }
}
