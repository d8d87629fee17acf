//! `--grammar json|regex|lark`: what grammar-constrained decoding costs per token.
//!
//! Over `-r` completions (each its own seed; temperature 1 over the whole masked
//! vocabulary, up to `-n` tokens or until the grammar is done), times separately:
//! - the grammar's mask computation for each state (llguidance walking the token trie;
//!   `Grammar::allowed`), per token: mean, p50, p99, max;
//! - the constrained step (`decode_sample_constrained`: decode, masked sampling, the
//!   grammar's advance; its mask already computed), against an unconstrained
//!   `decode_sample` step of the same model in the same state;
//! - once, building the model's token environment (the trie over its vocabulary), and
//!   each grammar's creation.
//!
//! The model: `-m FILE` (a GGUF or HF directory with a tokenizer), or `--vocab FILE`: a
//! GGUF holding a tokenizer (e.g. llama.cpp's `models/ggml-vocab-*.gguf`) whose
//! `tokenizer.*` keys are put into a tiny random llama (hidden 64, 2 layers) of that
//! vocabulary size, so the mask is timed on a real vocabulary with a cheap forward pass.

use crate::args::Args;
use crate::run::{fail, mean_sd};
use llmrt::format::gguf::{Gguf, Value};
use llmrt::format::gguf_write::GgufWriter;
use llmrt::grammar::{Grammar, Kind};
use llmrt::quant::DType;
use llmrt::runtime::{LoadOptions, Model};
use llmrt::sample::SamplerParams;
use llmrt::util::XorShift;
use std::path::Path;
use std::time::Instant;

/// The benchmark's JSON schema: strings, integers, an enum, arrays, a nested object;
/// compact JSON so a completion ends.
const SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "color": {"enum": ["red", "green", "blue", "light gray"]},
    "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 6},
    "pos": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -999, "maximum": 999},
                                             "y": {"type": "number", "minimum": 0, "maximum": 1}},
            "required": ["x", "y"], "additionalProperties": false}
  },
  "required": ["name", "age", "color", "flags", "pos"],
  "additionalProperties": false,
  "x-guidance": {"whitespace_flexible": false}
}"#;
const REGEX: &str = r"[A-Z][a-z]{2,12}( [A-Z][a-z]{2,12}){0,3}, (19|20)[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]\.";
const LARK: &str = r#"
start: sentence ("; " sentence){0,3} "."
sentence: subject " " verb " " object
subject: "the " noun | NAME
object: "the " noun | NUMBER " " noun "s"
noun: "cat" | "dog" | "model" | "token" | "grammar"
verb: "sees" | "likes" | "parses" | "emits"
NAME: /[A-Z][a-z]{1,9}/
NUMBER: /[1-9][0-9]{0,2}/
"#;

