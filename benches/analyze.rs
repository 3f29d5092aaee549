//! Criterion benchmarks of `safe-termination analyze`'s core (docs/benchmarks/parse.md "analyze"):
//! parsing a kube-proxy `/metrics` body and analysing it (quantiles, window, sizing, advice).
//!
//! Inputs:
//! - the shared v1.29 iptables scrape (tests/data/metrics, 13 KB);
//! - a synthetic ~75 KB scrape shaped like a dual-stack 1.33+ kube-proxy's (Go runtime and
//!   process metrics, client-go rest_client_* histograms, every kubeproxy_ family twice, once
//!   per `ip_family`);
//! - a synthetic ~1 MB scrape: the same plus many unrelated labelled histograms, the worst case
//!   for a parser that must skip what it does not read.
//!
//! Targets: parse throughput >= 200 MB/s; parse + analyse of the 75 KB scrape < 1 ms;
//! the 1 MB scrape parsed at >= 2 GiB/s. `parse-strict/` is the same parser without
//! its fast path for unrelated families, so the two can be compared within one run.
//! Run: `cargo bench --bench analyze -- --warm-up-time 1 --measurement-time 3`.

use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group, criterion_main};
use safe_termination::core::analysis::{AnalysisOptions, analyze};
use safe_termination::core::crd::TerminationPolicySpec;
use safe_termination::core::exposition::parse::parse_kube_proxy_metrics_strict;
use safe_termination::core::exposition::parse_kube_proxy_metrics;
use safe_termination::core::model::{Basis, NodeInput};
use std::fmt::Write as _;

const V1_29: &str = include_str!("../tests/data/metrics/kube-proxy-v1.29-iptables-excerpt.txt");

const SYNC_BOUNDS: [&str; 15] =
    ["0.001", "0.002", "0.004", "0.008", "0.016", "0.032", "0.064", "0.128", "0.256", "0.512", "1.024", "2.048", "4.096", "8.192", "16.384"];

/// kube-proxy's network-programming layout: 0, 0.25, 0.5, 1..59 by 1, 60..115 by 5, 120..300 by 30.
fn np_bounds() -> Vec<String> {
    let mut v = vec!["0".to_string(), "0.25".into(), "0.5".into()];
    v.extend((1..60).map(|i| i.to_string()));
    v.extend((60..120).step_by(5).map(|i| i.to_string()));
    v.extend((120..=300).step_by(30).map(|i| i.to_string()));
    v
}

/// A tiny deterministic generator (xorshift) so the synthetic scrapes are the same every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Cumulative counts for `n` buckets with `total` observations concentrated around bucket `peak`.
fn cumulative(rng: &mut Rng, n: usize, total: u64, peak: usize) -> Vec<u64> {
    let mut weights: Vec<u64> = (0..n).map(|i| 1 + (64 >> (i.abs_diff(peak).min(6))) + rng.below(3)).collect();
    let sum: u64 = weights.iter().sum();
    for w in &mut weights {
        *w = *w * total / sum;
    }
    let mut acc = 0;
    weights
        .iter()
        .map(|w| {
            acc += w;
            acc
        })
        .collect()
}

/// One histogram family (`(name, help)`) with a series per label set; `(total, peak)`: the
/// observations per series and the bucket they cluster around.
fn histogram(
    out: &mut String,
    rng: &mut Rng,
    (family, help): (&str, &str),
    labels: &[String],
    bounds: &[&str],
    (total, peak): (u64, usize),
    with_header: bool,
) {
    if with_header {
        let _ = writeln!(out, "# HELP {family} {help}\n# TYPE {family} histogram");
    }
    for l in labels {
        let counts = cumulative(rng, bounds.len(), total, peak);
        let sep = if l.is_empty() { "" } else { "," };
        for (b, c) in bounds.iter().zip(&counts) {
            let _ = writeln!(out, "{family}_bucket{{{l}{sep}le=\"{b}\"}} {c}");
        }
        let inf = counts.last().copied().unwrap_or(0) + rng.below(2);
        let _ = writeln!(out, "{family}_bucket{{{l}{sep}le=\"+Inf\"}} {inf}");
        let braces = if l.is_empty() { String::new() } else { format!("{{{l}}}") };
        let _ = writeln!(out, "{family}_sum{braces} {}", inf as f64 * 0.0371);
        let _ = writeln!(out, "{family}_count{braces} {inf}");
    }
}

