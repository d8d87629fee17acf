//! Grammar-constrained decoding through llguidance (the structured-output engine of
//! llama.cpp, mistral.rs and vLLM): JSON Schema, regular expressions and Lark grammars.
//!
//! - `env.rs`: the tokenizer bridge (llguidance's token trie over the model's vocabulary),
//!   built once per model on first use and cached with the model's [`Factory`].
//! - [`Grammar`]: one matcher state per request, created from a model with a [`Kind`] and a
//!   source. A source that does not parse, or a grammar that cannot match anything with
//!   this vocabulary, is an error at creation (LLMRT_INVALID_ARGUMENT with llguidance's
//!   message). Its work is bounded by llguidance's `ParserLimits` (grammar size, lexer
//!   states, per-step lexer fuel and Earley items): past them a creation or a step fails
//!   with llguidance's message instead of running on.
//! - Sampling ([`Model::decode_sample_constrained`], [`sample_logits_constrained`]): the
//!   grammar's mask is applied inside the sampler after logit bias and penalties and before
//!   temperature / top-k / top-p / min-p (see `crate::sample`); a done grammar (stopped, or
//!   accepting with only end-of-sequence allowed) gives the model's EOS id.
//!
//! A grammar's mask for its current state is computed once and kept until the state
//! changes, so a failed step (which changes nothing) costs no second computation.

mod env;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use llguidance::api::{StopReason, TopLevelGrammar};
use llguidance::toktrie::SimpleVob;
use llguidance::{Matcher, ParserFactory};

use crate::runtime::{Model, SampleHook};
use crate::sample::{self, SamplerParams};
use crate::{Error, Result};

/// What a grammar source is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A JSON Schema (the output is JSON text valid under it).
    JsonSchema,
    /// A regular expression (Rust `regex` syntax) the whole output matches.
    Regex,
    /// A Lark-style context-free grammar (llguidance's syntax; `start` is the start rule).
    Lark,
}

/// A model's grammar machinery: the token environment and llguidance's parser factory,
/// built on first use (see [`Model::grammar_factory`]).
pub struct Factory {
    parsers: ParserFactory,
    /// The id a done grammar gives.
    eos: u32,
    /// Every end-of-sequence id (ascending), the trie's EOS set.
    eos_set: Vec<u32>,
    vocab: usize,
}

// A model (and so its factory) is shared by threads, and a grammar handle moves between
// them (the C API's one-call-at-a-time rule is kept by the handle's mutex).
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    fn sent<T: Send>() {}
    shared::<Factory>();
    sent::<Grammar>();
};

/// The per-model slot [`Model::grammar_factory`] fills once (kept in `Model`).
pub(crate) type FactorySlot = OnceLock<std::result::Result<Arc<Factory>, Error>>;

impl Factory {
    fn build(m: &Model) -> Result<Factory> {
        let tok = m
            .tokenizer_for_grammar()
            .map_err(|e| Error::new(e.status, format!("grammars need the model's tokenizer: {}", e.message)))?;
        let vocab = m.info().vocab_size as usize;
        let mut eos_set: Vec<u32> = m.eog_tokens().iter().copied().filter(|&t| (t as usize) < vocab).collect();
        if eos_set.is_empty() {
            eos_set.extend(m.info().eos_token.filter(|&t| (t as usize) < vocab));
        }
        let eos = match m.info().eos_token {
            Some(e) if eos_set.contains(&e) => e,
            _ => *eos_set.first().ok_or_else(|| {
                Error::unsupported(
                    "grammars need an end-of-sequence token to end on, and this model has none \
                     (no EOS or end-of-generation id in its metadata)",
                )
            })?,
        };
        // The EOS the trie reports first is the one a done grammar gives.
        let mut order = vec![eos];
        order.extend(eos_set.iter().copied().filter(|&t| t != eos));
        let env = env::Env::build(tok, vocab, &order)?;
        let mut parsers =
            ParserFactory::new_simple(&env).map_err(|e| Error::internal(format!("llguidance parser factory: {e}")))?;
        // Library code writes nothing to stderr: warnings stay inside llguidance. Error
        // messages without llguidance's parser-state dump (they reach llmrt_last_error).
        parsers.quiet();
        parsers.limits_mut().verbose_errors = false;
        Ok(Factory { parsers, eos, eos_set, vocab })
    }

    fn is_eos(&self, t: u32) -> bool {
        self.eos_set.binary_search(&t).is_ok()
    }

