//! The CUDA runner: implements [`Backend`] on one device with the launchers of
//! [`super::ops`], mirroring the CPU forward pass (`backend/cpu/forward.rs`) op for op.
//!
//! - Weights: every matrix is uploaded once, in its stored type ([`DevWeight`]:
//!   quantized stays quantized); norms and biases as f32. A tied LM head reuses the
//!   embedding's upload.
//! - KV: one [`KvPool`] (f16) allocated at load with the number of blocks the
//!   budget gives (see [`default_kv_budget`]).
//! - A step: the host builds the per-token arrays (ids, sequence index, position,
//!   slot ids, padded block tables, RoPE cos/sin in f64 exactly as the CPU, wanted
//!   rows) and uploads them (8 small copies); everything else stays on the device;
//!   one download of the wanted logits (or of the argmax ids for greedy decode) and
//!   one synchronisation, where kernel faults surface as `LLMRT_DEVICE`.
//! - Scratch activations are kept between steps and grow (to the next power of two
//!   of tokens) when a step needs more.
//! - Mixture-of-experts layers ([`moe_ffn`]): the router's scores are downloaded and
//!   every token routed on the host by the CPU's own [`moe::route`] (the same experts and
//!   weights bit for bit from the same scores); each routed expert then runs once on the
//!   device over the rows of all its tokens. Such steps synchronise once per layer and
//!   are never captured into CUDA graphs.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{
    sys, CudaContext, CudaGraph, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DriverError,
    ValidAsZeroBits,
};

use super::device::{driver_err, guarded, probe};
use super::ops::{
    env_flag, AttnArgs, AttnScores, AttnShape, DevWeight, KvPool, KvWrite, MatmulPath, Ops, Qkv, RmsNorm, Rope,
    GEMM_MIN_TOKENS, PREFILL_TILE, SPLIT_MAX_GROUP,
};
use super::DeviceInfo;
use crate::backend::{moe, Backend, Seq, Want};
use crate::kv::{BlockCopy, BLOCK_POSITIONS};
use crate::model::weights::{Ffn, Glu, Matrix, Weights};
use crate::model::{Config, FfnAct, MoeConfig, RopeStyle};
use crate::{Error, Result};

/// Device memory kept free by the default KV budget, beyond the planned scratch: room
/// for cuBLAS workspaces, CUDA graphs and other allocations of the process.
pub(crate) fn kv_headroom(total: u64) -> u64 {
    (256u64 << 20) + total / 100
}

/// Default KV budget on a device when `kv_cache_bytes` is 0, from the memory free
/// after the weights and the planned scratch were allocated: nine tenths of what is
/// left above [`kv_headroom`] (the last tenth leaves room for another model in the
/// same process).
pub(crate) fn default_kv_budget(free_after_scratch: u64, total: u64) -> u64 {
    free_after_scratch.saturating_sub(kv_headroom(total)) / 10 * 9
}

/// Tokens of one step the scratch is planned (allocated at load) for: the context,
/// at most [`PLAN_MAX_TOKENS`], rounded up to a power of two. Longer steps still run,
/// growing the scratch when the device has room.
pub(crate) fn plan_tokens(context: usize) -> usize {
    context.clamp(1, PLAN_MAX_TOKENS).next_power_of_two()
}

/// Most tokens of one step the load-time scratch plan covers.
pub(crate) const PLAN_MAX_TOKENS: usize = 2048;
/// Most logits rows the load-time scratch plan covers (a decode batch, or the rows
/// of a prefill that wants them all).
pub(crate) const PLAN_MAX_ROWS: usize = 256;

/// Decode steps replayed from CUDA graphs pad their block tables to a multiple of this
/// many blocks (128 positions), so one captured graph serves 128 context lengths.
pub(crate) const GRAPH_BLOCK_BUCKET: usize = 8;
/// Captured graphs kept per model (launch shapes: batch size, block bucket, ...); the
/// cache is emptied when full and whenever a scratch buffer is reallocated.
const GRAPH_CACHE_MAX: usize = 64;

/// The launch shape of a step's device work: everything [`CudaBackend::launch_step`]
/// passes to the kernels besides buffers, so a graph captured for one `Launch` replays
/// any step with the same `Launch` (buffers unchanged).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Launch {
    /// Tokens of the step.
    n: usize,
    /// Wanted logits rows.
    nr: usize,
    n_seqs: usize,
    /// Columns of the (padded) block tables.
    max_blocks: usize,
    /// Matmuls may take cuBLAS (`MatmulPath::Auto`); else GEMV only.
    gemm: bool,
    /// Split-KV attention `(n_splits, split_len)`, or the one-kernel attention.
    split: Option<(usize, usize)>,
    /// Prefill attention tiles (0: not the tiled kernel).
    n_tiles: usize,
    /// Argmax of the wanted rows into `Scratch::next`.
    greedy: bool,
    /// Run the LM head (false: the wanted rows' final norm output in `Scratch::seln`
    /// is the result, for embeddings).
    head: bool,
}

/// One array of a step's host plan, as packed into `Scratch::stage` (u32 words; cos
/// and sin as f32 bits). [`STAGE`] is the one description of the packed layout:
/// [`Plan::packed`] writes the parts in its order, `launch_step` copies them out in the
/// same order, and `Scratch::ensure` sizes the stage by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Ids,
    Seq,
    Pos,
    Slots,
    BlockTables,
    Rows,
    Cos,
    Sin,
    /// The local layers' RoPE tables (gemma3; empty for other models).
    CosLocal,
    SinLocal,
    /// Last: a step that does not take the tiled attention leaves it packed but unread.
    Tiles,
}

/// The packed step arrays, in order.
const STAGE: [Part; 11] = [
    Part::Ids,
    Part::Seq,
    Part::Pos,
    Part::Slots,
    Part::BlockTables,
    Part::Rows,
    Part::Cos,
    Part::Sin,
    Part::CosLocal,
    Part::SinLocal,
    Part::Tiles,
];

/// The counts the length of each [`Part`] follows from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StageShape {
    /// Tokens.
    n: usize,
    /// Wanted rows.
    nr: usize,
    /// Block-table entries (sequences x columns).
    bt: usize,
    /// Prefill attention tiles.
    n_tiles: usize,
    /// `rope_dim / 2` (RoPE pairs).
    half: usize,
    /// `rope_dim / 2` with a local RoPE, else 0.
    half_local: usize,
}

impl Part {
    /// Words of this part.
    fn len(self, z: StageShape) -> usize {
        match self {
            Part::Ids | Part::Seq | Part::Pos | Part::Slots => z.n,
            Part::BlockTables => z.bt,
            Part::Rows => z.nr,
            Part::Cos | Part::Sin => z.n * z.half,
            Part::CosLocal | Part::SinLocal => z.n * z.half_local,
            Part::Tiles => 2 * z.n_tiles,
        }
    }

    /// What it holds, for errors.
    fn what(self) -> &'static str {
        match self {
            Part::Ids => "token ids",
            Part::Seq => "sequence indices",
            Part::Pos => "positions",
            Part::Slots => "slot ids",
            Part::BlockTables => "block tables",
            Part::Rows => "wanted rows",
            Part::Cos => "RoPE cos",
            Part::Sin => "RoPE sin",
            Part::CosLocal => "local RoPE cos",
            Part::SinLocal => "local RoPE sin",
            Part::Tiles => "attention tiles",
        }
    }
}

/// Words of the whole stage for `z`.
fn stage_len(z: StageShape) -> usize {
    STAGE.iter().map(|p| p.len(z)).sum()
}

/// What the device memory went to at load (`llmrt_model_info`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MemoryPlan {
    /// Weights as uploaded.
    pub weight_bytes: u64,
    /// Activations, step arrays and the cuBLAS scratch, allocated for the planned step.
    pub scratch_bytes: u64,
    /// The KV pool.
    pub kv_pool_bytes: u64,
    /// Device memory free after all of these.
    pub free_bytes: u64,
    /// The device's memory.
    pub total_bytes: u64,
}

/// `LLMRT_CUDA_GRAPHS` (default on; `LLMRT_CUDA_FAST=0` turns it off with the other fast
/// paths; `LLMRT_CUDA_GRAPHS=1` turns it back on).
fn graphs_enabled() -> bool {
    env_flag("LLMRT_CUDA_GRAPHS").unwrap_or_else(|| env_flag("LLMRT_CUDA_FAST").unwrap_or(true))
}

/// A captured CUDA graph owned by one backend.
struct Graph(CudaGraph);

// SAFETY: CUDA graph handles may be used from any thread as long as calls on one graph
// are serialised (CUDA's graph thread-safety rule). A Graph lives in one CudaBackend's
// cache and is only touched through `&mut CudaBackend` (the model's mutex), one thread
// at a time; it holds no thread-local state.
unsafe impl Send for Graph {}

/// Whether two matrices are the same bytes (a tied LM head is a clone of the
/// embedding's `Matrix`). Weights may span several files (sharded safetensors), where
/// equal offsets in different files are different tensors.
fn same_tensor(a: &Matrix, b: &Matrix) -> bool {
    a.file == b.file && a.offset == b.offset && a.dtype == b.dtype && a.rows == b.rows && a.cols == b.cols
}

/// One transformer block on the device.
struct DevLayer {
    attn_norm: CudaSlice<f32>,
    wq: DevWeight,
    wk: DevWeight,
    wv: DevWeight,
    wo: DevWeight,
    /// Q, K, V biases (qwen2).
    bias: Option<[CudaSlice<f32>; 3]>,
    /// Per-head Q and K norms (qwen3, gemma3).
    qk_norm: Option<[CudaSlice<f32>; 2]>,
    /// Norms of the attention and feed-forward outputs (gemma2, gemma3).
    post_norms: Option<[CudaSlice<f32>; 2]>,
    ffn_norm: CudaSlice<f32>,
    ffn: DevFfn,
}

