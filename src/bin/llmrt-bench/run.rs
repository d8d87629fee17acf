//! The tests (pp, tg, ttft), one repetition at a time, and what a loaded model is.

use crate::args::usage;
use crate::synth::{shape_of, synth_bytes};
use llmrt::runtime::{LoadOptions, Model};
use llmrt::util::{argmax, XorShift};
use std::path::Path;
use std::time::Instant;

/// What one test measured.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Test {
    /// Prefill of `n` tokens into a cache already holding `depth` positions (filled
    /// untimed first, as llama-bench's `-d`; 0: an empty cache).
    Pp { n: usize, depth: usize },
    /// N decode steps of `seqs` sequences each holding `depth` positions first.
    Tg { n: usize, seqs: usize, depth: usize },
    /// Time to first token of an N-token prompt.
    Ttft(usize),
}

impl Test {
    pub(crate) fn name(self) -> String {
        match self {
            Test::Pp { n, depth: 0 } => format!("pp{n}"),
            Test::Pp { n, depth } => format!("pp{n} @ d{depth}"),
            Test::Tg { n, seqs, depth } => {
                let mut t = format!("tg{n}");
                if seqs > 1 {
                    t += &format!(" b{seqs}");
                }
                if depth > 0 {
                    t += &format!(" @ d{depth}");
                }
                t
            }
            Test::Ttft(n) => format!("ttft p{n}"),
        }
    }

    /// Tokens a repetition counts.
    pub(crate) fn tokens(self) -> usize {
        match self {
            Test::Pp { n, .. } => n,
            Test::Tg { n, seqs, .. } => n * seqs,
            Test::Ttft(_) => 1,
        }
    }
}

pub(crate) struct Record {
    pub(crate) model: String,
    pub(crate) desc: String,
    pub(crate) backend: &'static str,
    pub(crate) size: u64,
    pub(crate) params: u64,
    pub(crate) threads: usize,
    pub(crate) test: Test,
    pub(crate) samples_ns: Vec<u64>,
    pub(crate) samples_ts: Vec<f64>,
    /// tg with a measured copy bandwidth: the bytes bound in t/s (CPU with
    /// `--membw`: the mean of the repetitions' bounds).
    pub(crate) bound_ts: Option<f64>,
    /// CPU tg with `--membw`: the mean of each repetition's speed over its bound.
    pub(crate) fraction: Option<f64>,
    /// Bytes a step reads (weights + KV, mean over the steps) for tg.
    pub(crate) step_bytes: Option<(u64, u64)>,
    /// pp with a measured GEMM rate: the achieved TFLOP/s of the matrix products.
    pub(crate) tflops: Option<f64>,
}

pub(crate) fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let sd = if v.len() > 1 { (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0)).sqrt() } else { 0.0 };
    (m, sd)
}

pub(crate) fn fail(what: &str, e: llmrt::Error) -> ! {
    eprintln!("llmrt-bench: {what}: {e}");
    std::process::exit(1)
}

/// One repetition of `test`; returns its wall time in seconds (setup excluded for tg).
pub(crate) fn run_test(m: &Model, test: Test, greedy: bool, rng: &mut XorShift) -> f64 {
    let vocab = m.info().vocab_size as u64;
    let mut tok = || (rng.next_u64() % vocab) as u32;
    match test {
        Test::Pp { .. } | Test::Ttft(_) => {
            let (n, depth) = match test {
                Test::Pp { n, depth } => (n, depth),
                Test::Ttft(n) => (n, 0),
                Test::Tg { .. } => unreachable!("a tg test in the prefill arm"),
            };
            let reserve = || m.cache_reserve((depth + n + 1) as u32).unwrap_or_else(|e| fail("cache_reserve", e));
            // With a depth the cache is reserved and filled before the clock starts;
            // without one, reserving the cache is part of the timed prefill.
            let filled = (depth > 0).then(|| {
                let c = reserve();
                let fill: Vec<u32> = (0..depth).map(|_| tok()).collect();
                m.prefill(c, &fill, None, false).unwrap_or_else(|e| fail("prefill (depth)", e));
                c
            });
            let toks: Vec<u32> = (0..n).map(|_| tok()).collect();
            let mut logits = vec![0f32; vocab as usize];
            let t0 = Instant::now();
            let c = filled.unwrap_or_else(reserve);
            m.prefill(c, &toks, Some(&mut logits), false).unwrap_or_else(|e| fail("prefill", e));
            if matches!(test, Test::Ttft(_)) {
                std::hint::black_box(argmax(&logits));
            }
            let dt = t0.elapsed().as_secs_f64();
            m.cache_release(c).unwrap_or_else(|e| fail("cache_release", e));
            dt
        }
        Test::Tg { n, seqs, depth } => {
            let cap = (depth + n + 1) as u32;
            let first = m.cache_reserve(cap).unwrap_or_else(|e| fail("cache_reserve", e));
            if depth > 0 {
                let toks: Vec<u32> = (0..depth).map(|_| tok()).collect();
                m.prefill(first, &toks, None, false).unwrap_or_else(|e| fail("prefill (depth)", e));
            }
            let mut caches = vec![first];
            for _ in 1..seqs {
                let c = if depth > 0 { m.cache_fork(first) } else { m.cache_reserve(cap) };
                caches.push(c.unwrap_or_else(|e| fail("cache_fork/reserve", e)));
            }
            let mut logits = vec![0f32; if greedy { 0 } else { seqs * vocab as usize }];
            let mut next = vec![0u32; seqs];
            let steps: Vec<Vec<u32>> = (0..n).map(|_| (0..seqs).map(|_| tok()).collect()).collect();
            let t0 = Instant::now();
            for toks in &steps {
                if greedy {
                    m.decode_greedy(&caches, toks, &mut next).unwrap_or_else(|e| fail("decode_greedy", e));
                } else {
                    m.decode(&caches, toks, Some(&mut logits)).unwrap_or_else(|e| fail("decode", e));
                }
            }
            let dt = t0.elapsed().as_secs_f64();
            for c in caches {
                m.cache_release(c).unwrap_or_else(|e| fail("cache_release", e));
            }
            dt
        }
    }
}

