//! Sliding-window attention against transformers: the mistral fixture's model with
//! `sliding_window` 8 (tools/make_fixtures.py --window-check: logits.window8.f32 over
//! the fixture's 24 tokens, window_check.json), from its HF directory (config.json
//! `sliding_window`) and from its F32 GGUF with `llama.attention.sliding_window` added;
//! and the gemma fixtures (windows on some layers) decoded token by token past the
//! window equal to their prefill. Phi-3's options (tools/make_fixtures.py --phi3-check,
//! phi3_check.json): partial rotary (`partial_rotary_factor` 0.75: 12 of 16 dimensions
//! turn) from llama.cpp's converter's GGUF and from the HF directory, and its
//! `sliding_window`, which transformers applies and llama.cpp does not.
mod common;
use common::*;
use llmrt::format::gguf::Value;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> Fixture {
    Fixture::named(name)
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("llmrt-swa-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn worst_row(got: &[f32], want: &[f32], vocab: usize) -> f64 {
    assert_eq!(got.len(), want.len());
    got.chunks_exact(vocab).zip(want.chunks_exact(vocab)).map(|(g, w)| rel_l2(g, w)).fold(0.0, f64::max)
}

fn logits(path: &Path, tokens: &[u32]) -> Vec<f32> {
    let m = load(path);
    let c = m.reserve(0);
    m.prefill_all(c, tokens)
}

/// The logits of `tokens` prefilled 3 and then decoded one at a time (each decode
/// reads only what its window allows): a prefill's rows, token by token.
fn stepwise(path: &Path, tokens: &[u32]) -> Vec<f32> {
    let m = load(path);
    let c = m.reserve(0);
    let mut steps = m.prefill_all(c, &tokens[..3]);
    for &t in &tokens[3..] {
        steps.extend(m.decode(&[c], &[t]));
    }
    steps
}

/// The window check's reference files and window.
fn window_check(f: &Fixture) -> (usize, Vec<f32>, Vec<f32>) {
    let j: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.dir.join("window_check.json")).unwrap()).unwrap();
    let w = j["sliding_window"].as_u64().unwrap() as usize;
    assert!(w < f.tokens.len());
    let full = read_f32(&f.dir.join(j["files"]["logits"].as_str().unwrap()));
    // Over the weights rounded to hf/'s dtype (bf16, or f16 for qwen3 and the MoE fixtures).
    let rounded = j["files"].get("hf_bf16").or_else(|| j["files"].get("hf_f16")).unwrap();
    let bf16 = read_f32(&f.dir.join(rounded.as_str().unwrap()));
    (w, full, bf16)
}

/// A copy of `src` with `key` = `value` added to its metadata.
fn with_key(src: &Path, dst: &Path, key: &str, value: Value) {
    gguf_with_keys(src, dst, vec![(key, value)])
}

