//! Paged causal attention on the device, three ways over one argument set
//! ([`AttnArgs`], checked once by `AttnArgs::check`): the one-kernel attention, split-KV
//! (flash-decoding) for decode steps, and tiled (flash-style) attention for prefill.
//! Twins: `backend/cpu/ops/attention.rs` (the CPU op), `kernels/attention.cu` (the
//! kernels); tests: `attention_*` in tests/cuda_kernels.rs.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::{launch_err, mul, need, to_i32, AttnShape, KvPool, Ops};
use crate::error::Error;
use crate::kv::BLOCK_POSITIONS;
use crate::Result;

/// Largest head_dim the attention kernels take (`ATT_MAX_HD` in kernels/attention.cu).
/// cbindgen:ignore
pub const ATTENTION_MAX_HEAD_DIM: usize = 256;
/// Most query heads per KV head [`Ops::attention_split`] takes (`SPLIT_MAX_G`).
/// cbindgen:ignore
pub const SPLIT_MAX_GROUP: usize = 8;
/// Longest split of [`Ops::attention_split`] (`SPLIT_MAX_LEN`), positions.
/// cbindgen:ignore
pub const SPLIT_MAX_LEN: usize = 64;
/// The split length [`Ops::split_plan`] uses (fixed: batch invariance), positions.
/// cbindgen:ignore
pub const SPLIT_LEN: usize = 32;
/// Query tokens per tile of [`Ops::attention_prefill`] (`PF_BQ`).
/// cbindgen:ignore
pub const PREFILL_TILE: usize = 16;

/// Threads per block of attention_f32 and attention_split_f32 (`ATT_THREADS` and
/// `SPLIT_THREADS` in kernels/attention.cu; fixed).
const ATT_THREADS: u32 = 128;
/// Threads per block of attention_merge_f32 (`MERGE_THREADS`: 8 warps share the splits).
/// Fixed: which warp sums a split is part of the merge's order (batch invariance).
const MERGE_THREADS: u32 = 256;
/// The grid's y and z dimensions hold at most this many blocks.
const GRID_YZ_MAX: usize = 65535;

kernel_set!("attention", {
    attention = "attention_f32",
    split = "attention_split_f32",
    merge = "attention_merge_f32",
    prefill = "attention_prefill_f32",
});

/// How a layer scores positions (CPU twin: `backend::cpu::ops::attention::Scores`):
/// `scale * dot(q, k)`, then the soft cap `softcap * tanh(s / softcap)` when the cap is
/// positive (gemma2), over the positions `pos - window < p <= pos` when the window is
/// positive (a sliding window: only the blocks holding them are read), all positions at 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnScores {
    pub scale: f32,
    pub softcap: f32,
    pub window: usize,
}

impl AttnScores {
    /// `1 / sqrt(head_dim)`, no cap, no window.
    pub fn plain(head_dim: usize) -> AttnScores {
        AttnScores { scale: 1.0 / (head_dim as f32).sqrt(), softcap: 0.0, window: 0 }
    }
}

/// What every attention launcher reads: for token t of sequence `seq[t]` at position
/// `pos[t]`, query row t of `q` (`[n_tokens][n_heads * head_dim]`), and positions
/// `0..=pos[t]` (the window's, see [`AttnScores`]) of layer `layer` of `kv`, position p
/// in block `block_tables[seq[t] * max_blocks + p / 16]`, slot `p % 16`. The number of
/// sequences is `block_tables.len() / max_blocks`.
#[derive(Clone, Copy)]
pub struct AttnArgs<'a> {
    pub q: &'a CudaSlice<f32>,
    pub kv: &'a KvPool,
    pub layer: usize,
    pub seq: &'a CudaSlice<u32>,
    pub pos: &'a CudaSlice<u32>,
    pub block_tables: &'a CudaSlice<u32>,
    pub max_blocks: usize,
    pub n_tokens: usize,
    pub shape: AttnShape,
    pub scores: AttnScores,
}

