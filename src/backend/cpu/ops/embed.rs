//! Embedding gather: row `id` of the token embedding table (any [`DType`]),
//! dequantized to f32, for each token of the step.
//!
//! CUDA twin: `backend/cuda/ops/embed.rs`, `kernels/embed.cu`.
//!
//! Depends on `crate::quant` only.

use crate::quant::{self, DType};

/// `x[t] = table[ids[t]]` dequantized, for rows of `cols` values; `table` holds
/// the rows (`row_bytes` each, in `dtype`).
pub(crate) fn embed(
    dtype: DType,
    table: &[u8],
    row_bytes: usize,
    cols: usize,
    ids: impl Iterator<Item = u32>,
    x: &mut [f32],
) {
    for (row, id) in x.chunks_exact_mut(cols).zip(ids) {
        let o = id as usize * row_bytes;
        quant::dequantize_row(dtype, &table[o..o + row_bytes], row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::XorShift;

    /// Each gathered row is its table row decoded, for every type, ids repeated
    /// and out of order.
    #[test]
    fn embed_gathers_the_dequantized_rows() {
        let (vocab, cols) = (7, 64);
        let mut rng = XorShift::new(0x000E_3BED);
        let values = rng.vec(vocab * cols, -2.0, 2.0);
        for dt in DType::all().into_iter().filter(|d| !d.is_grouped()) {
            let rb = dt.row_bytes(cols).unwrap();
            let mut table = vec![0u8; vocab * rb];
            for (r, src) in values.chunks_exact(cols).enumerate() {
                quant::quantize_row(dt, src, &mut table[r * rb..(r + 1) * rb]);
            }
            let ids = [3u32, 0, 6, 3, 1];
            let mut x = vec![f32::NAN; ids.len() * cols];
            embed(dt, &table, rb, cols, ids.iter().copied(), &mut x);
            for (row, &id) in x.chunks_exact(cols).zip(&ids) {
                let mut want = vec![0f32; cols];
                let o = id as usize * rb;
                quant::dequantize_row(dt, &table[o..o + rb], &mut want);
                assert_eq!(row, &want[..], "{dt} id {id}");
                // ... and the decoded row is the source row within the type's rounding.
                let src = &values[id as usize * cols..(id as usize + 1) * cols];
                assert!(row.iter().zip(src).all(|(a, b)| (a - b).abs() <= 0.3), "{dt} id {id}");
            }
        }
    }
}
