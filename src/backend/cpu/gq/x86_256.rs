//! The AVX2 + FMA + F16C kernels of the group order (see the parent module's docs)
//! for all ten grouped types, decode (one token) and prefill (tiles of tokens)
//! alike.
//!
//! Structure: a tile is 8 weight rows, one f32 lane each, so the fused
//! multiply-adds of 8 rows run side by side in one register per token and every
//! row keeps its own order. The row is cut into *units* of 8 groups (a K-quant
//! super-block, or 8 consecutive 32-value blocks; the last unit of a small-block
//! row may be shorter). Per unit the group scales / offsets of the 8 rows are
//! formed in f32 vectors with the rows in lanes (per row the 8 groups' scales in
//! lanes, then an 8 x 8 transpose; a transposed tile's straight from its scale
//! vectors, [`scales_t`]). Each group's 32 integers come from SIMD
//! unpacking (nibble masks, shifts, high-bit merges, the IQ4 levels by `pshufb`):
//! decode (one token) unpacks them straight into the dot product; prefill unpacks
//! the unit once into a buffer (8 x 8 vectors) and reuses it for a chunk of up to
//! 32 tokens. Per token and group: per row one `maddubs` (32 products, in i16
//! pairs), then for the 8 rows together a tree of horizontal adds leaving each
//! row's two half sums in its lane (in i16 for integers below 16, else after a
//! `madd` to i32), the exact bias corrections and the group's fused multiply-adds
//! in the group order. Weights are prefetched two units ahead (decode over tiles:
//! two streams, each under `Prefetch::L1` its next unit into L1 and [`PF2_L2`] bytes
//! ahead into L2, under `Prefetch::Near` its next unit spread between the groups'
//! loads, [`decode_tiles`], [`spread`]).
//!
//! Prefill over transposed tiles (the K-quants and IQ4_XS, [`prefill_tr`]) takes
//! two tiles (16 rows) and blocks of up to 2-4 tokens at a time: each weight vector
//! loaded feeds every token of the block and each broadcast activation dword both
//! tiles (the one-tile-one-token loop was bound by its loads). There the IQ4 levels
//! go in as i16 pairs against the activations widened to i16 (two `madd` and two
//! adds per dword, [`iq4_block`]; `level + 128` overflows a `maddubs` pair).
//!
//! Exactness of the integer sums: `maddubs` takes an unsigned operand and
//! saturates pairs at i16, so the weights go in as small unsigned integers
//! (`q + bias` below 64, the bias taken back as `bias * bsum` in i32), and the
//! IQ4 levels (|q| <= 127) with the sign trick: `|x|` (at most 128, unsigned) times
//! `q` with x's sign, pairs below 2 * 128 * 127. (`QAct`'s values lie in -127..=127,
//! blocks of tiny values included, `isa::block_scales`; |x| is the unsigned operand all
//! the same. In prefill `|q|` against `x` with q's sign measured no faster than the i16
//! pairs on Zen 3: both two multiplying operations per 32 products.)
//!
//! Depends on `isa` (`QAct`, `token_chunk`) and `quant::groups`.
#![allow(clippy::needless_range_loop)]

use crate::backend::cpu::isa::{part_lines, prefetch, prefetch_line_l1_kept, token_chunk, Prefetch, QAct};
use crate::quant::groups::{GROUP, IQ4_LEVELS};
use crate::quant::DType;
use std::arch::x86_64::*;

/// Weight rows per tile (f32 lanes).
const R: usize = 8;
/// Groups per unit.
const U: usize = 8;
/// Most tokens per pass over a unit (accumulators kept on the stack; `token_chunk` may
/// give fewer). At 32, TinyLlama pp128 (AVX2, alternating binaries, t/s 1 / 2 threads)
/// ran 3-6% / 0-5% slower: IQ4_XS 65.4-66.5 -> 69.0-69.2 / 123.6-130.1 -> 129.7-132.9,
/// Q6_K 83.1-85.0 -> 88.1-88.9 / 159.5-166.0 -> 165.5-174.7, Q5_K_M 89.2-93.0 -> 95.1-95.4
/// / 176.3-179.5 -> 182.4-187.0 (each unit unpacked once per pass: half as often).
const TC: usize = 64;
/// Prefetch distance in units (into L1: prefill, and decode under [`Prefetch::L2`]).
const PF: usize = 2;
/// [`decode_tiles`]' distance into L2 (`prefetcht1`, bytes from each stream's unit) under
/// [`Prefetch::L1`] (Intel), beside the next unit into L1; Zen 3 ([`Prefetch::Near`]) takes
/// the next unit alone, spread ([`spread`]; there these far prefetches held decode back:
/// `isa::prefetch`). Measured
/// (`gq_decode_bench`, 1 GiB, one thread, GB/s):
/// - Intel Xeon VM with 480 MiB of L3 (L2 2 MiB), one stream (units `PF` ahead into L1 -> the
///   next unit + 3 KiB into L2): Q4_K 9.9 -> 13.1, Q5_K 12.1 -> 13.0, Q6_K 9.5-10.8 -> 13.8,
///   IQ4_XS 9.3-12.0 -> 12.7, Q2_K 11.3 -> 12.0, Q3_K 9.9 -> 9.8, Q4_1 10.0 -> 12.3, Q5_0
///   10.0 -> 11.7, Q5_1 7.9 -> 10.7, IQ4_NL 8.3-9.5 -> 12.1. Two streams, rows of 2048 (none /
///   768 / 1536 / 3072): Q4_K 14.9-15.7 / 15.7-16.9 / 15.3-15.6 / 15.4, Q5_K 14.1-14.8 /
///   14.8-15.5 / 14.1-14.2 / 14.4, Q6_K 14.6-15.6 / 14.7-15.8 / 15.0-15.4 / 14.6-15.2, IQ4_XS
///   14.3-14.6 / 14.5-14.9 / 14.2-14.4 / 14.3-14.5; Q2_K 11.4-11.9 / 11.2-11.3 / 12.4 / 12.4,
///   Q3_K 12.2 / 12.0-12.2 / 12.2-12.3 / 12.3-12.5.
/// - Intel Xeon VM (model 207) with 300 MiB of L3, two streams, rows of 2048 / 5632 (768 ->
///   3072): Q4_K 14.3 -> 17.1 / 15.0 -> 17.5, Q5_K 15.1 -> 16.1 / 14.7 -> 16.4, Q6_K 15.0 ->
///   16.0 / 15.5 -> 15.9, IQ4_XS 14.1 -> 15.8 / 13.7 -> 15.8, Q2_K 12.1 -> 13.9 / 11.9 -> 13.8,
///   Q3_K 11.6 -> 13.6 / 12.0 -> 13.9, Q4_1 12.7 -> 14.8 / 12.6 -> 14.4, IQ4_NL 11.9 -> 13.5 /
///   12.4 -> 13.5; 4096 and 6144 alike or slower. TinyLlama tg64 (alternating, t/s, 1 / 2
///   threads): Q4_K_M 23.1-24.5 -> 26.4-27.8 / 46.8-47.0 -> 51.1-51.6, IQ4_XS 25.1-25.8 ->
///   27.5-28.0 / 47.8-48.2 -> 52.0-52.4. One distance for every type: 3072 (the first VM's
///   768 was within 3-8% of it there; 3072 is 10-17% ahead on the second).
const PF2_L2: usize = 3072;

use super::tag::*;
use super::{Src, Tok};

/// `$body` eight times, with `$g` the constant 0, 1, .., 7 (a unit's groups, `U`).
macro_rules! unroll8 {
    ($g:ident => $body:block) => {{
        const _: () = assert!(U == 8);
        unroll8!(@ $g, $body, 0 1 2 3 4 5 6 7)
    }};
    (@ $g:ident, $body:block, $($i:literal)*) => {{
        $({
            let $g: usize = $i;
            $body
        })*
    }};
}

/// A scale (and offset) per 16 values.
const fn halves(t: u8) -> bool {
    matches!(t, T_Q2_K | T_Q3_K | T_Q6_K)
}

const fn offset(t: u8) -> bool {
    matches!(t, T_Q4_1 | T_Q5_1 | T_Q2_K | T_Q4_K | T_Q5_K)
}

/// What the unpacked unsigned integers exceed `q` by.
const fn bias(t: u8) -> i32 {
    match t {
        T_Q5_0 => 16,
        T_Q3_K => 4,
        T_Q6_K => 32,
        _ => 0,
    }
}

/// `v * bias(T)` (a power of two: a shift).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn times_bias<const T: u8>(v: __m256i) -> __m256i {
    match bias(T) {
        4 => _mm256_slli_epi32::<2>(v),
        16 => _mm256_slli_epi32::<4>(v),
        32 => _mm256_slli_epi32::<5>(v),
        _ => unreachable!(),
    }
}

/// Unsigned integers below 16: a `maddubs` pair is at most 2 * 15 * 128 = 3840 in
/// magnitude, a sum of 8 pairs (one row's half) at most 30720, within i16.
const fn narrow(t: u8) -> bool {
    matches!(t, T_Q4_1 | T_Q2_K | T_Q3_K | T_Q4_K)
}

/// Signed integers (the IQ4 levels), multiplied with the sign trick.
const fn signed(t: u8) -> bool {
    matches!(t, T_IQ4_NL | T_IQ4_XS)
}

/// Bytes of one block of type `t`.
const fn block_bytes(t: u8) -> usize {
    match t {
        T_Q4_1 => 20,
        T_Q5_0 => 22,
        T_Q5_1 => 24,
        T_IQ4_NL => 18,
        T_Q2_K => 84,
        T_Q3_K => 110,
        T_Q4_K => 144,
        T_Q5_K => 176,
        T_Q6_K => 210,
        _ => 136,
    }
}

/// One unit of 8 rows unpacked: `q[g][r]` the 32 integers of group `g` of row `r`
/// (unsigned `q + bias`, or the signed levels), `s[h][g]` / `o[h][g]` the scale /
/// offset of half `h` of group `g`, row `r` in lane `r` (half 1 only for `halves`).
struct Unit {
    q: [[__m256i; R]; U],
    /// The transposed IQ4 prefill's levels 2, 3 of each dword as i16 ([`levels_i16`]; `q`
    /// then holds levels 0, 1).
    l: [[__m256i; R]; U],
    s: [[__m256; U]; 2],
    o: [[__m256; U]; 2],
    /// The types with a scale per 16 ([`halves`]; `s` and `o` unused): per group `k[0]`,
    /// `k[1]` each half's integer scale as an i16 pair `(k_h, k_h)`, and `k[2]` the pair
    /// `(bias * k_0, bias * k_1)` (Q2_K: its mins `(m_0, m_1)`), row `r` in dword lane `r`,
    /// for `madd`s against a row's two i16 half sums or a token's half sums ([`Tok`]'s
    /// `bp`); `d` the block's scale and (Q2_K) `-dmin` as f32 ([`half_end`]).
    k: [[__m256i; U]; 3],
    d: [__m256; 2],
}

impl Unit {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn zero() -> Unit {
        let (zi, zf) = (_mm256_setzero_si256(), _mm256_setzero_ps());
        Unit { q: [[zi; R]; U], l: [[zi; R]; U], s: [[zf; U]; 2], o: [[zf; U]; 2], k: [[zi; U]; 3], d: [zf; 2] }
    }
}

/// `out[r * t + c]` for `nrows` rows of `w` (`row_bytes` each) and the `t` rows of
/// `a`, in the group order.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `dt` is grouped, `row_bytes` is its row
/// size for `a.cols`, `w` holds `nrows` rows, `a` is consistent and `out` has
/// `nrows * a.t` values (the parent's `gemm` asserts all of it).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gemm(dt: DType, w: &[u8], row_bytes: usize, nrows: usize, a: &QAct, out: &mut [f32]) {
    // SAFETY: same contract as this function's.
    unsafe { by_type(dt, Src::Rows { w, row_bytes }, nrows, a, out) }
}

/// Bytes of one unit of one row (the last unit of a small-block row may use fewer).
pub(super) fn unit_bytes(dt: DType) -> usize {
    if dt.block_elems() == GROUP {
        U * dt.block_bytes()
    } else {
        dt.block_bytes()
    }
}

/// The product over packed rows: `src` ([`Src::Packed`] or [`Src::Transposed`]) starts at
/// a tile of 8 rows and holds the `nrows.div_ceil(8)` tiles read, in the layout of
/// [`super::Packed`] for this kernel set. Transposed tiles with several tokens take
/// [`gemm_packed_tm`] instead.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `gq::gemm_packed`'s assertions hold.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gemm_packed(dt: DType, src: Src<'_>, nrows: usize, a: &QAct, out: &mut [f32]) {
    // SAFETY: same contract as this function's.
    unsafe { by_type(dt, src, nrows, a, out) }
}

/// [`gemm_packed`] over transposed tiles for several tokens ([`prefill_tr`]), row `r`'s
/// result for token `c` at `o[r * ld.0 + c * ld.1]` (`gq::gemm_packed_tm`).
///
/// # Safety
/// As [`gemm_packed`]; `o[r * ld.0 + c * ld.1]` is writable for `r < nrows`, `c < a.t`, and
/// nothing else reads or writes those places meanwhile.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_packed_tm(
    dt: DType,
    tiles: &[u8],
    tile_bytes: usize,
    nrows: usize,
    a: &QAct,
    pre: &super::Prep,
    o: *mut f32,
    ld: (usize, usize),
) {
    let tw = (&pre.tok[..], &pre.wide[..]);
    // SAFETY: same contract as this function's.
    unsafe {
        match dt {
            DType::Q2_K => gemm_tm::<T_Q2_K>(tiles, tile_bytes, nrows, a, tw, o, ld),
            DType::Q3_K => gemm_tm::<T_Q3_K>(tiles, tile_bytes, nrows, a, tw, o, ld),
            DType::Q4_K => gemm_tm::<T_Q4_K>(tiles, tile_bytes, nrows, a, tw, o, ld),
            DType::Q5_K => gemm_tm::<T_Q5_K>(tiles, tile_bytes, nrows, a, tw, o, ld),
            DType::Q6_K => gemm_tm::<T_Q6_K>(tiles, tile_bytes, nrows, a, tw, o, ld),
            DType::IQ4_XS => gemm_tm::<T_IQ4_XS>(tiles, tile_bytes, nrows, a, tw, o, ld),
            _ => unreachable!("{dt} has no transposed tiles"),
        }
    }
}

