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
//!   checked as prost would decode it (its framing, field types and UTF-8 strings, as the text
//!   reader checks the syntax of every line) and neither built nor interpreted (see "Speed").
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
//!
//! # Speed: the families not read are checked, not built
//!
//! About 94% of a kube-proxy 1.37 body (62.9 of 67.2 KB, 182 of 198 families: Go runtime,
//! `rest_client_*`, feature gates) is families this reader does not interpret. Decoding them
//! with prost builds a `String` per name, help text and label and a `Vec` per series and bucket,
//! only to drop them. Instead, each message's name is read first (`name_field`: the top-level
//! fields walked by their wire types, the series hopped over by their lengths), and a family
//! not read is checked by `check_unread`: a walk of its fields along the field numbers and
//! types of `metrics.proto` with prost's wire-format helpers (`decode_key`, `decode_varint`,
//! `skip_field`, `check_wire_type`), every key, wire type, length, UTF-8 string and nested
//! message end checked, nothing allocated. A garbled family not read is therefore rejected,
//! as before and as the text reader rejects a garbled line of any family, with prost's own
//! error text. [`decode_kube_proxy_protobuf_full`] decodes every family with prost; the tests
//! hold the two to the same answers on the captures and on mutated ones.

use super::histogram::{Bucket, Histogram, HistogramError};
use super::native::{NativeHistogram, NativeParts, Span};
use super::parse::{HistogramFamily, KubeProxyScrape, ReadFamily, Scalar, apply_scalar, check_duration_bound, read_families, read_family};
use prost::Message;
use prost::encoding::{DecodeContext, WireType, check_wire_type, decode_key, decode_varint, skip_field};

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

/// A base-128 varint at the start of `bytes` (prost's `decode_varint`): its value and length;
/// `Err` says why not (cut short; longer than 10 bytes or beyond 64 bits).
fn varint(bytes: &[u8]) -> Result<(u64, usize), &'static str> {
    let mut buf = bytes;
    match decode_varint(&mut buf) {
        Ok(value) => Ok((value, bytes.len() - buf.len())),
        // prost refuses both alike: fewer than 10 bytes, each with the continuation bit, were cut
        Err(_) if bytes.len() < 10 && bytes.iter().all(|b| b & 0x80 != 0) => Err("the body ends inside a length prefix: the scrape was cut off"),
        Err(_) => Err("the length prefix is longer than 10 bytes or beyond 64 bits"),
    }
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

/// The family name of a framed message as its errors name it: the first field 1 of wire type
/// 2, read without decoding the rest (the fields before it skipped by their wire types with
/// prost's `decode_key` and `skip_field`; client_golang writes the name first). `None` when the
/// message has no name, garbage before it, or a name that is not UTF-8.
pub fn family_name(message: &[u8]) -> Option<String> {
    let mut buf = message;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).ok()?;
        if tag == 1 && wire_type == WireType::LengthDelimited {
            return std::str::from_utf8(delimited(&mut buf).ok()?).ok().map(str::to_string);
        }
        skip_field(wire_type, tag, &mut buf, DecodeContext::default()).ok()?;
    }
    None
}

/// The family name of a framed message as prost decodes it: the last field 1 (proto2 merges a
/// repeated optional field; client_golang writes one), found by walking every top-level field
/// by its wire type and hopping over the nested messages by their lengths. `None` when the top
/// level is not well-formed, or has no name of wire type 2 that is UTF-8: what the decoder and
/// the filter go by (without allocating); the full decode then says what is wrong.
fn name_field(message: &[u8]) -> Option<&str> {
    let mut buf = message;
    let mut name = None;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).ok()?;
        if tag == 1 && wire_type == WireType::LengthDelimited {
            name = Some(delimited(&mut buf).ok()?);
        } else {
            skip_field(wire_type, tag, &mut buf, DecodeContext::default()).ok()?;
        }
    }
    std::str::from_utf8(name?).ok()
}

