//! `st-testapp load`: an open-loop load generator.
//!
//! Requests are scheduled at fixed times `t0 + i / rate` no matter how long
//! earlier ones take; a pool of `--workers` threads sends them. By default each
//! request opens a NEW TCP connection, sends
//! `GET / HTTP/1.1\r\nHost: <target>\r\nConnection: close\r\n\r\n` and reads
//! to EOF. With `--keep-alive` each worker keeps its connection open and sends
//! its next request on it (HTTP/1.1 persistent connections, a pool of up to
//! `--workers` connections, as service-to-service clients keep): a response is
//! read up to its `Content-Length`; a connection is dropped after a failure or
//! a `Connection: close` answer, and one the server closed while idle is not
//! reused (checked before each reuse, as careful clients do); nothing is
//! retried. One CSV row per request (rows are in completion order; sort by
//! `t_unix_seconds`):
//!
//! `t_unix_seconds,latency_ms,outcome,pod,detail,local_port,reused`
//!
//! - `t_unix_seconds`: the scheduled start (6 decimals);
//! - `latency_ms`: from the scheduled start to the outcome (3 decimals). When
//!   the schedule falls behind (all workers busy) a request still has its
//!   scheduled time and the wait for a worker is part of its latency (the
//!   summary reports `late_starts` and `max_start_delay_ms`);
//! - `outcome`: `ok` (HTTP 200, body is a pod name, starting with
//!   `--expect-prefix` when given), `refused` (ECONNREFUSED), `reset`
//!   (ECONNRESET or EPIPE at any stage), `timeout` (connect + send + read took
//!   longer than `--timeout-ms`, counted from the request's actual start; also
//!   a request that waited longer than `--timeout-ms` for a free worker and
//!   was therefore not sent, detail `not sent: ...`, counted as `not_sent` in
//!   the summary), `unreachable` (EHOSTUNREACH/ENETUNREACH), `empty` (closed
//!   without any response byte), `bad_answer` (anything else: non-200, a body
//!   that is not a pod name or lacks the prefix, a truncated response, and
//!   any other socket error such as EADDRNOTAVAIL, named in `detail`);
//! - `pod`: the pod name answered (for `ok`, and for `bad_answer` when the
//!   body is a pod name without the expected prefix);
//! - `detail`: error text or status line (CSV-escaped), empty for `ok`;
//! - `local_port`: the source port the kernel gave the connection (0 when it
//!   was not sent): the `sport` of the node's conntrack entry for it, by which
//!   the experiment's report finds the pod an attempt went to, and whether an
//!   earlier attempt's entry already held the tuple;
//! - `reused`: 1 when the request went out on a connection that had served an
//!   earlier one (`--keep-alive`), else 0.
//!
//! It runs until `--duration-seconds` has elapsed or SIGTERM/SIGINT arrives,
//! waits for outstanding requests (each is bounded by `--timeout-ms`),
//! flushes the file and prints a one-line summary to stderr.

