//! Model file formats: where weights and hyperparameters come from.
pub mod gguf;
pub mod gguf_write;
