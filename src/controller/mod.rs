//! The TerminationPolicy controller (`safe-termination run`): reconciliation ([`reconcile`]),
//! the desired status and its condition transitions ([`status`]), the webhook's plan built from
//! the policies' status ([`planner`]) and published to the server ([`tasks`]), the capability
//! probe ([`probe`]), the Service index ([`cluster`]) and the controller's own instruments
//! ([`metrics`]).

pub mod cluster;
pub mod metrics;
pub mod planner;
pub mod probe;
pub mod reconcile;
pub mod status;
pub mod tasks;

use crate::operator::{Shared, Tasks};
use crate::webhook::server::PlanHandle;
use cluster::ClusterIndex;
use kube::runtime::events::{Recorder, Reporter};
use metrics::{ControllerMetrics, KubeProxyMetrics};
use planner::DefaultPolicyRef;
use reconcile::{Context, Settings};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// What the controller's tasks need besides the [`Shared`] context.
#[derive(Debug, Clone)]
pub struct Config {
    /// Reconcile settings (thresholds, overrides, refresh).
    pub settings: Settings,
    /// The operator's namespace: the capability probe creates its dry-run pod there.
    pub namespace: String,
    /// This replica's name in Events (`reportingInstance`).
    pub identity: Option<String>,
    /// Time between capability probes.
    pub probe_interval: Duration,
    /// The policy that serves namespaces without one.
    pub default_policy: Option<DefaultPolicyRef>,
    /// The controller's instruments.
    pub metrics: ControllerMetrics,
    /// The per-node kube-proxy instruments (leader only).
    pub kube_proxy_metrics: KubeProxyMetrics,
}

/// What the webhook serves from: the published plan and the Service index.
pub struct Published {
    /// The plan, republished on every policy or capability change.
    pub plans: PlanHandle,
    /// Services and EndpointSlices, for scope ServiceBacked.
    pub cluster: Arc<ClusterIndex>,
}

/// Starts the controller's tasks in `tasks`: the Service index, the plan publisher, the
/// capability probe and the TerminationPolicy controller itself.
pub fn spawn(shared: &Shared, tasks: &mut Tasks, config: Config) -> Published {
    let plans = PlanHandle::new();
    let cluster = Arc::new(ClusterIndex::default());
    let (native_tx, native_rx) = watch::channel(false);
    let (client, stop) = (&shared.client, &shared.stop);
    let (index, c, s) = (cluster.clone(), client.clone(), stop.clone());
    tasks.spawn("service index", async move { index.run(c, s).await });
    tasks.spawn("plan publisher", tasks::publish_plans(client.clone(), plans.clone(), native_rx, config.default_policy, stop.clone()));
    tasks.spawn(
        "capability probe",
        tasks::probe_capabilities(client.clone(), config.namespace, native_tx, config.probe_interval, stop.clone()),
    );
    let reporter = Reporter { controller: "safe-termination".into(), instance: config.identity };
    let recorder = Recorder::new(client.clone(), reporter);
    let (ctx, cluster2) = (shared.clone(), cluster.clone());
    let make = move |policies| Context {
        client: ctx.client,
        store: ctx.store,
        cluster: cluster2,
        proxy: ctx.proxy,
        leader: ctx.leader,
        recorder,
        settings: config.settings,
        metrics: config.metrics,
        kube_proxy_metrics: config.kube_proxy_metrics,
        policies,
        analyses: Default::default(),
    };
    let (measured, leader) = (shared.measured.clone(), shared.leader.clone());
    tasks.spawn("controller", reconcile::run(client.clone(), make, measured, leader, stop.clone()));
    Published { plans, cluster }
}

/// Why the controller could not do its work: a reconcile is retried with backoff; a bad
/// `--default-policy` stops the operator at start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The measurement store's lock was poisoned (a bug).
    #[error("measurement store unavailable")]
    Store,
    /// `--default-policy` is not `NAMESPACE/NAME`.
    #[error("default policy {0:?} must be NAMESPACE/NAME")]
    DefaultPolicyRef(String),
}
