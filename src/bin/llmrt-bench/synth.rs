//! Synthetic models of real shapes with random weights: written to a GGUF file
//! (`--synth`), or built in memory by every thread (`synth:SHAPE:TYPE`).

use crate::args::usage;
use llmrt::format::gguf::Value;
use llmrt::format::gguf_write::GgufWriter;
use llmrt::quant::{quantize_row, DType};
use llmrt::util::XorShift;
use std::path::{Path, PathBuf};

pub(crate) struct Shape {
    name: &'static str,
    /// GGUF architecture: `llama` (also Mixtral's experts), `gemma2` or `phi3`, with the
    /// tensors llama.cpp's converter writes for it.
    arch: &'static str,
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    pub(crate) ffn: usize,
    vocab: usize,
    ctx: usize,
    theta: f32,
    /// Mixture of experts (llama architecture, as llama.cpp writes Mixtral): experts and
    /// experts used per token, each `ffn` wide; (0, 0): dense.
    experts: (usize, usize),
    /// Per-head width when it is not `hidden / heads` (gemma2: 256), else 0.
    head_dim: usize,
    /// Sliding window of the windowed layers (gemma2: every other layer), else 0.
    window: usize,
    rms_eps: f32,
}

const TINYLLAMA: Shape = Shape {
    name: "tinyllama-1.1b",
    hidden: 2048,
    layers: 22,
    heads: 32,
    kv_heads: 4,
    ffn: 5632,
    vocab: 32000,
    // TinyLlama itself says 2048; 4096 lets the depth rows (pp512 / tg64 at depth
    // 2048, llama-bench's `-d`) fit in both tools' contexts. The weights are random.
    ctx: 4096,
    theta: 10000.0,
    experts: (0, 0),
    arch: "llama",
    head_dim: 0,
    window: 0,
    rms_eps: 1e-5,
};
const LLAMA3_8B: Shape = Shape {
    name: "llama3-8b",
    hidden: 4096,
    layers: 32,
    heads: 32,
    kv_heads: 8,
    ffn: 14336,
    vocab: 128256,
    ctx: 8192,
    theta: 500000.0,
    experts: (0, 0),
    arch: "llama",
    head_dim: 0,
    window: 0,
    rms_eps: 1e-5,
};
/// A small mixture of experts for decode's bytes per token: 32 experts of which 4 run
/// per token (1/8 of the expert bytes read at batch 1, as Qwen3-30B-A3B's 8 of 128 is 1/16).
const MOE_MINI: Shape = Shape {
    name: "moe-mini",
    hidden: 1024,
    layers: 8,
    heads: 16,
    kv_heads: 4,
    ffn: 512,
    vocab: 32000,
    ctx: 4096,
    theta: 1000000.0,
    experts: (32, 4),
    arch: "llama",
    head_dim: 0,
    window: 0,
    rms_eps: 1e-5,
};
/// Gemma 2 2B (google/gemma-2-2b's config): 256-wide heads, GeGLU, post-norms, logit
/// soft-capping, a 4096 window on alternate layers, the output tied to the embeddings
/// (as llama.cpp's converter writes it: no `output.weight`).
const GEMMA2_2B: Shape = Shape {
    name: "gemma2-2b",
    arch: "gemma2",
    hidden: 2304,
    layers: 26,
    heads: 8,
    kv_heads: 4,
    ffn: 9216,
    vocab: 256000,
    ctx: 8192,
    theta: 10000.0,
    experts: (0, 0),
    head_dim: 256,
    window: 4096,
    rms_eps: 1e-6,
};
/// Phi-3-mini-4k (microsoft/Phi-3-mini-4k-instruct's config, without its 2047 window):
/// fused QKV and gate/up tensors, as llama.cpp's converter writes them.
const PHI3_MINI: Shape = Shape {
    name: "phi3-mini",
    arch: "phi3",
    hidden: 3072,
    layers: 32,
    heads: 32,
    kv_heads: 32,
    ffn: 8192,
    vocab: 32064,
    ctx: 4096,
    theta: 10000.0,
    experts: (0, 0),
    head_dim: 0,
    window: 0,
    rms_eps: 1e-5,
};

