//! AVX-512 (F/BW/VL + VNNI) kernels for the group-quantized types, in the group
//! order of the parent module bit for bit.
//!
//! Rows are taken 16 at a time, one f32 lane per row, so each row's chain of fused
//! multiply-adds runs in its own lane, in its own order. Per group, the 32 weights
//! of two rows are unpacked into one 512-bit vector of unsigned bytes (row A in the
//! low 256 bits, row B in the high; element `j` at byte `j`): nibble masks and
//! shifts, high bits merged from a byte mask (`vptestmb`, masked byte adds), IQ4
//! levels through `vpshufb`. Signed weights are biased to unsigned (`q + bias`, the
//! per-type [`bias`]) so that `vpdpbusd` against the activations' bytes gives exact
//! sums, and `bias * bsum` is subtracted afterwards (exact in i32). Eight such
//! products (16 rows) are reduced by a fixed unpack/add tree and one shuffle to the
//! per-row half sums `isum_0`, `isum_1`, one lane per row in the lane order [`LANE`]
//! (for a tile of several tokens the unpacked weights are instead transposed once
//! per group, dword `m` of every row in vector `m`, and each token's `vpdpbusd`s
//! against broadcast activation dwords sum every row in its lane: no reduction per
//! token, 20-35% faster prefill than reducing per token, measured). The scales and offsets of 16
//! rows are formed in lanes from gathered block bytes with exactly the f32
//! operations `quant::groups::unpack` uses (f16 widening is exact; `d * sc`,
//! `-(dmin * m)`), then the group's multiply-adds run as `accumulate` runs them; the
//! types with a scale per 16 take their integer scales instead (as f32, whose products
//! with the exact half sums, and their sum, are exact integers) into the block's sums,
//! and the block's `d` (and `-dmin`) at its end, as `accumulate_block` does.
//!
//! Decode (`t == 1`) and prefill share [`tile`]: each group of 16 rows is unpacked
//! once for up to [`MAXC`] tokens ([`MAXC2`] for two tiles); tokens come in chunks that keep the activations
//! in the L2 cache (`token_chunk`). Rows past the range's end repeat its last row
//! (their lanes are computed and dropped), so every load stays inside `w`.
//!
//! Prefill over transposed tiles takes two tiles (32 rows) at a time ([`tile2`]): each
//! activation dword is loaded once for 2 products. With one tile the loop was bound by
//! its loads, not its arithmetic: 8 activation broadcasts + bias, scale and accumulator
//! loads per token and group ran at about 1.5 loads a cycle on the Intel Xeon VM, about
//! 10 cycles per 8 `vpdpbusd` where the ports take 2 a cycle (measured in a loop of the
//! kernel's shape). `gq_bench` packed prefill, Gmac/s, one tile -> two: Q4_K 140-150 ->
//! 170-182, Q5_K 135-144 -> 162-169, Q6_K 116-128 -> 137-145, Q2_K 107-117 -> 124-135,
//! IQ4_XS 156-176 -> 191-200. Types without a bias load none (`nb`), and the products
//! read their activation dword themselves (`dpbusd512_bcast`, one fused micro-op) where
//! a single tile is computed.

use crate::backend::cpu::isa::{dpbusd512 as dpbusd, dpbusd512_bcast as dpbusd_bcast, token_chunk, QAct};
use crate::quant::groups::{GROUP, IQ4_LEVELS};
use crate::quant::DType;
use std::arch::x86_64::*;

/// Rows per tile (one f32 lane each).
const R: usize = 16;
/// Tokens per tile (one accumulator vector each).
const MAXC: usize = 16;
/// Tokens per pair of tiles ([`tile2`]; accumulators on the stack).
const MAXC2: usize = 32;
/// Software prefetch distance, bytes ahead in each of the 16 row streams. Measured
/// (decode over 600 MB of Q4_1, Q4_K, Q6_K, past the L3 cache): none, 384, 768 and
/// 1536 bytes; 384 best for all three (up to 18% over none).
const PF: usize = 384;
/// Bytes of a row covered by one round of prefetches (whole blocks): small blocks
/// are prefetched a few at a time, so each line is asked for once.
const PF_SPAN: usize = 256;
/// Packed decode's prefetch distance into L2 (`prefetcht1`), bytes ahead in the matrix's
/// one stream (tiles follow each other), by the CPU's [`Prefetch`]; 0: none.
/// - `L2` (AMD, Zen 4): 8 KiB, IQ4_XS none. Measured (`gq_decode_bench`, 128 MiB, GB/s,
///   none -> 16 KiB): Q4_K 18.5 -> 26-27, Q5_K 16 -> 22-23.5, Q6_K 24 -> 24.5-26.5, Q3_K
///   11-12 -> 15, Q5_1 11.5 -> 17.5, IQ4_NL 15.5 -> 18, Q2_K, Q4_1 and Q5_0 the same; 8-24
///   KiB alike, 4 KiB slower than none. TinyLlama tg32 (interleaved, 1 / 2 threads) chose
///   8 KiB, which 2 threads take better than 16: docs/BENCHMARKS.md. IQ4_XS slower with
///   them there: 37-39 -> 32 t/s, 1 thread.
/// - `L1` (Intel): 4 KiB, every type (the hardware prefetchers alone fell behind this
///   kernel's loads as on Zen 4). Measured on the Intel Xeon VM (`gq_decode_bench`, 128 MiB,
///   GB/s, none -> 2 / 3 / 4 / 6 / 8 / 16 KiB): Q4_K 12.7 -> 15.4-16.0 / 16.7-17.1 / 15.8-18.0 /
///   16.5-18.0 / 17.1 / 16.8, Q5_K 10.9 -> 16.2 at 4 KiB, Q6_K 11.7 -> 14.0-15.5, Q3_K 8.7 ->
///   11.3-11.7, Q2_K 8.6 -> 11.4-11.9, IQ4_XS 10.4 -> 17.0-17.3; TinyLlama tg64, 1 thread:
///   docs/BENCHMARKS.md (2026-12-05, second section). That VM's L3 is 480 MiB, so those
///   128 MiB figures were partly L3's; over 1 GiB the next block's lines into L1 as well
///   paid on every type (GB/s, this alone -> with it): Q4_K 13.8-14.1 -> 15.9-16.1, Q5_K
///   13.4-13.9 -> 15.8-16.1, Q6_K 13.2 -> 15.5-15.7, Q3_K 11 -> 12-12.3, Q2_K 11 -> 12-12.6,
///   IQ4_XS 13.3-13.7 -> 16.4-16.6, Q4_1 12.6 -> 15.5, Q5_0 12 -> 15, Q5_1 12.2-12.6 ->
///   15.5, IQ4_NL 12.3-12.5 -> 14.7; 3 KiB instead of 4 alike, 2 or 8 KiB alone slower.
const fn pf_l2(pf: Prefetch, k: u8) -> usize {
    match pf {
        Prefetch::Off => 0,
        Prefetch::L1 | Prefetch::Near => 4096,
        Prefetch::L2 => {
            if k == T_IQ4_XS {
                0
            } else {
                8192
            }
        }
    }
}

use super::tag::*;
use super::{Src, Tok};
use crate::backend::cpu::isa::{part_lines, prefetch, prefetch_line, Prefetch};

/// What is added to each weight integer to make it an unsigned byte.
const fn bias(k: u8) -> i32 {
    match k {
        T_Q5_0 => 16,
        T_IQ4_NL | T_IQ4_XS => 128,
        T_Q3_K => 4,
        T_Q6_K => 32,
        _ => 0,
    }
}

const fn halves(k: u8) -> bool {
    matches!(k, T_Q2_K | T_Q3_K | T_Q6_K)
}

const fn offset(k: u8) -> bool {
    matches!(k, T_Q4_1 | T_Q5_1 | T_Q2_K | T_Q4_K | T_Q5_K)
}

/// The `(halves, bias)` of this kernel set's [`Tok`] table for `dt`.
pub(super) fn tok_kind(dt: DType) -> (bool, i32) {
    let k = super::tag::of(dt);
    (halves(k), bias(k))
}

