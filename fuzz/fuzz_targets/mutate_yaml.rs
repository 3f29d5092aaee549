//! Fuzz target `mutate_yaml`: the input bytes into `checks::mutate_yaml` (fuzz/checks.rs says what is checked).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::mutate_yaml(data));