/// The `(halves, bias)` of this kernel set's [`Tok`] table for `dt` (a transposed type).
pub(super) fn tok_kind(dt: DType) -> (bool, i32) {
    let t = super::tag::of(dt);
    (halves(t), bias(t))
}

/// [`gemm_packed_tm`] for type `T`: the assertions for transposed tiles, then
/// [`prefill_tr`] with the [`Tok`] table and (IQ4_XS) the widened activations given.
///
/// # Safety
/// As [`gemm_packed_tm`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_tm<const T: u8>(
    tiles: &[u8],
    tile_bytes: usize,
    nrows: usize,
    a: &QAct,
    (tok, wide): (&[Tok], &[i16]),
    o: *mut f32,
    ld: (usize, usize),
) {
    let (t, cols) = (a.t, a.cols);
    let groups = cols / GROUP;
    assert!(a.qs.len() >= t * cols && a.d.len() >= t * groups && a.sums.len() >= t * groups);
    let tb = super::transposed_block_bytes(block_bytes(T), 32);
    assert!(T > T_IQ4_NL && cols.is_multiple_of(256) && tile_bytes >= groups / U * tb);
    assert!(tiles.len() >= nrows.div_ceil(R) * tile_bytes);
    assert!(tok.len() == t * groups && (!signed(T) || wide.len() == t * cols));
    let tc = token_chunk(t, cols).min(TC);
    // SAFETY: the CPU has AVX2/FMA/F16C, the tiles and activations as asserted above, the
    // outputs as the caller guarantees.
    unsafe { prefill_tr::<T>(tiles, tile_bytes, nrows, a, (tok, wide), tc, o, ld) };
}

/// `gemm_t` for type `dt`.
///
/// # Safety
/// As [`gemm`] or [`gemm_packed`] for `src`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn by_type(dt: DType, src: Src<'_>, nrows: usize, a: &QAct, out: &mut [f32]) {
    let tr = matches!(src, Src::Transposed { .. });
    // SAFETY: same contract as this function's.
    unsafe {
        match dt {
            DType::Q4_1 if tr => gemm_t::<T_Q4_1, true>(src, nrows, a, out),
            DType::Q4_1 => gemm_t::<T_Q4_1, false>(src, nrows, a, out),
            DType::Q5_0 if tr => gemm_t::<T_Q5_0, true>(src, nrows, a, out),
            DType::Q5_0 => gemm_t::<T_Q5_0, false>(src, nrows, a, out),
            DType::Q5_1 if tr => gemm_t::<T_Q5_1, true>(src, nrows, a, out),
            DType::Q5_1 => gemm_t::<T_Q5_1, false>(src, nrows, a, out),
            DType::IQ4_NL if tr => gemm_t::<T_IQ4_NL, true>(src, nrows, a, out),
            DType::IQ4_NL => gemm_t::<T_IQ4_NL, false>(src, nrows, a, out),
            DType::Q2_K if tr => gemm_t::<T_Q2_K, true>(src, nrows, a, out),
            DType::Q2_K => gemm_t::<T_Q2_K, false>(src, nrows, a, out),
            DType::Q3_K if tr => gemm_t::<T_Q3_K, true>(src, nrows, a, out),
            DType::Q3_K => gemm_t::<T_Q3_K, false>(src, nrows, a, out),
            DType::Q4_K if tr => gemm_t::<T_Q4_K, true>(src, nrows, a, out),
            DType::Q4_K => gemm_t::<T_Q4_K, false>(src, nrows, a, out),
            DType::Q5_K if tr => gemm_t::<T_Q5_K, true>(src, nrows, a, out),
            DType::Q5_K => gemm_t::<T_Q5_K, false>(src, nrows, a, out),
            DType::Q6_K if tr => gemm_t::<T_Q6_K, true>(src, nrows, a, out),
            DType::Q6_K => gemm_t::<T_Q6_K, false>(src, nrows, a, out),
            DType::IQ4_XS if tr => gemm_t::<T_IQ4_XS, true>(src, nrows, a, out),
            DType::IQ4_XS => gemm_t::<T_IQ4_XS, false>(src, nrows, a, out),
            _ => unreachable!("{dt} is not a grouped type"),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_t<const T: u8, const TR: bool>(src: Src<'_>, nrows: usize, a: &QAct, out: &mut [f32]) {
    let (t, cols) = (a.t, a.cols);
    let groups = cols / GROUP;
    let units = groups.div_ceil(U);
    let small = T <= T_IQ4_NL;
    // Bytes of one unit of one row.
    let ub = if small { U * block_bytes(T) } else { block_bytes(T) };
    let tc = token_chunk(t, cols).min(TC);
    assert!(a.qs.len() >= t * cols && a.d.len() >= t * groups);
    assert!(a.sums.len() >= t * groups);
    let need = if small { groups * block_bytes(T) } else { cols / 256 * block_bytes(T) };
    assert!(out.len() >= nrows * t && (small || cols.is_multiple_of(256)));
    // Bytes from one unit of a row to its next.
    let us = match src {
        Src::Rows { w, row_bytes } => {
            assert!(w.len() >= nrows * row_bytes && row_bytes >= need);
            ub
        }
        Src::Packed { tiles, tile_bytes } => {
            assert!(tile_bytes >= units * R * ub && tiles.len() >= nrows.div_ceil(R) * tile_bytes);
            R * ub
        }
        Src::Transposed { tiles, tile_bytes } => {
            let tb = super::transposed_block_bytes(block_bytes(T), 32);
            assert!(!small && tile_bytes >= units * tb && tiles.len() >= nrows.div_ceil(R) * tile_bytes);
            tb
        }
    };
    assert_eq!(TR, matches!(src, Src::Transposed { .. }));

    let zf = _mm256_setzero_ps();
    let mut un = Unit::zero();
    let mut acc = [zf; TC];
    let lv = levels();
    // Prefill's per-token bias corrections and offset sums (decode forms its own, but
    // over transposed tiles of the per-16 types: `dtab`).
    let tok = if t > 1 || dtab::<T, TR>() { Tok::table(a, halves(T), bias(T)) } else { Vec::new() };
    if let (1, Src::Transposed { tiles, tile_bytes } | Src::Packed { tiles, tile_bytes }) = (t, src) {
        // SAFETY: the tiles as asserted above (`us` bytes from a unit to the next), one token.
        unsafe { decode_tiles::<T, TR>(tiles, tile_bytes, us, nrows, a, &tok, out) };
        return;
    }
    // Left: prefill over packed tiles or rows as stored, and decode over rows as stored.
    for r0 in (0..nrows).step_by(R) {
        let nr = (nrows - r0).min(R);
        let rows: [*const u8; R] = match src {
            // Rows past the end repeat the last row (their lanes are not stored).
            Src::Rows { w, row_bytes } => std::array::from_fn(|i| {
                // SAFETY: row `r0 + min(i, nr - 1) < nrows` starts inside `w` (asserted above).
                unsafe { w.as_ptr().add((r0 + i.min(nr - 1)) * row_bytes) }
            }),
            // Packed tiles hold all 8 rows (zero past the matrix's end).
            Src::Packed { tiles, tile_bytes } => std::array::from_fn(|i| {
                // SAFETY: tile `r0 / R` lies inside `tiles` (asserted above), row `i`'s first
                // unit `i * ub` bytes into it.
                unsafe { tiles.as_ptr().add(r0 / R * tile_bytes + i * ub) }
            }),
            Src::Transposed { .. } => unreachable!("transposed tiles take gemm_tm (several tokens) or decode_tiles"),
        };
        let packed = !matches!(src, Src::Rows { .. });
        for c0 in (0..t).step_by(tc) {
            let ct = (t - c0).min(tc);
            acc[..ct].fill(zf);
            for u in 0..units {
                let ng = (groups - u * U).min(U);
                // SAFETY: the CPU has AVX2/FMA/F16C (this function's features, reached only through
                // `isa()`'s `Avx2`); unit `u` of every row pointer lies inside its row (`ng` groups,
                // `u < units`); prefetches never fault; token `c0 + c < t` reads its activation
                // groups `u * U .. u * U + ng < groups` of `a.qs` / `a.d` (lengths asserted above).
                unsafe {
                    if packed {
                        // One stream: the tile's unit `PF` ahead, 8 rows back to back.
                        let here = rows[0].wrapping_add(u * us);
                        for l in (0..us).step_by(64) {
                            _mm_prefetch::<_MM_HINT_T0>(here.wrapping_add(PF * us + l) as *const i8);
                        }
                    } else {
                        for &p in &rows {
                            let next = p.wrapping_add((u + PF) * us);
                            for l in (0..ub).step_by(64) {
                                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(l) as *const i8);
                            }
                        }
                    }
                    let bp: [*const u8; R] = std::array::from_fn(|r| rows[r].add(u * us));
                    scales::<T>(&bp, ng, &mut un);
                    let xq = a.qs.as_ptr().add(c0 * cols + u * U * GROUP);
                    let xd = a.d.as_ptr().add(c0 * groups + u * U);
                    let xs = a.sums.as_ptr().add(c0 * groups + u * U);
                    let xt = tok.as_ptr().wrapping_add(c0 * groups + u * U);
                    if ct == 1 {
                        // Decode: each group straight from the weights into the dot product.
                        let x = (xq, std::ptr::null());
                        acc[0] =
                            decode_unit::<T, false, false>(&un, &bp, lv, ng, x, xd, (xs, xt), std::ptr::null(), acc[0]);
                    } else {
                        // Prefill over packed tiles or rows.
                        for g in 0..ng {
                            for i in 0..R {
                                un.q[g][i] = qgroup::<T>(bp[i], g, lv);
                            }
                        }
                        prefill_unit::<T>(&un, ng, (cols, groups), xq, xd, (xs, xt), &mut acc[..ct]);
                    }
                }
            }
            for c in 0..ct {
                let mut l = [0f32; R];
                // SAFETY: `l` holds 8 f32, a __m256 (unaligned store); AVX as above.
                unsafe { _mm256_storeu_ps(l.as_mut_ptr(), acc[c]) };
                for (i, &v) in l[..nr].iter().enumerate() {
                    out[(r0 + i) * t + c0 + c] = v;
                }
            }
        }
    }
}

/// Decode (one token) over transposed (`TR`) or packed tiles, `us` bytes from a unit of
/// a tile to its next: two streams through memory, the first and the second half of the
/// tiles, a unit of each in turn. Under [`Prefetch::L1`] each stream's next unit into L1
/// and [`PF2_L2`] bytes ahead into L2, under [`Prefetch::Near`] (Zen 3) that next unit
/// alone, a share per group from inside [`decode_unit`] ([`spread`]; there 4 streams
/// instead of 2, or 1 or 3, read no faster: TinyLlama tg at 2 threads, Q4_K_M and Q6_K);
/// otherwise packed tiles `PF` units ahead into L1 and
/// transposed ones none (Zen 4, `gq_decode_bench`, GB/s with -> none: Q4_K 17.7 -> 19,
/// Q6_K 13.2 -> 19, IQ4_XS 12-16 -> 17, Q5_K 16.5 -> 12-18, Q2_K/Q3_K the same; Q4_1 13.5
/// -> 8.5, Q5_0 10.4 -> 6.3; measured as one stream). Each tile's units, sums and fused
/// multiply-adds are those of [`decode_unit`], bit for bit. `gq_decode_bench` over 1 GiB
/// (past the 480 MiB L3 of the Intel Xeon VM, `Prefetch::L1`), GB/s, one stream -> two:
/// rows of 2048 / 4096 values, Q4_K 13.9-14.3 -> 15.4-16.9 / 13.8-14.0 -> 17.1-17.2, Q5_K
/// 13.2-13.5 -> 14.9-15.7 / 13.0-13.3 -> 16.1, Q6_K 13.8-14.1 -> 15.9-16.0 / 13.9-14.1 ->
/// 16.1-16.2; at 2048: Q2_K 11.9 -> 12.4, Q3_K 11.3 -> 12.2-12.5, IQ4_XS 13.3 -> 14.5-14.9,
/// Q4_1 11.3-11.4 -> 14.0-14.1, Q5_0 10.8 -> 12.4-12.5, Q5_1 10.6-10.8 -> 12.7-12.8, IQ4_NL
/// 11.2-11.3 -> 12.7-12.9 (at 4096: 11.4 -> 14.2, 10.5 -> 13.0, 10.2 -> 12.5, 10.9 -> 12.4).
/// Two neighbouring tiles at a time instead ran slower at 2048 (Q4_K 14.3 -> 13.0): each
/// stream's prefetches past a tile's end fell on the other stream's tile.
///
/// # Safety
/// As [`prefill_tr`] with `a.t == 1` for transposed tiles; packed tiles as `gemm_t`
/// asserts them.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_tiles<const T: u8, const TR: bool>(
    tiles: &[u8],
    tile_bytes: usize,
    us: usize,
    nrows: usize,
    a: &QAct,
    tok: &[Tok],
    out: &mut [f32],
) {
    let groups = a.cols / GROUP;
    let units = groups.div_ceil(U);
    let ub = us / if TR { 1 } else { R };
    let ntiles = nrows.div_ceil(R);
    let zf = _mm256_setzero_ps();
    let mut un = Unit::zero();
    let lv = levels();
    let pf = prefetch();
    // Stream `j` runs over tiles `j * half ..`: each a forward stream across its tiles'
    // ends, so the prefetches past a tile's last unit fetch its stream's next tile.
    let half = ntiles.div_ceil(2);
    // The unit's activations' absolute values (the signed types over transposed tiles),
    // zeroed once per call.
    let mut xa = [0i8; U * GROUP];
    for k in 0..half {
        let tl = [k, k + half];
        let nt = if k + half < ntiles { 2 } else { 1 };
        let mut acc = [zf; 2];
        for u in 0..units {
            let ng = (groups - u * U).min(U);
            // The signed types over transposed tiles: the unit's activations' absolute
            // values, for both tiles (`lane_sums`).
            if TR && signed(T) {
                for (i, c) in xa.chunks_exact_mut(32).take(ng).enumerate() {
                    // SAFETY: group `u * U + i < groups` of token 0's activations; `c` holds 32 bytes.
                    unsafe {
                        let v = _mm256_loadu_si256(a.qs.as_ptr().add((u * U + i) * GROUP) as *const __m256i);
                        _mm256_storeu_si256(c.as_mut_ptr() as *mut __m256i, _mm256_abs_epi8(v));
                    }
                }
            }
            for (j, acc) in acc[..nt].iter_mut().enumerate() {
                // SAFETY: tile `tl[j] < ntiles` lies inside `tiles` and unit `u < units`
                // inside it (the caller's contract); token 0's groups `u * U ..` of `a`
                // and `tok` exist; prefetches never fault.
                unsafe {
                    let here = tiles.as_ptr().add(tl[j] * tile_bytes + u * us);
                    if pf == Prefetch::L1 {
                        for l in (0..us).step_by(64) {
                            _mm_prefetch::<_MM_HINT_T0>(here.wrapping_add(us + l) as *const i8);
                            _mm_prefetch::<_MM_HINT_T1>(here.wrapping_add(PF2_L2 + l) as *const i8);
                        }
                    } else if pf == Prefetch::Near {
                        // The next unit from inside `decode_unit` (`spread`).
                    } else if !TR {
                        for l in (0..us).step_by(64) {
                            _mm_prefetch::<_MM_HINT_T0>(here.wrapping_add(PF * us + l) as *const i8);
                        }
                    }
                    let bp: [*const u8; R] = std::array::from_fn(|i| here.add(if TR { 4 } else { ub } * i));
                    if TR {
                        scales_t::<T>(here, &mut un);
                    } else {
                        scales::<T>(&bp, ng, &mut un);
                    }
                    let x = (a.qs.as_ptr().add(u * U * GROUP), a.d.as_ptr().add(u * U));
                    let xs = (a.sums.as_ptr().add(u * U), tok.as_ptr().wrapping_add(u * U));
                    let xp = (x.0, xa.as_ptr());
                    *acc = if pf == Prefetch::Near {
                        decode_unit::<T, TR, true>(&un, &bp, lv, ng, xp, x.1, xs, here.wrapping_add(us), *acc)
                    } else {
                        decode_unit::<T, TR, false>(&un, &bp, lv, ng, xp, x.1, xs, std::ptr::null(), *acc)
                    };
                }
            }
        }
        for (j, acc) in acc[..nt].iter().enumerate() {
            let mut l = [0f32; R];
            // SAFETY: `l` holds 8 f32, a __m256 (unaligned store).
            unsafe { _mm256_storeu_ps(l.as_mut_ptr(), *acc) };
            let r0 = tl[j] * R;
            let nr = (nrows - r0).min(R);
            out[r0..r0 + nr].copy_from_slice(&l[..nr]);
        }
    }
}

