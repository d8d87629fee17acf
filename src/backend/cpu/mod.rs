//! CPU backend (placeholder).
