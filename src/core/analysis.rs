//! One analysis of a cluster: node windows -> cluster window -> recommendation -> advice.
//! Pure; shared by `safe-termination analyze` and the controller so both size the same way.

use crate::core::advisor::{self, Advice, ClusterFacts, Thresholds};
use crate::core::control_plane::LagDistribution;
use crate::core::crd::TerminationPolicySpec;
use crate::core::exposition::HistogramKind;
use crate::core::model::{self, Basis, ClusterWindow, HistogramPreference, Interval, NodeInput, NodeWindow, ProxyMode};
use crate::core::removals::{DataPlaneSummary, RemovalSummary};
use crate::core::sizing::{self, Recommendation};
use serde::Serialize;
use std::sync::Arc;

/// Inputs of an analysis besides the scrapes. [`Default`] assumes kube-proxy's iptables
/// `minSyncPeriod` of 1 s (source `default`), infers the mode, and uses the default thresholds.
#[derive(Debug, Clone, PartialEq)]
pub struct AnalysisOptions {
    /// kube-proxy minSyncPeriod, seconds (1 s, the iptables default, when unknown).
    pub min_sync_period_seconds: f64,
    /// Where minSyncPeriod came from (`flag`, `configz`, `ConfigMap`, `default`).
    pub min_sync_period_source: String,
    /// Mode given by the user; overrides `/proxyMode` and inference.
    pub mode: Option<ProxyMode>,
    /// kube-proxy's configured mode (its `/configz` or ConfigMap, read from one node): only for
    /// a node that reports no mode of its own. A node's `/proxyMode` or metric families win:
    /// a cluster mid-migration runs two modes, and one node's configuration is not the other's.
    pub configured_mode: Option<ProxyMode>,
    /// Services, Service ports, endpoints, version, conntrack usage.
    pub facts: ClusterFacts,
    /// Advisor thresholds.
    pub thresholds: Thresholds,
    /// Which histograms the p99s come from (native first by default).
    pub histograms: HistogramPreference,
    /// The control plane's part of a deletion over the rolling window (the operator's pod and
    /// EndpointSlice watches, [`crate::core::control_plane`]); None when not measured (the
    /// offline `analyze`, or no deletion seen yet): W is then kube-proxy's part alone.
    pub control_plane_lag: Option<LagDistribution>,
    /// The removals the node agents observed over the rolling window ([`crate::core::removals`]);
    /// None when no observer runs. With at least `minSamples` removals their p99 raises W (and
    /// stands for it where the model has none): W is never below what was observed.
    pub observed: Option<RemovalSummary>,
    /// The same removals per data plane, each as its own nodes saw it (for the status; W takes
    /// the cluster's): empty without an observer or agents naming their data plane.
    pub observed_by_data_plane: Vec<DataPlaneSummary>,
}

/// kube-proxy's default `minSyncPeriod` in iptables mode, seconds, used when it is not known.
pub const DEFAULT_MIN_SYNC_PERIOD_SECONDS: f64 = 1.0;

impl Default for AnalysisOptions {
    fn default() -> Self {
        Self {
            min_sync_period_seconds: DEFAULT_MIN_SYNC_PERIOD_SECONDS,
            min_sync_period_source: "default".into(),
            mode: None,
            configured_mode: None,
            facts: ClusterFacts::default(),
            thresholds: Thresholds::default(),
            histograms: HistogramPreference::NativeFirst,
            control_plane_lag: None,
            observed: None,
            observed_by_data_plane: Vec::new(),
        }
    }
}

/// Proxy summary of a report.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxySummary {
    /// The mode used for advice.
    pub mode: ProxyMode,
    /// Services given.
    pub services: Option<u64>,
    /// Endpoints given.
    pub endpoints: Option<u64>,
    /// About 2 per Service port plus 2 per endpoint.
    pub estimated_rules: Option<u64>,
    /// The largest `iptables_total` reported by a node.
    pub actual_rules: Option<u64>,
}

/// The result of an analysis; its JSON form is `safe-termination analyze --output json`
/// (documented in README.md).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisReport {
    /// `lifetime`, `betweenScrapes` or `mixed` (see each node's `interval`).
    pub interval: &'static str,
    /// Per-node windows.
    pub nodes: Vec<NodeWindow>,
    /// The node that sets the window.
    pub worst_node: Option<String>,
    /// Highest trusted sync p99 among nodes, seconds.
    pub sync_p99_seconds: Option<f64>,
    /// Highest trusted network-programming p99 among nodes, seconds (null when absent).
    pub network_programming_p99_seconds: Option<f64>,
    /// Cluster propagation window W, seconds.
    pub propagation_window_seconds: Option<f64>,
    /// The kind of histogram W came from on the worst node (`native` or `classic`).
    pub histogram_kind: Option<HistogramKind>,
    /// minSyncPeriod used, seconds.
    pub min_sync_period_seconds: f64,
    /// Where minSyncPeriod came from.
    pub min_sync_period_source: String,
    /// The sized preStop and grace.
    pub recommendation: Recommendation,
    /// Proxy summary.
    pub proxy: ProxySummary,
    /// Advice items.
    pub advice: Vec<Advice>,
    /// The share of removal windows the sized sleep covers (None without data).
    pub coverage: Option<Coverage>,
    /// The control plane's part of a deletion that W includes (absent when not measured: the
    /// offline `analyze` reads no deletion).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control_plane_lag: Option<ControlPlaneLag>,
    /// The removals the node agents observed (absent without an observer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_removals: Option<ObservedRemovals>,
}

