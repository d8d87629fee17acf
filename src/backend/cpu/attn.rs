//! The page kernels of CPU attention (`ops::attention` drives them). One call
//! ([`run`]) takes a run of up to [`MAX_HEADS`] query heads that share one KV head,
//! for one token, over the cache pages holding that token's positions, and computes
//!
//! 1. scores: `s[h][p] = dot(q_h, k_p) * scale`, the dot one fused multiply-add
//!    chain over the head's dimensions in order (`acc = fma(q[j], k_p[j], acc)` from
//!    0), read from K pages stored transposed (`[dim][slot]`: the 16 slots of a page
//!    are 16 lanes, see `kv`), then the soft cap `c * tanh(s / c)` when set, and the
//!    maximum `m_h` over the valid positions;
//! 2. weights: `e[h][p] = exp_neg(s[h][p] - m_h)` ([`exp_neg`]: a fixed polynomial of
//!    fused multiply-adds), summed per lane `p % 16` over the pages in order, the 16
//!    lane sums then added by `isa::reduce16`;
//! 3. output: `o_h[j] = (sum_p e[h][p] * v_p[j]) * (1 / sum_h)`, the sum one fused
//!    multiply-add chain over the valid positions in order.
//!
//! Every value is one fixed sequence of f32 operations per element, so the AVX-512,
//! AVX2 and scalar versions give the same bits (tested below), whichever heads a
//! call groups, whatever the batch or the thread count. The previous kernel (one
//! dot call per position, scalar `exp`, one `axpy` per position) spent most of a
//! decode step at depth in call overhead and `expf`; these read each K page once per
//! run of heads and keep 8 to 16 accumulators in registers.
//!
//! Depends on `isa` (the kernel set, `reduce16`) and `crate::kv` (page size) only.
#![allow(clippy::needless_range_loop)]

use super::isa::{reduce16, Isa};
use crate::kv::BLOCK_POSITIONS as P;

/// The most query heads one [`run`] takes.
pub(crate) const MAX_HEADS: usize = 8;

/// One run of query heads over one token's pages.
pub(crate) struct Run<'a> {
    /// `heads` query rows of `hd` values, one after another.
    pub q: &'a [f32],
    pub heads: usize,
    pub hd: usize,
    /// Per page, the KV head's K values transposed: `hd * 16`, element `(slot, j)`
    /// at `j * 16 + slot`.
    pub kpages: &'a [&'a [f32]],
    /// Per page, the V rows from the KV head's first value of slot 0: slot `l`'s row
    /// at `l * vstride`, `hd` values.
    pub vpages: &'a [&'a [f32]],
    pub vstride: usize,
    /// The valid slots: `from..16` of the first page, `..to` of the last (`from < to`
    /// when there is one page).
    pub from: usize,
    pub to: usize,
    pub scale: f32,
    /// `c` of the soft cap `c * tanh(s / c)`; none when 0.
    pub softcap: f32,
}

impl Run<'_> {
    /// The valid slots of page `i`.
    #[inline]
    fn valid(&self, i: usize) -> (usize, usize) {
        let a = if i == 0 { self.from } else { 0 };
        let b = if i + 1 == self.kpages.len() { self.to } else { P };
        (a, b)
    }

    fn check(&self, out: &[f32]) {
        let (h, hd, np) = (self.heads, self.hd, self.kpages.len());
        assert!((1..=MAX_HEADS).contains(&h) && hd > 0 && np > 0 && self.vpages.len() == np);
        assert!(self.q.len() == h * hd && out.len() == h * hd && self.vstride >= hd);
        assert!(self.from < P && (1..=P).contains(&self.to) && (np > 1 || self.from < self.to));
        assert!(self.kpages.iter().all(|k| k.len() >= hd * P));
        assert!(self.vpages.iter().all(|v| v.len() >= (P - 1) * self.vstride + hd));
    }
}

const EXP_LO: f32 = -87.0;
const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const EXP_C: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

