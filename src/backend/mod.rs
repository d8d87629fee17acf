//! The compute seam: backends that run a step's ops.
pub mod cpu;
pub mod cuda;
