//! The Helm chart (charts/safe-termination) and the operator's own certificates on the real
//! control plane: each rendering of the chart's `ci/` value sets applied with a server-side dry
//! run, a real `helm install` / `helm upgrade` / `helm uninstall`, the chart's webhook
//! configuration driving the real API server to the operator (run out of cluster as the chart's
//! ServiceAccount, with the certificates it generates and rotates), and the certificate module
//! against the API server. What needs helm or promtool but no cluster (lint, the renderings part
//! by part, the alert rules) is in tests/chart_render.rs; the helpers both use in
//! tests/common/chart.rs.
//!
//! They need the tools of `make k8s-bins` (helm, kubectl in `$ST_K8S_BIN`) and the local control
//! plane (`make cluster-up`), so they are built only with `--features cluster-tests` (a plain
//! `cargo test` skips them) and run by `make e2e` (e2e/run-e2e.sh: `--test-threads=1`). Without
//! them they fail loudly: they never pass by skipping.
//!
//! Here the release's pods land on kwok nodes, where nothing executes (tests/e2e_operator_pods.rs
//! runs the image on the real nodes), so the installed release is checked as objects, and the
//! operator binary runs out of cluster with
//! the release's ServiceAccount identity (kubeconfig impersonation), which exercises the chart's
//! RBAC with the real code. Service IPs are virtual here: the API server can only reach a webhook
//! registered by URL on 127.0.0.1, so the routing test registers the chart's rendered webhook
//! with its `service` replaced by such a URL, and every webhook configuration that keeps its
//! `service` gets a namespaceSelector that matches no namespace.

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};

mod common;
use safe_termination::certs::{self, Action, CertConfig};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;

use common::Operator;
use common::chart::*;
use common::first_der;
use common::tools::{run, tool, try_run};

// ---------------------------------------------------------------------------------------------
// tests on the control plane

async fn delete_namespace(client: &Client, name: &str) {
    let _ = Api::<Namespace>::all(client.clone()).delete(name, &DeleteParams::default()).await;
}

/// Applies the chart's CRDs (what `helm install` does on a first install) and waits until served.
fn apply_chart_crd() {
    run(tool("kubectl").args(["apply", "--server-side", "--field-manager=e2e-chart", "-f"]).arg(chart().join("crds")), None);
    run(
        tool("kubectl").args([
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/terminationpolicies.safetermination.io",
            "crd/terminationparameters.safetermination.io",
        ]),
        None,
    );
}

/// Minimal CRDs for the cert-manager and Prometheus Operator kinds the chart can render (the
/// local control plane has neither project). Returns the ones this call created.
fn install_stand_in_crds() -> Vec<String> {
    let kinds = [
        ("cert-manager.io", "Certificate", "certificates", "v1"),
        ("cert-manager.io", "Issuer", "issuers", "v1"),
        ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors", "v1"),
        ("monitoring.coreos.com", "PodMonitor", "podmonitors", "v1"),
        ("monitoring.coreos.com", "PrometheusRule", "prometheusrules", "v1"),
    ];
    let mut created = Vec::new();
    for (group, kind, plural, version) in kinds {
        let name = format!("{plural}.{group}");
        if try_run(tool("kubectl").args(["get", "crd", &name]), None).is_ok() {
            continue;
        }
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": name, "labels": {"safetermination.e2e/stand-in": "true"}},
            "spec": {"group": group, "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                "versions": [{"name": version, "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
        });
        run(tool("kubectl").args(["apply", "--server-side", "--field-manager=e2e-chart", "-f", "-"]), Some(&crd.to_string()));
        created.push(name);
    }
    for name in &created {
        run(tool("kubectl").args(["wait", "--for=condition=Established", "--timeout=60s", &format!("crd/{name}")]), None);
    }
    created
}

#[tokio::test]
async fn every_rendering_passes_a_server_side_dry_run() {
    let client = common::client().await;
    apply_chart_crd();
    let stand_ins = install_stand_in_crds();
    let ns = "st-chart-dry";
    common::fresh_namespace(&client, ns).await;
    for f in ci_files() {
        let rendered = helm_template("st", ns, Some(&f), &[]);
        let n = docs(&rendered).len();
        let out = run(tool("kubectl").args(["apply", "--server-side", "--dry-run=server", "--field-manager=e2e-chart", "-f", "-"]), Some(&rendered));
        let applied = out.lines().filter(|l| l.contains("(server dry run)")).count();
        assert_eq!(applied, n, "{}: every object validated by the API server:\n{out}", f.display());
        eprintln!("{}: {applied} objects accepted by the API server (dry run)", stem(&f));
    }
    delete_namespace(&client, ns).await;
    for name in stand_ins {
        let _ = try_run(tool("kubectl").args(["delete", "crd", &name, "--wait=false"]), None);
    }
}

