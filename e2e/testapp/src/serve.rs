//! `st-testapp serve`: a small HTTP/1.1 server, one thread per connection.
//!
//! Routes (GET or HEAD):
//! - `/`: 200, body = pod name + `\n` (env `POD_NAME`, else the hostname);
//! - `/healthz`: 200, body `ok\n`;
//! - `/sleep/<ms>`: waits `<ms>` milliseconds, then answers like `/`.
//!
//! Keep-alive is the HTTP/1.1 default (HTTP/1.0: only with
//! `Connection: keep-alive`); `Connection: close` is honoured. A malformed
//! request gets 400 and the connection is closed.
//!
//! Shutdown on SIGTERM/SIGINT:
//! - default (the typical application without graceful shutdown): the
//!   listening socket is shut down at once (new connections are refused) and
//!   the process exits immediately, cutting in-flight requests;
//! - `--graceful`: the listening socket is shut down, in-flight requests are
//!   finished (responses then carry `Connection: close`, idle keep-alive
//!   connections are closed) for at most `--drain-timeout-ms`, then exit 0.
//!
//! Log lines (stderr): `listening`, `<signal> received`, `listener closed`,
//! `exit`, each prefixed with the unix time in seconds with ms.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::{args::Parser, clock, signals};

/// Largest accepted request head (request line + headers), bytes.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Largest accepted request body (read and discarded), bytes.
const MAX_BODY_BYTES: usize = 64 * 1024;
/// Longest `/sleep/<ms>`, milliseconds.
const MAX_SLEEP_MS: u64 = 3_600_000;
/// How often a blocked read wakes up to look at the draining flag.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// An idle keep-alive connection is closed after this long.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// While draining, a connection that has not sent its first request is still
/// given this long to send it (it was accepted before the listener closed).
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);
/// Stack size of connection threads, bytes.
const CONN_STACK_BYTES: usize = 128 * 1024;

/// Options of `serve`.
pub struct Options {
    /// Address to listen on (port 0 picks a free port; the log line names it).
    pub listen: SocketAddr,
    /// Drain in-flight requests on SIGTERM instead of exiting at once.
    pub graceful: bool,
    /// Upper bound of the graceful drain, milliseconds.
    pub drain_timeout_ms: u64,
}

impl Options {
    /// Parses the arguments after `serve`.
    pub fn parse(args: &[String]) -> Result<Options, String> {
        let mut p = Parser::new(args);
        let graceful = p.switch("--graceful");
        let listen = p.value("--listen")?.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8080)));
        let drain_timeout_ms = p.value("--drain-timeout-ms")?.unwrap_or(5000);
        p.finish()?;
        Ok(Options { listen, graceful, drain_timeout_ms })
    }
}

/// State shared by the accept loop, the signal thread and connections.
struct Shared {
    /// Set once SIGTERM/SIGINT arrived.
    draining: AtomicBool,
    /// Connections currently open (each has a thread).
    active: AtomicUsize,
    /// Body of `/` and `/sleep/<ms>` answers (pod name + `\n`).
    pod_body: String,
}

/// Runs the server until a signal ends the process; returns 1 when the
/// listener cannot be bound.
pub fn run(opts: Options) -> u8 {
    let set = signals::block(&[libc::SIGTERM, libc::SIGINT]);
    let listener = match TcpListener::bind(opts.listen) {
        Ok(l) => l,
        Err(e) => {
            clock::log("serve", &format!("cannot listen on {}: {e}", opts.listen));
            return 1;
        }
    };
    let local = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let pod = pod_name();
    let shared = Arc::new(Shared { draining: AtomicBool::new(false), active: AtomicUsize::new(0), pod_body: format!("{pod}\n") });
    clock::log("serve", &format!("listening addr={local} pod={pod} graceful={} drain_timeout_ms={}", opts.graceful, opts.drain_timeout_ms));

    let listen_fd = listener.as_raw_fd();
    {
        let shared = Arc::clone(&shared);
        std::thread::spawn(move || on_signal(&set, listen_fd, &shared, opts.graceful, opts.drain_timeout_ms));
    }

    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                shared.active.fetch_add(1, Ordering::SeqCst);
                let guard = ActiveGuard(Arc::clone(&shared));
                let spawned = std::thread::Builder::new().stack_size(CONN_STACK_BYTES).spawn(move || handle(stream, &guard.0));
                if let Err(e) = spawned {
                    clock::log("serve", &format!("cannot start connection thread: {e}"));
                }
            }
            Err(_) if shared.draining.load(Ordering::SeqCst) => break,
            Err(e) => {
                clock::log("serve", &format!("accept: {e}"));
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    drop(listener);
    // The signal thread ends the process.
    loop {
        std::thread::park();
    }
}

