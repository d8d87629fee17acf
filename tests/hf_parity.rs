//! Hugging Face model directories (config.json + safetensors, single or sharded)
//! loaded through the C entry points, against the same transformers references as
//! the GGUF files (tests/fixtures/<name>/hf, made by tools/make_fixtures.py), and
//! the load errors a broken directory gives.
mod common;
use common::*;
use llmrt::Status;
use std::path::{Path, PathBuf};

fn fixtures_present() -> Vec<Fixture> {
    let all: Vec<Fixture> = Fixture::all().into_iter().filter(|f| f.dir.join("hf/config.json").exists()).collect();
    assert!(all.len() >= 11, "expected 11 fixtures with an hf/ directory, found {}", all.len());
    all
}

fn hf_dir(f: &Fixture) -> PathBuf {
    f.dir.join("hf")
}

fn hf_dtype(f: &Fixture) -> String {
    f.json["hf"]["dtype"].as_str().unwrap().to_string()
}

fn prefill_all(path: &Path, tokens: &[u32], vocab: usize) -> Vec<f32> {
    let m = load(path);
    assert_eq!(m.vocab, vocab, "{}", path.display());
    let c = m.reserve(0);
    let got = m.prefill_all(c, tokens);
    assert!(got.iter().all(|v| v.is_finite()), "{}: non-finite logits", path.display());
    got
}

fn worst_row(got: &[f32], want: &[f32], vocab: usize) -> f64 {
    assert_eq!(got.len(), want.len());
    got.chunks_exact(vocab).zip(want.chunks_exact(vocab)).map(|(g, w)| rel_l2(g, w)).fold(0.0, f64::max)
}

fn check(f: &Fixture, got: &[f32], want: &[f32], what: &str, bound: f64) {
    let e = worst_row(got, want, f.vocab);
    println!("{:<16} hf/{:<9} vs {what}: worst row relative L2 {e:.3e} (bound {bound:.0e})", f.name, hf_dtype(f));
    assert!(e < bound, "{} hf/ ({}) vs {what}: worst row relative L2 {e:.3e} >= {bound:.0e}", f.name, hf_dtype(f));
}

#[test]
fn hf_logits_match_transformers() {
    let (mut f32_dirs, mut rounded, mut sharded) = (0, 0, 0);
    for f in fixtures_present() {
        let got = prefill_all(&hf_dir(&f), &f.tokens, f.vocab);
        if f.json["hf"]["shards"].as_u64() == Some(2) {
            assert!(hf_dir(&f).join("model.safetensors.index.json").exists());
            sharded += 1;
        }
        if hf_dtype(&f) == "float32" {
            check(&f, &got, &f.logits, "transformers", 1e-4);
            f32_dirs += 1;
        } else {
            check(&f, &got, &f.logits, "transformers", 1e-2);
            let file = f.json["hf"]["rounded_logits_file"].as_str().expect("rounded_logits_file");
            let reference = read_f32(&f.dir.join(file));
            check(&f, &got, &reference, "float64 over the rounded weights", 1e-4);
            rounded += 1;
        }
    }
    assert_eq!((f32_dirs, rounded, sharded), (3, 9, 1), "(f32, rounded, sharded) hf/ directories");
}

#[test]
fn hf_f32_greedy_ids_match_transformers() {
    let mut n = 0;
    for f in fixtures_present().into_iter().filter(|f| hf_dtype(f) == "float32") {
        let m = load(&hf_dir(&f));
        let c = m.reserve(0);
        let want = f.greedy_ids();
        let mut got = vec![argmax(&m.prefill(c, &f.greedy_prompt()))];
        while got.len() < want.len() {
            got.push(m.decode_greedy(&[c], &[*got.last().unwrap()])[0]);
        }
        assert_eq!(got, want, "{}: hf/ greedy ids differ from transformers", f.name);
        n += 1;
    }
    assert_eq!(n, 3);
}

