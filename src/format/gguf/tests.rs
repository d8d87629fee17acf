//! Unit tests of the GGUF reader: round trips through `GgufWriter`, and every malformed-file
//! error (with the offset or tensor it names).

use super::*;
use crate::error::Status;
use crate::format::gguf_write::GgufWriter;
use crate::quant::quantize_row;
use crate::util::XorShift;

fn tmp_path(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "llmrt-gguf-test-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        tag
    ))
}

fn quant(dt: DType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; dt.row_bytes(x.len()).unwrap()];
    quantize_row(dt, x, &mut q);
    q
}

fn bad(r: Result<Gguf>) -> Error {
    match r {
        Ok(g) => panic!("expected an error, parsed {g:?}"),
        Err(e) => {
            assert_eq!(e.status, Status::LLMRT_BAD_MODEL, "{e}");
            e
        }
    }
}

fn all_values() -> Vec<(String, Value)> {
    vec![
        ("general.architecture".into(), Value::Str("llama".into())),
        ("t.u8".into(), Value::U8(200)),
        ("t.i8".into(), Value::I8(-100)),
        ("t.u16".into(), Value::U16(60000)),
        ("t.i16".into(), Value::I16(-30000)),
        ("t.u32".into(), Value::U32(4_000_000_000)),
        ("t.i32".into(), Value::I32(-2_000_000_000)),
        ("t.f32".into(), Value::F32(1.5e-5)),
        ("t.bool.t".into(), Value::Bool(true)),
        ("t.bool.f".into(), Value::Bool(false)),
        ("t.str".into(), Value::Str("héllo ▁wörld \u{1F600}".into())),
        ("t.str.empty".into(), Value::Str(String::new())),
        ("t.u64".into(), Value::U64(u64::MAX)),
        ("t.i64".into(), Value::I64(i64::MIN)),
        ("t.f64".into(), Value::F64(-1.0e300)),
        ("t.arr.empty".into(), Value::Array(vec![])),
        ("t.arr.u8".into(), Value::Array(vec![Value::U8(1), Value::U8(2), Value::U8(3)])),
        ("t.arr.f32".into(), Value::Array(vec![Value::F32(0.5), Value::F32(-0.25)])),
        ("t.arr.i64".into(), Value::Array(vec![Value::I64(-1), Value::I64(7)])),
        ("t.arr.bool".into(), Value::Array(vec![Value::Bool(true), Value::Bool(false)])),
        (
            "t.arr.str".into(),
            Value::Array(vec![Value::Str("a".into()), Value::Str("".into()), Value::Str("<s>".into())]),
        ),
        (
            "t.arr.nested".into(),
            Value::Array(vec![
                Value::Array(vec![Value::U32(1), Value::U32(2)]),
                Value::Array(vec![Value::Str("x".into())]),
                Value::Array(vec![]),
                Value::Array(vec![Value::Array(vec![Value::F64(2.0)])]),
            ]),
        ),
    ]
}

struct T {
    name: &'static str,
    ne: Vec<u64>,
    ggml_type: u32,
    data: Vec<u8>,
}

fn sample_tensors() -> Vec<T> {
    let x: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin()).collect();
    vec![
        T { name: "a.f32", ne: vec![5, 3], ggml_type: 0, data: quant(DType::F32, &x[..15]) },
        T { name: "b.q8_0", ne: vec![64, 2], ggml_type: 8, data: quant(DType::Q8_0, &x) },
        T { name: "c.q4_0", ne: vec![32, 1, 1, 2], ggml_type: 2, data: quant(DType::Q4_0, &x[..64]) },
        T { name: "d.f16", ne: vec![3], ggml_type: 1, data: quant(DType::F16, &x[..3]) },
        T { name: "e.bf16", ne: vec![7, 2], ggml_type: 30, data: quant(DType::BF16, &x[..14]) },
        T { name: "f.iq2_xxs", ne: vec![256], ggml_type: 16, data: vec![0xAB; 66] },
    ]
}

