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

mod histograms;
mod lex;

use super::fast_path::{Resume, plain_unrelated_sample};
use super::scrape::{SCALARS, Scalar, apply_scalar};
use histograms::{HistAcc, Part, finish_histograms};
use lex::{BLANKS, SyntaxError, check_comment, clip, excerpt, is_name_byte, run_len, skip_blanks, split_sample};

pub use super::scrape::{HistogramFamily, KubeProxyScrape, MAX_DURATION_SECONDS, SyncTimestamps, read_families};
pub use lex::ParseError;

/// What a sample name is to this reader: a part of one of its histograms, or one of its gauges
/// and counters.
enum Name {
    Hist(HistogramFamily, Part),
    Scalar(Scalar),
}

/// The [`Name`] of a sample named `name`, matched exactly (`None`: a family not read).
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

/// True when a sample named `name` (a family name, or a histogram's `_bucket`/`_sum`/`_count`
/// series) is one [`parse_kube_proxy_metrics`] reads; the same test the parser applies.
pub fn reads_sample(name: &str) -> bool {
    classify(name).is_some()
}

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
            Name::Hist(fam, part) => {
                hists[fam.index()].get_or_insert_with(HistAcc::default).add(fam, part, (labels.le, labels.others), value, line_no, &err)?
            }
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

fn cut_off(message: &str) -> String {
    format!("{message}, and the last line has no terminating line feed: the scrape was cut off")
}

fn family_of(kind: &Name) -> &'static str {
    match kind {
        Name::Hist(f, _) => f.name(),
        Name::Scalar(s) => SCALARS.iter().find(|(_, k)| k == s).map_or("", |(n, _)| *n),
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

fn cut_line_error(line: usize, partial: &str, block: &str) -> ParseError {
    let candidates: Vec<&str> = HistogramFamily::ALL.iter().map(|f| f.name()).filter(|n| n.starts_with(partial) || partial.starts_with(n)).collect();
    let family = match candidates.as_slice() {
        [one] => (*one).to_string(),
        _ if !block.is_empty() && (block.starts_with(partial) || partial.starts_with(block)) => block.to_string(),
        _ => clip(partial).to_string(),
    };
    ParseError { line, family, message: format!("sample line {} is cut off before its value: the scrape is incomplete", excerpt(partial)) }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn valid_text_without_our_families_is_empty_not_an_error() {
        let text = "# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 46\n\n# a comment\nprocess_open_fds{a=\"b\"} 9 -12\n";
        assert_eq!(parse_kube_proxy_metrics(text).unwrap(), KubeProxyScrape::default());
    }

    pub(super) fn err(text: &str) -> (usize, String, String) {
        let e = parse_kube_proxy_metrics(text).unwrap_err();
        (e.line, e.family, e.message)
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

    #[test]
    fn garbage_never_panics() {
        for input in
            ["", "\n", "{", "kubeproxy_", "kubeproxy_x{", "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"\\", "kubernetes_build_info{a=\"é\\"]
        {
            let _ = parse_kube_proxy_metrics(input);
        }
    }
}
