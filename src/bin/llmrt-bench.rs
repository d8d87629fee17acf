//! `llmrt-bench`: llama-bench's flags and output for llmrt's CPU backend, a
//! synthetic-model writer, and a memory read-bandwidth probe.
//!
//! ```text
//! llmrt-bench -m FILE[,FILE] [-t 1,2] [-p 128] [-n 64] [-b 1,4] [-r 5] [-o md|json]
//! llmrt-bench --synth tinyllama|llama3-8b --type f16|q8_0|q4_0 --out DIR
//! llmrt-bench --membw [-t 1,2]
//! ```
//!
//! As llama-bench: `pp N` prefills N tokens into an empty cache, `tg N` runs N
//! single-token decode steps from an empty cache, each test runs once to warm up
//! and then `-r` times; t/s is tokens per second (mean ± sample stddev over the
//! repetitions). `-b N` (N > 1) runs the tg tests as batched decode of N
//! sequences per step (t/s counts all N sequences' tokens).

use llmrt::format::gguf::Value;
use llmrt::format::gguf_write::GgufWriter;
use llmrt::quant::{quantize_row, DType};
use llmrt::runtime::{BackendKind, LoadOptions, Model};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

fn usage() -> ! {
    eprintln!(
        "usage: llmrt-bench -m FILE[,FILE...] [-t N,..] [-p N,..] [-n N,..] [-b N,..] [-r N] [-o md|json]\n\
         \x20      llmrt-bench --synth tinyllama|llama3-8b --type f16|q8_0|q4_0 --out DIR\n\
         \x20      llmrt-bench --membw [-t N,..]"
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

fn synth(shape_name: &str, ty: &str, dir: &Path) -> std::io::Result<PathBuf> {
    let s = match shape_name {
        "tinyllama" | "tinyllama-1.1b" => &TINYLLAMA,
        "llama3-8b" | "llama-3-8b" | "llama3" => &LLAMA3_8B,
        _ => usage(),
    };
    let dt = match ty {
        "f16" => DType::F16,
        "q8_0" => DType::Q8_0,
        "q4_0" => DType::Q4_0,
        "f32" => DType::F32,
        _ => usage(),
    };
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{}-{}.gguf", s.name, ty));
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

// ---------------------------------------------------------------------------
// Memory read bandwidth.

/// Read bandwidth in GB/s with `threads` threads summing a 1 GiB buffer (best of
/// 5). Each thread reads its part as 4 interleaved streams of 64-byte lines with
/// 8 independent (vectorisable) sums, so the loop is bound by memory, not adds.
fn membw(threads: usize) -> f64 {
    let n = (1usize << 30) / 8;
    let buf: Vec<u64> = (0..n as u64).collect();
    let chunk = n.div_ceil(threads).div_ceil(32) * 32;
    let mut best = 0f64;
    for _ in 0..5 {
        let t0 = Instant::now();
        let total: u64 = std::thread::scope(|sc| {
            let hs: Vec<_> = buf
                .chunks(chunk)
                .map(|c| {
                    sc.spawn(move || {
                        let q = c.len() / 32 * 8; // four streams of q u64 each
                        let (a, rest) = c.split_at(q);
                        let (b, rest) = rest.split_at(q);
                        let (cc, d) = rest.split_at(q);
                        let mut s = [0u64; 8];
                        for (((x, y), z), w) in
                            a.chunks_exact(8).zip(b.chunks_exact(8)).zip(cc.chunks_exact(8)).zip(d.chunks_exact(8))
                        {
                            for k in 0..8 {
                                s[k] = s[k].wrapping_add(x[k] ^ y[k]).wrapping_add(z[k] ^ w[k]);
                            }
                        }
                        s.iter().fold(0u64, |acc, &v| acc.wrapping_add(v))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("membw thread")).fold(0u64, |a, b| a.wrapping_add(b))
        });
        let dt = t0.elapsed().as_secs_f64();
        std::hint::black_box(total);
        best = best.max((n * 8) as f64 / dt / 1e9);
    }
    best
}

// ---------------------------------------------------------------------------
// Benchmarks.

struct Record {
    model: String,
    desc: String,
    size: u64,
    params: u64,
    threads: usize,
    n_prompt: usize,
    n_gen: usize,
    n_seqs: usize,
    samples_ns: Vec<u64>,
    samples_ts: Vec<f64>,
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let sd = if v.len() > 1 { (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0)).sqrt() } else { 0.0 };
    (m, sd)
}

fn run_test(m: &Model, n_prompt: usize, n_gen: usize, n_seqs: usize, rng: &mut Rng) -> f64 {
    let vocab = m.info().vocab_size as u64;
    let mut tok = || (rng.next() % vocab) as u32;
    let t0 = Instant::now();
    if n_prompt > 0 {
        let c = m.cache_reserve((n_prompt + 1) as u32).expect("cache");
        let toks: Vec<u32> = (0..n_prompt).map(|_| tok()).collect();
        let mut logits = vec![0f32; vocab as usize];
        m.prefill(c, &toks, Some(&mut logits), false).expect("prefill");
        m.cache_release(c).expect("release");
    } else {
        let caches: Vec<u64> = (0..n_seqs).map(|_| m.cache_reserve((n_gen + 1) as u32).expect("cache")).collect();
        let mut logits = vec![0f32; n_seqs * vocab as usize];
        for _ in 0..n_gen {
            let toks: Vec<u32> = (0..n_seqs).map(|_| tok()).collect();
            m.decode(&caches, &toks, Some(&mut logits)).expect("decode");
        }
        for c in caches {
            m.cache_release(c).expect("release");
        }
    }
    t0.elapsed().as_secs_f64()
}

fn describe(path: &str, m: &Model) -> (String, u64, u64) {
    let info = m.info();
    let size = std::fs::metadata(path).map(|x| x.len()).unwrap_or(info.weight_bytes);
    let (h, l, f, v) = (info.hidden_size as u64, info.n_layers as u64, 0u64, info.vocab_size as u64);
    let _ = f;
    // Parameters from the shapes (embeddings and output counted, norms ignored).
    let kvd = (info.n_kv_heads * info.head_dim) as u64;
    let ffn = guess_ffn(path).unwrap_or(0);
    let params = 2 * v * h + l * (2 * h * h + 2 * h * kvd + 3 * h * ffn);
    let ty = std::path::Path::new(path)
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.rsplit('-').next())
        .unwrap_or("?")
        .to_uppercase();
    let b = params as f64 / 1e9;
    (format!("{} {:.1}B {}", info.architecture, b, ty), size, params)
}

fn guess_ffn(path: &str) -> Option<u64> {
    let g = llmrt::format::gguf::Gguf::open(Path::new(path)).ok()?;
    let arch = g.get_str("general.architecture").ok()??.to_string();
    g.get_u64(&format!("{arch}.feed_forward_length")).ok()?
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
    if a.membw {
        for &t in &a.threads {
            println!("read bandwidth, {t} thread(s): {:.2} GB/s", membw(t));
        }
        return;
    }
    if a.models.is_empty() {
        usage();
    }
    let mut recs: Vec<Record> = Vec::new();
    let md = a.output == "md";
    if md {
        println!(
            "| model                          |       size |     params | backend    | threads |            test |                  t/s |"
        );
        println!(
            "| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: |"
        );
    }
    let mut rng = Rng(42);
    for path in &a.models {
        for &t in &a.threads {
            let opts = LoadOptions { backend: BackendKind::Cpu, threads: t as u32, ..Default::default() };
            let m = match Model::load(Path::new(path), opts) {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("llmrt-bench: {path}: {e}");
                    std::process::exit(1);
                }
            };
            let (desc, size, params) = describe(path, &m);
            let mut tests: Vec<(usize, usize, usize)> = a.prompt.iter().filter(|&&p| p > 0).map(|&p| (p, 0, 1)).collect();
            for &n in a.gen.iter().filter(|&&n| n > 0) {
                for &b in &a.batch {
                    tests.push((0, n, b.max(1)));
                }
            }
            for (np, ng, nb) in tests {
                run_test(&m, np, ng, nb, &mut rng); // warm-up
                let mut ns = Vec::new();
                let mut ts = Vec::new();
                for _ in 0..a.reps.max(1) {
                    let s = run_test(&m, np, ng, nb, &mut rng);
                    ns.push((s * 1e9) as u64);
                    ts.push((np + ng * nb) as f64 / s);
                }
                let r = Record {
                    model: path.clone(),
                    desc: desc.clone(),
                    size,
                    params,
                    threads: t,
                    n_prompt: np,
                    n_gen: ng,
                    n_seqs: nb,
                    samples_ns: ns,
                    samples_ts: ts,
                };
                if md {
                    let (m_, sd) = mean_sd(&r.samples_ts);
                    let test = if np > 0 {
                        format!("pp{np}")
                    } else if nb > 1 {
                        format!("tg{ng} b{nb}")
                    } else {
                        format!("tg{ng}")
                    };
                    println!(
                        "| {:<30} | {:>10} | {:>10} | {:<10} | {:>7} | {:>15} | {:>20} |",
                        r.desc,
                        format!("{:.2} MiB", r.size as f64 / (1024.0 * 1024.0)),
                        format!("{:.2} B", r.params as f64 / 1e9),
                        "CPU",
                        t,
                        test,
                        format!("{m_:.2} ± {sd:.2}")
                    );
                    let _ = std::io::stdout().flush();
                }
                recs.push(r);
            }
        }
    }
    if a.output == "json" {
        let arr: Vec<serde_json::Value> = recs
            .iter()
            .map(|r| {
                let (avg_ts, stddev_ts) = mean_sd(&r.samples_ts);
                let nsf: Vec<f64> = r.samples_ns.iter().map(|&v| v as f64).collect();
                let (avg_ns, stddev_ns) = mean_sd(&nsf);
                serde_json::json!({
                    "build_commit": "llmrt",
                    "cpu_info": llmrt::backend::cpu::simd::isa().name(),
                    "backends": "CPU",
                    "model_filename": r.model,
                    "model_type": r.desc,
                    "model_size": r.size,
                    "model_n_params": r.params,
                    "n_threads": r.threads,
                    "n_prompt": r.n_prompt,
                    "n_gen": r.n_gen,
                    "n_seqs": r.n_seqs,
                    "avg_ns": avg_ns as u64,
                    "stddev_ns": stddev_ns as u64,
                    "avg_ts": avg_ts,
                    "stddev_ts": stddev_ts,
                    "samples_ns": r.samples_ns,
                    "samples_ts": r.samples_ts,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&serde_json::Value::Array(arr)).expect("json"));
    }
}