impl Shape {
    /// Whether the file has its own `output.weight` (gemma2's output is the embeddings).
    pub(crate) fn untied(&self) -> bool {
        self.arch != "gemma2"
    }

    /// Per-head width: `head_dim` where the shape sets it, else `hidden / heads`.
    fn head_width(&self) -> usize {
        if self.head_dim > 0 {
            self.head_dim
        } else {
            self.hidden / self.heads
        }
    }
}

pub(crate) fn shape_of(name: &str) -> &'static Shape {
    match name {
        "tinyllama" | "tinyllama-1.1b" => &TINYLLAMA,
        "llama3-8b" | "llama-3-8b" | "llama3" => &LLAMA3_8B,
        "moe-mini" => &MOE_MINI,
        "gemma2-2b" | "gemma2" => &GEMMA2_2B,
        "phi3-mini" | "phi3" => &PHI3_MINI,
        _ => usage(),
    }
}

fn dtype_of(ty: &str) -> DType {
    match ty {
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        "q8_0" => DType::Q8_0,
        "q4_0" => DType::Q4_0,
        "f32" => DType::F32,
        _ => usage(),
    }
}

/// The GGUF of a synthetic model with every tensor streamed, and the tensors as
/// (name, ne0 = row length, rows; rows 0 for the F32 1-D norms).
fn synth_writer(s: &Shape, dt: DType) -> (GgufWriter, Vec<(String, u64, u64)>) {
    let hd = s.head_width();
    let a = s.arch;
    let key = |k: &str| format!("{a}.{k}");
    let mut g = GgufWriter::new();
    g.kv("general.architecture", Value::Str(a.into()));
    g.kv("general.name", Value::Str(format!("synthetic {} ({})", s.name, dt.name())));
    // ggml file types: 0 all F32, 1 mostly F16, 2 mostly Q4_0, 7 mostly Q8_0, 32 mostly BF16.
    let ftype = match dt {
        DType::F32 => 0u32,
        DType::F16 => 1,
        DType::Q4_0 => 2,
        DType::BF16 => 32,
        _ => 7,
    };
    g.kv("general.file_type", Value::U32(ftype));
    g.kv(&key("context_length"), Value::U32(s.ctx as u32));
    g.kv(&key("embedding_length"), Value::U32(s.hidden as u32));
    g.kv(&key("block_count"), Value::U32(s.layers as u32));
    g.kv(&key("feed_forward_length"), Value::U32(s.ffn as u32));
    g.kv(&key("rope.dimension_count"), Value::U32(hd as u32));
    g.kv(&key("attention.head_count"), Value::U32(s.heads as u32));
    g.kv(&key("attention.head_count_kv"), Value::U32(s.kv_heads as u32));
    g.kv(&key("attention.layer_norm_rms_epsilon"), Value::F32(s.rms_eps));
    g.kv(&key("rope.freq_base"), Value::F32(s.theta));
    if s.head_dim > 0 {
        g.kv(&key("attention.key_length"), Value::U32(hd as u32));
        g.kv(&key("attention.value_length"), Value::U32(hd as u32));
    }
    if s.window > 0 {
        g.kv(&key("attention.sliding_window"), Value::U32(s.window as u32));
    }
    if a == "gemma2" {
        g.kv(&key("attn_logit_softcapping"), Value::F32(50.0));
        g.kv(&key("final_logit_softcapping"), Value::F32(30.0));
    }
    if a == "llama" {
        g.kv(&key("vocab_size"), Value::U32(s.vocab as u32));
    }
    if s.experts.0 > 0 {
        g.kv(&key("expert_count"), Value::U32(s.experts.0 as u32));
        g.kv(&key("expert_used_count"), Value::U32(s.experts.1 as u32));
    }
    // A minimal SentencePiece vocabulary of the right size: <unk> <s> </s>, the
    // 256 byte tokens (llama.cpp looks up <0x0A>), then placeholders.
    let mut tokens = vec![Value::Str("<unk>".into()), Value::Str("<s>".into()), Value::Str("</s>".into())];
    let mut types = vec![Value::I32(2), Value::I32(3), Value::I32(3)];
    for b in 0..256 {
        tokens.push(Value::Str(format!("<0x{b:02X}>")));
        types.push(Value::I32(6));
    }
    let mut i = 0;
    while tokens.len() < s.vocab {
        tokens.push(Value::Str(format!("\u{2581}t{i}")));
        types.push(Value::I32(1));
        i += 1;
    }
    if a == "phi3" {
        // Phi-3's end-of-text token where its vocabulary has it (after Llama's 32000):
        // llama.cpp looks it up by name in any model named phi3.
        let at = 32000.min(s.vocab - 1);
        tokens[at] = Value::Str("<|endoftext|>".into());
        types[at] = Value::I32(3);
    }
    let scores = (0..s.vocab).map(|i| Value::F32(-(i as f32))).collect();
    g.kv("tokenizer.ggml.model", Value::Str("llama".into()));
    g.kv("tokenizer.ggml.tokens", Value::Array(tokens));
    g.kv("tokenizer.ggml.scores", Value::Array(scores));
    g.kv("tokenizer.ggml.token_type", Value::Array(types));
    g.kv("tokenizer.ggml.bos_token_id", Value::U32(1));
    g.kv("tokenizer.ggml.eos_token_id", Value::U32(2));
    g.kv("tokenizer.ggml.unknown_token_id", Value::U32(0));

    // (name, ne0 = row length, rows); 1-D tensors (norms) are F32.
    let (h, qd, kvd) = (s.hidden as u64, (s.heads * hd) as u64, (s.kv_heads * hd) as u64);
    let (gemma, phi3) = (a == "gemma2", a == "phi3");
    let mut mats: Vec<(String, u64, u64)> = vec![("token_embd.weight".into(), h, s.vocab as u64)];
    for l in 0..s.layers {
        mats.push((format!("blk.{l}.attn_norm.weight"), h, 0));
        if phi3 {
            mats.push((format!("blk.{l}.attn_qkv.weight"), h, qd + 2 * kvd));
        } else {
            mats.push((format!("blk.{l}.attn_q.weight"), h, qd));
            mats.push((format!("blk.{l}.attn_k.weight"), h, kvd));
            mats.push((format!("blk.{l}.attn_v.weight"), h, kvd));
        }
        mats.push((format!("blk.{l}.attn_output.weight"), qd, h));
        if gemma {
            mats.push((format!("blk.{l}.post_attention_norm.weight"), h, 0));
        }
        mats.push((format!("blk.{l}.ffn_norm.weight"), h, 0));
        let e = s.experts.0 as u64;
        if e > 0 {
            // Stacked experts: `rows` counts every expert's rows (ne [n0, rows / e, e]).
            mats.push((format!("blk.{l}.ffn_gate_inp.weight"), h, e));
            mats.push((format!("blk.{l}.ffn_gate_exps.weight"), h, s.ffn as u64 * e));
            mats.push((format!("blk.{l}.ffn_up_exps.weight"), h, s.ffn as u64 * e));
            mats.push((format!("blk.{l}.ffn_down_exps.weight"), s.ffn as u64, h * e));
        } else if phi3 {
            // Gate and up in one tensor, gate first (llama.cpp's `ffn_up`, 2 x ffn rows).
            mats.push((format!("blk.{l}.ffn_up.weight"), h, 2 * s.ffn as u64));
            mats.push((format!("blk.{l}.ffn_down.weight"), s.ffn as u64, h));
        } else {
            mats.push((format!("blk.{l}.ffn_gate.weight"), h, s.ffn as u64));
            mats.push((format!("blk.{l}.ffn_up.weight"), h, s.ffn as u64));
            mats.push((format!("blk.{l}.ffn_down.weight"), s.ffn as u64, h));
        }
        if gemma {
            mats.push((format!("blk.{l}.post_ffw_norm.weight"), h, 0));
        }
    }
    mats.push(("output_norm.weight".into(), h, 0));
    if s.untied() {
        mats.push(("output.weight".into(), h, s.vocab as u64));
    }
    for (name, n0, rows) in &mats {
        if *rows == 0 {
            g.tensor_streamed(name, &[*n0], DType::F32);
        } else if name.ends_with("_exps.weight") {
            let e = s.experts.0 as u64;
            g.tensor_streamed(name, &[*n0, *rows / e, e], dt);
        } else {
            g.tensor_streamed(name, &[*n0, *rows], dt);
        }
    }
    (g, mats)
}

