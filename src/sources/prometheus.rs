//! The Prometheus source (adapter): instead of scraping every kube-proxy, ask a Prometheus
//! server that already does, through its HTTP API (`GET /api/v1/query`), and feed the same core
//! maths.
//!
//! Queries (`W` is the window, e.g. `600s`):
//!
//! | what | PromQL |
//! |---|---|
//! | sync buckets | `sum by (node, instance, le) (increase(kubeproxy_sync_proxy_rules_duration_seconds_bucket[W]))` |
//! | network programming buckets | the same over `kubeproxy_network_programming_duration_seconds_bucket` |
//! | sync native histogram | `sum by (node, instance) (increase(kubeproxy_sync_proxy_rules_duration_seconds[W]))` |
//! | network programming native histogram | the same over `kubeproxy_network_programming_duration_seconds` |
//! | last sync | `min by (node, instance, ip_family) (kubeproxy_sync_proxy_rules_last_timestamp_seconds)` |
//! | last queued | `max by (node, instance, ip_family) (kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds)` |
//! | iptables rules | `sum by (node, instance) (kubeproxy_sync_proxy_rules_iptables_total)` |
//!
//! Per instance the bucket vectors become [`Histogram`]s (`le` parsed, `"+Inf"` included, extra
//! labels such as `ip_family` already summed away by the query) in a [`KubeProxyScrape`], and
//! so a [`NodeInput`] with `earlier: None`: `increase()` over the window already is the
//! interval (Prometheus handles counter resets), so the core takes no further delta. The
//! oldest last-sync and newest last-queued match what the scrape parser does with dual-stack
//! series (worst staleness), and the rule count is summed over `table` as the parser does.
//!
//! # Native histograms
//!
//! kube-proxy 1.37 serves native histograms (schema 3) for its sync and network-programming
//! durations in the protobuf exposition only. Prometheus stores them when the scrape config (or
//! `global`) sets `scrape_native_histograms: true` (Prometheus 3.8 and later; before, the
//! `--enable-feature=native-histograms` flag), which also makes it ask for protobuf first; it
//! then keeps the classic `_bucket` series only with `always_scrape_classic_histograms: true`.
//! A native series has the family's own name, no `_bucket` suffix, and the same name over the
//! text exposition holds nothing, so without native ingestion (or with an older kube-proxy)
//! the native queries answer an empty vector and the snapshot is exactly the classic one. With
//! both, an instance gets `sync` and `sync_native` (and the network-programming pair), and the
//! model prefers the native one.
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
//!
//! Instance keys: the `node` label when the series carry one (kube-prometheus relabels it in),
//! else the `instance` label without its port (`10.0.0.7:10249` -> `10.0.0.7`).
//!
//! Because every answer is already a window, a snapshot must not be recorded into a
//! long-lived [`MeasurementStore`] (its deltas between two windows would be meaningless):
//! [`PrometheusSnapshot::into_store`] builds a fresh store per query, which [`PrometheusLoop`]
//! swaps in.

use super::fetch::{DEFAULT_MAX_BODY_BYTES, FetchError, read_limited};
use super::oneshot::unix_now;
use super::proxy_config::read_proxy_configmap;
use super::scrape::Jitter;
use crate::core::exposition::native::{SCHEMA_MAX, SCHEMA_MIN};
use crate::core::exposition::{Bucket, Histogram, HistogramFamily, KubeProxyScrape, NativeHistogram, NativeHistogramError};
use crate::core::measure::{MeasurementStore, NodeFailure, Sample, reason};
use crate::core::model::NodeInput;
use crate::core::proxyconfig::ResolvedProxyConfig;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Why a Prometheus query failed. Every variant's message names the URL or the query.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PrometheusError {
    /// The base URL is not an http(s) URL.
    #[error("Prometheus URL {url:?} is not valid: {message}")]
    Url {
        /// The URL given.
        url: String,
        /// Why.
        message: String,
    },
    /// No HTTP answer (refused, timeout, DNS, TLS).
    #[error("Prometheus at {url} did not answer: {message}")]
    Transport {
        /// The query URL (without the query string).
        url: String,
        /// The client error with its causes.
        message: String,
    },
    /// Prometheus answered `"status": "error"` (bad query, timeout, unavailable).
    #[error("Prometheus rejected the query {query:?}: {error_type}: {error} (HTTP {http_status})")]
    Api {
        /// The PromQL.
        query: String,
        /// `errorType` (`bad_data`, `timeout`, `execution`, `unavailable`, ...).
        error_type: String,
        /// `error`.
        error: String,
        /// The HTTP status code of the answer.
        http_status: u16,
    },
    /// A non-2xx answer without a Prometheus error body (a proxy or the wrong server).
    #[error("Prometheus query {query:?} failed: HTTP {http_status}: {body}")]
    Http {
        /// The PromQL.
        query: String,
        /// The HTTP status code.
        http_status: u16,
        /// The start of the body (at most 200 characters).
        body: String,
    },
    /// The body is not the Prometheus API's JSON, or not an instant vector.
    #[error("Prometheus query {query:?}: unexpected answer: {message}")]
    Decode {
        /// The PromQL.
        query: String,
        /// What was wrong.
        message: String,
    },
}

