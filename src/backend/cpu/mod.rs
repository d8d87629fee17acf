//! CPU backend: f32 KV blocks in host memory, the forward pass over mapped
//! weights, worker threads per `options.threads`.

pub(crate) mod attn;
mod forward;
pub(crate) mod fpack;
pub(crate) mod gq;
mod isa;
mod kv;
pub(crate) mod peak;
// `pub` for the bench binary's bandwidth probe (`groups::HostBuf`).
pub(crate) mod groups;
pub(crate) mod ops;
pub(crate) mod pool;
pub(crate) mod qpack;
// `pub` for the bench binary (`simd::isa()`, the kernel set's name).
pub(crate) mod simd;

use super::{Backend, Seq, Want};
use crate::kv::{BlockCopy, BLOCK_POSITIONS};
use crate::model::weights::Weights;
use crate::model::Config;
use crate::quant::DType;
use crate::{Error, Result};
use kv::KvStore;
use ops::matmul::Pack;
use std::collections::HashMap;
use std::sync::Arc;

/// The CPU backend of one model.
pub struct CpuBackend {
    cfg: Config,
    w: Arc<Weights>,
    threads: usize,
    /// Persistent workers (`threads - 1` of them), dropped with the model.
    pool: pool::Pool,
    kv: KvStore,
    /// RoPE inverse frequencies (`rope_dim / 2`), scaling applied.
    inv_freq: Vec<f64>,
    /// Those of the windowed layers when they have their own RoPE (gemma3).
    inv_freq_local: Option<Vec<f64>>,
    /// Q8_0 / Q4_0 matrices repacked for the block-order kernels, keyed by
    /// (file, offset) (empty where the kernel set reads rows as stored).
    packed: HashMap<(usize, usize), Pack>,
    /// The process that loaded the model (for the message of a forked child).
    loaded_in: u32,
}

impl CpuBackend {
    /// Builds the backend; on CPUs with the block-order kernels the quantized
    /// matrices are repacked here (a copy of their bytes in host memory).
    /// `progress` gets the fraction of the repacking done.
    pub fn new(cfg: Config, w: Arc<Weights>, threads: usize, progress: &mut dyn FnMut(f32)) -> Result<CpuBackend> {
        let inv_freq = cfg.rope_inv_freq(w.rope_freqs.as_deref());
        let inv_freq_local = cfg.rope_inv_freq_local();
        let kv = KvStore::new(cfg.n_layers, cfg.kv_dim(), cfg.head_dim);
        let threads = threads.max(1);
        let mut packed = HashMap::new();
        let isa = isa::isa();
        let wants = |dt: DType| {
            (qpack::block_order(isa) && matches!(dt, DType::Q8_0 | DType::Q4_0))
                || fpack::sequential_order(isa, dt)
                || (dt.is_grouped() && gq::packs(isa))
        };
        {
            let mats: Vec<_> =
                w.layers.iter().flat_map(|l| l.matrices()).chain([&w.output]).filter(|m| wants(m.dtype)).collect();
            let total: usize = mats.iter().map(|m| m.rows * m.row_bytes).sum();
            let mut done = 0;
            for m in mats {
                if let std::collections::hash_map::Entry::Vacant(slot) = packed.entry((m.file, m.offset)) {
                    slot.insert(if matches!(m.dtype, DType::F16 | DType::BF16) {
                        Pack::F(fpack::Packed::new(m.dtype, m.bytes(&w), m.rows, m.cols, &m.name, threads)?)
                    } else if m.dtype.is_grouped() {
                        Pack::G(gq::Packed::new(
                            isa,
                            m.dtype,
                            m.bytes(&w),
                            m.row_bytes,
                            m.rows,
                            m.cols,
                            &m.name,
                            threads,
                        )?)
                    } else {
                        Pack::Q(qpack::Packed::new(
                            m.dtype,
                            m.bytes(&w),
                            m.row_bytes,
                            m.rows,
                            m.cols,
                            &m.name,
                            threads,
                        )?)
                    });
                    // The mapped pages of this tensor are not read again (the
                    // embedding table, read row by row, keeps its pages).
                    let e = &w.token_embd;
                    if (e.file, e.offset) != (m.file, m.offset) {
                        w.files[m.file].release(m.offset, m.rows * m.row_bytes);
                    }
                }
                done += m.rows * m.row_bytes;
                progress(done as f32 / total.max(1) as f32);
            }
        }
        let pool = pool::Pool::start(threads)?;
        Ok(CpuBackend { cfg, w, threads, pool, kv, inv_freq, inv_freq_local, packed, loaded_in: pool::process_id() })
    }

