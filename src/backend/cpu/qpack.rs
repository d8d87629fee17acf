//! Q8_0 / Q4_0 weights repacked at load for the AVX-512 VNNI and AVX2 kernels: 16
//! rows interleaved per block, so that one 512-bit VPDPBUSD works on 16 rows at once
//! (AVX2: `vpmaddubsw` on 8, each half of a group in turn; prefill tiles take both
//! halves) and each row's block sum stays in one integer lane until the block is done.
//!
//! This is the "block order" of the quantized dot product (used on AVX-512 VNNI
//! and AVX2 CPUs, for packed and unpacked weights alike, so both give the same bits):
//!
//! ```text
//! acc = 0
//! for each block b:  isum = sum_j w[j] * xq[j]          (exact, i32; Q4_0: w = nibble - 8)
//!                    acc  = fma(f16(d_w) * d_x, isum as f32, acc)
//! ```
//!
//! One rounding per block instead of one per group of 4 (the lane orders of
//! `simd`), and one float multiply-add per 16 rows per block in the kernel.
//!
//! Layout: the matrix is cut into super-groups of 64 rows (4 groups of 16; rows
//! past the matrix's end are zero), each one sequential stream, block by block.
//! Block `b` of a super-group is `4 V` vectors of 64 bytes (Q4_0: V = 4, Q8_0: 8),
//! group `j`'s `V` first at `j * 64 V`, where vector `m` of a group holds, in its
//! 32-bit lane `r`, row `r`'s stored bytes `4m..4m+4` (Q4_0: the nibble pairs as
//! stored, element `4m+i` low and `16+4m+i` high; Q8_0: the i8 values with the
//! sign bit flipped, i.e. `w + 128` as u8); then the 4 groups' 16 f16 scales of the
//! block (32 bytes per group). A block is 1152 bytes (Q4_0) or 2176 (Q8_0), whole
//! lines, so decode reads one stream per 64 rows with its scales in it (a group
//! per stream with the scales after the values reached about 84% of the read
//! bandwidth here, this layout about 100%).

use super::groups::Groups;
use super::isa::{Isa, Prefetch, QAct};
use crate::quant::{f16_bits_to_f32, DType, QK};
use crate::Result;

/// Rows per packed group (one 512-bit vector of i32 lanes).
pub const GROUP: usize = 16;
/// Groups per super-group (the layout's unit, see the module docs).
const SUPER: usize = 4;
/// Rows per super-group: row ranges handed to [`gemm`] start at a multiple.
pub const ALIGN: usize = GROUP * SUPER;
/// Decode under [`Prefetch::L1`] (Intel; Zen 3 not re-measured), both kernel sets: the next block's lines
/// into L1 as each group is read, and group `j`'s quarter of the lines `PF_L2` bytes
/// ahead into L2 (`isa::part_lines`). Measured on the Intel Xeon VM (`qpack_decode_bench`
/// over 1 GiB, past its 480 MiB L3; GB/s, blocks ahead into L1 as before (Q4_0 4, Q8_0 1)
/// -> this): AVX2 Q4_0 12.6-13.0 -> 17.3-17.7, Q8_0 15.8-16.4 -> 17.0-17.3; AVX-512 Q4_0
/// 15.2-15.6 -> 16.9-17.7, Q8_0 16.5-17.0 -> 17.6-18.0; 2.5-3 KiB alike, 2 and 4.5 KiB
/// slower. On the Intel Xeon VM of model 207 (300 MiB L3) farther was faster, 3 KiB -> 8 KiB:
/// `qpack_decode_bench` AVX2 Q4_0 14.5-15.3 -> 17.1-17.4, Q8_0 15.3-15.5 -> 17.4-18.5, AVX-512
/// Q4_0 15.3-15.7 -> 17.2-17.4, Q8_0 17.1-17.2 -> 17.5-18.7 (6 KiB between, 12 KiB alike);
/// TinyLlama tg64, t/s, AVX2 / AVX-512, 1 thread: Q4_0 23.4-23.6 / 25.9-26.1 -> 26.9-29.5 /
/// 27.4-27.7, Q8_0 13.1 / 14.8 -> 15.0 / 15.2; 2 threads: Q4_0 46.2 / 50.8 -> 53.8 / 55.5,
/// Q8_0 25.9 / 27.5 -> 28.2 / 28.2. 8 KiB taken for both machines (not re-measured on the
/// first).
#[cfg(target_arch = "x86_64")]
const PF_L2: usize = 8192;

/// A Q8_0 or Q4_0 matrix in the packed layout (see the module docs).
pub struct Packed {
    groups: Groups,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
}

/// Whether `isa` computes quantized dot products in the block order (and so
/// wants packed weights).
pub fn block_order(isa: Isa) -> bool {
    matches!(isa, Isa::Avx512Vnni | Isa::Avx2)
}

/// Bytes of one group's weight values per block in the packed layout.
fn vals_per_block(dt: DType) -> usize {
    if dt == DType::Q4_0 {
        256
    } else {
        512
    }
}

/// Bytes from one block of a super-group to the next.
fn block_stride(dt: DType) -> usize {
    SUPER * (vals_per_block(dt) + 32)
}

impl Packed {
    /// Repacks `rows` rows (`row_bytes` each, as stored in GGUF) of a Q8_0 or
    /// Q4_0 matrix of `cols` columns, on up to `threads` threads. `name` (the
    /// tensor's) is for the error when the memory cannot be had.
    pub fn new(
        dt: DType,
        w: &[u8],
        row_bytes: usize,
        rows: usize,
        cols: usize,
        name: &str,
        threads: usize,
    ) -> Result<Packed> {
        assert!(matches!(dt, DType::Q8_0 | DType::Q4_0), "only Q8_0 and Q4_0 are packed, not {dt}");
        assert_eq!(dt.row_bytes(cols), Some(row_bytes));
        assert!(w.len() >= rows * row_bytes);
        let nb = cols / QK;
        let bb = dt.block_bytes();
        let vb = vals_per_block(dt);
        let bs = block_stride(dt);
        let q8 = dt == DType::Q8_0;
        // One super-group of 64 rows into its `nb * bs` bytes.
        let pack_super = |sg: usize, dst: &mut [u8]| {
            for r in sg * ALIGN..((sg + 1) * ALIGN).min(rows) {
                let (j, lane) = ((r % ALIGN) / GROUP, r % GROUP);
                let row = &w[r * row_bytes..(r + 1) * row_bytes];
                for (b, blk) in row.chunks_exact(bb).enumerate() {
                    let vals = &blk[2..];
                    let vo = b * bs + j * vb + lane * 4;
                    for m in 0..vb / 64 {
                        for i in 0..4 {
                            let v = vals[4 * m + i];
                            dst[vo + m * 64 + i] = if q8 { v ^ 0x80 } else { v };
                        }
                    }
                    let so = b * bs + SUPER * vb + j * 32 + lane * 2;
                    dst[so..so + 2].copy_from_slice(&blk[..2]);
                }
            }
        };
        let what = || format!("tensor '{name}' ({dt}, {rows} x {cols})");
        let groups = Groups::build(rows.div_ceil(ALIGN), nb * bs, threads, what, pack_super)?;
        Ok(Packed { groups, dtype: dt, rows, cols })
    }
}

