//! Hugging Face model directories: `config.json` plus safetensors weights (one
//! `model.safetensors`, or shards listed by `model.safetensors.index.json`).
//!
//! Architectures (`model_type`): llama, mistral, qwen2, qwen3, gemma2, gemma3_text, phi3
//! (fused `qkv_proj` and `gate_up_proj`, bound as row views of them).
//! HF weights are not permuted the way llama.cpp's converter permutes Llama/Mistral's,
//! so every HF model uses the half-split ("neox") RoPE pairing.
//!
//! config.json keys read (transformers' defaults where a key may be absent):
//! `hidden_size`, `num_hidden_layers`, `num_attention_heads`, `intermediate_size`,
//! `vocab_size` (required); `num_key_value_heads` (= heads), `head_dim`
//! (= hidden / heads; `null` too), `max_position_embeddings` (per model type),
//! `rms_norm_eps` (1e-6), `tie_word_embeddings` (false; gemma: true), `bos_token_id` /
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
//! with a context longer than the original, as llama.cpp chooses); any other type is LLMRT_UNSUPPORTED. `hidden_act` must be `silu` (gemma:
//! `hidden_activation` must be `gelu_pytorch_tanh`);
//! `attention_bias` / `mlp_bias` true are unsupported (qwen2 always has Q/K/V biases,
//! qwen3 and gemma3 have Q/K norms); `partial_rotary_factor` below 1 rotates the leading
//! dimensions of each head (see Phi-3 below).
//!
//! Gemma (gemma2, gemma3_text): RMSNorm weights are stored as `w - 1` (1 is added
//! at binding); four norms per layer (`input_layernorm`, `post_attention_layernorm`
//! of the attention output, `pre_feedforward_layernorm`, `post_feedforward_layernorm`);
//! embeddings times `sqrt(hidden_size)` rounded to the embeddings' dtype;
//! `query_pre_attn_scalar` (256) sets the attention scale to its `-1/2` power;
//! `attn_logit_softcapping` (gemma2: 50) and `final_logit_softcapping` (gemma2: 30;
//! `null`: none); `use_bidirectional_attention` true is unsupported. gemma3_text's
//! `rope_parameters` are per layer type (`full_attention`, `sliding_attention`), or
//! Hub style `rope_theta` (1e6) / `rope_scaling` (global layers) and
//! `rope_local_base_freq` (10000, local layers).
//!
//! Sliding windows (see `model::SlidingWindow`): Mistral's `sliding_window` on every
//! layer; gemma's `sliding_window` (4096) on the layers `layer_types` marks
//! `sliding_attention`, else gemma2's even layers and gemma3's
//! `sliding_window_pattern` (6: five local layers, then a global one); Qwen's (qwen2,
//! qwen3 and their MoE) only with `use_sliding_window`, on the layers transformers picks
//! (`layer_types`, else by `max_window_layers`: see `qwen_sliding_window`).
//! Phi-3's `sliding_window` (Phi-3-mini-4k: 2047) on every layer, as transformers applies
//! it (GGUF `phi3` files: not applied, as llama.cpp, which ignores the key there).
//! Partial rotary (`partial_rotary_factor`, Phi-4-mini: 0.75, in `rope_parameters` or at
//! the top level): the first `int(head_dim * factor)` dimensions of each head turn.
//!
//! Mixture of experts (see `model::MoeConfig`): `mixtral` (`num_local_experts` (8),
//! `num_experts_per_tok` (2), experts `intermediate_size` wide, top-k renormalized,
//! `sliding_window` as Mistral's; tensors `block_sparse_moe.gate` and
//! `block_sparse_moe.experts.E.w1 / w3 / w2` = gate / up / down); `qwen2_moe` and
//! `qwen3_moe` (`num_experts`, `num_experts_per_tok`, `moe_intermediate_size`,
//! `norm_topk_prob` (false), qwen2_moe's `shared_expert_intermediate_size`; tensors
//! `mlp.gate`, `mlp.experts.E.gate_proj / up_proj / down_proj`, `mlp.shared_expert.*`,
//! `mlp.shared_expert_gate`). Dense layers among expert ones (`decoder_sparse_step` != 1,
//! `mlp_only_layers`) are LLMRT_UNSUPPORTED.

