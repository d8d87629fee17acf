//! The CPU backend's KV storage: one f32 buffer per cache block, allocated on
//! first use, laid out `[layer][K|V]`, each page by KV head: K transposed
//! (`[head][dim][slot]`: a head's 16 positions of one dimension side by side, the
//! lanes of `attn`'s score kernels), V by rows (`[head][slot][dim]`), so a head's K
//! and V of a page are 4 KiB each at head size 64, contiguous.
//!
//! Depends on `crate::kv` (block ids, positions per block) only.

use crate::kv::{BlockId, BLOCK_POSITIONS};
use crate::{Error, Result};

/// KV storage: one f32 buffer per block, laid out `[layer][K|V]`, K as
/// `[head][dim][slot]`, V as `[head][slot][dim]`.
pub(crate) struct KvStore {
    blocks: Vec<Option<Box<[f32]>>>,
    n_layers: usize,
    kv_dim: usize,
    head_dim: usize,
}

impl KvStore {
    /// Empty storage for `n_layers` layers of K and V rows of `kv_dim` values, in
    /// heads of `head_dim`.
    pub(crate) fn new(n_layers: usize, kv_dim: usize, head_dim: usize) -> KvStore {
        assert!(head_dim > 0 && kv_dim.is_multiple_of(head_dim));
        KvStore { blocks: Vec::new(), n_layers, kv_dim, head_dim }
    }

    /// Values in one K or V row.
    pub(crate) fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Copies block `src`'s contents into block `dst` (storage for `dst` made if needed).
    pub(crate) fn copy(&mut self, src: BlockId, dst: BlockId) -> Result<()> {
        self.ensure(dst)?;
        let from = self.blocks[src as usize].clone();
        match (from, self.blocks[dst as usize].as_mut()) {
            (Some(s), Some(d)) => d.copy_from_slice(&s),
            _ => return Err(Error::internal(format!("KV copy from block {src} that has no storage"))),
        }
        Ok(())
    }

    /// Positions `0..len` of the blocks `blocks` into `out` in the saved-state layout
    /// (`crate::kv::state`: layer, K|V, position; f32 little-endian).
    pub(crate) fn read_positions(&self, blocks: &[BlockId], len: usize, out: &mut [u8]) -> Result<()> {
        let (d, hd) = (self.kv_dim, self.head_dim);
        crate::kv::state::check_section(self.n_layers, d, 4, blocks, len, out.len())?;
        for (bi, &b) in blocks.iter().enumerate().take(len.div_ceil(BLOCK_POSITIONS)) {
            let start = bi * BLOCK_POSITIONS;
            let n = (len - start).min(BLOCK_POSITIONS);
            let data = self.blocks.get(b as usize).and_then(Option::as_ref).ok_or_else(|| {
                Error::internal(format!("KV state save: block {b} (position {start}) has no storage"))
            })?;
            for layer in 0..self.n_layers {
                for v in 0..2 {
                    let o = self.offset(layer, v);
                    let at = crate::kv::state::kv_index(layer, v, len, start, d) * 4;
                    for (i, dst) in out[at..at + n * d * 4].chunks_exact_mut(4).enumerate() {
                        let x = data[o + Self::at(v, i / d, i % d, hd)];
                        dst.copy_from_slice(&x.to_le_bytes());
                    }
                }
            }
        }
        Ok(())
    }

    /// The reverse of [`Self::read_positions`]: storage is made for every block first
    /// (`LLMRT_OUT_OF_MEMORY` naming it), then the rows are written.
    pub(crate) fn write_positions(&mut self, blocks: &[BlockId], len: usize, data: &[u8]) -> Result<()> {
        let (d, hd) = (self.kv_dim, self.head_dim);
        crate::kv::state::check_section(self.n_layers, d, 4, blocks, len, data.len())?;
        let used = &blocks[..len.div_ceil(BLOCK_POSITIONS)];
        for &b in used {
            self.ensure(b)?;
        }
        for (bi, &b) in used.iter().enumerate() {
            let start = bi * BLOCK_POSITIONS;
            let n = (len - start).min(BLOCK_POSITIONS);
            for layer in 0..self.n_layers {
                for v in 0..2 {
                    let o = self.offset(layer, v);
                    let at = crate::kv::state::kv_index(layer, v, len, start, d) * 4;
                    let dst = &mut self.blocks[b as usize].as_mut().expect("ensured above")[o..o + BLOCK_POSITIONS * d];
                    for (i, src) in data[at..at + n * d * 4].chunks_exact(4).enumerate() {
                        dst[Self::at(v, i / d, i % d, hd)] = f32::from_le_bytes([src[0], src[1], src[2], src[3]]);
                    }
                }
            }
        }
        Ok(())
    }

    fn block_elems(&self) -> usize {
        self.n_layers * 2 * BLOCK_POSITIONS * self.kv_dim
    }

    /// Makes sure block `b` has storage (allocated on first use).
    pub(crate) fn ensure(&mut self, b: BlockId) -> Result<()> {
        let b = b as usize;
        if b >= self.blocks.len() {
            self.blocks.resize_with(b + 1, || None);
        }
        if self.blocks[b].is_none() {
            let n = self.block_elems();
            let mut v: Vec<f32> = Vec::new();
            v.try_reserve_exact(n).map_err(|_| {
                Error::out_of_memory(format!("cannot allocate KV block {b} ({} bytes) in host memory", n * 4))
            })?;
            v.resize(n, 0.0);
            self.blocks[b] = Some(v.into_boxed_slice());
        }
        Ok(())
    }

    /// Where the K (v = 0) or V (v = 1) page of `layer` starts in a block.
    fn offset(&self, layer: usize, v: usize) -> usize {
        (layer * 2 + v) * BLOCK_POSITIONS * self.kv_dim
    }

    /// Where value `j` (of `kv_dim`) of slot `slot` lies in a K (v = 0) or V page of
    /// heads of `head_dim`.
    #[inline]
    fn at(v: usize, slot: usize, j: usize, head_dim: usize) -> usize {
        let (h, d) = (j / head_dim, j % head_dim);
        let head = h * head_dim * BLOCK_POSITIONS;
        if v == 0 {
            head + d * BLOCK_POSITIONS + slot
        } else {
            head + slot * head_dim + d
        }
    }

    /// The K (v = 0: `[head][dim][slot]`) or V (v = 1: `[head][slot][dim]`) page of
    /// `layer` of block `b`.
    pub(crate) fn page(&self, b: BlockId, layer: usize, v: usize) -> &[f32] {
        let o = self.offset(layer, v);
        &self.blocks[b as usize].as_ref().expect("block storage ensured before use")
            [o..o + BLOCK_POSITIONS * self.kv_dim]
    }

    /// Stores the K and V rows (`kv_dim` values each) of slot `slot` of block `b`.
    pub(crate) fn write(&mut self, b: BlockId, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        let (ko, vo, d, hd) = (self.offset(layer, 0), self.offset(layer, 1), self.kv_dim, self.head_dim);
        let data = self.blocks[b as usize].as_mut().expect("block storage ensured before use");
        for j in 0..d {
            data[ko + Self::at(0, slot, j, hd)] = k[j];
            data[vo + Self::at(1, slot, j, hd)] = v[j];
        }
    }
}