/// Reference block-order dot of one stored (GGUF layout) Q8_0/Q4_0 row with one
/// [`QAct`] row.
pub fn dot_block_order_ref(dt: DType, row: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let bb = dt.block_bytes();
    let mut acc = 0f32;
    for (b, blk) in row.chunks_exact(bb).enumerate() {
        let s = f16_bits_to_f32(u16::from_le_bytes([blk[0], blk[1]])) * xd[b];
        let xb = &xq[b * QK..(b + 1) * QK];
        let isum: i32 = if dt == DType::Q4_0 {
            (0..QK / 2)
                .map(|j| {
                    ((blk[2 + j] & 0x0F) as i32 - 8) * xb[j] as i32 + ((blk[2 + j] >> 4) as i32 - 8) * xb[j + 16] as i32
                })
                .sum()
        } else {
            (0..QK).map(|j| blk[2 + j] as i8 as i32 * xb[j] as i32).sum()
        };
        acc = s.mul_add(isum as f32, acc);
    }
    acc
}

/// `out[i * t + c] = dot(row r0 + i, activation row c)` for `nrows` rows of `p`
/// starting at `r0` (a multiple of [`ALIGN`]), in the block order.
pub fn gemm(isa: Isa, p: &Packed, r0: usize, nrows: usize, a: &QAct, out: &mut [f32]) {
    gemm_pf(isa, super::isa::prefetch(), p, r0, nrows, a, out)
}

/// [`gemm`], decode with the software prefetches `pf` (any choice gives the same bits).
fn gemm_pf(isa: Isa, pf: Prefetch, p: &Packed, r0: usize, nrows: usize, a: &QAct, out: &mut [f32]) {
    let _ = pf; // read by the x86 kernels only
    assert!(r0.is_multiple_of(ALIGN) && r0 + nrows <= p.rows, "rows {r0}..{} of {}", r0 + nrows, p.rows);
    assert_eq!(a.cols, p.cols);
    assert_eq!(a.qs.len(), a.t * a.cols);
    assert_eq!(a.d.len(), a.t * a.cols / QK);
    assert_eq!(a.sums.len(), a.d.len());
    assert_eq!(out.len(), nrows * a.t);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx512Vnni` is only chosen on CPUs with AVX-512 F/VL/BW/VNNI,
        // AVX2, FMA and F16C; the groups and activation rows the kernel reads
        // are inside `p` and `a` (lengths asserted above).
        Isa::Avx512Vnni => unsafe { x86::gemm(p, pf, r0, nrows, a, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2` is only chosen on CPUs with AVX2, FMA and F16C; bounds as above.
        Isa::Avx2 => unsafe { x86_256::gemm(p, pf, r0, nrows, a, out) },
        _ => gemm_portable(p, r0, nrows, a, out),
    }
}

/// The packed layout read back element by element (for other kernel sets and
/// as the tests' second opinion): the block order exactly.
fn gemm_portable(p: &Packed, r0: usize, nrows: usize, a: &QAct, out: &mut [f32]) {
    let nb = p.cols / QK;
    let vb = vals_per_block(p.dtype);
    let bs = block_stride(p.dtype);
    let bytes = p.groups.bytes();
    let t = a.t;
    for i in 0..nrows {
        let r = r0 + i;
        let (j, lane) = ((r % ALIGN) / GROUP, r % GROUP);
        let go = (r / ALIGN) * p.groups.group_bytes();
        for c in 0..t {
            let mut acc = 0f32;
            for b in 0..nb {
                let so = go + b * bs + SUPER * vb + j * 32 + lane * 2;
                let s = f16_bits_to_f32(u16::from_le_bytes([bytes[so], bytes[so + 1]])) * a.d[c * nb + b];
                let xb = &a.qs[c * p.cols + b * QK..c * p.cols + (b + 1) * QK];
                let mut isum = 0i32;
                for m in 0..vb / 64 {
                    for k in 0..4 {
                        let v = bytes[go + b * bs + j * vb + m * 64 + lane * 4 + k];
                        if p.dtype == DType::Q4_0 {
                            isum += ((v & 0x0F) as i32 - 8) * xb[4 * m + k] as i32;
                            isum += ((v >> 4) as i32 - 8) * xb[16 + 4 * m + k] as i32;
                        } else {
                            isum += (v ^ 0x80) as i8 as i32 * xb[4 * m + k] as i32;
                        }
                    }
                }
                acc = s.mul_add(isum as f32, acc);
            }
            out[i * t + c] = acc;
        }
    }
}

