//! The propagation model: how long after an endpoint change a node's kube-proxy can still send
//! new connections to a terminating pod.
//!
//! Per node: `W = max(p99(network_programming) - 1 s, minSyncPeriod + p99(sync))`.
//! An endpoint change waits at most `minSyncPeriod` (kube-proxy's runner keeps that gap between
//! the end of one sync and the start of the next: `pkg/proxy/runner/bounded_frequency_runner.go`),
//! then the sync that removes it. A change that lands while a sync is running also waits for that
//! one; counting a second p99 sync for it (`minSyncPeriod + 2 x p99(sync)`, this model until
//! issue 11) sized every sleep for two slow syncs in a row. On real nodes (BENCHMARKS.md "Deploy
//! errors", 4,000 Services, iptables-nft) that made W 4.71 s and the sleep 8 s while no
//! terminating pod stayed in any node's rules longer than 2.56 s (and 2.81 s in the baseline run);
//! `minSyncPeriod + p99(sync)` = 2.85 s covered every observed window. Over all the experiment's
//! runs (two proxy modes, 0 and 4,000 extra Services) no window exceeded 0.90 x W; the policy's
//! safety factor (1.25 by default) is the margin on top, for a change that waits behind a running
//! slow sync. Beyond 1 s of sync p99 the advisor raises ProxySyncSlow. Network programming latency
//! measures the same path end to end from the EndpointSlice trigger time when present.
//!
//! Why `- 1 s` ([`TRIGGER_TIME_RESOLUTION_SECONDS`]): kube-proxy measures network programming
//! from the EndpointSlice annotation `endpoints.kubernetes.io/last-change-trigger-time`, which the
//! EndpointSlice controller takes from the pod's Ready condition `lastTransitionTime` or the
//! Service's `creationTimestamp` (k8s.io/endpointslice `util/trigger_time_tracker.go`,
//! `getPodTriggerTime`, `getServiceTriggerTime`). Both are `metav1.Time`, which the API carries
//! in whole seconds, so every sample is the true latency plus the truncated fraction of a second
//! (0 to 1 s). Measured on real nodes (BENCHMARKS.md "Deploy errors"): network programming p99
//! 2.55 s while no terminating pod's IP stayed in any node's rules longer than 1.09 s after its
//! deletion; the raw p99 made the sleep 5 s where 3 s covers the truth. `p99 - 1 s` is a lower
//! bound of the true p99, so network programming raises W only when the path outside kube-proxy's
//! syncs (watch and controller delays) is really slower than the syncs. The raw p99 is still
//! reported as measured (`networkProgrammingP99Seconds`).
//! The cluster window is the maximum over nodes, and the node that sets it is named.

use crate::exposition::histogram::{Histogram, Quantile};
use crate::exposition::parse::KubeProxyScrape;
use serde::Serialize;

/// The quantile the model uses (p99).
pub const QUANTILE: f64 = 0.99;

/// Resolution of the trigger times network programming latency is measured from, seconds: the
/// API's `metav1.Time` is whole seconds, so each sample overstates the latency by up to this much
/// (see the module docs). Subtracted from the network-programming p99 in W.
pub const TRIGGER_TIME_RESOLUTION_SECONDS: f64 = 1.0;

/// kube-proxy's proxy mode, as `/proxyMode` spells it (plus `ebpf` for kube-proxy replacements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ProxyMode {
    /// iptables (the Linux default; `mode: ""`).
    Iptables,
    /// nftables (alpha 1.29, beta 1.31, GA 1.33; kernel 5.13+).
    Nftables,
    /// IPVS (deprecated since 1.35).
    Ipvs,
    /// Windows kernelspace (HNS).
    Kernelspace,
    /// An eBPF dataplane replacing kube-proxy (Cilium, Calico eBPF, GKE Dataplane V2).
    Ebpf,
    /// Not known.
    #[default]
    Unknown,
}

