//! Every kube-proxy scrape in tests/data/metrics (copies of ../shared/cases/metrics, provenance in
//! tests/data/SOURCES.md) with its expected outcome, plus synthetic exposition texts for the
//! sizing and advice boundaries the shared files do not reach.
//!
//! Unless a test says otherwise, quantiles are Prometheus `histogram_quantile` over the cumulative
//! counters of one scrape, i.e. over the kube-proxy process lifetime. The interval tests say so
//! when they use the delta between two scrapes.

use safe_termination::core::advisor::{AdviceReason, ClusterFacts, Thresholds};
use safe_termination::core::analysis::{AnalysisOptions, AnalysisReport, analyze};
use safe_termination::core::crd::{GraceSpec, TerminationPolicySpec};
use safe_termination::core::exposition::{KubeProxyScrape, parse_kube_proxy_metrics};
use safe_termination::core::model::{Basis, ClusterWindow, Interval, NodeInput, ProxyMode};
use safe_termination::core::sizing::{grace_seconds, recommend};

const V1_29: &str = include_str!("data/metrics/kube-proxy-v1.29-iptables-excerpt.txt");
const V1_13: &str = include_str!("data/metrics/kube-proxy-v1.13-legacy-microseconds.txt");
const V1_8: &str = include_str!("data/metrics/kube-proxy-v1.8-legacy-nan-excerpt.txt");
const WINDOWS_TRUNCATED: &str = include_str!("data/metrics/kube-proxy-windows-truncated.txt");

const SYNC: &str = "kubeproxy_sync_proxy_rules_duration_seconds";
const NP: &str = "kubeproxy_network_programming_duration_seconds";

// ---------------------------------------------------------------------------------------------
// helpers

fn parse(text: &str) -> KubeProxyScrape {
    parse_kube_proxy_metrics(text).unwrap_or_else(|e| panic!("scrape should parse: {e}"))
}

/// Tolerance of W, the p99 of the window distribution (src/core/window_distribution.rs, found by
/// bisection to 1e-6 s), against the expected values, which come from an independent
/// implementation of the same model, tests/reference/window_distribution_reference.py.
const W_TOL: f64 = 1e-5;

mod support;
use support::approx;

/// Default analysis options: minSyncPeriod 1 s (kube-proxy's iptables default), default
/// thresholds, mode inferred.
fn opts(facts: ClusterFacts) -> AnalysisOptions {
    AnalysisOptions {
        min_sync_period_seconds: 1.0,
        min_sync_period_source: "test".into(),
        mode: None,
        configured_mode: None,
        facts,
        thresholds: Thresholds::default(),
        histograms: Default::default(),
        control_plane_lag: None,
        observed: None,
        observed_by_data_plane: Vec::new(),
    }
}

fn node(name: &str, later: &str) -> NodeInput {
    NodeInput { node: name.into(), later: parse(later), earlier: None, proxy_mode: None }
}

fn analyze_one(text: &str) -> AnalysisReport {
    analyze(&[node("n1", text)], &opts(ClusterFacts::default()), &TerminationPolicySpec::default())
}

fn reasons(r: &AnalysisReport) -> Vec<AdviceReason> {
    r.advice.iter().map(|a| a.reason).collect()
}

/// A histogram family in exposition format. `buckets` are `(le, cumulative count)` and must end
/// with `+Inf`; `_count` is the `+Inf` count.
fn hist_text(family: &str, buckets: &[(&str, u64)], sum: f64) -> String {
    let mut s = format!("# HELP {family} synthetic\n# TYPE {family} histogram\n");
    for (le, c) in buckets {
        s.push_str(&format!("{family}_bucket{{le=\"{le}\"}} {c}\n"));
    }
    let total = buckets.last().map_or(0, |b| b.1);
    s.push_str(&format!("{family}_sum {sum}\n{family}_count {total}\n"));
    s
}

/// kube-proxy's sync bucket layout (`0.001 * 2^k`, k = 0..14, then `+Inf`) filled from a
/// function giving the cumulative count at each bound.
fn sync_layout(count_at: impl Fn(f64) -> u64, inf: u64) -> Vec<(String, u64)> {
    const BOUNDS: [&str; 15] =
        ["0.001", "0.002", "0.004", "0.008", "0.016", "0.032", "0.064", "0.128", "0.256", "0.512", "1.024", "2.048", "4.096", "8.192", "16.384"];
    let mut v: Vec<(String, u64)> = BOUNDS.iter().map(|le| (le.to_string(), count_at(le.parse().unwrap()))).collect();
    v.push(("+Inf".into(), inf));
    v
}

fn sync_text_layout(buckets: &[(String, u64)]) -> String {
    let b: Vec<(&str, u64)> = buckets.iter().map(|(l, c)| (l.as_str(), *c)).collect();
    hist_text(SYNC, &b, 1.0)
}

/// Rewrites every `<family>_bucket{le="X"} N` line of `text` to `f(X, N)`, keeping everything
/// else (comments, other families, ordering) as it is; `_count` follows the `+Inf` bucket.
/// This is how the tests build a later scrape from a real one.
fn edit_counts(text: &str, family: &str, f: impl Fn(&str, u64) -> u64) -> String {
    let bucket_prefix = format!("{family}_bucket{{le=\"");
    let count_prefix = format!("{family}_count ");
    let mut inf = None;
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        if let Some(rest) = line.strip_prefix(&bucket_prefix) {
            let (le, value) = rest.split_once("\"} ").expect("bucket line");
            let n = f(le, value.trim().parse().expect("integer count"));
            if le == "+Inf" {
                inf = Some(n);
            }
            out.push_str(&format!("{bucket_prefix}{le}\"}} {n}\n"));
        } else if line.starts_with(&count_prefix) {
            out.push_str(&format!("{count_prefix}{}\n", inf.expect("+Inf bucket before _count")));
        } else {
            out.push_str(line);
        }
    }
    assert_ne!(out, text, "edit_counts changed nothing");
    out
}

