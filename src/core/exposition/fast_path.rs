//! The text parser's fast path for the families it does not read ([`plain_unrelated_sample`]).
//!
//! Most of a scrape is families this reader does not interpret (Go runtime, `rest_client_*`,
//! `kubernetes_feature_enabled`): 5,000 nodes x 78 KB is 390 MB a cycle. Skipping such lines with
//! a prefix test would be fast and blind; putting them through the full check
//! ([`parse_kube_proxy_metrics_strict`](super::parse::parse_kube_proxy_metrics_strict)) is
//! several times slower. [`parse_kube_proxy_metrics`](super::parse::parse_kube_proxy_metrics)
//! keeps **every check on every line** and makes the common case cheap instead (the figures:
//! docs/benchmarks/parse.md "analyze"):
//!
//! * **What the fast path checks.** A line written in the plain form servers use (no blanks but
//!   one space before the value and one before a timestamp; see `plain_unrelated_sample`) is
//!   checked in one left-to-right scan that also finds its line feed: name and label bytes by
//!   table, label values to the closing quote with escapes, the value's float syntax, the
//!   timestamp's digits, the line's end. It answers "valid" or "not sure"; "not sure" sends the
//!   line to the full check, which reads it (indented lines, tabs, `+5`, `1e-400`, ...) or names
//!   what is wrong, with the same message as before. So it can never accept a line the full
//!   check rejects; the tests compare the two parsers on random, mutated and cut scrapes.
//! * **What it skips: work, not checks.** The float conversion of values nobody reads (the
//!   syntax is checked, and the form it accepts, at most 64 bytes with an exponent of at most two
//!   digits, cannot be out of the float64 range); a second pass to find the line feed; and the
//!   re-scan of a prefix repeated from the line before: when a line starts with the same bytes as
//!   the previous (fast-path) line up to one of its label starts (a histogram's bucket lines
//!   differ only from `le` on), the scan goes on from there, since its state at that point
//!   depends only on the bytes before it. Lines of our families, comments, blank and indented
//!   lines, and the last line of a body without its final line feed always take the full check:
//!   a cut body shows in that last line, whatever the family.
//! * **Why every check stays.** Checking only the last line of unrelated families would see a
//!   cut body at the skip speed, but a garbled line inside them (an error page or a second
//!   writer spliced into the body, a wrong port) would read as "no data" and `analyze` would
//!   exit 0 on it; the strict parser reports those, and the fast path keeps them reported at
//!   several times the full check's throughput (docs/benchmarks/parse.md "analyze").
//!

/// Byte classes for [`plain_unrelated_sample`], one bit each.
const NAME_START: u8 = 1; // [a-zA-Z_:]: first byte of a metric name
const NAME_REST: u8 = 2; // [a-zA-Z0-9_:]
const LABEL_START: u8 = 4; // [a-zA-Z_]: first byte of a label name
const LABEL_REST: u8 = 8; // [a-zA-Z0-9_]
const DIGIT: u8 = 16; // [0-9]

/// [`NAME_START`] ... [`DIGIT`] for every byte value (non-ASCII bytes have none).
static CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0usize;
    while b < 256 {
        let c = b as u8;
        let alpha = c.is_ascii_alphabetic() || c == b'_';
        let digit = c.is_ascii_digit();
        let mut k = 0;
        if alpha || c == b':' {
            k |= NAME_START | NAME_REST;
        }
        if digit {
            k |= NAME_REST | LABEL_REST | DIGIT;
        }
        if alpha {
            k |= LABEL_START | LABEL_REST;
        }
        t[b] = k;
        b += 1;
    }
    t
};

/// The length of the leading run of `s[from..]` whose bytes have a `class` bit in [`CLASS`].
#[inline(always)]
fn class_run(s: &[u8], from: usize, class: u8) -> usize {
    s[from..].iter().position(|&b| CLASS[b as usize] & class == 0).unwrap_or(s.len() - from)
}

/// Where the fast path may take up the next line: the previous line, which it accepted, and
/// within that line the offsets just after its `{` and of its last label's name (0: none).
#[derive(Clone, Copy)]
pub(super) struct Resume {
    line: usize,
    brace: usize,
    last_label: usize,
}

