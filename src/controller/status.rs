//! From an analysis to a `TerminationPolicy` status, its conditions, and the Events that
//! condition transitions deserve. Pure: the controller writes what this returns.
//!
//! Conditions (all `metav1.Condition`):
//! - `Ready`: True when a recommendation was computed from the current spec.
//! - `ProxySyncSlow`: True when some node's sync p99 is above the threshold (1 s).
//! - `MigrationRecommended`: True when the advisor recommends another proxy mode.
//! - `MetricsUnavailable`: True when no node could be measured or some nodes failed.
//! - `PodsUnderprotected`: True when running pods carry a sleep below the recommendation
//!   (stale), service-backed pods have no preStop at all (unprotected), or fewer than 99% of
//!   the observed removals were covered by their pod's own sleep (reason
//!   `ObservedRemovalOutlivedSleep`).
//!
//! A condition's `lastTransitionTime` changes only when its status does, so an unchanged
//! status compares equal and is not written again.
//!
//! Per-node findings (advice items naming a node, failed nodes) are bounded to
//! [`NODES_PER_ADVICE`] per reason, the rest counted: the status of a 5,000-node cluster stays
//! a few KB (it was ~1.2 MB with one advice item per node, near etcd's object limit).

use crate::core::admission::ActiveBackend;
use crate::core::admission::policy::DIFFERENCES;
use crate::core::advisor::{self, Advice, AdviceReason};
use crate::core::analysis::{AnalysisReport, ObservedRemovals, coverage_percent};
use crate::core::crd::TerminationPolicy;
use crate::core::crd::{AdmissionStatus, Scope, WaitsStatus};
use crate::core::crd::{
    AdviceStatus, ControlPlaneLagStatus, CoverageStatus, DataPlaneRemovalsStatus, MeasurementStatus, MissStatus, ObservedRemovalsStatus, PodCounts,
    ProxyStatus, RecommendationStatus, TerminationPolicySpec, TerminationPolicyStatus,
};
use crate::core::model::Basis;
use crate::core::removals::{DataPlaneSummary, OBSERVED_COVERAGE_TARGET};
use crate::core::selector::specificity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use std::sync::Arc;

/// Per-node advice items of each reason, and failed nodes, a status names; the rest are counted
/// ([`advisor::bounded`]).
pub const NODES_PER_ADVICE: usize = 5;

/// Facts about the measurement besides the analysis.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MeasurementMeta {
    /// Nodes measured successfully.
    pub nodes_scraped: u32,
    /// Nodes whose last scrape failed, with a short reason each (`node: reason`).
    pub failed: Vec<String>,
    /// Rolling window, seconds.
    pub window_seconds: u32,
    /// Last scrape, RFC 3339.
    pub last_scrape_time: Option<String>,
    /// Where the mode came from (`proxyMode endpoint`, `ConfigMap`, ...), for the status.
    pub mode_source: Option<String>,
    /// Set when there is no kube-proxy at all (e.g. an eBPF dataplane): said in Ready's message.
    pub no_kube_proxy_note: Option<String>,
    /// How each measured node (not failing) was read, by node name: `kube-proxy`, `agent`,
    /// `prometheus`, `file` ([`crate::core::measure::NodeSource::as_str`]).
    pub sources: std::collections::BTreeMap<String, &'static str>,
    /// The preStop waits of the policy's namespace over the rolling window (handler `Wait`).
    pub waits: Option<crate::core::wait::WaitSummary>,
}

impl MeasurementMeta {
    /// Nodes per source (see [`Self::sources`]).
    pub fn source_counts(&self) -> std::collections::BTreeMap<String, u32> {
        let mut counts = std::collections::BTreeMap::new();
        for s in self.sources.values() {
            *counts.entry(s.to_string()).or_insert(0) += 1;
        }
        counts
    }
}

/// An Event to emit for a condition transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransitionEvent {
    /// `Normal` or `Warning`.
    pub type_: &'static str,
    /// The condition type and new state, e.g. `ProxySyncSlow`.
    pub reason: String,
    /// Human message (the condition's message).
    pub note: String,
}

fn round_ms(x: f64) -> f64 {
    round_to(x, 1000.0)
}

/// `x` rounded to `1 / per_unit`.
fn round_to(x: f64, per_unit: f64) -> f64 {
    (x * per_unit).round() / per_unit
}

fn cond(type_: &str, on: bool, reason: &str, message: String, generation: Option<i64>, now: &Time) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if on { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time: now.clone(),
    }
}

/// A condition's type, status, reason and message, before its generation and time are set.
struct Verdict {
    type_: &'static str,
    on: bool,
    reason: String,
    message: String,
}

impl Verdict {
    fn new(type_: &'static str, on: bool, reason: &str, message: String) -> Self {
        Self { type_, on, reason: reason.to_string(), message }
    }
}

