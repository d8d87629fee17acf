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

#[test]
fn cache_state_regressions() {
    replay("cache_state", harness::cache_state);
}

#[test]
fn chat_template_regressions() {
    replay("chat_template", harness::chat_template);
}

/// The committed `cache_state` seeds are valid states of the target's tiny model (so a
/// change of the format or of the model fingerprint shows here, and the seeds are
/// regenerated: `python3 fuzz/make_corpus.py --dump`), and so are the ones the harness
/// makes now; a damaged seed is refused with the pool unchanged (the harness checks).
#[test]
fn cache_state_seeds_load() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/cache_state");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        let data = std::fs::read(&p).unwrap();
        harness::cache_state(&data).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let mut cut = data.clone();
        cut.pop();
        assert_eq!(harness::cache_state(&cut).unwrap_err().status, Status::LLMRT_INVALID_ARGUMENT);
        n += 1;
    }
    assert!(n >= 7, "{n} seeds in {}", dir.display());
    for (name, data) in harness::state_seeds() {
        harness::cache_state(&data).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Mode 1 reseals the checksum: a flipped KV byte then loads (and saves back).
        let mut flipped = data.clone();
        let at = flipped.len() - 5;
        flipped[at] ^= 0x20;
        flipped[0] = 1;
        let loaded = harness::cache_state(&flipped);
        assert_eq!(loaded.is_ok(), name != "len0_cap0", "{name}: {loaded:?}");
    }
}

/// The chat template harness renders the real templates its seeds start from, and the
/// hand-written runaway ones stop with an error in bounded time. Its small work budget
/// (`CHAT_FUZZ_FUEL`) changes no seed's outcome but the runaways' against the library's
/// `FUEL`: every seed that renders with `FUEL` renders with the fuzz budget too.
#[test]
fn chat_template_seeds_render_or_stop() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/chat_template");
    let mut ok = 0;
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let t = std::time::Instant::now();
        let r = harness::chat_template(&std::fs::read(&p).unwrap());
        assert!(t.elapsed().as_secs() < 10, "{name}: {:?}", t.elapsed());
        let runaway = ["long_loop", "nested_loops", "recursive_macro", "string_growth", "string_repeat", "raise"];
        if runaway.iter().any(|r| name.starts_with(r)) {
            assert!(r.is_err(), "{name} rendered");
        } else {
            let full = harness::chat_template_with_fuel(&std::fs::read(&p).unwrap(), llmrt::chat::template::FUEL);
            assert_eq!(r.is_ok(), full.is_ok(), "{name}: fuzz budget {r:?}, library budget {full:?}");
            if r.is_ok() {
                ok += 1;
            }
        }
    }
    assert!(ok >= 10, "only {ok} seed templates rendered");
}

/// KNOWN GAP (found while seeding `chat_template`, not by the fuzzer): minijinja 3.1.0
/// charges no fuel for `list + list` (it is lazy) and, once 33 such sums are nested,
/// copies the whole sum into a new list, also uncharged. A template that doubles a list
/// 40 times (`{% set ns.v = ns.v + ns.v %}`) therefore runs for minutes and allocates
/// without bound (9.7 GB after 9 minutes here) instead of running out of fuel: a model
/// file's chat template can hang or OOM the process. minijinja has no hook for the
/// operator; the fix belongs upstream (or in a check of the template before rendering).
/// Ignored until then: `cargo test --release --test fuzz_regressions -- --ignored`
/// runs the render in a child process capped at 2 GiB and 20 s, and fails while the
/// gap is open.
#[test]
#[ignore]
fn known_gap_chat_template_list_doubling_is_not_fuel_bounded() {
    const SRC: &str = "{% set ns = namespace(v=['ab']) %}{% for i in range(40) %}{% set ns.v = ns.v + ns.v %}{% endfor %}{{ ns.v|length }}";
    known_gap_child("known_gap_chat_template_list_doubling_is_not_fuel_bounded", &[SRC]);
}

/// Found by the `chat_template` fuzz target on 2026-12-01, after 264,364 executions
/// (SIGSEGV): a namespace that held itself (`{% set ns.a = ns %}`, or a list holding it)
/// made minijinja 3.1.0 recurse without end when the value was printed, stringified,
/// hashed as a map key or sorted: a stack overflow, which killed the process. Every
/// `{% set ns.x = ... %}` is now guarded (src/chat/template.rs, `rewrite_tags`):
/// each of these must fail with an error. Rendered in a child process (2 GiB, 20 s) so
/// that a regression fails this test instead of killing the test binary.
#[test]
fn chat_template_namespace_cycles_are_refused() {
    const SRCS: &[&str] = &[
        "{% set ns = namespace() %}{% set ns.a = ns %}{{ ns }}",
        "{% set ns = namespace() %}{% set ns.a = ns %}{{ ns|string }}",
        "{% set ns = namespace() %}{% set ns.a = [ns] %}{{ ns.a }}",
        "{% set ns = namespace() %}{% set ns.a = ns %}{{ {ns: 1} }}",
        "{% set ns = namespace() %}{% set ns.a = ns %}{{ [ns, ns]|sort }}",
    ];
    known_gap_child("chat_template_namespace_cycles_are_refused", SRCS);
}

