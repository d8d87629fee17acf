//! Hugging Face model directories: `config.json` plus safetensors weights (one
//! `model.safetensors`, or shards listed by `model.safetensors.index.json`).
//!
//! Architectures (`model_type`): llama, mistral, qwen2, qwen3, phi3 (fused `qkv_proj` and
//! `gate_up_proj`, bound as row views of them). HF Llama/Mistral
//! weights are not permuted the way llama.cpp's converter permutes them, so every
//! HF model uses the half-split ("neox") RoPE pairing.
//!
//! config.json keys read (transformers' defaults where a key may be absent):
//! `hidden_size`, `num_hidden_layers`, `num_attention_heads`, `intermediate_size`,
//! `vocab_size` (required); `num_key_value_heads` (= heads), `head_dim`
//! (= hidden / heads; `null` too), `max_position_embeddings` (per model type),
//! `rms_norm_eps` (1e-6), `tie_word_embeddings` (false), `bos_token_id` /
//! `eos_token_id` (an integer or a list: the first entry is taken, since the C
//! API reports one id; `null` = none; every entry ends generation, `crate::chat::eog`); RoPE from transformers 5's
//! `rope_parameters` (`rope_theta`, `rope_type` and its parameters) or the Hub
//! style top-level `rope_theta` / `rope_scaling` (`rope_type` or the older
//! `type`); `rope_parameters` wins when both are present. RoPE types: `default`,
//! `linear` (`factor`), `llama3` (`factor`, `low_freq_factor`,
//! `high_freq_factor`, `original_max_position_embeddings`: turned into the
//! per-frequency divisors llama.cpp's converter stores as `rope_freqs.weight`),
//! `longrope` / `su` (`short_factor`, `long_factor`, `original_max_position_embeddings`
//! there or at the top level, optional `factor` and `attention_factor`, as transformers'
//! `_compute_longrope_parameters` reads them; the long factors are used when the model runs
//! with a context longer than the original, as llama.cpp chooses); any other type is LLMRT_UNSUPPORTED. `hidden_act` must be `silu`;
//! `attention_bias` / `mlp_bias` true and `partial_rotary_factor` != 1 are
//! unsupported (qwen2 always has Q/K/V biases, qwen3 has Q/K norms).
//!
//! Not applied: `sliding_window` (Mistral, Phi-3, Qwen `use_sliding_window`; llama.cpp
//! disables Phi-3's too). Attention
//! is full causal attention; that equals sliding-window attention as long as a
//! sequence is no longer than the window (4096 for Mistral 7B v0.1).

use std::path::Path;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::weights::{TensorRef, TensorSource, Weights};
use super::{ArchOptions, Config};
use crate::format::safetensors::{Checkpoint, SafeTensors};
use crate::format::WeightFile;
use crate::{Error, Result};

/// The config file of a model directory.
pub(crate) const CONFIG_FILE: &str = "config.json";

/// Largest head dimension accepted from a config.json (real models use <= 256).
const MAX_HEAD_DIM: usize = 1 << 16;

/// What config.json says.
#[derive(Clone, Debug, PartialEq)]
pub struct HfConfig {
    pub config: Config,
    /// Llama-3 RoPE scaling as per-frequency divisors (`rope_freqs.weight` in GGUF).
    pub rope_freqs: Option<Vec<f32>>,
    /// LongRoPE's (long, short) per-frequency divisors.
    pub rope_long_short: Option<(Vec<f32>, Vec<f32>)>,
    /// `tie_word_embeddings`: the LM head is the embedding table.
    pub tied: bool,
}

/// Reads `config.json` of `dir`.
pub fn load_config(dir: &Path) -> Result<HfConfig> {
    let path = dir.join(CONFIG_FILE);
    let raw = crate::format::read_small_file(&path)?
        .ok_or_else(|| Error::io(format!("{}: No such file or directory (os error 2)", path.display())))?;
    config_from_json(&raw, &path.display().to_string())
}

