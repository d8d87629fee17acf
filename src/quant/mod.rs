//! Tensor types: the element types a weight can be stored in ([`DType`]), the
//! table of every ggml type id (`ggml_type_info`), row sizes, and the row
//! conversions over them: [`dequantize_row`] (stored row to f32) and
//! [`quantize_row`] (f32 to a stored row, as ggml's reference quantizers do).
//! Each type family has its own file: `float` (F32, F16, BF16), `q8_0`, `q4_0`.
//! Adding a type: a variant of [`DType`], its line in `DType::traits` (and the
//! ggml table if new there), a file with its two row functions, and their arms in
//! [`dequantize_row`] / [`quantize_row`].
//!
//! Rows usually come straight from an mmap of a model file, so nothing here
//! assumes any alignment: every load goes through `from_le_bytes`.
//!
//! The dot products over these rows, and so the summation orders of the CPU
//! backend, are the kernels' (`backend/cpu/simd.rs` for the lane orders,
//! `qpack.rs` / `fpack.rs` for the block and sequential orders), not defined here.
//!
//! Depends on nothing else in the crate (`half` for the f32 -> f16/bf16 rounding).

mod float;
pub(crate) mod groups;
mod q4_0;
mod q8_0;

pub(crate) use float::{bf16_bits_to_f32, f16_bits_to_f32};
use groups::QK_K;

/// Elements per Q8_0 / Q4_0 block.
pub(crate) const QK: usize = 32;

/// A tensor element type this runtime computes with (named as ggml names them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    IQ4_NL,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_XS,
}

/// What the runtime knows of a [`DType`]: its ggml id and name, and its block.
struct Traits {
    ggml_id: u32,
    name: &'static str,
    block_elems: usize,
    block_bytes: usize,
}

impl DType {
    /// All supported types.
    pub fn all() -> [DType; 15] {
        use DType::*;
        [F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS]
    }

    /// The one table of the supported types (checked against [`ggml_type_info`]
    /// by the tests).
    #[inline(always)]
    const fn traits(self) -> Traits {
        let (ggml_id, name, block_elems, block_bytes) = match self {
            DType::F32 => (0, "F32", 1, 4),
            DType::F16 => (1, "F16", 1, 2),
            DType::BF16 => (30, "BF16", 1, 2),
            DType::Q8_0 => (8, "Q8_0", QK, 2 + QK),
            DType::Q4_0 => (2, "Q4_0", QK, 2 + QK / 2),
            DType::Q4_1 => (3, "Q4_1", QK, 4 + QK / 2),
            DType::Q5_0 => (6, "Q5_0", QK, 6 + QK / 2),
            DType::Q5_1 => (7, "Q5_1", QK, 8 + QK / 2),
            DType::IQ4_NL => (20, "IQ4_NL", QK, 2 + QK / 2),
            DType::Q2_K => (10, "Q2_K", QK_K, 84),
            DType::Q3_K => (11, "Q3_K", QK_K, 110),
            DType::Q4_K => (12, "Q4_K", QK_K, 144),
            DType::Q5_K => (13, "Q5_K", QK_K, 176),
            DType::Q6_K => (14, "Q6_K", QK_K, 210),
            DType::IQ4_XS => (23, "IQ4_XS", QK_K, 136),
        };
        Traits { ggml_id, name, block_elems, block_bytes }
    }

