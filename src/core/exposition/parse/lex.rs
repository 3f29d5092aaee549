//! The text exposition's line grammar (the module docs of [`super`], "What is an error",
//! "Syntax"): a sample line split into its name, labels and value, a comment line checked, Go's
//! float syntax, and [`ParseError`], the error that names a line, with the excerpts its messages
//! quote. Byte-wise, since it runs on every line and every delimiter is ASCII.

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

/// The blanks the grammar skips between tokens and before a line's first one.
pub(super) const BLANKS: [char; 2] = [' ', '\t'];

/// Go `strconv.ParseFloat` as Prometheus uses it: decimal/exponent forms, `NaN`, `+Inf`, `-Inf`
/// (case-insensitive, `Inf`/`Infinity`).
/// Errors: `None` for text that is not a float, and for a finite decimal beyond the float64
/// range (`1e400`), which Go's `ParseFloat` refuses with `ErrRange` (an underflow such as
/// `1e-400` is 0 there too, without an error).
pub(super) fn parse_float(s: &str) -> Option<f64> {
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
pub(super) fn shown(name: &str) -> String {
    let head = clip(name);
    if head.len() == name.len() { name.to_string() } else { format!("{head}... ({} bytes)", name.len()) }
}

/// The first [`EXCERPT_BYTES`] of `s`, cut at a character boundary.
pub(super) fn clip(s: &str) -> &str {
    let mut end = s.len().min(EXCERPT_BYTES);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The message for a token [`parse_float`] refused: `what` (e.g. "value") names it.
pub(super) fn not_a_float(what: &str, tok: &str) -> String {
    let quoted = excerpt(tok);
    if tok.parse::<f64>().is_ok_and(f64::is_infinite) {
        format!("{what} {quoted} is beyond the float64 range (Prometheus' parser refuses it too)")
    } else {
        format!("{what} {quoted} is not a number")
    }
}

/// Why a line is not exposition syntax.
#[derive(Debug)]
pub(super) enum SyntaxError {
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
pub(super) fn skip_blanks(s: &str) -> &str {
    &s[run_len(s, |b| b == b' ' || b == b'\t')..]
}

/// The length of the leading run of bytes for which `ascii` holds; `ascii` accepts ASCII bytes
/// only, so the run ends on a character boundary.
#[inline]
pub(super) fn run_len(s: &str, ascii: impl Fn(u8) -> bool) -> usize {
    s.bytes().position(|b| !ascii(b)).unwrap_or(s.len())
}

#[inline]
pub(super) fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

#[inline]
pub(super) fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// The first character of `s`, for messages.
pub(super) fn first_char(s: &str) -> char {
    s.chars().next().unwrap_or(' ')
}

/// Checks a sample line (`body`: leading blanks removed; `name_end`: where the metric name
/// ends) against the grammar in the module docs, passes each label to `each` (see
/// [`scan_labels`]) and returns the value. Byte-wise: every delimiter is ASCII, and this runs on
/// every line of the scrape.
pub(super) fn split_sample<'a>(body: &'a str, name_end: usize, each: impl FnMut(&'a str, &'a str, bool) -> Result<(), String>) -> Result<f64, SyntaxError> {
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
pub(super) fn scan_labels<'a>(s: &'a str, mut each: impl FnMut(&'a str, &'a str, bool) -> Result<(), String>) -> Result<&'a str, String> {
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
pub(super) fn check_comment(s: &str) -> Result<Option<&str>, (&str, String)> {
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
    use super::super::parse_kube_proxy_metrics;
    use super::super::tests::err;
    use super::excerpt;

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
}
