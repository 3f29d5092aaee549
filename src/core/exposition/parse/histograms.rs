//! Our histograms assembled from their sample lines (the module docs of [`super`], "Our
//! histograms"): each bucket line kept per series (the labels other than `le`) with its line
//! number, then every series checked (a `+Inf` bucket, no `le` twice, cumulative counts, bounds
//! that are durations) and summed per bound into one [`Histogram`] per family.

use super::lex::{ParseError, not_a_float, parse_float};
use crate::core::exposition::histogram::{Bucket, Histogram, HistogramError};
use crate::core::exposition::scrape::{HistogramFamily, KubeProxyScrape, check_duration_bound};

/// Which sample of a histogram a line is: `_bucket`, `_sum` or `_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    Bucket,
    Sum,
    Count,
}

/// One bucket line of one of our histograms: `le` in the family's unit, the count, the line.
#[derive(Clone, Copy)]
struct BucketLine {
    le: f64,
    count: f64,
    line: usize,
}

/// One of our histogram families as its lines are read: the sum over series, each series'
/// bucket lines, and the family's last line (where an error of the whole family is reported).
#[derive(Default)]
pub(super) struct HistAcc {
    sum: Option<f64>,
    /// labels other than `le` -> that series' bucket lines (a map: scrapes can hold many series)
    series: std::collections::HashMap<String, Vec<BucketLine>>,
    last_line: usize,
}

impl HistAcc {
    /// Records one sample line (`line_no`) of histogram family `fam`: a bucket (its `le` and a
    /// finite count >= 0, kept per series of the other labels), the sum (in seconds, summed
    /// over series), or the count (checked, not kept: the `+Inf` bucket holds the same number).
    /// `le` is the sample's `le` label as written, `series` its other labels
    /// (`name="value",...`); `err` makes the line's error.
    pub(super) fn add(
        &mut self,
        fam: HistogramFamily,
        part: Part,
        (le, series): (Option<&str>, String),
        value: f64,
        line_no: usize,
        err: &dyn Fn(String) -> ParseError,
    ) -> Result<(), ParseError> {
        self.last_line = line_no;
        match part {
            Part::Bucket => {
                let written = le.ok_or_else(|| err("bucket sample without an `le` label".into()))?;
                let le = bucket_bound(written).map_err(err)?;
                if value < 0.0 {
                    return Err(err(format!("bucket le=\"{written}\" has a negative count {value}")));
                }
                if !value.is_finite() {
                    return Err(err(format!("bucket le=\"{written}\" has the count {value}: a bucket counts observations (a finite number)")));
                }
                self.series.entry(series).or_default().push(BucketLine { le, count: value, line: line_no });
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
pub(super) fn finish_histograms(mut hists: [Option<HistAcc>; 5], out: &mut KubeProxyScrape) -> Result<(), ParseError> {
    for fam in HistogramFamily::ALL {
        let Some(acc) = hists[fam.index()].take() else { continue };
        let buckets = check_series(fam, acc.series, acc.last_line)?;
        let hist = match Histogram::new(buckets, acc.sum) {
            Ok(h) => h,
            Err(HistogramError::Empty) => continue, // only _sum/_count lines: nothing to read
            Err(e) => return Err(ParseError { line: acc.last_line, family: fam.name().to_string(), message: e.to_string() }),
        };
        out.set_classic(fam, hist);
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::super::tests::err;
    use super::super::{parse_kube_proxy_metrics, parse_kube_proxy_metrics_strict};

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
}
