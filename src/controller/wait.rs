//! The preStop `Wait` handler's adapters on the operator's side (docs/wait.md):
//! - [`KubeTokenReviewer`]: who asks, by a TokenReview of the waiter's projected token (audience
//!   [`WAIT_AUDIENCE`]; the API server's answer names the pod the token is bound to);
//! - [`IndexWaitSource`]: what is known of that pod, from the Service index and the observer's
//!   removals ([`ClusterIndex::wait_view`]), and whether this replica leads;
//! - [`keep_injection_current`]: what the mutation writes into new pods (the serving CA, read
//!   from its file, and the Service's ClusterIP from the Service index), refreshed every
//!   [`INJECTION_REFRESH`];
//! - [`keep_config_maps_current`]: on the leader, the ConfigMap [`CONFIG_MAP_NAME`] in each
//!   namespace with a `Wait` policy: the serving CA and each policy's current sleep, which the
//!   kubelet projects into the pods: the waiter's fallback is the sleep computed now, not the one
//!   sized at admission.

use super::service_index::ClusterIndex;
use crate::core::crd::PreStopHandler;
use crate::core::plan::Plan;
use crate::core::wait::{CONFIG_MAP_CA_KEY, CONFIG_MAP_NAME, PodView, WAIT_AUDIENCE, WaitInjection, WaitRecord, fallback_key};
use crate::webhook::PlanHandle;
use crate::webhook::wait::{PodIdentity, TokenReviewer, WaitSource};
use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How often the serving CA file and the Service's ClusterIP are read again.
pub const INJECTION_REFRESH: Duration = Duration::from_secs(30);
/// How often the leader compares each namespace's ConfigMap with the policies' current sleeps.
pub const CONFIG_MAP_REFRESH: Duration = Duration::from_secs(10);
/// The largest CA file read, bytes.
const MAX_CA_BYTES: u64 = 64 * 1024;

/// Reviews the waiter's token with the API server's TokenReview.
#[derive(Clone)]
pub struct KubeTokenReviewer {
    client: Client,
}

impl KubeTokenReviewer {
    /// A reviewer over `client` (RBAC: `create` on `tokenreviews`).
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

/// The pod of a TokenReview's answer: authenticated, for [`WAIT_AUDIENCE`], a service account's
/// token bound to a pod (`authentication.kubernetes.io/pod-name` and `pod-uid` in `extra`).
///
/// Errors: which of those is missing, or the API server's own error.
pub fn identity_of(review: &TokenReview) -> Result<PodIdentity, String> {
    let status = review.status.as_ref().ok_or("no status in the TokenReview's answer")?;
    if status.authenticated != Some(true) {
        return Err(format!("not authenticated: {}", status.error.as_deref().unwrap_or("no reason given")));
    }
    if !status.audiences.as_ref().is_some_and(|a| a.iter().any(|a| a == WAIT_AUDIENCE)) {
        return Err(format!("not a token for the audience {WAIT_AUDIENCE}"));
    }
    let user = status.user.as_ref().ok_or("no user in the TokenReview's answer")?;
    let namespace = user
        .username
        .as_deref()
        .and_then(|u| u.strip_prefix("system:serviceaccount:"))
        .and_then(|rest| rest.split_once(':'))
        .map(|(ns, _)| ns.to_string())
        .ok_or("not a service account's token")?;
    let extra = |key: &str| user.extra.as_ref().and_then(|e| e.get(key)).and_then(|v| v.first()).cloned();
    let name = extra("authentication.kubernetes.io/pod-name").ok_or("the token is not bound to a pod")?;
    let uid = extra("authentication.kubernetes.io/pod-uid").ok_or("the token is not bound to a pod")?;
    Ok(PodIdentity { namespace, name, uid })
}

impl TokenReviewer for KubeTokenReviewer {
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<PodIdentity, String>> {
        Box::pin(async move {
            let review = TokenReview {
                spec: TokenReviewSpec { token: Some(token.to_string()), audiences: Some(vec![WAIT_AUDIENCE.to_string()]) },
                ..Default::default()
            };
            let answer = Api::<TokenReview>::all(self.client.clone()).create(&PostParams::default(), &review).await.map_err(|e| format!("TokenReview: {e}"))?;
            identity_of(&answer)
        })
    }
}

/// The waiter's answers from the Service index, for the leader.
pub struct IndexWaitSource {
    cluster: Arc<ClusterIndex>,
    leader: watch::Receiver<bool>,
}

impl IndexWaitSource {
    /// Over `cluster`, leading while `leader` ([`crate::runtime::Shared::leader`]) is true.
    pub fn new(cluster: Arc<ClusterIndex>, leader: watch::Receiver<bool>) -> Self {
        Self { cluster, leader }
    }
}

impl WaitSource for IndexWaitSource {
    fn leading(&self) -> bool {
        *self.leader.borrow()
    }