/// The observed removals as W used them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedRemovals {
    /// The rolling window's removals, summarised.
    #[serde(flatten)]
    pub window: RemovalSummary,
    /// Their p99 set W (it was above the model's, or the model had none); false below
    /// `minSamples` removals or under the model's W.
    pub sets_window: bool,
    /// Per data plane, its nodes' removals ([`AnalysisOptions::observed_by_data_plane`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_data_plane: Vec<DataPlaneSummary>,
}

/// The control plane's part of a deletion, as W used it: from a pod's DELETE to its endpoint
/// terminating, as the operator's watches saw them ([`crate::core::control_plane`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneLag {
    /// Deletions measured in the rolling window.
    pub samples: u32,
    /// Their p99, seconds.
    pub p99_seconds: f64,
    /// The longest, seconds.
    pub max_seconds: f64,
}

impl ControlPlaneLag {
    fn of(d: &LagDistribution) -> Self {
        Self { samples: d.samples(), p99_seconds: d.p99_seconds(), max_seconds: d.max_seconds() }
    }
}

/// The share of removal windows that a sleep covers, from the same histograms and interval W
/// came from ([`NodeWindow::coverage_at`]): per node, the lower of the kube-proxy term's CDF at
/// the sleep and network programming's at the sleep + 1 s. Counted over the nodes W is taken
/// from (trusted ones; the low-sample ones when none is trusted).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Coverage {
    /// The sleep it is computed at, seconds.
    pub pre_stop_seconds: u32,
    /// The share of (pod, node) windows within the sleep: the mean of the nodes' shares, each
    /// node seeing every removal.
    pub ratio: f64,
    /// The node with the lowest share.
    pub lowest_node: String,
    /// That node's share.
    pub lowest_node_ratio: f64,
    /// Nodes counted.
    pub nodes: usize,
}

/// A share as a percentage with one decimal, rounded down: 0.9996 is `99.9%`, never `100.0%`
/// unless every window is covered.
pub fn coverage_percent(ratio: f64) -> String {
    format!("{:.1}%", (ratio * 1000.0 + 1e-9).floor() / 10.0)
}

/// The coverage of a sleep of `pre_stop_seconds` over `nodes` ([`Coverage`]); None when no
/// counted node has data.
pub fn coverage(nodes: &[NodeWindow], window_basis: Basis, pre_stop_seconds: u32) -> Option<Coverage> {
    let counted = |n: &&NodeWindow| match n.basis {
        Basis::Measured | Basis::BeyondTopBucket => true,
        Basis::LowSampleCount => window_basis == Basis::LowSampleCount,
        Basis::NoData => false,
    };
    let shares: Vec<(&str, f64)> = nodes.iter().filter(counted).filter_map(|n| Some((n.node.as_str(), n.coverage_at(pre_stop_seconds)?))).collect();
    let lowest = shares.iter().min_by(|a, b| a.1.total_cmp(&b.1))?;
    Some(Coverage {
        pre_stop_seconds,
        ratio: shares.iter().map(|s| s.1).sum::<f64>() / shares.len() as f64,
        lowest_node: lowest.0.to_string(),
        lowest_node_ratio: lowest.1,
        nodes: shares.len(),
    })
}

/// The mode most nodes report (ties broken by the order of [`ProxyMode`]); Unknown when none.
fn majority_mode(nodes: &[NodeWindow]) -> ProxyMode {
    let mut counts: Vec<(ProxyMode, usize)> = Vec::new();
    for n in nodes.iter().filter(|n| n.mode != ProxyMode::Unknown) {
        match counts.iter_mut().find(|(m, _)| *m == n.mode) {
            Some(c) => c.1 += 1,
            None => counts.push((n.mode, 1)),
        }
    }
    counts.into_iter().max_by_key(|c| c.1).map_or(ProxyMode::Unknown, |c| c.0)
}

