//! The AVX2 + FMA + F16C kernels of the 8-lane float order (see `simd`'s docs):
//! F32 times f32, tiles of 4 weight rows x up to 3 activation rows, and attention's
//! f32 dot. (Q8_0 / Q4_0, F16 and BF16 weights are
//! packed at load for the block-order and sequential-order kernels of `qpack` and
//! `fpack`.)
//! Only reached through `simd`'s safe entry points, when `isa()` chose `Avx2` (or
//! `Avx512Vnni`, whose CPUs have these features too).
//!
//! Depends on `isa` (reductions, `token_chunk`) and `crate::quant`.
#![allow(clippy::needless_range_loop, clippy::too_many_arguments, unused_unsafe)]

use super::for_each_tile;
use crate::backend::cpu::isa::{reduce8, token_chunk};
use std::arch::x86_64::*;

/// The kernels, written once as a macro over the feature set so that every
/// function (tiles included) is compiled with the features it needs.
macro_rules! x86_kernels {
    ($feat:literal) => {
        /// Eight f32 weights from `p`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn load_w(p: *const u8) -> __m256 {
            // SAFETY: the caller passes a pointer to 8 f32.
            unsafe { _mm256_loadu_ps(p as *const f32) }
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn load_w1(p: *const u8, i: usize) -> f32 {
            // SAFETY: the caller passes a row pointer with more than `i` elements.
            unsafe { (p as *const f32).add(i).read_unaligned() }
        }

        #[inline]
        #[target_feature(enable = $feat)]
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
            let n8 = n / 8 * 8;
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            // SAFETY: (whole body) the CPU has this function's target features (it is reached only
            // through the kernel set `isa()` detected); R rows of `n` elements at `w` (stride
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
                        wv[r] = load_w(p);
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
                            let wi = load_w1(w.add(r * row_bytes), i);
                            a[i - n8] = wi.mul_add(*x.add(c * xstride + i), a[i - n8]);
                        }
                        *out.add(r * ostride + c) = reduce8(a);
                    }
                }
            }
        }

        #[target_feature(enable = $feat)]
        pub unsafe fn gemm_f(w: *const u8, row_bytes: usize, nrows: usize, x: &[f32], cols: usize, out: &mut [f32]) {
            let t = x.len() / cols;
            // AVX2 has 16 registers: 4 x 3 tiles (12 accumulators).
            let maxc = 3;
            let tc = token_chunk(t, cols * 4) / maxc * maxc;
            let tc = tc.max(maxc);
            let o = out.as_mut_ptr();
            for_each_tile(nrows, t, tc, maxc, true, |r, rt, c, ct| {
                // SAFETY: the CPU has this function's target features (it is reached only
                // through the kernel set `isa()` detected); as in `gemm_q`, every tile is in bounds.
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
    };
}

x86_kernels!("avx2,fma,f16c");
