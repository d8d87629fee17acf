//! Reliability promises through the C entry points (docs/RELIABILITY.md):
//! - panics under an entry point become LLMRT_INTERNAL with the message; a panic in
//!   a step's compute rolls the step back (the model stays usable), a panic in the
//!   bookkeeping poisons the model (every later call: LLMRT_INTERNAL);
//! - KV pool exhaustion: LLMRT_OUT_OF_MEMORY with the sizes, release makes room;
//! - a model file truncated or rewritten after load: steps fail with LLMRT_IO, no
//!   SIGBUS (checked in a child process, so a signal shows as a signal exit);
//! - a model larger than the address-space limit (RLIMIT_AS, as `ulimit -v`) fails
//!   to load with LLMRT_OUT_OF_MEMORY, mapped or copied, without aborting (child).
mod common;
use common::*;
use llmrt::ffi::*;
use llmrt::runtime::DebugPanic;
use llmrt::Status;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture() -> Fixture {
    Fixture::all().into_iter().find(|f| f.name == "llama_gqa").expect("fixture llama_gqa")
}

/// A fresh temporary directory for this process and `what`.
fn temp_dir(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("llmrt-reliability-{}-{what}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Environment variable telling a re-executed test binary which child body to run.
const CHILD: &str = "LLMRT_RELIABILITY_CHILD";

/// Runs test `name` of this binary in a child process with `CHILD=name` and `env`;
/// fails unless the child exits 0 (a signal, e.g. SIGBUS = 7, is reported as such).
fn run_child(name: &str, env: &[(&str, &str)]) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"]).env(CHILD, name);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawn the test binary");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = out.status.signal() {
        panic!("child {name} killed by signal {sig} (SIGBUS is {}):\n{text}", libc::SIGBUS);
    }
    assert!(out.status.success(), "child {name} failed ({}):\n{text}", out.status);
    assert!(text.contains("child-ok"), "child {name} did not run its body:\n{text}");
    println!("child {name}:\n{text}");
}

fn is_child(name: &str) -> bool {
    std::env::var(CHILD).as_deref() == Ok(name)
}

// ---------------------------------------------------------------- panics

#[test]
fn panic_in_compute_is_internal_and_model_stays_usable() {
    let f = fixture();
    let m = load(&f.gguf("f32"));
    let (a, twin) = (m.reserve(64), m.reserve(64));
    m.prefill(a, &f.tokens[..13]);
    m.prefill(twin, &f.tokens[..13]);
    // A fork whose next write must copy its shared tail block first.
    let fork = m.fork(a);
    let fork_twin = m.reserve(64);
    m.prefill(fork_twin, &f.tokens[..13]);

    for (what, caches) in [("decode", vec![a]), ("fork decode", vec![fork])] {
        // SAFETY: m.ptr is a live model (M frees it only when dropped).
        unsafe { debug_panic_next_step(m.ptr, DebugPanic::Compute) };
        let mut out = vec![7.0f32; m.vocab];
        // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
        let s = unsafe { llmrt_decode(m.ptr, 1, caches.as_ptr(), [5].as_ptr(), out.as_mut_ptr()) };
        assert_eq!(s, Status::LLMRT_INTERNAL, "{what}");
        let e = last_error();
        assert!(e.contains("llmrt_decode") && e.contains("debug panic in a step's compute"), "{e}");
        assert!(e.contains("stays usable"), "{e}");
        assert!(out.iter().all(|&x| x == 7.0), "{what}: logits written by a panicked step");
        assert_eq!(m.len(caches[0]), 13, "{what}: length advanced by a panicked step");
    }
    // Prefill and greedy paths too.
    // SAFETY: m.ptr is a live model (M frees it only when dropped).
    unsafe { debug_panic_next_step(m.ptr, DebugPanic::Compute) };
    assert_eq!(m.try_prefill_all(a, &f.tokens[13..20]), Err(Status::LLMRT_INTERNAL));
    // SAFETY: m.ptr is a live model (M frees it only when dropped).
    unsafe { debug_panic_next_step(m.ptr, DebugPanic::Compute) };
    let mut next = [u32::MAX];
    // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
    let s = unsafe { llmrt_decode_greedy(m.ptr, 1, [a].as_ptr(), [5].as_ptr(), next.as_mut_ptr()) };
    assert_eq!(s, Status::LLMRT_INTERNAL);
    assert_eq!(next, [u32::MAX]);

    // The caches go on exactly like their untouched twins.
    assert_eq!(m.prefill_all(a, &f.tokens[13..20]), m.prefill_all(twin, &f.tokens[13..20]));
    assert_eq!(m.decode(&[fork], &[9]), m.decode(&[fork_twin], &[9]));
    assert_eq!(m.decode(&[a, fork], &[3, 4]), m.decode(&[twin, fork_twin], &[3, 4]));
    assert_eq!(m.len(a), 21);
}

