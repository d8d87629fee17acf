//! Grammar-constrained decoding entry points (`crate::grammar`, llguidance).

use super::text::{in_slice, read_param_list, read_params};
use super::{batch, boundary, llmrt_cache, llmrt_model, model_ref, need, need_mut};
use crate::error::llmrt_status;
use crate::grammar::{Grammar, Kind};
use crate::{Error, Result};
use std::ffi::{c_char, CStr};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// What a grammar source is (`llmrt_grammar_new`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum llmrt_grammar_kind {
    /// A JSON Schema: the output is JSON valid under it (llguidance's JSON Schema subset;
    /// `$ref` only to `#/...` inside the schema).
    LLMRT_GRAMMAR_JSON_SCHEMA = 0,
    /// A regular expression (Rust regex syntax) that the whole output matches.
    LLMRT_GRAMMAR_REGEX = 1,
    /// A Lark-style context-free grammar (llguidance's syntax; rule `start` starts it).
    LLMRT_GRAMMAR_LARK = 2,
}

/// Raw `llmrt_grammar_kind` as passed by a caller; shows as `llmrt_grammar_kind` in the header.
pub type GrammarKindCode = u32;

/// One request's grammar state (opaque): which tokens may come next under a JSON schema,
/// a regex or a Lark grammar. Create with `llmrt_grammar_new`, destroy with
/// `llmrt_grammar_free`. It may outlive its model (it keeps what it needs) but is used only
/// with that model's caches. One call at a time on a grammar: a call that finds it in use
/// by another thread, or a step that lists it twice, fails with LLMRT_INVALID_ARGUMENT.
pub struct llmrt_grammar {
    inner: Mutex<Grammar>,
}

/// The grammar behind a caller's handle, locked for this call (never waits).
fn lock<'a>(g: *const llmrt_grammar, what: &str) -> Result<MutexGuard<'a, Grammar>> {
    let g = need(g, what)?;
    // SAFETY: non-null, and the caller promises it came from llmrt_grammar_new and was not
    // freed; the grammar is behind a Mutex (Sync).
    let g = unsafe { &(*g).inner };
    match g.try_lock() {
        Ok(guard) => Ok(guard),
        // A grammar's state only changes by whole-value swaps after a success: a panic
        // elsewhere in a call left it as it was.
        Err(TryLockError::Poisoned(p)) => Ok(p.into_inner()),
        Err(TryLockError::WouldBlock) => Err(Error::invalid(format!(
            "{what} is in use by another call (one call at a time on a grammar; listed twice in one step?)"
        ))),
    }
}

/// Creates a grammar for `model` from `source` (NUL-terminated UTF-8) of `kind`. The
/// model's token environment (a trie over its vocabulary) is built on the first grammar
/// and kept with the model. Errors, with `*out_grammar` untouched: a source that does not
/// parse, a schema or grammar llguidance rejects or whose limits it exceeds, or one that
/// allows no token at the start (it cannot match anything with this vocabulary):
/// LLMRT_INVALID_ARGUMENT with llguidance's message; a `kind` outside the enum or a source
/// that is not UTF-8: LLMRT_INVALID_ARGUMENT; a model without a tokenizer, or without an
/// end-of-sequence token: LLMRT_UNSUPPORTED.
///
/// # Safety
/// `model` is a live model; `source` a NUL-terminated string; `out_grammar` writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_grammar_new(
    model: *const llmrt_model,
    kind: GrammarKindCode,
    source: *const c_char,
    out_grammar: *mut *mut llmrt_grammar,
) -> llmrt_status {
    boundary("llmrt_grammar_new", || {
        let m = model_ref(model)?;
        let source = need(source, "source")?;
        let out = need_mut(out_grammar, "out_grammar")?;
        let kind = match kind {
            0 => Kind::JsonSchema,
            1 => Kind::Regex,
            2 => Kind::Lark,
            k => return Err(Error::invalid(format!("kind = {k} is not an llmrt_grammar_kind value"))),
        };
        // SAFETY: checked non-null; the header contract makes it a NUL-terminated string
        // that stays valid for the call.
        let bytes = unsafe { CStr::from_ptr(source) }.to_bytes();
        let text = std::str::from_utf8(bytes)
            .map_err(|e| Error::invalid(format!("source is not valid UTF-8 at byte offset {}", e.valid_up_to())))?;
        let g = Grammar::new(m, kind, text)?;
        let boxed = Box::into_raw(Box::new(llmrt_grammar { inner: Mutex::new(g) }));
        // SAFETY: checked non-null (need_mut); writable per the header contract.
        unsafe { out.write(boxed) };
        Ok(())
    })
}

