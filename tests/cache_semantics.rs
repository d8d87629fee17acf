//! Cache semantics through the C entry points: split prefill, batched decode,
//! fork, truncate and failure atomicity, all bit for bit.
mod common;
use common::*;
use llmrt::Status;

fn model() -> (M, Vec<u32>) {
    let f = Fixture::all().into_iter().find(|f| f.name == "llama_gqa").expect("fixture llama_gqa");
    (load(&f.gguf("f32")), f.tokens.clone())
}

#[test]
fn prefix_then_rest_equals_one_prefill() {
    let (m, toks) = model();
    let a = m.reserve(64);
    let whole = m.prefill_all(a, &toks);
    for split in [1, 5, 16, 17] {
        let b = m.reserve(64);
        let mut parts = m.prefill_all(b, &toks[..split]);
        parts.extend(m.prefill_all(b, &toks[split..]));
        assert_eq!(parts, whole, "split at {split}");
        assert_eq!(m.len(b), toks.len() as u32);
    }
}

#[test]
fn batched_decode_equals_single_decodes_bit_for_bit() {
    let (m, toks) = model();
    let lens = [3usize, 16, 1, 9];
    let (solo, batch): (Vec<u64>, Vec<u64>) = lens
        .iter()
        .map(|&n| {
            let a = m.reserve(64);
            let b = m.reserve(64);
            m.prefill(a, &toks[..n]);
            m.prefill(b, &toks[..n]);
            (a, b)
        })
        .unzip();
    let mut next: Vec<u32> = (0..4).map(|i| toks[20 + i]).collect();
    for step in 0..6 {
        let bl = m.decode(&batch, &next);
        for (i, &c) in solo.iter().enumerate() {
            let sl = m.decode(&[c], &[next[i]]);
            assert_eq!(&bl[i * m.vocab..(i + 1) * m.vocab], &sl[..], "cache {i} step {step}");
        }
        next = bl.chunks_exact(m.vocab).map(argmax).collect();
        // decode_greedy agrees with argmax of decode
    }
    let g = m.decode_greedy(&batch, &next);
    for (i, &c) in solo.iter().enumerate() {
        assert_eq!(argmax(&m.decode(&[c], &[next[i]])), g[i]);
    }
}

#[test]
fn fork_then_diverge_equals_independent_caches() {
    let (m, toks) = model();
    let src = m.reserve(64);
    m.prefill(src, &toks[..13]); // ends inside the first block's successor: partial block shared
    let fork = m.fork(src);
    assert_eq!(m.len(fork), 13);
    let ind_a = m.reserve(64);
    let ind_b = m.reserve(64);
    m.prefill(ind_a, &toks[..13]);
    m.prefill(ind_b, &toks[..13]);
    for i in 0..8 {
        let ta = toks[(i * 3) % toks.len()];
        let tb = toks[(i * 7 + 1) % toks.len()];
        let la = m.decode(&[src, fork], &[ta, tb]);
        let ra = m.decode(&[ind_a], &[ta]);
        let rb = m.decode(&[ind_b], &[tb]);
        assert_eq!(&la[..m.vocab], &ra[..], "source after fork, step {i}");
        assert_eq!(&la[m.vocab..], &rb[..], "fork, step {i}");
    }
    // Releasing the source leaves the fork intact.
    assert_eq!(m.release(src), Status::LLMRT_OK);
    let lf = m.decode(&[fork], &[toks[0]]);
    let lb = m.decode(&[ind_b], &[toks[0]]);
    assert_eq!(lf, lb);
}

