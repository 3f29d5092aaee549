//! Fuzz target `configmap`: the input bytes into `checks::configmap` (fuzz/checks.rs says what is checked).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::configmap(data));
