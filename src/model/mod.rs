//! What a model IS: hyperparameters, the architecture's options, and the weight
//! table by role. Architectures are rows of options over one forward pass
//! (see `backend::cpu::forward`), not copies of it.

pub mod hf;
pub mod weights;

use crate::format::gguf::Gguf;
use crate::{Error, Result};

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (2i, 2i+1): llama.cpp's converter permutes Llama's Q/K rows so GGUF
    /// `llama` files (and llama2.c checkpoints) use this.
    Adjacent,
    /// Pairs (i, i + d/2), "neox": Hugging Face weights (all architectures, see
    /// [`ArchOptions::for_hf`]), qwen2/qwen3 GGUFs.
    Neox,
}

/// The activation of the gated feed-forward block `down(act(gate(x)) * up(x))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnAct {
    /// SiLU: SwiGLU (llama, mistral, qwen).
    Silu,
    /// GELU, tanh approximation (`gelu_pytorch_tanh`): GeGLU (gemma2, gemma3).
    GeluTanh,
}

/// The options that make one forward pass a given architecture.
#[derive(Clone, Debug, PartialEq)]
pub struct ArchOptions {
    /// The `general.architecture` name as reported to callers.
    pub name: String,
    pub rope_style: RopeStyle,
    /// Q, K and V projections carry biases (qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of Q and K before RoPE (qwen3, gemma3).
    pub qk_norm: bool,
    pub ffn_act: FfnAct,
    /// RMSNorm of the attention output and of the feed-forward output, each before
    /// its residual add (gemma2, gemma3: `post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// The checkpoint stores every RMSNorm weight as `w - 1` (Hugging Face Gemma
    /// computes `x * (1 + w)`): 1 is added when the weights are bound. llama.cpp's
    /// converter adds it itself, so GGUF Gemma files do not need it.
    pub norm_plus_one: bool,
    /// The feed-forward gate and up projections are one matrix of `2 * ffn` rows, gate
    /// first (phi3: GGUF `ffn_up`, HF `gate_up_proj`). Bound as two row views of it.
    pub fused_gate_up: bool,
}

/// The option rows of the architectures, by the name each format gives them.
fn arch_row(name: &str, rope_style: RopeStyle, hf: bool) -> Option<ArchOptions> {
    let gemma = matches!(name, "gemma2" | "gemma3" | "gemma3_text");
    let (qkv_bias, qk_norm) = match name {
        "llama" | "mistral" | "gemma2" | "phi3" | "mixtral" => (false, false),
        "qwen2" | "qwen2moe" | "qwen2_moe" => (true, false),
        "qwen3" | "gemma3" | "gemma3_text" | "qwen3moe" | "qwen3_moe" => (false, true),
        _ => return None,
    };
    Some(ArchOptions {
        name: name.to_string(),
        rope_style,
        qkv_bias,
        qk_norm,
        ffn_act: if gemma { FfnAct::GeluTanh } else { FfnAct::Silu },
        post_norms: gemma,
        norm_plus_one: gemma && hf,
        fused_gate_up: name == "phi3",
    })
}

impl ArchOptions {
    /// The row for a GGUF `general.architecture` value.
    pub fn for_gguf(arch: &str) -> Option<ArchOptions> {
        let rope_style = match arch {
            "llama" | "mistral" => RopeStyle::Adjacent,
            "qwen2" | "qwen3" | "gemma2" | "gemma3" | "phi3" | "qwen2moe" | "qwen3moe" => RopeStyle::Neox,
            _ => return None,
        };
        arch_row(arch, rope_style, false)
    }

    /// Whether this is Gemma 2 or Gemma 3 (from either format).
    pub fn is_gemma(&self) -> bool {
        self.post_norms
    }
}

impl ArchOptions {
    /// The row for a Hugging Face config.json `model_type`. HF weights are not
    /// permuted, so every one of them takes the half-split ("neox") RoPE.
    pub fn for_hf(model_type: &str) -> Option<ArchOptions> {
        if model_type == "gemma3" || model_type == "gemma" {
            return None; // multimodal gemma3 / Gemma 1: not supported (gemma3_text is)
        }
        arch_row(model_type, RopeStyle::Neox, true)
    }
}

