//! Chat entry points: chat templates, end-of-generation tokens, stop strings.

use super::text::{in_slice, write_items};
use super::{boundary, llmrt_model, model_ref, need, need_mut};
use crate::chat::{self, DateTime, Message, StopMatcher};
use crate::error::llmrt_status;
use crate::{Error, Result};
use std::ffi::{c_char, CStr};
use std::sync::Mutex;

/// One chat message: `role` ("system", "user", "assistant", ...) and `content`, both
/// NUL-terminated UTF-8.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct llmrt_chat_message {
    pub role: *const c_char,
    pub content: *const c_char,
}

/// A caller's NUL-terminated UTF-8 string, or LLMRT_INVALID_ARGUMENT naming it.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string that stays unchanged for `'a`.
unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    let p = need(p, what)?;
    // SAFETY: non-null; NUL-terminated per this function's contract.
    let b = unsafe { CStr::from_ptr(p) }.to_bytes();
    std::str::from_utf8(b)
        .map_err(|e| Error::invalid(format!("{what} is not valid UTF-8 at byte offset {}", e.valid_up_to())))
}

/// The local date and time (what Python's `datetime.now()` gives a template).
fn local_now() -> DateTime {
    let utc = DateTime::now_utc();
    let secs = match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_secs() as libc::time_t,
        Err(_) => return utc,
    };
    // SAFETY: libc::tm is plain data; all-zero is a valid value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call; localtime_r is the thread-safe variant.
    if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() {
        return utc;
    }
    DateTime {
        year: tm.tm_year + 1900,
        month: (tm.tm_mon + 1).clamp(1, 12) as u32,
        day: tm.tm_mday.clamp(1, 31) as u32,
        hour: tm.tm_hour.clamp(0, 23) as u32,
        minute: tm.tm_min.clamp(0, 59) as u32,
        second: tm.tm_sec.clamp(0, 60) as u32,
    }
}

/// Renders a chat template over `messages` into `out` (UTF-8, not NUL-terminated):
/// `template_or_null` is a Jinja template of the caller's choice, or NULL for the model's
/// own (GGUF `tokenizer.chat_template`; HF `chat_template.jinja` or tokenizer_config.json
/// `chat_template`, the "default" one of a list). Rendered as Hugging Face transformers
/// renders it (trim_blocks, lstrip_blocks, `raise_exception`, `strftime_now` with the local
/// date, `tojson`, loop controls, Python string methods) with `messages`,
/// `add_generation_prompt`, the model's `bos_token` / `eos_token` strings, and `tools` and
/// `documents` as none. `model` may be NULL when `template_or_null` is given (bos_token and
/// eos_token are then ""). The usual LLMRT_BUFFER_TOO_SMALL rule (`*out_len` = bytes
/// needed; `out` may be NULL with capacity 0). A model without a template and NULL
/// `template_or_null`: LLMRT_UNSUPPORTED. A template that does not parse, raises
/// (`raise_exception`), or exceeds the render's work or recursion bounds:
/// LLMRT_INVALID_ARGUMENT, with the template line and message in llmrt_last_error.
///
/// # Safety
/// `model` is NULL or a live model; `template_or_null` is NULL or NUL-terminated;
/// `messages` holds `n_messages` messages whose strings are NUL-terminated (NULL allowed
/// with n_messages 0); `out` holds `capacity` bytes (or is NULL with capacity 0);
/// `out_len` is writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_chat_apply(
    model: *const llmrt_model,
    template_or_null: *const c_char,
    messages: *const llmrt_chat_message,
    n_messages: usize,
    add_generation_prompt: bool,
    out: *mut c_char,
    capacity: usize,
    out_len: *mut usize,
) -> llmrt_status {
    boundary("llmrt_chat_apply", || {
        let m = if model.is_null() && !template_or_null.is_null() { None } else { Some(model_ref(model)?) };
        let out_len = need_mut(out_len, "out_len")?;
        let template = if template_or_null.is_null() {
            None
        } else {
            // SAFETY: non-null and NUL-terminated per the header contract.
            Some(unsafe { c_str(template_or_null, "template_or_null")? })
        };
        // SAFETY: the caller guarantees n_messages readable messages per the header contract.
        let raw = unsafe { in_slice(messages, n_messages, "messages", "n_messages")? };
        let mut msgs = Vec::new();
        msgs.try_reserve(raw.len()).map_err(|_| Error::out_of_memory(format!("cannot hold {} messages", raw.len())))?;
        for (i, r) in raw.iter().enumerate() {
            // SAFETY: the caller guarantees NUL-terminated strings (checked non-null in c_str).
            let role = unsafe { c_str(r.role, &format!("messages[{i}].role"))? };
            // SAFETY: as above.
            let content = unsafe { c_str(r.content, &format!("messages[{i}].content"))? };
            msgs.push(Message { role, content });
        }
        let now = Some(local_now());
        let text = match m {
            Some(m) => m.chat_apply(template, &msgs, add_generation_prompt, now)?,
            None => {
                let opts = chat::RenderOptions { add_generation_prompt, bos_token: "", eos_token: "", now };
                chat::render(template.unwrap_or_default(), &msgs, &opts)?
            }
        };
        // SAFETY: the caller guarantees out holds capacity writable bytes (or is NULL with
        // capacity 0) per the header contract; out_len was checked non-null above.
        unsafe { write_items(text.as_bytes(), out.cast::<u8>(), capacity, out_len, "out", "bytes") }
    })
}

