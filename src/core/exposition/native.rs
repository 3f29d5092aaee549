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

/// The lower bound of positive bucket `index`: the upper bound of the bucket below it. The index
/// below `i32::MIN` saturates (that bucket's lower bound is then its upper one): Prometheus'
/// `idx - 1` would wrap in Go, and an overflow must not panic on input.
fn lower_bound(index: i32, schema: i32) -> f64 {
    bound(index.saturating_sub(1), schema)
}

/// The upper bound of positive bucket `index` in `schema` (Prometheus `getBoundExponential`):
/// `2^(index x 2^-schema)`, from Prometheus' table of fractions for schemas 0..=8 and a power
/// of two, and `f64::MAX` for the last bucket before the one counting `+Inf`.
fn bound(index: i32, schema: i32) -> f64 {
    let index = i64::from(index);
    if schema < 0 {
        let exp = index << -schema;
        if exp == 1024 {
            return f64::MAX;
        }
        return ldexp(1.0, exp);
    }
    let frac = FRACTIONS_SCHEMA_8[((index & ((1 << schema) - 1)) << (8 - schema)) as usize];
    let exp = (index >> schema) + 1;
    if frac == 0.5 && exp == 1025 {
        return f64::MAX;
    }
    ldexp(frac, exp)
}

/// The positive bucket of schema `schema` (-4..=8) that holds `value` (> 0, finite): the index
/// `i` with `bound(i - 1) < value <= bound(i)`, as client_golang's `addToBucket` computes it
/// (`math.Frexp`, then a search of the schema's table of fractions for schemas above 0, or the
/// exponent shifted for the others), so that a histogram this project writes puts each value in
/// the bucket a Go client would.
pub fn positive_bucket_index(value: f64, schema: i32) -> i32 {
    let (frac, exp) = frexp(value);
    let key = if schema > 0 {
        let len = 1usize << schema;
        let step = 1usize << (8 - schema);
        // the first fraction of the schema's table at or above `frac` (len when none is)
        let j = (0..len).find(|j| FRACTIONS_SCHEMA_8[j * step] >= frac).unwrap_or(len);
        j as i64 + (exp - 1) * len as i64
    } else {
        let key = if frac == 0.5 { exp - 1 } else { exp };
        let offset = (1i64 << -schema) - 1;
        (key + offset) >> -schema
    };
    key.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}

/// `frac x 2^exp` as Go's `math.Ldexp`: exact for normal results, one rounding for subnormal
/// ones, `±0` below and `±Inf` above the float range.
fn ldexp(frac: f64, exp: i64) -> f64 {
    if frac == 0.0 || !frac.is_finite() {
        return frac;
    }
    const EXP_MASK: u64 = 0x7ff << 52;
    let (mut f, mut biased) = (frac, ((frac.to_bits() & EXP_MASK) >> 52) as i64);
    if biased == 0 {
        f = frac * (1u64 << 52) as f64;
        biased = ((f.to_bits() & EXP_MASK) >> 52) as i64 - 52;
    }
    let mut exp = exp.saturating_add(biased - 1023);
    if exp < -1075 {
        return 0.0f64.copysign(frac);
    }
    if exp > 1023 {
        return f64::INFINITY.copysign(frac);
    }
    let mut m = 1.0;
    if exp < -1022 {
        exp += 53;
        m = 1.0 / (1u64 << 53) as f64;
    }
    m * f64::from_bits((f.to_bits() & !EXP_MASK) | (((exp + 1023) as u64) << 52))
}

/// Go's `math.Frexp`: `x = frac x 2^exp` with `frac` in `[0.5, 1)`.
fn frexp(x: f64) -> (f64, i64) {
    if x == 0.0 || !x.is_finite() {
        return (x, 0);
    }
    let (mut x, mut exp) = (x, 0i64);
    if x.abs() < f64::MIN_POSITIVE {
        x *= (1u64 << 52) as f64;
        exp = -52;
    }
    let bits = x.to_bits();
    exp += ((bits >> 52) & 0x7ff) as i64 - 1022;
    (f64::from_bits((bits & !(0x7ff << 52)) | (1022 << 52)), exp)
}

