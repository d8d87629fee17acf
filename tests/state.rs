//! Saved cache states (`Model::cache_save` / `cache_load`, `llmrt_cache_save` /
//! `llmrt_cache_load`): a loaded cache continues exactly as the saved one (next
//! logits bit for bit, sampled tokens with penalties), after fork and truncate and
//! after the original is gone; and every state that is not this model's, is cut
//! short, has a flipped bit or another format version is refused with
//! LLMRT_INVALID_ARGUMENT naming the offset, leaving the pool as it was.
mod common;
use common::{fixtures, last_error};
use llmrt::ffi::{llmrt_cache_load, llmrt_cache_save, llmrt_model_free, llmrt_model_load};
use llmrt::sample::SamplerParams;
use llmrt::util::crc32;
use llmrt::{BackendKind, LoadOptions, Model, Status};
use std::path::PathBuf;

fn gguf(model: &str, ty: &str) -> PathBuf {
    fixtures().join(model).join(format!("{model}.{ty}.gguf"))
}

fn load_kv(model: &str, ty: &str, kv_cache_bytes: u64) -> Model {
    let p = gguf(model, ty);
    let opts = LoadOptions { backend: BackendKind::Cpu, threads: 2, kv_cache_bytes, ..Default::default() };
    Model::load(&p, opts).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn load(model: &str, ty: &str) -> Model {
    load_kv(model, ty, 16 << 20)
}

/// `n` token ids spread over the vocabulary (deterministic).
fn tokens(m: &Model, n: usize, salt: u32) -> Vec<u32> {
    let v = m.info().vocab_size;
    (0..n as u32).map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(salt.wrapping_mul(40_503)) >> 7) % v).collect()
}

