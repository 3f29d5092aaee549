//! Writing the project's own Prometheus families (the node agent's observer metrics): a
//! histogram that is native and classic at once ([`ObservedHistogram`]), and counters, in the
//! protobuf exposition (length-delimited `MetricFamily` messages of client_model's
//! `metrics.proto`, where native histograms live) and in the text exposition 0.0.4 (classic
//! buckets only: the text format has no native histograms). Pure, no I/O.
//!
//! Shapes follow client_golang, so Prometheus reads them as it reads a Go client's: integer
//! buckets written as deltas, spans over runs of buckets, a no-op span on a native histogram
//! with no positive bucket (so an empty one is still taken for native), and the classic buckets
//! cumulative with `+Inf` left to the count.

use super::native::{positive_bucket_index, spans_of};
use super::protobuf::wire;
use prost::Message;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A histogram of observations (seconds, or any unit), kept both ways: native buckets of
/// `schema` above a zero bucket of `zero_threshold`, and classic buckets of `classic_bounds`.
/// Bounded: at schema `s`, observations from `zero_threshold` to `v` take at most
/// `log2(v / zero_threshold) x 2^s + 1` native buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedHistogram {
    schema: i32,
    zero_threshold: f64,
    classic_bounds: &'static [f64],
    count: u64,
    sum: f64,
    zero_count: u64,
    positive: BTreeMap<i32, u64>,
    /// Observations per classic bucket (not cumulative), one more than the bounds (`+Inf`).
    classic: Vec<u64>,
}

impl ObservedHistogram {
    /// An empty histogram. `schema` is clamped to -4..=8; `classic_bounds` must ascend.
    pub fn new(schema: i32, zero_threshold: f64, classic_bounds: &'static [f64]) -> Self {
        Self {
            schema: schema.clamp(-4, 8),
            zero_threshold: zero_threshold.max(0.0),
            classic_bounds,
            count: 0,
            sum: 0.0,
            zero_count: 0,
            positive: BTreeMap::new(),
            classic: vec![0; classic_bounds.len() + 1],
        }
    }

    /// Counts `value`. Values below 0 or not finite are not counted (false): the callers'
    /// windows are finite and at least 0.
    pub fn observe(&mut self, value: f64) -> bool {
        if !value.is_finite() || value < 0.0 {
            return false;
        }
        self.count += 1;
        self.sum += value;
        if value <= self.zero_threshold {
            self.zero_count += 1;
        } else {
            *self.positive.entry(positive_bucket_index(value, self.schema)).or_default() += 1;
        }
        let classic = self.classic_bounds.iter().position(|b| value <= *b).unwrap_or(self.classic_bounds.len());
        self.classic[classic] += 1;
        true
    }

    /// Observations counted.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The histogram as client_model's message.
    pub fn to_wire(&self) -> wire::Histogram {
        let buckets: Vec<(i32, f64)> = self.positive.iter().map(|(i, c)| (*i, *c as f64)).collect();
        let (spans, counts) = spans_of(&buckets);
        let mut positive_span: Vec<wire::BucketSpan> = spans.iter().map(|s| wire::BucketSpan { offset: Some(s.offset), length: Some(s.length) }).collect();
        if positive_span.is_empty() {
            // client_golang's no-op span: marks the histogram native when it has no bucket yet
            positive_span.push(wire::BucketSpan { offset: Some(0), length: Some(0) });
        }
        let mut previous = 0i64;
        let positive_delta = counts
            .iter()
            .map(|c| {
                let c = *c as i64;
                let d = c - previous;
                previous = c;
                d
            })
            .collect();
        let mut cumulative = 0;
        let bucket = self
            .classic_bounds
            .iter()
            .zip(&self.classic)
            .map(|(bound, n)| {
                cumulative += n;
                wire::Bucket { cumulative_count: Some(cumulative), cumulative_count_float: None, upper_bound: Some(*bound) }
            })
            .collect();
        wire::Histogram {
            sample_count: Some(self.count),
            sample_sum: Some(self.sum),
            bucket,
            schema: Some(self.schema),
            zero_threshold: Some(self.zero_threshold),
            zero_count: Some(self.zero_count),
            positive_span,
            positive_delta,
            ..Default::default()
        }
    }
}

/// One series' labels: (name, value) pairs.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