/// One element of an instant vector: a float sample (`value`) or a native histogram sample
/// (`histogram`, with `value` NaN).
#[derive(Debug, Clone, PartialEq)]
pub struct VectorSample {
    /// The series' labels.
    pub labels: BTreeMap<String, String>,
    /// Evaluation time, Unix seconds.
    pub timestamp: f64,
    /// The value (`NaN` and `±Inf` accepted); NaN for a histogram sample.
    pub value: f64,
    /// The native histogram of a histogram sample (the answer's `histogram` field).
    pub histogram: Option<ApiHistogram>,
}

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

#[derive(Deserialize)]
struct ApiResponse {
    status: String,
    #[serde(default)]
    data: Option<ApiData>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct ApiData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct ApiVectorElement {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    #[serde(default)]
    value: Option<(f64, String)>,
    #[serde(default)]
    histogram: Option<(f64, RawHistogram)>,
}

#[derive(Deserialize)]
struct RawHistogram {
    count: String,
    sum: String,
    #[serde(default)]
    buckets: Vec<(u64, String, String, String)>,
}

impl RawHistogram {
    /// The numbers parsed; the message says which one is wrong.
    fn parse(self) -> Result<ApiHistogram, String> {
        let number = |what: &str, s: &str| parse_sample_value(s).ok_or_else(|| format!("histogram {what} {s:?} is not a number"));
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .map(|(n, (rule, lower, upper, count))| {
                let rule = BoundaryRule::from_code(*rule).ok_or_else(|| format!("histogram bucket {n}: boundary rule {rule} is not 0..=3"))?;
                let at = |what: &str, s: &str| number(&format!("bucket {n} {what}"), s);
                Ok(ApiBucket { rule, lower: at("lower", lower)?, upper: at("upper", upper)?, count: at("count", count)? })
            })
            .collect::<Result<_, String>>()?;
        Ok(ApiHistogram { count: number("count", &self.count)?, sum: number("sum", &self.sum)?, buckets })
    }
}

/// Parses a Prometheus sample value (`"3"`, `"1.5e3"`, `"NaN"`, `"+Inf"`, `"-Inf"`).
pub fn parse_sample_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
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

/// Decodes a `/api/v1/query` answer body into an instant vector. `http_status` is used in
/// error messages; a `"status": "error"` body is an [`PrometheusError::Api`] whatever the
/// status code.
pub fn decode_query_response(query: &str, http_status: u16, body: &str) -> Result<Vec<VectorSample>, PrometheusError> {
    let decode = |message: String| PrometheusError::Decode { query: query.to_string(), message };
    let resp: ApiResponse = match serde_json::from_str(body) {
        Ok(r) => r,
        Err(e) if (200..300).contains(&http_status) => return Err(decode(format!("not Prometheus API JSON: {e}"))),
        Err(_) => {
            let body: String = body.chars().take(200).collect();
            return Err(PrometheusError::Http { query: query.to_string(), http_status, body: body.trim().to_string() });
        }
    };
    if resp.status != "success" {
        return Err(PrometheusError::Api {
            query: query.to_string(),
            error_type: resp.error_type.unwrap_or_else(|| "unknown".into()),
            error: resp.error.unwrap_or_else(|| format!("status {:?}", resp.status)),
            http_status,
        });
    }
    let data = resp.data.ok_or_else(|| decode("status success without data".into()))?;
    if data.result_type != "vector" {
        return Err(decode(format!("resultType {:?}, expected \"vector\"", data.result_type)));
    }
    let elements: Vec<ApiVectorElement> = serde_json::from_value(data.result).map_err(|e| decode(format!("vector result: {e}")))?;
    elements
        .into_iter()
        .enumerate()
        .map(|(n, e)| match (e.value, e.histogram) {
            (Some((timestamp, v)), None) => {
                let value = parse_sample_value(&v).ok_or_else(|| decode(format!("value {v:?} is not a number")))?;
                Ok(VectorSample { labels: e.metric, timestamp, value, histogram: None })
            }
            (None, Some((timestamp, h))) => {
                let h = h.parse().map_err(|m| decode(format!("element {n}: {m}")))?;
                Ok(VectorSample { labels: e.metric, timestamp, value: f64::NAN, histogram: Some(h) })
            }
            (Some(_), Some(_)) => Err(decode(format!("element {n} has both a value and a histogram"))),
            (None, None) => Err(decode(format!("element {n} has neither a value nor a histogram"))),
        })
        .collect()
}

/// The key a series is stored under: a non-empty `node` label, else `instance` without its
/// port (`10.0.0.7:10249` -> `10.0.0.7`, `[fd00::7]:10249` -> `fd00::7`). `None` when the
/// series has neither.
pub fn instance_key(labels: &BTreeMap<String, String>) -> Option<String> {
    if let Some(node) = labels.get("node").filter(|n| !n.is_empty()) {
        return Some(node.clone());
    }
    let instance = labels.get("instance").filter(|i| !i.is_empty())?;
    if let Some((host, _)) = instance.strip_prefix('[').and_then(|rest| rest.split_once(']')) {
        return Some(host.to_string());
    }
    // host:port (one colon); a bare IPv6 address (several colons) is kept whole
    match instance.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.chars().all(|c| c.is_ascii_digit()) => Some(host.to_string()),
        _ => Some(instance.clone()),
    }
}

