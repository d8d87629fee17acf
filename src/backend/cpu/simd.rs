//! Matrix kernels of the CPU backend: a portable reference and SIMD versions
//! chosen once per process from the CPU's features (never from the batch or the
//! thread count).
//!
//! Two kernel families, each with one fixed reduction order per output element
//! that depends only on the row length:
//!
//! * float weights (F32, F16 via F16C, BF16) times f32 activations: element `i`
//!   of the row goes to lane `i % 8` (the `n % 8` tail elements go to lanes
//!   `0..`), each lane accumulates with a fused multiply-add, and the 8 lanes
//!   are summed by `reduce8`.
//! * Q8_0 / Q4_0 weights times activations quantized once per step to 8-bit
//!   blocks of 32 with an f32 scale (`QAct`): per block, lane `l` gets the
//!   exact integer sum of elements `4l..4l+4`, and
//!   `acc[l] = fma(d_w * d_x, isum as f32, acc[l])`; then `reduce8`.
//!
//! With AVX-512 the same definitions run on 16 lanes ("wide" orders): float
//! element `i` goes to lane `i % 16`; quantized block `b` fills lanes
//! `8 * (b % 2) + l`; the 16 lanes are folded `a[l] + a[l + 8]` and then
//! summed by `reduce8`. The kernel set is fixed per CPU, so a given machine
//! always uses one order.
//!
//! On AVX-512 VNNI and AVX2 CPUs the quantized kernels use the block order of
//! `super::qpack` instead (one rounding per 32-element block), and F16 / BF16 the
//! sequential order of `super::fpack`, over weights repacked at load (the same
//! bits on both kernel sets); `gemm_q` / `gemm_f` there take the reference over
//! rows as stored. The lane orders above remain for F32 (and for Q8_0 / Q4_0 on
//! NEON and the scalar set).
//!
//! The SIMD versions compute exactly these operations (the integer sums are
//! exact in any order), so they are bit-identical to the reference; the unit
//! tests below check that for every kernel and tile shape.
//!
//! Layout: this file holds the portable reference (the definition of the orders)
//! and the safe entry points, which pick a kernel set's implementation:
//! `simd/x86_256.rs` (AVX2), `simd/x86_512.rs` (AVX-512 floats), `simd/neon.rs`.
//! Depends on `isa` (the kernel set, reductions, `QAct`) and on `qpack` / `fpack`
//! (their block and sequential references, for rows as stored on AVX-512 VNNI
//! and AVX2 CPUs); nothing below `ops` depends on this file.

#[cfg(test)]
use super::isa::wide;
use super::isa::{reduce16, Isa, QAct};
use super::{fpack, qpack};
use crate::quant::{f16_bits_to_f32, DType, QK};

// The kernel-set query, reached at this path by the bench binary.
pub use super::isa::isa;

/// The F32 tiles of `x86_256` and `x86_512` by token count.
#[cfg(target_arch = "x86_64")]
macro_rules! dispatch_f {
    ($R:literal, $ct:expr, $($args:expr),*) => {
        match $ct {
            6 => tile_f::<$R, 6>($($args),*),
            5 => tile_f::<$R, 5>($($args),*),
            4 => tile_f::<$R, 4>($($args),*),
            3 => tile_f::<$R, 3>($($args),*),
            2 => tile_f::<$R, 2>($($args),*),
            _ => tile_f::<$R, 1>($($args),*),
        }
    };
}

