//! Host kernels behind a seam: every op the forward pass calls. Reductions have a
//! fixed order that depends only on the operand lengths, never on the batch or
//! the thread count, so a sequence's results are the same alone or batched.

use crate::quant::{self, DType};

/// Work below this many multiply-adds runs on the calling thread.
const PAR_THRESHOLD: usize = 1 << 15;

/// Splits `data` (made of `units` units of `unit_len` items) into up to `threads`
/// contiguous parts and runs `f(first_unit, part)` on each, in parallel.
pub fn par_units<T: Send>(
    data: &mut [T],
    unit_len: usize,
    threads: usize,
    work_per_unit: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let units = data.len().checked_div(unit_len).unwrap_or(0);
    let threads = threads.max(1).min(units.max(1));
    if threads == 1 || units.saturating_mul(work_per_unit) < PAR_THRESHOLD {
        f(0, data);
        return;
    }
    let per = units.div_ceil(threads);
    std::thread::scope(|s| {
        let f = &f;
        for (i, part) in data.chunks_mut(per * unit_len).enumerate() {
            s.spawn(move || f(i * per, part));
        }
    });
}

/// `y[t] = x[t] / rms(x[t]) * w` for each row of length `w.len()`.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let n = w.len();
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        rmsnorm_row(xr, w, eps, yr);
    }
}

/// One row of [`rmsnorm`] (also used per head for Q/K norm).
pub fn rmsnorm_row(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32;
    for ((yo, &xi), &wi) in y.iter_mut().zip(x).zip(w) {
        *yo = xi * scale * wi;
    }
}

/// `y[t][r] = dot(W[r], x[t])` for `t < T` tokens: W is `rows x cols` in
/// `dtype` (`row_bytes` per row), x is `T x cols`, y is `T x rows`. Each weight
/// row is read once for all tokens.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    dtype: DType,
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    cols: usize,
    x: &[f32],
    y: &mut [f32],
    threads: usize,
) {
    let t_count = x.len() / cols;
    debug_assert_eq!(y.len(), t_count * rows);
    if t_count == 1 {
        par_units(y, 1, threads, cols, |r0, part| {
            for (i, out) in part.iter_mut().enumerate() {
                let r = r0 + i;
                *out = quant::dot_row(dtype, &w[r * row_bytes..(r + 1) * row_bytes], x);
            }
        });
        return;
    }
    // Row-major over weights: tmp[r][t], transposed into y afterwards.
    let mut tmp = vec![0f32; rows * t_count];
    par_units(&mut tmp, t_count, threads, cols * t_count, |r0, part| {
        for (i, outs) in part.chunks_exact_mut(t_count).enumerate() {
            let r = r0 + i;
            let row = &w[r * row_bytes..(r + 1) * row_bytes];
            for (t, out) in outs.iter_mut().enumerate() {
                *out = quant::dot_row(dtype, row, &x[t * cols..(t + 1) * cols]);
            }
        }
    });
    for r in 0..rows {
        for t in 0..t_count {
            y[t * rows + r] = tmp[r * t_count + t];
        }
    }
}

/// Adds `b` to every row of `x`.
pub fn add_bias(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        for (v, &bi) in row.iter_mut().zip(b) {
            *v += bi;
        }
    }
}

/// `x += y`.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `g = silu(g) * u`.
pub fn swiglu(g: &mut [f32], u: &[f32]) {
    for (a, &b) in g.iter_mut().zip(u) {
        let s = *a / (1.0 + (-*a).exp());
        *a = s * b;
    }
}

/// Rotates every head of one token's `x` (heads of `head_dim`) by `cos`/`sin`
/// (`head_dim / 2` each). `neox`: pairs (i, i + d/2); else pairs (2i, 2i+1).
pub fn rope(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32], neox: bool) {
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let (a, b) = if neox { (i, i + half) } else { (2 * i, 2 * i + 1) };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos[i] - x1 * sin[i];
            head[b] = x0 * sin[i] + x1 * cos[i];
        }
    }
}

/// Index of the largest value (the first one on ties).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Plain dot product of two f32 slices with a fixed 8-lane order.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `y += a * x`.
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o += a * v;
    }
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

    #[test]
    fn rmsnorm_matches_definition() {
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

    #[test]
    fn argmax_takes_first_of_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn par_units_covers_every_unit_once() {
        let mut v = vec![0u32; 1000 * 7];
        par_units(&mut v, 7, 3, 1 << 20, |u0, part| {
            for (i, c) in part.chunks_exact_mut(7).enumerate() {
                for x in c {
                    *x += (u0 + i) as u32 + 1;
                }
            }
        });
        for (u, c) in v.chunks_exact(7).enumerate() {
            assert!(c.iter().all(|&x| x == u as u32 + 1));
        }
    }
}