/// The model's own chat template (UTF-8, not NUL-terminated), as llmrt_chat_apply with a
/// NULL template uses it. A model without one: LLMRT_UNSUPPORTED. Same
/// LLMRT_BUFFER_TOO_SMALL rule as llmrt_chat_apply.
///
/// # Safety
/// `model` is a live model; `out` holds `capacity` bytes (or is NULL with capacity 0);
/// `out_len` is writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_chat_template(
    model: *const llmrt_model,
    out: *mut c_char,
    capacity: usize,
    out_len: *mut usize,
) -> llmrt_status {
    boundary("llmrt_chat_template", || {
        let m = model_ref(model)?;
        let out_len = need_mut(out_len, "out_len")?;
        let t = m.chat_template().ok_or_else(|| Error::unsupported("this model carries no chat template"))?;
        // SAFETY: as in llmrt_chat_apply.
        unsafe { write_items(t.as_bytes(), out.cast::<u8>(), capacity, out_len, "out", "bytes") }
    })
}

/// Whether `token` ends a generation for this model: its EOS, EOT and EOM ids (GGUF
/// `tokenizer.ggml.eos_token_id` / `eot_token_id` / `eom_token_id`; every id of HF
/// config.json and generation_config.json `eos_token_id` lists), and special tokens such as
/// `<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`, `<|endoftext|>` where the vocabulary has
/// them. false for a NULL model or an id outside the vocabulary.
///
/// # Safety
/// `model` is NULL or a live model.
#[no_mangle]
pub unsafe extern "C" fn llmrt_token_is_eog(model: *const llmrt_model, token: u32) -> bool {
    let mut r = false;
    let _ = boundary("llmrt_token_is_eog", || {
        if !model.is_null() {
            r = model_ref(model)?.is_eog(token);
        }
        Ok(())
    });
    r
}

/// The model's end-of-generation token ids (see llmrt_token_is_eog), ascending, into
/// `tokens`; `*out_n` = their count. Same LLMRT_BUFFER_TOO_SMALL rule as llmrt_tokenize.
///
/// # Safety
/// `model` is a live model; `tokens` holds `capacity` u32s (or is NULL with capacity 0);
/// `out_n` is writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_eog_tokens(
    model: *const llmrt_model,
    tokens: *mut u32,
    capacity: usize,
    out_n: *mut usize,
) -> llmrt_status {
    boundary("llmrt_eog_tokens", || {
        let m = model_ref(model)?;
        let out_n = need_mut(out_n, "out_n")?;
        // SAFETY: the caller guarantees tokens holds capacity writable u32s (or is NULL with
        // capacity 0); out_n was checked non-null above.
        unsafe { write_items(m.eog_tokens(), tokens, capacity, out_n, "tokens", "tokens") }
    })
}

/// A streaming stop-string matcher (opaque). Feed it the generated pieces; it passes on
/// only text that can no longer be part of a stop string, never a partial match, never
/// half a UTF-8 character. Create with llmrt_stop_matcher_new, destroy with
/// llmrt_stop_matcher_free. Calls on one matcher are serialised internally.
pub struct llmrt_stop_matcher {
    inner: Mutex<StopMatcher>,
}

/// No stop string matched (llmrt_stop_matcher_feed's `*out_stop`): UINT32_MAX.
pub const LLMRT_NO_STOP: u32 = u32::MAX;

