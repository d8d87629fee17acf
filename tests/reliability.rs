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
    for (k, v) in &small.metadata() {
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

// ---------------------------------------------------------------- non-regular files in a model directory

/// A Hugging Face directory whose tokenizer file `name` is a FIFO (the other files
/// are symlinks to the llama_gqa fixture's): the load fails with LLMRT_IO naming the
/// file instead of blocking in open(2) until a writer appears. The load runs on a
/// thread with a timeout, so a regression fails the test rather than hanging it.
fn fifo_tokenizer_fails_to_load(name: &str) {
    let src = fixtures().join("llama_gqa/hf").canonicalize().unwrap();
    let dir = temp_dir(&format!("fifo-{name}"));
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        if e.file_name() != "tokenizer.model" {
            std::os::unix::fs::symlink(e.path(), dir.join(e.file_name())).unwrap();
        }
    }
    let fifo = dir.join(name);
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: c is a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let (tx, rx) = std::sync::mpsc::channel();
    let d = dir.clone();
    std::thread::spawn(move || {
        let r = try_load(&d, 1, 0).map(|_| ());
        let _ = tx.send(r);
    });
    let r = match rx.recv_timeout(std::time::Duration::from_secs(20)) {
        Ok(r) => r,
        Err(_) => {
            // Unblock the loader (it is waiting in open for a writer) before failing.
            let _ = std::fs::OpenOptions::new().write(true).custom_flags_nonblock().open(&fifo);
            panic!("loading a directory whose {name} is a FIFO hung for 20 s");
        }
    };
    let (s, e) = r.expect_err("a FIFO tokenizer loaded");
    assert_eq!(s, Status::LLMRT_IO, "{e}");
    assert!(e.contains(name) && e.contains("not a regular file"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

trait NonBlock {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}
impl NonBlock for std::fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NONBLOCK)
    }
}

#[test]
fn tokenizer_json_that_is_a_fifo_is_io_not_a_hang() {
    fifo_tokenizer_fails_to_load("tokenizer.json");
}

#[test]
fn tokenizer_model_that_is_a_fifo_is_io_not_a_hang() {
    fifo_tokenizer_fails_to_load("tokenizer.model");
}

// ---------------------------------------------------------------- memory limits on untrusted input

/// Sets RLIMIT_AS (soft) to `bytes` (the hard limit stays, so it can be lifted again).
fn limit_address_space(bytes: u64) {
    let rl = libc::rlimit { rlim_cur: bytes, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: setrlimit only reads the rlimit passed by reference.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) }, 0);
}

const BIG_ARRAY: u64 = 1 << 24;

/// A 16 MiB GGUF (no tensors) whose one metadata entry "big" is a U8 array of
/// 2^24 elements (element i = i mod 251), written byte by byte (the writer's
/// owned values would themselves cost 512 MiB).
fn write_big_array_gguf(path: &Path) {
    let mut b = Vec::with_capacity(BIG_ARRAY as usize + 64);
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes()); // tensors
    b.extend_from_slice(&1u64.to_le_bytes()); // metadata entries
    b.extend_from_slice(&3u64.to_le_bytes());
    b.extend_from_slice(b"big");
    b.extend_from_slice(&9u32.to_le_bytes()); // ARRAY
    b.extend_from_slice(&0u32.to_le_bytes()); // of U8
    b.extend_from_slice(&BIG_ARRAY.to_le_bytes());
    b.extend((0..BIG_ARRAY).map(|i| (i % 251) as u8));
    std::fs::write(path, b).unwrap();
}

