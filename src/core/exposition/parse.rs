//! A small, exact reader for the Prometheus text exposition format (version 0.0.4) as kube-proxy
//! serves it on `:10249/metrics`, extracting only the families this project uses.
//!
//! Rule R12 (this module's; R1-R11 are the webhook's, docs/webhook.md): unrelated families are not interpreted (any type, any bucket layout, any
//! values); any bucket layout of our own histograms is accepted; series that differ only in extra
//! labels (`ip_family` since 1.33, ...) are summed per `le`; `NaN` and `±Inf` sample values are
//! accepted; family names match exactly (the `_full_`/`_partial_` families share a prefix with the
//! main sync family); the pre-1.14 histogram `kubeproxy_sync_proxy_rules_latency_microseconds` is
//! converted to seconds.
//!
//! # What is an error
//!
//! Every error names the 1-based line and, when known, the metric family (the sample's family, or
//! the family of the `# HELP`/`# TYPE` block the line sits in).
//!
//! * **Syntax, on every line** (also in families we do not read, since a garbled line means the
//!   text is not the exposition it claims to be): the grammar is the one Prometheus' own scrape
//!   parser (`model/textparse`, `promlex.l`) and `expfmt.TextParser` accept:
//!   - blanks (spaces and tabs) may precede a line's first token and separate tokens anywhere
//!     (both parsers skip them: `<*>[ \t]+` in promlex, `skipBlankTab` at the start of every line
//!     in expfmt), so an indented sample is read like any other; a blank line is skipped;
//!   - `#` starts a comment; `# HELP name text` and `# TYPE name type` must name a valid metric
//!     (`[a-zA-Z_:][a-zA-Z0-9_:]*`), and the type is one of `counter`, `gauge`, `histogram`,
//!     `summary`, `untyped`, with nothing after it;
//!   - a sample is `name [{label="value",...}] value [timestamp]`: label names
//!     `[a-zA-Z_][a-zA-Z0-9_]*`, values double-quoted with backslash escapes, an optional
//!     trailing comma; the value a Go float (`1.5`, `1e3`, `NaN`, `+Inf`, `-Inf`); the timestamp
//!     an integer (milliseconds); nothing else on the line;
//!   - a line ending in `\r\n` is read as ending in `\n` (saved files from Windows tools);
//!   - not accepted: OpenMetrics-only syntax (exemplars, float timestamps, `# EOF` is a plain
//!     comment) and Prometheus 3's quoted UTF-8 names (`{"my.metric"}`), which a server only
//!     sends when the scraper asks for them.
//! * **Cut-off scrapes**: the format ends every line with a line feed, so a last line without one
//!   was cut off. That is an error when the line is a sample of a family we read, a comment
//!   (a `# HELP` or `# TYPE` line's family lost its samples; a plain comment may be a `# HELP`
//!   cut inside its keyword) other than OpenMetrics' `# EOF`, or an incomplete sample of any
//!   family (cut inside its name, labels or before its value). A *complete* last sample line of a
//!   family we do not read is accepted without its line feed: editors drop a file's final newline
//!   (one of the shared real scrapes is saved so), and no value this reader returns depends on
//!   that line.
//!   A cut that falls exactly on a line boundary leaves a valid exposition, so it is only caught
//!   when it leaves one of our histograms without its `+Inf` bucket.
//! * **Our histograms**, per series (the labels other than `le`): a `le` label that is a number,
//!   not NaN, not `-Inf` and not negative (these are all durations, so a bound below 0 cannot
//!   occur; `le="0"` is kube-proxy's first network-programming bucket), no `le` twice, a
//!   `le="+Inf"` bucket, bucket counts that are not negative and never decrease as `le` grows
//!   (the counts are cumulative), and that are finite: a NaN or infinite count is an error
//!   (Prometheus' `histogram_quantile` would answer NaN for it, promtool 3.16 checked; sizing a
//!   sleep from it is never right). A `_count` sample that is NaN, infinite or negative is an
//!   error too (its value is not used: the `+Inf` bucket holds the same number).
//!
//! # Speed
//!
//! Lines of families this reader does not interpret take a fast path when written in the plain
//! form servers use: every check kept, less work (see `fast_path.rs`).
//!
//! Why not a parser crate: the maintained ones (`prometheus-parse`) build every sample of every
//! family with a regex per line, lose the line number needed for errors, and silently skip cut-off
//! lines; this reader checks the syntax of every line, interprets only our families, and meets
//! the throughput targets (BENCHMARKS.md).

use super::fast_path::{Resume, plain_unrelated_sample};
use super::histogram::{Bucket, Histogram, HistogramError};
use super::native::NativeHistogram;
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

    pub(super) const ALL: [HistogramFamily; 5] = [Self::Sync, Self::SyncFull, Self::SyncPartial, Self::NetworkProgramming, Self::SyncLegacyMicroseconds];

    pub(super) fn index(self) -> usize {
        self as usize
    }

    /// Multiplier from the family's unit to seconds.
    pub(super) fn to_seconds(self) -> f64 {
        if self == Self::SyncLegacyMicroseconds { 1e-6 } else { 1.0 }
    }
}

/// The gauge and counter families read from a scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scalar {
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

/// The gauge and counter families read from a scrape, by exposition name: with
/// [`HistogramFamily::ALL`], the one list of what this parser reads ([`read_families`]).
const SCALARS: [(&str, Scalar); 13] = [
    ("kubeproxy_sync_proxy_rules_last_timestamp_seconds", Scalar::LastTimestamp),
    ("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", Scalar::LastQueuedTimestamp),
    ("kubeproxy_sync_proxy_rules_endpoint_changes_pending", Scalar::EndpointChangesPending),
    ("kubeproxy_sync_proxy_rules_endpoint_changes_total", Scalar::EndpointChangesTotal),
    ("kubeproxy_sync_proxy_rules_service_changes_pending", Scalar::ServiceChangesPending),
    ("kubeproxy_sync_proxy_rules_service_changes_total", Scalar::ServiceChangesTotal),
    ("kubeproxy_sync_proxy_rules_iptables_total", Scalar::IptablesTotal),
    ("kubeproxy_sync_proxy_rules_iptables_last", Scalar::IptablesLast),
    ("kubeproxy_sync_proxy_rules_iptables_restore_failures_total", Scalar::IptablesRestoreFailures),
    ("kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total", Scalar::IptablesPartialRestoreFailures),
    ("kubeproxy_sync_proxy_rules_nftables_sync_failures_total", Scalar::NftablesSyncFailures),
    ("kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total", Scalar::NftablesCleanupFailures),
    ("kubernetes_build_info", Scalar::BuildInfo),
];

/// What a metric family name (not a sample name) is to this reader: one of its histograms, one
/// of its gauges or counters, or `None` (a family it does not read). The protobuf decoder
/// ([`super::protobuf`]) names families, not samples.
pub(super) enum ReadFamily {
    Histogram(HistogramFamily),
    Scalar(Scalar),
}