use std::fs::File;
use std::io::{BufWriter, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::{args::Parser, clock, signals};

/// The first line of the output file.
pub const CSV_HEADER: &str = "t_unix_seconds,latency_ms,outcome,pod,detail,local_port,reused";
/// Response bytes kept per request; more is a `bad_answer`.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// Longest single sleep of the scheduler (so a signal is seen quickly).
const MAX_SCHEDULER_SLEEP: Duration = Duration::from_millis(50);
/// A request that starts later than this after its scheduled time counts as
/// a late start in the summary.
const LATE_START: Duration = Duration::from_millis(5);
/// Stack size of worker threads, bytes.
const WORKER_STACK_BYTES: usize = 256 * 1024;

/// Options of `load`.
pub struct Options {
    /// `HOST:PORT` as given (also sent as the `Host` header).
    pub target: String,
    /// The resolved target address.
    pub addr: SocketAddr,
    /// Requests per second.
    pub rate_per_second: f64,
    /// Per-request budget for connect + send + read, milliseconds.
    pub timeout_ms: u64,
    /// Run time; `None` = until SIGTERM/SIGINT.
    pub duration_seconds: Option<f64>,
    /// CSV output file.
    pub out: String,
    /// Required prefix of the pod name answered.
    pub expect_prefix: Option<String>,
    /// Worker threads (concurrent requests at most).
    pub workers: usize,
    /// Persistent connections: each worker reuses its connection.
    pub keep_alive: bool,
}

impl Options {
    /// Parses the arguments after `load`.
    pub fn parse(args: &[String]) -> Result<Options, String> {
        let mut p = Parser::new(args);
        let target: String = p.value("--target")?.ok_or("--target HOST:PORT is required")?;
        let out: String = p.value("--out")?.ok_or("--out FILE is required")?;
        let rate_per_second: f64 = p.value("--rate-per-second")?.unwrap_or(200.0);
        let timeout_ms: u64 = p.value("--timeout-ms")?.unwrap_or(1000);
        let duration_seconds: Option<f64> = p.value("--duration-seconds")?;
        let expect_prefix: Option<String> = p.value("--expect-prefix")?;
        let workers: usize = p.value("--workers")?.unwrap_or(64);
        let keep_alive = p.switch("--keep-alive");
        p.finish()?;
        if !(rate_per_second.is_finite() && rate_per_second > 0.0 && rate_per_second <= 100_000.0) {
            return Err("--rate-per-second must be in (0, 100000]".to_string());
        }
        if timeout_ms == 0 {
            return Err("--timeout-ms must be > 0".to_string());
        }
        if let Some(d) = duration_seconds
            && !(d.is_finite() && d > 0.0)
        {
            return Err("--duration-seconds must be > 0".to_string());
        }
        if workers == 0 || workers > 10_000 {
            return Err("--workers must be in 1..=10000".to_string());
        }
        let addr =
            target.to_socket_addrs().map_err(|e| format!("--target {target:?}: {e}"))?.next().ok_or_else(|| format!("--target {target:?}: no address"))?;
        Ok(Options { target, addr, rate_per_second, timeout_ms, duration_seconds, out, expect_prefix, workers, keep_alive })
    }
}

/// The classification of one request (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Outcome {
    Ok,
    Refused,
    Reset,
    Timeout,
    Unreachable,
    Empty,
    BadAnswer,
}

/// Every outcome, in summary order.
const OUTCOMES: [Outcome; 7] = [Outcome::Ok, Outcome::Refused, Outcome::Reset, Outcome::Timeout, Outcome::Unreachable, Outcome::Empty, Outcome::BadAnswer];

impl Outcome {
    /// The CSV spelling.
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Refused => "refused",
            Outcome::Reset => "reset",
            Outcome::Timeout => "timeout",
            Outcome::Unreachable => "unreachable",
            Outcome::Empty => "empty",
            Outcome::BadAnswer => "bad_answer",
        }
    }
}

/// One scheduled request.
struct Job {
    /// Scheduled start (monotonic).
    at: Instant,
    /// Scheduled start, microseconds since the unix epoch.
    at_unix_micros: u64,
}

/// One CSV row.
struct Record {
    at_unix_micros: u64,
    latency: Duration,
    outcome: Outcome,
    pod: String,
    detail: String,
    local_port: u16,
    reused: bool,
}

/// Shared between scheduler and workers.
struct Shared {
    /// Set by SIGTERM/SIGINT.
    stop: AtomicBool,
    /// Jobs not sent because they waited longer than the timeout for a worker.
    not_sent: AtomicU64,
    /// Jobs that started more than [`LATE_START`] after their time.
    late_starts: AtomicU64,
    /// Largest start delay seen, microseconds.
    max_start_delay_micros: AtomicU64,
}

