//! What a model says about chat: its chat template, its bos/eos strings, and the set of
//! end-of-generation (EOG) token ids.
//!
//! EOG ids are the union of:
//! - GGUF: `tokenizer.ggml.eos_token_id`, `eot_token_id`, `eom_token_id`;
//! - Hugging Face: config.json `eos_token_id` and generation_config.json `eos_token_id` (each
//!   an int or a list: every entry counts), the tokenizer's `eos_token`;
//! - either: the special tokens (control / user-defined tokens, HF added tokens) whose text
//!   is one of [`EOG_TEXTS`], the end-of-turn markers of the chat formats in use (the list
//!   llama.cpp matches by text).
//!
//! The chat template: GGUF `tokenizer.chat_template`; HF `chat_template.jinja`, else
//! tokenizer_config.json `chat_template` (a string, or a list of `{name, template}` whose
//! entry named "default" is taken).

use std::path::Path;

use serde_json::Value as J;

use crate::format::gguf::Gguf;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// Special-token texts that end a generation where the vocabulary has them as special tokens.
pub const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<end_of_utterance>",
];

/// A model's chat metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatInfo {
    /// The model's own chat template, if it carries one.
    pub template: Option<String>,
    /// `bos_token` / `eos_token` as the template sees them ("" when the model has none).
    pub bos_token: String,
    pub eos_token: String,
    /// End-of-generation ids, ascending, no duplicates.
    pub eog: Vec<u32>,
}

impl ChatInfo {
    /// Whether `id` ends a generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    fn finish(mut self, tok: Option<&Tokenizer>) -> ChatInfo {
        if let Some(t) = tok {
            self.eog.extend(EOG_TEXTS.iter().filter_map(|s| t.special_id(s)));
        }
        self.eog.sort_unstable();
        self.eog.dedup();
        self
    }

    /// From a GGUF file's metadata and its tokenizer. `vocab`: the model's vocabulary size
    /// (ids at or past it are LLMRT_BAD_MODEL naming the key).
    pub fn from_gguf(g: &Gguf, tok: Option<&Tokenizer>, vocab: usize) -> Result<ChatInfo> {
        let template = g.get_str("tokenizer.chat_template")?.map(str::to_string);
        let mut eog = Vec::new();
        for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Some(id) = g.get_u32(key)? {
                if id as usize >= vocab {
                    return Err(Error::bad_model(format!(
                        "{}: {key} {id} is outside the vocabulary of {vocab}",
                        g.path.display()
                    )));
                }
                eog.push(id);
            }
        }
        let text = |key: &str| -> Result<String> {
            Ok(match (g.get_u32(key)?, tok) {
                (Some(id), Some(t)) => t.token_text(id).unwrap_or_default().to_string(),
                _ => String::new(),
            })
        };
        let bos_token = text("tokenizer.ggml.bos_token_id")?;
        let eos_token = text("tokenizer.ggml.eos_token_id")?;
        Ok(ChatInfo { template, bos_token, eos_token, eog }.finish(tok))
    }

    /// From a Hugging Face model directory (config.json, generation_config.json,
    /// tokenizer_config.json, chat_template.jinja) and its tokenizer.
    pub fn from_hf_dir(dir: &Path, tok: Option<&Tokenizer>, vocab: usize) -> Result<ChatInfo> {
        let read_json = |name: &str| -> Result<Option<J>> {
            let path = dir.join(name);
            match crate::format::read_small_file(&path)? {
                None => Ok(None),
                Some(b) => serde_json::from_slice(&b)
                    .map(Some)
                    .map_err(|e| Error::bad_model(format!("{}: invalid JSON: {e}", path.display()))),
            }
        };
        let mut eog = Vec::new();
        for name in ["config.json", "generation_config.json"] {
            if let Some(j) = read_json(name)? {
                ids(&j, "eos_token_id", &dir.join(name), vocab, &mut eog)?;
            }
        }
        if let Some(e) = tok.and_then(Tokenizer::eos) {
            eog.push(e);
        }
        let cfg = read_json("tokenizer_config.json")?;
        let cfg_path = dir.join("tokenizer_config.json");
        let template = match crate::format::read_small_file(&dir.join("chat_template.jinja"))? {
            Some(b) => Some(String::from_utf8(b).map_err(|e| {
                Error::bad_model(format!(
                    "{}: not valid UTF-8 at byte offset {}",
                    dir.join("chat_template.jinja").display(),
                    e.utf8_error().valid_up_to()
                ))
            })?),
            None => match cfg.as_ref().and_then(|c| c.get("chat_template")) {
                None | Some(J::Null) => None,
                Some(J::String(s)) => Some(s.clone()),
                Some(J::Array(a)) => a
                    .iter()
                    .find(|e| e.get("name").and_then(J::as_str) == Some("default"))
                    .and_then(|e| e.get("template"))
                    .and_then(J::as_str)
                    .map(str::to_string),
                Some(v) => {
                    return Err(Error::bad_model(format!(
                        "{}: chat_template is {}, not a string or a list of named templates",
                        cfg_path.display(),
                        kind(v)
                    )))
                }
            },
        };
        let token_str = |key: &str, id: Option<u32>| -> String {
            let from_cfg = cfg.as_ref().and_then(|c| c.get(key)).and_then(|v| match v {
                J::String(s) => Some(s.clone()),
                J::Object(o) => o.get("content").and_then(J::as_str).map(str::to_string),
                _ => None,
            });
            from_cfg
                .or_else(|| id.and_then(|i| tok.and_then(|t| t.token_text(i))).map(str::to_string))
                .unwrap_or_default()
        };
        let bos_token = token_str("bos_token", tok.and_then(Tokenizer::bos));
        let eos_token = token_str("eos_token", tok.and_then(Tokenizer::eos));
        Ok(ChatInfo { template, bos_token, eos_token, eog }.finish(tok))
    }
}

fn kind(v: &J) -> &'static str {
    match v {
        J::Null => "null",
        J::Bool(_) => "a boolean",
        J::Number(_) => "a number",
        J::String(_) => "a string",
        J::Array(_) => "a list",
        J::Object(_) => "an object",
    }
}

/// `key` of `j` as token ids (an int, a list of ints, or null) appended to `out`.
fn ids(j: &J, key: &str, path: &Path, vocab: usize, out: &mut Vec<u32>) -> Result<()> {
    let one = |v: &J| -> Result<u32> {
        match v.as_u64() {
            Some(id) if (id as usize) < vocab => Ok(id as u32),
            Some(id) => {
                Err(Error::bad_model(format!("{}: {key} {id} is outside the vocabulary of {vocab}", path.display())))
            }
            None => Err(Error::bad_model(format!("{}: {key} entry {v} is not a token id", path.display()))),
        }
    };
    match j.get(key) {
        None | Some(J::Null) => {}
        Some(J::Array(a)) => {
            for v in a.iter().take(vocab) {
                out.push(one(v)?);
            }
        }
        Some(v) => out.push(one(v)?),
    }
    Ok(())
}
