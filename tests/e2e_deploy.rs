//! The deploy-error experiment: does safe-termination remove the connection errors of
//! rolling deploys, on real traffic? built only with `--features cluster-tests`; run by `make e2e` (full size)
//! and `make demo` (small), both through `e2e/experiment/experiment.sh`, on the real nodes of the local
//! cluster (e2e/cluster/nodes.sh: kubelet + containerd + runc, pods on a CNI bridge).
//!
//! Per run: a Deployment `web` of `replicas` pods of the project's test app (e2e/testapp: no
//! graceful shutdown, it exits ~100 ms after SIGTERM) spread over both real nodes behind a
//! ClusterIP Service; on each real node a load generator (`st-testapp load`, in the node's
//! network namespace like a hostNetwork pod) opens a new connection per request to the ClusterIP at
//! a fixed rate; K rolling restarts per strategy. Recorded: every request (load-NODE.csv), when
//! each old pod's deletion was observed with its preStop sleep and grace period (deletions.csv),
//! and the ground truth: when its IP left each node's kube-proxy rules (groundtruth.csv), sampled
//! read-only inside the node's netns (common::rules): the first successful read without the IP,
//! and the last successful read with it, between which it left; a failed read is no sample and
//! is counted per node (meta.json `failedReads`).
//! Protected runs have a TerminationPolicy in their namespace and the operator's webhook
//! registered for it; the operator measures the real kube-proxies throughout the experiment.
//! `e2e/experiment/report.py` turns the runs into results.json (per run `pods`: each deleted pod's
//! sleep and window per node), results.md and results.svg, and the test asserts on them: in
//! protected runs every pod's sleep covers its own window, W covers the p99 of the windows, and
//! the sleep is not wasteful (see the end of `deploy_experiment`); a pod never seen removed by a
//! successful read fails the experiment as a missing measurement.
//!
//! Settings (environment): ST_EXP_OUT (output dir), ST_EXP_RUNS (comma list, a to h by
//! default: a baseline, b protected, c baseline at scale, d protected at scale; e-h with
//! keep-alive clients: e baseline, f protected, g baseline with the app's graceful shutdown,
//! h protected with it; w and x protected with the preStop `Wait` handler (docs/wait.md) at 0
//! and ST_EXP_SERVICES extra Services, each pod's wait from its kubelet's record of the hook's
//! end; and on request i baseline, j protected in the slow-sync regime,
//! ST_EXP_SLOW_SERVICES extra Services, 12,000 by default), ST_EXP_REPLICAS (6),
//! ST_EXP_RATE (200 per node per second), ST_EXP_ROLLOUTS (3 per strategy), ST_EXP_STRATEGIES
//! ("25%/0,25%/25%": maxSurge/maxUnavailable), ST_EXP_TIMEOUT_MS (1000), ST_EXP_SERVICES (4000
//! extra Services for c and d).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::rules::{RealNode, RuleReader, RuleTrace, follow_nft_monitor, now_unix, poll, real_nodes};
use common::wait_for;

const SYSTEM_NS: &str = "exp-system";
const HOOK: &str = "safe-termination-experiment";
const SCALE_NS: &str = "exp-scale";
/// The experiment's operator analyses the last 2 minutes (`--window-seconds`; the default is 10):
/// enough syncs during rollouts, and a protected run at scale need not wait long for the window
/// to forget the scale fixture's creation.
const OPERATOR_WINDOW_SECONDS: u64 = 120;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v}: not a valid value")),
        Err(_) => default,
    }
}

/// The test app's static binary (also the load generator), written by e2e/cluster/build-images.sh.
fn testapp_bin() -> PathBuf {
    if let Ok(p) = std::env::var("ST_TESTAPP_BIN") {
        return p.into();
    }
    let cache = std::env::var("ST_CACHE_DIR").unwrap_or_else(|_| format!("{}/.cache/safe-termination", std::env::var("HOME").unwrap()));
    let p = PathBuf::from(format!("{cache}/images/st-testapp"));
    assert!(p.exists(), "{}: run e2e/cluster/build-images.sh", p.display());
    p
}

/// Follows every node's rules until `stop` (common::rules: a failed read is no sample, a removal
/// is a successful read without the IP). iptables nodes are polled about every 50 ms (`iptables
/// -S` of the Service's chain: a few ms). nftables nodes are followed with `nft monitor rules`,
/// which prints each committed change of the Service's chain as it happens: polling `nft list
/// chain` costs 0.5 s at 4,000 Services (nft loads the whole table first), far too coarse for a
/// window of a second or two. Returns each node's trace, in the order of `nodes`.
fn spawn_samplers(nodes: &[RealNode], ns: &str, extra_services: usize, stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<RuleTrace>> {
    nodes
        .iter()
        .map(|node| {
            let mut reader = RuleReader::new(node.clone(), ns);
            let stop = stop.clone();
            let kind = reader_kind(node, extra_services);
            std::thread::spawn(move || match kind {
                "monitor" => follow_nft_monitor(&mut reader, &stop),
                "poll" => poll(&mut reader, &stop, Duration::from_millis(50)),
                _ => RuleTrace::default(),
            })
        })
        .collect()
}

/// How long the rule samplers run after the last rollout has ended (the load stops 4 s after
/// it). Longer than any window seen at 4,000 Services (10.1 s, on a machine at load 15-19,
/// docs/benchmarks/sizing.md "The window distribution model"). With a 4 s tail, the nftables node's sampler
/// (`nft monitor`) had not seen the removal of the last two pods deleted in a protected run at
/// 4,000 Services, and the run failed as "never seen removed". (A pod deleted 18 s before the
/// end was also never seen removed once: that was `nft monitor` losing netlink events, which
/// common::rules now follows with a full read.)
const SAMPLER_TAIL: Duration = Duration::from_secs(15);

/// Above this many extra Services an nftables node's rules are not sampled: nft loads the whole
/// table for any read. At 12,000 Services `nft list chain` of the one Service chain took 7 s,
/// 6 s of it kernel time, per read on an idle machine, and `nft monitor rules` printed none of
/// the chain's changes in a whole run (1 sample in 12 deletions, either way).
const NFT_READ_MAX_SERVICES: usize = 4000;

/// How a node's rules are sampled at `extra_services` (the `reader` column of groundtruth.csv):
/// `poll` (iptables), `monitor` (nftables) or `none` (nftables above
/// [`NFT_READ_MAX_SERVICES`]: the node has no ground truth in that run, said in meta.json
/// `unmeasuredNodes`).
fn reader_kind(node: &RealNode, extra_services: usize) -> &'static str {
    match (node.mode.as_str(), extra_services <= NFT_READ_MAX_SERVICES) {
        ("nftables", true) => "monitor",
        ("nftables", false) => "none",
        _ => "poll",
    }
}

// ------------------------------------------------------------------------------ the app

fn service(ns: &str) -> Service {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": ns},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}))
    .unwrap()
}

fn deployment(ns: &str, replicas: u32, graceful: bool) -> Value {
    let mut container = common::testapp_container("web");
    if graceful {
        // `st-testapp serve --graceful`: on SIGTERM it stops accepting, finishes what is in
        // flight (answers then say Connection: close) and closes idle connections
        container["args"] = json!(["--graceful"]);
    }
    let mut spec = common::on_real_nodes(json!({"enableServiceLinks": false, "containers": [container]}));
    // each ReplicaSet's pods spread over both real nodes
    spec["topologySpreadConstraints"] = json!([{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "web"}}, "matchLabelKeys": ["pod-template-hash"]}]);
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": spec}}})
}

fn int_or_percent(s: &str) -> Value {
    if s.ends_with('%') { json!(s) } else { json!(s.parse::<i64>().expect("maxSurge/maxUnavailable")) }
}