fn le_value(le: &str) -> f64 {
    if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap() }
}

// ---------------------------------------------------------------------------------------------
// the shared scrapes

#[test]
fn v1_29_iptables_excerpt_lifetime() {
    let s = parse(V1_29);
    let sync = s.sync.as_ref().expect("sync histogram");
    assert!(!s.sync_from_legacy_microseconds);
    assert_eq!(sync.count(), 4.0);
    // rank 0.99 * 4 = 3.96 in (0.064, 0.128] holding samples 3..4: 0.064 + 0.064 * 1.96 / 2
    let q = sync.quantile(0.99);
    approx(q.seconds, 0.12672, 1e-9);
    assert!(!q.beyond_top_bucket);
    assert_eq!(sync.top_finite_bound_seconds(), Some(16.384));
    approx(sync.sum_seconds.unwrap(), 0.297575151, 1e-12);

    // network programming: 2 samples, rank 1.98 in (4, 5]: 4 + 0.98
    let np = s.network_programming.as_ref().expect("network programming histogram");
    assert_eq!(np.count(), 2.0);
    approx(np.quantile(0.99).seconds, 4.98, 1e-9);

    // exact family matching: the full/partial families share the prefix but are their own
    let full = s.sync_full.as_ref().unwrap();
    let partial = s.sync_partial.as_ref().unwrap();
    assert_eq!((full.count(), partial.count()), (2.0, 2.0));
    approx(full.quantile(0.99).seconds, 0.064 + 0.064 * 0.99, 1e-12);
    approx(partial.quantile(0.99).seconds, 0.032 + 0.032 * 0.98, 1e-12);

    assert_eq!(s.kubernetes_version.as_deref(), Some("v1.29.0"));
    assert_eq!(s.iptables_rules_total, Some(38.0)); // filter 4 + nat 34
    assert_eq!(s.iptables_rules_last, Some(34.0)); // filter 4 + nat 30
    assert_eq!(s.iptables_restore_failures_total, Some(0.0));
    assert_eq!(s.iptables_partial_restore_failures_total, Some(0.0));
    assert_eq!(s.endpoint_changes_total, Some(8.0));
    assert_eq!(s.service_changes_total, Some(12.0));
    assert_eq!(s.endpoint_changes_pending, Some(0.0));
    assert_eq!(s.nftables_sync_failures_total, None);
    assert_eq!(ProxyMode::infer(&s), Some(ProxyMode::Iptables));

    let r = analyze_one(V1_29);
    assert_eq!(r.interval, "lifetime");
    let n = &r.nodes[0];
    assert_eq!(n.interval, Interval::Lifetime);
    assert_eq!(n.mode, ProxyMode::Iptables);
    assert_eq!(n.mode_source, "metric families");
    assert_eq!(n.kubernetes_version.as_deref(), Some("v1.29.0"));
    assert_eq!(n.sync_samples, 4.0);
    assert_eq!(n.basis, Basis::LowSampleCount);
    approx(n.sync_p99.unwrap().seconds, 0.12672, 1e-9);
    approx(n.network_programming_p99.unwrap().seconds, 4.98, 1e-9);
    // W = max(the window p99 of the 4 syncs with minSyncPeriod 1 s = 1.154 s, NP p99 4.98 - 1 s
    // trigger-time resolution = 3.98 s)
    approx(n.propagation_window_seconds.unwrap(), 3.98, 1e-9);
    // last queued (…799.314) is before last synced (…799.332): nothing waits
    assert_eq!(n.stale_seconds, Some(0.0));
    assert_eq!(n.iptables_rules_total, Some(38.0));

    assert_eq!(r.worst_node.as_deref(), Some("n1"));
    approx(r.sync_p99_seconds.unwrap(), 0.12672, 1e-9);
    approx(r.network_programming_p99_seconds.unwrap(), 4.98, 1e-9);
    approx(r.propagation_window_seconds.unwrap(), 3.98, 1e-9);
    // LowSampleCount: max(default 10, ceil(3.98 x 1.25 = 4.975) = 5) = 10; grace max(30, 10 + 30) = 40
    assert_eq!(r.recommendation.pre_stop_seconds, 10);
    assert_eq!(r.recommendation.termination_grace_period_seconds, 40);
    assert_eq!(r.recommendation.reason, Basis::LowSampleCount);
    assert_eq!(r.proxy.mode, ProxyMode::Iptables);
    assert_eq!(r.proxy.actual_rules, Some(38));
    assert_eq!(reasons(&r), vec![AdviceReason::LowSampleCount]);
    assert_eq!(r.advice[0].threshold, "samples < 5");
}

#[test]
fn v1_13_legacy_microseconds_are_converted() {
    let s = parse(V1_13);
    assert!(s.sync_from_legacy_microseconds);
    assert_eq!(s.kubernetes_version.as_deref(), Some("v1.13.4")); // pre-1.15 `gitVersion` label
    let sync = s.sync.as_ref().unwrap();
    assert_eq!(sync.count(), 2669.0);
    // buckets are in seconds now: 1000 µs .. 1.6384e7 µs -> 0.001 .. 16.384 s
    approx(sync.buckets()[0].upper_bound_seconds, 0.001, 1e-15);
    approx(sync.top_finite_bound_seconds().unwrap(), 16.384, 1e-12);
    approx(sync.sum_seconds.unwrap(), 62.885705, 1e-9);
    // rank 0.99 x 2669 = 2642.31 in (32000, 64000] µs holding samples 2534..2660
    let expected_us = 32000.0 + 32000.0 * (2642.31 - 2534.0) / 126.0;
    let q = sync.quantile(0.99);
    approx(q.seconds, expected_us * 1e-6, 1e-9);
    approx(q.seconds, 0.0595073, 1e-7);
    assert!(q.seconds < 1.0, "microseconds read as seconds: {}", q.seconds);

    let r = analyze_one(V1_13);
    let n = &r.nodes[0];
    assert_eq!(n.basis, Basis::Measured);
    assert!(n.sync_from_legacy_microseconds);
    assert_eq!(n.network_programming_p99, None);
    assert_eq!(n.mode, ProxyMode::Unknown); // no mode-specific family in a v1.13 scrape
    approx(r.propagation_window_seconds.unwrap(), 1.041006, W_TOL);
    assert_eq!(r.network_programming_p99_seconds, None);
    // ceil(1.041 x 1.25 = 1.301) = 2, clamped up to minSeconds 3; grace max(30, 3 + 30) = 33
    assert_eq!(r.recommendation.pre_stop_seconds, 3);
    assert_eq!(r.recommendation.termination_grace_period_seconds, 33);
    assert_eq!(r.recommendation.reason, Basis::Measured);
    assert!(r.advice.is_empty(), "{:?}", r.advice);
}

