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
//! Windowed caches ([`KvManager::set_window`], the load option `kv_window_only` on a
//! model whose every layer has a sliding window `W`): after each step the blocks whose
//! positions all fell out of the window (`p <= len - W`: no later query reads them) are
//! freed and their table entries become [`FREED`]. A cache then holds at most
//! [`WindowKv::live_blocks`] blocks at once, and reserve books only that (or its
//! capacity, when smaller). A step of more than [`WindowKv::chunk`] tokens runs in
//! chunks of that size (the runtime's `step_chunked`), freeing between chunks the new
//! blocks that fell out of the window while keeping the blocks of the step's start
//! until it succeeds, so a failed step still changes nothing. Truncation must keep the
//! window of the new end: `truncate` to `p` needs positions `p + 1 - W ..` held (or
//! `p = 0`).
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

/// A block-table entry whose block was freed: its positions fell out of every layer's
/// sliding window. Never a valid block (backends treat it as out of the pool; attention
/// reads only the window's blocks).
pub const FREED: BlockId = BlockId::MAX;

/// Tokens per chunk of a windowed step at least and at most (see [`WindowKv::chunk`]).
const MIN_CHUNK: u32 = 64;
const MAX_CHUNK: u32 = 512;

/// The sliding-window bookkeeping of a model whose every layer has a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowKv {
    /// `W`, the largest layer window: a query at `p` reads keys `p + 1 - W ..= p`.
    pub window: u32,
    /// The most tokens of one cache a backend step takes: `W` within `64 ..= 512` (a
    /// chunk costs as many blocks as its positions; 512 tokens keep prefill matrices wide).
    pub chunk: u32,
}

impl WindowKv {
    /// The bookkeeping of window `window` (at least 1).
    pub fn new(window: u32) -> WindowKv {
        let window = window.max(1);
        WindowKv { window, chunk: window.clamp(MIN_CHUNK, MAX_CHUNK) }
    }

    /// The most blocks a cache holds at once: those of the window before a step (kept
    /// until it succeeds) plus those of a chunk and its window.
    pub fn live_blocks(&self) -> usize {
        let w = self.window as usize - 1;
        w.div_ceil(BLOCK_POSITIONS) + (w + self.chunk as usize).div_ceil(BLOCK_POSITIONS) + 2
    }

    /// The first position a cache of `len` positions must still hold.
    pub fn horizon(&self, len: u32) -> u32 {
        (len + 1).saturating_sub(self.window)
    }
}

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
    /// The first position still held (a multiple of [`BLOCK_POSITIONS`]): the entries of
    /// `blocks` before `live_from / BLOCK_POSITIONS` are [`FREED`]. 0 unless windowed.
    pub live_from: u32,
    reserved_blocks: usize,
}

