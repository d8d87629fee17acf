//! Perplexity of a model over a text, by llama.cpp's `llama-perplexity` method
//! (its default mode, `tools/perplexity/perplexity.cpp`), so the two numbers compare:
//!
//! - the text is tokenized whole, with BOS first where the tokenizer asks for one
//!   (as `llama-perplexity -f FILE`, which first drops one trailing newline of the file:
//!   [`perplexity_of_file_text`] does the same);
//! - the tokens are cut into `n_chunk = n_tokens / n_ctx` chunks of `n_ctx` (the rest is
//!   left out; at least two chunks' worth of tokens are required, as there);
//! - each chunk runs as one prefill into an empty cache, its first token replaced by BOS
//!   when the tokenizer adds one;
//! - only the second half is scored: the logits at positions `n_ctx/2 ..= n_ctx-2`
//!   predict the tokens at `n_ctx/2+1 ..= n_ctx-1` (`n_ctx - 1 - n_ctx/2` per chunk), so
//!   every scored token has at least half a context before it;
//! - the negative log-likelihood of each is `logsumexp(row) - row[token]` (here in f64
//!   throughout; llama.cpp sums f32 `expf` terms in a double), and the perplexity is
//!   `exp(mean)`. The `±` is llama.cpp's: the standard error of the mean NLL times the
//!   perplexity.

use crate::runtime::Model;
use crate::util::try_vec;
use crate::{Error, Result};

/// One perplexity run's result.
#[derive(Clone, Debug, PartialEq)]
pub struct Perplexity {
    /// `exp(mean NLL)`.
    pub ppl: f64,
    /// llama.cpp's uncertainty: the standard error of the mean NLL, times `ppl`.
    pub ppl_err: f64,
    /// The mean negative log-likelihood (nats per token).
    pub nll: f64,
    /// Tokens of the text (BOS included).
    pub tokens: usize,
    /// Chunks of `n_ctx` evaluated.
    pub chunks: usize,
    /// Tokens scored (`chunks * (n_ctx - 1 - n_ctx/2)`).
    pub scored: usize,
    pub n_ctx: usize,
    /// Running perplexity after each chunk (llama-perplexity's `[i]value` line).
    pub per_chunk: Vec<f64>,
}

/// `logsumexp(row) - row[token]` in f64.
fn nll_of(row: &[f32], token: u32) -> f64 {
    let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    max + sum.ln() - row[token as usize] as f64
}

/// Perplexity of `tokens` (already tokenized, BOS first where wanted) in chunks of
/// `n_ctx`; `bos`: the token each chunk's first token is replaced with (`None`: left as
/// it is, llama.cpp's choice for a tokenizer that adds no BOS).
pub fn perplexity_of_tokens(model: &Model, tokens: &[u32], n_ctx: usize, bos: Option<u32>) -> Result<Perplexity> {
    let context = model.info().context_length as usize;
    if n_ctx < 4 || n_ctx > context {
        return Err(Error::invalid(format!(
            "perplexity context {n_ctx}: must be at least 4 and at most the model's context {context}"
        )));
    }
    if tokens.len() < 2 * n_ctx {
        return Err(Error::invalid(format!(
            "perplexity with a context of {n_ctx} needs at least {} tokens; the text has {}",
            2 * n_ctx,
            tokens.len()
        )));
    }
    let vocab = model.info().vocab_size as usize;
    let rows = n_ctx.checked_mul(vocab).ok_or_else(|| Error::invalid("perplexity logits size overflows"))?;
    let mut logits = try_vec(rows, 0f32, "the perplexity chunk's logits")?;
    let first = n_ctx / 2;
    let n_chunk = tokens.len() / n_ctx;
    let cache = model.cache_reserve(n_ctx as u32)?;
    let run = (|| {
        let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
        let mut per_chunk = Vec::with_capacity(n_chunk);
        let mut chunk = tokens[..n_ctx].to_vec();
        for c in 0..n_chunk {
            chunk.copy_from_slice(&tokens[c * n_ctx..(c + 1) * n_ctx]);
            if let Some(b) = bos {
                chunk[0] = b;
            }
            model.cache_truncate(cache, 0)?;
            model.prefill(cache, &chunk, Some(&mut logits), true)?;
            for i in first..n_ctx - 1 {
                let v = nll_of(&logits[i * vocab..(i + 1) * vocab], chunk[i + 1]);
                nll += v;
                nll2 += v * v;
            }
            count += n_ctx - 1 - first;
            per_chunk.push((nll / count as f64).exp());
        }
        let mean = nll / count as f64;
        let var = nll2 / count as f64 - mean * mean;
        let ppl = mean.exp();
        let ppl_err = if var > 0.0 && count > 1 { (var / (count - 1) as f64).sqrt() * ppl } else { 0.0 };
        Ok(Perplexity {
            ppl,
            ppl_err,
            nll: mean,
            tokens: tokens.len(),
            chunks: n_chunk,
            scored: count,
            n_ctx,
            per_chunk,
        })
    })();
    let released = model.cache_release(cache);
    let r = run?;
    released?;
    Ok(r)
}

/// Perplexity of `text`, tokenized by the model (BOS first where its tokenizer adds
/// one, and then as each chunk's first token), in chunks of `n_ctx` (0: the model's
/// context length).
pub fn perplexity_of_text(model: &Model, text: &[u8], n_ctx: usize) -> Result<Perplexity> {
    let n_ctx = if n_ctx == 0 { model.info().context_length as usize } else { n_ctx };
    let tokens = model.tokenize(text, true)?;
    // Whether the tokenizer adds BOS: it does so even in front of an empty text.
    let bos = match model.tokenize(b"", true)?.as_slice() {
        [b] => Some(*b),
        _ => None,
    };
    perplexity_of_tokens(model, &tokens, n_ctx, bos)
}

/// The text `llama-perplexity -f FILE` evaluates: the file's bytes less one trailing `\n`.
pub fn perplexity_of_file_text(bytes: &[u8]) -> &[u8] {
    bytes.strip_suffix(b"\n").unwrap_or(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_is_a_log_softmax() {
        // uniform over 4: ln 4 for any token
        assert!((nll_of(&[1.0; 4], 2) - 4f64.ln()).abs() < 1e-12);
        // large logits do not overflow: [1000, 0] -> token 0 costs ln(1 + e^-1000) ~ 0
        assert!(nll_of(&[1000.0, 0.0], 0).abs() < 1e-12);
        assert!((nll_of(&[1000.0, 0.0], 1) - 1000.0).abs() < 1e-9);
        let row = [0.5f32, -1.0, 2.0];
        let z: f64 = row.iter().map(|&v| (v as f64).exp()).sum();
        assert!((nll_of(&row, 1) - (z.ln() + 1.0)).abs() < 1e-12);
    }

    #[test]
    fn file_text_drops_one_newline() {
        assert_eq!(perplexity_of_file_text(b"a\n\n"), b"a\n");
        assert_eq!(perplexity_of_file_text(b"a"), b"a");
    }
}
