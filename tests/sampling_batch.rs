//! Per-cache sampling in one batched step through the C entry points
//! (`llmrt_decode_sample_each`): each cache's token equals the one a single-cache
//! `llmrt_decode_sample` with its parameters gives, and the one `llmrt_sample_logits`
//! (checked against llama.cpp in tests/sampling_llamacpp.rs) gives on the step's logits,
//! the cache's tokens and its length; logit bias and penalties steer real decoding; bad
//! parameters anywhere in the batch fail the step before any cache changes; a struct of
//! the old (pre-bias) size reads the new fields as off.
mod common;
use common::*;
use llmrt::ffi::*;
use llmrt::Status;

fn defaults() -> llmrt_sampler_params {
    default_sampler_params()
}

fn model() -> (M, Vec<u32>) {
    let f = Fixture::all().into_iter().find(|f| f.name == "llama_gqa").expect("llama_gqa fixture");
    (load(&f.gguf("f32")), f.greedy_prompt())
}

fn each(m: &M, caches: &[u64], toks: &[u32], ps: &[*const llmrt_sampler_params]) -> Result<Vec<u32>, Status> {
    let mut next = vec![u32::MAX; caches.len()];
    // SAFETY: a live model; caches, toks, ps and next are live locals of length n; every
    // params pointer points to a live filled struct (whose bias list is alive) or is NULL.
    let s = unsafe {
        llmrt_decode_sample_each(m.ptr, caches.len(), caches.as_ptr(), toks.as_ptr(), ps.as_ptr(), next.as_mut_ptr())
    };
    if s == Status::LLMRT_OK {
        Ok(next)
    } else {
        assert!(next.iter().all(|&t| t == u32::MAX), "next_tokens written by a failed step");
        Err(s)
    }
}

fn single(m: &M, c: u64, tok: u32, p: &llmrt_sampler_params) -> u32 {
    let mut next = u32::MAX;
    // SAFETY: a live model; c, tok, next are locals; p a live filled struct.
    ok(unsafe { llmrt_decode_sample(m.ptr, 1, &c, &tok, p, &mut next) }, "decode_sample");
    next
}

fn sample_logits(p: &llmrt_sampler_params, row: &[f32], history: &[u32], pos: u64) -> u32 {
    let mut t = u32::MAX;
    // SAFETY: p a live filled struct; row and history live slices of the lengths passed.
    let s = unsafe { llmrt_sample_logits(p, row.as_ptr(), row.len(), history.as_ptr(), history.len(), pos, &mut t) };
    assert_eq!(s, Status::LLMRT_OK, "{}", last_error());
    t
}

/// Four parameter sets as different as the API allows.
fn param_sets(vocab: usize, bias: &[llmrt_logit_bias]) -> Vec<llmrt_sampler_params> {
    let d = defaults();
    let greedy_biased = llmrt_sampler_params {
        temperature: 0.0,
        logit_bias: bias.as_ptr(),
        n_logit_bias: bias.len(),
        frequency_penalty: 0.5,
        penalty_last_n: 8,
        ..d
    };
    let penalised = llmrt_sampler_params {
        temperature: 1.2,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repetition_penalty: 1.3,
        presence_penalty: 1.0,
        frequency_penalty: 0.3,
        penalty_last_n: -1,
        seed: 11,
        ..d
    };
    let filtered = llmrt_sampler_params { temperature: 0.7, top_k: 5, top_p: 0.9, min_p: 0.02, seed: 99, ..d };
    assert!(bias.iter().all(|b| (b.token as usize) < vocab));
    vec![greedy_biased, penalised, filtered, d]
}

