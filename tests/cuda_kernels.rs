//! Every device op of `llmrt::backend::cuda::ops::Ops` against its CPU twin (the
//! oracle in tests/cuda_util/reference.rs), on buffers that live on the device, with
//! fresh `llmrt::util::XorShift` inputs per case and outputs poisoned with NaN (every
//! element an op owns must be written; elements past the op's prefix must stay
//! untouched). Tests are named after the op file they check (`norm_*` for
//! src/backend/cuda/ops/norm.rs and kernels/norm.cu, `matmul_*`, `attention_*`, ...).
//!
//! Bounds (relative L2 vs the twin, which accumulates in f64):
//! - GEMV: F32 1e-5; every other type 1e-4 (twin on the same dequantized weights).
//! - cuBLAS (`MatmulPath::Auto`, > 8 tokens): F32 (SGEMM, f32 compute) 1e-4; F16 and
//!   the quantized types (activations rounded to f16, quantized weights dequantized to
//!   f16) and BF16 (activations rounded to bf16) 1e-2.
//! - embed, rope (q, k and the pool), dequantize_to_f16, copy_block, gather_rows, argmax: exact;
//!   scatter_axpy (the experts' weighted sum) bit-identical to the CPU's axpy
//!   (checked as rel_l2 < 1e-6, or equality; the group-quantized types' embeddings bit
//!   for bit).
//! - rmsnorm, add, add_bias, swiglu: 1e-5. attention: 1e-4 (f32 online softmax over f16 K/V).
//! - Fast paths (`FastPaths`), each against its twin and against the plain kernel: fast
//!   F16/BF16 GEMV bit-identical to the plain GEMV; fast Q8_0/Q4_0 GEMV 1e-4;
//!   add_rmsnorm bit-identical to add then rmsnorm; split-KV attention 1e-4 (and 1e-5
//!   against the one-kernel attention).
//!
//! Without a CUDA device every device test prints "skipped: no CUDA device (...)" and
//! passes; scripts/gpu-check.sh runs this binary on a GPU and collects the MAXERR lines.

mod cuda_util;
use cuda_util::{reference, shuffle, Worst, XorShift};

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr};
use half::{bf16, f16};
use llmrt::backend::cuda;
use llmrt::backend::cuda::ops::{
    AttnArgs, AttnScores, AttnShape, DevWeight, FastPaths, KvPool, KvWrite, MatmulPath, Ops, Qkv, RmsNorm, Rope,
};
use llmrt::kv::BLOCK_POSITIONS;
use llmrt::quant::DType;
use llmrt::Status;

struct Dev {
    stream: Arc<CudaStream>,
    /// Every fast path on (whatever the environment says).
    ops: Ops,
    /// Every fast path off: the plain kernels the fast ones are checked against.
    plain: Ops,
    _ctx: Arc<CudaContext>,
}

/// The ops on device 0 (made once per process), or None after saying why.
fn device() -> Option<&'static Dev> {
    static DEV: OnceLock<Option<Dev>> = OnceLock::new();
    let dev = DEV.get_or_init(|| match cuda::probe() {
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            None
        }
        Ok(devices) => {
            let ctx = CudaContext::new(0).unwrap_or_else(|e| panic!("probe found {devices:?} but no context: {e:?}"));
            let stream = ctx.default_stream();
            let mut ops = Ops::new(&ctx, stream.clone(), devices[0].sm())
                .unwrap_or_else(|e| panic!("probe found {devices:?} but loading the ops failed: {e}"));
            ops.set_fast_paths(FastPaths::all(true));
            let mut plain = Ops::new(&ctx, stream.clone(), devices[0].sm()).expect("second Ops");
            plain.set_fast_paths(FastPaths::all(false));
            println!("device: {} | {}", devices[0], ops.describe());
            if !ops.has_cublas() {
                println!("skipped: cuBLAS unavailable, Auto matmul checked on the GEMV path only ({})", ops.describe());
            }
            Some(Dev { stream, ops, plain, _ctx: ctx })
        }
    });
    if dev.is_none() {
        println!("skipped: no CUDA device");
    }
    dev.as_ref()
}

