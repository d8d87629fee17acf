//! `llmrt-bench`: llama-bench's flags and output for llmrt's CPU and CUDA backends,
//! synthetic models (files, or built in memory), a memory read-bandwidth probe, and
//! on a GPU the two ceilings decode and prefill are held against.
//!
//! ```text
//! llmrt-bench -m FILE|synth:SHAPE:TYPE[,...] [--backend cpu|cuda] [-t 1,2] [-p 128] [-n 64]
//!             [-b 1,4] [-d 0,512] [--ttft 2048] [-r 5] [-o md|json] [--kv-bytes N]
//!             [--d2d] [--gemm 8192] [--json FILE]
//! llmrt-bench --synth tinyllama|llama3-8b --type f16|q8_0|q4_0 --out DIR
//! llmrt-bench --membw [-t 1,2]
//! llmrt-bench --d2d [--gemm 8192]          (CUDA ceilings only)
//! ```
//!
//! As llama-bench: `pp N` prefills N tokens into an empty cache, `tg N` runs N
//! single-token decode steps, each test runs once to warm up and then `-r` times;
//! t/s is tokens per second (mean ± sample stddev over the repetitions). `-b N`
//! (N > 1) runs the tg tests as batched decode of N sequences per step (t/s counts
//! all N sequences' tokens). `-d D` (llama-bench's depth) first fills each cache
//! with D positions (one prefill, then forks for the other sequences; not timed).
//! `--ttft N`: time to first token, from reserving a cache to holding the first
//! generated id on the host (a prefill of N tokens and the argmax of its last row).
//! On CUDA, tg steps are `decode_greedy` (one id per sequence comes back); on the CPU
//! `decode` with logits, as before.
//!
//! `synth:SHAPE:TYPE` (SHAPE tinyllama or llama3-8b, TYPE f16, q8_0 or q4_0) builds a
//! valid GGUF of that shape in memory with random weights (no disk; all threads
//! fill it) and loads it with `Model::load_gguf_bytes`.
//!
//! `--d2d`: device-to-device copy bandwidth (cuMemcpyDtoD of 4 GiB, best of 10,
//! bytes read plus bytes written); with it, each tg row gains its bytes bound: (weight
//! bytes read per step + KV bytes read per step) / that bandwidth, and the % reached.
//! `--gemm N`: cuBLAS bf16 N x N x N GEMM (f32 compute) in TFLOP/s (mean of 10 after 3
//! warm-ups); with it, each pp row gains its FLOP rate and the % of that.
//! `--json FILE` also writes the JSON records to FILE (with `-o md` on stdout).
//! `--membw` with `-m` (CPU): each tg row gains its bytes bound from the read
//! bandwidth probed with the row's thread count before every repetition and after
//! the last: each repetition is held against the higher of the probes on either
//! side of it, and the row reports the mean bound and the mean of the fractions,
//! so bound and speed see the same machine state (repetitions whose two probes
//! differ by more than 15% are left out: the state changed during them, unless
//! no repetition was steady); alone, `--membw` prints the probe.

use llmrt::format::gguf::Value;
use llmrt::format::gguf_write::GgufWriter;
use llmrt::quant::{quantize_row, DType};
use llmrt::runtime::{BackendKind, LoadOptions, Model};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

fn usage() -> ! {
    eprintln!(
        "usage: llmrt-bench -m FILE|synth:SHAPE:TYPE[,...] [--backend cpu|cuda] [-t N,..] [-p N,..] [-n N,..]\n\
         \x20                  [-b N,..] [-d N,..] [--ttft N,..] [-r N] [-o md|json] [--kv-bytes N] [--membw] [--d2d] [--gemm N] [--json FILE]\n\
         \x20      llmrt-bench --synth tinyllama|llama3-8b --type f16|q8_0|q4_0 --out DIR\n\
         \x20      llmrt-bench --membw [-t N,..]\n\
         \x20      llmrt-bench --d2d [--gemm N]"
    );
    std::process::exit(2)
}

fn list(s: &str) -> Vec<usize> {
    s.split(',').map(|v| v.trim().parse().unwrap_or_else(|_| usage())).collect()
}

struct Args {
    models: Vec<String>,
    threads: Vec<usize>,
    prompt: Vec<usize>,
    gen: Vec<usize>,
    batch: Vec<usize>,
    reps: usize,
    output: String,
    synth: Option<String>,
    ty: String,
    out: PathBuf,
    membw: bool,
    backend: BackendKind,
    depth: Vec<usize>,
    ttft: Vec<usize>,
    kv_bytes: u64,
    d2d: bool,
    gemm: usize,
    json_file: Option<PathBuf>,
}