/// A gated feed-forward block's matrices on the device: `down(act(gate x) * up x)`.
struct DevGlu {
    gate: DevWeight,
    up: DevWeight,
    down: DevWeight,
}

/// A layer's feed-forward block on the device (`weights::Ffn`).
enum DevFfn {
    Dense(DevGlu),
    Moe(DevMoe),
}

/// A mixture-of-experts block on the device (`weights::Moe`).
struct DevMoe {
    /// `[n_experts][hidden]`: the router's scores.
    router: DevWeight,
    experts: Vec<DevGlu>,
    /// qwen2moe: the shared expert, and its gate vector as a one-row F32 matrix.
    shared: Option<Box<(DevGlu, DevWeight)>>,
}

impl DevFfn {
    /// Every matrix of the block (for the memory plan).
    fn matrices(&self) -> Vec<&DevWeight> {
        fn glu(g: &DevGlu) -> [&DevWeight; 3] {
            [&g.gate, &g.up, &g.down]
        }
        match self {
            DevFfn::Dense(g) => glu(g).to_vec(),
            DevFfn::Moe(m) => {
                let mut v = vec![&m.router];
                v.extend(m.experts.iter().flat_map(glu));
                if let Some((g, gate)) = m.shared.as_deref() {
                    v.extend(glu(g));
                    v.push(gate);
                }
                v
            }
        }
    }
}

/// Width of the step's gate/up scratch: the dense feed-forward length, or the widest
/// expert (routed or shared).
fn ffn_width(cfg: &Config) -> usize {
    match &cfg.moe {
        Some(m) => m.expert_ffn.max(m.shared_ffn.unwrap_or(0)),
        None => cfg.ffn,
    }
}

/// Activations and per-step index arrays, reused across steps.
struct Scratch {
    x: CudaSlice<f32>,
    xn: CudaSlice<f32>,
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    att: CudaSlice<f32>,
    proj: CudaSlice<f32>,
    gate: CudaSlice<f32>,
    up: CudaSlice<f32>,
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
    cos_local: CudaSlice<f32>,
    sin_local: CudaSlice<f32>,
    ids: CudaSlice<u32>,
    seq: CudaSlice<u32>,
    pos: CudaSlice<u32>,
    slots: CudaSlice<u32>,
    block_tables: CudaSlice<u32>,
    rows: CudaSlice<u32>,
    sel: CudaSlice<f32>,
    seln: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    next: CudaSlice<u32>,
    /// The argmax partials of the wanted rows (`Ops::argmax_scratch_len`).
    argmax_part: CudaSlice<u32>,
    /// Split-KV partials: `[tokens][heads][splits][head_dim]` and `[..][2]`.
    part_o: CudaSlice<f32>,
    part_ml: CudaSlice<f32>,
    /// The step's arrays packed as u32 words (one host-to-device copy per step).
    stage: CudaSlice<u32>,
    /// Prefill attention tiles (`[n_tiles][2]`).
    tiles: CudaSlice<u32>,
    /// Mixture of experts (one element each for a dense model): the router's scores
    /// (`[tokens][n_experts]`), the shared expert's gate scores (`[tokens]`), an expert's
    /// gathered inputs and its outputs (`[tokens][hidden]`), the per-expert token lists
    /// and weights of a layer as uploaded ([`MoeHost::stage`]), and one expert's list
    /// and weights unpacked from it.
    moe_logits: CudaSlice<f32>,
    moe_gate: CudaSlice<f32>,
    xe: CudaSlice<f32>,
    ye: CudaSlice<f32>,
    moe_stage: CudaSlice<u32>,
    moe_idx: CudaSlice<u32>,
    moe_w: CudaSlice<f32>,
}

impl Scratch {
    /// Grows every buffer to hold a step of `cap` tokens, `rcap` wanted rows and
    /// `bt_len` block-table entries (contents are not kept). Returns whether any buffer
    /// was reallocated (device pointers changed).
    fn ensure(&mut self, to: Alloc, cfg: &Config, cap: usize, rcap: usize, bt_len: usize) -> Result<bool> {
        let (h, qd, kvd, ffn, half, vocab) =
            (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), ffn_width(cfg), cfg.rope_dim / 2, cfg.vocab_size);
        // Mixture of experts: tokens, experts, the expert lists' words; dense models keep
        // one-element buffers.
        let (mcap, ne, moe_words) = match &cfg.moe {
            Some(m) => (cap, m.n_experts, moe_stage_words(m, cap)),
            None => (0, 0, 0),
        };
        let half_local = if cfg.rope_inv_freq_local().is_some() { half } else { 0 };
        let s = self;
        let mut grew = false;
        {
            let mut g = |buf: &mut CudaSlice<f32>, len: usize, what: &str| -> Result<()> {
                grew |= to.grow(buf, len, what)?;
                Ok(())
            };
            g(&mut s.x, cap * h, "x")?;
            g(&mut s.xn, cap * h, "xn")?;
            g(&mut s.q, cap * qd, "q")?;
            g(&mut s.k, cap * kvd, "k")?;
            g(&mut s.v, cap * kvd, "v")?;
            g(&mut s.att, cap * qd, "att")?;
            g(&mut s.proj, cap * h, "proj")?;
            g(&mut s.gate, cap * ffn, "gate")?;
            g(&mut s.up, cap * ffn, "up")?;
            g(&mut s.cos, cap * half, "cos")?;
            g(&mut s.sin, cap * half, "sin")?;
            g(&mut s.cos_local, (cap * half_local).max(1), "local cos")?;
            g(&mut s.sin_local, (cap * half_local).max(1), "local sin")?;
            g(&mut s.sel, rcap * h, "sel")?;
            g(&mut s.seln, rcap * h, "seln")?;
            g(&mut s.logits, rcap * vocab, "logits")?;
            g(&mut s.moe_logits, (mcap * ne).max(1), "router scores")?;
            g(&mut s.moe_gate, mcap.max(1), "shared expert gate scores")?;
            g(&mut s.xe, (mcap * h).max(1), "expert inputs")?;
            g(&mut s.ye, (mcap * h).max(1), "expert outputs")?;
            g(&mut s.moe_w, mcap.max(1), "expert weights")?;
        }
        let mut g = |buf: &mut CudaSlice<u32>, len: usize, what: &str| -> Result<()> {
            grew |= to.grow(buf, len, what)?;
            Ok(())
        };
        g(&mut s.ids, cap, "ids")?;
        g(&mut s.seq, cap, "seq")?;
        g(&mut s.pos, cap, "pos")?;
        g(&mut s.slots, cap, "slots")?;
        g(&mut s.block_tables, bt_len.next_power_of_two(), "block tables")?;
        g(&mut s.rows, rcap, "rows")?;
        g(&mut s.next, rcap, "next")?;
        g(&mut s.argmax_part, Ops::argmax_scratch_len(rcap, vocab), "argmax partials")?;
        g(&mut s.tiles, 2 * cap, "attention tiles")?;
        // The packed step arrays, with at most one tile per token.
        let z = StageShape { n: cap, nr: rcap, bt: bt_len.next_power_of_two(), n_tiles: cap, half, half_local };
        g(&mut s.stage, stage_len(z), "step arrays")?;
        g(&mut s.moe_stage, moe_words.max(1), "expert lists")?;
        g(&mut s.moe_idx, mcap.max(1), "expert rows")?;
        Ok(grew)
    }

    /// Bytes held by the buffers.
    fn bytes(&self) -> u64 {
        let f = [
            &self.x,
            &self.xn,
            &self.q,
            &self.k,
            &self.v,
            &self.att,
            &self.proj,
            &self.gate,
            &self.up,
            &self.cos,
            &self.sin,
            &self.cos_local,
            &self.sin_local,
            &self.sel,
            &self.seln,
            &self.logits,
            &self.part_o,
            &self.part_ml,
            &self.moe_logits,
            &self.moe_gate,
            &self.xe,
            &self.ye,
            &self.moe_w,
        ];
        let u = [
            &self.ids,
            &self.seq,
            &self.pos,
            &self.slots,
            &self.block_tables,
            &self.rows,
            &self.next,
            &self.argmax_part,
            &self.stage,
            &self.tiles,
            &self.moe_stage,
            &self.moe_idx,
        ];
        4 * (f.iter().map(|b| b.len() as u64).sum::<u64>() + u.iter().map(|b| b.len() as u64).sum::<u64>())
    }
}

/// The CUDA backend of one model.
pub(crate) struct CudaBackend {
    cfg: Config,
    info: DeviceInfo,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ops: Ops,
    token_embd: DevWeight,
    layers: Vec<DevLayer>,
    output_norm: CudaSlice<f32>,
    /// The LM head; `None` when tied to `token_embd`.
    output: Option<DevWeight>,
    kv: KvPool,
    /// Blocks the runtime may hand out (the pool holds at least one more than 0).
    kv_blocks: usize,
    /// RoPE inverse frequencies (`rope_dim / 2`), scaling applied, as the CPU has them.
    inv_freq: Vec<f64>,
    /// Those of the windowed layers when they have their own RoPE (gemma3).
    inv_freq_local: Option<Vec<f64>>,
    s: Scratch,
    /// What the device memory went to at load.
    memory: MemoryPlan,
    /// Decode steps on the GEMV path replay CUDA graphs (`LLMRT_CUDA_GRAPHS`, on by default).
    graphs: bool,
    /// Captured graphs by launch shape.
    graph_cache: HashMap<Launch, Graph>,
    /// The host side of the mixture-of-experts layers (empty for a dense model).
    moe_host: MoeHost,
}

/// Where a backend allocates: its context (for memory queries), the device it is on,
/// the stream every buffer is made and used on.
#[derive(Clone, Copy)]
struct Alloc<'a> {
    ctx: &'a Arc<CudaContext>,
    dev: &'a DeviceInfo,
    stream: &'a Arc<CudaStream>,
}

