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
//! 1. A rolling update of 4 pods with the observer on: the yardstick (tests/common/rules.rs,
//!    each node's rules read by the test) times each pod's removal on each node, and each pod's
//!    life after its deletion (the test's own pod watch) must cover its slowest node's window:
//!    the app got its stop signal only after every node had removed it. The waits must be
//!    shorter than the sleep the pods would have had.
//! 2. The operator stopped, another rolling update: every waiter falls back to the sleep, its
//!    pod lives at least the sleep after its deletion and not until the deadline.

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
    let op = endpoint.start_operator(system, &extra).await;
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
    let old: Vec<String> = running.iter().map(|p| p.status.as_ref().unwrap().pod_ip.clone().unwrap()).collect();

    // 1. the waits, against the yardstick's windows
    let (lives, traces) = roll(&deployments, &pods, 2, &old, readers).await;
    let mut over_window = Vec::new();
    for (ip, (deleted, gone)) in &lives {
        let lived = gone - deleted;
        let slowest = traces
            .iter()
            .map(|(node, t)| t.removal(ip, deleted - 0.5).unwrap_or_else(|| panic!("{node}: {ip} never seen leaving the rules")).by - deleted)
            .fold(f64::NEG_INFINITY, f64::max);
        println!("{ip}: gone {lived:.3} s after its deletion; left every node's rules by {slowest:.3} s (sleep {SLEEP} s)");
        // 0.3 s: both sides' watches see the deletion a little after the API server
        assert!(lived >= slowest - 0.3, "{ip}: stopped {lived:.3} s after its deletion, before every node had removed it ({slowest:.3} s)");
        over_window.push(lived - slowest);
    }
    over_window.sort_by(f64::total_cmp);
    let median_over = (over_window[1] + over_window[2]) / 2.0;
    let mut lived: Vec<f64> = lives.values().map(|(d, g)| g - d).collect();
    lived.sort_by(f64::total_cmp);
    println!("waits: pods lived {lived:?} s after deletion; over their slowest node's window by {over_window:?} s (median {median_over:.3} s)");
    assert!(lived[3] < SLEEP, "every pod stopped before the {SLEEP} s sleep would have ended: {lived:?}");
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
    let old: Vec<String> = running.iter().map(|p| p.status.as_ref().unwrap().pod_ip.clone().unwrap()).collect();
    let (lives, _) = roll(&deployments, &pods, 3, &old, readers).await;
    for (ip, (deleted, gone)) in &lives {
        let lived = gone - deleted;
        println!("{ip} (operator down): gone {lived:.3} s after its deletion (the sleep: {SLEEP} s)");
        assert!(lived >= SLEEP - 0.3, "{ip}: the fallback waited {lived:.3} s, less than the {SLEEP} s sleep");
        assert!(lived < SLEEP + 5.0, "{ip}: {lived:.3} s: the fallback is the sleep, not the deadline");
    }
    drop(agents);
    endpoint.delete(&client).await;
    common::cleanup(&client, hook, ns).await;
}