/// Runs the load; returns 0, or 1 when the output file cannot be written.
pub fn run(opts: Options) -> u8 {
    let set = signals::block(&[libc::SIGTERM, libc::SIGINT]);
    let file = match File::create(&opts.out) {
        Ok(f) => f,
        Err(e) => {
            clock::log("load", &format!("cannot create {}: {e}", opts.out));
            return 1;
        }
    };
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        not_sent: AtomicU64::new(0),
        late_starts: AtomicU64::new(0),
        max_start_delay_micros: AtomicU64::new(0),
    });
    {
        let shared = Arc::clone(&shared);
        std::thread::spawn(move || {
            loop {
                let sig = signals::wait(&set);
                clock::log("load", &format!("{} received, stopping", signals::name(sig)));
                shared.stop.store(true, Ordering::SeqCst);
            }
        });
    }

    let (result_tx, result_rx) = mpsc::channel::<Record>();
    let writer = std::thread::spawn(move || write_csv(file, result_rx));

    let close = if opts.keep_alive { "" } else { "Connection: close\r\n" };
    let request = format!("GET / HTTP/1.1\r\nHost: {}\r\nUser-Agent: st-testapp-load\r\n{close}\r\n", opts.target);
    let keep_alive = opts.keep_alive;
    let request: Arc<[u8]> = Arc::from(request.into_bytes());
    let timeout = Duration::from_millis(opts.timeout_ms);
    let t0 = Instant::now();
    let t0_unix_micros = clock::unix_micros();

    let (job_tx, job_rx) = mpsc::channel::<Job>();
    let job_rx = Arc::new(Mutex::new(job_rx));
    let mut workers = Vec::with_capacity(opts.workers);
    for _ in 0..opts.workers {
        let job_rx = Arc::clone(&job_rx);
        let result_tx = result_tx.clone();
        let shared = Arc::clone(&shared);
        let request = Arc::clone(&request);
        let prefix = opts.expect_prefix.clone();
        let addr = opts.addr;
        let spawned = std::thread::Builder::new().stack_size(WORKER_STACK_BYTES).spawn(move || {
            // this worker's persistent connection (`--keep-alive`)
            let mut pooled: Option<Pooled> = None;
            loop {
                let job = match job_rx.lock().unwrap_or_else(|e| e.into_inner()).recv() {
                    Ok(job) => job,
                    Err(_) => return,
                };
                let started = Instant::now();
                let delay = started.saturating_duration_since(job.at);
                if delay > LATE_START {
                    shared.late_starts.fetch_add(1, Ordering::Relaxed);
                }
                shared.max_start_delay_micros.fetch_max(delay.as_micros() as u64, Ordering::Relaxed);
                // A job that already waited longer than the timeout for a free
                // worker could not have been answered in time: not sent (this
                // also bounds the final wait after the schedule ends).
                let (outcome, pod, detail, local_port, reused) = if delay > timeout {
                    shared.not_sent.fetch_add(1, Ordering::Relaxed);
                    let waited_ms = delay.as_millis();
                    (Outcome::Timeout, String::new(), format!("not sent: waited {waited_ms} ms for a free worker (load generator overloaded)"), 0, false)
                } else {
                    one_request(addr, &request, timeout, prefix.as_deref(), keep_alive.then_some(&mut pooled))
                };
                let record = Record {
                    at_unix_micros: job.at_unix_micros,
                    latency: Instant::now().saturating_duration_since(job.at),
                    outcome,
                    pod,
                    detail,
                    local_port,
                    reused,
                };
                if result_tx.send(record).is_err() {
                    return;
                }
            }
        });
        match spawned {
            Ok(handle) => workers.push(handle),
            Err(e) => clock::log("load", &format!("cannot start worker: {e}")),
        }
    }
    drop(result_tx);
    if workers.is_empty() {
        return 1;
    }
    clock::log(
        "load",
        &format!(
            "start target={} rate_per_second={} timeout_ms={} duration_seconds={} workers={} out={}",
            opts.target,
            opts.rate_per_second,
            opts.timeout_ms,
            opts.duration_seconds.map(|d| d.to_string()).unwrap_or_else(|| "until-signal".to_string()),
            workers.len(),
            opts.out
        ),
    );

    // The open-loop schedule.
    let duration_nanos = opts.duration_seconds.map(|d| (d * 1e9).round() as u128);
    let mut scheduled = 0u64;
    'schedule: loop {
        let offset_nanos = (scheduled as f64 * 1e9 / opts.rate_per_second).round() as u128;
        if duration_nanos.is_some_and(|d| offset_nanos >= d) {
            break;
        }
        let offset = Duration::from_nanos(offset_nanos as u64);
        let at = t0 + offset;
        loop {
            if shared.stop.load(Ordering::SeqCst) {
                break 'schedule;
            }
            let now = Instant::now();
            if now >= at {
                break;
            }
            std::thread::sleep((at - now).min(MAX_SCHEDULER_SLEEP));
        }
        let job = Job { at, at_unix_micros: t0_unix_micros + offset.as_micros() as u64 };
        if job_tx.send(job).is_err() {
            break;
        }
        scheduled += 1;
    }
    drop(job_tx);
    for w in workers {
        let _ = w.join();
    }
    let counts = match writer.join() {
        Ok(Ok(counts)) => counts,
        Ok(Err(e)) => {
            clock::log("load", &format!("writing {}: {e}", opts.out));
            return 1;
        }
        Err(_) => return 1,
    };
    let mut summary = format!("done requests={scheduled}");
    for (o, n) in OUTCOMES.iter().zip(counts.iter()) {
        summary.push_str(&format!(" {}={n}", o.as_str()));
    }
    summary.push_str(&format!(
        " not_sent={} late_starts={} max_start_delay_ms={:.3} out={}",
        shared.not_sent.load(Ordering::Relaxed),
        shared.late_starts.load(Ordering::Relaxed),
        shared.max_start_delay_micros.load(Ordering::Relaxed) as f64 / 1000.0,
        opts.out
    ));
    clock::log("load", &summary);
    0
}

