//! The TerminationPolicy controller: on every policy change and every measurement update, the
//! leader analyses the rolling window with the policy's spec, writes the status by server-side
//! apply only when it changed, and emits Events on condition transitions. Replicas without the
//! lease write nothing (they serve the plan from the status the leader wrote).

use super::Error;
use super::metrics::{ControllerMetrics, KubeProxyMetrics, PolicyLabel, PolicyStateLabel, ReconcileResultLabel};
use super::service_index::ClusterIndex;
use super::status::{self, MeasurementMeta};
use crate::core::advisor::{ClusterFacts, Thresholds};
use crate::core::analysis::{AnalysisOptions, WindowCache};
use crate::core::annotations::{ANNOTATION_POLICY, ANNOTATION_PRESTOP_SECONDS};
use crate::core::crd::{PodCounts, TerminationPolicy, TerminationPolicyStatus};
use crate::core::measure::MeasurementStore;
use crate::core::model::ProxyMode;
use crate::core::proxyconfig::ResolvedProxyConfig;
use crate::core::selector::{ServiceIndex, selector_matches};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Field manager of status writes.
pub const FIELD_MANAGER: &str = "safe-termination";

/// Controller settings.
#[derive(Debug, Clone)]
pub struct ControllerSettings {
    /// Advisor thresholds.
    pub thresholds: Thresholds,
    /// Re-reconcile at least this often.
    pub requeue: Duration,
    /// Rewrite an unchanged status at most this often (to refresh lastScrapeTime), seconds.
    pub status_refresh_seconds: f64,
    /// Count mutated/stale/unprotected pods (lists the policy's namespace's pods).
    pub count_pods: bool,
    /// Proxy mode given by the operator's flags: overrides `/proxyMode`, configuration and
    /// metric-family inference.
    pub mode_override: Option<ProxyMode>,
    /// minSyncPeriod given by the operator's flags, seconds.
    pub min_sync_period_override: Option<f64>,
    /// Said in every status when the cluster has no kube-proxy (eBPF dataplane): sizing then
    /// uses the policy default.
    pub no_kube_proxy_note: Option<String>,
    /// The active admission backend, said in every status (`None`: not said).
    pub admission_backend: Option<crate::core::admission::ActiveBackend>,
}

impl Default for ControllerSettings {
    fn default() -> Self {
        Self {
            thresholds: Thresholds::default(),
            requeue: Duration::from_secs(300),
            status_refresh_seconds: 300.0,
            count_pods: true,
            mode_override: None,
            min_sync_period_override: None,
            no_kube_proxy_note: None,
            admission_backend: None,
        }
    }
}

/// Everything a reconcile needs.
pub struct Context {
    /// API client.
    pub client: Client,
    /// The rolling measurement.
    pub store: Arc<Mutex<MeasurementStore>>,
    /// Services and EndpointSlices.
    pub cluster: Arc<ClusterIndex>,
    /// minSyncPeriod and mode as read from kube-proxy's configuration (kept current by the
    /// scrape loop).
    pub proxy: Arc<RwLock<ResolvedProxyConfig>>,
    /// True while this replica holds the lease.
    pub leader: watch::Receiver<bool>,
    /// Event recorder.
    pub recorder: Recorder,
    /// ControllerSettings.
    pub settings: ControllerSettings,
    /// Controller metrics.
    pub metrics: ControllerMetrics,
    /// Per-node metrics.
    pub kube_proxy_metrics: KubeProxyMetrics,
    /// All policies (the controller's reflector), for conflict reports.
    pub policies: kube::runtime::reflector::Store<TerminationPolicy>,
    /// The window analyses of the current measurement generation, shared by every policy and
    /// the metrics export.
    pub analyses: Mutex<WindowCache>,
}

fn now_time() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn rfc3339(unix: f64) -> Option<String> {
    let t = k8s_openapi::jiff::Timestamp::from_millisecond((unix * 1000.0) as i64).ok()?;
    Some(t.to_string())
}