/// The row of each f32 lane (the *lane order*): what the reduction tree ([`reduce`])
/// and the transpose ([`transpose`]) give without a final permute. Scales are
/// gathered, and results stored, in this order.
pub(super) const LANE: [usize; R] = [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15];

/// IQ4 levels biased by 128 (as unsigned bytes), repeated in each 128-bit lane.
const fn iq4_table() -> [u8; 64] {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = (IQ4_LEVELS[i % 16] as i32 + 128) as u8;
        i += 1;
    }
    t
}
const IQ4_TABLE: [u8; 64] = iq4_table();

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn h16lo(x: __m512i) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(x))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn h16hi(x: __m512i) -> __m512 {
    h16lo(_mm512_srli_epi32::<16>(x))
}

/// `-x` (the sign flipped, as f32 negation).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn neg(x: __m512) -> __m512 {
    _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(i32::MIN)))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn srl32(x: __m512i, n: usize) -> __m512i {
    _mm512_srl_epi32(x, _mm_cvtsi32_si128(n as i32))
}

/// Byte `k` of the gathered dwords `raw` (byte `4i + j` is byte `j` of `raw[i]`), per lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn byte(raw: &[__m512i], k: usize) -> __m512i {
    _mm512_and_si512(srl32(raw[k / 4], 8 * (k % 4)), _mm512_set1_epi32(0xFF))
}

/// The scales and offsets `[s_0, s_1, o_0, o_1]` of group `g` of the current blocks of
/// 16 rows (lanes), from their gathered dwords, formed exactly as `unpack` forms them;
/// for the types with a scale per 16 ([`halves`]) the integer scales `k_0`, `k_1`
/// (`quant::groups::half_scales`) as f32 instead and Q2_K's mins as i16 pairs `(m_0,
/// m_1)` (as bits), the block's scales being [`block_scales`]'.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn scales<const K: u8>(raw: &[__m512i; 5], g: usize) -> [__m512; 4] {
    let z = _mm512_setzero_ps();
    let cvt = _mm512_cvtepi32_ps;
    let m15 = _mm512_set1_epi32(15);
    match K {
        T_Q4_1 | T_Q5_1 => {
            let (d, m) = (h16lo(raw[0]), h16hi(raw[0]));
            [d, d, m, m]
        }
        T_Q5_0 | T_IQ4_NL => {
            let d = h16lo(raw[0]);
            [d, d, z, z]
        }
        T_Q2_K => {
            let (a, c) = (byte(raw, 2 * g), byte(raw, 2 * g + 1));
            // The mins as the i16 pair `(m_0, m_1)` ([`group_fma`]'s `madd`).
            let m = _mm512_or_si512(_mm512_srli_epi32::<4>(a), _mm512_slli_epi32::<16>(_mm512_srli_epi32::<4>(c)));
            [cvt(_mm512_and_si512(a, m15)), cvt(_mm512_and_si512(c, m15)), _mm512_castsi512_ps(m), z]
        }
        T_Q3_K => {
            let sc = |i: usize| {
                let lo =
                    if i < 8 { _mm512_and_si512(byte(raw, i), m15) } else { _mm512_srli_epi32::<4>(byte(raw, i - 8)) };
                let hi = _mm512_and_si512(srl32(byte(raw, 8 + i % 4), 2 * (i / 4)), _mm512_set1_epi32(3));
                cvt(_mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32::<4>(hi)), _mm512_set1_epi32(32)))
            };
            [sc(2 * g), sc(2 * g + 1), z, z]
        }
        T_Q4_K | T_Q5_K => {
            let (d, dmin) = (h16lo(raw[0]), h16hi(raw[0]));
            let s = |k: usize| byte(&raw[1..4], k);
            let m63 = _mm512_set1_epi32(63);
            let m30 = _mm512_set1_epi32(0x30);
            let (sc, m) = if g < 4 {
                (_mm512_and_si512(s(g), m63), _mm512_and_si512(s(4 + g), m63))
            } else {
                (
                    _mm512_or_si512(
                        _mm512_and_si512(s(4 + g), m15),
                        _mm512_and_si512(_mm512_srli_epi32::<2>(s(g - 4)), m30),
                    ),
                    _mm512_or_si512(
                        _mm512_srli_epi32::<4>(s(4 + g)),
                        _mm512_and_si512(_mm512_srli_epi32::<2>(s(g)), m30),
                    ),
                )
            };
            let o = neg(_mm512_mul_ps(dmin, cvt(m)));
            let s = _mm512_mul_ps(d, cvt(sc));
            [s, s, o, o]
        }
        T_Q6_K => {
            // Sign-extended byte i: shifted to the top, then arithmetically back.
            let sc = |i: usize| {
                let x = _mm512_sll_epi32(raw[i / 4], _mm_cvtsi32_si128((24 - 8 * (i % 4)) as i32));
                cvt(_mm512_srai_epi32::<24>(x))
            };
            [sc(2 * g), sc(2 * g + 1), z, z]
        }
        _ => {
            // IQ4_XS
            let d = h16lo(raw[0]);
            let lo = _mm512_and_si512(srl32(raw[1], 4 * g), m15);
            let hi = _mm512_and_si512(srl32(raw[0], 16 + 2 * g), _mm512_set1_epi32(3));
            let v = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32::<4>(hi)), _mm512_set1_epi32(32));
            let s = _mm512_mul_ps(d, cvt(v));
            [s, s, z, z]
        }
    }
}

/// The block's `[d, -dmin]` (Q2_K; `[d, 0]` Q3_K and Q6_K) of the types with a scale per
/// 16, from the gathered dwords as [`scales`] takes them; zeros for the others.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn block_scales<const K: u8>(raw: &[__m512i; 5]) -> [__m512; 2] {
    let z = _mm512_setzero_ps();
    match K {
        T_Q2_K => [h16lo(raw[4]), neg(h16hi(raw[4]))],
        T_Q3_K => [h16hi(raw[3]), z],
        T_Q6_K => [h16hi(raw[4]), z],
        _ => [z, z],
    }
}

/// 32 bytes at `pa` (low half) and at `pb` (high half).
///
/// # Safety
/// Both ranges are readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn ld32x2(pa: *const u8, pb: *const u8) -> __m512i {
    // SAFETY: the caller guarantees 32 readable bytes at each pointer.
    unsafe {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_loadu_si256(pa as *const __m256i)),
            _mm256_loadu_si256(pb as *const __m256i),
        )
    }
}

/// The 32 nibbles of 16 bytes at `pa` (low nibbles, then high) and at `pb`.
///
/// # Safety
/// Both ranges of 16 bytes are readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn nib16x2(pa: *const u8, pb: *const u8) -> __m512i {
    // SAFETY: the caller guarantees 16 readable bytes at each pointer.
    let (a, b) = unsafe { (_mm_loadu_si128(pa as *const __m128i), _mm_loadu_si128(pb as *const __m128i)) };
    let v =
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_broadcastsi128_si256(a)), _mm256_broadcastsi128_si256(b));
    let sh = _mm512_set_epi64(
        0x0004_0004_0004_0004,
        0x0004_0004_0004_0004,
        0,
        0,
        0x0004_0004_0004_0004,
        0x0004_0004_0004_0004,
        0,
        0,
    );
    _mm512_and_si512(_mm512_srlv_epi16(v, sh), _mm512_set1_epi8(0x0F))
}