fn build(version: u32, alignment: u64) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.version(version);
    w.alignment(alignment);
    for (k, v) in all_values() {
        w.kv(&k, v);
    }
    for t in sample_tensors() {
        w.tensor_raw(t.name, &t.ne, t.ggml_type, t.data);
    }
    w
}

fn check_round_trip(g: &Gguf, version: u32, alignment: u64) {
    assert_eq!(g.version, version);
    assert_eq!(g.alignment, alignment);
    let mut want = all_values();
    if alignment != 32 {
        want.insert(0, ("general.alignment".into(), Value::U32(alignment as u32)));
    }
    assert_eq!(g.metadata(), want);
    assert_eq!(g.data_start % alignment, 0);
    let ts = sample_tensors();
    assert_eq!(g.tensors.len(), ts.len());
    for (t, info) in ts.iter().zip(&g.tensors) {
        assert_eq!(info.name, t.name);
        assert_eq!(info.ne, t.ne);
        assert_eq!(info.ggml_type, t.ggml_type);
        assert_eq!(info.dtype, DType::from_ggml(t.ggml_type));
        assert_eq!(info.size, t.data.len() as u64);
        assert_eq!((info.offset - g.data_start) % alignment, 0);
        assert_eq!(g.tensor_data(info), &t.data[..]);
        assert_eq!(g.tensor(t.name), Some(info));
    }
    assert_eq!(g.tensor("f.iq2_xxs").unwrap().dtype, None);
    assert_eq!(g.tensor("f.iq2_xxs").unwrap().type_name(), "IQ2_XXS");
    assert!(g.tensor("nope").is_none());
    // The file ends exactly at the end of the last tensor.
    let last = g.tensors.last().unwrap();
    assert_eq!(last.offset + last.size, g.bytes().len() as u64);
}

#[test]
fn round_trip_every_value_type() {
    for version in [2, 3] {
        for alignment in [32, 64] {
            let bytes = build(version, alignment).to_bytes();
            let g = Gguf::from_bytes(bytes, "mem.gguf").unwrap();
            check_round_trip(&g, version, alignment);
        }
    }
    // And through a real file and the mmap.
    let p = tmp_path("rt.gguf");
    build(3, 64).write(&p).unwrap();
    let g = Gguf::open(&p).unwrap();
    check_round_trip(&g, 3, 64);
    assert_eq!(g.path, p);
    drop(g);
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn no_tensors_no_metadata() {
    let g = Gguf::from_bytes(GgufWriter::new().to_bytes(), "e.gguf").unwrap();
    assert!(g.n_metadata() == 0 && g.tensors.is_empty());
    assert_eq!(g.bytes().len(), 24);
}

#[test]
fn typed_getters() {
    let mut w = GgufWriter::new();
    w.kv("i32.pos", Value::I32(5));
    w.kv("i32.neg", Value::I32(-5));
    w.kv("u64.big", Value::U64(1 << 40));
    w.kv("u8", Value::U8(7));
    w.kv("f64", Value::F64(0.5));
    w.kv("f32", Value::F32(1e-6));
    w.kv("s", Value::Str("llama".into()));
    w.kv("b", Value::Bool(true));
    w.kv("arr", Value::Array(vec![Value::U8(1)]));
    let g = Gguf::from_bytes(w.to_bytes(), "g.gguf").unwrap();
    assert_eq!(g.get_u64("i32.pos").unwrap(), Some(5));
    assert_eq!(g.get_u64("u8").unwrap(), Some(7));
    assert_eq!(g.get_u64("u64.big").unwrap(), Some(1 << 40));
    assert_eq!(g.get_u64("missing").unwrap(), None);
    let e = g.get_u64("i32.neg").unwrap_err();
    assert_eq!(e.status, Status::LLMRT_BAD_MODEL);
    assert!(e.message.contains("i32.neg") && e.message.contains("I32") && e.message.contains("g.gguf"), "{e}");
    let e = g.get_u64("s").unwrap_err();
    assert!(e.message.contains("'s'") && e.message.contains("STRING"), "{e}");
    assert_eq!(g.get_u32("i32.pos").unwrap(), Some(5));
    let e = g.get_u32("u64.big").unwrap_err();
    assert!(e.message.contains("u64.big") && e.message.contains("U64"), "{e}");
    assert_eq!(g.get_f32("f64").unwrap(), Some(0.5));
    assert_eq!(g.get_f32("f32").unwrap(), Some(1e-6));
    assert_eq!(g.get_f32("i32.neg").unwrap(), Some(-5.0));
    assert_eq!(g.get_f32("u8").unwrap(), Some(7.0));
    assert!(g.get_f32("s").is_err());
    assert_eq!(g.get_f32("nope").unwrap(), None);
    assert_eq!(g.get_str("s").unwrap(), Some("llama"));
    assert!(g.get_str("u8").unwrap_err().message.contains("U8"));
    assert_eq!(g.get_str("nope").unwrap(), None);
    assert_eq!(g.get_bool("b").unwrap(), Some(true));
    assert!(g.get_bool("arr").unwrap_err().message.contains("ARRAY"));
    assert_eq!(g.get_bool("nope").unwrap(), None);
}

/// A small valid file with a few of everything.
fn small_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::Str("llama".into()));
    w.kv("llama.block_count", Value::U32(2));
    w.kv("v.arr", Value::Array(vec![Value::Str("ab".into()), Value::Str("c".into())]));
    w.kv("v.nested", Value::Array(vec![Value::Array(vec![Value::I16(1)])]));
    w.kv("v.f", Value::F32(1.0));
    w.tensor("w1", &[32, 2], DType::Q8_0, vec![1; 68]);
    w.tensor("w2", &[3], DType::F32, vec![2; 12]);
    w.to_bytes()
}