#[test]
fn v1_8_nan_summaries_do_not_poison_the_sync_histogram() {
    assert!(V1_8.contains("{handler=\"prometheus\",quantile=\"0.99\"} NaN"));
    let s = parse(V1_8);
    assert!(s.sync_from_legacy_microseconds);
    assert_eq!(s.kubernetes_version.as_deref(), Some("v1.8.3"));
    let sync = s.sync.as_ref().unwrap();
    assert_eq!(sync.count(), 364.0);
    // rank 0.99 x 364 = 360.36 in (128000, 256000] µs holding samples 346..362
    let expected = (128000.0 + 128000.0 * (360.36 - 346.0) / 16.0) * 1e-6;
    approx(sync.quantile(0.99).seconds, expected, 1e-9);
    approx(expected, 0.24288, 1e-9);
    assert!(sync.buckets().iter().all(|b| !b.count.is_nan()));

    let r = analyze_one(V1_8);
    assert_eq!(r.nodes[0].basis, Basis::Measured);
    approx(r.propagation_window_seconds.unwrap(), 1.167661, W_TOL);
    assert_eq!(r.recommendation.pre_stop_seconds, 3); // ceil(1.168 x 1.25 = 1.460) = 2 -> minSeconds 3
    assert_eq!(r.recommendation.termination_grace_period_seconds, 33);
}

#[test]
fn nan_in_a_read_gauge_or_sum_is_accepted_and_contained() {
    let text = format!(
        "{}kubeproxy_sync_proxy_rules_last_timestamp_seconds NaN\nkubeproxy_sync_proxy_rules_last_queued_timestamp_seconds 1.7e9\n",
        hist_text(SYNC, &[("0.5", 10), ("1", 20), ("+Inf", 20)], f64::NAN)
    );
    let s = parse(&text);
    assert!(s.sync.as_ref().unwrap().sum_seconds.unwrap().is_nan());
    approx(s.sync.as_ref().unwrap().quantile(0.99).seconds, 0.5 + 0.5 * (19.8 - 10.0) / 10.0, 1e-12);
    let r = analyze_one(&text);
    assert_eq!(r.nodes[0].stale_seconds, None); // NaN - 1.7e9 is not a staleness
    assert!(!reasons(&r).contains(&AdviceReason::ProxyStale));
    // the JSON form never carries NaN (serde_json would write null; make sure nothing is lost)
    let json = serde_json::to_value(&r).unwrap();
    approx(json["syncP99Seconds"].as_f64().unwrap(), 0.99, 1e-12);
}

#[test]
fn windows_truncated_scrape_is_an_error_naming_family_and_line() {
    let e = parse_kube_proxy_metrics(WINDOWS_TRUNCATED).unwrap_err();
    assert_eq!(e.family, SYNC);
    assert_eq!(e.line, 17);
    assert!(e.message.contains("cut off"), "{}", e.message);
    let shown = e.to_string();
    assert!(shown.contains("line 17") && shown.contains(SYNC), "{shown}");

    // the same scrape cut at the line boundary before the broken line: no +Inf bucket
    let whole_lines: String = WINDOWS_TRUNCATED.split_inclusive('\n').take(16).collect();
    let e = parse_kube_proxy_metrics(&whole_lines).unwrap_err();
    assert_eq!(e.family, SYNC);
    assert_eq!(e.line, 16);
    assert!(e.message.contains("+Inf"), "{}", e.message);
}

/// The shared v1.13 scrape cut inside `go_gc_duration_seconds` (line 10 of 190), a family we do
/// not read: every kube-proxy family is lost with the rest, so this must be an error naming the
/// line and family, never "no data".
#[test]
fn v1_13_cut_inside_an_unrelated_family_is_an_error_naming_line_and_family() {
    let at = V1_13.find("go_gc_duration_seconds{quantile=\"0.25\"}").unwrap() + "go_gc_duration_seconds{quantile=\"0.2".len();
    let e = parse_kube_proxy_metrics(&V1_13[..at]).unwrap_err();
    assert_eq!(e.line, 10);
    assert_eq!(e.family, "go_gc_duration_seconds");
    assert_eq!(e.message, "label quantile value is cut off (no closing quote), and the last line has no terminating line feed: the scrape was cut off");
    // a garbled line there is an error too, not a skipped line
    let garbled = V1_13.replacen("go_gc_duration_seconds{quantile=\"0.25\"} 5.9037e-05", "go_gc_duration_seconds{quantile=\"0.25\"} 5.9037e-05 )", 1);
    let e = parse_kube_proxy_metrics(&garbled).unwrap_err();
    assert_eq!(
        (e.line, e.family.as_str(), e.message.as_str()),
        (10, "go_gc_duration_seconds", "timestamp \")\" after the value is not an integer (milliseconds)")
    );
}

/// Prometheus skips blanks before a line's first token: the shared scrapes indented (spaces,
/// tabs, blank lines between) parse to exactly the same values.
#[test]
fn shared_scrapes_indented_parse_the_same() {
    for text in [V1_29, V1_13, V1_8] {
        let indented: String = text.split_inclusive('\n').enumerate().map(|(i, l)| format!("{}{l}", ["  ", "\t", " \t ", ""][i % 4])).collect();
        let indented = indented.replace("\n#", "\n\t\n#");
        assert_eq!(parse(&indented), parse(text));
    }
}