/// Group `g` of the blocks at `pa` and `pb` (two rows) as biased unsigned bytes
/// (`q + bias(K)`), row A's 32 in the low half.
///
/// # Safety
/// `pa` and `pb` point at whole blocks of type `K`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn unpack2<const K: u8>(pa: *const u8, pb: *const u8, g: usize) -> __m512i {
    let m4 = _mm512_set1_epi8(0x0F);
    let tbl = || _mm512_loadu_si512(IQ4_TABLE.as_ptr() as *const __m512i);
    let qh2 = |o: usize| {
        // SAFETY: the high-bit words lie inside the blocks (caller).
        let (a, b) =
            unsafe { ((pa.add(o) as *const u32).read_unaligned(), (pb.add(o) as *const u32).read_unaligned()) };
        a as u64 | (b as u64) << 32
    };
    // SAFETY: every offset read below is inside a block of type K (the layouts of
    // `quant::groups::unpack`); the caller guarantees whole blocks.
    unsafe {
        match K {
            T_Q4_1 => nib16x2(pa.add(4), pb.add(4)),
            T_IQ4_NL => _mm512_shuffle_epi8(tbl(), nib16x2(pa.add(2), pb.add(2))),
            T_Q5_0 | T_Q5_1 => {
                let o = if K == T_Q5_1 { 4 } else { 2 };
                let q = nib16x2(pa.add(o + 4), pb.add(o + 4));
                _mm512_mask_add_epi8(q, qh2(o), q, _mm512_set1_epi8(16))
            }
            T_Q4_K | T_Q5_K => {
                let o = if K == T_Q4_K { 16 } else { 48 } + (g / 2) * 32;
                let v = ld32x2(pa.add(o), pb.add(o));
                let q = _mm512_and_si512(if g % 2 == 1 { _mm512_srli_epi16::<4>(v) } else { v }, m4);
                if K == T_Q5_K {
                    let hb = ld32x2(pa.add(16), pb.add(16));
                    let m = _mm512_test_epi8_mask(hb, _mm512_set1_epi8((1u8 << g) as i8));
                    _mm512_mask_add_epi8(q, m, q, _mm512_set1_epi8(16))
                } else {
                    q
                }
            }
            T_Q2_K | T_Q3_K => {
                let (h, sh) = (g / 4, 2 * (g % 4));
                let o = if K == T_Q2_K { 16 } else { 32 } + h * 32;
                let v = ld32x2(pa.add(o), pb.add(o));
                let q = _mm512_and_si512(_mm512_srl_epi16(v, _mm_cvtsi32_si128(sh as i32)), _mm512_set1_epi8(3));
                if K == T_Q3_K {
                    let hm = ld32x2(pa, pb);
                    let m = _mm512_test_epi8_mask(hm, _mm512_set1_epi8((1u8 << g) as i8));
                    _mm512_mask_add_epi8(q, m, q, _mm512_set1_epi8(4))
                } else {
                    q
                }
            }
            T_Q6_K => {
                let (h, k) = (g / 4, g % 4);
                let ql = ld32x2(pa.add(h * 64 + (k % 2) * 32), pb.add(h * 64 + (k % 2) * 32));
                let lo = _mm512_and_si512(_mm512_srl_epi16(ql, _mm_cvtsi32_si128(4 * (k / 2) as i32)), m4);
                let qh = ld32x2(pa.add(128 + h * 32), pb.add(128 + h * 32));
                let hi = _mm512_and_si512(_mm512_srl_epi16(qh, _mm_cvtsi32_si128(2 * k as i32)), _mm512_set1_epi8(3));
                _mm512_or_si512(lo, _mm512_slli_epi16::<4>(hi))
            }
            _ => _mm512_shuffle_epi8(tbl(), nib16x2(pa.add(8 + 16 * g), pb.add(8 + 16 * g))), // T_IQ4_XS
        }
    }
}

/// The per-row half sums of eight `vpdpbusd` results: `d[p]` holds rows `2p`
/// (lanes 0-7) and `2p + 1` (lanes 8-15), four lanes per half. Returns
/// `(isum_0, isum_1)` in the lane order [`LANE`] (a fixed tree: the sums are exact).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn reduce(d: &[__m512i; 8]) -> (__m512i, __m512i) {
    let e = |a, b| _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    let f = |a, b| _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    // f0's 128-bit lanes: rows 0,2,4,6 half 0; the same half 1; rows 1,3,5,7 half 0; half 1.
    let f0 = f(e(d[0], d[1]), e(d[2], d[3]));
    let f1 = f(e(d[4], d[5]), e(d[6], d[7]));
    (_mm512_shuffle_i32x4::<0x88>(f0, f1), _mm512_shuffle_i32x4::<0xDD>(f0, f1))
}

/// The unpacked weights `w` (as [`reduce`] takes them: `w[p]` rows `2p`, `2p + 1`)
/// transposed to `t[m]`: dword `m` (bytes `4m..4m + 4`) of each row, rows in the
/// lane order [`LANE`], so that `vpdpbusd` against a broadcast activation dword
/// sums each row in its own lane (prefill: done once per group for a tile of tokens).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn transpose(w: &[__m512i; 8]) -> [__m512i; 8] {
    // Per 128-bit lane, a 4 x 4 dword transpose of 4 vectors: x[k] lane L holds dword k
    // of lane L of w[0..4] (lane 0: rows 0,2,4,6 dwords 0-3; 1: dwords 4-7; 2, 3: odd rows).
    let t4 = |w0, w1, w2, w3| {
        let (a, b) = (_mm512_unpacklo_epi32(w0, w1), _mm512_unpackhi_epi32(w0, w1));
        let (c, d) = (_mm512_unpacklo_epi32(w2, w3), _mm512_unpackhi_epi32(w2, w3));
        [
            _mm512_unpacklo_epi64(a, c),
            _mm512_unpackhi_epi64(a, c),
            _mm512_unpacklo_epi64(b, d),
            _mm512_unpackhi_epi64(b, d),
        ]
    };
    let x = t4(w[0], w[1], w[2], w[3]);
    let y = t4(w[4], w[5], w[6], w[7]);
    let mut t = [_mm512_setzero_si512(); 8];
    for k in 0..4 {
        t[k] = _mm512_shuffle_i32x4::<0x88>(x[k], y[k]);
        t[4 + k] = _mm512_shuffle_i32x4::<0xDD>(x[k], y[k]);
    }
    t
}

/// The bias corrections that start a token's integer half sums (`tb.nb`, broadcast):
/// types without a bias load none, and without halves `nb[1]` is 0.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn bias_starts<const K: u8>(tb: &Tok) -> (__m512i, __m512i) {
    let z = _mm512_setzero_si512();
    let nb0 = if bias(K) == 0 { z } else { _mm512_set1_epi32(tb.nb[0]) };
    let nb1 = if bias(K) == 0 || !halves(K) { z } else { _mm512_set1_epi32(tb.nb[1]) };
    (nb0, nb1)
}

/// One token's accumulators for a tile: `acc` and, over a block of a [`halves`] type, its
/// weighed sums `u` and (Q2_K) its mins' sums `m`.
type Acc = (__m512, __m512, __m512);

/// One group's fused multiply-adds for one token, in the group order: the group's
/// integer half sums `is0`, `is1` (bias corrections included), the token's `dx`, the
/// rows' scales and offsets `so` (`[s_0, s_1, o_0, o_1]`) and the token's activation
/// sums times `dx` (`tb.bf`). One scale per 32: `acc = fma(dx*s, is_0 + is_1, acc)`, then
/// the offsets `fma(o, bf, acc)`. The types with a scale per 16 ([`halves`]; `so` their
/// integer scales as f32): `is = k_0 isum_0 + k_1 isum_1` formed in f32 exactly
/// (integers of at most 2^24 in magnitude: each product and the fused sum exact), `u =
/// fma(dx, is, u)`, and for Q2_K `m = fma(dx, m_0 bsum_0 + m_1 bsum_1, m)` (one `madd` of
/// the mins' pair and the token's half sums, `tb.bp`): the AVX2 kernels' integers. The
/// block's scales come at its end ([`block_end`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn group_fma<const K: u8>(
    (mut acc, mut u, mut m): Acc,
    dx: __m512,
    so: [__m512; 4],
    is0: __m512i,
    is1: __m512i,
    tb: &Tok,
) -> Acc {
    let [s0, s1, o0, _] = so;
    let cvt = _mm512_cvtepi32_ps;
    if halves(K) {
        let is = _mm512_fmadd_ps(cvt(is0), s0, _mm512_mul_ps(cvt(is1), s1));
        u = _mm512_fmadd_ps(dx, is, u);
        if offset(K) {
            // Q2_K: `o0` holds the mins as i16 pairs `(m_0, m_1)`, against the half sums' pair.
            let ms = _mm512_madd_epi16(_mm512_castps_si512(o0), _mm512_set1_epi32(tb.bp));
            m = _mm512_fmadd_ps(dx, cvt(ms), m);
        }
    } else {
        let is = _mm512_add_epi32(is0, is1);
        acc = _mm512_fmadd_ps(_mm512_mul_ps(dx, s0), cvt(is), acc);
        if offset(K) {
            acc = _mm512_fmadd_ps(o0, _mm512_set1_ps(tb.bf), acc);
        }
    }
    (acc, u, m)
}

