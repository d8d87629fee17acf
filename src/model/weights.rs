//! The weight table by role, bound to a model's tensors with every shape and type
//! checked against the hyperparameters. Matrices stay in the mapped files (zero
//! copy); small vectors (norms, biases, RoPE divisors) are read into f32.
//!
//! **Where a matrix's bytes are.** A model's weights may come from several mapped
//! files (GGUF: one; a sharded safetensors checkpoint: one per shard). They are
//! `Weights::files`; a [`Matrix`] records `file` (an index into it) and `offset`
//! (a byte offset inside that file). Use [`Matrix::bytes`]`(&weights)` to get the
//! whole matrix (`rows * row_bytes` bytes, row-major, rows of `cols` elements in
//! `dtype`; an HF `[out, in]` tensor and a ggml `ne = {in, out}` tensor have the
//! same layout) and [`Weights::file_bytes`] for a whole file.
//!
//! Binding is shared by the formats through [`TensorSource`]: roles are named the
//! GGUF way (`blk.N.attn_q.weight`, ...); a source maps them to its own names.

use super::Config;
use crate::format::gguf::Gguf;
use crate::format::WeightFile;
use crate::quant::{self, DType};
use crate::{Error, Result};
use std::sync::Arc;

/// A 2-D weight `[rows][cols]` (ggml `ne = [cols, rows]`): row `r` is the output
/// row of a matrix-vector product, stored in the file's type.
#[derive(Clone, Debug)]
pub struct Matrix {
    /// The tensor's name in its file.
    pub name: String,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    /// Index into [`Weights::files`].
    pub file: usize,
    /// Byte offset of the matrix inside that file.
    pub offset: usize,
    pub row_bytes: usize,
}

impl Matrix {
    /// Bytes of the whole matrix (`rows * row_bytes`), inside `w`'s mapped file.
    pub fn bytes<'a>(&self, w: &'a Weights) -> &'a [u8] {
        &w.file_bytes(self.file)[self.offset..self.offset + self.rows * self.row_bytes]
    }
}

/// One transformer block's weights.
#[derive(Clone, Debug)]
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    /// Norms of the attention output and of the feed-forward output (gemma2/3).
    pub post_attn_norm: Option<Vec<f32>>,
    pub post_ffn_norm: Option<Vec<f32>>,
    /// The feed-forward block: one gated FFN, or experts.
    pub ffn: Ffn,
}

/// A gated feed-forward network `down(act(gate(x)) * up(x))`.
#[derive(Clone, Debug)]
pub struct Glu {
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
}

/// A layer's feed-forward block.
#[derive(Clone, Debug)]
pub enum Ffn {
    Dense(Glu),
    /// Mixture of experts (see [`super::MoeConfig`]).
    Moe(Moe),
}

/// A mixture-of-experts block's weights.
#[derive(Clone, Debug)]
pub struct Moe {
    /// `[n_experts][hidden]`: the router's scores.
    pub router: Matrix,
    /// Each expert's matrices: views of GGUF's stacked `ffn_*_exps` tensors (no copy),
    /// or a checkpoint's per-expert tensors.
    pub experts: Vec<Glu>,
    /// qwen2moe: the shared expert and its gate vector (`ffn_gate_inp_shexp`, `hidden`).
    pub shared: Option<(Glu, Vec<f32>)>,
}

impl Layer {
    /// Every matrix of the layer (for packing, uploads, fingerprints), in a fixed order.
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut v = vec![&self.wq, &self.wk, &self.wv, &self.wo];
        match &self.ffn {
            Ffn::Dense(g) => v.extend([&g.gate, &g.up, &g.down]),
            Ffn::Moe(m) => {
                v.push(&m.router);
                for g in m.experts.iter().chain(m.shared.as_ref().map(|s| &s.0)) {
                    v.extend([&g.gate, &g.up, &g.down]);
                }
            }
        }
        v
    }

    /// The dense feed-forward block, `None` for experts.
    pub fn dense(&self) -> Option<&Glu> {
        match &self.ffn {
            Ffn::Dense(g) => Some(g),
            Ffn::Moe(_) => None,
        }
    }
}