impl Dev {
    fn up<T: DeviceRepr>(&self, host: &[T]) -> CudaSlice<T> {
        self.stream.clone_htod(host).expect("upload")
    }
    fn nan(&self, n: usize) -> CudaSlice<f32> {
        self.up(&vec![f32::NAN; n])
    }
    fn down<T: DeviceRepr + Default + Clone>(&self, d: &CudaSlice<T>) -> Vec<T> {
        self.stream.synchronize().expect("running the kernels (synchronize)");
        let v = self.stream.clone_dtoh(d).expect("download");
        self.stream.synchronize().expect("download (synchronize)");
        v
    }
    fn weight(&self, name: &str, dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> DevWeight {
        DevWeight { name: name.into(), dtype, rows, cols, data: self.up(bytes) }
    }
}

/// Random weight bytes of `dtype`: values in about [-1, 1), small quantization scales.
/// Group-quantized types: random bytes with their f16 fields (scales, offsets) replaced
/// by small ones, so every quant and sub-scale bit pattern occurs.
fn random_weight(rng: &mut XorShift, dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * cols;
    match dtype {
        DType::F32 => (0..n).flat_map(|_| rng.uniform(-1.0, 1.0).to_le_bytes()).collect(),
        DType::F16 => (0..n).flat_map(|_| f16::from_f32(rng.uniform(-1.0, 1.0)).to_le_bytes()).collect(),
        DType::BF16 => (0..n).flat_map(|_| bf16::from_f32(rng.uniform(-1.0, 1.0)).to_le_bytes()).collect(),
        DType::Q8_0 | DType::Q4_0 => {
            let nq = if dtype == DType::Q8_0 { 32 } else { 16 };
            let mut bytes = Vec::with_capacity(n / 32 * dtype.block_bytes());
            for _ in 0..n / 32 {
                bytes.extend_from_slice(&f16::from_f32(rng.uniform(0.002, 0.05)).to_le_bytes());
                bytes.extend((0..nq).map(|_| (rng.next_u64() >> 56) as u8));
            }
            bytes
        }
        _ => {
            // (offset of the scale d, offset of the second f16 field if any: m or dmin).
            let (d_at, m_at): (usize, Option<usize>) = match dtype {
                DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => (0, Some(2)),
                DType::Q2_K => (80, Some(82)),
                DType::Q3_K => (108, None),
                DType::Q6_K => (208, None),
                _ => (0, None), // Q5_0, IQ4_NL, IQ4_XS
            };
            // K-quants multiply d by 6-bit (or 8-bit) sub-scales: smaller d.
            let (lo, hi) = if dtype.block_elems() == 32 { (0.002, 0.05) } else { (0.0001, 0.002) };
            let bb = dtype.block_bytes();
            let mut bytes: Vec<u8> = (0..n / dtype.block_elems() * bb).map(|_| (rng.next_u64() >> 56) as u8).collect();
            for blk in bytes.chunks_exact_mut(bb) {
                blk[d_at..d_at + 2].copy_from_slice(&f16::from_f32(rng.uniform(lo, hi)).to_le_bytes());
                if let Some(m) = m_at {
                    let v = if dtype.block_elems() == 32 { rng.uniform(-0.3, 0.3) } else { rng.uniform(lo, hi) };
                    blk[m..m + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
                }
            }
            bytes
        }
    }
}

fn dtype_tag(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::Q8_0 => "q8_0",
        DType::Q4_0 => "q4_0",
        DType::Q4_1 => "q4_1",
        DType::Q5_0 => "q5_0",
        DType::Q5_1 => "q5_1",
        DType::IQ4_NL => "iq4_nl",
        DType::Q2_K => "q2_k",
        DType::Q3_K => "q3_k",
        DType::Q4_K => "q4_k",
        DType::Q5_K => "q5_k",
        DType::Q6_K => "q6_k",
        DType::IQ4_XS => "iq4_xs",
    }
}

/// Column counts for tests over every type: a few multiples of the block (F32/F16/BF16:
/// also widths that are not multiples of 8 or 32).
fn widths(dtype: DType, float: &'static [usize], q32: &'static [usize], k256: &'static [usize]) -> &'static [usize] {
    match dtype.block_elems() {
        1 => float,
        32 => q32,
        _ => k256,
    }
}

/// The elements past an op's prefix are still NaN (the op touched only its prefix).
fn assert_tail_nan(op: &str, case: &str, got: &[f32], prefix: usize) {
    if let Some(i) = got[prefix..].iter().position(|v| !v.is_nan()) {
        panic!("{op}: {case}: element {} past the op's {prefix} was written", prefix + i);
    }
}

const TAIL: usize = 5;

#[test]
fn embed_matches_cpu_for_every_dtype() {
    let Some(d) = device() else { return };
    for dtype in DType::all() {
        let mut worst = Worst::new(format!("embed_{}", dtype_tag(dtype)));
        let hiddens = widths(dtype, &[16, 77, 96, 4096], &[32, 96, 4096], &[256, 768, 4096]);
        for &vocab in &[1usize, 37, 1000] {
            for &hidden in hiddens {
                for &n in &[1usize, 5, 19] {
                    let mut rng = XorShift::from_parts(&[10, dtype.ggml_id() as usize, vocab, hidden, n]);
                    let table = random_weight(&mut rng, dtype, vocab, hidden);
                    let mut ids: Vec<u32> = (0..n).map(|_| rng.below(vocab) as u32).collect();
                    ids[n - 1] = vocab as u32 - 1;
                    let w = d.weight("table", dtype, vocab, hidden, &table);
                    let ids_d = d.up(&ids);
                    let mut out = d.nan(n * hidden + TAIL);
                    d.ops.embed(&w, &ids_d, n, &mut out).expect("embed");
                    let got = d.down(&out);
                    let case = format!("vocab={vocab} hidden={hidden} n={n}");
                    assert_tail_nan("embed", &case, &got, n * hidden);
                    let want = reference::embed(dtype, &table, vocab, hidden, &ids);
                    if dtype.is_grouped() {
                        // The device layouts (kernels/common.cuh) are quant::groups' bit for bit.
                        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                            assert_eq!(g.to_bits(), w.to_bits(), "embed {dtype} {case}: element {i}: {g} != {w}");
                        }
                    }
                    worst.check(case, &got[..n * hidden], &want, 1e-6);
                }
            }
        }
        worst.report();
    }
    // An id past the table is a NaN row (device guard), not an out-of-bounds read.
    let mut rng = XorShift::from_parts(&[11]);
    let table = random_weight(&mut rng, DType::F16, 4, 64);
    let w = d.weight("table", DType::F16, 4, 64, &table);
    let mut out = d.nan(2 * 64);
    d.ops.embed(&w, &d.up(&[1u32, 4]), 2, &mut out).expect("embed with a bad id");
    let got = d.down(&out);
    assert!(got[..64].iter().all(|v| v.is_finite()) && got[64..].iter().all(|v| v.is_nan()));
}

#[test]
fn norm_rmsnorm_matches_cpu_out_of_place_and_in_place() {
    let Some(d) = device() else { return };
    let mut worst = Worst::new("rmsnorm");
    let mut worst_ip = Worst::new("rmsnorm_inplace");
    for &rows in &[1usize, 7, 33] {
        for &n in &[16usize, 77, 128, 1000, 4096] {
            let mut rng = XorShift::from_parts(&[20, rows, n]);
            let x = rng.vec(rows * n, -2.0, 2.0);
            let w = rng.vec(n, 0.5, 1.5);
            let case = format!("rows={rows} n={n}");
            let (x_d, w_d) = (d.up(&x), d.up(&w));
            let mut y = d.nan(rows * n + TAIL);
            d.ops.rmsnorm(RmsNorm { w: &w_d, eps: 1e-6 }, &x_d, rows, n, &mut y).expect("rmsnorm");
            let got = d.down(&y);
            assert_tail_nan("rmsnorm", &case, &got, rows * n);
            let want = reference::rmsnorm_f32(&x, &w, rows, n, 1e-6);
            worst.check(case.clone(), &got[..rows * n], &want, 1e-5);
            // In place, on a buffer with a NaN tail that must stay NaN.
            let mut xt = x.clone();
            xt.extend([f32::NAN; TAIL]);
            let mut x_ip = d.up(&xt);
            d.ops.rmsnorm_inplace(RmsNorm { w: &w_d, eps: 1e-6 }, &mut x_ip, rows, n).expect("rmsnorm_inplace");
            let got = d.down(&x_ip);
            assert_tail_nan("rmsnorm_inplace", &case, &got, rows * n);
            worst_ip.check(case, &got[..rows * n], &want, 1e-5);
        }
    }
    worst.report();
    worst_ip.report();
    let err = d
        .ops
        .rmsnorm(RmsNorm { w: &d.up(&[1.0f32; 4]), eps: 1e-6 }, &d.up(&[1.0f32; 8]), 2, 4, &mut d.nan(7))
        .expect_err("short y");
    assert_eq!(err.status, Status::LLMRT_INVALID_ARGUMENT, "{err}");
}

#[test]
fn matmul_matches_cpu_for_every_dtype_on_both_paths() {
    let Some(d) = device() else { return };
    let blas = d.ops.has_cublas();
    for dtype in DType::all() {
        let tag = dtype_tag(dtype);
        let mut w_gemv = Worst::new(format!("matmul_gemv_{tag}"));
        let mut w_auto = Worst::new(format!("matmul_{}_{tag}", if blas { "cublas" } else { "auto_gemv" }));
        let gemv_tol = if dtype == DType::F32 { 1e-5 } else { 1e-4 };
        let blas_tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
        let shapes: &[(usize, usize)] = match dtype.block_elems() {
            1 => &[(1, 16), (7, 77), (33, 100), (64, 256), (300, 1024), (512, 2048)],
            32 => &[(1, 32), (7, 64), (33, 160), (64, 256), (300, 1024), (512, 2048)],
            _ => &[(1, 256), (7, 512), (33, 768), (300, 1024), (512, 2048)],
        };
        for &(rows, cols) in shapes {
            let tokens: &[usize] = if rows >= 300 { &[1, 9, 33] } else { &[1, 3, 8, 9, 11, 17, 33] };
            for &n in tokens {
                let mut rng = XorShift::from_parts(&[30, dtype.ggml_id() as usize, rows, cols, n]);
                let wb = random_weight(&mut rng, dtype, rows, cols);
                let x = rng.vec(n * cols, -1.0, 1.0);
                let w = d.weight("w", dtype, rows, cols, &wb);
                let x_d = d.up(&x);
                let want = reference::matmul(dtype, &wb, rows, cols, &x, n);
                let case = format!("rows={rows} cols={cols} n={n}");
                for path in [MatmulPath::Gemv, MatmulPath::Auto] {
                    let mut y = d.nan(n * rows + TAIL);
                    d.ops.matmul(&w, &x_d, n, &mut y, path).expect("matmul");
                    let got = d.down(&y);
                    assert_tail_nan("matmul", &case, &got, n * rows);
                    let via_blas = path == MatmulPath::Auto && blas && n > 8;
                    match path {
                        MatmulPath::Gemv => w_gemv.check(case.clone(), &got[..n * rows], &want, gemv_tol),
                        MatmulPath::Auto => w_auto.check(
                            format!("{case}{}", if via_blas { " cublas" } else { " gemv" }),
                            &got[..n * rows],
                            &want,
                            if via_blas { blas_tol } else { gemv_tol },
                        ),
                    }
                }
            }
        }
        w_gemv.report();
        w_auto.report();
    }
    // Refusals: Q8_0 with cols % 32 != 0, a short y.
    let w = d.weight("w", DType::Q8_0, 1, 40, &[0u8; 34 * 2]);
    let err = d.ops.matmul(&w, &d.up(&[0.0f32; 40]), 1, &mut d.nan(1), MatmulPath::Gemv).expect_err("cols % 32");
    assert_eq!(err.status, Status::LLMRT_INVALID_ARGUMENT, "{err}");
    // Q4_K with cols % 256 != 0 (a multiple of 32: rows of whole groups, not of super-blocks).
    let w = d.weight("w", DType::Q4_K, 1, 288, &[0u8; 144 * 2]);
    let err = d.ops.matmul(&w, &d.up(&[0.0f32; 288]), 1, &mut d.nan(1), MatmulPath::Gemv).expect_err("cols % 256");
    assert_eq!(err.status, Status::LLMRT_INVALID_ARGUMENT, "{err}");
    let w = d.weight("w", DType::F32, 3, 4, &[0u8; 48]);
    let err = d.ops.matmul(&w, &d.up(&[0.0f32; 8]), 2, &mut d.nan(5), MatmulPath::Auto).expect_err("short y");
    assert_eq!(err.status, Status::LLMRT_INVALID_ARGUMENT, "{err}");
}

#[test]
fn matmul_gemv_is_batch_invariant_bit_for_bit() {
    let Some(d) = device() else { return };
    let mut worst = Worst::new("gemv_batch_invariance");
    for dtype in DType::all() {
        for &(rows, cols) in &[(67usize, 256usize), (33, 4096)] {
            let mut rng = XorShift::from_parts(&[40, dtype.ggml_id() as usize, rows, cols]);
            let wb = random_weight(&mut rng, dtype, rows, cols);
            let w = d.weight("w", dtype, rows, cols, &wb);
            let x = rng.vec(11 * cols, -1.0, 1.0);
            let mut y = d.nan(11 * rows);
            d.ops.matmul(&w, &d.up(&x), 11, &mut y, MatmulPath::Gemv).expect("matmul batch 11");
            let full = d.down(&y);
            for &b in &[1usize, 3, 8, 11] {
                for &start in &[0usize, 3, 8] {
                    if start + b > 11 {
                        continue;
                    }
                    let xs = &x[start * cols..(start + b) * cols];
                    for path in [MatmulPath::Gemv, MatmulPath::Auto] {
                        if path == MatmulPath::Auto && b > 8 {
                            continue; // cuBLAS: not batch-invariant by design
                        }
                        let mut ys = d.nan(b * rows);
                        d.ops.matmul(&w, &d.up(xs), b, &mut ys, path).expect("matmul sub-batch");
                        let got = d.down(&ys);
                        let want = &full[start * rows..(start + b) * rows];
                        for (i, (g, w)) in got.iter().zip(want).enumerate() {
                            assert_eq!(
                                g.to_bits(),
                                w.to_bits(),
                                "{dtype} rows={rows} cols={cols}: vector {} alone in a batch of {b} ({path:?}) gives {g}, in the batch of 11 {w}",
                                start + i / rows
                            );
                        }
                        worst.exact(format!("{dtype} rows={rows} cols={cols} b={b} start={start}"));
                    }
                }
            }
        }
    }
    worst.report();
}

#[test]
fn matmul_dequantize_to_f16_is_exact() {
    let Some(d) = device() else { return };
    let mut worst = Worst::new("dequantize_to_f16");
    for dtype in DType::all().into_iter().filter(|&d| d != DType::F16) {
        for (rows, &cols) in
            [1usize, 7, 130].into_iter().zip(widths(dtype, &[32, 96, 1024], &[32, 96, 1024], &[256, 768, 1024]))
        {
            let mut rng = XorShift::from_parts(&[50, dtype.ggml_id() as usize, rows, cols]);
            let wb = random_weight(&mut rng, dtype, rows, cols);
            let w = d.weight("w", dtype, rows, cols, &wb);
            let mut out = d.up(&vec![f16::NAN; rows * cols + TAIL]);
            d.ops.dequantize_to_f16(&w, &mut out).expect("dequantize_to_f16");
            let got: Vec<f32> = d.down(&out).iter().map(|v| v.to_f32()).collect();
            let case = format!("{dtype} rows={rows} cols={cols}");
            assert_tail_nan("dequantize_to_f16", &case, &got, rows * cols);
            let want: Vec<f32> = reference::dequantize(dtype, &wb, rows, cols)
                .iter()
                .map(|&v| f16::from_f32(v as f32).to_f32())
                .collect();
            assert_eq!(&got[..rows * cols], &want[..], "{case}");
            worst.exact(case);
        }
    }
    worst.report();
}

#[test]
fn elementwise_ops_match_cpu() {
    let Some(d) = device() else { return };
    let (mut wb, mut wa, mut ws) = (Worst::new("add_bias"), Worst::new("add"), Worst::new("swiglu"));
    let (mut wg, mut wsc, mut wcap) = (Worst::new("geglu"), Worst::new("scale"), Worst::new("softcap"));
    for &(rows, n) in &[(1usize, 1usize), (3, 5), (7, 1000), (5, 4097)] {
        let mut rng = XorShift::from_parts(&[60, rows, n]);
        let total = rows * n;
        let case = format!("rows={rows} n={n}");
        let x = rng.vec(total, -4.0, 4.0);
        let b = rng.vec(n, -1.0, 1.0);
        let u = rng.vec(total, -2.0, 2.0);
        let with_tail = |v: &[f32]| -> Vec<f32> { v.iter().copied().chain([f32::NAN; TAIL]).collect() };

        let mut x_d = d.up(&with_tail(&x));
        d.ops.add_bias(&mut x_d, &d.up(&b), rows, n).expect("add_bias");
        let got = d.down(&x_d);
        assert_tail_nan("add_bias", &case, &got, total);
        wb.check(case.clone(), &got[..total], &reference::add_bias(&x, &b), 1e-5);

        let mut x_d = d.up(&with_tail(&x));
        d.ops.add(&mut x_d, &d.up(&u), total).expect("add");
        let got = d.down(&x_d);
        assert_tail_nan("add", &case, &got, total);
        wa.check(case.clone(), &got[..total], &reference::add(&x, &u), 1e-5);

        let mut g_d = d.up(&with_tail(&x));
        d.ops.swiglu(&mut g_d, &d.up(&u), total).expect("swiglu");
        let got = d.down(&g_d);
        assert_tail_nan("swiglu", &case, &got, total);
        ws.check(case.clone(), &got[..total], &reference::swiglu(&x, &u), 1e-5);

        // gemma: GeGLU, the embedding scale, the final soft cap.
        let mut g_d = d.up(&with_tail(&x));
        d.ops.geglu(&mut g_d, &d.up(&u), total).expect("geglu");
        let got = d.down(&g_d);
        assert_tail_nan("geglu", &case, &got, total);
        wg.check(case.clone(), &got[..total], &reference::geglu(&x, &u), 1e-5);
        let mut x_d = d.up(&with_tail(&x));
        d.ops.scale(&mut x_d, 7.9, total).expect("scale");
        let got = d.down(&x_d);
        assert_tail_nan("scale", &case, &got, total);
        let want: Vec<f32> = x.iter().map(|v| v * 7.9).collect();
        wsc.check(case.clone(), &got[..total], &want, 1e-7);
        let mut x_d = d.up(&with_tail(&x));
        d.ops.softcap(&mut x_d, 1.5, total).expect("softcap");
        let got = d.down(&x_d);
        assert_tail_nan("softcap", &case, &got, total);
        let want: Vec<f32> = x.iter().map(|&v| (1.5 * (f64::from(v) / 1.5).tanh()) as f32).collect();
        wcap.check(case, &got[..total], &want, 1e-6);
    }
    wg.report();
    wsc.report();
    wcap.report();
    wb.report();
    wa.report();
    ws.report();
}

#[test]
fn elementwise_gather_rows_matches_cpu() {
    let Some(d) = device() else { return };
    let mut worst = Worst::new("gather_rows");
    for &width in &[1usize, 77, 4096] {
        for &n_idx in &[1usize, 3, 17] {
            let mut rng = XorShift::from_parts(&[70, width, n_idx]);
            let x_rows = 50;
            let x = rng.vec(x_rows * width, -1.0, 1.0);
            let mut idx: Vec<u32> = (0..n_idx).map(|_| rng.below(x_rows) as u32).collect();
            idx[0] = x_rows as u32 - 1;
            let mut out = d.nan(n_idx * width + TAIL);
            d.ops.gather_rows(&d.up(&x), &d.up(&idx), n_idx, width, &mut out).expect("gather_rows");
            let got = d.down(&out);
            let case = format!("width={width} n_idx={n_idx}");
            assert_tail_nan("gather_rows", &case, &got, n_idx * width);
            worst.check(case, &got[..n_idx * width], &reference::gather_rows(&x, &idx, width), 1e-6);
        }
    }
    worst.report();
}

/// The experts' weighted scatter-add: bit-identical to the CPU's axpy per row; rows not
/// listed (and an index past `out_rows`, the kernel's guard) untouched.
#[test]
fn elementwise_scatter_axpy_matches_cpu_bit_for_bit() {
    let Some(d) = device() else { return };
    let mut worst = Worst::new("scatter_axpy");
    for &width in &[1usize, 77, 4096] {
        for &n_idx in &[1usize, 3, 17] {
            let mut rng = XorShift::from_parts(&[71, width, n_idx]);
            let out_rows = 50;
            let out0 = rng.vec(out_rows * width, -1.0, 1.0);
            let y = rng.vec(n_idx * width, -3.0, 3.0);
            let w = rng.vec(n_idx, 0.0, 1.0);
            let mut rows: Vec<u32> = (0..out_rows as u32).collect();
            shuffle(&mut rng, &mut rows);
            let mut idx = rows[..n_idx].to_vec();
            let mut want = out0.clone();
            reference::scatter_axpy(&mut want, &y, &idx, &w, width);
            // The last index is out of range: the kernel skips that row of y.
            if n_idx > 1 {
                idx[n_idx - 1] = out_rows as u32 + 3;
                want.clone_from(&out0);
                reference::scatter_axpy(&mut want, &y, &idx[..n_idx - 1], &w, width);
            }
            let mut out = d.up(&out0.iter().copied().chain([f32::NAN; TAIL]).collect::<Vec<_>>());
            d.ops
                .scatter_axpy(&mut out, &d.up(&y), &d.up(&idx), &d.up(&w), n_idx, width, out_rows)
                .expect("scatter_axpy");
            let got = d.down(&out);
            let case = format!("width={width} n_idx={n_idx}");
            assert_tail_nan("scatter_axpy", &case, &got, out_rows * width);
            let same = got[..out_rows * width].iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "scatter_axpy {case}: not bit-identical to the CPU's axpy");
            worst.check(case, &got[..out_rows * width], &want, 1e-30);
        }
    }
    worst.report();
}

