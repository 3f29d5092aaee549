//! The operator's own metrics (per-node series only on the leader), registered in the process's one registry
//! ([`crate::telemetry::Telemetry`]):
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `safe_termination_kube_proxy_sync_p99_seconds` | gauge | node | sync p99 over the window |
//! | `safe_termination_kube_proxy_network_programming_p99_seconds` | gauge | node | NP p99 |
//! | `safe_termination_kube_proxy_sync_slow` | gauge 0/1 | node | sync p99 above the threshold |
//! | `safe_termination_kube_proxy_stale_seconds` | gauge | node | how long changes have waited for a sync (0: none wait) |
//! | `safe_termination_kube_proxy_nodes` | gauge | state (scraped, failed) | nodes by scrape state |
//! | `safe_termination_kube_proxy_mode` | gauge 1 | node, mode | each node's proxy mode |
//! | `safe_termination_kube_proxy_source` | gauge 1 | node, source | how each measured node was read: kube-proxy (directly), agent, prometheus, file |
//! | `safe_termination_controller_leader` | gauge 0/1 | | this replica holds the lease |
//! | `safe_termination_controller_propagation_window_seconds` | gauge | | cluster W |
//! | `safe_termination_controller_control_plane_lag_p99_seconds` | gauge | | p99 of the control plane's part of the deletions in the rolling window (DELETE to endpoint terminating; absent before the first) |
//! | `safe_termination_controller_control_plane_lag_samples` | gauge | | deletions it is measured on |
//! | `safe_termination_controller_observed_removals` | gauge | | removals the node agents observed in the rolling window (`--observe-removals`) |
//! | `safe_termination_controller_observed_removal_p99_seconds` | gauge | | their p99 (precise removals; 0 before the first) |
//! | `safe_termination_controller_observed_coverage_ratio` | gauge | | share of the precise removals of pods with an injected sleep whose sleep covered the window (1 without one) |
//! | `safe_termination_controller_recommended_prestop_seconds` | gauge | namespace, policy | sized sleep |
//! | `safe_termination_controller_running_pods_min_prestop_seconds` | gauge | namespace, policy | smallest sleep injected into a running pod |
//! | `safe_termination_controller_pods` | gauge | namespace, policy, state | mutated / stale / unprotected |
//! | `safe_termination_controller_migration_recommended` | gauge 1 | from, to | proxy-mode advice |
//! | `safe_termination_controller_reconciles_total` | counter | result | reconciliations |
//! | `safe_termination_controller_reconcile_duration_seconds` | histogram | | reconcile time |
//! | `safe_termination_controller_status_writes_total` | counter | | status patches sent |

use crate::core::advisor::AdviceReason;
use crate::core::analysis::AnalysisReport;
use crate::core::model::NodeWindow;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

type FloatGauge = Gauge<f64, AtomicU64>;

/// `node` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    /// Node name.
    pub node: String,
}

/// `node`, `mode` labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeModeLabel {
    /// Node name.
    pub node: String,
    /// Proxy mode.
    pub mode: String,
}

/// `node`, `source` labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeSourceLabel {
    /// Node name.
    pub node: String,
    /// `kube-proxy`, `agent`, `prometheus` or `file`.
    pub source: String,
}

/// `state` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// State.
    pub state: String,
}

/// `namespace`, `policy` labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabel {
    /// Policy namespace.
    pub namespace: String,
    /// Policy name.
    pub policy: String,
}

/// `namespace`, `policy`, `state` labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyStateLabel {
    /// Policy namespace.
    pub namespace: String,
    /// Policy name.
    pub policy: String,
    /// mutated, stale, unprotected.
    pub state: String,
}

/// `from`, `to` labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MigrationLabel {
    /// Current mode.
    pub from: String,
    /// Recommended mode.
    pub to: String,
}

/// `result` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileResultLabel {
    /// ok or error.
    pub result: String,
}

/// Per-node kube-proxy gauges (component `kube_proxy`).
#[derive(Debug, Clone, Default)]
pub struct KubeProxyMetrics {
    /// Sync p99 per node.
    pub sync_p99: Family<NodeLabel, FloatGauge>,
    /// Network programming p99 per node.
    pub network_programming_p99: Family<NodeLabel, FloatGauge>,
    /// 0/1 per node.
    pub sync_slow: Family<NodeLabel, Gauge>,
    /// Staleness per node.
    pub stale: Family<NodeLabel, FloatGauge>,
    /// Nodes by state.
    pub nodes: Family<StateLabel, Gauge>,
    /// 1 per node and its proxy mode.
    pub mode: Family<NodeModeLabel, Gauge>,
    /// 1 per measured node and the source it was read through.
    pub source: Family<NodeSourceLabel, Gauge>,
}