#[test]
fn truncate_then_reprefill_equals_fresh_cache() {
    let (m, toks) = model();
    let a = m.reserve(64);
    m.prefill(a, &toks);
    for keep in [0u32, 7, 16, 20] {
        assert_eq!(m.truncate(a, keep), Status::LLMRT_OK);
        assert_eq!(m.len(a), keep);
        let other: Vec<u32> = toks.iter().rev().copied().take(6).collect();
        let got = m.prefill_all(a, &other);
        let fresh = m.reserve(64);
        let mut prefix = toks[..keep as usize].to_vec();
        prefix.extend(&other);
        let want = m.prefill_all(fresh, &prefix);
        assert_eq!(&got[..], &want[keep as usize * m.vocab..], "keep {keep}");
        m.release(fresh);
        assert_eq!(m.truncate(a, m.len(a)), Status::LLMRT_OK);
        assert_eq!(m.truncate(a, 0), Status::LLMRT_OK);
        m.prefill(a, &toks);
    }
    assert_eq!(m.truncate(a, toks.len() as u32 + 1), Status::LLMRT_INVALID_ARGUMENT);
}

#[test]
fn failed_steps_leave_caches_unchanged() {
    let (m, toks) = model();
    let a = m.reserve(20);
    let twin = m.reserve(20);
    m.prefill(a, &toks[..10]);
    m.prefill(twin, &toks[..10]);
    let other = m.reserve(20);
    m.prefill(other, &toks[..2]);
    let v = m.vocab as u32;
    // Token out of range in a batch: nothing advances, logits untouched.
    let mut out = vec![7.0f32; 2 * m.vocab];
    // SAFETY: m.ptr is a live model; the id and token arrays hold 2 elements and out holds 2 rows.
    let s = unsafe { llmrt::ffi::llmrt_decode(m.ptr, 2, [a, other].as_ptr(), [1, v].as_ptr(), out.as_mut_ptr()) };
    assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT);
    assert!(last_error().contains(&v.to_string()), "{}", last_error());
    assert!(out.iter().all(|&x| x == 7.0), "logits written by a failed step");
    assert_eq!((m.len(a), m.len(other)), (10, 2));
    // Context full for one cache of a batch: neither advances.
    assert_eq!(m.try_prefill_all(a, &toks[..11]), Err(Status::LLMRT_CONTEXT_FULL));
    m.prefill(other, &toks[..18]);
    assert_eq!(m.try_decode(&[a, other], &[1, 2]), Err(Status::LLMRT_CONTEXT_FULL));
    assert_eq!(m.len(a), 10);
    // Duplicate cache in one step, unknown cache.
    assert_eq!(m.try_decode(&[a, a], &[1, 2]), Err(Status::LLMRT_INVALID_ARGUMENT));
    assert_eq!(m.try_decode(&[a, 999_999], &[1, 2]), Err(Status::LLMRT_UNKNOWN_CACHE));
    assert_eq!(m.len(a), 10);
    // And the cache goes on exactly like its untouched twin.
    assert_eq!(m.prefill_all(a, &toks[10..20]), m.prefill_all(twin, &toks[10..20]));
}

#[test]
fn kv_pool_exhaustion_reports_sizes_and_recovers() {
    let f = Fixture::all().into_iter().find(|f| f.name == "llama_gqa").unwrap();
    // Room for exactly 4 blocks of 16 positions.
    let probe = load(&f.gguf("f32"));
    let per_pos = probe.info().kv_bytes_per_position;
    drop(probe);
    let m = try_load(&f.gguf("f32"), 1, per_pos * 16 * 4).unwrap();
    let a = m.reserve(32);
    let b = m.reserve(32);
    let mut c = 0;
    // SAFETY: m.ptr is a live model and c a writable u64.
    let s = unsafe { llmrt::ffi::llmrt_cache_reserve(m.ptr, 1, &mut c) };
    assert_eq!(s, Status::LLMRT_OUT_OF_MEMORY);
    assert!(last_error().contains("bytes"), "{}", last_error());
    assert_eq!(c, 0, "out_cache written on failure");
    // SAFETY: m.ptr is a live model and c a writable u64.
    let s = unsafe { llmrt::ffi::llmrt_cache_fork(m.ptr, a, &mut c) };
    assert_eq!(s, Status::LLMRT_OUT_OF_MEMORY);
    assert_eq!(m.release(b), Status::LLMRT_OK);
    assert_eq!(m.release(b), Status::LLMRT_UNKNOWN_CACHE);
    let d = m.fork(a);
    m.prefill(d, &f.tokens[..20]);
    m.prefill(a, &f.tokens[..20]);
}
