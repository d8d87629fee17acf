//! The leaf of the CPU backend: which kernel set this CPU runs ([`Isa`], detected
//! once per process), the fixed lane reductions every kernel ends with, the
//! activation quantization the quantized kernels read ([`QAct`]), and the small
//! x86 helpers (the `dpbusd` integer dot steps, [`token_chunk`]) that the lane-order
//! kernels (`simd`) and the packed kernels (`qpack`, `fpack`) share.
//!
//! Dependency order of the CPU kernels (no cycles): `isa` (this file; imports only
//! `crate::quant`) <- `qpack`, `fpack` (packed layouts and their orders) <- `simd`
//! (the lane orders over rows as stored, which on AVX-512 VNNI fall back to the
//! block and sequential references of `qpack`/`fpack`) <- `ops::matmul`.

use crate::quant::QK;
use std::sync::OnceLock;

/// Which kernel set runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust (any CPU).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 (F, VL, BW) with VNNI, plus AVX2 + FMA + F16C: 512-bit kernels
    /// with the 16-lane orders (see the module docs).
    Avx512Vnni,
    /// aarch64 NEON (quantized kernels; float ones use the reference, which
    /// compiles to fused multiply-adds there).
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    Neon,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2+fma+f16c",
            Isa::Avx512Vnni => "avx512f/vl/bw+vnni (512-bit), avx2+fma+f16c",
            Isa::Neon => "neon",
        }
    }
}

/// The kernels this CPU runs (detected once). `LLMRT_CPU_KERNELS=scalar|avx2`
/// forces a lower set (for tests and comparisons).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let forced = std::env::var("LLMRT_CPU_KERNELS").ok();
        let best = detect();
        match forced.as_deref() {
            Some("scalar") => Isa::Scalar,
            Some("avx2") if best == Isa::Avx512Vnni => Isa::Avx2,
            _ => best,
        }
    })
}

/// Which software prefetches the decode kernels issue (see [`prefetch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefetch {
    /// None: the hardware prefetchers alone.
    Off,
    /// Every decode kernel prefetches into the first-level cache (`prefetcht0`), each at
    /// its measured distance, except the decode over packed tiles of the grouped types and
    /// of Q4_0/Q8_0, which prefetches the next block (AVX2 grouped types: unit) into L1
    /// and the lines 3 KiB (AVX-512 grouped types: 4) ahead into L2 (Intel; all measured
    /// there).
    L1,
    /// Only the kernels whose loads outrun the hardware prefetchers (the AVX-512 packed
    /// Q8_0 and grouped-type decode, IQ4_XS excepted) prefetch, into the second-level
    /// cache (`prefetcht1`); the other packed decode kernels issue none, except the AVX2
    /// legacy grouped types' (Q4_1, Q5_0, Q5_1, IQ4_NL), which keep theirs into L1 (AMD).
    L2,
    /// `L1` without the far prefetches into L2 where they held decode back (AMD without
    /// AVX-512: Zen 3 measured): the AVX2 grouped types' decode prefetches only each
    /// stream's next unit (into L1), F16/BF16 decode none (its groups side by side, as
    /// under `Off`); Q4_0/Q8_0 as under `L1` (without its far prefetch the AVX2 Q4_0
    /// decode ran 10-13 t/s against 19-25 there); the AVX-512 kernels, which no such CPU
    /// runs, as under `L1`.
    Near,
}

impl Prefetch {
    /// The `_mm_prefetch` hint (`Off`: never issued; any value).
    #[cfg(target_arch = "x86_64")]
    pub const fn hint(self) -> i32 {
        use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1};
        match self {
            Prefetch::L2 => _MM_HINT_T1,
            _ => _MM_HINT_T0,
        }
    }
}