impl KubeProxyMetrics {
    /// Registers under `safe_termination_kube_proxy_`.
    pub fn register(&self, r: &mut Registry) {
        r.register_with_unit("sync_p99", "kube-proxy sync duration p99 over the window", Unit::Seconds, self.sync_p99.clone());
        r.register_with_unit(
            "network_programming_p99",
            "kube-proxy network programming latency p99 over the window",
            Unit::Seconds,
            self.network_programming_p99.clone(),
        );
        r.register("sync_slow", "1 when the node's sync p99 is above the slow-sync threshold", self.sync_slow.clone());
        r.register_with_unit("stale", "how long kube-proxy's changes have waited for a sync", Unit::Seconds, self.stale.clone());
        r.register("nodes", "kube-proxy nodes by scrape state", self.nodes.clone());
        r.register("mode", "1 for each node's kube-proxy proxy mode", self.mode.clone());
        r.register("source", "1 for each measured node and the source it was read through (kube-proxy, agent, prometheus, file)", self.source.clone());
    }

    /// Removes every series (a replica that does not lead measures nothing).
    pub fn clear(&self) {
        self.sync_p99.clear();
        self.network_programming_p99.clear();
        self.sync_slow.clear();
        self.stale.clear();
        self.nodes.clear();
        self.mode.clear();
        self.source.clear();
    }

    /// Replaces the per-node series with `nodes` (an analysis's node windows; gone nodes
    /// disappear); `sources`: how each measured node was read, by node name.
    pub fn update(&self, nodes: &[NodeWindow], failed: usize, sync_slow_seconds: f64, sources: &std::collections::BTreeMap<String, &'static str>) {
        self.clear();
        for (node, source) in sources {
            self.source.get_or_create(&NodeSourceLabel { node: node.clone(), source: (*source).into() }).set(1);
        }
        for n in nodes {
            self.mode.get_or_create(&NodeModeLabel { node: n.node.clone(), mode: n.mode.as_str().into() }).set(1);
            let l = NodeLabel { node: n.node.clone() };
            if let Some(q) = n.sync_p99 {
                self.sync_p99.get_or_create(&l).set(q.seconds);
                self.sync_slow.get_or_create(&l).set(i64::from(q.seconds > sync_slow_seconds));
            }
            if let Some(q) = n.network_programming_p99 {
                self.network_programming_p99.get_or_create(&l).set(q.seconds);
            }
            if let Some(s) = n.stale_seconds {
                self.stale.get_or_create(&l).set(s);
            }
        }
        self.nodes.get_or_create(&StateLabel { state: "scraped".into() }).set(nodes.len() as i64);
        self.nodes.get_or_create(&StateLabel { state: "failed".into() }).set(failed as i64);
    }
}

/// Controller metrics (component `controller`).
#[derive(Debug, Clone)]
pub struct ControllerMetrics {
    /// Cluster window.
    pub propagation_window: FloatGauge,
    /// The control plane's part of a deletion, p99 over the rolling window.
    pub control_plane_lag_p99: FloatGauge,
    /// Deletions the control plane's part is measured on.
    pub control_plane_lag_samples: Gauge,
    /// Removals observed in the rolling window.
    pub observed_removals: Gauge,
    /// Their p99.
    pub observed_removal_p99: FloatGauge,
    /// The share of them whose pod's own sleep covered the window.
    pub observed_coverage: FloatGauge,
    /// Recommended sleep per policy.
    pub recommended_prestop: Family<PolicyLabel, Gauge>,
    /// Smallest injected sleep among running pods per policy.
    pub running_min_prestop: Family<PolicyLabel, Gauge>,
    /// Pods by state per policy.
    pub pods: Family<PolicyStateLabel, Gauge>,
    /// Migration advice.
    pub migration: Family<MigrationLabel, Gauge>,
    /// Reconciliations by result.
    pub reconciles: Family<ReconcileResultLabel, Counter>,
    /// Reconcile duration.
    pub reconcile_duration: Histogram,
    /// Status patches.
    pub status_writes: Counter,
    /// 1 while this replica holds the lease (measures and writes status).
    pub leader: Gauge,
    /// Services in the cluster (the advisor's input; set once the Service watch has synced).
    pub cluster_services: Gauge,
    /// Endpoints in all EndpointSlices (set once the EndpointSlice watch has synced).
    pub cluster_endpoints: Gauge,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        Self {
            propagation_window: FloatGauge::default(),
            control_plane_lag_p99: FloatGauge::default(),
            control_plane_lag_samples: Gauge::default(),
            observed_removals: Gauge::default(),
            observed_removal_p99: FloatGauge::default(),
            // nothing observed: nothing missed (a 0 would read as every removal missed)
            observed_coverage: {
                let g = FloatGauge::default();
                g.set(1.0);
                g
            },
            recommended_prestop: Family::default(),
            running_min_prestop: Family::default(),
            pods: Family::default(),
            migration: Family::default(),
            reconciles: Family::default(),
            reconcile_duration: Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]),
            status_writes: Counter::default(),
            leader: Gauge::default(),
            cluster_services: Gauge::default(),
            cluster_endpoints: Gauge::default(),
        }
    }
}

