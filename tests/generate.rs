//! `llmrt_generate`: greedy generation equals transformers' greedy ids; sampled
//! generation equals the llmrt_decode_sample loop it is made of; each stop reason;
//! failures before and during the loop.
mod common;
use common::*;
use llmrt::ffi::*;
use llmrt::Status;
use std::ffi::{c_char, c_void};

/// What the token callback saw; it stops after `stop_after` tokens.
#[derive(Default)]
struct Seen {
    tokens: Vec<u32>,
    text: Vec<u8>,
    stop_after: usize,
}

unsafe extern "C" fn on_token(user: *mut c_void, token: u32, piece: *const c_char, len: usize) -> bool {
    // SAFETY: user is the &mut Seen passed to llmrt_generate, alive during the call.
    let s = unsafe { &mut *(user as *mut Seen) };
    // SAFETY: piece holds len bytes plus a NUL per the header contract.
    let bytes = unsafe { std::slice::from_raw_parts(piece.cast::<u8>(), len + 1) };
    assert_eq!(bytes[len], 0, "piece not NUL-terminated");
    s.tokens.push(token);
    s.text.extend_from_slice(&bytes[..len]);
    s.stop_after == 0 || s.tokens.len() < s.stop_after
}

struct Out {
    status: Status,
    tokens: Vec<u32>,
    reason: Option<llmrt_stop_reason>,
    seen: Seen,
}

fn generate(m: &M, c: u64, prompt: &[u32], p: Option<&llmrt_sampler_params>, max: u32, stop_after: usize) -> Out {
    let mut seen = Seen { stop_after, ..Default::default() };
    let mut toks = vec![u32::MAX; max as usize];
    let (mut n, mut reason) = (usize::MAX, llmrt_stop_reason::LLMRT_STOP_EOG);
    let reason_ptr = &mut reason as *mut llmrt_stop_reason;
    // Sentinel: a reason the call did not write is seen as None.
    // SAFETY: reason_ptr points at a live local; writing a valid variant.
    unsafe { (reason_ptr as *mut u32).write(99) };
    // SAFETY: a live model; every pointer is a live local of the length passed.
    let status = unsafe {
        llmrt_generate(
            m.ptr,
            c,
            prompt.as_ptr(),
            prompt.len(),
            p.map_or(std::ptr::null(), |p| p as *const _),
            max,
            Some(on_token),
            &mut seen as *mut Seen as *mut c_void,
            toks.as_mut_ptr(),
            toks.len(),
            &mut n,
            reason_ptr,
        )
    };
    // SAFETY: reason_ptr points at a live u32-sized local.
    let raw = unsafe { (reason_ptr as *const u32).read() };
    let reason = (raw != 99).then_some(reason);
    toks.truncate(if n == usize::MAX { 0 } else { n });
    Out { status, tokens: toks, reason, seen }
}

fn params(seed: u64) -> llmrt_sampler_params {
    let mut p = default_sampler_params();
    p.temperature = 1.0;
    p.seed = seed;
    p
}

fn piece(m: &M, t: u32) -> Vec<u8> {
    let mut buf = vec![0u8; 256];
    let mut n = 0usize;
    // SAFETY: a live model; buf holds 256 writable bytes.
    ok(unsafe { llmrt_token_piece(m.ptr, t, buf.as_mut_ptr().cast(), buf.len(), &mut n) }, "token_piece");
    buf.truncate(n);
    buf
}

fn eos(m: &M) -> u32 {
    m.info().eos_token
}

