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
//!   are summed by [`reduce8`].
//! * Q8_0 / Q4_0 weights times activations quantized once per step to 8-bit
//!   blocks of 32 with an f32 scale ([`QAct`]): per block, lane `l` gets the
//!   exact integer sum of elements `4l..4l+4`, and
//!   `acc[l] = fma(d_w * d_x, isum as f32, acc[l])`; then [`reduce8`].
//!
//! With AVX-512 the same definitions run on 16 lanes ("wide" orders): float
//! element `i` goes to lane `i % 16`; quantized block `b` fills lanes
//! `8 * (b % 2) + l`; the 16 lanes are folded `a[l] + a[l + 8]` and then
//! summed by [`reduce8`]. The kernel set is fixed per CPU, so a given machine
//! always uses one order.
//!
//! On AVX-512 VNNI CPUs the quantized kernels use the block order of
//! [`super::qpack`] instead (one rounding per 32-element block), and F16 the
//! sequential order of [`super::fpack`], over weights repacked at load;
//! `gemm_q` / `gemm_f` there take the reference over rows as stored.
//!
//! The SIMD versions compute exactly these operations (the integer sums are
//! exact in any order), so they are bit-identical to the reference; the unit
//! tests below check that for every kernel and tile shape.

use crate::quant::{f16_bits_to_f32, DType, QK};
use std::sync::OnceLock;

/// Which kernel set runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust (any CPU).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 (F, VL, BW) with VNNI, plus AVX2 + FMA + F16C: 512-bit kernels
    /// with the 16-lane orders (see the module docs).
    Avx512Vnni,
    /// aarch64 NEON (quantized kernels; float ones use the reference, which
    /// compiles to fused multiply-adds there).
    Neon,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2+fma+f16c",
            Isa::Avx512Vnni => "avx512f/vl/bw+vnni (512-bit), avx2+fma+f16c",
            Isa::Neon => "neon",
        }
    }
}

/// The kernels this CPU runs (detected once). `LLMRT_CPU_KERNELS=scalar|avx2`
/// forces a lower set (for tests and comparisons).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let forced = std::env::var("LLMRT_CPU_KERNELS").ok();
        let best = detect();
        match forced.as_deref() {
            Some("scalar") => Isa::Scalar,
            Some("avx2") if best == Isa::Avx512Vnni => Isa::Avx2,
            _ => best,
        }
    })
}

/// The best kernel set the CPU supports.
pub fn detect() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
            {
                return Isa::Avx512Vnni;
            }
            return Isa::Avx2;
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            return Isa::Neon;
        }
    }
    Isa::Scalar
}

/// Every kernel set this CPU can run (for the tests).
pub fn available() -> Vec<Isa> {
    let mut v = vec![Isa::Scalar];
    match detect() {
        Isa::Avx512Vnni => v.extend([Isa::Avx2, Isa::Avx512Vnni]),
        Isa::Scalar => {}
        other => v.push(other),
    }
    v
}

/// The fixed 8-lane reduction: `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`.
#[inline(always)]
pub fn reduce8(a: [f32; 8]) -> f32 {
    let b = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (b[0] + b[2]) + (b[1] + b[3])
}

/// The fixed 16-lane reduction of the wide orders.
#[inline(always)]
pub fn reduce16(a: [f32; 16]) -> f32 {
    let mut b = [0f32; 8];
    for l in 0..8 {
        b[l] = a[l] + a[l + 8];
    }
    reduce8(b)
}

/// Whether `isa` computes the 16-lane ("wide") orders.
pub fn wide(isa: Isa) -> bool {
    isa == Isa::Avx512Vnni
}

/// Activations quantized to 8-bit blocks of 32 (symmetric, scale `amax / 127`
/// kept in f32), `t` rows of `cols`.
#[derive(Default)]
pub struct QAct {
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    /// Sum of each block's 32 quantized values (for the unsigned-operand
    /// corrections of the packed kernels).
    pub sums: Vec<i32>,
    pub cols: usize,
    pub t: usize,
}

impl QAct {
    /// Quantizes `x` (rows of `cols`, `cols` a multiple of 32).
    pub fn quantize(x: &[f32], cols: usize) -> QAct {
        assert!(cols.is_multiple_of(QK) && x.len().is_multiple_of(cols), "activation rows of {cols} cannot be quantized");
        let t = x.len() / cols;
        let mut qs = vec![0i8; x.len()];
        let mut d = vec![0f32; x.len() / QK];
        let mut sums = vec![0i32; x.len() / QK];
        match isa() {
            // SAFETY: `Avx512Vnni` is only chosen on CPUs with AVX-512 F/BW/VL.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => unsafe { quantize_avx512(x, &mut qs, &mut d, &mut sums) },
            _ => quantize_blocks(x, &mut qs, &mut d, &mut sums),
        }
        QAct { qs, d, sums, cols, t }
    }
}

/// The quantization of [`QAct::quantize`], block by block (exact element-wise
/// operations and an exact maximum: the same bytes whatever the vector width).
#[inline(always)]
fn quantize_blocks(x: &[f32], qs: &mut [i8], d: &mut [f32], sums: &mut [i32]) {
    for (((xb, qb), db), sb) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).zip(d.iter_mut()).zip(sums.iter_mut()) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = amax / 127.0;
        let id = if s != 0.0 { 127.0 / amax } else { 0.0 };
        for (q, &v) in qb.iter_mut().zip(xb) {
            *q = round_to_i8(v * id);
        }
        *db = s;
        *sb = qb.iter().map(|&q| q as i32).sum();
    }
}