/// Counts the namespace's running, long-running pods this policy covers.
async fn count_pods(ctx: &Context, policy: &TerminationPolicy, recommended: u32) -> Result<(PodCounts, Option<u32>), kube::Error> {
    let ns = policy.namespace().unwrap_or_default();
    let policy_ref = format!("{ns}/{}", policy.name_any());
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let mut counts = PodCounts::default();
    let mut min_injected: Option<u32> = None;
    let mut lp = ListParams::default().limit(500);
    loop {
        let list = api.list(&lp).await?;
        for pod in &list.items {
            let labels = pod.labels().clone().into_iter().collect();
            if let Some(sel) = &policy.spec.pod_selector
                && !selector_matches(sel, &labels)
            {
                continue;
            }
            let spec = pod.spec.as_ref();
            let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            let long_running = spec.and_then(|s| s.restart_policy.as_deref()).is_none_or(|r| r == "Always");
            if !running || !long_running || pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let ann = pod.annotations();
            if ann.get(ANNOTATION_POLICY) == Some(&policy_ref) {
                counts.mutated += 1;
                if let Some(s) = ann.get(ANNOTATION_PRESTOP_SECONDS).and_then(|s| s.parse::<u32>().ok()) {
                    min_injected = Some(min_injected.map_or(s, |m| m.min(s)));
                    if s < recommended {
                        counts.stale += 1;
                    }
                }
            }
            let has_pre_stop = spec.is_some_and(|s| s.containers.iter().any(|c| c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()).is_some()));
            if !has_pre_stop && ctx.cluster.selects(&ns, &labels) {
                counts.unprotected += 1;
            }
        }
        match list.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => break,
        }
    }
    Ok((counts, min_injected))
}

/// The rolling window analysed under one policy spec, with what the status reports about it.
struct Measured {
    /// The policy's sizing, without per-node windows and with per-node advice bounded
    /// ([`crate::core::analysis::size_summary`]).
    report: crate::core::analysis::AnalysisReport,
    /// The generation's window analysis, shared by every policy (the per-node windows).
    analysis: Arc<crate::core::analysis::WindowAnalysis>,
    failures: Vec<String>,
    nodes_with_data: usize,
    last_scrape: Option<f64>,
    window: f64,
    mode_source: Option<String>,
    /// From the flags (`--proxy-mode ebpf`) or a detected dataplane without kube-proxy.
    no_kube_proxy_note: Option<String>,
    /// How each measured, not failing node was read.
    sources: std::collections::BTreeMap<String, &'static str>,
}

fn measure(ctx: &Context, spec: &crate::core::crd::TerminationPolicySpec) -> Result<Measured, Error> {
    let proxy = ctx.proxy.read().map(|p| p.clone()).unwrap_or_default();
    let (min_sync_period_seconds, min_sync_period_source) = match ctx.settings.min_sync_period_override {
        Some(v) => (v, "flag".to_string()),
        None => (proxy.min_sync_period_seconds, proxy.source.clone()),
    };
    // the flag overrides every node; the configured mode (one node's configz or the ConfigMap)
    // only fills in a node that reports none (AnalysisOptions::configured_mode)
    let mode = ctx.settings.mode_override;
    let mode_source = mode.map(|_| "flag".to_string());
    let configured_mode = proxy.mode();
    let no_kube_proxy_note = ctx.settings.no_kube_proxy_note.clone().or_else(|| proxy.dataplane.as_ref().map(|d| d.note.clone()));
    let counts = ctx.cluster.counts();
    let window_seconds = ctx.store.lock().map_err(|_| Error::Store)?.window_seconds();
    let now = super::service_index::now_unix();
    let opts = AnalysisOptions {
        min_sync_period_seconds,
        min_sync_period_source,
        mode,
        configured_mode,
        facts: ClusterFacts {
            mode_origin: proxy.config.as_ref().map(|c| c.mode_origin),
            services: counts.map(|c| c.services),
            service_ports: counts.map(|c| c.service_ports),
            endpoints: counts.map(|c| c.endpoints),
            ..Default::default()
        },
        thresholds: ctx.settings.thresholds.clone(),
        // the control plane's part of a deletion over the same rolling window
        control_plane_lag: ctx.cluster.control_plane_lag(now, window_seconds),
        // the removals the node agents observed, over the same window
        observed: ctx.cluster.observed_removals(now, window_seconds).filter(|s| s.removals > 0),
        observed_by_data_plane: ctx.cluster.observed_by_data_plane(now, window_seconds),
        // the operator sizes from native histograms where kube-proxy serves them
        ..Default::default()
    };
    // one store lock for the figures and the analysis, so the analysis is cached under the
    // revision its inputs come from; one analysis per measurement generation (and minSamples),
    // shared by every policy; the inputs are only copied out of the store when this generation
    // has none yet (lock order: store, then analyses; nothing else takes both)
    let (failures, nodes_with_data, last_scrape, window, analysis, sources) = {
        let store = ctx.store.lock().map_err(|_| Error::Store)?;
        let failures: Vec<String> = store.failures().iter().map(|(n, f)| format!("{n}: {}", f.message)).collect();
        let sources = store.node_sources().filter(|(n, _)| !store.failures().contains_key(*n)).map(|(n, s)| (n.to_string(), s.as_str())).collect();
        let analysis = ctx.analyses.lock().map_err(|_| Error::Store)?.get(store.revision(), &opts, spec.pre_stop.min_samples, || store.inputs_iter());
        (failures, store.nodes_with_data(), store.last_scrape_unix_seconds(), store.window_seconds(), analysis, sources)
    };
    let report = crate::core::analysis::size_summary(&analysis, spec, status::NODES_PER_ADVICE);
    Ok(Measured { report, analysis, failures, nodes_with_data, last_scrape, window, mode_source, no_kube_proxy_note, sources })
}

