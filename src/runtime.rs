//! The safe Rust API: a loaded [`Model`], its caches, and steps. Every call
//! validates its arguments completely before anything changes, so a failed call
//! leaves every cache as it was. Calls on one model are serialised by a mutex;
//! different models run in parallel.

use crate::abort::AbortHook;
use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, Seq, Want};
use crate::chat::ChatInfo;
use crate::format::gguf::Gguf;
use crate::kv::{KvManager, WindowKv, BLOCK_POSITIONS};
use crate::model::weights::Weights;
use crate::model::Config;
use crate::sample::{self, SamplerParams};
use crate::tokenizer::Tokenizer;
use crate::util::{try_collect, try_vec, try_with_capacity};
use crate::{Error, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The most CPU worker threads a model may have (`LoadOptions::threads`,
/// `llmrt_model_options.threads`); more is `LLMRT_INVALID_ARGUMENT`.
pub const MAX_THREADS: u32 = crate::backend::cpu::pool::MAX_THREADS as u32;

/// `threads` of the load options, checked before anything is loaded.
fn check_threads(threads: u32) -> Result<()> {
    if threads > MAX_THREADS {
        return Err(Error::invalid(format!(
            "options.threads = {threads} exceeds the most CPU worker threads, {MAX_THREADS} (0 = all available cores)"
        )));
    }
    Ok(())
}

/// fork() safety for the models' locks. A child process has only the thread that
/// called fork, so a model lock held by another thread at that moment would stay
/// locked in the child for good (its first call would hang). An atfork `prepare`
/// handler (installed with the first model) therefore waits until no thread holds
/// or waits for a model's lock, and holds new callers back until the fork is done
/// (the `parent` / `child` handlers): a fork waits for the steps in progress to end.
/// Atomics only (a mutex here could itself be held at the fork). The CPU workers
/// are another matter: `backend::cpu::pool` starts new ones in the child.
mod fork_gate {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::time::Duration;

    /// Threads holding, or waiting for, a model's lock.
    static ACTIVE: AtomicUsize = AtomicUsize::new(0);
    /// Forks in progress (between `prepare` and `parent`).
    static FORKING: AtomicUsize = AtomicUsize::new(0);
    static INSTALL: std::sync::Once = std::sync::Once::new();

    /// Installs the atfork handlers (once per process).
    pub(super) fn install() {
        INSTALL.call_once(|| {
            // SAFETY: registers three extern "C" functions that only use atomics and
            // sleep (nothing that can be held at the fork, no panic).
            let r = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
            debug_assert_eq!(r, 0, "pthread_atfork");
        });
    }

    /// One thread's claim on model locks, from before it locks until it unlocked.
    pub(super) struct Token(());

    pub(super) fn enter() -> Token {
        loop {
            while FORKING.load(SeqCst) != 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
            ACTIVE.fetch_add(1, SeqCst);
            if FORKING.load(SeqCst) == 0 {
                return Token(());
            }
            // A fork began meanwhile: let it pass.
            ACTIVE.fetch_sub(1, SeqCst);
        }
    }

    impl Drop for Token {
        fn drop(&mut self) {
            ACTIVE.fetch_sub(1, SeqCst);
        }
    }

    /// Forks whose `prepare` found a model lock held or waited for (tests).
    pub(super) static WAITED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    extern "C" fn prepare() {
        FORKING.fetch_add(1, SeqCst);
        if ACTIVE.load(SeqCst) != 0 {
            WAITED.fetch_add(1, SeqCst);
        }
        while ACTIVE.load(SeqCst) != 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    extern "C" fn parent() {
        FORKING.fetch_sub(1, SeqCst);
    }

    extern "C" fn child() {
        // The child's one thread holds no model lock (it is in fork, not in an llmrt
        // call): a count left by a thread of the parent that was backing off in
        // `enter` at the fork, and forks of other threads of the parent, do not
        // concern it (else a fork in the child could wait forever).
        ACTIVE.store(0, SeqCst);
        FORKING.store(0, SeqCst);
    }
}

/// How many fork() calls in this process had to wait for another thread's call on a
/// model to finish before forking (test hook for `tests/fork.rs`; not a stable API).
#[doc(hidden)]
pub fn forks_that_waited() -> u64 {
    fork_gate::WAITED.load(Ordering::SeqCst)
}

/// A model's locked state, with the fork gate's claim (dropped after the lock).
struct StateGuard<'a> {
    guard: MutexGuard<'a, State>,
    _token: fork_gate::Token,
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.guard
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.guard
    }
}

/// Which backend to run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    Auto,
    Cpu,
    Cuda,
}

/// Load options (the safe twin of `llmrt_model_options`).
pub struct LoadOptions<'a> {
    pub backend: BackendKind,
    pub device: i32,
    /// Worker threads; 0 = all available cores.
    pub threads: u32,
    /// Cap on positions per cache; 0 = the model's context length.
    pub max_context: u32,
    /// KV pool budget in bytes; 0 = backend default.
    pub kv_cache_bytes: u64,
    /// On a model whose every layer has a sliding window: caches keep (and book) only
    /// the positions of the window (`crate::kv`'s windowed caches); truncating below it
    /// then fails. No effect on other models (`ModelInfo::kv_window` says which).
    pub kv_window_only: bool,
    /// Called with the fraction loaded, 0.0 ..= 1.0.
    pub progress: Option<&'a mut dyn FnMut(f32)>,
}

impl Default for LoadOptions<'_> {
    fn default() -> Self {
        LoadOptions {
            backend: BackendKind::Auto,
            device: 0,
            threads: 0,
            max_context: 0,
            kv_cache_bytes: 0,
            kv_window_only: false,
            progress: None,
        }
    }
}

/// What `llmrt_model_get_info` reports.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub vocab_size: u32,
    pub context_length: u32,
    pub n_layers: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub hidden_size: u32,
    pub bos_token: Option<u32>,
    pub eos_token: Option<u32>,
    pub backend: BackendKind,
    pub weight_bytes: u64,
    pub kv_bytes_per_position: u64,
    pub kv_pool_bytes: u64,
    /// Device scratch allocated at load (0 on the CPU).
    pub scratch_bytes: u64,
    /// Device memory free after the load (0 on the CPU).
    pub device_free_bytes: u64,
    /// The device's memory (0 on the CPU).
    pub device_total_bytes: u64,
    pub architecture: String,
    pub device_name: String,
    /// Mixture of experts: (experts, experts used per token, bytes of all the routed
    /// experts' matrices, shared experts and routers excluded); `None` for a dense model.
    pub experts: Option<(u32, u32, u64)>,
    /// The positions a cache keeps when `kv_window_only` took effect (every layer has a
    /// window: the largest), else 0 (caches keep every position).
    pub kv_window: u32,
}

struct State {
    kv: KvManager,
    backend: Box<dyn Backend>,
    /// Set (for good) once a mapped model file was seen changed: steps fail with it.
    file_changed: Option<Error>,
}