/// Every weight of a model, over its mapped files.
pub struct Weights {
    /// The mapped files the matrices point into (`Matrix::file` indexes this).
    pub files: Vec<Arc<dyn WeightFile>>,
    pub token_embd: Matrix,
    pub layers: Vec<Layer>,
    pub output_norm: Vec<f32>,
    /// The LM head; the embedding table when the model ties them.
    pub output: Matrix,
    /// Llama-3 RoPE scaling: per-frequency divisors (`rope_freqs.weight`); for LongRoPE
    /// the long or the short factors, as [`Weights::select_rope`] chose.
    pub rope_freqs: Option<Vec<f32>>,
    /// LongRoPE (phi3): the long and the short per-frequency divisors
    /// (`rope_factors_long.weight`, `rope_factors_short.weight`; HF `long_factor`,
    /// `short_factor`).
    pub rope_long_short: Option<(Vec<f32>, Vec<f32>)>,
    /// Bytes of weights as stored.
    pub bytes: u64,
}

impl Weights {
    /// The whole of mapped file `i`.
    pub fn file_bytes(&self, i: usize) -> &[u8] {
        self.files[i].bytes()
    }

    /// Bytes of the routed experts' matrices (0 for a dense model).
    pub fn expert_bytes(&self) -> u64 {
        let mut n = 0u64;
        for l in &self.layers {
            if let Ffn::Moe(m) = &l.ffn {
                for g in &m.experts {
                    n += [&g.gate, &g.up, &g.down].iter().map(|x| (x.rows * x.row_bytes) as u64).sum::<u64>();
                }
            }
        }
        n
    }

    /// LongRoPE: rotates by the long factors when the model runs with a context longer than
    /// the one it was trained at (`cfg.rope_original_context`), else by the short ones, as
    /// llama.cpp chooses by its context size. Nothing to do for other models.
    pub fn select_rope(&mut self, cfg: &Config, context: usize) {
        if let Some((long, short)) = &self.rope_long_short {
            let long_ctx = cfg.rope_original_context.is_some_and(|orig| context > orig);
            self.rope_freqs = Some(if long_ctx { long.clone() } else { short.clone() });
        }
    }
}

/// The GGUF name of a binder role: the roles are GGUF names but for phi3's fused
/// feed-forward matrix, which GGUF calls `ffn_up` (2 x ffn rows, gate first).
fn gguf_name(role: &str) -> std::borrow::Cow<'_, str> {
    match role.strip_suffix("ffn_gate_up.weight") {
        Some(prefix) => format!("{prefix}ffn_up.weight").into(),
        None => role.into(),
    }
}

/// A tensor as the binder sees it.
pub struct TensorRef<'a> {
    /// Its name in its file (for messages and `Matrix::name`).
    pub name: String,
    pub dtype: DType,
    /// Dimensions in ggml order (`ne[0]` contiguous).
    pub ne: Vec<u64>,
    /// Index into the files the weights will hold.
    pub file: usize,
    /// Byte offset in that file.
    pub offset: usize,
    /// Its bytes.
    pub data: &'a [u8],
}

/// Where the binder finds tensors. Roles are GGUF names (`token_embd.weight`,
/// `blk.N.attn_q.weight`, `output.weight`, ...).
pub trait TensorSource {
    /// The tensor playing `role`, `None` when absent. Errors for an unsupported type.
    fn get(&self, role: &str) -> Result<Option<TensorRef<'_>>>;
    /// The name `role` has in this source (for "missing" messages).
    fn stored_name(&self, role: &str) -> String;
    /// The file holding `role` (or the model, when absent), for messages.
    fn location(&self, role: &str) -> String;
    /// A shape for messages, in the source's own convention.
    fn show_shape(&self, ne: &[u64]) -> String;
    /// Where the expected shapes come from, for messages.
    fn config_name(&self) -> &str;
    /// Whether `output.weight` must be present; when not, its absence means the
    /// embedding table is the LM head (GGUF's convention for tied models).
    fn output_required(&self) -> bool {
        false
    }
}

struct GgufSource<'a>(&'a Gguf);

