//! A step is all or nothing, also under concurrent use and memory limits
//! (docs/RELIABILITY.md):
//! - `decode_sample` runs the step and the draws under one lock: a cache of the batch
//!   released by another thread at any moment either fails the whole call with every
//!   cache as it was, or the call succeeds (it used to commit the step, unlock, and fail
//!   the draw with `LLMRT_UNKNOWN_CACHE` after the other caches had advanced);
//! - `decode_sample` validates the batch before allocating logits for it: 2^20 unknown
//!   cache ids under an address-space limit return `LLMRT_UNKNOWN_CACHE` (they used to
//!   allocate n x vocab floats first and abort), checked in a child process.
use llmrt::sample::SamplerParams;
use llmrt::{LoadOptions, Model, Status};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Barrier};

fn model_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama_gqa/llama_gqa.f32.gguf")
}

fn load() -> Model {
    Model::load(&model_path(), LoadOptions { threads: 1, ..LoadOptions::default() }).expect("load llama_gqa")
}

#[test]
fn decode_sample_is_atomic_against_a_concurrent_release() {
    let m = Arc::new(load());
    let params = SamplerParams { seed: 7, ..SamplerParams::default() };
    // How long one such call takes, so the releases can be spread across it.
    let probe = m.cache_reserve(64).unwrap();
    m.prefill(probe, &[1, 5, 9], None, false).unwrap();
    let t0 = std::time::Instant::now();
    m.decode_sample(&[probe], &[3], &params, &mut [0u32]).unwrap();
    let step = t0.elapsed().max(std::time::Duration::from_micros(20));
    m.cache_release(probe).unwrap();
    let (mut failed, mut succeeded) = (0, 0);
    let rounds = 400u32;
    for i in 0..rounds {
        let a = m.cache_reserve(64).unwrap();
        let b = m.cache_reserve(64).unwrap();
        m.prefill(a, &[1, 5, 9], None, false).unwrap();
        m.prefill(b, &[1, 7], None, false).unwrap();
        let go = Arc::new(Barrier::new(2));
        let (m2, go2) = (m.clone(), go.clone());
        // The release lands before, during or after the step, varying with i
        // (from 0 to 1.5 step durations after the start).
        let delay = step.mul_f64(1.5 * (i % 40) as f64 / 40.0);
        let releaser = std::thread::spawn(move || {
            go2.wait();
            let t = std::time::Instant::now();
            while t.elapsed() < delay {
                std::hint::spin_loop();
            }
            m2.cache_release(b)
        });
        go.wait();
        let mut next = [0u32; 2];
        let r = m.decode_sample(&[a, b], &[3, 4], &params, &mut next);
        releaser.join().unwrap().unwrap();
        let len_a = m.cache_length(a).unwrap();
        match r {
            Ok(()) => {
                succeeded += 1;
                assert_eq!(len_a, 4, "iteration {i}: success must advance cache a");
            }
            Err(e) => {
                failed += 1;
                assert_eq!(e.status, Status::LLMRT_UNKNOWN_CACHE, "iteration {i}: {}", e.message);
                assert_eq!(len_a, 3, "iteration {i}: a failed decode_sample advanced cache a ({})", e.message);
                assert_eq!(m.cache_tokens(a).unwrap(), vec![1, 5, 9]);
            }
        }
        m.cache_release(a).unwrap();
    }
    println!("decode_sample vs release: {succeeded} succeeded, {failed} failed cleanly");
}

#[test]
fn decode_sample_after_success_matches_decode_then_sample() {
    // The draw sees the same history and position as before the change: the step's
    // token appended, the position the cache's new length.
    let m = load();
    let params = SamplerParams { seed: 11, temperature: 0.9, ..SamplerParams::default() };
    let (a, b) = (m.cache_reserve(32).unwrap(), m.cache_reserve(32).unwrap());
    for c in [a, b] {
        m.prefill(c, &[1, 20, 30, 40], None, false).unwrap();
    }
    let mut next = [0u32];
    m.decode_sample(&[a], &[50], &params, &mut next).unwrap();
    let v = m.info().vocab_size as usize;
    let mut logits = vec![0f32; v];
    m.decode(&[b], &[50], Some(&mut logits)).unwrap();
    let want = llmrt::sample::sample(&logits, &params, &m.cache_tokens(b).unwrap(), m.cache_length(b).unwrap() as u64);
    assert_eq!(next[0], want);
}

const CHILD: &str = "LLMRT_STEPS_ATOMIC_CHILD";

fn vm_size() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
fn decode_sample_with_a_million_unknown_caches_fails_without_allocating() {
    let name = "decode_sample_with_a_million_unknown_caches_fails_without_allocating";
    if std::env::var(CHILD).as_deref() == Ok(name) {
        let m = load();
        let n = 1usize << 20;
        // 2^20 x 384 floats would be 1.6 GB; the limit leaves 512 MiB.
        let rl = libc::rlimit { rlim_cur: vm_size() + (512 << 20), rlim_max: libc::RLIM_INFINITY };
        // SAFETY: setrlimit reads one initialised struct.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) }, 0);
        let caches: Vec<u64> = (0..n as u64).map(|i| 1_000_000 + i).collect();
        let tokens = vec![1u32; n];
        let mut next = vec![0u32; n];
        let e = m.decode_sample(&caches, &tokens, &SamplerParams::default(), &mut next).unwrap_err();
        assert_eq!(e.status, Status::LLMRT_UNKNOWN_CACHE, "{}", e.message);
        println!("child-ok: {}", e.message);
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, name)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("child-ok"), "child failed ({}):\n{text}", out.status);
}
