//! Fuzz target `observe_wire`: the input bytes into `checks::observe_wire` (fuzz/checks.rs says what is checked).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::observe_wire(data));