/// `$f::<W, Q4>$args` for the width `W` in `$widths` equal to `$ct` (else 1) and
/// `Q4 = $q4`: the kernels' token counts are const generics, one instance per width.
#[cfg(target_arch = "x86_64")]
macro_rules! by_width {
    ($f:ident, $ct:expr, $q4:expr, [$($w:literal),*], $args:tt) => {
        match ($ct, $q4) {
            $(($w, true) => $f::<$w, true> $args,)*
            (_, true) => $f::<1, true> $args,
            $(($w, false) => $f::<$w, false> $args,)*
            (_, false) => $f::<1, false> $args,
        }
    };
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
mod x86 {
    use super::{block_stride, vals_per_block, Packed, Prefetch, ALIGN, GROUP, SUPER};
    use crate::backend::cpu::isa::{dpbusd512 as dpbusd, part_lines, prefetch_line, token_chunk, QAct};
    use crate::quant::{DType, QK};
    use std::arch::x86_64::*;

    // Decode's software prefetches: into L1 (Intel) the next block and `PF_L2` ahead into
    // L2 (before: 4 blocks ahead for Q4_0, 1 for Q8_0, into L1, measured best by TinyLlama
    // tg64 from 1 to 6 blocks on an L3 of 480 MiB). On AMD (`Prefetch::L2`) Q4_0 issues
    // none and Q8_0 prefetches into L2, 1 block ahead (Zen 4, `qpack_decode_bench`: 1 to
    // 3 blocks the same, 4 less).
    /// Prefill tiles' software prefetch distance in blocks (into L1), their group being
    /// read again from cache for every chunk of tokens after the first (1-32 measured,
    /// 16 best).
    const PFB_TILE: usize = 16;

    /// The value vectors of one group's block at `p` (Q4_0 split into nibbles: `w[m]` the
    /// low ones of stored vector m, `w[4 + m]` the high), each line prefetched `PFB_TILE`
    /// blocks (`bs` bytes each) ahead.
    ///
    /// # Safety
    /// The block's 4 (Q4_0) or 8 vectors are readable at `p + 64 m`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c,fma")]
    unsafe fn load_w512<const Q4: bool>(p: *const u8, bs: usize) -> [__m512i; 8] {
        let m4 = _mm512_set1_epi8(0x0F);
        let mut w = [_mm512_setzero_si512(); 8];
        // SAFETY: the block's vectors are readable (caller); prefetches never fault.
        unsafe {
            for m in 0..if Q4 { 4 } else { 8 } {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PFB_TILE * bs + 64 * m) as *const i8);
                let x = _mm512_loadu_si512(p.add(64 * m) as *const __m512i);
                if Q4 {
                    w[m] = _mm512_and_si512(x, m4);
                    w[4 + m] = _mm512_and_si512(_mm512_srli_epi16::<4>(x), m4);
                } else {
                    w[m] = x;
                }
            }
        }
        w
    }

    /// 16 rows (one group: values of block 0 at `v`, scales of block 0 at `s`,
    /// block `b` at `b * bs` from them) x C activation rows, all `nb` blocks.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c,fma")]
    unsafe fn tile<const C: usize, const Q4: bool>(
        v: *const u8,
        s: *const u8,
        bs: usize,
        nb: usize,
        a: &QAct,
        c0: usize,
        out: *mut f32,
        ostride: usize,
        valid: usize,
    ) {
        let corr = if Q4 { -8 } else { -128 };
        let mut acc = [_mm512_setzero_ps(); C];
        // SAFETY: (whole body) the CPU has this function's target features (it is reached only
        // through the kernel set `isa()` detected); the group's `nb` blocks of values and scales lie
        // at `v + b * bs` and `s + b * bs`; activation rows `c0..c0 + C` exist in
        // `a` (the driver checks); prefetches may point past the end and never fault.
        unsafe {
            let xq = a.qs.as_ptr().add(c0 * a.cols);
            let xd = a.d.as_ptr().add(c0 * nb);
            let xs = a.sums.as_ptr().add(c0 * nb);
            for b in 0..nb {
                let p = v.add(b * bs);
                let w = load_w512::<Q4>(p, bs);
                let ws = _mm512_cvtph_ps(_mm256_loadu_si256(s.add(b * bs) as *const __m256i));
                for c in 0..C {
                    // Vector m pairs with activation bytes 4m..4m+4 (Q4_0: w[4 + m] holds the
                    // high nibbles of w[m]'s bytes, elements 16 + 4m..).
                    let x = xq.add(c * a.cols + b * QK) as *const i32;
                    let mut isum = _mm512_set1_epi32(corr * *xs.add(c * nb + b));
                    for m in 0..8 {
                        isum = dpbusd(isum, w[m], _mm512_set1_epi32(x.add(m).read_unaligned()));
                    }
                    let s = _mm512_mul_ps(ws, _mm512_set1_ps(*xd.add(c * nb + b)));
                    acc[c] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(isum), acc[c]);
                }
            }
            for c in 0..C {
                let mut o = [0f32; GROUP];
                _mm512_storeu_ps(o.as_mut_ptr(), acc[c]);
                for r in 0..valid {
                    *out.add(r * ostride + c) = o[r];
                }
            }
        }
    }

    /// Two groups of a super-group side by side (values of block 0 at `v` and `v + vb`,
    /// scales at `s` and `s + 32`, block `b` at `b * bs` from them) x C activation rows,
    /// all `nb` blocks, in `tile`'s order bit for bit; group `j`'s row `r < valid[j]` of
    /// token `c` to `out[(16 j + r) * ostride + c]`. Each activation dword is loaded once
    /// for both groups' products: one group's loop is bound by its broadcast loads, not by
    /// its `vpdpbusd`s (as the grouped types' kernels were: gq/x86_512.rs).
    #[allow(clippy::needless_range_loop)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c,fma")]
    unsafe fn tile2<const C: usize, const Q4: bool>(
        v: *const u8,
        s: *const u8,
        vb: usize,
        bs: usize,
        nb: usize,
        a: &QAct,
        c0: usize,
        out: *mut f32,
        ostride: usize,
        valid: [usize; 2],
    ) {
        let corr = if Q4 { -8 } else { -128 };
        let mut acc = [[_mm512_setzero_ps(); C]; 2];
        // SAFETY: (whole body) as `tile`'s, for both groups (the second's values `vb` and
        // scales 32 bytes after the first's, in the same super-group).
        unsafe {
            let xq = a.qs.as_ptr().add(c0 * a.cols);
            let xd = a.d.as_ptr().add(c0 * nb);
            let xs = a.sums.as_ptr().add(c0 * nb);
            for b in 0..nb {
                let w = [load_w512::<Q4>(v.add(b * bs), bs), load_w512::<Q4>(v.add(vb + b * bs), bs)];
                let ws = [
                    _mm512_cvtph_ps(_mm256_loadu_si256(s.add(b * bs) as *const __m256i)),
                    _mm512_cvtph_ps(_mm256_loadu_si256(s.add(32 + b * bs) as *const __m256i)),
                ];
                for c in 0..C {
                    let x = xq.add(c * a.cols + b * QK) as *const i32;
                    let init = _mm512_set1_epi32(corr * *xs.add(c * nb + b));
                    let xv: [__m512i; 8] = std::array::from_fn(|m| _mm512_set1_epi32(x.add(m).read_unaligned()));
                    let dx = _mm512_set1_ps(*xd.add(c * nb + b));
                    for j in 0..2 {
                        let mut isum = init;
                        for m in 0..8 {
                            isum = dpbusd(isum, w[j][m], xv[m]);
                        }
                        let sc = _mm512_mul_ps(ws[j], dx);
                        acc[j][c] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(isum), acc[j][c]);
                    }
                }
            }
            for j in 0..2 {
                for c in 0..C {
                    let mut o = [0f32; GROUP];
                    _mm512_storeu_ps(o.as_mut_ptr(), acc[j][c]);
                    for r in 0..valid[j] {
                        *out.add((GROUP * j + r) * ostride + c) = o[r];
                    }
                }
            }
        }
    }

    /// One activation row against one super-group (64 rows) at `sg`, read as
    /// one stream; the first `valid` rows are written to `out`. Same order as `tile`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c,fma")]
    unsafe fn gemv<const Q4: bool, const PF: bool, const HINT: i32>(
        sg: *const u8,
        nb: usize,
        a: &QAct,
        out: *mut f32,
        valid: usize,
    ) {
        let vb = if Q4 { 256 } else { 512 };
        let bs = SUPER * (vb + 32);
        let corr = if Q4 { -8 } else { -128 };
        let m4 = _mm512_set1_epi8(0x0F);
        let mf0 = _mm512_set1_epi8(0xF0u8 as i8);
        let mut acc = [_mm512_setzero_ps(); SUPER];
        // SAFETY: (whole body) the CPU has this function's target features (it is reached only
        // through the kernel set `isa()` detected); the super-group's `nb` blocks of `bs` bytes at
        // `sg`, one activation row in `a`; `valid` (<= 64) floats at `out` (the
        // driver checks); prefetches never fault.
        unsafe {
            for b in 0..nb {
                let x = a.qs.as_ptr().add(b * QK) as *const i32;
                let mut xb = [_mm512_setzero_si512(); 8];
                for m in 0..8 {
                    xb[m] = _mm512_set1_epi32(x.add(m).read_unaligned());
                }
                let c = _mm512_set1_epi32(corr * *a.sums.as_ptr().add(b));
                let dx = _mm512_set1_ps(*a.d.as_ptr().add(b));
                let blk = sg.add(b * bs);
                let ahead = blk.wrapping_add(bs);
                for j in 0..SUPER {
                    if PF && HINT == _MM_HINT_T0 {
                        for k in part_lines(bs, j, SUPER) {
                            prefetch_line::<{ _MM_HINT_T1 }>(blk.wrapping_add(super::PF_L2 + 64 * k));
                        }
                    }
                    let p = blk.add(j * vb);
                    let mut isum = c;
                    if Q4 {
                        // High nibbles kept in place (16 x value, <= 240): their own
                        // sum is 16 x theirs, shifted back once (exact).
                        let mut hi16 = _mm512_setzero_si512();
                        for m in 0..4 {
                            if PF {
                                prefetch_line::<HINT>(ahead.wrapping_add(j * vb + 64 * m));
                            }
                            let v = _mm512_loadu_si512(p.add(64 * m) as *const __m512i);
                            isum = dpbusd(isum, _mm512_and_si512(v, m4), xb[m]);
                            hi16 = dpbusd(hi16, _mm512_and_si512(v, mf0), xb[4 + m]);
                        }
                        isum = _mm512_add_epi32(isum, _mm512_srai_epi32::<4>(hi16));
                    } else {
                        for m in 0..8 {
                            if PF {
                                prefetch_line::<HINT>(ahead.wrapping_add(j * vb + 64 * m));
                            }
                            isum = dpbusd(isum, _mm512_loadu_si512(p.add(64 * m) as *const __m512i), xb[m]);
                        }
                    }
                    // The block's scales: two lines after the four groups' values.
                    if PF && j < 2 {
                        prefetch_line::<HINT>(ahead.wrapping_add(SUPER * vb + 64 * j));
                    }
                    let ws = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(SUPER * vb + 32 * j) as *const __m256i));
                    acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(ws, dx), _mm512_cvtepi32_ps(isum), acc[j]);
                }
            }
            let mut o = [0f32; ALIGN];
            for j in 0..SUPER {
                _mm512_storeu_ps(o.as_mut_ptr().add(j * GROUP), acc[j]);
            }
            std::ptr::copy_nonoverlapping(o.as_ptr(), out, valid);
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c,fma")]
    pub unsafe fn gemm(p: &Packed, pf: Prefetch, r0: usize, nrows: usize, a: &QAct, out: &mut [f32]) {
        const MAXC: usize = 8;
        /// Tokens per pair of groups (`tile2`; accumulators on the stack).
        const MAXC2: usize = 16;
        let q4 = p.dtype == DType::Q4_0;
        let nb = p.cols / QK;
        let (vb, bs) = (vals_per_block(p.dtype), block_stride(p.dtype));
        let gs = p.groups.group_bytes();
        let t = a.t;
        let tc = (token_chunk(t, a.cols) / MAXC * MAXC).max(MAXC);
        let base = p.groups.bytes().as_ptr();
        let o = out.as_mut_ptr();
        // SAFETY: (whole loop nest) the CPU has this function's target features (it is reached only
        // through the kernel set `isa()` detected); super-groups `r0 / 64 ..` up to row `r0 +
        // nrows` are inside `p`, activation rows `c..c + ct <= t` inside `a`, and
        // the outputs `i * t + c` for `i < nrows` inside `out` (the safe wrapper
        // checked).
        unsafe {
            if t == 1 {
                // Decode: one super-group (one stream) at a time.
                for i in (0..nrows).step_by(ALIGN) {
                    let sg = base.add((r0 + i) / ALIGN * gs);
                    let valid = (nrows - i).min(ALIGN);
                    // Q4_0: into L1 (Intel) or none (AMD: with none it reads at the bound).
                    // Q8_0, whose loads run ahead fastest: into L1 (Intel) or into L2 (AMD),
                    // spread between the loads (`prefetch_line`).
                    const T0: i32 = Prefetch::L1.hint();
                    const T1: i32 = Prefetch::L2.hint();
                    match (q4, pf) {
                        (true, Prefetch::L1 | Prefetch::Near) => gemv::<true, true, T0>(sg, nb, a, o.add(i), valid),
                        (true, _) => gemv::<true, false, T0>(sg, nb, a, o.add(i), valid),
                        (false, Prefetch::L1 | Prefetch::Near) => gemv::<false, true, T0>(sg, nb, a, o.add(i), valid),
                        (false, Prefetch::L2) => gemv::<false, true, T1>(sg, nb, a, o.add(i), valid),
                        (false, Prefetch::Off) => gemv::<false, false, T0>(sg, nb, a, o.add(i), valid),
                    }
                }
                return;
            }
            let mut t0 = 0;
            while t0 < t {
                let t1 = (t0 + tc).min(t);
                let mut i = 0;
                while i < nrows {
                    let valid = (nrows - i).min(GROUP);
                    let r = r0 + i;
                    let sg = base.add(r / ALIGN * gs);
                    let j = (r % ALIGN) / GROUP;
                    let (v, s) = (sg.add(j * vb), sg.add(SUPER * vb + 32 * j));
                    // Groups 0-1 and 2-3 of a super-group go in pairs (`tile2`).
                    let pair = j.is_multiple_of(2) && i + GROUP < nrows;
                    let mut c = t0;
                    while c < t1 {
                        if pair {
                            // The widths compiled: 16, 12, 8 and 1..=4.
                            let ct = match (t1 - c).min(MAXC2) {
                                12..=15 => 12,
                                8..=11 => 8,
                                5..=7 => 4,
                                n => n,
                            };
                            let v2 = [valid, (nrows - i - GROUP).min(GROUP)];
                            by_width!(
                                tile2,
                                ct,
                                q4,
                                [16, 12, 8, 4, 3, 2],
                                (v, s, vb, bs, nb, a, c, o.add(i * t + c), t, v2)
                            );
                            c += ct;
                        } else {
                            let ct = (t1 - c).min(MAXC);
                            by_width!(
                                tile,
                                ct,
                                q4,
                                [8, 7, 6, 5, 4, 3, 2],
                                (v, s, bs, nb, a, c, o.add(i * t + c), t, valid)
                            );
                            c += ct;
                        }
                    }
                    i += if pair { 2 * GROUP } else { GROUP };
                }
                t0 = t1;
            }
        }
    }
}

