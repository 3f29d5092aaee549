//! Synchronous signal handling with `pthread_sigmask` + `sigwait`: the
//! signals are blocked in every thread (block them before spawning any) and
//! one thread takes them with [`wait`]. Blocked signals stay pending even for
//! PID 1 of a PID namespace, where signals with the default disposition would
//! be dropped.

use libc::c_int;

/// A set of signals, blocked in the calling thread by [`block`].
pub struct Set(libc::sigset_t);

/// Blocks `signals` in the calling thread (threads spawned later inherit the
/// mask) and returns the set for [`wait`].
pub fn block(signals: &[c_int]) -> Set {
    // SAFETY: sigset_t is plain data initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        Set(set)
    }
}

/// Waits until one signal of `set` is pending and returns its number.
pub fn wait(set: &Set) -> c_int {
    loop {
        let mut sig: c_int = 0;
        // SAFETY: set is initialised, sig is a valid out pointer.
        if unsafe { libc::sigwait(&set.0, &mut sig) } == 0 {
            return sig;
        }
    }
}

/// The conventional name of a signal number, for log lines.
pub fn name(sig: c_int) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGCHLD => "SIGCHLD",
        _ => "signal",
    }
}
