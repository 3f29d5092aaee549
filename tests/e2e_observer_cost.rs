//! The observer's cost on the real nodes, side by side with it off (docs/benchmarks/observed-removals.md "Observed
//! removals"): a 40-replica rolling update of real pods on both nodes, with the node agents
//! running in both runs and the operator asking them to observe removals in one
//! (`--observe-removals`) and not in the other, runs alternating (on, off, on, off, ...). Per
//! run: each agent's CPU seconds over the rollout (from its /proc), that as a share of one core,
//! each agent's and the operator's VmHWM, and the removals observed.
//!
//! Ignored in `make e2e` (about 3 minutes a run): `bench/observer-cost.sh` runs it, with
//! `ST_COST_PAIRS` pairs (default 2), `ST_COST_REPLICAS` (default 40) and `ST_COST_SERVICES`
//! extra selector-less Services of two endpoints each (default 0; the script's `SERVICES`,
//! default 4,000) in namespace `e2e-cost-services`.

#![cfg(feature = "cluster-tests")]

mod common;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::{Duration, Instant};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One run's figures.
struct Run {
    observing: bool,
    rollout_seconds: f64,
    agents: Vec<(String, f64, Option<u64>)>,
    operator_hwm_kib: Option<u64>,
    removals: Option<u64>,
    coarse: Option<u64>,
    p99: Option<f64>,
}

async fn run_once(client: &kube::Client, observing: bool, replicas: usize, n: usize) -> Run {
    let (system, ns, hook) = (format!("e2e-cost-system-{n}"), format!("e2e-cost-{n}"), format!("safe-termination-e2e-cost-{n}"));
    let agents = common::agents::NodeAgents::start().await;
    let extra: Vec<&str> = agents.operator_args.iter().map(String::as_str).filter(|a| observing || *a != "--observe-removals").collect();
    let (op, policies) = common::operator_with_policy_args(client, &system, &ns, &hook, json!({"preStop": {"minSamples": 1}}), &extra).await;
    let svc: Service = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": ns},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), &ns).create(&PostParams::default(), &svc).await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let strategy = || Some(json!({"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}));
    deployments.patch("web", &PatchParams::apply("e2e-cost").force(), &Patch::Apply(&common::web_deployment(replicas, 1, strategy()))).await.unwrap();
    common::wait_rollout_settled(&pods, replicas, 1, 300).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before: Vec<f64> = agents.usage().iter().map(|a| a.1).collect();
    let started = Instant::now();
    deployments.patch("web", &PatchParams::apply("e2e-cost").force(), &Patch::Apply(&common::web_deployment(replicas, 2, strategy()))).await.unwrap();
    common::wait_rollout_settled(&pods, replicas, 2, 300).await;
    // the last removals' reads end after the old pods are gone: the agents' deadline is 60 s,
    // but an observed removal closes once every node dropped it (seconds)
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rollout_seconds = started.elapsed().as_secs_f64();
    let agents_now = agents.usage();
    let used: Vec<(String, f64, Option<u64>)> = agents_now.iter().zip(&before).map(|((n, cpu, hwm), b)| (n.clone(), cpu - b, *hwm)).collect();
    let status = serde_json::to_value(policies.get("web").await.unwrap().status).unwrap();
    let observed = &status["measurement"]["observedRemovals"];
    let run = Run {
        observing,
        rollout_seconds,
        agents: used,
        operator_hwm_kib: common::agents::usage(op.pid()).1,
        removals: observed["removals"].as_u64(),
        coarse: observed["coarse"].as_u64(),
        p99: observed["p99Seconds"].as_f64(),
    };
    drop(op);
    drop(agents);
    common::cleanup(client, &hook, &ns).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(&system, &Default::default()).await;
    // the next run's operator sees every deletion in the cluster: this run's pods must be gone
    common::wait_for(&format!("namespaces {ns} and {system} gone"), 300, async || {
        (namespaces.get_opt(&ns).await.ok()?.is_none() && namespaces.get_opt(&system).await.ok()?.is_none()).then_some(())
    })
    .await;
    run
}

#[tokio::test]
#[ignore = "about 3 minutes a run: bench/observer-cost.sh runs it"]
async fn observer_cost_over_a_rolling_update_side_by_side_with_it_off() {
    let client = common::client().await;
    let (pairs, replicas, extra) = (env_or("ST_COST_PAIRS", 2), env_or("ST_COST_REPLICAS", 40), env_or("ST_COST_SERVICES", 0));
    if extra > 0 {
        // selector-less Services of two endpoints each (kept for the next call: the script
        // deletes the namespace)
        let ns = "e2e-cost-services";
        common::own_namespace(&client, ns).await;
        let have = Api::<Service>::namespaced(client.clone(), ns).list_metadata(&ListParams::default()).await.unwrap().items.len();
        if have < extra {
            common::create_services(&client, ns, have..extra).await;
        }
        // kube-proxy programs them before the first run
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
    let services = Api::<Service>::all(client.clone()).list_metadata(&ListParams::default()).await.unwrap().items.len();
    let mut runs = Vec::new();
    for i in 0..pairs * 2 {
        let run = run_once(&client, i % 2 == 0, replicas, i).await;
        println!(
            "run {i} (observer {}): rollout {:.1} s, agents {:?}, operator VmHWM {:?} kB, removals {:?} ({:?} coarse), observed p99 {:?}",
            if run.observing { "on" } else { "off" },
            run.rollout_seconds,
            run.agents,
            run.operator_hwm_kib,
            run.removals,
            run.coarse,
            run.p99
        );
        runs.push(run);
    }
    println!("\n{services} Services in the cluster, {replicas}-replica rolling update (maxSurge and maxUnavailable 25%), {pairs} pairs");
    println!(
        "| run | observer | rollout s | agent CPU-s (node: CPU-s, % of a core) | agents' VmHWM kB | operator VmHWM kB | removals (coarse) | observed p99 s |"
    );
    println!("|---|---|---:|---|---|---:|---|---:|");
    for (i, r) in runs.iter().enumerate() {
        let cpu: Vec<String> = r.agents.iter().map(|(n, c, _)| format!("{n}: {c:.2}, {:.2}%", 100.0 * c / r.rollout_seconds)).collect();
        let hwm: Vec<String> = r.agents.iter().map(|(_, _, h)| h.map_or("-".into(), |h| h.to_string())).collect();
        println!(
            "| {i} | {} | {:.1} | {} | {} | {} | {} | {} |",
            if r.observing { "on" } else { "off" },
            r.rollout_seconds,
            cpu.join("; "),
            hwm.join(" / "),
            r.operator_hwm_kib.map_or("-".into(), |h| h.to_string()),
            r.removals.map_or("-".into(), |n| format!("{n} ({})", r.coarse.unwrap_or(0))),
            r.p99.map_or("-".into(), |p| format!("{p:.3}"))
        );
    }
    // what the observer is for: with it on, every replica's removal is observed
    for r in runs.iter().filter(|r| r.observing) {
        assert!(r.removals.unwrap_or(0) >= replicas as u64, "{replicas} removals observed, got {:?}", r.removals);
    }
}