#[test]
fn gguf_with_a_16m_element_array_loads_under_a_modest_address_space_limit() {
    let name = "gguf_with_a_16m_element_array_loads_under_a_modest_address_space_limit";
    if is_child(name) {
        let path = PathBuf::from(std::env::var("LLMRT_BIG_MODEL").unwrap());
        let len = std::fs::metadata(&path).unwrap().len();
        // The mapping of the file plus 48 MiB: the old reader's 32 bytes per element
        // (512 MiB) aborted here.
        limit_address_space(vm_size() + len + (48 << 20));
        let g = llmrt::format::gguf::Gguf::open(&path).unwrap_or_else(|e| panic!("{}", e.message));
        check_big_array(&g);
        drop(g);
        println!("child-ok");
        return;
    }
    let dir = temp_dir("bigarray");
    let path = dir.join("big-array.gguf");
    write_big_array_gguf(&path);
    run_child(name, &[("LLMRT_BIG_MODEL", path.to_str().unwrap())]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tokenizing_a_4mib_prompt_under_a_tight_limit_is_out_of_memory() {
    let name = "tokenizing_a_4mib_prompt_under_a_tight_limit_is_out_of_memory";
    if is_child(name) {
        let m = load(&fixture().gguf("f32"));
        let text = "Hello world, this is a test of a long prompt. ".repeat((4 << 20) / 47 + 1);
        let mut ids = vec![0u32; text.len() + 2];
        limit_address_space(vm_size() + (48 << 20));
        for cap in [0, ids.len()] {
            let mut n = 0usize;
            // SAFETY: a live model; text and ids are live locals of the lengths passed.
            let s =
                unsafe { llmrt_tokenize(m.ptr, text.as_ptr().cast(), text.len(), true, ids.as_mut_ptr(), cap, &mut n) };
            let e = last_error();
            assert_eq!(s, Status::LLMRT_OUT_OF_MEMORY, "capacity {cap}: {e}");
            assert!(e.contains("bytes") && e.contains("tokeniz"), "message lacks what and how much: {e}");
            println!("capacity {cap}: {s:?}: {e}");
        }
        limit_address_space(libc::RLIM_INFINITY);
        let mut n = 0usize;
        let short = "Hello world";
        // SAFETY: as above.
        let s = unsafe {
            llmrt_tokenize(m.ptr, short.as_ptr().cast(), short.len(), true, ids.as_mut_ptr(), ids.len(), &mut n)
        };
        assert_eq!(s, Status::LLMRT_OK, "{}", last_error());
        assert!(n > 1);
        println!("child-ok");
        return;
    }
    run_child(name, &[]);
}

// ---------------------------------------------------------------- the error slot at thread exit

static DTOR_STATUS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(-1);
static DTOR_ERROR_OK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn key_destructor(_: *mut libc::c_void) {
    // SAFETY: NULL arguments are allowed (each is reported as LLMRT_INVALID_ARGUMENT).
    let s = unsafe { llmrt_model_load(std::ptr::null(), std::ptr::null(), std::ptr::null_mut()) };
    DTOR_STATUS.store(s as i64, std::sync::atomic::Ordering::SeqCst);
    let e = llmrt_last_error();
    DTOR_ERROR_OK.store(!e.is_null(), std::sync::atomic::Ordering::SeqCst);
}

#[test]
fn llmrt_calls_from_a_thread_exit_destructor_do_not_abort() {
    let name = "llmrt_calls_from_a_thread_exit_destructor_do_not_abort";
    if is_child(name) {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: key is a local out-parameter; the destructor is an extern "C" fn.
        assert_eq!(unsafe { libc::pthread_key_create(&mut key, Some(key_destructor)) }, 0);
        std::thread::spawn(move || {
            // An error in this thread first, so its error slot exists and is torn down
            // (before pthread key destructors run) when the thread exits.
            // SAFETY: NULL arguments are allowed.
            let s = unsafe { llmrt_model_load(std::ptr::null(), std::ptr::null(), std::ptr::null_mut()) };
            assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT);
            assert!(last_error().contains("NULL"));
            // SAFETY: a non-null marker value; the key is live.
            assert_eq!(unsafe { libc::pthread_setspecific(key, std::ptr::dangling::<libc::c_void>()) }, 0);
        })
        .join()
        .unwrap();
        assert_eq!(DTOR_STATUS.load(std::sync::atomic::Ordering::SeqCst), Status::LLMRT_INVALID_ARGUMENT as i64);
        assert!(DTOR_ERROR_OK.load(std::sync::atomic::Ordering::SeqCst), "llmrt_last_error returned NULL");
        println!("child-ok");
        return;
    }
    run_child(name, &[]);
}

// ---------------------------------------------------------------- truncation during a step (SIGBUS)

/// Child body: 40 or more rounds of: load a private copy of the fixture (mapped), run
/// steps back to back on two caches while another thread truncates the file at a
/// random moment. Every step must return OK or LLMRT_IO; a failed step writes no
/// logits and advances no cache; after the first LLMRT_IO every later step fails
/// too. The process must never die of SIGBUS.
fn truncate_during_steps_child() {
    let f = fixture();
    let dir = temp_dir("trunc-loop");
    let path = dir.join("model.gguf");
    let mut rng = llmrt::util::XorShift::new(7);
    let (mut n_io, mut n_ok) = (0, 0);
    // At least 40 rounds, and more (up to 400) until a truncation has landed
    // inside a running step at least once.
    for round in 0..400 {
        if round >= 40 && llmrt::format::sigbus::faults_handled() > 0 {
            break;
        }
        std::fs::copy(f.gguf("f32"), &path).unwrap();
        let m = try_load(&path, 1, 0).unwrap();
        let (a, b) = (m.reserve(0), m.reserve(0));
        m.prefill(a, &f.tokens[..4]);
        let delay = std::time::Duration::from_micros(rng.next_u64() % 3000);
        let p = path.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(delay);
            std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(4096).unwrap();
        });
        let mut failed = false;
        // Steps run until the truncating thread has finished and one more step
        // ran after that: that step must see the shorter file. (A fixed number
        // of steps raced the thread's wake-up on a loaded machine.)
        for step in 0usize.. {
            let truncated = t.is_finished();
            let c = if step % 2 == 0 { a } else { b };
            if m.len(c) as usize + 2 > m.ctx as usize {
                assert_eq!(m.truncate(c, 4), Status::LLMRT_OK);
            }
            let (la, lb) = (m.len(a), m.len(b));
            let toks = &f.tokens[step % 8..step % 8 + 2];
            let mut out = vec![7.0f32; m.vocab];
            // SAFETY: a live model; toks and out are live locals of the lengths passed.
            let s = unsafe { llmrt_prefill(m.ptr, c, toks.as_ptr(), 2, out.as_mut_ptr()) };
            match s {
                Status::LLMRT_OK => {
                    assert!(!failed, "round {round}: a step succeeded after LLMRT_IO");
                    assert!(!truncated, "round {round} step {step}: a step after the truncation returned OK");
                    n_ok += 1;
                }
                Status::LLMRT_IO => {
                    let e = last_error();
                    assert!(e.contains("model.gguf"), "{e}");
                    assert!(out.iter().all(|&x| x == 7.0), "round {round}: a failed step wrote logits");
                    assert_eq!((m.len(a), m.len(b)), (la, lb), "round {round}: a failed step advanced a cache");
                    failed = true;
                    n_io += 1;
                }
                other => panic!("round {round} step {step}: {other:?} {}", last_error()),
            }
            if truncated {
                break;
            }
        }
        t.join().unwrap();
        assert!(failed, "round {round}: the truncation was never reported");
        drop(m);
    }
    std::fs::remove_dir_all(&dir).unwrap();
    let faults = llmrt::format::sigbus::faults_handled();
    println!("steps ok {n_ok}, io {n_io}, SIGBUS faults turned into zero pages: {faults}");
    // The truncations landed inside steps often enough to exercise the handler
    // (else this test would only re-check the before-step size check).
    assert!(faults > 0, "no truncation hit a running step in 400 rounds");
    println!("child-ok");
}

