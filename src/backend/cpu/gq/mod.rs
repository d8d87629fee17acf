//! Matrix products over the group-quantized types (`quant::groups`: Q4_1, Q5_0,
//! Q5_1, IQ4_NL, Q2_K..Q6_K, IQ4_XS) times activations quantized to 8 bits once per
//! step ([`QAct`]: blocks of 32 with an f32 scale, as Q8_0/Q4_0 use them).
//!
//! The *group order* (what every kernel set computes, bit for bit): a row is a
//! sequence of groups of 32 values, each unpacked by `quant::groups::unpack` into
//! integers `q` with a scale and offset per half (`s`, `o`); activation block `g`
//! has scale `dx` and integers `qx`. Per group, with the exact integer sums
//! `isum_h = sum q*qx` and `bsum_h = sum qx` over half `h`, the f32 accumulator
//! takes fused multiply-adds in this order:
//! - one scale per 32 values: `acc = fma(dx*s, isum_0 + isum_1, acc)`, then for
//!   types with an offset `acc = fma(o, dx*(bsum_0 + bsum_1), acc)` (the token's
//!   product formed once per group and token, not once per row tile: before
//!   2026-12-06 `fma(dx*o, bsum_0 + bsum_1, acc)`, one multiply more per group, token
//!   and tile; Q4_K/Q5_K prefill +5%);
//! - a scale per 16 (Q2_K, Q3_K, Q6_K), block by block, with the block's f32 scale `d`
//!   and the halves' integer scales `k_h` (`quant::groups::half_scales`; `s_h =
//!   d*k_h`): per group the exact integer `is = k_0*isum_0 + k_1*isum_1` (at most 2^24 in
//!   magnitude, so exact in f32) goes into the block's sum `u = fma(dx, is, u)`, and for
//!   Q2_K, with its integer mins `m_h`, `ms = m_0*bsum_0 + m_1*bsum_1` into `m = fma(dx,
//!   ms, m)` (both start at 0 with each block); after the block's last group `acc =
//!   fma(d, u, acc)`, then for Q2_K `acc = fma(-dmin, m, acc)`. (Before 2026-12-06 these
//!   took four products per group, `fma(dx*s_h, isum_h)` and `fma(dx*o_h, bsum_h)`: the
//!   float steps, not the integer ones, bounded their AVX2 decode; then, later that day,
//!   `acc = fma(dx*d, is, acc)` and `acc = fma(dx*(-dmin), ms, acc)` per group: a product
//!   per group, token and tile more; `gq_bench` prefill, 128 tokens, AVX2 Q2_K +7%, Q3_K
//!   +6%, Q6_K +4%, AVX-512 Q2_K +7%, Q3_K +2%, Q6_K -1%.) Q4_K / Q5_K keep one scale per
//!   32 (`s = d*sc` in f32): with their integer scales in the sums and `d` per block,
//!   AVX2 prefill gained 0-2%, and AVX-512, whose `vpdpbusd` sums cannot weigh them (a
//!   float product per group instead), ran 9% slower (best of 4 rounds each).
//!
//! Groups are taken in row order, so a row's result depends only on the row and the
//! activation row: never on the batch, the tile, the thread count or the CPU. A
//! kernel may compute the integer sums any way it likes (they are exact) and run
//! the fused multiply-adds of several rows or tokens side by side in SIMD lanes.
//!
//! Kernel sets: the scalar reference below ([`gemm`] for `Isa::Scalar` and any set
//! without its own kernels) and `x86_256` (AVX2 + FMA + F16C).
//!
//! Depends on `isa` (`QAct`) and `quant::groups`.

/// The grouped types as const-generic tags of the SIMD kernels (one table for all
/// kernel sets).
#[cfg(target_arch = "x86_64")]
mod tag {
    pub(super) const T_Q4_1: u8 = 0;
    pub(super) const T_Q5_0: u8 = 1;
    pub(super) const T_Q5_1: u8 = 2;
    pub(super) const T_IQ4_NL: u8 = 3;
    pub(super) const T_Q2_K: u8 = 4;
    pub(super) const T_Q3_K: u8 = 5;
    pub(super) const T_Q4_K: u8 = 6;
    pub(super) const T_Q5_K: u8 = 7;
    pub(super) const T_Q6_K: u8 = 8;
    pub(super) const T_IQ4_XS: u8 = 9;

    /// Dwords per block (a partial last one counted) of the transposed types.
    const fn dwords(t: u8) -> usize {
        match t {
            T_Q2_K => 21,
            T_Q3_K => 28,
            T_Q4_K => 36,
            T_Q5_K => 44,
            T_Q6_K => 53,
            _ => 34, // T_IQ4_XS
        }
    }