use std::path::Path;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::weights::{TensorRef, TensorSource, Weights};
use super::{ArchOptions, Config, MoeConfig};
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
            "{file}: model_type '{model_type}' is not supported (supported: llama, mistral, qwen2, qwen3, \
             gemma2, gemma3_text, phi3, mixtral, qwen2_moe, qwen3_moe)"
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
    let gemma = arch.is_gemma();
    let default_ctx = match model_type {
        "llama" => 2048,
        "mistral" | "mixtral" => 4096 * 32,
        "phi3" => 4096,
        "gemma2" => 8192,
        "gemma3_text" => 131072,
        _ => 32768,
    };
    let context_length = k.opt_usize("max_position_embeddings")?.unwrap_or(default_ctx);
    let rms_eps = k.opt_f64("rms_norm_eps")?.unwrap_or(1e-6);
    if !(rms_eps.is_finite() && rms_eps >= 0.0) {
        return Err(Error::bad_model(format!("{file}: rms_norm_eps {rms_eps} is invalid")));
    }
    // Gemma's MLP reads `hidden_activation` (transformers' Gemma2/3 configs), the
    // others `hidden_act`.
    let (act_key, want_act) = if gemma { ("hidden_activation", "gelu_pytorch_tanh") } else { ("hidden_act", "silu") };
    if let Some(act) = c.get(act_key).and_then(|v| v.as_str()) {
        if act != want_act {
            return Err(Error::unsupported(format!(
                "{file}: {act_key} '{act}' is not supported for model_type {model_type} ({want_act} is)"
            )));
        }
    }
    if c.get("use_bidirectional_attention").and_then(|v| v.as_bool()) == Some(true) {
        return Err(Error::unsupported(format!("{file}: use_bidirectional_attention = true is not supported")));
    }
    for key in ["attention_bias", "mlp_bias"] {
        if c.get(key).and_then(|v| v.as_bool()) == Some(true)
            && !(key == "attention_bias" && matches!(model_type, "qwen2" | "qwen2_moe"))
        {
            return Err(Error::unsupported(format!(
                "{file}: {key} = true is not supported for model_type {model_type}"
            )));
        }
    }

    // RoPE: transformers-5 rope_parameters, else Hub-style rope_theta / rope_scaling.
    // gemma3_text's rope_parameters are per layer type: `full_attention` is the global
    // RoPE (read as any other model's), `sliding_attention` the local layers' one.
    let mut params = object(c.get("rope_parameters"), "rope_parameters", file)?;
    let mut params_name = "rope_parameters";
    let mut local_params = None;
    if let Some(p) = params.filter(|p| p.contains_key("full_attention") || p.contains_key("sliding_attention")) {
        local_params = object(p.get("sliding_attention"), "rope_parameters.sliding_attention", file)?;
        params = object(p.get("full_attention"), "rope_parameters.full_attention", file)?;
        params_name = "rope_parameters.full_attention";
    }
    let scaling = match c.get("rope_scaling") {
        Some(Value::Object(m)) => Some(m),
        Some(Value::Null) | None => None,
        Some(_) => return Err(Error::bad_model(format!("{file}: key rope_scaling is not an object"))),
    };
    let (rope_key, rope) = match (params, scaling) {
        (Some(p), _) => (params_name, Some(p)),
        (None, Some(s)) => ("rope_scaling", Some(s)),
        (None, None) => ("rope_scaling", None),
    };
    let theta_from_params = match params {
        Some(p) => Keys { c: p, file }.opt_f64_named("rope_theta", &format!("{params_name}.rope_theta"))?,
        None => None,
    };
    let default_theta = if model_type == "gemma3_text" { 1_000_000.0 } else { 10000.0 };
    let rope_theta = match theta_from_params {
        Some(t) => t,
        None => k.opt_f64("rope_theta")?.unwrap_or(default_theta),
    };
    if !(rope_theta.is_finite() && rope_theta > 0.0) {
        return Err(Error::bad_model(format!("{file}: rope_theta {rope_theta} is invalid")));
    }
    // Partial rotary (Phi-4-mini: 0.75): transformers rotates the first
    // `int(head_dim * partial_rotary_factor)` dimensions of each head, read from the RoPE
    // parameters (transformers 5) or the top level.
    let partial = match rope.map(|r| Keys { c: r, file }) {
        Some(rk) => rk.opt_f64_named("partial_rotary_factor", &format!("{rope_key}.partial_rotary_factor"))?,
        None => None,
    };
    let partial = match partial {
        Some(p) => Some(p),
        None => k.opt_f64("partial_rotary_factor")?,
    };
    let rope_dim = match partial {
        None => head_dim,
        Some(p) if p.is_finite() && p > 0.0 && p <= 1.0 => {
            let d = (head_dim as f64 * p) as usize;
            if d == 0 || !d.is_multiple_of(2) {
                return Err(Error::unsupported(format!(
                    "{file}: partial_rotary_factor {p} rotates {d} of head_dim {head_dim} dimensions (an even, \
                     non-zero count is supported)"
                )));
            }
            d
        }
        Some(p) => return Err(Error::bad_model(format!("{file}: partial_rotary_factor {p} is not in (0, 1]"))),
    };
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
                    if a.len() != rope_dim / 2 {
                        return Err(Error::bad_model(format!(
                            "{file}: {full} has {} entries, expected {} (half the {rope_dim} rotated dimensions)",
                            a.len(),
                            rope_dim / 2
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
                rope_freqs = Some(llama3_divisors(rope_theta, rope_dim, f, lo, hi, old));
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
    let local_rope = if model_type == "gemma3_text" { Some(local_rope(&k, local_params)?) } else { None };
    let sliding_window = sliding_window(&k, model_type, n_layers, local_rope)?;
    let moe = hf_moe(&k, model_type, ffn)?;
    // Gemma's scale and caps (transformers' defaults when a key is absent; null: none).
    let (attn_scale, attn_softcap, final_softcap) = if gemma {
        let q = k.opt_f64("query_pre_attn_scalar")?.unwrap_or(256.0);
        if !(q.is_finite() && q > 0.0) {
            return Err(Error::bad_model(format!("{file}: query_pre_attn_scalar {q} is invalid")));
        }
        let (a, f) = if model_type == "gemma2" { (50.0, 30.0) } else { (0.0, 0.0) };
        (q.powf(-0.5) as f32, k.softcap("attn_logit_softcapping", a)?, k.softcap("final_logit_softcapping", f)?)
    } else {
        (1.0 / (head_dim as f32).sqrt(), 0.0, 0.0)
    };
    let cfg = Config {
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
        rms_eps: rms_eps as f32,
        rope_theta: rope_theta as f32,
        rope_linear_factor,
        rope_original_context,
        rope_attn_factor,
        bos_token,
        eos_token,
        // Rounded to the checkpoint's type when the weights are bound (`load`).
        embed_scale: if gemma { super::gemma_embed_scale(hidden, None) } else { 1.0 },
        attn_scale,
        attn_softcap,
        final_softcap,
        sliding_window,
        moe,
    };
    let tied = match c.get("tie_word_embeddings") {
        // transformers' Gemma configs default to tied embeddings.
        None | Some(Value::Null) => gemma,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(Error::bad_model(format!("{file}: key tie_word_embeddings = {v} is not a boolean"))),
    };
    Ok(HfConfig { config: cfg, rope_freqs, rope_long_short, tied })
}

/// The experts of config.json (see the module's notes), `None` for a dense model.
fn hf_moe(k: &Keys<'_>, model_type: &str, ffn: usize) -> Result<Option<MoeConfig>> {
    let file = k.file;
    let m = match model_type {
        "mixtral" => MoeConfig {
            n_experts: k.opt_usize("num_local_experts")?.unwrap_or(8),
            n_used: k.opt_usize("num_experts_per_tok")?.unwrap_or(2),
            expert_ffn: ffn,
            norm_topk: true,
            shared_ffn: None,
        },
        "qwen2_moe" | "qwen3_moe" => {
            let step = k.opt_usize("decoder_sparse_step")?.unwrap_or(1);
            let dense_layers = match k.c.get("mlp_only_layers") {
                None | Some(Value::Null) => 0,
                Some(Value::Array(a)) => a.len(),
                Some(v) => return Err(Error::bad_model(format!("{file}: key mlp_only_layers = {v} is not a list"))),
            };
            if step != 1 || dense_layers > 0 {
                return Err(Error::unsupported(format!(
                    "{file}: dense layers among the expert layers (decoder_sparse_step {step}, {dense_layers} \
                     mlp_only_layers) are not supported"
                )));
            }
            let norm_topk = match k.c.get("norm_topk_prob") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(v) => return Err(Error::bad_model(format!("{file}: key norm_topk_prob = {v} is not a boolean"))),
            };
            let shared_ffn =
                if model_type == "qwen2_moe" { Some(k.req_usize("shared_expert_intermediate_size")?) } else { None };
            MoeConfig {
                n_experts: k.req_usize("num_experts")?,
                n_used: k.req_usize("num_experts_per_tok")?,
                expert_ffn: k.req_usize("moe_intermediate_size")?,
                norm_topk,
                shared_ffn,
            }
        }
        _ => return Ok(None),
    };
    m.check(file, "num_experts / num_experts_per_tok")?;
    Ok(Some(m))
}

/// A JSON object or null / absent (`None`); anything else is an error naming `name`.
fn object<'a>(v: Option<&'a Value>, name: &str, file: &str) -> Result<Option<&'a Map<String, Value>>> {
    match v {
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(Value::Null) | None => Ok(None),
        Some(_) => Err(Error::bad_model(format!("{file}: key {name} is not an object"))),
    }
}

