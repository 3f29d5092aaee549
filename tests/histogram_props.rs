//! Property tests for the histogram maths and the exposition parser.
//!
//! - `Histogram::quantile` against an independent reference implementation of Prometheus'
//!   `bucketQuantile` (promql/quantile.go, classic buckets) written here with a linear scan;
//! - `delta(later, earlier) + earlier == later` when counters only grow, and a reset otherwise;
//! - the parser never panics on arbitrary input or on mutated real scrapes, and a scrape cut at
//!   any byte never yields a histogram different from the complete scrape's; on all of these the
//!   parser gives the result of `parse_kube_proxy_metrics_strict` (no fast path);
//! - a scrape rendered from a random histogram parses back to the same histogram.

use proptest::prelude::*;
use safe_termination::core::exposition::parse::parse_kube_proxy_metrics_strict;
use safe_termination::core::exposition::{Bucket, Histogram, HistogramError, parse_kube_proxy_metrics};

const SCRAPES: [(&str, &str); 4] = [
    ("v1.29", include_str!("data/metrics/kube-proxy-v1.29-iptables-excerpt.txt")),
    ("v1.13", include_str!("data/metrics/kube-proxy-v1.13-legacy-microseconds.txt")),
    ("v1.8", include_str!("data/metrics/kube-proxy-v1.8-legacy-nan-excerpt.txt")),
    ("windows", include_str!("data/metrics/kube-proxy-windows-truncated.txt")),
];

// ---------------------------------------------------------------------------------------------
// reference implementation of Prometheus bucketQuantile (classic buckets)

/// Prometheus `almost.Equal`.
fn almost_equal(a: f64, b: f64, epsilon: f64) -> bool {
    const MIN_NORMAL: f64 = f64::MIN_POSITIVE; // 2.2250738585072014e-308, as in Go
    if a.is_nan() && b.is_nan() {
        return true;
    }
    if a == b {
        return true;
    }
    let abs_sum = a.abs() + b.abs();
    let diff = (a - b).abs();
    if a == 0.0 || b == 0.0 || abs_sum < MIN_NORMAL {
        return diff < epsilon * MIN_NORMAL;
    }
    diff / abs_sum.min(f64::MAX) < epsilon
}

/// `bucketQuantile(q, buckets)` as in Prometheus: returns (value, rank landed in +Inf).
fn reference_quantile(q: f64, input: &[(f64, f64)]) -> (f64, bool) {
    if q.is_nan() {
        return (f64::NAN, false);
    }
    if q < 0.0 {
        return (f64::NEG_INFINITY, false);
    }
    if q > 1.0 {
        return (f64::INFINITY, false);
    }
    // sort by upper bound (insertion sort: stable and obviously correct)
    let mut b: Vec<(f64, f64)> = Vec::new();
    for &item in input {
        let pos = b.iter().position(|x| x.0 > item.0).unwrap_or(b.len());
        b.insert(pos, item);
    }
    if b.last().is_none_or(|x| x.0 != f64::INFINITY) {
        return (f64::NAN, false);
    }
    // coalesceBuckets: sum counts of equal bounds
    let mut c: Vec<(f64, f64)> = Vec::new();
    for item in b {
        match c.last_mut() {
            Some(last) if last.0 == item.0 => last.1 += item.1,
            _ => c.push(item),
        }
    }
    // ensureMonotonicAndIgnoreSmallDeltas with smallDeltaTolerance 1e-12
    let mut prev = c[0].1;
    for item in c.iter_mut().skip(1) {
        let curr = item.1;
        if curr == prev {
            continue;
        }
        if almost_equal(prev, curr, 1e-12) || curr < prev {
            item.1 = prev;
            continue;
        }
        prev = curr;
    }
    if c.len() < 2 {
        return (f64::NAN, false);
    }
    let observations = c[c.len() - 1].1;
    if observations == 0.0 {
        return (f64::NAN, false);
    }
    let mut rank = q * observations;
    // linear scan for the first of the first n-1 buckets whose count reaches the rank
    let mut idx = c.len() - 1;
    for (i, item) in c.iter().enumerate().take(c.len() - 1) {
        if item.1 >= rank {
            idx = i;
            break;
        }
    }
    if idx == c.len() - 1 {
        return (c[c.len() - 2].0, true);
    }
    if idx == 0 && c[0].0 <= 0.0 {
        return (c[0].0, false);
    }
    let mut start = 0.0;
    let end = c[idx].0;
    let mut count = c[idx].1;
    if idx > 0 {
        start = c[idx - 1].0;
        count -= c[idx - 1].1;
        rank -= c[idx - 1].1;
    }
    (start + (end - start) * (rank / count), false)
}

fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a == b
}

fn buckets_of(pairs: &[(f64, f64)]) -> Vec<Bucket> {
    pairs.iter().map(|&(le, count)| Bucket { upper_bound_seconds: le, count }).collect()
}

// ---------------------------------------------------------------------------------------------
// generators

/// A finite bucket bound: mostly positive and varied in magnitude, sometimes 0 or negative
/// (Prometheus allows any bound), sometimes from kube-proxy's real layouts.
fn bound() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => (1u32..100_000).prop_map(|n| f64::from(n) / 1000.0),
        2 => (0u32..15).prop_map(|k| 0.001 * f64::from(1u32 << k)),
        1 => (0u32..60).prop_map(f64::from),
        1 => Just(0.0),
        1 => (1u32..1000).prop_map(|n| -f64::from(n) / 100.0),
        1 => 1e-9f64..1e9,
    ]
}

/// The rank fraction: uniform, plus the values that hit the edges.
fn quantile() -> impl Strategy<Value = f64> {
    prop_oneof![
        6 => 0.0f64..=1.0,
        1 => Just(0.0),
        1 => Just(1.0),
        1 => Just(0.5),
        2 => Just(0.99),
        1 => Just(0.999),
        1 => prop_oneof![Just(-0.5), Just(1.5), Just(f64::NAN)],
    ]
}

/// Buckets in any order, possibly with duplicate bounds and non-monotonic counts, always with a
/// `+Inf` bucket somewhere.
fn raw_buckets() -> impl Strategy<Value = Vec<(f64, f64)>> {
    (prop::collection::vec((bound(), 0u32..1000), 0..20), 0u32..2000, any::<prop::sample::Index>()).prop_map(|(finite, inf_count, at)| {
        let mut v: Vec<(f64, f64)> = finite.into_iter().map(|(b, c)| (b, f64::from(c))).collect();
        let pos = at.index(v.len() + 1);
        v.insert(pos, (f64::INFINITY, f64::from(inf_count)));
        v
    })
}

/// A well-formed kube-proxy-like histogram: sorted distinct bounds, cumulative counts.
fn cumulative_buckets() -> impl Strategy<Value = Vec<(f64, f64)>> {
    (prop::collection::btree_set(1u32..2_000_000, 0..25), prop::collection::vec(0u32..500, 26)).prop_map(|(bounds, incs)| {
        let mut total = 0u64;
        let mut v: Vec<(f64, f64)> = bounds
            .into_iter()
            .zip(&incs)
            .map(|(b, &inc)| {
                total += u64::from(inc);
                (f64::from(b) / 1000.0, total as f64)
            })
            .collect();
        total += u64::from(incs[25]);
        v.push((f64::INFINITY, total as f64));
        v
    })
}