impl TensorSource for GgufSource<'_> {
    fn get(&self, role: &str) -> Result<Option<TensorRef<'_>>> {
        let Some(t) = self.0.tensor(&gguf_name(role)) else { return Ok(None) };
        let dtype = gguf_dtype(self.0, t)?;
        Ok(Some(TensorRef {
            name: t.name.clone(),
            dtype,
            ne: t.ne.clone(),
            file: 0,
            offset: t.offset as usize,
            data: self.0.tensor_data(t),
        }))
    }
    fn stored_name(&self, role: &str) -> String {
        gguf_name(role).into_owned()
    }
    fn location(&self, _role: &str) -> String {
        self.0.path.display().to_string()
    }
    fn show_shape(&self, ne: &[u64]) -> String {
        format!("{ne:?}")
    }
    fn config_name(&self) -> &str {
        "(ggml order) from the hyperparameters"
    }
}

fn gguf_dtype(file: &Gguf, t: &crate::format::gguf::TensorInfo) -> Result<DType> {
    t.dtype.ok_or_else(|| {
        let ty = quant::ggml_type_info(t.ggml_type).map(|i| i.0).unwrap_or("unknown");
        let supported: Vec<&str> = DType::all().iter().map(|d| d.name()).collect();
        Error::unsupported(format!(
            "{}: tensor {} has type {ty} (ggml type {}), which is not supported ({} are)",
            file.path.display(),
            t.name,
            t.ggml_type,
            supported.join(", ")
        ))
    })
}

struct Binder<'a> {
    src: &'a dyn TensorSource,
    bytes: u64,
}