/// The operator out of cluster as the chart's ServiceAccount `sa` of `namespace`, with the
/// release's names for its lease, certificate Secret, webhook Service and configuration, and
/// fast certificate checks; `extra` flags after these.
fn start_operator(namespace: &str, sa: &str, release: &str, extra: &[&str]) -> Operator {
    let lease = format!("{release}-safe-termination-leader");
    let secret = format!("{release}-safe-termination-tls");
    let fullname = format!("{release}-safe-termination");
    let mut flags = vec!["--lease-name", &lease, "--cert-secret", &secret, "--webhook-service", &fullname];
    flags.extend(["--webhook-configuration", &fullname, "--write-cert-files", "--cert-extra-san", "127.0.0.1"]);
    flags.extend(["--cert-check-interval-seconds", "2", "--cert-reload-interval-seconds", "1"]);
    // these tests are about the webhook and its certificates; the name is the chart's, so its
    // RBAC covers the stale-policy check
    flags.extend(["--admission-backend", "webhook", "--admission-policy-name", &fullname]);
    flags.extend(extra);
    Operator::spawn_as_service_account(namespace, sa, "e2e-chart", &format!("chart-{namespace}"), &flags)
}

use common::wait_for;

async fn secret_data(client: &Client, ns: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
    let s = Api::<Secret>::namespaced(client.clone(), ns).get_opt(name).await.ok()??;
    Some(s.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect())
}

async fn ca_bundles(client: &Client, name: &str) -> Vec<Option<Vec<u8>>> {
    let cfg = Api::<MutatingWebhookConfiguration>::all(client.clone()).get(name).await.unwrap();
    cfg.webhooks.unwrap_or_default().into_iter().map(|w| w.client_config.ca_bundle.map(|b| b.0)).collect()
}

