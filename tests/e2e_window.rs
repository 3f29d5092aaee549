//! The ground truth of the propagation window, and kube-proxy at scale, on the real local
//! control plane (e2e/README.md). built only with `--features cluster-tests`; run by `make e2e`.
//!
//! Ground truth: during a rolling update of a Deployment of real pods (the test app on the real
//! nodes: kubelet + containerd) behind a Service, the real kube-proxies' rules are sampled inside
//! their network namespaces (read only: the Service's own chain, `iptables -S` on the
//! iptables-nft node and `nft list chain` on the nftables node: common::rules::RuleReader) and, for each terminating pod, the time from when its deletion
//! was observed until its IP left each node's rules is recorded. It must be below the preStop
//! sleep the webhook injected into that pod, and the kubelet must really run that sleep: the pod
//! stays until its sleep has passed.
//!
//! The operator observes the same removals through node agents on both nodes
//! (common::agents: the observer's own readers, not the yardstick's), and the test checks it
//! against the yardstick: W covers every removal's window, and the observed p99 lies within
//! the yardstick's read bounds.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

mod common;
use common::rules::RuleReader;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// One rule reader per real node for Service `e2e-window/web` (read-only listing of that
/// Service's chain inside the node's netns: common::rules::RuleReader).
fn readers() -> Vec<RuleReader> {
    common::rules::real_nodes().into_iter().map(|n| RuleReader::new(n, "e2e-window")).collect()
}

/// Linear interpolation between closest ranks (as e2e/experiment/report.py).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = (sorted.len() as f64 - 1.0) * q;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

