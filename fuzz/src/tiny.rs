//! A tiny valid GGUF model as an editable structure (metadata list, tensor list),
//! and a serializer that writes whatever the structure holds: tensor offsets may be
//! overridden, arrays may mix element types, counts and version may lie. The
//! structure-aware fuzz target edits a `Spec` and loads `Spec::to_bytes()`.
//!
//! The base models: 1 layer, context 64, vocab 64, in two shapes: [`SMALL`] (hidden 32,
//! 4 heads / 2 KV heads of 8, FFN 64) and [`WIDE`] (hidden 256, 4 / 2 heads of 64,
//! FFN 256: every matrix row 256 long, as the K-quants and IQ4_XS need);
//! llama, qwen2 (Q/K/V biases), qwen3 (Q/K norms), or the mixtures of experts mixtral
//! (llama with 3 experts, 2 per token, stacked `ffn_*_exps`) and qwen2moe (plus the
//! shared expert and its gate); matrices in any supported type,
//! per tensor as llama-quantize's file types mix them ([`FileType`], [`Types`]); a
//! SentencePiece (`llama`) or byte-level BPE (`gpt2`) tokenizer. Only llmrt, `half`
//! and std are used (the main crate's tests include this file too).
#![allow(dead_code)]

use llmrt::format::gguf::Value;
use llmrt::quant::DType;

/// The small shape's sizes (also [`SMALL`]).
pub const VOCAB: u64 = 64;
pub const HIDDEN: u64 = 32;
pub const HEADS: u64 = 4;
pub const KV_HEADS: u64 = 2;
pub const HEAD_DIM: u64 = 8;
pub const FFN: u64 = 64;

/// A base model's sizes (the vocabulary is [`VOCAB`] in both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub ffn: u64,
}

/// Rows of 32 and 64: every type with 32-element blocks fits; K-quants do not.
pub const SMALL: Shape = Shape { hidden: HIDDEN, heads: HEADS, kv_heads: KV_HEADS, head_dim: HEAD_DIM, ffn: FFN };
/// Rows of 256 (the least a K-quant row can be): every supported type fits. The
/// smallest such model (425,984 weights), as a step of the instrumented fuzz build
/// costs about a millisecond per 50,000 quantized weights (FFN 512 would make it
/// 40% slower; the small shape, whose FFN differs from hidden, shows a transposed
/// matrix).
pub const WIDE: Shape = Shape { hidden: 256, heads: 4, kv_heads: 2, head_dim: 64, ffn: 256 };

/// The type of each matrix of the base model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Types {
    pub embd: DType,
    /// `output.weight`; unused when the model is tied (the embedding is the LM head).
    pub output: DType,
    pub q: DType,
    pub k: DType,
    pub v: DType,
    pub attn_out: DType,
    pub gate: DType,
    pub up: DType,
    pub down: DType,
}

/// llama-quantize's file types (and the float ones), as it writes them for a
/// one-layer model with 2 query heads per KV head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum FileType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    IQ4_NL,
    Q2_K,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
    IQ4_XS,
}

impl FileType {
    pub fn all() -> [FileType; 19] {
        use FileType::*;
        [
            F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S,
            Q5_K_M, Q6_K, IQ4_XS,
        ]
    }
}

/// The type llama-quantize falls back to for a tensor whose rows are not a multiple
/// of `dt`'s block (it keeps 32-element blocks; the K-quants need 256).
pub fn fallback(dt: DType, cols: u64) -> DType {
    if cols.is_multiple_of(dt.block_elems() as u64) {
        return dt;
    }
    match dt {
        DType::Q4_K => DType::Q5_0,
        DType::Q5_K => DType::Q5_1,
        DType::Q6_K => DType::Q8_0,
        // Q2_K, Q3_K, IQ4_XS
        _ => DType::IQ4_NL,
    }
}

impl Types {
    /// Every matrix `dt`.
    pub fn uniform(dt: DType) -> Types {
        Types { embd: dt, output: dt, q: dt, k: dt, v: dt, attn_out: dt, gate: dt, up: dt, down: dt }
    }