/// `kubectl auth can-i VERB RESOURCE [-n NS]` as the ServiceAccount.
fn can_i(sa: &str, args: &[&str]) -> bool {
    let out = tool("kubectl").args(["auth", "can-i"]).args(args).args(["--as", sa]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

#[tokio::test]
async fn helm_install_upgrade_and_uninstall_on_the_real_control_plane() {
    let client = common::client().await;
    let (ns, release, fullname) = ("st-helm", "st", "st-safe-termination");
    let app = "st-helm-app";
    let _ = try_run(tool("helm").args(["uninstall", release, "-n", ns, "--wait"]), None);
    // the release namespace enforces the restricted Pod Security profile: the ReplicaSet's pods
    // are only created if the chart's pod template complies
    common::fresh_namespace_with_labels(
        &client,
        ns,
        &[("pod-security.kubernetes.io/enforce", "restricted"), ("pod-security.kubernetes.io/enforce-version", "latest")],
    )
    .await;
    common::fresh_namespace(&client, app).await;
    // Service IPs are virtual here: no namespace selects this release's webhook, so the API
    // server never tries to reach it
    let never = "webhook.namespaceSelector.matchLabels.safetermination\\.e2e/never=true";
    let out = run(
        // the webhook backend: this test reads the webhook configuration back (the default,
        // auto, picks the policy on 1.37: tests/e2e_operator_pods.rs t8b); no node agent: its
        // hostNetwork needs the privileged level, which this namespace refuses (checked by
        // rendering in the_node_agent_renders_for_true_and_auto_and_not_for_false)
        tool("helm").args(["install", release]).arg(chart()).args([
            "-n",
            ns,
            "--set-string",
            never,
            "--set",
            "admission.backend=webhook",
            "--set",
            "agent.enabled=false",
            "--wait",
            "--timeout",
            "180s",
        ]),
        None,
    );
    assert!(out.contains("STATUS: deployed"), "{out}");
    assert!(out.contains("Namespaces without a TerminationPolicy are not mutated"), "NOTES.txt: {out}");

    // the objects exist and are what the chart says (read back from the API server)
    let deploy: k8s_openapi::api::apps::v1::Deployment = Api::namespaced(client.clone(), ns).get(fullname).await.unwrap();
    let status = deploy.status.unwrap();
    assert_eq!((status.replicas, status.ready_replicas), (Some(2), Some(2)), "2 replicas (kwok-run) admitted under restricted Pod Security");
    let pods = Api::<Pod>::namespaced(client.clone(), ns).list(&Default::default()).await.unwrap();
    assert_eq!(pods.items.len(), 2);
    for p in &pods.items {
        let spec = p.spec.as_ref().unwrap();
        assert!(spec.node_name.is_some(), "scheduled");
        let sleep = spec.containers[0].lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()).and_then(|h| h.sleep.as_ref()).map(|s| s.seconds);
        assert_eq!(sleep, Some(10), "the API server kept the operator's own native preStop sleep");
    }
    let stored = Api::<MutatingWebhookConfiguration>::all(client.clone()).get(fullname).await.unwrap();
    let stored = serde_json::to_value(&stored).unwrap();
    let w = &stored["webhooks"][0];
    assert_eq!((w["failurePolicy"].as_str(), w["timeoutSeconds"].as_u64(), w["sideEffects"].as_str()), (Some("Ignore"), Some(5), Some("None")));
    assert_eq!(w["reinvocationPolicy"], "IfNeeded");
    assert_eq!(w["matchConditions"].as_array().unwrap().len(), 2, "the API server compiled and kept both CEL conditions");
    assert!(w["clientConfig"].get("caBundle").is_none(), "mode operator: no caBundle until the operator patches it");
    for (kind, name, namespace) in [
        ("serviceaccount", fullname, ns),
        ("service", fullname, ns),
        ("poddisruptionbudget", fullname, ns),
        ("role", fullname, ns),
        ("rolebinding", fullname, ns),
        ("role", "st-safe-termination-kube-proxy", "kube-system"),
        ("rolebinding", "st-safe-termination-kube-proxy", "kube-system"),
        ("clusterrole", fullname, ""),
        ("clusterrolebinding", fullname, ""),
    ] {
        let mut c = tool("kubectl");
        c.args(["get", kind, name]);
        if !namespace.is_empty() {
            c.args(["-n", namespace]);
        }
        run(&mut c, None);
    }

    // RBAC as the API server evaluates it (SubjectAccessReview)
    let sa = format!("system:serviceaccount:{ns}:{fullname}");
    let yes = [
        vec!["list", "terminationpolicies.safetermination.io", "-A"],
        vec!["watch", "terminationpolicies.safetermination.io", "-A"],
        vec!["patch", "terminationpolicies.safetermination.io", "--subresource=status", "-n", app],
        vec!["create", "events.events.k8s.io", "-n", app],
        vec!["list", "pods", "-A"],
        vec!["watch", "services", "-A"],
        vec!["watch", "endpointslices.discovery.k8s.io", "-A"],
        vec!["create", "pods", "-n", ns],
        vec!["create", "leases.coordination.k8s.io", "-n", ns],
        vec!["patch", "leases.coordination.k8s.io/st-safe-termination-leader", "-n", ns],
        vec!["create", "secrets", "-n", ns],
        vec!["update", "secrets/st-safe-termination-tls", "-n", ns],
        vec!["get", "configmaps/kube-proxy", "-n", "kube-system"],
        vec!["patch", "mutatingwebhookconfigurations/st-safe-termination"],
    ];
    let no = [
        vec!["create", "pods", "-n", app],
        vec!["delete", "pods", "-n", ns],
        vec!["get", "secrets/other", "-n", ns],
        vec!["list", "secrets", "-n", ns],
        vec!["get", "secrets", "-n", "kube-system"],
        vec!["patch", "terminationpolicies.safetermination.io", "-n", app],
        vec!["get", "configmaps/coredns", "-n", "kube-system"],
        vec!["patch", "mutatingwebhookconfigurations/other"],
        vec!["patch", "leases.coordination.k8s.io/other", "-n", ns],
        vec!["create", "deployments.apps", "-n", app],
    ];
    for a in &yes {
        assert!(can_i(&sa, a), "the ServiceAccount must be allowed: {a:?}");
    }
    for a in &no {
        assert!(!can_i(&sa, a), "the ServiceAccount must not be allowed: {a:?}");
    }

    // the real operator code under exactly these permissions: certificates, caBundle, lease,
    // capability probe, policy status, events, pod counts, Service watch
    let policy = json!({"apiVersion": "safetermination.io/v1alpha1", "kind": "TerminationPolicy",
        "metadata": {"name": "web", "namespace": app}, "spec": {"preStop": {"minSamples": 1}}});
    run(tool("kubectl").args(["apply", "--server-side", "--field-manager=e2e-chart", "-f", "-"]), Some(&policy.to_string()));
    let op = start_operator(ns, fullname, release, &[]);
    op.wait_ready().await;
    let secret = wait_for("the operator's certificate Secret", 60, async || secret_data(&client, ns, "st-safe-termination-tls").await).await;
    for k in ["ca.crt", "ca.key", "tls.crt", "tls.key"] {
        assert!(secret.contains_key(k), "{k}");
    }
    wait_for("the caBundle patch", 30, async || (ca_bundles(&client, fullname).await == vec![Some(secret["ca.crt"].clone())]).then_some(())).await;
    let st = wait_for("a measured policy status", 90, async || {
        let p: Value =
            serde_json::to_value(Api::<safe_termination::core::crd::TerminationPolicy>::namespaced(client.clone(), app).get("web").await.ok()?).ok()?;
        (p["status"]["recommendation"]["reason"] == "Measured" && p["status"]["pods"].is_object()).then_some(p)
    })
    .await;
    assert_eq!(st["status"]["measurement"]["nodesScraped"], 2, "{st:#}");
    let lease: k8s_openapi::api::coordination::v1::Lease = Api::namespaced(client.clone(), ns).get("st-safe-termination-leader").await.unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("e2e-chart"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = op.log();
    for bad in ["forbidden", "Forbidden", "cannot publish event", "capability probe failed", "cannot count pods"] {
        assert!(!log.contains(bad), "the chart's RBAC is not enough ({bad}):\n{log}");
    }
    assert!(log.contains("native preStop sleep available"), "the dry-run capability probe ran under the chart's RBAC:\n{log}");
    drop(op);

    // helm upgrade: new values reach the objects; the operator's caBundle survives it
    let ca = secret["ca.crt"].clone();
    let out = run(
        tool("helm").args(["upgrade", release]).arg(chart()).args([
            "-n",
            ns,
            "--reuse-values",
            "--set",
            "replicaCount=3",
            "--set",
            "defaultPolicy.enabled=true",
            "--set",
            "webhook.timeoutSeconds=4",
            "--wait",
            "--timeout",
            "180s",
        ]),
        None,
    );
    assert!(out.contains("STATUS: deployed") && out.contains("REVISION: 2"), "{out}");
    let deploy: k8s_openapi::api::apps::v1::Deployment = Api::namespaced(client.clone(), ns).get(fullname).await.unwrap();
    assert_eq!(deploy.status.unwrap().ready_replicas, Some(3));
    let args = deploy.spec.unwrap().template.spec.unwrap().containers[0].args.clone().unwrap();
    assert!(args.contains(&format!("--default-policy={ns}/cluster-default")), "{args:?}");
    assert!(args.contains(&"--request-timeout-ms=3500".to_string()), "{args:?}");
    Api::<safe_termination::core::crd::TerminationPolicy>::namespaced(client.clone(), ns).get("cluster-default").await.expect("the default policy");
    let hook = Api::<MutatingWebhookConfiguration>::all(client.clone()).get(fullname).await.unwrap();
    let w = &hook.webhooks.unwrap()[0];
    assert_eq!(w.timeout_seconds, Some(4));
    assert_eq!(w.client_config.ca_bundle.as_ref().map(|b| b.0.clone()), Some(ca), "helm upgrade kept the caBundle the operator owns");
    assert_eq!(w.namespace_selector.as_ref().unwrap().match_labels.as_ref().unwrap()["safetermination.e2e/never"], "true", "--reuse-values");

    // helm uninstall: the release's objects go; the CRD and the operator's Secret stay
    run(tool("helm").args(["uninstall", release, "-n", ns, "--wait", "--timeout", "120s"]), None);
    assert!(Api::<MutatingWebhookConfiguration>::all(client.clone()).get_opt(fullname).await.unwrap().is_none());
    // get_opt is Ok(None) exactly on 404 NotFound: any other failure fails the test
    assert!(Api::<ClusterRole>::all(client.clone()).get_opt(fullname).await.unwrap().is_none(), "ClusterRole {fullname} left");
    let role = "st-safe-termination-kube-proxy";
    assert!(Api::<Role>::namespaced(client.clone(), "kube-system").get_opt(role).await.unwrap().is_none(), "Role {role} left");
    assert!(Api::<Deployment>::namespaced(client.clone(), ns).get_opt(fullname).await.unwrap().is_none(), "Deployment {fullname} left");
    run(tool("kubectl").args(["get", "crd", "terminationpolicies.safetermination.io"]), None);
    assert!(secret_data(&client, ns, "st-safe-termination-tls").await.is_some(), "documented: uninstall leaves the generated Secret");
    delete_namespace(&client, app).await;
    delete_namespace(&client, ns).await;
}

/// Deletes objects outside the test's namespaces (`kubectl delete ARGS...`) even when the test
/// fails.
struct Leftovers(Vec<Vec<String>>);

impl Leftovers {
    fn new(objects: &[&[&str]]) -> Self {
        Self(objects.iter().map(|o| o.iter().map(|s| s.to_string()).collect()).collect())
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for args in &self.0 {
            let _ = try_run(tool("kubectl").arg("delete").args(args).args(["--ignore-not-found", "--wait=false"]), None);
        }
    }
}

fn pod(name: &str, ns: &str, extra: Value) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}});
    merge(&mut p, extra);
    p
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// Creates `pod` (a server-side dry run when `dry`) and returns what the API server stored.
async fn create(client: &Client, pod: &Value, dry: bool) -> Pod {
    let ns = pod["metadata"]["namespace"].as_str().unwrap();
    let p: Pod = serde_json::from_value(pod.clone()).unwrap();
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams { dry_run: dry, field_manager: Some("e2e-chart".into()) }, &p)
        .await
        .unwrap_or_else(|e| panic!("create pod {}/{}: {e}", ns, pod["metadata"]["name"]))
}

