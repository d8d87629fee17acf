//! Generation: a prompt, then sampled (or greedy) tokens until an end-of-generation
//! id, a token budget, the caller's "stop" or a full cache ([`Model::generate`]).
//!
//! Built on the atomic steps only: the prompt but its last token is one prefill, then
//! every step is one `decode_sample` (or `decode_greedy`) of a single cache, so each
//! token is the one those calls give (the draw is a function of the seed and the
//! position) and a failing step changes nothing of its own.

use crate::sample::SamplerParams;
use crate::{Error, Model, Status};

pub use crate::ffi::llmrt_stop_reason as StopReason;

/// What [`Model::generate`] produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generated {
    /// The generated ids, in order (an end-of-generation id last when that stopped it).
    /// The cache holds the prompt and every one of them but the last.
    pub tokens: Vec<u32>,
    pub reason: StopReason,
}

/// A generation failed part-way: what was generated before the failing step (the cache
/// holds the prompt and all of it but the last token), and the step's error.
#[derive(Clone, Debug)]
pub struct GenerateError {
    pub tokens: Vec<u32>,
    pub error: Error,
}

impl Model {
    /// Feeds `prompt` (at least one token: to continue a generation, pass its last
    /// token) to `cache`, then generates up to `max_tokens` tokens, each sampled with
    /// `params` (`None`: greedy) from the previous step's logits. After each token that
    /// is not an end-of-generation id, `on_token(id, piece)` is called with the token's
    /// text piece (empty without a tokenizer, and for control tokens); it returns false
    /// to stop.
    pub fn generate(
        &self,
        cache: u64,
        prompt: &[u32],
        params: Option<&SamplerParams>,
        max_tokens: u32,
        on_token: &mut dyn FnMut(u32, &[u8]) -> bool,
    ) -> std::result::Result<Generated, GenerateError> {
        let fail = |tokens: Vec<u32>, error: Error| GenerateError { tokens, error };
        let Some((&last, head)) = prompt.split_last() else {
            return Err(fail(Vec::new(), Error::invalid(format!("generate on cache {cache} with n_prompt = 0"))));
        };
        if max_tokens == 0 {
            return Err(fail(Vec::new(), Error::invalid("generate with max_tokens = 0")));
        }
        if let Some(p) = params {
            p.validate_for(self.info().vocab_size as usize).map_err(|e| fail(Vec::new(), e))?;
        }
        // Validate the whole prompt before the head's prefill changes anything.
        if let Some((i, &t)) = prompt.iter().enumerate().find(|(_, &t)| t >= self.info().vocab_size) {
            let e = Error::invalid(format!(
                "prompt token {t} at index {i} is outside the vocabulary (size {})",
                self.info().vocab_size
            ));
            return Err(fail(Vec::new(), e));
        }
        let reserved = self.cache_capacity(cache).map_err(|e| fail(Vec::new(), e))?;
        let len = self.cache_length(cache).map_err(|e| fail(Vec::new(), e))?;
        if len as u64 + prompt.len() as u64 > reserved as u64 {
            let e = Error::context_full(format!(
                "generate: cache {cache} holds {len} of {reserved} positions; a prompt of {} does not fit",
                prompt.len()
            ));
            return Err(fail(Vec::new(), e));
        }
        if !head.is_empty() {
            self.prefill(cache, head, None, false).map_err(|e| fail(Vec::new(), e))?;
        }
        let mut out: Vec<u32> = Vec::new();
        let mut feed = last;
        loop {
            if self.cache_length(cache).map_err(|e| fail(out.clone(), e))? >= reserved {
                return Ok(Generated { tokens: out, reason: StopReason::LLMRT_STOP_CONTEXT_FULL });
            }
            let mut next = [0u32];
            let step = match params {
                Some(p) => self.decode_sample(&[cache], &[feed], p, &mut next),
                None => self.decode_greedy(&[cache], &[feed], &mut next),
            };
            step.map_err(|e| fail(out.clone(), e))?;
            let t = next[0];
            out.try_reserve(1).map_err(|_| fail(out.clone(), Error::out_of_memory("the generated token list")))?;
            out.push(t);
            if self.is_eog(t) {
                return Ok(Generated { tokens: out, reason: StopReason::LLMRT_STOP_EOG });
            }
            let piece = match self.token_piece(t) {
                Ok(p) => p,
                Err(e) if e.status == Status::LLMRT_UNSUPPORTED => Vec::new(),
                Err(e) => return Err(fail(out, e)),
            };
            if !on_token(t, &piece) {
                return Ok(Generated { tokens: out, reason: StopReason::LLMRT_STOP_CALLBACK });
            }
            if out.len() >= max_tokens as usize {
                return Ok(Generated { tokens: out, reason: StopReason::LLMRT_STOP_MAX_TOKENS });
            }
            feed = t;
        }
    }
}