    /// The dwords the kernels read first in a block: its scales ([`fields`]).
    const fn scale_dwords(t: u8) -> &'static [usize] {
        match t {
            T_Q2_K => &[20, 0, 1, 2, 3],
            T_Q3_K => &[24, 25, 26, 27],
            T_Q4_K | T_Q5_K => &[0, 1, 2, 3],
            T_Q6_K => &[48, 49, 50, 51, 52],
            _ => &[0, 1], // T_IQ4_XS
        }
    }

    /// The fields (first dword, at the byte offsets `unpack` reads) group `g` reads,
    /// in the kernels' order.
    const fn group_fields(t: u8, g: usize) -> [usize; 2] {
        const NONE: usize = usize::MAX;
        match t {
            T_Q4_K => [(16 + 32 * (g / 2)) / 4, NONE],
            T_Q5_K => [(48 + 32 * (g / 2)) / 4, 16 / 4],
            T_Q2_K => [(16 + 32 * (g / 4)) / 4, NONE],
            T_Q3_K => [(32 + 32 * (g / 4)) / 4, 0],
            T_Q6_K => [(64 * (g / 4) + 32 * (g % 4 % 2)) / 4, (128 + 32 * (g / 4)) / 4],
            _ => [(8 + 16 * g) / 4, NONE], // T_IQ4_XS (4 dwords)
        }
    }

    /// `slots(t)[k]`: the vector of a transposed block holding dword `k`: the dwords
    /// in the order the kernels first read them (scales, then each group's fields,
    /// dword by dword), so a block is read front to back, one forward stream. Stored
    /// in byte order, Q6_K decode from memory ran at a quarter of Q4_K's bandwidth (its
    /// scales, at the block's end, read first; its high bits' dwords between the low
    /// bits'): 7 GB/s against 28 after (docs/BENCHMARKS.md, 2026-12-02).
    const fn slots(t: u8) -> [u8; 64] {
        let mut s = [u8::MAX; 64];
        let mut next = 0u8;
        let sc = scale_dwords(t);
        let mut i = 0;
        while i < sc.len() {
            if s[sc[i]] == u8::MAX {
                s[sc[i]] = next;
                next += 1;
            }
            i += 1;
        }
        let per = if t == T_IQ4_XS { 4 } else { 8 };
        let mut g = 0;
        while g < 8 {
            let f = group_fields(t, g);
            let mut m = 0;
            while m < per {
                let mut j = 0;
                while j < 2 {
                    if f[j] != usize::MAX && s[f[j] + m] == u8::MAX {
                        s[f[j] + m] = next;
                        next += 1;
                    }
                    j += 1;
                }
                m += 1;
            }
            g += 1;
        }
        let mut k = 0;
        while k < dwords(t) {
            if s[k] == u8::MAX {
                s[k] = next;
                next += 1;
            }
            k += 1;
        }
        assert!(next as usize == dwords(t));
        s
    }

    const SLOTS: [[u8; 64]; 10] = [
        [0; 64],
        [0; 64],
        [0; 64],
        [0; 64],
        slots(T_Q2_K),
        slots(T_Q3_K),
        slots(T_Q4_K),
        slots(T_Q5_K),
        slots(T_Q6_K),
        slots(T_IQ4_XS),
    ];

    /// Byte offsets (inside a block) of the dwords both kernel sets read per block for
    /// the scales (gathered, or from a transposed block's vectors).
    pub(super) const fn fields(k: u8) -> &'static [usize] {
        match k {
            T_Q4_1 | T_Q5_0 | T_Q5_1 | T_IQ4_NL => &[0],
            T_Q2_K => &[0, 4, 8, 12, 80],
            T_Q3_K => &[96, 100, 104, 106],
            T_Q4_K | T_Q5_K => &[0, 4, 8, 12],
            T_Q6_K => &[192, 196, 200, 204, 206],
            _ => &[0, 4], // T_IQ4_XS
        }
    }

    /// The vector of a transposed block of type `t` that holds dword `k` ([`slots`]).
    #[inline(always)]
    pub(super) const fn slot(t: u8, k: usize) -> usize {
        SLOTS[t as usize][k] as usize
    }

    /// The tag of a grouped type.
    pub(super) fn of(dt: crate::quant::DType) -> u8 {
        use crate::quant::DType;
        match dt {
            DType::Q4_1 => T_Q4_1,
            DType::Q5_0 => T_Q5_0,
            DType::Q5_1 => T_Q5_1,
            DType::IQ4_NL => T_IQ4_NL,
            DType::Q2_K => T_Q2_K,
            DType::Q3_K => T_Q3_K,
            DType::Q4_K => T_Q4_K,
            DType::Q5_K => T_Q5_K,
            DType::Q6_K => T_Q6_K,
            DType::IQ4_XS => T_IQ4_XS,
            _ => unreachable!("{dt} is not a grouped type"),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86_256;
#[cfg(target_arch = "x86_64")]
mod x86_512;

use crate::backend::cpu::groups::Groups;
use crate::backend::cpu::isa::{Isa, QAct};
use crate::quant::groups::{half_scales, unpack, Group, HalfScales, GROUP};
use crate::quant::DType;
use crate::Result;

/// What each token's activation group brings to a SIMD tile, formed once per call:
/// the bias corrections `-bias * bsum` (a kernel set's bias for the type) that start
/// or join the integer sums (per half for the types with a scale per 16, else the
/// whole group's in `nb[0]`), the group's activation sum times its scale for the offsets (`bf`)
/// and, for the types with a scale per 16, its half sums as an i16 pair (`bp`). 16
/// bytes: at 32 (`bf` per half beside `bp`) AVX-512 prefill lost 4-9% on Q4_K and
/// IQ4_XS (`gq_bench`), whose tiles read an entry per token and group. Loaded as
/// broadcasts, so a tile does no scalar work per token.
/// Formed from `QAct`'s sums (`sums`, `lo`: the quantization's, once per step).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Tok {
    nb: [i32; 2],
    /// The whole group's activation sum times the token's scale `dx`, as f32 (the
    /// offsets of the types with one scale per 32 take `o * bf`: one fused
    /// multiply-add per group and token, no product `dx * o` per row tile).
    bf: f32,
    /// The types with a scale per 16: the two half sums as i16 (`bsum_0` low, `bsum_1`
    /// high; each at most 16 * 128 in magnitude), against which a `madd` weighs the
    /// rows' integer scales or mins in pairs.
    bp: i32,
}

#[cfg(target_arch = "x86_64")]
impl Tok {
    /// One entry per activation group of `a` (token-major, as `a.d`).
    fn table(a: &QAct, halves: bool, bias: i32) -> Vec<Tok> {
        a.lo.iter().zip(&a.sums).zip(&a.d).map(|((&b0, &bs), &d)| Tok::entry(b0, bs, d, halves, bias)).collect()
    }

    fn entry(b0: i32, bs: i32, d: f32, halves: bool, bias: i32) -> Tok {
        if halves {
            let b1 = bs - b0;
            let bp = (b0 as u16 as u32 | (b1 as u16 as u32) << 16) as i32;
            Tok { nb: [-bias * b0, -bias * b1], bf: d * bs as f32, bp }
        } else {
            Tok { nb: [-bias * bs, 0], bf: d * bs as f32, bp: 0 }
        }
    }

    /// [`Tok::table`], allocated fallibly (`LLMRT_OUT_OF_MEMORY`).
    fn try_table(a: &QAct, halves: bool, bias: i32) -> Result<Vec<Tok>> {
        let zero = Tok { nb: [0; 2], bf: 0.0, bp: 0 };
        let mut v = crate::util::try_vec(a.sums.len(), zero, "the step's activation sums per group")?;
        for (((o, &b0), &bs), &d) in v.iter_mut().zip(&a.lo).zip(&a.sums).zip(&a.d) {
            *o = Tok::entry(b0, bs, d, halves, bias);
        }
        Ok(v)
    }
}

/// The group-order dot product of one weight row with one activation row
/// (`qx`: `cols` values, `dx`: `cols / 32` scales): what the kernels are tested against.
#[cfg(test)]
pub(crate) fn dot_ref(dt: DType, row: &[u8], qx: &[i8], dx: &[f32]) -> f32 {
    let per_block = dt.block_elems() / GROUP;
    let bb = dt.block_bytes();
    let mut acc = 0f32;
    for (b, block) in row.chunks_exact(bb).enumerate() {
        let gs: Vec<_> = (0..per_block).map(|g| group(dt, block, g)).collect();
        let span = b * per_block..(b + 1) * per_block;
        acc = accumulate_block(dt, &gs, &qx[span.start * GROUP..span.end * GROUP], &dx[span], acc);
    }
    acc
}

/// Group `g` of `block` unpacked, with its integer half scales (types with a scale per 16).
fn group(dt: DType, block: &[u8], g: usize) -> (Group, HalfScales) {
    let hs = if dt.halves() { half_scales(dt, block, g) } else { HalfScales { k: [0; 2], m: [0; 2], d: 0.0, dm: 0.0 } };
    (unpack(dt, block, g), hs)
}

/// The exact integer half sums `(isum, bsum)` of one group's integers and activations.
#[inline(always)]
fn half_sums(gr: &Group, xb: &[i8]) -> ([i32; 2], [i32; 2]) {
    let (mut isum, mut bsum) = ([0i32; 2], [0i32; 2]);
    for (j, (&q, &x)) in gr.q.iter().zip(xb).enumerate() {
        isum[j / 16] += q as i32 * x as i32;
        bsum[j / 16] += x as i32;
    }
    (isum, bsum)
}

/// One block's fused multiply-adds in the group order: its groups `gs` (each with its
/// integer scales) times one token's activations of the block (`xb`: 32 per group, `dx`:
/// a scale per group), added to `acc`.
#[inline(always)]
fn accumulate_block(dt: DType, gs: &[(Group, HalfScales)], xb: &[i8], dx: &[f32], mut acc: f32) -> f32 {
    if !dt.halves() {
        for ((gr, _), (x, &d)) in gs.iter().zip(xb.chunks_exact(GROUP).zip(dx)) {
            acc = accumulate(dt, gr, x, d, acc);
        }
        return acc;
    }
    // The block's weighed sums `u` and (Q2_K) its mins' sums `m`: each term an exact
    // integer times the token's scale.
    let (mut u, mut m) = (0f32, 0f32);
    for ((gr, hs), (x, &d)) in gs.iter().zip(xb.chunks_exact(GROUP).zip(dx)) {
        let (isum, bsum) = half_sums(gr, x);
        // Exact integers of at most 2^24 in magnitude (Q6_K: 2 * 128 * 16 * 32 * 128), so
        // exact in f32 too.
        let is = hs.k[0] * isum[0] + hs.k[1] * isum[1];
        u = d.mul_add(is as f32, u);
        if dt.has_offset() {
            m = d.mul_add((hs.m[0] * bsum[0] + hs.m[1] * bsum[1]) as f32, m);
        }
    }
    let hs = &gs[0].1;
    acc = hs.d.mul_add(u, acc);
    if dt.has_offset() {
        acc = hs.dm.mul_add(m, acc);
    }
    acc
}

/// One group's fused multiply-adds, in the group order (the types with one scale per 32).
#[inline(always)]
fn accumulate(dt: DType, gr: &Group, xb: &[i8], d: f32, mut acc: f32) -> f32 {
    let (isum, bsum) = half_sums(gr, xb);
    acc = (d * gr.s[0]).mul_add((isum[0] + isum[1]) as f32, acc);
    if dt.has_offset() {
        // The token's scale with its sum (the kernels' `Tok::bf`), then the rows' offsets.
        acc = gr.o[0].mul_add(d * (bsum[0] + bsum[1]) as f32, acc);
    }
    acc
}

/// `out[r * t + c] = dot(row r, activation row c)` for `nrows` rows of `w` (rows of
/// `row_bytes`) and all `t` rows of `a`, in the group order. Each group of a row is
/// unpacked once for all tokens.
pub(crate) fn gemm(isa: Isa, dt: DType, w: &[u8], row_bytes: usize, nrows: usize, a: &QAct, out: &mut [f32]) {
    assert!(dt.is_grouped(), "{dt} is not a grouped type");
    assert_eq!(dt.row_bytes(a.cols), Some(row_bytes));
    assert!(w.len() >= nrows * row_bytes);
    assert_eq!(a.qs.len(), a.t * a.cols);
    assert_eq!(a.d.len(), a.t * a.cols / GROUP);
    assert_eq!(out.len(), nrows * a.t);
    match isa {
        // SAFETY: `Avx2` is only chosen (by `isa()`, or by the tests after `detect()`) on CPUs
        // with AVX2, FMA and F16C; the lengths of `w`, `a` and `out` are asserted above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86_256::gemm(dt, w, row_bytes, nrows, a, out) },
        // SAFETY: `Avx512Vnni` is only chosen (`isa()`) on CPUs with AVX-512 F/BW/VL + VNNI, AVX2,
        // FMA and F16C; the rows, activations and outputs it reads and writes are in bounds
        // (lengths asserted above).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { x86_512::gemm(dt, w, row_bytes, nrows, a, out) },
        _ => gemm_ref(dt, w, row_bytes, nrows, a, out),
    }
}

/// Whether `isa` has grouped-type kernels that read packed tiles ([`Packed`]).
pub(crate) fn packs(isa: Isa) -> bool {
    matches!(isa, Isa::Avx2 | Isa::Avx512Vnni) && cfg!(target_arch = "x86_64")
}

/// Rows per packed tile for `isa`'s kernels (the rows they compute side by side).
pub(crate) fn tile_rows(isa: Isa) -> usize {
    if isa == Isa::Avx512Vnni {
        16
    } else {
        8
    }
}

/// The types whose tiles may be packed transposed ([`pack_transposed`]): their
/// unpacking works byte by byte on fields at dword offsets.
fn transposable(dt: DType) -> bool {
    matches!(dt, DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ4_XS)
}

/// Whether `isa`'s tiles of `dt` are packed transposed: both kernel sets, the K-quants
/// and IQ4_XS (each group unpacks straight into the vectors the kernel multiplies,
/// without per-group shuffles or horizontal adds, and each block's scales are loaded
/// instead of gathered).
fn transposes(isa: Isa, dt: DType) -> bool {
    packs(isa) && transposable(dt)
}

/// Bytes of one block of a transposed tile (block bytes `bb`): a `vector`-byte vector
/// (the kernel set's width: 64 AVX-512, 32 AVX2) per dword of the block.
#[cfg(target_arch = "x86_64")]
fn transposed_block_bytes(bb: usize, vector: usize) -> usize {
    bb.div_ceil(4) * vector
}

/// Fills one transposed tile of `lanes.len()` rows (zero past `rows`): block `b` of
/// the tile is `transposed_block_bytes(bb, vector)` bytes at `b * that`, its vector
/// `k` (`vector` bytes at `vector * tag::slot(k)`) holding in dword lane `l` bytes
/// `4k .. 4k + 4` of block `b` of row `tile * lanes.len() + lanes[l]` (zero past the
/// block's end; `lanes` is the kernel set's lane order: `x86_512::LANE`, the identity
/// for AVX2). Every field the kernels unpack starts at a dword offset and unpacking
/// is byte-wise, so a group unpacks into dwords of the tile's rows, one row per lane.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn pack_transposed(
    dt: DType,
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    tile: usize,
    (lanes, vector, rewrite): Shape,
    dst: &mut [u8],
) {
    let bb = dt.block_bytes();
    assert!(bb <= MAX_BLOCK);
    let tb = transposed_block_bytes(bb, vector);
    // A rewritten block (`rewrite`), overwritten block by block.
    let mut own = [0u8; MAX_BLOCK];
    for (l, &lr) in lanes.iter().enumerate() {
        let r = tile * lanes.len() + lr;
        if r >= rows {
            continue;
        }
        for (b, blk) in w[r * row_bytes..(r + 1) * row_bytes].chunks_exact(bb).enumerate() {
            let blk = match rewrite {
                Some(f) => {
                    own[..bb].copy_from_slice(blk);
                    f(&mut own[..bb]);
                    &own[..bb]
                }
                None => blk,
            };
            for (k, d) in blk.chunks(4).enumerate() {
                let o = b * tb + tag::slot(tag::of(dt), k) * vector + l * 4;
                dst[o..o + d.len()].copy_from_slice(d);
            }
        }
    }
}

