//! F16 and BF16 weights repacked at load for the AVX-512 and AVX2 kernels: 32 rows
//! interleaved per column, so that prefill runs a broadcast micro-kernel (AVX-512:
//! 64 rows x up to 6 tokens per tile, four 16-row weight vectors per column; AVX2:
//! 16 rows x up to 6 tokens, two 8-row vectors, the group's two halves in turn; one
//! broadcast activation per token) and decode streams 4 (AVX2: 2) groups side by side.
//!
//! This is the "sequential order" of an F16 or BF16 row's dot product, used on
//! AVX-512 and AVX2 CPUs for those matrices (packed or not), so both give the same
//! bits (`w[k]` widened exactly to f32: F16C for F16, a 16-bit shift for BF16):
//!
//! ```text
//! acc = 0; for k in 0..n: acc = fma(f32(w[k]), x[k], acc)
//! ```
//!
//! Layout of one group of 32 rows (rows past the matrix's end are zero): for each
//! column `k` in turn, the 32 rows' 16-bit values of that column (64 bytes, one
//! cache line). Groups are `cols * 64` bytes, 64-byte aligned.

use super::groups::Groups;
use super::isa::{Isa, Prefetch};
use crate::quant::{bf16_bits_to_f32, f16_bits_to_f32, DType};
use crate::Result;

/// Rows per packed group (two 512-bit vectors of f32 lanes).
pub const GROUP: usize = 32;

/// An F16 or BF16 matrix in the packed layout (see the module docs).
pub struct Packed {
    groups: Groups,
    /// F16 or BF16.
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
}

/// Whether `isa` computes dot products of `dt` rows in the sequential order (and so
/// wants packed weights).
pub fn sequential_order(isa: Isa, dt: DType) -> bool {
    matches!(isa, Isa::Avx512Vnni | Isa::Avx2) && matches!(dt, DType::F16 | DType::BF16)
}

impl Packed {
    /// Repacks `rows` rows of an F16 or BF16 (`dt`) matrix of `cols` columns (`w`:
    /// rows of `2 * cols` bytes) on up to `threads` threads. `name` is for the error
    /// when the memory cannot be had.
    pub fn new(dt: DType, w: &[u8], rows: usize, cols: usize, name: &str, threads: usize) -> Result<Packed> {
        assert!(matches!(dt, DType::F16 | DType::BF16), "{dt} is not packed by fpack");
        assert!(w.len() >= rows * cols * 2);
        let group_bytes = cols * 64;
        let pack_group = |g: usize, dst: &mut [u8]| {
            for r in g * GROUP..((g + 1) * GROUP).min(rows) {
                let lane = r % GROUP;
                let row = &w[r * cols * 2..(r + 1) * cols * 2];
                for (k, v) in row.chunks_exact(2).enumerate() {
                    dst[k * 64 + lane * 2..k * 64 + lane * 2 + 2].copy_from_slice(v);
                }
            }
        };
        let what = || format!("tensor '{name}' ({dt}, {rows} x {cols})");
        let groups = Groups::build(rows.div_ceil(GROUP), group_bytes, threads, what, pack_group)?;
        Ok(Packed { groups, dtype: dt, rows, cols })
    }
}

/// One stored 16-bit value of `dt` (F16 or BF16) widened to f32 (exactly).
fn widen(dt: DType, v: [u8; 2]) -> f32 {
    let bits = u16::from_le_bytes(v);
    if dt == DType::BF16 {
        bf16_bits_to_f32(bits)
    } else {
        f16_bits_to_f32(bits)
    }
}

/// Reference sequential-order dot of one stored F16 or BF16 (`dt`) row with `x`.
pub fn dot_sequential_ref(dt: DType, row: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (v, &xi) in row.chunks_exact(2).zip(x) {
        acc = widen(dt, [v[0], v[1]]).mul_add(xi, acc);
    }
    acc
}