/// Writes the rows as they come, flushing at least once a second; returns the
/// count per outcome (index as in [`OUTCOMES`]).
fn write_csv(file: File, rx: mpsc::Receiver<Record>) -> std::io::Result<[u64; OUTCOMES.len()]> {
    let mut out = BufWriter::with_capacity(64 * 1024, file);
    let mut counts = [0u64; OUTCOMES.len()];
    writeln!(out, "{CSV_HEADER}")?;
    let mut last_flush = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(r) => {
                let i = OUTCOMES.iter().position(|o| *o == r.outcome).unwrap_or(0);
                counts[i] += 1;
                writeln!(
                    out,
                    "{}.{:06},{:.3},{},{},{},{},{}",
                    r.at_unix_micros / 1_000_000,
                    r.at_unix_micros % 1_000_000,
                    r.latency.as_secs_f64() * 1000.0,
                    r.outcome.as_str(),
                    csv_escape(&r.pod),
                    csv_escape(&r.detail),
                    r.local_port,
                    u8::from(r.reused)
                )?;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if last_flush.elapsed() >= Duration::from_secs(1) {
            out.flush()?;
            last_flush = Instant::now();
        }
    }
    out.flush()?;
    Ok(counts)
}

/// Quotes a CSV field when it holds a comma, quote, CR or LF.
fn csv_escape(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) { format!("\"{}\"", field.replace('"', "\"\"")) } else { field.to_string() }
}

/// A worker's persistent connection and its source port.
struct Pooled {
    stream: TcpStream,
    port: u16,
}

/// Sends one request and classifies the result: returns (outcome, pod,
/// detail, local port, reused). Without `pool` on a new connection; with it
/// on the pooled connection when there is one the server has not closed, and
/// the connection goes back to the pool after a complete answer without
/// `Connection: close`.
fn one_request(
    addr: SocketAddr,
    request: &[u8],
    timeout: Duration,
    prefix: Option<&str>,
    pool: Option<&mut Option<Pooled>>,
) -> (Outcome, String, String, u16, bool) {
    let start = Instant::now();
    let keep_alive = pool.is_some();
    let mut slot = None;
    let pool = pool.unwrap_or(&mut slot);
    let (mut conn, reused) = match pool.take().filter(|c| still_open(&c.stream)) {
        Some(c) => (c, true),
        None => match connect(addr, timeout) {
            (Ok(stream), port) => (Pooled { stream, port }, false),
            (Err(e), port) => {
                let (outcome, pod, detail) = classify_error("connect", &e, false);
                return (outcome, pod, detail, port, false);
            }
        },
    };
    let (outcome, pod, detail, reusable) = exchange(&mut conn.stream, request, start, timeout, prefix, keep_alive);
    let port = conn.port;
    if keep_alive && reusable && outcome == Outcome::Ok {
        *pool = Some(conn);
    }
    (outcome, pod, detail, port, reused)
}

/// Whether an idle pooled connection is still open: no EOF, error or stray
/// byte waiting on it.
fn still_open(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let open = matches!(stream.peek(&mut [0u8; 1]), Err(e) if e.kind() == ErrorKind::WouldBlock);
    stream.set_nonblocking(false).is_ok() && open
}

