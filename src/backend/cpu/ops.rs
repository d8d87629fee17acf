//! Host kernels behind a seam: every op the forward pass calls. Reductions have a
//! fixed order that depends only on the operand lengths, never on the batch or
//! the thread count, so a sequence's results are the same alone or batched.

use super::pool::{Pool, SendPtr};
use super::{fpack, qpack};
use super::isa::{self, QAct};
use super::simd;
use crate::quant::DType;
use std::cell::OnceCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Work below this many multiply-adds runs on the calling thread.
const PAR_THRESHOLD: usize = 1 << 15;

/// Splits `data` (made of `units` units of `unit_len` items, the last one
/// possibly partial) into chunks of whole units (a multiple of `align` units)
/// that the pool's threads take in turn, and runs `f(first_unit, chunk)` on each. Which thread computes a unit
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

/// One weight matrix as a matmul reads it: `rows x cols` in `dtype` (`row_bytes`
/// per row) and, when present, the same matrix repacked for this CPU's kernels.
#[derive(Clone, Copy)]
pub struct Weight<'a> {
    pub dtype: DType,
    pub w: &'a [u8],
    pub row_bytes: usize,
    pub rows: usize,
    pub packed: Option<&'a Pack>,
}

/// A [`Weight`] bound to one activation set: computes any range of its rows.
struct Bound<'a> {
    m: Weight<'a>,
    qa: Option<&'a QAct>,
    x: &'a [f32],
    cols: usize,
    isa: isa::Isa,
}

