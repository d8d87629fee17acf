//! The tokenizer from GGUF metadata (`tokenizer.ggml.*`).

use super::pretok::Pre;
use super::try_grow;
use super::{bad, split_merge, Model, Parts, Prefix, TokType, Tokenizer};
use crate::error::{Error, Result};
use crate::format::gguf::{ArrayRef, Gguf, ValueRef};

/// The `tokenizer.ggml.pre` names a gpt2 tokenizer may have (as llama.cpp names them).
pub(crate) const SUPPORTED_PRE: &str = "default, gpt2, gpt-2, phi-2, mpt, olmo, jais, jina-es, jina-de, jina-v2-es, \
jina-v2-de, gigachat, mellum, llama3, llama-bpe, llama-v3, falcon3, pixtral, qwen2, deepseek-r1-qwen, stablelm2, \
hunyuan, qwen35, deepseek-llm, deepseek-coder, falcon, starcoder, refact, command-r, smollm, codeshell, exaone, \
minerva; gemma4 for a gemma4 tokenizer";

impl Tokenizer {
    /// From GGUF metadata (`tokenizer.ggml.*`). `Ok(None)` when the file has no tokenizer
    /// (no `tokenizer.ggml.model`, or model "none"/"no_vocab"). Unknown models or
    /// pre-tokenizers -> LLMRT_UNSUPPORTED; missing, mistyped or inconsistent arrays, merges
    /// naming unknown tokens, special ids >= vocab -> LLMRT_BAD_MODEL.
    pub fn from_gguf(g: &Gguf) -> Result<Option<Tokenizer>> {
        let src = g.path.display().to_string();
        let src = src.as_str();
        let kind = match g.get_str("tokenizer.ggml.model")? {
            None | Some("none") | Some("no_vocab") => return Ok(None),
            Some(k) => k.to_string(),
        };
        let tokens =
            gguf_strings(g, "tokenizer.ggml.tokens", src)?.ok_or_else(|| bad(src, "tokenizer.ggml.tokens missing"))?;
        let n = tokens.len();
        let scores = match g.get("tokenizer.ggml.scores") {
            None => vec![0.0; n],
            Some(ValueRef::Array(a)) => collect(&a, "tokenizer.ggml.scores", |i, v| match v {
                ValueRef::F32(x) => Ok(x),
                ValueRef::F64(x) => Ok(x as f32),
                _ => Err(bad(src, format!("tokenizer.ggml.scores[{i}] is {}, expected F32", v.type_name()))),
            })?,
            Some(v) => return Err(bad(src, format!("tokenizer.ggml.scores is {}, expected an ARRAY", v.type_name()))),
        };
        let types = match g.get("tokenizer.ggml.token_type") {
            None => vec![TokType::Normal; n],
            Some(ValueRef::Array(a)) => collect(&a, "tokenizer.ggml.token_type", |i, v| {
                v.as_i64().and_then(TokType::from_i64).ok_or_else(|| {
                    bad(src, format!("tokenizer.ggml.token_type[{i}] is {}, expected a token type 0..=6", v.describe()))
                })
            })?,
            Some(v) => {
                return Err(bad(src, format!("tokenizer.ggml.token_type is {}, expected an ARRAY", v.type_name())))
            }
        };
        let id = |key: &str| -> Result<Option<u32>> { g.get_u32(key) };
        let (model, prefix, merges, bos, eos, unk, add_bos) = match kind.as_str() {
            "llama" => {
                let sp = g.get_bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
                let dflt = |key: &str, d: u32| -> Result<Option<u32>> {
                    Ok(id(key)?.or(if (d as usize) < n { Some(d) } else { None }))
                };
                (
                    Model::Spm,
                    if sp { Prefix::Always } else { Prefix::Never },
                    vec![],
                    dflt("tokenizer.ggml.bos_token_id", 1)?,
                    dflt("tokenizer.ggml.eos_token_id", 2)?,
                    dflt("tokenizer.ggml.unknown_token_id", 0)?,
                    g.get_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(true),
                )
            }
            "gpt2" | "gemma4" => {
                let gemma4 = kind == "gemma4";
                let pre_name = g.get_str("tokenizer.ggml.pre")?.unwrap_or(if gemma4 { "gemma4" } else { "default" });
                // (pre-tokenizer, ignore_merges, add_bos default): llama.cpp's names for each
                let (pre, ignore_merges, add_bos) = match pre_name {
                    "default" => (Pre::Default, false, false),
                    "gpt2" | "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "jina-es" | "jina-de" | "jina-v2-es"
                    | "jina-v2-de" | "gigachat" | "mellum" => (Pre::Gpt2, false, false),
                    "llama3" | "llama-bpe" | "llama-v3" | "falcon3" | "pixtral" => (Pre::Llama3, true, true),
                    "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "hunyuan" => (Pre::Qwen2, false, false),
                    "qwen35" => (Pre::Qwen35, false, false),
                    "deepseek-llm" => (Pre::DeepseekLlm, false, false),
                    "deepseek-coder" => (Pre::DeepseekCoder, false, false),
                    "falcon" => (Pre::Falcon, false, false),
                    "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva" => {
                        (Pre::Starcoder, false, false)
                    }
                    "gemma4" => (Pre::Newlines, false, true),
                    other => {
                        return Err(Error::unsupported(format!(
                            "{src}: tokenizer.ggml.pre {other:?} (supported: {SUPPORTED_PRE})"
                        )))
                    }
                };
                if gemma4 != (pre == Pre::Newlines) {
                    return Err(Error::unsupported(format!(
                        "{src}: tokenizer.ggml.pre {pre_name:?} with tokenizer.ggml.model {kind:?}"
                    )));
                }
                let merges = gguf_strings(g, "tokenizer.ggml.merges", src)?
                    .ok_or_else(|| bad(src, "tokenizer.ggml.merges missing (required for a gpt2 tokenizer)"))?;
                let merges = merges
                    .into_iter()
                    .enumerate()
                    .map(|(i, m)| {
                        split_merge(&m)
                            .ok_or_else(|| bad(src, format!("tokenizer.ggml.merges[{i}] {m:?} is not \"left right\"")))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let sp = g.get_bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(false);
                if sp {
                    return Err(Error::unsupported(format!("{src}: add_space_prefix with a gpt2 tokenizer")));
                }
                (
                    Model::Bpe { byte_level: !gemma4, pre, ignore_merges },
                    Prefix::Never,
                    merges,
                    id("tokenizer.ggml.bos_token_id")?,
                    id("tokenizer.ggml.eos_token_id")?,
                    id("tokenizer.ggml.unknown_token_id")?,
                    // llama.cpp forces BOS on for gemma4
                    gemma4 || g.get_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(add_bos),
                )
            }
            other => {
                return Err(Error::unsupported(format!(
                    "{src}: tokenizer.ggml.model {other:?} (supported: llama, gpt2, gemma4)"
                )))
            }
        };
        Tokenizer::build(
            Parts {
                tokens,
                types,
                scores,
                merges,
                model,
                prefix,
                prefix_unless_space: false,
                bos,
                eos,
                unk,
                add_bos,
                specials: None,
                normalizer: Vec::new(),
            },
            src,
        )
        .map(Some)
    }
}

/// The elements of `a` through `f`, into a vector allocated fallibly (its size
/// comes from the file: LLMRT_OUT_OF_MEMORY naming `key`, not an abort).
fn collect<T>(a: &ArrayRef<'_>, key: &str, mut f: impl FnMut(usize, ValueRef<'_>) -> Result<T>) -> Result<Vec<T>> {
    let mut out = Vec::new();
    try_grow(&mut out, a.len(), key)?;
    for (i, v) in a.iter().enumerate() {
        out.push(f(i, v)?);
    }
    Ok(out)
}

fn gguf_strings(g: &Gguf, key: &str, src: &str) -> Result<Option<Vec<String>>> {
    match g.get(key) {
        None => Ok(None),
        Some(ValueRef::Array(a)) => collect(&a, key, |i, v| match v {
            ValueRef::Str(s) => Ok(s.into_owned()),
            _ => Err(bad(src, format!("{key}[{i}] is {}, expected STRING", v.type_name()))),
        })
        .map(Some),
        Some(v) => Err(bad(src, format!("{key} is {}, expected an ARRAY of STRING", v.type_name()))),
    }
}
