//! Rotary position embedding: the angle tables of a step's positions
//! ([`angles`], computed in f64 and rounded once) and the rotation of every head
//! of Q and K by them ([`rope`]), in the interleaved (pairs `2i, 2i+1`) or neox
//! (pairs `i, i + d/2`) layout.
//!
//! CUDA twin: `backend/cuda/ops/rope.rs`, `kernels/rope.cu` (which also stores K
//! and V into the cache: on the CPU that is `attention::kv_write`).
//!
//! Depends on `pool` (the tokens split between threads, [`rope_par`]) and
//! `model::rope_angles` for the tables.

use crate::backend::cpu::pool::{par_units, Pool};

/// `cos` / `sin` (`inv_freq.len()` values per position) of the angles
/// `pos * inv_freq[i]` for each position of `positions`.
pub(crate) fn angles(
    positions: impl Iterator<Item = usize>,
    inv_freq: &[f64],
    mscale: f32,
    cos: &mut [f32],
    sin: &mut [f32],
) {
    let half = inv_freq.len();
    for (t, pos) in positions.enumerate() {
        let r = t * half..(t + 1) * half;
        crate::model::rope_angles(pos, inv_freq, mscale, &mut cos[r.clone()], &mut sin[r]);
    }
}

/// Rotates every head of one token's `x` (heads of `head_dim`) by `cos`/`sin`
/// (`rope_dim / 2` each, `Config::rope_dim`): the first `rope_dim = 2 * cos.len()`
/// dimensions of each head, the rest left as they are (partial rotary). `neox`: pairs
/// (i, i + rope_dim/2); else pairs (2i, 2i+1).
pub(crate) fn rope(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32], neox: bool) {
    let half = cos.len();
    debug_assert!(2 * half <= head_dim && sin.len() == half);
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let (a, b) = if neox { (i, i + half) } else { (2 * i, 2 * i + 1) };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos[i] - x1 * sin[i];
            head[b] = x0 * sin[i] + x1 * cos[i];
        }
    }
}

/// [`rope`] on every token's row of `x` (rows of `row` values, token `t`'s angles at
/// `t * half` in `cos` / `sin`, `half` their length per position), the tokens split
/// between `pool`'s threads (each row rotated as [`rope`] rotates it, whatever the split).
pub(crate) fn rope_par(
    pool: &Pool,
    x: &mut [f32],
    (row, head_dim, half): (usize, usize, usize),
    (cos, sin): (&[f32], &[f32]),
    neox: bool,
) {
    par_units(pool, x, row, 2 * row, 1, |t0, rows| {
        for (i, r) in rows.chunks_exact_mut(row).enumerate() {
            let t = t0 + i;
            rope(r, head_dim, &cos[t * half..(t + 1) * half], &sin[t * half..(t + 1) * half], neox);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_layouts_rotate_the_right_pairs() {
        let cos = [0.0f32, 1.0];
        let sin = [1.0f32, 0.0];
        let mut a = [1.0f32, 2.0, 3.0, 4.0];
        rope(&mut a, 4, &cos, &sin, false);
        assert_eq!(a, [-2.0, 1.0, 3.0, 4.0]);
        let mut b = [1.0f32, 2.0, 3.0, 4.0];
        rope(&mut b, 4, &cos, &sin, true);
        assert_eq!(b, [-3.0, 2.0, 1.0, 4.0]);
    }

    /// Split between a pool's threads (rows enough for `par_units` to split them), each
    /// token's row is rotated by its own angles, as [`rope`] rotates it alone.
    #[test]
    fn rope_par_equals_rope_row_by_row() {
        let mut rng = crate::util::XorShift::new(17);
        let (n, row, hd, half) = (96, 512, 64, 32);
        let x = rng.vec(n * row, -2.0, 2.0);
        let (cos, sin) = (rng.vec(n * half, -1.0, 1.0), rng.vec(n * half, -1.0, 1.0));
        for neox in [false, true] {
            let mut want = x.clone();
            for (t, r) in want.chunks_exact_mut(row).enumerate() {
                rope(r, hd, &cos[t * half..(t + 1) * half], &sin[t * half..(t + 1) * half], neox);
            }
            for threads in [1, 2, 3] {
                let pool = Pool::new(threads);
                let mut got = x.clone();
                rope_par(&pool, &mut got, (row, hd, half), (&cos, &sin), neox);
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{threads} threads");
            }
        }
    }

    /// Partial rotary: only the first `2 * cos.len()` dimensions of each head turn,
    /// paired within them; the others pass unchanged.
    #[test]
    fn partial_rope_rotates_only_the_leading_dimensions() {
        let (cos, sin) = ([0.0f32], [1.0f32]);
        let mut a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        rope(&mut a, 4, &cos, &sin, true);
        assert_eq!(a, [-2.0, 1.0, 3.0, 4.0, -6.0, 5.0, 7.0, 8.0]);
        let (cos, sin) = ([0.0f32, 1.0], [1.0f32, 0.0]);
        let mut b = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        rope(&mut b, 6, &cos, &sin, true);
        assert_eq!(b, [-3.0, 2.0, 1.0, 4.0, 5.0, 6.0]);
        let mut c = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        rope(&mut c, 6, &cos, &sin, false);
        assert_eq!(c, [-2.0, 1.0, 3.0, 4.0, 5.0, 6.0]);
    }
}