/// Computes the desired status. `previous` supplies `lastTransitionTime` of conditions whose
/// status did not change. `pods` is None when pod counts were not computed this time (the
/// previous counts are kept).
pub fn desired_status(
    spec: &TerminationPolicySpec,
    generation: Option<i64>,
    report: &AnalysisReport,
    meta: &MeasurementMeta,
    pods: Option<PodCounts>,
    previous: Option<&TerminationPolicyStatus>,
    now: &Time,
) -> TerminationPolicyStatus {
    let advice = advisor::bounded(&report.advice, NODES_PER_ADVICE);
    let pods = pods.or_else(|| previous.and_then(|p| p.pods.clone()));
    let verdicts = [
        ready_condition(spec, report, meta),
        proxy_sync_slow_condition(&advice),
        migration_condition(&advice, report),
        metrics_unavailable_condition(report, meta),
        pods_underprotected_condition(pods.as_ref(), report.recommendation.pre_stop_seconds, report.observed_removals.as_ref()),
    ];
    let conditions = verdicts
        .into_iter()
        .map(|v| {
            let mut c = cond(v.type_, v.on, &v.reason, v.message, generation, now);
            carry_transition_time(&mut c, previous);
            c
        })
        .collect();
    TerminationPolicyStatus {
        observed_generation: generation,
        measurement: Some(measurement_status(report, meta)),
        recommendation: Some(recommendation_status(report)),
        proxy: Some(ProxyStatus {
            mode: report.proxy.mode.as_str().to_string(),
            mode_source: meta.mode_source.clone(),
            services: report.proxy.services,
            endpoints: report.proxy.endpoints,
            estimated_rules: report.proxy.estimated_rules,
            actual_rules: report.proxy.actual_rules,
        }),
        advice: advice.iter().map(|a| AdviceStatus { reason: format!("{:?}", a.reason), message: a.message.clone(), threshold: a.threshold.clone() }).collect(),
        pods,
        conditions,
        admission: None,
    }
}

/// `Ready`: the recommendation (sleep, grace, coverage, arithmetic) for a valid spec, else the
/// spec's errors.
fn ready_condition(spec: &TerminationPolicySpec, report: &AnalysisReport, meta: &MeasurementMeta) -> Verdict {
    let rec = &report.recommendation;
    match spec.validate() {
        Ok(()) => Verdict::new(
            "Ready",
            true,
            &format!("{:?}", rec.reason),
            format!(
                "preStop {} s, grace {} s{} ({}){}",
                rec.pre_stop_seconds,
                rec.termination_grace_period_seconds,
                report.coverage.as_ref().map(|c| format!(", coverage {}", coverage_percent(c.ratio))).unwrap_or_default(),
                rec.arithmetic,
                meta.no_kube_proxy_note.as_deref().map(|n| format!("; {n}")).unwrap_or_default()
            ),
        ),
        Err(errs) => Verdict::new("Ready", false, "InvalidSpec", errs.to_string()),
    }
}

/// The messages of the advice items of `reason`, joined; `None` when there is none.
fn advice_messages(advice: &[Advice], reason: AdviceReason) -> Option<String> {
    let messages: Vec<&str> = advice.iter().filter(|a| a.reason == reason).map(|a| a.message.as_str()).collect();
    (!messages.is_empty()).then(|| messages.join(" | "))
}

/// `ProxySyncSlow`: the advisor's ProxySyncSlow items (a node's sync p99 above the threshold).
fn proxy_sync_slow_condition(advice: &[Advice]) -> Verdict {
    match advice_messages(advice, AdviceReason::ProxySyncSlow) {
        Some(m) => Verdict::new("ProxySyncSlow", true, "SyncP99AboveThreshold", m),
        None => Verdict::new("ProxySyncSlow", false, "SyncP99WithinThreshold", "every measured node syncs within the threshold".into()),
    }
}

/// `MigrationRecommended`: the advisor's MigrateProxyMode items.
fn migration_condition(advice: &[Advice], report: &AnalysisReport) -> Verdict {
    match advice_messages(advice, AdviceReason::MigrateProxyMode) {
        Some(m) => Verdict::new("MigrationRecommended", true, "MigrateProxyMode", m),
        None => Verdict::new("MigrationRecommended", false, "ProxyModeAdequate", format!("proxy mode {} is adequate", report.proxy.mode.as_str())),
    }
}