/// Frees a grammar. NULL is a no-op.
///
/// # Safety
/// `grammar` is NULL or came from llmrt_grammar_new and was not freed; no other thread
/// uses it during or after this call.
#[no_mangle]
pub unsafe extern "C" fn llmrt_grammar_free(grammar: *mut llmrt_grammar) {
    if grammar.is_null() {
        return;
    }
    let _ = boundary("llmrt_grammar_free", || {
        // SAFETY: non-null (checked above); per the header contract it came from
        // Box::into_raw in llmrt_grammar_new, was not freed, and no other thread uses it.
        drop(unsafe { Box::from_raw(grammar) });
        Ok(())
    });
}

/// Puts the grammar back in its start state (for a new request with the same grammar).
///
/// # Safety
/// `grammar` is a live grammar.
#[no_mangle]
pub unsafe extern "C" fn llmrt_grammar_reset(grammar: *mut llmrt_grammar) -> llmrt_status {
    boundary("llmrt_grammar_reset", || lock(grammar, "grammar")?.reset())
}

/// Advances the grammar by `token`: a token the caller chose or forced (a prompt's tail
/// that the grammar covers, a token sampled by llmrt_sample_logits_constrained). A token
/// the grammar does not allow here: LLMRT_INVALID_ARGUMENT and the grammar unchanged. Once
/// done, an end-of-sequence token is accepted and changes nothing.
///
/// # Safety
/// `grammar` is a live grammar.
#[no_mangle]
pub unsafe extern "C" fn llmrt_grammar_accept(grammar: *mut llmrt_grammar, token: u32) -> llmrt_status {
    boundary("llmrt_grammar_accept", || lock(grammar, "grammar")?.accept(token))
}

/// `*out_done` = whether the grammar is done: an end-of-sequence token was accepted or
/// nothing can follow, or only end-of-sequence tokens are allowed now. A constrained step
/// gives a done grammar's cache the model's EOS id (llmrt_model_info.eos_token, or its
/// first end-of-generation id). A grammar in llguidance's error state: LLMRT_INVALID_ARGUMENT
/// with its message.
///
/// # Safety
/// `grammar` is a live grammar; `out_done` is writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_grammar_is_done(grammar: *mut llmrt_grammar, out_done: *mut bool) -> llmrt_status {
    boundary("llmrt_grammar_is_done", || {
        let out = need_mut(out_done, "out_done")?;
        let d = lock(grammar, "grammar")?.is_done()?;
        // SAFETY: checked non-null; writable per the header contract.
        unsafe { out.write(d) };
        Ok(())
    })
}

/// `*out_can_stop` = whether the output so far is complete under the grammar (an
/// end-of-sequence token is allowed now, possibly besides others; true once done). Errors
/// as llmrt_grammar_is_done.
///
/// # Safety
/// `grammar` is a live grammar; `out_can_stop` is writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_grammar_can_stop(grammar: *mut llmrt_grammar, out_can_stop: *mut bool) -> llmrt_status {
    boundary("llmrt_grammar_can_stop", || {
        let out = need_mut(out_can_stop, "out_can_stop")?;
        let d = lock(grammar, "grammar")?.can_stop()?;
        // SAFETY: checked non-null; writable per the header contract.
        unsafe { out.write(d) };
        Ok(())
    })
}