impl<'a> Bound<'a> {
    fn new(m: Weight<'a>, act: &'a Act<'_>) -> Bound<'a> {
        let cols = act.cols;
        let quant = matches!(m.dtype, DType::Q8_0 | DType::Q4_0);
        let qa = if quant { Some(act.quantized()) } else { None };
        let packed = m.packed.filter(|p| match p {
            Pack::Q(q) => quant && q.rows == m.rows && q.cols == cols && q.dtype == m.dtype,
            Pack::F(f) => m.dtype == DType::F16 && f.rows == m.rows && f.cols == cols,
        });
        Bound { m: Weight { packed, ..m }, qa, x: act.x, cols, isa: isa::isa() }
    }

    /// Rows per unit of work: packed groups of rows are never split between threads.
    fn align(&self) -> usize {
        match self.m.packed {
            Some(Pack::Q(_)) => qpack::ALIGN,
            Some(Pack::F(_)) => fpack::GROUP,
            None => 4,
        }
    }

    /// Rows `r0..r0 + part.len() / t` into `part` (row-major over rows: `part[i * t + c]`).
    fn run(&self, r0: usize, part: &mut [f32], t: usize) {
        let m = &self.m;
        let n = part.len() / t;
        let wr = &m.w[r0 * m.row_bytes..(r0 + n) * m.row_bytes];
        match (self.qa, m.packed) {
            (Some(qa), Some(Pack::Q(p))) => qpack::gemm(self.isa, p, r0, n, qa, part),
            (Some(qa), _) => simd::gemm_q(self.isa, m.dtype, wr, m.row_bytes, n, qa, part),
            (None, Some(Pack::F(p))) => fpack::gemm(self.isa, p, r0, n, self.x, part),
            _ => simd::gemm_f(self.isa, m.dtype, wr, m.row_bytes, n, self.x, self.cols, part),
        }
    }
}

/// `y[t][r] = dot(W[r], x[t])` for `t < T` tokens: W is `m` (`rows x cols`),
/// x is `T x cols`, y is `T x rows`. Tiles of weight rows are read once for all
/// tokens (see `simd`); `m.packed`, the same matrix repacked for this CPU's
/// kernels (`qpack`, `fpack`), is used when present.
pub fn matmul(pool: &Pool, m: Weight<'_>, act: &Act<'_>, y: &mut [f32]) {
    let rows = m.rows;
    let b = Bound::new(m, act);
    let cols = act.cols;
    let t_count = act.x.len() / cols;
    debug_assert_eq!(y.len(), t_count * rows);
    let align = b.align();
    if t_count == 1 {
        par_units(pool, y, 1, cols, align, |r0, part| b.run(r0, part, 1));
        return;
    }
    // Row-major over weights: tmp[r][t], transposed into y afterwards.
    let mut tmp = vec![0f32; rows * t_count];
    par_units(pool, &mut tmp, t_count, cols * t_count, align, |r0, part| b.run(r0, part, t_count));
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

/// `ys[i] = W_i x` for several matrices reading the same activations (Q, K and V;
/// gate and up). For one token their rows are split between the threads as one
/// range, in one pool run instead of one per matrix (fewer joins, longer
/// streams); the same kernels compute the same rows, so the results are those of
/// [`matmul`] bit for bit. Otherwise (or when the matrices' row counts do not
/// keep the units aligned) one [`matmul`] each.
pub fn matmul_many(pool: &Pool, ms: &[Weight<'_>], act: &Act<'_>, ys: &mut [&mut [f32]]) {
    assert_eq!(ms.len(), ys.len());
    let t_count = act.x.len() / act.cols;
    let bs: Vec<Bound<'_>> = ms.iter().map(|&m| Bound::new(m, act)).collect();
    let align = bs.iter().map(Bound::align).max().unwrap_or(1);
    let aligned = bs.iter().all(|b| align.is_multiple_of(b.align()))
        && bs[..bs.len().saturating_sub(1)].iter().all(|b| b.m.rows.is_multiple_of(align));
    if t_count != 1 || !aligned {
        for (&m, y) in ms.iter().zip(ys.iter_mut()) {
            matmul(pool, m, act, y);
        }
        return;
    }
    let starts: Vec<usize> = bs.iter().scan(0, |acc, b| {
        let s = *acc;
        *acc += b.m.rows;
        Some(s)
    }).collect();
    let total: usize = bs.iter().map(|b| b.m.rows).sum();
    let mut all = vec![0f32; total];
    par_units(pool, &mut all, 1, act.cols, align, |u0, part| {
        // The chunk may span matrices: each piece to its own matrix's rows.
        let mut u = u0;
        let mut part = part;
        while !part.is_empty() {
            let i = starts.partition_point(|&s| s <= u) - 1;
            let n = (starts[i] + bs[i].m.rows - u).min(part.len());
            let (now, rest) = part.split_at_mut(n);
            bs[i].run(u - starts[i], now, 1);
            u += n;
            part = rest;
        }
    });
    for ((y, b), &s) in ys.iter_mut().zip(&bs).zip(&starts) {
        y.copy_from_slice(&all[s..s + b.m.rows]);
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

/// `y += a * x`.
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o += a * v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `matmul_many` gives each matrix exactly what `matmul` gives it, on 1-3
    /// threads, one token and several, packed (Q8_0, Q4_0, F16) and not, with
    /// row counts that keep the shared range aligned and ones that do not.
    #[test]
    fn matmul_many_equals_one_matmul_each() {
        use crate::quant::quantize_row;
        let mut seed = 0x0DDB_1A5E_5BAD_5EEDu64;
        let mut rnd = |n: usize| crate::backend::cpu::test_rng_vec(&mut seed, n);
        let cols = 256;
        for dt in [DType::Q4_0, DType::Q8_0, DType::F16, DType::F32] {
            for rows in [vec![128usize, 64, 64], vec![192, 64], vec![100, 36, 50], vec![64, 33]] {
                let rb = dt.row_bytes(cols).unwrap();
                let raw: Vec<Vec<u8>> = rows
                    .iter()
                    .map(|&r| {
                        let mut w = vec![0u8; r * rb];
                        for i in 0..r {
                            quantize_row(dt, &rnd(cols), &mut w[i * rb..(i + 1) * rb]);
                        }
                        w
                    })
                    .collect();
                for pack in [false, true] {
                    let packs: Vec<Option<Pack>> = raw
                        .iter()
                        .zip(&rows)
                        .map(|(w, &r)| match (pack, dt) {
                            (true, DType::Q4_0 | DType::Q8_0) => Some(Pack::Q(qpack::Packed::new(dt, w, rb, r, cols, "t", 2).unwrap())),
                            (true, DType::F16) => Some(Pack::F(fpack::Packed::new(w, r, cols, "t", 2).unwrap())),
                            _ => None,
                        })
                        .collect();
                    let ms: Vec<Weight<'_>> = raw
                        .iter()
                        .zip(&rows)
                        .zip(&packs)
                        .map(|((w, &r), p)| Weight { dtype: dt, w, row_bytes: rb, rows: r, packed: p.as_ref() })
                        .collect();
                    for t in [1usize, 3] {
                        let x = rnd(t * cols);
                        for threads in 1..=3 {
                            let pool = Pool::new(threads);
                            let act = Act::new(&x, cols);
                            let mut got: Vec<Vec<f32>> = rows.iter().map(|&r| vec![f32::NAN; r * t]).collect();
                            let mut refs: Vec<&mut [f32]> = got.iter_mut().map(|v| v.as_mut_slice()).collect();
                            matmul_many(&pool, &ms, &act, &mut refs);
                            for (m, g) in ms.iter().zip(&got) {
                                let mut want = vec![f32::NAN; m.rows * t];
                                matmul(&pool, *m, &Act::new(&x, cols), &mut want);
                                let (gb, wb): (Vec<u32>, Vec<u32>) =
                                    (g.iter().map(|v| v.to_bits()).collect(), want.iter().map(|v| v.to_bits()).collect());
                                assert_eq!(gb, wb, "{dt} rows {rows:?} packed {pack} t {t} threads {threads}");
                            }
                        }
                    }
                }
            }
        }
    }

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
