//! The forward pass, top to bottom, for one step of many sequences. The
//! architectures differ only by the named options in `cfg.arch` (biases, Q/K
//! norm, RoPE layout, the FFN's activation, post-norms) and `cfg` (embedding
//! scale, attention scale and soft cap, sliding windows and their RoPE, final
//! soft cap), and by optional tensors (tied output, RoPE divisors).

use super::ops::attention::{self, Scores, Tok};
use super::ops::matmul::{self, Act, Weight};
use super::ops::{elementwise, embed, norm, rope};
use super::pool::{par_units, Pool};
use super::CpuBackend;
use crate::backend::{moe, Seq, Want};
use crate::model::weights::{Ffn, Glu, Matrix, Moe, Weights};
use crate::model::{FfnAct, MoeConfig};
use crate::util::{try_vec, try_with_capacity};
use crate::Result;

/// Runs the step. Every scratch buffer (sized by the step's tokens) is allocated
/// fallibly: a failure is `LLMRT_OUT_OF_MEMORY` naming the buffer and its size, and
/// the step stops there (it has then written only KV positions past the committed
/// lengths and scratch, so nothing is committed: the caller's state is unchanged).
///
/// `out` receives a row per wanted token: `vocab` logits, or with `head = false` the
/// `hidden` floats of the final norm's output (the LM head's input, embeddings).
pub(super) fn step(be: &mut CpuBackend, seqs: &[Seq<'_>], out: &mut [f32], head: bool) -> Result<()> {
    let cfg = &be.cfg;
    let w = be.w.clone();
    let w: &Weights = &w;
    let (h, qd, kvd, hd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
    let n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
    let mut toks: Vec<Tok> = try_with_capacity(n, "the step's token list")?;
    toks.extend(
        seqs.iter().enumerate().flat_map(|(si, s)| (0..s.tokens.len()).map(move |i| Tok { seq: si, pos: s.start + i })),
    );
    // n tokens of `d` floats each (n * d cannot overflow: the caller holds n tokens'
    // KV, but saturate anyway so an impossible size is an allocation error).
    let buf = |d: usize, what: &str| try_vec(n.saturating_mul(d), 0f32, what);

    // Embedding gather.
    let mut x = buf(h, "the step's hidden states")?;
    let emb = &w.token_embd;
    let ids = seqs.iter().flat_map(|s| s.tokens.iter().copied());
    embed::embed(emb.dtype, emb.bytes(w), emb.row_bytes, h, ids, &mut x);
    if cfg.embed_scale != 1.0 {
        elementwise::scale(&mut x, cfg.embed_scale);
    }

    // RoPE angles per token (and those of the windowed layers when they have their own).
    let half = cfg.rope_dim / 2;
    let mut cos = buf(half, "the step's RoPE cosines")?;
    let mut sin = buf(half, "the step's RoPE sines")?;
    rope::angles(toks.iter().map(|t| t.pos), &be.inv_freq, cfg.rope_attn_factor, &mut cos, &mut sin);
    let local = match &be.inv_freq_local {
        Some(f) => {
            let mut c = buf(half, "the step's local RoPE cosines")?;
            let mut s = buf(half, "the step's local RoPE sines")?;
            rope::angles(toks.iter().map(|t| t.pos), f, cfg.rope_attn_factor, &mut c, &mut s);
            Some((c, s))
        }
        None => None,
    };
    let neox = cfg.arch.rope_style == crate::model::RopeStyle::Neox;
    let heads = attention::Heads { n_heads: cfg.n_heads, n_kv_heads: cfg.n_kv_heads, head_dim: hd };

    let mut xn = buf(h, "the step's normed hidden states")?;
    let mut q = buf(qd, "the step's queries")?;
    let mut k = buf(kvd, "the step's keys")?;
    let mut v = buf(kvd, "the step's values")?;
    let mut att = buf(qd, "the step's attention output")?;
    let mut proj = buf(h, "the step's projections")?;
    // The dense feed-forward's scratch, or the experts'.
    let ffn_w = if cfg.moe.is_some() { 0 } else { cfg.ffn };
    let mut gate = buf(ffn_w, "the step's feed-forward gate")?;
    let mut up = buf(ffn_w, "the step's feed-forward up projection")?;
    let mut moe_s = match &cfg.moe {
        Some(m) => Some(MoeScratch::new(m, n, h)?),
        None => None,
    };
    let pool = &be.pool;
    let packed = &be.packed;
    let weight = |m: &'_ Matrix| Weight {
        dtype: m.dtype,
        w: m.bytes(w),
        row_bytes: m.row_bytes,
        rows: m.rows,
        packed: packed.get(&(m.file, m.offset)),
    };
    let mm = |m: &Matrix, x: &Act<'_>, y: &mut [f32]| {
        debug_assert_eq!(x.cols, m.cols);
        matmul::matmul(pool, weight(m), x, y)
    };

    let n_layers = w.layers.len();
    for (l, lw) in w.layers.iter().enumerate() {
        crate::abort::check(|| format!("layer {l} of {n_layers}"))?;
        // Attention block.
        norm::rmsnorm_par(pool, &x, &lw.attn_norm, cfg.rms_eps, &mut xn);
        // One activation set (quantized once when a weight needs it) for Q, K and V.
        let xa = Act::new(&xn, h);
        matmul::matmul_many(
            pool,
            &[weight(&lw.wq), weight(&lw.wk), weight(&lw.wv)],
            &xa,
            &mut [&mut q, &mut k, &mut v],
        )?;
        drop(xa);
        if let (Some(bq), Some(bk), Some(bv)) = (&lw.bq, &lw.bk, &lw.bv) {
            elementwise::add_bias(&mut q, bq);
            elementwise::add_bias(&mut k, bk);
            elementwise::add_bias(&mut v, bv);
        }
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            norm::rmsnorm_heads_par(pool, &mut q, hd, qn, cfg.rms_eps);
            norm::rmsnorm_heads_par(pool, &mut k, hd, kn, cfg.rms_eps);
        }
        let (cos_l, sin_l) = match &local {
            Some((c, s)) if cfg.local_rope(l) => (c, s),
            _ => (&cos, &sin),
        };
        rope::rope_par(pool, &mut q, (qd, hd, half), (cos_l, sin_l), neox);
        rope::rope_par(pool, &mut k, (kvd, hd, half), (cos_l, sin_l), neox);
        attention::kv_write(&mut be.kv, seqs, &toks, l, &k, &v);
        let sc = Scores { scale: cfg.attn_scale, softcap: cfg.attn_softcap, window: cfg.window(l) };
        attention::attention(pool, &be.kv, heads, sc, seqs, &toks, l, &q, &mut att);
        mm(&lw.wo, &Act::new(&att, qd), &mut proj)?;
        residual_add(pool, (&mut x, h), &proj, lw.post_attn_norm.as_deref(), cfg.rms_eps);

        // Feed-forward block (SwiGLU, or GeGLU; or experts).
        norm::rmsnorm_par(pool, &x, &lw.ffn_norm, cfg.rms_eps, &mut xn);
        match (&lw.ffn, cfg.moe.as_ref(), moe_s.as_mut()) {
            (Ffn::Moe(m), Some(mc), Some(ms)) => moe_ffn(pool, &weight, mc, m, &xn, h, ms, &mut proj)?,
            (Ffn::Dense(d), _, _) => {
                let xa = Act::new(&xn, h);
                matmul::matmul_many(pool, &[weight(&d.gate), weight(&d.up)], &xa, &mut [&mut gate, &mut up])?;
                drop(xa);
                match cfg.arch.ffn_act {
                    FfnAct::Silu => elementwise::swiglu_par(pool, &mut gate, &up),
                    FfnAct::GeluTanh => elementwise::geglu_par(pool, &mut gate, &up),
                }
                mm(&d.down, &Act::new(&gate, cfg.ffn), &mut proj)?;
            }
            _ => unreachable!("a MoE layer's scratch is allocated with its config"),
        }
        residual_add(pool, (&mut x, h), &proj, lw.post_ffn_norm.as_deref(), cfg.rms_eps);
    }

    // Final norm and LM head, only for the rows wanted.
    let wanted: usize = seqs.iter().map(|s| s.want.rows(s.tokens.len())).sum();
    let mut rows: Vec<usize> = try_with_capacity(wanted, "the step's logits row list")?;
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
        return Ok(());
    }
    crate::abort::check(|| format!("the LM head (after {n_layers} layers)"))?;
    let mut sel = try_vec(rows.len().saturating_mul(h), 0f32, "the step's final hidden states")?;
    for (dst, &r) in sel.chunks_exact_mut(h).zip(&rows) {
        norm::rmsnorm_row(&x[r * h..(r + 1) * h], &w.output_norm, cfg.rms_eps, dst);
    }
    if !head {
        out.copy_from_slice(&sel);
        return Ok(());
    }
    mm(&w.output, &Act::new(&sel, h), out)?;
    if cfg.final_softcap > 0.0 {
        elementwise::softcap(out, cfg.final_softcap);
    }
    Ok(())
}

