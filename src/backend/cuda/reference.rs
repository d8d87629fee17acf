//! CPU twins of the CUDA kernels: the same ops in plain Rust, accumulating in f64,
//! used as the reference the device results are checked against.

use half::{bf16, f16};

use super::ops::AttnShape;
use crate::kv::BLOCK_POSITIONS;
use crate::quant::DType;

/// Bytes of one ggml Q8_0 block: f16 scale + 32 int8 quants.
/// cbindgen:ignore
pub const Q8_0_BLOCK_BYTES: usize = 34;
/// Values per Q8_0 block.
/// cbindgen:ignore
pub const QK8_0: usize = 32;
/// Bytes of one ggml Q4_0 block: f16 scale + 16 bytes of nibbles.
/// cbindgen:ignore
pub const Q4_0_BLOCK_BYTES: usize = 18;

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
    assert_eq!(x.len(), batch * cols, "x is [batch][cols]");
    let wf: Vec<f64> = w.iter().map(|v| v.to_f64()).collect();
    gemv_f64(&wf, x, rows, cols, batch)
}

/// Like [`gemv_f16`] with W in ggml Q8_0 blocks (`rows * cols/32` blocks of 34 bytes).
pub fn gemv_q8_0(w_bytes: &[u8], x: &[f32], rows: usize, cols: usize, batch: usize) -> Vec<f32> {
    assert_eq!(cols % QK8_0, 0, "Q8_0 rows hold whole blocks");
    assert_eq!(w_bytes.len(), rows * cols / QK8_0 * Q8_0_BLOCK_BYTES, "W is [rows][cols/32] blocks");
    let wf = dequantize_q8_0(w_bytes);
    gemv_f64(&wf, x, rows, cols, batch)
}

/// Q8_0 blocks to values: `d * q` for each of the 32 quants of each block.
pub fn dequantize_q8_0(bytes: &[u8]) -> Vec<f64> {
    assert_eq!(bytes.len() % Q8_0_BLOCK_BYTES, 0, "whole Q8_0 blocks");
    let mut out = Vec::with_capacity(bytes.len() / Q8_0_BLOCK_BYTES * QK8_0);
    for blk in bytes.chunks_exact(Q8_0_BLOCK_BYTES) {
        let d = f16::from_le_bytes([blk[0], blk[1]]).to_f64();
        out.extend(blk[2..].iter().map(|&q| d * f64::from(q as i8)));
    }
    out
}

/// Q4_0 blocks to values: element j < 16 of a block is `d * (low nibble of byte j - 8)`,
/// element j + 16 is `d * (high nibble of byte j - 8)`.
pub fn dequantize_q4_0(bytes: &[u8]) -> Vec<f64> {
    assert_eq!(bytes.len() % Q4_0_BLOCK_BYTES, 0, "whole Q4_0 blocks");
    let mut out = Vec::with_capacity(bytes.len() / Q4_0_BLOCK_BYTES * 32);
    for blk in bytes.chunks_exact(Q4_0_BLOCK_BYTES) {
        let d = f16::from_le_bytes([blk[0], blk[1]]).to_f64();
        let qs = &blk[2..];
        out.extend(qs.iter().map(|&q| d * (f64::from(q & 0x0f) - 8.0)));
        out.extend(qs.iter().map(|&q| d * (f64::from(q >> 4) - 8.0)));
    }
    out
}

/// A weight matrix of `rows` rows of `cols` elements stored as `dtype` (ggml layout,
/// little-endian), as values.
pub fn dequantize(dtype: DType, bytes: &[u8], rows: usize, cols: usize) -> Vec<f64> {
    let row_bytes = dtype.row_bytes(cols).expect("cols fits the block size");
    assert_eq!(bytes.len(), rows * row_bytes, "W is [rows] rows of row_bytes(cols)");
    match dtype {
        DType::F32 => bytes.chunks_exact(4).map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))).collect(),
        DType::F16 => bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
        DType::BF16 => bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
        DType::Q8_0 => dequantize_q8_0(bytes),
        DType::Q4_0 => dequantize_q4_0(bytes),
    }
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
    gemv_f64(&wf, x, rows, cols, n_tokens)
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

