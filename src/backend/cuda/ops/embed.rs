//! Embedding rows on the device: rows of a table of any weight type, dequantized to
//! f32. Twins: `backend/cpu/ops/embed.rs` (the CPU op), `kernels/embed.cu` (the
//! kernels); tests: `embed_*` in tests/cuda_kernels.rs.

use cudarc::driver::{CudaFunction, CudaSlice, PushKernelArg};

use super::matmul::{type_index, KERNEL_TYPES};
use super::{check_weight, launch_err, mul, need, rows_cfg, to_i32, DevWeight, Ops, EW_THREADS};
use crate::backend::cuda::load::Modules;
use crate::quant::DType;
use crate::{Error, Result};

/// The entry points of kernels/embed.cu: embed_f32_f32 and embed_<tag>_f32 per type
/// of [`KERNEL_TYPES`], in its order.
pub(super) struct Kernels {
    f32: CudaFunction,
    per_type: Vec<CudaFunction>,
}

impl Kernels {
    pub(super) fn load(m: &Modules) -> Result<Kernels> {
        Ok(Kernels {
            f32: m.function("embed", "embed_f32_f32")?,
            per_type: KERNEL_TYPES
                .iter()
                .map(|(_, t)| m.function("embed", &format!("embed_{t}_f32")))
                .collect::<Result<_>>()?,
        })
    }
}

impl Ops {
    /// `out[t][:] = row ids[t] of table`, dequantized to f32, for `t < n`.
    /// `table`: `[vocab][hidden]` of any supported type. Ids are trusted (checked on the host).
    ///
    /// (An id >= `table.rows` gives a NaN row on the device, never an out-of-bounds read.)
    pub fn embed(&self, table: &DevWeight, ids: &CudaSlice<u32>, n: usize, out: &mut CudaSlice<f32>) -> Result<()> {
        const OP: &str = "embed";
        check_weight(OP, table)?;
        let (vocab, hidden) = (table.rows, table.cols);
        need(OP, "ids", ids.len(), n)?;
        need(OP, "out", out.len(), mul(OP, n, hidden)?)?;
        let (n_i, hidden_i, vocab_i) =
            (to_i32(OP, "n", n)?, to_i32(OP, "hidden", hidden)?, to_i32(OP, "vocab", vocab)?);
        if n == 0 || hidden == 0 {
            return Ok(());
        }
        let k = &self.k.embed;
        let f = match (table.dtype, type_index(table.dtype)) {
            (DType::F32, _) => &k.f32,
            (_, Some(i)) => &k.per_type[i],
            (dt, None) => return Err(Error::internal(format!("{OP}: no embedding kernel for {dt} ({})", table.name))),
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&table.data).arg(ids).arg(out).arg(&n_i).arg(&hidden_i).arg(&vocab_i);
        // SAFETY: the arguments match embed_<type>_f32 in kernels/embed.cu (table, ids, out
        // pointers, then int n, hidden, vocab); check_weight verified the table holds
        // vocab rows of row_bytes(hidden) bytes (hidden a multiple of the block for quantized types, the kernel
        // of table.dtype picked by type_index), ids
        // holds >= n ids and out >= n*hidden f32; ids >= vocab are caught in the kernel;
        // the grid has one block per id.
        unsafe { b.launch(rows_cfg(n, EW_THREADS)) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }
}
