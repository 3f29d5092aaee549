//! The `TerminationPolicy` custom resource (`safetermination.io/v1alpha1`, namespaced, short
//! name `tpol`): what a namespace owner sets (spec) and where they read what the operator measured
//! and decided (status).
//!
//! `crds/terminationpolicy.yaml` is generated from these types by `cargo run --bin crdgen`; a test
//! fails when the committed file is stale. Every default below is documented on its field and is
//! also what `safe-termination analyze` uses when no `--policy` is given, so the CLI and the
//! controller size with one code path.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Desired behaviour for the pods of one namespace.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "safetermination.io",
    version = "v1alpha1",
    kind = "TerminationPolicy",
    plural = "terminationpolicies",
    singular = "terminationpolicy",
    shortname = "tpol",
    doc = "A namespace's pod-termination policy: how safe-termination sizes the preStop sleep and terminationGracePeriodSeconds of new pods from kube-proxy's measured propagation window (spec), and what it measured and decided (status).",
    namespaced,
    status = "TerminationPolicyStatus",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"PreStop","type":"integer","jsonPath":".status.recommendation.preStopSeconds"}"#,
    printcolumn = r#"{"name":"Grace","type":"integer","jsonPath":".status.recommendation.terminationGracePeriodSeconds"}"#,
    printcolumn = r#"{"name":"SyncP99","type":"number","jsonPath":".status.measurement.syncP99Seconds"}"#,
    printcolumn = r#"{"name":"Window","type":"number","priority":1,"jsonPath":".status.measurement.propagationWindowSeconds"}"#,
    printcolumn = r#"{"name":"CPLagP99","type":"number","priority":1,"jsonPath":".status.measurement.controlPlaneLag.p99Seconds"}"#,
    printcolumn = r#"{"name":"ObservedP99","type":"number","priority":1,"jsonPath":".status.measurement.observedRemovals.p99Seconds"}"#,
    printcolumn = r#"{"name":"Covered","type":"number","priority":1,"jsonPath":".status.measurement.observedRemovals.coverageRatio"}"#,
    printcolumn = r#"{"name":"DataPlanes","type":"string","priority":1,"jsonPath":".status.measurement.observedRemovals.dataPlanesSummary"}"#,
    printcolumn = r#"{"name":"Waits","type":"string","priority":1,"jsonPath":".status.measurement.waits.summary"}"#,
    printcolumn = r#"{"name":"ProxyMode","type":"string","priority":1,"jsonPath":".status.proxy.mode"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = "!has(self.spec.preStop) || self.spec.preStop.minSeconds <= self.spec.preStop.maxSeconds",
    validation = "!has(self.spec.preStop) || (self.spec.preStop.defaultSeconds >= self.spec.preStop.minSeconds && self.spec.preStop.defaultSeconds <= self.spec.preStop.maxSeconds)"
)]
#[serde(rename_all = "camelCase")]
pub struct TerminationPolicySpec {
    /// Enforce (mutate pods), Audit (record what would be injected as annotations and admission
    /// warnings, change nothing) or Disabled. Default Enforce.
    #[serde(default)]
    pub mode: EnforcementMode,
    /// Which pods of the namespace this policy applies to; empty or absent selects all pods.
    /// When several policies select a pod, the most specific selector (most match terms) wins,
    /// then the alphabetically first name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// ServiceBacked (default): only pods whose labels match some Service selector in their
    /// namespace, since only those receive traffic through kube-proxy. AllLongRunning: every
    /// pod that is not run-to-completion.
    #[serde(default)]
    pub scope: Scope,
    /// How the preStop sleep is sized and injected.
    #[serde(default)]
    pub pre_stop: PreStopSpec,
    /// How terminationGracePeriodSeconds is sized.
    #[serde(default)]
    pub grace: GraceSpec,
}

/// Enforcement mode of a policy.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum EnforcementMode {
    /// Mutate new pods.
    #[default]
    Enforce,
    /// Annotate and warn only; no lifecycle or grace change.
    Audit,
    /// Do nothing.
    Disabled,
}

/// Which pods a policy protects.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Scope {
    /// Pods selected by at least one Service in their namespace.
    #[default]
    ServiceBacked,
    /// Every long-running pod (restartPolicy Always).
    AllLongRunning,
}