    /// Before a step: in a child forked after the load none of the pool's workers
    /// exist, so a new pool is started here (the old one is leaked, see `pool`). If
    /// that fails the step fails, naming the fork, and the next step tries again.
    fn ensure_pool(&mut self) -> Result<()> {
        if self.pool.in_this_process() {
            return Ok(());
        }
        let fresh = pool::Pool::start(self.threads).map_err(|e| {
            Error::new(
                e.status,
                format!(
                    "this process (pid {}) was forked from the one that loaded the model (pid {}): the CPU worker \
                     threads do not exist in the child and cannot be started again: {}",
                    pool::process_id(),
                    self.loaded_in,
                    e.message
                ),
            )
        })?;
        drop(std::mem::replace(&mut self.pool, fresh));
        Ok(())
    }
}

impl CpuBackend {
    /// A step with rows of logits (`head`) or of final hidden states.
    fn run(&mut self, seqs: &[Seq<'_>], out: &mut [f32], head: bool) -> Result<()> {
        self.ensure_pool()?;
        let wanted: usize = seqs.iter().map(|s| s.want.rows(s.tokens.len())).sum();
        let width = if head { self.cfg.vocab_size } else { self.cfg.hidden };
        if out.len() != wanted * width {
            return Err(Error::internal(format!(
                "output buffer holds {} floats, step wants {}",
                out.len(),
                wanted * width
            )));
        }
        for s in seqs {
            let end = s.start + s.tokens.len();
            for bi in s.start / BLOCK_POSITIONS..end.div_ceil(BLOCK_POSITIONS) {
                let b = *s.blocks.get(bi).ok_or_else(|| Error::internal("block table shorter than the step"))?;
                self.kv.ensure(b)?;
            }
        }
        forward::step(self, seqs, out, head)
    }
}

impl Backend for CpuBackend {
    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<()> {
        for c in copies {
            self.kv.copy(c.src, c.dst)?;
        }
        Ok(())
    }

    fn step(&mut self, seqs: &[Seq<'_>], logits: &mut [f32]) -> Result<()> {
        self.run(seqs, logits, true)
    }

    fn step_hidden(&mut self, seqs: &[Seq<'_>], hidden: &mut [f32]) -> Result<()> {
        self.run(seqs, hidden, false)
    }

    /// The default greedy step, with the step's logits allocated fallibly (a batch
    /// of many caches times a large vocabulary must not abort).
    fn step_greedy(&mut self, seqs: &[Seq<'_>], next: &mut [u32]) -> Result<()> {
        let v = self.cfg.vocab_size;
        if next.len() != seqs.len() || seqs.iter().any(|s| s.want != Want::Last) {
            return Err(Error::internal("greedy step: one Want::Last row per sequence expected"));
        }
        let mut logits = crate::util::try_vec(seqs.len().saturating_mul(v), 0f32, "the greedy step's logits")?;
        self.step(seqs, &mut logits)?;
        for (o, row) in next.iter_mut().zip(logits.chunks_exact(v)) {
            *o = crate::util::argmax(row);
        }
        Ok(())
    }

    fn kv_bytes_per_position(&self) -> u64 {
        (self.cfg.n_layers * 2 * self.cfg.kv_dim() * 4) as u64
    }

    fn kv_dtype(&self) -> crate::kv::state::KvDtype {
        crate::kv::state::KvDtype::F32
    }

    fn read_kv(&mut self, blocks: &[crate::kv::BlockId], len: usize, out: &mut [u8]) -> Result<()> {
        self.kv.read_positions(blocks, len, out)
    }

    fn write_kv(&mut self, blocks: &[crate::kv::BlockId], len: usize, data: &[u8]) -> Result<()> {
        self.kv.write_positions(blocks, len, data)
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn device_name(&self) -> String {
        format!("cpu ({} threads, {})", self.threads, isa::isa().name())
    }
}
