//! Many fake kube-proxies on 127.0.0.1, for the scrape fan-out benchmark
//! (`examples/scrape_fanout.rs`) and for running the operator out of cluster against static
//! targets.
//!
//! Each listens on its own ephemeral port and serves `/metrics` and `/proxyMode` (`iptables`).
//! What `/metrics` serves, by `--format` and `--capture`:
//!
//! - `--format text --capture v1.29` (the default, as before): a real kube-proxy scrape,
//!   tests/data/metrics/kube-proxy-v1.29-iptables-excerpt.txt, padded with realistic unrelated
//!   families, mostly `rest_client_*` histograms, up to `--size-kb`;
//! - `--format text --capture v1.37`: the real v1.37.2 scrape
//!   tests/data/metrics/kube-proxy-v1.37.2-idle-node-a.txt as it is (105 KB, `--size-kb`
//!   ignored): the text twin of the protobuf capture;
//! - `--format protobuf` (v1.37 only): kube-proxy 1.37's content negotiation. To a request
//!   whose `Accept` admits the protobuf exposition (the operator's and the agent's do) the real
//!   protobuf capture of the same scrape, tests/data/metrics/kube-proxy-v1.37.2-idle-node-a.pb
//!   (67 KB, native histograms, two `ip_family` series), with kube-proxy's `Content-Type`
//!   ([`PROTOBUF_CONTENT_TYPE`]); to any other its text twin.
//!
//! Text is served as `text/plain; version=0.0.4; charset=utf-8`, as kube-proxy does.
//!
//! ```text
//! cargo run --release --example fake_kube_proxies -- [--count 1000] [--format text|protobuf] [--capture v1.29|v1.37] [--size-kb 75] [--print-scrape]
//! ```
//!
//! Output on stdout: `BODY_BYTES=<n>` (the body a protobuf-first client gets), `BODY_FORMAT=<text|protobuf>
//! <capture>`, one `node-NNNN=http://127.0.0.1:<port>` line per server (the operator's static
//! target syntax), then `READY`. It serves until its standard input
//! closes (so a parent that dies takes it along) or it is killed. `--print-scrape` prints the
//! synthesised scrape and exits.

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::IntoResponse;
use axum::routing::get;
use safe_termination::core::exposition::accepts_protobuf;
use std::io::{BufRead, Write};

mod common;
use common::arg;

/// The real scrape the body starts with.
const BASE_SCRAPE: &str = include_str!("../tests/data/metrics/kube-proxy-v1.29-iptables-excerpt.txt");
/// The real kube-proxy v1.37.2 scrape in the text exposition.
const V137_TEXT: &[u8] = include_bytes!("../tests/data/metrics/kube-proxy-v1.37.2-idle-node-a.txt");
/// The same scrape in the protobuf exposition (native histograms).
const V137_PROTOBUF: &[u8] = include_bytes!("../tests/data/metrics/kube-proxy-v1.37.2-idle-node-a.pb");
/// kube-proxy 1.37's `Content-Type` for its protobuf answer (client_golang's `expfmt`).
const PROTOBUF_CONTENT_TYPE: &str = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited; escaping=underscores";
/// kube-proxy's `Content-Type` for the text exposition.
const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A kube-proxy scrape of at least `target_bytes`: the real v1.29 excerpt followed by unrelated
/// families a kube-proxy exposes (client-go `rest_client_*` histograms per host and verb, Go
/// runtime and process metrics), whole series only, stopping within about 1.5 KB past the
/// target. Counts are deterministic.
pub fn synthesize_scrape(target_bytes: usize) -> String {
    let mut s = String::with_capacity(target_bytes + 8192);
    s.push_str(BASE_SCRAPE);
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s.push_str(
        "# HELP go_gc_duration_seconds A summary of the pause duration of garbage collection cycles.\n\
         # TYPE go_gc_duration_seconds summary\n\
         go_gc_duration_seconds{quantile=\"0\"} 3.1191e-05\n\
         go_gc_duration_seconds{quantile=\"0.25\"} 5.4981e-05\n\
         go_gc_duration_seconds{quantile=\"0.5\"} 7.0861e-05\n\
         go_gc_duration_seconds{quantile=\"0.75\"} 0.000113481\n\
         go_gc_duration_seconds{quantile=\"1\"} 0.002409093\n\
         go_gc_duration_seconds_sum 0.118730437\n\
         go_gc_duration_seconds_count 1204\n\
         # HELP go_goroutines Number of goroutines that currently exist.\n\
         # TYPE go_goroutines gauge\n\
         go_goroutines 62\n\
         # HELP process_resident_memory_bytes Resident memory size in bytes.\n\
         # TYPE process_resident_memory_bytes gauge\n\
         process_resident_memory_bytes 5.4571008e+07\n",
    );
    let hosts = ["10.96.0.1:443", "172.18.0.2:6443", "kube-apiserver.kube-system.svc:443", "10.0.0.10:6443"];
    let verbs = ["GET", "LIST", "WATCH", "PATCH", "POST", "PUT", "DELETE"];
    let latency_le = ["0.005", "0.025", "0.1", "0.25", "0.5", "1", "2", "4", "8", "15", "30", "60", "+Inf"];
    let size_le = ["64", "256", "512", "1024", "4096", "16384", "65536", "262144", "1.048576e+06", "4.194304e+06", "1.6777216e+07", "+Inf"];
    let families: [(&str, &str, &[&str]); 4] = [
        ("rest_client_request_duration_seconds", "Request latency in seconds. Broken down by verb, and host.", &latency_le),
        ("rest_client_rate_limiter_duration_seconds", "Client side rate limiter latency in seconds. Broken down by verb, and host.", &latency_le),
        ("rest_client_request_size_bytes", "Request size in bytes. Broken down by verb and host.", &size_le),
        ("rest_client_response_size_bytes", "Response size in bytes. Broken down by verb and host.", &size_le),
    ];
    let mut round = 0u64;
    'outer: loop {
        for (family, help, les) in families {
            if s.len() >= target_bytes {
                break 'outer;
            }
            s.push_str(&format!("# HELP {family} [ALPHA] {help}\n# TYPE {family} histogram\n"));
            for (h, host) in hosts.iter().enumerate() {
                let host = if round == 0 { host.to_string() } else { format!("{host}-{round}") };
                for (v, verb) in verbs.iter().enumerate() {
                    if s.len() >= target_bytes {
                        break 'outer;
                    }
                    let total = 1000 + 37 * (h as u64 + 1) * (v as u64 + 3) + round;
                    for (i, le) in les.iter().enumerate() {
                        let cum = if *le == "+Inf" { total } else { total * (i as u64 + 1) / les.len() as u64 };
                        s.push_str(&format!("{family}_bucket{{host=\"{host}\",verb=\"{verb}\",le=\"{le}\"}} {cum}\n"));
                    }
                    s.push_str(&format!("{family}_sum{{host=\"{host}\",verb=\"{verb}\"}} {}\n", total as f64 * 0.0123));
                    s.push_str(&format!("{family}_count{{host=\"{host}\",verb=\"{verb}\"}} {total}\n"));
                }
            }
        }
        round += 1;
    }
    s
}

