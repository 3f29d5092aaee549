//! Fuzz target `agent_answer`: the input bytes into `checks::agent_answer` (fuzz/checks.rs says what is checked).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::agent_answer(data));