/// Parses config.json bytes; `file` names it in messages.
pub fn config_from_json(raw: &[u8], file: &str) -> Result<HfConfig> {
    let json: Value =
        serde_json::from_slice(raw).map_err(|e| Error::bad_model(format!("{file}: not valid JSON: {e}")))?;
    let c = json.as_object().ok_or_else(|| Error::bad_model(format!("{file}: not a JSON object")))?;
    let model_type = match c.get("model_type") {
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(Error::bad_model(format!("{file}: key model_type is not a string"))),
        None => return Err(Error::bad_model(format!("{file}: key model_type is missing"))),
    };
    let arch = ArchOptions::for_hf(model_type).ok_or_else(|| {
        Error::unsupported(format!(
            "{file}: model_type '{model_type}' is not supported (supported: llama, mistral, qwen2, qwen3, phi3)"
        ))
    })?;
    let k = Keys { c, file };
    let hidden = k.req_usize("hidden_size")?;
    let n_layers = k.req_usize("num_hidden_layers")?;
    let n_heads = k.req_usize("num_attention_heads")?;
    let ffn = k.req_usize("intermediate_size")?;
    let vocab_size = k.req_usize("vocab_size")?;
    let n_kv_heads = k.opt_usize("num_key_value_heads")?.unwrap_or(n_heads);
    if n_heads % n_kv_heads != 0 {
        return Err(Error::bad_model(format!(
            "{file}: num_attention_heads {n_heads} is not a multiple of num_key_value_heads {n_kv_heads}"
        )));
    }
    let head_dim = match k.opt_usize("head_dim")? {
        Some(d) => d,
        None if hidden % n_heads == 0 => hidden / n_heads,
        None => {
            return Err(Error::bad_model(format!(
            "{file}: hidden_size {hidden} is not a multiple of num_attention_heads {n_heads} and head_dim is missing"
        )))
        }
    };
    if head_dim % 2 != 0 {
        return Err(Error::bad_model(format!("{file}: head_dim {head_dim} is odd; RoPE needs pairs")));
    }
    // Checked here, before anything is sized by it (the llama3 RoPE divisors are
    // head_dim / 2 floats; the weights, which would bound it, are bound later).
    if head_dim > MAX_HEAD_DIM {
        return Err(Error::unsupported(format!(
            "{file}: head_dim {head_dim} is larger than the {MAX_HEAD_DIM} supported"
        )));
    }
    let default_ctx = match model_type {
        "llama" => 2048,
        "mistral" => 4096 * 32,
        "phi3" => 4096,
        _ => 32768,
    };
    let context_length = k.opt_usize("max_position_embeddings")?.unwrap_or(default_ctx);
    let rms_eps = k.opt_f64("rms_norm_eps")?.unwrap_or(1e-6);
    if !(rms_eps.is_finite() && rms_eps >= 0.0) {
        return Err(Error::bad_model(format!("{file}: rms_norm_eps {rms_eps} is invalid")));
    }
    if let Some(act) = c.get("hidden_act").and_then(|v| v.as_str()) {
        if act != "silu" {
            return Err(Error::unsupported(format!("{file}: hidden_act '{act}' is not supported (silu is)")));
        }
    }
    for key in ["attention_bias", "mlp_bias"] {
        if c.get(key).and_then(|v| v.as_bool()) == Some(true) && !(key == "attention_bias" && model_type == "qwen2") {
            return Err(Error::unsupported(format!(
                "{file}: {key} = true is not supported for model_type {model_type}"
            )));
        }
    }
    if let Some(p) = k.opt_f64("partial_rotary_factor")? {
        if p != 1.0 {
            return Err(Error::unsupported(format!("{file}: partial_rotary_factor {p} is not supported")));
        }
    }

    // RoPE: transformers-5 rope_parameters, else Hub-style rope_theta / rope_scaling.
    let params = match c.get("rope_parameters") {
        Some(Value::Object(m)) => Some(m),
        Some(Value::Null) | None => None,
        Some(_) => return Err(Error::bad_model(format!("{file}: key rope_parameters is not an object"))),
    };
    let scaling = match c.get("rope_scaling") {
        Some(Value::Object(m)) => Some(m),
        Some(Value::Null) | None => None,
        Some(_) => return Err(Error::bad_model(format!("{file}: key rope_scaling is not an object"))),
    };
    let (rope_key, rope) = match (params, scaling) {
        (Some(p), _) => ("rope_parameters", Some(p)),
        (None, Some(s)) => ("rope_scaling", Some(s)),
        (None, None) => ("rope_scaling", None),
    };
    let theta_from_params = match params {
        Some(p) => Keys { c: p, file }.opt_f64_named("rope_theta", "rope_parameters.rope_theta")?,
        None => None,
    };
    let rope_theta = match theta_from_params {
        Some(t) => t,
        None => k.opt_f64("rope_theta")?.unwrap_or(10000.0),
    };
    if !(rope_theta.is_finite() && rope_theta > 0.0) {
        return Err(Error::bad_model(format!("{file}: rope_theta {rope_theta} is invalid")));
    }
    let mut rope_linear_factor = 1.0f32;
    let mut rope_freqs = None;
    let mut rope_long_short = None;
    let mut rope_original_context = None;
    let mut rope_attn_factor = 1.0f32;
    if let Some(r) = rope {
        let rk = Keys { c: r, file };
        let ty = r.get("rope_type").or_else(|| r.get("type")).and_then(|v| v.as_str()).unwrap_or("default");
        let factor = |name: &str| -> Result<f64> {
            let full = format!("{rope_key}.{name}");
            let v = rk
                .opt_f64_named(name, &full)?
                .ok_or_else(|| Error::bad_model(format!("{file}: {full} is missing (needed by rope_type {ty})")))?;
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::bad_model(format!("{file}: {full} = {v} is invalid")));
            }
            Ok(v)
        };
        if let Some(p) = rk.opt_f64_named("partial_rotary_factor", &format!("{rope_key}.partial_rotary_factor"))? {
            if p != 1.0 {
                return Err(Error::unsupported(format!(
                    "{file}: {rope_key}.partial_rotary_factor {p} is not supported"
                )));
            }
        }
        match ty {
            "default" => {}
            "longrope" | "su" => {
                let factors = |name: &str| -> Result<Vec<f32>> {
                    let full = format!("{rope_key}.{name}");
                    let a = match r.get(name) {
                        Some(Value::Array(a)) => a,
                        Some(_) => return Err(Error::bad_model(format!("{file}: {full} is not a list"))),
                        None => {
                            return Err(Error::bad_model(format!(
                                "{file}: {full} is missing (needed by rope_type {ty})"
                            )))
                        }
                    };
                    if a.len() != head_dim / 2 {
                        return Err(Error::bad_model(format!(
                            "{file}: {full} has {} entries, expected head_dim / 2 = {}",
                            a.len(),
                            head_dim / 2
                        )));
                    }
                    a.iter()
                        .enumerate()
                        .map(|(i, v)| match v.as_f64() {
                            Some(x) if x.is_finite() && x > 0.0 => Ok(x as f32),
                            _ => Err(Error::bad_model(format!("{file}: {full}[{i}] = {v} is not a positive number"))),
                        })
                        .collect()
                };
                let long = factors("long_factor")?;
                let short = factors("short_factor")?;
                let orig = match rk.opt_usize("original_max_position_embeddings")? {
                    Some(o) => o,
                    None => k.opt_usize("original_max_position_embeddings")?.unwrap_or(context_length),
                };
                // transformers: the factor is max / original unless given; the attention
                // factor sqrt(1 + ln(factor) / ln(original)) unless given (1 for factor <= 1).
                let f = match rk.opt_f64_named("factor", &format!("{rope_key}.factor"))? {
                    Some(f) => f,
                    None => context_length as f64 / orig as f64,
                };
                let attn = match rk.opt_f64_named("attention_factor", &format!("{rope_key}.attention_factor"))? {
                    Some(a) => a,
                    None if f <= 1.0 => 1.0,
                    None => (1.0 + f.ln() / (orig as f64).ln()).sqrt(),
                };
                if !(attn.is_finite() && attn > 0.0) {
                    return Err(Error::bad_model(format!("{file}: the LongRoPE attention factor {attn} is invalid")));
                }
                rope_attn_factor = attn as f32;
                rope_original_context = Some(orig);
                rope_long_short = Some((long, short));
            }
            "linear" => rope_linear_factor = factor("factor")? as f32,
            "llama3" => {
                let f = factor("factor")?;
                let lo = factor("low_freq_factor")?;
                let hi = factor("high_freq_factor")?;
                let old = factor("original_max_position_embeddings")?;
                if hi <= lo {
                    return Err(Error::bad_model(format!(
                        "{file}: {rope_key}.high_freq_factor {hi} must exceed low_freq_factor {lo}"
                    )));
                }
                rope_freqs = Some(llama3_divisors(rope_theta, head_dim, f, lo, hi, old));
            }
            other => {
                return Err(Error::unsupported(format!(
                    "{file}: {rope_key}.rope_type '{other}' is not supported (default, linear, llama3 are)"
                )))
            }
        }
    }

    let bos_token = k.token("bos_token_id", vocab_size)?;
    let eos_token = k.token("eos_token_id", vocab_size)?;
    let cfg = Config {
        arch,
        vocab_size,
        hidden,
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim,
        ffn,
        context_length,
        rms_eps: rms_eps as f32,
        rope_theta: rope_theta as f32,
        rope_linear_factor,
        rope_original_context,
        rope_attn_factor,
        bos_token,
        eos_token,
    };
    let tied = match c.get("tie_word_embeddings") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(Error::bad_model(format!("{file}: key tie_word_embeddings = {v} is not a boolean"))),
    };
    Ok(HfConfig { config: cfg, rope_freqs, rope_long_short, tied })
}