#[tokio::test]
async fn ground_truth_rules_drop_a_terminating_pod_before_its_prestop_sleep_ends() {
    let client = common::client().await;
    let (system, ns, hook) = ("e2e-window-system", "e2e-window", "safe-termination-e2e-window");
    let agents = common::agents::NodeAgents::start().await;
    let extra: Vec<&str> = agents.operator_args.iter().map(String::as_str).collect();
    let (op, policies) = common::operator_with_policy_args(&client, system, ns, hook, json!({"preStop": {"minSamples": 1}}), &extra).await;
    let svc: Service = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": ns},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), ns).create(&PostParams::default(), &svc).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let deploy = |generation: u32| -> Deployment {
        serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": ns},
            "spec": {"replicas": 4, "strategy": {"rollingUpdate": {"maxSurge": 4, "maxUnavailable": 2}},
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}, "annotations": {"rollout": generation.to_string()}},
                    "spec": common::on_real_nodes(json!({"containers": [common::testapp_container("web")]}))}}}))
        .unwrap()
    };
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    deployments.patch("web", &PatchParams::apply("e2e").force(), &Patch::Apply(&deploy(1))).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    // 4 running pods whose IPs are in both nodes' rules (a failed read: not yet)
    let mut rule_readers = readers();
    let old = common::truth::pods_in_every_nodes_rules(&pods, &mut rule_readers, 4).await;
    let sleep_of: HashMap<String, f64> = old
        .iter()
        .map(|p| {
            let s =
                p.spec.as_ref().unwrap().containers[0].lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()).and_then(|h| h.sleep.as_ref()).map(|s| s.seconds);
            (p.status.as_ref().unwrap().pod_ip.clone().unwrap(), s.expect("pods got a preStop sleep") as f64)
        })
        .collect();

    // watch pods: when did each old pod's deletion become visible, and when was it gone (unix
    // seconds)? Sample both nodes' rules every ~100 ms: when did each IP leave them?
    let deletions = common::truth::DeletionWatch::start(&pods);
    let sampler = common::truth::sample_removals(rule_readers, sleep_of.keys().cloned().collect(), 60);
    tokio::time::sleep(Duration::from_millis(300)).await;
    deployments.patch("web", &PatchParams::apply("e2e").force(), &Patch::Apply(&deploy(2))).await.unwrap();
    let traces = sampler.await.unwrap();
    // the old pods are gone only after the kubelet ran their preStop sleep (and SIGTERM)
    common::wait_for(&format!("the {} old pods gone", sleep_of.len()), 60, async || (deletions.gone.lock().unwrap().len() >= sleep_of.len()).then_some(()))
        .await;
    let seen = deletions.terminating.lock().unwrap().clone();
    for (ip, t_gone) in deletions.gone.lock().unwrap().clone().iter() {
        let (t_deleted, sleep) = (seen[ip], sleep_of[ip]);
        let lived = t_gone - t_deleted;
        println!("{ip}: gone {lived:.3} s after its deletion (real preStop sleep {sleep} s)");
        // 0.3 s: the two watch events are observed by one client, the kubelet's clock is the host's
        assert!(lived >= sleep - 0.3, "{ip}: gone {lived:.3} s after deletion, before its {sleep} s preStop sleep ended");
    }
    // per pod and node: from its deletion to the first successful read without its IP (the
    // conservative end of the bound; the last read with it is the other end)
    let mut delays = Vec::new();
    // per pod: the slowest node's window, at the read bounds' late end and early end
    let mut window_of: BTreeMap<String, f64> = BTreeMap::new();
    let mut at_least_of: BTreeMap<String, f64> = BTreeMap::new();
    // the same per data plane (iptables-nft, nftables, cilium): (late end, early end) per pod
    let plane_of: HashMap<String, String> = common::rules::real_nodes().into_iter().map(|n| (n.name, n.mode)).collect();
    let mut per_plane: BTreeMap<String, BTreeMap<String, (f64, f64)>> = BTreeMap::new();
    for (node, trace) in &traces {
        println!("{node}: {} successful reads, {} failed {:?}", trace.reads, trace.failed_reads, trace.errors);
        for (ip, sleep) in &sleep_of {
            let t_deleted = *seen.get(ip).unwrap_or_else(|| panic!("deletion of {ip} never observed"));
            // 0.5 s: the watch sees the deletion a little after the API server
            let removal = trace.removal(ip, t_deleted - 0.5).unwrap_or_else(|| {
                panic!("failed measurement: no successful read of {node}'s rules without {ip} ({} failed reads: {:?})", trace.failed_reads, trace.errors)
            });
            let (delay, lower) = (removal.by - t_deleted, removal.after - t_deleted);
            println!("{node} {ip}: left the rules {delay:.3} s after deletion (in [{lower:.3}, {delay:.3}] s; preStop sleep {sleep} s)");
            assert!(delay < *sleep, "{node}: {ip} stayed in the rules {delay:.3} s, longer than its {sleep} s preStop sleep");
            delays.push(delay);
            let w = window_of.entry(ip.clone()).or_insert(f64::NEG_INFINITY);
            *w = w.max(delay);
            let l = at_least_of.entry(ip.clone()).or_insert(f64::NEG_INFINITY);
            *l = l.max(lower);
            let p = per_plane.entry(plane_of[node].clone()).or_default().entry(ip.clone()).or_insert((f64::NEG_INFINITY, f64::NEG_INFINITY));
            *p = (p.0.max(delay), p.1.max(lower));
        }
    }
    assert_eq!(delays.len(), 4 * traces.len(), "4 old pods x {} nodes", traces.len());
    delays.sort_by(f64::total_cmp);
    println!(
        "propagation ground truth over {} removals: min {:.3} s, p50 {:.3} s, p90 {:.3} s, max {:.3} s",
        delays.len(),
        delays[0],
        percentile(&delays, 0.5),
        percentile(&delays, 0.9),
        delays[delays.len() - 1]
    );
    let sorted = |m: &BTreeMap<String, f64>| {
        let mut v: Vec<f64> = m.values().copied().collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let (windows, at_least) = (sorted(&window_of), sorted(&at_least_of));
    let (p99, p99_at_least) = (percentile(&windows, 0.99), percentile(&at_least, 0.99));
    // the operator observed the same 4 removals through its agents (each closes once both
    // nodes dropped the endpoint); its status then carries them and W covers their p99
    let status = common::wait_for("the 4 removals observed in the policy's status", 90, async || {
        let s = serde_json::to_value(policies.get("web").await.unwrap().status).unwrap();
        (s["measurement"]["observedRemovals"]["removals"].as_u64().unwrap_or(0) >= 4).then_some(s)
    })
    .await;
    let observed = &status["measurement"]["observedRemovals"];
    let w = status["measurement"]["propagationWindowSeconds"].as_f64().expect("W in the status");
    let observed_p99 = observed["p99Seconds"].as_f64().expect("observed p99");
    println!(
        "operator: W = {w:.3} s, recommended preStop {} s; observed removals {observed}; yardstick per-pod windows in [{:.3}, {:.3}] s at p99 ({windows:?})",
        status["recommendation"]["preStopSeconds"], p99_at_least, p99
    );
    // the observer agrees with the yardstick: its p99 (of 4: the slowest) lies within the
    // yardstick's read bounds, widened by what separates the two: each side's deletion is
    // seen by its own watch (0.25 s), and the agents start reading only when the operator's
    // next request names the removal (up to its 0.25 s round, plus a read: 0.5 s late)
    assert!(observed["censored"] == 0 && observed["p99IsLowerBound"] == false, "every removal seen on both nodes: {observed}");
    // a removal bounded too coarsely (a read more than 0.5 s late: PRECISE_BOUND_SECONDS) is
    // counted apart, not in the observed p99: the p99 is of the others, so its lowest possible
    // value is the p99 of the yardstick's smallest windows but as many (the status does not
    // say which removal was coarse); with none coarse, that is the p99 of all of them
    let coarse = observed["coarse"].as_u64().unwrap_or(0) as usize;
    let lowest = percentile(&at_least[..at_least.len().saturating_sub(coarse).max(1)], 0.99);
    assert!(
        observed_p99 >= lowest - 0.25 && observed_p99 <= p99 + 0.5,
        "observed p99 {observed_p99:.3} s outside the yardstick's [{lowest:.3}, {p99:.3}] s (less 0.25 s, plus 0.5 s; {coarse} coarse removals left out of it)"
    );
    assert_eq!(observed["coverageRatio"], 1.0, "every pod's own sleep covered its observed window: {observed}");
    // W covers the truth: at least the observed p99, and never below the yardstick's early
    // bound (the truth lies between a read that held the endpoint and one that did not: a W
    // below the early end misses for certain). The late end is no bar: a 100 ms sampler's late
    // end overstates each window by up to its interval, and W from the agents' own 50 ms reads
    // may sit below it while covering the truth.
    // each data plane's removals, as its own nodes saw them, agree with the yardstick's reads of
    // those nodes alike (with a Cilium node: its maps read by the agent, by cilium-dbg here)
    let planes = observed["dataPlanes"].as_array().cloned().unwrap_or_default();
    println!("{}", common::kubectl(&["-n", ns, "get", "tpol", "-o", "wide"]));
    assert_eq!(planes.len(), per_plane.len(), "one entry per data plane of the real nodes {:?}: {planes:?}", per_plane.keys());
    for (plane, pods) in &per_plane {
        let entry = planes.iter().find(|p| p["dataPlane"] == plane.as_str()).unwrap_or_else(|| panic!("no {plane} in {planes:?}"));
        let late = pods.values().map(|w| w.0).fold(f64::NEG_INFINITY, f64::max);
        // as above: a data plane's coarse removals are not in its p99
        let mut earlies: Vec<f64> = pods.values().map(|w| w.1).collect();
        earlies.sort_by(f64::total_cmp);
        let plane_coarse = entry["coarse"].as_u64().unwrap_or(0) as usize;
        let early = earlies[..earlies.len().saturating_sub(plane_coarse).max(1)].iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let p99 = entry["p99Seconds"].as_f64().unwrap_or_else(|| panic!("{plane}: no p99 in {entry}"));
        println!("{plane}: observed p99 {p99:.3} s over {} removals; yardstick [{early:.3}, {late:.3}] s", entry["removals"]);
        assert_eq!(entry["removals"], 4, "{plane}: {entry}");
        assert!(
            p99 >= early - 0.25 && p99 <= late + 0.5,
            "{plane}: observed p99 {p99:.3} s outside the yardstick's [{early:.3}, {late:.3}] s (less 0.25 s, plus 0.5 s)"
        );
    }
    assert!(w >= observed_p99, "W {w:.3} s below the observed p99 {observed_p99:.3} s");
    assert!(w >= p99_at_least, "W {w:.3} s does not cover the early bound {p99_at_least:.3} s of the per-pod windows' p99 {at_least:?}");
    drop(op);
    drop(agents);
    common::cleanup(&client, hook, ns).await;
}

