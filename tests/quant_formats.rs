//! The quantized GGUF types against references nobody here wrote:
//! - dequantization bit-identical to gguf-py's `gguf.quants.dequantize` on the
//!   vectors it wrote (tests/fixtures/quant/dequant: random blocks and crafted edge
//!   cases: zero, negative and subnormal scales, extreme mins, all-0x00/0xFF bytes);
//! - logits of a small llama quantized by llama.cpp's `llama-quantize` to every file
//!   type it makes (tests/fixtures/quant/models), against a float64 forward pass over
//!   each file's own dequantized weights: llmrt's relative L2 error, per row and over
//!   all rows, at most 1.5x llama.cpp's on the same file (its error comes from
//!   rounding activations to 8 bits);
//! - every file also runs batched and split prefills bit-identically (batch invariance).
mod common;
use common::{read_f32, read_json, rel_l2};
use llmrt::quant::{dequantize_row, DType};
use llmrt::{BackendKind, LoadOptions, Model};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant")
}

#[test]
fn dequantization_is_bit_identical_to_gguf_py() {
    let dir = fixtures().join("dequant");
    let idx = read_json(&dir.join("index.json"));
    let mut checked = 0;
    for (name, t) in idx["types"].as_object().unwrap() {
        let id = t["ggml_type"].as_u64().unwrap() as u32;
        let dt = DType::from_ggml(id).unwrap_or_else(|| panic!("{name} (ggml type {id}) is not supported"));
        assert_eq!(dt.name(), name);
        let (be, bb) = (t["block_size"].as_u64().unwrap() as usize, t["type_size"].as_u64().unwrap() as usize);
        assert_eq!((dt.block_elems(), dt.block_bytes()), (be, bb), "{name}");
        let blocks = std::fs::read(dir.join(format!("{name}.blocks"))).unwrap();
        let want = read_f32(&dir.join(format!("{name}.f32")));
        let labels = t["block_labels"].as_array().unwrap();
        for (i, b) in blocks.chunks_exact(bb).enumerate() {
            let mut got = vec![0f32; be];
            dequantize_row(dt, b, &mut got);
            for (j, (g, w)) in got.iter().zip(&want[i * be..(i + 1) * be]).enumerate() {
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{name} block {i} ({}) value {j}: {g:e} ({:#010x}), gguf-py {w:e} ({:#010x})",
                    labels[i],
                    g.to_bits(),
                    w.to_bits()
                );
            }
        }
        // Whole rows of several blocks go through the same path.
        let mut row = vec![0f32; want.len()];
        dequantize_row(dt, &blocks, &mut row);
        assert!(row.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())));
        checked += 1;
    }
    assert!(checked >= 12, "only {checked} types checked");
}

fn load(path: &Path, threads: u32) -> Model {
    Model::load(path, LoadOptions { backend: BackendKind::Cpu, threads, ..LoadOptions::default() })
        .unwrap_or_else(|e| panic!("{}: {}", path.display(), e.message))
}

fn prefill_all(m: &Model, tokens: &[u32]) -> Vec<f32> {
    let c = m.cache_reserve(tokens.len() as u32).unwrap();
    let mut logits = vec![0f32; tokens.len() * m.info().vocab_size as usize];
    m.prefill(c, tokens, Some(&mut logits), true).unwrap();
    m.cache_release(c).unwrap();
    logits
}

#[test]
fn every_llama_quantize_file_type_is_within_1_5x_of_llama_cpp() {
    let dir = fixtures().join("models");
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
        let m = load(&path, 2);
        let got = prefill_all(&m, &prompt);
        let ours: Vec<f64> = got.chunks_exact(vocab).zip(want.chunks_exact(vocab)).map(|(g, w)| rel_l2(g, w)).collect();
        let (our_max, llama_max) =
            (ours.iter().cloned().fold(0.0, f64::max), llama.iter().cloned().fold(0.0, f64::max));
        let (our_mean, llama_mean) =
            (ours.iter().sum::<f64>() / ours.len() as f64, llama.iter().sum::<f64>() / llama.len() as f64);
        report.push(format!("{ftype:7} llmrt max {our_max:.2e} mean {our_mean:.2e} | llama.cpp max {llama_max:.2e} mean {llama_mean:.2e}"));
        assert!(our_max <= 1.5 * llama_max, "{ftype}: max rel L2 {our_max:.3e} > 1.5 x llama.cpp's {llama_max:.3e}");
        assert!(
            our_mean <= 1.5 * llama_mean,
            "{ftype}: mean rel L2 {our_mean:.3e} > 1.5 x llama.cpp's {llama_mean:.3e}"
        );
        // One thread, and the prompt in two prefills, give the same bits.
        let one = prefill_all(&load(&path, 1), &prompt);
        assert!(one.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{ftype}: 1 vs 2 threads differ");
        let c = m.cache_reserve(prompt.len() as u32).unwrap();
        let k = 9;
        let mut first = vec![0f32; k * vocab];
        let mut rest = vec![0f32; (prompt.len() - k) * vocab];
        m.prefill(c, &prompt[..k], Some(&mut first), true).unwrap();
        m.prefill(c, &prompt[k..], Some(&mut rest), true).unwrap();
        first.extend(rest);
        assert!(first.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{ftype}: split prefill differs");
    }
    println!("{}", report.join("\n"));
    assert!(report.len() >= 16, "only {} file types checked", report.len());
}
