//! The aarch64 NEON quantized kernels of the 8-lane order (see `simd`'s docs): one
//! weight row x one activation row at a time. Only reached through `simd::gemm_q`
//! when `isa()` chose `Neon`. (Float rows there take the portable reference, which
//! compiles to fused multiply-adds.)
//!
//! Depends on `isa` (`reduce8`, `QAct`) and `crate::quant`.

use crate::backend::cpu::isa::{reduce8, QAct};
use crate::quant::{f16_bits_to_f32, QK};
use std::arch::aarch64::*;

/// Sums of groups of 4 products of 16 i8 pairs, as 4 i32 lanes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn dot16(w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(w), vget_low_s8(x));
    let hi = vmull_high_s8(w, x);
    // Pairwise: [p0+p1, ..., p14+p15] (fits i16 for |q| <= 127), then to i32 groups of 4.
    vpaddlq_s16(vpaddq_s16(lo, hi))
}

#[target_feature(enable = "neon")]
pub unsafe fn gemm_q(q4: bool, w: *const u8, row_bytes: usize, nrows: usize, nb: usize, a: &QAct, out: &mut [f32]) {
    let bb = if q4 { 2 + QK / 2 } else { 2 + QK };
    // SAFETY: (whole body) the CPU has this function's target features (it is reached only
    // through the kernel set `isa()` detected); rows < nrows of `w`, activation rows < a.t, and
    // outputs r * t + c are in bounds (checked by the safe wrapper).
    unsafe {
        for r in 0..nrows {
            for c in 0..a.t {
                let mut acc0 = vdupq_n_f32(0.0);
                let mut acc1 = vdupq_n_f32(0.0);
                for b in 0..nb {
                    let p = w.add(r * row_bytes + b * bb);
                    let d = f16_bits_to_f32((p as *const u16).read_unaligned());
                    let (w0, w1) = if q4 {
                        let v = vld1q_u8(p.add(2));
                        let eight = vdupq_n_s8(8);
                        (
                            vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))), eight),
                            vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), eight),
                        )
                    } else {
                        (vld1q_s8(p.add(2) as *const i8), vld1q_s8(p.add(18) as *const i8))
                    };
                    let xp = a.qs.as_ptr().add(c * a.cols + b * QK);
                    let s = vdupq_n_f32(d * *a.d.as_ptr().add(c * nb + b));
                    let i0 = dot16(w0, vld1q_s8(xp));
                    let i1 = dot16(w1, vld1q_s8(xp.add(16)));
                    acc0 = vfmaq_f32(acc0, s, vcvtq_f32_s32(i0));
                    acc1 = vfmaq_f32(acc1, s, vcvtq_f32_s32(i1));
                }
                let mut l = [0f32; 8];
                vst1q_f32(l.as_mut_ptr(), acc0);
                vst1q_f32(l.as_mut_ptr().add(4), acc1);
                *out.as_mut_ptr().add(r * a.t + c) = reduce8(l);
            }
        }
    }
}