    /// What llama-quantize writes for file type `ft` (one layer, GQA 2): the main
    /// type everywhere, `output.weight` Q6_K (but for the float types and Q8_0; a
    /// tied embedding is the output and takes its type), more bits for attn_v,
    /// ffn_down and attn_output in the mixed K-quant types.
    pub fn file_type(ft: FileType, tied: bool) -> Types {
        use DType as D;
        use FileType as F;
        let main = match ft {
            F::F32 => D::F32,
            F::F16 => D::F16,
            F::BF16 => D::BF16,
            F::Q8_0 => D::Q8_0,
            F::Q4_0 => D::Q4_0,
            F::Q4_1 => D::Q4_1,
            F::Q5_0 => D::Q5_0,
            F::Q5_1 => D::Q5_1,
            F::IQ4_NL => D::IQ4_NL,
            F::Q2_K => D::Q2_K,
            F::Q3_K_S | F::Q3_K_M | F::Q3_K_L => D::Q3_K,
            F::Q4_K_S | F::Q4_K_M => D::Q4_K,
            F::Q5_K_S | F::Q5_K_M => D::Q5_K,
            F::Q6_K => D::Q6_K,
            F::IQ4_XS => D::IQ4_XS,
        };
        let output = match ft {
            F::F32 | F::F16 | F::BF16 | F::Q8_0 => main,
            _ => D::Q6_K,
        };
        let v = match ft {
            F::Q2_K => D::Q3_K,
            F::Q3_K_M | F::Q3_K_L | F::Q4_K_S => D::Q5_K,
            F::Q4_K_M | F::Q5_K_M => D::Q6_K,
            _ => main,
        };
        let down = match ft {
            F::Q2_K => D::Q3_K,
            F::Q3_K_M => D::Q4_K,
            F::Q3_K_L => D::Q5_K,
            F::Q4_K_M | F::Q5_K_M => D::Q6_K,
            _ => main,
        };
        let attn_out = match ft {
            F::Q2_K => D::Q3_K,
            F::Q3_K_M => D::Q4_K,
            F::Q3_K_L => D::Q5_K,
            _ => main,
        };
        let embd = if tied { output } else { main };
        Types { embd, output, q: main, k: main, v, attn_out, gate: main, up: main, down }
    }
}

#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    pub ne: Vec<u64>,
    pub ggml_type: u32,
    pub data: Vec<u8>,
    /// Data offset written into the tensor table; `None`: where the data is placed.
    pub offset: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct Spec {
    pub version: u32,
    /// Alignment the data is laid out with (the metadata key is separate).
    pub layout_alignment: u64,
    pub kvs: Vec<(String, Value)>,
    pub tensors: Vec<TensorSpec>,
    /// Counts written into the header instead of the true ones.
    pub n_tensors_override: Option<u64>,
    pub n_kv_override: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    /// llama with [`EXPERTS`] experts, [`EXPERTS_USED`] per token (as llama.cpp writes Mixtral).
    Mixtral,
    /// qwen2moe: experts, a shared expert and its gate, Q/K/V biases.
    Qwen2Moe,
}

/// The MoE bases' experts (each `ffn` wide) and experts used per token.
pub const EXPERTS: u64 = 3;
pub const EXPERTS_USED: u64 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokKind {
    Spm,
    /// Byte-level BPE with this `tokenizer.ggml.pre`.
    Gpt2(&'static str),
    None,
}

/// Deterministic small pseudo-random numbers for weights.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.5
    }

    /// `n` more random bytes, eight per step (the wide base's quantized matrices are
    /// hundreds of kilobytes, made anew for every fuzz input).
    fn bytes(&mut self, out: &mut Vec<u8>, n: usize) {
        let start = out.len();
        out.resize(start + n, 0);
        for c in out[start..].chunks_mut(8) {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            c.copy_from_slice(&self.0.to_le_bytes()[..c.len()]);
        }
    }
}

/// `n` elements of `dtype` (n a multiple of the block size for quantized types):
/// small random floats, or valid quantized blocks.
pub fn tensor_bytes(dtype: DType, n: usize, rng_seed: u64) -> Vec<u8> {
    let mut r = Lcg(rng_seed);
    let mut out = vec![0u8; dtype.row_bytes(n - n % dtype.block_elems()).unwrap_or(0)];
    match dtype {
        DType::F32 => out.chunks_exact_mut(4).for_each(|c| c.copy_from_slice(&r.next().to_le_bytes())),
        DType::F16 => {
            out.chunks_exact_mut(2).for_each(|c| c.copy_from_slice(&half::f16::from_f32(r.next()).to_le_bytes()))
        }
        DType::BF16 => {
            out.chunks_exact_mut(2).for_each(|c| c.copy_from_slice(&half::bf16::from_f32(r.next()).to_le_bytes()))
        }
        // The quantized types: random bytes (any bytes are a valid block: quants,
        // sub-block scales and mins are small integers), then each block's f16 scale
        // fields set to small finite values (random f16 bits could be NaN or inf).
        dt => {
            out.clear();
            r.bytes(&mut out, n / dt.block_elems() * dt.block_bytes());
            for block in out.chunks_exact_mut(dt.block_bytes()) {
                for &o in dt.f16_scale_offsets() {
                    let v = half::f16::from_f32(0.004 + r.next().abs() * 0.01).to_le_bytes();
                    block[o..o + 2].copy_from_slice(&v);
                }
            }
        }
    }
    out
}