/// Which layers attend through the sliding window.
#[derive(Clone, Debug, PartialEq)]
pub enum SwaLayers {
    /// Every layer (Mistral's `sliding_window`).
    All,
    /// Layer `l` slides when `l % n < n - 1` (llama.cpp's `set_swa_pattern`;
    /// transformers' `(l + 1) % n != 0`): gemma2 n = 2 (even layers), gemma3 n = 6
    /// (five local layers, then one global).
    Pattern(usize),
    /// One flag per layer (HF `layer_types`, GGUF `attention.sliding_window_pattern` as an array).
    List(Vec<bool>),
}

/// Sliding-window attention: on a windowed layer a query at position `p` attends
/// to the keys at positions `p - window < k <= p` (transformers' mask
/// `kv_idx > q_idx - sliding_window`; llama.cpp's `LLAMA_SWA_TYPE_STANDARD`, which
/// masks `p - k >= window`, is the same).
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    pub window: usize,
    pub layers: SwaLayers,
    /// The RoPE of the windowed layers when it is not the global one (gemma3: its
    /// own base, `rope.freq_base_swa` / `rope_local_base_freq`, and no scaling).
    pub rope: Option<LocalRope>,
}

/// A RoPE base and linear factor of its own (gemma3's local layers).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LocalRope {
    pub theta: f32,
    pub linear_factor: f32,
}

/// A mixture-of-experts feed-forward block (mixtral, qwen2moe, qwen3moe): a router
/// (`ffn_gate_inp`, one row per expert) scores the experts for each token; their
/// softmax's `n_used` largest (ties: the lower expert index first) are the token's
/// experts, each a SwiGLU of `expert_ffn`, summed by those probabilities
/// (renormalized to sum 1 when `norm_topk`); plus, when `shared_ffn` is set, a
/// shared SwiGLU expert on every token scaled by `sigmoid(x . ffn_gate_inp_shexp)`
/// (qwen2moe). Every layer is a MoE layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    pub n_experts: usize,
    pub n_used: usize,
    pub expert_ffn: usize,
    pub norm_topk: bool,
    pub shared_ffn: Option<usize>,
}

/// The most experts a model may have (Qwen3's 128 and DeepSeek's 256 fit): bounds
/// the router's scratch, which is sized by it.
pub const MAX_EXPERTS: usize = 1024;

impl MoeConfig {
    /// Checks the counts (`file` and `what` name them in messages: the keys' names).
    pub fn check(&self, file: &str, what: &str) -> Result<()> {
        let MoeConfig { n_experts, n_used, expert_ffn, .. } = *self;
        if !(2..=MAX_EXPERTS).contains(&n_experts) {
            return Err(Error::unsupported(format!(
                "{file}: {what}: {n_experts} experts (2 to {MAX_EXPERTS} are supported)"
            )));
        }
        if n_used == 0 || n_used > n_experts {
            return Err(Error::bad_model(format!("{file}: {what}: {n_used} experts used per token of {n_experts}")));
        }
        if expert_ffn == 0 || self.shared_ffn == Some(0) {
            return Err(Error::bad_model(format!("{file}: {what}: an expert's feed-forward length is 0")));
        }
        Ok(())
    }
}

/// Hyperparameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub arch: ArchOptions,
    pub vocab_size: usize,
    pub hidden: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// The dimensions of each Q/K head that RoPE rotates: the first `rope_dim` (even,
    /// at most `head_dim`), paired within them as [`ArchOptions::rope_style`] says; the
    /// rest pass unrotated (partial rotary: Phi-4-mini's `partial_rotary_factor` 0.75,
    /// GGUF `rope.dimension_count`). `head_dim` for most models.
    pub rope_dim: usize,
    pub ffn: usize,
    pub context_length: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    /// Linear RoPE scaling factor (positions divided by it); 1 when absent.
    pub rope_linear_factor: f32,
    /// LongRoPE (phi3): the context the model was trained at. A model run with a longer
    /// context rotates by the long factors, else by the short ones (as llama.cpp chooses
    /// by its context size; [`weights::Weights::select_rope`]).
    pub rope_original_context: Option<usize>,
    /// LongRoPE's attention factor: RoPE's cos and sin are multiplied by it (1 otherwise).
    pub rope_attn_factor: f32,
    pub bos_token: Option<u32>,
    pub eos_token: Option<u32>,
    /// The embeddings are multiplied by this (gemma: sqrt(hidden), see
    /// [`gemma_embed_scale`]); 1 otherwise.
    pub embed_scale: f32,
    /// The scale of the attention scores: `1 / sqrt(head_dim)` unless the model
    /// says otherwise (gemma: `query_pre_attn_scalar`, or llama.cpp's rule for GGUF).
    pub attn_scale: f32,
    /// Soft cap of the attention scores, `c * tanh(s / c)` after the scale (gemma2); 0: none.
    pub attn_softcap: f32,
    /// Soft cap of the final logits (gemma2, gemma3 when configured); 0: none.
    pub final_softcap: f32,
    /// Sliding-window attention, on the layers it names; `None`: every layer attends
    /// to the whole cache.
    pub sliding_window: Option<SlidingWindow>,
    /// Mixture-of-experts feed-forward blocks; `None`: dense (`ffn` wide).
    pub moe: Option<MoeConfig>,
}

/// The gemma embedding scale `sqrt(hidden)`, rounded as each source rounds it:
/// llama.cpp computes `sqrtf(n_embd)` in f32; transformers' normalizer is a float32
/// tensor cast to the weights' dtype before the multiply (`embed_scale.to(weight.dtype)`),
/// so a bfloat16 or float16 checkpoint scales by `sqrt(hidden)` rounded to that type
/// (hidden 3584: 59.866 in f32, 59.75 in bf16).
pub fn gemma_embed_scale(hidden: usize, dtype: Option<crate::quant::DType>) -> f32 {
    use crate::quant::DType;
    let s = (hidden as f32).sqrt();
    match dtype {
        Some(DType::BF16) => half::bf16::from_f32(s).to_f32(),
        Some(DType::F16) => half::f16::from_f32(s).to_f32(),
        _ => s,
    }
}

/// llama.cpp's attention scale for GGUF gemma2 / gemma3 (no key holds HF's
/// `query_pre_attn_scalar`): `1 / sqrt(n_embd / n_head)` (integer division) for the
/// 27B models, recognised by their layer count (gemma2: 46, gemma3: 62), else
/// `1 / sqrt(head_dim)` (llama-model.cpp, after gemma_pytorch's config).
pub fn gemma_gguf_attn_scale(arch: &str, n_layers: usize, hidden: usize, n_heads: usize, head_dim: usize) -> f32 {
    let big = n_layers == if arch == "gemma2" { 46 } else { 62 };
    let d = if big { hidden / n_heads } else { head_dim };
    1.0 / (d as f32).sqrt()
}

impl Config {
    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// The sliding window of layer `l`, `None` for a layer that sees the whole cache.
    pub fn window(&self, l: usize) -> Option<usize> {
        let s = self.sliding_window.as_ref()?;
        let slides = match &s.layers {
            SwaLayers::All => true,
            SwaLayers::Pattern(n) => *n == 0 || l % n < n - 1,
            SwaLayers::List(v) => v.get(l).copied().unwrap_or(false),
        };
        slides.then_some(s.window)
    }

    /// Whether layer `l` takes the local RoPE ([`Self::rope_inv_freq_local`]).
    pub fn local_rope(&self, l: usize) -> bool {
        self.window(l).is_some() && self.sliding_window.as_ref().is_some_and(|s| s.rope.is_some())
    }

    /// The RoPE inverse frequencies of the windowed layers when they have their own
    /// (gemma3), else `None` (every layer takes [`Self::rope_inv_freq`]).
    pub fn rope_inv_freq_local(&self) -> Option<Vec<f64>> {
        let r = self.sliding_window.as_ref()?.rope?;
        let hd = self.rope_dim;
        Some(
            (0..hd / 2)
                .map(|i| 1.0 / (r.theta as f64).powf(2.0 * i as f64 / hd as f64) / r.linear_factor as f64)
                .collect(),
        )
    }