/// The same model from its HF directory (unpermuted Q/K, neox RoPE, llama3
/// divisors computed from config.json) and from llama.cpp's F32 GGUF (permuted
/// Q/K, adjacent RoPE, `rope_freqs.weight`).
#[test]
fn hf_f32_equals_gguf_f32() {
    let mut n = 0;
    for f in fixtures_present().into_iter().filter(|f| hf_dtype(f) == "float32") {
        let a = prefill_all(&hf_dir(&f), &f.tokens, f.vocab);
        let b = prefill_all(&f.gguf("f32"), &f.tokens, f.vocab);
        let e = worst_row(&a, &b, f.vocab);
        println!("{:<16} hf/ vs f32 GGUF: worst row relative L2 {e:.3e}", f.name);
        assert!(e < 1e-5, "{}: hf/ and the F32 GGUF differ by {e:.3e}", f.name);
        let (ma, mb) = (load(&hf_dir(&f)).info(), load(&f.gguf("f32")).info());
        assert_eq!(
            (ma.n_layers, ma.n_heads, ma.n_kv_heads, ma.head_dim, ma.hidden_size, ma.context_length),
            (mb.n_layers, mb.n_heads, mb.n_kv_heads, mb.head_dim, mb.hidden_size, mb.context_length)
        );
        n += 1;
    }
    assert_eq!(n, 3);
}

/// A scratch copy of a fixture's hf/ directory.
struct Scratch(PathBuf);

