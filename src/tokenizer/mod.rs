//! Tokenizers: text <-> token ids, with llama.cpp's semantics.
//!
//! Two kinds:
//! - SentencePiece BPE (`tokenizer.ggml.model = "llama"`, a sentencepiece `.model` of type BPE):
//!   spaces become "▁", a dummy-prefix "▁" starts the text (and every text fragment after a
//!   special token, as llama.cpp does), the adjacent pair whose concatenation is the
//!   highest-scoring vocabulary piece is merged first (leftmost on ties), characters that end up
//!   as no piece fall back to `<0xXX>` byte tokens, or to the unknown token.
//! - BPE with merge ranks (`gpt2` in GGUF, model type `BPE` in a tokenizer.json): byte-level
//!   (GPT-2 byte-to-unicode map, split by the pre-tokenizer: `gpt2`/`default`, `llama3`
//!   (alias `llama-bpe`, `llama-v3`), `qwen2`), or SentencePiece-style (Metaspace "▁", byte
//!   fallback) from a tokenizer.json. The lowest-ranked adjacent pair merges first, leftmost on
//!   ties; `ignore_merges` (llama3) takes a whole word that is in the vocabulary as is.
//!
//! Special tokens in text: every CONTROL, USER_DEFINED and UNKNOWN token (GGUF/sentencepiece
//! types), and every `added_tokens` entry of a tokenizer.json, written literally in the text is
//! that token (llama.cpp `parse_special = true`), longest first.
//!
//! Decoding (llama.cpp `detokenize` with `special = false`): CONTROL, UNKNOWN and UNUSED tokens
//! (BOS, EOS, `<unk>`, `<|endoftext|>`, ...) decode to nothing; BYTE tokens to their byte;
//! USER_DEFINED tokens to their text; NORMAL tokens to their text with "▁" -> " " (SentencePiece
//! kinds) or through the inverse byte map (byte-level). When the tokenizer adds a dummy prefix,
//! one leading space of the first token that produces output is dropped (as sentencepiece, HF's
//! Metaspace/Strip decoders and llama.cpp do), so `decode(encode(s)) == s`. Use
//! [`Tokenizer::token_piece`] (no stripping) to stream token by token.
//!
//! No Unicode normalisation is applied (llama.cpp applies none); a tokenizer.json NFC normalizer
//! is accepted and not applied: text already in NFC tokenizes as HF does.

mod pretok;

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::format::gguf::{Gguf, Value};
use pretok::Pre;

/// Token types, as GGUF `tokenizer.ggml.token_type` and sentencepiece number them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TokType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokType {
    fn from_i64(v: i64) -> Option<TokType> {
        Some(match v {
            0 | 1 => TokType::Normal, // 0 = undefined: treated as normal
            2 => TokType::Unknown,
            3 => TokType::Control,
            4 => TokType::UserDefined,
            5 => TokType::Unused,
            6 => TokType::Byte,
            _ => return None,
        })
    }
}

/// When the dummy-prefix "▁" is added to a text fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prefix {
    Never,
    /// Every fragment that starts the text or follows a special token (llama.cpp; HF "always").
    Always,
    /// Only a fragment at byte 0 of the text (HF Metaspace prepend_scheme "first").
    First,
}

// HF's Metaspace pre-tokenizer does not prepend "▁" to a fragment that already starts with
// one (a space); llama.cpp and sentencepiece (and HF's legacy Prepend normalizer) always do.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Model {
    /// Score-driven SentencePiece BPE.
    Spm,
    /// Rank-driven BPE.
    Bpe { byte_level: bool, pre: Pre, ignore_merges: bool },
}

/// A tokenizer (see the module documentation for the exact semantics).
#[derive(Clone, Debug)]
pub struct Tokenizer {
    tokens: Vec<String>,
    types: Vec<TokType>,
    scores: Vec<f32>,
    ids: HashMap<String, u32>,
    /// (left id, right id) -> (rank, merged id).
    ranks: HashMap<(u32, u32), (u32, u32)>,
    byte_ids: [Option<u32>; 256],
    model: Model,
    prefix: Prefix,
    /// HF Metaspace: no dummy prefix on a fragment that starts with a space.
    prefix_unless_space: bool,
    /// Special tokens matched in text, longest text first.
    specials: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
}

