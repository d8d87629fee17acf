//! Text and sampling entry points (tokenize, detokenize, sampled decode).

use super::{batch, boundary, llmrt_cache, llmrt_model, model_ref, need, need_mut};
use crate::error::llmrt_status;
use crate::sample::SamplerParams;
use crate::util::try_collect;
use crate::{Error, Result};
use std::ffi::c_char;

/// One logit bias: `bias` is added to token `token`'s logit before the penalties
/// (llama.cpp's `llama_logit_bias`). -INFINITY bans the token.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct llmrt_logit_bias {
    /// A token id below the vocabulary size.
    pub token: u32,
    /// Finite, or -INFINITY (a ban); NaN and +INFINITY are rejected.
    pub bias: f32,
}

/// Sampling parameters for `llmrt_decode_sample`, `llmrt_decode_sample_each` and
/// `llmrt_sample_logits`. Set `struct_size` to sizeof(llmrt_sampler_params), fill
/// with `llmrt_sampler_params_default`, then change what you need. Order: logit
/// bias, penalties, then temperature (0: greedy), top-k, top-p, min-p, draw. The
/// constrained calls (llmrt_decode_sample_constrained, llmrt_sample_logits_constrained)
/// apply the grammar's mask between the penalties and the temperature: a token the
/// grammar does not allow becomes -INFINITY, so greedy and the filters see only
/// allowed tokens.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct llmrt_sampler_params {
    /// sizeof(llmrt_sampler_params): lets the struct grow; fields past it take defaults.
    pub struct_size: u32,
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: u32,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// 1 = off; over the penalty window of the cache's tokens (llama.cpp's penalty_repeat).
    pub repetition_penalty: f32,
    /// Same seed + same logits = same token, on every backend.
    pub seed: u64,
    /// The penalties' window: the cache's last n tokens (the one just fed included);
    /// -1 (default) = all of them, 0 = no penalties (llama.cpp's penalty_last_n).
    pub penalty_last_n: i32,
    /// 0 = off; subtracted from a logit once per occurrence of its token in the
    /// window (llama.cpp's penalty_freq). Finite, may be negative.
    pub frequency_penalty: f32,
    /// 0 = off; subtracted once from the logit of a token present in the window
    /// (llama.cpp's penalty_present). Finite, may be negative.
    pub presence_penalty: f32,
    /// `n_logit_bias` (token, bias) pairs, or NULL with 0 (default). Read during the
    /// call only; a token listed twice gets both biases.
    pub logit_bias: *const llmrt_logit_bias,
    /// Entries in `logit_bias`.
    pub n_logit_bias: usize,
}

fn default_params() -> llmrt_sampler_params {
    let d = SamplerParams::default();
    llmrt_sampler_params {
        struct_size: std::mem::size_of::<llmrt_sampler_params>() as u32,
        temperature: d.temperature,
        top_k: d.top_k,
        top_p: d.top_p,
        min_p: d.min_p,
        repetition_penalty: d.repetition_penalty,
        seed: d.seed,
        penalty_last_n: d.penalty_last_n,
        frequency_penalty: d.frequency_penalty,
        presence_penalty: d.presence_penalty,
        logit_bias: std::ptr::null(),
        n_logit_bias: 0,
    }
}

/// Fills `params` with defaults (see the field comments) and sets `struct_size` to
/// sizeof(llmrt_sampler_params) of this header. The struct's bytes are not read
/// (uninitialised memory is fine). NULL is a no-op. A caller built against an
/// older, smaller struct uses `llmrt_sampler_params_init` with its own sizeof.
///
/// # Safety
/// `params` is NULL or points to sizeof(llmrt_sampler_params) writable bytes.
#[no_mangle]
pub unsafe extern "C" fn llmrt_sampler_params_default(params: *mut llmrt_sampler_params) {
    // SAFETY: the caller's contract is this function's with the header's sizeof.
    unsafe { llmrt_sampler_params_init(params, std::mem::size_of::<llmrt_sampler_params>()) }
}

