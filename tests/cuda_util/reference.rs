//! The CPU oracle of the CUDA ops (test-only): each op of `llmrt::backend::cuda::ops`
//! in plain Rust, accumulating in f64, on weights decoded by the library's own
//! `llmrt::quant::dequantize_row` and with `llmrt::util::argmax`, so the tests hold
//! the kernels against the CPU side's one decoding of every type (as llama.cpp's
//! test-backend-ops holds every backend against the CPU).
#![allow(dead_code)]

use half::f16;
use llmrt::backend::cuda::ops::AttnShape;
use llmrt::kv::BLOCK_POSITIONS;
use llmrt::quant::{dequantize_row, DType};

/// `y[r][i] = x[r][i] * w[i] / sqrt(mean_i(x[r][i]^2) + eps)`; x, y: `[rows][n]`.
pub fn rmsnorm_f32(x: &[f32], w: &[f32], rows: usize, n: usize, eps: f32) -> Vec<f32> {
    assert_eq!(x.len(), rows * n, "x is [rows][n]");
    assert_eq!(w.len(), n, "w is [n]");
    let mut y = vec![0.0f32; rows * n];
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let ss: f64 = xr.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let scale = 1.0 / (ss / n as f64 + f64::from(eps)).sqrt();
        for ((yv, &xv), &wv) in yr.iter_mut().zip(xr).zip(w) {
            *yv = (f64::from(xv) * scale * f64::from(wv)) as f32;
        }
    }
    y
}

/// `y[b][r] = sum_c W[r][c] * x[b][c]`; W: `[rows][cols]` f16, x: `[batch][cols]`, y: `[batch][rows]`.
pub fn gemv_f16(w: &[f16], x: &[f32], rows: usize, cols: usize, batch: usize) -> Vec<f32> {
    assert_eq!(w.len(), rows * cols, "W is [rows][cols]");
    let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    matmul(DType::F16, &bytes, rows, cols, x, batch)
}

/// Like [`gemv_f16`] with W in ggml Q8_0 blocks (`rows * cols/32` blocks of 34 bytes).
pub fn gemv_q8_0(w_bytes: &[u8], x: &[f32], rows: usize, cols: usize, batch: usize) -> Vec<f32> {
    matmul(DType::Q8_0, w_bytes, rows, cols, x, batch)
}

/// A weight matrix of `rows` rows of `cols` elements stored as `dtype` (ggml layout,
/// little-endian), as values: each row decoded by `llmrt::quant::dequantize_row` (every
/// decoded value is exact in f32: an f16 scale times a small integer, or the stored float).
pub fn dequantize(dtype: DType, bytes: &[u8], rows: usize, cols: usize) -> Vec<f64> {
    let row_bytes = dtype.row_bytes(cols).expect("cols fits the block size");
    assert_eq!(bytes.len(), rows * row_bytes, "W is [rows] rows of row_bytes(cols)");
    let mut row = vec![0f32; cols];
    let mut out = Vec::with_capacity(rows * cols);
    for r in bytes.chunks_exact(row_bytes.max(1)).take(rows) {
        dequantize_row(dtype, r, &mut row);
        out.extend(row.iter().map(|&v| f64::from(v)));
    }
    out
}

/// `out[t][:] = table[ids[t]][:]` as f32; table: `[vocab][hidden]` of `dtype`.
pub fn embed(dtype: DType, table: &[u8], vocab: usize, hidden: usize, ids: &[u32]) -> Vec<f32> {
    let all = dequantize(dtype, table, vocab, hidden);
    let mut out = Vec::with_capacity(ids.len() * hidden);
    for &id in ids {
        let r = id as usize;
        out.extend(all[r * hidden..(r + 1) * hidden].iter().map(|&v| v as f32));
    }
    out
}

