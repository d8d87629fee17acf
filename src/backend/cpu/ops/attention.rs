//! Attention over the paged KV cache: the write of each token's K and V rows into
//! its cache's pages ([`kv_write`]) and causal attention of every token over its
//! cache's positions `0..=pos` ([`attention`]: scores, softmax, weighted sum of V;
//! GQA: query head `h` reads KV head `h / (n_heads / n_kv_heads)`).
//!
//! CUDA twin: `backend/cuda/ops/attention.rs`, `kernels/attention.cu` (the K/V
//! store is fused with RoPE there: `kernels/rope.cu`).
//!
//! Depends on `isa` / `simd` (the f32 dot of the scores), `pool` (the work split),
//! `elementwise` (`axpy`) and `kv` (the backend's `KvStore`).

use super::elementwise::axpy;
use crate::backend::cpu::kv::KvStore;
use crate::backend::cpu::pool::{par_units, Pool};
use crate::backend::cpu::{isa, simd};
use crate::backend::Seq;
use crate::kv::BLOCK_POSITIONS;

/// Where a row of the step's activations comes from.
pub(crate) struct Tok {
    /// Index of its sequence in the step.
    pub seq: usize,
    /// Its position in that sequence's cache.
    pub pos: usize,
}

/// Stores row `t` of `k` and `v` (`kv_dim` values each) at token `t`'s position in
/// its cache, for layer `layer`.
pub(crate) fn kv_write(kv: &mut KvStore, seqs: &[Seq<'_>], toks: &[Tok], layer: usize, k: &[f32], v: &[f32]) {
    let kvd = kv.kv_dim();
    for (t, tok) in toks.iter().enumerate() {
        let b = seqs[tok.seq].blocks[tok.pos / BLOCK_POSITIONS];
        let slot = tok.pos % BLOCK_POSITIONS;
        kv.row_mut(b, layer, 0, slot).copy_from_slice(&k[t * kvd..(t + 1) * kvd]);
        kv.row_mut(b, layer, 1, slot).copy_from_slice(&v[t * kvd..(t + 1) * kvd]);
    }
}

/// The head layout of attention.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Heads {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// Causal attention of every token over its cache's positions `0..=pos`, one
/// (token, head) pair per unit of work, walking the cache page by page: `q` and
/// `out` hold a row of `n_heads * head_dim` per token of `toks`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    pool: &Pool,
    kv: &KvStore,
    heads: Heads,
    seqs: &[Seq<'_>],
    toks: &[Tok],
    layer: usize,
    q: &[f32],
    out: &mut [f32],
) {
    let Heads { n_heads: nh, n_kv_heads, head_dim: hd } = heads;
    let (qd, kvd) = (nh * hd, n_kv_heads * hd);
    let group = nh / n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let isa = isa::isa();
    let max_pos = toks.iter().map(|t| t.pos).max().unwrap_or(0);
    par_units(pool, out, hd, (max_pos + 1) * hd * 2, 1, |u0, part| {
        let mut scores = vec![0f32; max_pos + 1];
        for (i, o) in part.chunks_exact_mut(hd).enumerate() {
            let (t, hq) = ((u0 + i) / nh, (u0 + i) % nh);
            let tok = &toks[t];
            let blocks = seqs[tok.seq].blocks;
            let len = tok.pos + 1;
            let kvh = hq / group;
            let qv = &q[t * qd + hq * hd..t * qd + (hq + 1) * hd];
            let mut m = f32::NEG_INFINITY;
            for (bi, &b) in blocks[..len.div_ceil(BLOCK_POSITIONS)].iter().enumerate() {
                let p0 = bi * BLOCK_POSITIONS;
                let page = kv.page(b, layer, 0);
                for (s, krow) in scores[p0..len.min(p0 + BLOCK_POSITIONS)].iter_mut().zip(page.chunks_exact(kvd)) {
                    *s = simd::dot_f32(isa, qv, &krow[kvh * hd..(kvh + 1) * hd]) * scale;
                    m = m.max(*s);
                }
            }
            let mut sum = 0f32;
            for s in scores[..len].iter_mut() {
                *s = (*s - m).exp();
                sum += *s;
            }
            let inv = 1.0 / sum;
            o.fill(0.0);
            for (bi, &b) in blocks[..len.div_ceil(BLOCK_POSITIONS)].iter().enumerate() {
                let p0 = bi * BLOCK_POSITIONS;
                let page = kv.page(b, layer, 1);
                for (&s, vrow) in scores[p0..len.min(p0 + BLOCK_POSITIONS)].iter().zip(page.chunks_exact(kvd)) {
                    axpy(o, s * inv, &vrow[kvh * hd..(kvh + 1) * hd]);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Want;
    use crate::util::XorShift;

    /// Two sequences over scattered cache blocks (GQA, a prefill spanning pages
    /// and a one-token decode), against softmax attention in f64 over the same
    /// rows; and the same bits on 1 and 3 threads.
    #[test]
    fn attention_matches_f64_softmax() {
        let heads = Heads { n_heads: 4, n_kv_heads: 2, head_dim: 8 };
        let (qd, kvd, hd) = (32, 16, 8);
        let mut kv = KvStore::new(2, kvd);
        let (b0, b1): (Vec<u32>, Vec<u32>) = (vec![5, 2, 7], vec![0, 3]);
        for &b in b0.iter().chain(&b1) {
            kv.ensure(b).unwrap();
        }
        // Sequence 0: 37 new tokens from position 0; sequence 1: one token at 20
        // after 20 cached ones (written in the same call here).
        let (t0, t1) = (vec![0u32; 37], vec![0u32; 21]);
        let seqs = [
            Seq { tokens: &t0, start: 0, blocks: &b0, want: Want::Nothing },
            Seq { tokens: &t1, start: 0, blocks: &b1, want: Want::Nothing },
        ];
        let toks: Vec<Tok> =
            (0..37).map(|p| Tok { seq: 0, pos: p }).chain((0..21).map(|p| Tok { seq: 1, pos: p })).collect();
        let n = toks.len();
        let mut rng = XorShift::new(0xA77E_2710);
        let (k, v, q) = (rng.vec(n * kvd, -1.0, 1.0), rng.vec(n * kvd, -1.0, 1.0), rng.vec(n * qd, -1.0, 1.0));
        kv_write(&mut kv, &seqs, &toks, 1, &k, &v);
        let mut got = vec![f32::NAN; n * qd];
        attention(&Pool::new(1), &kv, heads, &seqs, &toks, 1, &q, &mut got);
        let mut again = vec![f32::NAN; n * qd];
        attention(&Pool::new(3), &kv, heads, &seqs, &toks, 1, &q, &mut again);
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            again.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        let first = |s: usize| if s == 0 { 0 } else { 37 };
        for (t, tok) in toks.iter().enumerate() {
            for h in 0..4 {
                let kh = h / 2;
                let qv = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
                let rows = first(tok.seq)..first(tok.seq) + tok.pos + 1;
                let s: Vec<f64> = rows
                    .clone()
                    .map(|r| {
                        let kr = &k[r * kvd + kh * hd..r * kvd + (kh + 1) * hd];
                        qv.iter().zip(kr).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hd {
                    let want: f64 = rows.clone().zip(&e).map(|(r, w)| w / z * v[r * kvd + kh * hd + d] as f64).sum();
                    let g = got[t * qd + h * hd + d] as f64;
                    assert!((g - want).abs() < 1e-5, "token {t} head {h} dim {d}: {g} vs {want}");
                }
            }
        }
    }
}
