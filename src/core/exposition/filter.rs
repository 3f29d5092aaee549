//! The node agent's filter: a kube-proxy scrape reduced to the metric families this project
//! reads ([`super::parse::read_families`]), so that nothing else kube-proxy exposes (Go
//! runtime, process, `rest_client_*`, feature gates, ...) leaves the node. Pure, no I/O.
//!
//! The kept lines are copied byte for byte, in order, so the operator's parser reads the
//! filtered body exactly as it reads the full one: [`parse_kube_proxy_metrics`] of both gives
//! the same [`super::KubeProxyScrape`] (the tests check this on every real scrape in
//! `tests/data/metrics/`). Only a body that parses should be filtered: a cut-off or garbled
//! line of a family that is dropped would otherwise disappear instead of being reported
//! (the agent parses first and answers 502 with the parser's error).
//!
//! [`parse_kube_proxy_metrics`]: super::parse_kube_proxy_metrics

use super::parse::{read_families, reads_sample};

/// The lines of `text` (a kube-proxy `/metrics` body) that belong to a family the parser
/// reads: their samples (`_bucket`, `_sum` and `_count` series of the histograms included)
/// and their `# HELP`/`# TYPE` lines. Every other line, plain comments and blank lines
/// included, is dropped. Line endings are kept as they are.
pub fn filter_kube_proxy_metrics(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(64 * 1024));
    for line in text.split_inclusive('\n') {
        let body = line.trim_start_matches([' ', '\t']);
        let keep = match body.strip_prefix('#') {
            // as the parser reads them: only `#` and a blank start a `# HELP`/`# TYPE` line
            Some(comment) => {
                let mut tokens = comment.split([' ', '\t', '\r', '\n']).filter(|t| !t.is_empty());
                comment.starts_with([' ', '\t'])
                    && matches!(tokens.next(), Some("HELP" | "TYPE"))
                    && tokens.next().is_some_and(|family| read_families().any(|f| f == family))
            }
            None => {
                let name_end = body.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(body.len());
                name_end > 0 && reads_sample(&body[..name_end])
            }
        };
        if keep {
            out.push_str(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::exposition::parse_kube_proxy_metrics;

    /// The real scrapes of tests/data/metrics/ that parse (the truncated Windows one does not),
    /// the v1.13 one a whole scrape of 44 families.
    const SCRAPES: [(&str, &str); 3] = [
        ("v1.13", include_str!("../../../tests/data/metrics/kube-proxy-v1.13-legacy-microseconds.txt")),
        ("v1.29", include_str!("../../../tests/data/metrics/kube-proxy-v1.29-iptables-excerpt.txt")),
        ("v1.8", include_str!("../../../tests/data/metrics/kube-proxy-v1.8-legacy-nan-excerpt.txt")),
    ];

    /// The family a kept line belongs to: the name of a `# HELP`/`# TYPE` line, or a sample's
    /// name without a histogram suffix when the base is a read family.
    fn family(line: &str) -> String {
        let line = line.trim_start();
        if let Some(c) = line.strip_prefix('#') {
            return c.split_whitespace().nth(1).unwrap_or_default().to_string();
        }
        let name: String = line.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect();
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix).filter(|b| read_families().any(|f| f == *b)) {
                return base.to_string();
            }
        }
        name
    }

    #[test]
    fn only_the_read_families_leave_and_the_parser_reads_the_same_scrape() {
        let allowed: Vec<&str> = read_families().collect();
        for (name, full) in SCRAPES {
            let filtered = filter_kube_proxy_metrics(full);
            let kept: Vec<&str> = filtered.lines().collect();
            assert!(!kept.is_empty(), "{name}: nothing kept");
            for line in &kept {
                assert!(allowed.contains(&family(line).as_str()), "{name}: {line:?} is not a read family");
            }
            assert_eq!(parse_kube_proxy_metrics(&filtered), parse_kube_proxy_metrics(full), "{name}");
            assert!(filtered.len() < full.len(), "{name}: something was dropped");
        }
        // the whole v1.13 scrape: 44 families in, the legacy sync histogram and build info out
        let (_, v1_13) = SCRAPES[0];
        let families: std::collections::BTreeSet<String> = filter_kube_proxy_metrics(v1_13).lines().map(family).collect();
        assert_eq!(families.into_iter().collect::<Vec<_>>(), ["kubeproxy_sync_proxy_rules_latency_microseconds", "kubernetes_build_info"]);
        // v1.29: the no-local-endpoints counter shares the sync prefix and is not read
        let v1_29 = filter_kube_proxy_metrics(SCRAPES[1].1);
        assert!(!v1_29.contains("no_local_endpoints"), "{v1_29}");
        assert!(v1_29.contains("kubeproxy_sync_full_proxy_rules_duration_seconds_bucket"));
    }

    #[test]
    fn comments_blank_lines_and_look_alike_names_are_dropped_and_line_endings_kept() {
        let text = "# a plain comment\n\n# HELP go_goroutines x\ngo_goroutines 3\n  # TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram\r\n\
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"+Inf\"} 2\r\nkubeproxy_sync_proxy_rules_duration_seconds_total 9\n\
kubeproxy_sync_proxy_rules_duration_seconds_count 2\n#HELP kubernetes_build_info y\nkubernetes_build_info{git_version=\"v1\"} 1";
        assert_eq!(
            filter_kube_proxy_metrics(text),
            "  # TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram\r\nkubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"+Inf\"} 2\r\n\
kubeproxy_sync_proxy_rules_duration_seconds_count 2\nkubernetes_build_info{git_version=\"v1\"} 1"
        );
        assert_eq!(filter_kube_proxy_metrics(""), "");
    }
}
