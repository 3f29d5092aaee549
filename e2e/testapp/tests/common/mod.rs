//! Helpers shared by the integration tests: start the built binary, learn the
//! port it listens on, send signals, make raw HTTP requests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Path of the binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_st-testapp");

/// A running `st-testapp serve` and its stderr lines.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    pub lines: mpsc::Receiver<String>,
}

impl Server {
    /// Starts `serve --listen 127.0.0.1:0 <extra>` with POD_NAME=`pod` and
    /// waits for its `listening` line.
    pub fn start(pod: &str, extra: &[&str]) -> Server {
        let mut child = Command::new(BIN)
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .env("POD_NAME", pod)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn serve");
        let lines = forward_lines(child.stderr.take().expect("stderr"));
        let first = lines.recv_timeout(Duration::from_secs(10)).expect("listening line");
        let addr = first.split_whitespace().find_map(|w| w.strip_prefix("addr=")).unwrap_or_else(|| panic!("no addr= in {first:?}")).parse().expect("addr");
        Server { child, addr, lines }
    }

    /// Sends a signal to the server.
    pub fn signal(&self, sig: i32) {
        send_signal(&self.child, sig);
    }

    /// Waits for exit (at most `limit`); returns (exit code, time waited).
    pub fn wait_exit(&mut self, limit: Duration) -> (Option<i32>, Duration) {
        wait_exit(&mut self.child, limit)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `sig` to `child`.
pub fn send_signal(child: &Child, sig: i32) {
    // SAFETY: plain syscall on our own child's pid.
    let rc = unsafe { libc::kill(child.id() as i32, sig) };
    assert_eq!(rc, 0, "kill");
}

/// Polls `child` until it exits or `limit` passes; returns (exit code, time
/// waited); kills it when it overstays.
pub fn wait_exit(child: &mut Child, limit: Duration) -> (Option<i32>, Duration) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return (status.code(), start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Forwards the lines of a child's stderr to a channel (and echoes them for
/// test failure output).
pub fn forward_lines(stderr: ChildStderr) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            eprintln!("[child] {line}");
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Sends `GET path` with `Connection: close` and reads to EOF; returns the
/// raw response bytes (or the I/O error).
pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    Ok(out)
}

/// Splits a response into (status code, body).
pub fn status_and_body(response: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(response);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head end in {text:?}"));
    let code = head.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("status code");
    (code, body.to_string())
}

/// A CSV row of `load` output (detail not unescaped; tests do not need it).
#[derive(Debug)]
pub struct Row {
    pub t_unix_seconds: f64,
    pub latency_ms: f64,
    pub outcome: String,
    pub pod: String,
    pub detail: String,
    /// The connection's source port (0: not sent).
    pub local_port: u16,
    /// Sent on a connection that had served an earlier request.
    pub reused: bool,
}

/// Runs `load` with `args` (plus `--out FILE`) to completion; returns the
/// header, the rows and the last stderr line (the summary).
pub fn run_load(args: &[&str]) -> (String, Vec<Row>, String) {
    let dir = std::env::temp_dir().join(format!("st-testapp-{}-{}", std::process::id(), unique()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let out = dir.join("load.csv");
    let output = Command::new(BIN).arg("load").args(args).arg("--out").arg(&out).output().expect("run load");
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    eprintln!("{stderr}");
    assert!(output.status.success(), "load failed: {stderr}");
    let (header, rows) = read_csv(&out);
    let _ = std::fs::remove_dir_all(&dir);
    (header, rows, stderr.lines().last().unwrap_or("").to_string())
}

/// Reads a `load` CSV file.
pub fn read_csv(path: &std::path::Path) -> (String, Vec<Row>) {
    let text = std::fs::read_to_string(path).expect("read csv");
    let mut lines = text.lines();
    let header = lines.next().unwrap_or("").to_string();
    let rows = lines
        .map(|l| {
            // local_port and reused are last and never quoted; detail before them may hold commas
            let (rest, reused) = l.rsplit_once(',').expect("a reused field");
            let (rest, port) = rest.rsplit_once(',').expect("a local_port field");
            let f: Vec<&str> = rest.splitn(5, ',').collect();
            assert_eq!(f.len(), 5, "row {l:?}");
            Row {
                t_unix_seconds: f[0].parse().expect("t"),
                latency_ms: f[1].parse().expect("latency"),
                outcome: f[2].to_string(),
                pod: f[3].to_string(),
                detail: f[4].to_string(),
                local_port: port.parse().expect("local_port"),
                reused: match reused {
                    "0" => false,
                    "1" => true,
                    other => panic!("reused {other:?} in row {l:?}"),
                },
            }
        })
        .collect();
    (header, rows)
}

/// A number unique within this test process.
pub fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}