/// The [`ReadFamily`] of the family `name`, matched exactly.
pub(super) fn read_family(name: &str) -> Option<ReadFamily> {
    if let Some((_, s)) = SCALARS.iter().find(|(n, _)| *n == name) {
        return Some(ReadFamily::Scalar(*s));
    }
    HistogramFamily::ALL.into_iter().find(|f| f.name() == name).map(ReadFamily::Histogram)
}

fn classify(name: &str) -> Option<Name> {
    if let Some((_, s)) = SCALARS.iter().find(|(n, _)| *n == name) {
        return Some(Name::Scalar(*s));
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

/// The names of every metric family [`parse_kube_proxy_metrics`] reads (the five histograms of
/// [`HistogramFamily`], then the gauges and counters), as they appear in `# HELP`/`# TYPE`
/// lines. The node agent serves only these ([`crate::core::exposition::filter`]): this list is the
/// one place that says what the operator needs from a scrape.
pub fn read_families() -> impl Iterator<Item = &'static str> {
    HistogramFamily::ALL.into_iter().map(HistogramFamily::name).chain(SCALARS.iter().map(|(n, _)| *n))
}

/// True when a sample named `name` (a family name, or a histogram's `_bucket`/`_sum`/`_count`
/// series) is one [`parse_kube_proxy_metrics`] reads; the same test the parser applies.
pub fn reads_sample(name: &str) -> bool {
    classify(name).is_some()
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
    /// The native histogram of [`Self::sync`] (the `ip_family` series summed), when the scrape
    /// carried one: only the protobuf exposition does (kube-proxy 1.37+).
    pub sync_native: Option<NativeHistogram>,
    /// The native histogram of [`Self::network_programming`], when the scrape carried one.
    pub network_programming_native: Option<NativeHistogram>,
    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds` (Unix seconds); with several series
    /// (dual-stack), the oldest.
    pub last_sync_timestamp_seconds: Option<f64>,
    /// `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds` (Unix seconds); with several
    /// series, the newest. Later than the oldest last sync: changes wait for a sync.
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
    /// kube-proxy's two sync timestamps per proxier (one per `ip_family`), paired: the newest
    /// queue of one family against the oldest sync of the other is no wait (an idle dual-stack
    /// 1.37.2 kube-proxy shows exactly that).
    pub sync_timestamps: Vec<SyncTimestamps>,
    /// When the scrape was taken, Unix seconds by the reader's clock: set by whoever read it (the
    /// measurement store, Prometheus' evaluation time, `analyze` for a URL); the parsers leave
    /// it None, and so does `analyze` for a file (a checkout resets its modification time).
    pub scraped_at_unix_seconds: Option<f64>,
    /// The oldest `last_queued` still waiting, Unix seconds: set by a reader that saw changes
    /// pending (last queued after last synced) in consecutive scrapes with no sync completed in
    /// between. None when this scrape alone is known; the model then takes `last_queued`, a lower
    /// bound of how long changes have waited.
    pub oldest_pending_queued_unix_seconds: Option<f64>,
}

/// One proxier's `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds` and
/// `..._last_timestamp_seconds`, Unix seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SyncTimestamps {
    /// The `ip_family` label (`IPv4`, `IPv6`; empty when absent).
    pub ip_family: String,
    /// When changes were last queued for a sync.
    pub last_queued_seconds: Option<f64>,
    /// When a sync last completed.
    pub last_synced_seconds: Option<f64>,
}

impl KubeProxyScrape {
    /// The timestamps of `ip_family`, added when absent.
    pub fn sync_timestamps_of(&mut self, ip_family: &str) -> &mut SyncTimestamps {
        let i = match self.sync_timestamps.iter().position(|t| t.ip_family == ip_family) {
            Some(i) => i,
            None => {
                self.sync_timestamps.push(SyncTimestamps { ip_family: ip_family.to_string(), ..SyncTimestamps::default() });
                self.sync_timestamps.len() - 1
            }
        };
        &mut self.sync_timestamps[i]
    }

    /// Changes waiting for a sync: `(the earliest last queued among proxiers whose last queue
    /// is after their last sync, that proxier's last sync)`, Unix seconds. `Some(None)` when
    /// every proxier with both gauges has synced since its last queue; None when no proxier has
    /// both, or a pair is not finite.
    pub fn waiting(&self) -> Option<Option<(f64, f64)>> {
        let mut paired = false;
        let mut earliest: Option<(f64, f64)> = None;
        for t in &self.sync_timestamps {
            let (Some(queued), Some(synced)) = (t.last_queued_seconds, t.last_synced_seconds) else { continue };
            if !(queued - synced).is_finite() {
                return None;
            }
            paired = true;
            if queued > synced && earliest.is_none_or(|e| queued < e.0) {
                earliest = Some((queued, synced));
            }
        }
        paired.then_some(earliest)
    }
}

/// A scrape that cannot be trusted, with the 1-based line and the family it concerns.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}: {}", self.what())]
pub struct ParseError {
    /// 1-based line number in the input.
    pub line: usize,
    /// The family concerned (or the partial name when a line was cut inside the name); empty
    /// when the line names none and sits in no `# HELP`/`# TYPE` block.
    pub family: String,
    /// What was wrong.
    pub message: String,
}

impl ParseError {
    /// `family: message`, or the message alone when no family is known (a family name longer
    /// than [`EXCERPT_BYTES`] shown cut, with its length).
    fn what(&self) -> String {
        if self.family.is_empty() { self.message.clone() } else { format!("{}: {}", shown(&self.family), self.message) }
    }

    /// The error as `SOURCE:LINE: family: message`, the form the command line prints for a file
    /// or URL.
    pub fn at(&self, source: &str) -> String {
        format!("{source}:{}: {}", self.line, self.what())
    }
}

/// One bucket line of one of our histograms: `le` in the family's unit, the count, the line.
#[derive(Clone, Copy)]
struct BucketLine {
    le: f64,
    count: f64,
    line: usize,
}

#[derive(Default)]
struct HistAcc {
    sum: Option<f64>,
    /// labels other than `le` -> that series' bucket lines (a map: scrapes can hold many series)
    series: std::collections::HashMap<String, Vec<BucketLine>>,
    last_line: usize,
}

const BLANKS: [char; 2] = [' ', '\t'];

/// Parses a kube-proxy `/metrics` body (`text`: the whole body, UTF-8, lines ended by `\n` or
/// `\r\n`) into the families this project reads.
///
/// Errors: a [`ParseError`] naming the 1-based line and the family, for every case listed in the
/// module docs ("What is an error"). Never panics. Lines of families this parser does not read
/// take the fast path described in the module docs ("Speed"); the result, `Ok` or `Err`, is the
/// one [`parse_kube_proxy_metrics_strict`] gives.
pub fn parse_kube_proxy_metrics(text: &str) -> Result<KubeProxyScrape, ParseError> {
    parse(text, true)
}

/// The reference for [`parse_kube_proxy_metrics`]: the same parser with every line, also every
/// line of a family it does not read, through the full grammar check (no fast path). Same
/// input, errors and result; about 4 times slower on scrapes of mostly unrelated families. For
/// the differential tests and the benchmark that compare the two.
pub fn parse_kube_proxy_metrics_strict(text: &str) -> Result<KubeProxyScrape, ParseError> {
    parse(text, false)
}

/// The parser; `fast`: whether lines that [`plain_unrelated_sample`] vouches for skip the full
/// check.
fn parse(text: &str, fast: bool) -> Result<KubeProxyScrape, ParseError> {
    let mut hists: [Option<HistAcc>; 5] = Default::default();
    let mut out = KubeProxyScrape::default();
    // the family of the last `# HELP`/`# TYPE` line, to name the family of a broken line
    let mut block: &str = "";
    let mut line_no = 0usize;
    let mut resume: Option<Resume> = None;
    // lines as `text.split('\n')` gives them: `pos` is where the next one starts, past the end
    // after the last
    let mut pos = 0usize;
    while pos <= text.len() {
        line_no += 1;
        if fast && let Some(len) = plain_unrelated_sample(text.as_bytes(), pos, &mut resume) {
            pos += len;
            continue;
        }
        let rest = &text[pos..];
        // a last line without its line feed is where a cut shows (an empty last piece is the
        // end of a text that ends with one)
        let (raw, is_last_unterminated) = match rest.find('\n') {
            Some(end) => {
                pos += end + 1;
                (&rest[..end], false)
            }
            None => {
                pos = text.len() + 1;
                (rest, !rest.is_empty())
            }
        };
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let body = skip_blanks(line);
        if body.is_empty() {
            continue;
        }
        if let Some(comment) = body.strip_prefix('#') {
            if let Some(family) = comment_line(comment, body, line_no, is_last_unterminated)? {
                block = family;
            }
            continue;
        }
        let name_end = run_len(body, is_name_byte);
        let name = &body[..name_end];
        let kind = if name.starts_with("kubeproxy_") || name == "kubernetes_build_info" { classify(name) } else { None };
        let family = |kind: &Option<Name>| match kind {
            Some(k) => family_of(k).to_string(),
            None if !block.is_empty() && (name.starts_with(block) || (!name.is_empty() && block.starts_with(name))) => block.to_string(),
            // the name as written, up to a blank or a brace: a name cut short by a character a
            // name may not hold (`fö`) is named whole, not by its valid prefix (`f`)
            None if !name.is_empty() => body[..body.find([' ', '\t', '{']).unwrap_or(body.len())].to_string(),
            None => String::new(),
        };
        let err = |message: String| ParseError { line: line_no, family: family(&kind), message };
        if is_last_unterminated && kind.is_some() {
            return Err(err("the last line has no terminating line feed: the scrape was cut off".into()));
        }
        // labels are only collected for our families; every line's are checked
        let mut labels = Labels::default();
        let ours = kind.is_some();
        let sample = split_sample(body, name_end, |name, raw, escaped| if ours { labels.add(name, raw, escaped) } else { Ok(()) });
        let value = match sample {
            Ok(value) => value,
            Err(SyntaxError::NoValue) if is_last_unterminated && !name.is_empty() && body[name_end..].trim().is_empty() => {
                return Err(cut_line_error(line_no, name, block));
            }
            Err(e) => {
                let message = e.to_string();
                return Err(err(if is_last_unterminated { cut_off(&message) } else { message }));
            }
        };
        let Some(k) = &kind else { continue }; // a family we do not read: checked, not interpreted
        match *k {
            Name::Hist(fam, part) => hists[fam.index()].get_or_insert_with(HistAcc::default).add(fam, part, labels, value, line_no, &err)?,
            Name::Scalar(s) => apply_scalar(&mut out, s, value, labels.git_version.as_deref(), labels.ip_family),
        }
    }
    finish_histograms(hists, &mut out)?;
    Ok(out)
}

/// A comment line (`comment`: what follows the `#` of `body`): `Some(family)` for a `# HELP` or
/// `# TYPE` line, whose family names the lines after it. Errors: a malformed comment
/// ([`check_comment`]), or any comment but OpenMetrics' `# EOF` without its terminating line
/// feed (`is_last_unterminated`): a cut scrape, perhaps cut inside a `# HELP` keyword.
fn comment_line<'t>(comment: &'t str, body: &str, line_no: usize, is_last_unterminated: bool) -> Result<Option<&'t str>, ParseError> {
    match check_comment(comment) {
        Ok(None) if is_last_unterminated && body.trim_end_matches(BLANKS) != "# EOF" => Err(ParseError {
            line: line_no,
            family: String::new(),
            message: "the last line is a comment without its terminating line feed: the scrape was cut off".into(),
        }),
        Ok(None) => Ok(None),
        Ok(Some(family)) if is_last_unterminated => Err(ParseError {
            line: line_no,
            family: family.to_string(),
            message: "the last line is a # HELP or # TYPE line without its terminating line feed: the scrape was cut off before the family's samples".into(),
        }),
        Ok(Some(family)) => Ok(Some(family)),
        Err((family, message)) => {
            let message = if is_last_unterminated { cut_off(&message) } else { message };
            Err(ParseError { line: line_no, family: family.to_string(), message })
        }
    }
}

