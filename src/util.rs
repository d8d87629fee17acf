//! Small pieces more than one layer needs: the argmax every greedy path takes
//! (first index on ties), fallible buffers for step scratch ([`try_vec`],
//! [`try_collect`]: an allocation failure is `LLMRT_OUT_OF_MEMORY` naming the
//! buffer and its size, never an abort), the seeded xorshift generator behind
//! synthetic models and every test's random inputs, and two small checksums
//! ([`crc32`], [`Fnv1a64`]) for saved cache states.

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

/// CRC-32 (IEEE 802.3: reflected polynomial 0xEDB88320, initial value and final xor
/// 0xFFFFFFFF; `crc32(b"123456789") == 0xCBF43926`), slicing by 8 bytes. Detects every
/// error burst of up to 32 bits, so every single-bit flip. The checksum of saved cache states.
pub fn crc32(data: &[u8]) -> u32 {
    crc32_update(0, data)
}

/// [`crc32`] continued: `crc32_update(crc32(a), b) == crc32(a ++ b)`.
pub fn crc32_update(crc: u32, data: &[u8]) -> u32 {
    let t = &CRC32_TABLES;
    let mut c = !crc;
    let mut chunks = data.chunks_exact(8);
    for ch in &mut chunks {
        let lo = c ^ u32::from_le_bytes([ch[0], ch[1], ch[2], ch[3]]);
        let hi = u32::from_le_bytes([ch[4], ch[5], ch[6], ch[7]]);
        c = t[7][(lo & 0xFF) as usize]
            ^ t[6][((lo >> 8) & 0xFF) as usize]
            ^ t[5][((lo >> 16) & 0xFF) as usize]
            ^ t[4][(lo >> 24) as usize]
            ^ t[3][(hi & 0xFF) as usize]
            ^ t[2][((hi >> 8) & 0xFF) as usize]
            ^ t[1][((hi >> 16) & 0xFF) as usize]
            ^ t[0][(hi >> 24) as usize];
    }
    for &b in chunks.remainder() {
        c = t[0][((c ^ b as u32) & 0xFF) as usize] ^ (c >> 8);
    }
    !c
}

/// `CRC32_TABLES[k][b]`: the CRC register after byte `b` followed by `k` zero bytes.
static CRC32_TABLES: [[u32; 256]; 8] = {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let p = t[k - 1][i];
            t[k][i] = t[0][(p & 0xFF) as usize] ^ (p >> 8);
            i += 1;
        }
        k += 1;
    }
    t
};

/// FNV-1a, 64 bits (offset basis 0xcbf29ce484222325, prime 0x100000001b3): a cheap
/// identity hash (a model's fingerprint in saved cache states), not a cryptographic one.
#[derive(Clone, Copy, Debug)]
pub struct Fnv1a64(u64);

impl Default for Fnv1a64 {
    fn default() -> Self {
        Fnv1a64::new()
    }
}

impl Fnv1a64 {
    pub const fn new() -> Fnv1a64 {
        Fnv1a64(0xcbf2_9ce4_8422_2325)
    }

    /// Feeds `bytes`.
    pub fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        self
    }

    /// Feeds `v` as 8 little-endian bytes.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    /// Feeds a string's length, then its bytes (so `("ab", "c")` and `("a", "bc")` differ).
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }

    pub fn finish(&self) -> u64 {
        self.0
    }
}

/// Seconds of the fastest of several runs of `f` after one untimed warm-up: at least 5,
/// and more until half a second has passed (the kernel benchmarks' timer; on a shared
/// machine the minimum is the least disturbed run).
#[cfg(test)]
pub fn best_secs(mut f: impl FnMut()) -> f64 {
    use std::time::Instant;
    f();
    let (mut m, t0) = (f64::MAX, Instant::now());
    for n in 0.. {
        let t = Instant::now();
        f();
        m = m.min(t.elapsed().as_secs_f64());
        if n >= 4 && t0.elapsed().as_secs_f64() > 0.5 {
            break;
        }
    }
    m
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

    #[test]
    fn crc32_and_fnv1a64_match_their_check_values() {
        // The catalogued check values of CRC-32/ISO-HDLC and FNV-1a 64.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"a"), 0xE8B7_BE43);
        assert_eq!(Fnv1a64::new().finish(), 0xcbf2_9ce4_8422_2325);
        assert_eq!(Fnv1a64::new().bytes(b"a").finish(), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(Fnv1a64::new().bytes(b"foobar").finish(), 0x8594_4171_f739_67e8);
        // Slicing by 8 equals the bytewise update at every split and length.
        let data: Vec<u8> = (0..300u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let bytewise = |d: &[u8]| {
            let mut c = !0u32;
            for &b in d {
                c ^= b as u32;
                for _ in 0..8 {
                    c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
                }
            }
            !c
        };
        for n in [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 299, 300] {
            assert_eq!(crc32(&data[..n]), bytewise(&data[..n]), "length {n}");
            for split in [0, 1, 5, n / 2, n] {
                let split = split.min(n);
                assert_eq!(crc32_update(crc32(&data[..split]), &data[split..n]), crc32(&data[..n]), "{n} at {split}");
            }
        }
    }
}