// ---------------------------------------------------------------------------------------------
// histogram_quantile

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn quantile_matches_prometheus_reference(raw in raw_buckets(), q in quantile()) {
        let h = Histogram::new(buckets_of(&raw), None).expect("has +Inf, no NaN bound");
        let got = h.quantile(q);
        let (want, beyond) = reference_quantile(q, &raw);
        prop_assert!(same(got.seconds, want), "q={q} buckets={raw:?}: got {} want {want}", got.seconds);
        prop_assert_eq!(got.beyond_top_bucket, beyond);
    }

    #[test]
    fn quantile_matches_reference_on_cumulative_histograms(raw in cumulative_buckets(), q in quantile()) {
        let h = Histogram::new(buckets_of(&raw), None).unwrap();
        let got = h.quantile(q);
        let (want, beyond) = reference_quantile(q, &raw);
        prop_assert!(same(got.seconds, want), "q={q} buckets={raw:?}: got {} want {want}", got.seconds);
        prop_assert_eq!(got.beyond_top_bucket, beyond);
        prop_assert_eq!(got.samples, raw.last().unwrap().1);
        // within [0, 1], on non-negative bounds, the estimate is never infinite and lies within
        // the bucket range
        if (0.0..=1.0).contains(&q) && got.seconds.is_finite() {
            let top = h.top_finite_bound_seconds().unwrap_or(0.0);
            prop_assert!(got.seconds >= 0.0 && got.seconds <= top, "{} outside [0, {top}]", got.seconds);
        }
    }

    #[test]
    fn quantile_is_monotonic_in_q(raw in cumulative_buckets(), a in 0.0f64..=1.0, b in 0.0f64..=1.0) {
        let h = Histogram::new(buckets_of(&raw), None).unwrap();
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        let (x, y) = (h.quantile(lo).seconds, h.quantile(hi).seconds);
        // equal up to rounding at a bucket edge (start + (end - start) * 1.0 may be off by an ulp)
        prop_assert!(x.is_nan() && y.is_nan() || x <= y + y.abs() * 1e-12, "q {lo} -> {x}, q {hi} -> {y}");
    }

    #[test]
    fn buckets_without_inf_are_rejected_like_prometheus_nan(raw in prop::collection::vec((bound(), 0u32..1000), 1..20), q in quantile()) {
        let raw: Vec<(f64, f64)> = raw.into_iter().map(|(b, c)| (b, f64::from(c))).collect();
        prop_assert_eq!(Histogram::new(buckets_of(&raw), None), Err(HistogramError::NoInfBucket));
        prop_assert!(reference_quantile(q, &raw).0.is_nan() || q.is_nan() || !(0.0..=1.0).contains(&q));
    }
}

// ---------------------------------------------------------------------------------------------
// deltas between two scrapes

proptest! {
    #[test]
    fn delta_plus_earlier_is_later(earlier in cumulative_buckets(), incs in prop::collection::vec(0u32..300, 26), sum in 0u32..100_000, dsum in 0u32..100_000) {
        // later = earlier + cumulative increments (counters only grow)
        let mut added = 0.0;
        let later: Vec<(f64, f64)> = earlier
            .iter()
            .zip(&incs)
            .map(|(&(le, c), &inc)| {
                added += f64::from(inc);
                (le, c + added)
            })
            .collect();
        let e = Histogram::new(buckets_of(&earlier), Some(f64::from(sum))).unwrap();
        let l = Histogram::new(buckets_of(&later), Some(f64::from(sum) + f64::from(dsum))).unwrap();
        let d = l.delta_since(&e);
        prop_assert!(!d.is_reset());
        let dh = d.histogram();
        prop_assert_eq!(dh.buckets().len(), l.buckets().len());
        for ((db, eb), lb) in dh.buckets().iter().zip(e.buckets()).zip(l.buckets()) {
            prop_assert_eq!(db.upper_bound_seconds, lb.upper_bound_seconds);
            prop_assert_eq!(db.count + eb.count, lb.count);
            prop_assert!(db.count >= 0.0);
        }
        prop_assert_eq!(dh.count(), l.count() - e.count());
        prop_assert_eq!(dh.sum_seconds, Some(f64::from(dsum)));
        // the delta is itself a cumulative histogram
        prop_assert!(dh.buckets().windows(2).all(|w| w[0].count <= w[1].count));
        // a scrape against itself is an empty interval, not a reset
        let same = l.delta_since(&l);
        prop_assert!(!same.is_reset());
        prop_assert_eq!(same.histogram().count(), 0.0);
        prop_assert!(same.histogram().quantile(0.99).seconds.is_nan());
    }

    #[test]
    fn any_count_going_down_is_a_reset(earlier in cumulative_buckets(), at in any::<prop::sample::Index>(), by in 1u32..100) {
        let i = at.index(earlier.len());
        prop_assume!(earlier[i].1 >= f64::from(by));
        let mut later = earlier.clone();
        later[i].1 -= f64::from(by);
        let e = Histogram::new(buckets_of(&earlier), None).unwrap();
        let l = Histogram::new(buckets_of(&later), None).unwrap();
        let d = l.delta_since(&e);
        prop_assert!(d.is_reset());
        prop_assert_eq!(d.histogram(), &l);
    }
}

