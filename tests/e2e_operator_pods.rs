//! The operator as real pods. The image `make image` writes (image/build.sh) is pushed by make
//! e2e as an image index, and the chart as an OCI artifact, to the cluster's registry
//! (e2e/run-e2e.sh: `make image-index`, `make chart-push`); the release is installed with the
//! README's own `helm install` line, its chart taken from `oci://` and its image by the index's
//! digest, which the nodes' containerd pulls (without a pushed release, the image imported
//! through cluster-up's `ST_EXTRA_IMAGE_TARS` and the checkout's chart), onto the cluster's real nodes (kubelet +
//! containerd + runc, e2e/cluster/nodes.sh), in a namespace that enforces the `restricted` Pod Security
//! Standard. Then the faults, each printing its number:
//!
//! - the leader's pod deleted, and separately its container killed through the node's runtime:
//!   time to a new leader, status writes resuming, and no two replicas writing status in
//!   overlapping periods (each replica's `safe_termination_controller_status_writes_total`,
//!   sampled every 200 ms);
//! - a pod-create storm while the webhook pods are deleted: 0 failed creations, and the pods
//!   admitted unmutated (fail open) counted by the operator's `_pods{state="unprotected"}`
//!   gauge exactly as the test counts them;
//! - the same storm during a `helm upgrade` (the operator's own rollout) and during a
//!   certificate rotation: 0 failed admissions, shown by the API server's
//!   `apiserver_admission_webhook_fail_open_count` and `_request_total` codes;
//! - kube-apiserver restarted under the running operator; a kube-proxy restarted
//!   mid-measurement;
//! - both kube-proxies rebound to `127.0.0.1` in their nodes' network
//!   namespaces (kubeadm's default): the chart's node agents (hostNetwork DaemonSet, mutual TLS)
//!   measure both nodes, an agent refuses a request without the operator's client certificate,
//!   and with one agent gone its node is reported failed while sizing continues from the other.
//!
//! What differs from a cloud cluster, and why: the API server runs on the host, which has no
//! kube-proxy and whose iptables/nftables may not be touched, so it calls the webhook at an
//! endpoint of its Service (`--enable-aggregator-routing`: a pod IP, routed to the node) rather
//! than at the ClusterIP; pods reach the API server through the `kubernetes` Service (kube-proxy
//! DNAT to a relay on each node). The kube-proxies are processes in the nodes' network
//! namespaces, not pods, so the operator gets them as `--kube-proxy-target`s; and the real nodes
//! carry a NoSchedule taint (every other e2e pod stays on the kwok nodes), so the operator's
//! pods get its toleration. Those three settings are the only values added to the README's
//! install line (`environment_values`).
//!
//! Built only with `--features cluster-tests`; `make e2e` runs them one at a time
//! (`--test-threads=1`), `uninstall_leaves_no_webhook` last so that the chart's cluster-wide
//! webhook does not outlive the file. Each test starts from [`ensure_installed`]: the release
//! installed with the base values, reinstalled when a test before it changed them, so any one
//! runs alone or in any order.

mod common;

use common::rules::RealNode;
use common::tools::{root, run, tool, try_run};
use common::{first_der, metric_sum};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NS: &str = "safe-termination";
const RELEASE: &str = "safe-termination";
const SELECTOR: &str = "app.kubernetes.io/name=safe-termination,app.kubernetes.io/instance=safe-termination";
const LEASE: &str = "safe-termination-leader";
const ADMIN_PORT: u16 = 8080;

// ---------------------------------------------------------------------------------------------
// the release

/// The README's install line, word for word: the Quick start's `helm install` command with its
/// continuation lines joined.
fn readme_helm_install() -> Vec<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut lines = readme.lines().skip_while(|l| !l.starts_with("helm install "));
    let mut cmd = String::new();
    for l in lines.by_ref() {
        let (part, more) = match l.trim_end().strip_suffix('\\') {
            Some(p) => (p, true),
            None => (l, false),
        };
        cmd.push_str(part.split(" #").next().unwrap());
        cmd.push(' ');
        if !more {
            break;
        }
    }
    let words: Vec<String> = cmd.split_whitespace().map(String::from).collect();
    assert!(words.len() >= 3 && words[0] == "helm" && words[1] == "install", "README.md has no `helm install` line: {cmd:?}");
    assert!(!cmd.contains('"') && !cmd.contains('\''), "the README's helm line has quotes; split it with a shell: {cmd}");
    words
}

/// Where make e2e pushed the release (e2e/run-e2e.sh, to the cluster's registry): the image
/// index as `REPOSITORY@sha256:…` and the chart as `REPOSITORY@sha256:…`; None when the
/// release was not pushed (the image imported into the nodes instead).
fn pushed_release() -> Option<(String, String)> {
    Some((std::env::var("ST_OPERATOR_IMAGE_REF").ok()?, std::env::var("ST_OPERATOR_CHART_REF").ok()?))
}

/// The README's install line as this environment runs it: with a pushed release, the chart
/// from the registry (`oci://`, the version the chart's digest was pushed under: Chart.yaml's,
/// plain HTTP on loopback) in place of the checkout's `charts/safe-termination`.
fn install_words() -> Vec<String> {
    let words = readme_helm_install();
    let Some((_, chart)) = pushed_release() else { return words };
    let repository = chart.split_once('@').map_or(chart.as_str(), |(r, _)| r);
    let chart_yaml = std::fs::read_to_string(root().join("charts/safe-termination/Chart.yaml")).unwrap();
    let version = chart_yaml.lines().find_map(|l| l.strip_prefix("version:")).map(|v| v.trim().trim_matches('"').to_string()).expect("Chart.yaml version");
    words
        .into_iter()
        .flat_map(|w| {
            if w == "charts/safe-termination" {
                vec![format!("oci://{repository}"), "--version".into(), version.clone(), "--plain-http".into()]
            } else {
                vec![w]
            }
        })
        .collect()
}

/// `NODE=URL` of every kube-proxy of the cluster (cluster-up's env).
fn kube_proxy_targets() -> Vec<String> {
    let nodes = std::env::var("ST_KP_NODES").expect("ST_KP_NODES: source the cluster's env (make e2e does)");
    let urls = std::env::var("ST_KP_METRICS_URLS").expect("ST_KP_METRICS_URLS");
    nodes.split_whitespace().zip(urls.split_whitespace()).map(|(n, u)| format!("{n}={}", u.trim_end_matches("/metrics"))).collect()
}