/// The length of the complete response at the start of `buf` and whether the
/// server closes the connection after it, once its head and its
/// `Content-Length` body are in; None before that, or when it has no usable
/// `Content-Length` (then it ends at EOF).
fn complete_response(buf: &[u8]) -> Option<(usize, bool)> {
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..head_end]);
    let length = header(&head, "content-length")?.parse::<usize>().ok()?;
    let close = header(&head, "connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
    let end = head_end.checked_add(length)?;
    (buf.len() >= end).then_some((end, close))
}

/// The value of the first header `name` in a response head, trimmed.
fn header<'h>(head: &'h str, name: &'h str) -> Option<&'h str> {
    headers(head, name).next()
}

/// The values of every header `name` (any case) in a response head, trimmed.
fn headers<'h>(head: &'h str, name: &'h str) -> impl Iterator<Item = &'h str> {
    head.split("\r\n").skip(1).filter_map(|line| line.split_once(':')).filter(move |(n, _)| n.trim().eq_ignore_ascii_case(name)).map(|(_, v)| v.trim())
}

/// Opens a TCP connection to `addr` within `timeout`: the stream or the error,
/// and the source port the kernel chose when the SYN was sent (0 when none
/// was: the socket could not be made). Non-blocking connect, then `poll` for
/// writability and `SO_ERROR`, as `TcpStream::connect_timeout` does, but with
/// the port read while the attempt is in flight (a refused attempt's socket
/// loses its port).
fn connect(addr: SocketAddr, timeout: Duration) -> (std::io::Result<TcpStream>, u16) {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::os::fd::AsRawFd;
    let deadline = Instant::now() + timeout;
    let socket = match Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)) {
        Ok(s) => s,
        Err(e) => return (Err(e), 0),
    };
    let port = |s: &Socket| s.local_addr().ok().and_then(|a| a.as_socket()).map_or(0, |a| a.port());
    if let Err(e) = socket.set_nonblocking(true) {
        return (Err(e), 0);
    }
    match socket.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return (Err(e), port(&socket)),
    }
    let local_port = port(&socket);
    let mut fd = libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (Err(std::io::Error::new(ErrorKind::TimedOut, "connection timed out")), local_port);
        }
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `fd` is one valid pollfd for the socket this function owns.
        match unsafe { libc::poll(&mut fd, 1, ms) } {
            n if n > 0 => break,
            0 => {}
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != ErrorKind::Interrupted {
                    return (Err(e), local_port);
                }
            }
        }
    }
    match socket.take_error() {
        Ok(Some(e)) | Err(e) => return (Err(e), local_port),
        Ok(None) => {}
    }
    if let Err(e) = socket.set_nonblocking(false) {
        return (Err(e), local_port);
    }
    (Ok(socket.into()), local_port)
}

/// Sends the request on a connected stream and reads the answer, all within
/// `timeout` of `start` (before the connect): to EOF, or with `framed` up to
/// the end of the first complete response. Returns (outcome, pod, detail,
/// whether the connection can carry another request).
fn exchange(stream: &mut TcpStream, request: &[u8], start: Instant, timeout: Duration, prefix: Option<&str>, framed: bool) -> (Outcome, String, String, bool) {
    let fail = |(o, p, d): (Outcome, String, String)| (o, p, d, false);
    let remaining = |start: Instant| timeout.checked_sub(start.elapsed()).filter(|d| !d.is_zero());
    let _ = stream.set_nodelay(true);
    let Some(left) = remaining(start) else {
        return (Outcome::Timeout, String::new(), "connect: timed out".to_string(), false);
    };
    let _ = stream.set_write_timeout(Some(left));
    if let Err(e) = stream.write_all(request) {
        return fail(classify_error("send", &e, false));
    }
    let mut reusable = false;
    let mut response: Vec<u8> = Vec::with_capacity(512);
    let mut chunk = [0u8; 4096];
    loop {
        let Some(left) = remaining(start) else {
            return (Outcome::Timeout, String::new(), format!("read: timed out after {} response bytes", response.len()), false);
        };
        let _ = stream.set_read_timeout(Some(left));
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                response.extend_from_slice(&chunk[..n]);
                if response.len() > MAX_RESPONSE_BYTES {
                    return (Outcome::BadAnswer, String::new(), format!("response longer than {MAX_RESPONSE_BYTES} bytes"), false);
                }
                if framed && let Some((end, close)) = complete_response(&response) {
                    // a byte past the answer is a broken exchange: not reused
                    reusable = !close && end == response.len();
                    response.truncate(end);
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return fail(classify_error("read", &e, !response.is_empty())),
        }
    }
    if response.is_empty() {
        return (Outcome::Empty, String::new(), "connection closed without a response".to_string(), false);
    }
    let (outcome, pod, detail) = classify_response(&response, prefix);
    (outcome, pod, detail, reusable)
}

