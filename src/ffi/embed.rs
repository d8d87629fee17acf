//! Embeddings (`llmrt_embed`).

use super::text::{in_slice, write_items};
use super::{boundary, llmrt_model, model_ref, need_mut};
use crate::error::llmrt_status;
use crate::runtime::Pooling;
use crate::Error;

/// How `llmrt_embed` pools a sequence's hidden states.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum llmrt_pooling {
    /// Every token's row: n_tokens * hidden_size floats, row-major.
    LLMRT_POOLING_NONE = 0,
    /// The mean of the tokens' rows: hidden_size floats.
    LLMRT_POOLING_MEAN = 1,
    /// The last token's row: hidden_size floats.
    LLMRT_POOLING_LAST = 2,
}

/// Raw `llmrt_pooling` as passed by a caller (C may pass any int); shows as
/// `llmrt_pooling` in the header.
pub type PoolingCode = u32;

/// Embeddings of `tokens` (one sequence, at most the context length): the final norm's
/// output, the input of the LM head (transformers' `last_hidden_state`), pooled as
/// `pooling` says and, with `normalize`, scaled to unit L2 norm (each row for
/// LLMRT_POOLING_NONE; a zero vector stays zero). The step runs in a cache of its own,
/// reserved and released inside the call (it needs KV blocks for n_tokens positions
/// while it runs; LLMRT_OUT_OF_MEMORY when the pool has too few); no caller's cache
/// changes. `*out_len` = floats written: hidden_size, or n_tokens * hidden_size for
/// LLMRT_POOLING_NONE; when `capacity` (in floats) is smaller, LLMRT_BUFFER_TOO_SMALL
/// with `*out_len` = floats needed, checked before any compute. `out` may be NULL with
/// capacity 0 to ask the size.
///
/// # Safety
/// `model` is a live model; `tokens` holds `n_tokens` ids; `out` holds `capacity`
/// writable floats (or is NULL with capacity 0); `out_len` is writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_embed(
    model: *const llmrt_model,
    tokens: *const u32,
    n_tokens: usize,
    pooling: PoolingCode,
    normalize: bool,
    out: *mut f32,
    capacity: usize,
    out_len: *mut usize,
) -> llmrt_status {
    boundary("llmrt_embed", || {
        let m = model_ref(model)?;
        let out_len = need_mut(out_len, "out_len")?;
        let pooling = match pooling {
            0 => Pooling::None,
            1 => Pooling::Mean,
            2 => Pooling::Last,
            p => return Err(Error::invalid(format!("pooling = {p}: not an llmrt_pooling (0, 1 or 2)"))),
        };
        if n_tokens == 0 {
            return Err(Error::invalid("llmrt_embed with n_tokens = 0"));
        }
        // SAFETY: the caller guarantees tokens holds n_tokens readable u32s per the header contract.
        let ids = unsafe { in_slice(tokens, n_tokens, "tokens", "n_tokens")? };
        let h = m.info().hidden_size as usize;
        let need = if pooling == Pooling::None { n_tokens.saturating_mul(h) } else { h };
        if need > capacity {
            // SAFETY: checked non-null above; writable per the header contract.
            unsafe { out_len.write(need) };
            return Err(Error::buffer_too_small(format!("{need} floats do not fit in capacity {capacity}")));
        }
        let v = m.embed(ids, pooling, normalize)?;
        // SAFETY: out holds capacity writable floats (or is NULL with capacity 0) per the
        // header contract; out_len was checked non-null above.
        unsafe { write_items(&v, out, capacity, out_len, "out", "floats") }
    })
}