/// The part of an analysis that no policy's sizing changes: node windows, the cluster window,
/// advice and the proxy summary. It depends on the scrapes, the options and the policy's
/// `preStop.minSamples` only, so one measurement generation needs it once per distinct
/// `minSamples` ([`WindowCache`]), whatever the number of policies.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowAnalysis {
    /// `lifetime`, `betweenScrapes` or `mixed`.
    pub interval: &'static str,
    /// Per-node windows.
    pub nodes: Vec<NodeWindow>,
    /// The cluster window the sizing reads.
    pub window: ClusterWindow,
    /// Highest trusted sync p99 among nodes, seconds.
    pub sync_p99_seconds: Option<f64>,
    /// Highest trusted network-programming p99 among nodes, seconds.
    pub network_programming_p99_seconds: Option<f64>,
    /// The kind of histogram W came from on the worst node.
    pub histogram_kind: Option<HistogramKind>,
    /// minSyncPeriod used, seconds.
    pub min_sync_period_seconds: f64,
    /// Where minSyncPeriod came from.
    pub min_sync_period_source: String,
    /// Proxy summary.
    pub proxy: ProxySummary,
    /// Advice items.
    pub advice: Vec<Advice>,
    /// The control plane's part of a deletion that W includes.
    pub control_plane_lag: Option<ControlPlaneLag>,
    /// The observed removals and whether they set W.
    pub observed_removals: Option<ObservedRemovals>,
}

/// Analyses a set of nodes under a policy: [`analyze_window`] then [`size`].
pub fn analyze(inputs: &[NodeInput], opts: &AnalysisOptions, spec: &TerminationPolicySpec) -> AnalysisReport {
    size(&analyze_window(inputs, opts, spec.pre_stop.min_samples), spec)
}

/// The policy-independent part of an analysis, for policies whose `preStop.minSamples` is
/// `min_samples`.
pub fn analyze_window(inputs: &[NodeInput], opts: &AnalysisOptions, min_samples: u32) -> WindowAnalysis {
    window_of(inputs.iter().map(|i| measure(i, opts, min_samples)).collect(), opts, min_samples)
}

/// [`analyze_window`] over inputs made one at a time, each dropped once its node's window is
/// measured: the operator's store gives its 5,000 nodes' inputs this way rather than as one
/// ~20 MiB copy per measurement generation (docs/benchmarks/memory.md "Operator memory").
pub fn analyze_window_of(inputs: impl IntoIterator<Item = NodeInput>, opts: &AnalysisOptions, min_samples: u32) -> WindowAnalysis {
    window_of(inputs.into_iter().map(|i| measure(&i, opts, min_samples)).collect(), opts, min_samples)
}

fn measure(input: &NodeInput, opts: &AnalysisOptions, min_samples: u32) -> NodeWindow {
    let modes = model::ModeHints { flag: opts.mode, configured: opts.configured_mode };
    model::measure_node_after(input, opts.min_sync_period_seconds, min_samples, modes, opts.histograms, opts.control_plane_lag.as_ref())
}

fn window_of(nodes: Vec<NodeWindow>, opts: &AnalysisOptions, min_samples: u32) -> WindowAnalysis {
    let mut window: ClusterWindow = model::cluster_window(&nodes);
    let observed_removals = opts.observed.clone().map(|o| {
        // enough removals are a trusted measurement of their own: W is at least their p99
        let p99 = o.p99().map(|(p, _)| p).filter(|_| o.removals - o.coarse >= min_samples as usize);
        let enough = p99.is_some();
        let sets_window = p99.is_some_and(|p| window.propagation_window_seconds.is_none_or(|w| p > w));
        if let (true, Some(p)) = (sets_window, p99) {
            window.propagation_window_seconds = Some(p);
            window.worst_node = None;
        }
        if enough && !matches!(window.basis, Basis::Measured | Basis::BeyondTopBucket) {
            window.basis = Basis::Measured;
        }
        ObservedRemovals { window: o, sets_window, by_data_plane: opts.observed_by_data_plane.clone() }
    });
    let mut facts = opts.facts.clone();
    // the flag; else the mode most nodes report; else the configured one (configz, the
    // ConfigMap, or a detected eBPF dataplane with no kube-proxy to report any)
    facts.mode = opts.mode.unwrap_or_else(|| match (majority_mode(&nodes), opts.configured_mode) {
        (ProxyMode::Unknown, Some(configured)) => configured,
        (majority, _) => majority,
    });
    if opts.mode.is_none() {
        for n in &nodes {
            if n.mode != ProxyMode::Unknown && n.mode != facts.mode && !facts.other_modes.contains(&n.mode) {
                facts.other_modes.push(n.mode);
            }
        }
    }
    // the observed removals per data plane (their p99, where one is known)
    facts.observed_p99_by_data_plane = opts.observed_by_data_plane.iter().filter_map(|p| Some((p.data_plane.to_string(), p.summary.p99()?.0))).collect();
    if facts.kubernetes_version.is_none() {
        facts.kubernetes_version = nodes.iter().filter_map(|n| n.kubernetes_version.as_deref()).find_map(advisor::parse_version);
    }
    let advice = advisor::advise(&nodes, &facts, &opts.thresholds, min_samples);
    let trusted = |n: &&NodeWindow| matches!(n.basis, Basis::Measured | Basis::BeyondTopBucket) || window.basis == Basis::LowSampleCount;
    let max_of = |f: &dyn Fn(&NodeWindow) -> Option<f64>| nodes.iter().filter(trusted).filter_map(f).reduce(f64::max);
    let lifetime = |n: &NodeWindow| matches!(n.interval, Interval::Lifetime | Interval::LifetimeFallback);
    let interval = if nodes.iter().all(lifetime) {
        "lifetime"
    } else if nodes.iter().all(|n| !lifetime(n)) {
        "betweenScrapes"
    } else {
        "mixed"
    };
    WindowAnalysis {
        interval,
        sync_p99_seconds: max_of(&|n| n.sync_p99.map(|q| q.seconds)),
        network_programming_p99_seconds: max_of(&|n| n.network_programming_p99.map(|q| q.seconds)),
        histogram_kind: window.worst_node.as_ref().and_then(|w| nodes.iter().find(|n| &n.node == w)).and_then(|n| n.histogram_kind),
        min_sync_period_seconds: opts.min_sync_period_seconds,
        min_sync_period_source: opts.min_sync_period_source.clone(),
        proxy: ProxySummary {
            mode: facts.mode,
            services: facts.services,
            endpoints: facts.endpoints,
            estimated_rules: advisor::estimated_rules(&facts),
            actual_rules: nodes.iter().filter_map(|n| n.iptables_rules_total).reduce(f64::max).map(|v| v as u64),
        },
        advice,
        window,
        nodes,
        control_plane_lag: opts.control_plane_lag.as_ref().map(ControlPlaneLag::of),
        observed_removals,
    }
}