impl Alloc<'_> {
    /// Allocation or copy failure: `LLMRT_OUT_OF_MEMORY` with the sizes when the device
    /// ran out, else `LLMRT_DEVICE`.
    fn mem_err(&self, what: &str, bytes: usize, e: DriverError) -> Error {
        let dev = self.dev;
        if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            let free = match self.ctx.mem_get_info() {
                Ok((free, total)) => format!("{free} of {total} bytes free"),
                Err(_) => format!("{} bytes total", dev.total_mem),
            };
            Error::out_of_memory(format!(
                "cuda:{} {}: out of device memory for {what} ({bytes} bytes; {free})",
                dev.ordinal, dev.name
            ))
        } else {
            driver_err(&format!("allocating/uploading {what} ({bytes} bytes)"), e)
        }
    }

    /// A zeroed buffer of `len` elements.
    fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize, what: &str) -> Result<CudaSlice<T>> {
        let bytes = len * std::mem::size_of::<T>();
        self.stream.alloc_zeros::<T>(len).map_err(|e| self.mem_err(what, bytes, e))
    }

    /// Makes `buf` hold at least `len` elements (contents are not kept); returns whether
    /// it was reallocated.
    fn grow<T: DeviceRepr + ValidAsZeroBits>(&self, buf: &mut CudaSlice<T>, len: usize, what: &str) -> Result<bool> {
        if buf.len() < len {
            *buf = self.zeros(len, &format!("scratch buffer {what}"))?;
            return Ok(true);
        }
        Ok(false)
    }
}

/// Uploads the weights, reporting bytes done.
struct Uploader<'a> {
    to: Alloc<'a>,
    weights: &'a Weights,
    done: u64,
    total: u64,
    progress: &'a mut dyn FnMut(f32),
}

impl Uploader<'_> {
    fn upload<T: DeviceRepr>(&mut self, what: &str, host: &[T]) -> Result<CudaSlice<T>> {
        let bytes = std::mem::size_of_val(host);
        let d = self.to.stream.clone_htod(host).map_err(|e| self.to.mem_err(&format!("tensor {what}"), bytes, e))?;
        self.done += bytes as u64;
        (self.progress)((self.done as f64 / self.total.max(1) as f64).min(1.0) as f32);
        Ok(d)
    }

    fn matrix(&mut self, m: &Matrix) -> Result<DevWeight> {
        let data = self.upload(&m.name, m.bytes(self.weights))?;
        Ok(DevWeight { name: m.name.clone(), dtype: m.dtype, rows: m.rows, cols: m.cols, data })
    }

    fn vector(&mut self, name: &str, v: &[f32]) -> Result<CudaSlice<f32>> {
        self.upload(name, v)
    }

    fn glu(&mut self, g: &Glu) -> Result<DevGlu> {
        Ok(DevGlu { gate: self.matrix(&g.gate)?, up: self.matrix(&g.up)?, down: self.matrix(&g.down)? })
    }

    /// `v` as a one-row F32 matrix (qwen2moe's shared expert gate, multiplied like the router).
    fn row_matrix(&mut self, name: &str, v: &[f32]) -> Result<DevWeight> {
        let mut bytes = crate::util::try_with_capacity(v.len() * 4, "a host copy of a gate vector")?;
        bytes.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        let data = self.upload(name, &bytes)?;
        Ok(DevWeight { name: name.into(), dtype: crate::quant::DType::F32, rows: 1, cols: v.len(), data })
    }
}

/// The host-side arrays of one step.
#[derive(Debug, PartialEq)]
struct Plan {
    /// Token ids, all sequences' tokens in order.
    ids: Vec<u32>,
    /// Per token: index of its sequence in the step.
    seq: Vec<u32>,
    /// Per token: its position in its cache.
    pos: Vec<u32>,
    /// Per token: `block * 16 + pos % 16`.
    slots: Vec<u32>,
    /// `[n_tokens][inv_freq.len()]`, angles `pos * inv_freq` in f64 rounded to f32.
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// The same for the local layers' RoPE (empty without one).
    cos_local: Vec<f32>,
    sin_local: Vec<f32>,
    /// `[n_seqs][max_blocks]`, zero padded.
    block_tables: Vec<u32>,
    max_blocks: usize,
    /// Token rows whose logits are wanted, in sequence order.
    rows: Vec<u32>,
    /// Prefill attention tiles: `[n_tiles][2]` = (first token, count <= PREFILL_TILE),
    /// runs of one sequence's tokens.
    tiles: Vec<u32>,
}

impl Plan {
    /// Every array as u32 words in the order of [`STAGE`] (cos and sin as f32 bits).
    fn packed(&self) -> Vec<u32> {
        let mut v = Vec::with_capacity(
            4 * self.ids.len()
                + self.block_tables.len()
                + self.rows.len()
                + 2 * (self.cos.len() + self.cos_local.len())
                + self.tiles.len(),
        );
        for part in STAGE {
            match part {
                Part::Ids => v.extend_from_slice(&self.ids),
                Part::Seq => v.extend_from_slice(&self.seq),
                Part::Pos => v.extend_from_slice(&self.pos),
                Part::Slots => v.extend_from_slice(&self.slots),
                Part::BlockTables => v.extend_from_slice(&self.block_tables),
                Part::Rows => v.extend_from_slice(&self.rows),
                Part::Cos => v.extend(self.cos.iter().map(|f| f.to_bits())),
                Part::Sin => v.extend(self.sin.iter().map(|f| f.to_bits())),
                Part::CosLocal => v.extend(self.cos_local.iter().map(|f| f.to_bits())),
                Part::SinLocal => v.extend(self.sin_local.iter().map(|f| f.to_bits())),
                Part::Tiles => v.extend_from_slice(&self.tiles),
            }
        }
        v
    }

    /// The arrays of `seqs`; the block tables are padded to a multiple of `bucket` columns.
    fn build(
        seqs: &[Seq<'_>],
        (inv_freq, mscale): (&[f64], f32),
        inv_freq_local: Option<&[f64]>,
        n_blocks: usize,
        vocab: usize,
        bucket: usize,
    ) -> Result<Plan> {
        let n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        let half = inv_freq.len();
        let half_local = inv_freq_local.map_or(0, |f| f.len());
        let max_blocks =
            seqs.iter().map(|s| (s.start + s.tokens.len()).div_ceil(BLOCK_POSITIONS)).max().unwrap_or(1).max(1);
        let max_blocks = max_blocks.next_multiple_of(bucket.max(1));
        let mut p = Plan {
            ids: Vec::with_capacity(n),
            seq: Vec::with_capacity(n),
            pos: Vec::with_capacity(n),
            slots: Vec::with_capacity(n),
            cos: vec![0f32; n * half],
            sin: vec![0f32; n * half],
            cos_local: vec![0f32; n * half_local],
            sin_local: vec![0f32; n * half_local],
            block_tables: vec![0u32; seqs.len() * max_blocks],
            max_blocks,
            rows: Vec::new(),
            tiles: Vec::new(),
        };
        for (si, s) in seqs.iter().enumerate() {
            let end = s.start + s.tokens.len();
            if end > u32::MAX as usize {
                return Err(Error::internal(format!("position {end} does not fit the kernels' u32")));
            }
            let need = end.div_ceil(BLOCK_POSITIONS);
            if s.blocks.len() < need {
                return Err(Error::internal(format!(
                    "block table of sequence {si} has {} blocks, the step needs {need}",
                    s.blocks.len()
                )));
            }
            for (j, &b) in s.blocks[..need].iter().enumerate() {
                // A freed entry (out of every layer's window) stays u32::MAX: the kernels
                // read only the window's blocks and give a NaN row for one outside the pool.
                if b != crate::kv::FREED && b as usize >= n_blocks {
                    return Err(Error::internal(format!("KV block {b} outside the pool of {n_blocks} blocks")));
                }
                p.block_tables[si * max_blocks + j] = b;
            }
            let t0 = p.ids.len();
            for c in (0..s.tokens.len()).step_by(PREFILL_TILE) {
                p.tiles.push((t0 + c) as u32);
                p.tiles.push((s.tokens.len() - c).min(PREFILL_TILE) as u32);
            }
            for (i, &tok) in s.tokens.iter().enumerate() {
                if tok as usize >= vocab {
                    return Err(Error::internal(format!(
                        "token id {tok} outside the vocabulary reached the CUDA step"
                    )));
                }
                let pos = s.start + i;
                let t = p.ids.len();
                p.ids.push(tok);
                p.seq.push(si as u32);
                p.pos.push(pos as u32);
                p.slots.push(s.blocks[pos / BLOCK_POSITIONS] * BLOCK_POSITIONS as u32 + (pos % BLOCK_POSITIONS) as u32);
                // The CPU's tables: the angle in f64, rounded once.
                let r = t * half..(t + 1) * half;
                crate::model::rope_angles(pos, inv_freq, mscale, &mut p.cos[r.clone()], &mut p.sin[r]);
                if let Some(f) = inv_freq_local {
                    let r = t * half_local..(t + 1) * half_local;
                    crate::model::rope_angles(pos, f, mscale, &mut p.cos_local[r.clone()], &mut p.sin_local[r]);
                }
            }
            match s.want {
                Want::Nothing => {}
                Want::Last => p.rows.push((t0 + s.tokens.len() - 1) as u32),
                Want::All => p.rows.extend((t0..t0 + s.tokens.len()).map(|r| r as u32)),
            }
        }
        Ok(p)
    }
}

/// Words of the expert lists a mixture-of-experts layer uploads for `n` tokens
/// ([`MoeHost::stage`]): each token's `n_used` routes as (token, weight) in two runs,
/// and with a shared expert each token's index and gate.
fn moe_stage_words(m: &MoeConfig, n: usize) -> usize {
    let shared = if m.shared_ffn.is_some() { 2 * n } else { 0 };
    (2 * n).saturating_mul(m.n_used).saturating_add(shared)
}

/// The host side of a step's mixture-of-experts layers, kept between steps (grown
/// fallibly, never shrunk).
#[derive(Default)]
struct MoeHost {
    /// The router's scores downloaded, then their probabilities: `[tokens][n_experts]`.
    probs: Vec<f32>,
    /// The shared expert's gate scores downloaded (qwen2moe): `[tokens]`.
    gate: Vec<f32>,
    /// Each token's routes ([`moe::route`]): `[tokens][n_used]`, by expert index.
    routes: Vec<(u32, f32)>,
    /// The router's order (scratch of [`moe::route`]): `[n_experts]`.
    order: Vec<u32>,
    /// The tokens of one expert ([`moe::expert_rows`]).
    rows: Vec<(u32, f32)>,
    /// What a layer uploads ([`moe_stage_words`]): the routed experts' tokens, expert
    /// after expert (`n * n_used` words), then their weights as f32 bits in the same
    /// order; with a shared expert then `0..n` and each token's sigmoid gate (bits).
    stage: Vec<u32>,
    /// `(expert, first word, tokens)` of each expert with tokens, in index order.
    spans: Vec<(usize, usize, usize)>,
}

impl MoeHost {
    /// Makes every buffer hold a step of `n` tokens.
    fn ensure(&mut self, m: &MoeConfig, n: usize) -> Result<()> {
        fn len<T: Clone + Default>(v: &mut Vec<T>, len: usize, what: &str) -> Result<()> {
            if v.len() < len {
                *v = crate::util::try_vec(len, T::default(), what)?;
            }
            Ok(())
        }
        len(&mut self.probs, n.saturating_mul(m.n_experts), "the step's router scores (host)")?;
        len(&mut self.gate, n, "the step's shared expert gate scores (host)")?;
        len(&mut self.routes, n.saturating_mul(m.n_used), "the step's expert routes")?;
        len(&mut self.order, m.n_experts, "the router's order")?;
        len(&mut self.stage, moe_stage_words(m, n), "the step's expert lists (host)")?;
        if self.rows.capacity() < n {
            self.rows = crate::util::try_with_capacity(n, "the step's expert rows")?;
        }
        if self.spans.capacity() < m.n_experts {
            self.spans = crate::util::try_with_capacity(m.n_experts, "the step's expert spans")?;
        }
        Ok(())
    }
}

impl CudaBackend {
    /// Opens device `ordinal`, loads the kernels, uploads every weight (calling
    /// `progress` with the fraction of bytes uploaded) and allocates the KV pool:
    /// `kv_cache_bytes`, or when 0 [`default_kv_budget`] of the memory free after the
    /// weights, for caches of up to `context` positions.
    pub fn new(
        cfg: Config,
        weights: &Weights,
        ordinal: i32,
        kv_cache_bytes: u64,
        context: usize,
        progress: &mut dyn FnMut(f32),
    ) -> Result<CudaBackend> {
        let devices = probe()?;
        if ordinal < 0 || ordinal as usize >= devices.len() {
            return Err(Error::invalid(format!(
                "options.device = {ordinal}, but the driver reports {} CUDA device(s) (ordinals 0..{})",
                devices.len(),
                devices.len()
            )));
        }
        let info = devices[ordinal as usize].clone();
        guarded("opening the CUDA runner", || Self::open(cfg, weights, info, kv_cache_bytes, context, progress))
    }

