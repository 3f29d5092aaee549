//! The policy backend's writer (`--admission-backend policy`, or `auto` on Kubernetes 1.36+):
//! the leader keeps the MutatingAdmissionPolicy, its binding and the `TerminationParameters`
//! object ([`crate::core::admission`]) equal to what this replica's plan says, by server-side apply.
//! With the webhook backend the leader deletes a policy and binding it wrote before (a switch
//! back must not leave a policy mutating with frozen parameters).
//!
//! Only the leader writes; followers and a stopped operator leave the last parameters in place,
//! so the API server keeps injecting the last sized values while the operator is down.
//!
//! Metrics (component `admission`):
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `safe_termination_admission_backend` | gauge 1 | backend | the active backend (webhook or policy) |
//! | `safe_termination_admission_writes_total` | counter | object, result | server-side applies of the policy, binding and parameters |
//! | `safe_termination_admission_parameters_prestop_seconds` | gauge | namespace, policy | the preStop seconds in the last written parameters |

use crate::core::admission::params::{TerminationParameters, parameters};
use crate::core::admission::policy::{MANAGED_BY, PolicyObjects};
use crate::core::admission::{ActiveBackend, params::TerminationParametersSpec};
use crate::webhook::server::PlanHandle;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Field manager of the writes.
pub const FIELD_MANAGER: &str = "safe-termination";

/// How often the leader re-applies the policy and binding (repairing a hand edit or deletion).
pub const POLICY_REAPPLY: Duration = Duration::from_secs(300);

/// How often the leader compares the published plan with the last written parameters. A
/// status change reaches the plan through the policy watch; this bounds the extra delay.
pub const PARAMETERS_CHECK: Duration = Duration::from_secs(1);

/// `backend` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabel {
    /// webhook or policy.
    pub backend: String,
}

/// `object`, `result` labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    /// policy, binding or parameters.
    pub object: String,
    /// ok or error.
    pub result: String,
}

/// `namespace`, `policy` labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ParametersLabel {
    /// The TerminationPolicy's namespace.
    pub namespace: String,
    /// The TerminationPolicy's name.
    pub policy: String,
}

/// The admission instruments.
#[derive(Debug, Clone, Default)]
pub struct AdmissionMetrics {
    /// 1 for the active backend.
    pub backend: Family<BackendLabel, Gauge>,
    /// Server-side applies by object and result.
    pub writes: Family<WriteLabel, Counter>,
    /// preStop seconds per policy in the last written parameters.
    pub parameters_prestop: Family<ParametersLabel, Gauge>,
}

impl AdmissionMetrics {
    /// Registers under `safe_termination_admission_`.
    pub fn register(&self, r: &mut Registry) {
        r.register("backend", "1 for the active admission backend (webhook or policy)", self.backend.clone());
        r.register("writes", "server-side applies of the MutatingAdmissionPolicy, its binding and its parameters", self.writes.clone());
        r.register_with_unit(
            "parameters_prestop",
            "preStop seconds per TerminationPolicy in the last written policy parameters",
            Unit::Seconds,
            self.parameters_prestop.clone(),
        );
    }

    fn count(&self, object: &str, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.writes.get_or_create(&WriteLabel { object: object.into(), result: result.into() }).inc();
    }

    fn show(&self, spec: &TerminationParametersSpec) {
        self.parameters_prestop.clear();
        for entry in spec.namespaces.values().flatten().chain(&spec.default_policies) {
            let (namespace, policy) = entry.policy.split_once('/').unwrap_or(("", entry.policy.as_str()));
            let label = ParametersLabel { namespace: namespace.into(), policy: policy.into() };
            self.parameters_prestop.get_or_create(&label).set(i64::from(entry.pre_stop_seconds));
        }
    }
}

/// The API resource of MutatingAdmissionPolicy v1 (k8s-openapi 0.29 with `v1_33` has no type
/// for it).
pub fn policy_resource() -> ApiResource {
    ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: "MutatingAdmissionPolicy".into(),
        plural: "mutatingadmissionpolicies".into(),
    }
}

/// The API resource of MutatingAdmissionPolicyBinding v1.
pub fn binding_resource() -> ApiResource {
    ApiResource { kind: "MutatingAdmissionPolicyBinding".into(), plural: "mutatingadmissionpolicybindings".into(), ..policy_resource() }
}

/// Whether the API server serves `admissionregistration.k8s.io/v1` `mutatingadmissionpolicies`
/// (discovery). Errors: the discovery request failed for another reason than a missing group
/// version.
pub async fn serves_policy_v1(client: &Client) -> Result<bool, kube::Error> {
    match client.list_api_group_resources("admissionregistration.k8s.io/v1").await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "mutatingadmissionpolicies")),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The ownerReference to the ClusterRole `name` (the chart's, deleted on uninstall, which
/// garbage-collects the policy, binding and parameters).
pub async fn cluster_role_owner(client: &Client, name: &str) -> Result<Value, kube::Error> {
    let api: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(client.clone());
    let role = api.get(name).await?;
    Ok(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "name": name,
        "uid": role.metadata.uid.unwrap_or_default(),
    }))
}

async fn apply_dynamic(client: &Client, resource: &ApiResource, object: &Value) -> Result<(), kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    api.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(object)).await.map(|_| ())
}

/// Applies the policy and its binding.
pub async fn apply_policy(client: &Client, objects: &PolicyObjects, metrics: &AdmissionMetrics) -> Result<(), kube::Error> {
    let r = apply_dynamic(client, &policy_resource(), &objects.policy()).await;
    metrics.count("policy", r.is_ok());
    r?;
    let r = apply_dynamic(client, &binding_resource(), &objects.binding()).await;
    metrics.count("binding", r.is_ok());
    r
}