/// One software prefetch of the line at `p` with the hint `HINT` (a
/// [`Prefetch::hint`]). Into L2 it is issued by inline assembly, which the compiler
/// keeps where the kernel has it, between the loads: LLVM sinks the intrinsic's
/// prefetches of a loop body into one burst at its end, and on Zen 4 that burst (34
/// per Q8_0 block) held decode to 13 GB/s where the same prefetches spread out read 26.
/// Into L1 it stays the intrinsic, the code measured on Intel.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn prefetch_line<const HINT: i32>(p: *const u8) {
    if HINT == std::arch::x86_64::_MM_HINT_T1 {
        // SAFETY: a prefetch is a hint: it never faults, whatever the address, and writes
        // nothing (no memory, registers or flags besides the address operand it reads).
        unsafe { std::arch::asm!("prefetcht1 [{0}]", in(reg) p, options(nostack, preserves_flags, readonly)) }
    } else {
        // SAFETY: as above (`_mm_prefetch` needs only SSE, part of x86-64).
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(p as *const i8) }
    }
}

/// A line into L1 by inline assembly, kept where the kernel has it (as
/// [`prefetch_line`]'s into L2): the AVX2 grouped decode's prefetches under
/// [`Prefetch::Near`], spread through a unit's groups (`gq::x86_256`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn prefetch_line_l1_kept(p: *const u8) {
    // SAFETY: as in `prefetch_line`: a hint that never faults and writes nothing.
    unsafe { std::arch::asm!("prefetcht0 [{0}]", in(reg) p, options(nostack, preserves_flags, readonly)) }
}

/// The 64-byte lines (indices) of part `j` of `n` of a `bytes`-byte block: the share of
/// its lines that decode prefetches at step `j` of the `n` (its groups) reading the block
/// before it, so that the prefetches spread between the loads.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn part_lines(bytes: usize, j: usize, n: usize) -> std::ops::Range<usize> {
    let (lines, per) = (bytes.div_ceil(64), bytes.div_ceil(64).div_ceil(n));
    (j * per).min(lines)..((j + 1) * per).min(lines)
}

/// The software prefetches of the decode kernels (detected once).
/// `LLMRT_CPU_PREFETCH=0|1|2|3` decides (`Off`, `L1`, `L2`, `Near`; for comparisons). Else
/// `L2` on AMD CPUs with AVX-512 (Zen 4 and later), `Near` on AMD CPUs without it (Zen 3
/// measured; Zen 2 and earlier not, taken as alike), `L1` elsewhere. On Zen 4 the prefetches into
/// L1 held decode back (packed Q4_0 ran twice as fast with none, F16 10-15% faster),
/// while with none the AVX-512 Q8_0 kernel, whose loads run ahead fastest (one VNNI step
/// per line), read 16-18 GB/s of the 26 one core reads; prefetching into L2 one block
/// ahead it reads 25-28 (docs/BENCHMARKS.md, 2026-12-04). `L1` was measured to pay on
/// Intel, and on Zen 3 (AVX2 only): there the packed Q4_0 decode prefetching 4 blocks
/// ahead into L1 went from 0.71-0.75x llama.cpp to 1.24-1.41x (2026-12-03), which the
/// vendor-wide choice of 2026-12-04, measured on Zen 4 alone, had taken back. But there
/// the far prefetches `L1` pairs with those into L1 (`prefetcht1` 3 KiB ahead in the
/// AVX2 grouped decode, 8 KiB in F16/BF16's) held decode back (2026-12-06, TinyLlama tg,
/// 1 thread, t/s, `L1` -> `Near`): Q4_K_M 14.4-15.8 -> 18.1-22.3, Q6_K 9.7-10.3 ->
/// 12.1-15.3, Q3_K_M 16.8-18.7 -> 22.2-22.4, F16 5.9-6.2 -> 7.9-8.2 (docs/BENCHMARKS.md).
pub fn prefetch() -> Prefetch {
    static PF: OnceLock<Prefetch> = OnceLock::new();
    *PF.get_or_init(|| match std::env::var("LLMRT_CPU_PREFETCH").ok().as_deref() {
        Some("0") => Prefetch::Off,
        Some("1") => Prefetch::L1,
        Some("2") => Prefetch::L2,
        Some("3") => Prefetch::Near,
        _ if cpu_is_amd() && has_avx512f() => Prefetch::L2,
        _ if cpu_is_amd() => Prefetch::Near,
        _ => Prefetch::L1,
    })
}