/// A kernel set's transposed tiles of a type: the lane order, the vector width, and the
/// rewrite its kernels want of each block's bytes before the copy (None: as stored).
#[cfg(target_arch = "x86_64")]
type Shape = (&'static [usize], usize, Option<fn(&mut [u8])>);

/// The largest block of a transposed type (Q6_K's 210 bytes).
#[cfg(target_arch = "x86_64")]
const MAX_BLOCK: usize = 256;

/// `isa`'s transposed tiles of `dt` ([`Shape`]). The one rewrite: the AVX2 tiles of Q3_K
/// keep each high-bit byte's bits in the order `x86_256::Q3_HBIT`.
#[cfg(target_arch = "x86_64")]
fn transposed_shape(isa: Isa, dt: DType) -> Shape {
    const IDENTITY: [usize; 8] = [0, 1, 2, 3, 4, 5, 6, 7];
    if isa == Isa::Avx512Vnni {
        (&x86_512::LANE, 64, None)
    } else {
        (&IDENTITY, 32, if dt == DType::Q3_K { Some(x86_256::q3_block) } else { None })
    }
}

/// Where the rows of a product are, for the kernel sets: as stored (`row_bytes`
/// apart), or tiles of [`tile_rows`] rows `tile_bytes` apart, the first at row 0 of
/// the slice ([`Packed`]): rows interleaved chunk by chunk, or transposed
/// ([`pack_transposed`]).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
enum Src<'a> {
    Rows { w: &'a [u8], row_bytes: usize },
    Packed { tiles: &'a [u8], tile_bytes: usize },
    Transposed { tiles: &'a [u8], tile_bytes: usize },
}

/// Bytes of one row's piece in a packed tile's chunk: the span the kernels walk
/// at a time (AVX-512: a block; AVX2: a unit of 8 groups).
fn chunk_bytes(isa: Isa, dt: DType) -> usize {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86_256::unit_bytes(dt),
        _ => dt.block_bytes(),
    }
}

/// A grouped-type matrix copied at load into tiles for one kernel set: each tile of
/// [`tile_rows`] rows is one stream, its rows' bytes (unchanged, as stored)
/// interleaved chunk by chunk: chunk `k` of the tile holds chunk `k` (bytes
/// `k * cb .. (k + 1) * cb`, [`chunk_bytes`]) of each of its rows back to back, row `r`
/// at `r * cb`. Rows past the matrix's end are zero. A decode step then reads one
/// sequential stream per tile instead of one per row (16 or 8 streams defeat the
/// hardware prefetchers: measured in docs/BENCHMARKS.md), from huge pages
/// (`groups::HostBuf`) instead of the file's 4 KiB ones. Same bytes, same kernels,
/// same results bit for bit as the rows as stored.
pub(crate) struct Packed {
    tiles: Groups,
    pub(crate) dtype: DType,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// The kernel set the layout is for.
    pub(crate) isa: Isa,
    /// Tiles transposed ([`transposes`]; read by the x86 kernels only, the kernel sets
    /// that pack).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    transposed: bool,
}

impl Packed {
    /// Packs `rows` rows (`row_bytes` each, as stored) of a grouped matrix of `cols`
    /// columns for `isa` (one of [`packs`]), on up to `threads` threads. `name` (the
    /// tensor's) is for the error when the memory cannot be had.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        isa: Isa,
        dt: DType,
        w: &[u8],
        row_bytes: usize,
        rows: usize,
        cols: usize,
        name: &str,
        threads: usize,
    ) -> Result<Packed> {
        assert!(dt.is_grouped() && packs(isa), "{dt} is not packed for {isa:?}");
        // The kernels `gemm_packed` runs for this layout need the CPU to have `isa`.
        assert!(crate::backend::cpu::isa::available().contains(&isa), "this CPU has no {isa:?} kernels");
        assert_eq!(dt.row_bytes(cols), Some(row_bytes));
        assert!(w.len() >= rows * row_bytes);
        let (p, cb) = (tile_rows(isa), chunk_bytes(isa, dt));
        let transposed = transposes(isa, dt);
        let tile_bytes = if transposed {
            #[cfg(target_arch = "x86_64")]
            {
                (cols / dt.block_elems() * transposed_block_bytes(dt.block_bytes(), transposed_shape(isa, dt).1))
                    .div_ceil(64)
                    * 64
            }
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!()
        } else {
            (row_bytes.div_ceil(cb) * p * cb).div_ceil(64) * 64
        };
        let fill = |tile: usize, dst: &mut [u8]| {
            #[cfg(target_arch = "x86_64")]
            if transposed {
                return pack_transposed(dt, w, row_bytes, rows, tile, transposed_shape(isa, dt), dst);
            }
            for r in tile * p..((tile + 1) * p).min(rows) {
                let row = &w[r * row_bytes..(r + 1) * row_bytes];
                for (k, piece) in row.chunks(cb).enumerate() {
                    let o = k * p * cb + (r % p) * cb;
                    dst[o..o + piece.len()].copy_from_slice(piece);
                }
            }
        };
        let what = || format!("tensor '{name}' ({dt}, {rows} x {cols})");
        let tiles = Groups::build(rows.div_ceil(p), tile_bytes, threads, what, fill)?;
        Ok(Packed { tiles, dtype: dt, rows, cols, isa, transposed })
    }
}

/// The tiles holding rows `r0..r0 + nrows` of `p` and the bytes of one, after checking the
/// rows (`r0` a multiple of the tile's rows) and that `a` fits `p`.
fn tiles_for<'p>(p: &'p Packed, r0: usize, nrows: usize, a: &QAct) -> (&'p [u8], usize) {
    let tr = tile_rows(p.isa);
    assert!(r0.is_multiple_of(tr) && r0 + nrows <= p.rows, "rows {r0}..{} of {}", r0 + nrows, p.rows);
    assert_eq!(a.cols, p.cols);
    assert_eq!(a.qs.len(), a.t * a.cols);
    assert_eq!(a.d.len(), a.t * a.cols / GROUP);
    assert_eq!(a.sums.len(), a.d.len());
    let tb = p.tiles.group_bytes();
    (&p.tiles.bytes()[r0 / tr * tb..(r0 + nrows).div_ceil(tr) * tb], tb)
}