#[test]
fn mapped_file_truncated_during_steps_is_io_never_sigbus() {
    let name = "mapped_file_truncated_during_steps_is_io_never_sigbus";
    if is_child(name) {
        return truncate_during_steps_child();
    }
    run_child(name, &[("LLMRT_LOAD_COPY", "0")]);
}

/// The big array reads back element by element from the view of the file.
fn check_big_array(g: &llmrt::format::gguf::Gguf) {
    use llmrt::format::gguf::ValueRef;
    assert_eq!(g.n_metadata(), 1);
    let Some(ValueRef::Array(a)) = g.get("big") else { panic!("'big' is not an array") };
    assert_eq!((a.len() as u64, a.elem_type_name()), (BIG_ARRAY, "U8"));
    let mut n = 0u64;
    for (i, v) in a.iter().enumerate() {
        assert!(matches!(v, ValueRef::U8(x) if x as usize == i % 251), "element {i} is {v:?}");
        n += 1;
    }
    assert_eq!(n, BIG_ARRAY);
    assert!(a.get(BIG_ARRAY as usize).is_none());
}

// ---------------------------------------------------------------- worker threads

#[test]
fn threads_above_the_maximum_is_invalid_argument_naming_the_limit() {
    let f = fixture();
    // UINT32_MAX used to allocate 103 GB of thread handles and abort.
    for threads in [u32::MAX, 100_000, llmrt::runtime::MAX_THREADS + 1] {
        let (s, e) = try_load(&f.gguf("f32"), threads, 0).err().expect("a model loaded with too many threads");
        assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT, "{e}");
        assert!(e.contains("llmrt_model_load") && e.contains(&format!("threads = {threads}")), "{e}");
        assert!(e.contains("1024"), "message lacks the limit: {e}");
    }
    // A count within the limit starts its workers, and they go away with the model.
    let before = thread_count();
    let m = try_load(&f.gguf("f32"), 64, 0).unwrap_or_else(|(s, e)| panic!("{s:?} {e}"));
    let c = m.reserve(16);
    m.prefill(c, &f.tokens[..4]);
    drop(m);
    wait_for_threads(before);
}

