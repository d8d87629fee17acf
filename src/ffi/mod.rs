//! The C boundary: the only place that sees raw pointers. Each entry point
//! validates its pointers, calls the safe core inside `catch_unwind`, and maps
//! the error to an `llmrt_status` with the message kept for `llmrt_last_error`.
//! The header `include/llmrt.h` is generated from this module by cbindgen.

#![allow(non_camel_case_types)]

/// Reads a caller's growable struct `$T` at `$p` (llmrt_model_options,
/// llmrt_sampler_params: `struct_size` first), honouring its `struct_size`: each listed
/// field that ends past it keeps its value in `$default` (an older, smaller struct). A
/// `struct_size` below 8 (not filled in): LLMRT_INVALID_ARGUMENT naming `$what` and the
/// `$filler` function that sets it. Evaluates to `Result<$T>`; expand it only in an
/// `unsafe fn` whose contract is that `$p` is non-null and points to at least
/// `struct_size` readable bytes (and 4 for `struct_size` itself).
macro_rules! read_sized {
    ($p:expr, $T:ty, $default:expr, $what:literal, $filler:literal, [$($f:ident),+ $(,)?]) => {{
        let p: *const $T = $p;
        // SAFETY: struct_size is the first field; the caller owns at least its 4 bytes.
        let size = unsafe { std::ptr::addr_of!((*p).struct_size).read_unaligned() } as usize;
        if size < 8 {
            Err(Error::invalid(format!(
                concat!($what, ".struct_size is {}; set it with ", $filler, " (sizeof = {})"),
                size,
                std::mem::size_of::<$T>()
            )))
        } else {
            let mut o: $T = $default;
            $(
                let off = std::mem::offset_of!($T, $f);
                if off + std::mem::size_of_val(&o.$f) <= size {
                    // SAFETY: the field lies inside the caller's struct_size readable bytes.
                    o.$f = unsafe { std::ptr::addr_of!((*p).$f).read_unaligned() };
                }
            )+
            Ok(o)
        }
    }};
}

/// Writes the defaults `$default` into a caller's growable struct `$T` at `$p`
/// (`struct_size` first) of `$size` bytes: each listed field that ends inside
/// min($size, sizeof($T)) is written, nothing else (padding and bytes past it stay
/// as they were), and `struct_size` becomes that size. A size below 8 writes
/// nothing (the call that reads the struct then reports the bad size). The struct's
/// own bytes are never read: callers pass uninitialised memory. Expand it only in
/// an `unsafe` block whose contract is that `$p` is non-null and min($size,
/// sizeof($T)) bytes writable.
macro_rules! write_sized {
    ($p:expr, $T:ty, $default:expr, $size:expr, [$($f:ident),+ $(,)?]) => {{
        let p: *mut $T = $p;
        let size = ($size).min(std::mem::size_of::<$T>());
        if size >= 8 {
            let d: $T = $default;
            // SAFETY: 4 <= size bytes the caller owns.
            unsafe { std::ptr::addr_of_mut!((*p).struct_size).write_unaligned(size as u32) };
            $(
                if std::mem::offset_of!($T, $f) + std::mem::size_of_val(&d.$f) <= size {
                    // SAFETY: the field lies inside the caller's size writable bytes.
                    unsafe { std::ptr::addr_of_mut!((*p).$f).write_unaligned(d.$f) };
                }
            )+
        }
    }};
}

mod text;
pub use text::*;
mod chat;
pub use chat::*;
mod grammar;
pub use grammar::*;
mod embed;
pub use embed::*;
mod abort;
pub use abort::*;
mod generate;
pub use generate::*;
mod state;
pub use state::*;

use crate::error::llmrt_status;
use crate::runtime::{BackendKind, LoadOptions, Model};
use crate::{Error, Result, Status};
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A loaded model (opaque). Create with `llmrt_model_load`, destroy with
/// `llmrt_model_free`. Every function may be called from any thread; calls that
/// touch one model are serialised internally, different models run in parallel.
pub struct llmrt_model {
    inner: Model,
}

/// A KV cache id (one per request). 0 is never a valid cache; ids are not reused.
pub type llmrt_cache = u64;