fn parse() -> Args {
    let ncpu = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut a = Args {
        models: Vec::new(),
        threads: vec![ncpu],
        prompt: vec![512],
        gen: vec![128],
        batch: vec![1],
        reps: 5,
        output: "md".into(),
        synth: None,
        ty: "q4_0".into(),
        out: PathBuf::from("."),
        membw: false,
        backend: BackendKind::Cpu,
        depth: vec![0],
        ttft: Vec::new(),
        kv_bytes: 0,
        d2d: false,
        gemm: 0,
        json_file: None,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    let val = |i: &mut usize| -> String {
        *i += 1;
        argv.get(*i).cloned().unwrap_or_else(|| usage())
    };
    while i < argv.len() {
        match argv[i].as_str() {
            "-m" | "--model" => a.models.extend(val(&mut i).split(',').map(String::from)),
            "-t" | "--threads" => a.threads = list(&val(&mut i)),
            "-p" | "--n-prompt" => a.prompt = list(&val(&mut i)),
            "-n" | "--n-gen" => a.gen = list(&val(&mut i)),
            "-b" | "--batch" => a.batch = list(&val(&mut i)),
            "-r" | "--repetitions" => a.reps = val(&mut i).parse().unwrap_or_else(|_| usage()),
            "-o" | "--output" => a.output = val(&mut i),
            "--synth" => a.synth = Some(val(&mut i)),
            "--type" => a.ty = val(&mut i).to_lowercase(),
            "--out" => a.out = PathBuf::from(val(&mut i)),
            "--membw" => a.membw = true,
            "--backend" => {
                a.backend = match val(&mut i).as_str() {
                    "cpu" => BackendKind::Cpu,
                    "cuda" => BackendKind::Cuda,
                    _ => usage(),
                }
            }
            "-d" | "--n-depth" => a.depth = list(&val(&mut i)),
            "--ttft" => a.ttft = list(&val(&mut i)),
            "--kv-bytes" => a.kv_bytes = val(&mut i).parse().unwrap_or_else(|_| usage()),
            "--d2d" => a.d2d = true,
            "--json" => a.json_file = Some(PathBuf::from(val(&mut i))),
            "--gemm" => a.gemm = val(&mut i).parse().unwrap_or_else(|_| usage()),
            "-h" | "--help" => usage(),
            other => {
                eprintln!("unknown argument {other}");
                usage()
            }
        }
        i += 1;
    }
    a
}

// ---------------------------------------------------------------------------
// Synthetic models.

struct Shape {
    name: &'static str,
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    ffn: usize,
    vocab: usize,
    ctx: usize,
    theta: f32,
}

const TINYLLAMA: Shape = Shape {
    name: "tinyllama-1.1b",
    hidden: 2048,
    layers: 22,
    heads: 32,
    kv_heads: 4,
    ffn: 5632,
    vocab: 32000,
    ctx: 2048,
    theta: 10000.0,
};
const LLAMA3_8B: Shape = Shape {
    name: "llama3-8b",
    hidden: 4096,
    layers: 32,
    heads: 32,
    kv_heads: 8,
    ffn: 14336,
    vocab: 128256,
    ctx: 8192,
    theta: 500000.0,
};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Roughly normal (sum of 4 uniforms, unit variance).
    fn normal(&mut self) -> f32 {
        let u = self.next();
        let s: f32 = (0..4).map(|k| ((u >> (16 * k)) & 0xFFFF) as f32 / 65536.0 - 0.5).sum();
        s * 1.732
    }
}

fn shape_of(name: &str) -> &'static Shape {
    match name {
        "tinyllama" | "tinyllama-1.1b" => &TINYLLAMA,
        "llama3-8b" | "llama-3-8b" | "llama3" => &LLAMA3_8B,
        _ => usage(),
    }
}

fn dtype_of(ty: &str) -> DType {
    match ty {
        "f16" => DType::F16,
        "q8_0" => DType::Q8_0,
        "q4_0" => DType::Q4_0,
        "f32" => DType::F32,
        _ => usage(),
    }
}

