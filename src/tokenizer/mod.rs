//! Tokenizers: text <-> token ids, with llama.cpp's semantics.
//!
//! Two kinds:
//! - SentencePiece BPE (`tokenizer.ggml.model = "llama"`, a sentencepiece `.model` of type BPE):
//!   spaces become "▁", a dummy-prefix "▁" starts the text (and every text fragment after a
//!   special token, as llama.cpp does), the adjacent pair whose concatenation is the
//!   highest-scoring vocabulary piece is merged first (leftmost on ties), characters that end up
//!   as no piece fall back to `<0xXX>` byte tokens, or to the unknown token.
//! - BPE with merge ranks (`gpt2` in GGUF, model type `BPE` in a tokenizer.json): byte-level
//!   (GPT-2 byte-to-unicode map, split by the pre-tokenizer: llama.cpp's `default`, `gpt2`,
//!   `llama3`, `qwen2`, `qwen35`, `deepseek-llm`, `deepseek-coder`, `falcon`, `starcoder`
//!   and their aliases, see `pretok.rs`), or SentencePiece-style (Metaspace "▁", byte
//!   fallback) from a tokenizer.json or GGUF `gemma4` (split into runs of newlines and of
//!   other characters; a run of newlines that is a token is that token). The lowest-ranked
//!   adjacent pair merges first, leftmost on ties; `ignore_merges` (llama3) takes a whole word
//!   that is in the vocabulary as is.
//!
//! Special tokens in text: every CONTROL, USER_DEFINED and UNKNOWN token (GGUF/sentencepiece
//! types), and every `added_tokens` entry of a tokenizer.json, written literally in the text is
//! that token (llama.cpp `parse_special = true`), longest first. With
//! [`Tokenizer::encode_with`]`(.., parse_special = false)` only USER_DEFINED ones are.
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
//!
//! Files: this one holds the [`Tokenizer`] type, its shared construction (`build`) and the
//! encode/decode API; `load_gguf.rs`, `load_sp_model.rs` (with `protobuf.rs`) and
//! `load_hf_json.rs` are the three loaders; `spm.rs` and `bpe.rs` the two encoders;
//! `pretok.rs` the byte-level pre-tokenizers and byte map.

mod bpe;
mod load_gguf;
mod load_hf_json;
mod load_sp_model;
mod normalize;
mod pretok;
mod protobuf;
mod spm;

use std::collections::HashMap;

use crate::error::{Error, Result};
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
    /// tokenizer.json normalizer steps (empty for GGUF and sentencepiece models).
    normalizer: Vec<normalize::Norm>,
}

/// `LLMRT_OUT_OF_MEMORY` for a tokenizer buffer of `elems` values of `T` named `what`.
fn oom<T>(what: &str, elems: usize) -> Error {
    Error::out_of_memory(format!(
        "tokenizer: cannot allocate {what} ({} bytes)",
        elems.saturating_mul(std::mem::size_of::<T>())
    ))
}

/// Room for `extra` more values in `v`, or `LLMRT_OUT_OF_MEMORY` naming `what` and
/// the size: every buffer sized by the input text (or ids) grows through this or
/// [`try_push`], so a huge prompt under a memory limit is an error, not an abort.
pub(crate) fn try_grow<T>(v: &mut Vec<T>, extra: usize, what: &str) -> Result<()> {
    v.try_reserve(extra).map_err(|_| oom::<T>(what, v.len().saturating_add(extra)))
}

/// `v.push(x)` whose growth is fallible (see [`try_grow`]).
pub(crate) fn try_push<T>(v: &mut Vec<T>, x: T, what: &str) -> Result<()> {
    if v.len() == v.capacity() {
        try_grow(v, 1, what)?;
    }
    v.push(x);
    Ok(())
}

/// Room in a heap for one more entry (see [`try_grow`]).
pub(crate) fn try_heap_room<T: Ord>(h: &mut std::collections::BinaryHeap<T>, what: &str) -> Result<()> {
    if h.len() == h.capacity() {
        h.try_reserve(1).map_err(|_| oom::<T>(what, h.len().saturating_add(1)))?;
    }
    Ok(())
}

