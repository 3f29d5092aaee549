//! Classic (bucketed) Prometheus histograms and the exact `histogram_quantile` arithmetic.
//!
//! Pure maths, no I/O. The quantile follows Prometheus' `promql/quantile.go`
//! (`bucketQuantile`, classic buckets): buckets sorted by upper bound, counts made monotonic,
//! the rank `q * count(+Inf)` located with a binary search, linear interpolation inside the bucket,
//! a lower bound of 0 for the first bucket, and the last finite upper bound when the rank lands
//! in the `+Inf` bucket (flagged here as [`Quantile::beyond_top_bucket`]).

use serde::Serialize;

/// One cumulative bucket: `count` observations were `<= upper_bound_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Bucket {
    /// The bucket's `le` bound, in seconds (legacy microsecond histograms are converted when
    /// parsed). `f64::INFINITY` for the `+Inf` bucket.
    pub upper_bound_seconds: f64,
    /// Cumulative observation count (a counter: only ever grows within one process).
    pub count: f64,
}

/// A classic histogram: cumulative buckets sorted by bound, the last one `+Inf`, plus `_sum` and
/// `_count`. Build it with [`Histogram::new`], which checks those invariants.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Histogram {
    buckets: Vec<Bucket>,
    /// `_sum` in seconds, when the scrape carried one.
    pub sum_seconds: Option<f64>,
}

/// Why a set of buckets is not a histogram.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HistogramError {
    /// No `le="+Inf"` bucket: the histogram is incomplete (for example a scrape cut short).
    #[error("no +Inf bucket (the histogram is incomplete or the scrape was cut off)")]
    NoInfBucket,
    /// No buckets at all.
    #[error("no buckets")]
    Empty,
    /// A `le` bound that is NaN.
    #[error("a bucket bound is NaN")]
    NanBound,
    /// A bucket count that is NaN, infinite or negative: a count of observations is a finite
    /// number >= 0 (Prometheus' `histogram_quantile` answers NaN for such a bucket).
    #[error("bucket le=\"{}\" has the count {count}: a bucket counts observations (a finite number >= 0)", fmt_bound(.upper_bound_seconds))]
    BadCount {
        /// The bucket's bound, seconds.
        upper_bound_seconds: f64,
        /// The count given.
        count: f64,
    },
}

/// A bound as Prometheus writes `le`: `+Inf` for the top bucket.
fn fmt_bound(v: &f64) -> String {
    if *v == f64::INFINITY { "+Inf".into() } else { v.to_string() }
}

/// Which kind of histogram a quantile was computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum HistogramKind {
    /// Classic buckets (cumulative counts per `le` bound; every exposition format).
    #[default]
    Classic,
    /// A native (exponential) histogram (protobuf exposition only, kube-proxy 1.37+).
    Native,
}

impl HistogramKind {
    /// `classic` or `native`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Classic => "classic",
            Self::Native => "native",
        }
    }
}

/// A quantile estimate over a histogram.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Quantile {
    /// The estimate in seconds; NaN when the histogram has no observations (as Prometheus).
    pub seconds: f64,
    /// True when the rank fell in the `+Inf` bucket: the true value is somewhere above
    /// `seconds`, which is then the top finite bound (a lower bound, not an estimate).
    pub beyond_top_bucket: bool,
    /// Observations the estimate is based on (`count` of the `+Inf` bucket).
    pub samples: f64,
    /// The kind of histogram it came from.
    pub kind: HistogramKind,
}

impl Histogram {
    /// Builds a histogram from cumulative buckets in any order. Buckets with equal bounds are
    /// merged by summing (the per-`le` sum over extra labels such as `ip_family` is done by the
    /// caller before this). Errors when there is no `+Inf` bucket, a bound is NaN, or a count is
    /// NaN, infinite or negative (`-0` is zero).
    pub fn new(mut buckets: Vec<Bucket>, sum_seconds: Option<f64>) -> Result<Self, HistogramError> {
        if buckets.is_empty() {
            return Err(HistogramError::Empty);
        }
        if buckets.iter().any(|b| b.upper_bound_seconds.is_nan()) {
            return Err(HistogramError::NanBound);
        }
        if let Some(b) = buckets.iter().find(|b| !(b.count.is_finite() && b.count >= 0.0)) {
            return Err(HistogramError::BadCount { upper_bound_seconds: b.upper_bound_seconds, count: b.count });
        }
        buckets.sort_by(|a, b| a.upper_bound_seconds.total_cmp(&b.upper_bound_seconds));
        // coalesce equal bounds
        let mut merged: Vec<Bucket> = Vec::with_capacity(buckets.len());
        for b in buckets {
            match merged.last_mut() {
                Some(last) if last.upper_bound_seconds == b.upper_bound_seconds => last.count += b.count,
                _ => merged.push(b),
            }
        }
        if merged.last().map(|b| b.upper_bound_seconds) != Some(f64::INFINITY) {
            return Err(HistogramError::NoInfBucket);
        }
        Ok(Self { buckets: merged, sum_seconds })
    }

