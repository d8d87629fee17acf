//! The group-quantized types beyond Q8_0 / Q4_0 (Q4_1, Q5_0, Q5_1, IQ4_NL and the
//! K-quants Q2_K..Q6_K, IQ4_XS): their byte layouts, exactly as ggml stores them,
//! written once as [`unpack`], which every use of these types goes through.
//!
//! A row of these types is a sequence of *groups* of 32 values (a 32-value block is
//! one group, a 256-value K-quant super-block eight). [`unpack`] gives a group as
//! 32 small integers `q` and, per half of 16 values, a scale `s` and an offset `o`,
//! so that value `j` is `s[j / 16] * q[j] + o[j / 16]` (the `+ o` only for types
//! with an offset: [`DType::has_offset`]). Scales and offsets are formed in f32 as
//! ggml forms them (`d * sc`, `-(dmin * m)`), so [`dequantize`] is bit-identical to
//! gguf-py's `gguf.quants.dequantize` (numpy, no FMA; tests/quant_dequant.rs checks
//! vectors gguf-py wrote), and the CPU kernels' dot products (`backend/cpu/gq`)
//! take exactly these integers and scales (the types with a scale per 16: their
//! integer scales, [`half_scales`]).
//!
//! Depends on `half` only.

use super::DType;
use half::f16;

/// Values per group.
pub(crate) const GROUP: usize = 32;

/// Values per K-quant super-block.
pub(crate) const QK_K: usize = 256;

/// IQ4_NL / IQ4_XS: the 16 non-linear levels a 4-bit index selects.
pub(crate) const IQ4_LEVELS: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// One group of 32 values: value `j` is `s[j / 16] * q[j] (+ o[j / 16])`. Types with
/// one scale per 32 values repeat it in both halves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Group {
    pub q: [i8; GROUP],
    pub s: [f32; 2],
    pub o: [f32; 2],
}

fn f16_at(b: &[u8], o: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[o], b[o + 1]])).to_f32()
}

/// Low (`hi == false`) or high nibbles of 16 bytes, as 16 values.
fn nibbles(bytes: &[u8], hi: bool, out: &mut [i8]) {
    for (o, &b) in out[..16].iter_mut().zip(&bytes[..16]) {
        *o = (if hi { b >> 4 } else { b & 0xF }) as i8;
    }
}

/// The sixteen 6-bit signed scales of a Q3_K block (`s` is its 12 scale bytes).
fn q3_k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let lo = if i < 8 { s[i] & 0xF } else { s[i - 8] >> 4 };
        let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = (lo | (hi << 4)) as i8 - 32;
    }
    out
}

/// The 6-bit (scale, min) of group `g` of a Q4_K / Q5_K block (`s` is its 12 scale bytes).
fn k_scale_min(s: &[u8], g: usize) -> (u8, u8) {
    if g < 4 {
        (s[g] & 0x3F, s[4 + g] & 0x3F)
    } else {
        ((s[4 + g] & 0x0F) | ((s[g - 4] >> 2) & 0x30), (s[4 + g] >> 4) | ((s[g] >> 2) & 0x30))
    }
}