/// Decrements the open-connection count when a connection ends.
struct ActiveGuard(Arc<Shared>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Waits for SIGTERM/SIGINT, shuts the listener down, drains when graceful and
/// exits the process.
fn on_signal(set: &signals::Set, listen_fd: i32, shared: &Shared, graceful: bool, drain_timeout_ms: u64) {
    let sig = signals::wait(set);
    let received = Instant::now();
    clock::log("serve", &format!("{} received", signals::name(sig)));
    shared.draining.store(true, Ordering::SeqCst);
    // shutdown() on a listening socket stops it listening (new SYNs are
    // refused) and wakes the accept loop, which then closes it.
    // SAFETY: the fd stays open until the accept loop has seen the error.
    unsafe { libc::shutdown(listen_fd, libc::SHUT_RDWR) };
    clock::log("serve", "listener closed");
    if graceful {
        let deadline = received + Duration::from_millis(drain_timeout_ms);
        while shared.active.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let open = shared.active.load(Ordering::SeqCst);
    let how = if !graceful {
        "no graceful shutdown"
    } else if open == 0 {
        "drained"
    } else {
        "drain timeout"
    };
    clock::log("serve", &format!("exit ({how}) open_connections={open} after_ms={}", received.elapsed().as_millis()));
    std::process::exit(0);
}

/// The pod name: env `POD_NAME`, else /proc/sys/kernel/hostname, else
/// `unknown`.
fn pod_name() -> String {
    if let Ok(name) = std::env::var("POD_NAME")
        && !name.trim().is_empty()
    {
        return name.trim().to_string();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "unknown".to_string())
}

/// What reading a request head produced.
enum Head {
    /// A complete head of this many bytes (including the blank line) is at
    /// the start of the buffer.
    Complete(usize),
    /// The connection is to be closed without an answer (EOF, error, idle).
    Close,
    /// The head is larger than [`MAX_HEAD_BYTES`].
    TooLarge,
}

/// Serves one connection until it is closed.
fn handle(mut stream: TcpStream, shared: &Shared) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(POLL_INTERVAL));
    let accepted = Instant::now();
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut served = 0u64;
    loop {
        let head_len = match read_head(&mut stream, &mut buf, shared, served, accepted) {
            Head::Complete(n) => n,
            Head::Close => return,
            Head::TooLarge => {
                let _ = respond(&mut stream, 431, "request head too large\n", false, false);
                return;
            }
        };
        let request = match parse_request(&buf[..head_len]) {
            Ok(r) => r,
            Err(why) => {
                let _ = respond(&mut stream, 400, &format!("bad request: {why}\n"), false, false);
                return;
            }
        };
        if request.content_length > MAX_BODY_BYTES {
            let _ = respond(&mut stream, 413, "request body too large\n", false, false);
            return;
        }
        // Read (and discard) the body.
        let total = head_len + request.content_length;
        while buf.len() < total {
            match read_some(&mut stream, &mut buf) {
                ReadResult::Data => {}
                ReadResult::Idle => continue,
                ReadResult::Closed => return,
            }
        }
        buf.drain(..total);

        let (status, body) = route(&request, shared);
        served += 1;
        let keep_alive = request.keep_alive && !shared.draining.load(Ordering::SeqCst);
        if respond(&mut stream, status, &body, keep_alive, request.head_only).is_err() || !keep_alive {
            return;
        }
    }
}

/// Result of one read.
enum ReadResult {
    /// Bytes were appended to the buffer.
    Data,
    /// The read timed out ([`POLL_INTERVAL`]) without data.
    Idle,
    /// EOF or an error.
    Closed,
}

