//! Element-wise ops on the device: bias add, residual add, SwiGLU, row gather, the
//! weighted row scatter-add of the experts and the greedy argmax. Twins: `backend/cpu/ops/elementwise.rs` (the CPU ops; argmax is
//! `crate::util::argmax`), `kernels/elementwise.cu` (the kernels); tests:
//! `elementwise_*` in tests/cuda_kernels.rs.

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};

use super::{ew_cfg, launch_err, mul, need, rows_cfg, to_i32, Ops, EW_THREADS};
use crate::error::Error;
use crate::Result;

kernel_set!("elementwise", {
    add_bias = "add_bias_f32",
    add = "add_f32",
    swiglu = "swiglu_f32",
    geglu = "geglu_f32",
    scale = "scale_f32",
    softcap = "softcap_f32",
    gather_rows = "gather_rows_f32",
    scatter_axpy = "scatter_axpy_f32",
    argmax_part = "argmax_part_f32",
    argmax_final = "argmax_final_f32",
});

/// Logits per block of the first argmax stage (`ARGMAX_CHUNK` in kernels/elementwise.cu).
const ARGMAX_CHUNK: usize = 4096;
/// Threads per block of the first argmax stage (`ARGMAX_THREADS`).
const ARGMAX_THREADS: u32 = 256;
/// The grid's y dimension holds at most this many blocks.
const GRID_Y_MAX: usize = 65535;