/// Which compute backend a model runs on.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum llmrt_backend {
    /// CUDA when a usable device exists, else CPU.
    LLMRT_BACKEND_AUTO = 0,
    /// The CPU.
    LLMRT_BACKEND_CPU = 1,
    /// A CUDA device; fails with LLMRT_UNSUPPORTED / LLMRT_DEVICE if none, never silently CPU.
    LLMRT_BACKEND_CUDA = 2,
}

/// Raw `llmrt_backend` as read from caller memory (C may store any int there);
/// shows as `llmrt_backend` in the header.
pub type BackendCode = u32;
/// Raw `llmrt_status` as passed by a caller; shows as `llmrt_status` in the header.
pub type StatusCode = u32;

/// Load progress callback: `fraction` goes from 0.0 to 1.0 during load.
pub type llmrt_progress_fn = Option<unsafe extern "C" fn(fraction: f32, user_data: *mut c_void)>;

/// Options for `llmrt_model_load`. Set `struct_size` to sizeof(llmrt_model_options),
/// fill with `llmrt_model_options_default`, then change what you need.
#[repr(C)]
pub struct llmrt_model_options {
    /// sizeof(llmrt_model_options): lets the struct grow; fields past it take defaults.
    pub struct_size: u32,
    /// The backend to use.
    pub backend: BackendCode,
    /// CUDA device ordinal.
    pub device: i32,
    /// CPU worker threads; 0 = all available cores (at most 1024). More than 1024:
    /// LLMRT_INVALID_ARGUMENT naming the value and the limit. A worker that cannot be
    /// started (thread or memory limit): LLMRT_OUT_OF_MEMORY saying how many started
    /// (those are stopped again).
    pub threads: u32,
    /// Cap on positions per cache; 0 = the model's context length.
    pub max_context: u32,
    /// KV pool budget in bytes; 0 = backend default.
    pub kv_cache_bytes: u64,
    /// Load progress callback; may be NULL.
    pub progress: llmrt_progress_fn,
    /// Passed to `progress`.
    pub progress_user_data: *mut c_void,
    /// 1: on a model whose every layer has a sliding window (Mistral 7B v0.1's 4096),
    /// each cache keeps only the blocks of the last window positions and books only
    /// those against the KV pool (about two windows plus 512 positions, however long its
    /// capacity: 546 blocks for a window of 4096), so several long caches fit where one
    /// did; a prefill longer than the chunk (the window within 64..=512 tokens) runs in
    /// chunks inside the call (same results). Truncating a
    /// cache below the window of its new end then fails (LLMRT_INVALID_ARGUMENT), and a
    /// saved state holds only the kept positions. 0 (default): every position is kept.
    /// No effect on a model with a full-attention layer; `llmrt_model_info.kv_window` says
    /// whether it took effect. A later field: a caller with an older, smaller struct gets 0.
    pub kv_window_only: u32,
}

