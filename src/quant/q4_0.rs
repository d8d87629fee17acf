//! Q4_0: blocks of 32 values, an f16 scale `d` then 16 bytes of 4-bit `q`
//! (element `j` in the low nibble of byte `j`, element `j + 16` in its high
//! nibble; value `d * (q - 8)`), exactly ggml's `block_q4_0`.

use super::{block_scale, DType, QK};
use half::f16;

pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (dc, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(DType::Q4_0.block_bytes())) {
        let d = block_scale(b);
        for j in 0..QK / 2 {
            let q = b[2 + j];
            dc[j] = d * ((q & 0x0F) as i32 - 8) as f32;
            dc[j + QK / 2] = d * ((q >> 4) as i32 - 8) as f32;
        }
    }
}

/// ggml's `quantize_row_q4_0_ref`: `d = max / -8` (the signed value of largest
/// magnitude), `q = min(15, trunc(x / d + 8.5))`.
pub(super) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (b, xs) in dst.chunks_exact_mut(DType::Q4_0.block_bytes()).zip(src.chunks_exact(QK)) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in xs {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for j in 0..QK / 2 {
            let x0 = xs[j] * id;
            let x1 = xs[j + QK / 2] * id;
            let q0 = ((x0 + 8.5) as i8).min(15) as u8;
            let q1 = ((x1 + 8.5) as i8).min(15) as u8;
            b[2 + j] = q0 | (q1 << 4);
        }
    }
}
