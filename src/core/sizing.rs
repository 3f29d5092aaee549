//! Sizing: from the measured propagation window W to a preStop sleep and a
//! terminationGracePeriodSeconds.
//!
//! `preStop = clamp(ceil(W * safetyFactor + extraSeconds), minSeconds, maxSeconds)` and
//! `grace = max(current, min(preStop + appShutdownSeconds, grace.maxSeconds), preStop)`
//! (docs/model.md, its first formula). The result is never 0 unless the policy's bounds say so, never infinite, and a
//! grace period the user set is never lowered (R2). Kubernetes applies 30 s when a pod sets no
//! grace period.

use crate::core::crd::{GraceSpec, PreStopSpec, TerminationPolicySpec};
use crate::core::model::{Basis, ClusterWindow};
use serde::Serialize;

/// Kubernetes' default `terminationGracePeriodSeconds` when a pod sets none.
pub const KUBERNETES_DEFAULT_GRACE_SECONDS: i64 = 30;

/// A sized preStop sleep and grace period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Recommendation {
    /// Sleep to inject, seconds.
    pub pre_stop_seconds: u32,
    /// terminationGracePeriodSeconds for a pod that sets none, seconds.
    pub termination_grace_period_seconds: i64,
    /// Measured, LowSampleCount, BeyondTopBucket or NoData.
    pub reason: Basis,
    /// The arithmetic behind the value, for humans.
    pub arithmetic: String,
}

/// `ceil` that ignores floating-point noise below a nanosecond (2.0000000001 -> 2).
fn ceil_seconds(x: f64) -> f64 {
    // + 0.0: ceil of a tiny negative is -0, which printed as "-0 s"
    (x - 1e-9).ceil() + 0.0
}

/// Sizes the preStop sleep and default grace from a cluster window under a policy.
///
/// - Measured: `clamp(ceil(W * safetyFactor + extraSeconds), min, max)`.
/// - BeyondTopBucket: `maxSeconds` (the true p99 is unknown and above the top bucket).
/// - LowSampleCount: `clamp(max(defaultSeconds, ceil(W * safetyFactor + extraSeconds)), min, max)`:
///   a few slow samples still raise the value, a few fast ones do not lower the default.
/// - NoData: `clamp(defaultSeconds, min, max)`.
pub fn recommend(window: &ClusterWindow, spec: &TerminationPolicySpec) -> Recommendation {
    let p = &spec.pre_stop;
    let (lo, hi) = pre_stop_bounds(p);
    let clamp = |v: f64| clamp_pre_stop(v, p);
    let sized = |w: f64| ceil_seconds(w * p.safety_factor + f64::from(p.extra_seconds));
    let (pre_stop, arithmetic) = match (window.basis, window.propagation_window_seconds) {
        (Basis::Measured, Some(w)) if w.is_finite() => {
            let v = clamp(sized(w));
            (v, format!("ceil({w:.3} s x {} + {} s) = {} s, clamped to [{lo}, {hi}] = {v} s", p.safety_factor, p.extra_seconds, sized(w)))
        }
        (Basis::LowSampleCount, Some(w)) if w.is_finite() => {
            let v = clamp(sized(w).max(f64::from(p.default_seconds)));
            (
                v,
                format!(
                    "too few samples: max(default {} s, ceil({w:.3} s x {} + {} s) = {} s), clamped to [{lo}, {hi}] = {v} s",
                    p.default_seconds,
                    p.safety_factor,
                    p.extra_seconds,
                    sized(w)
                ),
            )
        }
        (Basis::BeyondTopBucket, _) | (Basis::Measured | Basis::LowSampleCount, Some(_)) => {
            (hi, format!("p99 beyond the top histogram bucket: maxSeconds = {hi} s"))
        }
        _ => {
            let v = clamp(f64::from(p.default_seconds));
            (v, format!("no measurement: defaultSeconds {} s, clamped to [{lo}, {hi}] = {v} s", p.default_seconds))
        }
    };
    let grace = grace_seconds(None, pre_stop, &spec.grace);
    Recommendation {
        pre_stop_seconds: pre_stop,
        termination_grace_period_seconds: grace,
        reason: window.basis,
        arithmetic: format!(
            "{arithmetic}; grace = max(30 s default, min({pre_stop} + {} s, {} s), {pre_stop} s) = {grace} s",
            spec.grace.app_shutdown_seconds, spec.grace.max_seconds
        ),
    }
}

/// The range a policy's sleep is kept in, seconds: `[minSeconds, max(maxSeconds, minSeconds)]`
/// (an invalid spec with min above max still gets a range, never a panic).
pub fn pre_stop_bounds(p: &PreStopSpec) -> (u32, u32) {
    (p.min_seconds, p.max_seconds.max(p.min_seconds))
}