    fn open(
        cfg: Config,
        w: &Weights,
        info: DeviceInfo,
        kv_cache_bytes: u64,
        context: usize,
        progress: &mut dyn FnMut(f32),
    ) -> Result<CudaBackend> {
        let ctx = CudaContext::new(info.ordinal)
            .map_err(|e| driver_err(&format!("cuDevicePrimaryCtxRetain(cuda:{})", info.ordinal), e))?;
        // One stream of our own for everything (graph capture needs a non-default stream).
        // Every buffer is used on this one stream only, so cudarc's cross-stream event
        // tracking is not needed (and would put event records into captured graphs).
        // SAFETY: disable_event_tracking only stops cudarc from recording/waiting events
        // around buffer uses; with a single stream, stream order already orders every use.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| driver_err("cuStreamCreate", e))?;
        let ops = Ops::new(&ctx, stream.clone(), info.sm())?;

        let tied = same_tensor(&w.output, &w.token_embd);
        let to = Alloc { ctx: &ctx, dev: &info, stream: &stream };
        let mut up = Uploader { to, weights: w, done: 0, total: w.bytes, progress };
        let token_embd = up.matrix(&w.token_embd)?;
        let output_norm = up.vector("output_norm.weight", &w.output_norm)?;
        let output = if tied { None } else { Some(up.matrix(&w.output)?) };
        let mut layers = Vec::with_capacity(w.layers.len());
        for (l, lw) in w.layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{l}.{s}");
            let attn_norm = up.vector(&n("attn_norm.weight"), &lw.attn_norm)?;
            let wq = up.matrix(&lw.wq)?;
            let wk = up.matrix(&lw.wk)?;
            let wv = up.matrix(&lw.wv)?;
            let wo = up.matrix(&lw.wo)?;
            let bias = match (&lw.bq, &lw.bk, &lw.bv) {
                (Some(bq), Some(bk), Some(bv)) => Some([
                    up.vector(&n("attn_q.bias"), bq)?,
                    up.vector(&n("attn_k.bias"), bk)?,
                    up.vector(&n("attn_v.bias"), bv)?,
                ]),
                _ => None,
            };
            let qk_norm = match (&lw.q_norm, &lw.k_norm) {
                (Some(qn), Some(kn)) => {
                    Some([up.vector(&n("attn_q_norm.weight"), qn)?, up.vector(&n("attn_k_norm.weight"), kn)?])
                }
                _ => None,
            };
            let post_norms = match (&lw.post_attn_norm, &lw.post_ffn_norm) {
                (Some(pa), Some(pf)) => {
                    Some([up.vector(&n("post_attention_norm.weight"), pa)?, up.vector(&n("post_ffw_norm.weight"), pf)?])
                }
                _ => None,
            };
            let ffn_norm = up.vector(&n("ffn_norm.weight"), &lw.ffn_norm)?;
            let ffn = match &lw.ffn {
                Ffn::Dense(g) => DevFfn::Dense(up.glu(g)?),
                Ffn::Moe(m) => DevFfn::Moe(DevMoe {
                    router: up.matrix(&m.router)?,
                    experts: m.experts.iter().map(|g| up.glu(g)).collect::<Result<_>>()?,
                    shared: match &m.shared {
                        Some((g, gate)) => {
                            Some(Box::new((up.glu(g)?, up.row_matrix(&n("ffn_gate_inp_shexp.weight"), gate)?)))
                        }
                        None => None,
                    },
                }),
            };
            layers.push(DevLayer { attn_norm, wq, wk, wv, wo, bias, qk_norm, post_norms, ffn_norm, ffn });
        }
        (up.progress)(1.0);