/// Prefill's pass over one unpacked unit (`un.q`) for `acc.len()` tokens (token `c`'s
/// activations `c * cols` values, its scales, sums and [`Tok`] entries `c * groups` on),
/// out of line like [`decode_unit`]. Rows as stored or packed, not transposed
/// (those take [`prefill_tr`]).
///
/// # Safety
/// As `dot_unit` for each token (`gemm_t`'s chunk of tokens).
#[allow(clippy::too_many_arguments)]
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prefill_unit<const T: u8>(
    un: &Unit,
    ng: usize,
    (cols, groups): (usize, usize),
    xq: *const i8,
    xd: *const f32,
    (xs, xt): (*const i32, *const Tok),
    acc: &mut [__m256],
) {
    let qv = &un.q;
    let sums = |g: usize, _: *const i8, x: __m256i| weigh::<T>(un, g, row_sums::<T>(|i| qv[g][i], x));
    for (c, acc) in acc.iter_mut().enumerate() {
        // SAFETY: the caller's contract: token `c`'s activations, scales and entries.
        unsafe {
            let (xq, xd) = (xq.add(c * cols), xd.add(c * groups));
            let xs = (xs.add(c * groups), xt.add(c * groups));
            *acc = dot_unit::<T, true, false, false>(un, sums, ng, xq, xd, xs, std::ptr::null(), *acc);
        }
    }
}

/// Most tokens per pass of [`pair_block`] (or [`iq4_block`]) for type `t` (`NT x NC`
/// sums in registers). IQ4_XS, `iq4_block` (`gq_bench`, Gmac/s, 2 / 3 / 4): 67-71 / 71 / 72.
/// Q6_K 3 since its scales ride in the sums' `madd` (a register per tile more): at 4,
/// TinyLlama pp128 on 2 threads fell to 93-97 t/s (old code 104-140), at 3 128-131 (1
/// thread 65-67 at both).
const fn ncmax(t: u8) -> usize {
    match t {
        T_IQ4_XS => NC_IQ4,
        T_Q6_K => NC_Q6,
        _ => NC_OTHER,
    }
}
const NC_IQ4: usize = 4;
const NC_Q6: usize = 3;
const NC_OTHER: usize = 3;

/// `pshufb` tables of the IQ4 levels as i16: their low bytes and their high (sign) bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn level_bytes() -> (__m256i, __m256i) {
    let mut lo = [0u8; 32];
    let mut hi = [0u8; 32];
    for (i, &v) in IQ4_LEVELS.iter().chain(IQ4_LEVELS.iter()).enumerate() {
        let b = (v as i16).to_le_bytes();
        (lo[i], hi[i]) = (b[0], b[1]);
    }
    // SAFETY: both arrays hold 32 bytes (unaligned loads).
    unsafe { (_mm256_loadu_si256(lo.as_ptr() as *const __m256i), _mm256_loadu_si256(hi.as_ptr() as *const __m256i)) }
}

/// The IQ4 levels of one loaded nibble vector `n` (8 rows' dword: row `r`'s 4 values at
/// bytes `4r..4r + 4`) as i16 pairs: `(a, b)`, `a` holding each row's values 0 and 1 in its
/// lane (row `r` in lane `r`), `b` values 2 and 3.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn levels_i16(n: __m256i, (tl, th): (__m256i, __m256i)) -> (__m256i, __m256i) {
    let (lo, hi) = (_mm256_shuffle_epi8(tl, n), _mm256_shuffle_epi8(th, n));
    // Per 128-bit lane: x = rows 0, 1 (4, 5) and y = rows 2, 3 (6, 7), 4 values each, as
    // dwords [r0 01, r0 23, r1 01, r1 23]; then [r0 01, r1 01, r0 23, r1 23].
    let x = _mm256_shuffle_epi32::<0b11_01_10_00>(_mm256_unpacklo_epi8(lo, hi));
    let y = _mm256_shuffle_epi32::<0b11_01_10_00>(_mm256_unpackhi_epi8(lo, hi));
    (_mm256_unpacklo_epi64(x, y), _mm256_unpackhi_epi64(x, y))
}

/// Prefill over transposed tiles (the K-quants and IQ4_XS): two tiles (16 rows) at a
/// time, each unit unpacked once per chunk of tokens, then [`pair_block`] over blocks
/// of up to [`ncmax`] tokens, so each weight vector loaded feeds `NC` products and
/// each broadcast activation dword two (one per tile). The one-tile-one-token loop
/// loaded both operands of every `maddubs` and was bound by its loads. Same integer
/// sums and the same float steps in the same order as [`dot_unit`]: bit for bit.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `tiles` holds `nrows.div_ceil(8)` transposed tiles
/// of `tile_bytes` for `a.cols`, `tok` an entry per activation group of `a` (taking
/// back `bias(T)`) (`gemm_tm` asserts it all); row `r`'s result for token `c`
/// goes to `o[r * ld.0 + c * ld.1]`, writable for `r < nrows`, `c < a.t`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prefill_tr<const T: u8>(
    tiles: &[u8],
    tile_bytes: usize,
    nrows: usize,
    a: &QAct,
    (tok, wide): (&[Tok], &[i16]),
    tc: usize,
    o: *mut f32,
    ld: (usize, usize),
) {
    let (t, cols) = (a.t, a.cols);
    let groups = cols / GROUP;
    let units = groups / U;
    let tb = super::transposed_block_bytes(block_bytes(T), 32);
    let ntiles = nrows.div_ceil(R);
    assert!(tok.len() >= t * groups && tc <= TC);
    let zf = _mm256_setzero_ps();
    let mut un = [Unit::zero(), Unit::zero()];
    let mut acc = [[zf; TC]; 2];
    let lv = levels();
    let lb = level_bytes();
    // IQ4: the activations as i16 (the products taken by `madd`, [`iq4_block`]).
    assert!(!signed(T) || wide.len() >= t * cols);
    for tp in (0..ntiles).step_by(2) {
        let nt = (ntiles - tp).min(2);
        // SAFETY: tiles `tp` and `tp + nt - 1 < ntiles` lie inside `tiles` (caller).
        let base: [*const u8; 2] =
            unsafe { [tiles.as_ptr().add(tp * tile_bytes), tiles.as_ptr().add((tp + nt - 1) * tile_bytes)] };
        for c0 in (0..t).step_by(tc) {
            let ct = (t - c0).min(tc);
            for acc in &mut acc {
                acc[..ct].fill(zf);
            }
            for u in 0..units {
                for j in 0..nt {
                    // SAFETY: unit `u < units` of tile `tp + j` is inside it (`tile_bytes >=
                    // units * tb`, asserted by `gemm_t`); prefetches never fault.
                    unsafe {
                        let blk = base[j].add(u * tb);
                        let next = blk.wrapping_add(PF * tb);
                        for l in (0..tb).step_by(64) {
                            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(l) as *const i8);
                        }
                        scales_t::<T>(blk, &mut un[j]);
                        for g in 0..U {
                            for i in 0..R {
                                if signed(T) {
                                    (un[j].q[g][i], un[j].l[g][i]) = levels_i16(nibble_t(blk, g, i), lb);
                                } else {
                                    un[j].q[g][i] = qgroup_t::<T>(blk, g, i, lv);
                                }
                            }
                        }
                    }
                }
                let mut c = 0;
                while c < ct {
                    let n = (ct - c).min(ncmax(T));
                    let (k, gu) = (c0 + c, u * U);
                    // SAFETY: tokens `k .. k + n <= t` and groups `gu .. gu + U <= groups` of
                    // `a` and `tok` (lengths asserted by `gemm_t` and above); `c + n <= ct <= TC`.
                    unsafe {
                        if signed(T) {
                            let x = (wide.as_ptr().add(k * cols + gu * GROUP), a.d.as_ptr().add(k * groups + gu));
                            let d = (cols, groups, c);
                            match (nt, n) {
                                (2, 4) => iq4_block::<2, 4>(&un, d, x, &mut acc),
                                (2, 3) => iq4_block::<2, 3>(&un, d, x, &mut acc),
                                (2, 2) => iq4_block::<2, 2>(&un, d, x, &mut acc),
                                (2, _) => iq4_block::<2, 1>(&un, d, x, &mut acc),
                                (_, 4) => iq4_block::<1, 4>(&un, d, x, &mut acc),
                                (_, 3) => iq4_block::<1, 3>(&un, d, x, &mut acc),
                                (_, 2) => iq4_block::<1, 2>(&un, d, x, &mut acc),
                                _ => iq4_block::<1, 1>(&un, d, x, &mut acc),
                            }
                            c += n;
                            continue;
                        }
                        let x = (
                            a.qs.as_ptr().add(k * cols + gu * GROUP),
                            a.d.as_ptr().add(k * groups + gu),
                            tok.as_ptr().add(k * groups + gu),
                        );
                        let d = (cols, groups, c);
                        match (nt, n) {
                            (2, 4) => pair_block::<T, 2, 4>(&un, d, x, &mut acc),
                            (2, 3) => pair_block::<T, 2, 3>(&un, d, x, &mut acc),
                            (2, 2) => pair_block::<T, 2, 2>(&un, d, x, &mut acc),
                            (2, _) => pair_block::<T, 2, 1>(&un, d, x, &mut acc),
                            (_, 4) => pair_block::<T, 1, 4>(&un, d, x, &mut acc),
                            (_, 3) => pair_block::<T, 1, 3>(&un, d, x, &mut acc),
                            (_, 2) => pair_block::<T, 1, 2>(&un, d, x, &mut acc),
                            _ => pair_block::<T, 1, 1>(&un, d, x, &mut acc),
                        }
                    }
                    c += n;
                }
            }
            for j in 0..nt {
                let r0 = (tp + j) * R;
                let nr = (nrows - r0).min(R);
                for c in 0..ct {
                    let mut l = [0f32; R];
                    // SAFETY: `l` holds 8 f32, a __m256 (unaligned store); AVX as above.
                    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), acc[j][c]) };
                    for (i, &v) in l[..nr].iter().enumerate() {
                        // SAFETY: row `r0 + i < nrows`, token `c0 + c < t` (the caller's contract).
                        unsafe { *o.add((r0 + i) * ld.0 + (c0 + c) * ld.1) = v };
                    }
                }
            }
        }
    }
}

