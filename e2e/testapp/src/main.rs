//! `st-testapp`: the test workload of the safe-termination e2e cluster, one
//! static binary with three subcommands.
//!
//! - `pause`: the pod sandbox process (PID 1 of the sandbox): waits for
//!   SIGTERM/SIGINT and reaps zombie children.
//! - `serve`: a small HTTP/1.1 server that answers with its pod name; without
//!   `--graceful` it models the typical application that has no graceful
//!   shutdown (SIGTERM closes the listener and exits at once, cutting in-flight
//!   requests), with `--graceful` it drains in-flight requests first.
//! - `load`: an open-loop load generator that records one CSV row per request
//!   (new TCP connection per request) and classifies every failure.
//!
//! Only `std` and `libc`; no async runtime. Exit code 2 means a usage error.

mod args;
mod clock;
mod load;
mod pause;
mod serve;
mod signals;

use std::process::ExitCode;

/// Text printed for `--help` and after usage errors.
const USAGE: &str = "\
usage:
  st-testapp pause
  st-testapp serve [--listen 0.0.0.0:8080] [--graceful] [--drain-timeout-ms 5000]
  st-testapp load --target HOST:PORT --out FILE [--rate-per-second 200]
                  [--timeout-ms 1000] [--duration-seconds N] [--expect-prefix PREFIX]
                  [--workers 64]
";

fn main() -> ExitCode {
    let mut argv = Vec::new();
    for arg in std::env::args_os().skip(1) {
        match arg.into_string() {
            Ok(s) => argv.push(s),
            Err(raw) => return usage_error(&format!("argument is not UTF-8: {raw:?}")),
        }
    }
    let Some((command, rest)) = argv.split_first() else {
        return usage_error("missing subcommand");
    };
    let result = match command.as_str() {
        "pause" => args::Parser::new(rest).finish().map(|()| pause::run()),
        "serve" => serve::Options::parse(rest).map(serve::run),
        "load" => load::Options::parse(rest).map(load::run),
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        other => Err(format!("unknown subcommand {other:?}")),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(message) => usage_error(&message),
    }
}

/// Prints `message` and the usage text to stderr; returns exit code 2.
fn usage_error(message: &str) -> ExitCode {
    eprint!("st-testapp: {message}\n{USAGE}");
    ExitCode::from(2)
}