        let weight_bytes = up.done;
        let inv_freq = cfg.rope_inv_freq(w.rope_freqs.as_deref());
        let inv_freq_local = cfg.rope_inv_freq_local();
        const SB: &str = "scratch buffers";
        let mut s = Scratch {
            x: to.zeros(1, SB)?,
            xn: to.zeros(1, SB)?,
            q: to.zeros(1, SB)?,
            k: to.zeros(1, SB)?,
            v: to.zeros(1, SB)?,
            att: to.zeros(1, SB)?,
            proj: to.zeros(1, SB)?,
            gate: to.zeros(1, SB)?,
            up: to.zeros(1, SB)?,
            cos: to.zeros(1, SB)?,
            sin: to.zeros(1, SB)?,
            cos_local: to.zeros(1, SB)?,
            sin_local: to.zeros(1, SB)?,
            ids: to.zeros(1, SB)?,
            seq: to.zeros(1, SB)?,
            pos: to.zeros(1, SB)?,
            slots: to.zeros(1, SB)?,
            block_tables: to.zeros(1, SB)?,
            rows: to.zeros(1, SB)?,
            sel: to.zeros(1, SB)?,
            seln: to.zeros(1, SB)?,
            logits: to.zeros(1, SB)?,
            next: to.zeros(1, SB)?,
            argmax_part: to.zeros(1, SB)?,
            part_o: to.zeros(1, SB)?,
            part_ml: to.zeros(1, SB)?,
            stage: to.zeros(1, SB)?,
            tiles: to.zeros(1, SB)?,
            moe_logits: to.zeros(1, SB)?,
            moe_gate: to.zeros(1, SB)?,
            xe: to.zeros(1, SB)?,
            ye: to.zeros(1, SB)?,
            moe_stage: to.zeros(1, SB)?,
            moe_idx: to.zeros(1, SB)?,
            moe_w: to.zeros(1, SB)?,
        };
        // Memory plan: the scratch of a planned step first (activations, step arrays,
        // cuBLAS activation and dequantization scratch), then the KV pool from what is left.
        stream.synchronize().map_err(|e| driver_err("uploading weights", e))?;
        let pt = plan_tokens(context);
        let pr = pt.min(PLAN_MAX_ROWS);
        s.ensure(to, &cfg, pt, pr, pt.div_ceil(BLOCK_POSITIONS))?;
        let all = layers.iter().flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo].into_iter().chain(l.ffn.matrices()));
        let all: Vec<&DevWeight> = all.chain(std::iter::once(&token_embd)).chain(output.as_ref()).collect();
        let max_cols = all.iter().map(|w| w.cols).max().unwrap_or(0);
        let max_quant = all
            .iter()
            .filter(|w| crate::backend::cuda::ops::dequantized_for_gemm(w.dtype))
            .map(|w| w.rows * w.cols)
            .max()
            .unwrap_or(0);
        let act = if pt > GEMM_MIN_TOKENS { pt * max_cols } else { 0 };
        ops.reserve_scratch(act, max_quant)?;
        let ops_scratch = ops.scratch_bytes();
        stream.synchronize().map_err(|e| driver_err("allocating the scratch buffers", e))?;
        let scratch_bytes = s.bytes() + ops_scratch;

        // KV pool.
        let per_pos = kv_bytes_per_position(&cfg);
        let block_bytes = per_pos * BLOCK_POSITIONS as u64;
        let budget = if kv_cache_bytes == 0 {
            let (free, total) = ctx.mem_get_info().map_err(|e| driver_err("cuMemGetInfo", e))?;
            default_kv_budget(free as u64, total as u64)
        } else {
            kv_cache_bytes
        };
        // Slot ids (block * 16 + slot) are u32 on the device.
        let kv_blocks = ((budget / block_bytes) as usize).min(u32::MAX as usize / BLOCK_POSITIONS);
        let kv = KvPool::new(&stream, kv_blocks.max(1), cfg.n_layers, cfg.kv_dim())?;

        stream.synchronize().map_err(|e| driver_err("allocating the KV pool", e))?;
        let (free, total) = ctx.mem_get_info().map_err(|e| driver_err("cuMemGetInfo", e))?;
        let memory = MemoryPlan {
            weight_bytes,
            scratch_bytes,
            kv_pool_bytes: (kv.n_blocks as u64) * block_bytes,
            free_bytes: free as u64,
            total_bytes: total as u64,
        };
        Ok(CudaBackend {
            memory,
            graphs: graphs_enabled(),
            graph_cache: HashMap::new(),
            cfg,
            info,
            ctx: ctx.clone(),
            stream: stream.clone(),
            ops,
            token_embd,
            layers,
            output_norm,
            output,
            kv,
            kv_blocks,
            inv_freq,
            inv_freq_local,
            s,
            moe_host: MoeHost::default(),
        })
    }

    /// Blocks of the KV pool the runtime may use.
    pub fn kv_blocks(&self) -> usize {
        self.kv_blocks
    }

    /// Runs the forward pass of a step up to the LM head; the wanted rows' logits
    /// are left in `self.s.logits` (and with `greedy` their argmax ids in `self.s.next`).
    /// Returns the number of wanted rows.
    ///
    /// The host builds the step's arrays and uploads them packed into one buffer (one
    /// host-to-device copy); everything else is device work, [`Self::launch_step`],
    /// replayed from a CUDA graph for decode steps on the GEMV path (when graphs are on).
    fn forward(&mut self, seqs: &[Seq<'_>], greedy: bool, head: bool) -> Result<usize> {
        let n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if n == 0 {
            return Ok(0);
        }
        let vocab = self.cfg.vocab_size;
        let shape =
            AttnShape { n_heads: self.cfg.n_heads, n_kv_heads: self.cfg.n_kv_heads, head_dim: self.cfg.head_dim };
        let fast = self.ops.fast_paths();
        let decode = seqs.iter().all(|q| q.tokens.len() == 1);
        // Decode steps (one token per sequence) take the GEMV kernels, whose reduction
        // order is fixed per output: a sequence's result does not depend on the batch it
        // is in. Decode batches of more than GEMM_MIN_TOKENS sequences take cuBLAS when
        // the decode_gemm fast path is on (weights read once for the whole batch).
        let gemm = !decode || (fast.decode_gemm && n > GEMM_MIN_TOKENS && self.ops.has_cublas());
        // Mixture-of-experts steps synchronise in every layer (the routing is on the
        // host): never graphed.
        let graph = self.graphs && decode && !gemm && self.cfg.moe.is_none();
        // Graphed steps pad the block tables to a bucket of GRAPH_BLOCK_BUCKET blocks so
        // that one graph serves many context lengths.
        let bucket = if graph { GRAPH_BLOCK_BUCKET } else { 1 };
        let plan = Plan::build(
            seqs,
            (&self.inv_freq, self.cfg.rope_attn_factor),
            self.inv_freq_local.as_deref(),
            self.kv.n_blocks,
            vocab,
            bucket,
        )?;
        let nr = plan.rows.len();
        // Split-KV attention for decode steps (prefill keeps one block per token and head).
        let split = if decode && fast.splitkv && shape.n_heads / shape.n_kv_heads <= SPLIT_MAX_GROUP {
            Some(self.ops.split_plan(n, shape.n_kv_heads, plan.max_blocks))
        } else {
            None
        };
        // Tiled attention for prefill steps.
        let n_tiles =
            if !decode && fast.prefill_attn && Ops::prefill_attention_fits(shape) { plan.tiles.len() / 2 } else { 0 };
        let l = Launch { n, nr, n_seqs: seqs.len(), max_blocks: plan.max_blocks, gemm, split, n_tiles, greedy, head };

        // Scratch for this launch shape; a regrown buffer invalidates the captured graphs.
        let CudaBackend { ctx, info, stream, cfg, s, graph_cache, moe_host, .. } = self;
        if let Some(m) = &cfg.moe {
            moe_host.ensure(m, n)?;
        }
        let to = Alloc { ctx, dev: info, stream };
        let mut grew =
            s.ensure(to, cfg, n.next_power_of_two(), nr.next_power_of_two().max(1), plan.block_tables.len())?;
        if let Some((ns, _)) = split {
            let (po, pm) = Ops::split_scratch_len(n, shape, ns);
            grew |= to.grow(&mut s.part_o, po, "split-KV partials")?;
            grew |= to.grow(&mut s.part_ml, pm, "split-KV partials")?;
        }
        let packed = plan.packed();
        grew |= to.grow(&mut s.stage, packed.len(), "step arrays")?;
        if grew {
            graph_cache.clear();
        }
        stream.memcpy_htod(&packed, &mut s.stage).map_err(|e| driver_err("uploading the step's arrays", e))?;
        crate::abort::check(|| "the CUDA launch (before any layer)".into())?;

        if graph {
            if !self.graph_cache.contains_key(&l) {
                if self.graph_cache.len() >= GRAPH_CACHE_MAX {
                    self.graph_cache.clear();
                }
                let g = self.capture(l)?;
                self.graph_cache.insert(l, Graph(g));
            }
            let g = self.graph_cache.get(&l).ok_or_else(|| Error::internal("captured graph vanished"))?;
            g.0.launch().map_err(|e| {
                driver_err("cuGraphLaunch (the decode step's CUDA graph; LLMRT_CUDA_GRAPHS=0 runs without graphs)", e)
            })?;
        } else {
            self.launch_step(l)?;
        }
        Ok(nr)
    }

    /// Captures [`Self::launch_step`] of launch shape `l` into a CUDA graph (nothing runs).
    fn capture(&mut self, l: Launch) -> Result<CudaGraph> {
        let cap_err = |what: &str, e: DriverError| {
            driver_err(
                &format!("{what} (capturing the decode step's CUDA graph; LLMRT_CUDA_GRAPHS=0 runs without graphs)"),
                e,
            )
        };
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(|e| cap_err("cuStreamBeginCapture", e))?;
        // A panic inside must not leave the stream capturing (every later call would fail):
        // end the capture first, then report it.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.launch_step(l)));
        let g = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        let r = r.unwrap_or_else(|_| Err(Error::internal("panic while capturing the decode step's CUDA graph")));
        r.map_err(|e| Error {
            status: e.status,
            message: format!(
                "{} (while capturing the decode step's CUDA graph; LLMRT_CUDA_GRAPHS=0 runs without graphs)",
                e.message
            ),
        })?;
        let g = g.map_err(|e| cap_err("cuStreamEndCapture / cuGraphInstantiate", e))?;
        let g = g.ok_or_else(|| Error::device("capturing the decode step's CUDA graph gave an empty graph"))?;
        g.upload().map_err(|e| cap_err("cuGraphUpload", e))?;
        Ok(g)
    }

    /// The device work of a step of launch shape `l` whose packed arrays are in
    /// `s.stage`: unpack them (device-to-device copies), then every layer, the final
    /// norm and the LM head for the wanted rows (and their argmax with `l.greedy`).
    /// Launches only: no allocation, no host copy, no synchronisation (so it can be
    /// captured into a graph), except in mixture-of-experts layers ([`moe_ffn`]: a
    /// download of the router's scores, a synchronisation and an upload of the expert
    /// lists per layer), whose steps are never captured.
    fn launch_step(&mut self, l: Launch) -> Result<()> {
        let cfg = &self.cfg;
        let (h, qd, kvd, hd, vocab) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.head_dim, cfg.vocab_size);
        let eps = cfg.rms_eps;
        let shape = AttnShape { n_heads: cfg.n_heads, n_kv_heads: cfg.n_kv_heads, head_dim: hd };
        let neox = cfg.arch.rope_style == RopeStyle::Neox;
        let Launch { n, nr, n_seqs, max_blocks, gemm, split, n_tiles, greedy, head } = l;
        let path = if gemm { MatmulPath::Auto } else { MatmulPath::Gemv };
        let s_has_local = self.inv_freq_local.is_some();
        let CudaBackend { stream, ops, token_embd, layers, output_norm, output, kv, s, moe_host, .. } = self;
        let fast = ops.fast_paths();

        // Unpack the stage, part by part in the order of STAGE (as Plan::packed wrote it).
        {
            let half = cfg.rope_dim / 2;
            let half_local = if s_has_local { half } else { 0 };
            let z = StageShape { n, nr, bt: n_seqs * max_blocks, n_tiles, half, half_local };
            let total = stage_len(z);
            if s.stage.len() < total {
                return Err(Error::internal(format!(
                    "step arrays: stage holds {} words, {total} needed",
                    s.stage.len()
                )));
            }
            let (src, _gs) = s.stage.device_ptr(stream);
            let mut off = 0usize;
            for part in STAGE {
                let len = part.len(z);
                let src = Words { ptr: src, off, len, what: part.what() };
                match part {
                    Part::Ids => unpack(stream, src, &mut s.ids)?,
                    Part::Seq => unpack(stream, src, &mut s.seq)?,
                    Part::Pos => unpack(stream, src, &mut s.pos)?,
                    Part::Slots => unpack(stream, src, &mut s.slots)?,
                    Part::BlockTables => unpack(stream, src, &mut s.block_tables)?,
                    Part::Rows => unpack(stream, src, &mut s.rows)?,
                    Part::Cos => unpack(stream, src, &mut s.cos)?,
                    Part::Sin => unpack(stream, src, &mut s.sin)?,
                    Part::CosLocal => unpack(stream, src, &mut s.cos_local)?,
                    Part::SinLocal => unpack(stream, src, &mut s.sin_local)?,
                    Part::Tiles => unpack(stream, src, &mut s.tiles)?,
                }
                off += len;
            }
        }

        ops.embed(token_embd, &s.ids, n, &mut s.x)?;
        if cfg.embed_scale != 1.0 {
            ops.scale(&mut s.x, cfg.embed_scale, n * h)?;
        }
        let geglu = cfg.arch.ffn_act == FfnAct::GeluTanh;
        for (li, lw) in layers.iter().enumerate() {
            // Attention block. With the fused path the previous layer's last residual
            // add already normed x into xn with this layer's attn_norm.
            if li == 0 || !fast.fused {
                ops.rmsnorm(RmsNorm { w: &lw.attn_norm, eps }, &s.x, n, h, &mut s.xn)?;
            }
            // Decode (GEMV path): Q, K and V in one launch when the fused kernels apply.
            let fused3 = path == MatmulPath::Gemv
                && ops.matmul3([&lw.wq, &lw.wk, &lw.wv], &s.xn, n, [&mut s.q, &mut s.k, &mut s.v])?;
            if !fused3 {
                ops.matmul(&lw.wq, &s.xn, n, &mut s.q, path)?;
                ops.matmul(&lw.wk, &s.xn, n, &mut s.k, path)?;
                ops.matmul(&lw.wv, &s.xn, n, &mut s.v, path)?;
            }
            if let Some([bq, bk, bv]) = &lw.bias {
                ops.add_bias(&mut s.q, bq, n, qd)?;
                ops.add_bias(&mut s.k, bk, n, kvd)?;
                ops.add_bias(&mut s.v, bv, n, kvd)?;
            }
            if let Some([qn, kn]) = &lw.qk_norm {
                ops.rmsnorm_inplace(RmsNorm { w: qn, eps }, &mut s.q, n * shape.n_heads, hd)?;
                ops.rmsnorm_inplace(RmsNorm { w: kn, eps }, &mut s.k, n * shape.n_kv_heads, hd)?;
            }
            let (cos, sin) = if cfg.local_rope(li) { (&s.cos_local, &s.sin_local) } else { (&s.cos, &s.sin) };
            ops.rope_kv_write(
                Qkv { q: &mut s.q, k: &mut s.k, v: &s.v, n_tokens: n, shape },
                Rope { cos, sin, neox, dim: cfg.rope_dim },
                KvWrite { kv: &mut *kv, layer: li, slots: &s.slots },
            )?;
            let att = AttnArgs {
                q: &s.q,
                kv,
                layer: li,
                seq: &s.seq,
                pos: &s.pos,
                block_tables: &s.block_tables,
                max_blocks,
                n_tokens: n,
                shape,
                scores: AttnScores {
                    scale: cfg.attn_scale,
                    softcap: cfg.attn_softcap,
                    window: cfg.window(li).unwrap_or(0),
                },
            };
            match split {
                Some(sp) => ops.attention_split(&att, sp, &mut s.part_o, &mut s.part_ml, &mut s.att)?,
                None if n_tiles > 0 => ops.attention_prefill(&att, &s.tiles, n_tiles, &mut s.att)?,
                None => ops.attention(&att, &mut s.att)?,
            }
            ops.matmul(&lw.wo, &s.att, n, &mut s.proj, path)?;
            if let Some([pa, _]) = &lw.post_norms {
                ops.rmsnorm_inplace(RmsNorm { w: pa, eps }, &mut s.proj, n, h)?;
            }
            if fast.fused {
                ops.add_rmsnorm(RmsNorm { w: &lw.ffn_norm, eps }, &mut s.x, &s.proj, n, h, &mut s.xn)?;
            } else {
                ops.add(&mut s.x, &s.proj, n * h)?;
                ops.rmsnorm(RmsNorm { w: &lw.ffn_norm, eps }, &s.x, n, h, &mut s.xn)?;
            }

            // Feed-forward block (SwiGLU, or GeGLU; or experts).
            match (&lw.ffn, &cfg.moe) {
                (DevFfn::Dense(g), _) => glu(ops, g, &s.xn, n, path, geglu, (&mut s.gate, &mut s.up), &mut s.proj)?,
                (DevFfn::Moe(m), Some(mc)) => moe_ffn(stream, ops, (m, mc, li), n, h, path, s, moe_host)?,
                (DevFfn::Moe(_), None) => return Err(Error::internal("an expert layer in a model without experts")),
            }
            if let Some([_, pf]) = &lw.post_norms {
                ops.rmsnorm_inplace(RmsNorm { w: pf, eps }, &mut s.proj, n, h)?;
            }
            match layers.get(li + 1) {
                Some(next) if fast.fused => {
                    ops.add_rmsnorm(RmsNorm { w: &next.attn_norm, eps }, &mut s.x, &s.proj, n, h, &mut s.xn)?
                }
                _ => ops.add(&mut s.x, &s.proj, n * h)?,
            }
        }

        // Final norm and LM head, only for the wanted rows.
        if nr > 0 {
            ops.gather_rows(&s.x, &s.rows, nr, h, &mut s.sel)?;
            ops.rmsnorm(RmsNorm { w: output_norm, eps }, &s.sel, nr, h, &mut s.seln)?;
            if !head {
                return Ok(());
            }
            let lm_head = output.as_ref().unwrap_or(token_embd);
            ops.matmul(lm_head, &s.seln, nr, &mut s.logits, path)?;
            if cfg.final_softcap > 0.0 {
                ops.softcap(&mut s.logits, cfg.final_softcap, nr * vocab)?;
            }
            if greedy {
                ops.argmax(&s.logits, nr, vocab, &mut s.argmax_part, &mut s.next)?;
            }
        }
        Ok(())
    }

    /// Makes the context current on the calling thread (callers may step a model
    /// from any thread; cuBLAS works on the thread's current context).
    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| driver_err("cuCtxSetCurrent", e))
    }

    fn sync(&self, what: &str) -> Result<()> {
        self.stream.synchronize().map_err(|e| driver_err(what, e))
    }

    fn wanted_rows(seqs: &[Seq<'_>]) -> usize {
        seqs.iter()
            .map(|s| match s.want {
                Want::Nothing => 0,
                Want::Last => 1,
                Want::All => s.tokens.len(),
            })
            .sum()
    }
}

