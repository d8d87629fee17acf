//! A persistent worker pool: `threads - 1` workers live as long as the model and
//! run one job at a time together with the calling thread. Between jobs a worker
//! spins for a short bounded time (a decode step dispatches a few hundred small
//! jobs back to back) and then parks on a condition variable, so an idle model
//! costs no CPU. [`par_units`] splits an op's output between the pool's threads.
//!
//! Starting the pool is fallible ([`Pool::start`]): at most [`MAX_THREADS`] threads, the
//! handles' vector allocated with `try_reserve`, and a worker that cannot be spawned
//! stops and joins the ones already started before the error is returned.
//!
//! fork(): a pool belongs to the process that started it ([`Pool::in_this_process`]).
//! A forked child inherits the pool's memory but none of its workers; the CPU backend
//! starts a new pool there before the child's first step, and dropping a pool in a
//! process other than its own leaks it (its handles and shared state) instead of
//! joining threads that do not exist there (which would hang) or touching mutexes a
//! worker of the parent may have held at the fork.

use crate::{Error, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The most threads a pool (and `llmrt_model_options.threads`) may have.
pub const MAX_THREADS: usize = 1024;

/// This process's id (not cached: a fork changes it).
pub(crate) fn process_id() -> u32 {
    std::process::id()
}

/// How long a worker (or the caller waiting for workers) spins before parking.
const SPIN: Duration = Duration::from_micros(50);

type Job = dyn Fn(usize) + Sync;

struct Shared {
    /// Bumped once per job; workers run the job when they see a new value.
    generation: AtomicU64,
    /// The current job, lifetime-erased; valid while `remaining > 0`.
    job: Mutex<Option<&'static Job>>,
    /// Workers that have not finished the current job.
    remaining: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    /// Workers whose thread is running (past the runtime's per-thread set-up).
    running: AtomicUsize,
    /// Parking for idle workers (guards `sleepers`).
    idle: Mutex<usize>,
    wake: Condvar,
    /// Parking for the caller waiting on the last worker.
    done_lock: Mutex<()>,
    done: Condvar,
}

/// The pool; dropping it stops and joins the workers.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    threads: usize,
    /// Serialises `run` (the backend is used under the model's mutex anyway).
    gate: Mutex<()>,
    /// The process whose threads the workers are (see the module comment on fork).
    pid: u32,
}