    /// Whether every allowed token of `mask` is an end-of-sequence id (and one is).
    fn only_eos(&self, mask: &SimpleVob) -> bool {
        let n = mask.num_set();
        n > 0 && n == self.eos_set.iter().filter(|&&t| mask.is_allowed(t)).count()
    }
}

impl Model {
    /// The model's grammar factory, built on the first call (the token trie over the whole
    /// vocabulary) and shared by every grammar of the model. A model without a usable
    /// tokenizer, or without an end-of-sequence id: LLMRT_UNSUPPORTED (kept for later calls).
    pub fn grammar_factory(&self) -> Result<Arc<Factory>> {
        let slot = self.grammar_slot().get_or_init(|| {
            catch_unwind(AssertUnwindSafe(|| Factory::build(self).map(Arc::new))).unwrap_or_else(|p| {
                Err(Error::internal(format!("building the grammar token environment panicked: {}", panic_text(&p))))
            })
        });
        slot.clone()
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs llguidance code that may panic (on an input it does not expect): the panic
/// becomes LLMRT_INTERNAL naming `what`. Callers only pass closures whose state is
/// discarded or left as it was on failure.
fn shielded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(Error::internal(format!("{what}: llguidance panicked: {}", panic_text(&p)))))
}

/// llguidance's message for `e`, without the marker it appends to non-verbose errors.
fn llg_msg(e: impl std::fmt::Display) -> String {
    let s = e.to_string();
    s.strip_suffix("\n<non-verbose/>").unwrap_or(&s).trim_end().to_string()
}

/// Whether llguidance's error `msg` is its "no token can follow" stop.
fn is_dead_end(msg: &str) -> bool {
    msg.starts_with(&StopReason::NoExtensionBias.to_string())
}

/// One request's grammar state: a matcher over the model's vocabulary.
pub struct Grammar {
    factory: Arc<Factory>,
    matcher: Matcher,
    /// The mask of the current state, computed on demand.
    mask: Option<SimpleVob>,
}

impl Grammar {
    /// A grammar of `kind` over `source` for `model`. A source that does not parse (bad JSON,
    /// a schema or grammar llguidance rejects), or that allows no token at the start (it
    /// cannot match anything with this vocabulary): LLMRT_INVALID_ARGUMENT with llguidance's
    /// message. A model without a tokenizer or EOS: LLMRT_UNSUPPORTED.
    pub fn new(model: &Model, kind: Kind, source: &str) -> Result<Grammar> {
        let factory = model.grammar_factory()?;
        let top = match kind {
            Kind::JsonSchema => {
                let v: serde_json::Value = serde_json::from_str(source).map_err(|e| {
                    Error::invalid(format!("JSON schema is not JSON: {e} (line {}, column {})", e.line(), e.column()))
                })?;
                TopLevelGrammar::from_json_schema(v)
            }
            Kind::Regex => TopLevelGrammar::from_regex(source),
            Kind::Lark => TopLevelGrammar::from_lark(source.to_string()),
        };
        let what = match kind {
            Kind::JsonSchema => "JSON schema",
            Kind::Regex => "regex",
            Kind::Lark => "Lark grammar",
        };
        let matcher = shielded(what, || {
            let p =
                factory.parsers.create_parser(top).map_err(|e| Error::invalid(format!("{what}: {}", llg_msg(e))))?;
            Ok(Matcher::new(Ok(p)))
        })?;
        if let Some(e) = matcher.get_error() {
            return Err(Error::invalid(format!("{what}: {}", llg_msg(e))));
        }
        let mut g = Grammar { factory, matcher, mask: None };
        // llguidance reports an empty first mask as an error ("no extension").
        let first = g.mask().map(|m| m.is_zero());
        let empty = match first {
            Ok(zero) => zero,
            Err(_) if g.matcher.get_error().is_some_and(|e| is_dead_end(&e)) => true,
            Err(e) => return Err(Error::invalid(format!("{what}: {}", e.message))),
        };
        if empty {
            return Err(Error::invalid(format!(
                "{what}: cannot match anything: no token of this model's vocabulary can start it"
            )));
        }
        Ok(g)
    }

    /// The allowed tokens now (the EOS set once stopped); computed once per state. A
    /// matcher in an error state: LLMRT_INVALID_ARGUMENT with its message.
    fn mask(&mut self) -> Result<&SimpleVob> {
        if self.mask.is_none() {
            let m = &mut self.matcher;
            let v = shielded("computing the grammar's mask", || {
                m.compute_mask_or_eos().map_err(|e| {
                    let msg = llg_msg(e);
                    if is_dead_end(&msg) {
                        Error::invalid("the grammar allows no token here (llguidance: no extension possible)")
                    } else {
                        Error::invalid(format!("grammar is in an error state: {msg}"))
                    }
                })
            })?;
            self.mask = Some(v);
        }
        Ok(self.mask.as_ref().expect("set above"))
    }

