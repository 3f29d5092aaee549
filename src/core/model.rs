//! The propagation model: how long after an endpoint change a node's kube-proxy can still send
//! new connections to a terminating pod.
//!
//! Per node: `W = p99 of (L + a removal's window in kube-proxy)`. L is the control plane's part
//! of a deletion, measured by the operator's watches ([`crate::core::control_plane`]), composed
//! with the window by convolution; the window comes from the node's sync duration histogram and
//! minSyncPeriod ([`crate::core::window_distribution`]). Until a deletion's L is measured, L
//! counts 0 and `W = max(p99 of the window, p99(network_programming) - 1 s)`. Without a sync
//! histogram, W is `max(p99(network_programming) - 1 s, minSyncPeriod + p99(L))`.
//!
//! The path of a deleted endpoint: the API server marks the pod terminating, the EndpointSlice
//! controller marks its endpoint not ready, kube-proxy's watch queues the change, and its runner
//! applies it with the next sync that starts. The runner keeps `minSyncPeriod` between the
//! completion of one sync and the start of the next (`pkg/proxy/runner/
//! bounded_frequency_runner.go`), so a removal waits for the rest of a running sync or gap, then
//! its own sync: between one sync and `minSyncPeriod + 2 x sync`. Against the per-pod ground
//! truth on real nodes (docs/benchmarks/sizing.md "The window distribution model"),
//! `minSyncPeriod + p99(sync)` fell short of the windows at 4,000 Services, and
//! `minSyncPeriod + 2 x p99(sync)` ([`deletion_window_bound_seconds`]) stood up to 1.9 x above
//! the longest; the distribution's p99 lies between the two.
//!
//! Network programming latency measures the whole path, the part before kube-proxy included,
//! but from pods turning Ready, never from deletions (the EndpointSlice trigger time is not
//! computed for deletions: kubernetes/kubernetes issues 74294 and 81360), so it also holds the
//! kubelet's write of the Ready condition; and the trigger time is whole seconds (`metav1.Time`,
//! from the pod's Ready condition `lastTransitionTime` or the Service's `creationTimestamp`,
//! k8s.io/endpointslice `util/trigger_time_tracker.go`), so each sample is the true latency plus
//! 0 to 1 s ([`TRIGGER_TIME_RESOLUTION_SECONDS`], subtracted). Before the first deletion is
//! seen it is the only measure of the control plane's part: on a starved machine, deletion windows reached 1.88 s at 0 extra
//! Services while the kube-proxy term read 1.26-1.37 s, and `p99 - 1 s` covered them. Once L is
//! measured it leaves W: its Ready changes carry the kubelet's status write, which no deletion
//! waits for, and on a loaded machine that write set W at 2.3 and 5.4 x the longest deletion window
//! (docs/benchmarks/sizing.md "Network programming leaves W once deletions are measured").
//! A path kube-proxy does not measure (an EndpointSlice controller that batches updates with
//! `--endpointslice-updates-batch-period`, an ingress reload, a cloud load balancer) belongs in
//! the policy's `preStop.extraSeconds`. Beyond 1 s of sync p99 the advisor raises ProxySyncSlow.
//! The cluster window is the maximum over nodes, and the node that sets it is named.

use crate::core::control_plane::LagDistribution;
use crate::core::exposition::histogram::{Histogram, HistogramKind, Quantile};
use crate::core::exposition::native::NativeHistogram;
use crate::core::exposition::parse::KubeProxyScrape;
use crate::core::window_distribution::{DeletionWindow, SyncDurations};
use serde::Serialize;

/// The quantile the model uses (p99).
pub const QUANTILE: f64 = 0.99;

/// Resolution of the trigger times network programming latency is measured from, seconds: the
/// API's `metav1.Time` is whole seconds, so each sample overstates the latency by up to this much
/// (see the module docs). Subtracted from the network-programming p99 in W.
pub const TRIGGER_TIME_RESOLUTION_SECONDS: f64 = 1.0;

/// The longest wait a removal can see with syncs of `sync_seconds`, seconds:
/// `minSyncPeriod + 2 x sync`. kube-proxy's runner keeps `minSyncPeriod` between the
/// *completion* of one sync and the *start* of the next (`pkg/proxy/runner/
/// bounded_frequency_runner.go`, 1.37.2), and a sync reads the pending changes when it starts,
/// so a removal that arrives just after a sync started waits for that sync, then
/// `minSyncPeriod`, then the sync that removes it. Used for W only when the sync histogram has
/// no usable bucket for the window distribution ([`crate::core::window_distribution`]).
pub fn deletion_window_bound_seconds(min_sync_period_seconds: f64, sync_seconds: f64) -> f64 {
    min_sync_period_seconds + 2.0 * sync_seconds
}

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
    /// The kind of histogram the term that sets W came from (`native` when kube-proxy served
    /// a native histogram in both scrapes, else `classic`); None without data.
    pub histogram_kind: Option<HistogramKind>,
    /// W for this node, seconds (None when there is no data).
    pub propagation_window_seconds: Option<f64>,
    /// How far W can be trusted.
    pub basis: Basis,
    /// How long changes have waited for a sync, seconds ([`pending_seconds`]): 0 when none
    /// wait; None when a gauge or the scrape's time is unknown.
    pub stale_seconds: Option<f64>,
    /// iptables rules owned (`iptables_total`, summed over tables).
    pub iptables_rules_total: Option<f64>,
    /// The share of this node's removal windows a sleep of `s` whole seconds covers, at index
    /// `s` ([`NodeWindow::coverage_at`]); empty without data. Not serialised: a report gives it
    /// at the sized sleep.
    #[serde(skip)]
    pub coverage_by_sleep: Vec<f32>,
}

