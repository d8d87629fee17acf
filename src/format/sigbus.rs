//! SIGBUS from a mapped model file that shrank while it was being read.
//!
//! Truncating a file that llmrt has mapped makes every later read of a page past
//! the new end raise SIGBUS. The size/mtime check before each step catches a change
//! made between steps; this handler covers one made *during* a step (or a load):
//!
//! - Every file mapping registers its address range here ([`register`]): a
//!   fixed-size table of atomics, so the handler needs no lock and no allocation.
//! - The handler (installed once, `SA_SIGINFO | SA_ONSTACK`) looks the fault address
//!   up. Inside a registered mapping it maps an anonymous zero page over the
//!   faulting page (`MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS`, read-only), marks the
//!   mapping as faulted and returns: the read is retried, sees zeros, and the step
//!   runs to its end. The runtime checks the mapping after the step, before it
//!   commits anything ([`super::FileBytes::check_unchanged`]), and fails the step
//!   with `LLMRT_IO`; the flag is never cleared, so the model refuses every later
//!   step (its mapping now holds zeros where the file had weights).
//! - Any other SIGBUS goes to the handler that was installed before ours (Rust's
//!   own, the host application's) or, when that was the default action, the
//!   default is restored and the signal raised again, so the process dies of
//!   SIGBUS as it would have without llmrt.
//!
//! The handler only does atomic loads and stores, `mmap`, `sigaction` and `raise`
//! (system calls; `mmap` is not on POSIX's async-signal-safe list but is a plain
//! system call on Linux, which is what this targets).
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Most file mappings watched at once; a mapping beyond these is not watched (a
/// truncation during a step can then kill the process, as before this existed).
const SLOTS: usize = 512;

struct Slot {
    used: AtomicBool,
    start: AtomicUsize,
    /// Past the last byte; 0 while the slot is free or being filled.
    end: AtomicUsize,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    used: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
};

static TABLE: [Slot; SLOTS] = [FREE; SLOTS];

/// The page size, read once before the handler is installed.
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// Zero pages mapped by the handler since the process started (tests read it).
static FAULTS: AtomicUsize = AtomicUsize::new(0);

/// The SIGBUS disposition before ours, read by the handler to chain.
struct Prev(libc::sigaction);
// SAFETY: a plain C struct of integers and a function address, written once
// (OnceLock) before the handler that reads it is installed, never mutated after.
unsafe impl Sync for Prev {}
// SAFETY: as above; it holds no pointer to thread-local data.
unsafe impl Send for Prev {}
static PREV: OnceLock<Prev> = OnceLock::new();

/// A registered mapping; unregisters when dropped (before the mapping is unmapped).
#[derive(Debug)]
pub(crate) struct Watch(usize);

impl Watch {
    /// Whether a read of this mapping faulted (and now sees a zero page).
    pub(crate) fn faulted(&self) -> bool {
        TABLE[self.0].faulted.load(Ordering::SeqCst)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let s = &TABLE[self.0];
        s.end.store(0, Ordering::SeqCst);
        s.start.store(0, Ordering::SeqCst);
        s.faulted.store(false, Ordering::SeqCst);
        s.used.store(false, Ordering::SeqCst);
    }
}

/// Watches `start..start + len` (a read-only file mapping); installs the handler
/// on first use. `None` when the table is full or the handler cannot be installed.
pub(crate) fn register(start: usize, len: usize) -> Option<Watch> {
    install()?;
    let end = start.checked_add(len)?;
    for (i, s) in TABLE.iter().enumerate() {
        if s.used.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            s.faulted.store(false, Ordering::SeqCst);
            s.start.store(start, Ordering::SeqCst);
            s.end.store(end, Ordering::SeqCst);
            return Some(Watch(i));
        }
    }
    None
}

/// Zero pages the handler has mapped over faulting model-file pages so far.
#[doc(hidden)]
pub fn faults_handled() -> usize {
    FAULTS.load(Ordering::SeqCst)
}

fn install() -> Option<()> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::SeqCst);
        }
        // SAFETY: an all-zero sigaction is a valid value (SIG_DFL, empty mask, no flags).
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reads the current disposition into a local.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) } != 0 {
            return false;
        }
        let _ = PREV.set(Prev(old));
        // SAFETY: as above.
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = handler as *const () as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        // SAFETY: the mask is a local; sigemptyset only writes it.
        unsafe { libc::sigemptyset(&mut new.sa_mask) };
        // SAFETY: installs a handler that is an extern "C" fn with the SA_SIGINFO signature.
        unsafe { libc::sigaction(libc::SIGBUS, &new, std::ptr::null_mut()) == 0 }
    });
    ok.then_some(())
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t for an SA_SIGINFO handler.
    let addr = if info.is_null() { 0 } else { (unsafe { (*info).si_addr() }) as usize };
    let page = PAGE.load(Ordering::Relaxed);
    for s in TABLE.iter() {
        let end = s.end.load(Ordering::SeqCst);
        if end == 0 || addr >= end || addr < s.start.load(Ordering::SeqCst) {
            continue;
        }
        let at = addr & !(page - 1);
        // SAFETY: `at` is a page inside a live llmrt file mapping (registered, not yet
        // unregistered: unregistering happens before the unmap), so replacing that one
        // page with an anonymous read-only zero page touches no other memory; the
        // mapping's owner unmaps the whole range later, this page with it.
        let r = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if r != libc::MAP_FAILED {
            s.faulted.store(true, Ordering::SeqCst);
            FAULTS.fetch_add(1, Ordering::SeqCst);
            return;
        }
        break;
    }
    chain(sig, info, ctx);
}

/// Hands a SIGBUS that is not ours to the previous disposition.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    if let Some(Prev(p)) = PREV.get() {
        let h = p.sa_sigaction;
        if h != libc::SIG_DFL && h != libc::SIG_IGN {
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous handler was installed with SA_SIGINFO, so it has
                // this signature; it gets the arguments the kernel gave us.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(h) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a handler installed without SA_SIGINFO takes the signal number.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
                f(sig);
            }
            return;
        }
    }
    // Default action: restore it and raise again (a fault re-executes and faults again;
    // a sent signal is pending until this handler returns). Either way: death by SIGBUS.
    // SAFETY: an all-zero sigaction is SIG_DFL with an empty mask.
    let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    dfl.sa_sigaction = libc::SIG_DFL;
    // SAFETY: sigaction and raise are async-signal-safe; the struct is a local.
    unsafe {
        libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
        libc::raise(libc::SIGBUS);
    }
}