/// One gated feed-forward block `y = down(act(gate x) * up x)` over the `n` rows of `x`
/// (SwiGLU, or GeGLU with `geglu`), `gate` and `up` its scratch. On decode's GEMV path
/// gate, up and SwiGLU are one launch where the fused kernel applies.
#[allow(clippy::too_many_arguments)]
fn glu(
    ops: &Ops,
    g: &DevGlu,
    x: &CudaSlice<f32>,
    n: usize,
    path: MatmulPath,
    geglu: bool,
    (gate, up): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
    y: &mut CudaSlice<f32>,
) -> Result<()> {
    let fused = !geglu && path == MatmulPath::Gemv && ops.matmul_swiglu(&g.gate, &g.up, x, n, gate)?;
    if !fused {
        let f = g.gate.rows;
        ops.matmul(&g.gate, x, n, gate, path)?;
        ops.matmul(&g.up, x, n, up, path)?;
        if geglu {
            ops.geglu(gate, up, n * f)?;
        } else {
            ops.swiglu(gate, up, n * f)?;
        }
    }
    ops.matmul(&g.down, gate, n, y, path)
}

/// A mixture-of-experts block over the `n` normed hidden states in `s.xn`, into `s.proj`,
/// as `cpu/forward.rs::moe_ffn` computes it: the router's scores (and qwen2moe's shared
/// gate scores) on the device, downloaded (one synchronisation); every token routed on
/// the host by [`moe::route`], the function the CPU uses; the experts' token lists and
/// weights uploaded in one copy; then each expert with tokens, in index order, once over
/// all of them (its weights read once per step): their rows gathered, its SwiGLU, its
/// outputs times their weights added into their tokens' rows. A token's sum thus runs in
/// expert order and depends on nothing but its own routes (batch invariance as for the
/// dense block). Last the shared expert over every token, times its sigmoid gate. The abort
/// hook is polled after the download (the step then fails with nothing committed).
#[allow(clippy::too_many_arguments)]
fn moe_ffn(
    stream: &Arc<CudaStream>,
    ops: &Ops,
    (m, mc, layer): (&DevMoe, &MoeConfig, usize),
    n: usize,
    h: usize,
    path: MatmulPath,
    s: &mut Scratch,
    host: &mut MoeHost,
) -> Result<()> {
    let (ne, k) = (mc.n_experts, mc.n_used);
    let (routed, words) = (n * k, moe_stage_words(mc, n));
    if m.experts.len() != ne || host.probs.len() < n * ne || host.stage.len() < words || s.moe_stage.len() < words {
        return Err(Error::internal(format!(
            "expert layer: {} experts of {ne}, {} router scores and {} / {} expert-list words for {n} tokens",
            m.experts.len(),
            host.probs.len(),
            host.stage.len(),
            s.moe_stage.len()
        )));
    }
    ops.matmul(&m.router, &s.xn, n, &mut s.moe_logits, path)?;
    if let Some((_, gate)) = m.shared.as_deref() {
        ops.matmul(gate, &s.xn, n, &mut s.moe_gate, path)?;
    }
    let dl = |e| driver_err("downloading the router's scores", e);
    stream.memcpy_dtoh(&s.moe_logits.slice(0..n * ne), &mut host.probs[..n * ne]).map_err(dl)?;
    if m.shared.is_some() {
        stream.memcpy_dtoh(&s.moe_gate.slice(0..n), &mut host.gate[..n]).map_err(dl)?;
    }
    stream.synchronize().map_err(|e| driver_err("running the step up to a router (synchronize)", e))?;
    // The host has control here: a place to poll the abort hook.
    crate::abort::check(|| format!("the experts of layer {layer} (CUDA)"))?;

    // Route on the host, then list each expert's tokens (expert order, token order).
    let MoeHost { probs, gate, routes, order, rows, stage, spans } = host;
    for t in 0..n {
        moe::route(
            &mut probs[t * ne..(t + 1) * ne],
            k,
            mc.norm_topk,
            &mut order[..ne],
            &mut routes[t * k..(t + 1) * k],
        );
    }
    spans.clear();
    let mut off = 0;
    for e in 0..ne {
        moe::expert_rows(&routes[..routed], k, e, rows);
        if rows.is_empty() {
            continue;
        }
        for (i, &(t, wgt)) in rows.iter().enumerate() {
            stage[off + i] = t;
            stage[routed + off + i] = wgt.to_bits();
        }
        spans.push((e, off, rows.len()));
        off += rows.len();
    }
    if off != routed {
        return Err(Error::internal(format!("expert layer: {off} routes listed, {routed} made")));
    }
    if m.shared.is_some() {
        for t in 0..n {
            stage[2 * routed + t] = t as u32;
            stage[2 * routed + n + t] = moe::sigmoid(gate[t]).to_bits();
        }
    }
    stream.memcpy_htod(&stage[..words], &mut s.moe_stage).map_err(|e| driver_err("uploading the expert lists", e))?;

    let out = n * h;
    stream.memset_zeros(&mut s.proj.slice_mut(0..out)).map_err(|e| driver_err("zeroing the experts' sum", e))?;
    let (src, _gs) = s.moe_stage.device_ptr(stream);
    for &(e, first, r) in spans.iter() {
        unpack(stream, Words { ptr: src, off: first, len: r, what: "expert rows" }, &mut s.moe_idx)?;
        unpack(stream, Words { ptr: src, off: routed + first, len: r, what: "expert weights" }, &mut s.moe_w)?;
        ops.gather_rows(&s.xn, &s.moe_idx, r, h, &mut s.xe)?;
        glu(ops, &m.experts[e], &s.xe, r, path, false, (&mut s.gate, &mut s.up), &mut s.ye)?;
        ops.scatter_axpy(&mut s.proj, &s.ye, &s.moe_idx, &s.moe_w, r, h, n)?;
    }
    if let Some((sh, _)) = m.shared.as_deref() {
        unpack(stream, Words { ptr: src, off: 2 * routed, len: n, what: "shared expert rows" }, &mut s.moe_idx)?;
        unpack(stream, Words { ptr: src, off: 2 * routed + n, len: n, what: "shared expert gates" }, &mut s.moe_w)?;
        glu(ops, sh, &s.xn, n, path, false, (&mut s.gate, &mut s.up), &mut s.ye)?;
        ops.scatter_axpy(&mut s.proj, &s.ye, &s.moe_idx, &s.moe_w, n, h, n)?;
    }
    Ok(())
}