/// Llama-3 RoPE scaling as per-frequency divisors of `theta^(-2i/d)`, computed
/// as llama.cpp's `convert_hf_to_gguf.py` computes `rope_freqs.weight` (and
/// equal to transformers' `_compute_llama3_parameters`).
pub fn llama3_divisors(theta: f64, head_dim: usize, factor: f64, low: f64, high: f64, old_ctx: f64) -> Vec<f32> {
    let low_wavelen = old_ctx / low;
    let high_wavelen = old_ctx / high;
    (0..head_dim / 2)
        .map(|i| {
            // The converter computes the base frequencies in float32.
            let freq = (1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32)) as f64;
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let d = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            d as f32
        })
        .collect()
}

struct Keys<'a> {
    c: &'a Map<String, Value>,
    file: &'a str,
}

impl Keys<'_> {
    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.c.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 && n <= u32::MAX as u64 => Ok(Some(n as usize)),
                _ => Err(Error::bad_model(format!("{}: key {key} = {v} is not a positive integer", self.file))),
            },
        }
    }
    fn req_usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| Error::bad_model(format!("{}: key {key} is missing", self.file)))
    }
    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        self.opt_f64_named(key, key)
    }
    fn opt_f64_named(&self, key: &str, shown: &str) -> Result<Option<f64>> {
        match self.c.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| Error::bad_model(format!("{}: key {shown} = {v} is not a number", self.file))),
        }
    }
    /// An int, a list of ints (the first is taken) or null.
    fn token(&self, key: &str, vocab: usize) -> Result<Option<u32>> {
        let v = match self.c.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Array(a)) => match a.first() {
                None => return Ok(None),
                Some(v) => v,
            },
            Some(v) => v,
        };
        match v.as_u64() {
            Some(id) if (id as usize) < vocab => Ok(Some(id as u32)),
            Some(id) => {
                Err(Error::bad_model(format!("{}: {key} {id} is outside the vocabulary of {vocab}", self.file)))
            }
            None => Err(Error::bad_model(format!("{}: key {key} = {v} is not a token id", self.file))),
        }
    }
}