/// What a loaded model is and what the load chose. The caller sets `struct_size`
/// to `sizeof(llmrt_model_info)` before `llmrt_model_get_info`; the library writes
/// only the fields inside it (an older, smaller struct gets the fields it has) and
/// sets `struct_size` to the bytes it filled.
#[repr(C)]
pub struct llmrt_model_info {
    /// Set by the caller to sizeof(llmrt_model_info); on return, the bytes written.
    pub struct_size: u32,
    /// Vocabulary size: token ids are below it.
    pub vocab_size: u32,
    /// Positions per cache, after max_context and device limits.
    pub context_length: u32,
    /// Transformer blocks.
    pub n_layers: u32,
    /// Attention (query) heads.
    pub n_heads: u32,
    /// Key/value heads (GQA when fewer than n_heads).
    pub n_kv_heads: u32,
    /// Size of one head.
    pub head_dim: u32,
    /// Hidden (embedding) size.
    pub hidden_size: u32,
    /// Beginning-of-sequence token; UINT32_MAX when the model has none.
    pub bos_token: u32,
    /// End-of-sequence token; UINT32_MAX when the model has none.
    pub eos_token: u32,
    /// The backend actually in use.
    pub backend: llmrt_backend,
    /// Bytes of weights as stored for compute.
    pub weight_bytes: u64,
    /// KV bytes of one position of one cache, all layers, K and V.
    pub kv_bytes_per_position: u64,
    /// "llama", "qwen2", "qwen3", "mistral", ... NUL-terminated.
    pub architecture: [c_char; 32],
    /// "cpu (N threads)" or the GPU's name, NUL-terminated.
    pub device_name: [c_char; 64],
    /// The KV pool shared by all caches: bytes booked for it (on CUDA allocated at
    /// load; `options.kv_cache_bytes`, or by default nine tenths of the device memory
    /// left after the weights, the scratch and a headroom of 256 MiB + 1%).
    pub kv_pool_bytes: u64,
    /// Device memory set aside at load for activations and step scratch (0 on the CPU).
    pub scratch_bytes: u64,
    /// Device memory free after the load (0 on the CPU).
    pub device_free_bytes: u64,
    /// The device's memory (0 on the CPU).
    pub device_total_bytes: u64,
    /// The positions each cache keeps when `options.kv_window_only` took effect (the
    /// largest layer window), else 0 (every position kept). A later field (not written
    /// for an older, smaller struct).
    pub kv_window: u32,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// What `llmrt_last_error` answers on a thread whose error slot is gone: a call
/// made from a TLS or pthread-key destructor while the thread exits.
const NO_ERROR_SLOT: &CStr = c"(no error message: the calling thread is exiting and its error slot is gone)";

/// Stores this thread's message. Never panics: `try_with` (not `with`), because a
/// call from a thread-exit destructor runs after the slot was destroyed (`with`
/// would panic outside any `catch_unwind`, aborting the process); a slot still
/// borrowed (cannot happen: no borrow outlives these two functions) is skipped.
fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|e| {
        if let Ok(mut e) = e.try_borrow_mut() {
            *e = c;
        }
    });
}

/// Runs `f` as an entry point body: errors and panics become statuses.
fn boundary(name: &str, f: impl FnOnce() -> Result<()>) -> llmrt_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => Status::LLMRT_OK,
        Ok(Err(e)) => {
            set_last_error(&format!("{name}: {}", e.message));
            e.status
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("{name}: internal error (caught panic): {what}"));
            Status::LLMRT_INTERNAL
        }
    }
}

/// A required pointer argument, or LLMRT_INVALID_ARGUMENT naming it.
fn need<T>(p: *const T, what: &str) -> Result<*const T> {
    if p.is_null() {
        Err(Error::invalid(format!("{what} is NULL")))
    } else {
        Ok(p)
    }
}

fn need_mut<T>(p: *mut T, what: &str) -> Result<*mut T> {
    if p.is_null() {
        Err(Error::invalid(format!("{what} is NULL")))
    } else {
        Ok(p)
    }
}

/// Fills a caller's out-parameter: checks `out` is non-null (else LLMRT_INVALID_ARGUMENT
/// naming `what`), then runs `f` and writes its value; on an error nothing is written.
///
/// # Safety
/// `out` is NULL or points to a writable `T`.
unsafe fn write_out<T>(out: *mut T, what: &str, f: impl FnOnce() -> Result<T>) -> Result<()> {
    let out = need_mut(out, what)?;
    let v = f()?;
    // SAFETY: checked non-null above; writable per this function's contract (the header's
    // contract for the entry point's out-parameter).
    unsafe { out.write(v) };
    Ok(())
}

/// The model behind a caller's handle.
fn model_ref<'a>(m: *const llmrt_model) -> Result<&'a Model> {
    let m = need(m, "model")?;
    // SAFETY: non-null, and the caller promises it came from llmrt_model_load and
    // was not freed; Model is Sync (internal mutex).
    Ok(unsafe { &(*m).inner })
}

/// Name of a status code, e.g. "LLMRT_OK"; "LLMRT_UNKNOWN_STATUS" for values
/// outside the enum. Static string, never NULL.
#[no_mangle]
pub extern "C" fn llmrt_status_name(status: StatusCode) -> *const c_char {
    Status::from_code(status).map_or(crate::error::UNKNOWN_STATUS_NAME, |s| s.info().name).as_ptr()
}