/// What a field of a `metrics.proto` message holds, as far as its wire format goes: what
/// [`check_value`] checks where prost would decode it.
#[derive(Clone, Copy)]
enum Kind {
    /// A varint scalar: `uint64`, `int64`, `uint32`, `sint32`, `sint64`, an enum (wire type 0;
    /// prost takes any value of at most 10 bytes and 64 bits, and truncates).
    Varint,
    /// A `double` (wire type 1: 8 bytes).
    Double,
    /// A `string` (wire type 2, UTF-8).
    Str,
    /// A message (wire type 2) of this shape.
    Message(&'static Shape),
    /// A repeated varint scalar: one per field (wire type 0) or packed (wire type 2).
    RepeatedVarint,
    /// A repeated `double`: one per field (wire type 1) or packed (wire type 2, 8 bytes each).
    RepeatedDouble,
}

/// A message of `metrics.proto` for [`check_unread`]: its name and its fields (number, name,
/// [`Kind`]) as the [`wire`] structs declare them; any other field number is skipped by its
/// wire type, as prost skips unknown fields. Names are prost's, for the same error texts.
struct Shape {
    name: &'static str,
    fields: &'static [(u32, &'static str, Kind)],
}

static METRIC_FAMILY: Shape = Shape {
    name: "MetricFamily",
    fields: &[(1, "name", Kind::Str), (2, "help", Kind::Str), (3, "r#type", Kind::Varint), (4, "metric", Kind::Message(&METRIC)), (5, "unit", Kind::Str)],
};
static METRIC: Shape = Shape {
    name: "Metric",
    fields: &[
        (1, "label", Kind::Message(&LABEL_PAIR)),
        (2, "gauge", Kind::Message(&VALUE)),
        (3, "counter", Kind::Message(&VALUE)),
        (4, "summary", Kind::Message(&SUMMARY)),
        (5, "untyped", Kind::Message(&VALUE)),
        (6, "timestamp_ms", Kind::Varint),
        (7, "histogram", Kind::Message(&HISTOGRAM)),
    ],
};
static LABEL_PAIR: Shape = Shape { name: "LabelPair", fields: &[(1, "name", Kind::Str), (2, "value", Kind::Str)] };
static VALUE: Shape = Shape { name: "Value", fields: &[(1, "value", Kind::Double)] };
static SUMMARY: Shape =
    Shape { name: "Summary", fields: &[(1, "sample_count", Kind::Varint), (2, "sample_sum", Kind::Double), (3, "quantile", Kind::Message(&QUANTILE))] };
static QUANTILE: Shape = Shape { name: "Quantile", fields: &[(1, "quantile", Kind::Double), (2, "value", Kind::Double)] };
static HISTOGRAM: Shape = Shape {
    name: "Histogram",
    fields: &[
        (1, "sample_count", Kind::Varint),
        (2, "sample_sum", Kind::Double),
        (3, "bucket", Kind::Message(&BUCKET)),
        (4, "sample_count_float", Kind::Double),
        (5, "schema", Kind::Varint),
        (6, "zero_threshold", Kind::Double),
        (7, "zero_count", Kind::Varint),
        (8, "zero_count_float", Kind::Double),
        (9, "negative_span", Kind::Message(&BUCKET_SPAN)),
        (10, "negative_delta", Kind::RepeatedVarint),
        (11, "negative_count", Kind::RepeatedDouble),
        (12, "positive_span", Kind::Message(&BUCKET_SPAN)),
        (13, "positive_delta", Kind::RepeatedVarint),
        (14, "positive_count", Kind::RepeatedDouble),
    ],
};
static BUCKET: Shape =
    Shape { name: "Bucket", fields: &[(1, "cumulative_count", Kind::Varint), (2, "upper_bound", Kind::Double), (4, "cumulative_count_float", Kind::Double)] };
static BUCKET_SPAN: Shape = Shape { name: "BucketSpan", fields: &[(1, "offset", Kind::Varint), (2, "length", Kind::Varint)] };

