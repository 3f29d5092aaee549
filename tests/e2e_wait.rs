//! The preStop `Wait` handler on the real nodes (e2e/README.md; built only with
//! `--features cluster-tests`, run by `make e2e`).
//!
//! The operator runs as a process of the host, its webhook on the host end of node-a's veth (an
//! address of the test cluster's own), behind a selector-less Service `st-wait` whose
//! EndpointSlice points there, with a serving certificate for `st-wait.<ns>.svc` signed by the
//! cluster's CA. The app namespace enforces the **Restricted** Pod Security level, so the API
//! server itself checks every part the mutation injects. The init container copies the waiter
//! from `st.local/waiter:1` (e2e/cluster/build-images.sh, imported into every real node): the
//! same binary the operator's image holds (image/test_image.py checks that one).
//!
//! The yardsticks are the test's own: each node's rules read by the test (tests/common/rules.rs)
//! time each pod's removal on each node, and the kubelet's own log line "PreStop hook
//! completed" (verbosity 3, raised for the test) times the end of each pod's wait, after which
//! the kubelet sends the stop signal; both from the deletion the test's pod watch saw.
//!
//! 1. A rolling update of 4 pods with the observer on: no hook may end while a node's rules
//!    still held the pod (before the last read that held it: a certain miss), and every wait
//!    must be shorter than the sleep the pods would have had.
//! 2. The operator stopped, another rolling update: every waiter falls back to the sleep, its
//!    hook ends the sleep after the deletion, not at the deadline.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

mod common;
use common::rules::RuleReader;

/// The sleep the policy sizes (minSeconds): the waiter's fallback, and what a wait is compared to.
const SLEEP: f64 = 8.0;

/// The pod spec of the rollouts: the test app on the real nodes, Restricted-compliant (the
/// namespace enforces the level): non-root, no escalation, every capability dropped, the
/// runtime's seccomp profile, a read-only root filesystem.
fn deployment(generation: u32) -> Deployment {
    let mut app = common::testapp_container("web");
    app["securityContext"] = json!({"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}});
    let mut spec = common::on_real_nodes(json!({"containers": [app]}));
    spec["securityContext"] = json!({"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}});
    serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 4, "strategy": {"rollingUpdate": {"maxSurge": 4, "maxUnavailable": 2}}, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}, "annotations": {"rollout": generation.to_string()}}, "spec": spec}}}))
    .unwrap()
}

/// An old pod of a rollout: its IP, name and node.
struct Old {
    ip: String,
    name: String,
    node: String,
}

fn old_pods(running: &[Pod]) -> Vec<Old> {
    running
        .iter()
        .map(|p| Old {
            ip: p.status.as_ref().unwrap().pod_ip.clone().unwrap(),
            name: p.metadata.name.clone().unwrap(),
            node: p.spec.as_ref().unwrap().node_name.clone().unwrap(),
        })
        .collect()
}

/// Per old pod IP, the end of its preStop hook as its kubelet logged it, unix seconds (waits up
/// to 30 s for the log line).
async fn hook_ends(ns: &str, old: &[Old]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for o in old {
        let end = common::wait_for(&format!("the kubelet of {} logging the end of {}'s preStop hook", o.node, o.name), 30, async || {
            common::truth::prestop_completed(&o.node, ns, &o.name)
        })
        .await;
        out.insert(o.ip.clone(), end);
    }
    out
}

/// Rolls generation `generation` and returns, per old pod IP, (deleted, gone) unix seconds as
/// the test's own pod watch saw them, and each node's rule trace.
async fn roll(
    deployments: &Api<Deployment>,
    pods: &Api<Pod>,
    generation: u32,
    old: &[String],
    readers: Vec<RuleReader>,
) -> (BTreeMap<String, (f64, f64)>, Vec<(String, common::rules::RuleTrace)>) {
    let deletions = common::truth::DeletionWatch::start(pods);
    let sampler = common::truth::sample_removals(readers, old.to_vec(), 60);
    tokio::time::sleep(Duration::from_millis(300)).await;
    deployments.patch("web", &PatchParams::apply("e2e").force(), &Patch::Apply(&deployment(generation))).await.unwrap();
    let traces = sampler.await.unwrap();
    common::wait_for(&format!("the {} old pods gone", old.len()), 120, async || {
        (old.iter().all(|ip| deletions.gone.lock().unwrap().contains_key(ip))).then_some(())
    })
    .await;
    let (seen, gone) = (deletions.terminating.lock().unwrap().clone(), deletions.gone.lock().unwrap().clone());
    let lives = old.iter().map(|ip| (ip.clone(), (seen[ip], gone[ip]))).collect();
    (lives, traces)
}