#[test]
fn per_cache_params_equal_single_cache_calls_and_sample_logits() {
    let (m, prompt) = model();
    let bias = [
        llmrt_logit_bias { token: 7, bias: 4.0 },
        llmrt_logit_bias { token: 3, bias: f32::NEG_INFINITY },
        llmrt_logit_bias { token: 7, bias: 1.5 },
    ];
    let sets = param_sets(m.vocab, &bias);
    let n = sets.len();
    let ptrs: Vec<*const llmrt_sampler_params> = sets.iter().map(|p| p as *const _).collect();
    // Batched caches, the same prompts in lone caches, and lone caches stepped by
    // llmrt_decode + llmrt_sample_logits.
    let (batch, lone, manual): (Vec<u64>, Vec<u64>, Vec<u64>) = (
        (0..n).map(|_| m.reserve(0)).collect(),
        (0..n).map(|_| m.reserve(0)).collect(),
        (0..n).map(|_| m.reserve(0)).collect(),
    );
    let mut hist: Vec<Vec<u32>> = Vec::new();
    for i in 0..n {
        let p: Vec<u32> = prompt.iter().map(|&t| (t + i as u32 * 3) % m.vocab as u32).collect();
        for c in [batch[i], lone[i], manual[i]] {
            m.prefill(c, &p);
        }
        hist.push(p);
    }
    let mut toks: Vec<u32> = (0..n as u32).map(|i| 1 + i).collect();
    let mut all = Vec::new();
    for step in 0..20 {
        let got = each(&m, &batch, &toks, &ptrs).unwrap_or_else(|s| panic!("step {step}: {s:?} {}", last_error()));
        for i in 0..n {
            assert_eq!(single(&m, lone[i], toks[i], &sets[i]), got[i], "step {step} cache {i}: alone");
            let row = m.decode(&[manual[i]], &[toks[i]]);
            hist[i].push(toks[i]);
            let want = sample_logits(&sets[i], &row, &hist[i], hist[i].len() as u64);
            assert_eq!(want, got[i], "step {step} cache {i}: llmrt_sample_logits on the step's row");
            assert_eq!(m.len(batch[i]) as usize, hist[i].len());
        }
        all.push(got.clone());
        toks = got;
    }
    // The bias steers: 3 is banned for cache 0 and never drawn.
    assert!(all.iter().all(|g| g[0] != 3), "{all:?}");
    // One set shared through repeated pointers is the same as the one-set call.
    let shared = vec![ptrs[2]; n];
    let a = each(&m, &batch, &toks, &shared).unwrap();
    let mut b = vec![u32::MAX; n];
    // SAFETY: a live model; lone, toks, b live locals of length n; sets[2] a live struct.
    ok(unsafe { llmrt_decode_sample(m.ptr, n, lone.as_ptr(), toks.as_ptr(), &sets[2], b.as_mut_ptr()) }, "shared");
    assert_eq!(a, b);
}

#[test]
fn bias_and_penalties_steer_decoding() {
    let (m, prompt) = model();
    let d = defaults();
    let (c, probe) = (m.reserve(0), m.reserve(0));
    m.prefill(c, &prompt);
    m.prefill(probe, &prompt);
    let t0 = 5u32;
    let row = m.decode(&[probe], &[t0]);
    let top = argmax(&row);
    // A large bias on another token makes greedy pick it.
    let forced = (top + 1) % m.vocab as u32;
    let bias = [llmrt_logit_bias { token: forced, bias: 1e4 }];
    let p = llmrt_sampler_params { temperature: 0.0, logit_bias: bias.as_ptr(), n_logit_bias: 1, ..d };
    assert_eq!(single(&m, c, t0, &p), forced);
    // A ban on the argmax makes greedy pick the runner-up.
    ok(m.truncate(c, prompt.len() as u32), "truncate");
    let ban = [llmrt_logit_bias { token: top, bias: f32::NEG_INFINITY }];
    let p = llmrt_sampler_params { temperature: 0.0, logit_bias: ban.as_ptr(), n_logit_bias: 1, ..d };
    let mut second = row.clone();
    second[top as usize] = f32::NEG_INFINITY;
    assert_eq!(single(&m, c, t0, &p), argmax(&second));
    assert_ne!(argmax(&second), top);
    // A huge presence penalty over the whole cache: greedy never repeats a token the cache
    // holds (the fixture's vocabulary is larger than the run).
    let p = llmrt_sampler_params { temperature: 0.0, presence_penalty: 1e4, penalty_last_n: -1, ..d };
    let c2 = m.reserve(0);
    m.prefill(c2, &prompt);
    let mut seen: Vec<u32> = prompt.clone();
    let mut tok = t0;
    for _ in 0..40 {
        seen.push(tok);
        tok = single(&m, c2, tok, &p);
        assert!(!seen.contains(&tok), "drew {tok} again: {seen:?}");
    }
    // penalty_last_n = 0 turns them off: plain greedy.
    let off = llmrt_sampler_params { temperature: 0.0, presence_penalty: 1e4, penalty_last_n: 0, ..d };
    let c3 = m.reserve(0);
    m.prefill(c3, &prompt);
    assert_eq!(single(&m, c3, t0, &off), top);
}

