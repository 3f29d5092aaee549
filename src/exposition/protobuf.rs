//! A reader for the Prometheus protobuf exposition as kube-proxy serves it on `:10249/metrics`
//! when asked with `Accept: application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited`:
//! the only exposition that carries kube-proxy's native histograms (1.37+). It builds the same
//! [`KubeProxyScrape`] as the text reader ([`super::parse`]), plus the native histograms. Pure,
//! no I/O.
//!
//! # Shape
//!
//! The body is a sequence of `io.prometheus.client.MetricFamily` messages, each preceded by its
//! length as a base-128 varint (`encoding=delimited`). The messages, with the field numbers of
//! `io/prometheus/client/metrics.proto` in prometheus/client_model (proto2: every scalar field
//! has presence), are written out by hand in [`wire`] for `prost` (no code generation):
//! `MetricFamily` (name 1, help 2, type 3, metric 4, unit 5), `Metric` (label 1, gauge 2,
//! counter 3, summary 4, untyped 5, timestamp_ms 6, histogram 7), and the value messages.
//! Fields not written out there (exemplars, created timestamps) are skipped by the decoder as
//! unknown fields, their framing still checked.
//!
//! A histogram carries its classic buckets as `bucket` (`upper_bound`, cumulative
//! `cumulative_count`, or `cumulative_count_float` when that is above 0); the `+Inf` bucket may
//! be left out, its count is then `sample_count` (or `sample_count_float` when above 0). The
//! native part: `schema`, `zero_threshold`, `zero_count` (`zero_count_float`), and per side
//! spans with either integer `*_delta`s (each bucket's count minus the previous bucket's, the
//! first against 0, across all spans) or absolute float `*_count`s. Units are the family's
//! (seconds, microseconds for the legacy sync family, converted like the text reader does for
//! the classic buckets).
//!
//! # What is read, and how (the text reader's rules, R12)
//!
//! * Families are matched by exact name ([`super::read_families`]); every other family is
//!   decoded (its framing, field types and UTF-8 strings checked, as the text reader checks the
//!   syntax of every line) and not interpreted.
//! * A histogram family: each `Metric` is one series (its labels); the series' classic buckets
//!   are summed per bound across series (`sum()` over `ip_family`), `sample_sum` likewise. A
//!   metric without a `histogram` is an error.
//! * Native or classic, as Prometheus decides (`isNativeHistogram` in
//!   `model/textparse/protobufparse.go`): a histogram is native when it has a positive or a
//!   negative span, a zero threshold above 0 or a zero count above 0 (client_golang adds a
//!   no-op span to a native histogram without observations and zero threshold 0). The `schema`
//!   field is not part of the test: absent, it reads 0, as Go's getter gives. A float histogram
//!   (`isFloatHistogram`): `sample_count_float` or `zero_count_float` above 0, or any absolute
//!   `*_count`; its counts are then those floats. A native histogram without classic buckets
//!   has no classic series (as in Prometheus); one with both has both.
//! * The native histograms of a family are summed with [`NativeHistogram::add`] (Prometheus
//!   `sum()`); the family gets one only when every series of it is native (else the sum would
//!   miss observations). Only [`KubeProxyScrape::sync_native`] (from
//!   `kubeproxy_sync_proxy_rules_duration_seconds`) and
//!   [`KubeProxyScrape::network_programming_native`] are kept; the other families' native parts
//!   are checked and dropped.
//! * Gauges and counters: the value of the field the family's `type` names (`counter`, `gauge`,
//!   `untyped`), folded as the text reader does (oldest last sync, newest last queued, sums over
//!   series); `kubernetes_build_info`'s `git_version` (or `gitVersion`) label.
//!
//! # What is an error
//!
//! Every error is a [`ProtobufError`] naming the 1-based ordinal of the message, the byte offset
//! of its length prefix in the body and, when known, the family.
//!
//! * **Framing** (any family; the whole body is framed before any message is decoded, so a cut
//!   is reported even after a garbled message): a body that ends inside a length prefix, a prefix of more than
//!   10 bytes or beyond 64 bits, a declared length larger than the rest of the body (checked
//!   before anything is allocated: a cut-off scrape shows here), a message that is not a valid
//!   `MetricFamily` (prost's message names the field), a family without a name.
//! * **Our histograms**, per series: a metric without a histogram, a series twice, a bucket
//!   without `upper_bound`, a bound that is NaN, `-Inf` or negative, a bound twice, a count that
//!   is not a finite number >= 0 (a `cumulative_count_float`, `sample_count_float` or
//!   `zero_count_float` that is NaN, infinite or negative, even where it would not be used), cumulative counts that decrease as the bound grows (the
//!   implicit `+Inf` bucket included). Native: a schema outside -4..=8 (custom buckets, schema
//!   -53, included), spans that cover a different number of buckets than there are deltas or
//!   counts, a later span with a negative offset, integer deltas whose running sum goes below 0
//!   or overflows 64 bits, and every check of [`NativeHistogram::new`].
//! * **Our gauges and counters**: a metric without the value its family's type names (a
//!   histogram or summary where a gauge or counter is read).
//!
//! Never panics on any input; nothing is allocated beyond what the body's own bytes declare.

