//! Matrix products: `y = W x` for one weight matrix ([`matmul`]) or several reading
//! the same activations ([`matmul_many`]: Q, K and V; gate and up), over weights
//! of any [`DType`] as mapped ([`Weight`]) or repacked at load for this CPU's
//! kernels ([`Pack`]), with activations quantized to 8 bits once per input when a
//! quantized weight reads them ([`Act`]). Work is split between the pool's threads
//! by whole groups of output rows, never inside a sum, so a row's result does not
//! depend on the batch or the thread count.
//!
//! CUDA twin: `backend/cuda/ops/matmul.rs`, `kernels/matmul.cu`.
//!
//! Depends on `isa` (`QAct`, the kernel set), `simd` (rows as stored), `gq` (the
//! group-quantized types), `qpack` /
//! `fpack` (packed rows), `pool` (the work split).

use crate::backend::cpu::isa::{self, QAct};
use crate::backend::cpu::pool::{par_units, Pool, SendPtr};
use crate::backend::cpu::{fpack, gq, qpack, simd};
use crate::quant::DType;
use crate::util::try_vec;
use crate::Result;
use std::cell::OnceCell;

/// A matrix repacked at load for this CPU's kernels.
pub enum Pack {
    Q(qpack::Packed),
    F(fpack::Packed),
    G(gq::Packed),
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