/// `out[i * t + c] = dot(row r0 + i, x row c)` for `nrows` rows of `p` starting
/// at `r0` (a multiple of [`GROUP`]), `x` holding `t` rows of `cols`, in the
/// sequential order.
pub fn gemm(isa: Isa, p: &Packed, r0: usize, nrows: usize, x: &[f32], out: &mut [f32]) {
    gemm_pf(isa, super::isa::prefetch() == Prefetch::L1, p, r0, nrows, x, out)
}

/// [`gemm`], decode with (`pf`) or without its software prefetches (the same bits).
fn gemm_pf(isa: Isa, pf: bool, p: &Packed, r0: usize, nrows: usize, x: &[f32], out: &mut [f32]) {
    let _ = pf; // read by the x86 kernels only
    assert!(r0.is_multiple_of(GROUP) && r0 + nrows <= p.rows, "rows {r0}..{} of {}", r0 + nrows, p.rows);
    assert!(p.cols > 0 && x.len().is_multiple_of(p.cols));
    let t = x.len() / p.cols;
    assert_eq!(out.len(), nrows * t);
    #[cfg(target_arch = "x86_64")]
    let bf = p.dtype == DType::BF16;
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx512Vnni` is only chosen on CPUs with AVX-512 F/VL/BW, AVX2,
        // FMA and F16C; the groups and activation rows read are inside `p` and `x`
        // (lengths asserted above).
        Isa::Avx512Vnni => unsafe {
            if bf {
                x86::gemm::<true>(p, pf, r0, nrows, x, out)
            } else {
                x86::gemm::<false>(p, pf, r0, nrows, x, out)
            }
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2` is only chosen on CPUs with AVX2, FMA and F16C; bounds as above.
        Isa::Avx2 => unsafe {
            if bf {
                x86_256::gemm::<true>(p, pf, r0, nrows, x, out)
            } else {
                x86_256::gemm::<false>(p, pf, r0, nrows, x, out)
            }
        },
        _ => gemm_portable(p, r0, nrows, x, out),
    }
}

/// Decode's walk over the groups of rows `0..nrows` of a product: `f(i, n, valid)` for
/// `n` groups side by side from row `i` (`wide`, or 1 for the last few), the last of
/// them with `valid` rows (a kernel set's `gemv::<BF, n>` at row `i`).
#[cfg(target_arch = "x86_64")]
fn decode_walk(nrows: usize, wide: usize, mut f: impl FnMut(usize, usize, usize)) {
    let mut i = 0;
    while i < nrows {
        let n = if nrows - i > (wide - 1) * GROUP { wide } else { 1 };
        f(i, n, (nrows - i - (n - 1) * GROUP).min(GROUP));
        i += n * GROUP;
    }
}

