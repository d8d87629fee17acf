//! Paged KV bookkeeping, backend-agnostic.
//!
//! The pool is a budget of fixed-size blocks ([`BLOCK_POSITIONS`] positions each).
//! A cache is a block table plus a length and a capacity. Reserve books the
//! cache's whole capacity against the budget, so later steps never fail for lack
//! of space; physical blocks are handed out as positions are written. Fork shares
//! the source's blocks (reference counted); a shared block is copied before it is
//! written (copy-on-write), so only a partially filled tail is ever copied.
//! Truncate returns the blocks past the new length.
//!
//! Why physical allocation can never fail: every cache's table holds at most its
//! reserved number of blocks, and distinct physical blocks in use are at most the
//! sum of table lengths, hence at most the sum of reservations, which the budget
//! bounds.
//!
//! The storage behind a block id belongs to the backend; this module only says
//! which block ids a step writes and which copies it must do first.
//!
//! `state.rs`: a cache's saved state (KV and token history as bytes, and back).

pub mod state;

use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Positions per KV block.
pub const BLOCK_POSITIONS: usize = 16;

/// Index of a physical block in a backend's storage.
pub type BlockId = u32;

/// Cache ids are unique across every model in the process, so an id from
/// another model is reported as unknown rather than silently aliased.
static NEXT_CACHE_ID: AtomicU64 = AtomicU64::new(1);

/// One live cache.
#[derive(Clone, Debug)]
pub struct CacheState {
    /// Positions this cache may hold.
    pub capacity: u32,
    /// Positions written so far.
    pub len: u32,
    /// Block table: `blocks[p / BLOCK_POSITIONS]` holds position `p`.
    pub blocks: Vec<BlockId>,
    /// The token at each position (`len` of them): repetition penalties, diagnostics.
    pub tokens: Vec<u32>,
    reserved_blocks: usize,
}

/// A copy the backend must perform before a step writes into `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCopy {
    pub src: BlockId,
    pub dst: BlockId,
}

/// Block pool and per-cache tables.
#[derive(Debug)]
pub struct KvManager {
    total_blocks: usize,
    reserved_blocks: usize,
    block_bytes: u64,
    refcount: Vec<u32>,
    free: Vec<BlockId>,
    caches: HashMap<u64, CacheState>,
}

fn blocks_for(positions: u32) -> usize {
    (positions as usize).div_ceil(BLOCK_POSITIONS)
}

impl KvManager {
    /// A pool of `total_blocks` blocks of `block_bytes` bytes each (for messages).
    pub fn new(total_blocks: usize, block_bytes: u64) -> KvManager {
        let total_blocks = total_blocks.min(BlockId::MAX as usize);
        KvManager {
            total_blocks,
            reserved_blocks: 0,
            block_bytes,
            refcount: Vec::new(),
            free: Vec::new(),
            caches: HashMap::new(),
        }
    }

    /// Blocks in the pool.
    pub fn total_blocks(&self) -> usize {
        self.total_blocks
    }

    /// Blocks booked by live caches.
    pub fn reserved_blocks(&self) -> usize {
        self.reserved_blocks
    }

    /// Physical blocks currently holding data (for tests of sharing).
    pub fn blocks_in_use(&self) -> usize {
        self.refcount.iter().filter(|&&r| r > 0).count()
    }

    /// Highest physical block id ever handed out, plus one (storage size needed).
    pub fn high_water(&self) -> usize {
        self.refcount.len()
    }

    /// The live cache `id`, or `LLMRT_UNKNOWN_CACHE`.
    pub fn get(&self, id: u64) -> Result<&CacheState> {
        self.caches.get(&id).ok_or_else(|| unknown(id))
    }

    /// Books `positions` positions; `context` is the per-cache limit.
    pub fn reserve(&mut self, positions: u32, context: u32) -> Result<u64> {
        if positions > context {
            return Err(Error::context_full(format!(
                "cannot reserve {positions} positions: the context length is {context}"
            )));
        }
        let need = blocks_for(positions);
        self.book(need, positions)?;
        let id = NEXT_CACHE_ID.fetch_add(1, Ordering::Relaxed);
        self.caches.insert(
            id,
            CacheState { capacity: positions, len: 0, blocks: Vec::new(), tokens: Vec::new(), reserved_blocks: need },
        );
        Ok(id)
    }