/// The PromQL of each query for a window of `window_seconds`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queries {
    /// Sync-duration buckets increase over the window, per instance and `le`.
    pub sync_buckets: String,
    /// Network-programming buckets increase over the window, per instance and `le`.
    pub network_programming_buckets: String,
    /// Sync-duration native histogram increase over the window, per instance.
    pub sync_native: String,
    /// Network-programming native histogram increase over the window, per instance.
    pub network_programming_native: String,
    /// Oldest last successful sync per instance.
    pub last_sync: String,
    /// Newest last queued sync per instance.
    pub last_queued: String,
    /// iptables rules owned, summed over tables, per instance.
    pub iptables_rules: String,
}

impl Queries {
    /// The queries for a window of `window_seconds` (rounded to whole seconds, at least 1).
    pub fn new(window_seconds: f64) -> Self {
        let w = format!("{}s", window_seconds.round().max(1.0) as u64);
        let buckets = |family: HistogramFamily| format!("sum by (node, instance, le) (increase({}_bucket[{w}]))", family.name());
        let native = |family: HistogramFamily| format!("sum by (node, instance) (increase({}[{w}]))", family.name());
        Self {
            sync_buckets: buckets(HistogramFamily::Sync),
            network_programming_buckets: buckets(HistogramFamily::NetworkProgramming),
            sync_native: native(HistogramFamily::Sync),
            network_programming_native: native(HistogramFamily::NetworkProgramming),
            // per proxier: a family's queue is paired with its own sync ([`KubeProxyScrape::waiting`])
            last_sync: "min by (node, instance, ip_family) (kubeproxy_sync_proxy_rules_last_timestamp_seconds)".into(),
            last_queued: "max by (node, instance, ip_family) (kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds)".into(),
            iptables_rules: "sum by (node, instance) (kubeproxy_sync_proxy_rules_iptables_total)".into(),
        }
    }
}

/// The per-instance result of one round of queries.
#[derive(Debug, Clone)]
pub struct PrometheusSnapshot {
    /// One input per instance with at least one histogram, sorted by key; `earlier` is `None`.
    pub inputs: Vec<NodeInput>,
    /// Instances whose series could not be turned into a histogram (e.g. no `+Inf` bucket),
    /// reason `parse`.
    pub failures: BTreeMap<String, NodeFailure>,
    /// When the queries were answered, Unix seconds.
    pub at_unix_seconds: f64,
}

impl PrometheusSnapshot {
    /// A fresh store holding exactly this snapshot (one sample per instance, so the analysis
    /// uses each window as it is), with the failures recorded.
    pub fn into_store(self, window_seconds: f64) -> MeasurementStore {
        let mut store = MeasurementStore::new(window_seconds);
        for input in self.inputs {
            store.record_via(
                &input.node,
                Sample { at_unix_seconds: self.at_unix_seconds, scrape: input.later, proxy_mode: input.proxy_mode },
                crate::core::measure::NodeSource::Prometheus,
            );
        }
        for (node, f) in self.failures {
            store.record_failure(&node, f);
        }
        store
    }
}

/// The vectors of one round of queries, by role.
#[derive(Debug, Clone, Default)]
pub struct Vectors {
    /// Answer of [`Queries::sync_buckets`].
    pub sync_buckets: Vec<VectorSample>,
    /// Answer of [`Queries::network_programming_buckets`].
    pub network_programming_buckets: Vec<VectorSample>,
    /// Answer of [`Queries::sync_native`] (empty when the server holds no native histograms).
    pub sync_native: Vec<VectorSample>,
    /// Answer of [`Queries::network_programming_native`].
    pub network_programming_native: Vec<VectorSample>,
    /// Answer of [`Queries::last_sync`].
    pub last_sync: Vec<VectorSample>,
    /// Answer of [`Queries::last_queued`].
    pub last_queued: Vec<VectorSample>,
    /// Answer of [`Queries::iptables_rules`].
    pub iptables_rules: Vec<VectorSample>,
}