/// The fast path. `Some(length of the line, line feed included)` only when the line that starts
/// at byte `at` of `text` is a sample line of a family this parser does not read, in the plain
/// form servers write, ended by a line feed, and the full check would accept it; `None` says
/// nothing: the line then goes through the full check, which reads it or names what is wrong.
/// So every `Some` must be a line the full check accepts, to the byte:
/// - the name is `[a-zA-Z_:][a-zA-Z0-9_:]*`, followed by `{` or a space, and is neither
///   `kubeproxy_*` nor `kubernetes_build_info` (the full check reads those);
/// - each label is `[a-zA-Z_][a-zA-Z0-9_]*="..."`, the value running to the first `"` not
///   escaped by a backslash (the full check's rule), separated by `,`, an optional trailing
///   comma, then `}`;
/// - the value is a [`plain_float_len`] float and the timestamp, if any, `-?[0-9]+`, each after
///   one space, then `\n` or `\r\n` (no other blanks anywhere, no indentation).
///
/// `resume`: the previous line when the fast path accepted it, else `None`; updated. The scan
/// reads left to right and never looks past the byte it decides on, so when this line's first
/// bytes equal the previous line's up to one of its label starts, the scan is in the same
/// state there and goes on from that point (a histogram's bucket lines differ only from `le`).
#[inline]
pub(super) fn plain_unrelated_sample(text: &[u8], at: usize, resume: &mut Option<Resume>) -> Option<usize> {
    let line = &text[at..];
    let same_to = |r: &Resume, n: usize| n > 0 && line.get(..n) == text.get(r.line..r.line + n);
    let (mut i, brace) = match resume.take() {
        Some(r) if same_to(&r, r.last_label) => (r.last_label, r.brace),
        Some(r) if same_to(&r, r.brace) => (r.brace, r.brace),
        _ => {
            let first = *line.first()?;
            if CLASS[first as usize] & NAME_START == 0 {
                return None; // blank (indented or empty line), `#`, a digit or garbage
            }
            // our families before the name is scanned (they are most lines of a dense scrape)
            if first == b'k' && line.starts_with(b"kubeproxy_") {
                return None;
            }
            let i = 1 + class_run(line, 1, NAME_REST);
            if first == b'k' && &line[..i] == b"kubernetes_build_info" {
                return None;
            }
            if line.get(i) == Some(&b'{') { (i + 1, i + 1) } else { (i, 0) }
        }
    };
    let mut last_label = 0;
    if brace > 0 {
        loop {
            match line.get(i) {
                Some(b'}') => break,
                Some(&b) if CLASS[b as usize] & LABEL_START != 0 => {}
                _ => return None,
            }
            last_label = i;
            i += 1 + class_run(line, i + 1, LABEL_REST);
            if line.get(i) != Some(&b'=') || line.get(i + 1) != Some(&b'"') {
                return None;
            }
            i += 2;
            loop {
                match *line.get(i)? {
                    b'"' => break,
                    // a backslash escapes the next byte, but not the line's end
                    b'\\' if !matches!(line.get(i + 1), Some(b'\n') | None) => i += 2,
                    b'\\' | b'\n' => return None,
                    _ => i += 1,
                }
            }
            i += 1;
            match line.get(i) {
                Some(b',') => i += 1,
                Some(b'}') => break,
                _ => return None,
            }
        }
        i += 1; // the `}`
    }
    if line.get(i) != Some(&b' ') {
        return None;
    }
    i += 1;
    i += plain_float_len(&line[i..])?;
    if line.get(i) == Some(&b' ') {
        i += 1;
        i += usize::from(line.get(i) == Some(&b'-'));
        let digits = class_run(line, i, DIGIT);
        if digits == 0 {
            return None;
        }
        i += digits;
    }
    i += usize::from(line.get(i) == Some(&b'\r'));
    if line.get(i) != Some(&b'\n') {
        return None;
    }
    *resume = Some(Resume { line: at, brace, last_label });
    Some(i + 1)
}