    fn view(&self, uid: &str, first_asked: f64) -> PodView {
        self.cluster.wait_view(uid, *self.leader.borrow(), first_asked)
    }

    fn window(&self, uid: &str) -> Option<f64> {
        self.cluster.pod_window(uid)
    }

    fn record(&self, record: WaitRecord) {
        self.cluster.record_wait(record);
    }
}

/// Where the injection's parts come from.
#[derive(Debug, Clone)]
pub struct WaitSettings {
    /// The image, the URL (the address is filled in here).
    pub base: WaitInjection,
    /// The serving CA's file (PEM).
    pub ca_file: PathBuf,
    /// The operator's namespace and webhook Service (its ClusterIP).
    pub namespace: String,
    /// The webhook Service's name.
    pub service: String,
}

/// Reads the CA file (bounded) and the Service's ClusterIP now and then, and sends the
/// injection on `tx` when it changed. A failed read keeps the last value (a missing CA leaves
/// the pods the ConfigMap's, a missing address the Service's DNS name).
pub async fn keep_injection_current(cluster: Arc<ClusterIndex>, settings: WaitSettings, tx: watch::Sender<WaitInjection>, stop: CancellationToken) {
    loop {
        let mut next = tx.borrow().clone();
        match read_bounded(&settings.ca_file).await {
            Ok(pem) => next.ca_pem = pem,
            Err(e) => tracing::debug!(error = %e, file = %settings.ca_file.display(), "wait: the serving CA is not readable"),
        }
        // the webhook Service from the Service index's watch (no API call of its own): its
        // ClusterIP and its port named `wait` (the chart's), else the URL's port
        if let Some((ip, wait_port)) = cluster.service_address(&settings.namespace, &settings.service) {
            let url_port = next.url.rsplit_once(':').and_then(|(_, rest)| rest.split('/').next()?.parse::<u16>().ok()).unwrap_or(443);
            next.address = Some(std::net::SocketAddr::new(ip, wait_port.unwrap_or(url_port)).to_string());
        }
        tx.send_if_modified(|cur| {
            let changed = *cur != next;
            *cur = next;
            changed
        });
        // until the index has listed the Service, look again every second: pods admitted
        // meanwhile get no address (their waiter then needs DNS)
        let pause = if tx.borrow().address.is_some() { INJECTION_REFRESH } else { std::time::Duration::from_secs(1) };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// `path`'s content as text, at most [`MAX_CA_BYTES`].
async fn read_bounded(path: &std::path::Path) -> std::io::Result<String> {
    use tokio::io::AsyncReadExt;
    let f = tokio::fs::File::open(path).await?;
    let mut buf = String::new();
    f.take(MAX_CA_BYTES).read_to_string(&mut buf).await?;
    Ok(buf)
}

/// The ConfigMap data of each namespace that has a `Wait` policy in `plan`: the CA and each of
/// its policies' current sleep (every policy of the namespace, so a pod admitted under one
/// policy finds its own key whatever the handler of the others). Pure.
pub fn config_map_data(plan: &Plan, ca_pem: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for p in plan.policies.iter().filter(|p| p.spec.pre_stop.handler == PreStopHandler::Wait) {
        out.entry(p.namespace.clone()).or_default();
    }
    for p in &plan.policies {
        if let Some(data) = out.get_mut(&p.namespace) {
            data.insert(fallback_key(&p.name), p.pre_stop_seconds.to_string());
            if !ca_pem.is_empty() {
                data.insert(CONFIG_MAP_CA_KEY.to_string(), ca_pem.to_string());
            }
        }
    }
    out
}

/// On the leader, every [`CONFIG_MAP_REFRESH`]: applies the ConfigMap [`CONFIG_MAP_NAME`] of each
/// namespace whose data changed since this replica last applied it (server-side apply, field
/// manager `safe-termination`). A namespace whose last `Wait` policy went keeps its ConfigMap
/// (harmless; its pods still read their fallback from it).
pub async fn keep_config_maps_current(
    client: Client,
    plans: PlanHandle,
    injection: watch::Receiver<WaitInjection>,
    leader: watch::Receiver<bool>,
    stop: CancellationToken,
) {
    let mut applied: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let params = PatchParams::apply("safe-termination").force();
    loop {
        if *leader.borrow() && plans.is_published() {
            let ca = injection.borrow().ca_pem.clone();
            for (ns, data) in config_map_data(&plans.current(), &ca) {
                if applied.get(&ns) == Some(&data) {
                    continue;
                }
                let cm = serde_json::json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": CONFIG_MAP_NAME, "labels": {"app.kubernetes.io/managed-by": "safe-termination"}},
                    "data": data,
                });
                match Api::<ConfigMap>::namespaced(client.clone(), &ns).patch(CONFIG_MAP_NAME, &params, &Patch::Apply(&cm)).await {
                    Ok(_) => {
                        applied.insert(ns, data);
                    }
                    Err(e) => tracing::warn!(namespace = %ns, error = %e, "wait: cannot apply the ConfigMap {CONFIG_MAP_NAME}"),
                }
            }
        } else {
            // a new leader applies everything once
            applied.clear();
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(CONFIG_MAP_REFRESH) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::crd::TerminationPolicySpec;
    use crate::core::plan::PlanPolicy;
    use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo};

    fn answer(authenticated: bool, audience: &str, extra: &[(&str, &str)]) -> TokenReview {
        TokenReview {
            status: Some(TokenReviewStatus {
                authenticated: Some(authenticated),
                audiences: Some(vec![audience.to_string()]),
                user: Some(UserInfo {
                    username: Some("system:serviceaccount:shop:default".into()),
                    extra: Some(extra.iter().map(|(k, v)| (k.to_string(), vec![v.to_string()])).collect()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_an_authenticated_pod_bound_token_of_the_audience_names_a_pod() {
        let bound = [("authentication.kubernetes.io/pod-name", "web-0"), ("authentication.kubernetes.io/pod-uid", "u-1")];
        assert_eq!(identity_of(&answer(true, WAIT_AUDIENCE, &bound)), Ok(PodIdentity { namespace: "shop".into(), name: "web-0".into(), uid: "u-1".into() }));
        assert!(identity_of(&answer(false, WAIT_AUDIENCE, &bound)).unwrap_err().contains("not authenticated"));
        assert!(identity_of(&answer(true, "https://kubernetes.default.svc", &bound)).unwrap_err().contains("audience"));
        assert!(identity_of(&answer(true, WAIT_AUDIENCE, &bound[..1])).unwrap_err().contains("bound to a pod"));
        assert!(identity_of(&TokenReview::default()).is_err());
    }

    #[test]
    fn config_maps_go_to_namespaces_with_a_wait_policy_with_each_policys_current_sleep() {
        let policy = |ns: &str, name: &str, handler, secs| {
            let mut spec = TerminationPolicySpec::default();
            spec.pre_stop.handler = handler;
            PlanPolicy { namespace: ns.into(), name: name.into(), spec, pre_stop_seconds: secs }
        };
        let plan = Plan {
            policies: vec![policy("a", "web", PreStopHandler::Wait, 4), policy("a", "db", PreStopHandler::Auto, 9), policy("b", "x", PreStopHandler::Auto, 3)],
            ..Plan::default()
        };
        let data = config_map_data(&plan, "PEM");
        assert_eq!(data.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(data["a"]["web.preStopSeconds"], "4");
        assert_eq!(data["a"]["db.preStopSeconds"], "9");
        assert_eq!(data["a"]["ca.crt"], "PEM");
        assert!(!config_map_data(&plan, "").values().any(|d| d.contains_key("ca.crt")), "no CA read: no key");
    }
}