/// The GGUF of a synthetic model with every tensor streamed, and the tensors as
/// (name, ne0 = row length, rows; rows 0 for the F32 1-D norms).
fn synth_writer(s: &Shape, dt: DType) -> (GgufWriter, Vec<(String, u64, u64)>) {
    let hd = s.hidden / s.heads;
    let mut g = GgufWriter::new();
    g.kv("general.architecture", Value::Str("llama".into()));
    g.kv("general.name", Value::Str(format!("synthetic {} ({})", s.name, dt.name())));
    // ggml file types: 0 all F32, 1 mostly F16, 2 mostly Q4_0, 7 mostly Q8_0.
    let ftype = match dt {
        DType::F32 => 0u32,
        DType::F16 => 1,
        DType::Q4_0 => 2,
        _ => 7,
    };
    g.kv("general.file_type", Value::U32(ftype));
    g.kv("llama.context_length", Value::U32(s.ctx as u32));
    g.kv("llama.embedding_length", Value::U32(s.hidden as u32));
    g.kv("llama.block_count", Value::U32(s.layers as u32));
    g.kv("llama.feed_forward_length", Value::U32(s.ffn as u32));
    g.kv("llama.rope.dimension_count", Value::U32(hd as u32));
    g.kv("llama.attention.head_count", Value::U32(s.heads as u32));
    g.kv("llama.attention.head_count_kv", Value::U32(s.kv_heads as u32));
    g.kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    g.kv("llama.rope.freq_base", Value::F32(s.theta));
    g.kv("llama.vocab_size", Value::U32(s.vocab as u32));
    // A minimal SentencePiece vocabulary of the right size: <unk> <s> </s>, the
    // 256 byte tokens (llama.cpp looks up <0x0A>), then placeholders.
    let mut tokens = vec![Value::Str("<unk>".into()), Value::Str("<s>".into()), Value::Str("</s>".into())];
    let mut types = vec![Value::I32(2), Value::I32(3), Value::I32(3)];
    for b in 0..256 {
        tokens.push(Value::Str(format!("<0x{b:02X}>")));
        types.push(Value::I32(6));
    }
    let mut i = 0;
    while tokens.len() < s.vocab {
        tokens.push(Value::Str(format!("\u{2581}t{i}")));
        types.push(Value::I32(1));
        i += 1;
    }
    let scores = (0..s.vocab).map(|i| Value::F32(-(i as f32))).collect();
    g.kv("tokenizer.ggml.model", Value::Str("llama".into()));
    g.kv("tokenizer.ggml.tokens", Value::Array(tokens));
    g.kv("tokenizer.ggml.scores", Value::Array(scores));
    g.kv("tokenizer.ggml.token_type", Value::Array(types));
    g.kv("tokenizer.ggml.bos_token_id", Value::U32(1));
    g.kv("tokenizer.ggml.eos_token_id", Value::U32(2));
    g.kv("tokenizer.ggml.unknown_token_id", Value::U32(0));

    // (name, ne0 = row length, rows); 1-D tensors (norms) are F32.
    let (h, kvd) = (s.hidden as u64, (s.kv_heads * hd) as u64);
    let mut mats: Vec<(String, u64, u64)> = vec![("token_embd.weight".into(), h, s.vocab as u64)];
    for l in 0..s.layers {
        mats.push((format!("blk.{l}.attn_norm.weight"), h, 0));
        mats.push((format!("blk.{l}.attn_q.weight"), h, h));
        mats.push((format!("blk.{l}.attn_k.weight"), h, kvd));
        mats.push((format!("blk.{l}.attn_v.weight"), h, kvd));
        mats.push((format!("blk.{l}.attn_output.weight"), h, h));
        mats.push((format!("blk.{l}.ffn_norm.weight"), h, 0));
        mats.push((format!("blk.{l}.ffn_gate.weight"), h, s.ffn as u64));
        mats.push((format!("blk.{l}.ffn_up.weight"), h, s.ffn as u64));
        mats.push((format!("blk.{l}.ffn_down.weight"), s.ffn as u64, h));
    }
    mats.push(("output_norm.weight".into(), h, 0));
    mats.push(("output.weight".into(), h, s.vocab as u64));
    for (name, n0, rows) in &mats {
        if *rows == 0 {
            g.tensor_streamed(name, &[*n0], DType::F32);
        } else {
            g.tensor_streamed(name, &[*n0, *rows], dt);
        }
    }
    (g, mats)
}

fn synth(shape_name: &str, ty: &str, dir: &Path) -> std::io::Result<PathBuf> {
    let s = shape_of(shape_name);
    let dt = dtype_of(ty);
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{}-{}.gguf", s.name, ty));
    let (g, mats) = synth_writer(s, dt);
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    g.write_streamed(&path, |i, out| {
        let (_, n0, rows) = &mats[i];
        let n0 = *n0 as usize;
        if *rows == 0 {
            let v: Vec<u8> = (0..n0).flat_map(|_| (1.0 + 0.1 * rng.normal()).to_le_bytes()).collect();
            return out.write_all(&v);
        }
        let scale = 1.0 / (n0 as f32).sqrt();
        let rb = dt.row_bytes(n0).expect("row length");
        let mut x = vec![0f32; n0];
        let mut buf = vec![0u8; rb];
        for _ in 0..*rows {
            for v in x.iter_mut() {
                *v = rng.normal() * scale;
            }
            quantize_row(dt, &x, &mut buf);
            out.write_all(&buf)?;
        }
        Ok(())
    })?;
    Ok(path)
}

/// Fills `out` (whole rows of `dt`, rows of `n0` elements) with random weights of
/// magnitude about `1 / sqrt(n0)`, fast: random bits shaped into valid values, not
/// a distribution (F16: random sign and mantissa under a fixed exponent; Q8_0/Q4_0:
/// random quants under a fixed scale; F32: uniform).
fn fill_random(dt: DType, n0: usize, out: &mut [u8], seed: u64) {
    let mut r = Rng(seed | 1);
    let target = 1.0 / (n0 as f64).sqrt();
    match dt {
        DType::F16 => {
            // |v| in [2^(e-15), 2^(e-14)), mean about 1.5 * 2^(e-15).
            let e = (15.0 + (target / 1.5).log2().round()).clamp(1.0, 29.0) as u64;
            let pat = (e << 10) * 0x0001_0001_0001_0001;
            let mut ch = out.chunks_exact_mut(8);
            for c in &mut ch {
                c.copy_from_slice(&((r.next() & 0x83FF_83FF_83FF_83FF) | pat).to_le_bytes());
            }
            for b in ch.into_remainder() {
                *b = 0;
            }
        }
        DType::Q8_0 | DType::Q4_0 => {
            let (bb, std) = if dt == DType::Q8_0 { (34, 74.0) } else { (18, 4.6) };
            let d = half::f16::from_f64(target / std).to_le_bytes();
            for blk in out.chunks_exact_mut(bb) {
                blk[..2].copy_from_slice(&d);
                for c in blk[2..].chunks_mut(8) {
                    let v = r.next().to_le_bytes();
                    c.copy_from_slice(&v[..c.len()]);
                }
            }
        }
        _ => {
            for c in out.chunks_exact_mut(4) {
                let u = (r.next() >> 40) as f64 / (1u64 << 24) as f64 - 0.5;
                c.copy_from_slice(&((u * 3.4 * target) as f32).to_le_bytes());
            }
        }
    }
}

