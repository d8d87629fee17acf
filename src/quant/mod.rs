//! Tensor types: the element types a weight can be stored in, their byte layouts
//! (exactly as ggml lays them out), and the row kernels over them: dequantize,
//! dot product with an f32 vector, quantize.
//!
//! Rows usually come straight from an mmap of a model file, so nothing here
//! assumes any alignment: every load goes through `from_le_bytes`.
//!
//! Determinism: [`dot_row`] accumulates into [`LANES`] independent f32 lanes
//! (element `i` of the row always goes to lane `i % LANES`, or for block types
//! a fixed position within its block) and reduces the lanes with a fixed
//! pairwise tree. The summation order therefore depends only on the row
//! length, never on the caller, the batch, the pointer's alignment or the CPU.
//! Rust never contracts `a * b + c` into an FMA on its own, so the result is
//! bit-for-bit reproducible.

use half::{bf16, f16};

/// Elements per Q8_0 / Q4_0 block.
pub(crate) const QK: usize = 32;

/// Independent accumulators used by [`dot_row`].
pub(crate) const LANES: usize = 16;

/// A tensor element type this runtime computes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
}

impl DType {
    /// All supported types.
    pub fn all() -> [DType; 5] {
        [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::Q8_0,
            DType::Q4_0,
        ]
    }

    /// The supported type for a ggml type id (0=F32, 1=F16, 2=Q4_0, 8=Q8_0, 30=BF16).
    pub fn from_ggml(id: u32) -> Option<DType> {
        match id {
            0 => Some(DType::F32),
            1 => Some(DType::F16),
            2 => Some(DType::Q4_0),
            8 => Some(DType::Q8_0),
            30 => Some(DType::BF16),
            _ => None,
        }
    }