#[test]
fn greedy_generation_equals_transformers_greedy_ids() {
    for f in Fixture::all() {
        let m = load(&f.gguf("f32"));
        let c = m.reserve(0);
        let want = f.greedy_ids();
        let prompt = f.greedy_prompt();
        let o = generate(&m, c, &prompt, None, want.len() as u32, 0);
        assert_eq!(o.status, Status::LLMRT_OK, "{}: {}", f.name, last_error());
        // The random fixtures' EOS may come first: then the ids up to it.
        let n = o.tokens.len();
        assert_eq!(o.tokens, want[..n], "{}: greedy ids vs transformers", f.name);
        println!("{:<14} {n} of {} greedy ids, stop {:?}", f.name, want.len(), o.reason);
        match o.reason {
            Some(llmrt_stop_reason::LLMRT_STOP_MAX_TOKENS) => assert_eq!(n, want.len()),
            Some(llmrt_stop_reason::LLMRT_STOP_EOG) => assert_eq!(o.tokens[n - 1], eos(&m)),
            r => panic!("{}: stop reason {r:?}", f.name),
        }
        assert_eq!(m.len(c) as usize, prompt.len() + n - 1, "{}: cache = prompt + all but the last", f.name);
        // The callback saw every token but an EOG, with their pieces.
        let shown: Vec<u32> = o.tokens.iter().copied().filter(|&t| t != eos(&m)).collect();
        assert_eq!(o.seen.tokens, shown);
        if f.json["tokenizer"].is_object() {
            let mut pieces = Vec::new();
            for &t in &shown {
                pieces.extend_from_slice(&piece(&m, t));
            }
            assert_eq!(o.seen.text, pieces, "{}: callback pieces vs llmrt_token_piece", f.name);
        }
    }
}

#[test]
fn sampled_generation_equals_the_decode_sample_loop() {
    let f = &Fixture::all()[0];
    let m = load(&f.gguf("f32"));
    let prompt = f.greedy_prompt();
    for seed in [1u64, 2, 3] {
        let p = params(seed);
        let c = m.reserve(0);
        let o = generate(&m, c, &prompt, Some(&p), 12, 0);
        assert_eq!(o.status, Status::LLMRT_OK, "{}", last_error());
        // The same by hand: prefill all but the last prompt token, then decode_sample.
        let k = m.reserve(0);
        m.prefill(k, &prompt[..prompt.len() - 1]);
        let mut feed = *prompt.last().unwrap();
        let mut want = Vec::new();
        while want.len() < o.tokens.len() {
            let mut next = 0u32;
            // SAFETY: a live model; one cache, one token, one output slot.
            ok(unsafe { llmrt_decode_sample(m.ptr, 1, &k, &feed, &p, &mut next) }, "decode_sample");
            want.push(next);
            feed = next;
        }
        assert_eq!(o.tokens, want, "seed {seed}");
        assert_eq!(m.len(c), m.len(k), "seed {seed}: both caches hold the prompt and all but the last token");
    }
}

#[test]
fn each_stop_reason() {
    let f = &Fixture::all()[0];
    let m = load(&f.gguf("f32"));
    let prompt = f.greedy_prompt();
    let e = eos(&m);
    // EOG first: the bias makes EOS certain; it is output, not fed, not shown.
    let bias = llmrt_logit_bias { token: e, bias: 1e4 };
    let mut p = params(5);
    p.logit_bias = &bias;
    p.n_logit_bias = 1;
    let c = m.reserve(0);
    let o = generate(&m, c, &prompt, Some(&p), 8, 0);
    assert_eq!((o.status, o.reason), (Status::LLMRT_OK, Some(llmrt_stop_reason::LLMRT_STOP_EOG)));
    assert_eq!(o.tokens, vec![e]);
    assert!(o.seen.tokens.is_empty(), "the callback saw the EOG token");
    assert_eq!(m.len(c) as usize, prompt.len());
    // The callback stops it.
    let c = m.reserve(0);
    let o = generate(&m, c, &prompt, None, 50, 3);
    if o.reason != Some(llmrt_stop_reason::LLMRT_STOP_EOG) {
        assert_eq!(o.reason, Some(llmrt_stop_reason::LLMRT_STOP_CALLBACK));
        assert_eq!((o.tokens.len(), o.seen.tokens.len()), (3, 3));
    }
    // The cache fills: prompt + 4 positions give 5 tokens (the last not fed).
    let mut ban = vec![llmrt_logit_bias { token: e, bias: f32::NEG_INFINITY }];
    ban.extend(m_eog_tokens(&m).into_iter().map(|t| llmrt_logit_bias { token: t, bias: f32::NEG_INFINITY }));
    let mut p = params(9);
    p.logit_bias = ban.as_ptr();
    p.n_logit_bias = ban.len();
    let c = m.reserve(prompt.len() as u32 + 4);
    let o = generate(&m, c, &prompt, Some(&p), 50, 0);
    assert_eq!((o.status, o.reason), (Status::LLMRT_OK, Some(llmrt_stop_reason::LLMRT_STOP_CONTEXT_FULL)));
    assert_eq!(o.tokens.len(), 5);
    assert_eq!(m.len(c) as usize, prompt.len() + 4);
}

