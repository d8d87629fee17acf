//! Tokenizers against the reference libraries: tests/fixtures/tokenizer/vectors.json holds the
//! ids sentencepiece / HF tokenizers give (tools/make_tokenizer_vectors.py, llama.cpp semantics
//! where they differ: see its header). Llama 2's model is read from ../shared when present.

use std::path::{Path, PathBuf};

use llmrt::format::gguf::{Gguf, Value};
use llmrt::format::gguf_write::GgufWriter;
use llmrt::tokenizer::Tokenizer;
use llmrt::Status;
use serde_json::Value as J;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn vectors() -> J {
    let p = root().join("tests/fixtures/tokenizer/vectors.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn entry<'a>(v: &'a J, name: &str) -> &'a J {
    v["tokenizers"].as_array().unwrap().iter().find(|t| t["name"] == name).unwrap()
}

fn gguf_tok(rel: &str) -> Tokenizer {
    let g = Gguf::open(&root().join(rel)).unwrap();
    Tokenizer::from_gguf(&g).unwrap().expect("file has a tokenizer")
}

fn hf_tok(json: &str, cfg: Option<&str>) -> Tokenizer {
    let d = root().join("tests/fixtures/tokenizer");
    let j = std::fs::read(d.join(json)).unwrap();
    let c = cfg.map(|c| std::fs::read(d.join(c)).unwrap());
    Tokenizer::from_hf_json(&j, c.as_deref(), json).unwrap()
}

fn ids_of(c: &J) -> Vec<u32> {
    c["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Every case: identical ids (with and without BOS), decode gives the text back (strings that
/// contain a special token's text excepted: control tokens decode to nothing), and decode agrees
/// with the reference library's own decode of the same ids.
///
/// HF's Metaspace (prepend_scheme "first") adds no "▁" to a text that starts with a space but
/// its decoder still strips one: for that tokenizer `leading_space_lost` skips the roundtrip of
/// texts starting with a space (decode still equals HF's decode).
fn check(name: &str, tk: &Tokenizer, e: &J, specials: &[&str]) {
    check_x(name, tk, e, specials, false)
}

fn check_x(name: &str, tk: &Tokenizer, e: &J, specials: &[&str], leading_space_lost: bool) {
    assert_eq!(tk.vocab_size() as u64, e["vocab_size"].as_u64().unwrap(), "{name}: vocab size");
    let mut mismatches = vec![];
    for c in e["cases"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        let want = ids_of(c);
        let got = tk.encode(text.as_bytes(), false).unwrap();
        if got != want {
            mismatches.push(format!("{text:?}: got {got:?}, want {want:?}"));
            continue;
        }
        let with_bos = tk.encode(text.as_bytes(), true).unwrap();
        let mut w = want.clone();
        if let Some(b) = tk.bos() {
            w.insert(0, b);
        }
        assert_eq!(with_bos, w, "{name}: {text:?} with BOS");
        let dec = tk.decode(&got).unwrap();
        let skip = specials.iter().any(|s| text.contains(s)) || (leading_space_lost && text.starts_with(' '));
        if !skip {
            assert_eq!(String::from_utf8_lossy(&dec), text, "{name}: roundtrip of {text:?}");
            assert_eq!(tk.decode(&with_bos).unwrap(), dec, "{name}: roundtrip with BOS of {text:?}");
            // streaming: the pieces concatenate to the text (plus the dummy-prefix space)
            let mut s = vec![];
            for &id in &got {
                s.extend(tk.token_piece(id).unwrap());
            }
            assert!(s.ends_with(text.as_bytes()) && s.len() <= text.len() + 1, "{name}: pieces of {text:?}");
        }
        for key in ["decoded_sentencepiece", "decoded_hf"] {
            if let Some(r) = c.get(key).and_then(J::as_str) {
                assert_eq!(String::from_utf8_lossy(&dec), r, "{name}: decode of {text:?} vs {key}");
            }
        }
    }
    assert!(mismatches.is_empty(), "{name}: {} mismatches:\n{}", mismatches.len(), mismatches.join("\n"));
    println!("{name}: {} strings identical", e["cases"].as_array().unwrap().len());
}

#[test]
fn spm_gguf_matches_sentencepiece() {
    let v = vectors();
    let tk = gguf_tok("tests/fixtures/llama_gqa/llama_gqa.f32.gguf");
    assert_eq!((tk.bos(), tk.eos()), (Some(1), Some(2)));
    assert!(tk.add_bos_default());
    check("llama_gqa", &tk, entry(&v, "llama_gqa"), &["<s>", "</s>", "<unk>"]);
}

#[test]
fn spm_tokenizer_json_matches_hf() {
    let v = vectors();
    let tk = hf_tok("llama_gqa.tokenizer.json", Some("llama_gqa.tokenizer_config.json"));
    assert_eq!((tk.bos(), tk.eos()), (Some(1), Some(2)));
    check_x("llama_gqa_hf", &tk, entry(&v, "llama_gqa_hf"), &["<s>", "</s>", "<unk>"], true);
}

#[test]
fn qwen2_gguf_matches_hf() {
    let v = vectors();
    let tk = gguf_tok("tests/fixtures/qwen2/qwen2.f32.gguf");
    assert_eq!((tk.bos(), tk.eos()), (Some(0), Some(0)));
    assert!(!tk.add_bos_default());
    check("qwen2", &tk, entry(&v, "qwen2"), &["<|endoftext|>"]);
    // the other byte-level fixture shares nothing but must load
    let q3 = gguf_tok("tests/fixtures/qwen3/qwen3.f32.gguf");
    assert_eq!(q3.vocab_size(), 320);
}

#[test]
fn llama3_bpe_gguf_and_json_match_hf() {
    let v = vectors();
    let e = entry(&v, "llama3_bpe");
    let sp = ["<|begin_of_text|>", "<|end_of_text|>"];
    let g = gguf_tok("tests/fixtures/tokenizer/llama3_bpe.gguf");
    assert!(g.add_bos_default());
    check("llama3_bpe (gguf)", &g, e, &sp);
    let j = hf_tok("llama3_bpe.tokenizer.json", Some("llama3_bpe.tokenizer_config.json"));
    assert_eq!((j.bos(), j.eos()), (g.bos(), g.eos()));
    check("llama3_bpe (tokenizer.json)", &j, e, &sp);
}

#[test]
fn llama2_sentencepiece_model() {
    let p = root().join("../shared/models/llama2-tokenizer.model");
    if !p.is_file() {
        println!("skipped: ../shared/models/llama2-tokenizer.model not present");
        return;
    }
    let v = vectors();
    let tk = Tokenizer::from_sentencepiece_model(&std::fs::read(&p).unwrap(), "llama2-tokenizer.model").unwrap();
    assert_eq!((tk.vocab_size(), tk.bos(), tk.eos()), (32000, Some(1), Some(2)));
    check("llama2", &tk, entry(&v, "llama2"), &["<s>", "</s>", "<unk>"]);
}

#[test]
fn all_fixture_ggufs_have_tokenizers() {
    for m in ["llama_gqa", "llama_mha_tied", "llama3_rope", "mistral", "qwen2", "qwen3"] {
        let tk = gguf_tok(&format!("tests/fixtures/{m}/{m}.f32.gguf"));
        let ids = tk.encode(b"The quick cat runs.", true).unwrap();
        assert_eq!(tk.decode(&ids).unwrap(), b"The quick cat runs.", "{m}");
    }
}

#[test]
fn invalid_utf8_and_ids() {
    let tk = gguf_tok("tests/fixtures/qwen2/qwen2.f32.gguf");
    let e = tk.encode(b"ok \xff\xfe", false).unwrap_err();
    assert_eq!(e.status, Status::LLMRT_INVALID_ARGUMENT);
    assert!(e.message.contains("offset 3"), "{}", e.message);
    let e = tk.encode(b"caf\xc3", false).unwrap_err();
    assert!(e.message.contains("offset 3"), "{}", e.message);
    let e = tk.decode(&[1, 2, 384]).unwrap_err();
    assert_eq!(e.status, Status::LLMRT_INVALID_ARGUMENT);
    assert!(e.message.contains("384") && e.message.contains("index 2"), "{}", e.message);
    assert_eq!(tk.token_piece(u32::MAX).unwrap_err().status, Status::LLMRT_INVALID_ARGUMENT);
    assert!(tk.encode(b"", true).unwrap() == vec![0] && tk.encode(b"", false).unwrap().is_empty());
}

#[test]
fn byte_fallback_pieces_are_partial_utf8() {
    let tk = gguf_tok("tests/fixtures/llama_gqa/llama_gqa.f32.gguf");
    let ids = tk.encode("€".as_bytes(), false).unwrap();
    // "▁" is a piece, "€" is not: three byte tokens
    let pieces: Vec<Vec<u8>> = ids.iter().map(|&i| tk.decode(&[i]).unwrap()).collect();
    assert!(pieces.iter().any(|p| std::str::from_utf8(p).is_err()), "{pieces:?}");
    assert_eq!(tk.decode(&ids).unwrap(), "€".as_bytes());
}

/// A tokenizer-only GGUF made of the given metadata.
fn gguf_with(kvs: Vec<(&str, Value)>) -> Gguf {
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::Str("llama".into()));
    for (k, v) in kvs {
        w.kv(k, v);
    }
    Gguf::from_bytes(w.to_bytes(), "corrupt.gguf").unwrap()
}

fn strs(v: &[&str]) -> Value {
    Value::Array(v.iter().map(|s| Value::Str(s.to_string())).collect())
}

#[test]
fn corrupt_tokenizers_are_errors() {
    let toks = strs(&["a", "b", "ab"]);
    type Case<'a> = (Vec<(&'a str, Value)>, Status, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec![
                ("tokenizer.ggml.model", Value::Str("gpt2".into())),
                ("tokenizer.ggml.tokens", toks.clone()),
                ("tokenizer.ggml.merges", strs(&["a c"])),
            ],
            Status::LLMRT_BAD_MODEL,
            "\"c\"",
        ),
        (
            vec![
                ("tokenizer.ggml.model", Value::Str("gpt2".into())),
                ("tokenizer.ggml.tokens", toks.clone()),
                ("tokenizer.ggml.merges", strs(&["ab"])),
            ],
            Status::LLMRT_BAD_MODEL,
            "merges[0]",
        ),
        (
            vec![("tokenizer.ggml.model", Value::Str("gpt2".into())), ("tokenizer.ggml.tokens", toks.clone())],
            Status::LLMRT_BAD_MODEL,
            "merges missing",
        ),
        (
            vec![
                ("tokenizer.ggml.model", Value::Str("llama".into())),
                ("tokenizer.ggml.tokens", toks.clone()),
                ("tokenizer.ggml.scores", Value::Array(vec![Value::F32(0.0)])),
            ],
            Status::LLMRT_BAD_MODEL,
            "1 scores",
        ),
        (
            vec![
                ("tokenizer.ggml.model", Value::Str("llama".into())),
                ("tokenizer.ggml.tokens", toks.clone()),
                ("tokenizer.ggml.token_type", Value::Array(vec![Value::I32(1), Value::I32(9), Value::I32(1)])),
            ],
            Status::LLMRT_BAD_MODEL,
            "token_type[1]",
        ),
        (
            vec![
                ("tokenizer.ggml.model", Value::Str("llama".into())),
                ("tokenizer.ggml.tokens", toks.clone()),
                ("tokenizer.ggml.bos_token_id", Value::U32(7)),
            ],
            Status::LLMRT_BAD_MODEL,
            "bos token id 7",
        ),
        (
            vec![("tokenizer.ggml.model", Value::Str("llama".into())), ("tokenizer.ggml.tokens", Value::Array(vec![]))],
            Status::LLMRT_BAD_MODEL,
            "no tokens",
        ),
        (
            vec![("tokenizer.ggml.model", Value::Str("llama".into())), ("tokenizer.ggml.tokens", Value::U32(3))],
            Status::LLMRT_BAD_MODEL,
            "tokenizer.ggml.tokens",
        ),
        (
            vec![
                ("tokenizer.ggml.model", Value::Str("llama".into())),
                ("tokenizer.ggml.tokens", Value::Array(vec![Value::U8(1), Value::U8(2)])),
            ],
            Status::LLMRT_BAD_MODEL,
            "tokens[0]",
        ),
        (vec![("tokenizer.ggml.model", Value::Str("llama".into()))], Status::LLMRT_BAD_MODEL, "tokens missing"),
        (
            vec![
                ("tokenizer.ggml.model", Value::Str("gpt2".into())),
                ("tokenizer.ggml.pre", Value::Str("kimi-k2".into())),
                ("tokenizer.ggml.tokens", toks.clone()),
                ("tokenizer.ggml.merges", strs(&["a b"])),
            ],
            Status::LLMRT_UNSUPPORTED,
            "kimi-k2",
        ),
        (
            vec![("tokenizer.ggml.model", Value::Str("bert".into())), ("tokenizer.ggml.tokens", toks.clone())],
            Status::LLMRT_UNSUPPORTED,
            "bert",
        ),
    ];
    for (kvs, status, needle) in cases {
        let g = gguf_with(kvs);
        let e = Tokenizer::from_gguf(&g).unwrap_err();
        assert_eq!(e.status, status, "{e}");
        assert!(e.message.contains(needle), "{needle:?} not in {e}");
    }
    assert!(Tokenizer::from_gguf(&gguf_with(vec![])).unwrap().is_none());
    // a valid tiny one works
    let g = gguf_with(vec![
        ("tokenizer.ggml.model", Value::Str("gpt2".into())),
        ("tokenizer.ggml.tokens", toks),
        ("tokenizer.ggml.merges", strs(&["a b"])),
    ]);
    let tk = Tokenizer::from_gguf(&g).unwrap().unwrap();
    assert_eq!(tk.encode(b"abba", false).unwrap(), vec![2, 1, 0]);
}

