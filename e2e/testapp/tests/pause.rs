//! `st-testapp pause`: blocks until SIGTERM/SIGINT, then exits 0.

mod common;

use common::{BIN, send_signal, wait_exit};
use std::process::{Command, Stdio};
use std::time::Duration;

fn check_signal_exits_zero(sig: i32) {
    let mut child = Command::new(BIN).arg("pause").stderr(Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(child.try_wait().unwrap().is_none(), "pause exited on its own");
    // SIGCHLD (no child exited) must not end it.
    send_signal(&child, libc::SIGCHLD);
    std::thread::sleep(Duration::from_millis(100));
    assert!(child.try_wait().unwrap().is_none(), "pause exited on SIGCHLD");
    send_signal(&child, sig);
    let (code, waited) = wait_exit(&mut child, Duration::from_secs(5));
    assert_eq!(code, Some(0));
    assert!(waited < Duration::from_millis(500), "{waited:?}");
}

#[test]
fn pause_exits_zero_on_sigterm() {
    check_signal_exits_zero(libc::SIGTERM);
}

#[test]
fn pause_exits_zero_on_sigint() {
    check_signal_exits_zero(libc::SIGINT);
}

#[test]
fn unknown_subcommand_and_bad_flags_exit_2() {
    for args in [&["bogus"][..], &["pause", "--x"], &["serve", "--listen", "nope"], &["load", "--out", "/tmp/x"], &[]] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("usage:"), "{args:?}");
    }
}
