//! Concurrency stress through the C entry points: 8 threads share one model, each
//! running its own fixed-seed random sequence of reserve / prefill / prefill_all /
//! decode (batched over its caches) / decode_greedy / fork / truncate / release,
//! plus calls that must fail (released cache, context full). Every result (logits
//! rows bit for bit, greedy ids, statuses, lengths) is recorded; then each thread's
//! sequence is replayed alone on a fresh model and must give the same record. A
//! watchdog fails the test when the threads do not finish in time (deadlock).
//!
//! `LLMRT_STRESS_OPS` (default 250) sets the operations per thread; `make tsan`
//! runs this test under ThreadSanitizer.
mod common;
use common::*;
use llmrt::ffi::*;
use llmrt::util::XorShift;
use llmrt::Status;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const THREADS: usize = 8;
const MAX_CACHES: usize = 4;
const SEED: u64 = 0x5eed_2024;

/// What one operation gave: statuses, lengths, logits bits, ids.
#[derive(Debug, PartialEq, Eq)]
enum Rec {
    Status(&'static str, Status),
    Len(u32),
    Logits(Vec<u32>),
    Ids(Vec<u32>),
}

struct Cache {
    id: u64,
    len: u32,
    cap: u32,
}

/// A model handle shared by threads: the C API promises any thread may call.
struct Shared(*mut llmrt_model, usize);
// SAFETY: the C API lets any thread call on a model (calls on one model are serialised inside the library).
unsafe impl Sync for Shared {}
// SAFETY: the C API lets any thread call on a model (calls on one model are serialised inside the library).
unsafe impl Send for Shared {}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Runs thread `t`'s operation sequence on `m`; only its own caches are touched.
fn run_sequence(m: &Shared, t: usize, ops: usize, vocab_tokens: u32) -> Vec<Rec> {
    let (model, vocab) = (m.0, m.1);
    let mut rng = XorShift::new(SEED ^ (t as u64).wrapping_mul(0x1234_5678_9abc_def1));
    let mut caches: Vec<Cache> = Vec::new();
    let mut dead: Vec<u64> = Vec::new();
    let mut rec = Vec::new();
    let tok = |rng: &mut XorShift| rng.below(vocab_tokens as usize) as u32;
    for _ in 0..ops {
        let op = rng.below(100);
        if caches.is_empty() || (op < 12 && caches.len() < MAX_CACHES) {
            let cap = 16 + rng.below(49) as u32;
            let mut id = 0;
            // SAFETY: model stays live until every thread has joined; arrays are live locals of the lengths passed.
            let s = unsafe { llmrt_cache_reserve(model, cap, &mut id) };
            rec.push(Rec::Status("reserve", s));
            assert_eq!(s, Status::LLMRT_OK, "reserve: {}", last_error());
            caches.push(Cache { id, len: 0, cap });
            continue;
        }
        let i = rng.below(caches.len());
        match op {
            // prefill (last row) or prefill_all, within or (rarely) past capacity
            0..=29 => {
                let room = (caches[i].cap - caches[i].len) as usize;
                let over = rng.below(10) == 0;
                let n = if over {
                    room + 1
                } else if room == 0 {
                    continue;
                } else {
                    1 + rng.below(room.min(8))
                };
                let toks: Vec<u32> = (0..n).map(|_| tok(&mut rng)).collect();
                let all = rng.below(2) == 0;
                let rows = if all { n } else { 1 };
                let mut out = vec![f32::NAN; rows * vocab];
                let c = caches[i].id;
                // SAFETY: model stays live until every thread has joined; arrays are live locals of the lengths passed.
                let s = unsafe {
                    if all {
                        llmrt_prefill_all(model, c, toks.as_ptr(), n, out.as_mut_ptr())
                    } else {
                        llmrt_prefill(model, c, toks.as_ptr(), n, out.as_mut_ptr())
                    }
                };
                rec.push(Rec::Status("prefill", s));
                if over {
                    assert_eq!(s, Status::LLMRT_CONTEXT_FULL, "{}", last_error());
                } else {
                    assert_eq!(s, Status::LLMRT_OK, "prefill: {}", last_error());
                    caches[i].len += n as u32;
                    rec.push(Rec::Logits(bits(&out)));
                }
            }
            // batched decode over a random subset of this thread's caches with room
            30..=64 => {
                let mut batch: Vec<usize> =
                    (0..caches.len()).filter(|&j| caches[j].len < caches[j].cap && rng.below(3) != 0).collect();
                if batch.is_empty() {
                    continue;
                }
                // shuffle the order (a batch's rows follow the order given)
                for k in (1..batch.len()).rev() {
                    batch.swap(k, rng.below(k + 1));
                }
                let ids: Vec<u64> = batch.iter().map(|&j| caches[j].id).collect();
                let toks: Vec<u32> = batch.iter().map(|_| tok(&mut rng)).collect();
                if op <= 54 {
                    // 30..=54: decode with logits; 55..=64: decode_greedy
                    let mut out = vec![f32::NAN; ids.len() * vocab];
                    // SAFETY: model stays live until every thread has joined; arrays are live locals of the lengths passed.
                    let s = unsafe { llmrt_decode(model, ids.len(), ids.as_ptr(), toks.as_ptr(), out.as_mut_ptr()) };
                    rec.push(Rec::Status("decode", s));
                    assert_eq!(s, Status::LLMRT_OK, "decode: {}", last_error());
                    rec.push(Rec::Logits(bits(&out)));
                } else {
                    let mut out = vec![u32::MAX; ids.len()];
                    let s =
                        // SAFETY: model stays live until every thread has joined; arrays are live locals of the lengths passed.
                        unsafe { llmrt_decode_greedy(model, ids.len(), ids.as_ptr(), toks.as_ptr(), out.as_mut_ptr()) };
                    rec.push(Rec::Status("decode_greedy", s));
                    assert_eq!(s, Status::LLMRT_OK, "decode_greedy: {}", last_error());
                    rec.push(Rec::Ids(out));
                }
                for &j in &batch {
                    caches[j].len += 1;
                }
            }
            65..=74 if caches.len() < MAX_CACHES => {
                let mut id = 0;
                // SAFETY: model stays live until every thread has joined; arrays are live locals of the lengths passed.
                let s = unsafe { llmrt_cache_fork(model, caches[i].id, &mut id) };
                rec.push(Rec::Status("fork", s));
                assert_eq!(s, Status::LLMRT_OK, "fork: {}", last_error());
                let (len, cap) = (caches[i].len, caches[i].cap);
                caches.push(Cache { id, len, cap });
            }
            75..=86 => {
                let keep = rng.below(caches[i].len as usize + 1) as u32;
                // SAFETY: model stays live until every thread has joined; arrays are live locals of the lengths passed.
                let s = unsafe { llmrt_cache_truncate(model, caches[i].id, keep) };
                rec.push(Rec::Status("truncate", s));
                assert_eq!(s, Status::LLMRT_OK, "truncate: {}", last_error());
                caches[i].len = keep;
            }
            87..=94 => {
                let c = caches.swap_remove(i);
                // SAFETY: model stays live until every thread has joined; arrays are live locals of the lengths passed.
                let s = unsafe { llmrt_cache_release(model, c.id) };
                rec.push(Rec::Status("release", s));
                assert_eq!(s, Status::LLMRT_OK, "release: {}", last_error());
                dead.push(c.id);
            }
            _ => {
                // A released cache is unknown, alone or in a batch, and nothing advances.
                if let (Some(&d), true) = (dead.last(), caches[i].len < caches[i].cap) {
                    let ids = [caches[i].id, d];
                    let mut out = vec![7.0f32; 2 * vocab];
                    // SAFETY: model stays live until every thread has joined; arrays are live locals of the lengths passed.
                    let s = unsafe { llmrt_decode(model, 2, ids.as_ptr(), [1, 2].as_ptr(), out.as_mut_ptr()) };
                    rec.push(Rec::Status("decode_dead", s));
                    assert_eq!(s, Status::LLMRT_UNKNOWN_CACHE, "{}", last_error());
                    assert!(out.iter().all(|&x| x == 7.0));
                }
            }
        }
        // The library's view of every cache of this thread matches ours.
        for c in &caches {
            let mut n = u32::MAX;
            // SAFETY: model stays live until every thread has joined; arrays are live locals of the lengths passed.
            let s = unsafe { llmrt_cache_length(model, c.id, &mut n) };
            assert_eq!(s, Status::LLMRT_OK, "length: {}", last_error());
            assert_eq!(n, c.len, "cache length");
        }
        rec.push(Rec::Len(caches.iter().map(|c| c.len).sum()));
    }
    for c in caches {
        // SAFETY: model stays live until every thread has joined; arrays are live locals of the lengths passed.
        assert_eq!(unsafe { llmrt_cache_release(model, c.id) }, Status::LLMRT_OK);
    }
    rec
}

fn fixture_path() -> std::path::PathBuf {
    Fixture::all().into_iter().find(|f| f.name == "llama_gqa").expect("fixture llama_gqa").gguf("f32")
}

#[test]
fn eight_threads_match_sequential_replay() {
    let ops: usize = std::env::var("LLMRT_STRESS_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(250);
    let limit =
        Duration::from_secs(std::env::var("LLMRT_STRESS_TIMEOUT_S").ok().and_then(|v| v.parse().ok()).unwrap_or(300));
    let path = fixture_path();
    let m = load(&path);
    let vocab = m.vocab;
    let shared = std::sync::Arc::new(Shared(m.ptr, vocab));
    let start = Instant::now();

    // Concurrent run; the watchdog is the receive timeout.
    let (tx, rx) = mpsc::channel();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(THREADS));
    for t in 0..THREADS {
        let (tx, shared, barrier) = (tx.clone(), shared.clone(), barrier.clone());
        std::thread::spawn(move || {
            barrier.wait();
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_sequence(&shared, t, ops, vocab as u32)));
            let _ = tx.send((t, r));
        });
    }
    drop(tx);
    let mut concurrent: Vec<Option<Vec<Rec>>> = (0..THREADS).map(|_| None).collect();
    for _ in 0..THREADS {
        let left = limit.saturating_sub(start.elapsed());
        match rx.recv_timeout(left) {
            Ok((t, Ok(r))) => concurrent[t] = Some(r),
            Ok((t, Err(p))) => {
                std::panic::resume_unwind(Box::new(format!("thread {t} failed: {:?}", p.downcast_ref::<String>())))
            }
            Err(_) => {
                // Deadlock (or far too slow): fail now, do not wait for the threads.
                eprintln!("stress: threads did not finish within {limit:?}: deadlock?");
                std::process::exit(3);
            }
        }
    }
    let concurrent_time = start.elapsed();
    let mut ids_left = 0;
    // SAFETY: model stays live until every thread has joined; arrays are live locals of the lengths passed.
    let s = unsafe { llmrt_cache_reserve(m.ptr, 1, &mut ids_left) };
    assert_eq!(s, Status::LLMRT_OK);
    assert_eq!(m.release(ids_left), Status::LLMRT_OK);
    drop(shared);
    drop(m);

    // Sequential replay, one fresh model per thread.
    let mut steps = 0;
    for (t, got) in concurrent.into_iter().enumerate() {
        let got = got.unwrap();
        let fresh = load(&path);
        let want = run_sequence(&Shared(fresh.ptr, fresh.vocab), t, ops, vocab as u32);
        assert_eq!(got.len(), want.len(), "thread {t}: record length");
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g == w, "thread {t}: record {k} differs between the concurrent run and the sequential replay");
        }
        steps += got.iter().filter(|r| matches!(r, Rec::Logits(_) | Rec::Ids(_))).count();
    }
    eprintln!(
        "stress: {THREADS} threads x {ops} ops ({steps} steps with results) concurrently in {:.2?}, \
         all equal to the sequential replay",
        concurrent_time
    );
}