impl NodeWindow {
    /// The share of this node's removal windows, over the analysed interval, that a sleep of
    /// `sleep_seconds` covers (0 to 1); None without data.
    pub fn coverage_at(&self, sleep_seconds: u32) -> Option<f64> {
        let i = (sleep_seconds as usize).min(self.coverage_by_sleep.len().checked_sub(1)?);
        Some(f64::from(self.coverage_by_sleep[i]))
    }
}

/// Which histograms [`measure_node_with`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum HistogramPreference {
    /// The native histogram where the scrapes carry one (the later scrape, and the earlier one
    /// when given), else the classic buckets: kube-proxy's native buckets are 9% wide, its
    /// classic sync buckets double, so a classic p99 can read up to 2 x the true one.
    #[default]
    NativeFirst,
    /// The classic buckets only (to compare both kinds from the same scrapes).
    ClassicOnly,
}

/// One histogram of either kind, as the model reads it.
#[derive(Debug, Clone)]
enum Distribution {
    Classic(Histogram),
    Native(NativeHistogram),
}

impl Distribution {
    fn count(&self) -> f64 {
        match self {
            Self::Classic(h) => h.count(),
            Self::Native(h) => h.count(),
        }
    }

    /// The observations as a piecewise-uniform distribution, with the share of them whose
    /// duration is known: a classic histogram's `+Inf` bucket holds larger, unknown ones (the
    /// distribution puts them at the top finite bound). None when no bucket holds a usable count.
    fn durations(&self) -> Option<(SyncDurations, f64)> {
        match self {
            Self::Classic(h) => {
                let below_inf = h.buckets().iter().rev().find(|b| b.upper_bound_seconds.is_finite()).map_or(0.0, |b| b.count);
                let known = if h.count() > 0.0 { (below_inf / h.count()).clamp(0.0, 1.0) } else { 0.0 };
                Some((SyncDurations::from_classic(h)?, known))
            }
            Self::Native(h) => Some((SyncDurations::from_native(h)?, 1.0)),
        }
    }

    /// The p99, when finite.
    fn p99(&self) -> Option<Quantile> {
        let q = match self {
            Self::Classic(h) => h.quantile(QUANTILE),
            Self::Native(h) => h.quantile(QUANTILE),
        };
        q.seconds.is_finite().then_some(q)
    }
}

/// A family's histogram over the interval: the later scrape's, minus the earlier one's when
/// given (the delta; a counter reset sets `reset`). Native when preferred and both scrapes
/// carry one, classic otherwise. Returns (interval histogram, lifetime histogram).
fn over(
    classic: (&Option<Histogram>, Option<&Option<Histogram>>),
    native: (&Option<NativeHistogram>, Option<&Option<NativeHistogram>>),
    has_earlier: bool,
    prefer: HistogramPreference,
    reset: &mut bool,
) -> Option<(Distribution, Distribution)> {
    let earlier_native = native.1.and_then(Option::as_ref);
    // an earlier scrape without the family at all (network programming appears with its first
    // observation) counts as empty, so the later native histogram is the interval; one with
    // only classic buckets (read as text) cannot give a native delta
    let family_absent_earlier = earlier_native.is_none() && classic.1.and_then(Option::as_ref).is_none();
    if let (HistogramPreference::NativeFirst, Some(later)) = (prefer, native.0.as_ref())
        && (!has_earlier || earlier_native.is_some() || family_absent_earlier)
    {
        let interval = match earlier_native {
            None => later.clone(),
            Some(e) => {
                let d = later.delta_since(e);
                *reset |= d.is_reset();
                d.histogram().clone()
            }
        };
        return Some((Distribution::Native(interval), Distribution::Native(later.clone())));
    }
    let later = classic.0.as_ref()?;
    // the later scrape's lifetime counts, natively when it carries a native histogram (an
    // earlier scrape read as text has none, so the interval is classic, but the lifetime
    // fallback reads the later scrape alone)
    let lifetime = match (prefer, native.0.as_ref()) {
        (HistogramPreference::NativeFirst, Some(n)) => Distribution::Native(n.clone()),
        _ => Distribution::Classic(later.clone()),
    };
    let interval = match classic.1.and_then(Option::as_ref) {
        // no earlier histogram: the family had no observation yet (network programming appears
        // with its first sample), so all of the later's are new. (Also when the store kept only
        // the earlier scrape's native histogram and the later one has none, a downgrade within
        // the window: then the later scrape's lifetime counts stand in for the interval.)
        None => later.clone(),
        Some(e) => {
            let d = later.delta_since(e);
            *reset |= d.is_reset();
            d.histogram().clone()
        }
    };
    Some((Distribution::Classic(interval), lifetime))
}

/// Measures one node: deltas when an earlier scrape is given, p99s, W and its basis.
/// `min_sync_period_seconds` is kube-proxy's minSyncPeriod (1 s by default in iptables mode);
/// `min_samples` is the policy's `preStop.minSamples`. Native histograms first
/// ([`HistogramPreference::NativeFirst`]).
pub fn measure_node(input: &NodeInput, min_sync_period_seconds: f64, min_samples: u32, mode_flag: Option<ProxyMode>) -> NodeWindow {
    measure_node_with(input, min_sync_period_seconds, min_samples, ModeHints { flag: mode_flag, configured: None }, HistogramPreference::NativeFirst)
}