impl<'a> Binder<'a> {
    fn info(&self, role: &str) -> Result<TensorRef<'a>> {
        self.src.get(role)?.ok_or_else(|| {
            Error::bad_model(format!("{}: tensor {} is missing", self.src.location(role), self.src.stored_name(role)))
        })
    }

    fn shape_err(&self, role: &str, t: &TensorRef<'_>, want: &[u64]) -> Error {
        Error::bad_model(format!(
            "{}: tensor {} has shape {}, expected {} {}",
            self.src.location(role),
            t.name,
            self.src.show_shape(&t.ne),
            self.src.show_shape(want),
            self.src.config_name()
        ))
    }

    /// The bytes of a row of `cols` elements of `t`'s type; an error naming the tensor when
    /// `cols` is not a whole number of its blocks.
    fn row_bytes(&self, role: &str, t: &TensorRef<'_>, cols: usize) -> Result<usize> {
        let dtype = t.dtype;
        dtype.row_bytes(cols).ok_or_else(|| {
            Error::bad_model(format!(
                "{}: tensor {}: row length {cols} is not a multiple of the {} block size {}",
                self.src.location(role),
                t.name,
                dtype.name(),
                dtype.block_elems()
            ))
        })
    }

    /// `t`'s first `n` values in f32; an error naming the tensor at a non-finite one.
    fn finite_f32(&self, role: &str, t: &TensorRef<'_>, n: usize) -> Result<Vec<f32>> {
        let mut out = vec![0f32; n];
        quant::dequantize_row(t.dtype, t.data, &mut out);
        if let Some(i) = out.iter().position(|v| !v.is_finite()) {
            return Err(Error::bad_model(format!(
                "{}: tensor {} has a non-finite value at index {i}",
                self.src.location(role),
                t.name
            )));
        }
        Ok(out)
    }

    fn matrix(&mut self, role: &str, cols: usize, rows: usize) -> Result<Matrix> {
        let t = self.info(role)?;
        if t.ne.len() != 2 || t.ne[0] as usize != cols || t.ne[1] as usize != rows {
            return Err(self.shape_err(role, &t, &[cols as u64, rows as u64]));
        }
        let dtype = t.dtype;
        let row_bytes = self.row_bytes(role, &t, cols)?;
        if row_bytes as u64 * rows as u64 != t.data.len() as u64 {
            return Err(Error::bad_model(format!(
                "{}: tensor {} holds {} bytes, expected {}",
                self.src.location(role),
                t.name,
                t.data.len(),
                row_bytes as u64 * rows as u64
            )));
        }
        self.bytes += t.data.len() as u64;
        Ok(Matrix { name: t.name, dtype, rows, cols, file: t.file, offset: t.offset, row_bytes })
    }

    /// A matrix stored as `parts` stacked along its rows (fused Q/K/V, fused gate/up): each
    /// part a row view of it, named `<tensor> rows a..b`, no bytes copied.
    fn fused<const N: usize>(&mut self, role: &str, cols: usize, parts: [usize; N]) -> Result<[Matrix; N]> {
        let m = self.matrix(role, cols, parts.iter().sum())?;
        Ok(std::array::from_fn(|i| {
            let start: usize = parts[..i].iter().sum();
            Matrix {
                name: format!("{} rows {start}..{}", m.name, start + parts[i]),
                rows: parts[i],
                offset: m.offset + start * m.row_bytes,
                ..m.clone()
            }
        }))
    }

    /// `n` experts' matrices of `rows` x `cols` each: one 3-D tensor `role` (GGUF's
    /// `ffn_*_exps`, ne `[cols, rows, n]`) bound as `n` views of it, or, when it is absent,
    /// one matrix per expert, `per_expert(e)` (HF checkpoints, older GGUFs).
    fn experts(
        &mut self,
        role: &str,
        per_expert: &dyn Fn(usize) -> String,
        cols: usize,
        rows: usize,
        n: usize,
    ) -> Result<Vec<Matrix>> {
        let Some(t) = self.src.get(role)? else {
            return (0..n).map(|e| self.matrix(&per_expert(e), cols, rows)).collect();
        };
        if t.ne.len() != 3 || t.ne[0] as usize != cols || t.ne[1] as usize != rows || t.ne[2] as usize != n {
            return Err(self.shape_err(role, &t, &[cols as u64, rows as u64, n as u64]));
        }
        let dtype = t.dtype;
        let row_bytes = self.row_bytes(role, &t, cols)?;
        let expert_bytes = row_bytes as u64 * rows as u64;
        if expert_bytes.checked_mul(n as u64) != Some(t.data.len() as u64) {
            return Err(Error::bad_model(format!(
                "{}: tensor {} holds {} bytes, expected {} x {expert_bytes}",
                self.src.location(role),
                t.name,
                t.data.len(),
                n
            )));
        }
        self.bytes += t.data.len() as u64;
        Ok((0..n)
            .map(|e| Matrix {
                name: format!("{} expert {e}", t.name),
                dtype,
                rows,
                cols,
                file: t.file,
                offset: t.offset + e * expert_bytes as usize,
                row_bytes,
            })
            .collect())
    }

    /// A vector of `n`, stored as `[n]` or as a one-row matrix (HF's `[1, n]`).
    fn row_vector(&mut self, role: &str, n: usize) -> Result<Vec<f32>> {
        let t = self.info(role)?;
        if t.ne.len() == 2 && t.ne[0] as usize == n && t.ne[1] == 1 {
            self.matrix(role, n, 1)?;
            return self.finite_f32(role, &t, n);
        }
        self.vector(role, n)
    }

    /// Per-frequency RoPE divisors (`rope_freqs.weight`, LongRoPE's factors): positive.
    fn divisors(&mut self, role: &str, n: usize) -> Result<Option<Vec<f32>>> {
        let Some(v) = self.opt_vector(role, n)? else { return Ok(None) };
        if let Some(i) = v.iter().position(|&d| d.is_nan() || d <= 0.0) {
            return Err(Error::bad_model(format!(
                "{}: {}[{i}] = {} is not positive",
                self.src.location(role),
                self.src.stored_name(role),
                v[i]
            )));
        }
        Ok(Some(v))
    }

    fn vector(&mut self, role: &str, n: usize) -> Result<Vec<f32>> {
        let t = self.info(role)?;
        if t.ne.len() != 1 || t.ne[0] as usize != n {
            return Err(self.shape_err(role, &t, &[n as u64]));
        }
        let dtype = t.dtype;
        if dtype.row_bytes(n) != Some(t.data.len()) {
            return Err(Error::bad_model(format!(
                "{}: tensor {} holds {} bytes, expected {:?}",
                self.src.location(role),
                t.name,
                t.data.len(),
                dtype.row_bytes(n)
            )));
        }
        let out = self.finite_f32(role, &t, n)?;
        self.bytes += t.data.len() as u64;
        Ok(out)
    }

    fn opt_vector(&mut self, role: &str, n: usize) -> Result<Option<Vec<f32>>> {
        if self.src.get(role)?.is_some() {
            self.vector(role, n).map(Some)
        } else {
            Ok(None)
        }
    }
}