/// Whether the CPU has AVX-512 F (on AMD: Zen 4 and later).
fn has_avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU's vendor is AMD (CPUID leaf 0's vendor string).
fn cpu_is_amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID leaf 0 exists on every x86-64 CPU.
        let r = std::arch::x86_64::__cpuid(0);
        let mut v = [0u8; 12];
        for (i, w) in [r.ebx, r.edx, r.ecx].into_iter().enumerate() {
            v[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
        &v == b"AuthenticAMD"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The best kernel set the CPU supports.
pub fn detect() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
            {
                return Isa::Avx512Vnni;
            }
            return Isa::Avx2;
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            return Isa::Neon;
        }
    }
    Isa::Scalar
}

/// Every kernel set this CPU can run.
pub fn available() -> Vec<Isa> {
    let mut v = vec![Isa::Scalar];
    match detect() {
        Isa::Avx512Vnni => v.extend([Isa::Avx2, Isa::Avx512Vnni]),
        Isa::Scalar => {}
        other => v.push(other),
    }
    v
}

/// The fixed 8-lane reduction: `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`.
#[inline(always)]
pub fn reduce8(a: [f32; 8]) -> f32 {
    let b = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (b[0] + b[2]) + (b[1] + b[3])
}

/// The fixed 16-lane reduction of the wide orders.
#[inline(always)]
pub fn reduce16(a: [f32; 16]) -> f32 {
    let mut b = [0f32; 8];
    for l in 0..8 {
        b[l] = a[l] + a[l + 8];
    }
    reduce8(b)
}

/// Whether `isa` computes the 16-lane ("wide") orders.
#[cfg(test)]
pub fn wide(isa: Isa) -> bool {
    isa == Isa::Avx512Vnni
}

/// Activations quantized to 8-bit blocks of 32 (symmetric, scale `amax / 127`
/// kept in f32), `t` rows of `cols`.
#[derive(Default)]
pub struct QAct {
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    /// Sum of each block's 32 quantized values (for the unsigned-operand
    /// corrections of the packed kernels).
    pub sums: Vec<i32>,
    /// Sum of each block's first 16 quantized values (the halves' sums of the types
    /// with a scale per 16 values: the second is `sums - lo`), formed here once per step
    /// rather than by every matrix product and thread (prefill spent 4-5% there: Q6_K).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub lo: Vec<i32>,
    pub cols: usize,
    pub t: usize,
}

impl QAct {
    /// Quantizes `x` (rows of `cols`, `cols` a multiple of 32); panics where
    /// [`QAct::try_quantize`] fails (tests).
    #[cfg(test)]
    pub fn quantize(x: &[f32], cols: usize) -> QAct {
        QAct::try_quantize(x, cols, None).unwrap_or_else(|e| panic!("{}", e.message))
    }

