//! The compute seam. The safe core (`crate::runtime`) does validation and KV
//! bookkeeping; a backend owns the KV storage and runs a [`Step`]: a batch of
//! sequences, each with its cache's block table, its start position and its new
//! tokens (a prefill is a sequence of many tokens, a decode a sequence of one).
//! One step reads each weight once for the whole batch.

pub mod cpu;
pub mod cuda;

use crate::kv::{BlockCopy, BlockId};
use crate::Result;

/// Which logits a sequence of a step wants back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// None (the step only fills the cache).
    Nothing,
    /// The last token's row.
    Last,
    /// A row per token.
    All,
}

/// One sequence of a step.
#[derive(Clone, Debug)]
pub struct Seq<'a> {
    pub tokens: &'a [u32],
    /// Position of `tokens[0]` (the cache's length before the step).
    pub start: usize,
    /// The cache's block table, already covering `start + tokens.len()` positions.
    pub blocks: &'a [BlockId],
    pub want: Want,
}

/// A backend runs steps over its own KV storage.
pub trait Backend: Send {
    /// Copies block contents (copy-on-write of shared blocks) before a step writes.
    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<()>;
    /// Runs one step. `logits` receives, in sequence order, one row of `vocab`
    /// floats per wanted token.
    fn step(&mut self, seqs: &[Seq<'_>], logits: &mut [f32]) -> Result<()>;
    /// Bytes of KV storage per position of one cache (all layers, K and V).
    fn kv_bytes_per_position(&self) -> u64;
    /// A short description for `llmrt_model_info.device_name`.
    fn device_name(&self) -> String;
}