use super::histogram::{Bucket, Histogram, HistogramError};
use super::native::{NativeHistogram, NativeParts, Span};
use super::parse::{HistogramFamily, KubeProxyScrape, ReadFamily, Scalar, apply_scalar, read_families, read_family};
use prost::Message;

/// The messages of `io/prometheus/client/metrics.proto` (prometheus/client_model) this reader
/// needs, field numbers and types as defined there. Public for tests that build bodies.
pub mod wire {
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
}

/// A protobuf body that cannot be trusted: where (the message's 1-based ordinal and the byte
/// offset of its length prefix), the family when known, and what was wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}", self.what())]
pub struct ProtobufError {
    /// 1-based ordinal of the message in the body.
    pub message_index: usize,
    /// Byte offset of the message's length prefix in the body.
    pub offset: usize,
    /// The family concerned; empty when unknown.
    pub family: String,
    /// What was wrong.
    pub message: String,
}

impl ProtobufError {
    /// `message N at byte B: family: message` (the family left out when unknown).
    fn what(&self) -> String {
        let place = format!("protobuf message {} at byte {}", self.message_index, self.offset);
        if self.family.is_empty() { format!("{place}: {}", self.message) } else { format!("{place}: {}: {}", self.family, self.message) }
    }

    /// The error as `SOURCE: protobuf message N at byte B: family: message`, the form the
    /// command line prints for a file or URL (the text reader's [`super::ParseError::at`]).
    pub fn at(&self, source: &str) -> String {
        format!("{source}: {}", self.what())
    }
}

/// One length-delimited message of a body, as framed: where it is and its bytes.
#[derive(Debug, Clone, Copy)]
pub struct Framed<'a> {
    /// 1-based ordinal.
    pub index: usize,
    /// Byte offset of its length prefix.
    pub offset: usize,
    /// The length prefix and the message, as they are in the body.
    pub raw: &'a [u8],
    /// The message alone.
    pub message: &'a [u8],
}

/// The length-delimited messages of a body in order; stops after the first framing error.
pub struct Messages<'a> {
    body: &'a [u8],
    pos: usize,
    index: usize,
}

/// The messages of `body` (see [`Messages`]).
pub fn messages(body: &[u8]) -> Messages<'_> {
    Messages { body, pos: 0, index: 0 }
}

/// A base-128 varint at the start of `bytes`: its value and length; `Err` says why not (cut
/// short, longer than 10 bytes, beyond 64 bits).
fn varint(bytes: &[u8]) -> Result<(u64, usize), &'static str> {
    let mut value: u64 = 0;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        let bits = u64::from(b & 0x7f);
        if i == 9 && b > 1 {
            return Err("the length prefix is longer than 10 bytes or beyond 64 bits");
        }
        value |= bits << (7 * i);
        if b < 0x80 {
            return Ok((value, i + 1));
        }
    }
    Err("the body ends inside a length prefix: the scrape was cut off")
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Framed<'a>, ProtobufError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.body.len() {
            return None;
        }
        self.index += 1;
        let body = self.body;
        let (offset, rest) = (self.pos, &body[self.pos..]);
        let fail = |message: String| ProtobufError { message_index: self.index, offset, family: String::new(), message };
        let framed = match varint(rest) {
            Err(why) => Err(fail(why.to_string())),
            Ok((len, prefix)) => {
                let remaining = rest.len() - prefix;
                match usize::try_from(len) {
                    Ok(len) if len <= remaining => Ok(Framed { index: self.index, offset, raw: &rest[..prefix + len], message: &rest[prefix..prefix + len] }),
                    _ => Err(fail(format!("the message declares {len} bytes but only {remaining} remain: the scrape was cut off"))),
                }
            }
        };
        // after an error nothing more is framed
        self.pos = match &framed {
            Ok(f) => offset + f.raw.len(),
            Err(_) => self.body.len(),
        };
        Some(framed)
    }
}

