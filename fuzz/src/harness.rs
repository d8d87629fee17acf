//! The fuzz harnesses' bodies: one function per target, each a thin wrapper over a
//! pure-bytes entry point of llmrt. Any `Err` is an accepted outcome; a panic, an
//! abort, a hang or an allocation past the fuzzer's RSS limit is a bug.
//!
//! Shared by the cargo-fuzz targets (`fuzz/fuzz_targets/*.rs`, through the
//! `llmrt_fuzz` crate) and by the main crate's `tests/fuzz_regressions.rs`
//! (included with `#[path]`), so a reproducer is replayed through exactly the code
//! the fuzzer ran. Only llmrt, std and the tiny model (`crate::tiny`, included next
//! to this file in both crates) are used here.
#![allow(dead_code)]

use std::sync::{Arc, Mutex, OnceLock};

use llmrt::format::gguf::Gguf;
use llmrt::format::safetensors::SafeTensors;
use llmrt::model::weights::Weights;
use llmrt::model::{hf, Config};
use llmrt::sample::SamplerParams;
use llmrt::tokenizer::Tokenizer;
use llmrt::{BackendKind, LoadOptions, Model, Result, Status};

/// Text every tokenizer is run on: ASCII, spaces, newlines, digits, a contraction,
/// multi-byte UTF-8 (2, 3 and 4 bytes), special-token look-alikes.
pub const FIXED_TEXT: &str =
    "Hello world! It's 2024.\n\n  tabs\tand  spaces <s></s><|endoftext|> caf\u{e9} \u{65e5}\u{672c} \u{1F600}";

/// Positions the steps reserve (at most): the load itself runs with the defaults
/// (no context cap, the default KV budget), as `llmrt_model_load` does, so a huge
/// `context_length` in a file goes through the default sizing.
pub const MAX_POSITIONS: u32 = 64;

/// Encodes and decodes with `t`: the fixed text, `extra` as given (often invalid
/// UTF-8: an error, not a panic) and lossily decoded, and ids taken from `extra`
/// (some out of range: an error, not a panic).
pub fn exercise_tokenizer(t: &Tokenizer, extra: &[u8]) {
    let n = t.vocab_size();
    let _ = (t.bos(), t.eos(), t.add_bos_default());
    for text in [FIXED_TEXT.as_bytes(), extra, String::from_utf8_lossy(extra).as_bytes()] {
        for add_bos in [false, true] {
            if let Ok(ids) = t.encode(text, add_bos) {
                assert!(ids.iter().all(|&i| (i as usize) < n), "encode gave an id >= vocab {n}");
                let _ = t.decode(&ids).expect("decoding ids the tokenizer produced");
                for &i in ids.iter().take(16) {
                    let _ = t.token_piece(i).expect("piece of an id the tokenizer produced");
                }
            }
        }
    }
    // Arbitrary ids: in range (mod n) and as given.
    let raw: Vec<u32> = extra.chunks(2).map(|c| c.iter().fold(0u32, |a, &b| (a << 8) | b as u32)).collect();
    let wrapped: Vec<u32> = raw.iter().map(|&i| i % n.max(1) as u32).collect();
    let _ = t.decode(&wrapped).expect("decoding in-range ids");
    let _ = t.decode(&raw);
    for &i in raw.iter().take(8) {
        let _ = t.token_piece(i);
        let _ = t.token_text(i);
    }
}

/// The tail of `data` used as text for a tokenizer built from `data`.
fn tail(data: &[u8], n: usize) -> &[u8] {
    &data[data.len().saturating_sub(n)..]
}

/// `gguf`: the header, metadata and tensor table; then the hyperparameters, the
/// tokenizer and the weight binding; a file that binds is loaded and stepped.
pub fn gguf(data: &[u8]) -> Result<()> {
    let g = Gguf::from_bytes(data.to_vec(), "fuzz.gguf")?;
    for t in &g.tensors {
        assert_eq!(g.tensor_data(t).len() as u64, t.size, "tensor {} data extent", t.name);
        let _ = (t.n_elements(), t.type_name());
    }
    for k in g.keys() {
        let _ = (g.get_u64(k), g.get_u32(k), g.get_f32(k), g.get_str(k), g.get_bool(k));
    }
    // Every element of every array view decodes (the views read the file's bytes).
    fn walk(v: &llmrt::format::gguf::ValueRef<'_>) -> usize {
        match v {
            llmrt::format::gguf::ValueRef::Array(a) => {
                let n = a.iter().map(|e| walk(&e)).sum::<usize>();
                assert_eq!(a.iter().count(), a.len(), "array view length");
                n + 1
            }
            v => {
                let _ = (v.as_u64(), v.describe());
                1
            }
        }
    }
    for (_, v) in g.entries() {
        walk(&v);
    }
    let tok = Tokenizer::from_gguf(&g);
    if let Ok(Some(t)) = &tok {
        exercise_tokenizer(t, tail(data, 48));
    }
    let cfg = Config::from_gguf(&g)?;
    tok?;
    let g = Arc::new(g);
    Weights::bind(g, &cfg, &mut |_| {})?;
    model(data.to_vec()).map(|_| ())
}

