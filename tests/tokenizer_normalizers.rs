//! tokenizer.json normalizers (NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace, Prepend,
//! Sequence) against HF tokenizers (tools/make_normalizer_vectors.py,
//! tests/fixtures/tokenizer/normalizers.json).
mod common;
use common::*;
use llmrt::tokenizer::Tokenizer;

#[test]
fn normalizers_match_hf_tokenizers() {
    let v = read_json(&fixtures().join("tokenizer/normalizers.json"));
    let texts: Vec<&str> = v["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let mut checked = 0;
    let mut changed = 0;
    for case in v["cases"].as_array().unwrap() {
        let base = case["base"].as_str().unwrap();
        let mut j: serde_json::Value = serde_json::from_slice(&std::fs::read(fixtures().join(base)).unwrap()).unwrap();
        j["normalizer"] = case["normalizer"].clone();
        let json = serde_json::to_vec(&j).unwrap();
        let t = Tokenizer::from_hf_json(&json, None, base)
            .unwrap_or_else(|e| panic!("{base} with normalizer {}: {e}", case["normalizer"]));
        let plain = {
            j["normalizer"] = serde_json::Value::Null;
            Tokenizer::from_hf_json(&serde_json::to_vec(&j).unwrap(), None, base).unwrap()
        };
        for (text, want) in texts.iter().zip(case["ids"].as_array().unwrap()) {
            let want: Vec<u32> = want.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
            let got = t.encode_with(text.as_bytes(), false, true).unwrap();
            assert_eq!(got, want, "{base} normalizer {} text {text:?}", case["normalizer"]);
            if got != plain.encode_with(text.as_bytes(), false, true).unwrap() {
                changed += 1;
            }
            checked += 1;
        }
    }
    assert!(checked >= 200, "{checked} cases");
    // The strings were chosen so that the normalizers change the ids: most must differ
    // from the tokenizer without one.
    assert!(changed >= 80, "only {changed} of {checked} cases changed by a normalizer");
    println!("{checked} cases, {changed} changed by their normalizer");
}
