//! The tokenizer from a Hugging Face `tokenizer.json` (+ `tokenizer_config.json`).

use std::collections::HashMap;

use super::pretok::{self, Pre};
use super::{bad, split_merge, Model, Parts, Prefix, TokType, Tokenizer};
use crate::error::{Error, Result};

use super::normalize::Norm;

impl Tokenizer {
    /// From a Hugging Face `tokenizer.json` (+ optional `tokenizer_config.json` for
    /// `add_bos_token`, `bos_token`, `eos_token`). Supported: model `BPE` with a byte-level
    /// pre-tokenizer (`ByteLevel`, or `Split` with the gpt2 / llama3 / qwen2 regex followed by
    /// `ByteLevel`), or SentencePiece-style (`Metaspace` pre-tokenizer, or the legacy
    /// `Prepend("▁")`+`Replace(" ", "▁")` normalizer) with `byte_fallback`. Other shapes ->
    /// LLMRT_UNSUPPORTED naming the part; malformed JSON or inconsistent vocab -> LLMRT_BAD_MODEL.
    pub fn from_hf_json(
        tokenizer_json: &[u8],
        tokenizer_config: Option<&[u8]>,
        path_for_messages: &str,
    ) -> Result<Tokenizer> {
        use serde_json::Value as J;
        let src = path_for_messages;
        let j: J = serde_json::from_slice(tokenizer_json).map_err(|e| bad(src, format!("invalid JSON: {e}")))?;
        let cfg: Option<J> = match tokenizer_config {
            None => None,
            Some(b) => {
                Some(serde_json::from_slice(b).map_err(|e| bad(src, format!("tokenizer_config: invalid JSON: {e}")))?)
            }
        };
        let unsup = |what: String| Error::unsupported(format!("{src}: {what}"));
        let m = j.get("model").ok_or_else(|| bad(src, "no \"model\""))?;
        let mtype = m.get("type").and_then(J::as_str).unwrap_or("");
        if mtype != "BPE" {
            return Err(unsup(format!("tokenizer model type {mtype:?} (only BPE is supported)")));
        }
        for k in ["continuing_subword_prefix", "end_of_word_suffix"] {
            match m.get(k) {
                None | Some(J::Null) => {}
                Some(J::String(s)) if s.is_empty() => {}
                Some(v) => return Err(unsup(format!("BPE {k} {v}"))),
            }
        }
        match m.get("dropout") {
            None | Some(J::Null) => {}
            Some(v) if v.as_f64() == Some(0.0) => {}
            Some(v) => return Err(unsup(format!("BPE dropout {v}"))),
        }
        let byte_fallback = m.get("byte_fallback").and_then(J::as_bool).unwrap_or(false);
        let ignore_merges = m.get("ignore_merges").and_then(J::as_bool).unwrap_or(false);
        // vocab + added tokens
        let vocab = m.get("vocab").and_then(J::as_object).ok_or_else(|| bad(src, "model.vocab is not an object"))?;
        let mut by_id: HashMap<u32, (String, TokType)> = HashMap::new();
        for (t, v) in vocab {
            let id = v
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| bad(src, format!("vocab id of {t:?} is {v}")))?;
            if by_id.insert(id, (t.clone(), TokType::Normal)).is_some() {
                return Err(bad(src, format!("vocab id {id} given twice")));
            }
        }
        let mut specials = vec![];
        if let Some(added) = j.get("added_tokens") {
            let added = added.as_array().ok_or_else(|| bad(src, "added_tokens is not an array"))?;
            for (i, a) in added.iter().enumerate() {
                let id = a
                    .get("id")
                    .and_then(J::as_u64)
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| bad(src, format!("added_tokens[{i}] has no valid id")))?;
                let content = a
                    .get("content")
                    .and_then(J::as_str)
                    .ok_or_else(|| bad(src, format!("added_tokens[{i}] has no content")))?;
                let special = a.get("special").and_then(J::as_bool).unwrap_or(false);
                let ty = if special { TokType::Control } else { TokType::UserDefined };
                if let Some((t, _)) = by_id.get(&id) {
                    if t != content {
                        return Err(bad(
                            src,
                            format!("added_tokens[{i}] id {id} is {content:?} but the vocab has {t:?}"),
                        ));
                    }
                }
                by_id.insert(id, (content.to_string(), ty));
                specials.push(id);
            }
        }
        let n = by_id.len();
        let mut tokens = Vec::with_capacity(n);
        let mut types = Vec::with_capacity(n);
        for i in 0..n as u32 {
            let (t, ty) = by_id
                .remove(&i)
                .ok_or_else(|| bad(src, format!("token ids are not contiguous: id {i} missing ({n} tokens)")))?;
            tokens.push(t);
            types.push(ty);
        }
        for (i, t) in tokens.iter().enumerate() {
            if byte_fallback && types[i] == TokType::Normal && t.len() == 6 && t.starts_with("<0x") && t.ends_with('>')
            {
                types[i] = TokType::Byte;
            }
        }
        let merges = match m.get("merges") {
            None | Some(J::Null) => vec![],
            Some(J::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let r = match v {
                        J::String(s) => split_merge(s),
                        J::Array(p) if p.len() == 2 => match (p[0].as_str(), p[1].as_str()) {
                            (Some(x), Some(y)) => Some((x.to_string(), y.to_string())),
                            _ => None,
                        },
                        _ => None,
                    };
                    r.ok_or_else(|| bad(src, format!("merges[{i}] is {v}, expected \"left right\" or [left, right]")))
                })
                .collect::<Result<Vec<_>>>()?,
            Some(v) => return Err(bad(src, format!("merges is {v}"))),
        };
        let tok_id = |name: &str| -> Option<u32> { tokens.iter().position(|t| t == name).map(|i| i as u32) };
        let unk = match m.get("unk_token") {
            None | Some(J::Null) => None,
            Some(J::String(s)) => Some(tok_id(s).ok_or_else(|| bad(src, format!("unk_token {s:?} is not a token")))?),
            Some(v) => return Err(bad(src, format!("unk_token is {v}"))),
        };
        // normalizer
        let mut legacy_prefix = false;
        let norm = j.get("normalizer").unwrap_or(&J::Null);
        let norm_list: Vec<&J> = match norm.get("type").and_then(J::as_str) {
            None => vec![],
            Some("Sequence") => {
                norm.get("normalizers").and_then(J::as_array).map(|a| a.iter().collect()).unwrap_or_default()
            }
            Some(_) => vec![norm],
        };
        // The SentencePiece-style pair (Prepend "▁", Replace " " -> "▁") is the model's own
        // space handling (`legacy_prefix`, `replace_space`); every other step is applied to
        // the text (normalize.rs).
        let mut replace_space = false;
        let mut normalizer = Vec::new();
        for nz in norm_list {
            let s = |k: &str| nz.get(k).and_then(J::as_str);
            let flag = |k: &str| nz.get(k).and_then(J::as_bool).unwrap_or(true);
            match s("type").unwrap_or("") {
                "NFC" => normalizer.push(Norm::Nfc),
                "NFD" => normalizer.push(Norm::Nfd),
                "NFKC" => normalizer.push(Norm::Nfkc),
                "NFKD" => normalizer.push(Norm::Nfkd),
                "Lowercase" => normalizer.push(Norm::Lowercase),
                "Strip" => normalizer.push(Norm::Strip { left: flag("strip_left"), right: flag("strip_right") }),
                "Prepend" if s("prepend") == Some("▁") && normalizer.is_empty() => legacy_prefix = true,
                "Prepend" => match s("prepend") {
                    Some(p) => normalizer.push(Norm::Prepend(p.to_string())),
                    None => return Err(bad(src, format!("Prepend normalizer without a prepend string ({nz})"))),
                },
                "Replace"
                    if nz.get("pattern").and_then(|p| p.get("String")).and_then(J::as_str) == Some(" ")
                        && s("content") == Some("▁")
                        && normalizer.is_empty() =>
                {
                    replace_space = true
                }
                "Replace" => {
                    match (nz.get("pattern").and_then(|p| p.get("String")).and_then(J::as_str), s("content")) {
                        (Some(from), Some(to)) => normalizer.push(Norm::Replace { from: from.into(), to: to.into() }),
                        _ => return Err(unsup(format!("Replace normalizer other than string -> string ({nz})"))),
                    }
                }
                t => return Err(unsup(format!("normalizer {t:?} ({nz})"))),
            }
        }
        // pre-tokenizer
        let pt = j.get("pre_tokenizer").unwrap_or(&J::Null);
        let pt_list: Vec<&J> = match pt.get("type").and_then(J::as_str) {
            None => vec![],
            Some("Sequence") => {
                pt.get("pretokenizers").and_then(J::as_array).map(|a| a.iter().collect()).unwrap_or_default()
            }
            Some(_) => vec![pt],
        };
        let desc = |v: &J| v.to_string();
        let mut metaspace = false;
        let (model, prefix) = match pt_list.as_slice() {
            [] if replace_space => (
                Model::Bpe { byte_level: false, pre: Pre::Whole, ignore_merges },
                if legacy_prefix { Prefix::Always } else { Prefix::Never },
            ),
            [one] if one.get("type").and_then(J::as_str) == Some("Metaspace") => {
                if one.get("replacement").and_then(J::as_str).unwrap_or("▁") != "▁" {
                    return Err(unsup(format!("Metaspace replacement other than ▁ ({})", desc(one))));
                }
                if one.get("split").and_then(J::as_bool).unwrap_or(true) {
                    return Err(unsup(format!("Metaspace with split = true ({})", desc(one))));
                }
                let scheme = one.get("prepend_scheme").and_then(J::as_str).map(str::to_string).unwrap_or_else(|| {
                    if one.get("add_prefix_space").and_then(J::as_bool).unwrap_or(true) {
                        "always".into()
                    } else {
                        "never".into()
                    }
                });
                let prefix = match scheme.as_str() {
                    "always" => Prefix::Always,
                    "first" => Prefix::First,
                    "never" => Prefix::Never,
                    s => return Err(unsup(format!("Metaspace prepend_scheme {s:?}"))),
                };
                metaspace = true;
                (Model::Bpe { byte_level: false, pre: Pre::Whole, ignore_merges }, prefix)
            }
            [one] if one.get("type").and_then(J::as_str) == Some("ByteLevel") => {
                check_byte_level(one, src)?;
                let pre =
                    if one.get("use_regex").and_then(J::as_bool).unwrap_or(true) { Pre::Gpt2 } else { Pre::Whole };
                (Model::Bpe { byte_level: true, pre, ignore_merges }, Prefix::Never)
            }
            [split, bl]
                if split.get("type").and_then(J::as_str) == Some("Split")
                    && bl.get("type").and_then(J::as_str) == Some("ByteLevel") =>
            {
                check_byte_level(bl, src)?;
                if bl.get("use_regex").and_then(J::as_bool).unwrap_or(true) {
                    return Err(unsup("Split followed by ByteLevel with use_regex = true".into()));
                }
                let re = split
                    .get("pattern")
                    .and_then(|p| p.get("Regex"))
                    .and_then(J::as_str)
                    .ok_or_else(|| unsup(format!("Split pattern {}", desc(split))))?;
                let behavior = split.get("behavior").and_then(J::as_str).unwrap_or("");
                let invert = split.get("invert").and_then(J::as_bool).unwrap_or(false);
                if behavior != "Isolated" || invert {
                    return Err(unsup(format!("Split behavior {behavior:?} invert {invert}")));
                }
                let pre = pretok::pre_for_regex(re)
                    .ok_or_else(|| unsup(format!("Split regex {re:?} (known: gpt2, llama3, qwen2)")))?;
                (Model::Bpe { byte_level: true, pre, ignore_merges }, Prefix::Never)
            }
            _ => return Err(unsup(format!("pre_tokenizer {}", desc(pt)))),
        };
        if let Model::Bpe { byte_level: false, .. } = model {
            if !byte_fallback && unk.is_none() {
                // Characters outside the vocabulary would vanish silently.
                return Err(unsup("SentencePiece-style BPE without byte_fallback or unk_token".into()));
            }
        }
        // specials from the config / post-processor
        let cfg_tok = |key: &str| -> Option<String> {
            let v = cfg.as_ref()?.get(key)?;
            match v {
                J::String(s) => Some(s.clone()),
                J::Object(o) => o.get("content").and_then(J::as_str).map(str::to_string),
                _ => None,
            }
        };
        let bos = match cfg_tok("bos_token") {
            Some(s) => Some(tok_id(&s).ok_or_else(|| bad(src, format!("bos_token {s:?} is not a token")))?),
            None => None,
        };
        let eos = match cfg_tok("eos_token") {
            Some(s) => Some(tok_id(&s).ok_or_else(|| bad(src, format!("eos_token {s:?} is not a token")))?),
            None => None,
        };
        let add_bos = cfg.as_ref().and_then(|c| c.get("add_bos_token")).and_then(J::as_bool).unwrap_or(false);
        let scores = vec![0.0; tokens.len()];
        Tokenizer::build(
            Parts {
                tokens,
                types,
                scores,
                merges,
                model,
                prefix,
                prefix_unless_space: metaspace,
                bos,
                eos,
                unk,
                add_bos,
                specials: Some(specials),
                normalizer,
            },
            src,
        )
    }
}

fn check_byte_level(v: &serde_json::Value, src: &str) -> Result<()> {
    if v.get("add_prefix_space").and_then(serde_json::Value::as_bool).unwrap_or(false) {
        return Err(Error::unsupported(format!("{src}: ByteLevel add_prefix_space = true")));
    }
    Ok(())
}