    /// One of the group-quantized types of `groups` (everything but the float
    /// types, Q8_0 and Q4_0, which have kernels of their own).
    pub fn is_grouped(self) -> bool {
        !matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::Q8_0 | DType::Q4_0)
    }

    /// A grouped type whose values carry an offset (`s * q + o`: Q4_1, Q5_1, Q2_K,
    /// Q4_K, Q5_K).
    pub fn has_offset(self) -> bool {
        matches!(self, DType::Q4_1 | DType::Q5_1 | DType::Q2_K | DType::Q4_K | DType::Q5_K)
    }

    /// A grouped type with a scale (and offset) per 16 values instead of per 32
    /// (Q2_K, Q3_K, Q6_K).
    pub fn halves(self) -> bool {
        matches!(self, DType::Q2_K | DType::Q3_K | DType::Q6_K)
    }

    /// Byte offsets, within one block, of the block's f16 scale fields (`d`, and
    /// `m` / `dmin` where the type has one); empty for the float types. For tests
    /// and fuzzers that make valid blocks from random bytes.
    pub fn f16_scale_offsets(self) -> &'static [usize] {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => &[],
            DType::Q8_0 | DType::Q4_0 | DType::Q5_0 | DType::IQ4_NL | DType::IQ4_XS => &[0],
            DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
            DType::Q2_K => &[80, 82],
            DType::Q3_K => &[108],
            DType::Q6_K => &[208],
        }
    }

    /// The supported type for a ggml type id.
    pub fn from_ggml(id: u32) -> Option<DType> {
        DType::all().into_iter().find(|d| d.ggml_id() == id)
    }

    /// The ggml type id.
    pub fn ggml_id(self) -> u32 {
        self.traits().ggml_id
    }

    /// The name as ggml spells it.
    pub fn name(self) -> &'static str {
        self.traits().name
    }

    /// Elements per block (1 for the float types).
    pub fn block_elems(self) -> usize {
        self.traits().block_elems
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.traits().block_bytes
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
/// llama.cpp's ggml knows (as of gguf-py 0.19.0, ggml type count 43: up to Q2_0;
/// held to gguf-py's table by `tests::ggml_table_matches_gguf_py`), including the
/// repacked Q4_0_x_x / IQ4_NL_x_x ids (31-33, 36-38) that ggml no longer
/// accepts in files but which old files may still carry. `None` for unknown ids
/// (including the long-removed Q4_2 = 4 and Q4_3 = 5).
pub(crate) fn ggml_type_info(id: u32) -> Option<(&'static str, usize, usize)> {
    Some(match id {
        0 => ("F32", 1, 4),
        1 => ("F16", 1, 2),
        2 => ("Q4_0", 32, 2 + 16),
        3 => ("Q4_1", 32, 2 + 2 + 16),
        6 => ("Q5_0", 32, 2 + 4 + 16),
        7 => ("Q5_1", 32, 2 + 2 + 4 + 16),
        8 => ("Q8_0", 32, 2 + 32),
        9 => ("Q8_1", 32, 2 + 2 + 32),
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
        42 => ("Q2_0", 64, 2 + 16),
        _ => return None,
    })
}

/// The f16 scale at the start of a Q8_0 / Q4_0 block.
#[inline(always)]
fn block_scale(block: &[u8]) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([block[0], block[1]]))
}

fn check_row(dt: DType, row_len: usize, n: usize) {
    let want = dt.row_bytes(n);
    assert!(want == Some(row_len), "{} row of {} elements needs {:?} bytes, got {}", dt.name(), n, want, row_len);
}

/// Dequantize one row of `dst.len()` elements; `src` must be exactly
/// `dt.row_bytes(dst.len())` bytes.
///
/// # Panics
/// If `src.len()` does not match (a caller bug: rows are validated when a
/// model is loaded).
pub fn dequantize_row(dt: DType, src: &[u8], dst: &mut [f32]) {
    check_row(dt, src.len(), dst.len());
    match dt {
        DType::F32 => float::dequantize_f32(src, dst),
        DType::F16 => float::dequantize_f16(src, dst),
        DType::BF16 => float::dequantize_bf16(src, dst),
        DType::Q8_0 => q8_0::dequantize(src, dst),
        DType::Q4_0 => q4_0::dequantize(src, dst),
        _ => groups::dequantize(dt, src, dst),
    }
}

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
        DType::F32 => float::quantize_f32(src, dst),
        DType::F16 => float::quantize_f16(src, dst),
        DType::BF16 => float::quantize_bf16(src, dst),
        DType::Q8_0 => q8_0::quantize(src, dst),
        DType::Q4_0 => q4_0::quantize(src, dst),
        _ => panic!("no quantizer for {dt}: files bring these types quantized (llama-quantize)"),
    }
}

#[cfg(test)]
mod tests;
