//! Attention over the paged KV cache: the write of each token's K and V rows into
//! its cache's pages ([`kv_write`]) and causal attention of every token over its
//! cache's positions `0..=pos` ([`attention`]: scores, softmax, weighted sum of V;
//! GQA: query head `h` reads KV head `h / (n_heads / n_kv_heads)`). The scores are
//! `scale * dot(q, k)`, soft-capped to `c * tanh(s / c)` when [`Scores::softcap`] is set
//! (gemma2); a layer with a sliding window `W` reads only the positions
//! `pos - W < p <= pos`, so only the pages holding them.
//!
//! CUDA twin: `backend/cuda/ops/attention.rs`, `kernels/attention.cu` (the K/V
//! store is fused with RoPE there: `kernels/rope.cu`).
//!
//! Depends on `attn` (the page kernels: scores, softmax, weighted sum), `isa` (the
//! kernel set), `pool` (the work split) and `kv` (the backend's `KvStore`).

use crate::backend::cpu::kv::KvStore;
use crate::backend::cpu::pool::{par_units, Pool};
use crate::backend::cpu::{attn, isa};
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
        kv.write(b, layer, slot, &k[t * kvd..(t + 1) * kvd], &v[t * kvd..(t + 1) * kvd]);
    }
}

/// The head layout of attention.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Heads {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// How a layer scores positions: `scale * dot(q, k)`, then the soft cap `c * tanh(s / c)`
/// when `softcap` > 0, over the last `window` positions (all when `None`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scores {
    pub scale: f32,
    pub softcap: f32,
    pub window: Option<usize>,
}

impl Scores {
    /// The plain scores of a head of `head_dim` values: `1 / sqrt(head_dim)`, no cap, no window.
    #[cfg(test)]
    pub(crate) fn plain(head_dim: usize) -> Scores {
        Scores { scale: 1.0 / (head_dim as f32).sqrt(), softcap: 0.0, window: None }
    }

    /// The first position a query at `pos` attends to.
    pub(crate) fn first(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }
}