/// HF tensor names for the binder's GGUF-style roles.
fn hf_name(role: &str) -> String {
    if let Some(rest) = role.strip_prefix("blk.") {
        let (l, what) = rest.split_once('.').unwrap_or((rest, ""));
        let hf = match what {
            "attn_norm.weight" => "input_layernorm.weight",
            "attn_q.weight" => "self_attn.q_proj.weight",
            "attn_qkv.weight" => "self_attn.qkv_proj.weight",
            "ffn_gate_up.weight" => "mlp.gate_up_proj.weight",
            "attn_k.weight" => "self_attn.k_proj.weight",
            "attn_v.weight" => "self_attn.v_proj.weight",
            "attn_output.weight" => "self_attn.o_proj.weight",
            "attn_q.bias" => "self_attn.q_proj.bias",
            "attn_k.bias" => "self_attn.k_proj.bias",
            "attn_v.bias" => "self_attn.v_proj.bias",
            "attn_q_norm.weight" => "self_attn.q_norm.weight",
            "attn_k_norm.weight" => "self_attn.k_norm.weight",
            "ffn_norm.weight" => "post_attention_layernorm.weight",
            "ffn_gate.weight" => "mlp.gate_proj.weight",
            "ffn_up.weight" => "mlp.up_proj.weight",
            "ffn_down.weight" => "mlp.down_proj.weight",
            other => other,
        };
        return format!("model.layers.{l}.{hf}");
    }
    match role {
        "token_embd.weight" => "model.embed_tokens.weight".into(),
        "output_norm.weight" => "model.norm.weight".into(),
        "output.weight" => "lm_head.weight".into(),
        other => other.into(),
    }
}

