//! A cache's saved state: its KV and its token history as bytes, and back
//! (`llmrt_cache_save` / `llmrt_cache_load`, `Model::cache_save` / `cache_load`).
//!
//! Format versions 1 and 2, every integer little-endian. Version 1 (a cache holding
//! every position):
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 8 | magic `LLMRTKV\0` |
//! | 8 | 4 | format version (1) |
//! | 12 | 4 | KV element type: 1 = f32 (the CPU backend), 2 = f16 (CUDA) |
//! | 16 | 8 | model fingerprint ([`model_fingerprint`]) |
//! | 24 | 4 | layers |
//! | 28 | 4 | KV heads |
//! | 32 | 4 | head dimension |
//! | 36 | 4 | vocabulary size |
//! | 40 | 4 | capacity: positions the saved cache had reserved |
//! | 44 | 4 | length `n`: positions it held |
//! | 48 | 4 n | the token at each position (the sampler's penalty history) |
//! | 48 + 4 n | L 2 n D e | KV: for each layer, K then V, for each position, `D` = heads x head dim values of `e` bytes |
//! | end - 4 | 4 | CRC-32 ([`crate::util::crc32`]) of every byte before it |
//!
//! Version 2 is written only for a windowed cache (`crate::kv`: the load option
//! `kv_window_only`) whose first positions were freed: the same header, then at offset
//! 48 the first position held `f` (4 bytes, a multiple of 16, `0 < f <= n`), then the
//! `n` tokens at 52, then the KV of the positions `f..n` only (`L 2 (n - f) D e` bytes,
//! laid out as version 1's for `n - f` positions), then the CRC-32. It loads only into
//! a model whose caches are windowed with a window the held positions cover.
//!
//! The KV section is laid out by position, not by block: a state does not depend on
//! the block size or on which physical blocks the cache happened to hold, and loads
//! into any free blocks. It is tied to the model (fingerprint, geometry) and to the KV
//! element type (a CPU state does not load on CUDA, nor the reverse).
//!
//! [`parse`] checks, in this order: the length against the fixed part, the magic, the
//! version, the element type, the geometry, the fingerprint, the length and capacity
//! fields against the buffer's length, the checksum, then every token against the
//! vocabulary. Each failure is `LLMRT_INVALID_ARGUMENT` naming the offset and the
//! field; nothing is allocated from a field before it was checked against the model
//! and against the buffer's length.

use crate::model::weights::{Matrix, Weights};
use crate::model::{Config, RopeStyle};
use crate::util::{crc32, try_with_capacity, Fnv1a64};
use crate::{Error, Result};

/// The first 8 bytes of every state.
pub const MAGIC: [u8; 8] = *b"LLMRTKV\0";
/// The format version of a state holding every position.
pub const VERSION: u32 = 1;
/// The format version of a windowed cache's state without its first positions.
pub const VERSION_WINDOW: u32 = 2;
/// Bytes before the tokens (version 1; version 2 has 4 more: [`OFF_FIRST`]).
pub const HEADER_BYTES: usize = 48;
/// Version 2: the first position held.
const OFF_FIRST: usize = 48;
/// The trailing checksum.
pub const CHECKSUM_BYTES: usize = 4;

/// Offsets of the header fields.
const OFF_VERSION: usize = 8;
const OFF_DTYPE: usize = 12;
const OFF_FINGERPRINT: usize = 16;
const OFF_LAYERS: usize = 24;
const OFF_KV_HEADS: usize = 28;
const OFF_HEAD_DIM: usize = 32;
const OFF_VOCAB: usize = 36;
const OFF_CAPACITY: usize = 40;
const OFF_LENGTH: usize = 44;

/// The element type of a backend's KV storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    F16,
}

impl KvDtype {
    /// Its code in a state's header.
    pub fn code(self) -> u32 {
        match self {
            KvDtype::F32 => 1,
            KvDtype::F16 => 2,
        }
    }

    fn from_code(c: u32) -> Option<KvDtype> {
        match c {
            1 => Some(KvDtype::F32),
            2 => Some(KvDtype::F16),
            _ => None,
        }
    }