/// As llmrt_decode_sample_each, under grammars: `grammars[i]` constrains `caches[i]`'s
/// token (a NULL entry: unconstrained). The grammar's mask is applied inside the sampler
/// after logit bias and penalties and before temperature, top-k, top-p and min-p (tokens it
/// does not allow become -INFINITY); a done grammar (llmrt_grammar_is_done) gives the
/// model's EOS id. Each grammar is then advanced by its cache's token. Atomic: the n
/// parameter sets, the grammars (created for this model, none listed twice, none in an
/// error state, each allowing some token) and the caches are all checked before the step,
/// and a failure during it (no token the grammar allows has a finite logit after the bias:
/// LLMRT_INVALID_ARGUMENT naming `grammars[i]`) changes nothing: no cache advances, no
/// grammar advances, `next_tokens` is not written. Each token equals the one a call for
/// that cache alone gives, and the one llmrt_sample_logits_constrained gives on the step's
/// row.
///
/// # Safety
/// As llmrt_decode_sample_each; `grammars` points to n entries, each NULL or a live grammar.
#[no_mangle]
pub unsafe extern "C" fn llmrt_decode_sample_constrained(
    model: *mut llmrt_model,
    n: usize,
    caches: *const llmrt_cache,
    tokens: *const u32,
    params: *const *const super::llmrt_sampler_params,
    grammars: *const *mut llmrt_grammar,
    next_tokens: *mut u32,
) -> llmrt_status {
    boundary("llmrt_decode_sample_constrained", || {
        let m = model_ref(model)?;
        // The NULL checks in the order callers see them.
        need(caches, "caches")?;
        need(tokens, "tokens")?;
        need(params, "params")?;
        need(grammars, "grammars")?;
        let next = need_mut(next_tokens, "next_tokens")?;
        let (c, t) = batch(n, caches, tokens)?;
        // SAFETY: params checked non-null; the caller guarantees n readable pointers to valid
        // llmrt_sampler_params (n <= MAX_BATCH, checked in batch).
        let ps = unsafe { read_param_list(params, n)? };
        // SAFETY: grammars checked non-null; the caller guarantees n readable entries.
        let gptrs = unsafe { in_slice(grammars, n, "grammars", "n")? };
        let mut guards = crate::util::try_with_capacity::<Option<MutexGuard<'_, Grammar>>>(n, "the step's grammars")?;
        for (i, &g) in gptrs.iter().enumerate() {
            guards.push(if g.is_null() { None } else { Some(lock(g, &format!("grammars[{i}]"))?) });
        }
        let mut refs = crate::util::try_collect(guards.iter_mut().map(|g| g.as_deref_mut()), "the step's grammars")?;
        let mut ids = crate::util::try_vec(n, 0u32, "the step's token ids")?;
        m.decode_sample_constrained(c, t, &ps, &mut refs, &mut ids)?;
        // SAFETY: next_tokens checked non-null above; the caller guarantees n writable u32s
        // per the header contract (n <= MAX_BATCH, checked in batch).
        unsafe { std::slice::from_raw_parts_mut(next, n) }.copy_from_slice(&ids);
        Ok(())
    })
}

/// As llmrt_sample_logits, under `grammar`: the mask applies after logit bias and
/// penalties, before temperature and the filters; a done grammar gives the model's EOS id.
/// `n_logits` must be the grammar's model's vocabulary size (else LLMRT_INVALID_ARGUMENT).
/// With a cache's row, its tokens and its length, the token equals
/// llmrt_decode_sample_constrained's. The grammar is NOT advanced: pass the token to
/// llmrt_grammar_accept. No token the grammar allows with a finite logit:
/// LLMRT_INVALID_ARGUMENT, `*out_token` untouched.
///
/// # Safety
/// As llmrt_sample_logits; `grammar` is a live grammar.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn llmrt_sample_logits_constrained(
    params: *const super::llmrt_sampler_params,
    grammar: *mut llmrt_grammar,
    logits: *const f32,
    n_logits: usize,
    history: *const u32,
    n_history: usize,
    position: u64,
    out_token: *mut u32,
) -> llmrt_status {
    boundary("llmrt_sample_logits_constrained", || {
        let params = need(params, "params")?;
        need(grammar, "grammar")?;
        need(logits, "logits")?;
        let out = need_mut(out_token, "out_token")?;
        // SAFETY: the caller guarantees logits holds n_logits readable floats.
        let row = unsafe { in_slice(logits, n_logits, "logits", "n_logits")? };
        // SAFETY: the caller guarantees history holds n_history readable u32s (or is NULL with 0).
        let hist = unsafe { in_slice(history, n_history, "history", "n_history")? };
        // SAFETY: checked non-null; a valid llmrt_sampler_params per the header contract.
        let p = unsafe { read_params(params)? };
        let mut g = lock(grammar, "grammar")?;
        let id = crate::grammar::sample_logits_constrained(&mut g, row, &p, &[hist], position)?;
        // SAFETY: checked non-null; writable per the header contract.
        unsafe { out.write(id) };
        Ok(())
    })
}

/// Test hook, not part of the C API (a plain Rust function: cbindgen does not export it):
/// puts the grammar in llguidance's error state, as an internal failure mid-generation
/// (a limit hit) does, so tests can check that steps refuse it and change nothing.
///
/// # Safety
/// `grammar` is a live grammar.
#[doc(hidden)]
pub unsafe fn debug_break_grammar(grammar: *mut llmrt_grammar) {
    if let Ok(mut g) = lock(grammar, "grammar") {
        g.debug_break();
    }
}