#[test]
fn truncation_at_every_offset() {
    let full = small_file();
    Gguf::from_bytes(full.clone(), "t.gguf").unwrap();
    for len in 0..full.len() {
        let e = bad(Gguf::from_bytes(full[..len].to_vec(), "t.gguf"));
        assert!(e.message.starts_with("t.gguf: "), "len {len}: {e}");
        assert!(e.message.contains("offset"), "len {len}: {e}");
    }
    let e = bad(Gguf::from_bytes(full[..30].to_vec(), "t.gguf"));
    assert!(e.message.contains("truncated at offset 24 while reading the length of metadata key #0"), "{e}");
    assert!(e.message.contains("need 8 bytes, 6 left"), "{e}");
    let e = bad(Gguf::from_bytes(vec![], "t.gguf"));
    assert!(e.message.contains("empty file"), "{e}");
}

#[test]
fn random_header_flips_never_panic() {
    let full = small_file();
    let g = Gguf::from_bytes(full.clone(), "f.gguf").unwrap();
    let header = g.data_start as usize;
    let mut rng = XorShift::new(0xDEAD_BEEF_1234_5678);
    let (mut ok, mut err) = (0, 0);
    for it in 0..4000 {
        let mut b = full.clone();
        let flips = 1 + rng.below(3);
        for _ in 0..flips {
            let at = if it % 4 == 0 { rng.below(b.len()) } else { rng.below(header) };
            match rng.below(3) {
                0 => b[at] ^= 1 << rng.below(8),
                1 => b[at] = rng.next_u64() as u8,
                _ => b[at] = 0xFF,
            }
        }
        match Gguf::from_bytes(b, "f.gguf") {
            Ok(g) => {
                ok += 1;
                for t in &g.tensors {
                    assert_eq!(g.tensor_data(t).len() as u64, t.size);
                }
            }
            Err(e) => {
                err += 1;
                assert_eq!(e.status, Status::LLMRT_BAD_MODEL, "{e}");
                assert!(e.message.contains("offset"), "{e}");
            }
        }
    }
    assert!(ok > 0 && err > 0, "ok {ok} err {err}");
}

fn header(version: u32, n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(version.to_le_bytes());
    b.extend(n_tensors.to_le_bytes());
    b.extend(n_kv.to_le_bytes());
    b
}