/// Message of this thread's last failed call; "" if none. Valid until this
/// thread's next llmrt call. Never NULL.
#[no_mangle]
pub extern "C" fn llmrt_last_error() -> *const c_char {
    // The pointer stays valid until this thread's next llmrt call (the slot is only
    // replaced by set_last_error) or its exit. No panic: see set_last_error.
    LAST_ERROR
        .try_with(|e| e.try_borrow().map(|e| e.as_ptr()).unwrap_or(NO_ERROR_SLOT.as_ptr()))
        .unwrap_or(NO_ERROR_SLOT.as_ptr())
}

/// Library version "MAJOR.MINOR.PATCH" (static string).
#[no_mangle]
pub extern "C" fn llmrt_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

fn default_options() -> llmrt_model_options {
    llmrt_model_options {
        struct_size: std::mem::size_of::<llmrt_model_options>() as u32,
        backend: llmrt_backend::LLMRT_BACKEND_AUTO as u32,
        device: 0,
        threads: 0,
        max_context: 0,
        kv_cache_bytes: 0,
        progress: None,
        progress_user_data: std::ptr::null_mut(),
        kv_window_only: 0,
    }
}

/// Fills `options` with defaults (AUTO backend, device 0, all cores, the model's
/// context, default KV budget, no progress callback) and sets `struct_size` to
/// sizeof(llmrt_model_options) of this header. The struct's bytes are not read
/// (uninitialised memory is fine). NULL is a no-op. A caller built against an
/// older, smaller struct uses `llmrt_model_options_init` with its own sizeof.
///
/// # Safety
/// `options` is NULL or points to sizeof(llmrt_model_options) writable bytes.
#[no_mangle]
pub unsafe extern "C" fn llmrt_model_options_default(options: *mut llmrt_model_options) {
    // SAFETY: the caller's contract is this function's with the header's sizeof.
    unsafe { llmrt_model_options_init(options, std::mem::size_of::<llmrt_model_options>()) }
}

/// `llmrt_model_options_default` for a struct of `size` bytes (the caller's
/// `sizeof(llmrt_model_options)`, which is smaller when it was built against an
/// older header): only the fields that end inside min(size, the library's sizeof)
/// are written, nothing past them, and `struct_size` is set to that size. A size
/// below 8 writes nothing. NULL is a no-op.
///
/// # Safety
/// `options` is NULL or points to min(size, sizeof(llmrt_model_options)) writable bytes.
#[no_mangle]
pub unsafe extern "C" fn llmrt_model_options_init(options: *mut llmrt_model_options, size: usize) {
    if !options.is_null() {
        // Non-null; the macro writes only inside min(size, sizeof) bytes, which the
        // contract makes writable, and reads nothing of the struct.
        write_sized!(
            options,
            llmrt_model_options,
            default_options(),
            size,
            [backend, device, threads, max_context, kv_cache_bytes, progress, progress_user_data, kv_window_only]
        );
    }
}

/// Reads a caller's options, honouring struct_size: fields that end past it keep
/// their defaults (an older, smaller struct).
///
/// # Safety
/// `p` is non-null and points to at least `struct_size` readable bytes (and 4 for struct_size).
unsafe fn read_options(p: *const llmrt_model_options) -> Result<llmrt_model_options> {
    read_sized!(
        p,
        llmrt_model_options,
        default_options(),
        "options",
        "llmrt_model_options_default",
        [backend, device, threads, max_context, kv_cache_bytes, progress, progress_user_data, kv_window_only]
    )
}

struct SendPtr(*mut c_void);

