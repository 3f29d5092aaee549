//! Fuzz target `go_duration`: the input bytes into `checks::go_duration` (fuzz/checks.rs says what is checked).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::go_duration(data));