#[test]
fn elementwise_argmax_takes_the_first_max() {
    let Some(d) = device() else { return };
    let mut worst = Worst::new("argmax");
    let run = |logits: &[f32], rows: usize, vocab: usize, case: &str| {
        let mut out = d.up(&vec![u32::MAX; rows + TAIL]);
        let mut part = d.up(&vec![u32::MAX; Ops::argmax_scratch_len(rows, vocab)]);
        d.ops.argmax(&d.up(logits), rows, vocab, &mut part, &mut out).expect("argmax");
        let got = d.down(&out);
        // The CPU's own argmax (llmrt::util::argmax) row by row: the same ids, bit for bit.
        let want = reference::argmax(logits, vocab);
        assert_eq!(&got[..rows], &want[..], "{case}");
        assert!(got[rows..].iter().all(|&v| v == u32::MAX), "{case}: wrote past rows");
    };
    // 4096 logits per block of the first stage: 4097 and 8192 straddle chunk ends,
    // 128_256 (Llama 3) and 151_936 (Qwen2) are 32 and 38 chunks a row.
    for &vocab in &[1usize, 7, 1000, 4097, 8192, 32000, 128_256, 151_936] {
        for &rows in &[1usize, 3, 9] {
            let mut rng = XorShift::from_parts(&[80, vocab, rows]);
            // Few distinct values: many ties; one row all equal; one with the max last.
            let mut logits: Vec<f32> = (0..rows * vocab).map(|_| (rng.below(8) as f32) - 4.0).collect();
            if rows > 1 {
                logits[vocab..2 * vocab].fill(1.5);
            }
            if rows > 2 {
                logits[3 * vocab - 1] = 100.0;
            }
            let case = format!("vocab={vocab} rows={rows}");
            run(&logits, rows, vocab, &case);
            worst.exact(case);
        }
    }
    // Rows of a 128k vocabulary that test the tie rule across chunks and blocks and the
    // CPU's NaN and -inf rule: NaN never wins, a NaN at index 0 is never beaten (the row
    // gives 0), nothing above -inf gives 0.
    let vocab = 128_256usize;
    const NAN: f32 = f32::NAN;
    const INF: f32 = f32::INFINITY;
    let mut rng = XorShift::from_parts(&[81, vocab]);
    let base: Vec<f32> = rng.vec(vocab, -10.0, 10.0);
    type Edit = fn(&mut [f32]);
    let rows: &[(&str, Edit)] = &[
        ("random", |_| {}),
        ("tie across a chunk end", |r| {
            r[4095] = 50.0;
            r[4096] = 50.0;
        }),
        ("tie in two far chunks", |r| {
            r[130_000.min(r.len() - 1)] = 50.0;
            r[5000] = 50.0;
            r[90_001] = 50.0;
        }),
        ("max at the last index", |r| *r.last_mut().unwrap() = 50.0),
        ("max at index 0 tied later", |r| {
            r[0] = 50.0;
            r[77_777] = 50.0;
        }),
        ("all equal", |r| r.fill(0.25)),
        ("-0 ties +0", |r| {
            r.fill(-1.0);
            r[9000] = -0.0;
            r[8999] = 0.0;
            r[4] = -0.0;
        }),
        ("all -INF", |r| r.fill(-INF)),
        ("-INF then NaN", |r| {
            r.fill(-INF);
            r[100] = NAN;
        }),
        ("NaN at 0, larger later", |r| r[0] = NAN),
        ("NaN in the middle, max after it", |r| {
            r[1000] = NAN;
            r[60_000] = 99.0;
        }),
        ("NaN every other", |r| {
            for v in r.iter_mut().skip(1).step_by(2) {
                *v = NAN;
            }
        }),
        ("+inf twice", |r| {
            r[70_000] = INF;
            r[3] = INF;
        }),
        ("NaN everywhere", |r| r.fill(NAN)),
    ];
    let mut all = Vec::with_capacity(rows.len() * vocab);
    for (_, edit) in rows {
        let mut r = base.clone();
        edit(&mut r);
        all.extend_from_slice(&r);
    }
    let names: Vec<&str> = rows.iter().map(|r| r.0).collect();
    run(&all, rows.len(), vocab, &format!("vocab={vocab} special rows {names:?}"));
    worst.exact(format!("vocab={vocab} special rows"));
    worst.report();
}

