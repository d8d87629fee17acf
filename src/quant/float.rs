//! The float types: F32, F16 and BF16 rows to f32 and back (F16 and BF16 round
//! to nearest even), and the exact f16 -> f32 conversion every kernel uses for
//! f16 values and block scales.

use half::{bf16, f16};

/// Exact IEEE half -> single conversion (subnormals, infinities and NaN
/// payloads included; NaNs are made quiet), written branch-free so that loops over it vectorise.
/// Bit-identical to `half::f16::to_f32` (tested over all 65536 inputs).
#[inline(always)]
pub(crate) fn f16_bits_to_f32(h: u16) -> f32 {
    const SHIFTED_EXP: u32 = 0x7C00 << 13;
    let mut o = ((h & 0x7FFF) as u32) << 13; // exponent and mantissa
    let exp = o & SHIFTED_EXP;
    o += (127 - 15) << 23; // rebias the exponent
                           // Inf/NaN: move the exponent up to 255; NaNs come out quiet (as F16C does).
    let quiet = if h & 0x03FF != 0 { 0x0040_0000 } else { 0 };
    let o_inf = (o + ((128 - 16) << 23)) | quiet;
    // Zero/subnormal: renormalise through a float subtraction (exact).
    let o_sub = (f32::from_bits(o + (1 << 23)) - f32::from_bits(113 << 23)).to_bits();
    let o = if exp == SHIFTED_EXP {
        o_inf
    } else if exp == 0 {
        o_sub
    } else {
        o
    };
    f32::from_bits(o | (((h & 0x8000) as u32) << 16))
}

/// BF16 bits to f32 (exact: the top half of an f32).
#[inline(always)]
pub(crate) fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

pub(super) fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

pub(super) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16_bits_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}

pub(super) fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16_bits_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}

pub(super) fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    for (d, s) in dst.chunks_exact_mut(4).zip(src) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

pub(super) fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    for (d, s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f16::from_f32(*s).to_bits().to_le_bytes());
    }
}

pub(super) fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    for (d, s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&bf16::from_f32(*s).to_bits().to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_is_exact() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32().to_bits();
            assert_eq!(f16_bits_to_f32(h).to_bits(), want, "f16 bits {h:#06x}");
        }
    }
}