/// Raises the soft open-files limit to the hard limit (each server holds a listener and one
/// connection per client).
fn raise_nofile() -> u64 {
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur
    }
}

/// What one server answers on `/metrics`: the text body, and the protobuf one for clients that
/// accept it (`None`: text to everyone).
#[derive(Clone)]
struct Bodies {
    text: Bytes,
    protobuf: Option<Bytes>,
}

impl Bodies {
    fn answer(&self, headers: &HeaderMap) -> impl IntoResponse + use<> {
        let (body, content_type) = match &self.protobuf {
            Some(pb) if accepts_protobuf(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok())) => (pb.clone(), PROTOBUF_CONTENT_TYPE),
            _ => (self.text.clone(), TEXT_CONTENT_TYPE),
        };
        ([(header::CONTENT_TYPE, HeaderValue::from_static(content_type))], body)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let count = arg(&args, "--count", 1000usize);
    let size = arg(&args, "--size-kb", 75usize) * 1024;
    let format = arg(&args, "--format", String::from("text"));
    let capture = arg(&args, "--capture", String::from(if format == "protobuf" { "v1.37" } else { "v1.29" }));
    let bodies = match (format.as_str(), capture.as_str()) {
        ("text", "v1.29") => Bodies { text: Bytes::from(synthesize_scrape(size)), protobuf: None },
        ("text", "v1.37") => Bodies { text: Bytes::from_static(V137_TEXT), protobuf: None },
        ("protobuf", "v1.37") => Bodies { text: Bytes::from_static(V137_TEXT), protobuf: Some(Bytes::from_static(V137_PROTOBUF)) },
        _ => panic!("--format text|protobuf, --capture v1.29|v1.37 (protobuf: v1.37 only), not {format:?} {capture:?}"),
    };
    if args.iter().any(|a| a == "--print-scrape") {
        std::io::stdout().write_all(bodies.protobuf.as_ref().unwrap_or(&bodies.text)).unwrap();
        return;
    }
    let nofile = raise_nofile();
    if (nofile as usize) < count * 2 + 64 {
        eprintln!("warning: open-files limit {nofile} is low for {count} servers (ulimit -n)");
    }
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    rt.block_on(async move {
        let mut out = std::io::stdout().lock();
        writeln!(out, "BODY_BYTES={}", bodies.protobuf.as_ref().unwrap_or(&bodies.text).len()).unwrap();
        writeln!(out, "BODY_FORMAT={format} {capture}").unwrap();
        for i in 0..count {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
            let addr = listener.local_addr().unwrap();
            let b = bodies.clone();
            let app = Router::new()
                .route("/metrics", get(move |headers: HeaderMap| std::future::ready(b.answer(&headers))))
                .route("/proxyMode", get(|| std::future::ready("iptables")));
            tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            });
            writeln!(out, "node-{i:04}=http://{addr}").unwrap();
        }
        writeln!(out, "READY").unwrap();
        out.flush().unwrap();
        drop(out);
        // serve until stdin closes
        tokio::task::spawn_blocking(|| {
            let stdin = std::io::stdin();
            for line in stdin.lock().lines() {
                if line.is_err() {
                    break;
                }
            }
        })
        .await
        .ok();
    });
}