impl ProxyMode {
    /// Parses `/proxyMode` output or a `--mode` flag (case-insensitive, surrounding space
    /// ignored; `""` is iptables as in KubeProxyConfiguration). `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "iptables" | "" => Some(Self::Iptables),
            "nftables" => Some(Self::Nftables),
            "ipvs" => Some(Self::Ipvs),
            "kernelspace" => Some(Self::Kernelspace),
            "ebpf" => Some(Self::Ebpf),
            "unknown" => Some(Self::Unknown),
            _ => None,
        }
    }

    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::Nftables => "nftables",
            Self::Ipvs => "ipvs",
            Self::Kernelspace => "kernelspace",
            Self::Ebpf => "ebpf",
            Self::Unknown => "unknown",
        }
    }

    /// Infers the mode from which families a scrape holds: the rule-count gauges
    /// (`iptables_total`, `iptables_last`) exist only in iptables mode; the nftables failure
    /// counters mean nftables. Not evidence: the full/partial sync histograms (nftables mode
    /// exports them too, seen on 1.37) and the restore-failure counters. IPVS has no family of
    /// its own, so it is never inferred: prefer `/proxyMode`.
    pub fn infer(scrape: &KubeProxyScrape) -> Option<Self> {
        if scrape.nftables_sync_failures_total.is_some() || scrape.nftables_cleanup_failures_total.is_some() {
            Some(Self::Nftables)
        } else if scrape.iptables_rules_total.is_some() || scrape.iptables_rules_last.is_some() {
            Some(Self::Iptables)
        } else {
            None
        }
    }
}

/// One node's scrapes: the latest, and optionally an earlier one of the same process for an
/// interval analysis.
#[derive(Debug, Clone)]
pub struct NodeInput {
    /// Node name (or the source label given by the user).
    pub node: String,
    /// The latest scrape.
    pub later: KubeProxyScrape,
    /// An earlier scrape; when present the analysis covers the interval between the two.
    pub earlier: Option<KubeProxyScrape>,
    /// Mode read from `/proxyMode`, when the source was a URL.
    pub proxy_mode: Option<ProxyMode>,
}

/// What interval the histograms of a node cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Interval {
    /// Since the kube-proxy process started (one scrape, cumulative counters).
    Lifetime,
    /// Between two scrapes (delta of cumulative buckets).
    BetweenScrapes,
    /// Two scrapes, but a counter went down (kube-proxy restarted): since the restart.
    SinceRestart,
    /// Two scrapes, but fewer than `minSamples` syncs happened between them (a quiet proxy
    /// syncs only on changes): kube-proxy's lifetime counters are used instead, so an idle
    /// window keeps the last evidence rather than falling back to "no data".
    LifetimeFallback,
}

/// How trustworthy a node's window is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, PartialOrd, Ord)]
pub enum Basis {
    /// Enough samples; the p99 is inside the bucket range.
    Measured,
    /// At least `minSamples` samples, and the p99 rank fell in the `+Inf` bucket: the window is
    /// at least the top bound.
    BeyondTopBucket,
    /// Fewer samples than the policy's `minSamples` (even when they lie beyond the top bucket).
    LowSampleCount,
    /// No sync or network-programming observations at all.
    NoData,
}

/// One node's measured window.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeWindow {
    /// Node name.
    pub node: String,
    /// Interval covered.
    pub interval: Interval,
    /// Proxy mode and where it came from.
    pub mode: ProxyMode,
    /// `proxyMode endpoint`, `metric families`, `flag` or `unknown`.
    pub mode_source: &'static str,
    /// kube-proxy version from `kubernetes_build_info`.
    pub kubernetes_version: Option<String>,
    /// Sync observations in the interval.
    pub sync_samples: f64,
    /// Sync duration p99 (None: family absent or no observations).
    pub sync_p99: Option<Quantile>,
    /// Network programming p99 (None: family absent or no observations).
    pub network_programming_p99: Option<Quantile>,
    /// True when the sync histogram came from the pre-1.14 microsecond family.
    pub sync_from_legacy_microseconds: bool,
    /// W for this node, seconds (None when there is no data).
    pub propagation_window_seconds: Option<f64>,
    /// How far W can be trusted.
    pub basis: Basis,
    /// `last_queued - last_synced`, seconds, when both gauges exist.
    pub stale_seconds: Option<f64>,
    /// iptables rules owned (`iptables_total`, summed over tables).
    pub iptables_rules_total: Option<f64>,
}

fn p99(h: Option<&Histogram>) -> Option<Quantile> {
    h.map(|h| h.quantile(QUANTILE)).filter(|q| q.seconds.is_finite())
}