/// The preStop sleep seconds of a pod's first container (None: no native sleep).
/// Whether the pod's first container runs the waiter as its preStop hook (handler `Wait`).
fn has_waiter(p: &Pod) -> bool {
    let cmd = p.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.lifecycle.as_ref()?.pre_stop.as_ref()?.exec.as_ref()?.command.clone());
    cmd.and_then(|c| c.first().cloned()).as_deref() == Some(safe_termination::core::wait::WAITER_PATH)
}

fn pre_stop_sleep(p: &Pod) -> Option<i64> {
    p.spec.as_ref()?.containers.first()?.lifecycle.as_ref()?.pre_stop.as_ref()?.sleep.as_ref().map(|s| s.seconds)
}

/// Waits until the Deployment has `replicas` updated, ready pods and no other pod is left in the
/// namespace (the old ones have terminated).
async fn wait_rolled_out(client: &Client, ns: &str, replicas: u32, secs: u64) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for(&format!("rollout of {ns}/web"), secs, async || {
        let d = deployments.get("web").await.ok()?;
        let st = d.status?;
        let done = st.observed_generation >= d.metadata.generation
            && st.updated_replicas == Some(replicas as i32)
            && st.ready_replicas == Some(replicas as i32)
            && st.replicas == Some(replicas as i32);
        let n = pods.list(&Default::default()).await.ok()?.items.len();
        (done && n == replicas as usize).then_some(())
    })
    .await;
}

/// Waits until both nodes' rules hold exactly the IPs of the namespace's ready pods.
async fn wait_rules_match(client: &Client, nodes: &[RealNode], ns: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut readers: Vec<RuleReader> = nodes.iter().map(|n| RuleReader::new(n.clone(), ns)).collect();
    wait_for("pods' IPs in every node's rules", 120, async || {
        let want: BTreeSet<String> = pods.list(&Default::default()).await.ok()?.items.iter().filter_map(|p| p.status.as_ref()?.pod_ip.clone()).collect();
        readers.iter_mut().all(|r| r.endpoint_ips().is_ok_and(|got| got == want)).then_some(())
    })
    .await;
}