/// Threads of this process.
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Waits (up to 10 s) until this process has `n` threads or fewer: a joined thread's
/// entry can outlive its join by a moment.
fn wait_for_threads(n: usize) {
    let t0 = std::time::Instant::now();
    while thread_count() > n {
        assert!(t0.elapsed().as_secs() < 10, "{} threads, {n} before: workers were left running", thread_count());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn worker_spawn_failure_is_out_of_memory_and_stops_the_started_workers() {
    let name = "worker_spawn_failure_is_out_of_memory_and_stops_the_started_workers";
    if is_child(name) {
        let f = fixture();
        let path = f.gguf("f32");
        let before = thread_count();
        // 64 MiB over what the process maps: room for a few dozen 2 MiB worker stacks,
        // not for 999.
        limit_address_space(vm_size() + (64 << 20));
        let (s, e) = try_load(&path, 1000, 1 << 20).err().expect("1000 threads started under a 64 MiB headroom");
        limit_address_space(libc::RLIM_INFINITY);
        println!("{s:?}: {e}");
        assert_eq!(s, Status::LLMRT_OUT_OF_MEMORY, "{e}");
        assert!(e.contains("cannot start CPU worker thread") && e.contains("of 999 (1000 threads)"), "{e}");
        // How many had started, and that they were stopped.
        let started: usize = e
            .split("; the ")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("message lacks the number of started workers: {e}"));
        assert!(started > 0 && started < 999, "{started} workers started: the limit did not bite mid-way ({e})");
        assert!(e.contains("were stopped and joined"), "{e}");
        wait_for_threads(before);
        // The process is fine: a model with a sane thread count loads and runs.
        let m = try_load(&path, 2, 1 << 20).unwrap_or_else(|(s, e)| panic!("{s:?} {e}"));
        let c = m.reserve(16);
        m.prefill(c, &f.tokens[..4]);
        println!("child-ok");
        return;
    }
    run_child(name, &[]);
}

// ---------------------------------------------------------------- step scratch under a memory limit

/// A synthetic F32 llama with a 65,536-token vocabulary (1 layer, hidden 64, 4/2
/// heads, FFN 128, context 128, tied output): 16 MiB of embedding, so a 64-token
/// prefill_all needs 16 MiB of logits and as much again inside the LM head.
fn write_big_vocab_model(path: &Path) {
    use llmrt::format::gguf::Value;
    use llmrt::format::gguf_write::GgufWriter;
    use llmrt::quant::DType;
    let (h, ffn, vocab, heads, kv_heads) = (64u64, 128u64, 65_536u64, 4u32, 2u32);
    let kv = h / heads as u64 * kv_heads as u64;
    let mut rng = llmrt::util::XorShift::new(0x6500);
    let mut mat = |rows: u64, cols: u64, scale: f32| -> Vec<u8> {
        (0..rows * cols).flat_map(|_| (rng.uniform(-1.0, 1.0) * scale).to_le_bytes()).collect()
    };
    let s = 1.0 / (h as f32).sqrt();
    let ones: Vec<u8> = std::iter::repeat_n(1f32.to_le_bytes(), h as usize).flatten().collect();
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::Str("llama".into()));
    w.kv("llama.block_count", Value::U32(1));
    w.kv("llama.context_length", Value::U32(128));
    w.kv("llama.embedding_length", Value::U32(h as u32));
    w.kv("llama.feed_forward_length", Value::U32(ffn as u32));
    w.kv("llama.attention.head_count", Value::U32(heads));
    w.kv("llama.attention.head_count_kv", Value::U32(kv_heads));
    w.kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    w.tensor("token_embd.weight", &[h, vocab], DType::F32, mat(vocab, h, 0.5));
    w.tensor("output_norm.weight", &[h], DType::F32, ones.clone());
    w.tensor("blk.0.attn_norm.weight", &[h], DType::F32, ones.clone());
    w.tensor("blk.0.attn_q.weight", &[h, h], DType::F32, mat(h, h, s));
    w.tensor("blk.0.attn_k.weight", &[h, kv], DType::F32, mat(kv, h, s));
    w.tensor("blk.0.attn_v.weight", &[h, kv], DType::F32, mat(kv, h, s));
    w.tensor("blk.0.attn_output.weight", &[h, h], DType::F32, mat(h, h, s));
    w.tensor("blk.0.ffn_norm.weight", &[h], DType::F32, ones);
    w.tensor("blk.0.ffn_gate.weight", &[h, ffn], DType::F32, mat(ffn, h, s));
    w.tensor("blk.0.ffn_up.weight", &[h, ffn], DType::F32, mat(ffn, h, s));
    w.tensor("blk.0.ffn_down.weight", &[ffn, h], DType::F32, mat(h, ffn, 1.0 / (ffn as f32).sqrt()));
    w.write(path).unwrap();
}

