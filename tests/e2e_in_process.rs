//! The operator's parts run inside this test process against the real local control plane
//! (e2e/README.md); tests/e2e_operator_pods.rs runs the same operator as real pods. Here: a real
//! kube-apiserver calls our webhook over TLS and applies (or rejects) what it answers, for every
//! shared pod case; pods are created unmutated when the webhook is down; the operator's
//! measurement of the real kube-proxies sizes new pods; a Cilium agent without kube-proxy is
//! reported as `ebpf`; four replicas' lease tasks hand the Lease over with never two leaders.
//!
//! They need a running cluster (`make cluster-up`), so they are built only with `--features
//! cluster-tests` (a plain `cargo test` skips them) and run by `make e2e`. Without a cluster
//! they fail loudly: they never pass by skipping.

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};

mod common;
use safe_termination::core::crd::TerminationPolicySpec;
use safe_termination::core::mutate::mutate_pod;
use safe_termination::core::plan::{Capabilities, Plan, PlanPolicy};
use safe_termination::core::selector::AssumeServiceBacked;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn static_plan(pre_stop: u32, native_sleep: bool) -> Plan {
    Plan {
        policies: Vec::new(),
        default_policy: Some(PlanPolicy { namespace: String::new(), name: "e2e".into(), spec: TerminationPolicySpec::default(), pre_stop_seconds: pre_stop }),
        capabilities: Capabilities { native_sleep },
        wait: Default::default(),
    }
}

/// Waits until the API server calls the webhook (its configuration is picked up by an informer).
async fn wait_until_mutating(client: &Client, ns: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let probe: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "wait-for-webhook", "namespace": ns},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .unwrap();
    common::wait_for("the API server to call the webhook", 30, async || {
        let pp = PostParams { dry_run: true, ..Default::default() };
        let p = api.create(&pp, &probe).await.ok()?;
        p.spec.as_ref().and_then(|s| s.containers[0].lifecycle.as_ref()).map(|_| ())
    })
    .await;
}

fn lifecycles_and_grace(pod: &Value) -> (Vec<Value>, Option<i64>, Value) {
    let containers = pod.pointer("/spec/containers").and_then(Value::as_array).cloned().unwrap_or_default();
    let lc = containers.iter().map(|c| c.get("lifecycle").cloned().unwrap_or(Value::Null)).collect();
    let inits = pod.pointer("/spec/initContainers").cloned().unwrap_or(Value::Null);
    (lc, pod.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64), inits)
}

fn strip_defaults(mut inits: Value) -> Value {
    // the API server defaults fields (imagePullPolicy, terminationMessagePath, ...): compare
    // only what we could have changed
    if let Some(a) = inits.as_array_mut() {
        for c in a {
            *c = json!({"name": c.get("name"), "lifecycle": c.get("lifecycle")});
        }
    }
    inits
}

#[tokio::test]
async fn every_pod_case_through_the_real_api_server() {
    let client = common::client().await;
    let ns = "e2e-pod-cases";
    let hook_name = "safe-termination-e2e-pod-cases";
    common::own_namespace(&client, ns).await;
    let hook = common::start_webhook(static_plan(10, true));
    common::register_webhook(&client, hook_name, ns, hook.port).await;
    wait_until_mutating(&client, ns).await;

    let plan = static_plan(10, true);
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut checked = 0;
    let mut files: Vec<String> = std::fs::read_dir("tests/data/pods").unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    for file in &files {
        for (name, pod) in common::creatable_pods(&client, file, ns).await {
            let expected = {
                let d = mutate_pod(&pod, ns, &plan, &AssumeServiceBacked);
                let mut p = pod.clone();
                json_patch::patch(&mut p, &d.patch.0).unwrap();
                p
            };
            let typed: Pod = serde_json::from_value(pod.clone()).unwrap_or_else(|e| panic!("{file}: {e}"));
            for dry_run in [true, false] {
                let pp = PostParams { dry_run, ..Default::default() };
                let created = api.create(&pp, &typed).await.unwrap_or_else(|e| panic!("{file} (dry_run={dry_run}) rejected: {e}"));
                let got = serde_json::to_value(&created).unwrap();
                let (lc_got, grace_got, inits_got) = lifecycles_and_grace(&got);
                let (lc_want, grace_want, inits_want) = lifecycles_and_grace(&expected);
                assert_eq!(lc_got, lc_want, "{file}: container lifecycles after the real API server");
                assert_eq!(grace_got, grace_want.or(Some(30)), "{file}: terminationGracePeriodSeconds");
                assert_eq!(strip_defaults(inits_got), strip_defaults(inits_want), "{file}: init containers untouched");
            }
            checked += 1;
            let _ = api.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await;
        }
    }
    assert!(checked >= 16, "only {checked} pod templates created");
    hook.stop.cancel();
    common::cleanup(&client, hook_name, ns).await;
}