/// Sizes a policy from a window analysis ([`sizing::recommend`]) and returns the whole report.
pub fn size(w: &WindowAnalysis, spec: &TerminationPolicySpec) -> AnalysisReport {
    sized(w, spec, w.nodes.clone(), w.advice.clone())
}

/// [`size`] without the per-node windows (`nodes` empty) and with at most `per_reason` per-node
/// advice items of each reason ([`advisor::bounded`]): what one policy's status needs, without
/// a copy of every node and every node's advice per policy (20 policies reconciled at once over
/// 5,000 nodes held ~40 MiB of such copies; docs/benchmarks/memory.md "Operator memory"). The per-node
/// windows stay in `w`.
pub fn size_summary(w: &WindowAnalysis, spec: &TerminationPolicySpec, per_reason: usize) -> AnalysisReport {
    sized(w, spec, Vec::new(), advisor::bounded(&w.advice, per_reason))
}

fn sized(w: &WindowAnalysis, spec: &TerminationPolicySpec, nodes: Vec<NodeWindow>, advice: Vec<Advice>) -> AnalysisReport {
    let recommendation = sizing::recommend(&w.window, spec);
    AnalysisReport {
        coverage: coverage(&w.nodes, w.window.basis, recommendation.pre_stop_seconds),
        interval: w.interval,
        nodes,
        worst_node: w.window.worst_node.clone(),
        sync_p99_seconds: w.sync_p99_seconds,
        network_programming_p99_seconds: w.network_programming_p99_seconds,
        propagation_window_seconds: w.window.propagation_window_seconds,
        histogram_kind: w.histogram_kind,
        min_sync_period_seconds: w.min_sync_period_seconds,
        min_sync_period_source: w.min_sync_period_source.clone(),
        recommendation,
        control_plane_lag: w.control_plane_lag.clone(),
        observed_removals: w.observed_removals.clone(),
        proxy: w.proxy.clone(),
        advice: {
            let mut advice = advice;
            let p = &spec.pre_stop;
            if let (Basis::Measured | Basis::LowSampleCount, Some(win)) = (w.window.basis, w.window.propagation_window_seconds)
                && let Some(a) = advisor::sleep_below_window(win, p.safety_factor, p.extra_seconds, sizing::pre_stop_bounds(p).1)
            {
                advice.push(a);
            }
            advice
        },
    }
}

/// The window analyses of one measurement generation, one per distinct options and
/// `minSamples`: every policy and the metrics export of that generation reuse them, and a new
/// generation drops them. Pure (the caller supplies the generation and the inputs).
#[derive(Debug, Default)]
pub struct WindowCache {
    generation: Option<u64>,
    entries: Vec<(u32, AnalysisOptions, Arc<WindowAnalysis>)>,
    computed: u64,
}

impl WindowCache {
    /// The analysis of `generation` for `opts` and `min_samples`, computed from `inputs()` only
    /// when this generation has none for them yet ([`analyze_window_of`]: the inputs are
    /// consumed one at a time).
    pub fn get<I: IntoIterator<Item = NodeInput>>(
        &mut self,
        generation: u64,
        opts: &AnalysisOptions,
        min_samples: u32,
        inputs: impl FnOnce() -> I,
    ) -> Arc<WindowAnalysis> {
        if self.generation != Some(generation) {
            self.generation = Some(generation);
            self.entries.clear();
        }
        if let Some((_, _, w)) = self.entries.iter().find(|(m, o, _)| *m == min_samples && o == opts) {
            return w.clone();
        }
        let w = Arc::new(analyze_window_of(inputs(), opts, min_samples));
        self.computed += 1;
        // one entry per minSamples: options that changed within a generation (the Service and
        // endpoint counts are options: they change with every Service created or deleted)
        // replace the older analysis instead of adding one. Keeping them all held one 5,000-node
        // analysis per count seen until the next generation: 400 MiB while 500 Services were
        // deleted and re-created (docs/benchmarks/memory.md "Operator memory")
        self.entries.retain(|(m, _, _)| *m != min_samples);
        self.entries.push((min_samples, opts.clone(), w.clone()));
        w
    }