fn push_str(b: &mut Vec<u8>, s: &[u8]) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend_from_slice(s);
}

#[test]
fn huge_counts_fail_fast() {
    let t0 = std::time::Instant::now();
    // Array of u64::MAX bytes.
    let mut b = header(3, 0, 1);
    push_str(&mut b, b"k");
    b.extend(GGUF_TYPE_ARRAY.to_le_bytes());
    b.extend(GGUF_TYPE_U8.to_le_bytes());
    b.extend(u64::MAX.to_le_bytes());
    b.extend([0u8; 64]);
    let e = bad(Gguf::from_bytes(b, "h.gguf"));
    assert!(e.message.contains("18446744073709551615") && e.message.contains("'k'"), "{e}");
    // Array of 2^62 strings (n * 8 overflows).
    let mut b = header(3, 0, 1);
    push_str(&mut b, b"k");
    b.extend(GGUF_TYPE_ARRAY.to_le_bytes());
    b.extend(GGUF_TYPE_STRING.to_le_bytes());
    b.extend((1u64 << 62).to_le_bytes());
    b.extend([0u8; 64]);
    bad(Gguf::from_bytes(b, "h.gguf"));
    // String of u64::MAX bytes, as a key and as a value.
    let mut b = header(3, 0, 1);
    b.extend(u64::MAX.to_le_bytes());
    b.extend([0u8; 64]);
    bad(Gguf::from_bytes(b, "h.gguf"));
    let mut b = header(3, 0, 1);
    push_str(&mut b, b"k");
    b.extend(GGUF_TYPE_STRING.to_le_bytes());
    b.extend((u64::MAX - 3).to_le_bytes());
    b.extend([0u8; 64]);
    let e = bad(Gguf::from_bytes(b, "h.gguf"));
    assert!(e.message.contains("truncated at offset"), "{e}");
    // 2^40 tensors, u64::MAX tensors, u64::MAX keys.
    for (nt, nkv) in [(1u64 << 40, 0u64), (u64::MAX, 0), (0, u64::MAX), (u64::MAX, u64::MAX)] {
        let mut b = header(3, nt, nkv);
        b.extend([0u8; 256]);
        let e = bad(Gguf::from_bytes(b, "h.gguf"));
        assert!(e.message.contains("offset") && e.message.contains("the header claims"), "{e}");
        println!("{e}");
    }
    // Many-element array: fine when the bytes are there, then the per-file budget.
    let mut b = header(3, 0, 1);
    push_str(&mut b, b"k");
    b.extend(GGUF_TYPE_ARRAY.to_le_bytes());
    b.extend(GGUF_TYPE_U8.to_le_bytes());
    b.extend(100_000u64.to_le_bytes());
    b.extend(vec![7u8; 100_000]);
    let g = Gguf::from_bytes(b, "h.gguf").unwrap();
    assert!(matches!(g.get("k"), Some(ValueRef::Array(a)) if a.len() == 100_000));
    assert!(t0.elapsed().as_secs() < 5);
}

/// File offset of the u64 data offset of tensor `name` in `b`.
fn offset_field(b: &[u8], name: &str, n_dims: usize) -> usize {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend(name.as_bytes());
    let at = b.windows(needle.len()).position(|w| w == &needle[..]).unwrap();
    at + needle.len() + 4 + 8 * n_dims + 4
}