/// `exp(x)` for `x <= 0` (softmax weights): `x` clamped to -87, `n = round(x log2 e)`
/// (ties to even), `r = x - n ln 2` in two steps, a degree-7 polynomial in `r`
/// (Cephes' expf coefficients) by fused multiply-adds, times `2^n`. Within 2 ulp of
/// `exp` on `[-87, 0]` (tested); exactly 1 at 0; NaN stays NaN. The SIMD versions
/// are these operations lane by lane.
#[inline(always)]
pub(crate) fn exp_neg(x: f32) -> f32 {
    let x = if x < EXP_LO { EXP_LO } else { x };
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = EXP_C[0];
    for &c in &EXP_C[1..] {
        p = p.mul_add(r, c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `tanh(x)` in plain f32 arithmetic: no libm call, no fused multiply-add, selects
/// instead of branches, so a loop of it vectorizes (SSE2 and up) and every CPU gives
/// the same bits. `|x| < 0.25`: the odd Taylor polynomial to `x^11`; else
/// `(1 - e) / (1 + e)` with `e = exp(-2|x|)` (`|x|` clamped to 9, where tanh rounds to
/// 1; the reduction and polynomial of [`exp_neg`], unfused, the rounding to an integer
/// by the 1.5 * 2^23 trick); the sign put back. Within 4e-7 relative of tanh (tested
/// against f64); NaN stays NaN. gemma's GELU and soft caps call it per value: libm's
/// `tanhf` there cost a Gemma 2 2B decode step 4-5% (measured, docs/BENCHMARKS.md).
#[inline(always)]
pub(crate) fn tanh_f32(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0;
    let a = x.abs();
    let a = if a > 9.0 { 9.0 } else { a };
    let a2 = a * a;
    let small = a + a
        * a2
        * (-1.0 / 3.0 + a2 * (2.0 / 15.0 + a2 * (-17.0 / 315.0 + a2 * (62.0 / 2835.0 + a2 * (-1382.0 / 155_925.0)))));
    let y = -2.0 * a;
    let n = (y * LOG2E + ROUND) - ROUND;
    let r = (y - n * LN2_HI) - n * LN2_LO;
    let mut p = EXP_C[0];
    for &c in &EXP_C[1..] {
        p = p * r + c;
    }
    let e = (p * (r * r) + r + 1.0) * f32::from_bits(((n as i32 + 127) as u32) << 23);
    let big = (1.0 - e) / (1.0 + e);
    let t = if a < 0.25 { small } else { big };
    t.copysign(x)
}

/// Attention of `r.heads` query heads over `r`'s pages into `out` (`heads * hd`):
/// the three steps of the module docs, on `isa`'s kernels. `scratch` is reused.
pub(crate) fn run(isa: Isa, r: &Run<'_>, scratch: &mut Vec<f32>, out: &mut [f32]) {
    r.check(out);
    let np = r.kpages.len();
    // Every lane of every page is written by the scores before it is read.
    if scratch.len() < r.heads * np * P {
        scratch.resize(r.heads * np * P, 0.0);
    }
    let s = &mut scratch[..r.heads * np * P];
    let mut m = [f32::NEG_INFINITY; MAX_HEADS];
    let mut sums = [0f32; MAX_HEADS];
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512 F/VL/BW and AVX2/FMA are present when this set is chosen;
        // every page, row and output length was checked by `r.check` above.
        Isa::Avx512Vnni => unsafe { x512::scores(r, s, &mut m) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2/FMA present when this set is chosen; lengths checked above.
        Isa::Avx2 => unsafe { x256::scores(r, s, &mut m) },
        _ => scores_ref(r, s, &mut m),
    }
    if r.softcap > 0.0 {
        let c = r.softcap;
        for h in 0..r.heads {
            for i in 0..np {
                let (a, b) = r.valid(i);
                for x in &mut s[(h * np + i) * P + a..(h * np + i) * P + b] {
                    *x = c * tanh_f32(*x / c);
                }
            }
            // tanh is monotonic: the capped maximum is the cap of the maximum (to an ulp,
            // which the softmax's shift does not need exactly).
            m[h] = c * tanh_f32(m[h] / c);
        }
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above; `s` holds `heads * np * 16` values.
        Isa::Avx512Vnni => unsafe { x512::weights(r, s, &m, &mut sums) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { x256::weights(r, s, &m, &mut sums) },
        _ => weights_ref(r, s, &m, &mut sums),
    }
    let mut inv = [0f32; MAX_HEADS];
    for h in 0..r.heads {
        inv[h] = 1.0 / sums[h];
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx512Vnni => unsafe { x512::values(r, s, &inv, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { x256::values(r, s, &inv, out) },
        _ => values_ref(r, s, &inv, 0, r.hd, out),
    }
}

/// The page two ahead of page `i` (else the next, else `i`): what the SIMD kernels
/// prefetch while they compute page `i` (a decode step at depth reads every page from
/// memory, one 4 KiB run per head and page, too short for the hardware prefetcher
/// to ramp up).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const AHEAD: usize = 2;

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline]
fn ahead<'a>(pages: &[&'a [f32]], i: usize) -> &'a [f32] {
    pages.get(i + AHEAD).or(pages.last()).unwrap_or(&pages[i])
}

fn scores_ref(r: &Run<'_>, s: &mut [f32], m: &mut [f32; MAX_HEADS]) {
    let (hd, np) = (r.hd, r.kpages.len());
    for h in 0..r.heads {
        let q = &r.q[h * hd..(h + 1) * hd];
        for (i, kp) in r.kpages.iter().enumerate() {
            let (a, b) = r.valid(i);
            for l in 0..P {
                let mut acc = 0f32;
                for j in 0..hd {
                    acc = q[j].mul_add(kp[j * P + l], acc);
                }
                let v = acc * r.scale;
                s[(h * np + i) * P + l] = v;
                if (a..b).contains(&l) {
                    m[h] = m[h].max(v);
                }
            }
        }
    }
}

fn weights_ref(r: &Run<'_>, s: &mut [f32], m: &[f32; MAX_HEADS], sums: &mut [f32; MAX_HEADS]) {
    let np = r.kpages.len();
    for h in 0..r.heads {
        let mut lanes = [0f32; P];
        for i in 0..np {
            let (a, b) = r.valid(i);
            for (l, x) in s[(h * np + i) * P..(h * np + i + 1) * P].iter_mut().enumerate() {
                let e = if (a..b).contains(&l) { exp_neg(*x - m[h]) } else { 0.0 };
                *x = e;
                lanes[l] += e;
            }
        }
        sums[h] = reduce16(lanes);
    }
}

/// Columns `j0..j1` of every head's output.
fn values_ref(r: &Run<'_>, s: &[f32], inv: &[f32; MAX_HEADS], j0: usize, j1: usize, out: &mut [f32]) {
    let (hd, np) = (r.hd, r.kpages.len());
    for h in 0..r.heads {
        for j in j0..j1 {
            let mut acc = 0f32;
            for (i, vp) in r.vpages.iter().enumerate() {
                let (a, b) = r.valid(i);
                for l in a..b {
                    acc = s[(h * np + i) * P + l].mul_add(vp[l * r.vstride + j], acc);
                }
            }
            out[h * hd + j] = acc * inv[h];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x512 {
    use super::*;
    use std::arch::x86_64::*;

    /// [`exp_neg`] on 16 lanes: the same operations.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    unsafe fn exp_neg16(x: __m512) -> __m512 {
        // max(c, x) returns x when x is NaN, as the scalar `if x < c` does.
        let x = _mm512_max_ps(_mm512_set1_ps(EXP_LO), x);
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
            x,
            _mm512_set1_ps(LOG2E),
        ));
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), x);
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
        let mut p = _mm512_set1_ps(EXP_C[0]);
        for &c in &EXP_C[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0));
        let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)));
        _mm512_mul_ps(y, _mm512_castsi512_ps(e))
    }

    #[inline]
    fn mask(a: usize, b: usize) -> __mmask16 {
        (((1u32 << b) - 1) & !((1u32 << a) - 1)) as __mmask16
    }

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    unsafe fn scores_h<const H: usize>(r: &Run<'_>, h0: usize, s: &mut [f32], m: &mut [f32; MAX_HEADS]) {
        let (hd, np) = (r.hd, r.kpages.len());
        // SAFETY: (whole body) heads h0..h0 + H exist in `q`, each page holds hd * 16
        // values and `s` heads * np * 16 (checked by `Run::check` / `run`).
        unsafe {
            let q = r.q.as_ptr().add(h0 * hd);
            let mut mx = [_mm512_set1_ps(f32::NEG_INFINITY); H];
            for (i, kp) in r.kpages.iter().enumerate() {
                let (kt, ahead) = (kp.as_ptr(), ahead(r.kpages, i).as_ptr());
                let mut acc = [_mm512_setzero_ps(); H];
                for j in 0..hd {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.add(j * P) as *const i8);
                    let k = _mm512_loadu_ps(kt.add(j * P));
                    for h in 0..H {
                        acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(h * hd + j)), k, acc[h]);
                    }
                }
                let (a, b) = r.valid(i);
                let k = mask(a, b);
                for h in 0..H {
                    let v = _mm512_mul_ps(acc[h], _mm512_set1_ps(r.scale));
                    _mm512_storeu_ps(s.as_mut_ptr().add(((h0 + h) * np + i) * P), v);
                    mx[h] = _mm512_mask_max_ps(mx[h], k, mx[h], v);
                }
            }
            for h in 0..H {
                let mut lanes = [0f32; P];
                _mm512_storeu_ps(lanes.as_mut_ptr(), mx[h]);
                m[h0 + h] = lanes.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    pub(super) unsafe fn scores(r: &Run<'_>, s: &mut [f32], m: &mut [f32; MAX_HEADS]) {
        // SAFETY: the caller's checks cover every head count up to MAX_HEADS.
        unsafe {
            match r.heads {
                8 => scores_h::<8>(r, 0, s, m),
                7 => scores_h::<7>(r, 0, s, m),
                6 => scores_h::<6>(r, 0, s, m),
                5 => scores_h::<5>(r, 0, s, m),
                4 => scores_h::<4>(r, 0, s, m),
                3 => scores_h::<3>(r, 0, s, m),
                2 => scores_h::<2>(r, 0, s, m),
                _ => scores_h::<1>(r, 0, s, m),
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    pub(super) unsafe fn weights(r: &Run<'_>, s: &mut [f32], m: &[f32; MAX_HEADS], sums: &mut [f32; MAX_HEADS]) {
        let np = r.kpages.len();
        for h in 0..r.heads {
            let mut lanes = _mm512_setzero_ps();
            let mh = _mm512_set1_ps(m[h]);
            for i in 0..np {
                let (a, b) = r.valid(i);
                // SAFETY: page i of head h lies inside `s` (heads * np * 16 values).
                unsafe {
                    let p = s.as_mut_ptr().add((h * np + i) * P);
                    let e = _mm512_maskz_mov_ps(mask(a, b), exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(p), mh)));
                    _mm512_storeu_ps(p, e);
                    lanes = _mm512_add_ps(lanes, e);
                }
            }
            let mut l = [0f32; P];
            // SAFETY: 16 f32 into a 16-element array.
            unsafe { _mm512_storeu_ps(l.as_mut_ptr(), lanes) };
            sums[h] = reduce16(l);
        }
    }

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    unsafe fn values_hc<const H: usize, const C: usize>(
        r: &Run<'_>,
        s: &[f32],
        inv: &[f32; MAX_HEADS],
        h0: usize,
        j0: usize,
        out: &mut [f32],
    ) {
        let (hd, np) = (r.hd, r.kpages.len());
        // SAFETY: (whole body) columns j0..j0 + 16C lie within hd, rows within each
        // V page ((15 * vstride + hd values, checked), heads within `s` and `out`.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); C]; H];
            for (i, vp) in r.vpages.iter().enumerate() {
                let (a, b) = r.valid(i);
                let ahead = ahead(r.vpages, i).as_ptr();
                for l in a..b {
                    let row = vp.as_ptr().add(l * r.vstride + j0);
                    let mut v = [_mm512_setzero_ps(); C];
                    for c in 0..C {
                        _mm_prefetch::<_MM_HINT_T0>(ahead.add(l * r.vstride + j0 + 16 * c) as *const i8);
                        v[c] = _mm512_loadu_ps(row.add(16 * c));
                    }
                    for h in 0..H {
                        let w = _mm512_set1_ps(*s.get_unchecked(((h0 + h) * np + i) * P + l));
                        for c in 0..C {
                            acc[h][c] = _mm512_fmadd_ps(w, v[c], acc[h][c]);
                        }
                    }
                }
            }
            for h in 0..H {
                let iv = _mm512_set1_ps(inv[h0 + h]);
                for c in 0..C {
                    _mm512_storeu_ps(out.as_mut_ptr().add((h0 + h) * hd + j0 + 16 * c), _mm512_mul_ps(acc[h][c], iv));
                }
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    pub(super) unsafe fn values(r: &Run<'_>, s: &[f32], inv: &[f32; MAX_HEADS], out: &mut [f32]) {
        let hd = r.hd;
        let mut h0 = 0;
        while h0 < r.heads {
            let hn = (r.heads - h0).min(4);
            let mut j0 = 0;
            // SAFETY: each call's heads and columns lie inside the run (see values_hc).
            unsafe {
                while j0 + 64 <= hd {
                    match hn {
                        4 => values_hc::<4, 4>(r, s, inv, h0, j0, out),
                        3 => values_hc::<3, 4>(r, s, inv, h0, j0, out),
                        2 => values_hc::<2, 4>(r, s, inv, h0, j0, out),
                        _ => values_hc::<1, 4>(r, s, inv, h0, j0, out),
                    }
                    j0 += 64;
                }
                while j0 + 16 <= hd {
                    match hn {
                        4 => values_hc::<4, 1>(r, s, inv, h0, j0, out),
                        3 => values_hc::<3, 1>(r, s, inv, h0, j0, out),
                        2 => values_hc::<2, 1>(r, s, inv, h0, j0, out),
                        _ => values_hc::<1, 1>(r, s, inv, h0, j0, out),
                    }
                    j0 += 16;
                }
            }
            h0 += hn;
        }
        if !hd.is_multiple_of(16) {
            values_ref(r, s, inv, hd / 16 * 16, hd, out);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x256 {
    use super::*;
    use std::arch::x86_64::*;

    /// [`exp_neg`] on 8 lanes: the same operations.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp_neg8(x: __m256) -> __m256 {
        let x = _mm256_max_ps(_mm256_set1_ps(EXP_LO), x);
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
            x,
            _mm256_set1_ps(LOG2E),
        ));
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
        let mut p = _mm256_set1_ps(EXP_C[0]);
        for &c in &EXP_C[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
        let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
        _mm256_mul_ps(y, _mm256_castsi256_ps(e))
    }

    /// Lanes `a..b` of slots `8 * half .. 8 * half + 8` as all-ones.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn mask(a: usize, b: usize, half: usize) -> __m256 {
        let base = 8 * half as i32;
        let idx = _mm256_setr_epi32(base, base + 1, base + 2, base + 3, base + 4, base + 5, base + 6, base + 7);
        let ge = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(a as i32 - 1));
        let lt = _mm256_cmpgt_epi32(_mm256_set1_epi32(b as i32), idx);
        _mm256_castsi256_ps(_mm256_and_si256(ge, lt))
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn scores_h<const H: usize>(r: &Run<'_>, h0: usize, s: &mut [f32], m: &mut [f32; MAX_HEADS]) {
        let (hd, np) = (r.hd, r.kpages.len());
        // SAFETY: (whole body) as in the AVX-512 version.
        unsafe {
            let q = r.q.as_ptr().add(h0 * hd);
            let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
            let mut mx = [ninf; H];
            for (i, kp) in r.kpages.iter().enumerate() {
                let (kt, ahead) = (kp.as_ptr(), ahead(r.kpages, i).as_ptr());
                let mut acc = [[_mm256_setzero_ps(); 2]; H];
                for j in 0..hd {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.add(j * P) as *const i8);
                    let k0 = _mm256_loadu_ps(kt.add(j * P));
                    let k1 = _mm256_loadu_ps(kt.add(j * P + 8));
                    for h in 0..H {
                        let qj = _mm256_broadcast_ss(&*q.add(h * hd + j));
                        acc[h][0] = _mm256_fmadd_ps(qj, k0, acc[h][0]);
                        acc[h][1] = _mm256_fmadd_ps(qj, k1, acc[h][1]);
                    }
                }
                let (a, b) = r.valid(i);
                let (m0, m1) = (mask(a, b, 0), mask(a, b, 1));
                for h in 0..H {
                    let sc = _mm256_set1_ps(r.scale);
                    let (v0, v1) = (_mm256_mul_ps(acc[h][0], sc), _mm256_mul_ps(acc[h][1], sc));
                    let p = s.as_mut_ptr().add(((h0 + h) * np + i) * P);
                    _mm256_storeu_ps(p, v0);
                    _mm256_storeu_ps(p.add(8), v1);
                    mx[h] = _mm256_max_ps(mx[h], _mm256_blendv_ps(ninf, v0, m0));
                    mx[h] = _mm256_max_ps(mx[h], _mm256_blendv_ps(ninf, v1, m1));
                }
            }
            for h in 0..H {
                let mut lanes = [0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), mx[h]);
                m[h0 + h] = lanes.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scores(r: &Run<'_>, s: &mut [f32], m: &mut [f32; MAX_HEADS]) {
        let mut h0 = 0;
        while h0 < r.heads {
            let hn = (r.heads - h0).min(4);
            // SAFETY: heads h0..h0 + hn lie inside the run.
            unsafe {
                match hn {
                    4 => scores_h::<4>(r, h0, s, m),
                    3 => scores_h::<3>(r, h0, s, m),
                    2 => scores_h::<2>(r, h0, s, m),
                    _ => scores_h::<1>(r, h0, s, m),
                }
            }
            h0 += hn;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weights(r: &Run<'_>, s: &mut [f32], m: &[f32; MAX_HEADS], sums: &mut [f32; MAX_HEADS]) {
        let np = r.kpages.len();
        for h in 0..r.heads {
            let (mut l0, mut l1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mh = _mm256_set1_ps(m[h]);
            for i in 0..np {
                let (a, b) = r.valid(i);
                // SAFETY: page i of head h lies inside `s`.
                unsafe {
                    let p = s.as_mut_ptr().add((h * np + i) * P);
                    let e0 = _mm256_and_ps(mask(a, b, 0), exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(p), mh)));
                    let e1 = _mm256_and_ps(mask(a, b, 1), exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(p.add(8)), mh)));
                    _mm256_storeu_ps(p, e0);
                    _mm256_storeu_ps(p.add(8), e1);
                    l0 = _mm256_add_ps(l0, e0);
                    l1 = _mm256_add_ps(l1, e1);
                }
            }
            let mut l = [0f32; P];
            // SAFETY: 2 x 8 f32 into a 16-element array.
            unsafe {
                _mm256_storeu_ps(l.as_mut_ptr(), l0);
                _mm256_storeu_ps(l.as_mut_ptr().add(8), l1);
            }
            sums[h] = reduce16(l);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn values_hc<const H: usize, const C: usize>(
        r: &Run<'_>,
        s: &[f32],
        inv: &[f32; MAX_HEADS],
        h0: usize,
        j0: usize,
        out: &mut [f32],
    ) {
        let (hd, np) = (r.hd, r.kpages.len());
        // SAFETY: (whole body) as in the AVX-512 version, with columns j0..j0 + 8C.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); C]; H];
            for (i, vp) in r.vpages.iter().enumerate() {
                let (a, b) = r.valid(i);
                let ahead = ahead(r.vpages, i).as_ptr();
                for l in a..b {
                    let row = vp.as_ptr().add(l * r.vstride + j0);
                    let mut v = [_mm256_setzero_ps(); C];
                    for c in 0..C {
                        _mm_prefetch::<_MM_HINT_T0>(ahead.add(l * r.vstride + j0 + 8 * c) as *const i8);
                        v[c] = _mm256_loadu_ps(row.add(8 * c));
                    }
                    for h in 0..H {
                        let w = _mm256_broadcast_ss(s.get_unchecked(((h0 + h) * np + i) * P + l));
                        for c in 0..C {
                            acc[h][c] = _mm256_fmadd_ps(w, v[c], acc[h][c]);
                        }
                    }
                }
            }
            for h in 0..H {
                let iv = _mm256_set1_ps(inv[h0 + h]);
                for c in 0..C {
                    _mm256_storeu_ps(out.as_mut_ptr().add((h0 + h) * hd + j0 + 8 * c), _mm256_mul_ps(acc[h][c], iv));
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn values(r: &Run<'_>, s: &[f32], inv: &[f32; MAX_HEADS], out: &mut [f32]) {
        let hd = r.hd;
        let mut h0 = 0;
        while h0 < r.heads {
            let hn = (r.heads - h0).min(2);
            let mut j0 = 0;
            // SAFETY: each call's heads and columns lie inside the run (see values_hc).
            unsafe {
                while j0 + 32 <= hd {
                    match hn {
                        2 => values_hc::<2, 4>(r, s, inv, h0, j0, out),
                        _ => values_hc::<1, 4>(r, s, inv, h0, j0, out),
                    }
                    j0 += 32;
                }
                while j0 + 8 <= hd {
                    match hn {
                        2 => values_hc::<2, 1>(r, s, inv, h0, j0, out),
                        _ => values_hc::<1, 1>(r, s, inv, h0, j0, out),
                    }
                    j0 += 8;
                }
            }
            h0 += hn;
        }
        if !hd.is_multiple_of(8) {
            values_ref(r, s, inv, hd / 8 * 8, hd, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::isa::available;
    use crate::util::XorShift;

    #[test]
    fn attention_exp_neg_within_2_ulp_of_exp() {
        let mut worst = 0f64;
        let mut x = 0f32;
        while x > -87.0 {
            let (got, want) = (exp_neg(x) as f64, (x as f64).exp());
            worst = worst.max((got - want).abs() / (want * f32::EPSILON as f64));
            x -= 0.000_731;
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(exp_neg(0.0), 1.0);
        assert!(exp_neg(f32::NAN).is_nan());
        assert!(exp_neg(-1e30) > 0.0 && exp_neg(-1e30) < 1e-37);
        assert!(exp_neg(f32::NEG_INFINITY) < 1e-37);
    }

    /// `tanh_f32` against f64 tanh: relative error at most 4e-7 over [-20, 20] (dense
    /// near 0, where the polynomial hands over to the exp form), odd, exact at 0,
    /// saturating to +-1, NaN kept; and monotonic over that sweep.
    #[test]
    fn attention_tanh_f32_is_within_4e_7_of_tanh() {
        let mut worst = 0f64;
        let mut prev = -1.0f32;
        let mut x = -20.0f32;
        while x <= 20.0 {
            let got = tanh_f32(x);
            let want = (x as f64).tanh();
            worst = worst.max((got as f64 - want).abs() / want.abs().max(1e-30));
            assert!(got >= prev, "not monotonic at {x}: {got} < {prev}");
            assert_eq!(tanh_f32(-x).to_bits(), (-got).to_bits(), "odd at {x}");
            prev = got;
            x += if x.abs() < 0.5 { 0.000_013 } else { 0.000_71 };
        }
        for x in [1e-30f32, 1e-8, 3e-4, 0.249_999_98, 0.25, 0.250_000_03] {
            let want = (x as f64).tanh();
            worst = worst.max((tanh_f32(x) as f64 - want).abs() / want);
        }
        assert!(worst <= 4e-7, "worst relative error {worst:.3e}");
        assert_eq!(tanh_f32(0.0).to_bits(), 0);
        assert_eq!(tanh_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!((tanh_f32(30.0), tanh_f32(f32::INFINITY), tanh_f32(f32::NEG_INFINITY)), (1.0, 1.0, -1.0));
        assert!(tanh_f32(f32::NAN).is_nan());
    }

    /// Every kernel set gives the scalar set's bits, for head counts 1..=8, head
    /// sizes with and without SIMD tails, one and several pages, partial first and
    /// last pages and a soft cap; and the scalar set is softmax attention (f64).
    #[test]
    fn attention_page_kernels_equal_the_scalar_bits() {
        let mut rng = XorShift::new(0xA77E_0016);
        for &(heads, hd, np, from, to, cap) in &[
            (1usize, 64usize, 1usize, 0usize, 1usize, 0f32),
            (8, 64, 5, 3, 9, 0.0),
            (7, 128, 3, 15, 16, 0.0),
            (3, 80, 2, 0, 16, 30.0),
            (5, 40, 4, 7, 2, 0.0),
            (2, 12, 1, 4, 13, 0.0),
            (4, 256, 2, 1, 1, 50.0),
        ] {
            let kvd = hd * 2 + 8; // a second KV head and padding: strided rows
            let kbuf: Vec<Vec<f32>> = (0..np).map(|_| rng.vec(hd * P, -1.5, 1.5)).collect();
            let vbuf: Vec<Vec<f32>> = (0..np).map(|_| rng.vec(P * kvd, -1.0, 1.0)).collect();
            let q = rng.vec(heads * hd, -1.0, 1.0);
            let kpages: Vec<&[f32]> = kbuf.iter().map(|k| &k[..]).collect();
            let vpages: Vec<&[f32]> = vbuf.iter().map(|v| &v[hd..]).collect();
            let r = Run {
                q: &q,
                heads,
                hd,
                kpages: &kpages,
                vpages: &vpages,
                vstride: kvd,
                from,
                to,
                scale: 1.0 / (hd as f32).sqrt(),
                softcap: cap,
            };
            let mut scratch = Vec::new();
            let mut want = vec![f32::NAN; heads * hd];
            run(Isa::Scalar, &r, &mut scratch, &mut want);
            for isa in available() {
                let mut got = vec![f32::NAN; heads * hd];
                run(isa, &r, &mut scratch, &mut got);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{isa:?} heads {heads} hd {hd} pages {np} {from}..{to}");
            }
            // The scalar set against softmax in f64 over the valid positions.
            let pos: Vec<(usize, usize)> = (0..np)
                .flat_map(|i| (0..P).map(move |l| (i, l)))
                .filter(|&(i, l)| (r.valid(i).0..r.valid(i).1).contains(&l))
                .collect();
            for h in 0..heads {
                let sc: Vec<f64> = pos
                    .iter()
                    .map(|&(i, l)| {
                        let d: f64 = (0..hd).map(|j| q[h * hd + j] as f64 * kbuf[i][j * P + l] as f64).sum();
                        let d = d * r.scale as f64;
                        if cap > 0.0 {
                            cap as f64 * (d / cap as f64).tanh()
                        } else {
                            d
                        }
                    })
                    .collect();
                let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                for j in 0..hd {
                    let o: f64 = pos.iter().zip(&e).map(|(&(i, l), w)| w / z * vbuf[i][hd + l * kvd + j] as f64).sum();
                    let g = want[h * hd + j] as f64;
                    assert!((g - o).abs() < 2e-6, "heads {heads} hd {hd} head {h} dim {j}: {g} vs {o}");
                }
            }
        }
    }
}