impl Pool {
    /// A pool of `threads` (at least 1, at most [`MAX_THREADS`]) including the
    /// calling thread. More than `MAX_THREADS`: `LLMRT_INVALID_ARGUMENT`. A worker that
    /// cannot be started (thread limit, no memory for its stack): `LLMRT_OUT_OF_MEMORY`
    /// saying how many had started and why, after those were stopped and joined.
    pub fn start(threads: usize) -> Result<Pool> {
        let threads = threads.max(1);
        if threads > MAX_THREADS {
            return Err(Error::invalid(format!("threads = {threads} exceeds the most worker threads, {MAX_THREADS}")));
        }
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            remaining: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            running: AtomicUsize::new(0),
            idle: Mutex::new(0),
            wake: Condvar::new(),
            done_lock: Mutex::new(()),
            done: Condvar::new(),
        });
        let mut workers = crate::util::try_with_capacity(threads - 1, "the CPU worker thread handles")?;
        let mut pool = Pool { shared, workers: Vec::new(), threads, gate: Mutex::new(()), pid: process_id() };
        for i in 1..threads {
            let s = pool.shared.clone();
            match std::thread::Builder::new().name(format!("llmrt-cpu-{i}")).spawn(move || worker(&s, i)) {
                Ok(h) => workers.push(h),
                Err(e) => {
                    let started = workers.len();
                    // Dropping the pool stops and joins the workers already started.
                    pool.workers = workers;
                    drop(pool);
                    return Err(Error::out_of_memory(format!(
                        "cannot start CPU worker thread {i} of {} ({threads} threads): {e}; the {started} workers \
                         started before it were stopped and joined (lower options.threads, or raise the process's \
                         thread or memory limit)",
                        threads - 1
                    )));
                }
            }
        }
        pool.workers = workers;
        // Return only once every worker runs: a new thread's set-up (its signal
        // stack, thread-locals) happens on the thread itself, after spawn returned, and
        // must not meet limits the caller sets after the load (RLIMIT_AS: the thread
        // would abort the process) or a step that waits on it.
        while pool.shared.running.load(Ordering::Acquire) < threads - 1 {
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok(pool)
    }

    /// [`Pool::start`] for tests, where a pool that cannot start is a failed test.
    #[cfg(test)]
    pub fn new(threads: usize) -> Pool {
        Pool::start(threads).unwrap_or_else(|e| panic!("{}", e.message))
    }

    /// Whether the workers are threads of this process (false in a child forked
    /// after the pool started: none of them exist there).
    pub fn in_this_process(&self) -> bool {
        self.pid == process_id()
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(i)` for every `i < threads()` (i = 0 on the calling thread) and
    /// returns when all have finished. A panic in any part is re-raised here.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.threads == 1 {
            f(0);
            return;
        }
        let _g = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: the erased reference is only used by workers between the
        // generation bump below and their decrement of `remaining`; this function
        // does not return (nor unwind: the caller's part runs under catch_unwind)
        // before `remaining` is back to 0, and it clears the slot before returning.
        let job: &'static Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Job>(f) };
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
        s.remaining.store(self.threads - 1, Ordering::SeqCst);
        s.generation.fetch_add(1, Ordering::SeqCst);
        if *s.idle.lock().unwrap_or_else(|e| e.into_inner()) > 0 {
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        let t0 = Instant::now();
        let mut spins = 0u32;
        while s.remaining.load(Ordering::Acquire) != 0 {
            std::hint::spin_loop();
            spins += 1;
            if spins.is_multiple_of(64) && t0.elapsed() > SPIN {
                let mut g = s.done_lock.lock().unwrap_or_else(|e| e.into_inner());
                while s.remaining.load(Ordering::Acquire) != 0 {
                    g = s.done.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                break;
            }
        }
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::SeqCst) {
            panic!("a CPU worker thread panicked");
        }
    }
}

fn worker(s: &Shared, index: usize) {
    s.running.fetch_add(1, Ordering::Release);
    let mut seen = 0u64;
    loop {
        let t0 = Instant::now();
        let mut spins = 0u32;
        let mut g = s.generation.load(Ordering::Acquire);
        while g == seen && !s.shutdown.load(Ordering::Acquire) {
            std::hint::spin_loop();
            spins += 1;
            if spins.is_multiple_of(64) && t0.elapsed() > SPIN {
                let mut sleepers = s.idle.lock().unwrap_or_else(|e| e.into_inner());
                *sleepers += 1;
                while s.generation.load(Ordering::Acquire) == seen && !s.shutdown.load(Ordering::Acquire) {
                    sleepers = s.wake.wait(sleepers).unwrap_or_else(|e| e.into_inner());
                }
                *sleepers -= 1;
            }
            g = s.generation.load(Ordering::Acquire);
        }
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        seen = g;
        let job = *s.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(job) = job {
            if catch_unwind(AssertUnwindSafe(|| job(index))).is_err() {
                s.panicked.store(true, Ordering::SeqCst);
            }
        }
        if s.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _l = s.done_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.done.notify_all();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if !self.in_this_process() {
            // A forked child's copy: its workers do not exist here (joining would wait
            // forever) and its mutexes may have been held by them at the fork. Leak it.
            std::mem::forget(std::mem::take(&mut self.workers));
            let shared = self.shared.clone();
            std::mem::forget(shared);
            return;
        }
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _l = self.shared.idle.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Work below this many multiply-adds runs on the calling thread.
const PAR_THRESHOLD: usize = 1 << 15;

/// Splits `data` (made of `units` units of `unit_len` items, the last one
/// possibly partial) into chunks of whole units (a multiple of `align` units)
/// that the pool's threads take in turn, and runs `f(first_unit, chunk)` on each. Which thread computes a unit
/// never changes how it is computed, so results do not depend on the thread count.
pub(crate) fn par_units<T: Send>(
    pool: &Pool,
    data: &mut [T],
    unit_len: usize,
    work_per_unit: usize,
    align: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let units = data.len().checked_div(unit_len).unwrap_or(0);
    let threads = pool.threads();
    if threads == 1 || units < 2 || units.saturating_mul(work_per_unit) < PAR_THRESHOLD {
        f(0, data);
        return;
    }
    // Guided self-scheduling: each take is 1/threads of what is left (whole
    // `align` units, at least one): long runs first (decode streams each chunk
    // of weights from memory, and restarts cost), then shrinking chunks, so the
    // threads finish close together even on a shared, noisy machine. (Measured
    // on TinyLlama Q4_0 decode, 2 threads: 1/threads 98.8 t/s, 1/(2 threads)
    // 92.8, 1/(4 threads) 91.4, same minute.)
    let align = align.max(1);
    let next = AtomicUsize::new(0);
    let base = SendPtr(data.as_mut_ptr());
    let total = data.len();
    pool.run(&|_| loop {
        let mut u0 = next.load(Ordering::Relaxed);
        let take = loop {
            if u0 >= units {
                return;
            }
            let left = units - u0;
            let take = (left / threads).div_ceil(align).max(1).saturating_mul(align).min(left);
            match next.compare_exchange_weak(u0, u0 + take, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break take,
                Err(now) => u0 = now,
            }
        };
        let lo = u0 * unit_len;
        // The last chunk also takes a partial unit at the end, if any.
        let hi = if u0 + take == units { total } else { (u0 + take) * unit_len };
        let p = base;
        // SAFETY: each range `u0..u0 + take` is handed out once (the atomic
        // compare-exchange), the ranges are disjoint and inside `data`, and `data`
        // stays exclusively borrowed until `pool.run` returns after every part has
        // finished.
        let part = unsafe { std::slice::from_raw_parts_mut(p.0.add(lo), hi - lo) };
        f(u0, part);
    });
}

/// A raw pointer that may cross threads (the pool's parts write disjoint ranges).
pub(crate) struct SendPtr<T>(pub(crate) *mut T);
impl<T> SendPtr<T> {
    /// The pointer (a closure calling this captures the whole `SendPtr`, not its field).
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: only used to hand disjoint parts of one `&mut [T]` to the pool's parts
// while the caller holds the exclusive borrow (here and in `ops::matmul`).
unsafe impl<T: Send> Send for SendPtr<T> {}
// SAFETY: as above; each part derives a slice no other part touches.
unsafe impl<T: Send> Sync for SendPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_every_part_once_many_times() {
        let p = Pool::new(3);
        let count = AtomicUsize::new(0);
        for _ in 0..2000 {
            p.run(&|i| {
                count.fetch_add(1 + i * 1000, Ordering::Relaxed);
            });
        }
        assert_eq!(count.load(Ordering::Relaxed), 2000 * (3 + 3000));
        // After a pause (workers parked) it still works.
        std::thread::sleep(Duration::from_millis(5));
        p.run(&|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 2000 * 3003 + 3);
    }

    #[test]
    fn too_many_threads_is_invalid_argument_naming_the_limit() {
        let e = Pool::start(u32::MAX as usize).err().expect("a pool of 2^32 - 1 threads");
        assert_eq!(e.status, crate::Status::LLMRT_INVALID_ARGUMENT);
        assert!(e.message.contains("4294967295") && e.message.contains("1024"), "{}", e.message);
        assert_eq!(Pool::start(MAX_THREADS + 1).err().map(|e| e.status), Some(crate::Status::LLMRT_INVALID_ARGUMENT));
    }

    #[test]
    fn worker_panic_is_reported() {
        let p = Pool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| p.run(&|i| assert!(i != 1, "boom"))));
        assert!(r.is_err());
        p.run(&|_| {});
    }

    /// Every item is visited once, with the unit index of its chunk, whatever
    /// the thread count, including a partial last unit.
    #[test]
    fn par_units_covers_every_item_once() {
        for threads in 1..=3 {
            let pool = Pool::new(threads);
            for (len, unit, align) in [(1000usize, 256usize, 1usize), (4096, 1, 64), (5632, 256, 1), (77, 8, 2)] {
                let mut data = vec![0usize; len];
                par_units(&pool, &mut data, unit, PAR_THRESHOLD, align, |u0, part| {
                    for (i, v) in part.iter_mut().enumerate() {
                        *v += u0 * unit + i + 1;
                    }
                });
                assert!(data.iter().enumerate().all(|(i, &v)| v == i + 1), "threads {threads} len {len} unit {unit}");
            }
        }
    }

    #[test]
    fn par_units_covers_every_unit_once() {
        let mut v = vec![0u32; 1000 * 7];
        let pool = Pool::new(3);
        par_units(&pool, &mut v, 7, 1 << 20, 4, |u0, part| {
            for (i, c) in part.chunks_exact_mut(7).enumerate() {
                for x in c {
                    *x += (u0 + i) as u32 + 1;
                }
            }
        });
        for (u, c) in v.chunks_exact(7).enumerate() {
            assert!(c.iter().all(|&x| x == u as u32 + 1));
        }
    }
}