/// `llmrt_sampler_params_default` for a struct of `size` bytes (the caller's
/// `sizeof(llmrt_sampler_params)`, smaller when built against an older header):
/// only the fields that end inside min(size, the library's sizeof) are written,
/// nothing past them, and `struct_size` is set to that size. A size below 8 writes
/// nothing. NULL is a no-op.
///
/// # Safety
/// `params` is NULL or points to min(size, sizeof(llmrt_sampler_params)) writable bytes.
#[no_mangle]
pub unsafe extern "C" fn llmrt_sampler_params_init(params: *mut llmrt_sampler_params, size: usize) {
    if !params.is_null() {
        // Non-null; the macro writes only inside min(size, sizeof) bytes, which the
        // contract makes writable, and reads nothing of the struct.
        write_sized!(
            params,
            llmrt_sampler_params,
            default_params(),
            size,
            [
                temperature,
                top_k,
                top_p,
                min_p,
                repetition_penalty,
                seed,
                penalty_last_n,
                frequency_penalty,
                presence_penalty,
                logit_bias,
                n_logit_bias
            ]
        );
    }
}

/// Reads a caller's sampler params, honouring struct_size (fields past it are "off"),
/// copies its logit bias list (fallibly) and validates everything but the bias ids
/// (checked against the vocabulary or the row by the caller of this function).
///
/// # Safety
/// `p` is non-null and points to at least `struct_size` readable bytes (and 4 for
/// struct_size); when inside struct_size, `logit_bias` is NULL or points to
/// `n_logit_bias` readable entries.
/// The `n` parameter sets of a per-cache batch (`params[i]` a pointer, each with its own
/// struct_size); a NULL entry or a bad set is an error naming `params[i]`.
///
/// # Safety
/// `params` is non-null and holds `n` readable pointers, each NULL or to a valid
/// llmrt_sampler_params of at least its struct_size bytes (and its logit_bias list).
pub(super) unsafe fn read_param_list(
    params: *const *const llmrt_sampler_params,
    n: usize,
) -> Result<Vec<SamplerParams>> {
    // SAFETY: per this function's contract.
    let ptrs = unsafe { in_slice(params, n, "params", "n")? };
    let mut ps = crate::util::try_with_capacity::<SamplerParams>(n, "the step's sampler parameters")?;
    for (i, &p) in ptrs.iter().enumerate() {
        if p.is_null() {
            return Err(Error::invalid(format!("params[{i}] is NULL")));
        }
        // SAFETY: non-null; valid per this function's contract.
        let r = unsafe { read_params(p) };
        ps.push(r.map_err(|e| Error::new(e.status, format!("params[{i}]: {}", e.message)))?);
    }
    Ok(ps)
}

pub(super) unsafe fn read_params(p: *const llmrt_sampler_params) -> Result<SamplerParams> {
    let o = read_sized!(
        p,
        llmrt_sampler_params,
        default_params(),
        "params",
        "llmrt_sampler_params_default",
        [
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            seed,
            penalty_last_n,
            frequency_penalty,
            presence_penalty,
            logit_bias,
            n_logit_bias
        ]
    )?;
    // SAFETY: logit_bias holds n_logit_bias readable entries per this function's contract.
    let bias = unsafe { in_slice(o.logit_bias, o.n_logit_bias, "params.logit_bias", "params.n_logit_bias")? };
    let s = SamplerParams {
        temperature: o.temperature,
        top_k: o.top_k,
        top_p: o.top_p,
        min_p: o.min_p,
        repetition_penalty: o.repetition_penalty,
        penalty_last_n: o.penalty_last_n,
        frequency_penalty: o.frequency_penalty,
        presence_penalty: o.presence_penalty,
        logit_bias: try_collect(bias.iter().map(|b| (b.token, b.bias)), "a copy of params.logit_bias")?,
        seed: o.seed,
    };
    s.validate()?;
    Ok(s)
}

/// As llmrt_decode_greedy, but sampling with `params` (one set for all caches; per
/// cache: llmrt_decode_sample_each).
/// Sampling runs on the host over float32 logits; the random draw depends only on
/// the seed and the new token's position in its cache.
///
/// # Safety
/// As llmrt_decode_greedy; `params` points to a valid llmrt_sampler_params.
#[no_mangle]
pub unsafe extern "C" fn llmrt_decode_sample(
    model: *mut llmrt_model,
    n: usize,
    caches: *const llmrt_cache,
    tokens: *const u32,
    params: *const llmrt_sampler_params,
    next_tokens: *mut u32,
) -> llmrt_status {
    boundary("llmrt_decode_sample", || {
        let m = model_ref(model)?;
        // The NULL checks in the order callers see them: caches, tokens, params, next_tokens.
        need(caches, "caches")?;
        need(tokens, "tokens")?;
        let params = need(params, "params")?;
        let next = need_mut(next_tokens, "next_tokens")?;
        let (c, t) = batch(n, caches, tokens)?;
        // SAFETY: checked non-null above; the caller guarantees a valid llmrt_sampler_params
        // of at least its struct_size bytes per the header contract.
        let p = unsafe { read_params(params)? };
        let mut ids = crate::util::try_vec(n, 0u32, "the step's token ids")?;
        m.decode_sample(c, t, &p, &mut ids)?;
        // SAFETY: next_tokens checked non-null above; the caller guarantees n writable u32s
        // per the header contract (n <= MAX_BATCH, checked in batch).
        unsafe { std::slice::from_raw_parts_mut(next, n) }.copy_from_slice(&ids);
        Ok(())
    })
}