/// A pool with every element random (f16 in [-1, 1)), uploaded; returns the host copy.
fn random_pool(d: &Dev, rng: &mut XorShift, n_blocks: usize, n_layers: usize, kv_dim: usize) -> (KvPool, Vec<f16>) {
    let mut kv = KvPool::new(&d.stream, n_blocks, n_layers, kv_dim).expect("KvPool::new");
    let host: Vec<f16> = (0..kv.data.len()).map(|_| f16::from_f32(rng.uniform(-1.0, 1.0))).collect();
    d.stream.memcpy_htod(&host, &mut kv.data).expect("upload pool");
    (kv, host)
}

/// The arguments of every attention launcher: `ids` are the sequence indices,
/// positions and block tables of the step.
fn attn<'a>(
    q: &'a CudaSlice<f32>,
    kv: &'a KvPool,
    layer: usize,
    ids: [&'a CudaSlice<u32>; 3],
    max_blocks: usize,
    n_tokens: usize,
    shape: AttnShape,
) -> AttnArgs<'a> {
    let [seq, pos, block_tables] = ids;
    AttnArgs {
        q,
        kv,
        layer,
        seq,
        pos,
        block_tables,
        max_blocks,
        n_tokens,
        shape,
        scores: AttnScores::plain(shape.head_dim),
    }
}

/// The guard every attention launcher keeps: two tokens of one sequence (heads 2/1,
/// head_dim 16) over a table of 2 blocks, at `positions` (the second past the table).
/// `run` launches on them: the first row must come out finite, the second NaN (the
/// kernel reads nothing past the table).
fn bad_position_gives_nan(
    d: &Dev,
    op: &str,
    positions: [u32; 2],
    run: impl FnOnce(&AttnArgs, &mut CudaSlice<f32>) -> llmrt::Result<()>,
) {
    let shape = AttnShape { n_heads: 2, n_kv_heads: 1, head_dim: 16 };
    let kv = KvPool::new(&d.stream, 2, 1, 16).expect("KvPool::new");
    let (q, seq, pos, table) = (d.up(&[0.5f32; 64]), d.up(&[0u32, 0]), d.up(&positions), d.up(&[1u32, 0]));
    let mut out = d.nan(2 * 32);
    run(&attn(&q, &kv, 0, [&seq, &pos, &table], 2, 2, shape), &mut out)
        .unwrap_or_else(|e| panic!("{op} with a bad position: {e}"));
    let got = d.down(&out);
    assert!(got[..32].iter().all(|v| v.is_finite()), "{op}: the good token");
    assert!(got[32..].iter().all(|v| v.is_nan()), "{op}: a position past the block table must give NaN");
}

const SHAPES: &[(usize, usize, usize)] = &[(8, 2, 32), (4, 4, 16), (4, 1, 128), (2, 2, 256), (6, 3, 80), (2, 1, 64)];

#[test]
fn rope_kv_write_matches_cpu() {
    let Some(d) = device() else { return };
    let (mut wq, mut wk, mut wp) = (Worst::new("rope_q"), Worst::new("rope_k"), Worst::new("rope_kv_pool"));
    let n_layers = 3usize;
    for &(nh, nkv, hd) in SHAPES {
        let shape = AttnShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd };
        let (qd, kvd) = (nh * hd, nkv * hd);
        // Every dimension turned, and (partial rotary, as Phi-4-mini's 0.75) the first
        // three quarters rounded to pairs: the rest must pass unchanged, K's stored.
        for (neox, rot) in [false, true].into_iter().flat_map(|x| [(x, hd), (x, (hd * 3 / 4) & !1)]) {
            // 1000 tokens: a prefill's grid of (token, head) blocks.
            for &(n, layer) in &[(1usize, 0usize), (5, 1), (19, 2), (1000, 1)] {
                let n_blocks = if n > 100 { 64 } else { 8 };
                let mut rng = XorShift::from_parts(&[90, nh, nkv, hd, neox as usize, n, rot]);
                let q = rng.vec(n * qd, -1.0, 1.0);
                let k = rng.vec(n * kvd, -1.0, 1.0);
                let v = rng.vec(n * kvd, -1.0, 1.0);
                let ang: Vec<f32> = rng.vec(n * rot / 2, -3.0, 3.0);
                let cos: Vec<f32> = ang.iter().map(|a| a.cos()).collect();
                let sin: Vec<f32> = ang.iter().map(|a| a.sin()).collect();
                let mut all: Vec<u32> = (0..(n_blocks * BLOCK_POSITIONS) as u32).collect();
                shuffle(&mut rng, &mut all);
                let slots = &all[..n];
                let (mut kv, mut pool) = random_pool(d, &mut rng, n_blocks, n_layers, kvd);
                // Poison the rows the op must write.
                let be = kv.block_elems();
                for &s in slots {
                    let (b, sl) = (s as usize / BLOCK_POSITIONS, s as usize % BLOCK_POSITIONS);
                    for which in 0..2 {
                        let base = b * be + ((layer * 2 + which) * BLOCK_POSITIONS + sl) * kvd;
                        pool[base..base + kvd].fill(f16::NAN);
                    }
                }
                d.stream.memcpy_htod(&pool, &mut kv.data).expect("upload pool");
                let (mut q_d, mut k_d) = (d.up(&q), d.up(&k));
                d.ops
                    .rope_kv_write(
                        Qkv { q: &mut q_d, k: &mut k_d, v: &d.up(&v), n_tokens: n, shape },
                        Rope { cos: &d.up(&cos), sin: &d.up(&sin), neox, dim: rot },
                        KvWrite { kv: &mut kv, layer, slots: &d.up(slots) },
                    )
                    .expect("rope_kv_write");
                let (mut qw, mut kw) = (q.clone(), k.clone());
                reference::rope_kv_write(
                    &mut qw,
                    &mut kw,
                    &v,
                    reference::Rope { cos: &cos, sin: &sin, neox, dim: rot },
                    shape,
                    reference::Pool { kv: &mut pool, n_layers, layer, slots },
                );
                let case = format!("heads={nh}/{nkv} hd={hd} rot={rot} neox={neox} n={n} layer={layer}");
                let (got_q, got_k, got_pool) = (d.down(&q_d), d.down(&k_d), d.down(&kv.data));
                wq.check(case.clone(), &got_q, &qw, 1e-6);
                wk.check(case.clone(), &got_k, &kw, 1e-6);
                let got: Vec<f32> = got_pool.iter().map(|v| v.to_f32()).collect();
                let want: Vec<f32> = pool.iter().map(|v| v.to_f32()).collect();
                wp.check(case.clone(), &got, &want, 1e-6);
                // Unfused f32 products on both sides: the twin's bits exactly.
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
                assert!(bits(&got_q) == bits(&qw), "rope q: {case}: not bit-identical to the CPU twin");
                assert!(bits(&got_k) == bits(&kw), "rope k: {case}: not bit-identical to the CPU twin");
                let pool_bits: Vec<u16> = pool.iter().map(|v| v.to_bits()).collect();
                assert!(
                    got_pool.iter().map(|v| v.to_bits()).eq(pool_bits.iter().copied()),
                    "rope pool: {case}: not bit-identical to the CPU twin"
                );
            }
        }
    }
    wq.report();
    wk.report();
    wp.report();
}