/// `tokenizer_gguf`: a GGUF's tokenizer metadata only.
pub fn tokenizer_gguf(data: &[u8]) -> Result<()> {
    let g = Gguf::from_bytes(data.to_vec(), "fuzz.gguf")?;
    if let Some(t) = Tokenizer::from_gguf(&g)? {
        exercise_tokenizer(&t, tail(data, 64));
    }
    Ok(())
}

/// `safetensors`: header parse and extent validation.
pub fn safetensors(data: &[u8]) -> Result<()> {
    let s = SafeTensors::from_bytes(data.to_vec(), "fuzz.safetensors")?;
    let len = s.bytes().len() as u64;
    for t in &s.tensors {
        assert!(t.offset >= s.data_start && t.offset + t.size <= len, "tensor {} outside the file", t.name);
        assert_eq!(s.tensor_data(t).len() as u64, t.size);
        assert!(s.tensor(&t.name).is_some());
    }
    Ok(())
}

/// `hf_config`: config.json.
pub fn hf_config(data: &[u8]) -> Result<()> {
    let c = hf::config_from_json(data, "config.json")?;
    if let Some(r) = &c.rope_freqs {
        assert_eq!(r.len(), c.config.head_dim / 2);
    }
    Ok(())
}

/// tokenizer_config.json used for a second build of every tokenizer.json that parses.
const TOKENIZER_CONFIG: &[u8] = br#"{"add_bos_token": true, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}"#;

/// `tokenizer_json`: tokenizer.json (without and with a tokenizer_config.json).
pub fn tokenizer_json(data: &[u8]) -> Result<()> {
    let t = Tokenizer::from_hf_json(data, None, "tokenizer.json")?;
    exercise_tokenizer(&t, tail(data, 64));
    if let Ok(t) = Tokenizer::from_hf_json(data, Some(TOKENIZER_CONFIG), "tokenizer.json") {
        exercise_tokenizer(&t, b"<s>a b</s>");
    }
    Ok(())
}

/// `sentencepiece_model`: a sentencepiece ModelProto.
pub fn sentencepiece_model(data: &[u8]) -> Result<()> {
    let t = Tokenizer::from_sentencepiece_model(data, "tokenizer.model")?;
    exercise_tokenizer(&t, tail(data, 64));
    Ok(())
}

/// The full load path from memory, then steps (see [`steps`]). `Err` only when the
/// load fails; a loaded model's step that fails other than for want of KV blocks panics.
pub fn model(bytes: Vec<u8>) -> Result<Model> {
    let opts = LoadOptions { backend: BackendKind::Cpu, threads: 1, ..Default::default() };
    let m = Model::load_gguf_bytes(bytes, "fuzz.gguf", opts)?;
    if let Err(e) = steps(&m) {
        assert!(
            e.status == Status::LLMRT_OUT_OF_MEMORY || e.status == Status::LLMRT_CONTEXT_FULL,
            "a step of a loaded model failed: {e}"
        );
    }
    Ok(m)
}

