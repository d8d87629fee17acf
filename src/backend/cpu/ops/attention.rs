//! Attention over the paged KV cache: the write of each token's K and V rows into
//! its cache's pages ([`kv_write`]) and causal attention of every token over its
//! cache's positions `0..=pos` ([`attention`]: scores, softmax, weighted sum of V;
//! GQA: query head `h` reads KV head `h / (n_heads / n_kv_heads)`).
//!
//! CUDA twin: `backend/cuda/ops/attention.rs`, `kernels/attention.cu` (the K/V
//! store is fused with RoPE there: `kernels/rope.cu`).
//!
//! Depends on `isa` / `simd` (the f32 dot of the scores), `pool` (the work split),
//! `elementwise` (`axpy`) and the backend's `KvStore`.

use super::elementwise::axpy;
use crate::backend::cpu::pool::{par_units, Pool};
use crate::backend::cpu::{isa, simd, KvStore};
use crate::backend::Seq;
use crate::kv::BLOCK_POSITIONS;
use crate::model::Config;

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
    let kvd = kv.kv_dim;
    for (t, tok) in toks.iter().enumerate() {
        let b = seqs[tok.seq].blocks[tok.pos / BLOCK_POSITIONS];
        let slot = tok.pos % BLOCK_POSITIONS;
        kv.row_mut(b, layer, 0, slot).copy_from_slice(&k[t * kvd..(t + 1) * kvd]);
        kv.row_mut(b, layer, 1, slot).copy_from_slice(&v[t * kvd..(t + 1) * kvd]);
    }
}

/// Causal attention of every token over its cache's positions `0..=pos`, one
/// (token, head) pair per unit of work, walking the cache page by page.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    pool: &Pool,
    kv: &KvStore,
    cfg: &Config,
    seqs: &[Seq<'_>],
    toks: &[Tok],
    layer: usize,
    q: &[f32],
    out: &mut [f32],
) {

    let (qd, hd, kvd, nh) = (cfg.q_dim(), cfg.head_dim, cfg.kv_dim(), cfg.n_heads);
    let group = cfg.n_heads / cfg.n_kv_heads;
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