fn decode(m: &Model, c: u64, t: u32) -> Vec<f32> {
    let mut row = vec![0f32; m.info().vocab_size as usize];
    m.decode(&[c], &[t], Some(&mut row)).unwrap_or_else(|e| panic!("decode on cache {c}: {e}"));
    row
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Decodes `steps` tokens on both caches (the same ones) and checks every logit row is
/// bit-identical.
fn same_continuation(m: &Model, a: u64, b: u64, steps: usize, what: &str) {
    assert_eq!(m.cache_tokens(a).unwrap(), m.cache_tokens(b).unwrap(), "{what}: token history");
    assert_eq!(m.cache_length(a).unwrap(), m.cache_length(b).unwrap(), "{what}: length");
    let mut t = tokens(m, 1, 99)[0];
    for s in 0..steps {
        let (ra, rb) = (decode(m, a, t), decode(m, b, t));
        assert_eq!(bits(&ra), bits(&rb), "{what}: logits of step {s} differ");
        t = llmrt::util::argmax(&ra);
    }
}

#[test]
fn round_trip_gives_bit_identical_logits() {
    for (model, ty) in
        [("llama_gqa", "f32"), ("llama_gqa", "q8_0"), ("qwen2", "f16"), ("qwen3", "f16"), ("llama_mha_tied", "f16")]
    {
        let m = load(model, ty);
        // Lengths inside a block, at a block's end, past it, and empty.
        for n in [0usize, 5, 16, 21, 40] {
            let what = format!("{model}.{ty} with {n} positions");
            let a = m.cache_reserve(64).unwrap();
            if n > 0 {
                m.prefill(a, &tokens(&m, n, 1), None, false).unwrap();
            }
            let state = m.cache_save(a).unwrap();
            let kvpp = m.info().kv_bytes_per_position as usize;
            assert_eq!(state.len(), 52 + 4 * n + n * kvpp, "{what}: state size");
            assert_eq!(m.cache_state_size(a).unwrap(), state.len());
            let b = m.cache_load(&state, 0).unwrap();
            assert_ne!(a, b);
            // Saving the loaded cache gives the same bytes.
            assert_eq!(m.cache_save(b).unwrap(), state, "{what}: state of the loaded cache");
            same_continuation(&m, a, b, 3, &what);
            m.cache_release(a).unwrap();
            m.cache_release(b).unwrap();
        }
        assert_eq!(m.kv_usage().0, 0);
    }
}

#[test]
fn round_trip_after_fork_and_truncate_and_release() {
    let m = load("llama_gqa", "f32");
    let a = m.cache_reserve(80).unwrap();
    m.prefill(a, &tokens(&m, 19, 2), None, false).unwrap();
    let f = m.cache_fork(a).unwrap();
    // The fork shares a's blocks, then writes its own tail (copy-on-write).
    m.prefill(f, &tokens(&m, 7, 3), None, false).unwrap();
    m.cache_truncate(a, 9).unwrap();
    m.prefill(a, &tokens(&m, 4, 4), None, false).unwrap();
    for (c, what) in [(a, "truncated and extended"), (f, "fork")] {
        let state = m.cache_save(c).unwrap();
        let b = m.cache_load(&state, 0).unwrap();
        same_continuation(&m, c, b, 2, what);
        m.cache_release(b).unwrap();
    }

    // The state outlives its cache: the original's blocks go back to the pool and are
    // written over by other caches before the load.
    let c = m.cache_reserve(48).unwrap();
    let toks = tokens(&m, 33, 5);
    m.prefill(c, &toks, None, false).unwrap();
    let state = m.cache_save(c).unwrap();
    let next = tokens(&m, 1, 6)[0];
    let f2 = m.cache_fork(c).unwrap();
    let want = decode(&m, f2, next);
    m.cache_release(f2).unwrap();
    m.cache_release(c).unwrap();
    let other = m.cache_reserve(64).unwrap();
    m.prefill(other, &tokens(&m, 64, 7), None, false).unwrap();
    let b = m.cache_load(&state, 0).unwrap();
    assert_eq!(m.cache_tokens(b).unwrap(), toks);
    assert_eq!(bits(&decode(&m, b, next)), bits(&want), "loaded after the original's release");
    // The loaded cache has the saved capacity: 48 positions, 34 used.
    assert_eq!(m.prefill(b, &[1; 15], None, false).unwrap_err().status, Status::LLMRT_CONTEXT_FULL);
    m.prefill(b, &[1; 14], None, false).unwrap();
    for c in [a, f, other, b] {
        m.cache_release(c).unwrap();
    }

    // A second load of the same file takes the first one's states.
    let m2 = load("llama_gqa", "f32");
    let b2 = m2.cache_load(&state, 0).unwrap();
    assert_eq!(bits(&decode(&m2, b2, next)), bits(&want), "loaded into another load of the file");
}

#[test]
fn saved_history_drives_the_penalties() {
    let m = load("llama_gqa", "f32");
    let v = m.info().vocab_size;
    let a = m.cache_reserve(64).unwrap();
    let prompt = tokens(&m, 12, 8);
    m.prefill(a, &prompt, None, false).unwrap();
    let state = m.cache_save(a).unwrap();
    let b = m.cache_load(&state, 0).unwrap();
    // Every token of the window banned (presence penalty), a repetition penalty, then the
    // argmax: the pick depends on the history alone besides the logits.
    let p = SamplerParams {
        temperature: 0.0,
        repetition_penalty: 1.3,
        presence_penalty: 1e4,
        frequency_penalty: 0.5,
        ..Default::default()
    };
    let feed = prompt[3];
    let fa = m.cache_fork(a).unwrap();
    let mut g = [0u32];
    m.decode_greedy(&[fa], &[feed], &mut g).unwrap();
    let (mut sa, mut sb) = ([0u32], [0u32]);
    m.decode_sample(&[a], &[feed], &p, &mut sa).unwrap();
    m.decode_sample(&[b], &[feed], &p, &mut sb).unwrap();
    assert_eq!(sa, sb, "sampled with penalties: original vs loaded");
    assert!(!prompt.contains(&sa[0]) && sa[0] != feed, "the presence penalty bans the history");
    // The same KV with another saved history: the picked token now counts as seen and
    // is passed over. (The history is part of the state, not recomputed from the KV.)
    let mut edited = state.clone();
    edited[48..52].copy_from_slice(&sa[0].to_le_bytes());
    let n = edited.len() - 4;
    let c = crc32(&edited[..n]);
    edited[n..].copy_from_slice(&c.to_le_bytes());
    let e = m.cache_load(&edited, 0).unwrap();
    let mut ge = [0u32];
    let fe = m.cache_fork(e).unwrap();
    m.decode_greedy(&[fe], &[feed], &mut ge).unwrap();
    assert_eq!(ge, g, "the greedy pick reads the KV only");
    let mut se = [0u32];
    m.decode_sample(&[e], &[feed], &p, &mut se).unwrap();
    assert_ne!(se, sa, "the penalties read the loaded history");
    assert!(se[0] < v);
}

/// The pool and the live caches, to check that a failed load changes neither.
fn pool(m: &Model) -> ((usize, usize, usize), Vec<u64>) {
    let mut ids = m.cache_ids();
    ids.sort_unstable();
    (m.kv_usage(), ids)
}

fn refused(m: &Model, data: &[u8], want: &str, what: &str) {
    let before = pool(m);
    let e = m.cache_load(data, 0).expect_err(what);
    assert_eq!(e.status, Status::LLMRT_INVALID_ARGUMENT, "{what}: {}", e.message);
    assert!(e.message.contains(want), "{what}: expected {want:?} in: {}", e.message);
    assert_eq!(pool(m), before, "{what}: the pool changed");
}

#[test]
fn another_models_state_is_refused() {
    let m = load("llama_gqa", "f32");
    let a = m.cache_reserve(32).unwrap();
    m.prefill(a, &tokens(&m, 6, 9), None, false).unwrap();
    let state = m.cache_save(a).unwrap();
    // llama3_rope has llama_gqa's geometry (2 layers, 2 KV heads of 16, vocabulary 384):
    // only the fingerprint tells them apart; so for the f16 file of the same model.
    for (model, ty, want) in [
        ("llama3_rope", "f32", "offset 16: model fingerprint"),
        ("llama_gqa", "f16", "offset 16: model fingerprint"),
        ("llama_gqa", "q8_0", "offset 16: model fingerprint"),
        ("qwen3", "f32", "offset 32: head dimension 16, this model has 32"),
        ("llama_mha_tied", "f32", "offset 28: KV heads 2, this model has 4"),
    ] {
        let other = load(model, ty);
        let r = other.cache_reserve(16).unwrap();
        refused(&other, &state, want, &format!("llama_gqa.f32's state into {model}.{ty}"));
        other.cache_release(r).unwrap();
    }
    // And the other way: qwen3's state into llama_gqa.
    let q = load("qwen3", "f32");
    let c = q.cache_reserve(16).unwrap();
    q.prefill(c, &[1, 2, 3], None, false).unwrap();
    refused(&m, &q.cache_save(c).unwrap(), "offset 32: head dimension 32", "qwen3's state into llama_gqa");
}

/// A small state (3 positions: 1,600 bytes): every truncation, every single-bit flip,
/// a version bump, a length that lies: refused, naming the offset, the pool unchanged.
#[test]
fn damaged_states_are_refused_and_change_nothing() {
    let m = load("llama_gqa", "f32");
    let a = m.cache_reserve(16).unwrap();
    m.prefill(a, &tokens(&m, 3, 10), None, false).unwrap();
    let state = m.cache_save(a).unwrap();
    let n = state.len();
    assert_eq!(n, 52 + 12 + 3 * 512);
    let kept = m.cache_reserve(20).unwrap();
    for cut in 0..n {
        let want = if cut < 52 { "shorter than the 52 bytes" } else { "offset 44: length 3 positions" };
        refused(&m, &state[..cut], want, &format!("truncated to {cut} bytes"));
    }
    let mut longer = state.clone();
    longer.push(0);
    refused(&m, &longer, "offset 44: length 3 positions", "one byte more");
    for byte in 0..n {
        for bit in 0..8 {
            let mut s = state.clone();
            s[byte] ^= 1 << bit;
            let want = match byte {
                0..=7 => "offset 0: magic".to_string(),
                8..=11 => "offset 8: format version".to_string(),
                12..=15 => "offset 12: ".to_string(),
                16..=23 => "offset 16: model fingerprint".to_string(),
                24..=39 => format!("offset {}: ", byte / 4 * 4),
                // A capacity still >= the length passes the field checks: the checksum.
                40..=43 => "offset ".to_string(),
                // A length above the capacity is named as such (offset 40), else the size.
                44..=47 => "offset 4".to_string(),
                _ => format!("offset {}: checksum", n - 4),
            };
            refused(&m, &s, &want, &format!("bit {bit} of byte {byte} flipped"));
        }
    }
    // Other format versions, with a valid checksum: refused by version.
    for v in [0u32, 2, 3, u32::MAX] {
        let mut s = state.clone();
        s[8..12].copy_from_slice(&v.to_le_bytes());
        let c = crc32(&s[..n - 4]);
        s[n - 4..].copy_from_slice(&c.to_le_bytes());
        // Version 2 (a windowed cache's) reads its first position where version 1 has a token.
        let want = match v {
            2 => "offset 48: first position held".to_string(),
            _ => format!("offset 8: format version {v}; this library reads versions 1 and 2 only"),
        };
        refused(&m, &s, &want, "version bump");
    }
    // Lying lengths with a valid checksum: a huge one allocates nothing.
    for len in [4u32, 2, 1 << 30, u32::MAX] {
        let mut s = state.clone();
        s[44..48].copy_from_slice(&len.to_le_bytes());
        s[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
        let c = crc32(&s[..n - 4]);
        s[n - 4..].copy_from_slice(&c.to_le_bytes());
        refused(&m, &s, &format!("offset 44: length {len} positions"), "lying length");
    }
    // A token outside the vocabulary, checksum valid.
    let mut s = state.clone();
    s[52..56].copy_from_slice(&384u32.to_le_bytes());
    let c = crc32(&s[..n - 4]);
    s[n - 4..].copy_from_slice(&c.to_le_bytes());
    refused(&m, &s, "offset 52: token 384 at position 1 is outside the vocabulary", "bad token");
    // The undamaged state still loads, and the caches are as they were.
    let b = m.cache_load(&state, 0).unwrap();
    same_continuation(&m, a, b, 1, "after the refusals");
    assert_eq!(m.cache_length(kept).unwrap(), 0);
}

#[test]
fn positions_and_pool_limits() {
    // A pool of 6 blocks (96 positions).
    let kvpp = load("llama_gqa", "f32").info().kv_bytes_per_position;
    let m = load_kv("llama_gqa", "f32", 6 * 16 * kvpp);
    let a = m.cache_reserve(40).unwrap(); // 3 blocks
    m.prefill(a, &tokens(&m, 20, 11), None, false).unwrap();
    let state = m.cache_save(a).unwrap();
    let before = pool(&m);
    let e = m.cache_load(&state, 19).unwrap_err();
    assert_eq!(e.status, Status::LLMRT_INVALID_ARGUMENT);
    assert!(e.message.contains("positions = 19 is less than the 20 positions"), "{}", e.message);
    let e = m.cache_load(&state, 257).unwrap_err();
    assert_eq!(e.status, Status::LLMRT_CONTEXT_FULL, "{}", e.message);
    let e = m.cache_load(&state, 64).unwrap_err(); // 4 blocks, 3 free
    assert_eq!(e.status, Status::LLMRT_OUT_OF_MEMORY, "{}", e.message);
    assert_eq!(pool(&m), before);
    // 20 positions in exactly 2 blocks of the 3 free; then the pool is full.
    let b = m.cache_load(&state, 20).unwrap();
    assert_eq!(m.prefill(b, &[1], None, false).unwrap_err().status, Status::LLMRT_CONTEXT_FULL);
    let c = m.cache_load(&state, 0).err().map(|e| e.status);
    assert_eq!(c, Some(Status::LLMRT_OUT_OF_MEMORY), "3 more blocks in a full pool");
    same_continuation(&m, a, b, 0, "20 positions");
    let e = m.cache_save(0).unwrap_err();
    assert_eq!(e.status, Status::LLMRT_UNKNOWN_CACHE);
}

/// The C entry points: the LLMRT_BUFFER_TOO_SMALL protocol, NULL arguments, a load.
#[test]
fn c_entry_points() {
    let path = std::ffi::CString::new(gguf("llama_gqa", "f32").to_str().unwrap()).unwrap();
    let mut mp = std::ptr::null_mut();
    // SAFETY: a NUL-terminated path, NULL options (defaults), a local out-pointer.
    assert_eq!(unsafe { llmrt_model_load(path.as_ptr(), std::ptr::null(), &mut mp) }, Status::LLMRT_OK);
    let cm = common::M { ptr: mp, vocab: 384, ctx: 256 };
    let c = cm.reserve(32);
    let want = cm.prefill(c, &[5, 6, 7, 8, 9]);
    let mut need = 0usize;
    // SAFETY: a live model; NULL with capacity 0; a local out_len.
    let s = unsafe { llmrt_cache_save(cm.ptr, c, std::ptr::null_mut(), 0, &mut need) };
    assert_eq!(s, Status::LLMRT_BUFFER_TOO_SMALL, "{}", last_error());
    assert_eq!(need, 52 + 20 + 5 * 512);
    let mut buf = vec![0xAAu8; need];
    let mut got = 0usize;
    // SAFETY: buf holds need - 1 (and need) writable bytes.
    let s = unsafe { llmrt_cache_save(cm.ptr, c, buf.as_mut_ptr(), need - 1, &mut got) };
    assert_eq!((s, got), (Status::LLMRT_BUFFER_TOO_SMALL, need));
    assert!(buf.iter().all(|&b| b == 0xAA), "nothing written when it does not fit");
    // SAFETY: as above.
    let s = unsafe { llmrt_cache_save(cm.ptr, c, buf.as_mut_ptr(), need, &mut got) };
    assert_eq!((s, got), (Status::LLMRT_OK, need), "{}", last_error());
    // SAFETY: a NULL buffer with a capacity, a NULL out_len: refused before any write.
    unsafe {
        assert_eq!(llmrt_cache_save(cm.ptr, c, std::ptr::null_mut(), 8, &mut got), Status::LLMRT_INVALID_ARGUMENT);
        assert_eq!(
            llmrt_cache_save(cm.ptr, c, buf.as_mut_ptr(), need, std::ptr::null_mut()),
            Status::LLMRT_INVALID_ARGUMENT
        );
        assert_eq!(llmrt_cache_save(cm.ptr, 12345, buf.as_mut_ptr(), need, &mut got), Status::LLMRT_UNKNOWN_CACHE);
    }
    let mut loaded = 0u64;
    // SAFETY: buf holds need readable bytes; a local out_cache.
    let s = unsafe { llmrt_cache_load(cm.ptr, buf.as_ptr(), need, 0, &mut loaded) };
    assert_eq!(s, Status::LLMRT_OK, "{}", last_error());
    assert_eq!(cm.len(loaded), 5);
    // The next logits, bit for bit (the prefill's last row vs a decode of the same
    // token on a fork of each is the same check as above; here: decode both).
    let (x, y) = (cm.decode(&[c], &[3]), cm.decode(&[loaded], &[3]));
    assert_eq!(bits(&x), bits(&y));
    assert_eq!(want.len(), 384);
    let mut untouched = 777u64;
    // SAFETY: a short buffer, NULL data, NULL out_cache.
    unsafe {
        assert_eq!(llmrt_cache_load(cm.ptr, buf.as_ptr(), need - 1, 0, &mut untouched), Status::LLMRT_INVALID_ARGUMENT);
        assert!(last_error().starts_with("llmrt_cache_load: cache state: offset 44"), "{}", last_error());
        assert_eq!(llmrt_cache_load(cm.ptr, std::ptr::null(), 0, 0, &mut untouched), Status::LLMRT_INVALID_ARGUMENT);
        assert_eq!(
            llmrt_cache_load(cm.ptr, buf.as_ptr(), need, 0, std::ptr::null_mut()),
            Status::LLMRT_INVALID_ARGUMENT
        );
    }
    assert_eq!(untouched, 777);
    drop(cm);
    // SAFETY: NULL is a no-op (cm freed the model).
    unsafe { llmrt_model_free(std::ptr::null_mut()) };
}