/// Group `g` of `block` (one block of `dt`, `g < dt.block_elems() / 32`).
///
/// Layouts (ggml's `block_*` structs; all f16 little-endian):
/// - Q4_1 (20 B): d, m, 16 B nibbles (value j low nibble of byte j, j+16 high): `d*q + m`.
/// - Q5_0 (22 B): d, 4 B high bits (bit j of a u32), nibbles: `d*(q - 16)`.
/// - Q5_1 (24 B): d, m, high bits, nibbles: `d*q + m`.
/// - IQ4_NL (18 B): d, nibbles indexing [`IQ4_LEVELS`]: `d*level`.
/// - Q2_K (84 B): 16 scale bytes (low nibble scale, high nibble min, per 16 values),
///   64 B of 2-bit quants (value `h*128 + s*32 + l` is bits 2s.. of byte `h*32 + l`),
///   d, dmin: `d*sc*q - dmin*m`.
/// - Q3_K (110 B): 32 B high-bit mask (bit `e / 32` of byte `e % 32`), 64 B of 2-bit
///   quants (as Q2_K), 12 B of 6-bit scales per 16, d: `d*(sc - 32)*(q - 4*(1 - hbit))`.
/// - Q4_K (144 B): d, dmin, 12 B of 6-bit (scale, min) per 32, 128 B nibbles (group
///   `2c + k` is nibble k of bytes `32c..32c+32`): `d*sc*q - dmin*m`.
/// - Q5_K (176 B): d, dmin, scales, 32 B high bits (bit `g` of byte `e % 32`), nibbles.
/// - Q6_K (210 B): 128 B low nibbles, 64 B high 2-bit pairs, 16 signed scales, d:
///   `d*sc*(q - 32)` per 16.
/// - IQ4_XS (136 B): d, u16 high scale bits, 4 B low scale nibbles, 128 B index
///   nibbles (group `ib`: low nibbles of bytes `16ib..16ib+16`, then their high ones):
///   `d*(ls - 32)*level`.
pub(crate) fn unpack(dt: DType, b: &[u8], g: usize) -> Group {
    let mut q = [0i8; GROUP];
    let (s, o): (f32, f32);
    match dt {
        DType::Q4_1 | DType::IQ4_NL => {
            let d = f16_at(b, 0);
            let qs = if dt == DType::Q4_1 { &b[4..20] } else { &b[2..18] };
            nibbles(qs, false, &mut q[..16]);
            nibbles(qs, true, &mut q[16..]);
            if dt == DType::IQ4_NL {
                q.iter_mut().for_each(|v| *v = IQ4_LEVELS[*v as usize]);
                (s, o) = (d, 0.0);
            } else {
                (s, o) = (d, f16_at(b, 2));
            }
        }
        DType::Q5_0 | DType::Q5_1 => {
            let off = if dt == DType::Q5_1 { 4 } else { 2 };
            let qh = u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]]);
            let qs = &b[off + 4..off + 20];
            nibbles(qs, false, &mut q[..16]);
            nibbles(qs, true, &mut q[16..]);
            for (j, v) in q.iter_mut().enumerate() {
                *v |= (((qh >> j) & 1) << 4) as i8;
            }
            if dt == DType::Q5_0 {
                q.iter_mut().for_each(|v| *v -= 16);
                (s, o) = (f16_at(b, 0), 0.0);
            } else {
                (s, o) = (f16_at(b, 0), f16_at(b, 2));
            }
        }
        DType::Q4_K | DType::Q5_K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let (sc, m) = k_scale_min(&b[4..16], g);
            let qs = if dt == DType::Q4_K { &b[16..144] } else { &b[48..176] };
            let c = &qs[(g / 2) * 32..(g / 2) * 32 + 32];
            for (v, &byte) in q.iter_mut().zip(c) {
                *v = (if g % 2 == 1 { byte >> 4 } else { byte & 0xF }) as i8;
            }
            if dt == DType::Q5_K {
                for (v, &h) in q.iter_mut().zip(&b[16..48]) {
                    *v |= (((h >> g) & 1) << 4) as i8;
                }
            }
            (s, o) = (d * sc as f32, -(dmin * m as f32));
        }
        DType::IQ4_XS => {
            let d = f16_at(b, 0);
            let sh = u16::from_le_bytes([b[2], b[3]]);
            let lo = (b[4 + g / 2] >> (4 * (g % 2))) & 0xF;
            let hi = ((sh >> (2 * g)) & 3) as u8;
            let qs = &b[8 + 16 * g..8 + 16 * g + 16];
            nibbles(qs, false, &mut q[..16]);
            nibbles(qs, true, &mut q[16..]);
            q.iter_mut().for_each(|v| *v = IQ4_LEVELS[*v as usize]);
            (s, o) = (d * ((lo | (hi << 4)) as i8 - 32) as f32, 0.0);
        }
        // Per-16 scales: both halves differ.
        DType::Q2_K => {
            let (h, sh) = (g / 4, 2 * (g % 4));
            for (l, v) in q.iter_mut().enumerate() {
                *v = ((b[16 + h * 32 + l] >> sh) & 3) as i8;
            }
            return per_16(dt, b, g, q);
        }
        DType::Q3_K => {
            let (hmask, qs) = (&b[0..32], &b[32..96]);
            let (h, sh) = (g / 4, 2 * (g % 4));
            for (l, v) in q.iter_mut().enumerate() {
                let lo = ((qs[h * 32 + l] >> sh) & 3) as i8;
                let hbit = (hmask[l] >> g) & 1;
                *v = lo - (((hbit ^ 1) << 2) as i8);
            }
            return per_16(dt, b, g, q);
        }
        DType::Q6_K => {
            let (ql, qh) = (&b[0..128], &b[128..192]);
            let (h, r0) = (g / 4, (g % 4) * 32);
            for (l, v) in q.iter_mut().enumerate() {
                let r = r0 + l;
                let lo = (ql[h * 64 + r % 64] >> (4 * (r / 64))) & 0xF;
                let hi = (qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
                *v = (lo | (hi << 4)) as i8 - 32;
            }
            return per_16(dt, b, g, q);
        }
        _ => unreachable!("{dt} is not a group-quantized type"),
    }
    Group { q, s: [s; 2], o: [o; 2] }
}