#[test]
fn corrupt_tokenizer_json_and_models_are_errors() {
    let bad: &[(&str, Status)] = &[
        ("not json", Status::LLMRT_BAD_MODEL),
        (r#"{"model":{"type":"Unigram","vocab":[]}}"#, Status::LLMRT_UNSUPPORTED),
        (
            r#"{"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a c"]},"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false}}"#,
            Status::LLMRT_BAD_MODEL,
        ),
        (
            r#"{"model":{"type":"BPE","vocab":{"a":0,"b":5},"merges":[]},"pre_tokenizer":{"type":"ByteLevel"}}"#,
            Status::LLMRT_BAD_MODEL,
        ),
        (
            r#"{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"Split","pattern":{"Regex":"x"}}}"#,
            Status::LLMRT_UNSUPPORTED,
        ),
        (
            r#"{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\w+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","use_regex":false}]}}"#,
            Status::LLMRT_UNSUPPORTED,
        ),
        (
            r#"{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"normalizer":{"type":"Replace","pattern":{"Regex":"a+"},"content":"b"},"pre_tokenizer":{"type":"ByteLevel"}}"#,
            Status::LLMRT_UNSUPPORTED,
        ),
        (
            r#"{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"normalizer":{"type":"Precompiled","precompiled_charsmap":""},"pre_tokenizer":{"type":"ByteLevel"}}"#,
            Status::LLMRT_UNSUPPORTED,
        ),
        (
            r#"{"model":{"type":"BPE","vocab":{"a":0},"merges":[],"continuing_subword_prefix":"@@"},"pre_tokenizer":{"type":"ByteLevel"}}"#,
            Status::LLMRT_UNSUPPORTED,
        ),
        (
            r#"{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[{"id":0,"content":"b","special":true}],"pre_tokenizer":{"type":"ByteLevel"}}"#,
            Status::LLMRT_BAD_MODEL,
        ),
    ];
    for (j, status) in bad {
        let e = Tokenizer::from_hf_json(j.as_bytes(), None, "t.json").unwrap_err();
        assert_eq!(e.status, *status, "{j}: {e}");
        assert!(e.message.starts_with("t.json"), "{e}");
    }
    // truncated / garbage sentencepiece models
    let p = root().join("../shared/models/llama2-tokenizer.model");
    let model = std::fs::read(&p).unwrap_or_else(|_| b"\x0a\x05\x0a\x01a\x18\x01\x12\x02\x18\x02".to_vec());
    for cut in [1usize, 7, 100, model.len() / 2] {
        if cut < model.len() {
            let _ = Tokenizer::from_sentencepiece_model(&model[..cut], "cut.model");
            // error or Ok: no panic
        }
    }
    let e = Tokenizer::from_sentencepiece_model(b"\x0a\xff\xff\xff\xff\x0f", "x.model").unwrap_err();
    assert_eq!(e.status, Status::LLMRT_BAD_MODEL);
    let e = Tokenizer::from_sentencepiece_model(b"\x0a\x05\x0a\x01a\x18\x01", "u.model").unwrap_err();
    assert_eq!(e.status, Status::LLMRT_UNSUPPORTED, "{e}"); // no model_type: unigram
                                                            // random mutations of a real GGUF tokenizer never panic
    let bytes = std::fs::read(root().join("tests/fixtures/tokenizer/llama3_bpe.gguf")).unwrap();
    let mut x = 0x9E3779B97F4A7C15u64;
    for _ in 0..300 {
        let mut b = bytes.clone();
        for _ in 0..4 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x % b.len() as u64) as usize;
            b[i] = (x >> 32) as u8;
        }
        if let Ok(g) = Gguf::from_bytes(b, "m.gguf") {
            if let Ok(Some(tk)) = Tokenizer::from_gguf(&g) {
                let ids = tk.encode("Hello wörld 123 <|end_of_text|>".as_bytes(), true).unwrap();
                tk.decode(&ids).unwrap();
            }
        }
    }
}

#[allow(dead_code)]
fn _unused(_: &Path) {}