/// What is known of a node's proxy mode besides what the node itself reports, by precedence:
/// the user's flag overrides everything; the node's `/proxyMode` endpoint
/// ([`NodeInput::proxy_mode`]) comes next, then its metric families; `configured` (kube-proxy's
/// configz or ConfigMap, read from one node) only names the mode of a node that reports none:
/// a cluster mid-migration runs two modes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ModeHints {
    /// `--proxy-mode`.
    pub flag: Option<ProxyMode>,
    /// kube-proxy's configured mode.
    pub configured: Option<ProxyMode>,
}

/// [`measure_node`] with a choice of histogram kind and the configured mode, without the
/// control plane's part of a deletion ([`measure_node_after`] with no lag).
pub fn measure_node_with(input: &NodeInput, min_sync_period_seconds: f64, min_samples: u32, modes: ModeHints, prefer: HistogramPreference) -> NodeWindow {
    measure_node_after(input, min_sync_period_seconds, min_samples, modes, prefer, None)
}

/// [`measure_node_with`] after the control plane's part of a deletion, `lag`
/// ([`crate::core::control_plane`]): the kube-proxy term becomes the p99 of the lag plus a
/// removal's window in kube-proxy, composed by convolution (the two independent); its CDF
/// gives the coverage table, and network programming leaves W and the table (the lag measures
/// the path before kube-proxy for deletions themselves). Without a sync histogram network
/// programming stays, and the floor of W is minSyncPeriod plus the lag's p99; with a sync
/// histogram too coarse for the window distribution, the bound `minSyncPeriod + 2 x p99(sync)`
/// plus the longest lag.
pub fn measure_node_after(
    input: &NodeInput,
    min_sync_period_seconds: f64,
    min_samples: u32,
    modes: ModeHints,
    prefer: HistogramPreference,
    lag: Option<&LagDistribution>,
) -> NodeWindow {
    let mut interval = if input.earlier.is_some() { Interval::BetweenScrapes } else { Interval::Lifetime };
    let (earlier, has_earlier) = (input.earlier.as_ref(), input.earlier.is_some());
    let mut reset = false;
    let sync =
        over((&input.later.sync, earlier.map(|e| &e.sync)), (&input.later.sync_native, earlier.map(|e| &e.sync_native)), has_earlier, prefer, &mut reset);
    let np = over(
        (&input.later.network_programming, earlier.map(|e| &e.network_programming)),
        (&input.later.network_programming_native, earlier.map(|e| &e.network_programming_native)),
        has_earlier,
        prefer,
        &mut reset,
    );
    if reset {
        interval = Interval::SinceRestart;
    }
    let count = |d: &Option<(Distribution, Distribution)>, lifetime: bool| d.as_ref().map_or(0.0, |(i, l)| if lifetime { l.count() } else { i.count() });
    let use_lifetime = interval == Interval::BetweenScrapes && count(&sync, false) < f64::from(min_samples) && count(&sync, true) > count(&sync, false);
    if use_lifetime {
        interval = Interval::LifetimeFallback;
    }
    let pick = |d: Option<(Distribution, Distribution)>| d.map(|(i, l)| if use_lifetime { l } else { i });
    let (sync, np) = (pick(sync), pick(np));
    let sync_p99 = sync.as_ref().and_then(Distribution::p99);
    let np_p99 = np.as_ref().and_then(Distribution::p99);
    let sync_samples = sync.as_ref().map_or(0.0, Distribution::count);
    let np_samples = np.as_ref().map_or(0.0, Distribution::count);

    // the kube-proxy term: a removal's window under kube-proxy's runner with these sync
    // durations ([`crate::core::window_distribution`])
    let deletion_window = sync.as_ref().and_then(Distribution::durations).map(|(d, known)| (DeletionWindow::new(d, min_sync_period_seconds), known));
    let from_sync = sync_p99.map(|q| (kube_proxy_term(deletion_window.as_ref().map(|(w, _)| w), q.seconds, min_sync_period_seconds, lag), q.kind));
    // the path before kube-proxy (EndpointSlice controller, API server, watch), which a deletion
    // shares with the Ready changes network programming measures: a term of W until deletions'
    // own lag is measured, or while no sync histogram gives the kube-proxy term
    let np_in_w = lag.is_none() || from_sync.is_none();
    let from_np = np_p99.filter(|_| np_in_w).map(|q| ((q.seconds - TRIGGER_TIME_RESOLUTION_SECONDS).max(0.0), q.kind));
    let np_durations = np.as_ref().filter(|_| np_in_w).and_then(Distribution::durations);
    let coverage_by_sleep = coverage_by_sleep(deletion_window.as_ref(), lag, np_durations.as_ref());
    let floor = min_sync_period_seconds + lag.map_or(0.0, LagDistribution::p99_seconds);
    let (window, histogram_kind) = match combine_terms(from_sync, from_np, floor) {
        Some((w, kind)) => (Some(w), Some(kind)),
        None => (None, None),
    };
    let samples = if sync_p99.is_some() { sync_samples } else { np_samples };
    let beyond = sync_p99.is_some_and(|q| q.beyond_top_bucket) || np_p99.filter(|_| np_in_w).is_some_and(|q| q.beyond_top_bucket);
    let basis = if window.is_none() { Basis::NoData } else { trusted_basis(samples, min_samples, beyond) };
    let (mode, mode_source) = resolve_mode(modes, input);
    let stale_seconds = pending_seconds(&input.later);
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
        histogram_kind,
        propagation_window_seconds: window,
        basis,
        stale_seconds,
        iptables_rules_total: input.later.iptables_rules_total,
        coverage_by_sleep,
    }
}