/// A loaded model: weights, a KV pool and a backend.
///
/// Panics (bugs) inside a step's compute are caught here, the step is rolled back
/// like any failed step, and the model stays usable. A panic anywhere else while
/// the model's lock is held (the cache bookkeeping) poisons the lock: from then on
/// every call on the model fails with `LLMRT_INTERNAL` ("model is unusable"), and
/// only freeing it is left. See docs/RELIABILITY.md.
pub struct Model {
    info: ModelInfo,
    /// The tokenizer, or why there is none (`LLMRT_UNSUPPORTED`: none in the file, or one
    /// llmrt cannot run; the model still runs on ids).
    tokenizer: TokenizerOrWhy,
    /// Chat template, bos/eos strings, end-of-generation ids (`crate::chat`).
    pub(crate) chat: crate::chat::ChatInfo,
    /// The weights, for the file check before each CPU step.
    weights: Arc<Weights>,
    /// Whether steps read the model files (CPU): then a changed file stops them.
    reads_files: bool,
    /// Test hook, see [`Model::debug_panic_next_step`].
    debug_panic: AtomicU8,
    /// The grammar machinery, built on first use (`crate::grammar`).
    grammar: crate::grammar::FactorySlot,
    /// The caller's abort hook ([`Model::set_abort_hook`]); its own lock, so setting it
    /// never waits for a running step (which polls the hook it started with).
    abort: Mutex<Option<AbortHook>>,
    /// What a saved cache state must match (`crate::kv::state`).
    state_geometry: crate::kv::state::Geometry,
    state: Mutex<State>,
}

/// Where [`Model::debug_panic_next_step`] makes the next step panic.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum DebugPanic {
    /// Nothing armed.
    None = 0,
    /// Inside the step's compute, after the backend wrote the new positions' KV.
    Compute = 1,
    /// In the bookkeeping, with the model's lock held, outside the compute guard.
    Bookkeeping = 2,
}

/// The tokenizer of a Hugging Face directory: tokenizer.json (with
/// tokenizer_config.json when present), else a SentencePiece tokenizer.model, else none.
fn hf_tokenizer(dir: &Path) -> Result<Option<Tokenizer>> {
    // Regular files only: a FIFO named tokenizer.json must not hang the load.
    let read = |name: &str| crate::format::read_small_file(&dir.join(name));
    if let Some(json) = read("tokenizer.json")? {
        let config = read("tokenizer_config.json")?;
        let name = dir.join("tokenizer.json").display().to_string();
        return Tokenizer::from_hf_json(&json, config.as_deref(), &name).map(Some);
    }
    if let Some(model) = read("tokenizer.model")? {
        let name = dir.join("tokenizer.model").display().to_string();
        return Tokenizer::from_sentencepiece_model(&model, &name).map(Some);
    }
    Ok(None)
}

/// A model's tokenizer, or why it has none (see [`tokenizer_or_why`]).
type TokenizerOrWhy = std::result::Result<Tokenizer, Error>;

/// A model whose tokenizer llmrt cannot run (`LLMRT_UNSUPPORTED`: an unknown tokenizer model or
/// pre-tokenizer) still loads; the error is kept for the text calls. Other errors fail the load.
fn tokenizer_or_why(t: Result<Option<Tokenizer>>) -> Result<TokenizerOrWhy> {
    match t {
        Ok(Some(t)) => Ok(Ok(t)),
        Ok(None) => Ok(Err(Error::unsupported("this model carries no tokenizer"))),
        Err(e) if e.status == crate::Status::LLMRT_UNSUPPORTED => {
            Ok(Err(Error::unsupported(format!("this model's tokenizer is not supported: {}", e.message))))
        }
        Err(e) => Err(e),
    }
}

/// The backend a load runs on (see [`Model::load`]).
fn choose_backend(backend: BackendKind) -> Result<BackendKind> {
    Ok(match backend {
        BackendKind::Cpu => BackendKind::Cpu,
        BackendKind::Cuda => {
            crate::backend::cuda::probe()?;
            BackendKind::Cuda
        }
        BackendKind::Auto => match crate::backend::cuda::probe() {
            Ok(_) => BackendKind::Cuda,
            Err(e) if e.status == crate::Status::LLMRT_UNSUPPORTED => BackendKind::Cpu,
            Err(e) => return Err(e),
        },
    })
}

/// Hyperparameters, tokenizer and bound weights of a parsed GGUF file.
fn bind_gguf(
    file: Arc<Gguf>,
    bind_share: f32,
    report: &mut dyn FnMut(f32),
) -> Result<(Config, Weights, (TokenizerOrWhy, ChatInfo))> {
    let cfg = Config::from_gguf(&file)?;
    let tokenizer = tokenizer_or_why(Tokenizer::from_gguf(&file))?;
    let chat = ChatInfo::from_gguf(&file, tokenizer.as_ref().ok(), cfg.vocab_size)?;
    let weights = Weights::bind(file, &cfg, &mut |f| report(0.1 + bind_share * f))?;
    Ok((cfg, weights, (tokenizer, chat)))
}

/// Default KV pool on the CPU, in blocks: a quarter of physical memory, and at
/// least one full context. Both are counted in whole blocks, the context rounded
/// up as a reservation rounds it, so `reserve(0)` always fits in an empty pool
/// (storage is allocated as blocks are first written).
fn default_cpu_kv_blocks(per_position: u64, context: u64) -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let phys = if pages > 0 && page > 0 { pages as u64 * page as u64 } else { 8 << 30 };
    let block_bytes = per_position.saturating_mul(BLOCK_POSITIONS as u64).max(1);
    let context_blocks = context.div_ceil(BLOCK_POSITIONS as u64);
    ((phys / 4) / block_bytes).max(context_blocks).min(usize::MAX as u64) as usize
}