    /// The buckets, sorted by bound, the last one `+Inf`.
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// Total observations (the `+Inf` bucket's count).
    pub fn count(&self) -> f64 {
        self.buckets.last().map_or(0.0, |b| b.count)
    }

    /// The largest finite bucket bound in seconds (16.384 for kube-proxy's sync histograms), or
    /// `None` when the only bucket is `+Inf`.
    pub fn top_finite_bound_seconds(&self) -> Option<f64> {
        self.buckets.iter().rev().map(|b| b.upper_bound_seconds).find(|b| b.is_finite())
    }

    /// Prometheus `histogram_quantile(q, ...)` on these buckets.
    ///
    /// Returns NaN (with `samples` 0) when there are no observations or fewer than two buckets,
    /// `-Inf`/`+Inf` for `q` outside `[0, 1]`, and the top finite bound flagged
    /// `beyond_top_bucket` when the rank lands in the `+Inf` bucket.
    pub fn quantile(&self, q: f64) -> Quantile {
        let samples = self.count();
        let out = |seconds, beyond| Quantile { seconds, beyond_top_bucket: beyond, samples, kind: HistogramKind::Classic };
        if q.is_nan() {
            return out(f64::NAN, false);
        }
        if q < 0.0 {
            return out(f64::NEG_INFINITY, false);
        }
        if q > 1.0 {
            return out(f64::INFINITY, false);
        }
        // ensureMonotonic: a lower cumulative count after a higher one is raised to it.
        let mut counts: Vec<f64> = Vec::with_capacity(self.buckets.len());
        let mut max = f64::NEG_INFINITY;
        for b in &self.buckets {
            max = if b.count.is_nan() { max } else { max.max(b.count) };
            counts.push(if max == f64::NEG_INFINITY { 0.0 } else { max });
        }
        let n = self.buckets.len();
        if n < 2 {
            return out(f64::NAN, false);
        }
        let observations = counts[n - 1];
        if observations == 0.0 || observations.is_nan() {
            return out(f64::NAN, false);
        }
        let mut rank = q * observations;
        // sort.Search over the first n-1 buckets: the first with count >= rank.
        let b = counts[..n - 1].partition_point(|&c| c < rank);
        if b == n - 1 {
            return out(self.buckets[n - 2].upper_bound_seconds, true);
        }
        if b == 0 && self.buckets[0].upper_bound_seconds <= 0.0 {
            return out(self.buckets[0].upper_bound_seconds, false);
        }
        let mut bucket_start = 0.0;
        let bucket_end = self.buckets[b].upper_bound_seconds;
        let mut count = counts[b];
        if b > 0 {
            bucket_start = self.buckets[b - 1].upper_bound_seconds;
            count -= counts[b - 1];
            rank -= counts[b - 1];
        }
        out(bucket_start + (bucket_end - bucket_start) * (rank / count), false)
    }

    /// The histogram of observations made between `earlier` and `self` (two scrapes of the same
    /// series). Returns [`Delta::Reset`] with `self` unchanged when any cumulative count went
    /// down or the bucket layout changed: the process restarted (or was upgraded), so everything
    /// `self` holds was observed since the restart.
    pub fn delta_since(&self, earlier: &Histogram) -> Delta {
        let same_layout = self.buckets.len() == earlier.buckets.len()
            && self.buckets.iter().zip(&earlier.buckets).all(|(a, b)| a.upper_bound_seconds == b.upper_bound_seconds);
        let went_down = self.buckets.iter().zip(&earlier.buckets).any(|(a, b)| a.count < b.count);
        if !same_layout || went_down {
            return Delta::Reset(self.clone());
        }
        let buckets =
            self.buckets.iter().zip(&earlier.buckets).map(|(a, b)| Bucket { upper_bound_seconds: a.upper_bound_seconds, count: a.count - b.count }).collect();
        let sum_seconds = match (self.sum_seconds, earlier.sum_seconds) {
            (Some(a), Some(b)) => Some(a - b),
            _ => None,
        };
        Delta::Interval(Histogram { buckets, sum_seconds })
    }
}

/// Result of [`Histogram::delta_since`].
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    /// Observations made between the two scrapes.
    Interval(Histogram),
    /// A counter went down (process restart): the later scrape on its own.
    Reset(Histogram),
}

