//! The abort hook: a caller's function polled during a step (between layers on the
//! CPU, before the launch on CUDA). When it answers true the step stops with
//! `LLMRT_ABORTED` and, like any failed step, commits nothing.
//!
//! The model keeps the hook ([`crate::Model::set_abort_hook`]); a step installs it for
//! the calling thread with [`install`] (the thread that drives the layers: the CPU pool's
//! workers never poll it), and the forward passes call [`check`].

use crate::{Error, Result};
use std::cell::RefCell;
use std::sync::Arc;

/// A caller's "stop now?" function. Called on the thread that called the step, with
/// the model's lock held: it must not call into the same model.
pub type AbortHook = Arc<dyn Fn() -> bool + Send + Sync>;

thread_local! {
    static CURRENT: RefCell<Option<AbortHook>> = const { RefCell::new(None) };
}

/// Restores this thread's previous hook when dropped (see [`install`]).
pub(crate) struct Installed(Option<AbortHook>);

impl Drop for Installed {
    fn drop(&mut self) {
        let prev = self.0.take();
        let _ = CURRENT.try_with(|c| *c.borrow_mut() = prev);
    }
}

/// Makes [`check`] on this thread poll `hook` until the returned guard is dropped
/// (also on a panic).
pub(crate) fn install(hook: Option<AbortHook>) -> Installed {
    Installed(CURRENT.try_with(|c| std::mem::replace(&mut *c.borrow_mut(), hook)).ok().flatten())
}

/// `LLMRT_ABORTED` (naming `at()`, where the step stood) when this thread's step has a
/// hook and it answers true.
pub(crate) fn check(at: impl FnOnce() -> String) -> Result<()> {
    let hook = CURRENT.try_with(|c| c.borrow().clone()).ok().flatten();
    match hook {
        Some(h) if h() => {
            Err(Error::aborted(format!("the abort callback stopped the step at {}; nothing was committed", at())))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn check_polls_only_inside_during_and_restores() {
        let calls = Arc::new(AtomicU32::new(0));
        let c2 = calls.clone();
        let hook: AbortHook = Arc::new(move || c2.fetch_add(1, Ordering::SeqCst) >= 1);
        assert!(check(|| "outside".into()).is_ok());
        {
            let _g = install(Some(hook));
            assert!(check(|| "first".into()).is_ok());
            let e = check(|| "layer 1 of 2".into()).unwrap_err();
            assert_eq!(e.status, crate::Status::LLMRT_ABORTED);
            assert!(e.message.contains("layer 1 of 2"), "{}", e.message);
            // Nested: no hook inside, the outer one back after.
            {
                let _inner = install(None);
                assert!(check(|| "inner".into()).is_ok());
            }
            assert!(check(|| "again".into()).is_err());
        }
        assert!(check(|| "after".into()).is_ok());
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }
}
