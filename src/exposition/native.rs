//! Native (exponential, sparse) Prometheus histograms: the shape, its checks, and the maths the
//! model needs (quantile, delta between two scrapes, schema reduction). Pure, no I/O.
//!
//! # Shape
//!
//! A native histogram with schema `s` (-4..=8) has base `b = 2^(2^-s)`: bucket index `i` covers
//! `(b^(i-1), b^i]` for positive observations and `[-b^i, -b^(i-1))` for negative ones. Around 0
//! the zero bucket `[-zero_threshold, zero_threshold]` holds `zero_count` observations. kube-proxy
//! 1.37 exports its sync histograms with schema 3 (bucket factor 1.1 in client_golang, each
//! bucket 2^(1/8) = 1.0905 x the last) and a zero threshold of 2^-128.
//!
//! The exposition carries buckets as spans (`offset`, `length`) and per-bucket counts (integer
//! deltas, or absolute float counts): the first span's offset is the absolute index of its first
//! bucket, each later span's offset is the gap after the previous span. [`NativeHistogram`] keeps
//! the buckets decoded: `(index, count)` pairs sorted by index, counts absolute (not cumulative,
//! not deltas), in the unit of the metric (seconds here).
//!
//! Source of these rules: the Prometheus protobuf definition (`io.prometheus.client.Histogram`
//! in `prometheus/client_model` `metrics.proto`) and `model/histogram` in prometheus/prometheus
//! (`Validate`, the bucket boundaries).

use super::histogram::{HistogramKind, Quantile};
use serde::Serialize;

/// One span of consecutive buckets as the exposition carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Span {
    /// The first span: the absolute index of its first bucket. A later span: the number of empty
    /// buckets between the previous span's last bucket and this span's first (>= 0).
    pub offset: i32,
    /// Number of consecutive buckets in the span.
    pub length: u32,
}

/// Lowest and highest exponential schema Prometheus accepts (`model/histogram`:
/// `ExponentialSchemaMin`, `ExponentialSchemaMax`). Custom-bucket schema -53 is not read here.
pub const SCHEMA_MIN: i32 = -4;
/// See [`SCHEMA_MIN`].
pub const SCHEMA_MAX: i32 = 8;

/// Why a set of spans and counts is not a native histogram.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NativeHistogramError {
    /// A schema outside -4..=8 (custom buckets, schema -53, included).
    #[error("schema {0} is not an exponential schema (-4..=8)")]
    Schema(i32),
    /// The spans cover a different number of buckets than there are counts.
    #[error("{side} spans cover {spans} buckets but {counts} counts were given")]
    SpanCountMismatch {
        /// `positive` or `negative`.
        side: &'static str,
        /// Buckets covered by the spans.
        spans: u64,
        /// Counts given.
        counts: usize,
    },
    /// A later span with a negative offset (buckets out of order or overlapping).
    #[error("{side} span {span} has a negative offset {offset}")]
    NegativeSpanOffset {
        /// `positive` or `negative`.
        side: &'static str,
        /// 0-based span number.
        span: usize,
        /// Its offset.
        offset: i32,
    },
    /// A bucket index outside the `i32` range.
    #[error("{side} bucket index overflows")]
    IndexOverflow {
        /// `positive` or `negative`.
        side: &'static str,
    },
    /// A bucket count that is negative, NaN or infinite.
    #[error("{side} bucket {index} has count {count}")]
    BadCount {
        /// `positive`, `negative` or `zero`.
        side: &'static str,
        /// Bucket index (0 for the zero bucket).
        index: i32,
        /// The count.
        count: f64,
    },
    /// The total count is negative, NaN or infinite, or lower than the buckets hold.
    #[error("count {count} is below the {buckets} observations in the buckets")]
    Count {
        /// The histogram's count.
        count: f64,
        /// Sum of zero, positive and negative bucket counts.
        buckets: f64,
    },
    /// A zero threshold that is negative, NaN or infinite.
    #[error("zero threshold {0} is not a finite number >= 0")]
    ZeroThreshold(f64),
}

/// A native histogram, decoded (see the module docs). Build it with [`NativeHistogram::new`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NativeHistogram {
    schema: i32,
    zero_threshold: f64,
    zero_count: f64,
    count: f64,
    sum: f64,
    /// Positive buckets: (index, count), sorted by index, distinct indices, counts absolute.
    positive: Vec<(i32, f64)>,
    /// Negative buckets, the same way (index `i` covers `[-b^i, -b^(i-1))`).
    negative: Vec<(i32, f64)>,
}