/// Words `off..off + len` of the stage at device address `ptr` (the stage holds them:
/// `launch_step` checks its length against [`stage_len`] first, [`moe_ffn`] the expert
/// lists' against [`moe_stage_words`]).
#[derive(Clone, Copy)]
struct Words {
    ptr: sys::CUdeviceptr,
    off: usize,
    len: usize,
    what: &'static str,
}

/// Copies the stage words `src` into the start of `dst` (4-byte elements: u32, or f32
/// whose bits the host packed), ordered on `stream`.
fn unpack<T: DeviceRepr>(stream: &Arc<CudaStream>, src: Words, dst: &mut CudaSlice<T>) -> Result<()> {
    const { assert!(std::mem::size_of::<T>() == 4) };
    if src.len == 0 {
        return Ok(());
    }
    if dst.len() < src.len {
        return Err(Error::internal(format!("{}: {} elements, {} needed", src.what, dst.len(), src.len)));
    }
    let (d, _gd) = dst.device_ptr_mut(stream);
    // SAFETY: src.ptr + off*4 .. + len*4 lies in the stage (its length was checked against
    // stage_len by launch_step, or the expert lists' against moe_stage_words by moe_ffn,
    // whose spans lie within those words) and d .. + len*4 in `dst` (checked above, 4-byte
    // elements); both are device allocations of this context, distinct buffers; the copy
    // is ordered on `stream` like every use of them.
    unsafe {
        cudarc::driver::result::memcpy_dtod_async(d, src.ptr + (src.off * 4) as u64, src.len * 4, stream.cu_stream())
    }
    .map_err(|e| driver_err(&format!("unpacking the step's {} (cuMemcpyDtoDAsync)", src.what), e))
}

/// f16 K and V of every layer.
fn kv_bytes_per_position(cfg: &Config) -> u64 {
    (cfg.n_layers * 2 * cfg.kv_dim() * 2) as u64
}

impl Backend for CudaBackend {
    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<()> {
        if copies.is_empty() {
            return Ok(());
        }
        guarded("CUDA KV block copy", || {
            self.bind()?;
            for c in copies {
                if c.src as usize >= self.kv.n_blocks || c.dst as usize >= self.kv.n_blocks {
                    return Err(Error::internal(format!(
                        "KV copy {} -> {} outside the pool of {} blocks",
                        c.src, c.dst, self.kv.n_blocks
                    )));
                }
                self.ops.copy_block(&mut self.kv, c.src, c.dst)?;
            }
            Ok(())
        })
    }