/// [`quantize_blocks`] with AVX-512 intrinsics, byte for byte the same (the
/// maximum ignores NaN as `f32::max` does; rounding as [`round_to_i8`]: clamp,
/// truncate, adjust by the exact remainder, NaN to 0, saturate to i8).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn quantize_avx512(x: &[f32], qs: &mut [i8], d: &mut [f32], sums: &mut [i32]) {
    use std::arch::x86_64::*;
    let nb = x.len() / QK;
    assert!(qs.len() >= nb * QK && d.len() >= nb && sums.len() >= nb);
    let one = _mm512_set1_epi32(1);
    // SAFETY (whole loop): block `b` reads x[32b..32b + 32] and writes
    // qs[32b..32b + 32], d[b], sums[b], all in bounds (asserted above).
    unsafe {
        for b in 0..nb {
            let p = x.as_ptr().add(b * QK);
            let xv = [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))];
            // MAXPS returns its second operand when either is NaN: the running
            // maximum (never NaN) goes second, so NaNs are skipped like f32::max.
            let m = _mm512_max_ps(_mm512_abs_ps(xv[1]), _mm512_max_ps(_mm512_abs_ps(xv[0]), _mm512_setzero_ps()));
            let amax = _mm512_reduce_max_ps(m);
            let s = amax / 127.0;
            let id = if s != 0.0 { 127.0 / amax } else { 0.0 };
            *d.get_unchecked_mut(b) = s;
            let mut isum = _mm512_setzero_si512();
            for (h, &xh) in xv.iter().enumerate() {
                let v = _mm512_mul_ps(xh, _mm512_set1_ps(id));
                let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
                let v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-128.0)), _mm512_set1_ps(128.0));
                let i = _mm512_cvttps_epi32(v);
                let f = _mm512_sub_ps(v, _mm512_cvtepi32_ps(i));
                let i = _mm512_mask_add_epi32(i, _mm512_cmp_ps_mask::<_CMP_GE_OQ>(f, _mm512_set1_ps(0.5)), i, one);
                let i = _mm512_mask_sub_epi32(i, _mm512_cmp_ps_mask::<_CMP_LE_OQ>(f, _mm512_set1_ps(-0.5)), i, one);
                let i = _mm512_min_epi32(_mm512_maskz_mov_epi32(!nan, i), _mm512_set1_epi32(127));
                _mm_storeu_si128(qs.as_mut_ptr().add(b * QK + 16 * h) as *mut __m128i, _mm512_cvtepi32_epi8(i));
                isum = _mm512_add_epi32(isum, i);
            }
            *sums.get_unchecked_mut(b) = _mm512_reduce_add_epi32(isum);
        }
    }
}

/// `v.round() as i8` (halves away from zero; saturating; NaN -> 0) without a
/// libm call, so the quantization loop vectorizes: after clamping to
/// [-128, 128] the truncation and the remainder `v - trunc(v)` are exact.
#[inline(always)]
pub fn round_to_i8(v: f32) -> i8 {
    let v = v.clamp(-128.0, 128.0);
    let i = v as i32; // NaN -> 0
    let f = v - i as f32;
    (i + (f >= 0.5) as i32 - (f <= -0.5) as i32).clamp(-128, 127) as i8
}

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
pub fn dot_q_ref(dt: DType, row: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    dot_q_ref_lanes(dt, false, row, xq, xd)
}