/// `x += y`, or with a post-norm (gemma) `x += rmsnorm(y) * w`, rows of `h` values.
///
/// Row by row, the rows split between the pool's threads (the same operations on every
/// value whatever the split). On the calling thread alone it held the worker waiting:
/// 0.4% of AVX-512 Q5_K_M pp128's samples at 2 threads (perf), a share that grows with
/// the thread count.
fn residual_add(pool: &Pool, (x, h): (&mut [f32], usize), y: &[f32], post_norm: Option<&[f32]>, eps: f32) {
    par_units(pool, x, h, 2 * h, 1, |r0, x| {
        let y = &y[r0 * h..r0 * h + x.len()];
        match post_norm {
            Some(pw) => {
                for (xr, yr) in x.chunks_exact_mut(h).zip(y.chunks_exact(h)) {
                    norm::add_rmsnormed_row(xr, yr, pw, eps);
                }
            }
            None => elementwise::add_in_place(x, y),
        }
    });
}

/// The experts' scratch of one step (`n` tokens), allocated once for every layer.
struct MoeScratch {
    /// Router scores, then probabilities: `n x n_experts`.
    probs: Vec<f32>,
    /// Each token's experts and their weights: `n x n_used`, by expert index.
    routes: Vec<(u32, f32)>,
    /// The expert indices sorted by score (one token at a time).
    order: Vec<u32>,
    /// The tokens routed to one expert, and their weights.
    rows: Vec<(u32, f32)>,
    /// Their normed hidden states gathered (`<= n x hidden`), gate and up (`<= n x ffn`,
    /// or one token's `n_used` experts side by side), and the expert's output (`<= n x
    /// hidden`, or the `n_used` experts' of one token).
    xe: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    ye: Vec<f32>,
}

