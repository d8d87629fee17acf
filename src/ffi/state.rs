//! Saved cache states: a cache's KV and token history to bytes and back.

use super::text::in_slice;
use super::{boundary, llmrt_cache, llmrt_model, model_ref, need_mut, write_out};
use crate::error::llmrt_status;
use crate::Error;

/// Saves a cache's state: its KV, its tokens (the history the sampler's penalties
/// read) and its capacity, as bytes that `llmrt_cache_load` turns back into a cache
/// (on this model, or on another load of the same model file on the same kind of
/// backend; a process may save and another load). The format (docs/API.md): a magic
/// "LLMRTKV\0", a format version, the KV element type (f32 on the CPU, f16 on CUDA),
/// a fingerprint of the model and its geometry, the tokens, the KV by position, and a
/// CRC-32 of everything. Its size is 52 + 4 * length + length * kv_bytes_per_position
/// bytes (llmrt_model_info). The usual LLMRT_BUFFER_TOO_SMALL rule: when `capacity` is
/// too small (`out` may be NULL with capacity 0), `*out_len` = the bytes needed and
/// nothing is written; else `*out_len` = the bytes written. The cache is not changed.
/// Unknown cache: LLMRT_UNKNOWN_CACHE.
///
/// # Safety
/// `model` is a live model; `out` holds `capacity` writable bytes (or is NULL with
/// capacity 0); `out_len` is writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_cache_save(
    model: *const llmrt_model,
    cache: llmrt_cache,
    out: *mut u8,
    capacity: usize,
    out_len: *mut usize,
) -> llmrt_status {
    boundary("llmrt_cache_save", || {
        let m = model_ref(model)?;
        let out_len = need_mut(out_len, "out_len")?;
        if capacity > isize::MAX as usize {
            return Err(Error::invalid(format!("capacity = {capacity} is too large")));
        }
        let buf: &mut [u8] = if capacity == 0 {
            &mut []
        } else {
            let out = need_mut(out, "out")?;
            // SAFETY: non-null, capacity <= isize::MAX, and the caller guarantees capacity
            // writable bytes per the header contract (written only by this call).
            unsafe { std::slice::from_raw_parts_mut(out, capacity) }
        };
        let n = m.cache_save_into(cache, buf)?;
        // SAFETY: checked non-null above; writable per the header contract.
        unsafe { out_len.write(n) };
        if n > capacity {
            return Err(Error::buffer_too_small(format!(
                "the state of cache {cache} is {n} bytes; capacity is {capacity}"
            )));
        }
        Ok(())
    })
}

/// A new cache holding the positions of a state from `llmrt_cache_save`: the next
/// step on it gives the same logits, bit for bit, as on the saved cache, and sampling
/// penalties see the same history. It reserves `positions` positions like
/// llmrt_cache_reserve (0 = the capacity the saved cache had; fewer than the state's
/// length: LLMRT_INVALID_ARGUMENT), into any free KV blocks. Past the context length:
/// LLMRT_CONTEXT_FULL; pool exhausted: LLMRT_OUT_OF_MEMORY. A state that is not for
/// this model (other weights, types or hyperparameters, or the other backend's KV
/// type), truncated, corrupt (checksum), or of another format version:
/// LLMRT_INVALID_ARGUMENT with a message naming the byte offset and the field. On any
/// error no cache is created, no KV block is taken and `*out_cache` is untouched. The
/// bytes are only read during the call.
///
/// # Safety
/// `model` is a live model; `data` holds `len` readable bytes; `out_cache` is writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_cache_load(
    model: *mut llmrt_model,
    data: *const u8,
    len: usize,
    positions: u32,
    out_cache: *mut llmrt_cache,
) -> llmrt_status {
    boundary("llmrt_cache_load", || {
        let m = model_ref(model)?;
        need_mut(out_cache, "out_cache")?;
        if data.is_null() {
            return Err(Error::invalid("data is NULL"));
        }
        // SAFETY: the caller guarantees data holds len readable bytes per the header contract.
        let bytes = unsafe { in_slice(data, len, "data", "len")? };
        // SAFETY: the caller guarantees out_cache is writable per the header contract.
        unsafe { write_out(out_cache, "out_cache", || m.cache_load(bytes, positions)) }
    })
}
