//! A model whose tokenizer llmrt cannot run still loads and runs on ids (logits bit-identical
//! to the same weights with their own tokenizer); the text calls then answer
//! `LLMRT_UNSUPPORTED` naming the tokenizer. A corrupt tokenizer still fails the load.
mod common;
use common::*;
use llmrt::ffi::*;
use llmrt::format::gguf::{Gguf, Value};
use llmrt::format::gguf_write::GgufWriter;
use llmrt::Status;
use std::path::PathBuf;

/// The llama_gqa fixture with its tokenizer.* keys replaced by `tok` (written to a temp file).
fn with_tokenizer(tag: &str, tok: &dyn Fn(&str, &Value) -> Option<Value>, extra: Vec<(&str, Value)>) -> PathBuf {
    let f = Fixture::all().into_iter().find(|f| f.name == "llama_gqa").unwrap();
    let g = Gguf::open(&f.gguf("f32")).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in &g.metadata() {
        if k == "general.alignment" {
            continue;
        }
        if k.starts_with("tokenizer.") {
            if let Some(v) = tok(k, v) {
                w.kv(k, v);
            }
        } else {
            w.kv(k, v.clone());
        }
    }
    for (k, v) in extra {
        w.kv(k, v);
    }
    for t in &g.tensors {
        w.tensor(&t.name, &t.ne, t.dtype.unwrap(), g.tensor_data(t).to_vec());
    }
    let p = std::env::temp_dir().join(format!("llmrt-tok-{tag}-{}.gguf", std::process::id()));
    w.write(&p).unwrap();
    p
}

fn tokenize_status(m: &M, text: &str) -> Status {
    let mut ids = [0u32; 16];
    let mut n = 0usize;
    // SAFETY: a live model; `ids` is a live local of the length passed.
    unsafe { llmrt_tokenize(m.ptr, text.as_ptr().cast(), text.len(), true, ids.as_mut_ptr(), ids.len(), &mut n) }
}

#[test]
fn unsupported_tokenizers_load_and_run_on_ids() {
    let f = Fixture::all().into_iter().find(|f| f.name == "llama_gqa").unwrap();
    let reference = load(&f.gguf("f32"));
    let prompt = f.greedy_prompt();
    let c = reference.reserve(0);
    let want = reference.prefill(c, &prompt);
    // (what, tokenizer.* rewrite, the name the error must carry)
    type Rewrite = Box<dyn Fn(&str, &Value) -> Option<Value>>;
    type Case<'a> = (&'a str, Rewrite, Vec<(&'a str, Value)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            "bert",
            Box::new(|k, v| Some(if k == "tokenizer.ggml.model" { Value::Str("bert".into()) } else { v.clone() })),
            vec![],
            "\"bert\"",
        ),
        (
            "pre",
            // a gpt2 tokenizer with a pre-tokenizer llmrt does not know
            Box::new(|k, v| match k {
                "tokenizer.ggml.model" => Some(Value::Str("gpt2".into())),
                "tokenizer.ggml.pre" => Some(Value::Str("kimi-k2".into())),
                _ => Some(v.clone()),
            }),
            vec![("tokenizer.ggml.merges", Value::Array(vec![]))],
            "\"kimi-k2\"",
        ),
    ];
    for (tag, rewrite, extra, needle) in cases {
        let p = with_tokenizer(tag, &*rewrite, extra);
        let m = match try_load(&p, 1, 0) {
            Ok(m) => m,
            Err((s, msg)) => panic!("{tag}: the model must load, got {s:?}: {msg}"),
        };
        let c = m.reserve(0);
        let got = m.prefill(c, &prompt);
        assert_eq!(got, want, "{tag}: logits differ from the same weights with their tokenizer");
        let next = m.decode_greedy(&[c], &[*prompt.last().unwrap()]);
        assert_eq!(next.len(), 1);
        // the text calls say what is missing
        assert_eq!(tokenize_status(&m, "hello"), Status::LLMRT_UNSUPPORTED, "{tag}");
        let e = last_error();
        assert!(e.contains(needle) && e.contains("tokenizer"), "{tag}: {e}");
        let mut buf = [0u8; 16];
        let mut n = 0usize;
        // SAFETY: a live model; `buf` and the id array are live locals of the lengths passed.
        let s = unsafe { llmrt_detokenize(m.ptr, prompt.as_ptr(), prompt.len(), buf.as_mut_ptr().cast(), 16, &mut n) };
        assert_eq!(s, Status::LLMRT_UNSUPPORTED, "{tag}: detokenize");
        assert!(last_error().contains(needle), "{tag}: {}", last_error());
        // SAFETY: as above.
        let s = unsafe { llmrt_token_piece(m.ptr, 1, buf.as_mut_ptr().cast(), 16, &mut n) };
        assert_eq!(s, Status::LLMRT_UNSUPPORTED, "{tag}: token_piece");
        drop(m);
        let _ = std::fs::remove_file(&p);
    }
}

