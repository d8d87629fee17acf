//! The abort callback (`llmrt_set_abort_callback`).

use super::{boundary, llmrt_model, model_ref};
use crate::error::llmrt_status;
use std::ffi::c_void;
use std::sync::Arc;

/// A caller's "stop the step now?" function: return true to abort. Called with the
/// `user_data` given to `llmrt_set_abort_callback`, on the thread that called the step,
/// while the model's lock is held: it must be quick and must not call llmrt functions
/// on the same model.
pub type llmrt_abort_callback = Option<unsafe extern "C" fn(user_data: *mut c_void) -> bool>;

/// Sets the model's abort callback (NULL removes it). Every later step
/// (llmrt_prefill, llmrt_prefill_all, the llmrt_decode family, llmrt_embed) calls it
/// between layers on the CPU and before the launch on CUDA; when it returns true the
/// step fails with LLMRT_ABORTED, naming where it stopped, and commits nothing (every
/// cache as before the call). Setting waits for a step running on another thread to
/// finish, so once this returns the previous callback is never called again and its
/// `user_data` may be freed. To cancel a running step, make the callback see a flag
/// (the callback is read at the step's start). One callback per model: cancelling one
/// request of a batched step aborts the whole step (retry it without that request).
/// `user_data` is passed through untouched.
///
/// # Safety
/// `model` is a live model; `callback` is NULL or a function safe to call from any
/// thread with `user_data` for as long as it is set.
#[no_mangle]
pub unsafe extern "C" fn llmrt_set_abort_callback(
    model: *mut llmrt_model,
    callback: llmrt_abort_callback,
    user_data: *mut c_void,
) -> llmrt_status {
    boundary("llmrt_set_abort_callback", || {
        let m = model_ref(model)?;
        let hook: Option<crate::abort::AbortHook> = callback.map(|f| {
            // The pointer travels as an integer: the caller vouches for its use from
            // any thread (header contract).
            let user = user_data as usize;
            let h: crate::abort::AbortHook = Arc::new(move || {
                // SAFETY: the caller guarantees `f` may be called from any thread with
                // `user_data` while it is set (the header contract of this function).
                unsafe { f(user as *mut c_void) }
            });
            h
        });
        m.set_abort_hook(hook);
        Ok(())
    })
}