/// The [`Group`] of a type with a scale per 16 values: its half scales formed in f32 from
/// [`half_scales`] (one parse of the scale bytes for both the dequantization and the
/// kernels' integer group order). Q2_K's offset `dm * m` is `-(dmin * m)` bit for bit.
fn per_16(dt: DType, b: &[u8], g: usize, q: [i8; GROUP]) -> Group {
    let hs = half_scales(dt, b, g);
    let s = hs.k.map(|k| hs.d * k as f32);
    let o = if dt == DType::Q2_K { hs.m.map(|m| hs.dm * m as f32) } else { [0.0; 2] };
    Group { q, s, o }
}

/// The integer half scales of group `g` of a block of a type with a scale per 16
/// values (Q2_K, Q3_K, Q6_K), which the CPU kernels' group order multiplies into the
/// exact integer sums ([`unpack`]'s `s` and `o` are these formed in f32): `s[h] == d *
/// k[h]`, and for Q2_K `o[h] == dm * m[h]` with `dm = -dmin` (exact: a negation).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct HalfScales {
    /// Scale of each half: Q2_K 0..15, Q3_K -32..31, Q6_K -128..127.
    pub k: [i32; 2],
    /// Q2_K's mins (0..15); 0 for the others.
    pub m: [i32; 2],
    /// The block's scale.
    pub d: f32,
    /// Q2_K: the block's `-dmin`; 0 for the others.
    pub dm: f32,
}

/// [`HalfScales`] of group `g` of `block` (`dt` one of Q2_K, Q3_K, Q6_K).
pub(crate) fn half_scales(dt: DType, b: &[u8], g: usize) -> HalfScales {
    match dt {
        DType::Q2_K => {
            let (a, c) = (b[2 * g] as i32, b[2 * g + 1] as i32);
            HalfScales { k: [a & 0xF, c & 0xF], m: [a >> 4, c >> 4], d: f16_at(b, 80), dm: -f16_at(b, 82) }
        }
        DType::Q3_K => {
            let sc = q3_k_scales(&b[96..108]);
            HalfScales { k: [sc[2 * g] as i32, sc[2 * g + 1] as i32], m: [0; 2], d: f16_at(b, 108), dm: 0.0 }
        }
        DType::Q6_K => {
            let sc = &b[192..208];
            let k = [sc[2 * g] as i8 as i32, sc[2 * g + 1] as i8 as i32];
            HalfScales { k, m: [0; 2], d: f16_at(b, 208), dm: 0.0 }
        }
        _ => unreachable!("{dt} has no scale per 16 values"),
    }
}

/// Dequantizes a row of `dt` (whole blocks) into `dst`.
pub(super) fn dequantize(dt: DType, src: &[u8], dst: &mut [f32]) {
    let per_block = dt.block_elems() / GROUP;
    let offset = dt.has_offset();
    for (i, out) in dst.chunks_exact_mut(GROUP).enumerate() {
        let bb = dt.block_bytes();
        let blk = &src[(i / per_block) * bb..(i / per_block + 1) * bb];
        let gr = unpack(dt, blk, i % per_block);
        for (j, y) in out.iter_mut().enumerate() {
            let v = gr.s[j / 16] * gr.q[j] as f32;
            // No `+ 0.0` for types without an offset: it would turn -0.0 into +0.0.
            *y = if offset { v + gr.o[j / 16] } else { v };
        }
    }
}