    fn step(&mut self, seqs: &[Seq<'_>], logits: &mut [f32]) -> Result<()> {
        let vocab = self.cfg.vocab_size;
        let wanted = Self::wanted_rows(seqs);
        if logits.len() != wanted * vocab {
            return Err(Error::internal(format!(
                "logits buffer holds {} floats, step wants {}",
                logits.len(),
                wanted * vocab
            )));
        }
        guarded("CUDA step", || {
            self.bind()?;
            let nr = self.forward(seqs, false, true)?;
            if nr != wanted {
                return Err(Error::internal(format!("step produced {nr} logits rows, {wanted} wanted")));
            }
            if nr > 0 {
                let view = self.s.logits.slice(0..nr * vocab);
                self.stream.memcpy_dtoh(&view, logits).map_err(|e| driver_err("downloading logits", e))?;
            }
            self.sync("running the CUDA step")
        })
    }

    fn step_hidden(&mut self, seqs: &[Seq<'_>], hidden: &mut [f32]) -> Result<()> {
        let h = self.cfg.hidden;
        let wanted = Self::wanted_rows(seqs);
        if hidden.len() != wanted * h {
            return Err(Error::internal(format!(
                "hidden-state buffer holds {} floats, step wants {}",
                hidden.len(),
                wanted * h
            )));
        }
        guarded("CUDA hidden-state step", || {
            self.bind()?;
            let nr = self.forward(seqs, false, false)?;
            if nr != wanted {
                return Err(Error::internal(format!("step produced {nr} hidden rows, {wanted} wanted")));
            }
            if nr > 0 {
                let view = self.s.seln.slice(0..nr * h);
                self.stream.memcpy_dtoh(&view, hidden).map_err(|e| driver_err("downloading hidden states", e))?;
            }
            self.sync("running the CUDA hidden-state step")
        })
    }

    fn step_greedy(&mut self, seqs: &[Seq<'_>], next: &mut [u32]) -> Result<()> {
        if next.len() != seqs.len() || seqs.iter().any(|s| s.want != Want::Last) {
            return Err(Error::internal("greedy step: one Want::Last row per sequence expected"));
        }
        guarded("CUDA greedy step", || {
            self.bind()?;
            let nr = self.forward(seqs, true, true)?;
            if nr != next.len() {
                return Err(Error::internal(format!("step produced {nr} rows, {} wanted", next.len())));
            }
            let view = self.s.next.slice(0..nr);
            self.stream.memcpy_dtoh(&view, next).map_err(|e| driver_err("downloading argmax ids", e))?;
            self.sync("running the CUDA greedy step")
        })
    }

    fn kv_bytes_per_position(&self) -> u64 {
        kv_bytes_per_position(&self.cfg)
    }

    fn kv_dtype(&self) -> crate::kv::state::KvDtype {
        crate::kv::state::KvDtype::F16
    }

    /// One block at a time: a device-to-host copy of the whole block into a host
    /// buffer (allocated fallibly), a synchronisation, then its rows into `out`.
    fn read_kv(&mut self, blocks: &[crate::kv::BlockId], len: usize, out: &mut [u8]) -> Result<()> {
        let d = self.kv.kv_dim;
        let n_layers = self.kv.n_layers;
        crate::kv::state::check_section(n_layers, d, 2, blocks, len, out.len())?;
        let be = self.kv.block_elems();
        let mut host = crate::util::try_vec(be, half::f16::ZERO, "a host copy of one KV block")?;
        guarded("CUDA KV state download", || {
            self.bind()?;
            for (bi, &b) in blocks.iter().enumerate().take(len.div_ceil(BLOCK_POSITIONS)) {
                let b = b as usize;
                if b >= self.kv.n_blocks {
                    return Err(Error::internal(format!(
                        "KV state save: block {b} outside the pool of {}",
                        self.kv.n_blocks
                    )));
                }
                let view = self.kv.data.slice(b * be..(b + 1) * be);
                self.stream.memcpy_dtoh(&view, host.as_mut_slice()).map_err(|e| {
                    driver_err(&format!("downloading KV block {b} (cuMemcpyDtoHAsync, {} bytes)", be * 2), e)
                })?;
                self.sync("downloading a KV block")?;
                let start = bi * BLOCK_POSITIONS;
                let n = (len - start).min(BLOCK_POSITIONS);
                for layer in 0..n_layers {
                    for v in 0..2 {
                        let o = (layer * 2 + v) * BLOCK_POSITIONS * d;
                        let at = crate::kv::state::kv_index(layer, v, len, start, d) * 2;
                        for (dst, x) in out[at..at + n * d * 2].chunks_exact_mut(2).zip(&host[o..o + n * d]) {
                            dst.copy_from_slice(&x.to_bits().to_le_bytes());
                        }
                    }
                }
            }
            Ok(())
        })
    }

    /// One block at a time: its rows (zeros in the slots past `len`) into a host
    /// buffer, a host-to-device copy of the whole block, a synchronisation.
    fn write_kv(&mut self, blocks: &[crate::kv::BlockId], len: usize, data: &[u8]) -> Result<()> {
        let d = self.kv.kv_dim;
        let n_layers = self.kv.n_layers;
        crate::kv::state::check_section(n_layers, d, 2, blocks, len, data.len())?;
        let be = self.kv.block_elems();
        let mut host = crate::util::try_vec(be, half::f16::ZERO, "a host copy of one KV block")?;
        guarded("CUDA KV state upload", || {
            self.bind()?;
            for (bi, &b) in blocks.iter().enumerate().take(len.div_ceil(BLOCK_POSITIONS)) {
                let b = b as usize;
                if b >= self.kv.n_blocks {
                    return Err(Error::internal(format!(
                        "KV state load: block {b} outside the pool of {}",
                        self.kv.n_blocks
                    )));
                }
                let start = bi * BLOCK_POSITIONS;
                let n = (len - start).min(BLOCK_POSITIONS);
                host.fill(half::f16::ZERO);
                for layer in 0..n_layers {
                    for v in 0..2 {
                        let o = (layer * 2 + v) * BLOCK_POSITIONS * d;
                        let at = crate::kv::state::kv_index(layer, v, len, start, d) * 2;
                        for (x, src) in host[o..o + n * d].iter_mut().zip(data[at..at + n * d * 2].chunks_exact(2)) {
                            *x = half::f16::from_bits(u16::from_le_bytes([src[0], src[1]]));
                        }
                    }
                }
                let mut view = self.kv.data.slice_mut(b * be..(b + 1) * be);
                self.stream.memcpy_htod(host.as_slice(), &mut view).map_err(|e| {
                    driver_err(&format!("uploading KV block {b} (cuMemcpyHtoDAsync, {} bytes)", be * 2), e)
                })?;
                self.sync("uploading a KV block")?;
            }
            Ok(())
        })
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn device_name(&self) -> String {
        self.info.name.clone()
    }

    fn memory(&self) -> crate::backend::MemoryReport {
        let m = self.memory;
        crate::backend::MemoryReport {
            scratch_bytes: m.scratch_bytes,
            device_free_bytes: m.free_bytes,
            device_total_bytes: m.total_bytes,
        }
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Let queued work finish before the buffers it uses are freed.
        let _ = self.ctx.bind_to_thread();
        let _ = self.stream.synchronize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_lays_out_tokens_slots_tables_and_rows() {
        let inv = [1.0f64, 0.01];
        let (a, b, c) = ([5u32, 6, 7], [9u32], [1u32, 2]);
        let seqs = [
            // 3 tokens at positions 15..18: crosses from block 3 into block 4.
            Seq { tokens: &a, start: 15, blocks: &[3, 4, 8], want: Want::All },
            Seq { tokens: &b, start: 0, blocks: &[2], want: Want::Last },
            Seq { tokens: &c, start: 31, blocks: &[0, 1, 5, 7], want: Want::Nothing },
        ];
        let p = Plan::build(&seqs, (&inv, 1.0), None, 16, 10, 1).unwrap();
        assert_eq!(p.ids, [5, 6, 7, 9, 1, 2]);
        assert_eq!(p.seq, [0, 0, 0, 1, 2, 2]);
        assert_eq!(p.pos, [15, 16, 17, 0, 31, 32]);
        assert_eq!(p.slots, [3 * 16 + 15, 4 * 16, 4 * 16 + 1, 2 * 16, 16 + 15, 5 * 16]);
        assert_eq!(p.max_blocks, 3);
        // Only the blocks a step reaches are copied; the rest is padding.
        assert_eq!(p.block_tables, [3, 4, 0, 2, 0, 0, 0, 1, 5]);
        assert_eq!(p.rows, [0, 1, 2, 3]);
        assert_eq!(p.cos.len(), 12);
        assert_eq!(p.cos[2 * 2 + 1], (17.0f64 * 0.01).cos() as f32);
        assert_eq!(p.sin[5 * 2], (32.0f64).sin() as f32);
        // Tiles: one per sequence here (runs of at most 16 tokens).
        assert_eq!(p.tiles, [0, 3, 3, 1, 4, 2]);
        // Packed: ids, seq, pos, slots, tables, rows, cos and sin bits, tiles.
        let w = p.packed();
        assert_eq!(w.len(), 4 * 6 + 9 + 4 + 12 + 12 + 6);
        assert_eq!(
            w.len(),
            stage_len(StageShape { n: 6, nr: 4, bt: 9, n_tiles: 3, half: 2, half_local: 0 }),
            "STAGE sizes the packing"
        );
        assert_eq!(&w[w.len() - 6..], &p.tiles[..]);
        let long: Vec<u32> = (0..40).collect();
        let blocks: Vec<u32> = (0..8).collect();
        let two = [
            Seq { tokens: &b, start: 3, blocks: &blocks, want: Want::Last },
            Seq { tokens: &long, start: 5, blocks: &blocks, want: Want::Last },
        ];
        assert_eq!(Plan::build(&two, (&inv, 1.0), None, 16, 64, 1).unwrap().tiles, [0, 1, 1, 16, 17, 16, 33, 8]);
        assert_eq!(&w[..6], &p.ids[..]);
        assert_eq!(&w[24..33], &p.block_tables[..]);
        assert_eq!(&w[33..37], &p.rows[..]);
        assert_eq!(w[37 + 2 * 2 + 1], p.cos[2 * 2 + 1].to_bits());
        assert_eq!(w[37 + 12 + 5 * 2], p.sin[5 * 2].to_bits());
        // A bucket of 8 pads the tables to 8 columns with zeros.
        let pb = Plan::build(&seqs, (&inv, 1.0), None, 16, 10, 8).unwrap();
        assert_eq!(pb.max_blocks, 8);
        assert_eq!(&pb.block_tables[..8], &[3, 4, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&pb.block_tables[16..19], &[0, 1, 5]);

        let short = [Seq { tokens: &a, start: 15, blocks: &[3], want: Want::Last }];
        assert_eq!(
            Plan::build(&short, (&inv, 1.0), None, 16, 10, 1).unwrap_err().status,
            crate::Status::LLMRT_INTERNAL
        );
        let outside = [Seq { tokens: &b, start: 0, blocks: &[16], want: Want::Last }];
        assert_eq!(
            Plan::build(&outside, (&inv, 1.0), None, 16, 10, 1).unwrap_err().status,
            crate::Status::LLMRT_INTERNAL
        );
        let bad_token = [Seq { tokens: &[10], start: 0, blocks: &[0], want: Want::Last }];
        assert_eq!(
            Plan::build(&bad_token, (&inv, 1.0), None, 16, 10, 1).unwrap_err().status,
            crate::Status::LLMRT_INTERNAL
        );
    }

    #[test]
    fn tied_head_means_same_file_and_offset() {
        let m = |file, offset| Matrix {
            name: "t".into(),
            dtype: crate::quant::DType::F16,
            rows: 8,
            cols: 4,
            file,
            offset,
            row_bytes: 8,
        };
        assert!(same_tensor(&m(0, 64), &m(0, 64)));
        // Two shards whose tensors start at the same offset: an untied head.
        assert!(!same_tensor(&m(0, 64), &m(1, 64)));
        assert!(!same_tensor(&m(0, 64), &m(0, 128)));
    }

    #[test]
    fn default_kv_budget_rules() {
        let gib = 1u64 << 30;
        let mib = 1u64 << 20;
        // Nine tenths of what is free above 256 MiB + 1% of the device.
        assert_eq!(kv_headroom(100 * gib), 256 * mib + gib);
        assert_eq!(default_kv_budget(100 * gib, 100 * gib), (100 * gib - 256 * mib - gib) / 10 * 9);
        assert_eq!(default_kv_budget(100 * mib, 10 * gib), 0);
        // An 8B-shaped F16 model on a 141 GB device: about 110 GB of KV.
        let free = 143_000_000_000u64 - 16_100_000_000 - 2_000_000_000;
        let kv = default_kv_budget(free, 143_000_000_000);
        assert!(kv > 100_000_000_000 && kv < free, "{kv}");
    }

    #[test]
    fn moe_stage_words_hold_the_routes_and_the_shared_gates() {
        let m = MoeConfig { n_experts: 8, n_used: 2, expert_ffn: 32, norm_topk: true, shared_ffn: None };
        // (token, weight) of each of the 2 routes of 5 tokens.
        assert_eq!(moe_stage_words(&m, 5), 20);
        // qwen2moe: and each token's index and gate.
        assert_eq!(moe_stage_words(&MoeConfig { shared_ffn: Some(96), norm_topk: false, ..m }, 5), 30);
        let mut host = MoeHost::default();
        host.ensure(&m, 5).unwrap();
        assert_eq!((host.probs.len(), host.routes.len(), host.order.len(), host.stage.len()), (40, 10, 8, 20));
        assert!(host.rows.capacity() >= 5 && host.spans.capacity() >= 8);
        // Kept when a later step is smaller.
        host.ensure(&m, 1).unwrap();
        assert_eq!(host.probs.len(), 40);
    }

    #[test]
    fn plan_tokens_rules() {
        assert_eq!(plan_tokens(0), 1);
        assert_eq!(plan_tokens(100), 128);
        assert_eq!(plan_tokens(2048), 2048);
        assert_eq!(plan_tokens(131072), PLAN_MAX_TOKENS);
    }
}