impl Weights {
    /// Binds every tensor of a GGUF file the forward pass needs, checking names,
    /// shapes and types; `progress` sees the fraction of layers bound.
    pub fn bind(file: Arc<Gguf>, cfg: &Config, progress: &mut dyn FnMut(f32)) -> Result<Weights> {
        // Any tensor of an unsupported type is reported, even one we would not read.
        for t in &file.tensors {
            gguf_dtype(&file, t)?;
        }
        let src = GgufSource(&file);
        let parts = Self::bind_parts(&src, cfg, None, None, progress)?;
        let files: Vec<Arc<dyn WeightFile>> = vec![file.clone()];
        Ok(parts.with_files(files))
    }

    /// Binds the roles of `src` (see [`TensorSource`]). `rope_freqs` given here
    /// (computed from a config) replaces a `rope_freqs.weight` tensor, and `long_short`
    /// (LongRoPE's factors from a config) `rope_factors_long/short.weight`.
    pub(crate) fn bind_parts(
        src: &dyn TensorSource,
        cfg: &Config,
        rope_freqs: Option<Vec<f32>>,
        long_short: Option<(Vec<f32>, Vec<f32>)>,
        progress: &mut dyn FnMut(f32),
    ) -> Result<Parts> {
        let mut b = Binder { src, bytes: 0 };
        let (h, q, kv, f, v) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.ffn, cfg.vocab_size);
        // An RMSNorm weight, with the 1 Hugging Face Gemma leaves out added (in f32, as
        // transformers' `1.0 + weight.float()`).
        let plus_one = cfg.arch.norm_plus_one;
        let norm = |b: &mut Binder<'_>, role: &str, n: usize| -> Result<Vec<f32>> {
            let mut w = b.vector(role, n)?;
            if plus_one {
                w.iter_mut().for_each(|x| *x += 1.0);
            }
            Ok(w)
        };
        let token_embd = b.matrix("token_embd.weight", h, v)?;
        let output_norm = norm(&mut b, "output_norm.weight", h)?;
        let output = if src.output_required() || src.get("output.weight")?.is_some() {
            b.matrix("output.weight", h, v)?
        } else {
            token_embd.clone()
        };
        let half = cfg.rope_dim / 2;
        let rope_freqs = match rope_freqs {
            Some(r) => Some(r),
            None => b.divisors("rope_freqs.weight", half)?,
        };
        let rope_long_short = match long_short {
            Some(ls) => Some(ls),
            None => {
                match (b.divisors("rope_factors_long.weight", half)?, b.divisors("rope_factors_short.weight", half)?) {
                    (Some(l), Some(s)) => Some((l, s)),
                    (None, None) => None,
                    (l, _) => {
                        let missing =
                            if l.is_none() { "rope_factors_long.weight" } else { "rope_factors_short.weight" };
                        return Err(Error::bad_model(format!(
                            "{}: tensor {missing} is missing (LongRoPE needs both factor sets)",
                            src.location(missing)
                        )));
                    }
                }
            }
        };
        if rope_long_short.is_some() && rope_freqs.is_some() {
            return Err(Error::bad_model(format!(
                "{}: both rope_freqs.weight and LongRoPE factors are present",
                src.location("rope_freqs.weight")
            )));
        }
        let mut layers = Vec::with_capacity(cfg.n_layers.min(4096));
        for l in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{l}.{s}");
            // Q, K and V as three matrices, or one fused (phi3) bound as row views.
            let (wq, wk, wv) = if src.get(&n("attn_qkv.weight"))?.is_some() {
                let [wq, wk, wv] = b.fused(&n("attn_qkv.weight"), h, [q, kv, kv])?;
                (wq, wk, wv)
            } else {
                (
                    b.matrix(&n("attn_q.weight"), h, q)?,
                    b.matrix(&n("attn_k.weight"), h, kv)?,
                    b.matrix(&n("attn_v.weight"), h, kv)?,
                )
            };
            let ffn = match &cfg.moe {
                None => {
                    let (gate, up) = if cfg.arch.fused_gate_up {
                        let [g, u] = b.fused(&n("ffn_gate_up.weight"), h, [f, f])?;
                        (g, u)
                    } else {
                        (b.matrix(&n("ffn_gate.weight"), h, f)?, b.matrix(&n("ffn_up.weight"), h, f)?)
                    };
                    Ffn::Dense(Glu { gate, up, down: b.matrix(&n("ffn_down.weight"), f, h)? })
                }
                Some(m) => {
                    let (e, fe) = (m.n_experts, m.expert_ffn);
                    let router = b.matrix(&n("ffn_gate_inp.weight"), h, e)?;
                    let per = |w: &'static str| move |x: usize| format!("blk.{l}.{w}.{x}.weight");
                    let gate = b.experts(&n("ffn_gate_exps.weight"), &per("ffn_gate"), h, fe, e)?;
                    let up = b.experts(&n("ffn_up_exps.weight"), &per("ffn_up"), h, fe, e)?;
                    let down = b.experts(&n("ffn_down_exps.weight"), &per("ffn_down"), fe, h, e)?;
                    let experts =
                        gate.into_iter().zip(up).zip(down).map(|((gate, up), down)| Glu { gate, up, down }).collect();
                    let shared = match m.shared_ffn {
                        None => None,
                        Some(fs) => Some((
                            Glu {
                                gate: b.matrix(&n("ffn_gate_shexp.weight"), h, fs)?,
                                up: b.matrix(&n("ffn_up_shexp.weight"), h, fs)?,
                                down: b.matrix(&n("ffn_down_shexp.weight"), fs, h)?,
                            },
                            b.row_vector(&n("ffn_gate_inp_shexp.weight"), h)?,
                        )),
                    };
                    Ffn::Moe(Moe { router, experts, shared })
                }
            };
            let post = cfg.arch.post_norms;
            let layer = Layer {
                attn_norm: norm(&mut b, &n("attn_norm.weight"), h)?,
                wq,
                wk,
                wv,
                wo: b.matrix(&n("attn_output.weight"), q, h)?,
                bq: if cfg.arch.qkv_bias { Some(b.vector(&n("attn_q.bias"), q)?) } else { None },
                bk: if cfg.arch.qkv_bias { Some(b.vector(&n("attn_k.bias"), kv)?) } else { None },
                bv: if cfg.arch.qkv_bias { Some(b.vector(&n("attn_v.bias"), kv)?) } else { None },
                q_norm: if cfg.arch.qk_norm {
                    Some(norm(&mut b, &n("attn_q_norm.weight"), cfg.head_dim)?)
                } else {
                    None
                },
                k_norm: if cfg.arch.qk_norm {
                    Some(norm(&mut b, &n("attn_k_norm.weight"), cfg.head_dim)?)
                } else {
                    None
                },
                ffn_norm: norm(&mut b, &n("ffn_norm.weight"), h)?,
                post_attn_norm: if post { Some(norm(&mut b, &n("post_attention_norm.weight"), h)?) } else { None },
                post_ffn_norm: if post { Some(norm(&mut b, &n("post_ffw_norm.weight"), h)?) } else { None },
                ffn,
            };
            layers.push(layer);
            progress((l + 1) as f32 / cfg.n_layers as f32);
        }
        Ok(Parts { token_embd, layers, output_norm, output, rope_freqs, rope_long_short, bytes: b.bytes })
    }
}

/// Bound weights before the files are attached.
pub(crate) struct Parts {
    token_embd: Matrix,
    layers: Vec<Layer>,
    output_norm: Vec<f32>,
    output: Matrix,
    rope_freqs: Option<Vec<f32>>,
    rope_long_short: Option<(Vec<f32>, Vec<f32>)>,
    bytes: u64,
}

impl Parts {
    pub(crate) fn with_files(self, files: Vec<Arc<dyn WeightFile>>) -> Weights {
        let Parts { token_embd, layers, output_norm, output, rope_freqs, rope_long_short, bytes } = self;
        Weights { files, token_embd, layers, output_norm, output, rope_freqs, rope_long_short, bytes }
    }
}
