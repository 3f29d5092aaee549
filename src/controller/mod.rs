//! The TerminationPolicy controller (`safe-termination run`): reconciliation ([`reconcile`]),
//! the desired status and its condition transitions ([`status`]), the webhook's plan built from
//! the policies' status ([`planner`]) and published to the server ([`tasks`]), the capability
//! probe ([`probe`]), the Service index ([`service_index`]) and the controller's own instruments
//! ([`metrics`]).

pub mod admission;
pub mod metrics;
pub mod observer;
pub mod planner;
pub mod probe;
pub mod reconcile;
pub mod service_index;
pub mod status;
pub mod tasks;
pub mod wait;

use crate::runtime::{Shared, Tasks};
use crate::webhook::server::PlanHandle;
use kube::runtime::events::{Recorder, Reporter};
use metrics::{ControllerMetrics, KubeProxyMetrics};
use planner::DefaultPolicyRef;
use reconcile::{Context, ControllerSettings};
use service_index::ClusterIndex;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// What the controller's tasks need besides the [`Shared`] context.
#[derive(Debug, Clone)]
pub struct Config {
    /// Reconcile settings (thresholds, overrides, refresh).
    pub settings: ControllerSettings,
    /// The operator's namespace: the capability probe creates its dry-run pod there.
    pub namespace: String,
    /// This replica's name in Events (`reportingInstance`).
    pub identity: Option<String>,
    /// Time between capability probes.
    pub probe_interval: Duration,
    /// The policy that serves namespaces without one.
    pub default_policy: Option<DefaultPolicyRef>,
    /// The admission backend and, for the policy backend, what to write (`None`: neither the
    /// policy writer nor the stale-policy cleanup runs).
    pub admission: Option<AdmissionConfig>,
    /// The controller's instruments.
    pub metrics: ControllerMetrics,
    /// The per-node kube-proxy instruments (leader only).
    pub kube_proxy_metrics: KubeProxyMetrics,
    /// Where `Wait` policies' pods find the waiter (`None`: the chart's defaults, no CA, no
    /// address, no ConfigMaps).
    pub wait: Option<wait::WaitSettings>,
}

/// The resolved admission backend (`--admission-backend`) and the policy's objects.
#[derive(Debug, Clone)]
pub struct AdmissionConfig {
    /// The backend in use.
    pub active: crate::core::admission::ActiveBackend,
    /// The policy, binding and parameters names and selectors.
    pub objects: Arc<crate::core::admission::policy::PolicyObjects>,
    /// The admission instruments.
    pub metrics: admission::AdmissionMetrics,
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
    // None until the first probe answers (see tasks::publish_plans)
    let (native_tx, native_rx) = watch::channel(None);
    let client = &shared.client;
    tasks.spawn("service index", cluster.clone().run(client.clone(), shared.stop.clone()));
    let (injection_tx, injection_rx) = watch::channel(config.wait.as_ref().map(|w| w.base.clone()).unwrap_or_default());
    if let Some(settings) = config.wait {
        tasks.spawn("wait injection", wait::keep_injection_current(cluster.clone(), settings, injection_tx, shared.stop.clone()));
        tasks.spawn(
            "wait ConfigMaps",
            wait::keep_config_maps_current(client.clone(), plans.clone(), injection_rx.clone(), shared.leader.clone(), shared.stop.clone()),
        );
    } else {
        // the sender must outlive the publisher's receiver, or its `changed()` ends the loop
        tasks.spawn("wait injection", async move {
            injection_tx.closed().await;
        });
    }
    tasks.spawn("plan publisher", tasks::publish_plans(client.clone(), plans.clone(), native_rx, injection_rx, config.default_policy, shared.stop.clone()));
    tasks.spawn("capability probe", tasks::probe_capabilities(client.clone(), config.namespace, native_tx, config.probe_interval, shared.stop.clone()));
    match config.admission {
        Some(AdmissionConfig { active: crate::core::admission::ActiveBackend::Policy, objects, metrics }) => tasks.spawn(
            "admission policy writer",
            admission::keep_policy_current(client.clone(), objects, plans.clone(), shared.leader.clone(), metrics, shared.stop.clone()),
        ),
        Some(AdmissionConfig { active: crate::core::admission::ActiveBackend::Webhook, objects, metrics }) => tasks.spawn(
            "admission policy cleanup",
            admission::remove_stale_policy(client.clone(), objects.name.clone(), shared.leader.clone(), metrics, shared.stop.clone()),
        ),
        None => {}
    }
    let reporter = Reporter { controller: "safe-termination".into(), instance: config.identity };
    let make = {
        let shared = shared.clone();
        let cluster = cluster.clone();
        move |policies| Context {
            recorder: Recorder::new(shared.client.clone(), reporter),
            client: shared.client,
            store: shared.store,
            cluster,
            proxy: shared.proxy,
            leader: shared.leader,
            settings: config.settings,
            metrics: config.metrics,
            kube_proxy_metrics: config.kube_proxy_metrics,
            policies,
            analyses: Default::default(),
        }
    };
    let controller = reconcile::run(client.clone(), make, shared.measured.clone(), shared.leader.clone(), shared.stop.clone());
    tasks.spawn("controller", controller);
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