/// The values this environment adds to the README's line (see the module documentation), plus
/// short intervals so the faults are measured in seconds.
fn environment_values() -> Value {
    let taint = std::env::var("ST_REAL_NODE_TAINT").unwrap_or_else(|_| "safe-termination.e2e/real-node".into());
    let mut values = json!({
        // the tests measure the webhook path (the default `auto` picks the policy on this 1.37
        // cluster); the policy-backend test switches to the policy and measures that
        "admission": {"backend": "webhook"},
        "tolerations": [{"key": taint, "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {"safe-termination.e2e/node-type": "real"},
        // kube-proxies are reached directly (--kube-proxy-target below); the node agent's
        // hostNetwork needs the privileged Pod Security level, which this namespace refuses
        "agent": {"enabled": false},
        "operator": {
            "scrapeIntervalSeconds": 2,
            "windowSeconds": 120,
            "extraArgs": [format!("--kube-proxy-target={}", kube_proxy_targets().join(",")), "--status-refresh-seconds=5", "--cert-check-interval-seconds=5"],
        },
    });
    // a pushed release: the image by the index's digest (the nodes' containerd pulls it from the
    // cluster's registry; docs/install.md "From a registry")
    if let Some((image, _)) = pushed_release() {
        let (repository, digest) = image.split_once('@').expect("REPOSITORY@sha256:…");
        values["image"] = json!({"repository": repository, "digest": digest});
    }
    values
}

fn values_file() -> tempfile::NamedTempFile {
    let f = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    std::fs::write(f.path(), environment_values().to_string()).unwrap();
    f
}

fn installed() -> bool {
    try_run(tool("helm").args(["status", RELEASE, "-n", NS]), None).is_ok()
}

/// Whether the installed release runs with the base values, [`environment_values`]: a test that
/// switches the admission backend or the certificates' mode leaves other values (the pod
/// annotation a `helm upgrade` test sets to roll the pods changes nothing a test relies on).
fn installed_with_base_values() -> bool {
    let Ok(out) = try_run(tool("helm").args(["get", "values", RELEASE, "-n", NS, "-o", "json"]), None) else { return false };
    let mut user: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
    if let Some(m) = user.as_object_mut() {
        m.remove("podAnnotations");
    }
    user == environment_values()
}

/// The release as every test here starts from: installed with the README's line (plus the
/// environment's values), the webhook backend, certificates in operator mode; reinstalled when
/// an earlier test left other values. Waits for two ready replicas. Each test calls it, so none
/// depends on another having run first.
async fn ensure_installed(client: &Client) -> Duration {
    let t0 = Instant::now();
    if installed() && !installed_with_base_values() {
        eprintln!("the release runs with other values than the base: reinstalling");
        run(tool("helm").args(["uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "180s"]), None);
    }
    if !installed() {
        common::fresh_namespace_with_labels(
            client,
            NS,
            &[("pod-security.kubernetes.io/enforce", "restricted"), ("pod-security.kubernetes.io/enforce-version", "latest")],
        )
        .await;
        let words = install_words();
        let values = values_file();
        let out = run(tool("helm").args(&words[1..]).arg("-f").arg(values.path()), None);
        eprintln!("README install line: {}\n{out}", words.join(" "));
    }
    wait_serving(client, 2, 240).await;
    t0.elapsed()
}

/// The release's pods that are Ready and not terminating, sorted by name.
async fn ready_pods(client: &Client) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut v: Vec<Pod> = pods
        .list(&ListParams::default().labels(SELECTOR))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && is_ready(p))
        .collect();
    v.sort_by_key(|p| p.name_any());
    v
}

fn is_ready(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_ip(p: &Pod) -> String {
    p.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default()
}

fn node_of(p: &Pod) -> String {
    p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default()
}

/// Waits until the Deployment has `n` updated, ready replicas and nothing else.
async fn wait_serving(client: &Client, n: usize, secs: u64) -> Vec<Pod> {
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), NS);
    common::wait_for(&format!("{n} ready replicas of the operator"), secs, async || {
        let d = deploys.get(RELEASE).await.ok()?;
        let st = d.status.as_ref()?;
        let done = d.metadata.generation == st.observed_generation
            && st.updated_replicas == Some(n as i32)
            && st.ready_replicas == Some(n as i32)
            && st.replicas == Some(n as i32);
        let pods = ready_pods(client).await;
        (done && pods.len() == n).then_some(pods)
    })
    .await
}

/// One replica's `/metrics` over the pod network (the host routes the pod CIDRs to the nodes).
async fn pod_metrics(ip: &str) -> Option<String> {
    let c = reqwest::Client::builder().timeout(Duration::from_secs(2)).no_proxy().build().unwrap();
    c.get(format!("http://{ip}:{ADMIN_PORT}/metrics")).send().await.ok()?.text().await.ok()
}

async fn lease(client: &Client) -> Option<Lease> {
    Api::<Lease>::namespaced(client.clone(), NS).get(LEASE).await.ok()
}

fn holder(l: &Lease) -> Option<String> {
    l.spec.as_ref().and_then(|s| s.holder_identity.clone()).filter(|h| !h.is_empty())
}

/// A pod in `ns` that the webhook mutates when a TerminationPolicy covers it (a kwok node
/// takes it: only admission matters).
fn plain_pod(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]}})
}

/// A Service selecting `app=web` in `ns` (policies default to scope ServiceBacked).
async fn web_service(client: &Client, ns: &str) {
    let api: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), ns);
    let svc = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}))
    .unwrap();
    api.create(&PostParams::default(), &svc).await.expect("create Service");
}

/// A TerminationPolicy `default` with every default (scope ServiceBacked) in `ns`.
async fn policy(client: &Client, ns: &str) {
    let api: Api<safe_termination::core::crd::TerminationPolicy> = Api::namespaced(client.clone(), ns);
    let p = serde_json::from_value(json!({"apiVersion": "safetermination.io/v1alpha1", "kind": "TerminationPolicy",
        "metadata": {"name": "default"}, "spec": {}}))
    .unwrap();
    api.create(&PostParams::default(), &p).await.expect("create TerminationPolicy");
}

/// A server-side dry-run create of a pod in `ns`: its preStop sleep, when mutated.
async fn dry_run_sleep(client: &Client, ns: &str) -> Option<i64> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(plain_pod("probe", json!({"app": "web"}))).unwrap();
    let created = pods.create(&PostParams { dry_run: true, ..Default::default() }, &pod).await.ok()?;
    created.spec?.containers[0].lifecycle.as_ref()?.pre_stop.as_ref()?.sleep.as_ref().map(|s| s.seconds)
}

// ---------------------------------------------------------------------------------------------
// install

#[tokio::test]
async fn readme_install_runs_the_image_on_real_nodes() {
    let client = common::client().await;
    let _ = try_run(tool("helm").args(["uninstall", RELEASE, "-n", NS, "--wait"]), None);
    let took = ensure_installed(&client).await;
    let pods = ready_pods(&client).await;
    eprintln!("install: 2 replicas ready {:.1} s after `helm install`", took.as_secs_f64());

    // two replicas, on two different real nodes, running the image make image wrote
    let nodes: std::collections::BTreeSet<String> = pods.iter().map(node_of).collect();
    assert_eq!(nodes.len(), 2, "the replicas share a node: {nodes:?}");
    let real = std::env::var("ST_REAL_NODES").unwrap_or_default();
    for n in &nodes {
        assert!(real.split_whitespace().any(|r| r == n), "replica on {n}, not a real node ({real})");
    }
    let version = env!("CARGO_PKG_VERSION");
    for p in &pods {
        let cs = &p.status.as_ref().unwrap().container_statuses.as_ref().unwrap()[0];
        match pushed_release() {
            // pulled from the registry by the index's digest: the runtime names the image by it
            // the runtime's image id is the reference it pulled: the index's digest in the
            // registry (`image` is then the image's config digest)
            Some((image, _)) => {
                let spec = p.spec.as_ref().unwrap().containers[0].image.clone().unwrap_or_default();
                assert_eq!(
                    (spec.as_str(), cs.image_id.as_str()),
                    (image.as_str(), image.as_str()),
                    "{}: not pulled by the pushed index's digest",
                    p.name_any()
                );
            }
            None => {
                assert_eq!(cs.image, format!("ghcr.io/safe-termination/safe-termination:{version}"), "{}", p.name_any());
                assert!(cs.image_id.starts_with("sha256:") || cs.image_id.contains("@sha256:"), "{}", cs.image_id);
            }
        }
        assert_eq!(cs.restart_count, 0, "{} restarted: liveness or a crash", p.name_any());
        // the binary answered the kubelet's probes (Ready) and answers the test over the pod network
        let m = pod_metrics(&pod_ip(p)).await.unwrap_or_else(|| panic!("no /metrics from {}", pod_ip(p)));
        assert!(m.contains("safe_termination_controller_leader"), "{m}");
    }

    // restricted Pod Security is enforced in the namespace (a privileged pod is refused) and the
    // operator's pods were admitted under it
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut bad: Pod = serde_json::from_value(plain_pod("pss-probe", json!({}))).unwrap();
    bad.spec.as_mut().unwrap().containers[0].security_context = Some(serde_json::from_value(json!({"privileged": true})).unwrap());
    let refused = pods_api.create(&PostParams { dry_run: true, ..Default::default() }, &bad).await;
    let msg = format!("{refused:?}");
    assert!(msg.contains("violates PodSecurity") && msg.contains("restricted:latest"), "a privileged pod was not refused by restricted: {msg}");

    // one leader, holding the Lease under its pod name, and it writes metrics as the leader
    let l = common::wait_for("a lease holder", 60, async || lease(&client).await.as_ref().and_then(holder)).await;
    assert!(pods.iter().any(|p| p.name_any() == l), "holder {l} is not a replica");
    let mut leaders = 0;
    for p in &pods {
        let m = pod_metrics(&pod_ip(p)).await.unwrap_or_default();
        if metric_sum(&m, "safe_termination_controller_leader", &[]) == Some(1.0) {
            leaders += 1;
            assert_eq!(p.name_any(), l);
        }
    }
    assert_eq!(leaders, 1, "exactly one replica reports leading");

    // the PodDisruptionBudget: one voluntary disruption at a time
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NS);
    let allowed = common::wait_for("the PDB's status", 60, async || {
        pdbs.get(RELEASE).await.ok()?.status.filter(|s| s.current_healthy == 2).map(|s| s.disruptions_allowed)
    })
    .await;
    assert_eq!(allowed, 1);

    // the API server calls the webhook through its Service (certificates in operator mode: the
    // operator patched the caBundle): a pod in a namespace with a policy is mutated
    common::fresh_namespace(&client, "st-op-probe").await;
    web_service(&client, "st-op-probe").await;
    policy(&client, "st-op-probe").await;
    let sleep = common::wait_for("a mutated dry-run pod", 120, async || dry_run_sleep(&client, "st-op-probe").await).await;
    assert!(sleep >= 3, "{sleep}");
    eprintln!("webhook through the Service: dry-run pod got preStop sleep {sleep} s");
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone()).delete("st-op-probe", &DeleteParams::default()).await;
}