/// `MetricsUnavailable`: True when no node was scraped, some failed (named, bounded to
/// [`NODES_PER_ADVICE`]) or there was no data; False names how many nodes were read through
/// which source.
fn metrics_unavailable_condition(report: &AnalysisReport, meta: &MeasurementMeta) -> Verdict {
    let unavailable = meta.nodes_scraped == 0 || !meta.failed.is_empty() || report.recommendation.reason == Basis::NoData;
    if !unavailable {
        let by_source = meta.source_counts().iter().map(|(s, n)| format!("{n} through {s}")).collect::<Vec<_>>();
        let how = if by_source.is_empty() { String::new() } else { format!(" ({})", by_source.join(", ")) };
        return Verdict::new("MetricsUnavailable", false, "AllNodesScraped", format!("{} node(s) scraped{how}", meta.nodes_scraped));
    }
    let (reason, msg) = match (&meta.no_kube_proxy_note, meta.failed.is_empty()) {
        (Some(note), true) if meta.nodes_scraped == 0 => ("NoKubeProxy", note.clone()),
        (_, true) => ("NoNodesScraped", "no kube-proxy metrics could be read; sizing uses the policy default".to_string()),
        (_, false) => (
            if meta.nodes_scraped == 0 { "NoNodesScraped" } else { "SomeNodesFailed" },
            format!(
                "{} node(s) failed: {}{}",
                meta.failed.len(),
                meta.failed.iter().take(NODES_PER_ADVICE).map(String::as_str).collect::<Vec<_>>().join("; "),
                match meta.failed.len().saturating_sub(NODES_PER_ADVICE) {
                    0 => String::new(),
                    more => format!("; and {more} more"),
                }
            ),
        ),
    };
    Verdict::new("MetricsUnavailable", true, reason, msg)
}

/// `PodsUnderprotected`: running pods with a sleep below `pre_stop_seconds` (stale),
/// service-backed pods without a preStop (unprotected), or an observed removal that outlived
/// its pod's own sleep in the rolling window (`observed`: the node agents saw it).
fn pods_underprotected_condition(pods: Option<&PodCounts>, pre_stop_seconds: u32, observed: Option<&ObservedRemovals>) -> Verdict {
    let (stale, unprotected) = pods.map(|p| (p.stale, p.unprotected)).unwrap_or((0, 0));
    let missed = observed.filter(|o| o.window.coverage_ratio.is_some_and(|c| c < OBSERVED_COVERAGE_TARGET)).map(|o| {
        let worst = o.window.worst_miss.as_ref().map_or(String::new(), |m| {
            format!(
                " (worst: {} left the data plane {}{:.3} s after its deletion, its sleep {} s)",
                m.pod,
                if m.censored { "at least " } else { "" },
                m.window_seconds,
                m.sleep_seconds
            )
        });
        format!(
            "observed removals: {} covered by their pod's own sleep, below the {} target{worst}",
            coverage_percent(o.window.coverage_ratio.unwrap_or(0.0)),
            coverage_percent(OBSERVED_COVERAGE_TARGET)
        )
    });
    match (stale == 0 && unprotected == 0, missed) {
        (true, None) => Verdict::new("PodsUnderprotected", false, "AllPodsProtected", "no stale or unprotected pods".into()),
        (true, Some(m)) => Verdict::new("PodsUnderprotected", true, "ObservedRemovalOutlivedSleep", m),
        (false, missed) => Verdict::new(
            "PodsUnderprotected",
            true,
            "StaleOrUnprotectedPods",
            format!(
                "{stale} running pod(s) have a sleep below {pre_stop_seconds} s; {unprotected} service-backed pod(s) have no preStop (new pods are sized at creation){}",
                missed.map_or(String::new(), |m| format!("; {m}"))
            ),
        ),
    }
}

/// `status.measurement`: the report's p99s and W rounded to the millisecond, and how the nodes
/// were read.
fn measurement_status(report: &AnalysisReport, meta: &MeasurementMeta) -> MeasurementStatus {
    MeasurementStatus {
        sync_p99_seconds: report.sync_p99_seconds.map(round_ms),
        network_programming_p99_seconds: report.network_programming_p99_seconds.map(round_ms),
        propagation_window_seconds: report.propagation_window_seconds.map(round_ms),
        worst_node: report.worst_node.clone(),
        histogram_kind: report.histogram_kind.map(|k| k.as_str().to_string()),
        nodes_scraped: meta.nodes_scraped,
        nodes_failed: meta.failed.len() as u32,
        sources: meta.source_counts(),
        worst_node_source: report.worst_node.as_ref().and_then(|n| meta.sources.get(n)).map(|s| s.to_string()),
        control_plane_lag: report.control_plane_lag.as_ref().map(|l| ControlPlaneLagStatus {
            samples: l.samples,
            p99_seconds: round_ms(l.p99_seconds),
            max_seconds: round_ms(l.max_seconds),
            source: "pod and EndpointSlice watches".into(),
        }),
        observed_removals: report.observed_removals.as_ref().map(|o| ObservedRemovalsStatus {
            removals: o.window.removals as u32,
            censored: o.window.censored as u32,
            coarse: o.window.coarse as u32,
            p99_seconds: o.window.p99().map(|(p, _)| round_ms(p)),
            p99_is_lower_bound: o.window.p99().is_some_and(|(_, lower)| lower),
            coverage_ratio: o.window.coverage_ratio.map(|r| (r * 1e4).round() / 1e4),
            worst_miss: o.window.worst_miss.as_ref().map(|m| MissStatus {
                pod: m.pod.clone(),
                window_seconds: round_ms(m.window_seconds),
                sleep_seconds: m.sleep_seconds,
                censored: m.censored,
            }),
            sets_window: o.sets_window,
            data_planes: o.by_data_plane.iter().map(|p| data_plane_status(p).0).collect(),
            data_planes_summary: (!o.by_data_plane.is_empty()).then(|| o.by_data_plane.iter().map(|p| data_plane_status(p).1).collect::<Vec<_>>().join(" ")),
        }),
        waits: meta.waits.as_ref().map(waits_status),
        window_seconds: Some(meta.window_seconds),
        last_scrape_time: meta.last_scrape_time.clone(),
    }
}