#[test]
fn corrupt_tokenizers_still_fail_the_load() {
    // a tokenizer that is not unsupported but broken (scores of the wrong length)
    let p = with_tokenizer(
        "corrupt",
        &|k, v| if k == "tokenizer.ggml.scores" { Some(Value::Array(vec![Value::F32(0.0)])) } else { Some(v.clone()) },
        vec![],
    );
    match try_load(&p, 1, 0) {
        Ok(_) => panic!("a corrupt tokenizer must fail the load"),
        Err((s, msg)) => {
            assert_eq!(s, Status::LLMRT_BAD_MODEL, "{msg}");
            assert!(msg.contains("scores"), "{msg}");
        }
    }
    let _ = std::fs::remove_file(&p);
}

/// A copy of the qwen2 fixture's HF directory whose tokenizer.json is `tokenizer_json`.
fn hf_with_tokenizer_json(tag: &str, tokenizer_json: &[u8]) -> PathBuf {
    let src = Fixture::named("qwen2").dir.join("hf");
    let d = std::env::temp_dir().join(format!("llmrt-tok-hf-{tag}-{}", std::process::id()));
    hf_dir_with_config(&src, &d, |_| {});
    std::fs::write(d.join("tokenizer.json"), tokenizer_json).unwrap();
    d
}

#[test]
fn unsupported_hf_tokenizers_load_and_run_on_ids() {
    let f = Fixture::named("qwen2");
    let reference = load(&f.dir.join("hf"));
    let prompt = f.greedy_prompt();
    let c = reference.reserve(0);
    let want = reference.prefill(c, &prompt);
    let want_next = reference.decode_greedy(&[c], &[*prompt.last().unwrap()]);
    let base: serde_json::Value = read_json(&f.dir.join("hf/tokenizer.json"));
    // (what, tokenizer.json edit, what the error must name)
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "wordpiece",
            // a BERT-style model type llmrt does not run
            Box::new(|j| j["model"]["type"] = "WordPiece".into()),
            "\"WordPiece\"",
        ),
        (
            "normalizer",
            // a normalizer llmrt does not apply
            Box::new(|j| j["normalizer"] = serde_json::json!({"type": "BertNormalizer", "lowercase": true})),
            "\"BertNormalizer\"",
        ),
    ];
    for (tag, edit, needle) in cases {
        let mut j = base.clone();
        edit(&mut j);
        let d = hf_with_tokenizer_json(tag, &serde_json::to_vec(&j).unwrap());
        let m = match try_load(&d, 1, 0) {
            Ok(m) => m,
            Err((s, msg)) => panic!("{tag}: the model must load, got {s:?}: {msg}"),
        };
        // ids in, logits out: as the same weights with their own tokenizer
        let c = m.reserve(0);
        assert_eq!(m.prefill(c, &prompt), want, "{tag}: logits differ from the same weights with their tokenizer");
        assert_eq!(m.decode_greedy(&[c], &[*prompt.last().unwrap()]), want_next, "{tag}: decode");
        // the text calls say what is missing
        assert_eq!(tokenize_status(&m, "hello"), Status::LLMRT_UNSUPPORTED, "{tag}");
        let e = last_error();
        assert!(e.contains(needle) && e.contains("tokenizer.json") && e.contains("tokenizer"), "{tag}: {e}");
        let mut buf = [0u8; 16];
        let mut n = 0usize;
        // SAFETY: a live model; `buf` and the id array are live locals of the lengths passed.
        let s = unsafe { llmrt_detokenize(m.ptr, prompt.as_ptr(), prompt.len(), buf.as_mut_ptr().cast(), 16, &mut n) };
        assert_eq!(s, Status::LLMRT_UNSUPPORTED, "{tag}: detokenize");
        assert!(last_error().contains(needle), "{tag}: {}", last_error());
        drop(m);
        let _ = std::fs::remove_dir_all(&d);
    }
}

#[test]
fn corrupt_hf_tokenizer_json_still_fails_the_load() {
    let d = hf_with_tokenizer_json("corrupt", b"{\"model\": {\"type\": \"BPE\", ");
    match try_load(&d, 1, 0) {
        Ok(_) => panic!("a corrupt tokenizer.json must fail the load"),
        Err((s, msg)) => {
            assert_eq!(s, Status::LLMRT_BAD_MODEL, "{msg}");
            assert!(msg.contains("tokenizer.json") && msg.contains("invalid JSON"), "{msg}");
        }
    }
    let _ = std::fs::remove_dir_all(&d);
}