impl CacheState {
    /// The block table from `live_from` on (the positions `live_from..`).
    pub fn live_blocks(&self) -> &[BlockId] {
        &self.blocks[(self.live_from as usize / BLOCK_POSITIONS).min(self.blocks.len())..]
    }
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
    window: Option<WindowKv>,
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
            window: None,
        }
    }

    /// Makes every cache of this pool windowed (see the module comment). Call before
    /// the first reserve.
    pub fn set_window(&mut self, w: WindowKv) {
        self.window = Some(w);
    }

    /// The window bookkeeping, when the caches are windowed.
    pub fn window(&self) -> Option<WindowKv> {
        self.window
    }

    /// Blocks booked for a cache of `capacity` positions.
    fn booking(&self, capacity: u32) -> usize {
        let all = blocks_for(capacity);
        self.window.map_or(all, |w| all.min(w.live_blocks()))
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
        let need = self.booking(positions);
        self.book(need, positions)?;
        let id = NEXT_CACHE_ID.fetch_add(1, Ordering::Relaxed);
        self.caches.insert(
            id,
            CacheState {
                capacity: positions,
                len: 0,
                blocks: Vec::new(),
                tokens: Vec::new(),
                live_from: 0,
                reserved_blocks: need,
            },
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
    /// books the capacity as [`Self::reserve`] does and hands out, unshared, the blocks
    /// of the positions `live_from..tokens.len()` (`live_from` a multiple of
    /// [`BLOCK_POSITIONS`]; the entries before it are [`FREED`]). The backend then writes
    /// their contents; when it cannot, [`Self::release`] undoes this. On an error nothing
    /// changed.
    pub fn create_filled(&mut self, capacity: u32, context: u32, tokens: Vec<u32>, live_from: u32) -> Result<u64> {
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
        let need = self.booking(capacity);
        let n = blocks_for(tokens.len() as u32);
        let first = (live_from as usize / BLOCK_POSITIONS).min(n);
        if !(live_from as usize).is_multiple_of(BLOCK_POSITIONS) || n - first > need {
            return Err(Error::internal(format!(
                "a loaded cache holding positions {live_from}..{} ({} blocks) in a booking of {need} blocks",
                tokens.len(),
                n - first
            )));
        }
        let mut blocks = crate::util::try_with_capacity(n, "the loaded cache's block table")?;
        self.book(need, capacity)?;
        blocks.resize(first, FREED);
        for _ in first..n {
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
        let live_from = (first * BLOCK_POSITIONS) as u32;
        self.caches.insert(id, CacheState { capacity, len, blocks, tokens, live_from, reserved_blocks: need });
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
        for &b in src.blocks.iter().filter(|&&b| b != FREED) {
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
                live_from: src.live_from,
                reserved_blocks: src.reserved_blocks,
            },
        );
        Ok(id)
    }

    /// Keeps the first `positions` positions of cache `id`. A windowed cache must still
    /// hold the window of the new end (or be emptied): else `LLMRT_INVALID_ARGUMENT`
    /// naming the positions it lacks, and nothing changes.
    pub fn truncate(&mut self, id: u64, positions: u32) -> Result<()> {
        let state = self.caches.get(&id).ok_or_else(|| unknown(id))?;
        if positions > state.len {
            return Err(Error::invalid(format!(
                "cannot truncate cache {id} to {positions} positions: it holds {}",
                state.len
            )));
        }
        if let Some(w) = self.window {
            if positions > 0 && w.horizon(positions) < state.live_from {
                return Err(Error::invalid(format!(
                    "cannot truncate cache {id} to {positions} positions: its positions 0..{} fell out of the \
                     sliding window of {} and were freed (the model was loaded with kv_window_only); truncate \
                     to 0 or to at least {} positions",
                    state.live_from,
                    w.window,
                    (state.live_from + w.window).saturating_sub(1).min(state.len)
                )));
            }
        }
        let keep = blocks_for(positions);
        let state = self.caches.get_mut(&id).expect("checked above");
        let dropped: Vec<BlockId> = state.blocks.drain(keep..).collect();
        state.len = positions;
        state.tokens.truncate(positions as usize);
        if positions == 0 {
            state.live_from = 0;
        }
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
        let len = self.get(id)?.len as usize;
        self.prepare_range(id, len, n)
    }

    /// [`Self::prepare_append`] for positions `start .. start + n`, `start` at or past the
    /// cache's length with the positions before it prepared (the chunks of one step).
    pub fn prepare_range(&mut self, id: u64, start: usize, n: usize) -> Result<Vec<BlockCopy>> {
        let s = self.get(id)?;
        if start < s.len as usize || start.div_ceil(BLOCK_POSITIONS) > s.blocks.len() {
            return Err(Error::internal(format!(
                "cache {id}: positions from {start} prepared with {} held and {} blocks",
                s.len,
                s.blocks.len()
            )));
        }
        self.check_append(id, start - s.len as usize + n)?;
        let (len, mut blocks) = {
            let s = self.caches.get_mut(&id).expect("checked");
            (start, std::mem::take(&mut s.blocks))
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

    /// Frees the blocks of cache `id` out of the window of its length (windowed caches;
    /// else nothing): after a committed step, or a loaded state.
    pub fn free_out_of_window(&mut self, id: u64) {
        let (Some(w), Some(s)) = (self.window, self.caches.get(&id)) else { return };
        let (from, to) = (s.live_from as usize / BLOCK_POSITIONS, w.horizon(s.len) as usize / BLOCK_POSITIONS);
        if let Some(to) = self.free_blocks(id, from, to) {
            let s = self.caches.get_mut(&id).expect("checked above");
            s.live_from = (to * BLOCK_POSITIONS) as u32;
        }
    }

    /// Between the chunks of a step of cache `id` that started at its length: frees the
    /// step's own blocks (from the first block past the length) out of the window of
    /// position `next`, the next chunk's start. The blocks of committed positions stay
    /// until the step succeeds ([`Self::free_out_of_window`]).
    pub fn free_step_blocks(&mut self, id: u64, next: usize) {
        let (Some(w), Some(s)) = (self.window, self.caches.get(&id)) else { return };
        let from = (s.len as usize).div_ceil(BLOCK_POSITIONS);
        self.free_blocks(id, from, w.horizon(next as u32) as usize / BLOCK_POSITIONS);
    }

    /// Frees the blocks at table indices `from..to` (`to` at most the table's length) of
    /// cache `id`: their entries become [`FREED`]. Returns that end, or None when the
    /// range is empty (nothing changed).
    fn free_blocks(&mut self, id: u64, from: usize, to: usize) -> Option<usize> {
        let s = self.caches.get_mut(&id)?;
        let to = to.min(s.blocks.len());
        if to <= from {
            return None;
        }
        let dead: Vec<BlockId> = s.blocks[from..to].iter_mut().map(|b| std::mem::replace(b, FREED)).collect();
        for b in dead {
            self.unref(b);
        }
        Some(to)
    }

    /// Undoes a failed chunked step of cache `id`: the blocks past its committed
    /// positions (some of them freed between chunks) leave the table.
    pub fn abandon_step(&mut self, id: u64) {
        let Some(s) = self.caches.get_mut(&id) else { return };
        let keep = blocks_for(s.len).min(s.blocks.len());
        let dropped: Vec<BlockId> = s.blocks.drain(keep..).collect();
        for b in dropped {
            self.unref(b);
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
        if b == FREED {
            return;
        }
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
        let b = kv.create_filled(40, 64, vec![5; 17], 0).unwrap(); // 3 blocks booked, 2 held
        let s = kv.get(b).unwrap();
        assert_eq!((s.len, s.capacity, s.blocks.len(), s.tokens.len()), (17, 40, 2, 17));
        assert!(!s.blocks.contains(&kv.get(a).unwrap().blocks[0]));
        assert_eq!((kv.reserved_blocks(), kv.blocks_in_use()), (4, 3));
        // Past the budget, past the context, more tokens than capacity: nothing changes.
        assert_eq!(kv.create_filled(48, 64, vec![], 0).unwrap_err().status, crate::Status::LLMRT_OUT_OF_MEMORY);
        assert_eq!(kv.create_filled(65, 64, vec![], 0).unwrap_err().status, crate::Status::LLMRT_CONTEXT_FULL);
        assert_eq!(kv.create_filled(1, 64, vec![1, 2], 0).unwrap_err().status, crate::Status::LLMRT_INVALID_ARGUMENT);
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

    /// Blocks a cache's table holds (not freed).
    fn held(kv: &KvManager, id: u64) -> usize {
        kv.get(id).unwrap().blocks.iter().filter(|&&b| b != FREED).count()
    }

    /// A step of `n` tokens as the runtime runs it: chunks of `chunk`, freeing the step's
    /// own blocks between them; checks the booking bound after every chunk.
    fn windowed_step(kv: &mut KvManager, id: u64, n: usize) {
        let chunk = kv.window().unwrap().chunk as usize;
        let (len, booked) = (kv.get(id).unwrap().len as usize, kv.get(id).unwrap().reserved_blocks);
        for lo in (0..n).step_by(chunk) {
            if lo > 0 {
                kv.free_step_blocks(id, len + lo);
            }
            kv.prepare_range(id, len + lo, chunk.min(n - lo)).unwrap();
            assert!(held(kv, id) <= booked, "{} blocks held, {booked} booked", held(kv, id));
        }
        kv.commit(id, &vec![1; n]);
        kv.free_out_of_window(id);
        assert!(held(kv, id) <= booked);
    }

    #[test]
    fn windowed_caches_book_and_hold_only_the_window() {
        let w = WindowKv::new(20);
        assert_eq!((w.chunk, w.live_blocks()), (64, 2 + 6 + 2));
        let mut kv = KvManager::new(30, 1);
        kv.set_window(w);
        // Three caches of 1000 positions (63 blocks each unwindowed) in 30 blocks.
        let ids: Vec<u64> = (0..3).map(|_| kv.reserve(1000, 1000).unwrap()).collect();
        assert_eq!(kv.reserved_blocks(), 30);
        assert_eq!(kv.reserve(16, 1000).unwrap_err().status, crate::Status::LLMRT_OUT_OF_MEMORY);
        // A small capacity books its own blocks only.
        kv.release(ids[2]).unwrap();
        let small = kv.reserve(40, 1000).unwrap();
        assert_eq!(kv.get(small).unwrap().reserved_blocks, 3);
        // Decode one position at a time, prefill in chunks, mixed: the window stays held.
        let a = ids[0];
        windowed_step(&mut kv, a, 5);
        for _ in 0..100 {
            windowed_step(&mut kv, a, 1);
        }
        windowed_step(&mut kv, a, 300);
        windowed_step(&mut kv, ids[1], 999);
        for &c in &ids[..2] {
            let s = kv.get(c).unwrap();
            let h = w.horizon(s.len) as usize;
            assert!(s.live_from as usize <= h && h - (s.live_from as usize) < BLOCK_POSITIONS);
            assert!(s.blocks[..s.live_from as usize / BLOCK_POSITIONS].iter().all(|&b| b == FREED));
            assert!(s.blocks[s.live_from as usize / BLOCK_POSITIONS..].iter().all(|&b| b != FREED));
            assert_eq!(s.tokens.len(), s.len as usize, "the whole token history stays");
        }
        assert_eq!(kv.get(a).unwrap().len, 405);
        assert_eq!(kv.check_append(a, 596).unwrap_err().status, crate::Status::LLMRT_CONTEXT_FULL);
        for c in [a, ids[1], small] {
            kv.release(c).unwrap();
        }
        assert_eq!((kv.reserved_blocks(), kv.blocks_in_use()), (0, 0));
    }

    #[test]
    fn windowed_truncate_keeps_the_window_of_the_new_end() {
        let mut kv = KvManager::new(64, 1);
        kv.set_window(WindowKv::new(20));
        let a = kv.reserve(1000, 1000).unwrap();
        windowed_step(&mut kv, a, 200);
        // Positions 0..176 freed: the window of 200 starts at 181.
        assert_eq!(kv.get(a).unwrap().live_from, 176);
        let e = kv.truncate(a, 190).unwrap_err();
        assert_eq!(e.status, crate::Status::LLMRT_INVALID_ARGUMENT);
        assert!(e.message.contains("positions 0..176 fell out of the sliding window of 20"), "{}", e.message);
        assert!(e.message.contains("at least 195 positions"), "{}", e.message);
        assert_eq!(kv.get(a).unwrap().len, 200);
        kv.truncate(a, 195).unwrap();
        assert_eq!(kv.get(a).unwrap().len, 195);
        windowed_step(&mut kv, a, 10);
        // A fork shares the held blocks; both free on their own.
        let b = kv.fork(a).unwrap();
        windowed_step(&mut kv, b, 70);
        windowed_step(&mut kv, a, 1);
        assert_eq!(kv.get(a).unwrap().len, 206);
        kv.truncate(a, 0).unwrap();
        assert_eq!((kv.get(a).unwrap().live_from, held(&kv, a)), (0, 0));
        kv.release(a).unwrap();
        kv.release(b).unwrap();
        assert_eq!(kv.blocks_in_use(), 0);
    }

    #[test]
    fn an_abandoned_chunked_step_restores_the_table() {
        let mut kv = KvManager::new(64, 1);
        kv.set_window(WindowKv::new(20));
        let a = kv.reserve(1000, 1000).unwrap();
        windowed_step(&mut kv, a, 37);
        let before = kv.get(a).unwrap().clone();
        let in_use = kv.blocks_in_use();
        // Three chunks prepared, the step's early blocks freed, then a failure.
        for lo in [0usize, 64, 128] {
            if lo > 0 {
                kv.free_step_blocks(a, 37 + lo);
            }
            kv.prepare_range(a, 37 + lo, 64).unwrap();
        }
        assert!(kv.get(a).unwrap().blocks[3..8].contains(&FREED));
        kv.abandon_step(a);
        let after = kv.get(a).unwrap();
        assert_eq!((after.len, &after.blocks, after.live_from), (before.len, &before.blocks, before.live_from));
        assert_eq!(kv.blocks_in_use(), in_use);
        // A prepared range must start at or past the length, on prepared blocks.
        assert_eq!(kv.prepare_range(a, 36, 1).unwrap_err().status, crate::Status::LLMRT_INTERNAL);
        assert_eq!(kv.prepare_range(a, 80, 1).unwrap_err().status, crate::Status::LLMRT_INTERNAL);
    }

    #[test]
    fn a_windowed_loaded_cache_holds_its_window() {
        let mut kv = KvManager::new(64, 1);
        kv.set_window(WindowKv::new(20));
        let a = kv.create_filled(1000, 1000, vec![3; 200], 176).unwrap();
        let s = kv.get(a).unwrap();
        assert_eq!((s.len, s.live_from, s.blocks.len(), held(&kv, a)), (200, 176, 13, 2));
        assert_eq!(s.live_blocks().len(), 2);
        // More positions than the booking: refused, nothing taken.
        assert_eq!(kv.create_filled(1000, 1000, vec![3; 200], 0).unwrap_err().status, crate::Status::LLMRT_INTERNAL);
        assert_eq!(kv.blocks_in_use(), 2);
    }
}
