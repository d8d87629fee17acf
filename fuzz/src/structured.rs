//! The structure-aware GGUF target's input: a base model choice and a list of
//! structured edits, decoded from the fuzzer's bytes with `arbitrary`.
use arbitrary::Arbitrary;
use llmrt::format::gguf::Value;
use llmrt::quant::DType;

use crate::tiny::{Arch, FileType, Spec, TokKind, Types, SMALL, WIDE};

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum ArchChoice {
    Llama,
    Qwen2,
    Qwen3,
    Mixtral,
    Qwen2Moe,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum TokChoice {
    Spm,
    Gpt2,
    Llama3,
    Qwen2,
    None,
}

/// The matrices' types (`DType::all()[i % 15]`, `FileType::all()[i % 19]`); on the
/// small shape a type whose blocks do not fit a row falls back as llama-quantize
/// does (`tiny::fallback`), so every base loads.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum TypesChoice {
    /// As llama-quantize writes this file type (e.g. Q4_K_M: Q4_K, Q6_K output, attn_v and ffn_down).
    File(u8),
    /// Every matrix this type.
    Uniform(u8),
    /// Each matrix its own: embd, output, q, k, v, attn_output, gate, up, down.
    PerTensor([u8; 9]),
}

fn dtype_of(i: u8) -> DType {
    let all = DType::all();
    all[i as usize % all.len()]
}

impl TypesChoice {
    pub fn types(self, tied: bool) -> Types {
        match self {
            TypesChoice::File(i) => {
                let all = FileType::all();
                Types::file_type(all[i as usize % all.len()], tied)
            }
            TypesChoice::Uniform(i) => Types::uniform(dtype_of(i)),
            TypesChoice::PerTensor(t) => Types {
                embd: dtype_of(t[0]),
                output: dtype_of(t[1]),
                q: dtype_of(t[2]),
                k: dtype_of(t[3]),
                v: dtype_of(t[4]),
                attn_out: dtype_of(t[5]),
                gate: dtype_of(t[6]),
                up: dtype_of(t[7]),
                down: dtype_of(t[8]),
            },
        }
    }
}

#[derive(Arbitrary, Debug)]
pub struct Plan {
    pub arch: ArchChoice,
    pub tok: TokChoice,
    /// The shape: `tiny::WIDE` (rows of 256: K-quants fit) or `tiny::SMALL`.
    pub wide: bool,
    pub types: TypesChoice,
    pub tied: bool,
    /// Varies the small base's weights (the wide base's are fixed, made once).
    pub seed: u8,
    pub edits: Vec<Edit>,
}

/// Metadata keys worth hitting (`{a}` is the architecture prefix).
const KEYS: &[&str] = &[
    "general.architecture",
    "general.alignment",
    "{a}.block_count",
    "{a}.expert_count",
    "{a}.expert_used_count",
    "{a}.expert_feed_forward_length",
    "{a}.expert_shared_feed_forward_length",
    "{a}.expert_weights_norm",
    "{a}.context_length",
    "{a}.embedding_length",
    "{a}.feed_forward_length",
    "{a}.attention.head_count",
    "{a}.attention.head_count_kv",
    "{a}.attention.key_length",
    "{a}.attention.value_length",
    "{a}.rope.dimension_count",
    "{a}.rope.freq_base",
    "{a}.rope.scaling.type",
    "{a}.rope.scaling.factor",
    "{a}.attention.layer_norm_rms_epsilon",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix",
];

const STRS: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen2moe",
    "qwen3moe",
    "gpt2",
    "none",
    "no_vocab",
    "default",
    "llama3",
    "llama-bpe",
    "qwen2",
    "linear",
    "yarn",
    "",
    "<s>",
    "\u{2581}",
    "a b",
    "<0x41>",
    "<0xZZ>",
    "\u{120}t he",
];

const TENSOR_NAMES: &[&str] = &[
    "token_embd.weight",
    "output.weight",
    "output_norm.weight",
    "rope_freqs.weight",
    "blk.0.attn_norm.weight",
    "blk.0.attn_q.weight",
    "blk.0.attn_k.weight",
    "blk.0.attn_v.weight",
    "blk.0.attn_output.weight",
    "blk.0.attn_q.bias",
    "blk.0.attn_k.bias",
    "blk.0.attn_v.bias",
    "blk.0.attn_q_norm.weight",
    "blk.0.attn_k_norm.weight",
    "blk.0.ffn_norm.weight",
    "blk.0.ffn_gate.weight",
    "blk.0.ffn_up.weight",
    "blk.0.ffn_down.weight",
    "blk.1.attn_norm.weight",
    "blk.1.attn_q.weight",
];