/// The ids out of an encode.
const IDS: &str = "the token ids";

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
    /// tokenizer.json normalizer steps for the text between special tokens.
    normalizer: Vec<normalize::Norm>,
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
            return Err(bad(
                src,
                format!(
                    "inconsistent tokenizer: {} tokens, {} token types, {} scores",
                    n,
                    p.types.len(),
                    p.scores.len()
                ),
            ));
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
                ids.get(s)
                    .copied()
                    .ok_or_else(|| bad(src, format!("merge {} ({a:?} {b:?}) names {s:?}, which is not a token", r)))
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
                .filter(|&i| matches!(p.types[i as usize], TokType::Control | TokType::UserDefined | TokType::Unknown))
                .collect(),
        };
        specials.retain(|&i| (i as usize) < n && !p.tokens[i as usize].is_empty());
        specials.sort_by(|&a, &b| p.tokens[b as usize].len().cmp(&p.tokens[a as usize].len()).then(a.cmp(&b)));
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
            normalizer: p.normalizer,
        })
    }

    /// Number of token ids.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The beginning-of-sequence token, when the model has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The unknown token, when the model has one.
    pub fn unk(&self) -> Option<u32> {
        self.unk
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

    /// The id of the special token (one matched in text: control, user-defined, HF added)
    /// whose text is `text`.
    pub fn special_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied().filter(|id| self.specials.contains(id))
    }

    /// Text -> ids. `add_bos` prepends BOS when the model has one. Special tokens written in
    /// the text are recognised (see the module documentation). Invalid UTF-8 ->
    /// LLMRT_INVALID_ARGUMENT naming the byte offset.
    pub fn encode(&self, text: &[u8], add_bos: bool) -> Result<Vec<u32>> {
        self.encode_with(text, add_bos, true)
    }

    /// [`Tokenizer::encode`] with llama.cpp's `parse_special` choice: when false, control and
    /// unknown tokens written in the text are tokenized as text (user-defined tokens are still
    /// matched, as llama.cpp and HF tokenizers do).
    pub fn encode_with(&self, text: &[u8], add_bos: bool, parse_special: bool) -> Result<Vec<u32>> {
        let text = std::str::from_utf8(text)
            .map_err(|e| Error::invalid(format!("text is not valid UTF-8 at byte offset {}", e.valid_up_to())))?;
        let mut out = Vec::new();
        try_grow(&mut out, text.len() / 3 + 2, IDS)?;
        if add_bos {
            if let Some(b) = self.bos {
                try_push(&mut out, b, IDS)?;
            }
        }
        let mut prev_special = true;
        for (start, frag) in self.partition(text, parse_special)? {
            match frag {
                Frag::Special(id) => {
                    try_push(&mut out, id, IDS)?;
                    prev_special = true;
                }
                Frag::Text(t) => {
                    let pre = match self.prefix {
                        Prefix::Never => false,
                        Prefix::Always => prev_special,
                        Prefix::First => start == 0,
                    } && !(self.prefix_unless_space && t.starts_with(' '));
                    if self.normalizer.is_empty() {
                        self.encode_fragment(t, pre, &mut out)?;
                    } else {
                        let t = normalize::apply(&self.normalizer, t);
                        self.encode_fragment(&t, pre, &mut out)?;
                    }
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
            let p = if strip && p[0] == b' ' { &p[1..] } else { &p[..] };
            try_grow(&mut out, p.len(), "the decoded text")?;
            out.extend_from_slice(p);
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
            return Err(Error::invalid(format!("token id {id} at index {i} >= vocabulary size {}", self.tokens.len())));
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
    fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Result<Vec<(usize, Frag<'a>)>> {
        const FRAGS: &str = "the text fragments around special tokens";
        let mut frags: Vec<(usize, Frag<'a>)> = if text.is_empty() { vec![] } else { vec![(0, Frag::Text(text))] };
        for &sid in &self.specials {
            if !parse_special && matches!(self.types[sid as usize], TokType::Control | TokType::Unknown) {
                continue;
            }
            let s = self.tokens[sid as usize].as_str();
            if !frags.iter().any(|(_, f)| matches!(f, Frag::Text(t) if t.contains(s))) {
                continue;
            }
            let mut next = Vec::new();
            try_grow(&mut next, frags.len() + 2, FRAGS)?;
            for (off, f) in frags {
                match f {
                    Frag::Text(mut t) => {
                        let mut off = off;
                        while let Some(i) = t.find(s) {
                            if i > 0 {
                                try_push(&mut next, (off, Frag::Text(&t[..i])), FRAGS)?;
                            }
                            try_push(&mut next, (off + i, Frag::Special(sid)), FRAGS)?;
                            t = &t[i + s.len()..];
                            off += i + s.len();
                        }
                        if !t.is_empty() {
                            try_push(&mut next, (off, Frag::Text(t)), FRAGS)?;
                        }
                    }
                    sp => try_push(&mut next, (off, sp), FRAGS)?,
                }
            }
            frags = next;
        }
        Ok(frags)
    }

    fn encode_fragment(&self, t: &str, prefix: bool, out: &mut Vec<u32>) -> Result<()> {
        match self.model {
            Model::Spm => {
                let s = escape(t, prefix)?;
                self.spm(&s, out)
            }
            Model::Bpe { byte_level: false, ignore_merges, pre } => {
                let s = escape(t, prefix)?;
                if pre != Pre::Newlines {
                    return self.bpe_word(&s, ignore_merges, out);
                }
                // runs of newlines and of other characters; a run of newlines that is a token
                // is that token (llama.cpp's gemma4 rule), else it goes through the merges
                let mut rest = s.as_str();
                while let Some(c) = rest.chars().next() {
                    let nl = c == '\n';
                    let end = rest.find(|x: char| (x == '\n') != nl).unwrap_or(rest.len());
                    let (w, r) = rest.split_at(end);
                    match self.ids.get(w) {
                        Some(&id) if nl => try_push(out, id, IDS)?,
                        _ => self.bpe_word(w, ignore_merges, out)?,
                    }
                    rest = r;
                }
                Ok(())
            }
            Model::Bpe { byte_level: true, pre, ignore_merges } => {
                let mut cs: Vec<char> = Vec::new();
                try_grow(&mut cs, t.len(), "the text's characters")?;
                cs.extend(t.chars());
                let map = pretok::byte_to_char();
                let mut buf = [0u8; 4];
                for (a, b) in pretok::split(pre, &cs)? {
                    // Each byte maps to one char of at most 2 UTF-8 bytes.
                    let need: usize = cs[a..b].iter().map(|c| c.len_utf8() * 2).sum();
                    let mut w = String::new();
                    w.try_reserve_exact(need).map_err(|_| oom::<u8>("a pre-tokenized word", need))?;
                    for c in &cs[a..b] {
                        for &byte in c.encode_utf8(&mut buf).as_bytes() {
                            w.push(map[byte as usize]);
                        }
                    }
                    self.bpe_word(&w, ignore_merges, out)?;
                }
                Ok(())
            }
        }
    }

    /// Bytes of `s` as byte-fallback tokens, or the unknown token, or nothing.
    fn fallback(&self, s: &str, out: &mut Vec<u32>) -> Result<()> {
        let bytes = s.as_bytes();
        if bytes.iter().all(|&b| self.byte_ids[b as usize].is_some()) {
            try_grow(out, bytes.len(), IDS)?;
            out.extend(bytes.iter().map(|&b| self.byte_ids[b as usize].unwrap_or(0)));
        } else if let Some(u) = self.unk {
            try_push(out, u, IDS)?;
        }
        Ok(())
    }
}

enum Frag<'a> {
    Text(&'a str),
    Special(u32),
}

/// " " -> "▁", with a leading "▁" when `prefix` (allocated fallibly, exactly).
fn escape(t: &str, prefix: bool) -> Result<String> {
    // "▁" is 3 bytes where " " was 1.
    let need = t.len() + 2 * t.bytes().filter(|&b| b == b' ').count() + 3;
    let mut s = String::new();
    s.try_reserve_exact(need).map_err(|_| oom::<u8>("the escaped text", need))?;
    if prefix {
        s.push('▁');
    }
    for c in t.chars() {
        s.push(if c == ' ' { '▁' } else { c });
    }
    Ok(s)
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