fn gauge(out: &mut String, family: &str, kind: &str, series: &[(String, f64)]) {
    let _ = writeln!(out, "# HELP {family} [ALPHA] synthetic\n# TYPE {family} {kind}");
    for (labels, v) in series {
        if labels.is_empty() {
            let _ = writeln!(out, "{family} {v}");
        } else {
            let _ = writeln!(out, "{family}{{{labels}}} {v}");
        }
    }
}

/// Go runtime and process metrics as client_golang exposes them (~8 KB).
fn go_runtime(out: &mut String, rng: &mut Rng) {
    let _ = writeln!(
        out,
        "# HELP go_gc_duration_seconds A summary of the wall-time pause (stop-the-world) duration in garbage collection cycles.\n# TYPE go_gc_duration_seconds summary"
    );
    for q in ["0", "0.25", "0.5", "0.75", "1"] {
        let _ = writeln!(out, "go_gc_duration_seconds{{quantile=\"{q}\"}} {}e-05", 2 + rng.below(90));
    }
    let _ = writeln!(out, "go_gc_duration_seconds_sum 0.294305823\ngo_gc_duration_seconds_count 755");
    for name in [
        "go_goroutines",
        "go_threads",
        "go_memstats_alloc_bytes",
        "go_memstats_alloc_bytes_total",
        "go_memstats_buck_hash_sys_bytes",
        "go_memstats_frees_total",
        "go_memstats_gc_sys_bytes",
        "go_memstats_heap_alloc_bytes",
        "go_memstats_heap_idle_bytes",
        "go_memstats_heap_inuse_bytes",
        "go_memstats_heap_objects",
        "go_memstats_heap_released_bytes",
        "go_memstats_heap_sys_bytes",
        "go_memstats_last_gc_time_seconds",
        "go_memstats_mallocs_total",
        "go_memstats_mcache_inuse_bytes",
        "go_memstats_mcache_sys_bytes",
        "go_memstats_mspan_inuse_bytes",
        "go_memstats_mspan_sys_bytes",
        "go_memstats_next_gc_bytes",
        "go_memstats_other_sys_bytes",
        "go_memstats_stack_inuse_bytes",
        "go_memstats_stack_sys_bytes",
        "go_memstats_sys_bytes",
        "go_sched_gomaxprocs_threads",
        "go_gc_gogc_percent",
        "go_gc_gomemlimit_bytes",
        "process_cpu_seconds_total",
        "process_max_fds",
        "process_open_fds",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
        "process_virtual_memory_bytes",
        "process_virtual_memory_max_bytes",
        "process_network_receive_bytes_total",
        "process_network_transmit_bytes_total",
    ] {
        let _ = writeln!(out, "# HELP {name} Runtime metric exposed by client_golang.\n# TYPE {name} gauge\n{name} {}", rng.below(1 << 30));
    }
    let _ = writeln!(out, "# HELP go_info Information about the Go environment.\n# TYPE go_info gauge\ngo_info{{version=\"go1.24.4\"}} 1");
}

const LATENCY_BOUNDS: [&str; 11] = ["0.005", "0.025", "0.1", "0.25", "0.5", "1", "2", "4", "8", "15", "30"];
const SIZE_BOUNDS: [&str; 8] = ["64", "256", "512", "1024", "4096", "16384", "65536", "262144"];

