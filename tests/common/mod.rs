//! Shared helpers of the end-to-end tests (tests/e2e*.rs) against the local control plane of
//! e2e/README.md: the cluster's state directory, a client, namespaces, the CRD, the webhook
//! registration, and the operator binary as a child process ([`operator`]).
#![allow(dead_code)]

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client};
use safe_termination::core::crd::TerminationPolicy;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

pub mod agents;
pub mod chart;
pub mod operator;
pub mod rules;
pub mod tools;
pub mod truth;
pub mod wait_endpoint;
pub mod windows;

pub use operator::Operator;

/// `$ST_E2E_DIR` (default `/tmp/safe-termination-e2e`).
pub fn state_dir() -> String {
    std::env::var("ST_E2E_DIR").unwrap_or_else(|_| "/tmp/safe-termination-e2e".into())
}

/// A file of the state directory; panics with the hint to start the cluster.
pub fn read_state(path: &str) -> String {
    let dir = state_dir();
    std::fs::read_to_string(format!("{dir}/{path}")).unwrap_or_else(|e| panic!("{dir}/{path}: {e}: run `make cluster-up` first"))
}

/// A client for the e2e cluster (its kubeconfig unless KUBECONFIG is set).
pub async fn client() -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    if std::env::var("KUBECONFIG").is_err() {
        // SAFETY: set before any client exists, read by the client builder only
        unsafe { std::env::set_var("KUBECONFIG", format!("{}/kubeconfig", state_dir())) };
    }
    Client::try_default().await.expect("kubeconfig of the e2e cluster: run `make cluster-up` first")
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Deletes `name` if present, waits until it is gone, creates it and waits for its default
/// ServiceAccount.
pub async fn fresh_namespace(client: &Client, name: &str) {
    fresh_namespace_with_labels(client, name, &[]).await;
}

/// [`fresh_namespace`] for a test that brings its own admission (its webhook registered by name,
/// its own policy binding) or none: labelled `safetermination.io/ignore=true`, which the chart's
/// webhook configuration and policy binding skip (`core::admission::policy::
/// default_namespace_selector`). So a release that another test left installed does not mutate
/// this test's pods before (or instead of) the test's own webhook; the test's own admission
/// selects the namespace by name and is not affected by the label.
pub async fn own_namespace(client: &Client, name: &str) {
    fresh_namespace_with_labels(client, name, &[(safe_termination::core::annotations::LABEL_IGNORE, "true")]).await;
}

/// Uninstalls every Helm release of the chart in the cluster, found by its operator
/// Deployments' labels (no release: no helm call, so this runs where helm is not built). A test
/// that runs its own operator calls it first ([`Operator::start`]): a release's operator
/// reconciles the TerminationPolicies of every namespace (the label of [`own_namespace`] keeps
/// only its admission out), so the test's policies would have two status writers. It found one
/// whose status said the webhook backend while the test's operator had chosen the policy.
pub async fn remove_chart_releases(client: &Client) {
    let api: Api<k8s_openapi::api::apps::v1::Deployment> = Api::all(client.clone());
    let lp = kube::api::ListParams::default().labels("app.kubernetes.io/name=safe-termination,app.kubernetes.io/managed-by=Helm");
    let deployments = api.list(&lp).await.expect("list the chart's Deployments");
    for d in deployments.items {
        let release = d.metadata.labels.as_ref().and_then(|l| l.get("app.kubernetes.io/instance")).cloned();
        let (Some(ns), Some(release)) = (d.metadata.namespace.clone(), release) else { continue };
        eprintln!("uninstalling the chart's release {ns}/{release}: its operator would write this test's TerminationPolicy statuses too");
        tools::run(tools::tool("helm").args(["uninstall", &release, "-n", &ns, "--wait", "--timeout", "180s"]), None);
    }
}

