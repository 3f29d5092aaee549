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

mod bounds;

use super::histogram::{HistogramKind, Quantile};
use bounds::{bound, go_exp2, go_log2, lower_bound};
use serde::Serialize;

pub use bounds::positive_bucket_index;

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

/// Spans and counts for `(index, count)` buckets sorted by index, the inverse of what
/// [`NativeHistogram::new`] decodes: one span per run of consecutive indices, and a gap too wide
/// for an `i32` offset bridged by empty spans (length 0, as Prometheus' iterators allow).
pub fn spans_of(buckets: &[(i32, f64)]) -> (Vec<Span>, Vec<f64>) {
    let mut spans: Vec<Span> = Vec::new();
    let mut previous: Option<i32> = None;
    for &(i, _) in buckets {
        match previous {
            Some(p) if i64::from(i) == i64::from(p) + 1 => spans.last_mut().expect("a run is open").length += 1,
            Some(p) => {
                let mut gap = i64::from(i) - i64::from(p) - 1;
                while gap > i64::from(i32::MAX) {
                    spans.push(Span { offset: i32::MAX, length: 0 });
                    gap -= i64::from(i32::MAX);
                }
                spans.push(Span { offset: gap as i32, length: 1 });
            }
            None => spans.push(Span { offset: i, length: 1 }),
        }
        previous = Some(i);
    }
    (spans, buckets.iter().map(|b| b.1).collect())
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

    /// A native histogram from decoded `(index, count)` buckets per side (sorted by index,
    /// counts absolute), with the checks of [`Self::new`]: buckets out of order or repeated
    /// give a negative span offset and are refused like one.
    pub fn from_buckets(
        schema: i32,
        (zero_threshold, zero_count): (f64, f64),
        (count, sum): (f64, f64),
        positive: &[(i32, f64)],
        negative: &[(i32, f64)],
    ) -> Result<Self, NativeHistogramError> {
        let (positive_spans, positive_counts) = spans_of(positive);
        let (negative_spans, negative_counts) = spans_of(negative);
        Self::new(NativeParts { schema, zero_threshold, zero_count, count, sum, positive_spans, positive_counts, negative_spans, negative_counts })
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

    /// Prometheus 3 `histogram_quantile(q, ...)` on this native histogram (`promql/quantile.go`
    /// `HistogramQuantile`): `-Inf`/`+Inf` for `q` outside `[0, 1]`, NaN for NaN `q` or no
    /// observations. The rank is counted from below (`q < 0.5`, or a NaN sum) or from above
    /// (`q >= 0.5`, over `(1 - q) x count`), skipping empty buckets; inside the bucket it lands
    /// in, the estimate is interpolated exponentially (linearly on a log2 scale), and linearly in
    /// the zero bucket, whose lower bound is 0 when the histogram has only positive buckets.
    /// `log2`/`exp2` are Go's ([`go_log2`], [`go_exp2`]) so that the result is Prometheus'
    /// bit for bit. `kind` is [`HistogramKind::Native`], `samples` the count, and
    /// `beyond_top_bucket` false (native buckets have no top).
    pub fn quantile(&self, q: f64) -> Quantile {
        let out = |seconds| Quantile { seconds, beyond_top_bucket: false, samples: self.count, kind: HistogramKind::Native };
        if q < 0.0 {
            return out(f64::NEG_INFINITY);
        }
        if q > 1.0 {
            return out(f64::INFINITY);
        }
        if self.count == 0.0 || q.is_nan() {
            return out(f64::NAN);
        }
        let buckets = self.ascending_buckets();
        let forward = self.sum.is_nan() || q < 0.5;
        let mut rank = if forward { q * self.count } else { (1.0 - q) * self.count };
        let mut order: Box<dyn Iterator<Item = &Bound>> = if forward { Box::new(buckets.iter()) } else { Box::new(buckets.iter().rev()) };
        let mut bucket = Bound { lower: 0.0, upper: 0.0, count: 0.0 };
        let mut count = 0.0;
        for b in &mut order {
            bucket = *b;
            if b.count == 0.0 {
                continue;
            }
            count += b.count;
            if count >= rank {
                break;
            }
        }
        if bucket.lower < 0.0 && bucket.upper > 0.0 {
            if self.negative.is_empty() && !self.positive.is_empty() {
                bucket.lower = 0.0;
            } else if self.positive.is_empty() && !self.negative.is_empty() {
                bucket.upper = 0.0;
            }
        }
        count = count.min(self.count);
        if count < rank {
            return out(if self.sum.is_nan() { f64::NAN } else { bucket.upper });
        }
        if forward {
            rank -= count - bucket.count;
        } else {
            rank = count - rank;
        }
        let fraction = rank / bucket.count;
        if bucket.lower <= 0.0 && bucket.upper >= 0.0 {
            return out(bucket.lower + (bucket.upper - bucket.lower) * fraction);
        }
        let (log_lower, log_upper) = (go_log2(bucket.lower.abs()), go_log2(bucket.upper.abs()));
        if bucket.lower > 0.0 {
            out(go_exp2(log_lower + (log_upper - log_lower) * fraction))
        } else {
            out(-go_exp2(log_upper + (log_lower - log_upper) * (1.0 - fraction)))
        }
    }

    /// Every bucket holding observations, in ascending order: `(lower, upper, count)` in the
    /// histogram's unit (seconds for kube-proxy), the zero bucket as `[-zt, zt]` (or `[0, zt]`
    /// without negative buckets, as the quantile reads it), each bucket's bounds as
    /// Prometheus gives them.
    pub fn bucket_ranges(&self) -> Vec<(f64, f64, f64)> {
        let only_positive = self.negative.iter().all(|&(_, c)| c == 0.0);
        self.ascending_buckets()
            .into_iter()
            .filter(|b| b.count > 0.0)
            .map(|b| if only_positive && b.lower < 0.0 { (0.0, b.upper, b.count) } else { (b.lower, b.upper, b.count) })
            .collect()
    }

    /// The upper bound of the highest positive bucket that holds observations (infinite when
    /// its index overflows the schema's range); None when no positive bucket holds any. No
    /// allocation: read per series on every scrape.
    pub fn highest_positive_upper_bound(&self) -> Option<f64> {
        self.positive.iter().rev().find(|b| b.1 > 0.0).map(|&(i, _)| bound(i, self.schema))
    }

    /// Every bucket in ascending order of its bounds, as Prometheus' `AllBucketIterator` gives
    /// them: negative buckets (highest index first), the zero bucket `[-zt, zt]` when it holds
    /// observations, positive buckets; a bucket overlapping the zero bucket has that bound moved
    /// to the threshold.
    fn ascending_buckets(&self) -> Vec<Bound> {
        let zt = self.zero_threshold;
        let clamp = |mut b: Bound| {
            if b.upper < 0.0 && b.upper > -zt {
                b.upper = -zt;
            } else if b.lower > 0.0 && b.lower < zt {
                b.lower = zt;
            }
            b
        };
        let mut out = Vec::with_capacity(self.negative.len() + self.positive.len() + 1);
        for &(i, count) in self.negative.iter().rev() {
            out.push(clamp(Bound { lower: -bound(i, self.schema), upper: -lower_bound(i, self.schema), count }));
        }
        if self.zero_count > 0.0 {
            out.push(Bound { lower: -zt, upper: zt, count: self.zero_count });
        }
        for &(i, count) in &self.positive {
            out.push(clamp(Bound { lower: lower_bound(i, self.schema), upper: bound(i, self.schema), count }));
        }
        out
    }

    /// The same observations in the coarser `schema` (Prometheus `reduceResolution`): bucket
    /// `i` goes to `((i - 1) >> (self.schema - schema)) + 1`, counts of merged buckets summed.
    /// A `schema` at or above [`Self::schema`] gives the histogram unchanged (resolution is
    /// never increased).
    pub fn reduce_to_schema(&self, schema: i32) -> NativeHistogram {
        if schema >= self.schema {
            return self.clone();
        }
        let shift = self.schema - schema;
        let reduce = |buckets: &[(i32, f64)]| {
            let mut out: Vec<(i32, f64)> = Vec::with_capacity(buckets.len());
            for &(i, c) in buckets {
                // i - 1 in i64: i32::MIN - 1 does not fit; the result always fits again
                let target = (((i64::from(i) - 1) >> shift) + 1) as i32;
                match out.last_mut() {
                    Some(last) if last.0 == target => last.1 += c,
                    _ => out.push((target, c)),
                }
            }
            out
        };
        NativeHistogram { schema, positive: reduce(&self.positive), negative: reduce(&self.negative), ..self.clone() }
    }

    /// The zero count and threshold this histogram would have with its zero bucket widened to
    /// at least `larger` (Prometheus `zeroCountForLargerThreshold`): buckets below the new
    /// threshold move into it, and when the threshold falls inside a populated bucket it grows
    /// to that bucket's bound. Prometheus sums these counts with Kahan summation; here they are
    /// summed plainly (the same for whole counts).
    fn zero_count_for_larger_threshold(&self, mut larger: f64) -> (f64, f64) {
        if larger <= self.zero_threshold {
            return (self.zero_count, self.zero_threshold);
        }
        'outer: loop {
            let mut count = self.zero_count;
            for &(i, c) in &self.positive {
                let (lower, upper) = (lower_bound(i, self.schema), bound(i, self.schema));
                if lower >= larger {
                    break;
                }
                count += c;
                if upper > larger {
                    if c != 0.0 {
                        larger = upper;
                    }
                    break;
                }
            }
            for &(i, c) in &self.negative {
                let (lower, upper) = (-bound(i, self.schema), -lower_bound(i, self.schema));
                if upper <= -larger {
                    break;
                }
                count += c;
                if lower < -larger {
                    if c != 0.0 {
                        larger = -lower;
                        continue 'outer;
                    }
                    break;
                }
            }
            return (count, larger);
        }
    }

    /// This histogram with its zero bucket widened to `threshold` (found by
    /// [`Self::zero_count_for_larger_threshold`]; Prometheus `reconcileZeroBuckets` then
    /// `trimBucketsInZeroBucket` and `Compact(0)`): the buckets now inside it and the empty ones
    /// are dropped. Unchanged when the threshold is already this one's.
    fn with_zero_threshold(&self, threshold: f64) -> NativeHistogram {
        if threshold <= self.zero_threshold {
            return self.clone();
        }
        let (zero_count, zero_threshold) = self.zero_count_for_larger_threshold(threshold);
        let schema = self.schema;
        let keep = |&(i, c): &(i32, f64)| c != 0.0 && lower_bound(i, schema) >= zero_threshold;
        let positive = self.positive.iter().copied().filter(keep).collect();
        let negative = self.negative.iter().copied().filter(keep).collect();
        NativeHistogram { zero_count, zero_threshold, positive, negative, ..self.clone() }
    }

    /// Both histograms with one zero threshold (Prometheus `reconcileZeroBuckets`: the wider,
    /// grown until no populated bucket straddles it) and one schema (the coarser), and the
    /// buckets of `other` that end within the zero threshold left out, as Prometheus'
    /// `addBuckets` leaves them out of a sum or difference.
    fn reconciled(&self, other: &NativeHistogram) -> (NativeHistogram, NativeHistogram) {
        let mut threshold = self.zero_threshold.max(other.zero_threshold);
        loop {
            let a = self.zero_count_for_larger_threshold(threshold).1;
            let b = other.zero_count_for_larger_threshold(threshold).1;
            let next = a.max(b);
            if next == threshold {
                break;
            }
            threshold = next;
        }
        let schema = self.schema.min(other.schema);
        let a = self.with_zero_threshold(threshold).reduce_to_schema(schema);
        let mut b = other.with_zero_threshold(threshold).reduce_to_schema(schema);
        let outside = |&(i, _): &(i32, f64)| bound(i, schema) > a.zero_threshold;
        b.positive.retain(outside);
        b.negative.retain(outside);
        (a, b)
    }

    /// Prometheus `sum()` of two native histograms (`FloatHistogram.Add`): the coarser schema,
    /// the wider zero bucket, counts, sums and buckets added, empty buckets dropped (the engine
    /// compacts every sum: `Compact(0)`). One difference, on inputs kube-proxy never serves: when
    /// the zero thresholds and schemas both differ, Prometheus' `+` can count a bucket of the
    /// finer histogram both in the zero bucket and as a bucket; here it is counted once.
    pub fn add(&self, other: &NativeHistogram) -> NativeHistogram {
        let (a, b) = self.reconciled(other);
        compacted(NativeHistogram {
            schema: a.schema,
            zero_threshold: a.zero_threshold,
            zero_count: a.zero_count + b.zero_count,
            count: a.count + other.count,
            sum: a.sum + other.sum,
            positive: merge(&a.positive, &b.positive, 1.0),
            negative: merge(&a.negative, &b.negative, 1.0),
        })
    }

    /// The observations made between `earlier` and `self` (two scrapes of one series), or
    /// [`NativeDelta::Reset`] with `self` when Prometheus would see a counter reset
    /// ([`Self::is_reset_since`]). Otherwise `self - earlier` as `FloatHistogram.Sub`: both in
    /// the coarser schema and the wider zero bucket, counts subtracted bucket by bucket. Either
    /// way empty buckets are dropped, as PromQL's `-` and `increase()` compact their results
    /// (`Compact(0)`); it matters to the quantile, whose zero bucket starts at 0 only when no
    /// negative bucket is left. The difference of [`Self::add`] holds here too: when `earlier`
    /// has the finer schema and the narrower zero bucket, Prometheus' `-` can subtract one of its
    /// buckets both from the zero bucket and from the bucket it merges into; here it is
    /// subtracted once.
    pub fn delta_since(&self, earlier: &NativeHistogram) -> NativeDelta {
        if self.is_reset_since(earlier) {
            return NativeDelta::Reset(compacted(self.clone()));
        }
        let (a, b) = self.reconciled(earlier);
        NativeDelta::Interval(compacted(NativeHistogram {
            schema: a.schema,
            zero_threshold: a.zero_threshold,
            zero_count: a.zero_count - b.zero_count,
            count: self.count - earlier.count,
            sum: self.sum - earlier.sum,
            positive: merge(&a.positive, &b.positive, -1.0),
            negative: merge(&a.negative, &b.negative, -1.0),
        }))
    }

    /// Prometheus' counter-reset rule for native histograms (`FloatHistogram.DetectReset`,
    /// with no reset hint): the count went down, the schema got finer, the zero threshold got
    /// narrower or cannot hold the earlier zero bucket, the zero count went down, or a populated
    /// earlier bucket (in this schema, above the zero threshold) is missing or lower now.
    pub fn is_reset_since(&self, earlier: &NativeHistogram) -> bool {
        if self.count < earlier.count || self.schema > earlier.schema || self.zero_threshold < earlier.zero_threshold {
            return true;
        }
        let (earlier_zero, threshold) = earlier.zero_count_for_larger_threshold(self.zero_threshold);
        if threshold != self.zero_threshold || self.zero_count < earlier_zero {
            return true;
        }
        let earlier = earlier.reduce_to_schema(self.schema);
        // buckets whose outer bound is within the zero threshold are not compared (Prometheus'
        // iterators start above `absoluteStartValue`)
        let went_down = |now: &[(i32, f64)], before: &[(i32, f64)]| {
            let above = |i: i32| bound(i, self.schema) > self.zero_threshold;
            before.iter().filter(|&&(i, c)| c != 0.0 && above(i)).any(|&(i, c)| match now.binary_search_by_key(&i, |b| b.0) {
                Ok(k) => now[k].1 < c,
                Err(_) => true,
            })
        };
        went_down(&self.positive, &earlier.positive) || went_down(&self.negative, &earlier.negative)
    }
}

