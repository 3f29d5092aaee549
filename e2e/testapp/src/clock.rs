//! Wall-clock helpers and the one-line-per-event log format.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the unix epoch (0 if the clock is before 1970).
pub fn unix_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// Writes `<unix seconds with ms> st-testapp <component>: <message>` as one
/// line to stderr (one `write` call, so lines of threads do not interleave).
pub fn log(component: &str, message: &str) {
    let micros = unix_micros();
    let line = format!("{}.{:03} st-testapp {component}: {message}\n", micros / 1_000_000, (micros % 1_000_000) / 1000);
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