/// Turns the query answers into per-instance inputs (pure but for a warning log). Classic
/// series without an `le` label or with an unreadable one, float samples in a native answer,
/// and series without an instance key, are ignored; an instance whose buckets have no `+Inf`
/// bound, or whose native histogram does not convert ([`ApiHistogram::to_native`]), gets a
/// `parse` failure naming the family, which is logged and dropped when the instance has another
/// histogram to measure (e.g. a native histogram with custom buckets beside the classic ones).
/// Native histograms of one key (several instances relabelled to one node) are added.
pub fn build_snapshot(v: &Vectors, at_unix_seconds: f64) -> PrometheusSnapshot {
    let mut scrapes: BTreeMap<String, KubeProxyScrape> = BTreeMap::new();
    let mut failures = BTreeMap::new();
    let parse_failure = |message: String| NodeFailure { reason: reason::PARSE.into(), message, at_unix_seconds };
    for (family, samples) in [(HistogramFamily::Sync, &v.sync_buckets), (HistogramFamily::NetworkProgramming, &v.network_programming_buckets)] {
        for (key, h) in classic_per_instance(samples) {
            match h {
                Ok(h) => {
                    let scrape = scrapes.entry(key).or_default();
                    match family {
                        HistogramFamily::Sync => scrape.sync = Some(h),
                        _ => scrape.network_programming = Some(h),
                    }
                }
                Err(e) => {
                    failures.insert(key, parse_failure(format!("Prometheus series of {}: {e}", family.name())));
                }
            }
        }
    }
    for (family, samples) in [(HistogramFamily::Sync, &v.sync_native), (HistogramFamily::NetworkProgramming, &v.network_programming_native)] {
        for (key, h) in native_per_instance(samples) {
            match h {
                Ok(h) => {
                    let scrape = scrapes.entry(key).or_default();
                    match family {
                        HistogramFamily::Sync => scrape.sync_native = Some(h),
                        _ => scrape.network_programming_native = Some(h),
                    }
                }
                Err(e) => {
                    failures.insert(key, parse_failure(format!("Prometheus native histogram of {}: {e}", family.name())));
                }
            }
        }
    }
    // gauges only for instances that have a histogram (an instance with gauges alone has
    // nothing to measure)
    let mut gauge = |samples: &[VectorSample], set: fn(&mut KubeProxyScrape, f64, &str)| {
        for s in samples {
            if let Some(scrape) = instance_key(&s.labels).and_then(|k| scrapes.get_mut(&k)) {
                set(scrape, s.value, s.labels.get("ip_family").map_or("", String::as_str));
            }
        }
    };
    gauge(&v.last_sync, |s, x, family| {
        s.last_sync_timestamp_seconds = Some(s.last_sync_timestamp_seconds.map_or(x, |o| o.min(x)));
        s.sync_timestamps_of(family).last_synced_seconds = Some(x);
    });
    gauge(&v.last_queued, |s, x, family| {
        s.last_queued_timestamp_seconds = Some(s.last_queued_timestamp_seconds.map_or(x, |o| o.max(x)));
        s.sync_timestamps_of(family).last_queued_seconds = Some(x);
    });
    gauge(&v.iptables_rules, |s, x, _| s.iptables_rules_total = Some(s.iptables_rules_total.unwrap_or(0.0) + x));
    for k in scrapes.keys() {
        if let Some(f) = failures.remove(k) {
            tracing::warn!(instance = %k, "{}; measured from its other histograms", f.message);
        }
    }
    let inputs = scrapes
        .into_iter()
        .map(|(node, mut later)| {
            later.scraped_at_unix_seconds = Some(at_unix_seconds);
            NodeInput { node, later, earlier: None, proxy_mode: None }
        })
        .collect();
    PrometheusSnapshot { inputs, failures, at_unix_seconds }
}

/// The classic histogram of each instance key from one family's `_bucket` series (float
/// samples; series without an instance key or a readable `le` are skipped), or why its
/// buckets do not make one (no `+Inf` bound, ...).
fn classic_per_instance(samples: &[VectorSample]) -> BTreeMap<String, Result<Histogram, String>> {
    let mut per_key: BTreeMap<String, Vec<Bucket>> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.histogram.is_none()) {
        let (Some(key), Some(le)) = (instance_key(&s.labels), s.labels.get("le").and_then(|l| parse_sample_value(l))) else {
            continue;
        };
        per_key.entry(key).or_default().push(Bucket { upper_bound_seconds: le, count: s.value });
    }
    per_key.into_iter().map(|(key, buckets)| (key, Histogram::new(buckets, None).map_err(|e| e.to_string()))).collect()
}

/// The native histogram of each instance key from one family's native series (samples without
/// a histogram or an instance key are skipped): the series of one key are added (several
/// instances relabelled to one node); one that does not convert fails its key.
fn native_per_instance(samples: &[VectorSample]) -> BTreeMap<String, Result<NativeHistogram, ApiHistogramError>> {
    let mut per_key: BTreeMap<String, Result<NativeHistogram, ApiHistogramError>> = BTreeMap::new();
    for s in samples {
        let (Some(key), Some(h)) = (instance_key(&s.labels), s.histogram.as_ref()) else {
            continue;
        };
        let h = h.to_native();
        let merged = match per_key.remove(&key) {
            None => h,
            Some(Ok(a)) => h.map(|b| a.add(&b)),
            Some(Err(e)) => Err(e),
        };
        per_key.insert(key, merged);
    }
    per_key
}

/// A Prometheus server to query.
#[derive(Debug, Clone)]
pub struct PrometheusSource {
    query_url: reqwest::Url,
    client: reqwest::Client,
    window_seconds: f64,
}