/// The Quick start's `kubectl` lines, verbatim, in order.
fn readme_kubectl_lines() -> Vec<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let block: Vec<&str> = readme.lines().skip_while(|l| !l.starts_with("helm install ")).take_while(|l| !l.starts_with("```")).collect();
    block.iter().filter(|l| l.starts_with("kubectl ")).map(|l| l.to_string()).collect()
}

/// Runs one README line with bash (it may quote), the cluster's tools first on the PATH.
fn run_readme_line(line: &str) -> String {
    let path = format!("{}:{}", common::tools::bin_dir().display(), std::env::var("PATH").unwrap_or_default());
    let mut c = std::process::Command::new("bash");
    c.args(["-euo", "pipefail", "-c", line]).env("PATH", path).env("KUBECONFIG", common::tools::kubeconfig()).current_dir(root());
    run(&mut c, None)
}

#[tokio::test]
async fn readme_quick_start_lines_run_verbatim() {
    let client = common::client().await;
    ensure_installed(&client).await;
    // what the README assumes the user has: a Deployment `web` behind a Service in `my-app`
    // (the test app, on the real nodes)
    common::fresh_namespace(&client, "my-app").await;
    web_service(&client, "my-app").await;
    let spec = common::on_real_nodes(json!({"containers": [common::testapp_container("web")]}));
    let deploy: Deployment = serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": spec}}}))
    .unwrap();
    Api::<Deployment>::namespaced(client.clone(), "my-app").create(&PostParams::default(), &deploy).await.unwrap();
    run(tool("kubectl").args(["-n", "my-app", "rollout", "status", "deployment/web", "--timeout=120s"]), None);

    let lines = readme_kubectl_lines();
    assert_eq!(lines.len(), 4, "the Quick start changed: {lines:#?}");
    let mut last = String::new();
    for line in &lines {
        if line.contains("get pod") {
            // the restarted pods only: wait until the old ones are gone
            run(tool("kubectl").args(["-n", "my-app", "rollout", "status", "deployment/web", "--timeout=120s"]), None);
            let pods: Api<Pod> = Api::namespaced(client.clone(), "my-app");
            common::wait_for("only the restarted pods of web", 120, async || {
                let items = pods.list(&ListParams::default().labels("app=web")).await.ok()?.items;
                (items.len() == 2 && items.iter().all(|p| p.annotations().contains_key(ANNOTATION_PRESTOP))).then_some(())
            })
            .await;
        }
        if line.contains("get tpol") {
            // the policy's first status (the leader reconciles within seconds)
            common::wait_policy_status(&client, "my-app", "default", 60, "the README policy's status", |s| {
                s["recommendation"]["preStopSeconds"].as_u64().is_some()
            })
            .await;
        }
        last = run_readme_line(line);
        eprintln!("$ {line}\n{last}");
    }
    // `{"sleep":{"seconds":N}} GRACE`, with GRACE = N + 30 (appShutdownSeconds)
    let (hook, grace) = last.trim().rsplit_once(' ').expect("two fields");
    let hook: Value = serde_json::from_str(hook).unwrap_or_else(|e| panic!("{hook}: {e}"));
    let sleep = hook["sleep"]["seconds"].as_i64().unwrap_or_else(|| panic!("no native sleep: {hook}"));
    assert!(sleep >= 3, "{sleep}");
    assert_eq!(grace.parse::<i64>().unwrap(), sleep + 30);
}

// ---------------------------------------------------------------------------------------------
// who writes status, sampled

/// One replica's counters at one instant.
#[derive(Clone, Debug)]
struct WriterSample {
    at: Instant,
    pod: String,
    status_writes: f64,
    leader: bool,
}

/// Samples every replica's `status_writes_total` and leader gauge every 200 ms (terminating
/// replicas included, while they answer) until dropped.
struct WriterSampler {
    samples: Arc<Mutex<Vec<WriterSample>>>,
    task: tokio::task::JoinHandle<()>,
}

