//! RMSNorm: `y = x / sqrt(mean(x^2) + eps) * w` per row (the attention and
//! feed-forward norms, the final norm) and per head (Q/K norm), the sum of
//! squares accumulated in f64.
//!
//! CUDA twin: `backend/cuda/ops/norm.rs`, `kernels/norm.cu`.
//!
//! Depends on `pool` (the rows split between threads).

use crate::backend::cpu::pool::{par_units, Pool};

/// `y[t] = x[t] / rms(x[t]) * w` for each row of length `w.len()`.
pub(crate) fn rmsnorm(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let n = w.len();
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        rmsnorm_row(xr, w, eps, yr);
    }
}

/// [`rmsnorm`] with the rows split between `pool`'s threads (bit for bit the same: each
/// row is normalized alone). On 2 threads a prefill spent about 0.8% of its samples in
/// the norms on the calling thread alone (AVX-512 Q6_K pp128, perf).
pub(crate) fn rmsnorm_par(pool: &Pool, x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let n = w.len();
    par_units(pool, y, n, 4 * n, 1, |r0, y| rmsnorm(&x[r0 * n..r0 * n + y.len()], w, eps, y));
}

/// One row of [`rmsnorm`] (also used per head for Q/K norm).
pub(crate) fn rmsnorm_row(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let scale = row_scale(x, eps);
    for ((yo, &xi), &wi) in y.iter_mut().zip(x).zip(w) {
        *yo = xi * scale * wi;
    }
}

/// `x += rmsnorm_row(y)` for one row (gemma's post-norms and residual), each value as
/// [`rmsnorm_row`] computes it, then added: bit for bit that row normalized into a
/// buffer and added, without the buffer.
pub(crate) fn add_rmsnormed_row(x: &mut [f32], y: &[f32], w: &[f32], eps: f32) {
    let scale = row_scale(y, eps);
    for ((xo, &yi), &wi) in x.iter_mut().zip(y).zip(w) {
        *xo += yi * scale * wi;
    }
}

/// `1 / sqrt(mean(x^2) + eps)` of a row, the sum of squares in f64.
fn row_scale(x: &[f32], eps: f32) -> f32 {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32
}

/// [`rmsnorm_row`] in place on every head of `x` (heads of `head_dim` values): the
/// Q/K norm of the architectures that have one. Each head's scale is formed from its
/// values first, then each value is replaced as `rmsnorm_row` computes it (bit for bit;
/// until 2026-12-06 through a copy of the head: an allocation per head and token).
pub(crate) fn rmsnorm_heads(x: &mut [f32], head_dim: usize, w: &[f32], eps: f32) {
    for head in x.chunks_exact_mut(head_dim) {
        let scale = row_scale(head, eps);
        for (v, &wi) in head.iter_mut().zip(w) {
            *v = *v * scale * wi;
        }
    }
}

/// [`rmsnorm_heads`] with the heads split between `pool`'s threads (each head
/// normalized alone: the same values whatever the split).
pub(crate) fn rmsnorm_heads_par(pool: &Pool, x: &mut [f32], head_dim: usize, w: &[f32], eps: f32) {
    par_units(pool, x, head_dim, 4 * head_dim, 1, |_, x| rmsnorm_heads(x, head_dim, w, eps));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Q/K norm in place, on one thread or split between several, gives each head
    /// exactly what `rmsnorm_row` gives it from a copy (heads enough for `par_units` to
    /// split them).
    #[test]
    fn rmsnorm_heads_equals_rmsnorm_row_per_head() {
        let mut rng = crate::util::XorShift::new(31);
        let (hd, heads) = (128, 96);
        let x = rng.vec(hd * heads, -4.0, 4.0);
        let w = rng.vec(hd, 0.5, 1.5);
        let mut want = x.clone();
        for (src, dst) in x.chunks_exact(hd).zip(want.chunks_exact_mut(hd)) {
            rmsnorm_row(src, &w, 1e-6, dst);
        }
        let mut got = x.clone();
        rmsnorm_heads(&mut got, hd, &w, 1e-6);
        assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
        for threads in [1, 2, 3] {
            let pool = Pool::new(threads);
            let mut got = x.clone();
            rmsnorm_heads_par(&pool, &mut got, hd, &w, 1e-6);
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{threads} threads");
        }
    }

    #[test]
    fn norm_matches_f64_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let w = [1.0f32, 2.0, 0.5, 1.5];
        let mut y = [0f32; 4];
        rmsnorm(&x, &w, 1e-5, &mut y);
        let ms = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / 4.0;
        for i in 0..4 {
            let want = x[i] as f64 / (ms + 1e-5).sqrt() * w[i] as f64;
            assert!((y[i] as f64 - want).abs() < 1e-6);
        }
    }

    /// Split between 1-3 threads, the norm gives the serial one's bits (row counts past
    /// the split threshold, one odd).
    #[test]
    fn norm_par_equals_serial() {
        let mut r = crate::util::XorShift::new(3);
        let w = r.vec(2048, 0.5, 1.5);
        for rows in [1, 17, 64] {
            let x = r.vec(rows * 2048, -4.0, 4.0);
            let mut want = vec![0f32; x.len()];
            rmsnorm(&x, &w, 1e-5, &mut want);
            for threads in 1..=3 {
                let mut y = vec![0f32; x.len()];
                rmsnorm_par(&Pool::new(threads), &x, &w, 1e-5, &mut y);
                assert!(y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{rows} rows, {threads} threads");
            }
        }
    }
}