/// The kube-proxy term of W, seconds: the p99 of the control plane's `lag` plus a removal's
/// `window` in kube-proxy, by convolution (the window alone without a lag); with no usable
/// window distribution, the bound `minSyncPeriod + 2 x p99(sync)` plus the longest lag.
fn kube_proxy_term(window: Option<&DeletionWindow>, sync_p99_seconds: f64, min_sync_period_seconds: f64, lag: Option<&LagDistribution>) -> f64 {
    let modelled = window
        .map(|w| {
            let kube_proxy = w.quantile(QUANTILE);
            lag.map_or(kube_proxy, |l| l.quantile_of_sum(QUANTILE, kube_proxy, |x| w.cdf(x)))
        })
        .filter(|w| w.is_finite());
    modelled.unwrap_or_else(|| deletion_window_bound_seconds(min_sync_period_seconds, sync_p99_seconds) + lag.map_or(0.0, LagDistribution::max_seconds))
}

/// W from its two terms, each `(seconds, histogram kind)`: the higher of the kube-proxy term
/// (`from_sync`) and the path before kube-proxy (`from_np`). Without a sync histogram,
/// network programming stands in, and a change still waits for the next sync, at most
/// minSyncPeriod after it reaches kube-proxy, so W is never below `floor_seconds`
/// (minSyncPeriod plus the control plane's lag). `None` without either.
fn combine_terms<K>(from_sync: Option<(f64, K)>, from_np: Option<(f64, K)>, floor_seconds: f64) -> Option<(f64, K)> {
    match (from_sync, from_np) {
        (Some(s), Some(n)) if n.0 > s.0 => Some(n),
        (Some(s), _) => Some(s),
        (None, Some(n)) => Some((n.0.max(floor_seconds), n.1)),
        (None, None) => None,
    }
}

/// The basis of a node's W when it has one, from the `samples` of the histogram W came from:
/// too few samples wins over beyond the top bucket (README "The sizing model"): a p99 of one to
/// four syncs is not trusted, however slow (a restarted kube-proxy's first, full sync is often
/// the slowest it ever does); as LowSampleCount its W still raises the sleep when no node is
/// trusted, but it neither overrides a trusted node nor raises ProxySyncSlow. A NaN count (a
/// broken exposition) is "too few", never "enough".
fn trusted_basis(samples: f64, min_samples: u32, beyond_top_bucket: bool) -> Basis {
    if samples.partial_cmp(&f64::from(min_samples)).is_none_or(|o| o.is_lt()) {
        Basis::LowSampleCount
    } else if beyond_top_bucket {
        Basis::BeyondTopBucket
    } else {
        Basis::Measured
    }
}

/// A node's proxy mode and where it came from, first found wins: the `--proxy-mode` flag,
/// kube-proxy's `/proxyMode` endpoint, the metric families it exports, its configuration.
fn resolve_mode(modes: ModeHints, input: &NodeInput) -> (ProxyMode, &'static str) {
    match (modes.flag, input.proxy_mode, ProxyMode::infer(&input.later), modes.configured) {
        (Some(m), _, _, _) => (m, "flag"),
        (None, Some(m), _, _) => (m, "proxyMode endpoint"),
        (None, None, Some(m), _) => (m, "metric families"),
        (None, None, None, Some(m)) => (m, "kube-proxy configuration"),
        _ => (ProxyMode::Unknown, "unknown"),
    }
}

/// The longest sleep [`coverage_by_sleep`] tabulates, seconds (the CRD's largest `maxSeconds`).
const MAX_COVERAGE_SECONDS: usize = 3600;

/// The share of a removal's windows on one node that a sleep of `s` whole seconds covers, for
/// `s` = 0, 1, 2, ...: the lower of the two terms' CDFs, the kube-proxy term's (after the
/// control plane's `lag` when known) at `s` and
/// network programming's at `s` + [`TRIGGER_TIME_RESOLUTION_SECONDS`] (W takes the higher of
/// their p99s), each capped at the share of observations of known duration. The table ends
/// where both terms reach their cap (a longer sleep reads the last entry), at most at
/// [`MAX_COVERAGE_SECONDS`]; empty without either histogram.
fn coverage_by_sleep(
    deletion_window: Option<&(DeletionWindow, f64)>,
    lag: Option<&LagDistribution>,
    network_programming: Option<&(SyncDurations, f64)>,
) -> Vec<f32> {
    if deletion_window.is_none() && network_programming.is_none() {
        return Vec::new();
    }
    let lag_max = lag.map_or(0.0, LagDistribution::max_seconds);
    let end = deletion_window
        .map_or(0.0, |(w, _)| w.max_seconds() + lag_max)
        .max(network_programming.map_or(0.0, |(d, _)| d.max_seconds() - TRIGGER_TIME_RESOLUTION_SECONDS));
    let last = if end.is_finite() { (end.max(0.0).ceil() as usize).min(MAX_COVERAGE_SECONDS) } else { MAX_COVERAGE_SECONDS };
    (0..=last)
        .map(|s| {
            let s = s as f64;
            let kube_proxy = deletion_window.map_or(1.0, |(w, known)| lag.map_or_else(|| w.cdf(s), |l| l.cdf_of_sum(s, |x| w.cdf(x))).min(*known));
            let programming = network_programming.map_or(1.0, |(d, known)| d.cdf(s + TRIGGER_TIME_RESOLUTION_SECONDS).min(*known));
            kube_proxy.min(programming) as f32
        })
        .collect()
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
        return ClusterWindow { worst_node: Some(n.node.clone()), propagation_window_seconds: Some(w), basis: Basis::LowSampleCount };
    }
    ClusterWindow { worst_node: None, propagation_window_seconds: None, basis: Basis::NoData }
}