/// A prefill of 2 tokens (all logits), a decode with logits, a greedy decode, a
/// sampled decode of two caches (one forked), a truncate and a prefill without logits.
pub fn steps(m: &Model) -> Result<()> {
    let info = m.info().clone();
    let v = info.vocab_size as usize;
    assert!(v > 0);
    let mut toks: Vec<u32> = m.tokenize(b"Hi", true).unwrap_or_default();
    toks.retain(|&t| (t as usize) < v);
    toks.truncate(2);
    while toks.len() < 2 {
        toks.push((toks.len() as u32 + 1) % info.vocab_size);
    }
    let _ = m.detokenize(&toks);
    let c = m.cache_reserve(info.context_length.min(MAX_POSITIONS))?;
    let mut logits = vec![0f32; 2 * v];
    m.prefill(c, &toks, Some(&mut logits), true)?;
    let mut row = vec![0f32; v];
    m.decode(&[c], &[toks[1]], Some(&mut row))?;
    let mut next = [0u32];
    m.decode_greedy(&[c], &[toks[0]], &mut next)?;
    assert!((next[0] as usize) < v);
    let f = m.cache_fork(c)?;
    let p = SamplerParams { repetition_penalty: 1.1, seed: 7, ..Default::default() };
    let mut two = [0u32; 2];
    m.decode_sample(&[c, f], &[next[0], toks[0]], &p, &mut two)?;
    assert!(two.iter().all(|&t| (t as usize) < v));
    m.cache_truncate(f, 1)?;
    m.prefill(f, &[two[1]], None, false)?;
    m.cache_release(f)?;
    m.cache_release(c)?;
    Ok(())
}

/// The model `cache_state` loads states into: the small llama of [`crate::tiny`]
/// (one layer, 2 KV heads of 8, context 64, F32), no tokenizer, a pool of 12 blocks
/// (192 positions: three full contexts), built once per process.
pub fn state_model() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| {
        use crate::tiny::{Arch, Spec, TokKind};
        let spec = Spec::tiny(Arch::Llama, TokKind::None, llmrt::quant::DType::F32, false, 17);
        let probe = Model::load_gguf_bytes(
            spec.to_bytes(),
            "state.gguf",
            LoadOptions { backend: BackendKind::Cpu, threads: 1, ..Default::default() },
        )
        .expect("the tiny state model loads");
        let kv = probe.info().kv_bytes_per_position * 16 * 12;
        drop(probe);
        let opts = LoadOptions { backend: BackendKind::Cpu, threads: 1, kv_cache_bytes: kv, ..Default::default() };
        Model::load_gguf_bytes(spec.to_bytes(), "state.gguf", opts).expect("the tiny state model loads")
    })
}

/// Valid states of [`state_model`] (the `cache_state` seeds, each behind a mode byte
/// of 0): caches of 0, 1, 3, 16, 17 and 40 positions, capacities from the length to the
/// whole context, one made by fork + truncate + append.
pub fn state_seeds() -> Vec<(String, Vec<u8>)> {
    let _serial = STATE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let m = state_model();
    let v = m.info().vocab_size;
    let mut out = Vec::new();
    for (len, cap) in [(0u32, 0u32), (1, 1), (3, 64), (16, 16), (17, 32), (40, 64)] {
        let c = m.cache_reserve(cap).expect("seed cache");
        if len > 0 {
            let toks: Vec<u32> = (0..len).map(|i| (i * 7 + 3) % v).collect();
            m.prefill(c, &toks, None, false).expect("seed prefill");
        }
        let mut s = vec![0u8];
        s.extend(m.cache_save(c).expect("seed save"));
        out.push((format!("len{len}_cap{cap}"), s));
        m.cache_release(c).expect("seed release");
    }
    let a = m.cache_reserve(48).expect("seed cache");
    m.prefill(a, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], None, false)
        .expect("prefill");
    let f = m.cache_fork(a).expect("fork");
    m.cache_truncate(f, 5).expect("truncate");
    m.prefill(f, &[30, 31, 32], None, false).expect("prefill");
    let mut s = vec![0u8];
    s.extend(m.cache_save(f).expect("seed save"));
    out.push(("fork_truncate_len8_cap48".to_string(), s));
    m.cache_release(f).expect("release");
    m.cache_release(a).expect("release");
    out
}

/// Serialises the users of [`state_model`] (the regression tests run in threads), so
/// the pool checks of [`cache_state`] see only their own call.
static STATE_LOCK: Mutex<()> = Mutex::new(());