/// [`gemm`] over rows `r0..r0 + nrows` of a packed matrix (`r0` a multiple of the
/// tile's rows): the same results bit for bit.
pub(crate) fn gemm_packed(p: &Packed, r0: usize, nrows: usize, a: &QAct, out: &mut [f32]) {
    assert_eq!(out.len(), nrows * a.t);
    if token_major(p, a.t) {
        // Transposed tiles, several tokens: the kernels `ops::matmul` runs token-major,
        // here writing rows as `out` holds them (its own scratch: the tests' path).
        let pre = prepare(p, a).unwrap_or_else(|e| panic!("{}", e.message));
        // SAFETY: `out` holds `nrows * a.t` values, row `r` token `c` at `r * a.t + c`.
        unsafe { gemm_packed_tm(p, r0, nrows, a, &pre, out.as_mut_ptr(), (a.t, 1)) };
        return;
    }
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    let (tiles, tb) = tiles_for(p, r0, nrows, a);
    #[cfg(target_arch = "x86_64")]
    let src =
        if p.transposed { Src::Transposed { tiles, tile_bytes: tb } } else { Src::Packed { tiles, tile_bytes: tb } };
    match p.isa {
        // SAFETY: a `Packed` is only built for `packs(isa)` kernel sets, and only when `isa()`
        // chose that set on this CPU (AVX2 + FMA + F16C); the tiles read are in bounds
        // (sliced above) and the lengths of `a` and `out` asserted.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86_256::gemm_packed(p.dtype, src, nrows, a, out) },
        // SAFETY: as above, for AVX-512 F/BW/VL + VNNI, AVX2, FMA and F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { x86_512::gemm_packed(p.dtype, src, nrows, a, out) },
        other => unreachable!("no packed grouped kernels for {other:?}"),
    }
}