/// Loads a model. `path`: a GGUF file, or a Hugging Face model directory
/// (config.json plus model.safetensors or a sharded model.safetensors.index.json).
/// `options` may be NULL (defaults). On success `*out_model` receives
/// the model; on failure it is left untouched. Weights are memory-mapped, not
/// copied, on the CPU; a mapped file that is truncated or rewritten after load
/// makes later steps fail with LLMRT_IO ("model file changed since load") rather
/// than fault. Environment LLMRT_LOAD_COPY=1 reads the files into owned memory
/// instead (immune to later changes, costs RAM and read time). A file too large
/// for the address space or memory: LLMRT_OUT_OF_MEMORY naming it and its size.
///
/// # Safety
/// `path` is a NUL-terminated string; `options` is NULL or valid; `out_model` is
/// writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_model_load(
    path: *const c_char,
    options: *const llmrt_model_options,
    out_model: *mut *mut llmrt_model,
) -> llmrt_status {
    boundary("llmrt_model_load", || {
        let path = need(path, "path")?;
        let out_model = need_mut(out_model, "out_model")?;
        // SAFETY: checked non-null above; the header contract makes it a NUL-terminated
        // string that stays valid for the call.
        let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
        use std::os::unix::ffi::OsStrExt;
        let path = std::path::Path::new(std::ffi::OsStr::from_bytes(bytes));
        let o = if options.is_null() {
            default_options()
        } else {
            // SAFETY: non-null in this branch; the caller guarantees an llmrt_model_options of
            // at least struct_size readable bytes per the header contract.
            unsafe { read_options(options)? }
        };
        let backend = match o.backend {
            0 => BackendKind::Auto,
            1 => BackendKind::Cpu,
            2 => BackendKind::Cuda,
            b => return Err(Error::invalid(format!("options.backend = {b} is not an llmrt_backend value"))),
        };
        let user = SendPtr(o.progress_user_data);
        let cb = o.progress;
        let mut report = move |f: f32| {
            if let Some(cb) = cb {
                let u = &user;
                // SAFETY: the caller's own callback, called as the header documents it
                // (fraction, its user data) during this load only.
                unsafe { cb(f, u.0) };
            }
        };
        let opts = LoadOptions {
            backend,
            device: o.device,
            threads: o.threads,
            max_context: o.max_context,
            kv_cache_bytes: o.kv_cache_bytes,
            kv_window_only: match o.kv_window_only {
                0 => false,
                1 => true,
                v => return Err(Error::invalid(format!("options.kv_window_only = {v}: 0 or 1"))),
            },
            progress: Some(&mut report),
        };
        let model = Model::load(path, opts)?;
        let boxed = Box::into_raw(Box::new(llmrt_model { inner: model }));
        // SAFETY: checked non-null above (need_mut); writable per the header contract.
        unsafe { out_model.write(boxed) };
        Ok(())
    })
}

/// Frees a model and every cache it holds. NULL is a no-op.
///
/// # Safety
/// `model` is NULL or came from llmrt_model_load and was not freed; no other
/// thread uses it during or after this call.
#[no_mangle]
pub unsafe extern "C" fn llmrt_model_free(model: *mut llmrt_model) {
    if model.is_null() {
        return;
    }
    let _ = boundary("llmrt_model_free", || {
        // SAFETY: non-null (checked above); per the header contract it came from
        // Box::into_raw in llmrt_model_load, was not freed, and no other thread uses it.
        drop(unsafe { Box::from_raw(model) });
        Ok(())
    });
}

/// Test hook, not part of the C API (a plain Rust function: cbindgen does not
/// export it and the cdylib has no symbol for it): the next step on `model`
/// panics at `at`, so tests can check what a caught panic leaves behind.
///
/// # Safety
/// `model` is a live model.
#[doc(hidden)]
pub unsafe fn debug_panic_next_step(model: *const llmrt_model, at: crate::runtime::DebugPanic) {
    if let Ok(m) = model_ref(model) {
        m.debug_panic_next_step(at);
    }
}

fn copy_cstr<const N: usize>(dst: &mut [c_char; N], s: &str) {
    let b = s.as_bytes();
    let n = b.len().min(N - 1);
    for (d, &c) in dst.iter_mut().zip(&b[..n]) {
        *d = c as c_char;
    }
    dst[n..].fill(0);
}

/// Size of the first llmrt_model_info (through `device_name`, before the memory
/// fields): the smallest `struct_size` accepted.
const MODEL_INFO_V1_SIZE: usize = std::mem::offset_of!(llmrt_model_info, kv_pool_bytes);