/// client-go's rest_client_* families for `hosts` API endpoints.
fn rest_client(out: &mut String, rng: &mut Rng, hosts: &[String], header: bool) {
    let verbs = ["GET", "LIST", "WATCH", "PATCH", "POST", "PUT"];
    let labels: Vec<String> = hosts.iter().flat_map(|h| verbs.iter().map(move |v| format!("host=\"{h}\",verb=\"{v}\""))).collect();
    histogram(
        out,
        rng,
        ("rest_client_request_duration_seconds", "[ALPHA] Request latency in seconds. Broken down by verb, and host."),
        &labels,
        &LATENCY_BOUNDS,
        (5000, 2),
        header,
    );
    histogram(
        out,
        rng,
        ("rest_client_rate_limiter_duration_seconds", "[ALPHA] Client side rate limiter latency in seconds. Broken down by verb, and host."),
        &labels,
        &LATENCY_BOUNDS,
        (5000, 0),
        header,
    );
    histogram(
        out,
        rng,
        ("rest_client_request_size_bytes", "[ALPHA] Request size in bytes. Broken down by verb and host."),
        &labels,
        &SIZE_BOUNDS,
        (5000, 1),
        header,
    );
    histogram(
        out,
        rng,
        ("rest_client_response_size_bytes", "[ALPHA] Response size in bytes. Broken down by verb and host."),
        &labels,
        &SIZE_BOUNDS,
        (5000, 4),
        header,
    );
    if header {
        let _ = writeln!(
            out,
            "# HELP rest_client_requests_total [ALPHA] Number of HTTP requests, partitioned by status code, method, and host.\n# TYPE rest_client_requests_total counter"
        );
    }
    for h in hosts {
        for code in ["200", "201", "404", "409", "500"] {
            for m in ["GET", "PATCH", "POST"] {
                let _ = writeln!(out, "rest_client_requests_total{{code=\"{code}\",host=\"{h}\",method=\"{m}\"}} {}", rng.below(100_000));
            }
        }
    }
}

/// Every kubeproxy_ family of a dual-stack nftables/iptables kube-proxy (1.33+), per ip_family.
fn kube_proxy(out: &mut String, rng: &mut Rng) {
    let fams = ["ip_family=\"IPv4\"".to_string(), "ip_family=\"IPv6\"".to_string()];
    let np = np_bounds();
    let np: Vec<&str> = np.iter().map(String::as_str).collect();
    histogram(
        out,
        rng,
        ("kubeproxy_network_programming_duration_seconds", "[ALPHA] In Cluster Network Programming Latency in seconds"),
        &fams,
        &np,
        (4000, 3),
        true,
    );
    histogram(
        out,
        rng,
        ("kubeproxy_sync_full_proxy_rules_duration_seconds", "[ALPHA] SyncProxyRules latency in seconds for full resyncs"),
        &fams,
        &SYNC_BOUNDS,
        (300, 8),
        true,
    );
    histogram(
        out,
        rng,
        ("kubeproxy_sync_partial_proxy_rules_duration_seconds", "[ALPHA] SyncProxyRules latency in seconds for partial resyncs"),
        &fams,
        &SYNC_BOUNDS,
        (3700, 6),
        true,
    );
    histogram(out, rng, ("kubeproxy_sync_proxy_rules_duration_seconds", "[ALPHA] SyncProxyRules latency in seconds"), &fams, &SYNC_BOUNDS, (4000, 7), true);
    let per_family = |v: f64| fams.iter().map(|f| (f.clone(), v)).collect::<Vec<_>>();
    gauge(out, "kubeproxy_sync_proxy_rules_endpoint_changes_pending", "gauge", &per_family(0.0));
    gauge(out, "kubeproxy_sync_proxy_rules_endpoint_changes_total", "counter", &per_family(81234.0));
    gauge(out, "kubeproxy_sync_proxy_rules_service_changes_pending", "gauge", &per_family(0.0));
    gauge(out, "kubeproxy_sync_proxy_rules_service_changes_total", "counter", &per_family(1234.0));
    let tables: Vec<(String, f64)> =
        fams.iter().flat_map(|f| ["filter", "nat", "mangle"].map(|t| (format!("{f},table=\"{t}\""), 1000.0 + rng.below(20_000) as f64))).collect();
    gauge(out, "kubeproxy_sync_proxy_rules_iptables_total", "gauge", &tables);
    gauge(out, "kubeproxy_sync_proxy_rules_iptables_last", "gauge", &tables);
    gauge(out, "kubeproxy_sync_proxy_rules_iptables_restore_failures_total", "counter", &per_family(0.0));
    gauge(out, "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total", "counter", &per_family(0.0));
    gauge(out, "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", "gauge", &per_family(1.7548947993e9));
    gauge(out, "kubeproxy_sync_proxy_rules_last_timestamp_seconds", "gauge", &per_family(1.7548947994e9));
    let nle: Vec<(String, f64)> = fams.iter().flat_map(|f| ["external", "internal"].map(|t| (format!("{f},traffic_policy=\"{t}\""), 0.0))).collect();
    gauge(out, "kubeproxy_sync_proxy_rules_no_local_endpoints_total", "gauge", &nle);
    gauge(out, "kubeproxy_proxy_healthz_total", "counter", &[("code=\"200\"".into(), 8101.0), ("code=\"503\"".into(), 2.0)]);
    gauge(out, "kubernetes_build_info", "gauge", &[(
        "build_date=\"2025-06-17T18:36:28Z\",compiler=\"gc\",git_commit=\"8adc0f041b8e7ad1d30e29cc59c6ae7a15e19828\",git_tree_state=\"clean\",git_version=\"v1.33.2\",go_version=\"go1.24.4\",major=\"1\",minor=\"33\",platform=\"linux/amd64\"".into(),
        1.0,
    )]);
}