/// Checks that `message` is a `MetricFamily` prost would decode, without building it: every
/// field's key, wire type and length, every string's UTF-8, every nested message to its exact
/// end, read as [`wire::MetricFamily::decode`] reads them: prost's wire-format helpers in the
/// order prost's derived decoders call them (`decode_key`, `check_wire_type`, `decode_varint`,
/// `skip_field`, and `merge_loop` for nested messages and packed fields, which reads a nested
/// field through the enclosing buffer and checks its end afterwards). For the families this
/// reader does not interpret (most of a kube-proxy body), where the full decode would
/// allocate a `String` per label and a `Vec` per series and bucket only to drop them.
///
/// Errors: prost's own [`prost::DecodeError`], its location stack filled as prost's derived
/// decoders fill it (`LabelPair.name: Metric.label: MetricFamily.metric: invalid string value:
/// ...`), the same as the full decode's. The one difference: prost counts nested messages and
/// groups against a recursion limit of 100 with a crate-private counter, so an unknown field
/// holding groups nested about 100 deep (which no exposition writer produces) is refused by
/// the full decode and let through here.
fn check_unread(message: &[u8]) -> Result<(), prost::DecodeError> {
    let mut buf = message;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        check_field(&METRIC_FAMILY, tag, wire_type, &mut buf, DecodeContext::default())?;
    }
    Ok(())
}

/// One field of a `shape` message whose key (`tag`, `wire_type`) has been read, as prost's
/// derived `merge_field` reads it: a known field by its [`Kind`], its (message, field) pushed
/// on an error's location stack; an unknown one skipped by its wire type. `buf` is advanced
/// past it.
fn check_field(shape: &Shape, tag: u32, wire_type: WireType, buf: &mut &[u8], ctx: DecodeContext) -> Result<(), prost::DecodeError> {
    let Some(&(_, field, kind)) = shape.fields.iter().find(|f| f.0 == tag) else {
        return skip_field(wire_type, tag, buf, ctx);
    };
    check_value(kind, wire_type, buf, ctx).map_err(|mut e| {
        e.push(shape.name, field);
        e
    })
}

/// The value of a field of [`Kind`] `kind` whose key said `wire_type`, as prost's decoder for
/// that type reads it (`prost::encoding::{uint64, double, string, message}::merge` and their
/// `merge_repeated`), without keeping it.
fn check_value(kind: Kind, wire_type: WireType, buf: &mut &[u8], ctx: DecodeContext) -> Result<(), prost::DecodeError> {
    match (kind, wire_type) {
        (Kind::Varint | Kind::RepeatedVarint, WireType::Varint) => decode_varint(buf).map(drop),
        // 8 bytes: `double::merge` and `skip_field` refuse fewer with the same underflow error
        (Kind::Double | Kind::RepeatedDouble, WireType::SixtyFourBit) => skip_field(wire_type, 1, buf, ctx),
        (Kind::Str, WireType::LengthDelimited) => {
            let start = *buf;
            // labels and help texts are ASCII: a word-wise check first, the full one for the rest
            let bytes = delimited(buf)?;
            if bytes.is_ascii() || std::str::from_utf8(bytes).is_ok() {
                return Ok(());
            }
            // not UTF-8: prost's string decoder on the same bytes, for its error
            *buf = start;
            prost::encoding::string::merge(wire_type, &mut String::new(), buf, ctx)
        }
        (Kind::Message(inner), WireType::LengthDelimited) => prost::encoding::merge_loop(&mut (), buf, ctx, |_, buf, ctx| {
            let (tag, wire_type) = decode_key(buf)?;
            check_field(inner, tag, wire_type, buf, ctx)
        }),
        (Kind::RepeatedVarint, WireType::LengthDelimited) => prost::encoding::merge_loop(&mut (), buf, ctx, |_, buf, _| decode_varint(buf).map(drop)),
        (Kind::RepeatedDouble, WireType::LengthDelimited) => {
            prost::encoding::merge_loop(&mut (), buf, ctx, |_, buf, ctx| skip_field(WireType::SixtyFourBit, 1, buf, ctx))
        }
        (Kind::Varint | Kind::RepeatedVarint, _) => check_wire_type(WireType::Varint, wire_type),
        (Kind::Double | Kind::RepeatedDouble, _) => check_wire_type(WireType::SixtyFourBit, wire_type),
        (Kind::Str | Kind::Message(_), _) => check_wire_type(WireType::LengthDelimited, wire_type),
    }
}