/// Reads once into `buf`.
fn read_some(stream: &mut TcpStream, buf: &mut Vec<u8>) -> ReadResult {
    let mut chunk = [0u8; 4096];
    match stream.read(&mut chunk) {
        Ok(0) => ReadResult::Closed,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            ReadResult::Data
        }
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => ReadResult::Idle,
        Err(_) => ReadResult::Closed,
    }
}

/// Reads until `buf` starts with a complete request head.
fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>, shared: &Shared, served: u64, accepted: Instant) -> Head {
    let mut last_data = Instant::now();
    loop {
        if let Some(pos) = find_blank_line(buf) {
            return Head::Complete(pos);
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Head::TooLarge;
        }
        match read_some(stream, buf) {
            ReadResult::Data => last_data = Instant::now(),
            ReadResult::Closed => return Head::Close,
            ReadResult::Idle => {
                if buf.is_empty() && shared.draining.load(Ordering::SeqCst) {
                    // Idle keep-alive connections are closed at once; a fresh
                    // connection still gets a moment for its first request.
                    if served > 0 || accepted.elapsed() > FIRST_REQUEST_GRACE {
                        return Head::Close;
                    }
                }
                if last_data.elapsed() > IDLE_TIMEOUT {
                    return Head::Close;
                }
            }
        }
    }
}

/// Offset just past the first `\r\n\r\n`.
fn find_blank_line(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// The parts of a request the server uses.
struct Request {
    /// Path without the query string.
    path: String,
    /// HEAD: answer without a body.
    head_only: bool,
    /// GET or HEAD.
    method_ok: bool,
    /// The client wants the connection kept open.
    keep_alive: bool,
    /// Bytes of body following the head.
    content_length: usize,
}

/// Parses a request head (request line and headers).
fn parse_request(head: &[u8]) -> Result<Request, String> {
    let text = std::str::from_utf8(head).map_err(|_| "head is not UTF-8".to_string())?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or("");
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err("malformed request line".to_string());
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err("malformed method".to_string());
    }
    if !target.starts_with('/') {
        return Err("target is not an absolute path".to_string());
    }
    let http11 = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        _ => return Err("unsupported HTTP version".to_string()),
    };
    let mut keep_alive = http11;
    let mut content_length = 0usize;
    for line in lines {
        if line.is_empty() {
            continue;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err("header line without a colon".to_string());
        };
        if name.is_empty() || name.contains(|c: char| c.is_whitespace()) {
            return Err("malformed header name".to_string());
        }
        let value = value.trim();
        if name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case("keep-alive") {
                    keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case("content-length") {
            content_length = value.parse().map_err(|_| "malformed Content-Length".to_string())?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err("Transfer-Encoding is not supported".to_string());
        }
    }
    let path = target.split('?').next().unwrap_or(target).to_string();
    Ok(Request { path, head_only: method == "HEAD", method_ok: method == "GET" || method == "HEAD", keep_alive, content_length })
}

/// Status and body for a request.
fn route(request: &Request, shared: &Shared) -> (u16, String) {
    if !request.method_ok {
        return (405, "method not allowed\n".to_string());
    }
    match request.path.as_str() {
        "/" => (200, shared.pod_body.clone()),
        "/healthz" => (200, "ok\n".to_string()),
        path => match path.strip_prefix("/sleep/") {
            Some(ms) => match ms.parse::<u64>() {
                Ok(ms) if ms <= MAX_SLEEP_MS => {
                    std::thread::sleep(Duration::from_millis(ms));
                    (200, shared.pod_body.clone())
                }
                _ => (400, format!("bad request: /sleep/<ms> takes 0..={MAX_SLEEP_MS}\n")),
            },
            None => (404, "not found\n".to_string()),
        },
    }
}

/// Writes one response.
fn respond(stream: &mut TcpStream, status: u16, body: &str, keep_alive: bool, head_only: bool) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: {}\r\n",
        body.len(),
        if keep_alive { "keep-alive" } else { "close" }
    );
    if status == 405 {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    if !head_only {
        out.push_str(body);
    }
    stream.write_all(out.as_bytes())?;
    if !keep_alive {
        // Send FIN right after the response, before the thread unwinds.
        let _ = stream.shutdown(std::net::Shutdown::Write);
    }
    Ok(())
}