impl HistAcc {
    /// Records one sample line (`line_no`) of histogram family `fam`: a bucket (its `le` and a
    /// finite count >= 0, kept per series of the other labels), the sum (in seconds, summed
    /// over series), or the count (checked, not kept: the `+Inf` bucket holds the same number).
    /// `err` makes the line's error.
    fn add(
        &mut self,
        fam: HistogramFamily,
        part: Part,
        labels: Labels<'_>,
        value: f64,
        line_no: usize,
        err: &dyn Fn(String) -> ParseError,
    ) -> Result<(), ParseError> {
        self.last_line = line_no;
        match part {
            Part::Bucket => {
                let le = labels.le.ok_or_else(|| err("bucket sample without an `le` label".into()))?;
                let le = bucket_bound(le).map_err(err)?;
                if value < 0.0 {
                    return Err(err(format!("bucket le=\"{}\" has a negative count {value}", labels.le.unwrap_or_default())));
                }
                if !value.is_finite() {
                    return Err(err(format!(
                        "bucket le=\"{}\" has the count {value}: a bucket counts observations (a finite number)",
                        labels.le.unwrap_or_default()
                    )));
                }
                self.series.entry(labels.others).or_default().push(BucketLine { le, count: value, line: line_no });
            }
            Part::Sum => self.sum = Some(self.sum.unwrap_or(0.0) + value * fam.to_seconds()),
            // a count that no histogram can have is refused like a bucket's
            Part::Count if !(value.is_finite() && value >= 0.0) => {
                return Err(err(format!("{}_count has the value {value}: it counts observations (a finite number >= 0)", fam.name())));
            }
            Part::Count => {}
        }
        Ok(())
    }
}

