//! `st-testapp load`: count and classification of requests against real and
//! misbehaving servers on 127.0.0.1.

mod common;

use common::{BIN, Server, forward_lines, read_csv, run_load, send_signal, wait_exit};
use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::time::Duration;

const HEADER: &str = "t_unix_seconds,latency_ms,outcome,pod,detail,local_port,reused";

/// Every row has outcome `outcome`; returns the rows' details for messages.
fn assert_all(rows: &[common::Row], outcome: &str) {
    for r in rows {
        assert_eq!(r.outcome, outcome, "row {r:?}");
    }
}

#[test]
fn against_serve_all_ok_with_rate_times_duration_requests() {
    let server = Server::start("web-load-1", &[]);
    let target = server.addr.to_string();
    let (header, mut rows, summary) = run_load(&["--target", &target, "--rate-per-second", "200", "--duration-seconds", "1.5", "--expect-prefix", "web-"]);
    assert_eq!(header, HEADER);
    assert!((299..=301).contains(&rows.len()), "{} rows", rows.len());
    assert_all(&rows, "ok");
    assert!(rows.iter().all(|r| r.pod == "web-load-1" && r.detail.is_empty() && r.latency_ms > 0.0));
    // every connection's source port, as the kernel chose it; a new connection each
    assert!(rows.iter().all(|r| r.local_port > 0 && !r.reused), "{rows:?}");
    // Scheduled times are 5 ms apart (open loop), whatever the latency.
    rows.sort_by(|a, b| a.t_unix_seconds.total_cmp(&b.t_unix_seconds));
    for pair in rows.windows(2) {
        let gap_ms = (pair[1].t_unix_seconds - pair[0].t_unix_seconds) * 1000.0;
        assert!((gap_ms - 5.0).abs() < 0.01, "gap {gap_ms}");
    }
    assert!(summary.contains(&format!("requests={} ok={}", rows.len(), rows.len())), "{summary}");
}

/// A port nothing listens on.
fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[test]
fn closed_port_gives_refused() {
    let target = closed_port().to_string();
    let (_, rows, summary) = run_load(&["--target", &target, "--rate-per-second", "20", "--duration-seconds", "0.5"]);
    assert_eq!(rows.len(), 10);
    assert_all(&rows, "refused");
    assert!(rows[0].detail.contains("connect:"), "{:?}", rows[0]);
    assert!(summary.contains("refused=10"), "{summary}");
    // the source port of a refused attempt, read while it was in flight (a refused socket
    // loses it)
    assert!(rows.iter().all(|r| r.local_port > 0), "{rows:?}");
}

#[test]
fn listener_that_never_answers_gives_timeout() {
    // Never accepted: the kernel completes the handshake from the backlog and
    // nobody ever answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = listener.local_addr().unwrap().to_string();
    let (_, rows, _) = run_load(&["--target", &target, "--rate-per-second", "20", "--duration-seconds", "0.5", "--timeout-ms", "200"]);
    assert_eq!(rows.len(), 10);
    assert_all(&rows, "timeout");
    for r in &rows {
        assert!(r.latency_ms >= 199.0 && r.latency_ms < 1000.0, "{r:?}");
    }
    drop(listener);
}

/// Accepts connections and handles each with `f` on its own thread.
fn test_server(f: fn(std::net::TcpStream)) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            std::thread::spawn(move || f(s));
        }
    });
    addr
}

/// Reads until the end of the request head.
fn read_request(s: &mut std::net::TcpStream) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

#[test]
fn server_closing_with_linger_zero_gives_reset() {
    let addr = test_server(|s| {
        // SO_LINGER {on, 0}: close() sends RST instead of FIN.
        let linger = libc::linger { l_onoff: 1, l_linger: 0 };
        // SAFETY: valid fd and option struct.
        unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&s),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                &linger as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
        }
        drop(s);
    });
    let (_, rows, _) = run_load(&["--target", &addr.to_string(), "--rate-per-second", "20", "--duration-seconds", "0.5"]);
    assert_eq!(rows.len(), 10);
    // Observed: always `reset` (ECONNRESET on read, or on send when the RST
    // arrived first), never `empty`: an RST is not a clean EOF.
    assert_all(&rows, "reset");
}

#[test]
fn server_closing_without_answer_gives_empty() {
    let addr = test_server(|mut s| {
        read_request(&mut s);
        drop(s); // FIN, no byte
    });
    let (_, rows, _) = run_load(&["--target", &addr.to_string(), "--rate-per-second", "20", "--duration-seconds", "0.5"]);
    assert_eq!(rows.len(), 10);
    assert_all(&rows, "empty");
}

