//! `llmrt-bench`: llama-bench's flags and output for llmrt's CPU and CUDA backends,
//! synthetic models (files, or built in memory), a memory read-bandwidth probe, and
//! on a GPU the two ceilings decode and prefill are held against.
//!
//! ```text
//! llmrt-bench -m FILE|synth:SHAPE:TYPE[,...] [--backend cpu|cuda] [-t 1,2] [-p 128] [-n 64]
//!             [-b 1,4] [-d 0,512] [--ttft 2048] [-r 5] [-o md|json] [--kv-bytes N]
//!             [--d2d] [--gemm 8192] [--json FILE]
//! llmrt-bench --synth tinyllama|llama3-8b|moe-mini|gemma2-2b|phi3-mini --type f16|bf16|q8_0|q4_0 --out DIR
//! llmrt-bench --membw [-t 1,2]
//! llmrt-bench --peak [-t 1,2]              (CPU arithmetic ceilings: f32 FMA, 8-bit dot)
//! llmrt-bench --d2d [--gemm 8192]          (CUDA ceilings only)
//! llmrt-bench --grammar json|regex|lark (-m FILE | --vocab VOCAB.gguf) [-r 5] [-n 128]
//! llmrt-bench --perplexity FILE -m FILE[,...] [-c N] [-t N] [--backend cpu|cuda]
//! ```
//!
//! `--grammar`: the cost of grammar-constrained decoding per token (grammar.rs).
//!
//! As llama-bench: `pp N` prefills N tokens into an empty cache, `tg N` runs N
//! single-token decode steps, each test runs once to warm up and then `-r` times;
//! t/s is tokens per second (mean ± sample stddev over the repetitions). `-b N`
//! (N > 1) runs the tg tests as batched decode of N sequences per step (t/s counts
//! all N sequences' tokens). `-d D` (llama-bench's depth) first fills each cache
//! with D positions (one prefill, then forks for the other sequences; not timed), for
//! the pp tests as for the tg tests (`pp N @ dD` prefills N more after the D).
//! `--ttft N`: time to first token, from reserving a cache to holding the first
//! generated id on the host (a prefill of N tokens and the argmax of its last row).
//! On CUDA, tg steps are `decode_greedy` (one id per sequence comes back); on the CPU
//! `decode` with logits, as before.
//!
//! `synth:SHAPE:TYPE` (SHAPE tinyllama, llama3-8b, moe-mini (32 experts, 4 per token), gemma2-2b
//! or phi3-mini (their GGUF architectures and tensors), TYPE f16, q8_0 or q4_0) builds a
//! valid GGUF of that shape in memory with random weights (no disk; all threads
//! fill it) and loads it with `Model::load_gguf_bytes`.
//!
//! `--d2d`: device-to-device copy bandwidth (cuMemcpyDtoD of 4 GiB, best of 10,
//! bytes read plus bytes written); with it, each tg row gains its bytes bound: (weight
//! bytes read per step + KV bytes read per step) / that bandwidth, and the % reached.
//! `--gemm N`: cuBLAS bf16 N x N x N GEMM (f32 compute) in TFLOP/s (mean of 10 after 3
//! warm-ups); with it, each pp row gains its FLOP rate and the % of that. Optional: it
//! prints `cuBLAS: <path of the libcublas loaded>`, or `cuBLAS: not loaded (<reason>)`
//! and goes on without that ceiling.
//! `--perplexity FILE`: each model's perplexity over the text FILE by llama-perplexity's
//! method (`llmrt::perplexity`: chunks of `-c N` tokens, default the model's context,
//! the second half of each scored), printed as llama-perplexity prints it (`-t`: its first
//! value).
//! `--json FILE` also writes the JSON records to FILE (with `-o md` on stdout).
//! `--membw` with `-m` (CPU): each tg row gains its bytes bound from the read
//! bandwidth probed with the row's thread count before every repetition and after
//! the last: each repetition is held against the higher of the probes on either
//! side of it, and the row reports the mean bound and the mean of the fractions,
//! so bound and speed see the same machine state (repetitions whose two probes
//! differ by more than 15% are left out: the state changed during them, unless
//! no repetition was steady); alone, `--membw` prints the probe.
//! `--peak`: the f32 FMA and 8-bit integer-dot rates of the kernel set this process
//! runs (`LLMRT_CPU_KERNELS` applies), with each thread count (one probe per thread,
//! rates summed, best of 5): the ceilings the prefill GEMMs are held against. AVX2
//! adds the dot products into i32 by how they widen (`into i32`, see
//! `backend::cpu::peak`): the ceilings of the kernels that multiply each way.

mod args;
mod gpu;
mod grammar;
mod membw;
mod ppl;
mod run;
mod synth;