/// `y[t][r] = dot(W[r], x[t])`, W `[rows][cols]` of `dtype`, x `[n_tokens][cols]`.
pub fn matmul(dtype: DType, w: &[u8], rows: usize, cols: usize, x: &[f32], n_tokens: usize) -> Vec<f32> {
    assert_eq!(x.len(), n_tokens * cols, "x is [n_tokens][cols]");
    let wf = dequantize(dtype, w, rows, cols);
    let mut y = vec![0.0f32; n_tokens * rows];
    if cols == 0 {
        return y;
    }
    for (xb, yb) in x.chunks_exact(cols).zip(y.chunks_exact_mut(rows)) {
        let xf: Vec<f64> = xb.iter().map(|&v| f64::from(v)).collect();
        for (yv, wr) in yb.iter_mut().zip(wf.chunks_exact(cols)) {
            *yv = wr.iter().zip(&xf).map(|(a, b)| a * b).sum::<f64>() as f32;
        }
    }
    y
}

/// `x[r][i] + b[i]`; x: `[rows][n]`.
pub fn add_bias(x: &[f32], b: &[f32]) -> Vec<f32> {
    x.chunks_exact(b.len()).flat_map(|r| r.iter().zip(b).map(|(&v, &bi)| v + bi)).collect()
}

/// `x[i] + y[i]`.
pub fn add(x: &[f32], y: &[f32]) -> Vec<f32> {
    x.iter().zip(y).map(|(&a, &b)| a + b).collect()
}

/// `silu(g[i]) * u[i]` in f64.
/// GeGLU in f64: GELU's tanh form (transformers' gelu_pytorch_tanh) of `g`, times `u`.
pub fn geglu(g: &[f32], u: &[f32]) -> Vec<f32> {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    g.iter()
        .zip(u)
        .map(|(&a, &b)| {
            let a = f64::from(a);
            (0.5 * a * (1.0 + (k * (a + 0.044715 * a * a * a)).tanh()) * f64::from(b)) as f32
        })
        .collect()
}

pub fn swiglu(g: &[f32], u: &[f32]) -> Vec<f32> {
    g.iter()
        .zip(u)
        .map(|(&a, &b)| {
            let a = f64::from(a);
            (a / (1.0 + (-a).exp()) * f64::from(b)) as f32
        })
        .collect()
}

/// `out[i][:] = x[idx[i]][:]`, rows of `width`.
pub fn gather_rows(x: &[f32], idx: &[u32], width: usize) -> Vec<f32> {
    idx.iter().flat_map(|&i| x[i as usize * width..(i as usize + 1) * width].iter().copied()).collect()
}

/// `out[idx[i]][:] += w[i] * y[i][:]` row by row, as the CPU's `elementwise::axpy` adds an
/// expert's output into its token's row: the f32 product, then the f32 sum (no FMA). Not
/// f64: the kernel must equal this bit for bit.
pub fn scatter_axpy(out: &mut [f32], y: &[f32], idx: &[u32], w: &[f32], width: usize) {
    for (i, &r) in idx.iter().enumerate() {
        let o = &mut out[r as usize * width..(r as usize + 1) * width];
        for (o, &v) in o.iter_mut().zip(&y[i * width..(i + 1) * width]) {
            *o += w[i] * v;
        }
    }
}

/// Index of the largest value of each row (the first one on ties): `llmrt::util::argmax`.
pub fn argmax(logits: &[f32], vocab: usize) -> Vec<u32> {
    logits.chunks_exact(vocab).map(llmrt::util::argmax).collect()
}

/// Element offset of row `slot` of K (`which` 0) or V (1) of layer `layer` in block `block`
/// of a pool laid out `[block][layer][K|V][16][kv_dim]`.
fn pool_row(n_layers: usize, kv_dim: usize, block: usize, layer: usize, which: usize, slot: usize) -> usize {
    block * n_layers * 2 * BLOCK_POSITIONS * kv_dim + ((layer * 2 + which) * BLOCK_POSITIONS + slot) * kv_dim
}