/// [`pair_block`] for IQ4_XS: one unit of `NT` unpacked tiles (`q[g][m]` / `l[g][m]`: the
/// levels `4m, 4m + 1` / `4m + 2, 4m + 3` of group `g` as i16 pairs, [`levels_i16`]) times
/// `NC` tokens (`xw`: the unit's first activation of the first token as i16, token `c`
/// `c * cols` further; `xd` its scale, `c * groups` further), added to `acc[j][c0 + c]`. Each
/// broadcast pair of activations is multiplied by `madd` into i32 sums: two `madd` and two
/// adds per 4 values, no bias to take back. (Levels plus 128 in `maddubs` overflow i16;
/// split as `16 h + l` they took two `maddubs`, two adds and the sums' `madd` per 4 values,
/// and a bias correction per group.) The same exact sums and [`group_fma`]'s float steps
/// as [`dot_unit`]: bit for bit.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `xw` and `xd` cover `NC` tokens' `U` groups; `c0 + NC <= TC`.
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_block<const NT: usize, const NC: usize>(
    un: &[Unit; 2],
    (cols, groups, c0): (usize, usize, usize),
    (xw, xd): (*const i16, *const f32),
    acc: &mut [[__m256; TC]; 2],
) {
    let (zi, zf) = (_mm256_setzero_si256(), _mm256_setzero_ps());
    assert!(c0 + NC <= TC);
    for g in 0..U {
        let mut s = [[zi; NC]; NT];
        // A loop (its count hidden from the optimizer), as in `pair_block`.
        for m in 0..std::hint::black_box(R) {
            let (wa, wb): ([__m256i; NT], [__m256i; NT]) =
                (std::array::from_fn(|j| un[j].q[g][m]), std::array::from_fn(|j| un[j].l[g][m]));
            for c in 0..NC {
                // SAFETY: values `4m .. 4m + 4` of group `g` of token `c` (the caller's contract).
                let (xa, xb) = unsafe {
                    let p = xw.add(c * cols + GROUP * g + 4 * m) as *const i32;
                    (_mm256_set1_epi32(p.read_unaligned()), _mm256_set1_epi32(p.add(1).read_unaligned()))
                };
                for j in 0..NT {
                    let v = _mm256_add_epi32(_mm256_madd_epi16(wa[j], xa), _mm256_madd_epi16(wb[j], xb));
                    s[j][c] = _mm256_add_epi32(s[j][c], v);
                }
            }
        }
        for c in 0..NC {
            // SAFETY: group `g` of token `c` (the caller's contract).
            let dx = _mm256_set1_ps(unsafe { *xd.add(c * groups + g) });
            for j in 0..NT {
                acc[j][c0 + c] = group_fma::<T_IQ4_XS>(&un[j], g, dx, (s[j][c], zi), zf, acc[j][c0 + c]);
            }
        }
    }
}

/// One unit of `NT` unpacked tiles ([`prefill_tr`]) times `NC` tokens (from `x`: the
/// unit's first activation, scale and [`Tok`] entry of the first token; token `c`'s
/// `c * cols` / `c * groups` further), added to `acc[j][c0 + c]` in the group order.
/// Per group and dword each tile's weight vector is multiplied with each token's
/// broadcast activation dword; the products add in i16 as [`lane_sums`]' do, giving the
/// same exact half sums; then [`dot_unit`]'s float steps. Unsigned integers only (IQ4_XS
/// takes [`iq4_block`]).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `x` covers `NC` tokens' `U` groups; `c0 + NC <= TC`.
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pair_block<const T: u8, const NT: usize, const NC: usize>(
    un: &[Unit; 2],
    (cols, groups, c0): (usize, usize, usize),
    (xq, xd, xt): (*const i8, *const f32, *const Tok),
    acc: &mut [[__m256; TC]; 2],
) {
    let (zi, zf) = (_mm256_setzero_si256(), _mm256_setzero_ps());
    let ones16 = _mm256_set1_epi16(1);
    assert!(c0 + NC <= TC && !signed(T));
    // The per-16 types: the block's sums per tile and token ([`half_fma`]).
    let mut um = [[(zf, zf); NC]; NT];
    for g in 0..U {
        // Row `r`'s half sums (values 0..16, 16..32) of tile `j` and token `c` in lane `r`.
        let mut hs = [[[zi; NC]; NT]; 2];
        // Products add in i16 over 4 dwords (at most 8 products per 16-bit lane, below
        // 32 unsigned: `narrow_lanes`), Q6_K's over 2 (`pair_lanes`), then
        // into i32. The dword loops stay loops (their counts hidden from the optimizer):
        // unrolled, their weight loads were merged across tokens, the tokens scheduled
        // one after another and the weights spilled and reloaded for each.
        let xb = |c: usize, m: usize| {
            // SAFETY: dword `m` of group `g` of token `c` (the caller's contract).
            _mm256_set1_epi32(unsafe { (xq.add(c * cols + GROUP * g + 4 * m) as *const i32).read_unaligned() })
        };
        for (half, hs) in hs.iter_mut().enumerate() {
            // The i16 pairs summed into i32 against ones, or a `halves` type's integer
            // scales (as `lane_sums`).
            let k: [__m256i; NT] = std::array::from_fn(|j| if halves(T) { un[j].k[half][g] } else { ones16 });
            if pair_lanes(T) {
                for mm in 0..std::hint::black_box(2) {
                    let m = 4 * half + 2 * mm;
                    let w: [[__m256i; 2]; NT] = std::array::from_fn(|j| [un[j].q[g][m], un[j].q[g][m + 1]]);
                    for c in 0..NC {
                        let (x0, x1) = (xb(c, m), xb(c, m + 1));
                        for j in 0..NT {
                            let v =
                                _mm256_add_epi16(_mm256_maddubs_epi16(w[j][0], x0), _mm256_maddubs_epi16(w[j][1], x1));
                            hs[j][c] = _mm256_add_epi32(hs[j][c], _mm256_madd_epi16(v, k[j]));
                        }
                    }
                }
                continue;
            }
            // `whole_lanes` types: the group's 8 dwords in i16 (`p` kept from the first
            // half), one `madd` per group into the first half's sums.
            if whole_lanes(T) && half == 1 {
                continue;
            }
            let mut p = [[zi; NC]; NT];
            for mm in 0..std::hint::black_box(if whole_lanes(T) { 8 } else { 4 }) {
                let m = 4 * half + mm;
                let w: [__m256i; NT] = std::array::from_fn(|j| un[j].q[g][m]);
                for c in 0..NC {
                    let x = xb(c, m);
                    for j in 0..NT {
                        p[j][c] = _mm256_add_epi16(p[j][c], _mm256_maddubs_epi16(w[j], x));
                    }
                }
            }
            for j in 0..NT {
                for c in 0..NC {
                    hs[j][c] = _mm256_madd_epi16(p[j][c], k[j]);
                }
            }
        }
        for c in 0..NC {
            // SAFETY: group `g` of token `c` (the caller's contract).
            let (dx, tk) = unsafe { (_mm256_set1_ps(*xd.add(c * groups + g)), &*xt.add(c * groups + g)) };
            for j in 0..NT {
                if halves(T) {
                    let bp = _mm256_set1_epi32(tk.bp);
                    um[j][c] = half_fma::<T>(&un[j], g, dx, (hs[0][j][c], hs[1][j][c]), bp, um[j][c]);
                    continue;
                }
                let (mut i0, i1) = (hs[0][j][c], hs[1][j][c]);
                if bias(T) != 0 {
                    i0 = _mm256_add_epi32(i0, _mm256_set1_epi32(tk.nb[0]));
                }
                let f = _mm256_set1_ps(tk.bf);
                acc[j][c0 + c] = group_fma::<T>(&un[j], g, dx, (i0, i1), f, acc[j][c0 + c]);
            }
        }
    }
    if halves(T) {
        for j in 0..NT {
            for c in 0..NC {
                acc[j][c0 + c] = half_end::<T>(&un[j], acc[j][c0 + c], um[j][c]);
            }
        }
    }
}

/// Decode's pass over one unit ([`dot_unit`] with each group unpacked straight into the
/// dot product), out of line: inlined into the prefill loop it ran 7-8% slower (AVX2
/// Q6_K tg32, measured).
///
/// # Safety
/// As `dot_unit`, with `bp` the unit's row pointers (`gemm_t`); over transposed tiles of
/// the [`signed`] types `xa` holds the unit's activations' absolute values. With `SP` the
/// unit's lines at `sp` (any address: prefetches never fault) are prefetched ([`spread`]).
#[allow(clippy::too_many_arguments)]
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_unit<const T: u8, const TR: bool, const SP: bool>(
    un: &Unit,
    bp: &[*const u8; R],
    lv: __m256i,
    ng: usize,
    (xq, xa): (*const i8, *const i8),
    xd: *const f32,
    (xs, xt): (*const i32, *const Tok),
    sp: *const u8,
    acc: __m256,
) -> __m256 {
    // SAFETY: the caller's contract (`gemm_t`'s unit `u` of every row, `ng` groups;
    // with `dtab` its `ng` entries at `xt`).
    unsafe {
        let q = |g: usize, i: usize| if TR { qgroup_t::<T>(bp[0], g, i, lv) } else { qgroup::<T>(bp[i], g, lv) };
        let ones = _mm256_set1_epi16(1);
        let sums = |g: usize, xp: *const i8, x: __m256i| {
            if TR {
                let k = if halves(T) { (un.k[0][g], un.k[1][g]) } else { (ones, ones) };
                lane_sums::<T>(|i| q(g, i), xp, xa.wrapping_add(GROUP * g), k)
            } else {
                weigh::<T>(un, g, row_sums::<T>(|i| q(g, i), x))
            }
        };
        if T == T_Q3_K && TR && ng == U {
            return q3_unit::<SP>(un, bp[0], xq, xd, xt, sp, acc);
        }
        if T == T_Q2_K && TR && ng == U {
            return q2_unit::<SP>(un, bp[0], xq, xd, xt, sp, acc);
        }
        if matches!(T, T_Q4_K | T_Q5_K) && TR && ng == U {
            return nib_unit::<T, SP>(un, bp[0], xq, xd, xs, sp, acc);
        }
        if dtab::<T, TR>() {
            dot_unit::<T, true, TR, SP>(un, sums, ng, xq, xd, (xs, xt), sp, acc)
        } else {
            dot_unit::<T, false, TR, SP>(un, sums, ng, xq, xd, (xs, std::ptr::null()), sp, acc)
        }
    }
}

/// [`decode_unit`] for a whole unit of a transposed Q3_K tile at `blk`: each pair of
/// groups `g`, `g + 2` unpacked together ([`q3_pair`]), their sums weighed by their
/// scales at once; then [`half_fma`] group by group, in the group order. The same exact
/// sums and float steps as [`dot_unit`]: bit for bit.
///
/// # Safety
/// As [`decode_unit`] (its `dtab` entries at `xt`), `blk` a whole transposed Q3_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_unit<const SP: bool>(
    un: &Unit,
    blk: *const u8,
    xq: *const i8,
    xd: *const f32,
    xt: *const Tok,
    sp: *const u8,
    acc: __m256,
) -> __m256 {
    let (zi, zf) = (_mm256_setzero_si256(), _mm256_setzero_ps());
    let step = |g: usize, is: __m256i, st: (__m256, __m256)| {
        // SAFETY: the caller's `U` scales at `xd` and entries at `xt`.
        let (dx, bp) = unsafe { (_mm256_set1_ps(*xd.add(g)), _mm256_set1_epi32((*xt.add(g)).bp)) };
        half_fma::<T_Q3_K>(un, g, dx, (is, zi), bp, st)
    };
    // SAFETY: the caller's whole block and `U` groups of activations at `xq` (unit `u`).
    let pair = |g: usize| unsafe {
        match g {
            0 => q3_pair::<0>(un, blk, xq),
            1 => q3_pair::<1>(un, blk, xq),
            4 => q3_pair::<4>(un, blk, xq),
            _ => q3_pair::<5>(un, blk, xq),
        }
    };
    spread::<T_Q3_K, true, SP>(sp, 0);
    spread::<T_Q3_K, true, SP>(sp, 1);
    let (s0, s2) = pair(0);
    let st = step(0, s0, (zf, zf));
    spread::<T_Q3_K, true, SP>(sp, 2);
    spread::<T_Q3_K, true, SP>(sp, 3);
    let (s1, s3) = pair(1);
    let st = step(3, s3, step(2, s2, step(1, s1, st)));
    spread::<T_Q3_K, true, SP>(sp, 4);
    spread::<T_Q3_K, true, SP>(sp, 5);
    let (s4, s6) = pair(4);
    let st = step(4, s4, st);
    spread::<T_Q3_K, true, SP>(sp, 6);
    spread::<T_Q3_K, true, SP>(sp, 7);
    let (s5, s7) = pair(5);
    half_end::<T_Q3_K>(un, acc, step(7, s7, step(6, s6, step(5, s5, st))))
}