/// The family name of a framed message (field 1), read without decoding the rest: the fields
/// before it are skipped by their wire type, and the scan stops at the name (client_golang
/// writes it first). `None` when the message has no name, or garbage before it.
pub fn family_name(message: &[u8]) -> Option<String> {
    let mut rest = message;
    while !rest.is_empty() {
        let (key, n) = varint(rest).ok()?;
        rest = &rest[n..];
        let skip = match key & 7 {
            0 => varint(rest).ok()?.1,
            1 => 8,
            5 => 4,
            2 => {
                let (len, n) = varint(rest).ok()?;
                let end = n.checked_add(usize::try_from(len).ok()?)?;
                if key >> 3 == 1 {
                    return std::str::from_utf8(rest.get(n..end)?).ok().map(str::to_string);
                }
                end
            }
            _ => return None, // groups (wire types 3 and 4) are not in metrics.proto
        };
        rest = rest.get(skip..)?;
    }
    None
}

/// A decoded body, before the native histograms of each family are summed: the scrape (its
/// native fields `None`) and each family's native series. [`Decoded::into_scrape`] sums them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decoded {
    /// Everything but the native histograms.
    pub scrape: KubeProxyScrape,
    /// Per [`HistogramFamily`] (index in declaration order): its native series, labels
    /// (`name="value"`, sorted by name, comma-joined) and histogram, in body order; empty
    /// unless every series of the family is native.
    native: [Vec<(String, NativeHistogram)>; 5],
}

impl Decoded {
    /// The native series of `family` (see [`Decoded`]), each checked by [`NativeHistogram::new`].
    pub fn native_series(&self, family: HistogramFamily) -> &[(String, NativeHistogram)] {
        &self.native[family.index()]
    }

    /// The scrape with [`KubeProxyScrape::sync_native`] and
    /// [`KubeProxyScrape::network_programming_native`] set to the sum of their series
    /// ([`NativeHistogram::add`], Prometheus `sum()`), when the family has native series (the
    /// legacy microsecond sync family has none to give).
    pub fn into_scrape(self) -> KubeProxyScrape {
        let Decoded { mut scrape, native } = self;
        let sum = |series: &[(String, NativeHistogram)]| {
            let (first, rest) = series.split_first()?;
            Some(rest.iter().fold(first.1.clone(), |acc, (_, h)| acc.add(h)))
        };
        if !scrape.sync_from_legacy_microseconds {
            scrape.sync_native = sum(&native[HistogramFamily::Sync.index()]);
        }
        scrape.network_programming_native = sum(&native[HistogramFamily::NetworkProgramming.index()]);
        scrape
    }
}

/// Parses a kube-proxy protobuf body (length-delimited `MetricFamily` messages) into the
/// families this project reads, native histograms summed over series.
///
/// Errors: a [`ProtobufError`] for every case in the module docs ("What is an error"). Never
/// panics.
pub fn parse_kube_proxy_protobuf(body: &[u8]) -> Result<KubeProxyScrape, ProtobufError> {
    decode_kube_proxy_protobuf(body).map(Decoded::into_scrape)
}

