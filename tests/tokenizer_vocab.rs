//! llama.cpp's own tokenizer suite: every `models/ggml-vocab-*.gguf` of the llama.cpp vendored
//! in the llama-cpp-python 0.3.36 source package that has `.inp`/`.out` vectors, tokenized as
//! its tests/test-tokenizer-0.cpp does (`add_special = false`, `parse_special = false`).
//!
//! The vocab files have no weights and are ~60 MB together, so they are not committed: this
//! test reads them from `LLMRT_VOCAB_DIR` (the `models/` directory) or else from the cache
//! `make vocab-fetch` fills (tools/make_vocab_fixtures.sh: `pip download` of the sdist,
//! checked against its sha256, unpacked under `${XDG_CACHE_HOME:-~/.cache}/llmrt/`). When neither
//! is there the test FAILS (`LLMRT_VOCAB_SUITE=skip` skips it, printing so).
//!
//! Each vocabulary is checked twice:
//! - directly: `Tokenizer::from_gguf` on the vocab file, `encode_with(text, false, false)`;
//! - as a model: at test time a loadable copy is written to a temp dir (every `tokenizer.*` key
//!   of the vocab file verbatim, plus a tiny random llama: 1 layer, hidden 8, 2 heads / 1 KV
//!   head, F32, embedding and output rows = the vocabulary's token count), loaded with
//!   `llmrt_model_load` on the CPU and driven through the C API: `llmrt_tokenize_ex(add_bos =
//!   false, parse_special = false)` and `llmrt_detokenize`, plus one prefill and one decode step
//!   on a few ids (finite logits over the whole vocabulary).
//!
//! For each vocabulary: every case's ids equal the `.out` line (both ways);
//! `detokenize(tokenize(text)) == text` for every case whose text the vocabulary can represent
//! (no unknown token among its reference ids; today that is every case of every vocab);
//! per-vocab pass counts are printed. A vocabulary whose tokenizer llmrt does not run (bert)
//! must still load as a model and run on ids, its text calls answering `LLMRT_UNSUPPORTED`
//! naming the tokenizer.
mod common;

use std::path::{Path, PathBuf};