/// Each histogram family's series checked ([`check_series`]) and summed into `out`; a family
/// with only `_sum`/`_count` lines is left out. The legacy microseconds sync histogram (before
/// Kubernetes 1.13's seconds) stands in for the sync histogram only when that is absent.
fn finish_histograms(mut hists: [Option<HistAcc>; 5], out: &mut KubeProxyScrape) -> Result<(), ParseError> {
    for fam in HistogramFamily::ALL {
        let Some(acc) = hists[fam.index()].take() else { continue };
        let buckets = check_series(fam, acc.series, acc.last_line)?;
        let hist = match Histogram::new(buckets, acc.sum) {
            Ok(h) => h,
            Err(HistogramError::Empty) => continue, // only _sum/_count lines: nothing to read
            Err(e) => return Err(ParseError { line: acc.last_line, family: fam.name().to_string(), message: e.to_string() }),
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
    Ok(())
}

fn cut_off(message: &str) -> String {
    format!("{message}, and the last line has no terminating line feed: the scrape was cut off")
}

/// A bucket's `le` (in the family's unit): a number, not NaN, not negative (durations).
fn bucket_bound(le: &str) -> Result<f64, String> {
    let v = parse_float(le).ok_or_else(|| not_a_float("`le` value", le))?;
    if v.is_nan() {
        Err(format!("bucket bound le=\"{le}\" is NaN"))
    } else if v == f64::NEG_INFINITY {
        Err(format!("bucket bound le=\"{le}\" is -Inf: no bucket can be below every value"))
    } else if v < 0.0 {
        Err(format!("bucket bound le=\"{le}\" is negative: a duration histogram has no bucket below 0"))
    } else {
        Ok(v)
    }
}

/// Checks each series of one of our histograms (a `+Inf` bucket, no `le` twice, cumulative
/// counts) and returns all their buckets, in seconds, for [`Histogram::new`] to sum per `le`.
fn check_series(fam: HistogramFamily, series: std::collections::HashMap<String, Vec<BucketLine>>, last_line: usize) -> Result<Vec<Bucket>, ParseError> {
    let fail = |line: usize, message: String| ParseError { line, family: fam.name().to_string(), message };
    let which = |key: &str| if key.is_empty() { String::new() } else { format!(" (series {{{key}}})") };
    let mut series: Vec<(String, Vec<BucketLine>)> = series.into_iter().collect();
    series.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some((key, _)) = series.iter().find(|(_, b)| !b.iter().any(|b| b.le == f64::INFINITY)) {
        return Err(fail(last_line, format!("histogram has no le=\"+Inf\" bucket{}: the scrape is incomplete or cut off", which(key))));
    }
    let mut out = Vec::with_capacity(series.iter().map(|s| s.1.len()).sum());
    for (key, mut lines) in series {
        lines.sort_by(|a, b| a.le.total_cmp(&b.le).then(a.line.cmp(&b.line)));
        for w in lines.windows(2) {
            let (lo, hi) = (w[0], w[1]);
            if lo.le == hi.le {
                return Err(fail(hi.line, format!("bucket le=\"{}\" appears twice{} (also on line {})", fmt_le(hi.le), which(&key), lo.line)));
            }
            if hi.count < lo.count {
                return Err(fail(
                    hi.line,
                    format!(
                        "bucket le=\"{}\" counts {} but le=\"{}\" (line {}) counts {}{}: bucket counts are cumulative and never decrease as le grows",
                        fmt_le(hi.le),
                        hi.count,
                        fmt_le(lo.le),
                        lo.line,
                        lo.count,
                        which(&key)
                    ),
                ));
            }
        }
        for b in lines {
            let seconds = b.le * fam.to_seconds();
            check_duration_bound(&format!("bucket le=\"{}\"{}", fmt_le(b.le), which(&key)), seconds).map_err(|m| fail(b.line, m))?;
            out.push(Bucket { upper_bound_seconds: seconds, count: b.count });
        }
    }
    Ok(out)
}

/// The longest duration a kube-proxy histogram bound may stand for, seconds (11.6 days; kube-proxy's
/// own top finite buckets are 16.384 s for syncs and a few minutes for network programming). A
/// bound above it is a corrupt or foreign scrape: taken at face value it made W infinite or
/// hundreds of digits long.
pub const MAX_DURATION_SECONDS: f64 = 1e6;

/// An error when a finite bucket bound of `seconds` is above [`MAX_DURATION_SECONDS`]; `what`
/// names the bound as the input wrote it.
pub(super) fn check_duration_bound(what: &str, seconds: f64) -> Result<(), String> {
    if seconds.is_finite() && seconds > MAX_DURATION_SECONDS {
        Err(format!(
            "{what} is {seconds:e} s, above {MAX_DURATION_SECONDS:e} s (11.6 days): no kube-proxy duration is that long; the scrape is corrupt or not kube-proxy's"
        ))
    } else {
        Ok(())
    }
}

/// A bound as a message shows it: `+Inf`, exponent form when very large or very small (a
/// `le` of 1e308 is not 309 digits), else its shortest decimal.
fn fmt_le(v: f64) -> String {
    if v == f64::INFINITY {
        "+Inf".into()
    } else if v != 0.0 && !(1e-6..1e15).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        v.to_string()
    }
}

fn family_of(kind: &Name) -> &'static str {
    match kind {
        Name::Hist(f, _) => f.name(),
        Name::Scalar(s) => SCALARS.iter().find(|(_, k)| k == s).map_or("", |(n, _)| *n),
    }
}

/// Folds one sample `v` of the scalar family `s` into `out` (`git_version`: the sample's
/// `git_version`/`gitVersion` label, read for `kubernetes_build_info`; `ip_family`: its
/// `ip_family` label): the oldest last sync, the newest last queued, both per family too, the
/// build's version, and a sum over series for the rest.
pub(super) fn apply_scalar(out: &mut KubeProxyScrape, s: Scalar, v: f64, git_version: Option<&str>, ip_family: Option<&str>) {
    let add = |slot: &mut Option<f64>| *slot = Some(slot.unwrap_or(0.0) + v);
    match s {
        Scalar::LastTimestamp => {
            out.last_sync_timestamp_seconds = Some(out.last_sync_timestamp_seconds.map_or(v, |o| o.min(v)));
            out.sync_timestamps_of(ip_family.unwrap_or_default()).last_synced_seconds = Some(v);
        }
        Scalar::LastQueuedTimestamp => {
            out.last_queued_timestamp_seconds = Some(out.last_queued_timestamp_seconds.map_or(v, |o| o.max(v)));
            out.sync_timestamps_of(ip_family.unwrap_or_default()).last_queued_seconds = Some(v);
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
            if let Some(v) = git_version {
                out.kubernetes_version = Some(v.to_string());
            }
        }
    }
}

#[derive(Default)]
struct Labels<'a> {
    le: Option<&'a str>,
    git_version: Option<String>,
    /// `ip_family`, as written (kube-proxy's values need no escape)
    ip_family: Option<&'a str>,
    /// every label except `le`, `name="value"` joined by commas (identifies a series)
    others: String,
}