#[test]
fn panic_in_bookkeeping_poisons_the_model() {
    let f = fixture();
    let m = load(&f.gguf("f32"));
    let a = m.reserve(64);
    m.prefill(a, &f.tokens[..4]);
    // SAFETY: m.ptr is a live model (M frees it only when dropped).
    unsafe { debug_panic_next_step(m.ptr, DebugPanic::Bookkeeping) };
    assert_eq!(m.try_decode(&[a], &[1]), Err(Status::LLMRT_INTERNAL));
    let e = last_error();
    assert!(e.contains("caught panic") && e.contains("debug panic in the bookkeeping"), "{e}");
    // Every later call on the model reports it unusable; freeing it still works.
    assert_eq!(m.try_decode(&[a], &[1]), Err(Status::LLMRT_INTERNAL));
    assert!(last_error().contains("model is unusable"), "{}", last_error());
    let mut c = 0;
    // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
    assert_eq!(unsafe { llmrt_cache_reserve(m.ptr, 16, &mut c) }, Status::LLMRT_INTERNAL);
    assert_eq!(c, 0);
    let mut n = 0;
    // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
    assert_eq!(unsafe { llmrt_cache_length(m.ptr, a, &mut n) }, Status::LLMRT_INTERNAL);
    assert_eq!(m.release(a), Status::LLMRT_INTERNAL);
    // Calls that do not touch the caches still answer.
    assert_eq!(m.info().vocab_size as usize, m.vocab);
    drop(m);
    // Other models are unaffected.
    let m2 = load(&f.gguf("f32"));
    let b = m2.reserve(16);
    m2.prefill(b, &f.tokens[..4]);
}

// ---------------------------------------------------------------- exhaustion

#[test]
fn kv_budget_filled_by_reserves_reports_sizes_and_release_makes_room() {
    let f = fixture();
    let probe = load(&f.gguf("f32"));
    let per_pos = probe.info().kv_bytes_per_position;
    drop(probe);
    let block = per_pos * 16;
    let m = try_load(&f.gguf("f32"), 1, block * 5 + block / 2).unwrap(); // 5 whole blocks
    let mut held = Vec::new();
    loop {
        let mut c = 0;
        // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
        let s = unsafe { llmrt_cache_reserve(m.ptr, 16, &mut c) };
        if s != Status::LLMRT_OK {
            assert_eq!(s, Status::LLMRT_OUT_OF_MEMORY);
            assert_eq!(c, 0, "out_cache written on failure");
            break;
        }
        held.push(c);
        assert!(held.len() <= 5, "reserved past the budget");
    }
    assert_eq!(held.len(), 5);
    let e = last_error();
    for want in [
        "llmrt_cache_reserve".to_string(),
        format!("16 positions need 1 blocks ({block} bytes)"),
        format!("0 of 5 blocks (0 of {} bytes) are free", block * 5),
    ] {
        assert!(e.contains(&want), "message lacks {want:?}: {e}");
    }
    // Reserved means usable: every held cache fills to its capacity.
    for &c in &held {
        m.prefill(c, &f.tokens[..16]);
    }
    // A bigger request names its own size.
    let mut c = 0;
    // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
    assert_eq!(unsafe { llmrt_cache_reserve(m.ptr, 40, &mut c) }, Status::LLMRT_OUT_OF_MEMORY);
    assert!(last_error().contains(&format!("40 positions need 3 blocks ({} bytes)", block * 3)), "{}", last_error());
    // Releasing one makes exactly one more fit.
    assert_eq!(m.release(held.pop().unwrap()), Status::LLMRT_OK);
    let again = m.reserve(16);
    m.prefill(again, &f.tokens[..16]);
    // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
    assert_eq!(unsafe { llmrt_cache_reserve(m.ptr, 1, &mut c) }, Status::LLMRT_OUT_OF_MEMORY);
    // Release everything: the whole budget is free again.
    for c in held.into_iter().chain([again]) {
        assert_eq!(m.release(c), Status::LLMRT_OK);
    }
    let big = m.reserve(80);
    m.prefill(big, &f.tokens[..20]);
}

