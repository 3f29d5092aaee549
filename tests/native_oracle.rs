//! The native-histogram maths (`src/core/exposition/native/`) against Prometheus 3.16 itself: the
//! answers in `tests/data/native-oracle.json` were computed by Prometheus' own Go code
//! (`promql.HistogramQuantile`, `FloatHistogram.Add`, `DetectReset`, `Sub`, `CopyToSchema`) on
//! random native histograms, by `e2e/toolchain/native-oracle` (its `main.go` says how to run it).
//! Quantiles are compared bit for bit; the sum, the delta and the reduction by bucket.

use safe_termination::core::exposition::NativeHistogram;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Hist {
    schema: i32,
    zero_threshold: f64,
    zero_count: f64,
    count: f64,
    sum: f64,
    positive: Vec<(f64, f64)>,
    negative: Vec<(f64, f64)>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Case {
    a: Hist,
    b: Hist,
    quantiles: std::collections::BTreeMap<String, f64>,
    sum: Hist,
    reset: bool,
    delta: Option<Hist>,
    reduced: Hist,
    reduced_to: i32,
}

fn native(h: &Hist) -> NativeHistogram {
    let side = |b: &[(f64, f64)]| b.iter().map(|&(i, c)| (i as i32, c)).collect::<Vec<_>>();
    NativeHistogram::from_buckets(h.schema, (h.zero_threshold, h.zero_count), (h.count, h.sum), &side(&h.positive), &side(&h.negative))
        .expect("Prometheus' histogram is valid")
}

/// Buckets with a count other than 0 (Prometheus keeps or drops empty ones by its own rules of
/// compaction; they hold no observation).
fn populated(b: &[(i32, f64)]) -> Vec<(i32, f64)> {
    b.iter().copied().filter(|b| b.1 != 0.0).collect()
}

fn same(what: &str, n: usize, got: &NativeHistogram, want: &Hist) {
    let want_pos: Vec<(i32, f64)> = want.positive.iter().map(|&(i, c)| (i as i32, c)).filter(|b| b.1 != 0.0).collect();
    let want_neg: Vec<(i32, f64)> = want.negative.iter().map(|&(i, c)| (i as i32, c)).filter(|b| b.1 != 0.0).collect();
    assert_eq!(got.schema(), want.schema, "case {n} {what}: schema");
    assert_eq!(got.zero_threshold(), want.zero_threshold, "case {n} {what}: zero threshold");
    assert_eq!(got.zero_count(), want.zero_count, "case {n} {what}: zero count");
    assert_eq!(got.count(), want.count, "case {n} {what}: count");
    assert_eq!(got.sum(), want.sum, "case {n} {what}: sum");
    assert_eq!(populated(got.positive()), want_pos, "case {n} {what}: positive buckets");
    assert_eq!(populated(got.negative()), want_neg, "case {n} {what}: negative buckets");
}

fn cases() -> Vec<Case> {
    serde_json::from_str(include_str!("data/native-oracle.json")).unwrap()
}

#[test]
fn quantiles_are_prometheus_bit_for_bit() {
    let cases = cases();
    let mut compared = 0;
    for (n, c) in cases.iter().enumerate() {
        let a = native(&c.a);
        for (q, want) in &c.quantiles {
            let q: f64 = q.parse().unwrap();
            let got = a.quantile(q).seconds;
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "case {n}: histogram_quantile({q}) = {want:?} in Prometheus, {got:?} here"
            );
            compared += 1;
        }
    }
    assert!(compared >= 1_500, "{compared} quantiles compared");
}

#[test]
fn sum_reduction_reset_and_delta_are_prometheus() {
    let (mut resets, mut deltas) = (0, 0);
    for (n, c) in cases().iter().enumerate() {
        let (a, b) = (native(&c.a), native(&c.b));
        same("a + b", n, &a.add(&b), &c.sum);
        same("reduced", n, &a.reduce_to_schema(c.reduced_to), &c.reduced);
        let d = b.delta_since(&a);
        assert_eq!(d.is_reset(), c.reset, "case {n}: counter reset");
        match &c.delta {
            Some(want) => {
                same("b - a", n, d.histogram(), want);
                deltas += 1;
            }
            None => {
                same("reset: the later scrape", n, d.histogram(), &c.b);
                resets += 1;
            }
        }
    }
    // the generator makes both kinds: the comparison covers each
    assert!(resets >= 20 && deltas >= 100, "{resets} resets, {deltas} deltas");
}