/// A scrape of about `target` bytes, every family contiguous and in client_golang's (sorted)
/// order: Go runtime and process metrics, kube-proxy's families, then client-go's rest_client_*
/// families for as many API server addresses as it takes to reach the size (a real kube-proxy
/// talks to one; the many-host case stands for a scrape full of unrelated labelled histograms).
fn synthetic_scrape(target: usize) -> String {
    let build = |hosts: usize, gates: usize| {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut out = String::with_capacity(target + 64 * 1024);
        go_runtime(&mut out, &mut rng);
        kube_proxy(&mut out, &mut rng);
        feature_gates(&mut out, gates);
        let hosts: Vec<String> = (0..hosts).map(|i| format!("10.{}.{}.{}:6443", i / 65536 % 256, i / 256 % 256, i % 256)).collect();
        rest_client(&mut out, &mut rng, &hosts, true);
        out
    };
    let one = build(1, 0).len();
    let per_host = build(2, 0).len() - one;
    // whole hosts below the target, then feature-gate lines (~75 bytes each) for the rest
    let hosts = 1 + target.saturating_sub(one) / per_host;
    let (base, ten) = (build(hosts, 1).len(), build(hosts, 11).len());
    let per_gate = (ten - base) / 10;
    build(hosts, 1 + target.saturating_sub(base) / per_gate)
}

/// `kubernetes_feature_enabled`, one line per feature gate (a 1.33 kube-proxy has ~200).
fn feature_gates(out: &mut String, n: usize) {
    if n == 0 {
        return;
    }
    let _ = writeln!(
        out,
        "# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.\n# TYPE kubernetes_feature_enabled gauge"
    );
    let stages = ["ALPHA", "BETA", ""];
    for i in 0..n {
        let _ = writeln!(out, "kubernetes_feature_enabled{{name=\"SyntheticFeatureGate{i:04}\",stage=\"{}\"}} {}", stages[i % 3], i % 2);
    }
}

fn analyse(text: &str) -> safe_termination::core::analysis::AnalysisReport {
    let scrape = parse_kube_proxy_metrics(text).expect("benchmark scrape parses");
    let input = NodeInput { node: "node-1".into(), later: scrape, earlier: None, proxy_mode: None };
    analyze(std::slice::from_ref(&input), &AnalysisOptions::default(), &TerminationPolicySpec::default())
}

