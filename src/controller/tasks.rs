//! The controller's long-running tasks besides reconciliation: publishing the webhook's plan
//! from the policies' status (every replica) and probing the API server's capabilities (every
//! replica).

use super::planner::{DefaultPolicyRef, build_plan};
use super::probe::{ProbeResult, probe_native_sleep};
use crate::crd::TerminationPolicy;
use crate::webhook::server::PlanHandle;
use futures::StreamExt;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Watches every TerminationPolicy and publishes a new [`crate::webhook::Plan`] on each change
/// and each capability change. The first plan is published once the initial list is complete,
/// so `/readyz` (which waits for a published plan) never serves a partial view. Returns on
/// `stop`.
pub async fn publish_plans(
    client: Client,
    plans: PlanHandle,
    mut native_sleep: watch::Receiver<bool>,
    default_ref: Option<DefaultPolicyRef>,
    stop: CancellationToken,
) {
    let writer: Writer<TerminationPolicy> = Writer::default();
    let store = writer.as_reader();
    let stream = reflector::reflector(writer, watcher(Api::<TerminationPolicy>::all(client), watcher::Config::default()))
        .default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut listed = false;
    let publish = |store: &reflector::Store<TerminationPolicy>, native: bool| {
        let policies: Vec<TerminationPolicy> = store.state().iter().map(|p| (**p).clone()).collect();
        let plan = build_plan(&policies, native, default_ref.as_ref());
        tracing::debug!(policies = plan.policies.len(), default = plan.default_policy.is_some(), native_sleep = native, "plan published");
        plans.publish(plan);
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            ev = stream.next() => match ev {
                Some(Ok(watcher::Event::InitDone)) => {
                    listed = true;
                    publish(&store, *native_sleep.borrow());
                }
                Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_))) if listed => publish(&store, *native_sleep.borrow()),
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "TerminationPolicy watch error"),
                None => return,
            },
            changed = native_sleep.changed() => {
                if changed.is_err() { return; }
                if listed { publish(&store, *native_sleep.borrow()); }
            }
        }
    }
}

/// Probes native-sleep support now, then every `interval`, and immediately when the API
/// server's version changes. Publishes the answer on `tx`; a failed probe keeps the last
/// answer (the first answer before any success is `false`: exec fallback or skip, never a pod
/// the API server would reject).
pub async fn probe_capabilities(client: Client, namespace: String, tx: watch::Sender<bool>, interval: Duration, stop: CancellationToken) {
    let mut last_version: Option<String> = None;
    let mut next_probe = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let version = client.apiserver_version().await.ok().map(|v| v.git_version);
        let version_changed = version.is_some() && version != last_version;
        if !version_changed && tokio::time::Instant::now() < next_probe {
            continue;
        }
        match probe_native_sleep(client.clone(), &namespace).await {
            Ok(result) => {
                let native = result == ProbeResult::NativeSleep;
                if let ProbeResult::NoNativeSleep(why) = &result {
                    tracing::info!(version = ?version, reason = %why, "native preStop sleep unavailable: exec fallback or skip");
                } else {
                    tracing::info!(version = ?version, "native preStop sleep available");
                }
                tx.send_if_modified(|v| std::mem::replace(v, native) != native);
                last_version = version;
                next_probe = tokio::time::Instant::now() + interval;
            }
            Err(e) => tracing::warn!(error = %e, namespace = %namespace, "capability probe failed; keeping the last answer"),
        }
    }
}