// ---------------------------------------------------------------------------------------------
// the parser never panics

/// Byte-level mutations of a real scrape.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(prop::sample::Index, u8),
    Delete(prop::sample::Index),
    Insert(prop::sample::Index, u8),
    Duplicate(prop::sample::Index, prop::sample::Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let interesting =
        prop_oneof![any::<u8>(), Just(b'\n'), Just(b'"'), Just(b'\\'), Just(b'{'), Just(b'}'), Just(b'='), Just(b','), Just(b' '), Just(0xC3), Just(0xFF)];
    prop_oneof![
        (any::<prop::sample::Index>(), 1u8..=255).prop_map(|(i, m)| Mutation::Flip(i, m)),
        any::<prop::sample::Index>().prop_map(Mutation::Delete),
        (any::<prop::sample::Index>(), interesting).prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<prop::sample::Index>(), any::<prop::sample::Index>()).prop_map(|(a, b)| Mutation::Duplicate(a, b)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    match m {
        Mutation::Flip(i, mask) => {
            let i = i.index(bytes.len());
            bytes[i] ^= mask;
        }
        Mutation::Delete(i) => {
            bytes.remove(i.index(bytes.len()));
        }
        Mutation::Insert(i, b) => {
            let i = i.index(bytes.len() + 1);
            bytes.insert(i, *b);
        }
        Mutation::Duplicate(a, b) => {
            // copy a slice of up to 200 bytes elsewhere (repeats lines, series, labels)
            let start = a.index(bytes.len());
            let end = (start + 200).min(bytes.len());
            let chunk = bytes[start..end].to_vec();
            let at = b.index(bytes.len() + 1);
            bytes.splice(at..at, chunk);
        }
    }
}

/// Text that reaches deep into the parser: our family names with random label sets and values.
fn exposition_like() -> impl Strategy<Value = String> {
    let name = prop_oneof![
        Just("kubeproxy_sync_proxy_rules_duration_seconds_bucket"),
        Just("kubeproxy_sync_proxy_rules_duration_seconds_sum"),
        Just("kubeproxy_network_programming_duration_seconds_bucket"),
        Just("kubeproxy_sync_proxy_rules_latency_microseconds_bucket"),
        Just("kubeproxy_sync_proxy_rules_iptables_total"),
        Just("kubeproxy_sync_proxy_rules_last_timestamp_seconds"),
        Just("kubernetes_build_info"),
        Just("kubeproxy_"),
        Just("kubeproxy_sync_proxy_rules_durati"),
    ];
    let line = (name, "[{}=\",\\\\a-z0-9 \\t\"+.eEInfNa-]{0,40}", "[ \\t0-9.eE+-InfNa]{0,20}").prop_map(|(n, labels, value)| format!("{n}{labels}{value}"));
    (prop::collection::vec(line, 0..12), any::<bool>()).prop_map(|(lines, newline)| {
        let mut s = lines.join("\n");
        if newline {
            s.push('\n');
        }
        s
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn parser_never_panics_on_arbitrary_strings(s in any::<String>()) {
        // and the fast path for unrelated families gives the full check's result
        prop_assert_eq!(parse_kube_proxy_metrics(&s), parse_kube_proxy_metrics_strict(&s));
    }

    #[test]
    fn parser_never_panics_on_exposition_like_text(s in exposition_like()) {
        let parsed = parse_kube_proxy_metrics(&s);
        prop_assert_eq!(&parsed, &parse_kube_proxy_metrics_strict(&s));
        if let Ok(scrape) = parsed {
            // whatever parsed is a valid histogram: sorted bounds ending in +Inf
            for h in [&scrape.sync, &scrape.network_programming].into_iter().flatten() {
                prop_assert_eq!(h.buckets().last().map(|b| b.upper_bound_seconds), Some(f64::INFINITY));
                prop_assert!(h.buckets().windows(2).all(|w| w[0].upper_bound_seconds < w[1].upper_bound_seconds));
            }
        }
    }

    #[test]
    fn parser_never_panics_on_mutated_real_scrapes(which in 0usize..4, muts in prop::collection::vec(mutation(), 1..8)) {
        let mut bytes = SCRAPES[which].1.as_bytes().to_vec();
        for m in &muts {
            apply(&mut bytes, m);
        }
        let text = String::from_utf8_lossy(&bytes);
        prop_assert_eq!(parse_kube_proxy_metrics(&text), parse_kube_proxy_metrics_strict(&text));
    }

    #[test]
    fn parser_never_panics_on_real_scrapes_cut_at_any_byte(which in 0usize..4, at in any::<prop::sample::Index>()) {
        let bytes = SCRAPES[which].1.as_bytes();
        let text = String::from_utf8_lossy(&bytes[..at.index(bytes.len() + 1)]);
        prop_assert_eq!(parse_kube_proxy_metrics(&text), parse_kube_proxy_metrics_strict(&text));
    }
}

/// A scrape cut at any byte either is rejected or yields, for every histogram it returns, exactly
/// the buckets of the complete scrape: a cut never produces a wrong number (R12). Exhaustive over
/// every cut point of the three complete shared scrapes.
#[test]
fn a_cut_scrape_never_yields_a_different_histogram() {
    for (name, text) in &SCRAPES[..3] {
        let full = parse_kube_proxy_metrics(text).unwrap();
        let mut rejected = 0;
        for n in 0..text.len() {
            let cut = &text[..n]; // the scrapes are ASCII
            let parsed = parse_kube_proxy_metrics(cut);
            assert_eq!(parsed, parse_kube_proxy_metrics_strict(cut), "{name} cut at byte {n}: the fast path differs from the full check");
            let Ok(part) = parsed else {
                rejected += 1;
                continue;
            };
            let pairs = [
                ("sync", &part.sync, &full.sync),
                ("sync_full", &part.sync_full, &full.sync_full),
                ("sync_partial", &part.sync_partial, &full.sync_partial),
                ("network_programming", &part.network_programming, &full.network_programming),
            ];
            for (family, got, want) in pairs {
                if let Some(got) = got {
                    assert_eq!(Some(got.buckets()), want.as_ref().map(|h| h.buckets()), "{name} cut at byte {n}: {family} differs from the complete scrape");
                }
            }
            // a cut inside a sample line of a family we read is always an error
            let last = cut.rsplit('\n').next().unwrap_or("");
            assert!(
                !(last.starts_with("kubeproxy_sync_proxy_rules_duration_seconds")
                    || last.starts_with("kubeproxy_network_programming_duration_seconds")
                    || last.starts_with("kubeproxy_sync_proxy_rules_latency_microseconds")),
                "{name} cut at byte {n} inside {last:?} was accepted"
            );
        }
        assert!(rejected > 0, "{name}: no cut was rejected");
    }
}

// ---------------------------------------------------------------------------------------------
// render -> parse round trip

#[derive(Debug, Clone, Copy)]
enum Style {
    /// Rust `{}`: shortest round-tripping decimal.
    Plain,
    /// `{:e}`: 1.6384e7.
    Exp,
    /// Go's `strconv.FormatFloat(v, 'g', -1, 64)` style for large values: 1.6384e+07.
    GoExp,
}

fn fmt(v: f64, style: Style) -> String {
    if v == f64::INFINITY {
        return "+Inf".into();
    }
    match style {
        Style::Plain => format!("{v}"),
        Style::Exp => format!("{v:e}"),
        Style::GoExp => {
            let s = format!("{v:e}");
            match s.split_once('e') {
                Some((m, e)) if !e.starts_with('-') => format!("{m}e+{e:0>2}"),
                Some((m, e)) => format!("{m}e-{:0>2}", &e[1..]),
                None => s,
            }
        }
    }
}

fn style() -> impl Strategy<Value = Style> {
    prop_oneof![Just(Style::Plain), Just(Style::Exp), Just(Style::GoExp)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// One series, labels around `le`, noise families around it, any number format.
    #[test]
    fn rendered_histogram_parses_back(raw in cumulative_buckets(), sum in 0u32..10_000_000, style in style(), extra_label in any::<bool>(), family in 0usize..2, crlf in any::<bool>()) {
        let fam = ["kubeproxy_sync_proxy_rules_duration_seconds", "kubeproxy_network_programming_duration_seconds"][family];
        let sum = f64::from(sum) / 1000.0;
        let nl = if crlf { "\r\n" } else { "\n" };
        let mut text = format!("# HELP go_goroutines x{nl}# TYPE go_goroutines gauge{nl}go_goroutines 46{nl}# HELP {fam} synthetic{nl}# TYPE {fam} histogram{nl}");
        for &(le, c) in &raw {
            let labels = if extra_label {
                format!("{{ip_family=\"IPv4\",le=\"{}\",zone=\"a,b \\\"c\\\"\"}}", fmt(le, style))
            } else {
                format!("{{le=\"{}\"}}", fmt(le, style))
            };
            text.push_str(&format!("{fam}_bucket{labels} {}{nl}", fmt(c, style)));
        }
        text.push_str(&format!("{fam}_sum {}{nl}{fam}_count {}{nl}", fmt(sum, style), fmt(raw.last().unwrap().1, style)));
        text.push_str(&format!("rest_client_requests_total{{code=\"200\"}} 7{nl}"));
        let scrape = parse_kube_proxy_metrics(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        let want = Histogram::new(buckets_of(&raw), Some(sum)).unwrap();
        let got = if family == 0 { scrape.sync } else { scrape.network_programming };
        prop_assert_eq!(got, Some(want));
    }

    /// Dual-stack: the histogram split across two `ip_family` series (interleaved or one after
    /// the other) parses back to the sum.
    #[test]
    fn rendered_dual_stack_histogram_parses_back_to_the_sum(raw in cumulative_buckets(), split in prop::collection::vec(0.0f64..=1.0, 26), sum in 0u32..100_000, interleave in any::<bool>()) {
        // split each bucket's increment between IPv4 and IPv6, keeping both cumulative
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        let (mut a, mut b, mut prev) = (0.0f64, 0.0f64, 0.0f64);
        for (i, &(le, c)) in raw.iter().enumerate() {
            let inc = c - prev;
            prev = c;
            let to_v4 = (inc * split[i]).floor();
            a += to_v4;
            b += inc - to_v4;
            v4.push((le, a));
            v6.push((le, b));
        }
        let line = |fam: &str, ip: &str, le: f64, c: f64| format!("{fam}_bucket{{ip_family=\"{ip}\",le=\"{}\"}} {c}\n", fmt(le, Style::Plain));
        let fam = "kubeproxy_sync_proxy_rules_duration_seconds";
        let mut text = String::new();
        if interleave {
            for (x, y) in v4.iter().zip(&v6) {
                text.push_str(&line(fam, "IPv4", x.0, x.1));
                text.push_str(&line(fam, "IPv6", y.0, y.1));
            }
        } else {
            for x in &v4 { text.push_str(&line(fam, "IPv4", x.0, x.1)); }
            for y in &v6 { text.push_str(&line(fam, "IPv6", y.0, y.1)); }
        }
        text.push_str(&format!("{fam}_sum{{ip_family=\"IPv4\"}} {sum}\n{fam}_sum{{ip_family=\"IPv6\"}} 0\n"));
        let got = parse_kube_proxy_metrics(&text).map_err(|e| TestCaseError::fail(e.to_string()))?.sync;
        prop_assert_eq!(got, Some(Histogram::new(buckets_of(&raw), Some(f64::from(sum))).unwrap()));
    }

    /// The legacy microsecond family parses back converted to seconds, bound by bound.
    #[test]
    fn rendered_legacy_microsecond_histogram_parses_back_in_seconds(raw in cumulative_buckets(), sum in 0u32..10_000_000, style in style()) {
        let fam = "kubeproxy_sync_proxy_rules_latency_microseconds";
        let mut text = String::new();
        for &(le, c) in &raw {
            text.push_str(&format!("{fam}_bucket{{le=\"{}\"}} {c}\n", fmt(le, style)));
        }
        text.push_str(&format!("{fam}_sum {sum}\n{fam}_count {}\n", raw.last().unwrap().1));
        let scrape = parse_kube_proxy_metrics(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(scrape.sync_from_legacy_microseconds);
        let seconds: Vec<(f64, f64)> = raw.iter().map(|&(le, c)| (le * 1e-6, c)).collect();
        prop_assert_eq!(scrape.sync, Some(Histogram::new(buckets_of(&seconds), Some(f64::from(sum) * 1e-6)).unwrap()));
    }
}