#[tokio::test]
async fn scale_slow_iptables_nft_syncs_raise_the_sleep_and_recommend_nftables() {
    let client = common::client().await;
    let (system, ns, hook) = ("e2e-scale-system", "e2e-scale", "safe-termination-e2e-scale");
    let (op, policies) = common::operator_with_policy(&client, system, ns, hook, json!({})).await;
    let before = common::wait_for("a first recommendation", 120, async || {
        let s = serde_json::to_value(policies.get("web").await.unwrap().status).unwrap();
        s["recommendation"]["preStopSeconds"].as_u64()
    })
    .await;
    let n: usize = std::env::var("ST_SCALE_SERVICES").ok().and_then(|v| v.parse().ok()).unwrap_or(4000);
    let t0 = Instant::now();
    common::create_services(&client, ns, 0..n).await;
    println!("created {n} Services with endpoints in {:?}", t0.elapsed());
    // the operator sees the Services (MigrationRecommended: iptables with >= 1,000 Services) and
    // the syncs they caused; give kube-proxy's slowest syncs time to land in the window
    let cond = |s: &serde_json::Value, t: &str| s["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == t && c["status"] == "True");
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut seen_since: Option<Instant> = None;
    let status = loop {
        let s = serde_json::to_value(policies.get("web").await.unwrap().status).unwrap();
        if cond(&s, "MigrationRecommended") && s["proxy"]["services"].as_u64().unwrap_or(0) >= 1000 {
            let since = *seen_since.get_or_insert_with(Instant::now);
            if cond(&s, "ProxySyncSlow") || since.elapsed() > Duration::from_secs(120) {
                break s;
            }
        }
        assert!(Instant::now() < deadline, "no MigrationRecommended after {n} Services: {s:#}");
        tokio::time::sleep(Duration::from_secs(3)).await;
    };
    println!("status at scale: {status:#}");
    let sync = status["measurement"]["syncP99Seconds"].as_f64().unwrap();
    let slow = cond(&status, "ProxySyncSlow");
    // whether this run pushed the iptables-nft node past 1 s depends on the machine's load
    // (0.49 to 1.28 s seen at 4,000 Services); what must hold is that the operator says so
    // exactly when it is so, and sizes the sleep from it
    println!("sync p99 at scale: {sync} s; ProxySyncSlow: {slow}");
    // (the status rounds to milliseconds)
    assert!(if slow { sync >= 1.0 } else { sync <= 1.0005 }, "ProxySyncSlow {slow} must match the sync p99 {sync} s vs 1 s");
    let after = status["recommendation"]["preStopSeconds"].as_u64().unwrap();
    // W comes from the sync histogram (the p99 of a removal's window, src/core/window_distribution.rs):
    // more than the e2e cluster's minSyncPeriod of 1 s, which a removal landing in the gap after
    // a sync waits for
    let w = status["measurement"]["propagationWindowSeconds"].as_f64().unwrap();
    assert!(w > 1.0, "W {w} s <= minSyncPeriod 1 s (sync p99 {sync} s)");
    // and the sleep is the policy's own sizing of W, exactly: clamp(ceil(W x safetyFactor +
    // extraSeconds), minSeconds, maxSeconds) with the spec's values (the CRD defaults here)
    let p = policies.get("web").await.unwrap().spec.pre_stop;
    let reason = status["recommendation"]["reason"].as_str().unwrap_or_default();
    let sized = common::sized_pre_stop(reason, w, &p).unwrap_or_else(|| panic!("recommendation reason {reason}: {status:#}"));
    assert!(
        sized.contains(&after),
        "sleep {after} s (before: {before} s) vs clamp(ceil({w} x {} + {}), {}, {}) = {sized:?} ({reason})",
        p.safety_factor,
        p.extra_seconds,
        p.min_seconds,
        p.max_seconds
    );
    assert!(status["advice"].to_string().contains("nftables"), "{}", status["advice"]);
    let metrics = op.metrics().await;
    let slow_series = format!("safe_termination_kube_proxy_sync_slow{{node=\"node-a\"}} {}", i64::from(sync > 1.0));
    assert!(metrics.contains(&slow_series) || !slow, "alert metric {slow_series}: {metrics}");
    assert!(metrics.contains("to=\"nftables\""), "{metrics}");
    drop(op);
    common::cleanup(&client, hook, ns).await;
    // the thousands of Services go with the namespace: wait until they are gone, so that no test
    // after this one meets kube-proxy still syncing their removal
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    common::wait_for(&format!("namespace {ns} and its {n} Services deleted"), 600, async || {
        namespaces.get_opt(ns).await.ok().flatten().is_none().then_some(())
    })
    .await;
}

/// The propagation window of each data plane, side by side on one cluster (docs/benchmarks/data-planes.md "Three
/// data planes"): `ST_PLANES_ROUNDS` rounds (default 4) of deleting all 6 real pods of a
/// Deployment (a 5 s preStop sleep, no webhook) behind one Service, with `ST_PLANES_SERVICES`
/// extra Services (default 0) made first; one pod deleted at a time, and each node's removal
/// timed by the yardstick alone (tests/common/rules.rs: the iptables-nft and nftables nodes'
/// rules, the Cilium node's maps by cilium-dbg; each node read by a thread of its own every
/// 20 ms, the nftables node followed by `nft monitor`), from this test's DELETE call of the pod (its start: the late end; its return: the
/// early end) to the first successful read without its IP (late) or the last with it (early).
/// Prints, per data plane, the p50 / p99 / max of the late ends and the p99 of the early ends. A
/// measurement, not a check: run by hand on the cluster with node-c
/// (`KP_MODES="iptables-nft nftables cilium"`); it fails only when a removal is never read.
#[tokio::test]
#[ignore = "a measurement for BENCHMARKS.md, run by hand"]
async fn three_data_planes_side_by_side() {
    let client = common::client().await;
    let ns = "e2e-planes";
    common::fresh_namespace(&client, ns).await;
    let extra: usize = std::env::var("ST_PLANES_SERVICES").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let rounds: u32 = std::env::var("ST_PLANES_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(4);
    // how long each deletion is followed: past the slowest removal seen at that scale (2.5 s at
    // 4,000 Services)
    let follow = Duration::from_secs(if extra > 0 { 8 } else { 4 });
    if extra > 0 {
        let t0 = Instant::now();
        common::create_services(&client, ns, 0..extra).await;
        println!("created {extra} Services in {:?}; 20 s for the data planes to settle", t0.elapsed());
        tokio::time::sleep(Duration::from_secs(20)).await;
    }
    let svc: Service = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": ns},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), ns).create(&PostParams::default(), &svc).await.unwrap();
    let mut container = common::testapp_container("web");
    container["lifecycle"] = json!({"preStop": {"sleep": {"seconds": 5}}});
    let deploy: Deployment = serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": ns},
        "spec": {"replicas": 6, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": common::on_real_nodes(json!({"terminationGracePeriodSeconds": 10, "containers": [container]}))}}}))
    .unwrap();
    Api::<Deployment>::namespaced(client.clone(), ns).create(&PostParams::default(), &deploy).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let nodes = common::rules::real_nodes();
    // per data plane: (late end, early end) of each node's removal of each pod
    let mut windows: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for _ in 0..rounds {
        let mut readers: Vec<RuleReader> = nodes.iter().cloned().map(|n| RuleReader::new(n, ns)).collect();
        let old = common::truth::pods_in_every_nodes_rules(&pods, &mut readers, 6).await;
        // one deletion at a time (as a single `kubectl delete`), each node read by its own
        // thread every 20 ms (a node's bound is its own read's length, not a cycle over all
        // nodes) from before the deletion until `follow` after it: no window waits on another
        // deletion's sync
        for p in &old {
            let ip = p.status.as_ref().unwrap().pod_ip.clone().unwrap();
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let pollers: Vec<_> = readers
                .drain(..)
                .map(|mut r| {
                    let stop = stop.clone();
                    std::thread::spawn(move || {
                        // nftables: `nft monitor` (each change of the chain as it is committed;
                        // `nft list chain` loads the whole table: 0.5 s and more a read at 4,000
                        // Services, as e2e_deploy's samplers do)
                        let trace = if r.node.mode == "nftables" {
                            common::rules::follow_nft_monitor(&mut r, &stop)
                        } else {
                            common::rules::poll(&mut r, &stop, Duration::from_millis(20))
                        };
                        (r, trace)
                    })
                })
                .collect();
            // every node read (and its chain found) before the deletion
            tokio::time::sleep(Duration::from_secs(if extra > 0 { 3 } else { 1 })).await;
            let t0 = common::rules::now_unix();
            pods.delete(p.metadata.name.as_deref().unwrap(), &Default::default()).await.unwrap();
            let t1 = common::rules::now_unix();
            tokio::time::sleep(follow).await;
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            for h in pollers {
                let (r, trace) = h.join().unwrap();
                let plane = r.node.mode.clone();
                let r_ = trace.removal(&ip, t0).unwrap_or_else(|| {
                    panic!("{}: no successful read without {ip} within {follow:?} ({} failed: {:?})", r.node.name, trace.failed_reads, trace.errors)
                });
                windows.entry(plane).or_default().push((r_.by - t0, (r_.after - t1).max(0.0)));
                readers.push(r);
            }
        }
        // the replacements running (the old pods sleep out their preStop meanwhile)
        common::wait_for("6 new pods ready", 120, async || {
            let l = pods.list(&Default::default()).await.ok()?;
            let ready = l
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")))
                .count();
            (ready == 6).then_some(())
        })
        .await;
    }
    println!("data plane | removals | p50 | p99 | max | p99 of the early end (seconds, {extra} extra Services)");
    for (plane, w) in &windows {
        let mut late: Vec<f64> = w.iter().map(|x| x.0).collect();
        let mut early: Vec<f64> = w.iter().map(|x| x.1).collect();
        late.sort_by(f64::total_cmp);
        early.sort_by(f64::total_cmp);
        println!(
            "{plane} | {} | {:.3} | {:.3} | {:.3} | {:.3}",
            late.len(),
            percentile(&late, 0.5),
            percentile(&late, 0.99),
            late[late.len() - 1],
            percentile(&early, 0.99)
        );
    }
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone()).delete(ns, &Default::default()).await;
}
