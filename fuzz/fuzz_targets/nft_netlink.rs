//! Fuzz target `nft_netlink`: the input bytes into `checks::nft_netlink` (fuzz/checks.rs says what is checked).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::nft_netlink(data));