/// Renders `srcs` through the harness in a child process (this test binary, `--exact
/// name`) capped at 2 GiB of address space; passes when the child ends within 20 s having
/// seen every render fail with an error (what the library promises).
fn known_gap_child(name: &str, srcs: &[&str]) {
    if std::env::var_os("LLMRT_GAP_CHILD").is_some() {
        let lim = libc::rlimit { rlim_cur: 2 << 30, rlim_max: 2 << 30 };
        // SAFETY: setrlimit with a valid struct; lowers this child's own address-space limit.
        unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) };
        for src in srcs {
            let r = harness::chat_template(src.as_bytes());
            assert!(r.is_err(), "rendered: {src}");
        }
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args(["--exact", name, "--include-ignored", "--nocapture"])
        .env("LLMRT_GAP_CHILD", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t.elapsed().as_secs() >= 20 {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(
        status.is_some_and(|s| s.success()),
        "{name}: the renders did not all stop with an error within 20 s and 2 GiB: {status:?}"
    );
}

const ARCHS: [tiny::Arch; 5] =
    [tiny::Arch::Llama, tiny::Arch::Qwen2, tiny::Arch::Qwen3, tiny::Arch::Mixtral, tiny::Arch::Qwen2Moe];
const TOKS: [tiny::TokKind; 5] = [
    tiny::TokKind::Spm,
    tiny::TokKind::Gpt2("gpt2"),
    tiny::TokKind::Gpt2("llama-bpe"),
    tiny::TokKind::Gpt2("qwen2"),
    tiny::TokKind::None,
];

/// The matrix types a base model was written with, by tensor name.
fn matrix_types(s: &tiny::Spec) -> Vec<(String, DType)> {
    s.tensors
        .iter()
        // Matrices and stacked experts; not the router and the shared expert's gate, which
        // llama-quantize keeps in F32.
        .filter(|t| t.ne.len() >= 2 && !t.name.contains("ffn_gate_inp"))
        .map(|t| (t.name.clone(), DType::from_ggml(t.ggml_type).expect("a supported type")))
        .collect()
}

/// Loads `s`, runs the harness's steps, and round-trips text through its tokenizer.
fn load_and_step(s: &tiny::Spec, what: &str, tok: tiny::TokKind) {
    let m = harness::model(s.to_bytes()).unwrap_or_else(|e| panic!("{what}: {e}"));
    harness::steps(&m).unwrap_or_else(|e| panic!("{what}: {e}"));
    if tok != tiny::TokKind::None {
        let ids = m.tokenize(b"Hi the world", false).unwrap();
        assert!(ids.len() >= 2, "{what}: {ids:?}");
        assert_eq!(m.detokenize(&ids).unwrap(), b"Hi the world", "{what}: {ids:?}");
    }
}

/// Every base model of the structure-aware target loads and runs its steps, so the
/// fuzzer's edits start from a file that reaches the forward pass: on the small shape
/// every architecture x tokenizer x matrix type x tied (the K-quants fall back to
/// 32-element types there, as llama-quantize does); on both shapes every
/// llama-quantize file type, tied and not; on the wide shape every type everywhere.
/// Between them the wide bases put every supported type into some matrix.
#[test]
fn structured_base_models_load_and_step() {
    use tiny::{FileType, Spec, Types, SMALL, WIDE};
    let mut n = 0;
    for arch in ARCHS {
        for tok in TOKS {
            for mat in DType::all() {
                for tied in [false, true] {
                    let s = Spec::tiny(arch, tok, mat, tied, 3);
                    for (name, t) in matrix_types(&s) {
                        assert!(t.block_elems() <= 32, "{mat} small base: {name} is {t}");
                        assert_eq!(t == mat, mat.block_elems() <= 32, "{mat} small base: {name} is {t}");
                    }
                    load_and_step(&s, &format!("small {arch:?} {tok:?} {mat:?} tied {tied}"), tok);
                    n += 1;
                }
            }
        }
    }
    let mut wide_types = std::collections::BTreeSet::new();
    for (i, ft) in FileType::all().into_iter().enumerate() {
        for (shape, wide) in [(SMALL, false), (WIDE, true)] {
            for tied in [false, true] {
                let (arch, tok) = (ARCHS[(i + tied as usize) % ARCHS.len()], TOKS[(i + wide as usize) % 5]);
                let s = Spec::build(shape, arch, tok, Types::file_type(ft, tied), tied, i as u64);
                if wide {
                    wide_types.extend(matrix_types(&s).into_iter().map(|(_, t)| t.name()));
                }
                load_and_step(&s, &format!("{ft:?} wide {wide} {arch:?} {tok:?} tied {tied}"), tok);
                n += 1;
            }
        }
    }
    for (i, mat) in DType::all().into_iter().enumerate() {
        let s = Spec::build(WIDE, ARCHS[i % ARCHS.len()], TOKS[i % 5], Types::uniform(mat), i % 2 == 1, 9);
        assert!(matrix_types(&s).iter().all(|(_, t)| *t == mat), "{mat}: {:?}", matrix_types(&s));
        load_and_step(&s, &format!("{mat:?} wide"), TOKS[i % 5]);
        n += 1;
    }
    let all: std::collections::BTreeSet<_> = DType::all().into_iter().map(|d| d.name()).collect();
    assert_eq!(wide_types, all, "the wide file-type bases must use every supported type");
    println!("{n} base models loaded and stepped");
}

/// The structured target's llama-quantize file types match what llama-quantize wrote
/// into tests/fixtures/quant/models (a 2-layer llama with rows of 256/768): layer 1
/// there is a layer that gets llama-quantize's "more bits" rules, as the one layer of
/// the base models does.
#[test]
fn structured_file_types_match_llama_quantize() {
    use tiny::{FileType, Types};
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant/models/index.json");
    let index: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut checked = 0;
    for ft in FileType::all() {
        let Some(file) = index["files"].get(format!("{ft:?}")) else { continue };
        let want = |name: &str| file["tensor_types"][name].as_str().unwrap_or_else(|| panic!("{ft:?}: {name}"));
        let t = Types::file_type(ft, false);
        for (name, got) in [
            ("token_embd.weight", t.embd),
            ("output.weight", t.output),
            ("blk.1.attn_q.weight", t.q),
            ("blk.1.attn_k.weight", t.k),
            ("blk.1.attn_v.weight", t.v),
            ("blk.1.attn_output.weight", t.attn_out),
            ("blk.1.ffn_gate.weight", t.gate),
            ("blk.1.ffn_up.weight", t.up),
            ("blk.1.ffn_down.weight", t.down),
        ] {
            assert_eq!(got.name(), want(name), "{ft:?} {name}");
        }
        checked += 1;
    }
    // Every file type but BF16 (llama-quantize's fixtures have none).
    assert_eq!(checked, FileType::all().len() - 1);
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
        let e = harness::model(s.to_bytes()).err().unwrap_or_else(|| panic!("{mat}: a 32-wide row loaded"));
        assert_eq!(e.status, Status::LLMRT_BAD_MODEL, "{mat}: {e}");
        let e = e.message;
        assert!(e.contains("blk.0.attn_q.weight") && e.contains("row length 32") && e.contains("256"), "{mat}: {e}");
    }
}

