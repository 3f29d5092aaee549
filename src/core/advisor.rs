//! The proxy-mode advisor: turns node windows, the proxy mode, cluster counts and the Kubernetes
//! version into advice items, each with a reason code, a message and the threshold crossed.
//!
//! Sources of the thresholds (all parameters, see [`Thresholds`]):
//! - sync p99 above 1 s: every endpoint change then takes over a second to reach a node's rules,
//!   longer than the common `sleep 3` margin once minSyncPeriod and two syncs add up;
//! - iptables past ~1,000 Services: the KUBE-SERVICES chain is walked linearly per packet and
//!   restores grow with rule count (KEP-3866 nftables motivation); nftables is GA in 1.33 and
//!   needs kernel 5.13+;
//! - IPVS at any size: deprecated in 1.35, feature gate `KubeProxyIPVS` in 1.37, off by default in
//!   1.40 (kube-proxy then exits in ipvs mode unless the gate is enabled), removed in 1.43
//!   ([KEP-5495](https://github.com/kubernetes/enhancements/issues/5495); kube-proxy 1.37's own
//!   warning names 1.40 and 1.43, `cmd/kube-proxy/app/server_linux.go`);
//! - a mode left to kube-proxy's default (an empty `mode` in its configuration), on iptables
//!   before 1.40: 1.40 makes nftables the default
//!   ([KEP-5343](https://github.com/kubernetes/enhancements/issues/5343)), so the nodes change mode
//!   at that upgrade unless `mode` is set; kube-proxy 1.37 warns at start for the same reason
//!   ("No kube-proxy mode specified", event `KubeProxyDefaultMode`);
//! - ~8,000 Services or conntrack pressure: beyond what any kube-proxy mode handles well; an eBPF
//!   dataplane (Cilium, Calico eBPF) replaces kube-proxy and, in practice, the CNI. Conntrack
//!   usage is an input of `analyze --conntrack-usage` only: the operator does not measure it
//!   (neither kube-proxy nor the agent reports it), so its advice is by Services alone;
//! - stale proxy: changes queued and not synced for over 30 s (kube-proxy's own healthz rule,
//!   [`crate::core::model::NodeWindow::stale_seconds`]; OpenShift's network operator alerts at 30 s too).

use crate::core::model::{Basis, NodeWindow, ProxyMode};
use crate::core::proxyconfig::ModeOrigin;
use serde::Serialize;

/// Advice reason codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum AdviceReason {
    /// A node's sync p99 is above the slow-sync threshold.
    ProxySyncSlow,
    /// Move to another proxy mode (nftables or an eBPF dataplane).
    MigrateProxyMode,
    /// kube-proxy's configuration leaves the mode to kube-proxy's default, which becomes
    /// nftables in Kubernetes 1.40: set it.
    ProxyModeDefaulted,
    /// A node has changes queued for longer than the stale threshold.
    ProxyStale,
    /// A node's histogram has too few samples to trust its p99.
    LowSampleCount,
    /// A node's p99 is above the top histogram bucket.
    BeyondTopBucket,
    /// The window needs a longer sleep than the policy's `preStop.maxSeconds` allows: the
    /// clamped sleep does not cover it.
    SleepBelowWindow,
}

/// Severity of an advice item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Severity {
    /// Causes connection errors or hides the truth now.
    Warning,
    /// Worth knowing.
    Info,
}

/// One advice item.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Advice {
    /// Reason code.
    pub reason: AdviceReason,
    /// Severity.
    pub severity: Severity,
    /// What is wrong and what to do.
    pub message: String,
    /// The threshold crossed, e.g. `sync p99 > 1 s`.
    pub threshold: String,
    /// The node concerned, for per-node items.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Target mode for MigrateProxyMode (`nftables` or `ebpf`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<ProxyMode>,
}