#[test]
fn prefill_all_on_a_65536_vocab_under_a_memory_limit_is_out_of_memory_not_an_abort() {
    let name = "prefill_all_on_a_65536_vocab_under_a_memory_limit_is_out_of_memory_not_an_abort";
    if is_child(name) {
        let dir = temp_dir("bigvocab");
        let path = dir.join("vocab65536.gguf");
        write_big_vocab_model(&path);
        let m = try_load(&path, 1, 0).unwrap_or_else(|(s, e)| panic!("{s:?} {e}"));
        assert_eq!(m.vocab, 65_536);
        let toks: Vec<u32> = (0..64u32).map(|i| (i * 7919 + 13) % 65_536).collect();
        let (c, twin) = (m.reserve(0), m.reserve(0));
        let want = m.prefill_all(twin, &toks);
        let mut out = vec![7.0f32; 64 * m.vocab];
        // Headroom over what the process maps, growing until the step fits: below
        // 16 MiB the runtime's logits scratch fails, then the step's own buffers (the
        // LM head's 16 MiB transpose buffer aborted the process before).
        let (mut ooms, mut inside) = (0, 0);
        let mut done = false;
        for mib in (0..=160u64).step_by(2) {
            limit_address_space(vm_size() + (mib << 20));
            // SAFETY: a live model; toks and out are live locals of the lengths passed.
            let s = unsafe { llmrt_prefill_all(m.ptr, c, toks.as_ptr(), toks.len(), out.as_mut_ptr()) };
            let e = last_error();
            limit_address_space(libc::RLIM_INFINITY);
            match s {
                Status::LLMRT_OUT_OF_MEMORY => {
                    assert!(e.contains("llmrt_prefill_all") && e.contains("cannot allocate"), "{e}");
                    assert!(e.contains("bytes"), "message lacks the size: {e}");
                    assert!(out.iter().all(|&x| x == 7.0), "{mib} MiB: a failed step wrote logits");
                    assert_eq!(m.len(c), 0, "{mib} MiB: a failed step advanced the cache");
                    ooms += 1;
                    if !e.contains("the step's logits") {
                        inside += 1;
                    }
                    println!("headroom {mib} MiB: {e}");
                }
                Status::LLMRT_OK => {
                    println!("headroom {mib} MiB: OK");
                    assert_eq!(m.len(c), 64);
                    let (g, w): (Vec<u32>, Vec<u32>) =
                        (out.iter().map(|x| x.to_bits()).collect(), want.iter().map(|x| x.to_bits()).collect());
                    assert!(g == w, "logits after the failed attempts differ from the twin's");
                    done = true;
                    break;
                }
                other => panic!("{mib} MiB: {other:?} {e}"),
            }
        }
        assert!(done, "the step never fitted in 160 MiB of headroom");
        assert!(ooms > 0 && inside > 0, "{ooms} failures, {inside} inside the forward pass: the limit never bit there");
        drop(m);
        std::fs::remove_dir_all(&dir).unwrap();
        println!("child-ok");
        return;
    }
    run_child(name, &[]);
}

