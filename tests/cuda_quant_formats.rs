//! Every file type `llama-quantize` makes of the small llama of tests/fixtures/quant/models
//! runs on the CUDA runner: its logits against the float64 forward pass over the file's
//! own dequantized weights (the references tests/quant_formats.rs holds the CPU to), at
//! most 1.5x llama.cpp's error on the same file, both with the whole prompt in one
//! prefill (the cuBLAS path: weights dequantized to f16, activations rounded to f16) and
//! in prefills of 6 tokens (the GEMV kernels, weights read as stored).
//!
//! Without a CUDA device it prints "skipped: no CUDA device (...)" and passes.
mod common;
use common::{read_f32, read_json, rel_l2};
use llmrt::backend::cuda;
use llmrt::{BackendKind, LoadOptions, Model};
use std::path::PathBuf;

/// Logits of every prompt position, the prompt given in prefills of `chunk` tokens.
fn logits(m: &Model, prompt: &[u32], chunk: usize) -> Vec<f32> {
    let vocab = m.info().vocab_size as usize;
    let c = m.cache_reserve(prompt.len() as u32).unwrap();
    let mut out = Vec::with_capacity(prompt.len() * vocab);
    for part in prompt.chunks(chunk) {
        let mut l = vec![f32::NAN; part.len() * vocab];
        m.prefill(c, part, Some(&mut l), true).unwrap();
        out.extend(l);
    }
    m.cache_release(c).unwrap();
    out
}

#[test]
fn every_llama_quantize_file_type_runs_on_cuda_within_1_5x_of_llama_cpp() {
    if let Err(e) = cuda::probe() {
        println!("skipped: no CUDA device ({e})");
        return;
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant/models");
    let idx = read_json(&dir.join("index.json"));
    let prompt: Vec<u32> = idx["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let vocab = idx["spec"]["vocab"].as_u64().unwrap() as usize;
    let mut report = Vec::new();
    for (ftype, f) in idx["files"].as_object().unwrap() {
        if !f["committed"].as_bool().unwrap_or(false) {
            continue;
        }
        let path = dir.join(f["file"].as_str().unwrap());
        let want = read_f32(&dir.join(f["ref"].as_str().unwrap()));
        let llama: Vec<f64> = f["llamacpp_rel_l2"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        let llama_max = llama.iter().cloned().fold(0.0, f64::max);
        let m = Model::load(
            &path,
            LoadOptions { backend: BackendKind::Cuda, kv_cache_bytes: 1 << 26, ..LoadOptions::default() },
        )
        .unwrap_or_else(|e| panic!("{ftype}: {}: {}", path.display(), e.message));
        let mut line = format!("{ftype:7} llama.cpp max {llama_max:.2e}");
        for (what, chunk) in [("one prefill", prompt.len()), ("prefills of 6", 6)] {
            let got = logits(&m, &prompt, chunk);
            let max =
                got.chunks_exact(vocab).zip(want.chunks_exact(vocab)).map(|(g, w)| rel_l2(g, w)).fold(0.0, f64::max);
            line.push_str(&format!(" | {what}: max {max:.2e}"));
            assert!(
                max <= 1.5 * llama_max,
                "{ftype} ({what}): max rel L2 {max:.3e} > 1.5 x llama.cpp's {llama_max:.3e}"
            );
        }
        report.push(line);
    }
    println!("{}", report.join("\n"));
    assert!(report.len() >= 16, "only {} file types checked", report.len());
}