#[test]
fn unrelated_families_and_prefix_sharing_names_are_ignored() {
    let text = format!(
        "{}{}{}",
        hist_text("kubeproxy_sync_proxy_rules_duration_seconds_extra", &[("1", 1)], 0.0), // no +Inf: not ours
        hist_text("rest_client_request_duration_seconds", &[("1", 5)], 0.0),
        hist_text(SYNC, &[("0.1", 7), ("+Inf", 7)], 0.3)
    );
    let s = parse(&text);
    assert_eq!(s.sync.unwrap().count(), 7.0);
    assert_eq!(s.sync_full, None);
}

// ---------------------------------------------------------------------------------------------
// interval analysis: the delta between two scrapes of one kube-proxy process

#[test]
fn interval_between_two_scrapes_uses_the_delta() {
    // later: 100 more syncs, all in (0.128, 0.256]; network programming unchanged
    let later = edit_counts(V1_29, SYNC, |le, n| if le_value(le) >= 0.256 { n + 100 } else { n });
    let later_scrape = parse(&later);
    assert_eq!(later_scrape.sync.as_ref().unwrap().count(), 104.0);

    let input = NodeInput { node: "n1".into(), later: later_scrape, earlier: Some(parse(V1_29)), proxy_mode: None };
    let r = analyze(&[input], &opts(ClusterFacts::default()), &TerminationPolicySpec::default());
    assert_eq!(r.interval, "betweenScrapes");
    let n = &r.nodes[0];
    assert_eq!(n.interval, Interval::BetweenScrapes);
    assert_eq!(n.sync_samples, 100.0);
    // delta: rank 99 of 100 samples in (0.128, 0.256]
    approx(n.sync_p99.unwrap().seconds, 0.128 + 0.128 * 0.99, 1e-12);
    // no network programming observation in the interval: absent, not 0
    assert_eq!(n.network_programming_p99, None);
    assert_eq!(n.basis, Basis::Measured);
    // the window p99 of 100 syncs in (0.128, 0.256] with minSyncPeriod 1 s
    approx(r.propagation_window_seconds.unwrap(), 1.406367, W_TOL);
    assert_eq!(r.network_programming_p99_seconds, None);
    // ceil(1.406 x 1.25 = 1.758) = 2 -> minSeconds 3
    assert_eq!(r.recommendation.pre_stop_seconds, 3);
    assert_eq!(r.recommendation.termination_grace_period_seconds, 33);
    assert_eq!(r.recommendation.reason, Basis::Measured);
    assert!(r.advice.is_empty(), "{:?}", r.advice);

    // the lifetime view of the later scrape alone differs (rank 102.96 of 104)
    let lifetime = analyze_one(&later);
    approx(lifetime.nodes[0].sync_p99.unwrap().seconds, 0.128 + 0.128 * (102.96 - 4.0) / 100.0, 1e-9);
}

#[test]
fn interval_with_no_new_syncs_falls_back_to_lifetime_never_zero() {
    // a quiet kube-proxy syncs only on changes: no sync between the two scrapes, so its lifetime
    // counters (4 syncs) are the last evidence; still too few to trust, so the default applies
    let input = NodeInput { node: "n1".into(), later: parse(V1_29), earlier: Some(parse(V1_29)), proxy_mode: None };
    let r = analyze(&[input], &opts(ClusterFacts::default()), &TerminationPolicySpec::default());
    assert_eq!(r.nodes[0].interval, Interval::LifetimeFallback);
    assert_eq!(r.nodes[0].sync_samples, 4.0);
    assert_eq!(r.nodes[0].basis, Basis::LowSampleCount);
    approx(r.nodes[0].sync_p99.unwrap().seconds, 0.12672, 1e-9);
    assert_eq!(r.recommendation.pre_stop_seconds, 10); // max(defaultSeconds, sized 8)
    assert_eq!(r.recommendation.reason, Basis::LowSampleCount);
    // a kube-proxy that never synced at all: no data, the default, never 0
    let empty = edit_counts(V1_29, SYNC, |_, _| 0);
    let empty = edit_counts(&empty, NP, |_, _| 0);
    let input = NodeInput { node: "n1".into(), later: parse(&empty), earlier: Some(parse(&empty)), proxy_mode: None };
    let r = analyze(&[input], &opts(ClusterFacts::default()), &TerminationPolicySpec::default());
    assert_eq!(r.nodes[0].basis, Basis::NoData);
    assert_eq!(r.propagation_window_seconds, None);
    assert_eq!(r.recommendation.pre_stop_seconds, 10);
    assert_eq!(r.recommendation.reason, Basis::NoData);
}

#[test]
fn counter_reset_between_scrapes_uses_the_later_scrape_alone() {
    // kube-proxy restarted: the later scrape holds 6 syncs, all in (0.256, 0.512], so the
    // 0.032/0.064/0.128 buckets went down (1, 2, 4 -> 0); network programming starts from zero.
    let restarted = edit_counts(V1_29, SYNC, |le, _| if le_value(le) >= 0.512 { 6 } else { 0 });
    let restarted = edit_counts(&restarted, NP, |_, _| 0);
    let later = parse(&restarted);
    let delta = later.sync.as_ref().unwrap().delta_since(parse(V1_29).sync.as_ref().unwrap());
    assert!(delta.is_reset());
    assert_eq!(delta.histogram(), later.sync.as_ref().unwrap());

    let input = NodeInput { node: "n1".into(), later, earlier: Some(parse(V1_29)), proxy_mode: None };
    let r = analyze(&[input], &opts(ClusterFacts::default()), &TerminationPolicySpec::default());
    let n = &r.nodes[0];
    assert_eq!(n.interval, Interval::SinceRestart);
    assert_eq!(r.interval, "betweenScrapes");
    assert_eq!(n.sync_samples, 6.0);
    let p99 = 0.256 + 0.256 * 5.94 / 6.0;
    approx(n.sync_p99.unwrap().seconds, p99, 1e-12);
    assert_eq!(n.network_programming_p99, None);
    assert_eq!(n.basis, Basis::Measured);
    // the window p99 of 6 syncs in (0.256, 0.512] with minSyncPeriod 1 s
    approx(r.propagation_window_seconds.unwrap(), 1.847617, W_TOL);
    // ceil(1.848 x 1.25 = 2.310) = 3 = minSeconds 3
    assert_eq!(r.recommendation.pre_stop_seconds, 3);
    assert_eq!(r.recommendation.termination_grace_period_seconds, 33);
}

