//! fork() after loading (docs/RELIABILITY.md, "fork"): prefork servers and Python
//! multiprocessing fork a process that holds a loaded model. The child has only the
//! thread that called fork, so the CPU backend starts new workers there before the
//! child's first step (a step used to hang waiting for workers that do not exist), a
//! model freed in the child does not join threads that are not there, and a fork
//! waits for other threads' calls on models to finish (a model lock held at the fork
//! would stay locked in the child for good).
//!
//! Each test runs in its own re-executed test process (one test, one test thread), so
//! that the forks happen in a process whose threads are known; every forked child is
//! waited for with a timeout and killed (a failure) if it hangs.
mod common;
use common::*;
use llmrt::ffi::*;
use llmrt::Status;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn fixture() -> Fixture {
    Fixture::all().into_iter().find(|f| f.name == "llama_gqa").expect("fixture llama_gqa")
}

const CHILD: &str = "LLMRT_FORK_CHILD";

/// How long a forked child may take before it counts as hung.
const CHILD_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs test `name` of this binary alone in a new process (see the module comment).
fn run_alone(name: &str) {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, name)
        .output()
        .expect("spawn the test binary");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{name} failed ({}):\n{text}", out.status);
    assert!(text.contains("body-ok"), "{name} did not run its body:\n{text}");
    println!("{text}");
}

fn is_alone(name: &str) -> bool {
    std::env::var(CHILD).as_deref() == Ok(name)
}

/// Threads of this process.
fn tasks() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Forks; the child runs `body` and exits 0 if it returned, 1 if it panicked (it
/// never returns into the test harness). The parent gets the child's pid.
fn fork_child(body: impl FnOnce()) -> libc::pid_t {
    // SAFETY: fork has no memory-safety preconditions; the child only runs `body`
    // (llmrt calls, allocation, file writes) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).is_ok();
        // SAFETY: ends the child without running the parent's atexit handlers or the
        // test harness.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    pid
}

/// Waits for child `pid` at most CHILD_TIMEOUT; kills it and fails if it hung, fails
/// unless it exited 0.
fn wait_child(pid: libc::pid_t, what: &str) {
    let t0 = Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: status is a local out-parameter.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(r >= 0, "waitpid");
        if r == pid {
            break;
        }
        if t0.elapsed() > CHILD_TIMEOUT {
            // SAFETY: pid is our own child, not yet reaped.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("{what}: the forked child hung for {} s (killed)", CHILD_TIMEOUT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{what}: the forked child failed (wait status {status:#x})"
    );
}

/// A fresh temporary path for this process and `what`.
fn temp_path(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!("llmrt-fork-{}-{what}", std::process::id()))
}

fn read_bits(path: &PathBuf) -> Vec<u32> {
    let raw = std::fs::read(path).unwrap();
    raw.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect()
}

