//! Mixture-of-experts models beyond their logits against transformers (which
//! tests/reference_parity.rs and tests/hf_parity.rs check for every fixture): batch and
//! thread invariance, the router's tie rule, GGUF's two expert layouts (stacked
//! `ffn_*_exps` tensors and llama.cpp's older per-expert `ffn_*.E.weight`), and bad files.
mod common;
use common::*;
use llmrt::format::gguf::{Gguf, TensorInfo, Value};
use llmrt::format::gguf_write::GgufWriter;
use llmrt::Status;
use std::path::{Path, PathBuf};

const MOE: [&str; 3] = ["mixtral", "qwen2moe", "qwen3moe"];

fn fixture(name: &str) -> Fixture {
    Fixture::named(name)
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("llmrt-moe-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// What a rewrite does with one tensor: keep it, or write these tensors instead.
type Tensors = Vec<(String, Vec<u64>, u32, Vec<u8>)>;
/// A tensor edit of [`rewrite`].
type Edit<'a> = Box<dyn Fn(&TensorInfo, &[u8]) -> Option<Tensors> + 'a>;
/// A bad-file case: (tag, metadata set, tensor edit, status, what the message names).
type Case<'a> = (&'a str, Vec<(String, Value)>, Edit<'a>, Status, String);

/// A copy of `src` with metadata `set` (added or replaced) and each tensor passed
/// through `edit` (`None`: kept as it is).
fn rewrite(src: &Path, dst: &Path, set: &[(&str, Value)], edit: &dyn Fn(&TensorInfo, &[u8]) -> Option<Tensors>) {
    let g = Gguf::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        if k != "general.alignment" && !set.iter().any(|(s, _)| *s == k) {
            w.kv(&k, v);
        }
    }
    for (k, v) in set {
        w.kv(k, v.clone());
    }
    for t in &g.tensors {
        let data = g.tensor_data(t);
        match edit(t, data) {
            None => w.tensor_raw(&t.name, &t.ne, t.ggml_type, data.to_vec()),
            Some(ts) => {
                for (name, ne, ty, bytes) in ts {
                    w.tensor_raw(&name, &ne, ty, bytes);
                }
            }
        }
    }
    w.write(dst).unwrap();
}

fn arch_key(path: &Path, key: &str) -> String {
    let g = Gguf::open(path).unwrap();
    format!("{}.{key}", g.get_str("general.architecture").unwrap().unwrap())
}

fn expert_count(path: &Path) -> usize {
    let g = Gguf::open(path).unwrap();
    g.get_u64(&arch_key(path, "expert_count")).unwrap().unwrap() as usize
}

fn logits(path: &Path, threads: u32, tokens: &[u32]) -> Vec<f32> {
    let m = try_load(path, threads, 64 << 20).unwrap_or_else(|(s, e)| panic!("{s:?} {e}"));
    let c = m.reserve(0);
    m.prefill_all(c, tokens)
}

fn worst_row(got: &[f32], want: &[f32], vocab: usize) -> f64 {
    assert_eq!(got.len(), want.len());
    got.chunks_exact(vocab).zip(want.chunks_exact(vocab)).map(|(g, w)| rel_l2(g, w)).fold(0.0, f64::max)
}

/// Decoding several caches in one step gives each exactly what decoding it alone gives
/// (every expert runs once over the tokens routed to it, whichever tokens share the step).
#[test]
fn batched_decode_equals_single_decodes_bit_for_bit() {
    for name in MOE {
        let f = fixture(name);
        for ty in ["f32", "f16"] {
            let m = try_load(&f.gguf(ty), 2, 64 << 20).unwrap();
            let prompts: Vec<&[u32]> = vec![&f.tokens[..5], &f.tokens[3..12], &f.tokens[7..9]];
            let batch: Vec<u64> = prompts.iter().map(|_| m.reserve(0)).collect();
            let alone: Vec<u64> = prompts.iter().map(|_| m.reserve(0)).collect();
            for (i, p) in prompts.iter().enumerate() {
                m.prefill(batch[i], p);
                m.prefill(alone[i], p);
            }
            for step in 0..4 {
                let toks: Vec<u32> = (0..3).map(|i| f.tokens[(step * 5 + i * 7) % f.tokens.len()]).collect();
                let together = m.decode(&batch, &toks);
                for i in 0..3 {
                    let one = m.decode(&[alone[i]], &toks[i..i + 1]);
                    assert!(
                        one == together[i * f.vocab..(i + 1) * f.vocab],
                        "{name} {ty}: step {step}, cache {i}: batched decode differs from decoding it alone"
                    );
                }
            }
        }
    }
}

/// 1 and 2 threads give the same logits, bit for bit; and prefill's last row is the
/// decode of the same position within the f32 rounding of a different summation.
#[test]
fn threads_do_not_change_logits() {
    for name in MOE {
        let f = fixture(name);
        let path = f.gguf("f32");
        let a = logits(&path, 1, &f.tokens);
        let b = logits(&path, 2, &f.tokens);
        assert!(a == b, "{name}: 1 and 2 threads differ");
        let m = try_load(&path, 2, 64 << 20).unwrap();
        let c = m.reserve(0);
        let n = f.tokens.len();
        m.prefill(c, &f.tokens[..n - 1]);
        let last = m.decode(&[c], &f.tokens[n - 1..]);
        let e = rel_l2(&last, &a[(n - 1) * f.vocab..]);
        assert!(e < 1e-5, "{name}: decode of the last token vs prefill's row {e:.3e}");
    }
}

/// A router whose scores all tie (zero weights) takes the first `k` experts, each at
/// weight 1/k: the same model cut to those `k` experts, all used, gives the same logits.
#[test]
fn router_ties_take_the_lowest_expert_indices() {
    let f = fixture("mixtral");
    let src = f.gguf("f32");
    let d = scratch("ties");
    let (n, k) = (expert_count(&src), 2usize);
    assert!(n > k);
    let zero_router = |t: &TensorInfo, data: &[u8]| {
        t.name
            .ends_with("ffn_gate_inp.weight")
            .then(|| vec![(t.name.clone(), t.ne.clone(), t.ggml_type, vec![0u8; data.len()])])
    };
    let tied = d.join("tied.gguf");
    rewrite(&src, &tied, &[], &zero_router);
    // The first k experts only: the router's first k rows, the stacked tensors' first k.
    let first_k = |t: &TensorInfo, data: &[u8]| {
        if t.name.ends_with("_exps.weight") || t.name.ends_with("ffn_gate_inp.weight") {
            let last = *t.ne.last().unwrap() as usize;
            assert_eq!(last, n, "{}", t.name);
            let keep = data.len() / n * k;
            let mut ne = t.ne.clone();
            *ne.last_mut().unwrap() = k as u64;
            let bytes = if t.name.ends_with("ffn_gate_inp.weight") { vec![0u8; keep] } else { data[..keep].to_vec() };
            Some(vec![(t.name.clone(), ne, t.ggml_type, bytes)])
        } else {
            None
        }
    };
    let cut = d.join("cut.gguf");
    let set = [
        (arch_key(&src, "expert_count"), Value::U32(k as u32)),
        (arch_key(&src, "expert_used_count"), Value::U32(k as u32)),
    ];
    let set: Vec<(&str, Value)> = set.iter().map(|(a, b)| (a.as_str(), b.clone())).collect();
    rewrite(&src, &cut, &set, &first_k);
    let a = logits(&tied, 2, &f.tokens);
    let b = logits(&cut, 2, &f.tokens);
    let e = worst_row(&a, &b, f.vocab);
    println!("mixtral, all router scores tied: vs the first {k} experts alone {e:.3e}");
    assert!(e < 1e-6, "{e:.3e}");
    // And not a model that ignores the experts: the last k experts give other logits.
    let last_k = |t: &TensorInfo, data: &[u8]| {
        first_k(t, data).map(|mut v| {
            if t.name.ends_with("_exps.weight") {
                v[0].3 = data[data.len() - data.len() / n * k..].to_vec();
            }
            v
        })
    };
    let other = d.join("other.gguf");
    rewrite(&src, &other, &set, &last_k);
    let c = logits(&other, 2, &f.tokens);
    assert!(worst_row(&a, &c, f.vocab) > 1e-2, "the experts do not matter?");
    let _ = std::fs::remove_dir_all(&d);
}

/// llama.cpp's older GGUFs store each expert as its own matrix (`blk.N.ffn_gate.E.weight`);
/// they load and give the stacked layout's logits bit for bit.
#[test]
fn per_expert_tensors_equal_stacked_ones() {
    for name in MOE {
        let f = fixture(name);
        let src = f.gguf("f16");
        let n = expert_count(&src);
        let d = scratch(&format!("split-{name}"));
        let split = |t: &TensorInfo, data: &[u8]| {
            let base = t.name.strip_suffix("_exps.weight")?;
            assert_eq!(t.ne.len(), 3);
            let per = data.len() / n;
            Some(
                (0..n)
                    .map(|e| {
                        (
                            format!("{base}.{e}.weight"),
                            t.ne[..2].to_vec(),
                            t.ggml_type,
                            data[e * per..(e + 1) * per].to_vec(),
                        )
                    })
                    .collect(),
            )
        };
        let out = d.join("split.gguf");
        rewrite(&src, &out, &[], &split);
        assert!(Gguf::open(&out).unwrap().tensors.iter().all(|t| !t.name.ends_with("_exps.weight")));
        let a = logits(&src, 2, &f.tokens);
        let b = logits(&out, 2, &f.tokens);
        assert!(a == b, "{name}: per-expert tensors give other logits");
        let _ = std::fs::remove_dir_all(&d);
    }
}

/// Bad expert metadata and tensors are refused, naming the key or the tensor.
#[test]
fn bad_expert_files_are_named() {
    let f = fixture("qwen2moe");
    let src = f.gguf("f32");
    let n = expert_count(&src);
    let d = scratch("bad");
    let keep = |_: &TensorInfo, _: &[u8]| None;
    let used = arch_key(&src, "expert_used_count");
    let count = arch_key(&src, "expert_count");
    let cases: Vec<Case<'_>> = vec![
        (
            "used",
            vec![(used.clone(), Value::U32(n as u32 + 1))],
            Box::new(keep),
            Status::LLMRT_BAD_MODEL,
            format!("{} experts used per token of {n}", n + 1),
        ),
        (
            "count",
            vec![(count.clone(), Value::U32(1 << 20))],
            Box::new(keep),
            Status::LLMRT_UNSUPPORTED,
            format!("{} experts", 1 << 20),
        ),
        (
            "short",
            vec![],
            Box::new(|t: &TensorInfo, data: &[u8]| {
                (t.name == "blk.1.ffn_down_exps.weight").then(|| {
                    let mut ne = t.ne.clone();
                    ne[2] -= 1;
                    vec![(t.name.clone(), ne, t.ggml_type, data[..data.len() / n * (n - 1)].to_vec())]
                })
            }),
            Status::LLMRT_BAD_MODEL,
            "blk.1.ffn_down_exps.weight has shape".into(),
        ),
        (
            "missing",
            vec![],
            Box::new(|t: &TensorInfo, _: &[u8]| (t.name == "blk.0.ffn_gate_inp_shexp.weight").then(Vec::new)),
            Status::LLMRT_BAD_MODEL,
            "blk.0.ffn_gate_inp_shexp.weight is missing".into(),
        ),
        (
            "no-experts",
            vec![],
            Box::new(|t: &TensorInfo, _: &[u8]| t.name.starts_with("blk.0.ffn_up_exps").then(Vec::new)),
            Status::LLMRT_BAD_MODEL,
            "blk.0.ffn_up.0.weight is missing".into(),
        ),
    ];
    for (tag, set, edit, status, needle) in cases {
        let out = d.join(format!("{tag}.gguf"));
        let set: Vec<(&str, Value)> = set.iter().map(|(a, b)| (a.as_str(), b.clone())).collect();
        rewrite(&src, &out, &set, &*edit);
        let (s, msg) = try_load(&out, 1, 16 << 20).err().unwrap_or_else(|| panic!("{tag}: loaded"));
        assert_eq!(s, status, "{tag}: {msg}");
        assert!(msg.contains(&needle), "{tag}: {msg} (wanted {needle:?})");
        assert!(msg.contains(&out.display().to_string()), "{tag}: {msg} does not name the file");
    }
    let _ = std::fs::remove_dir_all(&d);
}