#[cfg(target_arch = "aarch64")]
mod neon;
/// The tile walk of the x86 row-major kernels: token chunks of `tc` (so the
/// activations stay in cache while the weights stream), then rows 4 at a time (1
/// for the last rows, or always 1 unless `four`), then up to `maxc` tokens:
/// `tile(r, rt, c, ct)` for rows `r..r + rt` x tokens `c..c + ct`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn for_each_tile(
    nrows: usize,
    t: usize,
    tc: usize,
    maxc: usize,
    four: bool,
    mut tile: impl FnMut(usize, usize, usize, usize),
) {
    let mut t0 = 0;
    while t0 < t {
        let t1 = (t0 + tc).min(t);
        let mut r = 0;
        while r < nrows {
            let rt = if four && nrows - r >= 4 { 4 } else { 1 };
            let mut c = t0;
            while c < t1 {
                let ct = (t1 - c).min(maxc);
                tile(r, rt, c, ct);
                c += ct;
            }
            r += rt;
        }
        t0 = t1;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86_256;
#[cfg(target_arch = "x86_64")]
mod x86_512;

// ---------------------------------------------------------------------------
// Reference kernels (the definition of the order).

#[inline(always)]
fn wq(dt: DType, blk: &[u8], j: usize) -> i32 {
    match dt {
        DType::Q8_0 => blk[2 + j] as i8 as i32,
        _ => {
            if j < 16 {
                (blk[2 + j] & 0x0F) as i32 - 8
            } else {
                (blk[2 + j - 16] >> 4) as i32 - 8
            }
        }
    }
}

/// Reference quantized dot of one Q8_0/Q4_0 row with one [`QAct`] row (8 lanes).
pub(crate) fn dot_q_ref(dt: DType, row: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    dot_q_ref_lanes(dt, false, row, xq, xd)
}

/// The same in the 8-lane (`wide = false`) or 16-lane order.
pub(crate) fn dot_q_ref_lanes(dt: DType, wide: bool, row: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let bb = dt.block_bytes();
    let mut acc = [0f32; 16];
    for (b, blk) in row.chunks_exact(bb).enumerate() {
        let s = f16_bits_to_f32(u16::from_le_bytes([blk[0], blk[1]])) * xd[b];
        let xb = &xq[b * QK..(b + 1) * QK];
        let base = if wide { 8 * (b % 2) } else { 0 };
        for l in 0..8 {
            let isum: i32 = (4 * l..4 * l + 4).map(|j| wq(dt, blk, j) * xb[j] as i32).sum();
            acc[base + l] = s.mul_add(isum as f32, acc[base + l]);
        }
    }
    reduce16(acc)
}

#[inline(always)]
fn wf(dt: DType, row: &[u8], i: usize) -> f32 {
    match dt {
        DType::F32 => f32::from_le_bytes([row[4 * i], row[4 * i + 1], row[4 * i + 2], row[4 * i + 3]]),
        DType::F16 => f16_bits_to_f32(u16::from_le_bytes([row[2 * i], row[2 * i + 1]])),
        _ => f32::from_bits((u16::from_le_bytes([row[2 * i], row[2 * i + 1]]) as u32) << 16),
    }
}

/// Reference dot of one float-typed row with f32 `x` (8 lanes).
pub(crate) fn dot_f_ref(dt: DType, row: &[u8], x: &[f32]) -> f32 {
    dot_f_ref_lanes(dt, false, row, x)
}

/// The same in the 8-lane (`wide = false`) or 16-lane order.
pub(crate) fn dot_f_ref_lanes(dt: DType, wide: bool, row: &[u8], x: &[f32]) -> f32 {
    let lanes = if wide { 16 } else { 8 };
    let n = x.len();
    let nl = n / lanes * lanes;
    let mut acc = [0f32; 16];
    for i in 0..nl {
        acc[i % lanes] = wf(dt, row, i).mul_add(x[i], acc[i % lanes]);
    }
    for i in nl..n {
        acc[i - nl] = wf(dt, row, i).mul_add(x[i], acc[i - nl]);
    }
    reduce16(acc)
}

#[cfg(test)]
/// The reference of `gemm_q` / `gemm_f` in the order of `isa`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_ref(
    isa: Isa,
    dt: DType,
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    x: &[f32],
    cols: usize,
    out: &mut [f32],
) {
    let t = x.len() / cols;
    let q = matches!(dt, DType::Q8_0 | DType::Q4_0).then(|| QAct::quantize(x, cols));
    for r in 0..nrows {
        let row = &w[r * row_bytes..(r + 1) * row_bytes];
        for c in 0..t {
            out[r * t + c] = match &q {
                Some(a) if qpack::block_order(isa) => qpack::dot_block_order_ref(
                    dt,
                    row,
                    &a.qs[c * cols..(c + 1) * cols],
                    &a.d[c * cols / QK..(c + 1) * cols / QK],
                ),
                Some(a) => dot_q_ref_lanes(
                    dt,
                    wide(isa),
                    row,
                    &a.qs[c * cols..(c + 1) * cols],
                    &a.d[c * cols / QK..(c + 1) * cols / QK],
                ),
                None if fpack::sequential_order(isa, dt) => {
                    fpack::dot_sequential_ref(dt, row, &x[c * cols..(c + 1) * cols])
                }
                None => dot_f_ref_lanes(dt, wide(isa), row, &x[c * cols..(c + 1) * cols]),
            };
        }
    }
}

// ---------------------------------------------------------------------------
// Safe entry points: `out[r * t + c] = dot(row r, activation row c)` for
// `nrows` rows of `w` and all `t` activation rows.

/// Quantized weights (Q8_0 / Q4_0) times quantized activations.
pub(crate) fn gemm_q(isa: Isa, dt: DType, w: &[u8], row_bytes: usize, nrows: usize, a: &QAct, out: &mut [f32]) {
    assert!(matches!(dt, DType::Q8_0 | DType::Q4_0));
    assert_eq!(dt.row_bytes(a.cols), Some(row_bytes));
    assert!(w.len() >= nrows * row_bytes);
    assert_eq!(a.qs.len(), a.t * a.cols);
    assert_eq!(a.d.len(), a.t * a.cols / QK);
    assert_eq!(out.len(), nrows * a.t);
    let nb = a.cols / QK;
    match isa {
        // The block order's fast kernels read packed weights (`qpack`); rows as
        // stored (only tests and odd callers) take the reference.
        _ if qpack::block_order(isa) => {
            for r in 0..nrows {
                let row = &w[r * row_bytes..(r + 1) * row_bytes];
                for c in 0..a.t {
                    out[r * a.t + c] = qpack::dot_block_order_ref(
                        dt,
                        row,
                        &a.qs[c * a.cols..(c + 1) * a.cols],
                        &a.d[c * nb..(c + 1) * nb],
                    );
                }
            }
        }
        #[cfg(target_arch = "aarch64")]
        // SAFETY: `Neon` is only chosen when the CPU has NEON; lengths asserted above.
        Isa::Neon => unsafe { neon::gemm_q(dt == DType::Q4_0, w.as_ptr(), row_bytes, nrows, nb, a, out) },
        _ => {
            for r in 0..nrows {
                let row = &w[r * row_bytes..(r + 1) * row_bytes];
                for c in 0..a.t {
                    out[r * a.t + c] =
                        dot_q_ref(dt, row, &a.qs[c * a.cols..(c + 1) * a.cols], &a.d[c * nb..(c + 1) * nb]);
                }
            }
        }
    }
}

/// Float weights (F32 / F16 / BF16) times f32 activations (`x`: rows of `cols`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_f(
    isa: Isa,
    dt: DType,
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    x: &[f32],
    cols: usize,
    out: &mut [f32],
) {
    assert!(matches!(dt, DType::F32 | DType::F16 | DType::BF16));
    assert_eq!(dt.row_bytes(cols), Some(row_bytes));
    assert!(w.len() >= nrows * row_bytes);
    assert!(cols > 0 && x.len().is_multiple_of(cols));
    let t = x.len() / cols;
    assert_eq!(out.len(), nrows * t);
    match isa {
        // F16 / BF16 in the sequential order: the fast kernels read packed weights
        // (`fpack`); rows as stored (tests, odd callers) take the reference. So the
        // x86 lane-order kernels below only see F32.
        _ if fpack::sequential_order(isa, dt) => {
            for r in 0..nrows {
                let row = &w[r * row_bytes..(r + 1) * row_bytes];
                for c in 0..t {
                    out[r * t + c] = fpack::dot_sequential_ref(dt, row, &x[c * cols..(c + 1) * cols]);
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2/FMA/F16C present whenever these sets are chosen; lengths asserted above.
        Isa::Avx512Vnni => unsafe { x86_512::gemm_f(w.as_ptr(), row_bytes, nrows, x, cols, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2/FMA/F16C present whenever this set is chosen; lengths asserted above.
        Isa::Avx2 => unsafe { x86_256::gemm_f(w.as_ptr(), row_bytes, nrows, x, cols, out) },
        _ => {
            for r in 0..nrows {
                let row = &w[r * row_bytes..(r + 1) * row_bytes];
                for c in 0..t {
                    out[r * t + c] = dot_f_ref(dt, row, &x[c * cols..(c + 1) * cols]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::isa::available;
    use crate::quant::quantize_row;
    use crate::util::XorShift;

    fn weights(dt: DType, rows: usize, cols: usize, rng: &mut XorShift) -> (Vec<u8>, usize) {
        let rb = dt.row_bytes(cols).unwrap();
        let mut w = vec![0u8; rows * rb];
        for r in 0..rows {
            quantize_row(dt, &rng.vec(cols, -1.0, 1.0), &mut w[r * rb..(r + 1) * rb]);
        }
        (w, rb)
    }

    /// Every kernel set, every tile shape (rows and tokens not multiples of 4),
    /// bit-identical to the reference.
    #[test]
    fn simd_kernels_are_bit_identical_to_the_reference() {
        let mut rng = XorShift::new(0xDEADBEEF);
        for &(rows, cols, t) in &[(9usize, 64usize, 1usize), (7, 96, 6), (13, 256, 9), (4, 32, 4), (5, 160, 3)] {
            let x = rng.vec(t * cols, -1.0, 1.0);
            for dt in [DType::Q8_0, DType::Q4_0] {
                let (w, rb) = weights(dt, rows, cols, &mut rng);
                let a = QAct::quantize(&x, cols);
                for isa in available() {
                    let mut want = vec![0f32; rows * t];
                    gemm_ref(isa, dt, &w, rb, rows, &x, cols, &mut want);
                    let mut got = vec![0f32; rows * t];
                    gemm_q(isa, dt, &w, rb, rows, &a, &mut got);
                    let (gb, wb): (Vec<u32>, Vec<u32>) =
                        (got.iter().map(|v| v.to_bits()).collect(), want.iter().map(|v| v.to_bits()).collect());
                    assert_eq!(gb, wb, "{dt} {isa:?} rows={rows} cols={cols} t={t}");
                }
            }
        }
        for &(rows, cols, t) in
            &[(9usize, 64usize, 1usize), (7, 13, 6), (5, 100, 9), (4, 3, 5), (6, 40, 17), (5, 35, 7)]
        {
            let x = rng.vec(t * cols, -1.0, 1.0);
            for dt in [DType::F32, DType::F16, DType::BF16] {
                let (w, rb) = weights(dt, rows, cols, &mut rng);
                for isa in available() {
                    let mut want = vec![0f32; rows * t];
                    gemm_ref(isa, dt, &w, rb, rows, &x, cols, &mut want);
                    let mut got = vec![0f32; rows * t];
                    gemm_f(isa, dt, &w, rb, rows, &x, cols, &mut got);
                    let (gb, wb): (Vec<u32>, Vec<u32>) =
                        (got.iter().map(|v| v.to_bits()).collect(), want.iter().map(|v| v.to_bits()).collect());
                    assert_eq!(gb, wb, "{dt} {isa:?} rows={rows} cols={cols} t={t}");
                }
            }
        }
    }

    /// The quantized kernels against f64 over the dequantized weights and the
    /// unquantized activations: the error is the activations' 8-bit rounding.
    #[test]
    fn quantized_kernels_are_close_to_exact() {
        let mut rng = XorShift::new(42);
        let (rows, cols) = (16, 512);
        let x = rng.vec(cols, -1.0, 1.0);
        let a = QAct::quantize(&x, cols);
        for dt in [DType::Q8_0, DType::Q4_0] {
            let (w, rb) = weights(dt, rows, cols, &mut rng);
            let mut got = vec![0f32; rows];
            gemm_q(isa(), dt, &w, rb, rows, &a, &mut got);
            for r in 0..rows {
                let mut deq = vec![0f32; cols];
                crate::quant::dequantize_row(dt, &w[r * rb..(r + 1) * rb], &mut deq);
                let exact: f64 = deq.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                let mag: f64 = deq.iter().zip(&x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                assert!((got[r] as f64 - exact).abs() < 1e-2 * mag, "{dt} row {r}: {} vs {exact}", got[r]);
            }
        }
    }
}