/// Causal attention of every token over its cache's positions `0..=pos` (the last
/// `window` of them with a window): `q` and `out` hold a row of `n_heads * head_dim`
/// per token of `toks`. The work is split by query head; each piece goes to
/// `attn::run` in runs of up to `attn::MAX_HEADS` heads of one token that share a KV
/// head (each K page read once per run), and a head's result does not depend on
/// the run it is in (`attn`'s docs).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    pool: &Pool,
    kv: &KvStore,
    heads: Heads,
    sc: Scores,
    seqs: &[Seq<'_>],
    toks: &[Tok],
    layer: usize,
    q: &[f32],
    out: &mut [f32],
) {
    let Heads { n_heads: nh, n_kv_heads, head_dim: hd } = heads;
    let qd = nh * hd;
    let group = nh / n_kv_heads;
    let isa = isa::isa();
    let max_pos = toks.iter().map(|t| t.pos).max().unwrap_or(0);
    // Pieces of whole runs where the group splits evenly into them.
    let run_len = group.min(attn::MAX_HEADS);
    let align = if group.is_multiple_of(run_len) { run_len } else { 1 };
    par_units(pool, out, hd, (max_pos + 1) * hd * 2, align, |u0, part| {
        let (mut scratch, mut kpages, mut vpages) = (Vec::new(), Vec::new(), Vec::new());
        let units = part.len() / hd;
        let mut i = 0;
        while i < units {
            let (t, hq) = ((u0 + i) / nh, (u0 + i) % nh);
            let kvh = hq / group;
            let n = ((kvh + 1) * group).min(hq + attn::MAX_HEADS).min(hq + units - i) - hq;
            let tok = &toks[t];
            let blocks = seqs[tok.seq].blocks;
            let len = tok.pos + 1;
            // Positions lo..len, on pages lo / 16 ..= (len - 1) / 16 (a window skips the rest).
            let lo = sc.first(tok.pos);
            let pages = lo / BLOCK_POSITIONS..len.div_ceil(BLOCK_POSITIONS);
            // The KV head's part of each page (`kv`: K `[dim][slot]`, V `[slot][dim]`).
            let kcols = kvh * hd * BLOCK_POSITIONS..(kvh + 1) * hd * BLOCK_POSITIONS;
            kpages.clear();
            vpages.clear();
            for bi in pages.clone() {
                kpages.push(&kv.page(blocks[bi], layer, 0)[kcols.clone()]);
                vpages.push(&kv.page(blocks[bi], layer, 1)[kcols.clone()]);
            }
            let run = attn::Run {
                q: &q[t * qd + hq * hd..t * qd + (hq + n) * hd],
                heads: n,
                hd,
                kpages: &kpages,
                vpages: &vpages,
                vstride: hd,
                from: lo - pages.start * BLOCK_POSITIONS,
                to: len - (pages.end - 1) * BLOCK_POSITIONS,
                scale: sc.scale,
                softcap: sc.softcap,
            };
            attn::run(isa, &run, &mut scratch, &mut part[i * hd..(i + n) * hd]);
            i += n;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Want;
    use crate::util::XorShift;

    /// Softmax attention in f64 of query row `qv` over the K/V rows `rows` (indices
    /// into `k` / `v`, rows of `kvd`, KV head `kh`), scored as `sc` says.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        qv: &[f32],
        k: &[f32],
        v: &[f32],
        rows: std::ops::Range<usize>,
        kvd: usize,
        kh: usize,
        hd: usize,
        sc: Scores,
    ) -> Vec<f64> {
        let s: Vec<f64> = rows
            .clone()
            .map(|r| {
                let kr = &k[r * kvd + kh * hd..r * kvd + (kh + 1) * hd];
                let d = qv.iter().zip(kr).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * sc.scale as f64;
                if sc.softcap > 0.0 {
                    sc.softcap as f64 * (d / sc.softcap as f64).tanh()
                } else {
                    d
                }
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..hd).map(|d| rows.clone().zip(&e).map(|(r, w)| w / z * v[r * kvd + kh * hd + d] as f64).sum()).collect()
    }

    /// A windowed layer reads only the pages of its window: the first two blocks of
    /// the table have no storage (reading them would panic); positions 32..=52 are
    /// cached and the queries at 37..=52 with a window of 6 need positions 32.. only.
    #[test]
    fn attention_window_reads_only_the_window_pages() {
        let heads = Heads { n_heads: 2, n_kv_heads: 1, head_dim: 8 };
        let (qd, kvd, hd) = (16, 8, 8);
        let mut kv = KvStore::new(1, kvd, hd);
        let table: Vec<u32> = vec![100, 101, 4, 1];
        kv.ensure(4).unwrap();
        kv.ensure(1).unwrap();
        let ids = vec![0u32; 21];
        let seqs = [Seq { tokens: &ids, start: 32, blocks: &table, want: Want::Nothing }];
        let cached: Vec<Tok> = (32..53).map(|p| Tok { seq: 0, pos: p }).collect();
        let mut rng = XorShift::new(0x5EED_0006);
        let (k, v) = (rng.vec(21 * kvd, -1.0, 1.0), rng.vec(21 * kvd, -1.0, 1.0));
        kv_write(&mut kv, &seqs, &cached, 0, &k, &v);
        let toks: Vec<Tok> = (37..53).map(|p| Tok { seq: 0, pos: p }).collect();
        let q = rng.vec(toks.len() * qd, -1.0, 1.0);
        let sc = Scores { scale: 0.35, softcap: 0.0, window: Some(6) };
        let mut got = vec![f32::NAN; toks.len() * qd];
        attention(&Pool::new(1), &kv, heads, sc, &seqs, &toks, 0, &q, &mut got);
        for (t, tok) in toks.iter().enumerate() {
            for h in 0..2 {
                let rows = sc.first(tok.pos) - 32..tok.pos + 1 - 32;
                let want = reference(&q[t * qd + h * hd..t * qd + (h + 1) * hd], &k, &v, rows, kvd, 0, hd, sc);
                for (d, w) in want.iter().enumerate() {
                    assert!((got[t * qd + h * hd + d] as f64 - w).abs() < 1e-5, "token {t} head {h} dim {d}");
                }
            }
        }
    }

    /// Two sequences over scattered cache blocks (GQA, a prefill spanning pages
    /// and a one-token decode), against softmax attention in f64 over the same
    /// rows; and the same bits on 1 and 3 threads.
    #[test]
    fn attention_matches_f64_softmax() {
        let heads = Heads { n_heads: 4, n_kv_heads: 2, head_dim: 8 };
        let (qd, kvd, hd) = (32, 16, 8);
        let mut kv = KvStore::new(2, kvd, hd);
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
        attention(&Pool::new(1), &kv, heads, Scores::plain(hd), &seqs, &toks, 1, &q, &mut got);
        let mut again = vec![f32::NAN; n * qd];
        attention(&Pool::new(3), &kv, heads, Scores::plain(hd), &seqs, &toks, 1, &q, &mut again);
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            again.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        let first = |s: usize| if s == 0 { 0 } else { 37 };
        // Plain, then scaled + soft-capped + windowed (windows inside a page, a page, a
        // page and one, longer than the sequences): the window's rows only.
        let capped = |w| Scores { scale: 0.45, softcap: 1.5, window: Some(w) };
        for sc in [Scores::plain(hd), capped(5), capped(16), capped(17), capped(100)] {
            attention(&Pool::new(2), &kv, heads, sc, &seqs, &toks, 1, &q, &mut got);
            for (t, tok) in toks.iter().enumerate() {
                for h in 0..4 {
                    let qv = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
                    let rows = first(tok.seq) + sc.first(tok.pos)..first(tok.seq) + tok.pos + 1;
                    let want = reference(qv, &k, &v, rows, kvd, h / 2, hd, sc);
                    for (d, w) in want.iter().enumerate() {
                        let g = got[t * qd + h * hd + d] as f64;
                        assert!((g - w).abs() < 1e-5, "{sc:?} token {t} head {h} dim {d}: {g} vs {w}");
                    }
                }
            }
        }
    }
}
