//! The plan the webhook serves: which policy applies to a pod, the preStop seconds each policy
//! injects, and what the API server supports. Built by the controller (or from flags for the
//! stand-alone webhook and the `mutate` command) and read from memory on every admission.

use crate::crd::TerminationPolicySpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde::Serialize;
use std::collections::BTreeMap;

/// Pod labels.
pub type Labels = BTreeMap<String, String>;

/// One policy as the webhook applies it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanPolicy {
    /// Namespace of the TerminationPolicy (empty for the cluster default policy).
    pub namespace: String,
    /// Name of the TerminationPolicy.
    pub name: String,
    /// Its spec.
    pub spec: TerminationPolicySpec,
    /// The sized preStop sleep for new pods, seconds (the policy's status recommendation).
    pub pre_stop_seconds: u32,
}

/// What the API server keeps (rule R4: probed by a server-side dry run, never guessed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// `lifecycle.preStop.sleep` survives a dry-run create (gate PodLifecycleSleepAction on).
    pub native_sleep: bool,
}

/// The whole plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Namespaced policies.
    pub policies: Vec<PlanPolicy>,
    /// Policy for namespaces that have none (off unless configured).
    pub default_policy: Option<PlanPolicy>,
    /// API server capabilities.
    pub capabilities: Capabilities,
}

impl Default for Plan {
    /// An empty plan: no policy, so nothing is mutated.
    fn default() -> Self {
        Self { policies: Vec::new(), default_policy: None, capabilities: Capabilities { native_sleep: false } }
    }
}

/// The policy chosen for a pod, and the other policies that also selected it.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved<'a> {
    /// The winning policy.
    pub policy: &'a PlanPolicy,
    /// Other policies of the namespace that also select the pod (a conflict to report).
    pub also_matched: Vec<&'a str>,
}

impl Plan {
    /// Picks the policy for a pod in `namespace` with `labels`: among the namespace's policies
    /// whose podSelector matches, the most specific (most matchLabels plus matchExpressions
    /// terms) wins, then the alphabetically first name. Namespaces with no policy at all fall back
    /// to the default policy; a namespace whose policies all miss the pod gets none.
    pub fn resolve(&self, namespace: &str, labels: &Labels) -> Option<Resolved<'_>> {
        let in_ns: Vec<&PlanPolicy> = self.policies.iter().filter(|p| p.namespace == namespace).collect();
        if in_ns.is_empty() {
            return self
                .default_policy
                .as_ref()
                .filter(|p| p.spec.pod_selector.as_ref().is_none_or(|s| selector_matches(s, labels)))
                .map(|policy| Resolved { policy, also_matched: Vec::new() });
        }
        let mut matching: Vec<&PlanPolicy> =
            in_ns.into_iter().filter(|p| p.spec.pod_selector.as_ref().is_none_or(|s| selector_matches(s, labels))).collect();
        matching.sort_by(|a, b| {
            specificity(b.spec.pod_selector.as_ref())
                .cmp(&specificity(a.spec.pod_selector.as_ref()))
                .then_with(|| a.name.cmp(&b.name))
        });
        let (first, rest) = matching.split_first()?;
        Some(Resolved { policy: first, also_matched: rest.iter().map(|p| p.name.as_str()).collect() })
    }
}

/// Number of terms in a selector (0 for none or empty).
pub fn specificity(sel: Option<&LabelSelector>) -> usize {
    sel.map_or(0, |s| s.match_labels.as_ref().map_or(0, BTreeMap::len) + s.match_expressions.as_ref().map_or(0, Vec::len))
}

/// Kubernetes label-selector semantics: all matchLabels equal, and every expression holds
/// (`In`, `NotIn`, `Exists`, `DoesNotExist`; an unknown operator never matches). An empty
/// selector matches everything.
pub fn selector_matches(sel: &LabelSelector, labels: &Labels) -> bool {
    let labels_ok = sel.match_labels.as_ref().is_none_or(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)));
    labels_ok && sel.match_expressions.as_ref().is_none_or(|e| e.iter().all(|r| requirement_matches(r, labels)))
}

fn requirement_matches(r: &LabelSelectorRequirement, labels: &Labels) -> bool {
    let values = r.values.as_deref().unwrap_or(&[]);
    let got = labels.get(&r.key);
    match r.operator.as_str() {
        "In" => got.is_some_and(|v| values.contains(v)),
        "NotIn" => got.is_none_or(|v| !values.contains(v)),
        "Exists" => got.is_some(),
        "DoesNotExist" => got.is_none(),
        _ => false,
    }
}

/// Answers "does some Service in this namespace select a pod with these labels?" for scope
/// ServiceBacked. The controller implements it over a watch of Services; tests and the `mutate`
/// command use [`StaticServiceIndex`].
pub trait ServiceIndex: Send + Sync {
    /// True when at least one Service in `namespace` has a non-empty selector that is a subset
    /// of `labels`.
    fn selects(&self, namespace: &str, labels: &Labels) -> bool;
}

/// A fixed list of Service selectors, by namespace.
#[derive(Debug, Clone, Default)]
pub struct StaticServiceIndex {
    /// `(namespace, selector)` pairs; selectors with no entries are ignored (such Services
    /// select no pods; their endpoints are managed by hand).
    pub services: Vec<(String, Labels)>,
}

impl ServiceIndex for StaticServiceIndex {
    fn selects(&self, namespace: &str, labels: &Labels) -> bool {
        self.services
            .iter()
            .any(|(ns, sel)| ns == namespace && !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v)))
    }
}

/// A Service index that treats every pod as service-backed (for offline checks where the
/// Services are not known).
#[derive(Debug, Clone, Copy, Default)]
pub struct AssumeServiceBacked;

impl ServiceIndex for AssumeServiceBacked {
    fn selects(&self, _: &str, _: &Labels) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_policy_honours_its_pod_selector() {
        let mut spec = TerminationPolicySpec::default();
        spec.pod_selector = Some(LabelSelector { match_labels: Some([("app".to_string(), "web".to_string())].into()), match_expressions: None });
        let plan = Plan {
            policies: vec![],
            default_policy: Some(PlanPolicy { namespace: String::new(), name: "d".into(), spec, pre_stop_seconds: 10 }),
            capabilities: Capabilities { native_sleep: true },
        };
        assert!(plan.resolve("ns", &[("app".to_string(), "web".to_string())].into()).is_some());
        assert!(plan.resolve("ns", &[("app".to_string(), "db".to_string())].into()).is_none());
    }
}