#[test]
fn bucket_layout_change_between_scrapes_is_treated_as_a_restart() {
    // an upgrade that changed the bucket layout: drop the 16.384 bucket in the later scrape
    let later: String = V1_29.lines().filter(|l| !l.starts_with(&format!("{SYNC}_bucket{{le=\"16.384\"}}"))).map(|l| format!("{l}\n")).collect();
    let input = NodeInput { node: "n1".into(), later: parse(&later), earlier: Some(parse(V1_29)), proxy_mode: None };
    let r = analyze(&[input], &opts(ClusterFacts::default()), &TerminationPolicySpec::default());
    assert_eq!(r.nodes[0].interval, Interval::SinceRestart);
    assert_eq!(r.nodes[0].sync_samples, 4.0);
}

// ---------------------------------------------------------------------------------------------
// sizing boundaries

fn window(basis: Basis, w: Option<f64>) -> ClusterWindow {
    ClusterWindow { worst_node: w.map(|_| "n1".to_string()), propagation_window_seconds: w, basis }
}

#[test]
fn measured_window_is_scaled_ceiled_and_clamped() {
    let spec = TerminationPolicySpec::default();
    let pre = |w: f64| recommend(&window(Basis::Measured, Some(w)), &spec).pre_stop_seconds;
    assert_eq!(pre(0.0), 3); // min clamp
    assert_eq!(pre(1.0), 3); // ceil(1.25) = 2 -> min 3
    assert_eq!(pre(2.4), 3); // exactly 3, no float noise
    assert_eq!(pre(2.41), 4); // ceil(3.0125)
    assert_eq!(pre(48.0), 60); // ceil(60) = 60: exactly max
    assert_eq!(pre(48.1), 60); // ceil(60.125) = 61 -> max 60
    assert_eq!(pre(1e9), 60);
    let r = recommend(&window(Basis::Measured, Some(4.3)), &spec);
    assert_eq!(r.pre_stop_seconds, 6); // ceil(5.375)
    assert_eq!(r.termination_grace_period_seconds, 36);
    assert!(r.arithmetic.contains("ceil(4.300 s x 1.25 + 0 s) = 6 s"), "{}", r.arithmetic);
}

#[test]
fn safety_factor_extra_seconds_and_custom_bounds() {
    let mut spec = TerminationPolicySpec::default();
    spec.pre_stop.safety_factor = 2.0;
    spec.pre_stop.extra_seconds = 15;
    let r = recommend(&window(Basis::Measured, Some(4.3)), &spec);
    assert_eq!(r.pre_stop_seconds, 24); // ceil(8.6 + 15)
    assert_eq!(r.termination_grace_period_seconds, 54);

    // extraSeconds applies even when the window is tiny, and the min bound still holds
    spec.pre_stop.safety_factor = 1.0;
    spec.pre_stop.extra_seconds = 1;
    spec.pre_stop.min_seconds = 5;
    assert_eq!(recommend(&window(Basis::Measured, Some(0.2)), &spec).pre_stop_seconds, 5);
    spec.pre_stop.min_seconds = 0;
    assert_eq!(recommend(&window(Basis::Measured, Some(0.2)), &spec).pre_stop_seconds, 2); // ceil(1.2)

    // an NLB path: extra 90 s with max 180 s
    spec.pre_stop = Default::default();
    spec.pre_stop.extra_seconds = 90;
    spec.pre_stop.max_seconds = 180;
    let r = recommend(&window(Basis::Measured, Some(4.98)), &spec);
    assert_eq!(r.pre_stop_seconds, 97); // ceil(6.225 + 90)
    assert_eq!(r.termination_grace_period_seconds, 127);

    // grace.maxSeconds caps the raised grace, but never below the sleep
    spec.grace = GraceSpec { app_shutdown_seconds: 30, max_seconds: 100 };
    let r = recommend(&window(Basis::Measured, Some(4.98)), &spec);
    assert_eq!(r.termination_grace_period_seconds, 100);
    spec.grace.max_seconds = 50;
    assert_eq!(recommend(&window(Basis::Measured, Some(4.98)), &spec).termination_grace_period_seconds, 97);
}

#[test]
fn beyond_top_bucket_goes_to_max_never_infinity() {
    // 100 syncs, 50 of them above the top bucket 16.384 s
    let text = sync_text_layout(&sync_layout(|le| if le >= 1.024 { 50 } else { 0 }, 100));
    let r = analyze_one(&text);
    let n = &r.nodes[0];
    let q = n.sync_p99.unwrap();
    assert!(q.beyond_top_bucket);
    assert_eq!(q.seconds, 16.384); // the top finite bound: a lower bound, not an estimate
    assert_eq!(n.basis, Basis::BeyondTopBucket);
    assert_eq!(r.recommendation.reason, Basis::BeyondTopBucket);
    assert_eq!(r.recommendation.pre_stop_seconds, 60); // maxSeconds
    assert_eq!(r.recommendation.termination_grace_period_seconds, 90);
    assert!(r.propagation_window_seconds.unwrap().is_finite());
    let rs = reasons(&r);
    assert!(rs.contains(&AdviceReason::BeyondTopBucket) && rs.contains(&AdviceReason::ProxySyncSlow), "{rs:?}");
    let slow = r.advice.iter().find(|a| a.reason == AdviceReason::ProxySyncSlow).unwrap();
    assert!(slow.message.contains("above 16.384 s"), "{}", slow.message);

    // with a custom max
    let mut spec = TerminationPolicySpec::default();
    spec.pre_stop.max_seconds = 45;
    spec.pre_stop.default_seconds = 10;
    let r = analyze(&[node("n1", &text)], &opts(ClusterFacts::default()), &spec);
    assert_eq!(r.recommendation.pre_stop_seconds, 45);
}