/// Twin of `Ops::rope_kv_write`: rotates `q` and `k` in place (f32, unfused products,
/// as the CPU backend) and stores rotated K and V as f16 into `kv` (the pool laid out
/// `[block][layer][K|V][16][kv_dim]`) at `layer`, slot ids `slots`.
pub fn rope_kv_write(q: &mut [f32], k: &mut [f32], v: &[f32], rope: Rope<'_>, shape: AttnShape, pool: Pool<'_>) {
    let AttnShape { n_heads, n_kv_heads, head_dim: hd } = shape;
    let Rope { cos, sin, neox, dim } = rope;
    let Pool { kv, n_layers, layer, slots } = pool;
    let half = dim / 2;
    let (qd, kvd) = (n_heads * hd, n_kv_heads * hd);
    for (t, &slot) in slots.iter().enumerate() {
        let (c, s) = (&cos[t * half..(t + 1) * half], &sin[t * half..(t + 1) * half]);
        for x in [&mut q[t * qd..(t + 1) * qd], &mut k[t * kvd..(t + 1) * kvd]] {
            for head in x.chunks_exact_mut(hd) {
                for i in 0..half {
                    let (a, b) = if neox { (i, i + half) } else { (2 * i, 2 * i + 1) };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * c[i] - x1 * s[i];
                    head[b] = x0 * s[i] + x1 * c[i];
                }
            }
        }
        let (blk, sl) = (slot as usize / BLOCK_POSITIONS, slot as usize % BLOCK_POSITIONS);
        let k_base = pool_row(n_layers, kvd, blk, layer, 0, sl);
        let v_base = pool_row(n_layers, kvd, blk, layer, 1, sl);
        for i in 0..kvd {
            kv[k_base + i] = f16::from_f32(k[t * kvd + i]);
            kv[v_base + i] = f16::from_f32(v[t * kvd + i]);
        }
    }
}

/// The rotation of [`rope_kv_write`]: `[tokens][dim / 2]` tables, the pairing, and the
/// leading dimensions of each head that turn (`dim`; the rest pass unchanged).
#[derive(Clone, Copy)]
pub struct Rope<'a> {
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    pub neox: bool,
    pub dim: usize,
}

/// Where [`rope_kv_write`] stores K and V: the host copy of the pool, its layer count,
/// the layer, a slot id per token.
pub struct Pool<'a> {
    pub kv: &'a mut [f16],
    pub n_layers: usize,
    pub layer: usize,
    pub slots: &'a [u32],
}

/// What [`attention`] reads, as `ops::AttnArgs` on the host: the f16 pool of
/// `n_layers` layers, the layer, per-token sequence and position, the block tables.
pub struct Attn<'a> {
    pub q: &'a [f32],
    pub kv: &'a [f16],
    pub n_layers: usize,
    pub layer: usize,
    pub seq: &'a [u32],
    pub pos: &'a [u32],
    pub block_tables: &'a [u32],
    pub max_blocks: usize,
    pub shape: AttnShape,
}

/// Twin of `Ops::attention` in f64 over the f16 pool (`[block][layer][K|V][16][kv_dim]`).
pub fn attention(a: &Attn<'_>) -> Vec<f32> {
    attention_scored(a, 1.0 / (a.shape.head_dim as f64).sqrt(), 0.0, 0)
}