/// Which preStop handler to inject.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PreStopHandler {
    /// Native `sleep` where the API server keeps it (probed), else `exec sleep N` for images on
    /// `execImages`, else skip the container with a warning.
    #[default]
    Auto,
    /// Native `lifecycle.preStop.sleep` only (Kubernetes 1.30+ with the gate on, GA 1.34).
    Sleep,
    /// `exec: ["sleep", "N"]` only, for images on `execImages` (they must ship a `sleep` binary).
    Exec,
    /// Wait at deletion for the observed removal (docs/wait.md): an init container copies the
    /// operator's small waiter binary into an emptyDir, and `preStop.exec` runs it. It asks the
    /// operator whether every node has removed the pod's endpoints (a projected service-account
    /// token of its own audience says which pod asks) and returns once they have (plus a margin
    /// and `extraSeconds`), once the pod is its Services' last serving endpoint, or at
    /// `maxSeconds`; on any doubt it waits the sleep the operator computes now (a projected
    /// ConfigMap), never zero. Webhook backend only; Windows pods get the native sleep.
    Wait,
}

/// preStop sizing: `preStop = clamp(ceil(W * safetyFactor + extraSeconds), minSeconds,
/// maxSeconds)` where W is the measured propagation window in seconds.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct PreStopSpec {
    /// Lower bound of the injected sleep, seconds. Default 3: "sleep 3 is generally enough" for a
    /// small cluster (kubernetes issue 43576) and it covers the default 1 s minSyncPeriod twice.
    #[schemars(range(min = 0, max = 3600))]
    pub min_seconds: u32,
    /// Upper bound of the injected sleep, seconds. Default 60: beyond a minute every rollout
    /// step stalls; a window that needs more is a kube-proxy problem the advice reports. Used as
    /// the sleep when the sync p99 is beyond the top histogram bucket (the true value is unknown
    /// and at least 16 s).
    #[schemars(range(min = 1, max = 3600))]
    pub max_seconds: u32,
    /// Sleep used while nothing has been measured (no data, metrics unreachable), seconds.
    /// Default 10: minSyncPeriod 1 s, a slow sync, and an ingress reload fit inside it.
    #[schemars(range(min = 0, max = 3600))]
    pub default_seconds: u32,
    /// Multiplier on the measured window. Default 1.25: the p99 is an estimate from bucket
    /// interpolation and a rollout deletes many pods at once. Measured against the ground truth
    /// on real nodes (docs/benchmarks/deploy-errors.md "Deploy errors"), W alone did not cover every window (one of
    /// 1.973 s against W 1.968 s); 1.25 x W (then rounded up to whole seconds, at least 3 s)
    /// covered every one with no failed request, where 1.5 made the sleep more than twice the
    /// longest window.
    #[schemars(range(min = 1.0, max = 10.0))]
    pub safety_factor: f64,
    /// Seconds added for paths kube-proxy does not cover: ingress controller reloads, cloud load
    /// balancers targeting pod IPs (AWS NLB IP mode deregisters in minutes). Default 0.
    #[schemars(range(min = 0, max = 3600))]
    pub extra_seconds: u32,
    /// Handler to inject. Default Auto.
    pub handler: PreStopHandler,
    /// Images allowed to get the `exec sleep` fallback: exact references or prefixes ending in
    /// `*` (e.g. `docker.io/library/nginx*`). Distroless images have no `sleep`: never list them.
    #[schemars(length(max = 256))]
    pub exec_images: Vec<String>,
    /// Fewer observations than this in a node's histogram (over the analysed interval) and its
    /// p99 is not trusted for sizing (reason LowSampleCount). Default 5.
    #[schemars(range(min = 1, max = 1000000))]
    pub min_samples: u32,
}

impl Default for PreStopSpec {
    fn default() -> Self {
        Self {
            min_seconds: 3,
            max_seconds: 60,
            default_seconds: 10,
            safety_factor: 1.25,
            extra_seconds: 0,
            handler: PreStopHandler::Auto,
            exec_images: Vec::new(),
            min_samples: 5,
        }
    }
}