/// The same in the 8-lane (`wide = false`) or 16-lane order.
pub fn dot_q_ref_lanes(dt: DType, wide: bool, row: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
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
pub fn dot_f_ref(dt: DType, row: &[u8], x: &[f32]) -> f32 {
    dot_f_ref_lanes(dt, false, row, x)
}

/// The same in the 8-lane (`wide = false`) or 16-lane order.
pub fn dot_f_ref_lanes(dt: DType, wide: bool, row: &[u8], x: &[f32]) -> f32 {
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

/// The reference of `gemm_q` / `gemm_f` in the order of `isa`.
#[allow(clippy::too_many_arguments)]
pub fn gemm_ref(isa: Isa, dt: DType, w: &[u8], row_bytes: usize, nrows: usize, x: &[f32], cols: usize, out: &mut [f32]) {
    let t = x.len() / cols;
    let q = matches!(dt, DType::Q8_0 | DType::Q4_0).then(|| QAct::quantize(x, cols));
    for r in 0..nrows {
        let row = &w[r * row_bytes..(r + 1) * row_bytes];
        for c in 0..t {
            out[r * t + c] = match &q {
                Some(a) if super::qpack::block_order(isa) => super::qpack::dot_block_order_ref(
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
                None if super::fpack::sequential_order(isa, dt) => {
                    super::fpack::dot_sequential_ref(row, &x[c * cols..(c + 1) * cols])
                }
                None => dot_f_ref_lanes(dt, wide(isa), row, &x[c * cols..(c + 1) * cols]),
            };
        }
    }
}

// ---------------------------------------------------------------------------
// Safe entry points: `out[r * t + c] = dot(row r, activation row c)` for
// `nrows` rows of `w` and all `t` activation rows.

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
/// Token rows processed per pass over a weight tile, sized so that the
/// activations stay in the L2 cache while the weights stream once.
pub(crate) fn token_chunk(t: usize, act_row_bytes: usize) -> usize {
    let fit = (512 * 1024 / act_row_bytes.max(1)).max(4) / 4 * 4;
    fit.min(t).max(1)
}

/// Quantized weights (Q8_0 / Q4_0) times quantized activations.
pub fn gemm_q(isa: Isa, dt: DType, w: &[u8], row_bytes: usize, nrows: usize, a: &QAct, out: &mut [f32]) {
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
        Isa::Avx512Vnni => {
            for r in 0..nrows {
                let row = &w[r * row_bytes..(r + 1) * row_bytes];
                for c in 0..a.t {
                    out[r * a.t + c] = super::qpack::dot_block_order_ref(
                        dt,
                        row,
                        &a.qs[c * a.cols..(c + 1) * a.cols],
                        &a.d[c * nb..(c + 1) * nb],
                    );
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2` is only chosen when the CPU has AVX2, FMA and F16C; lengths asserted above.
        Isa::Avx2 => unsafe { x86_avx2::gemm_q(dt == DType::Q4_0, w.as_ptr(), row_bytes, nrows, nb, a, out) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: `Neon` is only chosen when the CPU has NEON; lengths asserted above.
        Isa::Neon => unsafe { neon::gemm_q(dt == DType::Q4_0, w.as_ptr(), row_bytes, nrows, nb, a, out) },
        _ => {
            for r in 0..nrows {
                let row = &w[r * row_bytes..(r + 1) * row_bytes];
                for c in 0..a.t {
                    out[r * a.t + c] = dot_q_ref(
                        dt,
                        row,
                        &a.qs[c * a.cols..(c + 1) * a.cols],
                        &a.d[c * nb..(c + 1) * nb],
                    );
                }
            }
        }
    }
}

/// Float weights (F32 / F16 / BF16) times f32 activations (`x`: rows of `cols`).
#[allow(clippy::too_many_arguments)]
pub fn gemm_f(isa: Isa, dt: DType, w: &[u8], row_bytes: usize, nrows: usize, x: &[f32], cols: usize, out: &mut [f32]) {
    assert!(matches!(dt, DType::F32 | DType::F16 | DType::BF16));
    assert_eq!(dt.row_bytes(cols), Some(row_bytes));
    assert!(w.len() >= nrows * row_bytes);
    assert!(cols > 0 && x.len().is_multiple_of(cols));
    let t = x.len() / cols;
    assert_eq!(out.len(), nrows * t);
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    let kind = match dt {
        DType::F32 => 0,
        DType::F16 => 1,
        _ => 2,
    };
    match isa {
        // F16 in the sequential order: the fast kernels read packed weights
        // (`fpack`); rows as stored (tests, odd callers) take the reference.
        Isa::Avx512Vnni if super::fpack::sequential_order(isa, dt) => {
            for r in 0..nrows {
                let row = &w[r * row_bytes..(r + 1) * row_bytes];
                for c in 0..t {
                    out[r * t + c] = super::fpack::dot_sequential_ref(row, &x[c * cols..(c + 1) * cols]);
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2/FMA/F16C present whenever these sets are chosen; lengths asserted above.
        Isa::Avx512Vnni => unsafe { x86_512::gemm_f(kind, w.as_ptr(), row_bytes, nrows, x, cols, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2/FMA/F16C present whenever this set is chosen; lengths asserted above.
        Isa::Avx2 => unsafe { x86_avx2::gemm_f(kind, w.as_ptr(), row_bytes, nrows, x, cols, out) },
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

/// `dot_f32` in the float order (used by attention): f32 · f32.
pub fn dot_f32(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2/FMA present whenever these sets are chosen; equal lengths asserted.
        Isa::Avx512Vnni | Isa::Avx2 => unsafe { x86_avx2::dot_f32(a, b) },
        _ => {
            let n = a.len();
            let n8 = n / 8 * 8;
            let mut acc = [0f32; 8];
            for i in 0..n8 {
                acc[i % 8] = a[i].mul_add(b[i], acc[i % 8]);
            }
            for i in n8..n {
                acc[i - n8] = a[i].mul_add(b[i], acc[i - n8]);
            }
            reduce8(acc)
        }
    }
}

// ---------------------------------------------------------------------------
// x86-64.

#[cfg(target_arch = "x86_64")]
macro_rules! dispatch_c {
    ($R:literal, $ct:expr, $q4:expr, $($args:expr),*) => {
        match ($ct, $q4) {
            (4, false) => tile_q::<$R, 4, false>($($args),*),
            (3, false) => tile_q::<$R, 3, false>($($args),*),
            (2, false) => tile_q::<$R, 2, false>($($args),*),
            (_, false) => tile_q::<$R, 1, false>($($args),*),
            (4, true) => tile_q::<$R, 4, true>($($args),*),
            (3, true) => tile_q::<$R, 3, true>($($args),*),
            (2, true) => tile_q::<$R, 2, true>($($args),*),
            (_, true) => tile_q::<$R, 1, true>($($args),*),
        }
    };
}

#[cfg(target_arch = "x86_64")]
macro_rules! dispatch_f {
    ($R:literal, $ct:expr, $k:expr, $($args:expr),*) => {
        match ($ct, $k) {
            (6, 0) => tile_f::<$R, 6, 0>($($args),*),
            (5, 0) => tile_f::<$R, 5, 0>($($args),*),
            (6, 1) => tile_f::<$R, 6, 1>($($args),*),
            (5, 1) => tile_f::<$R, 5, 1>($($args),*),
            (6, 2) => tile_f::<$R, 6, 2>($($args),*),
            (5, 2) => tile_f::<$R, 5, 2>($($args),*),
            (4, 0) => tile_f::<$R, 4, 0>($($args),*),
            (3, 0) => tile_f::<$R, 3, 0>($($args),*),
            (2, 0) => tile_f::<$R, 2, 0>($($args),*),
            (_, 0) => tile_f::<$R, 1, 0>($($args),*),
            (4, 1) => tile_f::<$R, 4, 1>($($args),*),
            (3, 1) => tile_f::<$R, 3, 1>($($args),*),
            (2, 1) => tile_f::<$R, 2, 1>($($args),*),
            (_, 1) => tile_f::<$R, 1, 1>($($args),*),
            (4, _) => tile_f::<$R, 4, 2>($($args),*),
            (3, _) => tile_f::<$R, 3, 2>($($args),*),
            (2, _) => tile_f::<$R, 2, 2>($($args),*),
            (_, _) => tile_f::<$R, 1, 2>($($args),*),
        }
    };
}

/// The x86 kernels, instantiated once per feature set by a macro so that every
/// function (tiles included) is compiled with the features it needs.
#[cfg(target_arch = "x86_64")]
macro_rules! x86_kernels {
    ($modname:ident, $feat:literal, $vnni:expr, $dp:ident) => {
        #[allow(clippy::needless_range_loop, clippy::too_many_arguments, unused_unsafe)]
        pub(super) mod $modname {
            use super::{reduce8, token_chunk, QAct};
            use crate::quant::QK;
            use std::arch::x86_64::*;

            const VNNI: bool = $vnni;


            /// `acc + sum over groups of 4 of u8(a) * i8(b)`.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
                // SAFETY: this module's kernels only run on CPUs with `$feat`.
                unsafe { super::$dp(acc, a, b) }
            }

            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn store_reduce(v: __m256) -> f32 {
                let mut a = [0f32; 8];
                // SAFETY: `a` is 8 f32, the size of a __m256; unaligned store.
                unsafe { _mm256_storeu_ps(a.as_mut_ptr(), v) };
                reduce8(a)
            }

            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn f16_scale(p: *const u8) -> __m256 {
                // SAFETY: the caller passes a pointer to a block's 2 scale bytes.
                let bits = unsafe { (p as *const u16).read_unaligned() };
                _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
            }

            /// R weight rows x C activation rows, the whole row length.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn tile_q<const R: usize, const C: usize, const Q4: bool>(
                w: *const u8,
                row_bytes: usize,
                nb: usize,
                xq: *const i8,
                xstride: usize,
                xd: *const f32,
                dstride: usize,
                out: *mut f32,
                ostride: usize,
            ) {
                let bb = if Q4 { 2 + QK / 2 } else { 2 + QK };
                let zero = _mm256_setzero_si256();
                let mut acc = [[_mm256_setzero_ps(); C]; R];
                // SAFETY (whole body): the driver passes pointers to R rows of
                // `nb` blocks each and C activation rows of `nb * 32` bytes and
                // `nb` scales; every load below stays inside those.
                unsafe {
                    for b in 0..nb {
                        let mut wv = [zero; R];
                        let mut aux = [zero; R];
                        let mut wd = [_mm256_setzero_ps(); R];
                        for r in 0..R {
                            let p = w.add(r * row_bytes + b * bb);
                            // Weights stream from memory once: fetch the same block of
                            // the next tile's rows (hardware prefetchers lose track of
                            // several short interleaved row streams).
                            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(R * row_bytes) as *const i8);
                            wd[r] = f16_scale(p);
                            if Q4 {
                                let v = _mm_loadu_si128(p.add(2) as *const __m128i);
                                let hi = _mm_srli_epi16(v, 4);
                                wv[r] = _mm256_and_si256(_mm256_set_m128i(hi, v), _mm256_set1_epi8(0x0F));
                            } else {
                                wv[r] = _mm256_loadu_si256(p.add(2) as *const __m256i);
                                aux[r] = if VNNI {
                                    // -128 * (sum of each group of 4 weights)
                                    _mm256_sub_epi32(zero, dpbusd(zero, _mm256_set1_epi8(-128), wv[r]))
                                } else {
                                    _mm256_abs_epi8(wv[r])
                                };
                            }
                        }
                        for c in 0..C {
                            let xv = _mm256_loadu_si256(xq.add(c * xstride + b * QK) as *const __m256i);
                            let xs = _mm256_broadcast_ss(&*xd.add(c * dstride + b));
                            // Q4: the nibbles are unsigned (q + 8): subtract 8 * sum(x) per group.
                            let negcorr = if Q4 {
                                _mm256_sub_epi32(zero, dpbusd(zero, _mm256_set1_epi8(8), xv))
                            } else {
                                zero
                            };
                            let xu = _mm256_xor_si256(xv, _mm256_set1_epi8(-128));
                            for r in 0..R {
                                let isum = if Q4 {
                                    dpbusd(negcorr, wv[r], xv)
                                } else if VNNI {
                                    // (x + 128) * w, minus 128 * w.
                                    dpbusd(aux[r], xu, wv[r])
                                } else {
                                    dpbusd(zero, aux[r], _mm256_sign_epi8(xv, wv[r]))
                                };
                                let s = _mm256_mul_ps(wd[r], xs);
                                acc[r][c] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(isum), acc[r][c]);
                            }
                        }
                    }
                    for r in 0..R {
                        for c in 0..C {
                            *out.add(r * ostride + c) = store_reduce(acc[r][c]);
                        }
                    }
                }
            }

            /// `out[r * t + c]` for `nrows` rows at `w` and all rows of `a`.
            #[target_feature(enable = $feat)]
            pub unsafe fn gemm_q(q4: bool, w: *const u8, row_bytes: usize, nrows: usize, nb: usize, a: &QAct, out: &mut [f32]) {
                let t = a.t;
                // 4 x 4 tiles with the 32 registers of AVX-512VL, 4 x 2 with AVX2's 16.
                let maxc = if VNNI { 4 } else { 2 };
                let tc = (token_chunk(t, a.cols) / maxc * maxc).max(maxc);
                let o = out.as_mut_ptr();
                let mut t0 = 0;
                // SAFETY (whole loop nest): rows `r..r + rt < nrows` of `w`, activation
                // rows `c..c + ct <= t` and outputs `r * t + c` are all in bounds
                // (the safe wrapper checked the lengths).
                unsafe {
                    while t0 < t {
                        let t1 = (t0 + tc).min(t);
                        let mut r = 0;
                        while r < nrows {
                            let rt = if nrows - r >= 4 { 4 } else { 1 };
                            let mut c = t0;
                            while c < t1 {
                                let ct = (t1 - c).min(maxc);
                                let wp = w.add(r * row_bytes);
                                let xq = a.qs.as_ptr().add(c * a.cols);
                                let xd = a.d.as_ptr().add(c * nb);
                                let op = o.add(r * t + c);
                                if rt == 4 {
                                    dispatch_c!(4, ct, q4, wp, row_bytes, nb, xq, a.cols, xd, nb, op, t);
                                } else {
                                    dispatch_c!(1, ct, q4, wp, row_bytes, nb, xq, a.cols, xd, nb, op, t);
                                }
                                c += ct;
                            }
                            r += rt;
                        }
                        t0 = t1;
                    }
                }
            }

            /// Eight weights of kind `K` (0 f32, 1 f16, 2 bf16) from `p` as f32.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn load_w<const K: u8>(p: *const u8) -> __m256 {
                // SAFETY: the caller passes a pointer to 8 elements of kind K.
                unsafe {
                    match K {
                        0 => _mm256_loadu_ps(p as *const f32),
                        1 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
                        _ => _mm256_castsi256_ps(_mm256_slli_epi32(
                            _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i)),
                            16,
                        )),
                    }
                }
            }

            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn load_w1<const K: u8>(p: *const u8, i: usize) -> f32 {
                // SAFETY: the caller passes a row pointer with more than `i` elements.
                unsafe {
                    match K {
                        0 => (p as *const f32).add(i).read_unaligned(),
                        1 => crate::quant::f16_bits_to_f32((p as *const u16).add(i).read_unaligned()),
                        _ => f32::from_bits(((p as *const u16).add(i).read_unaligned() as u32) << 16),
                    }
                }
            }

            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn tile_f<const R: usize, const C: usize, const K: u8>(
                w: *const u8,
                row_bytes: usize,
                n: usize,
                x: *const f32,
                xstride: usize,
                out: *mut f32,
                ostride: usize,
            ) {
                let es = if K == 0 { 4 } else { 2 };
                let n8 = n / 8 * 8;
                let mut acc = [[_mm256_setzero_ps(); C]; R];
                // SAFETY (whole body): R rows of `n` elements at `w` (stride
                // `row_bytes`) and C rows of `n` f32 at `x` (stride `xstride`).
                unsafe {
                    let mut i = 0;
                    while i < n8 {
                        let mut wv = [_mm256_setzero_ps(); R];
                        for r in 0..R {
                            let p = w.add(r * row_bytes + i * es);
                            if (i * es) % 64 == 0 {
                                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(R * row_bytes) as *const i8);
                            }
                            wv[r] = load_w::<K>(p);
                        }
                        for c in 0..C {
                            let xv = _mm256_loadu_ps(x.add(c * xstride + i));
                            for r in 0..R {
                                acc[r][c] = _mm256_fmadd_ps(wv[r], xv, acc[r][c]);
                            }
                        }
                        i += 8;
                    }
                    for r in 0..R {
                        for c in 0..C {
                            let mut a = [0f32; 8];
                            _mm256_storeu_ps(a.as_mut_ptr(), acc[r][c]);
                            for i in n8..n {
                                let wi = load_w1::<K>(w.add(r * row_bytes), i);
                                a[i - n8] = wi.mul_add(*x.add(c * xstride + i), a[i - n8]);
                            }
                            *out.add(r * ostride + c) = reduce8(a);
                        }
                    }
                }
            }

            #[target_feature(enable = $feat)]
            pub unsafe fn gemm_f(kind: u8, w: *const u8, row_bytes: usize, nrows: usize, x: &[f32], cols: usize, out: &mut [f32]) {
                let t = x.len() / cols;
                // 4 x 6 tiles keep 24 accumulators in the 32 registers of AVX-512VL;
                // plain AVX2 has 16 registers: 4 x 3.
                let maxc = if VNNI { 4 } else { 3 };
                let tc = token_chunk(t, cols * 4) / maxc * maxc;
                let tc = tc.max(maxc);
                let o = out.as_mut_ptr();
                let mut t0 = 0;
                // SAFETY (whole loop nest): as in `gemm_q`, every tile is in bounds.
                unsafe {
                    while t0 < t {
                        let t1 = (t0 + tc).min(t);
                        let mut r = 0;
                        while r < nrows {
                            let rt = if nrows - r >= 4 { 4 } else { 1 };
                            let mut c = t0;
                            while c < t1 {
                                let ct = (t1 - c).min(maxc);
                                let wp = w.add(r * row_bytes);
                                let xp = x.as_ptr().add(c * cols);
                                let op = o.add(r * t + c);
                                if rt == 4 {
                                    dispatch_f!(4, ct, kind, wp, row_bytes, cols, xp, cols, op, t);
                                } else {
                                    dispatch_f!(1, ct, kind, wp, row_bytes, cols, xp, cols, op, t);
                                }
                                c += ct;
                            }
                            r += rt;
                        }
                        t0 = t1;
                    }
                }
            }

            #[target_feature(enable = $feat)]
            pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
                let mut o = 0f32;
                // SAFETY: one row of `a.len()` f32 each (equal lengths checked by the caller).
                unsafe { tile_f::<1, 1, 0>(a.as_ptr() as *const u8, 0, a.len(), b.as_ptr(), 0, &mut o, 0) };
                o
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
x86_kernels!(x86_avx2, "avx2,fma,f16c", false, dpbusd_avx2);

/// `acc + sum over groups of 4 of u8(a) * i8(b)` with AVX2 (VPMADDUBSW, which
/// saturates at i16: callers keep |u8 * i8| pairs within range).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dpbusd_avx2(
    acc: std::arch::x86_64::__m256i,
    a: std::arch::x86_64::__m256i,
    b: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let p = _mm256_maddubs_epi16(a, b);
    _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
}


// ---------------------------------------------------------------------------
// x86-64 AVX-512 (16-lane orders).

#[cfg(target_arch = "x86_64")]
pub(crate) use x86_512::dpbusd as dpbusd512;

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
mod x86_512 {
    use super::{reduce16, token_chunk};
    use std::arch::x86_64::*;

    /// `acc + sum over groups of 4 of u8(a) * i8(b)` (VPDPBUSD on zmm; exact).
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(crate) unsafe fn dpbusd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        let mut r = acc;
        // SAFETY: VPDPBUSD (AVX-512 VNNI) exists whenever this module runs; it
        // only reads and writes the named registers.
        unsafe {
            std::arch::asm!(
                "vpdpbusd {r}, {a}, {b}",
                r = inout(zmm_reg) r,
                a = in(zmm_reg) a,
                b = in(zmm_reg) b,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        r
    }

    /// [`reduce16`] in registers, the same additions in the same order:
    /// `b = lo256 + hi256` (b[l] = a[l] + a[l + 8]), then `c = lo128(b) + hi128(b)`
    /// (c[j] = b[j] + b[j + 4]), then `(c0 + c2) + (c1 + c3)`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,avx2")]
    unsafe fn reduce16_v(v: __m512) -> f32 {
        let b = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))));
        let c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps::<1>(b));
        let d = _mm_add_ps(c, _mm_movehl_ps(c, c));
        _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)))
    }

    /// Sixteen weights of kind `K` (0 f32, 1 f16, 2 bf16) from `p` as f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
    unsafe fn load_w<const K: u8>(p: *const u8) -> __m512 {
        // SAFETY: the caller passes a pointer to 16 elements of kind K.
        unsafe {
            match K {
                0 => _mm512_loadu_ps(p as *const f32),
                1 => _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)),
                _ => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                    p as *const __m256i,
                )))),
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
    unsafe fn load_w1<const K: u8>(p: *const u8, i: usize) -> f32 {
        // SAFETY: the caller passes a row pointer with more than `i` elements.
        unsafe {
            match K {
                0 => (p as *const f32).add(i).read_unaligned(),
                1 => crate::quant::f16_bits_to_f32((p as *const u16).add(i).read_unaligned()),
                _ => f32::from_bits(((p as *const u16).add(i).read_unaligned() as u32) << 16),
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
    unsafe fn tile_f<const R: usize, const C: usize, const K: u8>(
        w: *const u8,
        row_bytes: usize,
        n: usize,
        x: *const f32,
        xstride: usize,
        out: *mut f32,
        ostride: usize,
    ) {
        let es = if K == 0 { 4 } else { 2 };
        let n16 = n / 16 * 16;
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        // SAFETY (whole body): R rows of `n` elements at `w` (stride `row_bytes`)
        // and C rows of `n` f32 at `x` (stride `xstride`); prefetches never fault.
        unsafe {
            // The same spot of a row streamed soon: the next tile's rows, or for
            // decode (one row at a time) the row 3 ahead.
            let ahead = if C == 1 { 3 * R * row_bytes } else { R * row_bytes };
            let step = |i: usize, acc: &mut [[__m512; C]; R]| {
                let mut wv = [_mm512_setzero_ps(); R];
                for r in 0..R {
                    wv[r] = load_w::<K>(w.add(r * row_bytes + i * es));
                }
                for c in 0..C {
                    let xv = _mm512_loadu_ps(x.add(c * xstride + i));
                    for r in 0..R {
                        acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
                    }
                }
            };
            // 32 elements per turn: one prefetch per row per 64 bytes (f16/bf16),
            // two for f32; each lane still sums its elements in increasing order.
            let mut i = 0;
            while i + 32 <= n16 {
                for r in 0..R {
                    let p = w.add(r * row_bytes + i * es).wrapping_add(ahead);
                    _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
                    if K == 0 {
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64) as *const i8);
                    }
                }
                step(i, &mut acc);
                step(i + 16, &mut acc);
                i += 32;
            }
            if i < n16 {
                for r in 0..R {
                    _mm_prefetch::<_MM_HINT_T0>(w.add(r * row_bytes + i * es).wrapping_add(ahead) as *const i8);
                }
                step(i, &mut acc);
            }
            for r in 0..R {
                for c in 0..C {
                    *out.add(r * ostride + c) = if n16 == n {
                        reduce16_v(acc[r][c])
                    } else {
                        let mut a = [0f32; 16];
                        _mm512_storeu_ps(a.as_mut_ptr(), acc[r][c]);
                        for i in n16..n {
                            let wi = load_w1::<K>(w.add(r * row_bytes), i);
                            a[i - n16] = wi.mul_add(*x.add(c * xstride + i), a[i - n16]);
                        }
                        reduce16(a)
                    };
                }
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c,fma")]
    pub unsafe fn gemm_f(kind: u8, w: *const u8, row_bytes: usize, nrows: usize, x: &[f32], cols: usize, out: &mut [f32]) {
        const MAXC: usize = 6;
        let t = x.len() / cols;
        let tc = (token_chunk(t, cols * 4) / MAXC * MAXC).max(MAXC);
        let o = out.as_mut_ptr();
        let mut t0 = 0;
        // SAFETY (whole loop nest): every tile is in bounds (lengths checked by
        // the safe wrapper).
        unsafe {
            while t0 < t {
                let t1 = (t0 + tc).min(t);
                let mut r = 0;
                while r < nrows {
                    // 4 x 6 tiles; decode (one token) streams one row at a time,
                    // which the hardware prefetcher follows best (measured).
                    let rt = if t > 1 && nrows - r >= 4 { 4 } else { 1 };
                    let mut c = t0;
                    while c < t1 {
                        let ct = (t1 - c).min(MAXC);
                        let wp = w.add(r * row_bytes);
                        let xp = x.as_ptr().add(c * cols);
                        let op = o.add(r * t + c);
                        if rt == 4 {
                            dispatch_f!(4, ct, kind, wp, row_bytes, cols, xp, cols, op, t);
                        } else {
                            dispatch_f!(1, ct, kind, wp, row_bytes, cols, xp, cols, op, t);
                        }
                        c += ct;
                    }
                    r += rt;
                }
                t0 = t1;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// aarch64 NEON (quantized kernels, one row x one activation row at a time).

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::{reduce8, QAct};
    use crate::quant::{f16_bits_to_f32, QK};
    use std::arch::aarch64::*;

    /// Sums of groups of 4 products of 16 i8 pairs, as 4 i32 lanes.
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn dot16(w: int8x16_t, x: int8x16_t) -> int32x4_t {
        let lo = vmull_s8(vget_low_s8(w), vget_low_s8(x));
        let hi = vmull_high_s8(w, x);
        // Pairwise: [p0+p1, ..., p14+p15] (fits i16 for |q| <= 127), then to i32 groups of 4.
        vpaddlq_s16(vpaddq_s16(lo, hi))
    }

    #[target_feature(enable = "neon")]
    pub unsafe fn gemm_q(q4: bool, w: *const u8, row_bytes: usize, nrows: usize, nb: usize, a: &QAct, out: &mut [f32]) {
        let bb = if q4 { 2 + QK / 2 } else { 2 + QK };
        // SAFETY (whole body): rows < nrows of `w`, activation rows < a.t, and
        // outputs r * t + c are in bounds (checked by the safe wrapper).
        unsafe {
            for r in 0..nrows {
                for c in 0..a.t {
                    let mut acc0 = vdupq_n_f32(0.0);
                    let mut acc1 = vdupq_n_f32(0.0);
                    for b in 0..nb {
                        let p = w.add(r * row_bytes + b * bb);
                        let d = f16_bits_to_f32((p as *const u16).read_unaligned());
                        let (w0, w1) = if q4 {
                            let v = vld1q_u8(p.add(2));
                            let eight = vdupq_n_s8(8);
                            (
                                vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))), eight),
                                vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), eight),
                            )
                        } else {
                            (vld1q_s8(p.add(2) as *const i8), vld1q_s8(p.add(18) as *const i8))
                        };
                        let xp = a.qs.as_ptr().add(c * a.cols + b * QK);
                        let s = vdupq_n_f32(d * *a.d.as_ptr().add(c * nb + b));
                        let i0 = dot16(w0, vld1q_s8(xp));
                        let i1 = dot16(w1, vld1q_s8(xp.add(16)));
                        acc0 = vfmaq_f32(acc0, s, vcvtq_f32_s32(i0));
                        acc1 = vfmaq_f32(acc1, s, vcvtq_f32_s32(i1));
                    }
                    let mut l = [0f32; 8];
                    vst1q_f32(l.as_mut_ptr(), acc0);
                    vst1q_f32(l.as_mut_ptr().add(4), acc1);
                    *out.as_mut_ptr().add(r * a.t + c) = reduce8(l);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize_row;

    struct Rng(u64);
    impl Rng {
        fn f(&mut self) -> f32 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            let u = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
            ((u >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        fn vec(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.f()).collect()
        }
    }

    fn weights(dt: DType, rows: usize, cols: usize, rng: &mut Rng) -> (Vec<u8>, usize) {
        let rb = dt.row_bytes(cols).unwrap();
        let mut w = vec![0u8; rows * rb];
        for r in 0..rows {
            quantize_row(dt, &rng.vec(cols), &mut w[r * rb..(r + 1) * rb]);
        }
        (w, rb)
    }

    /// Every kernel set, every tile shape (rows and tokens not multiples of 4),
    /// bit-identical to the reference.
    #[test]
    fn simd_kernels_are_bit_identical_to_the_reference() {
        let mut rng = Rng(0xDEADBEEF);
        for &(rows, cols, t) in &[(9usize, 64usize, 1usize), (7, 96, 6), (13, 256, 9), (4, 32, 4), (5, 160, 3)] {
            let x = rng.vec(t * cols);
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
        for &(rows, cols, t) in &[(9usize, 64usize, 1usize), (7, 13, 6), (5, 100, 9), (4, 3, 5), (6, 40, 17), (5, 35, 7)] {
            let x = rng.vec(t * cols);
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
                for isa in available() {
                    let a = &x[..cols];
                    let b = &x[x.len() - cols..];
                    assert_eq!(dot_f32(isa, a, b).to_bits(), dot_f32(Isa::Scalar, a, b).to_bits());
                }
            }
        }
    }

    #[test]
    fn round_to_i8_is_round_then_saturating_cast() {
        let mut vals = vec![0.5f32, -0.5, 1.5, -1.5, 2.5, 126.5, 127.5, -127.5, -128.5, 127.49999, 0.49999997, -0.49999997];
        vals.extend([0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30, 128.0, -129.0, f32::MIN_POSITIVE]);
        let mut x = 0x1234_5678u32;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            vals.push(f32::from_bits(x) % 300.0);
            vals.push((x as f32 / u32::MAX as f32) * 260.0 - 130.0);
        }
        for v in vals {
            assert_eq!(round_to_i8(v), v.round() as i8, "{v:e}");
        }
    }

    /// The quantized kernels against f64 over the dequantized weights and the
    /// unquantized activations: the error is the activations' 8-bit rounding.
    #[test]
    fn quantized_kernels_are_close_to_exact() {
        let mut rng = Rng(42);
        let (rows, cols) = (16, 512);
        let x = rng.vec(cols);
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
#[cfg(test)]
mod quantize_tests {
    use super::*;

    /// Every quantization path gives the same bytes as the portable one, on
    /// random rows and on the edge cases: exact halves, NaN, infinities, zeros,
    /// subnormal blocks, a block of one sign.
    #[test]
    fn quantize_paths_agree() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut x: Vec<f32> = crate::backend::cpu::test_rng_vec(&mut seed, QK * 64).iter().map(|v| v * 4.0).collect();
        // Block 1: values landing exactly on halves (amax 127 -> id 1).
        for (j, v) in x[QK..2 * QK].iter_mut().enumerate() {
            *v = if j == 0 { 127.0 } else { j as f32 - 16.5 };
        }
        x[2 * QK + 3] = f32::NAN;
        x[3 * QK + 5] = f32::INFINITY;
        x[4 * QK + 7] = f32::NEG_INFINITY;
        x[5 * QK..6 * QK].fill(0.0);
        for v in x[6 * QK..7 * QK].iter_mut() {
            *v = 1e-40;
        }
        x[7 * QK..8 * QK].fill(f32::NAN);
        for v in x[8 * QK..9 * QK].iter_mut() {
            *v = -v.abs();
        }
        let n = x.len();
        let (mut q0, mut d0, mut s0) = (vec![0i8; n], vec![0f32; n / QK], vec![0i32; n / QK]);
        quantize_blocks(&x, &mut q0, &mut d0, &mut s0);
        let mut want_q = vec![0i8; n];
        for (b, (xb, qb)) in x.chunks_exact(QK).zip(want_q.chunks_exact_mut(QK)).enumerate() {
            let amax = xb.iter().filter(|v| !v.is_nan()).fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m });
            let id = if amax / 127.0 != 0.0 { 127.0 / amax } else { 0.0 };
            for (q, &v) in qb.iter_mut().zip(xb) {
                let r = (v * id).round();
                *q = if r.is_nan() { 0 } else { r.clamp(-128.0, 127.0) as i8 };
            }
            assert_eq!(d0[b].to_bits(), (amax / 127.0).to_bits(), "block {b}");
        }
        assert_eq!(q0, want_q);
        #[cfg(target_arch = "x86_64")]
        if detect() == Isa::Avx512Vnni {
            let (mut q1, mut d1, mut s1) = (vec![0i8; n], vec![0f32; n / QK], vec![0i32; n / QK]);
            // SAFETY: the CPU has AVX-512 F/BW/VL (detected).
            unsafe { quantize_avx512(&x, &mut q1, &mut d1, &mut s1) };
            assert_eq!(q1, q0);
            assert_eq!(d1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), d0.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            assert_eq!(s1, s0);
        }
    }
}