/// What [`gemm_packed_tm`] forms from the activations once per matrix product (each
/// thread's every chunk of rows formed it before: at 2 threads 4-9 times per product):
/// the bias corrections and offset sums per group ([`Tok`]) and, for the AVX2 IQ4_XS
/// kernel, the activations widened to i16.
#[derive(Default)]
pub(crate) struct Prep {
    #[cfg(target_arch = "x86_64")]
    tok: Vec<Tok>,
    #[cfg(target_arch = "x86_64")]
    wide: Vec<i16>,
}

/// [`Prep`] for `p` and `a` (allocated fallibly: `LLMRT_OUT_OF_MEMORY`); empty where
/// [`token_major`] does not take `p`.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub(crate) fn prepare(p: &Packed, a: &QAct) -> Result<Prep> {
    if !token_major(p, a.t) {
        return Ok(Prep::default());
    }
    #[cfg(target_arch = "x86_64")]
    {
        let (halves, bias) = match p.isa {
            Isa::Avx2 => x86_256::tok_kind(p.dtype),
            _ => x86_512::tok_kind(p.dtype),
        };
        let tok = Tok::try_table(a, halves, bias)?;
        let wide = if p.isa == Isa::Avx2 && p.dtype == DType::IQ4_XS {
            let mut w = crate::util::try_vec(a.qs.len(), 0i16, "the step's activations as i16")?;
            w.iter_mut().zip(&a.qs).for_each(|(w, &q)| *w = q as i16);
            w
        } else {
            Vec::new()
        };
        Ok(Prep { tok, wide })
    }
    #[cfg(not(target_arch = "x86_64"))]
    Ok(Prep::default())
}

/// Whether [`gemm_packed_tm`] takes `p` for `t` tokens: transposed tiles (x86), several tokens.
pub(crate) fn token_major(p: &Packed, t: usize) -> bool {
    p.transposed && t > 1 && matches!(p.isa, Isa::Avx2 | Isa::Avx512Vnni)
}