    /// Quantizes `x` (rows of `cols`, `cols` a multiple of 32), the rows split between
    /// `pool`'s threads when there is one (prefill on 2 threads spent 1.5% of its samples
    /// quantizing on the calling thread alone: AVX-512 Q6_K pp128, perf); the same bytes
    /// whatever the split. Its buffers are allocated fallibly (`LLMRT_OUT_OF_MEMORY`
    /// naming them, not an abort).
    pub fn try_quantize(x: &[f32], cols: usize, pool: Option<&crate::backend::cpu::pool::Pool>) -> crate::Result<QAct> {
        assert!(
            cols.is_multiple_of(QK) && x.len().is_multiple_of(cols),
            "activation rows of {cols} cannot be quantized"
        );
        let t = x.len() / cols;
        let mut qs = crate::util::try_vec(x.len(), 0i8, "the step's quantized activations")?;
        let mut d = crate::util::try_vec(x.len() / QK, 0f32, "the step's activation scales")?;
        let mut sums = crate::util::try_vec(x.len() / QK, 0i32, "the step's activation sums")?;
        let mut lo = crate::util::try_vec(x.len() / QK, 0i32, "the step's activation half sums")?;
        let nb = cols / QK;
        // Whole rows per part (at most 4 parts per thread), handed out by `par_units`; each
        // block is quantized alone, so the bytes do not depend on the split.
        let per = t.div_ceil(4 * pool.map_or(1, |p| p.threads())).max(1);
        let mut parts: Vec<Part<'_>> = x
            .chunks(per * cols)
            .zip(qs.chunks_mut(per * cols))
            .zip(d.chunks_mut(per * nb))
            .zip(sums.chunks_mut(per * nb).zip(lo.chunks_mut(per * nb)))
            .map(|(((x, q), d), (s, l))| (x, q, d, s, l))
            .collect();
        let run = |(x, q, d, s, l): &mut Part<'_>| match isa() {
            // SAFETY: `Avx512Vnni` is only chosen on CPUs with AVX-512 F/BW/VL.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => unsafe { quantize_avx512(x, q, d, (s, l)) },
            // SAFETY: `Avx2` is only chosen on CPUs with AVX2 + FMA + F16C.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { quantize_avx2(x, q, d, (s, l)) },
            _ => quantize_blocks(x, q, d, (s, l)),
        };
        match pool {
            Some(pool) => crate::backend::cpu::pool::par_units(pool, &mut parts, 1, per * cols, 1, |_, ps| {
                ps.iter_mut().for_each(run)
            }),
            None => parts.iter_mut().for_each(run),
        }
        Ok(QAct { qs, d, sums, lo, cols, t })
    }
}

/// Rows of activations and their quantization's outputs (`qs`, `d`, `sums`, `lo`).
type Part<'a> = (&'a [f32], &'a mut [i8], &'a mut [f32], &'a mut [i32], &'a mut [i32]);

/// The quantization of [`QAct::quantize`], block by block (exact element-wise
/// operations and an exact maximum: the same bytes whatever the vector width).
#[inline(always)]
fn quantize_blocks(x: &[f32], qs: &mut [i8], d: &mut [f32], (sums, lo): (&mut [i32], &mut [i32])) {
    let blocks = x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).zip(d.iter_mut()).zip(sums.iter_mut().zip(lo));
    for (((xb, qb), db), (sb, lb)) in blocks {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = amax / 127.0;
        let (pre, id) = block_scales(amax);
        for (q, &v) in qb.iter_mut().zip(xb) {
            *q = round_to_i8(v * pre * id);
        }
        *db = s;
        *lb = qb[..QK / 2].iter().map(|&q| q as i32).sum();
        *sb = *lb + qb[QK / 2..].iter().map(|&q| q as i32).sum::<i32>();
    }
}

/// The two factors of a block's quantization, `q = round(v * pre * id)`: `pre`
/// 1 and `id = 127 / amax` for every block whose `127 / amax` is finite. For a
/// block of tiny values (amax below about 3.7e-37, where `127 / amax` overflows
/// to infinity and every value would land on +127 or -128), `pre = 2^64` and
/// `id = 127 / (amax * 2^64)`: both products are exact scalings by a power of
/// two, so the integers are the ones the block scaled into the normal range
/// gets, in the symmetric range -127..=127 like every other block.
#[inline(always)]
fn block_scales(amax: f32) -> (f32, f32) {
    const TWO64: f32 = 18_446_744_073_709_551_616.0;
    if amax / 127.0 == 0.0 {
        (1.0, 0.0)
    } else if (127.0 / amax).is_infinite() {
        (TWO64, 127.0 / (amax * TWO64))
    } else {
        (1.0, 127.0 / amax)
    }
}