    /// How many analyses were computed so far (the rest were reused).
    pub fn computed(&self) -> u64 {
        self.computed
    }

    /// How many analyses are kept (at most one per `minSamples`).
    pub fn kept(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_options_assume_kube_proxys_one_second_min_sync_period() {
        // a derived Default gave 0 s, silently dropping minSyncPeriod from W
        let o = AnalysisOptions::default();
        assert_eq!(o.min_sync_period_seconds, 1.0);
        assert_eq!(o.min_sync_period_source, "default");
        assert_eq!(o.thresholds, Thresholds::default());
    }
}

#[cfg(test)]
mod mixed_mode_tests {
    use super::*;
    use crate::core::advisor::AdviceReason;
    use crate::core::exposition::parse_kube_proxy_metrics;

    #[test]
    fn mixed_modes_each_get_their_migration_advice() {
        let node = |name: &str, mode| NodeInput {
            node: name.into(),
            later: parse_kube_proxy_metrics("kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"+Inf\"} 0\n").unwrap(),
            earlier: None,
            proxy_mode: Some(mode),
        };
        let opts = AnalysisOptions { min_sync_period_seconds: 1.0, facts: ClusterFacts { services: Some(1500), ..Default::default() }, ..Default::default() };
        // one iptables node, one nftables node: the iptables one still needs moving
        let r = analyze(&[node("a", ProxyMode::Nftables), node("b", ProxyMode::Iptables)], &opts, &TerminationPolicySpec::default());
        let migrate: Vec<_> = r.advice.iter().filter(|a| a.reason == AdviceReason::MigrateProxyMode).collect();
        assert_eq!(migrate.len(), 1, "{migrate:?}");
        assert_eq!(migrate[0].to, Some(ProxyMode::Nftables));
        assert!(migrate[0].message.contains("on some nodes"), "{}", migrate[0].message);
    }
}

#[cfg(test)]
mod low_sample_tests {
    use super::*;
    use crate::core::advisor::AdviceReason;
    use crate::core::exposition::parse_kube_proxy_metrics;

    /// A node whose `n` syncs all took at most 0.1 s.
    fn fast(name: &str, n: u32) -> NodeInput {
        let sync = "kubeproxy_sync_proxy_rules_duration_seconds_bucket";
        let text = format!("{sync}{{le=\"0.1\"}} {n}\n{sync}{{le=\"16.384\"}} {n}\n{sync}{{le=\"+Inf\"}} {n}\n");
        NodeInput { node: name.into(), later: parse_kube_proxy_metrics(&text).unwrap(), earlier: None, proxy_mode: None }
    }

    /// A node whose `n` syncs all took longer than the top bucket, 16.384 s.
    fn beyond(name: &str, n: u32) -> NodeInput {
        let sync = "kubeproxy_sync_proxy_rules_duration_seconds_bucket";
        let text = format!("{sync}{{le=\"0.1\"}} 0\n{sync}{{le=\"16.384\"}} 0\n{sync}{{le=\"+Inf\"}} {n}\n");
        NodeInput { node: name.into(), later: parse_kube_proxy_metrics(&text).unwrap(), earlier: None, proxy_mode: None }
    }

    fn reasons(r: &AnalysisReport) -> Vec<(AdviceReason, Option<String>)> {
        r.advice.iter().map(|a| (a.reason, a.node.clone())).collect()
    }

    /// A node whose `n` syncs took (0, 2] s for 98% and (2, 2.2] s for the rest.
    fn slow(name: &str, n: u32) -> NodeInput {
        let sync = "kubeproxy_sync_proxy_rules_duration_seconds_bucket";
        let text = format!("{sync}{{le=\"2\"}} {}\n{sync}{{le=\"2.2\"}} {n}\n{sync}{{le=\"+Inf\"}} {n}\n", n * 98 / 100);
        NodeInput { node: name.into(), later: parse_kube_proxy_metrics(&text).unwrap(), earlier: None, proxy_mode: None }
    }

