//! `st-testapp serve`: answers, keep-alive, bad input, and the two shutdown
//! behaviours (default: exit at once cutting in-flight requests; graceful:
//! refuse new connections, finish in-flight ones, exit).

mod common;

use common::{Server, get, status_and_body};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

#[test]
fn answers_root_with_pod_name_and_healthz_with_ok() {
    let server = Server::start("web-test-1", &[]);
    let (code, body) = status_and_body(&get(server.addr, "/").unwrap());
    assert_eq!((code, body.as_str()), (200, "web-test-1\n"));
    let (code, body) = status_and_body(&get(server.addr, "/healthz").unwrap());
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let (code, _) = status_and_body(&get(server.addr, "/nope").unwrap());
    assert_eq!(code, 404);
    let (code, body) = status_and_body(&get(server.addr, "/sleep/50").unwrap());
    assert_eq!((code, body.as_str()), (200, "web-test-1\n"));
    let (code, _) = status_and_body(&get(server.addr, "/sleep/abc").unwrap());
    assert_eq!(code, 400);
}

#[test]
fn keep_alive_serves_two_requests_on_one_connection() {
    let server = Server::start("web-ka", &[]);
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let expected = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\nok\n";
    let mut first = vec![0u8; expected.len()];
    s.read_exact(&mut first).unwrap();
    assert_eq!(String::from_utf8_lossy(&first), String::from_utf8_lossy(expected));
    // Same connection, now asking to close: answered, then EOF.
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    let (code, body) = status_and_body(&rest);
    assert_eq!((code, body.as_str()), (200, "web-ka\n"));
    assert!(String::from_utf8_lossy(&rest).contains("Connection: close\r\n"));
}

#[test]
fn malformed_request_gets_400_and_the_connection_is_closed() {
    let server = Server::start("web-bad", &[]);
    for bad in [&b"garbage\r\n\r\n"[..], b"GET / HTTP/9.9\r\n\r\n", b"GET / HTTP/1.1\r\nno colon here\r\n\r\n", b"\xff\xfe / HTTP/1.1\r\n\r\n"] {
        let mut s = TcpStream::connect(server.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(bad).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap(); // EOF: the server closed it
        let (code, _) = status_and_body(&out);
        assert_eq!(code, 400, "for {bad:?}");
    }
    // Still serving afterwards.
    let (code, _) = status_and_body(&get(server.addr, "/").unwrap());
    assert_eq!(code, 200);
}

#[test]
fn default_sigterm_exits_within_300ms_and_cuts_in_flight_request() {
    let mut server = Server::start("web-nograce", &[]);
    let addr = server.addr;
    let in_flight = std::thread::spawn(move || get(addr, "/sleep/2000"));
    std::thread::sleep(Duration::from_millis(200)); // the request is being served
    server.signal(libc::SIGTERM);
    let (code, waited) = server.wait_exit(Duration::from_secs(5));
    assert_eq!(code, Some(0));
    assert!(waited < Duration::from_millis(300), "exit took {waited:?}");
    // The in-flight request was cut: EOF without any byte (or an error).
    match in_flight.join().unwrap() {
        Ok(bytes) => assert!(bytes.is_empty(), "got an answer: {:?}", String::from_utf8_lossy(&bytes)),
        Err(e) => assert!(matches!(e.kind(), ErrorKind::ConnectionReset), "unexpected error {e}"),
    }
    let lines: Vec<String> = server.lines.try_iter().collect();
    assert!(lines.iter().any(|l| l.contains("SIGTERM received")), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("listener closed")), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("exit (no graceful shutdown)")), "{lines:?}");
}

#[test]
fn graceful_sigterm_refuses_new_connections_and_finishes_in_flight_request() {
    let mut server = Server::start("web-grace", &["--graceful", "--drain-timeout-ms", "5000"]);
    let addr = server.addr;
    let in_flight = std::thread::spawn(move || {
        let r = get(addr, "/sleep/500");
        (r, Instant::now())
    });
    std::thread::sleep(Duration::from_millis(150));
    let signalled = Instant::now();
    server.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(50));
    // New connections are refused right away.
    let err = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect_err("connect after SIGTERM must fail");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
    // The in-flight request is answered, then the process exits.
    let (response, _answered) = in_flight.join().unwrap();
    let (code, body) = status_and_body(&response.expect("in-flight request answered"));
    assert_eq!((code, body.as_str()), (200, "web-grace\n"));
    let (exit, _) = server.wait_exit(Duration::from_secs(5));
    let exited = Instant::now();
    assert_eq!(exit, Some(0));
    let total = exited - signalled;
    assert!(total >= Duration::from_millis(250), "exited too early: {total:?}");
    assert!(total < Duration::from_secs(2), "drain took {total:?}");
    let lines: Vec<String> = server.lines.try_iter().collect();
    assert!(lines.iter().any(|l| l.contains("exit (drained) open_connections=0")), "{lines:?}");
}

#[test]
fn graceful_drain_is_bounded_by_the_drain_timeout() {
    let mut server = Server::start("web-slow", &["--graceful", "--drain-timeout-ms", "300"]);
    let addr = server.addr;
    let in_flight = std::thread::spawn(move || get(addr, "/sleep/5000"));
    std::thread::sleep(Duration::from_millis(150));
    server.signal(libc::SIGTERM);
    let (exit, waited) = server.wait_exit(Duration::from_secs(5));
    assert_eq!(exit, Some(0));
    assert!(waited >= Duration::from_millis(250) && waited < Duration::from_millis(1500), "{waited:?}");
    let cut = in_flight.join().unwrap().unwrap_or_default();
    assert!(cut.is_empty(), "got an answer after the drain timeout");
}