/// `h` without its empty buckets (Prometheus `Compact(0)`).
fn compacted(mut h: NativeHistogram) -> NativeHistogram {
    h.positive.retain(|b| b.1 != 0.0);
    h.negative.retain(|b| b.1 != 0.0);
    h
}

/// One bucket with its bounds, as Prometheus' iterators give it.
#[derive(Debug, Clone, Copy)]
struct Bound {
    lower: f64,
    upper: f64,
    count: f64,
}

/// `a + sign x b` over two sorted bucket lists (Prometheus `addBuckets`): buckets of `b`
/// missing in `a` are created.
fn merge(a: &[(i32, f64)], b: &[(i32, f64)], sign: f64) -> Vec<(i32, f64)> {
    let mut out = Vec::with_capacity(a.len().max(b.len()));
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        match (a.get(i), b.get(j)) {
            (Some(&(ia, ca)), Some(&(ib, cb))) if ia == ib => {
                out.push((ia, ca + sign * cb));
                i += 1;
                j += 1;
            }
            (Some(&(ia, ca)), Some(&(ib, _))) if ia < ib => {
                out.push((ia, ca));
                i += 1;
            }
            (None, Some(&(ib, cb))) | (Some(_), Some(&(ib, cb))) => {
                out.push((ib, sign * cb));
                j += 1;
            }
            (Some(&(ia, ca)), None) => {
                out.push((ia, ca));
                i += 1;
            }
            (None, None) => unreachable!("the loop condition holds one side"),
        }
    }
    out
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
    fn buckets_at_the_lowest_index_have_a_lower_bound() {
        // fuzz target `native` (crash-1a7ee82e): bucket index i32::MIN made `i - 1` overflow in
        // the bucket walk (a panic with overflow checks, a wrapped bound without). The index below
        // i32::MIN saturates: that bucket's lower bound is its upper one.
        for schema in [-4, 0, 3, 8] {
            let h = NativeHistogram::from_buckets(schema, (0.0, 0.0), (3.0, 1.0), &[(i32::MIN, 1.0), (0, 1.0)], &[(i32::MIN, 1.0)]).unwrap();
            let q = h.quantile(0.5).seconds;
            assert!(!q.is_nan(), "schema {schema}: {q}");
            let ranges = h.bucket_ranges();
            assert_eq!(ranges.len(), 3, "{ranges:?}");
            assert!(ranges.iter().all(|&(lo, hi, _)| lo <= hi), "{ranges:?}");
            assert!(h.delta_since(&h).histogram().count() == 0.0);
        }
    }

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
        assert!(matches!(
            bad(NativeParts { positive_spans: vec![Span { offset: 0, length: 2 }], positive_counts: vec![1.0], ..NativeParts::default() }),
            NativeHistogramError::SpanCountMismatch { .. }
        ));
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
        let overflow =
            NativeParts { count: 2.0, positive_spans: vec![Span { offset: i32::MAX, length: 2 }], positive_counts: vec![1.0, 1.0], ..NativeParts::default() };
        assert!(matches!(bad(overflow), NativeHistogramError::IndexOverflow { .. }));
    }
}