impl Model {
    /// Loads a model: a GGUF file, or a Hugging Face model directory (config.json
    /// plus `model.safetensors` or a sharded `model.safetensors.index.json`).
    ///
    /// Backend choice: `Cpu` runs on the CPU. `Cuda` runs on device `device` or fails
    /// (`LLMRT_UNSUPPORTED` when there is no driver or no device, `LLMRT_DEVICE` for a
    /// driver failure, `LLMRT_INVALID_ARGUMENT` for a bad ordinal), never silently on
    /// the CPU. `Auto` is `Cuda` when the probe finds a device and `Cpu` only when the
    /// probe answers `LLMRT_UNSUPPORTED` (no driver, no device); any other failure,
    /// including one while opening the device, is returned.
    pub fn load(path: &Path, opts: LoadOptions<'_>) -> Result<Model> {
        let LoadOptions { backend, device, threads, max_context, kv_cache_bytes, kv_window_only, mut progress } = opts;
        check_threads(threads)?;
        let mut report = |f: f32| {
            if let Some(p) = progress.as_mut() {
                p(f)
            }
        };
        report(0.0);
        let kind = choose_backend(backend)?;
        // Binding takes 0.1..0.3 of the bar and the backend's set-up (CPU repacking, CUDA
        // uploads) 0.3..0.95, so the fraction never goes back.
        let bind_share = 0.2;
        let (cfg, weights, tokenizer) = if path.is_dir() {
            let config = path.join(crate::model::hf::CONFIG_FILE);
            if !config.is_file() {
                return Err(Error::io(format!(
                    "{}: is a directory without config.json; give a GGUF file or a Hugging Face model directory \
                     (config.json plus model.safetensors or model.safetensors.index.json)",
                    path.display()
                )));
            }
            let (cfg, weights) = crate::model::hf::load(path, &mut |f| report((0.1 + bind_share) * f))?;
            let tokenizer = tokenizer_or_why(hf_tokenizer(path))?;
            let chat = ChatInfo::from_hf_dir(path, tokenizer.as_ref().ok(), cfg.vocab_size)?;
            (cfg, weights, (tokenizer, chat))
        } else {
            let file = Arc::new(Gguf::open(path)?);
            report(0.1);
            bind_gguf(file, bind_share, &mut report)?
        };
        Self::finish(
            path,
            kind,
            cfg,
            weights,
            tokenizer,
            device,
            threads,
            max_context,
            (kv_cache_bytes, kv_window_only),
            &mut report,
        )
    }

    /// Loads a GGUF model held in memory (tests, fuzzing, generated models): as
    /// [`Self::load`] of a file with these bytes; `name` stands for the file name in
    /// error messages.
    pub fn load_gguf_bytes(bytes: Vec<u8>, name: &str, opts: LoadOptions<'_>) -> Result<Model> {
        let LoadOptions { backend, device, threads, max_context, kv_cache_bytes, kv_window_only, mut progress } = opts;
        check_threads(threads)?;
        let mut report = |f: f32| {
            if let Some(p) = progress.as_mut() {
                p(f)
            }
        };
        report(0.0);
        let kind = choose_backend(backend)?;
        // Binding takes 0.1..0.3 of the bar and the backend's set-up (CPU repacking, CUDA
        // uploads) 0.3..0.95, so the fraction never goes back.
        let bind_share = 0.2;
        let file = Arc::new(Gguf::from_bytes(bytes, name)?);
        report(0.1);
        let (cfg, weights, tokenizer) = bind_gguf(file, bind_share, &mut report)?;
        Self::finish(
            Path::new(name),
            kind,
            cfg,
            weights,
            tokenizer,
            device,
            threads,
            max_context,
            (kv_cache_bytes, kv_window_only),
            &mut report,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(
        path: &Path,
        kind: BackendKind,
        cfg: Config,
        weights: Weights,
        (tokenizer, chat): (TokenizerOrWhy, ChatInfo),
        device: i32,
        threads: u32,
        max_context: u32,
        (kv_cache_bytes, kv_window_only): (u64, bool),
        report: &mut dyn FnMut(f32),
    ) -> Result<Model> {
        let context = if max_context == 0 { cfg.context_length } else { cfg.context_length.min(max_context as usize) };
        let context = context.min(u32::MAX as usize - BLOCK_POSITIONS) as u32;
        let mut weights = weights;
        weights.select_rope(&cfg, context as usize);
        let weights = Arc::new(weights);
        let fingerprint = crate::kv::state::model_fingerprint(&cfg, &weights);
        if let Ok(t) = &tokenizer {
            if t.vocab_size() > cfg.vocab_size {
                return Err(Error::bad_model(format!(
                    "{}: the tokenizer has {} tokens but the model's vocabulary is {}",
                    path.display(),
                    t.vocab_size(),
                    cfg.vocab_size
                )));
            }
        }
        let (be, blocks): (Box<dyn Backend>, usize) = match kind {
            BackendKind::Cuda => {
                let be = crate::backend::cuda::runner::CudaBackend::new(
                    cfg.clone(),
                    &weights,
                    device,
                    kv_cache_bytes,
                    context as usize,
                    &mut |f| report(0.3 + 0.65 * f),
                )?;
                let blocks = be.kv_blocks();
                (Box::new(be), blocks)
            }
            _ => {
                let threads = if threads == 0 {
                    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(MAX_THREADS as usize)
                } else {
                    threads as usize
                };
                let be = CpuBackend::new(cfg.clone(), weights.clone(), threads, &mut |f| report(0.3 + 0.65 * f))?;
                let per_pos = be.kv_bytes_per_position();
                let blocks = if kv_cache_bytes == 0 {
                    default_cpu_kv_blocks(per_pos, context as u64)
                } else {
                    (kv_cache_bytes / (per_pos * BLOCK_POSITIONS as u64)) as usize
                };
                (Box::new(be), blocks)
            }
        };
        let per_pos = be.kv_bytes_per_position();
        let block_bytes = per_pos * BLOCK_POSITIONS as u64;
        let mem = be.memory();
        // Windowed caches: only when no layer attends to every position.
        let windows: Option<Vec<usize>> = (0..cfg.n_layers).map(|l| cfg.window(l)).collect();
        let kv_window = windows
            .filter(|_| kv_window_only)
            .and_then(|w| w.into_iter().max())
            .map(|w| WindowKv::new(w.min(u32::MAX as usize) as u32));
        let info = ModelInfo {
            vocab_size: cfg.vocab_size as u32,
            context_length: context,
            n_layers: cfg.n_layers as u32,
            n_heads: cfg.n_heads as u32,
            n_kv_heads: cfg.n_kv_heads as u32,
            head_dim: cfg.head_dim as u32,
            hidden_size: cfg.hidden as u32,
            bos_token: cfg.bos_token,
            eos_token: cfg.eos_token,
            backend: kind,
            weight_bytes: weights.bytes,
            experts: cfg.moe.map(|m| (m.n_experts as u32, m.n_used as u32, weights.expert_bytes())),
            kv_bytes_per_position: per_pos,
            kv_pool_bytes: blocks as u64 * block_bytes,
            scratch_bytes: mem.scratch_bytes,
            device_free_bytes: mem.device_free_bytes,
            device_total_bytes: mem.device_total_bytes,
            architecture: cfg.arch.name.clone(),
            device_name: be.device_name(),
            kv_window: kv_window.map_or(0, |w| w.window),
        };
        let state_geometry = crate::kv::state::Geometry {
            fingerprint,
            dtype: be.kv_dtype(),
            n_layers: info.n_layers,
            n_kv_heads: info.n_kv_heads,
            head_dim: info.head_dim,
            vocab_size: info.vocab_size,
        };
        report(1.0);
        fork_gate::install();
        Ok(Model {
            state_geometry,
            info,
            tokenizer,
            chat,
            weights,
            reads_files: kind != BackendKind::Cuda,
            debug_panic: AtomicU8::new(DebugPanic::None as u8),
            grammar: Default::default(),
            abort: Mutex::new(None),
            state: Mutex::new(State {
                kv: {
                    let mut kv = KvManager::new(blocks, block_bytes);
                    if let Some(w) = kv_window {
                        kv.set_window(w);
                    }
                    kv
                },
                backend: be,
                file_changed: None,
            }),
        })
    }

    /// Hyperparameters and what the load chose.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The model's state, or `LLMRT_INTERNAL` when an earlier call panicked while
    /// holding it outside a step's compute (the bookkeeping may be half-updated).
    /// The lock is taken inside the fork gate (see `fork_gate`).
    fn lock(&self) -> Result<StateGuard<'_>> {
        let token = fork_gate::enter();
        let guard = self.state.lock().map_err(|_| {
            Error::internal(
                "model is unusable: an earlier call on it panicked while updating its cache bookkeeping \
                 (a bug; the message of that call said where); free it and load it again",
            )
        })?;
        Ok(StateGuard { guard, _token: token })
    }

    /// Test hook (not part of the C API): the next step on this model panics at
    /// `at`, to test that panics are caught and what state they leave.
    #[doc(hidden)]
    pub fn debug_panic_next_step(&self, at: DebugPanic) {
        self.debug_panic.store(at as u8, Ordering::SeqCst);
    }

    fn take_debug_panic(&self, at: DebugPanic) -> bool {
        self.debug_panic.compare_exchange(at as u8, DebugPanic::None as u8, Ordering::SeqCst, Ordering::SeqCst).is_ok()
    }

    /// Before a CPU step: the mapped files must be as they were at load, or reading
    /// them could fault (SIGBUS). Once changed, the model refuses steps for good.
    fn check_files(&self, st: &mut State) -> Result<()> {
        self.check_files_in(&mut st.file_changed)
    }

    /// [`Self::check_files`] on the state's sticky slot; also run after every CPU step,
    /// before its commit: a truncation during the step (a read that faulted and was
    /// given a zero page by the SIGBUS handler, or a size/mtime change) fails the step.
    fn check_files_in(&self, file_changed: &mut Option<Error>) -> Result<()> {
        if let Some(e) = file_changed {
            return Err(e.clone());
        }
        if !self.reads_files {
            return Ok(());
        }
        for f in &self.weights.files {
            if let Err(e) = f.check_unchanged() {
                *file_changed = Some(e.clone());
                return Err(e);
            }
        }
        Ok(())
    }

    /// Reserves a cache for `positions` tokens (0 = the full context).
    pub fn cache_reserve(&self, positions: u32) -> Result<u64> {
        let positions = if positions == 0 { self.info.context_length } else { positions };
        self.lock()?.kv.reserve(positions, self.info.context_length)
    }

    pub fn cache_release(&self, cache: u64) -> Result<()> {
        self.lock()?.kv.release(cache)
    }

    fn tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_ref().map_err(Clone::clone)
    }

