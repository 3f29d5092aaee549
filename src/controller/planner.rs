//! Builds the webhook's [`Plan`] from the TerminationPolicy objects every replica watches.
//!
//! One source of truth: the leader measures and writes each policy's
//! `status.recommendation.preStopSeconds`; every replica (the leader included) serves what the
//! status says, so all replicas agree. A policy the leader has not sized yet (new, or written
//! before any measurement) gets its spec's `defaultSeconds`, clamped: never 0, never unbounded.

use crate::core::crd::TerminationPolicy;
use crate::core::plan::{Capabilities, Plan, PlanPolicy};
use crate::core::sizing;

/// `namespace/name` of the TerminationPolicy that applies to namespaces without one (the Helm
/// chart's cluster default policy, off by default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultPolicyRef {
    /// Its namespace (the operator's).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl DefaultPolicyRef {
    /// Parses `namespace/name`.
    pub fn parse(s: &str) -> Result<Self, super::Error> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => Ok(Self { namespace: ns.into(), name: name.into() }),
            _ => Err(super::Error::DefaultPolicyRef(s.to_string())),
        }
    }
}

/// The preStop seconds a policy serves: its status recommendation, or its unmeasured default.
pub fn pre_stop_seconds(policy: &TerminationPolicy) -> u32 {
    let spec = &policy.spec;
    match policy.status.as_ref().and_then(|s| s.recommendation.as_ref()) {
        Some(r) => sizing::clamp_pre_stop(f64::from(r.pre_stop_seconds), &spec.pre_stop),
        None => sizing::unmeasured_pre_stop(spec),
    }
}

/// Builds the plan. Policies whose spec is invalid are left out (their status says why). The
/// default policy, when named and present, serves namespaces without a policy of their own and
/// is not also a policy of its own namespace's pods unless it selects them there.
pub fn build_plan(policies: &[TerminationPolicy], native_sleep: bool, default_ref: Option<&DefaultPolicyRef>) -> Plan {
    let mut plan = Plan { policies: Vec::new(), default_policy: None, capabilities: Capabilities { native_sleep }, wait: Default::default() };
    for p in policies {
        if p.spec.validate().is_err() {
            continue;
        }
        let namespace = p.metadata.namespace.clone().unwrap_or_default();
        let name = p.metadata.name.clone().unwrap_or_default();
        let entry = PlanPolicy { namespace: namespace.clone(), name: name.clone(), spec: p.spec.clone(), pre_stop_seconds: pre_stop_seconds(p) };
        if default_ref.is_some_and(|d| d.namespace == namespace && d.name == name) {
            plan.default_policy = Some(entry);
        } else {
            plan.policies.push(entry);
        }
    }
    plan.policies.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::crd::{RecommendationStatus, TerminationPolicySpec, TerminationPolicyStatus};

    fn policy(ns: &str, name: &str, rec: Option<u32>) -> TerminationPolicy {
        let mut p = TerminationPolicy::new(name, TerminationPolicySpec::default());
        p.metadata.namespace = Some(ns.into());
        p.status = rec.map(|r| TerminationPolicyStatus {
            recommendation: Some(RecommendationStatus { pre_stop_seconds: r, ..Default::default() }),
            ..Default::default()
        });
        p
    }

    #[test]
    fn status_is_served_and_unsized_policies_get_the_default() {
        let d = DefaultPolicyRef::parse("safe-termination/cluster-default").unwrap();
        let plan = build_plan(
            &[policy("a", "p", Some(17)), policy("b", "q", None), policy("safe-termination", "cluster-default", Some(12)), policy("c", "huge", Some(5000))],
            true,
            Some(&d),
        );
        assert_eq!(plan.policies.len(), 3);
        assert_eq!(plan.policies[0].pre_stop_seconds, 17);
        assert_eq!(plan.policies[1].pre_stop_seconds, 10, "unmeasured: defaultSeconds");
        assert_eq!(plan.policies[2].pre_stop_seconds, 60, "clamped to maxSeconds");
        assert_eq!(plan.default_policy.as_ref().map(|p| p.pre_stop_seconds), Some(12));
        assert!(plan.capabilities.native_sleep);
        assert!(DefaultPolicyRef::parse("nope").is_err());
    }
}