    fn book(&mut self, need: usize, positions: u32) -> Result<()> {
        let free = self.total_blocks - self.reserved_blocks;
        if need > free {
            return Err(Error::out_of_memory(format!(
                "KV pool exhausted: {positions} positions need {need} blocks ({} bytes), \
                 {free} of {} blocks ({} of {} bytes) are free",
                need as u64 * self.block_bytes,
                self.total_blocks,
                free as u64 * self.block_bytes,
                self.total_blocks as u64 * self.block_bytes
            )));
        }
        self.reserved_blocks += need;
        Ok(())
    }

    /// A new cache of `capacity` positions already holding `tokens` (a loaded state):
    /// books the capacity as [`Self::reserve`] does and hands out the blocks of
    /// `tokens.len()` positions, unshared. The backend then writes their contents; when
    /// it cannot, [`Self::release`] undoes this. On an error nothing changed.
    pub fn create_filled(&mut self, capacity: u32, context: u32, tokens: Vec<u32>) -> Result<u64> {
        if capacity > context {
            return Err(Error::context_full(format!(
                "cannot reserve {capacity} positions: the context length is {context}"
            )));
        }
        if tokens.len() > capacity as usize {
            return Err(Error::invalid(format!(
                "{} positions do not fit in a cache of {capacity} positions",
                tokens.len()
            )));
        }
        let need = blocks_for(capacity);
        let n = blocks_for(tokens.len() as u32);
        let mut blocks = crate::util::try_with_capacity(n, "the loaded cache's block table")?;
        self.book(need, capacity)?;
        for _ in 0..n {
            match self.alloc() {
                Ok(b) => blocks.push(b),
                Err(e) => {
                    for b in blocks {
                        self.unref(b);
                    }
                    self.reserved_blocks -= need;
                    return Err(e);
                }
            }
        }
        let id = NEXT_CACHE_ID.fetch_add(1, Ordering::Relaxed);
        let len = tokens.len() as u32;
        self.caches.insert(id, CacheState { capacity, len, blocks, tokens, reserved_blocks: need });
        Ok(id)
    }

    /// Releases cache `id` and its blocks.
    pub fn release(&mut self, id: u64) -> Result<()> {
        let state = self.caches.remove(&id).ok_or_else(|| unknown(id))?;
        for b in state.blocks {
            self.unref(b);
        }
        self.reserved_blocks -= state.reserved_blocks;
        Ok(())
    }

    /// A new cache sharing `source`'s blocks, with the same capacity.
    pub fn fork(&mut self, source: u64) -> Result<u64> {
        let src = self.get(source)?.clone();
        self.book(src.reserved_blocks, src.capacity)?;
        for &b in &src.blocks {
            self.refcount[b as usize] += 1;
        }
        let id = NEXT_CACHE_ID.fetch_add(1, Ordering::Relaxed);
        self.caches.insert(
            id,
            CacheState {
                capacity: src.capacity,
                len: src.len,
                blocks: src.blocks,
                tokens: src.tokens,
                reserved_blocks: src.reserved_blocks,
            },
        );
        Ok(id)
    }

    /// Keeps the first `positions` positions of cache `id`.
    pub fn truncate(&mut self, id: u64, positions: u32) -> Result<()> {
        let state = self.caches.get(&id).ok_or_else(|| unknown(id))?;
        if positions > state.len {
            return Err(Error::invalid(format!(
                "cannot truncate cache {id} to {positions} positions: it holds {}",
                state.len
            )));
        }
        let keep = blocks_for(positions);
        let state = self.caches.get_mut(&id).expect("checked above");
        let dropped: Vec<BlockId> = state.blocks.drain(keep..).collect();
        state.len = positions;
        state.tokens.truncate(positions as usize);
        for b in dropped {
            self.unref(b);
        }
        Ok(())
    }

    /// Checks that `n` more positions fit in cache `id` (nothing changes).
    pub fn check_append(&self, id: u64, n: usize) -> Result<()> {
        let s = self.get(id)?;
        let end = s.len as u64 + n as u64;
        if end > s.capacity as u64 {
            return Err(Error::context_full(format!(
                "cache {id} holds {} of {} reserved positions; {n} more do not fit",
                s.len, s.capacity
            )));
        }
        Ok(())
    }