struct HfSource<'a> {
    ck: &'a Checkpoint,
    dir: String,
    config: String,
    tied: bool,
}

impl TensorSource for HfSource<'_> {
    fn get(&self, role: &str) -> Result<Option<TensorRef<'_>>> {
        // Tied models use the embeddings as the LM head (as transformers does, even
        // when a checkpoint also stores lm_head.weight); no rope_freqs tensor in HF.
        if (self.tied && role == "output.weight") || role.starts_with("rope_f") {
            return Ok(None);
        }
        let name = hf_name(role);
        let Some((fi, t)) = self.ck.tensor(&name) else { return Ok(None) };
        let f: &SafeTensors = &self.ck.files[fi];
        Ok(Some(TensorRef {
            name,
            dtype: t.dtype,
            ne: t.shape.iter().rev().copied().collect(),
            file: fi,
            offset: t.offset as usize,
            data: f.tensor_data(t),
        }))
    }
    fn stored_name(&self, role: &str) -> String {
        hf_name(role)
    }
    fn location(&self, role: &str) -> String {
        match self.ck.tensor(&hf_name(role)) {
            Some((fi, _)) => self.ck.files[fi].path.display().to_string(),
            None => self.dir.clone(),
        }
    }
    fn show_shape(&self, ne: &[u64]) -> String {
        let v: Vec<u64> = ne.iter().rev().copied().collect();
        format!("{v:?}")
    }
    fn config_name(&self) -> &str {
        &self.config
    }
    fn output_required(&self) -> bool {
        !self.tied
    }
}