/// [`fresh_namespace`] with `labels` on the new namespace (Pod Security levels, opt-outs).
pub async fn fresh_namespace_with_labels(client: &Client, name: &str, labels: &[(&str, &str)]) {
    let api: Api<Namespace> = Api::all(client.clone());
    let _ = api.delete(name, &DeleteParams::default()).await;
    wait_for(&format!("namespace {name} deleted"), 180, async || api.get_opt(name).await.ok().flatten().is_none().then_some(())).await;
    let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let ns = Namespace { metadata: ObjectMeta { name: Some(name.into()), labels: Some(labels), ..Default::default() }, ..Default::default() };
    api.create(&PostParams::default(), &ns).await.expect("create namespace");
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    wait_for(&format!("the default ServiceAccount in {name}"), 30, async || sa.get_opt("default").await.ok().flatten().map(|_| ())).await;
}

/// Server-side applies crds/terminationpolicy.yaml and crds/terminationparameters.yaml and waits
/// until both are Established.
pub async fn apply_crd(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (file, name) in [
        ("crds/terminationpolicy.yaml", "terminationpolicies.safetermination.io"),
        ("crds/terminationparameters.yaml", "terminationparameters.safetermination.io"),
    ] {
        let text = std::fs::read_to_string(file).unwrap();
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
        api.patch(name, &PatchParams::apply("e2e").force(), &Patch::Apply(&crd)).await.expect("apply CRD");
        let established = await_condition(api.clone(), name, conditions::is_crd_established());
        let r = tokio::time::timeout(Duration::from_secs(30), established).await;
        assert!(r.as_ref().is_ok_and(Result::is_ok), "CRD {name} not established within 30 s: {r:?}");
    }
}

/// Registers (server-side apply) a MutatingWebhookConfiguration for one namespace, shaped like
/// the chart's (R10: Ignore, 5 s, sideEffects None, IfNeeded, pods CREATE only), calling
/// `https://127.0.0.1:<port>/mutate` with the cluster CA as caBundle.
pub async fn register_webhook(client: &Client, name: &str, namespace: &str, port: u16) {
    register_webhook_at(client, name, namespace, &format!("https://127.0.0.1:{port}/mutate")).await;
}

/// [`register_webhook`] at `url` (a certificate signed by the cluster's CA serves it).
pub async fn register_webhook_at(client: &Client, name: &str, namespace: &str, url: &str) {
    use base64::Engine as _;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(read_state("pki/ca.crt"));
    let cfg: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "prestop.safetermination.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Ignore",
            "timeoutSeconds": 5,
            "reinvocationPolicy": "IfNeeded",
            "clientConfig": {"url": url, "caBundle": ca_bundle},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        }]
    }))
    .unwrap();
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    api.patch(name, &PatchParams::apply("e2e").force(), &Patch::Apply(&cfg)).await.expect("apply MutatingWebhookConfiguration");
}

/// Removes a test's webhook configuration and namespace (best effort).
pub async fn cleanup(client: &Client, webhook_name: &str, namespace: &str) {
    let _ = Api::<MutatingWebhookConfiguration>::all(client.clone()).delete(webhook_name, &DeleteParams::default()).await;
    let _ = Api::<Namespace>::all(client.clone()).delete(namespace, &DeleteParams::default()).await;
}

/// A TerminationPolicy's status as JSON (null when absent).
pub async fn policy_status(client: &Client, ns: &str, name: &str) -> Value {
    let api: Api<TerminationPolicy> = Api::namespaced(client.clone(), ns);
    api.get(name).await.map(|p| serde_json::to_value(p.status).unwrap()).unwrap_or(Value::Null)
}

/// A TerminationPolicy's status as the API server stores it (null when absent): unlike
/// [`policy_status`], which goes through this crate's types, it keeps fields those types do not
/// know (an operator built from another revision may write more).
pub async fn policy_status_raw(client: &Client, ns: &str, name: &str) -> Value {
    let resource = kube::api::ApiResource::erase::<TerminationPolicy>(&());
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    api.get(name).await.map(|p| p.data["status"].clone()).unwrap_or(Value::Null)
}

