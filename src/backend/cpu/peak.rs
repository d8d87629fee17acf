//! The arithmetic ceilings of this core (`llmrt-bench --peak`): what the prefill
//! GEMMs are held against in docs/BENCHMARKS.md.
//!
//! - Float: fused multiply-adds on f32 vectors (AVX2: 256-bit, AVX-512: 512-bit),
//!   12 independent accumulators so the loop is bound by the FMA ports, not the
//!   latency. Counted as 2 flops per lane per FMA.
//! - Integer dot: the instruction that multiplies 8-bit values, alone. AVX2:
//!   `vpmaddubsw` (32 u8 x i8 products, added in i16 pairs) with a `vpaddw` to keep
//!   it live, the weights read from memory as the kernels read them; AVX-512 VNNI:
//!   `vpdpbusd` (64 products into i32). 12 independent chains; counted as 2 ops per
//!   8-bit product. Kernels also widen to i32 (`vpmaddwd`, on the same ports on
//!   many cores) and scale per block, so this is a ceiling none reaches.
//! - AVX2 only, the dot products into i32 (`vpdpbusd` does that in one instruction;
//!   AVX2 needs a widening `vpmaddwd` after the `vpmaddubsw`s, on the same ports on
//!   Intel cores): [`Peak::into_i32`], the same 12 chains (a `vpmaddwd` and a
//!   `vpaddd` per `k` products added in i16 first, `k` = 1: any 7-bit operand, the
//!   `vpdpbusd` equivalent; 2: values to 63, as Q6_K's; 4: values to 15, as the
//!   4-bit and smaller types'), and signed products as i16 pairs by `vpmaddwd` alone
//!   (16 per instruction: IQ4_XS's levels, which take no `vpmaddubsw`). Each is the
//!   ceiling of the kernels that multiply that way: what those add on top is the
//!   unpacking, the loads and the scales.
//!
//! All run on the calling thread; the caller spreads copies over threads. Returns
//! None for a kernel set without a probe (scalar, NEON).

use super::isa::Isa;

/// This thread's arithmetic ceilings (see the module docs), in G/s.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Peak {
    /// f32 fused multiply-adds, 2 flops per lane.
    pub flops: f64,
    /// 8-bit products by the multiplying instruction alone, 2 ops per product.
    pub int8: f64,
    /// AVX2: the 8-bit dot products into i32 (2 ops per product), by how they widen:
    /// `(name, Gop/s)`; empty where the integer dot gives i32 itself (VNNI).
    pub into_i32: Vec<(&'static str, f64)>,
}

impl Peak {
    /// Figure by figure `f(self's, other's)` (the same kernel set's probes: the same
    /// figures in the same order).
    pub fn zip_with(&self, other: &Peak, f: impl Fn(f64, f64) -> f64) -> Peak {
        let into_i32 = self.into_i32.iter().zip(&other.into_i32).map(|(&(n, a), &(_, b))| (n, f(a, b))).collect();
        Peak { flops: f(self.flops, other.flops), int8: f(self.int8, other.int8), into_i32 }
    }
}