impl Ops {
    /// `x[r][i] += b[i]` for `r < rows`, `i < n`.
    pub fn add_bias(&self, x: &mut CudaSlice<f32>, b: &CudaSlice<f32>, rows: usize, n: usize) -> Result<()> {
        const OP: &str = "add_bias";
        let total = mul(OP, rows, n)?;
        need(OP, "x", x.len(), total)?;
        need(OP, "b", b.len(), n)?;
        let (rows_i, n_i) = (to_i32(OP, "rows", rows)?, to_i32(OP, "n", n)?);
        if total == 0 {
            return Ok(());
        }
        let mut lb = self.stream.launch_builder(&self.k.elementwise.add_bias);
        lb.arg(x).arg(b).arg(&rows_i).arg(&n_i);
        // SAFETY: the arguments match add_bias_f32 in kernels/elementwise.cu (x, b pointers,
        // int rows, int n); x holds >= rows*n f32 and b >= n (n > 0 since rows*n > 0), checked
        // above; the grid-stride loop (64-bit index) covers rows*n with any grid.
        unsafe { lb.launch(ew_cfg(total)) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// `x[i] += y[i]` for `i < n`.
    pub fn add(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>, n: usize) -> Result<()> {
        self.binary("add", &self.k.elementwise.add, x, y, n)
    }

    /// `g[i] = silu(g[i]) * u[i]` for `i < n`.
    pub fn swiglu(&self, g: &mut CudaSlice<f32>, u: &CudaSlice<f32>, n: usize) -> Result<()> {
        self.binary("swiglu", &self.k.elementwise.swiglu, g, u, n)
    }

    /// `g[i] = gelu_tanh(g[i]) * u[i]` for `i < n` (GeGLU, gemma).
    pub fn geglu(&self, g: &mut CudaSlice<f32>, u: &CudaSlice<f32>, n: usize) -> Result<()> {
        self.binary("geglu", &self.k.elementwise.geglu, g, u, n)
    }

    /// `x[i] *= s` for `i < n` (gemma's embedding scale).
    pub fn scale(&self, x: &mut CudaSlice<f32>, s: f32, n: usize) -> Result<()> {
        self.unary_scalar("scale", &self.k.elementwise.scale, x, s, n)
    }

    /// `x[i] = c * tanh(x[i] / c)` for `i < n`, `c > 0` (gemma's final logit soft cap).
    pub fn softcap(&self, x: &mut CudaSlice<f32>, c: f32, n: usize) -> Result<()> {
        if !(c.is_finite() && c > 0.0) {
            return Err(Error::invalid(format!("softcap: cap {c} must be finite and > 0")));
        }
        self.unary_scalar("softcap", &self.k.elementwise.softcap, x, c, n)
    }

    /// Launches `f` (scale_f32 or softcap_f32: `x[i] = op(x[i], s)` for `i < n`).
    fn unary_scalar(&self, op: &str, f: &CudaFunction, x: &mut CudaSlice<f32>, s: f32, n: usize) -> Result<()> {
        need(op, "x", x.len(), n)?;
        let n_i = to_i32(op, "n", n)?;
        if n == 0 {
            return Ok(());
        }
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(&s).arg(&n_i);
        // SAFETY: `f` is scale_f32 or softcap_f32 of kernels/elementwise.cu, both taking (x
        // pointer, float, int n); x holds >= n f32 (checked above); the grid-stride loop
        // covers n with any grid.
        unsafe { b.launch(ew_cfg(n)) }.map_err(|e| launch_err(op, e))?;
        Ok(())
    }

    /// Launches `f` (add_f32, swiglu_f32 or geglu_f32: `x[i] = op(x[i], y[i])` for `i < n`).
    fn binary(&self, op: &str, f: &CudaFunction, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>, n: usize) -> Result<()> {
        need(op, "x", x.len(), n)?;
        need(op, "y", y.len(), n)?;
        let n_i = to_i32(op, "n", n)?;
        if n == 0 {
            return Ok(());
        }
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(y).arg(&n_i);
        // SAFETY: `f` is add_f32, swiglu_f32 or geglu_f32 of kernels/elementwise.cu, all taking (x, y
        // pointers, int n); both buffers hold >= n f32 (checked above) and are distinct (x is
        // &mut); the grid-stride loop covers n with any grid.
        unsafe { b.launch(ew_cfg(n)) }.map_err(|e| launch_err(op, e))?;
        Ok(())
    }

    /// `out[i][:] = x[idx[i]][:]` for `i < n_idx`, rows of `width`.
    ///
    /// (An index >= `x.len() / width` gives a NaN row on the device: a guard.)
    pub fn gather_rows(
        &self,
        x: &CudaSlice<f32>,
        idx: &CudaSlice<u32>,
        n_idx: usize,
        width: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        const OP: &str = "gather_rows";
        need(OP, "idx", idx.len(), n_idx)?;
        need(OP, "out", out.len(), mul(OP, n_idx, width)?)?;
        let (n_i, width_i) = (to_i32(OP, "n_idx", n_idx)?, to_i32(OP, "width", width)?);
        if n_idx == 0 || width == 0 {
            return Ok(());
        }
        let x_rows = i32::try_from(x.len() / width).unwrap_or(i32::MAX);
        let mut b = self.stream.launch_builder(&self.k.elementwise.gather_rows);
        b.arg(x).arg(idx).arg(out).arg(&n_i).arg(&width_i).arg(&x_rows);
        // SAFETY: the arguments match gather_rows_f32 in kernels/elementwise.cu (x, idx, out
        // pointers, int n_idx, width, x_rows); x holds x_rows full rows (x_rows = len/width,
        // rows at or past it are refused by the kernel), idx >= n_idx and out >= n_idx*width
        // (checked above); one block per index.
        unsafe { b.launch(rows_cfg(n_idx, EW_THREADS)) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// `out[idx[i]][:] += w[i] * y[i][:]` for `i < n_idx`, rows of `width`: the CPU's
    /// `axpy` per row (product and sum rounded separately), bit for bit. The indices must
    /// be distinct (the mixture-of-experts block adds one expert's rows, one per token, per
    /// launch); an index >= `out_rows` is skipped by the kernel (a guard).
    #[allow(clippy::too_many_arguments)]
    pub fn scatter_axpy(
        &self,
        out: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
        idx: &CudaSlice<u32>,
        w: &CudaSlice<f32>,
        n_idx: usize,
        width: usize,
        out_rows: usize,
    ) -> Result<()> {
        const OP: &str = "scatter_axpy";
        need(OP, "idx", idx.len(), n_idx)?;
        need(OP, "w", w.len(), n_idx)?;
        need(OP, "y", y.len(), mul(OP, n_idx, width)?)?;
        need(OP, "out", out.len(), mul(OP, out_rows, width)?)?;
        let (n_i, width_i, rows_i) =
            (to_i32(OP, "n_idx", n_idx)?, to_i32(OP, "width", width)?, to_i32(OP, "out_rows", out_rows)?);
        if n_idx == 0 || width == 0 {
            return Ok(());
        }
        let mut b = self.stream.launch_builder(&self.k.elementwise.scatter_axpy);
        b.arg(out).arg(y).arg(idx).arg(w).arg(&n_i).arg(&width_i).arg(&rows_i);
        // SAFETY: the arguments match scatter_axpy_f32 in kernels/elementwise.cu (out, y, idx,
        // w pointers, int n_idx, width, out_rows); out holds >= out_rows*width f32 (indices at
        // or past out_rows are skipped by the kernel), y >= n_idx*width, idx and w >= n_idx
        // (checked above); out is distinct from y (&mut); one block per index, and a
        // repeated index would only race on its own row's values (no memory-safety issue).
        unsafe { b.launch(rows_cfg(n_idx, EW_THREADS)) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// `u32` words of the partials [`Self::argmax`] needs for `rows` rows of `vocab`:
    /// a (value, index) pair per row and chunk of 4096 logits.
    pub fn argmax_scratch_len(rows: usize, vocab: usize) -> usize {
        rows.saturating_mul(vocab.div_ceil(ARGMAX_CHUNK)).saturating_mul(2)
    }

    /// `out[r]` = index of the largest value of row r of `logits` (`[rows][vocab]`),
    /// the first one on ties, for `r < rows`: exactly `crate::util::argmax` (NaN never
    /// wins, but a NaN at index 0 is never beaten, so its row gives 0; a row with nothing
    /// above -inf gives 0).
    ///
    /// Two launches: blocks of 256 threads over chunks of 4096 logits of every row (a
    /// 128k vocabulary is 32 blocks a row) write their first max into `part` (at least
    /// [`Self::argmax_scratch_len`] words), then a warp per row reduces them.
    pub fn argmax(
        &self,
        logits: &CudaSlice<f32>,
        rows: usize,
        vocab: usize,
        part: &mut CudaSlice<u32>,
        out: &mut CudaSlice<u32>,
    ) -> Result<()> {
        const OP: &str = "argmax";
        if vocab == 0 && rows > 0 {
            return Err(Error::invalid(format!("{OP}: vocab must be > 0")));
        }
        need(OP, "logits", logits.len(), mul(OP, rows, vocab)?)?;
        need(OP, "out", out.len(), rows)?;
        let n_chunks = vocab.div_ceil(ARGMAX_CHUNK);
        let part_len = mul(OP, mul(OP, rows, n_chunks)?, 2)?;
        need(OP, "part", part.len(), part_len)?;
        let (rows_i, vocab_i, chunks_i) =
            (to_i32(OP, "rows", rows)?, to_i32(OP, "vocab", vocab)?, to_i32(OP, "n_chunks", n_chunks)?);
        if rows == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (n_chunks as u32, rows.min(GRID_Y_MAX) as u32, 1),
            block_dim: (ARGMAX_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.k.elementwise.argmax_part);
        b.arg(logits).arg(&mut *part).arg(&rows_i).arg(&vocab_i).arg(&chunks_i);
        // SAFETY: the arguments match argmax_part_f32 in kernels/elementwise.cu (logits, part
        // pointers, int rows, vocab, n_chunks); logits holds >= rows*vocab f32 and part >=
        // rows*n_chunks*2 u32 (checked above), n_chunks = ceil(vocab / ARGMAX_CHUNK) (the
        // kernel's chunk), grid (n_chunks, min(rows, 65535)) with the kernel looping over
        // the rest of the rows, block ARGMAX_THREADS (its launch bound).
        unsafe { b.launch(cfg) }.map_err(|e| launch_err("argmax_part", e))?;
        let mut b = self.stream.launch_builder(&self.k.elementwise.argmax_final);
        b.arg(logits).arg(&*part).arg(out).arg(&rows_i).arg(&vocab_i).arg(&chunks_i);
        // SAFETY: the arguments match argmax_final_f32 in kernels/elementwise.cu (logits,
        // part, out pointers, int rows, vocab, n_chunks); the sizes are those checked for
        // the first stage, which wrote every partial of part's first rows*n_chunks*2 words
        // (it runs before on the same stream); out holds >= rows u32; one warp per row.
        unsafe { b.launch(rows_cfg(rows, 32)) }.map_err(|e| launch_err("argmax_final", e))?;
        Ok(())
    }
}