/// The end of a block of a [`halves`] type (`bd` its `[d, -dmin]`): `acc = fma(d, u,
/// acc)`, then (Q2_K) `acc = fma(-dmin, m, acc)`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn block_end<const K: u8>((acc, u, m): Acc, bd: &[__m512; 2]) -> __m512 {
    let acc = _mm512_fmadd_ps(bd[0], u, acc);
    if offset(K) {
        _mm512_fmadd_ps(bd[1], m, acc)
    } else {
        acc
    }
}

/// The scale dwords ([`fields`]) of block `blk` of a transposed tile at `base` (block
/// stride `bs`), as [`scales`] takes them: the dword at `f`, or (`f % 4 == 2`: only its
/// high half is read) the next dword's low half moved up.
///
/// # Safety
/// Block `blk` of the tile is readable (whole, [`super::pack_transposed`]'s layout).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn raw_tr<const K: u8>(base: *const u8, blk: usize, bs: usize) -> [__m512i; 5] {
    let mut raw = [_mm512_setzero_si512(); 5];
    for (i, &f) in fields(K).iter().enumerate() {
        // SAFETY: the slot of every field dword lies inside the block (caller).
        let v = unsafe { _mm512_loadu_si512(base.add(blk * bs + slot(K, f.div_ceil(4)) * 64) as *const __m512i) };
        raw[i] = if f % 4 == 0 { v } else { _mm512_slli_epi32::<16>(v) };
    }
    raw
}

/// Decode's prefetches over a packed tile (both `tile` and `tile2`): with `pf = Some((dist,
/// l1))`, part `gi` of `per` of the lines `dist` bytes past the block at `blk` (`bs` bytes)
/// into L2 and, with `l1`, of the next block into L1 ([`part_lines`]: spread over the
/// block's groups).
#[inline(always)]
fn prefetch_part(blk: *const u8, bs: usize, gi: usize, per: usize, pf: Option<(usize, bool)>) {
    if let Some((dist, l1)) = pf {
        for k in part_lines(bs, gi, per) {
            prefetch_line::<{ _MM_HINT_T1 }>(blk.wrapping_add(dist + 64 * k));
            if l1 {
                prefetch_line::<{ _MM_HINT_T0 }>(blk.wrapping_add(bs + 64 * k));
            }
        }
    }
}

/// Decode's prefetch settings for [`prefetch_part`] (`decode`: one token over a packed
/// tile): the distance into L2 ([`pf_l2`]; none at 0), and on Intel (`Prefetch::L1`) the
/// next block into L1 as well (measured: `pf_l2`).
fn decode_prefetch<const K: u8>(decode: bool) -> Option<(usize, bool)> {
    let dist = pf_l2(prefetch(), K);
    (decode && dist > 0).then(|| (dist, matches!(prefetch(), Prefetch::L1 | Prefetch::Near)))
}

/// Two transposed tiles side by side (tile `j` at `base[j]`, its row `r < valid[j]`'s
/// result for token `c0 + c` to `out[j][r * ld.0 + c * ld.1]`), tokens `c0..c0 + C`, all
/// groups, in the group order of [`tile`] bit for bit. Each activation dword is loaded
/// once for both tiles' products: with the weights of one tile in registers, the
/// broadcast loads (8 per token and group) bound the prefill loop (there the two tiles
/// are neighbours). Decode (C = 1) takes it too, with [`tile`]'s prefetches for both
/// streams: two independent chains of fused multiply-adds instead of one (one tile's
/// chain bounded its decode: perf's samples sat behind the four dependent FMAs of a
/// Q2_K group). `gq_decode_bench` over 1 GiB, GB/s, one tile -> neighbouring pairs: Q4_K
/// 15.6 -> 17.4, Q5_K 16.1 -> 17.1, Q6_K 15.7 -> 17.8, IQ4_XS 16.1 -> 17.5, Q2_K 12.7 ->
/// 13.3, Q3_K 12.5 -> 12.2 (in L2: Q4_K 34.3 -> 37.9, IQ4_XS 32.5 -> 41.3, Q2_K 17.5 ->
/// 18.5). Decode now pairs tile `k` with tile `k + half` (`driver`: two forward streams
/// whose prefetches past a tile's end fall on their own next tile, not on the other
/// stream's): neighbouring pairs -> halves, rows of 2048 / 4096 values: Q4_K 15.5 ->
/// 17.3-17.6 / 16.7-17.3 -> 17.3-18.0, Q5_K 15.1-15.3 -> 17.0-17.1 / 17.0-17.3 ->
/// 16.5-17.4, Q6_K 16.0-16.1 -> 17.1-17.4 / 17.7-17.9 -> 16.4-17.8, IQ4_XS 15.5-15.8 ->
/// 17.0-17.5 / 16.7 -> 17.9-18.0, and Q2_K (one tile before) 11.8-11.9 -> 14.3-14.4 /
/// 11.8-12.0 -> 14.1-14.5, Q3_K 11.7-12.0 -> 13.1 / 12.2-12.5 -> 13.0-13.4.
///
/// # Safety
/// As [`tile`] for transposed tiles, for both tiles.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile2<const K: u8, const C: usize>(
    base: [*const u8; 2],
    bs: usize,
    nblk: usize,
    a: &QAct,
    tok: &[Tok],
    c0: usize,
    out: [*mut f32; 2],
    ld: (usize, usize),
    valid: [usize; 2],
) {
    let groups = nblk * 8;
    let cols = a.cols;
    let z = _mm512_setzero_ps();
    // `acc`, and a block's sums `u`, `m` apart (as one array of triples, AVX-512 Q6_K
    // prefill ran 2% slower: `gq_bench` 202.0-202.1 against 205.5-206.1 Gmac/s).
    let (mut acc, mut u, mut m) = ([[z; C]; 2], [[z; C]; 2], [[z; C]; 2]);
    // Decode (one token): both tiles' streams prefetched as [`tile`] prefetches its one.
    let pf = decode_prefetch::<K>(C == 1);
    // SAFETY: (whole body) as `tile`'s, for the blocks of both tiles; prefetches never fault.
    unsafe {
        for blk in 0..nblk {
            let raw = [raw_tr::<K>(base[0], blk, bs), raw_tr::<K>(base[1], blk, bs)];
            let bd = [block_scales::<K>(&raw[0]), block_scales::<K>(&raw[1])];
            for gi in 0..8 {
                for b in base {
                    prefetch_part(b.wrapping_add(blk * bs), bs, gi, 8, pf);
                }
                let g = blk * 8 + gi;
                let so = [scales::<K>(&raw[0], gi), scales::<K>(&raw[1], gi)];
                let wt = [unpack_t::<K>(base[0].add(blk * bs), gi), unpack_t::<K>(base[1].add(blk * bs), gi)];
                for c in 0..C {
                    let tk = (c0 + c) * groups + g;
                    let x = a.qs.as_ptr().add((c0 + c) * cols + g * GROUP) as *const i32;
                    let tb = tok.get_unchecked(tk);
                    let (nb0, nb1) = bias_starts::<K>(tb);
                    let mut is = [[nb0, nb1]; 2];
                    if halves(K) {
                        // Dword by dword, each broadcast feeding both tiles at once: the 8
                        // broadcasts kept for the two tiles' loops below spilled weights to
                        // the stack once the per-16 types' float steps took a third vector per
                        // tile (`gq_bench` packed prefill, Gmac/s: Q3_K 188 -> 200, Q6_K 191
                        // -> 204; Q4_K 233 -> 225 and IQ4_XS 257 -> 241 this way).
                        for m in 0..4 {
                            let x0 = _mm512_set1_epi32(x.add(m).read_unaligned());
                            let x1 = _mm512_set1_epi32(x.add(4 + m).read_unaligned());
                            for j in 0..2 {
                                is[j][0] = dpbusd(is[j][0], wt[j][m], x0);
                                is[j][1] = dpbusd(is[j][1], wt[j][4 + m], x1);
                            }
                        }
                    } else {
                        let xv: [__m512i; 8] = std::array::from_fn(|m| _mm512_set1_epi32(x.add(m).read_unaligned()));
                        for j in 0..2 {
                            let w = &wt[j];
                            let (mut i0, mut i1) = (dpbusd(nb0, w[0], xv[0]), dpbusd(nb1, w[4], xv[4]));
                            for m in 1..4 {
                                i0 = dpbusd(i0, w[m], xv[m]);
                                i1 = dpbusd(i1, w[4 + m], xv[4 + m]);
                            }
                            is[j] = [i0, i1];
                        }
                    }
                    let dx = _mm512_set1_ps(*a.d.get_unchecked(tk));
                    for j in 0..2 {
                        let st = (acc[j][c], u[j][c], m[j][c]);
                        (acc[j][c], u[j][c], m[j][c]) = group_fma::<K>(st, dx, so[j], is[j][0], is[j][1], tb);
                    }
                }
            }
            if halves(K) {
                for j in 0..2 {
                    for c in 0..C {
                        acc[j][c] = block_end::<K>((acc[j][c], u[j][c], m[j][c]), &bd[j]);
                        (u[j][c], m[j][c]) = (z, z);
                    }
                }
            }
        }
        for (j, acc) in acc.iter().enumerate() {
            for (c, acc) in acc.iter().enumerate() {
                let mut o = [0f32; R];
                _mm512_storeu_ps(o.as_mut_ptr(), *acc);
                for (&r, &v) in LANE.iter().zip(&o) {
                    if r < valid[j] {
                        *out[j].add(r * ld.0 + c * ld.1) = v;
                    }
                }
            }
        }
    }
}