/// Keeps the per-node and cluster gauges current on every measurement update, whether or not
/// any TerminationPolicy exists (so the metrics-unavailable and slow-sync alerts work before the
/// first policy). Only the leader measures: a follower exports no kube-proxy series and
/// `safe_termination_controller_leader 0`, so `max by (node)` alerts never see stale values.
async fn export_measurement_metrics(ctx: Arc<Context>, mut measured: watch::Receiver<u64>, mut leader: watch::Receiver<bool>, stop: CancellationToken) {
    loop {
        let leading = *leader.borrow_and_update();
        ctx.metrics.leader.set(i64::from(leading));
        if leading {
            if let Ok(m) = measure(&ctx, &crate::core::crd::TerminationPolicySpec::default()) {
                ctx.kube_proxy_metrics.update(&m.analysis.nodes, m.failures.len(), ctx.settings.thresholds.sync_slow_seconds, &m.sources);
                ctx.metrics.update_cluster(&m.report);
            }
        } else {
            ctx.kube_proxy_metrics.clear();
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            r = measured.changed() => if r.is_err() { return },
            r = leader.changed() => if r.is_err() { return },
        }
    }
}

/// One reconciliation of one policy.
pub async fn reconcile(policy: Arc<TerminationPolicy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    if !*ctx.leader.borrow() {
        return Ok(Action::requeue(ctx.settings.requeue));
    }
    let Measured { report, analysis, failures, nodes_with_data, last_scrape, window, mode_source, no_kube_proxy_note, sources } = measure(&ctx, &policy.spec)?;
    let mode_source = mode_source.or_else(|| analysis.nodes.first().map(|n| n.mode_source.to_string()));
    drop(analysis);
    let rec = report.recommendation.pre_stop_seconds;
    let pods = if ctx.settings.count_pods { pod_counts(&ctx, &policy, rec).await } else { None };
    let meta = MeasurementMeta {
        nodes_scraped: u32::try_from(nodes_with_data.saturating_sub(failures.len())).unwrap_or(0),
        failed: failures.clone(),
        window_seconds: window as u32,
        last_scrape_time: last_scrape.and_then(rfc3339),
        mode_source,
        no_kube_proxy_note,
        sources,
        waits: policy.metadata.namespace.as_deref().and_then(|ns| ctx.cluster.wait_summary(ns, super::service_index::now_unix(), window)),
    };
    let now = now_time();
    let previous = policy.status.as_ref();
    let mut desired = status::desired_status(&policy.spec, policy.metadata.generation, &report, &meta, pods, previous, &now);
    desired.admission = ctx.settings.admission_backend.map(|b| status::admission_status(b, &policy.spec));
    status::push_condition(&mut desired, status::conflict_condition(&policy, &ctx.policies.state(), &now), previous);

    ctx.metrics
        .recommended_prestop
        .get_or_create(&PolicyLabel { namespace: policy.namespace().unwrap_or_default(), policy: policy.name_any() })
        .set(i64::from(rec));

    let now_unix = now.0.as_millisecond() as f64 / 1000.0;
    if status::needs_write(previous, &desired, now_unix, ctx.settings.status_refresh_seconds) {
        // the lease can be lost while we computed: check again right before writing
        if !*ctx.leader.borrow() {
            return Ok(Action::requeue(ctx.settings.requeue));
        }
        write_status(&ctx, &policy, &desired).await?;
    }
    ctx.metrics.reconciles.get_or_create(&ReconcileResultLabel { result: "ok".into() }).inc();
    ctx.metrics.reconcile_duration.observe(started.elapsed().as_secs_f64());
    Ok(Action::requeue(ctx.settings.requeue))
}

