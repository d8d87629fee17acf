//! RMSNorm on the device: out of place, in place (per-head Q/K norm) and fused with
//! the residual add that precedes it. Twins: `backend/cpu/ops/norm.rs` (the CPU op),
//! `kernels/norm.cu` (the kernels); tests: `norm_*` in tests/cuda_kernels.rs.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::{launch_err, mul, need, rows_cfg, to_i32, Ops};
use crate::error::Error;
use crate::Result;

kernel_set!("norm", {
    rmsnorm = "rmsnorm_f32",
    rmsnorm_inplace = "rmsnorm_inplace_f32",
    add_rmsnorm = "add_rmsnorm_f32",
});

/// The parameters of one RMSNorm: the weight `w` (`[n]`) and `eps`.
#[derive(Clone, Copy)]
pub struct RmsNorm<'a> {
    pub w: &'a CudaSlice<f32>,
    pub eps: f32,
}

/// Launch shape of the rmsnorm kernels (one block per row, enough threads for four
/// elements each, 32..=1024), with rows and n as i32; None when there are no rows.
pub(crate) fn rmsnorm_launch(op: &str, rows: usize, n: usize) -> Result<Option<(LaunchConfig, i32, i32)>> {
    if n == 0 {
        return Err(Error::invalid(format!("{op}: n must be > 0")));
    }
    let (rows_i, n_i) = (to_i32(op, "rows", rows)?, to_i32(op, "n", n)?);
    mul(op, rows, n)?;
    if rows == 0 {
        return Ok(None);
    }
    let threads = n.div_ceil(4).next_multiple_of(32).clamp(32, 1024) as u32;
    Ok(Some((rows_cfg(rows, threads), rows_i, n_i)))
}

impl Ops {
    /// `y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w` for `r < rows`, rows of `n`.
    pub fn rmsnorm(
        &self,
        norm: RmsNorm,
        x: &CudaSlice<f32>,
        rows: usize,
        n: usize,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        const OP: &str = "rmsnorm";
        let Some((cfg, rows_i, n_i)) = rmsnorm_launch(OP, rows, n)? else { return Ok(()) };
        need(OP, "x", x.len(), rows * n)?;
        need(OP, "y", y.len(), rows * n)?;
        need(OP, "w", norm.w.len(), n)?;
        let mut b = self.stream.launch_builder(&self.k.norm.rmsnorm);
        b.arg(x).arg(norm.w).arg(y).arg(&rows_i).arg(&n_i).arg(&norm.eps);
        // SAFETY: the arguments match rmsnorm_f32 in kernels/norm.cu (x, w, y pointers, then
        // int rows, int n, float eps); x and y hold >= rows*n f32 and w >= n, checked above;
        // x and y are distinct buffers (Rust borrows); one block per row, block size a
        // multiple of 32 in 32..=1024 as the kernel requires (rmsnorm_launch).
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// [`Self::rmsnorm`] in place (per-head Q/K norm: `rows = tokens * heads`, `n = head_dim`).
    pub fn rmsnorm_inplace(&self, norm: RmsNorm, x: &mut CudaSlice<f32>, rows: usize, n: usize) -> Result<()> {
        const OP: &str = "rmsnorm_inplace";
        let Some((cfg, rows_i, n_i)) = rmsnorm_launch(OP, rows, n)? else { return Ok(()) };
        need(OP, "x", x.len(), rows * n)?;
        need(OP, "w", norm.w.len(), n)?;
        let mut b = self.stream.launch_builder(&self.k.norm.rmsnorm_inplace);
        b.arg(x).arg(norm.w).arg(&rows_i).arg(&n_i).arg(&norm.eps);
        // SAFETY: the arguments match rmsnorm_inplace_f32 in kernels/norm.cu (x, w pointers,
        // then int rows, int n, float eps); x holds >= rows*n f32 and w >= n, checked above;
        // one block per row, block size a multiple of 32 in 32..=1024 (rmsnorm_launch).
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// The residual add fused with the next norm: `x[r] += d[r]`, then
    /// `y[r] = rmsnorm(x[r]) * w` for `r < rows`, rows of `n`. Bit-identical to
    /// [`Self::add`] then [`Self::rmsnorm`].
    pub fn add_rmsnorm(
        &self,
        norm: RmsNorm,
        x: &mut CudaSlice<f32>,
        d: &CudaSlice<f32>,
        rows: usize,
        n: usize,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        const OP: &str = "add_rmsnorm";
        let Some((cfg, rows_i, n_i)) = rmsnorm_launch(OP, rows, n)? else { return Ok(()) };
        let total = rows * n;
        need(OP, "x", x.len(), total)?;
        need(OP, "d", d.len(), total)?;
        need(OP, "y", y.len(), total)?;
        need(OP, "w", norm.w.len(), n)?;
        let mut b = self.stream.launch_builder(&self.k.norm.add_rmsnorm);
        b.arg(x).arg(d).arg(norm.w).arg(y).arg(&rows_i).arg(&n_i).arg(&norm.eps);
        // SAFETY: the arguments match add_rmsnorm_f32 in kernels/norm.cu (x, d, w, y pointers,
        // then int rows, int n, float eps); x, d and y hold >= rows*n f32 and w >= n, checked
        // above; x, d and y are distinct buffers (Rust borrows: x and y are &mut); one block
        // per row, block size a multiple of 32 in 32..=1024 as the kernel requires.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }
}
