//! The memory of the rolling measurement window ([`MeasurementStore`]) without a cluster:
//! fills a store the way the operator's scraper does and prints what it holds
//! (docs/benchmarks/memory.md "Operator memory").
//!
//! Every sample is the real v1.29 scrape (tests/data/metrics/kube-proxy-v1.29-iptables-excerpt.txt,
//! parsed once) with its histograms' counts and sums raised per node and per round, as a live
//! kube-proxy's counters grow, so no two samples are equal. Rounds are 30 s apart and the window
//! is 600 s (the operator's defaults), so 21 rounds fill every node's window (20 inside it plus
//! the baseline at its start); more rounds show the steady state.
//!
//! `--format protobuf` (kube-proxy 1.37+): the samples are the real v1.37.2 protobuf capture
//! (tests/data/metrics/kube-proxy-v1.37.2-idle-node-a.pb, native histograms of two `ip_family`
//! series, summed as the reader sums them), with every native bucket's count raised per node and
//! round as well (the count and sum to match), so the older samples keep realistic compact
//! native histograms; `--format text --capture v1.37` its text twin (classic buckets only).
//!
//! ```text
//! cargo run --release --example store_memory -- [--nodes 5000] [--scrapes 21] [--format text|protobuf] [--capture v1.29|v1.37]
//! ```
//!
//! Prints the live heap the store holds (counted by this program's global allocator, which is
//! mimalloc as in the binary, wrapped to count requested bytes: allocator overhead not included),
//! per node and per sample, and the process's VmRSS before and after filling (which does include
//! the allocator's overhead and retained pages).

use safe_termination::core::exposition::{
    Bucket, Histogram, KubeProxyScrape, NativeHistogram, NativeParts, parse_kube_proxy_metrics, parse_kube_proxy_protobuf, spans_of,
};
use safe_termination::core::measure::{MeasurementStore, Sample};
use safe_termination::core::model::ProxyMode;

mod common;
use common::arg;

#[global_allocator]
static GLOBAL: common::Counting = common::Counting;

const SCRAPE: &str = include_str!("../tests/data/metrics/kube-proxy-v1.29-iptables-excerpt.txt");
const V137_TEXT: &str = include_str!("../tests/data/metrics/kube-proxy-v1.37.2-idle-node-a.txt");
const V137_PROTOBUF: &[u8] = include_bytes!("../tests/data/metrics/kube-proxy-v1.37.2-idle-node-a.pb");
const INTERVAL_SECONDS: f64 = 30.0;
const WINDOW_SECONDS: f64 = 600.0;

/// `h` with `step` more observations in every bucket from its first non-empty one on (the
/// observations a kube-proxy makes between two scrapes land in its populated buckets), and the
/// sum raised to match.
fn grown(h: &Histogram, step: f64) -> Histogram {
    let first = h.buckets().iter().position(|b| b.count > 0.0).unwrap_or(h.buckets().len() - 1);
    let buckets = h
        .buckets()
        .iter()
        .enumerate()
        .map(|(i, b)| Bucket { upper_bound_seconds: b.upper_bound_seconds, count: b.count + if i >= first { step } else { 0.0 } })
        .collect();
    Histogram::new(buckets, h.sum_seconds.map(|s| s + step * 0.05)).expect("a histogram stays one")
}

/// `h` with `step` more observations in each of its populated buckets (zero bucket included
/// when it holds any), the count and sum raised to match.
fn grown_native(h: &NativeHistogram, step: f64) -> NativeHistogram {
    let grow = |b: &[(i32, f64)]| b.iter().map(|&(i, c)| (i, if c > 0.0 { c + step } else { c })).collect::<Vec<_>>();
    let (positive, negative) = (grow(h.positive()), grow(h.negative()));
    let zero_step = if h.zero_count() > 0.0 { step } else { 0.0 };
    let added = zero_step + step * (h.positive().iter().chain(h.negative()).filter(|b| b.1 > 0.0).count() as f64);
    let (positive_spans, positive_counts) = spans_of(&positive);
    let (negative_spans, negative_counts) = spans_of(&negative);
    NativeHistogram::new(NativeParts {
        schema: h.schema(),
        zero_threshold: h.zero_threshold(),
        zero_count: h.zero_count() + zero_step,
        count: h.count() + added,
        sum: h.sum() + added * 0.05,
        positive_spans,
        positive_counts,
        negative_spans,
        negative_counts,
    })
    .expect("a native histogram stays one")
}