/// [`attention`] with the scores of `ops::AttnScores`: `scale * dot`, the soft cap
/// `softcap * tanh(s / softcap)` when `softcap` > 0, over positions `pos - window < p`
/// when `window` > 0 (blocks before that are never looked up).
pub fn attention_scored(a: &Attn<'_>, scale: f64, softcap: f64, window: usize) -> Vec<f32> {
    let Attn { q, kv, n_layers, layer, seq, pos, block_tables, max_blocks, shape } = *a;
    let AttnShape { n_heads, n_kv_heads, head_dim: hd } = shape;
    let (qd, kvd) = (n_heads * hd, n_kv_heads * hd);
    let group = n_heads / n_kv_heads;
    let mut out = vec![0f32; seq.len() * qd];
    for t in 0..seq.len() {
        let bt = &block_tables[seq[t] as usize * max_blocks..(seq[t] as usize + 1) * max_blocks];
        let len = pos[t] as usize + 1;
        let lo = if window > 0 { len.saturating_sub(window) } else { 0 };
        let row = |p: usize, which: usize, kvh: usize| -> &[f16] {
            let block = bt[p / BLOCK_POSITIONS] as usize;
            let base = pool_row(n_layers, kvd, block, layer, which, p % BLOCK_POSITIONS) + kvh * hd;
            &kv[base..base + hd]
        };
        for h in 0..n_heads {
            let kvh = h / group;
            let qh = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
            let scores: Vec<f64> = (lo..len)
                .map(|p| {
                    let s =
                        row(p, 0, kvh).iter().zip(qh).map(|(k, &qv)| k.to_f64() * f64::from(qv)).sum::<f64>() * scale;
                    if softcap > 0.0 {
                        softcap * (s / softcap).tanh()
                    } else {
                        s
                    }
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            let o = &mut out[t * qd + h * hd..t * qd + (h + 1) * hd];
            for (d, ov) in o.iter_mut().enumerate() {
                let acc: f64 = (lo..len).map(|p| e[p - lo] * row(p, 1, kvh)[d].to_f64()).sum();
                *ov = (acc / sum) as f32;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rmsnorm_unit_rows() {
        // x = [3, 4]: mean square 12.5
        let y = rmsnorm_f32(&[3.0, 4.0], &[1.0, 2.0], 1, 2, 0.0);
        let s = 1.0 / 12.5f64.sqrt();
        assert!((f64::from(y[0]) - 3.0 * s).abs() < 1e-6);
        assert!((f64::from(y[1]) - 8.0 * s).abs() < 1e-6);
    }

    #[test]
    fn gemv_small() {
        let w: Vec<f16> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().map(|&v| f16::from_f32(v)).collect();
        // W [2][3], x [2][3]
        let y = gemv_f16(&w, &[1.0, 0.0, -1.0, 0.5, 0.5, 0.5], 2, 3, 2);
        assert_eq!(y, vec![-2.0, -2.0, 3.0, 7.5]);
    }

    #[test]
    fn rope_rotates_pairs_and_stores_k_and_v() {
        // One token, one head of 4 dims: pairs (0,1),(2,3) or, neox, (0,2),(1,3).
        let shape = AttnShape { n_heads: 1, n_kv_heads: 1, head_dim: 4 };
        let (cos, sin) = ([0.0f32, 1.0], [1.0f32, 0.0]); // pair 0 turned by 90 degrees, pair 1 kept
        for (neox, want) in [(false, [-2.0f32, 1.0, 3.0, 4.0]), (true, [-3.0f32, 2.0, 1.0, 4.0])] {
            let mut q = [1.0f32, 2.0, 3.0, 4.0];
            let mut k = q;
            let mut kv = vec![f16::ZERO; 2 * 2 * BLOCK_POSITIONS * 4];
            let rope = Rope { cos: &cos, sin: &sin, neox, dim: 4 };
            rope_kv_write(
                &mut q,
                &mut k,
                &[0.5; 4],
                rope,
                shape,
                Pool { kv: &mut kv, n_layers: 1, layer: 0, slots: &[17] },
            );
            assert_eq!((q, k), (want, want), "neox={neox}");
            let base = 2 * BLOCK_POSITIONS * 4 + 4; // block 1, layer 0, K, slot 1
            assert_eq!(kv[base].to_f32(), want[0]);
            assert_eq!(kv[base + BLOCK_POSITIONS * 4].to_f32(), 0.5);
        }
    }

    #[test]
    fn q8_0_block_decodes_scale_times_quant() {
        let mut blk = vec![0u8; DType::Q8_0.block_bytes()];
        blk[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        blk[2] = 4;
        blk[3] = (-128i8) as u8;
        let v = dequantize(DType::Q8_0, &blk, 1, 32);
        assert_eq!((v[0], v[1], v[2]), (2.0, -64.0, 0.0));
        let mut x = vec![0.0f32; 32];
        x[1] = 1.0;
        assert_eq!(gemv_q8_0(&blk, &x, 1, 32, 1), vec![-64.0]);
    }

    #[test]
    fn attention_of_one_position_is_its_v() {
        let shape = AttnShape { n_heads: 2, n_kv_heads: 1, head_dim: 2 };
        let mut kv = vec![f16::ZERO; 2 * BLOCK_POSITIONS * 2];
        kv[BLOCK_POSITIONS * 2] = f16::from_f32(0.25); // V of slot 0
        kv[BLOCK_POSITIONS * 2 + 1] = f16::from_f32(-1.0);
        let q = [1.0f32, 2.0, 3.0, 4.0];
        let a = Attn {
            q: &q,
            kv: &kv,
            n_layers: 1,
            layer: 0,
            seq: &[0],
            pos: &[0],
            block_tables: &[0],
            max_blocks: 1,
            shape,
        };
        assert_eq!(attention(&a), vec![0.25, -1.0, 0.25, -1.0]);
    }
}
