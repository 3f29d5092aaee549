//! A native histogram sample of the HTTP API, and the [`NativeHistogram`] it was written from.
//!
//! The API writes a native histogram sample as `"histogram": [t, {"count": "..", "sum": "..",
//! "buckets": [[rule, "lower", "upper", "count"], ...]}]` in place of `"value"`
//! (`web/api/v1/json_codec.go`, `util/jsonutil` `MarshalHistogram`; the API docs' "Native
//! histograms" section). Numbers are strings of Go's `strconv.FormatFloat(f, 'f' or 'e', -1,
//! 64)`, the shortest decimal that reads back as the same float, so Rust's correctly rounded
//! `f64` parsing gives the exact bits. Buckets come in ascending order, empty ones left out
//! (`buckets` absent when all are); `rule` says which ends belong to the bucket:
//!
//! | rule | interval | written for |
//! |---|---|---|
//! | 0 | `(lower, upper]` | a positive bucket; a custom bucket after the first |
//! | 1 | `[lower, upper)` | a negative bucket |
//! | 2 | `(lower, upper)` | (no bucket of Prometheus' own) |
//! | 3 | `[lower, upper]` | the zero bucket `[-t, t]`; the first custom bucket |
//!
//! Positive bucket `i` of schema `s` is `(b^(i-1), b^i]` with `b = 2^(2^-s)`, negative bucket `i`
//! is `[-b^i, -b^(i-1))`, and a bound inside the zero bucket is raised to its threshold.
//! [`ApiHistogram::to_native`] inverts that exactly: the schema is the one whose boundaries
//! all buckets sit on, each index comes from the binary exponent and mantissa of the bound
//! (`boundary_index`), the zero bucket gives the threshold and count, and anything else (custom
//! buckets, a rule on the wrong side of zero) is an error naming the bucket.

use crate::core::exposition::native::{SCHEMA_MAX, SCHEMA_MIN};
use crate::core::exposition::{NativeHistogram, NativeHistogramError};

/// Which ends of an [`ApiBucket`] belong to it: the first element of each bucket array in the
/// HTTP API's JSON (`util/jsonutil` `MarshalHistogram`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoundaryRule {
    /// `0`: `(lower, upper]`, a positive bucket (and every custom bucket but the first).
    OpenLower,
    /// `1`: `[lower, upper)`, a negative bucket.
    OpenUpper,
    /// `2`: `(lower, upper)` (Prometheus writes it for no exponential bucket).
    Open,
    /// `3`: `[lower, upper]`, the zero bucket (and the first custom bucket).
    Closed,
}

impl BoundaryRule {
    /// The rule of its JSON number (0..=3).
    pub fn from_code(code: u64) -> Option<Self> {
        Some(match code {
            0 => Self::OpenLower,
            1 => Self::OpenUpper,
            2 => Self::Open,
            3 => Self::Closed,
            _ => return None,
        })
    }
}

/// One non-empty bucket of a native histogram as the HTTP API writes it:
/// `[boundary_rule, "lower", "upper", "count"]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ApiBucket {
    /// Which ends belong to the bucket.
    pub rule: BoundaryRule,
    /// Lower boundary.
    pub lower: f64,
    /// Upper boundary.
    pub upper: f64,
    /// Observations in the bucket (a float: `increase()` extrapolates).
    pub count: f64,
}

/// A native histogram sample as the HTTP API writes it: `{"count", "sum", "buckets"}`, the
/// buckets in ascending order, the empty ones left out (and `buckets` absent when all are).
/// [`ApiHistogram::to_native`] turns it back into a [`NativeHistogram`].
#[derive(Debug, Clone, PartialEq)]
pub struct ApiHistogram {
    /// All observations.
    pub count: f64,
    /// Sum of observations.
    pub sum: f64,
    /// The non-empty buckets, as written.
    pub buckets: Vec<ApiBucket>,
}