/// 16 rows (`rows[r]`: where row `r`'s first block starts; `offs`: lane `l`'s row
/// `LANE[l]` as a byte offset from `rows[0]`; block `blk` of a row `blk * bs` bytes
/// after its first: `bs == bb` for rows as stored, `16 bb` for a packed tile, which
/// is then one stream, prefetched as one) times tokens `c0..c0 + C`, all groups;
/// row `r < valid`'s result for token `c0 + c` goes to `out[r * ld.0 + c * ld.1]` (`ld`:
/// `(t, 1)` row-major, `(1, ys)` token-major).
///
/// # Safety
/// The CPU has the target features; every row holds `nblk` whole blocks of `bb`
/// bytes of type `K` at stride `bs`; `a` has tokens `c0..c0 + C`; `tok` has
/// `a.t * groups` sums (types with halves); the outputs are writable.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const K: u8, const C: usize, const TR: bool>(
    rows: &[*const u8; R],
    offs: __m512i,
    bb: usize,
    bs: usize,
    nblk: usize,
    a: &QAct,
    tok: &[Tok],
    c0: usize,
    out: *mut f32,
    ld: (usize, usize),
    valid: usize,
) {
    let per = if K >= T_Q2_K { 8 } else { 1 };
    let groups = nblk * per;
    let cols = a.cols;
    let fl = fields(K);
    let z = _mm512_setzero_ps();
    let (mut acc, mut u, mut m) = ([z; C], [z; C], [z; C]);
    // SAFETY: (whole body) the CPU has this function's target features (reached only through
    // `isa()` == Avx512Vnni); block `blk` of each row is at `rows[r] + blk * bs`, inside `w`
    // (caller); gathers read 4 bytes at `fields(K)` offsets, each `+ 4 <= bb`; activation
    // token `c0 + c` group `g` is at `qs[(c0 + c) * cols + 32 g ..+ 32]`, `d`/`tok` at
    // `(c0 + c) * groups + g` (the driver checked `a`'s lengths); prefetches never fault.
    unsafe {
        let base = rows[0];
        let pf_step = (PF_SPAN / bb).max(1);
        let packed = bs != bb;
        // Decode over a packed tile: its lines `pf_l2` bytes ahead into L2, spread over the groups.
        let pf = decode_prefetch::<K>(C == 1 && packed);
        for blk in 0..nblk {
            // A packed tile is one stream, which the hardware prefetchers follow: per-row
            // prefetches into L1 768 to 12,288 bytes ahead measured no faster there (Intel;
            // its decode takes the `pf` prefetches below).
            if !packed && blk % pf_step == 0 {
                // The lines starting in the next `pf_step` blocks, `PF` ahead.
                for &row in rows.iter() {
                    let p0 = row as usize + blk * bb + PF;
                    let mut l = (p0 + 63) & !63;
                    while l < p0 + pf_step * bb {
                        _mm_prefetch::<_MM_HINT_T0>(l as *const i8);
                        l += 64;
                    }
                }
            }
            let raw = if TR {
                raw_tr::<K>(base, blk, bs)
            } else {
                let mut raw = [_mm512_setzero_si512(); 5];
                for (i, &f) in fl.iter().enumerate() {
                    raw[i] = _mm512_i32gather_epi32::<1>(offs, base.add(blk * bs + f) as *const i32);
                }
                raw
            };
            let bd = block_scales::<K>(&raw);
            // The K-quant groups' scales first, each with constant shift counts (formed
            // inside the loop below, which is not unrolled, they took counts from
            // registers: AVX-512 decode in L2, GB/s, Q3_K 16.5 -> 18.0, Q4_K 33.3 -> 34.4,
            // Q5_K 29.4 -> 30.1, Q6_K 31.1 -> 31.6); not Q2_K's four per group (17.4 in
            // the loop, 16.4 first) nor IQ4_XS (36.3, 35.8) nor the small types' one.
            let early = per == 8 && K != T_Q2_K && K != T_IQ4_XS;
            let so: [[__m512; 4]; 8] = if early {
                [
                    scales::<K>(&raw, 0),
                    scales::<K>(&raw, 1),
                    scales::<K>(&raw, 2),
                    scales::<K>(&raw, 3),
                    scales::<K>(&raw, 4),
                    scales::<K>(&raw, 5),
                    scales::<K>(&raw, 6),
                    scales::<K>(&raw, 7),
                ]
            } else {
                [[_mm512_setzero_ps(); 4]; 8]
            };
            for gi in 0..per {
                prefetch_part(base.wrapping_add(blk * bs), bs, gi, per, pf);
                let g = blk * per + gi;
                let [s0, s1, o0, o1] = if early { so[gi] } else { scales::<K>(&raw, gi) };
                // Several tokens: transposed once, then no reduction per token; packed
                // transposed tiles are stored that way.
                let wt = if TR {
                    unpack_t::<K>(base.add(blk * bs), gi)
                } else {
                    let mut wv = [_mm512_setzero_si512(); 8];
                    for (p, v) in wv.iter_mut().enumerate() {
                        *v = unpack2::<K>(rows[2 * p].add(blk * bs), rows[2 * p + 1].add(blk * bs), gi);
                    }
                    if C > 1 {
                        transpose(&wv)
                    } else {
                        wv
                    }
                };
                for c in 0..C {
                    let tk = (c0 + c) * groups + g;
                    let xp = a.qs.as_ptr().add((c0 + c) * cols + g * GROUP);
                    let tb = tok.get_unchecked(tk);
                    // The bias corrections start the integer sums (exact in i32).
                    let (nb0, nb1) = bias_starts::<K>(tb);
                    let (is0, is1) = if C > 1 || TR {
                        // Activation dword `m` at byte `4m`, broadcast by the product itself.
                        let x = xp as *const u8;
                        let i0 = dpbusd_bcast::<0>(nb0, wt[0], x);
                        let i1 = dpbusd_bcast::<16>(nb1, wt[4], x);
                        let i0 = dpbusd_bcast::<4>(i0, wt[1], x);
                        let i1 = dpbusd_bcast::<20>(i1, wt[5], x);
                        let i0 = dpbusd_bcast::<8>(i0, wt[2], x);
                        let i1 = dpbusd_bcast::<24>(i1, wt[6], x);
                        let i0 = dpbusd_bcast::<12>(i0, wt[3], x);
                        let i1 = dpbusd_bcast::<28>(i1, wt[7], x);
                        (i0, i1)
                    } else {
                        let x = _mm512_broadcast_i64x4(_mm256_loadu_si256(xp as *const __m256i));
                        let mut d = [_mm512_setzero_si512(); 8];
                        for (dp, &v) in d.iter_mut().zip(&wt) {
                            *dp = dpbusd(_mm512_setzero_si512(), v, x);
                        }
                        let (i0, i1) = reduce(&d);
                        (_mm512_add_epi32(i0, nb0), _mm512_add_epi32(i1, nb1))
                    };
                    let dx = _mm512_set1_ps(*a.d.get_unchecked(tk));
                    let st = (acc[c], u[c], m[c]);
                    (acc[c], u[c], m[c]) = group_fma::<K>(st, dx, [s0, s1, o0, o1], is0, is1, tb);
                }
            }
            if halves(K) {
                for c in 0..C {
                    acc[c] = block_end::<K>((acc[c], u[c], m[c]), &bd);
                    (u[c], m[c]) = (z, z);
                }
            }
        }
        for (c, acc) in acc.iter().enumerate() {
            let mut o = [0f32; R];
            _mm512_storeu_ps(o.as_mut_ptr(), *acc);
            for (&r, &v) in LANE.iter().zip(&o) {
                if r < valid {
                    *out.add(r * ld.0 + c * ld.1) = v;
                }
            }
        }
    }
}