/// [`gemm_packed`] for `p` that [`token_major`] takes, with row `r0 + r`'s result for
/// token `c` at `o[r * ld.0 + c * ld.1]`: token-major (`(1, ys)`) as the matmul's output
/// wants them (no transpose afterwards), or row-major (`(t, 1)`, [`gemm_packed`]). The same
/// results bit for bit.
///
/// # Safety
/// `o[r * ld.0 + c * ld.1]` is writable for `r < nrows`, `c < a.t`, and nothing else reads
/// or writes those places until this returns.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub(crate) unsafe fn gemm_packed_tm(
    p: &Packed,
    r0: usize,
    nrows: usize,
    a: &QAct,
    pre: &Prep,
    o: *mut f32,
    ld: (usize, usize),
) {
    assert!(token_major(p, a.t));
    let (tiles, tb) = tiles_for(p, r0, nrows, a);
    match p.isa {
        // SAFETY: as `gemm_packed` for the kernel set and the tiles; the outputs as the
        // caller guarantees.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86_256::gemm_packed_tm(p.dtype, tiles, tb, nrows, a, pre, o, ld) },
        // SAFETY: as above, for AVX-512 F/BW/VL + VNNI, AVX2, FMA and F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe {
            x86_512::gemm_packed_tm(p.dtype, Src::Transposed { tiles, tile_bytes: tb }, nrows, a, &pre.tok, o, ld)
        },
        other => unreachable!("no token-major grouped kernels for {other:?}"),
    }
}

