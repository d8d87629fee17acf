//! Test helpers: a thin safe wrapper over the C entry points (so the integration
//! tests exercise the real boundary) and the fixture files.
#![allow(dead_code)]

use llmrt::ffi::*;
use llmrt::Status;
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};

/// The fixtures folder, resolved at run time (test executables may run on another
/// machine, from another folder): `LLMRT_FIXTURES`, else `tests/fixtures` under the
/// current directory, else the one of the source tree this was built from.
pub fn fixtures() -> PathBuf {
    if let Some(d) = std::env::var_os("LLMRT_FIXTURES").filter(|v| !v.is_empty()) {
        return PathBuf::from(d);
    }
    let here = Path::new("tests/fixtures");
    if here.is_dir() {
        return here.to_path_buf();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn last_error() -> String {
    // SAFETY: llmrt_last_error never returns NULL.
    unsafe { CStr::from_ptr(llmrt_last_error()) }.to_string_lossy().into_owned()
}

/// The library's default sampler parameters (`llmrt_sampler_params_default`).
pub fn default_sampler_params() -> llmrt_sampler_params {
    let mut p = std::mem::MaybeUninit::<llmrt_sampler_params>::uninit();
    // SAFETY: a pointer to a local MaybeUninit of the right type, written in full.
    unsafe { llmrt_sampler_params_default(p.as_mut_ptr()) };
    // SAFETY: filled in by llmrt_sampler_params_default just above.
    unsafe { p.assume_init() }
}

/// Panics with the status and message unless `s` is OK.
pub fn ok(s: Status, what: &str) {
    assert_eq!(s, Status::LLMRT_OK, "{what}: {}", last_error());
}

pub struct M {
    pub ptr: *mut llmrt_model,
    pub vocab: usize,
    pub ctx: u32,
}

// SAFETY: the C API lets any thread call on a model (calls on one model are serialised inside the library).
unsafe impl Send for M {}

impl Drop for M {
    fn drop(&mut self) {
        // SAFETY: self.ptr came from llmrt_model_load and is freed here only, once.
        unsafe { llmrt_model_free(self.ptr) }
    }
}

/// Loads on the CPU backend (every CPU test goes through here).
pub fn try_load(path: &Path, threads: u32, kv_bytes: u64) -> Result<M, (Status, String)> {
    try_load_with(path, llmrt_backend::LLMRT_BACKEND_CPU, 0, threads, kv_bytes)
}

/// Loads with the given backend and device ordinal.
pub fn try_load_with(
    path: &Path,
    backend: llmrt_backend,
    device: i32,
    threads: u32,
    kv_bytes: u64,
) -> Result<M, (Status, String)> {
    try_load_opts(path, |o| {
        o.backend = backend as u32;
        o.device = device;
        o.threads = threads;
        o.kv_cache_bytes = kv_bytes;
    })
}

/// Loads with the default options as `edit` changes them (`struct_size` included).
pub fn try_load_opts(path: &Path, edit: impl FnOnce(&mut llmrt_model_options)) -> Result<M, (Status, String)> {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    let mut o = std::mem::MaybeUninit::<llmrt_model_options>::uninit();
    // SAFETY: struct_size is the first field of the local; the caller sets it (its size).
    unsafe { (*o.as_mut_ptr()).struct_size = std::mem::size_of::<llmrt_model_options>() as u32 };
    // SAFETY: a pointer to a local MaybeUninit of the right type, written in full.
    unsafe { llmrt_model_options_default(o.as_mut_ptr()) };
    // SAFETY: filled in by the llmrt_*_default (or get_info) call just above.
    let mut o = unsafe { o.assume_init() };
    edit(&mut o);
    let mut m = std::ptr::null_mut();
    // SAFETY: c is a NUL-terminated CString, o filled options, m a local out-pointer.
    let s = unsafe { llmrt_model_load(c.as_ptr(), &o, &mut m) };
    if s != Status::LLMRT_OK {
        return Err((s, last_error()));
    }
    let mut info = std::mem::MaybeUninit::<llmrt_model_info>::zeroed();
    // SAFETY: struct_size is the first field of the local; the caller sets it.
    unsafe { (*info.as_mut_ptr()).struct_size = std::mem::size_of::<llmrt_model_info>() as u32 };
    // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
    ok(unsafe { llmrt_model_get_info(m, info.as_mut_ptr()) }, "get_info");
    // SAFETY: filled in by the llmrt_*_default (or get_info) call just above.
    let info = unsafe { info.assume_init() };
    Ok(M { ptr: m, vocab: info.vocab_size as usize, ctx: info.context_length })
}

pub fn load(path: &Path) -> M {
    try_load(path, 2, 0).unwrap_or_else(|(s, e)| panic!("load {}: {s:?} {e}", path.display()))
}

impl M {
    pub fn info(&self) -> llmrt_model_info {
        let mut info = std::mem::MaybeUninit::<llmrt_model_info>::zeroed();
        // SAFETY: struct_size is the first field of the local; the caller sets it.
        unsafe { (*info.as_mut_ptr()).struct_size = std::mem::size_of::<llmrt_model_info>() as u32 };
        // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
        ok(unsafe { llmrt_model_get_info(self.ptr, info.as_mut_ptr()) }, "get_info");
        // SAFETY: filled in by the llmrt_*_default (or get_info) call just above.
        unsafe { info.assume_init() }
    }
    /// `llmrt_embed`, asking the size first (NULL, capacity 0) as a C caller would.
    pub fn embed(&self, toks: &[u32], pooling: u32, normalize: bool) -> Result<Vec<f32>, (Status, String)> {
        let mut need = 0usize;
        let null = std::ptr::null_mut();
        // SAFETY: a live model; toks a live slice; NULL output with capacity 0; need a local.
        let s = unsafe { llmrt_embed(self.ptr, toks.as_ptr(), toks.len(), pooling, normalize, null, 0, &mut need) };
        if s != Status::LLMRT_BUFFER_TOO_SMALL {
            return Err((s, last_error()));
        }
        let mut out = vec![f32::NAN; need];
        let mut len = 0usize;
        let p = out.as_mut_ptr();
        // SAFETY: as above, out holds `need` writable floats.
        let s = unsafe { llmrt_embed(self.ptr, toks.as_ptr(), toks.len(), pooling, normalize, p, need, &mut len) };
        if s != Status::LLMRT_OK {
            return Err((s, last_error()));
        }
        assert_eq!(len, need, "floats written vs the size asked");
        Ok(out)
    }
    pub fn reserve(&self, positions: u32) -> u64 {
        let mut c = 0;
        // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
        ok(unsafe { llmrt_cache_reserve(self.ptr, positions, &mut c) }, "reserve");
        c
    }
    pub fn fork(&self, src: u64) -> u64 {
        let mut c = 0;
        // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
        ok(unsafe { llmrt_cache_fork(self.ptr, src, &mut c) }, "fork");
        c
    }
    pub fn release(&self, c: u64) -> Status {
        // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
        unsafe { llmrt_cache_release(self.ptr, c) }
    }
    pub fn truncate(&self, c: u64, n: u32) -> Status {
        // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
        unsafe { llmrt_cache_truncate(self.ptr, c, n) }
    }
    pub fn len(&self, c: u64) -> u32 {
        let mut n = 0;
        // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
        ok(unsafe { llmrt_cache_length(self.ptr, c, &mut n) }, "length");
        n
    }
    pub fn try_prefill_all(&self, c: u64, toks: &[u32]) -> Result<Vec<f32>, Status> {
        let mut out = vec![f32::NAN; toks.len() * self.vocab];
        // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
        let s = unsafe { llmrt_prefill_all(self.ptr, c, toks.as_ptr(), toks.len(), out.as_mut_ptr()) };
        if s == Status::LLMRT_OK {
            Ok(out)
        } else {
            Err(s)
        }
    }
    pub fn prefill_all(&self, c: u64, toks: &[u32]) -> Vec<f32> {
        self.try_prefill_all(c, toks).unwrap_or_else(|s| panic!("prefill_all: {s:?} {}", last_error()))
    }
    pub fn prefill(&self, c: u64, toks: &[u32]) -> Vec<f32> {
        let mut out = vec![f32::NAN; self.vocab];
        // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
        ok(unsafe { llmrt_prefill(self.ptr, c, toks.as_ptr(), toks.len(), out.as_mut_ptr()) }, "prefill");
        out
    }
    pub fn try_decode(&self, caches: &[u64], toks: &[u32]) -> Result<Vec<f32>, Status> {
        let mut out = vec![f32::NAN; caches.len() * self.vocab];
        // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
        let s = unsafe { llmrt_decode(self.ptr, caches.len(), caches.as_ptr(), toks.as_ptr(), out.as_mut_ptr()) };
        if s == Status::LLMRT_OK {
            Ok(out)
        } else {
            Err(s)
        }
    }
    pub fn decode(&self, caches: &[u64], toks: &[u32]) -> Vec<f32> {
        self.try_decode(caches, toks).unwrap_or_else(|s| panic!("decode: {s:?} {}", last_error()))
    }
    pub fn decode_greedy(&self, caches: &[u64], toks: &[u32]) -> Vec<u32> {
        let mut out = vec![u32::MAX; caches.len()];
        ok(
            // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
            unsafe { llmrt_decode_greedy(self.ptr, caches.len(), caches.as_ptr(), toks.as_ptr(), out.as_mut_ptr()) },
            "decode_greedy",
        );
        out
    }
}

/// The library's argmax (first index on ties), which the greedy paths use too.
#[allow(unused_imports)] // not every test binary takes the argmax
pub use llmrt::util::argmax;

/// Relative L2 error of `got` against `want`.
pub fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let mut num = 0f64;
    let mut den = 0f64;
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    (num / den.max(1e-300)).sqrt()
}

/// A fixture model: its reference and files.
pub struct Fixture {
    pub name: String,
    pub dir: PathBuf,
    pub json: serde_json::Value,
    pub tokens: Vec<u32>,
    pub logits: Vec<f32>,
    pub vocab: usize,
}

/// A raw little-endian f32 file.
/// A JSON file of the fixtures (index files, references).
pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn read_f32(path: &Path) -> Vec<f32> {
    let raw = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    raw.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

impl Fixture {
    pub fn all() -> Vec<Fixture> {
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir(fixtures()) else { return out };
        let mut dirs: Vec<PathBuf> =
            rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.join("reference.json").exists()).collect();
        dirs.sort();
        for dir in dirs {
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            let json: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
            let logits = read_f32(&dir.join(json["logits_file"].as_str().unwrap()));
            out.push(Fixture {
                name,
                tokens: ids(&json["tokens"]),
                vocab: json["vocab_size"].as_u64().unwrap() as usize,
                dir,
                json,
                logits,
            });
        }
        out
    }
    /// The fixture called `name` (panics naming it when absent).
    pub fn named(name: &str) -> Fixture {
        Fixture::all().into_iter().find(|f| f.name == name).unwrap_or_else(|| panic!("fixture {name}"))
    }
    pub fn gguf(&self, ty: &str) -> PathBuf {
        self.dir.join(format!("{}.{ty}.gguf", self.name))
    }
    pub fn greedy_prompt(&self) -> Vec<u32> {
        ids(&self.json["greedy_prompt"])
    }
    pub fn greedy_ids(&self) -> Vec<u32> {
        ids(&self.json["greedy_ids"])
    }
}

/// A copy of the GGUF `src` at `dst` with each `(key, value)` set in its metadata
/// (added or replaced); tensors as they are.
pub fn gguf_with_keys(src: &Path, dst: &Path, keys: Vec<(&str, llmrt::format::gguf::Value)>) {
    let g = llmrt::format::gguf::Gguf::open(src).unwrap();
    let mut w = llmrt::format::gguf_write::GgufWriter::new();
    for (k, v) in g.metadata() {
        if k != "general.alignment" && keys.iter().all(|(key, _)| *key != k) {
            w.kv(&k, v);
        }
    }
    for (key, value) in keys {
        w.kv(key, value);
    }
    for t in &g.tensors {
        w.tensor_raw(&t.name, &t.ne, t.ggml_type, g.tensor_data(t).to_vec());
    }
    w.write(dst).unwrap();
}

/// A copy of the HF directory `src` at `dst` (made) with its config.json as `edit` changes it.
pub fn hf_dir_with_config(src: &Path, dst: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let cfg = dst.join("config.json");
    let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    edit(&mut c);
    std::fs::write(&cfg, serde_json::to_vec_pretty(&c).unwrap()).unwrap();
}
