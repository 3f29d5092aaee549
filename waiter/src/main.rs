//! `safe-termination-wait`: the program a pod's preStop hook runs to wait until every node's
//! data plane has removed the pod's endpoints, as the safe-termination operator decides;
//! bounded by a deadline, and falling back to a plain sleep (the operator's current sleep for
//! the policy) on any doubt.
//!
//! It runs inside the user's app container (any image, read-only root filesystem, any UID), so
//! it is one static binary with no Kubernetes client: an init container copies it into an
//! emptyDir (`install`), the hook runs it from there (`wait`). The decision is the pure state
//! machine of [`machine`]; this file only does the I/O around it.

mod args;
mod files;
mod http;
mod install;
mod machine;

use std::path::Path;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use machine::{Clock, Plan};

/// Printed for `--help` and after usage errors.
const USAGE: &str = "\
usage:
  safe-termination-wait install DEST
      Copy this executable to DEST (mode 0555; DEST.tmp-<pid>, fsync, rename).
  safe-termination-wait wait --url URL --policy NAME --fallback-seconds N --deadline-seconds D
                             [--dir DIR] [--poll-seconds T] [--address IP:PORT]
      Wait (as a preStop hook) until the operator at URL says every node removed this pod's
      endpoints, at most D seconds; on any doubt, sleep the fallback instead: the value of
      DIR/NAME.preStopSeconds (else N), at most D, counted from the start.
      DIR (default /safe-termination/wait) holds token, ca.crt (the CA; when it is missing,
      empty or holds no certificate: ca-admission.crt) and NAME.preStopSeconds.
      T (default 10): the longest long poll, in seconds.
      IP:PORT (10.96.0.20:443, [fd00::14]:443): connect there instead of resolving URL's host;
      the certificate is still verified against URL's host, which stays the SNI and Host.

Exit status 0 for every outcome of wait; 1 when install fails; 2 for a usage error.
A usage error sleeps 10 s before it exits: a preStop hook with a wrong command line must not
turn into no wait at all (the pod would lose requests while the nodes still route to it).
";

/// How long a usage error sleeps before exit status 2 (see USAGE).
const USAGE_ERROR_SLEEP: Duration = Duration::from_secs(10);
/// How long after the end of the wait the report may still take.
const REPORT_GRACE: Duration = Duration::from_millis(300);

fn main() -> ExitCode {
    let t0 = Instant::now();
    let mut argv = Vec::new();
    for arg in std::env::args_os().skip(1) {
        match arg.into_string() {
            Ok(s) => argv.push(s),
            Err(raw) => return usage_error(&format!("argument is not UTF-8: {raw:?}"), true),
        }
    }
    let Some((command, rest)) = argv.split_first() else {
        return usage_error("missing subcommand", true);
    };
    match command.as_str() {
        "wait" => match args::parse_wait(rest) {
            Ok(a) => {
                wait(&a, t0);
                ExitCode::SUCCESS
            }
            Err(e) => usage_error(&e, true),
        },
        // install runs in an init container, not as a hook: a usage error fails at once
        "install" => match rest {
            [dest] if !dest.is_empty() && !dest.starts_with('-') => match install::install(Path::new(dest)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            },
            _ => usage_error("install needs exactly one argument, DEST", false),
        },
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        // an unknown subcommand may be a hook's typo: sleep as for any usage error of wait
        other => usage_error(&format!("unknown subcommand {other:?}"), true),
    }
}

/// `error: ...` and the usage on stderr; then, if this may be a preStop hook, the sleep that
/// keeps a wrong command line from being no wait at all; exit status 2.
fn usage_error(message: &str, may_be_hook: bool) -> ExitCode {
    eprintln!("error: {message}");
    eprint!("{USAGE}");
    if may_be_hook {
        std::thread::sleep(USAGE_ERROR_SLEEP);
    }
    ExitCode::from(2)
}

/// The monotonic clock from t0.
#[derive(Clone, Copy)]
struct RealClock(Instant);

impl Clock for RealClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d);
    }
}

fn wait(a: &args::WaitArgs, t0: Instant) {
    let clock = RealClock(t0);
    // the operator's sleep for the policy now; missing or bad: N
    let current = files::current_seconds(&a.dir, &a.policy).unwrap_or(a.fallback_seconds);
    let plan = Plan::new(current, a.deadline_seconds, a.poll_seconds);
    let mut transport = None;
    let ready = connect(a).map(|h| transport = Some(h));
    let decision = machine::decide(plan, ready, &clock, &mut transport);

    // the report, from a thread started at the decision: its POSTs (sent again on a new
    // connection while the answer is NotLeader) end within 1 s of it; not awaited past the
    // wait + 0.3 s (the process ends, and the thread with it)
    let report_until = clock.now() + http::REPORT_TIMEOUT;
    let report = transport.as_ref().and_then(|http| {
        let mut reporter = http.reporter();
        let body = http::report_body(&decision, plan.fallback);
        let (done_tx, done_rx) = mpsc::sync_channel::<()>(1);
        std::thread::Builder::new()
            .name("report".into())
            .spawn(move || {
                let _ = reporter.report(&body, &clock, report_until);
                let _ = done_tx.send(());
            })
            .ok()
            .map(|_| done_rx)
    });
    machine::sleep_until(&clock, decision.end);
    let waited = clock.now();
    if let Some(done) = report {
        let _ = done.recv_timeout(REPORT_GRACE);
    }
    let reason = decision.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
    eprintln!("safe-termination-wait: {} after {:.1} s (fallback {} s){reason}", decision.outcome.as_str(), waited.as_secs_f64(), plan.fallback.as_secs());
}

/// The token and the CA of `--dir` (`ca.crt`, else `ca-admission.crt`: [`files::read_ca`]),
/// and the endpoint: a doubt when the token or both CA files are missing or bad (or when the
/// policy could not go in the query, which `args` already rules out).
fn connect(a: &args::WaitArgs) -> Result<http::Http, String> {
    let token = files::read_bounded(&a.dir.join("token"), files::MAX_TOKEN).and_then(|b| files::parse_token(&b)).map_err(|e| format!("token: {e}"))?;
    let ca = files::read_ca(&a.dir, http::parse_ca)?;
    http::Http::new(&a.url, &a.policy, &token, ca, a.address)
}