#[test]
fn no_data_uses_the_default_never_zero() {
    // a scrape with none of our families (only unrelated ones)
    let text = hist_text("rest_client_request_duration_seconds", &[("1", 5), ("+Inf", 5)], 1.0);
    let r = analyze_one(&text);
    assert_eq!(r.nodes[0].basis, Basis::NoData);
    assert_eq!(r.worst_node, None);
    assert_eq!(r.propagation_window_seconds, None);
    assert_eq!(r.sync_p99_seconds, None);
    assert_eq!(r.recommendation.reason, Basis::NoData);
    assert_eq!(r.recommendation.pre_stop_seconds, 10);
    assert_eq!(r.recommendation.termination_grace_period_seconds, 40);
    // an empty histogram (registered, never observed) is also no data, not 0 s
    let r = analyze_one(&sync_text_layout(&sync_layout(|_| 0, 0)));
    assert_eq!(r.nodes[0].basis, Basis::NoData);
    assert_eq!(r.nodes[0].sync_p99, None);
    assert_eq!(r.recommendation.pre_stop_seconds, 10);
    // no nodes at all
    let r = analyze(&[], &opts(ClusterFacts::default()), &TerminationPolicySpec::default());
    assert_eq!(r.recommendation.pre_stop_seconds, 10);
    // the default is clamped into the policy's bounds
    let mut spec = TerminationPolicySpec::default();
    spec.pre_stop.min_seconds = 20;
    spec.pre_stop.default_seconds = 10; // invalid policy, but never below min
    assert_eq!(recommend(&window(Basis::NoData, None), &spec).pre_stop_seconds, 20);
}

#[test]
fn low_sample_count_never_lowers_the_default_but_can_raise_it() {
    let spec = TerminationPolicySpec::default();
    assert_eq!(recommend(&window(Basis::LowSampleCount, Some(1.2)), &spec).pre_stop_seconds, 10);
    assert_eq!(recommend(&window(Basis::LowSampleCount, Some(9.0)), &spec).pre_stop_seconds, 12);
    assert_eq!(recommend(&window(Basis::LowSampleCount, Some(100.0)), &spec).pre_stop_seconds, 60);
    // minSamples is the policy's: 4 samples pass with minSamples 4
    let mut spec = TerminationPolicySpec::default();
    spec.pre_stop.min_samples = 4;
    let r = analyze(&[node("n1", V1_29)], &opts(ClusterFacts::default()), &spec);
    assert_eq!(r.nodes[0].basis, Basis::Measured);
    assert_eq!(r.recommendation.pre_stop_seconds, 5); // ceil((4.98 - 1) x 1.25)
    assert!(!reasons(&r).contains(&AdviceReason::LowSampleCount));
}

#[test]
fn grace_is_never_lowered() {
    let g = GraceSpec::default();
    for pre in [0, 3, 10, 60, 600, 3600] {
        assert_eq!(grace_seconds(Some(604800), pre, &g), 604800);
        assert!(grace_seconds(Some(300), pre, &g) >= 300);
        assert!(grace_seconds(None, pre, &g) >= i64::from(pre), "a sleep above grace is rejected");
    }
    assert_eq!(grace_seconds(Some(300), 60, &g), 300); // 60 + 30 < 300: kept
    assert_eq!(grace_seconds(Some(300), 400, &g), 430); // raised, never lowered
    assert_eq!(grace_seconds(Some(0), 10, &g), 40); // 0 is the webhook's business (R3); sizing raises
    assert_eq!(grace_seconds(None, 3, &g), 33);
    assert_eq!(grace_seconds(Some(20), 3, &g), 33);
    // a low grace.maxSeconds never lowers the user's value either
    let tight = GraceSpec { app_shutdown_seconds: 30, max_seconds: 10 };
    assert_eq!(grace_seconds(Some(300), 10, &tight), 300);
    assert_eq!(grace_seconds(None, 10, &tight), 30);
}

// ---------------------------------------------------------------------------------------------
// advice boundaries

/// 100 syncs: 98 at or below `lo`, 2 in (`lo`, `hi`], so p99 = lo + (hi - lo) / 2.
fn sync_p99_text(lo: &str, hi: &str) -> String {
    hist_text(SYNC, &[(lo, 98), (hi, 100), ("+Inf", 100)], 50.0)
}

#[test]
fn proxy_sync_slow_threshold_is_strictly_above_one_second() {
    let r = analyze_one(&sync_p99_text("0.98", "1"));
    approx(r.sync_p99_seconds.unwrap(), 0.99, 1e-9);
    assert_eq!(r.nodes[0].basis, Basis::Measured);
    assert!(!reasons(&r).contains(&AdviceReason::ProxySyncSlow), "{:?}", r.advice);

    let r = analyze_one(&sync_p99_text("1", "1.02"));
    approx(r.sync_p99_seconds.unwrap(), 1.01, 1e-9);
    assert_eq!(reasons(&r), vec![AdviceReason::ProxySyncSlow]);
    assert_eq!(r.advice[0].threshold, "sync p99 > 1 s");
    assert_eq!(r.advice[0].node.as_deref(), Some("n1"));
    assert!(r.advice[0].message.contains("1.010 s"), "{}", r.advice[0].message);
    // W = 1 + 2 x 1.01 = 3.02 -> ceil(3.775) = 4
    assert_eq!(r.recommendation.pre_stop_seconds, 4);

    // a slow p99 from too few samples is reported as LowSampleCount, not ProxySyncSlow
    let r = analyze_one(&hist_text(SYNC, &[("1", 1), ("2", 3), ("+Inf", 3)], 4.0));
    assert_eq!(reasons(&r), vec![AdviceReason::LowSampleCount]);
}