/// The packed layout read back element by element: the sequential order exactly.
fn gemm_portable(p: &Packed, r0: usize, nrows: usize, x: &[f32], out: &mut [f32]) {
    let bytes = p.groups.bytes();
    let (cols, t) = (p.cols, x.len() / p.cols);
    for i in 0..nrows {
        let r = r0 + i;
        let go = (r / GROUP) * cols * 64 + (r % GROUP) * 2;
        for c in 0..t {
            let mut acc = 0f32;
            for k in 0..cols {
                let w = widen(p.dtype, [bytes[go + k * 64], bytes[go + k * 64 + 1]]);
                acc = w.mul_add(x[c * cols + k], acc);
            }
            out[i * t + c] = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
mod x86 {
    use super::{Packed, GROUP};
    use crate::backend::cpu::isa::token_chunk;
    use std::arch::x86_64::*;

    /// 16 values (32 bytes at `p`, 32-byte aligned) widened to f32: F16C for F16,
    /// a 16-bit shift for BF16 (`BF`); both exact.
    ///
    /// # Safety
    /// 32 readable bytes at `p`, aligned.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
    unsafe fn ld16<const BF: bool>(p: *const u8) -> __m512 {
        // SAFETY: the caller guarantees the 32 bytes.
        let v = unsafe { _mm256_load_si256(p as *const __m256i) };
        if BF {
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v)))
        } else {
            _mm512_cvtph_ps(v)
        }
    }

    /// One group (32 rows at `g`) x C activation rows (`x`, stride `cols`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
    unsafe fn tile<const BF: bool, const NG: usize, const C: usize>(
        g: *const u8,
        gs: usize,
        cols: usize,
        x: *const f32,
        out: *mut f32,
        ostride: usize,
        valid: usize,
    ) {
        let mut acc = [[[_mm512_setzero_ps(); C]; 2]; NG];
        // SAFETY: (whole body) the CPU has this function's target features (it is reached only
        // through the kernel set `isa()` detected); the group holds `cols` lines of 64 bytes; C rows of
        // `cols` f32 at `x`; outputs for `valid` rows x C tokens at `out` (the
        // driver checks); prefetches never fault.
        unsafe {
            for k in 0..cols {
                let mut w = [[_mm512_setzero_ps(); 2]; NG];
                for j in 0..NG {
                    let p = g.add(j * gs + k * 64);
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(1024) as *const i8);
                    w[j][0] = ld16::<BF>(p);
                    w[j][1] = ld16::<BF>(p.add(32));
                }
                for c in 0..C {
                    let xb = _mm512_set1_ps(*x.add(c * cols + k));
                    for j in 0..NG {
                        acc[j][0][c] = _mm512_fmadd_ps(w[j][0], xb, acc[j][0][c]);
                        acc[j][1][c] = _mm512_fmadd_ps(w[j][1], xb, acc[j][1][c]);
                    }
                }
            }
            for j in 0..NG {
                for c in 0..C {
                    let mut v = [0f32; GROUP];
                    _mm512_storeu_ps(v.as_mut_ptr(), acc[j][0][c]);
                    _mm512_storeu_ps(v.as_mut_ptr().add(16), acc[j][1][c]);
                    let n = if j + 1 == NG { valid } else { GROUP };
                    for r in 0..n {
                        *out.add((j * GROUP + r) * ostride + c) = v[r];
                    }
                }
            }
        }
    }

    /// One activation row against G groups side by side (decode).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
    unsafe fn gemv<const BF: bool, const G: usize, const PF: bool>(
        g: *const u8,
        gstride: usize,
        cols: usize,
        x: *const f32,
        out: *mut f32,
        valid: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 2]; G];
        // SAFETY: (whole body) the CPU has this function's target features (it is reached only
        // through the kernel set `isa()` detected); G groups of `cols` lines at `g + j * gstride`, one
        // row of `cols` f32 at `x`; `32 (G - 1) + valid` outputs at `out`.
        unsafe {
            for k in 0..cols {
                let xb = _mm512_set1_ps(*x.add(k));
                for j in 0..G {
                    let p = g.add(j * gstride + k * 64);
                    if PF {
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(2048) as *const i8);
                    }
                    let w0 = ld16::<BF>(p);
                    let w1 = ld16::<BF>(p.add(32));
                    acc[j][0] = _mm512_fmadd_ps(w0, xb, acc[j][0]);
                    acc[j][1] = _mm512_fmadd_ps(w1, xb, acc[j][1]);
                }
            }
            for j in 0..G {
                let mut v = [0f32; GROUP];
                _mm512_storeu_ps(v.as_mut_ptr(), acc[j][0]);
                _mm512_storeu_ps(v.as_mut_ptr().add(16), acc[j][1]);
                let n = if j + 1 == G { valid } else { GROUP };
                for r in 0..n {
                    *out.add(j * GROUP + r) = v[r];
                }
            }
        }
    }

    macro_rules! dispatch1 {
        ($bf:ident, $ct:expr, $($args:expr),*) => {
            match $ct {
                12 => tile::<$bf, 1, 12>($($args),*),
                11 => tile::<$bf, 1, 11>($($args),*),
                10 => tile::<$bf, 1, 10>($($args),*),
                9 => tile::<$bf, 1, 9>($($args),*),
                8 => tile::<$bf, 1, 8>($($args),*),
                7 => tile::<$bf, 1, 7>($($args),*),
                6 => tile::<$bf, 1, 6>($($args),*),
                5 => tile::<$bf, 1, 5>($($args),*),
                4 => tile::<$bf, 1, 4>($($args),*),
                3 => tile::<$bf, 1, 3>($($args),*),
                2 => tile::<$bf, 1, 2>($($args),*),
                _ => tile::<$bf, 1, 1>($($args),*),
            }
        };
    }

    macro_rules! dispatch2 {
        ($bf:ident, $ct:expr, $($args:expr),*) => {
            match $ct {
                6 => tile::<$bf, 2, 6>($($args),*),
                5 => tile::<$bf, 2, 5>($($args),*),
                4 => tile::<$bf, 2, 4>($($args),*),
                3 => tile::<$bf, 2, 3>($($args),*),
                2 => tile::<$bf, 2, 2>($($args),*),
                _ => tile::<$bf, 2, 1>($($args),*),
            }
        };
    }

    /// `super::gemm` on AVX-512 (`BF`: the matrix is BF16, else F16).
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL, AVX2, FMA and F16C; `super::gemm`'s assertions hold.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
    pub unsafe fn gemm<const BF: bool>(p: &Packed, pf: bool, r0: usize, nrows: usize, x: &[f32], out: &mut [f32]) {
        const MAXC: usize = 12;
        let cols = p.cols;
        let t = x.len() / cols;
        let gs = cols * 64;
        let base = p.groups.bytes().as_ptr();
        let o = out.as_mut_ptr();
        // SAFETY: (whole body) the CPU has this function's target features (it is reached only
        // through the kernel set `isa()` detected); groups from `r0 / 32` up to row `r0 + nrows` are in
        // `p`, token rows `c..c + ct <= t` in `x`, outputs `i * t + c` for
        // `i < nrows` in `out` (the safe wrapper checked the lengths).
        unsafe {
            if t == 1 {
                const G: usize = 4;
                super::decode_walk(nrows, G, |i, n, valid| {
                    let g = base.add((r0 + i) / GROUP * gs);
                    match (n == G, pf) {
                        (true, true) => gemv::<BF, G, true>(g, gs, cols, x.as_ptr(), o.add(i), valid),
                        (true, false) => gemv::<BF, G, false>(g, gs, cols, x.as_ptr(), o.add(i), valid),
                        (false, true) => gemv::<BF, 1, true>(g, gs, cols, x.as_ptr(), o.add(i), valid),
                        (false, false) => gemv::<BF, 1, false>(g, gs, cols, x.as_ptr(), o.add(i), valid),
                    }
                });
                return;
            }
            let tc = (token_chunk(t, cols * 4) / MAXC * MAXC).max(MAXC);
            let mut t0 = 0;
            while t0 < t {
                let t1 = (t0 + tc).min(t);
                let mut i = 0;
                while i < nrows {
                    let g = base.add((r0 + i) / GROUP * gs);
                    // Two groups (64 rows: 4 weight vectors) x 6 tokens, 10 loads per
                    // 24 FMAs; a last lone group takes 32 rows x 12 tokens.
                    let two = nrows - i > GROUP;
                    let valid = if two { (nrows - i - GROUP).min(GROUP) } else { (nrows - i).min(GROUP) };
                    let maxc = if two { 6 } else { MAXC };
                    let mut c = t0;
                    while c < t1 {
                        let ct = (t1 - c).min(maxc);
                        let (xp, op) = (x.as_ptr().add(c * cols), o.add(i * t + c));
                        if two {
                            dispatch2!(BF, ct, g, gs, cols, xp, op, t, valid);
                        } else {
                            dispatch1!(BF, ct, g, gs, cols, xp, op, t, valid);
                        }
                        c += ct;
                    }
                    i += if two { 2 * GROUP } else { GROUP };
                }
                t0 = t1;
            }
        }
    }
}