/// terminationGracePeriodSeconds sizing: `grace = max(current, min(preStop + appShutdownSeconds,
/// maxSeconds), preStop)`; never lowered, never below the sleep (the API server rejects a sleep
/// longer than the grace period).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct GraceSpec {
    /// Time the application needs after SIGTERM, seconds. Default 30, the Kubernetes default
    /// grace period: the app keeps the shutdown time it has today after the sleep.
    #[schemars(range(min = 0, max = 86400))]
    pub app_shutdown_seconds: u32,
    /// Upper bound on a raised grace period, seconds. Default 600. A larger value the user set
    /// is kept.
    #[schemars(range(min = 1, max = 604800))]
    pub max_seconds: u32,
}

impl Default for GraceSpec {
    fn default() -> Self {
        Self { app_shutdown_seconds: 30, max_seconds: 600 }
    }
}

impl Default for TerminationPolicySpec {
    fn default() -> Self {
        Self { mode: EnforcementMode::Enforce, pod_selector: None, scope: Scope::ServiceBacked, pre_stop: PreStopSpec::default(), grace: GraceSpec::default() }
    }
}

/// Every problem of a spec found by [`TerminationPolicySpec::validate`], each naming its field
/// (`spec.preStop.minSeconds (30) is above maxSeconds (10)`), in the order checked; the message
/// joins them with `; `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .problems.join("; "))]
pub struct SpecErrors {
    /// One sentence per problem.
    pub problems: Vec<String>,
}

impl TerminationPolicySpec {
    /// Checks the cross-field rules the CRD also enforces with CEL, plus finiteness.
    ///
    /// Errors: every problem found ([`SpecErrors`]).
    pub fn validate(&self) -> Result<(), SpecErrors> {
        let p = &self.pre_stop;
        let mut errs = Vec::new();
        if p.min_seconds > p.max_seconds {
            errs.push(format!("spec.preStop.minSeconds ({}) is above maxSeconds ({})", p.min_seconds, p.max_seconds));
        }
        if p.default_seconds < p.min_seconds || p.default_seconds > p.max_seconds {
            errs.push(format!(
                "spec.preStop.defaultSeconds ({}) is outside [minSeconds, maxSeconds] ([{}, {}])",
                p.default_seconds, p.min_seconds, p.max_seconds
            ));
        }
        if !p.safety_factor.is_finite() || !(1.0..=10.0).contains(&p.safety_factor) {
            errs.push(format!("spec.preStop.safetyFactor ({}) must be within [1, 10]", p.safety_factor));
        }
        if p.min_samples == 0 {
            errs.push("spec.preStop.minSamples must be at least 1".into());
        }
        if self.grace.max_seconds == 0 {
            errs.push("spec.grace.maxSeconds must be at least 1".into());
        }
        if errs.is_empty() { Ok(()) } else { Err(SpecErrors { problems: errs }) }
    }
}

/// What the operator measured and decided; written by the leader only.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TerminationPolicyStatus {
    /// The spec generation this status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The propagation window measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measurement: Option<MeasurementStatus>,
    /// The preStop sleep and grace period new pods get.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommendation: Option<RecommendationStatus>,
    /// kube-proxy as seen by the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyStatus>,
    /// Advice items (slow syncs, proxy-mode migration, stale proxies, sample counts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub advice: Vec<AdviceStatus>,
    /// Pod counts in the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<PodCounts>,
    /// Conditions: Ready, ProxySyncSlow, MigrationRecommended, MetricsUnavailable,
    /// PodsUnderprotected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// How new pods are mutated: the admission backend, and where it differs from the webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionStatus>,
}

/// The admission backend in use (`--admission-backend`, chart value `admission.backend`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionStatus {
    /// `webhook` (the operator's mutating webhook) or `policy` (a MutatingAdmissionPolicy the
    /// operator keeps at the measured values).
    pub backend: String,
    /// Where this policy's pods are mutated differently from the webhook, by design (empty with
    /// the webhook).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub differences: Vec<String>,
}