impl PrometheusSource {
    /// A source for the server at `base_url` (e.g. `http://prometheus.monitoring:9090`, a path
    /// prefix such as `/prometheus` kept), analysing `window` (default 10 minutes in the
    /// operator), each request bounded by `timeout`.
    ///
    /// Errors: `base_url` is not an http(s) URL.
    pub fn new(base_url: &str, window: Duration, timeout: Duration) -> Result<Self, PrometheusError> {
        let url_err = |message: String| PrometheusError::Url { url: base_url.to_string(), message };
        let mut base = reqwest::Url::parse(base_url).map_err(|e| url_err(e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(url_err("expected http:// or https://".into()));
        }
        if !base.path().ends_with('/') {
            let p = format!("{}/", base.path());
            base.set_path(&p);
        }
        base.set_query(None);
        let query_url = base.join("api/v1/query").map_err(|e| url_err(e.to_string()))?;
        Ok(Self { query_url, client: super::fetch::keep_alive_http_client(timeout), window_seconds: window.as_secs_f64() })
    }

    /// The `/api/v1/query` URL used.
    pub fn query_url(&self) -> &str {
        self.query_url.as_str()
    }

    /// The analysed window, seconds.
    pub fn window_seconds(&self) -> f64 {
        self.window_seconds
    }

    /// Runs one instant query and returns its vector.
    ///
    /// Errors: no answer ([`PrometheusError::Transport`]), `"status": "error"`
    /// ([`PrometheusError::Api`]), another non-2xx answer ([`PrometheusError::Http`]), or a
    /// body that is not an instant vector ([`PrometheusError::Decode`]).
    pub async fn query(&self, promql: &str) -> Result<Vec<VectorSample>, PrometheusError> {
        let transport = |e: FetchError| PrometheusError::Transport { url: self.query_url.to_string(), message: e.to_string() };
        let resp = self.client.get(self.query_url.clone()).query(&[("query", promql)]).send().await.map_err(|e| transport(e.into()))?;
        let status = resp.status().as_u16();
        let body = read_limited(resp, DEFAULT_MAX_BODY_BYTES).await.map_err(transport)?;
        decode_query_response(promql, status, &String::from_utf8_lossy(&body))
    }

    /// Runs the seven queries of [`Queries`] concurrently and builds the snapshot. The
    /// iptables rule query is optional: its failure is ignored (only iptables mode has it).
    /// The native queries answer an empty vector when the server holds no native histograms
    /// (then the snapshot is the classic one alone).
    ///
    /// Errors: the first failure of the six required queries.
    pub async fn fetch(&self) -> Result<PrometheusSnapshot, PrometheusError> {
        let q = Queries::new(self.window_seconds);
        let (sync, np, sync_native, np_native, last, queued, rules) = tokio::join!(
            self.query(&q.sync_buckets),
            self.query(&q.network_programming_buckets),
            self.query(&q.sync_native),
            self.query(&q.network_programming_native),
            self.query(&q.last_sync),
            self.query(&q.last_queued),
            self.query(&q.iptables_rules),
        );
        let v = Vectors {
            sync_buckets: sync?,
            network_programming_buckets: np?,
            sync_native: sync_native?,
            network_programming_native: np_native?,
            last_sync: last?,
            last_queued: queued?,
            iptables_rules: rules.unwrap_or_default(),
        };
        Ok(build_snapshot(&v, unix_now()))
    }
}

/// The measurement loop of the Prometheus source: every interval (plus up to 10% jitter) it
/// queries, replaces the shared store with [`PrometheusSnapshot::into_store`], and bumps the
/// generation counter. A failed round keeps the previous store (the plan keeps its last good
/// measurement) and bumps nothing. Stops when `cancel` fires.
pub struct PrometheusLoop {
    source: PrometheusSource,
    store: Arc<Mutex<MeasurementStore>>,
    generation: watch::Sender<u64>,
    interval: Duration,
    last_error: Arc<Mutex<Option<String>>>,
    config: Option<ConfigRefresh>,
    rounds: AtomicU64,
}

/// Where [`PrometheusLoop`] reads kube-proxy's configuration from (the ConfigMap: with this
/// source the metrics port and its `/configz` are usually not reachable).
struct ConfigRefresh {
    client: kube::Client,
    namespace: String,
    shared: Arc<RwLock<ResolvedProxyConfig>>,
    every: u64,
}

impl PrometheusLoop {
    /// A loop with the default 30 s interval.
    pub fn new(source: PrometheusSource, store: Arc<Mutex<MeasurementStore>>, generation: watch::Sender<u64>) -> Self {
        Self { source, store, generation, interval: super::scrape::DEFAULT_INTERVAL, last_error: Arc::default(), config: None, rounds: AtomicU64::new(0) }
    }

    /// Also reads kube-proxy's configuration from its ConfigMap in `namespace`
    /// ([`crate::sources::scrape::read_proxy_configmap`]) on the first round and every
    /// `every` rounds (at least 1), publishing it into `shared`; when it cannot be read,
    /// `shared` gets the 1 s default with the reason in its notes.
    pub fn with_configmap(mut self, client: kube::Client, namespace: &str, shared: Arc<RwLock<ResolvedProxyConfig>>, every: u64) -> Self {
        self.config = Some(ConfigRefresh { client, namespace: namespace.to_string(), shared, every: every.max(1) });
        self
    }

    /// Sets the time between rounds.
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// The last round's error (`None` after a success), for a `MetricsUnavailable` condition.
    pub fn last_error(&self) -> Arc<Mutex<Option<String>>> {
        Arc::clone(&self.last_error)
    }

