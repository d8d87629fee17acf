//! Model file formats: where weights and hyperparameters come from.
pub mod gguf;
