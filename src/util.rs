//! Small pieces more than one layer needs: the argmax every greedy path takes
//! (first index on ties), fallible buffers for step scratch ([`try_vec`],
//! [`try_collect`]: an allocation failure is `LLMRT_OUT_OF_MEMORY` naming the
//! buffer and its size, never an abort), and the seeded xorshift generator behind
//! synthetic models and every test's random inputs.

use crate::{Error, Result};

/// The error of a failed allocation of `n` values of `T` for `what`.
fn alloc_error<T>(n: usize, what: &str) -> Error {
    let bytes = n.saturating_mul(std::mem::size_of::<T>());
    Error::out_of_memory(format!("cannot allocate {what} ({n} values, {bytes} bytes)"))
}

/// An empty vector with room for `n` values, or `LLMRT_OUT_OF_MEMORY` naming `what`
/// and the size (also for a size past `isize::MAX` bytes).
pub fn try_with_capacity<T>(n: usize, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| alloc_error::<T>(n, what))?;
    Ok(v)
}

/// `n` copies of `value` (a step's scratch buffer), or `LLMRT_OUT_OF_MEMORY` naming
/// `what` and the size instead of an abort.
pub fn try_vec<T: Clone>(n: usize, value: T, what: &str) -> Result<Vec<T>> {
    let mut v = try_with_capacity(n, what)?;
    v.resize(n, value);
    Ok(v)
}

/// The items of `it` (an exact-size iterator) in a vector allocated fallibly.
pub fn try_collect<T>(it: impl ExactSizeIterator<Item = T>, what: &str) -> Result<Vec<T>> {
    let mut v = try_with_capacity(it.len(), what)?;
    v.extend(it);
    Ok(v)
}

/// Index of the largest value (the first one on ties). NaN compares false, so a
/// NaN is chosen only where it stands first and nothing after it is larger.
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// xorshift64*: a deterministic generator for synthetic weights and test inputs
/// (not for sampling: the sampler's draw is `sample::draw(seed, position)`).
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator whose state is `seed` (0 is replaced by 1: xorshift never
    /// leaves 0).
    pub fn new(seed: u64) -> XorShift {
        XorShift(if seed == 0 { 1 } else { seed })
    }

    /// A generator seeded from several numbers (a case's sizes, say), so each
    /// case gets its own inputs.
    pub fn from_parts(parts: &[usize]) -> XorShift {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for &p in parts {
            s = (s ^ p as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9).rotate_left(29);
        }
        XorShift(s | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n > 0`; modulo bias is irrelevant for tests).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `[lo, hi)` from the top 24 bits.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }

    /// `n` values uniform in `[lo, hi)`.
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }

    /// Roughly normal with unit variance (the sum of four 16-bit uniforms of one draw).
    pub fn normal(&mut self) -> f32 {
        let u = self.next_u64();
        let s: f32 = (0..4).map(|k| ((u >> (16 * k)) & 0xFFFF) as f32 / 65536.0 - 0.5).sum();
        s * 1.732
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_first_of_ties_and_nan_only_first() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, 0.5]), 0);
        assert_eq!(argmax(&[0.0, f32::NAN, 2.0]), 2);
        assert_eq!(argmax(&[-1.0]), 0);
    }

    #[test]
    fn xorshift_is_deterministic_and_spread() {
        let (mut a, mut b) = (XorShift::new(7), XorShift::new(7));
        let xs: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        assert!(xs.iter().all(|&x| x == b.next_u64()));
        let mut r = XorShift::from_parts(&[1, 2]);
        let v = r.vec(10_000, -1.0, 1.0);
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.05 && v.iter().all(|x| (-1.0..1.0).contains(x)));
        assert_ne!(XorShift::from_parts(&[1, 2]).next_u64(), XorShift::from_parts(&[2, 1]).next_u64());
    }

    #[test]
    fn fallible_buffers_report_impossible_sizes() {
        assert_eq!(try_vec(3, 1.5f32, "x").unwrap(), vec![1.5; 3]);
        assert_eq!(try_collect([1u8, 2, 3].into_iter(), "y").unwrap(), vec![1, 2, 3]);
        let e = try_vec(usize::MAX / 2, 0f32, "the test's buffer").unwrap_err();
        assert_eq!(e.status, crate::Status::LLMRT_OUT_OF_MEMORY);
        assert!(e.message.contains("the test's buffer") && e.message.contains("bytes"), "{}", e.message);
    }
}