    /// The quantized activations (allocated fallibly the first time; the rows split
    /// between `pool`'s threads).
    fn quantized(&self, pool: &Pool) -> Result<&QAct> {
        if let Some(q) = self.q.get() {
            return Ok(q);
        }
        let q = QAct::try_quantize(self.x, self.cols, Some(pool))?;
        Ok(self.q.get_or_init(|| q))
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
    fn new(m: Weight<'a>, act: &'a Act<'_>, pool: &Pool) -> Result<Bound<'a>> {
        let cols = act.cols;
        let quant = matches!(m.dtype, DType::Q8_0 | DType::Q4_0) || m.dtype.is_grouped();
        let qa = if quant { Some(act.quantized(pool)?) } else { None };
        let packed = m.packed.filter(|p| match p {
            Pack::Q(q) => quant && q.rows == m.rows && q.cols == cols && q.dtype == m.dtype,
            Pack::F(f) => m.dtype == f.dtype && f.rows == m.rows && f.cols == cols,
            Pack::G(g) => g.dtype == m.dtype && g.rows == m.rows && g.cols == cols && g.isa == isa::isa(),
        });
        Ok(Bound { m: Weight { packed, ..m }, qa, x: act.x, cols, isa: isa::isa() })
    }

    /// Rows per unit of work: packed groups of rows are never split between threads.
    fn align(&self) -> usize {
        match self.m.packed {
            Some(Pack::Q(_)) => qpack::ALIGN,
            Some(Pack::F(_)) => fpack::GROUP,
            Some(Pack::G(g)) => gq::tile_rows(g.isa),
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
            (Some(qa), Some(Pack::G(p))) => gq::gemm_packed(p, r0, n, qa, part),
            (Some(qa), _) if m.dtype.is_grouped() => gq::gemm(self.isa, m.dtype, wr, m.row_bytes, n, qa, part),
            (Some(qa), _) => simd::gemm_q(self.isa, m.dtype, wr, m.row_bytes, n, qa, part),
            (None, Some(Pack::F(p))) => fpack::gemm(self.isa, p, r0, n, self.x, part),
            _ => simd::gemm_f(self.isa, m.dtype, wr, m.row_bytes, n, self.x, self.cols, part),
        }
    }
}

/// `y[t][r] = dot(W[r], x[t])` for `t < T` tokens: W is `m` (`rows x cols`),
/// x is `T x cols`, y is `T x rows`. Tiles of weight rows are read once for all
/// tokens (see `simd`); `m.packed`, the same matrix repacked for this CPU's
/// kernels (`qpack`, `fpack`), is used when present. Scratch (quantized
/// activations, the transpose buffer) is allocated fallibly: `LLMRT_OUT_OF_MEMORY`.
pub(crate) fn matmul(pool: &Pool, m: Weight<'_>, act: &Act<'_>, y: &mut [f32]) -> Result<()> {
    let rows = m.rows;
    let b = Bound::new(m, act, pool)?;
    let cols = act.cols;
    let t_count = act.x.len() / cols;
    debug_assert_eq!(y.len(), t_count * rows);
    let align = b.align();
    if t_count == 1 {
        par_units(pool, y, 1, cols, align, |r0, part| b.run(r0, part, 1));
        return Ok(());
    }
    if let (Some(qa), Some(Pack::G(p))) = (b.qa, b.m.packed) {
        if gq::token_major(p, t_count) {
            // The kernels write y token-major themselves: no row-major buffer, no transpose
            // (whose reads at 2 threads crossed to the other core's cache).
            let pre = gq::prepare(p, qa)?;
            let yp = SendPtr(y.as_mut_ptr());
            let mut units = vec![(); rows];
            par_units(pool, &mut units, 1, cols * t_count, align, |r0, part| {
                // SAFETY: `y` holds `t_count x rows` values and stays exclusively borrowed
                // until `par_units` returns; this part writes `y[c * rows + r0 + r]` for its
                // rows `r < part.len()` only, rows no other part is handed.
                unsafe { gq::gemm_packed_tm(p, r0, part.len(), qa, &pre, yp.get().add(r0), (1, rows)) }
            });
            return Ok(());
        }
    }
    if let (None, Some(Pack::F(p))) = (b.qa, b.m.packed) {
        if fpack::token_major(b.isa, t_count) {
            // As the grouped types above: each token's rows written where `y` wants them.
            let yp = SendPtr(y.as_mut_ptr());
            let mut units = vec![(); rows];
            par_units(pool, &mut units, 1, cols * t_count, align, |r0, part| {
                // SAFETY: `y` holds `t_count x rows` values and stays exclusively borrowed
                // until `par_units` returns; this part writes `y[c * rows + r0 + r]` for its
                // rows `r < part.len()` only, rows no other part is handed.
                unsafe { fpack::gemm_tm(b.isa, p, r0, part.len(), b.x, yp.get().add(r0), (1, rows)) }
            });
            return Ok(());
        }
    }
    // Row-major over weights: tmp[r][t], transposed into y afterwards.
    let mut tmp = try_vec(rows.saturating_mul(t_count), 0f32, "the step's matmul transpose buffer")?;
    par_units(pool, &mut tmp, t_count, cols * t_count, align, |r0, part| b.run(r0, part, t_count));
    // Blocked transpose, the tokens split between the threads: contiguous writes, reads
    // from a few dozen lines. (On one thread, serially, it was 4-8% of a TinyLlama
    // prefill.)
    let tmp = &tmp;
    par_units(pool, y, rows, rows, 1, |t0, part| {
        for r0 in (0..rows).step_by(64) {
            let r1 = (r0 + 64).min(rows);
            for (i, yt) in part.chunks_exact_mut(rows).enumerate() {
                let src = tmp[r0 * t_count + t0 + i..].iter().step_by(t_count);
                for (o, &v) in yt[r0..r1].iter_mut().zip(src) {
                    *o = v;
                }
            }
        }
    });
    Ok(())
}

/// `ys[i] = W_i x` for several matrices reading the same activations (Q, K and V;
/// gate and up). For one token their rows are split between the threads as one
/// range, in one pool run instead of one per matrix (fewer joins, longer
/// streams); the same kernels compute the same rows, so the results are those of
/// [`matmul`] bit for bit. Otherwise (or when the matrices' row counts do not
/// keep the units aligned) one [`matmul`] each.
pub(crate) fn matmul_many(pool: &Pool, ms: &[Weight<'_>], act: &Act<'_>, ys: &mut [&mut [f32]]) -> Result<()> {
    let pairs: Vec<(Weight<'_>, &Act<'_>)> = ms.iter().map(|&m| (m, act)).collect();
    matmul_each(pool, &pairs, ys)
}

/// `ys[i] = W_i x_i`, each matrix with its own activations (one token each: the
/// routed experts' down projections): as [`matmul_many`], one pool run when every
/// input is one token and the row counts keep the units aligned, else one
/// [`matmul`] each; the results are [`matmul`]'s bit for bit either way.
pub(crate) fn matmul_each(pool: &Pool, ms: &[(Weight<'_>, &Act<'_>)], ys: &mut [&mut [f32]]) -> Result<()> {
    assert_eq!(ms.len(), ys.len());
    let one = ms.iter().all(|(_, a)| a.x.len() == a.cols);
    let bs: Vec<Bound<'_>> = ms.iter().map(|&(m, a)| Bound::new(m, a, pool)).collect::<Result<_>>()?;
    let align = bs.iter().map(Bound::align).max().unwrap_or(1);
    let aligned = bs.iter().all(|b| align.is_multiple_of(b.align()))
        && bs[..bs.len().saturating_sub(1)].iter().all(|b| b.m.rows.is_multiple_of(align));
    if !one || !aligned {
        for (&(m, a), y) in ms.iter().zip(ys.iter_mut()) {
            matmul(pool, m, a, y)?;
        }
        return Ok(());
    }
    let starts: Vec<usize> = bs
        .iter()
        .scan(0, |acc, b| {
            let s = *acc;
            *acc += b.m.rows;
            Some(s)
        })
        .collect();
    let total: usize = bs.iter().map(|b| b.m.rows).sum();
    let mut all = try_vec(total, 0f32, "the step's stacked matmul output")?;
    let cols = bs.iter().map(|b| b.cols).max().unwrap_or(0);
    par_units(pool, &mut all, 1, cols, align, |u0, part| {
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `matmul_many` gives each matrix exactly what `matmul` gives it, on 1-3
    /// threads, one token and several, packed (Q8_0, Q4_0, F16) and not, with
    /// row counts that keep the shared range aligned and ones that do not.
    #[test]
    fn matmul_many_and_each_equal_one_matmul_each() {
        use crate::quant::quantize_row;
        let mut rng = crate::util::XorShift::new(0x0DDB_1A5E_5BAD_5EED);
        let mut rnd = |n: usize| rng.vec(n, -1.0, 1.0);
        let cols = 256;
        for dt in [DType::Q4_0, DType::Q8_0, DType::F16, DType::F32, DType::Q4_K, DType::Q6_K] {
            for rows in [vec![128usize, 64, 64], vec![192, 64], vec![100, 36, 50], vec![64, 33]] {
                let rb = dt.row_bytes(cols).unwrap();
                let raw: Vec<Vec<u8>> = rows
                    .iter()
                    .map(|&r| {
                        let mut w = vec![0u8; r * rb];
                        for i in 0..r {
                            let row = &mut w[i * rb..(i + 1) * rb];
                            if dt.is_grouped() {
                                // Random blocks with small finite f16 scales (no quantizer for
                                // these types: files bring them quantized).
                                let v = rnd(rb);
                                for (b, x) in row.iter_mut().zip(v) {
                                    *b = (x * 1e4) as i64 as u8;
                                }
                                for blk in row.chunks_exact_mut(dt.block_bytes()) {
                                    for &o in dt.f16_scale_offsets() {
                                        let h = half::f16::from_f32(0.01 + 0.001 * (o as f32)).to_bits();
                                        blk[o..o + 2].copy_from_slice(&h.to_le_bytes());
                                    }
                                }
                            } else {
                                quantize_row(dt, &rnd(cols), row);
                            }
                        }
                        w
                    })
                    .collect();
                for pack in [false, true] {
                    let packs: Vec<Option<Pack>> = raw
                        .iter()
                        .zip(&rows)
                        .map(|(w, &r)| match (pack, dt) {
                            (true, DType::Q4_0 | DType::Q8_0) => {
                                Some(Pack::Q(qpack::Packed::new(dt, w, rb, r, cols, "t", 2).unwrap()))
                            }
                            (true, DType::F16) => Some(Pack::F(fpack::Packed::new(dt, w, r, cols, "t", 2).unwrap())),
                            (true, DType::Q4_K | DType::Q6_K) if gq::packs(isa::isa()) => {
                                Some(Pack::G(gq::Packed::new(isa::isa(), dt, w, rb, r, cols, "t", 2).unwrap()))
                            }
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
                            matmul_many(&pool, &ms, &act, &mut refs).unwrap();
                            for (m, g) in ms.iter().zip(&got) {
                                let mut want = vec![f32::NAN; m.rows * t];
                                matmul(&pool, *m, &Act::new(&x, cols), &mut want).unwrap();
                                let (gb, wb): (Vec<u32>, Vec<u32>) = (
                                    g.iter().map(|v| v.to_bits()).collect(),
                                    want.iter().map(|v| v.to_bits()).collect(),
                                );
                                assert_eq!(gb, wb, "{dt} rows {rows:?} packed {pack} t {t} threads {threads}");
                            }
                            // Each matrix with its own activations (the experts' downs).
                            let xs: Vec<Vec<f32>> = ms.iter().map(|_| rnd(t * cols)).collect();
                            let acts: Vec<Act<'_>> = xs.iter().map(|x| Act::new(x, cols)).collect();
                            let pairs: Vec<(Weight<'_>, &Act<'_>)> = ms.iter().copied().zip(&acts).collect();
                            let mut got: Vec<Vec<f32>> = rows.iter().map(|&r| vec![f32::NAN; r * t]).collect();
                            let mut refs: Vec<&mut [f32]> = got.iter_mut().map(|v| v.as_mut_slice()).collect();
                            matmul_each(&pool, &pairs, &mut refs).unwrap();
                            for ((m, x), g) in ms.iter().zip(&xs).zip(&got) {
                                let mut want = vec![f32::NAN; m.rows * t];
                                matmul(&pool, *m, &Act::new(x, cols), &mut want).unwrap();
                                let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
                                assert_eq!(
                                    bits(g),
                                    bits(&want),
                                    "each: {dt} rows {rows:?} packed {pack} t {t} threads {threads}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