#[test]
fn bad_params_anywhere_fail_the_step_and_change_nothing() {
    let (m, prompt) = model();
    let caches: Vec<u64> = (0..3).map(|_| m.reserve(0)).collect();
    for &c in &caches {
        m.prefill(c, &prompt);
    }
    let toks = [1u32, 2, 3];
    let good = defaults();
    let v = m.vocab as u32;
    let past_vocab = [llmrt_logit_bias { token: 1, bias: 0.5 }, llmrt_logit_bias { token: v, bias: 1.0 }];
    let nan = [llmrt_logit_bias { token: 2, bias: f32::NAN }];
    let pinf = [llmrt_logit_bias { token: 2, bias: f32::INFINITY }];
    let bad: Vec<(llmrt_sampler_params, String)> = vec![
        (
            llmrt_sampler_params { logit_bias: past_vocab.as_ptr(), n_logit_bias: 2, ..good },
            format!("params[1]: sampler logit_bias[1] names token {v}, outside the vocabulary (size {v})"),
        ),
        (llmrt_sampler_params { logit_bias: nan.as_ptr(), n_logit_bias: 1, ..good }, "logit_bias[0] (token 2)".into()),
        (llmrt_sampler_params { logit_bias: pinf.as_ptr(), n_logit_bias: 1, ..good }, "bias inf".into()),
        (llmrt_sampler_params { logit_bias: std::ptr::null(), n_logit_bias: 4, ..good }, "params.logit_bias".into()),
        (llmrt_sampler_params { penalty_last_n: -2, ..good }, "penalty_last_n -2".into()),
        (llmrt_sampler_params { frequency_penalty: f32::NAN, ..good }, "frequency_penalty NaN".into()),
        (llmrt_sampler_params { presence_penalty: f32::INFINITY, ..good }, "presence_penalty inf".into()),
        (llmrt_sampler_params { top_p: 0.0, ..good }, "params[1]: sampler top_p 0".into()),
        (llmrt_sampler_params { struct_size: 0, ..good }, "params[1]: params.struct_size is 0".into()),
    ];
    for (b, needle) in &bad {
        let ptrs = [&good as *const _, b as *const _, &good as *const _];
        assert_eq!(each(&m, &caches, &toks, &ptrs), Err(Status::LLMRT_INVALID_ARGUMENT), "{needle}");
        assert!(last_error().contains(needle.as_str()), "{needle:?} not in {}", last_error());
        for &c in &caches {
            assert_eq!(m.len(c) as usize, prompt.len(), "{needle}: a cache changed");
        }
    }
    let ptrs = [&good as *const _, std::ptr::null(), &good as *const _];
    assert_eq!(each(&m, &caches, &toks, &ptrs), Err(Status::LLMRT_INVALID_ARGUMENT));
    assert!(last_error().contains("params[1] is NULL"), "{}", last_error());
    // A bad token or an unknown cache after good params: same, nothing changes.
    let ptrs = [&good as *const _; 3];
    assert_eq!(each(&m, &caches, &[1, v, 3], &ptrs), Err(Status::LLMRT_INVALID_ARGUMENT));
    assert_eq!(each(&m, &[caches[0], 999_999, caches[2]], &toks, &ptrs), Err(Status::LLMRT_UNKNOWN_CACHE));
    let mut next = [u32::MAX; 3];
    // SAFETY: a live model; params NULL is what is tested; the other arrays are live locals.
    let s = unsafe {
        llmrt_decode_sample_each(m.ptr, 3, caches.as_ptr(), toks.as_ptr(), std::ptr::null(), next.as_mut_ptr())
    };
    assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT);
    assert!(last_error().contains("params"), "{}", last_error());
    for &c in &caches {
        assert_eq!(m.len(c) as usize, prompt.len());
    }
    assert!(each(&m, &caches, &toks, &ptrs).is_ok());
}

