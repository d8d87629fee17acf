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
//!
//! Both run on the calling thread; the caller spreads copies over threads. Returns
//! None for a kernel set without a probe (scalar, NEON).

use super::isa::Isa;

/// Operations per second (flops or 8-bit ops) of `iters` loop trips on this
/// thread: `(float, int8)`, in G/s.
pub fn peak(isa: Isa, iters: usize) -> Option<(f64, f64)> {
    #[cfg(target_arch = "x86_64")]
    {
        let time = |f: &dyn Fn() -> f64| {
            let t0 = std::time::Instant::now();
            std::hint::black_box(f());
            t0.elapsed().as_secs_f64()
        };
        match isa {
            Isa::Avx2 => {
                // SAFETY: `Avx2` is only chosen on CPUs with AVX2 and FMA.
                let f = time(&|| unsafe { x86::fma256(iters) });
                // SAFETY: as above.
                let i = time(&|| unsafe { x86::dot256(iters) } as f64);
                Some((iters as f64 * 12.0 * 8.0 * 2.0 / f / 1e9, iters as f64 * 12.0 * 32.0 * 2.0 / i / 1e9))
            }
            Isa::Avx512Vnni => {
                // SAFETY: `Avx512Vnni` is only chosen on CPUs with AVX-512 F/BW/VL and VNNI.
                let f = time(&|| unsafe { x86::fma512(iters) });
                // SAFETY: as above.
                let i = time(&|| unsafe { x86::dot512(iters) } as f64);
                Some((iters as f64 * 12.0 * 16.0 * 2.0 / f / 1e9, iters as f64 * 12.0 * 64.0 * 2.0 / i / 1e9))
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
        if let Some((f, i)) = super::peak(isa, 10_000) {
            assert!(f.is_finite() && f > 0.0 && i.is_finite() && i > 0.0, "{f} {i}");
        }
    }
}
