//! The AVX-512 float kernels of the 16-lane ("wide") orders (see `simd`'s docs):
//! F32 times f32, tiles of 4 weight rows x up to 6 activation rows. Only reached
//! through `simd::gemm_f` when `isa()` chose `Avx512Vnni`. (The quantized, F16 and
//! BF16 kernels of those CPUs read packed weights: `qpack`, `fpack`.)
//!
//! Depends on `isa` (reductions, `token_chunk`) and `crate::quant`.
#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::for_each_tile;
use crate::backend::cpu::isa::{reduce16, token_chunk};
use std::arch::x86_64::*;

/// [`reduce16`] in registers, the same additions in the same order:
/// `b = lo256 + hi256` (b[l] = a[l] + a[l + 8]), then `c = lo128(b) + hi128(b)`
/// (c[j] = b[j] + b[j + 4]), then `(c0 + c2) + (c1 + c3)`.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2")]
unsafe fn reduce16_v(v: __m512) -> f32 {
    let b =
        _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))));
    let c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps::<1>(b));
    let d = _mm_add_ps(c, _mm_movehl_ps(c, c));
    _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)))
}

/// Sixteen f32 weights from `p`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
unsafe fn load_w(p: *const u8) -> __m512 {
    // SAFETY: the caller passes a pointer to 16 f32.
    unsafe { _mm512_loadu_ps(p as *const f32) }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
unsafe fn load_w1(p: *const u8, i: usize) -> f32 {
    // SAFETY: the caller passes a row pointer with more than `i` elements.
    unsafe { (p as *const f32).add(i).read_unaligned() }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
unsafe fn tile_f<const R: usize, const C: usize>(
    w: *const u8,
    row_bytes: usize,
    n: usize,
    x: *const f32,
    xstride: usize,
    out: *mut f32,
    ostride: usize,
) {
    let es = 4;
    let n16 = n / 16 * 16;
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    // SAFETY: (whole body) the CPU has this function's target features (it is reached only
    // through the kernel set `isa()` detected); R rows of `n` elements at `w` (stride `row_bytes`)
    // and C rows of `n` f32 at `x` (stride `xstride`); prefetches never fault.
    unsafe {
        // The same spot of a row streamed soon: the next tile's rows, or for
        // decode (one row at a time) the row 3 ahead.
        let ahead = if C == 1 { 3 * R * row_bytes } else { R * row_bytes };
        let step = |i: usize, acc: &mut [[__m512; C]; R]| {
            let mut wv = [_mm512_setzero_ps(); R];
            for r in 0..R {
                wv[r] = load_w(w.add(r * row_bytes + i * es));
            }
            for c in 0..C {
                let xv = _mm512_loadu_ps(x.add(c * xstride + i));
                for r in 0..R {
                    acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
                }
            }
        };
        // 32 elements per turn: two prefetches per row (128 bytes of f32); each lane
        // still sums its elements in increasing order.
        let mut i = 0;
        while i + 32 <= n16 {
            for r in 0..R {
                let p = w.add(r * row_bytes + i * es).wrapping_add(ahead);
                _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64) as *const i8);
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
                        let wi = load_w1(w.add(r * row_bytes), i);
                        a[i - n16] = wi.mul_add(*x.add(c * xstride + i), a[i - n16]);
                    }
                    reduce16(a)
                };
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c,fma")]
pub unsafe fn gemm_f(w: *const u8, row_bytes: usize, nrows: usize, x: &[f32], cols: usize, out: &mut [f32]) {
    const MAXC: usize = 6;
    let t = x.len() / cols;
    let tc = (token_chunk(t, cols * 4) / MAXC * MAXC).max(MAXC);
    let o = out.as_mut_ptr();
    // 4 x 6 tiles; decode (one token) streams one row at a time, which the
    // hardware prefetcher follows best (measured).
    for_each_tile(nrows, t, tc, MAXC, t > 1, |r, rt, c, ct| {
        // SAFETY: the CPU has this function's target features (it is reached only
        // through the kernel set `isa()` detected); every tile is in bounds (lengths
        // checked by the safe wrapper).
        unsafe {
            let wp = w.add(r * row_bytes);
            let xp = x.as_ptr().add(c * cols);
            let op = o.add(r * t + c);
            if rt == 4 {
                dispatch_f!(4, ct, wp, row_bytes, cols, xp, cols, op, t);
            } else {
                dispatch_f!(1, ct, wp, row_bytes, cols, xp, cols, op, t);
            }
        }
    });
}