/// [`parse_kube_proxy_protobuf`] without the last step: the per-series native histograms are
/// kept apart ([`Decoded::native_series`]) and not summed. Same checks, same errors.
pub fn decode_kube_proxy_protobuf(body: &[u8]) -> Result<Decoded, ProtobufError> {
    // the framing of the whole body first: a cut-off body is reported as such, and costs one
    // pass over the length prefixes rather than a decode of every message before the cut
    if let Some(Err(e)) = messages(body).find(Result::is_err) {
        return Err(e);
    }
    let mut acc: [Option<HistAcc>; 5] = Default::default();
    let mut out = KubeProxyScrape::default();
    for framed in messages(body) {
        let framed = framed?;
        let at = |family: &str, message: String| ProtobufError { message_index: framed.index, offset: framed.offset, family: family.to_string(), message };
        let family = wire::MetricFamily::decode(framed.message).map_err(|e| {
            let name = family_name(framed.message).unwrap_or_default();
            at(&name, format!("not a valid MetricFamily message: {e}"))
        })?;
        let Some(name) = family.name.as_deref().filter(|n| !n.is_empty()) else {
            return Err(at("", "a metric family without a name".into()));
        };
        match read_family(name) {
            None => {} // decoded (checked), not interpreted
            Some(ReadFamily::Scalar(s)) => read_scalars(&mut out, s, &family).map_err(|m| at(name, m))?,
            Some(ReadFamily::Histogram(h)) => {
                let a = acc[h.index()].get_or_insert_with(HistAcc::default);
                a.add(h, &family.metric).map_err(|m| at(name, m))?;
                a.last = (framed.index, framed.offset);
            }
        }
    }
    let mut decoded = Decoded { scrape: out, native: Default::default() };
    for fam in HistogramFamily::ALL {
        let Some(a) = acc[fam.index()].take() else { continue };
        let (index, offset) = a.last;
        let classic = match Histogram::new(a.buckets, a.sum) {
            Ok(h) => Some(h),
            Err(HistogramError::Empty) => None, // native-only series: no classic histogram
            Err(e) => return Err(ProtobufError { message_index: index, offset, family: fam.name().to_string(), message: e.to_string() }),
        };
        if a.series_count > 0 && a.native.len() == a.series_count {
            decoded.native[fam.index()] = a.native;
        }
        let Some(classic) = classic else { continue };
        let s = &mut decoded.scrape;
        match fam {
            HistogramFamily::Sync => s.sync = Some(classic),
            HistogramFamily::SyncFull => s.sync_full = Some(classic),
            HistogramFamily::SyncPartial => s.sync_partial = Some(classic),
            HistogramFamily::NetworkProgramming => s.network_programming = Some(classic),
            HistogramFamily::SyncLegacyMicroseconds => {
                if s.sync.is_none() {
                    s.sync = Some(classic);
                    s.sync_from_legacy_microseconds = true;
                }
            }
        }
    }
    if decoded.scrape.sync_from_legacy_microseconds {
        decoded.native[HistogramFamily::Sync.index()].clear();
    }
    Ok(decoded)
}

/// Folds the series of one of our gauge or counter families into `out`.
fn read_scalars(out: &mut KubeProxyScrape, s: Scalar, family: &wire::MetricFamily) -> Result<(), String> {
    let ty = match family.r#type {
        None => wire::MetricType::Counter, // proto2: an absent enum reads as its first value
        Some(v) => wire::MetricType::try_from(v).map_err(|_| format!("unknown metric type {v}"))?,
    };
    if !matches!(ty, wire::MetricType::Counter | wire::MetricType::Gauge | wire::MetricType::Untyped) {
        return Err(format!("the family is a {} where a counter or gauge is read", type_name(ty)));
    }
    for (n, m) in family.metric.iter().enumerate() {
        let field = match ty {
            wire::MetricType::Counter => m.counter.as_ref(),
            wire::MetricType::Gauge => m.gauge.as_ref(),
            _ => m.untyped.as_ref(),
        };
        let Some(v) = field.and_then(|v| v.value) else {
            return Err(format!("series {} of a {} family has no {} value", series_name(n, &m.label), type_name(ty), type_name(ty)));
        };
        let git_version = m.label.iter().find(|l| matches!(l.name.as_deref(), Some("git_version" | "gitVersion"))).and_then(|l| l.value.as_deref());
        apply_scalar(out, s, v, git_version);
    }
    Ok(())
}

fn type_name(t: wire::MetricType) -> &'static str {
    match t {
        wire::MetricType::Counter => "counter",
        wire::MetricType::Gauge => "gauge",
        wire::MetricType::Summary => "summary",
        wire::MetricType::Untyped => "untyped",
        wire::MetricType::Histogram => "histogram",
        wire::MetricType::GaugeHistogram => "gauge histogram",
    }
}

/// A series' labels as the text reader keys them: `name="value"`, sorted by name, comma-joined.
fn series_key(labels: &[wire::LabelPair]) -> String {
    let mut pairs: Vec<(&str, &str)> = labels.iter().map(|l| (l.name.as_deref().unwrap_or(""), l.value.as_deref().unwrap_or(""))).collect();
    pairs.sort_unstable();
    pairs.iter().map(|(n, v)| format!("{n}={v:?}")).collect::<Vec<_>>().join(",")
}

/// How a message names series `n` (0-based): by its labels, or by its position when it has none.
fn series_name(n: usize, labels: &[wire::LabelPair]) -> String {
    if labels.is_empty() { format!("{}", n + 1) } else { format!("{{{}}}", series_key(labels)) }
}