impl<'a> Labels<'a> {
    /// Takes one label of a sample of ours.
    fn add(&mut self, name: &'a str, raw: &'a str, escaped: bool) -> Result<(), String> {
        match name {
            "le" if self.le.is_some() => return Err("the label le appears twice on one sample".into()),
            "le" => self.le = Some(raw),
            "git_version" | "gitVersion" => self.git_version = Some(if escaped { unescape(raw) } else { raw.to_string() }),
            _ => {
                if name == "ip_family" {
                    self.ip_family = Some(raw);
                }
                if !self.others.is_empty() {
                    self.others.push(',');
                }
                self.others.push_str(name);
                self.others.push_str("=\"");
                self.others.push_str(raw);
                self.others.push('"');
            }
        }
        Ok(())
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

/// Go `strconv.ParseFloat` as Prometheus uses it: decimal/exponent forms, `NaN`, `+Inf`, `-Inf`
/// (case-insensitive, `Inf`/`Infinity`).
/// Errors: `None` for text that is not a float, and for a finite decimal beyond the float64
/// range (`1e400`), which Go's `ParseFloat` refuses with `ErrRange` (an underflow such as
/// `1e-400` is 0 there too, without an error).
fn parse_float(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        // Rust saturates an overflowing decimal to an infinity; only the spellings of infinity
        // (no digits) may give one
        _ => s.parse::<f64>().ok().filter(|v| v.is_finite() || !s.bytes().any(|b| b.is_ascii_digit())),
    }
}

/// The most of an input token an error message quotes, bytes: a message names what was wrong,
/// it does not repeat a megabyte of it.
const EXCERPT_BYTES: usize = 64;

/// `s` quoted as `{:?}` does, cut to its first [`EXCERPT_BYTES`] (at a character boundary)
/// with its length when longer: `"9999..."... (5000000 bytes)`.
pub(crate) fn excerpt(s: &str) -> String {
    let head = clip(s);
    if head.len() == s.len() { format!("{s:?}") } else { format!("{head:?}... ({} bytes)", s.len()) }
}

/// A name as an error message shows it: whole, or its first [`EXCERPT_BYTES`] and its length.
fn shown(name: &str) -> String {
    let head = clip(name);
    if head.len() == name.len() { name.to_string() } else { format!("{head}... ({} bytes)", name.len()) }
}

/// The first [`EXCERPT_BYTES`] of `s`, cut at a character boundary.
fn clip(s: &str) -> &str {
    let mut end = s.len().min(EXCERPT_BYTES);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The message for a token [`parse_float`] refused: `what` (e.g. "value") names it.
fn not_a_float(what: &str, tok: &str) -> String {
    let quoted = excerpt(tok);
    if tok.parse::<f64>().is_ok_and(f64::is_infinite) {
        format!("{what} {quoted} is beyond the float64 range (Prometheus' parser refuses it too)")
    } else {
        format!("{what} {quoted} is not a number")
    }
}

fn cut_line_error(line: usize, partial: &str, block: &str) -> ParseError {
    let candidates: Vec<&str> = HistogramFamily::ALL.iter().map(|f| f.name()).filter(|n| n.starts_with(partial) || partial.starts_with(n)).collect();
    let family = match candidates.as_slice() {
        [one] => (*one).to_string(),
        _ if !block.is_empty() && (block.starts_with(partial) || partial.starts_with(block)) => block.to_string(),
        _ => clip(partial).to_string(),
    };
    ParseError { line, family, message: format!("sample line {} is cut off before its value: the scrape is incomplete", excerpt(partial)) }
}

/// Why a line is not exposition syntax.
#[derive(Debug)]
enum SyntaxError {
    /// The line ends after the name and labels: no value.
    NoValue,
    /// Anything else, described.
    Other(String),
}

impl std::fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SyntaxError::NoValue => f.write_str("sample has no value"),
            SyntaxError::Other(m) => f.write_str(m),
        }
    }
}

impl From<String> for SyntaxError {
    fn from(m: String) -> Self {
        SyntaxError::Other(m)
    }
}

/// `s` without its leading blanks (spaces and tabs).
#[inline]
fn skip_blanks(s: &str) -> &str {
    &s[run_len(s, |b| b == b' ' || b == b'\t')..]
}

/// The length of the leading run of bytes for which `ascii` holds; `ascii` accepts ASCII bytes
/// only, so the run ends on a character boundary.
#[inline]
fn run_len(s: &str, ascii: impl Fn(u8) -> bool) -> usize {
    s.bytes().position(|b| !ascii(b)).unwrap_or(s.len())
}

#[inline]
fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

#[inline]
fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// The first character of `s`, for messages.
fn first_char(s: &str) -> char {
    s.chars().next().unwrap_or(' ')
}

/// Checks a sample line (`body`: leading blanks removed; `name_end`: where the metric name
/// ends) against the grammar in the module docs, passes each label to `each` (see
/// [`scan_labels`]) and returns the value. Byte-wise: every delimiter is ASCII, and this runs on
/// every line of the scrape.
fn split_sample<'a>(body: &'a str, name_end: usize, each: impl FnMut(&'a str, &'a str, bool) -> Result<(), String>) -> Result<f64, SyntaxError> {
    let name = &body[..name_end];
    let mut rest = &body[name_end..];
    if name.is_empty() {
        let c = first_char(rest);
        return Err(if c == '{' {
            "a sample must start with its metric name (a name inside the braces, Prometheus 3's quoted UTF-8 form, is not accepted)".to_string().into()
        } else if c == '\u{feff}' {
            // an editor's UTF-8 byte order mark: the exposition format has none
            "the text starts with a UTF-8 byte order mark (BOM, bytes EF BB BF), which the exposition format does not allow: save the file without it"
                .to_string()
                .into()
        } else {
            format!("expected a metric name or a comment, found {c:?}").into()
        });
    }
    match rest.as_bytes().first() {
        None | Some(b' ' | b'\t' | b'{') => {}
        Some(_) => {
            let c = first_char(rest);
            return Err(format!("character {c:?} is not allowed in metric name {}", excerpt(&body[..name_end + c.len_utf8()])).into());
        }
    }
    if name.as_bytes()[0].is_ascii_digit() {
        return Err(format!("metric name {} starts with a digit", excerpt(name)).into());
    }
    rest = skip_blanks(rest);
    if let Some(inner) = rest.strip_prefix('{') {
        rest = skip_blanks(scan_labels(inner, each)?);
    }
    if rest.is_empty() {
        return Err(SyntaxError::NoValue);
    }
    let (tok, after) = rest.split_at(run_len(rest, |b| !is_blank(b)));
    let value = parse_float(tok).ok_or_else(|| not_a_float("value", tok))?;
    let after = skip_blanks(after);
    if !after.is_empty() {
        let (ts, trailing) = after.split_at(run_len(after, |b| !is_blank(b)));
        let digits = ts.strip_prefix('-').unwrap_or(ts);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("timestamp {ts:?} after the value is not an integer (milliseconds)").into());
        }
        let trailing = skip_blanks(trailing);
        if !trailing.is_empty() {
            return Err(format!("unexpected {trailing:?} after the timestamp").into());
        }
    }
    Ok(value)
}