/// The AVX2 kernels over the same layout, in the same block order (the same bits):
/// eight rows (half a group) per vector of i32 lanes. Integer block sums by
/// `vpmaddubsw` (u8 x i8 pairs into i16) and `vpmaddwd` (into i32), exact: Q4_0's
/// nibbles (0..15) against activations in -128..127 keep each i16 sum of 16 products
/// within 30,720, so a block's eight products add in i16 before one widening; Q8_0
/// multiplies `|w|` by the activation with `w`'s sign ([`isum_q8`]), as the AVX2
/// kernels over rows as stored did.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
mod x86_256 {
    use super::{block_stride, vals_per_block, Packed, Prefetch, ALIGN, GROUP, SUPER};
    use crate::backend::cpu::isa::{part_lines, prefetch_line, token_chunk, QAct};
    use crate::quant::{DType, QK};
    use std::arch::x86_64::*;

    // Decode's software prefetches into L1 (Intel, Zen 3): the next block, each group's
    // lines asked for as the group is read, and `PF_L2` ahead into L2 (measured on Intel).
    // Before, only into L1, Q4_0 4 blocks ahead and Q8_0 1 (Q4_0: 1152-byte blocks,
    // Q8_0: 2176), as measured (TinyLlama tg32, t/s, runs interleaved): Q8_0 on Sapphire
    // Rapids with `LLMRT_CPU_KERNELS=avx2`, 1 thread: none 9.1, 1 block 10.6-11.5, 2
    // blocks 10.1, 4 7.7, 8 8.9; on AMD EPYC Zen 3 (AVX2 natively), Q8_0 1 thread: 1
    // block 12.3-13.8, 2 11.9, 4 12.4-13.1; Q4_0 1 thread: 1 block 22.6-26.3, 2
    // 24.6-28.9, 4 27.3-28.8, 8 28.7-29.2; Q4_0 2 threads: 1 block 30.4-35.8, 4
    // 40.1-43.4 (the same distances as the AVX-512 kernels). On Zen 4 none at all was
    // faster still (Q4_0 1 thread 28-31 t/s against 14-17), and prefetching into L2
    // was slower than none for both types (`qpack_decode_bench`), so on AMD
    // (`Prefetch::L2`) decode issues none. On Zen 3 (`Prefetch::Near`) these prefetches
    // stay, the far one into L2 included: without it Q4_0 tg32 at 1 thread ran 10.2-12.9
    // t/s against 19.4-24.8 (2026-12-06).

