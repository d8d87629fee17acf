//! The compute seam. The safe core (`crate::runtime`) does validation and KV
//! bookkeeping; a backend owns the KV storage and runs a [`Step`]: a batch of
//! sequences, each with its cache's block table, its start position and its new
//! tokens (a prefill is a sequence of many tokens, a decode a sequence of one).
//! One step reads each weight once for the whole batch.

pub(crate) mod cpu;
pub mod cuda;
pub(crate) mod moe;

use crate::kv::state::KvDtype;
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

impl Want {
    /// The rows a sequence of `n` tokens gives back.
    pub fn rows(self, n: usize) -> usize {
        match self {
            Want::Nothing => 0,
            Want::Last => 1,
            Want::All => n,
        }
    }
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
    /// Runs one step whose sequences all want their last row (`Want::Last`) and
    /// writes the argmax of each row (the first index on ties) to `next`, in sequence
    /// order. The default runs [`Backend::step`] and takes the argmax on the host; a
    /// device backend overrides it so only the ids come back.
    fn step_greedy(&mut self, seqs: &[Seq<'_>], next: &mut [u32]) -> Result<()> {
        let v = self.vocab_size();
        if next.len() != seqs.len() || seqs.iter().any(|s| s.want != Want::Last) {
            return Err(crate::Error::internal("greedy step: one Want::Last row per sequence expected"));
        }
        let mut logits = vec![0f32; seqs.len() * v];
        self.step(seqs, &mut logits)?;
        for (o, row) in next.iter_mut().zip(logits.chunks_exact(v)) {
            *o = crate::util::argmax(row);
        }
        Ok(())
    }
    /// As [`Backend::step`], but each wanted row is the final norm's output (`hidden`
    /// floats: the LM head's input, for embeddings) and the LM head does not run.
    fn step_hidden(&mut self, seqs: &[Seq<'_>], hidden: &mut [f32]) -> Result<()>;
    /// The element type of the KV storage (what a saved cache state holds).
    fn kv_dtype(&self) -> KvDtype;
    /// Copies positions `0..len` of the cache whose block table is `blocks` into `out`
    /// (`kv::state::Geometry::kv_bytes(len)` bytes) in the saved-state layout: for each
    /// layer, K then V, for each position, one row of `kv_dim` little-endian elements of
    /// [`Backend::kv_dtype`] (see `kv::state`).
    fn read_kv(&mut self, blocks: &[BlockId], len: usize, out: &mut [u8]) -> Result<()>;
    /// The reverse of [`Backend::read_kv`]: writes `data` into positions `0..len` of
    /// `blocks` (blocks no other cache holds). Slots past `len` of the last block may be
    /// overwritten (they hold no position).
    fn write_kv(&mut self, blocks: &[BlockId], len: usize, data: &[u8]) -> Result<()>;
    /// Rows of the logits (the vocabulary size).
    fn vocab_size(&self) -> usize;
    /// Bytes of KV storage per position of one cache (all layers, K and V).
    fn kv_bytes_per_position(&self) -> u64;
    /// A short description for `llmrt_model_info.device_name`.
    fn device_name(&self) -> String;

    /// Where a device backend's memory went (zeros on the CPU).
    fn memory(&self) -> MemoryReport {
        MemoryReport::default()
    }
}

/// A device backend's memory beyond weights and KV (`llmrt_model_info`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// Activation and step scratch allocated at load for the planned step.
    pub scratch_bytes: u64,
    /// Device memory free after the load (weights, scratch, KV pool).
    pub device_free_bytes: u64,
    /// The device's memory.
    pub device_total_bytes: u64,
}
