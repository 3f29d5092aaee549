//! The messages of `io/prometheus/client/metrics.proto` (prometheus/client_model) this reader
//! needs, field numbers and types as defined there. Public for tests that build bodies.

/// `io.prometheus.client.MetricFamily`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MetricFamily {
    /// The family name.
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// The `# HELP` text.
    #[prost(string, optional, tag = "2")]
    pub help: Option<String>,
    /// A [`MetricType`].
    #[prost(enumeration = "MetricType", optional, tag = "3")]
    pub r#type: Option<i32>,
    /// The series.
    #[prost(message, repeated, tag = "4")]
    pub metric: Vec<Metric>,
    /// The unit (OpenMetrics).
    #[prost(string, optional, tag = "5")]
    pub unit: Option<String>,
}

/// `io.prometheus.client.MetricType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum MetricType {
    /// `COUNTER`.
    Counter = 0,
    /// `GAUGE`.
    Gauge = 1,
    /// `SUMMARY`.
    Summary = 2,
    /// `UNTYPED`.
    Untyped = 3,
    /// `HISTOGRAM`.
    Histogram = 4,
    /// `GAUGE_HISTOGRAM`.
    GaugeHistogram = 5,
}

/// `io.prometheus.client.Metric`: one series.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metric {
    /// The labels.
    #[prost(message, repeated, tag = "1")]
    pub label: Vec<LabelPair>,
    /// A gauge's value.
    #[prost(message, optional, tag = "2")]
    pub gauge: Option<Value>,
    /// A counter's value.
    #[prost(message, optional, tag = "3")]
    pub counter: Option<Value>,
    /// A summary.
    #[prost(message, optional, tag = "4")]
    pub summary: Option<Summary>,
    /// An untyped value.
    #[prost(message, optional, tag = "5")]
    pub untyped: Option<Value>,
    /// A histogram.
    #[prost(message, optional, tag = "7")]
    pub histogram: Option<Histogram>,
    /// The sample's timestamp, milliseconds.
    #[prost(int64, optional, tag = "6")]
    pub timestamp_ms: Option<i64>,
}

/// `io.prometheus.client.LabelPair`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LabelPair {
    /// The label name.
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// The label value.
    #[prost(string, optional, tag = "2")]
    pub value: Option<String>,
}

/// `io.prometheus.client.Gauge`, `Counter` and `Untyped`: each has its value as field 1
/// (a counter's exemplar and created timestamp, fields 2 and 3, are skipped).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    /// The value.
    #[prost(double, optional, tag = "1")]
    pub value: Option<f64>,
}

/// `io.prometheus.client.Summary` (decoded to check it, never read).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    /// Observations.
    #[prost(uint64, optional, tag = "1")]
    pub sample_count: Option<u64>,
    /// Their sum.
    #[prost(double, optional, tag = "2")]
    pub sample_sum: Option<f64>,
    /// The quantiles.
    #[prost(message, repeated, tag = "3")]
    pub quantile: Vec<Quantile>,
}

/// `io.prometheus.client.Quantile`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Quantile {
    /// The quantile (0..1).
    #[prost(double, optional, tag = "1")]
    pub quantile: Option<f64>,
    /// Its value.
    #[prost(double, optional, tag = "2")]
    pub value: Option<f64>,
}

/// `io.prometheus.client.Histogram`, classic and native parts (exemplars and the created
/// timestamp, fields 15 and 16, are skipped). Repeated numbers are written unpacked, as
/// proto2 does by default; the decoder reads either form.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Histogram {
    /// Observations (integer histograms).
    #[prost(uint64, optional, tag = "1")]
    pub sample_count: Option<u64>,
    /// Observations (float histograms): overrides `sample_count` when above 0.
    #[prost(double, optional, tag = "4")]
    pub sample_count_float: Option<f64>,
    /// Sum of observations.
    #[prost(double, optional, tag = "2")]
    pub sample_sum: Option<f64>,
    /// Classic buckets, in increasing `upper_bound`; the `+Inf` one optional.
    #[prost(message, repeated, tag = "3")]
    pub bucket: Vec<Bucket>,
    /// Native schema, -4..=8.
    #[prost(sint32, optional, tag = "5")]
    pub schema: Option<i32>,
    /// Breadth of the zero bucket.
    #[prost(double, optional, tag = "6")]
    pub zero_threshold: Option<f64>,
    /// Observations in the zero bucket.
    #[prost(uint64, optional, tag = "7")]
    pub zero_count: Option<u64>,
    /// The same, float histograms: overrides `zero_count` when above 0.
    #[prost(double, optional, tag = "8")]
    pub zero_count_float: Option<f64>,
    /// Negative spans.
    #[prost(message, repeated, tag = "9")]
    pub negative_span: Vec<BucketSpan>,
    /// Negative buckets as deltas (integer histograms).
    #[prost(sint64, repeated, packed = "false", tag = "10")]
    pub negative_delta: Vec<i64>,
    /// Negative buckets as absolute counts (float histograms).
    #[prost(double, repeated, packed = "false", tag = "11")]
    pub negative_count: Vec<f64>,
    /// Positive spans.
    #[prost(message, repeated, tag = "12")]
    pub positive_span: Vec<BucketSpan>,
    /// Positive buckets as deltas (integer histograms).
    #[prost(sint64, repeated, packed = "false", tag = "13")]
    pub positive_delta: Vec<i64>,
    /// Positive buckets as absolute counts (float histograms).
    #[prost(double, repeated, packed = "false", tag = "14")]
    pub positive_count: Vec<f64>,
}

/// `io.prometheus.client.Bucket`: one classic bucket (its exemplar, field 3, skipped).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Bucket {
    /// Cumulative count.
    #[prost(uint64, optional, tag = "1")]
    pub cumulative_count: Option<u64>,
    /// Cumulative count (float histograms): overrides `cumulative_count` when above 0.
    #[prost(double, optional, tag = "4")]
    pub cumulative_count_float: Option<f64>,
    /// Inclusive upper bound.
    #[prost(double, optional, tag = "2")]
    pub upper_bound: Option<f64>,
}

/// `io.prometheus.client.BucketSpan`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct BucketSpan {
    /// Gap to the previous span, or the first span's starting index.
    #[prost(sint32, optional, tag = "1")]
    pub offset: Option<i32>,
    /// Consecutive buckets.
    #[prost(uint32, optional, tag = "2")]
    pub length: Option<u32>,
}

/// A series' labels as the text reader keys them: `name="value"`, sorted by name, comma-joined.
pub(super) fn series_key(labels: &[LabelPair]) -> String {
    let mut pairs: Vec<(&str, &str)> = labels.iter().map(|l| (l.name.as_deref().unwrap_or(""), l.value.as_deref().unwrap_or(""))).collect();
    pairs.sort_unstable();
    pairs.iter().map(|(n, v)| format!("{n}={v:?}")).collect::<Vec<_>>().join(",")
}

/// How a message names series `n` (0-based): by its labels, or by its position when it has none.
pub(super) fn series_name(n: usize, labels: &[LabelPair]) -> String {
    if labels.is_empty() { format!("{}", n + 1) } else { format!("{{{}}}", series_key(labels)) }
}