#[tokio::test]
async fn pods_are_created_unmutated_when_the_webhook_is_down() {
    let client = common::client().await;
    let ns = "e2e-webhook-down";
    let hook_name = "safe-termination-e2e-webhook-down";
    common::own_namespace(&client, ns).await;
    // a port nothing listens on
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    common::register_webhook(&client, hook_name, ns, port).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    // a real pod on a real node (kubelet + containerd): it is admitted, starts and serves
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "unmutated", "namespace": ns},
        "spec": common::on_real_nodes(json!({"containers": [common::testapp_container("c")]}))
    }))
    .unwrap();
    let started = Instant::now();
    let created = api.create(&PostParams::default(), &pod).await.expect("failurePolicy Ignore: the pod is admitted");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(6), "admission took {took:?}, above the 5 s webhook timeout");
    assert!(created.spec.unwrap().containers[0].lifecycle.is_none(), "not mutated");
    let ip = common::wait_for("the unmutated pod Ready on its real node", 60, async || {
        let st = api.get("unmutated").await.unwrap().status.unwrap_or_default();
        let ready = st.conditions.unwrap_or_default().iter().any(|c| c.type_ == "Ready" && c.status == "True");
        st.pod_ip.filter(|_| ready)
    })
    .await;
    // the host reaches the pod CIDRs over the nodes' veths: the container really runs
    let body = reqwest::get(format!("http://{ip}:8080/")).await.expect("GET the pod").text().await.unwrap();
    assert_eq!(body.trim(), "unmutated", "the pod answers with its name");
    common::cleanup(&client, hook_name, ns).await;
}

// ---------- the operator (`safe-termination run`) against the real cluster ----------

use kube::api::{Patch, PatchParams};
use safe_termination::core::crd::TerminationPolicy;

