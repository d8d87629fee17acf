//! Model file formats: where weights and hyperparameters come from.
//!
//! Every format hands the weight binder ([`crate::model::weights`]) files that
//! implement [`WeightFile`]: a read-only byte view (normally a memory map) in
//! which tensor data lives. A model's weights may span several such files (a
//! sharded safetensors checkpoint); `Matrix { file, offset, .. }` indexes them.
pub mod gguf;
pub mod gguf_write;
pub mod safetensors;

use std::path::Path;

/// A mapped (or owned) file that tensor data is read from, zero-copy.
pub trait WeightFile: Send + Sync {
    /// The file, for messages.
    fn path(&self) -> &Path;
    /// The whole file.
    fn bytes(&self) -> &[u8];
}

impl WeightFile for gguf::Gguf {
    fn path(&self) -> &Path {
        &self.path
    }
    fn bytes(&self) -> &[u8] {
        gguf::Gguf::bytes(self)
    }
}
