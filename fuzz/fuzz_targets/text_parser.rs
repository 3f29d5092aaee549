//! Fuzz target `text_parser`: the input bytes into `checks::text_parser` (fuzz/checks.rs says what is checked).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::text_parser(data));
