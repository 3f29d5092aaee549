//! The ground truth of a rollout's removals on the real nodes, shared by the tests that hold the
//! observer to it (tests/e2e_window.rs, tests/e2e_observer_faults.rs): a pod watch that records
//! when each pod's deletion became visible and when it was gone, and a sampler of every node's
//! rules through the yardstick's readers (common::rules: only a successful read without an IP
//! is its removal; a failed read is no sample).

use super::rules::{RuleReader, RuleTrace, now_unix};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Per pod IP, unix seconds.
pub type Seen = Arc<Mutex<BTreeMap<String, f64>>>;

/// A watch of `pods`: when each pod's deletion became visible (`terminating`) and when it was
/// gone (`gone`), keyed by pod IP, as this test's client saw them.
pub struct DeletionWatch {
    pub terminating: Seen,
    pub gone: Seen,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DeletionWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DeletionWatch {
    /// Starts watching `pods`.
    pub fn start(pods: &Api<Pod>) -> DeletionWatch {
        let (terminating, gone): (Seen, Seen) = (Arc::default(), Arc::default());
        let (seen, done) = (terminating.clone(), gone.clone());
        let pods = pods.clone();
        let task = tokio::spawn(async move {
            let mut s = std::pin::pin!(watcher(pods, watcher::Config::default()).default_backoff());
            use futures::StreamExt;
            while let Some(Ok(ev)) = s.next().await {
                let (p, deleted) = match ev {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => (p, false),
                    watcher::Event::Delete(p) => (p, true),
                    _ => continue,
                };
                let Some(ip) = p.status.as_ref().and_then(|s| s.pod_ip.clone()) else { continue };
                let t = now_unix();
                if deleted {
                    done.lock().unwrap().entry(ip).or_insert(t);
                } else if p.metadata.deletion_timestamp.is_some() {
                    seen.lock().unwrap().entry(ip).or_insert(t);
                }
            }
        });
        DeletionWatch { terminating, gone, task }
    }
}

/// Samples `readers` every ~100 ms for up to `secs` seconds, until every IP of `ips` has left
/// every node's rules: per node, its name and trace.
pub fn sample_removals(readers: Vec<RuleReader>, ips: Vec<String>, secs: u64) -> tokio::task::JoinHandle<Vec<(String, RuleTrace)>> {
    let mut readers = readers;
    tokio::task::spawn_blocking(move || {
        let since = now_unix();
        let mut traces: Vec<RuleTrace> = readers.iter().map(|_| RuleTrace::default()).collect();
        let until = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < until {
            for (r, trace) in readers.iter_mut().zip(&mut traces) {
                let t0 = now_unix();
                let read = r.endpoint_ips();
                trace.observe(read, t0, now_unix());
            }
            if traces.iter().all(|t| ips.iter().all(|ip| t.removal(ip, since).is_some())) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        readers.into_iter().map(|r| r.node.name).zip(traces).collect()
    })
}

/// Waits up to 90 s until `pods` holds exactly `replicas` running pods (with an IP, not
/// deleting) whose IPs are all in every node's rules as `readers` read them (a failed read: not
/// yet); returns those pods.
pub async fn pods_in_every_nodes_rules(pods: &Api<Pod>, readers: &mut [RuleReader], replicas: usize) -> Vec<Pod> {
    super::wait_for("the pods in every node's rules", 90, async || {
        let running: Vec<Pod> = pods
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some() && p.metadata.deletion_timestamp.is_none())
            .collect();
        let ips: BTreeSet<String> = running.iter().filter_map(|p| p.status.as_ref()?.pod_ip.clone()).collect();
        (running.len() == replicas && readers.iter_mut().all(|r| r.endpoint_ips().is_ok_and(|got| ips.is_subset(&got)))).then_some(running)
    })
    .await
}

/// The rank from the top, k, of the per-pod window a p99 must cover among `n`: the smallest k
/// with `P(Binomial(n, 0.01) >= k) <= 1 %`, the chance that k or more of n windows drawn from
/// a distribution lie above its exact p99. 1 for fewer than 2 pods.
pub fn p99_check_rank(n: usize) -> usize {
    let (p, mut below, mut k) = (0.01_f64, 0.0, 0);
    // below = P(X < k), X ~ Binomial(n, p)
    while k < n && 1.0 - below > 0.01 {
        let choose: f64 = (0..k).map(|i| (n - i) as f64 / (i + 1) as f64).product();
        below += choose * p.powi(k as i32) * (1.0 - p).powi((n - k) as i32);
        k += 1;
    }
    k.max(1)
}

/// The kubelets' own record of each preStop hook's end: the yardstick of a wait (the kubelet
/// sends the stop signal right after it). Read from the kubelet's log (`$ST_E2E_DIR/logs/
/// kubelet-<node>.log`), whose line `"PreStop hook completed" pod="<ns>/<name>"` is logged at
/// verbosity 3 (pkg/kubelet/kuberuntime/kuberuntime_container.go `executePreStopHook`);
/// [`kubelet_verbosity`] raises it on a running kubelet.
///
/// Sets the kubelet of `node`'s log verbosity (`PUT /debug/flags/v` through the API server's
/// node proxy; the kubelet's debugging handlers are on by default). Panics when refused.
pub fn kubelet_verbosity(node: &str, v: u32) {
    use std::io::Write;
    let mut child = super::tools::tool("kubectl")
        .args(["replace", "--raw", &format!("/api/v1/nodes/{node}/proxy/debug/flags/v"), "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl");
    child.stdin.take().unwrap().write_all(v.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "kubelet {node}: log verbosity {v}: {}", String::from_utf8_lossy(&out.stderr));
}

/// When the kubelet of `node` logged the end of pod `namespace/name`'s preStop hook (its first
/// container's), unix seconds; None when it has not (yet). klog's header is local time without
/// a year: the host's clock is UTC here and the year is this one.
pub fn prestop_completed(node: &str, namespace: &str, name: &str) -> Option<f64> {
    let log = std::fs::read_to_string(format!("{}/logs/kubelet-{node}.log", super::state_dir())).ok()?;
    let needle = format!("pod=\"{namespace}/{name}\"");
    let line = log.lines().rfind(|l| l.contains("PreStop hook completed") && l.contains(&needle))?;
    klog_unix_seconds(line)
}

/// The time of a klog line (`I1207 18:48:59.123456 ...`, UTC, this year), unix seconds.
pub fn klog_unix_seconds(line: &str) -> Option<f64> {
    let head = line.get(1..21)?;
    let (month, day): (i64, i64) = (head.get(0..2)?.parse().ok()?, head.get(2..4)?.parse().ok()?);
    let (h, m): (i64, i64) = (head.get(5..7)?.parse().ok()?, head.get(8..10)?.parse().ok()?);
    let s: f64 = head.get(11..20)?.parse().ok()?;
    let year = 1970 + (now_unix() / 31_556_952.0) as i64;
    // days from 1970-01-01 to year-month-day (Howard Hinnant's days_from_civil)
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3600 + m * 60) as f64 + s)
}