/// Tensors of at least this many elements are made once per (type, size, seed)
/// and kept ([`tensor_bytes_kept`]).
const KEEP_ELEMS: usize = 4096;

thread_local! {
    /// Made tensors: the wide base's are hundreds of kilobytes, and making them in
    /// the coverage-instrumented fuzz build cost more than a load and the steps.
    static KEPT: std::cell::RefCell<std::collections::HashMap<(DType, usize, u64), Vec<u8>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// [`tensor_bytes`], kept for large tensors (a pure cache: the bytes are a function
/// of the arguments; at most 512 kept, all dropped when full).
pub fn tensor_bytes_kept(dtype: DType, n: usize, rng_seed: u64) -> Vec<u8> {
    if n < KEEP_ELEMS {
        return tensor_bytes(dtype, n, rng_seed);
    }
    KEPT.with(|k| {
        let mut k = k.borrow_mut();
        if let Some(d) = k.get(&(dtype, n, rng_seed)) {
            return d.clone();
        }
        if k.len() >= 512 {
            k.clear();
        }
        let d = tensor_bytes(dtype, n, rng_seed);
        k.insert((dtype, n, rng_seed), d.clone());
        d
    })
}

fn spm_vocab() -> (Vec<String>, Vec<f32>, Vec<i32>) {
    let mut toks: Vec<(String, i32)> = vec![("<unk>".into(), 2), ("<s>".into(), 3), ("</s>".into(), 3)];
    for b in [0x0Au8, 0x20, 0x21, 0x2E, 0xC3, 0xA9, 0xE2, 0xF0] {
        toks.push((format!("<0x{b:02X}>"), 6));
    }
    toks.push(("<|user|>".into(), 4));
    toks.push(("\u{2581}".into(), 1));
    for c in 'a'..='z' {
        toks.push((c.to_string(), 1));
    }
    for p in [
        "\u{2581}t",
        "\u{2581}a",
        "th",
        "he",
        "in",
        "er",
        "an",
        "\u{2581}th",
        "\u{2581}the",
        "on",
        "re",
        "at",
        "\u{2581}H",
        "H",
        "i",
        "\u{2581}Hi",
        "or",
        "ld",
        "\u{2581}w",
        "\u{2581}wor",
        "\u{2581}world",
    ] {
        if toks.len() < VOCAB as usize && !toks.iter().any(|(t, _)| t == p) {
            toks.push((p.into(), 1));
        }
    }
    while toks.len() < VOCAB as usize {
        let k = toks.len();
        toks.push((format!("x{k}"), 5));
    }
    let scores = (0..toks.len()).map(|i| -(i as f32)).collect();
    let types = toks.iter().map(|t| t.1).collect();
    (toks.into_iter().map(|t| t.0).collect(), scores, types)
}

fn gpt2_vocab() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut toks: Vec<String> = vec!["<|endoftext|>".into()];
    let mut types = vec![3];
    for c in ('a'..='z').chain("HW!.,'0123456789\u{120}\u{10A}".chars()) {
        toks.push(c.to_string());
        types.push(1);
    }
    let mut merges = Vec::new();
    for (a, b) in [
        ("\u{120}", "t"),
        ("h", "e"),
        ("\u{120}t", "he"),
        ("i", "n"),
        ("a", "n"),
        ("e", "r"),
        ("o", "n"),
        ("\u{120}", "w"),
        ("o", "r"),
        ("\u{120}w", "or"),
        ("l", "d"),
        ("\u{120}wor", "ld"),
        ("H", "i"),
        ("'", "s"),
        ("\u{120}", "a"),
        ("r", "e"),
        ("a", "t"),
        ("\u{10A}", "\u{10A}"),
        ("1", "2"),
        ("\u{120}", "\u{120}"),
    ] {
        let m = format!("{a}{b}");
        if toks.len() >= VOCAB as usize {
            break;
        }
        if !toks.contains(&m) {
            toks.push(m);
            types.push(1);
        }
        merges.push(format!("{a} {b}"));
    }
    while toks.len() < VOCAB as usize {
        let k = toks.len();
        toks.push(format!("<|extra_{k}|>"));
        types.push(4);
    }
    (toks, types, merges)
}

