//! Sliding-window attention against transformers: the mistral fixture's model with
//! `sliding_window` 8 (tools/make_fixtures.py --window-check: logits.window8.f32 over
//! the fixture's 24 tokens, window_check.json), from its HF directory (config.json
//! `sliding_window`) and from its F32 GGUF with `llama.attention.sliding_window` added;
//! and the gemma fixtures (windows on some layers) decoded token by token past the
//! window equal to their prefill.
mod common;
use common::*;
use llmrt::format::gguf::{Gguf, Value};
use llmrt::format::gguf_write::GgufWriter;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> Fixture {
    Fixture::named(name)
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("llmrt-swa-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn worst_row(got: &[f32], want: &[f32], vocab: usize) -> f64 {
    assert_eq!(got.len(), want.len());
    got.chunks_exact(vocab).zip(want.chunks_exact(vocab)).map(|(g, w)| rel_l2(g, w)).fold(0.0, f64::max)
}

fn logits(path: &Path, tokens: &[u32]) -> Vec<f32> {
    let m = load(path);
    let c = m.reserve(0);
    m.prefill_all(c, tokens)
}

/// The window check's reference files and window.
fn window_check(f: &Fixture) -> (usize, Vec<f32>, Vec<f32>) {
    let j: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.dir.join("window_check.json")).unwrap()).unwrap();
    let w = j["sliding_window"].as_u64().unwrap() as usize;
    assert!(w < f.tokens.len());
    let full = read_f32(&f.dir.join(j["files"]["logits"].as_str().unwrap()));
    let bf16 = read_f32(&f.dir.join(j["files"]["hf_bf16"].as_str().unwrap()));
    (w, full, bf16)
}

/// A copy of `src` with `key` = `value` added to its metadata.
fn with_key(src: &Path, dst: &Path, key: &str, value: Value) {
    let g = Gguf::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        if k != "general.alignment" {
            w.kv(&k, v);
        }
    }
    w.kv(key, value);
    for t in &g.tensors {
        w.tensor_raw(&t.name, &t.ne, t.ggml_type, g.tensor_data(t).to_vec());
    }
    w.write(dst).unwrap();
}

#[test]
fn mistral_hf_sliding_window_matches_transformers() {
    let f = fixture("mistral");
    let (w, full, bf16) = window_check(&f);
    let d = scratch("hf");
    for e in std::fs::read_dir(f.dir.join("hf")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.join(e.file_name())).unwrap();
    }
    let cfg_path = d.join("config.json");
    let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    assert_eq!(c["sliding_window"], serde_json::Value::Null);
    c["sliding_window"] = serde_json::json!(w);
    std::fs::write(&cfg_path, serde_json::to_vec_pretty(&c).unwrap()).unwrap();
    let got = logits(&d, &f.tokens);
    let (e_bf16, e_full) = (worst_row(&got, &bf16, f.vocab), worst_row(&got, &full, f.vocab));
    println!("mistral hf/ window {w}: vs transformers over bf16 weights {e_bf16:.3e}, over f32 weights {e_full:.3e}");
    assert!(e_bf16 < 1e-4, "{e_bf16:.3e}");
    // hf/ holds bf16 weights: against the f32 weights' logits llmrt is as far as
    // transformers itself is over the rounded weights (1.09e-2 here), no farther.
    let rounding = worst_row(&bf16, &full, f.vocab);
    assert!(e_full < rounding + 1e-4, "{e_full:.3e} vs transformers' own bf16 rounding {rounding:.3e}");
    // The window matters here: without it the logits are the fixture's unwindowed ones.
    assert!(worst_row(&got, &f.logits, f.vocab) > 1e-2);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn mistral_gguf_sliding_window_matches_transformers() {
    let f = fixture("mistral");
    let (w, full, _) = window_check(&f);
    let d = scratch("gguf");
    let p = d.join("mistral.window.f32.gguf");
    with_key(&f.gguf("f32"), &p, "llama.attention.sliding_window", Value::U32(w as u32));
    let got = logits(&p, &f.tokens);
    let e = worst_row(&got, &full, f.vocab);
    println!("mistral f32 GGUF + llama.attention.sliding_window {w}: worst row relative L2 {e:.3e}");
    assert!(e < 1e-4, "{e:.3e}");
    // Token by token (each decode reads only the window's pages) equals the prefill.
    let m = load(&p);
    let c = m.reserve(0);
    let mut steps = m.prefill_all(c, &f.tokens[..3]);
    for &t in &f.tokens[3..] {
        steps.extend(m.decode(&[c], &[t]));
    }
    let e = worst_row(&steps, &full, f.vocab);
    assert!(e < 1e-4, "decode past the window: {e:.3e}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Gemma's windowed layers, decoded one token at a time past the window (32 tokens,
/// window 8), give the logits of transformers over the whole sequence.
#[test]
fn gemma_decode_past_the_window_matches_prefill() {
    for name in ["gemma2", "gemma3"] {
        let f = fixture(name);
        let m = load(&f.gguf("f32"));
        let c = m.reserve(0);
        let mut got = m.prefill_all(c, &f.tokens[..5]);
        for &t in &f.tokens[5..] {
            got.extend(m.decode(&[c], &[t]));
        }
        let e = worst_row(&got, &f.logits, f.vocab);
        println!("{name} f32 token by token: worst row relative L2 {e:.3e}");
        assert!(e < 1e-4, "{name}: {e:.3e}");
    }
}

/// GGUF `gemma2.attention.sliding_window_pattern`, as llama.cpp reads it: a period
/// (2: the default, even layers slide) or one flag per layer. The default spelled
/// either way gives the fixture's logits; the flags inverted give others; a list of
/// the wrong length is refused naming the key.
#[test]
fn gemma2_gguf_window_pattern_key() {
    let f = fixture("gemma2");
    let d = scratch("pattern");
    let base = logits(&f.gguf("f32"), &f.tokens);
    let key = "gemma2.attention.sliding_window_pattern";
    let flags = |v: &[bool]| Value::Array(v.iter().map(|&b| Value::Bool(b)).collect());
    for (tag, value, same) in [
        ("period", Value::U32(2), true),
        ("flags", flags(&[true, false, true]), true),
        ("inverted", flags(&[false, true, false]), false),
    ] {
        let p = d.join(format!("gemma2.{tag}.gguf"));
        with_key(&f.gguf("f32"), &p, key, value);
        let got = logits(&p, &f.tokens);
        let e = worst_row(&got, &base, f.vocab);
        println!("gemma2 {key} {tag}: worst row relative L2 vs the fixture's {e:.3e}");
        assert_eq!(e < 1e-6, same, "{tag}: {e:.3e}");
    }
    let p = d.join("gemma2.short.gguf");
    with_key(&f.gguf("f32"), &p, key, flags(&[true, false]));
    let (st, msg) = match try_load(&p, 1, 0) {
        Ok(_) => panic!("a 2-entry pattern for 3 layers loaded"),
        Err(e) => e,
    };
    assert_eq!(st, llmrt::Status::LLMRT_BAD_MODEL, "{msg}");
    assert!(msg.contains(key) && msg.contains("2 entries for 3 layers"), "{msg}");
    let _ = std::fs::remove_dir_all(&d);
}
