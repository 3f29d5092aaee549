//! The parser's fast path for families it does not read: it must not lose an error
//! the full check reports. Here on a scrape that is mostly such families, with the two cases
//! that made the parser check them at all (commit a607ad6): a body cut inside an unrelated
//! family, which used to pass as "no data", and indented lines, which used to be dropped.
//! `parse_kube_proxy_metrics_strict` is the same parser with every line through the full check.

use safe_termination::core::exposition::parse::parse_kube_proxy_metrics_strict;
use safe_termination::core::exposition::{KubeProxyScrape, ParseError, parse_kube_proxy_metrics};

/// Unrelated families as kube-proxy serves them before its own (client_golang sorts by name).
const BEFORE: &str = "\
# HELP go_gc_duration_seconds A summary of the wall-time pause (stop-the-world) duration in garbage collection cycles.
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile=\"0\"} 2.2652e-05
go_gc_duration_seconds{quantile=\"0.25\"} 5.9e-05
go_gc_duration_seconds{quantile=\"1\"} 0.001042
go_gc_duration_seconds_sum 0.294305823
go_gc_duration_seconds_count 755
# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 46
# HELP go_info Information about the Go environment.
# TYPE go_info gauge
go_info{version=\"go1.24.4\"} 1
";

/// One family we read.
const OURS: &str = "\
# HELP kubeproxy_sync_proxy_rules_duration_seconds [ALPHA] SyncProxyRules latency in seconds
# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.001\"} 0
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.128\"} 3012
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"+Inf\"} 4000
kubeproxy_sync_proxy_rules_duration_seconds_sum 148.4
kubeproxy_sync_proxy_rules_duration_seconds_count 4000
";

/// Unrelated families after ours: labelled histograms and counters, escapes, a timestamp.
const AFTER: &str = "\
# HELP rest_client_request_duration_seconds [ALPHA] Request latency in seconds. Broken down by verb, and host.
# TYPE rest_client_request_duration_seconds histogram
rest_client_request_duration_seconds_bucket{host=\"10.96.0.1:443\",verb=\"GET\",le=\"0.005\"} 2154
rest_client_request_duration_seconds_bucket{host=\"10.96.0.1:443\",verb=\"GET\",le=\"0.025\"} 2991
rest_client_request_duration_seconds_bucket{host=\"10.96.0.1:443\",verb=\"GET\",le=\"+Inf\"} 3007
rest_client_request_duration_seconds_sum{host=\"10.96.0.1:443\",verb=\"GET\"} 18.25
rest_client_request_duration_seconds_count{host=\"10.96.0.1:443\",verb=\"GET\"} 3007
# HELP rest_client_requests_total [ALPHA] Number of HTTP requests, partitioned by status code, method, and host.
# TYPE rest_client_requests_total counter
rest_client_requests_total{code=\"200\",host=\"10.96.0.1:443\",method=\"GET\"} 3007
rest_client_requests_total{code=\"<error>\",host=\"10.96.0.1:443\",method=\"GET\",} 2 1764547200000
# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.
# TYPE kubernetes_feature_enabled gauge
kubernetes_feature_enabled{name=\"Say\\\"Hello\\\\\",stage=\"\"} 0
kubernetes_feature_enabled{name=\"NFTablesProxyMode\",stage=\"BETA\"} 1
";

fn scrape() -> String {
    format!("{BEFORE}{OURS}{AFTER}")
}

/// The full scrape's sync histogram is read, with the families around it taking the fast path.
#[test]
fn the_scrape_parses_and_reads_our_family() {
    let s = parse_kube_proxy_metrics(&scrape()).unwrap();
    assert_eq!(s.sync.as_ref().map(|h| h.count()), Some(4000.0));
    assert_eq!(parse_kube_proxy_metrics_strict(&scrape()), Ok(s));
}

/// The family of the `# HELP`/`# TYPE` block each line of `text` sits in ("" before any).
fn blocks(text: &str) -> Vec<&str> {
    let mut block = "";
    text.split_inclusive('\n')
        .map(|line| {
            if let Some(rest) = line.strip_prefix("# HELP ").or_else(|| line.strip_prefix("# TYPE ")) {
                block = rest.split(' ').next().unwrap_or("");
            }
            block
        })
        .collect()
}

/// Cut at every byte: the result is the full check's, and a cut inside the name or labels of a
/// sample of an unrelated family, or before its value, is an error naming that line and family.
/// A cut inside the value or timestamp leaves a complete line, accepted as the module docs say.
#[test]
fn a_body_cut_inside_an_unrelated_family_is_an_error_at_every_byte() {
    let text = scrape();
    let blocks = blocks(&text);
    let mut start = 0;
    let mut checked = 0;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let body = line.trim_end_matches('\n');
        let unrelated_sample = !body.starts_with('#') && !body.starts_with("kubeproxy_");
        // where the value starts: after the space that follows the name or the label set
        let value_at = body.rfind("} ").map_or_else(|| body.find(' ').unwrap_or(0), |p| p + 1) + 1;
        for n in start + 1..start + line.len() {
            let cut = &text[..n];
            let got = parse_kube_proxy_metrics(cut);
            assert_eq!(got, parse_kube_proxy_metrics_strict(cut), "cut at byte {n}");
            if unrelated_sample && n - start <= value_at {
                let e = got.expect_err(&format!("cut at byte {n} inside {:?} was accepted", &text[start..n]));
                assert_eq!((e.line, e.family.as_str()), (i + 1, blocks[i]), "cut at byte {n}: {e}");
                checked += 1;
            }
        }
        start += line.len();
    }
    assert!(checked > 800, "{checked} cuts checked");
}

/// A cut whose last line is a comment is an error wherever it is; one at a line boundary leaves
/// a valid exposition (the documented limit), read as the full check reads it.
#[test]
fn cuts_at_comments_and_line_boundaries() {
    let text = scrape();
    let at = text.find("# HELP rest_client_requests_total").unwrap();
    let e = parse_kube_proxy_metrics(&text[..at + 45]).unwrap_err();
    assert_eq!((e.line, e.family.as_str()), (text[..at].lines().count() + 1, "rest_client_requests_total"));
    let cut = &text[..at];
    assert_eq!(parse_kube_proxy_metrics(cut).unwrap().sync.map(|h| h.count()), Some(4000.0));
}

/// Indented lines are read like any other (Prometheus skips blanks before a line's first token
/// and between tokens): they are not the plain form and take the full check.
#[test]
fn indented_scrape_reads_like_the_plain_one() {
    let text = scrape();
    let indented: String = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let l = if i % 3 == 0 { l.replacen(' ', " \t ", 1) } else { l.to_string() };
            format!("{}{l}\n", ["  ", "\t", ""][i % 3])
        })
        .collect();
    assert_ne!(indented, text);
    assert_eq!(parse_kube_proxy_metrics(&indented), parse_kube_proxy_metrics(&text));
    assert_eq!(parse_kube_proxy_metrics_strict(&indented), parse_kube_proxy_metrics(&text));
}

/// An indented line of an unrelated family is checked like any other: garbled, or cut at the end
/// of the body, it is an error naming the line and the family.
#[test]
fn indented_broken_unrelated_lines_are_errors() {
    let err = |text: &str| -> ParseError {
        let e = parse_kube_proxy_metrics(text).unwrap_err();
        assert_eq!(parse_kube_proxy_metrics_strict(text), Err(e.clone()));
        e
    };
    let head = "# TYPE go_goroutines gauge\n";
    let e = err(&format!("{head}  go_goroutines forty\n"));
    assert_eq!((e.line, e.family.as_str(), e.message.as_str()), (2, "go_goroutines", "value \"forty\" is not a number"));
    let e = err(&format!("{head}\tgo_goroutines{{a=\"b\" 46\n"));
    assert_eq!((e.line, e.family.as_str()), (2, "go_goroutines"));
    let e = err(&format!("{head}go_goroutines 46\n  go_goroutines{{a=\"b"));
    assert_eq!((e.line, e.family.as_str()), (3, "go_goroutines"));
    assert!(e.message.ends_with("the scrape was cut off"), "{}", e.message);
    // indented and complete: accepted
    assert_eq!(parse_kube_proxy_metrics(&format!("{head}\t go_goroutines{{a=\"b\"}}\t46 \n")), Ok(KubeProxyScrape::default()));
}

/// A garbled line anywhere in the unrelated families is an error naming its line, as with the
/// full check: each line of the scrape in turn has one byte replaced by a byte that breaks it.
#[test]
fn a_garbled_line_anywhere_is_an_error_naming_it() {
    let text = scrape();
    let blocks = blocks(&text);
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.starts_with('#') {
            continue;
        }
        // the value becomes `x`, which no float is
        let value_at = line.rfind("} ").map_or_else(|| line.find(' ').unwrap_or(0), |p| p + 1) + 1;
        let mut broken = lines.clone();
        let garbled = format!("{}x{}", &line[..value_at], &line[value_at + 1..]);
        broken[i] = &garbled;
        let broken = broken.join("\n") + "\n";
        let e = parse_kube_proxy_metrics(&broken).unwrap_err();
        assert_eq!(Err(e.clone()), parse_kube_proxy_metrics_strict(&broken));
        let family = if line.starts_with("kubeproxy_") { "kubeproxy_sync_proxy_rules_duration_seconds" } else { blocks[i] };
        assert_eq!((e.line, e.family.as_str()), (i + 1, family), "{garbled:?}: {e}");
    }
}