/// The measured propagation window.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeasurementStatus {
    /// Worst node's `kubeproxy_sync_proxy_rules_duration_seconds` p99, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_p99_seconds: Option<f64>,
    /// Worst node's `kubeproxy_network_programming_duration_seconds` p99, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_programming_p99_seconds: Option<f64>,
    /// Cluster propagation window W, seconds (max over nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub propagation_window_seconds: Option<f64>,
    /// The node that set W.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst_node: Option<String>,
    /// The kind of kube-proxy histogram W came from on the worst node: `native` (kube-proxy
    /// 1.37+, read over the protobuf exposition: 9%-wide buckets) or `classic` (doubling sync
    /// buckets: a p99 can read up to 2 x the true one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub histogram_kind: Option<String>,
    /// Nodes whose metrics were read.
    pub nodes_scraped: u32,
    /// Nodes whose metrics could not be read.
    pub nodes_failed: u32,
    /// Nodes measured through each source (`kube-proxy`: scraped directly, `agent`: through
    /// the node agent, `prometheus`, `file`), e.g. `{"agent": 2, "kube-proxy": 1}`; per node in
    /// the metric `safe_termination_kube_proxy_source{node,source}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sources: BTreeMap<String, u32>,
    /// The source the worst node was measured through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst_node_source: Option<String>,
    /// The control plane's part of a deletion, included in W: from a pod's DELETE to its
    /// endpoint turning terminating, as the operator's pod and EndpointSlice watches saw them,
    /// over the rolling window. Absent before the first deletion is seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_lag: Option<ControlPlaneLagStatus>,
    /// The removals the node agents observed over the rolling window: each pod deletion's
    /// endpoint, watched on every node until its data plane dropped it. Absent without an
    /// observer (`--observe-removals`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_removals: Option<ObservedRemovalsStatus>,
    /// The namespace's preStop waits (handler `Wait`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waits: Option<WaitsStatus>,
    /// Analysed interval, seconds (the rolling window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_seconds: Option<u32>,
    /// Time of the last scrape (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scrape_time: Option<String>,
}

/// The preStop waits of the namespace's pods over the rolling window (handler `Wait`): how each
/// ended, how long they took against the sleep each replaced, and the coverage check of
/// observed removals applied to them.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaitsStatus {
    /// Waits reported to the leader.
    pub waits: u32,
    /// Ended because every node removed the pod.
    pub removed: u32,
    /// Ended at once: the pod was its Services' last serving endpoint.
    pub last_endpoint: u32,
    /// Ended at the deadline with a node still holding the pod.
    pub deadline: u32,
    /// Waited the sleep instead: the operator could not tell (unreachable, not observing, a
    /// refused token).
    pub fallback: u32,
    /// Median wait, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_seconds: Option<f64>,
    /// 99th percentile wait (nearest rank), seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_seconds: Option<f64>,
    /// Longest wait, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_seconds: Option<f64>,
    /// Median of the sleeps the same pods would have had, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sleep_p50_seconds: Option<f64>,
    /// Seconds of sleep the waits saved in all (negative: they waited longer).
    pub saved_seconds: f64,
    /// Waits whose pod's window was known when they ended.
    pub with_window: u32,
    /// Of them, waits at least as long as their pod's window.
    pub covered: u32,
    /// The worst miss: the window less the wait, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst_miss_seconds: Option<f64>,
    /// The `kubectl get tpol -o wide` column: outcomes, and the median wait against the sleep.
    pub summary: String,
}

/// The control plane's part of a deletion over the rolling window.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneLagStatus {
    /// Deletions measured.
    pub samples: u32,
    /// Their p99, seconds.
    pub p99_seconds: f64,
    /// The longest, seconds.
    pub max_seconds: f64,
    /// Where it was measured: `pod and EndpointSlice watches`.
    pub source: String,
}

/// The observed removals over the rolling window.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedRemovalsStatus {
    /// Removals observed (each: deletion seen to the endpoint gone from the slowest node).
    pub removals: u32,
    /// Of them, still in some node's data plane at their deadline (their window is a lower
    /// bound).
    pub censored: u32,
    /// Of them, bounded too coarsely (a read bound over 0.5 s, or no read before the removal)
    /// to count in the p99 and the coverage.
    #[serde(default)]
    pub coarse: u32,
    /// The p99 of the precise ones' windows, seconds (a lower bound when `p99IsLowerBound`);
    /// absent while every removal is coarse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_seconds: Option<f64>,
    /// The p99's rank fell on a censored removal.
    #[serde(default)]
    pub p99_is_lower_bound: bool,
    /// Of the precise removals of pods with an injected sleep, the share the pod's own sleep
    /// covered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage_ratio: Option<f64>,
    /// The pod whose window most exceeded its sleep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst_miss: Option<MissStatus>,
    /// The p99 set W (above the model's, or the model had none).
    #[serde(default)]
    pub sets_window: bool,
    /// The same removals per data plane (iptables-nft, iptables-legacy, nftables, cilium), each
    /// as its own nodes saw it: the slowest of them per removal. W takes the cluster's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data_planes: Vec<DataPlaneRemovalsStatus>,
    /// `dataPlanes` in one line for `kubectl get -o wide`: `<data plane>=<p99>s/<removals>` each
    /// (`>=` before a p99 that is a lower bound, `?` when none is known), space-separated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_planes_summary: Option<String>,
}