/// [`decode_unit`] for a whole unit of a transposed Q2_K tile at `blk`: the four groups
/// whose 2-bit values share a byte unpacked together ([`q2_quad`]); then [`half_fma`] group
/// by group, in the group order. The same exact sums and float steps as [`dot_unit`]: bit
/// for bit. Against `dot_unit`'s groups one by one (a load, a shift and a mask each), Zen 3,
/// `gq_decode_bench` over 256 KiB (L2), rows of 2048, one thread, alternating binaries, best
/// of 5-6: 13.7 -> 14.4-15.2 GB/s (in L2 and in L1 alike these kernels are bound by their
/// own operations: there the Q2_K decode reads 39 G weights/s, as Q4_K's). Forming the
/// scale pairs here from the scale nibbles (stored once per unit, 8 vectors against 24)
/// instead ran slower (12.6 against 15.2): their shuffles share the shift ports.
///
/// # Safety
/// As [`decode_unit`] (its `dtab` entries at `xt`), `blk` a whole transposed Q2_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_unit<const SP: bool>(
    un: &Unit,
    blk: *const u8,
    xq: *const i8,
    xd: *const f32,
    xt: *const Tok,
    sp: *const u8,
    acc: __m256,
) -> __m256 {
    let zf = _mm256_setzero_ps();
    let step = |g: usize, is: (__m256i, __m256i), st: (__m256, __m256)| {
        // SAFETY: the caller's `U` scales at `xd` and entries at `xt`.
        let (dx, bp) = unsafe { (_mm256_set1_ps(*xd.add(g)), _mm256_set1_epi32((*xt.add(g)).bp)) };
        half_fma::<T_Q2_K>(un, g, dx, is, bp, st)
    };
    spread::<T_Q2_K, true, SP>(sp, 0);
    spread::<T_Q2_K, true, SP>(sp, 1);
    spread::<T_Q2_K, true, SP>(sp, 2);
    spread::<T_Q2_K, true, SP>(sp, 3);
    // SAFETY: the caller's whole block and `U` groups of activations at `xq`.
    let [s0, s1, s2, s3] = unsafe { q2_quad::<0>(un, blk, xq) };
    let st = step(3, s3, step(2, s2, step(1, s1, step(0, s0, (zf, zf)))));
    spread::<T_Q2_K, true, SP>(sp, 4);
    spread::<T_Q2_K, true, SP>(sp, 5);
    spread::<T_Q2_K, true, SP>(sp, 6);
    spread::<T_Q2_K, true, SP>(sp, 7);
    // SAFETY: as above.
    let [s4, s5, s6, s7] = unsafe { q2_quad::<1>(un, blk, xq) };
    half_end::<T_Q2_K>(un, acc, step(7, s7, step(6, s6, step(5, s5, step(4, s4, st)))))
}

/// The weighed half sums `(k_0 isum_0, k_1 isum_1)` of groups `4Q .. 4Q + 4` of a transposed
/// Q2_K block at `blk` (row `r` in lane `r`) against the activations at `xq` (a unit's),
/// as [`lane_sums`] gives them. The four share each byte of their field: one load and one
/// shift per dword give all four, the odd groups' values times 4 (masked in place, `0x0C`:
/// their `maddubs` lanes stay within i16, 8 products of at most 12 x 128), their sums
/// divided by 4 again exactly (an arithmetic shift).
///
/// # Safety
/// `blk` a whole transposed Q2_K block; `xq` the unit's 256 activations.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_quad<const Q: usize>(un: &Unit, blk: *const u8, xq: *const i8) -> [(__m256i, __m256i); 4] {
    // SAFETY: every field below lies inside the block (caller).
    let ld = |m: usize| unsafe { field_t::<T_Q2_K>(blk, 16 + 32 * Q, m) };
    // SAFETY: dword `m` of group `g` of the caller's activations.
    let xb =
        |g: usize, m: usize| unsafe { _mm256_set1_epi32((xq.add(GROUP * g + 4 * m) as *const i32).read_unaligned()) };
    let (m03, m0c) = (_mm256_set1_epi8(0x03), _mm256_set1_epi8(0x0C));
    let mut w = [[_mm256_setzero_si256(); 2]; 4];
    for half in 0..2 {
        let mut s = [_mm256_setzero_si256(); 4];
        for m in 4 * half..4 * half + 4 {
            let v = ld(m);
            let h = _mm256_srli_epi16::<4>(v);
            let q = [
                _mm256_and_si256(v, m03),
                _mm256_and_si256(v, m0c),
                _mm256_and_si256(h, m03),
                _mm256_and_si256(h, m0c),
            ];
            for j in 0..4 {
                s[j] = _mm256_add_epi16(s[j], _mm256_maddubs_epi16(q[j], xb(4 * Q + j, m)));
            }
        }
        for j in 0..4 {
            w[j][half] = _mm256_madd_epi16(s[j], un.k[half][4 * Q + j]);
        }
    }
    let q4 = |v: __m256i| _mm256_srai_epi32::<2>(v);
    [(w[0][0], w[0][1]), (q4(w[1][0]), q4(w[1][1])), (w[2][0], w[2][1]), (q4(w[3][0]), q4(w[3][1]))]
}

/// [`decode_unit`] for a whole unit of a transposed Q4_K or Q5_K tile at `blk`: groups `g`
/// and `g + 1` (the low and high nibbles of the same bytes) unpacked together
/// ([`nib_pair`]), with constant field offsets and shifts; then [`group_fma`] group by
/// group, in the group order. The same exact sums and float steps as [`dot_unit`]: bit
/// for bit. Against `dot_unit`'s loop over the groups (field offsets looked up at run
/// time, each nibble byte loaded twice), Zen 3, `gq_decode_bench` rows of 2048, one
/// thread, GB/s: over 1 MiB (L3) Q4_K 18.7-19.2 -> 22.1-23.6, Q5_K 15.9-16.7 -> 18.2-19.3;
/// over 1 GiB Q4_K 11.4-16.4 -> 16.7-18.3, Q5_K 8.6-15.1 -> 15.0-15.6; TinyLlama tg32,
/// t/s, 1 thread: Q4_K_M 19.4-19.7 -> 23.3-24.3 (Q5_K_M 16.4-18.1 -> 16.9, within the noise).
///
/// # Safety
/// As [`decode_unit`] (its `U` activation sums at `xs`), `blk` a whole transposed block of
/// type `T`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nib_unit<const T: u8, const SP: bool>(
    un: &Unit,
    blk: *const u8,
    xq: *const i8,
    xd: *const f32,
    xs: *const i32,
    sp: *const u8,
    acc: __m256,
) -> __m256 {
    let step = |g: usize, is: (__m256i, __m256i), acc: __m256| {
        // SAFETY: the caller's `U` scales at `xd` and sums at `xs`.
        let (dx, bs) = unsafe { (_mm256_set1_ps(*xd.add(g)), _mm256_set1_epi32(*xs.add(g))) };
        group_fma::<T>(un, g, dx, is, _mm256_mul_ps(dx, _mm256_cvtepi32_ps(bs)), acc)
    };
    // Written out: as a loop over the pairs (a `match` on `g` choosing the constant), the
    // optimizer kept the loop and took the offsets from registers and the stack (Q4_K
    // slower than group by group).
    spread::<T, true, SP>(sp, 0);
    spread::<T, true, SP>(sp, 1);
    // SAFETY: the caller's whole block and `U` groups of activations at `xq`.
    let (s0, s1) = unsafe { nib_pair::<T, 0>(blk, xq) };
    let acc = step(1, s1, step(0, s0, acc));
    spread::<T, true, SP>(sp, 2);
    spread::<T, true, SP>(sp, 3);
    // SAFETY: the caller's whole block and `U` groups of activations at `xq`.
    let (s2, s3) = unsafe { nib_pair::<T, 2>(blk, xq) };
    let acc = step(3, s3, step(2, s2, acc));
    spread::<T, true, SP>(sp, 4);
    spread::<T, true, SP>(sp, 5);
    // SAFETY: the caller's whole block and `U` groups of activations at `xq`.
    let (s4, s5) = unsafe { nib_pair::<T, 4>(blk, xq) };
    let acc = step(5, s5, step(4, s4, acc));
    spread::<T, true, SP>(sp, 6);
    spread::<T, true, SP>(sp, 7);
    // SAFETY: the caller's whole block and `U` groups of activations at `xq`.
    let (s6, s7) = unsafe { nib_pair::<T, 6>(blk, xq) };
    step(7, s7, step(6, s6, acc))
}

/// The exact half sums (`(isum_0, isum_1)`, row `r` in lane `r`, as [`lane_sums`] gives
/// them) of groups `G` and `G + 1` (`G` even, a constant) of a transposed Q4_K or Q5_K
/// block at `blk` against the activations at `xq` (a unit's): one load of the bytes whose
/// low nibbles are group `G`'s and high nibbles group `G + 1`'s, and (Q5_K) one of the
/// high bits, each moved to bit 4 by one immediate shift and a mask ([`hbit_shift`]: 2
/// operations against [`hbit`]'s 3).
///
/// # Safety
/// `blk` a whole transposed block of type `T`; `xq` the unit's 256 activations.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nib_pair<const T: u8, const G: usize>(
    blk: *const u8,
    xq: *const i8,
) -> ((__m256i, __m256i), (__m256i, __m256i)) {
    debug_assert!(G.is_multiple_of(2) && G < U);
    let qs_off = if T == T_Q4_K { 16 } else { 48 };
    // SAFETY: every field below lies inside the block (caller).
    let ld = |o: usize, m: usize| unsafe { field_t::<T>(blk, o, m) };
    // SAFETY: dword `m` of group `g` of the caller's activations.
    let xb =
        |g: usize, m: usize| unsafe { _mm256_set1_epi32((xq.add(GROUP * g + 4 * m) as *const i32).read_unaligned()) };
    let (m4, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1));
    let mut w = [[_mm256_setzero_si256(); 2]; 2];
    for half in 0..2 {
        // In i16: 4 `maddubs` results per lane (`narrow_lanes`).
        let mut s = [_mm256_setzero_si256(); 2];
        for m in 4 * half..4 * half + 4 {
            let v = ld(qs_off + 16 * G, m);
            let (mut a, mut b) = (_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4));
            if T == T_Q5_K {
                let h = ld(16, m);
                a = _mm256_or_si256(a, hbit_shift(h, G));
                b = _mm256_or_si256(b, hbit_shift(h, G + 1));
            }
            s[0] = _mm256_add_epi16(s[0], _mm256_maddubs_epi16(a, xb(G, m)));
            s[1] = _mm256_add_epi16(s[1], _mm256_maddubs_epi16(b, xb(G + 1, m)));
        }
        w[0][half] = _mm256_madd_epi16(s[0], ones);
        w[1][half] = _mm256_madd_epi16(s[1], ones);
    }
    ((w[0][0], w[0][1]), (w[1][0], w[1][1]))
}

/// 0x10 in every byte where bit `g` of the byte of `hm` is set, as [`hbit`] with `add`
/// 0x10: bit `g` moved to bit 4 by an immediate 16-bit shift ([`shl16`]; bits 4 and 12 of
/// a lane take bits of their own byte), then masked. Called with constants.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hbit_shift(hm: __m256i, g: usize) -> __m256i {
    _mm256_and_si256(shl16(hm, 4 - g as i32), _mm256_set1_epi8(0x10))
}

/// The weighed integer sums `k_0 isum_0 + k_1 isum_1` of groups `g` and `g + 2` (`g = G`:
/// 0, 1, 4 or 5; a constant, so that every shift and field is; as an argument, out of line,
/// it ran 10% slower than the groups one by one) of a transposed Q3_K block at `blk` (row
/// `r` in lane `r`) against the activations at `xq` (a unit's). Their 2-bit values share a
/// byte 4 bits apart, and so do their high bits in the AVX2 tiles ([`Q3_HBIT`]): one shift
/// and mask of each and an `or` give both as nibbles (5 operations, against 9 for the two
/// apart).
///
/// # Safety
/// `blk` a whole transposed Q3_K block (AVX2 layout); `xq` the unit's 256 activations.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_pair<const G: usize>(un: &Unit, blk: *const u8, xq: *const i8) -> (__m256i, __m256i) {
    let g = G;
    let (h, k, p) = (g / 4, g % 4, Q3_HBIT[g]);
    debug_assert!(k < 2 && Q3_HBIT[g + 2] == p + 4);
    // SAFETY: every field below lies inside the block (caller).
    let ld = |o: usize, m: usize| unsafe { field_t::<T_Q3_K>(blk, o, m) };
    // SAFETY: dword `m` of group `gg` of the caller's activations.
    let xb =
        |gg: usize, m: usize| unsafe { _mm256_set1_epi32((xq.add(GROUP * gg + 4 * m) as *const i32).read_unaligned()) };
    let (m33, m44, m0f) = (_mm256_set1_epi8(0x33), _mm256_set1_epi8(0x44), _mm256_set1_epi8(0x0F));
    let mut w = [[_mm256_setzero_si256(); 2]; 2];
    for half in 0..2 {
        let mut s = [_mm256_setzero_si256(); 2];
        for m in 4 * half..4 * half + 4 {
            let v = ld(32 + 32 * h, m);
            let v = if k == 0 { v } else { _mm256_srli_epi16::<2>(v) };
            // High bits `p`, `p + 4` to bits 2, 6 (a 16-bit shift: bits 2 and 6 of each
            // byte come from that byte, `p` being at most 3).
            let hm = shl16(ld(0, m), 2 - p as i32);
            let n = _mm256_or_si256(_mm256_and_si256(v, m33), _mm256_and_si256(hm, m44));
            let (qa, qb) = (_mm256_and_si256(n, m0f), _mm256_and_si256(_mm256_srli_epi16::<4>(n), m0f));
            // In i16: 8 products of values below 8 per lane (`narrow_lanes`).
            s[0] = _mm256_add_epi16(s[0], _mm256_maddubs_epi16(qa, xb(g, m)));
            s[1] = _mm256_add_epi16(s[1], _mm256_maddubs_epi16(qb, xb(g + 2, m)));
        }
        w[0][half] = _mm256_madd_epi16(s[0], un.k[half][g]);
        w[1][half] = _mm256_madd_epi16(s[1], un.k[half][g + 2]);
    }
    (_mm256_add_epi32(w[0][0], w[0][1]), _mm256_add_epi32(w[1][0], w[1][1]))
}

/// Under [`Prefetch::Near`] (`SP`), group `g`'s share ([`part_lines`]) of the next unit
/// `sp` of its stream ([`decode_tiles`]) into L1: the unit's prefetches spread between
/// its groups' loads. Issued as a burst at the unit's start (as under `L1`), they held
/// the Zen 3 decode to about the speed of none (a streaming test alike: 8-10 GB/s burst
/// or none, 13-17 spread). By inline assembly ([`prefetch_line_l1_kept`]): the intrinsic
/// behind a run-time check on `sp` had LLVM spill the Q3_K unit's registers (7 against
/// 13 GB/s in cache); the check is now the constant `SP` (the intrinsic not tried again).
#[inline(always)]
fn spread<const T: u8, const TR: bool, const SP: bool>(sp: *const u8, g: usize) {
    if SP {
        let ub = block_bytes(T) * R * if !TR && T <= T_IQ4_NL { U } else { 1 };
        for l in part_lines(ub, g, U) {
            prefetch_line_l1_kept(sp.wrapping_add(64 * l));
        }
    }
}