/// Describes a loaded model. `out_info->struct_size` must be set by the caller
/// (sizeof(llmrt_model_info)); only min(struct_size, sizeof) bytes are written and
/// `struct_size` is set to that number. struct_size smaller than the first
/// version of the struct (160 bytes): LLMRT_INVALID_ARGUMENT, nothing written.
///
/// # Safety
/// `model` is a live model; `out_info` points to `out_info->struct_size` writable
/// bytes (at least 4).
#[no_mangle]
pub unsafe extern "C" fn llmrt_model_get_info(
    model: *const llmrt_model,
    out_info: *mut llmrt_model_info,
) -> llmrt_status {
    boundary("llmrt_model_get_info", || {
        let m = model_ref(model)?;
        let out = need_mut(out_info, "out_info")?;
        // SAFETY: struct_size is the first field; the caller owns at least its 4 bytes.
        let size = unsafe { std::ptr::addr_of!((*out).struct_size).read_unaligned() } as usize;
        let ours = std::mem::size_of::<llmrt_model_info>();
        if size < MODEL_INFO_V1_SIZE {
            return Err(Error::invalid(format!(
                "out_info->struct_size is {size}; set it to sizeof(llmrt_model_info) = {ours} \
                 (at least {MODEL_INFO_V1_SIZE}, the first version's size)"
            )));
        }
        let n = size.min(ours);
        let i = m.info();
        let mut info = llmrt_model_info {
            struct_size: n as u32,
            vocab_size: i.vocab_size,
            context_length: i.context_length,
            n_layers: i.n_layers,
            n_heads: i.n_heads,
            n_kv_heads: i.n_kv_heads,
            head_dim: i.head_dim,
            hidden_size: i.hidden_size,
            bos_token: i.bos_token.unwrap_or(u32::MAX),
            eos_token: i.eos_token.unwrap_or(u32::MAX),
            backend: match i.backend {
                BackendKind::Auto | BackendKind::Cpu => llmrt_backend::LLMRT_BACKEND_CPU,
                BackendKind::Cuda => llmrt_backend::LLMRT_BACKEND_CUDA,
            },
            weight_bytes: i.weight_bytes,
            kv_bytes_per_position: i.kv_bytes_per_position,
            architecture: [0; 32],
            device_name: [0; 64],
            kv_pool_bytes: i.kv_pool_bytes,
            scratch_bytes: i.scratch_bytes,
            device_free_bytes: i.device_free_bytes,
            device_total_bytes: i.device_total_bytes,
            kv_window: i.kv_window,
        };
        copy_cstr(&mut info.architecture, &i.architecture);
        copy_cstr(&mut info.device_name, &i.device_name);
        // Field by field, each only when it ends inside the caller's n bytes (padding
        // and anything past n untouched).
        macro_rules! put {
            ($($f:ident),+) => {$(
                if std::mem::offset_of!(llmrt_model_info, $f) + std::mem::size_of_val(&info.$f) <= n {
                    // SAFETY: non-null (need_mut); the field lies inside the struct_size
                    // writable bytes the caller guarantees per the header contract.
                    unsafe { std::ptr::addr_of_mut!((*out).$f).write_unaligned(info.$f) };
                }
            )+};
        }
        put!(
            struct_size,
            vocab_size,
            context_length,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            hidden_size,
            bos_token,
            eos_token,
            backend,
            weight_bytes,
            kv_bytes_per_position,
            architecture,
            device_name,
            kv_pool_bytes,
            scratch_bytes,
            device_free_bytes,
            device_total_bytes,
            kv_window
        );
        Ok(())
    })
}

/// Reserves a KV cache able to hold `positions` tokens (0 = the full context
/// length). The memory is guaranteed now: later steps never fail for lack of pool
/// space. positions > context length: LLMRT_CONTEXT_FULL; pool exhausted:
/// LLMRT_OUT_OF_MEMORY (with the sizes in the message).
///
/// # Safety
/// `model` is a live model; `out_cache` is writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_cache_reserve(
    model: *mut llmrt_model,
    positions: u32,
    out_cache: *mut llmrt_cache,
) -> llmrt_status {
    boundary("llmrt_cache_reserve", || {
        let m = model_ref(model)?;
        // SAFETY: the caller guarantees out_cache is NULL or writable per the header contract.
        unsafe { write_out(out_cache, "out_cache", || m.cache_reserve(positions)) }
    })
}

/// Releases a cache and its blocks. A second release: LLMRT_UNKNOWN_CACHE.
///
/// # Safety
/// `model` is a live model.
#[no_mangle]
pub unsafe extern "C" fn llmrt_cache_release(model: *mut llmrt_model, cache: llmrt_cache) -> llmrt_status {
    boundary("llmrt_cache_release", || model_ref(model)?.cache_release(cache))
}