    /// The coverage at the sized sleep: the mean of the counted nodes' shares, the lowest node
    /// named; a low-sample node is not counted while a trusted one is.
    #[test]
    fn coverage_is_the_mean_share_over_the_counted_nodes() {
        let spec: TerminationPolicySpec = serde_json::from_value(serde_json::json!({"preStop": {"safetyFactor": 1.0, "minSeconds": 1}})).unwrap();
        let r = analyze(&[fast("a", 104), slow("b", 100), beyond("c", 1)], &AnalysisOptions::default(), &spec);
        // W from b (4.295744 s, tests/reference/window_distribution_reference.py): ceil = 5 s, which
        // covers all of a's windows (at most 1.2 s) and 0.995... of b's
        assert_eq!(r.recommendation.pre_stop_seconds, 5);
        let c = r.coverage.clone().unwrap();
        assert_eq!((c.pre_stop_seconds, c.nodes, c.lowest_node.as_str()), (5, 2, "b"));
        let b_share = r.nodes[1].coverage_at(5).unwrap();
        assert!(b_share > 0.99 && b_share < 1.0, "{b_share}");
        assert_eq!(c.lowest_node_ratio, b_share);
        assert!((c.ratio - (1.0 + b_share) / 2.0).abs() < 1e-12, "{c:?}");
        assert_eq!(coverage_percent(c.ratio), format!("{:.1}%", ((1.0 + b_share) / 2.0 * 1000.0).floor() / 10.0));
        // no data: no coverage
        assert_eq!(coverage(&[], Basis::NoData, 5), None);
    }

    #[test]
    fn observed_removals_raise_w_and_stand_for_it_where_the_model_has_none() {
        let spec: TerminationPolicySpec = serde_json::from_value(serde_json::json!({"preStop": {"safetyFactor": 1.0, "minSeconds": 1}})).unwrap();
        let observed = |removals: usize, p99_seconds: f64| RemovalSummary {
            removals,
            censored: 0,
            coarse: 0,
            p99_seconds: Some(p99_seconds),
            p99_at_least_seconds: None,
            coverage_ratio: Some(1.0),
            coverage_removals: removals,
            worst_miss: None,
        };
        let model = analyze(&[slow("b", 100)], &AnalysisOptions::default(), &spec).propagation_window_seconds.unwrap();
        // above the model's W: it sets W
        let opts = AnalysisOptions { observed: Some(observed(5, model + 1.0)), ..Default::default() };
        let r = analyze(&[slow("b", 100)], &opts, &spec);
        assert_eq!(r.propagation_window_seconds, Some(model + 1.0));
        assert_eq!(r.recommendation.pre_stop_seconds, (model + 1.0).ceil() as u32);
        assert!(r.observed_removals.unwrap().sets_window);
        // below it: W stays the model's; fewer than minSamples (5): not used
        for o in [observed(5, model - 1.0), observed(4, model + 1.0)] {
            let r = analyze(&[slow("b", 100)], &AnalysisOptions { observed: Some(o), ..Default::default() }, &spec);
            assert_eq!(r.propagation_window_seconds, Some(model));
            assert!(!r.observed_removals.unwrap().sets_window);
        }
        // no kube-proxy histogram at all (a Cilium node): the observed p99 is W
        let r = analyze(&[], &AnalysisOptions { observed: Some(observed(6, 1.4)), ..Default::default() }, &spec);
        assert_eq!((r.propagation_window_seconds, r.recommendation.pre_stop_seconds), (Some(1.4), 2));
        assert_eq!(r.recommendation.reason, Basis::Measured);
    }

    #[test]
    fn coverage_percent_never_rounds_up_to_a_full_cover() {
        assert_eq!(coverage_percent(0.9996), "99.9%");
        assert_eq!(coverage_percent(1.0), "100.0%");
        assert_eq!(coverage_percent(0.0), "0.0%");
        assert_eq!(coverage_percent(0.5), "50.0%");
    }

    /// ProxySyncSlow on an iptables node names the remedy: a faster node in nftables mode
    /// measured over the same window when there is one (its sync p99: 0.1 x 0.99 = 0.099 s),
    /// else nftables mode in general; a slow nftables node gets no migration advice.
    #[test]
    fn a_slow_iptables_node_is_pointed_at_the_faster_nftables_node() {
        let mode = |mut n: NodeInput, m| {
            n.proxy_mode = Some(m);
            n
        };
        let slow_message = |inputs: &[NodeInput]| {
            let r = analyze(inputs, &AnalysisOptions::default(), &TerminationPolicySpec::default());
            r.advice.iter().find(|a| a.reason == AdviceReason::ProxySyncSlow).map(|a| a.message.clone()).expect("ProxySyncSlow")
        };
        let m = slow_message(&[mode(slow("a", 100), ProxyMode::Iptables), mode(fast("b", 104), ProxyMode::Nftables)]);
        assert!(m.starts_with("node a: kube-proxy sync p99 is 2.") && m.ends_with(" Node b runs nftables mode and syncs at p99 0.099 s over the same window: moving this node to nftables mode is the lasting fix, the sleep only covers for it."), "{m}");
        let m = slow_message(&[mode(slow("a", 100), ProxyMode::Iptables), mode(fast("b", 104), ProxyMode::Iptables)]);
        assert!(
            m.ends_with(" The lasting fix is nftables mode (GA in Kubernetes 1.33, needs kernel 5.13+ on every node), which syncs only what changed."),
            "{m}"
        );
        let m = slow_message(&[mode(slow("a", 100), ProxyMode::Nftables), mode(fast("b", 104), ProxyMode::Nftables)]);
        assert!(m.ends_with("unless their preStop sleep covers it."), "{m}");
    }