    /// One round now. Returns the number of instances measured.
    ///
    /// Errors: the round's query error (the store is left as it was).
    pub async fn run_once(&self) -> Result<usize, PrometheusError> {
        let start = Instant::now();
        let round = self.rounds.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = self.config.as_ref().filter(|c| round.is_multiple_of(c.every)) {
            let resolved = match read_proxy_configmap(&c.client, &c.namespace).await {
                Ok((source, config)) => ResolvedProxyConfig::from_config(config, source, Vec::new()),
                Err(e) => ResolvedProxyConfig { notes: vec![e.to_string()], ..ResolvedProxyConfig::default() },
            };
            *c.shared.write().unwrap_or_else(PoisonError::into_inner) = resolved;
        }
        let result = self.source.fetch().await;
        let mut last_error = self.last_error.lock().unwrap_or_else(PoisonError::into_inner);
        match result {
            Ok(snapshot) => {
                let n = snapshot.inputs.len();
                let fresh = snapshot.into_store(self.source.window_seconds);
                *self.store.lock().unwrap_or_else(PoisonError::into_inner) = fresh;
                *last_error = None;
                drop(last_error);
                self.generation.send_modify(|g| *g += 1);
                tracing::info!(instances = n, elapsed_ms = start.elapsed().as_millis() as u64, "Prometheus query round");
                Ok(n)
            }
            Err(e) => {
                tracing::warn!(error = %e, "Prometheus query round failed; keeping the previous measurement");
                *last_error = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Runs rounds until `cancel` fires: one immediately, then every interval plus jitter.
    pub async fn run(self, cancel: CancellationToken) {
        let mut jitter = Jitter::seeded();
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = self.run_once() => {}
            }
            if !jitter.sleep(self.interval, &cancel).await {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn s(pairs: &[(&str, &str)], value: f64) -> VectorSample {
        VectorSample { labels: labels(pairs), timestamp: 1.7e9, value, histogram: None }
    }

    #[test]
    fn keys() {
        assert_eq!(instance_key(&labels(&[("instance", "10.0.0.1:10249")])).as_deref(), Some("10.0.0.1"));
        assert_eq!(instance_key(&labels(&[("instance", "[fd00::1]:10249")])).as_deref(), Some("fd00::1"));
        assert_eq!(instance_key(&labels(&[("instance", "fd00::1")])).as_deref(), Some("fd00::1"));
        assert_eq!(instance_key(&labels(&[("instance", "node-a")])).as_deref(), Some("node-a"));
        assert_eq!(instance_key(&labels(&[("instance", "10.0.0.1:10249"), ("node", "node-a")])).as_deref(), Some("node-a"));
        assert_eq!(instance_key(&labels(&[("instance", "10.0.0.1:10249"), ("node", "")])).as_deref(), Some("10.0.0.1"));
        assert_eq!(instance_key(&labels(&[("job", "kube-proxy")])), None);
    }

    #[test]
    fn queries_name_the_window_and_families() {
        let q = Queries::new(600.0);
        assert_eq!(q.sync_buckets, "sum by (node, instance, le) (increase(kubeproxy_sync_proxy_rules_duration_seconds_bucket[600s]))");
        assert!(q.network_programming_buckets.contains("kubeproxy_network_programming_duration_seconds_bucket[600s]"));
        assert_eq!(Queries::new(0.2).sync_buckets, Queries::new(1.0).sync_buckets);
    }

    #[test]
    fn snapshot_from_vectors() {
        let a = [("instance", "10.0.0.1:10249")];
        let b = [("instance", "10.0.0.2:10249")];
        let with_le = |base: &[(&'static str, &'static str)], le: &'static str| {
            let mut v = base.to_vec();
            v.push(("le", le));
            v
        };
        let v = Vectors {
            sync_buckets: vec![
                s(&with_le(&a, "0.128"), 3.0),
                s(&with_le(&a, "0.256"), 9.0),
                s(&with_le(&a, "+Inf"), 10.0),
                s(&with_le(&b, "0.128"), 1.0), // b: no +Inf
                s(&[("le", "1")], 1.0),        // no instance: ignored
            ],
            network_programming_buckets: vec![s(&with_le(&a, "1"), 1.0), s(&with_le(&a, "+Inf"), 1.5)],
            sync_native: vec![],
            network_programming_native: vec![],
            last_sync: vec![s(&a, 100.0)],
            last_queued: vec![s(&a, 220.0), s(&b, 5.0)],
            iptables_rules: vec![s(&a, 30.0)],
        };
        let snap = build_snapshot(&v, 42.0);
        assert_eq!(snap.inputs.len(), 1);
        let n = &snap.inputs[0];
        assert_eq!(n.node, "10.0.0.1");
        assert!(n.earlier.is_none());
        let sync = n.later.sync.as_ref().unwrap();
        assert_eq!(sync.count(), 10.0);
        assert_eq!(n.later.network_programming.as_ref().unwrap().count(), 1.5);
        assert_eq!(n.later.last_sync_timestamp_seconds, Some(100.0));
        assert_eq!(n.later.last_queued_timestamp_seconds, Some(220.0));
        assert_eq!(n.later.iptables_rules_total, Some(30.0));
        let f = &snap.failures["10.0.0.2"];
        assert_eq!(f.reason, "parse");
        assert!(f.message.contains("kubeproxy_sync_proxy_rules_duration_seconds") && f.message.contains("+Inf"), "{}", f.message);
        let store = snap.into_store(600.0);
        assert_eq!(store.nodes_with_data(), 1);
        assert_eq!(store.failures().len(), 1);
        assert!(store.inputs()[0].earlier.is_none());
    }

    #[test]
    fn decoding_answers() {
        let ok = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"instance":"10.0.0.1:10249","le":"+Inf"},"value":[1700000000.5,"NaN"]},{"metric":{},"value":[1700000000,"2"]}]}}"#;
        let v = decode_query_response("q", 200, ok).unwrap();
        assert_eq!(v.len(), 2);
        assert!(v[0].value.is_nan());
        assert_eq!(v[0].timestamp, 1700000000.5);
        assert_eq!(v[1].value, 2.0);