    /// Bytes of one element.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32 (CPU backend)",
            KvDtype::F16 => "f16 (CUDA backend)",
        }
    }
}

/// What a state must match: the loaded model's side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub fingerprint: u64,
    pub dtype: KvDtype,
    pub n_layers: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub vocab_size: u32,
}

impl Geometry {
    /// Values of one K (or V) row of one position.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads as usize * self.head_dim as usize
    }

    /// Bytes of the KV section of `len` positions (None past `usize`).
    pub fn kv_bytes(&self, len: u32) -> Option<usize> {
        (self.n_layers as usize)
            .checked_mul(2)?
            .checked_mul(len as usize)?
            .checked_mul(self.kv_dim())?
            .checked_mul(self.dtype.bytes())
    }

    /// Bytes of a whole state of `len` positions holding those from `first` on (None
    /// past `usize`).
    pub fn state_bytes(&self, len: u32, first: u32) -> Option<usize> {
        (len as usize)
            .checked_mul(4)?
            .checked_add(header_bytes(first) + CHECKSUM_BYTES)?
            .checked_add(self.kv_bytes(len.checked_sub(first)?)?)
    }

    /// Where the KV section of a state of `len` positions from `first` on starts.
    pub fn kv_offset(len: u32, first: u32) -> usize {
        header_bytes(first) + 4 * len as usize
    }
}

/// Bytes before the tokens of a state holding the positions from `first` on.
fn header_bytes(first: u32) -> usize {
    if first == 0 {
        HEADER_BYTES
    } else {
        HEADER_BYTES + 4
    }
}

/// The element index, in the KV section of a state of `len` positions, of position
/// `pos` of layer `layer`'s K (`v = 0`) or V (`v = 1`) rows of `kv_dim` values.
pub fn kv_index(layer: usize, v: usize, len: usize, pos: usize, kv_dim: usize) -> usize {
    ((layer * 2 + v) * len + pos) * kv_dim
}

/// Checks a KV section's size and block table for `len` positions (backends call it
/// before they copy): `LLMRT_INTERNAL`, a caller's bug, when they do not match.
pub fn check_section(
    n_layers: usize,
    kv_dim: usize,
    elem: usize,
    blocks: &[crate::kv::BlockId],
    len: usize,
    bytes: usize,
) -> Result<()> {
    let want = n_layers.checked_mul(2 * kv_dim * elem).and_then(|v| v.checked_mul(len));
    if want != Some(bytes) || blocks.len() < len.div_ceil(crate::kv::BLOCK_POSITIONS) {
        return Err(Error::internal(format!(
            "KV state copy: {bytes} bytes and {} blocks for {len} positions of {n_layers} layers x {kv_dim} x {elem} \
             bytes",
            blocks.len()
        )));
    }
    Ok(())
}

/// Writes the header and the tokens of a state holding the positions from `first` on
/// (version 1 when 0, else 2) into the start of `out` (at least
/// `Geometry::kv_offset(tokens.len(), first)` bytes); the KV section follows, then [`seal`].
pub fn write_header(g: &Geometry, capacity: u32, tokens: &[u32], first: u32, out: &mut [u8]) {
    out[..8].copy_from_slice(&MAGIC);
    let put = |out: &mut [u8], off: usize, v: u32| out[off..off + 4].copy_from_slice(&v.to_le_bytes());
    put(out, OFF_VERSION, if first == 0 { VERSION } else { VERSION_WINDOW });
    put(out, OFF_DTYPE, g.dtype.code());
    out[OFF_FINGERPRINT..OFF_FINGERPRINT + 8].copy_from_slice(&g.fingerprint.to_le_bytes());
    put(out, OFF_LAYERS, g.n_layers);
    put(out, OFF_KV_HEADS, g.n_kv_heads);
    put(out, OFF_HEAD_DIM, g.head_dim);
    put(out, OFF_VOCAB, g.vocab_size);
    put(out, OFF_CAPACITY, capacity);
    put(out, OFF_LENGTH, tokens.len() as u32);
    if first > 0 {
        put(out, OFF_FIRST, first);
    }
    let at = header_bytes(first);
    for (d, t) in out[at..at + 4 * tokens.len()].chunks_exact_mut(4).zip(tokens) {
        d.copy_from_slice(&t.to_le_bytes());
    }
}