    /// With no node at all (an eBPF dataplane: no kube-proxy), the configured mode is the
    /// cluster's (tests/e2e_in_process.rs reports a Cilium cluster as `ebpf` so).
    #[test]
    fn the_configured_mode_is_the_clusters_when_no_node_reports_one() {
        let opts = AnalysisOptions { configured_mode: Some(ProxyMode::Ebpf), ..Default::default() };
        assert_eq!(analyze(&[], &opts, &TerminationPolicySpec::default()).proxy.mode, ProxyMode::Ebpf);
        let mut b = fast("b", 104);
        b.proxy_mode = Some(ProxyMode::Nftables);
        assert_eq!(analyze(&[b], &opts, &TerminationPolicySpec::default()).proxy.mode, ProxyMode::Nftables);
    }

    /// The configured mode (one node's configz) only fills in a node that reports none: the
    /// operator passed it as the user's flag, so a cluster mid-migration had every node in
    /// node-a's mode (both nodes `iptables` in the slow-sync experiment, node-b running
    /// nftables) and no advice could name the nftables node.
    #[test]
    fn the_configured_mode_does_not_override_a_node_that_reports_its_own() {
        let mut b = fast("b", 104);
        b.proxy_mode = Some(ProxyMode::Nftables);
        let opts = AnalysisOptions { configured_mode: Some(ProxyMode::Iptables), ..Default::default() };
        let r = analyze(&[slow("a", 100), b], &opts, &TerminationPolicySpec::default());
        let modes: Vec<(ProxyMode, &str)> = r.nodes.iter().map(|n| (n.mode, n.mode_source)).collect();
        assert_eq!(modes, [(ProxyMode::Iptables, "kube-proxy configuration"), (ProxyMode::Nftables, "proxyMode endpoint")]);
        // the user's flag still overrides every node
        let mut b = fast("b", 104);
        b.proxy_mode = Some(ProxyMode::Nftables);
        let opts = AnalysisOptions { mode: Some(ProxyMode::Ipvs), configured_mode: Some(ProxyMode::Iptables), ..Default::default() };
        let r = analyze(&[slow("a", 100), b], &opts, &TerminationPolicySpec::default());
        assert!(r.nodes.iter().all(|n| (n.mode, n.mode_source) == (ProxyMode::Ipvs, "flag")), "{:?}", r.nodes);
    }

    /// README: BeyondTopBucket needs a trusted node; a node below minSamples is LowSampleCount
    /// (even when its few samples are beyond the top bucket), does not set the window while
    /// another node is trusted, and raises no ProxySyncSlow. One sync of 104 + one sync beyond
    /// 16 s gave BeyondTopBucket, worst node b and a 60 s sleep.
    #[test]
    fn a_low_sample_node_beyond_the_top_bucket_does_not_override_a_trusted_node() {
        let r = analyze(&[fast("a", 104), beyond("b", 1)], &AnalysisOptions::default(), &TerminationPolicySpec::default());
        assert_eq!(r.nodes[1].basis, Basis::LowSampleCount);
        assert_eq!(r.nodes[1].sync_p99.map(|q| (q.seconds, q.beyond_top_bucket)), Some((16.384, true)));
        assert_eq!(r.nodes[0].basis, Basis::Measured);
        assert_eq!(r.worst_node.as_deref(), Some("a"));
        let p99 = 0.1 * (0.99 * 104.0) / 104.0;
        // the window p99 of 104 syncs in (0, 0.1] with minSyncPeriod 1 s (1.114119 s from an
        // independent implementation of src/core/window_distribution.rs)
        assert!((r.propagation_window_seconds.unwrap() - 1.114119).abs() < 1e-5, "{:?}", r.propagation_window_seconds);
        assert!((r.sync_p99_seconds.unwrap() - p99).abs() < 1e-12, "{:?}", r.sync_p99_seconds);
        assert_eq!(r.recommendation.reason, Basis::Measured);
        assert_eq!((r.recommendation.pre_stop_seconds, r.recommendation.termination_grace_period_seconds), (3, 33));
        assert_eq!(reasons(&r), [(AdviceReason::LowSampleCount, Some("b".to_string()))]);
    }