/// `x = frac x 2^exp` with `frac` in `[0.5, 1)`, for a finite `x > 0` (C's `frexp`).
fn frexp(x: f64) -> (f64, i32) {
    const MANTISSA: u64 = (1 << 52) - 1;
    let (x, shift) = if x < f64::MIN_POSITIVE { (x * 2f64.powi(64), -64) } else { (x, 0) };
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32 - 1022;
    (f64::from_bits((bits & MANTISSA) | (1022 << 52)), exp + shift)
}

/// The index `i` of the bucket boundary `x = 2^(i x 2^-schema)` as Prometheus computes its
/// boundaries (`model/histogram` `getBoundExponential`), or `None` when `x` is none of them.
///
/// For `schema <= 0` the boundaries are powers of two and the test is exact: `x`'s mantissa is
/// 1 and its binary exponent a multiple of `2^-schema`. For `schema > 0`, `x = frac x 2^exp`
/// with the exponent exact and `frac` one of the `2^schema` fractions `2^(k x 2^-schema) / 2`
/// that Prometheus takes from its table (`exponentialBounds`, whose constants are up to 4 ulps
/// from the exact values): `k` is the nearest integer to `log2(2 frac) x 2^schema`, and `frac`
/// must equal `exp2(k x 2^-schema) / 2` within 16 ulps, while neighbouring fractions are at
/// least `2^(1/256)` (0.27%, about 10^13 ulps) apart, so the index is exact. `f64::MAX` is the
/// last finite boundary and `+Inf` the one after it, as in Prometheus.
fn boundary_index(x: f64, schema: i32) -> Option<i32> {
    if x == f64::INFINITY {
        return boundary_index(f64::MAX, schema)?.checked_add(1);
    }
    if x == f64::MAX {
        return Some(if schema < 0 { 1024 >> -schema } else { 1024 << schema });
    }
    if !(x.is_finite() && x > 0.0) {
        return None;
    }
    let (frac, exp) = frexp(x);
    let log2_floor = i64::from(exp) - 1;
    let index = if schema <= 0 {
        let step = 1i64 << -schema;
        if frac != 0.5 || log2_floor.rem_euclid(step) != 0 {
            return None;
        }
        log2_floor.div_euclid(step)
    } else {
        let n = 1i64 << schema;
        let k = ((2.0 * frac).log2() * n as f64).round() as i64;
        // 16 ulps of a number in [0.5, 1)
        if k >= n || (frac - (k as f64 / n as f64).exp2() / 2.0).abs() > 8.0 * f64::EPSILON {
            return None;
        }
        (log2_floor << schema) + k
    };
    i32::try_from(index).ok()
}

/// One side's buckets in a schema and the bound raised to the zero threshold, if any.
type Side = (Vec<(i32, f64)>, Option<f64>);

/// The buckets of one side (positive, or negative mirrored to magnitudes) in `schema`:
/// `(index, count)` sorted by index, and the lower magnitude of the one bucket moved up to the
/// zero threshold (Prometheus' iterator raises the lowest bucket's bound that lies inside the
/// zero bucket to the threshold), if any. `None` when a bucket is no bucket of `schema`.
fn side_in_schema(magnitudes: &[(f64, f64, f64)], schema: i32) -> Option<Side> {
    let mut out = Vec::with_capacity(magnitudes.len());
    let mut moved = None;
    for &(low, high, count) in magnitudes {
        let index = boundary_index(high, schema)?;
        let previous = index.checked_sub(1)?;
        if boundary_index(low, schema) != Some(previous) {
            // only one bucket (the lowest, checked below), and only up, towards its upper bound
            let below = (f64::from(previous) * 2f64.powi(-schema)).exp2();
            if moved.is_some() || !(low < high && low > below * (1.0 - 4.0 * f64::EPSILON)) {
                return None;
            }
            moved = Some((index, low));
        }
        out.push((index, count));
    }
    out.sort_by_key(|b| b.0);
    if out.windows(2).any(|w| w[0].0 == w[1].0) {
        return None;
    }
    if let Some((index, _)) = moved
        && out.first().map(|b| b.0) != Some(index)
    {
        return None;
    }
    Some((out, moved.map(|m| m.1)))
}