/// gemma3_text's local RoPE: `rope_parameters.sliding_attention` (transformers 5),
/// else the Hub-style `rope_local_base_freq`; base 10000 when neither says
/// (transformers' default), type `default` or `linear`.
fn local_rope(k: &Keys<'_>, local: Option<&Map<String, Value>>) -> Result<super::LocalRope> {
    let file = k.file;
    let (theta, ty, factor) = match local {
        Some(m) => {
            let lk = Keys { c: m, file };
            let theta = lk.opt_f64_named("rope_theta", "rope_parameters.sliding_attention.rope_theta")?;
            let ty = m.get("rope_type").and_then(|v| v.as_str()).unwrap_or("default").to_string();
            (theta, ty, lk.opt_f64_named("factor", "rope_parameters.sliding_attention.factor")?)
        }
        None => (k.opt_f64("rope_local_base_freq")?, "default".to_string(), None),
    };
    let theta = theta.unwrap_or(10000.0);
    if !(theta.is_finite() && theta > 0.0) {
        return Err(Error::bad_model(format!("{file}: local rope_theta {theta} is invalid")));
    }
    let linear_factor = match (ty.as_str(), factor) {
        ("default", _) => 1.0,
        ("linear", Some(f)) if f.is_finite() && f > 0.0 => f,
        ("linear", _) => {
            return Err(Error::bad_model(format!(
                "{file}: rope_parameters.sliding_attention.factor is missing or invalid (rope_type linear)"
            )))
        }
        (other, _) => {
            return Err(Error::unsupported(format!(
                "{file}: rope_parameters.sliding_attention.rope_type '{other}' is not supported (default, linear are)"
            )))
        }
    };
    Ok(super::LocalRope { theta: theta as f32, linear_factor: linear_factor as f32 })
}