/// [`quantize_blocks`] with AVX-512 intrinsics, byte for byte the same (the
/// maximum ignores NaN as `f32::max` does; rounding as [`round_to_i8`]: clamp,
/// truncate, adjust by the exact remainder, NaN to 0, saturate to i8).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn quantize_avx512(x: &[f32], qs: &mut [i8], d: &mut [f32], (sums, lo): (&mut [i32], &mut [i32])) {
    use std::arch::x86_64::*;
    let nb = x.len() / QK;
    assert!(qs.len() >= nb * QK && d.len() >= nb && sums.len() >= nb && lo.len() >= nb);
    let one = _mm512_set1_epi32(1);
    // SAFETY: (whole loop) the CPU has this function's target features (it is reached only
    // through the kernel set `isa()` detected); block `b` reads x[32b..32b + 32] and writes
    // qs[32b..32b + 32], d[b], sums[b], lo[b], all in bounds (asserted above).
    unsafe {
        for b in 0..nb {
            let p = x.as_ptr().add(b * QK);
            let xv = [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))];
            // MAXPS returns its second operand when either is NaN: the running
            // maximum (never NaN) goes second, so NaNs are skipped like f32::max.
            let m = _mm512_max_ps(_mm512_abs_ps(xv[1]), _mm512_max_ps(_mm512_abs_ps(xv[0]), _mm512_setzero_ps()));
            let amax = _mm512_reduce_max_ps(m);
            let s = amax / 127.0;
            let (pre, id) = block_scales(amax);
            *d.get_unchecked_mut(b) = s;
            let mut isum = _mm512_setzero_si512();
            for (h, &xh) in xv.iter().enumerate() {
                let v = _mm512_mul_ps(_mm512_mul_ps(xh, _mm512_set1_ps(pre)), _mm512_set1_ps(id));
                let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
                let v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-128.0)), _mm512_set1_ps(128.0));
                let i = _mm512_cvttps_epi32(v);
                let f = _mm512_sub_ps(v, _mm512_cvtepi32_ps(i));
                let i = _mm512_mask_add_epi32(i, _mm512_cmp_ps_mask::<_CMP_GE_OQ>(f, _mm512_set1_ps(0.5)), i, one);
                let i = _mm512_mask_sub_epi32(i, _mm512_cmp_ps_mask::<_CMP_LE_OQ>(f, _mm512_set1_ps(-0.5)), i, one);
                let i = _mm512_min_epi32(_mm512_maskz_mov_epi32(!nan, i), _mm512_set1_epi32(127));
                _mm_storeu_si128(qs.as_mut_ptr().add(b * QK + 16 * h) as *mut __m128i, _mm512_cvtepi32_epi8(i));
                isum = _mm512_add_epi32(isum, i);
                if h == 0 {
                    *lo.get_unchecked_mut(b) = _mm512_reduce_add_epi32(isum);
                }
            }
            *sums.get_unchecked_mut(b) = _mm512_reduce_add_epi32(isum);
        }
    }
}