#[test]
fn mistral_hf_sliding_window_matches_transformers() {
    let f = fixture("mistral");
    let (w, full, bf16) = window_check(&f);
    let d = scratch("hf");
    hf_dir_with_config(&f.dir.join("hf"), &d, |c| {
        assert_eq!(c["sliding_window"], serde_json::Value::Null);
        c["sliding_window"] = serde_json::json!(w);
    });
    let got = logits(&d, &f.tokens);
    let (e_bf16, e_full) = (worst_row(&got, &bf16, f.vocab), worst_row(&got, &full, f.vocab));
    println!("mistral hf/ window {w}: vs transformers over bf16 weights {e_bf16:.3e}, over f32 weights {e_full:.3e}");
    assert!(e_bf16 < 1e-4, "{e_bf16:.3e}");
    // hf/ holds bf16 weights: against the f32 weights' logits llmrt is as far as
    // transformers itself is over the rounded weights (1.09e-2 here), no farther.
    let rounding = worst_row(&bf16, &full, f.vocab);
    assert!(e_full < rounding + 1e-4, "{e_full:.3e} vs transformers' own bf16 rounding {rounding:.3e}");
    // The window matters here: without it the logits are the fixture's unwindowed ones.
    assert!(worst_row(&got, &f.logits, f.vocab) > 1e-2);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn mistral_gguf_sliding_window_matches_transformers() {
    let f = fixture("mistral");
    let (w, full, _) = window_check(&f);
    let d = scratch("gguf");
    let p = d.join("mistral.window.f32.gguf");
    with_key(&f.gguf("f32"), &p, "llama.attention.sliding_window", Value::U32(w as u32));
    let got = logits(&p, &f.tokens);
    let e = worst_row(&got, &full, f.vocab);
    println!("mistral f32 GGUF + llama.attention.sliding_window {w}: worst row relative L2 {e:.3e}");
    assert!(e < 1e-4, "{e:.3e}");
    // Token by token (each decode reads only the window's pages) equals the prefill.
    let steps = stepwise(&p, &f.tokens);
    let e = worst_row(&steps, &full, f.vocab);
    assert!(e < 1e-4, "decode past the window: {e:.3e}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Gemma's windowed layers, decoded one token at a time past the window (32 tokens,
/// window 8), give the logits of transformers over the whole sequence.
#[test]
fn gemma_decode_past_the_window_matches_prefill() {
    for name in ["gemma2", "gemma3"] {
        let f = fixture(name);
        let m = load(&f.gguf("f32"));
        let c = m.reserve(0);
        let mut got = m.prefill_all(c, &f.tokens[..5]);
        for &t in &f.tokens[5..] {
            got.extend(m.decode(&[c], &[t]));
        }
        let e = worst_row(&got, &f.logits, f.vocab);
        println!("{name} f32 token by token: worst row relative L2 {e:.3e}");
        assert!(e < 1e-4, "{name}: {e:.3e}");
    }
}

/// GGUF `gemma2.attention.sliding_window_pattern`, as llama.cpp reads it: a period
/// (2: the default, even layers slide) or one flag per layer. The default spelled
/// either way gives the fixture's logits; the flags inverted give others; a list of
/// the wrong length is refused naming the key.
#[test]
fn gemma2_gguf_window_pattern_key() {
    let f = fixture("gemma2");
    let d = scratch("pattern");
    let base = logits(&f.gguf("f32"), &f.tokens);
    let key = "gemma2.attention.sliding_window_pattern";
    let flags = |v: &[bool]| Value::Array(v.iter().map(|&b| Value::Bool(b)).collect());
    for (tag, value, same) in [
        ("period", Value::U32(2), true),
        ("flags", flags(&[true, false, true]), true),
        ("inverted", flags(&[false, true, false]), false),
    ] {
        let p = d.join(format!("gemma2.{tag}.gguf"));
        with_key(&f.gguf("f32"), &p, key, value);
        let got = logits(&p, &f.tokens);
        let e = worst_row(&got, &base, f.vocab);
        println!("gemma2 {key} {tag}: worst row relative L2 vs the fixture's {e:.3e}");
        assert_eq!(e < 1e-6, same, "{tag}: {e:.3e}");
    }
    let p = d.join("gemma2.short.gguf");
    with_key(&f.gguf("f32"), &p, key, flags(&[true, false]));
    let (st, msg) = match try_load(&p, 1, 0) {
        Ok(_) => panic!("a 2-entry pattern for 3 layers loaded"),
        Err(e) => e,
    };
    assert_eq!(st, llmrt::Status::LLMRT_BAD_MODEL, "{msg}");
    assert!(msg.contains(key) && msg.contains("2 entries for 3 layers"), "{msg}");
    let _ = std::fs::remove_dir_all(&d);
}

/// The mistral fixture's F32 GGUF with `llama.attention.sliding_window` `w` and a
/// context of 2048 (the fixture's is 256), in `d`.
fn windowed_gguf(f: &Fixture, w: usize, d: &Path) -> PathBuf {
    let p = d.join("mistral.window.f32.gguf");
    let keys =
        vec![("llama.attention.sliding_window", Value::U32(w as u32)), ("llama.context_length", Value::U32(2048))];
    gguf_with_keys(&f.gguf("f32"), &p, keys);
    p
}

fn load_rs(p: &Path, window_only: bool) -> llmrt::Model {
    let opts = llmrt::LoadOptions {
        backend: llmrt::BackendKind::Cpu,
        threads: 2,
        kv_cache_bytes: 8 << 20,
        kv_window_only: window_only,
        ..Default::default()
    };
    llmrt::Model::load(p, opts).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn prefill_rows(m: &llmrt::Model, c: u64, toks: &[u32], all: bool) -> Vec<f32> {
    let v = m.info().vocab_size as usize;
    let mut out = vec![0f32; if all { toks.len() } else { 1 } * v];
    m.prefill(c, toks, Some(&mut out), all).unwrap_or_else(|e| panic!("prefill of {}: {e}", toks.len()));
    out
}

fn decode_row(m: &llmrt::Model, c: u64, t: u32) -> Vec<f32> {
    let mut out = vec![0f32; m.info().vocab_size as usize];
    m.decode(&[c], &[t], Some(&mut out)).unwrap_or_else(|e| panic!("decode: {e}"));
    out
}

/// `n` ids spread over the vocabulary (deterministic).
fn ids(vocab: u32, n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(salt.wrapping_mul(40_503)) >> 7) % vocab)
        .collect()
}

/// `kv_window_only` on mistral with window 8: the same logits as transformers' windowed
/// model (and bit for bit those of the same model keeping every position), token by
/// token and in one prefill, while each cache books and holds only the window's blocks.
#[test]
fn windowed_kv_matches_transformers_and_holds_only_the_window() {
    let f = fixture("mistral");
    let (w, full, _) = window_check(&f);
    let d = scratch("kvwin");
    let p = windowed_gguf(&f, w, &d);
    let (keep, win) = (load_rs(&p, false), load_rs(&p, true));
    assert_eq!((keep.info().kv_window, win.info().kv_window), (0, w as u32));
    let a = win.cache_reserve(0).unwrap();
    let ctx = win.info().context_length as usize;
    let live = llmrt::kv::WindowKv::new(w as u32).live_blocks();
    assert!(ctx.div_ceil(16) > live, "the context ({ctx}) must be longer than the booking for this test");
    assert_eq!(win.kv_usage().0, live, "books the window's blocks, not the context's");
    let got = prefill_rows(&win, a, &f.tokens, true);
    let e = worst_row(&got, &full, f.vocab);
    assert!(e < 1e-4, "windowed prefill vs transformers: {e:.3e}");
    let k = keep.cache_reserve(0).unwrap();
    assert_eq!(bits(&got), bits(&prefill_rows(&keep, k, &f.tokens, true)));
    // Token by token: blocks out of the window are freed after each step.
    let b = win.cache_reserve(0).unwrap();
    let mut steps = prefill_rows(&win, b, &f.tokens[..3], true);
    for &t in &f.tokens[3..] {
        steps.extend(decode_row(&win, b, t));
        assert!(win.kv_usage().1 <= 2 * live);
    }
    assert_eq!(bits(&steps), bits(&got), "decode past the window equals the prefill");
    // 24 positions, window 8: position 16.. held; truncating below the window is refused.
    let e = win.cache_truncate(b, 20).unwrap_err();
    assert_eq!(e.status, llmrt::Status::LLMRT_INVALID_ARGUMENT);
    assert!(e.message.contains("fell out of the sliding window of 8"), "{}", e.message);
    assert_eq!(win.cache_length(b).unwrap(), 24);
    keep.cache_truncate(k, 23).unwrap();
    win.cache_truncate(b, 23).unwrap();
    assert_eq!(bits(&decode_row(&win, b, 5)), bits(&decode_row(&keep, k, 5)));
    let _ = std::fs::remove_dir_all(&d);
}

/// A prefill longer than the chunk (and the window) runs in chunks: every row, the
/// last row, greedy ids, embeddings and the decodes after it are bit for bit those of
/// the model keeping every position; a saved state holds only the window (version 2)
/// and continues exactly; states move between the two modes where they can.
#[test]
fn a_long_windowed_prefill_runs_in_chunks_with_the_same_bits() {
    let f = fixture("mistral");
    let d = scratch("kvchunk");
    let p = windowed_gguf(&f, 8, &d);
    let (keep, win) = (load_rs(&p, false), load_rs(&p, true));
    let vocab = win.info().vocab_size;
    let toks = ids(vocab, 300, 1);
    assert!(toks.len() > 2 * llmrt::kv::WindowKv::new(8).chunk as usize);
    let (k, a) = (keep.cache_reserve(0).unwrap(), win.cache_reserve(0).unwrap());
    let booked = win.kv_usage().0;
    // A step that fails in its last chunk (after the step's early blocks were freed)
    // changes nothing: the cache is empty again and holds no block.
    let before = win.kv_usage();
    win.debug_panic_next_step(llmrt::runtime::DebugPanic::Compute);
    let mut out = vec![0f32; toks.len() * vocab as usize];
    let e = win.prefill(a, &toks, Some(&mut out), true).unwrap_err();
    assert_eq!(e.status, llmrt::Status::LLMRT_INTERNAL, "{e}");
    assert_eq!((win.cache_length(a).unwrap(), win.kv_usage()), (0, before));
    let want = prefill_rows(&keep, k, &toks, true);
    assert_eq!(bits(&prefill_rows(&win, a, &toks, true)), bits(&want), "every row");
    assert!(win.kv_usage().1 <= booked, "blocks held {} > booked {booked}", win.kv_usage().1);
    let (k2, a2) = (keep.cache_reserve(0).unwrap(), win.cache_reserve(0).unwrap());
    let last = prefill_rows(&win, a2, &toks[..200], false);
    assert_eq!(bits(&last), bits(&prefill_rows(&keep, k2, &toks[..200], false)), "the last row");
    assert_eq!(bits(&last), bits(&want[199 * vocab as usize..200 * vocab as usize]));
    let (mut gk, mut gw) = (vec![0u32], vec![0u32]);
    keep.decode_greedy(&[k2], &toks[200..201], &mut gk).unwrap();
    win.decode_greedy(&[a2], &toks[200..201], &mut gw).unwrap();
    assert_eq!(gk, gw);
    // No logits wanted: the chunks want nothing; the next decode is the same.
    let (k3, a3) = (keep.cache_reserve(0).unwrap(), win.cache_reserve(0).unwrap());
    keep.prefill(k3, &toks, None, false).unwrap();
    win.prefill(a3, &toks, None, false).unwrap();
    assert_eq!(bits(&decode_row(&win, a3, 3)), bits(&decode_row(&keep, k3, 3)), "after a prefill without logits");
    for (m, c) in [(&keep, k3), (&win, a3)] {
        m.cache_release(c).unwrap();
    }
    let pool = llmrt::Pooling::Mean;
    assert_eq!(bits(&win.embed(&toks, pool, false).unwrap()), bits(&keep.embed(&toks, pool, false).unwrap()));
    for t in 0..5 {
        assert_eq!(bits(&decode_row(&win, a, t)), bits(&decode_row(&keep, k, t)), "decode {t}");
    }
    // Save: only the held positions (16-aligned, the window of 305 from 297 on).
    let state = win.cache_save(a).unwrap();
    assert_eq!(u32::from_le_bytes(state[8..12].try_into().unwrap()), 2, "format version 2");
    assert_eq!(u32::from_le_bytes(state[48..52].try_into().unwrap()), 288);
    let full_state = keep.cache_save(k).unwrap();
    assert!(state.len() < full_state.len() / 10);
    let e = keep.cache_load(&state, 0).unwrap_err();
    assert_eq!(e.status, llmrt::Status::LLMRT_INVALID_ARGUMENT);
    assert!(e.message.contains("holds positions 288..305 only"), "{}", e.message);
    let (b, b2) = (win.cache_load(&state, 0).unwrap(), win.cache_load(&full_state, 0).unwrap());
    for t in 10..14 {
        let r = decode_row(&keep, k, t);
        for c in [a, b, b2] {
            assert_eq!(bits(&decode_row(&win, c, t)), bits(&r), "cache {c}, decode {t}");
        }
    }
    // Many long caches in the pool of one: a capacity of the whole context each.
    let (booked_each, total) = (win.kv_usage().0 / 4, win.kv_usage().2);
    assert!(total / booked_each >= 8, "{total} blocks, {booked_each} per cache");
    let _ = std::fs::remove_dir_all(&d);
}

/// Through the C API: `llmrt_model_options.kv_window_only` = 1 takes effect on the
/// windowed model (`llmrt_model_info.kv_window`), not on gemma2 (global layers); a value
/// other than 0 or 1 is refused naming the field; an older, smaller options struct (the
/// field past its size) keeps every position.
#[test]
fn kv_window_only_through_the_c_api() {
    use llmrt::ffi::llmrt_model_options;
    use llmrt::Status;
    let f = fixture("mistral");
    let d = scratch("kvwin-ffi");
    let p = windowed_gguf(&f, 8, &d);
    let load = |path: &Path, value: u32, size: usize| -> Result<u32, (Status, String)> {
        let m = try_load_opts(path, |o| {
            o.backend = 1;
            o.threads = 1;
            o.kv_cache_bytes = 1 << 20;
            o.kv_window_only = value;
            o.struct_size = size as u32;
        })?;
        Ok(m.info().kv_window)
    };
    let full = std::mem::size_of::<llmrt_model_options>();
    let older = std::mem::offset_of!(llmrt_model_options, kv_window_only);
    assert_eq!(load(&p, 1, full), Ok(8));
    assert_eq!(load(&p, 0, full), Ok(0));
    assert_eq!(load(&p, 1, older), Ok(0), "a struct without the field: the default");
    assert_eq!(load(&fixture("gemma2").gguf("f32"), 1, full), Ok(0), "a model with global layers");
    let (s, e) = load(&p, 2, full).unwrap_err();
    assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT);
    assert!(e.contains("options.kv_window_only = 2"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Qwen's HF windows (`use_sliding_window`, `sliding_window` 8, `max_window_layers` 1)
/// against transformers 5.24 (tools/make_fixtures.py --qwen-window-check): qwen2 and qwen3
/// window layer 1, qwen2_moe layer 0, qwen3_moe every layer (window_check.json:layer_types).
/// Without `use_sliding_window` (the committed configs) full attention, as before.
#[test]
fn qwen_hf_sliding_window_matches_transformers() {
    for name in ["qwen2", "qwen3", "qwen2moe", "qwen3moe"] {
        let f = fixture(name);
        let (w, full, bf16) = window_check(&f);
        let d = scratch(&format!("hf-{name}"));
        let window_on = |c: &mut serde_json::Value| {
            assert_eq!(c["use_sliding_window"], serde_json::Value::Bool(false), "{name}");
            c["use_sliding_window"] = serde_json::json!(true);
            c["sliding_window"] = serde_json::json!(w);
            c["max_window_layers"] = serde_json::json!(1);
            // transformers saved the layer types it computed (all full): without them the
            // model type's rule picks the layers, as in the reference.
            let saved = c.as_object_mut().unwrap().remove("layer_types");
            assert!(saved.is_some() || name == "qwen3moe", "{name}");
        };
        hf_dir_with_config(&f.dir.join("hf"), &d, window_on);
        let got = logits(&d, &f.tokens);
        let (e_bf16, e_full) = (worst_row(&got, &bf16, f.vocab), worst_row(&got, &full, f.vocab));
        println!(
            "{name} hf/ window {w}: vs transformers over hf/'s weights {e_bf16:.3e}, over f32 weights {e_full:.3e}"
        );
        assert!(e_bf16 < 1e-4, "{name}: {e_bf16:.3e}");
        let rounding = worst_row(&bf16, &full, f.vocab);
        assert!(e_full < rounding + 1e-4, "{name}: {e_full:.3e} vs transformers' own rounding {rounding:.3e}");
        assert!(worst_row(&got, &f.logits, f.vocab) > 1e-2, "{name}: the window must matter");
        // qwen3_moe windows every layer: kv_window_only takes effect, same bits.
        let m = load_rs(&d, name == "qwen3moe");
        assert_eq!(m.info().kv_window, if name == "qwen3moe" { w as u32 } else { 0 }, "{name}");
        let cache = m.cache_reserve(0).unwrap();
        assert_eq!(bits(&prefill_rows(&m, cache, &f.tokens, true)), bits(&got), "{name}");
        // The layer types written out (as transformers saves them) give the same logits.
        let j: serde_json::Value =
            serde_json::from_slice(&std::fs::read(f.dir.join("window_check.json")).unwrap()).unwrap();
        if !j["layer_types"].is_null() {
            hf_dir_with_config(&f.dir.join("hf"), &d, |c| {
                window_on(c);
                c["layer_types"] = j["layer_types"].clone();
            });
            assert_eq!(bits(&logits(&d, &f.tokens)), bits(&got), "{name} with layer_types");
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}

/// The phi3 fixture's partial-rotary reference: (config file name, logits over f32
/// weights, logits over hf/'s f16 weights) for `tag` ("partial", "partial_window8").
fn phi3_check(f: &Fixture, tag: &str) -> (PathBuf, Vec<f32>, Vec<f32>) {
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(f.dir.join("phi3_check.json")).unwrap()).unwrap();
    assert_eq!(j["rotated_dims"], 12, "phi3_check.json");
    let full = read_f32(&f.dir.join(format!("logits.{tag}.f32")));
    let f16 = read_f32(&f.dir.join(format!("logits.{tag}.hf_f16.f32")));
    (f.dir.join(format!("config.{tag}.json")), full, f16)
}

/// A copy of the phi3 fixture's HF directory with `config` as its config.json.
fn phi3_hf(f: &Fixture, config: &Path, tag: &str) -> PathBuf {
    let d = scratch(tag);
    let c: serde_json::Value = serde_json::from_slice(&std::fs::read(config).unwrap()).unwrap();
    hf_dir_with_config(&f.dir.join("hf"), &d, |cfg| *cfg = c);
    d
}

/// Partial rotary from llama.cpp's converter's GGUF (`phi3.rope.dimension_count` 12 of a
/// head of 16; LongRoPE factors for the 6 rotated pairs): transformers' logits, and
/// token by token the same.
#[test]
fn phi3_partial_rotary_gguf_matches_transformers() {
    let f = fixture("phi3");
    let (_, full, _) = phi3_check(&f, "partial");
    let p = f.dir.join("phi3.partial.f32.gguf");
    let got = logits(&p, &f.tokens);
    let e = worst_row(&got, &full, f.vocab);
    println!("phi3 partial rotary, f32 GGUF: worst row relative L2 {e:.3e}");
    assert!(e < 1e-4, "{e:.3e}");
    // The fixture's full-rotary logits are far away: the partial rotation is what matches.
    assert!(worst_row(&got, &f.logits, f.vocab) > 1e-2);
    let steps = stepwise(&p, &f.tokens);
    assert!(worst_row(&steps, &full, f.vocab) < 1e-4, "decode");
    // llama.cpp does not window phi3 (it ignores phi3.attention.sliding_window): nor does llmrt.
    let d = scratch("phi3-gguf-window");
    let pw = d.join("phi3.partial.window8.f32.gguf");
    with_key(&p, &pw, "phi3.attention.sliding_window", Value::U32(8));
    let e = worst_row(&logits(&pw, &f.tokens), &full, f.vocab);
    assert!(e < 1e-4, "phi3 GGUF with a sliding_window key: {e:.3e}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Partial rotary from the HF directory (config.json `partial_rotary_factor` 0.75, top
/// level and in rope_parameters, as transformers writes it; f16 weights).
#[test]
fn phi3_partial_rotary_hf_matches_transformers() {
    let f = fixture("phi3");
    let (cfg, full, f16) = phi3_check(&f, "partial");
    let d = phi3_hf(&f, &cfg, "phi3-partial-hf");
    let got = logits(&d, &f.tokens);
    let (e16, e) = (worst_row(&got, &f16, f.vocab), worst_row(&got, &full, f.vocab));
    println!("phi3 partial rotary, hf/: vs transformers over f16 weights {e16:.3e}, over f32 weights {e:.3e}");
    assert!(e16 < 1e-4, "{e16:.3e}");
    assert!(e < worst_row(&f16, &full, f.vocab) + 1e-4, "{e:.3e}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Phi-3's `sliding_window` in an HF directory, applied as transformers applies it (every
/// layer; here 8 of the fixture's 24 tokens), with partial rotary; decoded token by token too.
#[test]
fn phi3_hf_sliding_window_matches_transformers() {
    let f = fixture("phi3");
    let (cfg, _, f16) = phi3_check(&f, "partial_window8");
    let (_, unwindowed, _) = phi3_check(&f, "partial");
    let d = phi3_hf(&f, &cfg, "phi3-window-hf");
    let got = logits(&d, &f.tokens);
    let e = worst_row(&got, &f16, f.vocab);
    println!("phi3 hf/ with sliding_window 8: vs transformers over f16 weights {e:.3e}");
    assert!(e < 1e-4, "{e:.3e}");
    assert!(worst_row(&got, &unwindowed, f.vocab) > 1e-2, "the window changes nothing");
    let steps = stepwise(&d, &f.tokens);
    assert!(worst_row(&steps, &f16, f.vocab) < 1e-4, "decode past the window");
    let _ = std::fs::remove_dir_all(&d);
}
