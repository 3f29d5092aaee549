//! `install DEST`, as the init container runs it.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::{BIN, run};

#[test]
fn install_copies_a_runnable_0555_file() {
    let dir = std::env::temp_dir().join(format!("st-wait-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let dest = dir.join("safe-termination-wait");
    // over an older file, too: the rename replaces it
    std::fs::write(&dest, "old").unwrap();
    let r = run(&["install", dest.to_str().unwrap()]);
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!(r.stderr, "");
    assert_eq!(std::fs::metadata(&dest).unwrap().permissions().mode() & 0o7777, 0o555);
    assert!(std::fs::read(&dest).unwrap() == std::fs::read(BIN).unwrap(), "not a copy of the binary");
    let names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names, vec!["safe-termination-wait"]);
    // the copy runs
    let out = std::process::Command::new(&dest).arg("--help").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("safe-termination-wait install DEST"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn install_into_a_missing_directory_fails_with_1() {
    let r = run(&["install", "/nonexistent-st-wait/dir/hook"]);
    assert_eq!(r.status.code(), Some(1));
    assert!(r.stderr.starts_with("error: create /nonexistent-st-wait/dir/hook.tmp-"), "{}", r.stderr);
}

#[test]
fn install_without_dest_is_a_usage_error_at_once() {
    let r = run(&["install"]);
    assert_eq!(r.status.code(), Some(2));
    assert!(r.stderr.starts_with("error: install needs exactly one argument, DEST\nusage:"), "{}", r.stderr);
    // an init container, not a hook: no sleep
    assert!(r.elapsed < Duration::from_secs(2), "{:?}", r.elapsed);
}