/// Go's `math.Log` (FreeBSD's `e_log.c` algorithm, which Go's amd64 assembly also computes), so
/// that [`NativeHistogram::quantile`] matches Prometheus bit for bit.
// the constants keep the digits FreeBSD and Go publish them with (they round to the same f64)
#[allow(clippy::excessive_precision)]
fn go_log(x: f64) -> f64 {
    const LN2_HI: f64 = 6.93147180369123816490e-01;
    const LN2_LO: f64 = 1.90821492927058770002e-10;
    const L: [f64; 7] = [
        6.666666666666735130e-01,
        3.999999999940941908e-01,
        2.857142874366239149e-01,
        2.222219843214978396e-01,
        1.818357216161805012e-01,
        1.531383769920937332e-01,
        1.479819860511658591e-01,
    ];
    if x.is_nan() || x == f64::INFINITY {
        return x;
    }
    if x < 0.0 {
        return f64::NAN;
    }
    if x == 0.0 {
        return f64::NEG_INFINITY;
    }
    let (mut f1, mut ki) = frexp(x);
    if f1 < std::f64::consts::SQRT_2 / 2.0 {
        f1 *= 2.0;
        ki -= 1;
    }
    let f = f1 - 1.0;
    let k = ki as f64;
    let s = f / (2.0 + f);
    let s2 = s * s;
    let s4 = s2 * s2;
    let t1 = s2 * (L[0] + s4 * (L[2] + s4 * (L[4] + s4 * L[6])));
    let t2 = s4 * (L[1] + s4 * (L[3] + s4 * L[5]));
    let r = t1 + t2;
    let hfsq = 0.5 * f * f;
    k * LN2_HI - ((hfsq - (s * (hfsq + r) + k * LN2_LO)) - f)
}

/// Go's `math.Log2`: exact for powers of two, else `Log(frac) / ln 2 + exp`.
fn go_log2(x: f64) -> f64 {
    let (frac, exp) = frexp(x);
    if frac == 0.5 {
        return (exp - 1) as f64;
    }
    go_log(frac) * (1.0 / std::f64::consts::LN_2) + exp as f64
}

/// Go's `math.Exp2` (FreeBSD's `e_exp.c` reduction and polynomial; pure Go on amd64).
#[allow(clippy::excessive_precision)]
fn go_exp2(x: f64) -> f64 {
    const LN2_HI: f64 = 6.93147180369123816490e-01;
    const LN2_LO: f64 = 1.90821492927058770002e-10;
    const P: [f64; 5] =
        [1.66666666666666657415e-01, -2.77777777770155933842e-03, 6.61375632143793436117e-05, -1.65339022054652515390e-06, 4.13813679705723846039e-08];
    if x.is_nan() {
        return x;
    }
    if x > 1.0239999999999999e+03 {
        return f64::INFINITY;
    }
    if x < -1.0740e+03 {
        return 0.0;
    }
    let k: i64 = if x > 0.0 {
        (x + 0.5) as i64
    } else if x < 0.0 {
        (x - 0.5) as i64
    } else {
        0
    };
    let t = x - k as f64;
    let hi = t * LN2_HI;
    let lo = -t * LN2_LO;
    let r = hi - lo;
    let t = r * r;
    let c = r - t * (P[0] + t * (P[1] + t * (P[2] + t * (P[3] + t * P[4]))));
    let y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi);
    ldexp(y, k)
}

/// The bucket bounds of schema 8 in `[0.5, 1)`: entry `k` is Prometheus' `2^(k/256) / 2`
/// (`model/histogram/generic.go`, `exponentialBounds`; every lower schema `s` uses every
/// `2^(8-s)`-th entry of it). These are Prometheus' floats, which are not always the correctly
/// rounded values (entry 128 is 0.7071067811865475, one below `sqrt(2)/2`): bounds computed
/// otherwise would move quantiles by an ulp.
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