/// The bytes of a length-delimited field whose key has been read: a varint length and that
/// many bytes; `buf` is advanced past them. Errors: prost's (a bad varint; a length beyond what
/// remains, from `skip_field` on the same bytes).
fn delimited<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], prost::DecodeError> {
    let start = *buf;
    let len = decode_varint(buf)?;
    match usize::try_from(len).ok().and_then(|n| buf.split_at_checked(n)) {
        Some((bytes, rest)) => {
            *buf = rest;
            Ok(bytes)
        }
        None => {
            *buf = start;
            skip_field(WireType::LengthDelimited, 1, buf, DecodeContext::default()).map(|()| &[][..])
        }
    }
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
    decode(body, true)
}

/// [`decode_kube_proxy_protobuf`] with every family decoded whole by prost, the families it
/// does not read included: the reference the tests hold the fast path to (the same result or
/// the same error; module docs, "Speed"). About 2.4 times the CPU on kube-proxy's bodies,
/// whose bytes are mostly families not read (BENCHMARKS.md).
pub fn decode_kube_proxy_protobuf_full(body: &[u8]) -> Result<Decoded, ProtobufError> {
    decode(body, false)
}

/// The decoder; `fast`: whether the families not read are checked by `check_unread` rather
/// than decoded by prost.
fn decode(body: &[u8], fast: bool) -> Result<Decoded, ProtobufError> {
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
        if fast && let Some(name) = name_field(framed.message).filter(|n| !n.is_empty() && read_family(n).is_none()) {
            // checked as the decode below would check it, not built; an error names the family
            // as the decode below names it (the first name field)
            check_unread(framed.message)
                .map_err(|e| at(&family_name(framed.message).unwrap_or_else(|| name.to_string()), format!("not a valid MetricFamily message: {e}")))?;
            continue;
        }
        let family = wire::MetricFamily::decode(framed.message).map_err(|e| {
            let name = family_name(framed.message).unwrap_or_default();
            at(&name, format!("not a valid MetricFamily message: {e}"))
        })?;
        let Some(name) = family.name.as_deref().filter(|n| !n.is_empty()) else {
            return Err(at("", "a metric family without a name".into()));
        };
        match read_family(name) {
            None => {} // decoded (checked), not interpreted (only when not `fast`)
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
        let ip_family = m.label.iter().find(|l| l.name.as_deref() == Some("ip_family")).and_then(|l| l.value.as_deref());
        apply_scalar(out, s, v, git_version, ip_family);
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
                for (le, _) in &buckets {
                    check_duration_bound(&format!("bucket le=\"{le:e}\"{which}"), le * fam.to_seconds())?;
                }
                self.buckets.extend(buckets.into_iter().map(|(le, count)| Bucket { upper_bound_seconds: le * fam.to_seconds(), count }));
            }
            if let Some(parts) = native {
                let hist = NativeHistogram::new(parts).map_err(|e| format!("native histogram{which}: {e}"))?;
                check_duration_native(&hist).map_err(|e| format!("native histogram{which}: {e}"))?;
                self.native.push((key, hist));
            }
            if let Some(sum) = h.sample_sum {
                self.sum = Some(self.sum.unwrap_or(0.0) + sum * fam.to_seconds());
            }
        }
        Ok(())
    }
}