/// The AVX2 kernels: the same layout and the same sequential order as `x86` (the
/// same bits), eight rows per f32 vector.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
mod x86_256 {
    use super::{Packed, GROUP};
    use crate::backend::cpu::isa::token_chunk;
    use std::arch::x86_64::*;

    /// 8 values (16 bytes at `p`, 16-byte aligned) widened to f32: F16C for F16, a
    /// 16-bit shift for BF16 (`BF`); both exact.
    ///
    /// # Safety
    /// 16 readable bytes at `p`, aligned.
    #[inline]
    #[target_feature(enable = "avx2,f16c,fma")]
    unsafe fn ld8<const BF: bool>(p: *const u8) -> __m256 {
        // SAFETY: the caller guarantees the 16 bytes.
        let v = unsafe { _mm_load_si128(p as *const __m128i) };
        if BF {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
        } else {
            _mm256_cvtph_ps(v)
        }
    }

    /// Rows `h * 16 .. h * 16 + 16` of one group (at `g`) x C activation rows (`x`,
    /// stride `cols`): two weight vectors and C broadcasts per column, 2 C FMAs (C = 6:
    /// 12 accumulators, 15 of the 16 registers). Row `r < valid` (of the 16) of token
    /// `c` goes to `out[r * ostride + c]`.
    #[inline]
    #[target_feature(enable = "avx2,f16c,fma")]
    unsafe fn tile<const BF: bool, const C: usize>(
        g: *const u8,
        h: usize,
        cols: usize,
        x: *const f32,
        out: *mut f32,
        ostride: usize,
        valid: usize,
    ) {
        let mut acc = [[_mm256_setzero_ps(); C]; 2];
        // SAFETY: (whole body) the CPU has this function's target features (reached only through
        // the kernel set `isa()` detected); the group holds `cols` lines of 64 bytes, of which
        // bytes `32 h .. 32 h + 32` are read; C rows of `cols` f32 at `x`; `valid` rows x C
        // tokens of outputs at `out` (the driver checks); prefetches never fault.
        unsafe {
            let g = g.add(32 * h);
            for k in 0..cols {
                let p = g.add(k * 64);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(1024) as *const i8);
                let w0 = ld8::<BF>(p);
                let w1 = ld8::<BF>(p.add(16));
                for c in 0..C {
                    let xb = _mm256_broadcast_ss(&*x.add(c * cols + k));
                    acc[0][c] = _mm256_fmadd_ps(w0, xb, acc[0][c]);
                    acc[1][c] = _mm256_fmadd_ps(w1, xb, acc[1][c]);
                }
            }
            for c in 0..C {
                let mut v = [0f32; 16];
                _mm256_storeu_ps(v.as_mut_ptr(), acc[0][c]);
                _mm256_storeu_ps(v.as_mut_ptr().add(8), acc[1][c]);
                for r in 0..valid.min(16) {
                    *out.add(r * ostride + c) = v[r];
                }
            }
        }
    }

    /// One activation row against G groups side by side (decode): four weight vectors
    /// (32 rows) per group and column, 4 G independent accumulators.
    #[inline]
    #[target_feature(enable = "avx2,f16c,fma")]
    unsafe fn gemv<const BF: bool, const G: usize, const PF: bool>(
        g: *const u8,
        gstride: usize,
        cols: usize,
        x: *const f32,
        out: *mut f32,
        valid: usize,
    ) {
        let mut acc = [[_mm256_setzero_ps(); 4]; G];
        // SAFETY: (whole body) the CPU has this function's target features; G groups of `cols`
        // lines at `g + j * gstride`, one row of `cols` f32 at `x`; `32 (G - 1) + valid`
        // outputs at `out` (the driver checks); prefetches never fault.
        unsafe {
            for k in 0..cols {
                let xb = _mm256_broadcast_ss(&*x.add(k));
                for j in 0..G {
                    let p = g.add(j * gstride + k * 64);
                    if PF {
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(2048) as *const i8);
                    }
                    for q in 0..4 {
                        let w = ld8::<BF>(p.add(16 * q));
                        acc[j][q] = _mm256_fmadd_ps(w, xb, acc[j][q]);
                    }
                }
            }
            for j in 0..G {
                let mut v = [0f32; GROUP];
                for q in 0..4 {
                    _mm256_storeu_ps(v.as_mut_ptr().add(8 * q), acc[j][q]);
                }
                let n = if j + 1 == G { valid } else { GROUP };
                for r in 0..n {
                    *out.add(j * GROUP + r) = v[r];
                }
            }
        }
    }

    macro_rules! dispatch {
        ($bf:ident, $ct:expr, $($args:expr),*) => {
            match $ct {
                6 => tile::<$bf, 6>($($args),*),
                5 => tile::<$bf, 5>($($args),*),
                4 => tile::<$bf, 4>($($args),*),
                3 => tile::<$bf, 3>($($args),*),
                2 => tile::<$bf, 2>($($args),*),
                _ => tile::<$bf, 1>($($args),*),
            }
        };
    }

    /// `super::gemm` on AVX2 (`BF`: the matrix is BF16, else F16; the same bits as every
    /// kernel set).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `super::gemm`'s assertions hold.
    #[target_feature(enable = "avx2,f16c,fma")]
    pub unsafe fn gemm<const BF: bool>(p: &Packed, pf: bool, r0: usize, nrows: usize, x: &[f32], out: &mut [f32]) {
        const MAXC: usize = 6;
        let cols = p.cols;
        let t = x.len() / cols;
        let gs = cols * 64;
        let base = p.groups.bytes().as_ptr();
        let o = out.as_mut_ptr();
        // SAFETY: (whole body) the CPU has this function's target features (reached only
        // through the kernel set `isa()` detected); groups from `r0 / 32` up to row `r0 + nrows`
        // are in `p`, token rows `c..c + ct <= t` in `x`, outputs `i * t + c` for `i < nrows`
        // in `out` (the safe wrapper checked the lengths).
        unsafe {
            if t == 1 {
                const G: usize = 2;
                super::decode_walk(nrows, G, |i, n, valid| {
                    let g = base.add((r0 + i) / GROUP * gs);
                    match (n == G, pf) {
                        (true, true) => gemv::<BF, G, true>(g, gs, cols, x.as_ptr(), o.add(i), valid),
                        (true, false) => gemv::<BF, G, false>(g, gs, cols, x.as_ptr(), o.add(i), valid),
                        (false, true) => gemv::<BF, 1, true>(g, gs, cols, x.as_ptr(), o.add(i), valid),
                        (false, false) => gemv::<BF, 1, false>(g, gs, cols, x.as_ptr(), o.add(i), valid),
                    }
                });
                return;
            }
            // Token chunks whose activations stay in the L2 cache while a group's halves
            // stream past them.
            let tc = (token_chunk(t, cols * 4) / MAXC * MAXC).max(MAXC);
            let mut t0 = 0;
            while t0 < t {
                let t1 = (t0 + tc).min(t);
                let mut i = 0;
                while i < nrows {
                    let g = base.add((r0 + i) / GROUP * gs);
                    for h in 0..2 {
                        let rows = (nrows - i).min(GROUP);
                        if rows <= 16 * h {
                            break;
                        }
                        let valid = rows - 16 * h;
                        let mut c = t0;
                        while c < t1 {
                            let ct = (t1 - c).min(MAXC);
                            let (xp, op) = (x.as_ptr().add(c * cols), o.add((i + 16 * h) * t + c));
                            dispatch!(BF, ct, g, h, cols, xp, op, t, valid);
                            c += ct;
                        }
                    }
                    i += GROUP;
                }
                t0 = t1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::isa::available;

    /// Packed kernels (every kernel set, token tiles 1..12 and more, partial
    /// groups, row ranges inside the matrix, threads) are bit-identical to the
    /// sequential reference over the stored rows.
    #[test]
    fn packed_f16_kernels_match_the_sequential_reference() {
        let mut rng = crate::util::XorShift::new(0x9E37_79B9_7F4A_7C15);
        let mut rnd = |n: usize| rng.vec(n, -1.0, 1.0);
        for &(rows, cols, t) in
            // (20, 4100, 40): two token chunks of the AVX2 prefill (32 + 8 at this row length).
            &[
                (32usize, 64usize, 1usize),
                (200, 48, 1),
                (131, 37, 1),
                (45, 100, 13),
                (64, 16, 25),
                (7, 5, 3),
                (20, 4100, 40),
            ]
        {
            let x = rnd(t * cols);
            for dt in [DType::F16, DType::BF16] {
                let v = rnd(rows * cols);
                let w: Vec<u8> = if dt == DType::F16 {
                    v.iter().flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes()).collect()
                } else {
                    v.iter().flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes()).collect()
                };
                let p = Packed::new(dt, &w, rows, cols, "test", 1 + rows % 3).unwrap();
                for (isa, pf) in available().into_iter().flat_map(|i| [(i, false), (i, true)]) {
                    for r0 in (0..rows).step_by(GROUP) {
                        let n = rows - r0;
                        let mut got = vec![f32::NAN; n * t];
                        gemm_pf(isa, pf, &p, r0, n, &x, &mut got);
                        for i in 0..n {
                            for c in 0..t {
                                let r = r0 + i;
                                let want = dot_sequential_ref(
                                    dt,
                                    &w[r * cols * 2..(r + 1) * cols * 2],
                                    &x[c * cols..(c + 1) * cols],
                                );
                                assert_eq!(
                                    got[i * t + c].to_bits(),
                                    want.to_bits(),
                                    "{dt} {isa:?} prefetch {pf} rows={rows} cols={cols} t={t} r={r} c={c}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod bench {
    use super::*;
    use crate::backend::cpu::isa::available;

    /// Kernel speed, one thread (not an assertion: run with `--ignored --nocapture`):
    /// TinyLlama's prefill shapes (rows x cols) against 128 tokens, in GFLOP/s.
    #[test]
    #[ignore]
    fn fpack_bench() {
        let mut rng = crate::util::XorShift::new(3);
        let t = 128;
        for (rows, cols) in [(2048usize, 2048usize), (5632, 2048), (2048, 5632)] {
            let v = rng.vec(rows * cols, -1.0, 1.0);
            let w: Vec<u8> = v.iter().flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes()).collect();
            let p = Packed::new(DType::F16, &w, rows, cols, "bench", 2).unwrap();
            let x = rng.vec(t * cols, -1.0, 1.0);
            let mut out = vec![0f32; rows * t];
            for isa in available().into_iter().filter(|&i| i != Isa::Scalar) {
                let n = rows.min(512);
                let best = crate::util::best_secs(|| gemm(isa, &p, 0, n, &x, &mut out[..n * t]));
                eprintln!("F16 {isa:?} {n}x{cols} x {t}: {:.1} GFLOP/s", 2.0 * (n * cols * t) as f64 / best / 1e9);
            }
        }
    }

    /// Decode speed from memory, one thread (not an assertion): a 1 GiB F16 matrix (past
    /// the Intel VM's 480 MiB L3; `FPACK_BENCH_MIB` sets the size) against one token, each
    /// kernel set without and with its software prefetches, in GB/s of weights.
    #[test]
    #[ignore]
    fn fpack_decode_bench() {
        let mut rng = crate::util::XorShift::new(5);
        let cols = 4096;
        let mib: usize = std::env::var("FPACK_BENCH_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(1024);
        let rows = (mib << 20) / (2 * cols);
        let w: Vec<u8> = rng
            .vec(rows * cols, -1.0, 1.0)
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
            .collect();
        let p = Packed::new(DType::F16, &w, rows, cols, "bench", 2).unwrap();
        drop(w);
        let x = rng.vec(cols, -1.0, 1.0);
        let mut out = vec![0f32; rows];
        for isa in available().into_iter().filter(|&i| i != Isa::Scalar) {
            for pf in [false, true] {
                let best = crate::util::best_secs(|| gemm_pf(isa, pf, &p, 0, rows, &x, &mut out));
                eprintln!("F16 {isa:?} prefetch {pf}: {:.2} GB/s", (2 * rows * cols) as f64 / best / 1e9);
            }
        }
    }
}