pub(crate) fn synth(shape_name: &str, ty: &str, dir: &Path) -> std::io::Result<PathBuf> {
    let s = shape_of(shape_name);
    let dt = dtype_of(ty);
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{}-{}.gguf", s.name, ty));
    let (g, mats) = synth_writer(s, dt);
    let mut rng = XorShift::new(0x1234_5678_9ABC_DEF1);
    g.write_streamed(&path, |i, out| {
        let (_, n0, rows) = &mats[i];
        let n0 = *n0 as usize;
        if *rows == 0 {
            let v: Vec<u8> = (0..n0).flat_map(|_| (1.0 + 0.1 * rng.normal()).to_le_bytes()).collect();
            return out.write_all(&v);
        }
        let scale = 1.0 / (n0 as f32).sqrt();
        let rb = dt.row_bytes(n0).expect("row length");
        let mut x = vec![0f32; n0];
        let mut buf = vec![0u8; rb];
        for _ in 0..*rows {
            for v in x.iter_mut() {
                *v = rng.normal() * scale;
            }
            quantize_row(dt, &x, &mut buf);
            out.write_all(&buf)?;
        }
        Ok(())
    })?;
    Ok(path)
}

/// Fills `out` (whole rows of `dt`, rows of `n0` elements) with random weights of
/// magnitude about `1 / sqrt(n0)`, fast: random bits shaped into valid values, not
/// a distribution (F16, BF16: random sign and mantissa under a fixed exponent; Q8_0/Q4_0:
/// random quants under a fixed scale; F32: uniform).
fn fill_random(dt: DType, n0: usize, out: &mut [u8], seed: u64) {
    let mut r = XorShift::new(seed | 1);
    let target = 1.0 / (n0 as f64).sqrt();
    match dt {
        DType::F16 | DType::BF16 => {
            // Exponent bias, largest exponent used, mantissa bits: |v| in [2^(e-bias),
            // 2^(e-bias+1)), mean about 1.5 * 2^(e-bias).
            let (bias, top, mant) = if dt == DType::F16 { (15.0, 29.0, 10) } else { (127.0, 254.0, 7) };
            let e = (bias + (target / 1.5).log2().round()).clamp(1.0, top) as u64;
            let lanes = 0x0001_0001_0001_0001u64;
            let (pat, keep) = ((e << mant) * lanes, (0x8000 | ((1 << mant) - 1)) * lanes);
            let mut ch = out.chunks_exact_mut(8);
            for c in &mut ch {
                c.copy_from_slice(&((r.next_u64() & keep) | pat).to_le_bytes());
            }
            for b in ch.into_remainder() {
                *b = 0;
            }
        }
        DType::Q8_0 | DType::Q4_0 => {
            let (bb, std) = if dt == DType::Q8_0 { (34, 74.0) } else { (18, 4.6) };
            let d = half::f16::from_f64(target / std).to_le_bytes();
            for blk in out.chunks_exact_mut(bb) {
                blk[..2].copy_from_slice(&d);
                for c in blk[2..].chunks_mut(8) {
                    let v = r.next_u64().to_le_bytes();
                    c.copy_from_slice(&v[..c.len()]);
                }
            }
        }
        _ => {
            for c in out.chunks_exact_mut(4) {
                let u = (r.next_u64() >> 40) as f64 / (1u64 << 24) as f64 - 0.5;
                c.copy_from_slice(&((u * 3.4 * target) as f32).to_le_bytes());
            }
        }
    }
}

