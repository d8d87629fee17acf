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

/// The options that make one forward pass a given architecture.
#[derive(Clone, Debug, PartialEq)]
pub struct ArchOptions {
    /// The `general.architecture` name as reported to callers.
    pub name: String,
    pub rope_style: RopeStyle,
    /// Q, K and V projections carry biases (qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of Q and K before RoPE (qwen3).
    pub qk_norm: bool,
    /// The feed-forward gate and up projections are one matrix of `2 * ffn` rows, gate
    /// first (phi3: GGUF `ffn_up`, HF `gate_up_proj`). Bound as two row views of it.
    pub fused_gate_up: bool,
}

impl ArchOptions {
    /// The row for a GGUF `general.architecture` value.
    pub fn for_gguf(arch: &str) -> Option<ArchOptions> {
        let (rope_style, qkv_bias, qk_norm) = match arch {
            "llama" | "mistral" => (RopeStyle::Adjacent, false, false),
            "qwen2" => (RopeStyle::Neox, true, false),
            "qwen3" | "phi3" => (RopeStyle::Neox, false, arch == "qwen3"),
            _ => return None,
        };
        Some(ArchOptions { name: arch.to_string(), rope_style, qkv_bias, qk_norm, fused_gate_up: arch == "phi3" })
    }
}

impl ArchOptions {
    /// The row for a Hugging Face config.json `model_type`. HF weights are not
    /// permuted, so every one of them takes the half-split ("neox") RoPE.
    pub fn for_hf(model_type: &str) -> Option<ArchOptions> {
        let (qkv_bias, qk_norm) = match model_type {
            "llama" | "mistral" | "phi3" => (false, false),
            "qwen2" => (true, false),
            "qwen3" => (false, true),
            _ => return None,
        };
        Some(ArchOptions {
            name: model_type.to_string(),
            rope_style: RopeStyle::Neox,
            qkv_bias,
            qk_norm,
            fused_gate_up: model_type == "phi3",
        })
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

    /// RoPE inverse frequencies (`head_dim / 2` of them, in f64), with the
    /// per-frequency divisors of `rope_freqs.weight` (Llama-3 scaling) and the
    /// linear scaling factor applied. Both backends take their angles from here.
    pub fn rope_inv_freq(&self, rope_freqs: Option<&[f32]>) -> Vec<f64> {
        let hd = self.head_dim;
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
                "{file}: architecture '{arch_name}' is not supported (supported: llama, mistral, qwen2, qwen3, phi3)"
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
        if let Some(rot) = g.get_u64(&key("rope.dimension_count"))? {
            if rot as usize != head_dim {
                return Err(Error::unsupported(format!(
                    "{file}: partial rotary embeddings ({} = {rot}, head size {head_dim}) are not supported",
                    key("rope.dimension_count")
                )));
            }
        }
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
        Ok(Config {
            arch,
            vocab_size,
            hidden,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn,
            context_length,
            rms_eps,
            rope_theta,
            rope_linear_factor,
            rope_original_context,
            rope_attn_factor,
            bos_token,
            eos_token,
        })
    }
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
