//! Block layouts of ggml's quantized types beyond Q8_0 / Q4_0, and their scalar
//! dequantization: the reference every kernel of these types is held to.
//!
//! Each `dequant_*` turns one block (bytes exactly as ggml stores them, no
//! alignment assumed) into its `block_elems` f32 values, with the same f32
//! operations in the same order as gguf-py's `gguf.quants.dequantize` (numpy, no
//! FMA), so the results are bit-identical to it (tests/quant_dequant.rs checks
//! vectors gguf-py wrote). Products are formed as ggml forms them: the sub-block
//! scale first (`d * sc`), then times the quant, then the min subtracted.

use half::f16;

/// Elements per K-quant super-block.
pub(crate) const QK_K: usize = 256;

/// IQ4_NL / IQ4_XS: the 16 non-linear levels a 4-bit index selects.
pub(crate) const IQ4_LEVELS: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

fn f16_at(b: &[u8], o: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[o], b[o + 1]])).to_f32()
}

/// Q4_1 (32 values, 20 bytes: d, m, 16 bytes of nibbles): `d * q + m`.
pub(crate) fn dequant_q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for j in 0..16 {
        let q = b[4 + j];
        out[j] = d * (q & 0xF) as f32 + m;
        out[j + 16] = d * (q >> 4) as f32 + m;
    }
}

/// The 5-bit value `j` of a Q5_0 / Q5_1 block: its nibble and bit `j` of `qh`.
fn q5(qh: u32, qs: &[u8], j: usize) -> u8 {
    let nib = if j < 16 { qs[j] & 0xF } else { qs[j - 16] >> 4 };
    nib | ((((qh >> j) & 1) as u8) << 4)
}

/// Q5_0 (32 values, 22 bytes: d, 4 bytes of high bits, 16 bytes of nibbles): `d * (q - 16)`.
pub(crate) fn dequant_q5_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for (j, o) in out[..32].iter_mut().enumerate() {
        *o = d * (q5(qh, &b[6..22], j) as i8 - 16) as f32;
    }
}

/// Q5_1 (32 values, 24 bytes: d, m, high bits, nibbles): `d * q + m`.
pub(crate) fn dequant_q5_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for (j, o) in out[..32].iter_mut().enumerate() {
        *o = d * q5(qh, &b[8..24], j) as f32 + m;
    }
}

/// IQ4_NL (32 values, 18 bytes: d, 16 bytes of nibbles indexing [`IQ4_LEVELS`]).
pub(crate) fn dequant_iq4_nl(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        let q = b[2 + j];
        out[j] = d * IQ4_LEVELS[(q & 0xF) as usize] as f32;
        out[j + 16] = d * IQ4_LEVELS[(q >> 4) as usize] as f32;
    }
}

/// Q2_K (256 values, 84 bytes: 16 scale bytes (low nibble scale, high nibble min),
/// 64 bytes of 2-bit quants, d, dmin): per 16 values `d*sc * q - dmin*m`. Value
/// `h*128 + s*32 + l` is bits `2s..2s+2` of quant byte `h*32 + l`.
pub(crate) fn dequant_q2_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    let qs = &b[16..80];
    for (e, o) in out[..QK_K].iter_mut().enumerate() {
        let sc = b[e / 16];
        let (dl, ml) = (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32);
        let (h, s, l) = (e / 128, (e / 32) % 4, e % 32);
        let q = (qs[h * 32 + l] >> (2 * s)) & 3;
        *o = dl * q as f32 - ml;
    }
}

/// The sixteen 6-bit signed scales of a Q3_K block (`scales` is its 12 scale bytes).
pub(crate) fn q3_k_scales(scales: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let lo = if i < 8 { scales[i] & 0xF } else { scales[i - 8] >> 4 };
        let hi = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = (lo | (hi << 4)) as i8 - 32;
    }
    out
}

/// Q3_K (256 values, 110 bytes: 32 bytes of high-bit mask, 64 bytes of 2-bit
/// quants, 12 bytes of 6-bit scales, d): per 16 values `d*sc * q`, `q` in -4..=3
/// (the low two bits, minus 4 where the mask bit is clear).
pub(crate) fn dequant_q3_k(b: &[u8], out: &mut [f32]) {
    let (hmask, qs) = (&b[0..32], &b[32..96]);
    let sc = q3_k_scales(&b[96..108]);
    let d = f16_at(b, 108);
    for (e, o) in out[..QK_K].iter_mut().enumerate() {
        let dl = d * sc[e / 16] as f32;
        let (h, s, l) = (e / 128, (e / 32) % 4, e % 32);
        let lo = ((qs[h * 32 + l] >> (2 * s)) & 3) as i8;
        let hbit = (hmask[e % 32] >> (e / 32)) & 1;
        *o = dl * (lo - (((hbit ^ 1) << 2) as i8)) as f32;
    }
}