macro_rules! dispatch {
    ($k:expr, $tr:expr, $ct:expr, $($args:expr),*) => {
        match $ct {
            16 => tile::<{ $k }, 16, $tr>($($args),*),
            12 => tile::<{ $k }, 12, $tr>($($args),*),
            8 => tile::<{ $k }, 8, $tr>($($args),*),
            7 => tile::<{ $k }, 7, $tr>($($args),*),
            6 => tile::<{ $k }, 6, $tr>($($args),*),
            5 => tile::<{ $k }, 5, $tr>($($args),*),
            4 => tile::<{ $k }, 4, $tr>($($args),*),
            3 => tile::<{ $k }, 3, $tr>($($args),*),
            2 => tile::<{ $k }, 2, $tr>($($args),*),
            _ => tile::<{ $k }, 1, $tr>($($args),*),
        }
    };
}

macro_rules! dispatch2 {
    ($k:expr, $ct:expr, $($args:expr),*) => {
        match $ct {
            32 => tile2::<{ $k }, 32>($($args),*),
            24 => tile2::<{ $k }, 24>($($args),*),
            16 => tile2::<{ $k }, 16>($($args),*),
            12 => tile2::<{ $k }, 12>($($args),*),
            8 => tile2::<{ $k }, 8>($($args),*),
            7 => tile2::<{ $k }, 7>($($args),*),
            6 => tile2::<{ $k }, 6>($($args),*),
            5 => tile2::<{ $k }, 5>($($args),*),
            4 => tile2::<{ $k }, 4>($($args),*),
            3 => tile2::<{ $k }, 3>($($args),*),
            2 => tile2::<{ $k }, 2>($($args),*),
            _ => tile2::<{ $k }, 1>($($args),*),
        }
    };
}

/// Group `g` of a transposed tile's block at `blk` ([`super::pack_transposed`]) unpacked
/// as [`transpose`] leaves [`unpack2`]'s vectors: vector `m` holds dword `m` (values
/// `4m .. 4m + 4`, biased as `unpack2` biases them) of each row in the lane order.
///
/// # Safety
/// `blk` points at a whole transposed block of type `K` (one of [`super::transposable`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn unpack_t<const K: u8>(blk: *const u8, g: usize) -> [__m512i; 8] {
    let m4 = _mm512_set1_epi8(0x0F);
    // Dword `m` of the field at byte `o` (a multiple of 4) of the 16 rows.
    // SAFETY: every field offset below (`quant::groups::unpack`'s layouts) lies in the
    // block, whose vectors are all there (caller).
    let ld = |o: usize, m: usize| unsafe { _mm512_loadu_si512(blk.add(slot(K, o / 4 + m) * 64) as *const __m512i) };
    let srl = |v: __m512i, n: usize| _mm512_srl_epi16(v, _mm_cvtsi32_si128(n as i32));
    std::array::from_fn(|m| match K {
        T_Q4_K | T_Q5_K => {
            let o = if K == T_Q4_K { 16 } else { 48 } + (g / 2) * 32;
            let v = ld(o, m);
            let q = _mm512_and_si512(if g % 2 == 1 { _mm512_srli_epi16::<4>(v) } else { v }, m4);
            if K == T_Q5_K {
                let mk = _mm512_test_epi8_mask(ld(16, m), _mm512_set1_epi8((1u8 << g) as i8));
                _mm512_mask_add_epi8(q, mk, q, _mm512_set1_epi8(16))
            } else {
                q
            }
        }
        T_Q2_K | T_Q3_K => {
            let (h, sh) = (g / 4, 2 * (g % 4));
            let o = if K == T_Q2_K { 16 } else { 32 } + h * 32;
            let q = _mm512_and_si512(srl(ld(o, m), sh), _mm512_set1_epi8(3));
            if K == T_Q3_K {
                let mk = _mm512_test_epi8_mask(ld(0, m), _mm512_set1_epi8((1u8 << g) as i8));
                _mm512_mask_add_epi8(q, mk, q, _mm512_set1_epi8(4))
            } else {
                q
            }
        }
        T_Q6_K => {
            let (h, k) = (g / 4, g % 4);
            let lo = _mm512_and_si512(srl(ld(h * 64 + (k % 2) * 32, m), 4 * (k / 2)), m4);
            let hi = _mm512_and_si512(srl(ld(128 + h * 32, m), 2 * k), _mm512_set1_epi8(3));
            _mm512_or_si512(lo, _mm512_slli_epi16::<4>(hi))
        }
        T_IQ4_XS => {
            // Values 0..16 are the low nibbles of the field's 16 bytes, 16..32 the high.
            let v = ld(8 + 16 * g, m % 4);
            let n = _mm512_and_si512(if m < 4 { v } else { _mm512_srli_epi16::<4>(v) }, m4);
            _mm512_shuffle_epi8(_mm512_loadu_si512(IQ4_TABLE.as_ptr() as *const __m512i), n)
        }
        _ => unreachable!("type tag {K} is not packed transposed"),
    })
}

