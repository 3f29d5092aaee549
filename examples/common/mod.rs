//! What the examples share (not an example itself: Cargo builds `examples/*.rs` and
//! `examples/*/main.rs` only). Each example takes it with `mod common;`.

/// The value after `name` in `args` (`--count 1000`), or `default` when `name` is absent.
/// Panics, naming the flag, when the value does not parse.
pub fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name} expects a number, got {v:?}")))
        .unwrap_or(default)
}