/// The length of the float at the start of `v`, only for values [`parse_float`] accepts, in the
/// forms servers write: `NaN`, `+Inf`, `-Inf`, `Inf`, and `-?D+(.D+)?([eE][+-]?D{1,2})?` (`D` a
/// digit) of at most 64 bytes, always within the float64 range (below 1e163). The caller checks
/// what follows (the float's end is where the scan stops). `None` for anything else (hexadecimal
/// floats, a leading `+` or `.`, long exponents): the full check decides.
#[inline]
fn plain_float_len(v: &[u8]) -> Option<usize> {
    let digits = |from: usize| class_run(v, from, DIGIT);
    let mut i = usize::from(v.first() == Some(&b'-'));
    let int = digits(i);
    if int == 0 {
        return [&b"NaN"[..], b"+Inf", b"-Inf", b"Inf"].into_iter().find(|s| v.starts_with(s)).map(<[u8]>::len);
    }
    i += int;
    if v.get(i) == Some(&b'.') {
        let frac = digits(i + 1);
        if frac == 0 {
            return None;
        }
        i += 1 + frac;
    }
    if matches!(v.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(v.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let exp = digits(i);
        if exp == 0 || exp > 2 {
            return None;
        }
        i += exp;
    }
    (i <= 64).then_some(i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::exposition::parse::{KubeProxyScrape, parse_kube_proxy_metrics, parse_kube_proxy_metrics_strict};

    /// Whether the fast path takes `line` (a line feed added), with no previous line.
    fn fast(line: &str) -> bool {
        plain_unrelated_sample(format!("{line}\n").as_bytes(), 0, &mut None).is_some()
    }

    /// A line that repeats the previous one up to a label start is taken up there: what follows
    /// is still checked, and a line that differs earlier is scanned whole.
    #[test]
    fn fast_path_takes_up_a_repeated_prefix_and_checks_the_rest() {
        let prev = "a_bucket{host=\"h\",le=\"1\"} 1\n";
        let resume_after = |next: &str| {
            let text = format!("{prev}{next}\n");
            let mut resume = None;
            assert_eq!(plain_unrelated_sample(text.as_bytes(), 0, &mut resume), Some(prev.len()));
            let got = plain_unrelated_sample(text.as_bytes(), prev.len(), &mut resume).is_some();
            assert_eq!(parse_kube_proxy_metrics(&text), parse_kube_proxy_metrics_strict(&text), "{next:?}");
            (got, resume.map(|r| (r.line, r.brace, r.last_label)))
        };
        // from the last label (`le`), from after `{`, and from the start
        assert_eq!(resume_after("a_bucket{host=\"h\",le=\"+Inf\"} 2"), (true, Some((prev.len(), 9, 18))));
        assert_eq!(resume_after("a_bucket{host=\"i\",le=\"2\"} 2"), (true, Some((prev.len(), 9, 18))));
        assert_eq!(resume_after("a_sum{host=\"h\"} 2.5"), (true, Some((prev.len(), 6, 6))));
        assert_eq!(resume_after("a_count 2"), (true, Some((prev.len(), 0, 0))));
        // broken after the repeated part, and shorter than it
        for next in [
            "a_bucket{host=\"h\",le=\"2} 2",
            "a_bucket{host=\"h\",le=\"2\"}",
            "a_bucket{host=\"h\",",
            "a_bucket{host=\"h\",9=\"\"} 1",
            "a_bucket{host=\"h\",le=\"2\"} 1 2 3",
            "a_bu",
        ] {
            assert_eq!(resume_after(next), (false, None), "{next:?}");
            assert!(parse_kube_proxy_metrics(&format!("{prev}{next}\n")).is_err(), "{next:?}");
        }
    }

    /// The plain lines servers write for families we do not read take the fast path, and the
    /// full check accepts each of them.
    #[test]
    fn fast_path_vouches_for_plain_unrelated_lines() {
        for line in [
            "go_goroutines 46",
            "go_gc_duration_seconds{quantile=\"0.25\"} 5.9e-05",
            "rest_client_request_duration_seconds_bucket{host=\"10.0.0.1:6443\",verb=\"GET\",le=\"+Inf\"} 5012",
            "rest_client_requests_total{code=\"200\",host=\"a\",method=\"GET\",} 7 1700000000000",
            "process_start_time_seconds 1.75489479939E+09 -12",
            "x:y{a=\"é \\\" \\\\\"} NaN",
            "go_info{} -Inf",
            "_a{b=\"\"} 0",
            "kubeproxy 1",
            "kubernetes_build_info_x 1",
        ] {
            assert!(fast(line), "{line:?}");
            assert_eq!(parse_kube_proxy_metrics_strict(&format!("{line}\n")), Ok(KubeProxyScrape::default()), "{line:?}");
        }
    }

    /// Everything else goes to the full check: other valid forms (which it reads), our families,
    /// comments, blank lines, and every broken line (which it names).
    #[test]
    fn fast_path_leaves_every_other_line_to_the_full_check() {
        let cases: [(&str, bool); 37] = [
            // valid, but not in the plain form
            ("  go_goroutines 46", true),
            ("\tgo_goroutines 46", true),
            ("go_goroutines\t46", true),
            ("go_goroutines  46", true),
            ("go_goroutines 46 ", true),
            ("go_goroutines{ a=\"b\"} 46", true),
            ("go_goroutines{a=\"b\"}46", true),
            ("go_goroutines 1e-400", true),
            ("go_goroutines .5", true),
            ("go_goroutines +5", true),
            ("go_goroutines 1.", true),
            ("go_goroutines inf", true),
            // ours, a kubeproxy_ family we do not read, comments and blank lines
            ("kubeproxy_sync_proxy_rules_iptables_total 7", true),
            ("kubernetes_build_info{git_version=\"v1\"} 1", true),
            ("kubeproxy_unrelated_family 1", true),
            ("# HELP go_goroutines x", true),
            ("# any comment", true),
            ("", true),
            // broken
            ("go_goroutines forty", false),
            ("go_goroutines", false),
            ("go_goroutines ", false),
            ("go_goroutines 46 1.5", false),
            ("go_goroutines 46 12 9", false),
            ("go_goroutines 1e400", false),
            ("go_goroutines 0x1p-2", false),
            ("go_goroutines 1e", false),
            ("go_goroutines -", false),
            ("go_goroutines{a=\"b} 46", false),
            ("go_goroutines{a=\"b\\\"} 46", false),
            ("go_goroutines{a=\"b\\", false),
            ("go_goroutines{a=b} 46", false),
            ("go_goroutines{9a=\"b\"} 46", false),
            ("go_goroutines{a=\"b\"c=\"d\"} 46", false),
            ("go_goroutines{a=\"b\",,} 46", false),
            ("9go 46", false),
            ("go-goroutines 46", false),
            ("<html>", false),
        ];
        for (line, valid) in cases {
            assert!(!fast(line), "{line:?}");
            assert_eq!(parse_kube_proxy_metrics_strict(&format!("{line}\n")).is_ok(), valid, "{line:?}");
        }
    }

    /// Lines near the plain form: valid ones, and ones a byte or a token away from valid.
    fn near_plain_line() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let name = prop_oneof![
            4 => "[a-zA-Z_:][a-zA-Z0-9_:]{0,6}",
            1 => Just("kubeproxy_x".to_string()),
            1 => "[a-zA-Z_:9-][a-zA-Z0-9_:.-]{0,6}",
        ];
        let label_name = prop_oneof![4 => "[a-zA-Z_][a-zA-Z0-9_]{0,3}", 1 => "[a-zA-Z_9 ][a-zA-Z0-9_ ]{0,3}"];
        let label_value = prop_oneof![4 => "[a-z0-9 .,{}=é]{0,6}", 1 => "[a-z0-9 .,{}=é\\\\\"]{0,6}"];
        let label = (label_name, label_value).prop_map(|(n, v)| format!("{n}=\"{v}\""));
        let labels = prop_oneof![
            Just(String::new()),
            (prop::collection::vec(label, 0..3), any::<bool>()).prop_map(|(l, comma)| format!("{{{}{}}}", l.join(","), if comma { "," } else { "" })),
        ];
        let value = prop_oneof![
            1 => Just("NaN".to_string()),
            1 => Just("+Inf".to_string()),
            4 => "-?[0-9]{1,3}(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,2})?",
            2 => "[+-]?[0-9]{0,3}(\\.[0-9]{0,3})?([eE][+-]?[0-9]{0,4})?",
            1 => "[0-9a-zA-Z.+-]{0,5}",
        ];
        let ts = prop_oneof![3 => Just(String::new()), 1 => "( -?[0-9]{0,14})"];
        let edit = prop_oneof![
            3 => Just(None),
            1 => (any::<proptest::sample::Index>(), prop::sample::select(vec!["", " ", "\t", "\"", "\\", "{", "}", ",", "=", "é", "x", "\r"]), any::<bool>()).prop_map(Some),
        ];
        (name, labels, value, ts, edit).prop_map(|(n, l, v, ts, edit)| {
            let mut line = format!("{n}{l} {v}{ts}");
            if let Some((at, insert, delete)) = edit {
                // a byte index on a character boundary
                let i = (0..=at.index(line.len() + 1)).rev().find(|&i| line.is_char_boundary(i)).unwrap_or(0);
                if delete && i < line.len() {
                    line.remove(i);
                }
                line.insert_str(i.min(line.len()), insert);
            }
            line
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 4000, ..Default::default() })]

        /// The fast path vouches only for lines the full check accepts: with or without it, a
        /// line (terminated or last without its line feed) parses to the same result or error.
        #[test]
        fn fast_path_vouches_only_for_lines_the_full_check_accepts(line in near_plain_line(), newline in proptest::prelude::any::<bool>()) {
            if fast(&line) {
                proptest::prop_assert_eq!(parse_kube_proxy_metrics_strict(&format!("{line}\n")), Ok(KubeProxyScrape::default()));
            }
            let text = format!("# TYPE go_x gauge\n{line}{}", if newline { "\n" } else { "" });
            proptest::prop_assert_eq!(parse_kube_proxy_metrics(&text), parse_kube_proxy_metrics_strict(&text));
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 2000, ..Default::default() })]

        /// Lines that repeat the one before up to any byte, then differ: the fast path (which
        /// takes up a repeated prefix at a label start) gives the full check's result.
        #[test]
        fn fast_path_on_lines_sharing_a_prefix_gives_the_full_checks_result(
            lines in proptest::collection::vec((near_plain_line(), proptest::prelude::any::<proptest::sample::Index>()), 1..6),
            newline in proptest::prelude::any::<bool>(),
        ) {
            let mut text = String::from("# TYPE go_x gauge\n");
            let mut prev = String::new();
            for (line, keep) in lines {
                // the previous line's first `keep` bytes, then this one's from the same point
                let k = (0..=keep.index(prev.len() + 1)).rev().find(|&k| prev.is_char_boundary(k) && line.is_char_boundary(k.min(line.len()))).unwrap_or(0);
                let next = format!("{}{}", &prev[..k], &line[k.min(line.len())..]);
                text.push_str(&next);
                text.push('\n');
                prev = next;
            }
            if !newline {
                text.pop();
            }
            proptest::prop_assert_eq!(parse_kube_proxy_metrics(&text), parse_kube_proxy_metrics_strict(&text));
        }
    }

    /// The property above is not vacuous: its lines take both sides of the fast path, and many
    /// that do not are errors.
    #[test]
    fn near_plain_lines_take_both_sides_of_the_fast_path() {
        use proptest::strategy::{Strategy, ValueTree};
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let (mut taken, mut invalid) = (0, 0);
        for _ in 0..2000 {
            let line = near_plain_line().new_tree(&mut runner).unwrap().current();
            taken += usize::from(fast(&line));
            invalid += usize::from(parse_kube_proxy_metrics_strict(&format!("{line}\n")).is_err());
        }
        assert!(taken > 500 && invalid > 300, "fast path taken {taken} times, {invalid} invalid lines of 2000");
    }
}