/// The parts of a native histogram as the exposition carries them, counts already absolute
/// (the decoder turns integer deltas into counts).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NativeParts {
    /// Schema, -4..=8.
    pub schema: i32,
    /// Width of the zero bucket: it holds observations in `[-zero_threshold, zero_threshold]`.
    pub zero_threshold: f64,
    /// Observations in the zero bucket.
    pub zero_count: f64,
    /// All observations (the histogram's `_count`): at least the buckets' sum.
    pub count: f64,
    /// Sum of observations (the histogram's `_sum`), in the metric's unit.
    pub sum: f64,
    /// Positive spans.
    pub positive_spans: Vec<Span>,
    /// Absolute count per positive bucket, in span order.
    pub positive_counts: Vec<f64>,
    /// Negative spans.
    pub negative_spans: Vec<Span>,
    /// Absolute count per negative bucket, in span order.
    pub negative_counts: Vec<f64>,
}

fn expand(side: &'static str, spans: &[Span], counts: &[f64]) -> Result<Vec<(i32, f64)>, NativeHistogramError> {
    let covered: u64 = spans.iter().map(|s| u64::from(s.length)).sum();
    if covered != counts.len() as u64 {
        return Err(NativeHistogramError::SpanCountMismatch { side, spans: covered, counts: counts.len() });
    }
    let mut out = Vec::with_capacity(counts.len());
    let mut counts = counts.iter();
    // the next index as i64: a span may end exactly at i32::MAX
    let mut next: i64 = 0;
    for (n, span) in spans.iter().enumerate() {
        if n > 0 && span.offset < 0 {
            return Err(NativeHistogramError::NegativeSpanOffset { side, span: n, offset: span.offset });
        }
        next = if n == 0 { i64::from(span.offset) } else { next + i64::from(span.offset) };
        for _ in 0..span.length {
            let index = i32::try_from(next).map_err(|_| NativeHistogramError::IndexOverflow { side })?;
            let &count = counts.next().expect("spans cover exactly the counts (checked above)");
            if !(count.is_finite() && count >= 0.0) {
                return Err(NativeHistogramError::BadCount { side, index, count });
            }
            out.push((index, count));
            next += 1;
        }
    }
    Ok(out)
}

impl NativeHistogram {
    /// Checks and decodes the parts: schema -4..=8, spans covering exactly the counts, later
    /// span offsets >= 0, counts finite and >= 0, a finite zero threshold >= 0, and a count that
    /// is finite and at least what the buckets hold (it may be more: NaN observations are counted
    /// in no bucket). Buckets with count 0 are kept (the exposition may carry them).
    pub fn new(parts: NativeParts) -> Result<Self, NativeHistogramError> {
        if !(SCHEMA_MIN..=SCHEMA_MAX).contains(&parts.schema) {
            return Err(NativeHistogramError::Schema(parts.schema));
        }
        if !(parts.zero_threshold.is_finite() && parts.zero_threshold >= 0.0) {
            return Err(NativeHistogramError::ZeroThreshold(parts.zero_threshold));
        }
        if !(parts.zero_count.is_finite() && parts.zero_count >= 0.0) {
            return Err(NativeHistogramError::BadCount { side: "zero", index: 0, count: parts.zero_count });
        }
        let positive = expand("positive", &parts.positive_spans, &parts.positive_counts)?;
        let negative = expand("negative", &parts.negative_spans, &parts.negative_counts)?;
        let buckets = parts.zero_count + positive.iter().chain(&negative).map(|b| b.1).sum::<f64>();
        // a relative tolerance: float counts summed in another order may differ in the last bits
        if !(parts.count.is_finite() && parts.count >= 0.0 && parts.count >= buckets * (1.0 - 1e-12)) {
            return Err(NativeHistogramError::Count { count: parts.count, buckets });
        }
        Ok(Self {
            schema: parts.schema,
            zero_threshold: parts.zero_threshold,
            zero_count: parts.zero_count,
            count: parts.count,
            sum: parts.sum,
            positive,
            negative,
        })
    }

    /// The schema (-4..=8).
    pub fn schema(&self) -> i32 {
        self.schema
    }

    /// The zero bucket's threshold.
    pub fn zero_threshold(&self) -> f64 {
        self.zero_threshold
    }

    /// Observations in the zero bucket.
    pub fn zero_count(&self) -> f64 {
        self.zero_count
    }