    /// Checks that the matcher is usable and its mask allows some token; returns whether it
    /// is done (only end-of-sequence allowed).
    fn ready(&mut self) -> Result<bool> {
        if let Some(e) = self.matcher.get_error() {
            return Err(Error::invalid(format!("grammar is in an error state: {}", llg_msg(e))));
        }
        let f = self.factory.clone();
        let mask = self.mask()?;
        if mask.is_zero() {
            return Err(Error::invalid("the grammar allows no token here (its mask is empty)"));
        }
        Ok(f.only_eos(mask))
    }

    /// The tokens allowed now, as a bit set (token t when bit `t % 32` of word `t / 32` is
    /// set; the EOS set once stopped): computed on the first call in a state, then kept
    /// until the grammar advances. A grammar in an error state, or one that allows nothing
    /// here: LLMRT_INVALID_ARGUMENT.
    pub fn allowed(&mut self) -> Result<&[u32]> {
        self.ready()?;
        Ok(self.mask()?.as_slice())
    }

    /// Back to the start state (a new request with the same grammar).
    pub fn reset(&mut self) -> Result<()> {
        let m = &mut self.matcher;
        shielded("resetting the grammar", || {
            m.reset().map_err(|e| Error::invalid(format!("grammar is in an error state: {}", llg_msg(e))))
        })?;
        self.mask = None;
        Ok(())
    }

    /// Whether the grammar is done: stopped (an EOS was accepted, or nothing can follow),
    /// or accepting with only end-of-sequence tokens allowed.
    pub fn is_done(&mut self) -> Result<bool> {
        if self.matcher.is_stopped() && !self.matcher.is_error() {
            return Ok(true);
        }
        self.ready()
    }

    /// Whether the output so far is complete under the grammar (an EOS is allowed now).
    pub fn can_stop(&mut self) -> Result<bool> {
        if self.matcher.is_stopped() && !self.matcher.is_error() {
            return Ok(true);
        }
        self.ready()?;
        let f = self.factory.clone();
        let mask = self.mask()?;
        Ok(f.eos_set.iter().any(|&t| mask.is_allowed(t)))
    }

    /// Whether `token` is allowed now.
    pub fn allows(&mut self, token: u32) -> Result<bool> {
        if self.matcher.is_stopped() && !self.matcher.is_error() {
            return Ok(self.factory.is_eos(token));
        }
        self.ready()?;
        Ok(self.mask()?.is_allowed(token))
    }

    /// Advances by `token` (a prompt-forced or externally chosen token). A token the grammar
    /// does not allow here: LLMRT_INVALID_ARGUMENT, the state unchanged. An EOS once done
    /// is accepted and changes nothing.
    pub fn accept(&mut self, token: u32) -> Result<()> {
        if token as usize >= self.factory.vocab {
            return Err(Error::invalid(format!(
                "token {token} is outside the vocabulary (size {})",
                self.factory.vocab
            )));
        }
        if !self.allows(token)? {
            return Err(Error::invalid(format!("token {token} is not allowed by the grammar here")));
        }
        let next = self.advanced(token)?;
        self.matcher = next;
        self.mask = None;
        Ok(())
    }

    /// The matcher after `token` (allowed), leaving this one unchanged.
    fn advanced(&self, token: u32) -> Result<Matcher> {
        shielded("advancing the grammar", || {
            let mut m = self.matcher.clone();
            if !m.is_stopped() {
                m.consume_token(token)
                    .map_err(|e| Error::invalid(format!("grammar rejected token {token}: {}", llg_msg(e))))?;
            }
            Ok(m)
        })
    }

    /// The id this grammar gives once done: the model's EOS.
    pub fn eos(&self) -> u32 {
        self.factory.eos
    }

    /// Test hook (not part of the C API): puts the matcher in llguidance's error state, as an
    /// internal failure (a limit hit mid-generation) does.
    #[doc(hidden)]
    pub fn debug_break(&mut self) {
        let _ = self.matcher.test_trigger_lexer_error();
        self.mask = None;
    }

