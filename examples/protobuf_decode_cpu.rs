//! CPU per scrape of the kube-proxy 1.37.2 capture (tests/data/metrics node-a) in one process,
//! three readers side by side (docs/benchmarks/scrape.md "Text and protobuf at 5,000 nodes"):
//!
//! - `protobuf fast`: [`decode_kube_proxy_protobuf`], the families not read checked, not built;
//! - `protobuf full`: [`decode_kube_proxy_protobuf_full`], every family decoded whole by prost;
//! - `text`: [`parse_kube_proxy_metrics`] of the text twin (105 KB).
//!
//! CPU is this thread's user + system time from /proc/thread-self/stat (clock ticks of 10 ms,
//! so N scrapes per round should take well over a second), wall from `Instant`.
//!
//! ```text
//! cargo build --release --example protobuf_decode_cpu
//! target/release/examples/protobuf_decode_cpu [N (2000)]      # ONLY="protobuf fast": one reader
//! ```

use safe_termination::core::exposition::parse_kube_proxy_metrics;
use safe_termination::core::exposition::protobuf::{decode_kube_proxy_protobuf, decode_kube_proxy_protobuf_full};
use std::hint::black_box;
use std::time::Instant;

const PB: &[u8] = include_bytes!("../tests/data/metrics/kube-proxy-v1.37.2-idle-node-a.pb");
const TXT: &str = include_str!("../tests/data/metrics/kube-proxy-v1.37.2-idle-node-a.txt");

/// User + system CPU seconds of the calling thread.
fn cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let f: Vec<&str> = s.rsplit_once(')').unwrap().1.split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(2000);
    for round in 0..3 {
        for (name, f) in [
            (
                "protobuf fast",
                &(|| {
                    black_box(decode_kube_proxy_protobuf(black_box(PB)).unwrap());
                }) as &dyn Fn(),
            ),
            ("protobuf full", &|| {
                black_box(decode_kube_proxy_protobuf_full(black_box(PB)).unwrap());
            }),
            ("text", &|| {
                black_box(parse_kube_proxy_metrics(black_box(TXT)).unwrap());
            }),
        ] {
            if std::env::var("ONLY").is_ok_and(|o| !name.starts_with(&o)) {
                continue;
            }
            let (c0, t0) = (cpu(), Instant::now());
            for _ in 0..n {
                f();
            }
            let (c, t) = (cpu() - c0, t0.elapsed().as_secs_f64());
            println!("round {round} {name:14} {n} scrapes: cpu {c:.2} s, wall {t:.2} s, {:.1} us/scrape (cpu)", c / n as f64 * 1e6);
        }
    }
}
