//! `st-testapp pause`: the pod sandbox process. It only holds the sandbox's
//! namespaces: blocks until SIGTERM or SIGINT (then exits 0) and, being PID 1
//! of the sandbox, reaps zombie children whenever SIGCHLD arrives.

use crate::{clock, signals};

/// Runs until SIGTERM/SIGINT; returns the exit code (0).
pub fn run() -> u8 {
    let set = signals::block(&[libc::SIGTERM, libc::SIGINT, libc::SIGCHLD]);
    loop {
        let sig = signals::wait(&set);
        if sig == libc::SIGCHLD {
            reap();
            continue;
        }
        clock::log("pause", &format!("{} received, exit", signals::name(sig)));
        return 0;
    }
}

/// Reaps every child that has exited (non-blocking).
fn reap() {
    loop {
        let mut status = 0;
        // SAFETY: plain syscall with a valid out pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
    }
}