/// One data plane's observed removals.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataPlaneRemovalsStatus {
    /// The data plane, as the node agents name it.
    pub data_plane: String,
    /// Its nodes (whose agents named it).
    pub nodes: u32,
    /// Removals its nodes observed.
    pub removals: u32,
    /// Of them, censored on one of its nodes.
    #[serde(default)]
    pub censored: u32,
    /// Of them, bounded too coarsely to count in its p99.
    #[serde(default)]
    pub coarse: u32,
    /// The p99 of its precise windows, seconds (a lower bound when `p99IsLowerBound`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_seconds: Option<f64>,
    /// The p99's rank fell on a censored removal.
    #[serde(default)]
    pub p99_is_lower_bound: bool,
}

/// A pod whose sleep did not cover its observed window.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MissStatus {
    /// `namespace/name` of the pod.
    pub pod: String,
    /// Its window, seconds (a lower bound when censored).
    pub window_seconds: f64,
    /// Its injected sleep, seconds.
    pub sleep_seconds: u32,
    /// Still in some node's data plane at the deadline.
    #[serde(default)]
    pub censored: bool,
}

/// The sized preStop sleep and grace period.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecommendationStatus {
    /// preStop sleep injected into new pods, seconds.
    pub pre_stop_seconds: u32,
    /// terminationGracePeriodSeconds for a pod that did not set one, seconds.
    pub termination_grace_period_seconds: u32,
    /// Why this value: Measured, LowSampleCount, BeyondTopBucket, NoData.
    pub reason: String,
    /// The arithmetic, e.g. `ceil(2.10 s x 1.25 + 0 s) = 3 s, clamped to [3, 60]`.
    pub arithmetic: String,
    /// The share of removal windows this sleep covers, from the histograms W came from; absent
    /// without data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<CoverageStatus>,
}

/// The share of removal windows a sleep covers: per node, the lower of the kube-proxy term's
/// CDF at the sleep and network programming's at the sleep + 1 s, over the interval W came
/// from.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoverageStatus {
    /// The share of (pod, node) windows within the sleep, 0 to 1 (4 decimals): the mean over
    /// the nodes W is taken from.
    pub ratio: f64,
    /// The node whose windows the sleep covers least.
    pub lowest_node: String,
    /// That node's share, 0 to 1 (4 decimals).
    pub lowest_node_ratio: f64,
    /// Nodes counted.
    pub nodes: u32,
}

/// kube-proxy summary.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatus {
    /// iptables, nftables, ipvs, kernelspace, ebpf or unknown.
    pub mode: String,
    /// Where the mode came from (proxyMode endpoint, ConfigMap, metric families, flag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode_source: Option<String>,
    /// Services in the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<u64>,
    /// Endpoints in the cluster (EndpointSlice entries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<u64>,
    /// Estimated iptables rules: about 2 per Service port plus 2 per endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_rules: Option<u64>,
    /// Rules kube-proxy reports owning (`iptables_total`, worst node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual_rules: Option<u64>,
}

/// One advice item.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdviceStatus {
    /// ProxySyncSlow, MigrateProxyMode, ProxyModeDefaulted, ProxyStale, LowSampleCount,
    /// BeyondTopBucket, SleepBelowWindow.
    pub reason: String,
    /// What to do.
    pub message: String,
    /// The threshold crossed.
    pub threshold: String,
}

/// Pod counts in the policy's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodCounts {
    /// Pods mutated by the webhook under this policy.
    pub mutated: u32,
    /// Running pods whose injected sleep is below the current recommendation (lifecycle is
    /// immutable on a running pod: they get the new value when replaced).
    pub stale: u32,
    /// Service-backed pods with no preStop at all.
    pub unprotected: u32,
}

/// The CustomResourceDefinition as YAML, exactly as committed in `crds/terminationpolicy.yaml`.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    generated_yaml(&TerminationPolicy::crd(), "cargo run --bin crdgen", "src/core/crd.rs")
}