    /// The tokenizer (or why there is none) and the grammar slot, for `crate::grammar`.
    pub(crate) fn tokenizer_for_grammar(&self) -> Result<&Tokenizer> {
        self.tokenizer()
    }

    pub(crate) fn grammar_slot(&self) -> &crate::grammar::FactorySlot {
        &self.grammar
    }

    /// Text -> ids. `add_bos`: prepend BOS where the tokenizer asks for one
    /// (llama.cpp's add_special), so callers can pass true for every model.
    pub fn tokenize(&self, text: &[u8], add_bos: bool) -> Result<Vec<u32>> {
        self.tokenize_with(text, add_bos, true)
    }

    /// [`Self::tokenize`] with llama.cpp's `parse_special` choice: false tokenizes control
    /// tokens written in the text as text (untrusted input cannot inject them).
    pub fn tokenize_with(&self, text: &[u8], add_bos: bool, parse_special: bool) -> Result<Vec<u32>> {
        let t = self.tokenizer()?;
        t.encode_with(text, add_bos && t.add_bos_default(), parse_special)
    }

    /// Ids -> text, as the tokenizer reproduces a whole text (one leading space of a
    /// SentencePiece text is dropped, so `detokenize(tokenize(s)) == s`).
    pub fn detokenize(&self, ids: &[u32]) -> Result<Vec<u8>> {
        self.tokenizer()?.decode(ids)
    }

    /// One token's bytes as it appears inside a text (streaming).
    pub fn token_piece(&self, id: u32) -> Result<Vec<u8>> {
        self.tokenizer()?.token_piece(id)
    }

    /// As [`Self::decode`], then samples each cache's next token on the host: the
    /// draw depends only on `params.seed` and the new token's position in its cache,
    /// and the penalties look at the cache's tokens.
    pub fn decode_sample(
        &self,
        caches: &[u64],
        tokens: &[u32],
        params: &SamplerParams,
        next: &mut [u32],
    ) -> Result<()> {
        self.decode_sample_each(caches, tokens, std::slice::from_ref(params), next)
    }

    /// [`Self::decode_sample`] with one parameter set per cache (`params.len()` equal to
    /// the batch's, or 1 for all): each cache's token is the one a batch of that cache
    /// alone with its parameters gives. Every set is validated (logit_bias ids against
    /// the vocabulary) before anything changes; the draws happen before the commit, so
    /// a failed step changes nothing.
    pub fn decode_sample_each(
        &self,
        caches: &[u64],
        tokens: &[u32],
        params: &[SamplerParams],
        next: &mut [u32],
    ) -> Result<()> {
        self.decode_sample_with(caches, tokens, params, None, next)
    }

    /// [`Self::decode_sample_each`] whose draws `hook` makes and whose commit it joins
    /// (`crate::grammar`): its `sample` draws each row, its `commit` runs after every draw
    /// and before any cache commits (an error there commits nothing).
    pub(crate) fn decode_sample_with(
        &self,
        caches: &[u64],
        tokens: &[u32],
        params: &[SamplerParams],
        hook: Option<&mut dyn SampleHook>,
        next: &mut [u32],
    ) -> Result<()> {
        if params.len() != 1 && params.len() != caches.len() {
            return Err(Error::invalid(format!(
                "{} sampler parameter sets for {} caches (one per cache, or one for all)",
                params.len(),
                caches.len()
            )));
        }
        for (i, p) in params.iter().enumerate() {
            p.validate_for(self.info.vocab_size as usize).map_err(|e| {
                if params.len() == 1 {
                    e
                } else {
                    Error::new(e.status, format!("params[{i}]: {}", e.message))
                }
            })?;
        }
        self.check_batch(caches, tokens)?;
        if next.len() != caches.len() {
            return Err(Error::invalid(format!("next_tokens has {} slots for {} caches", next.len(), caches.len())));
        }
        let toks: Vec<&[u32]> = try_collect(tokens.chunks(1), "the batch's token list")?;
        // One lock for the step and the draws: a cache released meanwhile by another
        // thread can neither fail the draw after the step committed nor change it.
        let hook = hook.map(|h| h as &mut dyn SampleHook);
        self.run(caches, &toks, Want::Last, Out::Sample(params, hook, next))
    }