fn advise_with(facts: ClusterFacts) -> AnalysisReport {
    analyze(&[node("n1", &sync_p99_text("0.01", "0.02"))], &opts(facts), &TerminationPolicySpec::default())
}

fn migrations(r: &AnalysisReport) -> Vec<ProxyMode> {
    r.advice.iter().filter(|a| a.reason == AdviceReason::MigrateProxyMode).filter_map(|a| a.to).collect()
}

#[test]
fn iptables_to_nftables_at_1000_services() {
    let facts = |services| ClusterFacts { mode: ProxyMode::Iptables, services: Some(services), ..Default::default() };
    let mut o = opts(facts(999));
    o.mode = Some(ProxyMode::Iptables);
    let r = analyze(&[node("n1", &sync_p99_text("0.01", "0.02"))], &o, &TerminationPolicySpec::default());
    assert_eq!(migrations(&r), vec![]);
    o.facts = facts(1000);
    let r = analyze(&[node("n1", &sync_p99_text("0.01", "0.02"))], &o, &TerminationPolicySpec::default());
    assert_eq!(migrations(&r), vec![ProxyMode::Nftables]);
    let a = &r.advice[0];
    assert_eq!(a.threshold, "iptables with >= 1000 Services");
    assert!(a.message.contains("1000 Services") && a.message.contains("GA in Kubernetes 1.33") && a.message.contains("5.13"), "{}", a.message);

    // inferred iptables (the v1.29 scrape) works the same, and the version note says nftables
    // is alpha on 1.29
    let r = analyze(&[node("n1", V1_29)], &opts(ClusterFacts { services: Some(1000), ..Default::default() }), &TerminationPolicySpec::default());
    assert_eq!(migrations(&r), vec![ProxyMode::Nftables]);
    let a = r.advice.iter().find(|a| a.reason == AdviceReason::MigrateProxyMode).unwrap();
    assert!(a.message.contains("1.29") && a.message.contains("alpha"), "{}", a.message);
    let r = analyze(&[node("n1", V1_29)], &opts(ClusterFacts { services: Some(999), ..Default::default() }), &TerminationPolicySpec::default());
    assert_eq!(migrations(&r), vec![]);
}

#[test]
fn ebpf_dataplane_at_8000_services_or_conntrack_pressure() {
    for mode in [ProxyMode::Iptables, ProxyMode::Nftables] {
        let mut o = opts(ClusterFacts { services: Some(7999), ..Default::default() });
        o.mode = Some(mode);
        let r = analyze(&[node("n1", &sync_p99_text("0.01", "0.02"))], &o, &TerminationPolicySpec::default());
        assert!(!migrations(&r).contains(&ProxyMode::Ebpf), "{mode:?} 7999: {:?}", r.advice);
        o.facts.services = Some(8000);
        let r = analyze(&[node("n1", &sync_p99_text("0.01", "0.02"))], &o, &TerminationPolicySpec::default());
        let m = migrations(&r);
        assert!(m.contains(&ProxyMode::Ebpf), "{mode:?} 8000: {:?}", r.advice);
        assert_eq!(m.contains(&ProxyMode::Nftables), mode == ProxyMode::Iptables);
        let a = r.advice.iter().find(|a| a.to == Some(ProxyMode::Ebpf)).unwrap();
        assert!(a.message.contains("8000 Services") && a.message.contains("CNI"), "{}", a.message);
    }
    // already eBPF: nothing to migrate
    let mut o = opts(ClusterFacts { services: Some(50_000), ..Default::default() });
    o.mode = Some(ProxyMode::Ebpf);
    let r = analyze(&[node("n1", &sync_p99_text("0.01", "0.02"))], &o, &TerminationPolicySpec::default());
    assert_eq!(migrations(&r), vec![]);
    // conntrack pressure at any size
    let r = advise_with(ClusterFacts { services: Some(10), conntrack_usage_ratio: Some(0.79), ..Default::default() });
    assert_eq!(migrations(&r), vec![]);
    let r = advise_with(ClusterFacts { services: Some(10), conntrack_usage_ratio: Some(0.8), ..Default::default() });
    assert_eq!(migrations(&r), vec![ProxyMode::Ebpf]);
}

#[test]
fn ipvs_at_any_size_migrates_to_nftables() {
    for services in [None, Some(0), Some(1), Some(999), Some(5000)] {
        let mut o = opts(ClusterFacts { services, ..Default::default() });
        o.mode = Some(ProxyMode::Ipvs);
        let r = analyze(&[node("n1", &sync_p99_text("0.01", "0.02"))], &o, &TerminationPolicySpec::default());
        assert_eq!(migrations(&r), vec![ProxyMode::Nftables], "{services:?}");
        let a = &r.advice[0];
        assert_eq!(a.reason, AdviceReason::MigrateProxyMode);
        assert_eq!(a.threshold, "mode = ipvs (any size)");
        assert!(a.message.contains("deprecated since Kubernetes 1.35"), "{}", a.message);
        assert!(!a.message.to_lowercase().contains("to ipvs"));
        assert_eq!(r.proxy.mode, ProxyMode::Ipvs);
    }
}