/// A caller built against the header before the bias and penalty fields passes
/// struct_size 32: whatever lies past it is not read, the new fields are off.
#[test]
fn old_struct_size_reads_new_fields_as_off() {
    const OLD: usize = 32; // struct_size .. seed
    assert_eq!(std::mem::offset_of!(llmrt_sampler_params, penalty_last_n), OLD);
    let (m, prompt) = model();
    let mut p = defaults();
    p.temperature = 0.9;
    p.repetition_penalty = 1.2;
    p.seed = 3;
    let want = p;
    let mut old = p;
    old.struct_size = OLD as u32;
    old.penalty_last_n = 1; // garbage past struct_size
    old.frequency_penalty = f32::NAN;
    old.presence_penalty = 55.0;
    old.logit_bias = 8 as *const llmrt_logit_bias; // never dereferenced
    old.n_logit_bias = usize::MAX;
    let (a, b) = (m.reserve(0), m.reserve(0));
    m.prefill(a, &prompt);
    m.prefill(b, &prompt);
    let (mut ta, mut tb) = (1u32, 1u32);
    for _ in 0..12 {
        ta = each(&m, &[a], &[ta], &[&old as *const _]).unwrap_or_else(|s| panic!("{s:?} {}", last_error()))[0];
        tb = single(&m, b, tb, &want);
        assert_eq!(ta, tb);
    }
    // llmrt_sampler_params_init with the old size writes only the old fields.
    let mut buf = [0xA5u8; std::mem::size_of::<llmrt_sampler_params>()];
    // SAFETY: buf holds sizeof(llmrt_sampler_params) writable bytes, more than OLD.
    unsafe { llmrt_sampler_params_init(buf.as_mut_ptr().cast(), OLD) };
    assert!(buf[OLD..].iter().all(|&x| x == 0xA5));
    assert_eq!(u32::from_ne_bytes(buf[..4].try_into().unwrap()), OLD as u32);
}

#[test]
fn sample_logits_validates() {
    let p = defaults();
    let row = [0.5f32, 2.0, -1.0];
    let mut t = 7u32;
    let call = |p: &llmrt_sampler_params, row: &[f32], t: &mut u32| {
        // SAFETY: p a live struct; row a live slice (its pointer may dangle with length 0,
        // which is what is tested); t a local.
        unsafe { llmrt_sample_logits(p, row.as_ptr(), row.len(), std::ptr::null(), 0, 0, t) }
    };
    assert_eq!(call(&p, &[], &mut t), Status::LLMRT_INVALID_ARGUMENT);
    assert!(last_error().contains("n_logits = 0"), "{}", last_error());
    let bias = [llmrt_logit_bias { token: 3, bias: 1.0 }];
    let pb = llmrt_sampler_params { logit_bias: bias.as_ptr(), n_logit_bias: 1, ..p };
    assert_eq!(call(&pb, &row, &mut t), Status::LLMRT_INVALID_ARGUMENT);
    assert!(last_error().contains("token 3, outside the vocabulary (size 3)"), "{}", last_error());
    assert_eq!(t, 7, "out_token written on failure");
    let bias = [llmrt_logit_bias { token: 2, bias: 10.0 }];
    let pb = llmrt_sampler_params { temperature: 0.0, logit_bias: bias.as_ptr(), n_logit_bias: 1, ..p };
    assert_eq!(call(&pb, &row, &mut t), Status::LLMRT_OK);
    assert_eq!(t, 2);
    // SAFETY: every pointer NULL but the ones tested non-null: the call must reject them.
    let s = unsafe { llmrt_sample_logits(&p, std::ptr::null(), 3, std::ptr::null(), 0, 0, &mut t) };
    assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT);
    // SAFETY: as above.
    let s = unsafe { llmrt_sample_logits(&p, row.as_ptr(), 3, std::ptr::null(), 2, 0, &mut t) };
    assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT);
    assert!(last_error().contains("history"), "{}", last_error());
}