#[test]
fn bad_tensor_offsets() {
    let full = small_file();
    let at = offset_field(&full, "w2", 1);
    assert_eq!(u64::from_le_bytes(full[at..at + 8].try_into().unwrap()), 96);
    // Unaligned.
    let mut b = full.clone();
    b[at..at + 8].copy_from_slice(&8u64.to_le_bytes());
    let e = bad(Gguf::from_bytes(b, "o.gguf"));
    assert!(e.message.contains("'w2'") && e.message.contains("alignment 32"), "{e}");
    assert!(e.message.contains(&format!("offset {at}")), "{e}");
    // Aligned but past the end.
    let mut b = full.clone();
    b[at..at + 8].copy_from_slice(&128u64.to_le_bytes());
    let e = bad(Gguf::from_bytes(b, "o.gguf"));
    assert!(e.message.contains("'w2'") && e.message.contains("past the end"), "{e}");
    // Overflowing.
    let mut b = full.clone();
    b[at..at + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    let e = bad(Gguf::from_bytes(b, "o.gguf"));
    assert!(e.message.contains("past the end"), "{e}");
}

#[test]
fn tensor_header_checks() {
    let one = |ne: &[u64], ty: u32, data: Vec<u8>| {
        let mut w = GgufWriter::new();
        w.tensor_raw("t", ne, ty, data);
        Gguf::from_bytes(w.to_bytes(), "x.gguf")
    };
    let e = bad(one(&[32], 99, vec![0; 32]));
    assert!(e.message.contains("'t'") && e.message.contains("unknown ggml type id 99"), "{e}");
    let e = bad(one(&[32], 4, vec![0; 32])); // Q4_2: removed, unknown.
    assert!(e.message.contains("type id 4"), "{e}");
    let g = one(&[256, 2], 16, vec![0; 132]).unwrap(); // IQ2_XXS: known, unsupported.
    assert_eq!(g.tensors[0].dtype, None);
    assert_eq!(g.tensors[0].size, 132);
    let g = one(&[256, 2], 14, vec![0; 420]).unwrap(); // Q6_K: supported.
    assert_eq!(g.tensors[0].dtype, Some(DType::Q6_K));
    let e = bad(one(&[], 0, vec![]));
    assert!(e.message.contains("0 dimensions"), "{e}");
    let e = bad(one(&[1, 1, 1, 1, 1], 0, vec![0; 4]));
    assert!(e.message.contains("5 dimensions"), "{e}");
    let e = bad(one(&[4, 0], 0, vec![]));
    assert!(e.message.contains("dimension 1 = 0"), "{e}");
    let e = bad(one(&[16], 8, vec![0; 34]));
    assert!(e.message.contains("not a multiple") && e.message.contains("Q8_0"), "{e}");
    let e = bad(one(&[1 << 32, 1 << 32, 1 << 32], 0, vec![]));
    assert!(e.message.contains("overflows"), "{e}");
    let e = bad(one(&[1 << 62], 0, vec![]));
    assert!(e.message.contains("overflows"), "{e}");
    let e = bad(one(&[8], 0, vec![0; 31]));
    assert!(e.message.contains("past the end"), "{e}");
    // Duplicate tensor name.
    let mut w = GgufWriter::new();
    w.tensor("t", &[1], DType::F32, vec![0; 4]);
    w.tensor("t", &[1], DType::F32, vec![0; 4]);
    let e = bad(Gguf::from_bytes(w.to_bytes(), "x.gguf"));
    assert!(e.message.contains("duplicate tensor name 't'"), "{e}");
}

#[test]
fn header_and_metadata_checks() {
    let mut b = small_file();
    b[0] = b'X';
    let e = bad(Gguf::from_bytes(b, "m.gguf"));
    assert!(e.message.contains("magic") && e.message.contains("offset 0"), "{e}");
    for v in [0u32, 1, 4, 0xFFFF_FFFF] {
        let mut w = GgufWriter::new();
        w.version(v);
        let e = bad(Gguf::from_bytes(w.to_bytes(), "m.gguf"));
        assert!(e.message.contains(&format!("version {v}")), "{e}");
    }
    // Duplicate key.
    let mut w = GgufWriter::new();
    w.kv("a", Value::U8(1));
    w.kv("a", Value::U8(2));
    let e = bad(Gguf::from_bytes(w.to_bytes(), "m.gguf"));
    assert!(e.message.contains("duplicate metadata key 'a'"), "{e}");
    // Bad alignments.
    for v in [Value::U32(0), Value::U32(48), Value::F32(32.0), Value::I32(-32)] {
        let mut w = GgufWriter::new();
        w.kv("general.alignment", v);
        let e = bad(Gguf::from_bytes(w.to_bytes(), "m.gguf"));
        assert!(e.message.contains("general.alignment"), "{e}");
    }
    // Alignment given as another integer type is accepted.
    let mut w = GgufWriter::new();
    w.kv("general.alignment", Value::U64(16));
    w.tensor("t", &[1], DType::F32, vec![0; 4]);
    assert_eq!(Gguf::from_bytes(w.to_bytes(), "m.gguf").unwrap().alignment, 16);
    // Unknown value type.
    let mut b = header(3, 0, 1);
    push_str(&mut b, b"k");
    b.extend(13u32.to_le_bytes());
    b.extend([0u8; 16]);
    let e = bad(Gguf::from_bytes(b, "m.gguf"));
    assert!(e.message.contains("unknown value type id 13") && e.message.contains("'k'"), "{e}");
    // Bool that is not 0/1.
    let mut b = header(3, 0, 1);
    push_str(&mut b, b"k");
    b.extend(GGUF_TYPE_BOOL.to_le_bytes());
    b.push(2);
    let e = bad(Gguf::from_bytes(b, "m.gguf"));
    assert!(e.message.contains("BOOL"), "{e}");
    // Key that is not UTF-8; value that is not UTF-8 (decoded lossily).
    let mut b = header(3, 0, 1);
    push_str(&mut b, b"k\xff");
    b.extend(GGUF_TYPE_U8.to_le_bytes());
    b.push(0);
    let e = bad(Gguf::from_bytes(b, "m.gguf"));
    assert!(e.message.contains("UTF-8") && e.message.contains("offset 33"), "{e}");
    let mut b = header(3, 0, 1);
    push_str(&mut b, b"k");
    b.extend(GGUF_TYPE_STRING.to_le_bytes());
    push_str(&mut b, b"a\xffb");
    let g = Gguf::from_bytes(b, "m.gguf").unwrap();
    assert_eq!(g.get_str("k").unwrap(), Some("a\u{FFFD}b"));
    // Arrays nested too deep.
    let mut v = Value::Array(vec![Value::U8(1)]);
    for _ in 0..MAX_ARRAY_DEPTH {
        v = Value::Array(vec![v]);
    }
    let mut w = GgufWriter::new();
    w.kv("deep", v);
    let e = bad(Gguf::from_bytes(w.to_bytes(), "m.gguf"));
    assert!(e.message.contains("deeper"), "{e}");
}

#[test]
fn io_errors() {
    let dir = tmp_path("dir");
    std::fs::create_dir(&dir).unwrap();
    let e = Gguf::open(&dir).unwrap_err();
    assert_eq!(e.status, Status::LLMRT_IO, "{e}");
    assert!(e.message.contains("directory"), "{e}");
    std::fs::remove_dir(&dir).unwrap();

    let missing = tmp_path("missing.gguf");
    let e = Gguf::open(&missing).unwrap_err();
    assert_eq!(e.status, Status::LLMRT_IO, "{e}");
    assert!(e.message.contains(&missing.display().to_string()), "{e}");

    let empty = tmp_path("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let e = bad(Gguf::open(&empty));
    assert!(e.message.contains("empty file"), "{e}");
    std::fs::remove_file(&empty).unwrap();

    let dev = Path::new("/dev/null");
    if dev.exists() {
        let e = Gguf::open(dev).unwrap_err();
        assert_eq!(e.status, Status::LLMRT_IO, "{e}");
        assert!(e.message.contains("not a regular file"), "{e}");
    }
}

#[test]
fn stories260k() {
    let p = Path::new("/work/shared/models/stories260K/stories260K.gguf");
    if !p.exists() {
        println!("skipping: {} not present", p.display());
        return;
    }
    let g = Gguf::open(p).unwrap();
    assert_eq!(g.get_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(g.get_u32("llama.block_count").unwrap(), Some(5));
    let t = g.tensor("token_embd.weight").unwrap();
    assert_eq!(t.ne, vec![64, 512]);
    assert_eq!(t.dtype, Some(DType::F32));
    assert_eq!(g.tensor_data(t).len(), 64 * 512 * 4);
}