/// Number of positions the cache holds.
///
/// # Safety
/// `model` is a live model; `out_positions` is writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_cache_length(
    model: *const llmrt_model,
    cache: llmrt_cache,
    out_positions: *mut u32,
) -> llmrt_status {
    boundary("llmrt_cache_length", || {
        let m = model_ref(model)?;
        // SAFETY: the caller guarantees out_positions is NULL or writable per the header contract.
        unsafe { write_out(out_positions, "out_positions", || m.cache_length(cache)) }
    })
}

/// Keeps the first `positions` tokens of the cache and drops the rest (rewind
/// for multi-turn reuse). More positions than the cache holds:
/// LLMRT_INVALID_ARGUMENT.
///
/// # Safety
/// `model` is a live model.
#[no_mangle]
pub unsafe extern "C" fn llmrt_cache_truncate(
    model: *mut llmrt_model,
    cache: llmrt_cache,
    positions: u32,
) -> llmrt_status {
    boundary("llmrt_cache_truncate", || model_ref(model)?.cache_truncate(cache, positions))
}

/// A new cache holding the same tokens as `source`, sharing its KV blocks
/// copy-on-write. Reserves like llmrt_cache_reserve with the source's capacity.
///
/// # Safety
/// `model` is a live model; `out_cache` is writable.
#[no_mangle]
pub unsafe extern "C" fn llmrt_cache_fork(
    model: *mut llmrt_model,
    source: llmrt_cache,
    out_cache: *mut llmrt_cache,
) -> llmrt_status {
    boundary("llmrt_cache_fork", || {
        let m = model_ref(model)?;
        // SAFETY: the caller guarantees out_cache is NULL or writable per the header contract.
        unsafe { write_out(out_cache, "out_cache", || m.cache_fork(source)) }
    })
}

/// Validates a token array's pointer and length before a slice is formed.
fn token_slice<'a>(
    m: &Model,
    tokens: *const u32,
    n: usize,
    what: &str,
    cache: Option<llmrt_cache>,
) -> Result<&'a [u32]> {
    let tokens = need(tokens, what)?;
    if n == 0 {
        return Err(Error::invalid(format!("{what}: length is 0")));
    }
    let ctx = m.info().context_length as usize;
    if n > ctx {
        if let Some(c) = cache {
            m.cache_length(c)?;
        }
        return Err(Error::context_full(format!("{n} tokens exceed the context length {ctx}")));
    }
    // SAFETY: checked non-null above; the caller guarantees n readable u32s per the header
    // contract; n <= context length bounds the slice.
    Ok(unsafe { std::slice::from_raw_parts(tokens, n) })
}

/// A caller's output buffer of `n` floats (n already bounded by the model).
///
/// # Safety
/// `p` is NULL or points to `n` writable floats.
unsafe fn out_floats<'a>(p: *mut f32, n: usize) -> Option<&'a mut [f32]> {
    if p.is_null() {
        None
    } else {
        // SAFETY: non-null in this branch; n writable floats per this function's contract.
        Some(unsafe { std::slice::from_raw_parts_mut(p, n) })
    }
}

/// Appends `n_tokens` (>= 1) to the cache and runs them as one prefill.
/// `last_logits`: NULL, or vocab_size floats for the last token. On failure the
/// cache and `last_logits` are unchanged.
///
/// # Safety
/// `model` is a live model; `tokens` holds `n_tokens` ids; `last_logits` is NULL
/// or holds vocab_size floats.
#[no_mangle]
pub unsafe extern "C" fn llmrt_prefill(
    model: *mut llmrt_model,
    cache: llmrt_cache,
    tokens: *const u32,
    n_tokens: usize,
    last_logits: *mut f32,
) -> llmrt_status {
    boundary("llmrt_prefill", || {
        let m = model_ref(model)?;
        let toks = token_slice(m, tokens, n_tokens, "tokens", Some(cache))?;
        // SAFETY: the header contract makes last_logits NULL or vocab_size writable floats.
        let out = unsafe { out_floats(last_logits, m.info().vocab_size as usize) };
        m.prefill(cache, toks, out, false)
    })
}