/// All rows and tokens of one type: row `r`'s result for token `c` to `o[r * ld.0 + c * ld.1]`.
///
/// # Safety
/// As [`gemm`] (rows as stored) or [`gemm_packed`] / [`gemm_packed_tm`] (`o` and `ld`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn driver<const K: u8>(
    dt: DType,
    src: Src<'_>,
    nrows: usize,
    a: &QAct,
    pre: Option<&[Tok]>,
    o: *mut f32,
    ld: (usize, usize),
) {
    let (t, cols) = (a.t, a.cols);
    let bb = dt.block_bytes();
    let nblk = cols / dt.block_elems();
    assert_eq!(a.sums.len(), a.d.len());
    let own;
    let tok: &[Tok] = match pre {
        Some(tok) => tok,
        None => {
            own = Tok::table(a, halves(K), bias(K));
            &own
        }
    };
    assert!(tok.len() == a.sums.len());
    let tc = token_chunk(t, cols);
    // SAFETY: the CPU has this function's target features (reached only through `isa()`);
    // rows as stored: the rows `i + r` (clamped to `nrows - 1`) are inside `w`
    // (`w.len() >= nrows * row_bytes`, checked by `gq::gemm`); packed: tile `i / 16` (all 16
    // rows, zero past the matrix) is inside `tiles` (checked by `gq::gemm_packed`); tokens
    // `c..c + ct <= t` inside `a`, outputs `(i + r) * ld.0 + c * ld.1` for `r < valid` writable
    // (the callers' contract).
    unsafe {
        if let (1, Src::Transposed { tiles, tile_bytes }) = (t, src) {
            if nrows > R {
                // Decode: two streams through memory, the first and the second half of
                // the tiles, tile `k` beside tile `k + half` ([`tile2`]).
                let bs = super::transposed_block_bytes(bb, 64);
                let ntiles = nrows.div_ceil(R);
                let half = ntiles.div_ceil(2);
                for k in 0..half {
                    let b = tiles.as_ptr().add(k * tile_bytes);
                    let valid = (nrows - k * R).min(R);
                    if k + half < ntiles {
                        let b2 = [b, tiles.as_ptr().add((k + half) * tile_bytes)];
                        let v2 = [valid, (nrows - (k + half) * R).min(R)];
                        let o2 = [o.add(k * R * ld.0), o.add((k + half) * R * ld.0)];
                        tile2::<K, 1>(b2, bs, nblk, a, tok, 0, o2, ld, v2);
                    } else {
                        let offs = _mm512_setzero_si512();
                        tile::<K, 1, true>(&[b; R], offs, bb, bs, nblk, a, tok, 0, o.add(k * R * ld.0), ld, valid);
                    }
                }
                return;
            }
        }
        let mut t0 = 0;
        while t0 < t {
            let t1 = (t0 + tc).min(t);
            // Prefill over transposed tiles takes them two at a time (`tile2`).
            let tile_bytes = match src {
                Src::Transposed { tile_bytes, .. } => tile_bytes,
                _ => 0,
            };
            let mut i = 0;
            while i < nrows {
                let valid = (nrows - i).min(R);
                let pair = tile_bytes > 0 && i + R < nrows;
                let mut rows = [std::ptr::null(); R];
                let mut off = [0i32; R];
                let tr = matches!(src, Src::Transposed { .. });
                let bs = match src {
                    Src::Transposed { tiles, tile_bytes } => {
                        rows = [tiles.as_ptr().add(i / R * tile_bytes); R];
                        super::transposed_block_bytes(bb, 64)
                    }
                    Src::Rows { w, row_bytes } => {
                        for r in 0..R {
                            rows[r] = w.as_ptr().add((i + r.min(valid - 1)) * row_bytes);
                            // Gathered scales in the lane order.
                            off[r] = (LANE[r].min(valid - 1) * row_bytes) as i32;
                        }
                        bb
                    }
                    Src::Packed { tiles, tile_bytes } => {
                        let base = tiles.as_ptr().add(i / R * tile_bytes);
                        for r in 0..R {
                            rows[r] = base.add(r * bb);
                            off[r] = (LANE[r] * bb) as i32;
                        }
                        R * bb
                    }
                };
                let offs = _mm512_loadu_si512(off.as_ptr() as *const __m512i);
                let mut c = t0;
                while c < t1 {
                    // The tile widths compiled: 16, 12 and 1..=8.
                    let ct = match (t1 - c).min(if tr && pair { MAXC2 } else { MAXC }) {
                        32.. => 32,
                        24..=31 => 24,
                        16..=23 => 16,
                        12..=15 => 12,
                        9..=11 => 8,
                        n => n,
                    };
                    if tr && pair {
                        let b2 = [rows[0], rows[0].add(tile_bytes)];
                        let v2 = [valid, (nrows - i - R).min(R)];
                        let o2 = [o.add(i * ld.0 + c * ld.1), o.add((i + R) * ld.0 + c * ld.1)];
                        dispatch2!(K, ct, b2, bs, nblk, a, tok, c, o2, ld, v2);
                    } else {
                        let oc = o.add(i * ld.0 + c * ld.1);
                        if tr {
                            dispatch!(K, true, ct, &rows, offs, bb, bs, nblk, a, tok, c, oc, ld, valid);
                        } else {
                            dispatch!(K, false, ct, &rows, offs, bb, bs, nblk, a, tok, c, oc, ld, valid);
                        }
                    }
                    c += ct;
                }
                i += if pair { 2 * R } else { R };
            }
            t0 = t1;
        }
    }
}

/// `driver` for type `dt`.
///
/// # Safety
/// As [`driver`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn by_type(
    dt: DType,
    src: Src<'_>,
    nrows: usize,
    a: &QAct,
    pre: Option<&[Tok]>,
    o: *mut f32,
    ld: (usize, usize),
) {
    // SAFETY: the caller's contract is `driver`'s.
    unsafe {
        match dt {
            DType::Q4_1 => driver::<T_Q4_1>(dt, src, nrows, a, pre, o, ld),
            DType::Q5_0 => driver::<T_Q5_0>(dt, src, nrows, a, pre, o, ld),
            DType::Q5_1 => driver::<T_Q5_1>(dt, src, nrows, a, pre, o, ld),
            DType::IQ4_NL => driver::<T_IQ4_NL>(dt, src, nrows, a, pre, o, ld),
            DType::Q2_K => driver::<T_Q2_K>(dt, src, nrows, a, pre, o, ld),
            DType::Q3_K => driver::<T_Q3_K>(dt, src, nrows, a, pre, o, ld),
            DType::Q4_K => driver::<T_Q4_K>(dt, src, nrows, a, pre, o, ld),
            DType::Q5_K => driver::<T_Q5_K>(dt, src, nrows, a, pre, o, ld),
            DType::Q6_K => driver::<T_Q6_K>(dt, src, nrows, a, pre, o, ld),
            DType::IQ4_XS => driver::<T_IQ4_XS>(dt, src, nrows, a, pre, o, ld),
            _ => unreachable!("{dt} is not a grouped type"),
        }
    }
}

/// `gq::gemm` on AVX-512 VNNI: same arguments, same results bit for bit.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL + VNNI, AVX2, FMA and F16C; `gq::gemm`'s assertions
/// hold (whole rows of `dt` in `w`, `a` consistent, `out.len() == nrows * a.t`).
pub(super) unsafe fn gemm(dt: DType, w: &[u8], row_bytes: usize, nrows: usize, a: &QAct, out: &mut [f32]) {
    if nrows == 0 || a.t == 0 {
        return;
    }
    // The gathers address 16 rows by i32 byte offsets: rows too long for that (over
    // 128 MiB each) take the scalar kernels, which compute the same bits.
    if row_bytes.checked_mul(R).is_none_or(|v| v > i32::MAX as usize) {
        return super::gemm(super::Isa::Scalar, dt, w, row_bytes, nrows, a, out);
    }
    // SAFETY: the caller (`gq::gemm`'s `Isa::Avx512Vnni` arm; `isa()` picks that kernel set only
    // on CPUs with AVX-512 F/BW/VL + VNNI, AVX2, FMA, F16C) guarantees the features and
    // the bounds (`gq::gemm`'s assertions).
    unsafe { by_type(dt, Src::Rows { w, row_bytes }, nrows, a, None, out.as_mut_ptr(), (a.t, 1)) }
}

/// The product over packed rows: `src` ([`Src::Packed`] or [`Src::Transposed`]) starts at
/// a tile of 16 rows and holds the `nrows.div_ceil(16)` tiles read, in the layout of
/// [`super::Packed`] for this kernel set.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL + VNNI, AVX2, FMA and F16C; `gq::gemm_packed`'s
/// assertions hold.
pub(super) unsafe fn gemm_packed(dt: DType, src: Src<'_>, nrows: usize, a: &QAct, out: &mut [f32]) {
    if nrows == 0 || a.t == 0 {
        return;
    }
    // SAFETY: as `gemm`; the gather offsets are below `16 * block_bytes` (at most 3,360).
    unsafe { by_type(dt, src, nrows, a, None, out.as_mut_ptr(), (a.t, 1)) }
}