/// The ceilings of `isa` over `iters` loop trips on this thread.
pub fn peak(isa: Isa, iters: usize) -> Option<Peak> {
    #[cfg(target_arch = "x86_64")]
    {
        let time = |f: &dyn Fn() -> f64| {
            let t0 = std::time::Instant::now();
            std::hint::black_box(f());
            t0.elapsed().as_secs_f64()
        };
        // Ops per second of `iters` trips of 12 chains of `lanes` products each.
        let rate = |lanes: f64, secs: f64| iters as f64 * 12.0 * lanes * 2.0 / secs / 1e9;
        match isa {
            Isa::Avx2 => {
                // SAFETY: `Avx2` is only chosen on CPUs with AVX2 and FMA, all these need.
                let (f, i, w1, w2, w4, m) = unsafe {
                    (
                        time(&|| x86::fma256(iters)),
                        time(&|| x86::dot256(iters) as f64),
                        time(&|| x86::dot256_i32::<1>(iters) as f64),
                        time(&|| x86::dot256_i32::<2>(iters) as f64),
                        time(&|| x86::dot256_i32::<4>(iters) as f64),
                        time(&|| x86::madd256(iters) as f64),
                    )
                };
                Some(Peak {
                    flops: rate(8.0, f),
                    int8: rate(32.0, i),
                    into_i32: vec![
                        ("1 per widening", rate(32.0, w1)),
                        ("2 per widening", rate(32.0, w2)),
                        ("4 per widening", rate(32.0, w4)),
                        ("i16 pairs", rate(16.0, m)),
                    ],
                })
            }
            Isa::Avx512Vnni => {
                // SAFETY: `Avx512Vnni` is only chosen on CPUs with AVX-512 F/BW/VL and VNNI.
                let f = time(&|| unsafe { x86::fma512(iters) });
                // SAFETY: as above.
                let i = time(&|| unsafe { x86::dot512(iters) } as f64);
                Some(Peak { flops: rate(16.0, f), int8: rate(64.0, i), into_i32: Vec::new() })
            }
            _ => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, iters);
        None
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn fma256(iters: usize) -> f64 {
        let m = _mm256_set1_ps(0.999_999);
        let c = _mm256_set1_ps(1e-7);
        let mut a = [_mm256_set1_ps(1.0); 12];
        for _ in 0..iters {
            for v in a.iter_mut() {
                *v = _mm256_fmadd_ps(*v, m, c);
            }
        }
        let mut s = _mm256_setzero_ps();
        for v in a {
            s = _mm256_add_ps(s, v);
        }
        let mut o = [0f32; 8];
        // SAFETY: `o` holds 8 f32 (unaligned store).
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), s) };
        o.iter().map(|&v| v as f64).sum()
    }

    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot256(iters: usize) -> i64 {
        // Twelve different weight vectors (read from memory, as the kernels read
        // theirs) and an activation vector that changes every trip, so nothing can
        // be hoisted or shared between the chains.
        let w: [__m256i; 12] = std::hint::black_box(std::array::from_fn(|k| _mm256_set1_epi8(k as i8 + 1)));
        let step = std::hint::black_box(_mm256_set1_epi8(1));
        let mut x = std::hint::black_box(_mm256_set1_epi8(-2));
        let mut a = [_mm256_setzero_si256(); 12];
        for _ in 0..iters {
            x = _mm256_add_epi8(x, step);
            for (v, w) in a.iter_mut().zip(&w) {
                *v = _mm256_add_epi16(*v, _mm256_maddubs_epi16(*w, x));
            }
        }
        let mut s = _mm256_setzero_si256();
        for v in a {
            s = _mm256_add_epi16(s, v);
        }
        _mm256_extract_epi16::<0>(s) as i64
    }

    /// The chains' i32 sums added, lane 0 (what keeps a probe's chains live).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn sum_i32(a: [__m256i; 12]) -> i64 {
        let s = a.into_iter().fold(_mm256_setzero_si256(), |s, v| _mm256_add_epi32(s, v));
        _mm256_extract_epi32::<0>(s) as i64
    }

    /// `dot256`'s chains into i32: per trip and chain `K` products added in i16, one
    /// `vpmaddwd` against ones and a `vpaddd` (12 / `K` chains of `K` products, so that
    /// every `K` does 12 `vpmaddubsw` per trip).
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot256_i32<const K: usize>(iters: usize) -> i64 {
        let w: [__m256i; 12] = std::hint::black_box(std::array::from_fn(|k| _mm256_set1_epi8(k as i8 + 1)));
        let step = std::hint::black_box(_mm256_set1_epi8(1));
        let ones = std::hint::black_box(_mm256_set1_epi16(1));
        let mut x = std::hint::black_box(_mm256_set1_epi8(-2));
        let mut a = [_mm256_setzero_si256(); 12];
        for _ in 0..iters {
            x = _mm256_add_epi8(x, step);
            for (c, v) in a[..12 / K].iter_mut().enumerate() {
                let mut p = _mm256_maddubs_epi16(w[K * c], x);
                for w in &w[K * c + 1..K * c + K] {
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(*w, x));
                }
                *v = _mm256_add_epi32(*v, _mm256_madd_epi16(p, ones));
            }
        }
        sum_i32(a)
    }

    /// Signed products as i16 pairs: 12 chains of `vpmaddwd` (16 products into i32)
    /// and `vpaddd`.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn madd256(iters: usize) -> i64 {
        let w: [__m256i; 12] = std::hint::black_box(std::array::from_fn(|k| _mm256_set1_epi16(k as i16 + 1)));
        let step = std::hint::black_box(_mm256_set1_epi16(1));
        let mut x = std::hint::black_box(_mm256_set1_epi16(-2));
        let mut a = [_mm256_setzero_si256(); 12];
        for _ in 0..iters {
            x = _mm256_add_epi16(x, step);
            for (v, w) in a.iter_mut().zip(&w) {
                *v = _mm256_add_epi32(*v, _mm256_madd_epi16(*w, x));
            }
        }
        sum_i32(a)
    }

    /// # Safety
    /// The CPU has AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn fma512(iters: usize) -> f64 {
        let m = _mm512_set1_ps(0.999_999);
        let c = _mm512_set1_ps(1e-7);
        let mut a = [_mm512_set1_ps(1.0); 12];
        for _ in 0..iters {
            for v in a.iter_mut() {
                *v = _mm512_fmadd_ps(*v, m, c);
            }
        }
        let mut s = _mm512_setzero_ps();
        for v in a {
            s = _mm512_add_ps(s, v);
        }
        _mm512_reduce_add_ps(s) as f64
    }

    /// # Safety
    /// The CPU has AVX-512 F and VNNI.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) unsafe fn dot512(iters: usize) -> i64 {
        // The accumulator is an operand: the chains cannot be hoisted or shared.
        let w = std::hint::black_box(_mm512_set1_epi8(3));
        let x = std::hint::black_box(_mm512_set1_epi8(-2));
        let mut a = [_mm512_setzero_si512(); 12];
        for _ in 0..iters {
            for v in a.iter_mut() {
                *v = _mm512_dpbusd_epi32(*v, w, x);
            }
        }
        let mut s = _mm512_setzero_si512();
        for v in a {
            s = _mm512_add_epi32(s, v);
        }
        _mm512_reduce_add_epi32(s) as i64
    }
}

#[cfg(test)]
mod tests {
    /// The probe runs on this machine's kernel set and gives positive, finite rates
    /// (or None where there is no probe).
    #[test]
    fn peak_probe_runs() {
        let isa = super::super::isa::isa();
        if let Some(p) = super::peak(isa, 10_000) {
            let all = [p.flops, p.int8].into_iter().chain(p.into_i32.iter().map(|w| w.1));
            assert!(all.clone().all(|r| r.is_finite() && r > 0.0), "{p:?}");
            assert_eq!(p.into_i32.is_empty(), isa != super::super::isa::Isa::Avx2, "{isa:?}: {p:?}");
        }
    }
}