/// Writes the checksum into the last 4 bytes of a whole state.
pub fn seal(state: &mut [u8]) {
    let n = state.len() - CHECKSUM_BYTES;
    let c = crc32(&state[..n]);
    state[n..].copy_from_slice(&c.to_le_bytes());
}

/// A checked state: its fields and views of its sections.
#[derive(Debug)]
pub struct Parsed<'a> {
    /// Positions the saved cache had reserved (>= `tokens.len()`).
    pub capacity: u32,
    /// The token at each position, each below the vocabulary size.
    pub tokens: Vec<u32>,
    /// The first position the KV section holds (0, or a version 2 state's).
    pub first: u32,
    /// The KV section (`Geometry::kv_bytes(len - first)` bytes).
    pub kv: &'a [u8],
}

fn u32_at(d: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([d[off], d[off + 1], d[off + 2], d[off + 3]])
}

/// Checks a state against the model `g` and its own length and checksum (see the
/// module comment for the order); `LLMRT_INVALID_ARGUMENT` naming the offset and the
/// field at fault.
pub fn parse<'a>(g: &Geometry, data: &'a [u8]) -> Result<Parsed<'a>> {
    let bad = |m: String| Err(Error::invalid(format!("cache state: {m}")));
    let fixed = HEADER_BYTES + CHECKSUM_BYTES;
    if data.len() < fixed {
        return bad(format!(
            "{} bytes, shorter than the {fixed} bytes of a state's header ({HEADER_BYTES}) and checksum \
             ({CHECKSUM_BYTES}): truncated, or not a state",
            data.len()
        ));
    }
    if data[..8] != MAGIC {
        return bad(format!("offset 0: magic {:02x?} is not \"LLMRTKV\\0\": not an llmrt cache state", &data[..8]));
    }
    let version = u32_at(data, OFF_VERSION);
    if version != VERSION && version != VERSION_WINDOW {
        return bad(format!(
            "offset {OFF_VERSION}: format version {version}; this library reads versions {VERSION} and \
             {VERSION_WINDOW} only"
        ));
    }
    let code = u32_at(data, OFF_DTYPE);
    let Some(dtype) = KvDtype::from_code(code) else {
        return bad(format!("offset {OFF_DTYPE}: KV element type {code} is not 1 (f32) or 2 (f16)"));
    };
    if dtype != g.dtype {
        return bad(format!(
            "offset {OFF_DTYPE}: the state holds {} KV, this model keeps {} KV (load it on the backend that saved it)",
            dtype.name(),
            g.dtype.name()
        ));
    }
    for (off, what, want) in [
        (OFF_LAYERS, "layers", g.n_layers),
        (OFF_KV_HEADS, "KV heads", g.n_kv_heads),
        (OFF_HEAD_DIM, "head dimension", g.head_dim),
        (OFF_VOCAB, "vocabulary size", g.vocab_size),
    ] {
        let got = u32_at(data, off);
        if got != want {
            return bad(format!("offset {off}: {what} {got}, this model has {want}: another model's state"));
        }
    }
    let mut fp = [0u8; 8];
    fp.copy_from_slice(&data[OFF_FINGERPRINT..OFF_FINGERPRINT + 8]);
    let fp = u64::from_le_bytes(fp);
    if fp != g.fingerprint {
        return bad(format!(
            "offset {OFF_FINGERPRINT}: model fingerprint {fp:016x}, this model's is {:016x}: another model's \
             state (other weights, types or hyperparameters)",
            g.fingerprint
        ));
    }
    let capacity = u32_at(data, OFF_CAPACITY);
    let len = u32_at(data, OFF_LENGTH);
    if capacity < len {
        return bad(format!("offset {OFF_CAPACITY}: capacity {capacity} is below the length {len} (offset 44)"));
    }
    let first = if version == VERSION_WINDOW {
        if data.len() < fixed + 4 {
            return bad(format!(
                "{} bytes, shorter than the {} bytes of a version {VERSION_WINDOW} state's header and checksum",
                data.len(),
                fixed + 4
            ));
        }
        let f = u32_at(data, OFF_FIRST);
        if f == 0 || f > len || !(f as usize).is_multiple_of(crate::kv::BLOCK_POSITIONS) {
            return bad(format!(
                "offset {OFF_FIRST}: first position held {f} is not a multiple of {} in 1..={len}",
                crate::kv::BLOCK_POSITIONS
            ));
        }
        f
    } else {
        0
    };
    let need = g.state_bytes(len, first);
    if need != Some(data.len()) {
        let need = need.map_or_else(|| "more than the address space".to_string(), |n| format!("{n} bytes"));
        return bad(format!(
            "offset {OFF_LENGTH}: length {len} positions needs {need} ({} header + 4 per token + {} per position \
             of KV{} + {CHECKSUM_BYTES} checksum); the state has {} bytes (truncated or corrupt)",
            header_bytes(first),
            g.kv_bytes(1).unwrap_or(0),
            if first > 0 { format!(" from position {first}") } else { String::new() },
            data.len()
        ));
    }
    let body = data.len() - CHECKSUM_BYTES;
    let stored = u32_at(data, body);
    let computed = crc32(&data[..body]);
    if stored != computed {
        return bad(format!(
            "offset {body}: checksum {stored:08x} differs from the CRC-32 {computed:08x} of bytes 0..{body}: the \
             state is corrupt"
        ));
    }
    let (tok_at, kv_at) = (header_bytes(first), Geometry::kv_offset(len, first));
    // len * 4 <= data.len(): the allocation is bounded by the caller's buffer.
    let mut tokens = try_with_capacity(len as usize, "the state's token history")?;
    for (i, c) in data[tok_at..kv_at].chunks_exact(4).enumerate() {
        let t = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        if t >= g.vocab_size {
            return bad(format!(
                "offset {}: token {t} at position {i} is outside the vocabulary (size {})",
                tok_at + 4 * i,
                g.vocab_size
            ));
        }
        tokens.push(t);
    }
    Ok(Parsed { capacity, tokens, first, kv: &data[kv_at..body] })
}