/// Polls the status of TerminationPolicy `name` in `ns` every second until `done` holds and
/// returns it; panics with `what` and the last status after `secs`.
pub async fn wait_policy_status(client: &Client, ns: &str, name: &str, secs: u64, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let s = policy_status(client, ns, name).await;
        if done(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "{what}: {s:#}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The usual scene of an operator test: the CRD, fresh `system` and `ns` namespaces, the operator
/// running in `system` with its webhook registered (as `hook`) for `ns`, and a TerminationPolicy
/// `web` in `ns` with `spec`. Returns the operator and the policies of `ns`.
pub async fn operator_with_policy(client: &Client, system: &str, ns: &str, hook: &str, spec: Value) -> (Operator, Api<TerminationPolicy>) {
    operator_with_policy_args(client, system, ns, hook, spec, &[]).await
}

/// [`operator_with_policy`] with `extra` flags for the operator.
pub async fn operator_with_policy_args(client: &Client, system: &str, ns: &str, hook: &str, spec: Value, extra: &[&str]) -> (Operator, Api<TerminationPolicy>) {
    apply_crd(client).await;
    own_namespace(client, system).await;
    own_namespace(client, ns).await;
    let op = Operator::start(system, extra).await;
    register_webhook(client, hook, ns, op.webhook).await;
    // the API server picks the configuration up through an informer
    tokio::time::sleep(Duration::from_secs(2)).await;
    let policies: Api<TerminationPolicy> = Api::namespaced(client.clone(), ns);
    let policy: TerminationPolicy = serde_json::from_value(json!({
        "apiVersion": "safetermination.io/v1alpha1", "kind": "TerminationPolicy",
        "metadata": {"name": "web", "namespace": ns}, "spec": spec
    }))
    .unwrap();
    policies.create(&PostParams::default(), &policy).await.expect("create TerminationPolicy");
    (op, policies)
}

/// Creates selector-less Services `s<i>` for `i` in `range` in `ns`, each with a two-endpoint
/// EndpointSlice (the scale fixtures of tests/e2e_window.rs, tests/e2e_prometheus.rs and
/// tests/e2e_deploy.rs). The endpoint IPs (10.244.(100 + i / 125).x) belong to no pod: only the
/// rule count matters; they run out at 19,500 Services.
pub async fn create_services(client: &Client, ns: &str, range: std::ops::Range<usize>) {
    assert!(range.end <= 19_500, "create_services: at most 19,500 Services (endpoint IPs 10.244.100.0 to 10.244.255.255)");
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let svcs: Api<Service> = Api::namespaced(client.clone(), ns);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    futures::stream::iter(range)
        .map(|i| {
            let (svcs, slices) = (svcs.clone(), slices.clone());
            async move {
                let name = format!("s{i}");
                let svc: Service = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                    "spec": {"ports": [{"port": 80, "protocol": "TCP"}]}}))
                .unwrap();
                let _ = svcs.create(&PostParams::default(), &svc).await;
                // two endpoints each: the rule count (and so iptables-nft's restore time, which
                // grows about quadratically) is what makes syncs slow, not the object count
                let ip = format!("10.244.{}.{}", 100 + i / 125, 1 + 2 * (i % 125));
                let ip2 = format!("10.244.{}.{}", 100 + i / 125, 2 + 2 * (i % 125));
                let slice: EndpointSlice = serde_json::from_value(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": format!("{name}-1"), "labels": {"kubernetes.io/service-name": name, "endpointslice.kubernetes.io/managed-by": "e2e"}},
                    "addressType": "IPv4", "ports": [{"port": 8080, "protocol": "TCP"}],
                    "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}, {"addresses": [ip2], "conditions": {"ready": true}}]}))
                .unwrap();
                let _ = slices.create(&PostParams::default(), &slice).await;
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
}

/// The project's test app image (e2e/cluster/build-images.sh), imported into every real node's
/// containerd: a pod running it must use `imagePullPolicy: Never` (there is no registry).
pub const TESTAPP_IMAGE: &str = "st.local/testapp:1";

/// A pod spec (`spec` of a Pod or a pod template) that runs on the cluster's real nodes
/// (e2e/cluster/nodes.sh): their node label as nodeSelector and a toleration of their NoSchedule taint,
/// which keeps every other pod on the kwok nodes.
pub fn on_real_nodes(mut spec: Value) -> Value {
    let taint = std::env::var("ST_REAL_NODE_TAINT").unwrap_or_else(|_| "safe-termination.e2e/real-node".into());
    spec["nodeSelector"] = json!({"safe-termination.e2e/node-type": "real"});
    spec["tolerations"] = json!([{"key": taint, "operator": "Exists", "effect": "NoSchedule"}]);
    spec["automountServiceAccountToken"] = json!(false);
    spec
}

/// The test app's container: answers `GET /` with its pod name on :8080, ready on /healthz,
/// exits ~100 ms after SIGTERM (no graceful shutdown).
pub fn testapp_container(name: &str) -> Value {
    json!({"name": name, "image": TESTAPP_IMAGE, "imagePullPolicy": "Never",
        "ports": [{"name": "http", "containerPort": 8080}],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1, "failureThreshold": 1}})
}

/// Deployment `web` of `replicas` test-app pods on the real nodes (label `app: web`), its pod
/// template annotated `rollout: <generation>` (a new generation rolls every pod), with the
/// rolling-update `strategy` given (JSON), or the default one.
pub fn web_deployment(replicas: usize, generation: u32, strategy: Option<Value>) -> k8s_openapi::api::apps::v1::Deployment {
    let mut spec = json!({"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}, "annotations": {"rollout": generation.to_string()}},
            "spec": on_real_nodes(json!({"containers": [testapp_container("web")]}))}});
    if let Some(s) = strategy {
        spec["strategy"] = s;
    }
    serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": spec})).unwrap()
}

/// Waits up to `secs` until `pods` holds exactly `replicas` pods, all Ready and of rollout
/// `generation` ([`web_deployment`]): the rolling update done and its old pods gone.
pub async fn wait_rollout_settled(pods: &Api<k8s_openapi::api::core::v1::Pod>, replicas: usize, generation: u32, secs: u64) {
    wait_for(&format!("{replicas} ready pods of rollout {generation}, and no other"), secs, async || {
        let l = pods.list(&kube::api::ListParams::default()).await.ok()?;
        let ready = l
            .items
            .iter()
            .filter(|p| p.metadata.annotations.as_ref().and_then(|a| a.get("rollout")) == Some(&generation.to_string()))
            .filter(|p| p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")))
            .count();
        (ready == replicas && l.items.len() == replicas).then_some(())
    })
    .await
}

/// Polls `f` every 250 ms until it returns `Some`, and returns that; panics naming `what` after
/// `secs` seconds.
pub async fn wait_for<T>(what: &str, secs: u64, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The first certificate of a PEM bundle, as DER (panics when there is none).
pub fn first_der(pem: &[u8]) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem).next().expect("a certificate").expect("PEM").to_vec()
}

/// The sum of the series of `name` whose labels contain every `label="value"` in `labels`.
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let mut found = None;
    for l in text.lines() {
        let Some(rest) = l.strip_prefix(name) else { continue };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        if !labels.iter().all(|want| rest.contains(want)) {
            continue;
        }
        if let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// The webhook served in-process on 127.0.0.1 with a static plan and the cluster's webhook
/// certificate; stopped by cancelling `stop`.
pub struct Webhook {
    /// Its HTTPS port.
    pub port: u16,
    /// Cancel to stop it.
    pub stop: tokio_util::sync::CancellationToken,
}

/// Starts a [`Webhook`] serving `plan`, with scope ServiceBacked answered by `services`.
pub fn start_webhook_with(plan: safe_termination::core::plan::Plan, services: std::sync::Arc<dyn safe_termination::core::selector::ServiceIndex>) -> Webhook {
    use safe_termination::webhook::server::{self, PlanHandle, RequestLimits, WebhookState};
    use safe_termination::webhook::tls::{CertificateStore, load_certified_key, server_config};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let store = std::sync::Arc::new(CertificateStore::new());
    let (cert, key) = (read_state("pki/webhook.crt"), read_state("pki/webhook.key"));
    store.set(load_certified_key(cert.as_bytes(), key.as_bytes()).expect("webhook cert"));
    let tls = server_config(store).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let state = WebhookState {
        plan: PlanHandle::with_plan(plan),
        services,
        metrics: safe_termination::telemetry::Telemetry::new().webhook().clone(),
        settings: RequestLimits::default(),
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move { server::serve(listener, server::router(state), tls, token, Duration::from_secs(2), server::Connections::default()).await });
    Webhook { port, stop }
}

/// [`start_webhook_with`], every pod counted as selected by a Service.
pub fn start_webhook(plan: safe_termination::core::plan::Plan) -> Webhook {
    start_webhook_with(plan, std::sync::Arc::new(safe_termination::core::selector::AssumeServiceBacked))
}

/// A case file's (tests/data/pods/FILE) pod templates, made creatable in `ns`: each its own
/// name, its service account created.
pub async fn creatable_pods(client: &Client, file: &str, ns: &str) -> Vec<(String, Value)> {
    use safe_termination::cli::mutate::{documents, pod_of};
    let mut out = Vec::new();
    for (i, doc) in documents(&format!("tests/data/pods/{file}")).unwrap().iter().enumerate() {
        let Ok((mut pod, _)) = pod_of(doc, ns) else { continue };
        let stem = file.trim_end_matches(".yaml").replace('.', "-");
        let name = format!("{}-{i}", &stem[..stem.len().min(50)]);
        pod["metadata"]["name"] = json!(name);
        pod["metadata"]["namespace"] = json!(ns);
        if let Some(m) = pod["metadata"].as_object_mut() {
            m.remove("generateName");
            m.remove("creationTimestamp");
        }
        if let Some(sa) = pod.pointer("/spec/serviceAccountName").and_then(Value::as_str) {
            let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
            let obj = ServiceAccount { metadata: ObjectMeta { name: Some(sa.into()), ..Default::default() }, ..Default::default() };
            let _ = api.create(&PostParams::default(), &obj).await;
        }
        out.push((name, pod));
    }
    out
}

/// The preStop sleeps the sizing formula allows for a status that reports `w` (seconds, rounded
/// to milliseconds as the status writes it) with `reason`, under the policy's `p`:
/// `clamp(ceil(W x safetyFactor + extraSeconds), minSeconds, maxSeconds)` for `Measured`,
/// `clamp(max(defaultSeconds, ceil(W x safetyFactor + extraSeconds)), min, max)` for
/// `LowSampleCount` (src/core/sizing.rs). The W the operator sized from lies within half a
/// millisecond of `w`: the range holds one value unless W x safetyFactor + extraSeconds sits
/// within that rounding of a whole second. None for another reason.
pub fn sized_pre_stop(reason: &str, w: f64, p: &safe_termination::core::crd::PreStopSpec) -> Option<std::ops::RangeInclusive<u64>> {
    let (lo, hi) = (f64::from(p.min_seconds), f64::from(p.max_seconds.max(p.min_seconds)));
    let size = |w: f64| {
        // the operator's ceil ignores float noise below a nanosecond
        let v = (w * p.safety_factor + f64::from(p.extra_seconds) - 1e-9).ceil();
        let v = if reason == "LowSampleCount" { v.max(f64::from(p.default_seconds)) } else { v };
        v.clamp(lo, hi) as u64
    };
    matches!(reason, "Measured" | "LowSampleCount").then(|| size(w - 0.0005)..=size(w + 0.0005))
}

/// `kubectl args…` of the cluster (`$ST_K8S_BIN/kubectl`, `$KUBECONFIG`): its stdout, or its
/// error as text (for printing what a user would see, e.g. `get tpol -o wide`).
pub fn kubectl(args: &[&str]) -> String {
    let bin = format!("{}/kubectl", std::env::var("ST_K8S_BIN").expect("ST_K8S_BIN: source $ST_E2E_DIR/env"));
    match std::process::Command::new(&bin).args(args).output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => format!("{bin} {}: {}: {}", args.join(" "), o.status, String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => format!("{bin}: {e}"),
    }
}