use common::*;
use llmrt::ffi::*;
use llmrt::format::gguf::{Gguf, Value};
use llmrt::format::gguf_write::GgufWriter;
use llmrt::quant::DType;
use llmrt::tokenizer::Tokenizer;
use llmrt::util::XorShift;
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
fn cases(dir: &Path, name: &str) -> Vec<(String, Vec<u32>)> {
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

/// The tiny llama the vocab copies carry (RoPE head size 4, GQA 2:1).
const HIDDEN: u64 = 8;
const HEADS: u64 = 2;
const KV_HEADS: u64 = 1;
const FFN: u64 = 16;
const CONTEXT: u64 = 64;

/// `n` F32 weights in [-0.5, 0.5) from `rng`, as little-endian bytes.
fn weights(n: u64, rng: &mut XorShift) -> Vec<u8> {
    rng.vec(n as usize, -0.5, 0.5).iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A loadable copy of the vocab file `vocab` at `dst`: its `tokenizer.*` keys verbatim and a
/// tiny random llama whose vocabulary is the token list's length (returned).
fn model_copy(vocab: &Path, dst: &Path) -> usize {
    let g = Gguf::open(vocab).unwrap();
    let mut w = GgufWriter::new();
    let u32v = |v: u64| Value::U32(v as u32);
    w.kv("general.architecture", Value::Str("llama".into()));
    w.kv("llama.context_length", u32v(CONTEXT));
    w.kv("llama.embedding_length", u32v(HIDDEN));
    w.kv("llama.block_count", u32v(1));
    w.kv("llama.feed_forward_length", u32v(FFN));
    w.kv("llama.attention.head_count", u32v(HEADS));
    w.kv("llama.attention.head_count_kv", u32v(KV_HEADS));
    w.kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    let mut n_vocab = None;
    for (k, v) in g.metadata() {
        if !k.starts_with("tokenizer.") {
            continue;
        }
        if let ("tokenizer.ggml.tokens", Value::Array(a)) = (k.as_str(), &v) {
            n_vocab = Some(a.len() as u64);
        }
        w.kv(&k, v);
    }
    let v = n_vocab.unwrap_or_else(|| panic!("{}: no tokenizer.ggml.tokens", vocab.display()));
    let (q, kv) = (HIDDEN, HIDDEN / HEADS * KV_HEADS);
    let mut rng = XorShift::new(0x9e37_79b9_7f4a_7c15);
    let ones = |n: u64| (0..n).flat_map(|_| 1f32.to_le_bytes()).collect::<Vec<u8>>();
    let mut mat = |w: &mut GgufWriter, name: &str, cols: u64, rows: u64| {
        w.tensor(name, &[cols, rows], DType::F32, weights(cols * rows, &mut rng))
    };
    mat(&mut w, "token_embd.weight", HIDDEN, v);
    mat(&mut w, "blk.0.attn_q.weight", HIDDEN, q);
    mat(&mut w, "blk.0.attn_k.weight", HIDDEN, kv);
    mat(&mut w, "blk.0.attn_v.weight", HIDDEN, kv);
    mat(&mut w, "blk.0.attn_output.weight", q, HIDDEN);
    mat(&mut w, "blk.0.ffn_gate.weight", HIDDEN, FFN);
    mat(&mut w, "blk.0.ffn_up.weight", HIDDEN, FFN);
    mat(&mut w, "blk.0.ffn_down.weight", FFN, HIDDEN);
    mat(&mut w, "output.weight", HIDDEN, v);
    w.tensor("blk.0.attn_norm.weight", &[HIDDEN], DType::F32, ones(HIDDEN));
    w.tensor("blk.0.ffn_norm.weight", &[HIDDEN], DType::F32, ones(HIDDEN));
    w.tensor("output_norm.weight", &[HIDDEN], DType::F32, ones(HIDDEN));
    w.write(dst).unwrap();
    v as usize
}

/// `llmrt_tokenize_ex(add_bos = false, parse_special = false)`, asking the size first (NULL,
/// capacity 0) as a C caller would.
fn tokenize(m: &M, text: &str) -> Result<Vec<u32>, (Status, String)> {
    let (p, len) = (text.as_ptr().cast(), text.len());
    let mut n = 0usize;
    // SAFETY: a live model; `text` holds `len` bytes; NULL output with capacity 0; n a local.
    let s = unsafe { llmrt_tokenize_ex(m.ptr, p, len, false, false, std::ptr::null_mut(), 0, &mut n) };
    match s {
        Status::LLMRT_OK if n == 0 => return Ok(vec![]),
        Status::LLMRT_BUFFER_TOO_SMALL => {}
        s => return Err((s, last_error())),
    }
    let mut ids = vec![u32::MAX; n];
    let mut got = 0usize;
    // SAFETY: as above; `ids` holds `n` writable u32s.
    let s = unsafe { llmrt_tokenize_ex(m.ptr, p, len, false, false, ids.as_mut_ptr(), n, &mut got) };
    if s != Status::LLMRT_OK {
        return Err((s, last_error()));
    }
    assert_eq!(got, n, "ids written vs the count asked");
    Ok(ids)
}

/// `llmrt_detokenize`, asking the size first.
fn detokenize(m: &M, ids: &[u32]) -> Result<Vec<u8>, (Status, String)> {
    let mut n = 0usize;
    // SAFETY: a live model; `ids` a live slice; NULL output with capacity 0; n a local.
    let s = unsafe { llmrt_detokenize(m.ptr, ids.as_ptr(), ids.len(), std::ptr::null_mut(), 0, &mut n) };
    match s {
        Status::LLMRT_OK if n == 0 => return Ok(vec![]),
        Status::LLMRT_BUFFER_TOO_SMALL => {}
        s => return Err((s, last_error())),
    }
    let mut out = vec![0u8; n];
    let mut got = 0usize;
    // SAFETY: as above; `out` holds `n` writable bytes.
    let s = unsafe { llmrt_detokenize(m.ptr, ids.as_ptr(), ids.len(), out.as_mut_ptr().cast(), n, &mut got) };
    if s != Status::LLMRT_OK {
        return Err((s, last_error()));
    }
    assert_eq!(got, n, "bytes written vs the size asked");
    Ok(out)
}

/// Ids in, logits out: a prefill of `ids` and one decode step of its greedy token; the
/// vocabulary's every logit finite each time. Returns the greedy token.
fn ids_to_logits(m: &M, ids: &[u32]) -> Result<u32, String> {
    let c = m.reserve(0);
    let logits = m.prefill(c, ids);
    if logits.len() != m.vocab || !logits.iter().all(|x| x.is_finite()) {
        return Err(format!("prefill of {ids:?}: {} logits, not all finite", logits.len()));
    }
    let next = argmax(&logits) as u32;
    let logits = m.decode(&[c], &[next]);
    if !logits.iter().all(|x| x.is_finite()) || m.len(c) != ids.len() as u32 + 1 {
        return Err(format!("decode of {next} after {ids:?}: not all finite or cache length {}", m.len(c)));
    }
    assert_eq!(m.release(c), Status::LLMRT_OK);
    Ok(next)
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
    let tmp = std::env::temp_dir().join(format!("llmrt-vocab-suite-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let mut failures = vec![];
    let mut report = vec![];
    for &name in SUITE {
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        let cs = cases(&dir, name);
        // directly: the tokenizer of the vocab file
        let g = Gguf::open(&path).unwrap();
        let tk = match Tokenizer::from_gguf(&g) {
            Ok(Some(t)) => t,
            Ok(None) => panic!("{name}: no tokenizer"),
            Err(e) => {
                failures.push(format!("{name}: load failed: {e}"));
                continue;
            }
        };
        let mut direct = 0;
        for (text, want) in &cs {
            let got = tk.encode_with(text.as_bytes(), false, false).unwrap();
            if &got == want {
                direct += 1;
            } else {
                failures.push(format!("{name} (direct): {text:?}\n  got  {got:?}\n  want {want:?}"));
            }
        }
        // as a model: the loadable copy through the C API
        let copy = tmp.join(format!("{name}.gguf"));
        let n_vocab = model_copy(&path, &copy);
        let m = match try_load(&copy, 1, 0) {
            Ok(m) => m,
            Err((s, e)) => {
                failures.push(format!("{name}: the model copy did not load: {s:?} {e}"));
                continue;
            }
        };
        assert_eq!(m.vocab, n_vocab, "{name}: llmrt_model_get_info's vocab_size");
        let (mut ok, mut rt_ok, mut rt_n) = (0, 0, 0);
        for (text, want) in &cs {
            let got = match tokenize(&m, text) {
                Ok(ids) => ids,
                Err((s, e)) => {
                    failures.push(format!("{name}: llmrt_tokenize_ex of {text:?}: {s:?} {e}"));
                    continue;
                }
            };
            if &got == want {
                ok += 1;
            } else {
                failures.push(format!("{name} (model): {text:?}\n  got  {got:?}\n  want {want:?}"));
            }
            // the roundtrip, for texts every character of which the vocabulary holds
            // (no unknown token among the reference ids)
            if !want.iter().any(|&id| Some(id) == tk.unk()) {
                rt_n += 1;
                match detokenize(&m, &got) {
                    Ok(dec) if dec == text.as_bytes() => rt_ok += 1,
                    Ok(dec) => failures.push(format!(
                        "{name}: detokenize(tokenize({text:?})) gave {:?}",
                        String::from_utf8_lossy(&dec)
                    )),
                    Err((s, e)) => failures.push(format!("{name}: llmrt_detokenize of {got:?}: {s:?} {e}")),
                }
            }
        }
        // ids in, logits out: the first ids of the longest case
        let longest = cs.iter().map(|(_, ids)| ids).max_by_key(|ids| ids.len()).unwrap();
        let step = match ids_to_logits(&m, &longest[..longest.len().min(4)]) {
            Ok(next) => format!("decode ok (next {next})"),
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                "decode FAILED".into()
            }
        };
        report.push(format!(
            "{name:>15}: {n_vocab:>6} tokens; direct {direct}/{n}, model {ok}/{n} cases, roundtrip {rt_ok}/{rt_n}, {step}",
            n = cs.len()
        ));
        drop(m);
        let _ = std::fs::remove_file(&copy);
    }
    for &(name, needle) in UNSUPPORTED {
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        let g = Gguf::open(&path).unwrap();
        let direct = match Tokenizer::from_gguf(&g) {
            Err(e) if e.status == Status::LLMRT_UNSUPPORTED && e.message.contains(needle) => e.message,
            other => {
                failures.push(format!("{name}: expected LLMRT_UNSUPPORTED naming {needle}, got {other:?}"));
                continue;
            }
        };
        // the model copy loads and runs on ids; its text calls say what is missing
        let copy = tmp.join(format!("{name}.gguf"));
        model_copy(&path, &copy);
        let m = match try_load(&copy, 1, 0) {
            Ok(m) => m,
            Err((s, e)) => {
                failures.push(format!("{name}: the model copy must load, got {s:?} {e}"));
                continue;
            }
        };
        if let Err(e) = ids_to_logits(&m, &[1, 2, 3]) {
            failures.push(format!("{name}: {e}"));
        }
        match tokenize(&m, "hello world") {
            Err((Status::LLMRT_UNSUPPORTED, e)) if e.contains(needle) && e.contains("tokenizer") => {}
            other => failures
                .push(format!("{name}: llmrt_tokenize_ex: expected LLMRT_UNSUPPORTED naming {needle}, got {other:?}")),
        }
        match detokenize(&m, &[1, 2, 3]) {
            Err((Status::LLMRT_UNSUPPORTED, e)) if e.contains(needle) => {}
            other => failures
                .push(format!("{name}: llmrt_detokenize: expected LLMRT_UNSUPPORTED naming {needle}, got {other:?}")),
        }
        report.push(format!("{name:>15}: unsupported ({direct}); the model copy loads and decodes"));
        drop(m);
        let _ = std::fs::remove_file(&copy);
    }
    let _ = std::fs::remove_dir_all(&tmp);
    println!("llama.cpp vocab suite ({}):\n{}", dir.display(), report.join("\n"));
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}
