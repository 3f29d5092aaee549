//! The observer's faults on the real nodes (e2e/README.md; built only with
//! `--features cluster-tests`, run by `make e2e`): an agent restarted in the middle of a rollout,
//! a node agent whose wall clock is 30 s ahead (libfaketime), and the operator restarted in the
//! middle of a rollout. Each is held to the yardstick's ground truth (common::truth,
//! common::rules: the rules read by another route): a fault may make a removal's bound late,
//! never early, and no removal is made up.
//!
//! - The restarted agent loses its watches and their reads; the operator's next request gives
//!   the watches back, and the new agent's first read bounds each removal, late.
//! - The skewed clock: the operator moves an agent's times onto its own clock from each answer
//!   (within half the round trip), and sends each deletion as an age, so both the operator's
//!   windows and the agent's own histogram are free of the 30 s.
//! - The restarted operator: the removals open in the old one are lost (memory only; the agents
//!   forget their watches at the new operator's first request), neither observed nor censored,
//!   and nothing is sent again; the next rollout is observed whole.

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

mod common;
use common::agents::NodeAgents;
use common::rules::{RuleReader, RuleTrace};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const NS: &str = "e2e-faults";
const SYSTEM: &str = "e2e-faults-system";
const HOOK: &str = "safe-termination-e2e-faults";

fn readers() -> Vec<RuleReader> {
    common::rules::real_nodes().into_iter().map(|n| RuleReader::new(n, NS)).collect()
}

/// Per node, per pod IP: the yardstick's bounds of its removal, seconds after its deletion was
/// seen ([early, late]: the last read with it and the first read without it).
fn bounds(traces: &[(String, RuleTrace)], deleted: &BTreeMap<String, f64>, ips: &[String]) -> BTreeMap<String, BTreeMap<String, (f64, f64)>> {
    let mut out: BTreeMap<String, BTreeMap<String, (f64, f64)>> = BTreeMap::new();
    for (node, trace) in traces {
        println!("{node}: {} successful reads, {} failed {:?}", trace.reads, trace.failed_reads, trace.errors);
        for ip in ips {
            let t = *deleted.get(ip).unwrap_or_else(|| panic!("deletion of {ip} never observed"));
            let r = trace.removal(ip, t - 0.5).unwrap_or_else(|| panic!("no successful read of {node}'s rules without {ip}"));
            out.entry(node.clone()).or_default().insert(ip.clone(), (r.after - t, r.by - t));
        }
    }
    out
}

/// The slowest node's bounds per pod: (early, late) of the per-pod windows.
fn per_pod(bounds: &BTreeMap<String, BTreeMap<String, (f64, f64)>>) -> Vec<(f64, f64)> {
    let mut pods: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for per_ip in bounds.values() {
        for (ip, (early, late)) in per_ip {
            let e = pods.entry(ip).or_insert((f64::NEG_INFINITY, f64::NEG_INFINITY));
            *e = (e.0.max(*early), e.1.max(*late));
        }
    }
    pods.into_values().collect()
}

/// One rollout's ground truth in the making: the IPs of the pods about to be replaced, the watch
/// of their deletions, and the sampler of every node's rules.
struct Trial {
    ips: Vec<String>,
    deletions: common::truth::DeletionWatch,
    sampler: tokio::task::JoinHandle<Vec<(String, RuleTrace)>>,
}

impl Trial {
    /// Starts once the 4 pods are in every node's rules; 0.3 s later (the sampler reading), the
    /// caller rolls them.
    async fn start(pods: &Api<Pod>) -> Trial {
        let ready = common::truth::pods_in_every_nodes_rules(pods, &mut readers(), 4).await;
        let ips: Vec<String> = ready.iter().filter_map(|p| p.status.as_ref()?.pod_ip.clone()).collect();
        let deletions = common::truth::DeletionWatch::start(pods);
        let sampler = common::truth::sample_removals(readers(), ips.clone(), 60);
        tokio::time::sleep(Duration::from_millis(300)).await;
        Trial { ips, deletions, sampler }
    }