/// The sliding window of config.json: Mistral's (and Mixtral's, Phi-3's) `sliding_window` on every layer
/// (null or absent: none); gemma2 / gemma3_text: `sliding_window` (4096 when absent)
/// on the layers `layer_types` marks `sliding_attention`, or when there is no
/// `layer_types` gemma2's even layers / gemma3's pattern (`sliding_window_pattern`,
/// 6: every sixth layer is global), as transformers fills `layer_types`; Qwen's:
/// [`qwen_sliding_window`]. Others (llama): none.
fn sliding_window(
    k: &Keys<'_>,
    model_type: &str,
    n_layers: usize,
    rope: Option<super::LocalRope>,
) -> Result<Option<super::SlidingWindow>> {
    use super::{SlidingWindow, SwaLayers};
    let file = k.file;
    let gemma = matches!(model_type, "gemma2" | "gemma3_text");
    if matches!(model_type, "qwen2" | "qwen3" | "qwen2_moe" | "qwen3_moe") {
        return qwen_sliding_window(k, model_type, n_layers);
    }
    if !(gemma || matches!(model_type, "mistral" | "mixtral" | "phi3")) {
        return Ok(None);
    }
    let window = match (k.c.get("sliding_window"), gemma) {
        (None, true) => 4096,
        (None | Some(Value::Null), _) => return Ok(None),
        (Some(_), _) => k.req_usize("sliding_window")?,
    };
    if !gemma {
        return Ok(Some(SlidingWindow { window, layers: SwaLayers::All, rope: None }));
    }
    let layers = match k.c.get("layer_types") {
        Some(Value::Array(a)) => layer_types(a, n_layers, file)?,
        None | Some(Value::Null) if model_type == "gemma2" => SwaLayers::Pattern(2),
        None | Some(Value::Null) => SwaLayers::Pattern(k.opt_usize("sliding_window_pattern")?.unwrap_or(6)),
        Some(v) => return Err(Error::bad_model(format!("{file}: key layer_types = {v} is not a list"))),
    };
    Ok(Some(SlidingWindow { window, layers, rope }))
}

/// `layer_types` (one of `sliding_attention`, `full_attention` per layer) as flags.
fn layer_types(a: &[Value], n_layers: usize, file: &str) -> Result<super::SwaLayers> {
    if a.len() != n_layers {
        return Err(Error::bad_model(format!("{file}: layer_types has {} entries for {n_layers} layers", a.len())));
    }
    let mut flags = Vec::with_capacity(a.len());
    for (i, t) in a.iter().enumerate() {
        flags.push(match t.as_str() {
            Some("sliding_attention") => true,
            Some("full_attention") => false,
            _ => {
                return Err(Error::unsupported(format!(
                    "{file}: layer_types[{i}] = {t} is not supported (sliding_attention, full_attention are)"
                )))
            }
        });
    }
    Ok(super::SwaLayers::List(flags))
}