    /// RoPE inverse frequencies (`rope_dim / 2` of them, in f64: `theta^(-2i / rope_dim)`),
    /// with the per-frequency divisors of `rope_freqs.weight` (Llama-3 scaling) and the
    /// linear scaling factor applied. Both backends take their angles from here.
    pub fn rope_inv_freq(&self, rope_freqs: Option<&[f32]>) -> Vec<f64> {
        let hd = self.rope_dim;
        (0..hd / 2)
            .map(|i| {
                let mut f = 1.0 / (self.rope_theta as f64).powf(2.0 * i as f64 / hd as f64);
                if let Some(rf) = rope_freqs {
                    f /= rf[i] as f64;
                }
                f / self.rope_linear_factor as f64
            })
            .collect()
    }

    /// Reads the hyperparameters of a GGUF file (shapes are checked against them
    /// when the weights are bound).
    pub fn from_gguf(g: &Gguf) -> Result<Config> {
        let file = g.path.display().to_string();
        let arch_name = g
            .get_str("general.architecture")?
            .ok_or_else(|| Error::bad_model(format!("{file}: metadata key general.architecture is missing")))?
            .to_string();
        let arch = ArchOptions::for_gguf(&arch_name).ok_or_else(|| {
            Error::unsupported(format!(
                "{file}: architecture '{arch_name}' is not supported (supported: llama, mistral, qwen2, qwen3, \
                 gemma2, gemma3, phi3, qwen2moe, qwen3moe; llama with experts: Mixtral)"
            ))
        })?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let req = |k: &str| -> Result<usize> {
            let full = key(k);
            match g.get_u64(&full)? {
                Some(v) if v > 0 && v <= u32::MAX as u64 => Ok(v as usize),
                Some(v) => Err(Error::bad_model(format!("{file}: metadata {full} = {v} is out of range"))),
                None => Err(Error::bad_model(format!("{file}: metadata key {full} is missing"))),
            }
        };
        let hidden = req("embedding_length")?;
        let n_layers = req("block_count")?;
        let n_heads = req("attention.head_count")?;
        let ffn = req("feed_forward_length")?;
        let context_length = req("context_length")?;
        let n_kv_heads = match g.get_u64(&key("attention.head_count_kv"))? {
            None => n_heads,
            Some(v) if v > 0 && v <= u32::MAX as u64 => v as usize,
            Some(v) => {
                return Err(Error::bad_model(format!(
                    "{file}: {} = {v} is out of range",
                    key("attention.head_count_kv")
                )))
            }
        };
        if n_heads % n_kv_heads != 0 {
            return Err(Error::bad_model(format!(
                "{file}: {n_heads} attention heads are not a multiple of {n_kv_heads} KV heads"
            )));
        }
        let head_dim = match g.get_u64(&key("attention.key_length"))? {
            Some(v) if v > 0 && v <= u32::MAX as u64 => v as usize,
            Some(v) => {
                return Err(Error::bad_model(format!("{file}: {} = {v} is out of range", key("attention.key_length"))))
            }
            None => {
                if hidden % n_heads != 0 {
                    return Err(Error::bad_model(format!(
                        "{file}: hidden size {hidden} is not a multiple of {n_heads} heads and {} is missing",
                        key("attention.key_length")
                    )));
                }
                hidden / n_heads
            }
        };
        if head_dim % 2 != 0 {
            return Err(Error::bad_model(format!("{file}: head dimension {head_dim} is odd; RoPE needs pairs")));
        }
        if let Some(v) = g.get_u64(&key("attention.value_length"))? {
            if v as usize != head_dim {
                return Err(Error::unsupported(format!(
                    "{file}: value head size {v} differs from key head size {head_dim}"
                )));
            }
        }
        let rope_dim = match g.get_u64(&key("rope.dimension_count"))? {
            None => head_dim,
            Some(rot) if rot > 0 && rot.is_multiple_of(2) && rot <= head_dim as u64 => rot as usize,
            Some(rot) => {
                return Err(Error::bad_model(format!(
                    "{file}: {} = {rot} is not an even number from 2 to the head size {head_dim}",
                    key("rope.dimension_count")
                )))
            }
        };
        let rms_eps = g.get_f32(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5);
        if !(rms_eps.is_finite() && rms_eps >= 0.0) {
            return Err(Error::bad_model(format!("{file}: RMSNorm epsilon {rms_eps} is invalid")));
        }
        let rope_theta = g.get_f32(&key("rope.freq_base"))?.unwrap_or(10000.0);
        if !(rope_theta.is_finite() && rope_theta > 0.0) {
            return Err(Error::bad_model(format!("{file}: rope.freq_base {rope_theta} is invalid")));
        }
        let mut rope_linear_factor = 1.0;
        match g.get_str(&key("rope.scaling.type"))? {
            None | Some("none") => {}
            Some("linear") => {
                let f = g.get_f32(&key("rope.scaling.factor"))?.unwrap_or(1.0);
                if !(f.is_finite() && f > 0.0) {
                    return Err(Error::bad_model(format!("{file}: rope.scaling.factor {f} is invalid")));
                }
                rope_linear_factor = f;
            }
            Some(other) => {
                return Err(Error::unsupported(format!("{file}: RoPE scaling type '{other}' is not supported")))
            }
        }
        // LongRoPE (phi3): factors as tensors (rope_factors_long/short.weight, checked when
        // bound), the attention factor and the original context as metadata.
        let rope_attn_factor = g.get_f32(&key("rope.scaling.attn_factor"))?.unwrap_or(1.0);
        if !(rope_attn_factor.is_finite() && rope_attn_factor > 0.0) {
            return Err(Error::bad_model(format!("{file}: rope.scaling.attn_factor {rope_attn_factor} is invalid")));
        }
        let rope_original_context = match g.get_u64(&key("rope.scaling.original_context_length"))? {
            None => None,
            Some(v) if v > 0 && v <= u32::MAX as u64 => Some(v as usize),
            Some(v) => {
                return Err(Error::bad_model(format!(
                    "{file}: {} = {v} is out of range",
                    key("rope.scaling.original_context_length")
                )))
            }
        };
        let tok = |k: &str| -> Result<Option<u32>> { g.get_u32(k) };
        let bos_token = tok("tokenizer.ggml.bos_token_id")?;
        let eos_token = tok("tokenizer.ggml.eos_token_id")?;
        // The vocabulary size comes from the embedding table (checked in weights).
        let vocab_size = match g.tensor("token_embd.weight") {
            Some(t) if t.ne.len() == 2 => t.ne[1] as usize,
            Some(t) => {
                return Err(Error::bad_model(format!(
                    "{file}: tensor token_embd.weight has {} dimensions, expected 2",
                    t.ne.len()
                )))
            }
            None => return Err(Error::bad_model(format!("{file}: tensor token_embd.weight is missing"))),
        };
        for (name, v) in [("bos", bos_token), ("eos", eos_token)] {
            if let Some(id) = v {
                if id as usize >= vocab_size {
                    return Err(Error::bad_model(format!(
                        "{file}: tokenizer.ggml.{name}_token_id {id} is outside the vocabulary of {vocab_size}"
                    )));
                }
            }
        }
        let gemma = arch.is_gemma();
        let softcap = |k: &str, default: f32| -> Result<f32> {
            let v = g.get_f32(&key(k))?.unwrap_or(default);
            if !(v.is_finite() && v >= 0.0) {
                return Err(Error::bad_model(format!("{file}: {} = {v} is invalid", key(k))));
            }
            Ok(v)
        };
        // llama.cpp's defaults: gemma2 always caps (50 / 30 when the keys are absent);
        // gemma3 has no attention cap and caps the logits only when the key is there.
        let (attn_softcap, final_softcap) = match arch_name.as_str() {
            "gemma2" => (softcap("attn_logit_softcapping", 50.0)?, softcap("final_logit_softcapping", 30.0)?),
            "gemma3" => (0.0, softcap("final_logit_softcapping", 0.0)?),
            _ => (0.0, 0.0),
        };
        let sliding_window = gguf_sliding_window(g, &arch_name, n_layers, rope_linear_factor, &file)?;
        let moe = gguf_moe(g, &arch_name, ffn, &file)?;
        Ok(Config {
            arch,
            vocab_size,
            hidden,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            rope_dim,
            ffn,
            context_length,
            rms_eps,
            rope_theta,
            rope_linear_factor,
            rope_original_context,
            rope_attn_factor,
            bos_token,
            eos_token,
            embed_scale: if gemma { gemma_embed_scale(hidden, None) } else { 1.0 },
            attn_scale: if gemma {
                gemma_gguf_attn_scale(&arch_name, n_layers, hidden, n_heads, head_dim)
            } else {
                1.0 / (head_dim as f32).sqrt()
            },
            attn_softcap,
            final_softcap,
            sliding_window,
            moe,
        })
    }
}