/// [`quantize_blocks`] with AVX2 intrinsics, byte for byte the same (as
/// [`quantize_avx512`], in four vectors of 8 per block). The portable loop, which the
/// AVX2 kernels took until 2026-12-06, is not vectorized (its maximum keeps `f32::max`'s
/// NaN rule): decode quantizes each input on the calling thread alone, and perf put
/// 1.4-1.6% of AVX2 Q3_K_M tg at 2 threads there (about 3% of the calling thread, the
/// worker waiting); with this loop 0.5%.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_avx2(x: &[f32], qs: &mut [i8], d: &mut [f32], (sums, lo): (&mut [i32], &mut [i32])) {
    use std::arch::x86_64::*;
    let nb = x.len() / QK;
    assert!(qs.len() >= nb * QK && d.len() >= nb && sums.len() >= nb && lo.len() >= nb);
    let sign = _mm256_set1_ps(-0.0);
    // The i32 lanes' sum (exact).
    let hsum = |v: __m256i| {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)))
    };
    // SAFETY: (whole loop) the CPU has this function's target features (it is reached only
    // through the kernel set `isa()` detected); block `b` reads x[32b..32b + 32] and writes
    // qs[32b..32b + 32], d[b], sums[b], lo[b], all in bounds (asserted above).
    unsafe {
        for b in 0..nb {
            let p = x.as_ptr().add(b * QK);
            let xv: [__m256; 4] = std::array::from_fn(|k| _mm256_loadu_ps(p.add(8 * k)));
            // MAXPS returns its second operand when either is NaN: the running maximum
            // (never NaN) goes second, so NaNs are skipped like f32::max.
            let mut m = _mm256_setzero_ps();
            for &v in &xv {
                m = _mm256_max_ps(_mm256_andnot_ps(sign, v), m);
            }
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps::<0b01>(m4, m4)));
            let (pre, id) = block_scales(amax);
            *d.get_unchecked_mut(b) = amax / 127.0;
            let i: [__m256i; 4] = std::array::from_fn(|k| {
                let v = _mm256_mul_ps(_mm256_mul_ps(xv[k], _mm256_set1_ps(pre)), _mm256_set1_ps(id));
                let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
                let v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-128.0)), _mm256_set1_ps(128.0));
                let i = _mm256_cvttps_epi32(v);
                let f = _mm256_sub_ps(v, _mm256_cvtepi32_ps(i));
                // Compare masks are -1 where true: subtracting the first adds one.
                let up = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(f, _mm256_set1_ps(0.5)));
                let down = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(f, _mm256_set1_ps(-0.5)));
                let i = _mm256_add_epi32(_mm256_sub_epi32(i, up), down);
                _mm256_min_epi32(_mm256_andnot_si256(nan, i), _mm256_set1_epi32(127))
            });
            // i32 -> i8 (every value in -128..=127: the saturating packs change none), then
            // the packs' 128-bit lane interleave undone.
            let w = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
            let w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(qs.as_mut_ptr().add(b * QK) as *mut __m256i, w);
            let l = hsum(_mm256_add_epi32(i[0], i[1]));
            *lo.get_unchecked_mut(b) = l;
            *sums.get_unchecked_mut(b) = l + hsum(_mm256_add_epi32(i[2], i[3]));
        }
    }
}

