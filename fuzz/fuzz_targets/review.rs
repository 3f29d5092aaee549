//! Fuzz target `review`: the input bytes into `checks::review_body` (fuzz/checks.rs says what is
//! checked), within 16 MiB live per input (fuzz/peak.rs): a 256-container pod, the most the
//! webhook mutates, holds about 1.3 MB (tests/review_cost.rs).
#![no_main]

#[path = "../checks.rs"]
mod checks;
#[path = "../peak.rs"]
mod peak;

#[global_allocator]
static GLOBAL: peak::Counting = peak::Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| peak::bounded("review", 16 << 20, data, checks::review_body));
