//! A persistent worker pool: `threads - 1` workers live as long as the model and
//! run one job at a time together with the calling thread. Between jobs a worker
//! spins for a short bounded time (a decode step dispatches a few hundred small
//! jobs back to back) and then parks on a condition variable, so an idle model
//! costs no CPU.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
}

impl Pool {
    /// A pool of `threads` (at least 1) including the calling thread.
    pub fn new(threads: usize) -> Pool {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            remaining: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            idle: Mutex::new(0),
            wake: Condvar::new(),
            done_lock: Mutex::new(()),
            done: Condvar::new(),
        });
        let workers = (1..threads)
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("llmrt-cpu-{i}"))
                    .spawn(move || worker(&s, i))
                    .expect("cannot spawn a CPU worker thread")
            })
            .collect();
        Pool { shared, workers, threads, gate: Mutex::new(()) }
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

/// A raw pointer that may cross threads (the pool's parts write disjoint ranges).
pub(crate) struct SendPtr<T>(pub *mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: only used to hand disjoint sub-slices of one `&mut [T]` to the
// pool's parts while the caller holds the exclusive borrow.
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
    fn worker_panic_is_reported() {
        let p = Pool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| p.run(&|i| assert!(i != 1, "boom"))));
        assert!(r.is_err());
        p.run(&|_| {});
    }
}