fn m_eog_tokens(m: &M) -> Vec<u32> {
    let mut ids = vec![0u32; 64];
    let mut n = 0usize;
    // SAFETY: a live model; ids holds 64 writable slots.
    ok(unsafe { llmrt_eog_tokens(m.ptr, ids.as_mut_ptr(), ids.len(), &mut n) }, "eog_tokens");
    ids.truncate(n);
    ids
}

#[test]
fn bad_arguments_change_nothing_and_a_failing_step_reports_what_came_before() {
    let f = &Fixture::all()[0];
    let m = load(&f.gguf("f32"));
    let prompt = f.greedy_prompt();
    let c = m.reserve(0);
    let v = m.vocab as u32;
    for (pr, max, what) in [
        (&[][..], 4u32, "n_prompt = 0"),
        (&prompt[..], 0, "max_tokens = 0"),
        (&[1, 2, v][..], 4, "outside the vocabulary"),
    ] {
        let o = generate(&m, c, pr, None, max, 0);
        assert_eq!(o.status, Status::LLMRT_INVALID_ARGUMENT, "{what}");
        assert!(last_error().contains(what), "{what}: {}", last_error());
        assert_eq!((m.len(c), o.tokens.len(), o.reason), (0, 0, None), "{what}");
    }
    // A prompt that does not fit the cache: CONTEXT_FULL, nothing fed.
    let small = m.reserve(2);
    let o = generate(&m, small, &prompt, None, 4, 0);
    assert_eq!(o.status, Status::LLMRT_CONTEXT_FULL);
    assert_eq!(m.len(small), 0);
    // out_tokens too small for max_tokens.
    let mut toks = [0u32; 2];
    let mut n = 0usize;
    // SAFETY: a live model; live locals of the lengths passed.
    let s = unsafe {
        llmrt_generate(
            m.ptr,
            c,
            prompt.as_ptr(),
            prompt.len(),
            std::ptr::null(),
            3,
            None,
            std::ptr::null_mut(),
            toks.as_mut_ptr(),
            2,
            &mut n,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT);
    assert_eq!(m.len(c), 0);

    // The abort callback stops the third decode step: ABORTED, the two tokens before
    // it reported, the cache holds the prompt and the first of them.
    struct Count(std::sync::atomic::AtomicU32, u32);
    unsafe extern "C" fn stop(user: *mut c_void) -> bool {
        // SAFETY: user is the &Count set below, alive for the test.
        let c = unsafe { &*(user as *const Count) };
        c.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= c.1
    }
    let layers = m.info().n_layers;
    // Polls: the prompt head's prefill (layers, no LM head), then layers + 1 per decode.
    let count = Count(std::sync::atomic::AtomicU32::new(0), layers + 2 * (layers + 1));
    // SAFETY: a live model; count outlives the generate call below and is removed after.
    ok(unsafe { llmrt_set_abort_callback(m.ptr, Some(stop), &count as *const Count as *mut c_void) }, "set abort");
    // Greedy (temperature 0) with the end-of-generation ids banned, so only the abort stops it.
    let ban: Vec<llmrt_logit_bias> =
        m_eog_tokens(&m).into_iter().map(|t| llmrt_logit_bias { token: t, bias: f32::NEG_INFINITY }).collect();
    let mut p = params(1);
    p.temperature = 0.0;
    p.logit_bias = ban.as_ptr();
    p.n_logit_bias = ban.len();
    let o = generate(&m, c, &prompt, Some(&p), 20, 0);
    // SAFETY: as above.
    ok(unsafe { llmrt_set_abort_callback(m.ptr, None, std::ptr::null_mut()) }, "unset abort");
    let polls = count.0.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(o.status, Status::LLMRT_ABORTED, "{} (polls {polls}, tokens {:?})", last_error(), o.tokens);
    assert_eq!(o.reason, None);
    assert_eq!(o.tokens.len(), 2);
    assert_eq!(m.len(c) as usize, prompt.len() + 1);
    assert_eq!(o.seen.tokens, o.tokens, "the callback saw both tokens");
}