/// As llmrt_decode_sample with one parameter set per cache: `params[i]` (a
/// pointer, so each struct keeps its own struct_size; entries may repeat) samples
/// `caches[i]`'s token, exactly the token a call for that cache alone with those
/// parameters gives. All n sets are read and validated (a NULL entry, a bad value,
/// a logit_bias token past the vocabulary: LLMRT_INVALID_ARGUMENT naming
/// `params[i]`) before anything changes; a failed step changes no cache.
///
/// # Safety
/// As llmrt_decode_sample; `params` points to n pointers, each to a valid
/// llmrt_sampler_params.
#[no_mangle]
pub unsafe extern "C" fn llmrt_decode_sample_each(
    model: *mut llmrt_model,
    n: usize,
    caches: *const llmrt_cache,
    tokens: *const u32,
    params: *const *const llmrt_sampler_params,
    next_tokens: *mut u32,
) -> llmrt_status {
    boundary("llmrt_decode_sample_each", || {
        let m = model_ref(model)?;
        // The NULL checks in the order callers see them: caches, tokens, params, next_tokens.
        need(caches, "caches")?;
        need(tokens, "tokens")?;
        need(params, "params")?;
        let next = need_mut(next_tokens, "next_tokens")?;
        let (c, t) = batch(n, caches, tokens)?;
        // SAFETY: params checked non-null; the caller guarantees n readable pointers to valid
        // llmrt_sampler_params (n <= MAX_BATCH, checked in batch).
        let ps = unsafe { read_param_list(params, n)? };
        let mut ids = crate::util::try_vec(n, 0u32, "the step's token ids")?;
        m.decode_sample_each(c, t, &ps, &mut ids)?;
        // SAFETY: next_tokens checked non-null above; the caller guarantees n writable u32s
        // per the header contract (n <= MAX_BATCH, checked in batch).
        unsafe { std::slice::from_raw_parts_mut(next, n) }.copy_from_slice(&ids);
        Ok(())
    })
}

/// Samples a token from caller-held logits (`n_logits` floats, e.g. a row that
/// llmrt_decode returned, possibly edited) with `params`, as llmrt_decode_sample
/// does: `history` (`n_history` ids, NULL with 0) plays the cache's tokens for the
/// penalties, `position` the new token's position for the seeded draw. With a
/// cache's row, its tokens (the one just fed included) and its length, the token
/// equals llmrt_decode_sample's. n_logits = 0, or a logit_bias token >= n_logits:
/// LLMRT_INVALID_ARGUMENT. History ids >= n_logits are ignored. Needs no model;
/// thread-safe.
///
/// # Safety
/// `params` points to a valid llmrt_sampler_params; `logits` to n_logits readable
/// floats; `history` to n_history readable u32s (or NULL with 0); `out_token` is
/// writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_sample_logits(
    params: *const llmrt_sampler_params,
    logits: *const f32,
    n_logits: usize,
    history: *const u32,
    n_history: usize,
    position: u64,
    out_token: *mut u32,
) -> llmrt_status {
    boundary("llmrt_sample_logits", || {
        let params = need(params, "params")?;
        need(logits, "logits")?;
        let out = need_mut(out_token, "out_token")?;
        if n_logits == 0 {
            return Err(Error::invalid("n_logits = 0: no logits to sample from"));
        }
        // SAFETY: the caller guarantees logits holds n_logits readable floats.
        let row = unsafe { in_slice(logits, n_logits, "logits", "n_logits")? };
        // SAFETY: the caller guarantees history holds n_history readable u32s (or is NULL with 0).
        let hist = unsafe { in_slice(history, n_history, "history", "n_history")? };
        // SAFETY: checked non-null; a valid llmrt_sampler_params per the header contract.
        let p = unsafe { read_params(params)? };
        p.validate_for(n_logits)?;
        let id = crate::sample::try_sample(row, &p, &[hist], position)?;
        // SAFETY: checked non-null; writable per the header contract.
        unsafe { out.write(id) };
        Ok(())
    })
}