// ---------------------------------------------------------------- the *_default writers and struct_size

/// `llmrt_model_options_init` / `llmrt_sampler_params_init` with `size` into a
/// buffer of 0xEE bytes: returns the bytes afterwards.
fn init_into<T>(size: usize, init: unsafe extern "C" fn(*mut T, usize)) -> Vec<u8> {
    let ours = std::mem::size_of::<T>();
    // u64 words: aligned for T; 32 bytes of slack past it.
    let mut buf = vec![0xEEEE_EEEE_EEEE_EEEEu64; (ours + 32).div_ceil(8)];
    let p = buf.as_mut_ptr().cast::<u8>();
    // SAFETY: the buffer holds ours + 32 bytes, aligned for T; init writes at most
    // min(size, ours) of them.
    unsafe {
        init(p.cast::<T>(), size);
        std::slice::from_raw_parts(p, ours + 32).to_vec()
    }
}

/// `llmrt_*_default` into a buffer of 0xEE bytes whose first 4 (struct_size) hold
/// `garbage`: returns the bytes afterwards.
fn default_into<T>(garbage: u32, fill: unsafe extern "C" fn(*mut T)) -> Vec<u8> {
    let ours = std::mem::size_of::<T>();
    let mut buf = vec![0xEEEE_EEEE_EEEE_EEEEu64; (ours + 32).div_ceil(8)];
    let p = buf.as_mut_ptr().cast::<u8>();
    // SAFETY: the buffer holds ours + 32 bytes, aligned for T.
    unsafe {
        p.cast::<u32>().write(garbage);
        fill(p.cast::<T>());
        std::slice::from_raw_parts(p, ours + 32).to_vec()
    }
}

