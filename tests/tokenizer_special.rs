//! parse_special: special tokens written in the text become their ids (true) or are
//! tokenized as text (false), against HF tokenizers' default and its
//! `encode_special_tokens` (tools/make_special_vectors.py, tests/fixtures/tokenizer/special.json).
mod common;
use common::*;
use llmrt::ffi::*;
use llmrt::tokenizer::Tokenizer;
use llmrt::Status;

fn cases(name: &str) -> Vec<(String, Vec<u32>, Vec<u32>)> {
    let j = read_json(&fixtures().join("tokenizer/special.json"));
    let t = j["tokenizers"].as_array().unwrap().iter().find(|t| t["name"] == name).unwrap();
    let ids = |v: &serde_json::Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    t["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["text"].as_str().unwrap().to_string(), ids(&c["ids_parse"]), ids(&c["ids_text"])))
        .collect()
}

fn tokenize_ex(m: &M, text: &str, parse_special: bool) -> Vec<u32> {
    let mut out = vec![0u32; 256];
    let mut n = 0usize;
    // SAFETY: a live model; text and out are live buffers of the lengths passed.
    let s = unsafe {
        llmrt_tokenize_ex(m.ptr, text.as_ptr().cast(), text.len(), false, parse_special, out.as_mut_ptr(), 256, &mut n)
    };
    ok(s, "llmrt_tokenize_ex");
    out.truncate(n);
    out
}

#[test]
fn c_api_parse_special_matches_hf_tokenizers_on_the_qwen2_gguf() {
    let m = load(&fixtures().join("qwen2/qwen2.f32.gguf"));
    let cs = cases("qwen2");
    assert!(cs.len() >= 5);
    for (text, parse, as_text) in cs {
        assert_eq!(tokenize_ex(&m, &text, true), parse, "{text:?} parse_special = true");
        assert_eq!(tokenize_ex(&m, &text, false), as_text, "{text:?} parse_special = false");
        // llmrt_tokenize keeps its behaviour: parse_special = true.
        let mut out = vec![0u32; 256];
        let mut n = 0usize;
        // SAFETY: as above.
        ok(
            unsafe { llmrt_tokenize(m.ptr, text.as_ptr().cast(), text.len(), false, out.as_mut_ptr(), 256, &mut n) },
            "llmrt_tokenize",
        );
        assert_eq!(out[..n], parse[..], "{text:?} llmrt_tokenize");
    }
    // The usual size protocol and errors.
    let mut n = 0usize;
    let t = "<|endoftext|>hello";
    // SAFETY: NULL tokens with capacity 0 asks the size.
    let s =
        unsafe { llmrt_tokenize_ex(m.ptr, t.as_ptr().cast(), t.len(), false, false, std::ptr::null_mut(), 0, &mut n) };
    assert_eq!(s, Status::LLMRT_BUFFER_TOO_SMALL);
    assert_eq!(n, tokenize_ex(&m, t, false).len());
    // SAFETY: NULL text with a length is rejected before use.
    let s = unsafe { llmrt_tokenize_ex(m.ptr, std::ptr::null(), 3, false, false, std::ptr::null_mut(), 0, &mut n) };
    assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT);
}

#[test]
fn tokenizer_json_parse_special_matches_hf_tokenizers() {
    for (name, file) in
        [("llama3_bpe", "tokenizer/llama3_bpe.tokenizer.json"), ("llama_gqa_hf", "tokenizer/llama_gqa.tokenizer.json")]
    {
        let json = std::fs::read(fixtures().join(file)).unwrap();
        let t = Tokenizer::from_hf_json(&json, None, file).unwrap();
        let cs = cases(name);
        assert!(cs.len() >= 3);
        for (text, parse, as_text) in cs {
            assert_eq!(t.encode_with(text.as_bytes(), false, true).unwrap(), parse, "{name} {text:?} parse");
            assert_eq!(t.encode_with(text.as_bytes(), false, false).unwrap(), as_text, "{name} {text:?} as text");
        }
    }
}
