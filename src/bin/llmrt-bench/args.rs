//! Command-line arguments (llama-bench's flags, plus llmrt's own).

use llmrt::runtime::BackendKind;
use std::path::PathBuf;

pub(crate) fn usage() -> ! {
    eprintln!(
        "usage: llmrt-bench -m FILE|synth:SHAPE:TYPE[,...] [--backend cpu|cuda] [-t N,..] [-p N,..] [-n N,..]\n\
         \x20                  [-b N,..] [-d N,..] [--ttft N,..] [-r N] [-o md|json] [--kv-bytes N] [--membw] [--d2d] [--gemm N] [--json FILE]\n\
         \x20      llmrt-bench --synth tinyllama|llama3-8b|moe-mini|gemma2-2b|phi3-mini --type f16|bf16|q8_0|q4_0 --out DIR\n\
         \x20      llmrt-bench --membw [-t N,..]\n\
         \x20      llmrt-bench --peak [-t N,..]\n\
         \x20      llmrt-bench --d2d [--gemm N]\n\
         \x20      llmrt-bench --grammar json|regex|lark (-m FILE | --vocab VOCAB.gguf) [-r N] [-n N] [-t N]\n\
         \x20      llmrt-bench --perplexity FILE -m FILE[,...] [-c N] [-t N] [--backend cpu|cuda]"
    );
    std::process::exit(2)
}

pub(crate) fn list(s: &str) -> Vec<usize> {
    s.split(',').map(|v| v.trim().parse().unwrap_or_else(|_| usage())).collect()
}

pub(crate) struct Args {
    pub(crate) models: Vec<String>,
    pub(crate) threads: Vec<usize>,
    pub(crate) prompt: Vec<usize>,
    pub(crate) gen: Vec<usize>,
    pub(crate) batch: Vec<usize>,
    pub(crate) reps: usize,
    pub(crate) output: String,
    pub(crate) synth: Option<String>,
    pub(crate) ty: String,
    pub(crate) out: PathBuf,
    pub(crate) membw: bool,
    /// `--peak`: the FMA and integer-dot ceilings of the kernel set (per thread count).
    pub(crate) peak: bool,
    pub(crate) backend: BackendKind,
    pub(crate) depth: Vec<usize>,
    pub(crate) ttft: Vec<usize>,
    pub(crate) kv_bytes: u64,
    pub(crate) d2d: bool,
    pub(crate) gemm: usize,
    pub(crate) json_file: Option<PathBuf>,
    /// `--grammar json|regex|lark`: the constrained-decoding cost (grammar.rs).
    pub(crate) grammar: Option<String>,
    /// `--vocab FILE`: the tokenizer of that GGUF on a tiny random model (with --grammar).
    pub(crate) vocab: Option<String>,
    pub(crate) perplexity: Option<PathBuf>,
    pub(crate) ctx: usize,
}

pub(crate) fn parse() -> Args {
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
        peak: false,
        backend: BackendKind::Cpu,
        depth: vec![0],
        ttft: Vec::new(),
        kv_bytes: 0,
        d2d: false,
        gemm: 0,
        json_file: None,
        grammar: None,
        vocab: None,
        perplexity: None,
        ctx: 0,
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
            "--peak" => a.peak = true,
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
            "--grammar" => a.grammar = Some(val(&mut i)),
            "--vocab" => a.vocab = Some(val(&mut i)),
            "--gemm" => a.gemm = val(&mut i).parse().unwrap_or_else(|_| usage()),
            "--perplexity" => a.perplexity = Some(PathBuf::from(val(&mut i))),
            "-c" | "--ctx-size" => a.ctx = val(&mut i).parse().unwrap_or_else(|_| usage()),
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
