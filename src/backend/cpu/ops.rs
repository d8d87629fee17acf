//! Host kernels behind a seam: every op the forward pass calls. Reductions have a
//! fixed order that depends only on the operand lengths, never on the batch or
//! the thread count, so a sequence's results are the same alone or batched.

use super::pool::{Pool, SendPtr};
use super::{fpack, qpack};
use super::simd::{self, QAct};
use crate::quant::DType;
use std::cell::OnceCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Work below this many multiply-adds runs on the calling thread.
const PAR_THRESHOLD: usize = 1 << 15;

/// Splits `data` (made of `units` units of `unit_len` items, the last one
/// possibly partial) into chunks of whole units (a multiple of `align` units) that the pool's threads take in
/// turn, and runs `f(first_unit, chunk)` on each. Which thread computes a unit
/// never changes how it is computed, so results do not depend on the thread count.
pub fn par_units<T: Send>(
    pool: &Pool,
    data: &mut [T],
    unit_len: usize,
    work_per_unit: usize,
    align: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let units = data.len().checked_div(unit_len).unwrap_or(0);
    let threads = pool.threads();
    if threads == 1 || units < 2 || units.saturating_mul(work_per_unit) < PAR_THRESHOLD {
        f(0, data);
        return;
    }
    // Guided self-scheduling: each take is 1/threads of what is left (whole
    // `align` units, at least one): long runs first (decode streams each chunk
    // of weights from memory, and restarts cost), then shrinking chunks, so the
    // threads finish close together even on a shared, noisy machine. (Measured
    // on TinyLlama Q4_0 decode, 2 threads: 1/threads 98.8 t/s, 1/(2 threads)
    // 92.8, 1/(4 threads) 91.4, same minute.)
    let align = align.max(1);
    let next = AtomicUsize::new(0);
    let base = SendPtr(data.as_mut_ptr());
    let total = data.len();
    pool.run(&|_| loop {
        let mut u0 = next.load(Ordering::Relaxed);
        let take = loop {
            if u0 >= units {
                return;
            }
            let left = units - u0;
            let take = (left / threads).div_ceil(align).max(1).saturating_mul(align).min(left);
            match next.compare_exchange_weak(u0, u0 + take, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break take,
                Err(now) => u0 = now,
            }
        };
        let lo = u0 * unit_len;
        // The last chunk also takes a partial unit at the end, if any.
        let hi = if u0 + take == units { total } else { (u0 + take) * unit_len };
        let p = base;
        // SAFETY: each range `u0..u0 + take` is handed out once (the atomic
        // compare-exchange), the ranges are disjoint and inside `data`, and `data`
        // stays exclusively borrowed until `pool.run` returns after every part has
        // finished.
        let part = unsafe { std::slice::from_raw_parts_mut(p.0.add(lo), hi - lo) };
        f(u0, part);
    });
}

/// A matrix repacked at load for this CPU's kernels.
pub enum Pack {
    Q(qpack::Packed),
    F(fpack::Packed),
}

/// The activations of one matmul input: f32 rows, quantized to 8 bits the first
/// time a quantized weight needs them (then reused by every matrix that reads
/// the same input in this step).
pub struct Act<'a> {
    pub x: &'a [f32],
    pub cols: usize,
    q: OnceCell<QAct>,
}

impl<'a> Act<'a> {
    pub fn new(x: &'a [f32], cols: usize) -> Act<'a> {
        Act { x, cols, q: OnceCell::new() }
    }

    fn quantized(&self) -> &QAct {
        self.q.get_or_init(|| QAct::quantize(self.x, self.cols))
    }
}

/// `y[t][r] = dot(W[r], x[t])` for `t < T` tokens: W is `rows x cols` in
/// `dtype` (`row_bytes` per row), x is `T x cols`, y is `T x rows`. Tiles of
/// weight rows are read once for all tokens (see `simd`). `packed`: the same
/// matrix repacked for the block-order kernels (`qpack`), used when present.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    pool: &Pool,
    dtype: DType,
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    packed: Option<&Pack>,
    act: &Act<'_>,
    y: &mut [f32],
) {
    let cols = act.cols;
    let t_count = act.x.len() / cols;
    debug_assert_eq!(y.len(), t_count * rows);
    let isa = simd::isa();
    let quant = matches!(dtype, DType::Q8_0 | DType::Q4_0);
    let qa = if quant { Some(act.quantized()) } else { None };
    let packed = packed.filter(|p| match p {
        Pack::Q(q) => quant && q.rows == rows && q.cols == cols && q.dtype == dtype,
        Pack::F(f) => dtype == DType::F16 && f.rows == rows && f.cols == cols,
    });
    let x = act.x;
    let run = |r0: usize, part: &mut [f32]| {
        let n = part.len() / t_count;
        let wr = &w[r0 * row_bytes..(r0 + n) * row_bytes];
        match (qa, packed) {
            (Some(qa), Some(Pack::Q(p))) => qpack::gemm(isa, p, r0, n, qa, part),
            (Some(qa), _) => simd::gemm_q(isa, dtype, wr, row_bytes, n, qa, part),
            (None, Some(Pack::F(p))) => fpack::gemm(isa, p, r0, n, x, part),
            _ => simd::gemm_f(isa, dtype, wr, row_bytes, n, x, cols, part),
        }
    };
    // Packed groups of rows are never split between threads.
    let align = match packed {
        Some(Pack::Q(_)) => qpack::ALIGN,
        Some(Pack::F(_)) => fpack::GROUP,
        None => 4,
    };
    if t_count == 1 {
        par_units(pool, y, 1, cols, align, run);
        return;
    }
    // Row-major over weights: tmp[r][t], transposed into y afterwards.
    let mut tmp = vec![0f32; rows * t_count];
    par_units(pool, &mut tmp, t_count, cols * t_count, align, run);
    // Blocked transpose: contiguous writes, reads from a few dozen lines.
    for r0 in (0..rows).step_by(64) {
        let r1 = (r0 + 64).min(rows);
        for t in 0..t_count {
            for (o, r) in y[t * rows + r0..t * rows + r1].iter_mut().zip(r0..r1) {
                *o = tmp[r * t_count + t];
            }
        }
    }
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

/// `y += a * x`.
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o += a * v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every item is visited once, with the unit index of its chunk, whatever
    /// the thread count, including a partial last unit.
    #[test]
    fn par_units_covers_every_item_once() {
        for threads in 1..=3 {
            let pool = Pool::new(threads);
            for (len, unit, align) in [(1000usize, 256usize, 1usize), (4096, 1, 64), (5632, 256, 1), (77, 8, 2)] {
                let mut data = vec![0usize; len];
                par_units(&pool, &mut data, unit, PAR_THRESHOLD, align, |u0, part| {
                    for (i, v) in part.iter_mut().enumerate() {
                        *v += u0 * unit + i + 1;
                    }
                });
                assert!(data.iter().enumerate().all(|(i, &v)| v == i + 1), "threads {threads} len {len} unit {unit}");
            }
        }
    }

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
        let pool = Pool::new(3);
        par_units(&pool, &mut v, 7, 1 << 20, 4, |u0, part| {
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