/// Maps a socket error to an outcome.
fn classify_error(stage: &str, e: &std::io::Error, got_bytes: bool) -> (Outcome, String, String) {
    let outcome = match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => Outcome::Refused,
        Some(libc::ECONNRESET) | Some(libc::EPIPE) => Outcome::Reset,
        Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => Outcome::Unreachable,
        Some(libc::ETIMEDOUT) | Some(libc::EAGAIN) => Outcome::Timeout,
        _ if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => Outcome::Timeout,
        _ => Outcome::BadAnswer,
    };
    let after = if got_bytes { " (after response bytes)" } else { "" };
    (outcome, String::new(), format!("{stage}: {e}{after}"))
}

/// Classifies a complete response (the server closed the connection).
fn classify_response(response: &[u8], prefix: Option<&str>) -> (Outcome, String, String) {
    let bad = |detail: String| (Outcome::BadAnswer, String::new(), detail);
    let Some(head_end) = response.windows(4).position(|w| w == b"\r\n\r\n") else {
        return bad(format!("incomplete response: {}", first_line(response)));
    };
    let head = String::from_utf8_lossy(&response[..head_end]);
    let status_line = head.split("\r\n").next().unwrap_or("").to_string();
    let mut parts = status_line.splitn(3, ' ');
    let (version, code) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if !version.starts_with("HTTP/1.") {
        return bad(format!("not an HTTP response: {status_line}"));
    }
    if code != "200" {
        return bad(status_line);
    }
    let mut body = &response[head_end + 4..];
    for value in headers(&head, "content-length") {
        match value.parse::<usize>() {
            Ok(n) if n <= body.len() => body = &body[..n],
            Ok(n) => return bad(format!("truncated body: {} of {n} bytes", body.len())),
            Err(_) => return bad(format!("malformed Content-Length: {value}")),
        }
    }
    let text = String::from_utf8_lossy(body);
    let pod = text.trim_end_matches(['\n', '\r']);
    if !is_pod_name(pod) {
        let shown: String = pod.chars().take(64).collect();
        return bad(format!("body is not a pod name: {shown:?}"));
    }
    if let Some(p) = prefix
        && !pod.starts_with(p)
    {
        return (Outcome::BadAnswer, pod.to_string(), format!("pod name without prefix {p:?}"));
    }
    (Outcome::Ok, pod.to_string(), String::new())
}

/// A Kubernetes object name (DNS-1123 subdomain-like): 1..=253 of
/// `[A-Za-z0-9._-]`.
fn is_pod_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
}

/// The first line of a response for error details.
fn first_line(response: &[u8]) -> String {
    let text = String::from_utf8_lossy(response);
    let line = text.split(['\r', '\n']).next().unwrap_or("");
    line.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_escape_quotes_only_when_needed() {
        assert_eq!(csv_escape("plain"), "plain");
        assert_eq!(csv_escape("a,b"), "\"a,b\"");
        assert_eq!(csv_escape("say \"hi\""), "\"say \"\"hi\"\"\"");
    }

    #[test]
    fn classify_response_cases() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nweb-1\n";
        assert_eq!(classify_response(ok, Some("web-")).0, Outcome::Ok);
        assert_eq!(classify_response(ok, Some("web-")).1, "web-1");
        assert_eq!(classify_response(ok, Some("api-")).0, Outcome::BadAnswer);
        let not_found = b"HTTP/1.1 503 Service Unavailable\r\n\r\n";
        let r = classify_response(not_found, None);
        assert_eq!((r.0, r.2.as_str()), (Outcome::BadAnswer, "HTTP/1.1 503 Service Unavailable"));
        assert_eq!(classify_response(b"HTTP/1.1 200 OK\r\n\r\nhello world\n", None).0, Outcome::BadAnswer);
        assert_eq!(classify_response(b"HTTP/1.1 200", None).0, Outcome::BadAnswer);
        let truncated = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nweb\n";
        assert_eq!(classify_response(truncated, None).0, Outcome::BadAnswer);
    }
}