/// [`AttnArgs`] checked, with the sizes as the kernels' ints.
struct Checked {
    n_t: i32,
    nh: i32,
    nkv: i32,
    hd: i32,
    n_layers: i32,
    layer: i32,
    n_blocks: i32,
    max_blocks: i32,
    n_seqs: i32,
    scale: f32,
    softcap: f32,
    /// 0: no window (one longer than any position is none too).
    window: i32,
}

impl AttnArgs<'_> {
    /// The checks every attention kernel needs: `0 < head_dim <= 256`, `n_heads` a
    /// multiple of `n_kv_heads` and at most 65535 (grid y), the pool's layer and size,
    /// `q` and `out` (`out_len` elements) holding `n_tokens` rows, `seq` and `pos`
    /// `n_tokens` ids, at least one block-table row, and every size within the kernels' int.
    fn check(&self, op: &str, out_len: usize) -> Result<Checked> {
        let AttnArgs { q, kv, layer, seq, pos, block_tables, max_blocks, n_tokens, shape, scores } = *self;
        let AttnShape { n_heads, n_kv_heads, head_dim } = shape;
        if head_dim == 0 || head_dim > ATTENTION_MAX_HEAD_DIM || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(Error::invalid(format!(
                "{op}: bad shape {shape:?} (0 < head_dim <= {ATTENTION_MAX_HEAD_DIM}, n_heads a multiple of n_kv_heads)"
            )));
        }
        if n_heads > GRID_YZ_MAX {
            return Err(Error::invalid(format!("{op}: n_heads {n_heads} > {GRID_YZ_MAX} (grid y)")));
        }
        let (q_dim, kv_dim) = kv.check_layer(op, shape, layer)?;
        if max_blocks == 0 {
            return Err(Error::invalid(format!("{op}: max_blocks must be > 0")));
        }
        let out_elems = mul(op, n_tokens, q_dim)?;
        need(op, "q", q.len(), out_elems)?;
        need(op, "out", out_len, out_elems)?;
        need(op, "seq", seq.len(), n_tokens)?;
        need(op, "pos", pos.len(), n_tokens)?;
        need(op, "block_tables", block_tables.len(), max_blocks)?;
        to_i32(op, "n_tokens * q_dim", out_elems)?;
        to_i32(op, "max_blocks * 16", mul(op, max_blocks, BLOCK_POSITIONS)?)?;
        to_i32(op, "kv_dim", kv_dim)?;
        let (n_layers, layer, n_blocks) = kv.kernel_ints(op, layer)?;
        let AttnScores { scale, softcap, window } = scores;
        if !(scale.is_finite() && softcap.is_finite() && softcap >= 0.0) {
            return Err(Error::invalid(format!("{op}: bad scores {scores:?} (finite scale, soft cap >= 0)")));
        }
        Ok(Checked {
            n_t: to_i32(op, "n_tokens", n_tokens)?,
            nh: to_i32(op, "n_heads", n_heads)?,
            nkv: to_i32(op, "n_kv_heads", n_kv_heads)?,
            hd: to_i32(op, "head_dim", head_dim)?,
            n_layers,
            layer,
            n_blocks,
            max_blocks: to_i32(op, "max_blocks", max_blocks)?,
            n_seqs: i32::try_from(block_tables.len() / max_blocks).unwrap_or(i32::MAX),
            scale,
            softcap,
            window: i32::try_from(window).unwrap_or(0),
        })
    }
}