    /// Makes positions `len .. len + n` of cache `id` writable: allocates the
    /// blocks they need and un-shares shared blocks among them. Returns the copies
    /// the backend must do before writing. Call [`Self::check_append`] first for
    /// every cache of a step, so that a step that fails changes nothing visible.
    pub fn prepare_append(&mut self, id: u64, n: usize) -> Result<Vec<BlockCopy>> {
        self.check_append(id, n)?;
        let (len, mut blocks) = {
            let s = self.caches.get_mut(&id).expect("checked");
            (s.len as usize, std::mem::take(&mut s.blocks))
        };
        let mut copies = Vec::new();
        let first = len / BLOCK_POSITIONS;
        let last = (len + n).div_ceil(BLOCK_POSITIONS);
        let mut result = Ok(());
        for bi in first..last {
            if bi < blocks.len() {
                let b = blocks[bi];
                if self.refcount[b as usize] > 1 {
                    match self.alloc() {
                        Ok(nb) => {
                            self.refcount[b as usize] -= 1;
                            blocks[bi] = nb;
                            copies.push(BlockCopy { src: b, dst: nb });
                        }
                        Err(e) => {
                            result = Err(e);
                            break;
                        }
                    }
                }
            } else {
                match self.alloc() {
                    Ok(nb) => blocks.push(nb),
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
        }
        self.caches.get_mut(&id).expect("checked").blocks = blocks;
        result.map(|_| copies)
    }

    /// Undoes the copy-on-write of [`Self::prepare_append`] when the backend could
    /// not perform `copies` (an error or a caught panic): the table points at the
    /// shared source blocks again, so the cache's committed positions read what they
    /// did before. Freshly appended blocks stay (they hold no committed position).
    pub fn undo_copies(&mut self, id: u64, copies: &[BlockCopy]) {
        let Some(s) = self.caches.get_mut(&id) else { return };
        let mut freed = Vec::new();
        for c in copies {
            if let Some(slot) = s.blocks.iter_mut().find(|b| **b == c.dst) {
                *slot = c.src;
                self.refcount[c.src as usize] += 1;
                freed.push(c.dst);
            }
        }
        for b in freed {
            self.unref(b);
        }
    }

    /// Records that `tokens` were written to cache `id` after its last position.
    pub fn commit(&mut self, id: u64, tokens: &[u32]) {
        if let Some(s) = self.caches.get_mut(&id) {
            s.len += tokens.len() as u32;
            s.tokens.extend_from_slice(tokens);
        }
    }

    /// Ids of every live cache.
    pub fn cache_ids(&self) -> Vec<u64> {
        self.caches.keys().copied().collect()
    }

    fn alloc(&mut self) -> Result<BlockId> {
        if let Some(b) = self.free.pop() {
            self.refcount[b as usize] = 1;
            return Ok(b);
        }
        if self.refcount.len() >= self.total_blocks {
            // Unreachable while the reservation invariant holds.
            return Err(Error::internal(format!(
                "KV block pool invariant broken: all {} blocks in use",
                self.total_blocks
            )));
        }
        self.refcount.push(1);
        Ok((self.refcount.len() - 1) as BlockId)
    }

    fn unref(&mut self, b: BlockId) {
        let r = &mut self.refcount[b as usize];
        *r -= 1;
        if *r == 0 {
            self.free.push(b);
        }
    }
}

fn unknown(id: u64) -> Error {
    if id == 0 {
        Error::unknown_cache("cache id 0 is never a valid cache")
    } else {
        Error::unknown_cache(format!(
            "cache {id} is not live in this model (released, never issued, or another model's)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_books_budget_and_release_returns_it() {
        let mut kv = KvManager::new(4, 100);
        let a = kv.reserve(33, 1000).unwrap(); // 3 blocks
        assert_eq!(kv.reserved_blocks(), 3);
        let e = kv.reserve(17, 1000).unwrap_err(); // 2 blocks, 1 free
        assert_eq!(e.status, crate::Status::LLMRT_OUT_OF_MEMORY);
        assert!(e.message.contains("need 2 blocks"), "{}", e.message);
        kv.release(a).unwrap();
        assert_eq!(kv.release(a).unwrap_err().status, crate::Status::LLMRT_UNKNOWN_CACHE);
        kv.reserve(17, 1000).unwrap();
        assert_eq!(kv.reserve(1001, 1000).unwrap_err().status, crate::Status::LLMRT_CONTEXT_FULL);
    }

    #[test]
    fn fork_shares_and_copies_only_written_shared_blocks() {
        let mut kv = KvManager::new(16, 1);
        let a = kv.reserve(64, 64).unwrap();
        assert!(kv.prepare_append(a, 20).unwrap().is_empty());
        kv.commit(a, &[7; 20]);
        assert_eq!(kv.blocks_in_use(), 2);
        let b = kv.fork(a).unwrap();
        assert_eq!(kv.blocks_in_use(), 2);
        // b appends: the partial tail block (index 1) is shared -> copied.
        let copies = kv.prepare_append(b, 1).unwrap();
        assert_eq!(copies.len(), 1);
        assert_eq!(copies[0].src, kv.get(a).unwrap().blocks[1]);
        kv.commit(b, &[9]);
        assert_eq!(kv.get(b).unwrap().tokens.len(), 21);
        assert_eq!(kv.get(a).unwrap().blocks[0], kv.get(b).unwrap().blocks[0]);
        assert_ne!(kv.get(a).unwrap().blocks[1], kv.get(b).unwrap().blocks[1]);
        assert_eq!(kv.blocks_in_use(), 3);
        // a appends into its tail: no longer shared, no copy.
        assert!(kv.prepare_append(a, 1).unwrap().is_empty());
        // truncating b into the shared first block, then writing, copies block 0.
        kv.truncate(b, 5).unwrap();
        assert_eq!(kv.get(b).unwrap().blocks.len(), 1);
        // A copy the backend could not do is undone: b shares block 0 again.
        let copies = kv.prepare_append(b, 1).unwrap();
        assert_eq!(copies.len(), 1);
        kv.undo_copies(b, &copies);
        assert_eq!(kv.get(a).unwrap().blocks[0], kv.get(b).unwrap().blocks[0]);
        assert_eq!(kv.blocks_in_use(), 2);
        assert_eq!(kv.prepare_append(b, 1).unwrap().len(), 1);
        kv.release(a).unwrap();
        kv.release(b).unwrap();
        assert_eq!(kv.blocks_in_use(), 0);
        assert_eq!(kv.reserved_blocks(), 0);
    }

    #[test]
    fn create_filled_books_capacity_and_hands_out_the_held_blocks() {
        let mut kv = KvManager::new(6, 1);
        let a = kv.reserve(16, 64).unwrap();
        kv.prepare_append(a, 16).unwrap();
        kv.commit(a, &[1; 16]);
        let b = kv.create_filled(40, 64, vec![5; 17]).unwrap(); // 3 blocks booked, 2 held
        let s = kv.get(b).unwrap();
        assert_eq!((s.len, s.capacity, s.blocks.len(), s.tokens.len()), (17, 40, 2, 17));
        assert!(!s.blocks.contains(&kv.get(a).unwrap().blocks[0]));
        assert_eq!((kv.reserved_blocks(), kv.blocks_in_use()), (4, 3));
        // Past the budget, past the context, more tokens than capacity: nothing changes.
        assert_eq!(kv.create_filled(48, 64, vec![]).unwrap_err().status, crate::Status::LLMRT_OUT_OF_MEMORY);
        assert_eq!(kv.create_filled(65, 64, vec![]).unwrap_err().status, crate::Status::LLMRT_CONTEXT_FULL);
        assert_eq!(kv.create_filled(1, 64, vec![1, 2]).unwrap_err().status, crate::Status::LLMRT_INVALID_ARGUMENT);
        assert_eq!((kv.reserved_blocks(), kv.blocks_in_use()), (4, 3));
        kv.release(b).unwrap();
        kv.release(a).unwrap();
        assert_eq!((kv.reserved_blocks(), kv.blocks_in_use()), (0, 0));
    }

    #[test]
    fn check_append_and_truncate_errors() {
        let mut kv = KvManager::new(16, 1);
        let a = kv.reserve(4, 64).unwrap();
        assert_eq!(kv.check_append(a, 5).unwrap_err().status, crate::Status::LLMRT_CONTEXT_FULL);
        kv.prepare_append(a, 4).unwrap();
        kv.commit(a, &[1, 2, 3, 4]);
        assert_eq!(kv.truncate(a, 5).unwrap_err().status, crate::Status::LLMRT_INVALID_ARGUMENT);
        kv.truncate(a, 0).unwrap();
        assert_eq!(kv.get(a).unwrap().blocks.len(), 0);
        assert_eq!(kv.get(0).unwrap_err().status, crate::Status::LLMRT_UNKNOWN_CACHE);
    }
}