/// What is wrong with one bucket of an [`ApiHistogram`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BucketProblem {
    /// Its lower boundary is above its upper one, or either is NaN.
    #[error("lower above upper, or NaN")]
    Unordered,
    /// It spans 0 but is not a zero bucket `[-t, t]` (a custom bucket).
    #[error("spans 0 but is not a zero bucket [-t, t] (custom buckets?)")]
    NotZeroBucket,
    /// A zero bucket after another.
    #[error("a second zero bucket")]
    SecondZeroBucket,
    /// A positive bucket whose rule is not 0.
    #[error("a positive bucket is (lower, upper], rule 0")]
    PositiveRule,
    /// A negative bucket whose rule is not 1.
    #[error("a negative bucket is [lower, upper), rule 1")]
    NegativeRule,
}

/// Why an [`ApiHistogram`] is no native histogram of an exponential schema.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiHistogramError {
    /// One bucket, by its 0-based position in the answer, is not a bucket of any exponential
    /// layout.
    #[error("bucket {index} (rule {:?}, lower {}, upper {}, count {}): {problem}", .bucket.rule, .bucket.lower, .bucket.upper, .bucket.count)]
    Bucket {
        /// The bucket's position in the answer.
        index: usize,
        /// The bucket as read.
        bucket: ApiBucket,
        /// What is wrong with it.
        problem: BucketProblem,
    },
    /// A bucket on no exponential schema's boundaries even alone (custom buckets, schema -53).
    #[error("the bucket of magnitudes ({lower}, {upper}] is on no exponential schema's boundaries (-4..=8): custom buckets?")]
    OffSchema {
        /// Its lower magnitude.
        lower: f64,
        /// Its upper magnitude.
        upper: f64,
    },
    /// Every bucket is on some schema's boundaries, but no schema holds them all.
    #[error("the buckets are on no single exponential schema's boundaries (-4..=8)")]
    NoCommonSchema,
    /// A bucket's lower bound raised to a zero threshold other than the zero bucket's.
    #[error("a bucket's lower bound {raised} was raised to a zero threshold, but the zero bucket's is {zero}")]
    ZeroThreshold {
        /// The raised bound.
        raised: f64,
        /// The zero bucket's threshold.
        zero: f64,
    },
    /// Counts that [`NativeHistogram::from_buckets`] rejects.
    #[error(transparent)]
    Counts(#[from] NativeHistogramError),
}

