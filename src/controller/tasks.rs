//! The controller's long-running tasks besides reconciliation: publishing the webhook's plan
//! from the policies' status (every replica) and probing the API server's capabilities (every
//! replica).

use super::planner::{DefaultPolicyRef, build_plan};
use super::probe::{ProbeResult, probe_native_sleep};
use crate::core::crd::TerminationPolicy;
use crate::webhook::server::PlanHandle;
use futures::StreamExt;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long the first plan waits for the capability probe's first answer before it is
/// published assuming no native sleep (the probe's own default): a replica that cannot probe
/// (an admission policy refusing the dry run) still serves, with the exec fallback or a skip.
pub const FIRST_PROBE_WAIT: Duration = Duration::from_secs(30);

/// Watches every TerminationPolicy and publishes a new [`crate::core::plan::Plan`] on each change
/// and each capability change. The first plan is published once the initial list is complete
/// and the capability probe has answered (`native_sleep` is `Some`; at most
/// [`FIRST_PROBE_WAIT`] after the publisher starts), so `/readyz` (which waits for a published plan) never
/// serves a partial view: a replica that became ready before it knew that the API server keeps
/// a native sleep answered pods unmutated (seen in tests/e2e_operator_pods.rs t4: 2 of 500
/// pods, HTTP 200, no preStop). Returns on `stop`.
pub async fn publish_plans(
    client: Client,
    plans: PlanHandle,
    mut native_sleep: watch::Receiver<Option<bool>>,
    mut injection: watch::Receiver<crate::core::wait::WaitInjection>,
    default_ref: Option<DefaultPolicyRef>,
    stop: CancellationToken,
) {
    let writer: Writer<TerminationPolicy> = Writer::default();
    let store = writer.as_reader();
    let stream = reflector::reflector(writer, watcher(Api::<TerminationPolicy>::all(client), watcher::Config::default())).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut listed = false;
    let probe_deadline = tokio::time::sleep(FIRST_PROBE_WAIT);
    let mut probe_deadline = std::pin::pin!(probe_deadline);
    let mut waited = false;
    let publish = |store: &reflector::Store<TerminationPolicy>, native: bool, injection: &watch::Receiver<crate::core::wait::WaitInjection>| {
        let policies: Vec<TerminationPolicy> = store.state().iter().map(|p| (**p).clone()).collect();
        let mut plan = build_plan(&policies, native, default_ref.as_ref());
        plan.wait = injection.borrow().clone();
        tracing::debug!(policies = plan.policies.len(), default = plan.default_policy.is_some(), native_sleep = native, "plan published");
        plans.publish(plan);
    };
    loop {
        let changed = tokio::select! {
            _ = stop.cancelled() => return,
            ev = stream.next() => match ev {
                Some(Ok(watcher::Event::InitDone)) => {
                    listed = true;
                    true
                }
                Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_))) => listed,
                Some(Ok(_)) => false,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "TerminationPolicy watch error");
                    false
                }
                None => return,
            },
            changed = native_sleep.changed() => {
                if changed.is_err() { return; }
                listed
            }
            changed = injection.changed() => {
                if changed.is_err() { return; }
                listed
            }
            () = &mut probe_deadline, if !waited => {
                waited = true;
                if native_sleep.borrow().is_none() {
                    tracing::warn!(seconds = FIRST_PROBE_WAIT.as_secs(), "no capability probe answer yet: serving as if native sleep were unavailable");
                }
                listed
            }
        };
        // (`changed` is only true once listed; an answer or the deadline, once there, stays)
        let native = *native_sleep.borrow();
        if changed && (native.is_some() || waited) {
            publish(&store, native.unwrap_or(false), &injection);
        }
    }
}

/// Probes native-sleep support now, then every `interval`, and immediately when the API
/// server's version changes. Publishes the answer on `tx` (`None` until the first probe that
/// succeeds); a failed probe keeps the last answer (the plan publisher treats `None` as `false`
/// after [`FIRST_PROBE_WAIT`]: exec fallback or skip, never a pod the API server would reject).
pub async fn probe_capabilities(client: Client, namespace: String, tx: watch::Sender<Option<bool>>, interval: Duration, stop: CancellationToken) {
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
                tx.send_if_modified(|v| v.replace(native) != Some(native));
                last_version = version;
                next_probe = tokio::time::Instant::now() + interval;
            }
            Err(e) => tracing::warn!(error = %e, namespace = %namespace, "capability probe failed; keeping the last answer"),
        }
    }
}