/// VmSize of this process in bytes.
fn vm_size() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

const BIG_BYTES: u64 = 320 << 20;

/// The llama_gqa fixture plus an unused 320 MiB F32 tensor (sparse: its data is a
/// hole in the file, so the file costs no disk and no memory until read).
fn write_big_model(dir: &Path) -> PathBuf {
    use llmrt::format::gguf::Gguf;
    use llmrt::format::gguf_write::GgufWriter;
    let small = Gguf::open(&fixture().gguf("f32")).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in &small.metadata {
        w.kv(k, v.clone());
    }
    for t in &small.tensors {
        w.tensor_raw(&t.name, &t.ne, t.ggml_type, small.tensor_data(t).to_vec());
    }
    // Declared last with no bytes written; the file is then extended past its end.
    w.tensor_raw("zz_padding.weight", &[BIG_BYTES / 4], 0, Vec::new());
    let path = dir.join("big.gguf");
    w.write(&path).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len.next_multiple_of(64) + BIG_BYTES).unwrap();
    path
}

#[test]
fn model_larger_than_address_space_limit_fails_to_load_cleanly() {
    if is_child("model_larger_than_address_space_limit_fails_to_load_cleanly") {
        let path = PathBuf::from(std::env::var("LLMRT_BIG_MODEL").unwrap());
        let limit = vm_size() + (160 << 20);
        let rl = libc::rlimit { rlim_cur: limit, rlim_max: libc::RLIM_INFINITY };
        // SAFETY: setrlimit only reads the rlimit passed by reference.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) }, 0);
        // The small model still loads and runs under the limit.
        let small = try_load(&fixture().gguf("f32"), 1, 1 << 20).unwrap();
        let c = small.reserve(16);
        small.prefill(c, &fixture().tokens[..8]);
        let size = std::fs::metadata(&path).unwrap().len().to_string();
        for copy in [false, true] {
            // SAFETY (edition 2021): the child runs this one test on one thread.
            if copy {
                std::env::set_var("LLMRT_LOAD_COPY", "1");
            } else {
                std::env::remove_var("LLMRT_LOAD_COPY");
            }
            let (s, e) = try_load(&path, 1, 1 << 20).err().expect("a model past RLIMIT_AS loaded");
            assert_eq!(s, Status::LLMRT_OUT_OF_MEMORY, "copy={copy}: {e}");
            assert!(e.contains("big.gguf") && e.contains(&size), "copy={copy}: message lacks file or size: {e}");
            println!("copy={copy}: {s:?}: {e}");
        }
        std::env::remove_var("LLMRT_LOAD_COPY");
        // The process is still fine.
        small.prefill(c, &fixture().tokens[8..12]);
        println!("child-ok");
        return;
    }
    let dir = temp_dir("big");
    let path = write_big_model(&dir);
    // Without a limit the big model loads (so the child's failure is the limit's doing).
    let m = try_load(&path, 1, 1 << 20).unwrap_or_else(|(s, e)| panic!("{s:?} {e}"));
    drop(m);
    run_child(
        "model_larger_than_address_space_limit_fails_to_load_cleanly",
        &[("LLMRT_BIG_MODEL", path.to_str().unwrap())],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------- files changing under a mapping

/// Child body: loads a private copy of the fixture, changes the file as `how`
/// says, then steps. Mapped: LLMRT_IO, no SIGBUS. With LLMRT_LOAD_COPY=1: the
/// steps go on with the same logits as an untouched model.
fn file_change_child(how: &str) {
    let f = fixture();
    let dir = temp_dir(how);
    let path = dir.join("model.gguf");
    std::fs::copy(f.gguf("f32"), &path).unwrap();
    let copy = std::env::var("LLMRT_LOAD_COPY").as_deref() == Ok("1");
    let m = try_load(&path, 1, 0).unwrap();
    let (a, b) = (m.reserve(64), m.reserve(64));
    m.prefill(a, &f.tokens[..8]);
    let want = {
        let r = load(&f.gguf("f32"));
        let c = r.reserve(64);
        r.prefill(c, &f.tokens[..8]);
        r.prefill(c, &f.tokens[8..16])
    };
    std::thread::sleep(std::time::Duration::from_millis(20)); // a later mtime tick
    let len = std::fs::metadata(&path).unwrap().len();
    match how {
        // Shrunk by another writer (the pages past the new end would SIGBUS).
        "truncate" => std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(4096).unwrap(),
        // Rewritten in place, same size, different bytes.
        "rewrite" => {
            use std::io::{Seek, SeekFrom, Write};
            let mut w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            w.seek(SeekFrom::Start(len / 2)).unwrap();
            w.write_all(&vec![0xffu8; (len / 4) as usize]).unwrap();
            w.sync_all().unwrap();
        }
        _ => unreachable!(),
    }
    if copy {
        assert_eq!(m.prefill(a, &f.tokens[8..16]), want, "owned copy: logits changed after the file did");
        m.prefill(b, &f.tokens[..4]);
    } else {
        for c in [a, b, a] {
            let mut out = vec![7.0f32; m.vocab];
            // SAFETY: a live model (freed only on drop); every array is a live local of the length passed (NULL only with length 0).
            let s = unsafe { llmrt_prefill(m.ptr, c, f.tokens[8..16].as_ptr(), 8, out.as_mut_ptr()) };
            assert_eq!(s, Status::LLMRT_IO, "{}", last_error());
            let e = last_error();
            assert!(e.contains("model file changed since load") && e.contains("model.gguf"), "{e}");
            if how == "truncate" {
                assert!(e.contains(&format!("size {len} -> 4096 bytes")), "{e}");
            }
            assert!(out.iter().all(|&x| x == 7.0));
        }
        assert_eq!(m.len(a), 8);
        // Bookkeeping still answers; the caches can be released, the model freed.
        assert_eq!(m.truncate(a, 2), Status::LLMRT_OK);
        assert_eq!(m.release(a), Status::LLMRT_OK);
        assert_eq!(m.release(b), Status::LLMRT_OK);
    }
    drop(m);
    std::fs::remove_dir_all(&dir).unwrap();
    println!("child-ok");
}

#[test]
fn mapped_file_truncated_after_load_fails_steps_without_sigbus() {
    if is_child("mapped_file_truncated_after_load_fails_steps_without_sigbus") {
        return file_change_child("truncate");
    }
    run_child("mapped_file_truncated_after_load_fails_steps_without_sigbus", &[("LLMRT_LOAD_COPY", "0")]);
}

#[test]
fn mapped_file_rewritten_after_load_fails_steps() {
    if is_child("mapped_file_rewritten_after_load_fails_steps") {
        return file_change_child("rewrite");
    }
    run_child("mapped_file_rewritten_after_load_fails_steps", &[("LLMRT_LOAD_COPY", "0")]);
}

#[test]
fn owned_copy_is_immune_to_file_changes() {
    if is_child("owned_copy_is_immune_to_file_changes") {
        file_change_child("truncate");
        return file_change_child("rewrite");
    }
    run_child("owned_copy_is_immune_to_file_changes", &[("LLMRT_LOAD_COPY", "1")]);
}