/// Walks a label set; `s` starts just after `{`. Calls `each(name, raw value, has escapes)` per
/// label and returns the text after the closing `}`.
fn scan_labels<'a>(s: &'a str, mut each: impl FnMut(&'a str, &'a str, bool) -> Result<(), String>) -> Result<&'a str, String> {
    let cut = || "label set is cut off (no closing `}`)".to_string();
    let mut rest = s;
    loop {
        rest = skip_blanks(rest);
        if let Some(r) = rest.strip_prefix('}') {
            return Ok(r);
        }
        let name_end = run_len(rest, |b| b.is_ascii_alphanumeric() || b == b'_');
        let name = &rest[..name_end];
        if name.is_empty() || name.as_bytes()[0].is_ascii_digit() {
            return Err(match rest.chars().next() {
                None => cut(),
                Some('"') => "quoted label names (Prometheus 3's UTF-8 form) are not accepted".into(),
                Some(c) if name.is_empty() => format!("expected a label name, found {c:?}"),
                Some(_) => format!("label name {} starts with a digit", excerpt(name)),
            });
        }
        rest = skip_blanks(&rest[name_end..]);
        rest = match rest.as_bytes().first() {
            Some(b'=') => skip_blanks(&rest[1..]),
            None => return Err(format!("label set is cut off after the label name {} (no `=`)", shown(name))),
            Some(_) => return Err(format!("expected `=` after the label name {}, found {:?}", shown(name), first_char(rest))),
        };
        rest = match rest.strip_prefix('"') {
            Some(r) => r,
            None if rest.is_empty() => return Err(format!("label {} value is cut off (no opening quote)", shown(name))),
            None => return Err(format!("label {} has no quoted value", shown(name))),
        };
        // find the closing quote, honouring backslash escapes
        let bytes = rest.as_bytes();
        let mut i = 0;
        let mut escaped = false;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' => {
                    escaped = true;
                    i += 2;
                }
                b'"' => break,
                _ => i += 1,
            }
        }
        if i >= bytes.len() {
            return Err(format!("label {} value is cut off (no closing quote)", shown(name)));
        }
        each(name, &rest[..i], escaped)?;
        rest = skip_blanks(&rest[i + 1..]);
        match rest.as_bytes().first() {
            Some(b',') => rest = &rest[1..],
            Some(b'}') => {}
            None => return Err(cut()),
            Some(_) => return Err(format!("expected `,` or `}}` after the label {}, found {:?}", shown(name), first_char(rest))),
        }
    }
}