    /// The ggml type id.
    pub fn ggml_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q8_0 => 8,
            DType::BF16 => 30,
        }
    }

    /// The name as ggml spells it.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Q8_0 => "Q8_0",
            DType::Q4_0 => "Q4_0",
        }
    }

    /// Elements per block (1 for the float types).
    pub fn block_elems(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 => QK,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 2 + QK,
            DType::Q4_0 => 2 + QK / 2,
        }
    }

    /// Bytes of a row of `n` elements; `None` if `n` is not a multiple of the
    /// block size or the size overflows `usize`.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        let be = self.block_elems();
        if !n.is_multiple_of(be) {
            return None;
        }
        (n / be).checked_mul(self.block_bytes())
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Name, elements per block and bytes per block of every ggml type id that
/// llama.cpp's ggml knows (as of ggml type count 42: up to Q1_0), including the
/// repacked Q4_0_x_x / IQ4_NL_x_x ids (31-33, 36-38) that ggml no longer
/// accepts in files but which old files may still carry. `None` for unknown ids
/// (including the long-removed Q4_2 = 4 and Q4_3 = 5).
pub fn ggml_type_info(id: u32) -> Option<(&'static str, usize, usize)> {
    const QK_K: usize = 256;
    Some(match id {
        0 => ("F32", 1, 4),
        1 => ("F16", 1, 2),
        2 => ("Q4_0", 32, 2 + 16),
        3 => ("Q4_1", 32, 2 + 2 + 16),
        6 => ("Q5_0", 32, 2 + 4 + 16),
        7 => ("Q5_1", 32, 2 + 2 + 4 + 16),
        8 => ("Q8_0", 32, 2 + 32),
        9 => ("Q8_1", 32, 4 + 4 + 32),
        10 => ("Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
        11 => ("Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
        12 => ("Q4_K", QK_K, 2 + 2 + QK_K / 2 + 12),
        13 => ("Q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
        14 => ("Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
        15 => ("Q8_K", QK_K, 4 + QK_K + QK_K / 8),
        16 => ("IQ2_XXS", QK_K, 2 + QK_K / 4),
        17 => ("IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32),
        18 => ("IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8),
        19 => ("IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16),
        20 => ("IQ4_NL", 32, 2 + 16),
        21 => ("IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
        22 => ("IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16),
        23 => ("IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
        24 => ("I8", 1, 1),
        25 => ("I16", 1, 2),
        26 => ("I32", 1, 4),
        27 => ("I64", 1, 8),
        28 => ("F64", 1, 8),
        29 => ("IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
        30 => ("BF16", 1, 2),
        31 => ("Q4_0_4_4", 32, 2 + 16),
        32 => ("Q4_0_4_8", 32, 2 + 16),
        33 => ("Q4_0_8_8", 32, 2 + 16),
        34 => ("TQ1_0", QK_K, 2 + 4 * 13),
        35 => ("TQ2_0", QK_K, 2 + 64),
        36 => ("IQ4_NL_4_4", 32, 2 + 16),
        37 => ("IQ4_NL_4_8", 32, 2 + 16),
        38 => ("IQ4_NL_8_8", 32, 2 + 16),
        39 => ("MXFP4", 32, 1 + 16),
        40 => ("NVFP4", 64, 4 + 32),
        41 => ("Q1_0", 128, 2 + 16),
        _ => return None,
    })
}

// ---------------------------------------------------------------------------
// Unaligned little-endian loads.

#[inline(always)]
fn ld_u16(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[2 * i], b[2 * i + 1]])
}

#[inline(always)]
fn ld_f32(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// `LANES` little-endian f32 from the first `4 * LANES` bytes of `b` (any alignment).
#[inline(always)]
fn load_f32s(b: &[u8]) -> [f32; LANES] {
    assert!(b.len() >= 4 * LANES);
    #[cfg(target_endian = "little")]
    {
        // SAFETY: `b` has at least 4 * LANES bytes (asserted above), which is
        // the size of [f32; LANES]; every bit pattern is a valid f32; and
        // `read_unaligned` has no alignment requirement. On a little-endian
        // target the in-memory layout equals `f32::from_le_bytes` per element.
        unsafe { (b.as_ptr() as *const [f32; LANES]).read_unaligned() }
    }
    #[cfg(not(target_endian = "little"))]
    {
        let mut o = [0f32; LANES];
        for (i, v) in o.iter_mut().enumerate() {
            *v = ld_f32(b, i);
        }
        o
    }
}

/// `LANES` little-endian u16 from the first `2 * LANES` bytes of `b` (any alignment).
#[inline(always)]
fn load_u16s(b: &[u8]) -> [u16; LANES] {
    assert!(b.len() >= 2 * LANES);
    #[cfg(target_endian = "little")]
    {
        // SAFETY: `b` has at least 2 * LANES bytes (asserted above), the size of
        // [u16; LANES]; every bit pattern is a valid u16; `read_unaligned` has
        // no alignment requirement; little-endian layout equals `from_le_bytes`.
        unsafe { (b.as_ptr() as *const [u16; LANES]).read_unaligned() }
    }
    #[cfg(not(target_endian = "little"))]
    {
        let mut o = [0u16; LANES];
        for (i, v) in o.iter_mut().enumerate() {
            *v = ld_u16(b, i);
        }
        o
    }
}

/// The first `LANES` elements of `x` as an array.
#[inline(always)]
fn lanes(x: &[f32]) -> &[f32; LANES] {
    match x.get(..LANES).map(<&[f32; LANES]>::try_from) {
        Some(Ok(a)) => a,
        _ => panic!("internal: lane chunk shorter than {LANES}"),
    }
}

#[inline(always)]
fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Exact IEEE half -> single conversion (subnormals, infinities and NaN
/// payloads included; NaNs are made quiet), written branch-free so that loops over it vectorise.
/// Bit-identical to `half::f16::to_f32` (tested over all 65536 inputs).
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
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

#[inline(always)]
fn block_scale(block: &[u8]) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([block[0], block[1]]))
}

fn check_row(dt: DType, row_len: usize, n: usize) {
    let want = dt.row_bytes(n);
    assert!(
        want == Some(row_len),
        "{} row of {} elements needs {:?} bytes, got {}",
        dt.name(),
        n,
        want,
        row_len
    );
}

/// The fixed final reduction of the lanes: a pairwise tree.
#[inline(always)]
fn reduce(mut acc: [f32; LANES]) -> f32 {
    let mut w = LANES / 2;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    acc[0]
}

// ---------------------------------------------------------------------------
// Dequantize.

/// Dequantize one row of `dst.len()` elements; `src` must be exactly
/// `dt.row_bytes(dst.len())` bytes.
///
/// # Panics
/// If `src.len()` does not match (a caller bug: rows are validated when a
/// model is loaded).
pub fn dequantize_row(dt: DType, src: &[u8], dst: &mut [f32]) {
    check_row(dt, src.len(), dst.len());
    match dt {
        DType::F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        DType::F16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16_bits_to_f32(u16::from_le_bytes([s[0], s[1]]));
            }
        }
        DType::BF16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16_bits_to_f32(u16::from_le_bytes([s[0], s[1]]));
            }
        }
        DType::Q8_0 => {
            for (dc, b) in dst
                .chunks_exact_mut(QK)
                .zip(src.chunks_exact(DType::Q8_0.block_bytes()))
            {
                let d = block_scale(b);
                for j in 0..QK {
                    dc[j] = d * (b[2 + j] as i8) as f32;
                }
            }
        }
        DType::Q4_0 => {
            for (dc, b) in dst
                .chunks_exact_mut(QK)
                .zip(src.chunks_exact(DType::Q4_0.block_bytes()))
            {
                let d = block_scale(b);
                for j in 0..QK / 2 {
                    let q = b[2 + j];
                    dc[j] = d * ((q & 0x0F) as i32 - 8) as f32;
                    dc[j + QK / 2] = d * ((q >> 4) as i32 - 8) as f32;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Dot product.

/// Dot product of one stored row (`x.len()` elements of type `dt`) with `x`.
///
/// Deterministic: the summation order depends only on `x.len()` (see the
/// module docs). For Q8_0/Q4_0 each block's 32 products are summed into the
/// 16 lanes (lane `l` gets elements `l` and `l + 16` of the block, in that
/// order), scaled by the block scale and added to the running lanes.
///
/// # Panics
/// If `row.len() != dt.row_bytes(x.len())` (a caller bug).
pub fn dot_row(dt: DType, row: &[u8], x: &[f32]) -> f32 {
    check_row(dt, row.len(), x.len());
    match dt {
        DType::F32 => dot_f32(row, x),
        DType::F16 => dot_f16(row, x),
        DType::BF16 => dot_bf16(row, x),
        DType::Q8_0 => dot_q8_0(row, x),
        DType::Q4_0 => dot_q4_0(row, x),
    }
}

/// The shared lane loop of the float types: `w(chunk)` decodes `LANES`
/// elements from `row_bytes_per_lane * LANES` bytes, `one(i)` decodes element `i`.
#[inline(always)]
fn dot_float(
    row: &[u8],
    x: &[f32],
    bytes_per_elem: usize,
    w: impl Fn(&[u8]) -> [f32; LANES],
    one: impl Fn(usize) -> f32,
) -> f32 {
    let mut acc = [0f32; LANES];
    let full = x.len() / LANES * LANES;
    let chunk = bytes_per_elem * LANES;
    for (rc, xc) in row[..bytes_per_elem * full]
        .chunks_exact(chunk)
        .zip(x[..full].chunks_exact(LANES))
    {
        let wv = w(rc);
        let xv = lanes(xc);
        for l in 0..LANES {
            acc[l] += wv[l] * xv[l];
        }
    }
    for (l, i) in (full..x.len()).enumerate() {
        acc[l] += one(i) * x[i];
    }
    reduce(acc)
}

fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    dot_float(row, x, 4, load_f32s, |i| ld_f32(row, i))
}

#[inline(always)]
fn map_lanes(u: [u16; LANES], f: impl Fn(u16) -> f32) -> [f32; LANES] {
    let mut o = [0f32; LANES];
    for l in 0..LANES {
        o[l] = f(u[l]);
    }
    o
}

fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    dot_float(
        row,
        x,
        2,
        |c| map_lanes(load_u16s(c), bf16_bits_to_f32),
        |i| bf16_bits_to_f32(ld_u16(row, i)),
    )
}

fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    dot_float(
        row,
        x,
        2,
        |c| map_lanes(load_u16s(c), f16_bits_to_f32),
        |i| f16_bits_to_f32(ld_u16(row, i)),
    )
}

fn dot_q8_0(row: &[u8], x: &[f32]) -> f32 {
    const H: usize = QK / 2;
    let mut acc = [0f32; LANES];
    for (b, xb) in row
        .chunks_exact(DType::Q8_0.block_bytes())
        .zip(x.chunks_exact(QK))
    {
        let d = block_scale(b);
        let (x0, x1) = (lanes(&xb[..H]), lanes(&xb[H..]));
        let mut s = [0f32; H];
        for l in 0..H {
            s[l] = (b[2 + l] as i8) as f32 * x0[l];
        }
        for l in 0..H {
            s[l] += (b[2 + H + l] as i8) as f32 * x1[l];
        }
        for l in 0..H {
            acc[l] += d * s[l];
        }
    }
    reduce(acc)
}

fn dot_q4_0(row: &[u8], x: &[f32]) -> f32 {
    const H: usize = QK / 2;
    let mut acc = [0f32; LANES];
    for (b, xb) in row
        .chunks_exact(DType::Q4_0.block_bytes())
        .zip(x.chunks_exact(QK))
    {
        let d = block_scale(b);
        let (x0, x1) = (lanes(&xb[..H]), lanes(&xb[H..]));
        let mut s = [0f32; H];
        for l in 0..H {
            s[l] = ((b[2 + l] & 0x0F) as i32 - 8) as f32 * x0[l];
        }
        for l in 0..H {
            s[l] += ((b[2 + l] >> 4) as i32 - 8) as f32 * x1[l];
        }
        for l in 0..H {
            acc[l] += d * s[l];
        }
    }
    reduce(acc)
}

// ---------------------------------------------------------------------------
// Quantize.

/// Quantize `src` (`src.len()` elements) into a row of type `dt`; `dst` must
/// be exactly `dt.row_bytes(src.len())` bytes. Q8_0 and Q4_0 follow ggml's
/// reference `quantize_row_q8_0_ref` / `quantize_row_q4_0_ref`; F16 and BF16
/// round to nearest even.
///
/// # Panics
/// If `dst.len()` does not match (a caller bug).
pub fn quantize_row(dt: DType, src: &[f32], dst: &mut [u8]) {
    check_row(dt, dst.len(), src.len());
    match dt {
        DType::F32 => {
            for (d, s) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&s.to_le_bytes());
            }
        }
        DType::F16 => {
            for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f16::from_f32(*s).to_bits().to_le_bytes());
            }
        }
        DType::BF16 => {
            for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&bf16::from_f32(*s).to_bits().to_le_bytes());
            }
        }
        DType::Q8_0 => {
            for (b, xs) in dst
                .chunks_exact_mut(DType::Q8_0.block_bytes())
                .zip(src.chunks_exact(QK))
            {
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
        DType::Q4_0 => {
            for (b, xs) in dst
                .chunks_exact_mut(DType::Q4_0.block_bytes())
                .zip(src.chunks_exact(QK))
            {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64* with a fixed seed.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        /// Uniform in [-1, 1).
        fn f(&mut self) -> f32 {
            ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
            (0..n).map(|_| self.f() * scale).collect()
        }
    }

    fn quant(dt: DType, x: &[f32]) -> Vec<u8> {
        let mut q = vec![0u8; dt.row_bytes(x.len()).unwrap()];
        quantize_row(dt, x, &mut q);
        q
    }

    fn deq(dt: DType, q: &[u8], n: usize) -> Vec<f32> {
        let mut y = vec![0f32; n];
        dequantize_row(dt, q, &mut y);
        y
    }

    #[test]
    fn type_table() {
        for dt in DType::all() {
            assert_eq!(DType::from_ggml(dt.ggml_id()), Some(dt));
            let (name, be, bb) = ggml_type_info(dt.ggml_id()).unwrap();
            assert_eq!(
                (name, be, bb),
                (dt.name(), dt.block_elems(), dt.block_bytes())
            );
        }
        assert_eq!(DType::from_ggml(3), None);
        assert_eq!(ggml_type_info(4), None);
        assert_eq!(ggml_type_info(42), None);
        assert_eq!(ggml_type_info(12), Some(("Q4_K", 256, 144)));
        assert_eq!(ggml_type_info(14), Some(("Q6_K", 256, 210)));
        assert_eq!(DType::Q8_0.row_bytes(64), Some(68));
        assert_eq!(DType::Q4_0.row_bytes(64), Some(36));
        assert_eq!(DType::Q4_0.row_bytes(33), None);
        assert_eq!(DType::F32.row_bytes(usize::MAX), None);
        assert_eq!(DType::F16.row_bytes(3), Some(6));
    }

    #[test]
    fn f16_conversion_is_exact() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32().to_bits();
            assert_eq!(f16_bits_to_f32(h).to_bits(), want, "f16 bits {h:#06x}");
        }
    }

    #[test]
    fn known_bit_patterns() {
        // F16 1.0 = 0x3C00, -2.0 = 0xC000.
        assert_eq!(
            deq(DType::F16, &[0x00, 0x3C, 0x00, 0xC0], 2),
            vec![1.0, -2.0]
        );
        assert_eq!(
            quant(DType::F16, &[1.0, -2.0]),
            vec![0x00, 0x3C, 0x00, 0xC0]
        );
        // BF16 1.0 = 0x3F80, -0.5 = 0xBF00.
        assert_eq!(
            deq(DType::BF16, &[0x80, 0x3F, 0x00, 0xBF], 2),
            vec![1.0, -0.5]
        );
        assert_eq!(
            quant(DType::BF16, &[1.0, -0.5]),
            vec![0x80, 0x3F, 0x00, 0xBF]
        );
        // F32 1.0 = 0x3F800000.
        assert_eq!(deq(DType::F32, &[0, 0, 0x80, 0x3F], 1), vec![1.0]);

        // Q4_0: d = 0.5 (f16 0x3800); byte j = (hi << 4) | lo with lo = j, hi = 15 - j.
        let mut b = vec![0x00, 0x38];
        for j in 0..16u8 {
            b.push(((15 - j) << 4) | j);
        }
        let y = deq(DType::Q4_0, &b, 32);
        for j in 0..16 {
            assert_eq!(y[j], 0.5 * (j as f32 - 8.0));
            assert_eq!(y[j + 16], 0.5 * ((15 - j) as f32 - 8.0));
        }
        // ...and quantizing those values gives the block back (max |v| = -4 at j=0 -> d = 0.5).
        assert_eq!(quant(DType::Q4_0, &y), b);

        // Q8_0: d = 2.0 (f16 0x4000), q_j = j - 16.
        let mut b = vec![0x00, 0x40];
        for j in 0..32i32 {
            b.push((j - 16) as i8 as u8);
        }
        let y = deq(DType::Q8_0, &b, 32);
        for (j, v) in y.iter().enumerate() {
            assert_eq!(*v, 2.0 * (j as f32 - 16.0));
        }
    }

    #[test]
    fn q8_0_reference_quantize() {
        // amax = 127 -> d = 1, values round half away from zero.
        let mut x = vec![0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = 0.49;
        let q = quant(DType::Q8_0, &x);
        assert_eq!(&q[..2], &[0x00, 0x3C]);
        assert_eq!(q[2] as i8, 127);
        assert_eq!(q[3] as i8, 3);
        assert_eq!(q[4] as i8, -3);
        assert_eq!(q[5] as i8, 0);
        // All zeros: d = 0, q = 0.
        assert_eq!(quant(DType::Q8_0, &[0.0; 32]), vec![0u8; 34]);
        // Q4_0 of zeros: d = 0 / -8 = -0.0 (f16 0x8000, as in ggml), every nibble 8.
        assert_eq!(quant(DType::Q4_0, &[0.0; 32]), {
            let mut v = vec![0x00u8, 0x80];
            v.extend([0x88u8; 16]);
            v
        });
    }

    #[test]
    fn round_trip_random() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for &n in &[32usize, 64, 96, 256, 4096] {
            let x = rng.vec(n, 3.0);
            for dt in DType::all() {
                let y = deq(dt, &quant(dt, &x), n);
                for b in 0..n / 32 {
                    let blk = &x[32 * b..32 * b + 32];
                    let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let tol = match dt {
                        DType::F32 => 0.0,
                        DType::F16 => amax * 1e-3,
                        DType::BF16 => amax * 8e-3,
                        // half a step of amax/127, plus the f16 rounding of d.
                        DType::Q8_0 => amax / 127.0 * 0.5 + amax * 1e-3,
                        // half a step of amax/8 (one extra step at the clamped end), plus f16.
                        DType::Q4_0 => amax / 8.0 + amax * 1e-3,
                    };
                    for j in 32 * b..32 * b + 32 {
                        assert!(
                            (x[j] - y[j]).abs() <= tol,
                            "{dt} n={n} j={j}: {} vs {} (tol {tol})",
                            x[j],
                            y[j]
                        );
                    }
                }
                // Re-quantizing dequantized values is idempotent for every type.
                assert_eq!(deq(dt, &quant(dt, &y), n), y, "{dt} idempotence");
            }
        }
    }

    #[test]
    fn dot_matches_dequantize_then_dot() {
        let mut rng = Rng(12345);
        for &n in &[32usize, 64, 160, 512, 2048] {
            let w = rng.vec(n, 1.0);
            let x = rng.vec(n, 1.0);
            for dt in DType::all() {
                let q = quant(dt, &w);
                let y = deq(dt, &q, n);
                let exact: f64 = y.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                let abs: f64 = y
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                    .sum();
                let got = dot_row(dt, &q, &x) as f64;
                assert!(
                    (got - exact).abs() <= abs * 1e-6 + 1e-6,
                    "{dt} n={n}: {got} vs {exact}"
                );
            }
        }
        // Float types with lengths that are not a multiple of the lane count.
        for &n in &[1usize, 3, 17, 33, 100, 1000] {
            let w = rng.vec(n, 1.0);
            let x = rng.vec(n, 1.0);
            for dt in [DType::F32, DType::F16, DType::BF16] {
                let q = quant(dt, &w);
                let y = deq(dt, &q, n);
                let exact: f64 = y.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                let abs: f64 = y
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                    .sum();
                let got = dot_row(dt, &q, &x) as f64;
                assert!(
                    (got - exact).abs() <= abs * 1e-6 + 1e-6,
                    "{dt} n={n}: {got} vs {exact}"
                );
            }
        }
    }

    #[test]
    fn dot_is_independent_of_alignment() {
        let mut rng = Rng(777);
        let n = 320;
        let w = rng.vec(n, 1.0);
        let x = rng.vec(n, 1.0);
        for dt in DType::all() {
            let q = quant(dt, &w);
            let want = dot_row(dt, &q, &x).to_bits();
            for shift in 1..8 {
                let mut buf = vec![0u8; shift];
                buf.extend_from_slice(&q);
                assert_eq!(
                    dot_row(dt, &buf[shift..], &x).to_bits(),
                    want,
                    "{dt} shift {shift}"
                );
            }
        }
    }

    #[test]
    #[should_panic]
    fn dot_row_rejects_wrong_length() {
        dot_row(DType::Q8_0, &[0u8; 33], &[0f32; 32]);
    }
}
