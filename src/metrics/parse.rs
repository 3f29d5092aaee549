//! A small, exact reader for the Prometheus text exposition format (version 0.0.4) as kube-proxy
//! serves it on `:10249/metrics`, extracting only the families this project uses.
//!
//! Rule R12 (design.md): unrelated families are skipped without being parsed; any bucket layout is
//! accepted; series that differ only in extra labels (`ip_family` since 1.33, ...) are summed per
//! `le`; `NaN` and `±Inf` values are accepted; family names match exactly (the `_full_`/`_partial_`
//! families share a prefix with the main sync family); a histogram without a `+Inf` bucket, a
//! sample line cut off before its value, or a last line without its terminating line feed (the
//! format requires one) is an error that names the family and the line; the pre-1.14 histogram
//! `kubeproxy_sync_proxy_rules_latency_microseconds` is converted to seconds.
//!
//! Why not a parser crate: the maintained ones (`prometheus-parse`) build every sample of every
//! family with a regex per line, lose the line number needed for errors, and silently skip cut-off
//! lines; this reader skips unrelated lines with one prefix test and meets the 200 MB/s target
//! (BENCHMARKS.md).

use super::histogram::{Bucket, Histogram, HistogramError};
use serde::Serialize;

/// The histogram families read from a scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum HistogramFamily {
    /// `kubeproxy_sync_proxy_rules_duration_seconds`: every sync, every mode.
    Sync,
    /// `kubeproxy_sync_full_proxy_rules_duration_seconds` (iptables mode, 1.28+).
    SyncFull,
    /// `kubeproxy_sync_partial_proxy_rules_duration_seconds` (iptables mode, 1.28+).
    SyncPartial,
    /// `kubeproxy_network_programming_duration_seconds`: EndpointSlice trigger time to rules synced.
    NetworkProgramming,
    /// `kubeproxy_sync_proxy_rules_latency_microseconds` (before ~1.14), converted to seconds.
    SyncLegacyMicroseconds,
}

impl HistogramFamily {
    /// The exposition family name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sync => "kubeproxy_sync_proxy_rules_duration_seconds",
            Self::SyncFull => "kubeproxy_sync_full_proxy_rules_duration_seconds",
            Self::SyncPartial => "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            Self::NetworkProgramming => "kubeproxy_network_programming_duration_seconds",
            Self::SyncLegacyMicroseconds => "kubeproxy_sync_proxy_rules_latency_microseconds",
        }
    }

    const ALL: [HistogramFamily; 5] =
        [Self::Sync, Self::SyncFull, Self::SyncPartial, Self::NetworkProgramming, Self::SyncLegacyMicroseconds];

    fn index(self) -> usize {
        self as usize
    }

    /// Multiplier from the family's unit to seconds.
    fn to_seconds(self) -> f64 {
        if self == Self::SyncLegacyMicroseconds { 1e-6 } else { 1.0 }
    }
}

/// The gauge and counter families read from a scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scalar {
    LastTimestamp,
    LastQueuedTimestamp,
    EndpointChangesPending,
    EndpointChangesTotal,
    ServiceChangesPending,
    ServiceChangesTotal,
    IptablesTotal,
    IptablesLast,
    IptablesRestoreFailures,
    IptablesPartialRestoreFailures,
    NftablesSyncFailures,
    NftablesCleanupFailures,
    BuildInfo,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Bucket,
    Sum,
    Count,
}

enum Name {
    Hist(HistogramFamily, Part),
    Scalar(Scalar),
}