    /// All observations.
    pub fn count(&self) -> f64 {
        self.count
    }

    /// Sum of observations, in the metric's unit.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// Positive buckets: (index, count), sorted by index.
    pub fn positive(&self) -> &[(i32, f64)] {
        &self.positive
    }

    /// Negative buckets: (index, count), sorted by index.
    pub fn negative(&self) -> &[(i32, f64)] {
        &self.negative
    }

    /// Prometheus 3 `histogram_quantile(q, ...)` on this native histogram. `kind` is
    /// [`HistogramKind::Native`], `samples` the count, `beyond_top_bucket` always false (native
    /// buckets have no top).
    pub fn quantile(&self, q: f64) -> Quantile {
        let _ = q;
        unimplemented!("native quantile")
    }

    /// The same observations in the coarser `schema` (<= [`Self::schema`]): bucket `i` goes
    /// to `((i - 1) >> (self.schema - schema)) + 1`.
    pub fn reduce_to_schema(&self, schema: i32) -> NativeHistogram {
        let _ = schema;
        unimplemented!("reduce_to_schema")
    }

    /// Prometheus `sum()` of two native histograms: the coarser schema, the wider zero bucket.
    pub fn add(&self, other: &NativeHistogram) -> NativeHistogram {
        let _ = other;
        unimplemented!("add")
    }

    /// The observations made between `earlier` and `self` (two scrapes of one series), or
    /// [`NativeDelta::Reset`] with `self` when a counter reset is detected.
    pub fn delta_since(&self, earlier: &NativeHistogram) -> NativeDelta {
        let _ = earlier;
        unimplemented!("delta_since")
    }
}

/// Result of [`NativeHistogram::delta_since`].
#[derive(Debug, Clone, PartialEq)]
pub enum NativeDelta {
    /// Observations made between the two scrapes.
    Interval(NativeHistogram),
    /// A counter reset (process restart): the later scrape on its own.
    Reset(NativeHistogram),
}

impl NativeDelta {
    /// The histogram either way.
    pub fn histogram(&self) -> &NativeHistogram {
        match self {
            NativeDelta::Interval(h) | NativeDelta::Reset(h) => h,
        }
    }

    /// True when a counter reset was detected.
    pub fn is_reset(&self) -> bool {
        matches!(self, NativeDelta::Reset(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_decode_to_absolute_indices() {
        let h = NativeHistogram::new(NativeParts {
            schema: 3,
            count: 6.0,
            sum: 1.0,
            positive_spans: vec![Span { offset: -30, length: 2 }, Span { offset: 3, length: 1 }],
            positive_counts: vec![1.0, 2.0, 3.0],
            ..NativeParts::default()
        })
        .unwrap();
        assert_eq!(h.positive(), &[(-30, 1.0), (-29, 2.0), (-25, 3.0)]);
    }

    #[test]
    fn mismatched_spans_and_bad_counts_are_errors() {
        let bad = |p: NativeParts| NativeHistogram::new(p).unwrap_err();
        let one = |c: f64| NativeParts { count: 10.0, positive_spans: vec![Span { offset: 0, length: 1 }], positive_counts: vec![c], ..NativeParts::default() };
        assert!(matches!(bad(NativeParts { positive_spans: vec![Span { offset: 0, length: 2 }], positive_counts: vec![1.0], ..NativeParts::default() }), NativeHistogramError::SpanCountMismatch { .. }));
        assert!(matches!(bad(one(f64::NAN)), NativeHistogramError::BadCount { .. }));
        assert!(matches!(bad(one(-1.0)), NativeHistogramError::BadCount { .. }));
        assert!(matches!(bad(one(11.0)), NativeHistogramError::Count { .. }));
        assert!(matches!(bad(NativeParts { schema: -53, ..NativeParts::default() }), NativeHistogramError::Schema(-53)));
        let later_negative = NativeParts {
            count: 2.0,
            positive_spans: vec![Span { offset: 0, length: 1 }, Span { offset: -1, length: 1 }],
            positive_counts: vec![1.0, 1.0],
            ..NativeParts::default()
        };
        assert!(matches!(bad(later_negative), NativeHistogramError::NegativeSpanOffset { span: 1, .. }));
        let overflow = NativeParts { count: 2.0, positive_spans: vec![Span { offset: i32::MAX, length: 2 }], positive_counts: vec![1.0, 1.0], ..NativeParts::default() };
        assert!(matches!(bad(overflow), NativeHistogramError::IndexOverflow { .. }));
    }
}