/// Whether decode takes the [`Tok`] table too: over transposed tiles of the types
/// with a scale per 16 values, whose half sums of the activations it otherwise forms
/// again per tile by horizontal adds.
const fn dtab<const T: u8, const TR: bool>() -> bool {
    TR && halves(T)
}

/// The f16 at byte `off` of each of the 8 rows' blocks, as f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16x8(p: &[*const u8; R], off: usize) -> __m256 {
    // SAFETY: the caller passes pointers with 2 readable bytes at `off`.
    let h: [i16; R] = std::array::from_fn(|r| unsafe { (p[r].add(off) as *const i16).read_unaligned() });
    _mm256_cvtph_ps(_mm_setr_epi16(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]))
}

/// 8 unsigned bytes (little-endian in `x`) as f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn u8x8_ps(x: u64) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(x as i64)))
}

/// `v[r]` lane `g` becomes `v[g]` lane `r`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn transpose8(v: &mut [__m256; 8]) {
    let t0 = _mm256_unpacklo_ps(v[0], v[1]);
    let t1 = _mm256_unpackhi_ps(v[0], v[1]);
    let t2 = _mm256_unpacklo_ps(v[2], v[3]);
    let t3 = _mm256_unpackhi_ps(v[2], v[3]);
    let t4 = _mm256_unpacklo_ps(v[4], v[5]);
    let t5 = _mm256_unpackhi_ps(v[4], v[5]);
    let t6 = _mm256_unpacklo_ps(v[6], v[7]);
    let t7 = _mm256_unpackhi_ps(v[6], v[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    v[0] = _mm256_permute2f128_ps::<0x20>(u0, u4);
    v[1] = _mm256_permute2f128_ps::<0x20>(u1, u5);
    v[2] = _mm256_permute2f128_ps::<0x20>(u2, u6);
    v[3] = _mm256_permute2f128_ps::<0x20>(u3, u7);
    v[4] = _mm256_permute2f128_ps::<0x31>(u0, u4);
    v[5] = _mm256_permute2f128_ps::<0x31>(u1, u5);
    v[6] = _mm256_permute2f128_ps::<0x31>(u2, u6);
    v[7] = _mm256_permute2f128_ps::<0x31>(u3, u7);
}

/// 0xFF in byte `j` where bit `j` of `m` is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bits32(m: u32) -> __m256i {
    let v = _mm256_set1_epi32(m as i32);
    let sel = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, sel), bit), bit)
}

/// The low nibbles of 16 bytes, then their high nibbles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles16(p: *const u8) -> __m256i {
    // SAFETY: the caller passes 16 readable bytes.
    let v = unsafe { _mm_loadu_si128(p as *const __m128i) };
    _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(v), v), _mm256_set1_epi8(0x0F))
}

/// Bits `k * 2 .. k * 2 + 2` of every byte (`k < 4`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn crumbs(v: __m256i, k: usize) -> __m256i {
    // Immediate shifts (a shift by a register count costs two micro-ops).
    let v = match k {
        0 => v,
        1 => _mm256_srli_epi16::<2>(v),
        2 => _mm256_srli_epi16::<4>(v),
        _ => _mm256_srli_epi16::<6>(v),
    };
    _mm256_and_si256(v, _mm256_set1_epi8(3))
}

/// Where the AVX2 transposed tiles keep group `g`'s high bit in a Q3_K high-bit byte
/// (`quant::groups` has it at bit `g`): groups `g` and `g + 2` (`g` 0, 1, 4, 5) 4 bits
/// apart, so that one shift and one mask bring both beside their 2-bit values, which
/// share a byte 4 bits apart too ([`q3_pair`]).
pub(super) const Q3_HBIT: [u32; 8] = [0, 1, 4, 5, 2, 3, 6, 7];

/// A Q3_K high-bit byte in the AVX2 transposed tiles' order ([`Q3_HBIT`]).
fn q3_hbits(v: u8) -> u8 {
    (0..8).fold(0, |acc, g| acc | ((v >> g) & 1) << Q3_HBIT[g])
}

/// A Q3_K block (as stored, 110 bytes) rewritten for the AVX2 transposed tiles
/// ([`super::pack_transposed`]): its 32 high-bit bytes in the order [`Q3_HBIT`].
pub(super) fn q3_block(blk: &mut [u8]) {
    for v in &mut blk[..32] {
        *v = q3_hbits(*v);
    }
}

/// Each 16-bit lane of `v` shifted left by `n` (right by `-n` where `n` is negative; `n`
/// from -3 to 4), by an immediate: called with constants, the match folds away.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn shl16(v: __m256i, n: i32) -> __m256i {
    match n {
        4 => _mm256_slli_epi16::<4>(v),
        3 => _mm256_slli_epi16::<3>(v),
        2 => _mm256_slli_epi16::<2>(v),
        1 => _mm256_slli_epi16::<1>(v),
        0 => v,
        -1 => _mm256_srli_epi16::<1>(v),
        -2 => _mm256_srli_epi16::<2>(v),
        -3 => _mm256_srli_epi16::<3>(v),
        _ => unreachable!("shl16 by {n}"),
    }
}

/// `add` in every byte where bit `g` of the byte of `hm` is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hbit(hm: __m256i, g: usize, add: i8) -> __m256i {
    let b = _mm256_set1_epi8((1u8 << g) as i8);
    _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, b), b), _mm256_set1_epi8(add))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn neg(v: __m256) -> __m256 {
    _mm256_xor_ps(v, _mm256_set1_ps(-0.0))
}

/// The IQ4 levels in both 128-bit lanes (a `pshufb` table).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn levels() -> __m256i {
    let l = IQ4_LEVELS;
    _mm256_setr_epi8(
        l[0], l[1], l[2], l[3], l[4], l[5], l[6], l[7], l[8], l[9], l[10], l[11], l[12], l[13], l[14], l[15], l[0],
        l[1], l[2], l[3], l[4], l[5], l[6], l[7], l[8], l[9], l[10], l[11], l[12], l[13], l[14], l[15],
    )
}

#[inline]
unsafe fn rd32(p: *const u8) -> u32 {
    // SAFETY: the callers pass 4 readable bytes.
    unsafe { (p as *const u32).read_unaligned() }
}

/// The 32 integers of group `g` of one row's unit at `p` (unsigned `q + bias`, or
/// the signed IQ4 levels; `lv` is [`levels`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qgroup<const T: u8>(p: *const u8, g: usize, lv: __m256i) -> __m256i {
    let m4 = _mm256_set1_epi8(0x0F);
    // SAFETY: (whole body) the caller passes the start of a unit inside its row with group `g`
    // in it; every load below stays inside that group's block.
    unsafe {
        match T {
            T_Q4_1 | T_Q5_0 | T_Q5_1 | T_IQ4_NL => {
                let p = p.add(g * block_bytes(T));
                let (qs_off, qh_off) = match T {
                    T_Q4_1 => (4, 0),
                    T_Q5_0 => (6, 2),
                    T_Q5_1 => (8, 4),
                    _ => (2, 0),
                };
                let q = nibbles16(p.add(qs_off));
                match T {
                    T_Q5_0 | T_Q5_1 => {
                        _mm256_or_si256(q, _mm256_and_si256(bits32(rd32(p.add(qh_off))), _mm256_set1_epi8(0x10)))
                    }
                    T_IQ4_NL => _mm256_shuffle_epi8(lv, q),
                    _ => q,
                }
            }
            T_Q4_K | T_Q5_K => {
                let qs_off = if T == T_Q4_K { 16 } else { 48 };
                let v = _mm256_loadu_si256(p.add(qs_off + 32 * (g / 2)) as *const __m256i);
                let q = if g.is_multiple_of(2) { v } else { _mm256_srli_epi16::<4>(v) };
                let q = _mm256_and_si256(q, m4);
                if T == T_Q5_K {
                    _mm256_or_si256(q, hbit(_mm256_loadu_si256(p.add(16) as *const __m256i), g, 0x10))
                } else {
                    q
                }
            }
            T_IQ4_XS => _mm256_shuffle_epi8(lv, nibbles16(p.add(8 + 16 * g))),
            T_Q2_K => crumbs(_mm256_loadu_si256(p.add(16 + 32 * (g / 4)) as *const __m256i), g % 4),
            T_Q3_K => {
                let v = _mm256_loadu_si256(p.add(32 + 32 * (g / 4)) as *const __m256i);
                _mm256_or_si256(crumbs(v, g % 4), hbit(_mm256_loadu_si256(p as *const __m256i), g, 4))
            }
            _ => {
                // Q6_K
                let (h, k) = (g / 4, g % 4);
                let l = _mm256_loadu_si256(p.add(64 * h + 32 * (k % 2)) as *const __m256i);
                let nib = if k < 2 { l } else { _mm256_srli_epi16::<4>(l) };
                let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
                _mm256_or_si256(_mm256_and_si256(nib, m4), _mm256_slli_epi16::<4>(crumbs(qh, k)))
            }
        }
    }
}

/// Dword `m` (values `4m .. 4m + 4`) of group `g` of the 8 rows of a transposed
/// tile's block at `blk` ([`super::pack_transposed`]), row `r` in lane `r`, as [`qgroup`]
/// gives those values (the same byte-wise steps on the same bytes).
///
/// # Safety
/// `blk` points at a whole transposed block of type `T` (one of [`super::transposable`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qgroup_t<const T: u8>(blk: *const u8, g: usize, m: usize, lv: __m256i) -> __m256i {
    let m4 = _mm256_set1_epi8(0x0F);
    // SAFETY: every field below lies inside the block (`quant::groups::unpack`'s layouts),
    // whose vectors are all there (caller).
    let ld = |o: usize, k: usize| unsafe { field_t::<T>(blk, o, k) };
    match T {
        T_Q4_K | T_Q5_K => {
            let qs_off = if T == T_Q4_K { 16 } else { 48 };
            let v = ld(qs_off + 32 * (g / 2), m);
            let q = _mm256_and_si256(if g.is_multiple_of(2) { v } else { _mm256_srli_epi16::<4>(v) }, m4);
            if T == T_Q5_K {
                _mm256_or_si256(q, hbit(ld(16, m), g, 0x10))
            } else {
                q
            }
        }
        // SAFETY: as above.
        T_IQ4_XS => _mm256_shuffle_epi8(lv, unsafe { nibble_t(blk, g, m) }),
        T_Q2_K => crumbs(ld(16 + 32 * (g / 4), m), g % 4),
        T_Q3_K => _mm256_or_si256(crumbs(ld(32 + 32 * (g / 4), m), g % 4), hbit(ld(0, m), Q3_HBIT[g] as usize, 4)),
        T_Q6_K => {
            let (h, k) = (g / 4, g % 4);
            let l = ld(64 * h + 32 * (k % 2), m);
            let nib = if k < 2 { l } else { _mm256_srli_epi16::<4>(l) };
            _mm256_or_si256(_mm256_and_si256(nib, m4), _mm256_slli_epi16::<4>(crumbs(ld(128 + 32 * h, m), k)))
        }
        _ => unreachable!("type tag {T} is not packed transposed"),
    }
}

/// Dword `k` of the 8 rows' field at byte `o` (a multiple of 4) of a transposed block of
/// type `T` at `blk`, row `r` in lane `r`.
///
/// # Safety
/// `blk` points at a whole transposed block of type `T`, and the field's dword `k` lies
/// inside it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn field_t<const T: u8>(blk: *const u8, o: usize, k: usize) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe { _mm256_loadu_si256(blk.add(slot(T, o / 4 + k) * 32) as *const __m256i) }
}

/// The level indices (nibbles) of dword `m` of group `g` of the 8 rows of a transposed
/// IQ4_XS block at `blk`, as [`qgroup_t`] takes them.
///
/// # Safety
/// As [`qgroup_t`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibble_t(blk: *const u8, g: usize, m: usize) -> __m256i {
    // Values 0..16 are the low nibbles of the field's 16 bytes, 16..32 the high.
    // SAFETY: the field (bytes 8 + 16 g ..) lies inside the block, all of whose vectors are there.
    let v = unsafe { field_t::<T_IQ4_XS>(blk, 8 + 16 * g, m % 4) };
    _mm256_and_si256(if m < 4 { v } else { _mm256_srli_epi16::<4>(v) }, _mm256_set1_epi8(0x0F))
}

/// f32 lanes from the low (`HI` false) or high halves (f16) of the dwords of `x`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn h16<const HI: bool>(x: __m256i) -> __m256 {
    let v = if HI { _mm256_srli_epi32::<16>(x) } else { _mm256_and_si256(x, _mm256_set1_epi32(0xFFFF)) };
    _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v)))
}

/// The scales and offsets of the 8 groups of a transposed block at `blk` into `un`,
/// formed from its scale dwords ([`fields`], one vector each, row `r` in lane `r`) as
/// the AVX-512 kernels form them: no per-row reads and no transposes (decode spent
/// 45% of its time in [`scales`]' gathers and transposes: Q4_K in L2). The same
/// bytes and the same f32 products as [`scales`], bit for bit.
///
/// # Safety
/// `blk` points at a whole transposed block of type `T` (one of [`super::transposable`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales_t<const T: u8>(blk: *const u8, un: &mut Unit) {
    let mut raw = [_mm256_setzero_si256(); 5];
    for (i, &f) in fields(T).iter().enumerate() {
        // SAFETY: the slot of every field dword lies inside the block (caller).
        let v = unsafe { _mm256_loadu_si256(blk.add(slot(T, f.div_ceil(4)) * 32) as *const __m256i) };
        // A field at `4k + 2` (only its high half is read): the next dword's low half moved up.
        raw[i] = if f % 4 == 0 { v } else { _mm256_slli_epi32::<16>(v) };
    }
    scales_raw::<T>(&raw, un);
}