#[derive(Arbitrary, Debug)]
pub enum Key {
    Known(u8),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
pub enum Num {
    Small(u8),
    Any(u64),
    Neg(i8),
    Edge(u8),
}

impl Num {
    fn get(&self) -> i128 {
        match *self {
            Num::Small(x) => x as i128,
            Num::Any(x) => x as i128,
            Num::Neg(x) => x as i128,
            Num::Edge(i) => [
                0i128,
                1,
                2,
                3,
                7,
                8,
                16,
                31,
                32,
                33,
                63,
                64,
                65,
                127,
                128,
                255,
                256,
                1 << 16,
                u32::MAX as i128,
                u32::MAX as i128 + 1,
                i32::MAX as i128,
                i64::MAX as i128,
                u64::MAX as i128,
                -1,
            ][i as usize % 24],
        }
    }
}

#[derive(Arbitrary, Debug)]
pub enum Val {
    U8(Num),
    I8(Num),
    U16(Num),
    I16(Num),
    U32(Num),
    I32(Num),
    U64(Num),
    I64(Num),
    F32(f32),
    F64(f64),
    FloatEdge(u8),
    Bool(bool),
    Str(u8),
    RawStr(String),
    ArrU32(Vec<u32>),
    ArrI32(Vec<i32>),
    ArrF32(Vec<f32>),
    ArrStr(Vec<String>),
    ArrMixed,
    ArrEmpty,
    ArrNested(u8),
}

impl Val {
    fn value(&self) -> Value {
        match self {
            Val::U8(n) => Value::U8(n.get() as u8),
            Val::I8(n) => Value::I8(n.get() as i8),
            Val::U16(n) => Value::U16(n.get() as u16),
            Val::I16(n) => Value::I16(n.get() as i16),
            Val::U32(n) => Value::U32(n.get() as u32),
            Val::I32(n) => Value::I32(n.get() as i32),
            Val::U64(n) => Value::U64(n.get() as u64),
            Val::I64(n) => Value::I64(n.get() as i64),
            Val::F32(x) => Value::F32(*x),
            Val::F64(x) => Value::F64(*x),
            Val::FloatEdge(i) => Value::F32(
                [0.0, -0.0, -1.0, 1e-30, 1e30, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE, 0.5]
                    [*i as usize % 10],
            ),
            Val::Bool(b) => Value::Bool(*b),
            Val::Str(i) => Value::Str(STRS[*i as usize % STRS.len()].into()),
            Val::RawStr(s) => Value::Str(s.clone()),
            Val::ArrU32(a) => Value::Array(a.iter().map(|&x| Value::U32(x)).collect()),
            Val::ArrI32(a) => Value::Array(a.iter().map(|&x| Value::I32(x)).collect()),
            Val::ArrF32(a) => Value::Array(a.iter().map(|&x| Value::F32(x)).collect()),
            Val::ArrStr(a) => Value::Array(a.iter().map(|x| Value::Str(x.clone())).collect()),
            Val::ArrMixed => Value::Array(vec![Value::Str("a".into()), Value::U32(7), Value::Str("b".into())]),
            Val::ArrEmpty => Value::Array(vec![]),
            Val::ArrNested(d) => {
                let mut v = Value::Array(vec![Value::U8(1)]);
                for _ in 0..(*d % 10) {
                    v = Value::Array(vec![v]);
                }
                v
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
pub enum DimOp {
    Set(Num),
    Double,
    Halve,
    Inc,
    Dec,
    Push(Num),
    Pop,
}

/// The data a retyped tensor gets.
#[derive(Arbitrary, Debug)]
pub enum SizeChoice {
    /// Valid blocks for its element count (rounded down to whole blocks).
    Exact,
    /// One block fewer / more than `Exact`.
    BlockShort,
    BlockLong,
    /// Its old bytes.
    Keep,
    /// `Exact` plus or minus some bytes.
    Delta(i8),
}

#[derive(Arbitrary, Debug)]
pub enum Edit {
    SetKv {
        key: Key,
        val: Val,
    },
    RemoveKv(u8),
    DupKv(u8),
    MoveKvLast(u8),
    /// The same number as another integer or float type.
    RetypeKv {
        i: u8,
        to: u8,
    },
    SetToken {
        i: u8,
        text: String,
    },
    SetTokenType {
        i: u8,
        ty: i8,
    },
    SetScore {
        i: u8,
        x: f32,
    },
    SetMerge {
        i: u8,
        m: String,
    },
    TruncateArray {
        i: u8,
        len: u8,
    },
    TensorDim {
        t: u8,
        d: u8,
        op: DimOp,
    },
    /// The ggml type id only (ids past the supported ones too); the data stays.
    TensorType {
        t: u8,
        ty: u8,
    },
    /// A supported type (`DType::all()[ty % 15]`) with data sized by `size`.
    TensorRetype {
        t: u8,
        ty: u8,
        size: SizeChoice,
    },
    TensorOffset {
        t: u8,
        off: Num,
    },
    TensorDataLen {
        t: u8,
        len: u16,
    },
    TensorPoison {
        t: u8,
        at: u16,
        what: u8,
    },
    RemoveTensor(u8),
    DupTensor(u8),
    RenameTensor {
        t: u8,
        to: u8,
    },
    AddTensor {
        name: u8,
        ne: Vec<u8>,
        ty: u8,
    },
    Version(u32),
    LayoutAlignment(u8),
    CountTensors(Num),
    CountKvs(Num),
    Truncate(u16),
    Flip {
        at: u16,
        xor: u8,
    },
}

fn idx<T>(v: &[T], i: u8) -> Option<usize> {
    if v.is_empty() {
        None
    } else {
        Some(i as usize % v.len())
    }
}

fn retype(v: &Value, to: u8) -> Value {
    let (i, f): (i128, f64) = match *v {
        Value::U8(x) => (x as i128, x as f64),
        Value::I8(x) => (x as i128, x as f64),
        Value::U16(x) => (x as i128, x as f64),
        Value::I16(x) => (x as i128, x as f64),
        Value::U32(x) => (x as i128, x as f64),
        Value::I32(x) => (x as i128, x as f64),
        Value::U64(x) => (x as i128, x as f64),
        Value::I64(x) => (x as i128, x as f64),
        Value::F32(x) => (x as i128, x as f64),
        Value::F64(x) => (x as i128, x),
        Value::Bool(b) => (b as i128, b as u8 as f64),
        Value::Str(ref s) => {
            return if to.is_multiple_of(2) { Value::Array(vec![Value::Str(s.clone())]) } else { Value::U32(1) }
        }
        Value::Array(ref a) => {
            return Value::Array(a.iter().map(|e| retype(e, to)).collect());
        }
    };
    match to % 11 {
        0 => Value::U8(i as u8),
        1 => Value::I8(i as i8),
        2 => Value::U16(i as u16),
        3 => Value::I16(i as i16),
        4 => Value::U32(i as u32),
        5 => Value::I32(i as i32),
        6 => Value::U64(i as u64),
        7 => Value::I64(i as i64),
        8 => Value::F32(f as f32),
        9 => Value::F64(f),
        _ => Value::Str(format!("{i}")),
    }
}

fn array_of<'a>(spec: &'a mut Spec, key: &str) -> Option<&'a mut Vec<Value>> {
    spec.kvs.iter_mut().find(|(k, _)| k == key).and_then(|(_, v)| match v {
        Value::Array(a) => Some(a),
        _ => None,
    })
}

impl Plan {
    /// The base model's structure (its large tensors made once: `tiny::tensor_bytes_kept`).
    pub fn base(&self) -> Spec {
        let arch = match self.arch {
            ArchChoice::Llama => Arch::Llama,
            ArchChoice::Qwen2 => Arch::Qwen2,
            ArchChoice::Qwen3 => Arch::Qwen3,
            ArchChoice::Mixtral => Arch::Mixtral,
            ArchChoice::Qwen2Moe => Arch::Qwen2Moe,
        };
        let tok = match self.tok {
            TokChoice::Spm => TokKind::Spm,
            TokChoice::Gpt2 => TokKind::Gpt2("gpt2"),
            TokChoice::Llama3 => TokKind::Gpt2("llama-bpe"),
            TokChoice::Qwen2 => TokKind::Gpt2("qwen2"),
            TokChoice::None => TokKind::None,
        };
        let shape = if self.wide { WIDE } else { SMALL };
        Spec::build(shape, arch, tok, self.types.types(self.tied), self.tied, self.seed as u64)
    }

    /// The edited file.
    pub fn bytes(&self) -> Vec<u8> {
        let mut s = self.base();
        let arch = match self.arch {
            ArchChoice::Llama => "llama",
            ArchChoice::Qwen2 => "qwen2",
            ArchChoice::Qwen3 => "qwen3",
            ArchChoice::Mixtral => "llama",
            ArchChoice::Qwen2Moe => "qwen2moe",
        };
        let mut raw_edits = Vec::new();
        for e in self.edits.iter().take(16) {
            match e {
                Edit::SetKv { key, val } => {
                    let k = match key {
                        Key::Known(i) => KEYS[*i as usize % KEYS.len()].replace("{a}", arch),
                        Key::Raw(r) => r.clone(),
                    };
                    let v = val.value();
                    match s.kvs.iter_mut().find(|(kk, _)| *kk == k) {
                        Some(slot) => slot.1 = v,
                        None => s.kvs.push((k, v)),
                    }
                }
                Edit::RemoveKv(i) => {
                    if let Some(i) = idx(&s.kvs, *i) {
                        s.kvs.remove(i);
                    }
                }
                Edit::DupKv(i) => {
                    if let Some(i) = idx(&s.kvs, *i) {
                        let kv = s.kvs[i].clone();
                        s.kvs.push(kv);
                    }
                }
                Edit::MoveKvLast(i) => {
                    if let Some(i) = idx(&s.kvs, *i) {
                        let kv = s.kvs.remove(i);
                        s.kvs.push(kv);
                    }
                }
                Edit::RetypeKv { i, to } => {
                    if let Some(i) = idx(&s.kvs, *i) {
                        s.kvs[i].1 = retype(&s.kvs[i].1, *to);
                    }
                }
                Edit::SetToken { i, text } => {
                    if let Some(a) = array_of(&mut s, "tokenizer.ggml.tokens") {
                        if let Some(i) = idx(a, *i) {
                            a[i] = Value::Str(text.clone());
                        }
                    }
                }
                Edit::SetTokenType { i, ty } => {
                    if let Some(a) = array_of(&mut s, "tokenizer.ggml.token_type") {
                        if let Some(i) = idx(a, *i) {
                            a[i] = Value::I32(*ty as i32);
                        }
                    }
                }
                Edit::SetScore { i, x } => {
                    if let Some(a) = array_of(&mut s, "tokenizer.ggml.scores") {
                        if let Some(i) = idx(a, *i) {
                            a[i] = Value::F32(*x);
                        }
                    }
                }
                Edit::SetMerge { i, m } => {
                    if let Some(a) = array_of(&mut s, "tokenizer.ggml.merges") {
                        if let Some(i) = idx(a, *i) {
                            a[i] = Value::Str(m.clone());
                        }
                    }
                }
                Edit::TruncateArray { i, len } => {
                    if let Some(i) = idx(&s.kvs, *i) {
                        if let Value::Array(a) = &mut s.kvs[i].1 {
                            a.truncate(*len as usize);
                        }
                    }
                }
                Edit::TensorDim { t, d, op } => {
                    if let Some(t) = idx(&s.tensors, *t) {
                        let ne = &mut s.tensors[t].ne;
                        match op {
                            DimOp::Push(n) => ne.push(n.get() as u64),
                            DimOp::Pop => {
                                ne.pop();
                            }
                            _ => {
                                if let Some(d) = idx(ne, *d) {
                                    let x = ne[d];
                                    ne[d] = match op {
                                        DimOp::Set(n) => n.get() as u64,
                                        DimOp::Double => x.wrapping_mul(2),
                                        DimOp::Halve => x / 2,
                                        DimOp::Inc => x.wrapping_add(1),
                                        DimOp::Dec => x.wrapping_sub(1),
                                        DimOp::Push(_) | DimOp::Pop => x,
                                    };
                                }
                            }
                        }
                    }
                }
                Edit::TensorType { t, ty } => {
                    if let Some(t) = idx(&s.tensors, *t) {
                        s.tensors[t].ggml_type = *ty as u32 % 48;
                    }
                }
                Edit::TensorRetype { t, ty, size } => {
                    if let Some(t) = idx(&s.tensors, *t) {
                        let d = dtype_of(*ty);
                        let x = &mut s.tensors[t];
                        x.ggml_type = d.ggml_id();
                        // Element counts past the base's largest matrix keep their bytes.
                        let n = x.ne.iter().try_fold(1u64, |a, &b| a.checked_mul(b)).filter(|&n| n <= 1 << 18);
                        if let (Some(n), false) = (n, matches!(size, SizeChoice::Keep)) {
                            let (be, bb) = (d.block_elems(), d.block_bytes());
                            let blocks = n as usize / be;
                            let mut data = crate::tiny::tensor_bytes_kept(d, blocks * be, x.data.len() as u64);
                            match size {
                                SizeChoice::BlockShort => data.truncate(data.len().saturating_sub(bb)),
                                SizeChoice::BlockLong => {
                                    data.extend(crate::tiny::tensor_bytes(d, be, 1));
                                }
                                SizeChoice::Delta(k) => {
                                    let len = (data.len() as i64 + *k as i64).max(0) as usize;
                                    data.resize(len, 0x11);
                                }
                                SizeChoice::Exact | SizeChoice::Keep => {}
                            }
                            x.data = data;
                        }
                    }
                }
                Edit::TensorOffset { t, off } => {
                    if let Some(t) = idx(&s.tensors, *t) {
                        s.tensors[t].offset = Some(off.get() as u64);
                    }
                }
                Edit::TensorDataLen { t, len } => {
                    if let Some(t) = idx(&s.tensors, *t) {
                        s.tensors[t].data.resize(*len as usize % 8192, 0x3c);
                    }
                }
                Edit::TensorPoison { t, at, what } => {
                    if let Some(t) = idx(&s.tensors, *t) {
                        let d = &mut s.tensors[t].data;
                        if !d.is_empty() {
                            let at = *at as usize % d.len();
                            let bytes: &[u8] = match what % 5 {
                                0 => &[0x00, 0x00, 0xC0, 0x7F], // f32 NaN
                                1 => &[0x00, 0x00, 0x80, 0x7F], // f32 +inf
                                2 => &[0x00, 0x7C],             // f16 +inf
                                3 => &[0xFF, 0x7F],             // f16/bf16 NaN
                                _ => &[0xFF, 0xFF, 0x7F, 0x7F], // f32 max
                            };
                            for (k, b) in bytes.iter().enumerate() {
                                if let Some(x) = d.get_mut(at + k) {
                                    *x = *b;
                                }
                            }
                        }
                    }
                }
                Edit::RemoveTensor(t) => {
                    if let Some(t) = idx(&s.tensors, *t) {
                        s.tensors.remove(t);
                    }
                }
                Edit::DupTensor(t) => {
                    if let Some(t) = idx(&s.tensors, *t) {
                        let x = s.tensors[t].clone();
                        s.tensors.push(x);
                    }
                }
                Edit::RenameTensor { t, to } => {
                    if let Some(t) = idx(&s.tensors, *t) {
                        s.tensors[t].name = TENSOR_NAMES[*to as usize % TENSOR_NAMES.len()].into();
                    }
                }
                Edit::AddTensor { name, ne, ty } => {
                    let ne: Vec<u64> = ne.iter().take(5).map(|&d| d as u64).collect();
                    let ty = *ty as u32 % 48;
                    let n: u64 = ne.iter().product::<u64>().min(1 << 14);
                    let data = match DType::from_ggml(ty) {
                        Some(d) => {
                            let n = n as usize;
                            crate::tiny::tensor_bytes(d, n - n % d.block_elems(), *name as u64)
                        }
                        None => vec![0; n as usize],
                    };
                    s.tensors.push(crate::tiny::TensorSpec {
                        name: TENSOR_NAMES[*name as usize % TENSOR_NAMES.len()].into(),
                        ne,
                        ggml_type: ty,
                        data,
                        offset: None,
                    });
                }
                Edit::Version(v) => s.version = *v,
                Edit::LayoutAlignment(a) => {
                    let a = 1u64 << (a % 8);
                    s.layout_alignment = a;
                    let v = Value::U32(a as u32);
                    match s.kvs.iter_mut().find(|(k, _)| k == "general.alignment") {
                        Some(slot) => slot.1 = v,
                        None => s.kvs.insert(0, ("general.alignment".into(), v)),
                    }
                }
                Edit::CountTensors(n) => s.n_tensors_override = Some(n.get() as u64),
                Edit::CountKvs(n) => s.n_kv_override = Some(n.get() as u64),
                Edit::Truncate(_) | Edit::Flip { .. } => raw_edits.push(e),
            }
        }
        let mut b = s.to_bytes();
        for e in raw_edits {
            match e {
                Edit::Truncate(n) => {
                    let keep = b.len().saturating_sub(*n as usize);
                    b.truncate(keep);
                }
                Edit::Flip { at, xor } if !b.is_empty() => {
                    let i = *at as usize % b.len();
                    b[i] ^= *xor;
                }
                _ => {}
            }
        }
        b
    }
}