impl WriterSampler {
    fn start(client: &Client) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (out, client) = (samples.clone(), client.clone());
        let task = tokio::spawn(async move {
            let pods: Api<Pod> = Api::namespaced(client, NS);
            loop {
                let list = pods.list(&ListParams::default().labels(SELECTOR)).await.map(|l| l.items).unwrap_or_default();
                let reads = list.iter().filter(|p| !pod_ip(p).is_empty()).map(|p| async move {
                    let m = pod_metrics(&pod_ip(p)).await?;
                    Some(WriterSample {
                        at: Instant::now(),
                        pod: p.name_any(),
                        status_writes: metric_sum(&m, "safe_termination_controller_status_writes_total", &[])?,
                        leader: metric_sum(&m, "safe_termination_controller_leader", &[]) == Some(1.0),
                    })
                });
                let got: Vec<WriterSample> = futures::future::join_all(reads).await.into_iter().flatten().collect();
                out.lock().unwrap().extend(got);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Self { samples, task }
    }

    /// Per replica, the first and last instant its status-write counter was seen to grow
    /// (the end of the 200 ms interval in which it grew) and how much; and the number of
    /// intervals in which a replica's counter grew while it reported not leading at both ends.
    fn write_periods(&self) -> (BTreeMap<String, (Instant, Instant, u64)>, usize) {
        let samples = self.samples.lock().unwrap().clone();
        let mut last: BTreeMap<String, (f64, bool)> = BTreeMap::new();
        let mut periods: BTreeMap<String, (Instant, Instant, u64)> = BTreeMap::new();
        let mut by_non_leader = 0;
        for s in samples {
            if let Some((prev, was_leader)) = last.insert(s.pod.clone(), (s.status_writes, s.leader))
                && s.status_writes > prev
            {
                let e = periods.entry(s.pod.clone()).or_insert((s.at, s.at, 0));
                e.1 = s.at;
                e.2 += (s.status_writes - prev) as u64;
                if !was_leader && !s.leader {
                    by_non_leader += 1;
                }
            }
        }
        (periods, by_non_leader)
    }

    /// The first instant after `t` at which `pod`'s counter grew.
    fn first_write_after(&self, pod: &str, t: Instant) -> Option<Instant> {
        let samples = self.samples.lock().unwrap().clone();
        let mut prev: Option<f64> = None;
        for s in samples.iter().filter(|s| s.pod == pod) {
            if let Some(p) = prev
                && s.status_writes > p
                && s.at > t
            {
                return Some(s.at);
            }
            prev = Some(s.status_writes);
        }
        None
    }
}

impl Drop for WriterSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Asserts that no two replicas' write periods overlap and that no replica wrote while not
/// leading, and prints the periods relative to `t0`.
fn assert_no_overlapping_writers(sampler: &WriterSampler, t0: Instant) {
    let (periods, by_non_leader) = sampler.write_periods();
    let rel = |t: Instant| t.checked_duration_since(t0).map_or_else(|| -(t0.duration_since(t).as_secs_f64()), |d| d.as_secs_f64());
    for (pod, (a, b, n)) in &periods {
        eprintln!("  status writer {pod}: {n} writes from {:+.1} s to {:+.1} s", rel(*a), rel(*b));
    }
    let v: Vec<_> = periods.iter().collect();
    for (i, (pa, (a0, a1, _))) in v.iter().enumerate() {
        for (pb, (b0, b1, _)) in v.iter().skip(i + 1) {
            assert!(
                a1 < b0 || b1 < a0,
                "{pa} and {pb} wrote status in overlapping periods ({:+.1}..{:+.1} s vs {:+.1}..{:+.1} s)",
                rel(*a0),
                rel(*a1),
                rel(*b0),
                rel(*b1)
            );
        }
    }
    assert_eq!(by_non_leader, 0, "a replica wrote status while reporting that it did not lead");
}

/// Waits for a new leader and returns it and when it was seen: a holder other than `old`, or,
/// with `same_identity`, also `old` itself renewing the lease after `since` (a container
/// restarted in the same pod keeps the pod's name as its identity; the killed process renews
/// nothing).
async fn wait_new_leader(client: &Client, old: &str, since: k8s_openapi::jiff::Timestamp, same_identity: bool, secs: u64) -> (String, Instant) {
    common::wait_for(&format!("a leader after {old}"), secs, async || {
        let l = lease(client).await?;
        let h = holder(&l)?;
        let renewed = l.spec.as_ref()?.renew_time.as_ref().is_some_and(|t| t.0 > since);
        (h != old || (same_identity && renewed)).then(|| (h, Instant::now()))
    })
    .await
}

/// The namespace with a policy whose status the leader keeps writing during the faults.
const FAULT_NS: &str = "st-op-faults";

async fn ensure_fault_namespace(client: &Client) {
    let api: Api<safe_termination::core::crd::TerminationPolicy> = Api::namespaced(client.clone(), FAULT_NS);
    if api.get_opt("default").await.ok().flatten().is_none() {
        common::fresh_namespace(client, FAULT_NS).await;
        web_service(client, FAULT_NS).await;
        policy(client, FAULT_NS).await;
    }
}

fn lease_duration_seconds(l: &Lease) -> f64 {
    f64::from(l.spec.as_ref().and_then(|s| s.lease_duration_seconds).unwrap_or(0))
}

// ---------------------------------------------------------------------------------------------
// the leader lost

/// Removes the leader with `remove` and measures the hand-over.
async fn leader_handover(what: &str, same_identity: bool, remove: impl AsyncFnOnce(&Client, &Pod)) {
    let client = common::client().await;
    ensure_installed(&client).await;
    ensure_fault_namespace(&client).await;
    let l = common::wait_for("a lease holder", 60, async || lease(&client).await).await;
    let duration = lease_duration_seconds(&l);
    let old = holder(&l).expect("a holder");
    let pods = ready_pods(&client).await;
    let leader_pod = pods.iter().find(|p| p.name_any() == old).expect("the holder is a ready replica").clone();
    let sampler = WriterSampler::start(&client);
    // the leader writes before the fault (status refresh every 5 s)
    tokio::time::sleep(Duration::from_secs(8)).await;
    let t0 = Instant::now();
    remove(&client, &leader_pod).await;
    let since = k8s_openapi::jiff::Timestamp::now() + std::time::Duration::from_millis(500);
    let (new, seen) = wait_new_leader(&client, &old, since, same_identity, (duration as u64) * 3 + 30).await;
    let handover = seen.duration_since(t0).as_secs_f64();
    // status writes resume under the new leader
    let resumed =
        common::wait_for("status writes by the new leader", 60, async || sampler.first_write_after(&new, seen).map(|t| t.duration_since(t0).as_secs_f64()))
            .await;
    wait_serving(&client, 2, 180).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    eprintln!("{what}: leader {old} -> {new}: new leader after {handover:.1} s (lease duration {duration} s), status writes resumed after {resumed:.1} s");
    assert_no_overlapping_writers(&sampler, t0);
    // a follower checks the lease when it would expire (kube-lease-manager), then waits 0-1 s
    // against collisions: a lease renewed just before the fault is taken a lease duration later
    assert!(handover <= duration + 2.0, "{what}: new leader after {handover:.1} s, beyond the lease duration {duration} s (+2 s)");
}

#[tokio::test]
async fn leader_pod_deleted_hands_over_within_the_lease_duration() {
    leader_handover("leader pod deleted", false, async |client, pod| {
        Api::<Pod>::namespaced(client.clone(), NS).delete(&pod.name_any(), &DeleteParams::default()).await.expect("delete the leader");
    })
    .await;
}

#[tokio::test]
async fn leader_container_killed_by_the_runtime_hands_over_within_the_lease_duration() {
    leader_handover("leader container SIGKILLed through containerd", true, async |_client, pod| {
        let cs = &pod.status.as_ref().unwrap().container_statuses.as_ref().unwrap()[0];
        let id = cs.container_id.as_deref().unwrap().trim_start_matches("containerd://").to_string();
        let node = node_of(pod);
        let sock = format!("{}/nodes/{node}/containerd/containerd.sock", common::state_dir());
        let ctr = common::tools::bin_dir().join("ctr");
        run(std::process::Command::new(ctr).args(["--address", &sock, "-n", "k8s.io", "tasks", "kill", "--signal", "SIGKILL", &id]), None);
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// pod-create storms

const STORM_NAMESPACES: usize = 5;
const ANNOTATION_PRESTOP: &str = "safetermination.io/prestop-seconds";

/// The API server's admission-webhook counters for this webhook: (fail-open calls, calls by
/// HTTP code), from its /metrics.
fn apiserver_webhook_counters() -> (f64, BTreeMap<String, f64>) {
    let text = run(tool("kubectl").args(["get", "--raw", "/metrics"]), None);
    let hook = "name=\"prestop.safetermination.io\"";
    let fail_open = metric_sum(&text, "apiserver_admission_webhook_fail_open_count", &[hook]).unwrap_or(0.0);
    let mut codes = BTreeMap::new();
    for l in text.lines().filter(|l| l.starts_with("apiserver_admission_webhook_request_total{") && l.contains(hook)) {
        let code = l.split("code=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or("?").to_string();
        *codes.entry(code).or_insert(0.0) += l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    }
    (fail_open, codes)
}

/// Fresh storm namespaces, each with a Service selecting `app=web` and a policy, and waits
/// until the webhook mutates there.
async fn storm_namespaces(client: &Client, tag: &str) -> Vec<String> {
    let names: Vec<String> = (0..STORM_NAMESPACES).map(|i| format!("st-storm-{tag}-{i}")).collect();
    for ns in &names {
        common::fresh_namespace(client, ns).await;
        web_service(client, ns).await;
        policy(client, ns).await;
    }
    for ns in &names {
        common::wait_for(&format!("the webhook mutating in {ns}"), 120, async || dry_run_sleep(client, ns).await).await;
    }
    names
}

/// The outcome of a storm.
struct Storm {
    created: usize,
    failed: Vec<String>,
    unmutated: Vec<String>,
    fail_open_calls: f64,
    codes_before: BTreeMap<String, f64>,
    codes_after: BTreeMap<String, f64>,
}

/// Creates `total` pods over `seconds` (evenly paced, round-robin over `namespaces`) while
/// `fault` runs beside it; then lists what was admitted.
async fn storm(client: &Client, namespaces: &[String], total: usize, seconds: f64, fault: impl Future<Output = ()>) -> Storm {
    let (fail_open_before, codes_before) = apiserver_webhook_counters();
    let creators = async {
        let t0 = Instant::now();
        let jobs = (0..total).map(|i| {
            let ns = namespaces[i % namespaces.len()].clone();
            let client = client.clone();
            async move {
                let at = Duration::from_secs_f64(seconds * i as f64 / total as f64);
                tokio::time::sleep_until(tokio::time::Instant::from_std(t0 + at)).await;
                let pod: Pod = serde_json::from_value(plain_pod(&format!("p{i:04}"), json!({"app": "web"}))).unwrap();
                Api::<Pod>::namespaced(client, &ns).create(&PostParams::default(), &pod).await.map(|_| ()).map_err(|e| format!("{ns}/p{i:04}: {e}"))
            }
        });
        futures::future::join_all(jobs).await
    };
    let (results, ()) = tokio::join!(creators, fault);
    let failed: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    // (the fail-open counter is read after the API server has answered every create)
    let (fail_open_after, codes_after) = apiserver_webhook_counters();
    let mut unmutated = Vec::new();
    let mut created = 0;
    for ns in namespaces {
        for p in Api::<Pod>::namespaced(client.clone(), ns).list(&ListParams::default()).await.unwrap().items {
            created += 1;
            if !p.annotations().contains_key(ANNOTATION_PRESTOP) {
                unmutated.push(format!("{ns}/{}", p.name_any()));
            }
        }
    }
    Storm { created, failed, unmutated, fail_open_calls: fail_open_after - fail_open_before, codes_before, codes_after }
}

impl Storm {
    fn codes_delta(&self) -> BTreeMap<String, f64> {
        self.codes_after.iter().map(|(k, v)| (k.clone(), v - self.codes_before.get(k).unwrap_or(&0.0))).filter(|(_, v)| *v > 0.0).collect()
    }

    /// Every one of `total` pods created and mutated, and no webhook call failed open, during
    /// `what`.
    fn assert_every_pod_mutated(&self, what: &str, total: usize) {
        assert!(self.failed.is_empty(), "pod creations failed during {what}: {:?}", &self.failed[..self.failed.len().min(10)]);
        assert_eq!(self.created, total);
        assert!(
            self.unmutated.is_empty(),
            "{} pods admitted unmutated during {what}: {:?}",
            self.unmutated.len(),
            &self.unmutated[..self.unmutated.len().min(10)]
        );
        assert_eq!(self.fail_open_calls, 0.0, "the API server failed open during {what}");
    }

    fn print(&self, what: &str) {
        eprintln!(
            "{what}: {} pods created, {} failed, {} admitted unmutated (fail open); API server: {} fail-open webhook calls, webhook calls by code {:?}",
            self.created,
            self.failed.len(),
            self.unmutated.len(),
            self.fail_open_calls,
            self.codes_delta()
        );
    }
}

/// The leader's `safe_termination_controller_pods{state="unprotected"}` summed over `namespaces`.
async fn leader_unprotected(client: &Client, namespaces: &[String]) -> Option<f64> {
    for p in ready_pods(client).await {
        let m = pod_metrics(&pod_ip(&p)).await?;
        if metric_sum(&m, "safe_termination_controller_leader", &[]) == Some(1.0) {
            let mut sum = 0.0;
            for ns in namespaces {
                sum += metric_sum(&m, "safe_termination_controller_pods", &[&format!("namespace=\"{ns}\""), "state=\"unprotected\""])?;
            }
            return Some(sum);
        }
    }
    None
}

async fn delete_namespaces(client: &Client, namespaces: &[String]) {
    for ns in namespaces {
        let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone()).delete(ns, &DeleteParams::default()).await;
    }
}

/// Deletes every replica of the operator at once (not through the PDB: a crash of both, or a
/// careless `kubectl delete pod`).
async fn delete_operator_pods(client: &Client) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.delete_collection(&DeleteParams::default(), &ListParams::default().labels(SELECTOR)).await.expect("delete the operator's pods");
}

/// The storms' fault: every operator pod deleted at +10 s and again at +35 s.
async fn delete_operator_pods_twice(client: &Client) {
    for at in [10u64, 35] {
        tokio::time::sleep(Duration::from_secs(if at == 10 { 10 } else { 25 })).await;
        delete_operator_pods(client).await;
        eprintln!("  deleted both operator pods at +{at} s");
    }
}

#[tokio::test]
async fn pod_storm_while_the_webhook_pods_are_deleted_fails_open_and_is_counted() {
    let client = common::client().await;
    ensure_installed(&client).await;
    let namespaces = storm_namespaces(&client, "del").await;
    let s = storm(&client, &namespaces, 500, 60.0, delete_operator_pods_twice(&client)).await;
    s.print("storm while the webhook pods are deleted");
    assert!(s.failed.is_empty(), "pod creations failed: {:?}", &s.failed[..s.failed.len().min(10)]);
    assert_eq!(s.created, 500);
    // the operator's count of pods admitted unmutated, once kwok runs them and the leader
    // reconciled, equals the test's
    wait_serving(&client, 2, 180).await;
    let want = s.unmutated.len() as f64;
    let got =
        common::wait_for("the operator's unprotected count to match", 120, async || leader_unprotected(&client, &namespaces).await.filter(|g| *g == want))
            .await;
    eprintln!("  the operator counts {got} unprotected pods; the test counted {want} unmutated");
    assert!(want > 0.0, "no pod was admitted unmutated although both webhook pods were deleted twice: the fault did not bite");
    delete_namespaces(&client, &namespaces).await;
}

#[tokio::test]
async fn pod_storm_during_helm_upgrade_admits_every_pod_mutated() {
    let client = common::client().await;
    ensure_installed(&client).await;
    wait_serving(&client, 2, 180).await;
    let namespaces = storm_namespaces(&client, "upg").await;
    let values = values_file();
    let fault = async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let t = Instant::now();
        // a new pod template (an annotation) rolls both replicas: maxSurge 1, maxUnavailable 0,
        // each old replica sleeps out its preStop while its endpoint leaves the Service
        let chart = root().join("charts/safe-termination");
        let stamp = format!("podAnnotations.e2e/upgraded={}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs());
        let out = tokio::task::spawn_blocking(move || {
            run(
                tool("helm").args(["upgrade", RELEASE]).arg(chart).args(["-n", NS, "-f"]).arg(values.path()).args([
                    "--set-string",
                    &stamp,
                    "--wait",
                    "--timeout",
                    "180s",
                ]),
                None,
            )
        })
        .await
        .unwrap();
        eprintln!("  helm upgrade done in {:.1} s: {}", t.elapsed().as_secs_f64(), out.lines().next().unwrap_or(""));
    };
    let s = storm(&client, &namespaces, 500, 60.0, fault).await;
    s.print("storm during helm upgrade");
    s.assert_every_pod_mutated("the upgrade", 500);
    assert!(s.codes_delta().keys().all(|c| c == "200"), "webhook calls other than 200: {:?}", s.codes_delta());
    // the rollout kept the replicas on two nodes
    let nodes: std::collections::BTreeSet<String> = wait_serving(&client, 2, 180).await.iter().map(node_of).collect();
    assert_eq!(nodes.len(), 2, "after the upgrade the replicas share a node: {nodes:?}");
    delete_namespaces(&client, &namespaces).await;
}

async fn tls_secret(client: &Client) -> BTreeMap<String, Vec<u8>> {
    let s = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), NS).get(&format!("{RELEASE}-tls")).await.expect("the TLS Secret");
    s.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect()
}

/// Whether the replica at `ip` serves a certificate for the webhook Service that verifies
/// against `ca_pem` alone.
async fn serves_leaf_of(ip: &str, ca_pem: &[u8]) -> bool {
    let Ok(ca) = reqwest::Certificate::from_pem(ca_pem) else { return false };
    let host = format!("{RELEASE}.{NS}.svc");
    let Ok(c) = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .resolve(&host, format!("{ip}:8443").parse().unwrap())
        .timeout(Duration::from_secs(3))
        .no_proxy()
        .build()
    else {
        return false;
    };
    // any HTTP answer means the TLS handshake verified
    c.get(format!("https://{host}:8443/healthz")).send().await.is_ok()
}

#[tokio::test]
async fn pod_storm_during_a_ca_rotation_admits_every_pod_mutated() {
    let client = common::client().await;
    ensure_installed(&client).await;
    wait_serving(&client, 2, 180).await;
    let namespaces = storm_namespaces(&client, "rot").await;
    let before = tls_secret(&client).await;
    let old_ca = first_der(&before["ca.crt"]);
    // the storm lasts 100 s: the rotation at +5 s, and the kubelet refreshes the replicas'
    // Secret volume at its next pod sync (within about a minute; 15-25 s seen), when they
    // switch leaves
    let switched = Arc::new(Mutex::new(None::<f64>));
    let fault = async {
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let token = format!("{}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs());
        run(
            tool("kubectl").args(["-n", NS, "annotate", "secret", &format!("{RELEASE}-tls"), &format!("safetermination.io/rotate-ca={token}"), "--overwrite"]),
            None,
        );
        eprintln!("  CA rotation requested at +5 s");
        let new_ca = common::wait_for("the rotated CA in the Secret", 60, async || {
            let ca = tls_secret(&client).await.get("ca.crt").cloned()?;
            (first_der(&ca) != old_ca).then(|| first_der(&ca))
        })
        .await;
        eprintln!("  new CA in the Secret at +{:.1} s", t0.elapsed().as_secs_f64());
        let new_ca_pem = safe_termination::certs::pem_encode(&new_ca);
        common::wait_for("both replicas serving a leaf of the new CA", 90, async || {
            let pods = ready_pods(&client).await;
            let mut all = pods.len() == 2;
            for p in &pods {
                all &= serves_leaf_of(&pod_ip(p), new_ca_pem.as_bytes()).await;
            }
            all.then_some(())
        })
        .await;
        *switched.lock().unwrap() = Some(t0.elapsed().as_secs_f64());
        eprintln!("  both replicas serve a leaf of the new CA at +{:.1} s", t0.elapsed().as_secs_f64());
    };
    let s = storm(&client, &namespaces, 830, 100.0, fault).await;
    s.print("storm during a CA rotation");
    let after = tls_secret(&client).await;
    let new_ca = first_der(&after["ca.crt"]);
    assert_ne!(old_ca, new_ca, "the CA was not rotated");
    // the caBundle trusts both CAs, the new one first
    let hooks: Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> = Api::all(client.clone());
    let bundle = hooks.get(RELEASE).await.unwrap().webhooks.unwrap()[0].client_config.ca_bundle.clone().unwrap().0;
    assert_eq!(first_der(&bundle), new_ca, "the caBundle does not lead with the new CA");
    assert!(String::from_utf8_lossy(&bundle).matches("BEGIN CERTIFICATE").count() >= 2, "the old CA left the bundle during the rotation");
    let switched = switched.lock().unwrap().expect("the replicas switched");
    assert!(switched < 100.0, "the replicas switched to the new leaf at +{switched:.1} s, after the storm ended: the switch was not under load");
    s.assert_every_pod_mutated("the rotation", 830);
    delete_namespaces(&client, &namespaces).await;
}

// ---------------------------------------------------------------------------------------------
// the control plane and a kube-proxy restarted

/// `e2e/cluster/restart.sh NAME`: its `key=value` output.
fn restart(name: &str) -> String {
    run(std::process::Command::new(root().join("e2e/cluster/restart.sh")).arg(name), None)
}

/// (pod, container restarts, container start time) of every ready replica.
async fn containers(client: &Client) -> Vec<(String, i32, String)> {
    ready_pods(client)
        .await
        .iter()
        .map(|p| {
            let cs = &p.status.as_ref().unwrap().container_statuses.as_ref().unwrap()[0];
            let started = cs.state.as_ref().and_then(|s| s.running.as_ref()).and_then(|r| r.started_at.as_ref()).map(|t| t.0.to_string());
            (p.name_any(), cs.restart_count, started.unwrap_or_default())
        })
        .collect()
}

#[tokio::test]
async fn kube_apiserver_restarted_the_operator_rewatches_without_restarting() {
    let client = common::client().await;
    ensure_installed(&client).await;
    ensure_fault_namespace(&client).await;
    wait_serving(&client, 2, 180).await;
    let before = containers(&client).await;
    let sampler = WriterSampler::start(&client);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let t0 = Instant::now();
    let out = restart("kube-apiserver");
    let client = common::client().await;
    common::wait_for("kube-apiserver /readyz after the restart", 120, async || {
        client.request_text(http::Request::get("/readyz").body(vec![]).unwrap()).await.ok()
    })
    .await;
    let api_back = t0.elapsed().as_secs_f64();
    // watches re-established: a policy created after the restart gets a status from the leader
    let ns = "st-op-after-restart";
    common::fresh_namespace(&client, ns).await;
    web_service(&client, ns).await;
    policy(&client, ns).await;
    common::wait_policy_status(&client, ns, "default", 90, "status of a policy created after the API server restart", |s| {
        s["recommendation"]["preStopSeconds"].as_u64().is_some()
    })
    .await;
    let status_back = t0.elapsed().as_secs_f64();
    let sleep = common::wait_for("the webhook mutating after the restart", 60, async || dry_run_sleep(&client, ns).await).await;
    let webhook_back = t0.elapsed().as_secs_f64();
    let leader = common::wait_for("a lease holder", 60, async || lease(&client).await.as_ref().and_then(holder)).await;
    let resumed =
        common::wait_for("status writes after the restart", 60, async || sampler.first_write_after(&leader, t0 + Duration::from_secs_f64(api_back))).await;
    let after = containers(&client).await;
    eprintln!(
        "kube-apiserver restarted ({}): serving again after {api_back:.1} s; the leader's status writes resumed at +{:.1} s, a new policy got its status at +{status_back:.1} s, the webhook mutated (sleep {sleep} s) at +{webhook_back:.1} s; operator containers before {before:?}, after {after:?}",
        out.trim(),
        resumed.duration_since(t0).as_secs_f64()
    );
    assert_eq!(before, after, "an operator container restarted (or a replica was replaced) across the API server restart");
    assert_no_overlapping_writers(&sampler, t0);
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone()).delete(ns, &DeleteParams::default()).await;
}

#[tokio::test]
async fn kube_proxy_restarted_mid_measurement_the_recommendation_holds() {
    let client = common::client().await;
    ensure_installed(&client).await;
    ensure_fault_namespace(&client).await;
    let node = std::env::var("ST_KP_NODES").unwrap().split_whitespace().next().unwrap().to_string();
    // a measured (not default) recommendation first: every node trusted
    let status = common::wait_policy_status(&client, FAULT_NS, "default", 180, "a measured recommendation", |s| {
        s["recommendation"]["reason"] == "Measured" && s["measurement"]["nodesFailed"] == 0
    })
    .await;
    let before = status["recommendation"]["preStopSeconds"].as_u64().expect("recommendation.preStopSeconds");
    let t0 = Instant::now();
    let out = restart(&format!("kube-proxy-{node}"));
    // every 2 s for 40 s (20 scrapes of the operator's 2 s interval): the recommendation, and
    // the node's scrape state
    let mut seen = Vec::new();
    let mut failed_scrapes = 0;
    while t0.elapsed() < Duration::from_secs(40) {
        let s = common::policy_status(&client, FAULT_NS, "default").await;
        if let Some(v) = s["recommendation"]["preStopSeconds"].as_u64() {
            seen.push(v);
        }
        if s["measurement"]["nodesFailed"].as_u64().is_some_and(|n| n > 0) {
            failed_scrapes += 1;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let (lo, hi) = (seen.iter().min().copied().unwrap_or(0), seen.iter().max().copied().unwrap_or(0));
    eprintln!(
        "kube-proxy on {node} restarted ({}): recommendation before {before} s, over the next 40 s {lo}-{hi} s ({} readings; {failed_scrapes} showed the node failing)",
        out.trim(),
        seen.len()
    );
    assert!(!seen.is_empty());
    assert!(hi <= before + 1 && lo + 1 >= before, "the recommendation jumped across the kube-proxy restart: {before} s before, {lo}-{hi} s after: {seen:?}");
}

// ---------------------------------------------------------------------------------------------
// the policy backend (the chart's default `auto` on Kubernetes 1.36+)

async fn admission_policy_exists(client: &Client) -> bool {
    let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &safe_termination::controller::admission::policy_resource());
    api.get_opt(RELEASE).await.ok().flatten().is_some()
}

#[tokio::test]
async fn policy_backend_mutates_every_pod_while_every_operator_pod_is_deleted() {
    let client = common::client().await;
    ensure_installed(&client).await;
    let values = values_file();
    // the chart's default: auto, which on 1.37 is the policy (and no webhook configuration)
    let t = Instant::now();
    run(
        tool("helm").args(["upgrade", RELEASE]).arg(root().join("charts/safe-termination")).args(["-n", NS, "-f"]).arg(values.path()).args([
            "--set",
            "admission.backend=auto",
            "--wait",
            "--timeout",
            "180s",
        ]),
        None,
    );
    wait_serving(&client, 2, 180).await;
    common::wait_for("the leader to write the MutatingAdmissionPolicy", 60, async || admission_policy_exists(&client).await.then_some(())).await;
    let hooks: Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> = Api::all(client.clone());
    assert!(hooks.get_opt(RELEASE).await.unwrap().is_none(), "auto on 1.37 renders no webhook configuration");
    let namespaces = storm_namespaces(&client, "pol").await;
    eprintln!("policy backend: upgraded and mutating through the MutatingAdmissionPolicy {:.1} s after `helm upgrade`", t.elapsed().as_secs_f64());
    let s = storm(&client, &namespaces, 500, 60.0, delete_operator_pods_twice(&client)).await;
    s.print("storm while every operator pod is deleted, policy backend");
    // the API server mutates by itself: no pod unmutated although no replica was up for a while
    s.assert_every_pod_mutated("the storm with the policy backend", 500);
    delete_namespaces(&client, &namespaces).await;
}

// ---------------------------------------------------------------------------------------------
// kube-proxy bound to 127.0.0.1 (kubeadm's default), measured through the node agents

/// The namespace of the agents: hostNetwork needs the `privileged` Pod Security level, which
/// the release's `restricted` namespace refuses (README "Node agent").
const AGENT_NS: &str = "st-agents";

/// Rewrites `metricsBindAddress` in each real node's kube-proxy configuration (cluster-up's
/// `$ST_E2E_DIR/kube-proxy-NODE.yaml`) to `127.0.0.1:10249` (`loopback`) or back to the node
/// IP, and starts that kube-proxy again (it exits by itself when its configuration file
/// changes; e2e/cluster/restart.sh --config-changed). Dropped, it puts the node IP back: the tests after
/// this one scrape kube-proxy directly.
struct LoopbackKubeProxies(Vec<RealNode>);

impl LoopbackKubeProxies {
    fn bind(nodes: &[RealNode], loopback: bool) {
        let dir = common::state_dir();
        for RealNode { name: node, ip, .. } in nodes {
            let path = format!("{dir}/kube-proxy-{node}.yaml");
            let cfg = std::fs::read_to_string(&path).unwrap();
            let (from, to) = if loopback {
                (format!("metricsBindAddress: {ip}:10249"), "metricsBindAddress: 127.0.0.1:10249".to_string())
            } else {
                ("metricsBindAddress: 127.0.0.1:10249".to_string(), format!("metricsBindAddress: {ip}:10249"))
            };
            if cfg.contains(&from) {
                std::fs::write(&path, cfg.replace(&from, &to)).unwrap();
                // kube-proxy exits by itself on a changed configuration file
                run(std::process::Command::new(root().join("e2e/cluster/restart.sh")).args([&format!("kube-proxy-{node}"), "--config-changed"]), None);
            }
        }
    }

    fn to_loopback(nodes: &[RealNode]) -> Self {
        Self::bind(nodes, true);
        Self(nodes.to_vec())
    }
}

impl Drop for LoopbackKubeProxies {
    /// Puts the node IPs back and waits until each kube-proxy serves its metrics there with a
    /// sync recorded (cluster-up's own readiness check), so that a test after this one meets
    /// kube-proxy as cluster-up left it, not one still starting.
    fn drop(&mut self) {
        Self::bind(&self.0, false);
        for RealNode { name, netns, ip, .. } in &self.0 {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let synced = curl_in_netns(netns, &format!("http://{ip}:10249/metrics"))
                    .is_ok_and(|m| m.lines().any(|l| l.starts_with("kubeproxy_sync_proxy_rules_last_timestamp_seconds") && !l.ends_with(" 0")));
                if synced {
                    break;
                }
                if Instant::now() > deadline {
                    eprintln!("kube-proxy on {name} not serving a synced /metrics on {ip}:10249 60 s after the restore");
                    break;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        }
    }
}

/// PIDs of the `safe-termination agent` processes reading kube-proxy on loopback (the chart's
/// agent pods; seen from the host's PID namespace).
fn agent_processes() -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let args: Vec<String> = cmd.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        if args.get(1).is_some_and(|a| a == "agent") && args.iter().any(|a| a == "--kube-proxy-url=http://127.0.0.1:10249") {
            v.push(pid);
        }
    }
    v
}

fn proc_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0)
}