/// Bytes of a matrix the fingerprint reads: all of it up to 3 windows, else windows at
/// its start, middle and end.
const WINDOW: usize = 4096;

/// The model fingerprint of a state: FNV-1a 64 over what makes a cache's KV mean the
/// same thing. It covers the architecture's options (name, RoPE pairing, Q/K/V biases,
/// Q/K norms), the hyperparameters the forward pass uses (vocabulary, hidden size,
/// layers, heads, KV heads, head dimension, FFN size, RMSNorm epsilon, RoPE base and
/// linear factor), every norm and bias vector and the RoPE frequency divisors in full,
/// and of every weight matrix its type, shape and bytes: all of a matrix of up to 12 KiB,
/// else 4 KiB at its start, its middle and its end. Not covered: tensor names, the
/// tokenizer, chat template and other metadata, the context length and load options;
/// two models that differ only inside the unread parts of large matrices share a
/// fingerprint (cheap by design: a few pages per matrix, read once at load).
pub fn model_fingerprint(cfg: &Config, w: &Weights) -> u64 {
    let mut h = Fnv1a64::new();
    h.str("llmrt model fingerprint 1");
    let a = &cfg.arch;
    h.str(&a.name);
    h.u64(match a.rope_style {
        RopeStyle::Adjacent => 0,
        RopeStyle::Neox => 1,
    });
    h.u64(a.qkv_bias as u64).u64(a.qk_norm as u64);
    for v in [cfg.vocab_size, cfg.hidden, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn] {
        h.u64(v as u64);
    }
    for v in [cfg.rms_eps, cfg.rope_theta, cfg.rope_linear_factor] {
        h.u64(v.to_bits() as u64);
    }
    // Newer options only when they are used, so fingerprints of earlier models stay.
    if a.fused_gate_up || cfg.rope_attn_factor != 1.0 {
        h.u64(a.fused_gate_up as u64).u64(cfg.rope_attn_factor.to_bits() as u64);
    }
    if cfg.rope_dim != cfg.head_dim {
        h.str("partial rotary").u64(cfg.rope_dim as u64);
    }
    // The options added with gemma2 / gemma3 and the sliding window, hashed only where
    // a model has one (the fingerprints of the other models stay what they were).
    if a.ffn_act != crate::model::FfnAct::Silu || a.post_norms || a.norm_plus_one {
        h.str("gemma").u64(a.ffn_act as u64).u64(a.post_norms as u64).u64(a.norm_plus_one as u64);
    }
    let default_scale = 1.0 / (cfg.head_dim as f32).sqrt();
    if cfg.embed_scale != 1.0 || cfg.attn_scale != default_scale || cfg.attn_softcap != 0.0 || cfg.final_softcap != 0.0
    {
        for v in [cfg.embed_scale, cfg.attn_scale, cfg.attn_softcap, cfg.final_softcap] {
            h.u64(v.to_bits() as u64);
        }
    }
    if cfg.sliding_window.is_some() {
        h.str("sliding window");
        for l in 0..w.layers.len() {
            h.u64(cfg.window(l).map_or(u64::MAX, |w| w as u64)).u64(cfg.local_rope(l) as u64);
        }
        if let Some(r) = cfg.sliding_window.as_ref().and_then(|s| s.rope) {
            h.u64(r.theta.to_bits() as u64).u64(r.linear_factor.to_bits() as u64);
        }
    }
    let vector = |h: &mut Fnv1a64, v: Option<&Vec<f32>>| {
        match v {
            None => h.u64(u64::MAX),
            Some(v) => {
                h.u64(v.len() as u64);
                for x in v {
                    h.bytes(&x.to_bits().to_le_bytes());
                }
                h
            }
        };
    };
    let matrix = |h: &mut Fnv1a64, m: &Matrix| {
        h.str(m.dtype.name()).u64(m.rows as u64).u64(m.cols as u64);
        let b = m.bytes(w);
        if b.len() <= 3 * WINDOW {
            h.bytes(b);
        } else {
            let mid = b.len() / 2 - WINDOW / 2;
            h.bytes(&b[..WINDOW]).bytes(&b[mid..mid + WINDOW]).bytes(&b[b.len() - WINDOW..]);
        }
    };
    matrix(&mut h, &w.token_embd);
    for l in &w.layers {
        vector(&mut h, Some(&l.attn_norm));
        let ms = l.matrices();
        for m in &ms[..4] {
            matrix(&mut h, m);
        }
        for v in [&l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm] {
            vector(&mut h, v.as_ref());
        }
        for v in [&l.post_attn_norm, &l.post_ffn_norm].into_iter().flatten() {
            vector(&mut h, Some(v));
        }
        vector(&mut h, Some(&l.ffn_norm));
        for m in &ms[4..] {
            matrix(&mut h, m);
        }
        if let crate::model::weights::Ffn::Moe(moe) = &l.ffn {
            vector(&mut h, moe.shared.as_ref().map(|s| &s.1));
        }
    }
    vector(&mut h, Some(&w.output_norm));
    matrix(&mut h, &w.output);
    vector(&mut h, w.rope_freqs.as_ref());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        Geometry { fingerprint: 0x1234, dtype: KvDtype::F32, n_layers: 2, n_kv_heads: 1, head_dim: 2, vocab_size: 10 }
    }

    fn state(g: &Geometry, capacity: u32, tokens: &[u32]) -> Vec<u8> {
        state_from(g, capacity, tokens, 0)
    }

    fn state_from(g: &Geometry, capacity: u32, tokens: &[u32], first: u32) -> Vec<u8> {
        let n = g.state_bytes(tokens.len() as u32, first).unwrap();
        let mut s = vec![0u8; n];
        write_header(g, capacity, tokens, first, &mut s);
        let kv = Geometry::kv_offset(tokens.len() as u32, first);
        for (i, b) in s[kv..n - 4].iter_mut().enumerate() {
            *b = i as u8;
        }
        seal(&mut s);
        s
    }

    #[test]
    fn a_written_state_parses_back() {
        let g = geo();
        let s = state(&g, 8, &[3, 1, 4]);
        assert_eq!(s.len(), 48 + 12 + 2 * 2 * 3 * 2 * 4 + 4);
        let p = parse(&g, &s).unwrap();
        assert_eq!((p.capacity, p.tokens.as_slice()), (8, &[3u32, 1, 4][..]));
        assert_eq!(p.kv.len(), 96);
        assert_eq!(p.kv[5], 5);
        let empty = state(&g, 0, &[]);
        assert!(parse(&g, &empty).unwrap().tokens.is_empty());
        // Version 2: positions 16..20 held of 20.
        let toks: Vec<u32> = (0..20).map(|i| i % 10).collect();
        let s = state_from(&g, 40, &toks, 16);
        assert_eq!(u32_at(&s, 8), 2);
        assert_eq!(s.len(), 52 + 80 + 2 * 2 * 4 * 2 * 4 + 4);
        let p = parse(&g, &s).unwrap();
        assert_eq!((p.capacity, p.first, p.tokens.as_slice(), p.kv.len()), (40, 16, &toks[..], 128));
    }

    #[test]
    fn a_version_2_first_position_is_checked() {
        let g = geo();
        let toks: Vec<u32> = (0..20).map(|i| i % 10).collect();
        let s = state_from(&g, 40, &toks, 16);
        for f in [0u32, 8, 32] {
            let mut t = s.clone();
            t[48..52].copy_from_slice(&f.to_le_bytes());
            seal(&mut t);
            let e = parse(&g, &t).unwrap_err();
            assert!(e.message.contains(&format!("offset 48: first position held {f} is not")), "{}", e.message);
        }
        // A version 1 state relabelled 2: its sizes no longer add up.
        let mut t = state(&g, 40, &toks);
        t[8..12].copy_from_slice(&2u32.to_le_bytes());
        seal(&mut t);
        assert_eq!(parse(&g, &t).unwrap_err().status, crate::Status::LLMRT_INVALID_ARGUMENT);
    }

    #[test]
    fn every_field_is_checked_and_named() {
        let g = geo();
        let s = state(&g, 8, &[3, 1, 4]);
        let err = |s: &[u8]| parse(&g, s).unwrap_err();
        let with = |off: usize, v: u32| {
            let mut t = s.clone();
            t[off..off + 4].copy_from_slice(&v.to_le_bytes());
            seal(&mut t);
            t
        };
        for (bytes, want) in [
            (with(8, 3), "offset 8: format version 3"),
            (with(12, 2), "offset 12: the state holds f16"),
            (with(12, 7), "offset 12: KV element type 7"),
            (with(24, 3), "offset 24: layers 3"),
            (with(28, 2), "offset 28: KV heads 2"),
            (with(32, 4), "offset 32: head dimension 4"),
            (with(36, 11), "offset 36: vocabulary size 11"),
            (with(16, 0x1235), "offset 16: model fingerprint 0000000000001235"),
            (with(40, 2), "offset 40: capacity 2 is below the length 3"),
            (with(44, 2), "offset 44: length 2 positions needs"),
            (with(44, u32::MAX), "offset 40: capacity 8 is below the length 4294967295"),
            (with(48 + 4, 10), "offset 52: token 10 at position 1"),
        ] {
            let e = err(&bytes);
            assert_eq!(e.status, crate::Status::LLMRT_INVALID_ARGUMENT);
            assert!(e.message.contains(want), "want {want:?}: {}", e.message);
        }
        let mut t = s.clone();
        t[0] = b'X';
        assert!(err(&t).message.contains("offset 0: magic"));
        let mut t = s.clone();
        t[70] ^= 4;
        assert!(err(&t).message.contains(&format!("offset {}: checksum", s.len() - 4)), "{}", err(&t).message);
        assert!(err(&s[..51]).message.contains("51 bytes, shorter than the 52"));
        assert!(err(&s[..s.len() - 1]).message.contains("offset 44: length 3"));
    }
}
