//! Smoke tests of the CUDA kernels (`llmrt::backend::cuda::CudaKernels`: embedded PTX
//! and NVRTC) against the CPU oracle (tests/cuda_util/reference.rs). Without a CUDA
//! device each device test prints "skipped: no CUDA device (<reason>)" and passes;
//! scripts/gpu-check.sh runs this binary on a GPU machine and collects the `MAXERR` lines.

mod cuda_util;
use cuda_util::{reference, Worst, XorShift};

use half::f16;
use llmrt::backend::cuda::{self, embedded, CudaKernels};
use llmrt::quant::DType;
use llmrt::Status;

/// The kernels on device 0, or None (after saying why) when there is no usable device.
fn device() -> Option<CudaKernels> {
    match cuda::probe() {
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            None
        }
        Ok(devices) => {
            let k = CudaKernels::new(0)
                .unwrap_or_else(|e| panic!("probe found {devices:?} but loading kernels failed: {e}"));
            println!("device: {} | kernels: {}", k.device(), k.source());
            Some(k)
        }
    }
}

const ROWS: &[usize] = &[1, 7, 4096];
const BATCHES: &[usize] = &[1, 3, 8, 11]; // 11: more than one tile of 8 vectors

#[test]
fn probe_never_panics() {
    match cuda::probe() {
        Ok(devices) => {
            assert!(!devices.is_empty());
            for d in &devices {
                println!("{d}");
                println!("  {d:?}");
            }
        }
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            assert!(matches!(e.status, Status::LLMRT_UNSUPPORTED | Status::LLMRT_DEVICE), "{e}");
        }
    }
}

#[test]
fn embedded_kernels_are_complete() {
    let stems: Vec<&str> = embedded::SOURCES.iter().map(|&(s, _)| s).collect();
    assert!(stems.contains(&"norm") && stems.contains(&"matmul"), "sources: {stems:?}");
    println!("embedded sources: {stems:?}; PTX archs: {:?}", embedded::ptx_archs());
    if embedded::PTX.is_empty() {
        println!("no PTX embedded (built without nvcc): kernels will be compiled by NVRTC");
        return;
    }
    assert_eq!(embedded::ptx_archs(), vec![80, 90]);
    for &(stem, sm, ptx) in embedded::PTX {
        let version = ptx.lines().find(|l| l.starts_with(".version")).unwrap_or("?");
        println!("  {stem}.cu sm_{sm}: {} bytes, {version}", ptx.len());
        assert!(ptx.contains(&format!(".target sm_{sm}")), "{stem} sm_{sm}: wrong target");
    }
    for (stem, entries) in [("norm", &["rmsnorm_f32"][..]), ("matmul", &["gemv_f16_f32", "gemv_q8_0_f32"][..])] {
        for &(_, _, ptx) in embedded::PTX.iter().filter(|&&(s, _, _)| s == stem) {
            for e in entries {
                assert!(ptx.contains(&format!(".entry {e}(")), "{stem}: no entry {e}");
            }
        }
    }
}

#[test]
fn rmsnorm_f32_matches_cpu() {
    let Some(k) = device() else { return };
    let mut worst = Worst::verbose("rmsnorm_f32");
    // 77: odd (scalar path); 1000: float4 path, not a power of two
    for &rows in ROWS {
        for &n in &[64usize, 136, 4096, 77, 1000] {
            let mut rng = XorShift::from_parts(&[1, rows, n]);
            let x = rng.vec(rows * n, -2.0, 2.0);
            let w = rng.vec(n, 0.5, 1.5);
            let eps = 1e-5;
            let got = k.rmsnorm_f32(&x, &w, rows, n, eps).expect("rmsnorm_f32");
            let want = reference::rmsnorm_f32(&x, &w, rows, n, eps);
            worst.check(format!("rows={rows} n={n}"), &got, &want, 1e-5);
        }
    }
    worst.report();
}

#[test]
fn gemv_f16_matches_cpu() {
    let Some(k) = device() else { return };
    let mut worst = Worst::verbose("gemv_f16_f32");
    // 64, 136, 4096: 16-byte path (136 = 17 chunks of 8: a partial last warp step);
    // 100, 77: cols % 8 != 0, scalar path
    for &rows in ROWS {
        for &cols in &[64usize, 136, 4096, 100, 77] {
            for &batch in BATCHES {
                let mut rng = XorShift::from_parts(&[2, rows, cols, batch]);
                let w: Vec<f16> = (0..rows * cols).map(|_| f16::from_f32(rng.uniform(-1.0, 1.0))).collect();
                let x = rng.vec(batch * cols, -1.0, 1.0);
                let got = k.gemv_f16(&w, &x, rows, cols, batch).expect("gemv_f16");
                let want = reference::gemv_f16(&w, &x, rows, cols, batch);
                worst.check(format!("rows={rows} cols={cols} batch={batch}"), &got, &want, 1e-4);
            }
        }
    }
    worst.report();
}