/// A tiny random llama with the tokenizer of the GGUF at `vocab` (F32, hidden 64).
fn tiny_with_vocab(vocab: &str) -> Vec<u8> {
    let src = Gguf::open(Path::new(vocab)).unwrap_or_else(|e| fail(vocab, e));
    let n = match src.get("tokenizer.ggml.tokens") {
        Some(llmrt::format::gguf::ValueRef::Array(a)) => a.len(),
        _ => {
            eprintln!("llmrt-bench: {vocab}: no tokenizer.ggml.tokens");
            std::process::exit(1)
        }
    };
    let (h, layers, heads, ffn) = (64usize, 2usize, 4usize, 128usize);
    let mut g = GgufWriter::new();
    g.kv("general.architecture", Value::Str("llama".into()));
    g.kv("general.name", Value::Str(format!("tiny llama with the vocabulary of {vocab}")));
    g.kv("llama.context_length", Value::U32(4096));
    g.kv("llama.embedding_length", Value::U32(h as u32));
    g.kv("llama.block_count", Value::U32(layers as u32));
    g.kv("llama.feed_forward_length", Value::U32(ffn as u32));
    g.kv("llama.rope.dimension_count", Value::U32((h / heads) as u32));
    g.kv("llama.attention.head_count", Value::U32(heads as u32));
    g.kv("llama.attention.head_count_kv", Value::U32(heads as u32));
    g.kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    g.kv("llama.rope.freq_base", Value::F32(10000.0));
    g.kv("llama.vocab_size", Value::U32(n as u32));
    for (k, v) in src.metadata() {
        if k.starts_with("tokenizer.") {
            g.kv(&k, v);
        }
    }
    let mut rng = XorShift::new(7);
    let mut mat = |cols: usize, rows: usize| -> Vec<u8> {
        let s = 1.0 / (cols as f32).sqrt();
        (0..cols * rows).flat_map(|_| (rng.normal() * s).to_le_bytes()).collect()
    };
    let ones = |k: usize| -> Vec<u8> { (0..k).flat_map(|_| 1f32.to_le_bytes()).collect() };
    g.tensor("token_embd.weight", &[h as u64, n as u64], DType::F32, mat(h, n));
    for l in 0..layers {
        g.tensor(&format!("blk.{l}.attn_norm.weight"), &[h as u64], DType::F32, ones(h));
        for w in ["attn_q", "attn_k", "attn_v", "attn_output"] {
            g.tensor(&format!("blk.{l}.{w}.weight"), &[h as u64, h as u64], DType::F32, mat(h, h));
        }
        g.tensor(&format!("blk.{l}.ffn_norm.weight"), &[h as u64], DType::F32, ones(h));
        g.tensor(&format!("blk.{l}.ffn_gate.weight"), &[h as u64, ffn as u64], DType::F32, mat(h, ffn));
        g.tensor(&format!("blk.{l}.ffn_up.weight"), &[h as u64, ffn as u64], DType::F32, mat(h, ffn));
        g.tensor(&format!("blk.{l}.ffn_down.weight"), &[ffn as u64, h as u64], DType::F32, mat(ffn, h));
    }
    g.tensor("output_norm.weight", &[h as u64], DType::F32, ones(h));
    g.tensor("output.weight", &[h as u64, n as u64], DType::F32, mat(h, n));
    g.to_bytes()
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub(crate) fn bench(a: &Args, which: &str) {
    let (kind, src) = match which {
        "json" => (Kind::JsonSchema, SCHEMA),
        "regex" => (Kind::Regex, REGEX),
        "lark" => (Kind::Lark, LARK),
        _ => crate::args::usage(),
    };
    let opts = LoadOptions { backend: a.backend, threads: a.threads[0] as u32, ..Default::default() };
    let (m, name) = match (&a.vocab, a.models.first()) {
        (Some(v), _) => {
            let m = Model::load_gguf_bytes(tiny_with_vocab(v), v, opts).unwrap_or_else(|e| fail(v, e));
            (m, format!("tiny llama + vocabulary of {v}"))
        }
        (None, Some(spec)) => (Model::load(Path::new(spec), opts).unwrap_or_else(|e| fail(spec, e)), spec.clone()),
        (None, None) => crate::args::usage(),
    };
    let vocab = m.info().vocab_size;
    let t0 = Instant::now();
    m.grammar_factory().unwrap_or_else(|e| fail("grammar token environment", e));
    let env_ms = t0.elapsed().as_secs_f64() * 1e3;
    let prompt = m.tokenize(b"The record as JSON:", true).unwrap_or_else(|e| fail("tokenize", e));
    let max = a.gen.first().copied().unwrap_or(128).max(1);
    let (mut masks, mut steps, mut free, mut creates) = (vec![], vec![], vec![], vec![]);
    let (mut tokens, mut finished) = (0usize, 0usize);
    let mut rng = XorShift::new(99);
    for r in 0..a.reps.max(1) {
        let t = Instant::now();
        let mut g = Grammar::new(&m, kind, src).unwrap_or_else(|e| fail("grammar", e));
        creates.push(t.elapsed().as_secs_f64() * 1e3);
        let c = m.cache_reserve(0).unwrap_or_else(|e| fail("reserve", e));
        let d = m.cache_reserve(0).unwrap_or_else(|e| fail("reserve", e));
        let head = &prompt[..prompt.len() - 1];
        m.prefill(c, head, None, false).unwrap_or_else(|e| fail("prefill", e));
        m.prefill(d, head, None, false).unwrap_or_else(|e| fail("prefill", e));
        let p = SamplerParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: rng.next_u64() ^ r as u64,
            ..Default::default()
        };
        let (mut tok, mut ftok) = (*prompt.last().unwrap(), *prompt.last().unwrap());
        for _ in 0..max {
            // The mask of this state (computed here, kept for the step).
            let t = Instant::now();
            g.allowed().unwrap_or_else(|e| fail("mask", e));
            let us = t.elapsed().as_secs_f64() * 1e6;
            if g.is_done().unwrap_or_else(|e| fail("grammar", e)) {
                finished += 1;
                break;
            }
            masks.push(us);
            let mut next = [0u32];
            let t = Instant::now();
            m.decode_sample_constrained(&[c], &[tok], std::slice::from_ref(&p), &mut [Some(&mut g)], &mut next)
                .unwrap_or_else(|e| fail("constrained step", e));
            steps.push(t.elapsed().as_secs_f64() * 1e6);
            tok = next[0];
            let t = Instant::now();
            m.decode_sample(&[d], &[ftok], &p, &mut next).unwrap_or_else(|e| fail("step", e));
            free.push(t.elapsed().as_secs_f64() * 1e6);
            ftok = next[0];
            tokens += 1;
        }
        let _ = m.cache_release(c);
        let _ = m.cache_release(d);
    }
    let mut sorted = masks.clone();
    sorted.sort_by(f64::total_cmp);
    let (mm, msd) = mean_sd(&masks);
    let (sm, _) = mean_sd(&steps);
    let (fm, _) = mean_sd(&free);
    println!(
        "grammar {which} on {name} (vocabulary {vocab}, {} thread(s), {} backend)",
        a.threads[0],
        m.info().device_name
    );
    println!(
        "  token environment (trie over the vocabulary): {env_ms:.1} ms once per model; grammar creation {:.2} ms mean",
        mean_sd(&creates).0
    );
    println!(
        "  mask per token: {mm:.1} ± {msd:.1} us mean, p50 {:.1} us, p99 {:.1} us, max {:.1} us over {tokens} tokens \
         ({} completions, {finished} finished within {max} tokens)",
        pct(&sorted, 0.5),
        pct(&sorted, 0.99),
        sorted.last().copied().unwrap_or(0.0),
        a.reps.max(1)
    );
    println!(
        "  step: constrained {sm:.1} us (decode + masked sampling + advance) vs unconstrained decode_sample {fm:.1} us"
    );
}