/// Waits until no kube-proxy has changes pending (after the scale fixture), then a little more.
async fn wait_proxies_idle(nodes: &[RealNode]) {
    let cluster: Value = serde_json::from_str(&common::read_state("cluster.json")).unwrap();
    let urls: Vec<String> = cluster["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| nodes.iter().any(|r| r.name == n["name"].as_str().unwrap_or("")))
        // a Cilium node has no kube-proxy
        .filter_map(|n| n["kube_proxy"]["metrics_url"].as_str().map(str::to_string))
        .collect();
    wait_for("kube-proxies without pending changes", 600, async || {
        for url in &urls {
            let text = reqwest::get(url).await.ok()?.text().await.ok()?;
            // the operator's own parser reads both gauges
            let scrape = safe_termination::core::exposition::parse_kube_proxy_metrics(&text).ok()?;
            let pending = scrape.endpoint_changes_pending.unwrap_or(0.0) + scrape.service_changes_pending.unwrap_or(0.0);
            if pending > 0.0 {
                return None;
            }
        }
        Some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
}

// ------------------------------------------------------------------------------ one run

/// A deleted pod, by name: (IP, node, when its deletion was seen (unix seconds), its preStop
/// sleep seconds (with the `Wait` handler: its wait as its kubelet logged the hook's end, from
/// the deletion), its terminationGracePeriodSeconds).
type Deletion = (String, String, f64, Option<f64>, Option<i64>);

struct RunSpec {
    name: &'static str,
    order: u32,
    protected: bool,
    /// The policy's preStop handler is `Wait` (docs/wait.md) instead of the sleep.
    wait: bool,
    extra_services: usize,
    /// The load generators keep their connections (`st-testapp load --keep-alive`).
    keep_alive: bool,
    /// The app drains on SIGTERM (`st-testapp serve --graceful`).
    graceful: bool,
}

struct Settings {
    out: PathBuf,
    replicas: u32,
    rate: u32,
    rollouts: u32,
    strategies: Vec<(String, String)>,
    timeout_ms: u32,
}

/// A command that runs inside `node`'s network namespace (its program is the next argument).
fn in_netns(node: &RealNode) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net=/run/netns/{}", node.netns));
    c
}

/// A command that runs inside `node`'s network namespace and, on a Cilium node, inside its
/// cgroup2 sub-tree (a child cgroup `st-load` made there): Cilium's socket LB load-balances
/// `connect()` only for processes in that sub-tree (e2e/cluster/cilium.sh), so a load generator
/// outside it would reach no Service. cluster-down removes the child cgroup with the node's.
fn in_node(node: &RealNode) -> Command {
    let Some(cg2) = &node.cgroup2 else { return in_netns(node) };
    let procs = format!("{cg2}/st-load/cgroup.procs");
    std::fs::create_dir_all(format!("{cg2}/st-load")).expect("the load generators' cgroup in the Cilium node's cgroup2 sub-tree");
    let mut c = Command::new("sh");
    c.args(["-c", &format!("echo $$ > {procs} && exec nsenter --net=/run/netns/{} \"$@\"", node.netns), "in_node"]);
    c
}

fn load_generator(node: &RealNode, target: &str, s: &Settings, keep_alive: bool, out: &Path) -> Child {
    let log = std::fs::File::create(out.with_extension("log")).unwrap();
    in_node(node)
        .arg(testapp_bin())
        .args(["load", "--target", target, "--rate-per-second", &s.rate.to_string(), "--timeout-ms", &s.timeout_ms.to_string()])
        .args(keep_alive.then_some("--keep-alive"))
        .args(["--expect-prefix", "web-", "--out"])
        .arg(out)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start the load generator")
}

/// Every new and destroyed conntrack entry towards the Service in the node's netns, timestamped
/// (`conntrack -E -e NEW,DESTROY -o timestamp`), into `out` (conntrack-NODE.txt): the report
/// joins a failed request's source port with them to find the pod it went to, and whether an
/// earlier attempt's entry held its tuple (e2e/experiment/report.py `classify_failures`). A
/// 16 MiB netlink buffer keeps events from being dropped at a few hundred connections a second.
/// On a Cilium node socket LB has already rewritten `connect()` to the chosen pod: the entries
/// go to the pods' port (8080) directly, with the pod as the reply's source all the same.
fn conntrack_monitor(node: &RealNode, cluster_ip: &str, out: &Path) -> Child {
    let towards: [&str; 2] = if node.is_cilium() { ["--dport", "8080"] } else { ["--orig-dst", cluster_ip] };
    let child = in_netns(node)
        .args(["conntrack", "-E", "-e", "NEW,DESTROY", "-p", "tcp", towards[0], towards[1], "-o", "timestamp", "--buffer-size", "16777216"])
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(std::fs::File::create(out.with_extension("log")).unwrap())
        .spawn()
        .expect("start conntrack -E (the conntrack package: e2e/toolchain/build-k8s.sh installs it)");
    // ahead of kube-proxy's rule restores for the CPU: starved at 12,000 Services, it lost
    // events (ENOBUFS in conntrack-NODE.log), leaving failures unattributed. Best effort: an
    // unprivileged run keeps the default priority
    // SAFETY: setpriority(2) on our own child's pid
    unsafe { libc::setpriority(libc::PRIO_PROCESS, child.id(), -10) };
    child
}

fn stop(child: &mut Child) {
    // SAFETY: kill(2) on our own child's pid
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

async fn run_one(client: &Client, nodes: &[RealNode], spec: &RunSpec, s: &Settings) -> Value {
    let ns = format!("exp-{}", spec.name);
    let dir = s.out.join("runs").join(spec.name);
    std::fs::create_dir_all(&dir).unwrap();
    println!("== run {} ({}protected, {} extra Services) in namespace {ns}", spec.name, if spec.protected { "" } else { "un" }, spec.extra_services);
    common::own_namespace(client, &ns).await;
    if spec.protected {
        common::register_webhook_at(client, &format!("{HOOK}-{}", spec.name), &ns, operator_webhook_url()).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let spec_json = if spec.wait { json!({"preStop": {"handler": "Wait"}}) } else { json!({}) };
        let policy: safe_termination::core::crd::TerminationPolicy = serde_json::from_value(json!({
            "apiVersion": "safetermination.io/v1alpha1", "kind": "TerminationPolicy",
            "metadata": {"name": "web", "namespace": ns}, "spec": spec_json}))
        .unwrap();
        Api::namespaced(client.clone(), &ns).create(&PostParams::default(), &policy).await.expect("create TerminationPolicy");
        // every kube-proxy scraped (a Cilium node has none: it is measured by observation)
        let kube_proxies = nodes.iter().filter(|n| !n.is_cilium()).count() as u64;
        common::wait_policy_status(client, &ns, "web", 120, "a recommendation from every kube-proxy node", |st| {
            st["recommendation"]["preStopSeconds"].is_u64() && st["measurement"]["nodesScraped"].as_u64() == Some(kube_proxies)
        })
        .await;
    }
    // the operator's view every 2 s while the run lasts (protected runs: the policy's status):
    // which W and which terms each pod was sized from at its admission
    let timeline_stop = Arc::new(AtomicBool::new(false));
    let timeline = spec.protected.then(|| {
        let (client, ns, stop) = (client.clone(), ns.clone(), timeline_stop.clone());
        tokio::spawn(async move {
            let mut points = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let st = common::policy_status_raw(&client, &ns, "web").await;
                let m = &st["measurement"];
                points.push(json!({"atUnix": now_unix(), "windowSeconds": m["propagationWindowSeconds"], "syncP99Seconds": m["syncP99Seconds"],
                    "networkProgrammingP99Seconds": m["networkProgrammingP99Seconds"], "worstNode": m["worstNode"], "histogramKind": m["histogramKind"],
                    "controlPlaneLagP99Seconds": m["controlPlaneLag"]["p99Seconds"], "controlPlaneLagSamples": m["controlPlaneLag"]["samples"],
                    "preStopSeconds": st["recommendation"]["preStopSeconds"],
                    "coverageRatio": st["recommendation"]["coverage"]["ratio"], "coverageLowestNodeRatio": st["recommendation"]["coverage"]["lowestNodeRatio"]}));
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            points
        })
    });
    let svc = Api::<Service>::namespaced(client.clone(), &ns).create(&PostParams::default(), &service(&ns)).await.expect("create Service");
    let cluster_ip = svc.spec.and_then(|s| s.cluster_ip).expect("ClusterIP");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deployments
        .patch("web", &PatchParams::apply("experiment").force(), &Patch::Apply(&deployment(&ns, s.replicas, spec.graceful)))
        .await
        .expect("apply Deployment");
    wait_rolled_out(client, &ns, s.replicas, 180).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    if spec.protected {
        let l = pods.list(&Default::default()).await.unwrap();
        if spec.wait {
            assert!(l.items.iter().all(has_waiter), "wait run: every pod has the injected waiter");
            // the kubelets log each preStop hook's end at verbosity 3: the yardstick of a wait
            for n in nodes {
                common::truth::kubelet_verbosity(&n.name, 3);
            }
        } else {
            assert!(l.items.iter().all(|p| pre_stop_sleep(p).is_some()), "protected run: every pod has the injected preStop sleep");
        }
    }
    wait_rules_match(client, nodes, &ns).await;

    // kube-proxy's histograms at the start of the run (protobuf first): with the scrape at
    // its end, W from native and from classic histograms over the same interval
    let scrapes_at_start = common::windows::scrape_real_nodes(nodes).await;
    // record: deletions (watch), the rules (samplers), every request (load generators)
    let started = now_unix();
    let deletions: Arc<Mutex<BTreeMap<String, Deletion>>> = Arc::default();
    let watch = {
        let (deletions, pods) = (deletions.clone(), pods.clone());
        tokio::spawn(async move {
            use futures::StreamExt;
            let mut st = std::pin::pin!(watcher(pods, watcher::Config::default()).applied_objects().default_backoff());
            while let Some(Ok(p)) = st.next().await {
                if p.metadata.deletion_timestamp.is_some() {
                    let t = now_unix();
                    let name = p.metadata.name.clone().unwrap_or_default();
                    let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default();
                    let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
                    let grace = p.spec.as_ref().and_then(|s| s.termination_grace_period_seconds);
                    deletions.lock().unwrap().entry(name).or_insert((ip, node, t, pre_stop_sleep(&p).map(|s| s as f64), grace));
                }
            }
        })
    };
    // the control plane's part of each deletion as this test sees it: when its own watch first
    // saw the pod's endpoint terminating (or gone from its slice), by pod name; independent of
    // the operator's watches, which measure the same lag for W
    let terminating: Arc<Mutex<BTreeMap<String, f64>>> = Arc::default();
    // by pod name, since when its endpoint has been listed not ready and not terminating (a
    // failed readiness probe; the entry goes when it is ready again)
    let not_ready: Arc<Mutex<BTreeMap<String, f64>>> = Arc::default();
    let slice_watch = {
        let (terminating, not_ready, deletions) = (terminating.clone(), not_ready.clone(), deletions.clone());
        let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> = Api::namespaced(client.clone(), &ns);
        tokio::spawn(async move {
            use futures::StreamExt;
            let mut listed: BTreeMap<String, ()> = BTreeMap::new();
            let mut st = std::pin::pin!(watcher(slices, watcher::Config::default()).applied_objects().default_backoff());
            while let Some(Ok(slice)) = st.next().await {
                let t = now_unix();
                let mut here = BTreeMap::new();
                for e in &slice.endpoints {
                    let Some(name) = e.target_ref.as_ref().and_then(|r| r.name.clone()) else { continue };
                    let is_terminating = e.conditions.as_ref().and_then(|c| c.terminating).unwrap_or(false);
                    if is_terminating {
                        terminating.lock().unwrap().entry(name.clone()).or_insert(t);
                    } else if e.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                        not_ready.lock().unwrap().entry(name.clone()).or_insert(t);
                    } else {
                        not_ready.lock().unwrap().remove(&name);
                    }
                    here.insert(name, ());
                }
                // a deleted pod's endpoint gone from the slice without a terminating state
                let deleted: Vec<String> = deletions.lock().unwrap().keys().cloned().collect();
                for name in deleted.into_iter().filter(|n| listed.contains_key(n) && !here.contains_key(n)) {
                    terminating.lock().unwrap().entry(name).or_insert(t);
                }
                listed.extend(here);
            }
        })
    };
    let stop_flag = Arc::new(AtomicBool::new(false));
    let samplers = spawn_samplers(nodes, &ns, spec.extra_services, stop_flag.clone());
    let target = format!("{cluster_ip}:80");
    let mut monitors: Vec<Child> = nodes.iter().map(|n| conntrack_monitor(n, &cluster_ip, &dir.join(format!("conntrack-{}.txt", n.name)))).collect();
    let mut loads: Vec<Child> = nodes.iter().map(|n| load_generator(n, &target, s, spec.keep_alive, &dir.join(format!("load-{}.csv", n.name)))).collect();
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut rollouts = Vec::new();
    let mut index = 0;
    for (surge, unavailable) in &s.strategies {
        for _ in 0..s.rollouts {
            index += 1;
            let t0 = now_unix();
            let patch = json!({"spec": {"strategy": {"rollingUpdate": {"maxSurge": int_or_percent(surge), "maxUnavailable": int_or_percent(unavailable)}},
                "template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": format!("{t0:.3}")}}}}});
            deployments.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("rollout restart");
            wait_rolled_out(client, &ns, s.replicas, 300).await;
            let t1 = now_unix();
            println!("   rollout {index} (maxSurge {surge}, maxUnavailable {unavailable}): {:.1} s", t1 - t0);
            rollouts.push(json!({"index": index, "maxSurge": surge, "maxUnavailable": unavailable, "startedAtUnix": t0, "finishedAtUnix": t1}));
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for l in &mut loads {
        stop(l);
    }
    // SIGTERM: conntrack flushes what it printed
    for m in &mut monitors {
        stop(m);
    }
    // the last rollout deletes its last old pods as it ends: the samplers follow the rules for
    // SAMPLER_TAIL after that, so that a node's removal that lands after the load stopped is
    // still seen (a removal later than that is "never seen removed" and fails the run)
    tokio::time::sleep(SAMPLER_TAIL.saturating_sub(Duration::from_secs(4))).await;
    stop_flag.store(true, Ordering::Relaxed);
    let traces: Vec<RuleTrace> = samplers.into_iter().map(|h| h.join().unwrap()).collect();
    watch.abort();
    slice_watch.abort();
    let finished = now_unix();
    // the control plane's part of each deletion as this test's own watches saw it
    let lags: Vec<f64> = {
        let (deletions, terminating) = (deletions.lock().unwrap(), terminating.lock().unwrap());
        deletions.iter().filter_map(|(pod, d)| terminating.get(pod).map(|t| (t - d.2).max(0.0))).collect()
    };
    let windows_from_scrapes = common::windows::windows_both_kinds(&scrapes_at_start, &common::windows::scrape_real_nodes(nodes).await, 1.0, &lags);

    // the operator's view at the end of the run, as stored (fields this crate's types do not
    // know yet, such as status.measurement.histogramKind, are kept)
    let status = if spec.protected { common::policy_status_raw(client, &ns, "web").await } else { Value::Null };
    timeline_stop.store(true, Ordering::Relaxed);
    let operator_timeline = match timeline {
        Some(t) => json!(t.await.unwrap_or_default()),
        None => Value::Null,
    };
    let mut deletions = deletions.lock().unwrap().clone();
    if spec.wait {
        // each pod's wait: from its deletion (this test's watch) to the end of its preStop hook
        // as its kubelet logged it (None: not logged, a failed measurement the report names)
        for (pod, d) in deletions.iter_mut() {
            d.3 = common::truth::prestop_completed(&d.1, &ns, pod).map(|end| ((end - d.2) * 1000.0).round() / 1000.0);
        }
        for n in nodes {
            common::truth::kubelet_verbosity(&n.name, 1);
        }
    }
    let terminating = terminating.lock().unwrap().clone();
    // deletions.csv: pod, its IP and node, when the watch saw its deletion (unix seconds), its
    // preStop sleep and terminationGracePeriodSeconds (seconds; empty when it had none), when
    // the EndpointSlice watch saw its endpoint terminating (unix seconds; empty when never)
    let opt = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_default();
    let opt_f = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    let mut csv = String::from("pod,ip,node,deleted_at_unix,sleep_seconds,grace_seconds,endpoint_terminating_at_unix\n");
    for (pod, (ip, node, t, sleep, grace)) in &deletions {
        let seen = terminating.get(pod).map(|t| format!("{t:.6}")).unwrap_or_default();
        writeln!(csv, "{pod},{ip},{node},{t:.6},{},{},{seen}", opt_f(*sleep), opt(*grace)).unwrap();
    }
    std::fs::write(dir.join("deletions.csv"), csv).unwrap();
    // groundtruth.csv, per deleted pod and node: removed_at_unix is the end of the first
    // successful read that no longer showed its IP, last_present_at_unix the start of the last
    // successful read that still did (the removal happened in between; both empty when no
    // successful read saw it go: a failed measurement), reader `poll` or `monitor`. 0.5 s of
    // slack before the deletion: the watch sees it a little after the API server. A pod whose
    // endpoint this test's slice watch saw not ready before its deletion (a ReplicaSet deletes
    // not-ready pods first) may have left a node's rules earlier: when that node's rules were
    // without its IP from then through the deletion, that removal is its window there (at most
    // 0: no new connection reached the pod through that node after its deletion)
    let not_ready = not_ready.lock().unwrap().clone();
    let mut csv = String::from("pod,ip,proxy_node,removed_at_unix,last_present_at_unix,reader\n");
    // per node, the removals an nft monitor never showed, taken from its confirming full reads
    let mut monitor_missed: BTreeMap<String, u64> = BTreeMap::new();
    for (pod, (ip, _, t_del, _, _)) in &deletions {
        let not_ready_since = not_ready.get(pod).filter(|t| **t < *t_del);
        for (n, trace) in nodes.iter().zip(&traces).filter(|(n, _)| reader_kind(n, spec.extra_services) != "none") {
            let removal = (!ip.is_empty()).then(|| trace.removal(ip, t_del - 0.5)).flatten().or_else(|| {
                let t_nr = *not_ready_since?;
                let before = trace.absent_since(ip, t_nr - 0.5, t_del - 0.5)?;
                println!(
                    "   {pod}: its endpoint was not ready {:.3} s before its deletion and left {}'s rules {:.3} s before it",
                    t_del - t_nr,
                    n.name,
                    t_del - before.by
                );
                Some(before)
            });
            if let Some(r) = trace.removal_missed_by_monitor(ip, t_del - 0.5) {
                println!(
                    "   {pod}: {}'s nft monitor never showed its removal; the full read after the chain's next change did, {:.3} s after the deletion",
                    n.name,
                    r.by - t_del
                );
                *monitor_missed.entry(n.name.clone()).or_default() += 1;
            }
            let (by, after) = removal.map(|r| (format!("{:.6}", r.by), format!("{:.6}", r.after))).unwrap_or_default();
            writeln!(csv, "{pod},{ip},{},{by},{after},{}", n.name, reader_kind(n, spec.extra_services)).unwrap();
        }
    }
    std::fs::write(dir.join("groundtruth.csv"), csv).unwrap();
    let sleeps: Vec<f64> = deletions.values().filter_map(|d| d.3).collect();
    let graces: Vec<i64> = deletions.values().filter_map(|d| d.4).collect();
    let per_node = |f: &dyn Fn(&RuleTrace) -> Value| nodes.iter().zip(&traces).map(|(n, t)| (n.name.clone(), f(t))).collect::<serde_json::Map<_, _>>();
    let meta = json!({
        "name": spec.name, "order": spec.order, "protected": spec.protected, "keepAlive": spec.keep_alive, "graceful": spec.graceful,
        "proxyModes": nodes.iter().map(|n| n.mode.clone()).collect::<Vec<_>>(),
        "nodeModes": nodes.iter().map(|n| (n.name.clone(), json!(n.mode))).collect::<serde_json::Map<_, _>>(),
        "extraServices": spec.extra_services, "replicas": s.replicas, "ratePerNodePerSecond": s.rate, "timeoutMs": s.timeout_ms,
        "startedAtUnix": started, "finishedAtUnix": finished, "rollouts": rollouts,
        "injectedSleepSeconds": if spec.protected { json!(sleeps.iter().copied().reduce(f64::max)) } else { Value::Null },
        // the preStop handler of a protected run: `Wait` (each pod's "sleep" is then its
        // measured wait) or the sleep
        "handler": if spec.wait { "Wait" } else if spec.protected { "Sleep" } else { "none" },
        "terminationGracePeriodSeconds": graces.iter().max(),
        "measuredWindowSeconds": status["measurement"]["propagationWindowSeconds"],
        // which kind of histogram the operator's p99 came from (`native` or `classic`); null
        // from an operator that does not say
        "histogramKind": status["measurement"]["histogramKind"],
        // the removals the operator's node agents observed (its rolling window's)
        "observedRemovals": status["measurement"]["observedRemovals"],
        // W over the run from two scrapes of every node (its start and end), native and classic
        // from the same scrapes (minSyncPeriod 1 s): how far the doubling classic buckets
        // inflate it
        "windowFromScrapes": windows_from_scrapes,
        "operatorWindowDetail": {"measurement": status["measurement"], "recommendation": status["recommendation"], "proxy": status["proxy"],
            "advice": status["advice"], "conditions": status["conditions"]},
        // the operator's per-node sync p99 at the end of the run, from its own /metrics
        // (`safe_termination_kube_proxy_sync_p99_seconds`), in every run: it measures throughout
        "operatorSyncP99Seconds": operator_sync_p99(nodes).await,
        // protected runs: the policy's W, its terms on the worst node and the recommended sleep,
        // every 2 s from before the Deployment was applied to the end of the run
        "operatorTimeline": operator_timeline,
        // successful reads (polls, monitored changes and the full reads between monitors) and
        // failed ones per node; the first failures' messages
        "ruleSamples": traces.iter().map(|t| t.reads).collect::<Vec<_>>(),
        "ruleReads": per_node(&|t| json!(t.reads)),
        "failedReads": per_node(&|t| json!(t.failed_reads)),
        // `nft monitor`'s reports of lost netlink events, each followed by a full read
        "lostMonitorEvents": per_node(&|t| json!(t.lost_events)),
        "removalsOnlyInConfirmingReads": monitor_missed,
        // nodes without a ground truth in this run, and why (reader_kind)
        "unmeasuredNodes": nodes.iter().filter(|n| reader_kind(n, spec.extra_services) == "none")
            .map(|n| (n.name.clone(), json!(format!("nftables at {} extra Services: each nft read loads the whole table (7 s at 12,000)", spec.extra_services))))
            .collect::<serde_json::Map<_, _>>(),
        "readErrors": per_node(&|t| json!(t.errors)),
    });
    std::fs::write(dir.join("meta.json"), serde_json::to_string_pretty(&meta).unwrap()).unwrap();
    println!(
        "   {} pods deleted; rule reads per node {}, failed {}, nft monitor lost events {}",
        deletions.len(),
        meta["ruleReads"],
        meta["failedReads"],
        meta["lostMonitorEvents"]
    );
    for (n, t) in nodes.iter().zip(&traces) {
        for e in &t.errors {
            println!("   {}: failed read: {e}", n.name);
        }
    }
    // the namespace's teardown deletes its pods, then its Service: waited for, so that the next
    // run does not start inside it. The operator counts a teardown's removals until it sees the
    // Service's deletion (the teardown rule of src/core/removals.rs): for those few seconds they
    // raised its W from 1.7 s to 3.3 s and two of the next run's sleeps from 3 s to 5 s
    let namespaces = Api::<Namespace>::all(client.clone());
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
    let teardown = Instant::now();
    common::wait_for(&format!("namespace {ns} gone"), 180, async || namespaces.get_opt(&ns).await.ok().filter(Option::is_none).map(|_| ())).await;
    println!("   namespace {ns} deleted in {:.1} s", teardown.elapsed().as_secs_f64());
    meta
}

/// The operator's `safe_termination_kube_proxy_sync_p99_seconds` per node of `nodes`, from its
/// /metrics: `{node: seconds}`; a node it has no value for (or /metrics unread) is left out.
async fn operator_sync_p99(nodes: &[RealNode]) -> Value {
    let url = format!("http://127.0.0.1:{}/metrics", OPERATOR_ADMIN.get().expect("operator started"));
    let text = match reqwest::get(&url).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    nodes
        .iter()
        .filter_map(|n| {
            let p99 = common::metric_sum(&text, "safe_termination_kube_proxy_sync_p99_seconds", &[&format!("node=\"{}\"", n.name)])?;
            Some((n.name.clone(), json!(p99)))
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

static OPERATOR_WEBHOOK: std::sync::OnceLock<String> = std::sync::OnceLock::new();
/// The experiment's operator's admin port (/metrics).
static OPERATOR_ADMIN: std::sync::OnceLock<u16> = std::sync::OnceLock::new();
fn operator_webhook_url() -> &'static str {
    OPERATOR_WEBHOOK.get().expect("operator started")
}

/// The runs of `list` (letters a to j), sorted by their extra Services (stable): the scale
/// fixture only grows during an experiment.
fn run_specs(list: &str, services: usize, slow_services: usize) -> Vec<RunSpec> {
    let mut specs: Vec<RunSpec> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s {
            "a" => RunSpec { name: "a-baseline", order: 1, protected: false, wait: false, extra_services: 0, keep_alive: false, graceful: false },
            "b" => RunSpec { name: "b-protected", order: 2, protected: true, wait: false, extra_services: 0, keep_alive: false, graceful: false },
            "c" => RunSpec { name: "c-baseline-scale", order: 3, protected: false, wait: false, extra_services: services, keep_alive: false, graceful: false },
            "d" => RunSpec { name: "d-protected-scale", order: 4, protected: true, wait: false, extra_services: services, keep_alive: false, graceful: false },
            // keep-alive clients, against the app without graceful shutdown and with it
            "e" => RunSpec { name: "e-baseline-keepalive", order: 5, protected: false, wait: false, extra_services: 0, keep_alive: true, graceful: false },
            "f" => RunSpec { name: "f-protected-keepalive", order: 6, protected: true, wait: false, extra_services: 0, keep_alive: true, graceful: false },
            "g" => {
                RunSpec { name: "g-baseline-keepalive-graceful", order: 7, protected: false, wait: false, extra_services: 0, keep_alive: true, graceful: true }
            }
            "h" => {
                RunSpec { name: "h-protected-keepalive-graceful", order: 8, protected: true, wait: false, extra_services: 0, keep_alive: true, graceful: true }
            }
            // the slow-sync regime: enough Services that node-a's iptables-nft sync p99 exceeds 1 s
            "i" => RunSpec {
                name: "i-baseline-slow-sync",
                order: 9,
                protected: false,
                wait: false,
                extra_services: slow_services,
                keep_alive: false,
                graceful: false,
            },
            "j" => RunSpec {
                name: "j-protected-slow-sync",
                order: 10,
                protected: true,
                wait: false,
                extra_services: slow_services,
                keep_alive: false,
                graceful: false,
            },
            // the preStop Wait handler as a third arm beside a/b and c/d
            "w" => RunSpec { name: "w-wait", order: 11, protected: true, wait: true, extra_services: 0, keep_alive: false, graceful: false },
            "x" => RunSpec { name: "x-wait-scale", order: 12, protected: true, wait: true, extra_services: services, keep_alive: false, graceful: false },
            other => panic!("ST_EXP_RUNS: unknown run '{other}' (a to j, w, x)"),
        })
        .collect();
    specs.sort_by_key(|s| s.extra_services);
    specs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_experiment() {
    let client = common::client().await;
    let nodes = real_nodes();
    let out = PathBuf::from(std::env::var("ST_EXP_OUT").unwrap_or_else(|_| format!("{}/experiment", common::state_dir())));
    let strategies: Vec<(String, String)> = std::env::var("ST_EXP_STRATEGIES")
        .unwrap_or_else(|_| "25%/0,25%/25%".into())
        .split(',')
        .map(|s| {
            let (a, b) = s.split_once('/').expect("ST_EXP_STRATEGIES: maxSurge/maxUnavailable,...");
            (a.trim().to_string(), b.trim().to_string())
        })
        .collect();
    let s = Settings {
        out: out.clone(),
        replicas: env_or("ST_EXP_REPLICAS", 6),
        rate: env_or("ST_EXP_RATE", 200),
        rollouts: env_or("ST_EXP_ROLLOUTS", 3),
        strategies,
        timeout_ms: env_or("ST_EXP_TIMEOUT_MS", 1000),
    };
    let services: usize = env_or("ST_EXP_SERVICES", 4000);
    let slow_services: usize = env_or("ST_EXP_SLOW_SERVICES", 12000);
    let specs = run_specs(&std::env::var("ST_EXP_RUNS").unwrap_or_else(|_| "a,b,c,d,e,f,g,h,w,x".into()), services, slow_services);
    let _ = std::fs::remove_dir_all(out.join("runs"));
    std::fs::create_dir_all(&out).unwrap();

    // the operator measures the real kube-proxies for the whole experiment, as in a cluster
    common::apply_crd(&client).await;
    common::own_namespace(&client, SYSTEM_NS).await;
    // with node agents on both nodes observing every removal (common::agents)
    let agents = common::agents::NodeAgents::start().await;
    // its webhook where the pods' waiters reach it too (the wait runs: docs/wait.md)
    let endpoint = common::wait_endpoint::WaitEndpoint::create(&client, SYSTEM_NS).await;
    let mut extra: Vec<&str> = agents.operator_args.iter().map(String::as_str).collect();
    extra.extend(endpoint.operator_args.iter().map(String::as_str));
    let op = endpoint.start_operator(SYSTEM_NS, OPERATOR_WINDOW_SECONDS, &extra).await;
    OPERATOR_WEBHOOK.set(endpoint.mutate_url()).unwrap();
    OPERATOR_ADMIN.set(op.admin).unwrap();
    // how many extra Services the scale fixture holds now (s0, s1, ...)
    let mut scale_services = 0;
    // when the scale fixture's creation storm ended: a protected run at scale waits until the
    // operator's rolling window no longer holds it (see below)
    let mut storm_ended: Option<Instant> = None;
    for spec in &specs {
        if spec.extra_services > scale_services {
            // the fixture of an earlier experiment on this cluster is reused and grown; one
            // larger than this run needs is made again
            let have = Api::<Service>::namespaced(client.clone(), SCALE_NS).list(&Default::default()).await.map_or(0, |l| l.items.len());
            let from = if have > spec.extra_services {
                common::fresh_namespace(&client, SCALE_NS).await;
                0
            } else {
                if have == 0 {
                    common::fresh_namespace(&client, SCALE_NS).await;
                }
                have
            };
            if from < spec.extra_services {
                let t0 = Instant::now();
                common::create_services(&client, SCALE_NS, from..spec.extra_services).await;
                println!("== created Services s{from} to s{} with endpoints in {:.1} s", spec.extra_services - 1, t0.elapsed().as_secs_f64());
            }
            println!("== waiting for the kube-proxies to sync {} extra Services", spec.extra_services);
            wait_proxies_idle(&nodes).await;
            scale_services = spec.extra_services;
            storm_ended = Some(Instant::now());
        }
        // The experiment measures a cluster that HAS thousands of Services, not one creating
        // them: syncs during the creation of 4,000 Services at once are the slowest kube-proxy
        // ever does (3 to 4 s here) and would size the sleep from a storm that is over. A real
        // operator's window forgets such a storm after --window-seconds; so does this one's
        // before a protected run at scale (docs/benchmarks/deploy-errors.md "Deploy errors" shows W with the storm
        // in the window, too).
        if spec.protected
            && spec.extra_services > 0
            && let Some(t) = storm_ended
        {
            let forget = Duration::from_secs(OPERATOR_WINDOW_SECONDS + 10);
            if let Some(left) = forget.checked_sub(t.elapsed()) {
                println!(
                    "== waiting {:.0} s until the operator's {} s window no longer holds the Services' creation",
                    left.as_secs_f64(),
                    OPERATOR_WINDOW_SECONDS
                );
                tokio::time::sleep(left).await;
            }
        }
        run_one(&client, &nodes, spec, &s).await;
    }
    drop(op);
    drop(agents);
    for spec in specs.iter().filter(|s| s.protected) {
        let _ = Api::<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>::all(client.clone())
            .delete(&format!("{HOOK}-{}", spec.name), &DeleteParams::default())
            .await;
    }
    if scale_services > 0 && std::env::var("ST_EXP_KEEP_SCALE").is_err() {
        // leave a small cluster behind: the tests after this one measure it (e2e/run-e2e.sh)
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let _ = namespaces.delete(SCALE_NS, &DeleteParams::default()).await;
        wait_for("the scale fixture's namespace to be gone", 600, async || namespaces.get_opt(SCALE_NS).await.ok()?.is_none().then_some(())).await;
        println!("== {SCALE_NS} deleted; waiting for the kube-proxies to sync it");
        wait_proxies_idle(&nodes).await;
    }

    // the report, then what the product promises; report.py's tables go to results.md, which
    // experiment.sh prints once after this test, so its stdout is not repeated here (its
    // warnings and errors, on stderr, are)
    let status = Command::new("python3").arg("e2e/experiment/report.py").arg(&out).stdout(Stdio::null()).status().expect("python3");
    assert!(status.success(), "report.py failed");
    let results: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    // every broken promise of every run, reported together, and the promises that held (the
    // verdict experiment.sh prints after the table: verdict.txt)
    let mut broken: Vec<String> = Vec::new();
    let mut held: Vec<String> = Vec::new();
    for run in results["runs"].as_array().unwrap() {
        let broken_before = broken.len();
        let name = run["name"].as_str().unwrap();
        let failures = run["failures"].as_u64().unwrap();
        assert!(run["requests"].as_u64().unwrap() > 0, "{name}: no requests recorded");
        // results.json's `pods`: per deleted pod its sleep and its window per node (seconds from
        // its deletion to the first successful read without its IP), `maxWindowSeconds` the
        // slowest node, null when some node's rules were never seen without the IP
        let pods = run["pods"].as_array().expect("results.json: pods");
        let missing: Vec<String> =
            pods.iter().filter(|p| p["maxWindowSeconds"].is_null()).map(|p| format!("{} (never seen removed on {})", p["name"], p["missingNodes"])).collect();
        if !missing.is_empty() {
            // no successful read without the IP: the ground truth is missing, not fine
            broken.push(format!("{name}: failed measurements: {missing:?}; failed reads per node {}", run["failedReads"]));
        } else {
            held.push(format!("{name}: every deleted pod's removal was seen on every node ({} pods)", pods.len()));
        }
        let operator_w = match (run["measuredWindowSeconds"].as_f64(), run["histogramKind"].as_str()) {
            (Some(w), Some(kind)) => format!("W {w} s ({kind} histograms)"),
            (Some(w), None) => format!("W {w} s"),
            (None, _) => "no W (no policy in an unprotected run)".to_string(),
        };
        println!(
            "{name}: {} pods, windows min {} s, p99 {} s, max {} s; {operator_w}; failed reads per node {}",
            pods.len(),
            run["podWindowMinSeconds"],
            run["podWindowP99Seconds"],
            run["podWindowMaxSeconds"],
            run["failedReads"]
        );
        let ws = &run["windowFromScrapes"];
        println!(
            "{name}: W over the run from the same scrapes: native {} s, classic {} s, the model before (native) {} s; after the control plane's part {} s (a sum of p99s {} s); the control plane's part p99 {} s over {} pods, correlation with the rest {}",
            ws["nativeSeconds"],
            ws["classicSeconds"],
            ws["nativeBeforeSeconds"],
            ws["nativeWithLagSeconds"],
            ws["nativeSumOfP99sSeconds"],
            run["controlPlaneLag"]["p99Seconds"],
            run["controlPlaneLag"]["samples"],
            run["controlPlaneLag"]["correlation"]
        );
        // the model's accuracy: W from this run's own syncs within 2 x this run's largest window
        // the run's largest window: its slowest pod on its slowest node. W is the operator's
        // model: after the run's own deletions' control-plane lag (the test's watches), which
        // takes network programming out of W (src/core/model.rs); without a lag measured, W
        // without it
        let largest = pods.iter().filter_map(|p| p["maxWindowSeconds"].as_f64()).fold(0.0, f64::max);
        let (model_w, which) = match ws["nativeWithLagSeconds"].as_f64() {
            Some(w) => (Some(w), "after the control plane's part"),
            None => (ws["nativeSeconds"].as_f64(), "no control-plane lag measured"),
        };
        if let Some(w) = model_w
            && largest > 0.0
            && w > f64::max(3.0, 2.0 * largest)
        {
            broken.push(format!("{name}: W over the run's own interval {w} s ({which}) > max(3 s, 2 x its largest window {largest} s)"));
        } else if let Some(w) = model_w {
            held.push(format!("{name}: W over the run's own interval {w:.3} s ({which}) is within max(3 s, 2 x its largest window {largest:.3} s)"));
        }
        if run["protected"] == true {
            let c = &run["coverage"];
            println!(
                "{name}: coverage predicted {} at least (lowest node {}), observed {} of {} (pod, node) windows and {} of {} pods within their sleep",
                c["predictedRatioMin"], c["predictedLowestNodeRatioMin"], c["observedPairRatio"], c["pairs"], c["observedPodRatio"], c["pods"]
            );
            // per cause (results.json failuresByCause): the sleep removes the race, so a
            // protected run has none; pinned tuples, SYNs dropped by live pods and other
            // failures are counted, not the sleep's to remove (docs/model.md "What the sleep
            // does not fix"); a failure without a conntrack record cannot be shown not to be
            // the race, so it counts against the run too
            let cause = |c: &str| run["failuresByCause"][c].as_u64().unwrap_or(0);
            // failures without a conntrack record on a node without a ground truth
            // (unmeasuredNodes: nftables at 12,000 Services) cannot be shown either way: they
            // are reported, not held against the run; on a measured node they are
            let unmeasured = run["unmeasuredNodes"].as_object().cloned().unwrap_or_default();
            let unattributed_measured: u64 =
                run["unattributedByNode"].as_object().into_iter().flatten().filter(|(n, _)| !unmeasured.contains_key(*n)).filter_map(|(_, v)| v.as_u64()).sum();
            if cause("race") > 0 || unattributed_measured > 0 {
                broken.push(format!(
                    "{name}: a protected run failed {failures} requests, {} of them the race and {unattributed_measured} unattributed on nodes with a ground truth: {} ({}; unattributed per node {})",
                    cause("race"), run["failuresByCause"], run["failuresByCauseAndOutcome"], run["unattributedByNode"]
                ));
            } else {
                held.push(format!("{name}: no request failed by the race ({failures} failed, by cause {})", run["failuresByCause"]));
            }
            println!("{name}: {failures} failed requests by cause {}", run["failuresByCause"]);
            // every protected pod's own sleep covers its own window on the slowest node
            let uncovered_before = broken.len();
            for p in pods {
                let (sleep, window) = (p["sleepSeconds"].as_f64(), p["maxWindowSeconds"].as_f64());
                match (sleep, window) {
                    (None, _) if run["handler"] == "Wait" => {
                        broken.push(format!("{name}: pod {}: no wait measured (its kubelet logged no end of its preStop hook)", p["name"]))
                    }
                    (None, _) => broken.push(format!("{name}: pod {} got no preStop sleep", p["name"])),
                    (Some(s), Some(w)) if s < w => broken.push(format!("{name}: pod {}: sleep {s} s < its window {w} s ({})", p["name"], p["windowSeconds"])),
                    _ => {}
                }
            }
            if broken.len() == uncovered_before {
                held.push(format!("{name}: every pod's own sleep covered its own window on the slowest node ({} pods)", pods.len()));
            }
            if run["handler"] == "Wait" {
                // the wait for the fact, not more: each pod's wait (its kubelet's record) less its
                // slowest node's window (the late end of the rule reads); reported, the issue's
                // target being a median within 0.5 s
                let mut over: Vec<f64> = pods.iter().filter_map(|p| Some(p["sleepSeconds"].as_f64()? - p["maxWindowSeconds"].as_f64()?)).collect();
                over.sort_by(f64::total_cmp);
                let median = if over.is_empty() { f64::NAN } else { (over[(over.len() - 1) / 2] + over[over.len() / 2]) / 2.0 };
                held.push(format!(
                    "{name}: the waits exceeded their pod's slowest window by {median:.3} s at the median (target 0.5 s; min {:.3}, max {:.3} s over {} pods)",
                    over.first().copied().unwrap_or(f64::NAN),
                    over.last().copied().unwrap_or(f64::NAN),
                    over.len()
                ));
            }
            let sleep = pods.iter().filter_map(|p| p["sleepSeconds"].as_f64()).fold(0.0, f64::max);
            // not wasteful. The target was sleep <= max(3 s, 2 x this run's largest window).
            // That is out of reach for a sleep sized from the window measured before the pod was
            // admitted: on this machine the true window changed by up to 2 x between two
            // consecutive runs at the same number of Services (4.07 s in a baseline, 1.96 s in
            // the protected run after it; 3.57 s then 2.57 s: docs/benchmarks/sizing.md "The window
            // distribution model"), so covering the regime just measured puts the sleep past 2 x
            // the next run's window. What is asserted instead, and reported beside the 2 x
            // verdict: (1) the model's accuracy, W over this run's own interval from the same
            // scrapes (native) <= 2 x this run's largest window; (2) the sleep <= max(3 s,
            // ceil(safetyFactor x 2 x the largest window at this number of Services in any run
            // of the experiment)), the sizing of a W within 2 x of the regime the operator saw
            let kind = run["histogramKind"].as_str();
            let truth = run["maxGroundTruthAtScaleSeconds"].as_f64().unwrap_or(largest);
            let own = f64::max(3.0, 2.0 * largest);
            println!(
                "{name}: sleep {sleep} s = {:.2} x the largest window {largest} s ({} histograms; 2 x own window {}: {own:.3} s)",
                sleep / largest,
                kind.unwrap_or("unreported"),
                if sleep <= own + 1e-9 { "within" } else { "EXCEEDED" }
            );
            if kind == Some("native") {
                // the experiment's policy has an empty spec: the default safety factor
                let factor = safe_termination::core::crd::PreStopSpec::default().safety_factor;
                let limit = f64::max(3.0, (factor * 2.0 * truth - 1e-6).ceil());
                if sleep > limit {
                    broken.push(format!(
                        "{name}: sleep {sleep} s > max(3 s, ceil({factor} x 2 x the largest window at this scale {truth} s)) = {limit} s (native histograms)"
                    ));
                } else {
                    held.push(format!(
                        "{name}: the sleep {sleep} s is within max(3 s, ceil({factor} x 2 x the largest window at this scale {truth} s)) = {limit} s"
                    ));
                }
            } else if sleep > f64::max(3.0, (3.0 * truth - 1e-6).ceil()) {
                // classic sync buckets double (0.001 x 2^k s): a p99 inside one can read up to
                // 2 x the true one
                broken.push(format!("{name}: sleep {sleep} s > max(3 s, ceil(3 x {truth} s)) ({} histograms)", kind.unwrap_or("unreported")));
            }
            // W itself (before the safety factor and the 3 s floor) is a p99: it covers the run's
            // per-pod windows but the few above a p99. With n pods the interpolated p99 of their
            // windows is almost the largest, which an exact p99 falls below in 1 - 0.99^n of
            // runs (11.4 % at 12 pods, 5.9 % at 6); so W must cover the k-th largest window,
            // k the smallest rank an exact p99 falls below in at most 1 % of runs
            // (`common::truth::p99_check_rank`: 2 for 6 to 14 pods, 0.6 % at 12)
            let mut windows: Vec<f64> = pods.iter().filter_map(|p| p["maxWindowSeconds"].as_f64()).collect();
            windows.sort_by(|a, b| b.total_cmp(a));
            let k = common::truth::p99_check_rank(windows.len());
            let rank = match k {
                1 => "the largest".to_string(),
                2 => "the second largest".to_string(),
                3 => "the third largest".to_string(),
                _ => format!("the {k}th largest"),
            };
            match (run["measuredWindowSeconds"].as_f64(), windows.get(k - 1)) {
                (Some(w), Some(&kth)) if w < kth => {
                    broken.push(format!("{name}: W {w} s < {rank} of {} per-pod windows, {kth} s (their p99 {} s)", windows.len(), run["podWindowP99Seconds"]))
                }
                (None, _) => broken.push(format!("{name}: no W in the policy's status")),
                (_, None) => broken.push(format!("{name}: no per-pod window to compare W with")),
                (Some(w), Some(&kth)) => held.push(format!(
                    "{name}: W {w} s covers {rank} of {} per-pod windows, {kth} s (their p99 {} s: {})",
                    windows.len(),
                    run["podWindowP99Seconds"],
                    if run["wCoversP99"] == true { "covered too" } else { "not covered, as an exact p99 is in 1 - 0.99^n of runs" }
                )),
            }
            // live proof of coverage: the operator's own observation of the removals (its rolling
            // window's, this run's among them) says every pod's sleep covered its window
            let observed = &run["observedRemovals"];
            match observed["coverageRatio"].as_f64() {
                Some(c) if c < 1.0 => broken.push(format!("{name}: observed coverage {c} < 1 (worst miss {})", observed["worstMiss"])),
                Some(c) => held.push(format!(
                    "{name}: the operator observed {} removals (p99 {} s, {} coarse, {} censored; p99 per data plane: {}), coverage {c}",
                    observed["removals"],
                    observed["p99Seconds"],
                    observed["coarse"],
                    observed["censored"],
                    observed["dataPlanesSummary"].as_str().unwrap_or("none named")
                )),
                // every removal bounded too coarsely to say (slow listings at thousands of
                // Services): reported, not a failure of the sleep
                None if observed["removals"].as_u64().unwrap_or(0) > 0 => held.push(format!(
                    "{name}: the operator observed {} removals, none bounded within 0.5 s by a fresh read ({} coarse): no observed coverage to check",
                    observed["removals"], observed["coarse"]
                )),
                None => broken.push(format!("{name}: no observed removals in the policy's status ({observed})")),
            }
        } else if run["keepAlive"] == true {
            // keep-alive baselines: what breaks is mostly the connections themselves
            // (keepAlive), which no sleep is for; reported, not required
            println!("{name}: {failures} failed requests by cause {}", run["failuresByCause"]);
        } else if std::env::var("ST_EXP_REQUIRE_BASELINE_FAILURES").map(|v| v != "0").unwrap_or(true) {
            // sensitive enough for each proxy mode: every node's load generator saw failures
            for (mode, n) in run["failuresByProxyMode"].as_object().expect("failuresByProxyMode") {
                if n.as_u64().unwrap() == 0 {
                    broken.push(format!("{name}: no failed request through the {mode} node: the experiment is not sensitive enough"));
                }
            }
            if failures == 0 {
                broken.push(format!("{name}: the baseline failed no request: the experiment is not sensitive enough"));
            }
            // the failures the sleep is for: new connections to pods that stopped serving
            let race = run["failuresByCause"]["race"].as_u64().unwrap_or(0);
            println!("{name}: {failures} failed requests by cause {}", run["failuresByCause"]);
            if failures > 0 && race == 0 {
                broken
                    .push(format!("{name}: no failure of the baseline was the race ({}): the attribution or the experiment is broken", run["failuresByCause"]));
            }
            if broken.len() == broken_before {
                held.push(format!("{name}: the baseline failed {failures} requests through every proxy mode, {race} of them the race"));
            }
        }
        if name.contains("slow-sync") {
            slow_sync_regime(run, &mut broken);
        }
    }
    // the verdict in words, for experiment.sh to print after the table
    let mut verdict = String::new();
    for h in &held {
        writeln!(verdict, "held:   {h}").unwrap();
    }
    for b in &broken {
        writeln!(verdict, "BROKEN: {b}").unwrap();
    }
    std::fs::write(out.join("verdict.txt"), verdict).unwrap();
    assert!(broken.is_empty(), "{} broken:\n{}\n(results: {})", broken.len(), broken.join("\n"), out.join("results.json").display());
}

/// A run of the slow-sync regime (i, j): it only shows the regime if the iptables node's sync
/// p99, as the operator measured it (its metric), is above ProxySyncSlow's 1 s, and the
/// nftables node's below it. In the protected run the policy's status says so: the
/// ProxySyncSlow condition is True and names the iptables node, and that node's advice names
/// nftables mode, measured faster on the other node.
fn slow_sync_regime(run: &Value, broken: &mut Vec<String>) {
    let name = run["name"].as_str().unwrap_or("?");
    let modes = run["nodeModes"].as_object().cloned().unwrap_or_default();
    let node_in = |prefix: &str| modes.iter().find(|(_, m)| m.as_str().is_some_and(|m| m.starts_with(prefix))).map(|(n, _)| n.clone());
    let (Some(slow), Some(fast)) = (node_in("iptables"), node_in("nftables")) else {
        broken.push(format!("{name}: the slow-sync regime needs an iptables and an nftables node: {modes:?}"));
        return;
    };
    let p99 = &run["operatorSyncP99Seconds"];
    println!("{name}: the operator's sync p99 {p99} at {} extra Services", run["extraServices"]);
    match (p99[&slow].as_f64(), p99[&fast].as_f64()) {
        (Some(s), Some(f)) if s > 1.0 && f < s => {}
        _ => broken.push(format!("{name}: not the slow-sync regime: sync p99 per node {p99} ({slow} must be above 1 s and above {fast})")),
    }
    if run["protected"] != true {
        return;
    }
    let detail = &run["operatorWindowDetail"];
    let condition = detail["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == "ProxySyncSlow");
    match condition {
        Some(c) if c["status"] == "True" && c["message"].as_str().is_some_and(|m| m.contains(&format!("node {slow}:"))) => {
            println!("{name}: condition ProxySyncSlow True: {}", c["message"]);
        }
        other => broken.push(format!("{name}: the ProxySyncSlow condition is not True for {slow}: {other:?}")),
    }
    let advice = detail["advice"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["reason"] == "ProxySyncSlow" && a["message"].as_str().is_some_and(|m| m.starts_with(&format!("node {slow}:"))));
    match advice.and_then(|a| a["message"].as_str()) {
        Some(m) if m.contains(&format!("Node {fast} runs nftables mode")) => println!("{name}: advice: {m}"),
        other => broken.push(format!("{name}: no ProxySyncSlow advice for {slow} naming nftables on {fast}: {other:?}")),
    }
}
