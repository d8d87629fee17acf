//! The tokenizer bridge: llguidance's token environment (a `toktrie::TokTrie` over every
//! token id's bytes, plus a tokenize function) built from a model's own [`Tokenizer`].
//!
//! Token bytes (what the grammar sees a token produce):
//! - control, unknown and unused tokens (BOS, EOS, `<unk>`, `<|im_end|>`, ...; HF added tokens
//!   marked special): `0xFF` followed by the token's text, llguidance's special-token marker,
//!   so they never match grammar text (a Lark grammar may still name them as `<|...|>`);
//! - every other token: its bytes as they appear inside a text, i.e. `Tokenizer::token_piece`
//!   (byte-fallback `<0xNN>` tokens give their byte, SentencePiece "▁" gives a space,
//!   byte-level BPE goes through its byte decoder, user-defined tokens give their text);
//! - a token with no bytes at all, and the ids past the tokenizer's vocabulary up to the
//!   model's (embedding rows no tokenizer entry names): empty, which no grammar ever allows.
//!
//! End of sequence: the model's end-of-generation ids (`crate::chat::eog`), the first being
//! the model's EOS where it is one of them.
//!
//! Tokenize (used by llguidance only to turn forced bytes into tokens): llmrt's encoder
//! (no BOS, special-token texts left as text), kept when its tokens' bytes are exactly the
//! input; otherwise (a SentencePiece dummy-prefix space, invalid UTF-8) the trie's greedy
//! longest-match tokenization, which always reproduces the bytes.

use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// llguidance's token environment over an llmrt tokenizer.
pub(crate) struct Env {
    trie: TokTrie,
    tokenizer: Tokenizer,
    canonical: bool,
}

/// Every token id's bytes (see the module documentation); `vocab` entries.
pub(crate) fn token_bytes(tok: &Tokenizer, vocab: usize) -> Result<Vec<Vec<u8>>> {
    let mut words = crate::util::try_with_capacity::<Vec<u8>>(vocab, "the grammar token table")?;
    for id in 0..vocab as u32 {
        let text = tok.token_text(id).unwrap_or("");
        let piece = if (id as usize) < tok.vocab_size() { tok.token_piece(id)? } else { Vec::new() };
        let bytes = if piece.is_empty() && !text.is_empty() {
            // No text when decoded (control / unknown / unused): a special token.
            let mut b = Vec::with_capacity(text.len() + 1);
            b.push(TokTrie::SPECIAL_TOKEN_MARKER);
            b.extend_from_slice(text.as_bytes());
            b
        } else {
            piece
        };
        if bytes.len() > u32::MAX as usize / 2 {
            return Err(Error::bad_model(format!("token {id} is {} bytes long", bytes.len())));
        }
        words.push(bytes);
    }
    Ok(words)
}

impl Env {
    /// The environment for a model of `vocab` ids (>= the tokenizer's), ending on `eos`
    /// (non-empty, ids below `vocab`; the first is the one a finished grammar gives).
    pub(crate) fn build(tok: &Tokenizer, vocab: usize, eos: &[u32]) -> Result<TokEnv> {
        if vocab == 0 || vocab > u32::MAX as usize / 2 || eos.is_empty() || eos.iter().any(|&e| e as usize >= vocab) {
            return Err(Error::internal(format!("grammar environment for vocab {vocab}, eos {eos:?}")));
        }
        let words = token_bytes(tok, vocab)?;
        let total: usize = words.iter().map(Vec::len).sum();
        if total > u32::MAX as usize {
            return Err(Error::bad_model(format!("the vocabulary's tokens are {total} bytes in all (at most 4 GiB)")));
        }
        let mut info = TokRxInfo::new(vocab as u32, eos[0]);
        info.tok_bos = tok.bos().filter(|&b| (b as usize) < vocab);
        info.tok_unk = tok.unk().filter(|&u| (u as usize) < vocab);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        let mut env = Env { trie, tokenizer: tok.clone(), canonical: true };
        // Canonical (its tokenization of a text is the model's): only when the encoder
        // reproduces plain texts byte for byte (no dummy-prefix space).
        env.canonical = ["a", "hello world", "{\"x\": 1}"].iter().all(|s| env.encode_exact(s.as_bytes()).is_some());
        Ok(Arc::new(env))
    }

    /// llmrt's encoding of `s` when its tokens' bytes are exactly `s`.
    fn encode_exact(&self, s: &[u8]) -> Option<Vec<TokenId>> {
        let ids = self.tokenizer.encode_with(s, false, false).ok()?;
        let mut pos = 0;
        for &id in &ids {
            let b = self.trie.token(id);
            if !s[pos..].starts_with(b) || b.is_empty() {
                return None;
            }
            pos += b.len();
        }
        (pos == s.len()).then_some(ids)
    }
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.encode_exact(s).unwrap_or_else(|| self.trie.greedy_tokenize(s))
    }

    fn tokenize_is_canonical(&self) -> bool {
        self.canonical
    }
}