/// Index of the largest value of each row (the first one on ties).
pub fn argmax(logits: &[f32], vocab: usize) -> Vec<u32> {
    logits
        .chunks_exact(vocab)
        .map(|r| {
            let mut best = 0;
            for (i, &v) in r.iter().enumerate() {
                if v > r[best] {
                    best = i;
                }
            }
            best as u32
        })
        .collect()
}

/// Twin of `Ops::rope_kv_write`: rotates `q` and `k` in place (f32, unfused products,
/// as the CPU backend) and stores rotated K and V as f16 into `kv` (the pool laid out
/// `[block][layer][K|V][16][kv_dim]`) at `layer`, slot ids `slots`.
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_write(
    q: &mut [f32],
    k: &mut [f32],
    v: &[f32],
    cos: &[f32],
    sin: &[f32],
    slots: &[u32],
    shape: AttnShape,
    neox: bool,
    kv: &mut [f16],
    n_layers: usize,
    layer: usize,
) {
    let AttnShape { n_heads, n_kv_heads, head_dim: hd } = shape;
    let half = hd / 2;
    let (qd, kvd) = (n_heads * hd, n_kv_heads * hd);
    let block_elems = n_layers * 2 * BLOCK_POSITIONS * kvd;
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
        let k_base = blk * block_elems + (layer * 2 * BLOCK_POSITIONS + sl) * kvd;
        let v_base = k_base + BLOCK_POSITIONS * kvd;
        for i in 0..kvd {
            kv[k_base + i] = f16::from_f32(k[t * kvd + i]);
            kv[v_base + i] = f16::from_f32(v[t * kvd + i]);
        }
    }
}

/// Twin of `Ops::attention` in f64 over the f16 pool (`[block][layer][K|V][16][kv_dim]`).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    kv: &[f16],
    n_layers: usize,
    layer: usize,
    seq: &[u32],
    pos: &[u32],
    block_tables: &[u32],
    max_blocks: usize,
    shape: AttnShape,
) -> Vec<f32> {
    let AttnShape { n_heads, n_kv_heads, head_dim: hd } = shape;
    let (qd, kvd) = (n_heads * hd, n_kv_heads * hd);
    let group = n_heads / n_kv_heads;
    let block_elems = n_layers * 2 * BLOCK_POSITIONS * kvd;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0f32; seq.len() * qd];
    for t in 0..seq.len() {
        let bt = &block_tables[seq[t] as usize * max_blocks..(seq[t] as usize + 1) * max_blocks];
        let len = pos[t] as usize + 1;
        let row = |p: usize, which: usize, kvh: usize| -> &[f16] {
            let base = bt[p / BLOCK_POSITIONS] as usize * block_elems
                + ((layer * 2 + which) * BLOCK_POSITIONS + p % BLOCK_POSITIONS) * kvd
                + kvh * hd;
            &kv[base..base + hd]
        };
        for h in 0..n_heads {
            let kvh = h / group;
            let qh = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
            let scores: Vec<f64> = (0..len)
                .map(|p| row(p, 0, kvh).iter().zip(qh).map(|(k, &qv)| k.to_f64() * f64::from(qv)).sum::<f64>() * scale)
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            let o = &mut out[t * qd + h * hd..t * qd + (h + 1) * hd];
            for (d, ov) in o.iter_mut().enumerate() {
                let acc: f64 = (0..len).map(|p| e[p] * row(p, 1, kvh)[d].to_f64()).sum();
                *ov = (acc / sum) as f32;
            }
        }
    }
    out
}