/// Measures one node: deltas when an earlier scrape is given, p99s, W and its basis.
/// `min_sync_period_seconds` is kube-proxy's minSyncPeriod (1 s by default in iptables mode);
/// `min_samples` is the policy's `preStop.minSamples`.
pub fn measure_node(input: &NodeInput, min_sync_period_seconds: f64, min_samples: u32, mode_flag: Option<ProxyMode>) -> NodeWindow {
    let mut interval = if input.earlier.is_some() { Interval::BetweenScrapes } else { Interval::Lifetime };
    let over = |later: &Option<Histogram>, earlier: Option<&Option<Histogram>>, interval: &mut Interval| -> Option<Histogram> {
        let later = later.as_ref()?;
        match earlier.and_then(|e| e.as_ref()) {
            None => Some(later.clone()),
            Some(e) => {
                let d = later.delta_since(e);
                if d.is_reset() {
                    *interval = Interval::SinceRestart;
                }
                Some(d.histogram().clone())
            }
        }
    };
    let earlier = input.earlier.as_ref();
    let mut sync = over(&input.later.sync, earlier.map(|e| &e.sync), &mut interval);
    let mut np = over(&input.later.network_programming, earlier.map(|e| &e.network_programming), &mut interval);
    let count = |h: &Option<Histogram>| h.as_ref().map_or(0.0, Histogram::count);
    if interval == Interval::BetweenScrapes
        && count(&sync) < f64::from(min_samples)
        && count(&input.later.sync) > count(&sync)
    {
        sync = input.later.sync.clone();
        np = input.later.network_programming.clone();
        interval = Interval::LifetimeFallback;
    }
    let sync_p99 = p99(sync.as_ref());
    let np_p99 = p99(np.as_ref());
    let sync_samples = sync.as_ref().map_or(0.0, |h| h.count());
    let np_samples = np.as_ref().map_or(0.0, |h| h.count());

    let from_sync = sync_p99.map(|q| min_sync_period_seconds + q.seconds);
    let from_np = np_p99.map(|q| (q.seconds - TRIGGER_TIME_RESOLUTION_SECONDS).max(0.0));
    let window = match (from_np, from_sync) {
        (Some(a), Some(b)) => Some(a.max(b)),
        // no sync histogram: a change still waits for the next sync, at most minSyncPeriod
        // later, so W is never below it (a network-programming p99 under 1 s gave W 0)
        (Some(a), None) => Some(a.max(min_sync_period_seconds)),
        (None, b) => b,
    };
    let samples = if sync_p99.is_some() { sync_samples } else { np_samples };
    let beyond = sync_p99.is_some_and(|q| q.beyond_top_bucket) || np_p99.is_some_and(|q| q.beyond_top_bucket);
    // too few samples wins over beyond the top bucket (README "The sizing model"): a p99 of one to
    // four syncs is not trusted, however slow (a restarted kube-proxy's first, full sync is
    // often the slowest it ever does); as LowSampleCount its W still raises the sleep when no
    // node is trusted, but it neither overrides a trusted node nor raises ProxySyncSlow
    let basis = if window.is_none() {
        Basis::NoData
    } else if samples.partial_cmp(&f64::from(min_samples)).is_none_or(|o| o.is_lt()) {
        // NaN counts (a broken exposition) are "too few", never "enough"
        Basis::LowSampleCount
    } else if beyond {
        Basis::BeyondTopBucket
    } else {
        Basis::Measured
    };
    let (mode, mode_source) = match (mode_flag, input.proxy_mode, ProxyMode::infer(&input.later)) {
        (Some(m), _, _) => (m, "flag"),
        (None, Some(m), _) => (m, "proxyMode endpoint"),
        (None, None, Some(m)) => (m, "metric families"),
        _ => (ProxyMode::Unknown, "unknown"),
    };
    let stale_seconds = match (input.later.last_queued_timestamp_seconds, input.later.last_sync_timestamp_seconds) {
        (Some(q), Some(s)) if (q - s).is_finite() => Some((q - s).max(0.0)),
        _ => None,
    };
    NodeWindow {
        node: input.node.clone(),
        interval,
        mode,
        mode_source,
        kubernetes_version: input.later.kubernetes_version.clone(),
        sync_samples,
        sync_p99,
        network_programming_p99: np_p99,
        sync_from_legacy_microseconds: input.later.sync_from_legacy_microseconds,
        propagation_window_seconds: window,
        basis,
        stale_seconds,
        iptables_rules_total: input.later.iptables_rules_total,
    }
}

/// The cluster window: the worst node among those with a trusted measurement (Measured or
/// BeyondTopBucket); when none is trusted, the worst LowSampleCount node; else no data.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterWindow {
    /// The node that sets W.
    pub worst_node: Option<String>,
    /// W, seconds.
    pub propagation_window_seconds: Option<f64>,
    /// The basis of W (BeyondTopBucket when any trusted node is beyond the top bucket).
    pub basis: Basis,
}