impl ApiHistogram {
    /// The [`NativeHistogram`] this sample was written from: the schema is the one of -4..=8
    /// whose boundaries all buckets sit on (the highest such; only a histogram whose every
    /// bucket touches the zero bucket leaves a choice, and then its quantiles do not depend on
    /// it), each bucket's index that of its upper boundary (lower boundary for a negative one),
    /// the zero bucket `[-t, t]` gives the zero threshold `t` and count. The API leaves empty
    /// buckets out, so an empty zero bucket is not written: its threshold is then the bound of
    /// a bucket raised to it, else 0 (it holds nothing either way). A histogram with no bucket
    /// besides the zero bucket (e.g. `increase()` over a quiet window) gets schema 8, which
    /// adds to any other without changing it.
    ///
    /// Errors ([`ApiHistogramError`], saying which bucket and why): a bucket that is not on one
    /// schema's boundaries (custom buckets, schema -53, included), a zero bucket that is not
    /// `[-t, t]`, a bucket whose boundary rule does not fit its side of zero, or counts that
    /// [`NativeHistogram::new`] rejects.
    pub fn to_native(&self) -> Result<NativeHistogram, ApiHistogramError> {
        let mut zero: Option<(f64, f64)> = None;
        let (mut positive, mut negative) = (Vec::new(), Vec::new());
        for (index, b) in self.buckets.iter().enumerate() {
            let fault = |problem| ApiHistogramError::Bucket { index, bucket: *b, problem };
            if b.lower.is_nan() || b.upper.is_nan() || b.lower > b.upper {
                return Err(fault(BucketProblem::Unordered));
            }
            if b.lower <= 0.0 && b.upper >= 0.0 {
                if b.rule != BoundaryRule::Closed || b.lower != -b.upper {
                    return Err(fault(BucketProblem::NotZeroBucket));
                }
                if zero.replace((b.upper, b.count)).is_some() {
                    return Err(fault(BucketProblem::SecondZeroBucket));
                }
            } else if b.lower > 0.0 {
                if b.rule != BoundaryRule::OpenLower {
                    return Err(fault(BucketProblem::PositiveRule));
                }
                positive.push((b.lower, b.upper, b.count));
            } else {
                if b.rule != BoundaryRule::OpenUpper {
                    return Err(fault(BucketProblem::NegativeRule));
                }
                negative.push((-b.upper, -b.lower, b.count));
            }
        }
        let layout = (SCHEMA_MIN..=SCHEMA_MAX).rev().find_map(|schema| Some((schema, side_in_schema(&positive, schema)?, side_in_schema(&negative, schema)?)));
        let Some((schema, (positive, moved_p), (negative, moved_n))) = layout else {
            // name a bucket that is on no schema's boundaries even alone, if there is one
            let lone = positive.iter().chain(&negative).find(|&&m| !(SCHEMA_MIN..=SCHEMA_MAX).any(|s| side_in_schema(&[m], s).is_some()));
            return Err(match lone {
                Some(&(lower, upper, _)) => ApiHistogramError::OffSchema { lower, upper },
                None => ApiHistogramError::NoCommonSchema,
            });
        };
        // the zero threshold: the zero bucket's, which a raised bound must equal
        let mut threshold = zero.map(|z| z.0);
        for m in [moved_p, moved_n].into_iter().flatten() {
            match threshold {
                Some(zero) if zero != m => return Err(ApiHistogramError::ZeroThreshold { raised: m, zero }),
                _ => threshold = Some(m),
            }
        }
        let threshold = threshold.unwrap_or(0.0);
        Ok(NativeHistogram::from_buckets(schema, (threshold, zero.map_or(0.0, |z| z.1)), (self.count, self.sum), &positive, &negative)?)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{KP, answer, captured};
    use super::super::{HistogramFamily, VectorSample, decode_query_response};
    use super::*;
    use crate::core::exposition::NativeHistogram;

    fn native_of(v: &[VectorSample]) -> NativeHistogram {
        assert_eq!(v.len(), 1, "{v:?}");
        v[0].histogram.as_ref().expect("a histogram sample").to_native().unwrap()
    }

    #[test]
    fn boundary_indices() {
        // powers of two: exact for schema <= 0
        assert_eq!(boundary_index(1.0, 0), Some(0));
        assert_eq!(boundary_index(0.25, 0), Some(-2));
        assert_eq!(boundary_index(0.25, -1), Some(-1));
        assert_eq!(boundary_index(0.5, -1), None);
        assert_eq!(boundary_index(2f64.powi(-128), -4), Some(-8));
        assert_eq!(boundary_index(f64::from_bits(1 << 4), 0), Some(-1070)); // 2^-1070, subnormal
        assert_eq!(boundary_index(3.0, 0), None);
        // schema 3 bounds as Prometheus writes them (from the capture)
        assert_eq!(boundary_index(0.1621049443313762, 3), Some(-21));
        assert_eq!(boundary_index(0.14865088937534013, 3), Some(-22));
        assert_eq!(boundary_index(0.04052623608284405, 3), Some(-37));
        assert_eq!(boundary_index(0.1621049443313762, 2), None);
        assert_eq!(boundary_index(0.000244140625, 3), Some(-96)); // 2^-12
        // Prometheus' table is up to 4 ulps off exp2: 0.8973545375015533 x 2^0 for schema 5, 27
        assert_eq!(boundary_index(0.8973545375015533, 5), Some(-5));
        // 40 ulps off a bound is no bound
        assert_eq!(boundary_index(f64::from_bits(0.1621049443313762f64.to_bits() + 40), 3), None);
        // the last finite bound and the +Inf one
        assert_eq!(boundary_index(f64::MAX, 3), Some(8192));
        assert_eq!(boundary_index(f64::INFINITY, 3), Some(8193));
        assert_eq!(boundary_index(f64::MAX, -2), Some(256));
        assert_eq!(boundary_index(0.0, 0), None);
        assert_eq!(boundary_index(-1.0, 0), None);
        assert_eq!(boundary_index(f64::NAN, 0), None);
        // frexp
        assert_eq!(frexp(1.0), (0.5, 1));
        assert_eq!(frexp(0.75), (0.75, 0));
        assert_eq!(frexp(f64::from_bits(1)), (0.5, -1073));
    }

    #[test]
    fn real_answer_decodes_to_the_captures_native_buckets() {
        // per series: the capture's IPv4 and IPv6 histograms
        let body = include_bytes!("../../../tests/data/metrics/kube-proxy-v1.37.2-idle-node-a.pb");
        let decoded = crate::core::exposition::protobuf::decode_kube_proxy_protobuf(body).unwrap();
        let series = decoded.native_series(HistogramFamily::Sync);
        assert_eq!(series.len(), 2, "{series:?}");
        let per_family = answer(KP);
        assert_eq!(per_family.len(), 2);
        for s in &per_family {
            let h = s.histogram.as_ref().unwrap().to_native().unwrap();
            let family = &s.labels["ip_family"];
            let (_, pb) = series.iter().find(|(l, _)| l.contains(&format!("\"{family}\""))).unwrap_or_else(|| panic!("{family} in {series:?}"));
            assert_eq!(
                (h.schema(), h.count(), h.sum(), h.positive(), h.negative()),
                (pb.schema(), pb.count(), pb.sum(), pb.positive(), pb.negative()),
                "{family}"
            );
            assert_eq!(pb.zero_threshold(), 2f64.powi(-128));
            assert_eq!(pb.zero_count(), 0.0);
            // the API does not write an empty zero bucket: its threshold is not in the answer
            assert_eq!((h.zero_threshold(), h.zero_count()), (0.0, 0.0));
        }
        // summed over ip_family by the query: the capture's buckets added
        let sum = native_of(&answer(&format!("sum by (node, instance) ({KP})")));
        let pb = crate::core::exposition::parse_kube_proxy_protobuf(body).unwrap().sync_native.unwrap();
        assert_eq!(sum.schema(), 3);
        assert_eq!(sum.positive(), &[(-37, 1.0), (-21, 2.0)]);
        assert_eq!((sum.positive(), sum.count()), (pb.positive(), pb.count()));
        assert!((sum.sum() - pb.sum()).abs() < 1e-12, "{} {}", sum.sum(), pb.sum());
        // increase() over a window without syncs: an empty histogram, schema 8
        let quiet = native_of(&answer(&format!("sum by (node, instance) (increase({KP}[60s]))")));
        assert_eq!((quiet.schema(), quiet.count(), quiet.positive().len()), (8, 0.0, 0));
        // no network-programming sample yet: no native series at all
        assert!(answer("sum by (node, instance) (increase(kubeproxy_network_programming_duration_seconds[60s]))").is_empty());
        // Prometheus' own request durations: 25 buckets, and increase()'s float counts
        let self_query = "prometheus_http_request_duration_seconds{handler=\"/api/v1/query\"}";
        let written = captured()["answers"].as_array().unwrap().iter().find(|a| a["query"] == self_query).unwrap()["answer"]["data"]["result"][0]["histogram"]
            [1]["buckets"]
            .as_array()
            .unwrap()
            .len();
        let many = native_of(&answer(self_query));
        assert_eq!((many.schema(), many.positive().len(), written), (3, 25, 25));
        assert_eq!(many.positive().iter().map(|b| b.1).sum::<f64>(), many.count());
        let inc = native_of(&answer("increase(prometheus_http_request_duration_seconds{handler=\"/metrics\"}[30s])"));
        assert_eq!(inc.schema(), 3);
        assert!(inc.positive().iter().any(|b| b.1.fract() != 0.0));
    }

    #[test]
    fn decoded_quantiles_equal_prometheus_histogram_quantile() {
        let mut checked = 0;
        for inner in [
            format!("sum by (node, instance) ({KP})"),
            "prometheus_http_request_duration_seconds{handler=\"/api/v1/query\"}".to_string(),
            "increase(prometheus_http_request_duration_seconds{handler=\"/metrics\"}[30s])".to_string(),
        ] {
            let h = native_of(&answer(&inner));
            for q in [0.5, 0.9, 0.99] {
                let prom = answer(&format!("histogram_quantile({q}, {inner})"));
                assert_eq!(prom.len(), 1);
                let ours = h.quantile(q);
                assert_eq!(ours.kind, crate::core::exposition::HistogramKind::Native);
                assert_eq!(ours.seconds.to_bits(), prom[0].value.to_bits(), "q {q} of {inner}: ours {} Prometheus {}", ours.seconds, prom[0].value);
                checked += 1;
            }
        }
        assert_eq!(checked, 9);
    }

    /// The native histogram of an answer holding the one histogram sample `json` (which must
    /// decode).
    fn api_histogram(json: &str) -> Result<NativeHistogram, ApiHistogramError> {
        let body = format!(r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{}},"histogram":[1,{json}]}}]}}}}"#);
        decode_query_response("q", 200, &body).unwrap()[0].histogram.as_ref().unwrap().to_native()
    }

    #[test]
    fn the_documented_example_with_a_zero_bucket() {
        // util/jsonutil MarshalHistogram's own example: schema 0, zero bucket [-0.25, 0.25]
        let h = api_histogram(r#"{"count":"42","sum":"34593.34","buckets":[[3,"-0.25","0.25","3"],[0,"0.25","0.5","12"],[0,"0.5","1","21"],[0,"2","4","6"]]}"#)
            .unwrap();
        assert_eq!((h.schema(), h.zero_threshold(), h.zero_count(), h.count(), h.sum()), (0, 0.25, 3.0, 42.0, 34593.34));
        assert_eq!(h.positive(), &[(-1, 12.0), (0, 21.0), (2, 6.0)]);
        assert!(h.negative().is_empty());
    }

    #[test]
    fn negative_buckets_and_raised_bounds() {
        // schema 1 (b = sqrt 2): [-2, -sqrt2) is negative index 2, [-1, -0.7071..) index 0
        let h = api_histogram(
            r#"{"count":"4","sum":"-3","buckets":[[1,"-2","-1.414213562373095","1"],[1,"-1","-0.7071067811865475","2"],[0,"1","1.414213562373095","1"]]}"#,
        )
        .unwrap();
        assert_eq!(h.schema(), 1);
        assert_eq!(h.negative(), &[(0, 2.0), (2, 1.0)]);
        assert_eq!(h.positive(), &[(1, 1.0)]);
        // zero threshold 0.3 inside (0.25, 0.5] of schema 0: that bucket's lower bound is written
        // as 0.3, and the mirrored one's upper as -0.3
        let h =
            api_histogram(r#"{"count":"6","sum":"0","buckets":[[1,"-0.5","-0.3","1"],[3,"-0.3","0.3","2"],[0,"0.3","0.5","2"],[0,"0.5","1","1"]]}"#).unwrap();
        assert_eq!((h.schema(), h.zero_threshold(), h.zero_count()), (0, 0.3, 2.0));
        assert_eq!((h.positive(), h.negative()), (&[(-1, 2.0), (0, 1.0)][..], &[(-1, 1.0)][..]));
        // the same without the zero bucket (empty, so not written): the raised bound gives it
        let h = api_histogram(r#"{"count":"3","sum":"1","buckets":[[0,"0.3","0.5","2"],[0,"0.5","1","1"]]}"#).unwrap();
        assert_eq!((h.schema(), h.zero_threshold(), h.zero_count()), (0, 0.3, 0.0));
        // a raised bound that disagrees with the zero bucket's threshold
        let e = api_histogram(r#"{"count":"3","sum":"1","buckets":[[3,"-0.2","0.2","1"],[0,"0.3","0.5","2"]]}"#).unwrap_err();
        assert_eq!(e, ApiHistogramError::ZeroThreshold { raised: 0.3, zero: 0.2 });
        assert_eq!(e.to_string(), "a bucket's lower bound 0.3 was raised to a zero threshold, but the zero bucket's is 0.2");
    }

    #[test]
    fn buckets_on_no_exponential_schema_are_errors() {
        // native histograms with custom buckets (schema -53, e.g. convert_classic_histograms_to_nhcb)
        let e = api_histogram(r#"{"count":"3","sum":"1","buckets":[[3,"-Inf","0.005","1"],[0,"0.005","0.01","2"]]}"#).unwrap_err();
        assert_eq!(e.to_string(), "bucket 0 (rule Closed, lower -inf, upper 0.005, count 1): spans 0 but is not a zero bucket [-t, t] (custom buckets?)");
        let e = api_histogram(r#"{"count":"3","sum":"1","buckets":[[0,"0.005","0.01","2"],[0,"0.01","0.025","1"]]}"#).unwrap_err();
        assert_eq!(e, ApiHistogramError::OffSchema { lower: 0.005, upper: 0.01 });
        assert_eq!(e.to_string(), "the bucket of magnitudes (0.005, 0.01] is on no exponential schema's boundaries (-4..=8): custom buckets?");
        // each on some schema, but not on one: (1, 2] is schema 0, (1, 1.414..] schema 1
        let e = api_histogram(r#"{"count":"2","sum":"1","buckets":[[0,"1","1.414213562373095","1"],[0,"2","4","1"],[0,"4","5.65685424949238","1"]]}"#);
        assert_eq!(e.unwrap_err(), ApiHistogramError::NoCommonSchema);
        // a rule on the wrong side of zero, lower above upper, a second zero bucket
        let problem = |json: &str| match api_histogram(json) {
            Err(ApiHistogramError::Bucket { index, problem, .. }) => (index, problem),
            other => panic!("{json}: {other:?}"),
        };
        assert_eq!(problem(r#"{"count":"1","sum":"1","buckets":[[1,"1","2","1"]]}"#), (0, BucketProblem::PositiveRule));
        assert_eq!(problem(r#"{"count":"1","sum":"-1","buckets":[[0,"-2","-1","1"]]}"#), (0, BucketProblem::NegativeRule));
        assert_eq!(problem(r#"{"count":"1","sum":"1","buckets":[[0,"2","1","1"]]}"#), (0, BucketProblem::Unordered));
        let e = api_histogram(r#"{"count":"1","sum":"1","buckets":[[0,"NaN","1","1"]]}"#).unwrap_err();
        assert_eq!(e.to_string(), "bucket 0 (rule OpenLower, lower NaN, upper 1, count 1): lower above upper, or NaN");
        let two = r#"{"count":"2","sum":"0","buckets":[[3,"-0.1","0.1","1"],[3,"-0.1","0.1","1"]]}"#;
        assert_eq!(problem(two), (1, BucketProblem::SecondZeroBucket));
        // counts NativeHistogram::new rejects
        let e = api_histogram(r#"{"count":"1","sum":"1","buckets":[[0,"1","2","5"]]}"#).unwrap_err();
        assert!(matches!(e, ApiHistogramError::Counts(_)) && e.to_string().contains("count 1"), "{e}");
        let e = api_histogram(r#"{"count":"1","sum":"1","buckets":[[0,"1","2","-1"]]}"#).unwrap_err();
        assert!(matches!(e, ApiHistogramError::Counts(_)) && e.to_string().contains("count -1"), "{e}");
    }
}