    /// Draws a token for this grammar's state from `row` (the mask after bias and
    /// penalties): the EOS when done; LLMRT_INVALID_ARGUMENT when no allowed token has a
    /// finite logit. The grammar is not advanced.
    fn draw(&mut self, row: &[f32], params: &SamplerParams, history: &[&[u32]], position: u64) -> Result<u32> {
        if self.ready()? {
            return Ok(self.factory.eos);
        }
        let mask = self.mask()?;
        let words = mask.as_slice();
        let d = sample::try_distribution_masked(row, params, history, Some(words))?;
        if d.is_empty() {
            return Err(Error::invalid(
                "no token the grammar allows has a finite logit (after logit bias and penalties)",
            ));
        }
        Ok(sample::draw(&d, params.seed, position))
    }

    fn check_model(&self, m: &Model, i: usize) -> Result<()> {
        let f = m.grammar_factory()?;
        if !Arc::ptr_eq(&f, &self.factory) {
            return Err(Error::invalid(format!("grammars[{i}] was created for another model")));
        }
        Ok(())
    }
}

/// [`crate::sample::try_sample`] under `grammar` on caller-held logits (`row` of the
/// grammar's model's vocabulary size): the same token `decode_sample_constrained` draws from
/// that row. The grammar is not advanced (call [`Grammar::accept`] with the token).
pub fn sample_logits_constrained(
    grammar: &mut Grammar,
    row: &[f32],
    params: &SamplerParams,
    history: &[&[u32]],
    position: u64,
) -> Result<u32> {
    if row.len() != grammar.factory.vocab {
        return Err(Error::invalid(format!(
            "n_logits = {} but the grammar's model has a vocabulary of {}",
            row.len(),
            grammar.factory.vocab
        )));
    }
    params.validate_for(row.len())?;
    grammar.draw(row, params, history, position)
}

/// The hook of a constrained step: draws under each row's grammar, and advances them all
/// (on copies, swapped in only when every one advanced) before the caches commit.
struct Step<'g, 'a> {
    grammars: &'g mut [Option<&'a mut Grammar>],
    next: Vec<Option<Matcher>>,
}

impl SampleHook for Step<'_, '_> {
    fn sample(&mut self, i: usize, row: &[f32], p: &SamplerParams, history: &[&[u32]], position: u64) -> Result<u32> {
        match self.grammars.get_mut(i) {
            Some(Some(g)) => shielded("sampling under the grammar", || g.draw(row, p, history, position))
                .map_err(|e| Error::new(e.status, format!("grammars[{i}]: {}", e.message))),
            _ => sample::try_sample(row, p, history, position),
        }
    }

    fn commit(&mut self, drawn: &[u32]) -> Result<()> {
        self.next.clear();
        for (i, (g, &t)) in self.grammars.iter().zip(drawn).enumerate() {
            let m = match g {
                Some(g) => {
                    Some(g.advanced(t).map_err(|e| Error::new(e.status, format!("grammars[{i}]: {}", e.message)))?)
                }
                None => None,
            };
            self.next.push(m);
        }
        // Every grammar advanced: from here nothing fails.
        for (g, m) in self.grammars.iter_mut().zip(self.next.drain(..)) {
            if let (Some(g), Some(m)) = (g, m) {
                g.matcher = m;
                g.mask = None;
            }
        }
        Ok(())
    }
}

impl Model {
    /// [`Model::decode_sample_each`] under grammars: `grammars[i]` (None = unconstrained)
    /// constrains `caches[i]`'s token; the mask applies after logit bias and penalties,
    /// before temperature and the filters; a done grammar gives the model's EOS. Every
    /// grammar is advanced by its token. Atomic: the parameter sets, the grammars (created
    /// for this model, none twice, none in an error state, each allowing some token) and the
    /// caches are checked before the step, the draws and the grammars' advances happen
    /// before the caches commit; on any failure no cache and no grammar changes.
    pub fn decode_sample_constrained(
        &self,
        caches: &[u64],
        tokens: &[u32],
        params: &[SamplerParams],
        grammars: &mut [Option<&mut Grammar>],
        next: &mut [u32],
    ) -> Result<()> {
        if grammars.len() != caches.len() {
            return Err(Error::invalid(format!("{} grammars for {} caches", grammars.len(), caches.len())));
        }
        for (i, g) in grammars.iter_mut().enumerate() {
            if let Some(g) = g {
                g.check_model(self, i)?;
                // The mask is computed now, outside the model's lock, and kept.
                g.ready().map_err(|e| Error::new(e.status, format!("grammars[{i}]: {}", e.message)))?;
            }
        }
        let n = grammars.len();
        let mut hook = Step { grammars, next: crate::util::try_with_capacity(n, "the step's grammar states")? };
        self.decode_sample_with(caches, tokens, params, Some(&mut hook), next)
    }
}