/// How long kube-proxy has had changes queued without a completed sync, seconds, as its own
/// healthz judges it (`pkg/proxy/healthcheck`: unhealthy when the oldest pending queue time is
/// older than the health timeout): 0 when every proxier (one per `ip_family`) has synced since
/// its last queue; else the scrape's time minus the oldest queue time still waiting, as the
/// reader saw it across scrapes, or the waiting proxier's `last_queued` (a lower bound).
/// `last_queued - last_synced` alone is not a wait: an idle proxy scraped between a new change
/// and its sync (within minSyncPeriod) shows the whole idle time, and one family's queue against
/// the other's sync shows the time between them. None when no proxier has both gauges, a pair
/// is not finite, or changes wait and the scrape's time is unknown.
fn pending_seconds(later: &KubeProxyScrape) -> Option<f64> {
    let Some((queued, _)) = later.waiting()? else {
        return Some(0.0);
    };
    let since = later.oldest_pending_queued_unix_seconds.map_or(queued, |o| o.min(queued));
    Some((later.scraped_at_unix_seconds? - since).max(0.0)).filter(|s| s.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::exposition::parse::SyncTimestamps;
    use crate::core::exposition::parse_kube_proxy_metrics;

    fn scrape(count: u32) -> KubeProxyScrape {
        parse_kube_proxy_metrics(&format!(
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"0.1\"}} {count}\nkubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"+Inf\"}} {count}\n"
        ))
        .unwrap()
    }

    /// A scrape with the classic `scrape(count)` and a native sync histogram of schema 3 with
    /// `count` observations: `count - 1` in bucket 0 (0.917..1 s) and one in bucket -24
    /// (0.125 s), so the native p99 (from above: rank 0.01 x count in the top bucket) lies in
    /// (0.917, 1], where the classic one interpolates inside (0, 0.1].
    fn with_native(count: u32) -> KubeProxyScrape {
        use crate::core::exposition::{NativeParts, Span};
        let c = f64::from(count);
        let native = NativeHistogram::new(NativeParts {
            schema: 3,
            zero_threshold: 2f64.powi(-128),
            count: c,
            sum: c * 0.9,
            positive_spans: vec![Span { offset: -24, length: 1 }, Span { offset: 23, length: 1 }],
            positive_counts: vec![1.0, c - 1.0],
            ..NativeParts::default()
        })
        .unwrap();
        KubeProxyScrape { sync_native: Some(native), ..scrape(count) }
    }

    /// A node measured from one text scrape with classic `(le, cumulative)` buckets of the sync
    /// and network programming families (the `+Inf` bucket added at the last count).
    fn classic_node(sync: &[(&str, u32)], np: &[(&str, u32)]) -> NodeWindow {
        let family = |name: &str, buckets: &[(&str, u32)]| {
            let mut t = String::new();
            for (le, c) in buckets {
                t += &format!("{name}_bucket{{le=\"{le}\"}} {c}\n");
            }
            match buckets.last() {
                Some(&(le, c)) if le != "+Inf" => t + &format!("{name}_bucket{{le=\"+Inf\"}} {c}\n"),
                _ => t,
            }
        };
        let text = family("kubeproxy_sync_proxy_rules_duration_seconds", sync) + &family("kubeproxy_network_programming_duration_seconds", np);
        let input = NodeInput { node: "n".into(), later: parse_kube_proxy_metrics(&text).unwrap(), earlier: None, proxy_mode: None };
        measure_node(&input, 1.0, 1, None)
    }

    #[test]
    fn coverage_is_the_window_cdf_at_the_sleep() {
        // expected values: tests/reference/window_distribution_reference.py, COVERAGE_CASES
        let n = classic_node(&[("2", 98), ("2.2", 100)], &[]);
        assert!((n.coverage_at(3).unwrap() - 0.820532734).abs() < 1e-6, "{:?}", n.coverage_at(3));
        assert!((n.coverage_at(4).unwrap() - 0.974415956).abs() < 1e-6, "{:?}", n.coverage_at(4));
        // the table ends at minSyncPeriod + 2 x the longest sync (5.4 s): every window covered
        assert_eq!(n.coverage_by_sleep.len(), 7);
        assert_eq!(n.coverage_at(6), Some(1.0));
        assert_eq!(n.coverage_at(3600), Some(1.0));
        assert_eq!(n.coverage_at(0), Some(0.0));
        // network programming's term at the sleep + 1 s: 90 in (1, 2], 10 in (2, 4] -> 0.95 at 3 s
        let n = classic_node(&[("0.128", 0), ("0.256", 100)], &[("1", 0), ("2", 90), ("4", 100)]);
        assert!((n.coverage_at(2).unwrap() - 0.95).abs() < 1e-6, "{:?}", n.coverage_at(2));
        // syncs beyond the top bucket are never counted as covered: 3 of 367
        let n = classic_node(&[("0.032", 68), ("0.064", 290), ("0.128", 346), ("0.256", 362), ("0.512", 364), ("+Inf", 367)], &[]);
        assert!((n.coverage_at(2).unwrap() - 364.0 / 367.0).abs() < 1e-6, "{:?}", n.coverage_at(2));
        assert!((n.coverage_at(3600).unwrap() - 364.0 / 367.0).abs() < 1e-6);
        // no data, no coverage
        assert_eq!(classic_node(&[], &[]).coverage_at(3), None);
    }

    #[test]
    fn pending_seconds_is_the_wait_of_the_oldest_queued_change() {
        let at = |synced: f64, queued: f64, scraped: Option<f64>, oldest: Option<f64>| KubeProxyScrape {
            sync_timestamps: vec![SyncTimestamps { ip_family: "IPv4".into(), last_queued_seconds: Some(queued), last_synced_seconds: Some(synced) }],
            scraped_at_unix_seconds: scraped,
            oldest_pending_queued_unix_seconds: oldest,
            ..KubeProxyScrape::default()
        };
        // an idle proxy (last sync 53 s before) scraped 0.4 s after a change, before its sync:
        // waiting 0.4 s, not 53 s
        assert_eq!(pending_seconds(&at(1000.0, 1053.0, Some(1053.4), None)), Some(1053.4 - 1053.0));
        // changes waiting since 1001 (seen by an earlier scrape), the last queued at 1040
        assert_eq!(pending_seconds(&at(1000.0, 1040.0, Some(1041.0), Some(1001.0))), Some(40.0));
        // nothing queued after the last sync
        assert_eq!(pending_seconds(&at(1000.0, 999.0, None, None)), Some(0.0));
        assert_eq!(pending_seconds(&at(1000.0, 1000.0, Some(5000.0), None)), Some(0.0));
        // pending, but when the scrape was taken is unknown
        assert_eq!(pending_seconds(&at(1000.0, 1001.0, None, None)), None);
        // a clock behind the node's: not a negative wait
        assert_eq!(pending_seconds(&at(1000.0, 1001.0, Some(1000.5), None)), Some(0.0));
        // not finite
        assert_eq!(pending_seconds(&at(f64::NAN, 1001.0, Some(1002.0), None)), None);
        assert_eq!(pending_seconds(&at(1000.0, f64::INFINITY, Some(1002.0), None)), None);
        // no proxier with both gauges
        assert_eq!(pending_seconds(&KubeProxyScrape { scraped_at_unix_seconds: Some(1.0), ..KubeProxyScrape::default() }), None);
    }

    #[test]
    fn each_ip_familys_queue_is_paired_with_its_own_sync() {
        // the idle dual-stack 1.37.2 capture: each family synced after its last queue, but the
        // newest queue (IPv4) is after the oldest sync (IPv6): nothing waits
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/metrics/kube-proxy-v1.37.2-idle-node-a.txt")).unwrap();
        let mut later = parse_kube_proxy_metrics(&text).unwrap();
        assert!(later.last_queued_timestamp_seconds > later.last_sync_timestamp_seconds, "the folded gauges would show a wait");
        later.scraped_at_unix_seconds = Some(1.8e9);
        assert_eq!(later.waiting(), Some(None));
        assert_eq!(pending_seconds(&later), Some(0.0));
        // IPv6 waiting since 1,000 s (its last sync at 990), IPv4 since 1,020: 1,050 - 1,000
        let family =
            |f: &str, queued: f64, synced: f64| SyncTimestamps { ip_family: f.into(), last_queued_seconds: Some(queued), last_synced_seconds: Some(synced) };
        let later = KubeProxyScrape {
            sync_timestamps: vec![family("IPv4", 1020.0, 1010.0), family("IPv6", 1000.0, 990.0)],
            scraped_at_unix_seconds: Some(1050.0),
            ..KubeProxyScrape::default()
        };
        assert_eq!(later.waiting(), Some(Some((1000.0, 990.0))));
        assert_eq!(pending_seconds(&later), Some(50.0));
    }

    #[test]
    fn native_histograms_are_read_when_both_scrapes_carry_one() {
        let input = NodeInput { node: "n".into(), later: with_native(30), earlier: Some(with_native(20)), proxy_mode: None };
        let native = measure_node(&input, 1.0, 5, None);
        let q = native.sync_p99.unwrap();
        assert_eq!((q.kind, q.samples, native.histogram_kind), (HistogramKind::Native, 10.0, Some(HistogramKind::Native)));
        assert!(q.seconds > 0.917 && q.seconds <= 1.0, "{}", q.seconds);
        assert_eq!(native.interval, Interval::BetweenScrapes);
        // the same scrapes, classic only
        let classic = measure_node_with(&input, 1.0, 5, ModeHints::default(), HistogramPreference::ClassicOnly);
        assert_eq!((classic.sync_p99.unwrap().kind, classic.histogram_kind), (HistogramKind::Classic, Some(HistogramKind::Classic)));
        assert!((classic.sync_p99.unwrap().seconds - 0.099).abs() < 1e-12);
        // an earlier scrape without a native histogram (read as text): no native delta, classic
        let input = NodeInput { node: "n".into(), later: with_native(30), earlier: Some(scrape(20)), proxy_mode: None };
        assert_eq!(measure_node(&input, 1.0, 5, None).sync_p99.unwrap().kind, HistogramKind::Classic);
        // an earlier scrape without the family (its first observations came since): native
        let input = NodeInput { node: "n".into(), later: with_native(30), earlier: Some(KubeProxyScrape::default()), proxy_mode: None };
        let w = measure_node(&input, 1.0, 5, None);
        assert_eq!((w.sync_p99.unwrap().kind, w.interval, w.sync_samples), (HistogramKind::Native, Interval::BetweenScrapes, 30.0));
        // one scrape: its lifetime native histogram
        let input = NodeInput { node: "n".into(), later: with_native(30), earlier: None, proxy_mode: None };
        assert_eq!(measure_node(&input, 1.0, 5, None).sync_p99.unwrap().kind, HistogramKind::Native);
        // a native counter reset
        let input = NodeInput { node: "n".into(), later: with_native(10), earlier: Some(with_native(20)), proxy_mode: None };
        let w = measure_node(&input, 1.0, 5, None);
        assert_eq!((w.interval, w.sync_samples), (Interval::SinceRestart, 10.0));
        // a quiet window of a native histogram falls back to its lifetime counts
        let input = NodeInput { node: "n".into(), later: with_native(21), earlier: Some(with_native(20)), proxy_mode: None };
        let w = measure_node(&input, 1.0, 5, None);
        assert_eq!((w.interval, w.sync_samples, w.sync_p99.unwrap().kind), (Interval::LifetimeFallback, 21.0, HistogramKind::Native));
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
        let node = |t: String| NodeInput { node: "n".into(), later: parse_kube_proxy_metrics(&t).unwrap(), earlier: None, proxy_mode: None };
        // 2 syncs, one beyond 16.384 s: the p99 is beyond the top bucket, but 2 < 5 samples
        let w = measure_node(&node(text(1, 2)), 1.0, 5, None);
        assert_eq!(w.basis, Basis::LowSampleCount);
        assert_eq!(w.sync_p99.map(|q| (q.seconds, q.beyond_top_bucket)), Some((16.384, true)));
        // the observation beyond the top bucket counts at 16.384 s: a removal waits for it
        let window = w.propagation_window_seconds.unwrap();
        assert!(window > 1.0 + 16.384 && window <= deletion_window_bound_seconds(1.0, 16.384), "{window}");
        // 5 syncs, one beyond: trusted, and beyond the top bucket
        let w = measure_node(&node(text(4, 5)), 1.0, 5, None);
        assert_eq!(w.basis, Basis::BeyondTopBucket);
    }

    /// The control plane's lag moves the kube-proxy term by the convolution: above kube-proxy's
    /// own p99, below the sum of the two p99s, and exactly `P(L + K <= x)` in the coverage
    /// table; without a sync histogram the floor is minSyncPeriod plus the lag's p99.
    #[test]
    fn the_control_planes_lag_is_convolved_into_the_kube_proxy_term() {
        let text = "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.256\"} 0\n\
            kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.512\"} 100\n\
            kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"+Inf\"} 100\n";
        let input = NodeInput { node: "n".into(), later: parse_kube_proxy_metrics(text).unwrap(), earlier: None, proxy_mode: None };
        let lags: Vec<f64> = (0..100).map(|i| if i < 90 { 0.1 } else { 0.2 }).collect();
        let lag = LagDistribution::from_samples(&lags).unwrap();
        let measure = |lag: Option<&LagDistribution>| measure_node_after(&input, 1.0, 5, ModeHints::default(), HistogramPreference::NativeFirst, lag);
        let (without, with) = (measure(None), measure(Some(&lag)));
        let k = without.propagation_window_seconds.unwrap();
        let w = with.propagation_window_seconds.unwrap();
        assert!(w > k + 0.1 && w < k + 0.2, "W {w} against kube-proxy's {k} and lags of 0.1 and 0.2 s");
        // the convolution at W is the p99, to the 1 ms search
        let window = DeletionWindow::new(SyncDurations::from_ranges([(0.256, 0.512, 100.0)]).unwrap(), 1.0);
        let at = |x: f64| 0.9 * window.cdf(x - 0.1) + 0.1 * window.cdf(x - 0.2);
        assert!(at(w) >= QUANTILE && at(w - 1.1e-3) < QUANTILE, "{} {}", at(w), at(w - 1.1e-3));
        for s in 0..4u32 {
            assert!((with.coverage_at(s).unwrap() - at(f64::from(s))).abs() < 1e-6, "coverage at {s} s");
        }
        assert_eq!(with.sync_samples, without.sync_samples);
        let np = "kubeproxy_network_programming_duration_seconds_bucket{le=\"0.25\"} 10\n\
            kubeproxy_network_programming_duration_seconds_bucket{le=\"+Inf\"} 10\n";
        let input = NodeInput { node: "n".into(), later: parse_kube_proxy_metrics(np).unwrap(), earlier: None, proxy_mode: None };
        let w = measure_node_after(&input, 1.0, 5, ModeHints::default(), HistogramPreference::NativeFirst, Some(&lag));
        assert_eq!(w.propagation_window_seconds, Some(1.2), "minSyncPeriod + the lag's p99");
    }

    #[test]
    fn network_programming_without_a_sync_histogram_is_never_below_min_sync_period() {
        let text = "kubeproxy_network_programming_duration_seconds_bucket{le=\"0.25\"} 9\nkubeproxy_network_programming_duration_seconds_bucket{le=\"0.5\"} 10\nkubeproxy_network_programming_duration_seconds_bucket{le=\"+Inf\"} 10\n";
        let later = parse_kube_proxy_metrics(text).unwrap();
        let w = measure_node(&NodeInput { node: "n".into(), later, earlier: None, proxy_mode: None }, 1.0, 5, None);
        assert_eq!(w.propagation_window_seconds, Some(1.0));
    }

    #[test]
    fn w_is_the_larger_of_the_window_distribution_and_network_programming_less_1_s() {
        // 100 syncs, all in (0.256, 0.512]: classic p99 = 0.256 + 0.256 x 0.99 = 0.50944 s
        let sync = "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.256\"} 0\n\
            kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.512\"} 100\n\
            kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"+Inf\"} 100\n";
        let np = |le: &str| {
            format!(
                "kubeproxy_network_programming_duration_seconds_bucket{{le=\"{le}\"}} 0\n\
                 kubeproxy_network_programming_duration_seconds_bucket{{le=\"5\"}} 100\n\
                 kubeproxy_network_programming_duration_seconds_bucket{{le=\"+Inf\"}} 100\n"
            )
        };
        let measure = |text: String| {
            let later = parse_kube_proxy_metrics(&text).unwrap();
            measure_node(&NodeInput { node: "n".into(), later, earlier: None, proxy_mode: None }, 1.0, 5, None)
        };
        let durations = SyncDurations::from_ranges([(0.256, 0.512, 100.0)]).unwrap();
        let in_kube_proxy = DeletionWindow::new(durations, 1.0).quantile(QUANTILE);
        let p99 = 0.256 + 0.256 * 0.99;
        // between one sync after minSyncPeriod and two p99 syncs after it
        assert!(in_kube_proxy > 1.0 + p99 && in_kube_proxy < deletion_window_bound_seconds(1.0, p99), "{in_kube_proxy}");
        // network programming p99 in (4, 5]: 4.99 s; less the 1 s of trigger-time resolution,
        // 3.99 s sets W
        let w = measure(format!("{sync}{}", np("4")));
        assert!((w.sync_p99.unwrap().seconds - p99).abs() < 1e-12);
        assert!((w.propagation_window_seconds.unwrap() - 3.99).abs() < 1e-12, "{:?}", w.propagation_window_seconds);
        // p99 in (1, 5]: 4.96 s, less 1 s = 3.96 s still above; in (0, 1] it would be below
        let w = measure(format!("{sync}{}", np("1")));
        assert!((w.propagation_window_seconds.unwrap() - 3.96).abs() < 1e-12);
        let low = sync.to_string()
            + "kubeproxy_network_programming_duration_seconds_bucket{le=\"1\"} 100\n\
               kubeproxy_network_programming_duration_seconds_bucket{le=\"+Inf\"} 100\n";
        let w = measure(low);
        assert!((w.network_programming_p99.unwrap().seconds - 0.99).abs() < 1e-12);
        assert_eq!(w.propagation_window_seconds, Some(in_kube_proxy));
        assert_eq!((w.basis, w.histogram_kind), (Basis::Measured, Some(HistogramKind::Classic)));
        // minSyncPeriod counts once, each sync at most twice
        assert_eq!(deletion_window_bound_seconds(2.0, 0.5), 3.0);
    }

    /// Once deletions' own lag is measured, network programming (Ready changes, the kubelet's
    /// status write included) leaves W and the coverage table; without a sync histogram it stays.
    #[test]
    fn network_programming_leaves_w_once_the_lag_of_deletions_is_measured() {
        let sync = "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.256\"} 0\n\
            kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.512\"} 100\n\
            kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"+Inf\"} 100\n";
        // network programming p99 in (4, 5]: 4.99 s, so 3.99 s without the lag
        let np = "kubeproxy_network_programming_duration_seconds_bucket{le=\"4\"} 0\n\
            kubeproxy_network_programming_duration_seconds_bucket{le=\"5\"} 100\n\
            kubeproxy_network_programming_duration_seconds_bucket{le=\"+Inf\"} 100\n";
        let lag = LagDistribution::from_samples(&[0.1; 20]).unwrap();
        let measure = |text: String, lag: Option<&LagDistribution>| {
            let input = NodeInput { node: "n".into(), later: parse_kube_proxy_metrics(&text).unwrap(), earlier: None, proxy_mode: None };
            measure_node_after(&input, 1.0, 5, ModeHints::default(), HistogramPreference::NativeFirst, lag)
        };
        let before = measure(format!("{sync}{np}"), None);
        assert!((before.propagation_window_seconds.unwrap() - 3.99).abs() < 1e-12, "{:?}", before.propagation_window_seconds);
        assert!(before.coverage_at(3).unwrap() < 0.01, "network programming's term holds the table down: {:?}", before.coverage_by_sleep);
        let after = measure(format!("{sync}{np}"), Some(&lag));
        let kube_proxy_only = measure(sync.to_string(), Some(&lag));
        assert_eq!(after.propagation_window_seconds, kube_proxy_only.propagation_window_seconds);
        let w = after.propagation_window_seconds.unwrap();
        assert!(w > 1.0 + 0.5 && w < 1.0 + 2.0 * 0.512 + 0.1 + 1e-9, "the kube-proxy term after a 0.1 s lag: {w}");
        assert_eq!(after.coverage_by_sleep, kube_proxy_only.coverage_by_sleep);
        // still reported, for the advisor and the status
        assert!((after.network_programming_p99.unwrap().seconds - 4.99).abs() < 1e-12);
        // without a sync histogram, network programming is the only kube-proxy measure: it stays
        let np_only = measure(np.to_string(), Some(&lag));
        assert!((np_only.propagation_window_seconds.unwrap() - 3.99).abs() < 1e-12, "{:?}", np_only.propagation_window_seconds);
        // nor does network programming beyond its top bucket make W's basis BeyondTopBucket (the
        // sleep at maxSeconds) once it is out of W
        let beyond = "kubeproxy_network_programming_duration_seconds_bucket{le=\"5\"} 0\n\
            kubeproxy_network_programming_duration_seconds_bucket{le=\"+Inf\"} 100\n";
        assert_eq!(measure(format!("{sync}{beyond}"), None).basis, Basis::BeyondTopBucket);
        let after = measure(format!("{sync}{beyond}"), Some(&lag));
        assert_eq!((after.basis, after.propagation_window_seconds), (Basis::Measured, kube_proxy_only.propagation_window_seconds));
    }

    #[test]
    fn a_nan_total_never_reaches_a_measurement() {
        // a histogram from any source (scrape, protobuf, a Prometheus answer) is built by
        // Histogram::new, which refuses a NaN count
        let buckets = vec![
            crate::core::exposition::Bucket { upper_bound_seconds: 0.2, count: 1.0 },
            crate::core::exposition::Bucket { upper_bound_seconds: f64::INFINITY, count: f64::NAN },
        ];
        let e = crate::core::exposition::Histogram::new(buckets, None).unwrap_err();
        assert_eq!(e.to_string(), "bucket le=\"+Inf\" has the count NaN: a bucket counts observations (a finite number >= 0)");
    }
}