impl Scratch {
    fn copy_of(f: &Fixture, tag: &str) -> Scratch {
        let dst = std::env::temp_dir().join(format!("llmrt-hf-{}-{}-{tag}", std::process::id(), f.name));
        let _ = std::fs::remove_dir_all(&dst);
        std::fs::create_dir_all(&dst).unwrap();
        for e in std::fs::read_dir(hf_dir(f)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
        Scratch(dst)
    }
    fn config(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.0.join("config.json")).unwrap()).unwrap()
    }
    fn set_config(&self, v: &serde_json::Value) {
        std::fs::write(self.0.join("config.json"), serde_json::to_vec_pretty(v).unwrap()).unwrap();
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn fixture(name: &str) -> Fixture {
    Fixture::named(name)
}

fn load_err(path: &Path) -> (Status, String) {
    match try_load(path, 1, 0) {
        Ok(_) => panic!("{}: loaded, expected an error", path.display()),
        Err(e) => e,
    }
}

/// Llama-3 scaling is taken from config.json in either spelling (transformers 5
/// `rope_parameters` or Hub-style `rope_theta` / `rope_scaling`), and matters.
#[test]
fn llama3_rope_scaling_from_config() {
    let f = fixture("llama3_rope");
    assert_eq!(hf_dtype(&f), "float32");
    // The divisors computed from config.json equal the converter's rope_freqs.weight.
    let hc = llmrt::model::hf::load_config(&hf_dir(&f)).unwrap();
    let g = llmrt::format::gguf::Gguf::open(&f.gguf("f32")).unwrap();
    let t = g.tensor("rope_freqs.weight").expect("rope_freqs.weight in the GGUF");
    let want: Vec<f32> = g.tensor_data(t).chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(hc.rope_freqs.as_deref(), Some(&want[..]), "llama3 divisors differ from llama.cpp's converter");
    assert!(want.iter().any(|&d| d != 1.0));

    let base = prefill_all(&hf_dir(&f), &f.tokens, f.vocab);
    check(&f, &base, &f.logits, "transformers", 1e-4);

    let s = Scratch::copy_of(&f, "hub");
    let mut c = s.config();
    let obj = c.as_object_mut().unwrap();
    assert_eq!(obj["rope_scaling"]["rope_type"], "llama3");
    obj.remove("rope_parameters");
    s.set_config(&c);
    let hub = prefill_all(&s.0, &f.tokens, f.vocab);
    assert_eq!(hub, base, "Hub-style rope_scaling gives other logits than rope_parameters");

    let s = Scratch::copy_of(&f, "t5");
    let mut c = s.config();
    let obj = c.as_object_mut().unwrap();
    obj.remove("rope_scaling");
    obj.remove("rope_theta");
    s.set_config(&c);
    assert_eq!(prefill_all(&s.0, &f.tokens, f.vocab), base, "rope_parameters alone gives other logits");

    let s = Scratch::copy_of(&f, "off");
    let mut c = s.config();
    let obj = c.as_object_mut().unwrap();
    obj.remove("rope_scaling");
    obj.insert("rope_parameters".into(), serde_json::json!({"rope_type": "default", "rope_theta": 10000.0}));
    s.set_config(&c);
    let off = prefill_all(&s.0, &f.tokens, f.vocab);
    let e = worst_row(&off, &f.logits, f.vocab);
    assert!(e > 1e-2, "dropping llama3 scaling changed the logits by only {e:.3e}");
}

#[test]
fn missing_shard_is_io_naming_shard_and_tensor() {
    let f = fixture("mistral");
    let s = Scratch::copy_of(&f, "noshard");
    let shard = "model-00002-of-00002.safetensors";
    std::fs::remove_file(s.0.join(shard)).unwrap();
    let (st, msg) = load_err(&s.0);
    assert_eq!(st, Status::LLMRT_IO, "{msg}");
    assert!(msg.contains(shard) && msg.contains("for tensor "), "{msg}");
}

#[test]
fn truncated_shard_is_bad_model_with_offsets() {
    let f = fixture("mistral");
    let s = Scratch::copy_of(&f, "trunc");
    let p = s.0.join("model-00001-of-00002.safetensors");
    let len = std::fs::metadata(&p).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    file.set_len(len - 100).unwrap();
    drop(file);
    let (st, msg) = load_err(&s.0);
    assert_eq!(st, Status::LLMRT_BAD_MODEL, "{msg}");
    assert!(msg.contains("model-00001-of-00002.safetensors") && msg.contains("data_offsets"), "{msg}");
    assert!(msg.contains("outside"), "{msg}");
}

#[test]
fn shape_mismatch_names_tensor() {
    let f = fixture("llama_gqa");
    let s = Scratch::copy_of(&f, "shape");
    let mut c = s.config();
    c["num_key_value_heads"] = serde_json::json!(4);
    s.set_config(&c);
    let (st, msg) = load_err(&s.0);
    assert_eq!(st, Status::LLMRT_BAD_MODEL, "{msg}");
    assert!(msg.contains("model.layers.0.self_attn.k_proj.weight") && msg.contains("[32, 64]"), "{msg}");
}

#[test]
fn unknown_model_type_is_unsupported() {
    let f = fixture("qwen2");
    let s = Scratch::copy_of(&f, "mtype");
    let mut c = s.config();
    c["model_type"] = serde_json::json!("falcon");
    s.set_config(&c);
    let (st, msg) = load_err(&s.0);
    assert_eq!(st, Status::LLMRT_UNSUPPORTED, "{msg}");
    assert!(msg.contains("falcon") && msg.contains("model_type"), "{msg}");
}

#[test]
fn unsupported_rope_type_is_unsupported() {
    let f = fixture("qwen3");
    let s = Scratch::copy_of(&f, "yarn");
    let mut c = s.config();
    c["rope_parameters"] = serde_json::json!({"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0});
    s.set_config(&c);
    let (st, msg) = load_err(&s.0);
    assert_eq!(st, Status::LLMRT_UNSUPPORTED, "{msg}");
    assert!(msg.contains("yarn"), "{msg}");
}

#[test]
fn directory_without_config_is_io() {
    let f = fixture("llama_gqa");
    let s = Scratch::copy_of(&f, "nocfg");
    std::fs::remove_file(s.0.join("config.json")).unwrap();
    let (st, msg) = load_err(&s.0);
    assert_eq!(st, Status::LLMRT_IO, "{msg}");
    assert!(msg.contains("config.json"), "{msg}");
}

#[test]
fn directory_without_weights_is_io() {
    let f = fixture("llama_gqa");
    let s = Scratch::copy_of(&f, "noweights");
    std::fs::remove_file(s.0.join("model.safetensors")).unwrap();
    let (st, msg) = load_err(&s.0);
    assert_eq!(st, Status::LLMRT_IO, "{msg}");
    assert!(msg.contains("model.safetensors"), "{msg}");
}

#[test]
fn bad_json_is_bad_model_naming_file() {
    let f = fixture("llama_gqa");
    let s = Scratch::copy_of(&f, "badjson");
    std::fs::write(s.0.join("config.json"), b"{\"model_type\": \"llama\", ").unwrap();
    let (st, msg) = load_err(&s.0);
    assert_eq!(st, Status::LLMRT_BAD_MODEL, "{msg}");
    assert!(msg.contains("config.json") && msg.contains("JSON"), "{msg}");

    let f = fixture("mistral");
    let s = Scratch::copy_of(&f, "badindex");
    std::fs::write(s.0.join("model.safetensors.index.json"), b"{\"weight_map\": [").unwrap();
    let (st, msg) = load_err(&s.0);
    assert_eq!(st, Status::LLMRT_BAD_MODEL, "{msg}");
    assert!(msg.contains("model.safetensors.index.json"), "{msg}");
}

#[test]
fn missing_config_key_is_named() {
    let f = fixture("llama_gqa");
    let s = Scratch::copy_of(&f, "nokey");
    let mut c = s.config();
    c.as_object_mut().unwrap().remove("intermediate_size");
    s.set_config(&c);
    let (st, msg) = load_err(&s.0);
    assert_eq!(st, Status::LLMRT_BAD_MODEL, "{msg}");
    assert!(msg.contains("intermediate_size") && msg.contains("config.json"), "{msg}");
}

/// A tied model's HF directory has no lm_head.weight; an untied one without it is an error.
#[test]
fn tied_and_untied_lm_head() {
    let f = fixture("llama_mha_tied");
    assert_eq!(f.json["hf"]["tied"], true);
    let s = Scratch::copy_of(&f, "untie");
    let mut c = s.config();
    c["tie_word_embeddings"] = serde_json::json!(false);
    s.set_config(&c);
    let (st, msg) = load_err(&s.0);
    assert_eq!(st, Status::LLMRT_BAD_MODEL, "{msg}");
    assert!(msg.contains("lm_head.weight") && msg.contains("missing"), "{msg}");
}

#[test]
fn info_reports_hf_config() {
    let f = fixture("qwen3");
    let m = load(&hf_dir(&f));
    let i = m.info();
    let cfg = &f.json["hf_config"];
    assert_eq!(i.head_dim as u64, cfg["head_dim"].as_u64().unwrap());
    assert_eq!(i.n_kv_heads as u64, cfg["num_key_value_heads"].as_u64().unwrap());
    assert_eq!(i.context_length, 256);
    assert_eq!(i.vocab_size as usize, f.vocab);
}

#[test]
fn phi3_longrope_config_errors_are_named() {
    let f = fixture("phi3");
    for (tag, edit, want) in [
        (
            "short",
            serde_json::json!({"short_factor": [1.0, 2.0]}),
            "short_factor has 2 entries, expected 8 (half the 16 rotated dimensions)",
        ),
        ("neg", serde_json::json!({"long_factor": [1.0, 1.0, 1.0, -1.0, 1.0, 1.0, 1.0, 1.0]}), "long_factor[3] = -1.0"),
        // Partial rotary: the factors must cover the rotated pairs only (4 of 8 here).
        (
            "partial",
            serde_json::json!({"partial_rotary_factor": 0.5}),
            "long_factor has 8 entries, expected 4 (half the 8 rotated dimensions)",
        ),
        ("odd", serde_json::json!({"partial_rotary_factor": 0.1875}), "rotates 3 of head_dim 16 dimensions"),
        ("big", serde_json::json!({"partial_rotary_factor": 1.5}), "partial_rotary_factor 1.5 is not in (0, 1]"),
    ] {
        let s = Scratch::copy_of(&f, tag);
        let mut c = s.config();
        for (k, v) in edit.as_object().unwrap() {
            c["rope_parameters"][k] = v.clone();
        }
        s.set_config(&c);
        let (st, msg) = load_err(&s.0);
        let status = if tag == "odd" { Status::LLMRT_UNSUPPORTED } else { Status::LLMRT_BAD_MODEL };
        assert_eq!(st, status, "{tag}: {msg}");
        assert!(msg.contains(want) && msg.contains("config.json"), "{tag}: {msg}");
    }
    // The fused matrices are checked as one tensor, named.
    let s = Scratch::copy_of(&f, "fused");
    let mut c = s.config();
    c["intermediate_size"] = serde_json::json!(96);
    s.set_config(&c);
    let (st, msg) = load_err(&s.0);
    assert_eq!(st, Status::LLMRT_BAD_MODEL, "{msg}");
    assert!(msg.contains("gate_up_proj"), "{msg}");
}

/// gemma2's `query_pre_attn_scalar` (HF only: GGUF files have no key for it, see
/// model::gemma_gguf_attn_scale): the fixture's equals head_dim (as llama.cpp assumes);
/// 24 instead must give transformers' logits for 24 (logits.qpas24.f32, same weights).
#[test]
fn gemma2_query_pre_attn_scalar_from_config() {
    let f = fixture("gemma2");
    assert_eq!(hf_dtype(&f), "float32");
    let qc = &f.json["checks"]["qpas_check"];
    let reference = read_f32(&f.dir.join(qc["logits_file"].as_str().unwrap()));
    let s = Scratch::copy_of(&f, "qpas");
    let mut c = s.config();
    assert_eq!(c["query_pre_attn_scalar"], c["head_dim"]);
    c["query_pre_attn_scalar"] = qc["query_pre_attn_scalar"].clone();
    s.set_config(&c);
    let got = prefill_all(&s.0, &f.tokens, f.vocab);
    check(&f, &got, &reference, "transformers with query_pre_attn_scalar 24", 1e-4);
    assert!(worst_row(&got, &f.logits, f.vocab) > 1e-2);
}

/// gemma2's defaults as transformers fills them: without `layer_types` the even layers
/// slide, without `tie_word_embeddings` the embeddings are the LM head; the same logits.
#[test]
fn gemma2_defaults_when_keys_are_absent() {
    let f = fixture("gemma2");
    let base = prefill_all(&hf_dir(&f), &f.tokens, f.vocab);
    let s = Scratch::copy_of(&f, "defaults");
    let mut c = s.config();
    let obj = c.as_object_mut().unwrap();
    assert_eq!(obj["layer_types"][0], "sliding_attention");
    obj.remove("layer_types");
    obj.remove("tie_word_embeddings");
    s.set_config(&c);
    assert_eq!(prefill_all(&s.0, &f.tokens, f.vocab), base);
}

/// gemma3_text's RoPE and layer pattern in each spelling config.json may use:
/// transformers 5 (`rope_parameters` per layer type, `layer_types`) and the Hub's
/// older one (`rope_theta`, `rope_local_base_freq`, `sliding_window_pattern`) give the
/// same logits; swapping the two bases changes them.
#[test]
fn gemma3_rope_and_pattern_spellings() {
    let f = fixture("gemma3");
    let base = prefill_all(&hf_dir(&f), &f.tokens, f.vocab);
    let s = Scratch::copy_of(&f, "hub");
    let mut c = s.config();
    let obj = c.as_object_mut().unwrap();
    assert_eq!(obj["rope_local_base_freq"], 10000.0);
    obj.remove("rope_parameters");
    obj.remove("layer_types");
    obj.remove("_sliding_window_pattern");
    obj.insert("sliding_window_pattern".into(), serde_json::json!(6));
    s.set_config(&c);
    assert_eq!(prefill_all(&s.0, &f.tokens, f.vocab), base, "Hub-style keys give other logits");

    // The default pattern (no layer_types, no sliding_window_pattern) is 6 as well.
    let mut c = s.config();
    c.as_object_mut().unwrap().remove("sliding_window_pattern");
    s.set_config(&c);
    assert_eq!(prefill_all(&s.0, &f.tokens, f.vocab), base, "the default pattern is not 5 local : 1 global");

    let s = Scratch::copy_of(&f, "swap");
    let mut c = s.config();
    c["rope_parameters"]["sliding_attention"]["rope_theta"] = serde_json::json!(1000000.0);
    s.set_config(&c);
    let e = worst_row(&prefill_all(&s.0, &f.tokens, f.vocab), &base, f.vocab);
    assert!(e > 1e-2, "the local RoPE base changed the logits by only {e:.3e}");
}

/// Gemma's options that config.json can refuse: another activation, bidirectional
/// attention, an unknown layer type.
#[test]
fn gemma_unsupported_options_are_named() {
    let f = fixture("gemma2");
    for (key, value, what) in [
        ("hidden_activation", serde_json::json!("relu"), "hidden_activation"),
        ("use_bidirectional_attention", serde_json::json!(true), "use_bidirectional_attention"),
        (
            "layer_types",
            serde_json::json!(["sliding_attention", "chunked_attention", "full_attention"]),
            "layer_types[1]",
        ),
    ] {
        let s = Scratch::copy_of(&f, "unsup");
        let mut c = s.config();
        c[key] = value;
        s.set_config(&c);
        let (st, msg) = load_err(&s.0);
        assert_eq!(st, Status::LLMRT_UNSUPPORTED, "{msg}");
        assert!(msg.contains(what) && msg.contains("config.json"), "{msg}");
    }
}