/// A generated CustomResourceDefinition as committed YAML: a header naming `command` and
/// `source`, then the CRD with Kubernetes integer formats.
pub fn generated_yaml(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    command: &str,
    source: &str,
) -> String {
    let header = format!("# Generated by `{command}` from {source}: do not edit by hand.\n");
    let mut crd = serde_json::to_value(crd).unwrap_or_default();
    kubernetes_formats(&mut crd);
    let body = serde_saphyr::to_string(&crd).unwrap_or_default();
    format!("{header}{body}")
}

/// schemars writes `format: uint32`/`uint64` for unsigned integers; the API server knows only
/// `int32`/`int64` and warns on every apply. The bounds (`minimum: 0`, `maximum`) stay.
fn kubernetes_formats(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            if let Some(serde_json::Value::String(f)) = m.get_mut("format")
                && f.starts_with("uint")
            {
                *f = "int64".into();
            }
            m.values_mut().for_each(kubernetes_formats);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(kubernetes_formats),
        _ => {}
    }
}

/// The fields of a TerminationPolicy object (`apiVersion`, `kind`, `metadata`, `spec`, `status`
/// as read from a file) that the CRD's schema does not know, each as its path (`spec.preStop.x`)
/// with the fields known at that place. Empty when every field is known.
///
/// The API server prunes unknown fields (`kubectl apply` warns, `--validate=strict` refuses), so a
/// typo in a file used with `--policy` would otherwise be dropped without a word; the Rust types
/// stay lenient (no `deny_unknown_fields`) because objects read from a newer API server may carry
/// fields this version does not know. `metadata` is not checked (ObjectMeta, not ours).
pub fn unknown_fields(object: &serde_json::Value) -> Vec<String> {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(TerminationPolicy::crd()).unwrap_or_default();
    let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let mut out = Vec::new();
    let Some(obj) = object.as_object() else { return out };
    let known: Vec<&str> =
        ["apiVersion", "kind", "metadata"].into_iter().chain(root["properties"].as_object().into_iter().flat_map(|p| p.keys().map(String::as_str))).collect();
    for (k, v) in obj {
        match root["properties"].get(k) {
            Some(schema) => unknown_in(v, schema, k, &mut out),
            None if known.contains(&k.as_str()) => {}
            None => out.push(format!("unknown field {k} (known here: {})", known.join(", "))),
        }
    }
    out
}

fn unknown_in(value: &serde_json::Value, schema: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&serde_json::Value::Bool(true)) {
        return;
    }
    match value {
        serde_json::Value::Object(obj) => {
            let props = schema.get("properties").and_then(|p| p.as_object());
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, v) in obj {
                let sub = format!("{path}.{k}");
                match (props.and_then(|p| p.get(k)), additional) {
                    (Some(s), _) | (None, Some(s)) => unknown_in(v, s, &sub, out),
                    // without properties the object is free-form: nothing to compare with
                    (None, None) => {
                        if let Some(p) = props {
                            let known: Vec<&str> = p.keys().map(String::as_str).collect();
                            out.push(format!("unknown field {sub} (known in {path}: {})", known.join(", ")));
                        }
                    }
                }
            }
        }
        serde_json::Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    unknown_in(v, s, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// Every problem of a spec is named, in the order checked, in one message.
#[test]
fn a_spec_with_several_problems_names_each() {
    assert_eq!(TerminationPolicySpec::default().validate(), Ok(()));
    let mut spec = TerminationPolicySpec::default();
    spec.pre_stop.min_seconds = 30;
    spec.pre_stop.max_seconds = 10;
    spec.pre_stop.min_samples = 0;
    let e = spec.validate().unwrap_err();
    assert_eq!(
        e.problems,
        [
            "spec.preStop.minSeconds (30) is above maxSeconds (10)",
            "spec.preStop.defaultSeconds (10) is outside [minSeconds, maxSeconds] ([30, 10])",
            "spec.preStop.minSamples must be at least 1"
        ]
    );
    assert_eq!(
        e.to_string(),
        "spec.preStop.minSeconds (30) is above maxSeconds (10); spec.preStop.defaultSeconds (10) is outside [minSeconds, maxSeconds] ([30, 10]); spec.preStop.minSamples must be at least 1"
    );
}