/// A `pshufb` control taking bytes `p` (`0x80`: zero) of each dword from that dword.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn shuf4(p: [u8; 4]) -> __m256i {
    let b = |i: usize| {
        let v = p[i % 4];
        (if v >= 0x80 { 0x80 } else { v + 4 * (i / 4 % 4) as u8 }) as i8
    };
    _mm256_setr_epi8(
        b(0),
        b(1),
        b(2),
        b(3),
        b(4),
        b(5),
        b(6),
        b(7),
        b(8),
        b(9),
        b(10),
        b(11),
        b(12),
        b(13),
        b(14),
        b(15),
        b(16),
        b(17),
        b(18),
        b(19),
        b(20),
        b(21),
        b(22),
        b(23),
        b(24),
        b(25),
        b(26),
        b(27),
        b(28),
        b(29),
        b(30),
        b(31),
    )
}

/// [`scales_t`]'s work from a block's scale dwords `raw` ([`fields`], one vector each,
/// row `r` in lane `r`; a field at `4k + 2` with its high half read), however gathered.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scales_raw<const T: u8>(raw: &[__m256i; 5], un: &mut Unit) {
    let cvt = _mm256_cvtepi32_ps;
    let six = |v: __m256i| _mm256_sub_epi32(v, _mm256_set1_epi32(32));
    match T {
        T_Q2_K => un.d = [h16::<false>(raw[4]), neg(h16::<true>(raw[4]))],
        T_Q3_K => un.d[0] = h16::<true>(raw[3]),
        T_Q6_K => un.d[0] = h16::<true>(raw[4]),
        _ => {}
    }
    // Q4_K, Q5_K: the 6-bit scales and mins of the 8 groups as bytes, four to a dword
    // (`k4[0]` scales 0..4, 4..8, `k4[1]` the mins), row `r` in lane `r`, for all groups at
    // once (as ggml unpacks them per row), and `d`, `-dmin` (`(-dmin) * m` is `-(dmin * m)`
    // bit for bit). Per group each is one byte of one of these (`ext`).
    let (mut k4, mut d4) = ([[_mm256_setzero_si256(); 2]; 2], [_mm256_setzero_ps(); 2]);
    if matches!(T, T_Q4_K | T_Q5_K) {
        let (w0, w1, w2) = (raw[1], raw[2], raw[3]);
        let (m3f, m0f, m30) = (_mm256_set1_epi8(0x3F), _mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
        let hi2 = |w: __m256i| _mm256_and_si256(_mm256_srli_epi32::<2>(w), m30);
        k4[0] = [_mm256_and_si256(w0, m3f), _mm256_or_si256(_mm256_and_si256(w2, m0f), hi2(w0))];
        k4[1] =
            [_mm256_and_si256(w1, m3f), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32::<4>(w2), m0f), hi2(w1))];
        d4 = [h16::<false>(raw[0]), neg(h16::<true>(raw[0]))];
    }
    // Q2_K: the low and the high nibbles of its 16 scale bytes, once (`raw[0..4]`); Q3_K:
    // those of its first 8 (`raw[0..2]`).
    let mut nib = [(_mm256_setzero_si256(), _mm256_setzero_si256()); 4];
    if matches!(T, T_Q2_K | T_Q3_K) {
        let m = _mm256_set1_epi8(0x0F);
        nib =
            std::array::from_fn(|i| (_mm256_and_si256(raw[i], m), _mm256_and_si256(_mm256_srli_epi16::<4>(raw[i]), m)));
    }
    // IQ4_XS: its 8 6-bit scales (unsigned, before `- 32`) as bytes, four to a dword (`e6[0]`
    // groups 0, 2, 4, 6, `e6[1]` groups 1, 3, 5, 7), row `r` in lane `r`: the low 4 bits the
    // nibbles of `scales_l` (`raw[1]`), the high 2 bits those of `scales_h` (`raw[0]`'s high
    // half), each nibble of it first spread to its own byte (group `2i`'s bits 0, 1 and
    // `2i + 1`'s bits 2, 3 in byte `i`), then moved to bits 4, 5: 14 operations for all 8,
    // then 4 a group, against 9 a group formed one by one (Zen 3, `gq_decode_bench` in L2,
    // rows of 2048, alternating, best of 5: 16.8 -> 17.8 GB/s; `gq_bench` packed prefill
    // 55.1-55.8 -> 56.0-56.5 Gmac/s).
    let mut e6 = [_mm256_setzero_si256(); 2];
    if T == T_IQ4_XS {
        let (m0f, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
        let and = _mm256_and_si256;
        let t = _mm256_shuffle_epi8(raw[0], shuf4([2, 2, 3, 3]));
        let nib = _mm256_or_si256(
            and(t, _mm256_set1_epi32(0x000F_000F)),
            and(_mm256_srli_epi16::<4>(t), _mm256_set1_epi32(0x0F00_0F00)),
        );
        e6 = [
            _mm256_or_si256(and(raw[1], m0f), and(_mm256_slli_epi16::<4>(nib), m30)),
            _mm256_or_si256(and(_mm256_srli_epi16::<4>(raw[1]), m0f), and(_mm256_slli_epi16::<2>(nib), m30)),
        ];
    }
    // Q3_K: its 16 6-bit scales (unsigned, before `- 32`) as bytes, four to a dword (`s3[q]`
    // scales `4q .. 4q + 4`), row `r` in lane `r`, all at once: the low 4 bits are the low
    // (scales 0..8) or high nibbles of bytes 0..8 (`raw[0]`, `raw[1]`), the high 2 bits bits
    // `2 (i / 4)` of byte `8 + i % 4` (`raw[2]`), each moved to bits 4, 5 of its byte by a
    // shift that keeps them in their byte. (Formed per group, from the same bytes picked
    // and shifted per pair, they took about 11 operations a group against 5 here: AVX2
    // Q3_K decode in L2 18.0-18.1 -> 18.3-19.0 GB/s.)
    let mut s3 = [_mm256_setzero_si256(); 4];
    if T == T_Q3_K {
        let m30 = _mm256_set1_epi8(0x30);
        let and = _mm256_and_si256;
        let lo = [nib[0].0, nib[1].0, nib[0].1, nib[1].1];
        let h = raw[2];
        let hi = [
            and(_mm256_slli_epi16::<4>(h), m30),
            and(_mm256_slli_epi16::<2>(h), m30),
            and(h, m30),
            and(_mm256_srli_epi16::<2>(h), m30),
        ];
        s3 = std::array::from_fn(|q| _mm256_or_si256(lo[q], hi[q]));
    }
    // Byte `k` of each dword of `v` as an i32.
    let ext = |v: __m256i, k: usize| match k {
        0 => _mm256_and_si256(v, _mm256_set1_epi32(0xFF)),
        1 => _mm256_shuffle_epi8(v, shuf4([1, 0x80, 0x80, 0x80])),
        2 => _mm256_shuffle_epi8(v, shuf4([2, 0x80, 0x80, 0x80])),
        _ => _mm256_srli_epi32::<24>(v),
    };
    // Unrolled, so that every shift count and `raw` index is a constant: as a loop (not
    // unrolled by the compiler) its shifts took counts from registers and `raw` lived on
    // the stack, a quarter of the AVX2 Q3_K decode's time in L2.
    unroll8!(g => {
        match T {
            T_Q2_K => {
                // Scale bytes 2g, 2g + 1: low nibble the scale, high the min.
                let ((lo, hi), j) = (nib[g / 2], 2 * (g % 2) as u8);
                un.k[0][g] = _mm256_shuffle_epi8(lo, shuf4([j, 0x80, j, 0x80]));
                un.k[1][g] = _mm256_shuffle_epi8(lo, shuf4([j + 1, 0x80, j + 1, 0x80]));
                un.k[2][g] = _mm256_shuffle_epi8(hi, shuf4([j, 0x80, j + 1, 0x80]));
            }
            T_Q3_K => {
                // Scales 2g, 2g + 1 (bytes 2 (g % 2), + 1 of `s3[g / 2]`) as an i16 pair.
                let j = 2 * (g % 2) as u8;
                let pick = shuf4([j, 0x80, j + 1, 0x80]);
                let k = _mm256_sub_epi16(_mm256_shuffle_epi8(s3[g / 2], pick), _mm256_set1_epi16(32));
                un.k[0][g] = _mm256_shuffle_epi8(k, shuf4([0, 1, 0, 1]));
                un.k[1][g] = _mm256_shuffle_epi8(k, shuf4([2, 3, 2, 3]));
                un.k[2][g] = _mm256_slli_epi16::<2>(k);
            }
            T_Q4_K | T_Q5_K => {
                let sc = ext(k4[0][g / 4], g % 4);
                let m = ext(k4[1][g / 4], g % 4);
                un.s[0][g] = _mm256_mul_ps(d4[0], cvt(sc));
                un.o[0][g] = _mm256_mul_ps(d4[1], cvt(m));
            }
            T_Q6_K => {
                // Signed byte i into the high byte of both halves of its dword, then
                // arithmetically down.
                let ki = |i: usize| {
                    let j = (i % 4) as u8;
                    _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(raw[i / 4], shuf4([0x80, j, 0x80, j])))
                };
                let (k0, k1) = (ki(2 * g), ki(2 * g + 1));
                (un.k[0][g], un.k[1][g]) = (k0, k1);
                un.k[2][g] = _mm256_slli_epi16::<5>(_mm256_blend_epi16::<0xAA>(k0, k1));
            }
            _ => {
                // IQ4_XS
                let d = h16::<false>(raw[0]);
                un.s[0][g] = _mm256_mul_ps(d, cvt(six(ext(e6[g % 2], g / 2))));
            }
        }
    });
}

/// The scales and offsets of the `ng` groups of the units at `bp` (one per row) into `un`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales<const T: u8>(bp: &[*const u8; R], ng: usize, un: &mut Unit) {
    let zf = _mm256_setzero_ps();
    // SAFETY: (whole body) the caller passes the starts of units inside their rows (`ng`
    // blocks of a small type, or one K-quant block); every read stays inside those blocks.
    unsafe {
        match T {
            T_Q4_1 | T_Q5_0 | T_Q5_1 | T_IQ4_NL => {
                for j in 0..ng {
                    let p: [*const u8; R] = std::array::from_fn(|r| bp[r].add(j * block_bytes(T)));
                    un.s[0][j] = f16x8(&p, 0);
                    if offset(T) {
                        un.o[0][j] = f16x8(&p, 2);
                    }
                }
            }
            T_Q4_K | T_Q5_K => {
                let (d, ndmin) = (f16x8(bp, 0), neg(f16x8(bp, 2)));
                let (mut sc, mut mn) = ([zf; R], [zf; R]);
                for r in 0..R {
                    let p = bp[r];
                    let (w0, w1, w2) = (rd32(p.add(4)), rd32(p.add(8)), rd32(p.add(12)));
                    let sc_hi = (w2 & 0x0F0F_0F0F) | ((w0 >> 2) & 0x3030_3030);
                    let m_hi = ((w2 >> 4) & 0x0F0F_0F0F) | ((w1 >> 2) & 0x3030_3030);
                    sc[r] = u8x8_ps((w0 & 0x3F3F_3F3F) as u64 | (sc_hi as u64) << 32);
                    mn[r] = u8x8_ps((w1 & 0x3F3F_3F3F) as u64 | (m_hi as u64) << 32);
                }
                transpose8(&mut sc);
                transpose8(&mut mn);
                for g in 0..U {
                    un.s[0][g] = _mm256_mul_ps(d, sc[g]);
                    un.o[0][g] = _mm256_mul_ps(ndmin, mn[g]);
                }
            }
            T_IQ4_XS => {
                let d = f16x8(bp, 0);
                let mut sc = [zf; R];
                let sh_lo = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
                let sh_hi = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
                for r in 0..R {
                    let p = bp[r];
                    let sh = (p.add(2) as *const u16).read_unaligned() as i32;
                    let sl = rd32(p.add(4)) as i32;
                    let lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(sl), sh_lo), _mm256_set1_epi32(0xF));
                    let hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(sh), sh_hi), _mm256_set1_epi32(3));
                    let ls = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32::<4>(hi)), _mm256_set1_epi32(32));
                    sc[r] = _mm256_cvtepi32_ps(ls);
                }
                transpose8(&mut sc);
                for g in 0..U {
                    un.s[0][g] = _mm256_mul_ps(d, sc[g]);
                }
            }
            T_Q2_K | T_Q3_K | T_Q6_K => {
                // The scale dwords gathered from the 8 rows, then as from a transposed block
                // (a field at `4k + 2` read whole: only its high half is used).
                let mut raw = [_mm256_setzero_si256(); 5];
                for (i, &f) in fields(T).iter().enumerate() {
                    let w: [i32; R] = std::array::from_fn(|r| rd32(bp[r].add(f)) as i32);
                    raw[i] = _mm256_loadu_si256(w.as_ptr() as *const __m256i);
                }
                scales_raw::<T>(&raw, un);
            }
            _ => unreachable!("type tag {T}"),
        }
    }
}

