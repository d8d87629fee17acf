//! F16 weights repacked at load for the AVX-512 kernels: 32 rows interleaved per
//! column, so that prefill runs a broadcast micro-kernel (64 rows x up to 6
//! tokens per tile: four 16-row weight vectors per column, one broadcast
//! activation per token) and decode streams 4 groups side by side.
//!
//! This is the "sequential order" of an F16 row's dot product, used on AVX-512
//! CPUs for F16 matrices (packed or not):
//!
//! ```text
//! acc = 0; for k in 0..n: acc = fma(f16(w[k]), x[k], acc)
//! ```
//!
//! Layout of one group of 32 rows (rows past the matrix's end are zero): for each
//! column `k` in turn, the 32 rows' f16 values of that column (64 bytes, one
//! cache line). Groups are `cols * 64` bytes, 64-byte aligned.

use super::groups::Groups;
use super::isa::Isa;
use crate::quant::{f16_bits_to_f32, DType};
use crate::Result;

/// Rows per packed group (two 512-bit vectors of f32 lanes).
pub const GROUP: usize = 32;

/// An F16 matrix in the packed layout (see the module docs).
pub struct Packed {
    groups: Groups,
    pub rows: usize,
    pub cols: usize,
}

/// Whether `isa` computes F16 dot products in the sequential order (and so wants
/// packed weights).
pub fn sequential_order(isa: Isa, dt: DType) -> bool {
    isa == Isa::Avx512Vnni && dt == DType::F16
}

impl Packed {
    /// Repacks `rows` rows of an F16 matrix of `cols` columns (`w`: rows of
    /// `2 * cols` bytes) on up to `threads` threads. `name` is for the error when
    /// the memory cannot be had.
    pub fn new(w: &[u8], rows: usize, cols: usize, name: &str, threads: usize) -> Result<Packed> {
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
        let what = || format!("tensor '{name}' (F16, {rows} x {cols})");
        let groups = Groups::build(rows.div_ceil(GROUP), group_bytes, threads, what, pack_group)?;
        Ok(Packed { groups, rows, cols })
    }
}

/// Reference sequential-order dot of one stored F16 row with `x`.
pub fn dot_sequential_ref(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (v, &xi) in row.chunks_exact(2).zip(x) {
        acc = f16_bits_to_f32(u16::from_le_bytes([v[0], v[1]])).mul_add(xi, acc);
    }
    acc
}

/// `out[i * t + c] = dot(row r0 + i, x row c)` for `nrows` rows of `p` starting
/// at `r0` (a multiple of [`GROUP`]), `x` holding `t` rows of `cols`, in the
/// sequential order.
pub fn gemm(isa: Isa, p: &Packed, r0: usize, nrows: usize, x: &[f32], out: &mut [f32]) {
    assert!(r0.is_multiple_of(GROUP) && r0 + nrows <= p.rows, "rows {r0}..{} of {}", r0 + nrows, p.rows);
    assert!(p.cols > 0 && x.len().is_multiple_of(p.cols));
    let t = x.len() / p.cols;
    assert_eq!(out.len(), nrows * t);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx512Vnni` is only chosen on CPUs with AVX-512 F/VL/BW, AVX2,
        // FMA and F16C; the groups and activation rows read are inside `p` and `x`
        // (lengths asserted above).
        Isa::Avx512Vnni => unsafe { x86::gemm(p, r0, nrows, x, out) },
        _ => gemm_portable(p, r0, nrows, x, out),
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
                let w = f16_bits_to_f32(u16::from_le_bytes([bytes[go + k * 64], bytes[go + k * 64 + 1]]));
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

    /// One group (32 rows at `g`) x C activation rows (`x`, stride `cols`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
    unsafe fn tile<const NG: usize, const C: usize>(
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
                    w[j][0] = _mm512_cvtph_ps(_mm256_load_si256(p as *const __m256i));
                    w[j][1] = _mm512_cvtph_ps(_mm256_load_si256(p.add(32) as *const __m256i));
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
    unsafe fn gemv<const G: usize>(
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
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(2048) as *const i8);
                    let w0 = _mm512_cvtph_ps(_mm256_load_si256(p as *const __m256i));
                    let w1 = _mm512_cvtph_ps(_mm256_load_si256(p.add(32) as *const __m256i));
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
        ($ct:expr, $($args:expr),*) => {
            match $ct {
                12 => tile::<1, 12>($($args),*),
                11 => tile::<1, 11>($($args),*),
                10 => tile::<1, 10>($($args),*),
                9 => tile::<1, 9>($($args),*),
                8 => tile::<1, 8>($($args),*),
                7 => tile::<1, 7>($($args),*),
                6 => tile::<1, 6>($($args),*),
                5 => tile::<1, 5>($($args),*),
                4 => tile::<1, 4>($($args),*),
                3 => tile::<1, 3>($($args),*),
                2 => tile::<1, 2>($($args),*),
                _ => tile::<1, 1>($($args),*),
            }
        };
    }

    macro_rules! dispatch2 {
        ($ct:expr, $($args:expr),*) => {
            match $ct {
                6 => tile::<2, 6>($($args),*),
                5 => tile::<2, 5>($($args),*),
                4 => tile::<2, 4>($($args),*),
                3 => tile::<2, 3>($($args),*),
                2 => tile::<2, 2>($($args),*),
                _ => tile::<2, 1>($($args),*),
            }
        };
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
    pub unsafe fn gemm(p: &Packed, r0: usize, nrows: usize, x: &[f32], out: &mut [f32]) {
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
                let mut i = 0;
                while i < nrows {
                    let g = base.add((r0 + i) / GROUP * gs);
                    if nrows - i > (G - 1) * GROUP {
                        gemv::<G>(g, gs, cols, x.as_ptr(), o.add(i), (nrows - i - (G - 1) * GROUP).min(GROUP));
                        i += G * GROUP;
                    } else {
                        gemv::<1>(g, gs, cols, x.as_ptr(), o.add(i), (nrows - i).min(GROUP));
                        i += GROUP;
                    }
                }
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
                            dispatch2!(ct, g, gs, cols, xp, op, t, valid);
                        } else {
                            dispatch1!(ct, g, gs, cols, xp, op, t, valid);
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
            &[(32usize, 64usize, 1usize), (200, 48, 1), (131, 37, 1), (45, 100, 13), (64, 16, 25), (7, 5, 3)]
        {
            let x = rnd(t * cols);
            let w: Vec<u8> =
                rnd(rows * cols).iter().flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes()).collect();
            let p = Packed::new(&w, rows, cols, "test", 1 + rows % 3).unwrap();
            for isa in available() {
                for r0 in (0..rows).step_by(GROUP) {
                    let n = rows - r0;
                    let mut got = vec![f32::NAN; n * t];
                    gemm(isa, &p, r0, n, &x, &mut got);
                    for i in 0..n {
                        for c in 0..t {
                            let r = r0 + i;
                            let want =
                                dot_sequential_ref(&w[r * cols * 2..(r + 1) * cols * 2], &x[c * cols..(c + 1) * cols]);
                            assert_eq!(
                                got[i * t + c].to_bits(),
                                want.to_bits(),
                                "{isa:?} rows={rows} cols={cols} t={t} r={r} c={c}"
                            );
                        }
                    }
                }
            }
        }
    }
}