/// The experts of a GGUF file, read as llama.cpp reads them: `expert_count` and
/// `expert_used_count`; an expert's width `expert_feed_forward_length` (qwen2moe,
/// qwen3moe), else `feed_forward_length` (Mixtral, written as `llama`); qwen2moe's
/// shared expert `expert_shared_feed_forward_length`. The top-k probabilities are
/// renormalized for llama (Mixtral) and qwen3moe, not for qwen2moe (llama.cpp's
/// choices; `expert_weights_norm`, when present, decides instead).
fn gguf_moe(g: &Gguf, arch: &str, ffn: usize, file: &str) -> Result<Option<MoeConfig>> {
    let key = |k: &str| format!("{arch}.{k}");
    let count = |k: &str| -> Result<Option<usize>> {
        match g.get_u64(&key(k))? {
            None => Ok(None),
            Some(v) if v <= u32::MAX as u64 => Ok(Some(v as usize)),
            Some(v) => Err(Error::bad_model(format!("{file}: metadata {} = {v} is out of range", key(k)))),
        }
    };
    let moe_arch = matches!(arch, "qwen2moe" | "qwen3moe");
    let n_experts = match count("expert_count")? {
        None | Some(0) if moe_arch => {
            return Err(Error::bad_model(format!("{file}: metadata key {} is missing", key("expert_count"))))
        }
        None | Some(0) => return Ok(None),
        Some(n) => n,
    };
    if !matches!(arch, "llama" | "mistral" | "qwen2moe" | "qwen3moe") {
        return Err(Error::unsupported(format!(
            "{file}: {} = {n_experts}: experts are not supported for architecture {arch}",
            key("expert_count")
        )));
    }
    let n_used = count("expert_used_count")?
        .ok_or_else(|| Error::bad_model(format!("{file}: metadata key {} is missing", key("expert_used_count"))))?;
    let expert_ffn = count("expert_feed_forward_length")?.unwrap_or(ffn);
    let shared_ffn = match (arch, count("expert_shared_feed_forward_length")?) {
        ("qwen2moe", Some(n)) => Some(n),
        ("qwen2moe", None) => Some(ffn),
        _ => None,
    };
    let norm_topk = match g.get(&key("expert_weights_norm")) {
        None => arch != "qwen2moe",
        Some(crate::format::gguf::ValueRef::Bool(b)) => b,
        Some(other) => {
            return Err(Error::bad_model(format!(
                "{file}: {} holds {}, expected a BOOL",
                key("expert_weights_norm"),
                other.describe()
            )))
        }
    };
    let m = MoeConfig { n_experts, n_used, expert_ffn, norm_topk, shared_ffn };
    m.check(file, &format!("{} / {}", key("expert_count"), key("expert_used_count")))?;
    Ok(Some(m))
}