#[test]
fn proxy_stale_threshold() {
    // changes queued at 1,700,000,030 after the last sync at 1,700,000,000, scraped at `at`:
    // they have waited `at` - 1,700,000,030 s (kube-proxy's healthz rule), not the 30 s between
    // the two gauges
    let stale = |queued: &str, at: Option<f64>| {
        let text = format!(
            "{}kubeproxy_sync_proxy_rules_last_timestamp_seconds 1.7e+09\nkubeproxy_sync_proxy_rules_last_queued_timestamp_seconds {queued}\n",
            sync_p99_text("0.01", "0.02")
        );
        let later = KubeProxyScrape { scraped_at_unix_seconds: at, ..parse(&text) };
        analyze(&[NodeInput { node: "n1".into(), later, earlier: None, proxy_mode: None }], &opts(ClusterFacts::default()), &TerminationPolicySpec::default())
    };
    // an idle proxy scraped between a change and its sync: 30 s apart, waiting 0.4 s
    let r = stale("1700000030", Some(1_700_000_030.4));
    approx(r.nodes[0].stale_seconds.unwrap(), 0.4, 1e-6);
    assert!(!reasons(&r).contains(&AdviceReason::ProxyStale), "{:?}", r.advice);
    // the threshold: 30 s of waiting is not stale, 30.5 s is
    let r = stale("1700000030", Some(1_700_000_060.0));
    assert_eq!(r.nodes[0].stale_seconds, Some(30.0));
    assert!(!reasons(&r).contains(&AdviceReason::ProxyStale), "{:?}", r.advice);
    let r = stale("1700000030", Some(1_700_000_060.5));
    assert_eq!(r.nodes[0].stale_seconds, Some(30.5));
    assert_eq!(reasons(&r), vec![AdviceReason::ProxyStale]);
    assert_eq!(r.advice[0].threshold, "changes queued without a sync for > 30 s");
    assert!(r.advice[0].message.contains("30.500 s"), "{}", r.advice[0].message);
    // without the scrape's time a wait is unknown: no number, no advice
    let r = stale("1700000030", None);
    assert_eq!(r.nodes[0].stale_seconds, None);
    assert!(!reasons(&r).contains(&AdviceReason::ProxyStale), "{:?}", r.advice);
    // nothing queued since the last sync: 0 whenever it was scraped
    assert_eq!(stale("1699999990", Some(1_800_000_000.0)).nodes[0].stale_seconds, Some(0.0));
    assert_eq!(stale("1699999990", None).nodes[0].stale_seconds, Some(0.0));

    // dual-stack: the oldest last sync and the newest last queue: IPv6 synced at 960 and a
    // change queued at 999 waits at 1,040 for 41 s
    let text = format!(
        "{}kubeproxy_sync_proxy_rules_last_timestamp_seconds{{ip_family=\"IPv4\"}} 1000\nkubeproxy_sync_proxy_rules_last_timestamp_seconds{{ip_family=\"IPv6\"}} 960\nkubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{{ip_family=\"IPv4\"}} 995\nkubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{{ip_family=\"IPv6\"}} 999\n",
        sync_p99_text("0.01", "0.02")
    );
    let later = KubeProxyScrape { scraped_at_unix_seconds: Some(1040.0), ..parse(&text) };
    let r =
        analyze(&[NodeInput { node: "n1".into(), later, earlier: None, proxy_mode: None }], &opts(ClusterFacts::default()), &TerminationPolicySpec::default());
    assert_eq!(r.nodes[0].stale_seconds, Some(41.0));
}

#[test]
fn the_slower_of_two_nodes_is_the_worst_node() {
    let fast = sync_p99_text("0.05", "0.07"); // p99 0.06
    let slow = sync_p99_text("2", "2.2"); // p99 2.1
    let r = analyze(&[node("fast", &fast), node("slow", &slow)], &opts(ClusterFacts::default()), &TerminationPolicySpec::default());
    assert_eq!(r.nodes.len(), 2);
    assert_eq!(r.nodes[0].node, "fast");
    approx(r.nodes[0].propagation_window_seconds.unwrap(), 1.048348, W_TOL);
    approx(r.nodes[1].propagation_window_seconds.unwrap(), 4.295744, W_TOL);
    assert_eq!(r.worst_node.as_deref(), Some("slow"));
    approx(r.propagation_window_seconds.unwrap(), 4.295744, W_TOL);
    approx(r.sync_p99_seconds.unwrap(), 2.1, 1e-9);
    assert_eq!(r.recommendation.pre_stop_seconds, 6); // ceil(4.296 x 1.25 = 5.370)
    // only the slow node is flagged
    assert_eq!(reasons(&r), vec![AdviceReason::ProxySyncSlow]);
    assert_eq!(r.advice[0].node.as_deref(), Some("slow"));
    // order does not matter
    let r2 = analyze(&[node("slow", &slow), node("fast", &fast)], &opts(ClusterFacts::default()), &TerminationPolicySpec::default());
    assert_eq!(r2.worst_node.as_deref(), Some("slow"));
    assert_eq!(r2.recommendation, r.recommendation);

    // a node with a trusted measurement outranks a slower node with too few samples, and the
    // untrusted node is reported
    let few = hist_text(SYNC, &[("4", 0), ("8", 3), ("+Inf", 3)], 18.0);
    let r = analyze(&[node("fast", &fast), node("few", &few)], &opts(ClusterFacts::default()), &TerminationPolicySpec::default());
    assert_eq!(r.worst_node.as_deref(), Some("fast"));
    assert_eq!(reasons(&r), vec![AdviceReason::LowSampleCount]);
}

#[test]
fn ip_family_series_are_summed_before_the_quantile() {
    // 1.33+ dual-stack: two series per family
    let text = "\
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.5\"} 90
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"1\"} 90
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"+Inf\"} 90
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv6\",le=\"0.5\"} 0
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv6\",le=\"1\"} 10
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv6\",le=\"+Inf\"} 10
";
    let s = parse(text);
    let h = s.sync.unwrap();
    assert_eq!(h.count(), 100.0);
    // summed: 90 at <= 0.5, 100 at <= 1: rank 99 -> 0.5 + 0.5 x 9 / 10
    approx(h.quantile(0.99).seconds, 0.95, 1e-12);
}

#[test]
fn estimated_rules_sit_beside_the_actual_count() {
    let r =
        analyze(&[node("n1", V1_29)], &opts(ClusterFacts { services: Some(10), endpoints: Some(12), ..Default::default() }), &TerminationPolicySpec::default());
    assert_eq!(r.proxy.estimated_rules, Some(2 * 10 + 2 * 12));
    assert_eq!(r.proxy.actual_rules, Some(38));
    assert_eq!(r.proxy.services, Some(10));
    assert_eq!(r.proxy.endpoints, Some(12));
}