    /// The tokens cache `cache` holds, in order.
    pub fn cache_tokens(&self, cache: u64) -> Result<Vec<u32>> {
        Ok(self.lock()?.kv.get(cache)?.tokens.clone())
    }

    /// Positions the cache was reserved for.
    pub fn cache_capacity(&self, cache: u64) -> Result<u32> {
        Ok(self.lock()?.kv.get(cache)?.capacity)
    }

    pub fn cache_length(&self, cache: u64) -> Result<u32> {
        Ok(self.lock()?.kv.get(cache)?.len)
    }

    pub fn cache_truncate(&self, cache: u64, positions: u32) -> Result<()> {
        self.lock()?.kv.truncate(cache, positions)
    }

    pub fn cache_fork(&self, source: u64) -> Result<u64> {
        self.lock()?.kv.fork(source)
    }

    /// Bytes of cache `cache`'s saved state now (see [`Self::cache_save_into`]).
    pub fn cache_state_size(&self, cache: u64) -> Result<usize> {
        let st = self.lock()?;
        let s = st.kv.get(cache)?;
        self.state_size_of(s.len, s.live_from)
    }

    fn state_size_of(&self, len: u32, first: u32) -> Result<usize> {
        self.state_geometry.state_bytes(len, first).ok_or_else(|| {
            Error::out_of_memory(format!("the saved state of {len} positions is larger than the address space"))
        })
    }

    /// Saves cache `cache` (its KV, its tokens: the penalties' history, its capacity)
    /// into `out` in the format of `crate::kv::state`, and returns the state's size. When
    /// `out` is shorter, nothing is written and only the size is returned (compare it
    /// with `out.len()`). The cache is not changed. A windowed cache whose first positions
    /// were freed saves the positions it holds (format version 2).
    pub fn cache_save_into(&self, cache: u64, out: &mut [u8]) -> Result<usize> {
        let mut st = self.lock()?;
        let State { kv, backend, .. } = &mut *st;
        let s = kv.get(cache)?;
        let first = s.live_from.min(s.len);
        let n = self.state_size_of(s.len, first)?;
        if out.len() < n {
            return Ok(n);
        }
        let out = &mut out[..n];
        crate::kv::state::write_header(&self.state_geometry, s.capacity, &s.tokens, first, out);
        let at = crate::kv::state::Geometry::kv_offset(s.len, first);
        let body = n - crate::kv::state::CHECKSUM_BYTES;
        let held = (s.len - first) as usize;
        guarded(|| backend.read_kv(s.live_blocks(), held, &mut out[at..body]))?;
        crate::kv::state::seal(out);
        Ok(n)
    }

    /// [`Self::cache_save_into`] into a new buffer (allocated fallibly).
    pub fn cache_save(&self, cache: u64) -> Result<Vec<u8>> {
        loop {
            let n = self.cache_state_size(cache)?;
            let mut buf = try_vec(n, 0u8, "the saved cache state")?;
            // The cache may have grown on another thread meanwhile: then again.
            let got = self.cache_save_into(cache, &mut buf)?;
            if got <= n {
                buf.truncate(got);
                return Ok(buf);
            }
        }
    }