fn strs(v: Vec<String>) -> Value {
    Value::Array(v.into_iter().map(Value::Str).collect())
}

impl Spec {
    /// The valid small base model, every matrix `mat` (a type whose blocks do not fit
    /// a row falls back as llama-quantize does: [`fallback`]).
    pub fn tiny(arch: Arch, tok: TokKind, mat: DType, tied: bool, seed: u64) -> Spec {
        Spec::build(SMALL, arch, tok, Types::uniform(mat), tied, seed)
    }

    /// A valid base model of `shape` with matrices of `types` (each falling back as
    /// llama-quantize does where its blocks do not fit the rows: [`fallback`]).
    pub fn build(shape: Shape, arch: Arch, tok: TokKind, types: Types, tied: bool, seed: u64) -> Spec {
        let Shape { hidden, heads, kv_heads, head_dim, ffn } = shape;
        let a = match arch {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Mixtral => "llama",
            Arch::Qwen2Moe => "qwen2moe",
        };
        let mut kvs: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::Str(a.into())),
            ("general.name".into(), Value::Str("tiny".into())),
            (format!("{a}.block_count"), Value::U32(1)),
            (format!("{a}.context_length"), Value::U32(64)),
            (format!("{a}.embedding_length"), Value::U32(hidden as u32)),
            (format!("{a}.feed_forward_length"), Value::U32(ffn as u32)),
            (format!("{a}.attention.head_count"), Value::U32(heads as u32)),
            (format!("{a}.attention.head_count_kv"), Value::U32(kv_heads as u32)),
            (format!("{a}.attention.key_length"), Value::U32(head_dim as u32)),
            (format!("{a}.attention.value_length"), Value::U32(head_dim as u32)),
            (format!("{a}.rope.dimension_count"), Value::U32(head_dim as u32)),
            (format!("{a}.rope.freq_base"), Value::F32(10000.0)),
            (format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        ];
        let moe = matches!(arch, Arch::Mixtral | Arch::Qwen2Moe);
        if moe {
            kvs.push((format!("{a}.expert_count"), Value::U32(EXPERTS as u32)));
            kvs.push((format!("{a}.expert_used_count"), Value::U32(EXPERTS_USED as u32)));
        }
        if arch == Arch::Qwen2Moe {
            kvs.push((format!("{a}.expert_feed_forward_length"), Value::U32(ffn as u32)));
            kvs.push((format!("{a}.expert_shared_feed_forward_length"), Value::U32(ffn as u32)));
        }
        match tok {
            TokKind::Spm => {
                let (t, s, ty) = spm_vocab();
                kvs.push(("tokenizer.ggml.model".into(), Value::Str("llama".into())));
                kvs.push(("tokenizer.ggml.tokens".into(), strs(t)));
                kvs.push(("tokenizer.ggml.scores".into(), Value::Array(s.into_iter().map(Value::F32).collect())));
                kvs.push(("tokenizer.ggml.token_type".into(), Value::Array(ty.into_iter().map(Value::I32).collect())));
                kvs.push(("tokenizer.ggml.bos_token_id".into(), Value::U32(1)));
                kvs.push(("tokenizer.ggml.eos_token_id".into(), Value::U32(2)));
                kvs.push(("tokenizer.ggml.unknown_token_id".into(), Value::U32(0)));
                kvs.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(true)));
            }
            TokKind::Gpt2(pre) => {
                let (t, ty, m) = gpt2_vocab();
                kvs.push(("tokenizer.ggml.model".into(), Value::Str("gpt2".into())));
                kvs.push(("tokenizer.ggml.pre".into(), Value::Str(pre.into())));
                kvs.push(("tokenizer.ggml.tokens".into(), strs(t)));
                kvs.push(("tokenizer.ggml.token_type".into(), Value::Array(ty.into_iter().map(Value::I32).collect())));
                kvs.push(("tokenizer.ggml.merges".into(), strs(m)));
                kvs.push(("tokenizer.ggml.bos_token_id".into(), Value::U32(0)));
                kvs.push(("tokenizer.ggml.eos_token_id".into(), Value::U32(0)));
            }
            TokKind::None => {}
        }
        let mut tensors = Vec::new();
        let mut n = 0u64;
        // The seed varies the small base's weights only: the wide base's tensors are
        // made once per type and role and kept (`tensor_bytes_kept`), where each new
        // seed would cost as much as a load and the steps.
        let seed = if shape == SMALL { seed } else { 0 };
        let mut t = |name: &str, ne: &[u64], dtype: DType| {
            n += 1;
            let dtype = fallback(dtype, ne[0]);
            let elems = ne.iter().product::<u64>() as usize;
            tensors.push(TensorSpec {
                name: name.into(),
                ne: ne.to_vec(),
                ggml_type: dtype.ggml_id(),
                data: tensor_bytes_kept(dtype, elems, seed.wrapping_mul(31).wrapping_add(n)),
                offset: None,
            });
        };
        let (q, kv) = (heads * head_dim, kv_heads * head_dim);
        t("token_embd.weight", &[hidden, VOCAB], types.embd);
        if !tied {
            t("output.weight", &[hidden, VOCAB], types.output);
        }
        t("output_norm.weight", &[hidden], DType::F32);
        t("blk.0.attn_norm.weight", &[hidden], DType::F32);
        t("blk.0.attn_q.weight", &[hidden, q], types.q);
        t("blk.0.attn_k.weight", &[hidden, kv], types.k);
        t("blk.0.attn_v.weight", &[hidden, kv], types.v);
        t("blk.0.attn_output.weight", &[q, hidden], types.attn_out);
        if matches!(arch, Arch::Qwen2 | Arch::Qwen2Moe) {
            t("blk.0.attn_q.bias", &[q], DType::F32);
            t("blk.0.attn_k.bias", &[kv], DType::F32);
            t("blk.0.attn_v.bias", &[kv], DType::F32);
        }
        if arch == Arch::Qwen3 {
            t("blk.0.attn_q_norm.weight", &[head_dim], DType::F32);
            t("blk.0.attn_k_norm.weight", &[head_dim], DType::F32);
        }
        t("blk.0.ffn_norm.weight", &[hidden], DType::F32);
        if moe {
            // llama-quantize keeps the router (and the shared expert's gate) in F32.
            t("blk.0.ffn_gate_inp.weight", &[hidden, EXPERTS], DType::F32);
            t("blk.0.ffn_gate_exps.weight", &[hidden, ffn, EXPERTS], types.gate);
            t("blk.0.ffn_up_exps.weight", &[hidden, ffn, EXPERTS], types.up);
            t("blk.0.ffn_down_exps.weight", &[ffn, hidden, EXPERTS], types.down);
            if arch == Arch::Qwen2Moe {
                t("blk.0.ffn_gate_inp_shexp.weight", &[hidden, 1], DType::F32);
                t("blk.0.ffn_gate_shexp.weight", &[hidden, ffn], types.gate);
                t("blk.0.ffn_up_shexp.weight", &[hidden, ffn], types.up);
                t("blk.0.ffn_down_shexp.weight", &[ffn, hidden], types.down);
            }
        } else {
            t("blk.0.ffn_gate.weight", &[hidden, ffn], types.gate);
            t("blk.0.ffn_up.weight", &[hidden, ffn], types.up);
            t("blk.0.ffn_down.weight", &[ffn, hidden], types.down);
        }
        Spec { version: 3, layout_alignment: 32, kvs, tensors, n_tensors_override: None, n_kv_override: None }
    }

    /// The file's bytes, exactly as the structure says.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.layout_alignment.clamp(1, 1 << 16);
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.n_tensors_override.unwrap_or(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.n_kv_override.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut out, k.as_bytes());
            out.extend_from_slice(&v.type_id().to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offsets = Vec::with_capacity(self.tensors.len());
        let mut off = 0u64;
        for t in &self.tensors {
            offsets.push(off);
            off = (off + t.data.len() as u64).next_multiple_of(align);
        }
        for (t, &o) in self.tensors.iter().zip(&offsets) {
            put_str(&mut out, t.name.as_bytes());
            out.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.to_le_bytes());
            out.extend_from_slice(&t.offset.unwrap_or(o).to_le_bytes());
        }
        if !self.tensors.is_empty() {
            let len = (out.len() as u64).next_multiple_of(align) as usize;
            out.resize(len, 0);
        }
        let start = out.len();
        for (t, &o) in self.tensors.iter().zip(&offsets) {
            out.resize(start + o as usize, 0);
            out.extend_from_slice(&t.data);
        }
        out
    }
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s);
}

/// As the GGUF writer, but an array's element type is its first element's and the
/// other elements are written as they are (a mixed array is a malformed file).
fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::Str(s) => put_str(out, s.as_bytes()),
        Value::Array(a) => {
            let et = a.first().map_or(0, |e| e.type_id());
            out.extend_from_slice(&et.to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for e in a {
                put_value(out, e);
            }
        }
    }
}
