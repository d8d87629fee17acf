//! The CUDA runner: implements `crate::backend::Backend` on a device with the ops
//! of [`super::ops`]. (Filled by the runner work.)