/// A matcher for `n_stops` stop strings (NUL-terminated UTF-8, none empty; at most 1024 of
/// at most 4096 bytes; `stops` may be NULL with n_stops 0). On success `*out_matcher`
/// receives it. A bad stop string: LLMRT_INVALID_ARGUMENT naming its index.
///
/// # Safety
/// `stops` holds `n_stops` NUL-terminated strings; `out_matcher` is writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_stop_matcher_new(
    stops: *const *const c_char,
    n_stops: usize,
    out_matcher: *mut *mut llmrt_stop_matcher,
) -> llmrt_status {
    boundary("llmrt_stop_matcher_new", || {
        let out = need_mut(out_matcher, "out_matcher")?;
        // SAFETY: the caller guarantees n_stops readable pointers per the header contract.
        let raw = unsafe { in_slice(stops, n_stops, "stops", "n_stops")? };
        if raw.len() > chat::stop::MAX_STOPS {
            return Err(Error::invalid(format!("n_stops = {}: at most {}", raw.len(), chat::stop::MAX_STOPS)));
        }
        let mut v = Vec::with_capacity(raw.len());
        for (i, &p) in raw.iter().enumerate() {
            // SAFETY: NUL-terminated per the header contract (checked non-null in c_str).
            v.push(unsafe { c_str(p, &format!("stops[{i}]"))? });
        }
        let m = StopMatcher::new(&v)?;
        let b = Box::new(llmrt_stop_matcher { inner: Mutex::new(m) });
        // SAFETY: checked non-null; writable per the header contract.
        unsafe { out.write(Box::into_raw(b)) };
        Ok(())
    })
}

fn matcher<'a>(m: *mut llmrt_stop_matcher) -> Result<std::sync::MutexGuard<'a, StopMatcher>> {
    let m = need_mut(m, "matcher")?;
    // SAFETY: non-null, and the caller promises it came from llmrt_stop_matcher_new and was
    // not freed.
    let m = unsafe { &*m };
    Ok(m.inner.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Feeds the next generated piece (`piece_len` bytes, any split: a piece may end inside a
/// character) and writes the text now safe to show into `out` (not NUL-terminated),
/// `*out_len` its length. `*out_stop` (may be NULL): the index of the stop string that
/// matched, or UINT32_MAX when none did; once one matched, generation is over: `out` held
/// the text before it, and later feeds give nothing and the same index. The output is at most
/// `piece_len` + the bytes held back so far; when `capacity` is too small:
/// LLMRT_BUFFER_TOO_SMALL with `*out_len` = bytes needed and the matcher unchanged (feed
/// the same piece again with a larger buffer).
///
/// # Safety
/// `matcher` is a live matcher; `piece` holds `piece_len` bytes (NULL with 0); `out` holds
/// `capacity` bytes (or is NULL with capacity 0); `out_len` is writable; `out_stop` is NULL
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_stop_matcher_feed(
    matcher: *mut llmrt_stop_matcher,
    piece: *const c_char,
    piece_len: usize,
    out: *mut c_char,
    capacity: usize,
    out_len: *mut usize,
    out_stop: *mut u32,
) -> llmrt_status {
    boundary("llmrt_stop_matcher_feed", || {
        let mut m = self::matcher(matcher)?;
        let out_len = need_mut(out_len, "out_len")?;
        // SAFETY: the caller guarantees piece holds piece_len readable bytes.
        let piece = unsafe { in_slice(piece.cast::<u8>(), piece_len, "piece", "piece_len")? };
        let (fed, _) = m.peek(piece)?;
        // SAFETY: out holds capacity writable bytes or is NULL with capacity 0; out_len non-null.
        unsafe { write_items(&fed.text, out.cast::<u8>(), capacity, out_len, "out", "bytes")? };
        let fed = m.feed(piece)?;
        if !out_stop.is_null() {
            let s = fed.stop.map_or(LLMRT_NO_STOP, |i| i as u32);
            // SAFETY: non-null and writable per the header contract.
            unsafe { out_stop.write(s) };
        }
        Ok(())
    })
}

/// End of generation: writes the text still held back (a possible start of a stop string
/// that did not complete, an incomplete character) and empties the matcher; nothing once a
/// stop string matched. Same LLMRT_BUFFER_TOO_SMALL rule (the matcher unchanged).
///
/// # Safety
/// As llmrt_stop_matcher_feed.
#[no_mangle]
pub unsafe extern "C" fn llmrt_stop_matcher_flush(
    matcher: *mut llmrt_stop_matcher,
    out: *mut c_char,
    capacity: usize,
    out_len: *mut usize,
) -> llmrt_status {
    boundary("llmrt_stop_matcher_flush", || {
        let mut m = self::matcher(matcher)?;
        let out_len = need_mut(out_len, "out_len")?;
        // SAFETY: as in llmrt_stop_matcher_feed.
        unsafe { write_items(m.held(), out.cast::<u8>(), capacity, out_len, "out", "bytes")? };
        m.finish();
        Ok(())
    })
}

/// Frees a matcher. NULL is a no-op.
///
/// # Safety
/// `matcher` is NULL or came from llmrt_stop_matcher_new and was not freed.
#[no_mangle]
pub unsafe extern "C" fn llmrt_stop_matcher_free(matcher: *mut llmrt_stop_matcher) {
    if !matcher.is_null() {
        let _ = boundary("llmrt_stop_matcher_free", || {
            // SAFETY: came from Box::into_raw in llmrt_stop_matcher_new (caller contract).
            drop(unsafe { Box::from_raw(matcher) });
            Ok(())
        });
    }
}