#[tokio::test]
async fn operator_measures_the_real_kube_proxy_and_sizes_new_pods() {
    let client = common::client().await;
    common::apply_crd(&client).await;
    let system = "e2e-operator-system";
    let ns = "e2e-operator";
    let hook_name = "safe-termination-e2e-operator";
    common::own_namespace(&client, system).await;
    common::own_namespace(&client, ns).await;
    let op = common::Operator::start(system, &[]).await;
    common::register_webhook(&client, hook_name, ns, op.webhook).await;

    // a policy that trusts a single sync sample, so the real (small) syncs size the sleep
    let policy: TerminationPolicy = serde_json::from_value(json!({
        "apiVersion": "safetermination.io/v1alpha1", "kind": "TerminationPolicy",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"preStop": {"minSamples": 1, "minSeconds": 2}, "grace": {"appShutdownSeconds": 20}}
    }))
    .unwrap();
    let policies: Api<TerminationPolicy> = Api::namespaced(client.clone(), ns);
    policies.create(&PostParams::default(), &policy).await.expect("create TerminationPolicy");

    // the Deployment's Service, applied server-side
    let apply = |v: Value| {
        let client = client.clone();
        async move {
            let kind = v["kind"].as_str().unwrap().to_string();
            let name = v["metadata"]["name"].as_str().unwrap().to_string();
            let gvk = match kind.as_str() {
                "Service" => kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&()),
                _ => kube::api::ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&()),
            };
            let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client, ns, &gvk);
            api.patch(&name, &PatchParams::apply("e2e").force(), &Patch::Apply(&v)).await.expect("apply");
        }
    };

    // A measured status from both real kube-proxies over the operator's own window, not their
    // lifetime: the first status after one scrape per node reads kube-proxy's counters since it
    // started (src/core/model.rs, Interval::Lifetime), which hold whatever this cluster ran
    // before (an experiment's or a scale test's thousands of Services: syncs of seconds). The
    // Service makes each kube-proxy sync (minSyncPeriod 1 s, then a sync of well under a
    // second); a status from a scrape 5 s after it has that sync between two scrapes of its
    // window, and then reads only the syncs since the operator started.
    common::wait_policy_status(&client, ns, "web", 90, "no measured status", |s| s["measurement"]["nodesScraped"] == 2).await;
    let service_created = k8s_openapi::jiff::Timestamp::now();
    apply(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": ns},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}))
    .await;
    let synced = service_created + k8s_openapi::jiff::SignedDuration::from_secs(5);
    let status = common::wait_policy_status(&client, ns, "web", 90, "no measured status over the operator's window", |s| {
        let scraped = s["measurement"]["lastScrapeTime"].as_str().and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok());
        s["measurement"]["nodesScraped"] == 2 && s["recommendation"]["reason"] == "Measured" && scraped.is_some_and(|t| t >= synced)
    })
    .await;
    let sync = status["measurement"]["syncP99Seconds"].as_f64().expect("sync p99");
    assert!(sync > 0.0 && sync < 1.0, "a small cluster syncs in well under a second: {sync}");
    let w = status["measurement"]["propagationWindowSeconds"].as_f64().unwrap();
    // W = max(the p99 of a removal's window in kube-proxy, network programming p99 - 1 s)
    // (src/core/model.rs): the first is more than minSyncPeriod (1 s here: a removal that lands in
    // the gap after a sync waits for the rest of it, then its own sync) and at most
    // minSyncPeriod + 2 syncs, which on this small cluster take well under a second (the sync
    // p99 above); the status rounds each figure to milliseconds. Once a deletion's control-plane
    // lag is measured, network programming is no term of W (0 here)
    let lag_measured = status["measurement"]["controlPlaneLag"]["samples"].as_u64().unwrap_or(0) > 0;
    let np = status["measurement"]["networkProgrammingP99Seconds"].as_f64().filter(|_| !lag_measured).map_or(0.0, |v| v - 1.0);
    assert!(w >= np - 0.002 && w > 1.0, "W {w} s below max(1 s, network programming p99 - 1 s = {np} s)");
    assert!(w <= f64::max(3.0, np + 0.002), "W {w} s above max(3 s, network programming p99 - 1 s = {np} s) with sync p99 {sync} s");
    let worst = status["measurement"]["worstNode"].as_str().unwrap();
    assert!(["node-a", "node-b"].contains(&worst), "{worst}");
    let pre_stop = status["recommendation"]["preStopSeconds"].as_u64().unwrap();
    // the policy's own sizing (its safetyFactor, the CRD default 1.25 here; minSeconds 2):
    // exactly clamp(ceil(W x safetyFactor + extraSeconds), minSeconds, maxSeconds)
    let p = policies.get("web").await.unwrap().spec.pre_stop;
    let sized = common::sized_pre_stop("Measured", w, &p).unwrap();
    assert!(
        sized.contains(&pre_stop),
        "preStop {pre_stop} vs clamp(ceil({w} x {} + {}), {}, {}) = {sized:?}",
        p.safety_factor,
        p.extra_seconds,
        p.min_seconds,
        p.max_seconds
    );
    let cond = |t: &str| status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == t).cloned().unwrap();
    assert_eq!(cond("Ready")["status"], "True");
    assert_eq!(cond("ProxySyncSlow")["status"], "False");
    assert_eq!(cond("MetricsUnavailable")["status"], "False");

    // a Deployment behind the Service: its new pods get the measured sleep and grace (the
    // Service index has seen the Service for the 5 s above: scope ServiceBacked)
    let before = common::policy_status(&client, ns, "web").await["recommendation"]["preStopSeconds"].as_u64().unwrap();
    apply(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": ns},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "registry.k8s.io/pause:3.10"}]}}}}))
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list =
        common::wait_for("the Deployment's 3 pods", 60, async || Some(pods.list(&Default::default()).await.unwrap()).filter(|l| l.items.len() == 3)).await;
    let after = common::policy_status(&client, ns, "web").await["recommendation"]["preStopSeconds"].as_u64().unwrap();
    for p in &list.items {
        let spec = p.spec.as_ref().unwrap();
        let sleep = spec.containers[0].lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()).and_then(|h| h.sleep.as_ref()).map(|s| s.seconds as u64);
        let sleep = sleep.expect("pod got a native preStop sleep");
        assert!(sleep == before || sleep == after, "sleep {sleep} is the measured recommendation ({before}/{after})");
        assert_eq!(spec.termination_grace_period_seconds, Some(((sleep + 20).max(30)) as i64));
        assert_eq!(p.metadata.annotations.as_ref().unwrap()["safetermination.io/policy"], format!("{ns}/web"));
    }
    // the operator's own metrics show the per-node p99 it measured
    let metrics = op.metrics().await;
    assert!(metrics.contains("safe_termination_kube_proxy_sync_p99_seconds{node=\"node-a\"}"), "{metrics}");
    assert!(metrics.contains("safe_termination_webhook_requests_total{decision=\"mutated\"}"), "{metrics}");
    drop(op);
    common::cleanup(&client, hook_name, ns).await;
    let _ = Api::<Namespace>::all(client.clone()).delete(system, &DeleteParams::default()).await;
}