/// The sliding window of a GGUF file, read as llama.cpp reads it for gemma2 (window
/// `attention.sliding_window`, 4096 when absent; pattern 2; local RoPE base
/// `rope.freq_base_swa`, else the global one) and gemma3 (windowed only when
/// `attention.sliding_window` > 0; pattern 6; local base `rope.freq_base_swa`, else
/// 10000; no linear scaling on local layers); `attention.sliding_window_pattern`
/// (a period, or an array of per-layer flags) overrides the pattern. llama / mistral:
/// `attention.sliding_window`, when present and > 0, applies to every layer (llama.cpp
/// ignores it for these architectures; transformers applies Mistral's on every layer).
/// qwen2 / qwen3: not read (transformers' Qwen window depends on `use_sliding_window`).
fn gguf_sliding_window(
    g: &Gguf,
    arch: &str,
    n_layers: usize,
    rope_linear_factor: f32,
    file: &str,
) -> Result<Option<SlidingWindow>> {
    let key = |k: &str| format!("{arch}.{k}");
    let wkey = key("attention.sliding_window");
    let window = match (arch, g.get_u64(&wkey)?) {
        ("gemma2", None) => 4096,
        ("gemma2" | "gemma3" | "llama" | "mistral", Some(w)) => w,
        _ => return Ok(None),
    };
    if window == 0 {
        return Ok(None);
    }
    let window = usize::try_from(window)
        .ok()
        .filter(|&w| w <= u32::MAX as usize)
        .ok_or_else(|| Error::bad_model(format!("{file}: {wkey} = {window} is out of range")))?;
    if !matches!(arch, "gemma2" | "gemma3") {
        return Ok(Some(SlidingWindow { window, layers: SwaLayers::All, rope: None }));
    }
    let pkey = key("attention.sliding_window_pattern");
    let layers = match g.get(&pkey) {
        None => SwaLayers::Pattern(if arch == "gemma2" { 2 } else { 6 }),
        Some(crate::format::gguf::ValueRef::Array(a)) => {
            if a.len() != n_layers {
                return Err(Error::bad_model(format!("{file}: {pkey} has {} entries for {n_layers} layers", a.len())));
            }
            let mut flags = Vec::with_capacity(a.len().min(1 << 16));
            for v in a.iter() {
                match v {
                    crate::format::gguf::ValueRef::Bool(b) => flags.push(b),
                    other => {
                        return Err(Error::bad_model(format!(
                            "{file}: {pkey} holds {}, expected BOOL entries",
                            other.describe()
                        )))
                    }
                }
            }
            SwaLayers::List(flags)
        }
        Some(_) => g.get_u32(&pkey)?.map_or(SwaLayers::All, |n| SwaLayers::Pattern(n as usize)),
    };
    let base_swa = g.get_f32(&key("rope.freq_base_swa"))?;
    if let Some(t) = base_swa {
        if !(t.is_finite() && t > 0.0) {
            return Err(Error::bad_model(format!("{file}: {} = {t} is invalid", key("rope.freq_base_swa"))));
        }
    }
    let rope = match (arch, base_swa) {
        ("gemma3", t) => Some(LocalRope { theta: t.unwrap_or(10000.0), linear_factor: 1.0 }),
        // gemma2: the global scaling applies to the local layers too (llama.cpp).
        (_, Some(t)) => Some(LocalRope { theta: t, linear_factor: rope_linear_factor }),
        (_, None) => None,
    };
    Ok(Some(SlidingWindow { window, layers, rope }))
}

/// The RoPE cos/sin of position `pos` for each of `inv_freq` (`Config::rope_inv_freq`):
/// the angle `pos * f` in f64, its cos and sin times `mscale` (`Config::rope_attn_factor`,
/// 1 but for LongRoPE) rounded once to f32. Both backends take their tables from here, so
/// they rotate by the same numbers.
pub(crate) fn rope_angles(pos: usize, inv_freq: &[f64], mscale: f32, cos: &mut [f32], sin: &mut [f32]) {
    let m = mscale as f64;
    for ((f, c), s) in inv_freq.iter().zip(cos.iter_mut()).zip(sin.iter_mut()) {
        let a = pos as f64 * f;
        *c = (a.cos() * m) as f32;
        *s = (a.sin() * m) as f32;
    }
}