    /// A new cache holding the positions of a saved state (from [`Self::cache_save`] on
    /// this model, or on another load of the same model file with the same backend kind).
    /// It reserves `positions` positions as [`Self::cache_reserve`] does, 0 = the saved
    /// cache's capacity (fewer than the state's length: `LLMRT_INVALID_ARGUMENT`). A state
    /// that does not match this model, is truncated, corrupt or of another format version
    /// is `LLMRT_INVALID_ARGUMENT` naming the offset and the field; then, as on every
    /// error, no cache is created and no block is taken.
    pub fn cache_load(&self, data: &[u8], positions: u32) -> Result<u64> {
        let p = crate::kv::state::parse(&self.state_geometry, data)?;
        let len = p.tokens.len() as u32;
        let capacity = if positions == 0 { p.capacity } else { positions };
        if capacity < len {
            return Err(Error::invalid(format!(
                "positions = {positions} is less than the {len} positions the state holds"
            )));
        }
        if len > self.info.context_length {
            return Err(Error::context_full(format!(
                "the state holds {len} positions; this model's context length is {}",
                self.info.context_length
            )));
        }
        let mut st = self.lock()?;
        let State { kv, backend, .. } = &mut *st;
        // What the new cache holds: every position, or (windowed) those of the window.
        let keep_from = match kv.window() {
            Some(w) => (w.horizon(len) as usize / BLOCK_POSITIONS * BLOCK_POSITIONS) as u32,
            None if p.first > 0 => {
                return Err(Error::invalid(format!(
                    "the state holds positions {}..{len} only (saved from a windowed cache: a model loaded with \
                     kv_window_only); this model keeps every position: load it with kv_window_only",
                    p.first
                )))
            }
            None => 0,
        };
        if keep_from < p.first {
            return Err(Error::invalid(format!(
                "the state holds positions {}..{len}; the next query reads positions from {} (sliding window of \
                 {}): another model's window",
                p.first,
                kv.window().map_or(0, |w| w.horizon(len)),
                kv.window().map_or(0, |w| w.window)
            )));
        }
        // The held positions keep_from..len of the state's first..len, section by section.
        let kv_part: std::borrow::Cow<'_, [u8]> = if keep_from == p.first {
            p.kv.into()
        } else {
            let g = &self.state_geometry;
            let row = g.kv_dim() * g.dtype.bytes();
            let (have, keep) = ((len - p.first) as usize, (len - keep_from) as usize);
            let mut v = try_vec(2 * g.n_layers as usize * keep * row, 0u8, "the loaded state's window")?;
            for (dst, src) in v.chunks_exact_mut(keep * row).zip(p.kv.chunks_exact(have * row)) {
                dst.copy_from_slice(&src[(have - keep) * row..]);
            }
            v.into()
        };
        let id = kv.create_filled(capacity, self.info.context_length, p.tokens, keep_from)?;
        let done = kv.get(id).and_then(|s| {
            let blocks = try_collect(s.live_blocks().iter().copied(), "the loaded cache's block table")?;
            guarded(|| backend.write_kv(&blocks, (len - keep_from) as usize, &kv_part))
        });
        if let Err(e) = done {
            kv.release(id)?;
            return Err(e);
        }
        Ok(id)
    }

    /// The KV pool's bookkeeping: (blocks booked by live caches, blocks holding data,
    /// blocks in the pool). Test hook (the promise that a failed call takes no block).
    #[doc(hidden)]
    pub fn kv_usage(&self) -> (usize, usize, usize) {
        self.lock().map(|st| (st.kv.reserved_blocks(), st.kv.blocks_in_use(), st.kv.total_blocks())).unwrap_or_default()
    }

    /// Live caches (for tests and diagnostics).
    pub fn cache_ids(&self) -> Vec<u64> {
        self.lock().map(|st| st.kv.cache_ids()).unwrap_or_default()
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        if let Some((i, t)) = tokens.iter().enumerate().find(|(_, &t)| t >= self.info.vocab_size) {
            return Err(Error::invalid(format!(
                "token {t} at index {i} is outside the vocabulary (size {})",
                self.info.vocab_size
            )));
        }
        Ok(())
    }

    /// Appends `tokens` to `cache` as one prefill. `logits`: `None`, or room for the
    /// last token's row (`all = false`) or every token's rows (`all = true`).
    pub fn prefill(&self, cache: u64, tokens: &[u32], logits: Option<&mut [f32]>, all: bool) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::invalid(format!("prefill of cache {cache} with n_tokens = 0")));
        }
        self.check_tokens(tokens)?;
        let want = match (&logits, all) {
            (None, _) => Want::Nothing,
            (Some(_), false) => Want::Last,
            (Some(_), true) => Want::All,
        };
        self.run(&[cache], &[tokens], want, Out::Logits(logits))
    }

    /// One decode step: appends `tokens[i]` to `caches[i]` for every i.
    pub fn decode(&self, caches: &[u64], tokens: &[u32], logits: Option<&mut [f32]>) -> Result<()> {
        self.check_batch(caches, tokens)?;
        let toks: Vec<&[u32]> = try_collect(tokens.chunks(1), "the batch's token list")?;
        let want = if logits.is_some() { Want::Last } else { Want::Nothing };
        self.run(caches, &toks, want, Out::Logits(logits))
    }

    /// As [`Self::decode`], returning the argmax of each row (on a device backend
    /// the argmax runs there and only the ids come back).
    pub fn decode_greedy(&self, caches: &[u64], tokens: &[u32], next: &mut [u32]) -> Result<()> {
        self.check_batch(caches, tokens)?;
        if next.len() != caches.len() {
            return Err(Error::invalid(format!("next_tokens has {} slots for {} caches", next.len(), caches.len())));
        }
        let toks: Vec<&[u32]> = try_collect(tokens.chunks(1), "the batch's token list")?;
        self.run(caches, &toks, Want::Last, Out::Greedy(next))
    }

    /// Embeddings of `tokens` as one sequence: the final norm's output (the LM head's
    /// input; transformers' `last_hidden_state`), of every token (`Pooling::None`,
    /// `n * hidden` floats), their mean or the last token's (`hidden` floats), scaled
    /// to unit L2 norm when `normalize` (a zero vector stays zero). Runs in a cache of
    /// its own, reserved and released here: no cache of the caller's is touched.
    pub fn embed(&self, tokens: &[u32], pooling: Pooling, normalize: bool) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::invalid("embedding of n_tokens = 0"));
        }
        self.check_tokens(tokens)?;
        let n = u32::try_from(tokens.len()).ok().filter(|&n| n <= self.info.context_length).ok_or_else(|| {
            Error::context_full(format!(
                "embedding of {} tokens: more than the context ({})",
                tokens.len(),
                self.info.context_length
            ))
        })?;
        let h = self.info.hidden_size as usize;
        let (want, rows) = match pooling {
            Pooling::Last => (Want::Last, 1),
            Pooling::None | Pooling::Mean => (Want::All, tokens.len()),
        };
        let mut rows_out = try_vec(rows.saturating_mul(h), 0f32, "the embedding's hidden states")?;
        let cache = self.cache_reserve(n)?;
        let r = self.run(&[cache], &[tokens], want, Out::Hidden(&mut rows_out));
        let released = self.cache_release(cache);
        r?;
        released?;
        let mut out = match pooling {
            Pooling::None | Pooling::Last => rows_out,
            Pooling::Mean => {
                let mut acc = try_vec(h, 0f64, "the embedding's mean")?;
                for row in rows_out.chunks_exact(h) {
                    for (a, &x) in acc.iter_mut().zip(row) {
                        *a += x as f64;
                    }
                }
                acc.iter().map(|&a| (a / rows as f64) as f32).collect()
            }
        };
        if normalize {
            for row in out.chunks_exact_mut(h) {
                let norm = row.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
                if norm > 0.0 {
                    for x in row.iter_mut() {
                        *x = (*x as f64 / norm) as f32;
                    }
                }
            }
        }
        Ok(out)
    }

    fn check_batch(&self, caches: &[u64], tokens: &[u32]) -> Result<()> {
        if caches.is_empty() {
            return Err(Error::invalid("decode with n = 0 caches"));
        }
        if caches.len() != tokens.len() {
            return Err(Error::invalid(format!("{} caches but {} tokens", caches.len(), tokens.len())));
        }
        let mut sorted = try_collect(caches.iter().copied(), "a copy of the batch's cache ids")?;
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::invalid(format!("cache {} appears more than once in one decode step", w[0])));
        }
        self.check_tokens(tokens)
    }

    /// Sets (or with `None` removes) the hook every later step polls: between layers on
    /// the CPU, before the launch on CUDA. When it answers true the step fails with
    /// `LLMRT_ABORTED` and commits nothing. It runs on the thread that called the step,
    /// with the model's lock held (it must not call into this model). Setting waits for
    /// a running step to finish: once this returns no step polls the previous hook.
    pub fn set_abort_hook(&self, hook: Option<AbortHook>) {
        // The model's lock orders this against steps (each reads the hook under it).
        // (A poisoned model runs no more steps: then there is nothing to wait for.)
        let _steps = self.lock();
        match self.abort.lock() {
            Ok(mut g) => *g = hook,
            Err(p) => *p.into_inner() = hook,
        }
    }

    fn abort_hook(&self) -> Option<AbortHook> {
        match self.abort.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Validates everything, then prepares blocks, runs the step (polling the abort
    /// hook read under the model's lock), commits lengths. Windowed caches (see
    /// `crate::kv`) free their blocks out of the window after the commit, and a step
    /// giving one of them more than a chunk of tokens runs in chunks
    /// ([`Self::step_chunked`]).
    fn run(&self, caches: &[u64], tokens: &[&[u32]], want: Want, mut out: Out<'_>) -> Result<()> {
        let v = self.info.vocab_size as usize;
        let rows: usize = tokens.iter().map(|t| want.rows(t.len())).sum();
        let mut st = self.lock()?;
        let _abort = crate::abort::install(self.abort_hook());
        for (&c, t) in caches.iter().zip(tokens) {
            st.kv.check_append(c, t.len())?;
        }
        match &out {
            Out::Logits(Some(l)) if l.len() < rows * v => {
                return Err(Error::invalid(format!("logits buffer holds {} floats, {} needed", l.len(), rows * v)));
            }
            Out::Greedy(n) if want != Want::Last || n.len() != rows => {
                return Err(Error::internal(format!("greedy step with {} slots for {rows} rows", n.len())));
            }
            Out::Hidden(o) if o.len() != rows * self.info.hidden_size as usize => {
                return Err(Error::internal(format!("hidden-state step with {} floats for {rows} rows", o.len())));
            }
            _ => {}
        }
        self.check_files(&mut st)?;
        // From here on only invisible changes happen until the commit.
        let State { kv, backend, file_changed } = &mut *st;
        if let Some(chunk) = kv.window().map(|w| w.chunk as usize).filter(|&n| tokens.iter().any(|t| t.len() > n)) {
            let hidden = matches!(out, Out::Hidden(_));
            let width = if hidden { self.info.hidden_size as usize } else { v };
            let mut buf = try_vec(rows.saturating_mul(width), 0f32, "the step's output rows")?;
            let drawn = self
                .step_chunked(kv, backend.as_mut(), caches, tokens, want, hidden, chunk, &mut buf)
                .and_then(|()| self.check_files_in(file_changed))
                .and_then(|()| match &mut out {
                    Out::Sample(params, hook, _) => self.draw(kv, caches, tokens, &buf, params, hook),
                    _ => Ok(Vec::new()),
                });
            let drawn = match drawn {
                Ok(d) => d,
                Err(e) => {
                    for &c in caches {
                        kv.abandon_step(c);
                    }
                    return Err(e);
                }
            };
            commit_all(kv, caches, tokens);
            match out {
                Out::Logits(Some(l)) => l[..buf.len()].copy_from_slice(&buf),
                Out::Logits(None) => {}
                Out::Sample(_, _, next) => next.copy_from_slice(&drawn),
                Out::Hidden(dst) => dst.copy_from_slice(&buf),
                Out::Greedy(next) => {
                    for (o, row) in next.iter_mut().zip(buf.chunks_exact(v)) {
                        *o = crate::util::argmax(row);
                    }
                }
            }
            return Ok(());
        }
        for (&c, t) in caches.iter().zip(tokens) {
            let copies = kv.prepare_append(c, t.len())?;
            if let Err(e) = guarded(|| backend.copy_blocks(&copies)) {
                kv.undo_copies(c, &copies);
                return Err(e);
            }
        }
        if self.take_debug_panic(DebugPanic::Bookkeeping) {
            panic!("debug panic in the bookkeeping (llmrt test hook)");
        }
        let mut starts: Vec<usize> = try_with_capacity(caches.len(), "the step's start positions")?;
        let mut tables: Vec<Vec<u32>> = try_with_capacity(caches.len(), "the step's block tables")?;
        for &c in caches {
            let s = kv.get(c)?;
            starts.push(s.len as usize);
            tables.push(try_collect(s.blocks.iter().copied(), "a block table of the step")?);
        }
        let seqs: Vec<Seq<'_>> = try_collect(
            tokens.iter().zip(&starts).zip(&tables).map(|((t, &start), blocks)| Seq { tokens: t, start, blocks, want }),
            "the step's sequence list",
        )?;
        // Results land in scratch buffers and reach the caller only on success.
        match out {
            Out::Logits(_) | Out::Sample(..) => {
                let mut buf = try_vec(rows.saturating_mul(v), 0f32, "the step's logits")?;
                guarded(|| {
                    backend.step(&seqs, &mut buf)?;
                    if self.take_debug_panic(DebugPanic::Compute) {
                        panic!("debug panic in a step's compute (llmrt test hook)");
                    }
                    Ok(())
                })?;
                self.check_files_in(file_changed)?;
                // The draws happen before the commit (a failed one changes nothing).
                let drawn = match &mut out {
                    Out::Sample(params, hook, _) => self.draw(kv, caches, tokens, &buf, params, hook)?,
                    _ => Vec::new(),
                };
                commit_all(kv, caches, tokens);
                match out {
                    Out::Logits(Some(l)) => l[..buf.len()].copy_from_slice(&buf),
                    Out::Sample(_, _, next) => next.copy_from_slice(&drawn),
                    _ => {}
                }
            }
            Out::Hidden(dst) => {
                let mut buf =
                    try_vec(rows.saturating_mul(self.info.hidden_size as usize), 0f32, "the step's hidden states")?;
                guarded(|| backend.step_hidden(&seqs, &mut buf))?;
                self.check_files_in(file_changed)?;
                commit_all(kv, caches, tokens);
                dst.copy_from_slice(&buf);
            }
            Out::Greedy(next) => {
                let mut ids = try_vec(rows, 0u32, "the step's token ids")?;
                guarded(|| {
                    backend.step_greedy(&seqs, &mut ids)?;
                    if self.take_debug_panic(DebugPanic::Compute) {
                        panic!("debug panic in a step's compute (llmrt test hook)");
                    }
                    Ok(())
                })?;
                self.check_files_in(file_changed)?;
                commit_all(kv, caches, tokens);
                next.copy_from_slice(&ids);
            }
        }
        Ok(())
    }

    /// Each cache's token drawn from its last row of `buf` (one row per cache): the
    /// history is the cache's tokens then the ones being appended, the position the new
    /// token's. Every cache was checked live under this lock. Nothing changes here; a hook
    /// joins the commit.
    fn draw(
        &self,
        kv: &KvManager,
        caches: &[u64],
        tokens: &[&[u32]],
        buf: &[f32],
        params: &[SamplerParams],
        hook: &mut Option<&mut dyn SampleHook>,
    ) -> Result<Vec<u32>> {
        let v = self.info.vocab_size as usize;
        let mut drawn = try_vec(caches.len(), 0u32, "the step's sampled ids")?;
        for (i, ((o, row), (&c, t))) in
            drawn.iter_mut().zip(buf.chunks_exact(v)).zip(caches.iter().zip(tokens)).enumerate()
        {
            let s = kv.get(c)?;
            let p = &params[if params.len() == 1 { 0 } else { i }];
            let (h, pos) = (&[&s.tokens[..], t][..], s.len as u64 + t.len() as u64);
            *o = match hook {
                Some(hook) => hook.sample(i, row, p, h, pos)?,
                None => sample::try_sample(row, p, h, pos)?,
            };
        }
        if let Some(hook) = hook {
            hook.commit(&drawn)?;
        }
        Ok(drawn)
    }

    /// Runs a step of windowed caches in chunks of at most `chunk` tokens per cache,
    /// chunk `k` taking tokens `k chunk ..` of every cache that has them, and writes
    /// the wanted rows (`width` floats each, logits or with `hidden` the final norm's
    /// output) into `buf` as one step would. Between chunks the step's own blocks that
    /// fell out of the window are freed (`KvManager::free_step_blocks`), so a cache holds
    /// at most its booking; nothing is committed. On an error the caller abandons the
    /// step (`KvManager::abandon_step`). Same results as one step: every row depends
    /// only on its own token and the cache (see docs/ARCHITECTURE.md, batch invariance).
    #[allow(clippy::too_many_arguments)]
    fn step_chunked(
        &self,
        kv: &mut KvManager,
        backend: &mut dyn Backend,
        caches: &[u64],
        tokens: &[&[u32]],
        want: Want,
        hidden: bool,
        chunk: usize,
        buf: &mut [f32],
    ) -> Result<()> {
        let n_chunks = tokens.iter().map(|t| t.len().div_ceil(chunk)).max().unwrap_or(0);
        // Each cache's first row in `buf`.
        let mut row0: Vec<usize> = try_with_capacity(caches.len(), "the step's row offsets")?;
        let mut r = 0;
        for t in tokens {
            row0.push(r);
            r += want.rows(t.len());
        }
        let width = buf.len().checked_div(r).unwrap_or(0);
        for k in 0..n_chunks {
            // (cache index, its tokens of this chunk, their first position, what it wants)
            let mut parts: Vec<(usize, &[u32], usize, Want)> =
                try_with_capacity(caches.len(), "the chunk's sequences")?;
            for (i, (&c, t)) in caches.iter().zip(tokens).enumerate() {
                let lo = k * chunk;
                if lo < t.len() {
                    let start = kv.get(c)?.len as usize + lo;
                    if k > 0 {
                        kv.free_step_blocks(c, start);
                    }
                    let part = &t[lo..t.len().min(lo + chunk)];
                    let copies = kv.prepare_range(c, start, part.len())?;
                    if let Err(e) = guarded(|| backend.copy_blocks(&copies)) {
                        kv.undo_copies(c, &copies);
                        return Err(e);
                    }
                    // Only the chunk holding a cache's last token gives its last row.
                    let w = if want == Want::Last && lo + part.len() < t.len() { Want::Nothing } else { want };
                    parts.push((i, part, start, w));
                }
            }
            if k == 0 && self.take_debug_panic(DebugPanic::Bookkeeping) {
                panic!("debug panic in the bookkeeping (llmrt test hook)");
            }
            let mut tables: Vec<Vec<u32>> = try_with_capacity(parts.len(), "the chunk's block tables")?;
            for &(i, ..) in &parts {
                tables.push(try_collect(kv.get(caches[i])?.blocks.iter().copied(), "a block table of the chunk")?);
            }
            let seqs: Vec<Seq<'_>> = try_collect(
                parts.iter().zip(&tables).map(|(&(_, tokens, start, want), blocks)| Seq {
                    tokens,
                    start,
                    blocks,
                    want,
                }),
                "the chunk's sequence list",
            )?;
            let rows: usize = seqs.iter().map(|s| s.want.rows(s.tokens.len())).sum();
            let mut out = try_vec(rows.saturating_mul(width), 0f32, "the chunk's output rows")?;
            guarded(|| {
                if hidden {
                    backend.step_hidden(&seqs, &mut out)?;
                } else {
                    backend.step(&seqs, &mut out)?;
                }
                if k + 1 == n_chunks && self.take_debug_panic(DebugPanic::Compute) {
                    panic!("debug panic in a step's compute (llmrt test hook)");
                }
                Ok(())
            })?;
            let mut from = out.chunks_exact(width.max(1));
            for (s, &(i, ..)) in seqs.iter().zip(&parts) {
                let (at, n) = match s.want {
                    Want::Nothing => continue,
                    Want::Last => (row0[i], 1),
                    Want::All => (row0[i] + k * chunk, s.tokens.len()),
                };
                for row in buf[at * width..(at + n) * width].chunks_exact_mut(width) {
                    row.copy_from_slice(from.next().expect("one row per wanted token"));
                }
            }
        }
        Ok(())
    }
}

