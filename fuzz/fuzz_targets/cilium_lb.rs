//! Fuzz target `cilium_lb`: the input bytes into `checks::cilium_lb` (fuzz/checks.rs says what is checked).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::cilium_lb(data));