/// Text -> token ids. `text` holds `text_len` bytes of UTF-8 (not necessarily
/// NUL-terminated). `add_bos` prepends the BOS token where the model's tokenizer
/// asks for one (tokenizer.ggml.add_bos_token / tokenizer_config.json, as llama.cpp's
/// add_special): true for Llama-style models, usually false for Qwen-style ones.
/// When `capacity` is too small: LLMRT_BUFFER_TOO_SMALL with `*out_n` = the count
/// needed (`tokens` may be NULL when `capacity` is 0). Models without a tokenizer:
/// LLMRT_UNSUPPORTED. Special tokens written in the text (`<s>`, `<|im_start|>`, ...)
/// become their ids, as llmrt_tokenize_ex with parse_special = true: for untrusted
/// text use llmrt_tokenize_ex with parse_special = false.
///
/// # Safety
/// `model` is a live model; `text` holds `text_len` bytes; `tokens` holds `capacity`
/// u32s (or is NULL with capacity 0); `out_n` is writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_tokenize(
    model: *const llmrt_model,
    text: *const c_char,
    text_len: usize,
    add_bos: bool,
    tokens: *mut u32,
    capacity: usize,
    out_n: *mut usize,
) -> llmrt_status {
    boundary("llmrt_tokenize", || {
        let m = model_ref(model)?;
        let out_n = need_mut(out_n, "out_n")?;
        // SAFETY: the caller guarantees text holds text_len readable bytes per the header contract.
        let bytes = unsafe { in_slice(text.cast::<u8>(), text_len, "text", "text_len")? };
        if capacity > 0 {
            need_mut(tokens, "tokens")?;
        }
        let ids = m.tokenize(bytes, add_bos)?;
        // SAFETY: the caller guarantees tokens holds capacity writable u32s (or is NULL with
        // capacity 0) per the header contract; out_n was checked non-null above and is writable.
        unsafe { write_items(&ids, tokens, capacity, out_n, "tokens", "tokens") }
    })
}

/// llmrt_tokenize with llama.cpp's `parse_special` choice. true: control and unknown
/// tokens written in the text (`<s>`, `</s>`, `<|im_start|>`, `<|endoftext|>`, ...)
/// become their ids (what llmrt_tokenize does: for text the application wrote, such as
/// a rendered chat template). false: they are tokenized as the text they are, as
/// sentencepiece and Hugging Face tokenizers with `split_special_tokens` do: use it
/// for untrusted text (user input), which then cannot inject control tokens.
/// User-defined added tokens are matched either way (as llama.cpp does). Same
/// arguments and LLMRT_BUFFER_TOO_SMALL rule as llmrt_tokenize.
///
/// # Safety
/// As llmrt_tokenize.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn llmrt_tokenize_ex(
    model: *const llmrt_model,
    text: *const c_char,
    text_len: usize,
    add_bos: bool,
    parse_special: bool,
    tokens: *mut u32,
    capacity: usize,
    out_n: *mut usize,
) -> llmrt_status {
    boundary("llmrt_tokenize_ex", || {
        let m = model_ref(model)?;
        let out_n = need_mut(out_n, "out_n")?;
        // SAFETY: the caller guarantees text holds text_len readable bytes per the header contract.
        let bytes = unsafe { in_slice(text.cast::<u8>(), text_len, "text", "text_len")? };
        if capacity > 0 {
            need_mut(tokens, "tokens")?;
        }
        let ids = m.tokenize_with(bytes, add_bos, parse_special)?;
        // SAFETY: the caller guarantees tokens holds capacity writable u32s (or is NULL with
        // capacity 0) per the header contract; out_n was checked non-null above and is writable.
        unsafe { write_items(&ids, tokens, capacity, out_n, "tokens", "tokens") }
    })
}