fn gemv_f64(w: &[f64], x: &[f32], rows: usize, cols: usize, batch: usize) -> Vec<f32> {
    let mut y = vec![0.0f32; batch * rows];
    if cols == 0 {
        return y;
    }
    for (xb, yb) in x.chunks_exact(cols).zip(y.chunks_exact_mut(rows)) {
        let xf: Vec<f64> = xb.iter().map(|&v| f64::from(v)).collect();
        for (yv, wr) in yb.iter_mut().zip(w.chunks_exact(cols)) {
            *yv = wr.iter().zip(&xf).map(|(a, b)| a * b).sum::<f64>() as f32;
        }
    }
    y
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
    fn dequantize_matches_the_cpu_backend() {
        // Every type, a few rows of pseudo-random bytes (scales kept finite and small).
        let mut state = 0x1234_5678_9abc_def1u64;
        let mut byte = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        };
        for dt in DType::all() {
            let (rows, cols) = (3, 64);
            let rb = dt.row_bytes(cols).unwrap();
            let mut bytes: Vec<u8> = (0..rows * rb).map(|_| byte()).collect();
            match dt {
                DType::F32 => {
                    for c in bytes.chunks_exact_mut(4) {
                        c[3] &= 0x3f; // finite, moderate exponent
                    }
                }
                DType::F16 | DType::BF16 => {
                    for c in bytes.chunks_exact_mut(2) {
                        c[1] &= 0x3b;
                    }
                }
                DType::Q8_0 | DType::Q4_0 => {
                    for blk in bytes.chunks_exact_mut(dt.block_bytes()) {
                        blk[..2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
                    }
                }
            }
            let ours = dequantize(dt, &bytes, rows, cols);
            let mut theirs = vec![0f32; rows * cols];
            for (r, dst) in theirs.chunks_exact_mut(cols).enumerate() {
                crate::quant::dequantize_row(dt, &bytes[r * rb..(r + 1) * rb], dst);
            }
            for (i, (&a, &b)) in ours.iter().zip(&theirs).enumerate() {
                assert_eq!(a as f32, b, "{dt}: element {i}");
            }
        }
    }

    #[test]
    fn rope_twin_matches_the_cpu_backend() {
        let shape = AttnShape { n_heads: 2, n_kv_heads: 1, head_dim: 8 };
        for neox in [false, true] {
            let mut q: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 1.0).collect();
            let mut k: Vec<f32> = (0..8).map(|i| 1.0 - i as f32 * 0.3).collect();
            let v = vec![0.5f32; 8];
            let cos = [0.1f32, 0.2, 0.3, 0.4];
            let sin = [0.9f32, 0.8, 0.7, 0.6];
            let (mut q2, mut k2) = (q.clone(), k.clone());
            crate::backend::cpu::ops::rope(&mut q2, 8, &cos, &sin, neox);
            crate::backend::cpu::ops::rope(&mut k2, 8, &cos, &sin, neox);
            let mut kv = vec![f16::ZERO; 2 * 2 * BLOCK_POSITIONS * 8];
            rope_kv_write(&mut q, &mut k, &v, &cos, &sin, &[17], shape, neox, &mut kv, 1, 0);
            assert_eq!(q, q2);
            assert_eq!(k, k2);
            let base = 2 * BLOCK_POSITIONS * 8 + 8; // block 1, layer 0, K, slot 1
            assert_eq!(kv[base].to_f32(), f16::from_f32(k[0]).to_f32());
            assert_eq!(kv[base + BLOCK_POSITIONS * 8].to_f32(), 0.5);
        }
    }

    #[test]
    fn q8_0_block_decodes_scale_times_quant() {
        let mut blk = vec![0u8; Q8_0_BLOCK_BYTES];
        blk[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        blk[2] = 4;
        blk[3] = (-128i8) as u8;
        let v = dequantize_q8_0(&blk);
        assert_eq!((v[0], v[1], v[2]), (2.0, -64.0, 0.0));
        let mut x = vec![0.0f32; 32];
        x[1] = 1.0;
        assert_eq!(gemv_q8_0(&blk, &x, 1, 32, 1), vec![-64.0]);
    }
}