/// The one clamp of a preStop value into the policy's bounds ([`pre_stop_bounds`]); NaN gives
/// `minSeconds`. Used by [`recommend`] and by the planner for a status written by someone else.
pub fn clamp_pre_stop(seconds: f64, p: &PreStopSpec) -> u32 {
    let (lo, hi) = pre_stop_bounds(p);
    if seconds.is_nan() { lo } else { seconds.clamp(f64::from(lo), f64::from(hi)) as u32 }
}

/// The sleep of a policy nothing has measured yet: its `defaultSeconds`, clamped (what
/// [`recommend`] gives for [`Basis::NoData`]).
pub fn unmeasured_pre_stop(spec: &TerminationPolicySpec) -> u32 {
    recommend(&ClusterWindow { worst_node: None, propagation_window_seconds: None, basis: Basis::NoData }, spec).pre_stop_seconds
}

/// The grace period a pod should have: `max(current, min(preStop + appShutdownSeconds,
/// maxSeconds), preStop)`, with `current` defaulting to Kubernetes' 30 s. Never lower than
/// `current` (R2) and never lower than the sleep (the API server rejects a sleep above grace).
pub fn grace_seconds(current: Option<i64>, pre_stop_seconds: u32, spec: &GraceSpec) -> i64 {
    let current = current.unwrap_or(KUBERNETES_DEFAULT_GRACE_SECONDS);
    let pre_stop = i64::from(pre_stop_seconds);
    let wanted = (pre_stop + i64::from(spec.app_shutdown_seconds)).min(i64::from(spec.max_seconds)).max(pre_stop);
    current.max(wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn win(basis: Basis, w: Option<f64>) -> ClusterWindow {
        ClusterWindow { worst_node: Some("n".into()), propagation_window_seconds: w, basis }
    }

    #[test]
    fn measured_is_ceiled_and_clamped() {
        let spec = TerminationPolicySpec::default();
        // 3.2 s (e.g. 1 s + a 2.2 s sync p99); x 1.25 = 4 -> 4 (not 5 from float noise)
        assert_eq!(recommend(&win(Basis::Measured, Some(3.2)), &spec).pre_stop_seconds, 4);
        assert_eq!(recommend(&win(Basis::Measured, Some(3.2000001)), &spec).pre_stop_seconds, 5);
        assert_eq!(recommend(&win(Basis::Measured, Some(0.1)), &spec).pre_stop_seconds, 3);
        assert_eq!(recommend(&win(Basis::Measured, Some(1000.0)), &spec).pre_stop_seconds, 60);
    }

    #[test]
    fn extra_seconds_and_safety_factor() {
        let mut spec = TerminationPolicySpec::default();
        spec.pre_stop.safety_factor = 2.0;
        spec.pre_stop.extra_seconds = 15;
        let r = recommend(&win(Basis::Measured, Some(4.3)), &spec);
        assert_eq!(r.pre_stop_seconds, 24); // ceil(8.6 + 15)
        assert_eq!(r.termination_grace_period_seconds, 54);
    }

    #[test]
    fn beyond_top_bucket_uses_max_and_no_data_uses_default() {
        let spec = TerminationPolicySpec::default();
        assert_eq!(recommend(&win(Basis::BeyondTopBucket, Some(33.8)), &spec).pre_stop_seconds, 60);
        let r = recommend(&win(Basis::NoData, None), &spec);
        assert_eq!(r.pre_stop_seconds, 10);
        assert_eq!(r.reason, Basis::NoData);
    }

    #[test]
    fn low_samples_never_below_default() {
        let spec = TerminationPolicySpec::default();
        assert_eq!(recommend(&win(Basis::LowSampleCount, Some(1.25)), &spec).pre_stop_seconds, 10);
        assert_eq!(recommend(&win(Basis::LowSampleCount, Some(20.0)), &spec).pre_stop_seconds, 25);
    }

    #[test]
    fn grace_is_never_lowered_and_never_below_sleep() {
        let g = GraceSpec::default();
        assert_eq!(grace_seconds(Some(300), 10, &g), 300);
        assert_eq!(grace_seconds(Some(604800), 10, &g), 604800);
        assert_eq!(grace_seconds(None, 10, &g), 40);
        assert_eq!(grace_seconds(Some(5), 10, &g), 40);
        let tight = GraceSpec { app_shutdown_seconds: 30, max_seconds: 20 };
        assert_eq!(grace_seconds(None, 25, &tight), 30); // default 30 kept
        assert_eq!(grace_seconds(Some(1), 25, &tight), 25); // capped by max, but never below sleep
    }
}