/// Row `r`'s exact half sums `(isum_0, isum_1)` of one group in lane `r`, from the
/// group's 32 integers of each row (`q(r)`, as [`qgroup`] gives them) and its 32
/// activations `x`: per row one `maddubs`, then a tree of horizontal adds.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn row_sums<const T: u8>(q: impl Fn(usize) -> __m256i, x: __m256i) -> (__m256i, __m256i) {
    let ones16 = _mm256_set1_epi16(1);
    // The sign trick with |x| unsigned (exact for x = -128 too: |q| <= 127).
    let xabs = _mm256_abs_epi8(x);
    let mut m = [_mm256_setzero_si256(); R];
    for r in 0..R {
        let q = q(r);
        m[r] = if signed(T) { _mm256_maddubs_epi16(xabs, _mm256_sign_epi8(q, x)) } else { _mm256_maddubs_epi16(q, x) };
    }
    // Row r's half sums in lane r.
    if narrow(T) {
        // Sums of up to 8 pairs stay within i16 (see `narrow`): a tree of
        // 16-bit horizontal adds leaves rows 0..8 in each 128-bit half.
        let h = |a, b| _mm256_hadd_epi16(a, b);
        let v = h(h(h(m[0], m[1]), h(m[2], m[3])), h(h(m[4], m[5]), h(m[6], m[7])));
        (_mm256_cvtepi16_epi32(_mm256_castsi256_si128(v)), _mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(v)))
    } else {
        let p: [__m256i; R] = std::array::from_fn(|r| _mm256_madd_epi16(m[r], ones16));
        let a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        let b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
        (_mm256_permute2x128_si256::<0x20>(a, b), _mm256_permute2x128_si256::<0x31>(a, b))
    }
}

/// Types whose lane sums ([`lane_sums`]) may add four `maddubs` results in i16: a
/// 16-bit lane then sums 8 products of unsigned integers below 32 and |x| <= 128,
/// at most 31,744.
const fn narrow_lanes(t: u8) -> bool {
    matches!(t, T_Q2_K | T_Q3_K | T_Q4_K | T_Q5_K)
}

/// Types whose prefill ([`pair_block`]) may add all eight `maddubs` results of a group
/// in i16: one scale per 32 values and unsigned integers below 16, so that a 16-bit lane
/// sums 16 products with |x| <= 128, at most 30,720.
const fn whole_lanes(t: u8) -> bool {
    matches!(t, T_Q4_K)
}

/// Types whose lane sums may add two `maddubs` results in i16: unsigned integers
/// below 64 (Q6_K's `q + 32`), a 16-bit lane then sums 4 products with |x| <= 128,
/// at most 4 * 63 * 128 = 32,256 in magnitude.
const fn pair_lanes(t: u8) -> bool {
    matches!(t, T_Q6_K)
}

/// [`row_sums`] from a transposed tile's group ([`super::pack_transposed`]): `q(m)` holds
/// dword `m` (values `4m .. 4m + 4`) of the 8 rows, row `r` in lane `r`; each is
/// multiplied with activation dword `m` broadcast (`xp`: the group's 32 activations),
/// so each row's products stay in its own lane: no horizontal adds. Each half's i16
/// pairs are summed into i32 by a `madd` against `k0` / `k1`: ones, or a [`halves`]
/// type's integer scales ([`Unit`]'s `k`), giving `k_h * isum_h` for free.
///
/// The signed types take the activations' absolute values from `xa` (formed once per
/// unit for both of decode's tiles, [`decode_tiles`]: an `abs` per dword less).
///
/// # Safety
/// `xp` points at 32 readable activations, and for the [`signed`] types `xa` at their 32
/// absolute values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lane_sums<const T: u8>(
    q: impl Fn(usize) -> __m256i,
    xp: *const i8,
    xa: *const i8,
    (k0, k1): (__m256i, __m256i),
) -> (__m256i, __m256i) {
    // A loop, not `array::from_fn`: its closure was left out of line in some of the
    // kernels (decode at 58% of the speed).
    let mut p = [_mm256_setzero_si256(); 8];
    for (m, p) in p.iter_mut().enumerate() {
        // SAFETY: dword `m < 8` of the caller's 32 activations.
        let xb = _mm256_set1_epi32(unsafe { (xp.add(4 * m) as *const i32).read_unaligned() });
        let q = q(m);
        *p = if signed(T) {
            // SAFETY: dword `m` of the caller's 32 absolute values.
            let xab = _mm256_set1_epi32(unsafe { (xa.add(4 * m) as *const i32).read_unaligned() });
            _mm256_maddubs_epi16(xab, _mm256_sign_epi8(q, xb))
        } else {
            _mm256_maddubs_epi16(q, xb)
        };
    }
    let add16 = |a, b| _mm256_add_epi16(a, b);
    let add32 = |a, b| _mm256_add_epi32(a, b);
    let (m0, m1) = (|v| _mm256_madd_epi16(v, k0), |v| _mm256_madd_epi16(v, k1));
    if narrow_lanes(T) {
        (m0(add16(add16(p[0], p[1]), add16(p[2], p[3]))), m1(add16(add16(p[4], p[5]), add16(p[6], p[7]))))
    } else if pair_lanes(T) {
        (add32(m0(add16(p[0], p[1])), m0(add16(p[2], p[3]))), add32(m1(add16(p[4], p[5])), m1(add16(p[6], p[7]))))
    } else {
        (
            add32(add32(m0(p[0]), m0(p[1])), add32(m0(p[2]), m0(p[3]))),
            add32(add32(m1(p[4]), m1(p[5])), add32(m1(p[6]), m1(p[7]))),
        )
    }
}

/// The `ng` groups of `un` (its scales; each group's exact half sums from
/// `sums(g, its 32 activations' address, their vector)`, row `r` in lane `r`) times one
/// token's activation groups (`xq`: `32 * ng` values, `xd`: `ng` scales, `xs`: their
/// `ng` sums, which types with one scale per 32 take as `bsum`, and with `TAB` their
/// `ng` [`Tok`] entries, which then give the bias corrections and offset sums; without,
/// the per-16 types sum the halves here), added to `acc` (row `r` in lane `r`) in the
/// group order (the per-16 types: `ng` is a whole block, its sums added at its end,
/// [`half_end`]). Prefill takes `TAB` (AVX2 Q6_K pp128 +20%); decode does not (the
/// table's loads measured 8% slower there: AVX2 Q6_K tg32 12.0 -> 11.1 t/s).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_unit<const T: u8, const TAB: bool, const UN: bool, const SP: bool>(
    un: &Unit,
    sums: impl Fn(usize, *const i8, __m256i) -> (__m256i, __m256i),
    ng: usize,
    xq: *const i8,
    xd: *const f32,
    (xs, xt): (*const i32, *const Tok),
    sp: *const u8,
    acc: __m256,
) -> __m256 {
    let need_bsum = offset(T) || bias(T) != 0;
    let zf = _mm256_setzero_ps();
    // A macro, not a closure: taking and returning the accumulators (`acc` and a block's
    // sums), the closure was left out of line (Q6_K decode at 68% of the speed in L2).
    // Expanded inside `unsafe` (it reads group `g < ng` of the caller's `xq`, `xd`, `xs`,
    // and with `TAB` `xt`).
    macro_rules! step {
        ($g:expr, $st:expr) => {{
            let (g, st): (usize, (__m256, (__m256, __m256))) = ($g, $st);
            spread::<T, UN, SP>(sp, g);
            let (x, dx) = (_mm256_loadu_si256(xq.add(GROUP * g) as *const __m256i), _mm256_set1_ps(*xd.add(g)));
            let (i0, i1) = sums(g, xq.wrapping_add(GROUP * g), x);
            if halves(T) {
                let bp = if TAB { _mm256_set1_epi32((*xt.add(g)).bp) } else { half_pairs(x) };
                (st.0, half_fma::<T>(un, g, dx, (i0, i1), bp, st.1))
            } else {
                // The integer sums with their bias corrections, and the group's activation
                // sum as f32 (for the offset).
                let (is0, is1, f) = if TAB {
                    let tk = &*xt.add(g);
                    let i0 = if bias(T) != 0 { _mm256_add_epi32(i0, _mm256_set1_epi32(tk.nb[0])) } else { i0 };
                    (i0, i1, _mm256_set1_ps(tk.bf))
                } else {
                    let bs = if need_bsum { _mm256_set1_epi32(*xs.add(g)) } else { _mm256_setzero_si256() };
                    let i0 = if bias(T) != 0 { _mm256_sub_epi32(i0, times_bias::<T>(bs)) } else { i0 };
                    (i0, i1, if offset(T) { _mm256_mul_ps(dx, _mm256_cvtepi32_ps(bs)) } else { zf })
                };
                (group_fma::<T>(un, g, dx, (is0, is1), f, st.0), st.1)
            }
        }};
    }
    // `acc` and, over a block of a per-16 type, its sums `(u, m)` ([`half_fma`]): their
    // units are whole blocks.
    debug_assert!(!halves(T) || ng == U);
    let mut st = (acc, (zf, zf));
    if UN && (halves(T) || T == T_IQ4_XS) && ng == U {
        // A whole unit with constant group indices (shift counts, field offsets): left to
        // the optimizer, the AVX2 Q6_K decode's loop was not unrolled once its float steps
        // shrank, and ran at 58% of the speed in L2. IQ4_XS too (Zen 3, `gq_decode_bench`
        // over 1 MiB, in L3: 14.5-15.4 -> 16.8-17.5 GB/s; TinyLlama tg32 1 thread +7-17%).
        // Not Q4_K and Q5_K (their pairs of groups: [`nib_unit`]): Q5_K's decode unrolled
        // this way ran at 70% (`gq_decode_bench` in L2, 23.3-24.0 -> 16.3-16.7 GB/s).
        unroll8!(g => {
            // SAFETY: group `g < ng` of the caller's activations, scales, sums and entries.
            st = unsafe { step!(g, st) };
        });
    } else {
        for g in 0..ng {
            // SAFETY: as above.
            st = unsafe { step!(g, st) };
        }
    }
    if halves(T) {
        half_end::<T>(un, st.0, st.1)
    } else {
        st.0
    }
}

/// One group's fused multiply-adds in the group order, types with one scale per 32:
/// `acc` plus its integer half sums `is` (bias corrections included), added, times the
/// token's scale `dx` and the rows' scales of group `g` of `un`, then the offsets times
/// `f`, the group's activation sum times `dx` (as f32: [`Tok`]'s `bf`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn group_fma<const T: u8>(
    un: &Unit,
    g: usize,
    dx: __m256,
    (is0, is1): (__m256i, __m256i),
    f: __m256,
    mut acc: __m256,
) -> __m256 {
    debug_assert!(!halves(T));
    let i = _mm256_add_epi32(is0, is1);
    acc = _mm256_fmadd_ps(_mm256_mul_ps(dx, un.s[0][g]), _mm256_cvtepi32_ps(i), acc);
    if offset(T) {
        acc = _mm256_fmadd_ps(un.o[0][g], f, acc);
    }
    acc
}

/// One group of a [`halves`] type in the group order, added to the block's sums `(u, m)`
/// of one token (row `r` in lane `r`; [`half_end`] adds them to the token's accumulator):
/// `(w0, w1)` the rows' half sums of the unsigned integers weighed by their integer scales
/// (`k_h * (isum_h + bias * bsum_h)`, [`Unit`]'s `k`), `bp` the token's half sums as an
/// i16 pair ([`Tok`]'s `bp`). One `madd` of `bp` against `un.k[2]` gives the bias
/// corrections `bias * (k_0 bsum_0 + k_1 bsum_1)`, or Q2_K's `m_0 bsum_0 + m_1 bsum_1`;
/// then `u = fma(dx, is, u)` and (Q2_K) `m = fma(dx, msum, m)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn half_fma<const T: u8>(
    un: &Unit,
    g: usize,
    dx: __m256,
    (w0, w1): (__m256i, __m256i),
    bp: __m256i,
    (mut u, mut m): (__m256, __m256),
) -> (__m256, __m256) {
    debug_assert!(halves(T));
    let c = _mm256_madd_epi16(un.k[2][g], bp);
    let is = _mm256_add_epi32(w0, w1);
    let is = if bias(T) != 0 { _mm256_sub_epi32(is, c) } else { is };
    u = _mm256_fmadd_ps(dx, _mm256_cvtepi32_ps(is), u);
    if offset(T) {
        m = _mm256_fmadd_ps(dx, _mm256_cvtepi32_ps(c), m);
    }
    (u, m)
}

/// The end of a block of a [`halves`] type: its sums `(u, m)` ([`half_fma`]) added to the
/// token's `acc`: `acc = fma(d, u, acc)`, then (Q2_K) `acc = fma(-dmin, m, acc)` ([`Unit`]'s
/// `d`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn half_end<const T: u8>(un: &Unit, acc: __m256, (u, m): (__m256, __m256)) -> __m256 {
    let acc = _mm256_fmadd_ps(un.d[0], u, acc);
    if offset(T) {
        _mm256_fmadd_ps(un.d[1], m, acc)
    } else {
        acc
    }
}

/// The two half sums of a group's 32 activations `x` as an i16 pair in every dword
/// (`bsum_0` low, `bsum_1` high), as [`Tok`]'s `bp`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn half_pairs(x: __m256i) -> __m256i {
    let xs = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), x), _mm256_set1_epi16(1));
    // Each 128-bit half's sum in all its dwords.
    let s = _mm256_hadd_epi32(xs, xs);
    let s = _mm256_hadd_epi32(s, s);
    let (b0, b1) = (_mm256_permute2x128_si256::<0x00>(s, s), _mm256_permute2x128_si256::<0x11>(s, s));
    _mm256_blend_epi16::<0xAA>(b0, _mm256_slli_epi32::<16>(b1))
}

/// A [`halves`] type's half sums (i32, row `r` in lane `r`, as [`row_sums`] gives them)
/// weighed by the rows' integer scales of group `g` (the high half of each pair, as
/// [`lane_sums`] weighs its own); other types' as they are.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn weigh<const T: u8>(un: &Unit, g: usize, (i0, i1): (__m256i, __m256i)) -> (__m256i, __m256i) {
    if halves(T) {
        let k = |h: usize| _mm256_srai_epi32::<16>(un.k[h][g]);
        (_mm256_mullo_epi32(i0, k(0)), _mm256_mullo_epi32(i1, k(1)))
    } else {
        (i0, i1)
    }
}