#[test]
fn attention_matches_cpu_gqa_and_mha_over_pages() {
    let Some(d) = device() else { return };
    let mut worst = Worst::new("attention");
    let (n_blocks, n_layers, layer) = (40usize, 2usize, 1usize);
    // Sequences' lengths: one block, three blocks, > 256 positions, exactly one block,
    // one block and one position.
    let lens = [5usize, 37, 300, 16, 17];
    let max_blocks = 20;
    for &(nh, nkv, hd) in SHAPES {
        let shape = AttnShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd };
        let (qd, kvd) = (nh * hd, nkv * hd);
        let mut rng = XorShift::from_parts(&[100, nh, nkv, hd]);
        let (kv, pool) = random_pool(d, &mut rng, n_blocks, n_layers, kvd);
        // Scattered block tables; entries past a sequence's blocks are never read.
        let mut ids: Vec<u32> = (0..n_blocks as u32).collect();
        shuffle(&mut rng, &mut ids);
        let mut tables = vec![u32::MAX; lens.len() * max_blocks];
        let mut next = 0;
        for (s, &len) in lens.iter().enumerate() {
            for b in 0..len.div_ceil(BLOCK_POSITIONS) {
                tables[s * max_blocks + b] = ids[next];
                next += 1;
            }
        }
        // Tokens: decode-like (last position), prefill-like runs, block boundaries.
        let mut toks: Vec<(u32, u32)> =
            vec![(0, 0), (0, 4), (1, 15), (1, 16), (1, 36), (2, 0), (2, 255), (2, 256), (2, 299), (3, 15), (4, 16)];
        shuffle(&mut rng, &mut toks);
        let seq: Vec<u32> = toks.iter().map(|t| t.0).collect();
        let pos: Vec<u32> = toks.iter().map(|t| t.1).collect();
        let n = toks.len();
        let q = rng.vec(n * qd, -2.0, 2.0);
        let mut out = d.nan(n * qd + TAIL);
        d.ops
            .attention(
                &attn(&d.up(&q), &kv, layer, [&d.up(&seq), &d.up(&pos), &d.up(&tables)], max_blocks, n, shape),
                &mut out,
            )
            .expect("attention");
        let got = d.down(&out);
        let case = format!("heads={nh}/{nkv} hd={hd} tokens={n}");
        assert_tail_nan("attention", &case, &got, n * qd);
        let want = reference::attention(&reference::Attn {
            q: &q,
            kv: &pool,
            n_layers,
            layer,
            seq: &seq,
            pos: &pos,
            block_tables: &tables,
            max_blocks,
            shape,
        });
        worst.check(case, &got[..n * qd], &want, 1e-4);

        // One token alone (decode of a single sequence) gives the same row.
        let t = toks.iter().position(|&x| x == (2, 299)).unwrap();
        let mut one = d.nan(qd);
        d.ops
            .attention(
                &attn(
                    &d.up(&q[t * qd..(t + 1) * qd]),
                    &kv,
                    layer,
                    [&d.up(&[2u32]), &d.up(&[299u32]), &d.up(&tables)],
                    max_blocks,
                    1,
                    shape,
                ),
                &mut one,
            )
            .expect("attention, one token");
        assert_eq!(d.down(&one), got[t * qd..(t + 1) * qd].to_vec(), "{nh}/{nkv}/{hd}: one token alone");
    }
    worst.report();

    // Guards: a position past the table gives a NaN row, not an out-of-bounds read;
    // bad shapes are refused.
    bad_position_gives_nan(d, "attention", [3, 32], |a, out| d.ops.attention(a, out));
    let bad = AttnShape { n_heads: 2, n_kv_heads: 1, head_dim: 512 };
    let kv_big = KvPool::new(&d.stream, 1, 1, 512).expect("KvPool::new");
    let err = d
        .ops
        .attention(
            &attn(&d.up(&[0.0f32; 1024]), &kv_big, 0, [&d.up(&[0u32]), &d.up(&[0u32]), &d.up(&[0u32])], 1, 1, bad),
            &mut d.nan(1024),
        )
        .expect_err("head_dim 512");
    assert_eq!(err.status, Status::LLMRT_INVALID_ARGUMENT, "{err}");
}

#[test]
fn kv_pool_alloc_and_copy_block() {
    let Some(d) = device() else { return };
    let mut worst = Worst::new("copy_block");
    let kv = KvPool::new(&d.stream, 3, 2, 24).expect("KvPool::new");
    assert_eq!(kv.data.len(), 3 * kv.block_elems());
    assert!(d.down(&kv.data).iter().all(|v| v.to_f32() == 0.0), "pool starts zeroed");
    let err = KvPool::new(&d.stream, 1 << 20, 64, 8192).err().expect("a 32 TiB pool must fail");
    assert_eq!(err.status, Status::LLMRT_OUT_OF_MEMORY, "{err}");
    println!("  huge pool: {err}");

    let mut rng = XorShift::from_parts(&[110]);
    let (mut kv, mut pool) = random_pool(d, &mut rng, 6, 2, 24);
    let be = kv.block_elems();
    for &(src, dst) in &[(1u32, 4u32), (5, 0), (2, 2), (0, 5)] {
        d.ops.copy_block(&mut kv, src, dst).expect("copy_block");
        let (s, t) = (src as usize, dst as usize);
        let block: Vec<f16> = pool[s * be..(s + 1) * be].to_vec();
        pool[t * be..(t + 1) * be].copy_from_slice(&block);
        let got = d.down(&kv.data);
        let case = format!("{src}->{dst}");
        assert!(got.iter().zip(&pool).all(|(a, b)| a.to_bits() == b.to_bits()), "copy_block {case}");
        worst.exact(case);
    }
    let err = d.ops.copy_block(&mut kv, 6, 0).expect_err("block outside the pool");
    assert_eq!(err.status, Status::LLMRT_INVALID_ARGUMENT, "{err}");
    worst.report();
}

#[test]
fn matmul_fast_gemv_matches_plain_and_cpu() {
    let Some(d) = device() else { return };
    for dtype in [DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0] {
        let tag = dtype_tag(dtype);
        let mut worst = Worst::new(format!("gemv_fast_{tag}"));
        // cols % 256 == 0 takes the fast quantized kernels; 4096 / 14336 are Llama's.
        for &(rows, cols) in &[(5usize, 256usize), (67, 512), (130, 1280), (33, 4096), (9, 14336)] {
            for &n in &[1usize, 2, 8, 11] {
                let mut rng = XorShift::from_parts(&[140, dtype.ggml_id() as usize, rows, cols, n]);
                let wb = random_weight(&mut rng, dtype, rows, cols);
                let x = rng.vec(n * cols, -1.0, 1.0);
                let w = d.weight("w", dtype, rows, cols, &wb);
                let x_d = d.up(&x);
                let mut y = d.nan(n * rows + TAIL);
                d.ops.matmul(&w, &x_d, n, &mut y, MatmulPath::Gemv).expect("fast gemv");
                let got = d.down(&y);
                let case = format!("rows={rows} cols={cols} n={n}");
                assert_tail_nan("gemv_fast", &case, &got, n * rows);
                let want = reference::matmul(dtype, &wb, rows, cols, &x, n);
                worst.check(case.clone(), &got[..n * rows], &want, 1e-4);
                if matches!(dtype, DType::F16 | DType::BF16) {
                    let mut yp = d.nan(n * rows);
                    d.plain.matmul(&w, &x_d, n, &mut yp, MatmulPath::Gemv).expect("plain gemv");
                    let plain = d.down(&yp);
                    for (i, (a, b)) in got.iter().zip(&plain).enumerate() {
                        assert_eq!(a.to_bits(), b.to_bits(), "{tag} {case}: output {i}: fast {a} != plain {b}");
                    }
                }
            }
        }
        worst.report();
    }
}

#[test]
fn norm_add_rmsnorm_equals_add_then_rmsnorm() {
    let Some(d) = device() else { return };
    let mut worst = Worst::new("add_rmsnorm");
    for &rows in &[1usize, 7, 64] {
        for &n in &[16usize, 77, 2048, 4096] {
            let mut rng = XorShift::from_parts(&[150, rows, n]);
            let x = rng.vec(rows * n, -2.0, 2.0);
            let r = rng.vec(rows * n, -2.0, 2.0);
            let w = rng.vec(n, 0.5, 1.5);
            let case = format!("rows={rows} n={n}");
            let (r_d, w_d) = (d.up(&r), d.up(&w));
            let mut x_f = d.up(&x);
            let mut y_f = d.nan(rows * n + TAIL);
            d.ops.add_rmsnorm(RmsNorm { w: &w_d, eps: 1e-5 }, &mut x_f, &r_d, rows, n, &mut y_f).expect("add_rmsnorm");
            let mut x_p = d.up(&x);
            let mut y_p = d.nan(rows * n);
            d.ops.add(&mut x_p, &r_d, rows * n).expect("add");
            d.ops.rmsnorm(RmsNorm { w: &w_d, eps: 1e-5 }, &x_p, rows, n, &mut y_p).expect("rmsnorm");
            let (gx, gy, px, py) = (d.down(&x_f), d.down(&y_f), d.down(&x_p), d.down(&y_p));
            assert_tail_nan("add_rmsnorm", &case, &gy, rows * n);
            for (i, (a, b)) in gx.iter().zip(&px).chain(gy.iter().zip(&py)).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{case}: element {i}: fused {a} != unfused {b}");
            }
            let sum: Vec<f32> = x.iter().zip(&r).map(|(a, b)| a + b).collect();
            worst.check(case, &gy[..rows * n], &reference::rmsnorm_f32(&sum, &w, rows, n, 1e-5), 1e-5);
        }
    }
    worst.report();
}