/// Applies the parameters object with `spec`.
pub async fn apply_parameters(
    client: &Client,
    objects: &PolicyObjects,
    spec: &TerminationParametersSpec,
    metrics: &AdmissionMetrics,
) -> Result<(), kube::Error> {
    let api: Api<TerminationParameters> = Api::namespaced(client.clone(), &objects.params_namespace);
    let r = api.patch(&objects.name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(objects.parameters(spec))).await;
    metrics.count("parameters", r.is_ok());
    r.map(|_| ())
}

/// Deletes the binding and the policy named `name` when they carry this operator's
/// `app.kubernetes.io/managed-by` label; absent objects (or an API server without the
/// resource) are fine, and so is no permission to read them (RBAC without the policy rules:
/// then this operator cannot have written them either; said once at info).
pub async fn remove_policy(client: &Client, name: &str) -> Result<(), kube::Error> {
    for resource in [binding_resource(), policy_resource()] {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        match api.get_opt(name).await {
            Err(kube::Error::Api(e)) if e.code == 403 => {
                tracing::info!(kind = %resource.kind, name, "no permission to read it: no stale policy to remove");
                return Ok(());
            }
            Ok(Some(o)) if o.metadata.labels.as_ref().and_then(|l| l.get("app.kubernetes.io/managed-by")).map(String::as_str) == Some(MANAGED_BY) => {
                api.delete(name, &DeleteParams::default()).await?;
                tracing::info!(kind = %resource.kind, name, "deleted: the webhook backend is active");
            }
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Waits until `leader` is true; false when `stop` fired or the channel closed.
async fn until_leader(leader: &mut watch::Receiver<bool>, stop: &CancellationToken) -> bool {
    loop {
        if *leader.borrow_and_update() {
            return true;
        }
        tokio::select! {
            _ = stop.cancelled() => return false,
            r = leader.changed() => if r.is_err() { return false; },
        }
    }
}

/// The leader's loop for the policy backend: on each leadership term, applies the policy and
/// binding (again every [`POLICY_REAPPLY`]), and the parameters whenever the published plan's
/// parameters differ from the last written (checked every [`PARAMETERS_CHECK`]). Nothing is
/// written before the first plan is published (an empty plan would switch every namespace's
/// mutation off). Failed writes are retried with a backoff of up to 30 s. Returns on `stop`.
pub async fn keep_policy_current(
    client: Client,
    objects: Arc<PolicyObjects>,
    plans: PlanHandle,
    mut leader: watch::Receiver<bool>,
    metrics: AdmissionMetrics,
    stop: CancellationToken,
) {
    metrics.backend.get_or_create(&BackendLabel { backend: ActiveBackend::Policy.as_str().into() }).set(1);
    while until_leader(&mut leader, &stop).await {
        let mut policy_applied: Option<tokio::time::Instant> = None;
        let mut written: Option<TerminationParametersSpec> = None;
        // the plan last turned into parameters: they are rebuilt only when a new plan is published
        let mut seen: Option<Arc<crate::core::plan::Plan>> = None;
        let mut backoff = PARAMETERS_CHECK;
        while *leader.borrow() {
            let due = policy_applied.is_none_or(|t| t.elapsed() >= POLICY_REAPPLY);
            let mut failed = false;
            if due {
                match apply_policy(&client, &objects, &metrics).await {
                    Ok(()) => {
                        tracing::info!(name = %objects.name, "MutatingAdmissionPolicy and binding applied");
                        policy_applied = Some(tokio::time::Instant::now());
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot apply the MutatingAdmissionPolicy or its binding");
                        failed = true;
                    }
                }
            }
            let plan = plans.current();
            let fresh = seen.as_ref().is_none_or(|p| !Arc::ptr_eq(p, &plan)) || written.is_none();
            if plans.is_published() && fresh {
                let spec = parameters(&plan);
                if written.as_ref() == Some(&spec) {
                    seen = Some(plan);
                } else {
                    match apply_parameters(&client, &objects, &spec, &metrics).await {
                        Ok(()) => {
                            let policies: usize = spec.namespaces.values().map(Vec::len).sum::<usize>() + spec.default_policies.len();
                            tracing::info!(policies, namespaces = spec.namespaces.len(), "admission policy parameters written");
                            metrics.show(&spec);
                            written = Some(spec);
                            seen = Some(plan);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot write the admission policy parameters");
                            failed = true;
                        }
                    }
                }
            }
            backoff = if failed { (backoff * 2).min(Duration::from_secs(30)) } else { PARAMETERS_CHECK };
            tokio::select! {
                _ = stop.cancelled() => return,
                r = leader.changed() => if r.is_err() { return; },
                () = tokio::time::sleep(backoff) => {}
            }
        }
    }
}

/// The leader's duty under the webhook backend: remove a policy and binding this operator
/// wrote earlier (once per leadership term; retried every 30 s while it fails). Returns on
/// `stop`.
pub async fn remove_stale_policy(client: Client, name: String, mut leader: watch::Receiver<bool>, metrics: AdmissionMetrics, stop: CancellationToken) {
    metrics.backend.get_or_create(&BackendLabel { backend: ActiveBackend::Webhook.as_str().into() }).set(1);
    while until_leader(&mut leader, &stop).await {
        loop {
            match remove_policy(&client, &name).await {
                Ok(()) => break,
                Err(e) => tracing::warn!(error = %e, "cannot remove the stale MutatingAdmissionPolicy"),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(30)) => {}
            }
        }
        // until this term ends
        while *leader.borrow_and_update() {
            tokio::select! {
                _ = stop.cancelled() => return,
                r = leader.changed() => if r.is_err() { return; },
            }
        }
    }
}