/// A synthetic model of `shape_name` in `ty` as GGUF bytes built in memory, every
/// thread filling its share of each tensor.
fn synth_bytes(shape_name: &str, ty: &str) -> Vec<u8> {
    let s = shape_of(shape_name);
    let dt = dtype_of(ty);
    let (g, mats) = synth_writer(s, dt);
    let (header, ranges) = g.streamed_layout();
    let total = ranges.last().map_or(header.len() as u64, |(o, l)| o + l) as usize;
    let mut bytes = vec![0u8; total];
    bytes[..header.len()].copy_from_slice(&header);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    // Split the buffer into the tensors' slices (in file order), then each slice into
    // whole-row chunks handed to the threads.
    let mut jobs: Vec<(DType, usize, &mut [u8], u64)> = Vec::new();
    let mut rest: &mut [u8] = &mut bytes;
    let mut at = 0u64;
    for (i, ((_, n0, rows), (off, len))) in mats.iter().zip(&ranges).enumerate() {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut((off - at) as usize);
        let (t, tail) = tail.split_at_mut(*len as usize);
        rest = tail;
        at = off + len;
        let n0 = *n0 as usize;
        if *rows == 0 {
            for c in t.chunks_exact_mut(4) {
                c.copy_from_slice(&1.0f32.to_le_bytes());
            }
            continue;
        }
        let rb = dt.row_bytes(n0).expect("row length");
        let rows_per = (*rows as usize).div_ceil(threads * 4).max(1);
        for (k, c) in t.chunks_mut(rb * rows_per).enumerate() {
            jobs.push((dt, n0, c, 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(((i as u64) << 20) | (k as u64 + 1))));
        }
    }
    let per = jobs.len().div_ceil(threads);
    std::thread::scope(|sc| {
        let mut jobs = jobs;
        while !jobs.is_empty() {
            let take = per.min(jobs.len());
            let mine: Vec<_> = jobs.drain(..take).collect();
            sc.spawn(move || {
                for (dt, n0, c, seed) in mine {
                    fill_random(dt, n0, c, seed);
                }
            });
        }
    });
    bytes
}

/// Bytes of weights one decode step of `n_seqs` sequences reads: every matrix once,
/// but of an untied `token_embd` only the `n_seqs` rows gathered.
fn step_weight_bytes(info: &llmrt::runtime::ModelInfo, embd_bytes: u64, n_seqs: usize) -> u64 {
    let row = embd_bytes / info.vocab_size.max(1) as u64;
    info.weight_bytes - embd_bytes + row * n_seqs as u64
}

// ---------------------------------------------------------------------------
// Memory read bandwidth.

/// Read bandwidth in GB/s with `threads` threads summing a 1 GiB buffer: the
/// best of `passes` passes of each of two access patterns, every thread on its own
/// part. "4 streams": 4 interleaved streams of 64-byte lines; "1 stream": one
/// sequential stream with a software prefetch 4 KiB ahead (the access of the
/// CPU decode kernels). Both keep 8 independent (vectorisable) sums, so the
/// loops are bound by memory, not adds. The buffer is allocated like the CPU
/// backend's repacked weights (huge pages where the kernel has them), so the
/// bound and the decode read the same kind of memory. `passes`: 5 alone, 2
/// around each tg repetition. Returns (best, per pattern).
#[allow(clippy::needless_range_loop)]
fn membw(threads: usize, passes: usize) -> (f64, [f64; 2]) {
    static BUF: std::sync::OnceLock<llmrt::backend::cpu::groups::HostBuf> = std::sync::OnceLock::new();
    let buf = BUF.get_or_init(|| {
        let Some(mut buf) = llmrt::backend::cpu::groups::HostBuf::zeroed(1 << 30) else {
            eprintln!("llmrt-bench: cannot allocate 1 GiB for the bandwidth probe");
            std::process::exit(1);
        };
        for (i, w) in buf.bytes_mut().chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&(i as u64).to_le_bytes());
        }
        buf
    });
    let buf = buf.bytes();
    let n = buf.len();
    let chunk = n.div_ceil(threads).div_ceil(256) * 256;
    let word = |c: &[u8], k: usize| u64::from_le_bytes(c[8 * k..8 * k + 8].try_into().expect("8 bytes"));
    let four = |c: &[u8]| {
        let q = c.len() / 256 * 64; // four streams of q bytes each
        let (a, rest) = c.split_at(q);
        let (b, rest) = rest.split_at(q);
        let (cc, d) = rest.split_at(q);
        let mut s = [0u64; 8];
        for (((x, y), z), w) in a.chunks_exact(64).zip(b.chunks_exact(64)).zip(cc.chunks_exact(64)).zip(d.chunks_exact(64)) {
            for k in 0..8 {
                s[k] = s[k].wrapping_add(word(x, k) ^ word(y, k)).wrapping_add(word(z, k) ^ word(w, k));
            }
        }
        s.iter().fold(0u64, |acc, &v| acc.wrapping_add(v))
    };
    let one = |c: &[u8]| {
        let mut s = [0u64; 8];
        for (i, l) in c.chunks_exact(256).enumerate() {
            #[cfg(target_arch = "x86_64")]
            for k in 0..4 {
                // SAFETY: a prefetch is a hint: it never faults, whatever the address.
                unsafe {
                    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                    _mm_prefetch::<_MM_HINT_T0>(c.as_ptr().wrapping_add(i * 256 + 4096 + 64 * k) as *const i8)
                };
            }
            for k in 0..8 {
                s[k] = s[k].wrapping_add(word(l, k) ^ word(l, 8 + k)).wrapping_add(word(l, 16 + k) ^ word(l, 24 + k));
            }
        }
        s.iter().fold(0u64, |acc, &v| acc.wrapping_add(v))
    };
    let mut best = [0f64; 2];
    for _ in 0..passes {
        for (p, bp) in best.iter_mut().enumerate() {
            let t0 = Instant::now();
            let total: u64 = std::thread::scope(|sc| {
                let hs: Vec<_> = buf
                    .chunks(chunk)
                    .map(|c| sc.spawn(move || if p == 0 { four(c) } else { one(c) }))
                    .collect();
                hs.into_iter().map(|h| h.join().expect("membw thread")).fold(0u64, |a, b| a.wrapping_add(b))
            });
            let dt = t0.elapsed().as_secs_f64();
            std::hint::black_box(total);
            *bp = bp.max(n as f64 / dt / 1e9);
        }
    }
    (best[0].max(best[1]), best)
}