#[test]
fn attention_split_kv_matches_cpu_and_the_one_kernel_attention() {
    let Some(d) = device() else { return };
    let mut worst = Worst::new("attention_split");
    let mut worst_vs = Worst::new("attention_split_vs_attention");
    let (n_blocks, n_layers, layer) = (100usize, 2usize, 1usize);
    let lens = [5usize, 37, 300, 16, 17, 1000];
    let max_blocks = 63;
    // Groups of 1, 2, 3, 4 and 8 query heads per KV head; head dims 16..256.
    let shapes: &[(usize, usize, usize)] =
        &[(8, 2, 32), (4, 4, 16), (4, 1, 128), (2, 2, 256), (6, 3, 80), (32, 8, 128), (32, 4, 64)];
    for &(nh, nkv, hd) in shapes {
        let shape = AttnShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd };
        let (qd, kvd) = (nh * hd, nkv * hd);
        let mut rng = XorShift::from_parts(&[160, nh, nkv, hd]);
        let (kv, pool) = random_pool(d, &mut rng, n_blocks, n_layers, kvd);
        let mut ids: Vec<u32> = (0..n_blocks as u32).collect();
        shuffle(&mut rng, &mut ids);
        let mut tables = vec![u32::MAX; lens.len() * max_blocks];
        let mut next = 0;
        for (s, &len) in lens.iter().enumerate() {
            for b in 0..len.div_ceil(BLOCK_POSITIONS) {
                tables[s * max_blocks + b] = ids[next];
                next += 1;
            }
        }
        // Decode-like tokens: one per sequence at its last position, and a few more.
        let toks: Vec<(u32, u32)> = vec![(0, 4), (1, 36), (2, 299), (3, 15), (4, 16), (5, 999), (2, 0), (5, 511)];
        let seq: Vec<u32> = toks.iter().map(|t| t.0).collect();
        let pos: Vec<u32> = toks.iter().map(|t| t.1).collect();
        let n = toks.len();
        let q = rng.vec(n * qd, -2.0, 2.0);
        let (q_d, seq_d, pos_d, tab_d) = (d.up(&q), d.up(&seq), d.up(&pos), d.up(&tables));
        let want = reference::attention(&reference::Attn {
            q: &q,
            kv: &pool,
            n_layers,
            layer,
            seq: &seq,
            pos: &pos,
            block_tables: &tables,
            max_blocks,
            shape,
        });
        let mut one = d.nan(n * qd);
        d.ops
            .attention(&attn(&q_d, &kv, layer, [&seq_d, &pos_d, &tab_d], max_blocks, n, shape), &mut one)
            .expect("attention");
        let one = d.down(&one);
        // The planned split, and every split length by hand.
        let planned = d.ops.split_plan(n, nkv, max_blocks);
        for split in [planned, (max_blocks, 16), (max_blocks.div_ceil(2), 32), (max_blocks.div_ceil(4), 64)] {
            let (po, pm) = Ops::split_scratch_len(n, shape, split.0);
            let (mut part_o, mut part_ml) = (d.nan(po), d.nan(pm));
            let mut out = d.nan(n * qd + TAIL);
            d.ops
                .attention_split(
                    &attn(&q_d, &kv, layer, [&seq_d, &pos_d, &tab_d], max_blocks, n, shape),
                    split,
                    &mut part_o,
                    &mut part_ml,
                    &mut out,
                )
                .expect("attention_split");
            let got = d.down(&out);
            let case = format!("heads={nh}/{nkv} hd={hd} split={split:?}");
            assert_tail_nan("attention_split", &case, &got, n * qd);
            worst.check(case.clone(), &got[..n * qd], &want, 1e-4);
            worst_vs.check(case, &got[..n * qd], &one, 1e-5);
        }
        // Batch invariance: token (2, 299) alone, with a block table of its own 19 blocks
        // (another max_blocks, so another number of splits), gives the same bits as in the
        // batch with the planned split.
        let t = 2usize;
        let own: Vec<u32> = tables[2 * max_blocks..2 * max_blocks + 19].to_vec();
        let (po, pm) = Ops::split_scratch_len(1, shape, d.ops.split_plan(1, nkv, 19).0);
        let (mut part_o, mut part_ml, mut alone) = (d.nan(po), d.nan(pm), d.nan(qd));
        d.ops
            .attention_split(
                &attn(
                    &d.up(&q[t * qd..(t + 1) * qd]),
                    &kv,
                    layer,
                    [&d.up(&[0u32]), &d.up(&[299u32]), &d.up(&own)],
                    19,
                    1,
                    shape,
                ),
                d.ops.split_plan(1, nkv, 19),
                &mut part_o,
                &mut part_ml,
                &mut alone,
            )
            .expect("attention_split alone");
        let (po, pm) = Ops::split_scratch_len(n, shape, planned.0);
        let (mut part_o, mut part_ml, mut batch) = (d.nan(po), d.nan(pm), d.nan(n * qd));
        d.ops
            .attention_split(
                &attn(&q_d, &kv, layer, [&seq_d, &pos_d, &tab_d], max_blocks, n, shape),
                planned,
                &mut part_o,
                &mut part_ml,
                &mut batch,
            )
            .expect("attention_split batch");
        let (alone, batch) = (d.down(&alone), d.down(&batch));
        for (j, (a, b)) in alone.iter().zip(&batch[t * qd..(t + 1) * qd]).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "heads={nh}/{nkv} hd={hd}: dim {j} alone {a} != in the batch {b}");
        }
    }
    worst.report();
    worst_vs.report();

    // Guards: a position past the table gives a NaN row; a group of 16 and splits that
    // do not cover the table are refused.
    let shape = AttnShape { n_heads: 2, n_kv_heads: 1, head_dim: 16 };
    let kv = KvPool::new(&d.stream, 2, 1, 16).expect("KvPool::new");
    let (mut po, mut pm) = (d.nan(2 * 2 * 2 * 16), d.nan(2 * 2 * 2 * 2));
    let mut out = d.nan(2 * 32);
    bad_position_gives_nan(d, "attention_split", [3, 32], |a, out| {
        d.ops.attention_split(a, (2, 16), &mut po, &mut pm, out)
    });
    let err = d
        .ops
        .attention_split(
            &attn(&d.up(&[0.5f32; 64]), &kv, 0, [&d.up(&[0u32]), &d.up(&[3u32]), &d.up(&[1u32, 0])], 2, 1, shape),
            (1, 16),
            &mut po,
            &mut pm,
            &mut out,
        )
        .expect_err("splits short of the table");
    assert_eq!(err.status, Status::LLMRT_INVALID_ARGUMENT, "{err}");
    let g16 = AttnShape { n_heads: 16, n_kv_heads: 1, head_dim: 16 };
    let err = d
        .ops
        .attention_split(
            &attn(&d.up(&[0.5f32; 256]), &kv, 0, [&d.up(&[0u32]), &d.up(&[3u32]), &d.up(&[1u32, 0])], 2, 1, g16),
            (2, 16),
            &mut po,
            &mut pm,
            &mut d.nan(256),
        )
        .expect_err("group of 16");
    assert_eq!(err.status, Status::LLMRT_INVALID_ARGUMENT, "{err}");
}