/// Advisor thresholds (defaults in [`Default`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Thresholds {
    /// ProxySyncSlow when a node's sync p99 is strictly above this, seconds. Default 1.
    pub sync_slow_seconds: f64,
    /// MigrateProxyMode to nftables when iptables serves at least this many Services. Default 1000.
    pub iptables_services: u64,
    /// MigrateProxyMode to eBPF at or above this many Services. Default 8000.
    pub ebpf_services: u64,
    /// MigrateProxyMode to eBPF at or above this conntrack table usage (entries / limit). Default 0.8.
    pub conntrack_usage_ratio: f64,
    /// ProxyStale when changes have waited for a sync longer than this, seconds. Default 30.
    pub stale_seconds: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self { sync_slow_seconds: 1.0, iptables_services: 1000, ebpf_services: 8000, conntrack_usage_ratio: 0.8, stale_seconds: 30.0 }
    }
}

/// Cluster-wide inputs of the advisor besides the node windows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterFacts {
    /// Proxy mode (the most common among nodes, or given).
    pub mode: ProxyMode,
    /// Other modes some nodes run (a cluster mid-migration, or mixed node pools): each gets its
    /// own migration advice.
    pub other_modes: Vec<ProxyMode>,
    /// Whether kube-proxy's configuration (its ConfigMap, or `/configz`) sets the mode or leaves
    /// it to kube-proxy's default; None when no configuration was read.
    pub mode_origin: Option<ModeOrigin>,
    /// Number of Services.
    pub services: Option<u64>,
    /// Number of Service ports (defaults to the Service count when unknown).
    pub service_ports: Option<u64>,
    /// Number of endpoints.
    pub endpoints: Option<u64>,
    /// Kubernetes version `(major, minor)`.
    pub kubernetes_version: Option<(u32, u32)>,
    /// conntrack entries / limit on the worst node, 0..1: given to `analyze` only
    /// (`--conntrack-usage`); None in the operator, which does not measure it.
    pub conntrack_usage_ratio: Option<f64>,
    /// The observed removals' p99 per data plane (`iptables-nft`, `nftables`, `cilium`, ...),
    /// seconds, from the node agents (empty without them): the eBPF advice quotes them, so it
    /// rests on the windows this cluster's own data planes showed.
    pub observed_p99_by_data_plane: Vec<(String, f64)>,
}

/// Parses `v1.29.0`, `1.33`, `v1.35.2-eks-1234` into `(major, minor)`.
pub fn parse_version(s: &str) -> Option<(u32, u32)> {
    let s = s.trim().trim_start_matches('v');
    let mut it = s.split(['.', '-', '+']);
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.trim_end_matches('+').parse().ok()?;
    Some((major, minor))
}

/// Estimated iptables rules: about 2 per Service port plus 2 per endpoint.
pub fn estimated_rules(facts: &ClusterFacts) -> Option<u64> {
    let ports = facts.service_ports.or(facts.services)?;
    Some(2 * ports + 2 * facts.endpoints.unwrap_or(0))
}

/// "3 syncs", "1 sync", or for a count that is not a whole number (text counts are floats; a
/// hand-written or extrapolated histogram) "a count of 0.5 syncs"; None (no sync histogram: the
/// network-programming histogram stood in) says so.
fn samples_phrase(count: Option<f64>, what: &str) -> String {
    let Some(count) = count else {
        return "a few network programming samples (no sync histogram)".to_string();
    };
    match (count.fract() == 0.0, count == 1.0) {
        (true, true) => format!("1 {what}"),
        (true, false) => format!("{count:.0} {what}s"),
        (false, _) => format!("a count of {} {what}s (not a whole number)", (count * 1000.0).round() / 1000.0),
    }
}

fn fmt_s(x: f64) -> String {
    format!("{x:.3} s")
}

/// The migration target named in advice.
const NFTABLES: &str = "nftables mode (GA in Kubernetes 1.33, needs kernel 5.13+ on every node)";