/// One of our histogram families, across the messages and series that carry it.
#[derive(Default)]
struct HistAcc {
    /// Every series' classic buckets, in seconds, for [`Histogram::new`] to sum per bound.
    buckets: Vec<Bucket>,
    /// Sum of `sample_sum` over series, seconds; `None` when no series had one.
    sum: Option<f64>,
    /// The native series (labels, histogram).
    native: Vec<(String, NativeHistogram)>,
    /// Series seen, and their keys (a series twice is an error).
    series_count: usize,
    keys: std::collections::HashSet<String>,
    /// Ordinal and offset of the last message of the family, for errors of the whole family.
    last: (usize, usize),
}

impl HistAcc {
    /// Checks and takes the series of one message of family `fam`.
    fn add(&mut self, fam: HistogramFamily, metrics: &[wire::Metric]) -> Result<(), String> {
        for (n, m) in metrics.iter().enumerate() {
            let key = series_key(&m.label);
            let which = if m.label.is_empty() { String::new() } else { format!(" (series {{{key}}})") };
            let Some(h) = m.histogram.as_ref() else {
                return Err(format!("series {} has no histogram", series_name(n, &m.label)));
            };
            if !self.keys.insert(key.clone()) {
                return Err(format!("series {} appears twice", series_name(n, &m.label)));
            }
            self.series_count += 1;
            // a float count that is NaN, infinite or negative is refused wherever it sits, also
            // where it would not be used (an integer histogram's `sample_count_float` of NaN is
            // not "above 0", so it would otherwise be skipped without a word)
            for (what, f) in [("sample_count_float", h.sample_count_float), ("zero_count_float", h.zero_count_float)] {
                count_of(what, None, f).map_err(|e| format!("{e}{which}"))?;
            }
            let native = native_parts(h).map_err(|e| format!("native histogram{which}: {e}"))?;
            if native.is_none() || !h.bucket.is_empty() {
                let buckets = classic_buckets(h).map_err(|e| format!("{e}{which}"))?;
                self.buckets.extend(buckets.into_iter().map(|(le, count)| Bucket { upper_bound_seconds: le * fam.to_seconds(), count }));
            }
            if let Some(parts) = native {
                let hist = NativeHistogram::new(parts).map_err(|e| format!("native histogram{which}: {e}"))?;
                self.native.push((key, hist));
            }
            if let Some(sum) = h.sample_sum {
                self.sum = Some(self.sum.unwrap_or(0.0) + sum * fam.to_seconds());
            }
        }
        Ok(())
    }
}

/// A float field that overrides an integer one when above 0 (`sample_count_float`,
/// `cumulative_count_float`, `zero_count_float`): the count to use. A float that is present
/// and NaN, infinite or negative is an error (`what` names it); 0 or absent gives the integer.
fn count_of(what: &str, int: Option<u64>, float: Option<f64>) -> Result<f64, String> {
    match float {
        Some(f) if !(f.is_finite() && f >= 0.0) => Err(format!("{what} is {f}: a count is a finite number >= 0")),
        Some(f) if f > 0.0 => Ok(f),
        _ => Ok(int.unwrap_or(0) as f64),
    }
}

