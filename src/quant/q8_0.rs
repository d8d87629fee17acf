//! Q8_0: blocks of 32 values, an f16 scale `d` then 32 i8 `q` (value `d * q`),
//! exactly ggml's `block_q8_0`.

use super::{block_scale, DType, QK};
use half::f16;

pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (dc, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(DType::Q8_0.block_bytes())) {
        let d = block_scale(b);
        for j in 0..QK {
            dc[j] = d * (b[2 + j] as i8) as f32;
        }
    }
}

/// ggml's `quantize_row_q8_0_ref`: `d = amax / 127`, `q = round(x / d)`.
pub(super) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (b, xs) in dst.chunks_exact_mut(DType::Q8_0.block_bytes()).zip(src.chunks_exact(QK)) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for j in 0..QK {
            // `as i8` saturates (and maps NaN to 0); in range it is C's cast.
            b[2 + j] = ((xs[j] * id).round() as i8) as u8;
        }
    }
}