impl Ops {
    /// Causal attention over the pages, one block per (token, query head): each query
    /// head h attends over positions `0..=pos[t]` (the window's) of KV head `h / (n_heads /
    /// n_kv_heads)` (see [`AttnArgs`]), scored as [`AttnScores`] says, softmax in f32.
    /// `out`: `[n_tokens][n_heads * head_dim]`.
    ///
    /// Needs `head_dim <= ATTENTION_MAX_HEAD_DIM` (256) and `n_heads % n_kv_heads == 0`.
    /// A token whose seq, position or block id is out of range gets a NaN row on the
    /// device (never an out-of-bounds read; the host checks these).
    pub fn attention(&self, a: &AttnArgs, out: &mut CudaSlice<f32>) -> Result<()> {
        const OP: &str = "attention";
        let c = a.check(OP, out.len())?;
        if a.n_tokens == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (a.n_tokens as u32, a.shape.n_heads as u32, 1),
            block_dim: (ATT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.k.attention.attention);
        b.arg(a.q).arg(&a.kv.data).arg(a.seq).arg(a.pos).arg(a.block_tables).arg(out);
        b.arg(&c.n_t).arg(&c.nh).arg(&c.nkv).arg(&c.hd).arg(&c.n_layers).arg(&c.layer).arg(&c.n_blocks);
        b.arg(&c.max_blocks).arg(&c.n_seqs).arg(&c.scale).arg(&c.softcap).arg(&c.window);
        // SAFETY: the arguments match attention_f32 in kernels/attention.cu (q, kv, seq, pos,
        // block_tables, out pointers, then int n_tokens, n_heads, n_kv_heads, head_dim,
        // n_layers, layer, n_blocks, max_blocks, n_seqs, float scale, float softcap, int
        // window); AttnArgs::check verified
        // q and out hold n_tokens*n_heads*head_dim f32, seq and pos n_tokens ids, block_tables
        // n_seqs rows of max_blocks, the pool n_blocks blocks with kv_dim =
        // n_kv_heads*head_dim and layer < n_layers, head_dim <= 256 (the kernel's shared q)
        // and n_heads % n_kv_heads == 0; the kernel turns out-of-range seq/pos/block ids into
        // NaN rows without reading them; grid (n_tokens, n_heads <= 65535), block ATT_THREADS.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }

    /// The split of a split-KV attention step over `max_blocks` blocks of positions:
    /// `(n_splits, SPLIT_LEN)`. The split length is fixed, so a sequence's positions fall
    /// into the same splits whatever the batch and the other sequences' lengths; splits
    /// past a sequence's end are empty and add exactly nothing in the merge. So a
    /// sequence's attention is bit-identical alone or in a batch, as with the one-kernel
    /// attention. (`n_tokens`, `n_kv_heads`: the grid is `n_tokens x n_kv_heads x
    /// n_splits` blocks; 32 positions per split gives a 512-position batch-1 decode of an
    /// 8-KV-head model 128 blocks.)
    pub fn split_plan(&self, n_tokens: usize, n_kv_heads: usize, max_blocks: usize) -> (usize, usize) {
        let _ = (n_tokens, n_kv_heads);
        let max_pos = max_blocks.max(1) * BLOCK_POSITIONS;
        (max_pos.div_ceil(SPLIT_LEN), SPLIT_LEN)
    }

    /// Elements of the split-KV scratch for `n_tokens` tokens: (`part_o`, `part_ml`).
    pub fn split_scratch_len(n_tokens: usize, shape: AttnShape, n_splits: usize) -> (usize, usize) {
        let rows = n_tokens * shape.n_heads * n_splits;
        (rows * shape.head_dim, rows * 2)
    }

    /// [`Self::attention`] as split-KV (flash-decoding): each (token, KV head, split of
    /// `split.1` positions) computes the partial softmax of every query head of the group
    /// over its positions into `part_o` / `part_ml` (sized by [`Self::split_scratch_len`]),
    /// and a merge kernel combines the splits with the safe rescale into `out` (a block per
    /// (token, head), its 8 warps sharing the splits: 1024 splits at 32k positions). Same
    /// result as [`Self::attention`] within f32 rounding (scores computed the same way).
    ///
    /// Needs `n_heads / n_kv_heads <= SPLIT_MAX_GROUP` (8) besides what
    /// [`Self::attention`] needs, and `split` from [`Self::split_plan`] (or any split
    /// length that is a multiple of 16 up to 64 with `n_splits * len >= max_blocks * 16`).
    pub fn attention_split(
        &self,
        a: &AttnArgs,
        split: (usize, usize),
        part_o: &mut CudaSlice<f32>,
        part_ml: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        const OP: &str = "attention_split";
        let c = a.check(OP, out.len())?;
        let AttnShape { n_heads, n_kv_heads, head_dim } = a.shape;
        if n_heads / n_kv_heads > SPLIT_MAX_GROUP {
            return Err(Error::invalid(format!(
                "{OP}: {} query heads per KV head, at most {SPLIT_MAX_GROUP}",
                n_heads / n_kv_heads
            )));
        }
        let (n_splits, split_len) = split;
        if split_len == 0 || split_len % BLOCK_POSITIONS != 0 || split_len > SPLIT_MAX_LEN {
            return Err(Error::invalid(format!(
                "{OP}: split length {split_len} (a multiple of 16, at most {SPLIT_MAX_LEN})"
            )));
        }
        if n_splits.checked_mul(split_len).is_none_or(|v| v < a.max_blocks * BLOCK_POSITIONS) {
            return Err(Error::invalid(format!(
                "{OP}: {n_splits} splits of {split_len} do not cover {} blocks of positions",
                a.max_blocks
            )));
        }
        if n_splits > GRID_YZ_MAX || n_kv_heads > GRID_YZ_MAX {
            return Err(Error::invalid(format!(
                "{OP}: {n_splits} splits / {n_kv_heads} KV heads exceed the grid ({GRID_YZ_MAX})"
            )));
        }
        let parts = mul(OP, mul(OP, a.n_tokens, n_heads)?, n_splits)?;
        need(OP, "part_o", part_o.len(), mul(OP, parts, head_dim)?)?;
        need(OP, "part_ml", part_ml.len(), mul(OP, parts, 2)?)?;
        to_i32(OP, "n_tokens * n_heads * n_splits * head_dim", parts * head_dim)?;
        let ns = to_i32(OP, "n_splits", n_splits)?;
        let sl = to_i32(OP, "split_len", split_len)?;
        if a.n_tokens == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (a.n_tokens as u32, n_kv_heads as u32, n_splits as u32),
            block_dim: (ATT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.k.attention.split);
        b.arg(a.q).arg(&a.kv.data).arg(a.seq).arg(a.pos).arg(a.block_tables).arg(&mut *part_o).arg(&mut *part_ml);
        b.arg(&c.n_t).arg(&c.nh).arg(&c.nkv).arg(&c.hd).arg(&c.n_layers).arg(&c.layer).arg(&c.n_blocks);
        b.arg(&c.max_blocks).arg(&c.n_seqs).arg(&ns).arg(&sl).arg(&c.scale).arg(&c.softcap).arg(&c.window);
        // SAFETY: the arguments match attention_split_f32 in kernels/attention.cu (q, kv, seq,
        // pos, block_tables, part_o, part_ml pointers, then int n_tokens, n_heads, n_kv_heads,
        // head_dim, n_layers, layer, n_blocks, max_blocks, n_seqs, n_splits, split_len, float
        // scale, float softcap, int window); AttnArgs::check verified q, seq, pos, block_tables and the pool as for
        // attention_f32, and part_o/part_ml hold n_tokens*n_heads*n_splits*(head_dim | 2) f32
        // (checked above); head_dim <= 256, group <= 8, split_len a multiple of 16 <= 64 and
        // the splits cover max_blocks*16 positions (checked); out-of-range seq/pos/block ids
        // give NaN rows without being read; grid (n_tokens, n_kv_heads, n_splits), block 128
        // = SPLIT_THREADS.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;

        let cfg = LaunchConfig {
            grid_dim: (a.n_tokens as u32, n_heads as u32, 1),
            block_dim: (MERGE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.k.attention.merge);
        b.arg(&*part_o).arg(&*part_ml).arg(out).arg(&c.n_t).arg(&c.nh).arg(&c.hd).arg(&ns);
        // SAFETY: the arguments match attention_merge_f32 in kernels/attention.cu (part_o,
        // part_ml, out pointers, then int n_tokens, n_heads, head_dim, n_splits); part_o and
        // part_ml hold n_tokens*n_heads*n_splits*(head_dim | 2) f32 and out n_tokens*q_dim
        // (checked above), head_dim <= 256 (the kernel's per-warp sums); grid (n_tokens,
        // n_heads <= 65535), block MERGE_THREADS (its launch bound).
        unsafe { b.launch(cfg) }.map_err(|e| launch_err("attention_merge", e))?;
        Ok(())
    }

    /// Whether [`Self::attention_prefill`] takes `shape` (head_dim a multiple of 8, at most 256).
    pub fn prefill_attention_fits(shape: AttnShape) -> bool {
        shape.head_dim > 0 && shape.head_dim.is_multiple_of(8) && shape.head_dim <= ATTENTION_MAX_HEAD_DIM
    }

    /// [`Self::attention`] for prefill, tiled: `tiles` (`[n_tiles][2]`: first token,
    /// count <= [`PREFILL_TILE`]) cover the tokens, each tile a run of one sequence's
    /// tokens at consecutive positions; a block per (tile, query head) walks the
    /// sequence's KV blocks with K/V staged in shared memory and an online softmax per
    /// query row (no score matrix). Same result as [`Self::attention`] within f32 rounding.
    pub fn attention_prefill(
        &self,
        a: &AttnArgs,
        tiles: &CudaSlice<u32>,
        n_tiles: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        const OP: &str = "attention_prefill";
        if !Self::prefill_attention_fits(a.shape) {
            return Err(Error::invalid(format!(
                "{OP}: bad shape {:?} (head_dim a multiple of 8 up to {ATTENTION_MAX_HEAD_DIM})",
                a.shape
            )));
        }
        let c = a.check(OP, out.len())?;
        need(OP, "tiles", tiles.len(), mul(OP, n_tiles, 2)?)?;
        let n_ti = to_i32(OP, "n_tiles", n_tiles)?;
        if n_tiles == 0 || a.n_tokens == 0 {
            return Ok(());
        }
        if n_tiles > i32::MAX as usize / 2 {
            return Err(Error::invalid(format!("{OP}: {n_tiles} tiles")));
        }
        let cfg = LaunchConfig {
            grid_dim: (n_tiles as u32, a.shape.n_heads as u32, 1),
            block_dim: ((PREFILL_TILE * 8) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.k.attention.prefill);
        b.arg(a.q).arg(&a.kv.data).arg(a.seq).arg(a.pos).arg(a.block_tables).arg(tiles).arg(out);
        b.arg(&n_ti).arg(&c.n_t).arg(&c.nh).arg(&c.nkv).arg(&c.hd).arg(&c.n_layers).arg(&c.layer);
        b.arg(&c.n_blocks).arg(&c.max_blocks).arg(&c.n_seqs).arg(&c.scale).arg(&c.softcap).arg(&c.window);
        // SAFETY: the arguments match attention_prefill_f32 in kernels/attention.cu (q, kv, seq,
        // pos, block_tables, tiles, out pointers, then int n_tiles, n_tokens, n_heads,
        // n_kv_heads, head_dim, n_layers, layer, n_blocks, max_blocks, n_seqs, float scale,
        // float softcap, int window);
        // AttnArgs::check verified q and out hold n_tokens*q_dim f32, seq/pos n_tokens ids,
        // block_tables n_seqs rows of max_blocks, the pool n_blocks blocks of kv_dim with
        // layer < n_layers; tiles holds n_tiles pairs (checked above); head_dim % 8 == 0 and
        // <= 256 (16-byte K/V loads, the kernel's shared rows); the kernel refuses tiles
        // outside n_tokens or longer than 16 and out-of-range seq/pos/block ids (NaN rows,
        // nothing read); grid (n_tiles, n_heads <= 65535), block 128 = PF_THREADS.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }
}