/// Token ids -> UTF-8 bytes (not NUL-terminated). A byte-fallback token may end in
/// the middle of a character: concatenate consecutive outputs. Same
/// LLMRT_BUFFER_TOO_SMALL rule as llmrt_tokenize (`*out_len` = bytes needed).
///
/// # Safety
/// `model` is a live model; `tokens` holds `n_tokens` ids; `text` holds `capacity`
/// bytes (or is NULL with capacity 0); `out_len` is writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_detokenize(
    model: *const llmrt_model,
    tokens: *const u32,
    n_tokens: usize,
    text: *mut c_char,
    capacity: usize,
    out_len: *mut usize,
) -> llmrt_status {
    boundary("llmrt_detokenize", || {
        let m = model_ref(model)?;
        let out_len = need_mut(out_len, "out_len")?;
        // SAFETY: the caller guarantees tokens holds n_tokens readable u32s per the header contract.
        let ids = unsafe { in_slice(tokens, n_tokens, "tokens", "n_tokens")? };
        let bytes = m.detokenize(ids)?;
        // SAFETY: the caller guarantees text holds capacity writable bytes (or is NULL with
        // capacity 0) per the header contract; out_len was checked non-null above.
        unsafe { write_items(&bytes, text.cast::<u8>(), capacity, out_len, "text", "bytes") }
    })
}

/// One token's bytes as they appear inside a text, for streaming output: unlike
/// llmrt_detokenize no leading space is dropped, so concatenating the pieces of
/// generated tokens gives the text. Control tokens (BOS, EOS, ...) give no bytes; a
/// byte-fallback token gives one raw byte (possibly part of a UTF-8 character). Same
/// LLMRT_BUFFER_TOO_SMALL rule as llmrt_tokenize.
///
/// # Safety
/// `model` is a live model; `text` holds `capacity` bytes (or is NULL with capacity
/// 0); `out_len` is writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_token_piece(
    model: *const llmrt_model,
    token: u32,
    text: *mut c_char,
    capacity: usize,
    out_len: *mut usize,
) -> llmrt_status {
    boundary("llmrt_token_piece", || {
        let m = model_ref(model)?;
        let out_len = need_mut(out_len, "out_len")?;
        let bytes = m.token_piece(token)?;
        // SAFETY: as in llmrt_detokenize: text holds capacity writable bytes or is NULL with
        // capacity 0 (header contract); out_len was checked non-null above.
        unsafe { write_items(&bytes, text.cast::<u8>(), capacity, out_len, "text", "bytes") }
    })
}

/// A caller's input array of `n` items: empty when `n` is 0 (then `p` may be NULL), else
/// `p` must be non-null (LLMRT_INVALID_ARGUMENT naming `what`) and `n` small enough to be a
/// slice (else LLMRT_INVALID_ARGUMENT naming `len_name`).
///
/// # Safety
/// When `n > 0` and `p` is non-null, `p` points to `n` readable `T`s that stay unchanged
/// for `'a` (the call).
pub(super) unsafe fn in_slice<'a, T>(p: *const T, n: usize, what: &str, len_name: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    let p = need(p, what)?;
    if n > isize::MAX as usize / std::mem::size_of::<T>() {
        return Err(Error::invalid(format!("{len_name} = {n} is too large")));
    }
    // SAFETY: checked non-null and n * size_of::<T>() <= isize::MAX above; n readable items
    // per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// Copies `items` to a caller's buffer `buf` of `capacity` items and sets `*out_len` to
/// their count; when they do not fit, sets `*out_len` to the count needed and returns
/// LLMRT_BUFFER_TOO_SMALL (`unit` names the items in the message). `buf` may be NULL
/// only with capacity 0 (else LLMRT_INVALID_ARGUMENT naming `what`).
///
/// # Safety
/// `buf` holds `capacity` writable items or is NULL; `out_len` is non-null and writable.
pub(super) unsafe fn write_items<T: Copy>(
    items: &[T],
    buf: *mut T,
    capacity: usize,
    out_len: *mut usize,
    what: &str,
    unit: &str,
) -> Result<()> {
    if capacity > 0 {
        need_mut(buf, what)?;
    }
    if items.len() > capacity {
        // SAFETY: non-null and writable per this function's contract.
        unsafe { out_len.write(items.len()) };
        return Err(Error::buffer_too_small(format!("{} {unit} do not fit in capacity {capacity}", items.len())));
    }
    if !items.is_empty() {
        let buf = need_mut(buf, what)?;
        // SAFETY: checked non-null; capacity >= items.len() writable items per this
        // function's contract.
        unsafe { std::slice::from_raw_parts_mut(buf, items.len()) }.copy_from_slice(items);
    }
    // SAFETY: non-null and writable per this function's contract.
    unsafe { out_len.write(items.len()) };
    Ok(())
}