fn classify(name: &str) -> Option<Name> {
    use Scalar::*;
    let scalar = match name {
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds" => Some(LastTimestamp),
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds" => Some(LastQueuedTimestamp),
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending" => Some(EndpointChangesPending),
        "kubeproxy_sync_proxy_rules_endpoint_changes_total" => Some(EndpointChangesTotal),
        "kubeproxy_sync_proxy_rules_service_changes_pending" => Some(ServiceChangesPending),
        "kubeproxy_sync_proxy_rules_service_changes_total" => Some(ServiceChangesTotal),
        "kubeproxy_sync_proxy_rules_iptables_total" => Some(IptablesTotal),
        "kubeproxy_sync_proxy_rules_iptables_last" => Some(IptablesLast),
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total" => Some(IptablesRestoreFailures),
        "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total" => Some(IptablesPartialRestoreFailures),
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total" => Some(NftablesSyncFailures),
        "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total" => Some(NftablesCleanupFailures),
        "kubernetes_build_info" => Some(BuildInfo),
        _ => None,
    };
    if let Some(s) = scalar {
        return Some(Name::Scalar(s));
    }
    let (base, part) = if let Some(b) = name.strip_suffix("_bucket") {
        (b, Part::Bucket)
    } else if let Some(b) = name.strip_suffix("_sum") {
        (b, Part::Sum)
    } else if let Some(b) = name.strip_suffix("_count") {
        (b, Part::Count)
    } else {
        return None;
    };
    HistogramFamily::ALL.into_iter().find(|f| f.name() == base).map(|f| Name::Hist(f, part))
}