impl ControllerMetrics {
    /// Registers under `safe_termination_controller_`.
    pub fn register(&self, r: &mut Registry) {
        r.register_with_unit("propagation_window", "cluster propagation window W", Unit::Seconds, self.propagation_window.clone());
        r.register_with_unit(
            "control_plane_lag_p99",
            "p99 of the control plane's part of a deletion (DELETE to endpoint terminating) over the rolling window",
            Unit::Seconds,
            self.control_plane_lag_p99.clone(),
        );
        r.register(
            "control_plane_lag_samples",
            "deletions the control plane's part of W is measured on, in the rolling window",
            self.control_plane_lag_samples.clone(),
        );
        r.register("observed_removals", "removals the node agents observed in the rolling window", self.observed_removals.clone());
        r.register_with_unit(
            "observed_removal_p99",
            "p99 of the observed removals' windows (deletion seen to the endpoint gone from the slowest node)",
            Unit::Seconds,
            self.observed_removal_p99.clone(),
        );
        r.register_with_unit(
            "observed_coverage",
            "share of observed removals of pods with an injected sleep whose sleep covered the window",
            Unit::Other("ratio".into()),
            self.observed_coverage.clone(),
        );
        r.register_with_unit("recommended_prestop", "preStop sleep new pods get, per policy", Unit::Seconds, self.recommended_prestop.clone());
        r.register_with_unit(
            "running_pods_min_prestop",
            "smallest preStop sleep injected into a running pod, per policy",
            Unit::Seconds,
            self.running_min_prestop.clone(),
        );
        r.register("pods", "pods per policy by state (mutated, stale, unprotected)", self.pods.clone());
        r.register("migration_recommended", "1 when the advisor recommends another proxy mode", self.migration.clone());
        r.register("reconciles", "TerminationPolicy reconciliations by result", self.reconciles.clone());
        r.register_with_unit("reconcile_duration", "reconcile duration", Unit::Seconds, self.reconcile_duration.clone());
        r.register("status_writes", "status patches sent", self.status_writes.clone());
        r.register("leader", "1 while this replica holds the lease", self.leader.clone());
        r.register("cluster_services", "Services in the cluster (advisor input)", self.cluster_services.clone());
        r.register("cluster_endpoints", "endpoints in all EndpointSlices (advisor input)", self.cluster_endpoints.clone());
    }

    /// Updates the cluster-wide gauges from a report.
    pub fn update_cluster(&self, report: &AnalysisReport) {
        if let Some(w) = report.propagation_window_seconds {
            self.propagation_window.set(w);
        }
        if let Some(l) = &report.control_plane_lag {
            self.control_plane_lag_p99.set(l.p99_seconds);
        }
        self.control_plane_lag_samples.set(i64::from(report.control_plane_lag.as_ref().map_or(0, |l| l.samples)));
        if let Some(o) = &report.observed_removals {
            self.observed_removals.set(i64::try_from(o.window.removals).unwrap_or(i64::MAX));
            if let Some((p, _)) = o.window.p99() {
                self.observed_removal_p99.set(p);
            }
            // no precise removal of a pod with a sleep in the window: nothing missed
            self.observed_coverage.set(o.window.coverage_ratio.unwrap_or(1.0));
        }
        if let Some(n) = report.proxy.services {
            self.cluster_services.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        if let Some(n) = report.proxy.endpoints {
            self.cluster_endpoints.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.migration.clear();
        for a in report.advice.iter().filter(|a| a.reason == AdviceReason::MigrateProxyMode) {
            let to = a.to.map_or("unknown", |m| m.as_str());
            self.migration.get_or_create(&MigrationLabel { from: report.proxy.mode.as_str().into(), to: to.into() }).set(1);
        }
    }
}