fn bad(src: &str, msg: impl std::fmt::Display) -> Error {
    Error::bad_model(format!("{src}: {msg}"))
}

struct Parts {
    tokens: Vec<String>,
    types: Vec<TokType>,
    scores: Vec<f32>,
    merges: Vec<(String, String)>,
    model: Model,
    prefix: Prefix,
    prefix_unless_space: bool,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
    /// Ids matched in text; None: by type (control, user-defined, unknown).
    specials: Option<Vec<u32>>,
}

impl Tokenizer {
    fn build(p: Parts, src: &str) -> Result<Tokenizer> {
        let n = p.tokens.len();
        if n == 0 {
            return Err(bad(src, "tokenizer has no tokens"));
        }
        if n > u32::MAX as usize {
            return Err(bad(src, format!("{n} tokens: more than u32 ids")));
        }
        if p.types.len() != n || p.scores.len() != n {
            return Err(bad(src, format!(
                "inconsistent tokenizer: {} tokens, {} token types, {} scores",
                n, p.types.len(), p.scores.len()
            )));
        }
        for (what, id) in [("bos", p.bos), ("eos", p.eos), ("unknown", p.unk)] {
            if let Some(id) = id {
                if id as usize >= n {
                    return Err(bad(src, format!("{what} token id {id} >= vocabulary size {n}")));
                }
            }
        }
        let mut ids = HashMap::with_capacity(n);
        for (i, t) in p.tokens.iter().enumerate() {
            ids.insert(t.clone(), i as u32); // duplicates: the last wins, as in llama.cpp
        }
        let mut ranks = HashMap::with_capacity(p.merges.len());
        for (r, (a, b)) in p.merges.iter().enumerate() {
            let look = |s: &str| {
                ids.get(s).copied().ok_or_else(|| {
                    bad(src, format!("merge {} ({a:?} {b:?}) names {s:?}, which is not a token", r))
                })
            };
            let (ia, ib) = (look(a)?, look(b)?);
            let im = look(&format!("{a}{b}"))?;
            ranks.entry((ia, ib)).or_insert((r as u32, im));
        }
        let mut byte_ids = [None; 256];
        for (i, t) in p.tokens.iter().enumerate() {
            let is_byte_text = t.len() == 6 && t.starts_with("<0x") && t.ends_with('>');
            if is_byte_text && (p.types[i] == TokType::Byte || p.types[i] == TokType::Normal) {
                if let Ok(b) = u8::from_str_radix(&t[3..5], 16) {
                    if byte_ids[b as usize].is_none() || p.types[i] == TokType::Byte {
                        byte_ids[b as usize] = Some(i as u32);
                    }
                }
            }
        }
        let mut specials: Vec<u32> = match p.specials {
            Some(v) => v,
            None => (0..n as u32)
                .filter(|&i| {
                    matches!(
                        p.types[i as usize],
                        TokType::Control | TokType::UserDefined | TokType::Unknown
                    )
                })
                .collect(),
        };
        specials.retain(|&i| (i as usize) < n && !p.tokens[i as usize].is_empty());
        specials.sort_by(|&a, &b| {
            p.tokens[b as usize].len().cmp(&p.tokens[a as usize].len()).then(a.cmp(&b))
        });
        specials.dedup();
        Ok(Tokenizer {
            tokens: p.tokens,
            types: p.types,
            scores: p.scores,
            ids,
            ranks,
            byte_ids,
            model: p.model,
            prefix: p.prefix,
            prefix_unless_space: p.prefix_unless_space,
            specials,
            bos: p.bos,
            eos: p.eos,
            unk: p.unk,
            add_bos: p.add_bos,
        })
    }

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
        let tokens = gguf_strings(g, "tokenizer.ggml.tokens", src)?
            .ok_or_else(|| bad(src, "tokenizer.ggml.tokens missing"))?;
        let n = tokens.len();
        let scores = match g.get("tokenizer.ggml.scores") {
            None => vec![0.0; n],
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::F32(x) => Ok(*x),
                    Value::F64(x) => Ok(*x as f32),
                    _ => Err(bad(src, format!("tokenizer.ggml.scores[{i}] is {}, expected F32", v.type_name()))),
                })
                .collect::<Result<Vec<f32>>>()?,
            Some(v) => return Err(bad(src, format!("tokenizer.ggml.scores is {}, expected an ARRAY", v.type_name()))),
        };
        let types = match g.get("tokenizer.ggml.token_type") {
            None => vec![TokType::Normal; n],
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let x = match v {
                        Value::I32(x) => Some(*x as i64),
                        Value::U32(x) => Some(*x as i64),
                        Value::I8(x) => Some(*x as i64),
                        Value::U8(x) => Some(*x as i64),
                        Value::I16(x) => Some(*x as i64),
                        Value::U16(x) => Some(*x as i64),
                        Value::I64(x) => Some(*x),
                        Value::U64(x) => i64::try_from(*x).ok(),
                        _ => None,
                    };
                    x.and_then(TokType::from_i64).ok_or_else(|| {
                        bad(src, format!("tokenizer.ggml.token_type[{i}] is {v:?}, expected a token type 0..=6"))
                    })
                })
                .collect::<Result<Vec<TokType>>>()?,
            Some(v) => return Err(bad(src, format!("tokenizer.ggml.token_type is {}, expected an ARRAY", v.type_name()))),
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
            "gpt2" => {
                let pre_name = g.get_str("tokenizer.ggml.pre")?.unwrap_or("default");
                let (pre, ignore_merges, add_bos) = match pre_name {
                    "default" | "gpt2" | "gpt-2" => (Pre::Gpt2, false, false),
                    "llama3" | "llama-bpe" | "llama-v3" => (Pre::Llama3, true, true),
                    "qwen2" => (Pre::Qwen2, false, false),
                    other => {
                        return Err(Error::unsupported(format!(
                            "{src}: tokenizer.ggml.pre {other:?} (supported: default, gpt2, llama3, llama-bpe, qwen2)"
                        )))
                    }
                };
                let merges = gguf_strings(g, "tokenizer.ggml.merges", src)?
                    .ok_or_else(|| bad(src, "tokenizer.ggml.merges missing (required for a gpt2 tokenizer)"))?;
                let merges = merges
                    .into_iter()
                    .enumerate()
                    .map(|(i, m)| split_merge(&m).ok_or_else(|| bad(src, format!("tokenizer.ggml.merges[{i}] {m:?} is not \"left right\""))))
                    .collect::<Result<Vec<_>>>()?;
                let sp = g.get_bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(false);
                if sp {
                    return Err(Error::unsupported(format!("{src}: add_space_prefix with a gpt2 tokenizer")));
                }
                (
                    Model::Bpe { byte_level: true, pre, ignore_merges },
                    Prefix::Never,
                    merges,
                    id("tokenizer.ggml.bos_token_id")?,
                    id("tokenizer.ggml.eos_token_id")?,
                    id("tokenizer.ggml.unknown_token_id")?,
                    g.get_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(add_bos),
                )
            }
            other => {
                return Err(Error::unsupported(format!(
                    "{src}: tokenizer.ggml.model {other:?} (supported: llama, gpt2)"
                )))
            }
        };
        Tokenizer::build(
            Parts { tokens, types, scores, merges, model, prefix, prefix_unless_space: false, bos, eos, unk, add_bos, specials: None },
            src,
        )
        .map(Some)
    }

    /// From a sentencepiece `.model` file (ModelProto) of type BPE (Llama 1/2, Mistral v0.1).
    /// Unigram models -> LLMRT_UNSUPPORTED; malformed protobuf -> LLMRT_BAD_MODEL.
    pub fn from_sentencepiece_model(bytes: &[u8], path_for_messages: &str) -> Result<Tokenizer> {
        let src = path_for_messages;
        let mut tokens = Vec::new();
        let mut scores = Vec::new();
        let mut types = Vec::new();
        let (mut model_type, mut unk, mut bos, mut eos) = (1i64, 0i64, 1i64, 2i64);
        let mut dummy = true;
        for f in proto_fields(bytes, src)? {
            match (f.num, f.val) {
                (1, PVal::Bytes(b)) => {
                    let (mut piece, mut score, mut ty) = (None, 0.0f32, 1i64);
                    for g in proto_fields(b, src)? {
                        match (g.num, g.val) {
                            (1, PVal::Bytes(s)) => {
                                piece = Some(String::from_utf8(s.to_vec()).map_err(|_| {
                                    bad(src, format!("piece {} is not UTF-8", tokens.len()))
                                })?)
                            }
                            (2, PVal::Fixed32(x)) => score = f32::from_bits(x),
                            (3, PVal::Varint(x)) => ty = x as i64,
                            _ => {}
                        }
                    }
                    let piece = piece.ok_or_else(|| bad(src, format!("piece {} has no text", tokens.len())))?;
                    let t = TokType::from_i64(ty)
                        .ok_or_else(|| bad(src, format!("piece {} has type {ty}", tokens.len())))?;
                    tokens.push(piece);
                    scores.push(score);
                    types.push(t);
                }
                (2, PVal::Bytes(b)) => {
                    for g in proto_fields(b, src)? {
                        match (g.num, g.val) {
                            (3, PVal::Varint(x)) => model_type = x as i64,
                            (40, PVal::Varint(x)) => unk = x as i32 as i64,
                            (41, PVal::Varint(x)) => bos = x as i32 as i64,
                            (42, PVal::Varint(x)) => eos = x as i32 as i64,
                            _ => {}
                        }
                    }
                }
                (3, PVal::Bytes(b)) => {
                    for g in proto_fields(b, src)? {
                        if let (3, PVal::Varint(x)) = (g.num, g.val) {
                            dummy = x != 0;
                        }
                    }
                }
                _ => {}
            }
        }
        if model_type != 2 {
            return Err(Error::unsupported(format!(
                "{src}: sentencepiece model type {model_type} (only BPE = 2 is supported; 1 = unigram)"
            )));
        }
        let opt = |x: i64| u32::try_from(x).ok();
        Tokenizer::build(
            Parts {
                tokens,
                types,
                scores,
                merges: vec![],
                model: Model::Spm,
                prefix: if dummy { Prefix::Always } else { Prefix::Never },
                prefix_unless_space: false,
                bos: opt(bos),
                eos: opt(eos),
                unk: opt(unk),
                add_bos: true,
                specials: None,
            },
            src,
        )
    }

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
            Some(b) => Some(serde_json::from_slice(b).map_err(|e| bad(src, format!("tokenizer_config: invalid JSON: {e}")))?),
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
            let id = v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| bad(src, format!("vocab id of {t:?} is {v}")))?;
            if by_id.insert(id, (t.clone(), TokType::Normal)).is_some() {
                return Err(bad(src, format!("vocab id {id} given twice")));
            }
        }
        let mut specials = vec![];
        if let Some(added) = j.get("added_tokens") {
            let added = added.as_array().ok_or_else(|| bad(src, "added_tokens is not an array"))?;
            for (i, a) in added.iter().enumerate() {
                let id = a.get("id").and_then(J::as_u64).and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| bad(src, format!("added_tokens[{i}] has no valid id")))?;
                let content = a.get("content").and_then(J::as_str)
                    .ok_or_else(|| bad(src, format!("added_tokens[{i}] has no content")))?;
                let special = a.get("special").and_then(J::as_bool).unwrap_or(false);
                let ty = if special { TokType::Control } else { TokType::UserDefined };
                if let Some((t, _)) = by_id.get(&id) {
                    if t != content {
                        return Err(bad(src, format!("added_tokens[{i}] id {id} is {content:?} but the vocab has {t:?}")));
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
            let (t, ty) = by_id.remove(&i).ok_or_else(|| bad(src, format!("token ids are not contiguous: id {i} missing ({n} tokens)")))?;
            tokens.push(t);
            types.push(ty);
        }
        for (i, t) in tokens.iter().enumerate() {
            if byte_fallback && types[i] == TokType::Normal && t.len() == 6 && t.starts_with("<0x") && t.ends_with('>') {
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
            Some("Sequence") => norm.get("normalizers").and_then(J::as_array).map(|a| a.iter().collect()).unwrap_or_default(),
            Some(_) => vec![norm],
        };
        let mut replace_space = false;
        for nz in norm_list {
            match nz.get("type").and_then(J::as_str).unwrap_or("") {
                "NFC" => {}
                "Prepend" if nz.get("prepend").and_then(J::as_str) == Some("▁") => legacy_prefix = true,
                "Replace"
                    if nz.get("pattern").and_then(|p| p.get("String")).and_then(J::as_str) == Some(" ")
                        && nz.get("content").and_then(J::as_str) == Some("▁") =>
                {
                    replace_space = true
                }
                t => return Err(unsup(format!("normalizer {t:?} ({nz})"))),
            }
        }
        // pre-tokenizer
        let pt = j.get("pre_tokenizer").unwrap_or(&J::Null);
        let pt_list: Vec<&J> = match pt.get("type").and_then(J::as_str) {
            None => vec![],
            Some("Sequence") => pt.get("pretokenizers").and_then(J::as_array).map(|a| a.iter().collect()).unwrap_or_default(),
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
                    if one.get("add_prefix_space").and_then(J::as_bool).unwrap_or(true) { "always".into() } else { "never".into() }
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
                let pre = if one.get("use_regex").and_then(J::as_bool).unwrap_or(true) { Pre::Gpt2 } else { Pre::Whole };
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
                let re = split.get("pattern").and_then(|p| p.get("Regex")).and_then(J::as_str)
                    .ok_or_else(|| unsup(format!("Split pattern {}", desc(split))))?;
                let behavior = split.get("behavior").and_then(J::as_str).unwrap_or("");
                let invert = split.get("invert").and_then(J::as_bool).unwrap_or(false);
                if behavior != "Isolated" || invert {
                    return Err(unsup(format!("Split behavior {behavior:?} invert {invert}")));
                }
                let pre = pretok::pre_for_regex(re).ok_or_else(|| unsup(format!("Split regex {re:?} (known: gpt2, llama3, qwen2)")))?;
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
        let add_bos = cfg
            .as_ref()
            .and_then(|c| c.get("add_bos_token"))
            .and_then(J::as_bool)
            .unwrap_or(false);
        let scores = vec![0.0; tokens.len()];
        Tokenizer::build(
            Parts { tokens, types, scores, merges, model, prefix, prefix_unless_space: metaspace, bos, eos, unk, add_bos, specials: Some(specials) },
            src,
        )
    }

    /// Number of token ids.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The beginning-of-sequence token, when the model has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token, when the model has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether the model asks for a BOS in front of a prompt (`tokenizer.ggml.add_bos_token`,
    /// `add_bos_token` of tokenizer_config.json; llama.cpp's defaults when absent).
    pub fn add_bos_default(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// A token's text as stored (with "▁" or byte-level characters), or None for id >= vocab.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Text -> ids. `add_bos` prepends BOS when the model has one. Special tokens written in
    /// the text are recognised (see the module documentation). Invalid UTF-8 ->
    /// LLMRT_INVALID_ARGUMENT naming the byte offset.
    pub fn encode(&self, text: &[u8], add_bos: bool) -> Result<Vec<u32>> {
        let text = std::str::from_utf8(text).map_err(|e| {
            Error::invalid(format!("text is not valid UTF-8 at byte offset {}", e.valid_up_to()))
        })?;
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            if let Some(b) = self.bos {
                out.push(b);
            }
        }
        let mut prev_special = true;
        for (start, frag) in self.partition(text) {
            match frag {
                Frag::Special(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Frag::Text(t) => {
                    let pre = match self.prefix {
                        Prefix::Never => false,
                        Prefix::Always => prev_special,
                        Prefix::First => start == 0,
                    } && !(self.prefix_unless_space && t.starts_with(' '));
                    self.encode_fragment(t, pre, &mut out);
                    prev_special = false;
                }
            }
        }
        Ok(out)
    }

    /// Ids -> UTF-8 bytes (see the module documentation for what each token type gives).
    /// A single byte-fallback token may give partial UTF-8; concatenating consecutive pieces
    /// gives valid text. id >= vocab -> LLMRT_INVALID_ARGUMENT.
    pub fn decode(&self, ids: &[u32]) -> Result<Vec<u8>> {
        self.check_ids(ids)?;
        let mut out = Vec::new();
        let mut strip = self.prefix != Prefix::Never;
        for &id in ids {
            let p = self.piece(id);
            if p.is_empty() {
                continue;
            }
            if strip && p[0] == b' ' {
                out.extend_from_slice(&p[1..]);
            } else {
                out.extend_from_slice(&p);
            }
            strip = false;
        }
        Ok(out)
    }

    /// One token's bytes with no leading-space stripping (for streaming: the concatenation of
    /// the pieces of `encode(s)` is `s`, with the dummy-prefix space in front for
    /// SentencePiece kinds). id >= vocab -> LLMRT_INVALID_ARGUMENT.
    pub fn token_piece(&self, id: u32) -> Result<Vec<u8>> {
        self.check_ids(&[id])?;
        Ok(self.piece(id))
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        if let Some((i, &id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= self.tokens.len()) {
            return Err(Error::invalid(format!(
                "token id {id} at index {i} >= vocabulary size {}",
                self.tokens.len()
            )));
        }
        Ok(())
    }

    fn piece(&self, id: u32) -> Vec<u8> {
        let t = &self.tokens[id as usize];
        match self.types[id as usize] {
            TokType::Control | TokType::Unknown | TokType::Unused => vec![],
            TokType::UserDefined => t.as_bytes().to_vec(),
            TokType::Byte => match self.byte_ids.iter().position(|&b| b == Some(id)) {
                Some(b) => vec![b as u8],
                None => t.as_bytes().to_vec(),
            },
            TokType::Normal => match self.model {
                Model::Bpe { byte_level: true, .. } => {
                    let mut v = Vec::with_capacity(t.len());
                    for c in t.chars() {
                        match pretok::char_to_byte(c) {
                            Some(b) => v.push(b),
                            None => v.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                    v
                }
                _ => t.replace('▁', " ").into_bytes(),
            },
        }
    }

    /// llama.cpp's tokenizer_st_partition: each special token, longest first, splits the
    /// remaining text fragments at its occurrences. Yields (byte offset, fragment).
    fn partition<'a>(&self, text: &'a str) -> Vec<(usize, Frag<'a>)> {
        let mut frags: Vec<(usize, Frag<'a>)> = if text.is_empty() { vec![] } else { vec![(0, Frag::Text(text))] };
        for &sid in &self.specials {
            let s = self.tokens[sid as usize].as_str();
            if !frags.iter().any(|(_, f)| matches!(f, Frag::Text(t) if t.contains(s))) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for (off, f) in frags {
                match f {
                    Frag::Text(mut t) => {
                        let mut off = off;
                        while let Some(i) = t.find(s) {
                            if i > 0 {
                                next.push((off, Frag::Text(&t[..i])));
                            }
                            next.push((off + i, Frag::Special(sid)));
                            t = &t[i + s.len()..];
                            off += i + s.len();
                        }
                        if !t.is_empty() {
                            next.push((off, Frag::Text(t)));
                        }
                    }
                    sp => next.push((off, sp)),
                }
            }
            frags = next;
        }
        frags
    }

    fn encode_fragment(&self, t: &str, prefix: bool, out: &mut Vec<u32>) {
        match self.model {
            Model::Spm => {
                let s = escape(t, prefix);
                self.spm(&s, out);
            }
            Model::Bpe { byte_level: false, ignore_merges, .. } => {
                let s = escape(t, prefix);
                self.bpe_word(&s, ignore_merges, out);
            }
            Model::Bpe { byte_level: true, pre, ignore_merges } => {
                let cs: Vec<char> = t.chars().collect();
                let map = pretok::byte_to_char();
                let mut buf = [0u8; 4];
                for (a, b) in pretok::split(pre, &cs) {
                    let mut w = String::with_capacity((b - a) * 2);
                    for c in &cs[a..b] {
                        for &byte in c.encode_utf8(&mut buf).as_bytes() {
                            w.push(map[byte as usize]);
                        }
                    }
                    self.bpe_word(&w, ignore_merges, out);
                }
            }
        }
    }

    /// Bytes of `s` as byte-fallback tokens, or the unknown token, or nothing.
    fn fallback(&self, s: &str, out: &mut Vec<u32>) {
        let bytes = s.as_bytes();
        if bytes.iter().all(|&b| self.byte_ids[b as usize].is_some()) {
            out.extend(bytes.iter().map(|&b| self.byte_ids[b as usize].unwrap_or(0)));
        } else if let Some(u) = self.unk {
            out.push(u);
        }
    }

    /// SentencePiece BPE (llama.cpp llm_tokenizer_spm_session).
    fn spm(&self, s: &str, out: &mut Vec<u32>) {
        #[derive(Clone, Copy)]
        struct Sym {
            start: usize,
            len: usize,
            prev: usize,
            next: usize,
        }
        const NONE: usize = usize::MAX;
        let mut syms: Vec<Sym> = Vec::new();
        for (i, c) in s.char_indices() {
            let k = syms.len();
            syms.push(Sym { start: i, len: c.len_utf8(), prev: if k == 0 { NONE } else { k - 1 }, next: k + 1 });
        }
        if let Some(l) = syms.last_mut() {
            l.next = NONE;
        }
        #[derive(PartialEq)]
        struct Big {
            score: f32,
            left: usize,
            right: usize,
            size: usize,
        }
        impl Eq for Big {}
        impl Ord for Big {
            fn cmp(&self, o: &Self) -> std::cmp::Ordering {
                self.score.total_cmp(&o.score).then(o.left.cmp(&self.left))
            }
        }
        impl PartialOrd for Big {
            fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(o))
            }
        }
        let mut heap = std::collections::BinaryHeap::new();
        let try_add = |heap: &mut std::collections::BinaryHeap<Big>, syms: &[Sym], l: usize, r: usize| {
            if l == NONE || r == NONE {
                return;
            }
            let a = syms[l].start;
            let size = syms[l].len + syms[r].len;
            if let Some(&id) = self.ids.get(&s[a..a + size]) {
                heap.push(Big { score: self.scores[id as usize], left: l, right: r, size });
            }
        };
        for i in 1..syms.len() {
            try_add(&mut heap, &syms, i - 1, i);
        }
        while let Some(b) = heap.pop() {
            let (l, r) = (b.left, b.right);
            if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != b.size || syms[l].next != r {
                continue;
            }
            syms[l].len += syms[r].len;
            syms[r].len = 0;
            syms[l].next = syms[r].next;
            if syms[r].next != NONE {
                let n = syms[r].next;
                syms[n].prev = l;
            }
            try_add(&mut heap, &syms, syms[l].prev, l);
            try_add(&mut heap, &syms, l, syms[l].next);
        }
        let mut i = if syms.is_empty() { NONE } else { 0 };
        while i != NONE {
            let p = &s[syms[i].start..syms[i].start + syms[i].len];
            match self.ids.get(p) {
                Some(&id) => out.push(id),
                None => self.fallback(p, out),
            }
            i = syms[i].next;
        }
    }

    /// Rank-driven BPE of one word (llama.cpp llm_tokenizer_bpe_session / HF BPE).
    fn bpe_word(&self, w: &str, ignore_merges: bool, out: &mut Vec<u32>) {
        if w.is_empty() {
            return;
        }
        if ignore_merges {
            if let Some(&id) = self.ids.get(w) {
                out.push(id);
                return;
            }
        }
        const NONE: usize = usize::MAX;
        // (char start, char len, id, prev, next)
        struct Sym {
            start: usize,
            len: usize,
            id: Option<u32>,
            prev: usize,
            next: usize,
        }
        let mut syms: Vec<Sym> = Vec::new();
        for (i, c) in w.char_indices() {
            let k = syms.len();
            let id = self.ids.get(&w[i..i + c.len_utf8()]).copied();
            syms.push(Sym { start: i, len: c.len_utf8(), id, prev: if k == 0 { NONE } else { k - 1 }, next: k + 1 });
        }
        if let Some(l) = syms.last_mut() {
            l.next = NONE;
        }
        // min-heap on (rank, left)
        use std::cmp::Reverse;
        // (rank, left, right, left id, right id)
        type Entry = Reverse<(u32, usize, usize, u32, u32)>;
        let mut heap: std::collections::BinaryHeap<Entry> = Default::default();
        let rank_of = |syms: &[Sym], l: usize, r: usize| -> Option<(u32, u32, u32, u32)> {
            let (a, b) = (syms[l].id?, syms[r].id?);
            self.ranks.get(&(a, b)).map(|&(rank, m)| (rank, a, b, m))
        };
        for i in 1..syms.len() {
            if let Some((rank, a, b, _)) = rank_of(&syms, i - 1, i) {
                heap.push(Reverse((rank, i - 1, i, a, b)));
            }
        }
        while let Some(Reverse((_, l, r, a, b))) = heap.pop() {
            if syms[l].len == 0 || syms[r].len == 0 || syms[l].next != r || syms[l].id != Some(a) || syms[r].id != Some(b) {
                continue;
            }
            let Some(&(_, m)) = self.ranks.get(&(a, b)) else { continue };
            syms[l].len += syms[r].len;
            syms[l].id = Some(m);
            syms[r].len = 0;
            syms[l].next = syms[r].next;
            if syms[r].next != NONE {
                let n = syms[r].next;
                syms[n].prev = l;
            }
            let p = syms[l].prev;
            if p != NONE {
                if let Some((rank, a, b, _)) = rank_of(&syms, p, l) {
                    heap.push(Reverse((rank, p, l, a, b)));
                }
            }
            let n = syms[l].next;
            if n != NONE {
                if let Some((rank, a, b, _)) = rank_of(&syms, l, n) {
                    heap.push(Reverse((rank, l, n, a, b)));
                }
            }
        }
        let mut i = 0;
        while i != NONE {
            match syms[i].id {
                Some(id) => out.push(id),
                None => self.fallback(&w[syms[i].start..syms[i].start + syms[i].len], out),
            }
            i = syms[i].next;
        }
    }
}

enum Frag<'a> {
    Text(&'a str),
    Special(u32),
}

/// " " -> "▁", with a leading "▁" when `prefix`.
fn escape(t: &str, prefix: bool) -> String {
    let mut s = String::with_capacity(t.len() + 3);
    if prefix {
        s.push('▁');
    }
    for c in t.chars() {
        s.push(if c == ' ' { '▁' } else { c });
    }
    s
}

/// "left right" split at the first space after the first character (llama.cpp).
fn split_merge(m: &str) -> Option<(String, String)> {
    let first = m.chars().next()?;
    let i = m[first.len_utf8()..].find(' ')? + first.len_utf8();
    let (a, b) = (&m[..i], &m[i + 1..]);
    if a.is_empty() || b.is_empty() {
        return None;
    }
    Some((a.to_string(), b.to_string()))
}

fn check_byte_level(v: &serde_json::Value, src: &str) -> Result<()> {
    if v.get("add_prefix_space").and_then(serde_json::Value::as_bool).unwrap_or(false) {
        return Err(Error::unsupported(format!("{src}: ByteLevel add_prefix_space = true")));
    }
    Ok(())
}

fn gguf_strings(g: &Gguf, key: &str, src: &str) -> Result<Option<Vec<String>>> {
    match g.get(key) {
        None => Ok(None),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::Str(s) => Ok(s.clone()),
                _ => Err(bad(src, format!("{key}[{i}] is {}, expected STRING", v.type_name()))),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some),
        Some(v) => Err(bad(src, format!("{key} is {}, expected an ARRAY of STRING", v.type_name()))),
    }
}

// ------------------------------------------------------------------ minimal protobuf reader

enum PVal<'a> {
    Varint(u64),
    Fixed64,
    Fixed32(u32),
    Bytes(&'a [u8]),
}

struct PField<'a> {
    num: u64,
    val: PVal<'a>,
}

fn proto_fields<'a>(b: &'a [u8], src: &str) -> Result<Vec<PField<'a>>> {
    let mut out = Vec::new();
    let mut p = 0usize;
    let err = |p: usize, what: &str| bad(src, format!("malformed sentencepiece model at byte {p}: {what}"));
    let varint = |p: &mut usize| -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *b.get(*p)?;
            *p += 1;
            v |= ((byte & 0x7F) as u64) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    };
    while p < b.len() {
        let at = p;
        let key = varint(&mut p).ok_or_else(|| err(at, "bad varint"))?;
        let (num, wt) = (key >> 3, key & 7);
        let val = match wt {
            0 => PVal::Varint(varint(&mut p).ok_or_else(|| err(at, "bad varint"))?),
            1 => {
                let s = b.get(p..p + 8).ok_or_else(|| err(at, "truncated fixed64"))?;
                p += 8;
                let _ = s;
                PVal::Fixed64
            }
            2 => {
                let len = varint(&mut p).ok_or_else(|| err(at, "bad length"))?;
                let len = usize::try_from(len).map_err(|_| err(at, "length too large"))?;
                let end = p.checked_add(len).filter(|&e| e <= b.len()).ok_or_else(|| err(at, "truncated field"))?;
                let s = &b[p..end];
                p = end;
                PVal::Bytes(s)
            }
            5 => {
                let s = b.get(p..p + 4).ok_or_else(|| err(at, "truncated fixed32"))?;
                p += 4;
                PVal::Fixed32(u32::from_le_bytes(s.try_into().unwrap_or([0; 4])))
            }
            _ => return Err(err(at, &format!("wire type {wt}"))),
        };
        out.push(PField { num, val });
    }
    Ok(out)
}