fn sleep_of(p: &Pod) -> Option<i64> {
    p.spec.as_ref()?.containers[0].lifecycle.as_ref()?.pre_stop.as_ref()?.sleep.as_ref().map(|s| s.seconds)
}

/// The leaf certificate a TLS client sees on 127.0.0.1:`port`, verified against `ca_pem`
/// (a bundle) for the name 127.0.0.1.
async fn served_leaf(port: u16, ca_pem: &[u8]) -> Result<Vec<u8>, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(c.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let http = reqwest::Client::builder().use_preconfigured_tls(tls).tls_info(true).timeout(Duration::from_secs(5)).build().unwrap();
    let r = http.get(format!("https://127.0.0.1:{port}/mutate")).send().await.map_err(|e| format!("{e:?}"))?;
    let info = r.extensions().get::<reqwest::tls::TlsInfo>().ok_or("no TLS info")?;
    info.peer_certificate().map(<[u8]>::to_vec).ok_or_else(|| "no peer certificate".into())
}

#[tokio::test]
async fn the_charts_webhook_routes_pods_through_the_real_api_server_with_operator_certificates() {
    let client = common::client().await;
    apply_chart_crd();
    let (release, sys, fullname) = ("sthook", "st-hook-sys", "sthook-safe-termination");
    let (app, optout) = ("st-hook-app", "st-hook-optout");
    // the chart's own webhook configuration, RBAC and ServiceAccount (release namespace st-hook-sys)
    let rendered = docs(&helm_template(release, sys, None, &[]));
    let keep = ["MutatingWebhookConfiguration", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"];
    let mut objects: Vec<Value> = rendered.into_iter().filter(|d| keep.contains(&d["kind"].as_str().unwrap())).collect();
    let kp = format!("{fullname}-kube-proxy");
    let _cleanup = Leftovers::new(&[
        &["mutatingwebhookconfiguration", fullname],
        &["clusterrole", fullname],
        &["clusterrolebinding", fullname],
        &["role", &kp, "-n", "kube-system"],
        &["rolebinding", &kp, "-n", "kube-system"],
    ]);
    common::fresh_namespace(&client, sys).await;
    common::fresh_namespace(&client, app).await;
    common::fresh_namespace_with_labels(&client, optout, &[(safe_termination::core::annotations::LABEL_IGNORE, "true")]).await;
    // Service IPs are virtual here: the API server reaches the operator by URL on loopback; every
    // other field (rules, selectors, matchConditions, policies) is the chart's
    let apply = |o: &Value| {
        run(tool("kubectl").args(["apply", "--server-side", "--field-manager=e2e-chart", "-f", "-"]), Some(&serde_json::to_string(o).unwrap()));
    };
    for o in objects.iter().filter(|o| o["kind"] != "MutatingWebhookConfiguration") {
        apply(o);
    }
    let op = start_operator(sys, fullname, release, &[]);
    for o in objects.iter_mut().filter(|o| o["kind"] == "MutatingWebhookConfiguration") {
        o["webhooks"][0]["clientConfig"] = json!({"url": format!("https://127.0.0.1:{}/mutate", op.webhook)});
        apply(o);
    }
    for ns in [app, optout, sys] {
        let p = json!({"apiVersion": "safetermination.io/v1alpha1", "kind": "TerminationPolicy",
            "metadata": {"name": "all", "namespace": ns}, "spec": {"scope": "AllLongRunning"}});
        run(tool("kubectl").args(["apply", "--server-side", "--field-manager=e2e-chart", "-f", "-"]), Some(&p.to_string()));
    }

    // the operator generates its certificate, patches the chart's caBundle and serves it
    op.wait_ready().await;
    let secret_name = format!("{fullname}-tls");
    let secret = wait_for("the certificate Secret", 60, async || secret_data(&client, sys, &secret_name).await).await;
    let obs = certs::observe(&secret);
    let leaf = obs.serving.clone().expect("a usable serving certificate");
    for name in [format!("{fullname}.{sys}.svc"), "127.0.0.1".into()] {
        assert!(leaf.sans.contains(&name), "{name} in {:?}", leaf.sans);
    }
    wait_for("the caBundle patch", 30, async || (ca_bundles(&client, fullname).await == vec![Some(secret["ca.crt"].clone())]).then_some(())).await;
    assert_eq!(std::fs::read(&op.tls.0).unwrap(), secret["tls.crt"], "--write-cert-files");
    assert_eq!(
        served_leaf(op.webhook, &secret["ca.crt"]).await.unwrap(),
        first_der(&secret["tls.crt"]),
        "the webhook serves the Secret's certificate, trusted by its CA for 127.0.0.1"
    );

    // a long-running pod in a namespace with a policy is mutated (once the capability probe
    // has found the native sleep and the plan has the policy)
    let mutated = wait_for("the first mutated pod", 60, async || {
        let p = create(&client, &pod("probe", app, json!({})), true).await;
        sleep_of(&p).map(|_| p)
    })
    .await;
    assert_eq!(mutated.metadata.annotations.as_ref().unwrap()["safetermination.io/policy"], format!("{app}/all"));
    let before = op.requests().await;
    let p = create(&client, &pod("web", app, json!({})), false).await;
    assert!(sleep_of(&p).is_some(), "a real pod created through the chart's webhook is mutated");
    assert_eq!(op.requests().await, before + 1, "called once");

    // and everything the chart excludes never reaches the webhook
    let cases = [
        ("job pod (restartPolicy Never, matchCondition)", pod("job", app, json!({"spec": {"restartPolicy": "Never"}})), false),
        ("OnFailure pod (matchCondition)", pod("retry", app, json!({"spec": {"restartPolicy": "OnFailure"}})), false),
        (
            "mirror pod (annotation, matchCondition)",
            pod("mirror", app, json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}, "spec": {"nodeName": "node-d"}})),
            true,
        ),
        ("opted-out pod (objectSelector)", pod("optout-pod", app, json!({"metadata": {"labels": {"safetermination.io/ignore": "true"}}})), false),
        ("opted-out namespace (namespaceSelector)", pod("any", optout, json!({})), false),
        ("release namespace (namespaceSelector)", pod("own", sys, json!({})), false),
        ("kube-system (namespaceSelector)", pod("st-e2e-system-pod", "kube-system", json!({})), true),
    ];
    for (what, p, dry) in &cases {
        let before = op.requests().await;
        let created = create(&client, p, *dry).await;
        assert_eq!(sleep_of(&created), None, "{what}: not mutated");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(op.requests().await, before, "{what}: the API server did not call the webhook");
    }
    // the same pods without the exclusion are called (the cases above are not vacuous)
    let before = op.requests().await;
    let p = create(&client, &pod("plain-dry", app, json!({"spec": {"restartPolicy": "Always"}})), true).await;
    assert!(sleep_of(&p).is_some());
    assert_eq!(op.requests().await, before + 1);

    // renewal without restart: a serving certificate that is no longer usable is replaced
    // from the same CA; the webhook reloads it from the files
    let old_leaf = secret["tls.crt"].clone();
    // (a kubernetes.io/tls Secret must keep tls.crt: put one from a foreign CA there)
    let now = certs::unix_now();
    let (foreign_ca, foreign_key) = certs::generate_ca(now, Duration::from_secs(86_400)).unwrap();
    let names = certs::subject_alt_names(fullname, sys, &["127.0.0.1".to_string()]);
    let (c, k) = certs::generate_serving(&foreign_ca, &foreign_key, &names, now, Duration::from_secs(3600), i64::MAX).unwrap();
    let patch =
        json!([{"op": "replace", "path": "/data/tls.crt", "value": b64(c.as_bytes())}, {"op": "replace", "path": "/data/tls.key", "value": b64(k.as_bytes())}]);
    run(tool("kubectl").args(["patch", "secret", &secret_name, "-n", sys, "--type=json", "-p", &patch.to_string()]), None);
    let renewed = wait_for("a renewed serving certificate", 30, async || {
        secret_data(&client, sys, &secret_name).await.filter(|d| d.get("tls.crt").is_some_and(|x| *x != old_leaf && *x != c.as_bytes()))
    })
    .await;
    assert_eq!(renewed["ca.crt"], secret["ca.crt"], "same CA");
    wait_for("the webhook serving the renewed certificate", 30, async || {
        (served_leaf(op.webhook, &renewed["ca.crt"]).await.ok()? == first_der(&renewed["tls.crt"])).then_some(())
    })
    .await;
    let p = create(&client, &pod("after-renewal", app, json!({})), true).await;
    assert!(sleep_of(&p).is_some(), "the API server trusts the renewed certificate");

    // CA rotation: a CA whose key is gone is replaced; the caBundle holds the new and the
    // previous CA, so no replica's leaf is untrusted at any moment
    run(tool("kubectl").args(["patch", "secret", &secret_name, "-n", sys, "--type=json", "-p", r#"[{"op":"remove","path":"/data/ca.key"}]"#]), None);
    let rotated = wait_for("a new CA", 30, async || {
        secret_data(&client, sys, &secret_name).await.filter(|d| d.contains_key("ca.key") && d["ca.crt"] != renewed["ca.crt"])
    })
    .await;
    let bundle = certs::bundle_info(&rotated["ca.crt"]).unwrap();
    assert_eq!(bundle.len(), 2, "new CA first, previous CA kept");
    assert!(String::from_utf8_lossy(&rotated["ca.crt"]).contains(String::from_utf8_lossy(&renewed["ca.crt"]).trim()), "the previous CA is in the bundle");
    wait_for("the rotated caBundle", 30, async || (ca_bundles(&client, fullname).await == vec![Some(rotated["ca.crt"].clone())]).then_some(())).await;
    wait_for("the webhook serving a leaf of the new CA", 30, async || {
        (served_leaf(op.webhook, &rotated["ca.crt"]).await.ok()? == first_der(&rotated["tls.crt"])).then_some(())
    })
    .await;
    let p = create(&client, &pod("after-ca-rotation", app, json!({})), true).await;
    assert!(sleep_of(&p).is_some(), "the API server trusts the new CA");
    let log = op.log();
    assert!(!log.contains("orbidden"), "the chart's RBAC covers the certificate work:\n{log}");

    drop(op);
    let _ = Api::<MutatingWebhookConfiguration>::all(client.clone()).delete(fullname, &DeleteParams::default()).await;
    for ns in [app, optout, sys] {
        delete_namespace(&client, ns).await;
    }
}

#[tokio::test]
async fn certificate_module_on_the_real_api_server() {
    let client = common::client().await;
    let ns = "st-certs";
    let hook = "st-certs-e2e";
    common::fresh_namespace(&client, ns).await;
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let _ = hooks.delete(hook, &DeleteParams::default()).await;
    let _cleanup = Leftovers::new(&[&["mutatingwebhookconfiguration", hook]]);
    // two webhooks, never called (no namespace has the label)
    let w = |name: &str| {
        json!({"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Ignore",
            "clientConfig": {"url": "https://127.0.0.1:1/mutate"},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            "namespaceSelector": {"matchLabels": {"safetermination.e2e/never": "true"}}})
    };
    let cfg: MutatingWebhookConfiguration =
        serde_json::from_value(json!({"metadata": {"name": hook}, "webhooks": [w("a.safetermination.io"), w("b.safetermination.io")]})).unwrap();
    hooks.create(&PostParams::default(), &cfg).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = CertConfig::new("webhook-tls", ns, "safe-termination");
    cfg.webhook_configuration = Some(hook.into());
    cfg.files = Some((dir.path().join("tls.crt"), dir.path().join("tls.key")));
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);

    // first round: a new CA and serving certificate, both webhooks get the caBundle
    let o = certs::reconcile_once(&client, &cfg).await.unwrap();
    assert!(matches!(o.action, Action::RenewCa(_)), "{o:?}");
    assert!(o.secret_written);
    assert_eq!(o.ca_bundle_patched, 2);
    let s1 = secrets.get("webhook-tls").await.unwrap();
    assert_eq!(s1.type_.as_deref(), Some("kubernetes.io/tls"));
    let data1 = secret_data(&client, ns, "webhook-tls").await.unwrap();
    assert_eq!(ca_bundles(&client, hook).await, vec![Some(data1["ca.crt"].clone()); 2]);
    let info = certs::observe(&data1).serving.unwrap();
    assert!(info.sans.contains(&"safe-termination.st-certs.svc".to_string()), "{:?}", info.sans);
    assert!(certs::sync_files(&client, &cfg).await.unwrap());
    assert_eq!(std::fs::read(dir.path().join("tls.crt")).unwrap(), data1["tls.crt"]);
    assert!(!certs::sync_files(&client, &cfg).await.unwrap(), "unchanged files are not rewritten");

    // second round: nothing to do, nothing written
    let o = certs::reconcile_once(&client, &cfg).await.unwrap();
    assert!(matches!(o.action, Action::Keep { .. }), "{o:?}");
    assert!(!o.secret_written);
    assert_eq!(o.ca_bundle_patched, 0);
    assert_eq!(secrets.get("webhook-tls").await.unwrap().metadata.resource_version, s1.metadata.resource_version);

    // something resets one caBundle (a reinstall): repaired, Secret untouched
    let reset = json!([{"op": "replace", "path": "/webhooks/1/clientConfig/caBundle", "value": b64(b"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n")}]);
    hooks.patch(hook, &PatchParams::default(), &Patch::<()>::Json(serde_json::from_value(reset).unwrap())).await.unwrap();
    let o = certs::reconcile_once(&client, &cfg).await.unwrap();
    assert_eq!((o.secret_written, o.ca_bundle_patched), (false, 1));
    assert_eq!(ca_bundles(&client, hook).await, vec![Some(data1["ca.crt"].clone()); 2]);

    // a serving certificate past 2/3 of its life is renewed from the same CA
    let now = certs::unix_now();
    let ca_after = certs::bundle_info(&data1["ca.crt"]).unwrap()[0].not_after;
    let names = certs::subject_alt_names("safe-termination", ns, &[]);
    let (old_cert, old_key) = certs::generate_serving(
        std::str::from_utf8(&data1["ca.crt"]).unwrap(),
        std::str::from_utf8(&data1["ca.key"]).unwrap(),
        &names,
        now - 3000,
        Duration::from_secs(3600),
        ca_after,
    )
    .unwrap();
    let patch = json!({"data": {"tls.crt": b64(old_cert.as_bytes()), "tls.key": b64(old_key.as_bytes())}});
    secrets.patch("webhook-tls", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let o = certs::reconcile_once(&client, &cfg).await.unwrap();
    assert!(matches!(&o.action, Action::RenewServing(why) if why.contains("two thirds")), "{o:?}");
    assert!(o.secret_written);
    let data2 = secret_data(&client, ns, "webhook-tls").await.unwrap();
    assert_eq!(data2["ca.crt"], data1["ca.crt"]);
    assert_ne!(data2["tls.crt"], old_cert.as_bytes());
    let renewed = certs::observe(&data2).serving.unwrap();
    assert!(renewed.not_after - now > 300 * 86_400, "a full-length certificate again");
    assert!(certs::sync_files(&client, &cfg).await.unwrap());

    // a Service rename is a new certificate for the new name
    cfg.service = "renamed".into();
    let o = certs::reconcile_once(&client, &cfg).await.unwrap();
    assert!(matches!(&o.action, Action::RenewServing(why) if why.contains("renamed.st-certs.svc")), "{o:?}");

    // no webhook configuration (yet): the Secret is still kept, nothing fails
    hooks.delete(hook, &DeleteParams::default()).await.unwrap();
    let o = certs::reconcile_once(&client, &cfg).await.unwrap();
    assert_eq!(o.ca_bundle_patched, 0);
    delete_namespace(&client, ns).await;
}
