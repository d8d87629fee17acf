//! CUDA backend (placeholder).