/// A synthetic model of `shape_name` in `ty` as GGUF bytes built in memory, every
/// thread filling its share of each tensor.
pub(crate) fn synth_bytes(shape_name: &str, ty: &str) -> Vec<u8> {
    synth_bytes_of(shape_of(shape_name), dtype_of(ty))
}

fn synth_bytes_of(s: &Shape, dt: DType) -> Vec<u8> {
    let (g, mats) = synth_writer(s, dt);
    let (header, ranges) = g.streamed_layout();
    let total = ranges.last().map_or(header.len() as u64, |(o, l)| o + l) as usize;
    let mut bytes = vec![0u8; total];
    bytes[..header.len()].copy_from_slice(&header);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    // Split the buffer into the tensors' slices (in file order), then each slice into
    // whole-row chunks handed to the threads.
    let mut jobs: Vec<(DType, usize, &mut [u8], u64)> = Vec::new();
    let mut rest: &mut [u8] = &mut bytes;
    let mut at = 0u64;
    for (i, ((_, n0, rows), (off, len))) in mats.iter().zip(&ranges).enumerate() {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut((off - at) as usize);
        let (t, tail) = tail.split_at_mut(*len as usize);
        rest = tail;
        at = off + len;
        let n0 = *n0 as usize;
        if *rows == 0 {
            for c in t.chunks_exact_mut(4) {
                c.copy_from_slice(&1.0f32.to_le_bytes());
            }
            continue;
        }
        let rb = dt.row_bytes(n0).expect("row length");
        let rows_per = (*rows as usize).div_ceil(threads * 4).max(1);
        for (k, c) in t.chunks_mut(rb * rows_per).enumerate() {
            jobs.push((dt, n0, c, 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(((i as u64) << 20) | (k as u64 + 1))));
        }
    }
    let per = jobs.len().div_ceil(threads);
    std::thread::scope(|sc| {
        let mut jobs = jobs;
        while !jobs.is_empty() {
            let take = per.min(jobs.len());
            let mine: Vec<_> = jobs.drain(..take).collect();
            sc.spawn(move || {
                for (dt, n0, c, seed) in mine {
                    fill_random(dt, n0, c, seed);
                }
            });
        }
    });
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use llmrt::runtime::{LoadOptions, Model};

    /// Each architecture's writer, on a miniature of its shape, makes a file that loads
    /// as that architecture with those dimensions and runs: a prefill longer than the
    /// window gives finite logits that differ between tokens (gemma2's within its
    /// final soft-cap of 30).
    #[test]
    fn every_shape_writes_a_model_of_its_architecture_that_runs() {
        // Hidden 64, 2 layers, a vocabulary of 300, the architecture's own choices kept.
        let mini = |s: Shape, heads: usize, kv_heads: usize| Shape {
            hidden: 64,
            layers: 2,
            heads,
            kv_heads,
            ffn: 128,
            vocab: 300,
            ctx: 64,
            ..s
        };
        let minis = [
            mini(TINYLLAMA, 4, 2),
            Shape { ffn: 64, ..mini(MOE_MINI, 4, 2) },
            Shape { head_dim: 48, window: 4, ..mini(GEMMA2_2B, 2, 1) },
            mini(PHI3_MINI, 2, 2),
        ];
        for s in &minis {
            for dt in [DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0] {
                let bytes = synth_bytes_of(s, dt);
                let what = format!("{} {}", s.arch, dt.name());
                let m = Model::load_gguf_bytes(bytes, &what, LoadOptions::default()).expect(&what);
                let info = m.info();
                let hd = s.head_width();
                assert_eq!(info.architecture, s.arch, "{what}");
                assert_eq!(
                    (info.hidden_size, info.n_heads, info.n_kv_heads, info.head_dim, info.n_layers, info.vocab_size),
                    (64, s.heads as u32, s.kv_heads as u32, hd as u32, 2, 300),
                    "{what}"
                );
                assert_eq!(
                    info.experts.map(|(n, k, _)| (n as usize, k as usize)),
                    (s.experts.0 > 0).then_some(s.experts),
                    "{what}"
                );
                let c = m.cache_reserve(16).expect(&what);
                let mut logits = vec![0f32; 8 * 300];
                let toks: Vec<u32> = (0..8).map(|i| 3 + 37 * i).collect();
                m.prefill(c, &toks, Some(&mut logits), true).expect(&what);
                assert!(logits.iter().all(|v| v.is_finite()), "{what}");
                assert!(logits.chunks(300).any(|r| r != &logits[..300]), "{what}: every row alike");
                if s.arch == "gemma2" {
                    assert!(logits.iter().all(|v| v.abs() <= 30.0), "{what}: logits above the soft-cap");
                }
            }
        }
    }
}