/// `v.round() as i8` (halves away from zero; saturating; NaN -> 0) without a
/// libm call, so the quantization loop vectorizes: after clamping to
/// [-128, 128] the truncation and the remainder `v - trunc(v)` are exact.
#[inline(always)]
pub fn round_to_i8(v: f32) -> i8 {
    let v = v.clamp(-128.0, 128.0);
    let i = v as i32; // NaN -> 0
    let f = v - i as f32;
    (i + (f >= 0.5) as i32 - (f <= -0.5) as i32).clamp(-128, 127) as i8
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
/// Token rows processed per pass over a weight tile, sized so that the
/// activations stay in the L2 cache while the weights stream once.
pub(crate) fn token_chunk(t: usize, act_row_bytes: usize) -> usize {
    let fit = (512 * 1024 / act_row_bytes.max(1)).max(4) / 4 * 4;
    fit.min(t).max(1)
}

#[cfg(target_arch = "x86_64")]
/// `acc + sum over groups of 4 of u8(a) * i8(b)` (VPDPBUSD on zmm; exact).
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
pub(crate) unsafe fn dpbusd512(
    acc: std::arch::x86_64::__m512i,
    a: std::arch::x86_64::__m512i,
    b: std::arch::x86_64::__m512i,
) -> std::arch::x86_64::__m512i {
    let mut r = acc;
    // SAFETY: VPDPBUSD needs AVX-512 F + VNNI, this function's target features
    // (its callers, `qpack`'s kernels, run only when `isa()` detected them); it
    // only reads and writes the named registers.
    unsafe {
        std::arch::asm!(
            "vpdpbusd {r}, {a}, {b}",
            r = inout(zmm_reg) r,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    r
}

#[cfg(target_arch = "x86_64")]
/// [`dpbusd512`] against the signed bytes of the dword at `b + OFF` in every lane, read by
/// the instruction itself (an embedded broadcast, `{1to16}`, the offset in the address):
/// one fused micro-op where a separate broadcast load and the product are two.
///
/// # Safety
/// The CPU has AVX-512 F + VNNI; 4 bytes at `b + OFF` are readable.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
pub(crate) unsafe fn dpbusd512_bcast<const OFF: usize>(
    acc: std::arch::x86_64::__m512i,
    a: std::arch::x86_64::__m512i,
    b: *const u8,
) -> std::arch::x86_64::__m512i {
    let mut r = acc;
    // SAFETY: VPDPBUSD needs AVX-512 F + VNNI (the caller's CPU has them); it reads the 4
    // bytes at `b + OFF` (readable: caller) and writes only `r`.
    unsafe {
        std::arch::asm!(
            "vpdpbusd {r}, {a}, dword ptr [{b} + {off}]{{1to16}}",
            r = inout(zmm_reg) r,
            a = in(zmm_reg) a,
            b = in(reg) b,
            off = const OFF,
            options(pure, readonly, nostack, preserves_flags)
        );
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_to_i8_is_round_then_saturating_cast() {
        let mut vals =
            vec![0.5f32, -0.5, 1.5, -1.5, 2.5, 126.5, 127.5, -127.5, -128.5, 127.49999, 0.49999997, -0.49999997];
        vals.extend([
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e30,
            -1e30,
            128.0,
            -129.0,
            f32::MIN_POSITIVE,
        ]);
        let mut rng = crate::util::XorShift::new(0x1234_5678);
        for _ in 0..100_000 {
            let x = rng.next_u64() as u32;
            vals.push(f32::from_bits(x) % 300.0);
            vals.push((x as f32 / u32::MAX as f32) * 260.0 - 130.0);
        }
        for v in vals {
            assert_eq!(round_to_i8(v), v.round() as i8, "{v:e}");
        }
    }

    /// Split between a pool's threads, the quantization gives the bytes it gives on one.
    #[test]
    fn quantize_on_a_pool_equals_quantize() {
        let mut rng = crate::util::XorShift::new(5);
        for threads in [2, 3] {
            let pool = crate::backend::cpu::pool::Pool::new(threads);
            // 2048 columns: enough work per part for `par_units` to split it (96: one part).
            for (t, cols) in [(1, 96), (2, 96), (5, 96), (13, 96), (64, 96), (13, 2048), (64, 2048)] {
                let x = rng.vec(t * cols, -3.0, 3.0);
                let (a, b) = (QAct::quantize(&x, cols), QAct::try_quantize(&x, cols, Some(&pool)).unwrap());
                assert_eq!((&a.qs, &a.sums, &a.lo), (&b.qs, &b.sums, &b.lo), "{threads} threads, {t} tokens");
                assert!(a.d.iter().zip(&b.d).all(|(p, q)| p.to_bits() == q.to_bits()));
                assert_eq!((b.t, b.cols), (t, cols));
            }
        }
    }

    /// Every quantization path gives the same bytes as the portable one, on
    /// random rows and on the edge cases: exact halves, NaN, infinities, zeros,
    /// subnormal blocks, a block of one sign.
    #[test]
    fn quantize_paths_agree() {
        let mut x = crate::util::XorShift::new(0x2545_F491_4F6C_DD1D).vec(QK * 64, -4.0, 4.0);
        // Block 1: values landing exactly on halves (amax 127 -> id 1).
        for (j, v) in x[QK..2 * QK].iter_mut().enumerate() {
            *v = if j == 0 { 127.0 } else { j as f32 - 16.5 };
        }
        x[2 * QK + 3] = f32::NAN;
        x[3 * QK + 5] = f32::INFINITY;
        x[4 * QK + 7] = f32::NEG_INFINITY;
        x[5 * QK..6 * QK].fill(0.0);
        for v in x[6 * QK..7 * QK].iter_mut() {
            *v = 1e-40;
        }
        x[7 * QK..8 * QK].fill(f32::NAN);
        for v in x[8 * QK..9 * QK].iter_mut() {
            *v = -v.abs();
        }
        // Blocks 9 and 10: mixed signs, amax subnormal (1e-40) and tiny normal
        // (1e-38), where 127 / amax overflows.
        let mut rng = crate::util::XorShift::new(99);
        for (b, scale) in [(9, 1e-40f32), (10, 1e-38)] {
            for v in x[b * QK..(b + 1) * QK].iter_mut() {
                *v = rng.vec(1, -1.0, 1.0)[0] * scale;
            }
        }
        let n = x.len();
        let (mut q0, mut d0, mut s0, mut l0) =
            (vec![0i8; n], vec![0f32; n / QK], vec![0i32; n / QK], vec![0i32; n / QK]);
        quantize_blocks(&x, &mut q0, &mut d0, (&mut s0, &mut l0));
        let mut want_q = vec![0i8; n];
        for (b, (xb, qb)) in x.chunks_exact(QK).zip(want_q.chunks_exact_mut(QK)).enumerate() {
            let amax = xb.iter().filter(|v| !v.is_nan()).fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m });
            // Quantization is invariant under scaling by a power of two: tiny
            // blocks are expected to give the integers of the block times 2^64.
            let s = amax / 127.0;
            let k = if s != 0.0 && (127.0 / amax).is_infinite() { 18_446_744_073_709_551_616.0f32 } else { 1.0 };
            let id = if s != 0.0 { 127.0 / (amax * k) } else { 0.0 };
            for (q, &v) in qb.iter_mut().zip(xb) {
                let r = (v * k * id).round();
                *q = if r.is_nan() { 0 } else { r.clamp(-128.0, 127.0) as i8 };
            }
            assert_eq!(d0[b].to_bits(), s.to_bits(), "block {b}");
        }
        assert_eq!(q0, want_q);
        for (b, qb) in q0.chunks_exact(QK).enumerate() {
            let half = |r: std::ops::Range<usize>| qb[r].iter().map(|&q| q as i32).sum::<i32>();
            assert_eq!((l0[b], s0[b]), (half(0..16), half(0..32)), "block {b}'s sums");
        }
        // The symmetric range: no -128 (the AVX2 sign trick negates activations).
        assert!(!q0.contains(&-128), "an activation quantized to -128");
        assert!(q0[9 * QK..11 * QK].iter().any(|&q| q < -100) && q0[9 * QK..11 * QK].iter().any(|&q| q > 100));
        #[cfg(target_arch = "x86_64")]
        for simd in [Isa::Avx2, Isa::Avx512Vnni] {
            let best = detect();
            if best == Isa::Scalar || (simd == Isa::Avx512Vnni && best != Isa::Avx512Vnni) {
                continue;
            }
            let (mut q1, mut d1, mut s1, mut l1) =
                (vec![0i8; n], vec![0f32; n / QK], vec![0i32; n / QK], vec![0i32; n / QK]);
            // SAFETY: the CPU has AVX2 + FMA (any SIMD kernel set detected) and for
            // `Avx512Vnni` AVX-512 F/BW/VL (detected).
            unsafe {
                if simd == Isa::Avx2 {
                    quantize_avx2(&x, &mut q1, &mut d1, (&mut s1, &mut l1))
                } else {
                    quantize_avx512(&x, &mut q1, &mut d1, (&mut s1, &mut l1))
                }
            };
            assert_eq!(q1, q0);
            assert_eq!(
                d1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                d0.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
            assert_eq!(s1, s0);
            assert_eq!(l1, l0);
        }
    }
}
