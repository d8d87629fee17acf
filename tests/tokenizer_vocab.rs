//! llama.cpp's own tokenizer suite: every `models/ggml-vocab-*.gguf` of the llama.cpp vendored
//! in the llama-cpp-python 0.3.36 source package that has `.inp`/`.out` vectors, tokenized as
//! its tests/test-tokenizer-0.cpp does (`add_special = false`, `parse_special = false`).
//!
//! The vocab files have no weights and are ~60 MB together, so they are not committed: this
//! test reads them from `LLMRT_VOCAB_DIR` (the `models/` directory) or else from the cache
//! `make vocab-fetch` fills (tools/make_vocab_fixtures.sh: `pip download` of the sdist,
//! checked against its sha256, unpacked under `${XDG_CACHE_HOME:-~/.cache}/llmrt/`). When neither
//! is there the test FAILS (`LLMRT_VOCAB_SUITE=skip` skips it, printing so). The vocabulary is
//! loaded with `Tokenizer::from_gguf`, the same loader a whole model goes through.
//!
//! For each vocabulary: every case's ids equal the `.out` line; `decode(ids) == text` for every
//! case whose text the vocabulary can represent (no unknown token among its reference ids; today
//! that is every case of every vocab); per-vocab pass counts are printed.

use std::path::PathBuf;

use llmrt::format::gguf::Gguf;
use llmrt::tokenizer::Tokenizer;
use llmrt::Status;

/// The vocabularies of the suite llmrt runs: all 14 BPE and SentencePiece ones.
const SUITE: &[&str] = &[
    "llama-spm",
    "llama-bpe",
    "phi-3",
    "qwen2",
    "qwen35",
    "gpt-2",
    "deepseek-llm",
    "deepseek-coder",
    "falcon",
    "starcoder",
    "mpt",
    "refact",
    "command-r",
    "gemma-4",
];

/// Vocabularies of the suite whose tokenizer model llmrt does not run: loading them must say so.
const UNSUPPORTED: &[(&str, &str)] = &[("bert-bge", "\"bert\"")];

fn models_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("LLMRT_VOCAB_DIR") {
        return Some(PathBuf::from(d));
    }
    let cache = std::env::var_os("LLMRT_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("llmrt")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/llmrt")))?;
    Some(cache.join("llama_cpp_python-0.3.36/vendor/llama.cpp/models"))
}

/// The cases of `<vocab>.inp` / `.out` as test-tokenizer-0.cpp reads them (its map keeps the
/// last of duplicate texts, which are identical here anyway).
fn cases(dir: &std::path::Path, name: &str) -> Vec<(String, Vec<u32>)> {
    let base = dir.join(format!("ggml-vocab-{name}.gguf"));
    let inp = std::fs::read_to_string(base.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(base.with_extension("gguf.out")).unwrap();
    // split as test-tokenizer-0.cpp does: no empty case after a final separator
    let sep = "\n__ggml_vocab_test__\n";
    let (mut texts, mut pos) = (vec![], 0);
    while pos < inp.len() {
        match inp[pos..].find(sep) {
            Some(i) => {
                texts.push(&inp[pos..pos + i]);
                pos += i + sep.len();
            }
            None => {
                texts.push(&inp[pos..]);
                break;
            }
        }
    }
    let ids: Vec<Vec<u32>> =
        out.lines().map(|l| l.split_whitespace().map(|t| t.parse::<u32>().unwrap()).collect()).collect();
    assert_eq!(texts.len(), ids.len(), "{name}: .inp and .out have different numbers of cases");
    texts.into_iter().map(String::from).zip(ids).collect()
}

#[test]
fn llama_cpp_vocab_suite() {
    let dir = models_dir().expect("neither LLMRT_VOCAB_DIR nor HOME is set");
    if !dir.join("ggml-vocab-llama-spm.gguf").is_file() {
        if std::env::var("LLMRT_VOCAB_SUITE").as_deref() == Ok("skip") {
            println!("SKIPPED (LLMRT_VOCAB_SUITE=skip): llama.cpp vocab suite not at {}", dir.display());
            return;
        }
        panic!(
            "llama.cpp's vocab suite is not at {}: run `make vocab-fetch` (downloads the llama-cpp-python \
             0.3.36 sdist from PyPI) or set LLMRT_VOCAB_DIR to its vendor/llama.cpp/models directory",
            dir.display()
        );
    }
    let mut failures = vec![];
    let mut report = vec![];
    for &name in SUITE {
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        let g = Gguf::open(&path).unwrap();
        let tk = match Tokenizer::from_gguf(&g) {
            Ok(Some(t)) => t,
            Ok(None) => panic!("{name}: no tokenizer"),
            Err(e) => {
                failures.push(format!("{name}: load failed: {e}"));
                continue;
            }
        };
        let cs = cases(&dir, name);
        let (mut ok, mut rt_ok, mut rt_n) = (0, 0, 0);
        for (text, want) in &cs {
            let got = tk.encode_with(text.as_bytes(), false, false).unwrap();
            if &got == want {
                ok += 1;
            } else {
                failures.push(format!("{name}: {text:?}\n  got  {got:?}\n  want {want:?}"));
            }
            // the roundtrip, for texts every character of which the vocabulary holds
            // (no unknown token among the reference ids)
            let unk = want.iter().any(|&id| Some(id) == tk.unk());
            if !unk {
                rt_n += 1;
                let dec = tk.decode(want).unwrap();
                if dec == text.as_bytes() {
                    rt_ok += 1;
                } else {
                    failures.push(format!("{name}: roundtrip of {text:?} gave {:?}", String::from_utf8_lossy(&dec)));
                }
            }
        }
        report.push(format!("{name:>15}: {ok}/{} cases, roundtrip {rt_ok}/{rt_n}", cs.len()));
    }
    for &(name, needle) in UNSUPPORTED {
        let g = Gguf::open(&dir.join(format!("ggml-vocab-{name}.gguf"))).unwrap();
        match Tokenizer::from_gguf(&g) {
            Err(e) if e.status == Status::LLMRT_UNSUPPORTED && e.message.contains(needle) => {
                report.push(format!("{name:>15}: unsupported ({})", e.message))
            }
            other => failures.push(format!("{name}: expected LLMRT_UNSUPPORTED naming {needle}, got {other:?}")),
        }
    }
    println!("llama.cpp vocab suite ({}):\n{}", dir.display(), report.join("\n"));
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}