/// A grouped-type tensor (K-quants, IQ4_NL/IQ4_XS, Q4_1/Q5_0/Q5_1) whose bytes stop
/// short of what its shape needs (the last tensor of a model with 256-wide rows, one
/// block short of the file's end) is `LLMRT_BAD_MODEL` naming it, at load.
#[test]
fn load_rejects_grouped_tensors_shorter_than_their_shape() {
    use tiny::{Arch, Spec, TokKind, Types, WIDE};
    for mat in DType::all().into_iter().filter(|d| d.is_grouped()) {
        let mut s = Spec::build(WIDE, Arch::Llama, TokKind::None, Types::uniform(mat), false, 5);
        assert!(harness::model(s.to_bytes()).is_ok(), "{mat}: the whole model must load");
        let t = s.tensors.last_mut().unwrap();
        assert_eq!(t.ggml_type, mat.ggml_id(), "{mat}: {}", t.name);
        let name = t.name.clone();
        let n = t.data.len() - mat.block_bytes();
        t.data.truncate(n);
        let e = harness::model(s.to_bytes()).err().unwrap_or_else(|| panic!("{mat}: a short {name} loaded"));
        assert_eq!(e.status, Status::LLMRT_BAD_MODEL, "{mat}: {e}");
        assert!(e.message.contains(&name), "{mat}: {}", e.message);
    }
}