/// As llmrt_prefill, but writes logits for every token: n_tokens * vocab_size
/// floats, row-major (scoring, perplexity). `all_logits` is required.
///
/// # Safety
/// As llmrt_prefill; `all_logits` holds n_tokens * vocab_size floats.
#[no_mangle]
pub unsafe extern "C" fn llmrt_prefill_all(
    model: *mut llmrt_model,
    cache: llmrt_cache,
    tokens: *const u32,
    n_tokens: usize,
    all_logits: *mut f32,
) -> llmrt_status {
    boundary("llmrt_prefill_all", || {
        let m = model_ref(model)?;
        let toks = token_slice(m, tokens, n_tokens, "tokens", Some(cache))?;
        let n = n_tokens
            .checked_mul(m.info().vocab_size as usize)
            .ok_or_else(|| Error::invalid("n_tokens * vocab_size overflows"))?;
        need_mut(all_logits, "all_logits")?;
        // SAFETY: checked non-null above; the caller guarantees n_tokens * vocab_size writable
        // floats per the header contract (the product checked for overflow above).
        let out = unsafe { out_floats(all_logits, n) };
        m.prefill(cache, toks, out, true)
    })
}

/// Most caches one decode step takes (a bound checked before slices are formed).
const MAX_BATCH: usize = 1 << 20;

/// Validates a batch's arrays before slices are formed.
fn batch<'a>(n: usize, caches: *const llmrt_cache, tokens: *const u32) -> Result<(&'a [u64], &'a [u32])> {
    let caches = need(caches, "caches")?;
    let tokens = need(tokens, "tokens")?;
    if n == 0 {
        return Err(Error::invalid("n = 0: a decode step needs at least one cache"));
    }
    if n > MAX_BATCH {
        return Err(Error::invalid(format!("n = {n} caches exceeds the largest batch, {MAX_BATCH}")));
    }
    // SAFETY: both checked non-null above; the caller guarantees n elements each per the
    // header contract; n <= MAX_BATCH bounds the slices.
    Ok(unsafe { (std::slice::from_raw_parts(caches, n), std::slice::from_raw_parts(tokens, n)) })
}

/// One decode step for n distinct caches at once (continuous batching): appends
/// tokens[i] to caches[i]. `logits`: NULL, or n * vocab_size floats, row i for
/// caches[i]. Either every cache advances or none does.
///
/// # Safety
/// `model` is a live model; `caches` and `tokens` hold n elements; `logits` is
/// NULL or holds n * vocab_size floats.
#[no_mangle]
pub unsafe extern "C" fn llmrt_decode(
    model: *mut llmrt_model,
    n: usize,
    caches: *const llmrt_cache,
    tokens: *const u32,
    logits: *mut f32,
) -> llmrt_status {
    boundary("llmrt_decode", || {
        let m = model_ref(model)?;
        let (c, t) = batch(n, caches, tokens)?;
        // SAFETY: the header contract makes logits NULL or n * vocab_size writable floats;
        // n <= MAX_BATCH (checked in batch), so the product does not overflow.
        let out = unsafe { out_floats(logits, n * m.info().vocab_size as usize) };
        m.decode(c, t, out)
    })
}

/// As llmrt_decode, but the backend picks the argmax itself and writes n token
/// ids to `next_tokens` (on the GPU: no logits copy).
///
/// # Safety
/// As llmrt_decode; `next_tokens` holds n elements.
#[no_mangle]
pub unsafe extern "C" fn llmrt_decode_greedy(
    model: *mut llmrt_model,
    n: usize,
    caches: *const llmrt_cache,
    tokens: *const u32,
    next_tokens: *mut u32,
) -> llmrt_status {
    boundary("llmrt_decode_greedy", || {
        let m = model_ref(model)?;
        let (c, t) = batch(n, caches, tokens)?;
        let next = need_mut(next_tokens, "next_tokens")?;
        let mut ids = crate::util::try_vec(n, 0u32, "the step's token ids")?;
        m.decode_greedy(c, t, &mut ids)?;
        // SAFETY: next_tokens checked non-null above; the caller guarantees n writable u32s
        // per the header contract (n <= MAX_BATCH, checked in batch).
        unsafe { std::slice::from_raw_parts_mut(next, n) }.copy_from_slice(&ids);
        Ok(())
    })
}
