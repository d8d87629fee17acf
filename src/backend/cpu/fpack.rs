//! F16 and BF16 weights repacked at load for the AVX-512 and AVX2 kernels: 32 rows
//! interleaved per column, so that decode streams one group at a time with its lines
//! prefetched into L1 and L2 ([`PF_L2`]; without prefetches, on AMD (Zen 3 and 4), 4 groups
//! side by side, AVX2 2) and prefill widens a group's block of 128 columns to f32 once, then
//! runs a broadcast micro-kernel over it for every token from the L1 cache ([`prefill_blocked`];
//! AVX-512: 32 rows x up to 12 tokens per tile, two 16-row weight vectors per column;
//! AVX2: 16 rows x up to 6 tokens, two 8-row vectors, the group's two halves in turn;
//! one broadcast activation per token).
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
    x86_kernels(isa) && matches!(dt, DType::F16 | DType::BF16)
}

/// Whether `isa` is one of the x86 kernel sets (the others take the portable walk).
fn x86_kernels(isa: Isa) -> bool {
    matches!(isa, Isa::Avx512Vnni | Isa::Avx2)
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

/// Whether [`gemm_tm`] takes `t` tokens on `isa`: the x86 kernel sets' prefill.
pub(crate) fn token_major(isa: Isa, t: usize) -> bool {
    t > 1 && x86_kernels(isa)
}

/// [`gemm`] for what [`token_major`] takes, with row `r0 + i`'s result for token `c` at
/// `o[i * ld.0 + c * ld.1]`: token-major (`(1, ys)`) as the matmul's output wants them
/// (no transpose afterwards), or row-major (`(t, 1)`, [`gemm`]). The same bits.
///
/// # Safety
/// `o[i * ld.0 + c * ld.1]` is writable for `i < nrows`, `c < t`, and nothing else reads or
/// writes those places until this returns.
pub(crate) unsafe fn gemm_tm(
    isa: Isa,
    p: &Packed,
    r0: usize,
    nrows: usize,
    x: &[f32],
    o: *mut f32,
    ld: (usize, usize),
) {
    assert!(token_major(isa, tokens(p, x)));
    // SAFETY: the outputs as the caller guarantees.
    unsafe { kernels(isa, false, p, r0, nrows, x, (o, ld)) }
}

/// [`gemm`], decode with (`pf`) or without its software prefetches (the same bits).
fn gemm_pf(isa: Isa, pf: bool, p: &Packed, r0: usize, nrows: usize, x: &[f32], out: &mut [f32]) {
    let t = tokens(p, x);
    assert_eq!(out.len(), nrows * t);
    if !x86_kernels(isa) {
        return gemm_portable(p, r0, nrows, x, out);
    }
    // SAFETY: `out` holds `nrows x t` values, row-major, and is borrowed exclusively.
    unsafe { kernels(isa, pf, p, r0, nrows, x, (out.as_mut_ptr(), (t, 1))) }
}

/// How many tokens `x` holds: whole rows of `p.cols` (asserted).
fn tokens(p: &Packed, x: &[f32]) -> usize {
    assert!(p.cols > 0 && x.len().is_multiple_of(p.cols), "{} activations for {} columns", x.len(), p.cols);
    x.len() / p.cols
}

/// The x86 kernel sets for `isa` (the portable walk elsewhere), outputs as [`gemm_tm`]'s.
///
/// # Safety
/// As [`gemm_tm`] for `out` (`(o, ld)`); for one token `ld.0` is 1; `x` holds whole rows
/// ([`tokens`]).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
unsafe fn kernels(isa: Isa, pf: bool, p: &Packed, r0: usize, nrows: usize, x: &[f32], out: (*mut f32, (usize, usize))) {
    assert!(r0.is_multiple_of(GROUP) && r0 + nrows <= p.rows, "rows {r0}..{} of {}", r0 + nrows, p.rows);
    assert!(x.len() > p.cols || out.1 .0 == 1, "one token's outputs side by side");
    #[cfg(target_arch = "x86_64")]
    let bf = p.dtype == DType::BF16;
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx512Vnni` is only chosen on CPUs with AVX-512 F/VL/BW, AVX2,
        // FMA and F16C; the groups and activation rows read are inside `p` and `x`
        // (lengths asserted above and by the callers, [`tokens`]).
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
        _ => unreachable!("{isa:?} has no packed F16/BF16 kernels"),
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

/// Decode under [`Prefetch::L1`] (Intel), both kernel sets: one group (32 rows) at a time,
/// each line 2 KiB ahead into L1 and `PF_L2` bytes ahead into L2. Measured on the Intel Xeon
/// VM of model 207 (`fpack_decode_bench`, 1 GiB F16 past its 300 MiB L3, one thread, GB/s;
/// before: only into L1, AVX-512 4 groups side by side, AVX2 2): AVX2 13.9 -> 17.4-19.2,
/// AVX-512 12.1 -> 17.2-19.4 (one group without the L2 prefetch 15.5-16.2, two groups with it
/// 16.9; 6, 8 and 12 KiB alike); TinyLlama tg32, t/s, 1 / 2 threads, AVX2 and AVX-512: F16
/// 7.2-7.4 -> 8.6-8.8 / 13.9-14.8 -> 16.9, BF16 6.9-7.0 -> 8.4-8.5 / 13.1-13.8 -> 16.3-16.9.
/// Without the prefetches (AMD: Zen 4 under `Prefetch::L2`, Zen 3 under `Prefetch::Near`,
/// [`super::isa::prefetch`]) the groups side by side stay as measured there; on Zen 3 these
/// prefetches held decode back (TinyLlama tg32, t/s, 1 / 2 threads: F16 5.9-6.2 -> 7.9-8.2 /
/// 9.8-11.0 -> 13.0-14.3 without them).
#[cfg(target_arch = "x86_64")]
const PF_L2: usize = 8192;

/// Columns per block of a prefill: one group's block widened to f32 (32 rows x `KC`
/// columns x 4 bytes, 16 KiB) stays in the L1 cache while every token passes over it,
/// each token's block of activations (512 bytes) while the group's rows do.
#[cfg(target_arch = "x86_64")]
const KC: usize = 128;

/// Most tokens per pass: their blocks of activations (`KC` columns, copied side by
/// side) stay in the L2 cache.
#[cfg(target_arch = "x86_64")]
const TOKENS: usize = 240;

/// Rows per pass: their accumulators for [`TOKENS`] tokens (240 KiB) stay in the L2 cache.
#[cfg(target_arch = "x86_64")]
const ROWS: usize = 16 * GROUP;

/// `step(k)` for `k` in `0..n` in order, four to a loop pass (the micro-kernels' column
/// loop: its own instructions once per four columns' FMAs).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn by_fours(n: usize, mut step: impl FnMut(usize)) {
    let mut k = 0;
    while k + 4 <= n {
        step(k);
        step(k + 1);
        step(k + 2);
        step(k + 3);
        k += 4;
    }
    while k < n {
        step(k);
        k += 1;
    }
}

/// Prefill's walk, both x86 kernel sets: per pass of up to [`ROWS`] rows and [`TOKENS`]
/// tokens, the columns in blocks of [`KC`]: the tokens' activations of the block copied
/// side by side (`kn` floats per token), then for each group of 32 rows the block
/// widened to f32 once (`widen(group(i), k0, w)`: the group at row `i` (`group(i)`, its
/// address), columns `k0 ..`,
/// `w.len() / 32` of them, column `k`'s 32 rows at `w[32 k ..]`) and multiplied with
/// every token's activations, `maxc` tokens and `hr` rows at a time (`tile(ct, w, kn, x,
/// acc)`: `w` from the tile's first row, `kn` columns; `x` the first token's `kn`
/// activations, the next tokens' after it; `acc` from the first token's first row,
/// tokens 32 apart: the accumulators, read and written back). Each row's FMAs still
/// run in column order (the sequential order: the accumulators only pass through
/// memory between blocks), while the widening (F16C or a shift; per token tile it
/// cost a quarter of the tile's vector operations) is done once per group and block,
/// and the weights and activations a tile reads come from L1 (the unblocked kernels
/// streamed both from L2 and reached 66-84% of the FMA peak). What the next group (or
/// column block) reads is prefetched into L2 a share at a time between the token tiles:
/// without it, widening waited on memory for each group's block and the copy of the
/// activations on L3 (Zen 3, TinyLlama F16 pp128 1 thread, interleaved runs, t/s: 35.0-39.8
/// without, 38.0-40.4 with; in a `cpu-clock` profile the widening's stall was 3% of the
/// prefill). Row `i`'s result for token `c` goes to `o[i * ld.0 + c * ld.1]` (as
/// [`gemm_tm`]'s): the matmul's token-major output directly, where the row-major one cost
/// a scatter here and a transpose after (together about 5% of that prefill's samples).
///
/// # Safety
/// As [`gemm_tm`] for the outputs.
#[cfg(target_arch = "x86_64")]
unsafe fn prefill_blocked(
    (nrows, t, cols, maxc, hr): (usize, usize, usize, usize, usize),
    x: &[f32],
    (o, ld): (*mut f32, (usize, usize)),
    group: impl Fn(usize) -> *const u8,
    mut widen: impl FnMut(*const u8, usize, &mut [f32]),
    mut tile: impl FnMut(usize, &[f32], usize, &[f32], &mut [f32]),
) {
    assert!(x.len() >= t * cols);
    // Buffers on a cache line's boundary: the widened block, the activations' block.
    let aligned = |v: &mut Vec<f32>, n: usize| {
        v.resize(n + 16, 0.0);
        let off = v.as_ptr().align_offset(64).min(16);
        off..off + n
    };
    let tmax = t.min(TOKENS);
    let (mut wraw, mut xraw) = (Vec::new(), Vec::new());
    let (wr, xr) = (aligned(&mut wraw, GROUP * KC), aligned(&mut xraw, tmax * KC));
    let (wbuf, xbuf) = (&mut wraw[wr], &mut xraw[xr]);
    // The accumulators of one pass: its groups x tokens (only as many groups as the rows).
    let mut acc = vec![0f32; nrows.min(ROWS).div_ceil(GROUP) * GROUP * tmax];
    for t0 in (0..t).step_by(TOKENS) {
        let tn = (t - t0).min(TOKENS);
        for m0 in (0..nrows).step_by(ROWS) {
            let groups = (nrows - m0).min(ROWS).div_ceil(GROUP);
            acc[..groups * GROUP * tn].fill(0.0);
            for k0 in (0..cols).step_by(KC) {
                let kn = (cols - k0).min(KC);
                for (c, xb) in xbuf.chunks_exact_mut(kn).take(tn).enumerate() {
                    xb.copy_from_slice(&x[(t0 + c) * cols + k0..][..kn]);
                }
                // What the next blocks read, asked for into L2 a share at a time between the
                // token tiles: the next group's block (its columns' lines), the next column
                // block's activations (each token's lines).
                let k1 = if k0 + KC < cols { k0 + KC } else { 0 };
                let (xlpt, ntiles) = ((cols - k1).min(KC).div_ceil(16), tn.div_ceil(maxc));
                let xlines = if k1 > 0 || m0 + ROWS < nrows { tn * xlpt } else { 0 };
                for j in 0..groups {
                    let (i, a) = (m0 + j * GROUP, &mut acc[j * GROUP * tn..(j + 1) * GROUP * tn]);
                    let w = &mut wbuf[..GROUP * kn];
                    widen(group(i), k0, w);
                    let next = if j + 1 < groups {
                        Some((group(i + GROUP), k0, kn))
                    } else if k0 + KC < cols {
                        Some((group(m0), k1, (cols - k1).min(KC)))
                    } else if m0 + ROWS < nrows {
                        Some((group(m0 + ROWS), 0, cols.min(KC)))
                    } else {
                        None
                    };
                    // `ntiles` token tiles of as near the same width as can be (128 tokens on
                    // AVX2: 20 of 6 and 2 of 4, not 21 of 6 and one of 2).
                    for s in 0..ntiles {
                        let (c, ct) = (s * tn / ntiles, (s + 1) * tn / ntiles - s * tn / ntiles);
                        if let Some((g, nk0, nkn)) = next {
                            for l in super::isa::part_lines(nkn * 64, s, ntiles) {
                                super::isa::prefetch_line::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                                    g.wrapping_add((nk0 + l) * 64),
                                );
                            }
                        }
                        for l in super::isa::part_lines(xlines * 64, j * ntiles + s, groups * ntiles) {
                            let src = x.as_ptr().wrapping_add((t0 + l / xlpt) * cols + k1 + 16 * (l % xlpt));
                            super::isa::prefetch_line::<{ std::arch::x86_64::_MM_HINT_T1 }>(src as *const u8);
                        }
                        for h in (0..(nrows - i).min(GROUP)).step_by(hr) {
                            tile(
                                ct,
                                &w[h..],
                                kn,
                                &xbuf[c * kn..(c + ct) * kn],
                                &mut a[GROUP * c + h..GROUP * (c + ct)],
                            );
                        }
                    }
                }
            }
            // The outputs in the order they lie: token by token (each token's rows of a group
            // side by side) or row by row.
            for j in 0..groups {
                let (i, a) = (m0 + j * GROUP, &acc[j * GROUP * tn..(j + 1) * GROUP * tn]);
                let n = (nrows - i).min(GROUP);
                // SAFETY: rows `i + r < nrows` and tokens `t0 + c < t` (the caller's outputs).
                unsafe {
                    if ld.1 == 1 {
                        for r in 0..n {
                            let or = o.add((i + r) * ld.0 + t0);
                            for c in 0..tn {
                                *or.add(c) = a[c * GROUP + r];
                            }
                        }
                    } else {
                        for c in 0..tn {
                            let oc = o.add(i * ld.0 + (t0 + c) * ld.1);
                            for r in 0..n {
                                *oc.add(r * ld.0) = a[c * GROUP + r];
                            }
                        }
                    }
                }
            }
        }
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

    /// Columns `k0 .. k0 + w.len() / 32` of one group (at `g`) widened to f32 into `w`:
    /// column `k`'s 32 rows at `w[32 k ..]`, as `ld16` widens them.
    ///
    /// # Safety
    /// The group holds `k0 + w.len() / 32` lines of 64 bytes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
    unsafe fn widen<const BF: bool>(g: *const u8, k0: usize, w: &mut [f32]) {
        for (k, col) in w.chunks_exact_mut(GROUP).enumerate() {
            // SAFETY: column `k0 + k` of the group (caller); `col` holds 32 f32.
            unsafe {
                let p = g.add((k0 + k) * 64);
                _mm512_storeu_ps(col.as_mut_ptr(), ld16::<BF>(p));
                _mm512_storeu_ps(col.as_mut_ptr().add(16), ld16::<BF>(p.add(32)));
            }
        }
    }

    /// A group's 32 rows of a widened block ([`super::prefill_blocked`]: `w`, columns 32
    /// f32 apart, `kn` of them) x C activation rows (`x`: the tokens' `kn` activations one
    /// after another): two weight loads and C broadcasts per column, 2 C FMAs (C = 12: 24
    /// accumulators), nothing widened. The accumulators come from and go back to `acc`
    /// (token `c`'s 32 rows at `acc[32 c ..]`).
    ///
    /// # Safety
    /// `w` holds `32 kn` f32, `x` `C kn`, `acc` `32 C`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
    unsafe fn tile<const C: usize>(w: &[f32], kn: usize, x: &[f32], acc: &mut [f32]) {
        let (w, x, acc) = (w.as_ptr(), x.as_ptr(), acc.as_mut_ptr());
        // SAFETY: (whole body) the caller's lengths; the CPU has this function's target
        // features (it is reached only through the kernel set `isa()` detected).
        unsafe {
            let mut a = [[_mm512_setzero_ps(); C]; 2];
            for c in 0..C {
                a[0][c] = _mm512_loadu_ps(acc.add(32 * c));
                a[1][c] = _mm512_loadu_ps(acc.add(32 * c + 16));
            }
            let xp: [*const f32; C] = std::array::from_fn(|c| x.add(c * kn));
            let step = |k: usize| {
                let w0 = _mm512_loadu_ps(w.add(32 * k));
                let w1 = _mm512_loadu_ps(w.add(32 * k + 16));
                for c in 0..C {
                    let xb = _mm512_set1_ps(*xp[c].add(k));
                    a[0][c] = _mm512_fmadd_ps(w0, xb, a[0][c]);
                    a[1][c] = _mm512_fmadd_ps(w1, xb, a[1][c]);
                }
            };
            super::by_fours(kn, step);
            for c in 0..C {
                _mm512_storeu_ps(acc.add(32 * c), a[0][c]);
                _mm512_storeu_ps(acc.add(32 * c + 16), a[1][c]);
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
                        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(super::PF_L2) as *const i8);
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

    macro_rules! dispatch {
        ($ct:expr, $($args:expr),*) => {
            match $ct {
                12 => tile::<12>($($args),*),
                11 => tile::<11>($($args),*),
                10 => tile::<10>($($args),*),
                9 => tile::<9>($($args),*),
                8 => tile::<8>($($args),*),
                7 => tile::<7>($($args),*),
                6 => tile::<6>($($args),*),
                5 => tile::<5>($($args),*),
                4 => tile::<4>($($args),*),
                3 => tile::<3>($($args),*),
                2 => tile::<2>($($args),*),
                _ => tile::<1>($($args),*),
            }
        };
    }

    /// `super::kernels` on AVX-512 (`BF`: the matrix is BF16, else F16; row `i`'s result for
    /// token `c` at `o[i * ld.0 + c * ld.1]`).
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL, AVX2, FMA and F16C; `super::kernels`' contract holds.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
    pub unsafe fn gemm<const BF: bool>(
        p: &Packed,
        pf: bool,
        r0: usize,
        nrows: usize,
        x: &[f32],
        (o, ld): (*mut f32, (usize, usize)),
    ) {
        const MAXC: usize = 12;
        let cols = p.cols;
        let t = x.len() / cols;
        let gs = cols * 64;
        let base = p.groups.bytes().as_ptr();
        // SAFETY: (whole body) the CPU has this function's target features (it is reached only
        // through the kernel set `isa()` detected); groups from `r0 / 32` up to row `r0 + nrows` are in
        // `p`, token rows `c..c + ct <= t` in `x`; the outputs as the caller guarantees
        // (`super::kernels`: one token's side by side).
        unsafe {
            if t == 1 {
                // With the prefetches one group at a time, else (AMD) 4 side by side
                // ([`super::PF_L2`]).
                const G: usize = 4;
                super::decode_walk(nrows, if pf { 1 } else { G }, |i, n, valid| {
                    let g = base.add((r0 + i) / GROUP * gs);
                    match (n, pf) {
                        (1, true) => gemv::<BF, 1, true>(g, gs, cols, x.as_ptr(), o.add(i), valid),
                        (1, false) => gemv::<BF, 1, false>(g, gs, cols, x.as_ptr(), o.add(i), valid),
                        _ => gemv::<BF, G, false>(g, gs, cols, x.as_ptr(), o.add(i), valid),
                    }
                });
                return;
            }
            super::prefill_blocked(
                (nrows, t, cols, MAXC, GROUP),
                x,
                (o, ld),
                // Dereferenced only by `widen`, for rows `i < nrows`; else only prefetched.
                |i| base.wrapping_add((r0 + i) / GROUP * gs),
                // SAFETY: `prefill_blocked` passes `group(i)` for `i < nrows`: a group of `p`
                // (above).
                |g, k0, w| widen::<BF>(g, k0, w),
                // SAFETY: `prefill_blocked` passes the slices `tile` needs (its contract).
                |ct, w, kn, x, acc| dispatch!(ct, w, kn, x, acc),
            );
        }
    }
}

/// The AVX2 kernels: the same layout and the same sequential order as `x86` (the
/// same bits), eight rows per f32 vector.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
mod x86_256 {
    use super::{Packed, GROUP};
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

    /// Columns `k0 .. k0 + w.len() / 32` of one group (at `g`) widened to f32 into `w`:
    /// column `k`'s 32 rows at `w[32 k ..]`, as `ld8` widens them.
    ///
    /// # Safety
    /// The group holds `k0 + w.len() / 32` lines of 64 bytes.
    #[inline]
    #[target_feature(enable = "avx2,f16c,fma")]
    unsafe fn widen<const BF: bool>(g: *const u8, k0: usize, w: &mut [f32]) {
        for (k, col) in w.chunks_exact_mut(GROUP).enumerate() {
            // SAFETY: column `k0 + k` of the group (caller); `col` holds 32 f32.
            unsafe {
                let p = g.add((k0 + k) * 64);
                for q in 0..4 {
                    _mm256_storeu_ps(col.as_mut_ptr().add(8 * q), ld8::<BF>(p.add(16 * q)));
                }
            }
        }
    }

    /// 16 rows of a widened block ([`super::prefill_blocked`]: `w` from the half's first row, columns
    /// 32 f32 apart, `kn` of them) x C activation rows (`x`: the block's first column,
    /// rows `cols` apart): two weight loads and C broadcasts per column, 2 C FMAs (C = 6:
    /// 12 accumulators, 15 of the 16 registers), nothing widened. The accumulators come
    /// from and go back to `acc` (token `c`'s 16 rows at `acc[32 c ..]`).
    ///
    /// # Safety
    /// `w` holds `32 (kn - 1) + 16` f32, `x` `(C - 1) cols + kn`, `acc` `32 (C - 1) + 16`.
    #[inline]
    #[target_feature(enable = "avx2,f16c,fma")]
    unsafe fn tile<const C: usize>(w: &[f32], kn: usize, x: &[f32], cols: usize, acc: &mut [f32]) {
        let (w, x, acc) = (w.as_ptr(), x.as_ptr(), acc.as_mut_ptr());
        // SAFETY: (whole body) the caller's lengths; the CPU has this function's target
        // features (reached only through the kernel set `isa()` detected).
        unsafe {
            let mut a = [[_mm256_setzero_ps(); C]; 2];
            for c in 0..C {
                a[0][c] = _mm256_loadu_ps(acc.add(32 * c));
                a[1][c] = _mm256_loadu_ps(acc.add(32 * c + 8));
            }
            let xp: [*const f32; C] = std::array::from_fn(|c| x.add(c * cols));
            let step = |k: usize| {
                let w0 = _mm256_loadu_ps(w.add(32 * k));
                let w1 = _mm256_loadu_ps(w.add(32 * k + 8));
                for c in 0..C {
                    let xb = _mm256_broadcast_ss(&*xp[c].add(k));
                    a[0][c] = _mm256_fmadd_ps(w0, xb, a[0][c]);
                    a[1][c] = _mm256_fmadd_ps(w1, xb, a[1][c]);
                }
            };
            super::by_fours(kn, step);
            for c in 0..C {
                _mm256_storeu_ps(acc.add(32 * c), a[0][c]);
                _mm256_storeu_ps(acc.add(32 * c + 8), a[1][c]);
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
                        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(super::PF_L2) as *const i8);
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
        ($ct:expr, $($args:expr),*) => {
            match $ct {
                6 => tile::<6>($($args),*),
                5 => tile::<5>($($args),*),
                4 => tile::<4>($($args),*),
                3 => tile::<3>($($args),*),
                2 => tile::<2>($($args),*),
                _ => tile::<1>($($args),*),
            }
        };
    }

    /// `super::kernels` on AVX2 (`BF`: the matrix is BF16, else F16; outputs as on AVX-512;
    /// the same bits as every kernel set).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `super::kernels`' contract holds.
    #[target_feature(enable = "avx2,f16c,fma")]
    pub unsafe fn gemm<const BF: bool>(
        p: &Packed,
        pf: bool,
        r0: usize,
        nrows: usize,
        x: &[f32],
        (o, ld): (*mut f32, (usize, usize)),
    ) {
        const MAXC: usize = 6;
        let cols = p.cols;
        let t = x.len() / cols;
        let gs = cols * 64;
        let base = p.groups.bytes().as_ptr();
        // SAFETY: (whole body) the CPU has this function's target features (reached only
        // through the kernel set `isa()` detected); groups from `r0 / 32` up to row `r0 + nrows`
        // are in `p`, token rows `c..c + ct <= t` in `x`; the outputs as the caller guarantees
        // (`super::kernels`: one token's side by side).
        unsafe {
            if t == 1 {
                // With the prefetches one group at a time, else (AMD) 2 side by side
                // ([`super::PF_L2`]).
                const G: usize = 2;
                super::decode_walk(nrows, if pf { 1 } else { G }, |i, n, valid| {
                    let g = base.add((r0 + i) / GROUP * gs);
                    match (n, pf) {
                        (1, true) => gemv::<BF, 1, true>(g, gs, cols, x.as_ptr(), o.add(i), valid),
                        (1, false) => gemv::<BF, 1, false>(g, gs, cols, x.as_ptr(), o.add(i), valid),
                        _ => gemv::<BF, G, false>(g, gs, cols, x.as_ptr(), o.add(i), valid),
                    }
                });
                return;
            }
            super::prefill_blocked(
                (nrows, t, cols, MAXC, 16),
                x,
                (o, ld),
                // Dereferenced only by `widen`, for rows `i < nrows`; else only prefetched.
                |i| base.wrapping_add((r0 + i) / GROUP * gs),
                // SAFETY: `prefill_blocked` passes `group(i)` for `i < nrows`: a group of `p`
                // (above).
                |g, k0, w| widen::<BF>(g, k0, w),
                // SAFETY: `prefill_blocked` passes the slices `tile` needs (its contract).
                |ct, w, kn, x, acc| dispatch!(ct, w, kn, x, kn, acc),
            );
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
            // Prefill: (20, 4100, 40): 33 column blocks, the last of 4 columns; (600, 130,
            // 245): two passes over the rows (512 + 88) and over the tokens (240 + 5), each
            // with a block of 128 columns and one of 2.
            &[
                (32usize, 64usize, 1usize),
                (200, 48, 1),
                (131, 37, 1),
                (45, 100, 13),
                (64, 16, 25),
                (7, 5, 3),
                (20, 4100, 40),
                (600, 130, 245),
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
                let want: Vec<f32> = (0..rows * t)
                    .map(|i| {
                        let (r, c) = (i / t, i % t);
                        dot_sequential_ref(dt, &w[r * cols * 2..(r + 1) * cols * 2], &x[c * cols..(c + 1) * cols])
                    })
                    .collect();
                for (isa, pf) in available().into_iter().flat_map(|i| [(i, false), (i, true)]) {
                    for r0 in (0..rows).step_by(GROUP) {
                        let n = rows - r0;
                        let mut got = vec![f32::NAN; n * t];
                        gemm_pf(isa, pf, &p, r0, n, &x, &mut got);
                        for i in 0..n {
                            for c in 0..t {
                                let r = r0 + i;
                                let want = want[r * t + c];
                                assert_eq!(
                                    got[i * t + c].to_bits(),
                                    want.to_bits(),
                                    "{dt} {isa:?} prefetch {pf} rows={rows} cols={cols} t={t} r={r} c={c}"
                                );
                            }
                        }
                        if pf && token_major(isa, t) {
                            // Token-major into a wider output (rows r0.. of `rows + 3` per token).
                            let ys = rows + 3;
                            let mut y = vec![f32::NAN; t * ys];
                            // SAFETY: `y` holds `t` rows of `ys >= r0 + n` values, borrowed here.
                            unsafe { gemm_tm(isa, &p, r0, n, &x, y.as_mut_ptr().add(r0), (1, ys)) };
                            for (k, v) in y.iter().enumerate() {
                                let (c, r) = (k / ys, k % ys);
                                if (r0..rows).contains(&r) {
                                    let want = want[r * t + c];
                                    assert_eq!(v.to_bits(), want.to_bits(), "{dt} {isa:?} token-major r={r} c={c}");
                                } else {
                                    assert!(v.is_nan(), "{dt} {isa:?} token-major wrote r={r} c={c}");
                                }
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
