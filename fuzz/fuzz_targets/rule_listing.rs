//! Fuzz target `rule_listing`: the input bytes into `checks::rule_listing` (fuzz/checks.rs says what is checked).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::rule_listing(data));