impl MoeScratch {
    fn new(m: &MoeConfig, n: usize, h: usize) -> Result<MoeScratch> {
        let f = m.expert_ffn.max(m.shared_ffn.unwrap_or(0));
        let v = |d: usize, what: &str| try_vec(n.saturating_mul(d), 0f32, what);
        // One token's routed experts side by side (`moe_ffn`'s decode path).
        let vk = |d: usize, what: &str| try_vec(n.max(m.n_used).saturating_mul(d), 0f32, what);
        Ok(MoeScratch {
            probs: v(m.n_experts, "the step's router scores")?,
            routes: try_vec(n.saturating_mul(m.n_used), (0, 0.0), "the step's expert routes")?,
            order: try_vec(m.n_experts, 0, "the router's order")?,
            rows: try_with_capacity(n, "the step's expert rows")?,
            xe: v(h, "the step's expert inputs")?,
            gate: vk(f, "the step's expert gates")?,
            up: vk(f, "the step's expert up projections")?,
            ye: vk(h, "the step's expert outputs")?,
        })
    }
}

/// A mixture-of-experts block over the step's normed hidden states `xn` (`n x h`):
/// every token routed ([`moe::route`]), then each expert run once over all the tokens routed
/// to it (its weights read once per step), its outputs added to theirs weighted, in
/// expert order (so a token's sum does not depend on the others in the step); then the
/// shared expert times its sigmoid gate (qwen2moe). `out` (`n x h`) receives the sum.
#[allow(clippy::too_many_arguments)]
fn moe_ffn<'w>(
    pool: &super::pool::Pool,
    weight: &dyn Fn(&'w Matrix) -> Weight<'w>,
    mc: &MoeConfig,
    m: &'w Moe,
    xn: &[f32],
    h: usize,
    s: &mut MoeScratch,
    out: &mut [f32],
) -> Result<()> {
    let n = xn.len() / h;
    let (ne, k, fe) = (mc.n_experts, mc.n_used, mc.expert_ffn);
    let xa = Act::new(xn, h);
    matmul::matmul(pool, weight(&m.router), &xa, &mut s.probs[..n * ne])?;
    for t in 0..n {
        moe::route(
            &mut s.probs[t * ne..(t + 1) * ne],
            k,
            mc.norm_topk,
            &mut s.order,
            &mut s.routes[t * k..(t + 1) * k],
        );
    }
    out.iter_mut().for_each(|v| *v = 0.0);
    if n == 1 {
        // One token (decode): every routed expert reads the same row, so all their gates
        // and ups are one pool run over the activations quantized once, then all their
        // downs another: two joins per layer instead of three per expert. The same kernels
        // compute the same rows (`matmul_each`), and the sum below runs in expert order as
        // the loop's does: the bits are those of the several-token path.
        let r = &s.routes[..k];
        let ws: Vec<Weight<'w>> = r
            .iter()
            .flat_map(|&(e, _)| {
                let g = &m.experts[e as usize];
                [weight(&g.gate), weight(&g.up)]
            })
            .collect();
        let (gate, up) = (&mut s.gate[..k * fe], &mut s.up[..k * fe]);
        let mut ys: Vec<&mut [f32]> = gate.chunks_mut(fe).zip(up.chunks_mut(fe)).flat_map(|(g, u)| [g, u]).collect();
        matmul::matmul_many(pool, &ws, &xa, &mut ys)?;
        drop(ys);
        elementwise::swiglu_par(pool, gate, up);
        let acts: Vec<Act<'_>> = gate.chunks(fe).map(|g| Act::new(g, fe)).collect();
        let downs: Vec<(Weight<'w>, &Act<'_>)> =
            r.iter().zip(&acts).map(|(&(e, _), a)| (weight(&m.experts[e as usize].down), a)).collect();
        let mut ys: Vec<&mut [f32]> = s.ye[..k * h].chunks_mut(h).collect();
        matmul::matmul_each(pool, &downs, &mut ys)?;
        for (&(_, wgt), y) in r.iter().zip(s.ye.chunks(h)) {
            elementwise::axpy(out, wgt, y);
        }
    } else {
        // Experts in index order; a token's routes are sorted by expert, so each sum
        // accumulates in expert order.
        for (e, ew) in m.experts.iter().enumerate() {
            moe::expert_rows(&s.routes[..n * k], k, e, &mut s.rows);
            if s.rows.is_empty() {
                continue;
            }
            let r = s.rows.len();
            for (i, &(t, _)) in s.rows.iter().enumerate() {
                let t = t as usize;
                s.xe[i * h..(i + 1) * h].copy_from_slice(&xn[t * h..(t + 1) * h]);
            }
            glu(pool, weight, ew, &s.xe[..r * h], h, fe, &mut s.gate, &mut s.up, &mut s.ye[..r * h])?;
            for (i, &(t, wgt)) in s.rows.iter().enumerate() {
                let t = t as usize;
                elementwise::axpy(&mut out[t * h..(t + 1) * h], wgt, &s.ye[i * h..(i + 1) * h]);
            }
        }
    }
    if let Some((sh, gvec)) = &m.shared {
        let fs = sh.gate.rows;
        glu(pool, weight, sh, xn, h, fs, &mut s.gate, &mut s.up, &mut s.ye[..n * h])?;
        for t in 0..n {
            let xr = &xn[t * h..(t + 1) * h];
            let g: f32 = xr.iter().zip(gvec).map(|(a, b)| a * b).sum();
            let sig = moe::sigmoid(g);
            elementwise::axpy(&mut out[t * h..(t + 1) * h], sig, &s.ye[t * h..(t + 1) * h]);
        }
    }
    Ok(())
}