/// The base scrape as node `node` serves it in round `round`.
fn sample(base: &KubeProxyScrape, node: usize, round: usize) -> Sample {
    let step = (round * (1 + node % 7)) as f64;
    let grow = |h: &Option<Histogram>| h.as_ref().map(|h| grown(h, step));
    let mut scrape = base.clone();
    scrape.sync = grow(&base.sync);
    scrape.sync_full = grow(&base.sync_full);
    scrape.sync_partial = grow(&base.sync_partial);
    scrape.network_programming = grow(&base.network_programming);
    let grow_native = |h: &Option<NativeHistogram>| h.as_ref().map(|h| grown_native(h, step));
    scrape.sync_native = grow_native(&base.sync_native);
    scrape.network_programming_native = grow_native(&base.network_programming_native);
    scrape.endpoint_changes_total = base.endpoint_changes_total.map(|c| c + step);
    Sample { at_unix_seconds: 1.7e9 + round as f64 * INTERVAL_SECONDS, scrape, proxy_mode: Some(ProxyMode::Iptables) }
}

/// This process's VmRSS, bytes.
fn vm_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()).map_or(0, |kb| kb * 1024)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let nodes = arg(&args, "--nodes", 5000usize);
    let scrapes = arg(&args, "--scrapes", 21usize);
    let format = arg(&args, "--format", String::from("text"));
    let capture = arg(&args, "--capture", String::from(if format == "protobuf" { "v1.37" } else { "v1.29" }));
    let base = match (format.as_str(), capture.as_str()) {
        ("text", "v1.29") => parse_kube_proxy_metrics(SCRAPE).expect("the v1.29 excerpt parses"),
        ("text", "v1.37") => parse_kube_proxy_metrics(V137_TEXT).expect("the v1.37.2 text capture parses"),
        ("protobuf", "v1.37") => parse_kube_proxy_protobuf(V137_PROTOBUF).expect("the v1.37.2 protobuf capture parses"),
        _ => panic!("--format text|protobuf, --capture v1.29|v1.37 (protobuf: v1.37 only), not {format:?} {capture:?}"),
    };
    let native_buckets = |h: &Option<NativeHistogram>| h.as_ref().map_or(0, |h| h.positive().len() + h.negative().len());
    println!(
        "scrape: {format} {capture}; native buckets sync {} / network programming {}; classic buckets sync {} / network programming {}",
        native_buckets(&base.sync_native),
        native_buckets(&base.network_programming_native),
        base.sync.as_ref().map_or(0, |h| h.buckets().len()),
        base.network_programming.as_ref().map_or(0, |h| h.buckets().len()),
    );
    let names: Vec<String> = (0..nodes).map(|i| format!("node-{i:05}")).collect();

    let rss_before = vm_rss();
    let live_before = common::live_bytes();
    let mut store = MeasurementStore::new(WINDOW_SECONDS);
    for round in 0..scrapes {
        for (i, node) in names.iter().enumerate() {
            store.record(node, sample(&base, i, round));
        }
    }
    let live = (common::live_bytes() - live_before) as f64;
    let rss = vm_rss().saturating_sub(rss_before) as f64;

    // what the analysis reads, so that a cheaper store is not cheaper by losing data
    let inputs = store.inputs();
    let kept = (scrapes as f64).min(WINDOW_SECONDS / INTERVAL_SECONDS + 1.0);
    let with_earlier = inputs.iter().filter(|i| i.earlier.is_some()).count();
    let earlier_native = inputs.iter().filter(|i| i.earlier.as_ref().is_some_and(|e| e.sync_native.is_some())).count();
    println!("{earlier_native} nodes' earlier scrape keeps a native sync histogram");
    drop(inputs);

    let mib = |b: f64| b / (1024.0 * 1024.0);
    println!("nodes {nodes}, scrapes per node {scrapes} ({kept} kept in the {WINDOW_SECONDS} s window), {with_earlier} nodes with an earlier scrape");
    println!("store live heap: {:.1} MiB total, {:.0} bytes per node, {:.0} bytes per kept sample", mib(live), live / nodes as f64, live / nodes as f64 / kept);
    println!("VmRSS growth:    {:.1} MiB total, {:.0} bytes per node", mib(rss), rss / nodes as f64);
    drop(store);
}
