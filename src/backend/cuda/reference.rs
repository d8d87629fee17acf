//! CPU twins of the CUDA kernels: the same ops in plain Rust, accumulating in f64,
//! used as the reference the device results are checked against.

use half::f16;

/// Bytes of one ggml Q8_0 block: f16 scale + 32 int8 quants.
/// cbindgen:ignore
pub const Q8_0_BLOCK_BYTES: usize = 34;
/// Values per Q8_0 block.
/// cbindgen:ignore
pub const QK8_0: usize = 32;

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