impl Delta {
    /// The histogram either way.
    pub fn histogram(&self) -> &Histogram {
        match self {
            Delta::Interval(h) | Delta::Reset(h) => h,
        }
    }

    /// True when a counter reset was detected.
    pub fn is_reset(&self) -> bool {
        matches!(self, Delta::Reset(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(f64, f64)]) -> Histogram {
        Histogram::new(pairs.iter().map(|&(le, c)| Bucket { upper_bound_seconds: le, count: c }).collect(), None).unwrap()
    }

    const INF: f64 = f64::INFINITY;

    #[test]
    fn counts_that_are_not_observations_are_refused_naming_the_bucket_and_value() {
        let new = |pairs: &[(f64, f64)]| {
            Histogram::new(pairs.iter().map(|&(le, c)| Bucket { upper_bound_seconds: le, count: c }).collect(), None).map_err(|e| e.to_string())
        };
        let msg = |le: &str, c: &str| format!("bucket le=\"{le}\" has the count {c}: a bucket counts observations (a finite number >= 0)");
        assert_eq!(new(&[(0.5, f64::NAN), (INF, 3.0)]), Err(msg("0.5", "NaN")));
        assert_eq!(new(&[(0.5, 1.0), (INF, f64::NAN)]), Err(msg("+Inf", "NaN")));
        assert_eq!(new(&[(0.5, -1.0), (INF, 3.0)]), Err(msg("0.5", "-1")));
        assert_eq!(new(&[(0.5, 1.0), (INF, INF)]), Err(msg("+Inf", "inf")));
        assert_eq!(new(&[(0.5, f64::NEG_INFINITY), (INF, 1.0)]), Err(msg("0.5", "-inf")));
        // -0 is zero
        assert_eq!(new(&[(0.5, -0.0), (INF, 2.0)]).unwrap().count(), 2.0);
    }

    #[test]
    fn interpolates_inside_bucket() {
        // v1.29 excerpt sync histogram: 4 samples, p99 = 0.064 + 0.064 * (3.96 - 2) / 2
        let hist = h(&[(0.032, 1.0), (0.064, 2.0), (0.128, 4.0), (16.384, 4.0), (INF, 4.0)]);
        let q = hist.quantile(0.99);
        assert!((q.seconds - 0.12672).abs() < 1e-12, "{}", q.seconds);
        assert!(!q.beyond_top_bucket);
        assert_eq!(q.samples, 4.0);
    }

    #[test]
    fn first_bucket_lower_bound_is_zero() {
        let q = h(&[(2.0, 10.0), (INF, 10.0)]).quantile(0.5);
        assert_eq!(q.seconds, 1.0);
    }

    #[test]
    fn rank_in_inf_bucket_returns_top_finite_bound_flagged() {
        let q = h(&[(1.0, 1.0), (16.384, 50.0), (INF, 100.0)]).quantile(0.99);
        assert_eq!(q.seconds, 16.384);
        assert!(q.beyond_top_bucket);
    }

    #[test]
    fn no_samples_is_nan() {
        let q = h(&[(1.0, 0.0), (INF, 0.0)]).quantile(0.99);
        assert!(q.seconds.is_nan());
    }

    #[test]
    fn missing_inf_is_error() {
        let e = Histogram::new(vec![Bucket { upper_bound_seconds: 1.0, count: 1.0 }], None);
        assert_eq!(e, Err(HistogramError::NoInfBucket));
    }

    #[test]
    fn zero_bound_first_bucket() {
        // network programming has le="0": a rank landing there returns 0 like Prometheus
        let q = h(&[(0.0, 5.0), (1.0, 5.0), (INF, 5.0)]).quantile(0.5);
        assert_eq!(q.seconds, 0.0);
    }

    #[test]
    fn non_monotonic_counts_are_fixed() {
        let q = h(&[(1.0, 10.0), (2.0, 5.0), (4.0, 20.0), (INF, 20.0)]).quantile(0.5);
        // counts become 10,10,20,20: rank 10 lands in the first bucket
        assert_eq!(q.seconds, 1.0);
    }

    #[test]
    fn delta_and_reset() {
        let a = h(&[(1.0, 10.0), (2.0, 20.0), (INF, 20.0)]);
        let b = h(&[(1.0, 10.0), (2.0, 30.0), (INF, 30.0)]);
        let d = b.delta_since(&a);
        assert!(!d.is_reset());
        assert_eq!(d.histogram().count(), 10.0);
        assert_eq!(d.histogram().quantile(0.5).seconds, 1.5);
        let restarted = h(&[(1.0, 1.0), (2.0, 2.0), (INF, 2.0)]);
        let d = restarted.delta_since(&b);
        assert!(d.is_reset());
        assert_eq!(d.histogram().count(), 2.0);
    }
}