/// `status.measurement.waits`: how the namespace's preStop waits ended, how long they took
/// against the sleeps they replaced, and whether each covered its pod's window; `summary` is
/// the `kubectl get tpol -o wide` column (`Removed 11, Fallback 1; p50 1.2s vs sleep 5s`).
fn waits_status(w: &crate::core::wait::WaitSummary) -> WaitsStatus {
    use crate::core::wait::WaitOutcome;
    let by: Vec<String> = WaitOutcome::ALL.iter().zip(w.by_outcome).filter(|(_, n)| *n > 0).map(|(o, n)| format!("{} {n}", o.as_str())).collect();
    let p50 = |v: Option<f64>| v.map_or_else(|| "?".to_string(), |s| format!("{s:.1}s"));
    WaitsStatus {
        waits: w.waits,
        removed: w.by_outcome[0],
        last_endpoint: w.by_outcome[1],
        deadline: w.by_outcome[2],
        fallback: w.by_outcome[3],
        p50_seconds: w.p50_seconds.map(round_ms),
        p99_seconds: w.p99_seconds.map(round_ms),
        max_seconds: w.max_seconds.map(round_ms),
        sleep_p50_seconds: w.sleep_p50_seconds.map(round_ms),
        saved_seconds: round_ms(w.total_sleep_seconds - w.total_waited_seconds),
        with_window: w.with_window,
        covered: w.covered,
        worst_miss_seconds: w.worst_miss_seconds.map(round_ms),
        summary: format!("{}; p50 {} vs sleep {}", by.join(", "), p50(w.p50_seconds), p50(w.sleep_p50_seconds)),
    }
}

/// One data plane's observed removals in `status.measurement.observedRemovals.dataPlanes`, and
/// its part of `dataPlanesSummary`.
fn data_plane_status(p: &DataPlaneSummary) -> (DataPlaneRemovalsStatus, String) {
    let p99 = p.summary.p99();
    let summary = match p99 {
        Some((s, false)) => format!("{}={:.3}s/{}", p.data_plane, s, p.summary.removals),
        Some((s, true)) => format!("{}>={:.3}s/{}", p.data_plane, s, p.summary.removals),
        None => format!("{}=?/{}", p.data_plane, p.summary.removals),
    };
    let status = DataPlaneRemovalsStatus {
        data_plane: p.data_plane.to_string(),
        nodes: u32::try_from(p.nodes).unwrap_or(u32::MAX),
        removals: u32::try_from(p.summary.removals).unwrap_or(u32::MAX),
        censored: u32::try_from(p.summary.censored).unwrap_or(u32::MAX),
        coarse: u32::try_from(p.summary.coarse).unwrap_or(u32::MAX),
        p99_seconds: p99.map(|(s, _)| round_ms(s)),
        p99_is_lower_bound: p99.is_some_and(|(_, lower)| lower),
    };
    (status, summary)
}

/// `status.recommendation`: the sleep, the grace, the basis and the coverage (ratios to 1e-4).
fn recommendation_status(report: &AnalysisReport) -> RecommendationStatus {
    let rec = &report.recommendation;
    RecommendationStatus {
        pre_stop_seconds: rec.pre_stop_seconds,
        termination_grace_period_seconds: u32::try_from(rec.termination_grace_period_seconds).unwrap_or(u32::MAX),
        reason: format!("{:?}", rec.reason),
        arithmetic: rec.arithmetic.clone(),
        coverage: report.coverage.as_ref().map(|c| CoverageStatus {
            ratio: round_to(c.ratio, 1e4),
            lowest_node: c.lowest_node.clone(),
            lowest_node_ratio: round_to(c.lowest_node_ratio, 1e4),
            nodes: u32::try_from(c.nodes).unwrap_or(u32::MAX),
        }),
    }
}

/// The status's `admission` for `backend`: under the policy backend, the documented differences
/// from the webhook that apply to a policy with `spec` ([`crate::core::admission::policy::DIFFERENCES`]).
pub fn admission_status(backend: ActiveBackend, spec: &TerminationPolicySpec) -> AdmissionStatus {
    let [service_backed, warnings] = DIFFERENCES;
    let differences = match backend {
        ActiveBackend::Webhook => Vec::new(),
        ActiveBackend::Policy => {
            let mut d = Vec::new();
            if spec.scope == Scope::ServiceBacked {
                d.push(service_backed.to_string());
            }
            d.push(warnings.to_string());
            if spec.pre_stop.handler == crate::core::crd::PreStopHandler::Wait {
                d.push(crate::core::admission::policy::WAIT_DIFFERENCE.to_string());
            }
            d
        }
    };
    AdmissionStatus { backend: backend.as_str().to_string(), differences }
}