/// The eight 6-bit (scale, min) pairs of a Q4_K / Q5_K block (its 12 scale bytes).
pub(crate) fn k_scale_min(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 0x3F;
        mn[j] = s[4 + j] & 0x3F;
        sc[4 + j] = (s[8 + j] & 0x0F) | ((s[j] >> 2) & 0x30);
        mn[4 + j] = (s[8 + j] >> 4) | ((s[4 + j] >> 2) & 0x30);
    }
    (sc, mn)
}

/// Q4_K (256 values, 144 bytes: d, dmin, 12 scale bytes, 128 bytes of nibbles):
/// per 32 values `d*sc * q - dmin*m`. Sub-block `2c + k` holds nibble `k` of
/// bytes `32c..32c+32`.
pub(crate) fn dequant_q4_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, mn) = k_scale_min(&b[4..16]);
    let qs = &b[16..144];
    for (e, o) in out[..QK_K].iter_mut().enumerate() {
        let sb = e / 32;
        let (dl, ml) = (d * sc[sb] as f32, dmin * mn[sb] as f32);
        let q = (qs[(sb / 2) * 32 + e % 32] >> (4 * (sb % 2))) & 0xF;
        *o = dl * q as f32 - ml;
    }
}

/// Q5_K (256 values, 176 bytes: d, dmin, 12 scale bytes, 32 bytes of high bits,
/// 128 bytes of nibbles): as Q4_K with bit `e / 32` of high-bit byte `e % 32` as
/// the fifth bit.
pub(crate) fn dequant_q5_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, mn) = k_scale_min(&b[4..16]);
    let (qh, qs) = (&b[16..48], &b[48..176]);
    for (e, o) in out[..QK_K].iter_mut().enumerate() {
        let sb = e / 32;
        let (dl, ml) = (d * sc[sb] as f32, dmin * mn[sb] as f32);
        let lo = (qs[(sb / 2) * 32 + e % 32] >> (4 * (sb % 2))) & 0xF;
        let q = lo | (((qh[e % 32] >> sb) & 1) << 4);
        *o = dl * q as f32 - ml;
    }
}

/// Q6_K (256 values, 210 bytes: 128 bytes of low nibbles, 64 bytes of high 2-bit
/// pairs, 16 signed scales, d): per 16 values `d*sc * (q - 32)`.
pub(crate) fn dequant_q6_k(b: &[u8], out: &mut [f32]) {
    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for (e, o) in out[..QK_K].iter_mut().enumerate() {
        let dl = d * sc[e / 16] as i8 as f32;
        let (h, r) = (e / 128, e % 128);
        let lo = (ql[h * 64 + r % 64] >> (4 * (r / 64))) & 0xF;
        let hi = (qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
        *o = dl * ((lo | (hi << 4)) as i8 - 32) as f32;
    }
}

/// IQ4_XS (256 values, 136 bytes: d, 16 bits of high scale bits, 4 bytes of low
/// scale nibbles, 128 bytes of index nibbles): per 32 values `d*(ls - 32) * level`;
/// sub-block `ib` holds the low nibbles of bytes `16ib..16ib+16`, then their high ones.
pub(crate) fn dequant_iq4_xs(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let sh = u16::from_le_bytes([b[2], b[3]]);
    let (sl, qs) = (&b[4..8], &b[8..136]);
    for ib in 0..8 {
        let lo = (sl[ib / 2] >> (4 * (ib % 2))) & 0xF;
        let hi = ((sh >> (2 * ib)) & 3) as u8;
        let dl = d * ((lo | (hi << 4)) as i8 - 32) as f32;
        for j in 0..16 {
            let q = qs[ib * 16 + j];
            out[ib * 32 + j] = dl * IQ4_LEVELS[(q & 0xF) as usize] as f32;
            out[ib * 32 + 16 + j] = dl * IQ4_LEVELS[(q >> 4) as usize] as f32;
        }
    }
}

/// Q8_K (256 values, 292 bytes: f32 d, 256 signed quants, 16 i16 block sums):
/// `d * q`. ggml's activation type for the K-quant dot products; gguf-py has no
/// dequantization for it.
pub(crate) fn dequant_q8_k(b: &[u8], out: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (o, &q) in out[..QK_K].iter_mut().zip(&b[4..260]) {
        *o = d * q as i8 as f32;
    }
}
