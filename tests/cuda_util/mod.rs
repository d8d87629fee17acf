//! Helpers shared by the CUDA test binaries (tests/cuda_smoke.rs, tests/cuda_kernels.rs):
//! the CPU oracle of the device ops ([`reference`]), seeded random inputs
//! (`llmrt::util::XorShift`) and the worst-error bookkeeping behind their `MAXERR` lines,
//! which scripts/gpu-check.sh collects.
#![allow(dead_code)]

pub mod reference;

pub use llmrt::util::XorShift;

/// Fisher-Yates with `rng` (the same draws in the same order as before the tests moved
/// to `llmrt::util::XorShift`, so every case keeps its inputs).
pub fn shuffle<T>(rng: &mut XorShift, v: &mut [T]) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i + 1));
    }
}

/// Worst error seen for one op over all its cases.
pub struct Worst {
    op: String,
    /// Print every case's errors, not only the summary.
    verbose: bool,
    rel_l2: f64,
    max_abs: f64,
    case: String,
    cases: usize,
}

impl Worst {
    pub fn new(op: impl Into<String>) -> Worst {
        Worst { op: op.into(), verbose: false, rel_l2: 0.0, max_abs: 0.0, case: String::new(), cases: 0 }
    }

    /// As [`Worst::new`], printing every case's errors as it goes.
    pub fn verbose(op: impl Into<String>) -> Worst {
        Worst { verbose: true, ..Worst::new(op) }
    }

    /// `got` against `want`: same length, every element finite (written), relative L2
    /// error under `tol`; keeps the worst case.
    pub fn check(&mut self, case: String, got: &[f32], want: &[f32], tol: f64) {
        assert_eq!(got.len(), want.len(), "{}: {case}: output length", self.op);
        if let Some(i) = got.iter().position(|v| !v.is_finite()) {
            panic!("{}: {case}: element {i} is {} (not written by the kernel?)", self.op, got[i]);
        }
        let (mut num, mut den, mut max_abs) = (0.0f64, 0.0f64, 0.0f64);
        for (&g, &w) in got.iter().zip(want) {
            let d = f64::from(g) - f64::from(w);
            num += d * d;
            den += f64::from(w) * f64::from(w);
            max_abs = max_abs.max(d.abs());
        }
        let rel = if den > 0.0 { (num / den).sqrt() } else { num.sqrt() };
        if self.verbose {
            println!("  {}: {case}: rel_l2={rel:.3e} max_abs={max_abs:.3e}", self.op);
        }
        assert!(rel < tol, "{}: {case}: relative L2 error {rel:.3e} >= {tol:.0e}", self.op);
        self.cases += 1;
        self.max_abs = self.max_abs.max(max_abs);
        if rel >= self.rel_l2 {
            self.rel_l2 = rel;
            self.case = case;
        }
    }

    /// Counts an exactly-checked case.
    pub fn exact(&mut self, case: String) {
        self.cases += 1;
        if self.case.is_empty() {
            self.case = case;
        }
    }

    pub fn report(&self) {
        println!(
            "MAXERR {} rel_l2={:.3e} max_abs={:.3e} cases={} worst=[{}]",
            self.op, self.rel_l2, self.max_abs, self.cases, self.case
        );
    }
}
