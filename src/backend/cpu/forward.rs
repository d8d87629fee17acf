//! The forward pass, top to bottom, for one step of many sequences. The
//! architectures differ only by the named options in `cfg.arch` (biases, Q/K
//! norm, RoPE layout) and by optional tensors (tied output, RoPE divisors).

use super::ops;
use super::CpuBackend;
use crate::backend::{Seq, Want};
use crate::kv::BLOCK_POSITIONS;
use super::{isa, simd};
use crate::quant;

/// Where a row of the step's activations comes from.
struct Tok {
    seq: usize,
    pos: usize,
}

pub(super) fn step(be: &mut CpuBackend, seqs: &[Seq<'_>], logits: &mut [f32]) {
    let cfg = &be.cfg;
    let w = be.w.clone();
    let w: &crate::model::weights::Weights = &w;
    let (h, qd, kvd, hd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
    let toks: Vec<Tok> = seqs
        .iter()
        .enumerate()
        .flat_map(|(si, s)| (0..s.tokens.len()).map(move |i| Tok { seq: si, pos: s.start + i }))
        .collect();
    let n = toks.len();

    // Embedding gather.
    let mut x = vec![0f32; n * h];
    let emb = &w.token_embd;
    let ids = seqs.iter().flat_map(|s| s.tokens.iter().copied());
    for (row, id) in x.chunks_exact_mut(h).zip(ids) {
        let o = emb.offset + id as usize * emb.row_bytes;
        quant::dequantize_row(emb.dtype, &w.file_bytes(emb.file)[o..o + emb.row_bytes], row);
    }

    // RoPE angles per token.
    let half = hd / 2;
    let mut cos = vec![0f32; n * half];
    let mut sin = vec![0f32; n * half];
    for (t, tok) in toks.iter().enumerate() {
        for (i, f) in be.inv_freq.iter().enumerate() {
            let a = tok.pos as f64 * f;
            cos[t * half + i] = a.cos() as f32;
            sin[t * half + i] = a.sin() as f32;
        }
    }
    let neox = cfg.arch.rope_style == crate::model::RopeStyle::Neox;

    let mut xn = vec![0f32; n * h];
    let mut q = vec![0f32; n * qd];
    let mut k = vec![0f32; n * kvd];
    let mut v = vec![0f32; n * kvd];
    let mut att = vec![0f32; n * qd];
    let mut proj = vec![0f32; n * h];
    let mut gate = vec![0f32; n * cfg.ffn];
    let mut up = vec![0f32; n * cfg.ffn];
    let pool = &be.pool;
    let packed = &be.packed;
    let weight = |m: &'_ crate::model::weights::Matrix| ops::Weight {
        dtype: m.dtype,
        w: m.bytes(w),
        row_bytes: m.row_bytes,
        rows: m.rows,
        packed: packed.get(&(m.file, m.offset)),
    };
    let mm = |m: &crate::model::weights::Matrix, x: &ops::Act<'_>, y: &mut [f32]| {
        debug_assert_eq!(x.cols, m.cols);
        ops::matmul(pool, weight(m), x, y);
    };

    for (l, lw) in w.layers.iter().enumerate() {
        // Attention block.
        ops::rmsnorm(&x, &lw.attn_norm, cfg.rms_eps, &mut xn);
        // One activation set (quantized once when a weight needs it) for Q, K and V.
        let xa = ops::Act::new(&xn, h);
        ops::matmul_many(pool, &[weight(&lw.wq), weight(&lw.wk), weight(&lw.wv)], &xa, &mut [&mut q, &mut k, &mut v]);
        drop(xa);
        if let (Some(bq), Some(bk), Some(bv)) = (&lw.bq, &lw.bk, &lw.bv) {
            ops::add_bias(&mut q, bq);
            ops::add_bias(&mut k, bk);
            ops::add_bias(&mut v, bv);
        }
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            for head in q.chunks_exact_mut(hd) {
                let src = head.to_vec();
                ops::rmsnorm_row(&src, qn, cfg.rms_eps, head);
            }
            for head in k.chunks_exact_mut(hd) {
                let src = head.to_vec();
                ops::rmsnorm_row(&src, kn, cfg.rms_eps, head);
            }
        }
        for t in 0..n {
            let (c, s) = (&cos[t * half..(t + 1) * half], &sin[t * half..(t + 1) * half]);
            ops::rope(&mut q[t * qd..(t + 1) * qd], hd, c, s, neox);
            ops::rope(&mut k[t * kvd..(t + 1) * kvd], hd, c, s, neox);
        }
        // KV write.
        for (t, tok) in toks.iter().enumerate() {
            let b = seqs[tok.seq].blocks[tok.pos / BLOCK_POSITIONS];
            let slot = tok.pos % BLOCK_POSITIONS;
            be.kv.row_mut(b, l, 0, slot).copy_from_slice(&k[t * kvd..(t + 1) * kvd]);
            be.kv.row_mut(b, l, 1, slot).copy_from_slice(&v[t * kvd..(t + 1) * kvd]);
        }
        attention(be, seqs, &toks, l, &q, &mut att);
        mm(&lw.wo, &ops::Act::new(&att, qd), &mut proj);
        ops::add_in_place(&mut x, &proj);

        // Feed-forward block (SwiGLU).
        ops::rmsnorm(&x, &lw.ffn_norm, cfg.rms_eps, &mut xn);
        let xa = ops::Act::new(&xn, h);
        ops::matmul_many(pool, &[weight(&lw.w_gate), weight(&lw.w_up)], &xa, &mut [&mut gate, &mut up]);
        drop(xa);
        // SwiGLU in parallel pieces of 256 values (one exp each: ~1% of a decode step).
        ops::par_units(pool, &mut gate, 256, 256 * 32, 1, |u0, g| ops::swiglu(g, &up[u0 * 256..]));
        mm(&lw.w_down, &ops::Act::new(&gate, cfg.ffn), &mut proj);
        ops::add_in_place(&mut x, &proj);
    }

    // Final norm and LM head, only for the rows wanted.
    let mut rows: Vec<usize> = Vec::new();
    let mut t0 = 0;
    for s in seqs {
        match s.want {
            Want::Nothing => {}
            Want::Last => rows.push(t0 + s.tokens.len() - 1),
            Want::All => rows.extend(t0..t0 + s.tokens.len()),
        }
        t0 += s.tokens.len();
    }
    if rows.is_empty() {
        return;
    }
    let mut sel = vec![0f32; rows.len() * h];
    for (dst, &r) in sel.chunks_exact_mut(h).zip(&rows) {
        ops::rmsnorm_row(&x[r * h..(r + 1) * h], &w.output_norm, cfg.rms_eps, dst);
    }
    mm(&w.output, &ops::Act::new(&sel, h), logits);
}

/// Causal attention of every token over its cache's positions `0..=pos`, one
/// (token, head) pair per unit of work, walking the cache page by page.
fn attention(be: &CpuBackend, seqs: &[Seq<'_>], toks: &[Tok], layer: usize, q: &[f32], out: &mut [f32]) {
    let cfg = &be.cfg;
    let (qd, hd, kvd, nh) = (cfg.q_dim(), cfg.head_dim, cfg.kv_dim(), cfg.n_heads);
    let group = cfg.n_heads / cfg.n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let kv = &be.kv;
    let isa = isa::isa();
    let max_pos = toks.iter().map(|t| t.pos).max().unwrap_or(0);
    ops::par_units(&be.pool, out, hd, (max_pos + 1) * hd * 2, 1, |u0, part| {
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
                    ops::axpy(o, s * inv, &vrow[kvh * hd..(kvh + 1) * hd]);
                }
            }
        }
    });
}