/// Everything this project reads from one kube-proxy scrape. Absent families are `None`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeProxyScrape {
    /// Sync duration in seconds: `kubeproxy_sync_proxy_rules_duration_seconds`, or the legacy
    /// microsecond histogram converted when only that one is present.
    pub sync: Option<Histogram>,
    /// True when [`Self::sync`] came from the legacy microsecond family.
    pub sync_from_legacy_microseconds: bool,
    /// Full syncs only (iptables mode, 1.28+).
    pub sync_full: Option<Histogram>,
    /// Partial syncs only (iptables mode, 1.28+).
    pub sync_partial: Option<Histogram>,
    /// Network programming latency in seconds.
    pub network_programming: Option<Histogram>,
    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds` (Unix seconds); with several series
    /// (dual-stack), the oldest.
    pub last_sync_timestamp_seconds: Option<f64>,
    /// `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds` (Unix seconds); with several
    /// series, the newest. Together with the oldest last sync this gives the worst staleness.
    pub last_queued_timestamp_seconds: Option<f64>,
    /// Endpoint changes waiting for the next sync.
    pub endpoint_changes_pending: Option<f64>,
    /// Endpoint changes seen since start (counter).
    pub endpoint_changes_total: Option<f64>,
    /// Service changes waiting for the next sync.
    pub service_changes_pending: Option<f64>,
    /// Service changes seen since start (counter).
    pub service_changes_total: Option<f64>,
    /// iptables rules owned by kube-proxy, summed over tables (`iptables_total{table}`).
    pub iptables_rules_total: Option<f64>,
    /// iptables rules written by the last sync, summed over tables.
    pub iptables_rules_last: Option<f64>,
    /// `iptables_restore_failures_total`.
    pub iptables_restore_failures_total: Option<f64>,
    /// `iptables_partial_restore_failures_total`.
    pub iptables_partial_restore_failures_total: Option<f64>,
    /// `nftables_sync_failures_total` (nftables mode only).
    pub nftables_sync_failures_total: Option<f64>,
    /// `nftables_cleanup_failures_total` (nftables mode only).
    pub nftables_cleanup_failures_total: Option<f64>,
    /// `git_version` (or pre-1.15 `gitVersion`) label of `kubernetes_build_info`, e.g. `v1.29.0`.
    pub kubernetes_version: Option<String>,
}

/// A scrape that cannot be trusted, with the 1-based line and the family it concerns.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}: {family}: {message}")]
pub struct ParseError {
    /// 1-based line number in the input.
    pub line: usize,
    /// The family concerned (or the partial name when a line was cut inside the name).
    pub family: String,
    /// What was wrong.
    pub message: String,
}

#[derive(Default)]
struct HistAcc {
    buckets: Vec<Bucket>,
    sum: Option<f64>,
    /// labels other than `le` -> saw +Inf, per series (a map: scrapes can hold many series)
    series: std::collections::HashMap<String, bool>,
    last_line: usize,
}

/// Parses a kube-proxy `/metrics` body. Never panics; see the module docs for what is an error.
pub fn parse_kube_proxy_metrics(text: &str) -> Result<KubeProxyScrape, ParseError> {
    let mut hists: [Option<HistAcc>; 5] = Default::default();
    let mut out = KubeProxyScrape::default();
    let ends_with_newline = text.is_empty() || text.ends_with('\n');
    let mut line_no = 0usize;
    let mut lines = text.split('\n').peekable();
    while let Some(raw) = lines.next() {
        line_no += 1;
        let is_last_unterminated = !ends_with_newline && lines.peek().is_none();
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let interesting = line.starts_with("kubeproxy_") || line.starts_with("kubernetes_build_info");
        if !interesting {
            continue;
        }
        let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
        let name = &line[..name_end];
        let Some(kind) = classify(name) else {
            if name_end == line.len() {
                // a kubeproxy_ line with nothing after its name: cut off inside the name or before
                // the value. Name the family it belonged to when the prefix says so.
                return Err(cut_line_error(line_no, name));
            }
            continue; // an unrelated kubeproxy_ family
        };
        let err = |message: String| ParseError { line: line_no, family: family_of(&kind).to_string(), message };
        if is_last_unterminated {
            return Err(err("the last line has no terminating line feed: the scrape was cut off".into()));
        }
        let (labels, rest) = parse_labels(&line[name_end..]).map_err(err)?;
        let value = parse_value(rest).map_err(err)?;
        match kind {
            Name::Hist(fam, part) => {
                let acc = hists[fam.index()].get_or_insert_with(HistAcc::default);
                acc.last_line = line_no;
                let k = fam.to_seconds();
                match part {
                    Part::Bucket => {
                        let le = labels.le.ok_or_else(|| err("bucket sample without an `le` label".into()))?;
                        let le = parse_float(le).ok_or_else(|| err(format!("`le` value {le:?} is not a number")))?;
                        let key = labels.others;
                        let is_inf = le == f64::INFINITY;
                        *acc.series.entry(key).or_insert(false) |= is_inf;
                        acc.buckets.push(Bucket { upper_bound_seconds: le * k, count: value });
                    }
                    Part::Sum => acc.sum = Some(acc.sum.unwrap_or(0.0) + value * k),
                    Part::Count => {}
                }
            }
            Name::Scalar(s) => apply_scalar(&mut out, s, value, &labels),
        }
    }
    for fam in HistogramFamily::ALL {
        let Some(acc) = hists[fam.index()].take() else { continue };
        let fail = |message: String| ParseError { line: acc.last_line, family: fam.name().to_string(), message };
        let mut missing: Vec<&String> = acc.series.iter().filter(|(_, inf)| !**inf).map(|(s, _)| s).collect();
        missing.sort();
        if let Some(series) = missing.first() {
            let which = if series.is_empty() { String::new() } else { format!(" (series {{{series}}})") };
            return Err(fail(format!(
                "histogram has no le=\"+Inf\" bucket{which}: the scrape is incomplete or cut off"
            )));
        }
        let hist = match Histogram::new(acc.buckets, acc.sum) {
            Ok(h) => h,
            Err(HistogramError::Empty) => continue, // only _sum/_count lines: nothing to read
            Err(e) => return Err(fail(e.to_string())),
        };
        match fam {
            HistogramFamily::Sync => out.sync = Some(hist),
            HistogramFamily::SyncFull => out.sync_full = Some(hist),
            HistogramFamily::SyncPartial => out.sync_partial = Some(hist),
            HistogramFamily::NetworkProgramming => out.network_programming = Some(hist),
            HistogramFamily::SyncLegacyMicroseconds => {
                if out.sync.is_none() {
                    out.sync = Some(hist);
                    out.sync_from_legacy_microseconds = true;
                }
            }
        }
    }
    Ok(out)
}

fn family_of(kind: &Name) -> &'static str {
    match kind {
        Name::Hist(f, _) => f.name(),
        Name::Scalar(s) => match s {
            Scalar::LastTimestamp => "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            Scalar::LastQueuedTimestamp => "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            Scalar::EndpointChangesPending => "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            Scalar::EndpointChangesTotal => "kubeproxy_sync_proxy_rules_endpoint_changes_total",
            Scalar::ServiceChangesPending => "kubeproxy_sync_proxy_rules_service_changes_pending",
            Scalar::ServiceChangesTotal => "kubeproxy_sync_proxy_rules_service_changes_total",
            Scalar::IptablesTotal => "kubeproxy_sync_proxy_rules_iptables_total",
            Scalar::IptablesLast => "kubeproxy_sync_proxy_rules_iptables_last",
            Scalar::IptablesRestoreFailures => "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
            Scalar::IptablesPartialRestoreFailures => {
                "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"
            }
            Scalar::NftablesSyncFailures => "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
            Scalar::NftablesCleanupFailures => "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
            Scalar::BuildInfo => "kubernetes_build_info",
        },
    }
}

fn cut_line_error(line: usize, partial: &str) -> ParseError {
    let candidates: Vec<&str> =
        HistogramFamily::ALL.iter().map(|f| f.name()).filter(|n| n.starts_with(partial) || partial.starts_with(n)).collect();
    let family = match candidates.as_slice() {
        [one] => (*one).to_string(),
        _ => partial.to_string(),
    };
    ParseError {
        line,
        family,
        message: format!("sample line {partial:?} is cut off before its value: the scrape is incomplete"),
    }
}

fn apply_scalar(out: &mut KubeProxyScrape, s: Scalar, v: f64, labels: &Labels<'_>) {
    let add = |slot: &mut Option<f64>| *slot = Some(slot.unwrap_or(0.0) + v);
    match s {
        Scalar::LastTimestamp => out.last_sync_timestamp_seconds = Some(out.last_sync_timestamp_seconds.map_or(v, |o| o.min(v))),
        Scalar::LastQueuedTimestamp => {
            out.last_queued_timestamp_seconds = Some(out.last_queued_timestamp_seconds.map_or(v, |o| o.max(v)))
        }
        Scalar::EndpointChangesPending => add(&mut out.endpoint_changes_pending),
        Scalar::EndpointChangesTotal => add(&mut out.endpoint_changes_total),
        Scalar::ServiceChangesPending => add(&mut out.service_changes_pending),
        Scalar::ServiceChangesTotal => add(&mut out.service_changes_total),
        Scalar::IptablesTotal => add(&mut out.iptables_rules_total),
        Scalar::IptablesLast => add(&mut out.iptables_rules_last),
        Scalar::IptablesRestoreFailures => add(&mut out.iptables_restore_failures_total),
        Scalar::IptablesPartialRestoreFailures => add(&mut out.iptables_partial_restore_failures_total),
        Scalar::NftablesSyncFailures => add(&mut out.nftables_sync_failures_total),
        Scalar::NftablesCleanupFailures => add(&mut out.nftables_cleanup_failures_total),
        Scalar::BuildInfo => {
            if let Some(v) = labels.git_version.as_ref() {
                out.kubernetes_version = Some(v.clone());
            }
        }
    }
}

#[derive(Default)]
struct Labels<'a> {
    le: Option<&'a str>,
    git_version: Option<String>,
    /// every label except `le`, `name="value"` joined by commas (identifies a series)
    others: String,
}

/// Parses `{a="b",...}` (if present) and returns the labels and the rest of the line.
fn parse_labels(s: &str) -> Result<(Labels<'_>, &str), String> {
    let mut labels = Labels::default();
    let Some(mut rest) = s.strip_prefix('{') else { return Ok((labels, s)) };
    loop {
        rest = rest.trim_start_matches([' ', '\t']);
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let eq = rest.find('=').ok_or("label set is cut off (no `=`)")?;
        let lname = rest[..eq].trim();
        rest = rest[eq + 1..].trim_start();
        rest = rest.strip_prefix('"').ok_or_else(|| format!("label {lname} has no quoted value"))?;
        // find the closing quote, honouring backslash escapes
        let bytes = rest.as_bytes();
        let mut i = 0;
        let mut escaped = false;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' => {
                    escaped = true;
                    i += 2;
                    continue;
                }
                b'"' => break,
                _ => i += 1,
            }
        }
        if i >= bytes.len() {
            return Err(format!("label {lname} value is cut off (no closing quote)"));
        }
        let raw = &rest[..i];
        rest = &rest[i + 1..];
        match lname {
            "le" => labels.le = Some(raw),
            "git_version" | "gitVersion" => labels.git_version = Some(if escaped { unescape(raw) } else { raw.to_string() }),
            _ => {
                if !labels.others.is_empty() {
                    labels.others.push(',');
                }
                labels.others.push_str(lname);
                labels.others.push_str("=\"");
                labels.others.push_str(raw);
                labels.others.push('"');
            }
        }
        rest = rest.trim_start_matches([' ', '\t']);
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else if !rest.starts_with('}') {
            return Err("label set is cut off (expected `,` or `}`)".into());
        }
    }
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => {}
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn parse_value(rest: &str) -> Result<f64, String> {
    let rest = rest.trim_start_matches([' ', '\t']);
    let tok = rest.split([' ', '\t']).next().unwrap_or("");
    if tok.is_empty() {
        return Err("sample has no value: the line is cut off".into());
    }
    parse_float(tok).ok_or_else(|| format!("value {tok:?} is not a number"))
}

/// Go `strconv.ParseFloat` as Prometheus uses it: decimal/exponent forms, `NaN`, `+Inf`, `-Inf`
/// (case-insensitive, `Inf`/`Infinity`).
fn parse_float(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse::<f64>().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_family_series_are_summed_per_le() {
        let text = "\
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"1\"} 3
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"+Inf\"} 4
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv6\",le=\"1\"} 5
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv6\",le=\"+Inf\"} 6
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family=\"IPv4\"} 1.5
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family=\"IPv6\"} 2.5
";
        let s = parse_kube_proxy_metrics(text).unwrap();
        let h = s.sync.unwrap();
        assert_eq!(h.count(), 10.0);
        assert_eq!(h.buckets()[0].count, 8.0);
        assert_eq!(h.sum_seconds, Some(4.0));
    }

    #[test]
    fn one_series_missing_inf_is_an_error_naming_it() {
        let text = "\
kubeproxy_network_programming_duration_seconds_bucket{ip_family=\"IPv4\",le=\"1\"} 3
kubeproxy_network_programming_duration_seconds_bucket{ip_family=\"IPv4\",le=\"+Inf\"} 4
kubeproxy_network_programming_duration_seconds_bucket{ip_family=\"IPv6\",le=\"1\"} 5
";
        let e = parse_kube_proxy_metrics(text).unwrap_err();
        assert_eq!(e.family, "kubeproxy_network_programming_duration_seconds");
        assert_eq!(e.line, 3);
        assert!(e.message.contains("ip_family=\"IPv6\""), "{}", e.message);
    }

    #[test]
    fn prefix_sharing_families_are_not_confused() {
        let text = "\
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{le=\"+Inf\"} 7
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"+Inf\"} 2
kubeproxy_sync_proxy_rules_duration_seconds_foo{le=\"+Inf\"} 99
";
        let s = parse_kube_proxy_metrics(text).unwrap();
        assert_eq!(s.sync.unwrap().count(), 2.0);
        assert_eq!(s.sync_full.unwrap().count(), 7.0);
    }

    #[test]
    fn cut_label_and_missing_value_are_errors() {
        let e = parse_kube_proxy_metrics("kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.0\n").unwrap_err();
        assert_eq!(e.line, 1);
        assert_eq!(e.family, "kubeproxy_sync_proxy_rules_duration_seconds");
        let e = parse_kube_proxy_metrics("kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"1\"}\n").unwrap_err();
        assert!(e.message.contains("no value"));
        let e = parse_kube_proxy_metrics("x 1\nkubeproxy_sync_proxy_rules_last_timestamp_seconds 12").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("line feed"));
    }

    #[test]
    fn special_values_and_escapes() {
        let text = "\
kubernetes_build_info{git_version=\"v1.35.\\\"1\\\"\",major=\"1\"} 1
kubeproxy_sync_proxy_rules_last_timestamp_seconds NaN
kubeproxy_sync_proxy_rules_endpoint_changes_pending +Inf 1700000000000
";
        let s = parse_kube_proxy_metrics(text).unwrap();
        assert_eq!(s.kubernetes_version.as_deref(), Some("v1.35.\"1\""));
        assert!(s.last_sync_timestamp_seconds.unwrap().is_nan());
        assert_eq!(s.endpoint_changes_pending, Some(f64::INFINITY));
    }

    #[test]
    fn garbage_never_panics() {
        for input in ["", "\n", "{", "kubeproxy_", "kubeproxy_x{", "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"\\", "kubernetes_build_info{a=\"é\\"] {
            let _ = parse_kube_proxy_metrics(input);
        }
    }
}