/// [`gemm_packed`] over transposed tiles with row `r`'s result for token `c` at
/// `o[r * ld.0 + c * ld.1]` and the [`Tok`] table given (`gq::gemm_packed_tm`).
///
/// # Safety
/// As [`gemm_packed`]; `tok` is `Tok::table(a, halves(K), bias(K))` ([`tok_kind`]);
/// `o[r * ld.0 + c * ld.1]` is writable for `r < nrows`, `c < a.t`, and nothing else reads
/// or writes those places meanwhile.
pub(super) unsafe fn gemm_packed_tm(
    dt: DType,
    src: Src<'_>,
    nrows: usize,
    a: &QAct,
    tok: &[Tok],
    o: *mut f32,
    ld: (usize, usize),
) {
    if nrows == 0 || a.t == 0 {
        return;
    }
    // SAFETY: as `gemm_packed`, the outputs as the caller guarantees.
    unsafe { by_type(dt, src, nrows, a, Some(tok), o, ld) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::gq::dot_ref;
    use crate::backend::cpu::isa::{detect, Isa};
    use crate::util::XorShift;

    /// Random but valid rows of `dt`: random bytes with every f16 field a small
    /// finite value (so no inf/NaN scale).
    fn random_row(dt: DType, cols: usize, r: &mut XorShift) -> Vec<u8> {
        let n = dt.row_bytes(cols).unwrap();
        let mut row: Vec<u8> = (0..n).map(|_| r.next_u64() as u8).collect();
        let f16_fields: &[usize] = match dt {
            DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
            DType::Q5_0 | DType::IQ4_NL | DType::IQ4_XS => &[0],
            DType::Q2_K => &[80, 82],
            DType::Q3_K => &[108],
            DType::Q6_K => &[208],
            _ => unreachable!(),
        };
        for blk in row.chunks_exact_mut(dt.block_bytes()) {
            for &o in f16_fields {
                // Now and then a zero, a negative or a subnormal scale.
                let v = match r.below(8) {
                    0 => 0.0,
                    1 => 3e-6,
                    _ => r.uniform(-0.05, 0.05),
                };
                blk[o..o + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
            }
        }
        row
    }

    fn check(dt: DType, cols: usize, nrows: usize, t: usize, r: &mut XorShift) {
        let rb = dt.row_bytes(cols).unwrap();
        let w: Vec<u8> = (0..nrows).flat_map(|_| random_row(dt, cols, r)).collect();
        let mut x = r.vec(t * cols, -1.0, 1.0);
        // Some activation blocks of extreme values (full-range i8).
        for v in x.iter_mut().step_by(7) {
            *v *= 30.0;
        }
        let a = QAct::quantize(&x, cols);
        let mut out = vec![f32::NAN; nrows * t];
        // SAFETY: the CPU has AVX-512 F/BW/VL + VNNI (the caller checked `detect()`); the
        // arguments are consistent (as `gq::gemm` asserts).
        unsafe { gemm(dt, &w, rb, nrows, &a, &mut out) };
        let g = cols / GROUP;
        for i in 0..nrows {
            for c in 0..t {
                let want =
                    dot_ref(dt, &w[i * rb..(i + 1) * rb], &a.qs[c * cols..(c + 1) * cols], &a.d[c * g..(c + 1) * g]);
                assert_eq!(
                    out[i * t + c].to_bits(),
                    want.to_bits(),
                    "{dt} cols {cols} nrows {nrows} t {t}: row {i} token {c}: {} vs {want}",
                    out[i * t + c]
                );
            }
        }
    }

    /// Every grouped type, token counts 1, 2, 7, 33 (tiles and their tails), row counts
    /// 1..=9 and past one and two tiles of 16: bit-identical to the scalar group order.
    #[test]
    fn gq_avx512_gemm_equals_the_group_order_reference() {
        if detect() != Isa::Avx512Vnni {
            eprintln!("no AVX-512 VNNI here: skipped");
            return;
        }
        let mut r = XorShift::new(0x5be0_cd19_137e_2179);
        for dt in DType::all().into_iter().filter(|d| d.is_grouped()) {
            let mut colss = vec![256, 1024];
            if dt.block_elems() == GROUP {
                colss.extend([32, 96]);
            }
            for &cols in &colss {
                for t in [1, 2, 7, 33] {
                    for nrows in (1..=9).chain([16, 17, 31, 40]) {
                        check(dt, cols, nrows, t, &mut r);
                    }
                }
            }
        }
    }

    /// Through the dispatching `gq::gemm` (the arm this file adds), against its scalar set.
    #[test]
    fn gq_avx512_dispatch_equals_scalar_gemm() {
        if detect() != Isa::Avx512Vnni {
            return;
        }
        let mut r = XorShift::new(0x1f83_d9ab);
        for dt in DType::all().into_iter().filter(|d| d.is_grouped()) {
            let (cols, nrows, t) = (512, 21, 3);
            let rb = dt.row_bytes(cols).unwrap();
            let w: Vec<u8> = (0..nrows).flat_map(|_| random_row(dt, cols, &mut r)).collect();
            let a = QAct::quantize(&r.vec(t * cols, -2.0, 2.0), cols);
            let (mut o1, mut o2) = (vec![0f32; nrows * t], vec![0f32; nrows * t]);
            crate::backend::cpu::gq::gemm(Isa::Scalar, dt, &w, rb, nrows, &a, &mut o1);
            crate::backend::cpu::gq::gemm(Isa::Avx512Vnni, dt, &w, rb, nrows, &a, &mut o2);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&o1), bits(&o2), "{dt}");
        }
    }
}

#[cfg(test)]
mod speed {
    use super::*;
    use crate::backend::cpu::gq;
    use crate::backend::cpu::isa::{detect, Isa};
    use crate::util::XorShift;

    /// Not a test: `cargo test --release --lib gq_avx512_speed -- --ignored --nocapture`
    /// prints decode and prefill throughput, scalar against these kernels.
    #[test]
    #[ignore]
    fn gq_avx512_speed() {
        if detect() != Isa::Avx512Vnni {
            return;
        }
        let (rows, cols) = (2048usize, 4096usize);
        let mut r = XorShift::new(7);
        for dt in DType::all().into_iter().filter(|d| d.is_grouped()) {
            let rb = dt.row_bytes(cols).unwrap();
            let mut w: Vec<u8> = (0..rows * rb).map(|_| r.next_u64() as u8).collect();
            // Finite scales: zero every f16's exponent top bit.
            for b in w.iter_mut().skip(1).step_by(2) {
                *b &= 0x3F;
            }
            for t in [1usize, 32] {
                let a = QAct::quantize(&r.vec(t * cols, -1.0, 1.0), cols);
                let mut out = vec![0f32; rows * t];
                // Thread CPU time: the machine is shared, wall time is not this thread's.
                let now = || {
                    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                    // SAFETY: `ts` is a valid timespec for clock_gettime to write.
                    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
                    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
                };
                // The fastest of `reps` calls (the least disturbed by the other processes).
                let mut time = |isa: Isa, reps: usize| {
                    gq::gemm(isa, dt, &w, rb, rows, &a, &mut out);
                    (0..reps)
                        .map(|_| {
                            let s = now();
                            gq::gemm(isa, dt, &w, rb, rows, &a, &mut out);
                            now() - s
                        })
                        .fold(f64::INFINITY, f64::min)
                };
                let scalar = std::env::var("GQ_SPEED_SCALAR").is_ok();
                let ts = if scalar { time(Isa::Scalar, 1) } else { f64::NAN };
                let tv = time(Isa::Avx512Vnni, if t == 1 { 40 } else { 10 });
                let gb = (rows * rb) as f64 / 1e9;
                println!(
                    "{dt:>7} t={t:>2}: scalar {:8.3} ms, avx512 {:8.3} ms ({:6.2} GB/s), x{:.1}",
                    ts * 1e3,
                    tv * 1e3,
                    gb / tv,
                    ts / tv
                );
            }
        }
    }
}