/// [`gemm`] in portable Rust, block by block. Each block of a row is unpacked once for
/// all tokens.
fn gemm_ref(dt: DType, w: &[u8], row_bytes: usize, nrows: usize, a: &QAct, out: &mut [f32]) {
    let (t, cols) = (a.t, a.cols);
    let (per_block, bb, groups) = (dt.block_elems() / GROUP, dt.block_bytes(), cols / GROUP);
    // A block's groups, reused.
    let mut gs = Vec::with_capacity(per_block);
    for r in 0..nrows {
        let row = &w[r * row_bytes..(r + 1) * row_bytes];
        let acc = &mut out[r * t..(r + 1) * t];
        acc.fill(0.0);
        for (b, block) in row[..groups / per_block * bb].chunks_exact(bb).enumerate() {
            gs.clear();
            gs.extend((0..per_block).map(|g| group(dt, block, g)));
            let g0 = b * per_block;
            for (c, o) in acc.iter_mut().enumerate() {
                let xb = &a.qs[c * cols + g0 * GROUP..c * cols + (g0 + per_block) * GROUP];
                *o = accumulate_block(dt, &gs, xb, &a.d[c * groups + g0..c * groups + g0 + per_block], *o);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_row;
    use crate::util::XorShift;

    /// Random but valid rows of `dt`: random bytes with every f16 scale set to a
    /// small finite value (so no inf/NaN scale).
    fn random_row(dt: DType, cols: usize, r: &mut XorShift) -> Vec<u8> {
        let n = dt.row_bytes(cols).unwrap();
        let mut row: Vec<u8> = (0..n).map(|_| r.next_u64() as u8).collect();
        for blk in row.chunks_exact_mut(dt.block_bytes()) {
            for &o in dt.f16_scale_offsets() {
                let v = half::f16::from_f32(r.uniform(-0.05, 0.05)).to_bits().to_le_bytes();
                blk[o..o + 2].copy_from_slice(&v);
            }
        }
        row
    }

    #[test]
    fn gq_dot_is_close_to_the_dequantized_row_and_gemm_equals_dot() {
        let mut r = XorShift::new(0x6a09_e667);
        for dt in DType::all().into_iter().filter(|d| d.is_grouped()) {
            let cols = 512;
            let (rows, t) = (3, 5);
            let w: Vec<u8> = (0..rows).flat_map(|_| random_row(dt, cols, &mut r)).collect();
            let x = r.vec(t * cols, -1.0, 1.0);
            let a = QAct::quantize(&x, cols);
            let rb = dt.row_bytes(cols).unwrap();
            let mut out = vec![0f32; rows * t];
            gemm(Isa::Scalar, dt, &w, rb, rows, &a, &mut out);
            for i in 0..rows {
                let row = &w[i * rb..(i + 1) * rb];
                let mut deq = vec![0f32; cols];
                dequantize_row(dt, row, &mut deq);
                for c in 0..t {
                    let got = dot_ref(dt, row, &a.qs[c * cols..(c + 1) * cols], &a.d[c * 16..(c + 1) * 16]);
                    assert_eq!(got.to_bits(), out[i * t + c].to_bits(), "{dt}: gemm != dot at row {i} token {c}");
                    // Against the exact product with the dequantized activations.
                    let xq: Vec<f64> =
                        (0..cols).map(|j| a.qs[c * cols + j] as f64 * a.d[c * 16 + j / 32] as f64).collect();
                    let want: f64 = deq.iter().zip(&xq).map(|(&w, &x)| w as f64 * x).sum();
                    let scale: f64 = deq.iter().zip(&xq).map(|(&w, &x)| (w as f64 * x).abs()).sum::<f64>().max(1e-30);
                    assert!(
                        ((got as f64 - want) / scale).abs() < 1e-5,
                        "{dt}: row {i} token {c}: {got} vs {want} (scale {scale})"
                    );
                }
            }
        }
    }

    /// Every kernel set this CPU runs besides the reference gives `dot_ref`'s results
    /// bit for bit, for every grouped type, row counts 1..=9 (tile tails), token
    /// counts 1, 2, 7, 33 (chunk tails) and several row lengths (short rows of the
    /// 32-value types included), on random activations and on activations at full
    /// scale (|q| = 127 everywhere, or 127 and -128: the saturation bounds of the
    /// integer steps).
    #[test]
    fn gq_kernels_equal_dot_ref_bit_for_bit() {
        let sets: Vec<Isa> = crate::backend::cpu::isa::available().into_iter().filter(|&i| i != Isa::Scalar).collect();
        if sets.is_empty() {
            eprintln!("no SIMD kernel set on this CPU: nothing to compare");
            return;
        }
        let mut r = XorShift::new(0xbb67_ae85);
        for dt in DType::all().into_iter().filter(|d| d.is_grouped()) {
            let mut all_cols = vec![256, 1024];
            if dt.block_elems() == GROUP {
                all_cols.extend([32, 96]);
            }
            for &cols in &all_cols {
                let rb = dt.row_bytes(cols).unwrap();
                let w: Vec<u8> = (0..9).flat_map(|_| random_row(dt, cols, &mut r)).collect();
                for &t in &[1usize, 2, 7, 14, 33] {
                    for full in 0..3 {
                        // 1: every |qx| 127; 2: a subnormal maximum (quantized like the
                        // block scaled into the normal range: +-127), then every negative
                        // value set to -128, which QAct never gives but a kernel must still
                        // multiply exactly (the sign trick's edge).
                        let m = [1.0, 1.0, 1e-40][full];
                        let x: Vec<f32> = if full > 0 {
                            (0..t * cols).map(|_| if r.next_u64() & 1 == 0 { m } else { -m }).collect()
                        } else {
                            r.vec(t * cols, -1.0, 1.0)
                        };
                        let mut a = QAct::quantize(&x, cols);
                        if full == 2 {
                            assert!(!a.qs.contains(&-128) && a.qs.contains(&-127), "tiny blocks quantize to +-127");
                            for q in a.qs.iter_mut().filter(|q| **q < 0) {
                                *q = -128;
                            }
                            for ((s, lo), b) in a.sums.iter_mut().zip(&mut a.lo).zip(a.qs.chunks_exact(GROUP)) {
                                *lo = b[..16].iter().map(|&q| q as i32).sum();
                                *s = b.iter().map(|&q| q as i32).sum();
                            }
                        }
                        let g = cols / GROUP;
                        let want: Vec<Vec<f32>> = (0..9)
                            .map(|i| {
                                (0..t)
                                    .map(|c| {
                                        let row = &w[i * rb..(i + 1) * rb];
                                        dot_ref(dt, row, &a.qs[c * cols..(c + 1) * cols], &a.d[c * g..(c + 1) * g])
                                    })
                                    .collect()
                            })
                            .collect();
                        for &isa in &sets {
                            for nrows in 1..=9 {
                                // Start at row 9 - nrows, so tails read rows at the end of `w`.
                                let r0 = 9 - nrows;
                                let mut out = vec![f32::NAN; nrows * t];
                                gemm(isa, dt, &w[r0 * rb..], rb, nrows, &a, &mut out);
                                for i in 0..nrows {
                                    for c in 0..t {
                                        assert_eq!(
                                            out[i * t + c].to_bits(),
                                            want[r0 + i][c].to_bits(),
                                            "{dt} {isa:?}: cols {cols} t {t} full {full} nrows {nrows}: row {i} token {c}: {} vs {}",
                                            out[i * t + c],
                                            want[r0 + i][c]
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Packed tiles (every kernel set that packs, every grouped type) give `dot_ref`'s
    /// results bit for bit: row counts that end inside a tile and on its edge, ranges
    /// starting at later tiles (as the threads' shares do), one token and several.
    #[test]
    fn gq_packed_kernels_equal_dot_ref_bit_for_bit() {
        let sets: Vec<Isa> = crate::backend::cpu::isa::available().into_iter().filter(|&i| packs(i)).collect();
        if sets.is_empty() {
            eprintln!("no kernel set that packs on this CPU: nothing to compare");
            return;
        }
        let mut r = XorShift::new(0x3c6e_f372);
        for dt in DType::all().into_iter().filter(|d| d.is_grouped()) {
            let mut all_cols = vec![256, 768];
            if dt.block_elems() == GROUP {
                all_cols.extend([32, 96, 288]);
            }
            for &cols in &all_cols {
                let rb = dt.row_bytes(cols).unwrap();
                for &rows in &[1usize, 7, 8, 16, 23, 40] {
                    let w: Vec<u8> = (0..rows).flat_map(|_| random_row(dt, cols, &mut r)).collect();
                    for &t in &[1usize, 2, 9, 31, 33] {
                        let x = r.vec(t * cols, -1.0, 1.0);
                        let a = QAct::quantize(&x, cols);
                        let g = cols / GROUP;
                        for &isa in &sets {
                            let p = Packed::new(isa, dt, &w, rb, rows, cols, "test", 1 + rows % 3).unwrap();
                            let tr = tile_rows(isa);
                            for r0 in (0..rows).step_by(tr) {
                                let n = rows - r0;
                                let mut out = vec![f32::NAN; n * t];
                                gemm_packed(&p, r0, n, &a, &mut out);
                                for i in 0..n {
                                    let row = &w[(r0 + i) * rb..(r0 + i + 1) * rb];
                                    for c in 0..t {
                                        let want =
                                            dot_ref(dt, row, &a.qs[c * cols..(c + 1) * cols], &a.d[c * g..(c + 1) * g]);
                                        assert_eq!(
                                            out[i * t + c].to_bits(),
                                            want.to_bits(),
                                            "{dt} {isa:?}: cols {cols} rows {rows} from {r0}, t {t}: row {i} token {c}"
                                        );
                                    }
                                }
                                if !token_major(&p, t) {
                                    continue;
                                }
                                // Token-major into a wider output (`ys = rows + 5`): the same bits
                                // at `r0 + i + c * ys`, and nothing else written.
                                let ys = rows + 5;
                                let mut y = vec![-7.5f32; t * ys];
                                let pre = prepare(&p, &a).unwrap();
                                // SAFETY: `y` holds `t * ys` values, and `r0 + n <= rows < ys`.
                                unsafe { gemm_packed_tm(&p, r0, n, &a, &pre, y.as_mut_ptr().add(r0), (1, ys)) };
                                for (k, v) in y.iter().enumerate() {
                                    let (c, rr) = (k / ys, k % ys);
                                    let want = if (r0..r0 + n).contains(&rr) { out[(rr - r0) * t + c] } else { -7.5 };
                                    assert_eq!(
                                        v.to_bits(),
                                        want.to_bits(),
                                        "{dt} {isa:?} token-major: cols {cols} rows {rows} from {r0}, t {t}: row {rr} token {c}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Whether the benches' filter `var` (names as printed, comma-separated; unset or
    /// empty: all) takes `name`.
    fn listed(var: &str, name: &str) -> bool {
        let only = std::env::var(var).unwrap_or_default();
        only.is_empty() || only.split(',').any(|n| n == name)
    }

    /// Decode speed from memory, one thread (not an assertion: run with `--ignored
    /// --nocapture`): each grouped type's packed kernels against one token over a matrix
    /// of 1 GiB, past the last-level cache (the Intel Xeon VM's L3 is 480 MiB: 128 MiB
    /// there read up to 40% faster than memory), in GB/s of weights. `GQ_BENCH_MIB` (1024)
    /// sets the matrix size (1 keeps it in the L2 cache, where the figure is the kernels'
    /// compute speed; on Zen 3 that is L3: `GQ_BENCH_KIB` sets it in KiB instead),
    /// `GQ_BENCH_COLS` (4096) its row length, `GQ_BENCH_TYPES` and
    /// `GQ_BENCH_ISAS` (type and kernel set names) which are measured.
    #[test]
    #[ignore]
    fn gq_decode_bench() {
        let mut r = XorShift::new(9);
        let cols: usize = std::env::var("GQ_BENCH_COLS").ok().and_then(|v| v.parse().ok()).unwrap_or(4096);
        let mib: usize = std::env::var("GQ_BENCH_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(1024);
        let kib: usize = std::env::var("GQ_BENCH_KIB").ok().and_then(|v| v.parse().ok()).unwrap_or(mib << 10);
        for dt in DType::all().into_iter().filter(|d| d.is_grouped() && listed("GQ_BENCH_TYPES", &d.to_string())) {
            let rb = dt.row_bytes(cols).unwrap();
            let rows = ((kib << 10) / rb).div_ceil(64) * 64;
            let w: Vec<u8> = (0..rows).flat_map(|_| random_row(dt, cols, &mut r)).collect();
            let a = QAct::quantize(&r.vec(cols, -1.0, 1.0), cols);
            let mut out = vec![0f32; rows];
            let mut line = format!("{dt:>7}:");
            for isa in crate::backend::cpu::isa::available()
                .into_iter()
                .filter(|&i| packs(i) && listed("GQ_BENCH_ISAS", &format!("{i:?}")))
            {
                let p = Packed::new(isa, dt, &w, rb, rows, cols, "bench", 2).unwrap();
                let best = crate::util::best_secs(|| gemm_packed(&p, 0, rows, &a, &mut out));
                line += &format!(" {isa:?} {:.1} GB/s", (rows * rb) as f64 / best / 1e9);
            }
            eprintln!("{line}");
        }
    }

    /// Kernel speed, one thread (not an assertion: run with `--ignored --nocapture`):
    /// decode streams a 4096 x 4096 matrix against one token (past the last-level cache
    /// share of one core on the Intel VMs; within a 32 MiB L3, as on Zen 4, an L3 figure:
    /// `gq_decode_bench` reads from memory), prefill a 256-row slice against 32;
    /// `GQ_BENCH_TYPES` (type names, comma-separated) limits the grouped types measured.
    #[test]
    #[ignore]
    fn gq_bench() {
        use crate::util::best_secs as best;
        let mut r = XorShift::new(7);
        let cols: usize = std::env::var("GQ_BENCH_COLS").ok().and_then(|v| v.parse().ok()).unwrap_or(4096);
        let rows = 4096;
        // Prefill's tokens (`GQ_BENCH_T`, default 32).
        let pt: usize = std::env::var("GQ_BENCH_T").ok().and_then(|v| v.parse().ok()).unwrap_or(32);
        // The packed Q4_0 / Q8_0 kernels (`qpack`; Q4_0: 18 bytes per 32 values, as Q4_K) for scale.
        for qt in [DType::Q4_0, DType::Q8_0] {
            let (rb, bb) = (qt.row_bytes(cols).unwrap(), qt.block_bytes());
            let w: Vec<u8> = (0..rows * rb).map(|i| if i % bb == 1 { 0x30 } else { r.next_u64() as u8 }).collect();
            let p = crate::backend::cpu::qpack::Packed::new(qt, &w, rb, rows, cols, "bench", 1).unwrap();
            for isa in crate::backend::cpu::isa::available().into_iter().filter(|&i| i != Isa::Scalar) {
                for (t, nr) in [(1usize, rows), (32, 256)] {
                    let a = QAct::quantize(&r.vec(t * cols, -1.0, 1.0), cols);
                    let mut out = vec![0f32; nr * t];
                    let s = best(|| crate::backend::cpu::qpack::gemm(isa, &p, 0, nr, &a, &mut out));
                    if t == 1 {
                        eprintln!("{qt} packed {isa:?} decode {:.2} GB/s", (nr * rb) as f64 / s / 1e9);
                    } else {
                        eprintln!("{qt} packed {isa:?} prefill {:.1} Gmac/s", (nr * cols * t) as f64 / s / 1e9);
                    }
                }
            }
        }
        for dt in DType::all().into_iter().filter(|d| d.is_grouped() && listed("GQ_BENCH_TYPES", &d.to_string())) {
            let rb = dt.row_bytes(cols).unwrap();
            let w: Vec<u8> = (0..rows).flat_map(|_| random_row(dt, cols, &mut r)).collect();
            let mut line = format!("{dt:>7}:");
            for isa in
                crate::backend::cpu::isa::available().into_iter().filter(|i| listed("GQ_BENCH_ISAS", &format!("{i:?}")))
            {
                for (t, nr) in [(1usize, rows), (pt, 256)] {
                    let a = QAct::quantize(&r.vec(t * cols, -1.0, 1.0), cols);
                    let mut out = vec![0f32; nr * t];
                    let s = best(|| gemm(isa, dt, &w, rb, nr, &a, &mut out));
                    // The same rows packed at load, as the CPU backend uses them.
                    let sp = if packs(isa) {
                        let p = Packed::new(isa, dt, &w, rb, nr, cols, "bench", 1).unwrap();
                        best(|| gemm_packed(&p, 0, nr, &a, &mut out))
                    } else {
                        f64::NAN
                    };
                    if t == 1 {
                        let gb = |s: f64| (nr * rb) as f64 / s / 1e9;
                        line += &format!(" {isa:?} decode {:.2} GB/s (packed {:.2})", gb(s), gb(sp));
                    } else {
                        let gm = |s: f64| (nr * cols * t) as f64 / s / 1e9;
                        line += &format!(" prefill {:.1} Gmac/s (packed {:.1}) |", gm(s), gm(sp));
                    }
                }
            }
            eprintln!("{line}");
        }
    }
}