/// True when `new` differs from `old` in anything but `measurement.lastScrapeTime`, or when
/// the stored last scrape time is older than `refresh_seconds` (so the status shows the operator
/// is alive without a write every scrape).
pub fn needs_write(old: Option<&TerminationPolicyStatus>, new: &TerminationPolicyStatus, now_unix: f64, refresh_seconds: f64) -> bool {
    let Some(old) = old else { return true };
    let strip = |s: &TerminationPolicyStatus| {
        let mut s = s.clone();
        if let Some(m) = s.measurement.as_mut() {
            m.last_scrape_time = None;
        }
        s
    };
    if strip(old) != strip(new) {
        return true;
    }
    let old_time = old.measurement.as_ref().and_then(|m| m.last_scrape_time.as_deref());
    let new_time = new.measurement.as_ref().and_then(|m| m.last_scrape_time.as_deref());
    match (old_time, new_time) {
        (None, Some(_)) => true,
        (Some(o), Some(n)) if o != n => {
            let parse = |t: &str| serde_json::from_value::<Time>(serde_json::Value::String(t.to_string())).ok().map(|t| t.0.as_millisecond() as f64 / 1000.0);
            parse(o).is_none_or(|o| now_unix - o >= refresh_seconds)
        }
        _ => false,
    }
}

/// Events for conditions whose status changed (or that are new and True). Problem conditions
/// turning True are Warnings; everything else is Normal.
pub fn transitions(old: &[Condition], new: &[Condition]) -> Vec<TransitionEvent> {
    new.iter()
        .filter(|c| match old.iter().find(|o| o.type_ == c.type_) {
            Some(o) => o.status != c.status,
            None => c.status == "True",
        })
        .map(|c| {
            let problem = c.type_ != "Ready";
            let bad = (problem && c.status == "True") || (!problem && c.status == "False");
            TransitionEvent {
                type_: if bad { "Warning" } else { "Normal" },
                reason: match (problem, c.status == "True") {
                    (false, true) => "Ready".to_string(),
                    (false, false) => "NotReady".to_string(),
                    (true, true) => c.type_.clone(),
                    (true, false) => format!("{}Resolved", c.type_),
                },
                note: c.message.chars().take(1000).collect(),
            }
        })
        .collect()
}

/// Keeps the previous `lastTransitionTime` of a condition whose type and status are unchanged
/// (a condition's transition time moves only when its status does; the one rule for every
/// condition, `Conflict` included).
fn carry_transition_time(c: &mut Condition, previous: Option<&TerminationPolicyStatus>) {
    if let Some(old) = previous.and_then(|p| p.conditions.iter().find(|o| o.type_ == c.type_ && o.status == c.status)) {
        c.last_transition_time = old.last_transition_time.clone();
    }
}

/// Adds condition `c` to `status`, with the transition-time rule of [`desired_status`].
pub fn push_condition(status: &mut TerminationPolicyStatus, mut c: Condition, previous: Option<&TerminationPolicyStatus>) {
    carry_transition_time(&mut c, previous);
    status.conditions.push(c);
}