/// Random Q8_0 blocks: small f16 scales, quants over the whole int8 range.
fn random_q8_0(rng: &mut XorShift, rows: usize, cols: usize) -> Vec<u8> {
    let (qk, block_bytes) = (DType::Q8_0.block_elems(), DType::Q8_0.block_bytes());
    let nblocks = rows * cols / qk;
    let mut bytes = Vec::with_capacity(nblocks * block_bytes);
    for _ in 0..nblocks {
        bytes.extend_from_slice(&f16::from_f32(rng.uniform(0.001, 0.02)).to_le_bytes());
        bytes.extend((0..qk).map(|_| (rng.next_u64() >> 56) as u8));
    }
    bytes
}

#[test]
fn gemv_q8_0_matches_cpu() {
    let Some(k) = device() else { return };
    let mut worst = Worst::verbose("gemv_q8_0_f32");
    // cols must be a multiple of 32: 64 (2 blocks), 160 (5 blocks: part of a warp step), 4096
    for &rows in ROWS {
        for &cols in &[64usize, 160, 4096] {
            for &batch in BATCHES {
                let mut rng = XorShift::from_parts(&[3, rows, cols, batch]);
                let w = random_q8_0(&mut rng, rows, cols);
                let x = rng.vec(batch * cols, -1.0, 1.0);
                let got = k.gemv_q8_0(&w, &x, rows, cols, batch).expect("gemv_q8_0");
                let want = reference::gemv_q8_0(&w, &x, rows, cols, batch);
                worst.check(format!("rows={rows} cols={cols} batch={batch}"), &got, &want, 1e-4);
            }
        }
    }
    worst.report();
    let err = k.gemv_q8_0(&[0u8; 34 * 4], &[0.0; 136], 1, 136, 1).expect_err("cols % 32 != 0 must be refused");
    assert_eq!(err.status, Status::LLMRT_INVALID_ARGUMENT, "{err}");
}

#[test]
fn nvrtc_compiles_sources() {
    for sm in [80u32, 90] {
        let t0 = std::time::Instant::now();
        match cuda::nvrtc_compile(sm) {
            Err(e) if e.status == Status::LLMRT_UNSUPPORTED => {
                println!("skipped: no NVRTC ({e})");
                return;
            }
            // Headers and libnvrtc-builtins are the environment's business (NVRTC has no
            // headers built in): missing ones are a skip, any other compile error a failure.
            Err(e)
                if ["could not open source file", "cannot open source file", "libnvrtc-builtins"]
                    .iter()
                    .any(|m| e.message.contains(m)) =>
            {
                println!("skipped: NVRTC found but its environment is incomplete (set LLMRT_CUDA_INCLUDE?): {e}");
                return;
            }
            Err(e) => panic!("NVRTC failed: {e}"),
            Ok(ptx) => {
                println!("NVRTC compute_{sm}: {} modules in {:.0} ms", ptx.len(), t0.elapsed().as_secs_f64() * 1e3);
                for (stem, text) in &ptx {
                    let version = text.lines().find(|l| l.starts_with(".version")).unwrap_or("?");
                    println!("  {stem}.cu: {} bytes, {version}", text.len());
                }
                let all: String = ptx.iter().map(|(_, t)| t.as_str()).collect();
                for e in ["rmsnorm_f32", "gemv_f16_f32", "gemv_q8_0_f32"] {
                    assert!(all.contains(&format!(".entry {e}(")), "NVRTC compute_{sm}: no entry {e}");
                }
            }
        }
    }
    // With a device, run the NVRTC-built kernels once each against the twins.
    if let Err(e) = cuda::probe() {
        println!("skipped: no CUDA device ({e}): NVRTC kernels compiled but not run");
        return;
    }
    let k = CudaKernels::with_nvrtc(0).expect("loading NVRTC-compiled kernels");
    println!("device: {} | kernels: {}", k.device(), k.source());
    let (rows, cols, batch) = (257usize, 4096usize, 3usize);
    let mut rng = XorShift::from_parts(&[4, rows, cols, batch]);
    let x = rng.vec(batch * cols, -1.0, 1.0);
    let mut worst = Worst::verbose("nvrtc");
    let g = rng.vec(cols, 0.5, 1.5);
    let got = k.rmsnorm_f32(&x, &g, batch, cols, 1e-6).expect("rmsnorm_f32 (NVRTC)");
    worst.check("rmsnorm_f32".into(), &got, &reference::rmsnorm_f32(&x, &g, batch, cols, 1e-6), 1e-5);
    let w: Vec<f16> = (0..rows * cols).map(|_| f16::from_f32(rng.uniform(-1.0, 1.0))).collect();
    let got = k.gemv_f16(&w, &x, rows, cols, batch).expect("gemv_f16 (NVRTC)");
    worst.check("gemv_f16_f32".into(), &got, &reference::gemv_f16(&w, &x, rows, cols, batch), 1e-4);
    let q = random_q8_0(&mut rng, rows, cols);
    let got = k.gemv_q8_0(&q, &x, rows, cols, batch).expect("gemv_q8_0 (NVRTC)");
    worst.check("gemv_q8_0_f32".into(), &got, &reference::gemv_q8_0(&q, &x, rows, cols, batch), 1e-4);
    worst.report();
}
