//! The AVX2 + FMA + F16C kernels of the 8-lane orders (see `simd`'s docs):
//! quantized (Q8_0 / Q4_0 times [`QAct`]) and float (F32 / F16 / BF16 times f32)
//! tiles of 4 weight rows x up to 3 activation rows, and attention's f32 dot.
//! Only reached through `simd`'s safe entry points, when `isa()` chose `Avx2` (or
//! `Avx512Vnni`, whose CPUs have these features too).
//!
//! Depends on `isa` (reductions, `QAct`, `token_chunk`, `dpbusd_avx2`) and `crate::quant`.
#![allow(clippy::needless_range_loop, clippy::too_many_arguments, unused_unsafe)]

use super::for_each_tile;
use crate::backend::cpu::isa::{dpbusd_avx2, reduce8, token_chunk, QAct};
use crate::quant::QK;
use std::arch::x86_64::*;

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

/// The kernels, written once as a macro over the feature set so that every
/// function (tiles included) is compiled with the features it needs.
macro_rules! x86_kernels {
    ($feat:literal, $vnni:expr) => {
        const VNNI: bool = $vnni;

        /// `acc + sum over groups of 4 of u8(a) * i8(b)`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn dpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: this module's kernels only run on CPUs with `$feat`.
            unsafe { dpbusd_avx2(acc, a, b) }
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
            // SAFETY: (whole body) the CPU has this function's target features (it is reached only
            // through the kernel set `isa()` detected); the driver passes pointers to R rows of
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
                        let negcorr =
                            if Q4 { _mm256_sub_epi32(zero, dpbusd(zero, _mm256_set1_epi8(8), xv)) } else { zero };
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
        pub unsafe fn gemm_q(
            q4: bool,
            w: *const u8,
            row_bytes: usize,
            nrows: usize,
            nb: usize,
            a: &QAct,
            out: &mut [f32],
        ) {
            let t = a.t;
            // 4 x 4 tiles with the 32 registers of AVX-512VL, 4 x 2 with AVX2's 16.
            let maxc = if VNNI { 4 } else { 2 };
            let tc = (token_chunk(t, a.cols) / maxc * maxc).max(maxc);
            let o = out.as_mut_ptr();
            for_each_tile(nrows, t, tc, maxc, true, |r, rt, c, ct| {
                // SAFETY: the CPU has this function's target features (it is reached only
                // through the kernel set `isa()` detected); rows `r..r + rt <= nrows` of `w`,
                // activation rows `c..c + ct <= t` and outputs `r * t + c` are all in bounds
                // (the safe wrapper checked the lengths).
                unsafe {
                    let wp = w.add(r * row_bytes);
                    let xq = a.qs.as_ptr().add(c * a.cols);
                    let xd = a.d.as_ptr().add(c * nb);
                    let op = o.add(r * t + c);
                    if rt == 4 {
                        dispatch_c!(4, ct, q4, wp, row_bytes, nb, xq, a.cols, xd, nb, op, t);
                    } else {
                        dispatch_c!(1, ct, q4, wp, row_bytes, nb, xq, a.cols, xd, nb, op, t);
                    }
                }
            });
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
        pub unsafe fn gemm_f(
            kind: u8,
            w: *const u8,
            row_bytes: usize,
            nrows: usize,
            x: &[f32],
            cols: usize,
            out: &mut [f32],
        ) {
            let t = x.len() / cols;
            // 4 x 6 tiles keep 24 accumulators in the 32 registers of AVX-512VL;
            // plain AVX2 has 16 registers: 4 x 3.
            let maxc = if VNNI { 4 } else { 3 };
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
                        dispatch_f!(4, ct, kind, wp, row_bytes, cols, xp, cols, op, t);
                    } else {
                        dispatch_f!(1, ct, kind, wp, row_bytes, cols, xp, cols, op, t);
                    }
                }
            });
        }

        #[target_feature(enable = $feat)]
        pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
            let mut o = 0f32;
            // SAFETY: one row of `a.len()` f32 each (equal lengths checked by the caller).
            unsafe { tile_f::<1, 1, 0>(a.as_ptr() as *const u8, 0, a.len(), b.as_ptr(), 0, &mut o, 0) };
            o
        }
    };
}

x86_kernels!("avx2,fma,f16c", false);