use args::{parse, usage};
use llmrt::runtime::{BackendKind, LoadOptions};
use llmrt::util::XorShift;
use membw::membw;
use run::{fail, load, mean_sd, run_test, step_weight_bytes, Record, Test};
use std::io::Write;
use synth::synth;

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
    if let Some(which) = &a.grammar {
        grammar::bench(&a, which);
        return;
    }
    if a.membw && a.models.is_empty() {
        for &t in &a.threads {
            let (bw, [four, one]) = membw(t, 5);
            println!("read bandwidth, {t} thread(s): {bw:.2} GB/s (4 streams {four:.2}, 1 stream + prefetch {one:.2})");
        }
        return;
    }
    if a.peak {
        // The arithmetic ceilings of the prefill GEMMs: t threads, each running the
        // probe on its own core; the best of 5 runs of the summed rates.
        let kernels = llmrt::bench::cpu_kernels();
        for &t in &a.threads {
            let mut best: Option<llmrt::bench::Peak> = None;
            for _ in 0..5 {
                let rates: Vec<Option<llmrt::bench::Peak>> = std::thread::scope(|sc| {
                    let hs: Vec<_> = (0..t).map(|_| sc.spawn(|| llmrt::bench::cpu_peak(200_000_000))).collect();
                    hs.into_iter().map(|h| h.join().expect("peak thread")).collect()
                });
                let Some(rates) = rates.into_iter().collect::<Option<Vec<_>>>() else {
                    eprintln!("llmrt-bench: kernel set {kernels} has no peak probe");
                    std::process::exit(1);
                };
                // The threads' rates summed, then the best of the runs, figure by figure.
                let sum = rates.into_iter().reduce(|a, b| a.zip_with(&b, |x, y| x + y)).expect("at least one thread");
                best = Some(match best {
                    Some(b) => b.zip_with(&sum, f64::max),
                    None => sum,
                });
            }
            let best = best.expect("five runs");
            let widened: String = best.into_i32.iter().map(|(n, r)| format!(", {n} {r:.1}")).collect();
            let widened = if widened.is_empty() { widened } else { format!("; into i32{widened} Gop/s") };
            println!(
                "peak, {t} thread(s), {kernels}: f32 FMA {:.1} GFLOP/s, 8-bit integer dot {:.1} Gop/s{widened}",
                best.flops, best.int8
            );
        }
        return;
    }
    if let Some(file) = &a.perplexity {
        if a.models.is_empty() {
            usage();
        }
        let (backend, threads) = (a.backend, a.threads[0] as u32);
        ppl::perplexity(file, &a.models, a.ctx, || LoadOptions { backend, threads, ..Default::default() });
        return;
    }
    let md = a.output == "md";
    // The device ceilings, measured first, in this process.
    let mut d2d_gbs = None;
    let mut gemm_tflops = None;
    if a.d2d || a.gemm > 0 {
        match gpu::ceilings(a.d2d, a.gemm) {
            Ok(gpu::Ceilings { bw, tf, cublas }) => {
                if let Some(note) = cublas {
                    println!("{note}");
                }
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
    let mut rng = XorShift::new(42);
    let threads = if a.backend == BackendKind::Cuda { vec![a.threads[0]] } else { a.threads.clone() };
    for spec in &a.models {
        for &t in &threads {
            let opts =
                LoadOptions { backend: a.backend, threads: t as u32, kv_cache_bytes: a.kv_bytes, ..Default::default() };
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
            let mut tests: Vec<Test> = Vec::new();
            for &n in a.prompt.iter().filter(|&&p| p > 0) {
                tests.extend(a.depth.iter().map(|&depth| Test::Pp { n, depth }));
            }
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
                    let kv = (seqs as f64 * (depth as f64 + (n as f64 + 1.0) / 2.0) * info.kv_bytes_per_position as f64)
                        as u64;
                    step_bytes = Some((w, kv));
                    let bound = |bw: f64| seqs as f64 / ((w + kv) as f64 / (bw * 1e9));
                    if probe {
                        // Each repetition against the higher of the probes on either
                        // side of it (the machine's state moves on this VM).
                        // A repetition whose two probes differ by more than 15% saw the
                        // state change and is left out (all are kept if none is steady).
                        let per: Vec<f64> = bws.windows(2).map(|p| bound(p[0].max(p[1]))).collect();
                        let steady: Vec<bool> =
                            bws.windows(2).map(|p| p[0].max(p[1]) <= 1.15 * p[0].min(p[1])).collect();
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
                if let (Test::Pp { .. }, Some(_)) = (test, gemm_tflops) {
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
        let arr: Vec<serde_json::Value> = recs.iter().map(|r| json_record(r, d2d_gbs, gemm_tflops)).collect();
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

/// One record as llama-bench's JSON writes it, with llmrt's bounds and ceilings added.
fn json_record(r: &Record, d2d_gbs: Option<f64>, gemm_tflops: Option<f64>) -> serde_json::Value {
    let (avg_ts, stddev_ts) = mean_sd(&r.samples_ts);
    let nsf: Vec<f64> = r.samples_ns.iter().map(|&v| v as f64).collect();
    let (avg_ns, stddev_ns) = mean_sd(&nsf);
    let (n_prompt, n_gen, n_seqs, n_depth) = match r.test {
        Test::Pp { n, depth } => (n, 0, 1, depth),
        Test::Ttft(n) => (n, 0, 1, 0),
        Test::Tg { n, seqs, depth } => (0, n, seqs, depth),
    };
    let cpu_info = if r.backend == "CPU" { llmrt::bench::cpu_kernels().to_string() } else { String::new() };
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
}
