//! Fuzz target `review`: the input bytes into `checks::review_body` (fuzz/checks.rs says what is checked).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::review_body(data));