#[tokio::test]
async fn no_kube_proxy_pods_and_a_cilium_agent_is_reported_as_ebpf() {
    let client = common::client().await;
    common::apply_crd(&client).await;
    let (system, ns) = ("e2e-cilium-system", "e2e-cilium");
    common::own_namespace(&client, system).await;
    common::own_namespace(&client, ns).await;
    // a Cilium agent pod where Cilium's chart puts it; kwok makes it Running on node-d (the kwok node)
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let _ = pods.delete("cilium-e2e", &DeleteParams::default().grace_period(0)).await;
    common::wait_for("the old cilium-e2e pod deleted", 30, async || pods.get_opt("cilium-e2e").await.unwrap().is_none().then_some(())).await;
    let agent: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "cilium-e2e", "namespace": "kube-system", "labels": {"k8s-app": "cilium"}},
        "spec": {"nodeName": "node-d", "containers": [{"name": "cilium-agent", "image": "quay.io/cilium/cilium:v1.18.0"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &agent).await.expect("create the Cilium agent pod");

    // the operator finds kube-proxy pods through the API (the cluster's kube-proxies are
    // processes, not pods: there are none)
    let op = common::Operator::start_discovering(system, &[]).await;
    let policies: Api<TerminationPolicy> = Api::namespaced(client.clone(), ns);
    let policy: TerminationPolicy = serde_json::from_value(json!({
        "apiVersion": "safetermination.io/v1alpha1", "kind": "TerminationPolicy",
        "metadata": {"name": "web", "namespace": ns}, "spec": {"preStop": {"defaultSeconds": 7}}
    }))
    .unwrap();
    policies.create(&PostParams::default(), &policy).await.expect("create TerminationPolicy");
    let cond = |s: &Value, t: &str| s["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == t).cloned()).unwrap_or(Value::Null);
    let s =
        common::wait_policy_status(&client, ns, "web", 90, "no eBPF dataplane reported", |s| cond(s, "MetricsUnavailable")["reason"] == "NoKubeProxy").await;
    assert_eq!(s["proxy"]["mode"], "ebpf", "{s:#}");
    assert_eq!(s["recommendation"]["preStopSeconds"], 7, "sized from the policy default: {s:#}");
    let note = "no kube-proxy pods; 1 Cilium agent pod(s) (k8s-app=cilium in kube-system): eBPF dataplane, sized from the policy default";
    assert_eq!(cond(&s, "MetricsUnavailable")["message"], note);
    assert!(cond(&s, "Ready")["message"].as_str().unwrap().ends_with(note), "{s:#}");
    assert_eq!(cond(&s, "MigrationRecommended")["status"], "False", "eBPF needs no migration: {s:#}");

    // the agent goes away: no dataplane is claimed any more (re-read with the configuration,
    // every 10 scrape cycles = 20 s here)
    pods.delete("cilium-e2e", &DeleteParams::default().grace_period(0)).await.unwrap();
    let s = common::wait_policy_status(&client, ns, "web", 90, "still reported as eBPF", |s| cond(s, "MetricsUnavailable")["reason"] == "NoNodesScraped").await;
    assert_ne!(s["proxy"]["mode"], "ebpf", "{s:#}");
    drop(op);
    let _ = Api::<Namespace>::all(client.clone()).delete(ns, &DeleteParams::default()).await;
    let _ = Api::<Namespace>::all(client.clone()).delete(system, &DeleteParams::default()).await;
}

/// Four replicas' lease tasks ([`safe_termination::runtime::elect`], kube-lease-manager)
/// against the real API server: the leader stops (releasing the lease) three times, and every
/// 5 ms at most one replica reports leading, and a new one leads after each release. With one
/// field manager shared by every replica, two followers that woke together both took the
/// released lease (tests/e2e_operator_pods.rs t3 saw two status writers for 14 s).
#[tokio::test]
async fn lease_hand_overs_never_have_two_leaders() {
    use safe_termination::runtime::{Leadership, Tasks, elect};
    use tokio_util::sync::CancellationToken;
    let client = common::client().await;
    let ns = "st-e2e-lease";
    common::own_namespace(&client, ns).await;
    let mut replicas: Vec<(String, Option<Tasks>, Leadership)> = Vec::new();
    for i in 0..4 {
        let mut tasks = Tasks::new(CancellationToken::new());
        let id = format!("replica-{i}");
        let l = elect(client.clone(), ns, "st-e2e-lease", id.clone(), None, &mut tasks).await.expect("lease manager");
        replicas.push((id, Some(tasks), l));
    }
    let leaders = |r: &[(String, Option<Tasks>, Leadership)]| -> Vec<String> {
        r.iter().filter(|(_, t, l)| t.is_some() && l.leading()).map(|(id, _, _)| id.clone()).collect()
    };
    let mut handovers = Vec::new();
    for round in 0..3 {
        // wait for exactly one leader, sampling every 5 ms
        let t0 = Instant::now();
        let leader = loop {
            let now = leaders(&replicas);
            assert!(now.len() <= 1, "round {round}: {now:?} lead at once");
            if let [one] = now.as_slice() {
                // hold a moment: a wrongful second leader shows as soon as its lock's read-back
                let held = Instant::now();
                while held.elapsed() < Duration::from_secs(3) {
                    let again = leaders(&replicas);
                    assert!(again.len() <= 1, "round {round}: {again:?} lead at once");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                break one.clone();
            }
            assert!(t0.elapsed() < Duration::from_secs(75), "round {round}: no leader after 75 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        handovers.push((leader.clone(), t0.elapsed().as_secs_f64()));
        // the leader stops: its task releases the lease
        let r = replicas.iter_mut().find(|(id, _, _)| *id == leader).unwrap();
        r.1.take().unwrap().stop(Duration::from_secs(10)).await;
    }
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        let now = leaders(&replicas);
        assert!(now.len() <= 1, "after the hand-overs: {now:?} lead at once");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!("lease hand-overs (leader, seconds until seen leading, including a 3 s hold): {handovers:?}");
    for (_, t, _) in replicas {
        if let Some(t) = t {
            t.stop(Duration::from_secs(10)).await;
        }
    }
}
