//! Element-wise ops of the forward pass: bias add, residual add, SwiGLU
//! (`silu(gate) * up`), GeGLU (`gelu_tanh(gate) * up`, gemma), the scale of gemma's
//! embeddings, the soft cap `c * tanh(x / c)` of gemma's logits and the `y += a * x`
//! of attention's weighted sum.
//!
//! CUDA twin: `backend/cuda/ops/elementwise.rs`, `kernels/elementwise.cu`.
//!
//! Depends on `pool` (the parallel SwiGLU).

use crate::backend::cpu::attn::tanh_f32;
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

/// The tanh approximation of GELU (transformers' `gelu_pytorch_tanh`):
/// `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`.
#[inline]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const K: f32 = 0.797_884_6; // sqrt(2 / pi)
    0.5 * x * (1.0 + tanh_f32(K * (x + 0.044715 * x * x * x)))
}

/// `g = gelu_tanh(g) * u`.
pub(crate) fn geglu(g: &mut [f32], u: &[f32]) {
    for (a, &b) in g.iter_mut().zip(u) {
        *a = gelu_tanh(*a) * b;
    }
}

/// `x *= s`.
pub(crate) fn scale(x: &mut [f32], s: f32) {
    x.iter_mut().for_each(|v| *v *= s);
}

/// `x = c * tanh(x / c)`: the soft cap of gemma's logits (transformers divides,
/// takes tanh, multiplies, as here; tanh is `attn::tanh_f32`).
pub(crate) fn softcap(x: &mut [f32], c: f32) {
    x.iter_mut().for_each(|v| *v = c * tanh_f32(*v / c));
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

/// [`geglu`] in parallel pieces of 256 values.
pub(crate) fn geglu_par(pool: &Pool, g: &mut [f32], u: &[f32]) {
    par_units(pool, g, 256, 256 * 32, 1, |u0, g| geglu(g, &u[u0 * 256..]));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::XorShift;

    /// SwiGLU against its f64 definition, and the parallel version bit for bit
    /// the serial one on 1-3 threads (a length that leaves a partial piece).
    #[test]
    fn elementwise_swiglu_matches_definition_at_any_thread_count() {
        let mut rng = XorShift::new(0x5_1_6_1_0);
        let n = 256 * 40 + 77;
        let (g, u) = (rng.vec(n, -8.0, 8.0), rng.vec(n, -2.0, 2.0));
        let mut want = g.clone();
        swiglu(&mut want, &u);
        for (i, w) in want.iter().enumerate() {
            let x = g[i] as f64;
            let exact = x / (1.0 + (-x).exp()) * u[i] as f64;
            assert!((*w as f64 - exact).abs() <= 1e-5 * (1.0 + exact.abs()), "{i}: {w} vs {exact}");
        }
        for threads in 1..=3 {
            let mut got = g.clone();
            swiglu_par(&Pool::new(threads), &mut got, &u);
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "threads {threads}");
        }
    }

    /// GeGLU against GELU's tanh form in f64 (and bit for bit in parallel), the scale
    /// and the soft cap against theirs.
    #[test]
    fn elementwise_geglu_scale_and_softcap_match_definitions() {
        let mut rng = XorShift::new(0x0006_E6E1);
        let n = 256 * 9 + 31;
        let (g, u) = (rng.vec(n, -8.0, 8.0), rng.vec(n, -2.0, 2.0));
        let mut want = g.clone();
        geglu(&mut want, &u);
        for (i, w) in want.iter().enumerate() {
            let x = g[i] as f64;
            let k = (2.0 / std::f64::consts::PI).sqrt();
            let exact = 0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh()) * u[i] as f64;
            assert!((*w as f64 - exact).abs() <= 1e-5 * (1.0 + exact.abs()), "{i}: {w} vs {exact}");
        }
        for threads in 1..=3 {
            let mut got = g.clone();
            geglu_par(&Pool::new(threads), &mut got, &u);
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "threads {threads}");
        }
        let mut x = vec![-40.0f32, -3.0, 0.0, 0.5, 3.0, 1e6];
        let orig = x.clone();
        softcap(&mut x, 5.0);
        for (a, &b) in x.iter().zip(&orig) {
            let exact = 5.0 * (b as f64 / 5.0).tanh();
            assert!((*a as f64 - exact).abs() < 1e-6, "{b}: {a} vs {exact}");
        }
        scale(&mut x, 2.0);
        assert_eq!(x[5], 10.0);
    }

    #[test]
    fn elementwise_adds_and_axpy() {
        let mut x = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        add_bias(&mut x, &[10.0, 20.0, 30.0]);
        assert_eq!(x, [11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
        add_in_place(&mut x, &[1.0, -1.0, 0.5, 0.0, 2.0, -36.0]);
        assert_eq!(x, [12.0, 21.0, 33.5, 14.0, 27.0, 0.0]);
        let mut y = vec![1.0f32, 1.0, 1.0];
        axpy(&mut y, 0.5, &[2.0, -4.0, 1.0]);
        assert_eq!(y, [2.0, -1.0, 1.5]);
    }
}