#[test]
fn init_writers_honour_the_callers_size_and_default_writers_the_headers() {
    fn u32_at(b: &[u8], off: usize) -> u32 {
        u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
    }
    let opts = std::mem::size_of::<llmrt_model_options>();
    let params = std::mem::size_of::<llmrt_sampler_params>();
    let threads_end = std::mem::offset_of!(llmrt_model_options, threads) + 4;
    let top_k_end = std::mem::offset_of!(llmrt_sampler_params, top_k) + 4;
    type Init = fn(usize) -> Vec<u8>;
    type Default = fn(u32) -> Vec<u8>;
    let fills: [(&str, usize, usize, Init, Default); 2] = [
        (
            "options",
            opts,
            threads_end,
            |n| init_into::<llmrt_model_options>(n, llmrt_model_options_init),
            |g| default_into::<llmrt_model_options>(g, llmrt_model_options_default),
        ),
        (
            "params",
            params,
            top_k_end,
            |n| init_into::<llmrt_sampler_params>(n, llmrt_sampler_params_init),
            |g| default_into::<llmrt_sampler_params>(g, llmrt_sampler_params_default),
        ),
    ];
    for (what, ours, small, init, default) in fills {
        // An older, smaller struct (through `threads` / `top_k`): the bytes after it stay.
        let b = init(small);
        assert_eq!(u32_at(&b, 0) as usize, small, "{what}: struct_size");
        assert!(b[small..].iter().all(|&x| x == 0xEE), "{what}: bytes past size {small} written");
        assert!(b[4..small].iter().any(|&x| x != 0xEE), "{what}: nothing written inside size");
        // The whole struct: every byte of a field written, nothing past it.
        let full = init(ours);
        assert_eq!(u32_at(&full, 0) as usize, ours);
        assert!(full[ours..].iter().all(|&x| x == 0xEE), "{what}: bytes past sizeof written");
        assert_eq!(full[..small], {
            let mut v = b[..small].to_vec();
            v[..4].copy_from_slice(&(ours as u32).to_le_bytes());
            v
        });
        // A newer, larger struct: the library writes what it knows and says how much.
        let big = init(ours + 32);
        assert_eq!(u32_at(&big, 0) as usize, ours, "{what}: struct_size of a larger struct");
        assert_eq!(big, full);
        // Below 8 bytes: nothing written.
        let tiny = init(4);
        assert!(tiny.iter().all(|&x| x == 0xEE), "{what}: size 4 wrote something");
        // `_default` never reads struct_size (callers pass uninitialised memory):
        // whatever garbage is there, it writes the header's whole struct.
        for garbage in [0, 4, small as u32, ours as u32, 0xEEEE_EEEE, u32::MAX] {
            assert_eq!(default(garbage), full, "{what}: _default over struct_size {garbage:#x}");
        }
    }
    // A model loads with the smaller options struct (the fields past it take defaults).
    let b = fill_small_options(threads_end);
    let path = std::ffi::CString::new(fixture().gguf("f32").to_str().unwrap()).unwrap();
    let mut m = std::ptr::null_mut();
    // SAFETY: b holds an llmrt_model_options of struct_size bytes (and more); m is a local.
    let s = unsafe { llmrt_model_load(path.as_ptr(), b.as_ptr().cast(), &mut m) };
    assert_eq!(s, Status::LLMRT_OK, "{}", last_error());
    // SAFETY: m came from llmrt_model_load.
    unsafe { llmrt_model_free(m) };
}

/// Options of `size` bytes filled by `llmrt_model_options_init`, then the CPU
/// backend and 1 thread set (both inside `size`), in a u64 buffer.
fn fill_small_options(size: usize) -> Vec<u64> {
    let mut buf = vec![0xEEEE_EEEE_EEEE_EEEEu64; std::mem::size_of::<llmrt_model_options>().div_ceil(8) + 4];
    let p = buf.as_mut_ptr().cast::<llmrt_model_options>();
    // SAFETY: the buffer is large and aligned enough for llmrt_model_options; only
    // fields inside `size` are touched.
    unsafe {
        llmrt_model_options_init(p, size);
        (*p).backend = llmrt_backend::LLMRT_BACKEND_CPU as u32;
        (*p).threads = 1;
    }
    buf
}