/// The pods of `policy` counted against the recommended sleep `rec` (seconds), also set as the
/// policy's pod gauges; `None` (logged) when the pods cannot be listed.
async fn pod_counts(ctx: &Context, policy: &TerminationPolicy, rec: u32) -> Option<PodCounts> {
    let (c, min) = match count_pods(ctx, policy, rec).await {
        Ok(counted) => counted,
        Err(e) => {
            tracing::warn!(error = %e, policy = %policy.name_any(), "cannot count pods");
            return None;
        }
    };
    let l = PolicyLabel { namespace: policy.namespace().unwrap_or_default(), policy: policy.name_any() };
    if let Some(min) = min {
        ctx.metrics.running_min_prestop.get_or_create(&l).set(i64::from(min));
    }
    for (state, v) in [("mutated", c.mutated), ("stale", c.stale), ("unprotected", c.unprotected)] {
        ctx.metrics.pods.get_or_create(&PolicyStateLabel { namespace: l.namespace.clone(), policy: l.policy.clone(), state: state.into() }).set(i64::from(v));
    }
    Some(c)
}

/// Applies `desired` as the policy's status (server-side apply, this controller's field
/// manager, forced) and publishes an Event per condition transition from the status it had.
async fn write_status(ctx: &Context, policy: &TerminationPolicy, desired: &TerminationPolicyStatus) -> Result<(), Error> {
    let api: Api<TerminationPolicy> = Api::namespaced(ctx.client.clone(), &policy.namespace().unwrap_or_default());
    let body = json!({
        "apiVersion": "safetermination.io/v1alpha1",
        "kind": "TerminationPolicy",
        "status": desired,
    });
    api.patch_status(&policy.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body)).await?;
    ctx.metrics.status_writes.inc();
    let old_conditions = policy.status.as_ref().map(|p| p.conditions.as_slice()).unwrap_or(&[]);
    let reference = policy.object_ref(&());
    for t in status::transitions(old_conditions, &desired.conditions) {
        let ev = Event {
            type_: if t.type_ == "Warning" { EventType::Warning } else { EventType::Normal },
            reason: t.reason,
            note: Some(t.note),
            action: "Reconcile".into(),
            secondary: None,
        };
        match ctx.recorder.publish(&ev, &reference).await {
            Ok(()) => {}
            // a namespace being deleted takes no new objects: nothing to report
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("being terminated") => {
                tracing::debug!(policy = %policy.name_any(), "namespace terminating: transition event not recorded");
            }
            Err(e) => tracing::warn!(error = %e, "cannot publish event"),
        }
    }
    Ok(())
}

/// Retry policy: count, log, retry in 30 s.
pub fn error_policy(policy: Arc<TerminationPolicy>, err: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(policy = %policy.name_any(), error = %err, "reconcile failed");
    ctx.metrics.reconciles.get_or_create(&ReconcileResultLabel { result: "error".into() }).inc();
    Action::requeue(Duration::from_secs(30))
}

/// Runs the controller until `stop`: reconciles on policy changes, on every measurement update
/// (`measured` changes) and on leadership changes.
pub async fn run(
    client: Client,
    make_context: impl FnOnce(kube::runtime::reflector::Store<TerminationPolicy>) -> Context,
    measured: watch::Receiver<u64>,
    leader: watch::Receiver<bool>,
    stop: CancellationToken,
) {
    let api: Api<TerminationPolicy> = Api::all(client);
    let controller = Controller::new(api, watcher::Config::default());
    let ctx = Arc::new(make_context(controller.store()));
    let exporter = tokio::spawn(export_measurement_metrics(ctx.clone(), measured.clone(), leader.clone(), stop.clone()));
    let trigger = futures::stream::select(tokio_stream_from_watch(measured), tokio_stream_from_watch(leader));
    controller
        .reconcile_all_on(trigger)
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "controller event");
            }
        })
        .await;
    exporter.abort();
}

/// A stream that yields `()` every time the watch value changes.
fn tokio_stream_from_watch<T: Send + Sync + 'static>(rx: watch::Receiver<T>) -> impl futures::Stream<Item = ()> + Send {
    futures::stream::unfold(rx, |mut rx| async move { rx.changed().await.ok().map(|_| ((), rx)) })
}
