//! `llmrt_set_abort_callback`: a step the callback stops fails with LLMRT_ABORTED,
//! names where it stopped, and commits nothing; later steps equal those of a model
//! that never saw an abort.
mod common;
use common::*;
use llmrt::ffi::*;
use llmrt::Status;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

/// What the callback sees: it counts its calls and answers true from call `abort_at` on.
struct Probe {
    calls: AtomicU32,
    abort_at: AtomicU32,
}

unsafe extern "C" fn probe_cb(user: *mut c_void) -> bool {
    // SAFETY: user is the &Probe set with the callback, alive for the whole test.
    let p = unsafe { &*(user as *const Probe) };
    p.calls.fetch_add(1, Ordering::SeqCst) >= p.abort_at.load(Ordering::SeqCst)
}

fn set(m: &M, p: Option<&Probe>) {
    let (cb, user): (llmrt_abort_callback, *mut c_void) = match p {
        Some(p) => (Some(probe_cb), p as *const Probe as *mut c_void),
        None => (None, std::ptr::null_mut()),
    };
    // SAFETY: a live model; the probe outlives every step of the test.
    ok(unsafe { llmrt_set_abort_callback(m.ptr, cb, user) }, "set_abort_callback");
}

fn sample(m: &M, caches: &[u64], toks: &[u32], seed: u64) -> Result<Vec<u32>, Status> {
    let mut p = default_sampler_params();
    p.temperature = 0.9;
    p.seed = seed;
    let mut next = vec![0u32; caches.len()];
    // SAFETY: a live model; arrays of caches.len() items.
    let s = unsafe { llmrt_decode_sample(m.ptr, caches.len(), caches.as_ptr(), toks.as_ptr(), &p, next.as_mut_ptr()) };
    if s == Status::LLMRT_OK {
        Ok(next)
    } else {
        Err(s)
    }
}

#[test]
fn an_aborted_step_commits_nothing_at_every_poll() {
    let f = &Fixture::all()[0];
    let path = f.gguf("f32");
    let control = load(&path);
    let m = load(&path);
    let layers = m.info().n_layers;
    let probe = Probe { calls: AtomicU32::new(0), abort_at: AtomicU32::new(u32::MAX) };
    set(&m, Some(&probe));

    // Never aborting: polled once per layer and once before the LM head, and the
    // results are the control's bit for bit.
    let (c0, k0) = (m.reserve(0), control.reserve(0));
    assert_eq!(m.prefill_all(c0, &f.tokens), control.prefill_all(k0, &f.tokens));
    assert_eq!(probe.calls.load(Ordering::SeqCst), layers + 1, "polls of a step with logits");

    // Aborting at each poll: LLMRT_ABORTED naming the place, nothing committed, and the
    // same cache then prefills as the control did.
    for k in 0..=layers {
        let c = m.reserve(0);
        probe.calls.store(0, Ordering::SeqCst);
        probe.abort_at.store(k, Ordering::SeqCst);
        assert_eq!(m.try_prefill_all(c, &f.tokens), Err(Status::LLMRT_ABORTED), "abort at poll {k}");
        let msg = last_error();
        let place = if k < layers { format!("layer {k} of {layers}") } else { "the LM head".to_string() };
        assert!(msg.contains(&place) && msg.contains("nothing was committed"), "poll {k}: {msg}");
        assert_eq!(m.len(c), 0, "an aborted prefill committed positions");
        probe.abort_at.store(u32::MAX, Ordering::SeqCst);
        let kc = control.reserve(0);
        assert_eq!(m.prefill_all(c, &f.tokens), control.prefill_all(kc, &f.tokens), "after the abort at {k}");
        m.release(c);
        control.release(kc);
    }

    // A sampled decode of two caches: aborted, neither advances and the draws then
    // equal the control's.
    let (a, b) = (m.reserve(0), m.reserve(0));
    let (ka, kb) = (control.reserve(0), control.reserve(0));
    m.prefill(a, &f.tokens[..4]);
    m.prefill(b, &f.tokens[4..9]);
    control.prefill(ka, &f.tokens[..4]);
    control.prefill(kb, &f.tokens[4..9]);
    probe.calls.store(0, Ordering::SeqCst);
    probe.abort_at.store(1, Ordering::SeqCst);
    assert_eq!(sample(&m, &[a, b], &[5, 6], 42), Err(Status::LLMRT_ABORTED));
    assert_eq!((m.len(a), m.len(b)), (4, 5));
    set(&m, None);
    let want = sample(&control, &[ka, kb], &[5, 6], 42).unwrap();
    assert_eq!(sample(&m, &[a, b], &[5, 6], 42).unwrap(), want);
    assert_eq!(probe.calls.load(Ordering::SeqCst), 2, "the removed callback was called again");
}

#[test]
fn an_aborted_embedding_leaks_no_cache() {
    let f = &Fixture::all()[0];
    let m = load(&f.gguf("f32"));
    let probe = Probe { calls: AtomicU32::new(0), abort_at: AtomicU32::new(0) };
    set(&m, Some(&probe));
    assert_eq!(
        m.embed(&f.tokens, llmrt_pooling::LLMRT_POOLING_MEAN as u32, true).unwrap_err().0,
        Status::LLMRT_ABORTED
    );
    set(&m, None);
    let c = m.reserve(0);
    assert_eq!(m.len(c), 0);
    assert!(m.embed(&f.tokens, llmrt_pooling::LLMRT_POOLING_MEAN as u32, true).is_ok());
}

#[test]
fn set_abort_callback_rejects_a_null_model() {
    // SAFETY: NULL is rejected before use.
    let s = unsafe { llmrt_set_abort_callback(std::ptr::null_mut(), None, std::ptr::null_mut()) };
    assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT);
}
