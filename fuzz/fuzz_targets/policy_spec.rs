//! Fuzz target `policy_spec`: the input bytes into `checks::policy_spec` (fuzz/checks.rs says what is checked).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::policy_spec(data));