    /// Alone, a 3-sample node beyond the top bucket is LowSampleCount: its slow samples still
    /// raise the sleep (syncs of 16.384 s with minSyncPeriod 1 s: W = 1 + 16.384 + 16.384 x
    /// (0.99 - 1 / 17.384) / (16.384 / 17.384) = 33.594 s, max(default 10, ceil(33.594 x 1.25))
    /// = 42 s), but it is not
    /// BeyondTopBucket (60 s) and raises no ProxySyncSlow; with 5 samples it is trusted.
    #[test]
    fn a_lone_low_sample_node_beyond_the_top_bucket_is_low_sample_count() {
        let spec = TerminationPolicySpec::default();
        let r = analyze(&[beyond("c", 3)], &AnalysisOptions::default(), &spec);
        assert_eq!(r.nodes[0].basis, Basis::LowSampleCount);
        assert_eq!(r.worst_node.as_deref(), Some("c"));
        assert!((r.propagation_window_seconds.unwrap() - 33.59416).abs() < 1e-5, "{:?}", r.propagation_window_seconds);
        assert_eq!(r.recommendation.reason, Basis::LowSampleCount);
        assert_eq!((r.recommendation.pre_stop_seconds, r.recommendation.termination_grace_period_seconds), (42, 72));
        assert_eq!(reasons(&r), [(AdviceReason::LowSampleCount, Some("c".to_string()))]);

        let r = analyze(&[fast("a", 104), beyond("c", 5)], &AnalysisOptions::default(), &spec);
        assert_eq!(r.nodes[1].basis, Basis::BeyondTopBucket);
        assert_eq!(r.worst_node.as_deref(), Some("c"));
        assert_eq!(r.recommendation.reason, Basis::BeyondTopBucket);
        assert_eq!(r.recommendation.pre_stop_seconds, 60);
        let rs = reasons(&r);
        assert_eq!(rs, [(AdviceReason::ProxySyncSlow, Some("c".to_string())), (AdviceReason::BeyondTopBucket, Some("c".to_string()))]);
    }
}

#[cfg(test)]
mod cache_tests {
    use super::*;
    use crate::core::exposition::parse_kube_proxy_metrics;

    fn inputs() -> Vec<NodeInput> {
        let sync = "kubeproxy_sync_proxy_rules_duration_seconds_bucket";
        let text = format!("{sync}{{le=\"0.1\"}} 100\n{sync}{{le=\"+Inf\"}} 100\n");
        vec![NodeInput { node: "a".into(), later: parse_kube_proxy_metrics(&text).unwrap(), earlier: None, proxy_mode: None }]
    }

    #[test]
    fn one_analysis_per_generation_serves_every_policy_and_equals_a_fresh_one() {
        let opts = AnalysisOptions::default();
        let mut cache = WindowCache::default();
        let (a, mut b) = (TerminationPolicySpec::default(), TerminationPolicySpec::default());
        b.pre_stop.safety_factor = 3.0;
        let ra = size(&cache.get(1, &opts, a.pre_stop.min_samples, inputs), &a);
        let rb = size(&cache.get(1, &opts, b.pre_stop.min_samples, || -> Vec<NodeInput> { unreachable!("reused") }), &b);
        assert_eq!(cache.computed(), 1);
        assert_eq!(ra, analyze(&inputs(), &opts, &a));
        assert_eq!(rb, analyze(&inputs(), &opts, &b));
        assert!(rb.recommendation.pre_stop_seconds >= ra.recommendation.pre_stop_seconds);
        // another minSamples or other options: analysed separately; a new generation: again
        cache.get(1, &opts, a.pre_stop.min_samples + 1, inputs);
        cache.get(1, &AnalysisOptions { min_sync_period_seconds: 2.0, ..Default::default() }, a.pre_stop.min_samples, inputs);
        assert_eq!(cache.computed(), 3);
        cache.get(2, &opts, a.pre_stop.min_samples, inputs);
        cache.get(2, &opts, a.pre_stop.min_samples, || -> Vec<NodeInput> { unreachable!("reused") });
        assert_eq!(cache.computed(), 4);
    }

    #[test]
    fn options_changing_within_a_generation_replace_the_analysis_instead_of_piling_up() {
        // the Service count is an option: 500 Services deleted one by one within one
        // generation gave 500 analyses kept until the next generation
        let mut cache = WindowCache::default();
        let spec = TerminationPolicySpec::default();
        for services in 0..500 {
            let opts = AnalysisOptions { facts: ClusterFacts { services: Some(10_000 - services), ..Default::default() }, ..Default::default() };
            let w = cache.get(1, &opts, spec.pre_stop.min_samples, inputs);
            assert_eq!(w.proxy.services, Some(10_000 - services));
            assert_eq!(*w, analyze_window(&inputs(), &opts, spec.pre_stop.min_samples));
        }
        assert_eq!((cache.computed(), cache.kept()), (500, 1));
        // another minSamples is kept beside it; the same options again are reused
        let opts = AnalysisOptions { facts: ClusterFacts { services: Some(9_501), ..Default::default() }, ..Default::default() };
        cache.get(1, &opts, spec.pre_stop.min_samples + 1, inputs);
        cache.get(1, &opts, spec.pre_stop.min_samples, || -> Vec<NodeInput> { unreachable!("reused") });
        assert_eq!((cache.computed(), cache.kept()), (501, 2));
    }
}