        let err = r#"{"status":"error","errorType":"bad_data","error":"1:10: parse error: unexpected identifier"}"#;
        let e = decode_query_response("sum(", 400, err).unwrap_err();
        assert_eq!(e.to_string(), "Prometheus rejected the query \"sum(\": bad_data: 1:10: parse error: unexpected identifier (HTTP 400)");
        let e = decode_query_response("q", 502, "<html>Bad Gateway</html>").unwrap_err();
        assert!(matches!(e, PrometheusError::Http { http_status: 502, .. }), "{e}");
        let e = decode_query_response("q", 200, "{\"status\":\"success\"").unwrap_err();
        assert!(e.to_string().contains("not Prometheus API JSON"), "{e}");
        let m = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(decode_query_response("q", 200, m).unwrap_err().to_string().contains("resultType \"matrix\""));
        let bad = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"x"]}]}}"#;
        assert!(decode_query_response("q", 200, bad).unwrap_err().to_string().contains("\"x\" is not a number"));
    }

    #[test]
    fn source_urls() {
        let s = PrometheusSource::new("http://prom:9090", Duration::from_secs(600), Duration::from_secs(5)).unwrap();
        assert_eq!(s.query_url(), "http://prom:9090/api/v1/query");
        let s = PrometheusSource::new("https://x/prometheus", Duration::from_secs(600), Duration::from_secs(5)).unwrap();
        assert_eq!(s.query_url(), "https://x/prometheus/api/v1/query");
        assert!(matches!(PrometheusSource::new("prom:9090", Duration::from_secs(1), Duration::from_secs(1)), Err(PrometheusError::Url { .. })));
    }

    // --- native histograms

    /// The answers of a real Prometheus 3.16 (tests/data/prometheus/capture.py).
    fn captured() -> serde_json::Value {
        serde_json::from_str(include_str!("../../tests/data/prometheus/native-histogram-answers.json")).unwrap()
    }

    /// The captured answer to `query`, decoded as the source decodes it.
    fn answer(query: &str) -> Vec<VectorSample> {
        let c = captured();
        let a = c["answers"].as_array().unwrap().iter().find(|a| a["query"] == query).unwrap_or_else(|| panic!("no capture of {query}"));
        decode_query_response(query, 200, &a["answer"].to_string()).unwrap()
    }

    fn native_of(v: &[VectorSample]) -> NativeHistogram {
        assert_eq!(v.len(), 1, "{v:?}");
        v[0].histogram.as_ref().expect("a histogram sample").to_native().unwrap()
    }

    const KP: &str = "kubeproxy_sync_proxy_rules_duration_seconds";

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
    fn go_float_strings_read_back_exactly() {
        // strconv.FormatFloat(f, 'e', -1, 64) of 2^-128, kube-proxy's zero threshold
        assert_eq!(parse_sample_value("2.938735877055719e-39"), Some(2f64.powi(-128)));
        // a sum as the capture has it: the shortest string of a float that is not 0.011692241
        assert_eq!(parse_sample_value("0.011692240999999999").unwrap().to_bits(), 0.011692240999999999f64.to_bits());
        assert_ne!(parse_sample_value("0.011692240999999999"), parse_sample_value("0.011692241"));
    }

    #[test]
    fn real_answer_decodes_to_the_captures_native_buckets() {
        // per series: the capture's IPv4 and IPv6 histograms
        let body = include_bytes!("../../tests/data/metrics/kube-proxy-v1.37.2-idle-node-a.pb");
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

    #[test]
    fn malformed_histogram_answers_name_the_query() {
        let body = |element: &str| format!(r#"{{"status":"success","data":{{"resultType":"vector","result":[{element}]}}}}"#);
        let err = |element: &str| decode_query_response("sum(h)", 200, &body(element)).unwrap_err().to_string();
        let e = err(r#"{"metric":{},"histogram":[1,{"count":"x","sum":"1"}]}"#);
        assert!(e.starts_with("Prometheus query \"sum(h)\": unexpected answer:") && e.contains("histogram count \"x\" is not a number"), "{e}");
        let e = err(r#"{"metric":{},"histogram":[1,{"count":"1","sum":"1","buckets":[[7,"1","2","1"]]}]}"#);
        assert!(e.contains("boundary rule 7 is not 0..=3"), "{e}");
        let e = err(r#"{"metric":{},"histogram":[1,{"count":"1","sum":"1","buckets":[[0,"1","2","z"]]}]}"#);
        assert!(e.contains("bucket 0 count \"z\""), "{e}");
        let e = err(r#"{"metric":{},"histogram":[1,{"count":"1","sum":"1","buckets":[[0,"1","2"]]}]}"#);
        assert!(e.contains("vector result"), "{e}");
        let e = err(r#"{"metric":{},"histogram":[1,{"sum":"1"}]}"#);
        assert!(e.contains("vector result") && e.contains("count"), "{e}");
        assert!(err(r#"{"metric":{},"value":[1,"1"],"histogram":[1,{"count":"0","sum":"0"}]}"#).contains("both a value and a histogram"));
        assert!(err(r#"{"metric":{}}"#).contains("neither a value nor a histogram"));
        // boundary rules by code
        assert_eq!(BoundaryRule::from_code(0), Some(BoundaryRule::OpenLower));
        assert_eq!(BoundaryRule::from_code(1), Some(BoundaryRule::OpenUpper));
        assert_eq!(BoundaryRule::from_code(2), Some(BoundaryRule::Open));
        assert_eq!(BoundaryRule::from_code(3), Some(BoundaryRule::Closed));
        assert_eq!(BoundaryRule::from_code(4), None);
    }

    #[test]
    fn native_queries() {
        let q = Queries::new(600.0);
        assert_eq!(q.sync_native, "sum by (node, instance) (increase(kubeproxy_sync_proxy_rules_duration_seconds[600s]))");
        assert_eq!(q.network_programming_native, "sum by (node, instance) (increase(kubeproxy_network_programming_duration_seconds[600s]))");
    }

    #[test]
    fn snapshot_with_both_kinds() {
        let classic = answer(&format!("sum by (node, instance, le) ({KP}_bucket)"));
        let native = answer(&format!("sum by (node, instance) ({KP})"));
        let gauges = vec![s(&[("node", "node-a")], 100.0)];
        let v = Vectors { sync_buckets: classic.clone(), sync_native: native.clone(), last_sync: gauges.clone(), ..Vectors::default() };
        let snap = build_snapshot(&v, 1.0);
        assert!(snap.failures.is_empty(), "{:?}", snap.failures);
        assert_eq!(snap.inputs.len(), 1);
        let n = &snap.inputs[0].later;
        assert_eq!(snap.inputs[0].node, "node-a");
        assert_eq!((n.sync.as_ref().unwrap().count(), n.sync_native.as_ref().unwrap().count()), (3.0, 3.0));
        assert_eq!(n.sync_native.as_ref().unwrap().positive(), &[(-37, 1.0), (-21, 2.0)]);
        assert!(n.network_programming_native.is_none());
        assert_eq!(n.last_sync_timestamp_seconds, Some(100.0));

        // no native series on the server: the classic snapshot exactly as without the queries
        let without = build_snapshot(&Vectors { sync_buckets: classic.clone(), last_sync: gauges, ..Vectors::default() }, 1.0);
        assert!(without.inputs[0].later.sync_native.is_none());
        assert_eq!(without.inputs[0].later.sync, n.sync);

        // native only (classic buckets not kept by the server)
        let only = build_snapshot(&Vectors { sync_native: native.clone(), ..Vectors::default() }, 1.0);
        assert!(only.inputs[0].later.sync.is_none() && only.inputs[0].later.sync_native.is_some());

        // two instances relabelled to one node: added
        let mut twice = native.clone();
        twice.push(VectorSample { labels: labels(&[("node", "node-a"), ("instance", "10.0.0.9:10249")]), ..native[0].clone() });
        let added = build_snapshot(&Vectors { sync_native: twice, ..Vectors::default() }, 1.0);
        assert_eq!(added.inputs[0].later.sync_native.as_ref().unwrap().positive(), &[(-37, 2.0), (-21, 4.0)]);

        // a native histogram that does not convert: a failure alone, dropped beside the classic
        let custom = decode_query_response(
            "q",
            200,
            r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"node":"node-a"},"histogram":[1,{"count":"1","sum":"1","buckets":[[0,"0.005","0.01","1"]]}]}]}}"#,
        )
        .unwrap();
        let failed = build_snapshot(&Vectors { sync_native: custom.clone(), ..Vectors::default() }, 1.0);
        assert!(failed.inputs.is_empty());
        let f = &failed.failures["node-a"];
        assert_eq!(f.reason, "parse");
        assert!(f.message.starts_with(&format!("Prometheus native histogram of {KP}: ")) && f.message.contains("custom buckets"), "{}", f.message);
        let beside = build_snapshot(&Vectors { sync_buckets: classic, sync_native: custom, ..Vectors::default() }, 1.0);
        assert!(beside.failures.is_empty());
        assert!(beside.inputs[0].later.sync.is_some() && beside.inputs[0].later.sync_native.is_none());

        // float samples in a native answer are ignored
        let floats = build_snapshot(&Vectors { sync_native: vec![s(&[("node", "node-a")], 1.0)], ..Vectors::default() }, 1.0);
        assert!(floats.inputs.is_empty() && floats.failures.is_empty());
    }
}