/// Bytes of weights one decode step of `n_seqs` sequences reads: every matrix once,
/// but of an untied `token_embd` only the `n_seqs` rows gathered, and of a mixture of
/// experts only the experts routed to: `k` of `n` for one sequence, and for `b` the
/// number of distinct experts `b` tokens pick when each picks `k` of `n` uniformly,
/// `n (1 - (1 - k/n)^b)` (an estimate: real routing is not uniform).
pub(crate) fn step_weight_bytes(info: &llmrt::runtime::ModelInfo, embd_bytes: u64, n_seqs: usize) -> u64 {
    let row = embd_bytes / info.vocab_size.max(1) as u64;
    let mut w = info.weight_bytes - embd_bytes + row * n_seqs as u64;
    if let Some((n, k, expert_bytes)) = info.experts {
        let frac = 1.0 - (1.0 - k as f64 / n as f64).powi(n_seqs as i32);
        w = w - expert_bytes + (expert_bytes as f64 * frac) as u64;
    }
    w
}

/// What a model is: (description, size in bytes, parameters, bytes of an untied
/// token_embd or 0, FLOPs per prefilled token in the matrix products).
pub(crate) struct Desc {
    pub(crate) text: String,
    pub(crate) size: u64,
    pub(crate) params: u64,
    pub(crate) embd_bytes: u64,
    pub(crate) flops_per_token: f64,
}

pub(crate) fn describe(name: &str, ty: &str, m: &Model, ffn: u64, untied: bool) -> Desc {
    let info = m.info();
    let (h, l, v) = (info.hidden_size as u64, info.n_layers as u64, info.vocab_size as u64);
    // Parameters from the shapes (embeddings and output counted, norms ignored).
    let qd = (info.n_heads * info.head_dim) as u64;
    let kvd = (info.n_kv_heads * info.head_dim) as u64;
    let attn = 2 * h * qd + 2 * h * kvd;
    // Experts: all of them are parameters, `k` of them (and the router) work per token.
    let (layer, active) = match info.experts {
        Some((n, k, _)) => (attn + 3 * h * ffn * n as u64 + h * n as u64, attn + 3 * h * ffn * k as u64 + h * n as u64),
        None => (attn + 3 * h * ffn, attn + 3 * h * ffn),
    };
    // The embeddings, and the output matrix unless it is the embeddings (tied).
    let params = if untied { 2 } else { 1 } * v * h + l * layer;
    let embd_bytes = if untied { info.weight_bytes * (v * h) / params.max(1) } else { 0 };
    let _ = name;
    Desc {
        text: format!("{} {:.1}B {}", info.architecture, params as f64 / 1e9, ty.to_uppercase()),
        size: info.weight_bytes,
        params,
        embd_bytes,
        // Layers' matrix products (2 FLOPs per weight per token); the LM head runs
        // for the last row only.
        flops_per_token: 2.0 * (l * active) as f64,
    }
}

/// (ffn, untied) read from a GGUF file's metadata and tensor names.
fn gguf_facts(path: &str) -> (u64, bool) {
    let Ok(g) = llmrt::format::gguf::Gguf::open(Path::new(path)) else { return (0, false) };
    let arch = g.get_str("general.architecture").ok().flatten().map(|s| s.to_string()).unwrap_or_default();
    let ffn = ["expert_feed_forward_length", "feed_forward_length"]
        .iter()
        .find_map(|k| g.get_u64(&format!("{arch}.{k}")).ok().flatten())
        .unwrap_or(0);
    let untied = g.tensor("output.weight").is_some();
    (ffn, untied)
}

/// Loads `spec`: a GGUF path or `synth:SHAPE:TYPE` (built in memory).
pub(crate) fn load(spec: &str, opts: LoadOptions<'_>) -> (Model, Desc) {
    if let Some(rest) = spec.strip_prefix("synth:") {
        let (shape, ty) = rest.split_once(':').unwrap_or_else(|| usage());
        let t0 = Instant::now();
        let bytes = synth_bytes(shape, ty);
        let built = t0.elapsed().as_secs_f64();
        let n = bytes.len();
        let t1 = Instant::now();
        let m = Model::load_gguf_bytes(bytes, spec, opts).unwrap_or_else(|e| fail(spec, e));
        eprintln!(
            "llmrt-bench: {spec}: {:.2} GB built in memory in {built:.1} s, loaded in {:.1} s",
            n as f64 / 1e9,
            t1.elapsed().as_secs_f64()
        );
        let s = shape_of(shape);
        let d = describe(spec, ty, &m, s.ffn as u64, s.untied());
        (m, d)
    } else {
        let ty = Path::new(spec)
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.rsplit('-').next())
            .unwrap_or("?")
            .to_string();
        let m = Model::load(Path::new(spec), opts).unwrap_or_else(|e| fail(spec, e));
        let (ffn, untied) = gguf_facts(spec);
        let mut d = describe(spec, &ty, &m, ffn, untied);
        d.size = std::fs::metadata(spec).map(|x| x.len()).unwrap_or(d.size);
        (m, d)
    }
}