/// The classic buckets of one series as (bound, cumulative count), sorted by bound, the `+Inf`
/// bucket added from the sample count when absent; checked as the module docs say.
fn classic_buckets(h: &wire::Histogram) -> Result<Vec<(f64, f64)>, String> {
    let mut out = Vec::with_capacity(h.bucket.len() + 1);
    for (i, b) in h.bucket.iter().enumerate() {
        let le = b.upper_bound.ok_or_else(|| format!("bucket {} has no upper_bound", i + 1))?;
        if le.is_nan() {
            return Err(format!("bucket {} has the upper bound NaN", i + 1));
        } else if le == f64::NEG_INFINITY {
            return Err(format!("bucket {} has the upper bound -Inf: no bucket can be below every value", i + 1));
        } else if le < 0.0 {
            return Err(format!("bucket {} has the negative upper bound {le}: a duration histogram has no bucket below 0", i + 1));
        }
        let count = count_of(&format!("bucket le=\"{}\" cumulative_count_float", fmt_le(le)), b.cumulative_count, b.cumulative_count_float)?;
        out.push((le, count));
    }
    if !out.iter().any(|(le, _)| *le == f64::INFINITY) {
        out.push((f64::INFINITY, count_of("sample_count_float", h.sample_count, h.sample_count_float)?));
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    for w in out.windows(2) {
        let ((lo, lo_count), (hi, hi_count)) = (w[0], w[1]);
        if lo == hi {
            return Err(format!("bucket le=\"{}\" appears twice", fmt_le(hi)));
        }
        if hi_count < lo_count {
            let implicit = if hi == f64::INFINITY && !h.bucket.iter().any(|b| b.upper_bound == Some(f64::INFINITY)) { " (the sample count)" } else { "" };
            return Err(format!(
                "bucket le=\"{}\" counts {hi_count}{implicit} but le=\"{}\" counts {lo_count}: bucket counts are cumulative and never decrease as le grows",
                fmt_le(hi),
                fmt_le(lo)
            ));
        }
    }
    Ok(out)
}

fn fmt_le(v: f64) -> String {
    if v == f64::INFINITY { "+Inf".into() } else { v.to_string() }
}

/// Prometheus' `isNativeHistogram` (see the module docs).
fn is_native(h: &wire::Histogram) -> bool {
    !h.positive_span.is_empty() || !h.negative_span.is_empty() || h.zero_threshold.unwrap_or(0.0) > 0.0 || h.zero_count.unwrap_or(0) > 0
}

/// Prometheus' `isFloatHistogram`.
fn is_float(h: &wire::Histogram) -> bool {
    h.sample_count_float.unwrap_or(0.0) > 0.0 || h.zero_count_float.unwrap_or(0.0) > 0.0 || !h.positive_count.is_empty() || !h.negative_count.is_empty()
}

/// The native parts of `h` with absolute counts, or `None` when `h` is not native.
/// Errors: a delta sum that goes below 0 or overflows, a float count field that is not a count.
pub fn native_parts(h: &wire::Histogram) -> Result<Option<NativeParts>, String> {
    if !is_native(h) {
        return Ok(None);
    }
    let spans = |s: &[wire::BucketSpan]| s.iter().map(|s| Span { offset: s.offset.unwrap_or(0), length: s.length.unwrap_or(0) }).collect::<Vec<_>>();
    let float = is_float(h);
    let (positive_counts, negative_counts) = if float {
        (h.positive_count.clone(), h.negative_count.clone())
    } else {
        (absolute("positive", &h.positive_delta)?, absolute("negative", &h.negative_delta)?)
    };
    let (count, zero_count) = if float {
        (count_of("sample_count_float", None, h.sample_count_float)?, count_of("zero_count_float", None, h.zero_count_float)?)
    } else {
        (h.sample_count.unwrap_or(0) as f64, h.zero_count.unwrap_or(0) as f64)
    };
    Ok(Some(NativeParts {
        schema: h.schema.unwrap_or(0),
        zero_threshold: h.zero_threshold.unwrap_or(0.0),
        zero_count,
        count,
        sum: h.sample_sum.unwrap_or(0.0),
        positive_spans: spans(&h.positive_span),
        positive_counts,
        negative_spans: spans(&h.negative_span),
        negative_counts,
    }))
}

/// Integer deltas (each bucket's count minus the previous one's, the first against 0) as
/// absolute counts, with checked arithmetic: a running sum below 0 or beyond `i64` is an error.
fn absolute(side: &str, deltas: &[i64]) -> Result<Vec<f64>, String> {
    let mut count: i64 = 0;
    let mut out = Vec::with_capacity(deltas.len());
    for (i, &d) in deltas.iter().enumerate() {
        count = count.checked_add(d).ok_or_else(|| format!("{side} delta {} overflows the running count", i + 1))?;
        if count < 0 {
            return Err(format!("{side} delta {} brings the bucket count to {count}: the deltas must sum to counts >= 0", i + 1));
        }
        out.push(count as f64);
    }
    Ok(out)
}

/// The messages of `body` (a protobuf kube-proxy body) whose family the parser reads
/// ([`read_families`]), each copied unchanged with its length prefix, in order: the node
/// agent's filter for the protobuf exposition. Only the name field of each message is read.
/// Only a body that parses should be filtered: framing stops at the first error and the rest
/// is dropped (the agent parses first and answers 502 with the parser's error).
pub fn filter_kube_proxy_protobuf(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len().min(64 * 1024));
    for framed in messages(body) {
        let Ok(framed) = framed else { break };
        if family_name(framed.message).is_some_and(|n| read_families().any(|f| f == n)) {
            out.extend_from_slice(framed.raw);
        }
    }
    out
}