/// utime + stime of `pid`, in clock ticks.
fn proc_cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // fields after the parenthesised command name; utime and stime are the 14th and 15th
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<u64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
    f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)
}

fn procfs_ticks_per_second() -> f64 {
    run(std::process::Command::new("getconf").arg("CLK_TCK"), None).trim().parse().unwrap_or(100.0)
}

/// What `url` answers from inside network namespace `netns` (curl), or the error.
fn curl_in_netns(netns: &str, url: &str) -> Result<String, String> {
    try_run(std::process::Command::new("ip").args(["netns", "exec", netns, "curl", "-fsS", "--max-time", "3", url]), None)
}

#[tokio::test]
async fn agents_measure_kube_proxy_bound_to_loopback() {
    let client = common::client().await;
    ensure_installed(&client).await;
    ensure_fault_namespace(&client).await;
    // the real nodes with a kube-proxy (a Cilium node has none to bind)
    let real: Vec<RealNode> = common::rules::real_nodes().into_iter().filter(|n| !n.is_cilium()).collect();
    assert_eq!(real.len(), 2, "two real nodes with a kube-proxy");
    let nodes: Vec<String> = real.iter().map(|n| n.name.clone()).collect();
    // kubeadm's default: kube-proxy's metrics on the node's loopback only
    let _restore = LoopbackKubeProxies::to_loopback(&real);
    for RealNode { name: node, netns, ip, .. } in &real {
        let direct =
            reqwest::Client::builder().timeout(Duration::from_secs(3)).no_proxy().build().unwrap().get(format!("http://{ip}:10249/metrics")).send().await;
        // bound to 127.0.0.1 only: the node's address refuses the connection (a timeout or any
        // other error would not show the rebind)
        assert!(direct.as_ref().is_err_and(|e| e.is_connect()), "kube-proxy on {node} at {ip}:10249 after the rebind: {direct:?}");
        let mode = common::wait_for(&format!("kube-proxy on {node} serving on 127.0.0.1 in its netns"), 30, async || {
            curl_in_netns(netns, "http://127.0.0.1:10249/proxyMode").ok()
        })
        .await;
        eprintln!("kube-proxy on {node}: {ip}:10249 refused, 127.0.0.1:10249 in {netns} answers /proxyMode {}", mode.trim());
    }
    // the direct scrape fails on both nodes
    common::wait_policy_status(&client, FAULT_NS, "default", 60, "both nodes failing without agents", |s| s["measurement"]["nodesFailed"] == 2).await;

    // the agents, in a privileged namespace, on the real nodes with a kube-proxy only (a kwok
    // node's fake pod would run nothing; a Cilium node has no kube-proxy to measure)
    common::fresh_namespace_with_labels(&client, AGENT_NS, &[("pod-security.kubernetes.io/enforce", "privileged")]).await;
    let agent_values = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    let agent = |selector: Value| json!({"agent": {"enabled": true, "namespace": AGENT_NS, "nodeSelector": selector}}).to_string();
    std::fs::write(agent_values.path(), agent(json!({"safe-termination.e2e/node-type": "real", "safe-termination.e2e/has-kube-proxy": "true"}))).unwrap();
    let values = values_file();
    let upgrade = |extra: &std::path::Path| {
        run(
            tool("helm")
                .args(["upgrade", RELEASE])
                .arg(root().join("charts/safe-termination"))
                .args(["-n", NS, "-f"])
                .arg(values.path())
                .arg("-f")
                .arg(extra)
                .args(["--wait", "--timeout", "180s"]),
            None,
        )
    };
    let t0 = Instant::now();
    upgrade(agent_values.path());
    wait_serving(&client, 2, 180).await;
    let status = common::wait_policy_status(&client, FAULT_NS, "default", 240, "both nodes measured through their agents", |s| {
        s["measurement"]["nodesScraped"] == 2 && s["measurement"]["nodesFailed"] == 0 && s["measurement"]["sources"]["agent"] == 2
    })
    .await;
    let through_agents = t0.elapsed().as_secs_f64();
    let before = status["recommendation"]["preStopSeconds"].as_u64().expect("a recommendation");
    let agent_pods: Vec<Pod> = Api::<Pod>::namespaced(client.clone(), AGENT_NS).list(&ListParams::default()).await.unwrap().items;
    eprintln!(
        "agents: both nodes measured through them {through_agents:.1} s after `helm upgrade` (sources {}, worst node {} via {}, sync p99 {} s, preStop {before} s); agent pods {:?}",
        status["measurement"]["sources"],
        status["measurement"]["worstNode"],
        status["measurement"]["worstNodeSource"],
        status["measurement"]["syncP99Seconds"],
        agent_pods.iter().map(|p| (p.name_any(), node_of(p), pod_ip(p))).collect::<Vec<_>>()
    );
    assert_eq!(agent_pods.len(), 2, "one agent per real node");
    // the agents' footprint as pods, scraped every 2 s by the leader: resident size and CPU
    // over 20 s, from /proc (their processes are in the host's PID namespace)
    let agents = agent_processes();
    assert_eq!(agents.len(), 2, "two agent processes: {agents:?}");
    let cpu0: Vec<u64> = agents.iter().map(|p| proc_cpu_ticks(*p)).collect();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let ticks = procfs_ticks_per_second();
    for (p, c0) in agents.iter().zip(cpu0) {
        let rss = proc_rss_kib(*p);
        let millicores = (proc_cpu_ticks(*p) - c0) as f64 / ticks / 20.0 * 1000.0;
        eprintln!("agent pid {p}: VmRSS {:.1} MiB, {millicores:.1} millicores over 20 s (scraped every 2 s)", rss as f64 / 1024.0);
        assert!(rss < 64 * 1024, "agent pid {p} at {rss} KiB: the chart's 64Mi limit would kill it");
    }

    // an agent answers only the operator's client certificate
    let ip = &real[0].ip;
    let anonymous = reqwest::Client::builder().timeout(Duration::from_secs(3)).no_proxy().danger_accept_invalid_certs(true).build().unwrap();
    match anonymous.get(format!("https://{ip}:10349/metrics")).send().await {
        Ok(r) => panic!("the agent on {} answered a request without a client certificate: HTTP {}", nodes[0], r.status()),
        Err(e) => eprintln!("agent on {}: a request without a client certificate is refused: {e:?}", nodes[0]),
    }
    let plain = anonymous.get(format!("http://{ip}:10349/metrics")).send().await;
    assert!(plain.as_ref().map_or(true, |r| !r.status().is_success()), "the agent answered plain HTTP: {plain:?}");

    // the agent stopped on the second node: that node fails, sizing continues from the first
    std::fs::write(agent_values.path(), agent(json!({"kubernetes.io/hostname": nodes[0]}))).unwrap();
    let t1 = Instant::now();
    upgrade(agent_values.path());
    let status = common::wait_policy_status(&client, FAULT_NS, "default", 120, "the node without an agent reported failed", |s| {
        s["measurement"]["nodesFailed"] == 1 && s["measurement"]["nodesScraped"] == 1
    })
    .await;
    let failed_after = t1.elapsed().as_secs_f64();
    let condition = status["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == "MetricsUnavailable")).cloned().unwrap_or(Value::Null);
    eprintln!(
        "agent on {} stopped: reported failed {failed_after:.1} s after the upgrade; recommendation {} s ({}); MetricsUnavailable: {}",
        nodes[1], status["recommendation"]["preStopSeconds"], status["recommendation"]["reason"], condition["message"]
    );
    let msg = condition["message"].as_str().unwrap_or_default();
    assert!(msg.contains(&nodes[1]), "the failed node is named in MetricsUnavailable: {condition}");
    assert_eq!(status["measurement"]["sources"]["agent"], 1, "{status}");
    assert_eq!(status["recommendation"]["reason"], "Measured", "sizing continues from {}: {status}", nodes[0]);
    // the sleep now comes from the first node's own window: the worst node is that node, and
    // the arithmetic starts from the W the status reports. (It need not stay within 1 s of the
    // two-node value: W includes network programming p99 - 1 s, which moves with the control
    // plane's load between the two readings, and the stopped node may have been the worst.)
    assert_eq!(status["measurement"]["worstNode"], nodes[0].as_str(), "{status}");
    let w = status["measurement"]["propagationWindowSeconds"].as_f64().expect("W from the remaining node");
    let arithmetic = status["recommendation"]["arithmetic"].as_str().unwrap_or_default();
    assert!(arithmetic.starts_with(&format!("ceil({w:.3} s x ")), "the sleep is sized from the remaining node's W {w} s: {arithmetic}");
    eprintln!("recommendation {before} s from both nodes, {} s from {} alone (W {w} s)", status["recommendation"]["preStopSeconds"], nodes[0]);

    // back to the direct scrape for the tests after this one
    std::fs::write(agent_values.path(), json!({"agent": {"enabled": false}}).to_string()).unwrap();
    upgrade(agent_values.path());
    drop(_restore);
    common::wait_policy_status(&client, FAULT_NS, "default", 120, "both nodes scraped directly again", |s| {
        s["measurement"]["nodesScraped"] == 2 && s["measurement"]["sources"]["kube-proxy"] == 2
    })
    .await;
    delete_namespaces(&client, &[AGENT_NS.to_string()]).await;
}

// ---------------------------------------------------------------------------------------------
// uninstall (run last by make e2e: the chart's cluster-wide webhook must not outlive this file)

#[tokio::test]
async fn uninstall_leaves_no_webhook() {
    let client = common::client().await;
    ensure_installed(&client).await;
    run(tool("helm").args(["uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "120s"]), None);
    let hooks: Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> = Api::all(client.clone());
    assert!(hooks.get_opt(RELEASE).await.unwrap().is_none(), "the webhook configuration outlived the release");
    // the policy and its binding are owned by the chart's ClusterRole: garbage-collected
    common::wait_for("the MutatingAdmissionPolicy to be garbage-collected", 60, async || (!admission_policy_exists(&client).await).then_some(())).await;
    delete_namespaces(&client, &[FAULT_NS.to_string(), NS.to_string()]).await;
}

// ---------------------------------------------------------------------------------------------
// certificates from an existing Secret

/// A CA and a serving certificate for the webhook Service made with openssl, as a user would:
/// (CA PEM, certificate PEM, key PEM).
fn openssl_certs(dir: &std::path::Path) -> (String, String, String) {
    let sh = format!(
        "set -e; cd {dir}
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=st-e2e-user-ca 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout tls.key -out tls.csr -subj /CN={RELEASE}.{NS}.svc 2>/dev/null
printf 'subjectAltName=DNS:{RELEASE}.{NS}.svc,DNS:{RELEASE}.{NS}.svc.cluster.local\\nbasicConstraints=CA:FALSE\\nextendedKeyUsage=serverAuth\\n' > ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out tls.crt -days 2 -extfile ext 2>/dev/null",
        dir = dir.display()
    );
    run(std::process::Command::new("bash").args(["-c", &sh]), None);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    (read("ca.crt"), read("tls.crt"), read("tls.key"))
}

#[tokio::test]
async fn existing_secret_mode_serves_the_users_certificate() {
    let client = common::client().await;
    ensure_installed(&client).await;
    let dir = tempfile::tempdir().unwrap();
    let (ca, _crt, _key) = openssl_certs(dir.path());
    let secret = "st-user-tls";
    let _ = try_run(tool("kubectl").args(["-n", NS, "delete", "secret", secret]), None);
    run(
        tool("kubectl")
            .args(["-n", NS, "create", "secret", "tls", secret])
            .arg(format!("--cert={}", dir.path().join("tls.crt").display()))
            .arg(format!("--key={}", dir.path().join("tls.key").display())),
        None,
    );
    let values = values_file();
    let upgrade = |extra: &[&str]| {
        let mut c = tool("helm");
        c.args(["upgrade", RELEASE])
            .arg(root().join("charts/safe-termination"))
            .args(["-n", NS, "-f"])
            .arg(values.path())
            .args(["--set", "certificates.mode=existingSecret", "--set", &format!("certificates.existingSecret.name={secret}")])
            .arg(format!("--set-file=certificates.existingSecret.caBundle={}", dir.path().join("ca.crt").display()))
            .args(["--wait", "--timeout", "180s"])
            .args(extra);
        try_run(&mut c, None)
    };
    // Helm 4 applies server-side: the caBundle the operator patched in operator mode belongs to
    // its field manager, so the switch needs --force-conflicts (chart README, "Certificates")
    let refused = upgrade(&[]).expect_err("switching certificates.mode from operator without --force-conflicts");
    assert!(refused.contains("conflict") && refused.contains("safe-termination-certs"), "{refused}");
    let t = Instant::now();
    upgrade(&["--force-conflicts"]).unwrap_or_else(|e| panic!("{e}"));
    let pods = wait_serving(&client, 2, 180).await;
    let hooks: Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> = Api::all(client.clone());
    let bundle = hooks.get(RELEASE).await.unwrap().webhooks.unwrap()[0].client_config.ca_bundle.clone().unwrap().0;
    assert_eq!(first_der(&bundle), first_der(ca.as_bytes()), "the caBundle is not the user's CA");
    for p in &pods {
        assert!(serves_leaf_of(&pod_ip(p), ca.as_bytes()).await, "{} does not serve the user's certificate", p.name_any());
    }
    ensure_fault_namespace(&client).await;
    let sleep = common::wait_for("the webhook mutating with the user's certificate", 60, async || dry_run_sleep(&client, FAULT_NS).await).await;
    eprintln!("existingSecret mode: upgraded and serving the user's certificate in {:.1} s; dry-run pod mutated (sleep {sleep} s)", t.elapsed().as_secs_f64());
}
