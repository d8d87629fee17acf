//! Generation (`llmrt_generate`).

use super::text::read_params;
use super::{boundary, llmrt_cache, llmrt_model, model_ref, need_mut};
use crate::error::llmrt_status;
use crate::Error;
use std::ffi::{c_char, c_void};

/// Why `llmrt_generate` stopped.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum llmrt_stop_reason {
    /// The model produced an end-of-generation id (the last output token; not fed to
    /// the cache, not passed to the callback).
    LLMRT_STOP_EOG = 0,
    /// `max_tokens` tokens were generated.
    LLMRT_STOP_MAX_TOKENS = 1,
    /// The token callback returned false.
    LLMRT_STOP_CALLBACK = 2,
    /// The cache's reserved positions are all used.
    LLMRT_STOP_CONTEXT_FULL = 3,
}

/// Short alias used in the safe core.
pub use llmrt_stop_reason as StopReason;

/// Called by `llmrt_generate` after each generated token that is not an
/// end-of-generation id: the token, its text piece (`piece_len` bytes, also
/// NUL-terminated; empty for control tokens and models without a tokenizer; a
/// byte-fallback piece may end inside a UTF-8 character) and the caller's user_data.
/// Return false to stop. It runs on the calling thread between steps (no lock held: it
/// may call llmrt functions, also on this model); it must not unwind (C++: catch
/// everything).
pub type llmrt_token_callback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, token: u32, piece: *const c_char, piece_len: usize) -> bool>;

/// Generates from `cache`: feeds `prompt` (n_prompt >= 1; to continue an earlier
/// generation pass its last token), then repeats a one-cache decode step, each next
/// token sampled with `params` (as llmrt_decode_sample: the draw depends on the seed and
/// the position) or, with `params` NULL, the greedy argmax (as llmrt_decode_greedy),
/// until one of (`*out_reason`): the token is an end-of-generation id
/// (llmrt_token_is_eog; LLMRT_STOP_EOG: it is the last output token, not fed to the
/// cache and not passed to `on_token`), `on_token` returned false (LLMRT_STOP_CALLBACK),
/// `max_tokens` tokens were generated (LLMRT_STOP_MAX_TOKENS), or the cache's reserved
/// positions are used up (LLMRT_STOP_CONTEXT_FULL). The cache then holds the prompt and
/// every generated token but the last.
///
/// `out_tokens`: NULL, or room for `capacity` >= `max_tokens` ids (checked before
/// anything runs); `*out_n` = tokens generated. Bad arguments (max_tokens = 0,
/// n_prompt = 0, a prompt token >= vocab_size, bad params, a prompt that does not fit
/// the cache) fail before any step. A step failing later (LLMRT_ABORTED from the abort
/// callback, a changed model file, ...) returns its status with `*out_n` and
/// `out_tokens` holding what was generated before it (`*out_reason` untouched); that
/// step itself changed nothing.
///
/// # Safety
/// `model` is a live model; `prompt` holds n_prompt ids; `params` is NULL or a valid
/// llmrt_sampler_params; `out_tokens` holds `capacity` writable ids or is NULL;
/// `out_n` is writable; `out_reason` is NULL or writable; `on_token` is NULL or safe
/// to call with `user_data` during the call.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn llmrt_generate(
    model: *mut llmrt_model,
    cache: llmrt_cache,
    prompt: *const u32,
    n_prompt: usize,
    params: *const crate::ffi::llmrt_sampler_params,
    max_tokens: u32,
    on_token: llmrt_token_callback,
    user_data: *mut c_void,
    out_tokens: *mut u32,
    capacity: usize,
    out_n: *mut usize,
    out_reason: *mut llmrt_stop_reason,
) -> llmrt_status {
    boundary("llmrt_generate", || {
        let m = model_ref(model)?;
        let out_n = need_mut(out_n, "out_n")?;
        if n_prompt == 0 {
            return Err(Error::invalid(format!("generate on cache {cache} with n_prompt = 0")));
        }
        // SAFETY: the caller guarantees prompt holds n_prompt readable u32s per the header contract.
        let prompt = unsafe { super::text::in_slice(prompt, n_prompt, "prompt", "n_prompt")? };
        if !out_tokens.is_null() && capacity < max_tokens as usize {
            return Err(Error::invalid(format!(
                "out_tokens holds {capacity} ids, fewer than max_tokens = {max_tokens}"
            )));
        }
        let p = if params.is_null() {
            None
        } else {
            // SAFETY: non-null; the caller guarantees a valid llmrt_sampler_params of at least
            // its struct_size bytes per the header contract.
            Some(unsafe { read_params(params)? })
        };
        let mut cb = |t: u32, piece: &[u8]| -> bool {
            let Some(f) = on_token else { return true };
            let mut z = Vec::with_capacity(piece.len() + 1);
            z.extend_from_slice(piece);
            z.push(0);
            // SAFETY: the caller guarantees on_token may be called with user_data during this
            // call; z is a live NUL-terminated buffer of piece.len() + 1 bytes.
            unsafe { f(user_data, t, z.as_ptr().cast::<c_char>(), piece.len()) }
        };
        let write = |tokens: &[u32]| {
            if !out_tokens.is_null() {
                // SAFETY: out_tokens holds capacity >= max_tokens >= tokens.len() writable ids
                // (checked above) per the header contract.
                unsafe { std::slice::from_raw_parts_mut(out_tokens, tokens.len()) }.copy_from_slice(tokens);
            }
            // SAFETY: checked non-null above; writable per the header contract.
            unsafe { out_n.write(tokens.len()) };
        };
        match m.generate(cache, prompt, p.as_ref(), max_tokens, &mut cb) {
            Ok(g) => {
                write(&g.tokens);
                if !out_reason.is_null() {
                    // SAFETY: non-null; writable per the header contract.
                    unsafe { out_reason.write(g.reason) };
                }
                Ok(())
            }
            Err(e) => {
                write(&e.tokens);
                Err(e.error)
            }
        }
    })
}