/// A condition reporting other policies of the namespace with the same selector (their
/// precedence is decided by name only).
pub fn conflict_condition(policy: &TerminationPolicy, all: &[Arc<TerminationPolicy>], now: &Time) -> Condition {
    let ns = policy.namespace();
    let mine = policy.spec.pod_selector.as_ref();
    let mut same: Vec<String> = all
        .iter()
        .filter(|p| p.namespace() == ns && p.name_any() != policy.name_any())
        .filter(|p| p.spec.pod_selector.as_ref() == mine || (specificity(mine) == 0 && specificity(p.spec.pod_selector.as_ref()) == 0))
        .map(|p| p.name_any())
        .collect();
    same.sort();
    let (status, reason, message) = if same.is_empty() {
        ("False", "NoConflict", "no other policy in this namespace has the same selector".to_string())
    } else {
        let mut names = same.clone();
        names.push(policy.name_any());
        names.sort();
        (
            "True",
            "SameSelector",
            format!("policies {} select the same pods; precedence is most specific selector, then name: {} wins", names.join(", "), names[0]),
        )
    };
    Condition {
        type_: "Conflict".into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: policy.metadata.generation,
        last_transition_time: now.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_waits_column_names_the_outcomes_and_the_median_against_the_sleep() {
        use crate::core::wait::{WaitOutcome, WaitRecord, summarise};
        let rec = WaitRecord::example;
        let w = summarise(&[rec(WaitOutcome::Removed, 1.21, Some(1.0)), rec(WaitOutcome::Removed, 1.4, Some(1.1)), rec(WaitOutcome::Fallback, 5.0, None)]);
        let s = waits_status(&w);
        assert_eq!(s.summary, "Removed 2, Fallback 1; p50 1.4s vs sleep 5.0s");
        assert_eq!((s.waits, s.removed, s.fallback, s.with_window, s.covered), (3, 2, 1, 2, 2));
        assert_eq!(s.saved_seconds, 7.39);
    }

    /// A condition pushed after desired_status follows the same transition-time rule: its time
    /// stays while its status does, and moves when the status changes.
    #[test]
    fn pushed_conditions_keep_their_transition_time_while_their_status_holds() {
        let t = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap());
        let previous = TerminationPolicyStatus { conditions: vec![cond("Conflict", true, "SameSelector", "m".into(), Some(1), &t(100))], ..Default::default() };
        let mut now = TerminationPolicyStatus::default();
        push_condition(&mut now, cond("Conflict", true, "SameSelector", "m".into(), Some(2), &t(200)), Some(&previous));
        push_condition(&mut now, cond("Ready", true, "Measured", "m".into(), Some(2), &t(200)), Some(&previous));
        assert_eq!(now.conditions.iter().map(|c| c.last_transition_time.clone()).collect::<Vec<_>>(), [t(100), t(200)]);
        let mut resolved = TerminationPolicyStatus::default();
        push_condition(&mut resolved, cond("Conflict", false, "NoConflict", "m".into(), Some(2), &t(300)), Some(&previous));
        assert_eq!(resolved.conditions[0].last_transition_time, t(300));
    }
    #[test]
    fn a_data_planes_removals_read_as_plane_p99_and_count() {
        use crate::core::removals::{DataPlaneSummary, summarise};
        let none = DataPlaneSummary { data_plane: "cilium", nodes: 1, summary: summarise(&[]) };
        assert_eq!(data_plane_status(&none).1, "cilium=?/0");
        let mut p = none.clone();
        p.summary.removals = 4;
        p.summary.p99_seconds = Some(0.30249);
        let (s, line) = data_plane_status(&p);
        assert_eq!((line.as_str(), s.p99_seconds, s.p99_is_lower_bound, s.nodes), ("cilium=0.302s/4", Some(0.302), false, 1));
        p.summary.p99_seconds = None;
        p.summary.p99_at_least_seconds = Some(60.0);
        assert_eq!(data_plane_status(&p).1, "cilium>=60.000s/4");
    }

    #[test]
    fn an_observed_removal_that_outlived_its_sleep_makes_pods_underprotected() {
        use crate::core::removals::{Miss, RemovalSummary};
        let observed = |coverage: Option<f64>, worst_miss: Option<Miss>| ObservedRemovals {
            window: RemovalSummary {
                removals: 8,
                censored: 0,
                coarse: 1,
                p99_seconds: Some(3.4),
                p99_at_least_seconds: None,
                coverage_ratio: coverage,
                coverage_removals: 7,
                worst_miss,
            },
            sets_window: true,
            by_data_plane: Vec::new(),
        };
        let miss = Miss { pod: "shop/web-1".into(), window_seconds: 3.4, sleep_seconds: 3, censored: false };
        let v = pods_underprotected_condition(None, 3, Some(&observed(Some(0.875), Some(miss.clone()))));
        assert!(v.on);
        assert_eq!(v.reason, "ObservedRemovalOutlivedSleep");
        assert_eq!(
            v.message,
            "observed removals: 87.5% covered by their pod's own sleep, below the 99.0% target (worst: shop/web-1 left the data plane 3.400 s after its deletion, its sleep 3 s)"
        );
        // stale pods too: both said, the stale pods' reason
        let stale = PodCounts { stale: 2, ..Default::default() };
        let v = pods_underprotected_condition(Some(&stale), 4, Some(&observed(Some(0.875), Some(Miss { censored: true, ..miss }))));
        assert_eq!(v.reason, "StaleOrUnprotectedPods");
        assert!(v.message.ends_with("; observed removals: 87.5% covered by their pod's own sleep, below the 99.0% target (worst: shop/web-1 left the data plane at least 3.400 s after its deletion, its sleep 3 s)"), "{}", v.message);
        // at or above the 99% target, or none with a sleep: no finding
        for o in [observed(Some(1.0), None), observed(Some(0.99), None), observed(None, None)] {
            assert!(!pods_underprotected_condition(None, 3, Some(&o)).on);
        }
        assert!(!pods_underprotected_condition(None, 3, None).on);
    }

    use crate::core::analysis::{AnalysisOptions, analyze};
    use crate::core::exposition::parse_kube_proxy_metrics;
    use crate::core::model::NodeInput;

    fn time(s: &str) -> Time {
        serde_json::from_value(serde_json::Value::String(s.into())).unwrap()
    }

    fn report(sync_seconds_bucket: &str) -> AnalysisReport {
        // 100 samples all in one bucket: the p99 lands inside it
        let text = format!(
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"{sync_seconds_bucket}\"}} 100\nkubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"+Inf\"}} 100\n"
        );
        let input = NodeInput { node: "n1".into(), later: parse_kube_proxy_metrics(&text).unwrap(), earlier: None, proxy_mode: None };
        let opts = AnalysisOptions { min_sync_period_seconds: 1.0, ..Default::default() };
        analyze(&[input], &opts, &TerminationPolicySpec::default())
    }

    fn meta() -> MeasurementMeta {
        MeasurementMeta { nodes_scraped: 1, window_seconds: 600, last_scrape_time: Some("2026-01-01T00:00:00Z".into()), ..Default::default() }
    }

    #[test]
    fn slow_sync_sets_condition_and_emits_one_warning_on_transition() {
        let spec = TerminationPolicySpec::default();
        let t0 = time("2026-01-01T00:00:00Z");
        let fast = desired_status(&spec, Some(1), &report("0.5"), &meta(), None, None, &t0);
        let slow = desired_status(&spec, Some(1), &report("2"), &meta(), None, Some(&fast), &time("2026-01-01T00:01:00Z"));
        let c = |s: &TerminationPolicyStatus, t: &str| s.conditions.iter().find(|c| c.type_ == t).unwrap().clone();
        assert_eq!(c(&fast, "ProxySyncSlow").status, "False");
        assert_eq!(c(&slow, "ProxySyncSlow").status, "True");
        // Ready did not change: its transition time is kept
        assert_eq!(c(&slow, "Ready").last_transition_time, t0);
        let ev = transitions(&fast.conditions, &slow.conditions);
        assert_eq!(ev.len(), 1);
        assert_eq!((ev[0].type_, ev[0].reason.as_str()), ("Warning", "ProxySyncSlow"));
        // back to fast: a Normal "resolved" event
        let back = desired_status(&spec, Some(1), &report("0.5"), &meta(), None, Some(&slow), &t0);
        let ev = transitions(&slow.conditions, &back.conditions);
        assert_eq!((ev[0].type_, ev[0].reason.as_str()), ("Normal", "ProxySyncSlowResolved"));
        // the slow recommendation is larger: 1 + ~1.99 = ~2.99 s x 1.25 -> 4 s
        assert!(slow.recommendation.as_ref().unwrap().pre_stop_seconds > fast.recommendation.as_ref().unwrap().pre_stop_seconds);
    }

    #[test]
    fn the_status_carries_the_coverage_of_its_sleep() {
        let spec = TerminationPolicySpec::default();
        let r = report("2");
        let st = desired_status(&spec, Some(1), &r, &meta(), None, None, &time("2026-01-01T00:00:00Z"));
        let rec = st.recommendation.unwrap();
        let c = rec.coverage.clone().expect("coverage");
        let share = r.nodes[0].coverage_at(rec.pre_stop_seconds).unwrap();
        assert_eq!((c.lowest_node.as_str(), c.nodes), ("n1", 1));
        assert_eq!(c.ratio, (share * 1e4).round() / 1e4);
        assert_eq!(c.lowest_node_ratio, c.ratio);
        let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert!(ready.message.contains(&format!(", coverage {} (", coverage_percent(share))), "{}", ready.message);
        // serialised as recommendation.coverage {ratio, lowestNode, lowestNodeRatio, nodes}
        let v = serde_json::to_value(&rec).unwrap();
        assert_eq!(v["coverage"]["lowestNode"], "n1");
        assert!(v["coverage"]["ratio"].is_f64());
    }

    #[test]
    fn five_thousand_slow_nodes_make_a_small_status() {
        // 5,000 nodes with a slow sync, 5,000 more failing: one advice item per node made each
        // status ~1.2 MB; the status names NODES_PER_ADVICE of each and counts the rest
        let text = "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"2\"} 100\nkubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"+Inf\"} 100\n";
        let scrape = parse_kube_proxy_metrics(text).unwrap();
        let inputs: Vec<NodeInput> =
            (0..5000).map(|i| NodeInput { node: format!("node-{i:04}"), later: scrape.clone(), earlier: None, proxy_mode: None }).collect();
        let opts = AnalysisOptions { min_sync_period_seconds: 1.0, ..Default::default() };
        let spec = TerminationPolicySpec::default();
        let full = analyze(&inputs, &opts, &spec);
        assert_eq!(full.advice.iter().filter(|a| a.reason == AdviceReason::ProxySyncSlow).count(), 5000);
        let mut m = meta();
        m.nodes_scraped = 5000;
        m.failed = (5000..10000).map(|i| format!("node-{i:04}: connection refused")).collect();
        let s = desired_status(&spec, Some(1), &full, &m, None, None, &time("2026-01-01T00:00:00Z"));
        let slow: Vec<&AdviceStatus> = s.advice.iter().filter(|a| a.reason == "ProxySyncSlow").collect();
        assert_eq!(slow.len(), NODES_PER_ADVICE + 1);
        assert!(slow[0].message.contains("node-0000") && slow[NODES_PER_ADVICE].message.contains("and 4995 more node(s)"), "{slow:?}");
        let c = |t: &str| s.conditions.iter().find(|c| c.type_ == t).unwrap().clone();
        assert_eq!(c("ProxySyncSlow").status, "True");
        assert!(c("ProxySyncSlow").message.contains("5000 in all"), "{}", c("ProxySyncSlow").message);
        let failed = c("MetricsUnavailable").message;
        assert!(failed.starts_with("5000 node(s) failed: node-5000: connection refused;") && failed.ends_with("; and 4995 more"), "{failed}");
        assert!(!failed.contains("node-5005"), "{failed}");
        let bytes = serde_json::to_vec(&s).unwrap().len();
        assert!(bytes < 8 * 1024, "status of {bytes} bytes");
        // the summary report the controller sizes with gives the same status
        let w = crate::core::analysis::analyze_window(&inputs, &opts, spec.pre_stop.min_samples);
        let summary = crate::core::analysis::size_summary(&w, &spec, NODES_PER_ADVICE);
        assert!(summary.nodes.is_empty());
        assert_eq!(desired_status(&spec, Some(1), &summary, &m, None, None, &time("2026-01-01T00:00:00Z")), s);
    }

    #[test]
    fn no_kube_proxy_sizes_from_the_default_and_says_why() {
        let spec = TerminationPolicySpec::default();
        let opts = AnalysisOptions { mode: Some(crate::core::model::ProxyMode::Ebpf), ..Default::default() };
        let report = analyze(&[], &opts, &spec);
        let note = "no kube-proxy pods; 3 Cilium agent pod(s) (k8s-app=cilium in kube-system): eBPF dataplane, sized from the policy default";
        let meta = MeasurementMeta { nodes_scraped: 0, no_kube_proxy_note: Some(note.into()), ..Default::default() };
        let st = desired_status(&spec, Some(1), &report, &meta, None, None, &time("2026-01-01T00:00:00Z"));
        let c = |t: &str| st.conditions.iter().find(|c| c.type_ == t).unwrap().clone();
        assert_eq!((c("MetricsUnavailable").status.as_str(), c("MetricsUnavailable").reason.as_str()), ("True", "NoKubeProxy"));
        assert_eq!(c("MetricsUnavailable").message, note);
        assert!(c("Ready").message.ends_with(&format!("; {note}")), "{}", c("Ready").message);
        assert_eq!(c("MigrationRecommended").status, "False");
        assert_eq!(st.recommendation.as_ref().unwrap().pre_stop_seconds, 10, "PreStopSpec::default_seconds");
        // without the note the same status reads as a measurement failure
        let plain = desired_status(&spec, Some(1), &report, &MeasurementMeta::default(), None, None, &time("2026-01-01T00:00:00Z"));
        let m = plain.conditions.iter().find(|c| c.type_ == "MetricsUnavailable").unwrap();
        assert_eq!(m.reason, "NoNodesScraped");
    }

    #[test]
    fn unchanged_status_is_not_written_but_refreshed_eventually() {
        let spec = TerminationPolicySpec::default();
        let t0 = time("2026-01-01T00:00:00Z");
        let a = desired_status(&spec, Some(1), &report("0.5"), &meta(), None, None, &t0);
        let mut m2 = meta();
        m2.last_scrape_time = Some("2026-01-01T00:00:30Z".into());
        let b = desired_status(&spec, Some(1), &report("0.5"), &m2, None, Some(&a), &t0);
        let now = 1767225630.0; // 2026-01-01T00:00:30Z
        assert!(!needs_write(Some(&a), &b, now, 300.0));
        assert!(needs_write(Some(&a), &b, now + 300.0, 300.0));
        assert!(needs_write(None, &b, now, 300.0));
        let mut m3 = meta();
        m3.failed = vec!["n2: connection_refused".into()];
        let c = desired_status(&spec, Some(1), &report("0.5"), &m3, None, Some(&a), &t0);
        assert!(needs_write(Some(&a), &c, now, 300.0));
        assert!(c.conditions.iter().any(|c| c.type_ == "MetricsUnavailable" && c.status == "True"));
    }

    #[test]
    fn the_status_says_which_source_measured_the_nodes() {
        let spec = TerminationPolicySpec::default();
        let mut m = meta();
        m.nodes_scraped = 3;
        m.sources = [("n1".to_string(), "agent"), ("n2".into(), "kube-proxy"), ("n3".into(), "agent")].into();
        let st = desired_status(&spec, Some(1), &report("0.5"), &m, None, None, &time("2026-01-01T00:00:00Z"));
        let measurement = st.measurement.as_ref().unwrap();
        assert_eq!(measurement.sources, [("agent".to_string(), 2), ("kube-proxy".into(), 1)].into());
        assert_eq!(measurement.worst_node.as_deref(), Some("n1"));
        assert_eq!(measurement.worst_node_source.as_deref(), Some("agent"));
        let c = st.conditions.iter().find(|c| c.type_ == "MetricsUnavailable").unwrap();
        assert_eq!(c.message, "3 node(s) scraped (2 through agent, 1 through kube-proxy)");
        // without sources (files, older stores) the status reads as before
        let plain = desired_status(&spec, Some(1), &report("0.5"), &meta(), None, None, &time("2026-01-01T00:00:00Z"));
        assert!(plain.measurement.as_ref().unwrap().sources.is_empty());
        let json = serde_json::to_value(&plain).unwrap();
        assert!(json["measurement"].get("sources").is_none() && json["measurement"].get("worstNodeSource").is_none());
    }
}