/// Computes the cluster window from the node windows.
pub fn cluster_window(nodes: &[NodeWindow]) -> ClusterWindow {
    let worst_of = |pred: &dyn Fn(&NodeWindow) -> bool| {
        nodes
            .iter()
            .filter(|n| pred(n))
            .filter_map(|n| n.propagation_window_seconds.map(|w| (n, w)))
            .max_by(|a, b| a.1.total_cmp(&b.1).then_with(|| b.0.node.cmp(&a.0.node)))
    };
    let trusted = worst_of(&|n| matches!(n.basis, Basis::Measured | Basis::BeyondTopBucket));
    if let Some((n, w)) = trusted {
        let any_beyond = nodes.iter().any(|n| n.basis == Basis::BeyondTopBucket);
        return ClusterWindow {
            worst_node: Some(n.node.clone()),
            propagation_window_seconds: Some(w),
            basis: if any_beyond { Basis::BeyondTopBucket } else { Basis::Measured },
        };
    }
    if let Some((n, w)) = worst_of(&|n| n.basis == Basis::LowSampleCount) {
        return ClusterWindow {
            worst_node: Some(n.node.clone()),
            propagation_window_seconds: Some(w),
            basis: Basis::LowSampleCount,
        };
    }
    ClusterWindow { worst_node: None, propagation_window_seconds: None, basis: Basis::NoData }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exposition::parse_kube_proxy_metrics;

    fn scrape(count: u32) -> KubeProxyScrape {
        parse_kube_proxy_metrics(&format!(
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"0.1\"}} {count}\nkubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"+Inf\"}} {count}\n"
        ))
        .unwrap()
    }

    #[test]
    fn a_quiet_window_falls_back_to_lifetime_counters() {
        // 20 syncs in kube-proxy's life, none in the window
        let input = NodeInput { node: "n".into(), later: scrape(20), earlier: Some(scrape(20)), proxy_mode: None };
        let w = measure_node(&input, 1.0, 5, None);
        assert_eq!(w.interval, Interval::LifetimeFallback);
        assert_eq!(w.sync_samples, 20.0);
        assert_eq!(w.basis, Basis::Measured);
        // enough syncs in the window: the window is used
        let input = NodeInput { node: "n".into(), later: scrape(30), earlier: Some(scrape(20)), proxy_mode: None };
        let w = measure_node(&input, 1.0, 5, None);
        assert_eq!((w.interval, w.sync_samples), (Interval::BetweenScrapes, 10.0));
    }

    #[test]
    fn a_sync_beyond_the_top_bucket_is_a_low_sample_count_below_min_samples() {
        let text = |below: u32, total: u32| {
            format!(
                "kubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"16.384\"}} {below}\nkubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"+Inf\"}} {total}\n"
            )
        };
        let node =
            |t: String| NodeInput { node: "n".into(), later: parse_kube_proxy_metrics(&t).unwrap(), earlier: None, proxy_mode: None };
        // 2 syncs, one beyond 16.384 s: the p99 is beyond the top bucket, but 2 < 5 samples
        let w = measure_node(&node(text(1, 2)), 1.0, 5, None);
        assert_eq!(w.basis, Basis::LowSampleCount);
        assert_eq!(w.sync_p99.map(|q| (q.seconds, q.beyond_top_bucket)), Some((16.384, true)));
        assert_eq!(w.propagation_window_seconds, Some(1.0 + 16.384));
        // 5 syncs, one beyond: trusted, and beyond the top bucket
        let w = measure_node(&node(text(4, 5)), 1.0, 5, None);
        assert_eq!(w.basis, Basis::BeyondTopBucket);
    }

    #[test]
    fn network_programming_without_a_sync_histogram_is_never_below_min_sync_period() {
        let text = "kubeproxy_network_programming_duration_seconds_bucket{le=\"0.25\"} 9\nkubeproxy_network_programming_duration_seconds_bucket{le=\"0.5\"} 10\nkubeproxy_network_programming_duration_seconds_bucket{le=\"+Inf\"} 10\n";
        let later = parse_kube_proxy_metrics(text).unwrap();
        let w = measure_node(&NodeInput { node: "n".into(), later, earlier: None, proxy_mode: None }, 1.0, 5, None);
        assert_eq!(w.propagation_window_seconds, Some(1.0));
    }

    #[test]
    fn a_nan_total_is_never_enough_samples() {
        // (the scrape parser refuses a NaN count; a histogram from elsewhere, e.g. a Prometheus
        // answer, may still carry one)
        let buckets = vec![
            crate::exposition::Bucket { upper_bound_seconds: 0.2, count: 1.0 },
            crate::exposition::Bucket { upper_bound_seconds: f64::INFINITY, count: f64::NAN },
        ];
        let later = KubeProxyScrape { sync: Some(crate::exposition::Histogram::new(buckets, None).unwrap()), ..Default::default() };
        let w = measure_node(&NodeInput { node: "n".into(), later, earlier: None, proxy_mode: None }, 1.0, 5, None);
        assert_ne!(w.basis, Basis::Measured);
    }
}
