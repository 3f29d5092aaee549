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

mod framing;
mod histograms;
pub mod wire;

use super::native::NativeHistogram;
use super::scrape::{HistogramFamily, KubeProxyScrape, ReadFamily, Scalar, apply_scalar, read_families, read_family};
use framing::{check_unread, name_field};
use histograms::{HistAcc, finish_histograms};
use prost::Message;
use wire::series_name;

pub use framing::{Framed, Messages, ProtobufError, family_name, messages};
pub use histograms::{CountError, native_parts};

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
/// whose bytes are mostly families not read (docs/benchmarks/scrape.md).
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
    let native = finish_histograms(acc, &mut out)?;
    let mut decoded = Decoded { scrape: out, native };
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