#[tokio::test]
async fn a_waiter_outlives_every_nodes_removal_and_falls_back_to_the_sleep_without_the_operator() {
    let image = common::wait_endpoint::WAITER_IMAGE.to_string();
    let client = common::client().await;
    let (system, ns, hook) = ("e2e-wait-system", "e2e-wait", "safe-termination-e2e-wait");
    common::apply_crd(&client).await;
    common::own_namespace(&client, system).await;
    common::fresh_namespace_with_labels(&client, ns, &[("pod-security.kubernetes.io/enforce", "restricted")]).await;
    let endpoint = common::wait_endpoint::WaitEndpoint::create(&client, system).await;
    let agents = common::agents::NodeAgents::start().await;
    let mut extra: Vec<&str> = agents.operator_args.iter().map(String::as_str).collect();
    extra.extend(endpoint.operator_args.iter().map(String::as_str));
    let op = endpoint.start_operator(system, common::operator::OPERATOR_WINDOW_SECONDS, &extra).await;
    common::register_webhook_at(&client, hook, ns, &endpoint.mutate_url()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let policies: Api<safe_termination::core::crd::TerminationPolicy> = Api::namespaced(client.clone(), ns);
    let policy = serde_json::from_value(json!({"apiVersion": "safetermination.io/v1alpha1", "kind": "TerminationPolicy",
        "metadata": {"name": "web", "namespace": ns}, "spec": {"preStop": {"handler": "Wait", "minSamples": 1, "minSeconds": SLEEP as u32, "defaultSeconds": SLEEP as u32}}}))
    .unwrap();
    policies.create(&PostParams::default(), &policy).await.unwrap();
    let web: Service = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": ns},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), ns).create(&PostParams::default(), &web).await.unwrap();
    // the leader's ConfigMap: each policy's current sleep and the CA, projected into the pods
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = common::wait_for("the ConfigMap safe-termination-wait", 60, async || cms.get("safe-termination-wait").await.ok()).await;
    let data = cm.data.unwrap_or_default();
    assert_eq!(data.get("web.preStopSeconds").map(String::as_str), Some("8"), "{data:?}");
    assert!(data.get("ca.crt").is_some_and(|c| c.contains("BEGIN CERTIFICATE")), "{data:?}");

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    deployments.patch("web", &PatchParams::apply("e2e").force(), &Patch::Apply(&deployment(1))).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut readers: Vec<RuleReader> = common::rules::real_nodes().into_iter().map(|n| RuleReader::new(n, ns)).collect();
    let running = common::truth::pods_in_every_nodes_rules(&pods, &mut readers, 4).await;
    for p in &running {
        // admitted by the Restricted level with the waiter, its init container and volumes
        let v = serde_json::to_value(p).unwrap();
        assert_eq!(v["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][0], safe_termination::core::wait::WAITER_PATH, "{}", v["spec"]);
        assert_eq!(v["spec"]["initContainers"][0]["image"], image.as_str());
        assert_eq!(v["metadata"]["annotations"]["safetermination.io/prestop-seconds"], "8");
    }
    let nodes: Vec<String> = common::rules::real_nodes().into_iter().map(|n| n.name).collect();
    for n in &nodes {
        common::truth::kubelet_verbosity(n, 3);
    }
    let old = old_pods(&running);
    let ips: Vec<String> = old.iter().map(|o| o.ip.clone()).collect();

    // 1. the waits, against the yardstick's windows
    let (lives, traces) = roll(&deployments, &pods, 2, &ips, readers).await;
    let ends = hook_ends(ns, &old).await;
    let (mut waited, mut over_window) = (Vec::new(), Vec::new());
    for (ip, (deleted, gone)) in &lives {
        let wait = ends[ip] - deleted;
        // per node: (the start of its last read that held the IP, the end of its first read without it)
        let bounds: Vec<(f64, f64)> = traces
            .iter()
            .map(|(node, t)| {
                let r = t.removal(ip, deleted - 0.5).unwrap_or_else(|| panic!("{node}: {ip} never seen leaving the rules"));
                (r.after - deleted, r.by - deleted)
            })
            .collect();
        let held_until = bounds.iter().map(|b| b.0).fold(f64::NEG_INFINITY, f64::max);
        let slowest = bounds.iter().map(|b| b.1).fold(f64::NEG_INFINITY, f64::max);
        println!(
            "{ip}: hook ended {wait:.3} s after its deletion, pod gone at {:.3} s; every node's rules dropped it in [{held_until:.3}, {slowest:.3}] s (sleep {SLEEP} s)",
            gone - deleted
        );
        // a hook that ended before a read that still held the IP let the app stop too early
        assert!(wait >= held_until, "{ip}: the hook ended {wait:.3} s after the deletion, while a node's rules still held the pod at {held_until:.3} s");
        waited.push(wait);
        over_window.push(wait - slowest);
    }
    waited.sort_by(f64::total_cmp);
    over_window.sort_by(f64::total_cmp);
    let median_over = (over_window[1] + over_window[2]) / 2.0;
    println!("waits: {waited:?} s after deletion; over the slowest node's window (late end) by {over_window:?} s (median {median_over:.3} s)");
    assert!(waited[3] < SLEEP, "every wait shorter than the {SLEEP} s sleep: {waited:?}");
    let status = common::wait_for("the 4 waits in the policy's status", 60, async || {
        let s = serde_json::to_value(policies.get("web").await.unwrap().status).unwrap();
        (s["measurement"]["waits"]["waits"].as_u64().unwrap_or(0) >= 4).then_some(s)
    })
    .await;
    let waits = &status["measurement"]["waits"];
    println!("status.measurement.waits: {waits}\n{}", common::kubectl(&["-n", ns, "get", "tpol", "-o", "wide"]));
    assert_eq!((waits["removed"].as_u64(), waits["fallback"].as_u64()), (Some(4), Some(0)), "{waits}");

    // 2. without the operator every waiter falls back to the sleep, exactly
    drop(op);
    let mut readers: Vec<RuleReader> = common::rules::real_nodes().into_iter().map(|n| RuleReader::new(n, ns)).collect();
    let running = common::truth::pods_in_every_nodes_rules(&pods, &mut readers, 4).await;
    let old = old_pods(&running);
    let ips: Vec<String> = old.iter().map(|o| o.ip.clone()).collect();
    let (lives, _) = roll(&deployments, &pods, 3, &ips, readers).await;
    let ends = hook_ends(ns, &old).await;
    for (ip, (deleted, _)) in &lives {
        let wait = ends[ip] - deleted;
        println!("{ip} (operator down): hook ended {wait:.3} s after its deletion (the sleep: {SLEEP} s)");
        // 0.3 s: the kubelet may see the deletion before the test's watch does
        assert!(wait >= SLEEP - 0.3, "{ip}: the fallback waited {wait:.3} s, less than the {SLEEP} s sleep");
        assert!(wait < SLEEP + 3.0, "{ip}: {wait:.3} s: the fallback is the sleep, not the deadline");
    }
    for n in &nodes {
        common::truth::kubelet_verbosity(n, 1);
    }
    drop(agents);
    endpoint.delete(&client).await;
    common::cleanup(&client, hook, ns).await;
}

/// The kubelet log's timestamps as the yardstick reads them.
#[test]
fn klog_headers_are_read_as_utc_unix_seconds() {
    let year = 1970 + (common::rules::now_unix() / 31_556_952.0) as i64;
    let t = common::truth::klog_unix_seconds("I1207 18:48:59.123456   1234 kuberuntime_container.go:806] \"PreStop hook completed\"").unwrap();
    // 2026-12-07T18:48:59.123456Z is 1796669339.123456; other years shift by whole days
    let expected_2026 = 1_796_669_339.123_456;
    let days = (t - expected_2026) / 86_400.0;
    assert!((days - days.round()).abs() < 1e-6, "{t}");
    if year == 2026 {
        assert!((t - expected_2026).abs() < 1e-6, "{t}");
    }
}

/// One StatefulSet rollout's duration, seconds: from the template's change until every one of
/// its `replicas` pods runs the new revision and is ready (OrderedReady: one pod at a time, each
/// deleted, waited for, recreated and ready before the next).
async fn statefulset_rollout(client: &kube::Client, ns: &str, generation: u32, replicas: i32) -> f64 {
    use k8s_openapi::api::apps::v1::StatefulSet;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let spec = common::on_real_nodes(json!({"containers": [common::testapp_container("web")]}));
    let set: StatefulSet = serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "web"},
        "spec": {"replicas": replicas, "serviceName": "web-headless", "podManagementPolicy": "OrderedReady", "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}, "annotations": {"rollout": generation.to_string()}}, "spec": spec}}}))
    .unwrap();
    let t0 = common::rules::now_unix();
    let applied = sets.patch("web", &PatchParams::apply("e2e").force(), &Patch::Apply(&set)).await.unwrap();
    let want = applied.metadata.generation.unwrap_or(1);
    common::wait_for(&format!("{ns}/web: {replicas} pods of rollout {generation} ready"), 600, async || {
        let st = sets.get("web").await.ok()?.status?;
        // the controller has seen this generation (before, its status is the last rollout's)
        let done = st.observed_generation.is_some_and(|g| g >= want)
            && st.update_revision.is_some()
            && st.current_revision == st.update_revision
            && st.updated_replicas == Some(replicas)
            && st.ready_replicas == Some(replicas);
        done.then_some(())
    })
    .await;
    common::rules::now_unix() - t0
}

/// The StatefulSet rollout (6 replicas, OrderedReady) with the sized sleep and with the wait,
/// side by side and alternating, on the real nodes at 0 extra Services: each pod's deletion
/// holds up the next, so a rollout takes the sum of its pods' termination times. Behind a
/// headless Service (the StatefulSet's) and a ClusterIP one. A benchmark: `make cluster-up`,
/// then `cargo test --features cluster-tests --test e2e_wait -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "a benchmark (docs/benchmarks/wait.md): cargo test --features cluster-tests --test e2e_wait -- --ignored"]
async fn statefulset_rollouts_with_the_sleep_and_with_the_wait() {
    let client = common::client().await;
    let system = "e2e-sts-system";
    common::apply_crd(&client).await;
    common::own_namespace(&client, system).await;
    let endpoint = common::wait_endpoint::WaitEndpoint::create(&client, system).await;
    let agents = common::agents::NodeAgents::start().await;
    let mut extra: Vec<&str> = agents.operator_args.iter().map(String::as_str).collect();
    extra.extend(endpoint.operator_args.iter().map(String::as_str));
    let op = endpoint.start_operator(system, common::operator::OPERATOR_WINDOW_SECONDS, &extra).await;
    let mut arms = Vec::new();
    for (ns, spec) in [("e2e-sts-sleep", json!({"preStop": {"minSamples": 1}})), ("e2e-sts-wait", json!({"preStop": {"minSamples": 1, "handler": "Wait"}}))] {
        common::own_namespace(&client, ns).await;
        let hook = format!("safe-termination-{ns}");
        common::register_webhook_at(&client, &hook, ns, &endpoint.mutate_url()).await;
        let policy = serde_json::from_value(json!({"apiVersion": "safetermination.io/v1alpha1", "kind": "TerminationPolicy",
            "metadata": {"name": "web", "namespace": ns}, "spec": spec}))
        .unwrap();
        Api::<safe_termination::core::crd::TerminationPolicy>::namespaced(client.clone(), ns).create(&PostParams::default(), &policy).await.unwrap();
        for (name, cluster_ip) in [("web", None), ("web-headless", Some("None"))] {
            let svc: Service = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
                "spec": {"clusterIP": cluster_ip, "selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}))
            .unwrap();
            Api::<Service>::namespaced(client.clone(), ns).create(&PostParams::default(), &svc).await.unwrap();
        }
        arms.push((ns, hook));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (ns, _) in &arms {
        let created = statefulset_rollout(&client, ns, 1, 6).await;
        println!("{ns}: 6 pods created and ready in {created:.1} s");
    }
    let mut took: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for generation in 2..5 {
        for (ns, _) in &arms {
            let t = statefulset_rollout(&client, ns, generation, 6).await;
            println!("{ns}: rollout {generation}: {t:.1} s");
            took.entry(ns).or_default().push(t);
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (sleep, wait) = (mean(&took["e2e-sts-sleep"]), mean(&took["e2e-sts-wait"]));
    let policies: Api<safe_termination::core::crd::TerminationPolicy> = Api::namespaced(client.clone(), "e2e-sts-wait");
    let waits = serde_json::to_value(policies.get("web").await.unwrap().status).unwrap()["measurement"]["waits"].clone();
    println!("StatefulSet rollouts (6 replicas, OrderedReady): sleep {sleep:.1} s, wait {wait:.1} s: {:.2} x (target <= 0.75 x); waits {waits}", wait / sleep);
    assert!(wait < sleep, "the wait's rollouts ({:?}) were not faster than the sleep's ({:?})", took["e2e-sts-wait"], took["e2e-sts-sleep"]);
    drop(op);
    drop(agents);
    endpoint.delete(&client).await;
    for (ns, hook) in &arms {
        common::cleanup(&client, hook, ns).await;
    }
}
