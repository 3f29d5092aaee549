//! Fuzz target `mutate_yaml`: the input bytes into `checks::mutate_yaml` (fuzz/checks.rs says
//! what is checked), within 64 MiB live per input (fuzz/peak.rs): the YAML reader's budgets
//! (depth 64, 250,000 nodes) bound what aliases can expand to.
#![no_main]

#[path = "../checks.rs"]
mod checks;
#[path = "../peak.rs"]
mod peak;

#[global_allocator]
static GLOBAL: peak::Counting = peak::Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| peak::bounded("mutate_yaml", 64 << 20, data, checks::mutate_yaml));