fn wire_labels(labels: Labels<'_>) -> Vec<wire::LabelPair> {
    labels.iter().map(|(n, v)| wire::LabelPair { name: Some((*n).to_string()), value: Some((*v).to_string()) }).collect()
}

/// A histogram family of one series, as one length-delimited protobuf message.
pub fn histogram_protobuf(name: &str, help: &str, labels: Labels<'_>, h: &ObservedHistogram) -> Vec<u8> {
    family(name, help, wire::MetricType::Histogram, vec![wire::Metric { label: wire_labels(labels), histogram: Some(h.to_wire()), ..Default::default() }])
}

/// A counter family of `series` (labels, value), as one length-delimited protobuf message.
pub fn counter_protobuf(name: &str, help: &str, series: &[(Labels<'_>, f64)]) -> Vec<u8> {
    let metric = series
        .iter()
        .map(|(labels, value)| wire::Metric { label: wire_labels(labels), counter: Some(wire::Value { value: Some(*value) }), ..Default::default() })
        .collect();
    family(name, help, wire::MetricType::Counter, metric)
}

fn family(name: &str, help: &str, kind: wire::MetricType, metric: Vec<wire::Metric>) -> Vec<u8> {
    wire::MetricFamily { name: Some(name.to_string()), help: Some(help.to_string()), r#type: Some(kind as i32), metric, unit: None }
        .encode_length_delimited_to_vec()
}

/// `labels` in the text exposition, with `extra` last: `{a="x",le="0.5"}`, values escaped
/// (backslash, double quote, line feed), or nothing when there are none.
fn text_labels(labels: Labels<'_>, extra: Option<(&str, &str)>) -> String {
    let all: Vec<String> =
        labels.iter().copied().chain(extra).map(|(n, v)| format!("{n}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"))).collect();
    if all.is_empty() { String::new() } else { format!("{{{}}}", all.join(",")) }
}

/// `help` escaped for a `# HELP` line (backslash and line feed).
fn text_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A histogram family of one series in the text exposition: its classic buckets, `+Inf`,
/// `_sum` and `_count`.
pub fn histogram_text(name: &str, help: &str, labels: Labels<'_>, h: &ObservedHistogram) -> String {
    let mut out = format!("# HELP {name} {}\n# TYPE {name} histogram\n", text_help(help));
    let mut cumulative = 0;
    for (bound, n) in h.classic_bounds.iter().zip(&h.classic) {
        cumulative += n;
        let _ = writeln!(out, "{name}_bucket{} {cumulative}", text_labels(labels, Some(("le", &bound.to_string()))));
    }
    let _ = writeln!(out, "{name}_bucket{} {}", text_labels(labels, Some(("le", "+Inf"))), h.count);
    let _ = writeln!(out, "{name}_sum{} {}", text_labels(labels, None), h.sum);
    let _ = writeln!(out, "{name}_count{} {}", text_labels(labels, None), h.count);
    out
}

/// A counter family of `series` (labels, value) in the text exposition.
pub fn counter_text(name: &str, help: &str, series: &[(Labels<'_>, f64)]) -> String {
    let mut out = format!("# HELP {name} {}\n# TYPE {name} counter\n", text_help(help));
    for (labels, value) in series {
        let _ = writeln!(out, "{name}{} {value}", text_labels(labels, None));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::exposition::native::NativeHistogram;
    use crate::core::exposition::protobuf::native_parts;

    const BOUNDS: &[f64] = &[0.1, 0.5, 1.0, 2.0];

    /// The upper bound of a positive bucket, from the reader's side (a histogram of the one
    /// bucket, read back by the decoder): the writer's index is checked against it.
    fn upper_bound(index: i32, schema: i32) -> f64 {
        let h = NativeHistogram::from_buckets(schema, (0.0, 0.0), (1.0, 0.0), &[(index, 1.0)], &[]).unwrap();
        h.highest_positive_upper_bound().unwrap()
    }

    #[test]
    fn each_value_goes_to_the_bucket_whose_bounds_hold_it() {
        for schema in [-4, -1, 0, 1, 3, 8] {
            for v in [1e-3, 0.0123, 0.25, 0.5, 0.7, 1.0, 1.0000001, 1.5, 2.0, 3.3, 100.0, 3600.0] {
                let i = positive_bucket_index(v, schema);
                assert!(upper_bound(i, schema) >= v && upper_bound(i - 1, schema) < v, "schema {schema}, {v} in bucket {i}");
            }
        }
        // exact powers of two are the upper bound of their bucket, as in Prometheus
        assert_eq!((positive_bucket_index(1.0, 3), positive_bucket_index(2.0, 3), positive_bucket_index(0.5, 0)), (0, 8, -1));
    }

    #[test]
    fn the_protobuf_family_reads_back_as_the_same_native_and_classic_histogram() {
        let mut h = ObservedHistogram::new(3, 1e-3, BOUNDS);
        for v in [0.0, 0.0004, 0.3, 0.31, 0.9, 1.7, 5.0] {
            assert!(h.observe(v));
        }
        assert!(!h.observe(-1.0) && !h.observe(f64::NAN), "no negative or NaN observation");
        let body = histogram_protobuf("x_seconds", "help", &[("node", "node-a")], &h);
        let family = wire::MetricFamily::decode_length_delimited(body.as_slice()).unwrap();
        assert_eq!((family.name.as_deref(), family.r#type), (Some("x_seconds"), Some(wire::MetricType::Histogram as i32)));
        let wire = family.metric[0].histogram.clone().unwrap();
        let parts = native_parts(&wire).unwrap().expect("native");
        let native = NativeHistogram::new(parts).unwrap();
        assert_eq!((native.count(), native.zero_count(), native.schema()), (7.0, 2.0, 3));
        assert!((native.sum() - 8.2104).abs() < 1e-12);
        // 4 positive buckets: 0.3 and 0.31 share one (2^(-14/8) = 0.2973 .. 2^(-13/8) = 0.3242)
        assert_eq!(native.positive().iter().map(|(_, c)| *c).collect::<Vec<_>>(), vec![2.0, 1.0, 1.0, 1.0]);
        let classic: Vec<u64> = wire.bucket.iter().map(|b| b.cumulative_count.unwrap()).collect();
        assert_eq!(classic, vec![2, 4, 5, 6], "cumulative, 5.0 only in +Inf (the count)");
    }

    #[test]
    fn an_empty_histogram_is_still_native() {
        let h = ObservedHistogram::new(3, 1e-3, BOUNDS);
        let wire = h.to_wire();
        assert!(native_parts(&wire).unwrap().is_some(), "the no-op span marks it native");
        assert_eq!(h.count(), 0);
    }

    #[test]
    fn the_text_families_are_classic_and_escaped() {
        let mut h = ObservedHistogram::new(3, 1e-3, BOUNDS);
        h.observe(0.3);
        h.observe(3.0);
        let text = histogram_text("x_seconds", "a \\ b\nc", &[("node", "a\"b")], &h);
        assert_eq!(
            text,
            "# HELP x_seconds a \\\\ b\\nc\n# TYPE x_seconds histogram\n\
             x_seconds_bucket{node=\"a\\\"b\",le=\"0.1\"} 0\nx_seconds_bucket{node=\"a\\\"b\",le=\"0.5\"} 1\n\
             x_seconds_bucket{node=\"a\\\"b\",le=\"1\"} 1\nx_seconds_bucket{node=\"a\\\"b\",le=\"2\"} 1\n\
             x_seconds_bucket{node=\"a\\\"b\",le=\"+Inf\"} 2\nx_seconds_sum{node=\"a\\\"b\"} 3.3\nx_seconds_count{node=\"a\\\"b\"} 2\n"
        );
        assert_eq!(counter_text("c_total", "h", &[(&[], 3.0)]), "# HELP c_total h\n# TYPE c_total counter\nc_total 3\n");
        let two = counter_text("r_total", "h", &[(&[("result", "ok")], 2.0), (&[("result", "failed")], 0.0)]);
        assert_eq!(two, "# HELP r_total h\n# TYPE r_total counter\nr_total{result=\"ok\"} 2\nr_total{result=\"failed\"} 0\n");
        let family =
            wire::MetricFamily::decode_length_delimited(counter_protobuf("r_total", "h", &[(&[("result", "ok")], 2.0), (&[], 1.0)]).as_slice()).unwrap();
        assert_eq!(family.metric.iter().map(|m| m.counter.as_ref().unwrap().value.unwrap()).collect::<Vec<_>>(), vec![2.0, 1.0]);
    }
}