/// One SwiGLU `y = down(silu(gate(x)) * up(x))` over the rows of `x` (`r x h`), `f` wide,
/// in the scratch `gate` and `up` (at least `r x f` each).
#[allow(clippy::too_many_arguments)]
fn glu<'w>(
    pool: &super::pool::Pool,
    weight: &dyn Fn(&'w Matrix) -> Weight<'w>,
    g: &'w Glu,
    x: &[f32],
    h: usize,
    f: usize,
    gate: &mut [f32],
    up: &mut [f32],
    y: &mut [f32],
) -> Result<()> {
    let r = x.len() / h;
    let (gate, up) = (&mut gate[..r * f], &mut up[..r * f]);
    let xa = Act::new(x, h);
    matmul::matmul_many(pool, &[weight(&g.gate), weight(&g.up)], &xa, &mut [&mut *gate, &mut *up])?;
    drop(xa);
    elementwise::swiglu_par(pool, gate, up);
    matmul::matmul(pool, weight(&g.down), &Act::new(gate, f), y)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The residual add split between a pool's threads (rows enough for `par_units` to
    /// split them) gives the values of the whole-slice add, with and without a post-norm.
    #[test]
    fn residual_add_on_a_pool_equals_the_serial_add() {
        let mut rng = crate::util::XorShift::new(23);
        let (n, h) = (64, 1024);
        let (x, y, pw) = (rng.vec(n * h, -3.0, 3.0), rng.vec(n * h, -3.0, 3.0), rng.vec(h, 0.5, 1.5));
        for post in [None, Some(&pw[..])] {
            let mut want = x.clone();
            let mut normed = vec![0f32; n * h];
            match post {
                Some(pw) => {
                    norm::rmsnorm(&y, pw, 1e-5, &mut normed);
                    elementwise::add_in_place(&mut want, &normed);
                }
                None => elementwise::add_in_place(&mut want, &y),
            }
            for threads in [1, 2, 3] {
                let pool = Pool::new(threads);
                let mut got = x.clone();
                residual_add(&pool, (&mut got, h), &y, post, 1e-5);
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{threads} threads");
            }
        }
    }
}