    /// The yardstick's bounds ([`bounds`]) once every IP left every node's rules.
    async fn bounds(self) -> BTreeMap<String, BTreeMap<String, (f64, f64)>> {
        let traces = self.sampler.await.unwrap();
        let deleted = self.deletions.terminating.lock().unwrap().clone();
        bounds(&traces, &deleted, &self.ips)
    }
}

/// Over the per-pod windows of `truth` ([`per_pod`]): the smallest early bound, the largest
/// early bound and the largest late bound, seconds.
fn extremes(truth: &BTreeMap<String, BTreeMap<String, (f64, f64)>>) -> (f64, f64, f64) {
    let windows = per_pod(truth);
    let early = windows.iter().map(|w| w.0);
    (early.clone().fold(f64::MAX, f64::min), early.fold(f64::MIN, f64::max), windows.iter().map(|w| w.1).fold(f64::MIN, f64::max))
}

/// The agent's own metrics on `node` (its health port, text): (removals in the deletion-to-removed
/// histogram, their sum in seconds, censored).
async fn agent_histogram(agents: &NodeAgents, node: &str) -> (f64, f64, f64) {
    let addr = &agents.health.iter().find(|(n, _)| n == node).unwrap().1;
    let text = reqwest::get(format!("http://{addr}/metrics")).await.unwrap().text().await.unwrap();
    let value = |name: &str| -> f64 {
        let series = format!("{name}{{node=\"{node}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&series)).unwrap_or_else(|| panic!("{series} in\n{text}")).parse().unwrap()
    };
    (
        value("safe_termination_agent_deletion_to_removed_seconds_count"),
        value("safe_termination_agent_deletion_to_removed_seconds_sum"),
        value("safe_termination_agent_removals_censored_total"),
    )
}

async fn observed(policies: &Api<safe_termination::core::crd::TerminationPolicy>, at_least: u64) -> Value {
    common::wait_for(&format!("{at_least} removals observed in the policy's status"), 90, async || {
        let s = serde_json::to_value(policies.get("web").await.ok()?.status).ok()?;
        (s["measurement"]["observedRemovals"]["removals"].as_u64().unwrap_or(0) >= at_least).then(|| s["measurement"]["observedRemovals"].clone())
    })
    .await
}

#[tokio::test]
async fn restarts_and_a_skewed_clock_make_bounds_late_never_early() {
    let client = common::client().await;
    let nodes = common::rules::real_nodes();
    let (restarted, skewed) = (nodes[0].name.clone(), nodes[1].name.clone());
    let mut agents = NodeAgents::start_with_clocks(&[(&skewed, 30)]).await;
    let extra: Vec<String> = agents.operator_args.clone();
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let (op, policies) = common::operator_with_policy_args(&client, SYSTEM, NS, HOOK, json!({"preStop": {"minSamples": 1}}), &extra).await;
    let svc: Service = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": NS},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), NS).create(&PostParams::default(), &svc).await.unwrap();
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let strategy = json!({"rollingUpdate": {"maxSurge": 4, "maxUnavailable": 2}});
    let deploy = async |generation: u32| {
        let d = common::web_deployment(4, generation, Some(strategy.clone()));
        deployments.patch("web", &PatchParams::apply("e2e-faults").force(), &Patch::Apply(&d)).await.expect("apply Deployment web");
    };
    deploy(1).await;
    common::wait_rollout_settled(&pods, 4, 1, 180).await;

    // 1. the rollout to generation 2, node-a's agent restarted 0.3 s into it; node-b's agent 30 s ahead
    let trial = Trial::start(&pods).await;
    deploy(2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let down = agents.restart(&restarted).await;
    println!("{restarted}'s agent restarted 0.3 s into the rollout, down {down:.3} s");
    let truth = trial.bounds().await;
    let (_, early_max, late_max) = extremes(&truth);
    let o = observed(&policies, 4).await;
    println!("observed {o}; the yardstick's slowest pod in [{early_max:.3}, {late_max:.3}] s ({truth:?})");
    assert_eq!((o["removals"].as_u64(), o["censored"].as_u64()), (Some(4), Some(0)), "the restarted agent's watches came back: {o}");
    let p99 = o["p99Seconds"].as_f64().unwrap();
    // of 4 the p99 is the slowest: never below the truth's early bound (less 0.25 s: each side
    // sees the deletion through its own watch); late by at most the restart, a round and a read
    assert!(p99 >= early_max - 0.25, "observed p99 {p99:.3} s below the yardstick's early bound {early_max:.3} s: an early (made-up) removal");
    assert!(p99 <= late_max + down + 0.5, "observed p99 {p99:.3} s beyond the yardstick's late bound {late_max:.3} s plus the {down:.3} s restart and 0.5 s");
    // the skewed node's own histogram: the deletion travels as an age, so 30 s off would show
    // as 120 s in the sum of 4
    let (count, sum, censored) = agent_histogram(&agents, &skewed).await;
    let (early_sum, late_sum): (f64, f64) = truth[&skewed].values().fold((0.0, 0.0), |(e, l), (a, b)| (e + a, l + b));
    println!("{skewed} (clock +30 s): {count} removals, sum {sum:.3} s, censored {censored}; the yardstick's sum in [{early_sum:.3}, {late_sum:.3}] s");
    assert_eq!((count, censored), (4.0, 0.0));
    assert!(
        sum >= early_sum - 4.0 * 0.25 && sum <= late_sum + 4.0 * 0.5,
        "{skewed}'s histogram sum {sum:.3} s outside the yardstick's [{early_sum:.3}, {late_sum:.3}] s"
    );

    // 2. the rollout to generation 3, the operator restarted 1 s into it: what it had open is
    // lost, nothing is observed twice, and what it observes after is still never early
    let trial = Trial::start(&pods).await;
    deploy(3).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let restart = Instant::now();
    drop(op);
    let op = common::operator::Operator::start(SYSTEM, &extra).await;
    common::register_webhook(&client, HOOK, NS, op.webhook).await;
    println!("operator restarted 1 s into the rollout, down {:.3} s", restart.elapsed().as_secs_f64());
    let truth = trial.bounds().await;
    common::wait_rollout_settled(&pods, 4, 3, 180).await;
    let (early_min, _, late_max) = extremes(&truth);
    // the new operator's first status: give it a refresh (5 s) after the removals closed
    tokio::time::sleep(Duration::from_secs(12)).await;
    let s = serde_json::to_value(policies.get("web").await.unwrap().status).unwrap();
    let o = &s["measurement"]["observedRemovals"];
    println!("after the operator's restart: observed {o}; the yardstick's pods in [{early_min:.3}, {late_max:.3}] s");
    let after_restart = o["removals"].as_u64().unwrap_or(0);
    assert!(after_restart <= 4, "the restarted operator counts only the removals it saw begin (of generation 3's 4): {o}");
    assert_eq!(o["censored"].as_u64().unwrap_or(0), 0, "{o}");
    if let Some(p99) = o["p99Seconds"].as_f64().filter(|_| after_restart > 0) {
        assert!(p99 >= early_min - 0.25 && p99 <= late_max + 0.5, "observed p99 {p99:.3} s outside the yardstick's [{early_min:.3}, {late_max:.3}] s");
    }

    // 3. the restarted operator observes the next rollout whole: exactly its 4 removals more,
    // none sent again from before the restart, none early
    let trial = Trial::start(&pods).await;
    deploy(4).await;
    let (_, early_max, late_max) = extremes(&trial.bounds().await);
    let o = observed(&policies, after_restart + 4).await;
    println!("generation 4: observed {o}; the yardstick's slowest pod in [{early_max:.3}, {late_max:.3}] s");
    assert_eq!((o["removals"].as_u64(), o["censored"].as_u64()), (Some(after_restart + 4), Some(0)), "{o}");
    let p99 = o["p99Seconds"].as_f64().unwrap();
    if after_restart == 0 {
        assert!(p99 >= early_max - 0.25 && p99 <= late_max + 0.5, "observed p99 {p99:.3} s outside the yardstick's [{early_max:.3}, {late_max:.3}] s");
    }
    drop(op);
    drop(agents);
    common::cleanup(&client, HOOK, NS).await;
    // gone before the next test file: its pods' removals must not reach another test's observer
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    common::wait_for(&format!("namespace {NS} gone"), 180, async || namespaces.get_opt(NS).await.ok().and_then(|n| n.is_none().then_some(()))).await;
}
