//! Element-wise ops of the forward pass: bias add, residual add, SwiGLU
//! (`silu(gate) * up`) and the `y += a * x` of attention's weighted sum.
//!
//! CUDA twin: `backend/cuda/ops/elementwise.rs`, `kernels/elementwise.cu`.
//!
//! Depends on `pool` (the parallel SwiGLU).

use crate::backend::cpu::pool::{par_units, Pool};

/// Adds `b` to every row of `x`.
pub(crate) fn add_bias(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        for (v, &bi) in row.iter_mut().zip(b) {
            *v += bi;
        }
    }
}

/// `x += y`.
pub(crate) fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `g = silu(g) * u`.
pub(crate) fn swiglu(g: &mut [f32], u: &[f32]) {
    for (a, &b) in g.iter_mut().zip(u) {
        let s = *a / (1.0 + (-*a).exp());
        *a = s * b;
    }
}

/// `y += a * x`.
pub(crate) fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o += a * v;
    }
}

/// [`swiglu`] in parallel pieces of 256 values (one exp each: ~1% of a decode step).
pub(crate) fn swiglu_par(pool: &Pool, g: &mut [f32], u: &[f32]) {
    par_units(pool, g, 256, 256 * 32, 1, |u0, g| swiglu(g, &u[u0 * 256..]));
}
