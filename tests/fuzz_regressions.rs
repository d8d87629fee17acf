//! Replays every reproducer the fuzzers found (tests/fuzz_regressions/<target>/)
//! through the same harness code the fuzz target runs (fuzz/src/harness.rs), and
//! checks that the structure-aware target's base models load and step.
//!
//! A reproducer's file name is `<what>.<expected>[.<ext>]`, `<expected>` one of
//! `ok`, `bad_model`, `unsupported`, `invalid_argument`, `any` (any error or ok):
//! the harness must not panic, and must end with that status.

#[path = "../fuzz/src/harness.rs"]
mod harness;
#[path = "../fuzz/src/tiny.rs"]
mod tiny;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use llmrt::quant::DType;
use llmrt::Status;

fn replay(target: &str, run: fn(&[u8]) -> llmrt::Result<()>) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions").join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else { return };
    let mut files: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect();
    files.sort();
    for f in files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let expected = name.split('.').nth(1).unwrap_or("any").to_string();
        let data = std::fs::read(&f).unwrap();
        let got = catch_unwind(AssertUnwindSafe(|| run(&data)))
            .unwrap_or_else(|_| panic!("{target}/{name}: the harness panicked"));
        let status = match &got {
            Ok(()) => Status::LLMRT_OK,
            Err(e) => e.status,
        };
        let want = match expected.as_str() {
            "ok" => Some(Status::LLMRT_OK),
            "bad_model" => Some(Status::LLMRT_BAD_MODEL),
            "unsupported" => Some(Status::LLMRT_UNSUPPORTED),
            "invalid_argument" => Some(Status::LLMRT_INVALID_ARGUMENT),
            "any" => None,
            other => panic!("{target}/{name}: unknown expected status '{other}'"),
        };
        if let Some(w) = want {
            assert_eq!(status, w, "{target}/{name}: {:?}", got.err().map(|e| e.message));
        }
        println!("{target}/{name}: {status:?}");
    }
}

#[test]
fn gguf_regressions() {
    replay("gguf", harness::gguf);
}

#[test]
fn gguf_structured_regressions() {
    replay("gguf_structured", |b| harness::model(b.to_vec()).map(|_| ()));
}

#[test]
fn safetensors_regressions() {
    replay("safetensors", harness::safetensors);
}

#[test]
fn hf_config_regressions() {
    replay("hf_config", harness::hf_config);
}

#[test]
fn tokenizer_json_regressions() {
    replay("tokenizer_json", harness::tokenizer_json);
}

#[test]
fn sentencepiece_model_regressions() {
    replay("sentencepiece_model", harness::sentencepiece_model);
}

#[test]
fn tokenizer_gguf_regressions() {
    replay("tokenizer_gguf", harness::tokenizer_gguf);
}

/// Every base model of the structure-aware target loads and runs its steps, so the
/// fuzzer's edits start from a file that reaches the forward pass.
#[test]
fn structured_base_models_load_and_step() {
    use tiny::{Arch, Spec, TokKind};
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3] {
        for tok in
            [TokKind::Spm, TokKind::Gpt2("gpt2"), TokKind::Gpt2("llama-bpe"), TokKind::Gpt2("qwen2"), TokKind::None]
        {
            // K-quant rows are 256 long: the base model's 32-wide matrices cannot be
            // K-quants (load_rejects_k_quant_rows_that_are_not_256_long below).
            for mat in DType::all().into_iter().filter(|d| d.block_elems() <= 32) {
                for tied in [false, true] {
                    let s = Spec::tiny(arch, tok, mat, tied, 3);
                    let m = harness::model(s.to_bytes())
                        .unwrap_or_else(|e| panic!("{arch:?} {tok:?} {mat:?} tied {tied}: {e}"));
                    harness::steps(&m).unwrap_or_else(|e| panic!("{arch:?} {tok:?} {mat:?}: {e}"));
                    if tok != TokKind::None {
                        let ids = m.tokenize(b"Hi the world", false).unwrap();
                        assert!(ids.len() >= 2, "{tok:?}: {ids:?}");
                        assert_eq!(m.detokenize(&ids).unwrap(), b"Hi the world", "{tok:?}: {ids:?}");
                    }
                }
            }
        }
    }
}

/// A K-quant matrix whose rows are not a multiple of 256 is `LLMRT_BAD_MODEL`
/// naming the tensor, its row length and the block size, through load (the
/// structure-aware target's base model has 32-wide rows).
#[test]
fn load_rejects_k_quant_rows_that_are_not_256_long() {
    use tiny::{Arch, Spec, TokKind};
    for mat in DType::all().into_iter().filter(|d| d.block_elems() == 256) {
        let mut s = Spec::tiny(Arch::Llama, TokKind::None, DType::F32, false, 5);
        let t = s.tensors.iter_mut().find(|t| t.name == "blk.0.attn_q.weight").unwrap();
        // The bytes a 256-wide row would need: the shape check, not the size, must catch it.
        t.ggml_type = mat.ggml_id();
        t.data = tiny::tensor_bytes(mat, 256 * t.ne[1] as usize / 8, 1);
        t.ne = vec![32, t.ne[1]];
        let e = harness::model(s.to_bytes()).err().unwrap_or_else(|| panic!("{mat}: a 32-wide row loaded")).message;
        assert!(e.contains("blk.0.attn_q.weight") && e.contains("row length 32") && e.contains("256"), "{mat}: {e}");
    }
}
