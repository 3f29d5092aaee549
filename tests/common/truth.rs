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