/// `cache_state`: `data[1..]` loaded as a saved cache state into [`state_model`].
/// `data[0]` is a mode byte: odd = first replace the state's last 4 bytes by the CRC-32
/// of the bytes before them (so the fuzzer also reaches what is checked after the
/// checksum: the tokens, the pool, the KV copy, a step over arbitrary KV values). A
/// refused state must change nothing (no cache, no block); a loaded one must save back
/// to the same bytes, take one step (or be full) and release every block it took.
pub fn cache_state(data: &[u8]) -> Result<()> {
    let _serial = STATE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let m = state_model();
    let Some((&mode, rest)) = data.split_first() else {
        return Err(llmrt::Error::invalid("no mode byte"));
    };
    let mut state = rest.to_vec();
    if mode & 1 == 1 && state.len() >= 4 {
        let n = state.len() - 4;
        let c = llmrt::util::crc32(&state[..n]);
        state[n..].copy_from_slice(&c.to_le_bytes());
    }
    let before = (m.kv_usage(), m.cache_ids().len());
    let c = match m.cache_load(&state, 0) {
        Ok(c) => c,
        Err(e) => {
            assert_eq!((m.kv_usage(), m.cache_ids().len()), before, "a refused load changed the pool: {e}");
            assert!(
                matches!(
                    e.status,
                    Status::LLMRT_INVALID_ARGUMENT | Status::LLMRT_CONTEXT_FULL | Status::LLMRT_OUT_OF_MEMORY
                ),
                "unexpected refusal: {e}"
            );
            return Err(e);
        }
    };
    let back = m.cache_save(c).expect("saving a loaded cache");
    assert_eq!(back, state, "a loaded state saves back to other bytes");
    let len = m.cache_length(c).expect("length");
    assert_eq!(m.cache_tokens(c).expect("tokens").len(), len as usize);
    let mut row = vec![0f32; m.info().vocab_size as usize];
    match m.decode(&[c], &[len % m.info().vocab_size], Some(&mut row)) {
        Ok(()) => {}
        Err(e) => assert_eq!(e.status, Status::LLMRT_CONTEXT_FULL, "a step on a loaded cache failed: {e}"),
    }
    m.cache_release(c).expect("release");
    assert_eq!((m.kv_usage(), m.cache_ids().len()), before, "a loaded cache's release left blocks behind");
    Ok(())
}

/// Messages every fuzzed chat template is rendered over: system, user, assistant,
/// user, with markup look-alikes and multi-byte UTF-8.
const CHAT_MESSAGES: [(&str, &str); 4] = [
    ("system", "You are terse. <|im_start|>{{ not a tag }}"),
    ("user", "Hello! caf\u{e9} \u{65e5}\u{672c} \u{1F600}"),
    ("assistant", "Hi.</s>"),
    ("user", "{% raw %}x{% endraw %} and \\n newline\n"),
];

/// `chat_template`: `data` (lossily UTF-8) as a chat template source, rendered over
/// [`CHAT_MESSAGES`] with and without the generation prompt at a fixed date. Any
/// `Err` is fine; minijinja's fuel and recursion limits must stop every loop (a hang
/// is the fuzzer's timeout), and the output stays under the renderer's cap.
/// Work budget of a fuzzed render: 1/50 of the library's `FUEL`, still about 50 times what
/// the largest real template of the seeds takes over the four messages (the regression
/// test renders them all through this function), so a mutation that loops until the fuel
/// runs out costs milliseconds and the campaign reaches its 10 million executions.
pub const CHAT_FUZZ_FUEL: u64 = llmrt::chat::template::FUEL / 50;

pub fn chat_template(data: &[u8]) -> Result<()> {
    chat_template_with_fuel(data, CHAT_FUZZ_FUEL)
}

/// [`chat_template`] with any work budget (the regression test compares the fuzz budget's
/// outcomes with the library's own `FUEL`).
pub fn chat_template_with_fuel(data: &[u8], fuel: u64) -> Result<()> {
    use llmrt::chat::template::render_with_fuel as render_fueled;
    use llmrt::chat::{DateTime, Message, RenderOptions};
    let source = String::from_utf8_lossy(data);
    let msgs: Vec<Message<'_>> = CHAT_MESSAGES.iter().map(|&(role, content)| Message { role, content }).collect();
    let mut first = Ok(());
    for add_generation_prompt in [false, true] {
        let opts = RenderOptions {
            add_generation_prompt,
            bos_token: "<s>",
            eos_token: "</s>",
            now: Some(DateTime::from_unix(1_700_000_000)),
        };
        match render_fueled(&source, &msgs, &opts, fuel) {
            Ok(out) => assert!(out.len() <= llmrt::chat::template::MAX_OUTPUT),
            Err(e) => {
                assert_eq!(e.status, Status::LLMRT_INVALID_ARGUMENT, "{e}");
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
    }
    first
}