/// Checks a comment line (`s`: the text after `#`). Returns the family a `# HELP`/`# TYPE` line
/// names; an error comes with the family when the line names a valid one.
fn check_comment(s: &str) -> Result<Option<&str>, (&str, String)> {
    // promlex: only `#` followed by blanks can start HELP/TYPE; anything else is a plain comment
    if !s.starts_with(BLANKS) {
        return Ok(None);
    }
    let s = s.trim_start_matches(BLANKS);
    let (keyword, rest) = s.split_once(BLANKS).unwrap_or((s, ""));
    if keyword != "HELP" && keyword != "TYPE" {
        return Ok(None);
    }
    let rest = rest.trim_start_matches(BLANKS);
    let (name, rest) = rest.split_once(BLANKS).unwrap_or((rest, ""));
    if name.is_empty() {
        return Err(("", format!("# {keyword} without a metric name")));
    }
    let valid = name.bytes().enumerate().all(|(i, b)| b.is_ascii_alphabetic() || b == b'_' || b == b':' || (i > 0 && b.is_ascii_digit()));
    if !valid {
        return Err(("", format!("# {keyword} names {}, which is not a metric name", excerpt(name))));
    }
    if keyword == "TYPE" {
        let ty = rest.trim_matches(BLANKS);
        if !matches!(ty, "counter" | "gauge" | "histogram" | "summary" | "untyped") {
            return Err((
                name,
                if ty.is_empty() {
                    format!("# TYPE {} has no type", shown(name))
                } else {
                    format!("# TYPE {} has the unknown type {} (expected counter, gauge, histogram, summary or untyped)", shown(name), excerpt(ty))
                },
            ));
        }
    }
    Ok(Some(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_quote_at_most_an_excerpt_of_the_input() {
        let long_le = "9".repeat(5_000_000);
        let text = format!(
            "# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram\nkubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"{long_le}x\"}} 1\n"
        );
        let e = parse_kube_proxy_metrics(&text).unwrap_err();
        assert!(e.message.len() < 200, "{} bytes: {}", e.message.len(), &e.message[..200.min(e.message.len())]);
        assert!(e.message.contains("(5000001 bytes)") && e.message.contains("is not a number"), "{}", e.message);
        let long_name = "a".repeat(1_000_000);
        let e = parse_kube_proxy_metrics(&format!("{long_name}{{x=\"1\"\n")).unwrap_err();
        assert!(e.to_string().len() < 300, "{}", &e.to_string()[..300]);
        assert!(e.to_string().contains("(1000000 bytes)"), "{e}");
        // a short token is quoted whole
        assert_eq!(excerpt("forty"), "\"forty\"");
        assert_eq!(excerpt(&"é".repeat(40)), format!("{:?}... (80 bytes)", "é".repeat(32)));
    }

    /// Buckets of `family` in two ip_family series: IPv4 `le="1"` 3, `+Inf` 4; IPv6 `le="1"` 5,
    /// `+Inf` 6.
    fn dual_stack_buckets(family: &str) -> Vec<String> {
        [("IPv4", "1", 3), ("IPv4", "+Inf", 4), ("IPv6", "1", 5), ("IPv6", "+Inf", 6)]
            .iter()
            .map(|(ip, le, n)| format!("{family}_bucket{{ip_family=\"{ip}\",le=\"{le}\"}} {n}\n"))
            .collect()
    }

    #[test]
    fn ip_family_series_are_summed_per_le() {
        let family = "kubeproxy_sync_proxy_rules_duration_seconds";
        let text = dual_stack_buckets(family).concat() + &format!("{family}_sum{{ip_family=\"IPv4\"}} 1.5\n{family}_sum{{ip_family=\"IPv6\"}} 2.5\n");
        let s = parse_kube_proxy_metrics(&text).unwrap();
        let h = s.sync.unwrap();
        assert_eq!(h.count(), 10.0);
        assert_eq!(h.buckets()[0].count, 8.0);
        assert_eq!(h.sum_seconds, Some(4.0));
    }

    #[test]
    fn one_series_missing_inf_is_an_error_naming_it() {
        // the IPv6 series has no +Inf bucket
        let text = dual_stack_buckets("kubeproxy_network_programming_duration_seconds")[..3].concat();
        let text = text.as_str();
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

    /// Prometheus' parsers skip blanks before a line's first token and between tokens: an
    /// indented scrape reads exactly like the original, blank lines included.
    #[test]
    fn indented_lines_and_blanks_between_tokens_are_read() {
        let plain = "\
# HELP kubeproxy_sync_proxy_rules_duration_seconds x
# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"1\"} 3
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"+Inf\"} 4
kubeproxy_sync_proxy_rules_duration_seconds_sum 2.5
kubeproxy_sync_proxy_rules_iptables_total{table=\"nat\"} 7
";
        let indented = "\
  # HELP kubeproxy_sync_proxy_rules_duration_seconds x
\t# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram
  kubeproxy_sync_proxy_rules_duration_seconds_bucket { le = \"1\" , } 3 1700000000000
\t \t
\tkubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"+Inf\"}\t4\t
    kubeproxy_sync_proxy_rules_duration_seconds_sum 2.5
 kubeproxy_sync_proxy_rules_iptables_total{ table=\"nat\"} 7
";
        let want = parse_kube_proxy_metrics(plain).unwrap();
        assert_eq!(want.sync.as_ref().unwrap().count(), 4.0);
        assert_eq!(want.iptables_rules_total, Some(7.0));
        assert_eq!(parse_kube_proxy_metrics(indented).unwrap(), want);
    }

    #[test]
    fn valid_text_without_our_families_is_empty_not_an_error() {
        let text = "# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 46\n\n# a comment\nprocess_open_fds{a=\"b\"} 9 -12\n";
        assert_eq!(parse_kube_proxy_metrics(text).unwrap(), KubeProxyScrape::default());
    }

    fn err(text: &str) -> (usize, String, String) {
        let e = parse_kube_proxy_metrics(text).unwrap_err();
        (e.line, e.family, e.message)
    }

    /// A broken line is an error wherever it is, also in a family we do not read.
    #[test]
    fn garbled_lines_in_unrelated_families_are_errors_naming_line_and_family() {
        let head = "# HELP go_goroutines x\n# TYPE go_goroutines gauge\n";
        let cases: [(&str, &str, &str); 13] = [
            ("go_goroutines 46 12 9\n", "go_goroutines", "unexpected \"9\" after the timestamp"),
            ("go_goroutines forty\n", "go_goroutines", "value \"forty\" is not a number"),
            ("go_goroutines 46 1.5\n", "go_goroutines", "timestamp \"1.5\" after the value is not an integer (milliseconds)"),
            ("go_goroutines\n", "go_goroutines", "sample has no value"),
            ("go_gorout-ines 46\n", "go_goroutines", "character '-' is not allowed in metric name \"go_gorout-\""),
            ("go_goroutines{a=\"b\" 46\n", "go_goroutines", "expected `,` or `}` after the label a, found '4'"),
            ("go_goroutines{a=b} 46\n", "go_goroutines", "label a has no quoted value"),
            ("go_goroutines{a.b=\"c\"} 46\n", "go_goroutines", "expected `=` after the label name a, found '.'"),
            ("go_goroutines{\"a\"=\"c\"} 46\n", "go_goroutines", "quoted label names (Prometheus 3's UTF-8 form) are not accepted"),
            ("<html><body>502 Bad Gateway</body></html>\n", "", "expected a metric name or a comment, found '<'"),
            (
                "\u{feff}go_goroutines 46\n",
                "",
                "the text starts with a UTF-8 byte order mark (BOM, bytes EF BB BF), which the exposition format does not allow: save the file without it",
            ),
            (
                "# TYPE go_threads gauges\n",
                "go_threads",
                "# TYPE go_threads has the unknown type \"gauges\" (expected counter, gauge, histogram, summary or untyped)",
            ),
            ("# HELP 9lives x\n", "", "# HELP names \"9lives\", which is not a metric name"),
        ];
        for (line, family, message) in cases {
            assert_eq!(err(&format!("{head}{line}")), (3, family.to_string(), message.to_string()), "{line:?}");
        }
        // before any # HELP/# TYPE line, and on a line that names no family: no family
        let e = parse_kube_proxy_metrics("}\n").unwrap_err();
        assert_eq!((e.line, e.family.as_str()), (1, ""));
        assert_eq!(e.to_string(), "line 1: expected a metric name or a comment, found '}'");
        assert_eq!(e.at("scrape.txt"), "scrape.txt:1: expected a metric name or a comment, found '}'");
        // a name cut short by a character a name may not hold is named whole, not by its prefix
        for line in ["fö 1\n", "fö{a=\"b\"} 1\n"] {
            let e = parse_kube_proxy_metrics(line).unwrap_err();
            assert_eq!(e.at("scrape.txt"), "scrape.txt:1: fö: character 'ö' is not allowed in metric name \"fö\"", "{line:?}");
        }
    }

    /// The format ends every line with a line feed. A last line without one is an error when it
    /// is incomplete (whatever its family), ours, or a comment other than `# EOF`; a complete
    /// last sample line of a family we do not read is accepted (the shared v1.13 scrape is saved
    /// so).
    #[test]
    fn a_scrape_cut_inside_an_unrelated_family_is_an_error() {
        let head = "# HELP go_gc_duration_seconds x\n# TYPE go_gc_duration_seconds summary\ngo_gc_duration_seconds{quantile=\"0\"} 2.2652e-05\n";
        let cut = format!("{head}go_gc_duration_seconds{{quantile=\"0.2");
        assert_eq!(
            err(&cut),
            (
                4,
                "go_gc_duration_seconds".into(),
                "label quantile value is cut off (no closing quote), and the last line has no terminating line feed: the scrape was cut off".into()
            )
        );
        assert_eq!(
            err(&format!("{head}go_gc_dura")),
            (4, "go_gc_duration_seconds".into(), "sample line \"go_gc_dura\" is cut off before its value: the scrape is incomplete".into())
        );
        assert_eq!(
            err(&format!("{head}go_gc_duration_seconds{{quantile=\"0.25\"}} ")),
            (4, "go_gc_duration_seconds".into(), "sample has no value, and the last line has no terminating line feed: the scrape was cut off".into())
        );
        assert_eq!(
            err(&format!("{head}# HELP go_goroutines Number of gorout")),
            (
                4,
                "go_goroutines".into(),
                "the last line is a # HELP or # TYPE line without its terminating line feed: the scrape was cut off before the family's samples".into()
            )
        );
        assert_eq!(
            err(&format!("{head}# HE")),
            (4, String::new(), "the last line is a comment without its terminating line feed: the scrape was cut off".into())
        );
        // complete last lines without a line feed: accepted
        for tail in ["go_gc_duration_seconds{quantile=\"0.25\"} 5.9e-05", "# EOF", "  "] {
            assert_eq!(parse_kube_proxy_metrics(&format!("{head}{tail}")).unwrap(), KubeProxyScrape::default(), "{tail:?}");
        }
    }

    fn sync_text(buckets: &[(&str, &str)]) -> String {
        buckets.iter().map(|(le, c)| format!("kubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"{le}\"}} {c}\n")).collect()
    }

    /// `(le, count)` bucket lines, the line of the expected error, its message.
    type BucketCase<'a> = (&'a [(&'a str, &'a str)], usize, &'a str);

    #[test]
    fn impossible_buckets_are_errors_naming_family_and_line() {
        let cases: [BucketCase; 11] = [
            (&[("1", "NaN"), ("+Inf", "3")], 1, "bucket le=\"1\" has the count NaN: a bucket counts observations (a finite number)"),
            (&[("1", "1"), ("+Inf", "+Inf")], 2, "bucket le=\"+Inf\" has the count inf: a bucket counts observations (a finite number)"),
            (&[("-Inf", "0"), ("1", "1"), ("+Inf", "1")], 1, "bucket bound le=\"-Inf\" is -Inf: no bucket can be below every value"),
            (&[("0.5", "0"), ("NaN", "1"), ("+Inf", "1")], 2, "bucket bound le=\"NaN\" is NaN"),
            (&[("-0.5", "0"), ("1", "1"), ("+Inf", "1")], 1, "bucket bound le=\"-0.5\" is negative: a duration histogram has no bucket below 0"),
            (&[("1", "2"), ("2", "3"), ("1.0", "2"), ("+Inf", "3")], 3, "bucket le=\"1\" appears twice (also on line 1)"),
            (&[("1", "-2"), ("+Inf", "3")], 1, "bucket le=\"1\" has a negative count -2"),
            (
                &[("1", "5"), ("2", "3"), ("+Inf", "6")],
                2,
                "bucket le=\"2\" counts 3 but le=\"1\" (line 1) counts 5: bucket counts are cumulative and never decrease as le grows",
            ),
            (
                &[("+Inf", "4"), ("1", "5")],
                1,
                "bucket le=\"+Inf\" counts 4 but le=\"1\" (line 2) counts 5: bucket counts are cumulative and never decrease as le grows",
            ),
            // a bound no kube-proxy duration reaches: taken at face value it made W infinite
            (
                &[("1", "0"), ("1e308", "100"), ("+Inf", "100")],
                2,
                "bucket le=\"1e308\" is 1e308 s, above 1e6 s (11.6 days): no kube-proxy duration is that long; the scrape is corrupt or not kube-proxy's",
            ),
            (
                &[("1000000", "0"), ("1000001", "1"), ("+Inf", "1")],
                2,
                "bucket le=\"1000001\" is 1.000001e6 s, above 1e6 s (11.6 days): no kube-proxy duration is that long; the scrape is corrupt or not kube-proxy's",
            ),
        ];
        for (buckets, line, message) in cases {
            assert_eq!(err(&sync_text(buckets)), (line, SYNC.into(), message.into()), "{buckets:?}");
        }
        // per series: a layout that is cumulative within each ip_family is fine, a decrease in
        // one of them is named with its series
        let text = "\
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"1\"} 9
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv6\",le=\"1\"} 1
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"+Inf\"} 10
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv6\",le=\"+Inf\"} 0
";
        assert_eq!(
            err(text),
            (
                4,
                SYNC.into(),
                "bucket le=\"+Inf\" counts 0 but le=\"1\" (line 2) counts 1 (series {ip_family=\"IPv6\"}): bucket counts are cumulative and never decrease as le grows"
                    .into()
            )
        );
        assert_eq!(
            err("kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"1\",le=\"2\"} 1\n"),
            (1, SYNC.into(), "the label le appears twice on one sample".into())
        );
        // the network-programming layout starts at le="0"
        let np = "\
kubeproxy_network_programming_duration_seconds_bucket{le=\"0\"} 0
kubeproxy_network_programming_duration_seconds_bucket{le=\"0.25\"} 1
kubeproxy_network_programming_duration_seconds_bucket{le=\"+Inf\"} 2
";
        assert_eq!(parse_kube_proxy_metrics(np).unwrap().network_programming.unwrap().buckets()[0].upper_bound_seconds, 0.0);
    }

    const SYNC: &str = "kubeproxy_sync_proxy_rules_duration_seconds";

    /// A NaN, infinite or negative bucket count or `_count`, in any spelling Go's `ParseFloat`
    /// reads, is an error naming the family and the value on the fast path as on the strict one.
    #[test]
    fn counts_that_are_not_observations_are_errors_on_both_paths() {
        let np = "kubeproxy_network_programming_duration_seconds";
        let bucket = |c: &str| format!("{np}_bucket{{le=\"0.5\"}} 1\n{np}_bucket{{le=\"+Inf\"}} {c}\n{np}_sum 1\n{np}_count 2\n");
        let count = |c: &str| format!("{np}_bucket{{le=\"0.5\"}} 1\n{np}_bucket{{le=\"+Inf\"}} 2\n{np}_sum 1\n{np}_count {c}\n");
        // unrelated families around them, so the fast path is taken before and after
        let wrap = |t: String| format!("# TYPE go_goroutines gauge\ngo_goroutines 7\n{t}go_threads 9\n");
        let cases = [
            (bucket("NaN"), 4, "bucket le=\"+Inf\" has the count NaN: a bucket counts observations (a finite number)".to_string()),
            (bucket("nan"), 4, "bucket le=\"+Inf\" has the count NaN: a bucket counts observations (a finite number)".to_string()),
            (bucket("+Inf"), 4, "bucket le=\"+Inf\" has the count inf: a bucket counts observations (a finite number)".to_string()),
            (bucket("-1"), 4, "bucket le=\"+Inf\" has a negative count -1".to_string()),
            (count("NaN"), 6, format!("{np}_count has the value NaN: it counts observations (a finite number >= 0)")),
            (count("Inf"), 6, format!("{np}_count has the value inf: it counts observations (a finite number >= 0)")),
            (count("-2"), 6, format!("{np}_count has the value -2: it counts observations (a finite number >= 0)")),
        ];
        for (text, line, message) in cases {
            let text = wrap(text);
            for e in [parse_kube_proxy_metrics(&text).unwrap_err(), parse_kube_proxy_metrics_strict(&text).unwrap_err()] {
                assert_eq!((e.line, e.family.as_str(), e.message.as_str()), (line, np, message.as_str()), "{text}");
            }
        }
        // the same lines with sound counts are read
        let ok = wrap(count("2"));
        assert_eq!(parse_kube_proxy_metrics(&ok).unwrap().network_programming.unwrap().count(), 2.0);
    }

    #[test]
    fn values_beyond_the_float64_range_are_errors_like_go_parse_float() {
        let text = |le: &str, v: &str| {
            format!(
                "kubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"0.1\"}} 1\nkubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"{le}\"}} 2\nkubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"+Inf\"}} {v}\n"
            )
        };
        let e = parse_kube_proxy_metrics(&text("1e400", "3")).unwrap_err();
        assert_eq!((e.line, e.message.as_str()), (2, "`le` value \"1e400\" is beyond the float64 range (Prometheus' parser refuses it too)"));
        let e = parse_kube_proxy_metrics(&text("1", "-1e999")).unwrap_err();
        assert_eq!((e.line, e.message.as_str()), (3, "value \"-1e999\" is beyond the float64 range (Prometheus' parser refuses it too)"));
        // underflow is 0, as in Go; the spellings of infinity stay infinities
        let underflow = "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"1e-400\"} 0\nkubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.1\"} 1\nkubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"+Inf\"} 3\n";
        let h = parse_kube_proxy_metrics(underflow).unwrap().sync.unwrap();
        assert_eq!(h.buckets().iter().map(|b| b.upper_bound_seconds).collect::<Vec<_>>(), vec![0.0, 0.1, f64::INFINITY]);
        // ("Inf" is read as infinity, which no bucket can count)
        let e = parse_kube_proxy_metrics(&text("1", "Inf")).unwrap_err();
        assert_eq!((e.line, e.message.as_str()), (3, "bucket le=\"+Inf\" has the count inf: a bucket counts observations (a finite number)"));
    }

    #[test]
    fn garbage_never_panics() {
        for input in
            ["", "\n", "{", "kubeproxy_", "kubeproxy_x{", "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"\\", "kubernetes_build_info{a=\"é\\"]
        {
            let _ = parse_kube_proxy_metrics(input);
        }
    }
}