    /// The exact block sums of 8 rows (Q8_0; their 8 value vectors `w`, stored as
    /// `w + 128`) with activation block `x` (8 dwords), plus `init`: `|w| * sign(x, w)`
    /// pairs, each at most 2 x 128 x 127 = 32,512 (within i16: `QAct`'s values are
    /// within -127..127, its scale maps a block's maximum to 127), widened at once.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn isum_q8(w: &[__m256i; 8], x: *const i32, init: __m256i) -> __m256i {
        let ones = _mm256_set1_epi16(1);
        let mut acc = init;
        // SAFETY: `x` points at 8 readable dwords (caller).
        unsafe {
            for m in 0..8 {
                let ws = _mm256_xor_si256(w[m], _mm256_set1_epi8(-128));
                let xb = _mm256_set1_epi32(x.add(m).read_unaligned());
                let p = _mm256_maddubs_epi16(_mm256_abs_epi8(ws), _mm256_sign_epi8(xb, ws));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
            }
        }
        acc
    }

    /// The exact block sums of 8 rows (Q4_0; `w[m]` the low nibbles of stored
    /// vector m, `w[4 + m]` its high nibbles, each 0..15) with activation block `x`,
    /// plus `init` (the `-8 * sum(x)` correction).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn isum_q4(w: &[__m256i; 8], x: *const i32, init: __m256i) -> __m256i {
        // SAFETY: `x` points at 8 readable dwords (caller).
        unsafe {
            let xb = |m: usize| _mm256_set1_epi32(x.add(m).read_unaligned());
            let mut p = _mm256_maddubs_epi16(w[0], xb(0));
            for m in 1..8 {
                p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w[m], xb(m)));
            }
            _mm256_add_epi32(init, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
        }
    }

    /// The value vectors of 8 rows of one block (stored vectors at `p`, 64 bytes
    /// apart; this half's 32 bytes of each): Q4_0 split into nibbles.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_w<const Q4: bool>(p: *const u8) -> [__m256i; 8] {
        let m4 = _mm256_set1_epi8(0x0F);
        let mut w = [_mm256_setzero_si256(); 8];
        // SAFETY: the caller guarantees the block's vectors at `p + 64 m`.
        unsafe {
            if Q4 {
                for m in 0..4 {
                    let v = _mm256_loadu_si256(p.add(64 * m) as *const __m256i);
                    w[m] = _mm256_and_si256(v, m4);
                    w[4 + m] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                }
            } else {
                for m in 0..8 {
                    w[m] = _mm256_loadu_si256(p.add(64 * m) as *const __m256i);
                }
            }
        }
        w
    }

    /// A whole-group tile's sums (token `c`'s rows 0..8 in `acc[c][0]`, 8..16 in
    /// `acc[c][1]`): row `r < valid` of token `c` to `out[r * ostride + c]`.
    ///
    /// # Safety
    /// `out[r * ostride + c]` writable for `r < valid.min(16)`, `c < C`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store_group<const C: usize>(acc: &[[__m256; 2]; C], out: *mut f32, ostride: usize, valid: usize) {
        for c in 0..C {
            let mut o = [0f32; 16];
            // SAFETY: `o` holds 16 f32 (unaligned stores); `out` as the caller guarantees.
            unsafe {
                _mm256_storeu_ps(o.as_mut_ptr(), acc[c][0]);
                _mm256_storeu_ps(o.as_mut_ptr().add(8), acc[c][1]);
                for r in 0..valid.min(16) {
                    *out.add(r * ostride + c) = o[r];
                }
            }
        }
    }

    /// Q4_0: the exact integer sums of one block of a group (16 rows; block values at `q`,
    /// half `h` at `q + 32 h`) with the block of each of C activation rows from `xq`
    /// (`cols` apart): [`isum_q4`]'s, its products added in i16 over the block, then widened,
    /// `-8 * sum(x)` (`xs`, `nb` apart) folded in; each token's two broadcast activation dwords
    /// (values `4m ..` and `16 + 4m ..`) serve both halves' nibble vectors.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_q4<const C: usize>(
        q: *const u8,
        xq: *const u8,
        cols: usize,
        xs: *const i32,
        nb: usize,
    ) -> [[__m256i; 2]; C] {
        let mut p = [[_mm256_setzero_si256(); 2]; C];
        let m4 = _mm256_set1_epi8(0x0F);
        // SAFETY: `tile`'s caller guarantees the block's 4 x 64 bytes at `q`, 32 activation
        // bytes at `xq + c * cols` and a sum at `xs + c * nb` for `c < C`.
        unsafe {
            for m in 0..std::hint::black_box(4) {
                let q = q.add(64 * m);
                let (v0, v1) =
                    (_mm256_loadu_si256(q as *const __m256i), _mm256_loadu_si256(q.add(32) as *const __m256i));
                let (l0, l1) = (_mm256_and_si256(v0, m4), _mm256_and_si256(v1, m4));
                let h0 = _mm256_and_si256(_mm256_srli_epi16::<4>(v0), m4);
                let h1 = _mm256_and_si256(_mm256_srli_epi16::<4>(v1), m4);
                for c in 0..C {
                    let x = xq.add(c * cols) as *const i32;
                    let xl = _mm256_set1_epi32(x.add(m).read_unaligned());
                    let xh = _mm256_set1_epi32(x.add(4 + m).read_unaligned());
                    let s0 = _mm256_add_epi16(_mm256_maddubs_epi16(l0, xl), _mm256_maddubs_epi16(h0, xh));
                    p[c][0] = _mm256_add_epi16(p[c][0], s0);
                    let s1 = _mm256_add_epi16(_mm256_maddubs_epi16(l1, xl), _mm256_maddubs_epi16(h1, xh));
                    p[c][1] = _mm256_add_epi16(p[c][1], s1);
                }
            }
            for h in 0..2 {
                for c in 0..C {
                    let init = _mm256_set1_epi32(-8 * *xs.add(c * nb));
                    p[c][h] = _mm256_add_epi32(init, _mm256_madd_epi16(p[c][h], _mm256_set1_epi16(1)));
                }
            }
            p
        }
    }

    /// Q8_0: the exact integer sums of one block of a group (as [`block_q4`]), those of
    /// [`isum_q8`] in its order, but each weight vector formed once and multiplied with the
    /// tokens in turn, each token's broadcast activation dword serving both halves' vectors.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_q8<const C: usize>(q: *const u8, xq: *const u8, cols: usize) -> [[__m256i; 2]; C] {
        let mut is = [[_mm256_setzero_si256(); 2]; C];
        let ones = _mm256_set1_epi16(1);
        let flip = _mm256_set1_epi8(-128);
        // SAFETY: `tile`'s caller guarantees the block's 8 x 64 bytes at `q` and 32
        // activation bytes at `xq + c * cols` for `c < C`.
        unsafe {
            for m in 0..std::hint::black_box(8) {
                let p = q.add(64 * m);
                let w0 = _mm256_xor_si256(_mm256_loadu_si256(p as *const __m256i), flip);
                let w1 = _mm256_xor_si256(_mm256_loadu_si256(p.add(32) as *const __m256i), flip);
                let (a0, a1) = (_mm256_abs_epi8(w0), _mm256_abs_epi8(w1));
                for c in 0..C {
                    let xb = _mm256_set1_epi32((xq.add(c * cols) as *const i32).add(m).read_unaligned());
                    let p0 = _mm256_maddubs_epi16(a0, _mm256_sign_epi8(xb, w0));
                    is[c][0] = _mm256_add_epi32(is[c][0], _mm256_madd_epi16(p0, ones));
                    let p1 = _mm256_maddubs_epi16(a1, _mm256_sign_epi8(xb, w1));
                    is[c][1] = _mm256_add_epi32(is[c][1], _mm256_madd_epi16(p1, ones));
                }
            }
        }
        is
    }

    /// The 16 rows of one group (values of block 0 at `v`, its half `h` at `v + 32 h`;
    /// scales at `s`, `s + 16`; block `b` at `b * bs` from them) x C activation rows from
    /// `c0`, all `nb` blocks; row `r < valid` of token `c` to `out[r * ostride + c]`. A
    /// block's exact integer sums ([`block_q4`], [`block_q8`]) times the weight scale and
    /// the activation scale, added in block order (the same bits as `isum_q4` / `isum_q8`).
    /// Against a tile of half a group (each token's dwords broadcast for 8 rows only), per
    /// 32 multiply-adds in the inner loop: Q8_0 4.75 vector operations against 5.5, Q4_0
    /// 2.5 against 3 (no spills at C = 4). Zen 3, `qpack_prefill_bench` alternating
    /// (Gmac/s): Q8_0 33.1-47.9 -> 41.1-54.0, Q4_0 70.7-70.9 -> 89.2-89.5; TinyLlama Q8_0
    /// pp128 1 thread 36.5-40.1 -> 43.2-44.6 t/s, 2 threads 64.6-75.0 -> 80.5-84.7. The loops
    /// over `m` keep their counts hidden (`black_box`): unrolled, the tokens were scheduled
    /// one after another (as `gq`'s `pair_block` found).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const C: usize, const Q4: bool>(
        v: *const u8,
        s: *const u8,
        bs: usize,
        nb: usize,
        a: &QAct,
        c0: usize,
        out: *mut f32,
        ostride: usize,
        valid: usize,
    ) {
        let mut acc = [[_mm256_setzero_ps(); 2]; C];
        // SAFETY: (whole body) the CPU has this function's target features (reached only through
        // the kernel set `isa()` detected); the group's `nb` blocks of values and scales lie at
        // `v + b * bs` (both halves) and `s + b * bs`; activation rows `c0..c0 + C` exist in `a`
        // (the driver checks); `valid` rows x C outputs at `out`.
        unsafe {
            let xq = a.qs.as_ptr().add(c0 * a.cols);
            let xd = a.d.as_ptr().add(c0 * nb);
            let xs = a.sums.as_ptr().add(c0 * nb);
            for b in 0..nb {
                let (q, x) = (v.add(b * bs), xq.add(b * QK) as *const u8);
                let is = if Q4 { block_q4::<C>(q, x, a.cols, xs.add(b), nb) } else { block_q8::<C>(q, x, a.cols) };
                for h in 0..2 {
                    let ws = _mm256_cvtph_ps(_mm_loadu_si128(s.add(b * bs + 16 * h) as *const __m128i));
                    for c in 0..C {
                        let sc = _mm256_mul_ps(ws, _mm256_set1_ps(*xd.add(c * nb + b)));
                        acc[c][h] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(is[c][h]), acc[c][h]);
                    }
                }
            }
            store_group(&acc, out, ostride, valid);
        }
    }

    /// One activation row against one super-group (64 rows) at `sg`, read as one
    /// stream; the first `valid` rows to `out`. Same order as `tile`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn gemv<const Q4: bool, const PF: bool>(sg: *const u8, nb: usize, a: &QAct, out: *mut f32, valid: usize) {
        let vb = if Q4 { 256 } else { 512 };
        let bs = SUPER * (vb + 32);
        let corr = if Q4 { -8 } else { 0 };
        let mut acc = [_mm256_setzero_ps(); 2 * SUPER];
        // SAFETY: (whole body) the CPU has this function's target features; the super-group's
        // `nb` blocks of `bs` bytes at `sg`, one activation row in `a`; `valid` (<= 64) floats
        // at `out` (the driver checks); prefetches never fault.
        unsafe {
            for b in 0..nb {
                let x = a.qs.as_ptr().add(b * QK) as *const i32;
                let init = _mm256_set1_epi32(corr * *a.sums.as_ptr().add(b));
                let dx = _mm256_set1_ps(*a.d.as_ptr().add(b));
                let blk = sg.add(b * bs);
                let ahead = blk.wrapping_add(bs);
                for j in 0..SUPER {
                    // Group j's lines (and, with the first two, the scales' lines) of the
                    // next block into L1, its share of those `PF_L2` ahead into L2, as the
                    // group is read.
                    if PF {
                        for m in 0..vb / 64 {
                            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(j * vb + 64 * m) as *const i8);
                        }
                        if j < 2 {
                            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(SUPER * vb + 64 * j) as *const i8);
                        }
                        for k in part_lines(bs, j, SUPER) {
                            prefetch_line::<{ _MM_HINT_T1 }>(blk.wrapping_add(super::PF_L2 + 64 * k));
                        }
                    }
                    let ws = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(SUPER * vb + 32 * j) as *const __m128i));
                    let ws2 = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(SUPER * vb + 32 * j + 16) as *const __m128i));
                    for h in 0..2 {
                        let w = load_w::<Q4>(blk.add(j * vb + 32 * h));
                        let isum = if Q4 { isum_q4(&w, x, init) } else { isum_q8(&w, x, init) };
                        let sc = _mm256_mul_ps(if h == 0 { ws } else { ws2 }, dx);
                        acc[2 * j + h] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(isum), acc[2 * j + h]);
                    }
                }
            }
            let mut o = [0f32; ALIGN];
            for k in 0..2 * SUPER {
                _mm256_storeu_ps(o.as_mut_ptr().add(8 * k), acc[k]);
            }
            std::ptr::copy_nonoverlapping(o.as_ptr(), out, valid);
        }
    }

    /// `super::gemm` on AVX2.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `super::gemm`'s assertions hold.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn gemm(p: &Packed, pf: Prefetch, r0: usize, nrows: usize, a: &QAct, out: &mut [f32]) {
        const MAXC: usize = 4;
        let q4 = p.dtype == DType::Q4_0;
        let nb = p.cols / QK;
        let (vb, bs) = (vals_per_block(p.dtype), block_stride(p.dtype));
        let gs = p.groups.group_bytes();
        let t = a.t;
        let tc = (token_chunk(t, a.cols) / MAXC * MAXC).max(MAXC);
        let base = p.groups.bytes().as_ptr();
        let o = out.as_mut_ptr();
        // SAFETY: (whole loop nest) the CPU has this function's target features (reached only
        // through the kernel set `isa()` detected); super-groups `r0 / 64 ..` up to row `r0 +
        // nrows` are inside `p`, activation rows `c..c + ct <= t` inside `a`, and the outputs
        // `i * t + c` for `i < nrows` inside `out` (the safe wrapper checked).
        unsafe {
            if t == 1 {
                for i in (0..nrows).step_by(ALIGN) {
                    let sg = base.add((r0 + i) / ALIGN * gs);
                    let valid = (nrows - i).min(ALIGN);
                    // Into L1 (Intel, and Zen 3 under `Near`) as measured; on Zen 4 none
                    // (`Prefetch::L2` names the kernels that outrun the hardware
                    // prefetchers, not this one).
                    match (q4, matches!(pf, Prefetch::L1 | Prefetch::Near)) {
                        (true, true) => gemv::<true, true>(sg, nb, a, o.add(i), valid),
                        (true, false) => gemv::<true, false>(sg, nb, a, o.add(i), valid),
                        (false, true) => gemv::<false, true>(sg, nb, a, o.add(i), valid),
                        (false, false) => gemv::<false, false>(sg, nb, a, o.add(i), valid),
                    }
                }
                return;
            }
            // A tile takes a whole group (16 rows).
            let mut t0 = 0;
            while t0 < t {
                let t1 = (t0 + tc).min(t);
                for i in (0..nrows).step_by(GROUP) {
                    let valid = (nrows - i).min(GROUP);
                    let r = r0 + i;
                    let sg = base.add(r / ALIGN * gs);
                    let j = (r % ALIGN) / GROUP;
                    let (v, s) = (sg.add(j * vb), sg.add(SUPER * vb + 32 * j));
                    let mut c = t0;
                    while c < t1 {
                        let ct = (t1 - c).min(MAXC);
                        let oc = o.add(i * t + c);
                        by_width!(tile, ct, q4, [4, 3, 2], (v, s, bs, nb, a, c, oc, t, valid));
                        c += ct;
                    }
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
    use crate::quant::quantize_row;

    /// Packed kernels (every kernel set, every token-tile width, partial groups,
    /// row ranges starting inside the matrix) are bit-identical to the block-order
    /// reference over the stored rows.
    #[test]
    fn packed_kernels_match_the_block_order_reference() {
        let mut rng = crate::util::XorShift::new(0x1234_5678_9ABC_DEF0);
        for &(rows, cols, t) in &[
            (16usize, 64usize, 1usize),
            (100, 96, 1),
            (64, 64, 1),
            (35, 96, 9),
            (48, 256, 17),
            (5, 32, 3),
            (33, 160, 8),
            (200, 64, 1),
            (130, 96, 5),
            // Pairs of groups (AVX-512 prefill) with a partial second group, 12 and 16 tokens.
            (20, 64, 12),
            (50, 128, 31),
        ] {
            let x = rng.vec(t * cols, -1.0, 1.0);
            let a = QAct::quantize(&x, cols);
            for dt in [DType::Q8_0, DType::Q4_0] {
                let rb = dt.row_bytes(cols).unwrap();
                let mut w = vec![0u8; rows * rb];
                for r in 0..rows {
                    quantize_row(dt, &rng.vec(cols, -1.0, 1.0), &mut w[r * rb..(r + 1) * rb]);
                }
                let p = Packed::new(dt, &w, rb, rows, cols, "test", 1 + rows % 3).unwrap();
                let nb = cols / QK;
                for (isa, pf) in available()
                    .into_iter()
                    .flat_map(|i| [Prefetch::Off, Prefetch::L1, Prefetch::L2, Prefetch::Near].map(|p| (i, p)))
                {
                    for r0 in (0..rows).step_by(ALIGN) {
                        let n = rows - r0;
                        let mut got = vec![f32::NAN; n * t];
                        gemm_pf(isa, pf, &p, r0, n, &a, &mut got);
                        for i in 0..n {
                            let r = r0 + i;
                            for c in 0..t {
                                let want = dot_block_order_ref(
                                    dt,
                                    &w[r * rb..(r + 1) * rb],
                                    &a.qs[c * cols..(c + 1) * cols],
                                    &a.d[c * nb..(c + 1) * nb],
                                );
                                assert_eq!(
                                    got[i * t + c].to_bits(),
                                    want.to_bits(),
                                    "{dt} {isa:?} prefetch {pf:?} rows={rows} cols={cols} t={t} r={r} c={c}"
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

    /// Decode speed from memory, one thread (not an assertion: run with `--ignored
    /// --nocapture`): a matrix of 1 GiB against one token, each kernel set with and without
    /// its software prefetches, in GB/s of weights. `QPACK_BENCH_MIB` (1024) and
    /// `QPACK_BENCH_COLS` (4096) set the size and row length: below a 480 MiB L3 (the Intel
    /// VMs) the figure is partly L3's (Q4_0 AVX-512 22 GB/s at 128 MiB, 14.7 at 330 MiB).
    #[test]
    #[ignore]
    fn qpack_decode_bench() {
        let mut r = crate::util::XorShift::new(11);
        let cols: usize = std::env::var("QPACK_BENCH_COLS").ok().and_then(|v| v.parse().ok()).unwrap_or(4096);
        for dt in [DType::Q4_0, DType::Q8_0] {
            let (rb, bb) = (dt.row_bytes(cols).unwrap(), dt.block_bytes());
            let mib: usize = std::env::var("QPACK_BENCH_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(1024);
            let rows = ((mib << 20) / rb).div_ceil(ALIGN) * ALIGN;
            let w: Vec<u8> = (0..rows * rb).map(|i| if i % bb == 1 { 0x30 } else { r.next_u64() as u8 }).collect();
            let p = Packed::new(dt, &w, rb, rows, cols, "bench", 2).unwrap();
            drop(w);
            let a = QAct::quantize(&r.vec(cols, -1.0, 1.0), cols);
            let mut out = vec![0f32; rows];
            for isa in available().into_iter().filter(|&i| i != Isa::Scalar) {
                for pf in [Prefetch::Off, Prefetch::L1, Prefetch::L2, Prefetch::Near] {
                    let best = crate::util::best_secs(|| gemm_pf(isa, pf, &p, 0, rows, &a, &mut out));
                    eprintln!("{dt} {isa:?} prefetch {pf:?}: {:.2} GB/s", (rows * rb) as f64 / best / 1e9);
                }
            }
        }
    }

    /// Prefill speed, one thread (not an assertion: run with `--ignored --nocapture`): a
    /// 512 x 2048 matrix against `QPACK_BENCH_T` (64) tokens (a tile's rows, 16-32 KiB,
    /// read again for each block of tokens from L1/L2), each kernel set, in Gmac/s
    /// (multiply-adds of weights by activations per second).
    #[test]
    #[ignore]
    fn qpack_prefill_bench() {
        let mut r = crate::util::XorShift::new(12);
        let (rows, cols) = (512, 2048);
        let t: usize = std::env::var("QPACK_BENCH_T").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
        for dt in [DType::Q4_0, DType::Q8_0] {
            let (rb, bb) = (dt.row_bytes(cols).unwrap(), dt.block_bytes());
            let w: Vec<u8> = (0..rows * rb).map(|i| if i % bb == 1 { 0x30 } else { r.next_u64() as u8 }).collect();
            let p = Packed::new(dt, &w, rb, rows, cols, "bench", 2).unwrap();
            let a = QAct::quantize(&r.vec(t * cols, -1.0, 1.0), cols);
            let mut out = vec![0f32; rows * t];
            for isa in available().into_iter().filter(|&i| i != Isa::Scalar) {
                let best = crate::util::best_secs(|| gemm(isa, &p, 0, rows, &a, &mut out));
                eprintln!("{dt} {isa:?} prefill x{t}: {:.1} Gmac/s", (rows * cols * t) as f64 / best / 1e9);
            }
        }
    }
}