/// Commits a successful step: each cache's new tokens, then (windowed caches) the
/// blocks that fell out of the window are freed.
fn commit_all(kv: &mut KvManager, caches: &[u64], tokens: &[&[u32]]) {
    for (&c, t) in caches.iter().zip(tokens) {
        kv.commit(c, t);
        kv.free_out_of_window(c);
    }
}

/// Runs a backend call, turning a panic into `LLMRT_INTERNAL`. Sound because a
/// backend call only writes KV storage at positions past every cache's committed
/// length (or block copies into blocks no committed position reads yet) and the
/// caller's scratch buffers: the step fails like any other and nothing is committed.
fn guarded(f: impl FnOnce() -> Result<()>) -> Result<()> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(Error::internal(format!(
            "internal error (caught panic) in the step's compute: {what}; the step was rolled back and the model \
             stays usable"
        )))
    })
}

/// How [`Model::embed`] pools a sequence's hidden states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// Every token's row.
    None,
    /// The mean over the tokens.
    Mean,
    /// The last token's row.
    Last,
}

/// Where a step's results go.
enum Out<'a> {
    /// Logits rows (or none).
    Logits(Option<&'a mut [f32]>),
    /// The argmax id of each sequence's last row.
    Greedy(&'a mut [u32]),
    /// A token drawn from each sequence's last row with its parameters (one set, or
    /// one per sequence), just before the commit (the draw sees the new token in the
    /// cache's history and its position); a hook draws instead and joins the commit.
    Sample(&'a [SamplerParams], Option<&'a mut dyn SampleHook>, &'a mut [u32]),
    /// The final norm's output of each wanted row (`hidden` floats; no LM head).
    Hidden(&'a mut [f32]),
}

/// A sampled step's draws made by someone else (`crate::grammar`'s constrained step).
pub(crate) trait SampleHook {
    /// Row `i`'s token from its logits, parameters, history (the cache's tokens, then the one
    /// fed) and the new token's position.
    fn sample(
        &mut self,
        i: usize,
        row: &[f32],
        params: &SamplerParams,
        history: &[&[u32]],
        position: u64,
    ) -> Result<u32>;
    /// Called with every row's token after the draws, before any cache commits: an error
    /// commits nothing, success must leave nothing that can fail.
    fn commit(&mut self, drawn: &[u32]) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_kv_pool_holds_a_whole_context_rounded_up_to_blocks() {
        // More than a quarter of any machine's memory per position, and a context
        // that is not a multiple of the block size: the pool is the context's blocks,
        // rounded up as a reservation of the full context rounds.
        for context in [1u64, 15, 16, 17, 4095, 4097, 100_003] {
            let blocks = default_cpu_kv_blocks(1 << 40, context);
            let mut kv = KvManager::new(blocks, (1 << 40) * BLOCK_POSITIONS as u64);
            assert_eq!(blocks as u64, context.div_ceil(BLOCK_POSITIONS as u64), "context {context}");
            kv.reserve(0, context as u32).unwrap_or_else(|e| panic!("context {context}: {}", e.message));
        }
        // Small positions: a quarter of memory, far more than one context.
        assert!(default_cpu_kv_blocks(1024, 17) > 1000);
    }
}