fn bench(c: &mut Criterion) {
    let scrape_75k = synthetic_scrape(75 * 1024);
    let scrape_1m = synthetic_scrape(1024 * 1024);
    let inputs: [(&str, &str); 3] = [("v1.29-excerpt-13KB", V1_29), ("synthetic-75KB", &scrape_75k), ("synthetic-1MB", &scrape_1m)];

    // sanity: the synthetic scrapes are analysable and realistic
    for (name, text) in &inputs[1..] {
        let r = analyse(text);
        assert_eq!(r.nodes[0].basis, Basis::Measured, "{name}");
        assert!(r.nodes[0].network_programming_p99.is_some(), "{name}");
        assert!(r.nodes[0].sync_samples > 1000.0, "{name}");
        eprintln!("{name}: {} bytes, {} lines", text.len(), text.lines().count());
    }

    let mut parse = c.benchmark_group("parse");
    for (name, text) in inputs {
        parse.throughput(Throughput::Bytes(text.len() as u64));
        parse.bench_with_input(BenchmarkId::from_parameter(name), text, |b, t| b.iter(|| parse_kube_proxy_metrics(black_box(t))));
    }
    parse.finish();

    // the same parser with every line through the full check (no fast path for the families it
    // does not read): the skip-only "before" of the fast path, measured side by side with `parse/`
    let mut strict = c.benchmark_group("parse-strict");
    for (name, text) in inputs {
        assert_eq!(parse_kube_proxy_metrics_strict(text), parse_kube_proxy_metrics(text), "{name}");
        strict.throughput(Throughput::Bytes(text.len() as u64));
        strict.bench_with_input(BenchmarkId::from_parameter(name), text, |b, t| b.iter(|| parse_kube_proxy_metrics_strict(black_box(t))));
    }
    strict.finish();

    let mut full = c.benchmark_group("parse+analyze");
    for (name, text) in inputs {
        full.throughput(Throughput::Bytes(text.len() as u64));
        full.bench_with_input(BenchmarkId::from_parameter(name), text, |b, t| b.iter(|| analyse(black_box(t))));
    }
    full.finish();

    // interval analysis: two parsed scrapes of one node (the operator's steady state)
    let later = parse_kube_proxy_metrics(&scrape_75k).unwrap();
    let earlier = later.clone();
    let input = [NodeInput { node: "node-1".into(), later, earlier: Some(earlier), proxy_mode: None }];
    let opts = AnalysisOptions::default();
    let spec = TerminationPolicySpec::default();
    c.bench_function("analyze-only/interval-two-scrapes", |b| b.iter(|| analyze(black_box(&input), &opts, &spec)));
    // the same with the control plane's part of a deletion composed in (1,000 lags spread over
    // 0-0.3 s: the most distinct values a composition takes, 16), side by side with the above
    let lags: Vec<f64> = (0..1000).map(|i| f64::from(i % 300) * 0.001).collect();
    let with_lag =
        AnalysisOptions { control_plane_lag: safe_termination::core::control_plane::LagDistribution::from_samples(&lags), ..AnalysisOptions::default() };
    c.bench_function("analyze-only/interval-two-scrapes+control-plane-lag", |b| b.iter(|| analyze(black_box(&input), &with_lag, &spec)));

    // observed removals: what every policy's reconcile asks of the store, the summary of the
    // rolling window, at 1,000 and at the store's bound of 20,000 closed removals (2 nodes each)
    use safe_termination::core::removals::{MAX_CLOSED_REMOVALS, NodeReport, PendingRemoval, RemovalStore, ServicePort};
    for n in [1000, MAX_CLOSED_REMOVALS] {
        let mut store = RemovalStore::default();
        let nodes: std::collections::BTreeSet<String> = ["node-a".to_string(), "node-b".to_string()].into();
        let service = ServicePort {
            namespace: "ns".into(),
            name: "web".into(),
            port_name: "http".into(),
            protocol: "TCP".into(),
            cluster_ip: "10.96.0.9".parse().unwrap(),
            port: 80,
        };
        for i in 0..n {
            let endpoint = std::net::IpAddr::from(std::net::Ipv4Addr::from(0x0af4_0000 + i as u32));
            let t = i as f64 * 0.01;
            store.open(PendingRemoval { service: service.clone(), endpoint, pod: format!("ns/p{i}"), deletion: t, sleep_seconds: Some(3), deadline: t + 60.0 });
            for (k, node) in nodes.iter().enumerate() {
                let fw = t + 0.1 + (i % 97) as f64 * 0.01 + k as f64 * 0.05;
                store.report(node, &service, endpoint, NodeReport::Removed { last_with: Some(fw - 0.06), first_without: fw });
            }
            store.close(t + 2.0, &nodes);
        }
        let now = n as f64 * 0.01 + 2.0;
        assert_eq!(store.summary(now, 1e9).removals, n);
        c.bench_function(&format!("observed-removals/summary-{n}"), |b| b.iter(|| store.summary(black_box(now), 1e9)));
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