// ---------------------------------------------------------------------------
// Benchmarks.

/// What one test measured.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Test {
    /// Prefill of N tokens into an empty cache.
    Pp(usize),
    /// N decode steps of `seqs` sequences each holding `depth` positions first.
    Tg { n: usize, seqs: usize, depth: usize },
    /// Time to first token of an N-token prompt.
    Ttft(usize),
}

impl Test {
    fn name(self) -> String {
        match self {
            Test::Pp(n) => format!("pp{n}"),
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
    fn tokens(self) -> usize {
        match self {
            Test::Pp(n) => n,
            Test::Tg { n, seqs, .. } => n * seqs,
            Test::Ttft(_) => 1,
        }
    }
}

struct Record {
    model: String,
    desc: String,
    backend: &'static str,
    size: u64,
    params: u64,
    threads: usize,
    test: Test,
    samples_ns: Vec<u64>,
    samples_ts: Vec<f64>,
    /// tg with a measured copy bandwidth: the bytes bound in t/s (CPU with
    /// `--membw`: the mean of the repetitions' bounds).
    bound_ts: Option<f64>,
    /// CPU tg with `--membw`: the mean of each repetition's speed over its bound.
    fraction: Option<f64>,
    /// Bytes a step reads (weights + KV, mean over the steps) for tg.
    step_bytes: Option<(u64, u64)>,
    /// pp with a measured GEMM rate: the achieved TFLOP/s of the matrix products.
    tflops: Option<f64>,
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let sd = if v.len() > 1 { (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0)).sqrt() } else { 0.0 };
    (m, sd)
}

fn fail(what: &str, e: llmrt::Error) -> ! {
    eprintln!("llmrt-bench: {what}: {e}");
    std::process::exit(1)
}

/// One repetition of `test`; returns its wall time in seconds (setup excluded for tg).
fn run_test(m: &Model, test: Test, greedy: bool, rng: &mut Rng) -> f64 {
    let vocab = m.info().vocab_size as u64;
    let mut tok = || (rng.next() % vocab) as u32;
    match test {
        Test::Pp(n) | Test::Ttft(n) => {
            let toks: Vec<u32> = (0..n).map(|_| tok()).collect();
            let mut logits = vec![0f32; vocab as usize];
            let t0 = Instant::now();
            let c = m.cache_reserve((n + 1) as u32).unwrap_or_else(|e| fail("cache_reserve", e));
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

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// What a model is: (description, size in bytes, parameters, bytes of an untied
/// token_embd or 0, FLOPs per prefilled token in the matrix products).
struct Desc {
    text: String,
    size: u64,
    params: u64,
    embd_bytes: u64,
    flops_per_token: f64,
}

fn describe(name: &str, ty: &str, m: &Model, ffn: u64, untied: bool) -> Desc {
    let info = m.info();
    let (h, l, v) = (info.hidden_size as u64, info.n_layers as u64, info.vocab_size as u64);
    // Parameters from the shapes (embeddings and output counted, norms ignored).
    let qd = (info.n_heads * info.head_dim) as u64;
    let kvd = (info.n_kv_heads * info.head_dim) as u64;
    let layer = 2 * h * qd + 2 * h * kvd + 3 * h * ffn;
    let params = 2 * v * h + l * layer;
    let embd_bytes = if untied { info.weight_bytes * (v * h) / params.max(1) } else { 0 };
    let _ = name;
    Desc {
        text: format!("{} {:.1}B {}", info.architecture, params as f64 / 1e9, ty.to_uppercase()),
        size: info.weight_bytes,
        params,
        embd_bytes,
        // Layers' matrix products (2 FLOPs per weight per token); the LM head runs
        // for the last row only.
        flops_per_token: 2.0 * (l * layer) as f64,
    }
}

/// (ffn, untied) read from a GGUF file's metadata and tensor names.
fn gguf_facts(path: &str) -> (u64, bool) {
    let Ok(g) = llmrt::format::gguf::Gguf::open(Path::new(path)) else { return (0, false) };
    let arch = g.get_str("general.architecture").ok().flatten().map(|s| s.to_string()).unwrap_or_default();
    let ffn = g.get_u64(&format!("{arch}.feed_forward_length")).ok().flatten().unwrap_or(0);
    let untied = g.tensor("output.weight").is_some();
    (ffn, untied)
}

/// Loads `spec`: a GGUF path or `synth:SHAPE:TYPE` (built in memory).
fn load(spec: &str, opts: LoadOptions<'_>) -> (Model, Desc) {
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
        let d = describe(spec, ty, &m, s.ffn as u64, true);
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

fn main() {
    let a = parse();
    if let Some(shape) = &a.synth {
        match synth(shape, &a.ty, &a.out) {
            Ok(p) => println!("{}", p.display()),
            Err(e) => {
                eprintln!("llmrt-bench: cannot write the synthetic model: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    if a.membw && a.models.is_empty() {
        for &t in &a.threads {
            let (bw, [four, one]) = membw(t, 5);
            println!("read bandwidth, {t} thread(s): {bw:.2} GB/s (4 streams {four:.2}, 1 stream + prefetch {one:.2})");
        }
        return;
    }
    let md = a.output == "md";
    // The device ceilings, measured first, in this process.
    let mut d2d_gbs = None;
    let mut gemm_tflops = None;
    if a.d2d || a.gemm > 0 {
        match gpu::ceilings(a.d2d, a.gemm) {
            Ok((bw, tf)) => {
                if let Some(bw) = bw {
                    println!("CEILING d2d_copy_GBps={bw:.1} (cuMemcpyDtoD 4 GiB, bytes read + written, best of 10)");
                }
                if let Some(tf) = tf {
                    println!("CEILING cublas_bf16_gemm_TFLOPs={tf:.1} (n={}, f32 compute, mean of 10)", a.gemm);
                }
                d2d_gbs = bw;
                gemm_tflops = tf;
            }
            Err(e) => fail("device ceilings", e),
        }
    }
    if a.models.is_empty() {
        if a.d2d || a.gemm > 0 {
            return;
        }
        usage();
    }
    let backend_name = if a.backend == BackendKind::Cuda { "CUDA" } else { "CPU" };
    let mut recs: Vec<Record> = Vec::new();
    if md {
        println!(
            "| model                          |       size |     params | backend    | threads |            test |                  t/s | bound t/s | % bound |"
        );
        println!(
            "| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: | --------: | ------: |"
        );
    }
    let mut rng = Rng(42);
    let threads = if a.backend == BackendKind::Cuda { vec![a.threads[0]] } else { a.threads.clone() };
    for spec in &a.models {
        for &t in &threads {
            let opts = LoadOptions { backend: a.backend, threads: t as u32, kv_cache_bytes: a.kv_bytes, ..Default::default() };
            let (m, desc) = load(spec, opts);
            let info = m.info().clone();
            if a.backend == BackendKind::Cuda {
                eprintln!(
                    "llmrt-bench: {spec} on {}: weights {:.2} GB, scratch {:.2} GB, KV pool {:.2} GB, free {:.2} of {:.2} GB",
                    info.device_name,
                    info.weight_bytes as f64 / 1e9,
                    info.scratch_bytes as f64 / 1e9,
                    info.kv_pool_bytes as f64 / 1e9,
                    info.device_free_bytes as f64 / 1e9,
                    info.device_total_bytes as f64 / 1e9
                );
            }
            let mut tests: Vec<Test> = a.prompt.iter().filter(|&&p| p > 0).map(|&p| Test::Pp(p)).collect();
            for &n in a.gen.iter().filter(|&&n| n > 0) {
                for &d in &a.depth {
                    for &b in &a.batch {
                        tests.push(Test::Tg { n, seqs: b.max(1), depth: d });
                    }
                }
            }
            tests.extend(a.ttft.iter().filter(|&&p| p > 0).map(|&p| Test::Ttft(p)));
            let greedy = a.backend == BackendKind::Cuda;
            for test in tests {
                // CPU tg with --membw: the read bandwidth probed before every
                // repetition and after the last one.
                let probe = a.membw && a.backend == BackendKind::Cpu && matches!(test, Test::Tg { .. });
                let mut bws = Vec::new();
                run_test(&m, test, greedy, &mut rng); // warm-up
                let mut ns = Vec::new();
                let mut ts = Vec::new();
                for _ in 0..a.reps.max(1) {
                    if probe {
                        bws.push(membw(t, 2).0);
                    }
                    let s = run_test(&m, test, greedy, &mut rng);
                    ns.push((s * 1e9) as u64);
                    ts.push(test.tokens() as f64 / s);
                }
                if probe {
                    bws.push(membw(t, 2).0);
                }
                let (mut bound_ts, mut step_bytes, mut tflops, mut fraction) = (None, None, None, None);
                if let Test::Tg { n, seqs, depth } = test {
                    let w = step_weight_bytes(&info, desc.embd_bytes, seqs);
                    // Step k (0-based) reads depth + k + 1 positions of each sequence.
                    let kv = (seqs as f64 * (depth as f64 + (n as f64 + 1.0) / 2.0) * info.kv_bytes_per_position as f64) as u64;
                    step_bytes = Some((w, kv));
                    let bound = |bw: f64| seqs as f64 / ((w + kv) as f64 / (bw * 1e9));
                    if probe {
                        // Each repetition against the higher of the probes on either
                        // side of it (the machine's state moves on this VM).
                        // A repetition whose two probes differ by more than 15% saw the
                        // state change and is left out (all are kept if none is steady).
                        let per: Vec<f64> = bws.windows(2).map(|p| bound(p[0].max(p[1]))).collect();
                        let steady: Vec<bool> = bws.windows(2).map(|p| p[0].max(p[1]) <= 1.15 * p[0].min(p[1])).collect();
                        let all = !steady.iter().any(|&k| k);
                        let kept: Vec<usize> = (0..per.len()).filter(|&i| all || steady[i]).collect();
                        let fr: Vec<f64> = kept.iter().map(|&i| ts[i] / per[i]).collect();
                        let kb: Vec<f64> = kept.iter().map(|&i| per[i]).collect();
                        eprintln!(
                            "llmrt-bench: {spec} {} with {t} thread(s): read bandwidth {} GB/s; per repetition {} t/s of {} t/s; {} of {} steady",
                            test.name(),
                            bws.iter().map(|v| format!("{v:.1}")).collect::<Vec<_>>().join(" "),
                            ts.iter().map(|v| format!("{v:.1}")).collect::<Vec<_>>().join(" "),
                            per.iter().map(|v| format!("{v:.1}")).collect::<Vec<_>>().join(" "),
                            steady.iter().filter(|&&k| k).count(),
                            per.len()
                        );
                        bound_ts = Some(mean_sd(&kb).0);
                        fraction = Some(mean_sd(&fr).0);
                    } else {
                        bound_ts = d2d_gbs.map(bound);
                    }
                }
                if let (Test::Pp(_), Some(_)) = (test, gemm_tflops) {
                    let (m_ts, _) = mean_sd(&ts);
                    tflops = Some(desc.flops_per_token * m_ts / 1e12);
                }
                let r = Record {
                    model: spec.clone(),
                    desc: desc.text.clone(),
                    backend: backend_name,
                    size: desc.size,
                    params: desc.params,
                    threads: t,
                    test,
                    samples_ns: ns,
                    samples_ts: ts,
                    bound_ts,
                    fraction,
                    step_bytes,
                    tflops,
                };
                let (m_, sd) = mean_sd(&r.samples_ts);
                let (bound, pct) = match (r.bound_ts, r.tflops, gemm_tflops) {
                    (Some(b), _, _) => (format!("{b:.2}"), format!("{:.1}%", 100.0 * r.fraction.unwrap_or(m_ / b))),
                    (None, Some(tf), Some(g)) => (format!("{tf:.1} TF"), format!("{:.1}%", 100.0 * tf / g)),
                    _ => ("-".into(), "-".into()),
                };
                let value = if let Test::Ttft(_) = test {
                    let ms: Vec<f64> = r.samples_ns.iter().map(|&v| v as f64 / 1e6).collect();
                    let (mm, msd) = mean_sd(&ms);
                    format!("{mm:.2} ± {msd:.2} ms")
                } else {
                    format!("{m_:.2} ± {sd:.2}")
                };
                if md {
                    println!(
                        "| {:<30} | {:>10} | {:>10} | {:<10} | {:>7} | {:>15} | {:>20} | {:>9} | {:>7} |",
                        r.desc,
                        format!("{:.2} MiB", r.size as f64 / (1024.0 * 1024.0)),
                        format!("{:.2} B", r.params as f64 / 1e9),
                        r.backend,
                        t,
                        test.name(),
                        value,
                        bound,
                        pct
                    );
                    let _ = std::io::stdout().flush();
                }
                recs.push(r);
            }
        }
    }
    if a.output == "json" || a.json_file.is_some() {
        let arr: Vec<serde_json::Value> = recs
            .iter()
            .map(|r| {
                let (avg_ts, stddev_ts) = mean_sd(&r.samples_ts);
                let nsf: Vec<f64> = r.samples_ns.iter().map(|&v| v as f64).collect();
                let (avg_ns, stddev_ns) = mean_sd(&nsf);
                let (n_prompt, n_gen, n_seqs, n_depth) = match r.test {
                    Test::Pp(n) | Test::Ttft(n) => (n, 0, 1, 0),
                    Test::Tg { n, seqs, depth } => (0, n, seqs, depth),
                };
                let cpu_info = if r.backend == "CPU" { llmrt::backend::cpu::simd::isa().name().to_string() } else { String::new() };
                serde_json::json!({
                    "build_commit": "llmrt",
                    "cpu_info": cpu_info,
                    "backends": r.backend,
                    "model_filename": r.model,
                    "model_type": r.desc,
                    "model_size": r.size,
                    "model_n_params": r.params,
                    "n_threads": r.threads,
                    "test": r.test.name(),
                    "n_prompt": n_prompt,
                    "n_gen": n_gen,
                    "n_seqs": n_seqs,
                    "n_depth": n_depth,
                    "avg_ns": avg_ns as u64,
                    "stddev_ns": stddev_ns as u64,
                    "avg_ts": avg_ts,
                    "stddev_ts": stddev_ts,
                    "samples_ns": r.samples_ns,
                    "samples_ts": r.samples_ts,
                    "step_weight_bytes": r.step_bytes.map(|b| b.0),
                    "step_kv_bytes": r.step_bytes.map(|b| b.1),
                    "bound_ts": r.bound_ts,
                    "fraction_of_bound": r.fraction.or(r.bound_ts.map(|b| avg_ts / b)),
                    "tflops": r.tflops,
                    "d2d_GBps": d2d_gbs,
                    "gemm_bf16_TFLOPs": gemm_tflops,
                })
            })
            .collect();
        let text = serde_json::to_string_pretty(&serde_json::Value::Array(arr)).expect("json");
        if a.output == "json" {
            println!("{text}");
        }
        if let Some(p) = &a.json_file {
            if let Err(e) = std::fs::write(p, text) {
                eprintln!("llmrt-bench: writing {}: {e}", p.display());
                std::process::exit(1);
            }
        }
    }
}

/// The device ceilings: copy bandwidth and cuBLAS bf16 GEMM rate, with cudarc directly.
mod gpu {
    use cudarc::cublas::{self, CudaBlas};
    use cudarc::driver::{CudaContext, DevicePtr, DevicePtrMut};
    use llmrt::{Error, Result};
    use std::ffi::c_void;
    use std::time::Instant;

    fn derr(what: &str, e: impl std::fmt::Debug) -> Error {
        Error::device(format!("{what}: {e:?}"))
    }

    /// (copy GB/s counting bytes read and written, bf16 GEMM TFLOP/s) on device 0.
    pub fn ceilings(d2d: bool, gemm_n: usize) -> Result<(Option<f64>, Option<f64>)> {
        llmrt::backend::cuda::probe()?;
        let ctx = CudaContext::new(0).map_err(|e| derr("cuDevicePrimaryCtxRetain(cuda:0)", e))?;
        let stream = ctx.default_stream();
        let mut bw = None;
        if d2d {
            let n = 4usize << 30;
            let src = stream.alloc_zeros::<u8>(n).map_err(|e| derr("cuMemAlloc 4 GiB", e))?;
            let mut dst = stream.alloc_zeros::<u8>(n).map_err(|e| derr("cuMemAlloc 4 GiB", e))?;
            let mut best = 0f64;
            for i in 0..12 {
                stream.synchronize().map_err(|e| derr("sync", e))?;
                let t0 = Instant::now();
                stream.memcpy_dtod(&src, &mut dst).map_err(|e| derr("cuMemcpyDtoDAsync", e))?;
                stream.synchronize().map_err(|e| derr("sync", e))?;
                let dt = t0.elapsed().as_secs_f64();
                if i >= 2 {
                    best = best.max(2.0 * n as f64 / dt / 1e9);
                }
            }
            bw = Some(best);
        }
        let mut tf = None;
        if gemm_n > 0 {
            // SAFETY: is_culib_present only tries to dlopen cuBLAS; it calls nothing.
            if !unsafe { cublas::sys::is_culib_present() } {
                return Err(Error::unsupported("cuBLAS library not found (libcublas.so)"));
            }
            let blas = CudaBlas::new(stream.clone()).map_err(|e| derr("cublasCreate", e))?;
            let n = gemm_n;
            let mut r = 0x2545_F491u64;
            let host: Vec<u16> = (0..n * n)
                .map(|_| {
                    r ^= r << 13;
                    r ^= r >> 7;
                    r ^= r << 17;
                    half::bf16::from_f32((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5).to_bits()
                })
                .collect();
            let a = stream.clone_htod(&host).map_err(|e| derr("upload A", e))?;
            let b = stream.clone_htod(&host).map_err(|e| derr("upload B", e))?;
            let mut c = stream.alloc_zeros::<u16>(n * n).map_err(|e| derr("alloc C", e))?;
            let ni = i32::try_from(n).map_err(|_| Error::invalid(format!("--gemm {n} does not fit i32")))?;
            let (alpha, beta) = (1.0f32, 0.0f32);
            let mut run = |reps: usize| -> Result<f64> {
                stream.synchronize().map_err(|e| derr("sync", e))?;
                let t0 = Instant::now();
                for _ in 0..reps {
                    let (ap, _ga) = a.device_ptr(&stream);
                    let (bp, _gb) = b.device_ptr(&stream);
                    let (cp, _gc) = c.device_ptr_mut(&stream);
                    use cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
                    // SAFETY: A, B, C each hold n*n bf16 on this context (allocated above); m = n =
                    // k = ld = n fit i32; alpha/beta are host f32 (pointer mode host, compute 32F);
                    // the handle's stream is `stream`, where the buffers were made.
                    unsafe {
                        cublas::result::gemm_ex(
                            *blas.handle(),
                            cublasOperation_t::CUBLAS_OP_N,
                            cublasOperation_t::CUBLAS_OP_N,
                            ni,
                            ni,
                            ni,
                            (&alpha as *const f32).cast::<c_void>(),
                            ap as *const c_void,
                            cudaDataType::CUDA_R_16BF,
                            ni,
                            bp as *const c_void,
                            cudaDataType::CUDA_R_16BF,
                            ni,
                            (&beta as *const f32).cast::<c_void>(),
                            cp as *mut c_void,
                            cudaDataType::CUDA_R_16BF,
                            ni,
                            cublasComputeType_t::CUBLAS_COMPUTE_32F,
                            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                        )
                    }
                    .map_err(|e| derr("cublasGemmEx bf16", e))?;
                }
                stream.synchronize().map_err(|e| derr("sync after GEMM", e))?;
                Ok(t0.elapsed().as_secs_f64())
            };
            run(3)?;
            let dt = run(10)?;
            tf = Some(10.0 * 2.0 * (n as f64).powi(3) / dt / 1e12);
        }
        Ok((bw, tf))
    }
}