/// Qwen's windows as transformers 5.24 configures them: none unless `use_sliding_window`;
/// then `sliding_window` (4096 when absent, null: none) on the layers `layer_types` marks
/// `sliding_attention`, else on qwen2 / qwen3 the layers `i >= max_window_layers` (28 when
/// absent), on qwen2_moe the even layers `i < max_window_layers`; qwen3_moe windows every
/// layer (its attention reads `sliding_window` alone).
fn qwen_sliding_window(k: &Keys<'_>, model_type: &str, n_layers: usize) -> Result<Option<super::SlidingWindow>> {
    use super::{SlidingWindow, SwaLayers};
    let file = k.file;
    match k.c.get("use_sliding_window") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => return Ok(None),
        Some(Value::Bool(true)) => {}
        Some(v) => return Err(Error::bad_model(format!("{file}: key use_sliding_window = {v} is not a boolean"))),
    }
    let window = match k.c.get("sliding_window") {
        None => 4096,
        Some(Value::Null) => return Ok(None),
        Some(_) => k.req_usize("sliding_window")?,
    };
    let max_window_layers = match k.c.get("max_window_layers") {
        None | Some(Value::Null) => 28,
        Some(v) => v.as_u64().map(|n| n.min(u32::MAX as u64) as usize).ok_or_else(|| {
            Error::bad_model(format!("{file}: key max_window_layers = {v} is not a non-negative integer"))
        })?,
    };
    let layers = match (model_type, k.c.get("layer_types")) {
        ("qwen3_moe", _) => SwaLayers::All,
        (_, Some(Value::Array(a))) => layer_types(a, n_layers, file)?,
        (_, Some(v)) if !v.is_null() => {
            return Err(Error::bad_model(format!("{file}: key layer_types = {v} is not a list")))
        }
        ("qwen2_moe", _) => SwaLayers::List((0..n_layers).map(|i| i % 2 == 0 && i < max_window_layers).collect()),
        _ => SwaLayers::List((0..n_layers).map(|i| i >= max_window_layers).collect()),
    };
    Ok(Some(SlidingWindow { window, layers, rope: None }))
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
    /// A soft cap: a number > 0, or null (none: 0); `default` when absent.
    fn softcap(&self, key: &str, default: f32) -> Result<f32> {
        match self.c.get(key) {
            None => Ok(default),
            Some(Value::Null) => Ok(0.0),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x > 0.0 => Ok(x as f32),
                _ => Err(Error::bad_model(format!("{}: key {key} = {v} is not a positive number", self.file))),
            },
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

/// HF tensor names for the binder's GGUF-style roles (`gemma`: Gemma's four norms
/// per layer, whose `post_attention_layernorm` is the attention output's norm).
fn hf_name(role: &str, gemma: bool, mixtral: bool) -> String {
    if let Some(rest) = role.strip_prefix("blk.") {
        let (l, what) = rest.split_once('.').unwrap_or((rest, ""));
        // Experts: `ffn_gate.E.weight` (the binder's per-expert roles).
        if let Some((kind, e)) = what.strip_suffix(".weight").and_then(|w| w.split_once('.')) {
            let hf = match (kind, mixtral) {
                ("ffn_gate", true) => "w1",
                ("ffn_up", true) => "w3",
                ("ffn_down", true) => "w2",
                ("ffn_gate", false) => "gate_proj",
                ("ffn_up", false) => "up_proj",
                ("ffn_down", false) => "down_proj",
                _ => return format!("model.layers.{l}.{what}"),
            };
            let block = if mixtral { "block_sparse_moe" } else { "mlp" };
            return format!("model.layers.{l}.{block}.experts.{e}.{hf}.weight");
        }
        let hf = match what {
            "ffn_gate_inp.weight" if mixtral => "block_sparse_moe.gate.weight",
            "ffn_gate_inp.weight" => "mlp.gate.weight",
            "ffn_gate_shexp.weight" => "mlp.shared_expert.gate_proj.weight",
            "ffn_up_shexp.weight" => "mlp.shared_expert.up_proj.weight",
            "ffn_down_shexp.weight" => "mlp.shared_expert.down_proj.weight",
            "ffn_gate_inp_shexp.weight" => "mlp.shared_expert_gate.weight",
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
            "ffn_norm.weight" if gemma => "pre_feedforward_layernorm.weight",
            "ffn_norm.weight" => "post_attention_layernorm.weight",
            "post_attention_norm.weight" if gemma => "post_attention_layernorm.weight",
            "post_ffw_norm.weight" if gemma => "post_feedforward_layernorm.weight",
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
    gemma: bool,
    mixtral: bool,
}

impl TensorSource for HfSource<'_> {
    fn get(&self, role: &str) -> Result<Option<TensorRef<'_>>> {
        // Tied models use the embeddings as the LM head (as transformers does, even
        // when a checkpoint also stores lm_head.weight); no rope_freqs tensor in HF.
        if (self.tied && role == "output.weight") || role.starts_with("rope_f") {
            return Ok(None);
        }
        let name = hf_name(role, self.gemma, self.mixtral);
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
        hf_name(role, self.gemma, self.mixtral)
    }
    fn location(&self, role: &str) -> String {
        match self.ck.tensor(&hf_name(role, self.gemma, self.mixtral)) {
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
        gemma: cfg.arch.is_gemma(),
        mixtral: cfg.arch.name == "mixtral",
    };
    let mut cfg = cfg;
    if cfg.arch.is_gemma() {
        // transformers multiplies by the normalizer cast to the embeddings' dtype.
        let dtype = src.get("token_embd.weight")?.map(|t| t.dtype);
        cfg.embed_scale = super::gemma_embed_scale(cfg.hidden, dtype);
    }
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

    /// Gemma's defaults as transformers fills them, and each option read.
    #[test]
    fn gemma_options_and_defaults() {
        let (c, _) = cfg(r#""model_type": "gemma2", "head_dim": 32"#).unwrap();
        assert_eq!(c.arch.ffn_act, super::super::FfnAct::GeluTanh);
        assert!(c.arch.post_norms && c.arch.norm_plus_one && !c.arch.qk_norm);
        assert_eq!((c.attn_softcap, c.final_softcap, c.attn_scale), (50.0, 30.0, 1.0 / 16.0));
        assert_eq!(c.embed_scale, 8.0);
        // Even layers slide (window 4096 by default), odd ones are global.
        assert_eq!((c.window(0), c.window(1), c.window(2)), (Some(4096), None, Some(4096)));
        assert!(!c.local_rope(0) && c.rope_inv_freq_local().is_none());
        let h = config_from_json(format!("{{ {BASE}, \"model_type\": \"gemma2\" }}").as_bytes(), "c.json").unwrap();
        assert!(h.tied, "gemma ties the embeddings unless config.json says otherwise");

        let (c, _) = cfg(r#""model_type": "gemma2", "attn_logit_softcapping": null, "final_logit_softcapping": 7.5,
            "query_pre_attn_scalar": 144, "sliding_window": 8, "layer_types": ["full_attention", "sliding_attention"]"#)
        .unwrap();
        assert_eq!((c.attn_softcap, c.final_softcap, c.attn_scale), (0.0, 7.5, 1.0 / 12.0));
        assert_eq!((c.window(0), c.window(1)), (None, Some(8)));

        // gemma3_text: 5 local : 1 global, a local base of its own (10000 by default), no caps.
        let (c, _) = cfg(r#""model_type": "gemma3_text", "num_hidden_layers": 7, "head_dim": 16"#).unwrap();
        assert!(c.arch.qk_norm && c.arch.post_norms);
        assert_eq!((c.attn_softcap, c.final_softcap, c.rope_theta), (0.0, 0.0, 1e6));
        let w: Vec<bool> = (0..7).map(|l| c.window(l).is_some()).collect();
        assert_eq!(w, [true, true, true, true, true, false, true]);
        assert!(c.local_rope(0) && !c.local_rope(5));
        let local = c.rope_inv_freq_local().unwrap();
        assert_eq!(local[1], 1.0 / 10000f64.powf(2.0 / 16.0));
        let (c, _) = cfg(r#""model_type": "gemma3_text", "sliding_window_pattern": 2, "rope_local_base_freq": 5e4,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0}"#)
        .unwrap();
        assert_eq!((c.window(0), c.window(1), c.rope_linear_factor), (Some(4096), None, 8.0));
        let r = c.sliding_window.as_ref().unwrap().rope.unwrap();
        assert_eq!((r.theta, r.linear_factor), (5e4, 1.0), "rope_scaling is the global layers' only");

        // Mistral: every layer, or none for null.
        let (c, _) = cfg(r#""model_type": "mistral", "sliding_window": 4096"#).unwrap();
        assert_eq!((c.window(0), c.window(1)), (Some(4096), Some(4096)));
        let (c, _) = cfg(r#""model_type": "mistral", "sliding_window": null"#).unwrap();
        assert_eq!(c.window(0), None);
        let (c, _) = cfg(r#""model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": false"#).unwrap();
        assert_eq!(c.window(0), None);

        let e = cfg(r#""model_type": "gemma2", "layer_types": ["sliding_attention"]"#).unwrap_err();
        assert!(e.message.contains("layer_types has 1 entries for 2 layers"), "{}", e.message);
        let e = cfg(r#""model_type": "gemma3", "head_dim": 16"#).unwrap_err();
        assert_eq!(e.status, crate::Status::LLMRT_UNSUPPORTED);
    }

    /// The embedding scale is rounded to the checkpoint's type (transformers casts the
    /// normalizer to the weights' dtype); llama.cpp's 27B attention-scale rule.
    #[test]
    fn gemma_scale_roundings() {
        use super::super::{gemma_embed_scale, gemma_gguf_attn_scale};
        use crate::quant::DType;
        assert_eq!(gemma_embed_scale(3584, None), 3584f32.sqrt());
        assert_eq!(gemma_embed_scale(3584, Some(DType::BF16)), 59.75);
        assert_eq!(gemma_embed_scale(3584, Some(DType::F16)), half::f16::from_f32(3584f32.sqrt()).to_f32());
        assert_eq!(gemma_embed_scale(2304, Some(DType::BF16)), 48.0);
        // gemma2 27B: 46 layers, n_embd 4608, 32 heads, head_dim 128: 1 / sqrt(144).
        assert_eq!(gemma_gguf_attn_scale("gemma2", 46, 4608, 32, 128), 1.0 / 12.0);
        assert_eq!(gemma_gguf_attn_scale("gemma2", 42, 3584, 16, 256), 1.0 / 16.0);
        // gemma3 27B: 62 layers, n_embd 5376, 32 heads: 1 / sqrt(168); 46 layers is not its rule.
        assert_eq!(gemma_gguf_attn_scale("gemma3", 62, 5376, 32, 128), 1.0 / 168f32.sqrt());
        assert_eq!(gemma_gguf_attn_scale("gemma3", 46, 5376, 32, 128), 1.0 / 128f32.sqrt());
    }

    /// The experts of config.json: transformers' defaults, each key read, and what is
    /// refused (dense layers among expert ones, impossible counts).
    #[test]
    fn qwen_windows_as_transformers_configures_them() {
        let layers = |c: &Config| (0..4).map(|l| c.window(l)).collect::<Vec<_>>();
        let q = |ty: &str, extra: &str| {
            let (c, _) = cfg(&format!(r#""model_type": "{ty}", "num_hidden_layers": 4, {extra}"#)).unwrap();
            layers(&c)
        };
        let on = r#""use_sliding_window": true, "sliding_window": 8, "max_window_layers": 2"#;
        let (n, w) = (None, Some(8));
        // Off (the shipped configs), whatever the other keys say.
        assert_eq!(q("qwen2", r#""use_sliding_window": false, "sliding_window": 8"#), [n; 4]);
        assert_eq!(
            q(
                "qwen3",
                r#""sliding_window": 8, "layer_types": ["sliding_attention",
            "sliding_attention", "sliding_attention", "sliding_attention"]"#
            ),
            [n; 4]
        );
        assert_eq!(q("qwen2", on), [n, n, w, w]);
        assert_eq!(q("qwen3", on), [n, n, w, w]);
        let moe = "\"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, \"shared_expert_intermediate_size\": 8";
        assert_eq!(q("qwen2_moe", &format!("{on}, {moe}")), [w, n, n, n]);
        assert_eq!(q("qwen3_moe", &format!("{on}, {moe}")), [w; 4]);
        assert_eq!(q("qwen2", r#""use_sliding_window": true, "max_window_layers": 0"#), [Some(4096); 4]);
        assert_eq!(q("qwen2", r#""use_sliding_window": true, "sliding_window": null"#), [n; 4]);
        let listed = r#""layer_types": ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]"#;
        assert_eq!(q("qwen2", &format!("{on}, {listed}")), [n, w, n, w]);
        for (extra, needle) in [
            (r#""use_sliding_window": 1"#, "use_sliding_window = 1 is not a boolean"),
            (r#""use_sliding_window": true, "max_window_layers": -1"#, "max_window_layers = -1"),
            (r#""use_sliding_window": true, "sliding_window": 0"#, "sliding_window = 0"),
            (r#""use_sliding_window": true, "layer_types": ["full_attention"]"#, "layer_types has 1 entries"),
        ] {
            let e = cfg(&format!(r#""model_type": "qwen2", "num_hidden_layers": 4, {extra}"#)).unwrap_err();
            assert!(e.message.contains(needle), "{extra}: {}", e.message);
        }
    }

    #[test]
    fn moe_options_defaults_and_errors() {
        use super::super::MoeConfig;
        let (c, _) = cfg(r#""model_type": "mixtral""#).unwrap();
        let want = MoeConfig { n_experts: 8, n_used: 2, expert_ffn: 128, norm_topk: true, shared_ffn: None };
        assert_eq!(c.moe, Some(want));
        assert!(!c.arch.qkv_bias && !c.arch.qk_norm);
        let (c, _) = cfg(r#""model_type": "mixtral", "sliding_window": 16"#).unwrap();
        assert_eq!(c.window(1), Some(16));
        let (c, _) = cfg(r#""model_type": "qwen2_moe", "num_experts": 60, "num_experts_per_tok": 4,
            "moe_intermediate_size": 32, "shared_expert_intermediate_size": 96, "sliding_window": 8"#)
        .unwrap();
        let want = MoeConfig { n_experts: 60, n_used: 4, expert_ffn: 32, norm_topk: false, shared_ffn: Some(96) };
        assert_eq!(c.moe, Some(want));
        assert!(c.arch.qkv_bias && c.window(0).is_none());
        let (c, _) = cfg(r#""model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8,
            "moe_intermediate_size": 16, "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": []"#)
        .unwrap();
        let want = MoeConfig { n_experts: 128, n_used: 8, expert_ffn: 16, norm_topk: true, shared_ffn: None };
        assert_eq!(c.moe, Some(want));
        assert!(c.arch.qk_norm);
        let (c, _) = cfg(r#""model_type": "qwen3""#).unwrap();
        assert_eq!(c.moe, None);

        let q3 = r#""model_type": "qwen3_moe", "num_experts": 8, "moe_intermediate_size": 16"#;
        for (extra, status, needle) in [
            (r#""num_experts_per_tok": 9"#, crate::Status::LLMRT_BAD_MODEL, "9 experts used per token of 8"),
            (r#""num_experts_per_tok": 0"#, crate::Status::LLMRT_BAD_MODEL, "num_experts_per_tok"),
            (
                r#""num_experts_per_tok": 2, "mlp_only_layers": [0]"#,
                crate::Status::LLMRT_UNSUPPORTED,
                "mlp_only_layers",
            ),
            (
                r#""num_experts_per_tok": 2, "decoder_sparse_step": 2"#,
                crate::Status::LLMRT_UNSUPPORTED,
                "decoder_sparse_step 2",
            ),
            (r#""num_experts_per_tok": 2, "norm_topk_prob": 1"#, crate::Status::LLMRT_BAD_MODEL, "norm_topk_prob"),
        ] {
            let e = cfg(&format!("{q3}, {extra}")).unwrap_err();
            assert_eq!(e.status, status, "{extra}: {}", e.message);
            assert!(e.message.contains(needle), "{extra}: {}", e.message);
        }
        let e = cfg(r#""model_type": "mixtral", "num_local_experts": 100000"#).unwrap_err();
        assert_eq!(e.status, crate::Status::LLMRT_UNSUPPORTED, "{}", e.message);
        assert!(e.message.contains("100000 experts"), "{}", e.message);
        let e =
            cfg(r#""model_type": "qwen2_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 8"#)
                .unwrap_err();
        assert!(e.message.contains("shared_expert_intermediate_size"), "{}", e.message);
    }

    /// The HF names of the expert roles.
    #[test]
    fn moe_tensor_names() {
        assert_eq!(hf_name("blk.3.ffn_gate_inp.weight", false, true), "model.layers.3.block_sparse_moe.gate.weight");
        assert_eq!(
            hf_name("blk.3.ffn_gate.7.weight", false, true),
            "model.layers.3.block_sparse_moe.experts.7.w1.weight"
        );
        assert_eq!(
            hf_name("blk.3.ffn_up.7.weight", false, true),
            "model.layers.3.block_sparse_moe.experts.7.w3.weight"
        );
        assert_eq!(
            hf_name("blk.3.ffn_down.7.weight", false, true),
            "model.layers.3.block_sparse_moe.experts.7.w2.weight"
        );
        assert_eq!(hf_name("blk.0.ffn_gate_inp.weight", false, false), "model.layers.0.mlp.gate.weight");
        assert_eq!(hf_name("blk.0.ffn_down.12.weight", false, false), "model.layers.0.mlp.experts.12.down_proj.weight");
        assert_eq!(
            hf_name("blk.0.ffn_up_shexp.weight", false, false),
            "model.layers.0.mlp.shared_expert.up_proj.weight"
        );
        assert_eq!(
            hf_name("blk.0.ffn_gate_inp_shexp.weight", false, false),
            "model.layers.0.mlp.shared_expert_gate.weight"
        );
        // The dense roles are unchanged.
        assert_eq!(hf_name("blk.0.ffn_down.weight", false, false), "model.layers.0.mlp.down_proj.weight");
        assert_eq!(hf_name("blk.0.attn_q.bias", false, false), "model.layers.0.self_attn.q_proj.bias");
    }
}