/// The merge of a 32k-position decode: 1024 splits of 32 positions, shared by the merge
/// block's warps (heads reduced to 2 query / 1 KV head of 64 so the emulator stays fast).
#[test]
fn attention_split_kv_merges_1024_splits_of_a_32k_context() {
    let Some(d) = device() else { return };
    let mut worst = Worst::verbose("attention_split_32k");
    let mut worst_vs = Worst::verbose("attention_split_32k_vs_attention");
    let shape = AttnShape { n_heads: 2, n_kv_heads: 1, head_dim: 64 };
    let (n_layers, layer, ctx) = (1usize, 0usize, 32_768usize);
    let max_blocks = ctx / BLOCK_POSITIONS;
    let (qd, kvd) = (shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim);
    let mut rng = XorShift::from_parts(&[170, ctx]);
    let (kv, pool) = random_pool(d, &mut rng, max_blocks, n_layers, kvd);
    let mut tables: Vec<u32> = (0..max_blocks as u32).collect();
    shuffle(&mut rng, &mut tables);
    // The last position, one mid-way (a split part-full), one early (most splits empty).
    let pos: Vec<u32> = vec![32_767, 20_000, 40];
    let seq = vec![0u32; pos.len()];
    let n = pos.len();
    let q = rng.vec(n * qd, -2.0, 2.0);
    let (q_d, seq_d, pos_d, tab_d) = (d.up(&q), d.up(&seq), d.up(&pos), d.up(&tables));
    let want = reference::attention(&reference::Attn {
        q: &q,
        kv: &pool,
        n_layers,
        layer,
        seq: &seq,
        pos: &pos,
        block_tables: &tables,
        max_blocks,
        shape,
    });
    let args = attn(&q_d, &kv, layer, [&seq_d, &pos_d, &tab_d], max_blocks, n, shape);
    let mut one = d.nan(n * qd);
    d.ops.attention(&args, &mut one).expect("attention");
    let one = d.down(&one);
    let split = d.ops.split_plan(n, shape.n_kv_heads, max_blocks);
    assert_eq!(split.0, 1024, "32k positions in splits of 32");
    let (po, pm) = Ops::split_scratch_len(n, shape, split.0);
    let (mut part_o, mut part_ml, mut out) = (d.nan(po), d.nan(pm), d.nan(n * qd + TAIL));
    d.ops.attention_split(&args, split, &mut part_o, &mut part_ml, &mut out).expect("attention_split");
    let got = d.down(&out);
    let case = format!("ctx={ctx} splits={} positions={pos:?}", split.0);
    assert_tail_nan("attention_split", &case, &got, n * qd);
    worst.check(case.clone(), &got[..n * qd], &want, 1e-4);
    worst_vs.check(case, &got[..n * qd], &one, 1e-5);
    // Token 40 alone over its own 3 blocks (2 splits) gives the bits it gets among 1024
    // splits: the 1022 empty ones add exactly nothing.
    let own = &tables[..3];
    let split1 = d.ops.split_plan(1, 1, 3);
    let (po, pm) = Ops::split_scratch_len(1, shape, split1.0);
    let (mut part_o, mut part_ml, mut alone) = (d.nan(po), d.nan(pm), d.nan(qd));
    let (q1, s1, p1, t1) = (d.up(&q[2 * qd..3 * qd]), d.up(&[0u32]), d.up(&[40u32]), d.up(own));
    d.ops
        .attention_split(
            &attn(&q1, &kv, layer, [&s1, &p1, &t1], 3, 1, shape),
            split1,
            &mut part_o,
            &mut part_ml,
            &mut alone,
        )
        .expect("attention_split alone");
    let alone = d.down(&alone);
    for (j, (a, b)) in alone.iter().zip(&got[2 * qd..3 * qd]).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "dim {j}: alone {a} != among 1024 splits {b}");
    }
    worst.report();
    worst_vs.report();
}

#[test]
fn attention_tiled_prefill_matches_cpu_and_the_one_kernel_attention() {
    let Some(d) = device() else { return };
    let mut worst = Worst::new("attention_prefill");
    let mut worst_vs = Worst::new("attention_prefill_vs_attention");
    let (n_blocks, n_layers, layer) = (60usize, 2usize, 0usize);
    let max_blocks = 24;
    // head_dim a multiple of 8 (16-byte K/V loads): 16 .. 256, groups 1 .. 8.
    let shapes: &[(usize, usize, usize)] = &[(8, 2, 32), (4, 4, 16), (4, 1, 128), (2, 2, 256), (6, 3, 80), (32, 4, 64)];
    for &(nh, nkv, hd) in shapes {
        let shape = AttnShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd };
        let (qd, kvd) = (nh * hd, nkv * hd);
        let mut rng = XorShift::from_parts(&[170, nh, nkv, hd]);
        let (kv, pool) = random_pool(d, &mut rng, n_blocks, n_layers, kvd);
        let mut ids: Vec<u32> = (0..n_blocks as u32).collect();
        shuffle(&mut rng, &mut ids);
        // Three sequences: a fresh prefill of 37 tokens (3 tiles), a continuation of 20
        // tokens at positions 300..320 (crossing blocks), a single token at position 16.
        let runs: [(u32, usize); 3] = [(0, 37), (300, 20), (16, 1)];
        let (tables, seq, pos, tiles) = prefill_runs(&runs, &ids, max_blocks, |_| 0);
        let n = seq.len();
        let q = rng.vec(n * qd, -2.0, 2.0);
        let (q_d, seq_d, pos_d, tab_d) = (d.up(&q), d.up(&seq), d.up(&pos), d.up(&tables));
        let mut out = d.nan(n * qd + TAIL);
        d.ops
            .attention_prefill(
                &attn(&q_d, &kv, layer, [&seq_d, &pos_d, &tab_d], max_blocks, n, shape),
                &d.up(&tiles),
                tiles.len() / 2,
                &mut out,
            )
            .expect("attention_prefill");
        let got = d.down(&out);
        let case = format!("heads={nh}/{nkv} hd={hd} tokens={n}");
        assert_tail_nan("attention_prefill", &case, &got, n * qd);
        let want = reference::attention(&reference::Attn {
            q: &q,
            kv: &pool,
            n_layers,
            layer,
            seq: &seq,
            pos: &pos,
            block_tables: &tables,
            max_blocks,
            shape,
        });
        worst.check(case.clone(), &got[..n * qd], &want, 1e-4);
        let mut one = d.nan(n * qd);
        d.ops
            .attention(&attn(&q_d, &kv, layer, [&seq_d, &pos_d, &tab_d], max_blocks, n, shape), &mut one)
            .expect("attention");
        worst_vs.check(case, &got[..n * qd], &d.down(&one), 1e-5);
    }
    worst.report();
    worst_vs.report();

    // Stale slots: a block reused from a freed sequence may hold Inf (f16 overflow) or NaN
    // past the tile's last position. The one-kernel attention never reads them; the tiled
    // kernel stages the whole block, and its weight 0 times Inf would poison every row.
    {
        let shape = AttnShape { n_heads: 4, n_kv_heads: 2, head_dim: 32 };
        let (n_layers, kvd, qd) = (1usize, 64usize, 128usize);
        let mut rng = XorShift::from_parts(&[171]);
        let (mut kv, mut pool) = random_pool(d, &mut rng, 4, n_layers, kvd);
        let be = n_layers * 2 * BLOCK_POSITIONS * kvd;
        // Block 1, slot 10 (position 26 of the sequence below, past its last position 19):
        // K and V of every KV head set to +Inf and NaN.
        for dd in 0..kvd {
            pool[be + 10 * kvd + dd] = f16::INFINITY;
            pool[be + BLOCK_POSITIONS * kvd + 10 * kvd + dd] = if dd % 2 == 0 { f16::INFINITY } else { f16::NAN };
        }
        d.stream.memcpy_htod(&pool, &mut kv.data).expect("upload pool");
        let tables = [2u32, 1];
        let (seq, pos): (Vec<u32>, Vec<u32>) = (0..20u32).map(|i| (0, i)).unzip();
        let n = seq.len();
        let q = rng.vec(n * qd, -2.0, 2.0);
        let (q_d, seq_d, pos_d, tab_d) = (d.up(&q), d.up(&seq), d.up(&pos), d.up(&tables));
        let mut out = d.nan(n * qd);
        d.ops
            .attention_prefill(
                &attn(&q_d, &kv, 0, [&seq_d, &pos_d, &tab_d], 2, n, shape),
                &d.up(&[0u32, 16, 16, 4]),
                2,
                &mut out,
            )
            .expect("attention_prefill over a stale slot");
        let got = d.down(&out);
        assert!(got.iter().all(|v| v.is_finite()), "a stale Inf/NaN slot past the tile's end reached the output");
        let want = reference::attention(&reference::Attn {
            q: &q,
            kv: &pool,
            n_layers,
            layer: 0,
            seq: &seq,
            pos: &pos,
            block_tables: &tables,
            max_blocks: 2,
            shape,
        });
        let mut w = Worst::new("attention_prefill_stale_slot");
        w.check("stale Inf/NaN past the end".to_string(), &got, &want, 1e-4);
        w.report();
    }

    // Guards: a tile reaching past the table gives NaN rows; head_dim % 8 != 0 is refused.
    // (Tiles: token 0 alone, token 1 alone.)
    let tiles = d.up(&[0u32, 1, 1, 1]);
    bad_position_gives_nan(d, "attention_prefill", [31, 32], |a, out| d.ops.attention_prefill(a, &tiles, 2, out));
    let odd = AttnShape { n_heads: 2, n_kv_heads: 1, head_dim: 20 };
    let kv20 = KvPool::new(&d.stream, 1, 1, 20).expect("KvPool::new");
    let err = d
        .ops
        .attention_prefill(
            &attn(&d.up(&[0.0f32; 40]), &kv20, 0, [&d.up(&[0u32]), &d.up(&[0u32]), &d.up(&[0u32])], 1, 1, odd),
            &d.up(&[0u32, 1]),
            1,
            &mut d.nan(40),
        )
        .expect_err("head_dim 20");
    assert_eq!(err.status, Status::LLMRT_INVALID_ARGUMENT, "{err}");
}