#[test]
fn answer_from_no_pod_gives_bad_answer() {
    let addr = test_server(|mut s| {
        read_request(&mut s);
        let _ = std::io::Write::write_all(&mut s, b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nother\n");
    });
    let (_, rows, summary) = run_load(&["--target", &addr.to_string(), "--rate-per-second", "20", "--duration-seconds", "0.5", "--expect-prefix", "web-"]);
    assert_eq!(rows.len(), 10);
    assert_all(&rows, "bad_answer");
    assert!(rows.iter().all(|r| r.pod == "other" && r.detail.contains("prefix")), "{:?}", rows[0]);
    assert!(summary.contains("bad_answer=10"), "{summary}");
}

#[test]
fn non_200_gives_bad_answer_with_status_line() {
    let addr = test_server(|mut s| {
        read_request(&mut s);
        let _ = std::io::Write::write_all(&mut s, b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n");
    });
    let (_, rows, _) = run_load(&["--target", &addr.to_string(), "--rate-per-second", "20", "--duration-seconds", "0.2"]);
    assert_eq!(rows.len(), 4);
    assert_all(&rows, "bad_answer");
    assert_eq!(rows[0].detail, "HTTP/1.1 503 Service Unavailable");
}

#[test]
fn sigterm_stops_the_run_and_flushes() {
    let server = Server::start("web-stop", &[]);
    let dir = std::env::temp_dir().join(format!("st-testapp-stop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("load.csv");
    let mut child = Command::new(BIN)
        .args(["load", "--target", &server.addr.to_string(), "--rate-per-second", "100", "--out"])
        .arg(&out)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = forward_lines(child.stderr.take().unwrap());
    std::thread::sleep(Duration::from_millis(700));
    send_signal(&child, libc::SIGTERM);
    let (code, _) = wait_exit(&mut child, Duration::from_secs(5));
    assert_eq!(code, Some(0));
    let (header, rows) = read_csv(&out);
    assert_eq!(header, HEADER);
    assert!((40..=90).contains(&rows.len()), "{} rows", rows.len());
    assert_all(&rows, "ok");
    std::thread::sleep(Duration::from_millis(50));
    let summary: Vec<String> = lines.try_iter().filter(|l| l.contains("done requests=")).collect();
    assert_eq!(summary.len(), 1, "{summary:?}");
    assert!(summary[0].contains(&format!("requests={} ok={}", rows.len(), rows.len())), "{summary:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn overloaded_generator_records_unsent_requests_as_timeout_and_stays_bounded() {
    // One worker, a target that never answers: every request holds the worker
    // for the whole timeout, so later ones wait longer than the timeout for it.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = listener.local_addr().unwrap().to_string();
    let started = std::time::Instant::now();
    let (_, rows, summary) = run_load(&["--target", &target, "--rate-per-second", "20", "--duration-seconds", "0.5", "--timeout-ms", "200", "--workers", "1"]);
    let took = started.elapsed();
    assert_eq!(rows.len(), 10);
    assert_all(&rows, "timeout");
    let unsent = rows.iter().filter(|r| r.detail.starts_with("not sent: waited")).count();
    assert!(rows.iter().filter(|r| r.detail.starts_with("not sent")).all(|r| r.local_port == 0), "{rows:?}");
    assert!(rows.iter().filter(|r| !r.detail.starts_with("not sent")).all(|r| r.local_port > 0), "{rows:?}");
    assert!(unsent >= 3, "{unsent} unsent: {rows:?}");
    assert!(summary.contains(&format!("not_sent={unsent} ")), "{summary}");
    // Unsent rows keep their scheduled time; their latency includes the wait.
    assert!(rows.iter().filter(|r| r.detail.starts_with("not sent")).all(|r| r.latency_ms > 200.0));
    assert!(took < Duration::from_secs(3), "{took:?}");
    drop(listener);
}

#[test]
fn keep_alive_reuses_each_workers_connection() {
    let server = Server::start("web-keep-1", &[]);
    let target = server.addr.to_string();
    let (_, rows, _) =
        run_load(&["--target", &target, "--rate-per-second", "100", "--duration-seconds", "1", "--workers", "3", "--keep-alive", "--expect-prefix", "web-"]);
    assert_eq!(rows.len(), 100);
    assert_all(&rows, "ok");
    // at most one connection per worker, each reused after its first request
    let ports: std::collections::BTreeSet<u16> = rows.iter().map(|r| r.local_port).collect();
    assert!(!ports.is_empty() && ports.len() <= 3 && !ports.contains(&0), "{ports:?}");
    assert_eq!(rows.iter().filter(|r| !r.reused).count(), ports.len(), "{rows:?}");
}

#[test]
fn keep_alive_does_not_reuse_what_the_server_closed() {
    // answers one request per connection with keep-alive, then closes the idle connection
    // 20 ms later: each next request (200 ms apart) must go out on a new connection
    let addr = test_server(|mut s| {
        read_request(&mut s);
        let _ = std::io::Write::write_all(&mut s, b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nweb-9\n");
        std::thread::sleep(Duration::from_millis(20));
    });
    let (_, rows, _) = run_load(&["--target", &addr.to_string(), "--rate-per-second", "5", "--duration-seconds", "1", "--workers", "1", "--keep-alive"]);
    assert_eq!(rows.len(), 5);
    assert_all(&rows, "ok");
    assert!(rows.iter().all(|r| !r.reused && r.local_port > 0), "{rows:?}");
}

#[test]
fn keep_alive_drops_a_connection_the_answer_closes() {
    let addr = test_server(|mut s| {
        read_request(&mut s);
        let _ = std::io::Write::write_all(&mut s, b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 6\r\n\r\nweb-8\n");
        std::thread::sleep(Duration::from_millis(500));
    });
    let (_, rows, _) = run_load(&["--target", &addr.to_string(), "--rate-per-second", "10", "--duration-seconds", "0.5", "--workers", "1", "--keep-alive"]);
    assert_eq!(rows.len(), 5);
    assert_all(&rows, "ok");
    assert!(rows.iter().all(|r| !r.reused), "{rows:?}");
}