/// IPVS's end, as KEP-5495 plans it and kube-proxy 1.37 warns of it.
const IPVS_END: &str =
    "1.40 turns it off by default (kube-proxy then exits in ipvs mode unless the KubeProxyIPVS feature gate is enabled) and 1.43 removes it (KEP-5495)";

/// What a cluster on a minor before nftables' GA should know first: " This cluster runs 1.N,
/// where nftables is alpha/beta: ...", or "" (1.33 and later, or an unknown version).
fn nftables_maturity(facts: &ClusterFacts) -> String {
    match facts.kubernetes_version {
        Some((1, minor)) if minor < 31 => format!(" This cluster runs 1.{minor}, where nftables is alpha: upgrade to 1.33+ first."),
        Some((1, minor)) if minor < 33 => format!(" This cluster runs 1.{minor}, where nftables is beta: 1.33+ is recommended."),
        _ => String::new(),
    }
}

/// [`AdviceReason::ProxySyncSlow`] per node whose trusted sync p99 is above the threshold; on
/// an iptables or IPVS node it names the remedy: the fastest nftables node measured
/// over the same window when there is one.
fn sync_slow(nodes: &[NodeWindow], t: &Thresholds) -> Vec<Advice> {
    let mut out = Vec::new();
    // the fastest node in nftables mode with a trusted sync p99: the comparison a slow
    // iptables or IPVS node's advice names (one pass, not one per slow node)
    let fastest_nftables = nodes
        .iter()
        .filter(|m| m.mode == ProxyMode::Nftables && matches!(m.basis, Basis::Measured))
        .filter_map(|m| m.sync_p99.filter(|q| !q.beyond_top_bucket).map(|q| (m.node.as_str(), q.seconds)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    for n in nodes {
        if let Some(q) = n.sync_p99.filter(|q| q.seconds > t.sync_slow_seconds && n.basis != Basis::LowSampleCount) {
            let value = if q.beyond_top_bucket { format!("above {}", fmt_s(q.seconds)) } else { fmt_s(q.seconds) };
            // iptables and IPVS rewrite their rules per sync; nftables mode (KEP-3866) writes
            // only what changed, so its syncs stay short as Services grow
            let fix = match (n.mode, fastest_nftables) {
                (ProxyMode::Iptables | ProxyMode::Ipvs, Some((other, p99))) if p99 < q.seconds => format!(
                    " Node {other} runs nftables mode and syncs at p99 {} over the same window: moving this node to nftables mode is the lasting fix, the sleep only covers for it.",
                    fmt_s(p99)
                ),
                (ProxyMode::Iptables | ProxyMode::Ipvs, _) => format!(" The lasting fix is {NFTABLES}, which syncs only what changed."),
                _ => String::new(),
            };
            out.push(item(
                AdviceReason::ProxySyncSlow,
                Severity::Warning,
                format!(
                    "node {}: kube-proxy sync p99 is {value}: every endpoint change can take that long, plus minSyncPeriod, to leave this node's rules, so deploys send new connections to terminating pods unless their preStop sleep covers it.{fix}",
                    n.node
                ),
                format!("sync p99 > {} s", t.sync_slow_seconds),
                Some(&n.node),
                None,
            ));
        }
    }
    out
}

/// Produces the advice items for a cluster, most important first: slow syncs, then proxy-mode
/// migrations, then each node's health (stuck, too few samples, beyond the top bucket).
pub fn advise(nodes: &[NodeWindow], facts: &ClusterFacts, t: &Thresholds, min_samples: u32) -> Vec<Advice> {
    let mut out = sync_slow(nodes, t);
    out.extend(mode_migration(facts, t));
    out.extend(ebpf_migration(facts, t));
    out.extend(mode_defaulted(facts));
    for n in nodes {
        out.extend(node_health(n, t, min_samples));
    }
    out
}

fn item(reason: AdviceReason, severity: Severity, message: String, threshold: String, node: Option<&str>, to: Option<ProxyMode>) -> Advice {
    Advice { reason, severity, message, threshold, node: node.map(str::to_string), to }
}

/// [`AdviceReason::MigrateProxyMode`] to nftables for each mode in use (the cluster's, then any
/// other a node reports) that is IPVS (deprecated since Kubernetes 1.35), or iptables with at
/// least `t.iptables_services` Services; with a note on nftables' maturity in older minors.
fn mode_migration(facts: &ClusterFacts, t: &Thresholds) -> Vec<Advice> {
    let services = facts.services;
    let version_note = nftables_maturity(facts);
    let mut modes = vec![facts.mode];
    modes.extend(facts.other_modes.iter().copied().filter(|m| *m != facts.mode));
    let mut out = Vec::new();
    for mode in modes {
        match mode {
            ProxyMode::Ipvs => out.push(item(
                AdviceReason::MigrateProxyMode,
                Severity::Warning,
                format!(
                    "kube-proxy runs in IPVS mode, deprecated since Kubernetes 1.35: {IPVS_END}; migrate to {NFTABLES}, or to an eBPF dataplane at large scale.{version_note}"
                ),
                "mode = ipvs (any size)".into(),
                None,
                Some(ProxyMode::Nftables),
            )),
            ProxyMode::Iptables if services.is_some_and(|s| s >= t.iptables_services) => out.push(item(
                AdviceReason::MigrateProxyMode,
                Severity::Warning,
                format!(
                    "kube-proxy runs in iptables mode{} with {} Services: rule restores and the per-packet walk of KUBE-SERVICES grow with every Service; migrate to {NFTABLES}.{version_note}",
                    if facts.other_modes.is_empty() { "" } else { " on some nodes" },
                    services.unwrap_or(0)
                ),
                format!("iptables with >= {} Services", t.iptables_services),
                None,
                Some(ProxyMode::Nftables),
            )),
            _ => {}
        }
    }
    out
}

/// [`AdviceReason::ProxyModeDefaulted`] when kube-proxy's configuration leaves its mode empty
/// while nodes run iptables mode, the Kubernetes version below 1.40 or unknown: from 1.40
/// kube-proxy defaults an empty mode to nftables (KEP-5343), so these nodes change mode at that
/// upgrade. The advice is to set `mode`, nftables being the migration target, and names IPVS's
/// end (it is no way to keep a mode).
fn mode_defaulted(facts: &ClusterFacts) -> Option<Advice> {
    let iptables = facts.mode == ProxyMode::Iptables || facts.other_modes.contains(&ProxyMode::Iptables);
    let before_1_40 = facts.kubernetes_version.is_none_or(|v| v < (1, 40));
    if facts.mode_origin != Some(ModeOrigin::Defaulted) || !iptables || !before_1_40 {
        return None;
    }
    Some(item(
        AdviceReason::ProxyModeDefaulted,
        Severity::Info,
        format!(
            "kube-proxy's configuration leaves `mode` empty, so kube-proxy runs its default, iptables; from Kubernetes 1.40 the default is nftables (KEP-5343), so these nodes change mode at that upgrade unless `mode` is set (kube-proxy 1.37+ warns at start, event KubeProxyDefaultMode). Set `mode` explicitly: `mode: nftables`, the migration target ({NFTABLES}), or `mode: iptables` to keep today's mode through the upgrade. Not `mode: ipvs`: deprecated since 1.35, {IPVS_END}.{}",
            nftables_maturity(facts)
        ),
        "mode empty in kube-proxy's configuration, Kubernetes < 1.40".into(),
        None,
        Some(ProxyMode::Nftables),
    ))
}

/// [`AdviceReason::MigrateProxyMode`] to an eBPF dataplane, unless the cluster runs one: at
/// least `t.ebpf_services` Services, or a conntrack table fuller than
/// `t.conntrack_usage_ratio` where its usage is known (`analyze --conntrack-usage`; the
/// operator does not measure it, so its threshold names conntrack only then).
fn ebpf_migration(facts: &ClusterFacts, t: &Thresholds) -> Option<Advice> {
    if facts.mode == ProxyMode::Ebpf {
        return None;
    }
    let services = facts.services;
    let big = services.is_some_and(|s| s >= t.ebpf_services);
    let conntrack = facts.conntrack_usage_ratio.is_some_and(|r| r >= t.conntrack_usage_ratio);
    if !(big || conntrack) {
        return None;
    }
    let why = if big {
        format!("{} Services", services.unwrap_or(0))
    } else {
        format!("conntrack table {:.0}% full", facts.conntrack_usage_ratio.unwrap_or(0.0) * 100.0)
    };
    // what this cluster's own data planes showed, when the agents observed them
    let observed = if facts.observed_p99_by_data_plane.is_empty() {
        String::new()
    } else {
        let each: Vec<String> = facts.observed_p99_by_data_plane.iter().map(|(plane, p99)| format!("{plane} {p99:.3} s")).collect();
        format!(" (observed removals here, p99: {})", each.join(", "))
    };
    Some(item(
        AdviceReason::MigrateProxyMode,
        Severity::Warning,
        format!(
            "{why}: consider an eBPF dataplane (Cilium or Calico eBPF kube-proxy replacement){observed}; it replaces kube-proxy and, in practice, the CNI, so plan it as a network migration"
        ),
        match facts.conntrack_usage_ratio {
            Some(_) => format!(">= {} Services or conntrack usage >= {:.0}%", t.ebpf_services, t.conntrack_usage_ratio * 100.0),
            None => format!(">= {} Services", t.ebpf_services),
        },
        None,
        Some(ProxyMode::Ebpf),
    ))
}

/// A node's own findings: [`AdviceReason::ProxyStale`] (changes queued longer than
/// `t.stale_seconds` without a completed sync), then [`AdviceReason::LowSampleCount`] (fewer
/// than `min_samples`) or [`AdviceReason::BeyondTopBucket`] (the p99 in the `+Inf` bucket).
fn node_health(n: &NodeWindow, t: &Thresholds, min_samples: u32) -> Vec<Advice> {
    let mut out = Vec::new();
    if let Some(stale) = n.stale_seconds.filter(|s| *s > t.stale_seconds) {
        out.push(item(
            AdviceReason::ProxyStale,
            Severity::Warning,
            format!(
                "node {}: kube-proxy has had changes queued for {} without a completed sync: it is stuck or far behind; check its logs and restore failures",
                n.node,
                fmt_s(stale)
            ),
            format!("changes queued without a sync for > {} s", t.stale_seconds),
            Some(&n.node),
            None,
        ));
    }
    match n.basis {
        Basis::LowSampleCount => out.push(item(
            AdviceReason::LowSampleCount,
            Severity::Info,
            format!(
                "node {}: only {} in the analysed interval: its p99 is not trusted for sizing",
                n.node,
                samples_phrase(n.sync_p99.map(|_| n.sync_samples), "sync")
            ),
            format!("samples < {min_samples}"),
            Some(&n.node),
            None,
        )),
        Basis::BeyondTopBucket => out.push(item(
            AdviceReason::BeyondTopBucket,
            Severity::Warning,
            format!(
                "node {}: the p99 lies beyond the top histogram bucket: the real value is unknown and larger; the preStop sleep is set to the policy maximum",
                n.node
            ),
            "p99 rank in the +Inf bucket".into(),
            Some(&n.node),
            None,
        )),
        _ => {}
    }
    out
}

/// `advice` with at most `per_reason` per-node items (those naming a node) of each reason, in
/// their order; the rest of a reason's items become one summary item after its last kept one
/// (the same reason, severity and threshold; no node), saying how many more nodes and how many
/// in all. Cluster-wide items are all kept. What a TerminationPolicy's status shows: one item
/// per node of a 5,000-node cluster made each status about 1 MB, near etcd's object limit, and
/// the operator's heap grew by ~100 MiB per round of status writes (docs/benchmarks/memory.md "Operator
/// memory"). Every node's figures stay in the per-node metrics and `safe-termination analyze`.
/// Pure.
pub fn bounded(advice: &[Advice], per_reason: usize) -> Vec<Advice> {
    // per reason of per-node items: (reason, items in all, items seen so far)
    let mut counts: Vec<(AdviceReason, usize, usize)> = Vec::new();
    for a in advice.iter().filter(|a| a.node.is_some()) {
        match counts.iter_mut().find(|(r, _, _)| *r == a.reason) {
            Some(c) => c.1 += 1,
            None => counts.push((a.reason, 1, 0)),
        }
    }
    let mut out: Vec<Advice> = Vec::with_capacity(advice.len().min(counts.len() * (per_reason + 1) + 8));
    for a in advice {
        let Some(c) = a.node.is_some().then(|| counts.iter_mut().find(|(r, _, _)| *r == a.reason)).flatten() else {
            out.push(a.clone());
            continue;
        };
        c.2 += 1;
        let (all, n) = (c.1, c.2);
        if n <= per_reason {
            out.push(a.clone());
        }
        if n == all && all > per_reason {
            out.push(Advice {
                reason: a.reason,
                severity: a.severity,
                message: format!(
                    "and {} more node(s) with the same advice ({all} in all; every node's figures are in the operator's per-node metrics)",
                    all - per_reason
                ),
                threshold: a.threshold.clone(),
                node: None,
                to: None,
            });
        }
    }
    out
}

/// [`AdviceReason::SleepBelowWindow`] when the measured window `w_seconds` (a cluster W whose
/// basis is Measured or LowSampleCount) needs `ceil(W x safetyFactor + extraSeconds)` above
/// `max_seconds`: the sleep is clamped to `max_seconds` and new connections can still reach a
/// terminating pod for the rest of the window. `None` otherwise. Pure.
pub fn sleep_below_window(w_seconds: f64, safety_factor: f64, extra_seconds: u32, max_seconds: u32) -> Option<Advice> {
    let needed = ((w_seconds * safety_factor + f64::from(extra_seconds)) - 1e-9).ceil();
    (w_seconds.is_finite() && needed > f64::from(max_seconds)).then(|| Advice {
        reason: AdviceReason::SleepBelowWindow,
        severity: Severity::Warning,
        message: format!(
            "the propagation window W {w_seconds:.3} s needs a {needed} s sleep (x {safety_factor} + {extra_seconds} s), above preStop.maxSeconds {max_seconds} s: the {max_seconds} s sleep leaves pods reachable after they stop; find why kube-proxy is slow (sync and network programming p99 per node) or raise maxSeconds"
        ),
        threshold: format!("ceil(W x safetyFactor + extraSeconds) > maxSeconds {max_seconds} s"),
        node: None,
        to: None,
    })
}

/// The eBPF advice names the conntrack rule only where conntrack usage is known: the operator
/// never measures it, and its threshold said "or conntrack usage >= 80%" all the same.
#[test]
fn the_ebpf_threshold_names_conntrack_only_when_it_is_known() {
    let t = Thresholds::default();
    let ebpf = |facts: &ClusterFacts| {
        let a = advise(&[], facts, &t, 5);
        a.into_iter().find(|a| a.to == Some(ProxyMode::Ebpf)).map(|a| (a.message, a.threshold))
    };
    let operator = ClusterFacts { mode: ProxyMode::Nftables, services: Some(9000), ..Default::default() };
    let (message, threshold) = ebpf(&operator).expect("eBPF advice at 9,000 Services");
    assert_eq!(threshold, ">= 8000 Services");
    assert!(message.starts_with("9000 Services: "), "{message}");
    let measured = ClusterFacts { mode: ProxyMode::Nftables, services: Some(100), conntrack_usage_ratio: Some(0.9), ..Default::default() };
    let (message, threshold) = ebpf(&measured).expect("eBPF advice at 90% conntrack usage");
    assert_eq!(threshold, ">= 8000 Services or conntrack usage >= 80%");
    assert!(message.starts_with("conntrack table 90% full: "), "{message}");
    assert_eq!(ebpf(&ClusterFacts { mode: ProxyMode::Nftables, services: Some(100), ..Default::default() }), None);
    // with the agents' observations: the windows of the cluster's own data planes, quoted
    let observed = ClusterFacts { observed_p99_by_data_plane: vec![("iptables-nft".into(), 1.286), ("cilium".into(), 1.1724)], ..operator.clone() };
    let (message, _) = ebpf(&observed).expect("eBPF advice at 9,000 Services");
    assert!(message.contains("(observed removals here, p99: iptables-nft 1.286 s, cilium 1.172 s);"), "{message}");
}

#[test]
fn sample_counts_read_as_counts() {
    assert_eq!(samples_phrase(Some(3.0), "sync"), "3 syncs");
    assert_eq!(samples_phrase(Some(1.0), "sync"), "1 sync");
    assert_eq!(samples_phrase(Some(0.0), "sync"), "0 syncs");
    // it printed "only 0.5 sync samples"
    assert_eq!(samples_phrase(Some(0.5), "sync"), "a count of 0.5 syncs (not a whole number)");
    assert_eq!(samples_phrase(None, "sync"), "a few network programming samples (no sync histogram)");
}

#[test]
fn bounded_keeps_a_few_nodes_per_reason_and_counts_the_rest() {
    let node = |r, i: usize| Advice {
        reason: r,
        severity: Severity::Info,
        message: format!("node n{i}"),
        threshold: "t".into(),
        node: Some(format!("n{i}")),
        to: None,
    };
    let cluster = Advice {
        reason: AdviceReason::MigrateProxyMode,
        severity: Severity::Warning,
        message: "m".into(),
        threshold: "x".into(),
        node: None,
        to: Some(ProxyMode::Nftables),
    };
    let mut advice: Vec<Advice> = (0..5000).map(|i| node(AdviceReason::ProxySyncSlow, i)).collect();
    advice.push(cluster.clone());
    advice.extend((0..3).map(|i| node(AdviceReason::LowSampleCount, i)));
    let b = bounded(&advice, 5);
    // 5 + the summary, the cluster item, the 3 low-sample items (not above the bound)
    assert_eq!(b.len(), 10, "{b:?}");
    assert_eq!(b[..5], advice[..5]);
    assert_eq!((b[5].reason, b[5].node.as_deref(), b[5].threshold.as_str()), (AdviceReason::ProxySyncSlow, None, "t"));
    assert!(b[5].message.contains("4995 more node(s)") && b[5].message.contains("5000 in all"), "{}", b[5].message);
    assert_eq!(b[6], cluster);
    assert_eq!(b[7..], advice[5001..]);
    // nothing to bound: unchanged
    assert_eq!(bounded(&advice[4998..], 5), advice[4998..].to_vec());
    assert_eq!(bounded(&[], 5), Vec::<Advice>::new());
}

#[test]
fn a_sleep_clamped_below_the_window_is_a_warning() {
    // the fresh tester's scrape: network programming p99 ~90 s, W 88.85 s, maxSeconds 60
    let a = sleep_below_window(88.85, 1.25, 0, 60).expect("warned");
    assert_eq!((a.reason, a.severity), (AdviceReason::SleepBelowWindow, Severity::Warning));
    assert!(a.message.contains("112 s sleep") && a.message.contains("maxSeconds 60 s"), "{}", a.message);
    // exactly at the bound is covered; one second above is not
    assert_eq!(sleep_below_window(48.0, 1.25, 0, 60), None);
    assert!(sleep_below_window(48.01, 1.25, 0, 60).is_some());
    assert!(sleep_below_window(40.0, 1.25, 11, 60).is_some());
    assert_eq!(sleep_below_window(f64::INFINITY, 1.25, 0, 60), None);
}

/// A mode left to kube-proxy's default on iptables before 1.40 gets the advice to set it, with
/// nftables as the target and IPVS's end named; a set mode, an unknown origin (`/configz`), a
/// cluster on nftables or on 1.40 gets none.
#[test]
fn a_defaulted_mode_is_advised_to_be_set_before_1_40() {
    let t = Thresholds::default();
    let defaulted = |facts: &ClusterFacts| advise(&[], facts, &t, 5).into_iter().filter(|a| a.reason == AdviceReason::ProxyModeDefaulted).collect::<Vec<_>>();
    let facts = ClusterFacts { mode: ProxyMode::Iptables, mode_origin: Some(ModeOrigin::Defaulted), ..Default::default() };
    let a = defaulted(&facts);
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!((a[0].severity, a[0].to, a[0].node.as_deref()), (Severity::Info, Some(ProxyMode::Nftables), None));
    assert_eq!(a[0].threshold, "mode empty in kube-proxy's configuration, Kubernetes < 1.40");
    assert_eq!(
        a[0].message,
        "kube-proxy's configuration leaves `mode` empty, so kube-proxy runs its default, iptables; from Kubernetes 1.40 the default is nftables (KEP-5343), so these nodes change mode at that upgrade unless `mode` is set (kube-proxy 1.37+ warns at start, event KubeProxyDefaultMode). Set `mode` explicitly: `mode: nftables`, the migration target (nftables mode (GA in Kubernetes 1.33, needs kernel 5.13+ on every node)), or `mode: iptables` to keep today's mode through the upgrade. Not `mode: ipvs`: deprecated since 1.35, 1.40 turns it off by default (kube-proxy then exits in ipvs mode unless the KubeProxyIPVS feature gate is enabled) and 1.43 removes it (KEP-5495)."
    );
    // on 1.32 the nftables note says beta
    let on_1_32 = defaulted(&ClusterFacts { kubernetes_version: Some((1, 32)), ..facts.clone() });
    assert!(on_1_32[0].message.ends_with("(KEP-5495). This cluster runs 1.32, where nftables is beta: 1.33+ is recommended."), "{}", on_1_32[0].message);
    // some nodes on iptables, the rest already moved
    let mixed = ClusterFacts { mode: ProxyMode::Nftables, other_modes: vec![ProxyMode::Iptables], ..facts.clone() };
    assert_eq!(defaulted(&mixed).len(), 1);
    for (why, other) in [
        ("mode set", ClusterFacts { mode_origin: Some(ModeOrigin::Explicit), ..facts.clone() }),
        ("origin unknown (/configz)", ClusterFacts { mode_origin: Some(ModeOrigin::Unknown), ..facts.clone() }),
        ("no configuration read", ClusterFacts { mode_origin: None, ..facts.clone() }),
        ("nftables already", ClusterFacts { mode: ProxyMode::Nftables, ..facts.clone() }),
        ("1.40: the default is nftables", ClusterFacts { kubernetes_version: Some((1, 40)), ..facts.clone() }),
    ] {
        assert_eq!(defaulted(&other), Vec::<Advice>::new(), "{why}");
    }
}

/// IPVS's advice names its whole end: deprecated in 1.35, off by default in 1.40, removed in 1.43.
#[test]
fn the_ipvs_advice_names_1_40_and_1_43() {
    let a = advise(&[], &ClusterFacts { mode: ProxyMode::Ipvs, ..Default::default() }, &Thresholds::default(), 5);
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(
        a[0].message,
        "kube-proxy runs in IPVS mode, deprecated since Kubernetes 1.35: 1.40 turns it off by default (kube-proxy then exits in ipvs mode unless the KubeProxyIPVS feature gate is enabled) and 1.43 removes it (KEP-5495); migrate to nftables mode (GA in Kubernetes 1.33, needs kernel 5.13+ on every node), or to an eBPF dataplane at large scale."
    );
}
