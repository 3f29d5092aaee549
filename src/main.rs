//! The `safe-termination` binary: the composition root. Parses arguments, sets up logging and
//! the TLS provider, and dispatches to the command modules in `safe_termination::cli`.

use clap::{Parser, Subcommand};
use safe_termination::cli::agent::{self as agent_cmd, AgentArgs};
use safe_termination::cli::analyze::{self, AnalyzeArgs};
use safe_termination::cli::mutate::{self as mutate_cmd, MutateArgs, ReviewArgs};
use safe_termination::cli::run::{self as run_cmd, RunArgs};
use safe_termination::cli::webhook::{self as webhook_cmd, WebhookArgs};
use safe_termination::telemetry::{LogFormat, LogGuard, init_logging};
use std::io::Write;
use std::process::ExitCode;

/// mimalloc instead of glibc's malloc: the webhook's hot path (parse an AdmissionReview into a
/// `serde_json::Value`, patch, encode) is allocation-bound; glibc malloc/free were ~20% of the
/// server's CPU under load (docs/benchmarks/webhook.md "Webhook"). Built without transparent huge pages
/// (mimalloc's `no_thp`: a smaller resident size, docs/benchmarks/memory.md "Operator memory").
/// `--features system-allocator` keeps glibc's (smaller resident size; docs/benchmarks/memory.md "Operator
/// memory").
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Makes pod termination safe: measures kube-proxy's propagation window and sizes preStop
/// sleeps and terminationGracePeriodSeconds from it.
#[derive(Debug, Parser)]
#[command(name = "safe-termination", version, about)]
struct Cli {
    /// Log format on standard error.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "SAFE_TERMINATION_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure the propagation window from kube-proxy scrapes (files, stdin or URLs) and print the
    /// preStop sleep, grace period and proxy-mode advice. Exit 1 on bad input, 2 on usage errors.
    Analyze(AnalyzeArgs),
    /// Show what the webhook would do to Pods and workload pod templates in manifests (a CI
    /// check before they reach a cluster). Unknown kinds are reported, not fatal.
    Mutate(MutateArgs),
    /// Print exactly the AdmissionReview response the webhook would send for a request.
    Review(ReviewArgs),
    /// Print the TerminationPolicy CustomResourceDefinition as YAML.
    Crd,
    /// Run the admission webhook alone (HTTPS), with a static plan from flags, plus the admin
    /// port (/livez, /readyz, /metrics). SIGTERM drains; a second signal aborts.
    Webhook(WebhookArgs),
    /// Run the operator: measure kube-proxy, reconcile TerminationPolicies, serve the webhook
    /// with the measured plan (leader election; SIGTERM drains, a second signal aborts).
    Run(Box<RunArgs>),
    /// Run the node agent (a DaemonSet with hostNetwork): serve kube-proxy's /metrics,
    /// /proxyMode and /configz, reduced to what the operator reads, to the operator only
    /// (mutual TLS from the operator's CA), plus /healthz on a plain-HTTP port.
    Agent(AgentArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    // servers log each request at info, from a writer thread; one-shot commands only warnings,
    // directly. The guard lives until main returns, so queued lines are written out.
    let serving = matches!(cli.command, Command::Webhook(_) | Command::Run(_) | Command::Agent(_));
    // the agent (one per node, a few requests a minute) logs little and directly, and runs on
    // one thread: its footprint target is 20 MiB and about a millicore
    let agent = matches!(cli.command, Command::Agent(_));
    let log = init_logging(cli.log_format, if serving { "info" } else { "warn" }, serving && !agent);
    let mut builder = if agent { tokio::runtime::Builder::new_current_thread() } else { tokio::runtime::Builder::new_multi_thread() };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            error_line(&format!("cannot start the async runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Analyze(args) => finish(runtime.block_on(analyze::run(&args))),
        Command::Mutate(args) => finish(mutate_cmd::run_mutate(&args)),
        Command::Review(args) => finish(mutate_cmd::run_review(&args)),
        Command::Crd => write_out(&safe_termination::core::crd::crd_yaml()),
        Command::Webhook(args) => served(runtime, log, |rt| rt.block_on(webhook_cmd::run(&args))),
        Command::Run(args) => served(runtime, log, |rt| rt.block_on(run_cmd::run(&args))),
        Command::Agent(args) => served(runtime, log, |rt| rt.block_on(agent_cmd::run(&args))),
    }
}

/// Runs a serving command and maps its end to an exit code. The queued log lines are written
/// out before the final error line, so that it is the last line of the output.
fn served(runtime: tokio::runtime::Runtime, log: LogGuard, f: impl FnOnce(&tokio::runtime::Runtime) -> Result<(), safe_termination::cli::Error>) -> ExitCode {
    let result = f(&runtime);
    // do not wait for stragglers after an abort
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    drop(log);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error_line(&e.to_string());
            ExitCode::from(e.exit_code())
        }
    }
}

/// Prints a command's output, or its error with the error's exit code (1 for bad input).
fn finish(result: Result<String, safe_termination::cli::Error>) -> ExitCode {
    match result {
        Ok(out) => write_out(&out),
        Err(e) => {
            error_line(&e.to_string());
            ExitCode::from(e.exit_code())
        }
    }
}

/// Writes `out` to standard output. A reader that closed the pipe early (`| head`) ends the
/// command with exit code 1 and no message; any other write error (a full disk, a closed
/// descriptor) is reported on standard error with exit code 1, never a panic.
fn write_out(out: &str) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(out.as_bytes()).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::FAILURE,
        Err(e) => {
            error_line(&format!("cannot write the output: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// `error: <msg>` on standard error; a closed or full standard error loses the line instead of
/// panicking (the exit code still says it failed).
fn error_line(msg: &str) {
    let _ = writeln!(std::io::stderr().lock(), "error: {msg}");
}