/// Loads a Hugging Face model directory: its config and its bound weights.
pub fn load(dir: &Path, progress: &mut dyn FnMut(f32)) -> Result<(Config, Weights)> {
    let HfConfig { config: cfg, rope_freqs, rope_long_short, tied } = load_config(dir)?;
    progress(0.05);
    let ck = Checkpoint::open_dir(dir)?;
    progress(0.1);
    let src = HfSource {
        ck: &ck,
        dir: dir.display().to_string(),
        config: format!("from {}", dir.join(CONFIG_FILE).display()),
        tied,
    };
    let parts = Weights::bind_parts(&src, &cfg, rope_freqs, rope_long_short, &mut |f| progress(0.1 + 0.9 * f))?;
    let files: Vec<Arc<dyn WeightFile>> = ck.files.iter().map(|f| f.clone() as Arc<dyn WeightFile>).collect();
    Ok((cfg, parts.with_files(files)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#""hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 100, "num_key_value_heads": 2"#;

    fn cfg(extra: &str) -> Result<(Config, Option<Vec<f32>>)> {
        config_from_json(format!("{{ {BASE}, {extra} }}").as_bytes(), "config.json").map(|h| (h.config, h.rope_freqs))
    }

    #[test]
    fn rope_styles_of_both_spellings_agree() {
        let a = cfg(r#""model_type": "llama", "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}"#)
        .unwrap();
        let b = cfg(r#""model_type": "llama", "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3",
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}"#)
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.0.rope_theta, 500000.0);
        assert!(a.1.as_ref().unwrap().iter().any(|&d| d != 1.0));
        let l = cfg(r#""model_type": "mistral", "rope_scaling": {"type": "linear", "factor": 2.0}"#).unwrap();
        assert_eq!(l.0.rope_linear_factor, 2.0);
        assert_eq!(l.0.rope_theta, 10000.0);
    }

    #[test]
    fn tokens_head_dim_and_errors() {
        let (c, _) =
            cfg(r#""model_type": "qwen3", "head_dim": 32, "bos_token_id": null, "eos_token_id": [7, 9]"#).unwrap();
        assert_eq!((c.head_dim, c.bos_token, c.eos_token), (32, None, Some(7)));
        assert!(c.arch.qk_norm && !c.arch.qkv_bias);
        let (c, _) = cfg(r#""model_type": "qwen2", "head_dim": null"#).unwrap();
        assert_eq!(c.head_dim, 16);
        assert!(c.arch.qkv_bias);
        let e = cfg(r#""model_type": "gpt2""#).unwrap_err();
        assert_eq!(e.status, crate::Status::LLMRT_UNSUPPORTED);
        assert!(e.message.contains("gpt2"));
        let e = cfg(r#""model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}"#).unwrap_err();
        assert_eq!(e.status, crate::Status::LLMRT_UNSUPPORTED);
        assert!(e.message.contains("yarn"));
        // Found by the hf_config fuzz target (tests/fuzz_regressions/hf_config/): the
        // llama3 RoPE divisors are head_dim / 2 floats, 8 GiB here; an unbounded
        // hidden_size / num_attention_heads did the same.
        let e = cfg(r#""model_type": "llama", "head_dim": 4294967294, "rope_scaling": {"rope_type": "llama3",
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}"#)
        .unwrap_err();
        assert_eq!(e.status, crate::Status::LLMRT_UNSUPPORTED);
        assert!(e.message.contains("head_dim 4294967294"), "{}", e.message);
        let e = config_from_json(
            br#"{"model_type": "qwen2", "hidden_size": 999999996, "num_hidden_layers": 1, "num_attention_heads": 1,
                "intermediate_size": 8, "vocab_size": 8}"#,
            "config.json",
        )
        .unwrap_err();
        assert_eq!(e.status, crate::Status::LLMRT_UNSUPPORTED);
        let e = config_from_json(br#"{"model_type": "llama"}"#, "config.json").unwrap_err();
        assert!(e.message.contains("hidden_size") && e.message.contains("missing"), "{}", e.message);
    }
}