#[test]
fn matmul_fused_decode_launches_equal_the_separate_ops() {
    let Some(d) = device() else { return };
    let mut worst = Worst::new("gemv3_and_gemv_swiglu");
    for dtype in [DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0] {
        let tag = dtype_tag(dtype);
        // (q rows, kv rows, ffn rows, cols): GQA-like shapes; 4096 / 14336 are Llama's.
        for &(rq, rkv, rf, cols) in &[(64usize, 16usize, 96usize, 256usize), (130, 33, 200, 512), (256, 64, 700, 4096)]
        {
            for &n in &[1usize, 3, 8, 11] {
                let mut rng = XorShift::from_parts(&[180, dtype.ggml_id() as usize, rq, cols, n]);
                let ws: Vec<Vec<u8>> =
                    [rq, rkv, rkv, rf, rf].iter().map(|&r| random_weight(&mut rng, dtype, r, cols)).collect();
                let dw: Vec<DevWeight> =
                    ws.iter().zip([rq, rkv, rkv, rf, rf]).map(|(b, r)| d.weight("w", dtype, r, cols, b)).collect();
                let x = rng.vec(n * cols, -1.0, 1.0);
                let x_d = d.up(&x);
                let case = format!("{tag} rq={rq} rkv={rkv} rf={rf} cols={cols} n={n}");
                // Q, K, V in one launch vs three.
                let (mut q, mut k, mut v) = (d.nan(n * rq + TAIL), d.nan(n * rkv + TAIL), d.nan(n * rkv + TAIL));
                let fused =
                    d.ops.matmul3([&dw[0], &dw[1], &dw[2]], &x_d, n, [&mut q, &mut k, &mut v]).expect("matmul3");
                assert!(fused, "{case}: the fused kernel should apply");
                for (i, (buf, rows)) in [(&q, rq), (&k, rkv), (&v, rkv)].into_iter().enumerate() {
                    let got = d.down(buf);
                    assert_tail_nan("matmul3", &case, &got, n * rows);
                    let mut y = d.nan(n * rows);
                    d.ops.matmul(&dw[i], &x_d, n, &mut y, MatmulPath::Gemv).expect("matmul");
                    let want = d.down(&y);
                    for (j, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{case}: matrix {i} output {j}: fused {a} != separate {b}"
                        );
                    }
                }
                // Gate, up, SwiGLU in one launch vs three.
                let mut y = d.nan(n * rf + TAIL);
                assert!(d.ops.matmul_swiglu(&dw[3], &dw[4], &x_d, n, &mut y).expect("matmul_swiglu"), "{case}");
                let got = d.down(&y);
                assert_tail_nan("matmul_swiglu", &case, &got, n * rf);
                let (mut g, mut u) = (d.nan(n * rf), d.nan(n * rf));
                d.ops.matmul(&dw[3], &x_d, n, &mut g, MatmulPath::Gemv).expect("gate");
                d.ops.matmul(&dw[4], &x_d, n, &mut u, MatmulPath::Gemv).expect("up");
                d.ops.swiglu(&mut g, &u, n * rf).expect("swiglu");
                let want = d.down(&g);
                for (j, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "{case}: swiglu output {j}: fused {a} != separate {b}");
                }
                let gr = reference::matmul(dtype, &ws[3], rf, cols, &x, n);
                let ur = reference::matmul(dtype, &ws[4], rf, cols, &x, n);
                worst.check(case, &got[..n * rf], &reference::swiglu(&gr, &ur), 1e-4);
            }
        }
    }
    worst.report();
    // Not applicable: the plain ops (fast paths off) and mixed types say so without launching.
    let w16 = d.weight("w", DType::F16, 4, 256, &vec![0u8; 4 * 512]);
    let w8 = d.weight("w", DType::Q8_0, 4, 256, &vec![0u8; 4 * 8 * 34]);
    let x = d.up(&[0.0f32; 256]);
    let (mut a, mut b, mut c) = (d.nan(4), d.nan(4), d.nan(4));
    assert!(!d.plain.matmul3([&w16, &w16, &w16], &x, 1, [&mut a, &mut b, &mut c]).expect("plain"));
    assert!(!d.ops.matmul3([&w16, &w8, &w16], &x, 1, [&mut a, &mut b, &mut c]).expect("mixed"));
    assert!(!d.ops.matmul_swiglu(&w16, &w8, &x, 1, &mut a).expect("mixed"));
}

/// The three attention kernels with gemma2's scores (a scale of their own, the soft cap
/// computed as 1 - 2 / (exp(2x) + 1)) and sliding windows (inside a block, one block,
/// past a block boundary, and longer than the sequence), against the f64 reference.
/// The block-table entries wholly before every token's window are u32::MAX: a kernel
/// that read or checked them would give NaN rows.
#[test]
fn attention_scores_and_windows_match_cpu_all_three_kernels() {
    let Some(d) = device() else { return };
    let mut w_one = Worst::new("attention_window");
    let mut w_split = Worst::new("attention_split_window");
    let mut w_pf = Worst::new("attention_prefill_window");
    let (n_blocks, n_layers, layer) = (40usize, 2usize, 1usize);
    let max_blocks = 12;
    for &(nh, nkv, hd) in &[(4usize, 2usize, 32usize), (8, 1, 64), (2, 2, 16)] {
        let shape = AttnShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd };
        let (qd, kvd) = (nh * hd, nkv * hd);
        for &(window, softcap) in &[(5usize, 2.0f32), (16, 0.0), (21, 1.0), (1000, 3.0), (0, 2.5)] {
            let mut rng = XorShift::from_parts(&[180, nh, nkv, hd, window]);
            let (kv, pool) = random_pool(d, &mut rng, n_blocks, n_layers, kvd);
            let mut ids: Vec<u32> = (0..n_blocks as u32).collect();
            shuffle(&mut rng, &mut ids);
            // Two sequences: a prefill of 40 tokens at positions 120..160 (3 tiles), and
            // one of 19 tokens at 0..19.
            let runs: [(u32, usize); 2] = [(120, 40), (0, 19)];
            // Blocks before the first token's window are never read: left u32::MAX.
            let first = |start: u32| {
                if window > 0 {
                    (start as usize + 1).saturating_sub(window) / BLOCK_POSITIONS
                } else {
                    0
                }
            };
            let (tables, seq, pos, tiles) = prefill_runs(&runs, &ids, max_blocks, first);
            let n = seq.len();
            let q = rng.vec(n * qd, -3.0, 3.0);
            let scores = AttnScores { scale: 0.37, softcap, window };
            let (q_d, seq_d, pos_d, tab_d) = (d.up(&q), d.up(&seq), d.up(&pos), d.up(&tables));
            let mut a = attn(&q_d, &kv, layer, [&seq_d, &pos_d, &tab_d], max_blocks, n, shape);
            a.scores = scores;
            let want = reference::attention_scored(
                &reference::Attn {
                    q: &q,
                    kv: &pool,
                    n_layers,
                    layer,
                    seq: &seq,
                    pos: &pos,
                    block_tables: &tables,
                    max_blocks,
                    shape,
                },
                0.37,
                softcap as f64,
                window,
            );
            let case = format!("heads={nh}/{nkv} hd={hd} window={window} softcap={softcap}");
            let mut out = d.nan(n * qd + TAIL);
            d.ops.attention(&a, &mut out).expect("attention");
            let got = d.down(&out);
            assert_tail_nan("attention", &case, &got, n * qd);
            w_one.check(case.clone(), &got[..n * qd], &want, 1e-4);
            let split = d.ops.split_plan(n, nkv, max_blocks);
            let (po, pm) = Ops::split_scratch_len(n, shape, split.0);
            let (mut part_o, mut part_ml) = (d.nan(po), d.nan(pm));
            let mut out = d.nan(n * qd + TAIL);
            d.ops.attention_split(&a, split, &mut part_o, &mut part_ml, &mut out).expect("attention_split");
            let got = d.down(&out);
            assert_tail_nan("attention_split", &case, &got, n * qd);
            w_split.check(case.clone(), &got[..n * qd], &want, 1e-4);
            let mut out = d.nan(n * qd + TAIL);
            d.ops.attention_prefill(&a, &d.up(&tiles), tiles.len() / 2, &mut out).expect("attention_prefill");
            let got = d.down(&out);
            assert_tail_nan("attention_prefill", &case, &got, n * qd);
            w_pf.check(case, &got[..n * qd], &want, 1e-4);
        }
    }
    w_one.report();
    w_split.report();
    w_pf.report();
}

/// The tiled prefill's inputs for runs of `(start, len)` tokens, one sequence each: block
/// tables (`max_blocks` per sequence; blocks `first_block(start)..` of each run take the next
/// of `ids`, the others stay `u32::MAX`), and per token its sequence and position, and tiles
/// of at most 16 tokens as (first token, count) pairs.
fn prefill_runs(
    runs: &[(u32, usize)],
    ids: &[u32],
    max_blocks: usize,
    first_block: impl Fn(u32) -> usize,
) -> (Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>) {
    let mut tables = vec![u32::MAX; runs.len() * max_blocks];
    let mut next = 0;
    for (s, &(start, len)) in runs.iter().enumerate() {
        for b in first_block(start)..(start as usize + len).div_ceil(BLOCK_POSITIONS) {
            tables[s * max_blocks + b] = ids[next];
            next += 1;
        }
    }
    let (mut seq, mut pos, mut tiles) = (Vec::new(), Vec::new(), Vec::new());
    for (s, &(start, len)) in runs.iter().enumerate() {
        let t0 = seq.len();
        for i in 0..len {
            seq.push(s as u32);
            pos.push(start + i as u32);
        }
        for c in (0..len).step_by(16) {
            tiles.push((t0 + c) as u32);
            tiles.push((len - c).min(16) as u32);
        }
    }
    (tables, seq, pos, tiles)
}