#[rustfmt::skip] // the table as Prometheus writes it: four values a row
const FRACTIONS_SCHEMA_8: [f64; 256] = [
    0.5, 0.5013556375251013, 0.5027149505564014, 0.5040779490592088,
    0.5054446430258502, 0.5068150424757447, 0.5081891574554764, 0.509566998038869,
    0.5109485743270583, 0.5123338964485679, 0.5137229745593818, 0.5151158188430205,
    0.5165124395106142, 0.5179128468009786, 0.5193170509806894, 0.520725062344158,
    0.5221368912137069, 0.5235525479396449, 0.5249720429003435, 0.526395386502313,
    0.5278225891802786, 0.5292536613972564, 0.5306886136446309, 0.5321274564422321,
    0.5335702003384117, 0.5350168559101208, 0.5364674337629877, 0.5379219445313954,
    0.5393803988785598, 0.5408428074966075, 0.5423091811066545, 0.5437795304588847,
    0.5452538663326288, 0.5467321995364429, 0.5482145409081883, 0.549700901315111,
    0.5511912916539204, 0.5526857228508706, 0.5541842058618393, 0.5556867516724088,
    0.5571933712979462, 0.5587040757836845, 0.5602188762048033, 0.5617377836665098,
    0.5632608093041209, 0.564787964283144, 0.5663192597993595, 0.5678547070789026,
    0.5693943173783458, 0.5709381019847808, 0.572486072215902, 0.5740382394200894,
    0.5755946149764913, 0.5771552102951081, 0.5787200368168754, 0.5802891060137493,
    0.5818624293887887, 0.5834400184762408, 0.585021884841625, 0.5866080400818185,
    0.5881984958251406, 0.5897932637314379, 0.5913923554921704, 0.5929957828304968,
    0.5946035575013605, 0.5962156912915756, 0.5978321960199137, 0.5994530835371903,
    0.6010783657263515, 0.6027080545025619, 0.6043421618132907, 0.6059806996384005,
    0.6076236799902344, 0.6092711149137041, 0.6109230164863786, 0.6125793968185725,
    0.6142402680534349, 0.6159056423670379, 0.6175755319684665, 0.6192499490999082,
    0.620928906036742, 0.622612415087629, 0.6243004885946023, 0.6259931389331581,
    0.6276903785123455, 0.6293922197748583, 0.6310986751971253, 0.6328097572894031,
    0.6345254785958666, 0.6362458516947014, 0.637970889198196, 0.6397006037528346,
    0.6414350080393891, 0.6431741147730128, 0.6449179367033329, 0.6466664866145447,
    0.6484197773255048, 0.6501778216898253, 0.6519406325959679, 0.6537082229673385,
    0.6554806057623822, 0.6572577939746774, 0.659039800633032, 0.6608266388015788,
    0.6626183215798706, 0.6644148621029772, 0.6662162735415805, 0.6680225691020727,
    0.6698337620266515, 0.6716498655934177, 0.6734708931164728, 0.6752968579460171,
    0.6771277734684463, 0.6789636531064505, 0.6808045103191123, 0.6826503586020058,
    0.6845012114872953, 0.6863570825438342, 0.688217985377265, 0.690083933630119,
    0.6919549409819159, 0.6938310211492645, 0.6957121878859629, 0.6975984549830999,
    0.6994898362691555, 0.7013863456101023, 0.7032879969095076, 0.7051948041086352,
    0.7071067811865475, 0.7090239421602076, 0.7109463010845827, 0.7128738720527471,
    0.7148066691959849, 0.7167447066838943, 0.718687998724491, 0.7206365595643126,
    0.7225904034885232, 0.7245495448210174, 0.7265139979245261, 0.7284837772007218,
    0.7304588970903234, 0.7324393720732029, 0.7344252166684908, 0.7364164454346837,
    0.7384130729697496, 0.7404151139112358, 0.7424225829363761, 0.7444354947621984,
    0.7464538641456323, 0.7484777058836176, 0.7505070348132126, 0.7525418658117031,
    0.7545822137967112, 0.7566280937263048, 0.7586795205991071, 0.7607365094544071,
    0.762799075372269, 0.7648672334736434, 0.7669409989204777, 0.7690203869158282,
    0.7711054127039704, 0.7731960915705107, 0.7752924388424999, 0.7773944698885442,
    0.7795022001189185, 0.7816156449856788, 0.7837348199827764, 0.7858597406461707,
    0.7879904225539431, 0.7901268813264122, 0.7922691326262467, 0.7944171921585818,
    0.7965710756711334, 0.7987307989543135, 0.8008963778413465, 0.8030678282083853,
    0.805245165974627, 0.8074284071024302, 0.8096175675974316, 0.8118126635086642,
    0.8140137109286738, 0.8162207259936375, 0.8184337248834821, 0.820652723822003,
    0.8228777390769823, 0.8251087869603088, 0.8273458838280969, 0.8295890460808079,
    0.8318382901633681, 0.8340936325652911, 0.8363550898207981, 0.8386226785089391,
    0.8408964152537144, 0.8431763167241966, 0.8454623996346523, 0.8477546807446661,
    0.8500531768592616, 0.8523579048290255, 0.8546688815502312, 0.8569861239649629,
    0.8593096490612387, 0.8616394738731368, 0.8639756154809185, 0.8663180910111553,
    0.8686669176368529, 0.871022112577578, 0.8733836930995842, 0.8757516765159389,
    0.8781260801866495, 0.8805069215187917, 0.8828942179666361, 0.8852879870317771,
    0.8876882462632604, 0.890095013257712, 0.8925083056594671, 0.8949281411607002,
    0.8973545375015533, 0.8997875124702672, 0.9022270839033115, 0.9046732696855155,
    0.9071260877501991, 0.909585556079304, 0.9120516927035263, 0.9145245157024483,
    0.9170040432046711, 0.9194902933879467, 0.9219832844793128, 0.9244830347552253,
    0.9269895625416926, 0.92950288621441, 0.9320230241988943, 0.9345499949706191,
    0.9370838170551498, 0.93962450902828, 0.9421720895161669, 0.9447265771954693,
    0.9472879907934827, 0.9498563490882775, 0.9524316709088368, 0.9550139751351947,
    0.9576032806985735, 0.9601996065815236, 0.9628029718180622, 0.9654133954938133,
    0.9680308967461471, 0.9706554947643201, 0.9732872087896164, 0.9759260581154889,
    0.9785720620876999, 0.9812252401044634, 0.9838856116165875, 0.9865531961276168,
    0.9892280131939752, 0.9919100824251095, 0.9945994234836328, 0.9972960560854698,
];

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