/// A native histogram of durations: no observation below 0 (Prometheus' negative buckets hold
/// them) and no bound above [`super::parse::MAX_DURATION_SECONDS`] (the zero threshold, and the upper bound
/// of every bucket that holds an observation: a bucket index that overflows gives an infinite
/// one).
fn check_duration_native(h: &NativeHistogram) -> Result<(), String> {
    let below_zero: f64 = h.negative().iter().map(|b| b.1).sum();
    if below_zero > 0.0 {
        return Err(format!("its negative buckets hold {below_zero} observations: a duration is never below 0"));
    }
    check_duration_bound("the zero threshold", h.zero_threshold())?;
    match h.highest_positive_upper_bound() {
        Some(top) if !top.is_finite() => Err("a bucket holding observations has an infinite upper bound (its index overflows the schema's range)".into()),
        Some(top) => check_duration_bound("the upper bound of the highest bucket holding observations", top),
        None => Ok(()),
    }
}

/// A count field of a histogram that is no count.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum CountError {
    /// A float count (`sample_count_float`, `cumulative_count_float`, `zero_count_float`) that is
    /// NaN, infinite or negative.
    #[error("{field} is {value}: a count is a finite number >= 0")]
    NotACount {
        /// The field's name in `metrics.proto`.
        field: &'static str,
        /// Its value.
        value: f64,
    },
    /// Integer deltas (`positive_delta`, `negative_delta`) whose running sum overflows `i64`.
    #[error("{side} delta {index} overflows the running count")]
    DeltaOverflow {
        /// `positive` or `negative`.
        side: &'static str,
        /// The delta's 1-based position.
        index: usize,
    },
    /// Integer deltas whose running sum goes below 0.
    #[error("{side} delta {index} brings the bucket count to {count}: the deltas must sum to counts >= 0")]
    NegativeCount {
        /// `positive` or `negative`.
        side: &'static str,
        /// The delta's 1-based position.
        index: usize,
        /// The running sum there.
        count: i64,
    },
}

/// A float field that overrides an integer one when above 0 (`sample_count_float`,
/// `cumulative_count_float`, `zero_count_float`): the count to use. A float that is present
/// and NaN, infinite or negative is an error (`field` names it); 0 or absent gives the integer.
fn count_of(field: &'static str, int: Option<u64>, float: Option<f64>) -> Result<f64, CountError> {
    match float {
        Some(value) if !(value.is_finite() && value >= 0.0) => Err(CountError::NotACount { field, value }),
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
        // the field's name in the error, formatted only for an error
        let count =
            count_of("cumulative_count_float", b.cumulative_count, b.cumulative_count_float).map_err(|e| format!("bucket le=\"{}\" {e}", fmt_le(le)))?;
        out.push((le, count));
    }
    if !out.iter().any(|(le, _)| *le == f64::INFINITY) {
        out.push((f64::INFINITY, count_of("sample_count_float", h.sample_count, h.sample_count_float).map_err(|e| e.to_string())?));
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
///
/// Errors: a delta sum that goes below 0 or overflows, a float count field that is not a count
/// ([`CountError`]).
pub fn native_parts(h: &wire::Histogram) -> Result<Option<NativeParts>, CountError> {
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
fn absolute(side: &'static str, deltas: &[i64]) -> Result<Vec<f64>, CountError> {
    let mut count: i64 = 0;
    let mut out = Vec::with_capacity(deltas.len());
    for (i, &d) in deltas.iter().enumerate() {
        count = count.checked_add(d).ok_or(CountError::DeltaOverflow { side, index: i + 1 })?;
        if count < 0 {
            return Err(CountError::NegativeCount { side, index: i + 1, count });
        }
        out.push(count as f64);
    }
    Ok(out)
}

/// The messages of `body` (a protobuf kube-proxy body) whose family the parser reads
/// ([`read_families`]), each copied unchanged with its length prefix, in order: the node
/// agent's filter for the protobuf exposition. Only the top level of each message is read,
/// for its name (as the decoder reads it: the last name field).
/// Only a body that parses should be filtered: framing stops at the first error and the rest
/// is dropped (the agent parses first and answers 502 with the parser's error).
pub fn filter_kube_proxy_protobuf(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len().min(64 * 1024));
    for framed in messages(body) {
        let Ok(framed) = framed else { break };
        if name_field(framed.message).is_some_and(|n| read_families().any(|f| f == n)) {
            out.extend_from_slice(framed.raw);
        }
    }
    out
}