fn write_bits(path: &PathBuf, v: &[f32]) {
    std::fs::write(path, v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
}

#[test]
fn forked_child_steps_with_new_workers_and_matches_the_parent() {
    let name = "forked_child_steps_with_new_workers_and_matches_the_parent";
    if !is_alone(name) {
        return run_alone(name);
    }
    let f = fixture();
    let m = try_load(&f.gguf("f32"), 2, 0).unwrap_or_else(|(s, e)| panic!("{s:?} {e}"));
    let a = m.reserve(64);
    // A step in the parent first: its worker is running (spinning or parked).
    let want = m.prefill_all(a, &f.tokens[..8]);
    let shared = m.reserve(64);
    m.prefill(shared, &f.tokens[..4]);
    let in_parent = tasks();
    let out = temp_path("decode");

    let pid = fork_child(|| {
        assert_eq!(tasks(), 1, "a forked child has only the forking thread");
        // The first step starts a new worker (threads = 2: one besides the caller).
        let c = m.reserve(64);
        let got = m.prefill_all(c, &f.tokens[..8]);
        assert_eq!(bits(&got), bits(&want), "child's logits differ from the parent's");
        assert_eq!(tasks(), 2, "the child's pool did not start its worker");
        // A cache filled before the fork goes on in the child (the parent does the same).
        write_bits(&out, &m.decode(&[shared], &[f.tokens[4]]));
        // Later steps reuse the new pool.
        for i in 0..5 {
            m.decode(&[c], &[f.tokens[8 + i]]);
        }
        assert_eq!(tasks(), 2);
        assert_eq!(m.len(c), 13);
        eprintln!("child: 7 steps, logits as the parent's");
    });
    // The parent keeps working meanwhile, with its own workers.
    let b = m.reserve(64);
    assert_eq!(bits(&m.prefill_all(b, &f.tokens[..8])), bits(&want), "parent's logits changed after the fork");
    let d = m.decode(&[shared], &[f.tokens[4]]);
    assert_eq!(tasks(), in_parent, "the parent's threads changed");
    wait_child(pid, "child stepping");
    assert_eq!(read_bits(&out), bits(&d), "the child's decode of a pre-fork cache differs from the parent's");
    std::fs::remove_file(&out).unwrap();

    // A child that frees the model without stepping: no join of workers it lacks.
    let pid = fork_child(|| {
        // SAFETY: m.ptr is live in this child; it is freed here once and the child then
        // exits without dropping `m` again.
        unsafe { llmrt_model_free(m.ptr) };
        eprintln!("child: freed the model");
    });
    wait_child(pid, "child freeing the model");
    // A child that steps and then frees: joins its own new worker.
    let pid = fork_child(|| {
        m.decode(&[a], &[f.tokens[8]]);
        // SAFETY: as above.
        unsafe { llmrt_model_free(m.ptr) };
        assert_eq!(tasks(), 1, "the child's new worker was not joined");
    });
    wait_child(pid, "child stepping then freeing");
    assert_eq!(m.len(a), 8, "a child's step changed the parent's cache");
    m.decode(&[a], &[f.tokens[8]]);
    println!("body-ok");
}

/// A pointer that the test's stepping thread and the forking thread share (the C API
/// lets any thread call on a model).
#[derive(Clone, Copy)]
struct Shared(*mut llmrt_model);
// SAFETY: llmrt models may be used from any thread (calls are serialised inside).
unsafe impl Send for Shared {}

#[test]
fn fork_while_another_thread_is_inside_a_step_does_not_deadlock_the_child() {
    let name = "fork_while_another_thread_is_inside_a_step_does_not_deadlock_the_child";
    if !is_alone(name) {
        return run_alone(name);
    }
    let f = fixture();
    let m = try_load(&f.gguf("f32"), 2, 0).unwrap_or_else(|(s, e)| panic!("{s:?} {e}"));
    let probe = m.reserve(64);
    let want = m.prefill_all(probe, &f.tokens[..8]);
    let busy = m.reserve(64);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let steps = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (p, st, n, toks) = (Shared(m.ptr), stop.clone(), steps.clone(), f.tokens[..16].to_vec());
    // Steps back to back on another thread: prefills of 16 tokens (rewound each time).
    let stepper = std::thread::spawn(move || {
        let p = p;
        while !st.load(std::sync::atomic::Ordering::SeqCst) {
            // SAFETY: a live model (freed after this thread is joined); toks is a live local;
            // no logits (NULL).
            let s = unsafe { llmrt_prefill(p.0, busy, toks.as_ptr(), toks.len(), std::ptr::null_mut()) };
            assert_eq!(s, Status::LLMRT_OK, "{}", last_error());
            // SAFETY: as above.
            assert_eq!(unsafe { llmrt_cache_truncate(p.0, busy, 0) }, Status::LLMRT_OK);
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    while steps.load(std::sync::atomic::Ordering::SeqCst) < 3 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut rng = llmrt::util::XorShift::new(11);
    let rounds = 20;
    for round in 0..rounds {
        std::thread::sleep(Duration::from_micros(rng.next_u64() % 2000));
        let pid = fork_child(|| {
            // The stepping thread's lock was not inherited held: calls go through, the
            // stepping thread's cache is at a committed state, and results are right.
            let c = m.reserve(64);
            assert_eq!(bits(&m.prefill_all(c, &f.tokens[..8])), bits(&want), "round {round}: child's logits");
            let len = m.len(busy);
            assert!(len == 0 || len == 16, "round {round}: the busy cache holds {len} positions in the child");
            assert_eq!(m.truncate(busy, 0), Status::LLMRT_OK);
            assert_eq!(bits(&m.prefill_all(busy, &f.tokens[..8])), bits(&want), "round {round}: busy cache");
            // The child can fork in turn (a prefork worker that forks again).
            let pid = fork_child(|| {
                let g = m.reserve(64);
                assert_eq!(bits(&m.prefill_all(g, &f.tokens[..8])), bits(&want), "round {round}: grandchild");
            });
            wait_child(pid, &format!("round {round}: grandchild"));
        });
        wait_child(pid, &format!("round {round}"));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    stepper.join().unwrap();
    let waited = llmrt::runtime::forks_that_waited();
    println!(
        "{rounds} forks during {} steps of another thread; {waited} of them waited for a call in progress",
        steps.load(std::sync::atomic::Ordering::SeqCst)
    );
    // The forks did land while the other thread was inside a call (else this test
    // would not exercise the case).
    assert!(waited > 0, "no fork found a model call in progress");
    // The parent's model still works.
    assert_eq!(bits(&m.prefill_all(m.reserve(64), &f.tokens[..8])), bits(&want));
    println!("body-ok");
}

#[test]
fn forked_child_that_cannot_start_workers_gets_an_error_naming_fork_then_recovers() {
    let name = "forked_child_that_cannot_start_workers_gets_an_error_naming_fork_then_recovers";
    if !is_alone(name) {
        return run_alone(name);
    }
    let f = fixture();
    let m = try_load(&f.gguf("f32"), 4, 0).unwrap_or_else(|(s, e)| panic!("{s:?} {e}"));
    let a = m.reserve(64);
    let want = m.prefill_all(a, &f.tokens[..8]);
    let c = m.reserve(64);
    let pid = fork_child(|| {
        // glibc hands the stacks of the parent's other threads to the child's stack
        // cache; helper threads use them up first, so that a new worker needs a new
        // stack mapping, which the limit below refuses. Each has started (and made its
        // first allocations, which may map a malloc arena) before the limit is set, and
        // then only parks: a helper still starting under the limit died allocating 41
        // bytes when the machine was busy.
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Barrier};
        let (ready, stop) = (Arc::new(Barrier::new(9)), Arc::new(AtomicBool::new(false)));
        let helpers: Vec<_> = (0..8)
            .map(|_| {
                let (ready, stop) = (ready.clone(), stop.clone());
                std::thread::spawn(move || {
                    ready.wait();
                    while !stop.load(Ordering::Acquire) {
                        std::thread::park();
                    }
                })
            })
            .collect();
        ready.wait();
        let before = tasks();
        // No room for a thread stack: the pool cannot be started again in the child.
        let vm = {
            let s = std::fs::read_to_string("/proc/self/status").unwrap();
            let l = s.lines().find(|l| l.starts_with("VmSize:")).unwrap();
            l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
        };
        let rl = libc::rlimit { rlim_cur: vm + (1 << 20), rlim_max: libc::RLIM_INFINITY };
        // SAFETY: setrlimit only reads the rlimit passed by reference.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) }, 0);
        // No logits wanted: the pool is the first thing of the step that needs memory.
        // SAFETY: a live model; the tokens are a live local of the length passed.
        let s = unsafe { llmrt_prefill(m.ptr, c, f.tokens.as_ptr(), 8, std::ptr::null_mut()) };
        let e = last_error();
        let rl = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) }, 0);
        eprintln!("child under a 1 MiB headroom: {s:?}: {e}");
        assert_eq!(s, Status::LLMRT_OUT_OF_MEMORY, "{e}");
        assert!(e.contains("forked") && e.contains("worker"), "message does not name the fork: {e}");
        assert_eq!(m.len(c), 0, "a failed step advanced the cache");
        assert_eq!(tasks(), before, "workers started by the failed attempt were left running");
        // With memory again, the next step starts the pool and runs.
        assert_eq!(bits(&m.prefill_all(c, &f.tokens[..8])), bits(&want));
        assert_eq!(tasks(), before + 3, "threads = 4: three workers");
        stop.store(true, Ordering::Release);
        for h in helpers {
            h.thread().unpark();
            h.join().unwrap();
        }
    });
    wait_child(pid, "child without room for workers");
    println!("body-ok");
}
