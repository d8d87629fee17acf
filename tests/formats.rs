//! Tensor types and file checks on files derived from a fixture: every matrix
//! re-stored as Q4_0 or BF16 must give the logits of an F32 file holding exactly
//! the dequantized values (so the typed dot products equal exact dequantization),
//! and inconsistent files are refused with the tensor named.
mod common;
use common::*;
use llmrt::format::gguf::{Gguf, Value};
use llmrt::format::gguf_write::GgufWriter;
use llmrt::quant::{self, DType};
use llmrt::Status;
use std::path::{Path, PathBuf};

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("llmrt-formats-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Rewrites `src` through `f(name, ne, dtype, data) -> (dtype, data)` per tensor, and
/// `meta(key, value) -> Option<value>` per metadata entry.
fn rewrite(
    src: &Path,
    dst: &Path,
    meta: impl Fn(&str, &Value) -> Option<Value>,
    f: impl Fn(&str, &[u64], DType, &[u8]) -> Option<(u32, Vec<u8>)>,
) {
    let g = Gguf::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in &g.metadata() {
        if k == "general.alignment" {
            continue;
        }
        if let Some(v) = meta(k, v) {
            w.kv(k, v);
        }
    }
    for t in &g.tensors {
        let dt = t.dtype.unwrap();
        if let Some((ty, data)) = f(&t.name, &t.ne, dt, g.tensor_data(t)) {
            w.tensor_raw(&t.name, &t.ne, ty, data);
        }
    }
    w.write(dst).unwrap();
}

fn dequant(dt: DType, data: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    quant::dequantize_row(dt, data, &mut out);
    out
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn base() -> (Fixture, PathBuf) {
    let f = Fixture::all().into_iter().find(|f| f.name == "llama_gqa").expect("fixture llama_gqa");
    let p = f.gguf("f32");
    (f, p)
}

/// Re-stores every matrix as `ty`; writes the quantized file and its exact F32 twin.
fn quantized_pair(ty: DType, tag: &str) -> (PathBuf, PathBuf) {
    let (_, src) = base();
    let dir = tmpdir(tag);
    let (q, twin) = (dir.join("q.gguf"), dir.join("twin.gguf"));
    let convert = |ne: &[u64], data: &[u8]| -> Vec<u8> {
        let cols = ne[0] as usize;
        let rows = data.len() / 4 / cols;
        let mut out = vec![0u8; rows * ty.row_bytes(cols).unwrap()];
        let rb = ty.row_bytes(cols).unwrap();
        for r in 0..rows {
            let row = dequant(DType::F32, &data[r * cols * 4..(r + 1) * cols * 4], cols);
            quant::quantize_row(ty, &row, &mut out[r * rb..(r + 1) * rb]);
        }
        out
    };
    rewrite(
        &src,
        &q,
        |_, v| Some(v.clone()),
        |_, ne, dt, data| {
            if ne.len() == 2 {
                Some((ty.ggml_id(), convert(ne, data)))
            } else {
                Some((dt.ggml_id(), data.to_vec()))
            }
        },
    );
    rewrite(
        &src,
        &twin,
        |_, v| Some(v.clone()),
        |_, ne, dt, data| {
            if ne.len() == 2 {
                let qd = convert(ne, data);
                let n = (ne[0] * ne[1]) as usize;
                Some((DType::F32.ggml_id(), f32_bytes(&dequant(ty, &qd, n))))
            } else {
                Some((dt.ggml_id(), data.to_vec()))
            }
        },
    );
    (q, twin)
}

fn assert_same_logits(a: &Path, b: &Path, bound: f64, tag: &str) {
    let (f, _) = base();
    let (ma, mb) = (load(a), load(b));
    let la = ma.prefill_all(ma.reserve(0), &f.tokens);
    let lb = mb.prefill_all(mb.reserve(0), &f.tokens);
    let mut worst = 0f64;
    for (x, y) in la.chunks_exact(f.vocab).zip(lb.chunks_exact(f.vocab)) {
        worst = worst.max(rel_l2(x, y));
    }
    println!("{tag}: worst row relative L2 vs exact-dequantized F32 twin {worst:.3e}");
    assert!(worst < bound, "{tag}: {worst:.3e} >= {bound:.0e}");
    // and the quantized file is really different from the original weights
    let orig = load(&f.gguf("f32"));
    let lo = orig.prefill_all(orig.reserve(0), &f.tokens);
    assert!(rel_l2(&la, &lo) > 1e-6, "{tag}: file did not change the weights");
}

#[test]
fn q4_0_matrices_equal_their_exact_dequantization() {
    // The CPU kernels multiply quantized weights with activations quantized to 8
    // bits (as llama.cpp does), so an F32 twin no longer gives the same logits.
    // A Q4_0 block is exactly a Q8_0 block with the same f16 scale and values
    // q - 8; that twin runs the same activation quantization and integer dot
    // product, so exact decoding shows as (bit-)identical logits.
    let (q, _) = quantized_pair(DType::Q4_0, "q4_0");
    let twin = q.with_file_name("q8_twin.gguf");
    rewrite(
        &q,
        &twin,
        |_, v| Some(v.clone()),
        |_, _, dt, data| {
            if dt != DType::Q4_0 {
                return Some((dt.ggml_id(), data.to_vec()));
            }
            let mut out = Vec::with_capacity(data.len() / 18 * 34);
            for b in data.chunks_exact(18) {
                out.extend_from_slice(&b[..2]);
                out.extend(b[2..].iter().map(|&x| ((x & 0x0F) as i8 - 8) as u8));
                out.extend(b[2..].iter().map(|&x| ((x >> 4) as i8 - 8) as u8));
            }
            Some((DType::Q8_0.ggml_id(), out))
        },
    );
    assert_same_logits(&q, &twin, 1e-5, "Q4_0");
}

#[test]
fn bf16_matrices_equal_their_exact_dequantization() {
    let (q, twin) = quantized_pair(DType::BF16, "bf16");
    assert_same_logits(&q, &twin, 1e-5, "BF16");
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let (f, src) = base();
    let runs: Vec<Vec<f32>> = [1u32, 2, 3]
        .iter()
        .map(|&t| {
            let m = try_load(&src, t, 0).unwrap();
            let c = m.reserve(0);
            let mut out = m.prefill_all(c, &f.tokens);
            out.extend(m.decode(&[c], &[5]));
            out
        })
        .collect();
    assert_eq!(runs[0], runs[1]);
    assert_eq!(runs[0], runs[2]);
}

fn load_err(p: &Path) -> (Status, String) {
    match try_load(p, 1, 0) {
        Ok(_) => panic!("{} loaded but should not", p.display()),
        Err(e) => e,
    }
}

#[test]
fn unsupported_tensor_type_is_named() {
    let (_, src) = base();
    let dst = tmpdir("q81").join("m.gguf");
    // Q8_1 (ggml type 9, ggml's activation type): 36-byte blocks of 32, never a weight.
    rewrite(
        &src,
        &dst,
        |_, v| Some(v.clone()),
        |name, ne, dt, data| {
            if name == "blk.1.ffn_up.weight" {
                let blocks = (ne[0] * ne[1] / 32) as usize;
                Some((9, vec![0u8; blocks * 36]))
            } else {
                Some((dt.ggml_id(), data.to_vec()))
            }
        },
    );
    let (s, msg) = load_err(&dst);
    assert_eq!(s, Status::LLMRT_UNSUPPORTED, "{msg}");
    assert!(msg.contains("blk.1.ffn_up.weight") && msg.contains("Q8_1"), "{msg}");
}

#[test]
fn inconsistent_files_name_the_tensor_or_key() {
    let (_, src) = base();
    let dir = tmpdir("bad");
    // A matrix of the wrong shape.
    let p = dir.join("shape.gguf");
    // 64 x 16 instead of 64 x 32: data and shape agree, the hyperparameters do not.
    let g = Gguf::open(&src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in &g.metadata() {
        w.kv(k, v.clone());
    }
    for t in &g.tensors {
        let d = g.tensor_data(t);
        if t.name == "blk.0.attn_k.weight" {
            w.tensor(&t.name, &[t.ne[0], 16], DType::F32, d[..(t.ne[0] as usize * 16 * 4)].to_vec());
        } else {
            w.tensor(&t.name, &t.ne, t.dtype.unwrap(), d.to_vec());
        }
    }
    w.write(&p).unwrap();
    let (s, msg) = load_err(&p);
    assert_eq!(s, Status::LLMRT_BAD_MODEL, "{msg}");
    assert!(msg.contains("blk.0.attn_k.weight"), "{msg}");

    // A missing tensor.
    let p = dir.join("missing.gguf");
    rewrite(
        &src,
        &p,
        |_, v| Some(v.clone()),
        |name, _, dt, data| (name != "blk.1.ffn_norm.weight").then(|| (dt.ggml_id(), data.to_vec())),
    );
    let (s, msg) = load_err(&p);
    assert_eq!(s, Status::LLMRT_BAD_MODEL, "{msg}");
    assert!(msg.contains("blk.1.ffn_norm.weight") && msg.contains("missing"), "{msg}");

    // A missing hyperparameter.
    let p = dir.join("nokey.gguf");
    rewrite(
        &src,
        &p,
        |k, v| (k != "llama.block_count").then(|| v.clone()),
        |_, _, dt, data| Some((dt.ggml_id(), data.to_vec())),
    );
    let (s, msg) = load_err(&p);
    assert_eq!(s, Status::LLMRT_BAD_MODEL, "{msg}");
    assert!(msg.contains("llama.block_count"), "{msg}");

    // An unknown architecture.
    let p = dir.join("arch.gguf");
    rewrite(
        &src,
        &p,
        |k, v| Some(if k == "general.architecture" { Value::Str("gpt-neox".into()) } else { v.clone() }),
        |_, _, dt, data| Some((dt.ggml_id(), data.to_vec())),
    );
    let (s, msg) = load_err(&p);
    assert_eq!(s, Status::LLMRT_UNSUPPORTED, "{msg}");
    assert!(msg.contains("gpt-neox"), "{msg}");
}
